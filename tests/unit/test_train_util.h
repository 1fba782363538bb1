/*
 * test_train_util.h: JobSpecs built in C for the model and training tests.
 *
 * protobuf-c has no text-format parser, so the tests assemble a
 * Gpushare__V1__JobSpec from its generated structs. A tspec owns every
 * sub-message it points to; it lives on the heap (ts_new) because the
 * messages point into it. Layer builders append in order, as a .txtpb does.
 */
#ifndef GS_TEST_TRAIN_UTIL_H
#define GS_TEST_TRAIN_UTIL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "proto/gpushare.pb-c.h"

#define TS_MAX_LAYERS 32

typedef struct tspec {
  Gpushare__V1__JobSpec spec;
  Gpushare__V1__Model model;
  Gpushare__V1__InputShape input;
  Gpushare__V1__Layer layer[TS_MAX_LAYERS];
  Gpushare__V1__Layer *lp[TS_MAX_LAYERS];
  Gpushare__V1__Dense dense[TS_MAX_LAYERS];
  Gpushare__V1__Conv2D conv[TS_MAX_LAYERS];
  Gpushare__V1__DepthwiseConv2D dw[TS_MAX_LAYERS];
  Gpushare__V1__MaxPool2D pool[TS_MAX_LAYERS];
  Gpushare__V1__GlobalAveragePooling2D gap;
  Gpushare__V1__Flatten flatten;
  Gpushare__V1__ReLU relu;
  Gpushare__V1__Optimizer opt;
  Gpushare__V1__Adam adam;
  Gpushare__V1__Sgd sgd;
  Gpushare__V1__LossScale ls;
} tspec;

static inline tspec *ts_new(uint32_t h, uint32_t w, uint32_t c) {
  tspec *t = calloc(1, sizeof *t);
  if (!t) abort();
  Gpushare__V1__JobSpec s = GPUSHARE__V1__JOB_SPEC__INIT;
  Gpushare__V1__Model m = GPUSHARE__V1__MODEL__INIT;
  Gpushare__V1__InputShape in = GPUSHARE__V1__INPUT_SHAPE__INIT;
  Gpushare__V1__GlobalAveragePooling2D g = GPUSHARE__V1__GLOBAL_AVERAGE_POOLING2_D__INIT;
  Gpushare__V1__Flatten f = GPUSHARE__V1__FLATTEN__INIT;
  Gpushare__V1__ReLU r = GPUSHARE__V1__RE_LU__INIT;
  Gpushare__V1__Optimizer o = GPUSHARE__V1__OPTIMIZER__INIT;
  Gpushare__V1__Adam a = GPUSHARE__V1__ADAM__INIT;
  Gpushare__V1__Sgd sg = GPUSHARE__V1__SGD__INIT;
  Gpushare__V1__LossScale ls = GPUSHARE__V1__LOSS_SCALE__INIT;
  t->spec = s;
  t->model = m;
  t->input = in;
  t->gap = g;
  t->flatten = f;
  t->relu = r;
  t->opt = o;
  t->adam = a;
  t->sgd = sg;
  t->ls = ls;
  t->input.has_height = t->input.has_width = t->input.has_channels = 1;
  t->input.height = h;
  t->input.width = w;
  t->input.channels = c;
  t->model.input = &t->input;
  t->model.layer = t->lp;
  t->spec.model = &t->model;
  t->spec.name = "test";
  for (int i = 0; i < TS_MAX_LAYERS; i++) {
    Gpushare__V1__Layer l = GPUSHARE__V1__LAYER__INIT;
    Gpushare__V1__Dense d = GPUSHARE__V1__DENSE__INIT;
    Gpushare__V1__Conv2D cv = GPUSHARE__V1__CONV2_D__INIT;
    Gpushare__V1__DepthwiseConv2D dw = GPUSHARE__V1__DEPTHWISE_CONV2_D__INIT;
    Gpushare__V1__MaxPool2D p = GPUSHARE__V1__MAX_POOL2_D__INIT;
    t->layer[i] = l;
    t->dense[i] = d;
    t->conv[i] = cv;
    t->dw[i] = dw;
    t->pool[i] = p;
    t->lp[i] = &t->layer[i];
  }
  return t;
}

static inline Gpushare__V1__Layer *ts_add(tspec *t) {
  if (t->model.n_layer >= TS_MAX_LAYERS) abort();
  return &t->layer[t->model.n_layer++];
}

static inline void ts_dense(tspec *t, uint32_t units, bool relu) {
  size_t i = t->model.n_layer;
  Gpushare__V1__Layer *l = ts_add(t);
  t->dense[i].has_units = 1;
  t->dense[i].units = units;
  t->dense[i].activation = relu ? GPUSHARE__V1__ACTIVATION__RELU : GPUSHARE__V1__ACTIVATION__NONE;
  l->kind_case = GPUSHARE__V1__LAYER__KIND_DENSE;
  l->dense = &t->dense[i];
}

static inline void ts_conv(tspec *t, uint32_t filters, uint32_t k, uint32_t stride, bool same,
                           bool relu) {
  size_t i = t->model.n_layer;
  Gpushare__V1__Layer *l = ts_add(t);
  t->conv[i].filters = filters;
  t->conv[i].kernel_size = k;
  t->conv[i].stride = stride;
  t->conv[i].padding = same ? GPUSHARE__V1__PADDING__SAME : GPUSHARE__V1__PADDING__VALID;
  t->conv[i].activation = relu ? GPUSHARE__V1__ACTIVATION__RELU : GPUSHARE__V1__ACTIVATION__NONE;
  l->kind_case = GPUSHARE__V1__LAYER__KIND_CONV2D;
  l->conv2d = &t->conv[i];
}

static inline void ts_dw(tspec *t, uint32_t k, uint32_t stride, bool same, bool relu) {
  size_t i = t->model.n_layer;
  Gpushare__V1__Layer *l = ts_add(t);
  t->dw[i].kernel_size = k;
  t->dw[i].stride = stride;
  t->dw[i].padding = same ? GPUSHARE__V1__PADDING__SAME : GPUSHARE__V1__PADDING__VALID;
  t->dw[i].activation = relu ? GPUSHARE__V1__ACTIVATION__RELU : GPUSHARE__V1__ACTIVATION__NONE;
  l->kind_case = GPUSHARE__V1__LAYER__KIND_DEPTHWISE_CONV2D;
  l->depthwise_conv2d = &t->dw[i];
}

static inline void ts_pool(tspec *t, uint32_t pool, uint32_t stride) {
  size_t i = t->model.n_layer;
  Gpushare__V1__Layer *l = ts_add(t);
  t->pool[i].pool_size = pool;
  t->pool[i].has_stride = stride != 0;
  t->pool[i].stride = stride;
  l->kind_case = GPUSHARE__V1__LAYER__KIND_MAX_POOL2D;
  l->max_pool2d = &t->pool[i];
}

static inline void ts_flatten(tspec *t) {
  Gpushare__V1__Layer *l = ts_add(t);
  l->kind_case = GPUSHARE__V1__LAYER__KIND_FLATTEN;
  l->flatten = &t->flatten;
}

static inline void ts_gap(tspec *t) {
  Gpushare__V1__Layer *l = ts_add(t);
  l->kind_case = GPUSHARE__V1__LAYER__KIND_GLOBAL_AVERAGE_POOLING2D;
  l->global_average_pooling2d = &t->gap;
}

static inline void ts_relu(tspec *t) {
  Gpushare__V1__Layer *l = ts_add(t);
  l->kind_case = GPUSHARE__V1__LAYER__KIND_RELU;
  l->relu = &t->relu;
}

static inline void ts_adam(tspec *t, float lr) {
  t->adam.has_learning_rate = 1;
  t->adam.learning_rate = lr;
  t->opt.kind_case = GPUSHARE__V1__OPTIMIZER__KIND_ADAM;
  t->opt.adam = &t->adam;
  t->spec.optimizer = &t->opt;
}

static inline void ts_sgd(tspec *t, float lr, float momentum) {
  t->sgd.has_learning_rate = 1;
  t->sgd.learning_rate = lr;
  t->sgd.has_momentum = 1;
  t->sgd.momentum = momentum;
  t->opt.kind_case = GPUSHARE__V1__OPTIMIZER__KIND_SGD;
  t->opt.sgd = &t->sgd;
  t->spec.optimizer = &t->opt;
}

static inline void ts_loss_scale(tspec *t, float initial, uint32_t growth) {
  t->ls.has_initial = t->ls.has_growth_interval = 1;
  t->ls.initial = initial;
  t->ls.growth_interval = growth;
  t->spec.loss_scale = &t->ls;
}

static inline void ts_recipe(tspec *t, uint32_t batch, uint32_t accum, uint32_t epochs,
                             uint64_t seed, int precision) {
  t->spec.has_batch_size = t->spec.has_accumulation_steps = t->spec.has_epochs = 1;
  t->spec.batch_size = batch;
  t->spec.accumulation_steps = accum;
  t->spec.epochs = epochs;
  t->spec.has_seed = 1;
  t->spec.seed = seed;
  t->spec.has_precision = 1;
  t->spec.precision = (Gpushare__V1__Precision)precision;
}

#endif
