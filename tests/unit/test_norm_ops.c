/*
 * test_norm_ops.c: the cpu backend's normalisation and element-wise ops
 * (cpu_norm.c) against plain definitions.
 *
 * Each op is checked on odd shapes (C = 7, M = 13, ...):
 *  - forward against a double-precision reference written straight from
 *    the formulas of backend.h;
 *  - backward (every gradient: input, gamma, beta) against central finite
 *    differences of the double reference on the scalar loss sum(out * R),
 *    R fixed and random; weight gradients start from non-zero values to
 *    check they accumulate;
 *  - fp16/bf16 storage against the fp32 op on the same rounded inputs,
 *    within the tolerance stated at each check;
 *  - one thread against three: the same bits (the reductions are split by
 *    the shape, not by the thread count).
 * Workspaces are allocated with exactly the queried bytes, so an op that
 * needs more shows up under ASan.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "test_ops_util.h"

/* ---- helpers ---- */

/* x[i] = random values in [offset - scale, offset + scale), exact in dt */
static void fill(gs_dtype dt, double *x, size_t n, double offset, double scale) {
  for (size_t i = 0; i < n; i++)
    x[i] = round_dt(dt, offset + urand() * scale);
}

static double *dalloc(size_t n) {
  double *p = calloc(n + 1, sizeof *p);
  cr_assert(p);
  return p;
}

static float *falloc(size_t n) {
  float *p = calloc(n + 1, sizeof *p);
  cr_assert(p);
  return p;
}

static gs_backend *B;
static gs_exec *EX;  /* 2 threads */
static gs_exec *EX1; /* 1 thread */
static gs_exec *EX3; /* 3 threads */

static gs_exec *make_ex(int threads) {
  gs_exec *ex = NULL;
  gs_exec_config cfg = {.threads = threads, .device_index = 0};
  cr_assert_eq(B->exec_create(B, &cfg, &ex), 0);
  return ex;
}

static void setup_ex(void) {
  B = gs_backend_cpu();
  EX = make_ex(2);
  EX1 = make_ex(1);
  EX3 = make_ex(3);
  ops_seed();
}

static void teardown_ex(void) {
  B->exec_destroy(EX);
  B->exec_destroy(EX1);
  B->exec_destroy(EX3);
}

static void expect_bits(const char *what, const void *a, const void *b, size_t bytes) {
  cr_assert(memcmp(a, b, bytes) == 0, "%s: not the same bits", what);
}

TestSuite(norm, .init = setup_ex, .fini = teardown_ex);

static const gs_dtype ALL_DT[3] = {GS_F32, GS_F16, GS_BF16};

/* ---- residual sums ---- */

/* add_forward and accumulate: the fp32 sum of the stored values, rounded
 * once to dt, bit for bit; in place (out = a, out = b) the same bits; one
 * thread and three the same bits. count crosses the op's grain. */
Test(norm, add_and_accumulate) {
  const size_t n = 20011;
  for (int d = 0; d < 3; d++) {
    gs_dtype dt = ALL_DT[d];
    size_t es = gs_dtype_size(dt);
    double *a = dalloc(n), *b = dalloc(n);
    fill(dt, a, n, 0, 3);
    fill(dt, b, n, 0, 3);
    void *pa = to_dt(dt, a, n), *pb = to_dt(dt, b, n), *out = malloc(n * es + 1);
    void *ref = malloc(n * es + 1);
    for (size_t i = 0; i < n; i++) {
      double s = (float)((float)a[i] + (float)b[i]);
      if (dt == GS_F32)
        ((float *)ref)[i] = (float)s;
      else if (dt == GS_F16)
        ((uint16_t *)ref)[i] = gs_f32_to_f16((float)s);
      else
        ((uint16_t *)ref)[i] = gs_f32_to_bf16((float)s);
    }
    gs_exec *exs[3] = {EX1, EX, EX3};
    for (int e = 0; e < 3; e++) {
      memset(out, 0xa5, n * es);
      cr_assert_eq(B->add_forward(exs[e], dt, out, pa, pb, n), 0);
      cr_assert(memcmp(out, ref, n * es) == 0, "add %s, %d threads", gs_dtype_name(dt), e + 1);
      /* accumulate into a copy of a */
      memcpy(out, pa, n * es);
      cr_assert_eq(B->accumulate(exs[e], dt, out, pb, n), 0);
      cr_assert(memcmp(out, ref, n * es) == 0, "accumulate %s, %d threads", gs_dtype_name(dt),
                e + 1);
    }
    /* out aliasing a, then b */
    void *ca = to_dt(dt, a, n), *cb = to_dt(dt, b, n);
    cr_assert_eq(B->add_forward(EX, dt, ca, ca, pb, n), 0);
    cr_assert(memcmp(ca, ref, n * es) == 0, "add %s, out = a", gs_dtype_name(dt));
    cr_assert_eq(B->add_forward(EX, dt, cb, pa, cb, n), 0);
    cr_assert(memcmp(cb, ref, n * es) == 0, "add %s, out = b", gs_dtype_name(dt));
    /* accumulate onto itself doubles */
    memcpy(ca, pa, n * es);
    cr_assert_eq(B->accumulate(EX, dt, ca, ca, n), 0);
    for (size_t i = 0; i < n; i++)
      cr_assert_eq(get_dt(dt, ca, i), round_dt(dt, 2 * a[i]), "%s: a + a at %zu",
                   gs_dtype_name(dt), i);
    /* count 0 touches nothing */
    cr_assert_eq(B->add_forward(EX, dt, NULL, NULL, NULL, 0), 0);
    cr_assert_eq(B->accumulate(EX, dt, NULL, NULL, 0), 0);
    free(a), free(b), free(pa), free(pb), free(out), free(ref), free(ca), free(cb);
  }
}

/* ---- batch and layer normalisation ---- */

/* One case of either norm, in double: in (M, C), gamma and beta (C), the
 * loss weights R (M, C); ref_forward fills y and the statistics. */
typedef struct norm_ref {
  bool layer;            /* LayerNorm (per row) or BatchNorm (per channel) */
  size_t m, c;
  double eps;
  double *x, *g, *b, *r;
  double *y, *mean, *var; /* out (M, C); statistics (C) or (M), biased var */
} norm_ref;

static void norm_ref_init(norm_ref *t, bool layer, size_t m, size_t c, gs_dtype dt,
                          double offset) {
  memset(t, 0, sizeof *t);
  t->layer = layer;
  t->m = m;
  t->c = c;
  t->eps = 1e-5;
  size_t ns = layer ? m : c;
  t->x = dalloc(m * c), t->r = dalloc(m * c), t->y = dalloc(m * c);
  t->g = dalloc(c), t->b = dalloc(c), t->mean = dalloc(ns), t->var = dalloc(ns);
  fill(dt, t->x, m * c, offset, 1);
  fill(dt, t->r, m * c, 0, 1);
  fill(dt, t->g, c, 1, 0.5);
  fill(dt, t->b, c, 0, 0.5);
}

static void norm_ref_free(norm_ref *t) {
  free(t->x), free(t->r), free(t->y), free(t->g), free(t->b), free(t->mean), free(t->var);
}

static void norm_ref_forward(norm_ref *t) {
  size_t m = t->m, c = t->c;
  size_t ns = t->layer ? m : c, n = t->layer ? c : m; /* statistics, values in each */
  for (size_t s = 0; s < ns; s++) {
    double sum = 0, sq = 0;
    for (size_t k = 0; k < n; k++)
      sum += t->x[t->layer ? s * c + k : k * c + s];
    double mu = sum / (double)n;
    for (size_t k = 0; k < n; k++) {
      double d = t->x[t->layer ? s * c + k : k * c + s] - mu;
      sq += d * d;
    }
    t->mean[s] = mu;
    t->var[s] = sq / (double)n;
  }
  for (size_t i = 0; i < m; i++)
    for (size_t j = 0; j < c; j++) {
      size_t s = t->layer ? i : j;
      t->y[i * c + j] =
          (t->x[i * c + j] - t->mean[s]) / sqrt(t->var[s] + t->eps) * t->g[j] + t->b[j];
    }
}

static double norm_loss(void *ctx) {
  norm_ref *t = ctx;
  norm_ref_forward(t);
  double l = 0;
  for (size_t i = 0; i < t->m * t->c; i++)
    l += t->y[i] * t->r[i];
  return l;
}

/* What one run of an op gives: out and din in dt, the rest fp32. */
typedef struct norm_out {
  void *out, *din;
  float *mean, *rstd, *rm, *rv, *dg, *db;
} norm_out;

static void norm_out_free(norm_out *o) {
  free(o->out), free(o->din), free(o->mean), free(o->rstd), free(o->rm), free(o->rv);
  free(o->dg), free(o->db);
}

/* Running statistics and gradients start from these (accumulation). */
static float rm0(size_t i) { return 0.25f + 0.01f * (float)i; }
static float rv0(size_t i) { return 1.5f - 0.001f * (float)i; }
static const float DG0 = 0.5f, DB0 = -0.25f;

/* The op on ex in dt over t's inputs (rounded to dt): forward (training
 * for BatchNorm), then backward with dout = R. */
static void norm_run(gs_exec *ex, gs_dtype dt, const norm_ref *t, norm_out *o) {
  size_t m = t->m, c = t->c, es = gs_dtype_size(dt), ns = t->layer ? m : c;
  void *x = to_dt(dt, t->x, m * c), *g = to_dt(dt, t->g, c), *b = to_dt(dt, t->b, c);
  void *d = to_dt(dt, t->r, m * c);
  memset(o, 0, sizeof *o);
  o->out = malloc(m * c * es + 1), o->din = malloc(m * c * es + 1);
  o->mean = falloc(ns), o->rstd = falloc(ns), o->rm = falloc(c), o->rv = falloc(c);
  o->dg = falloc(c), o->db = falloc(c);
  for (size_t i = 0; i < c; i++) {
    o->rm[i] = rm0(i), o->rv[i] = rv0(i);
    o->dg[i] = DG0, o->db[i] = DB0;
  }
  void *ws;
  if (t->layer) {
    cr_assert_eq(B->layernorm_forward(ex, dt, o->out, o->mean, o->rstd, x, g, b, (uint32_t)m,
                                      (uint32_t)c, (float)t->eps), 0);
    ws = ws_alloc(B->layernorm_workspace(dt, (uint32_t)m, (uint32_t)c));
    cr_assert_eq(B->layernorm_backward(ex, dt, o->din, o->dg, o->db, d, x, g, o->mean, o->rstd,
                                       (uint32_t)m, (uint32_t)c, ws), 0);
  } else {
    ws = ws_alloc(B->batchnorm_workspace(dt, (uint32_t)m, (uint32_t)c));
    cr_assert_eq(B->batchnorm_forward(ex, dt, o->out, o->mean, o->rstd, o->rm, o->rv, x, g, b,
                                      (uint32_t)m, (uint32_t)c, (float)t->eps, 0.1f, true, ws),
                 0);
    cr_assert_eq(B->batchnorm_backward(ex, dt, o->din, o->dg, o->db, d, x, g, o->mean, o->rstd,
                                       (uint32_t)m, (uint32_t)c, ws), 0);
  }
  free(x), free(g), free(b), free(d), free(ws);
}

/* fp32: forward and statistics against the double definition, every
 * gradient against central differences. */
static void norm_check_fp32(bool layer, size_t m, size_t c) {
  norm_ref t;
  norm_ref_init(&t, layer, m, c, GS_F32, 0.5);
  norm_out o;
  norm_run(EX, GS_F32, &t, &o);
  char what[64];
  snprintf(what, sizeof what, "%s M=%zu C=%zu", layer ? "layernorm" : "batchnorm", m, c);
  norm_ref_forward(&t);
  for (size_t i = 0; i < m * c; i++)
    expect_close(what, "out", i, ((float *)o.out)[i], t.y[i], 1e-5, 1e-5);
  for (size_t s = 0; s < (layer ? m : c); s++) {
    expect_close(what, "mean", s, o.mean[s], t.mean[s], 1e-7, 1e-6);
    expect_close(what, "rstd", s, o.rstd[s], 1 / sqrt(t.var[s] + t.eps), 0, 1e-6);
  }
  if (!layer)
    for (size_t j = 0; j < c; j++) {
      double unbiased = m > 1 ? t.var[j] * (double)m / (double)(m - 1) : t.var[j];
      expect_close(what, "running_mean", j, o.rm[j], 0.9 * rm0(j) + 0.1 * t.mean[j], 1e-7, 1e-6);
      expect_close(what, "running_var", j, o.rv[j], 0.9 * rv0(j) + 0.1 * unbiased, 1e-7, 1e-6);
    }
  double *fd = dalloc(m * c);
  fd_grad(norm_loss, &t, t.x, m * c, 1e-4, fd);
  for (size_t i = 0; i < m * c; i++)
    expect_close(what, "din", i, ((float *)o.din)[i], fd[i], 1e-5, 1e-4);
  fd_grad(norm_loss, &t, t.g, c, 1e-4, fd);
  for (size_t j = 0; j < c; j++)
    expect_close(what, "dgamma", j, (double)o.dg[j] - DG0, fd[j], 1e-6, 2e-6);
  fd_grad(norm_loss, &t, t.b, c, 1e-4, fd);
  for (size_t j = 0; j < c; j++)
    expect_close(what, "dbeta", j, (double)o.db[j] - DB0, fd[j], 1e-6, 2e-6);
  free(fd);
  norm_out_free(&o);
  norm_ref_free(&t);
}

/* 16-bit storage against fp32 on the same rounded inputs: the math is the
 * same fp32 on the same values, so the statistics and the fp32 gradients
 * have the same bits, and out and din differ by their final rounding. */
static void norm_check_16(bool layer, size_t m, size_t c, gs_dtype dt) {
  norm_ref t;
  norm_ref_init(&t, layer, m, c, dt, 0.5);
  norm_out a, b;
  norm_run(EX, dt, &t, &a);
  norm_run(EX, GS_F32, &t, &b);
  char what[80];
  snprintf(what, sizeof what, "%s M=%zu C=%zu (%s)", layer ? "layernorm" : "batchnorm", m, c,
           gs_dtype_name(dt));
  size_t ns = layer ? m : c;
  expect_bits(what, a.mean, b.mean, ns * 4);
  expect_bits(what, a.rstd, b.rstd, ns * 4);
  expect_bits(what, a.rm, b.rm, c * 4);
  expect_bits(what, a.rv, b.rv, c * 4);
  expect_bits(what, a.dg, b.dg, c * 4);
  expect_bits(what, a.db, b.db, c * 4);
  for (size_t i = 0; i < m * c; i++) {
    expect_close(what, "out", i, get_dt(dt, a.out, i), ((float *)b.out)[i], 1e-6, eps_dt(dt));
    expect_close(what, "din", i, get_dt(dt, a.din, i), ((float *)b.din)[i], 1e-6, eps_dt(dt));
  }
  norm_out_free(&a);
  norm_out_free(&b);
  norm_ref_free(&t);
}

/* One thread and three: the same bits, every output. */
static void norm_check_threads(bool layer, size_t m, size_t c, gs_dtype dt) {
  norm_ref t;
  norm_ref_init(&t, layer, m, c, dt, 0.5);
  norm_out a, b;
  norm_run(EX1, dt, &t, &a);
  norm_run(EX3, dt, &t, &b);
  char what[80];
  snprintf(what, sizeof what, "%s M=%zu C=%zu (%s), 1 vs 3 threads",
           layer ? "layernorm" : "batchnorm", m, c, gs_dtype_name(dt));
  size_t ns = layer ? m : c, es = gs_dtype_size(dt);
  expect_bits(what, a.out, b.out, m * c * es);
  expect_bits(what, a.din, b.din, m * c * es);
  expect_bits(what, a.mean, b.mean, ns * 4);
  expect_bits(what, a.rstd, b.rstd, ns * 4);
  expect_bits(what, a.rm, b.rm, c * 4);
  expect_bits(what, a.rv, b.rv, c * 4);
  expect_bits(what, a.dg, b.dg, c * 4);
  expect_bits(what, a.db, b.db, c * 4);
  norm_out_free(&a);
  norm_out_free(&b);
  norm_ref_free(&t);
}

/* M x C: odd, a single row or two, many chunks, C past the 512 block */
static const size_t NORM_SHAPES[][2] = {{13, 7}, {2, 3}, {300, 5}, {3, 600}, {70, 1}};
#define NNORM (sizeof NORM_SHAPES / sizeof NORM_SHAPES[0])

Test(norm, batchnorm_fp32_forward_and_gradients) {
  for (size_t i = 0; i < NNORM; i++)
    norm_check_fp32(false, NORM_SHAPES[i][0], NORM_SHAPES[i][1]);
}

Test(norm, batchnorm_16bit_matches_fp32) {
  for (size_t i = 0; i < NNORM; i++) {
    norm_check_16(false, NORM_SHAPES[i][0], NORM_SHAPES[i][1], GS_F16);
    norm_check_16(false, NORM_SHAPES[i][0], NORM_SHAPES[i][1], GS_BF16);
  }
}

Test(norm, batchnorm_threads_same_bits) {
  norm_check_threads(false, 3001, 37, GS_F32);
  norm_check_threads(false, 3001, 37, GS_BF16);
}

/* 128 images of 28x28, values 100 + [-1, 1): the statistics of a large,
 * offset batch within fp32 rounding of the double definition (a one-pass
 * sum of squares would lose most digits of the variance here). */
Test(norm, batchnorm_large_batch_accuracy) {
  const size_t m = 128 * 28 * 28, c = 3;
  norm_ref t;
  norm_ref_init(&t, false, m, c, GS_F32, 100);
  float *x = to_dt(GS_F32, t.x, m * c), *g = to_dt(GS_F32, t.g, c), *b = to_dt(GS_F32, t.b, c);
  float *out = falloc(m * c), *mean = falloc(c), *rstd = falloc(c), *rm = falloc(c),
        *rv = falloc(c);
  void *ws = ws_alloc(B->batchnorm_workspace(GS_F32, m, c));
  cr_assert_eq(B->batchnorm_forward(EX, GS_F32, out, mean, rstd, rm, rv, x, g, b, m, c, 1e-5f,
                                    0.1f, true, ws),
               0);
  norm_ref_forward(&t);
  for (size_t j = 0; j < c; j++) {
    expect_close("large batch", "mean", j, mean[j], t.mean[j], 0, 1e-7);
    expect_close("large batch", "rstd", j, rstd[j], 1 / sqrt(t.var[j] + 1e-5), 0, 1e-6);
  }
  free(x), free(g), free(b), free(out), free(mean), free(rstd), free(rm), free(rv), free(ws);
  norm_ref_free(&t);
}

/* Evaluation: the running statistics normalise, nothing else changes;
 * mean and rstd may be NULL. M = 1 in training: running_var takes the
 * biased variance (0). */
Test(norm, batchnorm_eval_and_single_row) {
  const size_t m = 13, c = 7;
  norm_ref t;
  norm_ref_init(&t, false, m, c, GS_F32, 0.5);
  float *x = to_dt(GS_F32, t.x, m * c), *g = to_dt(GS_F32, t.g, c), *b = to_dt(GS_F32, t.b, c);
  float *out = falloc(m * c), *rm = falloc(c), *rv = falloc(c);
  for (size_t j = 0; j < c; j++)
    rm[j] = rm0(j), rv[j] = rv0(j);
  void *ws = ws_alloc(B->batchnorm_workspace(GS_F32, m, c));
  cr_assert_eq(B->batchnorm_forward(EX, GS_F32, out, NULL, NULL, rm, rv, x, g, b, m, c, 1e-5f,
                                    0.1f, false, ws),
               0);
  for (size_t j = 0; j < c; j++) {
    cr_assert_eq(rm[j], rm0(j), "running_mean[%zu] changed in evaluation", j);
    cr_assert_eq(rv[j], rv0(j), "running_var[%zu] changed in evaluation", j);
  }
  for (size_t i = 0; i < m; i++)
    for (size_t j = 0; j < c; j++) {
      double want = (t.x[i * c + j] - rm0(j)) / sqrt((double)rv0(j) + 1e-5) * t.g[j] + t.b[j];
      expect_close("batchnorm eval", "out", i * c + j, out[i * c + j], want, 1e-6, 1e-6);
    }
  free(ws);
  ws = ws_alloc(B->batchnorm_workspace(GS_F32, 1, c));
  float mean[7], rstd[7];
  cr_assert_eq(B->batchnorm_forward(EX, GS_F32, out, mean, rstd, rm, rv, x, g, b, 1, c, 1e-5f,
                                    0.1f, true, ws),
               0);
  for (size_t j = 0; j < c; j++) {
    cr_assert_eq(mean[j], x[j]);
    expect_close("batchnorm M=1", "running_var", j, rv[j], 0.9 * rv0(j), 1e-7, 1e-6);
    expect_close("batchnorm M=1", "out", j, out[j], t.b[j], 1e-6, 0);
  }
  free(x), free(g), free(b), free(out), free(rm), free(rv), free(ws);
  norm_ref_free(&t);
}

Test(norm, layernorm_fp32_forward_and_gradients) {
  for (size_t i = 0; i < NNORM; i++)
    norm_check_fp32(true, NORM_SHAPES[i][0], NORM_SHAPES[i][1]);
}

Test(norm, layernorm_16bit_matches_fp32) {
  for (size_t i = 0; i < NNORM; i++) {
    norm_check_16(true, NORM_SHAPES[i][0], NORM_SHAPES[i][1], GS_F16);
    norm_check_16(true, NORM_SHAPES[i][0], NORM_SHAPES[i][1], GS_BF16);
  }
}

Test(norm, layernorm_threads_same_bits) {
  norm_check_threads(true, 3001, 37, GS_F32);
  norm_check_threads(true, 3001, 37, GS_F16);
}

/* ---- GELU ---- */

static double gelu_ref(double x) {
  const double k = sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + tanh(k * (x + 0.044715 * x * x * x)));
}

typedef struct gelu_ctx {
  size_t n;
  double *x, *r;
} gelu_ctx;

/* fp32 forward against the definition, din against central differences;
 * 16-bit against fp32 on the same rounded inputs; in place (out = in,
 * din = dout) and 1 against 3 threads, the same bits. */
Test(norm, gelu) {
  const size_t n = 10007; /* past the op's grain: split over the threads */
  for (int d = 0; d < 3; d++) {
    gs_dtype dt = ALL_DT[d];
    size_t es = gs_dtype_size(dt);
    gelu_ctx t = {.n = n, .x = dalloc(n), .r = dalloc(n)};
    fill(dt, t.x, n, 0, 6);
    fill(dt, t.r, n, 0, 1);
    t.x[0] = 0, t.x[1] = -10, t.x[2] = 10; /* the flat ends */
    void *x = to_dt(dt, t.x, n), *dy = to_dt(dt, t.r, n);
    void *y = malloc(n * es + 1), *g = malloc(n * es + 1);
    cr_assert_eq(B->gelu_forward(EX, dt, y, x, n), 0);
    cr_assert_eq(B->gelu_backward(EX, dt, g, dy, x, n), 0);
    char what[48];
    snprintf(what, sizeof what, "gelu (%s)", gs_dtype_name(dt));
    if (dt == GS_F32) {
      /* element-wise: d sum(out * R) / d x[i] involves out[i] alone, so
       * the central difference is taken per element */
      const double h = 1e-4;
      for (size_t i = 0; i < n; i++) {
        double fd = (gelu_ref(t.x[i] + h) - gelu_ref(t.x[i] - h)) / (2 * h) * t.r[i];
        expect_close(what, "out", i, ((float *)y)[i], gelu_ref(t.x[i]), 1e-6, 1e-6);
        expect_close(what, "din", i, ((float *)g)[i], fd, 1e-6, 1e-5);
      }
    } else { /* the fp32 op on the same rounded values, then one rounding */
      float *y32 = falloc(n), *g32 = falloc(n), *x32 = falloc(n), *d32 = falloc(n);
      for (size_t i = 0; i < n; i++)
        x32[i] = (float)t.x[i], d32[i] = (float)t.r[i];
      cr_assert_eq(B->gelu_forward(EX, GS_F32, y32, x32, n), 0);
      cr_assert_eq(B->gelu_backward(EX, GS_F32, g32, d32, x32, n), 0);
      for (size_t i = 0; i < n; i++) {
        expect_close(what, "out", i, get_dt(dt, y, i), y32[i], 1e-7, eps_dt(dt));
        expect_close(what, "din", i, get_dt(dt, g, i), g32[i], 1e-7, eps_dt(dt));
      }
      free(y32), free(g32), free(x32), free(d32);
    }
    /* 1 and 3 threads; in place */
    void *y1 = malloc(n * es + 1), *g1 = malloc(n * es + 1);
    cr_assert_eq(B->gelu_forward(EX1, dt, y1, x, n), 0);
    cr_assert_eq(B->gelu_backward(EX3, dt, g1, dy, x, n), 0);
    expect_bits(what, y1, y, n * es);
    expect_bits(what, g1, g, n * es);
    memcpy(g1, dy, n * es);
    cr_assert_eq(B->gelu_backward(EX, dt, g1, g1, x, n), 0);
    expect_bits(what, g1, g, n * es);
    cr_assert_eq(B->gelu_forward(EX, dt, x, x, n), 0);
    expect_bits(what, x, y, n * es);
    free(t.x), free(t.r), free(x), free(dy), free(y), free(g), free(y1), free(g1);
  }
}

/* ---- dropout ---- */

/* The mask as backend.h defines it, written out again here. */
static uint64_t splitmix(uint64_t seed, uint64_t i) {
  uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static bool kept(uint64_t seed, size_t i, float rate) {
  return (double)(splitmix(seed, i) >> 40) >= ceil((double)rate * 16777216.0);
}

/* The hash is splitmix64: its published first outputs for seed 1234567. */
Test(norm, dropout_hash_is_splitmix64) {
  const uint64_t want[5] = {6457827717110365317ull, 3203168211198807973ull,
                            9817491932198370423ull, 4593380528125082431ull,
                            16408922859458223821ull};
  for (int i = 0; i < 5; i++)
    cr_assert_eq(splitmix(1234567, (uint64_t)i), want[i], "output %d", i);
}

/* The op's mask is the definition's (every element, bit for bit, as x *
 * scale rounded once or +0); the kept fraction is within 6 standard
 * deviations of 1 - rate; the backward is dout * mask / (1 - rate) from
 * the same seed; another seed gives another mask; 1 and 3 threads and in
 * place the same bits. */
Test(norm, dropout) {
  const size_t n = 100003;
  const float rates[] = {0.0f, 0.1f, 0.5f, 0.9f};
  const uint64_t seeds[] = {0, 42, 0xdeadbeefcafef00dull};
  for (int d = 0; d < 3; d++) {
    gs_dtype dt = ALL_DT[d];
    size_t es = gs_dtype_size(dt);
    double *xv = dalloc(n);
    fill(dt, xv, n, 0, 4);
    void *x = to_dt(dt, xv, n), *y = malloc(n * es + 1), *y1 = malloc(n * es + 1);
    void *g = malloc(n * es + 1);
    for (size_t ri = 0; ri < sizeof rates / sizeof rates[0]; ri++)
      for (size_t si = 0; si < sizeof seeds / sizeof seeds[0]; si++) {
        float rate = rates[ri];
        uint64_t seed = seeds[si];
        float scale = 1.0f / (1.0f - rate);
        cr_assert_eq(B->dropout_forward(EX, dt, y, x, n, rate, seed), 0);
        cr_assert_eq(B->dropout_backward(EX, dt, g, x, n, rate, seed), 0); /* dout = x */
        size_t nkept = 0;
        for (size_t i = 0; i < n; i++) {
          bool k = kept(seed, i, rate);
          nkept += k;
          double want = k ? round_dt(dt, (float)xv[i] * scale) : 0.0;
          cr_assert_eq(get_dt(dt, y, i), want, "%s rate %g seed %llu: out[%zu]",
                       gs_dtype_name(dt), rate, (unsigned long long)seed, i);
          if (!k)
            cr_assert(!signbit(get_dt(dt, y, i)), "a dropped element is +0");
        }
        expect_bits("dropout backward = forward of dout", g, y, n * es);
        double p = 1.0 - rate, sd = sqrt((double)n * p * rate);
        cr_assert(fabs((double)nkept - (double)n * p) <= 6 * sd + 0.5,
                  "rate %g: kept %zu of %zu", rate, nkept, n);
        if (rate == 0.0f)
          expect_bits("rate 0 keeps everything unscaled", y, x, n * es);
        cr_assert_eq(B->dropout_forward(EX1, dt, y1, x, n, rate, seed), 0);
        expect_bits("dropout, 1 vs 2 threads", y1, y, n * es);
        cr_assert_eq(B->dropout_forward(EX3, dt, y1, x, n, rate, seed), 0);
        expect_bits("dropout, 3 vs 2 threads", y1, y, n * es);
        memcpy(y1, x, n * es);
        cr_assert_eq(B->dropout_forward(EX, dt, y1, y1, n, rate, seed), 0);
        expect_bits("dropout in place", y1, y, n * es);
        if (rate > 0.0f) { /* another seed: another mask */
          cr_assert_eq(B->dropout_forward(EX, dt, y1, x, n, rate, seed + 1), 0);
          size_t differ = 0;
          for (size_t i = 0; i < n; i++)
            differ += (get_dt(dt, y1, i) == 0) != (get_dt(dt, y, i) == 0);
          cr_assert(differ > n / 100, "seed %llu and the next: %zu masks differ",
                    (unsigned long long)seed, differ);
        }
      }
    free(xv), free(x), free(y), free(y1), free(g);
  }
}

/* ---- average pool ---- */

typedef struct pool_ctx {
  gs_conv_shape s; /* oh, ow: VALID */
  double *x, *r, *y;
} pool_ctx;

static void pool_ref_forward(pool_ctx *t) {
  const gs_conv_shape *s = &t->s;
  for (size_t n = 0; n < s->n; n++)
    for (size_t oy = 0; oy < s->oh; oy++)
      for (size_t ox = 0; ox < s->ow; ox++)
        for (size_t c = 0; c < s->c; c++) {
          double acc = 0;
          for (size_t ky = 0; ky < s->kh; ky++)
            for (size_t kx = 0; kx < s->kw; kx++)
              acc += t->x[((n * s->h + oy * s->stride + ky) * s->w + ox * s->stride + kx) * s->c +
                          c];
          t->y[((n * s->oh + oy) * s->ow + ox) * s->c + c] = acc / (double)(s->kh * s->kw);
        }
}

/* din of the definition: each window spreads dout / (KH*KW) over its
 * elements */
static void pool_ref_backward(const pool_ctx *t, double *din) {
  const gs_conv_shape *s = &t->s;
  memset(din, 0, (size_t)s->n * s->h * s->w * s->c * sizeof *din);
  for (size_t n = 0; n < s->n; n++)
    for (size_t oy = 0; oy < s->oh; oy++)
      for (size_t ox = 0; ox < s->ow; ox++)
        for (size_t c = 0; c < s->c; c++)
          for (size_t ky = 0; ky < s->kh; ky++)
            for (size_t kx = 0; kx < s->kw; kx++)
              din[((n * s->h + oy * s->stride + ky) * s->w + ox * s->stride + kx) * s->c + c] +=
                  t->r[((n * s->oh + oy) * s->ow + ox) * s->c + c] / (double)(s->kh * s->kw);
}

static double pool_loss(void *ctx) {
  pool_ctx *t = ctx;
  pool_ref_forward(t);
  size_t ny = (size_t)t->s.n * t->s.oh * t->s.ow * t->s.c;
  double l = 0;
  for (size_t i = 0; i < ny; i++)
    l += t->y[i] * t->r[i];
  return l;
}

static gs_conv_shape pool_shape(uint32_t n, uint32_t h, uint32_t w, uint32_t c, uint32_t kh,
                                uint32_t kw, uint32_t stride) {
  gs_conv_shape s = {.n = n, .h = h, .w = w, .c = c, .kh = kh, .kw = kw, .stride = stride,
                     .same = false, .f = c};
  gs_conv_shape_init(&s);
  return s;
}

/* forward and din against the definition (din's definition in turn
 * against central differences, exact for a linear op, where the shape is
 * small enough), 16-bit against fp32, 1 against 3 threads; odd shapes,
 * overlapping windows (stride < k), gaps (stride > k), a window larger
 * than the image (no output, din 0), SAME asked for and ignored. */
Test(norm, avgpool) {
  gs_conv_shape shapes[] = {
      pool_shape(2, 7, 9, 3, 3, 3, 2), pool_shape(1, 5, 5, 4, 2, 2, 1),
      pool_shape(3, 6, 6, 5, 3, 3, 3), pool_shape(1, 8, 7, 2, 2, 3, 3),
      pool_shape(2, 2, 3, 3, 3, 3, 1), pool_shape(1, 9, 9, 600, 3, 3, 2),
  };
  shapes[1].same = true; /* ignored: always VALID */
  for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
    pool_ctx t = {.s = shapes[si]};
    t.s.oh = gs_window_out(t.s.h, t.s.kh, t.s.stride, false);
    t.s.ow = gs_window_out(t.s.w, t.s.kw, t.s.stride, false);
    size_t nx = (size_t)t.s.n * t.s.h * t.s.w * t.s.c, ny = (size_t)t.s.n * t.s.oh * t.s.ow * t.s.c;
    t.x = dalloc(nx), t.r = dalloc(ny), t.y = dalloc(ny);
    double *o32 = dalloc(ny), *d32 = dalloc(nx);
    for (int d = 0; d < 3; d++) {
      gs_dtype dt = ALL_DT[d];
      size_t es = gs_dtype_size(dt);
      rng_state = 0x1234567ull + si; /* the same values, rounded to each dt */
      fill(GS_BF16, t.x, nx, 0, 2);
      fill(GS_BF16, t.r, ny, 0, 1);
      void *x = to_dt(dt, t.x, nx), *dy = to_dt(dt, t.r, ny);
      void *y = malloc(ny * es + 1), *g = malloc(nx * es + 1), *g3 = malloc(nx * es + 1);
      memset(g, 0x7f, nx * es); /* overwritten, every element */
      cr_assert_eq(B->avgpool_forward(EX, dt, y, x, &shapes[si]), 0);
      cr_assert_eq(B->avgpool_backward(EX, dt, g, dy, &shapes[si]), 0);
      cr_assert_eq(B->avgpool_backward(EX3, dt, g3, dy, &shapes[si]), 0);
      char what[64];
      snprintf(what, sizeof what, "avgpool case %zu (%s)", si, gs_dtype_name(dt));
      expect_bits(what, g3, g, nx * es);
      if (dt == GS_F32) {
        pool_ref_forward(&t);
        for (size_t i = 0; i < ny; i++) {
          expect_close(what, "out", i, ((float *)y)[i], t.y[i], 1e-6, 1e-6);
          o32[i] = ((float *)y)[i];
        }
        double *ref = dalloc(nx);
        pool_ref_backward(&t, ref);
        if (nx * ny <= 1000000) /* central differences where they are cheap */
          for (size_t i = 0, j = 0; i < nx; i += 1 + j++ % 3) {
            double keep = t.x[i];
            t.x[i] = keep + 1e-3;
            double lp = pool_loss(&t);
            t.x[i] = keep - 1e-3;
            double lm = pool_loss(&t);
            t.x[i] = keep;
            expect_close(what, "din (differences)", i, ref[i], (lp - lm) / 2e-3, 1e-9, 1e-9);
          }
        for (size_t i = 0; i < nx; i++) {
          expect_close(what, "din", i, ((float *)g)[i], ref[i], 1e-6, 1e-6);
          d32[i] = ((float *)g)[i];
        }
        free(ref);
      } else { /* inputs are bf16-exact: the same fp32 math, one rounding */
        for (size_t i = 0; i < ny; i++)
          expect_close(what, "out", i, get_dt(dt, y, i), o32[i], 1e-7, eps_dt(dt));
        for (size_t i = 0; i < nx; i++)
          expect_close(what, "din", i, get_dt(dt, g, i), d32[i], 1e-7, eps_dt(dt));
      }
      free(x), free(dy), free(y), free(g), free(g3);
    }
    free(t.x), free(t.r), free(t.y), free(o32), free(d32);
  }
}
