/*
 * cpu_conv.c: the image ops over NHWC tensors: conv2d, depthwise conv2d,
 * max pool, global average pool.
 *
 * conv2d is im2col + GEMM: each output pixel's window (KH, KW, C) becomes a
 * row of `col`, so out (N*OH*OW, F) = col (N*OH*OW, KH*KW*C) . w (KH*KW*C, F)
 * with w's natural (KH, KW, C, F) layout as the right-hand matrix. Backward
 * is the same two GEMMs as dense (dw += col^T . dout, dcol = dout . w^T),
 * and dcol is folded back onto din by a gather over input pixels, so each
 * din element is written once by one thread (no atomics, deterministic).
 * In fp32 at stride 1 din is instead the convolution of dout with the
 * window turned around (conv_dgrad_transposed): im2col of dout and one
 * GEMM straight into din.
 * At the AVX2 and AVX-512 levels every fp32 conv2d takes the direct loops
 * of cpu_conv_direct.c instead (forward, weight gradient, stride-1 input
 * gradient); the workspace holds room for them at every level, so a plan
 * does not depend on the host.
 * A 1x1 stride-1 fp32 conv is already a GEMM over the input and needs no
 * workspace but the direct loops' w turned. To keep the workspace bounded
 * whatever the batch, col holds a chunk of whole images, sized to
 * GS_CPU_COL_BYTES: the planner sees the exact bytes from conv2d_workspace
 * and the GEMMs stay large enough.
 * 16-bit storage converts while it builds col (so the conversion costs
 * nothing extra), converts w and dout into the workspace, and rounds once
 * on store.
 *
 * Depthwise, pooling and GAP are direct loops with the channel innermost,
 * as NHWC lays it out: pooling and GAP accumulate a block of up to
 * GS_CPU_CB channels on the stack and the compiler vectorises across it;
 * depthwise in fp32 keeps up to 8 blocks of channels in vector registers
 * (8 floats a block, 16 in the AVX-512 clones: cpu_dw_chunk.h), the rest
 * runs the same loops a block of 8 at a time. Forward ops split
 * output rows over threads; depthwise dw/db split channels (each thread
 * owns its slice of dw, so no reduction), din splits input rows. The hot
 * loops are built for AVX-512, AVX2 and the baseline (GS_CPU_RANGE). im2col
 * copies each window row that lies inside the image as one run: its taps
 * read consecutive input pixels.
 */
#include <string.h>

#include "kernels/cpu/cpu_internal.h"

/* Upper bound on one chunk of im2col rows (at least one image is taken). */
#define GS_CPU_COL_BYTES ((size_t)8 << 20)

typedef gs_cpu_geo geo;

static geo geo_of(const gs_conv_shape *s, bool same) {
  geo g = {.n = s->n, .h = s->h, .w = s->w, .c = s->c, .kh = s->kh, .kw = s->kw,
           .stride = s->stride, .f = s->f};
  g.oh = gs_window_out(s->h, s->kh, s->stride, same);
  g.ow = gs_window_out(s->w, s->kw, s->stride, same);
  g.pt = gs_window_pad(s->h, s->kh, s->stride, same);
  g.pl = gs_window_pad(s->w, s->kw, s->stride, same);
  return g;
}

/* Block of cb channels of dt at p as fp32: p itself for fp32, else tmp. */
static inline const float *load_block(gs_dtype dt, const void *p, size_t i, float *tmp,
                                      long cb) {
  if (dt == GS_F32)
    return (const float *)p + i;
  gs_cpu_load_f32(dt, gs_cpu_at(dt, p, i), tmp, (size_t)cb);
  return tmp;
}

/* Taps [*k0, *k1) of a k-tap window whose first tap reads input index
 * o * stride - pad: the ones inside [0, n). */
static inline void tap_range(long o, long stride, long pad, long k, long n, long *k0, long *k1) {
  long base = o * stride - pad;
  *k0 = base < 0 ? -base : 0;
  *k1 = n - base < k ? n - base : k;
  if (*k1 < *k0)
    *k1 = *k0;
}

/* ---- conv2d ---- */

static bool conv_is_pointwise(const geo *g) { return g->kh == 1 && g->kw == 1 && g->stride == 1; }

static long conv_images_per_chunk(const geo *g) {
  size_t per = sizeof(float) * (size_t)(g->oh * g->ow) * (size_t)(g->kh * g->kw * g->c);
  long ipc = per ? (long)(GS_CPU_COL_BYTES / per) : g->n;
  if (ipc < 1)
    ipc = 1;
  return ipc < g->n ? ipc : g->n;
}

/* A stride-1 fp32 conv's input gradient is itself a convolution: of dout
 * with the window turned around (w[kh-1-ky][kw-1-kx], C and F swapped),
 * padded by kh-1-pt above and kw-1-pl left, out to the input's size. As
 * im2col of dout and one GEMM it writes din once, where the GEMM into
 * dcol (N*OH*OW, KH*KW*C) and the gather back onto din cleared, wrote and
 * read nine times as much for a 3x3 window. */
static bool conv_turnable(const geo *g) {
  return g->stride == 1 && g->pt < g->kh && g->pl < g->kw;
}
static bool conv_dgrad_transposed(gs_dtype dt, const geo *g) {
  return dt == GS_F32 && conv_turnable(g) && !conv_is_pointwise(g) &&
         g->f <= g->c; /* never more workspace than the forward's */
}

/* the geometry of that convolution: dout (N, OH, OW, F) in, din out */
static geo conv_transposed(const geo *g) {
  return (geo){.n = g->n, .h = g->oh, .w = g->ow, .c = g->f, .kh = g->kh, .kw = g->kw,
               .stride = 1, .f = g->c, .oh = g->h, .ow = g->w, .pt = g->kh - 1 - g->pt,
               .pl = g->kw - 1 - g->pl};
}

/* wt (KH, KW, F, C) = w (KH, KW, C, F) turned: wt[ky][kx][f][c] =
 * w[kh-1-ky][kw-1-kx][c][f] */
static void conv_turn_weights(const geo *g, const float *w, float *wt) {
  long kk = g->kh * g->kw;
  for (long t = 0; t < kk; t++) {
    const float *src = w + (kk - 1 - t) * g->c * g->f;
    float *dst = wt + t * g->f * g->c;
    for (long c = 0; c < g->c; c++)
      for (long f = 0; f < g->f; f++)
        dst[f * g->c + c] = src[c * g->f + f];
  }
}

size_t gs_cpu_conv2d_workspace(gs_dtype dt, const gs_conv_shape *s) {
  geo g = geo_of(s, s->same);
  size_t ipc = (size_t)conv_images_per_chunk(&g), p = (size_t)(g.oh * g.ow);
  size_t k = (size_t)(g.kh * g.kw * g.c), f = (size_t)g.f;
  if (g.n == 0 || p == 0)
    return 0;
  if (dt == GS_F32) {
    if (conv_is_pointwise(&g)) /* the direct loops' w turned (F, C) */
      return sizeof(float) * k * f;
    size_t col = sizeof(float) * ipc * p * k;
    if (conv_dgrad_transposed(dt, &g)) { /* the backward's col of dout and w turned */
      geo t = conv_transposed(&g);
      size_t tk = (size_t)(t.kh * t.kw * t.c);
      size_t tcol = sizeof(float) * ((size_t)conv_images_per_chunk(&t) * (size_t)(t.oh * t.ow) * tk +
                                     tk * (size_t)t.f);
      if (tcol > col)
        col = tcol;
    }
    /* room for the direct loops' padded copy of one image (and w turned),
     * whichever level runs: the plan is the same on every host */
    size_t pad = sizeof(float) * gs_cpu_dconv_pad_floats(&g, 1);
    if (conv_turnable(&g)) {
      geo t = conv_transposed(&g);
      size_t tpad = sizeof(float) * (gs_cpu_dconv_pad_floats(&t, 1) + k * f);
      pad = tpad > pad ? tpad : pad;
    }
    return col > pad ? col : pad;
  }
  /* col + w + (out or dout), the same for forward and backward */
  return sizeof(float) * (ipc * p * k + k * f + ipc * p * f);
}

struct im2col_job {
  gs_dtype dt;
  const geo *g;
  const void *in;
  float *col;
  long n0; /* first image of the chunk */
};

static inline void fill0(float *restrict d, long n) {
  for (long i = 0; i < n; i++)
    d[i] = 0.0f;
}

/* rows [lo, hi) of the chunk: one output pixel each, KH*KW*C wide. The
 * taps of one window row that fall inside the image read consecutive input
 * pixels, so each window row is one copy (and the rest zeros). */
GS_CPU_RANGE(im2col_part, ctx, lo, hi, isa) {
  const struct im2col_job *j = ctx;
  const geo *g = j->g;
  long p = g->oh * g->ow, k = g->kh * g->kw * g->c, rowlen = g->kw * g->c;
  for (long r = (long)lo; r < (long)hi; r++) {
    long img = j->n0 + r / p, q = r % p, oy = q / g->ow, ox = q % g->ow, ky0, ky1, kx0, kx1;
    tap_range(oy, g->stride, g->pt, g->kh, g->h, &ky0, &ky1);
    tap_range(ox, g->stride, g->pl, g->kw, g->w, &kx0, &kx1);
    float *dst = j->col + (size_t)r * (size_t)k;
    fill0(dst, ky0 * rowlen);
    for (long ky = ky0; ky < ky1; ky++) {
      long iy = oy * g->stride - g->pt + ky, ix0 = ox * g->stride - g->pl + kx0;
      float *d = dst + ky * rowlen;
      size_t at = (size_t)(((img * g->h + iy) * g->w + ix0) * g->c);
      long len = (kx1 - kx0) * g->c;
      fill0(d, kx0 * g->c);
      if (j->dt == GS_F32) {
        float *restrict dd = d + kx0 * g->c;
        const float *restrict src = (const float *)j->in + at;
        for (long i = 0; i < len; i++)
          dd[i] = src[i];
      } else {
        gs_cpu_load_f32(j->dt, gs_cpu_at(j->dt, j->in, at), d + kx0 * g->c, (size_t)len);
      }
      fill0(d + kx1 * g->c, (g->kw - kx1) * g->c);
    }
    fill0(dst + ky1 * rowlen, (g->kh - ky1) * rowlen);
  }
}

static void im2col(gs_exec *ex, gs_dtype dt, const geo *g, const void *in, float *col, long n0,
                   long nc) {
  struct im2col_job j = {.dt = dt, .g = g, .in = in, .col = col, .n0 = n0};
  gs_cpu_parallel(ex, (size_t)(nc * g->oh * g->ow), 256, GS_CPU_PICK(im2col_part), &j);
}

struct col2im_job {
  gs_dtype dt;
  const geo *g;
  const float *col; /* dcol of the chunk */
  void *din;
  long n0;
};

/* input rows [lo, hi) of the chunk (image-major): gather every window
 * element that read each input pixel */
GS_CPU_RANGE(col2im_part, ctx, lo, hi, isa) {
  const struct col2im_job *j = ctx;
  const geo *g = j->g;
  long k = g->kh * g->kw * g->c;
  float acc[GS_CPU_CB];
  for (long item = (long)lo; item < (long)hi; item++) {
    long img = item / g->h, iy = item % g->h;
    for (long ix = 0; ix < g->w; ix++) {
      for (long c0 = 0; c0 < g->c; c0 += GS_CPU_CB) {
        long cb = g->c - c0 < GS_CPU_CB ? g->c - c0 : GS_CPU_CB;
        memset(acc, 0, sizeof(float) * (size_t)cb);
        /* the window taps that read (iy, ix): ky = (iy+pt) mod stride, then
         * every stride-th, with oy = (iy+pt-ky)/stride going down by one */
        long ty0 = iy + g->pt, tx0 = ix + g->pl;
        for (long ky = ty0 % g->stride, oy = ty0 / g->stride; ky < g->kh && oy >= 0;
             ky += g->stride, oy--) {
          if (oy >= g->oh)
            continue;
          for (long kx = tx0 % g->stride, ox = tx0 / g->stride; kx < g->kw && ox >= 0;
               kx += g->stride, ox--) {
            if (ox >= g->ow)
              continue;
            const float *src =
                j->col + (size_t)((img * g->oh + oy) * g->ow + ox) * (size_t)k +
                (size_t)((ky * g->kw + kx) * g->c + c0);
            for (long c = 0; c < cb; c++)
              acc[c] += src[c];
          }
        }
        size_t at = (size_t)((((j->n0 + img) * g->h + iy) * g->w + ix) * g->c + c0);
        gs_cpu_store_f32(j->dt, gs_cpu_at_mut(j->dt, j->din, at), acc, (size_t)cb);
      }
    }
  }
}

/* rows (M, F) f32 = b (F, dt), or zero when b is NULL */
static void fill_rows(gs_dtype dt, float *rows, const void *b, size_t m, size_t f) {
  if (!b) {
    memset(rows, 0, sizeof(float) * m * f);
    return;
  }
  gs_cpu_load_f32(dt, b, rows, f);
  for (size_t i = 1; i < m; i++)
    memcpy(rows + i * f, rows, sizeof(float) * f);
}

/* in (N, H, W, C), w (KH, KW, C, F), b (F) or NULL, out (N, OH, OW, F);
 * relu as dense's (cpu_dense.c) */
int gs_cpu_conv2d_forward(gs_exec *ex, gs_dtype dt, void *out, const void *in, const void *w,
                          const void *b, const gs_conv_shape *s, void *ws, bool relu) {
  geo g = geo_of(s, s->same);
  size_t p = (size_t)(g.oh * g.ow), k = (size_t)(g.kh * g.kw * g.c), f = (size_t)g.f;
  if (g.n == 0 || p == 0 || f == 0)
    return 0;
  if (gs_cpu_dconv_ok(dt) &&
      gs_cpu_dconv_forward(ex, &g, in, w, b, relu, out, ws,
                           gs_cpu_conv2d_workspace(dt, s) / sizeof(float)))
    return 0;
  if (dt == GS_F32 && conv_is_pointwise(&g)) {
    size_t m = (size_t)g.n * p;
    gs_cpu_sgemm_fwd(ex, m, f, k, in, k, w, f, b, 0.0f, relu, out, f);
    return 0;
  }
  long ipc = conv_images_per_chunk(&g);
  float *col = ws, *wf = (float *)w, *outf = NULL;
  if (dt != GS_F32) {
    wf = col + (size_t)ipc * p * k;
    outf = wf + k * f;
    gs_cpu_load_f32_par(ex, dt, w, wf, k * f);
  }
  for (long n0 = 0; n0 < g.n; n0 += ipc) {
    long nc = g.n - n0 < ipc ? g.n - n0 : ipc;
    size_t m = (size_t)nc * p;
    im2col(ex, dt, &g, in, col, n0, nc);
    float *dst = dt == GS_F32 ? (float *)out + (size_t)n0 * p * f : outf;
    if (dt == GS_F32) { /* each GEMM part starts its block as bias rows */
      gs_cpu_sgemm_fwd(ex, m, f, k, col, k, wf, f, b, 0.0f, relu, dst, f);
    } else {
      fill_rows(dt, dst, b, m, f);
      gs_cpu_sgemm_fwd(ex, m, f, k, col, k, wf, f, NULL, 1.0f, relu, dst, f);
    }
    if (dt != GS_F32)
      gs_cpu_store_f32_par(ex, dt, gs_cpu_at_mut(dt, out, (size_t)n0 * p * f), outf, m * f);
  }
  return 0;
}

/* dw (KH, KW, C, F) f32 +=, db (F) f32 +=, din (N, H, W, C) dt overwritten;
 * any of the three may be NULL. */
int gs_cpu_conv2d_backward(gs_exec *ex, gs_dtype dt, void *din, float *dw, float *db,
                           const void *dout, const void *in, const void *w,
                           const gs_conv_shape *s, void *ws) {
  geo g = geo_of(s, s->same);
  size_t p = (size_t)(g.oh * g.ow), k = (size_t)(g.kh * g.kw * g.c), f = (size_t)g.f;
  if (g.n == 0)
    return 0;
  if (p == 0 || f == 0) { /* no output: no gradient reaches the input */
    if (din)
      memset(din, 0, (size_t)(g.n * g.h * g.w * g.c) * gs_dtype_size(dt));
    return 0;
  }
  if (gs_cpu_dconv_ok(dt)) {
    size_t wsf = gs_cpu_conv2d_workspace(dt, s) / sizeof(float);
    if (db)
      gs_cpu_bias_grad(ex, db, dout, (size_t)g.n * p, f);
    if (dw && gs_cpu_dconv_wgrad(ex, &g, in, dout, dw, ws, wsf))
      dw = NULL;
    db = NULL;
    if (din && conv_turnable(&g)) { /* the turned window's convolution of dout */
      geo t = conv_transposed(&g);
      float *wt = ws;
      conv_turn_weights(&g, w, wt);
      if (gs_cpu_dconv_forward(ex, &t, dout, wt, NULL, false, din, wt + k * f, wsf - k * f))
        din = NULL;
    }
    if (!dw && !din)
      return 0;
  }
  if (dt == GS_F32 && conv_is_pointwise(&g)) {
    gs_cpu_linear_backward(ex, din, dw, db, dout, in, w, (size_t)g.n * p, k, f);
    return 0;
  }
  long ipc = conv_images_per_chunk(&g);
  float *col = ws, *wf = (float *)w, *doutf = NULL;
  if (dt != GS_F32) {
    wf = col + (size_t)ipc * p * k;
    doutf = wf + k * f;
    if (din)
      gs_cpu_load_f32_par(ex, dt, w, wf, k * f);
  }
  for (long n0 = 0; n0 < g.n; n0 += ipc) {
    long nc = g.n - n0 < ipc ? g.n - n0 : ipc;
    size_t m = (size_t)nc * p;
    const float *d = (const float *)dout + (size_t)n0 * p * f;
    if (dt != GS_F32) {
      gs_cpu_load_f32_par(ex, dt, gs_cpu_at(dt, dout, (size_t)n0 * p * f), doutf, m * f);
      d = doutf;
    }
    if (db)
      gs_cpu_bias_grad(ex, db, d, m, f);
    if (dw) {
      im2col(ex, dt, &g, in, col, n0, nc);
      gs_cpu_sgemm(ex, true, false, k, f, m, 1.0f, col, k, d, f, 1.0f, dw, f);
    }
    if (din && !conv_dgrad_transposed(dt, &g)) {
      gs_cpu_sgemm(ex, false, true, m, k, f, 1.0f, d, f, wf, f, 0.0f, col, k);
      struct col2im_job j = {.dt = dt, .g = &g, .col = col, .din = din, .n0 = n0};
      gs_cpu_parallel(ex, (size_t)(nc * g.h), 4, GS_CPU_PICK(col2im_part), &j);
    }
  }
  if (din && conv_dgrad_transposed(dt, &g)) {
    geo t = conv_transposed(&g);
    long tipc = conv_images_per_chunk(&t);
    size_t tp = (size_t)(t.oh * t.ow), tk = (size_t)(t.kh * t.kw * t.c);
    float *wt = col + (size_t)tipc * tp * tk;
    conv_turn_weights(&g, w, wt);
    for (long n0 = 0; n0 < g.n; n0 += tipc) {
      long nc = g.n - n0 < tipc ? g.n - n0 : tipc;
      im2col(ex, dt, &t, dout, col, n0, nc);
      gs_cpu_sgemm(ex, false, false, (size_t)nc * tp, (size_t)t.f, tk, 1.0f, col, tk, wt,
                   (size_t)t.f, 0.0f, (float *)din + (size_t)n0 * tp * (size_t)t.f,
                   (size_t)t.f);
    }
  }
  return 0;
}

/* ---- depthwise conv2d ---- */

size_t gs_cpu_depthwise_workspace(gs_dtype dt, const gs_conv_shape *s) {
  if (dt == GS_F32)
    return 0;
  /* w (KH, KW, C) and b (C) as fp32 */
  return sizeof(float) * ((size_t)s->kh * s->kw * s->c + s->c);
}

struct dw_job {
  gs_dtype dt;
  const geo *g;
  void *dst;         /* out (forward) or din (backward) */
  const void *src;   /* in (forward) or dout (backward) */
  const void *in;    /* in, for dw */
  const float *wf;   /* w as fp32 */
  const float *bf;   /* b as fp32, or NULL */
  float *dw, *db;
  bool relu;         /* forward: relu on the output */
};

/* The first window tap that reads input pixel (iy, ix) in the input
 * gradient's gather: tap row ky of output row oy, then every stride-th tap
 * with oy going down by one (likewise kx, ox); the later taps follow. */
struct dw_first {
  long ky, oy, kx, ox;
};

/* Depthwise loops run over blocks of GS_CPU_VB channels, the width of one
 * AVX vector: each block body is written once (always_inline) and called
 * with the constant GS_CPU_VB, so the compiler unrolls it into vector
 * instructions and keeps the block's accumulators in registers, and once
 * more for the last C % GS_CPU_VB channels. Every output still adds its
 * terms in the same order (bias, then the taps row by row), so a block's
 * results are those of the plain loop, bit for bit. */

/* Blocks the fp32 loops take at once (64 channels at 8 floats a block, 128
 * at 16: a quarter of the registers as accumulators). */
#define DW_CHUNK 8


/* acc (cb) as dt at p[i]: fp32 in place, 16 bits through one rounding */
static inline void store_block(gs_dtype dt, void *p, size_t i, const float *acc, long cb) {
  if (dt == GS_F32) {
    float *o = (float *)p + i;
    for (long c = 0; c < cb; c++)
      o[c] = acc[c];
    return;
  }
  float v[GS_CPU_VB]; /* acc stays unescaped, so it can live in registers */
  for (long c = 0; c < cb; c++)
    v[c] = acc[c];
  gs_cpu_store_f32(dt, gs_cpu_at_mut(dt, p, i), v, (size_t)cb);
}

/* out at (img, oy, ox), channels [c0, c0 + cb), taps [ky0, ky1) x [kx0, kx1) */
static inline __attribute__((always_inline)) void
dw_fwd_block(const struct dw_job *j, long img, long oy, long ox, long ky0, long ky1, long kx0,
             long kx1, long c0, long cb) {
  const geo *g = j->g;
  float acc[GS_CPU_VB], tmp[GS_CPU_VB];
  for (long c = 0; c < cb; c++)
    acc[c] = j->bf ? j->bf[c0 + c] : 0.0f;
  for (long ky = ky0; ky < ky1; ky++) {
    long iy = oy * g->stride - g->pt + ky;
    for (long kx = kx0; kx < kx1; kx++) {
      long ix = ox * g->stride - g->pl + kx;
      const float *x = load_block(j->dt, j->src,
                                  (size_t)(((img * g->h + iy) * g->w + ix) * g->c + c0), tmp, cb);
      const float *wr = j->wf + (ky * g->kw + kx) * g->c + c0;
      for (long c = 0; c < cb; c++)
        acc[c] += x[c] * wr[c];
    }
  }
  if (j->relu && j->dt != GS_F32) /* before the rounding: the same bits (cpu_dense.c) */
    for (long c = 0; c < cb; c++)
      acc[c] = gs_cpu_relu1(acc[c]);
  store_block(j->dt, j->dst, (size_t)(((img * g->oh + oy) * g->ow + ox) * g->c + c0), acc, cb);
}

/* The fp32 wgrad loop keeps dw of up to DW_LOCAL_TAPS taps x DW_CHUNK
 * blocks of channels on its stack (12.5 KiB at most; 25 KiB at 16 floats a
 * block). */
#define DW_LOCAL_TAPS 49

/* Whole blocks of vw floats in `left` channels, at most DW_CHUNK: the next
 * chunk of a chunked loop */
static inline long dw_blocks(long left, long vw) {
  return left / vw < DW_CHUNK ? left / vw : DW_CHUNK;
}

/* call(nb, ...) with nb as a constant (1..DW_CHUNK): each chunk loop is
 * then unrolled whole and its accumulators kept in registers, which the
 * AVX-512 clones do not do for a variable count (they mask the tail and
 * keep the array on the stack) */
#define DW_CALL_NB(fn, nb, ...)                                                                \
  do {                                                                                         \
    switch (nb) {                                                                              \
    case 1: fn(__VA_ARGS__, 1); break;                                                         \
    case 2: fn(__VA_ARGS__, 2); break;                                                         \
    case 3: fn(__VA_ARGS__, 3); break;                                                         \
    case 4: fn(__VA_ARGS__, 4); break;                                                         \
    case 5: fn(__VA_ARGS__, 5); break;                                                         \
    case 6: fn(__VA_ARGS__, 6); break;                                                         \
    case 7: fn(__VA_ARGS__, 7); break;                                                         \
    default: fn(__VA_ARGS__, DW_CHUNK); break;                                                 \
    }                                                                                          \
  } while (0)

/* The chunked fp32 loops, at 8 floats a block and at 16 (cpu_dw_chunk.h) */
#define DW_VT gs_v8
#define DW_VW GS_CPU_VB
#define DW_NAME(x) x##_v8
#include "kernels/cpu/cpu_dw_chunk.h"
#undef DW_VT
#undef DW_VW
#undef DW_NAME
#define DW_VT gs_v16
#define DW_VW 16
#define DW_NAME(x) x##_v16
#include "kernels/cpu/cpu_dw_chunk.h"
#undef DW_VT
#undef DW_VW
#undef DW_NAME

/* output rows (img, oy) [lo, hi) */
GS_CPU_RANGE(dw_fwd_part, ctx, lo, hi, isa) {
  const struct dw_job *j = ctx;
  const geo *g = j->g;
  long cfull = g->c - g->c % GS_CPU_VB;
  for (long item = (long)lo; item < (long)hi; item++) {
    long img = item / g->oh, oy = item % g->oh, ky0, ky1;
    tap_range(oy, g->stride, g->pt, g->kh, g->h, &ky0, &ky1);
    for (long ox = 0; ox < g->ow; ox++) {
      long kx0, kx1;
      tap_range(ox, g->stride, g->pl, g->kw, g->w, &kx0, &kx1);
      long c0 = 0;
      if (j->dt == GS_F32 && isa >= GS_CPU_ISA_AVX512)
        for (long nb; (nb = dw_blocks(g->c - c0, 16)) > 0; c0 += nb * 16)
          DW_CALL_NB(dw_fwd_chunk_v16, nb, j, img, oy, ox, ky0, ky1, kx0, kx1, c0);
      if (j->dt == GS_F32)
        for (long nb; (nb = dw_blocks(cfull - c0, GS_CPU_VB)) > 0; c0 += nb * GS_CPU_VB)
          DW_CALL_NB(dw_fwd_chunk_v8, nb, j, img, oy, ox, ky0, ky1, kx0, kx1, c0);
      for (; c0 < cfull; c0 += GS_CPU_VB)
        dw_fwd_block(j, img, oy, ox, ky0, ky1, kx0, kx1, c0, GS_CPU_VB);
      if (cfull < g->c)
        dw_fwd_block(j, img, oy, ox, ky0, ky1, kx0, kx1, cfull, g->c - cfull);
    }
    if (j->relu && j->dt == GS_F32) /* the row just written, still in cache */
      gs_cpu_relu_rows((float *)j->dst + (size_t)item * (size_t)(g->ow * g->c), 1,
                       (size_t)(g->ow * g->c), 0);
  }
}

/* ---- depthwise in bf16 on AVX512-BF16 ----
 *
 * With bf16 storage at the avx512bf16 level, the forward and the stride-1
 * input gradient take their inner products with vdpbf16ps, which
 * multiplies 16 pairs of bf16 and adds both products of each pair to an
 * fp32 lane. A pair is two taps of one channel: the weights are paired
 * once per call into the workspace (tap 2q in the low half, 2q+1 in the
 * high one, 0 past the last tap), the input pixels of the two taps are
 * interleaved the same way per output (a pixel outside the image reads
 * as 0). Each output lane starts from the bias and adds its pairs in
 * window order. vdpbf16ps adds the high product first, treats subnormal
 * inputs as zero and flushes a subnormal result, so the fp32 sum differs
 * in its low bits from the one-tap-at-a-time loops; after the rounding to
 * bf16 on store each output is within 2^-8 of the fp32 reference's value,
 * relative to the sum of the magnitudes of its terms (test_kernels_isa),
 * and, being a fixed order over one output, the bits depend neither on the
 * thread count nor on the run. */
#if GS_CPU_X86_TARGETS
#include <immintrin.h>

/* Windows of at most this many taps take the native path (the tap list of
 * one output sits on the stack). */
#define DW_BF16_MAX_TAPS 64

static bool dw_bf16_native(gs_dtype dt, const geo *g) {
  return dt == GS_BF16 && gs_cpu_isa() >= GS_CPU_ISA_AVX512BF16 &&
         g->kh * g->kw <= DW_BF16_MAX_TAPS;
}

/* w (T, C) bf16 -> wp (ceil(T/2), C) pairs of 32 bits; flip: tap T-1-t in
 * place of tap t (the input gradient walks the window backwards) */
static void dw_bf16_pair(uint32_t *wp, const uint16_t *w, long taps, long c, bool flip) {
  for (long q = 0; q < (taps + 1) / 2; q++)
    for (long ch = 0; ch < c; ch++) {
      long t0 = 2 * q, t1 = 2 * q + 1;
      uint32_t lo = w[(flip ? taps - 1 - t0 : t0) * c + ch];
      uint32_t hi = t1 < taps ? w[(flip ? taps - 1 - t1 : t1) * c + ch] : 0;
      wp[q * c + ch] = lo | hi << 16;
    }
}

static const uint16_t dw_bf16_zeros[16];

/* the fp32 lanes of v rounded to bf16 (nearest even, NaN kept quiet: the
 * bits of gs_cpu_store_f32), after relu where asked, stored under k */
GS_CPU_TARGET_AVX512BF16 static inline void dw_bf16_store(uint16_t *d, __m512 v, bool relu,
                                                          __mmask16 k) {
  if (relu) /* gs_cpu_relu1: kept when > 0 or NaN */
    v = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_NLE_UQ), v);
  __m512i x = _mm512_castps_si512(v), hi = _mm512_srli_epi32(x, 16);
  __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(
      _mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7fff)), lsb), 16);
  __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff)),
                                          _mm512_set1_epi32(0x7f800000));
  r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
  _mm256_mask_storeu_epi16(d, k, _mm512_cvtepi32_epi16(r));
}

/* out (or din) at one pixel: acc = bias (or 0) + the pairs of the taps
 * whose inputs src[q] point at (NULL: outside, reads 0), all channels */
GS_CPU_TARGET_AVX512BF16 static void dw_bf16_pixel(uint16_t *dst, const uint16_t *const *src,
                                                   long ntap, const uint32_t *wp,
                                                   const float *bias, long c, bool relu) {
  for (long c0 = 0; c0 < c; c0 += 16) {
    __mmask16 k = c - c0 >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (c - c0)) - 1);
    __m512 acc = bias ? _mm512_maskz_loadu_ps(k, bias + c0) : _mm512_setzero_ps();
    for (long q = 0; 2 * q < ntap; q++) {
      const uint16_t *a = src[2 * q] ? src[2 * q] + c0 : dw_bf16_zeros;
      const uint16_t *b = 2 * q + 1 < ntap && src[2 * q + 1] ? src[2 * q + 1] + c0 : dw_bf16_zeros;
      __m512i lo = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, a));
      __m512i hi = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, b));
      __m512i x = _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
      __m512i w = _mm512_maskz_loadu_epi32(k, wp + q * c + c0);
      acc = _mm512_dpbf16_ps(acc, (__m512bh)x, (__m512bh)w);
    }
    dw_bf16_store(dst + c0, acc, relu, k);
  }
}

struct dw_bf16_job {
  const geo *g;
  uint16_t *dst;
  const uint16_t *src;
  const uint32_t *wp; /* the paired weights */
  const float *bias;  /* fp32, or NULL */
  bool relu;
};

/* forward: output rows (img, oy) [lo, hi); taps in window order */
static void dw_bf16_fwd_part(void *ctx, size_t lo, size_t hi) {
  const struct dw_bf16_job *j = ctx;
  const geo *g = j->g;
  const uint16_t *src[DW_BF16_MAX_TAPS];
  for (long item = (long)lo; item < (long)hi; item++) {
    long img = item / g->oh, oy = item % g->oh;
    for (long ox = 0; ox < g->ow; ox++) {
      for (long ky = 0; ky < g->kh; ky++)
        for (long kx = 0; kx < g->kw; kx++) {
          long iy = oy * g->stride - g->pt + ky, ix = ox * g->stride - g->pl + kx;
          bool in = iy >= 0 && iy < g->h && ix >= 0 && ix < g->w;
          src[ky * g->kw + kx] = in ? j->src + ((img * g->h + iy) * g->w + ix) * g->c : NULL;
        }
      dw_bf16_pixel(j->dst + ((img * g->oh + oy) * g->ow + ox) * g->c, src, g->kh * g->kw,
                    j->wp, j->bias, g->c, j->relu);
    }
  }
}

/* input gradient, stride 1: input rows (img, iy) [lo, hi); din(iy, ix)
 * gathers dout(iy + pt - ky, ix + pl - kx) * w(ky, kx), walked from the
 * last tap to the first so the output pixels go in order */
static void dw_bf16_dgrad_part(void *ctx, size_t lo, size_t hi) {
  const struct dw_bf16_job *j = ctx;
  const geo *g = j->g;
  const uint16_t *src[DW_BF16_MAX_TAPS];
  long taps = g->kh * g->kw;
  for (long item = (long)lo; item < (long)hi; item++) {
    long img = item / g->h, iy = item % g->h;
    for (long ix = 0; ix < g->w; ix++) {
      for (long t = 0; t < taps; t++) {
        long ky = (taps - 1 - t) / g->kw, kx = (taps - 1 - t) % g->kw;
        long oy = iy + g->pt - ky, ox = ix + g->pl - kx;
        bool in = oy >= 0 && oy < g->oh && ox >= 0 && ox < g->ow;
        src[t] = in ? j->src + ((img * g->oh + oy) * g->ow + ox) * g->c : NULL;
      }
      dw_bf16_pixel(j->dst + ((img * g->h + iy) * g->w + ix) * g->c, src, taps, j->wp, NULL,
                    g->c, false);
    }
  }
}
#else
static bool dw_bf16_native(gs_dtype dt, const geo *g) {
  (void)dt, (void)g;
  return false;
}
#endif


/* in (N, H, W, C), w (KH, KW, C), b (C) or NULL, out (N, OH, OW, C); relu
 * as dense's (cpu_dense.c) */
int gs_cpu_depthwise_forward(gs_exec *ex, gs_dtype dt, void *out, const void *in,
                             const void *w, const void *b, const gs_conv_shape *s, void *ws,
                             bool relu) {
  geo g = geo_of(s, s->same);
  const float *wf = w, *bf = b;
#if GS_CPU_X86_TARGETS
  if (dw_bf16_native(dt, &g)) { /* pairs where w's fp32 copy would be, then b */
    float *p = ws;
    uint32_t *wp = ws;
    dw_bf16_pair(wp, w, g.kh * g.kw, g.c, false);
    if (b)
      gs_cpu_load_f32(dt, b, p + g.kh * g.kw * g.c, (size_t)g.c);
    struct dw_bf16_job j = {.g = &g, .dst = out, .src = in, .wp = wp,
                            .bias = b ? p + g.kh * g.kw * g.c : NULL, .relu = relu};
    gs_cpu_parallel(ex, (size_t)(g.n * g.oh), 2, dw_bf16_fwd_part, &j);
    return 0;
  }
#endif
  if (dt != GS_F32) {
    float *p = ws;
    gs_cpu_load_f32(dt, w, p, (size_t)(g.kh * g.kw * g.c));
    wf = p;
    if (b) {
      gs_cpu_load_f32(dt, b, p + g.kh * g.kw * g.c, (size_t)g.c);
      bf = p + g.kh * g.kw * g.c;
    }
  }
  struct dw_job j = {.dt = dt, .g = &g, .dst = out, .src = in, .wf = wf, .bf = bf,
                     .relu = relu};
  gs_cpu_parallel(ex, (size_t)(g.n * g.oh), 2, GS_CPU_PICK(dw_fwd_part), &j);
  return 0;
}

/* dw and db of channels [c0, c0 + cb): every output pixel in order adds
 * its terms, as the plain loop does */
static inline __attribute__((always_inline)) void dw_wgrad_block(const struct dw_job *j, long c0,
                                                                 long cb) {
  const geo *g = j->g;
  float dtmp[GS_CPU_VB], xtmp[GS_CPU_VB];
  for (long img = 0; img < g->n; img++)
    for (long oy = 0; oy < g->oh; oy++) {
      long ky0, ky1;
      tap_range(oy, g->stride, g->pt, g->kh, g->h, &ky0, &ky1);
      for (long ox = 0; ox < g->ow; ox++) {
        const float *d = load_block(j->dt, j->src,
                                    (size_t)(((img * g->oh + oy) * g->ow + ox) * g->c + c0), dtmp, cb);
        if (j->db)
          for (long c = 0; c < cb; c++)
            j->db[c0 + c] += d[c];
        if (!j->dw)
          continue;
        long kx0, kx1;
        tap_range(ox, g->stride, g->pl, g->kw, g->w, &kx0, &kx1);
        for (long ky = ky0; ky < ky1; ky++) {
          long iy = oy * g->stride - g->pt + ky;
          for (long kx = kx0; kx < kx1; kx++) {
            long ix = ox * g->stride - g->pl + kx;
            const float *x = load_block(j->dt, j->in,
                                        (size_t)(((img * g->h + iy) * g->w + ix) * g->c + c0), xtmp, cb);
            float *dwr = j->dw + (ky * g->kw + kx) * g->c + c0;
            for (long c = 0; c < cb; c++)
              dwr[c] += d[c] * x[c];
          }
        }
      }
    }
}

/* channels [lo*VB, hi*VB) of dw and db: this thread owns them */
GS_CPU_RANGE(dw_wgrad_part, ctx, lo, hi, isa) {
  const struct dw_job *j = ctx;
  long clo = (long)lo * GS_CPU_VB, chi = (long)hi * GS_CPU_VB;
  if (chi > j->g->c)
    chi = j->g->c;
  long c0 = clo;
  bool chunked = j->dt == GS_F32 && j->g->kh * j->g->kw <= DW_LOCAL_TAPS;
  if (chunked && j->dw && j->g->kh == 3 && j->g->kw == 3) { /* the common window */
    if (isa >= GS_CPU_ISA_AVX512)
      for (long nb; (nb = dw_blocks(chi - c0, 16)) > 0; c0 += nb * 16) {
        nb = nb < DW_W3_NB(16) ? nb : DW_W3_NB(16);
        if (nb == 2)
          dw_wgrad3_chunk_v16(j, c0, 2);
        else
          dw_wgrad3_chunk_v16(j, c0, 1);
      }
    for (; c0 + GS_CPU_VB <= chi; c0 += GS_CPU_VB)
      dw_wgrad3_chunk_v8(j, c0, 1);
  }
  if (chunked && isa >= GS_CPU_ISA_AVX512)
    for (long nb; (nb = dw_blocks(chi - c0, 16)) > 0; c0 += nb * 16)
      DW_CALL_NB(dw_wgrad_chunk_v16, nb, j, c0);
  if (chunked)
    for (long nb; (nb = dw_blocks(chi - c0, GS_CPU_VB)) > 0; c0 += nb * GS_CPU_VB)
      DW_CALL_NB(dw_wgrad_chunk_v8, nb, j, c0);
  for (; c0 + GS_CPU_VB <= chi; c0 += GS_CPU_VB)
    dw_wgrad_block(j, c0, GS_CPU_VB);
  if (c0 < chi)
    dw_wgrad_block(j, c0, chi - c0);
}

/* din at (img, iy, ix), channels [c0, c0 + cb): gathered from the windows
 * that read it, from tap t on */
static inline __attribute__((always_inline)) void dw_dgrad_block(const struct dw_job *j, long img,
                                                                 long iy, long ix,
                                                                 const struct dw_first *t,
                                                                 long c0, long cb) {
  const geo *g = j->g;
  float acc[GS_CPU_VB], tmp[GS_CPU_VB];
  for (long c = 0; c < cb; c++)
    acc[c] = 0.0f;
  for (long ky = t->ky, oy = t->oy; ky < g->kh && oy >= 0; ky += g->stride, oy--) {
    if (oy >= g->oh)
      continue;
    for (long kx = t->kx, ox = t->ox; kx < g->kw && ox >= 0; kx += g->stride, ox--) {
      if (ox >= g->ow)
        continue;
      const float *d = load_block(j->dt, j->src,
                                  (size_t)(((img * g->oh + oy) * g->ow + ox) * g->c + c0), tmp, cb);
      const float *wr = j->wf + (ky * g->kw + kx) * g->c + c0;
      for (long c = 0; c < cb; c++)
        acc[c] += d[c] * wr[c];
    }
  }
  store_block(j->dt, j->dst, (size_t)(((img * g->h + iy) * g->w + ix) * g->c + c0), acc, cb);
}

/* input rows (img, iy) [lo, hi) of din. The first taps (as in col2im_part:
 * ky = (iy + pt) mod stride, oy = (iy + pt) / stride) are worked out once a
 * row and stepped along it, not divided out per pixel and block. */
GS_CPU_RANGE(dw_dgrad_part, ctx, lo, hi, isa) {
  const struct dw_job *j = ctx;
  const geo *g = j->g;
  long cfull = g->c - g->c % GS_CPU_VB;
  for (long item = (long)lo; item < (long)hi; item++) {
    long img = item / g->h, iy = item % g->h;
    struct dw_first t = {.ky = (iy + g->pt) % g->stride, .oy = (iy + g->pt) / g->stride,
                         .kx = g->pl % g->stride, .ox = g->pl / g->stride};
    for (long ix = 0; ix < g->w; ix++) {
      long c0 = 0;
      if (j->dt == GS_F32 && isa >= GS_CPU_ISA_AVX512)
        for (long nb; (nb = dw_blocks(g->c - c0, 16)) > 0; c0 += nb * 16)
          DW_CALL_NB(dw_dgrad_chunk_v16, nb, j, img, iy, ix, &t, c0);
      if (j->dt == GS_F32)
        for (long nb; (nb = dw_blocks(cfull - c0, GS_CPU_VB)) > 0; c0 += nb * GS_CPU_VB)
          DW_CALL_NB(dw_dgrad_chunk_v8, nb, j, img, iy, ix, &t, c0);
      for (; c0 < cfull; c0 += GS_CPU_VB)
        dw_dgrad_block(j, img, iy, ix, &t, c0, GS_CPU_VB);
      if (cfull < g->c)
        dw_dgrad_block(j, img, iy, ix, &t, cfull, g->c - cfull);
      if (++t.kx == g->stride) { /* ix + 1 + pl = ox * stride + kx */
        t.kx = 0;
        t.ox++;
      }
    }
  }
}

/* dw (KH, KW, C) f32 +=, db (C) f32 +=, din (N, H, W, C) dt overwritten */
int gs_cpu_depthwise_backward(gs_exec *ex, gs_dtype dt, void *din, float *dw, float *db,
                              const void *dout, const void *in, const void *w,
                              const gs_conv_shape *s, void *ws) {
  geo g = geo_of(s, s->same);
  const float *wf = w;
  if (dt != GS_F32 && din && !(dw_bf16_native(dt, &g) && g.stride == 1)) {
    gs_cpu_load_f32(dt, w, ws, (size_t)(g.kh * g.kw * g.c));
    wf = ws;
  }
  struct dw_job j = {.dt = dt, .g = &g, .dst = din, .src = dout, .in = in, .wf = wf,
                     .dw = dw, .db = db};
  if (dw || db)
    gs_cpu_parallel(ex, (size_t)((g.c + GS_CPU_VB - 1) / GS_CPU_VB), 1, GS_CPU_PICK(dw_wgrad_part), &j);
  if (!din)
    return 0;
#if GS_CPU_X86_TARGETS
  if (dw_bf16_native(dt, &g) && g.stride == 1) { /* the pairs overwrite w's fp32 copy */
    dw_bf16_pair(ws, w, g.kh * g.kw, g.c, true);
    struct dw_bf16_job jb = {.g = &g, .dst = din, .src = dout, .wp = ws};
    gs_cpu_parallel(ex, (size_t)(g.n * g.h), 2, dw_bf16_dgrad_part, &jb);
    return 0;
  }
#endif
  gs_cpu_parallel(ex, (size_t)(g.n * g.h), 2, GS_CPU_PICK(dw_dgrad_part), &j);
  return 0;
}

/* ---- max pool (always VALID) ---- */

struct pool_job {
  gs_dtype dt;
  const geo *g;
  void *dst;
  const void *src; /* in (forward) or dout (backward) */
  const void *in;
};

GS_CPU_RANGE(maxpool_fwd_part, ctx, lo, hi, isa) {
  const struct pool_job *j = ctx;
  const geo *g = j->g;
  float best[GS_CPU_CB], tmp[GS_CPU_CB];
  for (long item = (long)lo; item < (long)hi; item++) {
    long img = item / g->oh, oy = item % g->oh;
    for (long ox = 0; ox < g->ow; ox++)
      for (long c0 = 0; c0 < g->c; c0 += GS_CPU_CB) {
        long cb = g->c - c0 < GS_CPU_CB ? g->c - c0 : GS_CPU_CB;
        long base = ((img * g->h + oy * g->stride) * g->w + ox * g->stride) * g->c + c0;
        for (long ky = 0; ky < g->kh; ky++)
          for (long kx = 0; kx < g->kw; kx++) {
            const float *x = load_block(j->dt, j->src, (size_t)(base + (ky * g->w + kx) * g->c), tmp, cb);
            if (ky == 0 && kx == 0)
              memcpy(best, x, sizeof(float) * (size_t)cb);
            else
              for (long c = 0; c < cb; c++)
                best[c] = x[c] > best[c] ? x[c] : best[c];
          }
        size_t at = (size_t)(((img * g->oh + oy) * g->ow + ox) * g->c + c0);
        gs_cpu_store_f32(j->dt, gs_cpu_at_mut(j->dt, j->dst, at), best, (size_t)cb);
      }
  }
}

/* in (N, H, W, C), out (N, OH, OW, C); OH/OW from VALID whatever s->same */
int gs_cpu_maxpool_forward(gs_exec *ex, gs_dtype dt, void *out, const void *in,
                           const gs_conv_shape *s) {
  geo g = geo_of(s, false);
  struct pool_job j = {.dt = dt, .g = &g, .dst = out, .src = in};
  gs_cpu_parallel(ex, (size_t)(g.n * g.oh), 2, GS_CPU_PICK(maxpool_fwd_part), &j);
  return 0;
}

/* images [lo, hi): din zeroed, then each window's dout added at its first
 * maximum; one image per thread, so overlapping windows never race. */
GS_CPU_RANGE(maxpool_bwd_part, ctx, lo, hi, isa) {
  const struct pool_job *j = ctx;
  const geo *g = j->g;
  size_t esz = gs_dtype_size(j->dt), img_elems = (size_t)(g->h * g->w * g->c);
  float best[GS_CPU_CB], tmp[GS_CPU_CB], dtmp[GS_CPU_CB];
  long arg[GS_CPU_CB];
  bool overlap = g->stride < g->kh || g->stride < g->kw;
  memset(gs_cpu_at_mut(j->dt, j->dst, lo * img_elems), 0, (hi - lo) * img_elems * esz);
  for (long img = (long)lo; img < (long)hi; img++)
    for (long oy = 0; oy < g->oh; oy++)
      for (long ox = 0; ox < g->ow; ox++)
        for (long c0 = 0; c0 < g->c; c0 += GS_CPU_CB) {
          long cb = g->c - c0 < GS_CPU_CB ? g->c - c0 : GS_CPU_CB;
          /* arg: element offset of each channel's first maximum */
          long base = ((img * g->h + oy * g->stride) * g->w + ox * g->stride) * g->c + c0;
          for (long ky = 0; ky < g->kh; ky++)
            for (long kx = 0; kx < g->kw; kx++) {
              long at = base + (ky * g->w + kx) * g->c;
              const float *x = load_block(j->dt, j->in, (size_t)at, tmp, cb);
              bool first = ky == 0 && kx == 0;
              for (long c = 0; c < cb; c++)
                if (first || x[c] > best[c]) {
                  best[c] = x[c];
                  arg[c] = at + c;
                }
            }
          const float *d = load_block(j->dt, j->src,
                                      (size_t)(((img * g->oh + oy) * g->ow + ox) * g->c + c0), dtmp, cb);
          for (long c = 0; c < cb; c++) {
            size_t at = (size_t)arg[c];
            if (j->dt == GS_F32) {
              ((float *)j->dst)[at] += d[c];
            } else {
              float v = d[c];
              if (overlap) { /* windows share inputs: add onto what is there */
                float old;
                gs_cpu_load_f32(j->dt, gs_cpu_at(j->dt, j->dst, at), &old, 1);
                v += old;
              }
              gs_cpu_store_f32(j->dt, gs_cpu_at_mut(j->dt, j->dst, at), &v, 1);
            }
          }
        }
}

int gs_cpu_maxpool_backward(gs_exec *ex, gs_dtype dt, void *din, const void *dout,
                            const void *in, const gs_conv_shape *s) {
  geo g = geo_of(s, false);
  struct pool_job j = {.dt = dt, .g = &g, .dst = din, .src = dout, .in = in};
  if (g.oh == 0 || g.ow == 0) {
    memset(din, 0, (size_t)(g.n * g.h * g.w * g.c) * gs_dtype_size(dt));
    return 0;
  }
  gs_cpu_parallel(ex, (size_t)g.n, 1, GS_CPU_PICK(maxpool_bwd_part), &j);
  return 0;
}

/* ---- global average pool ---- */

struct gap_job {
  gs_dtype dt;
  void *dst;
  const void *src;
  long hw, c;
};

GS_CPU_RANGE(gap_fwd_part, ctx, lo, hi, isa) {
  const struct gap_job *j = ctx;
  float acc[GS_CPU_CB], tmp[GS_CPU_CB];
  for (long img = (long)lo; img < (long)hi; img++)
    for (long c0 = 0; c0 < j->c; c0 += GS_CPU_CB) {
      long cb = j->c - c0 < GS_CPU_CB ? j->c - c0 : GS_CPU_CB;
      memset(acc, 0, sizeof(float) * (size_t)cb);
      for (long q = 0; q < j->hw; q++) {
        const float *x = load_block(j->dt, j->src, (size_t)((img * j->hw + q) * j->c + c0), tmp, cb);
        for (long c = 0; c < cb; c++)
          acc[c] += x[c];
      }
      for (long c = 0; c < cb; c++)
        acc[c] /= (float)j->hw;
      gs_cpu_store_f32(j->dt, gs_cpu_at_mut(j->dt, j->dst, (size_t)(img * j->c + c0)), acc, (size_t)cb);
    }
}

GS_CPU_RANGE(gap_bwd_part, ctx, lo, hi, isa) {
  const struct gap_job *j = ctx;
  float g[GS_CPU_CB], tmp[GS_CPU_CB];
  for (long img = (long)lo; img < (long)hi; img++)
    for (long c0 = 0; c0 < j->c; c0 += GS_CPU_CB) {
      long cb = j->c - c0 < GS_CPU_CB ? j->c - c0 : GS_CPU_CB;
      const float *d = load_block(j->dt, j->src, (size_t)(img * j->c + c0), tmp, cb);
      for (long c = 0; c < cb; c++)
        g[c] = d[c] / (float)j->hw;
      for (long q = 0; q < j->hw; q++)
        gs_cpu_store_f32(j->dt, gs_cpu_at_mut(j->dt, j->dst, (size_t)((img * j->hw + q) * j->c + c0)),
                         g, (size_t)cb);
    }
}

/* in (N, H, W, C) -> out (N, C), the mean over H*W */
int gs_cpu_gap_forward(gs_exec *ex, gs_dtype dt, void *out, const void *in, uint32_t n,
                       uint32_t h, uint32_t w, uint32_t c) {
  struct gap_job j = {.dt = dt, .dst = out, .src = in, .hw = (long)h * w, .c = c};
  if (j.hw == 0) {
    memset(out, 0, (size_t)n * c * gs_dtype_size(dt));
    return 0;
  }
  gs_cpu_parallel(ex, n, 8, GS_CPU_PICK(gap_fwd_part), &j);
  return 0;
}

/* din (N, H, W, C) = dout (N, C) / (H*W), overwritten */
int gs_cpu_gap_backward(gs_exec *ex, gs_dtype dt, void *din, const void *dout, uint32_t n,
                        uint32_t h, uint32_t w, uint32_t c) {
  struct gap_job j = {.dt = dt, .dst = din, .src = dout, .hw = (long)h * w, .c = c};
  if (j.hw == 0)
    return 0;
  gs_cpu_parallel(ex, n, 8, GS_CPU_PICK(gap_bwd_part), &j);
  return 0;
}
