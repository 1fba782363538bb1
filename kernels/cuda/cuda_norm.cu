/*
 * cuda_norm.cu: the `cuda` backend's twins of cpu/cpu_norm.c: the residual
 * sums (add, accumulate), exactly as backend.h writes their formulas.
 *
 * Storage and rounding as in cuda_ops.cu (cuda_dtype.cuh): fp32 math, one
 * rounding to nearest even on store, the CPU's bits for every load and
 * store, so the element-wise ops here give the CPU backend's bits.
 */
#include <errno.h>
#include <math.h>

#include "kernels/cuda/cuda_dtype.cuh"
#include "kernels/cuda/cuda_internal.h"

/* ---- residual sums ---- */

/* y[i] = a[i] + b[i]; y may be a or b (each thread reads its own element) */
template <int D>
__global__ void add_k(typename st<D>::T *y, const typename st<D>::T *a,
                      const typename st<D>::T *b, size_t count) {
  GS_GRID_STRIDE(i, count) { y[i] = st<D>::store(st<D>::load(a[i]) + st<D>::load(b[i])); }
}

static int add_launch(gs_exec *ex, gs_dtype dt, void *out, const void *a, const void *b,
                      size_t count, const char *what) {
  int rc = gs_cuda_enter(ex);
  if (rc || count == 0)
    return rc;
  GS_DT_SWITCH(dt, D, typedef typename st<D>::T T;
               add_k<D><<<gs_cuda_blocks(count), 256, 0, ex->stream>>>(
                   (T *)out, (const T *)a, (const T *)b, count));
  return GS_LAUNCHED(what);
}

int gs_cuda_add_forward(gs_exec *ex, gs_dtype dt, void *out, const void *a, const void *b,
                        size_t count) {
  return add_launch(ex, dt, out, a, b, count, "add_forward");
}

int gs_cuda_accumulate(gs_exec *ex, gs_dtype dt, void *dst, const void *src, size_t count) {
  return add_launch(ex, dt, dst, dst, src, count, "accumulate");
}
