/*
 * test_layers.c: the layer kinds of residual networks and transformers in
 * the runtime (batch_norm, layer_norm, dropout, average_pool2d, gelu,
 * embedding, position_embedding, causal_self_attention) on the CPU backend.
 *
 * The ops themselves are checked against finite differences in their own
 * tests (test_norm_ops, test_attn_ops); here, what the runtime adds: each
 * kind's fields are validated with the field path, a model of them trains
 * and learns, batch normalization's running statistics and dropout's masks
 * survive a checkpoint (a resumed job reproduces the uninterrupted one bit
 * for bit, evaluation included), the statistics are exported, and dropout
 * draws the same masks from the same seed and none in evaluation. And a
 * small GPT on text: accumulation equals one big batch, and it learns in
 * fp32, fp16 and bf16 with accumulation.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/alloc.h"
#include "runtime/data.h"
#include "runtime/model.h"
#include "runtime/safetensors.h"
#include "runtime/train.h"
#include "tests/unit/test_train_run.h"


TestSuite(layers, .init = run_setup, .fini = run_teardown, .timeout = 600);

/* ------------------------------------------------------------ validation --- */

static void refused(tspec *s, const char *field, const char *fragment) {
  gs_model m;
  gs_err_clear(&e);
  cr_assert_eq(gs_model_build(&s->spec, &m, &e), -EINVAL, "accepted; wanted %s", field);
  cr_expect_str_eq(e.field, field, "field %s (%s)", e.field, e.msg);
  cr_expect(strstr(e.msg, fragment), "message \"%s\" lacks \"%s\"", e.msg, fragment);
  free(s);
}

static tspec *image(void) {
  tspec *s = ts_new(8, 8, 3);
  ts_recipe(s, 4, 1, 1, 1, GS_PRECISION_FLOAT32);
  return s;
}

static tspec *tokens(uint32_t t) {
  tspec *s = ts_new(0, 0, 0);
  s->spec.input.sequence_length = t;
  ts_recipe(s, 4, 1, 1, 1, GS_PRECISION_FLOAT32);
  return s;
}

static gs_spec_layer *embedding(tspec *s, uint32_t vocab, uint32_t dim) {
  gs_spec_layer *l = ts_add(s, GS_LAYER_EMBEDDING);
  l->vocab_size = vocab;
  l->dim = dim;
  return l;
}

static gs_spec_layer *attention(tspec *s, uint32_t heads, uint32_t size) {
  gs_spec_layer *l = ts_add(s, GS_LAYER_CAUSAL_SELF_ATTENTION);
  l->heads = heads;
  l->head_size = size;
  return l;
}

Test(layers, fields_are_checked) {
  tspec *s = image();
  ts_add(s, GS_LAYER_BATCH_NORM)->momentum = 1.5f;
  ts_gap(s);
  ts_dense(s, 4, false);
  refused(s, "model.layer[0].batch_norm.momentum", "from 0 to 1");

  s = image();
  ts_add(s, GS_LAYER_BATCH_NORM)->epsilon = 0.0f;
  ts_gap(s);
  ts_dense(s, 4, false);
  refused(s, "model.layer[0].batch_norm.epsilon", "> 0");

  s = image();
  ts_add(s, GS_LAYER_LAYER_NORM)->epsilon = NAN;
  ts_gap(s);
  ts_dense(s, 4, false);
  refused(s, "model.layer[0].layer_norm.epsilon", "finite");

  s = image();
  ts_add(s, GS_LAYER_DROPOUT)->rate = 1.0f;
  ts_gap(s);
  ts_dense(s, 4, false);
  refused(s, "model.layer[0].dropout.rate", "[0, 1)");

  s = image();
  ts_flatten(s);
  ts_add(s, GS_LAYER_AVERAGE_POOL2D);
  ts_dense(s, 4, false);
  refused(s, "model.layer[1].average_pool2d", "needs an image input");

  s = image();
  gs_spec_layer *p = ts_add(s, GS_LAYER_AVERAGE_POOL2D);
  p->pool_size = 9;
  ts_gap(s);
  ts_dense(s, 4, false);
  refused(s, "model.layer[0].average_pool2d.pool_size", "does not fit");
}

Test(layers, token_models_are_checked) {
  tspec *s = tokens(16);
  s->spec.input.height = 4;
  embedding(s, 50, 8);
  ts_dense(s, 50, false);
  refused(s, "model.input", "sequence_length alone");

  s = tokens(16);
  ts_dense(s, 50, false);
  refused(s, "model.layer[0].dense", "only an embedding layer");

  s = image();
  embedding(s, 50, 8);
  ts_dense(s, 50, false);
  refused(s, "model.layer[0].embedding", "token input");

  s = tokens(16);
  embedding(s, 1, 8);
  ts_dense(s, 50, false);
  refused(s, "model.layer[0].embedding.vocab_size", "from 2");

  s = tokens(16);
  embedding(s, 50, 8);
  ts_flatten(s);
  ts_dense(s, 50, false);
  refused(s, "model.layer", "at every position");

  s = image();
  ts_flatten(s);
  attention(s, 2, 4);
  ts_dense(s, 4, false);
  refused(s, "model.layer[1].causal_self_attention", "needs a sequence");

  s = tokens(16);
  embedding(s, 50, 8);
  attention(s, 0, 4);
  ts_dense(s, 50, false);
  refused(s, "model.layer[1].causal_self_attention.heads", "from 1");
}

Test(layers, a_gpt_block_has_its_shapes_and_saves) {
  tspec *s = tokens(16);
  embedding(s, 50, 12);
  ts_name(s, "tok");
  ts_add(s, GS_LAYER_POSITION_EMBEDDING);
  ts_name(s, "pos");
  ts_add(s, GS_LAYER_LAYER_NORM);
  attention(s, 3, 4);
  ts_name(s, "attn");
  ts_add_layer(s, false);
  ts_in(s, "attn", "pos", NULL);
  ts_dense(s, 50, false);
  gs_model m;
  cr_assert_eq(gs_model_build(&s->spec, &m, &e), 0, "%s: %s", e.field, e.msg);
  cr_expect(m.tokens);
  cr_expect_eq(m.positions, 16);
  cr_expect_eq(m.classes, 50);
  const gs_layer *a = &m.layers[3];
  cr_expect_eq(a->n_params, 4);
  cr_expect_eq(a->params[0].dims[1], 36, "qkv: C -> 3 x 3 heads x 4");
  cr_expect_eq(a->params[2].dims[0], 12);
  cr_expect_eq(a->saved[2].elems, 3ull * 16 * 16, "scores: heads x T x T");
  cr_expect_eq(m.layers[5].out.rank, 2, "the head runs per position");
  gs_model_free(&m);
  free(s);
}

/* ------------------------------------------------------- training runs --- */

static void synth(uint64_t n_train, uint64_t n_test, gs_dataset *train, gs_dataset *test) {
  gs_dataset all;
  cr_assert_eq(gs_dataset_synthetic(n_train + n_test, 8, 8, 1, 4, 11, &all, &e), 0, "%s", e.msg);
  cr_assert_eq(gs_dataset_slice(&all, 0, n_train, train, &e), 0);
  cr_assert_eq(gs_dataset_slice(&all, n_train, n_test, test, &e), 0);
  gs_dataset_free(&all);
}

/* conv-BN-ReLU, average pool, GELU, a residual with layer norm, dropout. */
static tspec *bn_net(gs_precision p, float drop) {
  tspec *s = ts_new(8, 8, 1);
  ts_conv(s, 8, 3, 1, true, false);
  ts_add(s, GS_LAYER_BATCH_NORM);
  ts_name(s, "bn");
  ts_relu(s);
  gs_spec_layer *ap = ts_add(s, GS_LAYER_AVERAGE_POOL2D);
  ap->pool_size = 2;
  ts_add(s, GS_LAYER_GELU);
  ts_flatten(s);
  ts_name(s, "flat");
  ts_dense(s, 16, false);
  ts_add(s, GS_LAYER_LAYER_NORM);
  ts_dense(s, 128, true);
  ts_name(s, "wide");
  ts_in(s, "flat", NULL);
  ts_add(s, GS_LAYER_DROPOUT)->rate = drop;
  ts_name(s, "drop");
  ts_in(s, "wide", NULL);
  ts_dense(s, 16, false);
  ts_add_layer(s, false);
  ts_in(s, "dense_3", "layer_norm_1", NULL);
  ts_dense(s, 4, false);
  ts_recipe(s, 16, 2, 3, 5, p);
  ts_adam(s, 3e-3f);
  return s;
}

typedef struct rec {
  size_t n;
  float loss[256];
  float test_loss[8];
  uint32_t epochs;
} rec;

static void on_step(void *u, const gs_train_progress *p) {
  rec *r = u;
  if (r->n < 256) r->loss[r->n++] = p->loss;
}
static void on_epoch(void *u, const gs_train_epoch *m) {
  rec *r = u;
  if (r->epochs < 8) r->test_loss[r->epochs++] = m->test_loss;
}

static void resume_case(gs_precision p) {
  gs_dataset tr, te;
  synth(512, 64, &tr, &te);
  const uint64_t S = 40, N = 21; /* 16 steps an epoch: stops inside epoch 2 */
  tspec *s = bn_net(p, 0.3f);
  rec *full = calloc(1, sizeof *full), *part = calloc(1, sizeof *part);
  gs_train_options o = {.threads = 2, .on_step = on_step, .on_epoch = on_epoch};
  resumed r;
  resume_runs(s, &tr, &te, o, full, part, S, N, &r);
  cr_assert_eq(part->n, S);
  cr_expect_eq(memcmp(full->loss, part->loss, S * sizeof(float)), 0,
               "%s: the losses go on as if never stopped (dropout's masks, the running "
               "statistics)", gs_precision_name(p));
  cr_expect_eq(memcmp(r.w_full, r.w_res, r.n * sizeof(float)), 0, "%s: the same final weights",
               gs_precision_name(p));
  /* The last evaluation reads batch normalization's running statistics:
   * equal only if the checkpoint kept them. */
  cr_assert_geq(full->epochs, 2);
  cr_expect_eq(memcmp(&full->test_loss[full->epochs - 1], &part->test_loss[part->epochs - 1],
                      sizeof(float)),
               0, "%s: the same test loss after the resume: %g vs %g", gs_precision_name(p),
               (double)full->test_loss[full->epochs - 1],
               (double)part->test_loss[part->epochs - 1]);
  free(r.w_full);
  free(r.w_res);
  free(full);
  free(part);
  free(s);
  gs_dataset_free(&tr);
  gs_dataset_free(&te);
}

Test(layers, resume_is_bit_exact_fp32) { resume_case(GS_PRECISION_FLOAT32); }
Test(layers, resume_is_bit_exact_bf16) { resume_case(GS_PRECISION_MIXED_BFLOAT16); }

Test(layers, the_net_learns_and_exports_its_running_statistics) {
  gs_dataset tr, te;
  synth(1024, 256, &tr, &te);
  tspec *s = bn_net(GS_PRECISION_FLOAT32, 0.1f);
  s->spec.epochs = 4;
  gs_train_options o = {.threads = 2};
  gs_train *t = make(s, &tr, &te, &o);
  cr_assert_eq(gs_train_run(t, &e), 0, "%s", e.msg);
  gs_train_result r;
  gs_train_result_get(t, &r);
  cr_expect_geq(r.test_accuracy, 0.9f, "test accuracy %.3f", (double)r.test_accuracy);
  char path[] = "/tmp/gs_test_layers_st_XXXXXX";
  int fd = mkstemp(path);
  cr_assert_geq(fd, 0);
  close(fd);
  cr_assert_eq(gs_train_export_safetensors(t, path, &e), 0, "%s", e.msg);
  gs_safetensors *st = NULL;
  cr_assert_eq(gs_safetensors_read(path, &st, &e), 0, "%s", e.msg);
  const gs_ckpt_tensor *mean = gs_safetensors_find(st, "bn.running_mean");
  const gs_ckpt_tensor *var = gs_safetensors_find(st, "bn.running_var");
  cr_assert(mean && var, "bn.running_mean and bn.running_var are exported");
  cr_expect_eq(mean->rank, 1);
  cr_expect_eq(mean->shape[0], 8);
  const float *mv = (const float *)mean->data, *vv = (const float *)var->data;
  bool moved = false;
  for (int c = 0; c < 8; c++) {
    cr_expect(isfinite(mv[c]) && isfinite(vv[c]) && vv[c] > 0.0f, "channel %d: %g %g", c,
              (double)mv[c], (double)vv[c]);
    moved = moved || mv[c] != 0.0f || vv[c] != 1.0f;
  }
  cr_expect(moved, "training moved the running statistics from (0, 1)");
  cr_expect(gs_safetensors_find(st, "bn.gamma") && gs_safetensors_find(st, "bn.beta"));
  gs_safetensors_free(st);
  unlink(path);
  gs_train_destroy(t);
  free(s);
  gs_dataset_free(&tr);
  gs_dataset_free(&te);
}

/* Dropout draws from the seed: the same seed, the same bits, and masks
 * that do something (rate 0.5 trains other weights than rate 0). Evaluation
 * draws none: evaluating twice gives the same loss. */
Test(layers, dropout_masks_come_from_the_seed) {
  gs_dataset tr, te;
  synth(256, 64, &tr, &te);
  const float rate[3] = {0.5f, 0.5f, 0.0f};
  float *w[3];
  size_t n = 0;
  for (int k = 0; k < 3; k++) {
    tspec *s = bn_net(GS_PRECISION_FLOAT32, rate[k]);
    s->spec.epochs = 1;
    gs_train_options o = {.threads = 2};
    gs_train *t = make(s, &tr, &te, &o);
    cr_assert_eq(gs_train_run(t, &e), 0, "%s", e.msg);
    w[k] = params(t, &n);
    float l1, a1, l2, a2;
    cr_assert_eq(gs_train_evaluate(t, &l1, &a1, &e), 0);
    cr_assert_eq(gs_train_evaluate(t, &l2, &a2, &e), 0);
    cr_expect_eq(memcmp(&l1, &l2, sizeof l1), 0, "evaluation draws no mask");
    gs_train_destroy(t);
    free(s);
  }
  cr_expect_eq(memcmp(w[0], w[1], n * sizeof(float)), 0, "the same seed, the same bits");
  cr_expect_neq(memcmp(w[0], w[2], n * sizeof(float)), 0, "rate 0.5 is not rate 0");
  for (int k = 0; k < 3; k++) free(w[k]);
  gs_dataset_free(&tr);
  gs_dataset_free(&te);
}

/* ------------------------------------------------------ language models --- */

/* n sequences of T random words' bytes: a text a small GPT can learn. */
static void text_set(uint64_t n, uint32_t t, uint64_t seed, gs_dataset *d) {
  static const char *const words[] = {"the ", "cat ", "sat ", "on ", "a ", "mat ", "and ",
                                      "dog ", "ran ", "to ", "big ", "red ", "sun. "};
  size_t len = (size_t)n * t + 1, o = 0;
  char *text = malloc(len + 8);
  cr_assert(text);
  uint64_t st = seed;
  while (o < len) {
    const char *w = words[gs_rng_below(&st, sizeof words / sizeof *words)];
    for (; *w && o < len; w++) text[o++] = *w;
  }
  cr_assert_eq(gs_dataset_load_tokens_mem_named((const uint8_t *)text, len, "text",
                                                GS_TOKENS_TEXT, 0, t, d, &e),
               0, "%s", e.msg);
  free(text);
}

/* Embeddings, layer norm, causal attention, a GELU MLP, residuals, a head
 * over the 256 byte values. */
static tspec *tiny_gpt(uint32_t batch, uint32_t accum, gs_precision p) {
  tspec *s = tokens(16);
  embedding(s, 256, 24);
  ts_name(s, "tok");
  ts_add(s, GS_LAYER_POSITION_EMBEDDING);
  ts_name(s, "pos");
  ts_add(s, GS_LAYER_LAYER_NORM);
  attention(s, 2, 12);
  ts_name(s, "attn");
  ts_add_layer(s, false);
  ts_in(s, "attn", "pos", NULL);
  ts_name(s, "res1");
  ts_add(s, GS_LAYER_LAYER_NORM);
  ts_dense(s, 48, false);
  ts_add(s, GS_LAYER_GELU);
  ts_dense(s, 24, false);
  ts_name(s, "mlp_out");
  ts_add_layer(s, false);
  ts_in(s, "mlp_out", "res1", NULL);
  ts_add(s, GS_LAYER_LAYER_NORM);
  ts_dense(s, 256, false);
  ts_recipe(s, batch, accum, 1, 3, p);
  ts_adam(s, 3e-3f);
  return s;
}

/* Accumulation over micro-batches equals one big batch for every layer of
 * a GPT (none of them mixes examples, unlike batch normalization). */
Test(layers, gpt_accumulation_equals_one_big_batch) {
  gs_dataset tr;
  text_set(256, 16, 7, &tr);
  tspec *big = tiny_gpt(32, 1, GS_PRECISION_FLOAT32), *acc = tiny_gpt(8, 4, GS_PRECISION_FLOAT32);
  gs_train_options o = {.threads = 2, .has_max_steps = true, .max_steps = 6};
  rec ra = {0}, rb = {0};
  o.on_step = on_step;
  o.user = &ra;
  gs_train *a = make(big, &tr, NULL, &o);
  o.user = &rb;
  gs_train *b = make(acc, &tr, NULL, &o);
  cr_assert_eq(gs_train_run(a, &e), 0, "%s", e.msg);
  cr_assert_eq(gs_train_run(b, &e), 0, "%s", e.msg);
  size_t na, nb;
  float *wa = params(a, &na), *wb = params(b, &nb);
  cr_assert_eq(na, nb);
  double num = 0, den = 0;
  for (size_t i = 0; i < na; i++) {
    num += ((double)wa[i] - wb[i]) * ((double)wa[i] - wb[i]);
    den += (double)wa[i] * wa[i];
  }
  double rel = sqrt(num / den);
  cr_log_info("GPT, 4 x 8 against 1 x 32: relative weight error %g", rel);
  /* Adam divides each step by the gradient's own scale, so where a
   * gradient is near zero the two orders of summation can differ by up to
   * a step (3e-3): 1e-5 of the weights' norm is where that lies, depending
   * on the host's OpenBLAS kernels; a wrong accumulation is off by far more */
  cr_expect_lt(rel, 1e-4, "4 x 8 vs 1 x 32: relative weight error %g", rel);
  for (size_t i = 0; i < ra.n; i++)
    cr_expect_lt(fabsf(ra.loss[i] - rb.loss[i]), 1e-5f * (1 + fabsf(ra.loss[i])),
                 "step %zu loss %g vs %g", i + 1, (double)ra.loss[i], (double)rb.loss[i]);
  free(wa);
  free(wb);
  gs_train_destroy(a);
  gs_train_destroy(b);
  free(big);
  free(acc);
  gs_dataset_free(&tr);
}

/* The GPT learns in every precision, with accumulation: the held-out loss
 * falls well below a uniform guess over 256 bytes (5.55). */
Test(layers, gpt_learns_in_every_precision) {
  gs_dataset all, tr, te;
  text_set(576, 16, 9, &all);
  cr_assert_eq(gs_dataset_slice(&all, 0, 512, &tr, &e), 0, "%s", e.msg);
  cr_assert_eq(gs_dataset_slice(&all, 512, 64, &te, &e), 0, "%s", e.msg);
  const gs_precision ps[3] = {GS_PRECISION_FLOAT32, GS_PRECISION_MIXED_FLOAT16,
                              GS_PRECISION_MIXED_BFLOAT16};
  for (int i = 0; i < 3; i++) {
    tspec *s = tiny_gpt(16, 2, ps[i]);
    s->spec.epochs = 6;
    gs_train_options o = {.threads = 2};
    gs_train *t = make(s, &tr, &te, &o);
    cr_assert_eq(gs_train_run(t, &e), 0, "%s: %s", gs_precision_name(ps[i]), e.msg);
    gs_train_result r;
    gs_train_result_get(t, &r);
    cr_log_info("GPT %s 16 x 2: held-out loss %.4f, next-byte accuracy %.3f",
                gs_precision_name(ps[i]), (double)r.test_loss, (double)r.test_accuracy);
    cr_expect_lt(r.test_loss, 2.0f, "%s: held-out loss %g", gs_precision_name(ps[i]),
                 (double)r.test_loss);
    gs_train_destroy(t);
    free(s);
  }
  gs_dataset_free(&all);
  gs_dataset_free(&tr);
  gs_dataset_free(&te);
}
