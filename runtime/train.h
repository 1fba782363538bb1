/*
 * train.h: gpushare's training runtime, one job on one device.
 *
 * gs_train_create() turns a job spec (spec.h, validated by model.h) into a job: it
 * allocates, ONCE and from the job's vdev allocator (alloc.h), every device
 * tensor a step will touch, each tagged (layer, role):
 *   weights     per parameter: the working copy the forward pass reads
 *               (fp32 in FLOAT32; fp16/bf16 in mixed precision)
 *   master      per parameter, mixed precision only: the fp32 masters the
 *               optimizer updates; working copies are cast from them after
 *               every optimizer step
 *   gradients   per parameter, fp32, accumulated over the micro-batches
 *   optimizer   per parameter: SGD momentum (1 slot, when momentum > 0) or
 *               Adam m and v (2 slots), fp32; plus one "job" block with the
 *               loss-scale state (scale, good steps, found-inf, skipped)
 *   activations per layer: its output (N, out) in the storage dtype, saved
 *               for backward (Flatten aliases its input and owns nothing; in
 *               FLOAT32 the last Dense writes the fp32 logits buffer directly)
 *   workspace   "job": the backward pass's activation-gradient slots of the
 *               largest layer tensor, and one op scratch of the largest
 *               *_workspace query over the layers
 *   batch       "job": images (f32 staging + dt copy in mixed precision),
 *               labels int32, logits f32 (mixed), dlogits f32, per-example
 *               loss f32, predictions int32
 * and frees it all on destroy, or on the first failure (the allocation that
 * failed is described in gs_train_failure). Nothing is allocated per step.
 *
 * Batches: spec.batch_size is the MICRO-batch b, the examples of one
 * forward/backward pass (what bounds activation memory). One optimizer step
 * runs accumulation_steps = k micro-batches, accumulating fp32 gradients,
 * and divides the loss gradient by b*k, so the EFFECTIVE batch is b*k and
 * the update equals one batch of b*k in FLOAT32 up to rounding. A "step"
 * (max_steps, checkpoint_every_steps, progress) is one optimizer step. An
 * epoch is floor(n / (b*k)) steps over a permutation of the train set drawn
 * from (seed, epoch); the last partial effective batch is dropped.
 *
 * Precision: FLOAT32; MIXED_BFLOAT16 and MIXED_FLOAT16
 * keep activations and working weights in 16 bits, fp32 masters and
 * gradients, logits cast to fp32 for the loss. MIXED_FLOAT16 scales the loss
 * gradient by a dynamic loss scale kept on the device (initial
 * spec.loss_scale.initial, default 2^15; x2 after growth_interval finite
 * steps, default 2000; x0.5 and the step skipped when a gradient is inf/NaN).
 *
 * Init: Glorot uniform kernels (limit sqrt(6 / (fan_in + fan_out)), fans as
 * Keras computes them), zero biases, from spec.seed via gs_rng (one stream
 * per layer). After each epoch the whole test set is evaluated (forward only,
 * in micro-batches, the last one partial).
 *
 * Checkpoints (ckpt.h) hold the fp32 masters, the optimizer state, the
 * loss-scale state, step, epoch, data position and Adam's t; a job resumed
 * from one produces bit for bit the losses and weights of a run that never
 * stopped (the same backend and thread count assumed).
 */
#ifndef GS_TRAIN_TRAIN_H
#define GS_TRAIN_TRAIN_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/error.h"
#include "kernels/backend.h"
#include "runtime/alloc.h"
#include "runtime/data.h"
#include "runtime/model.h"

/* After each optimizer step. */
typedef struct gs_train_progress {
  uint64_t step;          /* optimizer steps done, 1-based after the first */
  uint64_t total_steps;   /* steps this run will do (epochs x steps per epoch, or max_steps) */
  uint32_t epoch;         /* 1-based epoch in progress */
  uint32_t epochs;
  uint64_t step_in_epoch; /* 1-based */
  uint64_t steps_per_epoch;
  float loss;             /* mean train loss of this step's effective batch */
  float samples_per_second; /* over this epoch so far */
  float loss_scale;       /* current scale (1 unless MIXED_FLOAT16) */
  uint64_t skipped_steps; /* fp16 overflow steps so far */
  uint64_t memory_in_use; /* allocator's in_use */
  uint64_t memory_peak_step; /* allocator's peak in use during this step (the
                                runtime resets the peak at each step start) */
  uint64_t job_bytes;     /* this job's blocks in the allocator (the vdev's other
                             jobs not counted), as the allocator charges them */
  uint64_t host_bytes;    /* host memory this job holds besides its datasets and
                             the allocator's regions: its batch staging, its epoch
                             permutation, and a checkpoint's copy while one is
                             being written */
} gs_train_progress;

/* After each epoch (mirrors gpushare.v1.EpochMetrics). */
typedef struct gs_train_epoch {
  uint32_t epoch;          /* 1-based */
  uint64_t step;           /* optimizer steps done */
  float train_loss;        /* mean of this epoch's step losses (this run's) */
  float test_loss;         /* mean over the whole test set */
  float test_accuracy;     /* fraction in [0, 1] */
  float samples_per_second; /* training examples / wall time of the epoch */
  uint64_t peak_memory_bytes; /* allocator's peak in use so far */
  float loss_scale;
  uint64_t skipped_steps;  /* fp16 overflow steps of this epoch (this run's) */
} gs_train_epoch;

typedef struct gs_train_options {
  int threads;          /* CPU threads for ops; <= 0: 1 */
  uint32_t epochs;      /* > 0 overrides spec.epochs */
  bool has_max_steps;   /* overrides spec.max_steps with max_steps (0 = none) */
  uint64_t max_steps;
  bool has_precision;   /* overrides spec.precision with precision */
  gs_precision precision;
  /* Called on the job's thread; may be NULL. */
  void (*on_step)(void *user, const gs_train_progress *p);
  void (*on_epoch)(void *user, const gs_train_epoch *m);
  void *user;
  atomic_int *cancel;   /* != 0: stop before the next step (may be NULL) */
  const char *checkpoint_path; /* NULL: no checkpoints */
  uint32_t checkpoint_every;   /* > 0 overrides spec.checkpoint_every_steps */
  const char *resume_path;     /* NULL: start from the init */
} gs_train_options;

/* Why gs_train_create could not allocate (the OOM report's raw material). */
typedef struct gs_train_failure {
  bool oom;               /* an allocation failed (the fields below are set) */
  char layer[GS_MODEL_NAME_MAX]; /* "dense_1", or "job" */
  gs_role role;
  char tensor[96];        /* "dense_1.kernel", "activations", "ws", ... */
  char shape[64];         /* "(784, 256)", "(128, 28, 28, 32)" */
  gs_dtype dtype;
  uint64_t bytes;         /* what was asked for */
  gs_alloc_failure why;   /* cause and the allocator's stats at that moment */
} gs_train_failure;

/* Final numbers of a run (what gpushare-run --json prints). */
typedef struct gs_train_result {
  uint64_t steps;            /* optimizer steps done in total */
  uint32_t epochs_done;      /* complete epochs */
  float train_loss;          /* last epoch's mean train loss (or last step's) */
  float test_loss, test_accuracy; /* last evaluation, NaN when none ran */
  float samples_per_second;  /* training examples / training wall time of this run */
  uint64_t peak_memory_bytes;
  float loss_scale;
  uint64_t skipped_steps;    /* fp16 overflow steps of the whole job */
  bool cancelled;
} gs_train_result;

typedef struct gs_train gs_train;

/* ------------------------------------------------- the job's buffer list ---
 * gs_train_buffers() produces the list of device tensors gs_train_create
 * allocates, in the order it allocates them. The runtime and the planner
 * (runtime/plan.h) both call it, so the planner's peak is the allocator's by
 * construction: same tensors, same workspace queries, same block rounding. */
typedef enum gs_train_slot {
  GS_TSLOT_WEIGHTS = 0, /* per parameter: working copy (dt) */
  GS_TSLOT_MASTER,      /* per parameter, mixed only: fp32 master */
  GS_TSLOT_GRADIENT,    /* per parameter: fp32 gradient */
  GS_TSLOT_MOMENT1,     /* per parameter: SGD momentum / Adam m */
  GS_TSLOT_MOMENT2,     /* per parameter: Adam v */
  GS_TSLOT_OUTPUT,      /* per layer (not Flatten): its saved output */
  GS_TSLOT_IMAGES,      /* job: input batch in dt */
  GS_TSLOT_IMAGES_F32,  /* job, mixed only: fp32 staging of the batch */
  GS_TSLOT_LABELS,      /* job: (N) int32 */
  GS_TSLOT_LOGITS,      /* job, mixed only: (N, K) fp32 logits */
  GS_TSLOT_DLOGITS,     /* job: (N, K) fp32 */
  GS_TSLOT_LOSS,        /* job: (N) fp32 per-example loss */
  GS_TSLOT_PREDICTIONS, /* job: (N) int32 */
  GS_TSLOT_ACT_GRAD,    /* job: activation-gradient slot (index 0, 1, ...) */
  GS_TSLOT_OP_WORKSPACE,/* job: op scratch (largest *_workspace query) */
  GS_TSLOT_LOSS_SCALE,  /* job: loss-scale state block */
  GS_TSLOT_STATE,       /* per state tensor (batch_norm's running statistics), fp32 */
  GS_TSLOT_SAVED,       /* per layer: what it keeps for its backward beside its output */
} gs_train_slot;

typedef struct gs_train_buffer {
  const gs_layer *layer;  /* NULL: a job-wide buffer (tagged "job") */
  uint32_t index;         /* parameter index (per-parameter slots) or gradient slot */
  gs_train_slot slot;
  gs_role role;
  char tensor[96];        /* "dense_1.kernel", "dense_1.output", "images", ... */
  gs_dtype dtype;
  uint32_t rank;          /* 0: a raw byte count (op workspace, loss-scale block) */
  uint64_t shape[4];      /* rank dims ((N, ...) for per-example tensors) */
  uint64_t bytes;         /* what is asked of the allocator */
  uint64_t block_bytes;   /* gs_alloc_block_size(bytes): what the allocator charges */
} gs_train_buffer;

/* Calls fn once per buffer for model m with the resolved recipe r (micro-batch,
 * dtype, optimizer slots) on backend b (its workspace queries).
 * eval_remainder: the size of the last, partial test micro-batch (test
 * examples % micro-batch; 0 when there is no test set or it is unknown); the
 * op scratch covers it too. Stops at and returns fn's first nonzero value;
 * returns 0 after the last buffer. */
int gs_train_buffers(const gs_model *m, const gs_recipe *r, const gs_backend *b,
                     uint32_t eval_remainder,
                     int (*fn)(void *user, const gs_train_buffer *buf), void *user);

/* Builds the model (gs_model_build), checks both datasets against it,
 * allocates every tensor from `a`, initialises (or restores from
 * opt->resume_path). `train`/`test` are borrowed and must outlive the job;
 * `test` may be NULL (no evaluation). On failure returns a negative value,
 * fills e (INVALID_ARGUMENT for the spec, RESOURCE_EXHAUSTED for memory,
 * with the layer, role and bytes in the message) and, when `fail` is not
 * NULL, *fail; everything allocated is freed. */
int gs_train_create(const gs_job_spec *spec, gs_backend *b, gs_alloc *a,
                    const gs_dataset *train, const gs_dataset *test,
                    const gs_train_options *opt, gs_train **out, gs_train_failure *fail,
                    gs_err *e);
void gs_train_destroy(gs_train *t);

/* Runs until the epochs are done, max_steps is reached or cancel is set.
 * Returns 0 (also when cancelled: see gs_train_result.cancelled) or a
 * negative value with e filled. A MIXED_FLOAT16 job that reaches its end
 * with every optimizer step skipped (gradient overflow at every loss scale:
 * the weights never moved) returns -EBUSY, FAILED_PRECONDITION on field
 * "precision", with the step count and the loss scales in the message. */
int gs_train_run(gs_train *t, gs_err *e);
/* Runs at most n more optimizer steps (fewer at the end of the run); epochs
 * still end with an evaluation and a checkpoint. For tests and for the
 * executor's per-step scheduling. *done (may be NULL) tells whether the run
 * is over. The call that ends the run returns gs_train_run's error for a run
 * whose every step was skipped (after its last checkpoint). */
int gs_train_steps(gs_train *t, uint64_t n, bool *done, gs_err *e);
/* Device time of the last gs_train_steps call: the backend's timer (the
 * job's thread and pool workers' CPU time on the cpu device, stream events
 * on a GPU), or its wall time where the backend has none. The executor
 * charges it to the job's vdev (executor/fairshare.h). */
double gs_train_last_device_seconds(const gs_train *t);

void gs_train_result_get(const gs_train *t, gs_train_result *r);
const gs_model *gs_train_model(const gs_train *t);
/* Resolved recipe (after the options' overrides). */
const gs_recipe *gs_train_recipe(const gs_train *t);
uint64_t gs_train_total_steps(const gs_train *t);

/* Copy the fp32 master (or, in FLOAT32, the weights) of parameter `param` of
 * layer `layer` to host memory: count floats (= the param's count). */
int gs_train_read_param(gs_train *t, uint32_t layer, uint32_t param, float *host, size_t count);

/* A job's memory over its steps (convert/spec_pb.h turns it into a
 * gpushare.v1.MemoryTimeline, present/ into a chart). */
typedef struct gs_timeline_step {
  uint64_t step;              /* the (last) optimizer step of this entry */
  uint64_t peak_in_use_bytes; /* the allocator's peak in use during it */
} gs_timeline_step;

typedef struct gs_timeline_row {
  char layer[GS_MODEL_NAME_MAX]; /* "dense_1", or "job" */
  char kind[32];                 /* "dense", ..., "job" */
  char output_shape[64];         /* "(128, 14, 14, 32)"; "" for "job" */
  uint64_t parameters;
  uint64_t bytes[GS_ROLE_COUNT]; /* measured, by gs_role */
} gs_timeline_row;

typedef struct gs_timeline {
  gs_timeline_step *steps;    /* n_steps entries, malloc'd */
  size_t n_steps;
  gs_timeline_row *at_peak;   /* n_at_peak rows, malloc'd */
  size_t n_at_peak;
  uint64_t peak_bytes;
  uint64_t planned_peak_bytes; /* 0: not planned */
} gs_timeline;

/* The job's memory timeline so far: the peak in use of each optimizer step
 * (at most GS_TRAIN_TIMELINE_MAX entries: past that, neighbouring steps
 * merge, an entry then holds the max over its steps and the step number of
 * its last one), the bytes by layer and role at the job's peak (one row per
 * layer holding memory, then "job"), peak_bytes, and planned_peak_bytes as
 * given (0: none). Free *out with gs_timeline_free. Returns 0 or -ENOMEM.
 * The per-step peaks reset the allocator's peak at each step start: a vdev
 * allocator shared by several jobs reports the vdev's per-step peak. */
#define GS_TRAIN_TIMELINE_MAX 512
int gs_train_memory_timeline(const gs_train *t, uint64_t planned_peak_bytes, gs_timeline *out);
void gs_timeline_free(gs_timeline *tl);

/* Evaluate the whole test set now (forward only). */
int gs_train_evaluate(gs_train *t, float *loss, float *accuracy, gs_err *e);

/* Write a checkpoint now / the fp32 weights as safetensors ("dense_1.kernel",
 * "dense_1.bias", ...; metadata names the job and the step). */
int gs_train_checkpoint(gs_train *t, const char *path, gs_err *e);
int gs_train_export_safetensors(gs_train *t, const char *path, gs_err *e);

#endif
