/*
 * admit.h: the control plane's calls into the training runtime (planner,
 * model, IDX reader), all in admit.c: the rest of control/ includes nothing
 * from runtime/ and sees only protobuf messages and plain figures.
 */
#ifndef GS_ADMIT_H
#define GS_ADMIT_H

#include <stdbool.h>
#include <stdint.h>

#include "common/error.h"
#include "control/call.h"
#include "control/daemon.h"
#include "control/store.h"
#include "kernels/backend.h"
#include "proto/gpushare.pb-c.h"

/* What admission decided for a job in a vdev. */
typedef struct gs_admit {
  bool fits;                   /* as submitted, or after auto-fit */
  bool chosen;                 /* auto-fit changed micro-batch/accumulation */
  uint32_t micro_batch;
  uint32_t accumulation_steps;
  uint64_t peak_bytes;         /* planned peak of what will run */
  Gpushare__V1__Plan *plan;    /* from the arena (NULL: out of memory) */
  char why[2048];              /* the refusal, when !fits */
} gs_admit;

/* The plan of spec as a message from the arena; fits judged for vdev's
 * limit and policy (vdev NULL: no limit), with the host bytes of the
 * datasets as submit charges them where they can be read (the vdev
 * tenant's). Errors name spec.* fields. */
int gs_admit_plan(gs_daemon *d, gs_call_arena *a, const Gpushare__V1__JobSpec *spec,
                  const gs_vdev *vdev, Gpushare__V1__Plan **out, gs_err *e);
/* Submit's checks: the model builds, the datasets exist (the tenant's),
 * match the model's input and classes, and hold one effective batch.
 * *data_bytes: the host bytes the datasets hold once loaded. */
int gs_admit_check(gs_daemon *d, const char *tenant, const Gpushare__V1__JobSpec *spec,
                   uint64_t *data_bytes, gs_err *e);
/* Admission of spec in vdev v (auto_fit as the spec asks), with data_bytes
 * of datasets on the host: on the cpu device they are vdev memory, so the
 * plan must fit in what they leave of the limit; on a GPU they must fit a
 * host budget the size of the limit. 0 with out filled (out->fits false:
 * refused, out->why says why), or -1 with e. */
int gs_admit_job(const gs_devices *ds, gs_call_arena *a, const Gpushare__V1__JobSpec *spec,
                 const gs_vdev *v, uint64_t data_bytes, gs_admit *out, gs_err *e);
/* A new micro-batch for a job that runs with micro x accum: the largest
 * micro-batch that divides the effective batch (micro x accum, which it
 * keeps), is at most micro (below it when `below`), and whose plan fits
 * `limit` bytes of v (v's policy and device; data_bytes of the job's
 * datasets as gs_admit_job counts them). 0 with out filled (out->fits
 * false when none fits; out->plan is NULL), or a negative errno with e. */
int gs_admit_replan(const gs_devices *ds, const Gpushare__V1__JobSpec *spec, const gs_vdev *v,
                    uint64_t limit,
                    uint64_t data_bytes, uint32_t micro, uint32_t accum, bool below,
                    gs_admit *out, gs_err *e);
/* The planned peak of spec run on `device` with micro-batch 1
 * (accumulation raised to keep its effective batch micro x accum): the
 * least it can hold. */
int gs_admit_least_peak(const gs_devices *ds, const char *device,
                        const Gpushare__V1__JobSpec *spec, uint32_t micro, uint32_t accum,
                        uint64_t *peak, gs_err *e);
/* The backend whose sizes plan a job on the device named `device` of ds:
 * the cpu backend for `cpu` (or a name ds does not hold), and for a GPU the
 * CUDA plugin's size queries (kernels/cuda_sizes.h) with the cuBLASLt
 * workspace the plugin picks for the newest GPU of ds, so that the plan is
 * what the executor's allocator will measure there. No CUDA is loaded. */
const gs_backend *gs_admit_backend(const gs_devices *ds, const char *device);
/* Is the file at path an IDX file gpushare can train on? 0, or -1 with e
 * set: INVALID_ARGUMENT, field "data", naming the dataset and what is wrong. */
int gs_admit_idx_check(const char *path, const char *name, gs_err *e);
/* Is the file at path what an upload of `format` (a
 * gpushare.v1.DatasetFormat) says it is: an IDX file, a .npy images or
 * labels array, text, or uint16 token ids each below vocab_size (read only
 * for DATASET_FORMAT_TOKENS_U16)? 0, or a negative code with e set: field
 * "format" or "vocab_size" for a value the request got wrong, else "data",
 * naming the dataset and what is wrong with its file. */
int gs_admit_upload_check(const char *path, const char *name, int format, uint32_t vocab_size,
                          gs_err *e);

#endif
