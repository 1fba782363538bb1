/*
 * jobs.c: the control plane's job layer (see jobs.h).
 *
 * Each job lives in memory as its gpushare.v1.Job record (an unpacked
 * protobuf-c message the job layer owns and edits field by field with
 * malloc'd values, so free_unpacked releases it) and in the store as that
 * record packed. Every state change is written to the store before anyone
 * is told of it.
 *
 * Scheduling (the per-vdev queue of DESIGN.md section 6): jobs of a vdev
 * start by priority, then submit time, while the planned peaks of the jobs
 * running in it plus the next one's fit the vdev's limit and the tenant is
 * under max_running. The head of a queue that does not fit blocks the jobs
 * behind it, so a large job is never starved by small ones. Device time
 * across vdevs is the executor's business (fair share by compute share).
 *
 * Executors: one per device (supervisor.c). A job sent to an executor is
 * "placed"; when the executor dies, each placed job counts the crash and
 * goes back to "resume pending" (it stays RUNNING in the store) to resume
 * from its checkpoint once the executor is back; a job placed during two
 * executor deaths fails with the reason, so one bad job cannot crash-loop a
 * device. At start, RUNNING jobs of the store are resume-pending too: after
 * kill -9 nothing is lost or run twice from scratch.
 */
#include "control/jobs.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "kernels/backend.h"
#include "control/datasets.h"
#include "control/log.h"
#include "runtime/model.h"
#include "runtime/plan.h"
#include "common/size.h"
#include "runtime/spec_pb.h"
#include "present/present.h"
#include "control/supervisor.h"
#include "proto/wire.h"

typedef struct watcher {
  gs_conn *conn;
  uint64_t req_id;
  struct watcher *next;
} watcher;

typedef struct gs_job {
  Gpushare__V1__Job *rec;  /* owned; what the store holds, packed */
  uint32_t crashes;        /* executor deaths while placed */
  int placed;              /* device index it runs on, -1 when not on an executor */
  bool resume_pending;     /* RUNNING, waiting to be (re)started on its executor */
  bool cancel_requested;
  double device_seconds;
  watcher *watchers;
  uint64_t epoch_saved_ms; /* loop time the last epoch end was stored and logged */
} gs_job;

/* A job's record keeps the metrics of its last GS_EPOCHS_KEPT epochs, and an
 * epoch end is stored and logged at most once a second (the ones between are
 * stored with the next write): a job of tiny epochs ends hundreds a second,
 * and storing each, with its fsync and a record that grows with every epoch,
 * stalled the loop for half a minute (test_limits saw it). */
#define GS_EPOCHS_KEPT 1000
#define GS_EPOCH_SAVE_MS 1000

typedef struct vdev_live {
  char name[GS_NAME_MAX + 1];
  uint64_t in_use, reserved, peak, steps;
  double device_seconds;
  uint32_t running;
} vdev_live;

struct gs_jobs {
  gs_job **by_id;          /* index = job id (ids are dense, from the store) */
  uint64_t cap;
  gs_executor *exec[GS_DEVICES_MAX];
  bool exec_gone[GS_DEVICES_MAX];
  vdev_live *live;         /* per vdev, from executor Stats */
  size_t n_live;
  bool shutting_down;
  uint64_t submitted, finished[5];
};

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static const char *state_name(int s) {
  static const char *const n[] = {"QUEUED", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED"};
  return s >= 0 && s < 5 ? n[s] : "UNKNOWN";
}

static bool final_state(int s) { return s >= GPUSHARE__V1__JOB_STATE__SUCCEEDED; }

/* A deep copy of a protobuf-c message that free_unpacked can release. */
static void *msg_dup(const ProtobufCMessage *m) {
  size_t n = protobuf_c_message_get_packed_size(m);
  uint8_t *buf = malloc(n ? n : 1);
  if (!buf) return NULL;
  protobuf_c_message_pack(m, buf);
  void *r = protobuf_c_message_unpack(m->descriptor, NULL, n, buf);
  free(buf);
  return r;
}

static void set_str(char **field, const char *v) {
  free(*field);
  *field = v ? strdup(v) : NULL;
}

static void job_dir(const gs_daemon *d, uint64_t id, char *buf, size_t len) {
  snprintf(buf, len, "%s/jobs/%" PRIu64, d->cfg.state_dir, id);
}
static void job_file(const gs_daemon *d, uint64_t id, const char *name, char *buf, size_t len) {
  snprintf(buf, len, "%s/jobs/%" PRIu64 "/%s", d->cfg.state_dir, id, name);
}

static gs_job *job_get(gs_daemon *d, uint64_t id) {
  gs_jobs *J = d->jobs;
  return id < J->cap ? J->by_id[id] : NULL;
}

static int job_put(gs_daemon *d, gs_job *j) {
  gs_jobs *J = d->jobs;
  uint64_t id = j->rec->id;
  if (id >= J->cap) {
    uint64_t cap = J->cap ? J->cap : 64;
    while (cap <= id) cap *= 2;
    gs_job **p = realloc(J->by_id, cap * sizeof *p);
    if (!p) return -1;
    memset(p + J->cap, 0, (cap - J->cap) * sizeof *p);
    J->by_id = p;
    J->cap = cap;
  }
  J->by_id[id] = j;
  return 0;
}

static int persist(gs_daemon *d, gs_job *j) {
  size_t n = gpushare__v1__job__get_packed_size(j->rec);
  uint8_t *buf = malloc(n ? n : 1);
  if (!buf) return -1;
  gpushare__v1__job__pack(j->rec, buf);
  gs_err e;
  gs_err_clear(&e);
  int rc = gs_store_job_update(d->store, j->rec->id, (int)j->rec->state, j->crashes, buf, n, &e);
  free(buf);
  if (rc < 0) gs_error("job %" PRIu64 ": cannot save its state: %s", j->rec->id, e.msg);
  return rc;
}

static void log_event(gs_daemon *d, gs_job *j, const Gpushare__V1__JobEvent *ev) {
  size_t n = gpushare__v1__job_event__get_packed_size(ev);
  uint8_t *buf = malloc(n ? n : 1);
  if (!buf) return;
  gpushare__v1__job_event__pack(ev, buf);
  gs_err e;
  gs_err_clear(&e);
  if (gs_store_job_event_add(d->store, j->rec->id, buf, n, &e) < 0)
    gs_warn("job %" PRIu64 ": event not stored: %s", j->rec->id, e.msg);
  free(buf);
}

static void send_watch(gs_conn *conn, uint64_t req_id, const Gpushare__V1__JobEvent *ev,
                       bool final) {
  Gpushare__V1__Response r = GPUSHARE__V1__RESPONSE__INIT;
  Gpushare__V1__WatchResponse w = GPUSHARE__V1__WATCH_RESPONSE__INIT;
  r.has_id = r.has_code = 1;
  r.id = req_id;
  r.code = GPUSHARE__V1__CODE__OK;
  r.result_case = GPUSHARE__V1__RESPONSE__RESULT_WATCH;
  r.watch = &w;
  w.event = (Gpushare__V1__JobEvent *)ev;
  w.has_final = 1;
  w.final = final;
  gs_conn_send_response(conn, &r);
}

static void broadcast(gs_job *j, const Gpushare__V1__JobEvent *ev, bool final) {
  for (watcher *w = j->watchers; w; w = w->next) send_watch(w->conn, w->req_id, ev, final);
  if (final) {
    for (watcher *w = j->watchers, *n; w; w = n) {
      n = w->next;
      free(w);
    }
    j->watchers = NULL;
  }
}

/* An event describing the job as it stands (state, step, last metrics). */
static void state_event(const gs_job *j, Gpushare__V1__JobEvent *ev, const char *message) {
  Gpushare__V1__JobEvent init = GPUSHARE__V1__JOB_EVENT__INIT;
  *ev = init;
  const Gpushare__V1__Job *r = j->rec;
  ev->has_job_id = ev->has_time_unix_ms = ev->has_state = 1;
  ev->job_id = r->id;
  ev->time_unix_ms = (int64_t)now_ms();
  ev->state = r->state;
  ev->has_step = ev->has_total_steps = 1;
  ev->step = r->step;
  ev->total_steps = r->total_steps;
  if (r->n_epoch) {
    const Gpushare__V1__EpochMetrics *m = r->epoch[r->n_epoch - 1];
    ev->has_epoch = ev->has_loss = 1;
    ev->epoch = m->epoch;
    ev->loss = m->train_loss;
    ev->has_accuracy = m->has_test_accuracy;
    ev->accuracy = m->test_accuracy;
    ev->has_loss_scale = m->has_loss_scale;
    ev->loss_scale = m->loss_scale;
  }
  ev->message = (char *)message;
}

/* Change state, persist, log and tell watchers (final states end streams). */
static void job_transition(gs_daemon *d, gs_job *j, Gpushare__V1__JobState st, const char *reason) {
  Gpushare__V1__Job *r = j->rec;
  r->has_state = 1;
  r->state = st;
  int64_t now = (int64_t)(now_ms() / 1000);
  if (st == GPUSHARE__V1__JOB_STATE__RUNNING && !r->has_started_unix) {
    r->has_started_unix = 1;
    r->started_unix = now;
  }
  if (final_state(st)) {
    r->has_finished_unix = 1;
    r->finished_unix = now;
    j->placed = -1;
    j->resume_pending = false;
    d->jobs->finished[st]++;
  }
  if (reason) set_str(&r->reason, reason);
  persist(d, j);
  char msg[1200];
  snprintf(msg, sizeof msg, "%s%s%s", state_name(st), reason ? ": " : "", reason ? reason : "");
  Gpushare__V1__JobEvent ev;
  state_event(j, &ev, msg);
  log_event(d, j, &ev);
  broadcast(j, &ev, final_state(st));
  gs_info("job %" PRIu64 " (%s/%s) %s", r->id, r->tenant, r->vdev ? r->vdev : "", msg);
}

/* ------------------------------------------------------------ placement --- */

static size_t device_of_vdev(gs_daemon *d, const char *device) {
  for (size_t i = 0; i < d->devices.n; i++)
    if (strcmp(d->devices.dev[i].name, device) == 0) return i;
  return SIZE_MAX;
}

/* Resolve the dataset references of a stored spec to blob paths. */
static int resolve_dataset(gs_daemon *d, const char *tenant, const Gpushare__V1__Dataset *ds,
                           const char *field, char *images, char *labels, size_t len, gs_err *e) {
  images[0] = labels[0] = '\0';
  char f[96];
  if (!ds) return 0;
  if (ds->source_case == GPUSHARE__V1__DATASET__SOURCE_IDX) {
    snprintf(f, sizeof f, "%s.idx.images", field);
    if (gs_datasets_resolve(d, tenant, ds->idx->images, f, images, len, e) < 0) return -1;
    snprintf(f, sizeof f, "%s.idx.labels", field);
    return gs_datasets_resolve(d, tenant, ds->idx->labels, f, labels, len, e);
  }
  if (ds->source_case == GPUSHARE__V1__DATASET__SOURCE_NAME) {
    /* A named pair: the tenant's datasets NAME.images and NAME.labels. */
    char n1[GS_NAME_MAX + 8], n2[GS_NAME_MAX + 8];
    snprintf(n1, sizeof n1, "%s.images", ds->name);
    snprintf(n2, sizeof n2, "%s.labels", ds->name);
    snprintf(f, sizeof f, "%s.name", field);
    if (gs_datasets_resolve(d, tenant, n1, f, images, len, e) < 0 ||
        gs_datasets_resolve(d, tenant, n2, f, labels, len, e) < 0) {
      gs_err_set(e, GS_NOT_FOUND, f,
                 "dataset name \"%.63s\" needs the tenant's datasets %s and %s (gpuctl dataset "
                 "add %s IMAGES_FILE and %s LABELS_FILE)",
                 ds->name, n1, n2, n1, n2);
      return -1;
    }
    return 0;
  }
  return 0; /* synthetic: nothing to resolve */
}

static void exec_send_start(gs_daemon *d, gs_job *j, size_t dev, bool resume) {
  gs_err e;
  gs_err_clear(&e);
  const Gpushare__V1__Job *r = j->rec;
  char ti[4200], tl[4200], vi[4200], vl[4200], ck[4200], ex[4200], dir[4200];
  if (resolve_dataset(d, r->tenant, r->spec->train, "spec.train", ti, tl, sizeof ti, &e) < 0 ||
      resolve_dataset(d, r->tenant, r->spec->test, "spec.test", vi, vl, sizeof vi, &e) < 0) {
    job_transition(d, j, GPUSHARE__V1__JOB_STATE__FAILED, e.msg);
    return;
  }
  job_dir(d, r->id, dir, sizeof dir);
  mkdir(dir, 0750);
  job_file(d, r->id, "checkpoint.ckpt", ck, sizeof ck);
  job_file(d, r->id, "model.safetensors", ex, sizeof ex);
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
  if (gs_executor_send(d->jobs->exec[dev], &m) < 0) {
    j->resume_pending = true; /* sent again once the executor is back */
    return;
  }
  j->placed = (int)dev;
  j->resume_pending = false;
}

static uint32_t tenant_running(gs_daemon *d, const char *tenant) {
  uint32_t n = 0;
  for (uint64_t i = 0; i < d->jobs->cap; i++) {
    gs_job *j = d->jobs->by_id[i];
    if (j && j->rec->state == GPUSHARE__V1__JOB_STATE__RUNNING && !strcmp(j->rec->tenant, tenant))
      n++;
  }
  return n;
}

static int cmp_queue(const void *a, const void *b) {
  const gs_job *x = *(gs_job *const *)a, *y = *(gs_job *const *)b;
  if (x->rec->priority != y->rec->priority) return x->rec->priority > y->rec->priority ? -1 : 1;
  if (x->rec->submitted_unix != y->rec->submitted_unix)
    return x->rec->submitted_unix < y->rec->submitted_unix ? -1 : 1;
  return x->rec->id < y->rec->id ? -1 : 1;
}

/* Run the queues: resume what waits for its executor, then start queued
 * jobs while they fit. */
static void schedule(gs_daemon *d) {
  gs_jobs *J = d->jobs;
  if (J->shutting_down) return;
  gs_err e;
  gs_err_clear(&e);
  gs_vdev *vdevs;
  size_t nv;
  if (gs_store_vdev_list(d->store, &vdevs, &nv, &e) < 0) {
    gs_error("scheduler: %s", e.msg);
    return;
  }
  gs_job **q = malloc((J->cap + 1) * sizeof *q);
  for (size_t v = 0; q && v < nv; v++) {
    size_t dev = device_of_vdev(d, vdevs[v].device);
    if (dev == SIZE_MAX || !J->exec[dev] || !gs_executor_ready(J->exec[dev])) continue;
    uint64_t used = 0;
    size_t nq = 0;
    for (uint64_t i = 0; i < J->cap; i++) {
      gs_job *j = J->by_id[i];
      if (!j || strcmp(j->rec->vdev, vdevs[v].name) != 0) continue;
      if (j->rec->state == GPUSHARE__V1__JOB_STATE__RUNNING) {
        if (j->resume_pending) exec_send_start(d, j, dev, true);
        used += j->rec->planned_peak_bytes;
      } else if (j->rec->state == GPUSHARE__V1__JOB_STATE__QUEUED) {
        q[nq++] = j;
      }
    }
    qsort(q, nq, sizeof *q, cmp_queue);
    for (size_t k = 0; k < nq; k++) {
      gs_job *j = q[k];
      if (used + j->rec->planned_peak_bytes > vdevs[v].memory_limit) break;
      gs_tenant t;
      if (gs_store_tenant_get(d->store, j->rec->tenant, &t, &e) < 0) break;
      uint32_t max_running = t.quota.max_running;
      gs_tenant_clear(&t);
      if (max_running && tenant_running(d, j->rec->tenant) >= max_running) break;
      set_str(&j->rec->device, vdevs[v].device);
      job_transition(d, j, GPUSHARE__V1__JOB_STATE__RUNNING, NULL);
      exec_send_start(d, j, dev, false);
      used += j->rec->planned_peak_bytes;
    }
  }
  free(q);
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
  if (cfg && ptr) gs_executor_send(d->jobs->exec[dev], &m);
  free(cfg);
  free(ptr);
  free(vdevs);
}

void gs_jobs_vdevs_changed(gs_daemon *d) {
  if (!d->jobs) return;
  for (size_t i = 0; i < d->devices.n; i++)
    if (d->jobs->exec[i] && gs_executor_ready(d->jobs->exec[i])) send_vdevs(d, i);
  schedule(d);
}

/* ------------------------------------------------------ executor events --- */

static void on_ready(gs_daemon *d, gs_executor *x) {
  send_vdevs(d, gs_executor_device_index(x));
  schedule(d);
}

static vdev_live *live_of(gs_daemon *d, const char *name) {
  gs_jobs *J = d->jobs;
  for (size_t i = 0; i < J->n_live; i++)
    if (strcmp(J->live[i].name, name) == 0) return &J->live[i];
  vdev_live *p = realloc(J->live, (J->n_live + 1) * sizeof *p);
  if (!p) return NULL;
  J->live = p;
  memset(&p[J->n_live], 0, sizeof *p);
  snprintf(p[J->n_live].name, sizeof p[J->n_live].name, "%s", name);
  return &p[J->n_live++];
}

static void append_epoch(gs_job *j, const Gpushare__V1__EpochMetrics *m) {
  Gpushare__V1__Job *r = j->rec;
  Gpushare__V1__EpochMetrics **p = realloc(r->epoch, (r->n_epoch + 1) * sizeof *p);
  if (!p) return;
  r->epoch = p;
  Gpushare__V1__EpochMetrics *copy = msg_dup(&m->base);
  if (copy) r->epoch[r->n_epoch++] = copy;
  if (r->n_epoch > GS_EPOCHS_KEPT) {
    gpushare__v1__epoch_metrics__free_unpacked(r->epoch[0], NULL);
    memmove(r->epoch, r->epoch + 1, (r->n_epoch - 1) * sizeof *r->epoch);
    r->n_epoch--;
  }
}

static void on_progress(gs_daemon *d, const Gpushare__Exec__V1__Progress *p) {
  gs_job *j = job_get(d, p->job_id);
  if (!j || !p->event || final_state(j->rec->state)) return;
  const Gpushare__V1__JobEvent *ev = p->event;
  Gpushare__V1__Job *r = j->rec;
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
    append_epoch(j, ev->epoch_end);
    uint64_t now = uv_now(d->loop);
    if (!j->epoch_saved_ms || now - j->epoch_saved_ms >= GS_EPOCH_SAVE_MS) {
      j->epoch_saved_ms = now;
      persist(d, j);
      log_event(d, j, &out);
    }
  }
  broadcast(j, &out, false);
}

static void on_finished(gs_daemon *d, const Gpushare__Exec__V1__Finished *f) {
  gs_job *j = job_get(d, f->job_id);
  if (!j) return;
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
    persist(d, j);
    gs_info("job %" PRIu64 " checkpointed at step %" PRIu64 " for shutdown", r->id, r->step);
    return;
  }
  if (f->n_epoch) {
    for (size_t i = 0; i < r->n_epoch; i++) gpushare__v1__epoch_metrics__free_unpacked(r->epoch[i], NULL);
    free(r->epoch);
    r->epoch = NULL;
    r->n_epoch = 0;
    for (size_t i = 0; i < f->n_epoch; i++) append_epoch(j, f->epoch[i]);
  }
  if (f->oom) {
    if (r->oom) gpushare__v1__oom_report__free_unpacked(r->oom, NULL);
    r->oom = msg_dup(&f->oom->base);
  }
  if (f->timeline) {
    if (r->timeline) gpushare__v1__memory_timeline__free_unpacked(r->timeline, NULL);
    r->timeline = msg_dup(&f->timeline->base);
  }
  Gpushare__V1__JobState st = f->has_state ? f->state : GPUSHARE__V1__JOB_STATE__FAILED;
  if (!final_state(st)) st = GPUSHARE__V1__JOB_STATE__FAILED;
  if (j->cancel_requested && st == GPUSHARE__V1__JOB_STATE__CANCELLED) {
    /* Who cancelled (kept since the request) and where it stopped. */
    char reason[1024];
    snprintf(reason, sizeof reason, "%s%s%s%s", r->reason ? r->reason : "cancelled",
             f->reason && *f->reason ? " (" : "", f->reason && *f->reason ? f->reason : "",
             f->reason && *f->reason ? ")" : "");
    job_transition(d, j, st, reason);
  } else {
    job_transition(d, j, st, f->reason && *f->reason ? f->reason : NULL);
  }
  schedule(d);
}

static void on_stats(gs_daemon *d, const Gpushare__Exec__V1__Stats *s) {
  for (size_t i = 0; i < s->n_vdev; i++) {
    const Gpushare__Exec__V1__VdevStats *v = s->vdev[i];
    if (!v->name) continue;
    vdev_live *l = live_of(d, v->name);
    if (!l) continue;
    l->in_use = v->in_use;
    l->reserved = v->reserved;
    l->peak = v->peak_in_use;
    l->device_seconds = v->device_seconds;
    l->steps = v->steps;
    l->running = v->running_jobs;
  }
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

static void maybe_loop_done(gs_daemon *d);

/* The job a dying executor named (executor.c on_fatal writes the id of the
 * job whose thread took the fatal signal to STATE/executor-DEVICE.crash), or
 * 0 when it named none (killed from outside, out of memory). The file is
 * emptied once read, so an old crash never blames a later death. */
static uint64_t crash_culprit(gs_daemon *d, size_t dev) {
  char path[4200];
  snprintf(path, sizeof path, "%s/executor-%s.crash", d->cfg.state_dir,
           d->devices.dev[dev].name);
  FILE *f = fopen(path, "r+e");
  if (!f) return 0;
  uint64_t id = 0;
  if (fscanf(f, "%" SCNu64, &id) != 1) id = 0;
  if (ftruncate(fileno(f), 0) != 0) gs_warn("cannot empty %s: %s", path, strerror(errno));
  fclose(f);
  return id;
}

static void on_died(gs_daemon *d, gs_executor *x, const char *why, bool planned) {
  gs_jobs *J = d->jobs;
  size_t dev = gs_executor_device_index(x);
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
    if (planned) {
      j->resume_pending = true; /* it keeps its checkpoint; resumes at start */
      continue;
    }
    /* Blame: the job the executor named, or, when it named none, every job
     * it ran (one of them may have caused it). */
    bool charged = !named || j->rec->id == culprit;
    if (charged) j->crashes++;
    set_str(&j->rec->device, d->devices.dev[dev].name);
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
      job_transition(d, j, GPUSHARE__V1__JOB_STATE__FAILED, reason);
    } else {
      gs_warn("job %" PRIu64 " will resume from its checkpoint: its executor %s", j->rec->id, why);
      j->resume_pending = true;
      persist(d, j);
      Gpushare__V1__JobEvent ev;
      char msg[256];
      snprintf(msg, sizeof msg, "executor %s; resuming from the last checkpoint", why);
      state_event(j, &ev, msg);
      log_event(d, j, &ev);
      broadcast(j, &ev, false);
    }
  }
  if (planned) {
    J->exec_gone[dev] = true;
    maybe_loop_done(d);
  }
}

static const gs_supervisor_events exec_events = {on_ready, on_message, on_died};

/* -------------------------------------------------------------- lifecycle --- */

int gs_jobs_init(gs_daemon *d, gs_err *e) {
  gs_jobs *J = calloc(1, sizeof *J);
  if (!J) return gs_err_set(e, GS_INTERNAL, "", "out of memory");
  d->jobs = J;
  char dir[4200];
  snprintf(dir, sizeof dir, "%s/jobs", d->cfg.state_dir);
  if (mkdir(dir, 0750) < 0 && errno != EEXIST)
    return gs_err_set(e, GS_FAILED_PRECONDITION, "state_dir", "cannot create %s: %s", dir,
                      strerror(errno));
  gs_job_row *rows;
  size_t n;
  if (gs_store_job_list(d->store, &rows, &n, e) < 0) return -1;
  unsigned resumed = 0, queued = 0;
  for (size_t i = 0; i < n; i++) {
    Gpushare__V1__Job *rec = gpushare__v1__job__unpack(NULL, rows[i].record_len, rows[i].record);
    if (!rec || !rec->spec) {
      gs_error("job %" PRIu64 ": stored record unreadable; skipped", rows[i].id);
      if (rec) gpushare__v1__job__free_unpacked(rec, NULL);
      continue;
    }
    gs_job *j = calloc(1, sizeof *j);
    if (!j) break;
    j->rec = rec;
    j->crashes = rows[i].crashes;
    j->placed = -1;
    bool cancelled = rec->state == GPUSHARE__V1__JOB_STATE__RUNNING && rec->cancel_requested;
    if (rec->state == GPUSHARE__V1__JOB_STATE__RUNNING && !cancelled) {
      j->resume_pending = true;
      resumed++;
    } else if (rec->state == GPUSHARE__V1__JOB_STATE__QUEUED) {
      queued++;
    }
    if (job_put(d, j) < 0) {
      gpushare__v1__job__free_unpacked(rec, NULL);
      free(j);
      continue;
    }
    if (cancelled) {
      char why[600];
      snprintf(why, sizeof why, "%s; gpushared stopped before the job did, so it ends here",
               rec->reason && rec->reason[0] ? rec->reason : "cancelled");
      job_transition(d, j, GPUSHARE__V1__JOB_STATE__CANCELLED, why);
    }
  }
  gs_job_rows_free(rows, n);
  if (n) gs_info("%zu jobs in the store: %u to resume, %u queued", n, resumed, queued);
  for (size_t i = 0; i < d->devices.n; i++)
    if (gs_executor_start(d, i, &exec_events, &J->exec[i], e) < 0) return -1;
  return 0;
}

static void maybe_loop_done(gs_daemon *d) {
  gs_jobs *J = d->jobs;
  for (size_t i = 0; i < d->devices.n; i++)
    if (J->exec[i] && !J->exec_gone[i]) return;
  gs_info("executors stopped");
}

void gs_jobs_shutdown(gs_daemon *d) {
  gs_jobs *J = d->jobs;
  if (!J || J->shutting_down) return;
  J->shutting_down = true;
  for (size_t i = 0; i < d->devices.n; i++)
    if (J->exec[i]) gs_executor_stop(J->exec[i]);
}

void gs_jobs_free(gs_daemon *d) {
  gs_jobs *J = d->jobs;
  if (!J) return;
  for (uint64_t i = 0; i < J->cap; i++) {
    gs_job *j = J->by_id[i];
    if (!j) continue;
    for (watcher *w = j->watchers, *n; w; w = n) {
      n = w->next;
      free(w);
    }
    gpushare__v1__job__free_unpacked(j->rec, NULL);
    free(j);
  }
  for (size_t i = 0; i < d->devices.n; i++) gs_executor_free(J->exec[i]);
  free(J->by_id);
  free(J->live);
  free(J);
  d->jobs = NULL;
}

void gs_jobs_conn_closed(gs_daemon *d, const gs_conn *conn) {
  gs_jobs *J = d->jobs;
  if (!J) return;
  for (uint64_t i = 0; i < J->cap; i++) {
    gs_job *j = J->by_id[i];
    if (!j) continue;
    for (watcher **pp = &j->watchers; *pp;) {
      if ((*pp)->conn == conn) {
        watcher *w = *pp;
        *pp = w->next;
        free(w);
      } else {
        pp = &(*pp)->next;
      }
    }
  }
}

static bool dataset_uses(const Gpushare__V1__Dataset *ds, const char *sha) {
  if (!ds || ds->source_case != GPUSHARE__V1__DATASET__SOURCE_IDX) return false;
  const char *refs[2] = {ds->idx->images, ds->idx->labels};
  for (int i = 0; i < 2; i++)
    if (refs[i] && !strncmp(refs[i], "sha256:", 7) && !strcmp(refs[i] + 7, sha)) return true;
  return false;
}

uint64_t gs_jobs_using_blob(gs_daemon *d, const char *sha256) {
  gs_jobs *J = d->jobs;
  for (uint64_t i = 0; J && i < J->cap; i++) {
    gs_job *j = J->by_id[i];
    if (j && !final_state(j->rec->state) &&
        (dataset_uses(j->rec->spec->train, sha256) || dataset_uses(j->rec->spec->test, sha256)))
      return j->rec->id;
  }
  return 0;
}

void gs_jobs_vdev_memory(gs_daemon *d, const char *vdev, uint64_t *in_use, uint64_t *reserved,
                         uint64_t *peak) {
  *in_use = *reserved = *peak = 0;
  gs_jobs *J = d->jobs;
  for (size_t i = 0; J && i < J->n_live; i++)
    if (strcmp(J->live[i].name, vdev) == 0) {
      *in_use = J->live[i].in_use;
      *reserved = J->live[i].reserved;
      *peak = J->live[i].peak;
    }
}

/* ---------------------------------------------------------------- submit --- */

/* The dimensions an IDX blob declares (gzip or raw): images (n, h, w, c),
 * labels (n) and, for labels, the number of classes (max + 1). Only the
 * daemon's own blobs are read. */
static int idx_probe(const char *path, bool labels, uint64_t *n, uint32_t *h, uint32_t *w,
                     uint32_t *c, uint32_t *classes, const char *field, gs_err *e) {
  gzFile f = gzopen(path, "rb");
  if (!f) return gs_err_set(e, GS_INTERNAL, field, "cannot open the stored dataset %s", path);
  uint8_t hdr[20];
  int want = labels ? 8 : 16;
  int got = gzread(f, hdr, (unsigned)want);
  int rc = 0;
  uint32_t magic = got >= 4 ? (uint32_t)hdr[0] << 24 | hdr[1] << 16 | hdr[2] << 8 | hdr[3] : 0;
  uint32_t dims = magic & 0xff;
  if (got < want || hdr[0] || hdr[1] || hdr[2] != 0x08 || (labels ? dims != 1 : (dims != 3 && dims != 4))) {
    rc = gs_err_set(e, GS_INVALID_ARGUMENT, field,
                    "the dataset is not an IDX %s file (magic 0x%08x): expected 0x0000080%d",
                    labels ? "labels" : "images", magic, labels ? 1 : 3);
    goto out;
  }
  uint32_t d4[4] = {1, 1, 1, 1};
  for (uint32_t i = 0; i < (labels ? 1u : 3u); i++)
    d4[i] = (uint32_t)hdr[4 + 4 * i] << 24 | hdr[5 + 4 * i] << 16 | hdr[6 + 4 * i] << 8 | hdr[7 + 4 * i];
  if (!labels && dims == 4) {
    uint8_t x[4];
    if (gzread(f, x, 4) != 4) {
      rc = gs_err_set(e, GS_INVALID_ARGUMENT, field, "truncated IDX header");
      goto out;
    }
    d4[3] = (uint32_t)x[0] << 24 | x[1] << 16 | x[2] << 8 | x[3];
  }
  *n = d4[0];
  if (!labels) {
    *h = d4[1];
    *w = d4[2];
    *c = d4[3];
  } else {
    uint32_t max = 0;
    uint8_t buf[65536];
    uint64_t seen = 0;
    int r;
    while ((r = gzread(f, buf, sizeof buf)) > 0) {
      for (int i = 0; i < r; i++) max = buf[i] > max ? buf[i] : max;
      seen += (uint64_t)r;
    }
    if (seen != *n) {
      rc = gs_err_set(e, GS_INVALID_ARGUMENT, field,
                      "the labels file declares %" PRIu64 " labels but holds %" PRIu64, *n, seen);
      goto out;
    }
    *classes = max + 1 < 2 ? 2 : max + 1;
  }
out:
  gzclose(f);
  return rc;
}

/* Validate the datasets of a spec against its model (input shape, classes). */
static int check_datasets(gs_daemon *d, const char *tenant, const Gpushare__V1__JobSpec *spec,
                          const gs_model *m, gs_err *e) {
  if (!spec->train || spec->train->source_case == GPUSHARE__V1__DATASET__SOURCE__NOT_SET)
    return gs_err_set(e, GS_INVALID_ARGUMENT, "spec.train",
                      "the job has no training dataset: set train { idx { images labels } }, "
                      "train { name } or train { synthetic { examples } }");
  const Gpushare__V1__Dataset *sets[2] = {spec->train, spec->test};
  const char *names[2] = {"spec.train", "spec.test"};
  uint64_t train_examples = 0;
  for (int k = 0; k < 2; k++) {
    const Gpushare__V1__Dataset *ds = sets[k];
    if (!ds || ds->source_case == GPUSHARE__V1__DATASET__SOURCE__NOT_SET) continue;
    if (ds->source_case == GPUSHARE__V1__DATASET__SOURCE_SYNTHETIC) {
      const Gpushare__V1__SyntheticDataset *sy = ds->synthetic;
      char f[64];
      snprintf(f, sizeof f, "%s.synthetic.examples", names[k]);
      if (sy->examples < 1)
        return gs_err_set(e, GS_INVALID_ARGUMENT, f,
                          "%s.synthetic.examples is 0; a synthetic set needs at least 1 example",
                          names[k] + 5);
      snprintf(f, sizeof f, "%s.synthetic.classes", names[k]);
      if (sy->classes < 2 || sy->classes > 65536)
        return gs_err_set(e, GS_INVALID_ARGUMENT, f,
                          "%s.synthetic.classes %" PRIu32 " is out of range: from 2 to 65536",
                          names[k] + 5, sy->classes);
      uint32_t classes = sy->classes;
      if (k == 1 && classes < m->classes) classes = m->classes; /* as for IDX below */
      if (gs_model_check_dataset(m, names[k] + 5, m->input.h, m->input.w, m->input.c, classes,
                                 e) < 0) {
        gs_err_prefix(e, "spec");
        return -1;
      }
      if (k == 0) train_examples = sy->examples;
      continue;
    }
    char ip[4200], lp[4200];
    if (resolve_dataset(d, tenant, ds, names[k], ip, lp, sizeof ip, e) < 0) return -1;
    uint64_t ni = 0, nl = 0;
    uint32_t h = 0, w = 0, c = 0, classes = 0, u;
    char f[64];
    snprintf(f, sizeof f, "%s.idx.images", names[k]);
    if (idx_probe(ip, false, &ni, &h, &w, &c, &u, f, e) < 0) return -1;
    snprintf(f, sizeof f, "%s.idx.labels", names[k]);
    if (idx_probe(lp, true, &nl, &u, &u, &u, &classes, f, e) < 0) return -1;
    if (ni != nl)
      return gs_err_set(e, GS_INVALID_ARGUMENT, names[k],
                        "%s has %" PRIu64 " images but %" PRIu64 " labels", names[k] + 5, ni, nl);
    if (k == 1 && classes < m->classes) classes = m->classes; /* a test set may lack a class */
    if (gs_model_check_dataset(m, names[k] + 5, h, w, c, classes, e) < 0) {
      gs_err_prefix(e, "spec");
      return -1;
    }
    if (k == 0) train_examples = ni;
  }
  /* One step is one whole effective batch; the last partial one is dropped. */
  uint64_t eff = (uint64_t)m->recipe.batch_size * m->recipe.accumulation_steps;
  if (train_examples < eff)
    return gs_err_set(e, GS_INVALID_ARGUMENT,
                      m->recipe.accumulation_steps > 1 ? "spec.accumulation_steps" : "spec.batch_size",
                      "the effective batch (batch_size %" PRIu32 " x accumulation_steps %" PRIu32
                      " = %" PRIu64 ") is larger than the %" PRIu64 " training examples: a "
                      "step needs one whole effective batch",
                      m->recipe.batch_size, m->recipe.accumulation_steps, eff, train_examples);
  return 0;
}

/* The vdev's allocator policy, as the planner takes it: what fits a vdev
 * depends on it (a growth vdev's regions can leave no room for a large
 * buffer that a preallocated vdev of the same limit holds). */
static gs_alloc_policy vdev_policy(const gs_vdev *v) {
  return v->policy == GS_POLICY_GROWTH ? GS_POLICY_GROWTH : GS_POLICY_PREALLOCATE;
}

/* The plan as a message (runtime/spec_pb.h) with its table as summary
 * (present/); fits is judged for a vdev of `limit` bytes and `policy`
 * (always true without a limit). Built on the heap, then unpacked into the
 * request's arena with the rest of the response. */
static void *ar_pb_alloc(void *a, size_t n) { return ar_alloc(a, n); }
static void ar_pb_free(void *a, void *p) { (void)a, (void)p; }

static Gpushare__V1__Plan *plan_msg(arena *a, const gs_plan *p, uint64_t limit,
                                    gs_alloc_policy policy) {
  Gpushare__V1__Plan *m = NULL, *out = NULL;
  if (gs_spec_pb_plan(p, limit, policy, &m) < 0) return NULL;
  m->summary = gs_present_plan(m);
  size_t n = gpushare__v1__plan__get_packed_size(m);
  uint8_t *buf = malloc(n ? n : 1);
  if (buf) {
    gpushare__v1__plan__pack(m, buf);
    ProtobufCAllocator al = {.alloc = ar_pb_alloc, .free = ar_pb_free, .allocator_data = a};
    out = gpushare__v1__plan__unpack(&al, n, buf);
  }
  free(buf);
  gpushare__v1__plan__free_unpacked(m, NULL);
  return out;
}

/* The vdev a job goes to: the named one (the tenant's own), or the tenant's
 * only vdev when none is named. */
static int job_vdev(call_ctx *c, const char *name, const char *field, gs_vdev *v, gs_err *e) {
  if (name && *name) {
    if (gs_store_name_valid(name, field, e) < 0) return -1;
    if (gs_store_vdev_get(c->d->store, name, v, e) < 0 ||
        (!c->id.admin && strcmp(v->tenant, c->id.tenant) != 0)) {
      char b[80];
      snprintf(b, sizeof b, "%s", name);
      return gs_err_set(e, GS_NOT_FOUND, field, "no vdev named \"%s\" for tenant %s (gpuctl vdev list)",
                        b, c->id.tenant[0] ? c->id.tenant : "(none)");
    }
    return 0;
  }
  gs_vdev *all;
  size_t n, mine = 0;
  if (gs_store_vdev_list(c->d->store, &all, &n, e) < 0) return -1;
  for (size_t i = 0; i < n; i++)
    if (!strcmp(all[i].tenant, c->id.tenant)) {
      if (!mine) *v = all[i];
      mine++;
    }
  free(all);
  if (mine == 1) return 0;
  return gs_err_set(e, GS_INVALID_ARGUMENT, field,
                    mine ? "tenant %s has %zu vdevs: name one with vdev: \"NAME\" in the job"
                         : "tenant %s has no vdev%.0zu: an admin creates one with gpuctl vdev create",
                    c->id.tenant[0] ? c->id.tenant : "(none)", mine);
}

static const gs_backend *device_backend(void) { return gs_backend_cpu(); }

int gs_rpc_plan(call_ctx *c, const Gpushare__V1__Request *rq, gs_err *e) {
  const Gpushare__V1__PlanRequest *r = rq->plan;
  if (!r->spec) return gs_err_set(e, GS_INVALID_ARGUMENT, "spec", "no job spec given");
  uint64_t limit = 0;
  gs_alloc_policy policy = GS_POLICY_GROWTH; /* no vdev, no limit: it fits */
  const char *vname = r->vdev && *r->vdev ? r->vdev : r->spec->vdev;
  if (vname && *vname) {
    gs_vdev v;
    if (job_vdev(c, vname, "vdev", &v, e) < 0) return -1;
    limit = v.memory_limit;
    policy = vdev_policy(&v);
  }
  gs_plan p;
  gs_job_spec js;
  int rc = gs_spec_pb_job(r->spec, &js, e);
  if (rc == 0) rc = gs_plan_job(&js, device_backend(), &p, e);
  gs_spec_pb_job_free(&js);
  if (rc < 0) {
    gs_err_prefix(e, "spec");
    return -1;
  }
  Gpushare__V1__PlanResponse *m =
      AR_MSG(&c->ar, Gpushare__V1__PlanResponse, GPUSHARE__V1__PLAN_RESPONSE__INIT);
  if (m) m->plan = plan_msg(&c->ar, &p, limit, policy);
  gs_plan_free(&p);
  if (!m || !m->plan) return gs_err_set(e, GS_INTERNAL, "", "out of memory");
  c->resp->result_case = GPUSHARE__V1__RESPONSE__RESULT_PLAN_RESULT;
  c->resp->plan_result = m;
  return 0;
}

static Gpushare__V1__Job *job_view(arena *a, const gs_job *j, bool with_spec) {
  Gpushare__V1__Job *copy = AR_MSG(a, Gpushare__V1__Job, GPUSHARE__V1__JOB__INIT);
  if (!copy) return NULL;
  *copy = *j->rec; /* shallow: packed before the job changes */
  if (!with_spec) copy->spec = NULL;
  copy->timeline = NULL;
  return copy;
}

int gs_rpc_submit(call_ctx *c, const Gpushare__V1__Request *rq, gs_err *e) {
  gs_daemon *d = c->d;
  const Gpushare__V1__JobSpec *spec = rq->submit->spec;
  if (!spec) return gs_err_set(e, GS_INVALID_ARGUMENT, "spec", "no job spec given");
  if (d->jobs->shutting_down)
    return gs_err_set(e, GS_UNAVAILABLE, "", "gpushared is shutting down; submit again after it restarts");
  gs_vdev v;
  if (job_vdev(c, spec->vdev, "spec.vdev", &v, e) < 0) return -1;
  const char *tenant = v.tenant;
  if (spec->name && strlen(spec->name) > 200)
    return gs_err_set(e, GS_INVALID_ARGUMENT, "spec.name",
                      "job name of %zu bytes; at most 200 are allowed", strlen(spec->name));
  /* Free text, but shown on terminals by gpuctl list: no control characters. */
  for (const unsigned char *p = (const unsigned char *)(spec->name ? spec->name : ""); *p; p++)
    if (*p < 0x20 || *p == 0x7f)
      return gs_err_set(e, GS_INVALID_ARGUMENT, "spec.name",
                        "job name has control character 0x%02x at byte %zu; a name is printable "
                        "text",
                        *p, (size_t)(p - (const unsigned char *)spec->name) + 1);
  gs_model model;
  gs_job_spec js;
  int rc = gs_spec_pb_job(spec, &js, e);
  if (rc == 0) rc = gs_model_build(&js, &model, e);
  gs_spec_pb_job_free(&js);
  if (rc < 0) {
    gs_err_prefix(e, "spec");
    return -1;
  }
  rc = check_datasets(d, tenant, spec, &model, e);
  gs_model_free(&model);
  if (rc < 0) return -1;

  gs_tenant t;
  if (gs_store_tenant_get(d->store, tenant, &t, e) < 0) return -1;
  uint32_t max_queued = t.quota.max_queued;
  gs_tenant_clear(&t);
  uint32_t queued = 0;
  for (uint64_t i = 0; i < d->jobs->cap; i++) {
    gs_job *j = d->jobs->by_id[i];
    if (j && j->rec->state == GPUSHARE__V1__JOB_STATE__QUEUED && !strcmp(j->rec->tenant, tenant))
      queued++;
  }
  if (max_queued && queued >= max_queued)
    return gs_err_set(e, GS_RESOURCE_EXHAUSTED, "max_queued",
                      "tenant %s already has %" PRIu32 " queued job%s, its max_queued quota; wait "
                      "for them to start or cancel one",
                      tenant, queued, queued == 1 ? "" : "s");

  gs_admission adm;
  bool auto_fit = spec->has_auto_fit && spec->auto_fit;
  rc = gs_spec_pb_job(spec, &js, e);
  if (rc == 0)
    rc = gs_plan_admit_policy(&js, device_backend(), v.memory_limit, vdev_policy(&v), auto_fit,
                              &adm, e);
  gs_spec_pb_job_free(&js);
  if (rc < 0) {
    gs_err_prefix(e, "spec");
    return -1;
  }
  if (!adm.fits) {
    c->resp->plan = plan_msg(&c->ar, &adm.plan, v.memory_limit, vdev_policy(&v));
    gs_err_set(e, GS_RESOURCE_EXHAUSTED, "spec.batch_size", "%s", adm.why);
    gs_admission_free(&adm);
    return -1;
  }

  /* The record, written whole in one transaction. */
  Gpushare__V1__Job rec = GPUSHARE__V1__JOB__INIT;
  rec.has_id = rec.has_state = rec.has_submitted_unix = rec.has_micro_batch = 1;
  rec.has_accumulation_steps = rec.has_planned_peak_bytes = rec.has_priority = 1;
  rec.name = spec->name ? spec->name : "";
  rec.tenant = (char *)tenant;
  rec.vdev = v.name;
  rec.device = v.device;
  rec.state = GPUSHARE__V1__JOB_STATE__QUEUED;
  rec.submitted_unix = (int64_t)(now_ms() / 1000);
  rec.micro_batch = adm.micro_batch;
  rec.accumulation_steps = adm.accumulation_steps;
  rec.planned_peak_bytes = adm.plan.peak_bytes;
  rec.priority = spec->has_priority ? spec->priority : 0;
  rec.spec = (Gpushare__V1__JobSpec *)spec;
  gs_job_row row = {.state = rec.state, .priority = rec.priority,
                    .submitted_ms = (int64_t)now_ms()};
  snprintf(row.tenant, sizeof row.tenant, "%s", tenant);
  snprintf(row.vdev, sizeof row.vdev, "%s", v.name);
  uint64_t id = 0;
  uint8_t *buf = NULL;
  if (gs_store_txn_begin(d->store, e) < 0) goto fail;
  if (gs_store_job_insert(d->store, &row, &id, e) < 0) goto rollback;
  rec.id = id;
  size_t n = gpushare__v1__job__get_packed_size(&rec);
  buf = malloc(n ? n : 1);
  if (!buf) {
    gs_err_set(e, GS_INTERNAL, "", "out of memory");
    goto rollback;
  }
  gpushare__v1__job__pack(&rec, buf);
  if (gs_store_job_update(d->store, id, rec.state, 0, buf, n, e) < 0) goto rollback;
  if (gs_store_txn_commit(d->store, e) < 0) goto fail;
  gs_job *j = calloc(1, sizeof *j);
  Gpushare__V1__Job *owned = gpushare__v1__job__unpack(NULL, n, buf);
  free(buf);
  buf = NULL;
  if (!j || !owned || job_put(d, (j->rec = owned, j)) < 0) {
    /* Stored, so not lost: the next start picks it up. */
    free(j);
    if (owned) gpushare__v1__job__free_unpacked(owned, NULL);
    gs_admission_free(&adm);
    return gs_err_set(e, GS_INTERNAL, "", "job %" PRIu64 " is stored but gpushared ran out of memory", id);
  }
  j->placed = -1;
  d->jobs->submitted++;
  char peak[32];
  gs_info("job %" PRIu64 " submitted by uid %" PRIu32 " to %s/%s: planned peak %s, micro-batch %" PRIu32
          " x %" PRIu32 "%s",
          id, c->peer->uid, tenant, v.name, gs_size_format(adm.plan.peak_bytes, peak, sizeof peak),
          adm.micro_batch, adm.accumulation_steps, adm.chosen ? " (auto-fit)" : "");
  Gpushare__V1__JobEvent ev;
  char msg[256];
  if (adm.chosen)
    snprintf(msg, sizeof msg, "QUEUED: auto_fit chose micro-batch %" PRIu32 " x %" PRIu32 " accumulation steps",
             adm.micro_batch, adm.accumulation_steps);
  else
    snprintf(msg, sizeof msg, "QUEUED");
  state_event(j, &ev, msg);
  log_event(d, j, &ev);
  /* It may start at once; the answer shows it as it then is. (The view
   * shares the record's strings, so it is taken after any change.) */
  schedule(d);
  Gpushare__V1__SubmitResponse *m =
      AR_MSG(&c->ar, Gpushare__V1__SubmitResponse, GPUSHARE__V1__SUBMIT_RESPONSE__INIT);
  if (m) {
    m->job = job_view(&c->ar, j, false);
    m->plan = plan_msg(&c->ar, &adm.plan, v.memory_limit, vdev_policy(&v));
  }
  gs_admission_free(&adm);
  if (!m) return gs_err_set(e, GS_INTERNAL, "", "out of memory");
  c->resp->result_case = GPUSHARE__V1__RESPONSE__RESULT_SUBMIT;
  c->resp->submit = m;
  return 0;
rollback:
  gs_store_txn_rollback(d->store);
fail:
  free(buf);
  gs_admission_free(&adm);
  return -1;
}

/* ---------------------------------------------------------- job queries --- */

static int visible_job(call_ctx *c, uint64_t id, bool has, gs_job **out, gs_err *e) {
  if (!has || id == 0)
    return gs_err_set(e, GS_INVALID_ARGUMENT, "id", "no job id given (ids start at 1)");
  gs_job *j = job_get(c->d, id);
  /* Another tenant's job is not there as far as this peer can tell. */
  if (!j || (!c->id.admin && strcmp(j->rec->tenant, c->id.tenant) != 0))
    return gs_err_set(e, GS_NOT_FOUND, "id", "no job %" PRIu64 "%s%s", id,
                      c->id.tenant[0] ? " for tenant " : "", c->id.tenant);
  *out = j;
  return 0;
}

int gs_rpc_job_status(call_ctx *c, const Gpushare__V1__Request *rq, gs_err *e) {
  gs_job *j;
  if (visible_job(c, rq->job_status->id, rq->job_status->has_id, &j, e) < 0) return -1;
  Gpushare__V1__JobStatusResponse *m =
      AR_MSG(&c->ar, Gpushare__V1__JobStatusResponse, GPUSHARE__V1__JOB_STATUS_RESPONSE__INIT);
  if (!m || !(m->job = job_view(&c->ar, j, true))) return gs_err_set(e, GS_INTERNAL, "", "out of memory");
  c->resp->result_case = GPUSHARE__V1__RESPONSE__RESULT_JOB_STATUS;
  c->resp->job_status = m;
  return 0;
}

int gs_rpc_list_jobs(call_ctx *c, const Gpushare__V1__Request *rq, gs_err *e) {
  bool all = rq->list_jobs->has_all && rq->list_jobs->all;
  if (all && !c->id.admin)
    return gs_err_set(e, GS_PERMISSION_DENIED, "all",
                      "--all lists every tenant's jobs and needs an admin; uid %" PRIu32 " is not one",
                      c->peer->uid);
  gs_jobs *J = c->d->jobs;
  Gpushare__V1__ListJobsResponse *m =
      AR_MSG(&c->ar, Gpushare__V1__ListJobsResponse, GPUSHARE__V1__LIST_JOBS_RESPONSE__INIT);
  if (m) m->job = ar_alloc(&c->ar, (J->cap + 1) * sizeof *m->job);
  for (uint64_t i = 0; m && m->job && i < J->cap; i++) {
    gs_job *j = J->by_id[i];
    if (!j) continue;
    bool mine = c->id.tenant[0] && !strcmp(j->rec->tenant, c->id.tenant);
    if (!mine && !all) continue;
    Gpushare__V1__Job *v = job_view(&c->ar, j, false);
    if (v) m->job[m->n_job++] = v;
  }
  if (!m || c->ar.failed) return gs_err_set(e, GS_INTERNAL, "", "out of memory");
  c->resp->result_case = GPUSHARE__V1__RESPONSE__RESULT_LIST_JOBS;
  c->resp->list_jobs = m;
  return 0;
}

int gs_rpc_watch(call_ctx *c, const Gpushare__V1__Request *rq, gs_err *e) {
  gs_job *j;
  if (visible_job(c, rq->watch->id, rq->watch->has_id, &j, e) < 0) return -1;
  /* Its events carry the request id: two watches under one id on one
   * connection could not be told apart. */
  for (uint64_t i = 0; i < c->d->jobs->cap; i++) {
    const gs_job *o = c->d->jobs->by_id[i];
    for (const watcher *x = o ? o->watchers : NULL; x; x = x->next)
      if (x->conn == c->conn && x->req_id == c->req_id)
        return gs_err_set(e, GS_INVALID_ARGUMENT, "",
                          "request id %" PRIu64 " is already the id of this connection's watch "
                          "of job %" PRIu64 ", which has not ended; give each call in flight its "
                          "own id",
                          c->req_id, o->rec->id);
  }
  Gpushare__V1__JobEvent ev;
  char msg[1200];
  /* The same words a live watcher got when the job ended. */
  snprintf(msg, sizeof msg, "%s%s%s", state_name(j->rec->state), j->rec->reason ? ": " : "",
           j->rec->reason ? j->rec->reason : "");
  state_event(j, &ev, final_state(j->rec->state) ? msg : NULL);
  if (final_state(j->rec->state)) {
    send_watch(c->conn, c->req_id, &ev, true);
    c->deferred = true;
    return 0;
  }
  watcher *w = calloc(1, sizeof *w);
  if (!w) return gs_err_set(e, GS_INTERNAL, "", "out of memory");
  w->conn = c->conn;
  w->req_id = c->req_id;
  w->next = j->watchers;
  j->watchers = w;
  send_watch(c->conn, c->req_id, &ev, false);
  c->deferred = true;
  return 0;
}

int gs_rpc_cancel(call_ctx *c, const Gpushare__V1__Request *rq, gs_err *e) {
  gs_job *j;
  if (visible_job(c, rq->cancel->id, rq->cancel->has_id, &j, e) < 0) return -1;
  gs_daemon *d = c->d;
  if (final_state(j->rec->state))
    return gs_err_set(e, GS_FAILED_PRECONDITION, "id", "job %" PRIu64 " has already ended (%s)",
                      j->rec->id, state_name(j->rec->state));
  char who[96];
  snprintf(who, sizeof who, "cancelled by uid %" PRIu32, c->peer->uid);
  if (j->placed >= 0) {
    j->cancel_requested = true;
    /* Stored before the answer: a cancel acknowledged is a cancel kept,
     * even when the daemon dies before the executor stops the job
     * (gs_jobs_init ends such a job CANCELLED; test_faults). */
    j->rec->has_cancel_requested = j->rec->cancel_requested = 1;
    set_str(&j->rec->reason, who);
    persist(d, j);
    Gpushare__Exec__V1__CancelJob cj = GPUSHARE__EXEC__V1__CANCEL_JOB__INIT;
    cj.has_job_id = 1;
    cj.job_id = j->rec->id;
    Gpushare__Exec__V1__ToExecutor m = GPUSHARE__EXEC__V1__TO_EXECUTOR__INIT;
    m.msg_case = GPUSHARE__EXEC__V1__TO_EXECUTOR__MSG_CANCEL;
    m.cancel = &cj;
    if (gs_executor_send(d->jobs->exec[j->placed], &m) < 0) {
      job_transition(d, j, GPUSHARE__V1__JOB_STATE__CANCELLED, who);
      schedule(d);
    } else {
      set_str(&j->rec->reason, who);
    }
  } else {
    job_transition(d, j, GPUSHARE__V1__JOB_STATE__CANCELLED, who);
    schedule(d);
  }
  Gpushare__V1__CancelResponse *m =
      AR_MSG(&c->ar, Gpushare__V1__CancelResponse, GPUSHARE__V1__CANCEL_RESPONSE__INIT);
  if (!m || !(m->job = job_view(&c->ar, j, false))) return gs_err_set(e, GS_INTERNAL, "", "out of memory");
  c->resp->result_case = GPUSHARE__V1__RESPONSE__RESULT_CANCEL;
  c->resp->cancel = m;
  return 0;
}

typedef struct log_ctx {
  arena *a;
  Gpushare__V1__LogsResponse *m;
  size_t cap;
} log_ctx;

/* protobuf-c allocations served from the request's arena: unpacked events
 * then live exactly as long as the response they are part of. */
static void *pb_arena_alloc(void *data, size_t size) { return ar_alloc(data, size); }
static void pb_arena_free(void *data, void *p) {
  (void)data;
  (void)p;
}

static void collect_event(void *u, const uint8_t *rec, size_t len) {
  log_ctx *l = u;
  ProtobufCAllocator pa = {.alloc = pb_arena_alloc, .free = pb_arena_free, .allocator_data = l->a};
  Gpushare__V1__JobEvent *ev = gpushare__v1__job_event__unpack(&pa, len, rec);
  if (!ev) return;
  if (l->m->n_event == l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 16;
    Gpushare__V1__JobEvent **p = ar_alloc(l->a, cap * sizeof *p);
    if (!p) return;
    if (l->m->n_event) memcpy(p, l->m->event, l->m->n_event * sizeof *p);
    l->m->event = p;
    l->cap = cap;
  }
  l->m->event[l->m->n_event++] = ev;
}

int gs_rpc_logs(call_ctx *c, const Gpushare__V1__Request *rq, gs_err *e) {
  gs_job *j = NULL;
  if (visible_job(c, rq->logs->id, rq->logs->has_id, &j, e) < 0) return -1;
  Gpushare__V1__LogsResponse *m =
      AR_MSG(&c->ar, Gpushare__V1__LogsResponse, GPUSHARE__V1__LOGS_RESPONSE__INIT);
  if (!m) return gs_err_set(e, GS_INTERNAL, "", "out of memory");
  log_ctx l = {&c->ar, m, 0};
  if (gs_store_job_events(c->d->store, j->rec->id, collect_event, &l, e) < 0) return -1;
  c->resp->result_case = GPUSHARE__V1__RESPONSE__RESULT_LOGS;
  c->resp->logs = m;
  return 0;
}

int gs_rpc_fetch(call_ctx *c, const Gpushare__V1__Request *rq, gs_err *e) {
  const Gpushare__V1__FetchRequest *r = rq->fetch;
  gs_job *j;
  if (visible_job(c, r->id, r->has_id, &j, e) < 0) return -1;
  bool ckpt = r->has_checkpoint && r->checkpoint;
  if (!ckpt && j->rec->state != GPUSHARE__V1__JOB_STATE__SUCCEEDED)
    return gs_err_set(e, GS_FAILED_PRECONDITION, "id",
                      "job %" PRIu64 " is %s: trained weights exist once it has SUCCEEDED "
                      "(--checkpoint fetches its last checkpoint)",
                      j->rec->id, state_name(j->rec->state));
  char path[4200];
  job_file(c->d, j->rec->id, ckpt ? "checkpoint.ckpt" : "model.safetensors", path, sizeof path);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return gs_err_set(e, GS_NOT_FOUND, "id", "job %" PRIu64 " has no %s yet", j->rec->id,
                      ckpt ? "checkpoint" : "exported weights");
  struct stat st;
  fstat(fd, &st);
  uint64_t total = (uint64_t)st.st_size, off = r->has_offset ? r->offset : 0;
  if (off > total) {
    close(fd);
    return gs_err_set(e, GS_INVALID_ARGUMENT, "offset",
                      "offset %" PRIu64 " is past the end of the file (%" PRIu64 " bytes)", off, total);
  }
  size_t chunk = total - off > (1u << 20) ? (1u << 20) : (size_t)(total - off);
  uint8_t *buf = ar_alloc(&c->ar, chunk + 1);
  ssize_t got = buf ? pread(fd, buf, chunk, (off_t)off) : -1;
  close(fd);
  if (got < 0 || (size_t)got != chunk) return gs_err_set(e, GS_INTERNAL, "", "cannot read %s", path);
  Gpushare__V1__FetchResponse *m =
      AR_MSG(&c->ar, Gpushare__V1__FetchResponse, GPUSHARE__V1__FETCH_RESPONSE__INIT);
  if (!m) return gs_err_set(e, GS_INTERNAL, "", "out of memory");
  m->has_data = m->has_offset = m->has_total_bytes = m->has_last = 1;
  m->data.data = buf;
  m->data.len = chunk;
  m->offset = off;
  m->total_bytes = total;
  m->last = off + chunk == total;
  c->resp->result_case = GPUSHARE__V1__RESPONSE__RESULT_FETCH;
  c->resp->fetch = m;
  return 0;
}

int gs_rpc_memory(call_ctx *c, const Gpushare__V1__Request *rq, gs_err *e) {
  gs_job *j = NULL;
  if (visible_job(c, rq->memory->id, rq->memory->has_id, &j, e) < 0) return -1;
  Gpushare__V1__MemoryResponse *m =
      AR_MSG(&c->ar, Gpushare__V1__MemoryResponse, GPUSHARE__V1__MEMORY_RESPONSE__INIT);
  if (!m) return gs_err_set(e, GS_INTERNAL, "", "out of memory");
  if (j->rec->timeline) {
    m->timeline = j->rec->timeline;
  } else {
    Gpushare__V1__MemoryTimeline *t =
        AR_MSG(&c->ar, Gpushare__V1__MemoryTimeline, GPUSHARE__V1__MEMORY_TIMELINE__INIT);
    if (!t) return gs_err_set(e, GS_INTERNAL, "", "out of memory");
    t->has_planned_peak_bytes = 1;
    t->planned_peak_bytes = j->rec->planned_peak_bytes;
    m->timeline = t;
  }
  c->resp->result_case = GPUSHARE__V1__RESPONSE__RESULT_MEMORY;
  c->resp->memory = m;
  return 0;
}

/* ------------------------------------------------------------- metrics --- */

typedef struct text {
  char *buf;
  size_t len, cap;
  bool failed;
} text;

__attribute__((format(printf, 2, 3))) static void tprintf(text *t, const char *fmt, ...) {
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(t->buf ? t->buf + t->len : NULL, t->buf ? t->cap - t->len : 0, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if (t->buf && t->len + (size_t)n < t->cap) {
      t->len += (size_t)n;
      return;
    }
    size_t cap = (t->cap ? t->cap * 2 : 8192) + (size_t)n;
    char *p = realloc(t->buf, cap);
    if (!p) {
      t->failed = true;
      return;
    }
    t->buf = p;
    t->cap = cap;
  }
}

static void metric(text *t, const char *name, const char *type, const char *help) {
  tprintf(t, "# HELP gpushare_%s %s\n# TYPE gpushare_%s %s\n", name, help, name, type);
}

int gs_rpc_metrics(call_ctx *c, const Gpushare__V1__Request *rq, gs_err *e) {
  (void)rq;
  gs_daemon *d = c->d;
  gs_jobs *J = d->jobs;
  text t = {0};
  gs_vdev *vdevs = NULL;
  size_t nv = 0;
  gs_tenant *tenants = NULL;
  size_t nt = 0;
  if (gs_store_vdev_list(d->store, &vdevs, &nv, e) < 0) return -1;
  if (gs_store_tenant_list(d->store, &tenants, &nt, e) < 0) {
    free(vdevs);
    return -1;
  }
  metric(&t, "device_memory_total_bytes", "gauge", "Physical memory of the device.");
  for (size_t i = 0; i < d->devices.n; i++)
    tprintf(&t, "gpushare_device_memory_total_bytes{device=\"%s\"} %" PRIu64 "\n", d->devices.dev[i].name, d->devices.dev[i].total);
  metric(&t, "device_memory_usable_bytes", "gauge", "Memory of the device that vdev limits may add up to.");
  for (size_t i = 0; i < d->devices.n; i++)
    tprintf(&t, "gpushare_device_memory_usable_bytes{device=\"%s\"} %" PRIu64 "\n", d->devices.dev[i].name, d->devices.dev[i].usable);
  metric(&t, "device_memory_allocated_bytes", "gauge", "Sum of the memory limits of the device's vdevs.");
  for (size_t i = 0; i < d->devices.n; i++) {
    gs_device_usage u = {0};
    gs_store_device_usage(d->store, d->devices.dev[i].name, &u, NULL);
    tprintf(&t, "gpushare_device_memory_allocated_bytes{device=\"%s\"} %" PRIu64 "\n", d->devices.dev[i].name, u.memory);
  }
  metric(&t, "executor_restarts_total", "counter", "Times the device's executor was restarted after dying.");
  for (size_t i = 0; i < d->devices.n; i++)
    tprintf(&t, "gpushare_executor_restarts_total{device=\"%s\"} %" PRIu32 "\n", d->devices.dev[i].name,
            J && J->exec[i] ? gs_executor_restarts(J->exec[i]) : 0);

  static const struct { const char *name, *type, *help; } vm[] = {
      {"vdev_memory_limit_bytes", "gauge", "Memory limit of the vdev."},
      {"vdev_memory_in_use_bytes", "gauge", "Bytes of the vdev's live tensors."},
      {"vdev_memory_reserved_bytes", "gauge", "Bytes the vdev holds from its device."},
      {"vdev_memory_peak_bytes", "gauge", "Peak bytes in use in the vdev."},
      {"vdev_device_seconds_total", "counter", "Device time the vdev's jobs used."},
      {"vdev_steps_total", "counter", "Optimizer steps run in the vdev."},
      {"vdev_queue_length", "gauge", "Jobs queued in the vdev."},
      {"vdev_running_jobs", "gauge", "Jobs running in the vdev."},
  };
  for (size_t k = 0; k < sizeof vm / sizeof vm[0]; k++) {
    metric(&t, vm[k].name, vm[k].type, vm[k].help);
    for (size_t i = 0; i < nv; i++) {
      vdev_live zero = {0}, *l = &zero;
      for (size_t x = 0; J && x < J->n_live; x++)
        if (!strcmp(J->live[x].name, vdevs[i].name)) l = &J->live[x];
      uint64_t queued = 0, running = 0;
      for (uint64_t x = 0; J && x < J->cap; x++) {
        gs_job *j = J->by_id[x];
        if (!j || strcmp(j->rec->vdev, vdevs[i].name)) continue;
        queued += j->rec->state == GPUSHARE__V1__JOB_STATE__QUEUED;
        running += j->rec->state == GPUSHARE__V1__JOB_STATE__RUNNING;
      }
      tprintf(&t, "gpushare_%s{vdev=\"%s\",device=\"%s\",tenant=\"%s\"} ", vm[k].name, vdevs[i].name,
              vdevs[i].device, vdevs[i].tenant);
      switch (k) {
      case 0: tprintf(&t, "%" PRIu64 "\n", vdevs[i].memory_limit); break;
      case 1: tprintf(&t, "%" PRIu64 "\n", l->in_use); break;
      case 2: tprintf(&t, "%" PRIu64 "\n", l->reserved); break;
      case 3: tprintf(&t, "%" PRIu64 "\n", l->peak); break;
      case 4: tprintf(&t, "%.3f\n", l->device_seconds); break;
      case 5: tprintf(&t, "%" PRIu64 "\n", l->steps); break;
      case 6: tprintf(&t, "%" PRIu64 "\n", queued); break;
      default: tprintf(&t, "%" PRIu64 "\n", running); break;
      }
    }
  }
  metric(&t, "tenant_memory_quota_bytes", "gauge", "Memory quota of the tenant (0: unlimited).");
  for (size_t i = 0; i < nt; i++)
    tprintf(&t, "gpushare_tenant_memory_quota_bytes{tenant=\"%s\"} %" PRIu64 "\n", tenants[i].name, tenants[i].quota.memory);
  metric(&t, "tenant_memory_allocated_bytes", "gauge", "Sum of the memory limits of the tenant's vdevs.");
  for (size_t i = 0; i < nt; i++)
    tprintf(&t, "gpushare_tenant_memory_allocated_bytes{tenant=\"%s\"} %" PRIu64 "\n", tenants[i].name, tenants[i].memory_allocated);
  metric(&t, "tenant_jobs", "gauge", "Jobs of the tenant by state.");
  for (size_t i = 0; i < nt; i++)
    for (int s = 0; s < 5; s++) {
      uint64_t n = 0;
      for (uint64_t x = 0; J && x < J->cap; x++)
        n += J->by_id[x] && (int)J->by_id[x]->rec->state == s && !strcmp(J->by_id[x]->rec->tenant, tenants[i].name);
      tprintf(&t, "gpushare_tenant_jobs{tenant=\"%s\",state=\"%s\"} %" PRIu64 "\n", tenants[i].name, state_name(s), n);
    }
  metric(&t, "jobs", "gauge", "Jobs by state.");
  for (int s = 0; s < 5; s++) {
    uint64_t n = 0;
    for (uint64_t x = 0; J && x < J->cap; x++) n += J->by_id[x] && (int)J->by_id[x]->rec->state == s;
    tprintf(&t, "gpushare_jobs{state=\"%s\"} %" PRIu64 "\n", state_name(s), n);
  }
  metric(&t, "job_step", "gauge", "Optimizer steps done by the job.");
  for (uint64_t x = 0; J && x < J->cap; x++) {
    gs_job *j = J->by_id[x];
    if (j && j->rec->state == GPUSHARE__V1__JOB_STATE__RUNNING)
      tprintf(&t, "gpushare_job_step{job=\"%" PRIu64 "\",tenant=\"%s\",vdev=\"%s\"} %" PRIu64 "\n", j->rec->id,
              j->rec->tenant, j->rec->vdev, j->rec->step);
  }
  metric(&t, "job_planned_peak_bytes", "gauge", "Planned peak memory of the job.");
  for (uint64_t x = 0; J && x < J->cap; x++) {
    gs_job *j = J->by_id[x];
    if (j && !final_state(j->rec->state))
      tprintf(&t, "gpushare_job_planned_peak_bytes{job=\"%" PRIu64 "\",tenant=\"%s\",vdev=\"%s\"} %" PRIu64 "\n",
              j->rec->id, j->rec->tenant, j->rec->vdev, j->rec->planned_peak_bytes);
  }
  metric(&t, "requests_total", "counter", "Requests served on the control socket since start.");
  tprintf(&t, "gpushare_requests_total %" PRIu64 "\n", d->requests);
  free(vdevs);
  gs_tenant_list_free(tenants, nt);
  if (t.failed) {
    free(t.buf);
    return gs_err_set(e, GS_INTERNAL, "", "out of memory");
  }
  Gpushare__V1__MetricsResponse *m =
      AR_MSG(&c->ar, Gpushare__V1__MetricsResponse, GPUSHARE__V1__METRICS_RESPONSE__INIT);
  if (m) m->text = ar_strdup(&c->ar, t.buf ? t.buf : "");
  free(t.buf);
  if (!m || !m->text) return gs_err_set(e, GS_INTERNAL, "", "out of memory");
  c->resp->result_case = GPUSHARE__V1__RESPONSE__RESULT_METRICS;
  c->resp->metrics = m;
  return 0;
}
