/*
 * test_model.c: JobSpec validation and shape inference (runtime/model.c).
 *
 * Each shape error is checked for its field path and for a message that names
 * the layer and the shapes, since that sentence is what a tenant reads from
 * gpuctl; each recipe bound is checked on both sides.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "runtime/model.h"
#include "tests/unit/test_train_util.h"

static gs_model m;
static gs_err e;

static void fini(void) { gs_model_free(&m); }

TestSuite(model, .fini = fini);

static tspec *mlp(void) {
  tspec *t = ts_new(28, 28, 1);
  ts_flatten(t);
  ts_dense(t, 256, true);
  ts_dense(t, 128, true);
  ts_dense(t, 10, false);
  return t;
}

static void expect_err(tspec *t, const char *field, const char *needle) {
  gs_err_clear(&e);
  int rc = gs_model_build(&t->spec, &m, &e);
  cr_assert_lt(rc, 0, "expected an error at %s", field);
  cr_expect_eq(e.code, GS_INVALID_ARGUMENT);
  cr_expect_str_eq(e.field, field, "field %s, message: %s", e.field, e.msg);
  if (needle) cr_expect(strstr(e.msg, needle), "message \"%s\" lacks \"%s\"", e.msg, needle);
  cr_expect_null(m.layers, "a failed build leaves no layer list");
}

Test(model, mlp_shapes_names_params) {
  tspec *t = mlp();
  cr_assert_eq(gs_model_build(&t->spec, &m, &e), 0, "%s: %s", e.field, e.msg);
  cr_assert_eq(m.n_layers, 4);
  cr_expect_str_eq(m.layers[0].name, "flatten_1");
  cr_expect_str_eq(m.layers[1].name, "dense_1");
  cr_expect_str_eq(m.layers[2].name, "dense_2");
  cr_expect_str_eq(m.layers[3].name, "dense_3");
  cr_expect_eq(m.layers[0].out.rank, 1);
  cr_expect_eq(m.layers[0].out.c, 784);
  cr_expect_eq(m.layers[1].params[0].dims[0], 784);
  cr_expect_eq(m.layers[1].params[0].dims[1], 256);
  cr_expect_str_eq(m.layers[1].params[0].suffix, "kernel");
  cr_expect_str_eq(m.layers[1].params[1].suffix, "bias");
  cr_expect_eq(m.layers[1].params[1].dims[0], 256);
  cr_expect(m.layers[1].relu);
  cr_expect(!m.layers[3].relu);
  cr_expect_eq(m.classes, 10);
  cr_expect_eq(m.param_count, 784u * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10);
  cr_expect_eq(m.max_elements, 784);
  cr_expect_eq(m.layers[1].fan_in, 784);
  cr_expect_eq(m.layers[1].fan_out, 256);
  /* Defaults of the recipe: batch 32, k 1, Adam 1e-3 / 1e-7, FLOAT32. */
  cr_expect_eq(m.recipe.batch_size, 32);
  cr_expect_eq(m.recipe.accumulation_steps, 1);
  cr_expect(m.recipe.adam);
  cr_expect_eq(m.recipe.optimizer_slots, 2);
  cr_expect_float_eq(m.recipe.epsilon, 1e-7f, 1e-12);
  cr_expect_eq(m.recipe.dtype, GS_F32);
  cr_expect_float_eq(m.recipe.loss_scale_initial, 32768.0f, 0);
  cr_expect_eq(m.recipe.loss_scale_growth_interval, 2000);
  char buf[64];
  cr_expect_str_eq(gs_shape_format(&m.layers[1].out, 128, buf, sizeof buf), "(128, 256)");
  cr_expect_str_eq(gs_shape_format(&m.input, 0, buf, sizeof buf), "(28, 28, 1)");
  free(t);
}

Test(model, cnn_shapes) {
  tspec *t = ts_new(28, 28, 1);
  ts_conv(t, 32, 5, 1, true, true);
  ts_pool(t, 2, 0);
  ts_conv(t, 64, 5, 1, true, true);
  ts_pool(t, 2, 0);
  ts_flatten(t);
  ts_dense(t, 1024, true);
  ts_dense(t, 10, false);
  cr_assert_eq(gs_model_build(&t->spec, &m, &e), 0, "%s: %s", e.field, e.msg);
  const gs_layer *L = m.layers;
  cr_expect_str_eq(L[0].name, "conv2d_1");
  cr_expect_str_eq(L[1].name, "max_pool2d_1");
  cr_expect_str_eq(L[2].name, "conv2d_2");
  cr_expect_str_eq(L[3].name, "max_pool2d_2");
  cr_expect_eq(L[0].out.h, 28);
  cr_expect_eq(L[0].out.c, 32);
  cr_expect_eq(L[1].out.h, 14);
  cr_expect_eq(L[1].out.w, 14);
  cr_expect_eq(L[2].out.c, 64);
  cr_expect_eq(L[3].out.h, 7);
  cr_expect_eq(L[4].out.c, 7 * 7 * 64);
  /* kernel (KH, KW, C, F) */
  cr_expect_eq(L[2].params[0].rank, 4);
  cr_expect_eq(L[2].params[0].dims[0], 5);
  cr_expect_eq(L[2].params[0].dims[2], 32);
  cr_expect_eq(L[2].params[0].dims[3], 64);
  cr_expect_eq(L[2].fan_in, 5 * 5 * 32);
  cr_expect_eq(L[2].fan_out, 5 * 5 * 64);
  cr_expect_eq(m.param_count, 832u + 51264 + 3212288 + 10250);
  gs_conv_shape cs = gs_model_conv_shape(&L[2], 8);
  cr_expect_eq(cs.n, 8);
  cr_expect_eq(cs.oh, 14);
  cr_expect_eq(cs.f, 64);
  free(t);
}

Test(model, mobilenet_shapes) {
  tspec *t = ts_new(28, 28, 1);
  ts_conv(t, 32, 3, 2, true, true);
  ts_dw(t, 3, 1, true, true);
  ts_conv(t, 64, 1, 1, true, true);
  ts_dw(t, 3, 2, true, true);
  ts_conv(t, 128, 1, 1, false, true);
  ts_gap(t);
  ts_dense(t, 10, false);
  t->layer[0].name = "stem";
  cr_assert_eq(gs_model_build(&t->spec, &m, &e), 0, "%s: %s", e.field, e.msg);
  const gs_layer *L = m.layers;
  cr_expect_str_eq(L[0].name, "stem");
  cr_expect_str_eq(L[1].name, "depthwise_conv2d_1");
  cr_expect_str_eq(L[2].name, "conv2d_2", "counting per kind includes the named stem");
  cr_expect_str_eq(L[3].name, "depthwise_conv2d_2");
  cr_expect_str_eq(L[5].name, "global_average_pooling2d_1");
  cr_expect_eq(L[0].out.h, 14);
  cr_expect_eq(L[1].out.h, 14);
  cr_expect_eq(L[1].out.c, 32);
  cr_expect_eq(L[1].params[0].rank, 3);
  cr_expect_eq(L[1].params[0].dims[2], 32);
  cr_expect_eq(L[1].params[1].dims[0], 32);
  cr_expect_eq(L[1].fan_in, 9 * 32);
  cr_expect_eq(L[1].fan_out, 9);
  cr_expect_eq(L[3].out.h, 7);
  cr_expect_eq(L[4].out.c, 128);
  cr_expect_eq(L[5].out.rank, 1);
  cr_expect_eq(L[5].out.c, 128);
  cr_expect_eq(L[6].params[0].dims[0], 128);
  free(t);
}

Test(model, relu_layer_and_valid_conv) {
  tspec *t = ts_new(10, 10, 3);
  ts_conv(t, 4, 3, 1, false, false);
  ts_relu(t);
  ts_pool(t, 3, 2);
  ts_flatten(t);
  ts_dense(t, 2, false);
  cr_assert_eq(gs_model_build(&t->spec, &m, &e), 0, "%s: %s", e.field, e.msg);
  cr_expect_eq(m.layers[0].out.h, 8);
  cr_expect_str_eq(m.layers[1].name, "relu_1");
  cr_expect_eq(m.layers[1].out.c, 4);
  cr_expect_eq(m.layers[2].out.h, 3, "floor((8-3)/2)+1");
  cr_expect_eq(m.layers[3].out.c, 36);
  free(t);
}

Test(model, kernel_does_not_fit) {
  tspec *t = ts_new(12, 12, 1);
  ts_conv(t, 32, 5, 1, false, true); /* 8x8x32 */
  ts_pool(t, 2, 0);                  /* 4x4x32 */
  ts_conv(t, 16, 3, 1, true, true);  /* 4x4x16 */
  ts_conv(t, 64, 5, 1, false, true);
  ts_flatten(t);
  ts_dense(t, 10, false);
  expect_err(t, "model.layer[3].conv2d.kernel_size",
             "layer conv2d_3 (layer[3]): kernel 5x5 with VALID padding does not fit input "
             "4x4x16");
  free(t);
}

Test(model, pool_does_not_fit) {
  tspec *t = ts_new(3, 3, 2);
  ts_pool(t, 4, 0);
  ts_flatten(t);
  ts_dense(t, 2, false);
  expect_err(t, "model.layer[0].max_pool2d.pool_size", "pool 4x4 with VALID padding does not "
             "fit input 3x3x2");
  free(t);
}

Test(model, dense_needs_flatten) {
  tspec *t = ts_new(28, 28, 1);
  ts_dense(t, 10, false);
  expect_err(t, "model.layer[0].dense", "layer dense_1 (layer[0]): dense needs a flat input but "
             "gets 28x28x1");
  cr_expect(strstr(e.msg, "flatten"), "the message says what to add: %s", e.msg);
  free(t);
}

Test(model, conv_needs_image) {
  tspec *t = ts_new(4, 4, 1);
  ts_flatten(t);
  ts_conv(t, 2, 1, 1, true, false);
  ts_dense(t, 2, false);
  expect_err(t, "model.layer[1].conv2d", "conv2d needs an image input");
  cr_expect(strstr(e.msg, "16"), "names the flat shape: %s", e.msg);
  free(t);
}

Test(model, last_layer_must_be_dense) {
  tspec *t = ts_new(4, 4, 1);
  ts_conv(t, 2, 1, 1, true, false);
  ts_gap(t);
  expect_err(t, "model.layer", "global_average_pooling2d_1 (layer[1]) is a "
             "global_average_pooling2d");
  free(t);
}

Test(model, window_ranges) {
  tspec *t = ts_new(8, 8, 1);
  ts_conv(t, 2, 0, 1, true, false);
  ts_flatten(t);
  ts_dense(t, 2, false);
  expect_err(t, "model.layer[0].conv2d.kernel_size", "kernel 0 is out of range");
  t->layer[0].kernel_size = 3;
  t->layer[0].stride = 0;
  expect_err(t, "model.layer[0].conv2d.stride", "stride 0");
  t->layer[0].stride = 1;
  t->layer[0].filters = 0;
  expect_err(t, "model.layer[0].conv2d.filters", "filters 0");
  t->layer[0].filters = 2;
  t->layer[0].padding = 9;
  expect_err(t, "model.layer[0].conv2d.padding", "padding 9");
  t->layer[0].padding = 0;
  t->layer[2].units = 0;
  expect_err(t, "model.layer[2].dense.units", "units 0");
  t->layer[2].units = 1;
  expect_err(t, "model.layer", "at least 2 classes");
  free(t);
}

Test(model, names) {
  tspec *t = mlp();
  t->layer[1].name = "hidden";
  t->layer[2].name = "hidden";
  expect_err(t, "model.layer[2].name", "already layer[1]'s");
  t->layer[2].name = "dense_1"; /* a given name may not clash with a default */
  t->layer[1].name = NULL;
  expect_err(t, "model.layer[2].name", "already");
  t->layer[2].name = "a.b";
  expect_err(t, "model.layer[2].name", "'.'");
  free(t);
}

Test(model, no_kind_no_layers_no_input) {
  tspec *t = mlp();
  t->layer[2].kind = GS_LAYER_KIND_COUNT;
  expect_err(t, "model.layer[2]", "has no kind");
  t->layer[2].kind = GS_LAYER_DENSE;
  t->spec.n_layers = 0;
  expect_err(t, "model.layer", "0 layers");
  t->spec.n_layers = 4;
  t->spec.input.width = 0;
  expect_err(t, "model.input.width", "width 0");
  t->spec.has_input = false;
  expect_err(t, "model.input", NULL);
  t->spec.has_model = false;
  expect_err(t, "model", NULL);
  free(t);
}

Test(model, recipe_bounds) {
  tspec *t = mlp();
  ts_recipe(t, 0, 1, 1, 0, 0);
  expect_err(t, "batch_size", "micro-batch");
  ts_recipe(t, 65537, 1, 1, 0, 0);
  expect_err(t, "batch_size", "65537");
  ts_recipe(t, 65536, 1, 1, 0, 0);
  cr_expect_eq(gs_model_build(&t->spec, &m, &e), 0);
  gs_model_free(&m);
  ts_recipe(t, 8, 0, 1, 0, 0);
  expect_err(t, "accumulation_steps", "0");
  ts_recipe(t, 8, 4097, 1, 0, 0);
  expect_err(t, "accumulation_steps", "4097");
  ts_recipe(t, 8, 4096, 0, 0, 0);
  expect_err(t, "epochs", "epochs 0");
  ts_recipe(t, 8, 4096, 10001, 0, 0);
  expect_err(t, "epochs", "10001");
  ts_recipe(t, 8, 1, 1, 0, 3);
  expect_err(t, "precision", "precision 3");
  ts_recipe(t, 8, 1, 1, 0, GS_PRECISION_MIXED_FLOAT16);
  ts_loss_scale(t, 0.0f, 10);
  expect_err(t, "loss_scale.initial", "> 0");
  ts_loss_scale(t, INFINITY, 10);
  expect_err(t, "loss_scale.initial", NULL);
  ts_loss_scale(t, 1e38f, 0);
  expect_err(t, "loss_scale.growth_interval", ">= 1");
  ts_loss_scale(t, 1e38f, 5);
  cr_assert_eq(gs_model_build(&t->spec, &m, &e), 0, "%s", e.msg);
  cr_expect_eq(m.recipe.dtype, GS_F16);
  cr_expect_eq(m.recipe.loss_scale_growth_interval, 5);
  gs_model_free(&m);
  free(t);
}

Test(model, optimizer_bounds) {
  tspec *t = mlp();
  ts_adam(t, 0.0f);
  expect_err(t, "optimizer.adam.learning_rate", "learning_rate 0");
  ts_adam(t, NAN);
  expect_err(t, "optimizer.adam.learning_rate", NULL);
  ts_adam(t, -1.0f);
  expect_err(t, "optimizer.adam.learning_rate", NULL);
  ts_adam(t, 1e-3f);
  t->spec.optimizer.adam.beta1 = 1.0f;
  expect_err(t, "optimizer.adam.beta1", "[0, 1)");
  t->spec.optimizer.adam.beta1 = 0.9f;
  t->spec.optimizer.adam.beta2 = -0.1f;
  expect_err(t, "optimizer.adam.beta2", NULL);
  t->spec.optimizer.adam.beta2 = 0.999f;
  t->spec.optimizer.adam.epsilon = 0.0f;
  expect_err(t, "optimizer.adam.epsilon", "> 0");
  t->spec.optimizer.adam.epsilon = 1e-7f;
  t->spec.optimizer.adam.weight_decay = -1.0f;
  expect_err(t, "optimizer.adam.weight_decay", ">= 0");
  t->spec.optimizer.adam.weight_decay = INFINITY;
  expect_err(t, "optimizer.adam.weight_decay", NULL);
  t->spec.optimizer.adam.weight_decay = 0.01f;
  t->spec.optimizer.adam.decoupled = 1;
  cr_assert_eq(gs_model_build(&t->spec, &m, &e), 0, "%s", e.msg);
  cr_expect(m.recipe.decoupled);
  gs_model_free(&m);
  ts_sgd(t, 0.1f, 1.0f);
  expect_err(t, "optimizer.sgd.momentum", "[0, 1)");
  ts_sgd(t, 0.1f, 0.0f);
  t->spec.optimizer.sgd.nesterov = 1;
  expect_err(t, "optimizer.sgd.nesterov", "momentum");
  ts_sgd(t, 0.1f, 0.9f);
  t->spec.optimizer.sgd.nesterov = 1;
  cr_assert_eq(gs_model_build(&t->spec, &m, &e), 0, "%s", e.msg);
  cr_expect(!m.recipe.adam);
  cr_expect_eq(m.recipe.optimizer_slots, 1);
  gs_model_free(&m);
  ts_sgd(t, 0.1f, 0.0f);
  t->spec.optimizer.sgd.nesterov = 0;
  cr_assert_eq(gs_model_build(&t->spec, &m, &e), 0, "%s", e.msg);
  cr_expect_eq(m.recipe.optimizer_slots, 0, "plain SGD keeps no state");
  free(t);
}

Test(model, learning_rate_schedule) {
  tspec *t = mlp();
  ts_adam(t, 1e-3f);
  gs_spec_schedule *ls = &t->spec.optimizer.schedule;
  t->spec.optimizer.has_schedule = true;
  ls->kind = (gs_lr_schedule)7;
  expect_err(t, "optimizer.schedule.kind", "CONSTANT or COSINE");
  ls->kind = GS_LR_COSINE;
  ls->final_fraction = 1.5f;
  expect_err(t, "optimizer.schedule.final_fraction", "1.5");
  ls->final_fraction = NAN;
  expect_err(t, "optimizer.schedule.final_fraction", NULL);
  ls->final_fraction = 0.1f;
  ls->warmup_steps = 200000000u;
  expect_err(t, "optimizer.schedule.warmup_steps", "200000000");
  ls->warmup_steps = 10;
  cr_assert_eq(gs_model_build(&t->spec, &m, &e), 0, "%s", e.msg);
  const gs_recipe *r = &m.recipe;
  /* Warm-up: linear to the full rate at step 9 (0-based). */
  cr_expect_float_eq(gs_recipe_learning_rate(r, 0, 110), 1e-4f, 1e-9);
  cr_expect_float_eq(gs_recipe_learning_rate(r, 9, 110), 1e-3f, 1e-9);
  /* Then half a cosine: full rate at step 10, half-way at 60, the final
   * fraction at the last step (109) and after it. */
  cr_expect_float_eq(gs_recipe_learning_rate(r, 10, 110), 1e-3f, 1e-9);
  cr_expect_float_eq(gs_recipe_learning_rate(r, 60, 110 + 1), 1e-3f * (0.1f + 0.9f * 0.5f), 1e-8);
  cr_expect_float_eq(gs_recipe_learning_rate(r, 109, 110), 1e-4f, 1e-9);
  cr_expect_float_eq(gs_recipe_learning_rate(r, 500, 110), 1e-4f, 1e-9);
  for (uint64_t s = 11; s < 110; s++)
    cr_expect_leq(gs_recipe_learning_rate(r, s, 110), gs_recipe_learning_rate(r, s - 1, 110),
                  "the cosine never rises (step %llu)", (unsigned long long)s);
  gs_model_free(&m);
  ls->kind = GS_LR_CONSTANT;
  ls->warmup_steps = 0;
  cr_assert_eq(gs_model_build(&t->spec, &m, &e), 0, "%s", e.msg);
  cr_expect_float_eq(gs_recipe_learning_rate(&m.recipe, 0, 10), 1e-3f, 0);
  cr_expect_float_eq(gs_recipe_learning_rate(&m.recipe, 9, 10), 1e-3f, 0);
  free(t);
}

Test(model, dataset_check) {
  tspec *t = mlp();
  cr_assert_eq(gs_model_build(&t->spec, &m, &e), 0);
  cr_expect_eq(gs_model_check_dataset(&m, "train", 28, 28, 1, 10, &e), 0);
  cr_expect_lt(gs_model_check_dataset(&m, "train", 28, 28, 1, 5, &e), 0);
  cr_expect_str_eq(e.field, "model.layer[3].dense.units");
  cr_expect(strstr(e.msg, "dense_3") && strstr(e.msg, "10 units") && strstr(e.msg, "5 classes"),
            "%s", e.msg);
  cr_expect_lt(gs_model_check_dataset(&m, "test", 32, 32, 3, 10, &e), 0);
  cr_expect_str_eq(e.field, "model.input");
  cr_expect(strstr(e.msg, "32x32x3") && strstr(e.msg, "28x28x1") && strstr(e.msg, "test"),
            "%s", e.msg);
  free(t);
}

Test(model, too_many_layers) {
  tspec *t = mlp();
  t->spec.n_layers = GS_MODEL_MAX_LAYERS + 1;
  expect_err(t, "model.layer", "1001 layers");
  t->spec.n_layers = 4;
  free(t);
}
