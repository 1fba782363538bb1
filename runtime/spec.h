/*
 * spec.h: a training job as the runtime reads it, in plain C.
 *
 * The runtime's API takes a gs_job_spec, never a generated protobuf struct,
 * so the runtime builds and links without protobuf-c and can be driven from
 * any front end (a test, a benchmark, another wire format). The struct holds
 * what the runtime reads from a gpushare.v1.JobSpec and nothing of the
 * control plane (priority, vdev): the model, the datasets, the recipe.
 *
 * It is deliberately NOT validated: gs_model_build (model.h) checks every
 * value and reports the first problem with the JobSpec's field path
 * ("model.layer[3].conv2d.kernel_size"), whatever built the struct. So a
 * field carries the value as written: a kind-specific layer field is read
 * only for its kind, a presence flag (has_*) exists where absence means
 * something other than a value, and an enum field may hold a number the
 * runtime does not know (convert/spec_pb.c passes a protobuf value it cannot
 * map through unchanged), which the validator then rejects with that
 * number. The runtime's enum values equal gpushare.v1's numbers for that
 * reason; spec_pb.c still maps them one by one.
 *
 * Defaults are the JobSpec's: gs_job_spec_init and gs_spec_layer_init set
 * them (batch 32, 1 accumulation step, 1 epoch, stride 1, pool 2, Adam's
 * and the loss scale's defaults), so a hand-built spec reads like a .txtpb.
 * Strings are borrowed: the struct never owns them.
 */
#ifndef GS_RUNTIME_SPEC_H
#define GS_RUNTIME_SPEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum gs_layer_kind {
  GS_LAYER_DENSE = 0,
  GS_LAYER_CONV2D,
  GS_LAYER_DEPTHWISE_CONV2D,
  GS_LAYER_MAX_POOL2D,
  GS_LAYER_GLOBAL_AVERAGE_POOLING2D,
  GS_LAYER_FLATTEN,
  GS_LAYER_RELU,
  GS_LAYER_ADD,
  GS_LAYER_CONCAT,
  GS_LAYER_BATCH_NORM,
  GS_LAYER_LAYER_NORM,
  GS_LAYER_DROPOUT,
  GS_LAYER_AVERAGE_POOL2D,
  GS_LAYER_GELU,
  GS_LAYER_EMBEDDING,
  GS_LAYER_POSITION_EMBEDDING,
  GS_LAYER_CAUSAL_SELF_ATTENTION,
  GS_LAYER_KIND_COUNT /* in a gs_spec_layer: the layer names no kind */
} gs_layer_kind;

typedef enum gs_precision {
  GS_PRECISION_FLOAT32 = 0,
  GS_PRECISION_MIXED_FLOAT16 = 1,
  GS_PRECISION_MIXED_BFLOAT16 = 2,
} gs_precision;

typedef enum gs_activation {
  GS_ACTIVATION_NONE = 0,
  GS_ACTIVATION_RELU = 1,
} gs_activation;

typedef enum gs_padding {
  GS_PADDING_SAME = 0,
  GS_PADDING_VALID = 1,
} gs_padding;

typedef enum gs_lr_schedule {
  GS_LR_CONSTANT = 0, /* the optimizer's learning_rate throughout */
  GS_LR_COSINE = 1,   /* half a cosine down to learning_rate * final_fraction */
} gs_lr_schedule;

typedef enum gs_optimizer_kind {
  GS_OPTIMIZER_NONE = 0, /* none given: Adam with its defaults */
  GS_OPTIMIZER_SGD = 1,
  GS_OPTIMIZER_ADAM = 2,
} gs_optimizer_kind;

typedef enum gs_dataset_source {
  GS_DATASET_NONE = 0,
  GS_DATASET_IDX,       /* images + labels (paths or "sha256:HEX") */
  GS_DATASET_NAME,      /* a dataset in the daemon's store */
  GS_DATASET_SYNTHETIC, /* examples, seed, classes */
  GS_DATASET_NPY,       /* images + labels .npy (paths or "sha256:HEX") */
  GS_DATASET_TEXT,      /* path: raw text, a token per byte; examples, sequence_length */
  GS_DATASET_TOKENS,    /* path: uint16 ids; vocab_size, examples, sequence_length */
} gs_dataset_source;

/* One layer. Only the fields of its kind are read. */
typedef struct gs_spec_layer {
  const char *name;         /* NULL or "": kind_N */
  gs_layer_kind kind;       /* GS_LAYER_KIND_COUNT: none given */
  uint32_t units;           /* dense */
  uint32_t filters;         /* conv2d */
  uint32_t kernel_size;     /* conv2d, depthwise_conv2d */
  uint32_t stride;          /* conv2d, depthwise_conv2d (default 1); pools with has_stride */
  bool has_stride;          /* max_pool2d, average_pool2d: stride given (else the pool size) */
  uint32_t pool_size;       /* max_pool2d, average_pool2d (default 2) */
  float momentum;           /* batch_norm (default 0.1) */
  float epsilon;            /* batch_norm, layer_norm (default 1e-5) */
  float rate;               /* dropout */
  uint32_t vocab_size, dim; /* embedding */
  uint32_t heads, head_size; /* causal_self_attention */
  gs_activation activation; /* dense, conv2d, depthwise_conv2d, add */
  gs_padding padding;       /* conv2d, depthwise_conv2d */
  const char *const *inputs; /* n_inputs layer names ("input": the model's input) */
  size_t n_inputs;          /* 0: the previous layer's output */
} gs_spec_layer;

typedef struct gs_spec_dataset {
  gs_dataset_source source;
  const char *images, *labels; /* IDX, NPY */
  const char *name;            /* NAME */
  uint64_t examples;           /* SYNTHETIC; TEXT, TOKENS (0: all the file holds) */
  uint64_t seed;               /* SYNTHETIC */
  uint32_t classes;            /* SYNTHETIC (default 10) */
  const char *path;            /* TEXT, TOKENS */
  uint32_t vocab_size;         /* TOKENS */
  uint32_t sequence_length;    /* TEXT, TOKENS: T */
} gs_spec_dataset;

typedef struct gs_spec_sgd {
  float learning_rate; /* default 0.01 */
  float momentum;
  bool nesterov;
  float weight_decay;
} gs_spec_sgd;

typedef struct gs_spec_adam {
  float learning_rate; /* default 0.001 */
  float beta1, beta2;  /* 0.9, 0.999 */
  float epsilon;       /* 1e-7 */
  float weight_decay;
  bool decoupled;      /* AdamW */
} gs_spec_adam;

typedef struct gs_spec_schedule {
  gs_lr_schedule kind;
  uint32_t warmup_steps;  /* linear warm-up first */
  float final_fraction;   /* COSINE: where it ends, 0..1 */
} gs_spec_schedule;

typedef struct gs_spec_optimizer {
  gs_optimizer_kind kind;
  gs_spec_sgd sgd;   /* kind SGD */
  gs_spec_adam adam; /* kind ADAM */
  bool has_schedule;
  gs_spec_schedule schedule;
} gs_spec_optimizer;

typedef struct gs_spec_input {
  uint32_t height, width, channels;
  uint32_t sequence_length; /* a token input (height, width, channels 0) */
} gs_spec_input;

typedef struct gs_job_spec {
  const char *name;
  bool has_model;            /* false: "the job has no model" */
  bool has_input;            /* model.input given */
  gs_spec_input input;
  const gs_spec_layer *layers; /* n_layers entries, in order */
  size_t n_layers;
  gs_spec_dataset train, test;
  uint32_t batch_size;       /* the micro-batch (default 32) */
  uint32_t accumulation_steps; /* default 1 */
  uint32_t epochs;           /* default 1 */
  uint64_t max_steps;        /* 0 = no limit */
  uint64_t seed;
  gs_precision precision;
  bool has_loss_scale;       /* else 2^15 and 2000 */
  float loss_scale_initial;
  uint32_t loss_scale_growth_interval;
  bool has_optimizer;        /* false: Adam with its defaults */
  gs_spec_optimizer optimizer;
  bool auto_fit;
  uint32_t checkpoint_every_steps; /* 0 = only at epoch ends */
} gs_job_spec;

/* The JobSpec's defaults, no model, no datasets. */
void gs_job_spec_init(gs_job_spec *s);
/* A layer of `kind` with the JobSpec's defaults (stride 1, pool 2). */
void gs_spec_layer_init(gs_spec_layer *l, gs_layer_kind kind);

/* "float32", "mixed_float16", "mixed_bfloat16" ("float32" for an unknown value). */
const char *gs_precision_name(gs_precision p);

#endif
