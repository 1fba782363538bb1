/*
 * spec.c: the defaults of a plain gs_job_spec (spec.h).
 *
 * They are gpushare.v1.JobSpec's defaults, written once more in C because
 * the runtime cannot read the generated descriptors; spec_pb.c copies a
 * decoded message's values, defaults included, so the two stay one set.
 */
#include "runtime/spec.h"

#include <string.h>

void gs_job_spec_init(gs_job_spec *s) {
  memset(s, 0, sizeof *s);
  s->batch_size = 32;
  s->accumulation_steps = 1;
  s->epochs = 1;
  s->precision = GS_PRECISION_FLOAT32;
  s->loss_scale_initial = 32768.0f;
  s->loss_scale_growth_interval = 2000;
  s->optimizer.sgd.learning_rate = 0.01f;
  s->optimizer.adam.learning_rate = 0.001f;
  s->optimizer.adam.beta1 = 0.9f;
  s->optimizer.adam.beta2 = 0.999f;
  s->optimizer.adam.epsilon = 1e-7f;
  s->train.classes = s->test.classes = 10;
}

void gs_spec_layer_init(gs_spec_layer *l, gs_layer_kind kind) {
  memset(l, 0, sizeof *l);
  l->kind = kind;
  l->stride = 1;
  l->pool_size = 2;
  l->momentum = 0.1f;
  l->epsilon = 1e-5f;
}

const char *gs_precision_name(gs_precision p) {
  switch (p) {
  case GS_PRECISION_MIXED_FLOAT16: return "mixed_float16";
  case GS_PRECISION_MIXED_BFLOAT16: return "mixed_bfloat16";
  default: return "float32";
  }
}
