/*
 * cpu_conv_direct.c: fp32 conv2d as direct AVX-512 loops, for the layers
 * im2col + GEMM (cpu_conv.c) serves less well on a CPU with AVX-512.
 *
 * im2col writes each output pixel's window out as a row (KH*KW times the
 * input for a 3x3 window) and OpenBLAS packs that matrix once more before
 * its kernel reads it: at the channel counts of a small ResNet (24 to 96)
 * the two copies cost as much as a third of the multiply-adds. Here the
 * windows are read where they lie. The input is copied once, zero-padded,
 * so that every window is whole (or read in place when no window crosses
 * an edge), and a register block of R output pixels x V vectors of 16
 * output channels accumulates over the window's taps and channels: for
 * each (tap, channel) V weight vectors are loaded and each pixel's input
 * value is broadcast into R*V fused multiply-adds.
 *
 * The weight gradient is the same sum turned around: per tap, a block of
 * R input channels x V vectors of output channels accumulates over every
 * output pixel, loading V vectors of dout and broadcasting R input values.
 * Threads own disjoint blocks of dw and add each image in image order, so
 * dw is the same bits on any number of threads. A stride-1 input gradient
 * is the forward loop run on dout with the window turned around
 * (cpu_conv.c, conv_transposed).
 *
 * Only the AVX-512 level takes these loops (gs_cpu_dconv_ok); every other
 * level and storage type keeps im2col + GEMM. The sums are fused
 * multiply-adds in a different order than OpenBLAS's, so the results are
 * not the bits of the other levels: test_kernels_isa holds them to fp32's
 * tolerance of a double-precision definition and to the same bits on 1 and
 * 2 threads.
 */
#include <string.h>

#include "kernels/cpu/cpu_internal.h"

#if defined(GS_CPU_X86_TARGETS)
#include <immintrin.h>

/* the largest register block of R pixels (or input channels) for V
 * vectors: R*V accumulators, V weight vectors and the broadcast in 32 */
static long rmax(long v) { return v == 1 ? 14 : v == 2 ? 14 : v == 3 ? 9 : 7; }

/* f in nfb blocks of v vectors each (the last may be shorter) */
static void f_blocks(long f, long *v, long *nfb) {
  long vecs = (f + 15) / 16;
  *nfb = (vecs + 3) / 4;
  *v = (vecs + *nfb - 1) / *nfb;
}

/* mask of the lanes of vector j of a block of `left` channels */
static inline __mmask16 lane_mask(long left, long j) {
  long n = left - 16 * j;
  return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1u);
}

/* padded-input geometry: rows hp, columns wp; in place when no window
 * crosses an edge */
static void pad_geo(const gs_cpu_geo *g, long *hp, long *wp, bool *inplace) {
  *hp = (g->oh - 1) * g->stride + g->kh;
  *wp = (g->ow - 1) * g->stride + g->kw;
  *inplace = g->pt == 0 && g->pl == 0 && *hp <= g->h && *wp <= g->w;
  if (*inplace)
    *hp = g->h, *wp = g->w;
}

size_t gs_cpu_dconv_pad_floats(const gs_cpu_geo *g, long images) {
  long hp, wp;
  bool inplace;
  pad_geo(g, &hp, &wp, &inplace);
  return inplace ? 0 : (size_t)images * (size_t)(hp * wp * g->c);
}

bool gs_cpu_dconv_ok(gs_dtype dt) {
  return dt == GS_F32 && gs_cpu_clone() == GS_CPU_ISA_AVX512;
}

/* ---- the padded copy ---- */

struct pad_job {
  const gs_cpu_geo *g;
  const float *in;
  float *p;
  long n0, hp, wp;
};

/* padded rows [lo, hi) of the chunk */
static void pad_part(void *ctx, size_t lo, size_t hi) {
  const struct pad_job *j = ctx;
  const gs_cpu_geo *g = j->g;
  long c = g->c, cols = j->wp - g->pl < g->w ? j->wp - g->pl : g->w;
  for (long r = (long)lo; r < (long)hi; r++) {
    long img = r / j->hp, iy = r % j->hp - g->pt;
    float *d = j->p + (size_t)r * (size_t)(j->wp * c);
    if (iy < 0 || iy >= g->h) {
      memset(d, 0, sizeof(float) * (size_t)(j->wp * c));
      continue;
    }
    memset(d, 0, sizeof(float) * (size_t)(g->pl * c));
    memcpy(d + g->pl * c, j->in + (size_t)(((j->n0 + img) * g->h + iy) * g->w * c),
           sizeof(float) * (size_t)(cols * c));
    memset(d + (g->pl + cols) * c, 0, sizeof(float) * (size_t)((j->wp - g->pl - cols) * c));
  }
}

/* images [n0, n0 + nc) of in, padded into p (or in itself where in place) */
static const float *pad_chunk(gs_exec *ex, const gs_cpu_geo *g, const float *in, float *p,
                              long n0, long nc) {
  long hp, wp;
  bool inplace;
  pad_geo(g, &hp, &wp, &inplace);
  if (inplace)
    return in + (size_t)n0 * (size_t)(g->h * g->w * g->c);
  struct pad_job j = {.g = g, .in = in, .p = p, .n0 = n0, .hp = hp, .wp = wp};
  gs_cpu_parallel(ex, (size_t)(nc * hp), 8, pad_part, &j);
  return p;
}

/* The register blocks: R x V accumulators (at most 14 x 4), V lane masks
 * for the block's channels (the last vector may be short). The loops over
 * r and v unroll in full, so each acc[r][v] is a register. */

/* vecs[v] = the V vectors at p, masked */
static inline __attribute__((always_inline)) GS_CPU_TARGET_AVX512 void
dc_loadv(const int V, __m512 *vecs, const __mmask16 *m, const float *p) {
#pragma GCC unroll 16
  for (int v = 0; v < V; v++)
    vecs[v] = _mm512_maskz_loadu_ps(m[v], p + 16 * v);
}

/* acc[r][v] += x[r * xs] * vecs[v]: R broadcasts, R*V fused multiply-adds */
static inline __attribute__((always_inline)) GS_CPU_TARGET_AVX512 void
dc_fma(const int R, const int V, __m512 acc[14][4], const float *x, long xs,
       const __m512 *vecs) {
#pragma GCC unroll 16
  for (int r = 0; r < R; r++) {
    __m512 xv = _mm512_set1_ps(x[r * xs]);
#pragma GCC unroll 16
    for (int v = 0; v < V; v++)
      acc[r][v] = _mm512_fmadd_ps(xv, vecs[v], acc[r][v]);
  }
}

/* ---- forward: R output pixels x V vectors of output channels ---- */

struct fwd_args {
  const float *a; /* padded input at the tile's first window's first tap */
  long sp, rowp;  /* floats from one pixel's window to the next, padded row */
  long kh, kw, c, f;
  const float *w; /* w (KH, KW, C, F) at the block's first channel */
  const float *b; /* bias at the block's first channel, or NULL */
  long left;      /* channels from the block's first to F */
  bool relu;
  float *o; /* out at the tile's first pixel, the block's first channel */
};

static inline __attribute__((always_inline)) GS_CPU_TARGET_AVX512 void
fwd_tile(const int R, const int V, const struct fwd_args *x) {
  __m512 acc[14][4], wv[4];
  __mmask16 m[4];
#pragma GCC unroll 16
  for (int v = 0; v < V; v++) {
    m[v] = lane_mask(x->left, v);
    __m512 b0 = x->b ? _mm512_maskz_loadu_ps(m[v], x->b + 16 * v) : _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int r = 0; r < R; r++)
      acc[r][v] = b0;
  }
  for (long ky = 0; ky < x->kh; ky++)
    for (long kx = 0; kx < x->kw; kx++) {
      const float *ap = x->a + ky * x->rowp + kx * x->c;
      const float *wp = x->w + (ky * x->kw + kx) * x->c * x->f;
      for (long ci = 0; ci < x->c; ci++, wp += x->f) {
        dc_loadv(V, wv, m, wp);
        dc_fma(R, V, acc, ap + ci, x->sp, wv);
      }
    }
#pragma GCC unroll 16
  for (int r = 0; r < R; r++)
#pragma GCC unroll 16
    for (int v = 0; v < V; v++) {
      __m512 y = acc[r][v];
      if (x->relu) /* gs_cpu_relu1: NaN passes, -0 becomes +0 */
        y = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(y, _mm512_setzero_ps(), _CMP_NLE_UQ), y);
      _mm512_mask_storeu_ps(x->o + r * x->f + 16 * v, m[v], y);
    }
}

/* ---- weight gradient: R input channels x V vectors of output channels ---- */

struct wg_args {
  const float *a;    /* padded input of the image at the tap, the block's first channel */
  long sp, rowp, rs; /* floats between windows, padded rows, window rows */
  long oh, ow, f;
  const float *d; /* dout of the image at the block's first channel */
  long left;
  float *dw; /* dw (C, F) of the tap at the block's first input and output channel */
};

static inline __attribute__((always_inline)) GS_CPU_TARGET_AVX512 void
wg_tile(const int R, const int V, const struct wg_args *x) {
  __m512 acc[14][4], dv[4];
  __mmask16 m[4];
#pragma GCC unroll 16
  for (int v = 0; v < V; v++)
    m[v] = lane_mask(x->left, v);
#pragma GCC unroll 16
  for (int r = 0; r < R; r++)
    dc_loadv(V, acc[r], m, x->dw + r * x->f);
  const float *d = x->d;
  for (long oy = 0; oy < x->oh; oy++) {
    const float *ap = x->a + oy * x->rs * x->rowp;
    for (long ox = 0; ox < x->ow; ox++, ap += x->sp, d += x->f) {
      dc_loadv(V, dv, m, d);
      dc_fma(R, V, acc, ap, 1, dv);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; r++)
#pragma GCC unroll 16
    for (int v = 0; v < V; v++)
      _mm512_mask_storeu_ps(x->dw + r * x->f + 16 * v, m[v], acc[r][v]);
}

/* the tile for (r, v) with both as constants: r in [1, rmax(v)] */
#define DC_R4(K, V, x, r0)                                                          \
  case r0 + 1: K(r0 + 1, V, x); break;                                              \
  case r0 + 2: K(r0 + 2, V, x); break;                                              \
  case r0 + 3: K(r0 + 3, V, x); break;                                              \
  case r0 + 4: K(r0 + 4, V, x); break;
#define DC_R7(K, V, x) DC_R4(K, V, x, 0) case 5: K(5, V, x); break;                 \
  case 6: K(6, V, x); break;                                                        \
  case 7: K(7, V, x); break;
#define DC_R9(K, V, x) DC_R7(K, V, x) case 8: K(8, V, x); break;                    \
  case 9: K(9, V, x); break;
#define DC_R14(K, V, x) DC_R9(K, V, x) case 10: K(10, V, x); break;                 \
  case 11: K(11, V, x); break;                                                      \
  case 12: K(12, V, x); break;                                                      \
  case 13: K(13, V, x); break;                                                      \
  case 14: K(14, V, x); break;
#define DC_DISPATCH(K, r, v, x)                               \
  switch (v) {                                                \
  case 1: switch (r) { DC_R14(K, 1, x) } break;               \
  case 2: switch (r) { DC_R14(K, 2, x) } break;               \
  case 3: switch (r) { DC_R9(K, 3, x) } break;                \
  default: switch (r) { DC_R7(K, 4, x) } break;               \
  }

GS_CPU_TARGET_AVX512 static void fwd_tile_any(long r, long v, const struct fwd_args *x) {
  DC_DISPATCH(fwd_tile, r, v, x)
}

GS_CPU_TARGET_AVX512 static void wg_tile_any(long r, long v, const struct wg_args *x) {
  DC_DISPATCH(wg_tile, r, v, x)
}

/* n items in tiles of at most `max`: *r items each but the last */
static void tiles_of(long n, long max, long *r, long *count) {
  *count = (n + max - 1) / max;
  *r = (n + *count - 1) / *count;
}

struct dconv_job {
  const gs_cpu_geo *g;
  const float *p;         /* the chunk, padded */
  long hp, wp;            /* its rows and columns */
  long v, nfb;            /* output channels: nfb blocks of up to v vectors */
  long ipc, n0, nc;       /* images a chunk; the chunk's first, and count */
  const float *w, *b;     /* forward */
  bool relu;
  float *out;             /* (N, OH, OW, F) */
  const float *dout;      /* wgrad */
  float *dw;
  long rt, ntiles;        /* wgrad: input-channel tiles of up to rt */
};

/* output rows (img, oy) [lo, hi) of the chunk (img from its first) */
static void fwd_part(void *ctx, size_t lo, size_t hi) {
  const struct dconv_job *j = ctx;
  const gs_cpu_geo *g = j->g;
  long r, nt;
  tiles_of(g->ow, rmax(j->v), &r, &nt);
  for (long row = (long)lo; row < (long)hi; row++) {
    long img = row / g->oh, oy = row % g->oh;
    for (long t = 0; t < nt; t++) {
      long ox0 = t * r, rr = g->ow - ox0 < r ? g->ow - ox0 : r;
      for (long fb = 0; fb < j->nfb; fb++) {
        long f0 = fb * j->v * 16, left = g->f - f0, vv = (left + 15) / 16;
        vv = vv < j->v ? vv : j->v;
        struct fwd_args x = {
            .a = j->p + ((img * j->hp + oy * g->stride) * j->wp + ox0 * g->stride) * g->c,
            .sp = g->stride * g->c, .rowp = j->wp * g->c, .kh = g->kh, .kw = g->kw,
            .c = g->c, .f = g->f, .w = j->w + f0, .b = j->b ? j->b + f0 : NULL,
            .left = left, .relu = j->relu,
            .o = j->out + (((j->n0 + img) * g->oh + oy) * g->ow + ox0) * g->f + f0};
        fwd_tile_any(rr, vv, &x);
      }
    }
  }
}

/* units [lo, hi) of (tap, input-channel tile, output-channel block), each
 * adding every image of the chunk in order */
static void wg_part(void *ctx, size_t lo, size_t hi) {
  const struct dconv_job *j = ctx;
  const gs_cpu_geo *g = j->g;
  long per_tap = j->ntiles * j->nfb;
  for (long img = 0; img < j->nc; img++)
    for (long u = (long)lo; u < (long)hi; u++) {
      long tap = u / per_tap, ct = u % per_tap / j->nfb, fb = u % j->nfb;
      long ky = tap / g->kw, kx = tap % g->kw, c0 = ct * j->rt;
      long rr = g->c - c0 < j->rt ? g->c - c0 : j->rt;
      long f0 = fb * j->v * 16, left = g->f - f0, vv = (left + 15) / 16;
      vv = vv < j->v ? vv : j->v;
      struct wg_args x = {
          .a = j->p + ((img * j->hp + ky) * j->wp + kx) * g->c + c0, .sp = g->stride * g->c,
          .rowp = j->wp * g->c, .rs = g->stride, .oh = g->oh, .ow = g->ow, .f = g->f,
          .d = j->dout + (j->n0 + img) * g->oh * g->ow * g->f + f0, .left = left,
          .dw = j->dw + (tap * g->c + c0) * g->f + f0};
      wg_tile_any(rr, vv, &x);
    }
}

/* the job of g over workspace ws (ws_floats): images per chunk whose
 * padded copy fits, the padded geometry and the output-channel blocks;
 * false when not one image fits */
static bool job_init(struct dconv_job *j, const gs_cpu_geo *g, size_t ws_floats) {
  size_t per = gs_cpu_dconv_pad_floats(g, 1);
  long ipc = per ? (long)(ws_floats / per) : g->n;
  if (ipc < 1)
    return false;
  bool inplace;
  j->g = g, j->ipc = ipc < g->n ? ipc : g->n;
  pad_geo(g, &j->hp, &j->wp, &inplace);
  f_blocks(g->f, &j->v, &j->nfb);
  return true;
}

/* fn over each chunk of images in order, padded into ws first: `units`
 * items a chunk, or one per output row where units is 0 */
static void run_chunks(gs_exec *ex, struct dconv_job *j, const float *in, float *ws,
                       size_t units, gs_cpu_range_fn fn) {
  const gs_cpu_geo *g = j->g;
  for (j->n0 = 0; j->n0 < g->n; j->n0 += j->ipc) {
    j->nc = g->n - j->n0 < j->ipc ? g->n - j->n0 : j->ipc;
    j->p = pad_chunk(ex, g, in, ws, j->n0, j->nc);
    gs_cpu_parallel(ex, units ? units : (size_t)(j->nc * g->oh), units ? 1 : 4, fn, j);
  }
}

bool gs_cpu_dconv_forward(gs_exec *ex, const gs_cpu_geo *g, const float *in, const float *w,
                          const float *b, bool relu, float *out, float *ws, size_t ws_floats) {
  struct dconv_job j = {.w = w, .b = b, .relu = relu, .out = out};
  if (!job_init(&j, g, ws_floats))
    return false;
  run_chunks(ex, &j, in, ws, 0, fwd_part);
  return true;
}

bool gs_cpu_dconv_wgrad(gs_exec *ex, const gs_cpu_geo *g, const float *in, const float *dout,
                        float *dw, float *ws, size_t ws_floats) {
  struct dconv_job j = {.dout = dout, .dw = dw};
  if (!job_init(&j, g, ws_floats))
    return false;
  tiles_of(g->c, rmax(j.v), &j.rt, &j.ntiles);
  size_t units = (size_t)(g->kh * g->kw * j.ntiles * j.nfb);
  /* few units that split unevenly over the threads (a 1x1 conv of 32
   * channels: 5 tiles of 7 x 4 vectors) take blocks half as wide, more
   * and taller tiles, where those split better */
  size_t th = (size_t)(ex->threads > 0 ? ex->threads : 1);
  if (j.v > 1 && units % th && units < 4 * th) {
    long v2 = (j.v + 1) / 2, nfb2 = ((g->f + 15) / 16 + v2 - 1) / v2, rt2, nt2;
    tiles_of(g->c, rmax(v2), &rt2, &nt2);
    size_t u2 = (size_t)(g->kh * g->kw * nt2 * nfb2);
    double was = (double)units / (double)((units + th - 1) / th),
           now = (double)u2 / (double)((u2 + th - 1) / th);
    if (now > was)
      j.v = v2, j.nfb = nfb2, j.rt = rt2, j.ntiles = nt2, units = u2;
  }
  run_chunks(ex, &j, in, ws, units, wg_part);
  return true;
}

#else /* no x86 targets: im2col + GEMM everywhere */

size_t gs_cpu_dconv_pad_floats(const gs_cpu_geo *g, long images) {
  (void)g, (void)images;
  return 0;
}
bool gs_cpu_dconv_ok(gs_dtype dt) {
  (void)dt;
  return false;
}
bool gs_cpu_dconv_forward(gs_exec *ex, const gs_cpu_geo *g, const float *in, const float *w,
                          const float *b, bool relu, float *out, float *ws, size_t ws_floats) {
  (void)ex, (void)g, (void)in, (void)w, (void)b, (void)relu, (void)out, (void)ws, (void)ws_floats;
  return false;
}
bool gs_cpu_dconv_wgrad(gs_exec *ex, const gs_cpu_geo *g, const float *in, const float *dout,
                        float *dw, float *ws, size_t ws_floats) {
  (void)ex, (void)g, (void)in, (void)dout, (void)dw, (void)ws, (void)ws_floats;
  return false;
}
#endif
