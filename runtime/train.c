/*
 * train.c: the training loop of one gpushare job over the backend contract.
 *
 * Design, in the order a job lives:
 *  1. create: gs_model_build validates the spec and infers shapes; the
 *     datasets are checked against the model; every device tensor is
 *     allocated from the job's vdev allocator with a (layer, role) tag (see
 *     train.h for the list), so memory is fixed before the first step and an
 *     allocation failure names the tensor that did not fit. Kernels are
 *     Glorot-initialised on the host from gs_rng and copied in; masters,
 *     optimizer state and the loss-scale block follow, or all come back from
 *     a checkpoint.
 *  2. step (one optimizer step): the fp32 gradients start at zero (the last
 *     optimizer step consumed them; a first step clears them); for each of the k
 *     micro-batches gather b examples of the epoch's permutation, copy them
 *     in (cast to the storage dtype in mixed precision), run the layers
 *     forward (fused ReLU in place), cast the logits to fp32, run the fused
 *     softmax cross-entropy whose gradient is scaled by the device loss
 *     scale and divided by b*k, and run the layers backward through the
 *     gradient slots (two for a line, more where a layer graph keeps a
 *     shortcut's gradient across a block; the backend accumulates dw/db,
 *     and `accumulate` sums an output's gradient over the layers that take
 *     it). Then, for
 *     fp16, unscale and check every gradient (found_inf on the device), step
 *     the optimizer with skip = found_inf, refresh the 16-bit working
 *     copies from the masters and update the loss scale.
 *  3. bookkeeping on the host: per-example losses and the small loss-scale
 *     block are copied out after each step (the only synchronisation), which
 *     gives the progress numbers and Adam's t (the count of steps that were
 *     not skipped, known one step late, which is exact since a skipped step
 *     leaves the weights and the optimizer state as they were).
 *  4. epoch end: evaluate the test set, report, checkpoint.
 * The buffer list of step 1 is gs_train_buffers(), one function the planner
 * (runtime/plan.c) calls too, so a plan's peak is the allocator's by
 * construction. Memory is watched per step: the allocator's peak is reset
 * at each step start and read at its end (the job keeps its own overall
 * peak), giving the timeline of gs_train_memory_timeline, and the bytes by
 * (layer, role) are snapshotted when in use reaches a new high.
 * A job's numbers depend only on the spec, the seed, the backend and the
 * thread count, so a resumed job reproduces an uninterrupted one bit for bit.
 */
#include "runtime/train.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/fpenv.h"
#include "runtime/ckpt.h"
#include "runtime/safetensors.h"

/* Loss-scale block on the device: one 256-byte allocation. */
#define LS_SCALE 0   /* float: current loss scale (1 unless fp16) */
#define LS_ONE 4     /* float: the constant 1 (grad scale of bf16/fp32/eval) */
#define LS_GOOD 8    /* int32: finite steps since the last change */
#define LS_FOUND 12  /* int32: found_inf of the step in progress */
#define LS_SKIPPED 16 /* int64: steps skipped so far */
#define LS_BYTES 24

/* Live bytes of one (layer, role) pair, from gs_alloc_foreach_tag. */
typedef struct tag_bytes {
  char layer[GS_MODEL_NAME_MAX];
  gs_role role;
  uint64_t bytes;
} tag_bytes;

#define NP GS_MODEL_MAX_PARAMS
typedef struct lstate {
  void *w[NP];      /* working copy the forward pass reads (dt) */
  float *master[NP];/* fp32 masters (== w in FLOAT32) */
  float *grad[NP];  /* fp32 gradients */
  float *m[NP];     /* SGD momentum / Adam m */
  float *v[NP];     /* Adam v */
  float *state[GS_MODEL_MAX_STATE]; /* batch_norm's running statistics, fp32 */
  void *saved[GS_MODEL_MAX_SAVED];  /* what the forward keeps for the backward */
  void *act;       /* output (N, out) in dt; Flatten: its input's buffer */
} lstate;

struct gs_train {
  gs_model model;
  gs_recipe r;           /* model.recipe after the options' overrides */
  char name[128];        /* spec.name, for metadata */
  gs_backend *b;
  gs_alloc *a;
  gs_exec *ex;
  const gs_dataset *train, *test;
  gs_train_options opt;
  double last_device_seconds; /* device time of the last gs_train_steps call */
  gs_dtype dt;
  bool mixed, fp16;
  bool grads_zero;       /* every gradient is zero: the last optimizer step consumed them */
  uint32_t micro;        /* the micro-batch of the step in progress (0-based) */
  lstate *ls;
  int32_t *gslot_of;     /* backward: per layer, the slot of its output's gradient */
  bool *gslot_busy;      /* backward: per slot, in use */

  /* device buffers */
  void *x;               /* input batch (N, H, W, C) in dt */
  float *x32;            /* fp32 staging of the batch (== x in FLOAT32) */
  int32_t *labels;       /* (N) */
  float *logits;         /* (N, K) f32 */
  float *dlogits;        /* (N, K) f32 */
  float *loss;           /* (N) f32 per example */
  int32_t *pred;         /* (N) */
  void **g;              /* activation-gradient slots (n_g), dt */
  uint32_t n_g;
  void *ws;              /* op scratch */
  uint8_t *state;        /* loss-scale block, LS_* offsets */
  void **blocks;         /* every allocation, for destroy */
  size_t n_blocks, cap_blocks;
  uint64_t dev_bytes;    /* what the allocator charges for the blocks (rounded) */

  /* host buffers */
  float *h_img;
  int32_t *h_lab, *h_pred;
  float *h_loss;
  uint64_t *perm;        /* current epoch's permutation of the train set */
  uint64_t *eval_idx;
  int64_t perm_epoch;    /* epoch perm holds, -1 none */
  uint64_t host_bytes;   /* the host buffers above together */

  /* where the job stands */
  uint64_t step;         /* optimizer steps done */
  uint32_t epoch;        /* 0-based epoch in progress */
  uint64_t step_in_epoch;/* steps done in this epoch */
  uint64_t opt_t;        /* optimizer steps that were not skipped */
  float scale_host;
  int32_t good_host;
  int64_t skipped_host;
  int64_t epoch_skipped0; /* skipped_host at the start of the epoch in progress
                             (or at the resume, for an epoch resumed mid-way) */
  uint64_t steps_per_epoch, total_steps;
  uint32_t ckpt_every;

  /* measurements */
  double epoch_loss_sum, epoch_time, run_time;
  uint64_t epoch_steps, epoch_samples, run_samples;
  float last_step_loss, last_epoch_loss;
  float test_loss, test_acc;
  uint64_t eval_step;    /* step of the last evaluation (UINT64_MAX none) */
  uint64_t ckpt_step;    /* step of the last checkpoint taken (UINT64_MAX none) */
  struct ck_write *ck_flight; /* a periodic checkpoint still being written, or NULL */
  uint32_t epochs_done;
  bool cancelled, finished;

  /* memory timeline (gs_train_memory_timeline) */
  uint64_t peak_max;     /* the job's peak in use: per-step peaks reset the allocator's */
  uint64_t tl_step[GS_TRAIN_TIMELINE_MAX]; /* last step of each entry */
  uint64_t tl_peak[GS_TRAIN_TIMELINE_MAX]; /* peak in use over the entry's steps */
  uint32_t tl_n;         /* complete entries */
  uint64_t tl_stride;    /* steps per entry (doubles when the table fills) */
  uint64_t tl_open_n, tl_open_peak, tl_open_step; /* the entry being filled */
  tag_bytes *snap;       /* live bytes by (layer, role) at the peak */
  size_t n_snap, cap_snap;
  uint64_t snap_total;   /* in_use when the snapshot was taken */
};

/* Input k of layer l: the batch, or the output of the layer it names. */
static const void *layer_input(const gs_train *t, const gs_layer *l, uint32_t k) {
  int32_t j = l->inputs[k];
  return j < 0 ? t->x : t->ls[j].act;
}

static size_t input_channels(const gs_model *m, const gs_layer *l, uint32_t k) {
  int32_t j = l->inputs[k];
  return j < 0 ? m->input.c : m->layers[j].out.c;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A backend op that fails is a device error: the job fails with its name. */
#define OP(call)                                                                    \
  do {                                                                              \
    int rc_ = (call);                                                               \
    if (rc_ < 0)                                                                    \
      return gs_err_set(e, GS_INTERNAL, "", "backend %s: %s failed (%d)", t->b->name, \
                        #call, rc_),                                                \
             rc_;                                                                   \
  } while (0)

/* ------------------------------------------------------------ allocation --- */

static const char *shape_str(char *buf, size_t len, uint32_t rank, const uint64_t *d) {
  size_t o = 0;
  o += (size_t)snprintf(buf + o, len - o, "(");
  for (uint32_t i = 0; i < rank && o < len; i++)
    o += (size_t)snprintf(buf + o, len - o, "%s%" PRIu64, i ? ", " : "", d[i]);
  if (o < len) snprintf(buf + o, len - o, ")");
  return buf;
}

/* Allocate one buffer of the list (gs_train_buffers) with its (layer, role)
 * tag; on failure fill *fail and e and return -ENOMEM. */
static int talloc(gs_train *t, const gs_train_buffer *bf, void **out, gs_train_failure *fail,
                  gs_err *e) {
  const gs_layer *l = bf->layer;
  gs_alloc_tag tag = {.layer = l ? l->name : "job", .role = bf->role};
  gs_alloc_failure why;
  memset(&why, 0, sizeof why);
  if (t->n_blocks == t->cap_blocks) {
    size_t cap = t->cap_blocks ? 2 * t->cap_blocks : 64;
    void **nb = realloc(t->blocks, cap * sizeof *nb);
    if (!nb) return gs_err_set(e, GS_INTERNAL, "", "out of host memory"), -ENOMEM;
    t->blocks = nb;
    t->cap_blocks = cap;
  }
  int rc = gs_alloc_malloc(t->a, (size_t)bf->bytes, &tag, out, &why);
  if (rc == 0) {
    t->blocks[t->n_blocks++] = *out;
    t->dev_bytes += gs_alloc_block_size((size_t)bf->bytes);
    return 0;
  }
  char sh[64], f[64];
  if (bf->rank)
    shape_str(sh, sizeof sh, bf->rank, bf->shape);
  else
    snprintf(sh, sizeof sh, "(%" PRIu64 " bytes)", bf->bytes);
  static const char *const causes[] = {"the vdev's memory limit is reached",
                                       "the physical device has no more memory",
                                       "free memory is fragmented: no block is large enough"};
  const char *cause = (unsigned)why.cause < 3 ? causes[why.cause] : "unknown cause";
  if (fail) {
    memset(fail, 0, sizeof *fail);
    fail->oom = true;
    snprintf(fail->layer, sizeof fail->layer, "%s", tag.layer);
    fail->role = bf->role;
    snprintf(fail->tensor, sizeof fail->tensor, "%s", bf->tensor);
    snprintf(fail->shape, sizeof fail->shape, "%s", sh);
    fail->dtype = bf->dtype;
    fail->bytes = bf->bytes;
    fail->why = why;
  }
  if (l)
    snprintf(f, sizeof f, "model.layer[%u]", l->index);
  else
    f[0] = '\0';
  gs_err_set(e, GS_RESOURCE_EXHAUSTED, f,
             "out of memory placing %s (layer %s, role %s, shape %s, %s): %" PRIu64
             " bytes; %s (limit %" PRIu64 ", in use %" PRIu64 ", reserved %" PRIu64
             ", largest free block %" PRIu64 ")",
             bf->tensor, tag.layer, gs_role_name(bf->role), sh, gs_dtype_name(bf->dtype),
             bf->bytes, cause, why.stats.limit, why.stats.in_use, why.stats.reserved,
             why.stats.largest_free);
  return rc < 0 ? rc : -ENOMEM;
}

static void snapshot_if_peak(gs_train *t);
static uint32_t grad_slots(const gs_model *m, bool mixed, int *rc);

static void free_blocks(gs_train *t) {
  for (size_t i = t->n_blocks; i-- > 0;) gs_alloc_free(t->a, t->blocks[i]);
  t->n_blocks = 0;
  t->dev_bytes = 0;
}

static size_t attn_grad_bytes(gs_dtype dt, const gs_layer *l, uint32_t n);

static size_t layer_workspace(const gs_backend *b, gs_dtype dt, const gs_layer *l, uint32_t n) {
  gs_conv_shape cs;
  const uint32_t rows = n * l->in.h * l->in.w;
  switch (l->kind) {
  case GS_LAYER_DENSE:
    return b->dense_workspace ? b->dense_workspace(dt, rows, l->in.c, l->units) : 0;
  case GS_LAYER_BATCH_NORM:
    return b->batchnorm_workspace ? b->batchnorm_workspace(dt, rows, l->in.c) : 0;
  case GS_LAYER_LAYER_NORM:
    return b->layernorm_workspace ? b->layernorm_workspace(dt, rows, l->in.c) : 0;
  case GS_LAYER_CAUSAL_SELF_ATTENTION: {
    /* The heads' and q/k/v's gradients, then the largest op scratch. */
    if (!b->dense_workspace || !b->attention_workspace) return 0;
    const uint32_t hd = l->heads * l->head_size;
    size_t w = b->dense_workspace(dt, rows, l->in.c, 3 * hd);
    size_t w2 = b->dense_workspace(dt, rows, hd, l->in.c);
    size_t w3 = b->attention_workspace(dt, n, l->in.w, l->heads, l->head_size);
    if (w2 > w) w = w2;
    if (w3 > w) w = w3;
    return attn_grad_bytes(dt, l, n) + w;
  }
  case GS_LAYER_CONV2D:
    cs = gs_model_conv_shape(l, n);
    return b->conv2d_workspace ? b->conv2d_workspace(dt, &cs) : 0;
  case GS_LAYER_DEPTHWISE_CONV2D:
    cs = gs_model_conv_shape(l, n);
    return b->depthwise_workspace ? b->depthwise_workspace(dt, &cs) : 0;
  default: return 0;
  }
}

/* The backend must implement every op this model calls. */
static int check_ops(const gs_train *t, gs_err *e) {
  const gs_backend *b = t->b;
  for (uint32_t i = 0; i < t->model.n_layers; i++) {
    const gs_layer *l = &t->model.layers[i];
    bool ok = true;
    switch (l->kind) {
    case GS_LAYER_DENSE:
      ok = b->dense_forward && b->dense_backward && b->dense_workspace;
      break;
    case GS_LAYER_CONV2D:
      ok = b->conv2d_forward && b->conv2d_backward && b->conv2d_workspace;
      break;
    case GS_LAYER_DEPTHWISE_CONV2D:
      ok = b->depthwise_forward && b->depthwise_backward && b->depthwise_workspace;
      break;
    case GS_LAYER_MAX_POOL2D: ok = b->maxpool_forward && b->maxpool_backward; break;
    case GS_LAYER_GLOBAL_AVERAGE_POOLING2D: ok = b->gap_forward && b->gap_backward; break;
    case GS_LAYER_ADD: ok = b->add_forward && b->copy; break;
    case GS_LAYER_CONCAT: ok = b->copy_2d != NULL; break;
    case GS_LAYER_AVERAGE_POOL2D: ok = b->avgpool_forward && b->avgpool_backward; break;
    case GS_LAYER_BATCH_NORM:
      ok = b->batchnorm_forward && b->batchnorm_backward && b->batchnorm_workspace;
      break;
    case GS_LAYER_LAYER_NORM:
      ok = b->layernorm_forward && b->layernorm_backward && b->layernorm_workspace;
      break;
    case GS_LAYER_DROPOUT: ok = b->dropout_forward && b->dropout_backward && b->copy; break;
    case GS_LAYER_GELU: ok = b->gelu_forward && b->gelu_backward; break;
    case GS_LAYER_EMBEDDING: ok = b->embedding_forward && b->embedding_backward; break;
    case GS_LAYER_POSITION_EMBEDDING: ok = b->posembed_forward && b->posembed_backward; break;
    case GS_LAYER_CAUSAL_SELF_ATTENTION:
      ok = b->dense_forward && b->dense_backward && b->dense_workspace &&
           b->attention_forward && b->attention_backward && b->attention_workspace;
      break;
    default: break;
    }
    /* A gradient that two layers add to. */
    if (l->consumers > 1) ok = ok && b->accumulate;
    if (l->relu || l->kind == GS_LAYER_RELU) ok = ok && b->relu_forward && b->relu_backward;
    if (!ok) {
      char f[64];
      snprintf(f, sizeof f, "model.layer[%u]", i);
      return gs_err_set(e, GS_FAILED_PRECONDITION, f,
                        "layer %s (layer[%u]) is a %s, which the %s backend does not "
                        "implement yet",
                        l->name, i, gs_layer_kind_name(l->kind), b->name),
             -ENOTSUP;
    }
  }
  bool ok = b->xent_forward_backward && b->cast && b->copy_in && b->copy_out && b->zero &&
            (t->r.adam ? b->adam_step != NULL : b->sgd_step != NULL) &&
            (!t->fp16 || (b->unscale_check && b->loss_scale_update));
  if (!ok)
    return gs_err_set(e, GS_FAILED_PRECONDITION, "",
                      "the %s backend lacks an op this job needs (loss, cast, optimizer or "
                      "loss scaling)",
                      b->name),
           -ENOTSUP;
  return 0;
}

/* One buffer of the list: fill the descriptor and hand it to fn. rank 0
 * means shape[0] is a raw byte count. */
static int emit(int (*fn)(void *, const gs_train_buffer *), void *user, const gs_layer *l,
                uint32_t index, gs_train_slot slot, gs_role role, const char *tensor,
                gs_dtype dt, uint32_t rank, const uint64_t *shape) {
  gs_train_buffer bf;
  memset(&bf, 0, sizeof bf);
  bf.layer = l;
  bf.index = index;
  bf.slot = slot;
  bf.role = role;
  snprintf(bf.tensor, sizeof bf.tensor, "%s", tensor);
  bf.dtype = dt;
  bf.rank = rank;
  if (rank == 0) {
    bf.bytes = shape[0];
  } else {
    uint64_t elems = 1;
    for (uint32_t i = 0; i < rank; i++) {
      bf.shape[i] = shape[i];
      elems *= shape[i];
    }
    bf.bytes = elems * gs_dtype_size(dt);
  }
  bf.block_bytes = gs_alloc_block_size((size_t)bf.bytes);
  return fn(user, &bf);
}

int gs_train_buffers(const gs_model *m, const gs_recipe *r, const gs_backend *b,
                     uint32_t eval_remainder,
                     int (*fn)(void *user, const gs_train_buffer *buf), void *user) {
  const uint64_t n = r->batch_size;
  const uint64_t K = m->classes;
  const gs_dtype dt = r->dtype;
  const bool mixed = dt != GS_F32;
  int rc;
  char nm[96];
  /* Per parameter: working copy, master (mixed), gradient, optimizer slots. */
  for (uint32_t i = 0; i < m->n_layers; i++) {
    const gs_layer *l = &m->layers[i];
    for (uint32_t p = 0; p < l->n_params; p++) {
      const gs_param_shape *ps = &l->params[p];
      uint64_t d[4];
      for (uint32_t j = 0; j < ps->rank; j++) d[j] = ps->dims[j];
      snprintf(nm, sizeof nm, "%s.%s", l->name, ps->suffix);
      if ((rc = emit(fn, user, l, p, GS_TSLOT_WEIGHTS, GS_ROLE_WEIGHTS, nm, dt, ps->rank, d)))
        return rc;
      if (mixed &&
          (rc = emit(fn, user, l, p, GS_TSLOT_MASTER, GS_ROLE_MASTER, nm, GS_F32, ps->rank, d)))
        return rc;
      if ((rc = emit(fn, user, l, p, GS_TSLOT_GRADIENT, GS_ROLE_GRADIENTS, nm, GS_F32, ps->rank,
                     d)))
        return rc;
      if (r->optimizer_slots >= 1 &&
          (rc = emit(fn, user, l, p, GS_TSLOT_MOMENT1, GS_ROLE_OPTIMIZER, nm, GS_F32, ps->rank,
                     d)))
        return rc;
      if (r->optimizer_slots >= 2 &&
          (rc = emit(fn, user, l, p, GS_TSLOT_MOMENT2, GS_ROLE_OPTIMIZER, nm, GS_F32, ps->rank,
                     d)))
        return rc;
    }
  }
  /* State tensors (batch_norm's running statistics): fp32, beside the
   * weights; checkpointed and exported with them. */
  for (uint32_t i = 0; i < m->n_layers; i++) {
    const gs_layer *l = &m->layers[i];
    for (uint32_t p = 0; p < l->n_state; p++) {
      uint64_t d[1] = {l->state[p].count};
      snprintf(nm, sizeof nm, "%s.%s", l->name, l->state[p].suffix);
      if ((rc = emit(fn, user, l, p, GS_TSLOT_STATE, GS_ROLE_WEIGHTS, nm, GS_F32, 1, d)))
        return rc;
    }
  }
  /* Saved activations: each layer's output (Flatten aliases its input; in
   * FLOAT32 the last layer's output is the fp32 logits buffer itself), and
   * what a layer keeps for its backward beside it. */
  for (uint32_t i = 0; i < m->n_layers; i++) {
    const gs_layer *l = &m->layers[i];
    if (l->kind == GS_LAYER_FLATTEN) continue;
    bool logits_direct = (i == m->n_layers - 1) && !mixed;
    uint64_t d[4] = {n, l->out.h, l->out.w, l->out.c};
    uint64_t d1[2] = {n, l->out.c};
    snprintf(nm, sizeof nm, "%s.output", l->name);
    uint64_t d2[3] = {n, l->out.w, l->out.c};
    if (logits_direct && l->out.rank == 2)
      rc = emit(fn, user, l, 0, GS_TSLOT_OUTPUT, GS_ROLE_ACTIVATIONS, nm, GS_F32, 3, d2);
    else if (logits_direct)
      rc = emit(fn, user, l, 0, GS_TSLOT_OUTPUT, GS_ROLE_ACTIVATIONS, nm, GS_F32, 2, d1);
    else if (l->out.rank == 1)
      rc = emit(fn, user, l, 0, GS_TSLOT_OUTPUT, GS_ROLE_ACTIVATIONS, nm, dt, 2, d1);
    else if (l->out.rank == 2)
      rc = emit(fn, user, l, 0, GS_TSLOT_OUTPUT, GS_ROLE_ACTIVATIONS, nm, dt, 3, d2);
    else
      rc = emit(fn, user, l, 0, GS_TSLOT_OUTPUT, GS_ROLE_ACTIVATIONS, nm, dt, 4, d);
    if (rc) return rc;
    for (uint32_t k = 0; k < l->n_saved; k++) {
      const gs_saved_shape *sv = &l->saved[k];
      uint64_t sd[4];
      uint32_t r = 0;
      if (sv->per_example) sd[r++] = n;
      for (uint32_t j = 0; j < sv->rank; j++) sd[r++] = sv->dims[j];
      snprintf(nm, sizeof nm, "%s.%s", l->name, sv->suffix);
      if ((rc = emit(fn, user, l, k, GS_TSLOT_SAVED, GS_ROLE_ACTIVATIONS, nm,
                     sv->f32 ? GS_F32 : dt, r, sd)))
        return rc;
    }
  }
  /* Batch buffers. labels and predictions are int32: 4 bytes, as GS_F32.
   * A token model's batch is its int32 ids (N, T), and its labels, logits
   * and losses are per position (N * T rows). */
  const uint64_t rows = n * m->positions;
  uint64_t xd[4] = {n, m->input.h, m->input.w, m->input.c};
  uint64_t td[2] = {n, m->input.w};
  uint64_t nd[1] = {rows}, nk[2] = {rows, K};
  if (m->tokens) {
    if ((rc = emit(fn, user, NULL, 0, GS_TSLOT_IMAGES, GS_ROLE_BATCH, "tokens", GS_F32, 2, td)))
      return rc;
  } else {
    if ((rc = emit(fn, user, NULL, 0, GS_TSLOT_IMAGES, GS_ROLE_BATCH, "images", dt, 4, xd)))
      return rc;
    if (mixed && (rc = emit(fn, user, NULL, 0, GS_TSLOT_IMAGES_F32, GS_ROLE_BATCH,
                            "images.f32", GS_F32, 4, xd)))
      return rc;
  }
  if ((rc = emit(fn, user, NULL, 0, GS_TSLOT_LABELS, GS_ROLE_BATCH, "labels", GS_F32, 1, nd)))
    return rc;
  if (mixed &&
      (rc = emit(fn, user, NULL, 0, GS_TSLOT_LOGITS, GS_ROLE_BATCH, "logits", GS_F32, 2, nk)))
    return rc;
  if ((rc = emit(fn, user, NULL, 0, GS_TSLOT_DLOGITS, GS_ROLE_BATCH, "dlogits", GS_F32, 2, nk)))
    return rc;
  if ((rc = emit(fn, user, NULL, 0, GS_TSLOT_LOSS, GS_ROLE_BATCH, "loss", GS_F32, 1, nd)))
    return rc;
  if ((rc = emit(fn, user, NULL, 0, GS_TSLOT_PREDICTIONS, GS_ROLE_BATCH, "predictions", GS_F32,
                 1, nd)))
    return rc;
  /* Workspace: the backward pass's gradient slots and op scratch. */
  uint64_t gd[2] = {n, m->max_elements};
  uint32_t slots = grad_slots(m, mixed, &rc);
  if (rc) return rc;
  for (uint32_t i = 0; i < slots; i++) {
    snprintf(nm, sizeof nm, "activation_gradients[%u]", i);
    if ((rc = emit(fn, user, NULL, i, GS_TSLOT_ACT_GRAD, GS_ROLE_WORKSPACE, nm, dt, 2, gd)))
      return rc;
  }
  uint64_t ws = 0;
  for (uint32_t i = 0; i < m->n_layers; i++) {
    uint64_t w1 = layer_workspace(b, dt, &m->layers[i], (uint32_t)n);
    uint64_t w2 = eval_remainder ? layer_workspace(b, dt, &m->layers[i], eval_remainder) : 0;
    if (w1 > ws) ws = w1;
    if (w2 > ws) ws = w2;
  }
  if (ws) {
    uint64_t wsb[1] = {ws};
    if ((rc = emit(fn, user, NULL, 0, GS_TSLOT_OP_WORKSPACE, GS_ROLE_WORKSPACE, "op_workspace",
                   GS_F32, 0, wsb)))
      return rc;
  }
  uint64_t lsb[1] = {LS_BYTES};
  return emit(fn, user, NULL, 0, GS_TSLOT_LOSS_SCALE, GS_ROLE_OPTIMIZER, "loss_scale_state",
              GS_F32, 0, lsb);
}

typedef struct alloc_ctx {
  gs_train *t;
  gs_train_failure *fail;
  gs_err *e;
} alloc_ctx;

/* gs_train_buffers callback of the runtime: place the buffer, keep its
 * pointer where the step reads it. */
static int alloc_one(void *u, const gs_train_buffer *bf) {
  alloc_ctx *c = u;
  gs_train *t = c->t;
  void *p = NULL;
  int rc = talloc(t, bf, &p, c->fail, c->e);
  if (rc) return rc;
  size_t li = bf->layer ? (size_t)(bf->layer - t->model.layers) : 0;
  lstate *s = bf->layer ? &t->ls[li] : NULL;
  switch (bf->slot) {
  case GS_TSLOT_WEIGHTS:
    s->w[bf->index] = p;
    if (!t->mixed) s->master[bf->index] = p;
    break;
  case GS_TSLOT_MASTER: s->master[bf->index] = p; break;
  case GS_TSLOT_GRADIENT: s->grad[bf->index] = p; break;
  case GS_TSLOT_MOMENT1: s->m[bf->index] = p; break;
  case GS_TSLOT_MOMENT2: s->v[bf->index] = p; break;
  case GS_TSLOT_STATE: s->state[bf->index] = p; break;
  case GS_TSLOT_SAVED: s->saved[bf->index] = p; break;
  case GS_TSLOT_OUTPUT:
    s->act = p;
    if (li == t->model.n_layers - 1 && !t->mixed) t->logits = p;
    break;
  case GS_TSLOT_IMAGES:
    t->x = p;
    if (!t->mixed) t->x32 = p;
    break;
  case GS_TSLOT_IMAGES_F32: t->x32 = p; break;
  case GS_TSLOT_LABELS: t->labels = p; break;
  case GS_TSLOT_LOGITS: t->logits = p; break;
  case GS_TSLOT_DLOGITS: t->dlogits = p; break;
  case GS_TSLOT_LOSS: t->loss = p; break;
  case GS_TSLOT_PREDICTIONS: t->pred = p; break;
  case GS_TSLOT_ACT_GRAD: t->g[bf->index] = p; break;
  case GS_TSLOT_OP_WORKSPACE: t->ws = p; break;
  case GS_TSLOT_LOSS_SCALE: t->state = p; break;
  }
  return 0;
}

static int alloc_all(gs_train *t, gs_train_failure *fail, gs_err *e) {
  const gs_model *m = &t->model;
  alloc_ctx c = {.t = t, .fail = fail, .e = e};
  uint32_t eval_rem = t->test ? (uint32_t)(t->test->n % t->r.batch_size) : 0;
  int rc = gs_train_buffers(m, &t->r, t->b, eval_rem, alloc_one, &c);
  if (rc) return rc;
  for (uint32_t i = 0; i < m->n_layers; i++)
    if (m->layers[i].kind == GS_LAYER_FLATTEN) t->ls[i].act = (void *)layer_input(t, &m->layers[i], 0);
  return 0;
}

/* ------------------------------------------------------------------ init --- */

static int push_state(gs_train *t, gs_err *e) {
  uint8_t blk[LS_BYTES];
  float one = 1.0f;
  memcpy(blk + LS_SCALE, &t->scale_host, 4);
  memcpy(blk + LS_ONE, &one, 4);
  memcpy(blk + LS_GOOD, &t->good_host, 4);
  int32_t zero = 0;
  memcpy(blk + LS_FOUND, &zero, 4);
  memcpy(blk + LS_SKIPPED, &t->skipped_host, 8);
  OP(t->b->copy_in(t->ex, t->state, blk, LS_BYTES));
  return 0;
}

static int pull_state(gs_train *t, gs_err *e) {
  uint8_t blk[LS_BYTES];
  OP(t->b->copy_out(t->ex, blk, t->state, LS_BYTES));
  OP(t->b->synchronize(t->ex));
  memcpy(&t->scale_host, blk + LS_SCALE, 4);
  memcpy(&t->good_host, blk + LS_GOOD, 4);
  memcpy(&t->skipped_host, blk + LS_SKIPPED, 8);
  return 0;
}

/* Working copies from the masters (mixed precision). */
static int refresh_working(gs_train *t, gs_err *e) {
  if (!t->mixed) return 0;
  for (uint32_t i = 0; i < t->model.n_layers; i++) {
    const gs_layer *l = &t->model.layers[i];
    for (uint32_t p = 0; p < l->n_params; p++)
      OP(t->b->cast(t->ex, t->ls[i].w[p], t->dt, t->ls[i].master[p], GS_F32,
                    l->params[p].count));
  }
  return 0;
}

/* One parameter's or state tensor's initial values into h, drawing from st
 * where its rule draws. */
static void init_values(const gs_param_shape *ps, uint64_t *st, float *h) {
  double limit = 0;
  switch (ps->init) {
  case GS_INIT_GLOROT: limit = sqrt(6.0 / ((double)ps->fan_in + (double)ps->fan_out)); break;
  case GS_INIT_EMBEDDING: limit = sqrt(3.0) * 0.02; break;
  case GS_INIT_ONES:
    for (uint64_t j = 0; j < ps->count; j++) h[j] = 1.0f;
    return;
  default:
    memset(h, 0, ps->count * sizeof *h);
    return;
  }
  for (uint64_t j = 0; j < ps->count; j++)
    h[j] = (float)((2.0 * (double)gs_rng_uniform(st) - 1.0) * limit);
}

/* The drawn tensors go to the device through a host staging buffer of at
 * least INIT_STAGE floats (16 MiB), or the largest tensor: each is drawn
 * into the buffer's free part and copied in (copy_in may be asynchronous),
 * and the stream is synchronized only when the buffer is full and at the
 * end, not once per tensor. */
#define INIT_STAGE ((size_t)4 << 20)

typedef struct stage {
  float *h;
  size_t cap, used;
} stage;

/* The values of tensor ps drawn from *st, copied in to dst. */
static int draw_in(gs_train *t, stage *sg, const gs_param_shape *ps, uint64_t *st, void *dst) {
  int rc;
  if (sg->used + ps->count > sg->cap) {
    if ((rc = t->b->synchronize(t->ex))) return rc;
    sg->used = 0;
  }
  float *h = sg->h + sg->used;
  init_values(ps, st, h);
  sg->used += ps->count;
  return t->b->copy_in(t->ex, dst, h, ps->count * sizeof(float));
}

static int init_params(gs_train *t, gs_err *e) {
  const gs_model *m = &t->model;
  stage sg = {.cap = INIT_STAGE};
  for (uint32_t i = 0; i < m->n_layers; i++) {
    for (uint32_t p = 0; p < m->layers[i].n_params; p++)
      if (m->layers[i].params[p].count > sg.cap) sg.cap = m->layers[i].params[p].count;
    for (uint32_t p = 0; p < m->layers[i].n_state; p++)
      if (m->layers[i].state[p].count > sg.cap) sg.cap = m->layers[i].state[p].count;
  }
  sg.h = malloc(sg.cap * sizeof *sg.h);
  if (!sg.h) return gs_err_set(e, GS_INTERNAL, "", "out of host memory"), -ENOMEM;
  int rc = 0;
  for (uint32_t i = 0; i < m->n_layers && !rc; i++) {
    const gs_layer *l = &m->layers[i];
    /* One PRNG stream per layer position: adding a layer does not reshuffle
     * the others. The drawn tensors take from it in parameter order. */
    uint64_t st = gs_rng_seed(t->r.seed, i);
    for (uint32_t p = 0; p < l->n_params && !rc; p++) {
      const gs_param_shape *ps = &l->params[p];
      size_t bytes = ps->count * sizeof(float);
      if (ps->init == GS_INIT_ZEROS)
        rc = t->b->zero(t->ex, t->ls[i].master[p], bytes);
      else
        rc = draw_in(t, &sg, ps, &st, t->ls[i].master[p]);
      if (!rc && t->ls[i].m[p]) rc = t->b->zero(t->ex, t->ls[i].m[p], bytes);
      if (!rc && t->ls[i].v[p]) rc = t->b->zero(t->ex, t->ls[i].v[p], bytes);
    }
    for (uint32_t p = 0; p < l->n_state && !rc; p++)
      rc = draw_in(t, &sg, &l->state[p], &st, t->ls[i].state[p]);
  }
  if (!rc) rc = t->b->synchronize(t->ex);
  free(sg.h);
  if (rc) return gs_err_set(e, GS_INTERNAL, "", "backend %s: initialising weights failed (%d)",
                            t->b->name, rc), rc;
  return 0;
}

/* --------------------------------------------------------------- forward --- */


/* Rows of a layer's input for the row-wise ops (dense, the norms): the
 * examples, times the positions of a sequence or the pixels of an image. */
static uint32_t in_rows(const gs_layer *l, uint32_t n) { return n * l->in.h * l->in.w; }

/* The dropout mask's seed for layer i in the micro-batch being run: from
 * the job's seed, the layer's position and the micro-batch's number in the
 * run (step x accumulation + its index), so a resumed job draws the masks
 * the uninterrupted one would have, and the backward redraws the forward's. */
static uint64_t dropout_seed(const gs_train *t, uint32_t i) {
  uint64_t st = gs_rng_seed(t->r.seed ^ 0x64726f706f7574ull, i);
  st ^= (t->step * t->r.accumulation_steps + t->micro) * 0x9E3779B97F4A7C15ull;
  return gs_rng_next(&st);
}

/* Attention's scratch in ws: the heads' gradient, then q/k/v's, then the
 * ops' own workspace. */
static size_t attn_grad_bytes(gs_dtype dt, const gs_layer *l, uint32_t n) {
  uint64_t hd = (uint64_t)l->heads * l->head_size;
  return gs_alloc_block_size((size_t)((uint64_t)n * l->in.w * 4 * hd * gs_dtype_size(dt)));
}

static int attention_forward(gs_train *t, const gs_layer *l, const void *in, uint32_t n,
                             gs_err *e) {
  const gs_backend *b = t->b;
  lstate *s = &t->ls[l->index];
  const uint32_t rows = in_rows(l, n), C = l->in.c, hd = l->heads * l->head_size;
  OP(b->dense_forward(t->ex, t->dt, s->saved[0], in, s->w[0], s->w[1], rows, C, 3 * hd, t->ws,
                      false));
  OP(b->attention_forward(t->ex, t->dt, s->saved[1], s->saved[2], s->saved[0], n, l->in.w,
                          l->heads, l->head_size, t->ws));
  OP(b->dense_forward(t->ex, t->dt, s->act, s->saved[1], s->w[2], s->w[3], rows, hd, C, t->ws,
                      false));
  return 0;
}

static int attention_backward(gs_train *t, const gs_layer *l, void *din, const void *dout,
                              uint32_t n, gs_err *e) {
  const gs_backend *b = t->b;
  lstate *s = &t->ls[l->index];
  const uint32_t rows = in_rows(l, n), C = l->in.c, hd = l->heads * l->head_size;
  const size_t es = gs_dtype_size(t->dt);
  uint8_t *dheads = t->ws, *dqkv = dheads + (size_t)rows * hd * es;
  void *ws = (uint8_t *)t->ws + attn_grad_bytes(t->dt, l, n);
  OP(b->dense_backward(t->ex, t->dt, dheads, s->grad[2], s->grad[3], dout, s->saved[1], s->w[2],
                       rows, hd, C, ws));
  OP(b->attention_backward(t->ex, t->dt, dqkv, dheads, s->saved[0], s->saved[2], n, l->in.w,
                           l->heads, l->head_size, ws));
  OP(b->dense_backward(t->ex, t->dt, din, s->grad[0], s->grad[1], dqkv, layer_input(t, l, 0),
                       s->w[0], rows, C, 3 * hd, ws));
  return 0;
}

static int forward(gs_train *t, uint32_t n, bool training, gs_err *e) {
  const gs_model *m = &t->model;
  const gs_backend *b = t->b;
  for (uint32_t i = 0; i < m->n_layers; i++) {
    const gs_layer *l = &m->layers[i];
    lstate *s = &t->ls[i];
    const void *in = layer_input(t, l, 0);
    gs_conv_shape cs;
    uint64_t cnt = (uint64_t)n * gs_shape_elements(&l->out);
    int rc;
    /* In FLOAT32 the last layer's act is the fp32 logits buffer: same dtype. */
    /* The layers with weights apply their relu in the same op (backend.h). */
    bool fused = false;
    switch (l->kind) {
    case GS_LAYER_DENSE:
      OP(b->dense_forward(t->ex, t->dt, s->act, in, s->w[0], s->w[1], in_rows(l, n), l->in.c,
                          l->units, t->ws, l->relu));
      fused = true;
      break;
    case GS_LAYER_CONV2D:
      cs = gs_model_conv_shape(l, n);
      OP(b->conv2d_forward(t->ex, t->dt, s->act, in, s->w[0], s->w[1], &cs, t->ws, l->relu));
      fused = true;
      break;
    case GS_LAYER_DEPTHWISE_CONV2D:
      cs = gs_model_conv_shape(l, n);
      OP(b->depthwise_forward(t->ex, t->dt, s->act, in, s->w[0], s->w[1], &cs, t->ws,
                              l->relu));
      fused = true;
      break;
    case GS_LAYER_MAX_POOL2D:
      cs = gs_model_conv_shape(l, n);
      OP(b->maxpool_forward(t->ex, t->dt, s->act, in, &cs));
      break;
    case GS_LAYER_GLOBAL_AVERAGE_POOLING2D:
      OP(b->gap_forward(t->ex, t->dt, s->act, in, n, l->in.h, l->in.w, l->in.c));
      break;
    case GS_LAYER_FLATTEN: break; /* same bytes, flat view */
    case GS_LAYER_RELU: OP(b->relu_forward(t->ex, t->dt, s->act, in, cnt)); break;
    case GS_LAYER_ADD:
      OP(b->add_forward(t->ex, t->dt, s->act, in, layer_input(t, l, 1), cnt));
      for (uint32_t k = 2; k < l->n_inputs; k++)
        OP(b->add_forward(t->ex, t->dt, s->act, s->act, layer_input(t, l, k), cnt));
      break;
    case GS_LAYER_AVERAGE_POOL2D:
      cs = gs_model_conv_shape(l, n);
      OP(b->avgpool_forward(t->ex, t->dt, s->act, in, &cs));
      break;
    case GS_LAYER_BATCH_NORM:
      OP(b->batchnorm_forward(t->ex, t->dt, s->act, s->saved[0], s->saved[1], s->state[0],
                              s->state[1], in, s->w[0], s->w[1], in_rows(l, n), l->in.c,
                              l->epsilon, l->momentum, training, t->ws));
      break;
    case GS_LAYER_LAYER_NORM:
      OP(b->layernorm_forward(t->ex, t->dt, s->act, s->saved[0], s->saved[1], in, s->w[0],
                              s->w[1], in_rows(l, n), l->in.c, l->epsilon));
      break;
    case GS_LAYER_DROPOUT:
      if (training && l->rate > 0.0f)
        OP(b->dropout_forward(t->ex, t->dt, s->act, in, cnt, l->rate, dropout_seed(t, i)));
      else
        OP(b->copy(t->ex, s->act, in, cnt * gs_dtype_size(t->dt)));
      break;
    case GS_LAYER_GELU: OP(b->gelu_forward(t->ex, t->dt, s->act, in, cnt)); break;
    case GS_LAYER_EMBEDDING:
      OP(b->embedding_forward(t->ex, t->dt, s->act, (const int32_t *)t->x, s->w[0],
                              in_rows(l, n), l->vocab, l->units));
      break;
    case GS_LAYER_POSITION_EMBEDDING:
      OP(b->posembed_forward(t->ex, t->dt, s->act, in, s->w[0], n, l->in.w, l->in.c));
      break;
    case GS_LAYER_CAUSAL_SELF_ATTENTION:
      if ((rc = attention_forward(t, l, in, n, e))) return rc;
      break;
    case GS_LAYER_CONCAT: {
      /* Each input's rows (pixels, or examples when flat) go to its columns. */
      const size_t es = gs_dtype_size(t->dt), rows = (size_t)n * l->out.h * l->out.w;
      size_t off = 0;
      for (uint32_t k = 0; k < l->n_inputs; k++) {
        size_t ck = input_channels(m, l, k);
        OP(b->copy_2d(t->ex, (uint8_t *)s->act + off * es, l->out.c * es, layer_input(t, l, k),
                      ck * es, ck * es, rows));
        off += ck;
      }
      break;
    }
    default: break;
    }
    if (l->relu && !fused) OP(b->relu_forward(t->ex, t->dt, s->act, s->act, cnt));
  }
  if (t->mixed)
    OP(b->cast(t->ex, t->logits, GS_F32, t->ls[m->n_layers - 1].act, t->dt,
               (size_t)n * m->positions * m->classes));
  return 0;
}

/* -------------------------------------------------------------- backward --- */

/* The backward pass keeps each layer's output gradient in a slot: one
 * buffer of the largest activation, in dt. A gradient is written by the
 * last layer (in model order) that takes the output, and completed by the
 * others with `accumulate`, so a layer's gradient is whole when its turn
 * comes; its slot is freed, or handed on to its input (flatten, relu, add),
 * once the layer is done. The walk is one function run two ways: dry, by
 * gs_train_buffers, to count the slots the model needs at most (the
 * planner's figure), and live, by backward(), issuing the ops; so the two
 * cannot disagree. A straight line needs two slots (one when its first layer
 * with parameters has only one layer after it), a residual block three. */
#define GW_NONE (-1)
#define GW_DLOGITS (-2) /* FLOAT32: the loss's fp32 dlogits buffer itself */

typedef struct gwalk {
  const gs_model *m;
  bool mixed;    /* the loss gradient is cast into a slot first */
  gs_train *t;   /* NULL: dry */
  int32_t *of;   /* per layer: its gradient's slot, GW_NONE or GW_DLOGITS */
  bool *busy;    /* per slot */
  uint32_t cap, used;
} gwalk;

static int32_t gw_take(gwalk *w) {
  for (uint32_t i = 0; i < w->cap; i++)
    if (!w->busy[i]) {
      w->busy[i] = true;
      if (i + 1 > w->used) w->used = i + 1;
      return (int32_t)i;
    }
  return GW_NONE; /* cap is an upper bound: not reached */
}

static void gw_free(gwalk *w, int32_t s) {
  if (s >= 0) w->busy[s] = false;
}

static void *gw_ptr(const gwalk *w, int32_t s) {
  if (!w->t) return NULL;
  return s == GW_DLOGITS ? (void *)w->t->dlogits : w->t->g[s];
}

/* Hand the gradient in slot s to input k of l. own: s is l's and goes with
 * it: to the input when the input's gradient has not started, else it is
 * added there and s freed. !own: s stays l's; it is copied to a new slot or
 * added. An input that needs no gradient (the model's input, or a layer
 * with no parameters at or before it) takes nothing. */
static int gw_give(gwalk *w, const gs_layer *l, uint32_t k, int32_t s, bool own, uint64_t cnt,
                   gs_err *e) {
  gs_train *t = w->t;
  int32_t j = l->inputs[k];
  bool need = j >= 0 && w->m->layers[j].needs_grad;
  if (need && w->of[j] == GW_NONE && own) {
    w->of[j] = s;
    return 0;
  }
  if (need && w->of[j] == GW_NONE) {
    int32_t c = gw_take(w);
    if (t) OP(t->b->copy(t->ex, gw_ptr(w, c), gw_ptr(w, s), cnt * gs_dtype_size(t->dt)));
    w->of[j] = c;
  } else if (need && t) {
    OP(t->b->accumulate(t->ex, t->dt, gw_ptr(w, w->of[j]), gw_ptr(w, s), cnt));
  }
  if (own) gw_free(w, s);
  return 0;
}

/* concat: input k's columns of the gradient in slot s, to the input. */
static int gw_split(gwalk *w, const gs_layer *l, uint32_t k, int32_t s, size_t off, uint32_t n,
                    gs_err *e) {
  gs_train *t = w->t;
  int32_t j = l->inputs[k];
  if (j < 0 || !w->m->layers[j].needs_grad) return 0;
  const size_t es = t ? gs_dtype_size(t->dt) : 0, ck = w->m->layers[j].out.c;
  const size_t rows = (size_t)n * l->out.h * l->out.w;
  bool acc = w->of[j] != GW_NONE;
  int32_t c = gw_take(w);
  if (t)
    OP(t->b->copy_2d(t->ex, gw_ptr(w, c), ck * es, (uint8_t *)gw_ptr(w, s) + off * es,
                     (size_t)l->out.c * es, ck * es, rows));
  if (!acc) {
    w->of[j] = c;
    return 0;
  }
  if (t) OP(t->b->accumulate(t->ex, t->dt, gw_ptr(w, w->of[j]), gw_ptr(w, c), rows * ck));
  gw_free(w, c);
  return 0;
}

/* One layer's op backward: din (NULL: its input needs no gradient). */
static int layer_backward(gs_train *t, const gs_layer *l, void *din, const void *dout,
                          uint32_t n, gs_err *e) {
  const gs_backend *b = t->b;
  lstate *s = &t->ls[l->index];
  const void *in = layer_input(t, l, 0);
  gs_conv_shape cs;
  switch (l->kind) {
  case GS_LAYER_DENSE:
    OP(b->dense_backward(t->ex, t->dt, din, s->grad[0], s->grad[1], dout, in, s->w[0],
                         in_rows(l, n), l->in.c, l->units, t->ws));
    break;
  case GS_LAYER_AVERAGE_POOL2D:
    cs = gs_model_conv_shape(l, n);
    OP(b->avgpool_backward(t->ex, t->dt, din, dout, &cs));
    break;
  case GS_LAYER_BATCH_NORM:
    OP(b->batchnorm_backward(t->ex, t->dt, din, s->grad[0], s->grad[1], dout, in, s->w[0],
                             s->saved[0], s->saved[1], in_rows(l, n), l->in.c, t->ws));
    break;
  case GS_LAYER_LAYER_NORM:
    OP(b->layernorm_backward(t->ex, t->dt, din, s->grad[0], s->grad[1], dout, in, s->w[0],
                             s->saved[0], s->saved[1], in_rows(l, n), l->in.c, t->ws));
    break;
  case GS_LAYER_DROPOUT: {
    uint64_t cnt = (uint64_t)n * gs_shape_elements(&l->out);
    if (!din) break;
    if (l->rate > 0.0f)
      OP(b->dropout_backward(t->ex, t->dt, din, dout, cnt, l->rate,
                             dropout_seed(t, l->index)));
    else
      OP(b->copy(t->ex, din, dout, cnt * gs_dtype_size(t->dt)));
    break;
  }
  case GS_LAYER_GELU:
    if (din)
      OP(b->gelu_backward(t->ex, t->dt, din, dout, in,
                          (uint64_t)n * gs_shape_elements(&l->out)));
    break;
  case GS_LAYER_EMBEDDING:
    OP(b->embedding_backward(t->ex, t->dt, s->grad[0], dout, (const int32_t *)t->x,
                             in_rows(l, n), l->vocab, l->units));
    break;
  case GS_LAYER_CAUSAL_SELF_ATTENTION: {
    int rc = attention_backward(t, l, din, dout, n, e);
    if (rc) return rc;
    break;
  }
  case GS_LAYER_CONV2D:
    cs = gs_model_conv_shape(l, n);
    OP(b->conv2d_backward(t->ex, t->dt, din, s->grad[0], s->grad[1], dout, in, s->w[0], &cs,
                          t->ws));
    break;
  case GS_LAYER_DEPTHWISE_CONV2D:
    cs = gs_model_conv_shape(l, n);
    OP(b->depthwise_backward(t->ex, t->dt, din, s->grad[0], s->grad[1], dout, in, s->w[0],
                             &cs, t->ws));
    break;
  case GS_LAYER_MAX_POOL2D:
    cs = gs_model_conv_shape(l, n);
    OP(b->maxpool_backward(t->ex, t->dt, din, dout, in, &cs));
    break;
  case GS_LAYER_GLOBAL_AVERAGE_POOLING2D:
    OP(b->gap_backward(t->ex, t->dt, din, dout, n, l->in.h, l->in.w, l->in.c));
    break;
  default: break;
  }
  return 0;
}

/* The walk: live (w->t set) or dry. Layers run in reverse; a layer whose
 * output needs no gradient is skipped whole. */
static int gw_walk(gwalk *w, uint32_t n, gs_err *e) {
  const gs_model *m = w->m;
  gs_train *t = w->t;
  const uint32_t last = m->n_layers - 1;
  int rc;
  for (uint32_t i = 0; i < m->n_layers; i++) w->of[i] = GW_NONE;
  memset(w->busy, 0, w->cap * sizeof *w->busy);
  if (w->mixed) {
    int32_t s0 = gw_take(w);
    if (t)
      OP(t->b->cast(t->ex, gw_ptr(w, s0), t->dt, t->dlogits, GS_F32,
                    (size_t)n * m->positions * m->classes));
    w->of[last] = s0;
  } else {
    w->of[last] = GW_DLOGITS;
  }
  for (uint32_t i = m->n_layers; i-- > 0;) {
    const gs_layer *l = &m->layers[i];
    if (!l->needs_grad) continue;
    const int32_t so = w->of[i];
    void *dout = gw_ptr(w, so);
    const uint64_t cnt = (uint64_t)n * gs_shape_elements(&l->out);
    if (t && (l->relu || l->kind == GS_LAYER_RELU))
      OP(t->b->relu_backward(t->ex, t->dt, dout, dout, t->ls[i].act, cnt));
    switch (l->kind) {
    case GS_LAYER_POSITION_EMBEDDING:
      /* din = dout: the table's gradient, then the slot goes on. */
      if (t)
        OP(t->b->posembed_backward(t->ex, t->dt, NULL, t->ls[i].grad[0], dout, n, l->in.w,
                                   l->in.c));
      if ((rc = gw_give(w, l, 0, so, true, cnt, e))) return rc;
      break;
    case GS_LAYER_FLATTEN:
    case GS_LAYER_RELU:
      if ((rc = gw_give(w, l, 0, so, true, cnt, e))) return rc;
      break;
    case GS_LAYER_ADD: {
      /* The last input whose gradient has not started takes the slot; the
       * others are added to, or get copies, first. */
      uint32_t owner = UINT32_MAX;
      for (uint32_t k = 0; k < l->n_inputs; k++) {
        int32_t j = l->inputs[k];
        if (j >= 0 && m->layers[j].needs_grad && w->of[j] == GW_NONE) owner = k;
      }
      for (uint32_t k = 0; k < l->n_inputs; k++)
        if (k != owner && (rc = gw_give(w, l, k, so, false, cnt, e))) return rc;
      if (owner != UINT32_MAX) {
        if ((rc = gw_give(w, l, owner, so, true, cnt, e))) return rc;
      } else {
        gw_free(w, so);
      }
      break;
    }
    case GS_LAYER_CONCAT: {
      size_t off = 0;
      for (uint32_t k = 0; k < l->n_inputs; k++) {
        if ((rc = gw_split(w, l, k, so, off, n, e))) return rc;
        off += input_channels(m, l, k);
      }
      gw_free(w, so);
      break;
    }
    default: {
      int32_t j = l->inputs[0];
      bool need = j >= 0 && m->layers[j].needs_grad;
      int32_t ds = need ? gw_take(w) : GW_NONE;
      if (t && (rc = layer_backward(t, l, need ? gw_ptr(w, ds) : NULL, dout, n, e))) return rc;
      if (need && w->of[j] == GW_NONE) {
        w->of[j] = ds;
      } else if (need) {
        if (t)
          OP(t->b->accumulate(t->ex, t->dt, gw_ptr(w, w->of[j]), gw_ptr(w, ds),
                              (uint64_t)n * gs_shape_elements(&l->in)));
        gw_free(w, ds);
      }
      gw_free(w, so);
      break;
    }
    }
  }
  return 0;
}

static int backward(gs_train *t, uint32_t n, gs_err *e) {
  gwalk w = {.m = &t->model, .mixed = t->mixed, .t = t, .of = t->gslot_of,
             .busy = t->gslot_busy, .cap = t->n_g};
  return gw_walk(&w, n, e);
}

/* The gradient slots the backward pass of m needs at most (gs_train_buffers
 * emits that many); 0 on a host allocation failure (*rc = -ENOMEM). */
static uint32_t grad_slots(const gs_model *m, bool mixed, int *rc) {
  gwalk w = {.m = m, .mixed = mixed, .cap = m->n_layers + 2};
  w.of = calloc(m->n_layers, sizeof *w.of);
  w.busy = calloc(w.cap, sizeof *w.busy);
  *rc = w.of && w.busy ? gw_walk(&w, 0, NULL) : -ENOMEM;
  free(w.of);
  free(w.busy);
  return *rc ? 0 : w.used;
}

/* Pixels a part of the batch gather should have at least: below this a
 * split costs more than it saves (4 fashion images a part). */
#define GATHER_GRAIN_PIXELS 3136u

typedef struct gather_job {
  const gs_dataset *d;
  const uint64_t *idx;
  uint64_t per; /* pixels an example */
  float *img;
  int32_t *lab;
} gather_job;

static void gather_part(void *ctx, size_t lo, size_t hi) {
  const gather_job *j = ctx;
  gs_dataset_gather_f32(j->d, j->idx + lo, (uint32_t)(hi - lo), j->img + lo * j->per,
                        j->lab + lo);
}

/* Copy examples idx[0..n) of d into the batch buffers. */
static int load_batch(gs_train *t, const gs_dataset *d, const uint64_t *idx, uint32_t n,
                      gs_err *e) {
  uint64_t per = gs_shape_elements(&t->model.input);
  if (d->kind == GS_DATA_TOKENS) {
    /* Token ids and next-token targets, int32, gathered on the host (a
     * copy of 4 bytes per token: no pass worth splitting) straight into
     * the batch buffer where it is host memory. */
    int32_t *ids = t->b->host_memory ? (int32_t *)t->x : (int32_t *)t->h_img;
    gs_dataset_gather_tokens(d, idx, n, ids, t->h_lab);
    if ((void *)ids != t->x) OP(t->b->copy_in(t->ex, t->x, ids, (size_t)n * per * sizeof(int32_t)));
    OP(t->b->copy_in(t->ex, t->labels, t->h_lab, (size_t)n * per * sizeof(int32_t)));
    return 0;
  }
  /* Where device buffers are host memory (backend.h: host_memory, the cpu
   * device) the pixels go straight into the batch buffer, without a staging
   * copy. And the gather runs on the exec's threads where the backend lends
   * them (host_parallel), rather than on one while the others wait. */
  float *img = t->b->host_memory ? t->x32 : t->h_img;
  gather_job gj = {.d = d, .idx = idx, .per = per, .img = img, .lab = t->h_lab};
  size_t grain = per >= GATHER_GRAIN_PIXELS ? 1 : GATHER_GRAIN_PIXELS / per;
  if (t->b->host_parallel)
    t->b->host_parallel(t->ex, n, grain, gather_part, &gj);
  else
    gather_part(&gj, 0, n);
  if (img != t->x32) OP(t->b->copy_in(t->ex, t->x32, img, (size_t)n * per * sizeof(float)));
  if (t->mixed) OP(t->b->cast(t->ex, t->x, t->dt, t->x32, GS_F32, (size_t)n * per));
  OP(t->b->copy_in(t->ex, t->labels, t->h_lab, (size_t)n * sizeof(int32_t)));
  return 0;
}

/* ------------------------------------------------------------------ step --- */

static void ensure_perm(gs_train *t) {
  if (t->perm_epoch == (int64_t)t->epoch) return;
  gs_dataset_shuffle(t->perm, t->train->n, t->r.seed, t->epoch);
  t->perm_epoch = t->epoch;
}

static int optimizer_step(gs_train *t, gs_err *e) {
  const gs_model *m = &t->model;
  const gs_backend *b = t->b;
  int32_t *found = (int32_t *)(t->state + LS_FOUND);
  float *scale = (float *)(t->state + LS_SCALE);
  if (t->fp16)
    for (uint32_t i = 0; i < m->n_layers; i++)
      for (uint32_t p = 0; p < m->layers[i].n_params; p++)
        OP(b->unscale_check(t->ex, t->ls[i].grad[p], m->layers[i].params[p].count, scale,
                            found));
  const int32_t *skip = t->fp16 ? found : NULL;
  uint64_t tt = t->opt_t + 1;
  const float lr = gs_recipe_learning_rate(&t->r, t->step, t->total_steps);
  for (uint32_t i = 0; i < m->n_layers; i++) {
    const gs_layer *l = &m->layers[i];
    lstate *s = &t->ls[i];
    for (uint32_t p = 0; p < l->n_params; p++) {
      size_t cnt = l->params[p].count;
      if (t->r.adam)
        OP(b->adam_step(t->ex, s->master[p], s->grad[p], s->m[p], s->v[p], cnt,
                        lr, t->r.beta1, t->r.beta2, t->r.epsilon,
                        t->r.weight_decay, t->r.decoupled, tt, skip));
      else
        OP(b->sgd_step(t->ex, s->master[p], s->grad[p], s->m[p], cnt, lr,
                       t->r.momentum, t->r.nesterov, t->r.weight_decay, skip));
    }
  }
  int rc = refresh_working(t, e);
  if (rc) return rc;
  if (t->fp16)
    OP(b->loss_scale_update(t->ex, scale, (int32_t *)(t->state + LS_GOOD), found,
                            (int64_t *)(t->state + LS_SKIPPED),
                            t->r.loss_scale_growth_interval));
  return 0;
}

static int do_step(gs_train *t, gs_err *e) {
  const gs_model *m = &t->model;
  const uint32_t n = t->r.batch_size, k = t->r.accumulation_steps;
  const uint32_t rows = n * m->positions; /* loss rows: examples, or their positions */
  const float norm = (float)rows * (float)k;
  const float *gscale = (const float *)(t->state + (t->fp16 ? LS_SCALE : LS_ONE));
  double t0 = now_s();
  int rc;
  ensure_perm(t);
  /* Gradients accumulate from zero. The optimizer step consumes them: it
   * leaves each one zero, in the pass that reads it (backend.h), so no
   * separate pass reads every gradient again. Only a first step, or one
   * after a step that failed, clears them here. */
  if (!t->grads_zero)
    for (uint32_t i = 0; i < m->n_layers; i++)
      for (uint32_t p = 0; p < m->layers[i].n_params; p++)
        OP(t->b->zero(t->ex, t->ls[i].grad[p], m->layers[i].params[p].count * sizeof(float)));
  t->grads_zero = false;
  double loss_sum = 0.0;
  uint64_t pos = t->step_in_epoch * (uint64_t)n * k;
  for (uint32_t j = 0; j < k; j++, pos += n) {
    t->micro = j;
    if ((rc = load_batch(t, t->train, t->perm + pos, n, e))) return rc;
    if ((rc = forward(t, n, true, e))) return rc;
    OP(t->b->xent_forward_backward(t->ex, t->loss, NULL, t->dlogits, t->logits, t->labels,
                                   rows, m->classes, gscale, norm));
    if ((rc = backward(t, n, e))) return rc;
    OP(t->b->copy_out(t->ex, t->h_loss, t->loss, (size_t)rows * sizeof(float)));
    OP(t->b->synchronize(t->ex));
    for (uint32_t q = 0; q < rows; q++) loss_sum += t->h_loss[q];
  }
  if ((rc = optimizer_step(t, e))) return rc;
  t->grads_zero = true;
  int64_t skipped_before = t->skipped_host;
  if ((rc = pull_state(t, e))) return rc;
  if (t->skipped_host == skipped_before) t->opt_t++;
  t->step++;
  t->step_in_epoch++;
  double dt = now_s() - t0;
  t->last_step_loss = (float)(loss_sum / norm);
  t->epoch_loss_sum += t->last_step_loss;
  t->epoch_steps++;
  t->epoch_time += dt;
  t->run_time += dt;
  t->epoch_samples += (uint64_t)n * k;
  t->run_samples += (uint64_t)n * k;
  return 0;
}

/* ------------------------------------------------------------ evaluation --- */

int gs_train_evaluate(gs_train *t, float *loss, float *accuracy, gs_err *e) {
  const gs_dataset *d = t->test;
  if (!d) {
    *loss = NAN;
    *accuracy = NAN;
    return 0;
  }
  const uint32_t b = t->r.batch_size;
  const float *one = (const float *)(t->state + LS_ONE);
  double lsum = 0.0;
  uint64_t correct = 0;
  int rc;
  for (uint64_t pos = 0; pos < d->n; pos += b) {
    uint32_t cnt = (uint32_t)(d->n - pos < b ? d->n - pos : b);
    for (uint32_t q = 0; q < cnt; q++) t->eval_idx[q] = pos + q;
    if ((rc = load_batch(t, d, t->eval_idx, cnt, e))) return rc;
    if ((rc = forward(t, cnt, false, e))) return rc;
    const uint32_t rows = cnt * t->model.positions;
    OP(t->b->xent_forward_backward(t->ex, t->loss, t->pred, NULL, t->logits, t->labels, rows,
                                   t->model.classes, one, 1.0f));
    OP(t->b->copy_out(t->ex, t->h_loss, t->loss, (size_t)rows * sizeof(float)));
    OP(t->b->copy_out(t->ex, t->h_pred, t->pred, (size_t)rows * sizeof(int32_t)));
    OP(t->b->synchronize(t->ex));
    for (uint32_t q = 0; q < rows; q++) {
      lsum += t->h_loss[q];
      correct += t->h_pred[q] == t->h_lab[q];
    }
  }
  /* Over every example, or every position of every sequence. */
  const double total = (double)d->n * t->model.positions;
  *loss = (float)(lsum / total);
  *accuracy = (float)((double)correct / total);
  return 0;
}

/* ----------------------------------------------------------- checkpoints --- */

/* Tensors a checkpoint holds, in a fixed order: per parameter the fp32
 * master, then its optimizer slots. */
typedef struct ck_list {
  gs_ckpt_tensor *v;
  char (*names)[96];
  float **dev; /* device pointer of each */
  size_t n;
} ck_list;

static void ck_list_free(ck_list *c) {
  free(c->v);
  free(c->names);
  free(c->dev);
}

static int ck_list_build(const gs_train *t, ck_list *c) {
  const gs_model *m = &t->model;
  size_t cap = 0;
  for (uint32_t i = 0; i < m->n_layers; i++)
    cap += m->layers[i].n_params * (1 + t->r.optimizer_slots) + m->layers[i].n_state;
  memset(c, 0, sizeof *c);
  c->v = calloc(cap ? cap : 1, sizeof *c->v);
  c->names = calloc(cap ? cap : 1, sizeof *c->names);
  c->dev = calloc(cap ? cap : 1, sizeof *c->dev);
  if (!c->v || !c->names || !c->dev) {
    ck_list_free(c);
    return -ENOMEM;
  }
  static const char *const slot_sgd[] = {"momentum"};
  static const char *const slot_adam[] = {"adam_m", "adam_v"};
  for (uint32_t i = 0; i < m->n_layers; i++) {
    const gs_layer *l = &m->layers[i];
    for (uint32_t p = 0; p < l->n_params; p++) {
      for (uint32_t sl = 0; sl <= t->r.optimizer_slots; sl++) {
        gs_ckpt_tensor *x = &c->v[c->n];
        if (sl == 0) {
          snprintf(c->names[c->n], 96, "%s.%s", l->name, l->params[p].suffix);
          c->dev[c->n] = t->ls[i].master[p];
        } else {
          snprintf(c->names[c->n], 96, "%s.%s.%s", l->name, l->params[p].suffix,
                   t->r.adam ? slot_adam[sl - 1] : slot_sgd[0]);
          c->dev[c->n] = sl == 1 ? t->ls[i].m[p] : t->ls[i].v[p];
        }
        x->name = c->names[c->n];
        x->dtype = GS_CKPT_F32;
        x->rank = l->params[p].rank;
        for (uint32_t j = 0; j < x->rank; j++) x->shape[j] = l->params[p].dims[j];
        x->bytes = l->params[p].count * sizeof(float);
        c->n++;
      }
    }
    for (uint32_t p = 0; p < l->n_state; p++) {
      gs_ckpt_tensor *x = &c->v[c->n];
      snprintf(c->names[c->n], 96, "%s.%s", l->name, l->state[p].suffix);
      c->dev[c->n] = t->ls[i].state[p];
      x->name = c->names[c->n];
      x->dtype = GS_CKPT_F32;
      x->rank = 1;
      x->shape[0] = l->state[p].count;
      x->bytes = l->state[p].count * sizeof(float);
      c->n++;
    }
  }
  return 0;
}

static void spec_digest(const gs_train *t, char *buf, size_t len) {
  const gs_model *m = &t->model;
  size_t o = (size_t)snprintf(buf, len, "gpushare job \"%s\"; input (%u, %u, %u); layers",
                              t->name, m->input.h, m->input.w, m->input.c);
  for (uint32_t i = 0; i < m->n_layers && o < len; i++)
    o += (size_t)snprintf(buf + o, len - o, " %s", m->layers[i].name);
  if (o < len)
    snprintf(buf + o, len - o, "; batch %u x %u; %s", t->r.batch_size, t->r.accumulation_steps,
             t->r.adam ? "adam" : "sgd");
}

/* One checkpoint: the job's state at one step, copied to the host, and
 * where it goes. Periodic checkpoints are written by a thread of their own
 * (checkpoint_async) while the job steps on, so writing, fsync and rename
 * do not stall the job's thread at every checkpoint. */
typedef struct ck_write {
  pthread_t tid;
  char *path;
  gs_ckpt_meta meta;
  ck_list c;
  uint8_t *host; /* every tensor's bytes, c.v[i].data points into it */
  uint64_t bytes; /* host's size */
  int rc;        /* the writer's result */
  gs_err err;    /* and its error */
} ck_write;

static void ck_write_free(ck_write *w) {
  if (!w) return;
  free(w->host);
  free(w->path);
  ck_list_free(&w->c);
  free(w);
}

/* Copy the job's state out to the host, as of now. */
static int ck_snapshot(gs_train *t, const char *path, ck_write **out, gs_err *e) {
  ck_write *w = calloc(1, sizeof *w);
  if (!w || ck_list_build(t, &w->c)) {
    free(w);
    return gs_err_set(e, GS_INTERNAL, "", "out of host memory for a checkpoint"), -ENOMEM;
  }
  uint64_t total = 0;
  for (size_t i = 0; i < w->c.n; i++) total += w->c.v[i].bytes;
  w->host = malloc(total ? total : 1);
  w->bytes = total;
  w->path = strdup(path);
  int rc = 0;
  if (!w->host || !w->path) {
    gs_err_set(e, GS_INTERNAL, "", "out of host memory for a checkpoint");
    rc = -ENOMEM;
    goto fail;
  }
  uint64_t off = 0;
  for (size_t i = 0; i < w->c.n; i++) {
    rc = t->b->copy_out(t->ex, w->host + off, w->c.dev[i], w->c.v[i].bytes);
    if (rc) {
      gs_err_set(e, GS_INTERNAL, "", "backend %s: copying %s out failed (%d)", t->b->name,
                 w->c.v[i].name, rc);
      goto fail;
    }
    w->c.v[i].data = w->host + off;
    off += w->c.v[i].bytes;
  }
  if ((rc = t->b->synchronize(t->ex))) {
    gs_err_set(e, GS_INTERNAL, "", "backend %s: synchronize failed (%d)", t->b->name, rc);
    goto fail;
  }
  gs_ckpt_meta *meta = &w->meta;
  meta->step = t->step;
  meta->epoch = t->epoch;
  meta->data_pos = t->step_in_epoch * (uint64_t)t->r.batch_size * t->r.accumulation_steps;
  meta->opt_t = t->opt_t;
  meta->loss_scale = t->scale_host;
  meta->good_steps = t->good_host;
  meta->skipped_steps = t->skipped_host;
  meta->seed = t->r.seed;
  meta->horizon = t->total_steps;
  spec_digest(t, meta->spec, sizeof meta->spec);
  *out = w;
  return 0;
fail:
  ck_write_free(w);
  return rc;
}

static void *ck_writer_main(void *arg) {
  ck_write *w = arg;
  w->rc = gs_ckpt_write(w->path, &w->meta, w->c.v, w->c.n, &w->err);
  return NULL;
}

/* Wait for the periodic checkpoint in flight, if any: 0, or its error. */
static int ck_wait(gs_train *t, gs_err *e) {
  ck_write *w = t->ck_flight;
  if (!w) return 0;
  pthread_join(w->tid, NULL);
  t->ck_flight = NULL;
  int rc = w->rc;
  if (rc && e) *e = w->err;
  ck_write_free(w);
  return rc;
}

/* A periodic checkpoint: the state is copied out now, the file written by
 * a thread while the job steps on (one in flight at a time; the next one,
 * or the job's end, waits for it and fails the job with its error). A crash
 * meanwhile leaves the previous checkpoint, as the write is atomic. */
static int checkpoint_async(gs_train *t, const char *path, gs_err *e) {
  int rc = ck_wait(t, e);
  ck_write *w = NULL;
  if (rc || (rc = ck_snapshot(t, path, &w, e))) return rc;
  if (pthread_create(&w->tid, NULL, ck_writer_main, w) != 0) {
    ck_writer_main(w); /* no thread to be had: write it here */
    rc = w->rc;
    if (rc) *e = w->err;
    ck_write_free(w);
    if (rc == 0) t->ckpt_step = t->step;
    return rc;
  }
  t->ck_flight = w;
  t->ckpt_step = t->step;
  return 0;
}

int gs_train_checkpoint(gs_train *t, const char *path, gs_err *e) {
  ck_write *w = NULL;
  int rc = ck_wait(t, e);
  if (rc || (rc = ck_snapshot(t, path, &w, e))) return rc;
  rc = gs_ckpt_write(path, &w->meta, w->c.v, w->c.n, e);
  if (rc == 0) t->ckpt_step = t->step;
  ck_write_free(w);
  return rc;
}

/* A COSINE schedule's rate at a step depends on the run's total steps (its
 * horizon, model.h: gs_recipe_learning_rate), so a resume must span the same
 * steps as the run that wrote the checkpoint, or every rate from there on
 * changes. The other schedules do not depend on it: a run may be lengthened
 * or shortened. A version 1 checkpoint (horizon 0) did not record it. */
static int check_horizon(const gs_train *t, const char *path, const gs_ckpt_meta *m, gs_err *e) {
  const uint64_t horizon = m->horizon;
  if (t->r.lr_schedule != GS_LR_COSINE || horizon == 0 || horizon == t->total_steps) return 0;
  /* which of the two sets this run's length */
  bool by_max = t->r.max_steps && t->r.max_steps < t->steps_per_epoch * t->r.epochs;
  char now[160];
  if (by_max)
    snprintf(now, sizeof now, "max_steps %" PRIu64, t->r.max_steps);
  else
    snprintf(now, sizeof now, "epochs %u x %" PRIu64 " steps per epoch", t->r.epochs,
             t->steps_per_epoch);
  return gs_err_set(e, GS_FAILED_PRECONDITION, by_max ? "max_steps" : "epochs",
                    "the checkpoint %s was written by a run of %" PRIu64 " optimizer steps, the "
                    "horizon of its COSINE learning-rate schedule, but this run has %" PRIu64
                    " (%s): resuming would change every learning rate from step %" PRIu64
                    " on; set epochs or max_steps so that the run has %" PRIu64 " steps",
                    path, horizon, t->total_steps, now, m->step, horizon);
}

static int restore(gs_train *t, const char *path, gs_err *e) {
  gs_ckpt *ck = NULL;
  ck_list c = {0};
  int rc = gs_ckpt_load(path, &ck, e);
  if (rc) return rc;
  if (ck->meta.seed != t->r.seed) {
    rc = gs_err_set(e, GS_FAILED_PRECONDITION, "seed",
                    "the checkpoint %s was written by a job with seed %" PRIu64
                    " but this job's seed is %" PRIu64 ": resuming would change the data order",
                    path, ck->meta.seed, t->r.seed);
    rc = -EINVAL;
    goto out;
  }
  if ((rc = check_horizon(t, path, &ck->meta, e))) goto out;
  if ((rc = ck_list_build(t, &c))) {
    gs_err_set(e, GS_INTERNAL, "", "out of host memory");
    goto out;
  }
  for (size_t i = 0; i < c.n; i++) {
    const gs_ckpt_tensor *x;
    if ((rc = gs_ckpt_expect(ck, c.v[i].name, GS_CKPT_F32, c.v[i].rank, c.v[i].shape, &x, e)))
      goto out;
    if ((rc = t->b->copy_in(t->ex, c.dev[i], x->data, x->bytes))) {
      gs_err_set(e, GS_INTERNAL, "", "backend %s: copying %s in failed (%d)", t->b->name,
                 c.v[i].name, rc);
      goto out;
    }
  }
  uint64_t eff = (uint64_t)t->r.batch_size * t->r.accumulation_steps;
  t->step = ck->meta.step;
  t->epoch = ck->meta.epoch;
  t->step_in_epoch = ck->meta.data_pos / eff;
  if (t->step_in_epoch >= t->steps_per_epoch) { /* written at an epoch's last step */
    t->epoch++;
    t->step_in_epoch = 0;
  }
  t->epochs_done = t->epoch;
  t->opt_t = ck->meta.opt_t;
  t->scale_host = t->fp16 ? ck->meta.loss_scale : 1.0f;
  t->good_host = t->fp16 ? ck->meta.good_steps : 0;
  t->skipped_host = ck->meta.skipped_steps;
  t->epoch_skipped0 = t->skipped_host;
  t->ckpt_step = t->step;
  if ((rc = push_state(t, e))) goto out;
  rc = refresh_working(t, e);
out:
  ck_list_free(&c);
  gs_ckpt_free(ck);
  return rc;
}

int gs_train_export_safetensors(gs_train *t, const char *path, gs_err *e) {
  const gs_model *m = &t->model;
  size_t n = 0;
  uint64_t total = 0;
  for (uint32_t i = 0; i < m->n_layers; i++) {
    const gs_layer *l = &m->layers[i];
    for (uint32_t p = 0; p < l->n_params + l->n_state; p++) {
      n++;
      total += (p < l->n_params ? l->params[p] : l->state[p - l->n_params]).count * sizeof(float);
    }
  }
  gs_ckpt_tensor *v = calloc(n ? n : 1, sizeof *v);
  char (*names)[96] = calloc(n ? n : 1, sizeof *names);
  uint8_t *host = malloc(total ? total : 1);
  char meta[512];
  int rc = 0;
  if (!v || !names || !host) {
    gs_err_set(e, GS_INTERNAL, "", "out of host memory for the export");
    rc = -ENOMEM;
    goto out;
  }
  size_t k = 0;
  uint64_t off = 0;
  for (uint32_t i = 0; i < m->n_layers; i++) {
    const gs_layer *l = &m->layers[i];
    /* The parameters, then the state tensors (batch_norm's running
     * statistics), each under "<layer>.<suffix>". */
    for (uint32_t p = 0; p < l->n_params + l->n_state; p++, k++) {
      bool st = p >= l->n_params;
      const gs_param_shape *ps = st ? &l->state[p - l->n_params] : &l->params[p];
      const float *src = st ? t->ls[i].state[p - l->n_params] : t->ls[i].master[p];
      snprintf(names[k], 96, "%s.%s", l->name, ps->suffix);
      v[k].name = names[k];
      v[k].dtype = GS_CKPT_F32;
      v[k].rank = ps->rank;
      for (uint32_t j = 0; j < v[k].rank; j++) v[k].shape[j] = ps->dims[j];
      v[k].bytes = ps->count * sizeof(float);
      if ((rc = t->b->copy_out(t->ex, host + off, src, v[k].bytes))) {
        gs_err_set(e, GS_INTERNAL, "", "backend %s: copy out failed (%d)", t->b->name, rc);
        goto out;
      }
      v[k].data = host + off;
      off += v[k].bytes;
    }
  }
  if ((rc = t->b->synchronize(t->ex))) {
    gs_err_set(e, GS_INTERNAL, "", "backend %s: synchronize failed (%d)", t->b->name, rc);
    goto out;
  }
  /* The job name goes through a JSON string: keep only safe characters. */
  char safe[128];
  size_t j = 0;
  for (const char *s = t->name; *s && j + 1 < sizeof safe; s++)
    if (*s != '"' && *s != '\\' && (unsigned char)*s >= 0x20) safe[j++] = *s;
  safe[j] = '\0';
  snprintf(meta, sizeof meta,
           "{\"format\":\"gpushare\",\"job\":\"%s\",\"step\":\"%" PRIu64
           "\",\"layout\":\"NHWC; dense kernel (in, out); conv2d kernel (kh, kw, in, out); "
           "depthwise_conv2d kernel (kh, kw, channels)\"}",
           safe, t->step);
  rc = gs_safetensors_write(path, v, n, meta, e);
out:
  free(v);
  free(names);
  free(host);
  return rc;
}

/* ---------------------------------------------------------------- create --- */

/* A dataset against the model: images of its input shape and classes, or
 * token sequences of its length and vocabulary. A test set of images may
 * lack the top classes (its classes are its max label + 1): its labels only
 * need to be below the model's. */
static int check_set(const gs_model *m, const char *which, const gs_dataset *d, bool test,
                     gs_err *e) {
  if (d->kind == GS_DATA_TOKENS) return gs_model_check_tokens(m, which, d->seq_len, d->classes, e);
  uint32_t classes = test && d->classes <= m->classes ? m->classes : d->classes;
  return gs_model_check_dataset(m, which, d->h, d->w, d->c, classes, e);
}

int gs_train_create(const gs_job_spec *spec, gs_backend *b, gs_alloc *a,
                    const gs_dataset *train, const gs_dataset *test,
                    const gs_train_options *opt, gs_train **out, gs_train_failure *fail,
                    gs_err *e) {
  static const gs_train_options defaults = {.threads = 1};
  int rc;
  *out = NULL;
  if (fail) memset(fail, 0, sizeof *fail);
  gs_train *t = calloc(1, sizeof *t);
  if (!t) return gs_err_set(e, GS_INTERNAL, "", "out of host memory"), -ENOMEM;
  t->opt = opt ? *opt : defaults;
  t->b = b;
  t->a = a;
  t->train = train;
  t->test = test;
  t->perm_epoch = -1;
  t->eval_step = UINT64_MAX;
  t->ckpt_step = UINT64_MAX;
  t->test_loss = t->test_acc = NAN;
  snprintf(t->name, sizeof t->name, "%s", spec && spec->name ? spec->name : "");
  if ((rc = gs_model_build(spec, &t->model, e))) goto fail;
  t->r = t->model.recipe;
  if (t->opt.epochs > 0) {
    if (t->opt.epochs > GS_MODEL_MAX_EPOCHS) {
      rc = gs_err_set(e, GS_INVALID_ARGUMENT, "epochs", "epochs %u is out of range: from 1 to %u",
                      t->opt.epochs, GS_MODEL_MAX_EPOCHS);
      rc = -EINVAL;
      goto fail;
    }
    t->r.epochs = t->opt.epochs;
  }
  if (t->opt.has_max_steps) t->r.max_steps = t->opt.max_steps;
  if (t->opt.has_precision) {
    switch (t->opt.precision) {
    case GS_PRECISION_FLOAT32: t->r.dtype = GS_F32; break;
    case GS_PRECISION_MIXED_FLOAT16: t->r.dtype = GS_F16; break;
    case GS_PRECISION_MIXED_BFLOAT16: t->r.dtype = GS_BF16; break;
    default:
      rc = gs_err_set(e, GS_INVALID_ARGUMENT, "precision", "precision %d is unknown",
                      (int)t->opt.precision);
      rc = -EINVAL;
      goto fail;
    }
    t->r.precision = t->opt.precision;
  }
  if (t->opt.checkpoint_every) t->r.checkpoint_every_steps = t->opt.checkpoint_every;
  t->dt = t->r.dtype;
  t->mixed = t->dt != GS_F32;
  t->fp16 = t->dt == GS_F16;
  t->scale_host = t->fp16 ? t->r.loss_scale_initial : 1.0f;
  if (!train) {
    rc = gs_err_set(e, GS_INVALID_ARGUMENT, "train", "the job has no train dataset");
    rc = -EINVAL;
    goto fail;
  }
  if ((rc = check_set(&t->model, "train", train, false, e))) goto fail;
  if (test && (rc = check_set(&t->model, "test", test, true, e))) goto fail;
  uint64_t eff = (uint64_t)t->r.batch_size * t->r.accumulation_steps;
  t->steps_per_epoch = train->n / eff;
  if (t->steps_per_epoch == 0) {
    rc = gs_err_set(e, GS_INVALID_ARGUMENT, "batch_size",
                    "the train set has %" PRIu64 " examples, fewer than one effective batch "
                    "(batch_size %u x accumulation_steps %u = %" PRIu64 ")",
                    train->n, t->r.batch_size, t->r.accumulation_steps, eff);
    rc = -EINVAL;
    goto fail;
  }
  t->total_steps = t->steps_per_epoch * t->r.epochs;
  if (t->r.max_steps && t->r.max_steps < t->total_steps) t->total_steps = t->r.max_steps;
  if ((rc = check_ops(t, e))) goto fail;

  gs_exec_config cfg = {.threads = t->opt.threads > 0 ? t->opt.threads : 1, .device_index = 0};
  if ((rc = b->exec_create(b, &cfg, &t->ex))) {
    gs_err_set(e, GS_INTERNAL, "", "backend %s: creating the job's context failed (%d)",
               b->name, rc);
    goto fail;
  }
  t->ls = calloc(t->model.n_layers, sizeof *t->ls);
  int grc = 0;
  t->n_g = grad_slots(&t->model, t->mixed, &grc);
  t->g = calloc(t->n_g + 1, sizeof *t->g);
  t->gslot_busy = calloc(t->n_g + 1, sizeof *t->gslot_busy);
  t->gslot_of = calloc(t->model.n_layers, sizeof *t->gslot_of);
  uint64_t per = gs_shape_elements(&t->model.input);
  uint32_t nb = t->r.batch_size;
  size_t nr = (size_t)nb * t->model.positions; /* loss rows */
  t->h_img = malloc((size_t)nb * per * sizeof(float));
  t->h_lab = malloc(nr * sizeof(int32_t));
  t->h_pred = malloc(nr * sizeof(int32_t));
  t->h_loss = malloc(nr * sizeof(float));
  t->eval_idx = malloc((size_t)nb * sizeof(uint64_t));
  t->perm = malloc((size_t)train->n * sizeof(uint64_t));
  t->host_bytes = (uint64_t)nb * per * sizeof(float) + (uint64_t)nr * 3 * sizeof(int32_t) +
                  (uint64_t)nb * sizeof(uint64_t) + train->n * sizeof(uint64_t);
  if (!t->ls || grc || !t->g || !t->gslot_busy || !t->gslot_of || !t->h_img || !t->h_lab ||
      !t->h_pred || !t->h_loss || !t->eval_idx || !t->perm) {
    rc = gs_err_set(e, GS_INTERNAL, "", "out of host memory for the batch staging");
    rc = -ENOMEM;
    goto fail;
  }
  if ((rc = alloc_all(t, fail, e))) goto fail;
  snapshot_if_peak(t);
  if (t->opt.resume_path) {
    if ((rc = restore(t, t->opt.resume_path, e))) goto fail;
  } else {
    if ((rc = init_params(t, e))) goto fail;
    if ((rc = push_state(t, e))) goto fail;
    if ((rc = refresh_working(t, e))) goto fail;
  }
  if (t->step >= t->total_steps) t->finished = true;
  *out = t;
  return 0;
fail:
  gs_train_destroy(t);
  return rc < 0 ? rc : -EINVAL;
}

void gs_train_destroy(gs_train *t) {
  if (!t) return;
  (void)ck_wait(t, NULL); /* a checkpoint still being written finishes first */
  if (t->ex) t->b->synchronize(t->ex);
  free_blocks(t);
  if (t->ex) t->b->exec_destroy(t->ex);
  free(t->blocks);
  free(t->ls);
  free(t->g);
  free(t->gslot_busy);
  free(t->gslot_of);
  free(t->h_img);
  free(t->h_lab);
  free(t->h_pred);
  free(t->h_loss);
  free(t->eval_idx);
  free(t->perm);
  free(t->snap);
  gs_model_free(&t->model);
  free(t);
}

/* ------------------------------------------------------- memory timeline --- */

typedef struct snap_ctx {
  gs_train *t;
  bool failed;
} snap_ctx;

static void snap_one(void *u, const char *layer, gs_role role, uint64_t bytes) {
  snap_ctx *c = u;
  gs_train *t = c->t;
  if (c->failed || bytes == 0) return;
  if (t->n_snap == t->cap_snap) {
    size_t cap = t->cap_snap ? 2 * t->cap_snap : 32;
    tag_bytes *nb = realloc(t->snap, cap * sizeof *nb);
    if (!nb) {
      c->failed = true;
      return;
    }
    t->snap = nb;
    t->cap_snap = cap;
  }
  tag_bytes *x = &t->snap[t->n_snap++];
  snprintf(x->layer, sizeof x->layer, "%s", layer);
  x->role = role;
  x->bytes = bytes;
}

/* Who holds the bytes now, kept as the breakdown at the peak when in_use is
 * the highest seen so far (the runtime allocates everything at create, so
 * that is the moment after alloc_all; a later rise retakes it). A failed
 * snapshot keeps the previous one. */
static void snapshot_if_peak(gs_train *t) {
  gs_alloc_stats st;
  gs_alloc_stats_get(t->a, &st);
  if (t->snap && st.in_use <= t->snap_total) return;
  size_t keep = t->n_snap;
  t->n_snap = 0;
  snap_ctx c = {.t = t};
  gs_alloc_foreach_tag(t->a, snap_one, &c);
  if (c.failed) {
    t->n_snap = keep;
    return;
  }
  t->snap_total = st.in_use;
}

/* Append one step's peak; past GS_TRAIN_TIMELINE_MAX entries, neighbours
 * merge pairwise and each entry then covers twice the steps. */
static void timeline_push(gs_train *t, uint64_t step, uint64_t peak) {
  if (t->tl_stride == 0) t->tl_stride = 1;
  if (peak > t->tl_open_peak) t->tl_open_peak = peak;
  t->tl_open_step = step;
  if (++t->tl_open_n < t->tl_stride) return;
  if (t->tl_n == GS_TRAIN_TIMELINE_MAX) {
    for (uint32_t i = 0; i < GS_TRAIN_TIMELINE_MAX / 2; i++) {
      uint64_t a = t->tl_peak[2 * i], b = t->tl_peak[2 * i + 1];
      t->tl_peak[i] = a > b ? a : b;
      t->tl_step[i] = t->tl_step[2 * i + 1];
    }
    t->tl_n = GS_TRAIN_TIMELINE_MAX / 2;
    t->tl_stride *= 2;
    /* The open entry just completed covers the old stride: it becomes the
     * first half of a new, wider entry. */
    t->tl_open_n = t->tl_stride / 2;
    return;
  }
  t->tl_step[t->tl_n] = t->tl_open_step;
  t->tl_peak[t->tl_n] = t->tl_open_peak;
  t->tl_n++;
  t->tl_open_n = 0;
  t->tl_open_peak = 0;
}

static uint64_t job_peak(const gs_train *t) {
  gs_alloc_stats st;
  gs_alloc_stats_get(t->a, &st);
  return st.peak_in_use > t->peak_max ? st.peak_in_use : t->peak_max;
}

int gs_train_memory_timeline(const gs_train *t, uint64_t planned_peak_bytes, gs_timeline *out) {
  memset(out, 0, sizeof *out);
  size_t n_steps = t->tl_n + (t->tl_open_n ? 1 : 0);
  const gs_model *m = &t->model;
  if (n_steps) {
    out->steps = calloc(n_steps, sizeof *out->steps);
    if (!out->steps) goto fail;
    for (size_t i = 0; i < n_steps; i++) {
      out->steps[i].step = i < t->tl_n ? t->tl_step[i] : t->tl_open_step;
      out->steps[i].peak_in_use_bytes = i < t->tl_n ? t->tl_peak[i] : t->tl_open_peak;
    }
    out->n_steps = n_steps;
  }
  /* One row per layer that holds memory, in model order, then "job". */
  out->at_peak = calloc((size_t)m->n_layers + 1, sizeof *out->at_peak);
  if (!out->at_peak) goto fail;
  for (uint32_t i = 0; i <= m->n_layers; i++) {
    const char *name = i < m->n_layers ? m->layers[i].name : "job";
    bool any = false;
    for (size_t j = 0; j < t->n_snap && !any; j++) any = !strcmp(t->snap[j].layer, name);
    if (!any) continue;
    gs_timeline_row *r = &out->at_peak[out->n_at_peak++];
    snprintf(r->layer, sizeof r->layer, "%s", name);
    if (i < m->n_layers) {
      snprintf(r->kind, sizeof r->kind, "%s", gs_layer_kind_name(m->layers[i].kind));
      gs_shape_format(&m->layers[i].out, t->r.batch_size, r->output_shape,
                      sizeof r->output_shape);
      r->parameters = m->layers[i].param_count;
    } else {
      snprintf(r->kind, sizeof r->kind, "job");
    }
    for (size_t j = 0; j < t->n_snap; j++)
      if (!strcmp(t->snap[j].layer, name) && (unsigned)t->snap[j].role < GS_ROLE_COUNT)
        r->bytes[t->snap[j].role] += t->snap[j].bytes;
  }
  out->peak_bytes = job_peak(t);
  out->planned_peak_bytes = planned_peak_bytes;
  return 0;
fail:
  gs_timeline_free(out);
  return -ENOMEM;
}

void gs_timeline_free(gs_timeline *tl) {
  if (!tl) return;
  free(tl->steps);
  free(tl->at_peak);
  memset(tl, 0, sizeof *tl);
}

/* ------------------------------------------------------------------- run --- */

static void progress(gs_train *t, uint64_t step_peak) {
  if (!t->opt.on_step) return;
  gs_alloc_stats st;
  gs_alloc_stats_get(t->a, &st);
  gs_train_progress p = {
      .step = t->step,
      .total_steps = t->total_steps,
      .epoch = t->epoch + 1,
      .epochs = t->r.epochs,
      .step_in_epoch = t->step_in_epoch,
      .steps_per_epoch = t->steps_per_epoch,
      .loss = t->last_step_loss,
      .samples_per_second =
          t->epoch_time > 0 ? (float)((double)t->epoch_samples / t->epoch_time) : 0.0f,
      .loss_scale = t->scale_host,
      .skipped_steps = (uint64_t)t->skipped_host,
      .memory_in_use = st.in_use,
      .memory_peak_step = step_peak,
      .job_bytes = t->dev_bytes,
      .host_bytes = t->host_bytes + (t->ck_flight ? t->ck_flight->bytes : 0),
  };
  t->opt.on_step(t->opt.user, &p);
}

static int evaluate_now(gs_train *t, gs_err *e) {
  int rc = gs_train_evaluate(t, &t->test_loss, &t->test_acc, e);
  if (rc == 0) t->eval_step = t->step;
  return rc;
}

static int end_epoch(gs_train *t, gs_err *e) {
  int rc;
  if ((rc = evaluate_now(t, e))) return rc;
  t->last_epoch_loss = t->epoch_steps ? (float)(t->epoch_loss_sum / (double)t->epoch_steps)
                                      : t->last_step_loss;
  if (t->opt.on_epoch) {
    gs_train_epoch m = {
        .epoch = t->epoch + 1,
        .step = t->step,
        .train_loss = t->last_epoch_loss,
        .test_loss = t->test_loss,
        .test_accuracy = t->test_acc,
        .samples_per_second =
            t->epoch_time > 0 ? (float)((double)t->epoch_samples / t->epoch_time) : 0.0f,
        .peak_memory_bytes = job_peak(t),
        .loss_scale = t->scale_host,
        .skipped_steps = (uint64_t)(t->skipped_host - t->epoch_skipped0),
    };
    t->opt.on_epoch(t->opt.user, &m);
  }
  t->epoch_skipped0 = t->skipped_host;
  t->epoch++;
  t->epochs_done = t->epoch;
  t->step_in_epoch = 0;
  t->epoch_loss_sum = 0;
  t->epoch_steps = 0;
  t->epoch_time = 0;
  t->epoch_samples = 0;
  if (t->opt.checkpoint_path && (rc = checkpoint_async(t, t->opt.checkpoint_path, e)))
    return rc;
  return 0;
}

/* The backend's device time (backend.h: timer_start/timer_stop), or the
 * wall time where a backend has no timer. */
static int device_timer_start(gs_train *t, double *wall0) {
  *wall0 = now_s();
  return t->b->timer_start ? t->b->timer_start(t->ex) : 0;
}

/* The stop waits for the step's last op: a fault of the step's kernels that
 * nothing in the step waited for surfaces here, and a lost device
 * (-ENOTRECOVERABLE, backend.h) is returned so that it is this step's. */
static int device_timer_stop(gs_train *t, double wall0) {
  double d = 0;
  int rc = t->b->timer_start ? t->b->timer_stop(t->ex, &d) : -ENOTSUP;
  if (rc) d = now_s() - wall0;
  t->last_device_seconds = d;
  return rc == -ENOTRECOVERABLE ? rc : 0;
}

static int train_steps(gs_train *t, uint64_t n, bool *done, gs_err *e);

int gs_train_steps(gs_train *t, uint64_t n, bool *done, gs_err *e) {
  gs_fpenv fp = gs_fpenv_flush_denormals(); /* kernels/fpenv.h */
  double wall0;
  int trc = device_timer_start(t, &wall0);
  int rc = train_steps(t, n, done, e);
  if (trc == 0) {
    int src = device_timer_stop(t, wall0);
    if (src && !rc) {
      gs_err_set(e, GS_INTERNAL, "", "backend %s: the device was lost in this step (%d)",
                 t->b->name, src);
      rc = src;
    }
  } else {
    t->last_device_seconds = 0;
  }
  gs_fpenv_restore(fp);
  return rc;
}

double gs_train_last_device_seconds(const gs_train *t) { return t->last_device_seconds; }

/* A MIXED_FLOAT16 run whose every optimizer step was skipped (gradients
 * inf/NaN at every loss scale it tried) never changed its weights: it ends
 * in an error, not as a trained model at chance accuracy. */
static int check_all_skipped(const gs_train *t, gs_err *e) {
  if (!t->fp16 || t->step == 0 || (uint64_t)t->skipped_host < t->step) return 0;
  return gs_err_set(e, GS_FAILED_PRECONDITION, "precision",
                    "all %" PRIu64 " optimizer steps of the run were skipped because the "
                    "MIXED_FLOAT16 gradients overflowed (inf or NaN) at every loss scale, "
                    "from %g down to %g, so the weights never changed; train in "
                    "MIXED_BFLOAT16 or FLOAT32, or with a lower learning rate",
                    t->step, (double)t->r.loss_scale_initial, (double)t->scale_host);
}

static int train_steps(gs_train *t, uint64_t n, bool *done, gs_err *e) {
  int rc = 0;
  while (n-- > 0 && !t->finished) {
    if (t->opt.cancel && atomic_load(t->opt.cancel)) {
      t->cancelled = true;
      t->finished = true;
      break;
    }
    /* The step's own peak: keep the job's peak so far, reset the
     * allocator's, read it back after the step. */
    gs_alloc_stats st;
    gs_alloc_stats_get(t->a, &st);
    if (st.peak_in_use > t->peak_max) t->peak_max = st.peak_in_use;
    gs_alloc_reset_peak(t->a);
    rc = do_step(t, e);
    gs_alloc_stats_get(t->a, &st);
    if (st.peak_in_use > t->peak_max) t->peak_max = st.peak_in_use;
    if (rc) return rc;
    timeline_push(t, t->step, st.peak_in_use);
    snapshot_if_peak(t);
    progress(t, st.peak_in_use);
    bool epoch_end = t->step_in_epoch == t->steps_per_epoch;
    if (epoch_end && (rc = end_epoch(t, e))) return rc;
    if (!epoch_end && t->opt.checkpoint_path && t->r.checkpoint_every_steps &&
        t->step % t->r.checkpoint_every_steps == 0 &&
        (rc = checkpoint_async(t, t->opt.checkpoint_path, e)))
      return rc;
    if (t->step >= t->total_steps) {
      t->finished = true;
      /* max_steps stopped mid-epoch: still report where the model stands. */
      if (t->eval_step != t->step && (rc = evaluate_now(t, e))) return rc;
      if (t->opt.checkpoint_path && t->ckpt_step != t->step &&
          (rc = gs_train_checkpoint(t, t->opt.checkpoint_path, e)))
        return rc;
      /* A finished job's last checkpoint is on disk before it says so. */
      if ((rc = ck_wait(t, e))) return rc;
      if ((rc = check_all_skipped(t, e))) return rc;
    }
  }
  if (done) *done = t->finished;
  return 0;
}

int gs_train_run(gs_train *t, gs_err *e) {
  bool done = false;
  while (!done) {
    int rc = gs_train_steps(t, UINT64_MAX, &done, e);
    if (rc) return rc;
  }
  return 0;
}

void gs_train_result_get(const gs_train *t, gs_train_result *r) {
  gs_alloc_stats st;
  gs_alloc_stats_get(t->a, &st);
  memset(r, 0, sizeof *r);
  r->steps = t->step;
  r->epochs_done = t->epochs_done;
  r->train_loss = t->epoch_steps ? (float)(t->epoch_loss_sum / (double)t->epoch_steps)
                                 : (t->epochs_done ? t->last_epoch_loss : t->last_step_loss);
  r->test_loss = t->test_loss;
  r->test_accuracy = t->test_acc;
  r->samples_per_second = t->run_time > 0 ? (float)((double)t->run_samples / t->run_time) : 0;
  r->peak_memory_bytes = st.peak_in_use > t->peak_max ? st.peak_in_use : t->peak_max;
  r->loss_scale = t->scale_host;
  r->skipped_steps = (uint64_t)t->skipped_host;
  r->cancelled = t->cancelled;
}

const gs_model *gs_train_model(const gs_train *t) { return &t->model; }
const gs_recipe *gs_train_recipe(const gs_train *t) { return &t->r; }
uint64_t gs_train_total_steps(const gs_train *t) { return t->total_steps; }

int gs_train_read_param(gs_train *t, uint32_t layer, uint32_t param, float *host, size_t count) {
  if (layer >= t->model.n_layers || param >= t->model.layers[layer].n_params ||
      count != t->model.layers[layer].params[param].count)
    return -EINVAL;
  int rc = t->b->copy_out(t->ex, host, t->ls[layer].master[param], count * sizeof(float));
  if (!rc) rc = t->b->synchronize(t->ex);
  return rc;
}
