/*
 * test_plan.c: the memory planner (runtime/plan.c) against the allocator's
 * measurements, admission and auto-fit, the suggestions, the OOM report of
 * each cause and the memory timeline.
 *
 * The examples are the shipped jobs (build/examples/NAME.pb, encoded from
 * examples/NAME.txtpb by the build); their Fashion-MNIST files are replaced by
 * a synthetic set of the same shape, since memory depends on shapes only.
 * Each job is created for real on the CPU backend with a fresh vdev
 * allocator and runs one optimizer step; the allocator's peak in use must be
 * within 5% of the plan (the planner's contract), and the per-role bytes the
 * allocator holds must equal the plan's (the planner and the runtime share
 * one buffer list, so they agree exactly unless one of them drifts).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "present/present.h"
#include "runtime/alloc.h"
#include "runtime/data.h"
#include "runtime/oom.h"
#include "runtime/plan.h"
#include "convert/spec_pb.h"
#include "runtime/train.h"
#include "tests/unit/test_train_util.h"

static gs_backend *B;
static gs_err e;

static void setup(void) {
  B = gs_backend_cpu();
  gs_err_clear(&e);
}

TestSuite(plan, .init = setup, .timeout = 900);

/* ----------------------------------------------------------- fixtures --- */

/* An example job: the decoded message and the runtime's spec of it (first,
 * so a gs_job_spec * is the example). */
typedef struct example {
  gs_job_spec spec;
  Gpushare__V1__JobSpec *pb;
} example;

static gs_job_spec *load_example(const char *name) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s.pb", GS_EXAMPLES_PB_DIR, name);
  FILE *f = fopen(path, "rb");
  cr_assert_not_null(f, "%s is missing: the build encodes the examples (target gs_examples)",
                     path);
  static uint8_t buf[1 << 16];
  size_t n = fread(buf, 1, sizeof buf, f);
  fclose(f);
  example *x = calloc(1, sizeof *x);
  cr_assert_not_null(x);
  x->pb = gpushare__v1__job_spec__unpack(NULL, n, buf);
  cr_assert_not_null(x->pb, "%s does not decode as a JobSpec", path);
  cr_assert_eq(gs_spec_pb_job(x->pb, &x->spec, &e), 0, "%s", e.msg);
  return &x->spec;
}

static void free_example(gs_job_spec *s) {
  example *x = (example *)s;
  gs_spec_pb_job_free(&x->spec);
  gpushare__v1__job_spec__free_unpacked(x->pb, NULL);
  free(x);
}

static gs_job_spec with(const gs_job_spec *s, uint32_t micro, uint32_t accum, int precision) {
  gs_job_spec v = *s;
  if (micro) v.batch_size = micro;
  if (accum) v.accumulation_steps = accum;
  if (precision >= 0) v.precision = (gs_precision)precision;
  return v;
}

/* Synthetic examples shaped like the spec's input: two effective batches. */
static void synth_for(const gs_job_spec *s, uint64_t n, gs_dataset *d) {
  const gs_spec_input *in = &s->input;
  uint32_t classes = s->layers[s->n_layers - 1].units;
  if (in->sequence_length) { /* a language model: n sequences of random bytes */
    size_t len = (size_t)n * in->sequence_length + 1;
    uint8_t *text = malloc(len);
    cr_assert(text);
    uint64_t st = 5;
    for (size_t i = 0; i < len; i++) text[i] = (uint8_t)(32 + gs_rng_below(&st, 95));
    cr_assert_eq(gs_dataset_load_tokens_mem_named(text, len, "text", GS_TOKENS_TEXT, 0,
                                                  in->sequence_length, d, &e),
                 0, "%s", e.msg);
    free(text);
    return;
  }
  cr_assert_eq(gs_dataset_synthetic(n, in->height, in->width, in->channels, classes, 5, d, &e), 0,
               "%s", e.msg);
}

/* The plan table, as every surface prints it: through the message. */
static char *plan_text(const gs_plan *p, uint64_t limit) {
  Gpushare__V1__Plan *m = NULL;
  cr_assert_eq(gs_spec_pb_plan(p, limit, GS_POLICY_GROWTH, &m), 0);
  char *txt = gs_present_plan(m);
  gpushare__v1__plan__free_unpacked(m, NULL);
  return txt;
}

/* The memory timeline as the executor sends it. */
static int timeline_msg(const gs_train *t, uint64_t planned, Gpushare__V1__MemoryTimeline **out) {
  gs_timeline tl;
  int rc = gs_train_memory_timeline(t, planned, &tl);
  if (rc) return rc;
  rc = gs_spec_pb_timeline(&tl, out);
  gs_timeline_free(&tl);
  return rc;
}

/* The OOM report as the daemon stores it (the one builder, as a message). */
static int oom_report(const gs_job_spec *s, const gs_backend *b, const gs_train_failure *f,
                      const char *vdev, Gpushare__V1__OomReport **out, gs_err *err) {
  gs_oom_report r;
  const gs_oom_where w = {.vdev = vdev};
  *out = NULL;
  int rc = gs_oom_report_build(s, b, f, &w, &r, err);
  if (rc) return rc;
  return gs_spec_pb_oom_report(&r, out);
}

typedef struct role_sum {
  uint64_t by_role[GS_ROLE_COUNT];
} role_sum;

static void sum_tag(void *u, const char *layer, gs_role role, uint64_t bytes) {
  (void)layer;
  ((role_sum *)u)->by_role[role] += bytes;
}

/* Plan, create, run one step; returns the relative error of the measured
 * peak against the plan. */
static double plan_vs_measured(const gs_job_spec *spec, const char *label,
                               const gs_dataset *test) {
  gs_plan p;
  cr_assert_eq(gs_plan_job(spec, B, &p, &e), 0, "%s: plan: %s: %s", label, e.field, e.msg);
  uint64_t eff = (uint64_t)p.micro_batch * p.accumulation_steps;
  gs_dataset tr;
  synth_for(spec, 2 * eff, &tr);
  gs_alloc *a;
  cr_assert_eq(gs_alloc_create(B, 0, 4ull << 30, GS_POLICY_GROWTH, &a), 0);
  gs_train *t;
  gs_train_failure f;
  gs_train_options o = {.threads = 2};
  cr_assert_eq(gs_train_create(spec, B, a, &tr, test, &o, &t, &f, &e), 0, "%s: create: %s",
               label, e.msg);
  role_sum rs = {0};
  gs_alloc_foreach_tag(a, sum_tag, &rs);
  for (int r = 0; r < GS_ROLE_COUNT; r++)
    cr_expect_eq(rs.by_role[r], p.by_role[r], "%s: role %s: allocator holds %llu, plan says %llu",
                 label, gs_role_name((gs_role)r), (unsigned long long)rs.by_role[r],
                 (unsigned long long)p.by_role[r]);
  bool done;
  cr_assert_eq(gs_train_steps(t, 1, &done, &e), 0, "%s: step: %s", label, e.msg);
  gs_train_result res;
  gs_train_result_get(t, &res);
  double err = fabs((double)res.peak_memory_bytes - (double)p.peak_bytes) / (double)p.peak_bytes;
  cr_log_info("%-34s planned %12llu measured %12llu error %.4f%%", label,
              (unsigned long long)p.peak_bytes, (unsigned long long)res.peak_memory_bytes,
              err * 100.0);
  cr_assert_leq(err, 0.05, "%s: measured peak %llu is not within 5%% of the plan's %llu", label,
                (unsigned long long)res.peak_memory_bytes, (unsigned long long)p.peak_bytes);
  gs_train_destroy(t);
  gs_alloc_stats st;
  gs_alloc_stats_get(a, &st);
  cr_expect_eq(st.in_use, 0, "%s: the job returned all its memory", label);
  gs_alloc_destroy(a);
  gs_dataset_free(&tr);
  gs_plan_free(&p);
  return err;
}

static const gs_precision precisions[3] = {GS_PRECISION_FLOAT32,
                                  GS_PRECISION_MIXED_FLOAT16,
                                  GS_PRECISION_MIXED_BFLOAT16};
static const char *const pnames[3] = {"float32", "mixed_float16", "mixed_bfloat16"};

static void example_case(const char *name, uint32_t micro2, uint32_t accum2) {
  gs_job_spec *s = load_example(name);
  double worst = 0;
  for (int i = 0; i < 3; i++) {
    char label[128];
    snprintf(label, sizeof label, "%s %s", name, pnames[i]);
    gs_job_spec v = with(s, 0, 0, precisions[i]);
    double err = plan_vs_measured(&v, label, NULL);
    if (err > worst) worst = err;
    /* A micro-batch / accumulation variant of the same effective batch. */
    snprintf(label, sizeof label, "%s %s %ux%u", name, pnames[i], micro2, accum2);
    v = with(s, micro2, accum2, precisions[i]);
    err = plan_vs_measured(&v, label, NULL);
    if (err > worst) worst = err;
  }
  cr_log_info("%s: worst planner error %.4f%%", name, worst * 100.0);
  free_example(s);
}

/* ------------------------------------------------ planner vs measurement --- */

Test(plan, mlp_within_5_percent) { example_case("fashion-mlp", 32, 4); }
Test(plan, cnn_within_5_percent) { example_case("fashion-cnn", 16, 8); }
Test(plan, mobilenet_within_5_percent) { example_case("fashion-mobilenet", 32, 4); }
Test(plan, resnet_within_5_percent) { example_case("fashion-resnet", 32, 4); }
Test(plan, gpt_within_5_percent) { example_case("text-gpt", 8, 4); }

/* A layer graph: a residual block, a downsampling block with a 1x1
 * projection, a concat. Its gradients live in three slots, not two: the
 * planner's count comes from the same walk the backward pass takes. */
Test(plan, graph_within_5_percent) {
  tspec *t = ts_new(28, 28, 1);
  ts_conv(t, 8, 3, 1, true, true);
  ts_name(t, "stem");
  ts_conv(t, 8, 3, 1, true, true);
  ts_conv(t, 8, 3, 1, true, false);
  ts_add_layer(t, true);
  ts_in(t, "conv2d_3", "stem", NULL);
  ts_conv(t, 16, 3, 2, true, true);
  ts_conv(t, 16, 3, 1, true, false);
  ts_conv(t, 16, 1, 2, true, false);
  ts_name(t, "proj");
  ts_in(t, "add_1", NULL);
  ts_add_layer(t, true);
  ts_in(t, "conv2d_5", "proj", NULL);
  ts_concat(t);
  ts_in(t, "add_2", "proj", NULL);
  ts_gap(t);
  ts_dense(t, 10, false);
  ts_recipe(t, 32, 1, 1, 1, GS_PRECISION_FLOAT32);
  for (int i = 0; i < 3; i++) {
    char label[128];
    snprintf(label, sizeof label, "resnet-block %s", pnames[i]);
    gs_job_spec v = with(&t->spec, 0, 0, precisions[i]);
    plan_vs_measured(&v, label, NULL);
    snprintf(label, sizeof label, "resnet-block %s 8x4", pnames[i]);
    v = with(&t->spec, 8, 4, precisions[i]);
    plan_vs_measured(&v, label, NULL);
  }
  free(t);
}

Test(plan, partial_test_batch_is_planned) {
  /* synthetic-small: test 512 examples; micro-batch 48 leaves a last test
   * micro-batch of 32, whose workspace the op scratch covers too. */
  gs_job_spec *s = load_example("synthetic-small");
  gs_job_spec v = with(s, 48, 1, -1);
  gs_dataset te;
  synth_for(&v, 512, &te);
  plan_vs_measured(&v, "synthetic-small 48x1 test 512", &te);
  gs_dataset_free(&te);
  free_example(s);
}

Test(plan, rows_and_table) {
  gs_job_spec *s = load_example("fashion-mlp");
  gs_plan p;
  cr_assert_eq(gs_plan_job(s, B, &p, &e), 0);
  cr_expect_eq(p.n_rows, 5, "flatten, 3 dense, job");
  cr_expect_str_eq(p.rows[1].layer, "dense_1");
  cr_expect_str_eq(p.rows[1].kind, "dense");
  cr_expect_str_eq(p.rows[1].output_shape, "(128, 256)");
  cr_expect_eq(p.rows[1].parameters, 784u * 256 + 256);
  cr_expect_eq(p.rows[1].bytes[GS_ROLE_WEIGHTS],
               gs_alloc_block_size(784 * 256 * 4) + gs_alloc_block_size(256 * 4));
  cr_expect_eq(p.rows[1].bytes[GS_ROLE_OPTIMIZER], 2 * p.rows[1].bytes[GS_ROLE_WEIGHTS],
               "Adam: m and v");
  cr_expect_eq(p.rows[1].bytes[GS_ROLE_MASTER], 0, "no masters in float32");
  cr_expect_eq(p.rows[0].bytes[GS_ROLE_ACTIVATIONS], 0, "Flatten aliases its input");
  cr_expect_str_eq(p.rows[4].layer, "job");
  cr_expect_gt(p.rows[4].bytes[GS_ROLE_BATCH], 0);
  cr_expect_eq(p.parameters, 235146u);
  uint64_t sum = 0;
  for (int r = 0; r < GS_ROLE_COUNT; r++) sum += p.by_role[r];
  cr_expect_eq(sum, p.peak_bytes);
  char *txt = plan_text(&p, p.peak_bytes + (1u << 20));
  cr_assert_not_null(txt);
  cr_expect(strstr(txt, "dense_1 ") && strstr(txt, "(128, 256)") &&
                strstr(txt, "200,960") && strstr(txt, "Predicted peak") &&
                strstr(txt, "fits (1.00 MiB to spare)"),
            "%s", txt);
  free(txt);
  txt = plan_text(&p, p.peak_bytes - (2u << 20));
  cr_expect(strstr(txt, "does NOT fit by 2.00 MiB"), "%s", txt);
  free(txt);
  char *js = gs_plan_json(&p, 0);
  char want[64];
  snprintf(want, sizeof want, "\"peak_bytes\":%llu", (unsigned long long)p.peak_bytes);
  cr_expect(strstr(js, want) && strstr(js, "\"layer\":\"dense_1\"") && !strstr(js, "\"fits\""),
            "%s", js);
  free(js);
  Gpushare__V1__Plan *pm;
  cr_assert_eq(gs_spec_pb_plan(&p, 1u << 20, GS_POLICY_GROWTH, &pm), 0);
  pm->summary = gs_present_plan(pm);
  cr_expect_eq(pm->n_row, 5);
  cr_expect_eq(pm->peak_bytes, p.peak_bytes);
  cr_expect(!pm->fits);
  cr_expect_eq(pm->row[1]->weights_bytes, p.rows[1].bytes[GS_ROLE_WEIGHTS]);
  cr_expect(strstr(pm->summary, "does NOT fit"));
  gpushare__v1__plan__free_unpacked(pm, NULL);
  gs_plan_free(&p);
  free_example(s);
}

Test(plan, invalid_spec_names_the_field) {
  gs_job_spec *s = load_example("fashion-mlp");
  gs_job_spec v = with(s, 0, 0, -1);
  v.batch_size = 0;
  gs_plan p;
  cr_expect_lt(gs_plan_job(&v, B, &p, &e), 0);
  cr_expect_eq(e.code, GS_INVALID_ARGUMENT);
  cr_expect_str_eq(e.field, "batch_size");
  free_example(s);
}

/* ---------------------------------------------- admission and auto-fit --- */

static uint64_t peak_of(const gs_job_spec *s, uint32_t micro, uint32_t accum,
                        int precision) {
  gs_job_spec v = with(s, micro, accum, precision);
  gs_plan p;
  cr_assert_eq(gs_plan_job(&v, B, &p, &e), 0, "%s", e.msg);
  uint64_t pk = p.peak_bytes;
  gs_plan_free(&p);
  return pk;
}

Test(plan, admission_fits_refuses_and_auto_fits) {
  /* PREALLOCATE packs the job's blocks end to end: a limit of exactly the
   * peak fits, so the boundaries below are exact. */
  const gs_alloc_policy PRE = GS_POLICY_PREALLOCATE;
  gs_job_spec *s = load_example("fashion-cnn");
  uint64_t p128 = peak_of(s, 128, 1, -1), p64 = peak_of(s, 64, 2, -1);
  cr_assert_lt(p64, p128);
  gs_admission ad;
  /* Fits as submitted. */
  cr_assert_eq(gs_plan_admit_policy(s, B, p128, PRE, false, &ad, &e), 0);
  cr_expect(ad.fits && !ad.chosen);
  cr_expect_eq(ad.micro_batch, 128);
  gs_admission_free(&ad);
  cr_assert_eq(gs_plan_admit_policy(s, B, p128 - 256, PRE, false, &ad, &e), 0);
  cr_expect(!ad.fits, "256 bytes short");
  gs_admission_free(&ad);
  /* Over the limit: refused, the suggestion is the 64 x 2 that fits. */
  uint64_t limit = p64 + 4096;
  cr_assert_eq(gs_plan_admit_policy(s, B, limit, PRE, false, &ad, &e), 0);
  cr_expect(!ad.fits && !ad.chosen);
  cr_expect_eq(ad.plan.peak_bytes, p128, "the plan of the refused spec");
  cr_expect(strstr(ad.why, "over the vdev's") && strstr(ad.why, "micro-batch 64 x 2"),
            "%s", ad.why);
  gs_admission_free(&ad);
  /* auto_fit: the largest divisor of 128 that fits, the same effective batch. */
  cr_assert_eq(gs_plan_admit_policy(s, B, limit, PRE, true, &ad, &e), 0);
  cr_expect(ad.fits && ad.chosen);
  cr_expect_eq(ad.micro_batch, 64);
  cr_expect_eq(ad.accumulation_steps, 2);
  cr_expect_eq(ad.plan.peak_bytes, p64);
  cr_expect_eq(ad.plan.micro_batch, 64);
  gs_admission_free(&ad);
  /* An effective batch of 96 (32 x 3) under a limit that only 12 x 8 meets:
   * 16 and 24 divide 96 but do not fit; 12 is the largest that does. */
  gs_job_spec v = with(s, 32, 3, -1);
  uint64_t p12 = peak_of(s, 12, 8, -1), p16 = peak_of(s, 16, 6, -1);
  cr_assert_lt(p12, p16);
  cr_assert_eq(gs_plan_admit_policy(&v, B, p12, PRE, true, &ad, &e), 0);
  cr_expect(ad.fits && ad.chosen);
  cr_expect_eq(ad.micro_batch, 12);
  cr_expect_eq(ad.accumulation_steps, 8);
  gs_admission_free(&ad);
  /* GROWTH (gs_plan_admit): what it admits or chooses fits a growth vdev. */
  cr_assert_eq(gs_plan_admit(s, B, limit, true, &ad, &e), 0);
  cr_expect(ad.fits && ad.chosen);
  cr_expect(gs_plan_fits(&ad.plan, limit, GS_POLICY_GROWTH));
  cr_expect_leq(ad.micro_batch, 64);
  gs_admission_free(&ad);
  free_example(s);
}

Test(plan, nothing_fits_names_the_dominating_role) {
  gs_job_spec *s = load_example("fashion-cnn");
  gs_admission ad;
  /* 3.3 M parameters x (weights, gradients, Adam m, v) = 52 MB: no batch
   * size fits 16 MiB. */
  cr_assert_eq(gs_plan_admit(s, B, 16u << 20, true, &ad, &e), 0);
  cr_expect(!ad.fits && !ad.chosen);
  cr_expect(strstr(ad.why, "parameters and optimizer state alone need") &&
                strstr(ad.why, "does not fit this vdev at any batch size") &&
                strstr(ad.why, "mixed precision would not help"),
            "%s", ad.why);
  gs_admission_free(&ad);
  free_example(s);
  /* mobilenet: parameters are small; one example's activations are not the
   * problem at 1 MiB, the fixed part is, but with a limit just under the
   * micro-batch-1 peak (in every precision: mixed precision's is the
   * lower, its convolutions' workspace the smaller) the message names the
   * batch-dependent role. */
  s = load_example("fashion-mobilenet");
  uint64_t p1 = peak_of(s, 1, 128, -1);
  for (size_t i = 0; i < sizeof precisions / sizeof precisions[0]; i++) {
    uint64_t pp = peak_of(s, 1, 128, (int)precisions[i]);
    p1 = pp < p1 ? pp : p1;
  }
  cr_assert_eq(gs_plan_admit(s, B, p1 - 256, true, &ad, &e), 0);
  cr_expect(!ad.fits);
  cr_expect(strstr(ad.why, "even at micro-batch 1"), "%s", ad.why);
  gs_admission_free(&ad);
  free_example(s);
}

Test(plan, suggestions_fit_and_offer_mixed_precision) {
  gs_job_spec *s = load_example("fashion-mobilenet");
  uint64_t p128 = peak_of(s, 128, 1, -1);
  uint64_t mixed = peak_of(s, 128, 1, GS_PRECISION_MIXED_BFLOAT16);
  cr_assert_lt(mixed, p128, "activations dominate mobilenet: 16-bit storage saves");
  uint64_t limit = p128 * 7 / 10;
  gs_plan_suggestion sg[4];
  size_t n = 0;
  cr_assert_eq(gs_plan_suggest(s, B, limit, sg, 4, &n, &e), 0);
  cr_assert_geq(n, 1);
  bool saw_micro = false, saw_mixed = false;
  for (size_t i = 0; i < n; i++) {
    cr_log_info("suggestion under %llu: %s", (unsigned long long)limit, sg[i].what);
    cr_expect_leq(sg[i].predicted_peak_bytes, limit, "%s", sg[i].what);
    cr_expect_eq(sg[i].saving_bytes, p128 - sg[i].predicted_peak_bytes);
    cr_expect_eq(128 % sg[i].micro_batch, 0);
    cr_expect_eq((uint64_t)sg[i].micro_batch * sg[i].accumulation_steps, 128);
    cr_expect_eq(sg[i].predicted_peak_bytes,
                 peak_of(s, sg[i].micro_batch, sg[i].accumulation_steps, sg[i].precision));
    if (sg[i].precision == GS_PRECISION_FLOAT32) {
      saw_micro = true;
      /* the largest: twice it does not fit */
      if (sg[i].micro_batch < 128)
        cr_expect_gt(peak_of(s, sg[i].micro_batch * 2, sg[i].accumulation_steps / 2, -1), limit);
    }
    if (sg[i].precision == GS_PRECISION_MIXED_BFLOAT16) {
      saw_mixed = true;
      cr_expect(strstr(sg[i].what, "mixed_bfloat16"), "%s", sg[i].what);
    }
  }
  cr_expect(saw_micro && saw_mixed);
  /* No room at all: no suggestion. */
  cr_assert_eq(gs_plan_suggest(s, B, 4096, sg, 4, &n, &e), 0);
  cr_expect_eq(n, 0);
  free_example(s);
}

/* --------------------------------------------------------- OOM reports --- */

/* A CPU backend whose device holds only `cap` bytes: regions past it are
 * refused, as a full GPU would (PHYSICAL). */
typedef struct capped {
  gs_backend b;   /* first: the runtime and allocator see a gs_backend */
  gs_backend *inner;
  size_t cap, used;
} capped;

static int capped_reserve(gs_backend *b, int dev, size_t bytes, void **region) {
  capped *c = (capped *)b;
  if (c->used + bytes > c->cap) return -ENOMEM;
  int rc = c->inner->region_reserve(c->inner, dev, bytes, region);
  if (rc == 0) c->used += bytes;
  return rc;
}

static void capped_release(gs_backend *b, int dev, void *region, size_t bytes) {
  capped *c = (capped *)b;
  c->inner->region_release(c->inner, dev, region, bytes);
  c->used -= bytes;
}

static void capped_init(capped *c, size_t cap) {
  c->inner = gs_backend_cpu();
  c->b = *c->inner;
  c->b.region_reserve = capped_reserve;
  c->b.region_release = capped_release;
  c->cap = cap;
  c->used = 0;
}

static Gpushare__V1__OomReport *fail_and_report(const gs_job_spec *s, gs_backend *b,
                                                gs_alloc *a, gs_train_failure *f) {
  gs_dataset tr;
  synth_for(s, 256, &tr);
  gs_train *t = (gs_train *)1;
  int rc = gs_train_create(s, b, a, &tr, NULL, NULL, &t, f, &e);
  cr_assert_lt(rc, 0);
  cr_assert_null(t);
  cr_assert(f->oom, "%s", e.msg);
  cr_expect_eq(e.code, GS_RESOURCE_EXHAUSTED);
  gs_alloc_stats st;
  gs_alloc_stats_get(a, &st);
  cr_expect_eq(st.in_use, 0, "the failed job returned all its memory");
  cr_expect_eq(st.live_blocks, 0);
  Gpushare__V1__OomReport *r;
  cr_assert_eq(oom_report(s, b, f, "team-a/small", &r, &e), 0, "%s", e.msg);
  gs_dataset_free(&tr);
  return r;
}

Test(plan, oom_report_quota) {
  gs_job_spec *s = load_example("fashion-mlp");
  uint64_t peak = peak_of(s, 0, 0, -1);
  uint64_t limit = peak - (64u << 10);
  gs_alloc *a;
  cr_assert_eq(gs_alloc_create(B, 0, limit, GS_POLICY_GROWTH, &a), 0);
  gs_train_failure f;
  Gpushare__V1__OomReport *r = fail_and_report(s, B, a, &f);
  cr_expect_eq(r->cause, GPUSHARE__V1__OOM_CAUSE__QUOTA);
  cr_expect_str_eq(r->layer, f.layer);
  cr_expect_str_eq(r->role, gs_role_name(f.role));
  cr_expect_str_eq(r->shape, f.shape);
  cr_expect_str_eq(r->dtype, "float32");
  cr_expect_eq(r->bytes, f.bytes);
  cr_expect_str_eq(r->vdev, "team-a/small");
  cr_expect_eq(r->limit_bytes, limit);
  cr_expect_eq(r->in_use_bytes, f.why.stats.in_use);
  cr_expect_gt(r->in_use_bytes + gs_alloc_block_size(r->bytes), limit / 256 * 256);
  cr_expect(strstr(r->explanation, "limit") && strstr(r->explanation, "quota"), "%s",
            r->explanation);
  cr_assert_geq(r->n_suggestion, 1);
  for (size_t i = 0; i < r->n_suggestion; i++)
    cr_expect_leq(r->suggestion[i]->predicted_peak_bytes, limit, "%s", r->suggestion[i]->what);
  cr_expect_eq(r->suggestion[0]->micro_batch, 64);
  cr_expect_eq(r->suggestion[0]->accumulation_steps, 2);
  char *txt = gs_present_oom(r);
  cr_expect(strstr(txt, "QUOTA") && strstr(txt, r->layer) && strstr(txt, "micro-batch 64 x 2"),
            "%s", txt);
  cr_log_info("%s", txt);
  free(txt);
  gpushare__v1__oom_report__free_unpacked(r, NULL);
  gs_alloc_trim(a);
  gs_alloc_stats st;
  gs_alloc_stats_get(a, &st);
  cr_expect_eq(st.reserved, 0, "trimmed, the vdev holds no region");
  gs_alloc_destroy(a);
  free_example(s);
}

Test(plan, oom_report_physical) {
  gs_job_spec *s = load_example("fashion-mlp");
  capped c;
  capped_init(&c, 3u << 20); /* the device: 3 MiB; the vdev's limit: 1 GiB */
  gs_alloc *a;
  cr_assert_eq(gs_alloc_create(&c.b, 0, 1ull << 30, GS_POLICY_GROWTH, &a), 0);
  gs_train_failure f;
  Gpushare__V1__OomReport *r = fail_and_report(s, &c.b, a, &f);
  cr_expect_eq(r->cause, GPUSHARE__V1__OOM_CAUSE__PHYSICAL);
  cr_expect_eq(r->limit_bytes, 1ull << 30);
  cr_expect_leq(r->reserved_bytes, 3u << 20);
  cr_expect(strstr(r->explanation, "physical device"), "%s", r->explanation);
  for (size_t i = 0; i < r->n_suggestion; i++)
    cr_expect_leq(r->suggestion[i]->predicted_peak_bytes, r->reserved_bytes, "%s",
                  r->suggestion[i]->what);
  char *txt = gs_present_oom(r);
  cr_expect(strstr(txt, "PHYSICAL"), "%s", txt);
  cr_log_info("%s", txt);
  free(txt);
  gpushare__v1__oom_report__free_unpacked(r, NULL);
  gs_alloc_destroy(a);
  cr_expect_eq(c.used, 0, "every region went back to the device");
  free_example(s);
}

Test(plan, oom_report_fragmentation) {
  /* A PREALLOCATE vdev three times the job's peak, cut into 64 KiB blocks of
   * which every other is still held: half the vdev is free, no free block
   * holds dense_1's 784 KiB kernel. */
  gs_job_spec *s = load_example("fashion-mlp");
  uint64_t peak = peak_of(s, 0, 0, -1);
  uint64_t limit = 3 * peak;
  gs_alloc *a;
  cr_assert_eq(gs_alloc_create(B, 0, limit, GS_POLICY_PREALLOCATE, &a), 0);
  size_t nb = (size_t)(limit / (64u << 10));
  void **blk = calloc(nb, sizeof *blk);
  gs_alloc_tag other = {.layer = "other_job", .role = GS_ROLE_ACTIVATIONS};
  size_t got = 0;
  while (got < nb && gs_alloc_malloc(a, 64u << 10, &other, &blk[got], NULL) == 0) got++;
  for (size_t i = 0; i < got; i += 2) gs_alloc_free(a, blk[i]);
  gs_alloc_stats st;
  gs_alloc_stats_get(a, &st);
  cr_assert_geq(st.total_free, peak, "enough free bytes in total");
  gs_dataset tr;
  synth_for(s, 256, &tr);
  gs_train *t = NULL;
  gs_train_failure f;
  cr_assert_lt(gs_train_create(s, B, a, &tr, NULL, NULL, &t, &f, &e), 0);
  cr_assert(f.oom);
  cr_expect_eq(f.why.cause, GS_OOM_FRAGMENTATION);
  gs_alloc_stats_get(a, &st);
  cr_expect_eq(st.live_blocks, got / 2, "only the other job's blocks are live");
  Gpushare__V1__OomReport *r;
  cr_assert_eq(oom_report(s, B, &f, NULL, &r, &e), 0);
  cr_expect_eq(r->cause, GPUSHARE__V1__OOM_CAUSE__FRAGMENTATION);
  cr_expect_gt(r->fragmentation, 0.5f);
  cr_expect_lt(r->largest_free_bytes, gs_alloc_block_size(r->bytes));
  cr_expect(strstr(r->explanation, "fragmented"), "%s", r->explanation);
  char *txt = gs_present_oom(r);
  cr_expect(strstr(txt, "FRAGMENTATION"), "%s", txt);
  free(txt);
  gpushare__v1__oom_report__free_unpacked(r, NULL);
  for (size_t i = 1; i < got; i += 2) gs_alloc_free(a, blk[i]);
  free(blk);
  gs_alloc_destroy(a);
  gs_dataset_free(&tr);
  free_example(s);
}

Test(plan, oom_report_refuses_a_non_oom_failure) {
  gs_train_failure f;
  memset(&f, 0, sizeof f);
  Gpushare__V1__OomReport *r = (Gpushare__V1__OomReport *)1;
  cr_expect_eq(oom_report(NULL, B, &f, NULL, &r, &e), -EINVAL);
  cr_expect_null(r);
}

/* ------------------------------------------------------ memory timeline --- */

Test(plan, timeline_per_step_and_at_peak) {
  gs_job_spec *s = load_example("synthetic-small");
  gs_plan p;
  cr_assert_eq(gs_plan_job(s, B, &p, &e), 0);
  gs_dataset tr;
  synth_for(s, 64 * 3, &tr);
  gs_alloc *a;
  cr_assert_eq(gs_alloc_create(B, 0, 64u << 20, GS_POLICY_GROWTH, &a), 0);
  gs_train *t;
  gs_train_failure f;
  cr_assert_eq(gs_train_create(s, B, a, &tr, NULL, NULL, &t, &f, &e), 0, "%s", e.msg);
  bool done;
  cr_assert_eq(gs_train_steps(t, 3, &done, &e), 0, "%s", e.msg);
  Gpushare__V1__MemoryTimeline *tl;
  cr_assert_eq(timeline_msg(t, p.peak_bytes, &tl), 0);
  cr_assert_eq(tl->n_step, 3);
  for (size_t i = 0; i < 3; i++) {
    cr_expect_eq(tl->step[i]->step, i + 1);
    cr_expect_eq(tl->step[i]->peak_in_use_bytes, p.peak_bytes,
                 "nothing is allocated per step: each step's peak is the job's");
  }
  cr_expect_eq(tl->peak_bytes, p.peak_bytes);
  cr_expect_eq(tl->planned_peak_bytes, p.peak_bytes);
  /* flatten holds nothing: dense_1, dense_2, job */
  cr_assert_eq(tl->n_at_peak, 3);
  cr_expect_str_eq(tl->at_peak[0]->layer, "dense_1");
  cr_expect_str_eq(tl->at_peak[2]->layer, "job");
  uint64_t sum = 0;
  for (size_t i = 0; i < tl->n_at_peak; i++) {
    const Gpushare__V1__PlanRow *r = tl->at_peak[i];
    sum += r->weights_bytes + r->master_bytes + r->gradient_bytes + r->optimizer_bytes +
           r->activation_bytes + r->workspace_bytes + r->batch_bytes;
  }
  cr_expect_eq(sum, p.peak_bytes);
  cr_expect_eq(tl->at_peak[0]->master_bytes, p.rows[1].bytes[GS_ROLE_MASTER]);
  char *txt = gs_present_timeline(tl);
  cr_expect(strstr(txt, "  step 3 ") && strstr(txt, "dense_1") &&
                strstr(txt, "(measured is 100.0% of planned)"),
            "%s", txt);
  free(txt);
  gpushare__v1__memory_timeline__free_unpacked(tl, NULL);
  gs_train_destroy(t);
  gs_alloc_destroy(a);
  gs_dataset_free(&tr);
  gs_plan_free(&p);
  free_example(s);
}

Test(plan, timeline_merges_long_runs) {
  /* 1100 steps of a tiny job: the table stays bounded, entries cover more
   * steps each, the last entry ends at the last step. */
  gs_job_spec *s = load_example("synthetic-small");
  gs_job_spec v = with(s, 4, 1, GS_PRECISION_FLOAT32);
  gs_dataset tr;
  synth_for(&v, 4 * 1100, &tr);
  gs_alloc *a;
  cr_assert_eq(gs_alloc_create(B, 0, 64u << 20, GS_POLICY_GROWTH, &a), 0);
  gs_train *t;
  gs_train_failure f;
  gs_train_options o = {.threads = 1, .epochs = 1};
  cr_assert_eq(gs_train_create(&v, B, a, &tr, NULL, &o, &t, &f, &e), 0, "%s", e.msg);
  bool done;
  cr_assert_eq(gs_train_steps(t, 1100, &done, &e), 0, "%s", e.msg);
  Gpushare__V1__MemoryTimeline *tl;
  cr_assert_eq(timeline_msg(t, 0, &tl), 0);
  cr_expect_leq(tl->n_step, GS_TRAIN_TIMELINE_MAX);
  cr_expect_gt(tl->n_step, GS_TRAIN_TIMELINE_MAX / 4);
  cr_expect_eq(tl->step[tl->n_step - 1]->step, 1100);
  for (size_t i = 1; i < tl->n_step; i++)
    cr_expect_gt(tl->step[i]->step, tl->step[i - 1]->step);
  cr_expect(!tl->has_planned_peak_bytes);
  gpushare__v1__memory_timeline__free_unpacked(tl, NULL);
  gs_train_destroy(t);
  gs_alloc_destroy(a);
  gs_dataset_free(&tr);
  free_example(s);
}

/* ------------------------------------------- fitting a limit, by policy --- */

/* gs_plan_fits against the allocator itself: for limits from just under
 * the peak to twice it, a job is placed by a fresh vdev exactly when the
 * planner says it fits, under both policies. GROWTH is the interesting
 * one: its regions can leave no room for a large late buffer (mobilenet's
 * op workspace) though the sum fits. */
static bool creates(const gs_job_spec *s, uint64_t limit, gs_alloc_policy pol,
                    const gs_dataset *tr) {
  gs_alloc *a;
  cr_assert_eq(gs_alloc_create(B, 0, limit, pol, &a), 0);
  gs_train *t = NULL;
  gs_train_failure f;
  gs_err e2;
  int rc = gs_train_create(s, B, a, tr, NULL, NULL, &t, &f, &e2);
  if (rc) cr_assert(f.oom, "%s", e2.msg);
  gs_train_destroy(t);
  gs_alloc_destroy(a);
  return rc == 0;
}

Test(plan, fits_matches_the_allocator_by_policy) {
  gs_job_spec *s = load_example("fashion-mobilenet");
  const char *const pn[2] = {"preallocate", "growth"};
  for (uint32_t micro = 16; micro <= 64; micro *= 2) {
    gs_job_spec v = with(s, micro, 128 / micro, -1);
    gs_plan p;
    cr_assert_eq(gs_plan_job(&v, B, &p, &e), 0);
    gs_dataset tr;
    synth_for(&v, 128, &tr);
    int growth_refusals_under_2x = 0;
    for (int pol = 0; pol < 2; pol++)
      for (uint64_t lim = p.peak_bytes - 4096; lim <= 2 * p.peak_bytes; lim += p.peak_bytes / 16) {
        bool planned = gs_plan_fits(&p, lim, (gs_alloc_policy)pol);
        bool real = creates(&v, lim, (gs_alloc_policy)pol, &tr);
        cr_expect_eq(planned, real, "micro-batch %u, %s, limit %llu (peak %llu): plan says %d, "
                     "the allocator %d", micro, pn[pol], (unsigned long long)lim,
                     (unsigned long long)p.peak_bytes, planned, real);
        if (pol == GS_POLICY_GROWTH && lim >= p.peak_bytes && !real) growth_refusals_under_2x++;
      }
    cr_log_info("micro-batch %u: growth refused %d limits above the peak", micro,
                growth_refusals_under_2x);
    gs_dataset_free(&tr);
    gs_plan_free(&p);
  }
  free_example(s);
}
