/*
 * cpu_norm.c: the ops that residual networks and transformers add to the
 * layer kinds of cpu_conv.c and cpu_dense.c: the residual sums (add,
 * accumulate), exactly as backend.h writes their formulas.
 *
 * Storage. 16-bit tensors are converted to fp32 a stack block at a time
 * (GS_NORM_BLK floats), computed in fp32 and rounded once on store, so an
 * element's result does not depend on where a part of the range begins:
 * the element-wise ops give the same bits for any thread count.
 */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu_internal.h"

/* Elements below which an element-wise op stays on the job's thread (as
 * cpu_elem.c's grain: a handed-off range costs a few microseconds). */
#define GS_NORM_GRAIN ((size_t)1 << 13)
/* Floats of one stack block of converted 16-bit values. */
#define GS_NORM_BLK 512

/* ---- residual sums ---- */

struct add_job {
  gs_dtype dt;
  void *dst;
  const void *a, *b; /* add: dst = a + b; accumulate: a = dst, b = src */
};

GS_CPU_HOT static void add_part(void *ctx, size_t lo, size_t hi) {
  const struct add_job *j = ctx;
  if (j->dt == GS_F32) {
    /* no restrict: out may be a or b, and each element reads its own only */
    const float *a = j->a, *b = j->b;
    float *y = j->dst;
    for (size_t i = lo; i < hi; i++)
      y[i] = a[i] + b[i];
    return;
  }
  float x[GS_NORM_BLK], z[GS_NORM_BLK];
  for (size_t i = lo; i < hi; i += GS_NORM_BLK) {
    size_t n = hi - i < GS_NORM_BLK ? hi - i : GS_NORM_BLK;
    gs_cpu_load_f32(j->dt, gs_cpu_at(j->dt, j->a, i), x, n);
    gs_cpu_load_f32(j->dt, gs_cpu_at(j->dt, j->b, i), z, n);
    for (size_t k = 0; k < n; k++)
      x[k] += z[k];
    gs_cpu_store_f32(j->dt, gs_cpu_at_mut(j->dt, j->dst, i), x, n);
  }
}

int gs_cpu_add_forward(gs_exec *ex, gs_dtype dt, void *out, const void *a, const void *b,
                       size_t count) {
  struct add_job j = {.dt = dt, .dst = out, .a = a, .b = b};
  gs_cpu_parallel(ex, count, GS_NORM_GRAIN, add_part, &j);
  return 0;
}

int gs_cpu_accumulate(gs_exec *ex, gs_dtype dt, void *dst, const void *src, size_t count) {
  struct add_job j = {.dt = dt, .dst = dst, .a = dst, .b = src};
  gs_cpu_parallel(ex, count, GS_NORM_GRAIN, add_part, &j);
  return 0;
}
