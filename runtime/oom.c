/*
 * oom.c: one builder for the OOM report (oom.h).
 *
 * Two builders of one report drift: the executor and the planner once
 * worded the same failure differently and, for FRAGMENTATION, suggested
 * different fits (the executor fitted the suggestions to the largest free
 * block even on a growth vdev with part of its limit unreserved, where that
 * block says nothing about what the vdev can still place). Here the cause
 * decides the words and the budget once:
 *  - QUOTA: the limit is full; suggestions fit the limit.
 *  - PHYSICAL: the device refused a region before the vdev reached its
 *    limit; suggestions fit what the vdev did reserve. Where the caller
 *    knows the device's budget (oversubscribed vdevs), it says who holds it.
 *  - FRAGMENTATION: enough free bytes, no block large enough. On a growth
 *    vdev with part of its limit unreserved the free bytes are split
 *    between regions and the unreserved rest; the suggestions are planned
 *    in growth regions against the limit (the planner simulates that
 *    layout), so what is suggested fits this vdev. With the whole limit
 *    reserved the free bytes lie in holes: suggestions fit the largest free
 *    block. The job as planned tells which sentence is true of it.
 */
#include "runtime/oom.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common/size.h"

static const char *sz(uint64_t bytes, char *buf) { return gs_size_format(bytes, buf, 32); }

const char *gs_oom_cause_name(gs_oom_cause c) {
  switch (c) {
  case GS_OOM_PHYSICAL: return "PHYSICAL";
  case GS_OOM_FRAGMENTATION: return "FRAGMENTATION";
  default: return "QUOTA";
  }
}

/* The FRAGMENTATION sentence; returns the bytes the suggestions must fit. */
static uint64_t explain_fragmentation(const gs_job_spec *spec, const gs_backend *b,
                                      const gs_train_failure *f, const char *vdev, char *out,
                                      size_t len) {
  const gs_alloc_stats *st = &f->why.stats;
  char a[32], bb[32], c[32], d[32], l[32];
  const uint64_t need = gs_alloc_block_size((size_t)f->bytes);
  /* What the job as planned needs, to say only what is true of it. */
  gs_plan jp;
  gs_err e2;
  gs_err_clear(&e2);
  bool planned = spec && gs_plan_job(spec, b, &jp, &e2) == 0;
  bool fits_pre = planned && gs_plan_fits(&jp, st->limit, GS_POLICY_PREALLOCATE);
  bool fits_grow = planned && gs_plan_fits(&jp, st->limit, GS_POLICY_GROWTH);
  if (planned) gs_plan_free(&jp);
  const char *tail;
  if (st->reserved < (st->limit & ~(uint64_t)(GS_ALLOC_ALIGN - 1))) {
    /* Part of the limit is unreserved, so this is a GROWTH vdev (a
     * preallocated one reserves all of it at creation): the free bytes are
     * split between its regions and the unreserved rest, and a tensor
     * cannot span two regions. Suggest what fits this layout. */
    if (fits_pre)
      tail = "The job's total is under the limit: a preallocate vdev of this limit (one "
             "region) would run it, and so would a smaller micro-batch (what fits, below) "
             "on this growth vdev.";
    else if (planned)
      tail = "The job as planned needs more than the limit in any layout, so it must "
             "shrink: what fits below fits this growth vdev.";
    else
      tail = "A preallocate vdev reserves the whole limit as one region and has no such "
             "boundaries.";
    snprintf(out, len,
             "a growth vdev reserves its memory in regions as the job asks for it (2 MiB, then "
             "twice the last, capped by what the limit leaves) and a tensor cannot span two "
             "regions: %s (%s of %s) needs %s in one block, but the largest free block of the "
             "%s reserved%s%s is %s and the %s of the %s limit still unreserved cannot hold it "
             "either. %s",
             f->tensor, gs_role_name(f->role), f->layer, sz(need, a), sz(st->reserved, bb),
             vdev ? " by vdev " : "", vdev ? vdev : "", sz(st->largest_free, c),
             sz(st->limit - st->reserved, d), sz(st->limit, l), tail);
    return st->limit;
  }
  /* The whole limit is reserved: the free bytes lie in holes between live
   * blocks (or, on a growth vdev, between its regions). */
  if (fits_grow)
    tail = " The job as planned fits the limit; on a vdev without holes (nothing else "
           "allocated in it) it would run.";
  else if (fits_pre)
    tail = " The job as planned fits a preallocate vdev of this limit with nothing else "
           "allocated in it, though not a growth vdev's regions.";
  else if (planned)
    tail = " The job as planned needs more than the limit, so it must shrink anyway.";
  else
    tail = "";
  snprintf(out, len,
           "%s%s has %s free in total but its largest free block is %s, smaller than the "
           "%s that %s (%s of %s) needs: free memory is fragmented (%.0f%%) and this vdev "
           "cannot reserve more.%s",
           vdev ? "vdev " : "the vdev", vdev ? vdev : "", sz(st->total_free, a),
           sz(st->largest_free, bb), sz(need, c), f->tensor, gs_role_name(f->role), f->layer,
           st->fragmentation * 100.0, tail);
  return st->largest_free;
}

int gs_oom_report_build(const gs_job_spec *spec, const gs_backend *b, const gs_train_failure *f,
                        const gs_oom_where *where, gs_oom_report *r, gs_err *e) {
  memset(r, 0, sizeof *r);
  if (!f || !f->oom)
    return gs_err_set(e, GS_INVALID_ARGUMENT, "", "the failure is not an out-of-memory one"),
           -EINVAL;
  static const gs_oom_where nowhere = {0};
  if (!where) where = &nowhere;
  const char *vdev = where->vdev && where->vdev[0] ? where->vdev : NULL;
  const gs_alloc_stats *st = &f->why.stats;
  char a[32], bb[32], c[32], d[32];
  snprintf(r->layer, sizeof r->layer, "%s", f->layer);
  snprintf(r->role, sizeof r->role, "%s", gs_role_name(f->role));
  snprintf(r->tensor, sizeof r->tensor, "%s", f->tensor);
  snprintf(r->shape, sizeof r->shape, "%s", f->shape);
  snprintf(r->dtype, sizeof r->dtype, "%s", gs_dtype_name(f->dtype));
  snprintf(r->vdev, sizeof r->vdev, "%s", vdev ? vdev : "");
  r->bytes = f->bytes;
  r->limit_bytes = st->limit;
  r->in_use_bytes = st->in_use;
  r->reserved_bytes = st->reserved;
  r->largest_free_bytes = st->largest_free;
  r->fragmentation = st->fragmentation;
  r->cause = f->why.cause;
  const uint64_t need = gs_alloc_block_size((size_t)f->bytes);
  char *x = r->explanation;
  const size_t xl = sizeof r->explanation;
  switch (f->why.cause) {
  case GS_OOM_PHYSICAL: {
    char rest[512];
    if (where->device_usable) {
      uint64_t others = where->device_held > st->reserved ? where->device_held - st->reserved : 0;
      snprintf(rest, sizeof rest,
               "The device's %s usable are oversubscribed (memory_oversubscribe): the other "
               "vdevs' jobs hold %s of it; this job fits once they have ended.",
               sz(where->device_usable, a), sz(others, bb));
    } else {
      snprintf(rest, sizeof rest,
               "Other vdevs or processes hold the rest of the device (it may be "
               "oversubscribed); the job's own quota is not what is full.");
    }
    snprintf(x, xl,
             "the physical device ran out of memory before %s%s reached its limit: the vdev "
             "holds %s of its %s limit and has reserved %s, but the device refused the region "
             "for %s (%s of %s %s). %s",
             vdev ? "vdev " : "this vdev", vdev ? vdev : "", sz(st->in_use, a), sz(st->limit, bb),
             sz(st->reserved, c), f->tensor, sz(f->bytes, d), f->layer, gs_role_name(f->role),
             rest);
    r->fit_bytes = st->reserved;
    break;
  }
  case GS_OOM_FRAGMENTATION:
    r->fit_bytes = explain_fragmentation(spec, b, f, vdev, x, xl);
    break;
  default: {
    char lim[96];
    if (vdev)
      snprintf(lim, sizeof lim, "vdev %s's", vdev);
    else
      snprintf(lim, sizeof lim, "its vdev's");
    snprintf(x, xl,
             "the job needs more memory than %s limit allows: %s of the %s limit are in use "
             "and %s (%s of %s) needs %s more%s. The device may have room; the vdev's quota is "
             "full, so the job must shrink (a smaller micro-batch with more accumulation steps "
             "keeps the effective batch) or move to a larger vdev.",
             lim, sz(st->in_use, a), sz(st->limit, bb), f->tensor, gs_role_name(f->role),
             f->layer, sz(need, c),
             f->bytes > st->limit ? ", and that one tensor is larger than the whole limit" : "");
    r->fit_bytes = st->limit;
    break;
  }
  }
  if (spec && r->fit_bytes) {
    gs_err e2;
    gs_err_clear(&e2);
    if (gs_plan_suggest(spec, b, r->fit_bytes, r->suggestions, GS_OOM_SUGGESTIONS,
                        &r->n_suggestions, &e2))
      r->n_suggestions = 0;
  }
  return 0;
}
