/*
 * cpu_conv_direct.c: fp32 conv2d as direct vector loops (AVX2 and
 * AVX-512), in place of im2col + GEMM (cpu_conv.c).
 *
 * im2col writes each output pixel's window out as a row (KH*KW times the
 * input for a 3x3 window) and OpenBLAS packs that matrix once more before
 * its kernel reads it: at the channel counts of a small ResNet (24 to 96)
 * the two copies cost as much as a third of the multiply-adds. Here the
 * windows are read where they lie. The input is copied once, zero-padded,
 * so that every window is whole (or read in place when no window crosses
 * an edge), and a register block of R output pixels x V vectors of output
 * channels accumulates over the window's taps and channels: for each
 * (tap, channel) V weight vectors are loaded and each pixel's input value
 * is broadcast into R*V fused multiply-adds (cpu_dconv_tile.h, at 16
 * floats a vector for AVX-512 and 8 for AVX2). A 1x1 stride-1 conv's
 * blocks run over its pixels across rows and images.
 *
 * The weight gradient is the same sum turned around: per tap, a block of
 * R input channels x V vectors of output channels accumulates over every
 * output pixel, loading V vectors of dout and broadcasting R input values.
 * Threads own disjoint blocks of dw and add each image in image order, so
 * dw is the same bits on any number of threads. A stride-1 input gradient
 * is the forward loop run on dout with the window turned around
 * (cpu_conv.c, conv_transposed).
 *
 * The AVX2 and AVX-512 levels take these loops (gs_cpu_dconv_ok); the
 * baseline and the 16-bit storage types keep im2col + GEMM. Each output is
 * one chain of fused multiply-adds in the window's order, the same at
 * either width but not OpenBLAS's order: test_kernels_isa holds the
 * results to fp32's tolerance of a double-precision definition, to the
 * same bits at both widths, and on 1 and 2 threads.
 */
#include <string.h>

#include "kernels/cpu/cpu_internal.h"

#if defined(GS_CPU_X86_TARGETS)
#include <immintrin.h>

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
  return dt == GS_F32 && gs_cpu_clone() >= GS_CPU_ISA_AVX2;
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

/* ---- the register blocks (cpu_dconv_tile.h, once per vector width) ---- */

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

struct wg_args {
  const float *a;    /* padded input of the image at the tap, the block's first channel */
  long sp, rowp, rs; /* floats between windows, padded rows, window rows */
  long oh, ow, f;
  const float *d; /* dout of the image at the block's first channel */
  long left;
  float *dw; /* dw (C, F) of the tap at the block's first input and output channel */
};

/* one vector width's blocks: w floats a vector, blocks of up to vmax
 * vectors, of at most rmax[v - 1] pixels (or input channels) for v */
struct dc_width {
  int w;
  long vmax;
  const long *rmax;
  void (*fwd)(long r, long v, const struct fwd_args *x);
  void (*wg)(long r, long v, const struct wg_args *x);
};

/* the tile for (r, v) with both as constants */
#define DC_R4(K, V, x)                                                              \
  case 1: K(1, V, x); break;                                                        \
  case 2: K(2, V, x); break;                                                        \
  case 3: K(3, V, x); break;                                                        \
  case 4: K(4, V, x); break;
#define DC_R6(K, V, x) DC_R4(K, V, x) case 5: K(5, V, x); break;                    \
  case 6: K(6, V, x); break;
#define DC_R7(K, V, x) DC_R6(K, V, x) case 7: K(7, V, x); break;
#define DC_R9(K, V, x) DC_R7(K, V, x) case 8: K(8, V, x); break;                    \
  case 9: K(9, V, x); break;
#define DC_R12(K, V, x) DC_R9(K, V, x) case 10: K(10, V, x); break;                 \
  case 11: K(11, V, x); break;                                                      \
  case 12: K(12, V, x); break;
#define DC_R14(K, V, x) DC_R12(K, V, x) case 13: K(13, V, x); break;                \
  case 14: K(14, V, x); break;

/* AVX-512: 32 registers hold up to 14 x 4 accumulators, the weight vectors
 * and the broadcast; the lane mask is a k register */
#define DC_VT __m512
#define DC_W 16
#define DC_MT __mmask16
#define DC_TARGET GS_CPU_TARGET_AVX512
#define DC_NAME(x) x##_512
#define DC_RMAX 14, 14, 9, 7
#define DC_MASK(n) ((n) >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n)) - 1u))
#define DC_LOADU _mm512_loadu_ps
#define DC_LOADM(m, p) _mm512_maskz_loadu_ps(m, p)
#define DC_STOREU _mm512_storeu_ps
#define DC_STOREM(p, m, y) _mm512_mask_storeu_ps(p, m, y)
#define DC_SET1 _mm512_set1_ps
#define DC_FMADD _mm512_fmadd_ps
#define DC_ZERO _mm512_setzero_ps()
#define DC_RELU(y) _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(y, _mm512_setzero_ps(), _CMP_NLE_UQ), y)
#define DC_DISPATCH(K, r, v, x)                               \
  switch (v) {                                                \
  case 1: switch (r) { DC_R14(K, 1, x) } break;               \
  case 2: switch (r) { DC_R14(K, 2, x) } break;               \
  case 3: switch (r) { DC_R9(K, 3, x) } break;                \
  default: switch (r) { DC_R7(K, 4, x) } break;               \
  }
#include "kernels/cpu/cpu_dconv_tile.h"
#undef DC_VT
#undef DC_W
#undef DC_MT
#undef DC_TARGET
#undef DC_NAME
#undef DC_RMAX
#undef DC_MASK
#undef DC_LOADU
#undef DC_LOADM
#undef DC_STOREU
#undef DC_STOREM
#undef DC_SET1
#undef DC_FMADD
#undef DC_ZERO
#undef DC_RELU
#undef DC_DISPATCH

/* AVX2: 16 registers hold up to 12 x 1 or 6 x 2 accumulators, the weight
 * vectors, the broadcast and the lane mask (a vector) */
#define DC_VT __m256
#define DC_W 8
#define DC_MT __m256i
#define DC_TARGET GS_CPU_TARGET_AVX2
#define DC_NAME(x) x##_256
#define DC_RMAX 12, 6
#define DC_MASK(n) \
  _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))
#define DC_LOADU _mm256_loadu_ps
#define DC_LOADM(m, p) _mm256_maskload_ps(p, m)
#define DC_STOREU _mm256_storeu_ps
#define DC_STOREM(p, m, y) _mm256_maskstore_ps(p, m, y)
#define DC_SET1 _mm256_set1_ps
#define DC_FMADD _mm256_fmadd_ps
#define DC_ZERO _mm256_setzero_ps()
#define DC_RELU(y) _mm256_and_ps(y, _mm256_cmp_ps(y, _mm256_setzero_ps(), _CMP_NLE_UQ))
#define DC_DISPATCH(K, r, v, x)                               \
  switch (v) {                                                \
  case 1: switch (r) { DC_R12(K, 1, x) } break;               \
  default: switch (r) { DC_R6(K, 2, x) } break;               \
  }
#include "kernels/cpu/cpu_dconv_tile.h"

/* the blocks of the level in use */
static const struct dc_width *width_in_use(void) {
  return gs_cpu_clone() >= GS_CPU_ISA_AVX512 ? &width_512 : &width_256;
}

/* the largest R for v vectors */
static long rmax(const struct dc_width *wd, long v) { return wd->rmax[v - 1]; }

/* f in *nfb blocks of *v vectors each (the last may be shorter) */
static void f_blocks(const struct dc_width *wd, long vmax, long f, long *v, long *nfb) {
  long vecs = (f + wd->w - 1) / wd->w;
  *nfb = (vecs + vmax - 1) / vmax;
  *v = (vecs + *nfb - 1) / *nfb;
}

/* n items in tiles of at most `max`: *r items each but the last */
static void tiles_of(long n, long max, long *r, long *count) {
  *count = (n + max - 1) / max;
  *r = (n + *count - 1) / *count;
}

struct dconv_job {
  const gs_cpu_geo *g;
  const struct dc_width *wd; /* the vector width's blocks */
  const float *p;         /* the chunk, padded */
  long hp, wp;            /* its rows and columns */
  long v, nfb;            /* output channels: nfb blocks of up to v vectors */
  long ipc, n0, nc;       /* images a chunk; the chunk's first, and count */
  const float *w, *b;     /* forward */
  bool relu;
  float *out;             /* (N, OH, OW, F) */
  const float *dout;      /* wgrad */
  float *dw;
  long rt, ntiles;        /* wgrad: input-channel tiles of up to rt; 1x1: pixels a tile */
};

/* output rows (img, oy) [lo, hi) of the chunk (img from its first) */
static void fwd_part(void *ctx, size_t lo, size_t hi) {
  const struct dconv_job *j = ctx;
  const gs_cpu_geo *g = j->g;
  long r, nt;
  tiles_of(g->ow, rmax(j->wd, j->v), &r, &nt);
  for (long row = (long)lo; row < (long)hi; row++) {
    long img = row / g->oh, oy = row % g->oh;
    for (long t = 0; t < nt; t++) {
      long ox0 = t * r, rr = g->ow - ox0 < r ? g->ow - ox0 : r;
      for (long fb = 0; fb < j->nfb; fb++) {
        long f0 = fb * j->v * j->wd->w, left = g->f - f0, vv = (left + j->wd->w - 1) / j->wd->w;
        vv = vv < j->v ? vv : j->v;
        struct fwd_args x = {
            .a = j->p + ((img * j->hp + oy * g->stride) * j->wp + ox0 * g->stride) * g->c,
            .sp = g->stride * g->c, .rowp = j->wp * g->c, .kh = g->kh, .kw = g->kw,
            .c = g->c, .f = g->f, .w = j->w + f0, .b = j->b ? j->b + f0 : NULL,
            .left = left, .relu = j->relu,
            .o = j->out + (((j->n0 + img) * g->oh + oy) * g->ow + ox0) * g->f + f0};
        j->wd->fwd(rr, vv, &x);
      }
    }
  }
}

/* A 1x1 stride-1 conv's pixels lie one after another across rows and
 * images: its tiles [lo, hi) of r pixels run over them all, so rows of 7
 * or 14 pixels do not cut the blocks short. */
static void fwd_flat_part(void *ctx, size_t lo, size_t hi) {
  const struct dconv_job *j = ctx;
  const gs_cpu_geo *g = j->g;
  long total = j->nc * g->oh * g->ow, r = j->rt;
  for (long t = (long)lo; t < (long)hi; t++) {
    long p0 = t * r, rr = total - p0 < r ? total - p0 : r;
    for (long fb = 0; fb < j->nfb; fb++) {
      long f0 = fb * j->v * j->wd->w, left = g->f - f0, vv = (left + j->wd->w - 1) / j->wd->w;
      vv = vv < j->v ? vv : j->v;
      struct fwd_args x = {.a = j->p + p0 * g->c, .sp = g->c, .rowp = 0, .kh = 1, .kw = 1,
                           .c = g->c, .f = g->f, .w = j->w + f0, .b = j->b ? j->b + f0 : NULL,
                           .left = left, .relu = j->relu,
                           .o = j->out + (j->n0 * g->oh * g->ow + p0) * g->f + f0};
      j->wd->fwd(rr, vv, &x);
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
      long f0 = fb * j->v * j->wd->w, left = g->f - f0, vv = (left + j->wd->w - 1) / j->wd->w;
      vv = vv < j->v ? vv : j->v;
      struct wg_args x = {
          .a = j->p + ((img * j->hp + ky) * j->wp + kx) * g->c + c0, .sp = g->stride * g->c,
          .rowp = j->wp * g->c, .rs = g->stride, .oh = g->oh, .ow = g->ow, .f = g->f,
          .d = j->dout + (j->n0 + img) * g->oh * g->ow * g->f + f0, .left = left,
          .dw = j->dw + (tap * g->c + c0) * g->f + f0};
      j->wd->wg(rr, vv, &x);
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
  j->wd = width_in_use();
  f_blocks(j->wd, j->wd->vmax, g->f, &j->v, &j->nfb);
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
  if (g->kh == 1 && g->kw == 1 && g->stride == 1 && !gs_cpu_dconv_pad_floats(g, 1)) {
    long total = j.ipc * g->oh * g->ow, r = rmax(j.wd, j.v); /* in place: one chunk */
    j.rt = r;
    run_chunks(ex, &j, in, ws, (size_t)((total + r - 1) / r), fwd_flat_part);
  } else {
    run_chunks(ex, &j, in, ws, 0, fwd_part);
  }
  return true;
}

bool gs_cpu_dconv_wgrad(gs_exec *ex, const gs_cpu_geo *g, const float *in, const float *dout,
                        float *dw, float *ws, size_t ws_floats) {
  struct dconv_job j = {.dout = dout, .dw = dw};
  if (!job_init(&j, g, ws_floats))
    return false;
  tiles_of(g->c, rmax(j.wd, j.v), &j.rt, &j.ntiles);
  size_t units = (size_t)(g->kh * g->kw * j.ntiles * j.nfb);
  /* few units that split unevenly over the threads (a 1x1 conv of 32
   * channels: 5 tiles of 7 x 4 vectors) take blocks half as wide, more
   * and taller tiles, where those split better */
  size_t th = (size_t)(ex->threads > 0 ? ex->threads : 1);
  if (j.v > 1 && units % th && units < 4 * th) {
    long v2, nfb2, rt2, nt2;
    f_blocks(j.wd, (j.v + 1) / 2, g->f, &v2, &nfb2);
    tiles_of(g->c, rmax(j.wd, v2), &rt2, &nt2);
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
