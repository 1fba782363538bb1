/*
 * test_ops_util.h: what the tests of the cpu backend's ops share: a
 * seeded generator, values exact in a storage type, conversions between
 * double arrays and fp32/fp16/bf16 storage, tolerance checks and central
 * finite differences.
 *
 * Each test file has its own generator state (static), seeded by its suite
 * setup with ops_seed.
 */
#ifndef GS_TEST_OPS_UTIL_H
#define GS_TEST_OPS_UTIL_H

#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "kernels/backend.h"

static uint64_t rng_state;

static inline void ops_seed(void) { rng_state = 0x9e3779b97f4a7c15ull; }

/* uniform in [-1, 1) (xorshift64) */
static inline double urand(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (double)(rng_state >> 11) * 0x1p-52 - 1.0;
}

/* v rounded to the nearest value dt stores */
static inline double round_dt(gs_dtype dt, double v) {
  switch (dt) {
  case GS_F16:
    return gs_f16_to_f32(gs_f32_to_f16((float)v));
  case GS_BF16:
    return gs_bf16_to_f32(gs_f32_to_bf16((float)v));
  default:
    return (float)v;
  }
}

/* dt's unit roundoff (fp32's taken as 2^-20: a few ulps of sums) */
static inline double eps_dt(gs_dtype dt) {
  return dt == GS_F16 ? 0x1p-10 : dt == GS_BF16 ? 0x1p-7 : 0x1p-20;
}

/* a dt array of x (malloc'd; one spare element so that n = 0 is not NULL) */
static inline void *to_dt(gs_dtype dt, const double *x, size_t n) {
  void *p = malloc((n + 1) * gs_dtype_size(dt));
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

/* element i of a dt array, as a double */
static inline double get_dt(gs_dtype dt, const void *p, size_t i) {
  if (dt == GS_F32)
    return ((const float *)p)[i];
  if (dt == GS_F16)
    return gs_f16_to_f32(((const uint16_t *)p)[i]);
  return gs_bf16_to_f32(((const uint16_t *)p)[i]);
}

/* exactly the bytes the query returned (NULL for 0), so overruns trip ASan */
static inline void *ws_alloc(size_t bytes) { return bytes ? malloc(bytes) : NULL; }

/* |got - ref| <= abs_tol + |ref| * rel, or the test fails naming what,
 * name[i] and both values */
static inline void expect_close(const char *what, const char *name, size_t i, double got,
                                double ref, double abs_tol, double rel) {
  double tol = abs_tol + fabs(ref) * rel;
  cr_assert(fabs(got - ref) <= tol, "%s %s[%zu]: got %.9g, want %.9g (tol %.3g)", what, name, i,
            got, ref, tol);
}

/* The double reference of an op as a scalar loss of the arrays the test
 * perturbs (through ctx), for central differences. */
typedef double (*loss_fn)(void *ctx);

/* g[i] = d loss / d v[i] for i < n, central differences with step h */
static inline void fd_grad(loss_fn loss, void *ctx, double *v, size_t n, double h, double *g) {
  for (size_t i = 0; i < n; i++) {
    double keep = v[i];
    v[i] = keep + h;
    double lp = loss(ctx);
    v[i] = keep - h;
    double lm = loss(ctx);
    v[i] = keep;
    g[i] = (lp - lm) / (2 * h);
  }
}

#endif
