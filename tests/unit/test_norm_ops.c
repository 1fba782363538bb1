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

/* ---- helpers ---- */

static uint64_t rng_state;
static double urand(void) { /* uniform in [-1, 1) */
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (double)(rng_state >> 11) * 0x1p-52 - 1.0;
}

static double round_dt(gs_dtype dt, double v) {
  switch (dt) {
  case GS_F16:
    return gs_f16_to_f32(gs_f32_to_f16((float)v));
  case GS_BF16:
    return gs_bf16_to_f32(gs_f32_to_bf16((float)v));
  default:
    return (float)v;
  }
}

/* x[i] = random values in [offset - scale, offset + scale), exact in dt */
static void fill(gs_dtype dt, double *x, size_t n, double offset, double scale) {
  for (size_t i = 0; i < n; i++)
    x[i] = round_dt(dt, offset + urand() * scale);
}

/* a dt array of x (malloc'd; one spare byte so that n = 0 is not NULL) */
static void *to_dt(gs_dtype dt, const double *x, size_t n) {
  void *p = malloc(n * gs_dtype_size(dt) + 1);
  cr_assert(p);
  for (size_t i = 0; i < n; i++) {
    if (dt == GS_F32)
      ((float *)p)[i] = (float)x[i];
    else if (dt == GS_F16)
      ((uint16_t *)p)[i] = gs_f32_to_f16((float)x[i]);
    else
      ((uint16_t *)p)[i] = gs_f32_to_bf16((float)x[i]);
  }
  return p;
}

static double get_dt(gs_dtype dt, const void *p, size_t i) {
  if (dt == GS_F32)
    return ((const float *)p)[i];
  if (dt == GS_F16)
    return gs_f16_to_f32(((const uint16_t *)p)[i]);
  return gs_bf16_to_f32(((const uint16_t *)p)[i]);
}

static double *dalloc(size_t n) {
  double *p = calloc(n + 1, sizeof *p);
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
  rng_state = 0x9e3779b97f4a7c15ull;
}

static void teardown_ex(void) {
  B->exec_destroy(EX);
  B->exec_destroy(EX1);
  B->exec_destroy(EX3);
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
