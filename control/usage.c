/*
 * usage.c: what jobs and tenants used, accrued from the executors' reports
 * and kept in the store (see usage.h).
 *
 * Design:
 *  - Memory is integrated per vdev, piecewise: each vdev has the loop time
 *    it is charged up to, the reserved bytes its executor last reported and
 *    the jobs that ran in it then (job_acc.running). A Stats message, a
 *    job's Finished and each flush charge the interval since, with those
 *    figures, and a Stats then takes the new ones. So the interval before a
 *    job's first Stats is not its, the one up to its Finished is, and a
 *    vdev idle between two reports (no Stats come while no job runs) is
 *    charged each second by the flush.
 *  - A job is charged only while it is RUNNING on an executor: one whose
 *    executor died leaves its vdev's set at the next charge.
 *  - Device time comes from the executor: each Progress and Finished
 *    carries the run's device seconds so far; a run restarts from 0 after
 *    the executor restarts (the job's restarts count moves) or after
 *    Finished, and gs_usage_run_delta counts each second once.
 *  - What accrues goes to three places at once: the pending row of its
 *    (job, tenant, vdev, today), written and cleared by gs_usage_flush; and
 *    the totals of its job, tenant and vdev, read from the store at start,
 *    which status, list, metrics and the usage call read.
 */
#include "control/usage.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "control/job.h"
#include "control/log.h"

typedef struct job_acc {
  gs_usage_sums total; /* every day, stored and pending */
  double run_seen;     /* device seconds of the current run counted */
  uint32_t restarts;   /* the record's restarts when run_seen was last set */
  bool running;        /* ran in its vdev at the vdev's last report */
} job_acc;

typedef struct vdev_acc {
  char name[GS_NAME_MAX + 1];
  uint64_t last_ms;    /* loop time charged up to; 0: no report since start */
  uint64_t reserved;   /* bytes, as its executor last reported */
  gs_usage_sums total; /* every job's and the idle rows', every day */
} vdev_acc;

typedef struct tenant_acc {
  char name[GS_NAME_MAX + 1];
  gs_usage_sums total;
} tenant_acc;

struct gs_usage {
  job_acc *job;        /* by job id (ids are dense) */
  uint64_t cap;
  vdev_acc *vdev;
  size_t n_vdev;
  tenant_acc *tenant;
  size_t n_tenant;
  gs_usage_row *pending; /* accrued since the last flush */
  size_t n_pending, cap_pending;
  bool failing;        /* the last flush failed (logged once until one works) */
};

/* ------------------------------------------------------------ arithmetic --- */

double gs_usage_interval(double dt, uint64_t reserved, const uint64_t *peaks, size_t n,
                         double *in_use_gib_s, double *reserved_gib_s) {
  double res = (double)reserved / GS_USAGE_GIB * dt;
  if (n == 0) return res;
  double sum = 0;
  for (size_t i = 0; i < n; i++) sum += (double)peaks[i];
  for (size_t i = 0; i < n; i++) {
    in_use_gib_s[i] = (double)peaks[i] / GS_USAGE_GIB * dt;
    reserved_gib_s[i] = sum > 0 ? res * ((double)peaks[i] / sum) : res / (double)n;
  }
  return 0;
}

uint64_t gs_usage_step_delta(uint64_t counted, uint64_t step) {
  return step > counted ? step - counted : 0;
}

double gs_usage_run_delta(double *seen, double now) {
  double d = now >= *seen ? now - *seen : now;
  *seen = now;
  return d > 0 ? d : 0;
}

int64_t gs_usage_day(int64_t unix_s) {
  int64_t d = unix_s / GS_USAGE_DAY_SECONDS;
  return unix_s < 0 && unix_s % GS_USAGE_DAY_SECONDS ? d - 1 : d;
}

void gs_usage_sums_add(gs_usage_sums *to, const gs_usage_sums *add) {
  to->device_seconds += add->device_seconds;
  to->reserved_gib_s += add->reserved_gib_s;
  to->in_use_gib_s += add->in_use_gib_s;
  to->steps += add->steps;
  to->samples += add->samples;
  to->preemptions += add->preemptions;
}

/* ---------------------------------------------------------------- tables --- */

static job_acc *job_of(gs_usage *U, uint64_t id) {
  if (id >= U->cap) {
    uint64_t cap = U->cap ? U->cap : 64;
    while (cap <= id) cap *= 2;
    job_acc *p = realloc(U->job, cap * sizeof *p);
    if (!p) return NULL;
    memset(p + U->cap, 0, (cap - U->cap) * sizeof *p);
    U->job = p;
    U->cap = cap;
  }
  return &U->job[id];
}

static vdev_acc *vdev_of(gs_usage *U, const char *name, bool create) {
  for (size_t i = 0; i < U->n_vdev; i++)
    if (!strcmp(U->vdev[i].name, name)) return &U->vdev[i];
  if (!create) return NULL;
  vdev_acc *p = realloc(U->vdev, (U->n_vdev + 1) * sizeof *p);
  if (!p) return NULL;
  U->vdev = p;
  p = &U->vdev[U->n_vdev++];
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "%s", name);
  return p;
}

static tenant_acc *tenant_of(gs_usage *U, const char *name, bool create) {
  for (size_t i = 0; i < U->n_tenant; i++)
    if (!strcmp(U->tenant[i].name, name)) return &U->tenant[i];
  if (!create) return NULL;
  tenant_acc *p = realloc(U->tenant, (U->n_tenant + 1) * sizeof *p);
  if (!p) return NULL;
  U->tenant = p;
  p = &U->tenant[U->n_tenant++];
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "%s", name);
  return p;
}

/* Add to the totals of the job (id > 0), the tenant and the vdev, without
 * a pending row (loading the store's totals). */
static void add_totals(gs_usage *U, uint64_t id, const char *tenant, const char *vdev,
                       const gs_usage_sums *add) {
  job_acc *j = id ? job_of(U, id) : NULL;
  tenant_acc *t = tenant_of(U, tenant, true);
  vdev_acc *v = vdev_of(U, vdev, true);
  if (j) gs_usage_sums_add(&j->total, add);
  if (t) gs_usage_sums_add(&t->total, add);
  if (v) gs_usage_sums_add(&v->total, add);
}

static gs_usage_row *pending_row(gs_usage *U, uint64_t id, const char *tenant, const char *vdev,
                                 int64_t day) {
  for (size_t i = 0; i < U->n_pending; i++) {
    gs_usage_row *r = &U->pending[i];
    if (r->job_id == id && r->day == day && !strcmp(r->tenant, tenant) && !strcmp(r->vdev, vdev))
      return r;
  }
  if (U->n_pending == U->cap_pending) {
    size_t cap = U->cap_pending ? 2 * U->cap_pending : 16;
    gs_usage_row *p = realloc(U->pending, cap * sizeof *p);
    if (!p) return NULL;
    U->pending = p;
    U->cap_pending = cap;
  }
  gs_usage_row *r = &U->pending[U->n_pending++];
  memset(r, 0, sizeof *r);
  r->job_id = id;
  r->day = day;
  snprintf(r->tenant, sizeof r->tenant, "%s", tenant);
  snprintf(r->vdev, sizeof r->vdev, "%s", vdev);
  return r;
}

/* Accrue: today's pending row and the totals. */
static void charge(gs_usage *U, uint64_t id, const char *tenant, const char *vdev,
                   const gs_usage_sums *add) {
  gs_usage_row *r = pending_row(U, id, tenant, vdev, gs_usage_day((int64_t)time(NULL)));
  if (!r) {
    gs_warn("usage: out of memory; %.3f device seconds of job %" PRIu64 " not recorded",
            add->device_seconds, id);
    return;
  }
  gs_usage_sums_add(&r->sum, add);
  add_totals(U, id, tenant, vdev, add);
}

/* --------------------------------------------------------------- accrual --- */

static bool on_executor(const gs_job *j) {
  return j->rec->state == GPUSHARE__V1__JOB_STATE__RUNNING && j->placed >= 0;
}

/* Charge vdev v from its last charge up to now with the reserved bytes and
 * the jobs of its last report. */
static void integrate(gs_daemon *d, vdev_acc *v, uint64_t now) {
  gs_usage *U = d->usage;
  if (!v->last_ms || now <= v->last_ms) {
    if (!v->last_ms) v->last_ms = now;
    return;
  }
  double dt = (double)(now - v->last_ms) / 1000.0;
  v->last_ms = now;
  const gs_jobs *J = d->jobs;
  size_t n = 0;
  for (uint64_t i = 0; J && i < J->cap && i < U->cap; i++) {
    gs_job *j = J->by_id[i];
    if (!j || !U->job[i].running || strcmp(j->rec->vdev, v->name)) continue;
    if (!on_executor(j)) U->job[i].running = false; /* its executor died */
    else n++;
  }
  uint64_t *ids = calloc(n + 1, sizeof *ids), *peaks = calloc(n + 1, sizeof *peaks);
  double *in_use = calloc(n + 1, sizeof *in_use), *res = calloc(n + 1, sizeof *res);
  if (!ids || !peaks || !in_use || !res) {
    gs_warn("usage: out of memory; %.1f s of vdev %s not recorded", dt, v->name);
    goto done;
  }
  size_t k = 0;
  for (uint64_t i = 0; J && i < J->cap && i < U->cap && k < n; i++) {
    gs_job *j = J->by_id[i];
    if (!j || !U->job[i].running || strcmp(j->rec->vdev, v->name)) continue;
    ids[k] = i;
    peaks[k++] = j->rec->planned_peak_bytes;
  }
  double idle = gs_usage_interval(dt, v->reserved, peaks, n, in_use, res);
  for (size_t x = 0; x < n; x++) {
    gs_usage_sums add = {.in_use_gib_s = in_use[x], .reserved_gib_s = res[x]};
    charge(U, ids[x], J->by_id[ids[x]]->rec->tenant, v->name, &add);
  }
  if (idle > 0) {
    /* Idle reserved memory is its vdev's tenant's; a vdev deleted since is
     * charged no more. */
    gs_vdev vd;
    gs_err e;
    gs_err_clear(&e);
    if (gs_store_vdev_get(d->store, v->name, &vd, &e) == 0) {
      gs_usage_sums add = {.reserved_gib_s = idle};
      charge(U, 0, vd.tenant, v->name, &add);
    } else {
      v->last_ms = 0;
      v->reserved = 0;
    }
  }
done:
  free(res);
  free(in_use);
  free(peaks);
  free(ids);
}

void gs_usage_stats(gs_daemon *d, const Gpushare__Exec__V1__Stats *s) {
  gs_usage *U = d->usage;
  if (!U) return;
  uint64_t now = uv_now(d->loop);
  const gs_jobs *J = d->jobs;
  for (size_t i = 0; i < s->n_vdev; i++) {
    const Gpushare__Exec__V1__VdevStats *vs = s->vdev[i];
    if (!vs->name) continue;
    vdev_acc *v = vdev_of(U, vs->name, true);
    if (!v) continue;
    integrate(d, v, now);
    v->reserved = vs->reserved;
    for (uint64_t x = 0; J && x < J->cap; x++) {
      gs_job *j = J->by_id[x];
      if (!j || strcmp(j->rec->vdev, vs->name)) continue;
      bool run = on_executor(j);
      if (!run && x >= U->cap) continue;
      job_acc *a = job_of(U, x);
      if (a) a->running = run;
    }
  }
}

/* The job's accumulator with its run restarted when its executor was. */
static job_acc *job_run(gs_usage *U, const gs_job *j) {
  job_acc *a = job_of(U, j->rec->id);
  if (a && a->restarts != j->rec->restarts) {
    a->restarts = j->rec->restarts;
    a->run_seen = 0;
  }
  return a;
}

static void steps_and_time(gs_usage *U, const gs_job *j, job_acc *a, bool has_step,
                           uint64_t step, bool has_ds, double ds) {
  gs_usage_sums add = {0};
  if (has_ds) add.device_seconds = gs_usage_run_delta(&a->run_seen, ds);
  if (has_step) {
    add.steps = gs_usage_step_delta(a->total.steps, step);
    add.samples = add.steps * (uint64_t)j->rec->micro_batch * (uint64_t)j->rec->accumulation_steps;
  }
  if (add.device_seconds > 0 || add.steps > 0) charge(U, j->rec->id, j->rec->tenant, j->rec->vdev, &add);
}

void gs_usage_progress(gs_daemon *d, const Gpushare__Exec__V1__Progress *p) {
  gs_usage *U = d->usage;
  gs_job *j = U ? gs_job_get(d, p->job_id) : NULL;
  job_acc *a = j ? job_run(U, j) : NULL;
  if (!a) return;
  const Gpushare__V1__JobEvent *ev = p->event;
  steps_and_time(U, j, a, ev && ev->has_step, ev ? ev->step : 0, p->has_device_seconds,
                 p->device_seconds);
}

void gs_usage_finished(gs_daemon *d, const Gpushare__Exec__V1__Finished *f) {
  gs_usage *U = d->usage;
  gs_job *j = U ? gs_job_get(d, f->job_id) : NULL;
  if (!j) return;
  vdev_acc *v = vdev_of(U, j->rec->vdev, false);
  if (v) integrate(d, v, uv_now(d->loop));
  job_acc *a = job_run(U, j);
  if (!a) return;
  steps_and_time(U, j, a, f->has_steps, f->steps, f->has_device_seconds, f->device_seconds);
  a->running = false;
  a->run_seen = 0; /* the next run starts from 0 */
}

void gs_usage_preempted(gs_daemon *d, uint64_t job) {
  gs_usage *U = d->usage;
  gs_job *j = U ? gs_job_get(d, job) : NULL;
  if (!j) return;
  gs_usage_sums add = {.preemptions = 1};
  charge(U, job, j->rec->tenant, j->rec->vdev, &add);
}

int gs_usage_flush(gs_daemon *d) {
  gs_usage *U = d->usage;
  if (!U) return 0;
  uint64_t now = uv_now(d->loop);
  for (size_t i = 0; i < U->n_vdev; i++) integrate(d, &U->vdev[i], now);
  if (U->n_pending == 0) return 0;
  gs_err e;
  gs_err_clear(&e);
  if (gs_store_usage_add(d->store, U->pending, U->n_pending, &e) < 0) {
    if (!U->failing)
      gs_error("usage: cannot write to the store (%s); kept in memory and written again every "
               "second", e.msg);
    U->failing = true;
    return gs_err_rc(&e);
  }
  if (U->failing) gs_info("usage: written to the store again");
  U->failing = false;
  U->n_pending = 0;
  return 0;
}

/* -------------------------------------------------------------- readings --- */

bool gs_usage_job(const gs_daemon *d, uint64_t job, gs_usage_sums *out) {
  memset(out, 0, sizeof *out);
  const gs_usage *U = d->usage;
  if (!U || job >= U->cap) return false;
  *out = U->job[job].total;
  return out->device_seconds > 0 || out->reserved_gib_s > 0 || out->in_use_gib_s > 0 ||
         out->steps || out->samples || out->preemptions;
}

void gs_usage_tenant(const gs_daemon *d, const char *tenant, gs_usage_sums *out) {
  memset(out, 0, sizeof *out);
  const gs_usage *U = d->usage;
  for (size_t i = 0; U && i < U->n_tenant; i++)
    if (!strcmp(U->tenant[i].name, tenant)) *out = U->tenant[i].total;
}

void gs_usage_vdev(const gs_daemon *d, const char *vdev, gs_usage_sums *out) {
  memset(out, 0, sizeof *out);
  const gs_usage *U = d->usage;
  for (size_t i = 0; U && i < U->n_vdev; i++)
    if (!strcmp(U->vdev[i].name, vdev)) *out = U->vdev[i].total;
}

static int row_order(const void *a, const void *b) {
  const gs_usage_row *x = a, *y = b;
  int c = strcmp(x->tenant, y->tenant);
  if (c) return c;
  if (x->job_id != y->job_id) return x->job_id < y->job_id ? -1 : 1;
  return strcmp(x->vdev, y->vdev);
}

int gs_usage_report(gs_daemon *d, const char *tenant, int64_t since_day, gs_usage_row **out,
                    size_t *n, gs_err *e) {
  gs_usage_row *rows = NULL;
  size_t nr = 0;
  if (gs_store_usage_list(d->store, tenant, since_day, &rows, &nr, e) < 0) return gs_err_rc(e);
  const gs_usage *U = d->usage;
  size_t extra = U ? U->n_pending : 0;
  gs_usage_row *all = realloc(rows, (nr + extra + 1) * sizeof *all);
  if (!all) {
    free(rows);
    return gs_err_set(e, GS_INTERNAL, "", "out of memory");
  }
  rows = all;
  size_t stored = nr;
  for (size_t i = 0; i < extra; i++) {
    const gs_usage_row *p = &U->pending[i];
    if (p->day < since_day || (tenant && strcmp(p->tenant, tenant))) continue;
    size_t k = 0;
    while (k < stored && (rows[k].job_id != p->job_id || strcmp(rows[k].tenant, p->tenant) ||
                          strcmp(rows[k].vdev, p->vdev)))
      k++;
    if (k < stored) {
      gs_usage_sums_add(&rows[k].sum, &p->sum);
      if (p->day < rows[k].day) rows[k].day = p->day;
    } else {
      rows[nr++] = *p;
      stored = nr; /* pending rows of other days merge into it too */
    }
  }
  qsort(rows, nr, sizeof *rows, row_order);
  *out = rows;
  *n = nr;
  return 0;
}

/* ------------------------------------------------------------- lifecycle --- */

int gs_usage_init(gs_daemon *d, gs_err *e) {
  gs_usage *U = calloc(1, sizeof *U);
  if (!U) return gs_err_set(e, GS_INTERNAL, "", "out of memory");
  gs_usage_row *rows = NULL;
  size_t n = 0;
  if (gs_store_usage_list(d->store, NULL, INT64_MIN, &rows, &n, e) < 0) {
    free(U);
    return gs_err_rc(e);
  }
  for (size_t i = 0; i < n; i++) add_totals(U, rows[i].job_id, rows[i].tenant, rows[i].vdev, &rows[i].sum);
  free(rows);
  d->usage = U;
  return 0;
}

void gs_usage_free(gs_daemon *d) {
  gs_usage *U = d->usage;
  if (!U) return;
  free(U->job);
  free(U->vdev);
  free(U->tenant);
  free(U->pending);
  free(U);
  d->usage = NULL;
}
