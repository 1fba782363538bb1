/*
 * model.h: a job's model as gpushare understands it, before any memory exists.
 *
 * gs_model_build() reads a job spec (spec.h), validates the whole recipe
 * (model, batch, accumulation, epochs, optimizer, precision, loss scale) and
 * turns the repeated Layer into a flat, sequential list with every shape
 * inferred: for each layer its kind, its name, its input and output shape
 * (NHWC with the batch left out), its parameter tensors and their shapes.
 * It allocates no tensor; the training runtime (train.h) and the planner read
 * this list to size and place memory, so both see the same model.
 *
 * Conventions a job author sees:
 *  - names: the layer's `name`, or kind_N with N counting per kind from 1
 *    (dense_1, conv2d_1, depthwise_conv2d_1, max_pool2d_1, flatten_1, ...);
 *    two layers may not share a name (names key checkpoints and exports).
 *  - Dense takes a flat input: after a conv or pool (a 3-D H x W x C tensor) a
 *    Flatten or GlobalAveragePooling2D must come first. gpushare never
 *    flattens implicitly, so the parameter count a user reads is the one they
 *    wrote; the error says which layer to add.
 *  - activation RELU on Dense/Conv2D/DepthwiseConv2D is a ReLU fused after the
 *    op (the runtime applies relu_forward in place on the op's output).
 *  - the last layer must be a Dense: its `units` are the classes of the
 *    softmax cross-entropy loss.
 *  - a layer graph: a layer may name its inputs (Layer.inputs, by layer
 *    name; "input" is the model's input where no layer is so named); a
 *    layer naming none takes the previous layer's output, so a model that
 *    names none is the straight line it always was. Layers run in the order
 *    listed and may take only earlier layers' outputs (a cycle or a later
 *    layer is refused, naming the chain); every output but the last must be
 *    taken by some layer. add sums two or more inputs of one shape, concat
 *    joins them along the channels.
 * Errors fill gs_err with a field path relative to the JobSpec
 * ("model.layer[3].conv2d.kernel_size", "batch_size") and a message naming the
 * layer, the value and the shapes involved.
 */
#ifndef GS_TRAIN_MODEL_H
#define GS_TRAIN_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "common/error.h"
#include "kernels/backend.h"
#include "runtime/spec.h"

/* Limits the validator enforces (and documents in its messages). */
#define GS_MODEL_MAX_LAYERS 1000u
#define GS_MODEL_MAX_BATCH 65536u
#define GS_MODEL_MAX_ACCUMULATION 4096u
#define GS_MODEL_MAX_EPOCHS 10000u
#define GS_MODEL_MAX_DIM 65536u      /* any one of height, width, channels, units */
#define GS_MODEL_MAX_KERNEL 64u      /* kernel_size / pool_size */
#define GS_MODEL_MAX_ELEMENTS (1ull << 31) /* per-example elements of one tensor */
#define GS_MODEL_NAME_MAX 64
#define GS_MODEL_MAX_SEQUENCE 65536u /* model.input.sequence_length */
#define GS_MODEL_MAX_INPUTS 8u       /* inputs of one add or concat */
#define GS_MODEL_INPUT (-1)          /* gs_layer.inputs[]: the model's input */

/* One example's tensor shape, batch excluded. rank 3: (h, w, c) NHWC image;
 * rank 2: (w, c) a sequence of w positions of c channels (w = T), h = 1;
 * rank 1: (c) flat features, with h = w = 1 so h*w*c is always the count. */
typedef struct gs_shape {
  uint32_t rank; /* 1, 2 or 3 */
  uint32_t h, w, c;
} gs_shape;

/* How a parameter (or a state tensor) starts. Drawn ones come, in the
 * layer's parameter order, from one PRNG stream per layer position. */
typedef enum gs_param_init {
  GS_INIT_GLOROT = 0, /* uniform in +-sqrt(6 / (fan_in + fan_out)) */
  GS_INIT_ZEROS,
  GS_INIT_ONES,
  GS_INIT_EMBEDDING,  /* uniform in +-sqrt(3) * 0.02: a standard deviation of 0.02 */
} gs_param_init;

#define GS_MODEL_MAX_PARAMS 4 /* attention: qkv kernel and bias, out kernel and bias */
#define GS_MODEL_MAX_STATE 2  /* batch_norm: running mean and variance */
#define GS_MODEL_MAX_SAVED 3  /* tensors a layer keeps for its backward besides its output */

/* A parameter tensor of a layer ("kernel", "bias", "gamma", ...), or a
 * state tensor (trained by the forward pass, not by the optimizer: batch
 * normalisation's running statistics). Always fp32 masters. */
typedef struct gs_param_shape {
  const char *suffix;  /* full name is "<layer>.<suffix>" */
  uint32_t rank;       /* 1..4 */
  uint32_t dims[4];    /* row-major, as the backend reads it */
  uint64_t count;      /* product of dims */
  gs_param_init init;
  uint32_t fan_in, fan_out; /* GS_INIT_GLOROT: the fans, as Keras computes them */
} gs_param_shape;

/* A tensor a layer saves in its forward pass for its backward (beside its
 * output): batch_norm's mean and rstd, attention's q/k/v and scores. */
typedef struct gs_saved_shape {
  const char *suffix;  /* "<layer>.<suffix>" in plans */
  bool f32;            /* fp32 (else the storage dtype) */
  bool per_example;    /* elems is per example (times the micro-batch), else fixed */
  uint64_t elems;      /* product of dims */
  uint32_t rank;       /* dims, the batch left out (plans put it first when per_example) */
  uint32_t dims[3];
} gs_saved_shape;

typedef struct gs_layer {
  gs_layer_kind kind;
  char name[GS_MODEL_NAME_MAX]; /* given or kind_N */
  uint32_t index;               /* position in spec.model.layer */
  gs_shape in, out;             /* per-example shapes */
  bool relu;                    /* fused ReLU after the op (Dense/Conv/Depthwise) */
  uint32_t units;               /* Dense: output units; Conv2D: filters */
  uint32_t kh, kw, stride;      /* Conv2D/Depthwise/MaxPool windows */
  bool same;                    /* SAME padding (conv); pools are always VALID */
  uint32_t n_params;            /* 0, 2 (kernel, bias; gamma, beta) or 4 (attention) */
  gs_param_shape params[GS_MODEL_MAX_PARAMS];
  uint64_t param_count;         /* sum of params[].count */
  uint32_t n_state;             /* batch_norm: 2 */
  gs_param_shape state[GS_MODEL_MAX_STATE];
  uint32_t n_saved;
  gs_saved_shape saved[GS_MODEL_MAX_SAVED];
  float momentum, epsilon;      /* batch_norm, layer_norm */
  float rate;                   /* dropout */
  uint32_t vocab;               /* embedding: vocab_size */
  uint32_t heads, head_size;    /* causal_self_attention */
  uint32_t fan_in, fan_out;     /* Glorot fans of the kernel, as Keras computes them */
  uint32_t n_inputs;            /* 1, or 2..GS_MODEL_MAX_INPUTS for add and concat */
  int32_t inputs[GS_MODEL_MAX_INPUTS]; /* producing layers' indexes, or GS_MODEL_INPUT */
  uint32_t consumers;           /* later layers taking this output (+1 for the last: the loss) */
  bool needs_grad;              /* the backward pass must produce this output's gradient:
                                   the layer or a layer it takes from has parameters */
} gs_layer;

/* The recipe of a JobSpec with every default applied and every value
 * checked; what the runtime and the planner read instead of the proto. */
typedef struct gs_recipe {
  uint32_t batch_size;         /* the MICRO-batch: examples per forward/backward */
  uint32_t accumulation_steps; /* micro-batches per optimizer step (k) */
  uint32_t epochs;
  uint64_t max_steps;          /* optimizer steps; 0 = no limit */
  uint64_t seed;
  gs_precision precision;
  gs_dtype dtype;              /* activation / working-weight storage type */
  bool adam;                   /* Adam/AdamW (true) or SGD */
  float learning_rate;
  float beta1, beta2, epsilon; /* Adam */
  float momentum;              /* SGD */
  bool nesterov;               /* SGD */
  float weight_decay;
  bool decoupled;              /* AdamW */
  gs_lr_schedule lr_schedule;
  uint32_t lr_warmup_steps;    /* linear warm-up, then the schedule */
  float lr_final_fraction;     /* COSINE: the last step's rate / learning_rate */
  uint32_t optimizer_slots;    /* fp32 state tensors per parameter: 0, 1 or 2 */
  float loss_scale_initial;    /* MIXED_FLOAT16 only */
  uint32_t loss_scale_growth_interval;
  uint32_t checkpoint_every_steps; /* 0 = only at epoch ends */
} gs_recipe;

/* The learning rate of optimizer step `step` (0-based) of `total`, by the
 * recipe's schedule: warm-up first, then constant or half a cosine down to
 * learning_rate * lr_final_fraction at the last step. A pure function of the
 * step, so a resumed run takes the same rates. */
float gs_recipe_learning_rate(const gs_recipe *r, uint64_t step, uint64_t total);

typedef struct gs_model {
  gs_recipe recipe;    /* the validated recipe (gs_model_build fills it) */
  gs_shape input;      /* from spec.model.input */
  uint32_t n_layers;
  gs_layer *layers;    /* n_layers entries (host memory, owned) */
  uint32_t classes;    /* the last Dense's units */
  uint64_t param_count;
  uint64_t max_elements; /* largest per-example activation (any layer in/out) */
  bool graph;          /* some layer takes other than its predecessor's output */
  bool tokens;         /* a token input: (sequence_length) int32 ids; input is rank 2 (T, 1) */
  uint32_t positions;  /* loss rows per example: T for a sequence, else 1 */
} gs_model;

/* Validate the whole JobSpec recipe and build the layer list. On success
 * fills *m (free with gs_model_free) and returns 0; on an invalid spec
 * returns -EINVAL with e filled (code INVALID_ARGUMENT, field, message).
 * Datasets are not opened here: see gs_model_check_dataset. */
int gs_model_build(const gs_job_spec *spec, gs_model *m, gs_err *e);
void gs_model_free(gs_model *m);

/* Check that a dataset of examples (h, w, c) with `classes` labels can feed
 * the model: the input shape must match and the classes must equal the last
 * Dense's units. `which` is the JobSpec field ("train" or "test") for the
 * error path. Returns 0 or -EINVAL with e filled. */
int gs_model_check_dataset(const gs_model *m, const char *which, uint32_t h, uint32_t w,
                           uint32_t c, uint32_t classes, gs_err *e);

/* Check that a token dataset (sequences of seq_len ids below vocab) can feed
 * the model: a token input of that sequence length, embeddings that cover
 * the vocabulary, and a head of one unit per token id. Returns 0 or -EINVAL
 * with e filled. */
int gs_model_check_tokens(const gs_model *m, const char *which, uint32_t seq_len,
                          uint32_t vocab, gs_err *e);

/* Validate the scalar recipe alone (batch, accumulation, epochs, precision,
 * optimizer, loss scale) and resolve its defaults into *r; gs_model_build
 * calls it. An absent optimizer means Adam with its JobSpec defaults
 * (learning rate 1e-3, betas 0.9/0.999, epsilon 1e-7). */
int gs_model_check_recipe(const gs_job_spec *spec, gs_recipe *r, gs_err *e);

/* Convolution/pool geometry of layer l for a batch of n (conv, depthwise,
 * max pool only). */
gs_conv_shape gs_model_conv_shape(const gs_layer *l, uint32_t n);

const char *gs_layer_kind_name(gs_layer_kind k); /* "dense", "conv2d", ... */
/* "(28, 28, 1)" or "(784)"; with batch > 0: "(128, 28, 28, 1)". buf >= 64. */
const char *gs_shape_format(const gs_shape *s, uint32_t batch, char *buf, size_t len);
static inline uint64_t gs_shape_elements(const gs_shape *s) {
  return (uint64_t)s->h * s->w * s->c;
}

#endif
