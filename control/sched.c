/*
 * sched.c: the scheduler as a pure function (see sched.h).
 *
 * For each vdev, in the order given: the bytes its RUNNING jobs hold are
 * summed, its QUEUED jobs sorted (priority, then submit time, then id) and
 * walked until the first that cannot start; that one waits with its reason
 * and every one after it waits behind it. Running counts per tenant are
 * kept across vdevs, so a job started in one vdev counts against
 * max_running in the next. Queued jobs of a vdev that is not ready, or
 * that does not exist, wait with that reason.
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

int gs_sched_run(const gs_sched_input *in, gs_sched_decision *out, size_t *n_out, gs_err *e) {
  *n_out = 0;
  if (!in->n_jobs) return 0;
  const gs_sched_job **q = malloc(in->n_jobs * sizeof *q);
  gs_sched_decision *wait = malloc(in->n_jobs * sizeof *wait);
  if (!q || !wait) {
    free(q);
    free(wait);
    return gs_err_set(e, GS_INTERNAL, "", "out of memory");
  }
  size_t n_start = 0, n_wait = 0;
  for (size_t v = 0; v < in->n_vdevs; v++) {
    const gs_sched_vdev *vd = &in->vdevs[v];
    if (vdev_of(in, vd->name) != vd) continue; /* a name given twice: the first counts */
    uint64_t used = 0;
    size_t nq = 0;
    for (size_t i = 0; i < in->n_jobs; i++) {
      const gs_sched_job *j = &in->jobs[i];
      if (strcmp(j->vdev, vd->name) != 0) continue;
      if (j->state == GS_SCHED_RUNNING) used += j->planned_peak;
      else q[nq++] = j;
    }
    qsort(q, nq, sizeof *q, cmp_queue);
    gs_sched_reason blocked = vd->ready ? GS_SCHED_START : GS_SCHED_WAIT_EXECUTOR;
    for (size_t k = 0; k < nq; k++) {
      const gs_sched_job *j = q[k];
      gs_sched_reason why = blocked;
      if (why == GS_SCHED_START) {
        const gs_sched_quota *qt = quota_of(in, j->tenant);
        if (used + j->planned_peak > vd->memory_limit) why = GS_SCHED_WAIT_MEMORY;
        else if (!qt) why = GS_SCHED_WAIT_NO_TENANT;
        else if (qt->max_running && running_of(in, out, n_start, j->tenant) >= qt->max_running)
          why = GS_SCHED_WAIT_MAX_RUNNING;
      }
      if (why == GS_SCHED_START) {
        out[n_start++] = (gs_sched_decision){j->id, vd->name, GS_SCHED_START};
        used += j->planned_peak;
        continue;
      }
      wait[n_wait++] = (gs_sched_decision){j->id, vd->name, why};
      if (blocked == GS_SCHED_START) blocked = GS_SCHED_WAIT_BEHIND;
    }
  }
  for (size_t i = 0; i < in->n_jobs; i++) {
    const gs_sched_job *j = &in->jobs[i];
    if (j->state == GS_SCHED_QUEUED && !vdev_of(in, j->vdev))
      wait[n_wait++] = (gs_sched_decision){j->id, j->vdev, GS_SCHED_WAIT_NO_VDEV};
  }
  memcpy(out + n_start, wait, n_wait * sizeof *wait);
  *n_out = n_start + n_wait;
  free(q);
  free(wait);
  return 0;
}

const char *gs_sched_reason_text(gs_sched_reason why) {
  switch (why) {
  case GS_SCHED_START: return "starts";
  case GS_SCHED_WAIT_MEMORY:
    return "waits for memory: its planned peak does not fit beside the vdev's running jobs";
  case GS_SCHED_WAIT_MAX_RUNNING: return "waits: its tenant runs max_running jobs";
  case GS_SCHED_WAIT_BEHIND: return "waits behind a job ahead of it in the vdev's queue";
  case GS_SCHED_WAIT_EXECUTOR: return "waits for its device's executor";
  case GS_SCHED_WAIT_NO_VDEV: return "waits: its vdev does not exist";
  case GS_SCHED_WAIT_NO_TENANT: return "waits: its tenant does not exist";
  }
  return "waits";
}
