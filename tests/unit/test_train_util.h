/*
 * test_train_util.h: job specs built in C for the model and training tests.
 *
 * The runtime takes a plain gs_job_spec (runtime/spec.h), so the tests
 * assemble one directly, no protobuf involved. A tspec owns the layer array
 * its spec points to; it lives on the heap (ts_new) because the spec points
 * into it. Layer builders append in order, as a .txtpb does, and every
 * value starts at the JobSpec's default.
 */
#ifndef GS_TEST_TRAIN_UTIL_H
#define GS_TEST_TRAIN_UTIL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "runtime/spec.h"

#define TS_MAX_LAYERS 32

#define TS_MAX_INPUTS 8

typedef struct tspec {
  gs_job_spec spec;
  gs_spec_layer layer[TS_MAX_LAYERS];
  const char *inputs[TS_MAX_LAYERS][TS_MAX_INPUTS];
} tspec;

static inline tspec *ts_new(uint32_t h, uint32_t w, uint32_t c) {
  tspec *t = calloc(1, sizeof *t);
  if (!t) abort();
  gs_job_spec_init(&t->spec);
  t->spec.has_model = t->spec.has_input = true;
  t->spec.input.height = h;
  t->spec.input.width = w;
  t->spec.input.channels = c;
  t->spec.layers = t->layer;
  t->spec.name = "test";
  for (int i = 0; i < TS_MAX_LAYERS; i++) gs_spec_layer_init(&t->layer[i], GS_LAYER_KIND_COUNT);
  return t;
}

static inline gs_spec_layer *ts_add(tspec *t, gs_layer_kind kind) {
  if (t->spec.n_layers >= TS_MAX_LAYERS) abort();
  gs_spec_layer *l = &t->layer[t->spec.n_layers++];
  l->kind = kind;
  return l;
}

static inline void ts_dense(tspec *t, uint32_t units, bool relu) {
  gs_spec_layer *l = ts_add(t, GS_LAYER_DENSE);
  l->units = units;
  l->activation = relu ? GS_ACTIVATION_RELU : GS_ACTIVATION_NONE;
}

static inline void ts_conv(tspec *t, uint32_t filters, uint32_t k, uint32_t stride, bool same,
                           bool relu) {
  gs_spec_layer *l = ts_add(t, GS_LAYER_CONV2D);
  l->filters = filters;
  l->kernel_size = k;
  l->stride = stride;
  l->padding = same ? GS_PADDING_SAME : GS_PADDING_VALID;
  l->activation = relu ? GS_ACTIVATION_RELU : GS_ACTIVATION_NONE;
}

static inline void ts_dw(tspec *t, uint32_t k, uint32_t stride, bool same, bool relu) {
  gs_spec_layer *l = ts_add(t, GS_LAYER_DEPTHWISE_CONV2D);
  l->kernel_size = k;
  l->stride = stride;
  l->padding = same ? GS_PADDING_SAME : GS_PADDING_VALID;
  l->activation = relu ? GS_ACTIVATION_RELU : GS_ACTIVATION_NONE;
}

static inline void ts_pool(tspec *t, uint32_t pool, uint32_t stride) {
  gs_spec_layer *l = ts_add(t, GS_LAYER_MAX_POOL2D);
  l->pool_size = pool;
  l->has_stride = stride != 0;
  l->stride = stride;
}

static inline void ts_flatten(tspec *t) { ts_add(t, GS_LAYER_FLATTEN); }
static inline void ts_gap(tspec *t) { ts_add(t, GS_LAYER_GLOBAL_AVERAGE_POOLING2D); }
static inline void ts_relu(tspec *t) { ts_add(t, GS_LAYER_RELU); }

static inline void ts_add_layer(tspec *t, bool relu) {
  gs_spec_layer *l = ts_add(t, GS_LAYER_ADD);
  l->activation = relu ? GS_ACTIVATION_RELU : GS_ACTIVATION_NONE;
}
static inline void ts_concat(tspec *t) { ts_add(t, GS_LAYER_CONCAT); }

/* The last layer's name. */
static inline void ts_name(tspec *t, const char *name) {
  t->layer[t->spec.n_layers - 1].name = name;
}

/* The last layer's inputs, by name, up to a NULL. */
static inline void ts_in(tspec *t, const char *first, ...) {
  size_t i = t->spec.n_layers - 1, n = 0;
  va_list ap;
  va_start(ap, first);
  for (const char *nm = first; nm && n < TS_MAX_INPUTS; nm = va_arg(ap, const char *))
    t->inputs[i][n++] = nm;
  va_end(ap);
  t->layer[i].inputs = t->inputs[i];
  t->layer[i].n_inputs = n;
}

static inline void ts_adam(tspec *t, float lr) {
  t->spec.has_optimizer = true;
  t->spec.optimizer.kind = GS_OPTIMIZER_ADAM;
  t->spec.optimizer.adam.learning_rate = lr;
}

static inline void ts_sgd(tspec *t, float lr, float momentum) {
  t->spec.has_optimizer = true;
  t->spec.optimizer.kind = GS_OPTIMIZER_SGD;
  t->spec.optimizer.sgd.learning_rate = lr;
  t->spec.optimizer.sgd.momentum = momentum;
}

static inline void ts_loss_scale(tspec *t, float initial, uint32_t growth) {
  t->spec.has_loss_scale = true;
  t->spec.loss_scale_initial = initial;
  t->spec.loss_scale_growth_interval = growth;
}

static inline void ts_recipe(tspec *t, uint32_t batch, uint32_t accum, uint32_t epochs,
                             uint64_t seed, gs_precision precision) {
  t->spec.batch_size = batch;
  t->spec.accumulation_steps = accum;
  t->spec.epochs = epochs;
  t->spec.seed = seed;
  t->spec.precision = precision;
}

#endif
