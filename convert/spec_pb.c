/*
 * spec_pb.c: protobuf <-> the runtime's plain structs (spec_pb.h).
 *
 * Inbound, a JobSpec is copied field by field into a gs_job_spec. Nothing
 * is judged here: the runtime's validator (model.c) owns every rule and
 * every message, so a bad value is reported the same way whether the spec
 * came over the wire or was built in C. What cannot be represented as a
 * known value (an enum number from a newer client, a Layer with no kind)
 * is carried through as such for the validator to name.
 *
 * Outbound, a plan, an OOM report or a timeline becomes its message, with
 * every optional field present (a zero is a measured zero). Each message is
 * malloc'd whole so the generated free_unpacked releases it.
 */
#include "convert/spec_pb.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------- enums --- */

gs_precision gs_spec_pb_precision(Gpushare__V1__Precision p) {
  switch (p) {
  case GPUSHARE__V1__PRECISION__FLOAT32: return GS_PRECISION_FLOAT32;
  case GPUSHARE__V1__PRECISION__MIXED_FLOAT16: return GS_PRECISION_MIXED_FLOAT16;
  case GPUSHARE__V1__PRECISION__MIXED_BFLOAT16: return GS_PRECISION_MIXED_BFLOAT16;
  default: return (gs_precision)p; /* unknown: the validator names the number */
  }
}

Gpushare__V1__Precision gs_spec_pb_precision_to_pb(gs_precision p) {
  switch (p) {
  case GS_PRECISION_MIXED_FLOAT16: return GPUSHARE__V1__PRECISION__MIXED_FLOAT16;
  case GS_PRECISION_MIXED_BFLOAT16: return GPUSHARE__V1__PRECISION__MIXED_BFLOAT16;
  case GS_PRECISION_FLOAT32: return GPUSHARE__V1__PRECISION__FLOAT32;
  default: return (Gpushare__V1__Precision)p;
  }
}

static gs_activation activation(Gpushare__V1__Activation a) {
  switch (a) {
  case GPUSHARE__V1__ACTIVATION__NONE: return GS_ACTIVATION_NONE;
  case GPUSHARE__V1__ACTIVATION__RELU: return GS_ACTIVATION_RELU;
  default: return (gs_activation)a;
  }
}

static gs_padding padding(Gpushare__V1__Padding p) {
  switch (p) {
  case GPUSHARE__V1__PADDING__SAME: return GS_PADDING_SAME;
  case GPUSHARE__V1__PADDING__VALID: return GS_PADDING_VALID;
  default: return (gs_padding)p;
  }
}

static gs_lr_schedule schedule(Gpushare__V1__LearningRateSchedule__Kind k) {
  switch (k) {
  case GPUSHARE__V1__LEARNING_RATE_SCHEDULE__KIND__CONSTANT: return GS_LR_CONSTANT;
  case GPUSHARE__V1__LEARNING_RATE_SCHEDULE__KIND__COSINE: return GS_LR_COSINE;
  default: return (gs_lr_schedule)k;
  }
}

static Gpushare__V1__OomCause cause_to_pb(gs_oom_cause c) {
  switch (c) {
  case GS_OOM_PHYSICAL: return GPUSHARE__V1__OOM_CAUSE__PHYSICAL;
  case GS_OOM_FRAGMENTATION: return GPUSHARE__V1__OOM_CAUSE__FRAGMENTATION;
  default: return GPUSHARE__V1__OOM_CAUSE__QUOTA;
  }
}

/* ---------------------------------------------------------- JobSpec in --- */

static void layer_in(const Gpushare__V1__Layer *pl, gs_spec_layer *l) {
  gs_spec_layer_init(l, GS_LAYER_KIND_COUNT);
  l->name = pl->name;
  l->inputs = (const char *const *)pl->inputs;
  l->n_inputs = pl->n_inputs;
  switch (pl->kind_case) {
  case GPUSHARE__V1__LAYER__KIND_DENSE: {
    static const Gpushare__V1__Dense none = GPUSHARE__V1__DENSE__INIT;
    const Gpushare__V1__Dense *d = pl->dense ? pl->dense : &none;
    l->kind = GS_LAYER_DENSE;
    l->units = d->units;
    l->activation = activation(d->activation);
    break;
  }
  case GPUSHARE__V1__LAYER__KIND_CONV2D: {
    static const Gpushare__V1__Conv2D none = GPUSHARE__V1__CONV2_D__INIT;
    const Gpushare__V1__Conv2D *d = pl->conv2d ? pl->conv2d : &none;
    l->kind = GS_LAYER_CONV2D;
    l->filters = d->filters;
    l->kernel_size = d->kernel_size;
    l->stride = d->stride;
    l->padding = padding(d->padding);
    l->activation = activation(d->activation);
    break;
  }
  case GPUSHARE__V1__LAYER__KIND_DEPTHWISE_CONV2D: {
    static const Gpushare__V1__DepthwiseConv2D none = GPUSHARE__V1__DEPTHWISE_CONV2_D__INIT;
    const Gpushare__V1__DepthwiseConv2D *d = pl->depthwise_conv2d ? pl->depthwise_conv2d : &none;
    l->kind = GS_LAYER_DEPTHWISE_CONV2D;
    l->kernel_size = d->kernel_size;
    l->stride = d->stride;
    l->padding = padding(d->padding);
    l->activation = activation(d->activation);
    break;
  }
  case GPUSHARE__V1__LAYER__KIND_MAX_POOL2D: {
    static const Gpushare__V1__MaxPool2D none = GPUSHARE__V1__MAX_POOL2_D__INIT;
    const Gpushare__V1__MaxPool2D *d = pl->max_pool2d ? pl->max_pool2d : &none;
    l->kind = GS_LAYER_MAX_POOL2D;
    l->pool_size = d->pool_size;
    l->has_stride = d->has_stride;
    l->stride = d->stride;
    break;
  }
  case GPUSHARE__V1__LAYER__KIND_GLOBAL_AVERAGE_POOLING2D:
    l->kind = GS_LAYER_GLOBAL_AVERAGE_POOLING2D;
    break;
  case GPUSHARE__V1__LAYER__KIND_FLATTEN: l->kind = GS_LAYER_FLATTEN; break;
  case GPUSHARE__V1__LAYER__KIND_RELU: l->kind = GS_LAYER_RELU; break;
  case GPUSHARE__V1__LAYER__KIND_ADD:
    l->kind = GS_LAYER_ADD;
    l->activation = pl->add ? activation(pl->add->activation) : GS_ACTIVATION_NONE;
    break;
  case GPUSHARE__V1__LAYER__KIND_CONCAT: l->kind = GS_LAYER_CONCAT; break;
  case GPUSHARE__V1__LAYER__KIND_BATCH_NORM: {
    static const Gpushare__V1__BatchNorm none = GPUSHARE__V1__BATCH_NORM__INIT;
    const Gpushare__V1__BatchNorm *d = pl->batch_norm ? pl->batch_norm : &none;
    l->kind = GS_LAYER_BATCH_NORM;
    l->momentum = d->momentum;
    l->epsilon = d->epsilon;
    break;
  }
  case GPUSHARE__V1__LAYER__KIND_LAYER_NORM: {
    static const Gpushare__V1__LayerNorm none = GPUSHARE__V1__LAYER_NORM__INIT;
    const Gpushare__V1__LayerNorm *d = pl->layer_norm ? pl->layer_norm : &none;
    l->kind = GS_LAYER_LAYER_NORM;
    l->epsilon = d->epsilon;
    break;
  }
  case GPUSHARE__V1__LAYER__KIND_DROPOUT:
    l->kind = GS_LAYER_DROPOUT;
    l->rate = pl->dropout ? pl->dropout->rate : 0.0f;
    break;
  case GPUSHARE__V1__LAYER__KIND_AVERAGE_POOL2D: {
    static const Gpushare__V1__AveragePool2D none = GPUSHARE__V1__AVERAGE_POOL2_D__INIT;
    const Gpushare__V1__AveragePool2D *d = pl->average_pool2d ? pl->average_pool2d : &none;
    l->kind = GS_LAYER_AVERAGE_POOL2D;
    l->pool_size = d->pool_size;
    l->has_stride = d->has_stride;
    l->stride = d->stride;
    break;
  }
  case GPUSHARE__V1__LAYER__KIND_GELU: l->kind = GS_LAYER_GELU; break;
  case GPUSHARE__V1__LAYER__KIND_EMBEDDING:
    l->kind = GS_LAYER_EMBEDDING;
    l->vocab_size = pl->embedding ? pl->embedding->vocab_size : 0;
    l->dim = pl->embedding ? pl->embedding->dim : 0;
    break;
  case GPUSHARE__V1__LAYER__KIND_POSITION_EMBEDDING: l->kind = GS_LAYER_POSITION_EMBEDDING; break;
  case GPUSHARE__V1__LAYER__KIND_CAUSAL_SELF_ATTENTION:
    l->kind = GS_LAYER_CAUSAL_SELF_ATTENTION;
    l->heads = pl->causal_self_attention ? pl->causal_self_attention->heads : 0;
    l->head_size = pl->causal_self_attention ? pl->causal_self_attention->head_size : 0;
    break;
  default: break; /* no kind: GS_LAYER_KIND_COUNT, which the validator names */
  }
}

static void dataset_in(const Gpushare__V1__Dataset *d, gs_spec_dataset *out) {
  if (!d) return;
  switch (d->source_case) {
  case GPUSHARE__V1__DATASET__SOURCE_IDX:
    out->source = GS_DATASET_IDX;
    if (d->idx) {
      out->images = d->idx->images;
      out->labels = d->idx->labels;
    }
    break;
  case GPUSHARE__V1__DATASET__SOURCE_NAME:
    out->source = GS_DATASET_NAME;
    out->name = d->name;
    break;
  case GPUSHARE__V1__DATASET__SOURCE_SYNTHETIC:
    out->source = GS_DATASET_SYNTHETIC;
    if (d->synthetic) {
      out->examples = d->synthetic->examples;
      out->seed = d->synthetic->seed;
      out->classes = d->synthetic->classes;
    }
    break;
  case GPUSHARE__V1__DATASET__SOURCE_NPY:
    out->source = GS_DATASET_NPY;
    if (d->npy) {
      out->images = d->npy->images;
      out->labels = d->npy->labels;
    }
    break;
  case GPUSHARE__V1__DATASET__SOURCE_TEXT:
    out->source = GS_DATASET_TEXT;
    if (d->text) {
      out->path = d->text->path;
      out->examples = d->text->examples;
    }
    break;
  case GPUSHARE__V1__DATASET__SOURCE_TOKENS:
    out->source = GS_DATASET_TOKENS;
    if (d->tokens) {
      out->path = d->tokens->path;
      out->vocab_size = d->tokens->vocab_size;
      out->examples = d->tokens->examples;
    }
    break;
  default: break;
  }
  out->sequence_length = d->sequence_length;
}

static void optimizer_in(const Gpushare__V1__Optimizer *o, gs_spec_optimizer *out) {
  switch (o->kind_case) {
  case GPUSHARE__V1__OPTIMIZER__KIND__NOT_SET: out->kind = GS_OPTIMIZER_NONE; break;
  case GPUSHARE__V1__OPTIMIZER__KIND_SGD: out->kind = GS_OPTIMIZER_SGD; break;
  case GPUSHARE__V1__OPTIMIZER__KIND_ADAM: out->kind = GS_OPTIMIZER_ADAM; break;
  default: out->kind = (gs_optimizer_kind)o->kind_case; break;
  }
  if (o->kind_case == GPUSHARE__V1__OPTIMIZER__KIND_SGD && o->sgd) {
    out->sgd.learning_rate = o->sgd->learning_rate;
    out->sgd.momentum = o->sgd->momentum;
    out->sgd.nesterov = o->sgd->nesterov;
    out->sgd.weight_decay = o->sgd->weight_decay;
  }
  if (o->kind_case == GPUSHARE__V1__OPTIMIZER__KIND_ADAM && o->adam) {
    out->adam.learning_rate = o->adam->learning_rate;
    out->adam.beta1 = o->adam->beta1;
    out->adam.beta2 = o->adam->beta2;
    out->adam.epsilon = o->adam->epsilon;
    out->adam.weight_decay = o->adam->weight_decay;
    out->adam.decoupled = o->adam->decoupled;
  }
  if (o->schedule) {
    out->has_schedule = true;
    out->schedule.kind = schedule(o->schedule->kind);
    out->schedule.warmup_steps = o->schedule->warmup_steps;
    out->schedule.final_fraction = o->schedule->final_fraction;
  }
}

int gs_spec_pb_job(const Gpushare__V1__JobSpec *pb, gs_job_spec *out, gs_err *e) {
  gs_job_spec_init(out);
  if (!pb) return gs_err_set(e, GS_INVALID_ARGUMENT, "", "the job has no spec"), -EINVAL;
  out->name = pb->name;
  if (pb->model) {
    const Gpushare__V1__Model *m = pb->model;
    out->has_model = true;
    if (m->input) {
      out->has_input = true;
      out->input.height = m->input->height;
      out->input.width = m->input->width;
      out->input.channels = m->input->channels;
      out->input.sequence_length = m->input->sequence_length;
    }
    if (m->n_layer) {
      gs_spec_layer *ls = calloc(m->n_layer, sizeof *ls);
      if (!ls)
        return gs_err_set(e, GS_INTERNAL, "model.layer", "out of host memory for %zu layers",
                          m->n_layer),
               -ENOMEM;
      for (size_t i = 0; i < m->n_layer; i++) layer_in(m->layer[i], &ls[i]);
      out->layers = ls;
      out->n_layers = m->n_layer;
    }
  }
  dataset_in(pb->train, &out->train);
  dataset_in(pb->test, &out->test);
  /* A text or token set is cut into the model's sequences unless it says
   * otherwise (and then the runtime checks that the two agree). */
  for (int k = 0; k < 2; k++) {
    gs_spec_dataset *ds = k ? &out->test : &out->train;
    if ((ds->source == GS_DATASET_TEXT || ds->source == GS_DATASET_TOKENS) &&
        !ds->sequence_length && out->has_input)
      ds->sequence_length = out->input.sequence_length;
  }
  out->batch_size = pb->batch_size;
  out->accumulation_steps = pb->accumulation_steps;
  out->epochs = pb->epochs;
  out->max_steps = pb->max_steps;
  out->seed = pb->seed;
  out->precision = gs_spec_pb_precision(pb->precision);
  if (pb->loss_scale) {
    out->has_loss_scale = true;
    out->loss_scale_initial = pb->loss_scale->initial;
    out->loss_scale_growth_interval = pb->loss_scale->growth_interval;
  }
  if (pb->optimizer) {
    out->has_optimizer = true;
    optimizer_in(pb->optimizer, &out->optimizer);
  }
  out->auto_fit = pb->has_auto_fit && pb->auto_fit;
  out->checkpoint_every_steps = pb->checkpoint_every_steps;
  return 0;
}

void gs_spec_pb_job_free(gs_job_spec *s) {
  if (!s) return;
  free((void *)s->layers);
  s->layers = NULL;
  s->n_layers = 0;
}

/* ------------------------------------------------------------ plan out --- */

static Gpushare__V1__PlanRow *row_msg(const char *layer, const char *kind, const char *shape,
                                      uint64_t parameters, const uint64_t *bytes) {
  Gpushare__V1__PlanRow *r = malloc(sizeof *r);
  if (!r) return NULL;
  gpushare__v1__plan_row__init(r);
  r->layer = strdup(layer);
  r->kind = strdup(kind);
  r->output_shape = strdup(shape);
  r->has_parameters = r->has_weights_bytes = r->has_master_bytes = true;
  r->has_gradient_bytes = r->has_optimizer_bytes = r->has_activation_bytes = true;
  r->has_workspace_bytes = r->has_batch_bytes = true;
  r->parameters = parameters;
  r->weights_bytes = bytes[GS_ROLE_WEIGHTS];
  r->master_bytes = bytes[GS_ROLE_MASTER];
  r->gradient_bytes = bytes[GS_ROLE_GRADIENTS];
  r->optimizer_bytes = bytes[GS_ROLE_OPTIMIZER];
  r->activation_bytes = bytes[GS_ROLE_ACTIVATIONS];
  r->workspace_bytes = bytes[GS_ROLE_WORKSPACE];
  r->batch_bytes = bytes[GS_ROLE_BATCH];
  if (!r->layer || !r->kind || !r->output_shape) {
    gpushare__v1__plan_row__free_unpacked(r, NULL);
    return NULL;
  }
  return r;
}

int gs_spec_pb_plan(const gs_plan *p, uint64_t limit, gs_alloc_policy policy,
                    Gpushare__V1__Plan **out) {
  *out = NULL;
  Gpushare__V1__Plan *m = malloc(sizeof *m);
  if (!m) return -ENOMEM;
  gpushare__v1__plan__init(m);
  m->row = calloc(p->n_rows ? p->n_rows : 1, sizeof *m->row);
  if (!m->row) goto fail;
  for (size_t i = 0; i < p->n_rows; i++) {
    const gs_plan_row *r = &p->rows[i];
    if (!(m->row[i] = row_msg(r->layer, r->kind, r->output_shape, r->parameters, r->bytes)) ||
        (r->keeps[0] && !(m->row[i]->keeps = strdup(r->keeps))))
      goto fail;
    m->n_row++;
  }
  m->has_peak_bytes = m->has_parameters = m->has_micro_batch = true;
  m->has_accumulation_steps = m->has_precision = m->has_limit_bytes = m->has_fits = true;
  m->peak_bytes = p->peak_bytes;
  m->parameters = p->parameters;
  m->micro_batch = p->micro_batch;
  m->accumulation_steps = p->accumulation_steps;
  m->precision = gs_spec_pb_precision_to_pb(p->precision);
  m->limit_bytes = limit;
  m->fits = gs_plan_fits(p, limit, policy);
  if (limit) {
    m->has_fits_growth = m->has_fits_preallocate = true;
    m->fits_growth = gs_plan_fits(p, limit, GS_POLICY_GROWTH);
    m->fits_preallocate = gs_plan_fits(p, limit, GS_POLICY_PREALLOCATE);
  }
  *out = m;
  return 0;
fail:
  gpushare__v1__plan__free_unpacked(m, NULL);
  return -ENOMEM;
}

/* ------------------------------------------------------ OOM report out --- */

int gs_spec_pb_oom_report(const gs_oom_report *x, Gpushare__V1__OomReport **out) {
  *out = NULL;
  Gpushare__V1__OomReport *r = malloc(sizeof *r);
  if (!r) return -ENOMEM;
  gpushare__v1__oom_report__init(r);
  r->layer = strdup(x->layer);
  r->role = strdup(x->role);
  r->shape = strdup(x->shape);
  r->dtype = strdup(x->dtype);
  r->vdev = strdup(x->vdev);
  r->explanation = strdup(x->explanation);
  if (!r->layer || !r->role || !r->shape || !r->dtype || !r->vdev || !r->explanation) goto fail;
  r->has_bytes = r->has_limit_bytes = r->has_in_use_bytes = r->has_reserved_bytes = true;
  r->has_largest_free_bytes = r->has_fragmentation = r->has_cause = true;
  r->bytes = x->bytes;
  r->limit_bytes = x->limit_bytes;
  r->in_use_bytes = x->in_use_bytes;
  r->reserved_bytes = x->reserved_bytes;
  r->largest_free_bytes = x->largest_free_bytes;
  r->fragmentation = (float)x->fragmentation;
  r->cause = cause_to_pb(x->cause);
  if (x->n_suggestions) {
    r->suggestion = calloc(x->n_suggestions, sizeof *r->suggestion);
    if (!r->suggestion) goto fail;
    for (size_t i = 0; i < x->n_suggestions; i++) {
      const gs_plan_suggestion *sg = &x->suggestions[i];
      Gpushare__V1__OomSuggestion *s = malloc(sizeof *s);
      if (!s) goto fail;
      gpushare__v1__oom_suggestion__init(s);
      r->suggestion[r->n_suggestion++] = s;
      if (!(s->what = strdup(sg->what))) goto fail;
      s->has_micro_batch = s->has_accumulation_steps = s->has_precision = true;
      s->has_predicted_peak_bytes = s->has_saving_bytes = true;
      s->micro_batch = sg->micro_batch;
      s->accumulation_steps = sg->accumulation_steps;
      s->precision = gs_spec_pb_precision_to_pb(sg->precision);
      s->predicted_peak_bytes = sg->predicted_peak_bytes;
      s->saving_bytes = sg->saving_bytes;
    }
  }
  *out = r;
  return 0;
fail:
  gpushare__v1__oom_report__free_unpacked(r, NULL);
  return -ENOMEM;
}

/* -------------------------------------------------------- timeline out --- */

int gs_spec_pb_timeline(const gs_timeline *tl, Gpushare__V1__MemoryTimeline **out) {
  *out = NULL;
  Gpushare__V1__MemoryTimeline *m = malloc(sizeof *m);
  if (!m) return -ENOMEM;
  gpushare__v1__memory_timeline__init(m);
  if (tl->n_steps) {
    m->step = calloc(tl->n_steps, sizeof *m->step);
    if (!m->step) goto fail;
    for (size_t i = 0; i < tl->n_steps; i++) {
      Gpushare__V1__MemoryStep *ms = malloc(sizeof *ms);
      if (!ms) goto fail;
      gpushare__v1__memory_step__init(ms);
      ms->has_step = ms->has_peak_in_use_bytes = true;
      ms->step = tl->steps[i].step;
      ms->peak_in_use_bytes = tl->steps[i].peak_in_use_bytes;
      m->step[m->n_step++] = ms;
    }
  }
  m->at_peak = calloc(tl->n_at_peak ? tl->n_at_peak : 1, sizeof *m->at_peak);
  if (!m->at_peak) goto fail;
  for (size_t i = 0; i < tl->n_at_peak; i++) {
    const gs_timeline_row *r = &tl->at_peak[i];
    if (!(m->at_peak[i] = row_msg(r->layer, r->kind, r->output_shape, r->parameters, r->bytes)))
      goto fail;
    m->n_at_peak++;
  }
  m->has_peak_bytes = true;
  m->peak_bytes = tl->peak_bytes;
  if (tl->planned_peak_bytes) {
    m->has_planned_peak_bytes = true;
    m->planned_peak_bytes = tl->planned_peak_bytes;
  }
  *out = m;
  return 0;
fail:
  gpushare__v1__memory_timeline__free_unpacked(m, NULL);
  return -ENOMEM;
}
