/*
 * sched.c: the scheduler as a pure function (see sched.h).
 *
 * For each vdev, in the order given: the bytes its RUNNING jobs hold are
 * summed (planned peaks; dataset bytes once per data key), its QUEUED jobs sorted (priority, then submit time, then id) and
 * walked until the first that cannot start; that one waits with its reason
 * and every one after it waits behind it. Running counts per tenant are
 * kept across vdevs, so a job started in one vdev counts against
 * max_running in the next. Queued jobs of a vdev that is not ready, or
 * that does not exist, wait with that reason. A head that waits for memory
 * may preempt (see sched.h): the victims are chosen by recounting what the
 * vdev would hold without them.
 */
#include "control/sched.h"

#include <stdlib.h>
#include <string.h>

static int cmp_queue(const void *a, const void *b) {
  const gs_sched_job *x = *(const gs_sched_job *const *)a, *y = *(const gs_sched_job *const *)b;
  if (x->priority != y->priority) return x->priority > y->priority ? -1 : 1;
  if (x->submitted != y->submitted) return x->submitted < y->submitted ? -1 : 1;
  if (x->id != y->id) return x->id < y->id ? -1 : 1;
  return 0;
}

static const gs_sched_quota *quota_of(const gs_sched_input *in, const char *tenant) {
  for (size_t i = 0; i < in->n_quotas; i++)
    if (!strcmp(in->quotas[i].tenant, tenant)) return &in->quotas[i];
  return NULL;
}

static const gs_sched_vdev *vdev_of(const gs_sched_input *in, const char *name) {
  for (size_t i = 0; i < in->n_vdevs; i++)
    if (!strcmp(in->vdevs[i].name, name)) return &in->vdevs[i];
  return NULL;
}

/* The tenant's running jobs: those of the input plus those started here. */
static uint32_t running_of(const gs_sched_input *in, const gs_sched_decision *out, size_t n,
                           const char *tenant) {
  uint32_t r = 0;
  for (size_t i = 0; i < in->n_jobs; i++)
    if (in->jobs[i].state == GS_SCHED_RUNNING && !strcmp(in->jobs[i].tenant, tenant)) r++;
  for (size_t i = 0; i < n; i++) {
    if (out[i].why != GS_SCHED_START) continue;
    for (size_t k = 0; k < in->n_jobs; k++)
      if (in->jobs[k].id == out[i].job && !strcmp(in->jobs[k].tenant, tenant)) r++;
  }
  return r;
}

/* The data keys a vdev's jobs hold, each counted once. */
typedef struct held_data {
  uint64_t *keys;
  size_t n;
  uint64_t bytes;
} held_data;

static bool data_held(const held_data *h, uint64_t key) {
  for (size_t i = 0; i < h->n; i++)
    if (h->keys[i] == key) return true;
  return false;
}

/* Bytes j's data adds to the vdev: none when a job of its key is there. */
static uint64_t data_adds(const held_data *h, const gs_sched_job *j) {
  return !j->data_bytes || data_held(h, j->data_key) ? 0 : j->data_bytes;
}

static void data_hold(held_data *h, const gs_sched_job *j) {
  uint64_t add = data_adds(h, j);
  if (!add) return;
  h->keys[h->n++] = j->data_key; /* room for every job of the input */
  h->bytes = add > UINT64_MAX - h->bytes ? UINT64_MAX : h->bytes + add;
}

/* Does j fit beside what the vdev's jobs hold (used: planned peaks)? */
static bool fits(const gs_sched_vdev *vd, uint64_t used, const held_data *h, const gs_sched_job *j) {
  uint64_t limit = vd->memory_limit, data = h->bytes, add = data_adds(h, j);
  if (used > limit || j->planned_peak > limit - used) return false;
  if (vd->data_in_memory) {
    uint64_t left = limit - used - j->planned_peak;
    return data <= left && add <= left - data;
  }
  return data <= limit && add <= limit - data;
}

/* The device vdev `name` is on (NULL: not told). */
static const gs_sched_device *device_of(const gs_sched_input *in, const char *name) {
  if (!in->vdev_device) return NULL;
  for (size_t i = 0; i < in->n_vdevs; i++)
    if (!strcmp(in->vdevs[i].name, name)) {
      for (size_t k = 0; in->vdev_device[i] && k < in->n_devices; k++)
        if (!strcmp(in->devices[k].name, in->vdev_device[i])) return &in->devices[k];
      return NULL;
    }
  return NULL;
}

/* What is needed to choose victims: where the head must fit (its vdev, or,
 * for a PHYSICAL shortage, its device), the jobs started in this run so
 * far (out[0..n_start)), and room for the recount. */
typedef struct preempt_ctx {
  const gs_sched_input *in;
  const gs_sched_vdev *vd;     /* vdev level: in this vdev's limit */
  const gs_sched_device *dev;  /* device level (vd NULL): in this device's usable bytes */
  const gs_sched_decision *started;
  size_t n_started;
  const gs_sched_job **cand;   /* room for n_jobs */
  bool *victim;                /* by index of cand */
  held_data h;                 /* keys: room for n_jobs */
} preempt_ctx;

static const gs_sched_job *job_of(const gs_sched_input *in, uint64_t id) {
  for (size_t i = 0; i < in->n_jobs; i++)
    if (in->jobs[i].id == id) return &in->jobs[i];
  return NULL;
}

static bool is_victim(const preempt_ctx *c, size_t nc, const gs_sched_job *j) {
  for (size_t i = 0; i < nc; i++)
    if (c->victim[i] && c->cand[i] == j) return true;
  return false;
}

/* Is j where the head must fit (its vdev, or a vdev on its device)? */
static bool in_scope(const preempt_ctx *c, const gs_sched_job *j) {
  if (c->vd) return !strcmp(j->vdev, c->vd->name);
  return device_of(c->in, j->vdev) == c->dev && j->device_bytes;
}

/* Does head fit once the chosen victims are gone? In a vdev: peaks and
 * data as gs_sched_run counts them; on a device: the fixed bytes and the
 * running jobs' device_bytes against its usable bytes. */
static bool fits_without(preempt_ctx *c, size_t nc, const gs_sched_job *head) {
  uint64_t used = c->vd ? 0 : c->dev->fixed;
  c->h.n = 0;
  c->h.bytes = 0;
  for (size_t i = 0; i < c->in->n_jobs; i++) {
    const gs_sched_job *j = &c->in->jobs[i];
    if (j->state != GS_SCHED_RUNNING || !in_scope(c, j) || is_victim(c, nc, j)) continue;
    uint64_t b = c->vd ? j->planned_peak : j->device_bytes;
    used = b > UINT64_MAX - used ? UINT64_MAX : used + b;
    data_hold(&c->h, j);
  }
  for (size_t i = 0; i < c->n_started; i++) {
    const gs_sched_job *j = job_of(c->in, c->started[i].job);
    if (!j || !in_scope(c, j)) continue;
    uint64_t b = c->vd ? j->planned_peak : j->device_bytes;
    used = b > UINT64_MAX - used ? UINT64_MAX : used + b;
    data_hold(&c->h, j);
  }
  if (!c->vd) return used <= c->dev->usable && head->device_bytes <= c->dev->usable - used;
  return fits(c->vd, used, &c->h, head);
}

/* Lowest priority first, then the most recently started, then the newest id. */
static int cmp_victim(const void *a, const void *b) {
  const gs_sched_job *x = *(const gs_sched_job *const *)a, *y = *(const gs_sched_job *const *)b;
  if (x->priority != y->priority) return x->priority < y->priority ? -1 : 1;
  if (x->run_started != y->run_started) return x->run_started > y->run_started ? -1 : 1;
  if (x->id != y->id) return x->id > y->id ? -1 : 1;
  return 0;
}

/* May j be stopped for head now? */
static bool preemptable(const gs_sched_input *in, const gs_sched_job *j, const gs_sched_job *head) {
  return j->state == GS_SCHED_RUNNING && j->preemptible && !j->stopping &&
         j->priority < head->priority && in->now - j->run_started >= in->preempt_min_run_s &&
         (!j->last_preempted || in->now - j->last_preempted >= in->preempt_interval_s);
}

/* Choose victims for head (see sched.h). Returns how many were marked in
 * c->victim over the first *nc candidates, 0 when head cannot fit even
 * with every candidate gone. */
static size_t choose_victims(preempt_ctx *c, const gs_sched_job *head, size_t *nc) {
  size_t n = 0;
  for (size_t i = 0; i < c->in->n_jobs; i++) {
    const gs_sched_job *j = &c->in->jobs[i];
    if (in_scope(c, j) && preemptable(c->in, j, head)) c->cand[n++] = j;
  }
  *nc = n;
  if (!n) return 0;
  qsort(c->cand, n, sizeof *c->cand, cmp_victim);
  size_t k = 0;
  memset(c->victim, 0, n * sizeof *c->victim);
  while (k < n && !fits_without(c, n, head)) c->victim[k++] = true;
  if (!fits_without(c, n, head)) return 0;
  size_t chosen = k;
  for (size_t i = k; i-- > 0;) { /* give back each one head fits without */
    c->victim[i] = false;
    if (fits_without(c, n, head)) chosen--;
    else c->victim[i] = true;
  }
  return chosen;
}

/* Is a job where the head must fit being stopped already? */
static bool scope_stopping(const preempt_ctx *c) {
  for (size_t i = 0; i < c->in->n_jobs; i++)
    if (c->in->jobs[i].state == GS_SCHED_RUNNING && c->in->jobs[i].stopping &&
        in_scope(c, &c->in->jobs[i]))
      return true;
  return false;
}

/* Make room for head where c says: WAIT_PREEMPTING with the victims'
 * decisions appended to wait[], or `otherwise` when none would do. */
static gs_sched_reason make_room(preempt_ctx *c, const gs_sched_job *head,
                                 gs_sched_reason otherwise, gs_sched_decision *wait,
                                 size_t *n_wait) {
  if (scope_stopping(c)) return GS_SCHED_WAIT_PREEMPTING;
  size_t nc = 0;
  if (!choose_victims(c, head, &nc)) return otherwise;
  for (size_t i = 0; i < nc; i++)
    if (c->victim[i])
      wait[(*n_wait)++] = (gs_sched_decision){c->cand[i]->id, c->cand[i]->vdev, GS_SCHED_PREEMPT,
                                              head->id};
  return GS_SCHED_WAIT_PREEMPTING;
}

int gs_sched_run(const gs_sched_input *in, gs_sched_decision *out, size_t *n_out, gs_err *e) {
  *n_out = 0;
  if (!in->n_jobs) return 0;
  const gs_sched_job **q = malloc(in->n_jobs * sizeof *q);
  gs_sched_decision *wait = malloc(in->n_jobs * sizeof *wait);
  held_data h = {.keys = malloc(in->n_jobs * sizeof *h.keys)};
  preempt_ctx pc = {.in = in,
                    .cand = malloc(in->n_jobs * sizeof *pc.cand),
                    .victim = malloc(in->n_jobs * sizeof *pc.victim),
                    .h = {.keys = malloc(in->n_jobs * sizeof *pc.h.keys)}};
  if (!q || !wait || !h.keys || !pc.cand || !pc.victim || !pc.h.keys) {
    free(q);
    free(wait);
    free(h.keys);
    free(pc.cand);
    free(pc.victim);
    free(pc.h.keys);
    return gs_err_set(e, GS_INTERNAL, "", "out of memory");
  }
  size_t n_start = 0, n_wait = 0;
  for (size_t v = 0; v < in->n_vdevs; v++) {
    const gs_sched_vdev *vd = &in->vdevs[v];
    if (vdev_of(in, vd->name) != vd) continue; /* a name given twice: the first counts */
    uint64_t used = 0;
    size_t nq = 0;
    h.n = 0;
    h.bytes = 0;
    for (size_t i = 0; i < in->n_jobs; i++) {
      const gs_sched_job *j = &in->jobs[i];
      if (strcmp(j->vdev, vd->name) != 0) continue;
      if (j->state == GS_SCHED_RUNNING) {
        used = j->planned_peak > UINT64_MAX - used ? UINT64_MAX : used + j->planned_peak;
        data_hold(&h, j);
      } else {
        q[nq++] = j;
      }
    }
    qsort(q, nq, sizeof *q, cmp_queue);
    gs_sched_reason blocked = vd->ready ? GS_SCHED_START : GS_SCHED_WAIT_EXECUTOR;
    for (size_t k = 0; k < nq; k++) {
      const gs_sched_job *j = q[k];
      gs_sched_reason why = blocked;
      if (why == GS_SCHED_START) {
        const gs_sched_quota *qt = quota_of(in, j->tenant);
        if (!fits(vd, used, &h, j)) why = GS_SCHED_WAIT_MEMORY;
        else if (!qt) why = GS_SCHED_WAIT_NO_TENANT;
        else if (qt->max_running && running_of(in, out, n_start, j->tenant) >= qt->max_running)
          why = GS_SCHED_WAIT_MAX_RUNNING;
      }
      pc.started = out;
      pc.n_started = n_start;
      if (why == GS_SCHED_WAIT_MEMORY && blocked == GS_SCHED_START) {
        /* The head of the queue: room may be made by stopping lower-priority jobs. */
        const gs_sched_quota *qt = quota_of(in, j->tenant);
        bool quota_ok = qt && (!qt->max_running ||
                               running_of(in, out, n_start, j->tenant) < qt->max_running);
        pc.vd = vd;
        pc.dev = NULL;
        if (quota_ok) why = make_room(&pc, j, why, wait, &n_wait);
      } else if (why == GS_SCHED_START && j->physical_wait && (pc.dev = device_of(in, vd->name))) {
        /* It met a full device: it starts when the device has room, made
         * by stopping lower-priority jobs of any of its vdevs if need be. */
        pc.vd = NULL;
        if (!fits_without(&pc, 0, j))
          why = make_room(&pc, j, GS_SCHED_WAIT_DEVICE, wait, &n_wait);
      }
      if (why == GS_SCHED_START) {
        out[n_start++] = (gs_sched_decision){j->id, vd->name, GS_SCHED_START, 0};
        used += j->planned_peak; /* fits() held: no overflow */
        data_hold(&h, j);
        continue;
      }
      wait[n_wait++] = (gs_sched_decision){j->id, vd->name, why, 0};
      if (blocked == GS_SCHED_START) blocked = GS_SCHED_WAIT_BEHIND;
    }
  }
  for (size_t i = 0; i < in->n_jobs; i++) {
    const gs_sched_job *j = &in->jobs[i];
    if (j->state == GS_SCHED_QUEUED && !vdev_of(in, j->vdev))
      wait[n_wait++] = (gs_sched_decision){j->id, j->vdev, GS_SCHED_WAIT_NO_VDEV, 0};
  }
  memcpy(out + n_start, wait, n_wait * sizeof *wait);
  *n_out = n_start + n_wait;
  free(q);
  free(wait);
  free(h.keys);
  free(pc.cand);
  free(pc.victim);
  free(pc.h.keys);
  return 0;
}

static int cmp_keep(const void *a, const void *b) {
  const gs_sched_job *x = *(const gs_sched_job *const *)a, *y = *(const gs_sched_job *const *)b;
  if (x->priority != y->priority) return x->priority > y->priority ? -1 : 1;
  if (x->run_started != y->run_started) return x->run_started < y->run_started ? -1 : 1;
  if (x->id != y->id) return x->id < y->id ? -1 : 1;
  return 0;
}

int gs_sched_shrink(const gs_sched_job *jobs, size_t n, const gs_sched_vdev *vd, bool *keep,
                    gs_err *e) {
  if (!n) return 0;
  const gs_sched_job **order = malloc(n * sizeof *order);
  held_data h = {.keys = malloc(n * sizeof *h.keys)};
  if (!order || !h.keys) {
    free(order);
    free(h.keys);
    return gs_err_set(e, GS_INTERNAL, "", "out of memory");
  }
  for (size_t i = 0; i < n; i++) order[i] = &jobs[i];
  qsort(order, n, sizeof *order, cmp_keep);
  uint64_t used = 0;
  for (size_t k = 0; k < n; k++) {
    const gs_sched_job *j = order[k];
    bool ok = fits(vd, used, &h, j);
    keep[j - jobs] = ok;
    if (!ok) continue;
    used += j->planned_peak; /* fits() held: no overflow */
    data_hold(&h, j);
  }
  free(order);
  free(h.keys);
  return 0;
}

gs_sched_oom gs_sched_oom_decide(const gs_sched_oom_in *in) {
  bool left = in->retries < in->max_retries;
  if (in->cause == 1) return GS_SCHED_OOM_REQUEUE; /* PHYSICAL */
  if (in->auto_fit) return left && in->micro_batch > 1 ? GS_SCHED_OOM_SMALLER : GS_SCHED_OOM_FAIL;
  return in->requeue && left ? GS_SCHED_OOM_REQUEUE : GS_SCHED_OOM_FAIL;
}

const char *gs_sched_reason_text(gs_sched_reason why) {
  switch (why) {
  case GS_SCHED_START: return "starts";
  case GS_SCHED_WAIT_MEMORY:
    return "waits for memory: its planned peak and data do not fit beside the vdev's running "
           "jobs";
  case GS_SCHED_WAIT_MAX_RUNNING: return "waits: its tenant runs max_running jobs";
  case GS_SCHED_WAIT_BEHIND: return "waits behind a job ahead of it in the vdev's queue";
  case GS_SCHED_WAIT_EXECUTOR: return "waits for its device's executor";
  case GS_SCHED_WAIT_NO_VDEV: return "waits: its vdev does not exist";
  case GS_SCHED_WAIT_NO_TENANT: return "waits: its tenant does not exist";
  case GS_SCHED_WAIT_PREEMPTING:
    return "waits while lower-priority jobs of its vdev are checkpointed and stopped for it";
  case GS_SCHED_PREEMPT: return "is preempted for a higher-priority job";
  case GS_SCHED_WAIT_DEVICE:
    return "waits for its device's memory: it met a full device, and the running jobs there "
           "hold more than leaves room for it";
  }
  return "waits";
}
