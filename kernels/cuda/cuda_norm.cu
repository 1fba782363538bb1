/*
 * cuda_norm.cu: the `cuda` backend's twins of cpu/cpu_norm.c: the residual
 * sums (add, accumulate), batch and layer normalisation, GELU, dropout and
 * average pooling, exactly as backend.h writes their formulas.
 *
 * Storage and rounding as in cuda_ops.cu (cuda_dtype.cuh): fp32 math, one
 * rounding to nearest even on store, the CPU's bits for every load and
 * store. The residual sums, dropout and average pooling do the CPU's fp32
 * operations in the CPU's order, so they give its bits; the norms and GELU
 * agree within the tolerances of tests/gpu/gpu_cases.c.
 *
 * No float atomics: every output element is written by one thread, and the
 * reductions over rows take a split fixed by the shape (see colred_k), so
 * every run gives the same bits. The norms' reductions are plain (one
 * block per 32 columns and chunk of rows, one warp per LayerNorm row);
 * faster ones would vectorise the 16-bit loads and keep a row's values in
 * registers between the passes.
 */
#include <errno.h>
#include <math.h>

#include "kernels/cuda/cuda_dtype.cuh"
#include "kernels/cuda_sizes.h"
#include "kernels/cuda/cuda_internal.h"
#include "kernels/cuda/cuda_window.cuh"

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

/* ---- row reductions (batchnorm statistics, norm gradients) ----
 *
 * A column reduction over rows [0, M) of (M, C): block (32, GS_NORM_Y)
 * takes 32 columns of one chunk of GS_CUDA_NORM_ROWS rows; each thread sums a
 * strided run of the chunk's rows (GS_CUDA_NORM_ROWS / GS_NORM_Y of them) in
 * fp32, the block adds its threads' runs in double in a fixed order and
 * writes the chunk's partial (double) to the workspace; a second kernel
 * adds the chunks' partials in chunk order. The split depends on M alone,
 * so every run gives the same bits. */

#define GS_NORM_Y 8      /* threads per column of a reduction block */
/* rows per chunk and chunks for m rows (cuda_sizes.c, which the planner
 * shares) */
static void norm_split(size_t m, size_t *chunk, size_t *nk) { gs_cuda_norm_split(m, chunk, nk); }

enum { RED_SUM, RED_SQ, RED_BN_BWD, RED_LN_BWD };

/* part[k][c] (and, for the backwards, part[nk + k][c]) of chunk k = y:
 *   RED_SUM:    sum of x
 *   RED_SQ:     sum of (x - mean[c])^2
 *   RED_BN_BWD: sum of dy; sum of dy * xhat, xhat = (x - mean[c]) * rstd[c]
 *   RED_LN_BWD: the same with the row's mean[r] and rstd[r] */
template <int D, int MODE>
__global__ void colred_k(double *part, const typename st<D>::T *x, const typename st<D>::T *dy,
                         const float *mean, const float *rstd, size_t rows, size_t cols,
                         size_t chunk, size_t nk) {
  __shared__ double s1[GS_NORM_Y][33], s2[GS_NORM_Y][33];
  size_t col = (size_t)blockIdx.x * 32 + threadIdx.x;
  size_t r0 = (size_t)blockIdx.y * chunk, r1 = r0 + chunk < rows ? r0 + chunk : rows;
  float a1 = 0.0f, a2 = 0.0f;
  if (col < cols)
    for (size_t r = r0 + threadIdx.y; r < r1; r += GS_NORM_Y) {
      float v = st<D>::load(x[r * cols + col]);
      if (MODE == RED_SUM) {
        a1 += v;
      } else if (MODE == RED_SQ) {
        float d = v - mean[col];
        a1 += d * d;
      } else {
        size_t s = MODE == RED_BN_BWD ? col : r;
        float g = st<D>::load(dy[r * cols + col]);
        float xh = (v - mean[s]) * rstd[s];
        a1 += g;
        a2 += g * xh;
      }
    }
  s1[threadIdx.y][threadIdx.x] = a1;
  s2[threadIdx.y][threadIdx.x] = a2;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    double t1 = 0.0, t2 = 0.0;
    for (int y = 0; y < GS_NORM_Y; y++) {
      t1 += s1[y][threadIdx.x];
      t2 += s2[y][threadIdx.x];
    }
    part[(size_t)blockIdx.y * cols + col] = t1;
    if (MODE == RED_BN_BWD || MODE == RED_LN_BWD)
      part[((size_t)nk + blockIdx.y) * cols + col] = t2;
  }
}

template <int D, int MODE>
static int colred(gs_exec *ex, double *part, const void *x, const void *dy, const float *mean,
                  const float *rstd, size_t rows, size_t cols) {
  typedef typename st<D>::T T;
  size_t chunk, nk;
  norm_split(rows, &chunk, &nk);
  dim3 grid((unsigned)((cols + 31) / 32), (unsigned)nk), block(32, GS_NORM_Y);
  colred_k<D, MODE><<<grid, block, 0, ex->stream>>>(part, (const T *)x, (const T *)dy, mean,
                                                    rstd, rows, cols, chunk, nk);
  return GS_LAUNCHED("norm column reduction");
}

/* s1[c] (and s2[c]) = the sum of the chunks' partials, in chunk order */
__device__ __forceinline__ double chunk_sum(const double *part, size_t k0, size_t nk, size_t cols,
                                            size_t col) {
  double s = 0.0;
  for (size_t k = 0; k < nk; k++)
    s += part[(k0 + k) * cols + col];
  return s;
}

/* ---- batch normalisation ---- */

/* Workspace: the partials (2 nk, C) double, then two fp32 arrays of C
 * (evaluation: mean and rstd from the running statistics; backward:
 * sum(dout) / M and sum(dout xhat) / M). */
size_t gs_cuda_batchnorm_workspace(gs_dtype dt, uint32_t m, uint32_t c) {
  return gs_cuda_size_batchnorm(dt, m, c);
}

/* after RED_SUM: mean[c] = the batch mean */
__global__ void bn_mean_k(float *mean, const double *part, size_t nk, size_t m, size_t c) {
  GS_GRID_STRIDE(j, c) { mean[j] = (float)(chunk_sum(part, 0, nk, c, j) / (double)m); }
}

/* after RED_SQ: rstd, and the running statistics */
__global__ void bn_var_k(float *rstd, float *rmean, float *rvar, const float *mean,
                         const double *part, size_t nk, size_t m, size_t c, float eps,
                         float momentum) {
  GS_GRID_STRIDE(j, c) {
    double s = chunk_sum(part, 0, nk, c, j);
    double var = s / (double)m, unbiased = m > 1 ? s / (double)(m - 1) : var;
    rstd[j] = (float)(1.0 / sqrt(var + (double)eps));
    rmean[j] = (1.0f - momentum) * rmean[j] + momentum * mean[j];
    rvar[j] = (1.0f - momentum) * rvar[j] + momentum * (float)unbiased;
  }
}

/* evaluation: mean and rstd from the running statistics */
__global__ void bn_eval_stats_k(float *mean, float *rstd, const float *rmean, const float *rvar,
                                size_t c, float eps) {
  GS_GRID_STRIDE(j, c) {
    mean[j] = rmean[j];
    rstd[j] = (float)(1.0 / sqrt((double)rvar[j] + (double)eps));
  }
}

template <int D>
__global__ void bn_norm_k(typename st<D>::T *out, const typename st<D>::T *x,
                          const typename st<D>::T *gamma, const typename st<D>::T *beta,
                          const float *mean, const float *rstd, size_t count, size_t c) {
  GS_GRID_STRIDE(i, count) {
    size_t j = i % c;
    float v = (st<D>::load(x[i]) - mean[j]) * rstd[j] * st<D>::load(gamma[j]) +
              st<D>::load(beta[j]);
    out[i] = st<D>::store(v);
  }
}

int gs_cuda_batchnorm_forward(gs_exec *ex, gs_dtype dt, void *out, float *mean, float *rstd,
                              float *running_mean, float *running_var, const void *in,
                              const void *gamma, const void *beta, uint32_t m, uint32_t c,
                              float eps, float momentum, bool training, void *ws) {
  int rc = gs_cuda_enter(ex);
  if (rc || m == 0 || c == 0)
    return rc;
  size_t chunk, nk;
  norm_split(m, &chunk, &nk);
  double *part = (double *)ws;
  float *mu = mean, *rs = rstd;
  unsigned cb = gs_cuda_blocks(c);
  if (training) {
    GS_DT_SWITCH(dt, D, rc = colred<D, RED_SUM>(ex, part, in, NULL, NULL, NULL, m, c));
    if (rc)
      return rc;
    bn_mean_k<<<cb, 256, 0, ex->stream>>>(mean, part, nk, m, c);
    if ((rc = GS_LAUNCHED("batchnorm_forward (mean)")))
      return rc;
    GS_DT_SWITCH(dt, D, rc = colred<D, RED_SQ>(ex, part, in, NULL, mean, NULL, m, c));
    if (rc)
      return rc;
    bn_var_k<<<cb, 256, 0, ex->stream>>>(rstd, running_mean, running_var, mean, part, nk, m, c,
                                          eps, momentum);
    if ((rc = GS_LAUNCHED("batchnorm_forward (variance)")))
      return rc;
  } else {
    mu = (float *)(part + 2 * nk * (size_t)c);
    rs = mu + c;
    bn_eval_stats_k<<<cb, 256, 0, ex->stream>>>(mu, rs, running_mean, running_var, c, eps);
    if ((rc = GS_LAUNCHED("batchnorm_forward (running statistics)")))
      return rc;
  }
  size_t count = (size_t)m * c;
  GS_DT_SWITCH(dt, D, typedef typename st<D>::T T;
               bn_norm_k<D><<<gs_cuda_blocks(count), 256, 0, ex->stream>>>(
                   (T *)out, (const T *)in, (const T *)gamma, (const T *)beta, mu, rs, count, c));
  return GS_LAUNCHED("batchnorm_forward");
}

/* after RED_BN_BWD: the gradients of gamma and beta, and the means of the
 * two sums for din */
__global__ void bn_bwd_finish_k(float *dgamma, float *dbeta, float *m1, float *m2,
                                const double *part, size_t nk, size_t m, size_t c) {
  GS_GRID_STRIDE(j, c) {
    double s1 = chunk_sum(part, 0, nk, c, j), s2 = chunk_sum(part, nk, nk, c, j);
    dbeta[j] += (float)s1;
    dgamma[j] += (float)s2;
    m1[j] = (float)(s1 / (double)m);
    m2[j] = (float)(s2 / (double)m);
  }
}

template <int D>
__global__ void bn_din_k(typename st<D>::T *din, const typename st<D>::T *dy,
                         const typename st<D>::T *x, const typename st<D>::T *gamma,
                         const float *mean, const float *rstd, const float *m1, const float *m2,
                         size_t count, size_t c) {
  GS_GRID_STRIDE(i, count) {
    size_t j = i % c;
    float xh = (st<D>::load(x[i]) - mean[j]) * rstd[j];
    float a = st<D>::load(gamma[j]) * rstd[j];
    din[i] = st<D>::store(a * (st<D>::load(dy[i]) - m1[j] - xh * m2[j]));
  }
}

int gs_cuda_batchnorm_backward(gs_exec *ex, gs_dtype dt, void *din, float *dgamma,
                               float *dbeta, const void *dout, const void *in, const void *gamma,
                               const float *mean, const float *rstd, uint32_t m, uint32_t c,
                               void *ws) {
  int rc = gs_cuda_enter(ex);
  if (rc || m == 0 || c == 0)
    return rc;
  size_t chunk, nk;
  norm_split(m, &chunk, &nk);
  double *part = (double *)ws;
  float *m1 = (float *)(part + 2 * nk * (size_t)c), *m2 = m1 + c;
  GS_DT_SWITCH(dt, D, rc = colred<D, RED_BN_BWD>(ex, part, in, dout, mean, rstd, m, c));
  if (rc)
    return rc;
  bn_bwd_finish_k<<<gs_cuda_blocks(c), 256, 0, ex->stream>>>(dgamma, dbeta, m1, m2, part, nk, m,
                                                             c);
  if ((rc = GS_LAUNCHED("batchnorm_backward (sums)")) || !din)
    return rc;
  size_t count = (size_t)m * c;
  GS_DT_SWITCH(dt, D, typedef typename st<D>::T T;
               bn_din_k<D><<<gs_cuda_blocks(count), 256, 0, ex->stream>>>(
                   (T *)din, (const T *)dout, (const T *)in, (const T *)gamma, mean, rstd, m1,
                   m2, count, c));
  return GS_LAUNCHED("batchnorm_backward");
}

/* ---- layer normalisation: one warp per row ---- */

#define GS_LN_WARPS 8 /* rows (warps) per block */

/* the warp's sum of v, the same order (a butterfly) in every lane */
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

static unsigned ln_blocks(size_t m) {
  size_t b = (m + GS_LN_WARPS - 1) / GS_LN_WARPS;
  return b > 65535 ? 65535u : (unsigned)(b ? b : 1);
}

template <int D>
__global__ void ln_fwd_k(typename st<D>::T *out, float *mean, float *rstd,
                         const typename st<D>::T *x, const typename st<D>::T *gamma,
                         const typename st<D>::T *beta, size_t m, size_t c, float eps) {
  const int lane = threadIdx.x & 31;
  for (size_t r = (size_t)blockIdx.x * GS_LN_WARPS + threadIdx.x / 32; r < m;
       r += (size_t)gridDim.x * GS_LN_WARPS) {
    const typename st<D>::T *xr = x + r * c;
    float s = 0.0f;
    for (size_t j = lane; j < c; j += 32)
      s += st<D>::load(xr[j]);
    float mu = warp_sum(s) / (float)c;
    float q = 0.0f;
    for (size_t j = lane; j < c; j += 32) {
      float d = st<D>::load(xr[j]) - mu;
      q += d * d;
    }
    float rs = (float)(1.0 / sqrt((double)(warp_sum(q) / (float)c) + (double)eps));
    if (lane == 0) {
      if (mean)
        mean[r] = mu;
      if (rstd)
        rstd[r] = rs;
    }
    for (size_t j = lane; j < c; j += 32)
      out[r * c + j] = st<D>::store((st<D>::load(xr[j]) - mu) * rs * st<D>::load(gamma[j]) +
                                    st<D>::load(beta[j]));
  }
}

int gs_cuda_layernorm_forward(gs_exec *ex, gs_dtype dt, void *out, float *mean, float *rstd,
                              const void *in, const void *gamma, const void *beta, uint32_t m,
                              uint32_t c, float eps) {
  int rc = gs_cuda_enter(ex);
  if (rc || m == 0 || c == 0)
    return rc;
  GS_DT_SWITCH(dt, D, typedef typename st<D>::T T;
               ln_fwd_k<D><<<ln_blocks(m), 32 * GS_LN_WARPS, 0, ex->stream>>>(
                   (T *)out, mean, rstd, (const T *)in, (const T *)gamma, (const T *)beta, m, c,
                   eps));
  return GS_LAUNCHED("layernorm_forward");
}

/* Workspace: the gradient partials (2 nk, C) double. */
size_t gs_cuda_layernorm_workspace(gs_dtype dt, uint32_t m, uint32_t c) {
  return gs_cuda_size_layernorm(dt, m, c);
}

/* din per row: rstd (g - mean(g) - xhat mean(g xhat)), g = dout * gamma */
template <int D>
__global__ void ln_din_k(typename st<D>::T *din, const typename st<D>::T *dy,
                         const typename st<D>::T *x, const typename st<D>::T *gamma,
                         const float *mean, const float *rstd, size_t m, size_t c) {
  const int lane = threadIdx.x & 31;
  for (size_t r = (size_t)blockIdx.x * GS_LN_WARPS + threadIdx.x / 32; r < m;
       r += (size_t)gridDim.x * GS_LN_WARPS) {
    const float mu = mean[r], rs = rstd[r];
    float sg = 0.0f, sgx = 0.0f;
    for (size_t j = lane; j < c; j += 32) {
      float xh = (st<D>::load(x[r * c + j]) - mu) * rs;
      float g = st<D>::load(dy[r * c + j]) * st<D>::load(gamma[j]);
      sg += g;
      sgx += g * xh;
    }
    const float m1 = warp_sum(sg) / (float)c, m2 = warp_sum(sgx) / (float)c;
    for (size_t j = lane; j < c; j += 32) {
      float xh = (st<D>::load(x[r * c + j]) - mu) * rs;
      float g = st<D>::load(dy[r * c + j]) * st<D>::load(gamma[j]);
      din[r * c + j] = st<D>::store(rs * (g - m1 - xh * m2));
    }
  }
}

__global__ void ln_bwd_finish_k(float *dgamma, float *dbeta, const double *part, size_t nk,
                                size_t c) {
  GS_GRID_STRIDE(j, c) {
    dbeta[j] += (float)chunk_sum(part, 0, nk, c, j);
    dgamma[j] += (float)chunk_sum(part, nk, nk, c, j);
  }
}

int gs_cuda_layernorm_backward(gs_exec *ex, gs_dtype dt, void *din, float *dgamma,
                               float *dbeta, const void *dout, const void *in, const void *gamma,
                               const float *mean, const float *rstd, uint32_t m, uint32_t c,
                               void *ws) {
  int rc = gs_cuda_enter(ex);
  if (rc || m == 0 || c == 0)
    return rc;
  size_t chunk, nk;
  norm_split(m, &chunk, &nk);
  double *part = (double *)ws;
  GS_DT_SWITCH(dt, D, rc = colred<D, RED_LN_BWD>(ex, part, in, dout, mean, rstd, m, c));
  if (rc)
    return rc;
  ln_bwd_finish_k<<<gs_cuda_blocks(c), 256, 0, ex->stream>>>(dgamma, dbeta, part, nk, c);
  if ((rc = GS_LAUNCHED("layernorm_backward (gamma, beta)")) || !din)
    return rc;
  GS_DT_SWITCH(dt, D, typedef typename st<D>::T T;
               ln_din_k<D><<<ln_blocks(m), 32 * GS_LN_WARPS, 0, ex->stream>>>(
                   (T *)din, (const T *)dout, (const T *)in, (const T *)gamma, mean, rstd, m,
                   c));
  return GS_LAUNCHED("layernorm_backward");
}

/* ---- GELU (tanh approximation) ---- */

#define GS_GELU_K 0.7978845608028654f /* sqrt(2 / pi) */
#define GS_GELU_A 0.044715f

template <int D>
__global__ void gelu_fwd_k(typename st<D>::T *y, const typename st<D>::T *x, size_t count) {
  GS_GRID_STRIDE(i, count) {
    float v = st<D>::load(x[i]);
    float u = GS_GELU_K * (v + GS_GELU_A * v * v * v);
    y[i] = st<D>::store(0.5f * v * (1.0f + tanhf(u)));
  }
}

template <int D>
__global__ void gelu_bwd_k(typename st<D>::T *g, const typename st<D>::T *dy,
                           const typename st<D>::T *x, size_t count) {
  GS_GRID_STRIDE(i, count) {
    float v = st<D>::load(x[i]);
    float u = GS_GELU_K * (v + GS_GELU_A * v * v * v);
    float t = tanhf(u);
    float d = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * GS_GELU_K *
                                      (1.0f + 3.0f * GS_GELU_A * v * v);
    g[i] = st<D>::store(st<D>::load(dy[i]) * d);
  }
}

int gs_cuda_gelu_forward(gs_exec *ex, gs_dtype dt, void *out, const void *in, size_t count) {
  int rc = gs_cuda_enter(ex);
  if (rc || count == 0)
    return rc;
  GS_DT_SWITCH(dt, D, typedef typename st<D>::T T;
               gelu_fwd_k<D><<<gs_cuda_blocks(count), 256, 0, ex->stream>>>(
                   (T *)out, (const T *)in, count));
  return GS_LAUNCHED("gelu_forward");
}

int gs_cuda_gelu_backward(gs_exec *ex, gs_dtype dt, void *din, const void *dout, const void *in,
                          size_t count) {
  int rc = gs_cuda_enter(ex);
  if (rc || count == 0)
    return rc;
  GS_DT_SWITCH(dt, D, typedef typename st<D>::T T;
               gelu_bwd_k<D><<<gs_cuda_blocks(count), 256, 0, ex->stream>>>(
                   (T *)din, (const T *)dout, (const T *)in, count));
  return GS_LAUNCHED("gelu_backward");
}

/* ---- dropout: the mask of backend.h, from the seed and the index ---- */

/* output i of splitmix64 seeded with seed */
__device__ __forceinline__ uint64_t dropout_hash(uint64_t seed, uint64_t i) {
  uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* y = kept ? x * scale : +0; scale and the threshold come from the host,
 * computed as the CPU does, so both give the same bits */
template <int D>
__global__ void dropout_k(typename st<D>::T *y, const typename st<D>::T *x, size_t count,
                          uint64_t seed, uint32_t thr, float scale) {
  GS_GRID_STRIDE(i, count) {
    bool keep = (uint32_t)(dropout_hash(seed, i) >> 40) >= thr;
    y[i] = st<D>::store(keep ? __fmul_rn(st<D>::load(x[i]), scale) : 0.0f);
  }
}

static int dropout_run(gs_exec *ex, gs_dtype dt, void *dst, const void *src, size_t count,
                       float rate, uint64_t seed, const char *what) {
  int rc = gs_cuda_enter(ex);
  if (rc || count == 0)
    return rc;
  uint32_t thr = (uint32_t)ceil((double)rate * 16777216.0); /* ceil(rate * 2^24) */
  float scale = 1.0f / (1.0f - rate);
  GS_DT_SWITCH(dt, D, typedef typename st<D>::T T;
               dropout_k<D><<<gs_cuda_blocks(count), 256, 0, ex->stream>>>(
                   (T *)dst, (const T *)src, count, seed, thr, scale));
  return GS_LAUNCHED(what);
}

int gs_cuda_dropout_forward(gs_exec *ex, gs_dtype dt, void *out, const void *in, size_t count,
                            float rate, uint64_t seed) {
  return dropout_run(ex, dt, out, in, count, rate, seed, "dropout_forward");
}

int gs_cuda_dropout_backward(gs_exec *ex, gs_dtype dt, void *din, const void *dout,
                             size_t count, float rate, uint64_t seed) {
  return dropout_run(ex, dt, din, dout, count, rate, seed, "dropout_backward");
}

/* ---- average pool (VALID) ---- */

template <int D>
__global__ void avgpool_fwd_k(kgeo g, typename st<D>::T *out, const typename st<D>::T *in) {
  GS_GRID_STRIDE(i, (size_t)g.n * g.oh * g.ow * g.c) {
    size_t base = pool_window(g, i);
    float acc = 0.0f;
    for (int ky = 0; ky < g.kh; ky++)
      for (int kx = 0; kx < g.kw; kx++)
        acc += st<D>::load(in[base + ((size_t)ky * g.w + kx) * g.c]);
    out[i] = st<D>::store(acc / (float)(g.kh * g.kw));
  }
}

/* din: each input element sums dout over the windows that contain it, in
 * the CPU's order (oy, then ox) */
template <int D>
__global__ void avgpool_bwd_k(kgeo g, typename st<D>::T *din, const typename st<D>::T *dout) {
  GS_GRID_STRIDE(i, (size_t)g.n * g.h * g.w * g.c) {
    pool_in p = pool_windows_of(g, i);
    float acc = 0.0f;
    for (int oy = p.oy0; oy <= p.oy1; oy++)
      for (int ox = p.ox0; ox <= p.ox1; ox++)
        acc += st<D>::load(dout[pool_out_at(g, p.img, oy, ox, p.ci)]);
    din[i] = st<D>::store(acc / (float)(g.kh * g.kw));
  }
}

int gs_cuda_avgpool_forward(gs_exec *ex, gs_dtype dt, void *out, const void *in,
                            const gs_conv_shape *s) {
  int rc = gs_cuda_enter(ex);
  kgeo g = kgeo_of(s, false);
  size_t count = (size_t)g.n * g.oh * g.ow * g.c;
  if (rc || count == 0)
    return rc;
  GS_DT_SWITCH(dt, D, typedef typename st<D>::T T;
               avgpool_fwd_k<D><<<gs_cuda_blocks(count), 256, 0, ex->stream>>>(
                   g, (T *)out, (const T *)in));
  return GS_LAUNCHED("avgpool_forward");
}

int gs_cuda_avgpool_backward(gs_exec *ex, gs_dtype dt, void *din, const void *dout,
                             const gs_conv_shape *s) {
  kgeo g;
  size_t count;
  int rc = pool_bwd_begin(ex, dt, din, s, &g, &count);
  if (rc || count == 0)
    return rc;
  GS_DT_SWITCH(dt, D, typedef typename st<D>::T T;
               avgpool_bwd_k<D><<<gs_cuda_blocks(count), 256, 0, ex->stream>>>(
                   g, (T *)din, (const T *)dout));
  return GS_LAUNCHED("avgpool_backward");
}
