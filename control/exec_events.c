/*
 * exec_events.c: the executors' side of the job layer (see exec_events.h).
 *
 * The supervisor calls on_ready, on_message and on_died; each changes jobs
 * through job.c's state machine and runs the queues again where a slot may
 * have opened. Running the queues gathers the scheduler's inputs (jobs,
 * vdevs from the store, whether each vdev's executor is up, the tenants'
 * max_running), asks sched.c, and sends a StartJob for each job it starts.
 */
#include "control/exec_events.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/size.h"
#include "control/admit.h"
#include "control/datasets.h"
#include "control/log.h"
#include "control/sched.h"
#include "control/store.h"
#include "control/supervisor.h"
#include "control/usage.h"

/* An epoch end is stored and logged at most once a second (the ones between
 * are stored with the next write): a job of tiny epochs ends hundreds a
 * second, and storing each, with its fsync and a record that grows with
 * every epoch, stalled the loop for half a minute (test_limits saw it). */
#define GS_EPOCH_SAVE_MS 1000

/* Why a job was paused (gs_job.pause_kind). */
enum {
  PAUSE_PREEMPT = 1, /* for a higher-priority job: PREEMPTED, resumes when it fits */
  PAUSE_REPLAN,      /* its vdev shrank, auto_fit: resumes at once, smaller micro-batch */
  PAUSE_REQUEUE,     /* its vdev shrank, no auto_fit: PREEMPTED, resumes when it fits */
};

typedef struct vdev_live {
  char name[GS_NAME_MAX + 1];
  gs_vdev_live v;
} vdev_live;

struct gs_execs {
  gs_executor *exec[GS_DEVICES_MAX];
  bool exec_gone[GS_DEVICES_MAX];
  vdev_live *live;         /* per vdev, from executor Stats */
  size_t n_live;
  bool shutting_down;
};

static gs_executor *exec_of(const gs_daemon *d, size_t dev) {
  return d->execs && dev < GS_DEVICES_MAX ? d->execs->exec[dev] : NULL;
}

/* ------------------------------------------------------------ placement --- */

static size_t device_of_vdev(gs_daemon *d, const char *device) {
  for (size_t i = 0; i < d->devices.n; i++)
    if (strcmp(d->devices.dev[i].name, device) == 0) return i;
  return SIZE_MAX;
}

static void exec_send_start(gs_daemon *d, gs_job *j, size_t dev, bool resume) {
  gs_err e;
  gs_err_clear(&e);
  const Gpushare__V1__Job *r = j->rec;
  char ti[PATH_MAX], tl[PATH_MAX], vi[PATH_MAX], vl[PATH_MAX], ck[PATH_MAX], ex[PATH_MAX], dir[PATH_MAX];
  if (gs_datasets_resolve_set(d, r->tenant, r->spec->train, "spec.train", ti, tl, sizeof ti, &e) < 0 ||
      gs_datasets_resolve_set(d, r->tenant, r->spec->test, "spec.test", vi, vl, sizeof vi, &e) < 0) {
    gs_job_transition(d, j, GPUSHARE__V1__JOB_STATE__FAILED, e.msg);
    return;
  }
  gs_job_dir(d, r->id, dir, sizeof dir);
  mkdir(dir, 0750);
  gs_job_file(d, r->id, "checkpoint.ckpt", ck, sizeof ck);
  gs_job_file(d, r->id, "model.safetensors", ex, sizeof ex);
  /* The spec runs with the micro-batch and accumulation admission chose. */
  Gpushare__V1__JobSpec spec = *r->spec;
  spec.has_batch_size = spec.has_accumulation_steps = 1;
  spec.batch_size = r->micro_batch;
  spec.accumulation_steps = r->accumulation_steps;
  Gpushare__Exec__V1__StartJob s = GPUSHARE__EXEC__V1__START_JOB__INIT;
  s.has_job_id = s.has_resume = s.has_threads = 1;
  s.job_id = r->id;
  s.vdev = r->vdev;
  s.spec = &spec;
  s.train_images = ti;
  s.train_labels = tl;
  s.test_images = vi;
  s.test_labels = vl;
  s.checkpoint_path = ck;
  s.resume = resume;
  s.export_path = ex;
  s.threads = d->devices.dev[dev].threads;
  Gpushare__Exec__V1__ToExecutor m = GPUSHARE__EXEC__V1__TO_EXECUTOR__INIT;
  m.msg_case = GPUSHARE__EXEC__V1__TO_EXECUTOR__MSG_START;
  m.start = &s;
  if (gs_supervisor_send(d->execs->exec[dev], &m) < 0) {
    j->resume_pending = true; /* sent again once the executor is back */
    return;
  }
  j->placed = (int)dev;
  j->resume_pending = false;
  j->mem_known = false; /* until this run reports */
}

/* An event that is not a state change, into the job's log and to its watchers. */
static void note_event(gs_daemon *d, gs_job *j, const char *msg) {
  Gpushare__V1__JobEvent ev;
  gs_job_state_event(j, &ev, msg);
  gs_job_log_event(d, j, &ev);
  gs_job_publish(d, j, &ev, false);
}

/* Ask j's executor to stop it at its next step boundary with a checkpoint. */
static void pause_job(gs_daemon *d, gs_job *j, int kind, const char *why) {
  if (j->placed < 0 || j->pausing) return;
  Gpushare__Exec__V1__PauseJob pj = GPUSHARE__EXEC__V1__PAUSE_JOB__INIT;
  pj.has_job_id = 1;
  pj.job_id = j->rec->id;
  pj.reason = (char *)why;
  Gpushare__Exec__V1__ToExecutor m = GPUSHARE__EXEC__V1__TO_EXECUTOR__INIT;
  m.msg_case = GPUSHARE__EXEC__V1__TO_EXECUTOR__MSG_PAUSE;
  m.pause = &pj;
  if (gs_supervisor_send(exec_of(d, (size_t)j->placed), &m) < 0) return;
  j->pausing = true;
  j->pause_kind = kind;
  gs_info("job %" PRIu64 ": %s", j->rec->id, why);
  char msg[600];
  snprintf(msg, sizeof msg, "%s; stopping at its next step boundary", why);
  note_event(d, j, msg);
}

/* The scheduler chose j to make room for `by`. */
static void preempt(gs_daemon *d, gs_job *j, const gs_job *by) {
  if (!j || !by) return;
  char why[512], peak[32];
  snprintf(why, sizeof why,
           "preempted by job %" PRIu64 " (%s, priority %" PRId32 " over its %" PRId32
           "), which needs %s of vdev %s",
           by->rec->id, by->rec->name ? by->rec->name : "", by->rec->priority, j->rec->priority,
           gs_size_format(by->rec->planned_peak_bytes, peak, sizeof peak), j->rec->vdev);
  pause_job(d, j, PAUSE_PREEMPT, why);
}

static bool vdev_ready(gs_daemon *d, const gs_vdev *v, size_t *dev) {
  *dev = device_of_vdev(d, v->device);
  gs_executor *x = *dev == SIZE_MAX ? NULL : exec_of(d, *dev);
  return x && gs_supervisor_ready(x);
}

/* A GROWTH vdev's first region (runtime/alloc.c): what a job's regions
 * can pass twice its peak by. */
#define GS_GROWTH_FIRST_REGION ((uint64_t)2 << 20)

/* What j's vdev may reserve from its device for it (gs_sched_job). */
static uint64_t device_bytes(const gs_job *j, const gs_vdev *vdevs, size_t nv) {
  for (size_t v = 0; v < nv; v++) {
    if (strcmp(vdevs[v].name, j->rec->vdev)) continue;
    if (!vdevs[v].policy) return 0; /* PREALLOCATE: its region is held anyway */
    uint64_t peak = j->rec->planned_peak_bytes, twice = peak > UINT64_MAX / 2 ? UINT64_MAX : 2 * peak;
    twice = twice > UINT64_MAX - GS_GROWTH_FIRST_REGION ? UINT64_MAX : twice + GS_GROWTH_FIRST_REGION;
    return twice < vdevs[v].memory_limit ? twice : vdevs[v].memory_limit;
  }
  return 0;
}

/* One pass: resume the RUNNING jobs that wait for their (ready) executor,
 * then start what the scheduler starts. Returns how many jobs failed on
 * the way (a dataset gone): the scheduler then runs again without them,
 * as a job that fails frees its tenant's running slot. */
static int schedule_pass(gs_daemon *d, gs_vdev *vdevs, size_t nv) {
  gs_jobs *J = d->jobs;
  int failed = 0;
  for (size_t v = 0; v < nv; v++) {
    size_t dev;
    if (!vdev_ready(d, &vdevs[v], &dev)) continue;
    for (uint64_t i = 0; i < J->cap; i++) {
      gs_job *j = J->by_id[i];
      if (j && j->resume_pending && j->rec->state == GPUSHARE__V1__JOB_STATE__RUNNING &&
          !strcmp(j->rec->vdev, vdevs[v].name))
        exec_send_start(d, j, dev, true);
    }
  }
  gs_err e;
  gs_err_clear(&e);
  gs_sched_job *jobs = calloc(J->cap + 1, sizeof *jobs);
  gs_sched_vdev *sv = calloc(nv + 1, sizeof *sv);
  gs_sched_decision *out = calloc(J->cap + 1, sizeof *out);
  gs_tenant *tenants = NULL;
  size_t nt = 0, nj = 0, n_out = 0;
  gs_sched_quota *quotas = NULL;
  const char **vdev_dev = NULL;
  if (!jobs || !sv || !out) goto done;
  if (gs_store_tenant_list(d->store, &tenants, &nt, &e) < 0) {
    gs_error("scheduler: %s", e.msg);
    goto done;
  }
  quotas = calloc(nt + 1, sizeof *quotas);
  if (!quotas) goto done;
  for (size_t i = 0; i < nt; i++)
    quotas[i] = (gs_sched_quota){tenants[i].name, tenants[i].quota.max_running};
  gs_sched_device devs[GS_DEVICES_MAX];
  for (size_t i = 0; i < d->devices.n && i < GS_DEVICES_MAX; i++) {
    devs[i] = (gs_sched_device){d->devices.dev[i].name, d->devices.dev[i].usable, 0};
    for (size_t v = 0; v < nv; v++)
      if (!vdevs[v].policy && !strcmp(vdevs[v].device, devs[i].name))
        devs[i].fixed += vdevs[v].memory_limit;
  }
  vdev_dev = calloc(nv + 1, sizeof *vdev_dev);
  if (!vdev_dev) goto done;
  for (size_t v = 0; v < nv; v++) {
    size_t dev;
    sv[v] = (gs_sched_vdev){vdevs[v].name, vdevs[v].memory_limit, vdev_ready(d, &vdevs[v], &dev),
                            gs_device_data_in_memory(vdevs[v].device)};
    vdev_dev[v] = vdevs[v].device;
  }
  uint64_t now_ms = gs_job_now_ms();
  for (uint64_t i = 0; i < J->cap; i++) {
    gs_job *j = J->by_id[i];
    if (!j || (!gs_job_waiting(j->rec->state) && j->rec->state != GPUSHARE__V1__JOB_STATE__RUNNING))
      continue;
    if (gs_job_waiting(j->rec->state) && j->retry_after_ms > now_ms) continue; /* backing off */
    jobs[nj++] = (gs_sched_job){
        .id = j->rec->id,
        .tenant = j->rec->tenant,
        .vdev = j->rec->vdev ? j->rec->vdev : "",
        .state = j->rec->state == GPUSHARE__V1__JOB_STATE__RUNNING ? GS_SCHED_RUNNING
                                                                   : GS_SCHED_QUEUED,
        .priority = j->rec->priority,
        .submitted = j->rec->submitted_unix,
        .planned_peak = j->rec->planned_peak_bytes,
        .data_bytes = j->rec->data_bytes,
        .data_key = j->data_key,
        .preemptible = j->rec->spec->preemptible,
        .run_started = j->rec->run_started_unix,
        .last_preempted = j->rec->last_preempted_unix,
        .stopping = j->pausing,
        .physical_wait = gs_job_waiting(j->rec->state) && j->rec->resume && j->rec->oom &&
                         j->rec->oom->cause == GPUSHARE__V1__OOM_CAUSE__PHYSICAL,
        .device_bytes = device_bytes(j, vdevs, nv)};
  }
  gs_sched_input in = {jobs,
                       nj,
                       sv,
                       nv,
                       quotas,
                       nt,
                       (int64_t)(now_ms / 1000),
                       d->cfg.preempt_min_run_s,
                       d->cfg.preempt_interval_s,
                       devs,
                       d->devices.n < GS_DEVICES_MAX ? d->devices.n : GS_DEVICES_MAX,
                       vdev_dev};
  if (gs_sched_run(&in, out, &n_out, &e) < 0) {
    gs_error("scheduler: %s", e.msg);
    goto done;
  }
  for (size_t k = 0; k < n_out; k++) {
    gs_job *j = gs_job_get(d, out[k].job);
    if (!j) continue;
    if (out[k].why == GS_SCHED_PREEMPT) {
      preempt(d, j, gs_job_get(d, out[k].for_job));
      continue;
    }
    if (out[k].why != GS_SCHED_START) {
      gs_debug("job %" PRIu64 " %s", out[k].job, gs_sched_reason_text(out[k].why));
      continue;
    }
    const gs_vdev *v = NULL;
    for (size_t x = 0; x < nv && !v; x++)
      if (!strcmp(vdevs[x].name, out[k].vdev)) v = &vdevs[x];
    size_t dev = device_of_vdev(d, v->device);
    gs_job_set_str(&j->rec->device, v->device);
    bool resume = j->rec->resume; /* preempted or requeued: from its checkpoint */
    j->rec->has_resume = 1;
    j->rec->resume = 0;
    char ck[PATH_MAX];
    struct stat st;
    gs_job_file(d, j->rec->id, "checkpoint.ckpt", ck, sizeof ck);
    gs_job_transition(d, j, GPUSHARE__V1__JOB_STATE__RUNNING,
                      !resume                ? NULL
                      : stat(ck, &st) == 0 ? "resuming from its checkpoint"
                                           : "starting again from its first step (it had "
                                             "not written a checkpoint yet)");
    exec_send_start(d, j, dev, resume);
    if (gs_job_final(j->rec->state)) failed++;
  }
done:
  free(vdev_dev);
  free(quotas);
  gs_tenant_list_free(tenants, nt);
  free(out);
  free(sv);
  free(jobs);
  return failed;
}

void gs_exec_events_schedule(gs_daemon *d) {
  if (!d->jobs || (d->execs && d->execs->shutting_down)) return;
  gs_err e;
  gs_err_clear(&e);
  gs_vdev *vdevs;
  size_t nv;
  if (gs_store_vdev_list(d->store, &vdevs, &nv, &e) < 0) {
    gs_error("scheduler: %s", e.msg);
    return;
  }
  while (schedule_pass(d, vdevs, nv) > 0) {
  }
  free(vdevs);
}

static void send_vdevs(gs_daemon *d, size_t dev) {
  gs_err e;
  gs_err_clear(&e);
  gs_vdev *vdevs;
  size_t nv;
  if (gs_store_vdev_list(d->store, &vdevs, &nv, &e) < 0) return;
  Gpushare__Exec__V1__VdevConfig *cfg = calloc(nv + 1, sizeof *cfg);
  Gpushare__Exec__V1__VdevConfig **ptr = calloc(nv + 1, sizeof *ptr);
  Gpushare__Exec__V1__SetVdevs sv = GPUSHARE__EXEC__V1__SET_VDEVS__INIT;
  for (size_t i = 0; cfg && ptr && i < nv; i++) {
    if (strcmp(vdevs[i].device, d->devices.dev[dev].name) != 0) continue;
    Gpushare__Exec__V1__VdevConfig c = GPUSHARE__EXEC__V1__VDEV_CONFIG__INIT;
    c.name = vdevs[i].name;
    c.has_memory_limit = c.has_compute_share = c.has_policy = 1;
    c.memory_limit = vdevs[i].memory_limit;
    c.compute_share = vdevs[i].compute_share;
    c.policy = vdevs[i].policy ? GPUSHARE__V1__POLICY__GROWTH : GPUSHARE__V1__POLICY__PREALLOCATE;
    cfg[sv.n_vdev] = c;
    ptr[sv.n_vdev] = &cfg[sv.n_vdev];
    sv.n_vdev++;
  }
  sv.vdev = ptr;
  Gpushare__Exec__V1__ToExecutor m = GPUSHARE__EXEC__V1__TO_EXECUTOR__INIT;
  m.msg_case = GPUSHARE__EXEC__V1__TO_EXECUTOR__MSG_SET_VDEVS;
  m.set_vdevs = &sv;
  if (cfg && ptr) gs_supervisor_send(d->execs->exec[dev], &m);
  free(cfg);
  free(ptr);
  free(vdevs);
}

void gs_exec_events_vdevs_changed(gs_daemon *d) {
  if (!d->execs) return;
  for (size_t i = 0; i < d->devices.n; i++)
    if (d->execs->exec[i] && gs_supervisor_ready(d->execs->exec[i])) send_vdevs(d, i);
  gs_exec_events_schedule(d);
}

void gs_exec_events_cancel(gs_daemon *d, gs_job *j, const char *who) {
  if (j->placed >= 0) {
    j->cancel_requested = true;
    /* Stored before the answer: a cancel acknowledged is a cancel kept,
     * even when the daemon dies before the executor stops the job
     * (gs_jobs_load ends such a job CANCELLED; test_faults). */
    j->rec->has_cancel_requested = j->rec->cancel_requested = 1;
    gs_job_set_str(&j->rec->reason, who);
    gs_job_persist(d, j);
    Gpushare__Exec__V1__CancelJob cj = GPUSHARE__EXEC__V1__CANCEL_JOB__INIT;
    cj.has_job_id = 1;
    cj.job_id = j->rec->id;
    Gpushare__Exec__V1__ToExecutor m = GPUSHARE__EXEC__V1__TO_EXECUTOR__INIT;
    m.msg_case = GPUSHARE__EXEC__V1__TO_EXECUTOR__MSG_CANCEL;
    m.cancel = &cj;
    if (gs_supervisor_send(exec_of(d, (size_t)j->placed), &m) < 0) {
      gs_job_transition(d, j, GPUSHARE__V1__JOB_STATE__CANCELLED, who);
      gs_exec_events_schedule(d);
    } else {
      gs_job_set_str(&j->rec->reason, who);
    }
  } else {
    gs_job_transition(d, j, GPUSHARE__V1__JOB_STATE__CANCELLED, who);
    gs_exec_events_schedule(d);
  }
}

void gs_exec_events_tick(gs_daemon *d) {
  gs_jobs *J = d->jobs;
  if (!J) return;
  uint64_t now = gs_job_now_ms();
  bool due = false;
  for (uint64_t i = 0; i < J->cap; i++) {
    gs_job *j = J->by_id[i];
    if (j && j->retry_after_ms && j->retry_after_ms <= now) {
      j->retry_after_ms = 0;
      due = true;
    }
  }
  if (due) gs_exec_events_schedule(d);
}

/* ---------------------------------------------------------------- resize --- */

static bool runs_in(const gs_job *j, const char *vdev) {
  return j && j->rec->state == GPUSHARE__V1__JOB_STATE__RUNNING && !strcmp(j->rec->vdev, vdev);
}

int gs_exec_events_least_memory(gs_daemon *d, const gs_vdev *v, uint64_t *least, gs_err *e) {
  gs_jobs *J = d->jobs;
  bool in_memory = gs_device_data_in_memory(v->device);
  *least = 0;
  for (uint64_t i = 0; J && i < J->cap; i++) {
    gs_job *j = J->by_id[i];
    if (!runs_in(j, v->name)) continue;
    uint64_t peak;
    if (gs_admit_least_peak(&d->devices, v->device, j->rec->spec, j->rec->micro_batch, j->rec->accumulation_steps, &peak,
                            e) < 0)
      return gs_err_rc(e);
    *least += peak + (in_memory ? j->rec->data_bytes : 0);
  }
  return 0;
}

static void action_add(char ***actions, size_t *n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void action_add(char ***actions, size_t *n, const char *fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  gs_info("%s", buf);
  char **p = realloc(*actions, (*n + 1) * sizeof *p);
  if (!p) return;
  *actions = p;
  if ((p[*n] = strdup(buf))) (*n)++;
}

void gs_exec_events_vdev_resized(gs_daemon *d, const gs_vdev *old, const gs_vdev *nv,
                                 char ***actions, size_t *n_actions) {
  gs_jobs *J = d->jobs;
  *actions = NULL;
  *n_actions = 0;
  size_t n = 0;
  for (uint64_t i = 0; J && i < J->cap; i++) n += runs_in(J->by_id[i], nv->name);
  gs_sched_job *sj = n ? calloc(n, sizeof *sj) : NULL;
  gs_job **jj = n ? calloc(n, sizeof *jj) : NULL;
  bool *keep = n ? calloc(n, sizeof *keep) : NULL;
  gs_err e;
  gs_err_clear(&e);
  char was[32], now[32];
  gs_size_format(old->memory_limit, was, sizeof was);
  gs_size_format(nv->memory_limit, now, sizeof now);
  if (n && sj && jj && keep && nv->memory_limit < old->memory_limit) {
    size_t k = 0;
    for (uint64_t i = 0; i < J->cap; i++) {
      gs_job *j = J->by_id[i];
      if (!runs_in(j, nv->name)) continue;
      jj[k] = j;
      sj[k++] = (gs_sched_job){.id = j->rec->id,
                               .tenant = j->rec->tenant,
                               .vdev = j->rec->vdev,
                               .state = GS_SCHED_RUNNING,
                               .priority = j->rec->priority,
                               .planned_peak = j->pausing && j->pause_kind == PAUSE_REPLAN
                                                   ? j->replan_peak
                                                   : j->rec->planned_peak_bytes,
                               .data_bytes = j->rec->data_bytes,
                               .data_key = j->data_key,
                               .run_started = j->rec->run_started_unix};
    }
    gs_sched_vdev sv = {nv->name, nv->memory_limit, true, gs_device_data_in_memory(nv->device)};
    if (gs_sched_shrink(sj, n, &sv, keep, &e) == 0) {
      /* What the kept jobs leave is where the re-planned ones must fit. */
      uint64_t room = nv->memory_limit;
      for (size_t k2 = 0; k2 < n; k2++) {
        if (!keep[k2]) continue;
        uint64_t held = sj[k2].planned_peak + (sv.data_in_memory ? sj[k2].data_bytes : 0);
        room = held < room ? room - held : 0;
      }
      for (size_t k2 = 0; k2 < n; k2++) {
        gs_job *j = jj[k2];
        if (keep[k2] || j->pausing) continue;
        const Gpushare__V1__Job *r = j->rec;
        char why[600], need[32];
        gs_size_format(r->planned_peak_bytes, need, sizeof need);
        gs_admit a;
        memset(&a, 0, sizeof a);
        uint64_t data = sv.data_in_memory ? r->data_bytes : 0;
        if (r->spec->has_auto_fit && r->spec->auto_fit &&
            gs_admit_replan(&d->devices, r->spec, nv, room, r->data_bytes, r->micro_batch,
                            r->accumulation_steps, false, &a, &e) == 0 &&
            a.fits) {
          j->replan_micro = a.micro_batch;
          j->replan_accum = a.accumulation_steps;
          j->replan_peak = a.peak_bytes;
          room -= a.peak_bytes + data < room ? a.peak_bytes + data : room;
          snprintf(why, sizeof why,
                   "vdev %s shrunk from %s to %s: its plan at micro-batch %" PRIu32
                   " (%s, and its data) no longer fits there beside the vdev's other jobs",
                   nv->name, was, now, r->micro_batch, need);
          pause_job(d, j, PAUSE_REPLAN, why);
          action_add(actions, n_actions,
                     "job %" PRIu64 ": re-planned from micro-batch %" PRIu32 " x %" PRIu32
                     " to %" PRIu32 " x %" PRIu32 " (auto_fit); it resumes from a checkpoint "
                     "at its next step boundary",
                     r->id, r->micro_batch, r->accumulation_steps, a.micro_batch,
                     a.accumulation_steps);
        } else {
          snprintf(why, sizeof why,
                   "vdev %s shrunk from %s to %s: its plan (%s at micro-batch %" PRIu32
                   ", and its data) no longer fits there beside the vdev's other jobs%s",
                   nv->name, was, now, need, r->micro_batch,
                   r->spec->has_auto_fit && r->spec->auto_fit
                       ? ", even at a smaller micro-batch"
                       : " and the job has no auto_fit");
          pause_job(d, j, PAUSE_REQUEUE, why);
          action_add(actions, n_actions,
                     "job %" PRIu64 ": checkpointed and requeued PREEMPTED (%s); it resumes "
                     "when it fits",
                     r->id,
                     r->spec->has_auto_fit && r->spec->auto_fit ? "no smaller micro-batch fits"
                                                                : "no auto_fit");
        }
      }
    } else {
      gs_error("resize of vdev %s: %s", nv->name, e.msg);
    }
  }
  free(sj);
  free(jj);
  free(keep);
  /* Waiting jobs that no longer fit the vdev even alone: re-planned now
   * (auto_fit), or told. */
  bool in_memory = gs_device_data_in_memory(nv->device);
  for (uint64_t i = 0; J && nv->memory_limit < old->memory_limit && i < J->cap; i++) {
    gs_job *j = J->by_id[i];
    if (!j || !gs_job_waiting(j->rec->state) || strcmp(j->rec->vdev, nv->name)) continue;
    Gpushare__V1__Job *r = j->rec;
    uint64_t data = in_memory ? r->data_bytes : 0;
    if (r->planned_peak_bytes <= nv->memory_limit && data <= nv->memory_limit - r->planned_peak_bytes)
      continue;
    gs_admit a;
    if (r->spec->has_auto_fit && r->spec->auto_fit &&
        gs_admit_replan(&d->devices, r->spec, nv, nv->memory_limit, r->data_bytes, r->micro_batch,
                        r->accumulation_steps, false, &a, &e) == 0 &&
        a.fits) {
      action_add(actions, n_actions,
                 "job %" PRIu64 " (%s): re-planned from micro-batch %" PRIu32 " x %" PRIu32
                 " to %" PRIu32 " x %" PRIu32 " (auto_fit)",
                 r->id, gs_job_state_name(r->state), r->micro_batch, r->accumulation_steps,
                 a.micro_batch, a.accumulation_steps);
      r->micro_batch = a.micro_batch;
      r->accumulation_steps = a.accumulation_steps;
      r->planned_peak_bytes = a.peak_bytes;
      gs_job_persist(d, j);
    } else {
      action_add(actions, n_actions,
                 "job %" PRIu64 " (%s): its plan no longer fits the vdev even alone; it waits "
                 "until the vdev grows (or cancel it)",
                 r->id, gs_job_state_name(r->state));
    }
  }
  gs_exec_events_vdevs_changed(d);
}

/* ------------------------------------------------------ executor events --- */

static void on_ready(gs_daemon *d, gs_executor *x) {
  send_vdevs(d, gs_supervisor_device_index(x));
  gs_exec_events_schedule(d);
}

static vdev_live *live_of(gs_daemon *d, const char *name) {
  gs_execs *X = d->execs;
  for (size_t i = 0; i < X->n_live; i++)
    if (strcmp(X->live[i].name, name) == 0) return &X->live[i];
  vdev_live *p = realloc(X->live, (X->n_live + 1) * sizeof *p);
  if (!p) return NULL;
  X->live = p;
  memset(&p[X->n_live], 0, sizeof *p);
  snprintf(p[X->n_live].name, sizeof p[X->n_live].name, "%s", name);
  return &p[X->n_live++];
}

static void on_progress(gs_daemon *d, const Gpushare__Exec__V1__Progress *p) {
  gs_job *j = gs_job_get(d, p->job_id);
  if (!j || !p->event || gs_job_final(j->rec->state)) return;
  gs_usage_progress(d, p);
  const Gpushare__V1__JobEvent *ev = p->event;
  Gpushare__V1__Job *r = j->rec;
  if (p->has_device_bytes && p->has_host_bytes && p->has_host_data_bytes) {
    j->mem_known = true;
    j->mem_device = p->device_bytes;
    j->mem_host = p->host_bytes;
    j->mem_host_data = p->host_data_bytes;
  }
  if (ev->has_step) {
    r->has_step = 1;
    r->step = ev->step;
  }
  if (ev->has_total_steps) {
    r->has_total_steps = 1;
    r->total_steps = ev->total_steps;
  }
  Gpushare__V1__JobEvent out = *ev;
  out.has_job_id = out.has_state = 1;
  out.job_id = r->id;
  out.state = GPUSHARE__V1__JOB_STATE__RUNNING;
  if (ev->epoch_end) {
    /* An epoch ended: it becomes part of the record and the job's log. */
    gs_job_append_epoch(j, ev->epoch_end);
    uint64_t now = uv_now(d->loop);
    if (!j->epoch_saved_ms || now - j->epoch_saved_ms >= GS_EPOCH_SAVE_MS) {
      j->epoch_saved_ms = now;
      gs_job_persist(d, j);
      gs_job_log_event(d, j, &out);
    }
  }
  gs_job_publish(d, j, &out, false);
}

static const char *oom_cause_name(int c) {
  return c == GPUSHARE__V1__OOM_CAUSE__PHYSICAL        ? "PHYSICAL"
         : c == GPUSHARE__V1__OOM_CAUSE__FRAGMENTATION ? "FRAGMENTATION"
                                                       : "QUOTA";
}

/* A paused job (PauseJob) reported its stop: re-planned ones resume at
 * once with their new micro-batch, the others wait PREEMPTED. */
static void on_paused(gs_daemon *d, gs_job *j, const Gpushare__Exec__V1__Finished *f, int kind) {
  Gpushare__V1__Job *r = j->rec;
  const char *why = f->reason && *f->reason ? f->reason : "paused";
  if (kind == PAUSE_REPLAN) {
    char msg[1400], peak[32];
    snprintf(msg, sizeof msg,
             "%s; resuming with micro-batch %" PRIu32 " x %" PRIu32
             " accumulation step%s (effective batch %" PRIu64 " kept), planned peak %s",
             why, j->replan_micro, j->replan_accum, j->replan_accum == 1 ? "" : "s",
             (uint64_t)j->replan_micro * j->replan_accum,
             gs_size_format(j->replan_peak, peak, sizeof peak));
    r->micro_batch = j->replan_micro;
    r->accumulation_steps = j->replan_accum;
    r->planned_peak_bytes = j->replan_peak;
    j->resume_pending = true;
    gs_job_persist(d, j);
    gs_info("job %" PRIu64 ": %s", r->id, msg);
    note_event(d, j, msg);
    return;
  }
  r->has_preemptions = r->has_last_preempted_unix = r->has_resume = 1;
  r->preemptions++;
  gs_usage_preempted(d, r->id);
  r->last_preempted_unix = (int64_t)(gs_job_now_ms() / 1000);
  r->resume = 1;
  gs_job_transition(d, j, GPUSHARE__V1__JOB_STATE__PREEMPTED, why);
}

/* A run-time OOM: come back from it where the rule says (sched.c's
 * gs_sched_oom_decide). True when the job was requeued. */
static bool oom_comeback(gs_daemon *d, gs_job *j, const Gpushare__Exec__V1__Finished *f) {
  Gpushare__V1__Job *r = j->rec;
  const Gpushare__V1__JobSpec *sp = r->spec;
  int cause = f->oom->has_cause ? (int)f->oom->cause : GPUSHARE__V1__OOM_CAUSE__QUOTA;
  gs_sched_oom_in in = {.cause = cause,
                        .auto_fit = sp->has_auto_fit && sp->auto_fit,
                        .requeue = sp->has_on_oom && sp->on_oom == GPUSHARE__V1__OOM_ACTION__OOM_REQUEUE,
                        .retries = r->oom_retries,
                        .max_retries = d->cfg.oom_retries,
                        .micro_batch = r->micro_batch};
  gs_sched_oom act = gs_sched_oom_decide(&in);
  if (act == GS_SCHED_OOM_FAIL) return false;
  char reason[1400];
  uint64_t now = gs_job_now_ms();
  if (act == GS_SCHED_OOM_SMALLER) {
    gs_err e;
    gs_err_clear(&e);
    gs_vdev v;
    gs_admit a;
    if (gs_store_vdev_get(d->store, r->vdev, &v, &e) < 0 ||
        gs_admit_replan(&d->devices, sp, &v, v.memory_limit, r->data_bytes, r->micro_batch,
                        r->accumulation_steps, true, &a, &e) < 0 ||
        !a.fits)
      return false;
    snprintf(reason, sizeof reason,
             "run-time OOM (%s) at micro-batch %" PRIu32 ": resuming from its last checkpoint "
             "with micro-batch %" PRIu32 " x %" PRIu32
             " accumulation step%s (effective batch %" PRIu64 " kept); comeback %" PRIu32
             " of %u",
             oom_cause_name(cause), r->micro_batch, a.micro_batch, a.accumulation_steps,
             a.accumulation_steps == 1 ? "" : "s",
             (uint64_t)a.micro_batch * a.accumulation_steps, r->oom_retries + 1,
             d->cfg.oom_retries);
    r->micro_batch = a.micro_batch;
    r->accumulation_steps = a.accumulation_steps;
    r->planned_peak_bytes = a.peak_bytes;
    j->retry_after_ms = 0;
  } else {
    uint32_t n = r->oom_retries + 1;
    uint64_t wait_s = 5 * (uint64_t)(n < 12 ? n : 12);
    if (cause == GPUSHARE__V1__OOM_CAUSE__PHYSICAL) {
      /* The scheduler starts it only when the device has room (physical_wait),
       * making the room by preemption if its priority allows: no back-off,
       * unless that room was not enough before. */
      wait_s = r->oom_retries ? wait_s - 5 : 0;
      if (wait_s)
        snprintf(reason, sizeof reason,
                 "run-time OOM (PHYSICAL): device %s is held by other vdevs; requeued to "
                 "resume from its last checkpoint when the memory is there (next try in "
                 "%" PRIu64 " s)",
                 r->device ? r->device : "?", wait_s);
      else
        snprintf(reason, sizeof reason,
                 "run-time OOM (PHYSICAL): device %s is held by other vdevs; requeued to "
                 "resume from its last checkpoint when the device has room for it",
                 r->device ? r->device : "?");
    } else
      snprintf(reason, sizeof reason,
               "run-time OOM (%s): requeued as its spec asks (on_oom: OOM_REQUEUE) to resume "
               "from its last checkpoint in %" PRIu64 " s; try %" PRIu32 " of %u",
               oom_cause_name(cause), wait_s, n, d->cfg.oom_retries);
    j->retry_after_ms = wait_s ? now + wait_s * 1000 : 0;
  }
  r->has_oom_retries = r->has_resume = 1;
  r->oom_retries++;
  r->resume = 1;
  gs_job_transition(d, j, GPUSHARE__V1__JOB_STATE__QUEUED, reason);
  return true;
}

static void on_finished(gs_daemon *d, const Gpushare__Exec__V1__Finished *f) {
  gs_job *j = gs_job_get(d, f->job_id);
  if (!j) return;
  gs_usage_finished(d, f); /* while it is still placed: its last interval is its */
  Gpushare__V1__Job *r = j->rec;
  j->placed = -1;
  if (f->has_device_seconds) j->device_seconds += f->device_seconds;
  if (f->has_steps) {
    r->has_step = 1;
    r->step = f->steps;
  }
  if (f->interrupted) {
    /* Checkpointed for a shutdown: it stays RUNNING and resumes at start. */
    j->resume_pending = true;
    r->has_shutdown_checkpoint = 1;
    r->shutdown_checkpoint = 1;
    gs_job_persist(d, j);
    Gpushare__V1__JobEvent ev;
    char msg[256];
    snprintf(msg, sizeof msg,
             "gpushared is stopping: checkpointed at step %" PRIu64 "; it resumes there when "
             "gpushared starts again",
             r->step);
    gs_job_state_event(j, &ev, msg);
    gs_job_log_event(d, j, &ev);
    gs_info("job %" PRIu64 " checkpointed at step %" PRIu64 " for shutdown", r->id, r->step);
    return;
  }
  if (f->n_epoch) {
    /* Finished has this run's epochs; a job resumed after a restart keeps
     * the ones its record had from before (those of a number this run
     * reports again are replaced). */
    uint32_t from = f->epoch[0]->epoch;
    size_t keep = 0;
    for (size_t i = 0; i < r->n_epoch; i++) {
      if (r->epoch[i]->epoch < from) r->epoch[keep++] = r->epoch[i];
      else gpushare__v1__epoch_metrics__free_unpacked(r->epoch[i], NULL);
    }
    r->n_epoch = keep;
    for (size_t i = 0; i < f->n_epoch; i++) gs_job_append_epoch(j, f->epoch[i]);
  }
  if (f->oom) {
    if (r->oom) gpushare__v1__oom_report__free_unpacked(r->oom, NULL);
    r->oom = gs_job_msg_dup(&f->oom->base);
  }
  if (f->timeline) {
    if (r->timeline) gpushare__v1__memory_timeline__free_unpacked(r->timeline, NULL);
    r->timeline = gs_job_msg_dup(&f->timeline->base);
  }
  int kind = j->pausing ? j->pause_kind : PAUSE_PREEMPT;
  j->pausing = false;
  if (f->paused && !j->cancel_requested && !gs_job_final(r->state)) {
    on_paused(d, j, f, kind);
    gs_exec_events_schedule(d);
    return;
  }
  Gpushare__V1__JobState st = f->has_state ? f->state : GPUSHARE__V1__JOB_STATE__FAILED;
  if (!gs_job_final(st)) st = GPUSHARE__V1__JOB_STATE__FAILED;
  if (st == GPUSHARE__V1__JOB_STATE__FAILED && f->oom && !j->cancel_requested &&
      !gs_job_final(r->state) && oom_comeback(d, j, f)) {
    gs_exec_events_schedule(d);
    return;
  }
  if (j->cancel_requested && st == GPUSHARE__V1__JOB_STATE__CANCELLED) {
    /* Who cancelled (kept since the request) and where it stopped. */
    char reason[1024];
    snprintf(reason, sizeof reason, "%s%s%s%s", r->reason ? r->reason : "cancelled",
             f->reason && *f->reason ? " (" : "", f->reason && *f->reason ? f->reason : "",
             f->reason && *f->reason ? ")" : "");
    gs_job_transition(d, j, st, reason);
  } else {
    gs_job_transition(d, j, st, f->reason && *f->reason ? f->reason : NULL);
  }
  gs_exec_events_schedule(d);
}

static void on_stats(gs_daemon *d, const Gpushare__Exec__V1__Stats *s) {
  for (size_t i = 0; i < s->n_vdev; i++) {
    const Gpushare__Exec__V1__VdevStats *v = s->vdev[i];
    if (!v->name) continue;
    vdev_live *l = live_of(d, v->name);
    if (!l) continue;
    l->v.in_use = v->in_use;
    l->v.reserved = v->reserved;
    l->v.peak = v->peak_in_use;
    l->v.device_seconds = v->device_seconds;
    l->v.steps = v->steps;
    l->v.running = v->running_jobs;
    l->v.has_free = v->has_free_bytes && v->has_largest_free_bytes && v->has_fragmentation;
    l->v.free = l->v.has_free ? v->free_bytes : 0;
    l->v.largest_free = l->v.has_free ? v->largest_free_bytes : 0;
    l->v.fragmentation = l->v.has_free ? v->fragmentation : 0;
  }
  gs_usage_stats(d, s);
}

static void on_message(gs_daemon *d, gs_executor *x, const Gpushare__Exec__V1__FromExecutor *m) {
  (void)x;
  switch (m->msg_case) {
  case GPUSHARE__EXEC__V1__FROM_EXECUTOR__MSG_PROGRESS: on_progress(d, m->progress); break;
  case GPUSHARE__EXEC__V1__FROM_EXECUTOR__MSG_FINISHED: on_finished(d, m->finished); break;
  case GPUSHARE__EXEC__V1__FROM_EXECUTOR__MSG_STATS: on_stats(d, m->stats); break;
  default: break;
  }
}

static void maybe_loop_done(gs_daemon *d) {
  gs_execs *X = d->execs;
  for (size_t i = 0; i < d->devices.n; i++)
    if (X->exec[i] && !X->exec_gone[i]) return;
  gs_info("executors stopped");
}

/* The job a dying executor named (executor.c on_fatal writes the id of the
 * job whose thread took the fatal signal to STATE/executor-DEVICE.crash), or
 * 0 when it named none (killed from outside, out of memory). The file is
 * removed once read, so an old crash never blames a later death and no
 * empty file stays behind. */
static uint64_t crash_culprit(gs_daemon *d, size_t dev) {
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/executor-%s.crash", d->cfg.state_dir,
           d->devices.dev[dev].name);
  FILE *f = fopen(path, "r+e");
  if (!f) return 0;
  uint64_t id = 0;
  if (fscanf(f, "%" SCNu64, &id) != 1) id = 0;
  fclose(f);
  if (unlink(path) < 0 && errno != ENOENT) gs_warn("cannot remove %s: %s", path, strerror(errno));
  return id;
}

static void on_died(gs_daemon *d, gs_executor *x, const char *why, bool planned) {
  gs_jobs *J = d->jobs;
  size_t dev = gs_supervisor_device_index(x);
  uint64_t culprit = planned ? 0 : crash_culprit(d, dev);
  bool named = false; /* the culprit is one of the jobs it ran */
  for (uint64_t i = 0; i < J->cap && culprit; i++)
    if (J->by_id[i] && J->by_id[i]->placed == (int)dev && J->by_id[i]->rec->id == culprit)
      named = true;
  if (culprit && named)
    gs_warn("the executor of %s died in job %" PRIu64 "'s thread (%s): that job is charged "
            "with the crash, the others resume uncharged",
            d->devices.dev[dev].name, culprit, why);
  for (uint64_t i = 0; i < J->cap; i++) {
    gs_job *j = J->by_id[i];
    if (!j || j->placed != (int)dev) continue;
    j->placed = -1;
    if (j->pausing && j->pause_kind == PAUSE_REPLAN) {
      /* Its vdev shrank: whatever it resumes from, it resumes re-planned. */
      j->rec->micro_batch = j->replan_micro;
      j->rec->accumulation_steps = j->replan_accum;
      j->rec->planned_peak_bytes = j->replan_peak;
    }
    j->pausing = false;
    if (planned) {
      j->resume_pending = true; /* it keeps its checkpoint; resumes at start */
      continue;
    }
    /* Blame: the job the executor named, or, when it named none, every job
     * it ran (one of them may have caused it). */
    bool charged = !named || j->rec->id == culprit;
    if (charged) j->crashes++;
    gs_job_set_str(&j->rec->device, d->devices.dev[dev].name);
    j->rec->has_restarts = 1;
    j->rec->restarts++;
    if (charged && j->crashes >= 2) {
      char reason[512];
      if (named)
        snprintf(reason, sizeof reason,
                 "this job crashed the executor of %s twice, each time inside its own "
                 "step (last: %s); gpushare stopped retrying it so it cannot crash-loop the "
                 "device, and the other jobs there resumed from their checkpoints",
                 d->devices.dev[dev].name, why);
      else
        snprintf(reason, sizeof reason,
                 "the executor of %s went down twice while running this job (last: %s); "
                 "gpushare stopped retrying it so it cannot crash-loop the device",
                 d->devices.dev[dev].name, why);
      gs_job_transition(d, j, GPUSHARE__V1__JOB_STATE__FAILED, reason);
    } else {
      gs_warn("job %" PRIu64 " will resume from its checkpoint: its executor %s", j->rec->id, why);
      j->resume_pending = true;
      gs_job_persist(d, j);
      char msg[256];
      snprintf(msg, sizeof msg, "executor %s; resuming from the last checkpoint", why);
      note_event(d, j, msg);
    }
  }
  if (planned) {
    d->execs->exec_gone[dev] = true;
    maybe_loop_done(d);
  }
}

static const gs_supervisor_events exec_events = {on_ready, on_message, on_died};

/* -------------------------------------------------------------- lifecycle --- */

int gs_exec_events_init(gs_daemon *d, gs_err *e) {
  gs_execs *X = calloc(1, sizeof *X);
  if (!X) return gs_err_set(e, GS_INTERNAL, "", "out of memory");
  d->execs = X;
  for (size_t i = 0; i < d->devices.n; i++)
    if (gs_supervisor_start(d, i, &exec_events, &X->exec[i], e) < 0) return gs_err_rc(e);
  return 0;
}

void gs_exec_events_shutdown(gs_daemon *d) {
  gs_execs *X = d->execs;
  if (!X || X->shutting_down) return;
  X->shutting_down = true;
  for (size_t i = 0; i < d->devices.n; i++)
    if (X->exec[i]) gs_supervisor_stop(X->exec[i]);
}

bool gs_exec_events_shutting_down(const gs_daemon *d) {
  return d->execs && d->execs->shutting_down;
}

void gs_exec_events_free(gs_daemon *d) {
  gs_execs *X = d->execs;
  if (!X) return;
  for (size_t i = 0; i < d->devices.n; i++) gs_supervisor_free(X->exec[i]);
  free(X->live);
  free(X);
  d->execs = NULL;
}

void gs_exec_events_vdev_live(const gs_daemon *d, const char *vdev, gs_vdev_live *out) {
  memset(out, 0, sizeof *out);
  const gs_execs *X = d->execs;
  for (size_t i = 0; X && i < X->n_live; i++)
    if (strcmp(X->live[i].name, vdev) == 0) *out = X->live[i].v;
}

uint32_t gs_exec_events_restarts(const gs_daemon *d, size_t device) {
  gs_executor *x = exec_of(d, device);
  return x ? gs_supervisor_restarts(x) : 0;
}
