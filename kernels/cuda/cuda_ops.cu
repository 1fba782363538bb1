/*
 * cuda_ops.cu: the `cuda` backend's own kernels: everything that is not a
 * GEMM. Depthwise conv2d, max pool, global average pool, relu, the fused
 * softmax cross-entropy, casts, unscale-and-check, the dynamic loss scale,
 * SGD and Adam, plus the helpers the GEMM layers use (bias-gradient column
 * sums, im2col, col2im, bias rows).
 *
 * Storage and rounding. Each kernel is a template over the storage type
 * (GS_DT_SWITCH picks the instance at run time); values are loaded to fp32,
 * computed in fp32 and rounded to nearest even once on store. The loads and
 * stores are bit for bit those of the CPU backend (dtype.c, cpu_convert.c):
 * the hardware conversion for every number, and the CPU's own rule for NaN
 * (quietened, top payload bits kept), so a cast or a pool gives the same
 * bits on both devices.
 *
 * No atomics, so every result is deterministic: an output element is
 * written by one thread. Reductions over many positions (bias gradients,
 * depthwise weight gradients) give each block a column of outputs; its
 * threads sum strided slices in fp32 and one thread adds the block's sum
 * onto the fp32 gradient (+=, as the contract says). Bias gradients over
 * many rows first cut the rows into chunks (partial sums in the GEMM op's
 * workspace, added up in chunk order by a second pass). Gradients of inputs
 * that several windows read (col2im, depthwise din, max pool din) are
 * gathers over the windows that read each input element, as on the CPU.
 *
 * Device scalars. The loss scale, found_inf, good-step count, skipped count
 * and the optimizers' skip flag are read and written by the kernels
 * themselves, so a mixed-precision step never waits for the host.
 *
 * Labels. A label outside [0, K) is bad data; the CPU returns -EINVAL. A
 * kernel cannot return an error without a host synchronisation, so the GPU
 * writes NaN as that example's loss and zero gradients for its row: the
 * NaN reaches the job's loss report instead. The runtime checks labels when
 * it loads a dataset, so this is a second line of defence.
 */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "kernels/cuda/cuda_dtype.cuh"
#include "kernels/cuda/cuda_internal.h"
#include "kernels/cuda/cuda_window.cuh"

/* Geometry of a window op, by value into the kernels. */
/* ---- column sums (bias gradients), bias rows ---- */

#define GS_RED_Y 8 /* threads per column in a reduction block */

/* Column sums of rows [r0, r1) of x (rows, cols): block (32, GS_RED_Y)
 * over 32 columns, each thread a strided slice of the rows, then one fixed
 * order across the slices. partial == NULL: db[col] += the sum; else
 * partial[blockIdx.y * cols + col] = the sum of chunk blockIdx.y. */
template <int D>
__global__ void colsum_k(float *db, float *partial, const typename st<D>::T *x, size_t rows,
                         size_t cols, size_t chunk) {
  __shared__ float part[GS_RED_Y][33];
  size_t col = (size_t)blockIdx.x * 32 + threadIdx.x;
  size_t r0 = (size_t)blockIdx.y * chunk, r1 = r0 + chunk < rows ? r0 + chunk : rows;
  float acc = 0.0f;
  if (col < cols)
    for (size_t r = r0 + threadIdx.y; r < r1; r += GS_RED_Y)
      acc += st<D>::load(x[r * cols + col]);
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    float s = 0.0f;
    for (int y = 0; y < GS_RED_Y; y++)
      s += part[y][threadIdx.x];
    if (partial)
      partial[(size_t)blockIdx.y * cols + col] = s;
    else
      db[col] += s;
  }
}

/* db[col] += the chunks' partial sums, in chunk order */
__global__ void colsum_finish_k(float *db, const float *partial, size_t chunks, size_t cols) {
  GS_GRID_STRIDE(col, cols) {
    float s = 0.0f;
    for (size_t y = 0; y < chunks; y++)
      s += partial[y * cols + col];
    db[col] += s;
  }
}

/* Blocks the first pass aims at (a few per multiprocessor), and the fewest
 * rows one thread of a chunk sums (below that the second pass costs more
 * than it spreads). */
#define GS_COLSUM_BLOCKS 4096
#define GS_COLSUM_MIN_ROWS 16

/* One block per 32 columns would leave most of a large GPU idle when the
 * columns are few and the rows many (a bias gradient over batch x pixels);
 * so the rows are cut into chunks whose partial sums go to the workspace and
 * a second pass adds them up. The chunking depends only on the shape, so the
 * result is the same bits run after run. */
int gs_cuda_colsum_add(gs_exec *ex, gs_dtype dt, float *db, const void *x, size_t rows,
                       size_t cols, void *ws) {
  if (rows == 0 || cols == 0)
    return 0;
  size_t cblocks = (cols + 31) / 32;
  size_t chunks = (rows + GS_RED_Y * GS_COLSUM_MIN_ROWS - 1) / (GS_RED_Y * GS_COLSUM_MIN_ROWS);
  size_t want = (GS_COLSUM_BLOCKS + cblocks - 1) / cblocks;
  size_t room = ws ? gs_cuda_lt_workspace / (sizeof(float) * cols) : 0;
  if (chunks > want)
    chunks = want;
  if (chunks > room)
    chunks = room;
  if (chunks > 65535)
    chunks = 65535;
  if (cblocks > 0x7fffffffu)
    return -EINVAL; /* 2^36 columns: no such layer */
  float *partial = chunks > 1 ? (float *)ws : NULL;
  if (!partial)
    chunks = 1;
  size_t chunk = (rows + chunks - 1) / chunks;
  dim3 grid((unsigned)cblocks, (unsigned)chunks), block(32, GS_RED_Y);
  GS_DT_SWITCH(dt, D, colsum_k<D><<<grid, block, 0, ex->stream>>>(
                          db, partial, (const typename st<D>::T *)x, rows, cols, chunk));
  int rc = GS_LAUNCHED("colsum_add");
  if (rc || !partial)
    return rc;
  colsum_finish_k<<<gs_cuda_blocks(cols), 256, 0, ex->stream>>>(db, partial, chunks, cols);
  return GS_LAUNCHED("colsum_add (finish)");
}

template <int D>
__global__ void fill_rows_k(typename st<D>::T *out, const typename st<D>::T *b, size_t rows,
                            size_t cols) {
  GS_GRID_STRIDE(i, rows * cols) out[i] = b[i % cols];
}

int gs_cuda_fill_rows(gs_exec *ex, gs_dtype dt, void *out, const void *b, size_t rows,
                      size_t cols) {
  if (rows == 0 || cols == 0)
    return 0;
  GS_DT_SWITCH(dt, D, fill_rows_k<D><<<gs_cuda_blocks(rows * cols), 256, 0, ex->stream>>>(
                          (typename st<D>::T *)out, (const typename st<D>::T *)b, rows, cols));
  return GS_LAUNCHED("fill_rows");
}

/* ---- im2col / col2im (conv2d) ---- */

/* col (nc*OH*OW, KH*KW*C) of images [n0, n0+nc); zero outside the input */
template <int D>
__global__ void im2col_k(kgeo g, const typename st<D>::T *in, typename st<D>::T *col, int n0,
                         int nc) {
  size_t K = (size_t)g.kh * g.kw * g.c, P = (size_t)g.oh * g.ow;
  GS_GRID_STRIDE(i, (size_t)nc * P * K) {
    size_t r = i / K, kk = i % K;
    int img = n0 + (int)(r / P), q = (int)(r % P), oy = q / g.ow, ox = q % g.ow;
    int ky = (int)(kk / ((size_t)g.kw * g.c)), rem = (int)(kk % ((size_t)g.kw * g.c));
    int kx = rem / g.c, ci = rem % g.c;
    int iy = oy * g.stride - g.pt + ky, ix = ox * g.stride - g.pl + kx;
    typename st<D>::T v = 0;
    if (iy >= 0 && iy < g.h && ix >= 0 && ix < g.w)
      v = in[(((size_t)img * g.h + iy) * g.w + ix) * g.c + ci];
    col[i] = v;
  }
}

int gs_cuda_im2col(gs_exec *ex, gs_dtype dt, const gs_conv_shape *s, const void *in, void *col,
                   uint32_t n0, uint32_t nc) {
  kgeo g = kgeo_of(s, s->same);
  size_t count = (size_t)nc * g.oh * g.ow * g.kh * g.kw * g.c;
  if (count == 0)
    return 0;
  GS_DT_SWITCH(dt, D, im2col_k<D><<<gs_cuda_blocks(count), 256, 0, ex->stream>>>(
                          g, (const typename st<D>::T *)in, (typename st<D>::T *)col, (int)n0,
                          (int)nc));
  return GS_LAUNCHED("im2col");
}

/* din of images [n0, n0+nc): each element gathers the dcol entries of the
 * window taps that read it (as col2im_part in cpu_conv.c) */
template <int D>
__global__ void col2im_k(kgeo g, const float *dcol, typename st<D>::T *din, int n0, int nc) {
  size_t K = (size_t)g.kh * g.kw * g.c;
  GS_GRID_STRIDE(i, (size_t)nc * g.h * g.w * g.c) {
    int ci = (int)(i % g.c);
    size_t t = i / g.c;
    int ix = (int)(t % g.w);
    t /= g.w;
    int iy = (int)(t % g.h), img = (int)(t / g.h);
    float acc = 0.0f;
    int ty0 = iy + g.pt, tx0 = ix + g.pl;
    for (int ky = ty0 % g.stride, oy = ty0 / g.stride; ky < g.kh && oy >= 0;
         ky += g.stride, oy--) {
      if (oy >= g.oh)
        continue;
      for (int kx = tx0 % g.stride, ox = tx0 / g.stride; kx < g.kw && ox >= 0;
           kx += g.stride, ox--) {
        if (ox >= g.ow)
          continue;
        acc += dcol[(((size_t)img * g.oh + oy) * g.ow + ox) * K + ((size_t)ky * g.kw + kx) * g.c +
                    ci];
      }
    }
    din[(((size_t)(n0 + img) * g.h + iy) * g.w + ix) * g.c + ci] = st<D>::store(acc);
  }
}

int gs_cuda_col2im(gs_exec *ex, gs_dtype dt, const gs_conv_shape *s, const float *dcol,
                   void *din, uint32_t n0, uint32_t nc) {
  kgeo g = kgeo_of(s, s->same);
  size_t count = (size_t)nc * g.h * g.w * g.c;
  if (count == 0)
    return 0;
  GS_DT_SWITCH(dt, D, col2im_k<D><<<gs_cuda_blocks(count), 256, 0, ex->stream>>>(
                          g, dcol, (typename st<D>::T *)din, (int)n0, (int)nc));
  return GS_LAUNCHED("col2im");
}

/* ---- depthwise conv2d ---- */

size_t gs_cuda_depthwise_workspace(gs_dtype dt, const gs_conv_shape *s) {
  return gs_cuda_size_depthwise(gs_cuda_lt_workspace, dt, s);
}

template <int D>
__global__ void dw_fwd_k(kgeo g, typename st<D>::T *out, const typename st<D>::T *in,
                         const typename st<D>::T *w, const typename st<D>::T *b) {
  GS_GRID_STRIDE(i, (size_t)g.n * g.oh * g.ow * g.c) {
    int ci = (int)(i % g.c);
    size_t t = i / g.c;
    int ox = (int)(t % g.ow);
    t /= g.ow;
    int oy = (int)(t % g.oh), img = (int)(t / g.oh);
    float acc = b ? st<D>::load(b[ci]) : 0.0f;
    for (int ky = 0; ky < g.kh; ky++) {
      int iy = oy * g.stride - g.pt + ky;
      if (iy < 0 || iy >= g.h)
        continue;
      for (int kx = 0; kx < g.kw; kx++) {
        int ix = ox * g.stride - g.pl + kx;
        if (ix < 0 || ix >= g.w)
          continue;
        acc += st<D>::load(in[(((size_t)img * g.h + iy) * g.w + ix) * g.c + ci]) *
               st<D>::load(w[((size_t)ky * g.kw + kx) * g.c + ci]);
      }
    }
    out[i] = st<D>::store(acc);
  }
}

/* din: gather from the windows that read each input element */
template <int D>
__global__ void dw_dgrad_k(kgeo g, typename st<D>::T *din, const typename st<D>::T *dout,
                           const typename st<D>::T *w) {
  GS_GRID_STRIDE(i, (size_t)g.n * g.h * g.w * g.c) {
    int ci = (int)(i % g.c);
    size_t t = i / g.c;
    int ix = (int)(t % g.w);
    t /= g.w;
    int iy = (int)(t % g.h), img = (int)(t / g.h);
    float acc = 0.0f;
    int ty0 = iy + g.pt, tx0 = ix + g.pl;
    for (int ky = ty0 % g.stride, oy = ty0 / g.stride; ky < g.kh && oy >= 0;
         ky += g.stride, oy--) {
      if (oy >= g.oh)
        continue;
      for (int kx = tx0 % g.stride, ox = tx0 / g.stride; kx < g.kw && ox >= 0;
           kx += g.stride, ox--) {
        if (ox >= g.ow)
          continue;
        acc += st<D>::load(dout[(((size_t)img * g.oh + oy) * g.ow + ox) * g.c + ci]) *
               st<D>::load(w[((size_t)ky * g.kw + kx) * g.c + ci]);
      }
    }
    din[i] = st<D>::store(acc);
  }
}

/* dw (KH*KW, C) += and db (C) +=: block (32, GS_RED_Y) over 32 channels of
 * one tap (blockIdx.y < KH*KW) or of the bias (blockIdx.y == KH*KW), over
 * the positions of chunk blockIdx.z (of `chunk` positions each). partial
 * == NULL (one chunk): the sum is added to dw or db; else it goes to
 * partial[(blockIdx.z * (KH*KW + 1) + tap) * C + channel], which
 * dw_wgrad_sum_k adds up in chunk order: the same bits run after run. One
 * block per tap and 32 channels left most of a large GPU idle (ten blocks
 * for a 3x3 depthwise of 32 channels on 132 SMs). */
template <int D>
__global__ void dw_wgrad_k(kgeo g, float *dw, float *db, const typename st<D>::T *dout,
                           const typename st<D>::T *in, size_t chunk, float *partial) {
  __shared__ float part[GS_RED_Y][33];
  int taps = g.kh * g.kw, tap = (int)blockIdx.y;
  bool bias = tap == taps;
  if ((bias && !db) || (!bias && !dw))
    return; /* the whole block leaves together */
  int ci = (int)blockIdx.x * 32 + (int)threadIdx.x;
  int ky = bias ? 0 : tap / g.kw, kx = bias ? 0 : tap % g.kw;
  float acc = 0.0f;
  size_t positions = (size_t)g.n * g.oh * g.ow;
  size_t p0 = (size_t)blockIdx.z * chunk, p1 = p0 + chunk < positions ? p0 + chunk : positions;
  if (ci < g.c)
    for (size_t pos = p0 + threadIdx.y; pos < p1; pos += GS_RED_Y) {
      float d = st<D>::load(dout[pos * g.c + ci]);
      if (bias) {
        acc += d;
        continue;
      }
      int q = (int)(pos % ((size_t)g.oh * g.ow)), img = (int)(pos / ((size_t)g.oh * g.ow));
      int oy = q / g.ow, ox = q % g.ow;
      int iy = oy * g.stride - g.pt + ky, ix = ox * g.stride - g.pl + kx;
      if (iy < 0 || iy >= g.h || ix < 0 || ix >= g.w)
        continue;
      acc += d * st<D>::load(in[(((size_t)img * g.h + iy) * g.w + ix) * g.c + ci]);
    }
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && ci < g.c) {
    float s = 0.0f;
    for (int y = 0; y < GS_RED_Y; y++)
      s += part[y][threadIdx.x];
    if (partial)
      partial[((size_t)blockIdx.z * (taps + 1) + tap) * g.c + ci] = s;
    else if (bias)
      db[ci] += s;
    else
      dw[(size_t)tap * g.c + ci] += s;
  }
}

/* The chunks' partial sums, added in chunk order onto dw (taps x C) and db
 * (C), one thread per (tap, channel); a NULL dw or db is left out. */
__global__ void dw_wgrad_sum_k(float *dw, float *db, const float *partial, int taps, int c,
                               unsigned chunks) {
  size_t per = (size_t)(taps + 1) * c;
  GS_GRID_STRIDE(i, per) {
    bool bias = i >= (size_t)taps * c;
    if ((bias && !db) || (!bias && !dw))
      continue;
    float s = 0.0f;
    for (unsigned z = 0; z < chunks; z++)
      s += partial[(size_t)z * per + i];
    if (bias)
      db[i - (size_t)taps * c] += s;
    else
      dw[i] += s;
  }
}

/* in (N, H, W, C), w (KH, KW, C), b (C) or NULL, out (N, OH, OW, C); relu
 * as dense's (cuda_gemm.cu) */
int gs_cuda_depthwise_forward(gs_exec *ex, gs_dtype dt, void *out, const void *in,
                              const void *w, const void *b, const gs_conv_shape *s, void *ws,
                              bool relu) {
  (void)ws;
  int rc = gs_cuda_enter(ex);
  kgeo g = kgeo_of(s, s->same);
  size_t count = (size_t)g.n * g.oh * g.ow * g.c;
  if (rc || count == 0)
    return rc;
  GS_DT_SWITCH(dt, D, typedef typename st<D>::T T;
               dw_fwd_k<D><<<gs_cuda_blocks(count), 256, 0, ex->stream>>>(
                   g, (T *)out, (const T *)in, (const T *)w, (const T *)b));
  if ((rc = GS_LAUNCHED("depthwise_forward")))
    return rc;
  return relu ? gs_cuda_relu_forward(ex, dt, out, out, count) : 0;
}

/* dw (KH, KW, C) f32 +=, db (C) f32 +=, din (N, H, W, C) dt overwritten */
int gs_cuda_depthwise_backward(gs_exec *ex, gs_dtype dt, void *din, float *dw, float *db,
                               const void *dout, const void *in, const void *w,
                               const gs_conv_shape *s, void *ws) {
  int rc = gs_cuda_enter(ex);
  kgeo g = kgeo_of(s, s->same);
  if (rc || g.n == 0)
    return rc;
  if ((dw || db) && g.c > 0 && g.oh > 0 && g.ow > 0) {
    /* chunks as the workspace query sized them (cuda_sizes.c); one pass
     * where the caller gave no workspace */
    unsigned chunks = ws ? gs_cuda_depthwise_chunks(s) : 1;
    size_t positions = (size_t)g.n * g.oh * g.ow;
    size_t chunk = (positions + chunks - 1) / chunks;
    float *partial = chunks > 1 ? (float *)ws : NULL;
    dim3 grid((unsigned)((g.c + 31) / 32), (unsigned)(g.kh * g.kw + 1), chunks),
        block(32, GS_RED_Y);
    GS_DT_SWITCH(dt, D, typedef typename st<D>::T T;
                 dw_wgrad_k<D><<<grid, block, 0, ex->stream>>>(g, dw, db, (const T *)dout,
                                                               (const T *)in, chunk, partial));
    if ((rc = GS_LAUNCHED("depthwise_backward (weights)")))
      return rc;
    if (partial) {
      size_t per = (size_t)(g.kh * g.kw + 1) * g.c;
      dw_wgrad_sum_k<<<gs_cuda_blocks(per), 256, 0, ex->stream>>>(dw, db, partial,
                                                                  g.kh * g.kw, g.c, chunks);
      if ((rc = GS_LAUNCHED("depthwise_backward (weight sums)")))
        return rc;
    }
  }
  size_t count = (size_t)g.n * g.h * g.w * g.c;
  if (din && count) {
    GS_DT_SWITCH(dt, D, typedef typename st<D>::T T;
                 dw_dgrad_k<D><<<gs_cuda_blocks(count), 256, 0, ex->stream>>>(
                     g, (T *)din, (const T *)dout, (const T *)w));
    if ((rc = GS_LAUNCHED("depthwise_backward (input)")))
      return rc;
  }
  return 0;
}

/* ---- max pool (always VALID) ---- */

template <int D>
__global__ void maxpool_fwd_k(kgeo g, typename st<D>::T *out, const typename st<D>::T *in) {
  GS_GRID_STRIDE(i, (size_t)g.n * g.oh * g.ow * g.c) {
    size_t base = pool_window(g, i);
    float best = st<D>::load(in[base]);
    for (int ky = 0; ky < g.kh; ky++)
      for (int kx = 0; kx < g.kw; kx++) {
        float x = st<D>::load(in[base + ((size_t)ky * g.w + kx) * g.c]);
        best = x > best ? x : best;
      }
    out[i] = st<D>::store(best);
  }
}

/* din: each input element sums dout of the windows whose first maximum it is */
template <int D>
__global__ void maxpool_bwd_k(kgeo g, typename st<D>::T *din, const typename st<D>::T *dout,
                              const typename st<D>::T *in) {
  GS_GRID_STRIDE(i, (size_t)g.n * g.h * g.w * g.c) {
    pool_in p = pool_windows_of(g, i);
    float acc = 0.0f;
    for (int oy = p.oy0; oy <= p.oy1; oy++)
      for (int ox = p.ox0; ox <= p.ox1; ox++) {
        size_t base = (((size_t)p.img * g.h + (size_t)oy * g.stride) * g.w +
                       (size_t)ox * g.stride) * g.c + p.ci;
        float best = 0.0f;
        int arg = 0;
        for (int ky = 0; ky < g.kh; ky++)
          for (int kx = 0; kx < g.kw; kx++) {
            float x = st<D>::load(in[base + ((size_t)ky * g.w + kx) * g.c]);
            if ((ky == 0 && kx == 0) || x > best) {
              best = x;
              arg = ky * g.kw + kx;
            }
          }
        if (arg == (p.iy - oy * g.stride) * g.kw + (p.ix - ox * g.stride))
          acc += st<D>::load(dout[pool_out_at(g, p.img, oy, ox, p.ci)]);
      }
    din[i] = st<D>::store(acc);
  }
}

int gs_cuda_maxpool_forward(gs_exec *ex, gs_dtype dt, void *out, const void *in,
                            const gs_conv_shape *s) {
  int rc = gs_cuda_enter(ex);
  kgeo g = kgeo_of(s, false);
  size_t count = (size_t)g.n * g.oh * g.ow * g.c;
  if (rc || count == 0)
    return rc;
  GS_DT_SWITCH(dt, D, typedef typename st<D>::T T;
               maxpool_fwd_k<D><<<gs_cuda_blocks(count), 256, 0, ex->stream>>>(g, (T *)out,
                                                                               (const T *)in));
  return GS_LAUNCHED("maxpool_forward");
}

int gs_cuda_maxpool_backward(gs_exec *ex, gs_dtype dt, void *din, const void *dout,
                             const void *in, const gs_conv_shape *s) {
  kgeo g;
  size_t count;
  int rc = pool_bwd_begin(ex, dt, din, s, &g, &count);
  if (rc || count == 0)
    return rc;
  GS_DT_SWITCH(dt, D, typedef typename st<D>::T T;
               maxpool_bwd_k<D><<<gs_cuda_blocks(count), 256, 0, ex->stream>>>(
                   g, (T *)din, (const T *)dout, (const T *)in));
  return GS_LAUNCHED("maxpool_backward");
}

/* ---- global average pool ---- */

template <int D>
__global__ void gap_fwd_k(typename st<D>::T *out, const typename st<D>::T *in, size_t n,
                          size_t hw, size_t c) {
  GS_GRID_STRIDE(i, n * c) {
    size_t img = i / c, ci = i % c;
    float acc = 0.0f;
    for (size_t q = 0; q < hw; q++)
      acc += st<D>::load(in[(img * hw + q) * c + ci]);
    acc /= (float)hw;
    out[i] = st<D>::store(acc);
  }
}

template <int D>
__global__ void gap_bwd_k(typename st<D>::T *din, const typename st<D>::T *dout, size_t n,
                          size_t hw, size_t c) {
  GS_GRID_STRIDE(i, n * hw * c) {
    size_t ci = i % c, img = i / (hw * c);
    din[i] = st<D>::store(st<D>::load(dout[img * c + ci]) / (float)hw);
  }
}

/* in (N, H, W, C) -> out (N, C), the mean over H*W */
int gs_cuda_gap_forward(gs_exec *ex, gs_dtype dt, void *out, const void *in, uint32_t n,
                        uint32_t h, uint32_t w, uint32_t c) {
  int rc = gs_cuda_enter(ex);
  size_t hw = (size_t)h * w;
  if (rc || (size_t)n * c == 0)
    return rc;
  if (hw == 0)
    return GS_CU(cudaMemsetAsync(out, 0, (size_t)n * c * gs_dtype_size(dt), ex->stream));
  GS_DT_SWITCH(dt, D, typedef typename st<D>::T T;
               gap_fwd_k<D><<<gs_cuda_blocks((size_t)n * c), 256, 0, ex->stream>>>(
                   (T *)out, (const T *)in, n, hw, c));
  return GS_LAUNCHED("gap_forward");
}

/* din (N, H, W, C) = dout (N, C) / (H*W), overwritten */
int gs_cuda_gap_backward(gs_exec *ex, gs_dtype dt, void *din, const void *dout, uint32_t n,
                         uint32_t h, uint32_t w, uint32_t c) {
  int rc = gs_cuda_enter(ex);
  size_t hw = (size_t)h * w, count = (size_t)n * hw * c;
  if (rc || count == 0)
    return rc;
  GS_DT_SWITCH(dt, D, typedef typename st<D>::T T;
               gap_bwd_k<D><<<gs_cuda_blocks(count), 256, 0, ex->stream>>>(
                   (T *)din, (const T *)dout, n, hw, c));
  return GS_LAUNCHED("gap_backward");
}

/* ---- relu, on the stored patterns as the CPU does ---- */

__global__ void relu_fwd_f32_k(float *y, const float *x, size_t count) {
  GS_GRID_STRIDE(i, count) {
    float v = x[i];
    y[i] = (v > 0.0f || v != v) ? v : 0.0f; /* NaN passes to the found-inf check */
  }
}

__global__ void relu_fwd_16_k(uint16_t *y, const uint16_t *x, size_t count, uint16_t inf) {
  GS_GRID_STRIDE(i, count) {
    uint16_t v = x[i];
    bool keep = !(v & 0x8000u) || (uint16_t)(v & 0x7fffu) > inf; /* >= 0, or NaN */
    y[i] = keep ? v : (uint16_t)0;
  }
}

__global__ void relu_bwd_f32_k(float *g, const float *d, const float *o, size_t count) {
  GS_GRID_STRIDE(i, count) g[i] = o[i] > 0.0f ? d[i] : 0.0f;
}

__global__ void relu_bwd_16_k(uint16_t *g, const uint16_t *d, const uint16_t *o, size_t count,
                              uint16_t inf) {
  GS_GRID_STRIDE(i, count) g[i] = (uint16_t)(o[i] - 1u) < inf ? d[i] : (uint16_t)0; /* 0 < out <= inf */
}

int gs_cuda_relu_forward(gs_exec *ex, gs_dtype dt, void *out, const void *in, size_t count) {
  int rc = gs_cuda_enter(ex);
  if (rc || count == 0)
    return rc;
  if (dt == GS_F32)
    relu_fwd_f32_k<<<gs_cuda_blocks(count), 256, 0, ex->stream>>>((float *)out,
                                                                  (const float *)in, count);
  else
    relu_fwd_16_k<<<gs_cuda_blocks(count), 256, 0, ex->stream>>>(
        (uint16_t *)out, (const uint16_t *)in, count, dt == GS_F16 ? 0x7c00 : 0x7f80);
  return GS_LAUNCHED("relu_forward");
}

int gs_cuda_relu_backward(gs_exec *ex, gs_dtype dt, void *din, const void *dout,
                          const void *out, size_t count) {
  int rc = gs_cuda_enter(ex);
  if (rc || count == 0)
    return rc;
  if (dt == GS_F32)
    relu_bwd_f32_k<<<gs_cuda_blocks(count), 256, 0, ex->stream>>>(
        (float *)din, (const float *)dout, (const float *)out, count);
  else
    relu_bwd_16_k<<<gs_cuda_blocks(count), 256, 0, ex->stream>>>(
        (uint16_t *)din, (const uint16_t *)dout, (const uint16_t *)out, count,
        dt == GS_F16 ? 0x7c00 : 0x7f80);
  return GS_LAUNCHED("relu_backward");
}

/* ---- softmax cross-entropy: one warp per example ---- */

#define GS_XENT_ROWS 8 /* warps (examples) per block */

__global__ void xent_k(float *loss, int32_t *pred, float *dl, const float *logits,
                       const int32_t *labels, uint32_t n, uint32_t k, const float *grad_scale,
                       float norm) {
  unsigned lane = threadIdx.x & 31u;
  size_t row = (size_t)blockIdx.x * GS_XENT_ROWS + threadIdx.x / 32u;
  if (row >= n)
    return; /* row is the same across a warp: the warp leaves whole */
  const float *x = logits + row * k;
  /* max and first argmax: lane-strided, then across the warp (the larger
   * value, the smaller index on ties) */
  float mx = 0.0f;
  uint32_t arg = 0xffffffffu;
  for (uint32_t j = lane; j < k; j += 32)
    if (arg == 0xffffffffu || x[j] > mx) {
      mx = x[j];
      arg = j;
    }
  for (int off = 16; off > 0; off >>= 1) {
    float omx = __shfl_xor_sync(0xffffffffu, mx, off);
    uint32_t oarg = __shfl_xor_sync(0xffffffffu, arg, off);
    bool take = oarg != 0xffffffffu &&
                (arg == 0xffffffffu || omx > mx || (omx == mx && oarg < arg));
    if (take) {
      mx = omx;
      arg = oarg;
    }
  }
  float sum = 0.0f;
  for (uint32_t j = lane; j < k; j += 32)
    sum += expf(x[j] - mx);
  for (int off = 16; off > 0; off >>= 1)
    sum += __shfl_xor_sync(0xffffffffu, sum, off);
  int32_t lab = labels[row];
  bool ok = lab >= 0 && (uint32_t)lab < k;
  if (lane == 0) {
    if (loss)
      loss[row] = ok ? logf(sum) - (x[lab] - mx) : __int_as_float(0x7fc00000);
    if (pred)
      pred[row] = (int32_t)arg;
  }
  if (dl) {
    float g = (grad_scale ? *grad_scale : 1.0f) / norm, inv = 1.0f / sum;
    float *d = dl + row * k;
    for (uint32_t j = lane; j < k; j += 32) {
      float v = expf(x[j] - mx) * inv * g;
      if ((int32_t)j == lab)
        v -= g;
      d[j] = ok ? v : 0.0f;
    }
  }
}

int gs_cuda_xent(gs_exec *ex, float *loss, int32_t *pred, float *dlogits, const float *logits,
                 const int32_t *labels, uint32_t n, uint32_t k, const float *grad_scale,
                 float norm) {
  if (k == 0)
    return n ? -EINVAL : 0;
  int rc = gs_cuda_enter(ex);
  if (rc || n == 0)
    return rc;
  unsigned blocks = (n + GS_XENT_ROWS - 1) / GS_XENT_ROWS;
  xent_k<<<blocks, 32 * GS_XENT_ROWS, 0, ex->stream>>>(loss, pred, dlogits, logits, labels, n, k,
                                                       grad_scale, norm);
  return GS_LAUNCHED("xent_forward_backward");
}

/* ---- casts ---- */

template <int S, int D>
__global__ void cast_k(typename st<D>::T *dst, const typename st<S>::T *src, size_t count) {
  GS_GRID_STRIDE(i, count) dst[i] = st<D>::store(st<S>::load(src[i]));
}

/* memmove on ex's stream: cudaMemcpyAsync's result is undefined when the
 * two ranges overlap (as memcpy's), and the cpu backend's same-type cast is
 * a memmove. Overlapping ranges are copied in chunks of their distance,
 * which never overlap, in the order that reads each byte before it is
 * written over: from the front when dst is below src, else from the back. */
int gs_cuda_move(gs_exec *ex, void *dst, const void *src, size_t bytes) {
  char *d = (char *)dst;
  const char *s = (const char *)src;
  if (d == s || bytes == 0)
    return 0;
  size_t gap = d > s ? (size_t)(d - s) : (size_t)(s - d);
  if (gap >= bytes)
    return GS_CU(cudaMemcpyAsync(d, s, bytes, cudaMemcpyDeviceToDevice, ex->stream));
  int rc = 0;
  if (d < s) {
    for (size_t off = 0; off < bytes && !rc; off += gap) {
      size_t n = bytes - off < gap ? bytes - off : gap;
      rc = GS_CU(cudaMemcpyAsync(d + off, s + off, n, cudaMemcpyDeviceToDevice, ex->stream));
    }
  } else {
    for (size_t end = bytes; end > 0 && !rc;) {
      size_t n = end < gap ? end : gap;
      end -= n;
      rc = GS_CU(cudaMemcpyAsync(d + end, s + end, n, cudaMemcpyDeviceToDevice, ex->stream));
    }
  }
  return rc;
}

int gs_cuda_cast(gs_exec *ex, void *dst, gs_dtype dst_dt, const void *src, gs_dtype src_dt,
                 size_t count) {
  int rc = gs_cuda_enter(ex);
  if (rc || count == 0)
    return rc;
  if (dst_dt == src_dt)
    return gs_cuda_move(ex, dst, src, count * gs_dtype_size(src_dt));
  unsigned blocks = gs_cuda_blocks(count);
  GS_DT_SWITCH(src_dt, S, GS_DT_SWITCH(dst_dt, D,
                                       cast_k<S, D><<<blocks, 256, 0, ex->stream>>>(
                                           (typename st<D>::T *)dst,
                                           (const typename st<S>::T *)src, count)));
  return GS_LAUNCHED("cast");
}

/* ---- mixed precision bookkeeping ---- */

__global__ void unscale_k(float *g, size_t count, const float *scale, int32_t *found_inf) {
  float inv = 1.0f / *scale;
  bool bad = false;
  GS_GRID_STRIDE(i, count) {
    float v = g[i] * inv;
    g[i] = v;
    bad |= (__float_as_uint(v) & 0x7f800000u) == 0x7f800000u; /* inf or NaN */
  }
  if (bad)
    *found_inf = 1; /* every writer stores the same value */
}

/* g (count) *= 1 / *scale; *found_inf = 1 when an element is inf or NaN. */
int gs_cuda_unscale_check(gs_exec *ex, float *g, size_t count, const float *scale,
                          int32_t *found_inf) {
  int rc = gs_cuda_enter(ex);
  if (rc || count == 0)
    return rc;
  unscale_k<<<gs_cuda_blocks(count), 256, 0, ex->stream>>>(g, count, scale, found_inf);
  return GS_LAUNCHED("unscale_check");
}

__global__ void loss_scale_k(float *scale, int32_t *good, int32_t *found_inf, int64_t *skipped,
                             uint32_t growth_interval) {
  if (*found_inf) {
    float s = *scale * 0.5f;
    *scale = s < 1.0f ? 1.0f : s;
    *good = 0;
    (*skipped)++;
  } else {
    (*good)++;
    if ((uint32_t)*good >= growth_interval) {
      float s = *scale * 2.0f;
      *scale = s > GS_LOSS_SCALE_MAX ? GS_LOSS_SCALE_MAX : s;
      *good = 0;
    }
  }
  *found_inf = 0;
}

int gs_cuda_loss_scale_update(gs_exec *ex, float *scale, int32_t *good, int32_t *found_inf,
                              int64_t *skipped, uint32_t growth_interval) {
  int rc = gs_cuda_enter(ex);
  if (rc)
    return rc;
  loss_scale_k<<<1, 1, 0, ex->stream>>>(scale, good, found_inf, skipped, growth_interval);
  return GS_LAUNCHED("loss_scale_update");
}

/* ---- optimizers ---- */

/* Both optimizers consume g (backend.h): each element is cleared once read,
 * and a skipped step clears it too. */
__global__ void sgd_k(float *w, float *g, float *m, size_t count, float lr, float mu,
                      bool nesterov, float wd, const int32_t *skip) {
  const bool skipped = skip && *skip;
  GS_GRID_STRIDE(i, count) {
    if (skipped) {
      g[i] = 0.0f;
    } else if (mu > 0.0f) {
      float gi = g[i] + wd * w[i];
      g[i] = 0.0f;
      float mi = mu * m[i] + gi;
      m[i] = mi;
      w[i] -= lr * (nesterov ? gi + mu * mi : mi);
    } else {
      w[i] -= lr * (g[i] + wd * w[i]);
      g[i] = 0.0f;
    }
  }
}

/* w, g, m (count) f32; m may be NULL when momentum == 0. */
int gs_cuda_sgd_step(gs_exec *ex, float *w, float *g, float *m, size_t count, float lr,
                     float momentum, bool nesterov, float weight_decay, const int32_t *skip) {
  if (momentum > 0.0f && !m)
    return -EINVAL;
  int rc = gs_cuda_enter(ex);
  if (rc || count == 0)
    return rc;
  sgd_k<<<gs_cuda_blocks(count), 256, 0, ex->stream>>>(w, g, m, count, lr, momentum, nesterov,
                                                       weight_decay, skip);
  return GS_LAUNCHED("sgd_step");
}

__global__ void adam_k(float *w, float *g, float *m, float *v, size_t count, float lr,
                       float b1, float b2, float eps, float cwd, float dwd, float bc1, float bc2,
                       const int32_t *skip) {
  const bool skipped = skip && *skip;
  GS_GRID_STRIDE(i, count) {
    if (skipped) {
      g[i] = 0.0f;
      continue;
    }
    float wi = w[i];
    float gi = g[i] + cwd * wi;
    g[i] = 0.0f;
    float mi = b1 * m[i] + (1.0f - b1) * gi;
    float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    wi -= dwd * wi;
    w[i] = wi - lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
  }
}

/* w, g, m, v (count) f32; t is the 1-based step after this update. */
int gs_cuda_adam_step(gs_exec *ex, float *w, float *g, float *m, float *v, size_t count,
                      float lr, float beta1, float beta2, float eps, float weight_decay,
                      bool decoupled, uint64_t t, const int32_t *skip) {
  if (t == 0)
    return -EINVAL; /* bias correction would divide by zero */
  int rc = gs_cuda_enter(ex);
  if (rc || count == 0)
    return rc;
  float bc1 = (float)(1.0 - pow((double)beta1, (double)t));
  float bc2 = (float)(1.0 - pow((double)beta2, (double)t));
  float cwd = decoupled ? 0.0f : weight_decay, dwd = decoupled ? lr * weight_decay : 0.0f;
  adam_k<<<gs_cuda_blocks(count), 256, 0, ex->stream>>>(w, g, m, v, count, lr, beta1, beta2, eps,
                                                        cwd, dwd, bc1, bc2, skip);
  return GS_LAUNCHED("adam_step");
}
