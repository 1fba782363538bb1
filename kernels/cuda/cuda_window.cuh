/*
 * cuda_window.cuh: the geometry of the `cuda` plugin's window ops over NHWC
 * tensors (convolutions, depthwise convolutions, max and average pooling):
 * kgeo, a gs_conv_shape in ints with the output size and padding, and the
 * index arithmetic the pooling kernels share (cuda_ops.cu, cuda_norm.cu).
 */
#ifndef GS_KERNELS_CUDA_WINDOW_CUH
#define GS_KERNELS_CUDA_WINDOW_CUH

#include <stddef.h>

#include "kernels/backend.h"
#include "kernels/cuda/cuda_internal.h"

typedef struct kgeo {
  int n, h, w, c, kh, kw, stride, f, oh, ow, pt, pl;
} kgeo;

static inline kgeo kgeo_of(const gs_conv_shape *s, bool same) {
  kgeo g;
  g.n = (int)s->n;
  g.h = (int)s->h;
  g.w = (int)s->w;
  g.c = (int)s->c;
  g.kh = (int)s->kh;
  g.kw = (int)s->kw;
  g.stride = (int)s->stride;
  g.f = (int)s->f;
  g.oh = (int)gs_window_out(s->h, s->kh, s->stride, same);
  g.ow = (int)gs_window_out(s->w, s->kw, s->stride, same);
  g.pt = (int)gs_window_pad(s->h, s->kh, s->stride, same);
  g.pl = (int)gs_window_pad(s->w, s->kw, s->stride, same);
  return g;
}

/* The start of a VALID pooling's backward: the exec entered, the
 * geometry, and *count, din's elements still to compute: 0 after an error
 * (returned), for an empty din, or when no window fits (din cleared). */
static inline int pool_bwd_begin(gs_exec *ex, gs_dtype dt, void *din, const gs_conv_shape *s,
                                 kgeo *g, size_t *count) {
  int rc = gs_cuda_enter(ex);
  *g = kgeo_of(s, false);
  *count = (size_t)g->n * g->h * g->w * g->c;
  if (rc || *count == 0) {
    *count = 0;
    return rc;
  }
  if (g->oh == 0 || g->ow == 0) {
    rc = GS_CU(cudaMemsetAsync(din, 0, *count * gs_dtype_size(dt), ex->stream));
    *count = 0;
  }
  return rc;
}

/* Output element i of a VALID pooling (n, oh, ow, c): the index of its
 * window's first input element; the window's (ky, kx) element is at that
 * plus (ky * w + kx) * c. */
__device__ __forceinline__ size_t pool_window(const kgeo &g, size_t i) {
  int ci = (int)(i % g.c);
  size_t t = i / g.c;
  int ox = (int)(t % g.ow);
  t /= g.ow;
  int oy = (int)(t % g.oh), img = (int)(t / g.oh);
  return (((size_t)img * g.h + (size_t)oy * g.stride) * g.w + (size_t)ox * g.stride) * g.c + ci;
}

/* Input element i of a VALID pooling (n, h, w, c): its place, and the
 * output windows that hold it, rows oy0..oy1 by columns ox0..ox1 (those
 * with oy * stride <= iy <= oy * stride + kh - 1, likewise ox). */
typedef struct pool_in {
  int img, iy, ix, ci, oy0, oy1, ox0, ox1;
} pool_in;

__device__ __forceinline__ pool_in pool_windows_of(const kgeo &g, size_t i) {
  pool_in p;
  p.ci = (int)(i % g.c);
  size_t t = i / g.c;
  p.ix = (int)(t % g.w);
  t /= g.w;
  p.iy = (int)(t % g.h);
  p.img = (int)(t / g.h);
  p.oy0 = p.iy - g.kh + 1 <= 0 ? 0 : (p.iy - g.kh + g.stride) / g.stride;
  p.ox0 = p.ix - g.kw + 1 <= 0 ? 0 : (p.ix - g.kw + g.stride) / g.stride;
  p.oy1 = min(p.iy / g.stride, g.oh - 1);
  p.ox1 = min(p.ix / g.stride, g.ow - 1);
  return p;
}

/* the index of output element (img, oy, ox, ci) */
__device__ __forceinline__ size_t pool_out_at(const kgeo &g, int img, int oy, int ox, int ci) {
  return (((size_t)img * g.oh + oy) * g.ow + ox) * g.c + ci;
}

#endif
