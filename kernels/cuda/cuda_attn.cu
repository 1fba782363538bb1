/*
 * cuda_attn.cu: the `cuda` backend's transformer ops: token and learned
 * position embeddings, and the core of causal multi-head self-attention.
 *
 * Storage as in cuda_ops.cu: templates over the storage type, fp32 math,
 * one rounding to nearest even on store, the CPU's bits for every number.
 *
 * No float atomics, so every result is the same bits run after run, and
 * the same as the cpu backend's where the math is only additions:
 *  - the token embedding's gradient is a sum over the tokens of each id.
 *    One block owns GS_EMB_ROWS vocabulary rows x 128 channels of dtable;
 *    it scans all ids in order, a tile at a time, compacts the tokens of
 *    its rows into a list that keeps their order (a warp ballot and the
 *    warps' counts), and each thread adds its channel of those tokens'
 *    dout rows onto its own accumulators, which start from dtable. So
 *    every element is dtable + d_first + d_second + ..., in token order,
 *    as on the CPU. Each block reads all ids (V / GS_EMB_ROWS x C / 128
 *    blocks of ROWS ids, from L2); a faster version would sort the ids
 *    once (a stable radix sort of (id, token)) and give each block its
 *    segment, which needs a workspace the planner can size from CUB's
 *    bound.
 *  - the position embedding's gradient: one thread per (t, c) adds dout
 *    over n in order.
 *
 * Attention, correctness first: one block of GS_ATTN_THREADS threads per
 * row, every sum in a fixed order (each thread a strided slice, then the
 * warps' shuffles and the warps in order).
 *  - forward, a block per query row (n, h, t): the scores q_t . k_s / sqrt(D)
 *    for s <= t go straight into the row of probs (the output, used as the
 *    row's scratch), then the max, the sum of exponentials, the normalised
 *    row and its zeros for s > t; then out_t = the row . v, one channel a
 *    thread.
 *  - backward, two passes. A block per query row: dP_s = dout_t . v_s for
 *    s <= t into shared memory, the row's sum of probs * dP (kept in the
 *    workspace, N*H*T floats), dS in place and dq_t = dS . k / sqrt(D). A
 *    block per key row (n, h, s): for t >= s, probs[t][s] and dS[t][s]
 *    (dP recomputed, the row sums from the first pass) into shared memory,
 *    then dv_s = sum_t probs dout_t and dk_s = sum_t dS q_t / sqrt(D).
 *    Masked pairs never enter a sum.
 *  The rows' scratch is T (forward: D) floats of shared memory per block,
 *  2T + D at most: past the default 48 KiB (T over 6000) the kernels ask
 *  for more (cudaFuncAttributeMaxDynamicSharedMemorySize), up to the
 *  device's limit (227 KiB on Hopper: T up to about 29,000).
 *  A faster version would tile the rows as flash attention does: blocks of
 *  queries against blocks of keys through shared memory on the tensor
 *  cores (a warp-level MMA), the softmax kept online, and the key-side
 *  backward done by the same tiles rather than by a second pass reading
 *  probs by columns.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda/cuda_dtype.cuh"
#include "kernels/cuda/cuda_internal.h"
#include "kernels/cuda_sizes.h"

namespace {

/* ---- token embedding ---- */

/* out[i, c] = table[ids[i], c], the stored bits; NaN for an id outside
 * [0, V) (the CPU refuses those with -EINVAL). */
template <int D>
__global__ void emb_fwd_k(typename st<D>::T *out, const int32_t *ids,
                          const typename st<D>::T *table, uint32_t rows, uint32_t v, uint32_t c) {
  size_t count = (size_t)rows * c;
  GS_GRID_STRIDE(i, count) {
    size_t r = i / c, q = i - r * c;
    int32_t id = ids[r];
    out[i] = id >= 0 && (uint32_t)id < v ? table[(size_t)id * c + q]
                                         : st<D>::store(__int_as_float(0x7fc00000));
  }
}

#define GS_EMB_ROWS 32     /* vocabulary rows one block owns */
#define GS_EMB_THREADS 128 /* channels one block owns, one a thread; ids a tile */

/* dtable rows [v0, v0 + GS_EMB_ROWS) x channels [c0, c0 + 128) += the dout
 * rows of their tokens, in token order */
template <int D>
__global__ void __launch_bounds__(GS_EMB_THREADS)
    emb_bwd_k(float *dtable, const typename st<D>::T *dout, const int32_t *ids, uint32_t rows,
              uint32_t v, uint32_t c) {
  __shared__ float acc[GS_EMB_ROWS][GS_EMB_THREADS]; /* column threadIdx.x is that thread's */
  __shared__ uint32_t list[GS_EMB_THREADS];          /* this tile's tokens of these rows */
  __shared__ uint8_t slot[GS_EMB_THREADS];           /* and their rows, less v0 */
  __shared__ uint32_t warp_n[GS_EMB_THREADS / 32];
  __shared__ uint8_t hit[GS_EMB_ROWS];               /* a token of the row was seen */
  const unsigned tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
  const uint32_t v0 = blockIdx.x * GS_EMB_ROWS, col = blockIdx.y * GS_EMB_THREADS + tid;
  const uint32_t nrows = v - v0 < GS_EMB_ROWS ? v - v0 : GS_EMB_ROWS;
  for (uint32_t r = 0; r < nrows; r++)
    acc[r][tid] = col < c ? dtable[(size_t)(v0 + r) * c + col] : 0.0f;
  if (tid < GS_EMB_ROWS)
    hit[tid] = 0;
  __syncthreads();
  for (uint32_t base = 0; base < rows; base += GS_EMB_THREADS) {
    uint32_t i = base + tid;
    int32_t id = i < rows ? ids[i] : -1;
    bool mine = id >= 0 && (uint32_t)id >= v0 && (uint32_t)id - v0 < nrows;
    unsigned m = __ballot_sync(0xffffffffu, mine);
    if (lane == 0)
      warp_n[warp] = (uint32_t)__popc(m);
    __syncthreads();
    uint32_t off = 0, total = 0;
    for (unsigned w = 0; w < GS_EMB_THREADS / 32; w++) {
      off += w < warp ? warp_n[w] : 0;
      total += warp_n[w];
    }
    if (mine) {
      uint32_t at = off + (uint32_t)__popc(m & ((1u << lane) - 1u));
      list[at] = i;
      slot[at] = (uint8_t)((uint32_t)id - v0);
      hit[(uint32_t)id - v0] = 1; /* every writer stores 1 */
    }
    __syncthreads();
    if (col < c)
      for (uint32_t k = 0; k < total; k++)
        acc[slot[k]][tid] += st<D>::load(dout[(size_t)list[k] * c + col]);
    __syncthreads(); /* list, slot and warp_n are the next tile's */
  }
  if (col < c)
    for (uint32_t r = 0; r < nrows; r++)
      if (hit[r])
        dtable[(size_t)(v0 + r) * c + col] = acc[r][tid];
}

/* ---- learned position embedding ---- */

template <int D>
__global__ void pos_fwd_k(typename st<D>::T *out, const typename st<D>::T *in,
                          const typename st<D>::T *pos, size_t count, size_t tc) {
  GS_GRID_STRIDE(i, count) {
    out[i] = st<D>::store(st<D>::load(in[i]) + st<D>::load(pos[i % tc]));
  }
}

/* dpos[j] += dout[s * tc + j] for s = 0 .. n-1, in order */
template <int D>
__global__ void pos_bwd_k(float *dpos, const typename st<D>::T *dout, uint32_t n, size_t tc) {
  GS_GRID_STRIDE(j, tc) {
    float a = dpos[j];
    for (uint32_t s = 0; s < n; s++)
      a += st<D>::load(dout[(size_t)s * tc + j]);
    dpos[j] = a;
  }
}

/* ---- causal multi-head self-attention ---- */

#define GS_ATTN_THREADS 128
#define GS_ATTN_WARPS (GS_ATTN_THREADS / 32)

/* The sum (or the max) of v over the block, in a fixed order, in every
 * thread; red holds GS_ATTN_WARPS floats. Every thread must call it. */
__device__ __forceinline__ float block_reduce(float v, bool max, float *red) {
  for (int off = 16; off > 0; off >>= 1) {
    float o = __shfl_xor_sync(0xffffffffu, v, off);
    v = max ? fmaxf(v, o) : v + o;
  }
  if ((threadIdx.x & 31u) == 0)
    red[threadIdx.x >> 5] = v;
  __syncthreads();
  float r = red[0];
  for (int w = 1; w < GS_ATTN_WARPS; w++)
    r = max ? fmaxf(r, red[w]) : r + red[w];
  __syncthreads(); /* red is the next call's */
  return r;
}

/* Where a row's vectors are: qkv (N, T, 3HD), head bh of sample bn. */
struct attn_geo {
  uint32_t t, h, d;
  size_t hd, ld3; /* H*D and the row stride of qkv */
};

/* block = query row (bn*H + bh)*T + tq; shared: q_t (D floats) */
template <int D>
__global__ void __launch_bounds__(GS_ATTN_THREADS)
    attn_fwd_k(typename st<D>::T *out, float *probs, const typename st<D>::T *qkv, attn_geo g,
               float scale) {
  typedef typename st<D>::T T;
  extern __shared__ float sh[];
  __shared__ float red[GS_ATTN_WARPS];
  const size_t row = blockIdx.x, pair = row / g.t;
  const uint32_t tq = (uint32_t)(row - pair * g.t), bh = (uint32_t)(pair % g.h);
  const size_t bn = pair / g.h;
  const T *qrow = qkv + (bn * g.t + tq) * g.ld3 + (size_t)bh * g.d;
  const T *kb = qkv + bn * g.t * g.ld3 + g.hd + (size_t)bh * g.d, *vb = kb + g.hd;
  float *p = probs + row * g.t;
  for (uint32_t i = threadIdx.x; i < g.d; i += GS_ATTN_THREADS)
    sh[i] = st<D>::load(qrow[i]);
  __syncthreads();
  float mx = -INFINITY;
  for (uint32_t s = threadIdx.x; s <= tq; s += GS_ATTN_THREADS) {
    const T *k = kb + s * g.ld3;
    float dot = 0.0f;
    for (uint32_t i = 0; i < g.d; i++)
      dot += sh[i] * st<D>::load(k[i]);
    float sc = dot * scale;
    p[s] = sc;
    mx = fmaxf(mx, sc);
  }
  mx = block_reduce(mx, true, red);
  float sum = 0.0f;
  for (uint32_t s = threadIdx.x; s <= tq; s += GS_ATTN_THREADS) {
    float e = expf(p[s] - mx);
    p[s] = e;
    sum += e;
  }
  sum = block_reduce(sum, false, red);
  float inv = 1.0f / sum;
  for (uint32_t s = threadIdx.x; s < g.t; s += GS_ATTN_THREADS)
    p[s] = s <= tq ? p[s] * inv : 0.0f;
  __syncthreads(); /* the row, written by all, read by all */
  T *o = out + (bn * g.t + tq) * g.hd + (size_t)bh * g.d;
  for (uint32_t i = threadIdx.x; i < g.d; i += GS_ATTN_THREADS) {
    float acc = 0.0f;
    for (uint32_t s = 0; s <= tq; s++)
      acc += p[s] * st<D>::load(vb[s * g.ld3 + i]);
    o[i] = st<D>::store(acc);
  }
}

/* block = query row; shared: dout_t (D), dS row (T). rowdot[row] = the
 * row's sum of probs * dP; dq_t = dS . k * scale */
template <int D>
__global__ void __launch_bounds__(GS_ATTN_THREADS)
    attn_bwd_q_k(typename st<D>::T *dqkv, float *rowdot, const typename st<D>::T *dout,
                 const typename st<D>::T *qkv, const float *probs, attn_geo g, float scale) {
  typedef typename st<D>::T T;
  extern __shared__ float sh[];
  __shared__ float red[GS_ATTN_WARPS];
  float *sdo = sh, *ds = sh + g.d;
  const size_t row = blockIdx.x, pair = row / g.t;
  const uint32_t tq = (uint32_t)(row - pair * g.t), bh = (uint32_t)(pair % g.h);
  const size_t bn = pair / g.h;
  const T *drow = dout + (bn * g.t + tq) * g.hd + (size_t)bh * g.d;
  const T *kb = qkv + bn * g.t * g.ld3 + g.hd + (size_t)bh * g.d, *vb = kb + g.hd;
  const float *p = probs + row * g.t;
  for (uint32_t i = threadIdx.x; i < g.d; i += GS_ATTN_THREADS)
    sdo[i] = st<D>::load(drow[i]);
  __syncthreads();
  float acc = 0.0f;
  for (uint32_t s = threadIdx.x; s <= tq; s += GS_ATTN_THREADS) {
    const T *v = vb + s * g.ld3;
    float dp = 0.0f;
    for (uint32_t i = 0; i < g.d; i++)
      dp += sdo[i] * st<D>::load(v[i]);
    ds[s] = dp;
    acc += p[s] * dp;
  }
  float dot = block_reduce(acc, false, red);
  for (uint32_t s = threadIdx.x; s <= tq; s += GS_ATTN_THREADS)
    ds[s] = p[s] * (ds[s] - dot);
  if (threadIdx.x == 0)
    rowdot[row] = dot;
  __syncthreads();
  T *dq = dqkv + (bn * g.t + tq) * g.ld3 + (size_t)bh * g.d;
  for (uint32_t i = threadIdx.x; i < g.d; i += GS_ATTN_THREADS) {
    float a = 0.0f;
    for (uint32_t s = 0; s <= tq; s++)
      a += ds[s] * st<D>::load(kb[s * g.ld3 + i]);
    dq[i] = st<D>::store(a * scale);
  }
}

/* block = key row (bn*H + bh)*T + sk; shared: v_s (D), probs[t][s] and
 * dS[t][s] for t >= s (T each). dv_s = sum_t probs dout_t, dk_s = sum_t
 * dS q_t * scale */
template <int D>
__global__ void __launch_bounds__(GS_ATTN_THREADS)
    attn_bwd_kv_k(typename st<D>::T *dqkv, const float *rowdot, const typename st<D>::T *dout,
                  const typename st<D>::T *qkv, const float *probs, attn_geo g, float scale) {
  typedef typename st<D>::T T;
  extern __shared__ float sh[];
  float *sv = sh, *cp = sh + g.d, *cds = cp + g.t;
  const size_t row = blockIdx.x, pair = row / g.t;
  const uint32_t sk = (uint32_t)(row - pair * g.t), bh = (uint32_t)(pair % g.h);
  const size_t bn = pair / g.h;
  const T *qb = qkv + bn * g.t * g.ld3 + (size_t)bh * g.d;
  const T *db = dout + bn * g.t * g.hd + (size_t)bh * g.d;
  const T *vrow = qb + (size_t)sk * g.ld3 + 2 * g.hd;
  const float *pcol = probs + pair * g.t * g.t + sk; /* probs[t][sk] at t * T */
  const float *rd = rowdot + pair * g.t;
  for (uint32_t i = threadIdx.x; i < g.d; i += GS_ATTN_THREADS)
    sv[i] = st<D>::load(vrow[i]);
  __syncthreads();
  for (uint32_t t = sk + threadIdx.x; t < g.t; t += GS_ATTN_THREADS) {
    const T *d = db + (size_t)t * g.hd;
    float dp = 0.0f;
    for (uint32_t i = 0; i < g.d; i++)
      dp += st<D>::load(d[i]) * sv[i];
    float pt = pcol[(size_t)t * g.t];
    cp[t] = pt;
    cds[t] = pt * (dp - rd[t]);
  }
  __syncthreads();
  T *dk = dqkv + (bn * g.t + sk) * g.ld3 + g.hd + (size_t)bh * g.d, *dv = dk + g.hd;
  for (uint32_t i = threadIdx.x; i < g.d; i += GS_ATTN_THREADS) {
    float ak = 0.0f, av = 0.0f;
    for (uint32_t t = sk; t < g.t; t++) {
      av += cp[t] * st<D>::load(db[(size_t)t * g.hd + i]);
      ak += cds[t] * st<D>::load(qb[(size_t)t * g.ld3 + i]);
    }
    dv[i] = st<D>::store(av);
    dk[i] = st<D>::store(ak * scale);
  }
}

/* Launch `kernel` over `blocks` with `shmem` bytes of dynamic shared
 * memory, asking for more than the default 48 KiB where needed. */
template <typename K, typename... A>
int attn_launch(gs_exec *ex, K kernel, size_t blocks, size_t shmem, const char *name,
                A... args) {
  if (blocks > 0x7fffffffu)
    return -EINVAL; /* 2^31 rows of attention: no such batch */
  int rc;
  if (shmem > ((size_t)48 << 10) &&
      (rc = GS_CU(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)shmem))))
    return rc;
  kernel<<<(unsigned)blocks, GS_ATTN_THREADS, shmem, ex->stream>>>(args...);
  return GS_LAUNCHED(name);
}

attn_geo attn_geo_of(uint32_t t, uint32_t heads, uint32_t head_size) {
  attn_geo g;
  g.t = t;
  g.h = heads;
  g.d = head_size;
  g.hd = (size_t)heads * head_size;
  g.ld3 = 3 * g.hd;
  return g;
}

} // namespace

/* the row sums of the backward's first pass */
size_t gs_cuda_attention_workspace(gs_dtype dt, uint32_t n, uint32_t t, uint32_t heads,
                                   uint32_t head_size) {
  return gs_cuda_size_attention(dt, n, t, heads, head_size);
}

int gs_cuda_attention_forward(gs_exec *ex, gs_dtype dt, void *out, float *probs, const void *qkv,
                              uint32_t n, uint32_t t, uint32_t heads, uint32_t head_size,
                              void *ws) {
  (void)ws;
  int rc = gs_cuda_enter(ex);
  size_t rows = (size_t)n * heads * t;
  if (rc || rows == 0 || head_size == 0)
    return rc;
  attn_geo g = attn_geo_of(t, heads, head_size);
  float scale = 1.0f / sqrtf((float)head_size);
  size_t shmem = sizeof(float) * head_size;
  GS_DT_SWITCH(dt, D, typedef typename st<D>::T T;
                    rc = attn_launch(ex, attn_fwd_k<D>, rows, shmem, "attention_forward",
                                     (T *)out, probs, (const T *)qkv, g, scale));
  return rc;
}

int gs_cuda_attention_backward(gs_exec *ex, gs_dtype dt, void *dqkv, const void *dout,
                               const void *qkv, const float *probs, uint32_t n, uint32_t t,
                               uint32_t heads, uint32_t head_size, void *ws) {
  int rc = gs_cuda_enter(ex);
  size_t rows = (size_t)n * heads * t;
  if (rc || rows == 0 || head_size == 0)
    return rc;
  attn_geo g = attn_geo_of(t, heads, head_size);
  float scale = 1.0f / sqrtf((float)head_size), *rowdot = (float *)ws;
  size_t shq = sizeof(float) * ((size_t)head_size + t);
  size_t shkv = sizeof(float) * ((size_t)head_size + 2 * (size_t)t);
  GS_DT_SWITCH(dt, D, typedef typename st<D>::T T;
                    rc = attn_launch(ex, attn_bwd_q_k<D>, rows, shq, "attention_backward (q)",
                                     (T *)dqkv, rowdot, (const T *)dout, (const T *)qkv, probs,
                                     g, scale);
                    if (!rc) rc = attn_launch(ex, attn_bwd_kv_k<D>, rows, shkv,
                                              "attention_backward (k, v)", (T *)dqkv,
                                              (const float *)rowdot, (const T *)dout,
                                              (const T *)qkv, probs, g, scale));
  return rc;
}

int gs_cuda_embedding_forward(gs_exec *ex, gs_dtype dt, void *out, const int32_t *ids,
                              const void *table, uint32_t rows, uint32_t v, uint32_t c) {
  int rc = gs_cuda_enter(ex);
  size_t count = (size_t)rows * c;
  if (rc || count == 0)
    return rc;
  GS_DT_SWITCH(dt, D, typedef typename st<D>::T T;
                    emb_fwd_k<D><<<gs_cuda_blocks(count), 256, 0, ex->stream>>>(
                        (T *)out, ids, (const T *)table, rows, v, c));
  return GS_LAUNCHED("embedding_forward");
}

int gs_cuda_embedding_backward(gs_exec *ex, gs_dtype dt, float *dtable, const void *dout,
                               const int32_t *ids, uint32_t rows, uint32_t v, uint32_t c) {
  int rc = gs_cuda_enter(ex);
  if (rc || rows == 0 || v == 0 || c == 0)
    return rc;
  size_t gy = ((size_t)c + GS_EMB_THREADS - 1) / GS_EMB_THREADS;
  if (gy > 65535)
    return -EINVAL; /* 8 million channels: no such table */
  dim3 grid((v + GS_EMB_ROWS - 1) / GS_EMB_ROWS, (unsigned)gy);
  GS_DT_SWITCH(dt, D, typedef typename st<D>::T T;
                    emb_bwd_k<D><<<grid, GS_EMB_THREADS, 0, ex->stream>>>(
                        dtable, (const T *)dout, ids, rows, v, c));
  return GS_LAUNCHED("embedding_backward");
}

int gs_cuda_posembed_forward(gs_exec *ex, gs_dtype dt, void *out, const void *in,
                             const void *pos, uint32_t n, uint32_t t, uint32_t c) {
  int rc = gs_cuda_enter(ex);
  size_t tc = (size_t)t * c, count = tc * n;
  if (rc || count == 0)
    return rc;
  GS_DT_SWITCH(dt, D, typedef typename st<D>::T T;
                    pos_fwd_k<D><<<gs_cuda_blocks(count), 256, 0, ex->stream>>>(
                        (T *)out, (const T *)in, (const T *)pos, count, tc));
  return GS_LAUNCHED("posembed_forward");
}

int gs_cuda_posembed_backward(gs_exec *ex, gs_dtype dt, void *din, float *dpos,
                              const void *dout, uint32_t n, uint32_t t, uint32_t c) {
  int rc = gs_cuda_enter(ex);
  size_t tc = (size_t)t * c;
  if (rc || tc == 0 || n == 0)
    return rc;
  GS_DT_SWITCH(dt, D, typedef typename st<D>::T T;
                    pos_bwd_k<D><<<gs_cuda_blocks(tc), 256, 0, ex->stream>>>(
                        dpos, (const T *)dout, n, tc));
  if ((rc = GS_LAUNCHED("posembed_backward")))
    return rc;
  if (din && din != dout)
    rc = GS_CU(cudaMemcpyAsync(din, dout, tc * n * gs_dtype_size(dt), cudaMemcpyDeviceToDevice,
                               ex->stream));
  return rc;
}
