/*
 * test_graph.c: the layer graph (named inputs, add, concat) on the CPU
 * backend.
 *
 * A model's layers may name their inputs; add sums them, concat joins them
 * along the channels. Checked here: a residual block and a concat train one
 * SGD step exactly as the same network written out by hand in double
 * precision (forward, the gradient that reaches a layer by two paths, the
 * update); a straight line that names every input trains the very bits of
 * the one that names none; and each way a graph can be wrong (a cycle, a
 * name that is no layer, a later layer, shapes that do not compose, an
 * output nobody takes) is refused with the field path and both shapes.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdarg.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/alloc.h"
#include "runtime/data.h"
#include "runtime/model.h"
#include "runtime/train.h"
#include "tests/unit/test_train_run.h"

TestSuite(graph, .init = run_setup, .fini = run_teardown, .timeout = 300);

/* ------------------------------------------------------------ validation --- */

/* Build s; expect a refusal whose field is `field` and whose message has
 * every one of the NULL-terminated fragments. */
static void refused(tspec *s, const char *field, ...) {
  gs_model m;
  gs_err_clear(&e);
  cr_assert_eq(gs_model_build(&s->spec, &m, &e), -EINVAL, "the spec was accepted");
  cr_expect_str_eq(e.field, field, "field %s (%s)", e.field, e.msg);
  va_list ap;
  va_start(ap, field);
  for (const char *f = va_arg(ap, const char *); f; f = va_arg(ap, const char *))
    cr_expect(strstr(e.msg, f), "message \"%s\" lacks \"%s\"", e.msg, f);
  va_end(ap);
  free(s);
}

static tspec *base(void) {
  tspec *s = ts_new(8, 8, 3);
  ts_recipe(s, 4, 1, 1, 1, GS_PRECISION_FLOAT32);
  return s;
}

Test(graph, cycle_is_refused_with_the_chain) {
  tspec *s = base();
  ts_conv(s, 3, 3, 1, true, true);
  ts_name(s, "a");
  ts_in(s, "b", NULL);
  ts_conv(s, 3, 3, 1, true, true);
  ts_name(s, "b");
  ts_in(s, "a", NULL);
  ts_gap(s);
  ts_dense(s, 4, false);
  refused(s, "model.layer[0].inputs[0]", "makes a cycle", "a <- b <- a", NULL);
}

Test(graph, self_input_is_a_cycle) {
  tspec *s = base();
  ts_conv(s, 3, 3, 1, true, true);
  ts_conv(s, 3, 3, 1, true, true);
  ts_name(s, "me");
  ts_in(s, "me", NULL);
  ts_gap(s);
  ts_dense(s, 4, false);
  refused(s, "model.layer[1].inputs[0]", "its own output", NULL);
}

Test(graph, later_layer_is_refused) {
  tspec *s = base();
  ts_conv(s, 3, 3, 1, true, true);
  ts_in(s, "pool", NULL);
  ts_gap(s);
  ts_name(s, "pool");
  ts_in(s, "input", NULL);
  ts_dense(s, 4, false);
  ts_in(s, "pool", NULL);
  refused(s, "model.layer[0].inputs[0]", "layer[1], after this one", NULL);
}

Test(graph, dangling_name_is_refused) {
  tspec *s = base();
  ts_conv(s, 3, 3, 1, true, true);
  ts_add_layer(s, false);
  ts_in(s, "conv2d_1", "conv2d_9", NULL);
  ts_gap(s);
  ts_dense(s, 4, false);
  refused(s, "model.layer[1].inputs[1]", "\"conv2d_9\" is no layer's name", NULL);
}

Test(graph, add_of_two_shapes_names_both) {
  tspec *s = base();
  ts_conv(s, 3, 3, 1, true, true); /* 8x8x3 */
  ts_conv(s, 3, 3, 2, true, true); /* 4x4x3 */
  ts_add_layer(s, false);
  ts_in(s, "conv2d_1", "conv2d_2", NULL);
  ts_gap(s);
  ts_dense(s, 4, false);
  refused(s, "model.layer[2].inputs[1]", "conv2d_1 is 8x8x3", "conv2d_2 is 4x4x3", NULL);
}

Test(graph, concat_needs_equal_height_and_width) {
  tspec *s = base();
  ts_conv(s, 3, 3, 1, true, true);
  ts_conv(s, 5, 3, 2, true, true);
  ts_concat(s);
  ts_in(s, "conv2d_1", "conv2d_2", NULL);
  ts_gap(s);
  ts_dense(s, 4, false);
  refused(s, "model.layer[2].inputs[1]", "height and width", "8x8x3", "4x4x5", NULL);
}

Test(graph, input_counts_are_checked) {
  tspec *s = base();
  ts_conv(s, 3, 3, 1, true, true);
  ts_add_layer(s, false);
  ts_in(s, "conv2d_1", NULL);
  ts_gap(s);
  ts_dense(s, 4, false);
  refused(s, "model.layer[1].inputs", "add takes 2 to 8 inputs, got 1", NULL);

  s = base();
  ts_conv(s, 3, 3, 1, true, true);
  ts_concat(s);
  ts_gap(s);
  ts_dense(s, 4, false);
  refused(s, "model.layer[1].inputs", "concat needs the names of 2 to 8 layers", NULL);

  s = base();
  ts_conv(s, 3, 3, 1, true, true);
  ts_conv(s, 3, 3, 1, true, true);
  ts_in(s, "input", "conv2d_1", NULL);
  ts_gap(s);
  ts_dense(s, 4, false);
  refused(s, "model.layer[1].inputs", "conv2d takes one input, got 2", NULL);

  s = base();
  ts_conv(s, 3, 3, 1, true, true);
  ts_add_layer(s, false);
  ts_in(s, "conv2d_1", "conv2d_1", NULL);
  ts_gap(s);
  ts_dense(s, 4, false);
  refused(s, "model.layer[1].inputs[1]", "named twice", NULL);
}

Test(graph, an_output_nobody_takes_is_refused) {
  tspec *s = base();
  ts_conv(s, 3, 3, 1, true, true);
  ts_conv(s, 3, 3, 1, true, true); /* conv2d_2: a dead end */
  ts_gap(s);
  ts_in(s, "conv2d_1", NULL);
  ts_dense(s, 4, false);
  refused(s, "model.layer[1]", "conv2d_2", "taken by no layer", NULL);
}

Test(graph, shapes_and_gradients_of_a_graph) {
  tspec *s = base();
  ts_conv(s, 4, 3, 1, true, true); /* conv2d_1 8x8x4 */
  ts_conv(s, 4, 3, 1, true, false);
  ts_add_layer(s, true);
  ts_in(s, "conv2d_2", "conv2d_1", NULL);
  ts_concat(s);
  ts_in(s, "add_1", "input", NULL); /* 8x8x7 */
  ts_gap(s);
  ts_dense(s, 4, false);
  gs_model m;
  cr_assert_eq(gs_model_build(&s->spec, &m, &e), 0, "%s: %s", e.field, e.msg);
  cr_expect(m.graph);
  cr_expect_eq(m.layers[3].out.c, 7);
  cr_expect_eq(m.layers[3].inputs[1], GS_MODEL_INPUT);
  cr_expect_eq(m.layers[0].consumers, 2, "conv2d_1 feeds conv2d_2 and add_1");
  cr_expect_eq(m.layers[5].consumers, 1, "the loss takes the last layer");
  cr_expect(m.layers[2].relu, "add's activation");
  cr_expect(m.layers[3].needs_grad);
  gs_model_free(&m);
  free(s);
}

/* --------------------------------------------- one step against by hand --- */

#define N 8   /* examples: one micro-batch, one step */
#define D 64  /* 8x8x1 flattened */
#define H 16
#define K 4
#define LR 0.1

/* The four learned layers of both nets: x(N,D) -> h = relu(x W1 + b1) ->
 * f = h W2 + b2 -> s = f + h (add) or [f, h] (concat) -> logits = s W3 + b3. */
typedef struct net {
  double w1[D * H], b1[H], w2[H * H], b2[H], w3[2 * H * K], b3[K];
} net;

static void read_net(gs_train *t, net *n, uint32_t s_width) {
  float buf[D * H];
  const uint32_t layer[3] = {1, 2, 4}; /* flatten, h, f, merge, out */
  double *w[3] = {n->w1, n->w2, n->w3}, *b[3] = {n->b1, n->b2, n->b3};
  const size_t wn[3] = {D * H, H * H, (size_t)s_width * K}, bn[3] = {H, H, K};
  for (int i = 0; i < 3; i++) {
    cr_assert_eq(gs_train_read_param(t, layer[i], 0, buf, wn[i]), 0);
    for (size_t j = 0; j < wn[i]; j++) w[i][j] = buf[j];
    cr_assert_eq(gs_train_read_param(t, layer[i], 1, buf, bn[i]), 0);
    for (size_t j = 0; j < bn[i]; j++) b[i][j] = buf[j];
  }
}

/* One SGD step on all N examples, in double: the expected weights. */
static void step_by_hand(net *n, const float *x, const int32_t *y, bool concat) {
  const int S = concat ? 2 * H : H;
  static double h[N][H], f[N][H], s[N][2 * H], lg[N][K], dl[N][K], ds[N][2 * H], df[N][H],
      dh[N][H];
  net g;
  memset(&g, 0, sizeof g);
  for (int i = 0; i < N; i++) {
    for (int j = 0; j < H; j++) {
      double a = n->b1[j];
      for (int k = 0; k < D; k++) a += x[i * D + k] * n->w1[k * H + j];
      h[i][j] = a > 0 ? a : 0;
    }
    for (int j = 0; j < H; j++) {
      double a = n->b2[j];
      for (int k = 0; k < H; k++) a += h[i][k] * n->w2[k * H + j];
      f[i][j] = a;
    }
    for (int j = 0; j < H; j++) {
      if (concat) {
        s[i][j] = f[i][j];
        s[i][H + j] = h[i][j];
      } else {
        s[i][j] = f[i][j] + h[i][j];
      }
    }
    double mx = -INFINITY, z = 0;
    for (int c = 0; c < K; c++) {
      double a = n->b3[c];
      for (int k = 0; k < S; k++) a += s[i][k] * n->w3[k * K + c];
      lg[i][c] = a;
      if (a > mx) mx = a;
    }
    for (int c = 0; c < K; c++) z += exp(lg[i][c] - mx);
    for (int c = 0; c < K; c++) dl[i][c] = (exp(lg[i][c] - mx) / z - (c == y[i])) / N;
  }
  for (int i = 0; i < N; i++) {
    for (int c = 0; c < K; c++) {
      g.b3[c] += dl[i][c];
      for (int k = 0; k < S; k++) g.w3[k * K + c] += s[i][k] * dl[i][c];
    }
    for (int k = 0; k < S; k++) {
      double a = 0;
      for (int c = 0; c < K; c++) a += dl[i][c] * n->w3[k * K + c];
      ds[i][k] = a;
    }
    for (int j = 0; j < H; j++) df[i][j] = ds[i][j];
    for (int j = 0; j < H; j++) {
      g.b2[j] += df[i][j];
      for (int k = 0; k < H; k++) g.w2[k * H + j] += h[i][k] * df[i][j];
    }
    /* h reaches the loss twice: through f and straight into the merge. */
    for (int k = 0; k < H; k++) {
      double a = concat ? ds[i][H + k] : ds[i][k];
      for (int j = 0; j < H; j++) a += df[i][j] * n->w2[k * H + j];
      dh[i][k] = h[i][k] > 0 ? a : 0;
    }
    for (int j = 0; j < H; j++) {
      g.b1[j] += dh[i][j];
      for (int k = 0; k < D; k++) g.w1[k * H + j] += x[i * D + k] * dh[i][j];
    }
  }
  double *w = (double *)n, *gw = (double *)&g;
  for (size_t i = 0; i < sizeof g / sizeof(double); i++) w[i] -= LR * gw[i];
}

static void one_step_case(bool concat) {
  tspec *s = ts_new(8, 8, 1);
  ts_flatten(s);
  ts_dense(s, H, true);
  ts_name(s, "h");
  ts_dense(s, H, false);
  ts_name(s, "f");
  if (concat)
    ts_concat(s);
  else
    ts_add_layer(s, false);
  ts_in(s, "f", "h", NULL);
  ts_dense(s, K, false);
  ts_recipe(s, N, 1, 1, 3, GS_PRECISION_FLOAT32);
  ts_sgd(s, (float)LR, 0.0f);
  gs_dataset tr;
  cr_assert_eq(gs_dataset_synthetic(N, 8, 8, 1, K, 5, &tr, &e), 0, "%s", e.msg);
  gs_train_options o = {.threads = 2};
  gs_train *t = NULL;
  gs_train_failure fl;
  cr_assert_eq(gs_train_create(&s->spec, B, A, &tr, NULL, &o, &t, &fl, &e), 0, "%s: %s",
               e.field, e.msg);
  net want, got;
  memset(&want, 0, sizeof want); /* add: w3's second half stays 0 in both */
  memset(&got, 0, sizeof got);
  const uint32_t sw = concat ? 2 * H : H;
  read_net(t, &want, sw);
  /* Every example is in the one batch: the sums do not depend on its order. */
  static float x[N * D];
  int32_t y[N];
  uint64_t idx[N];
  for (uint64_t i = 0; i < N; i++) idx[i] = i;
  gs_dataset_gather_f32(&tr, idx, N, x, y);
  step_by_hand(&want, x, y, concat);
  bool done;
  cr_assert_eq(gs_train_steps(t, 1, &done, &e), 0, "%s", e.msg);
  read_net(t, &got, sw);
  const double *a = (const double *)&got, *b = (const double *)&want;
  double worst = 0;
  for (size_t i = 0; i < sizeof(net) / sizeof(double); i++) {
    double d = fabs(a[i] - b[i]);
    if (d > worst) worst = d;
  }
  cr_log_info("%s: worst |gpushare - by hand| after one step: %.3g", concat ? "concat" : "add",
              worst);
  cr_expect_leq(worst, 2e-6, "%s: a weight differs by %g from the step by hand",
                concat ? "concat" : "add", worst);
  gs_train_destroy(t);
  gs_dataset_free(&tr);
  free(s);
}

Test(graph, residual_add_equals_the_step_by_hand) { one_step_case(false); }
Test(graph, concat_equals_the_step_by_hand) { one_step_case(true); }

/* --------------------------------------------- a named line, same bits --- */

static float *train_params(tspec *s, size_t *count) {
  gs_dataset tr;
  cr_assert_eq(gs_dataset_synthetic(96, 8, 8, 1, 4, 9, &tr, &e), 0, "%s", e.msg);
  gs_train_options o = {.threads = 2};
  gs_train *t = make(s, &tr, NULL, &o);
  cr_assert_eq(gs_train_run(t, &e), 0, "%s", e.msg);
  float *v = params(t, count);
  gs_train_destroy(t);
  gs_dataset_free(&tr);
  return v;
}

static tspec *line(bool named, gs_precision p) {
  tspec *s = ts_new(8, 8, 1);
  ts_conv(s, 4, 3, 1, true, true);
  if (named) ts_in(s, "input", NULL);
  ts_pool(s, 2, 0);
  if (named) ts_in(s, "conv2d_1", NULL);
  ts_flatten(s);
  if (named) ts_in(s, "max_pool2d_1", NULL);
  ts_dense(s, 16, true);
  if (named) ts_in(s, "flatten_1", NULL);
  ts_dense(s, 4, false);
  if (named) ts_in(s, "dense_1", NULL);
  ts_recipe(s, 8, 2, 2, 7, p);
  ts_adam(s, 3e-3f);
  return s;
}

Test(graph, a_line_that_names_its_inputs_trains_the_same_bits) {
  const gs_precision ps[3] = {GS_PRECISION_FLOAT32, GS_PRECISION_MIXED_FLOAT16,
                              GS_PRECISION_MIXED_BFLOAT16};
  for (int i = 0; i < 3; i++) {
    tspec *a = line(false, ps[i]), *b = line(true, ps[i]);
    size_t na, nb;
    float *pa = train_params(a, &na), *pb = train_params(b, &nb);
    cr_assert_eq(na, nb);
    cr_expect(memcmp(pa, pb, na * sizeof *pa) == 0, "%s: the weights differ",
              gs_precision_name(ps[i]));
    free(pa);
    free(pb);
    free(a);
    free(b);
  }
}
