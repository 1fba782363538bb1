/*
 * main.c: gpuctl's front end: the command line of gpushare, for operators
 * and tenants, from argv to one command run and its exit status.
 *
 * Every command is one row of the command table below: its words
 * ("vdev create"), its positional arguments, its flags, and the function
 * that turns parsed arguments into gpushare.v1 requests (in cmd_*.c).
 * Arguments are parsed and checked completely before any connection is
 * made, so a typo costs nothing and always exits 2 with the flag and the
 * value named. Only then is the daemon contacted (exit 1 for anything it
 * refuses or that fails). This file owns the flag and command tables, the
 * --help texts, the parsing of argv against them, and main.
 */
#include <ctype.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/cli.h"
#include "client/client.h"
#include "client/cmd_admin.h"
#include "client/cmd_dataset.h"
#include "client/cmd_job.h"
#include "client/cmd_watch.h"
#include "client/gpuctl.h"
#include "client/pbjson.h"

/* --------------------------------------------------------- command table --- */

static const gpuctl_flag no_flags[] = {{0}};
static const gpuctl_flag slurm_gres_flags[] = {
    {"--unit", NULL, "SIZE", 0, 0, "usable memory per shard (default 1GiB)"}, {0}};

static const gpuctl_flag vdev_create_flags[] = {
    {"--device", NULL, "D", 0, 0, "physical device: cpu, gpu0, ... (default cpu)"},
    {"--memory", NULL, "SIZE", 0, 1, "memory limit, e.g. 4GiB, 512MiB"},
    {"--compute", NULL, "PCT", 0, 0,
     "compute share, 1..100: the percent of the device's time the vdev is guaranteed while it "
     "has work (the shares of a device add up to at most 100; idle vdevs' time goes to the busy "
     "ones in proportion to their shares)"},
    {"--policy", NULL, "preallocate|growth", 0, 0, "reserve the whole limit now (the default) or on demand"},
    {"--tenant", NULL, "T", 0, 1, "the tenant the vdev belongs to"},
    {0}};

static const gpuctl_flag vdev_set_flags[] = {
    {"--memory", NULL, "SIZE", 0, 0, "new memory limit, e.g. 8GiB"},
    {"--compute", NULL, "PCT", 0, 0, "new compute share in percent of the device, 1..100"},
    {"--policy", NULL, "preallocate|growth", 0, 0, "new policy (applies once the vdev's jobs end)"},
    {0}};

static const gpuctl_flag tenant_create_flags[] = {
    {"--uid", NULL, "U", 1, 0, "a member user id (repeatable)"},
    {"--gid", NULL, "G", 1, 0, "a member group id, supplementary groups included (repeatable)"},
    {"--memory", NULL, "SIZE", 0, 0, "quota: total vdev memory (0 = unlimited)"},
    {"--compute", NULL, "N", 0, 0, "quota: total compute share over its vdevs (0 = unlimited)"},
    {"--max-running", NULL, "N", 0, 0, "quota: jobs running at once (0 = unlimited)"},
    {"--max-queued", NULL, "N", 0, 0, "quota: jobs waiting at once (0 = unlimited)"},
    {0}};

static const gpuctl_flag quota_set_flags[] = {
    {"--memory", NULL, "SIZE", 0, 0, "total vdev memory (0 = unlimited)"},
    {"--compute", NULL, "N", 0, 0, "total compute share over its vdevs (0 = unlimited)"},
    {"--max-running", NULL, "N", 0, 0, "jobs running at once (0 = unlimited)"},
    {"--max-queued", NULL, "N", 0, 0, "jobs waiting at once (0 = unlimited)"},
    {0}};

static const gpuctl_flag dataset_add_flags[] = {
    {"--format", NULL, "FORMAT", 0, 0, "idx, npy, text or tokens (default: npy for a .npy file, else idx)"},
    {"--vocab-size", NULL, "N", 0, 0, "--format tokens: every token id must be below N (2 to 65536)"},
    {0}};

static const gpuctl_flag plan_flags[] = {
    {"--vdev", NULL, "V", 0, 0,
     "plan against this vdev's memory limit (default: the spec's vdev, else your tenant's only one)"},
    {0}};
static const gpuctl_flag submit_flags[] = {
    {"--watch", NULL, NULL, 0, 0, "follow the job until it ends (as gpuctl watch)"},
    {"--vdev", NULL, "V", 0, 0, "run it on this vdev (instead of the spec's vdev; default $GPUSHARE_VDEV)"},
    {"--priority", NULL, "N", 0, 0, "its priority, -2147483648 to 2147483647 (instead of the spec's)"},
    {0}};
static const gpuctl_flag job_encode_flags[] = {
    {"--output", "-o", "JOB.pb", 0, 0, "where to write (default: the input's name with .pb)"}, {0}};
static const gpuctl_flag list_flags[] = {
    {"--all", NULL, NULL, 0, 0, "every tenant's jobs, not only your tenant's (an admin view)"}, {0}};
static const gpuctl_flag fetch_flags[] = {
    {"--output", "-o", "FILE", 0, 1, "where to write (\"-\" for stdout)"},
    {"--checkpoint", NULL, NULL, 0, 0, "the last checkpoint instead of the trained weights"},
    {0}};

static const gpuctl_flag usage_flags[] = {
    {"--tenant", NULL, "T", 0, 0, "this tenant only (an admin; a tenant's member sees its own)"},
    {"--since", NULL, "YYYY-MM-DD", 0, 0, "the UTC days from this one on (default: every day)"},
    {0}};

static const gpuctl_command commands[] = {
    {"devices", "", 0, 0, "list physical devices, their memory and what is allocated", no_flags, gpuctl_cmd_devices, NULL},
    {"slurm-gres", "", 0, 0, "this node's gres.conf lines and slurm.conf Gres= for gres/shard", slurm_gres_flags,
     gpuctl_cmd_slurm_gres,
     "One shard is --unit of a device's usable memory (gpuctl devices). Users ask\n"
     "for --gres=shard:N with N = ceil(--gpushare-mem / unit); see docs/slurm.md.\n"},
    {"vdev create", "NAME", 1, 1, "create a virtual device (admin)", vdev_create_flags, gpuctl_cmd_vdev_create, NULL},
    {"vdev list", "", 0, 0, "list virtual devices", no_flags, gpuctl_cmd_vdev_list, NULL},
    {"vdev delete", "NAME", 1, 1, "delete a virtual device (admin)", no_flags, gpuctl_cmd_vdev_delete, NULL},
    {"vdev set", "NAME", 1, 1, "change a virtual device while its jobs run (admin)", vdev_set_flags, gpuctl_cmd_vdev_set,
     "A larger --memory takes effect at once and starts queued jobs that now fit.\n"
     "A smaller one is refused when the vdev's running jobs could not fit it even at\n"
     "micro-batch 1; otherwise each running job that no longer fits stops at its next\n"
     "step boundary with a checkpoint and either resumes at once with a smaller\n"
     "micro-batch and more accumulation steps (auto_fit: the effective batch is\n"
     "kept) or waits PREEMPTED until it fits. The allocator takes the new limit once\n"
     "what is in use fits under it, so the limit is never passed. The lines after\n"
     "the vdev say what became of each job.\n"},
    {"tenant create", "NAME", 1, 1, "create a tenant with members and a quota (admin)", tenant_create_flags,
     gpuctl_cmd_tenant_create, NULL},
    {"tenant list", "", 0, 0, "list tenants, their quotas and usage", no_flags, gpuctl_cmd_tenant_list, NULL},
    {"tenant delete", "NAME", 1, 1, "delete a tenant (admin)", no_flags, gpuctl_cmd_tenant_delete, NULL},
    {"quota set", "TENANT", 1, 1, "change a tenant's quota; only the flags given change (admin)", quota_set_flags,
     gpuctl_cmd_quota_set, NULL},
    {"quota show", "TENANT", 1, 1, "show a tenant's quota and usage", no_flags, gpuctl_cmd_quota_show, NULL},
    {"dataset add", "NAME FILE...", 2, -1, "upload files to the dataset store", dataset_add_flags,
     gpuctl_cmd_dataset_add,
     "One file becomes dataset NAME; several files become one dataset each, named\n"
     "NAME.BASENAME (e.g. fmnist.train-images-idx3-ubyte.gz). Files go up in 1 MiB\n"
     "chunks with their sha256, which the daemon checks before it commits them, as\n"
     "the --format given: idx, npy (a NumPy .npy images or labels array), text (raw\n"
     "text, a token per byte) or tokens (little-endian uint16 token ids, each below\n"
     "--vocab-size). Without --format a file that starts as a .npy file does is\n"
     "npy, any other idx.\n"},
    {"dataset list", "", 0, 0, "list datasets you can use", no_flags, gpuctl_cmd_dataset_list, NULL},
    {"dataset rm", "NAME", 1, 1, "remove a dataset", no_flags, gpuctl_cmd_dataset_rm, NULL},
    {"job encode", "JOB.txtpb", 1, 1, "turn a job written as text protobuf into the binary JOB.pb", job_encode_flags,
     gpuctl_cmd_job_encode,
     "JOB.txtpb is a gpushare.v1.JobSpec in protobuf text format (see docs/jobs.md).\n"
     "protoc parses it against gpushare.proto, found at $GPUSHARE_PROTO,\n"
     "BIN/../share/gpushare/gpushare.proto, BIN/../../proto/gpushare.proto (a build\n"
     "tree) or /usr/share/gpushare/gpushare.proto; the result is checked by decoding\n"
     "it again. A spec that does not parse is reported with its line and column and\n"
     "nothing is written. Needs protoc (Debian: apt-get install protobuf-compiler).\n"},
    {"job show", "JOB.pb", 1, 1, "print a binary job spec as text protobuf (--json: as JSON)", no_flags,
     gpuctl_cmd_job_show, "The text form needs protoc, as job encode does; --json needs nothing else.\n"},
    {"plan", "JOB.pb", 1, 1, "predict a job's peak memory, layer by layer", plan_flags, gpuctl_cmd_plan,
     "JOB.pb is a binary gpushare.v1.JobSpec (gpuctl job encode JOB.txtpb).\n"
     "Local idx paths are hashed and sent as sha256: references; nothing is uploaded.\n"
     "The vdev is the one submit would choose: --vdev, else the spec's vdev, else\n"
     "your tenant's only vdev (a tenant of several must name one; without any the\n"
     "plan has no limit). A job that does not fit is printed with what would fit.\n"
     "Exit status: 0 the job fits (or there is no limit), 3 it does not fit the\n"
     "vdev as written (submit refuses it unless it sets auto_fit), 1 refused or\n"
     "failed, 2 usage error.\n"},
    {"submit", "JOB.pb", 1, 1, "submit a job (--watch: and follow it, as gpuctl watch)", submit_flags, gpuctl_cmd_submit,
     "JOB.pb is a binary gpushare.v1.JobSpec (gpuctl job encode JOB.txtpb).\n"
     "idx images/labels given as local paths (relative to the current directory)\n"
     "are uploaded unless your store already holds the same sha256, and the job\n"
     "refers to them as sha256:HEX; a bare name that is no file here names one of\n"
     "your datasets (gpuctl dataset add NAME FILE). A job that does not fit is\n"
     "refused with its plan; when the job names its vdev (or --vdev does) and\n"
     "has files to upload, that is checked against the vdev's plan first, so a\n"
     "job that cannot fit uploads nothing (unless it sets auto_fit).\n"
     "--vdev and --priority take the place of the spec's vdev and priority.\n"
     "When neither the spec nor --vdev names a vdev, $GPUSHARE_VDEV does (set in\n"
     "a Slurm step by gpushare's SPANK plugin, with $GPUSHARE_SOCKET).\n"},
    {"status", "ID", 1, 1, "show a job: state, progress, epochs, an out-of-memory report", no_flags, gpuctl_cmd_status, NULL},
    {"list", "", 0, 0, "list your tenant's jobs, finished ones included (--all: every tenant's, admin)",
     list_flags, gpuctl_cmd_list,
     "A line per job, queued, running or ended, oldest first: PROGRESS is the epoch\n"
     "it is in and its step of the total (\"starting\" while a running job loads its\n"
     "data and has no step yet). Without --all an admin who is no tenant's member\n"
     "sees no jobs.\n"},
    {"watch", "ID", 1, 1, "follow a job until it ends; exit 0 if it succeeded, 1 otherwise", no_flags, gpuctl_cmd_watch,
     "On a terminal the progress is one live line (epoch, step, loss, the last\n"
     "epoch's test accuracy, samples/s, memory in use / limit, fp16 loss scale),\n"
     "cut to the terminal's width (its size, else $COLUMNS, else 80 columns);\n"
     "otherwise a line per epoch and at most one progress line every 5 seconds.\n"
     "The last line says how the job ended; on failure the reason and any\n"
     "out-of-memory report go to stderr. With --json: one gpushare.v1.WatchResponse\n"
     "per line.\n"},
    {"cancel", "ID", 1, 1, "cancel a job (it stops at its next step)", no_flags, gpuctl_cmd_cancel, NULL},
    {"logs", "ID", 1, 1, "print a job's events", no_flags, gpuctl_cmd_logs, NULL},
    {"fetch", "ID", 1, 1, "download a job's trained weights (safetensors) or checkpoint", fetch_flags, gpuctl_cmd_fetch, NULL},
    {"memory", "ID", 1, 1, "a job's measured memory: a chart of the peak by step, the peak by layer and role",
     no_flags, gpuctl_cmd_memory, NULL},
    {"usage", "", 0, 0, "what jobs used, per tenant: device time, memory, steps, samples, preemptions",
     usage_flags, gpuctl_cmd_usage,
     "Per tenant a total line, then a line per job (and vdev) with: DEVICE-S, the\n"
     "seconds of device time its steps were charged; RESERVED-GIB-S, its vdev's\n"
     "reserved memory in GiB x seconds, split among the jobs running in it by\n"
     "their planned peaks; IN-USE-GIB-S, its planned peak in GiB x the seconds it\n"
     "ran; STEPS and SAMPLES (steps x micro-batch x accumulation steps); and\n"
     "PREEMPTIONS. A line \"idle\" is a vdev's reserved memory while none of its\n"
     "jobs ran (a PREALLOCATE vdev holds its whole limit). The daemon writes these\n"
     "figures to its store every second: they survive restarts. --since counts the\n"
     "UTC days from the one given. With --json: the gpushare.v1.UsageResponse.\n"},
    {"metrics", "", 0, 0, "the daemon's metrics in Prometheus text format", no_flags, gpuctl_cmd_metrics, NULL},
    {"version", "", 0, 0, "versions, and who the daemon thinks you are", no_flags, gpuctl_cmd_version, NULL},
};
#define NCOMMANDS (sizeof commands / sizeof commands[0])

static const char *const groups[] = {"vdev", "tenant", "quota", "dataset", "job", NULL};

static void print_main_usage(FILE *f) {
  fprintf(f,
          "usage: gpuctl [--socket P] [--json] COMMAND [ARGS...]\n"
          "\n"
          "Talk to gpushared, the multi-tenant GPU sharing daemon.\n"
          "\n"
          "global options:\n"
          "  --socket P   the daemon's socket (default $GPUSHARE_SOCKET, else %s)\n"
          "  --json       print results as JSON (gpushare.v1 field names)\n"
          "  --help       this text; 'gpuctl COMMAND --help' for one command\n"
          "\n"
          "commands:\n",
          GS_CLIENT_DEFAULT_SOCKET);
  for (size_t i = 0; i < NCOMMANDS; i++) {
    char head[64];
    snprintf(head, sizeof head, "%s%s%s", commands[i].name, commands[i].args[0] ? " " : "", commands[i].args);
    fprintf(f, "  %-26s %s\n", head, commands[i].summary);
  }
  fprintf(f,
          "\n"
          "Sizes read as 4GiB, 512MiB, 64k (powers of 1024) or 1.5GB (powers of 1000).\n"
          "Exit status: 0 ok, 1 refused or failed, 2 usage error, 3 plan: the job does not\n"
          "fit its vdev. With --json, an error is one JSON object on stderr:\n"
          "{\"error\":{\"code\":\"NOT_FOUND\",\"message\":\"...\",\"field\":\"...\"}}.\n");
}

static void print_command_usage(FILE *f, const gpuctl_command *c) {
  fprintf(f, "usage: gpuctl [--socket P] [--json] %s", c->name);
  if (c->args[0]) fprintf(f, " %s", c->args);
  for (const gpuctl_flag *fl = c->flags; fl->name; fl++) {
    fprintf(f, " %s%s%s%s%s%s", fl->required ? "" : "[", fl->alias ? fl->alias : fl->name, fl->metavar ? " " : "",
            fl->metavar ? fl->metavar : "", fl->required ? "" : "]", fl->repeat ? "..." : "");
  }
  fprintf(f, "\n\n%s.\n", c->summary);
  if (c->flags->name) {
    fprintf(f, "\noptions:\n");
    for (const gpuctl_flag *fl = c->flags; fl->name; fl++) {
      char head[64];
      snprintf(head, sizeof head, "%s%s%s%s%s", fl->alias ? fl->alias : "", fl->alias ? ", " : "", fl->name,
               fl->metavar ? " " : "", fl->metavar ? fl->metavar : "");
      fprintf(f, "  %-22s %s%s\n", head, fl->help, fl->required ? " (required)" : "");
    }
  }
  if (c->details) fprintf(f, "\n%s", c->details);
}

static void print_group_usage(FILE *f, const char *group) {
  fprintf(f, "usage: gpuctl [--socket P] [--json] %s SUBCOMMAND ...\n\nsubcommands:\n", group);
  size_t gl = strlen(group);
  for (size_t i = 0; i < NCOMMANDS; i++) {
    if (strncmp(commands[i].name, group, gl) || commands[i].name[gl] != ' ') continue;
    char head[64];
    snprintf(head, sizeof head, "%s%s%s", commands[i].name, commands[i].args[0] ? " " : "", commands[i].args);
    fprintf(f, "  %-26s %s\n", head, commands[i].summary);
  }
}

static int is_group(const char *w) {
  for (int i = 0; groups[i]; i++)
    if (!strcmp(groups[i], w)) return 1;
  return 0;
}

static const gpuctl_command *find_command(const char *w1, const char *w2, int *nwords) {
  char two[128];
  if (w2) {
    snprintf(two, sizeof two, "%s %s", w1, w2);
    for (size_t i = 0; i < NCOMMANDS; i++)
      if (!strcmp(commands[i].name, two)) {
        *nwords = 2;
        return &commands[i];
      }
  }
  for (size_t i = 0; i < NCOMMANDS; i++)
    if (!strcmp(commands[i].name, w1)) {
      *nwords = 1;
      return &commands[i];
    }
  return NULL;
}

/* Parse the words after the command name against its flag table. */
static int parse_command_args(gpuctl_cli *x, const gpuctl_command *c, int argc, char **argv, gpuctl_parsed *p) {
  int nflags = 0;
  while (c->flags[nflags].name) nflags++;
  int only_pos = 0;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    if (!only_pos && !strcmp(a, "--")) {
      only_pos = 1;
      continue;
    }
    if (!only_pos && a[0] == '-' && a[1] != '\0') {
      const char *eq = strchr(a, '=');
      size_t nlen = eq ? (size_t)(eq - a) : strlen(a);
      int k = 0;
      for (; k < nflags; k++) {
        const gpuctl_flag *fl = &c->flags[k];
        if ((strlen(fl->name) == nlen && !strncmp(fl->name, a, nlen)) ||
            (fl->alias && strlen(fl->alias) == nlen && !strncmp(fl->alias, a, nlen)))
          break;
      }
      if (k == nflags) return cli_usage_error(x, "unknown flag %.*s", (int)nlen, a);
      const gpuctl_flag *fl = &c->flags[k];
      const char *v = "";
      if (fl->metavar) {
        if (eq) v = eq + 1;
        else if (i + 1 < argc) v = argv[++i];
        else return cli_usage_error(x, "%s needs a value (%s)", fl->name, fl->metavar);
      } else if (eq) {
        return cli_usage_error(x, "%s takes no value (got \"%s\")", fl->name, eq + 1);
      }
      if (p->nval[k] && !fl->repeat) return cli_usage_error(x, "%s is given more than once", fl->name);
      if (p->nval[k] == GPUCTL_MAX_ARGS) return cli_usage_error(x, "%s is given more than %d times", fl->name, GPUCTL_MAX_ARGS);
      p->val[k][p->nval[k]++] = v;
      continue;
    }
    if (p->npos == GPUCTL_MAX_ARGS) return cli_usage_error(x, "more than %d arguments", GPUCTL_MAX_ARGS);
    p->pos[p->npos++] = a;
  }
  if (p->npos < c->min_pos)
    return cli_usage_error(x, "missing %s", c->args[0] ? c->args : "argument");
  if (c->max_pos >= 0 && p->npos > c->max_pos)
    return cli_usage_error(x, "unexpected argument \"%s\"%s%s", p->pos[c->max_pos],
                       c->args[0] ? "; expected " : "", c->args);
  for (int k = 0; k < nflags; k++)
    if (c->flags[k].required && !p->nval[k])
      return cli_usage_error(x, "%s %s is required", c->flags[k].name, c->flags[k].metavar ? c->flags[k].metavar : "");
  for (int i = 0; i < p->npos; i++)
    if (!p->pos[i][0]) return cli_usage_error(x, "argument %d is empty", i + 1);
  return 0;
}

int main(int argc, char **argv) {
  gpuctl_cli x = {0};
  int help = 0;
  /* Global options may appear anywhere before "--"; the rest is the command. */
  char **rest = calloc((size_t)argc + 1, sizeof *rest);
  if (!rest) return cli_fail("out of memory");
  int nrest = 0, rc;
  /* --json anywhere before "--" makes every error, even one about the
   * options before it, a JSON object */
  for (int i = 1; i < argc && strcmp(argv[i], "--"); i++)
    if (!strcmp(argv[i], "--json")) cli_set_json_errors(1);
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--")) {
      while (i < argc) rest[nrest++] = argv[i++];
      break;
    }
    if (!strcmp(a, "--json")) x.json = 1;
    else if (!strcmp(a, "--help") || !strcmp(a, "-h")) help = 1;
    else if (!strcmp(a, "--socket") || !strncmp(a, "--socket=", 9)) {
      const char *v = a[8] == '=' ? a + 9 : (i + 1 < argc ? argv[++i] : NULL);
      if (!v) {
        rc = cli_usage_error(&x, "--socket needs a value (P, the daemon's socket path)");
        goto out;
      }
      if (!*v) {
        rc = cli_usage_error(&x, "--socket: the path is empty");
        goto out;
      }
      x.socket = v;
    } else {
      rest[nrest++] = argv[i];
    }
  }
  int cstart = 0;
  if (nrest > 0 && !strcmp(rest[0], "help")) {
    help = 1;
    cstart = 1;
  }
  if (cstart >= nrest) {
    if (!help && cli_json_errors()) {
      rc = cli_usage_error(&x, "no command given");
      goto out;
    }
    print_main_usage(help ? stdout : stderr);
    rc = help ? GPUCTL_EXIT_OK : GPUCTL_EXIT_USAGE;
    goto out;
  }
  const char *w1 = rest[cstart];
  if (w1[0] == '-') {
    rc = cli_usage_error(&x, "unknown option %s", w1);
    goto out;
  }
  int nwords = 0;
  const gpuctl_command *c = find_command(w1, cstart + 1 < nrest ? rest[cstart + 1] : NULL, &nwords);
  if (!c) {
    if (is_group(w1)) {
      if (help) {
        print_group_usage(stdout, w1);
        rc = GPUCTL_EXIT_OK;
      } else if (cli_json_errors()) {
        if (cstart + 1 < nrest) rc = cli_usage_error(&x, "%s: unknown subcommand \"%s\"", w1, rest[cstart + 1]);
        else rc = cli_usage_error(&x, "%s: missing subcommand", w1);
      } else {
        if (cstart + 1 < nrest) fprintf(stderr, "gpuctl: %s: unknown subcommand \"%s\"\n", w1, rest[cstart + 1]);
        else fprintf(stderr, "gpuctl: %s: missing subcommand\n", w1);
        print_group_usage(stderr, w1);
        rc = GPUCTL_EXIT_USAGE;
      }
    } else {
      rc = cli_usage_error(&x, "unknown command \"%s\"", w1);
    }
    goto out;
  }
  x.cmd = c;
  if (help) {
    print_command_usage(stdout, c);
    rc = GPUCTL_EXIT_OK;
    goto out;
  }
  gpuctl_parsed *p = calloc(1, sizeof *p);
  if (!p) {
    rc = cli_fail("out of memory");
    goto out;
  }
  rc = parse_command_args(&x, c, nrest - cstart - nwords, rest + cstart + nwords, p);
  if (!rc) rc = c->run(&x, p);
  free(p);
  gs_client_close(x.c);
out:
  free(rest);
  return rc;
}
