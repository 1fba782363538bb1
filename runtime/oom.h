/*
 * oom.h: the report of an allocation that failed, built once for everyone.
 *
 * When gs_train_create cannot place a tensor, the job fails and a person
 * must learn three things: what could not be placed (the tensor: layer,
 * role, shape, dtype, bytes), why (the vdev's numbers and the cause: QUOTA,
 * PHYSICAL or FRAGMENTATION, in a sentence an ML engineer reads at a
 * glance) and what would fit (the planner's suggestions). The executor
 * stores that report with the job and gpushare-run prints it; both call
 * gs_oom_report_build, so the daemon and the runner say the same words and
 * suggest the same fit. convert/spec_pb.h turns it into a
 * gpushare.v1.OomReport and present/ into text.
 */
#ifndef GS_RUNTIME_OOM_H
#define GS_RUNTIME_OOM_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "kernels/backend.h"
#include "runtime/alloc.h"
#include "runtime/plan.h"
#include "runtime/spec.h"
#include "runtime/train.h"

#define GS_OOM_SUGGESTIONS 4 /* what-would-fit lines in a report */

/* Where the job ran, as far as the caller knows it (every field optional). */
typedef struct gs_oom_where {
  const char *vdev;        /* the vdev's name; NULL: unnamed */
  uint64_t device_usable;  /* > 0: the device's memory is a budget shared by
                              oversubscribed vdevs, of this many bytes... */
  uint64_t device_held;    /* ...of which the device's vdevs (this one
                              included) hold this many at the failure */
} gs_oom_where;

typedef struct gs_oom_report {
  char layer[GS_MODEL_NAME_MAX]; /* "dense_1", or "job" */
  char role[32];                 /* gs_role_name */
  char tensor[96];               /* "dense_1.kernel" */
  char shape[64];                /* "(784, 256)" */
  char dtype[16];                /* gs_dtype_name */
  uint64_t bytes;                /* what was asked for */
  char vdev[64];                 /* "" when unnamed */
  uint64_t limit_bytes, in_use_bytes, reserved_bytes, largest_free_bytes;
  double fragmentation;          /* 0..1 */
  gs_oom_cause cause;
  uint64_t fit_bytes;            /* what the suggestions were fitted to (0: none tried) */
  char explanation[2048];
  gs_plan_suggestion suggestions[GS_OOM_SUGGESTIONS];
  size_t n_suggestions;
} gs_oom_report;

/* The report of a failed gs_train_create (f->oom set) for `spec`, the job as
 * it was created, planned on `b`. What would fit (gs_plan_suggest) is
 * fitted to: the vdev's limit for QUOTA; the bytes the vdev did reserve for
 * PHYSICAL; for FRAGMENTATION the limit, laid out in growth regions, when
 * part of the limit is unreserved (a growth vdev whose regions and
 * unreserved rest each fall short of the tensor: the suggestions are
 * planned in that layout, so they fit this vdev), else the largest free
 * block (the whole limit is reserved and the free bytes lie in holes).
 * `spec` may be NULL (no suggestions), `where` NULL (nothing known of the
 * vdev). Returns 0 or -EINVAL (f is not an OOM), with e filled. */
int gs_oom_report_build(const gs_job_spec *spec, const gs_backend *b, const gs_train_failure *f,
                        const gs_oom_where *where, gs_oom_report *out, gs_err *e);

/* "QUOTA", "PHYSICAL", "FRAGMENTATION". */
const char *gs_oom_cause_name(gs_oom_cause c);

#endif
