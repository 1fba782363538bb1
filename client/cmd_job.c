/*
 * cmd_job.c: job specs and the jobs made of them: job encode and show
 * (the text and the binary form of a spec), plan, submit, status, list,
 * cancel, logs, fetch (a job's trained weights or checkpoint), memory (a
 * job's measured memory) and usage (what jobs used, per tenant).
 *
 * A spec is read from a binary gpushare.v1.JobSpec; its datasets are
 * resolved by cmd_dataset.c before it goes to the daemon. submit --watch
 * hands the job to cmd_watch.c, and the out-of-memory report printed here
 * for status is also what a watch prints when its job ran out of memory.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "client/cli.h"
#include "client/client.h"
#include "client/cmd_dataset.h"
#include "client/cmd_job.h"
#include "client/cmd_watch.h"
#include "client/gpuctl.h"
#include "client/pbjson.h"
#include "client/table.h"
#include "common/file.h"
#include "present/present.h"
#include "proto/wire.h"

/* ------------------------------------------------------------- job specs --- */

/* A job spec file, whole (a spec is a few kilobytes; anything larger than
 * a frame could not be sent anyway). malloc'd. */
static int read_small_file(const char *path, uint8_t **out, size_t *len) {
  gs_err e = {0};
  int rc = gs_file_read(path, GS_WIRE_MAX_FRAME, NULL, out, len, &e);
  if (rc == -EFBIG)
    return cli_fail("%s is larger than %u bytes; a job spec is a few kilobytes", path,
                    GS_WIRE_MAX_FRAME);
  return rc ? cli_fail("%s", e.msg) : 0;
}

/* Unpack a binary JobSpec held in buf; on failure say what the file is
 * likely to be instead (a text spec is the usual mistake). */
static int unpack_spec(const char *path, const uint8_t *buf, size_t n, Gpushare__V1__JobSpec **out) {
  int text = n > 0;
  for (size_t i = 0; i < n && i < 256; i++)
    if (!isprint(buf[i]) && !isspace(buf[i])) text = 0;
  *out = text ? NULL : gpushare__v1__job_spec__unpack(NULL, n, buf);
  if (*out) return 0;
  if (text)
    return cli_fail("%s is not a binary gpushare.v1.JobSpec (it looks like text); encode it with: "
                "gpuctl job encode %s", path, path);
  return cli_fail("%s is not a binary gpushare.v1.JobSpec (%zu bytes that do not decode: truncated, or "
              "another message); encode a text spec with: gpuctl job encode JOB.txtpb", path, n);
}

/* Read a binary JobSpec (gpuctl job encode, or protoc --encode). */
static int read_spec(const char *path, Gpushare__V1__JobSpec **out) {
  uint8_t *buf = NULL;
  size_t n = 0;
  if (read_small_file(path, &buf, &n)) return GPUCTL_EXIT_FAIL;
  int rc = unpack_spec(path, buf, n, out);
  free(buf);
  return rc;
}

/* ------------------------------------------------------------ job files --- */

/* A tenant writes a job as text protobuf and gpuctl turns it into the binary
 * JobSpec that submit sends, through protoc (the reference text-format
 * parser, with line and column in its messages) and gpushare.proto, looked
 * up where an install or a build tree puts it. What protoc writes is
 * decoded again with protobuf-c, the daemon's own decoder, before it is
 * renamed into place, so a JOB.pb that exists is one the daemon can read. */

/* dir of path (without the final slash) into out; "." when it has none. */
static void dir_of(const char *path, char *out, size_t n) {
  const char *s = strrchr(path, '/');
  if (!s) snprintf(out, n, ".");
  else if (s == path) snprintf(out, n, "/");
  else snprintf(out, n, "%.*s", (int)(s - path), path);
}

/* gpushare.proto: $GPUSHARE_PROTO, beside an installed gpuctl
 * (BIN/../share/gpushare), in the build tree (build/bin/gpuctl ->
 * proto/), then /usr/share/gpushare. */
static int find_proto(char *out, size_t n) {
  const char *env = getenv("GPUSHARE_PROTO");
  if (env && *env) {
    if (access(env, R_OK) < 0) return cli_fail("GPUSHARE_PROTO=%s: %s", env, strerror(errno));
    snprintf(out, n, "%s", env);
    return 0;
  }
  char exe[PATH_MAX] = "", bindir[PATH_MAX] = "";
  ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (k > 0) {
    exe[k] = '\0';
    dir_of(exe, bindir, sizeof bindir);
  }
  char cand[3][PATH_MAX + 64];
  int nc = 0;
  if (bindir[0]) {
    snprintf(cand[nc++], sizeof cand[0], "%s/../share/gpushare/gpushare.proto", bindir);
    snprintf(cand[nc++], sizeof cand[0], "%s/../../proto/gpushare.proto", bindir);
  }
  snprintf(cand[nc++], sizeof cand[0], "/usr/share/gpushare/gpushare.proto");
  for (int i = 0; i < nc; i++)
    if (access(cand[i], R_OK) == 0) {
      snprintf(out, n, "%s", cand[i]);
      return 0;
    }
  return cli_fail("cannot find gpushare.proto (looked at $GPUSHARE_PROTO, %s, %s and "
              "/usr/share/gpushare/gpushare.proto); set GPUSHARE_PROTO to its path",
              nc > 1 ? cand[0] : "BIN/../share/gpushare/gpushare.proto",
              nc > 2 ? cand[1] : "BIN/../../proto/gpushare.proto");
}

/* protoc on $PATH, or an explanation of how to get it. */
static int find_protoc(char *out, size_t n, const char *verb) {
  const char *path = getenv("PATH");
  if (!path || !*path) path = "/usr/bin:/bin";
  for (const char *p = path; *p;) {
    const char *colon = strchr(p, ':');
    size_t len = colon ? (size_t)(colon - p) : strlen(p);
    if (len > 0 && len < PATH_MAX) {
      snprintf(out, n, "%.*s/protoc", (int)len, p);
      if (access(out, X_OK) == 0) return 0;
    }
    if (!colon) break;
    p = colon + 1;
  }
  return cli_fail("gpuctl job %s needs protoc (Debian: apt-get install protobuf-compiler)", verb);
}

/* Run protoc MODE=gpushare.v1.JobSpec with stdin from in_fd and stdout to
 * out_fd. Its messages name "input"; they are printed naming src instead.
 * 0 when protoc succeeded. */
static int run_protoc(const char *mode, int in_fd, int out_fd, const char *src) {
  char protoc[PATH_MAX + 16], proto[PATH_MAX + 64], pdir[PATH_MAX + 64];
  if (find_protoc(protoc, sizeof protoc, !strcmp(mode, "--encode") ? "encode" : "show") || find_proto(proto, sizeof proto)) return GPUCTL_EXIT_FAIL;
  dir_of(proto, pdir, sizeof pdir);
  char a_mode[64], a_path[PATH_MAX + 80];
  snprintf(a_mode, sizeof a_mode, "%s=gpushare.v1.JobSpec", mode);
  snprintf(a_path, sizeof a_path, "--proto_path=%s", pdir);
  char *args[] = {protoc, a_mode, a_path, (char *)gpuctl_base_name(proto), NULL};
  int ep[2];
  if (pipe(ep) < 0) return cli_fail("cannot run protoc: %s", strerror(errno));
  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) {
    close(ep[0]);
    close(ep[1]);
    return cli_fail("cannot run protoc: %s", strerror(errno));
  }
  if (pid == 0) {
    if (dup2(in_fd, STDIN_FILENO) < 0 || dup2(out_fd, STDOUT_FILENO) < 0 || dup2(ep[1], STDERR_FILENO) < 0)
      _exit(127);
    close(ep[0]);
    execv(protoc, args);
    dprintf(STDERR_FILENO, "cannot run %s: %s\n", protoc, strerror(errno));
    _exit(127);
  }
  close(ep[1]);
  char msg[16384];
  size_t got = 0;
  for (;;) {
    ssize_t k = read(ep[0], msg + got, sizeof msg - 1 - got);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    got += (size_t)k;
    if (got == sizeof msg - 1) { /* keep draining so protoc never blocks */
      char sink[4096];
      while (read(ep[0], sink, sizeof sink) > 0) {}
      break;
    }
  }
  msg[got] = '\0';
  close(ep[0]);
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
  int ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
  /* "input:3:7: Expected integer, got: oops" -> "job.txtpb:3:7: ..."; with
   * --json the lines go into the error's message, "; " between them */
  char said[4096] = "";
  size_t off = 0;
  for (char *line = msg, *next; line && *line; line = next) {
    next = strchr(line, '\n');
    if (next) *next++ = '\0';
    if (!strcmp(line, "Failed to parse input.")) continue;
    int input = !strncmp(line, "input:", 6);
    if (!cli_json_errors()) fprintf(stderr, "%s:%s%s\n", src, input ? "" : " ", input ? line + 6 : line);
    else if (off < sizeof said)
      off += (size_t)snprintf(said + off, sizeof said - off, "%s%s:%s%s", off ? "; " : "", src,
                              input ? "" : " ", input ? line + 6 : line);
  }
  if (ok) return 0;
  if (!strcmp(mode, "--encode"))
    return cli_fail("%s does not parse as a text gpushare.v1.JobSpec; nothing was written%s%s", src,
                    said[0] ? ": " : "", said);
  return cli_fail("protoc could not print %s%s%s", src, said[0] ? ": " : "", said);
}

/* JOB.txtpb -> JOB.pb: the extension after the last dot is replaced. */
static void default_pb_name(const char *in, char *out, size_t n) {
  const char *slash = strrchr(in, '/');
  const char *dot = strrchr(in, '.');
  if (dot && (!slash || dot > slash + 1)) snprintf(out, n, "%.*s.pb", (int)(dot - in), in);
  else snprintf(out, n, "%s.pb", in);
}

int gpuctl_cmd_job_encode(gpuctl_cli *x, gpuctl_parsed *p) {
  const char *in = p->pos[0];
  char outbuf[PATH_MAX];
  const char *out = p->nval[0] ? p->val[0][0] : NULL;
  if (!out) {
    default_pb_name(in, outbuf, sizeof outbuf);
    out = outbuf;
  }
  if (!strcmp(out, in)) return cli_usage_error(x, "the output would overwrite %s; name another with -o", in);
  int in_fd = open(in, O_RDONLY | O_CLOEXEC);
  if (in_fd < 0) return cli_fail("cannot read %s: %s", in, strerror(errno));
  struct stat st;
  if (fstat(in_fd, &st) == 0 && !S_ISREG(st.st_mode)) {
    close(in_fd);
    return cli_fail("cannot read %s: not a regular file", in);
  }
  /* Written beside the target and renamed at the end: a spec that does not
   * parse leaves no output, and an older JOB.pb stays as it was. */
  char tmp[PATH_MAX + 16];
  if (snprintf(tmp, sizeof tmp, "%s.partXXXXXX", out) >= (int)sizeof tmp) {
    close(in_fd);
    return cli_fail("%s: path too long", out);
  }
  int fd = mkstemp(tmp);
  if (fd < 0) {
    int err = errno;
    close(in_fd);
    return cli_fail("cannot write %s: %s", out, strerror(err));
  }
  int rc = run_protoc("--encode", in_fd, fd, in);
  close(in_fd);
  uint8_t *buf = NULL;
  size_t n = 0;
  Gpushare__V1__JobSpec *spec = NULL;
  if (rc) goto fail;
  rc = read_small_file(tmp, &buf, &n);
  if (rc) goto fail;
  spec = gpushare__v1__job_spec__unpack(NULL, n, buf);
  if (!spec) {
    rc = cli_fail("protoc wrote %zu bytes for %s that protobuf-c cannot decode as a gpushare.v1.JobSpec "
              "(is the gpushare.proto it read the daemon's?); nothing was written", n, in);
    goto fail;
  }
  if (fchmod(fd, 0644) < 0 || fsync(fd) < 0) {
    rc = cli_fail("cannot write %s: %s", out, strerror(errno));
    goto fail;
  }
  if (rename(tmp, out) < 0) {
    rc = cli_fail("cannot write %s: %s", out, strerror(errno));
    goto fail;
  }
  size_t layers = spec->model ? spec->model->n_layer : 0;
  if (x->json) {
    pbjson j = {.f = stdout};
    pbjson_open(&j, NULL, '{');
    pbjson_str(&j, "file", out);
    pbjson_u64(&j, "bytes", n);
    pbjson_str(&j, "name", spec->name ? spec->name : "");
    pbjson_u64(&j, "layers", layers);
    pbjson_close(&j, '}');
    fputc('\n', stdout);
  } else {
    printf("%s: %zu bytes, job \"%s\", %zu layer%s\n", out, n, spec->name ? spec->name : "", layers,
           layers == 1 ? "" : "s");
  }
  gpushare__v1__job_spec__free_unpacked(spec, NULL);
  free(buf);
  close(fd);
  return 0;
fail:
  if (spec) gpushare__v1__job_spec__free_unpacked(spec, NULL);
  free(buf);
  close(fd);
  unlink(tmp);
  return rc ? rc : GPUCTL_EXIT_FAIL;
}

int gpuctl_cmd_job_show(gpuctl_cli *x, gpuctl_parsed *p) {
  const char *path = p->pos[0];
  uint8_t *buf = NULL;
  size_t n = 0;
  if (read_small_file(path, &buf, &n)) return GPUCTL_EXIT_FAIL;
  Gpushare__V1__JobSpec *spec;
  int rc = unpack_spec(path, buf, n, &spec);
  free(buf);
  if (rc) return rc;
  if (x->json) {
    pbjson_print(&spec->base);
    gpushare__v1__job_spec__free_unpacked(spec, NULL);
    return 0;
  }
  gpushare__v1__job_spec__free_unpacked(spec, NULL);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return cli_fail("cannot read %s: %s", path, strerror(errno));
  rc = run_protoc("--decode", fd, STDOUT_FILENO, path);
  close(fd);
  return rc;
}

/* ------------------------------------------------------------------ plan --- */

static void plan_print(FILE *f, const Gpushare__V1__Plan *pl) {
  if (pl->summary && *pl->summary) {
    fputs(pl->summary, f);
    if (pl->summary[strlen(pl->summary) - 1] != '\n') fputc('\n', f);
  } else {
    table t = {0};
    table_header(&t, 0x7f8u, (const char *const[]){"LAYER", "KIND", "OUTPUT", "PARAMS", "WEIGHTS", "MASTER",
                                                  "GRADIENTS", "OPTIMIZER", "ACTIVATIONS", "WORKSPACE", "BATCH", NULL});
    for (size_t i = 0; i < pl->n_row; i++) {
      const Gpushare__V1__PlanRow *r = pl->row[i];
      table_cell(&t, "%s", r->layer ? r->layer : "");
      table_cell(&t, "%s", r->kind ? r->kind : "");
      table_cell(&t, "%s", r->output_shape ? r->output_shape : "");
      table_cell(&t, "%" PRIu64, r->parameters);
      table_cell(&t, "%s", table_fsize(r->weights_bytes));
      table_cell(&t, "%s", table_fsize(r->master_bytes));
      table_cell(&t, "%s", table_fsize(r->gradient_bytes));
      table_cell(&t, "%s", table_fsize(r->optimizer_bytes));
      table_cell(&t, "%s", table_fsize(r->activation_bytes));
      table_cell(&t, "%s", table_fsize(r->workspace_bytes));
      table_cell(&t, "%s", table_fsize(r->batch_bytes));
    }
    table_fprint(f, &t);
  }
  fprintf(f, "parameters: %" PRIu64 "\n", pl->parameters);
  fprintf(f, "precision: %s, micro-batch %" PRIu32 " x %" PRIu32 " accumulation step%s\n",
          table_precision_name(pl->precision), pl->micro_batch, pl->accumulation_steps,
          pl->accumulation_steps == 1 ? "" : "s");
  if (pl->limit_bytes && pl->vdev && *pl->vdev)
    fprintf(f, "peak: %s of vdev %s's %s limit: %s\n", table_fsize(pl->peak_bytes), pl->vdev,
            table_fsize(pl->limit_bytes), pl->fits ? "fits" : "does NOT fit");
  else if (pl->limit_bytes)
    fprintf(f, "peak: %s of a %s limit: %s\n", table_fsize(pl->peak_bytes), table_fsize(pl->limit_bytes),
            pl->fits ? "fits" : "does NOT fit");
  else
    fprintf(f, "peak: %s\n", table_fsize(pl->peak_bytes));
}

/* The plan, against the vdev submit would choose (the one named, else the
 * tenant's only one): the table, the peak against the vdev's limit and,
 * when it does not fit, what does. Exit GPUCTL_EXIT_NOFIT when the job as
 * written does not fit, so a script can tell before it submits. */
int gpuctl_cmd_plan(gpuctl_cli *x, gpuctl_parsed *p) {
  Gpushare__V1__JobSpec *spec;
  if (read_spec(p->pos[0], &spec)) return GPUCTL_EXIT_FAIL;
  int named = p->nval[0] || (spec->vdev && *spec->vdev);
  int rc = cli_connect(x); /* before hashing: a stopped daemon is said at once */
  if (!rc) rc = gpuctl_resolve_spec(x, spec, 0);
  Gpushare__V1__Response *r = NULL;
  if (!rc) {
    GPUCTL_REQ(req, plan, PLAN, Gpushare__V1__PlanRequest, GPUSHARE__V1__PLAN_REQUEST__INIT);
    plan_msg.spec = spec;
    if (p->nval[0]) plan_msg.vdev = (char *)p->val[0][0];
    rc = cli_call(x, &req, &r);
    if (!rc) rc = cli_expect(r, GPUSHARE__V1__RESPONSE__RESULT_PLAN_RESULT);
  }
  const Gpushare__V1__Plan *pl = !rc ? r->plan_result->plan : NULL;
  if (!rc && x->json) {
    pbjson_print(&r->plan_result->base);
  } else if (pl) {
    if (pl->vdev && *pl->vdev && !named) printf("vdev: %s (your tenant's only vdev)\n", pl->vdev);
    plan_print(stdout, pl);
  }
  if (pl && pl->has_fits && !pl->fits) rc = GPUCTL_EXIT_NOFIT;
  gs_client_free_response(r);
  gpushare__v1__job_spec__free_unpacked(spec, NULL);
  return rc;
}

/* ------------------------------------------------------------------ jobs --- */

/* Before anything is uploaded: does the job fit the vdev it names, as
 * planned there (the daemon's plan, with its datasets' sha256 references
 * and no bytes sent)? 0 when it fits or cannot be judged here (no vdev
 * named; auto_fit, which the daemon may use to fit it); otherwise the
 * plan goes to stderr and the submit fails. */
static int submit_precheck(gpuctl_cli *x, const Gpushare__V1__JobSpec *spec) {
  if (!spec->vdev || !*spec->vdev || (spec->has_auto_fit && spec->auto_fit) ||
      !gpuctl_spec_uploads(spec))
    return 0;
  size_t n = gpushare__v1__job_spec__get_packed_size(spec);
  uint8_t *buf = malloc(n ? n : 1);
  if (!buf) return cli_fail("out of memory");
  gpushare__v1__job_spec__pack(spec, buf);
  Gpushare__V1__JobSpec *copy = gpushare__v1__job_spec__unpack(NULL, n, buf);
  free(buf);
  if (!copy) return cli_fail("out of memory");
  int rc = gpuctl_resolve_spec(x, copy, 0);
  Gpushare__V1__Response *r = NULL;
  if (!rc) {
    GPUCTL_REQ(req, plan, PLAN, Gpushare__V1__PlanRequest, GPUSHARE__V1__PLAN_REQUEST__INIT);
    plan_msg.spec = copy;
    rc = cli_call(x, &req, &r);
    if (!rc) rc = cli_expect(r, GPUSHARE__V1__RESPONSE__RESULT_PLAN_RESULT);
  }
  const Gpushare__V1__Plan *pl = !rc ? r->plan_result->plan : NULL;
  if (pl && pl->has_fits && !pl->fits) {
    if (!x->json) plan_print(stderr, pl);
    rc = cli_error("RESOURCE_EXHAUSTED", "spec.batch_size", "plan", &pl->base,"the job does not fit vdev %s: planned peak %s, limit %s; nothing was uploaded "
                  "(set auto_fit to let gpushare pick a smaller micro-batch)",
                  pl->vdev && *pl->vdev ? pl->vdev : spec->vdev, table_fsize(pl->peak_bytes),
                  table_fsize(pl->limit_bytes));
  }
  gs_client_free_response(r);
  gpushare__v1__job_spec__free_unpacked(copy, NULL);
  return rc;
}

int gpuctl_cmd_submit(gpuctl_cli *x, gpuctl_parsed *p) {
  Gpushare__V1__JobSpec *spec;
  int32_t priority = 0;
  if (p->nval[2] && cli_parse_i32(x, "--priority", p->val[2][0], &priority)) return GPUCTL_EXIT_USAGE;
  if (read_spec(p->pos[0], &spec)) return GPUCTL_EXIT_FAIL;
  int rc = GPUCTL_EXIT_FAIL;
  uint64_t id = 0;
  /* The flags win over the spec's fields (the spec was unpacked with the
   * default allocator: its strings are malloc'd). */
  if (p->nval[1]) {
    char *v = strdup(p->val[1][0]);
    if (!v) {
      rc = cli_fail("out of memory");
      goto out;
    }
    free(spec->vdev);
    spec->vdev = v;
  }
  /* Under Slurm the SPANK plugin names the step's vdev in $GPUSHARE_VDEV:
   * it is used when neither the spec nor --vdev names one. */
  const char *env_vdev = getenv("GPUSHARE_VDEV");
  if ((!spec->vdev || !*spec->vdev) && env_vdev && *env_vdev) {
    char *v = strdup(env_vdev);
    if (!v) {
      rc = cli_fail("out of memory");
      goto out;
    }
    free(spec->vdev);
    spec->vdev = v;
  }
  if (p->nval[2]) {
    spec->has_priority = 1;
    spec->priority = priority;
  }
  if (cli_connect(x)) goto out;
  rc = submit_precheck(x, spec);
  if (!rc) rc = gpuctl_resolve_spec(x, spec, 1);
  if (rc) goto out;
  GPUCTL_REQ(req, submit, SUBMIT, Gpushare__V1__SubmitRequest, GPUSHARE__V1__SUBMIT_REQUEST__INIT);
  submit_msg.spec = spec;
  Gpushare__V1__Response *r;
  rc = cli_call(x, &req, &r);
  if (rc) {
    /* a job that does not fit is refused with the plan that says why */
    if (r && r->plan && !x->json) plan_print(stderr, r->plan);
    gs_client_free_response(r);
    goto out;
  }
  rc = cli_expect(r, GPUSHARE__V1__RESPONSE__RESULT_SUBMIT);
  if (!rc) {
    const Gpushare__V1__Job *j = r->submit->job;
    id = j ? j->id : 0;
    if (x->json) {
      pbjson_print(&r->submit->base);
    } else if (j) {
      printf("job %" PRIu64 " submitted", j->id);
      if (j->name && *j->name) printf(" (%s)", j->name);
      printf(": vdev %s, %s", j->vdev ? j->vdev : "?", table_state_name(j->state));
      if (j->planned_peak_bytes) printf(", planned peak %s", table_fsize(j->planned_peak_bytes));
      if (j->data_bytes) printf(", data %s", table_fsize(j->data_bytes));
      if (j->micro_batch) printf(", micro-batch %" PRIu32 " x %" PRIu32, j->micro_batch, j->accumulation_steps);
      printf("\n");
    }
  }
  gs_client_free_response(r);
  if (!rc && p->nval[0]) {
    if (!id) rc = cli_fail("the daemon did not say which job it created; cannot watch it");
    else {
      fflush(stdout);
      rc = gpuctl_watch_job(x, id);
    }
  }
out:
  gpushare__v1__job_spec__free_unpacked(spec, NULL);
  return rc;
}

static void job_show(const Gpushare__V1__Job *j) {
  printf("job:          %" PRIu64 "\n", j->id);
  if (j->name && *j->name) printf("name:         %s\n", j->name);
  printf("tenant:       %s\n", j->tenant ? j->tenant : "");
  printf("vdev:         %s%s%s%s\n", j->vdev ? j->vdev : "", j->device && *j->device ? " (device " : "",
         j->device && *j->device ? j->device : "", j->device && *j->device ? ")" : "");
  printf("state:        %s%s\n", table_state_name(j->state),
         j->cancel_requested && j->state == GPUSHARE__V1__JOB_STATE__RUNNING
             ? " (cancel requested: stops at its next step)"
             : "");
  if (j->reason && *j->reason) printf("reason:       %s\n", j->reason);
  printf("priority:     %" PRId32 "\n", j->priority);
  printf("submitted:    %s\n", table_ftime(j->submitted_unix));
  if (j->started_unix) printf("started:      %s\n", table_ftime(j->started_unix));
  if (j->finished_unix) printf("finished:     %s\n", table_ftime(j->finished_unix));
  if (j->state == GPUSHARE__V1__JOB_STATE__RUNNING && !j->step && !j->total_steps)
    printf("step:         none yet (starting: loading its data, building the model)\n");
  else if (j->total_steps)
    printf("step:         %" PRIu64 " of %" PRIu64 " (%.1f%%)\n", j->step, j->total_steps,
           100.0 * (double)j->step / (double)j->total_steps);
  else
    printf("step:         %" PRIu64 "\n", j->step);
  if (j->micro_batch)
    printf("batch:        micro-batch %" PRIu32 " x %" PRIu32 " accumulation step%s\n", j->micro_batch,
           j->accumulation_steps, j->accumulation_steps == 1 ? "" : "s");
  if (j->spec) printf("precision:    %s\n", table_precision_name(j->spec->precision));
  if (j->planned_peak_bytes) printf("planned peak: %s\n", table_fsize(j->planned_peak_bytes));
  if (j->data_bytes) printf("data:         %s on the host, charged to the vdev\n", table_fsize(j->data_bytes));
  if (j->has_memory_in_use && j->has_host_memory_bytes) {
    /* What its run holds now, as its executor last reported. */
    printf("memory:       device %s in use", table_fsize(j->memory_in_use));
    if (j->planned_peak_bytes) printf(" / %s planned peak", table_fsize(j->planned_peak_bytes));
    printf(", host %s", table_fsize(j->host_memory_bytes));
    if (j->has_host_data_bytes && j->host_data_bytes <= j->host_memory_bytes)
      printf(" (datasets %s, shared; own buffers %s)", table_fsize(j->host_data_bytes),
             table_fsize(j->host_memory_bytes - j->host_data_bytes));
    printf("\n");
  }
  if (j->restarts) printf("restarts:     %" PRIu32 " (executor deaths it lived through)\n", j->restarts);
  if (j->spec && !j->spec->preemptible) printf("preemptible:  no\n");
  if (j->preemptions)
    printf("preempted:    %" PRIu32 " time%s, last %s\n", j->preemptions, j->preemptions == 1 ? "" : "s",
           table_ftime(j->last_preempted_unix));
  if (j->oom_retries)
    printf("OOMs:         %" PRIu32 " come back from (requeued or re-planned)\n", j->oom_retries);
  if (j->usage) {
    const Gpushare__V1__Usage *u = j->usage;
    printf("usage:        %.3f device-s, %.3f GiB-s reserved, %.3f GiB-s in use, %" PRIu64
           " step%s, %" PRIu64 " sample%s, %" PRIu32 " preemption%s\n",
           u->device_seconds, u->reserved_gib_seconds, u->in_use_gib_seconds, u->steps,
           u->steps == 1 ? "" : "s", u->samples, u->samples == 1 ? "" : "s", u->preemptions,
           u->preemptions == 1 ? "" : "s");
  }
  if (j->n_epoch) {
    printf("\n");
    table t = {0};
    table_header(&t, 0xffu, (const char *const[]){"EPOCH", "TRAIN-LOSS", "TEST-LOSS", "TEST-ACC", "SAMPLES/S",
                                                 "PEAK-MEM", "LOSS-SCALE", "SKIPPED", NULL});
    const int precision = table_job_precision(j);
    const int fp16 = precision == GPUSHARE__V1__PRECISION__MIXED_FLOAT16;
    for (size_t i = 0; i < j->n_epoch; i++) {
      const Gpushare__V1__EpochMetrics *m = j->epoch[i];
      table_cell(&t, m->partial ? "%" PRIu32 " (part)" : "%" PRIu32, m->epoch);
      table_cell(&t, "%.4f", m->train_loss);
      table_cell(&t, "%s", table_fnum("%.4f", m->test_loss));
      table_cell(&t, "%s", table_fnum("%.2f%%", 100.0 * m->test_accuracy));
      table_cell(&t, "%.0f", m->samples_per_second);
      table_cell(&t, "%s", table_fsize(m->peak_memory_bytes));
      /* only fp16 has a loss scale and skips steps */
      table_cell(&t, "%s", table_fscale(precision, m->has_loss_scale, m->loss_scale));
      if (fp16 || (precision < 0 && m->skipped_steps)) table_cell(&t, "%" PRIu64, m->skipped_steps);
      else table_cell(&t, "-");
    }
    table_print(&t);
    table_skip_warnings(stdout, j);
  }
  if (j->oom) {
    putchar('\n');
    cli_print_text(stdout, gs_present_oom(j->oom));
  }
}

static void status_human(gpuctl_cli *x, const Gpushare__V1__Response *r) {
  (void)x;
  if (r->job_status->job) job_show(r->job_status->job);
}

int gpuctl_cmd_status(gpuctl_cli *x, gpuctl_parsed *p) {
  GPUCTL_REQ(req, job_status, JOB_STATUS, Gpushare__V1__JobStatusRequest, GPUSHARE__V1__JOB_STATUS_REQUEST__INIT);
  if (cli_parse_job_id(x, p->pos[0], &job_status_msg.id)) return GPUCTL_EXIT_USAGE;
  job_status_msg.has_id = 1;
  return cli_simple(x, &req, GPUSHARE__V1__RESPONSE__RESULT_JOB_STATUS, status_human);
}

static void list_human(gpuctl_cli *x, const Gpushare__V1__Response *r) {
  (void)x;
  table t = {0};
  table_header(&t, (1u << 0) | (1u << 6),
               (const char *const[]){"ID", "NAME", "TENANT", "VDEV", "STATE", "PROGRESS", "PEAK", "SUBMITTED", NULL});
  for (size_t i = 0; i < r->list_jobs->n_job; i++) {
    const Gpushare__V1__Job *j = r->list_jobs->job[i];
    table_cell(&t, "%" PRIu64, j->id);
    table_cell(&t, "%s", j->name && *j->name ? j->name : "-");
    table_cell(&t, "%s", j->tenant ? j->tenant : "");
    table_cell(&t, "%s", j->vdev ? j->vdev : "");
    table_cell(&t, "%s", table_state_name(j->state));
    table_cell(&t, "%s", table_fprogress(j));
    table_cell(&t, "%s", j->planned_peak_bytes ? table_fsize(j->planned_peak_bytes) : "-");
    table_cell(&t, "%s", table_ftime(j->submitted_unix));
  }
  table_print(&t);
}

int gpuctl_cmd_list(gpuctl_cli *x, gpuctl_parsed *p) {
  GPUCTL_REQ(req, list_jobs, LIST_JOBS, Gpushare__V1__ListJobsRequest, GPUSHARE__V1__LIST_JOBS_REQUEST__INIT);
  if (p->nval[0]) {
    list_jobs_msg.has_all = 1;
    list_jobs_msg.all = 1;
  }
  return cli_simple(x, &req, GPUSHARE__V1__RESPONSE__RESULT_LIST_JOBS, list_human);
}

static void cancel_human(gpuctl_cli *x, const Gpushare__V1__Response *r) {
  (void)x;
  const Gpushare__V1__Job *j = r->cancel->job;
  if (j) printf("job %" PRIu64 ": %s%s%s\n", j->id, table_state_name(j->state), j->reason && *j->reason ? ": " : "",
                j->reason ? j->reason : "");
  else printf("cancel requested\n");
}

int gpuctl_cmd_cancel(gpuctl_cli *x, gpuctl_parsed *p) {
  GPUCTL_REQ(req, cancel, CANCEL, Gpushare__V1__CancelRequest, GPUSHARE__V1__CANCEL_REQUEST__INIT);
  if (cli_parse_job_id(x, p->pos[0], &cancel_msg.id)) return GPUCTL_EXIT_USAGE;
  cancel_msg.has_id = 1;
  return cli_simple(x, &req, GPUSHARE__V1__RESPONSE__RESULT_CANCEL, cancel_human);
}

static void logs_human(gpuctl_cli *x, const Gpushare__V1__Response *r) {
  /* the events do not say whether the job has a loss scale: its spec does */
  int precision = r->logs->n_event ? gpuctl_job_precision(x, r->logs->event[0]->job_id) : -1;
  for (size_t i = 0; i < r->logs->n_event; i++) {
    const Gpushare__V1__JobEvent *ev = r->logs->event[i];
    char line[1024], ts[64] = "-";
    gpuctl_event_line(ev, precision, line, sizeof line);
    if (ev->time_unix_ms > 0) {
      time_t t = (time_t)(ev->time_unix_ms / 1000);
      struct tm tm;
      if (localtime_r(&t, &tm)) {
        size_t k = strftime(ts, sizeof ts, "%Y-%m-%d %H:%M:%S", &tm);
        snprintf(ts + k, sizeof ts - k, ".%03d", (int)(ev->time_unix_ms % 1000));
      }
    }
    printf("%s  %s\n", ts, line);
  }
}

int gpuctl_cmd_logs(gpuctl_cli *x, gpuctl_parsed *p) {
  GPUCTL_REQ(req, logs, LOGS, Gpushare__V1__LogsRequest, GPUSHARE__V1__LOGS_REQUEST__INIT);
  if (cli_parse_job_id(x, p->pos[0], &logs_msg.id)) return GPUCTL_EXIT_USAGE;
  logs_msg.has_id = 1;
  return cli_simple(x, &req, GPUSHARE__V1__RESPONSE__RESULT_LOGS, logs_human);
}

int gpuctl_cmd_fetch(gpuctl_cli *x, gpuctl_parsed *p) {
  uint64_t id;
  if (cli_parse_job_id(x, p->pos[0], &id)) return GPUCTL_EXIT_USAGE;
  const char *out = p->val[0][0];
  int to_stdout = !strcmp(out, "-");
  if (to_stdout && x->json) return cli_usage_error(x, "-o -: the download itself goes to stdout; --json has nothing to add");
  if (cli_connect(x)) return GPUCTL_EXIT_FAIL;
  /* Write beside the target and rename at the end, so a failed download
   * never leaves a truncated model under the name asked for. */
  char tmp[PATH_MAX];
  int fd = STDOUT_FILENO;
  if (!to_stdout) {
    if (snprintf(tmp, sizeof tmp, "%s.partXXXXXX", out) >= (int)sizeof tmp) return cli_fail("%s: path too long", out);
    fd = mkstemp(tmp);
    if (fd < 0) return cli_fail("cannot write %s: %s", out, strerror(errno));
  }
  gs_err e = {0};
  uint64_t total = 0;
  int rc = gs_client_fetch(x->c, id, p->nval[1] > 0, fd, &total, &e);
  if (rc) {
    if (!to_stdout) {
      close(fd);
      unlink(tmp);
    }
    return cli_report(rc, &e);
  }
  if (!to_stdout) {
    if (fchmod(fd, 0644) < 0 || fsync(fd) < 0 || close(fd) < 0) {
      int err = errno;
      unlink(tmp);
      return cli_fail("cannot write %s: %s", out, strerror(err));
    }
    if (rename(tmp, out) < 0) {
      int err = errno;
      unlink(tmp);
      return cli_fail("cannot write %s: %s", out, strerror(err));
    }
  }
  if (x->json) {
    pbjson j = {.f = stdout};
    pbjson_open(&j, NULL, '{');
    pbjson_u64(&j, "id", id);
    pbjson_str(&j, "file", out);
    pbjson_u64(&j, "bytes", total);
    pbjson_bool(&j, "checkpoint", p->nval[1] > 0);
    pbjson_close(&j, '}');
    fputc('\n', stdout);
  } else if (!to_stdout) {
    printf("job %" PRIu64 ": %s written to %s (%s)\n", id, p->nval[1] ? "checkpoint" : "weights", out, table_fsize(total));
  }
  return GPUCTL_EXIT_OK;
}

static void memory_human(gpuctl_cli *x, const Gpushare__V1__Response *r) {
  (void)x;
  if (r->memory->timeline) cli_print_text(stdout, gs_present_timeline(r->memory->timeline));
}

int gpuctl_cmd_memory(gpuctl_cli *x, gpuctl_parsed *p) {
  GPUCTL_REQ(req, memory, MEMORY, Gpushare__V1__MemoryRequest, GPUSHARE__V1__MEMORY_REQUEST__INIT);
  if (cli_parse_job_id(x, p->pos[0], &memory_msg.id)) return GPUCTL_EXIT_USAGE;
  memory_msg.has_id = 1;
  return cli_simple(x, &req, GPUSHARE__V1__RESPONSE__RESULT_MEMORY, memory_human);
}

/* ----------------------------------------------------------------- usage --- */

static void usage_row(table *t, const char *id, const char *name, const char *vdev,
                      const Gpushare__V1__Usage *u) {
  static const Gpushare__V1__Usage zero = GPUSHARE__V1__USAGE__INIT;
  if (!u) u = &zero;
  table_cell(t, "%s", id);
  table_cell(t, "%s", name);
  table_cell(t, "%s", vdev);
  table_cell(t, "%.3f", u->device_seconds);
  table_cell(t, "%.3f", u->reserved_gib_seconds);
  table_cell(t, "%.3f", u->in_use_gib_seconds);
  table_cell(t, "%" PRIu64, u->steps);
  table_cell(t, "%" PRIu64, u->samples);
  table_cell(t, "%" PRIu32, u->preemptions);
}

static void usage_human(gpuctl_cli *x, const Gpushare__V1__Response *r) {
  (void)x;
  const Gpushare__V1__UsageResponse *m = r->usage;
  for (size_t i = 0; i < m->n_tenant; i++) {
    const Gpushare__V1__TenantUsage *tu = m->tenant[i];
    if (i) putchar('\n');
    printf("tenant %s\n", tu->tenant ? tu->tenant : "");
    table t = {0};
    table_header(&t, (1u << 3) | (1u << 4) | (1u << 5) | (1u << 6) | (1u << 7) | (1u << 8),
                 (const char *const[]){"JOB", "NAME", "VDEV", "DEVICE-S", "RESERVED-GIB-S", "IN-USE-GIB-S",
                                       "STEPS", "SAMPLES", "PREEMPTIONS", NULL});
    usage_row(&t, "total", "", "", tu->total);
    for (size_t k = 0; k < tu->n_job; k++) {
      const Gpushare__V1__JobUsage *ju = tu->job[k];
      char id[32];
      /* job 0: the vdev's reserved memory while none of the tenant's jobs ran */
      if (ju->job_id) snprintf(id, sizeof id, "%" PRIu64, ju->job_id);
      else snprintf(id, sizeof id, "idle");
      usage_row(&t, id, ju->name && *ju->name ? ju->name : "-", ju->vdev ? ju->vdev : "", ju->usage);
    }
    table_print(&t);
  }
}

int gpuctl_cmd_usage(gpuctl_cli *x, gpuctl_parsed *p) {
  GPUCTL_REQ(req, usage, USAGE, Gpushare__V1__UsageRequest, GPUSHARE__V1__USAGE_REQUEST__INIT);
  if (p->nval[0]) usage_msg.tenant = (char *)p->val[0][0];
  if (p->nval[1]) {
    if (cli_parse_date(x, "--since", p->val[1][0], &usage_msg.since_unix)) return GPUCTL_EXIT_USAGE;
    usage_msg.has_since_unix = 1;
  }
  return cli_simple(x, &req, GPUSHARE__V1__RESPONSE__RESULT_USAGE, usage_human);
}
