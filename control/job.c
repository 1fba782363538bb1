/*
 * job.c: the job records and their state machine (see job.h).
 *
 * The table is an array indexed by job id (ids are dense, handed out by the
 * store). gs_job_legal is the one place that says which state may follow
 * which; gs_job_transition is the one place a state changes. Scheduling
 * (sched.c), the executors' reports (exec_events.c) and the calls
 * (rpc_jobs.c) all change jobs through here; this module calls none of
 * them: whoever wants to hear of events registers a sink.
 */
#include "control/job.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "control/log.h"
#include "control/store.h"

/* A job's record keeps the metrics of its last GS_EPOCHS_KEPT epochs (an
 * epoch end is stored at most once a second: exec_events.c). */
#define GS_EPOCHS_KEPT 1000

uint64_t gs_job_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

const char *gs_job_state_name(int s) {
  static const char *const n[] = {"QUEUED", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED",
                                  "PREEMPTED"};
  return s >= 0 && s < GS_JOB_STATES ? n[s] : "UNKNOWN";
}

bool gs_job_final(int s) {
  return s == GPUSHARE__V1__JOB_STATE__SUCCEEDED || s == GPUSHARE__V1__JOB_STATE__FAILED ||
         s == GPUSHARE__V1__JOB_STATE__CANCELLED;
}

bool gs_job_waiting(int s) {
  return s == GPUSHARE__V1__JOB_STATE__QUEUED || s == GPUSHARE__V1__JOB_STATE__PREEMPTED;
}

bool gs_job_legal(int from, int to) {
  switch (from) {
  case GPUSHARE__V1__JOB_STATE__QUEUED:
  case GPUSHARE__V1__JOB_STATE__PREEMPTED:
    return to == GPUSHARE__V1__JOB_STATE__RUNNING || to == GPUSHARE__V1__JOB_STATE__CANCELLED;
  case GPUSHARE__V1__JOB_STATE__RUNNING:
    return to == GPUSHARE__V1__JOB_STATE__SUCCEEDED || to == GPUSHARE__V1__JOB_STATE__FAILED ||
           to == GPUSHARE__V1__JOB_STATE__CANCELLED || to == GPUSHARE__V1__JOB_STATE__PREEMPTED ||
           to == GPUSHARE__V1__JOB_STATE__QUEUED;
  default:
    return false; /* final */
  }
}

void *gs_job_msg_dup(const ProtobufCMessage *m) {
  size_t n = protobuf_c_message_get_packed_size(m);
  uint8_t *buf = malloc(n ? n : 1);
  if (!buf) return NULL;
  protobuf_c_message_pack(m, buf);
  void *r = protobuf_c_message_unpack(m->descriptor, NULL, n, buf);
  free(buf);
  return r;
}

void gs_job_set_str(char **field, const char *v) {
  free(*field);
  *field = v ? strdup(v) : NULL;
}

void gs_job_dir(const gs_daemon *d, uint64_t id, char *buf, size_t len) {
  snprintf(buf, len, "%s/jobs/%" PRIu64, d->cfg.state_dir, id);
}
void gs_job_file(const gs_daemon *d, uint64_t id, const char *name, char *buf, size_t len) {
  snprintf(buf, len, "%s/jobs/%" PRIu64 "/%s", d->cfg.state_dir, id, name);
}

gs_job *gs_job_get(gs_daemon *d, uint64_t id) {
  gs_jobs *J = d->jobs;
  return J && id < J->cap ? J->by_id[id] : NULL;
}

/* FNV-1a over a message's packed bytes and their length. */
static uint64_t hash_msg(uint64_t h, const ProtobufCMessage *m) {
  uint8_t small[256], *b = small;
  size_t n = m ? protobuf_c_message_get_packed_size(m) : 0;
  if (n > sizeof small && !(b = malloc(n))) return h ^ n;
  if (n) protobuf_c_message_pack(m, b);
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
  for (int i = 0; i < 8; i++) h = (h ^ ((n >> (8 * i)) & 0xff)) * 0x100000001b3ull;
  if (b != small) free(b);
  return h;
}

/* What the executor loads a job's datasets from, as a key: jobs of one
 * key share one copy (the scheduler charges it once per vdev). */
static uint64_t data_key_of(const Gpushare__V1__JobSpec *s) {
  uint64_t h = 0xcbf29ce484222325ull;
  h = hash_msg(h, s && s->train ? &s->train->base : NULL);
  h = hash_msg(h, s && s->test ? &s->test->base : NULL);
  return hash_msg(h, s && s->model && s->model->input ? &s->model->input->base : NULL);
}

static int job_put(gs_daemon *d, gs_job *j) {
  gs_jobs *J = d->jobs;
  j->data_key = data_key_of(j->rec->spec);
  uint64_t id = j->rec->id;
  if (id >= J->cap) {
    uint64_t cap = J->cap ? J->cap : 64;
    while (cap <= id) cap *= 2;
    gs_job **p = realloc(J->by_id, cap * sizeof *p);
    if (!p) return -ENOMEM;
    memset(p + J->cap, 0, (cap - J->cap) * sizeof *p);
    J->by_id = p;
    J->cap = cap;
  }
  J->by_id[id] = j;
  return 0;
}

int gs_job_add(gs_daemon *d, Gpushare__V1__Job *rec, gs_job **out, gs_err *e) {
  gs_job *j = calloc(1, sizeof *j);
  if (!j || (j->rec = rec, job_put(d, j)) < 0) {
    free(j);
    return gs_err_set(e, GS_INTERNAL, "", "out of memory");
  }
  j->placed = -1;
  d->jobs->submitted++;
  *out = j;
  return 0;
}

/* The record is on disk: the events held for it go out, in order. */
static void job_saved(gs_daemon *d, gs_job *j) {
  gs_jobs *J = d->jobs;
  if (j->unsaved) {
    j->unsaved = false;
    J->unsaved--;
    gs_info("job %" PRIu64 ": its state is on disk again (%s)", j->rec->id,
            gs_job_state_name(j->rec->state));
  }
  if (j->state_unsaved) {
    j->state_unsaved = false;
    gs_job_set_str(&j->saved.reason, NULL);
  }
  gs_job_held *held = j->held;
  size_t n = j->n_held;
  j->held = NULL;
  j->n_held = 0;
  for (size_t i = 0; i < n; i++) {
    Gpushare__V1__JobEvent *ev = gpushare__v1__job_event__unpack(NULL, held[i].len, held[i].ev);
    if (ev) {
      gs_job_log_event(d, j, ev);
      if (J->sink) J->sink(J->sink_arg, j, ev, held[i].final);
      gpushare__v1__job_event__free_unpacked(ev, NULL);
    }
    free(held[i].ev);
  }
  free(held);
}

int gs_job_persist(gs_daemon *d, gs_job *j) {
  size_t n = gpushare__v1__job__get_packed_size(j->rec);
  uint8_t *buf = malloc(n ? n : 1);
  gs_err e;
  gs_err_clear(&e);
  int rc = buf ? 0 : gs_err_set(&e, GS_INTERNAL, "", "out of memory");
  if (buf) {
    gpushare__v1__job__pack(j->rec, buf);
    rc = gs_store_job_update(d->store, j->rec->id, (int)j->rec->state, j->crashes, buf, n, &e);
  }
  free(buf);
  if (rc >= 0) {
    job_saved(d, j);
    return 0;
  }
  gs_jobs *J = d->jobs;
  snprintf(J->store_error, sizeof J->store_error, "%s", e.msg);
  if (!j->unsaved) {
    j->unsaved = true;
    J->unsaved++;
    gs_error("job %" PRIu64 ": cannot save its state (%s): %s; clients are told the stored "
             "state until it is written, tried again every second",
             j->rec->id, gs_job_state_name(j->rec->state), e.msg);
  }
  return rc;
}

uint64_t gs_jobs_save_pending(gs_daemon *d) {
  gs_jobs *J = d->jobs;
  for (uint64_t i = 0; J && J->unsaved && i < J->cap; i++)
    if (J->by_id[i] && J->by_id[i]->unsaved) gs_job_persist(d, J->by_id[i]);
  return J ? J->unsaved : 0;
}

Gpushare__V1__JobState gs_job_told_state(const gs_job *j) {
  return j->state_unsaved ? j->saved.state : j->rec->state;
}

void gs_job_told(const gs_job *j, Gpushare__V1__Job *out) {
  *out = *j->rec;
  if (!j->state_unsaved) return;
  const gs_job_saved *s = &j->saved;
  out->state = s->state;
  out->reason = s->reason;
  out->has_started_unix = s->started_unix != 0;
  out->started_unix = s->started_unix;
  out->has_finished_unix = s->finished_unix != 0;
  out->finished_unix = s->finished_unix;
}

void gs_job_log_event(gs_daemon *d, gs_job *j, const Gpushare__V1__JobEvent *ev) {
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

void gs_jobs_set_sink(gs_jobs *J, gs_job_sink fn, void *arg) {
  J->sink = fn;
  J->sink_arg = arg;
}

void gs_job_publish(gs_daemon *d, const gs_job *j, const Gpushare__V1__JobEvent *ev, bool final) {
  gs_jobs *J = d->jobs;
  /* While a state change waits for the store, progress would speak of a
   * state clients have not been told: it is dropped (the next comes). */
  if (j->state_unsaved) return;
  if (J && J->sink) J->sink(J->sink_arg, j, ev, final);
}

void gs_job_state_event(const gs_job *j, Gpushare__V1__JobEvent *ev, const char *message) {
  Gpushare__V1__JobEvent init = GPUSHARE__V1__JOB_EVENT__INIT;
  *ev = init;
  const Gpushare__V1__Job *r = j->rec;
  ev->has_job_id = ev->has_time_unix_ms = ev->has_state = 1;
  ev->job_id = r->id;
  ev->time_unix_ms = (int64_t)gs_job_now_ms();
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

/* Keep a state-change event until its record is on disk (job_saved). */
static void hold_event(gs_job *j, const Gpushare__V1__JobEvent *ev, bool final) {
  gs_job_held *p = realloc(j->held, (j->n_held + 1) * sizeof *p);
  if (!p) return;
  j->held = p;
  size_t n = gpushare__v1__job_event__get_packed_size(ev);
  uint8_t *buf = malloc(n ? n : 1);
  if (!buf) return;
  gpushare__v1__job_event__pack(ev, buf);
  p[j->n_held++] = (gs_job_held){buf, n, final};
}

int gs_job_transition(gs_daemon *d, gs_job *j, Gpushare__V1__JobState st, const char *reason) {
  Gpushare__V1__Job *r = j->rec;
  if (!gs_job_legal((int)r->state, (int)st)) {
    gs_error("job %" PRIu64 ": no move from %s to %s; it stays %s", r->id,
             gs_job_state_name(r->state), gs_job_state_name(st), gs_job_state_name(r->state));
    return -EINVAL;
  }
  /* What the store holds now, and clients are told while the new record
   * cannot be written. */
  gs_job_saved told = {r->state, NULL, r->has_started_unix ? r->started_unix : 0,
                       r->has_finished_unix ? r->finished_unix : 0};
  if (!j->state_unsaved && r->reason) told.reason = strdup(r->reason);
  r->has_state = 1;
  r->state = st;
  int64_t now = (int64_t)(gs_job_now_ms() / 1000);
  if (st == GPUSHARE__V1__JOB_STATE__RUNNING && !r->has_started_unix) {
    r->has_started_unix = 1;
    r->started_unix = now;
  }
  if (st == GPUSHARE__V1__JOB_STATE__RUNNING) {
    r->has_run_started_unix = 1;
    r->run_started_unix = now;
  }
  if (gs_job_final(st)) {
    r->has_finished_unix = 1;
    r->finished_unix = now;
    j->placed = -1;
    j->resume_pending = false;
    d->jobs->finished[st]++;
  }
  /* A reason says why a job waits or ended; one that runs has none (the
   * reason it was preempted or requeued no longer holds), and the words
   * given go to its log only. */
  if (st == GPUSHARE__V1__JOB_STATE__RUNNING) gs_job_set_str(&r->reason, NULL);
  else if (reason) gs_job_set_str(&r->reason, reason);
  int rc = gs_job_persist(d, j);
  char msg[1200];
  snprintf(msg, sizeof msg, "%s%s%s", gs_job_state_name(st), reason ? ": " : "",
           reason ? reason : "");
  Gpushare__V1__JobEvent ev;
  gs_job_state_event(j, &ev, msg);
  if (rc < 0) {
    if (!j->state_unsaved) {
      j->saved = told;
      told.reason = NULL;
      j->state_unsaved = true;
    }
    hold_event(j, &ev, gs_job_final(st));
  } else {
    gs_job_log_event(d, j, &ev);
    gs_job_publish(d, j, &ev, gs_job_final(st));
  }
  gs_job_set_str(&told.reason, NULL);
  gs_info("job %" PRIu64 " (%s/%s) %s%s", r->id, r->tenant, r->vdev ? r->vdev : "", msg,
          rc < 0 ? " (not on disk yet)" : "");
  return rc;
}

void gs_job_append_epoch(gs_job *j, const Gpushare__V1__EpochMetrics *m) {
  Gpushare__V1__Job *r = j->rec;
  Gpushare__V1__EpochMetrics **p = realloc(r->epoch, (r->n_epoch + 1) * sizeof *p);
  if (!p) return;
  r->epoch = p;
  Gpushare__V1__EpochMetrics *copy = gs_job_msg_dup(&m->base);
  if (copy) r->epoch[r->n_epoch++] = copy;
  if (r->n_epoch > GS_EPOCHS_KEPT) {
    gpushare__v1__epoch_metrics__free_unpacked(r->epoch[0], NULL);
    memmove(r->epoch, r->epoch + 1, (r->n_epoch - 1) * sizeof *r->epoch);
    r->n_epoch--;
  }
}

uint32_t gs_jobs_count(gs_daemon *d, const char *tenant, int state) {
  gs_jobs *J = d->jobs;
  uint32_t n = 0;
  for (uint64_t i = 0; J && i < J->cap; i++) {
    gs_job *j = J->by_id[i];
    if (j && (int)j->rec->state == state && (!tenant || !strcmp(j->rec->tenant, tenant))) n++;
  }
  return n;
}

static bool dataset_uses(const Gpushare__V1__Dataset *ds, const char *sha) {
  const char *refs[2] = {NULL, NULL};
  if (!ds) return false;
  switch (ds->source_case) {
  case GPUSHARE__V1__DATASET__SOURCE_IDX:
    refs[0] = ds->idx->images;
    refs[1] = ds->idx->labels;
    break;
  case GPUSHARE__V1__DATASET__SOURCE_NPY:
    refs[0] = ds->npy->images;
    refs[1] = ds->npy->labels;
    break;
  case GPUSHARE__V1__DATASET__SOURCE_TEXT: refs[0] = ds->text->path; break;
  case GPUSHARE__V1__DATASET__SOURCE_TOKENS: refs[0] = ds->tokens->path; break;
  default: return false;
  }
  for (int i = 0; i < 2; i++)
    if (refs[i] && !strncmp(refs[i], "sha256:", 7) && !strcmp(refs[i] + 7, sha)) return true;
  return false;
}

uint64_t gs_jobs_using_blob(gs_daemon *d, const char *sha256) {
  gs_jobs *J = d->jobs;
  for (uint64_t i = 0; J && i < J->cap; i++) {
    gs_job *j = J->by_id[i];
    if (j && !gs_job_final(j->rec->state) &&
        (dataset_uses(j->rec->spec->train, sha256) || dataset_uses(j->rec->spec->test, sha256)))
      return j->rec->id;
  }
  return 0;
}

/* Every jobs/ID directory keeps its id: a store restored from an older
 * backup would otherwise hand a later job's id, and its checkpoints, to a
 * new job. Directories no stored job owns are kept and reported. */
static int job_dirs_reserved(gs_daemon *d, const char *dir, gs_err *e) {
  DIR *dp = opendir(dir);
  if (!dp) return 0;
  uint64_t top = 0, orphans = 0, first = 0;
  struct dirent *de;
  while ((de = readdir(dp))) {
    char *end;
    errno = 0;
    unsigned long long id = strtoull(de->d_name, &end, 10);
    if (errno || *end || end == de->d_name || de->d_name[0] == '0') continue;
    if (id > top) top = id;
    if (!gs_job_get(d, id)) {
      if (!orphans++ || id < first) first = id;
    }
  }
  closedir(dp);
  if (orphans)
    gs_warn("%" PRIu64 " director%s under %s belong%s to no job in the store (the lowest: %" PRIu64
            "), as after restoring an older backup; kept, and no new job takes their ids",
            orphans, orphans == 1 ? "y" : "ies", dir, orphans == 1 ? "s" : "", first);
  return top ? gs_store_job_ids_above(d->store, top, e) : 0;
}

int gs_jobs_load(gs_daemon *d, gs_err *e) {
  gs_jobs *J = calloc(1, sizeof *J);
  if (!J) return gs_err_set(e, GS_INTERNAL, "", "out of memory");
  d->jobs = J;
  char dir[PATH_MAX];
  snprintf(dir, sizeof dir, "%s/jobs", d->cfg.state_dir);
  if (mkdir(dir, 0750) < 0 && errno != EEXIST)
    return gs_err_set(e, GS_FAILED_PRECONDITION, "state_dir", "cannot create %s: %s", dir,
                      strerror(errno));
  gs_job_row *rows;
  size_t n;
  if (gs_store_job_list(d->store, &rows, &n, e) < 0) return gs_err_rc(e);
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
    } else if (gs_job_waiting(rec->state)) {
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
      gs_job_transition(d, j, GPUSHARE__V1__JOB_STATE__CANCELLED, why);
    }
  }
  gs_store_job_rows_free(rows, n);
  /* Each job to resume says in its log how the last daemon left it. */
  for (uint64_t i = 0; i < d->jobs->cap; i++) {
    gs_job *j = d->jobs->by_id[i];
    if (!j || !j->resume_pending) continue;
    Gpushare__V1__JobEvent ev;
    gs_job_state_event(j, &ev,
                       j->rec->shutdown_checkpoint
                           ? "gpushared started again: resuming from the checkpoint written "
                             "when it stopped"
                           : "gpushared started again after stopping without checkpointing "
                             "this job (a crash, kill -9 or power loss): resuming from its last "
                             "checkpoint; the steps after it run again");
    gs_job_log_event(d, j, &ev);
    if (j->rec->shutdown_checkpoint) {
      j->rec->shutdown_checkpoint = 0;
      gs_job_persist(d, j);
    }
  }
  if (n) gs_info("%zu job%s in the store: %u to resume, %u queued", n, n == 1 ? "" : "s", resumed, queued);
  return job_dirs_reserved(d, dir, e);
}

void gs_jobs_free(gs_daemon *d) {
  gs_jobs *J = d->jobs;
  if (!J) return;
  for (uint64_t i = 0; i < J->cap; i++) {
    gs_job *j = J->by_id[i];
    if (!j) continue;
    gpushare__v1__job__free_unpacked(j->rec, NULL);
    for (size_t k = 0; k < j->n_held; k++) free(j->held[k].ev);
    free(j->held);
    free(j->saved.reason);
    free(j);
  }
  free(J->by_id);
  free(J);
  d->jobs = NULL;
}
