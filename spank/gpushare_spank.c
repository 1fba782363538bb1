/*
 * gpushare_spank.c: gpushare as the fence of a Slurm job step.
 *
 * Slurm hands out fractions of a device (gres/shard) but does not enforce
 * them; gpushared does. This SPANK plugin ties the two together:
 *
 *  - srun, sbatch and salloc take --gpushare-mem, --gpushare-compute,
 *    --gpushare-policy and --gpushare-device; a bad value is refused there,
 *    at submission, by the option's callback.
 *  - In slurmstepd (remote context, as root, before the step's tasks
 *    start: slurm_spank_init_post_opt), the step gets a vdev of its own on
 *    the node's gpushared, named slurm-JOB-STEP, owned by the tenant whose
 *    members include the job's uid (or one of its groups), and its tasks
 *    find it in $GPUSHARE_VDEV and the daemon in $GPUSHARE_SOCKET. The
 *    memory is --gpushare-mem, which the step's shards must cover (one
 *    shard = unit bytes, 1 GiB unless plugstack.conf says unit=SIZE); with
 *    no --gpushare-mem it is shards x unit. A step with neither has no vdev.
 *    A retried hook finds its vdev already there with the same settings and
 *    reuses it.
 *  - When the step ends (slurm_spank_exit) its jobs are cancelled, with a
 *    reason naming the step, and its vdev removed; the job epilog
 *    (slurm_spank_job_epilog, in slurmd) removes whatever vdev of the job a
 *    killed slurmstepd left behind.
 *
 * plugstack.conf arguments: socket=PATH (default /run/gpushared.sock),
 * unit=SIZE (default 1GiB), compute=N (the compute share of a step without
 * --gpushare-compute, default 10 percent). A step whose vdev cannot be set
 * up (the daemon unreachable, no tenant for the uid, too few shards, a
 * refusal) fails: each of its tasks prints the reason on the user's stderr
 * and exits before it runs anything (slurm_spank_task_init). The node is
 * never drained by this plugin.
 */
#include <errno.h>
#include <grp.h>
#include <inttypes.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include <slurm/slurm.h>
#include <slurm/spank.h>

#include "client/client.h"
#include "common/size.h"

SPANK_PLUGIN(gpushare, 1);

#define GSP_DEFAULT_UNIT (1ull << 30)
#define GSP_DEFAULT_COMPUTE 10 /* percent of the device for a step that names none */
#define GSP_DELETE_TRIES 600 /* 600 x 100 ms: how long a step's jobs get to stop */

static struct {
  uint64_t mem;     /* --gpushare-mem in bytes; 0 when not given */
  uint32_t compute; /* --gpushare-compute, 1..100; 0 when not given */
  int policy;       /* Gpushare__V1__Policy; 0 when not given */
  char device[32];  /* --gpushare-device; "" when not given */
  char socket[108]; /* plugstack.conf socket=, "" for the client's default */
  uint64_t unit;    /* bytes per shard */
  uint32_t compute_default; /* plugstack.conf compute=, for steps without --gpushare-compute */
  char vdev[64];    /* the vdev this step made or reused; "" when none */
  bool failed;      /* the step's vdev could not be set up: its tasks fail */
  char why[512];    /* the first error of the step's setup, for the user */
} gsp = {.unit = GSP_DEFAULT_UNIT, .compute_default = GSP_DEFAULT_COMPUTE};

/* An error of the step's setup: into slurmd's log, and kept for the
 * step's tasks, which say it on the user's stderr (slurm_spank_task_init). */
static void gsp_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void gsp_error(const char *fmt, ...) {
  char msg[sizeof gsp.why];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  slurm_error("%s", msg);
  if (!gsp.why[0]) snprintf(gsp.why, sizeof gsp.why, "%s", msg);
}

static int opt_mem(int val, const char *arg, int remote) {
  (void)val, (void)remote;
  gs_err e = {0};
  uint64_t v = 0;
  if (!arg || gs_size_parse(arg, &v, &e) < 0 || v == 0) {
    slurm_error("gpushare: --gpushare-mem: \"%s\" is not a memory size; expected a size above 0 such as "
                "256MiB, 4GiB or 1.5GB%s%s",
                arg ? arg : "", e.msg[0] ? ": " : "", e.msg);
    return -1;
  }
  gsp.mem = v;
  return 0;
}

static int opt_compute(int val, const char *arg, int remote) {
  (void)val, (void)remote;
  char *end = NULL;
  errno = 0;
  unsigned long v = arg ? strtoul(arg, &end, 10) : 0;
  if (!arg || !*arg || *end || errno || v < 1 || v > 100 || arg[0] == '-') {
    slurm_error("gpushare: --gpushare-compute: \"%s\" is not a compute share; expected a whole percent "
                "of the device, 1 to 100",
                arg ? arg : "");
    return -1;
  }
  gsp.compute = (uint32_t)v;
  return 0;
}

static int opt_policy(int val, const char *arg, int remote) {
  (void)val, (void)remote;
  if (arg && !strcasecmp(arg, "growth")) gsp.policy = GPUSHARE__V1__POLICY__GROWTH;
  else if (arg && !strcasecmp(arg, "preallocate")) gsp.policy = GPUSHARE__V1__POLICY__PREALLOCATE;
  else {
    slurm_error("gpushare: --gpushare-policy: \"%s\" is not a policy; expected growth or preallocate",
                arg ? arg : "");
    return -1;
  }
  return 0;
}

static int opt_device(int val, const char *arg, int remote) {
  (void)val, (void)remote;
  bool ok = arg && (!strcmp(arg, "cpu") || (!strncmp(arg, "gpu", 3) && arg[3] &&
                                            strspn(arg + 3, "0123456789") == strlen(arg + 3) &&
                                            strlen(arg) < sizeof gsp.device));
  if (!ok) {
    slurm_error("gpushare: --gpushare-device: \"%s\" is not a device; expected cpu or gpuN (gpu0, gpu1, ...)",
                arg ? arg : "");
    return -1;
  }
  snprintf(gsp.device, sizeof gsp.device, "%s", arg);
  return 0;
}

static struct spank_option gsp_options[] = {
    {"gpushare-mem", "SIZE", "gpushare: the step's vdev memory (e.g. 256MiB, 4GiB); the step's shards must cover it",
     1, 0, opt_mem},
    {"gpushare-compute", "N", "gpushare: the step's vdev compute share, 1 to 100 percent", 1, 0, opt_compute},
    {"gpushare-policy", "P", "gpushare: growth or preallocate", 1, 0, opt_policy},
    {"gpushare-device", "D", "gpushare: the device of the step's vdev, cpu or gpuN", 1, 0, opt_device},
    SPANK_OPTIONS_TABLE_END};

static int parse_args(int ac, char **av) {
  for (int i = 0; i < ac; i++) {
    if (!strncmp(av[i], "socket=", 7)) {
      if (strlen(av[i] + 7) >= sizeof gsp.socket || !av[i][7]) {
        slurm_error("gpushare: plugstack.conf socket=\"%s\": expected a socket path of 1 to %zu bytes",
                    av[i] + 7, sizeof gsp.socket - 1);
        return -1;
      }
      snprintf(gsp.socket, sizeof gsp.socket, "%s", av[i] + 7);
    } else if (!strncmp(av[i], "unit=", 5)) {
      gs_err e = {0};
      if (gs_size_parse(av[i] + 5, &gsp.unit, &e) < 0 || !gsp.unit) {
        slurm_error("gpushare: plugstack.conf unit=\"%s\" is not a size above 0 (e.g. 1GiB)", av[i] + 5);
        return -1;
      }
    } else if (!strncmp(av[i], "compute=", 8)) {
      char *end = NULL;
      unsigned long v = strtoul(av[i] + 8, &end, 10);
      if (!av[i][8] || *end || v < 1 || v > 100) {
        slurm_error("gpushare: plugstack.conf compute=\"%s\" is not a percent from 1 to 100", av[i] + 8);
        return -1;
      }
      gsp.compute_default = (uint32_t)v;
    } else {
      slurm_error("gpushare: plugstack.conf: unknown argument \"%s\"; expected socket=PATH, unit=SIZE or "
                  "compute=N", av[i]);
      return -1;
    }
  }
  return 0;
}

int slurm_spank_init(spank_t sp, int ac, char **av) {
  if (parse_args(ac, av)) return -1;
  spank_context_t ctx = spank_context();
  if (ctx != S_CTX_LOCAL && ctx != S_CTX_REMOTE && ctx != S_CTX_ALLOCATOR) return 0;
  for (struct spank_option *o = gsp_options; o->name; o++)
    if (spank_option_register(sp, o) != ESPANK_SUCCESS) {
      slurm_error("gpushare: cannot register option --%s", o->name);
      return -1;
    }
  return 0;
}

/* Connect to the node's gpushared, or say why not. */
static int gsp_connect(gs_client **c) {
  gs_err e = {0};
  if (gs_client_connect(gsp.socket[0] ? gsp.socket : NULL, c, &e) < 0) {
    gsp_error("gpushare: cannot reach gpushared on this node: %s", e.msg);
    return -1;
  }
  return 0;
}

/* One call; on a refusal the daemon's code in *code and its message logged
 * unless quiet. */
static int gsp_call(gs_client *c, Gpushare__V1__Request *rq, Gpushare__V1__Response **r, int *code, bool quiet) {
  gs_err e = {0};
  int rc = gs_client_call(c, rq, r, &e);
  if (code) *code = rc ? e.code : 0;
  if (rc && !quiet)
    gsp_error("gpushare: %s%s%s%s", e.msg, e.field[0] ? " (field " : "", e.field[0] ? e.field : "", e.field[0] ? ")" : "");
  return rc;
}

/* The tenant that uid (or one of its groups) belongs to; 0 or -1. */
static int find_tenant(gs_client *c, uid_t uid, gid_t gid, char *out, size_t len) {
  gid_t groups[256];
  int ng = 256;
  struct passwd *pw = getpwuid(uid);
  if (!pw || getgrouplist(pw->pw_name, gid, groups, &ng) < 0) {
    groups[0] = gid;
    ng = 1;
  }
  Gpushare__V1__Request rq = GPUSHARE__V1__REQUEST__INIT;
  Gpushare__V1__ListTenantsRequest lt = GPUSHARE__V1__LIST_TENANTS_REQUEST__INIT;
  rq.call_case = GPUSHARE__V1__REQUEST__CALL_LIST_TENANTS;
  rq.list_tenants = &lt;
  Gpushare__V1__Response *r = NULL;
  int rc = -1;
  if (gsp_call(c, &rq, &r, NULL, false)) goto out;
  for (size_t i = 0; r->list_tenants && i < r->list_tenants->n_tenant && rc; i++) {
    const Gpushare__V1__Tenant *t = r->list_tenants->tenant[i];
    bool member = false;
    for (size_t k = 0; k < t->n_uids && !member; k++) member = t->uids[k] == (uint32_t)uid;
    for (size_t k = 0; k < t->n_gids && !member; k++)
      for (int g = 0; g < ng && !member; g++) member = t->gids[k] == (uint32_t)groups[g];
    if (member && t->name) {
      snprintf(out, len, "%s", t->name);
      rc = 0;
    }
  }
  if (rc) gsp_error("gpushare: uid %u belongs to no gpushare tenant; an admin adds it with "
                      "gpuctl tenant create NAME --uid %u (or tenant set)", (unsigned)uid, (unsigned)uid);
out:
  gs_client_free_response(r);
  return rc;
}

/* The vdev named name as the daemon has it; NULL (freed with the response) when absent. */
static const Gpushare__V1__Vdev *find_vdev(gs_client *c, const char *name, Gpushare__V1__Response **r) {
  Gpushare__V1__Request rq = GPUSHARE__V1__REQUEST__INIT;
  Gpushare__V1__ListVdevsRequest lv = GPUSHARE__V1__LIST_VDEVS_REQUEST__INIT;
  rq.call_case = GPUSHARE__V1__REQUEST__CALL_LIST_VDEVS;
  rq.list_vdevs = &lv;
  if (gsp_call(c, &rq, r, NULL, false)) return NULL;
  for (size_t i = 0; (*r)->list_vdevs && i < (*r)->list_vdevs->n_vdev; i++)
    if ((*r)->list_vdevs->vdev[i]->name && !strcmp((*r)->list_vdevs->vdev[i]->name, name))
      return (*r)->list_vdevs->vdev[i];
  return NULL;
}

static void step_name(uint32_t job, uint32_t step, char *buf, size_t len) {
  if (step == SLURM_BATCH_SCRIPT) snprintf(buf, len, "slurm-%" PRIu32 "-batch", job);
  else if (step == SLURM_INTERACTIVE_STEP) snprintf(buf, len, "slurm-%" PRIu32 "-interactive", job);
  else snprintf(buf, len, "slurm-%" PRIu32 "-%" PRIu32, job, step);
}

/* Shards allocated to this step on this node (0 when none). */
static uint64_t step_shards(spank_t sp) {
  char v[32];
  if (spank_getenv(sp, "SLURM_SHARDS_ON_NODE", v, sizeof v) != ESPANK_SUCCESS) return 0;
  return strtoull(v, NULL, 10);
}

int slurm_spank_init_post_opt(spank_t sp, int ac, char **av) {
  (void)ac, (void)av;
  if (!spank_remote(sp)) return 0;
  uint32_t job = 0, step = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  if (spank_get_item(sp, S_JOB_ID, &job) != ESPANK_SUCCESS ||
      spank_get_item(sp, S_JOB_STEPID, &step) != ESPANK_SUCCESS ||
      spank_get_item(sp, S_JOB_UID, &uid) != ESPANK_SUCCESS || spank_get_item(sp, S_JOB_GID, &gid) != ESPANK_SUCCESS) {
    gsp_error("gpushare: cannot read the step's job id, step id, uid and gid");
    return -1;
  }
  if (step == SLURM_EXTERN_CONT) return 0;
  uint64_t shards = step_shards(sp);
  uint64_t mem = gsp.mem;
  if (!mem && !shards) return 0; /* not a gpushare step */
  if (!mem) mem = shards * gsp.unit;
  else if (shards * gsp.unit < mem) {
    char want[32], have[32], unit[32];
    uint64_t need = (mem + gsp.unit - 1) / gsp.unit;
    gsp_error("gpushare: --gpushare-mem=%s needs %" PRIu64 " shard%s of %s, but the step has %" PRIu64
                " (%s): ask for --gres=shard:%" PRIu64,
                gs_size_format(mem, want, sizeof want), need, need == 1 ? "" : "s",
                gs_size_format(gsp.unit, unit, sizeof unit), shards, gs_size_format(shards * gsp.unit, have, sizeof have),
                need);
    gsp.failed = true; /* said to the user by slurm_spank_task_init */
    return 0;
  }
  char name[64], tenant[128];
  step_name(job, step, name, sizeof name);
  gs_client *c = NULL;
  Gpushare__V1__Response *r = NULL, *lr = NULL;
  int rc = -1, code = 0;
  if (gsp_connect(&c)) goto out;
  if (find_tenant(c, uid, gid, tenant, sizeof tenant)) goto out;
  Gpushare__V1__Request rq = GPUSHARE__V1__REQUEST__INIT;
  Gpushare__V1__CreateVdevRequest cv = GPUSHARE__V1__CREATE_VDEV_REQUEST__INIT;
  rq.call_case = GPUSHARE__V1__REQUEST__CALL_CREATE_VDEV;
  rq.create_vdev = &cv;
  cv.name = name;
  cv.tenant = tenant;
  cv.has_memory_limit = 1;
  cv.memory_limit = mem;
  if (gsp.device[0]) cv.device = gsp.device;
  cv.has_compute_share = 1;
  cv.compute_share = gsp.compute ? gsp.compute : gsp.compute_default;
  if (gsp.policy) cv.has_policy = 1, cv.policy = gsp.policy;
  if (gsp_call(c, &rq, &r, &code, true)) {
    /* a retried hook: the vdev is there; reuse it if it is the same */
    const Gpushare__V1__Vdev *v = code == GS_ALREADY_EXISTS ? find_vdev(c, name, &lr) : NULL;
    if (!v) {
      gs_client_free_response(r);
      r = NULL;
      gsp_call(c, &rq, &r, NULL, false); /* again, to log the daemon's words */
      goto out;
    }
    bool same = v->tenant && !strcmp(v->tenant, tenant) && v->memory_limit == mem &&
                (!gsp.device[0] || (v->device && !strcmp(v->device, gsp.device))) &&
                v->compute_share == cv.compute_share && (!gsp.policy || (int)v->policy == gsp.policy);
    if (!same) {
      char have[32], want[32];
      gsp_error("gpushare: vdev %s already exists with other settings (tenant %s, %s) than this step asks "
                  "(tenant %s, %s); remove it with gpuctl vdev delete %s",
                  name, v->tenant ? v->tenant : "?", gs_size_format(v->memory_limit, have, sizeof have), tenant,
                  gs_size_format(mem, want, sizeof want), name);
      goto out;
    }
  }
  const char *sock = gs_client_socket_path(c);
  if (spank_setenv(sp, "GPUSHARE_SOCKET", sock, 1) != ESPANK_SUCCESS ||
      spank_setenv(sp, "GPUSHARE_VDEV", name, 1) != ESPANK_SUCCESS) {
    gsp_error("gpushare: cannot set GPUSHARE_SOCKET and GPUSHARE_VDEV in the step's environment");
    goto out;
  }
  snprintf(gsp.vdev, sizeof gsp.vdev, "%s", name);
  slurm_info("gpushare: step %" PRIu32 ".%" PRIu32 " runs in vdev %s of tenant %s", job, step, name, tenant);
  rc = 0;
out:
  gs_client_free_response(lr);
  gs_client_free_response(r);
  if (c) gs_client_close(c);
  /* A failure here would reach the user only as srun's "Plugin
   * initialization failed"; the step's tasks fail instead, before they run
   * anything, saying why on their stderr (slurm_spank_task_init). */
  if (rc) gsp.failed = true;
  return 0;
}

/* In each task of the step, after its stdio is the user's and before it
 * runs anything: a step whose vdev could not be set up ends here, with the
 * reason where the user sees it. */
int slurm_spank_task_init(spank_t sp, int ac, char **av) {
  (void)ac, (void)av;
  if (!spank_remote(sp) || !gsp.failed) return 0;
  fprintf(stderr, "%s\n", gsp.why[0] ? gsp.why : "gpushare: the step's vdev could not be set up (slurmd's log says why)");
  fflush(stderr);
  return -1;
}

static bool job_final(int s) {
  return s == GPUSHARE__V1__JOB_STATE__SUCCEEDED || s == GPUSHARE__V1__JOB_STATE__FAILED ||
         s == GPUSHARE__V1__JOB_STATE__CANCELLED;
}

/* Cancel the jobs of every vdev that matches (name exactly, or the prefix
 * when prefix is set), then delete those vdevs, waiting for cancelled jobs
 * to stop. 0 or -1. */
static int remove_vdevs(const char *match, bool prefix, const char *why) {
  gs_client *c = NULL;
  if (gsp_connect(&c)) return -1;
  int rc = -1;
  Gpushare__V1__Response *r = NULL;
  Gpushare__V1__Request rq = GPUSHARE__V1__REQUEST__INIT;
  Gpushare__V1__ListJobsRequest lj = GPUSHARE__V1__LIST_JOBS_REQUEST__INIT;
  lj.has_all = 1, lj.all = 1;
  rq.call_case = GPUSHARE__V1__REQUEST__CALL_LIST_JOBS;
  rq.list_jobs = &lj;
  if (gsp_call(c, &rq, &r, NULL, false)) goto out;
  for (size_t i = 0; r->list_jobs && i < r->list_jobs->n_job; i++) {
    const Gpushare__V1__Job *j = r->list_jobs->job[i];
    if (!j->vdev || job_final(j->state)) continue;
    if (prefix ? strncmp(j->vdev, match, strlen(match)) : strcmp(j->vdev, match)) continue;
    Gpushare__V1__Request cq = GPUSHARE__V1__REQUEST__INIT;
    Gpushare__V1__CancelRequest cr = GPUSHARE__V1__CANCEL_REQUEST__INIT;
    cr.has_id = 1, cr.id = j->id;
    cr.reason = (char *)why;
    cq.call_case = GPUSHARE__V1__REQUEST__CALL_CANCEL;
    cq.cancel = &cr;
    Gpushare__V1__Response *cresp = NULL;
    gsp_call(c, &cq, &cresp, NULL, true); /* one that ended meanwhile is fine */
    gs_client_free_response(cresp);
  }
  gs_client_free_response(r);
  r = NULL;
  /* the vdevs to delete */
  Gpushare__V1__Request vq = GPUSHARE__V1__REQUEST__INIT;
  Gpushare__V1__ListVdevsRequest lv = GPUSHARE__V1__LIST_VDEVS_REQUEST__INIT;
  vq.call_case = GPUSHARE__V1__REQUEST__CALL_LIST_VDEVS;
  vq.list_vdevs = &lv;
  if (gsp_call(c, &vq, &r, NULL, false)) goto out;
  rc = 0;
  for (size_t i = 0; r->list_vdevs && i < r->list_vdevs->n_vdev; i++) {
    const char *n = r->list_vdevs->vdev[i]->name;
    if (!n || (prefix ? strncmp(n, match, strlen(match)) : strcmp(n, match))) continue;
    Gpushare__V1__Request dq = GPUSHARE__V1__REQUEST__INIT;
    Gpushare__V1__DeleteVdevRequest dv = GPUSHARE__V1__DELETE_VDEV_REQUEST__INIT;
    dv.name = (char *)n;
    dq.call_case = GPUSHARE__V1__REQUEST__CALL_DELETE_VDEV;
    dq.delete_vdev = &dv;
    int code = 0, tries = 0;
    for (;;) {
      Gpushare__V1__Response *dr = NULL;
      int drc = gsp_call(c, &dq, &dr, &code, true);
      gs_client_free_response(dr);
      if (!drc || code == GS_NOT_FOUND) break;
      /* its cancelled jobs are still stopping */
      if (code != GS_FAILED_PRECONDITION || ++tries >= GSP_DELETE_TRIES) {
        gsp_call(c, &dq, &dr, NULL, false);
        gs_client_free_response(dr);
        rc = -1;
        break;
      }
      struct timespec ts = {0, 100 * 1000 * 1000};
      nanosleep(&ts, NULL);
    }
    if (!rc) slurm_info("gpushare: removed vdev %s (%s)", n, why);
  }
out:
  gs_client_free_response(r);
  gs_client_close(c);
  return rc;
}

int slurm_spank_exit(spank_t sp, int ac, char **av) {
  (void)ac, (void)av;
  if (!spank_remote(sp) || !gsp.vdev[0]) return 0;
  uint32_t job = 0, step = 0;
  spank_get_item(sp, S_JOB_ID, &job);
  spank_get_item(sp, S_JOB_STEPID, &step);
  char why[128];
  snprintf(why, sizeof why, "Slurm step %s ended", gsp.vdev + 6);
  /* Failing here would not bring the daemon back, and Slurm would count it
   * against the node: the job epilog tries again. */
  if (remove_vdevs(gsp.vdev, false, why) < 0)
    gsp_error("gpushare: the vdev %s of the ended step is left to the job's epilog", gsp.vdev);
  gsp.vdev[0] = 0;
  return 0;
}

/* The job epilog, in slurmd as root: whatever vdev of this job a killed
 * step left behind. It never fails: Slurm drains a node whose epilog
 * fails, and a gpushared out of reach (or a vdev it would not delete) is
 * no reason to take the node from every other job; what is left is logged
 * by name, for `gpuctl vdev delete`. */
int slurm_spank_job_epilog(spank_t sp, int ac, char **av) {
  if (parse_args(ac, av)) return 0;
  uint32_t job = 0;
  if (spank_get_item(sp, S_JOB_ID, &job) != ESPANK_SUCCESS) return 0;
  char prefix[64], why[96];
  snprintf(prefix, sizeof prefix, "slurm-%" PRIu32 "-", job);
  snprintf(why, sizeof why, "Slurm job %" PRIu32 " ended (epilog)", job);
  if (remove_vdevs(prefix, true, why) < 0)
    gsp_error("gpushare: the vdevs of Slurm job %" PRIu32 " (%s*) are left in gpushared: "
              "gpuctl vdev delete them once it answers", job, prefix);
  return 0;
}
