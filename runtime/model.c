/*
 * model.c: JobSpec -> validated recipe + sequential layer list with shapes.
 *
 * One pass over spec.model.layer carries the current per-example shape from
 * the input to the logits. Each layer kind has a small function that checks
 * its own fields against the shape it receives, reports the first problem
 * with the field path and both shapes, and writes the shape it produces and
 * its parameter tensors. Nothing here touches device memory: the runtime and
 * the planner both start from this list, so a shape error is found before a
 * single byte is reserved on a vdev.
 */
#include "runtime/model.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const kind_names[GS_LAYER_KIND_COUNT] = {
    "dense", "conv2d", "depthwise_conv2d", "max_pool2d",
    "global_average_pooling2d", "flatten", "relu", "add", "concat",
    "batch_norm", "layer_norm", "dropout", "average_pool2d", "gelu",
    "embedding", "position_embedding", "causal_self_attention",
};

const char *gs_layer_kind_name(gs_layer_kind k) {
  return (unsigned)k < GS_LAYER_KIND_COUNT ? kind_names[k] : "unknown";
}

const char *gs_shape_format(const gs_shape *s, uint32_t batch, char *buf, size_t len) {
  char b[16] = "";
  if (batch) snprintf(b, sizeof b, "%u, ", batch);
  if (s->rank == 1)
    snprintf(buf, len, "(%s%u)", b, s->c);
  else if (s->rank == 2)
    snprintf(buf, len, "(%s%u, %u)", b, s->w, s->c);
  else
    snprintf(buf, len, "(%s%u, %u, %u)", b, s->h, s->w, s->c);
  return buf;
}

/* "28x28x1" or "784": how messages spell an input. */
static const char *shape_x(const gs_shape *s, char *buf, size_t len) {
  if (s->rank == 1)
    snprintf(buf, len, "%u", s->c);
  else if (s->rank == 2)
    snprintf(buf, len, "%u positions x %u", s->w, s->c);
  else
    snprintf(buf, len, "%ux%ux%u", s->h, s->w, s->c);
  return buf;
}

static bool finite_pos(float x) { return isfinite(x) && x > 0.0f; }
static bool finite_nonneg(float x) { return isfinite(x) && x >= 0.0f; }
static bool unit_interval(float x) { return isfinite(x) && x >= 0.0f && x < 1.0f; }

int gs_model_check_recipe(const gs_job_spec *spec, gs_recipe *r, gs_err *e) {
  memset(r, 0, sizeof *r);
  if (spec->batch_size < 1 || spec->batch_size > GS_MODEL_MAX_BATCH)
    return gs_err_set(e, GS_INVALID_ARGUMENT, "batch_size",
                      "batch_size %u is out of range: it is the micro-batch, from 1 to %u",
                      spec->batch_size, GS_MODEL_MAX_BATCH),
           -EINVAL;
  if (spec->accumulation_steps < 1 || spec->accumulation_steps > GS_MODEL_MAX_ACCUMULATION)
    return gs_err_set(e, GS_INVALID_ARGUMENT, "accumulation_steps",
                      "accumulation_steps %u is out of range: from 1 to %u",
                      spec->accumulation_steps, GS_MODEL_MAX_ACCUMULATION),
           -EINVAL;
  if (spec->epochs < 1 || spec->epochs > GS_MODEL_MAX_EPOCHS)
    return gs_err_set(e, GS_INVALID_ARGUMENT, "epochs",
                      "epochs %u is out of range: from 1 to %u", spec->epochs,
                      GS_MODEL_MAX_EPOCHS),
           -EINVAL;
  r->batch_size = spec->batch_size;
  r->accumulation_steps = spec->accumulation_steps;
  r->epochs = spec->epochs;
  r->max_steps = spec->max_steps;
  r->seed = spec->seed;
  r->checkpoint_every_steps = spec->checkpoint_every_steps;

  switch (spec->precision) {
  case GS_PRECISION_FLOAT32: r->dtype = GS_F32; break;
  case GS_PRECISION_MIXED_FLOAT16: r->dtype = GS_F16; break;
  case GS_PRECISION_MIXED_BFLOAT16: r->dtype = GS_BF16; break;
  default:
    return gs_err_set(e, GS_INVALID_ARGUMENT, "precision",
                      "precision %d is unknown: FLOAT32, MIXED_FLOAT16 or MIXED_BFLOAT16",
                      (int)spec->precision),
           -EINVAL;
  }
  r->precision = spec->precision;

  r->loss_scale_initial = 32768.0f;
  r->loss_scale_growth_interval = 2000;
  if (spec->has_loss_scale) {
    if (!finite_pos(spec->loss_scale_initial))
      return gs_err_set(e, GS_INVALID_ARGUMENT, "loss_scale.initial",
                        "loss_scale.initial %g must be finite and > 0",
                        (double)spec->loss_scale_initial),
             -EINVAL;
    if (spec->loss_scale_growth_interval < 1)
      return gs_err_set(e, GS_INVALID_ARGUMENT, "loss_scale.growth_interval",
                        "loss_scale.growth_interval %u must be >= 1",
                        spec->loss_scale_growth_interval),
             -EINVAL;
    r->loss_scale_initial = spec->loss_scale_initial;
    r->loss_scale_growth_interval = spec->loss_scale_growth_interval;
  }

  /* Defaults of gpushare.v1.Adam when no optimizer is given. */
  r->adam = true;
  r->learning_rate = 1e-3f;
  r->beta1 = 0.9f;
  r->beta2 = 0.999f;
  r->epsilon = 1e-7f;
  const gs_spec_optimizer *o = spec->has_optimizer ? &spec->optimizer : NULL;
  if (o && o->kind == GS_OPTIMIZER_SGD) {
    const gs_spec_sgd *s = &o->sgd;
    if (!finite_pos(s->learning_rate))
      return gs_err_set(e, GS_INVALID_ARGUMENT, "optimizer.sgd.learning_rate",
                        "learning_rate %g must be finite and > 0", (double)s->learning_rate),
             -EINVAL;
    if (!unit_interval(s->momentum))
      return gs_err_set(e, GS_INVALID_ARGUMENT, "optimizer.sgd.momentum",
                        "momentum %g must be in [0, 1)", (double)s->momentum),
             -EINVAL;
    if (!finite_nonneg(s->weight_decay))
      return gs_err_set(e, GS_INVALID_ARGUMENT, "optimizer.sgd.weight_decay",
                        "weight_decay %g must be finite and >= 0", (double)s->weight_decay),
             -EINVAL;
    if (s->nesterov && s->momentum == 0.0f)
      return gs_err_set(e, GS_INVALID_ARGUMENT, "optimizer.sgd.nesterov",
                        "nesterov needs a momentum > 0 (momentum is 0)"),
             -EINVAL;
    r->adam = false;
    r->learning_rate = s->learning_rate;
    r->momentum = s->momentum;
    r->nesterov = s->nesterov;
    r->weight_decay = s->weight_decay;
    r->optimizer_slots = s->momentum > 0.0f ? 1 : 0;
  } else if (o && o->kind == GS_OPTIMIZER_ADAM) {
    const gs_spec_adam *a = &o->adam;
    if (!finite_pos(a->learning_rate))
      return gs_err_set(e, GS_INVALID_ARGUMENT, "optimizer.adam.learning_rate",
                        "learning_rate %g must be finite and > 0", (double)a->learning_rate),
             -EINVAL;
    if (!unit_interval(a->beta1))
      return gs_err_set(e, GS_INVALID_ARGUMENT, "optimizer.adam.beta1",
                        "beta1 %g must be in [0, 1)", (double)a->beta1),
             -EINVAL;
    if (!unit_interval(a->beta2))
      return gs_err_set(e, GS_INVALID_ARGUMENT, "optimizer.adam.beta2",
                        "beta2 %g must be in [0, 1)", (double)a->beta2),
             -EINVAL;
    if (!finite_pos(a->epsilon))
      return gs_err_set(e, GS_INVALID_ARGUMENT, "optimizer.adam.epsilon",
                        "epsilon %g must be finite and > 0", (double)a->epsilon),
             -EINVAL;
    if (!finite_nonneg(a->weight_decay))
      return gs_err_set(e, GS_INVALID_ARGUMENT, "optimizer.adam.weight_decay",
                        "weight_decay %g must be finite and >= 0", (double)a->weight_decay),
             -EINVAL;
    r->learning_rate = a->learning_rate;
    r->beta1 = a->beta1;
    r->beta2 = a->beta2;
    r->epsilon = a->epsilon;
    r->weight_decay = a->weight_decay;
    r->decoupled = a->decoupled;
  } else if (o && o->kind != GS_OPTIMIZER_NONE) {
    return gs_err_set(e, GS_INVALID_ARGUMENT, "optimizer",
                      "optimizer kind %d is unknown: sgd or adam", (int)o->kind),
           -EINVAL;
  }
  if (r->adam) r->optimizer_slots = 2;
  r->lr_schedule = GS_LR_CONSTANT;
  if (o && o->has_schedule) {
    const gs_spec_schedule *ls = &o->schedule;
    if (ls->kind != GS_LR_CONSTANT && ls->kind != GS_LR_COSINE)
      return gs_err_set(e, GS_INVALID_ARGUMENT, "optimizer.schedule.kind",
                        "schedule kind %d is unknown: CONSTANT or COSINE", (int)ls->kind),
             -EINVAL;
    if (!(ls->final_fraction >= 0.0f && ls->final_fraction <= 1.0f))
      return gs_err_set(e, GS_INVALID_ARGUMENT, "optimizer.schedule.final_fraction",
                        "final_fraction %g must be from 0 to 1", (double)ls->final_fraction),
             -EINVAL;
    if (ls->warmup_steps > 100000000u)
      return gs_err_set(e, GS_INVALID_ARGUMENT, "optimizer.schedule.warmup_steps",
                        "warmup_steps %u is over 100000000", ls->warmup_steps),
             -EINVAL;
    r->lr_schedule = ls->kind;
    r->lr_warmup_steps = ls->warmup_steps;
    r->lr_final_fraction = ls->final_fraction;
  }
  return 0;
}

float gs_recipe_learning_rate(const gs_recipe *r, uint64_t step, uint64_t total) {
  double lr = r->learning_rate;
  uint64_t w = r->lr_warmup_steps;
  if (w && step < w) return (float)(lr * (double)(step + 1) / (double)w);
  if (r->lr_schedule != GS_LR_COSINE) return (float)lr;
  double span = total > w + 1 ? (double)(total - w - 1) : 1.0;
  double p = (double)(step - w) / span;
  if (p > 1.0) p = 1.0;
  double f = r->lr_final_fraction;
  return (float)(lr * (f + (1.0 - f) * 0.5 * (1.0 + cos(3.14159265358979323846 * p))));
}

/* Layer-building context: the error path and the layer's display name. */
typedef struct lctx {
  gs_err *e;
  const gs_layer *l;
  char path[64]; /* "model.layer[3]" */
} lctx;

static int lerr(lctx *c, const char *sub, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int lerr(lctx *c, const char *sub, const char *fmt, ...) {
  char field[160], what[640];
  snprintf(field, sizeof field, "%s%s%s", c->path, sub && *sub ? "." : "", sub ? sub : "");
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  gs_err_set(c->e, GS_INVALID_ARGUMENT, field, "layer %s (layer[%u]): %s", c->l->name,
             c->l->index, what);
  return -EINVAL;
}

static void set_param(gs_param_shape *p, const char *suffix, uint32_t rank, uint32_t d0,
                      uint32_t d1, uint32_t d2, uint32_t d3) {
  uint32_t d[4] = {d0, d1, d2, d3};
  memset(p, 0, sizeof *p);
  p->suffix = suffix;
  p->init = GS_INIT_ZEROS;
  p->rank = rank;
  p->count = 1;
  for (uint32_t i = 0; i < 4; i++) {
    p->dims[i] = i < rank ? d[i] : 0;
    if (i < rank) p->count *= d[i];
  }
}

/* A Glorot-drawn kernel with its fans. */
static void set_kernel(gs_param_shape *p, uint32_t rank, uint32_t d0, uint32_t d1, uint32_t d2,
                       uint32_t d3, uint32_t fan_in, uint32_t fan_out) {
  set_param(p, "kernel", rank, d0, d1, d2, d3);
  p->init = GS_INIT_GLOROT;
  p->fan_in = fan_in;
  p->fan_out = fan_out;
}

static void set_vec(gs_param_shape *p, const char *suffix, uint32_t n, gs_param_init init) {
  set_param(p, suffix, 1, n, 0, 0, 0);
  p->init = init;
}

static void set_saved(gs_saved_shape *v, const char *suffix, bool f32, bool per_example,
                      uint32_t rank, uint32_t d0, uint32_t d1, uint32_t d2) {
  uint32_t d[3] = {d0, d1, d2};
  memset(v, 0, sizeof *v);
  v->suffix = suffix;
  v->f32 = f32;
  v->per_example = per_example;
  v->rank = rank;
  v->elems = 1;
  for (uint32_t i = 0; i < rank; i++) {
    v->dims[i] = d[i];
    v->elems *= d[i];
  }
}

static int need_image(lctx *c, const char *kind_field) {
  char s[48];
  if (c->l->in.rank == 3) return 0;
  return lerr(c, kind_field, "%s needs an image input (height x width x channels), got the flat "
              "input %s",
              gs_layer_kind_name(c->l->kind), shape_x(&c->l->in, s, sizeof s));
}

static int check_window(lctx *c, const char *sub_k, const char *sub_s, uint32_t k,
                        uint32_t stride, bool same, const char *what) {
  char s[48];
  gs_layer *l = (gs_layer *)c->l;
  if (k < 1 || k > GS_MODEL_MAX_KERNEL)
    return lerr(c, sub_k, "%s %u is out of range: from 1 to %u", what, k, GS_MODEL_MAX_KERNEL);
  if (stride < 1 || stride > GS_MODEL_MAX_KERNEL)
    return lerr(c, sub_s, "stride %u is out of range: from 1 to %u", stride,
                GS_MODEL_MAX_KERNEL);
  if (!same && (k > l->in.h || k > l->in.w))
    return lerr(c, sub_k, "%s %ux%u with VALID padding does not fit input %s", what, k, k,
                shape_x(&l->in, s, sizeof s));
  l->kh = l->kw = k;
  l->stride = stride;
  l->same = same;
  l->out.rank = 3;
  l->out.h = gs_window_out(l->in.h, k, stride, same);
  l->out.w = gs_window_out(l->in.w, k, stride, same);
  return 0;
}

static int build_dense(lctx *c, gs_layer *l, const gs_spec_layer *d) {
  char s[48];
  if (l->in.rank == 3)
    return lerr(c, "dense", "dense needs a flat input but gets %s from the layer before: add a "
                "flatten {} (or global_average_pooling2d {}) layer before it (over a sequence, "
                "dense works per position)",
                shape_x(&l->in, s, sizeof s));
  if (d->units < 1 || d->units > GS_MODEL_MAX_DIM)
    return lerr(c, "dense.units", "units %u is out of range: from 1 to %u", d->units,
                GS_MODEL_MAX_DIM);
  if (d->activation != GS_ACTIVATION_NONE && d->activation != GS_ACTIVATION_RELU)
    return lerr(c, "dense.activation", "activation %d is unknown: NONE or RELU",
                (int)d->activation);
  l->relu = d->activation == GS_ACTIVATION_RELU;
  l->units = d->units;
  l->out = l->in; /* flat, or per position of a sequence */
  l->out.c = d->units;
  l->n_params = 2;
  set_kernel(&l->params[0], 2, l->in.c, d->units, 0, 0, l->in.c, d->units);
  set_param(&l->params[1], "bias", 1, d->units, 0, 0, 0);
  l->fan_in = l->in.c;
  l->fan_out = d->units;
  return 0;
}

static int check_activation_padding(lctx *c, const char *kind, int act, int pad) {
  char f[64];
  if (act != GS_ACTIVATION_NONE && act != GS_ACTIVATION_RELU) {
    snprintf(f, sizeof f, "%s.activation", kind);
    return lerr(c, f, "activation %d is unknown: NONE or RELU", act);
  }
  if (pad != GS_PADDING_SAME && pad != GS_PADDING_VALID) {
    snprintf(f, sizeof f, "%s.padding", kind);
    return lerr(c, f, "padding %d is unknown: SAME or VALID", pad);
  }
  return 0;
}

static int build_conv2d(lctx *c, gs_layer *l, const gs_spec_layer *d) {
  int rc;
  if ((rc = need_image(c, "conv2d"))) return rc;
  if ((rc = check_activation_padding(c, "conv2d", d->activation, d->padding))) return rc;
  if (d->filters < 1 || d->filters > GS_MODEL_MAX_DIM)
    return lerr(c, "conv2d.filters", "filters %u is out of range: from 1 to %u", d->filters,
                GS_MODEL_MAX_DIM);
  if ((rc = check_window(c, "conv2d.kernel_size", "conv2d.stride", d->kernel_size, d->stride,
                         d->padding == GS_PADDING_SAME, "kernel")))
    return rc;
  l->relu = d->activation == GS_ACTIVATION_RELU;
  l->units = d->filters;
  l->out.c = d->filters;
  l->n_params = 2;
  l->fan_in = l->kh * l->kw * l->in.c;
  l->fan_out = l->kh * l->kw * d->filters;
  set_kernel(&l->params[0], 4, l->kh, l->kw, l->in.c, d->filters, l->fan_in, l->fan_out);
  set_param(&l->params[1], "bias", 1, d->filters, 0, 0, 0);
  return 0;
}

static int build_depthwise(lctx *c, gs_layer *l, const gs_spec_layer *d) {
  int rc;
  if ((rc = need_image(c, "depthwise_conv2d"))) return rc;
  if ((rc = check_activation_padding(c, "depthwise_conv2d", d->activation, d->padding)))
    return rc;
  if ((rc = check_window(c, "depthwise_conv2d.kernel_size", "depthwise_conv2d.stride",
                         d->kernel_size, d->stride,
                         d->padding == GS_PADDING_SAME, "kernel")))
    return rc;
  l->relu = d->activation == GS_ACTIVATION_RELU;
  l->units = l->in.c;
  l->out.c = l->in.c;
  l->n_params = 2;
  /* Keras sees the depthwise kernel as (KH, KW, C, 1). */
  l->fan_in = l->kh * l->kw * l->in.c;
  l->fan_out = l->kh * l->kw;
  set_kernel(&l->params[0], 3, l->kh, l->kw, l->in.c, 0, l->fan_in, l->fan_out);
  set_param(&l->params[1], "bias", 1, l->in.c, 0, 0, 0);
  return 0;
}

/* max_pool2d and average_pool2d: VALID windows. */
static int build_pool(lctx *c, gs_layer *l, const gs_spec_layer *d) {
  int rc;
  const char *k = gs_layer_kind_name(l->kind);
  char fk[48], fs[48];
  snprintf(fk, sizeof fk, "%s.pool_size", k);
  snprintf(fs, sizeof fs, "%s.stride", k);
  if ((rc = need_image(c, k))) return rc;
  uint32_t stride = d->has_stride && d->stride ? d->stride : d->pool_size;
  if (d->has_stride && d->stride == 0)
    return lerr(c, fs, "stride 0 is out of range: from 1 to %u (or unset for "
                "the pool size)", GS_MODEL_MAX_KERNEL);
  if ((rc = check_window(c, fk, fs, d->pool_size, stride, false, "pool"))) return rc;
  l->out.c = l->in.c;
  return 0;
}

static int build_batchnorm(lctx *c, gs_layer *l, const gs_spec_layer *d) {
  if (!(d->momentum >= 0.0f && d->momentum <= 1.0f))
    return lerr(c, "batch_norm.momentum", "momentum %g must be from 0 to 1 (PyTorch's: the "
                "weight of the batch's statistics in the running ones)", (double)d->momentum);
  if (!(isfinite(d->epsilon) && d->epsilon > 0.0f))
    return lerr(c, "batch_norm.epsilon", "epsilon %g must be finite and > 0",
                (double)d->epsilon);
  const uint32_t ch = l->in.c;
  l->momentum = d->momentum;
  l->epsilon = d->epsilon;
  l->n_params = 2;
  set_vec(&l->params[0], "gamma", ch, GS_INIT_ONES);
  set_vec(&l->params[1], "beta", ch, GS_INIT_ZEROS);
  l->n_state = 2;
  set_vec(&l->state[0], "running_mean", ch, GS_INIT_ZEROS);
  set_vec(&l->state[1], "running_var", ch, GS_INIT_ONES);
  l->n_saved = 2;
  set_saved(&l->saved[0], "mean", true, false, 1, ch, 0, 0);
  set_saved(&l->saved[1], "rstd", true, false, 1, ch, 0, 0);
  return 0;
}

static int build_layernorm(lctx *c, gs_layer *l, const gs_spec_layer *d) {
  if (!(isfinite(d->epsilon) && d->epsilon > 0.0f))
    return lerr(c, "layer_norm.epsilon", "epsilon %g must be finite and > 0",
                (double)d->epsilon);
  const uint32_t rows = l->in.h * l->in.w;
  l->epsilon = d->epsilon;
  l->n_params = 2;
  set_vec(&l->params[0], "gamma", l->in.c, GS_INIT_ONES);
  set_vec(&l->params[1], "beta", l->in.c, GS_INIT_ZEROS);
  l->n_saved = 2;
  set_saved(&l->saved[0], "mean", true, true, 1, rows, 0, 0);
  set_saved(&l->saved[1], "rstd", true, true, 1, rows, 0, 0);
  return 0;
}

static int build_dropout(lctx *c, gs_layer *l, const gs_spec_layer *d) {
  if (!(d->rate >= 0.0f && d->rate < 1.0f))
    return lerr(c, "dropout.rate", "rate %g must be in [0, 1): the fraction of elements "
                "zeroed while training", (double)d->rate);
  l->rate = d->rate;
  return 0;
}

#define GS_MODEL_MAX_VOCAB (1u << 20)

static int build_embedding(lctx *c, const gs_model *m, gs_layer *l, const gs_spec_layer *d) {
  if (!m->tokens || l->inputs[0] != GS_MODEL_INPUT)
    return lerr(c, "embedding", "embedding takes the model's token input (model.input "
                "{ sequence_length }): name \"input\" in its inputs, or make it the first layer");
  if (d->vocab_size < 2 || d->vocab_size > GS_MODEL_MAX_VOCAB)
    return lerr(c, "embedding.vocab_size", "vocab_size %u is out of range: from 2 to %u",
                d->vocab_size, GS_MODEL_MAX_VOCAB);
  if (d->dim < 1 || d->dim > GS_MODEL_MAX_DIM)
    return lerr(c, "embedding.dim", "dim %u is out of range: from 1 to %u", d->dim,
                GS_MODEL_MAX_DIM);
  l->vocab = d->vocab_size;
  l->units = d->dim;
  l->out = (gs_shape){.rank = 2, .h = 1, .w = l->in.w, .c = d->dim};
  l->n_params = 1;
  set_param(&l->params[0], "embeddings", 2, d->vocab_size, d->dim, 0, 0);
  l->params[0].init = GS_INIT_EMBEDDING;
  return 0;
}

static int need_sequence(lctx *c, const char *kind) {
  char s[48];
  if (c->l->in.rank == 2) return 0;
  return lerr(c, kind, "%s needs a sequence (positions x channels, after an embedding), got "
              "%s", kind, shape_x(&c->l->in, s, sizeof s));
}

static int build_position_embedding(lctx *c, gs_layer *l) {
  int rc;
  if ((rc = need_sequence(c, "position_embedding"))) return rc;
  l->n_params = 1;
  set_param(&l->params[0], "embeddings", 2, l->in.w, l->in.c, 0, 0);
  l->params[0].init = GS_INIT_EMBEDDING;
  return 0;
}

static int build_attention(lctx *c, gs_layer *l, const gs_spec_layer *d) {
  int rc;
  if ((rc = need_sequence(c, "causal_self_attention"))) return rc;
  if (d->heads < 1 || d->heads > 1024)
    return lerr(c, "causal_self_attention.heads", "heads %u is out of range: from 1 to 1024",
                d->heads);
  if (d->head_size < 1 || d->head_size > 1024)
    return lerr(c, "causal_self_attention.head_size",
                "head_size %u is out of range: from 1 to 1024", d->head_size);
  const uint32_t C = l->in.c, T = l->in.w, hd = d->heads * d->head_size;
  if ((uint64_t)hd * 3 > GS_MODEL_MAX_DIM)
    return lerr(c, "causal_self_attention.heads", "heads x head_size = %u: 3 x that is over %u",
                hd, GS_MODEL_MAX_DIM);
  uint64_t scores = (uint64_t)d->heads * T * T;
  if (scores > GS_MODEL_MAX_ELEMENTS)
    return lerr(c, "causal_self_attention.heads", "%u heads of %u x %u scores are %llu elements "
                "per example: at most %llu (a shorter sequence_length)", d->heads, T, T,
                (unsigned long long)scores, (unsigned long long)GS_MODEL_MAX_ELEMENTS);
  l->heads = d->heads;
  l->head_size = d->head_size;
  l->n_params = 4;
  set_kernel(&l->params[0], 2, C, 3 * hd, 0, 0, C, 3 * hd);
  l->params[0].suffix = "qkv_kernel";
  set_param(&l->params[1], "qkv_bias", 1, 3 * hd, 0, 0, 0);
  set_kernel(&l->params[2], 2, hd, C, 0, 0, hd, C);
  l->params[2].suffix = "out_kernel";
  set_param(&l->params[3], "out_bias", 1, C, 0, 0, 0);
  l->fan_in = C;
  l->fan_out = 3 * hd;
  l->n_saved = 3;
  set_saved(&l->saved[0], "qkv", false, true, 2, T, 3 * hd, 0);
  set_saved(&l->saved[1], "heads", false, true, 2, T, hd, 0);
  set_saved(&l->saved[2], "scores", true, true, 3, d->heads, T, T);
  return 0;
}

static int check_name(lctx *c, const char *name) {
  size_t n = strlen(name);
  if (n >= GS_MODEL_NAME_MAX)
    return lerr(c, "name", "name is %zu characters long: at most %d", n, GS_MODEL_NAME_MAX - 1);
  for (size_t i = 0; i < n; i++) {
    char ch = name[i];
    bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '_' || ch == '-';
    if (!ok)
      return lerr(c, "name", "name \"%s\" has the character '%c': use letters, digits, '_' "
                  "and '-' (a name keys the layer's tensors, as name.kernel)", name, ch);
  }
  return 0;
}

/* Pass 1: every layer's kind and name (given, or kind_N), so that inputs
 * may name any layer, even one further down (which is then refused by
 * name, not as unknown). */
static int name_layers(const gs_job_spec *spec, gs_model *m, gs_err *e) {
  uint32_t per_kind[GS_LAYER_KIND_COUNT] = {0};
  for (uint32_t i = 0; i < m->n_layers; i++) {
    const gs_spec_layer *pl = &spec->layers[i];
    gs_layer *l = &m->layers[i];
    lctx c = {.e = e, .l = l};
    snprintf(c.path, sizeof c.path, "model.layer[%u]", i);
    l->index = i;
    if ((unsigned)pl->kind >= GS_LAYER_KIND_COUNT)
      return gs_err_set(e, GS_INVALID_ARGUMENT, c.path,
                        "layer[%u] has no kind: one of dense, conv2d, depthwise_conv2d, "
                        "max_pool2d, global_average_pooling2d, flatten, relu, add, concat",
                        i),
             -EINVAL;
    l->kind = pl->kind;
    per_kind[l->kind]++;
    if (pl->name && pl->name[0]) {
      snprintf(l->name, sizeof l->name, "%s", pl->name);
      if (check_name(&c, pl->name)) return -EINVAL;
    } else {
      snprintf(l->name, sizeof l->name, "%s_%u", gs_layer_kind_name(l->kind), per_kind[l->kind]);
    }
    for (uint32_t j = 0; j < i; j++)
      if (strcmp(m->layers[j].name, l->name) == 0)
        return lerr(&c, "name", "the name %s is already layer[%u]'s: layer names must be unique",
                    l->name, j);
  }
  return 0;
}

/* The index of the layer named `name`, GS_MODEL_INPUT for "input" where no
 * layer has that name, or INT32_MIN. */
static int32_t find_layer(const gs_model *m, const char *name) {
  for (uint32_t j = 0; j < m->n_layers; j++)
    if (strcmp(m->layers[j].name, name) == 0) return (int32_t)j;
  return strcmp(name, "input") == 0 ? GS_MODEL_INPUT : INT32_MIN;
}

/* Whether layer `from`, following inputs back, reaches layer `to`; the
 * chain walked is appended to buf (" -> name"). Inputs are resolved from the
 * spec, so a later layer's (not yet checked) inputs are followed too. */
static bool reaches(const gs_job_spec *spec, const gs_model *m, int32_t from, int32_t to,
                    uint32_t depth, char *buf, size_t len) {
  if (from < 0 || depth > m->n_layers) return false;
  const gs_spec_layer *pl = &spec->layers[from];
  size_t n = pl->n_inputs;
  for (size_t k = 0; k < (n ? n : 1); k++) {
    int32_t j = n ? (pl->inputs[k] ? find_layer(m, pl->inputs[k]) : INT32_MIN) : from - 1;
    if (j < 0) continue;
    size_t o = strlen(buf);
    snprintf(buf + o, len - o, " <- %s", m->layers[j].name);
    if (j == to || reaches(spec, m, j, to, depth + 1, buf, len)) return true;
    buf[o] = '\0';
  }
  return false;
}

/* Pass 2: each layer's inputs as layer indexes, checked: the count its kind
 * takes, every name known and earlier than the layer. */
static int resolve_inputs(const gs_job_spec *spec, gs_model *m, gs_err *e) {
  for (uint32_t i = 0; i < m->n_layers; i++) {
    const gs_spec_layer *pl = &spec->layers[i];
    gs_layer *l = &m->layers[i];
    lctx c = {.e = e, .l = l};
    snprintf(c.path, sizeof c.path, "model.layer[%u]", i);
    bool merge = l->kind == GS_LAYER_ADD || l->kind == GS_LAYER_CONCAT;
    if (pl->n_inputs == 0) {
      if (merge)
        return lerr(&c, "inputs", "%s needs the names of 2 to %u layers in inputs, got none",
                    gs_layer_kind_name(l->kind), GS_MODEL_MAX_INPUTS);
      l->n_inputs = 1;
      l->inputs[0] = (int32_t)i - 1; /* layer 0: GS_MODEL_INPUT */
      continue;
    }
    if (merge && (pl->n_inputs < 2 || pl->n_inputs > GS_MODEL_MAX_INPUTS))
      return lerr(&c, "inputs", "%s takes 2 to %u inputs, got %zu",
                  gs_layer_kind_name(l->kind), GS_MODEL_MAX_INPUTS, pl->n_inputs);
    if (!merge && pl->n_inputs != 1)
      return lerr(&c, "inputs", "%s takes one input, got %zu: only add and concat take more",
                  gs_layer_kind_name(l->kind), pl->n_inputs);
    l->n_inputs = (uint32_t)pl->n_inputs;
    for (uint32_t k = 0; k < l->n_inputs; k++) {
      char sub[32];
      snprintf(sub, sizeof sub, "inputs[%u]", k);
      const char *nm = pl->inputs[k] ? pl->inputs[k] : "";
      int32_t j = find_layer(m, nm);
      if (j == INT32_MIN)
        return lerr(&c, sub, "input \"%s\" is no layer's name (nor \"input\", the model's "
                    "input)", nm);
      if (j == (int32_t)i)
        return lerr(&c, sub, "takes its own output: a cycle (a layer may take only the "
                    "outputs of layers before it)");
      if (j > (int32_t)i) {
        char chain[512];
        snprintf(chain, sizeof chain, "%s <- %s", l->name, m->layers[j].name);
        if (reaches(spec, m, j, (int32_t)i, 0, chain, sizeof chain))
          return lerr(&c, sub, "input %s (layer[%d]) makes a cycle: %s", nm, j, chain);
        return lerr(&c, sub, "input %s is layer[%d], after this one: layers run in the order "
                    "listed, so a layer may take only the outputs of layers before it",
                    nm, j);
      }
      for (uint32_t q = 0; q < k; q++)
        if (l->inputs[q] == j)
          return lerr(&c, sub, "input \"%s\" is named twice", nm);
      l->inputs[k] = j;
      if (j != (int32_t)i - 1 || k) m->graph = true;
    }
  }
  return 0;
}

static const gs_shape *input_shape(const gs_model *m, int32_t j) {
  return j == GS_MODEL_INPUT ? &m->input : &m->layers[j].out;
}

static const char *input_name(const gs_model *m, int32_t j) {
  return j == GS_MODEL_INPUT ? "input" : m->layers[j].name;
}

/* l->in: its (first) input's shape; the output starts as the same. */
static void input_shapes(const gs_model *m, gs_layer *l) {
  l->in = *input_shape(m, l->inputs[0]);
  l->out = l->in;
}

static int build_add(lctx *c, const gs_model *m, gs_layer *l, const gs_spec_layer *d) {
  char s1[48], s2[48];
  if (d->activation != GS_ACTIVATION_NONE && d->activation != GS_ACTIVATION_RELU)
    return lerr(c, "add.activation", "activation %d is unknown: NONE or RELU",
                (int)d->activation);
  l->relu = d->activation == GS_ACTIVATION_RELU;
  for (uint32_t k = 1; k < l->n_inputs; k++) {
    const gs_shape *a = &l->in, *b = input_shape(m, l->inputs[k]);
    if (a->rank != b->rank || a->h != b->h || a->w != b->w || a->c != b->c) {
      char sub[32];
      snprintf(sub, sizeof sub, "inputs[%u]", k);
      return lerr(c, sub, "add needs inputs of one shape: %s is %s but %s is %s",
                  input_name(m, l->inputs[0]), shape_x(a, s1, sizeof s1),
                  input_name(m, l->inputs[k]), shape_x(b, s2, sizeof s2));
    }
  }
  return 0;
}

static int build_concat(lctx *c, const gs_model *m, gs_layer *l) {
  char s1[48], s2[48];
  uint64_t ch = l->in.c;
  for (uint32_t k = 1; k < l->n_inputs; k++) {
    const gs_shape *a = &l->in, *b = input_shape(m, l->inputs[k]);
    if (a->rank != b->rank || a->h != b->h || a->w != b->w) {
      char sub[32];
      snprintf(sub, sizeof sub, "inputs[%u]", k);
      return lerr(c, sub, "concat joins along the channels, so its inputs must agree in %s: "
                  "%s is %s but %s is %s",
                  a->rank == 3 && b->rank == 3 ? "height and width" : "rank (image or flat)",
                  input_name(m, l->inputs[0]), shape_x(a, s1, sizeof s1),
                  input_name(m, l->inputs[k]), shape_x(b, s2, sizeof s2));
    }
    ch += b->c;
  }
  if (ch > GS_MODEL_MAX_DIM)
    return lerr(c, "inputs", "concat would have %llu channels: at most %u",
                (unsigned long long)ch, GS_MODEL_MAX_DIM);
  l->out.c = (uint32_t)ch;
  return 0;
}

int gs_model_build(const gs_job_spec *spec, gs_model *m, gs_err *e) {
  int rc;
  memset(m, 0, sizeof *m);
  if (!spec)
    return gs_err_set(e, GS_INVALID_ARGUMENT, "", "the job has no spec"), -EINVAL;
  if ((rc = gs_model_check_recipe(spec, &m->recipe, e))) return rc;
  if (!spec->has_model)
    return gs_err_set(e, GS_INVALID_ARGUMENT, "model", "the job has no model"), -EINVAL;
  const gs_spec_input *in = &spec->input;
  if (!spec->has_input)
    return gs_err_set(e, GS_INVALID_ARGUMENT, "model.input",
                      "the model has no input {height width channels} (or "
                      "{sequence_length} for tokens)"),
           -EINVAL;
  if (in->sequence_length) {
    if (in->height || in->width || in->channels)
      return gs_err_set(e, GS_INVALID_ARGUMENT, "model.input",
                        "the input has both sequence_length %u and an image shape %ux%ux%u: "
                        "give height, width and channels for images, or sequence_length "
                        "alone for tokens",
                        in->sequence_length, in->height, in->width, in->channels),
             -EINVAL;
    if (in->sequence_length > GS_MODEL_MAX_SEQUENCE)
      return gs_err_set(e, GS_INVALID_ARGUMENT, "model.input.sequence_length",
                        "sequence_length %u is out of range: from 1 to %u",
                        in->sequence_length, GS_MODEL_MAX_SEQUENCE),
             -EINVAL;
    m->input = (gs_shape){.rank = 2, .h = 1, .w = in->sequence_length, .c = 1};
    m->tokens = true;
  } else {
    if (in->height < 1 || in->height > GS_MODEL_MAX_DIM)
      return gs_err_set(e, GS_INVALID_ARGUMENT, "model.input.height",
                        "input height %u is out of range: from 1 to %u", in->height,
                        GS_MODEL_MAX_DIM),
             -EINVAL;
    if (in->width < 1 || in->width > GS_MODEL_MAX_DIM)
      return gs_err_set(e, GS_INVALID_ARGUMENT, "model.input.width",
                        "input width %u is out of range: from 1 to %u", in->width,
                        GS_MODEL_MAX_DIM),
             -EINVAL;
    if (in->channels < 1 || in->channels > GS_MODEL_MAX_DIM)
      return gs_err_set(e, GS_INVALID_ARGUMENT, "model.input.channels",
                        "input channels %u is out of range: from 1 to %u", in->channels,
                        GS_MODEL_MAX_DIM),
             -EINVAL;
    m->input = (gs_shape){.rank = 3, .h = in->height, .w = in->width, .c = in->channels};
    if (gs_shape_elements(&m->input) > GS_MODEL_MAX_ELEMENTS)
      return gs_err_set(e, GS_INVALID_ARGUMENT, "model.input",
                        "input %ux%ux%u has %llu elements per example: at most %llu",
                        in->height, in->width, in->channels,
                        (unsigned long long)gs_shape_elements(&m->input),
                        (unsigned long long)GS_MODEL_MAX_ELEMENTS),
             -EINVAL;
  }
  if (spec->n_layers < 1 || spec->n_layers > GS_MODEL_MAX_LAYERS)
    return gs_err_set(e, GS_INVALID_ARGUMENT, "model.layer",
                      "the model has %zu layers: from 1 to %u", spec->n_layers,
                      GS_MODEL_MAX_LAYERS),
           -EINVAL;

  m->layers = calloc(spec->n_layers, sizeof *m->layers);
  if (!m->layers)
    return gs_err_set(e, GS_INTERNAL, "model.layer", "out of host memory for %zu layers",
                      spec->n_layers),
           -ENOMEM;
  m->n_layers = (uint32_t)spec->n_layers;
  if (name_layers(spec, m, e) || resolve_inputs(spec, m, e)) goto fail;
  m->max_elements = gs_shape_elements(&m->input);
  for (uint32_t i = 0; i < m->n_layers; i++) {
    const gs_spec_layer *pl = &spec->layers[i];
    gs_layer *l = &m->layers[i];
    lctx c = {.e = e, .l = l};
    snprintf(c.path, sizeof c.path, "model.layer[%u]", i);
    input_shapes(m, l);
    for (uint32_t k = 0; k < l->n_inputs; k++)
      if (m->tokens && l->inputs[k] == GS_MODEL_INPUT && l->kind != GS_LAYER_EMBEDDING) {
        lerr(&c, l->n_inputs > 1 ? "inputs" : gs_layer_kind_name(l->kind),
             "%s takes the model's token input: only an embedding layer can (token ids are "
             "not numbers to compute with)", gs_layer_kind_name(l->kind));
        goto fail;
      }
    switch (l->kind) {
    case GS_LAYER_DENSE: rc = build_dense(&c, l, pl); break;
    case GS_LAYER_CONV2D: rc = build_conv2d(&c, l, pl); break;
    case GS_LAYER_DEPTHWISE_CONV2D: rc = build_depthwise(&c, l, pl); break;
    case GS_LAYER_MAX_POOL2D:
    case GS_LAYER_AVERAGE_POOL2D: rc = build_pool(&c, l, pl); break;
    case GS_LAYER_BATCH_NORM: rc = build_batchnorm(&c, l, pl); break;
    case GS_LAYER_LAYER_NORM: rc = build_layernorm(&c, l, pl); break;
    case GS_LAYER_DROPOUT: rc = build_dropout(&c, l, pl); break;
    case GS_LAYER_EMBEDDING: rc = build_embedding(&c, m, l, pl); break;
    case GS_LAYER_POSITION_EMBEDDING: rc = build_position_embedding(&c, l); break;
    case GS_LAYER_CAUSAL_SELF_ATTENTION: rc = build_attention(&c, l, pl); break;
    case GS_LAYER_GLOBAL_AVERAGE_POOLING2D:
      rc = need_image(&c, "global_average_pooling2d");
      l->out = (gs_shape){.rank = 1, .h = 1, .w = 1, .c = l->in.c};
      break;
    case GS_LAYER_FLATTEN:
      rc = 0;
      l->out = (gs_shape){.rank = 1, .h = 1, .w = 1, .c = (uint32_t)gs_shape_elements(&l->in)};
      break;
    case GS_LAYER_ADD: rc = build_add(&c, m, l, pl); break;
    case GS_LAYER_CONCAT: rc = build_concat(&c, m, l); break;
    default: rc = 0; break; /* relu keeps the shape */
    }
    if (rc) goto fail;
    uint64_t oe = gs_shape_elements(&l->out);
    if (oe < 1 || oe > GS_MODEL_MAX_ELEMENTS) {
      char s1[48], s2[48];
      lerr(&c, gs_layer_kind_name(l->kind), "output %s from input %s has %llu elements per "
           "example: from 1 to %llu", shape_x(&l->out, s1, sizeof s1),
           shape_x(&l->in, s2, sizeof s2), (unsigned long long)oe,
           (unsigned long long)GS_MODEL_MAX_ELEMENTS);
      goto fail;
    }
    for (uint32_t p = 0; p < l->n_params; p++) l->param_count += l->params[p].count;
    m->param_count += l->param_count;
    if (oe > m->max_elements) m->max_elements = oe;
    l->needs_grad = l->n_params > 0;
    for (uint32_t k = 0; k < l->n_inputs; k++)
      if (l->inputs[k] >= 0) {
        m->layers[l->inputs[k]].consumers++;
        l->needs_grad = l->needs_grad || m->layers[l->inputs[k]].needs_grad;
      }
  }
  m->layers[m->n_layers - 1].consumers++; /* the loss */
  for (uint32_t i = 0; i < m->n_layers; i++) {
    const gs_layer *l = &m->layers[i];
    if (l->consumers) continue;
    char f[32];
    snprintf(f, sizeof f, "model.layer[%u]", i);
    gs_err_set(e, GS_INVALID_ARGUMENT, f,
               "layer %s (layer[%u]): its output is taken by no layer: name it in the inputs "
               "of a later layer, or remove it (only the last layer's output goes to the loss)",
               l->name, i);
    goto fail;
  }
  const gs_layer *last = &m->layers[m->n_layers - 1];
  if (last->kind != GS_LAYER_DENSE) {
    gs_err_set(e, GS_INVALID_ARGUMENT, "model.layer",
               "the last layer %s (layer[%u]) is a %s: the model must end with a dense layer "
               "whose units are the classes (its outputs are the logits)",
               last->name, last->index, gs_layer_kind_name(last->kind));
    goto fail;
  }
  if (last->units < 2) {
    gs_err_set(e, GS_INVALID_ARGUMENT, "model.layer",
               "the last layer %s (layer[%u]) has %u unit: a classifier needs at least 2 "
               "classes",
               last->name, last->index, last->units);
    goto fail;
  }
  m->classes = last->units;
  m->positions = last->out.rank == 2 ? last->out.w : 1;
  if (m->tokens && last->out.rank != 2) {
    gs_err_set(e, GS_INVALID_ARGUMENT, "model.layer",
               "the last layer %s (layer[%u]) gives %u outputs per example, but a model of "
               "tokens is trained on the next token at every position: end it with a dense "
               "over the sequence (vocab_size units), without a flatten before it",
               last->name, last->index, last->units);
    goto fail;
  }
  return 0;
fail:
  gs_model_free(m);
  return -EINVAL;
}

void gs_model_free(gs_model *m) {
  if (!m) return;
  free(m->layers);
  m->layers = NULL;
  m->n_layers = 0;
}

int gs_model_check_dataset(const gs_model *m, const char *which, uint32_t h, uint32_t w,
                           uint32_t c, uint32_t classes, gs_err *e) {
  if (m->tokens)
    return gs_err_set(e, GS_INVALID_ARGUMENT, which,
                      "the %s dataset holds images of %ux%ux%u, but the model takes token ids "
                      "(model.input.sequence_length %u): give it a text or tokens dataset",
                      which, h, w, c, m->input.w),
           -EINVAL;
  if (h != m->input.h || w != m->input.w || c != m->input.c)
    return gs_err_set(e, GS_INVALID_ARGUMENT, "model.input",
                      "the %s dataset's examples are %ux%ux%u but the model's input is %ux%ux%u",
                      which, h, w, c, m->input.h, m->input.w, m->input.c),
           -EINVAL;
  if (classes != m->classes) {
    const gs_layer *last = &m->layers[m->n_layers - 1];
    char f[96];
    snprintf(f, sizeof f, "model.layer[%u].dense.units", last->index);
    return gs_err_set(e, GS_INVALID_ARGUMENT, f,
                      "layer %s (layer[%u]) has %u units but the %s dataset has %u classes: "
                      "the last dense layer's units must equal the classes",
                      last->name, last->index, last->units, which, classes),
           -EINVAL;
  }
  return 0;
}

int gs_model_check_tokens(const gs_model *m, const char *which, uint32_t seq_len,
                          uint32_t vocab, gs_err *e) {
  char f[96];
  if (!m->tokens)
    return gs_err_set(e, GS_INVALID_ARGUMENT, which,
                      "the %s dataset holds token sequences (sequence_length %u, vocabulary %u), "
                      "but the model takes images (model.input): a token dataset needs a model "
                      "whose input is token ids (model.input { sequence_length })",
                      which, seq_len, vocab),
           -EINVAL;
  if (seq_len != m->input.w) {
    snprintf(f, sizeof f, "%s.sequence_length", which);
    return gs_err_set(e, GS_INVALID_ARGUMENT, f,
                      "the %s dataset is cut into sequences of %u tokens but the model's input "
                      "is %u (model.input.sequence_length): leave %s.sequence_length unset, or "
                      "make them equal",
                      which, seq_len, m->input.w, which),
           -EINVAL;
  }
  for (uint32_t i = 0; i < m->n_layers; i++) {
    const gs_layer *l = &m->layers[i];
    if (l->kind != GS_LAYER_EMBEDDING || l->vocab >= vocab) continue;
    snprintf(f, sizeof f, "model.layer[%u].embedding.vocab_size", i);
    return gs_err_set(e, GS_INVALID_ARGUMENT, f,
                      "layer %s (layer[%u]) has vocab_size %u but the %s dataset's ids go up to "
                      "%u: vocab_size must be at least the dataset's vocabulary",
                      l->name, i, l->vocab, which, vocab - 1),
           -EINVAL;
  }
  if (m->classes != vocab) {
    const gs_layer *last = &m->layers[m->n_layers - 1];
    snprintf(f, sizeof f, "model.layer[%u].dense.units", last->index);
    return gs_err_set(e, GS_INVALID_ARGUMENT, f,
                      "layer %s (layer[%u]) has %u units but the %s dataset's vocabulary is %u: "
                      "the last dense layer predicts the next token, one unit per token id",
                      last->name, last->index, last->units, which, vocab),
           -EINVAL;
  }
  return 0;
}

gs_conv_shape gs_model_conv_shape(const gs_layer *l, uint32_t n) {
  gs_conv_shape s = {.n = n, .h = l->in.h, .w = l->in.w, .c = l->in.c, .kh = l->kh,
                     .kw = l->kw, .stride = l->stride, .same = l->same,
                     .f = l->kind == GS_LAYER_CONV2D ? l->units : l->in.c};
  gs_conv_shape_init(&s);
  return s;
}
