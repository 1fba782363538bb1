/*
 * rpc_jobs.c: the job calls: plan, submit, job_status, list_jobs, watch,
 * cancel, logs, fetch, memory, usage; and the watch streams.
 *
 * Submit validates (field path and reason on error), asks admit.c whether
 * the job's plan fits its vdev (auto-fitting when the spec allows), writes
 * the job QUEUED in one store transaction, adds it to the job table
 * (job.c) and runs the queues (exec_events.c), answering with the job as
 * it then stands. A tenant sees its own jobs only: another tenant's job
 * is "not found".
 *
 * A watch is a stream: the current state at once, then every event of the
 * job until its final one. The streams are kept here (d->watches); this
 * module is job.c's event sink, and each connection holding a watch has a
 * close hook (server.h) that drops its streams.
 */
#include "control/rpc_jobs.h"

#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/size.h"
#include "control/admit.h"
#include "control/exec_events.h"
#include "control/job.h"
#include "control/log.h"
#include "control/server.h"
#include "control/store.h"
#include "control/usage.h"

typedef struct watcher {
  gs_conn *conn;
  uint64_t req_id;
  uint64_t job;
  struct watcher *next;
} watcher;

struct gs_watches {
  watcher *list;
};

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
  gs_server_send(conn, &r);
}

/* job.c's sink: every event to the job's watchers; a final one ends
 * their streams. */
static void broadcast(void *arg, const gs_job *j, const Gpushare__V1__JobEvent *ev, bool final) {
  gs_daemon *d = arg;
  if (!d->watches) return;
  for (watcher *w = d->watches->list; w; w = w->next)
    if (w->job == j->rec->id) send_watch(w->conn, w->req_id, ev, final);
  if (!final) return;
  for (watcher **pp = &d->watches->list; *pp;) {
    watcher *w = *pp;
    if (w->job == j->rec->id) {
      *pp = w->next;
      free(w);
    } else {
      pp = &w->next;
    }
  }
}

static void conn_closed(void *arg, gs_conn *conn) {
  gs_daemon *d = arg;
  if (!d->watches) return;
  for (watcher **pp = &d->watches->list; *pp;) {
    watcher *w = *pp;
    if (w->conn == conn) {
      *pp = w->next;
      free(w);
    } else {
      pp = &w->next;
    }
  }
}

void gs_rpc_jobs_free(gs_daemon *d) {
  if (!d->watches) return;
  for (watcher *w = d->watches->list, *n; w; w = n) {
    n = w->next;
    free(w);
  }
  free(d->watches);
  d->watches = NULL;
}

/* The vdev a job goes to: the named one (the tenant's own), or the tenant's
 * only vdev when none is named. Submit and plan choose alike; `how` says
 * how the caller names one ("vdev: \"NAME\" in the job or gpuctl submit
 * --vdev NAME"). A tenant of several vdevs is told their names. With
 * `none_ok`, a caller without a vdev (an admin of no tenant, a tenant
 * without vdevs) gets *has false instead of an error. */
static int job_vdev(gs_call *c, const char *name, const char *field, const char *how, bool none_ok,
                    gs_vdev *v, bool *has, gs_err *e) {
  *has = false;
  if (name && *name) {
    if (gs_store_name_valid(name, field, e) < 0) return gs_err_rc(e);
    if (gs_store_vdev_get(c->d->store, name, v, e) < 0 ||
        (!c->id.admin && strcmp(v->tenant, c->id.tenant) != 0)) {
      char b[80];
      snprintf(b, sizeof b, "%s", name);
      return gs_err_set(e, GS_NOT_FOUND, field, "no vdev named \"%s\" for tenant %s (gpuctl vdev list)",
                        b, c->id.tenant[0] ? c->id.tenant : "(none)");
    }
    *has = true;
    return 0;
  }
  gs_vdev *all;
  size_t n, mine = 0;
  char names[400] = "";
  size_t off = 0;
  if (gs_store_vdev_list(c->d->store, &all, &n, e) < 0) return gs_err_rc(e);
  for (size_t i = 0; i < n; i++)
    if (c->id.tenant[0] && !strcmp(all[i].tenant, c->id.tenant)) {
      if (!mine) *v = all[i];
      if (off < sizeof names)
        off += (size_t)snprintf(names + off, sizeof names - off, "%s%s", mine ? ", " : "", all[i].name);
      mine++;
    }
  free(all);
  if (off >= sizeof names) snprintf(names + sizeof names - 5, 5, "...");
  if (mine == 1) {
    *has = true;
    return 0;
  }
  if (mine > 1)
    return gs_err_set(e, GS_INVALID_ARGUMENT, field,
                      "the job names no vdev and tenant %s has %zu (%s): name one with %s",
                      c->id.tenant, mine, names, how);
  if (none_ok) return 0;
  return gs_err_set(e, GS_INVALID_ARGUMENT, field,
                    "tenant %s has no vdev: an admin creates one with gpuctl vdev create",
                    c->id.tenant[0] ? c->id.tenant : "(none)");
}

int gs_rpc_plan(gs_call *c, const Gpushare__V1__Request *rq, gs_err *e) {
  const Gpushare__V1__PlanRequest *r = rq->plan;
  if (!r->spec) return gs_err_set(e, GS_INVALID_ARGUMENT, "spec", "no job spec given");
  gs_vdev v;
  bool has_vdev = false;
  bool by_flag = r->vdev && *r->vdev;
  /* The vdev submit would choose; without one (no tenant, or a tenant
   * without vdevs) the plan has no limit. */
  if (job_vdev(c, by_flag ? r->vdev : r->spec->vdev, by_flag ? "vdev" : "spec.vdev",
               "gpuctl plan --vdev NAME (or vdev: \"NAME\" in the job)", true, &v, &has_vdev, e) < 0)
    return gs_err_rc(e);
  Gpushare__V1__PlanResponse *m =
      GS_CALL_MSG(&c->ar, Gpushare__V1__PlanResponse, GPUSHARE__V1__PLAN_RESPONSE__INIT);
  if (!m) return gs_err_set(e, GS_INTERNAL, "", "out of memory");
  if (gs_admit_plan(c->d, &c->ar, r->spec, has_vdev ? &v : NULL, &m->plan, e) < 0) return gs_err_rc(e);
  c->resp->result_case = GPUSHARE__V1__RESPONSE__RESULT_PLAN_RESULT;
  c->resp->plan_result = m;
  return 0;
}

static Gpushare__V1__Usage *usage_msg(gs_call_arena *a, const gs_usage_sums *u) {
  Gpushare__V1__Usage *m = GS_CALL_MSG(a, Gpushare__V1__Usage, GPUSHARE__V1__USAGE__INIT);
  if (!m) return NULL;
  m->has_device_seconds = m->has_reserved_gib_seconds = m->has_in_use_gib_seconds = 1;
  m->has_steps = m->has_samples = m->has_preemptions = 1;
  m->device_seconds = u->device_seconds;
  m->reserved_gib_seconds = u->reserved_gib_s;
  m->in_use_gib_seconds = u->in_use_gib_s;
  m->steps = u->steps;
  m->samples = u->samples;
  m->preemptions = u->preemptions;
  return m;
}

/* The job as clients see it, with its usage so far (usage.c). */
static Gpushare__V1__Job *job_view(gs_call *c, const gs_job *j, bool with_spec) {
  Gpushare__V1__Job *copy = GS_CALL_MSG(&c->ar, Gpushare__V1__Job, GPUSHARE__V1__JOB__INIT);
  if (!copy) return NULL;
  gs_job_told(j, copy); /* shallow: packed before the job changes */
  if (!with_spec) copy->spec = NULL;
  copy->timeline = NULL;
  gs_usage_sums u;
  gs_usage_job(c->d, j->rec->id, &u);
  copy->usage = usage_msg(&c->ar, &u);
  if (j->mem_known && j->placed >= 0 && copy->state == GPUSHARE__V1__JOB_STATE__RUNNING) {
    copy->has_memory_in_use = copy->has_host_memory_bytes = copy->has_host_data_bytes = 1;
    copy->memory_in_use = j->mem_device;
    copy->host_memory_bytes = j->mem_host;
    copy->host_data_bytes = j->mem_host_data;
  }
  return copy;
}

int gs_rpc_submit(gs_call *c, const Gpushare__V1__Request *rq, gs_err *e) {
  gs_daemon *d = c->d;
  const Gpushare__V1__JobSpec *spec = rq->submit->spec;
  if (!spec) return gs_err_set(e, GS_INVALID_ARGUMENT, "spec", "no job spec given");
  if (gs_exec_events_shutting_down(d))
    return gs_err_set(e, GS_UNAVAILABLE, "", "gpushared is shutting down; submit again after it restarts");
  gs_vdev v;
  bool has_vdev;
  if (job_vdev(c, spec->vdev, "spec.vdev", "vdev: \"NAME\" in the job or gpuctl submit --vdev NAME",
               false, &v, &has_vdev, e) < 0)
    return gs_err_rc(e);
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
  uint64_t data_bytes = 0;
  if (gs_admit_check(d, tenant, spec, &data_bytes, e) < 0) return gs_err_rc(e);

  gs_tenant t;
  if (gs_store_tenant_get(d->store, tenant, &t, e) < 0) return gs_err_rc(e);
  uint32_t max_queued = t.quota.max_queued;
  gs_tenant_clear(&t);
  uint32_t queued = gs_jobs_count(d, tenant, GPUSHARE__V1__JOB_STATE__QUEUED);
  if (max_queued && queued >= max_queued)
    return gs_err_set(e, GS_RESOURCE_EXHAUSTED, "max_queued",
                      "tenant %s already has %" PRIu32 " queued job%s, its max_queued quota; wait "
                      "for them to start or cancel one",
                      tenant, queued, queued == 1 ? "" : "s");

  gs_admit adm;
  if (gs_admit_job(&c->d->devices, &c->ar, spec, &v, data_bytes, &adm, e) < 0) return gs_err_rc(e);
  if (!adm.fits) {
    c->resp->plan = adm.plan;
    return gs_err_set(e, GS_RESOURCE_EXHAUSTED, "spec.batch_size", "%s", adm.why);
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
  rec.submitted_unix = (int64_t)(gs_job_now_ms() / 1000);
  rec.micro_batch = adm.micro_batch;
  rec.accumulation_steps = adm.accumulation_steps;
  rec.planned_peak_bytes = adm.peak_bytes;
  rec.has_data_bytes = 1;
  rec.data_bytes = data_bytes;
  rec.priority = spec->has_priority ? spec->priority : 0;
  rec.spec = (Gpushare__V1__JobSpec *)spec;
  gs_job_row row = {.state = rec.state, .priority = rec.priority,
                    .submitted_ms = (int64_t)gs_job_now_ms()};
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
  gs_job *j = NULL;
  Gpushare__V1__Job *owned = gpushare__v1__job__unpack(NULL, n, buf);
  free(buf);
  buf = NULL;
  if (!owned || gs_job_add(d, owned, &j, e) < 0) {
    /* Stored, so not lost: the next start picks it up. */
    if (owned) gpushare__v1__job__free_unpacked(owned, NULL);
    return gs_err_set(e, GS_INTERNAL, "", "job %" PRIu64 " is stored but gpushared ran out of memory", id);
  }
  char peak[32], data[32];
  gs_info("job %" PRIu64 " submitted by uid %" PRIu32 " to %s/%s: planned peak %s, data %s, "
          "micro-batch %" PRIu32 " x %" PRIu32 "%s",
          id, c->peer->uid, tenant, v.name, gs_size_format(adm.peak_bytes, peak, sizeof peak),
          gs_size_format(data_bytes, data, sizeof data),
          adm.micro_batch, adm.accumulation_steps, adm.chosen ? " (auto-fit)" : "");
  Gpushare__V1__JobEvent ev;
  char msg[256];
  if (adm.chosen)
    snprintf(msg, sizeof msg, "QUEUED: auto_fit chose micro-batch %" PRIu32 " x %" PRIu32 " accumulation step%s",
             adm.micro_batch, adm.accumulation_steps, adm.accumulation_steps == 1 ? "" : "s");
  else
    snprintf(msg, sizeof msg, "QUEUED");
  gs_job_state_event(j, &ev, msg);
  gs_job_log_event(d, j, &ev);
  /* It may start at once; the answer shows it as it then is. (The view
   * shares the record's strings, so it is taken after any change.) */
  gs_exec_events_schedule(d);
  Gpushare__V1__SubmitResponse *m =
      GS_CALL_MSG(&c->ar, Gpushare__V1__SubmitResponse, GPUSHARE__V1__SUBMIT_RESPONSE__INIT);
  if (m) {
    m->job = job_view(c, j, false);
    m->plan = adm.plan;
  }
  if (!m) return gs_err_set(e, GS_INTERNAL, "", "out of memory");
  c->resp->result_case = GPUSHARE__V1__RESPONSE__RESULT_SUBMIT;
  c->resp->submit = m;
  return 0;
rollback:
  gs_store_txn_rollback(d->store);
fail:
  free(buf);
  return gs_err_rc(e);
}

/* ---------------------------------------------------------- job queries --- */

static int visible_job(gs_call *c, uint64_t id, bool has, gs_job **out, gs_err *e) {
  if (!has || id == 0)
    return gs_err_set(e, GS_INVALID_ARGUMENT, "id", "no job id given (ids start at 1)");
  gs_job *j = gs_job_get(c->d, id);
  /* Another tenant's job is not there as far as this peer can tell. */
  if (!j || (!c->id.admin && strcmp(j->rec->tenant, c->id.tenant) != 0))
    return gs_err_set(e, GS_NOT_FOUND, "id", "no job %" PRIu64 "%s%s", id,
                      c->id.tenant[0] ? " for tenant " : "", c->id.tenant);
  *out = j;
  return 0;
}

int gs_rpc_job_status(gs_call *c, const Gpushare__V1__Request *rq, gs_err *e) {
  gs_job *j = NULL;
  if (visible_job(c, rq->job_status->id, rq->job_status->has_id, &j, e) < 0) return gs_err_rc(e);
  Gpushare__V1__JobStatusResponse *m =
      GS_CALL_MSG(&c->ar, Gpushare__V1__JobStatusResponse, GPUSHARE__V1__JOB_STATUS_RESPONSE__INIT);
  if (!m || !(m->job = job_view(c, j, true))) return gs_err_set(e, GS_INTERNAL, "", "out of memory");
  c->resp->result_case = GPUSHARE__V1__RESPONSE__RESULT_JOB_STATUS;
  c->resp->job_status = m;
  return 0;
}

int gs_rpc_list_jobs(gs_call *c, const Gpushare__V1__Request *rq, gs_err *e) {
  bool all = rq->list_jobs->has_all && rq->list_jobs->all;
  if (all && !c->id.admin)
    return gs_err_set(e, GS_PERMISSION_DENIED, "all",
                      "--all is the admins' view of every tenant's jobs; uid %" PRIu32
                      " is not root and not in the admin group (without --all, gpuctl list "
                      "shows tenant %s's jobs)",
                      c->peer->uid, c->id.tenant);
  const gs_jobs *J = c->d->jobs;
  Gpushare__V1__ListJobsResponse *m =
      GS_CALL_MSG(&c->ar, Gpushare__V1__ListJobsResponse, GPUSHARE__V1__LIST_JOBS_RESPONSE__INIT);
  if (m) m->job = gs_call_alloc(&c->ar, (J->cap + 1) * sizeof *m->job);
  for (uint64_t i = 0; m && m->job && i < J->cap; i++) {
    gs_job *j = J->by_id[i];
    if (!j) continue;
    bool mine = c->id.tenant[0] && !strcmp(j->rec->tenant, c->id.tenant);
    if (!mine && !all) continue;
    Gpushare__V1__Job *v = job_view(c, j, false);
    if (v) m->job[m->n_job++] = v;
  }
  if (!m || c->ar.failed) return gs_err_set(e, GS_INTERNAL, "", "out of memory");
  c->resp->result_case = GPUSHARE__V1__RESPONSE__RESULT_LIST_JOBS;
  c->resp->list_jobs = m;
  return 0;
}

int gs_rpc_watch(gs_call *c, const Gpushare__V1__Request *rq, gs_err *e) {
  gs_job *j = NULL;
  if (visible_job(c, rq->watch->id, rq->watch->has_id, &j, e) < 0) return gs_err_rc(e);
  /* Its events carry the request id: two watches under one id on one
   * connection could not be told apart. */
  if (!c->conn)
    return gs_err_set(e, GS_FAILED_PRECONDITION, "", "a watch streams on a connection; this call has none");
  gs_daemon *d = c->d;
  for (const watcher *x = d->watches ? d->watches->list : NULL; x; x = x->next)
    if (x->conn == c->conn && x->req_id == c->req_id)
      return gs_err_set(e, GS_INVALID_ARGUMENT, "",
                        "request id %" PRIu64 " is already the id of this connection's watch "
                        "of job %" PRIu64 ", which has not ended; give each call in flight its "
                        "own id",
                        c->req_id, x->job);
  Gpushare__V1__JobEvent ev;
  char msg[1200];
  /* The same words a live watcher got when the job ended; the state the
   * store holds (a newer one comes as an event once it is written). */
  Gpushare__V1__Job told;
  gs_job_told(j, &told);
  snprintf(msg, sizeof msg, "%s%s%s", gs_job_state_name(told.state), told.reason ? ": " : "",
           told.reason ? told.reason : "");
  gs_job_state_event(j, &ev, gs_job_final(told.state) ? msg : NULL);
  ev.state = told.state;
  if (gs_job_final(told.state)) {
    send_watch(c->conn, c->req_id, &ev, true);
    c->deferred = true;
    return 0;
  }
  if (!d->watches && !(d->watches = calloc(1, sizeof *d->watches)))
    return gs_err_set(e, GS_INTERNAL, "", "out of memory");
  /* The stream ends with its connection. */
  if (gs_server_on_close(c->conn, conn_closed, d) < 0)
    return gs_err_set(e, GS_INTERNAL, "", "cannot follow this connection's close");
  watcher *w = calloc(1, sizeof *w);
  if (!w) return gs_err_set(e, GS_INTERNAL, "", "out of memory");
  gs_jobs_set_sink(d->jobs, broadcast, d);
  w->conn = c->conn;
  w->req_id = c->req_id;
  w->job = j->rec->id;
  w->next = d->watches->list;
  d->watches->list = w;
  send_watch(c->conn, c->req_id, &ev, false);
  c->deferred = true;
  return 0;
}

/* A change the daemon has made but the store does not hold yet. */
static int store_behind(gs_err *e, const gs_job *j, const char *what, const char *why) {
  return gs_err_set(e, GS_UNAVAILABLE, "id",
                    "job %" PRIu64 " %s, but the store cannot be written now (%s): gpushared "
                    "writes it again every second, and until then the job shows %s",
                    j->rec->id, what, why, gs_job_state_name(gs_job_told_state(j)));
}

int gs_rpc_cancel(gs_call *c, const Gpushare__V1__Request *rq, gs_err *e) {
  const char *why = rq->cancel->reason;
  if (why && *why && !c->id.admin)
    return gs_err_set(e, GS_PERMISSION_DENIED, "reason", "a cancel's reason is for admins; uid %" PRIu32 " is not one",
                      c->peer->uid);
  char who[256];
  if (why && *why && strlen(why) <= 160)
    snprintf(who, sizeof who, "cancelled by uid %" PRIu32 ": %s", c->peer->uid, why);
  else if (why && *why)
    return gs_err_set(e, GS_INVALID_ARGUMENT, "reason", "a cancel's reason has %zu bytes; at most 160 are allowed",
                      strlen(why));
  else
    snprintf(who, sizeof who, "cancelled by uid %" PRIu32, c->peer->uid);
  gs_job *j = NULL;
  if (visible_job(c, rq->cancel->id, rq->cancel->has_id, &j, e) < 0) return gs_err_rc(e);
  gs_daemon *d = c->d;
  if (gs_job_final(gs_job_told_state(j)))
    return gs_err_set(e, GS_FAILED_PRECONDITION, "id", "job %" PRIu64 " has already ended (%s)",
                      j->rec->id, gs_job_state_name(j->rec->state));
  if (gs_job_final(j->rec->state))
    return store_behind(e, j, "has ended", d->jobs->store_error);
  gs_exec_events_cancel(d, j, who);
  /* A cancel answered is a cancel kept: not before it is on disk. */
  if (j->unsaved) return store_behind(e, j, "is being cancelled", d->jobs->store_error);
  Gpushare__V1__CancelResponse *m =
      GS_CALL_MSG(&c->ar, Gpushare__V1__CancelResponse, GPUSHARE__V1__CANCEL_RESPONSE__INIT);
  if (!m || !(m->job = job_view(c, j, false))) return gs_err_set(e, GS_INTERNAL, "", "out of memory");
  c->resp->result_case = GPUSHARE__V1__RESPONSE__RESULT_CANCEL;
  c->resp->cancel = m;
  return 0;
}

typedef struct log_ctx {
  gs_call_arena *a;
  Gpushare__V1__LogsResponse *m;
  size_t cap;
} log_ctx;

/* protobuf-c allocations served from the request's arena: unpacked events
 * then live exactly as long as the response they are part of. */
static void *pb_arena_alloc(void *data, size_t size) { return gs_call_alloc(data, size); }
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
    Gpushare__V1__JobEvent **p = gs_call_alloc(l->a, cap * sizeof *p);
    if (!p) return;
    if (l->m->n_event) memcpy(p, l->m->event, l->m->n_event * sizeof *p);
    l->m->event = p;
    l->cap = cap;
  }
  l->m->event[l->m->n_event++] = ev;
}

int gs_rpc_logs(gs_call *c, const Gpushare__V1__Request *rq, gs_err *e) {
  gs_job *j = NULL;
  if (visible_job(c, rq->logs->id, rq->logs->has_id, &j, e) < 0) return gs_err_rc(e);
  Gpushare__V1__LogsResponse *m =
      GS_CALL_MSG(&c->ar, Gpushare__V1__LogsResponse, GPUSHARE__V1__LOGS_RESPONSE__INIT);
  if (!m) return gs_err_set(e, GS_INTERNAL, "", "out of memory");
  log_ctx l = {&c->ar, m, 0};
  if (gs_store_job_events(c->d->store, j->rec->id, collect_event, &l, e) < 0) return gs_err_rc(e);
  c->resp->result_case = GPUSHARE__V1__RESPONSE__RESULT_LOGS;
  c->resp->logs = m;
  return 0;
}

int gs_rpc_fetch(gs_call *c, const Gpushare__V1__Request *rq, gs_err *e) {
  const Gpushare__V1__FetchRequest *r = rq->fetch;
  gs_job *j = NULL;
  if (visible_job(c, r->id, r->has_id, &j, e) < 0) return gs_err_rc(e);
  bool ckpt = r->has_checkpoint && r->checkpoint;
  if (!ckpt && gs_job_told_state(j) != GPUSHARE__V1__JOB_STATE__SUCCEEDED)
    return gs_err_set(e, GS_FAILED_PRECONDITION, "id",
                      "job %" PRIu64 " is %s: trained weights exist once it has SUCCEEDED "
                      "(--checkpoint fetches its last checkpoint)",
                      j->rec->id, gs_job_state_name(gs_job_told_state(j)));
  char path[PATH_MAX];
  gs_job_file(c->d, j->rec->id, ckpt ? "checkpoint.ckpt" : "model.safetensors", path, sizeof path);
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
  uint8_t *buf = gs_call_alloc(&c->ar, chunk + 1);
  ssize_t got = buf ? pread(fd, buf, chunk, (off_t)off) : -1;
  close(fd);
  if (got < 0 || (size_t)got != chunk) return gs_err_set(e, GS_INTERNAL, "", "cannot read %s", path);
  Gpushare__V1__FetchResponse *m =
      GS_CALL_MSG(&c->ar, Gpushare__V1__FetchResponse, GPUSHARE__V1__FETCH_RESPONSE__INIT);
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

int gs_rpc_memory(gs_call *c, const Gpushare__V1__Request *rq, gs_err *e) {
  gs_job *j = NULL;
  if (visible_job(c, rq->memory->id, rq->memory->has_id, &j, e) < 0) return gs_err_rc(e);
  Gpushare__V1__MemoryResponse *m =
      GS_CALL_MSG(&c->ar, Gpushare__V1__MemoryResponse, GPUSHARE__V1__MEMORY_RESPONSE__INIT);
  if (!m) return gs_err_set(e, GS_INTERNAL, "", "out of memory");
  if (j->rec->timeline) {
    m->timeline = j->rec->timeline;
  } else {
    Gpushare__V1__MemoryTimeline *t =
        GS_CALL_MSG(&c->ar, Gpushare__V1__MemoryTimeline, GPUSHARE__V1__MEMORY_TIMELINE__INIT);
    if (!t) return gs_err_set(e, GS_INTERNAL, "", "out of memory");
    t->has_planned_peak_bytes = 1;
    t->planned_peak_bytes = j->rec->planned_peak_bytes;
    m->timeline = t;
  }
  c->resp->result_case = GPUSHARE__V1__RESPONSE__RESULT_MEMORY;
  c->resp->memory = m;
  return 0;
}


/* ----------------------------------------------------------------- usage --- */

static void utc_date(int64_t t, char *buf, size_t len) {
  time_t tt = (time_t)t;
  struct tm tm;
  if (!gmtime_r(&tt, &tm) || !strftime(buf, len, "%Y-%m-%d", &tm)) snprintf(buf, len, "?");
}

/* One tenant's block of the answer: its rows (rows[from..to), all its own)
 * and their sum. */
static Gpushare__V1__TenantUsage *tenant_usage(gs_call *c, const char *name,
                                               const gs_usage_row *rows, size_t n) {
  gs_call_arena *a = &c->ar;
  Gpushare__V1__TenantUsage *t =
      GS_CALL_MSG(a, Gpushare__V1__TenantUsage, GPUSHARE__V1__TENANT_USAGE__INIT);
  if (!t) return NULL;
  t->tenant = gs_call_strdup(a, name);
  t->job = gs_call_alloc(a, (n + 1) * sizeof *t->job);
  if (!t->job) return NULL;
  gs_usage_sums total = {0};
  for (size_t i = 0; i < n; i++) {
    Gpushare__V1__JobUsage *ju = GS_CALL_MSG(a, Gpushare__V1__JobUsage, GPUSHARE__V1__JOB_USAGE__INIT);
    if (!ju) return NULL;
    ju->has_job_id = 1;
    ju->job_id = rows[i].job_id;
    gs_job *j = rows[i].job_id ? gs_job_get(c->d, rows[i].job_id) : NULL;
    ju->name = gs_call_strdup(a, j && j->rec->name ? j->rec->name : "");
    ju->vdev = gs_call_strdup(a, rows[i].vdev);
    ju->usage = usage_msg(a, &rows[i].sum);
    gs_usage_sums_add(&total, &rows[i].sum);
    t->job[t->n_job++] = ju;
  }
  t->total = usage_msg(a, &total);
  return t;
}

int gs_rpc_usage(gs_call *c, const Gpushare__V1__Request *rq, gs_err *e) {
  const Gpushare__V1__UsageRequest *r = rq->usage;
  gs_daemon *d = c->d;
  const char *tenant = r->tenant && *r->tenant ? r->tenant : NULL;
  if (tenant && gs_store_name_valid(tenant, "tenant", e) < 0) return gs_err_rc(e);
  if (!c->id.admin) {
    if (tenant && strcmp(tenant, c->id.tenant) != 0)
      return gs_err_set(e, GS_PERMISSION_DENIED, "tenant",
                        "uid %" PRIu32 " acts as tenant %s and cannot read tenant %s's usage",
                        c->peer->uid, c->id.tenant, tenant);
    tenant = c->id.tenant; /* a member reads its own tenant's */
  }
  int64_t now = (int64_t)time(NULL), since_day = 0;
  if (r->has_since_unix) {
    char day[32], today[32];
    utc_date(r->since_unix, day, sizeof day);
    utc_date(now, today, sizeof today);
    if (r->since_unix < 0)
      return gs_err_set(e, GS_INVALID_ARGUMENT, "since_unix",
                        "since_unix %" PRId64 " is before 1970; give a unix time from 0 (every "
                        "day) up to now (%" PRId64 ")",
                        r->since_unix, now);
    if (gs_usage_day(r->since_unix) > gs_usage_day(now))
      return gs_err_set(e, GS_INVALID_ARGUMENT, "since_unix",
                        "since_unix %" PRId64 " (UTC day %s) is in the future; today is %s UTC: "
                        "give a unix time from 0 (every day) up to now (%" PRId64 ")",
                        r->since_unix, day, today, now);
    since_day = gs_usage_day(r->since_unix);
  }
  gs_tenant *tenants = NULL;
  size_t nt = 0, nr = 0;
  gs_usage_row *rows = NULL;
  if (gs_store_tenant_list(d->store, &tenants, &nt, e) < 0) return gs_err_rc(e);
  if (gs_usage_report(d, tenant, since_day, &rows, &nr, e) < 0) goto done;
  bool known = !tenant || nr > 0;
  for (size_t i = 0; i < nt && !known; i++) known = !strcmp(tenants[i].name, tenant);
  if (!known) {
    gs_err_set(e, GS_NOT_FOUND, "tenant", "no tenant %s (gpuctl tenant list)", tenant);
    goto done;
  }
  Gpushare__V1__UsageResponse *m =
      GS_CALL_MSG(&c->ar, Gpushare__V1__UsageResponse, GPUSHARE__V1__USAGE_RESPONSE__INIT);
  if (m) m->tenant = gs_call_alloc(&c->ar, (nt + nr + 1) * sizeof *m->tenant);
  if (!m || !m->tenant) {
    gs_err_set(e, GS_INTERNAL, "", "out of memory");
    goto done;
  }
  /* Every tenant asked for, with or without rows, and the tenants of rows
   * whose tenant is gone; both lists are in name order. */
  size_t ti = 0, ri = 0;
  while (ti < nt || ri < nr) {
    if (ti < nt && tenant && strcmp(tenants[ti].name, tenant)) {
      ti++;
      continue;
    }
    int cmp = ti >= nt ? 1 : ri >= nr ? -1 : strcmp(tenants[ti].name, rows[ri].tenant);
    const char *name = cmp <= 0 ? tenants[ti].name : rows[ri].tenant;
    size_t from = ri;
    while (ri < nr && !strcmp(rows[ri].tenant, name)) ri++;
    if (cmp <= 0) ti++;
    Gpushare__V1__TenantUsage *tu = tenant_usage(c, name, rows + from, ri - from);
    if (!tu) {
      gs_err_set(e, GS_INTERNAL, "", "out of memory");
      goto done;
    }
    m->tenant[m->n_tenant++] = tu;
  }
  c->resp->result_case = GPUSHARE__V1__RESPONSE__RESULT_USAGE;
  c->resp->usage = m;
done:
  free(rows);
  gs_tenant_list_free(tenants, nt);
  return e->code == GS_OK ? 0 : gs_err_rc(e);
}
