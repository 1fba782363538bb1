/*
 * test_spec_pb.c: the protobuf edge of the runtime (convert/spec_pb.c) and
 * the text made from its messages (present/).
 *
 * Inbound: every field of a JobSpec the runtime reads arrives in the
 * gs_job_spec, defaults included, and a bad value still fails
 * gs_model_build with the JobSpec's field path. Outbound: a plan, an OOM
 * report and a timeline keep their numbers as messages, and the formatters
 * write them as people read them.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "present/present.h"
#include "runtime/model.h"
#include "runtime/oom.h"
#include "runtime/plan.h"
#include "convert/spec_pb.h"

static gs_err e;

static void setup(void) { gs_err_clear(&e); }

TestSuite(spec_pb, .init = setup);

/* A JobSpec with every field the runtime reads set to a value that is not
 * its default. The sub-messages live in one static struct. */
typedef struct full {
  Gpushare__V1__JobSpec spec;
  Gpushare__V1__Model model;
  Gpushare__V1__InputShape input;
  Gpushare__V1__Layer layer[5], *lp[5];
  Gpushare__V1__Conv2D conv;
  Gpushare__V1__DepthwiseConv2D dw;
  Gpushare__V1__MaxPool2D pool;
  Gpushare__V1__Flatten flatten;
  Gpushare__V1__Dense dense;
  Gpushare__V1__Dataset train, test;
  Gpushare__V1__IdxFiles idx;
  Gpushare__V1__SyntheticDataset syn;
  Gpushare__V1__LossScale ls;
  Gpushare__V1__Optimizer opt;
  Gpushare__V1__Sgd sgd;
  Gpushare__V1__LearningRateSchedule sched;
} full;

static void full_init(full *f) {
  memset(f, 0, sizeof *f);
  f->spec = (Gpushare__V1__JobSpec)GPUSHARE__V1__JOB_SPEC__INIT;
  f->model = (Gpushare__V1__Model)GPUSHARE__V1__MODEL__INIT;
  f->input = (Gpushare__V1__InputShape)GPUSHARE__V1__INPUT_SHAPE__INIT;
  f->conv = (Gpushare__V1__Conv2D)GPUSHARE__V1__CONV2_D__INIT;
  f->dw = (Gpushare__V1__DepthwiseConv2D)GPUSHARE__V1__DEPTHWISE_CONV2_D__INIT;
  f->pool = (Gpushare__V1__MaxPool2D)GPUSHARE__V1__MAX_POOL2_D__INIT;
  f->flatten = (Gpushare__V1__Flatten)GPUSHARE__V1__FLATTEN__INIT;
  f->dense = (Gpushare__V1__Dense)GPUSHARE__V1__DENSE__INIT;
  f->train = (Gpushare__V1__Dataset)GPUSHARE__V1__DATASET__INIT;
  f->test = (Gpushare__V1__Dataset)GPUSHARE__V1__DATASET__INIT;
  f->idx = (Gpushare__V1__IdxFiles)GPUSHARE__V1__IDX_FILES__INIT;
  f->syn = (Gpushare__V1__SyntheticDataset)GPUSHARE__V1__SYNTHETIC_DATASET__INIT;
  f->ls = (Gpushare__V1__LossScale)GPUSHARE__V1__LOSS_SCALE__INIT;
  f->opt = (Gpushare__V1__Optimizer)GPUSHARE__V1__OPTIMIZER__INIT;
  f->sgd = (Gpushare__V1__Sgd)GPUSHARE__V1__SGD__INIT;
  f->sched = (Gpushare__V1__LearningRateSchedule)GPUSHARE__V1__LEARNING_RATE_SCHEDULE__INIT;
  for (int i = 0; i < 5; i++) {
    f->layer[i] = (Gpushare__V1__Layer)GPUSHARE__V1__LAYER__INIT;
    f->lp[i] = &f->layer[i];
  }
  f->spec.name = "everything";
  f->input.height = 12;
  f->input.width = 10;
  f->input.channels = 3;
  f->model.input = &f->input;
  f->model.layer = f->lp;
  f->model.n_layer = 5;
  f->spec.model = &f->model;
  f->conv.filters = 4;
  f->conv.kernel_size = 3;
  f->conv.stride = 2;
  f->conv.padding = GPUSHARE__V1__PADDING__VALID;
  f->conv.activation = GPUSHARE__V1__ACTIVATION__RELU;
  f->layer[0].name = "stem";
  f->layer[0].kind_case = GPUSHARE__V1__LAYER__KIND_CONV2D;
  f->layer[0].conv2d = &f->conv;
  f->dw.kernel_size = 3;
  f->dw.padding = GPUSHARE__V1__PADDING__SAME;
  f->layer[1].kind_case = GPUSHARE__V1__LAYER__KIND_DEPTHWISE_CONV2D;
  f->layer[1].depthwise_conv2d = &f->dw;
  f->pool.pool_size = 2;
  f->pool.has_stride = true;
  f->pool.stride = 1;
  f->layer[2].kind_case = GPUSHARE__V1__LAYER__KIND_MAX_POOL2D;
  f->layer[2].max_pool2d = &f->pool;
  f->layer[3].kind_case = GPUSHARE__V1__LAYER__KIND_FLATTEN;
  f->layer[3].flatten = &f->flatten;
  f->dense.units = 7;
  f->layer[4].kind_case = GPUSHARE__V1__LAYER__KIND_DENSE;
  f->layer[4].dense = &f->dense;
  f->idx.images = "train-images.gz";
  f->idx.labels = "train-labels.gz";
  f->train.source_case = GPUSHARE__V1__DATASET__SOURCE_IDX;
  f->train.idx = &f->idx;
  f->spec.train = &f->train;
  f->syn.examples = 100;
  f->syn.seed = 9;
  f->syn.classes = 7;
  f->test.source_case = GPUSHARE__V1__DATASET__SOURCE_SYNTHETIC;
  f->test.synthetic = &f->syn;
  f->spec.test = &f->test;
  f->spec.batch_size = 16;
  f->spec.accumulation_steps = 3;
  f->spec.epochs = 4;
  f->spec.max_steps = 55;
  f->spec.seed = 1234;
  f->spec.precision = GPUSHARE__V1__PRECISION__MIXED_FLOAT16;
  f->ls.initial = 1024.0f;
  f->ls.growth_interval = 77;
  f->spec.loss_scale = &f->ls;
  f->sgd.learning_rate = 0.5f;
  f->sgd.momentum = 0.8f;
  f->sgd.nesterov = true;
  f->sgd.weight_decay = 0.01f;
  f->opt.kind_case = GPUSHARE__V1__OPTIMIZER__KIND_SGD;
  f->opt.sgd = &f->sgd;
  f->sched.kind = GPUSHARE__V1__LEARNING_RATE_SCHEDULE__KIND__COSINE;
  f->sched.warmup_steps = 5;
  f->sched.final_fraction = 0.25f;
  f->opt.schedule = &f->sched;
  f->spec.optimizer = &f->opt;
  f->spec.has_auto_fit = true;
  f->spec.auto_fit = true;
  f->spec.checkpoint_every_steps = 11;
}

Test(spec_pb, every_field_of_a_jobspec_arrives) {
  static full f;
  full_init(&f);
  gs_job_spec s;
  cr_assert_eq(gs_spec_pb_job(&f.spec, &s, &e), 0, "%s", e.msg);
  cr_expect_str_eq(s.name, "everything");
  cr_expect(s.has_model && s.has_input);
  cr_expect_eq(s.input.height, 12);
  cr_expect_eq(s.input.width, 10);
  cr_expect_eq(s.input.channels, 3);
  cr_assert_eq(s.n_layers, 5);
  const gs_spec_layer *l = s.layers;
  cr_expect_str_eq(l[0].name, "stem");
  cr_expect_eq(l[0].kind, GS_LAYER_CONV2D);
  cr_expect_eq(l[0].filters, 4);
  cr_expect_eq(l[0].kernel_size, 3);
  cr_expect_eq(l[0].stride, 2);
  cr_expect_eq(l[0].padding, GS_PADDING_VALID);
  cr_expect_eq(l[0].activation, GS_ACTIVATION_RELU);
  cr_expect_eq(l[1].kind, GS_LAYER_DEPTHWISE_CONV2D);
  cr_expect_eq(l[1].kernel_size, 3);
  cr_expect_eq(l[1].stride, 1, "the proto default");
  cr_expect_eq(l[1].padding, GS_PADDING_SAME);
  cr_expect_eq(l[1].activation, GS_ACTIVATION_NONE);
  cr_expect_eq(l[2].kind, GS_LAYER_MAX_POOL2D);
  cr_expect_eq(l[2].pool_size, 2);
  cr_expect(l[2].has_stride);
  cr_expect_eq(l[2].stride, 1);
  cr_expect_eq(l[3].kind, GS_LAYER_FLATTEN);
  cr_expect_eq(l[4].kind, GS_LAYER_DENSE);
  cr_expect_eq(l[4].units, 7);
  cr_expect_eq(s.train.source, GS_DATASET_IDX);
  cr_expect_str_eq(s.train.images, "train-images.gz");
  cr_expect_str_eq(s.train.labels, "train-labels.gz");
  cr_expect_eq(s.test.source, GS_DATASET_SYNTHETIC);
  cr_expect_eq(s.test.examples, 100);
  cr_expect_eq(s.test.seed, 9);
  cr_expect_eq(s.test.classes, 7);
  cr_expect_eq(s.batch_size, 16);
  cr_expect_eq(s.accumulation_steps, 3);
  cr_expect_eq(s.epochs, 4);
  cr_expect_eq(s.max_steps, 55);
  cr_expect_eq(s.seed, 1234);
  cr_expect_eq(s.precision, GS_PRECISION_MIXED_FLOAT16);
  cr_expect(s.has_loss_scale);
  cr_expect_float_eq(s.loss_scale_initial, 1024.0f, 0);
  cr_expect_eq(s.loss_scale_growth_interval, 77);
  cr_expect(s.has_optimizer);
  cr_expect_eq(s.optimizer.kind, GS_OPTIMIZER_SGD);
  cr_expect_float_eq(s.optimizer.sgd.learning_rate, 0.5f, 0);
  cr_expect_float_eq(s.optimizer.sgd.momentum, 0.8f, 0);
  cr_expect(s.optimizer.sgd.nesterov);
  cr_expect_float_eq(s.optimizer.sgd.weight_decay, 0.01f, 0);
  cr_expect(s.optimizer.has_schedule);
  cr_expect_eq(s.optimizer.schedule.kind, GS_LR_COSINE);
  cr_expect_eq(s.optimizer.schedule.warmup_steps, 5);
  cr_expect_float_eq(s.optimizer.schedule.final_fraction, 0.25f, 0);
  cr_expect(s.auto_fit);
  cr_expect_eq(s.checkpoint_every_steps, 11);
  /* And the runtime accepts it as the recipe it is. */
  gs_model m;
  cr_assert_eq(gs_model_build(&s, &m, &e), 0, "%s: %s", e.field, e.msg);
  cr_expect_eq(m.recipe.dtype, GS_F16);
  cr_expect(!m.recipe.adam);
  cr_expect_eq(m.recipe.lr_schedule, GS_LR_COSINE);
  cr_expect_eq(m.classes, 7);
  gs_model_free(&m);
  gs_spec_pb_job_free(&s);
}

Test(spec_pb, adam_and_defaults_arrive) {
  static full f;
  full_init(&f);
  Gpushare__V1__Adam adam = GPUSHARE__V1__ADAM__INIT;
  adam.decoupled = true;
  adam.weight_decay = 0.1f;
  f.opt.kind_case = GPUSHARE__V1__OPTIMIZER__KIND_ADAM;
  f.opt.adam = &adam;
  f.opt.schedule = NULL;
  f.spec.loss_scale = NULL;
  Gpushare__V1__JobSpec bare = GPUSHARE__V1__JOB_SPEC__INIT;
  bare.optimizer = &f.opt;
  gs_job_spec s;
  cr_assert_eq(gs_spec_pb_job(&bare, &s, &e), 0);
  cr_expect(!s.has_model && !s.has_loss_scale && !s.optimizer.has_schedule);
  cr_expect_eq(s.batch_size, 32);
  cr_expect_eq(s.accumulation_steps, 1);
  cr_expect_eq(s.epochs, 1);
  cr_expect_eq(s.optimizer.kind, GS_OPTIMIZER_ADAM);
  cr_expect_float_eq(s.optimizer.adam.learning_rate, 0.001f, 0);
  cr_expect_float_eq(s.optimizer.adam.beta1, 0.9f, 0);
  cr_expect_float_eq(s.optimizer.adam.beta2, 0.999f, 0);
  cr_expect_float_eq(s.optimizer.adam.epsilon, 1e-7f, 0);
  cr_expect_float_eq(s.optimizer.adam.weight_decay, 0.1f, 0);
  cr_expect(s.optimizer.adam.decoupled);
  cr_expect_eq(s.train.source, GS_DATASET_NONE);
  gs_spec_pb_job_free(&s);
  cr_expect_eq(gs_spec_pb_job(NULL, &s, &e), -EINVAL);
  cr_expect_eq(e.code, GS_INVALID_ARGUMENT);
}

/* A bad value converts as written and fails the build with its path. */
static void expect_field(full *f, const char *field, const char *msg_part) {
  gs_job_spec s;
  gs_model m;
  gs_err_clear(&e);
  cr_assert_eq(gs_spec_pb_job(&f->spec, &s, &e), 0, "%s", e.msg);
  cr_expect_lt(gs_model_build(&s, &m, &e), 0, "%s should fail", field);
  cr_expect_str_eq(e.field, field, "%s", e.msg);
  if (msg_part) cr_expect(strstr(e.msg, msg_part), "%s: %s", field, e.msg);
  gs_spec_pb_job_free(&s);
}

Test(spec_pb, bad_values_name_their_field_path) {
  static full f;
  full_init(&f);
  f.spec.precision = (Gpushare__V1__Precision)7;
  expect_field(&f, "precision", "precision 7");
  full_init(&f);
  f.conv.padding = (Gpushare__V1__Padding)9;
  expect_field(&f, "model.layer[0].conv2d.padding", "padding 9");
  full_init(&f);
  f.conv.activation = (Gpushare__V1__Activation)5;
  expect_field(&f, "model.layer[0].conv2d.activation", "activation 5");
  full_init(&f);
  f.layer[1].kind_case = GPUSHARE__V1__LAYER__KIND__NOT_SET;
  expect_field(&f, "model.layer[1]", "has no kind");
  full_init(&f);
  f.sched.kind = (Gpushare__V1__LearningRateSchedule__Kind)4;
  expect_field(&f, "optimizer.schedule.kind", "CONSTANT or COSINE");
  full_init(&f);
  f.ls.growth_interval = 0;
  expect_field(&f, "loss_scale.growth_interval", NULL);
  full_init(&f);
  f.sgd.momentum = 1.5f;
  expect_field(&f, "optimizer.sgd.momentum", "[0, 1)");
  full_init(&f);
  f.pool.stride = 0;
  expect_field(&f, "model.layer[2].max_pool2d.stride", "stride 0");
  full_init(&f);
  f.dense.units = 3;
  f.input.channels = 0;
  expect_field(&f, "model.input.channels", NULL);
  full_init(&f);
  f.model.input = NULL;
  expect_field(&f, "model.input", NULL);
  full_init(&f);
  f.spec.model = NULL;
  expect_field(&f, "model", "no model");
}

/* --------------------------------------------------------- outbound --- */

static gs_plan small_plan(void) {
  static full f;
  full_init(&f);
  gs_job_spec s;
  cr_assert_eq(gs_spec_pb_job(&f.spec, &s, &e), 0);
  gs_plan p;
  cr_assert_eq(gs_plan_job(&s, gs_backend_cpu(), &p, &e), 0, "%s", e.msg);
  gs_spec_pb_job_free(&s);
  return p;
}

Test(spec_pb, plan_message_and_table) {
  gs_plan p = small_plan();
  Gpushare__V1__Plan *m;
  cr_assert_eq(gs_spec_pb_plan(&p, 0, GS_POLICY_GROWTH, &m), 0);
  cr_assert_eq(m->n_row, p.n_rows);
  for (size_t i = 0; i < p.n_rows; i++) {
    cr_expect_str_eq(m->row[i]->layer, p.rows[i].layer);
    cr_expect_str_eq(m->row[i]->output_shape, p.rows[i].output_shape);
    cr_expect_eq(m->row[i]->parameters, p.rows[i].parameters);
    cr_expect_eq(m->row[i]->activation_bytes, p.rows[i].bytes[GS_ROLE_ACTIVATIONS]);
    cr_expect_eq(m->row[i]->master_bytes, p.rows[i].bytes[GS_ROLE_MASTER]);
  }
  cr_expect_eq(m->peak_bytes, p.peak_bytes);
  cr_expect_eq(m->micro_batch, 16);
  cr_expect_eq(m->accumulation_steps, 3);
  cr_expect_eq(m->precision, GPUSHARE__V1__PRECISION__MIXED_FLOAT16);
  cr_expect(m->fits && !m->has_fits_growth, "no limit: it fits");
  cr_expect_null(m->summary, "the formatter writes the summary");
  char *txt = gs_present_plan(m);
  cr_expect(strstr(txt, "stem (conv2d)") && strstr(txt, "mixed_float16") &&
                strstr(txt, "micro-batch 16 x 3 accumulation steps (effective batch 48)") &&
                !strstr(txt, "Limit"),
            "%s", txt);
  free(txt);
  gpushare__v1__plan__free_unpacked(m, NULL);
  /* Under a limit a byte short: neither policy fits. */
  cr_assert_eq(gs_spec_pb_plan(&p, p.peak_bytes - 256, GS_POLICY_PREALLOCATE, &m), 0);
  cr_expect(!m->fits && m->has_fits_growth && !m->fits_growth && !m->fits_preallocate);
  txt = gs_present_plan(m);
  cr_expect(strstr(txt, "does NOT fit by 256 B"), "%s", txt);
  free(txt);
  gpushare__v1__plan__free_unpacked(m, NULL);
  /* Exactly the peak: a preallocated vdev holds it. */
  cr_assert_eq(gs_spec_pb_plan(&p, p.peak_bytes, GS_POLICY_PREALLOCATE, &m), 0);
  cr_expect(m->fits && m->fits_preallocate);
  gpushare__v1__plan__free_unpacked(m, NULL);
  gs_plan_free(&p);
}

Test(spec_pb, oom_report_message_and_text) {
  gs_oom_report r;
  memset(&r, 0, sizeof r);
  snprintf(r.layer, sizeof r.layer, "dense_1");
  snprintf(r.role, sizeof r.role, "weights");
  snprintf(r.shape, sizeof r.shape, "(784, 256)");
  snprintf(r.dtype, sizeof r.dtype, "float32");
  snprintf(r.vdev, sizeof r.vdev, "team-a");
  snprintf(r.explanation, sizeof r.explanation, "it does not fit");
  r.bytes = 802816;
  r.limit_bytes = 1u << 20;
  r.in_use_bytes = 512u << 10;
  r.reserved_bytes = 1u << 20;
  r.largest_free_bytes = 256u << 10;
  r.fragmentation = 0.5;
  r.cause = GS_OOM_FRAGMENTATION;
  r.n_suggestions = 1;
  snprintf(r.suggestions[0].what, sizeof r.suggestions[0].what, "micro-batch 8 x 4");
  r.suggestions[0].micro_batch = 8;
  r.suggestions[0].accumulation_steps = 4;
  r.suggestions[0].precision = GS_PRECISION_MIXED_BFLOAT16;
  r.suggestions[0].predicted_peak_bytes = 900000;
  r.suggestions[0].saving_bytes = 1000;
  Gpushare__V1__OomReport *m;
  cr_assert_eq(gs_spec_pb_oom_report(&r, &m), 0);
  cr_expect_str_eq(m->layer, "dense_1");
  cr_expect_str_eq(m->vdev, "team-a");
  cr_expect_eq(m->cause, GPUSHARE__V1__OOM_CAUSE__FRAGMENTATION);
  cr_expect_eq(m->bytes, 802816);
  cr_expect_eq(m->largest_free_bytes, 256u << 10);
  cr_expect_float_eq(m->fragmentation, 0.5f, 0);
  cr_assert_eq(m->n_suggestion, 1);
  cr_expect_eq(m->suggestion[0]->precision, GPUSHARE__V1__PRECISION__MIXED_BFLOAT16);
  cr_expect_eq(m->suggestion[0]->saving_bytes, 1000);
  char *txt = gs_present_oom(m);
  cr_expect(strstr(txt, "out of memory: FRAGMENTATION") &&
                strstr(txt, "  vdev     team-a: limit 1.00 MiB") &&
                strstr(txt, "  why      it does not fit") &&
                strstr(txt, "  fits     micro-batch 8 x 4"),
            "%s", txt);
  free(txt);
  gpushare__v1__oom_report__free_unpacked(m, NULL);
}

Test(spec_pb, timeline_message_and_chart) {
  gs_timeline_step steps[3] = {{1, 100}, {2, 300}, {3, 200}};
  gs_timeline_row rows[1];
  memset(rows, 0, sizeof rows);
  snprintf(rows[0].layer, sizeof rows[0].layer, "job");
  snprintf(rows[0].kind, sizeof rows[0].kind, "job");
  rows[0].bytes[GS_ROLE_BATCH] = 300;
  gs_timeline tl = {.steps = steps, .n_steps = 3, .at_peak = rows, .n_at_peak = 1,
                    .peak_bytes = 300, .planned_peak_bytes = 0};
  Gpushare__V1__MemoryTimeline *m;
  cr_assert_eq(gs_spec_pb_timeline(&tl, &m), 0);
  cr_assert_eq(m->n_step, 3);
  cr_expect_eq(m->step[1]->peak_in_use_bytes, 300);
  cr_expect(!m->has_planned_peak_bytes);
  cr_expect_eq(m->at_peak[0]->batch_bytes, 300);
  char *txt = gs_present_timeline(m);
  cr_expect(strstr(txt, "measured peak: 300 B\n") && strstr(txt, "  step 2 ") &&
                strstr(txt, "at the peak, by layer and role") && strstr(txt, "total"),
            "%s", txt);
  cr_expect_null(strstr(txt, "planned peak"), "no plan, no planned peak: %s", txt);
  free(txt);
  gpushare__v1__memory_timeline__free_unpacked(m, NULL);
}

Test(spec_pb, npy_text_and_token_datasets_arrive) {
  static full f;
  full_init(&f);
  Gpushare__V1__NpyFiles npy = GPUSHARE__V1__NPY_FILES__INIT;
  npy.images = "x.npy";
  npy.labels = "y.npy";
  f.train.source_case = GPUSHARE__V1__DATASET__SOURCE_NPY;
  f.train.npy = &npy;
  Gpushare__V1__TokenFile tok = GPUSHARE__V1__TOKEN_FILE__INIT;
  tok.path = "ids.bin";
  tok.vocab_size = 50257;
  tok.examples = 12;
  f.test.source_case = GPUSHARE__V1__DATASET__SOURCE_TOKENS;
  f.test.tokens = &tok;
  f.test.has_sequence_length = true;
  f.test.sequence_length = 64;
  gs_job_spec s;
  cr_assert_eq(gs_spec_pb_job(&f.spec, &s, &e), 0, "%s", e.msg);
  cr_expect_eq(s.train.source, GS_DATASET_NPY);
  cr_expect_str_eq(s.train.images, "x.npy");
  cr_expect_str_eq(s.train.labels, "y.npy");
  cr_expect_eq(s.test.source, GS_DATASET_TOKENS);
  cr_expect_str_eq(s.test.path, "ids.bin");
  cr_expect_eq(s.test.vocab_size, 50257);
  cr_expect_eq(s.test.examples, 12);
  cr_expect_eq(s.test.sequence_length, 64);
  gs_spec_pb_job_free(&s);
  Gpushare__V1__TextFile txt = GPUSHARE__V1__TEXT_FILE__INIT;
  txt.path = "book.txt";
  f.test.source_case = GPUSHARE__V1__DATASET__SOURCE_TEXT;
  f.test.text = &txt;
  cr_assert_eq(gs_spec_pb_job(&f.spec, &s, &e), 0, "%s", e.msg);
  cr_expect_eq(s.test.source, GS_DATASET_TEXT);
  cr_expect_str_eq(s.test.path, "book.txt");
  cr_expect_eq(s.test.examples, 0);
  cr_expect_eq(s.test.sequence_length, 64);
  gs_spec_pb_job_free(&s);
}
