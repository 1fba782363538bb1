/*
 * plan.h: a job's memory, known before it runs.
 *
 * The planner walks the same model (model.h) and the same buffer list the
 * training runtime allocates (train.h: weights, masters, gradients,
 * optimizer state, saved activations, workspace, batch buffers), sized with
 * the same backend workspace queries and the allocator's block rounding
 * (gs_alloc_block_size), so its peak is what the vdev allocator will
 * measure, without allocating anything. The same calls serve gpushare-run
 * (--plan, --memory-limit), the daemon's submit (admission, auto_fit) and
 * `gpuctl plan`, and the OOM reports (runtime/oom.h: what would fit). The
 * plan is plain C; convert/spec_pb.h turns it into a gpushare.v1.Plan and
 * present/ into the table people read.
 */
#ifndef GS_PLAN_H
#define GS_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "kernels/backend.h"
#include "runtime/alloc.h"
#include "runtime/spec.h"
#include "runtime/train.h"

typedef struct gs_plan_row {
  char layer[64];         /* "dense_1", or "job" for job-wide buffers */
  char kind[32];          /* "dense", "conv2d", ..., "job" */
  char output_shape[64];  /* "(128, 14, 14, 32)" with the micro-batch */
  uint64_t parameters;
  uint64_t bytes[GS_ROLE_COUNT]; /* by gs_role, after allocator rounding */
  char keeps[320];        /* what the layer keeps for its backward besides its output,
                             "mean (16) fp32 256 B, ..." ("" when nothing) */
} gs_plan_row;

typedef struct gs_plan {
  gs_plan_row *rows;      /* one per layer, then "job"; malloc'd */
  size_t n_rows;
  uint64_t by_role[GS_ROLE_COUNT];
  uint64_t peak_bytes;    /* what the allocator's peak in use will be */
  uint64_t parameters;
  uint32_t micro_batch;   /* spec.batch_size as planned */
  uint32_t accumulation_steps;
  gs_precision precision;
  /* addition: the allocator block sizes in allocation order (malloc'd), for
   * gs_plan_fits' simulation of a GROWTH vdev's regions */
  uint64_t *blocks;
  size_t n_blocks;
} gs_plan;

/* Plan spec as it stands (validates it like gs_model_build; INVALID_ARGUMENT
 * with the field path on a bad spec). `b` answers the workspace queries. */
int gs_plan_job(const gs_job_spec *spec, const gs_backend *b, gs_plan *out,
                gs_err *e);
void gs_plan_free(gs_plan *p);

/* What would fit under `limit`: up to max suggestions (the largest
 * micro-batch dividing the effective batch that fits, with the accumulation
 * that keeps the effective batch; mixed precision where the job is fp32),
 * each with its predicted peak and the saving against the current plan. */
typedef struct gs_plan_suggestion {
  char what[256];               /* "micro-batch 32 x 4 accumulation steps" */
  uint32_t micro_batch;
  uint32_t accumulation_steps;
  gs_precision precision;
  uint32_t sequence_length;     /* a language model's shorter input; 0: unchanged */
  uint64_t predicted_peak_bytes;
  uint64_t saving_bytes;
} gs_plan_suggestion;
int gs_plan_suggest(const gs_job_spec *spec, const gs_backend *b, uint64_t limit,
                    gs_plan_suggestion *out, size_t max, size_t *n, gs_err *e);

/* Admission against a vdev limit. fits: the plan as submitted fits. With
 * auto_fit and no fit: the largest micro-batch dividing the effective batch
 * (batch_size x accumulation_steps) that fits, and the accumulation that
 * keeps the effective batch (chosen = true). Neither: refused, and `why` says
 * so with the plan's summary, the suggestion that fits, or, when even
 * micro-batch 1 does not fit, which role dominates. */
typedef struct gs_admission {
  bool fits;          /* as submitted, or after auto-fit */
  bool chosen;        /* auto-fit changed micro-batch/accumulation */
  uint32_t micro_batch;
  uint32_t accumulation_steps;
  gs_plan plan;       /* of what will run (or of the refused spec) */
  char why[2048];     /* the refusal, when !fits */
} gs_admission;
int gs_plan_admit(const gs_job_spec *spec, const gs_backend *b, uint64_t limit,
                  bool auto_fit, gs_admission *out, gs_err *e);
void gs_admission_free(gs_admission *a);

/* ---- Fitting a limit is more than peak <= limit: a
 * GROWTH vdev reserves regions (2 MiB, then twice the last, capped by what
 * the limit leaves) and a block never spans two, so a large buffer late in
 * the list can find only scraps. gs_plan_fits simulates the policy;
 * PREALLOCATE packs the blocks end to end and fits iff peak <= limit.
 * gs_plan_admit and gs_plan_suggest (above) judge fits as GROWTH, the
 * stricter policy (what fits it fits PREALLOCATE too); the _policy
 * variants take the vdev's policy. ---- */
bool gs_plan_fits(const gs_plan *p, uint64_t limit, gs_alloc_policy policy);
int gs_plan_admit_policy(const gs_job_spec *spec, const gs_backend *b, uint64_t limit,
                         gs_alloc_policy policy, bool auto_fit, gs_admission *out, gs_err *e);
int gs_plan_suggest_policy(const gs_job_spec *spec, const gs_backend *b,
                           uint64_t limit, gs_alloc_policy policy, gs_plan_suggestion *out,
                           size_t max, size_t *n, gs_err *e);

/* ---- the plan as JSON, for scripts (gpushare-run --plan --json) ---- */

/* The plan as one JSON object (micro_batch, accumulation_steps,
 * effective_batch, precision, parameters, peak_bytes, limit_bytes, fits when
 * limit > 0, by_role, rows[] with bytes by role). malloc'd; NULL on ENOMEM. */
char *gs_plan_json(const gs_plan *p, uint64_t limit);
#endif
