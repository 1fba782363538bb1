/*
 * test_kernels_isa.c: the cpu backend at every instruction-set level this
 * host has (cpu_isa.c: baseline, avx2, avx512, avx512bf16; GS_CPU_ISA).
 *
 * Each op runs forward and backward at the baseline level and again at
 * every higher level the CPU has, on odd shapes (channels 7, 13, 40 = 16 +
 * 16 + 8, 133: every block width and tail of the depthwise loops), in fp32,
 * fp16 and bf16 storage. The levels compile the same C with wider vectors
 * and never contract or reorder a sum, so every result must be the same
 * bits at every level (the strongest form of "within tolerance"), except
 * the bf16 depthwise forward and stride-1 input gradient at the avx512bf16
 * level, which take native bf16 dot products (vdpbf16ps) and round
 * differently: those are held to their stated tolerance (2^-8 of the sum of
 * the magnitudes of an output's terms) of a double-precision definition,
 * and to the same bits on 1 and 2 threads and from run to run; and fp32
 * conv2d at the avx2 level and above, which runs direct loops of fused
 * multiply-adds (cpu_conv_direct.c): out, din and dw within 2e-5 of the
 * magnitude of their terms of a double-precision definition, the same bits
 * at avx2 as at avx512, on 1 and 2 threads, from run to run and in chunks
 * of images. The
 * depthwise forward and input gradient are checked against the double
 * definition at every level, within the storage type's tolerance. test_kernels checks
 * the ops' gradients against finite differences at the host's own level;
 * its runs under GS_CPU_ISA=avx2 and =baseline cover the lower levels.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_internal.h"

static gs_backend *B;
static gs_exec *EX;
static uint64_t rng;

static void setup(void) {
  B = gs_backend_cpu();
  gs_exec_config cfg = {.threads = 2, .device_index = 0};
  cr_assert_eq(B->exec_create(B, &cfg, &EX), 0);
  rng = 0x2545f4914f6cdd1dull;
}

static void teardown(void) {
  B->exec_destroy(EX);
  gs_cpu_isa_set(gs_cpu_isa_max());
}

static float frand(void) { /* uniform in [-1, 1) */
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return (float)((double)(rng >> 11) / (double)(1ull << 53) * 2.0 - 1.0);
}

/* n random values as dt (a new buffer), and their fp32 values in f */
static void *rand_dt(gs_dtype dt, size_t n, float *f) {
  void *p = malloc(n * gs_dtype_size(dt) + 1);
  for (size_t i = 0; i < n; i++)
    f[i] = frand();
  gs_cpu_store_f32(dt, p, f, n);
  gs_cpu_load_f32(dt, p, f, n); /* the values dt holds */
  return p;
}

static const gs_dtype DTS[] = {GS_F32, GS_F16, GS_BF16};

/* What one op wrote, at one level: forward out, din, dw, db. */
typedef struct result {
  void *out, *din;
  float *dw, *db;
  size_t nout, nin, nw, nb; /* elements */
} result;

static void result_free(result *r) { free(r->out), free(r->din), free(r->dw), free(r->db); }

static void expect_same(const char *what, const char *name, int level, const void *a,
                        const void *b, size_t bytes) {
  if (!bytes || !memcmp(a, b, bytes))
    return;
  size_t i = 0;
  while (((const char *)a)[i] == ((const char *)b)[i])
    i++;
  cr_assert_fail("%s %s: %s differs from baseline at byte %zu of %zu", what, name,
                 gs_cpu_isa_name(level), i, bytes);
}

static void compare(const char *what, int level, gs_dtype dt, const result *base,
                    const result *r) {
  size_t es = gs_dtype_size(dt);
  expect_same(what, "out", level, base->out, r->out, base->nout * es);
  expect_same(what, "din", level, base->din, r->din, base->nin * es);
  expect_same(what, "dw", level, base->dw, r->dw, base->nw * sizeof(float));
  expect_same(what, "db", level, base->db, r->db, base->nb * sizeof(float));
}

/* ---- depthwise and conv2d ---- */

typedef struct conv_case {
  gs_conv_shape s;
  bool depthwise;
  const char *name;
} conv_case;

/* in, w, b, dout of a case (fixed per case, so every level sees the same) */
typedef struct conv_data {
  void *in, *w, *b, *dout;
  float *inf, *wf, *bf;
  size_t nin, nw, nout;
} conv_data;

static conv_data conv_data_make(const conv_case *c, gs_dtype dt) {
  conv_data d;
  const gs_conv_shape *s = &c->s;
  d.nin = (size_t)s->n * s->h * s->w * s->c;
  d.nw = (size_t)s->kh * s->kw * s->c * (c->depthwise ? 1 : s->f);
  d.nout = (size_t)s->n * s->oh * s->ow * s->f;
  d.inf = malloc(d.nin * 4), d.wf = malloc(d.nw * 4), d.bf = malloc(s->f * 4);
  float *tmp = malloc(d.nout * 4);
  d.in = rand_dt(dt, d.nin, d.inf);
  d.w = rand_dt(dt, d.nw, d.wf);
  d.b = rand_dt(dt, s->f, d.bf);
  d.dout = rand_dt(dt, d.nout, tmp);
  free(tmp);
  return d;
}

static void conv_data_free(conv_data *d) {
  free(d->in), free(d->w), free(d->b), free(d->dout), free(d->inf), free(d->wf), free(d->bf);
}

static result conv_run(const conv_case *c, gs_dtype dt, const conv_data *d, bool relu) {
  const gs_conv_shape *s = &c->s;
  size_t es = gs_dtype_size(dt);
  result r = {.nout = d->nout, .nin = d->nin, .nw = d->nw, .nb = s->f};
  r.out = calloc(d->nout + 1, es), r.din = calloc(d->nin + 1, es);
  r.dw = calloc(d->nw, 4), r.db = calloc(s->f, 4);
  size_t wsb = c->depthwise ? B->depthwise_workspace(dt, s) : B->conv2d_workspace(dt, s);
  void *ws = wsb ? malloc(wsb) : NULL;
  if (c->depthwise) {
    cr_assert_eq(B->depthwise_forward(EX, dt, r.out, d->in, d->w, d->b, s, ws, relu), 0);
    cr_assert_eq(B->depthwise_backward(EX, dt, r.din, r.dw, r.db, d->dout, d->in, d->w, s, ws), 0);
  } else {
    cr_assert_eq(B->conv2d_forward(EX, dt, r.out, d->in, d->w, d->b, s, ws, relu), 0);
    cr_assert_eq(B->conv2d_backward(EX, dt, r.din, r.dw, r.db, d->dout, d->in, d->w, s, ws), 0);
  }
  free(ws);
  return r;
}

/* the padding above and left of a case's input */
static void pads_of(const gs_conv_shape *s, long *pt, long *pl) {
  *pt = s->same ? ((long)(s->oh - 1) * s->stride + s->kh - (long)s->h) / 2 : 0;
  *pl = s->same ? ((long)(s->ow - 1) * s->stride + s->kw - (long)s->w) / 2 : 0;
  *pt = *pt < 0 ? 0 : *pt, *pl = *pl < 0 ? 0 : *pl;
}

/* din of the depthwise backward in double, from the dt values, and the
 * sum of the magnitudes of each element's terms */
static void dw_dgrad_ref(const gs_conv_shape *s, const conv_data *d, gs_dtype dt, double *din,
                         double *mag) {
  float *dout = malloc(d->nout * 4);
  gs_cpu_load_f32(dt, d->dout, dout, d->nout);
  memset(din, 0, d->nin * sizeof(double));
  memset(mag, 0, d->nin * sizeof(double));
  long pt, pl;
  pads_of(s, &pt, &pl);
  for (long img = 0; img < (long)s->n; img++)
    for (long oy = 0; oy < (long)s->oh; oy++)
      for (long ox = 0; ox < (long)s->ow; ox++)
        for (long ky = 0; ky < (long)s->kh; ky++)
          for (long kx = 0; kx < (long)s->kw; kx++) {
            long iy = oy * s->stride - pt + ky, ix = ox * s->stride - pl + kx;
            if (iy < 0 || ix < 0 || iy >= (long)s->h || ix >= (long)s->w)
              continue;
            for (long ch = 0; ch < (long)s->c; ch++) {
              double t = (double)dout[((img * s->oh + oy) * s->ow + ox) * s->c + ch] *
                         d->wf[(ky * s->kw + kx) * s->c + ch];
              size_t at = (size_t)(((img * s->h + iy) * s->w + ix) * s->c + ch);
              din[at] += t, mag[at] += fabs(t);
            }
          }
  free(dout);
}

/* out[i] of the depthwise forward in double, from the dt values; *mag: the
 * sum of the magnitudes of its terms */
static double dw_ref(const gs_conv_shape *s, const conv_data *d, size_t i, double *mag) {
  uint32_t ch = (uint32_t)(i % s->c);
  size_t q = i / s->c;
  long ox = (long)(q % s->ow), oy = (long)(q / s->ow % s->oh), img = (long)(q / s->ow / s->oh);
  long pt, pl;
  pads_of(s, &pt, &pl);
  double acc = d->bf[ch];
  *mag = fabs(acc);
  for (long ky = 0; ky < (long)s->kh; ky++)
    for (long kx = 0; kx < (long)s->kw; kx++) {
      long iy = oy * s->stride - pt + ky, ix = ox * s->stride - pl + kx;
      if (iy < 0 || ix < 0 || iy >= (long)s->h || ix >= (long)s->w)
        continue;
      double t = (double)d->inf[((img * s->h + iy) * s->w + ix) * s->c + ch] *
                 d->wf[(ky * s->kw + kx) * s->c + ch];
      acc += t, *mag += fabs(t);
    }
  return acc;
}

/* relative tolerance of one rounding to dt and fp32 sums of <= 9 terms of
 * |x| <= 1 (abs part: the sum's scale) */
static double dt_tol(gs_dtype dt) {
  return dt == GS_F32 ? 1e-5 : dt == GS_F16 ? 2e-3 : 1.6e-2;
}

/* whether (case, dt, level) takes the native bf16 dot products: the
 * forward, and the input gradient at stride 1 */
static bool native_bf16(const conv_case *c, gs_dtype dt, int level, bool *dgrad) {
  *dgrad = c->depthwise && dt == GS_BF16 && level >= GS_CPU_ISA_AVX512BF16 && c->s.stride == 1;
  return c->depthwise && dt == GS_BF16 && level >= GS_CPU_ISA_AVX512BF16;
}

/* whether (case, dt, level) takes the direct fp32 conv loops
 * (cpu_conv_direct.c): every fp32 conv2d at the AVX2 level and above */
static bool direct_conv(const conv_case *c, gs_dtype dt, int level) {
  return !c->depthwise && dt == GS_F32 && level >= GS_CPU_ISA_AVX2;
}

/* a path of its own rounding (native bf16, direct conv): the same bits on
 * 1 thread as on 2, and on a second run */
static void check_repeat(const conv_case *c, gs_dtype dt, int level, const conv_data *d,
                         const result *r, bool relu, const char *path) {
  char what[96];
  result again = conv_run(c, dt, d, relu);
  snprintf(what, sizeof what, "%s %s again", c->name, path);
  compare(what, level, dt, r, &again);
  result_free(&again);
  gs_exec *two = EX, *one = NULL;
  gs_exec_config cfg = {.threads = 1, .device_index = 0};
  cr_assert_eq(B->exec_create(B, &cfg, &one), 0);
  EX = one;
  result r1 = conv_run(c, dt, d, relu);
  EX = two;
  B->exec_destroy(one);
  snprintf(what, sizeof what, "%s %s, 1 thread against 2", c->name, path);
  compare(what, level, dt, r, &r1);
  result_free(&r1);
}

/* conv2d's out, din and dw in double from the fp32 values, and the sums of
 * the magnitudes of each element's terms */
typedef struct conv_ref {
  double *out, *omag, *din, *imag, *dw, *wmag;
} conv_ref;

static conv_ref conv_ref_make(const gs_conv_shape *s, const conv_data *d) {
  conv_ref r;
  r.out = calloc(d->nout, sizeof(double)), r.omag = calloc(d->nout, sizeof(double));
  r.din = calloc(d->nin, sizeof(double)), r.imag = calloc(d->nin, sizeof(double));
  r.dw = calloc(d->nw, sizeof(double)), r.wmag = calloc(d->nw, sizeof(double));
  const float *dout = d->dout; /* fp32 only */
  long pt, pl;
  pads_of(s, &pt, &pl);
  long C = (long)s->c, F = (long)s->f;
  for (long img = 0; img < (long)s->n; img++)
    for (long oy = 0; oy < (long)s->oh; oy++)
      for (long ox = 0; ox < (long)s->ow; ox++) {
        size_t o = (size_t)(((img * s->oh + oy) * s->ow + ox) * F);
        for (long f = 0; f < F; f++)
          r.out[o + f] = d->bf[f], r.omag[o + f] = fabs(d->bf[f]);
        for (long ky = 0; ky < (long)s->kh; ky++)
          for (long kx = 0; kx < (long)s->kw; kx++) {
            long iy = oy * s->stride - pt + ky, ix = ox * s->stride - pl + kx;
            if (iy < 0 || ix < 0 || iy >= (long)s->h || ix >= (long)s->w)
              continue;
            size_t i = (size_t)(((img * s->h + iy) * s->w + ix) * C);
            size_t wt = (size_t)((ky * s->kw + kx) * C * F);
            for (long ch = 0; ch < C; ch++)
              for (long f = 0; f < F; f++) {
                double x = d->inf[i + ch], w = d->wf[wt + ch * F + f], g = dout[o + f];
                r.out[o + f] += x * w, r.omag[o + f] += fabs(x * w);
                r.din[i + ch] += g * w, r.imag[i + ch] += fabs(g * w);
                r.dw[wt + ch * F + f] += x * g, r.wmag[wt + ch * F + f] += fabs(x * g);
              }
          }
      }
  return r;
}

static void conv_ref_free(conv_ref *r) {
  free(r->out), free(r->omag), free(r->din), free(r->imag), free(r->dw), free(r->wmag);
}

/* got (fp32) within 2e-5 of the magnitude of its terms of want (relu'd
 * when asked): fp32's rounding of sums of up to a few hundred terms */
static void expect_near(const char *what, const char *name, const char *lv, const float *got,
                        const double *want, const double *mag, size_t n, bool relu) {
  for (size_t i = 0; i < n; i++) {
    double ref = relu && !(want[i] > 0) ? 0 : want[i];
    cr_assert(fabs(got[i] - ref) <= 2e-5 * mag[i] + 1e-30, "%s at %s: %s[%zu] = %.9g, want %.9g",
              what, lv, name, i, (double)got[i], ref);
  }
}

static void check_conv(const conv_case *c) {
  for (size_t k = 0; k < sizeof DTS / sizeof DTS[0]; k++) {
    gs_dtype dt = DTS[k];
    conv_data d = conv_data_make(c, dt);
    double *din_ref = malloc(d.nin * sizeof(double)), *din_mag = malloc(d.nin * sizeof(double));
    if (c->depthwise)
      dw_dgrad_ref(&c->s, &d, dt, din_ref, din_mag);
    conv_ref cref = {0};
    if (!c->depthwise && dt == GS_F32)
      cref = conv_ref_make(&c->s, &d);
    for (int relu = 0; relu < 2; relu++) {
      cr_assert_eq(gs_cpu_isa_set(GS_CPU_ISA_BASELINE), 0);
      result base = conv_run(c, dt, &d, relu), first_direct = {0};
      int first_level = -1;
      for (int level = GS_CPU_ISA_BASELINE; level <= gs_cpu_isa_max(); level++) {
        cr_assert_eq(gs_cpu_isa_set(level), 0);
        result r = conv_run(c, dt, &d, relu);
        char what[96];
        snprintf(what, sizeof what, "%s %s%s", c->name, gs_dtype_name(dt), relu ? " relu" : "");
        bool ndgrad, nfwd = native_bf16(c, dt, level, &ndgrad), direct = direct_conv(c, dt, level);
        const char *lv = gs_cpu_isa_name(level);
        size_t es = gs_dtype_size(dt);
        if (direct) { /* held to fp32's tolerance of the double definition */
          expect_near(what, "out", lv, r.out, cref.out, cref.omag, r.nout, relu);
          expect_near(what, "din", lv, r.din, cref.din, cref.imag, r.nin, false);
          expect_near(what, "dw", lv, r.dw, cref.dw, cref.wmag, r.nw, false);
          check_repeat(c, dt, level, &d, &r, relu, "direct");
          /* the same chains of multiply-adds at every vector width */
          if (first_level < 0) {
            first_direct = r, first_level = level;
            r = conv_run(c, dt, &d, relu);
          } else {
            snprintf(what, sizeof what, "%s direct at %s against %s", c->name, lv,
                     gs_cpu_isa_name(first_level));
            compare(what, level, dt, &first_direct, &r);
          }
        }
        if (!nfwd && !direct)
          expect_same(what, "out", level, base.out, r.out, base.nout * es);
        if (!ndgrad && !direct)
          expect_same(what, "din", level, base.din, r.din, base.nin * es);
        if (!direct)
          expect_same(what, "dw", level, base.dw, r.dw, base.nw * sizeof(float));
        expect_same(what, "db", level, base.db, r.db, base.nb * sizeof(float));
        if (c->depthwise && !relu) {
          /* the native path's stated tolerance; the others', one rounding
           * to dt of a sum within fp32's */
          double rel = nfwd ? 1.0 / 256 : dt_tol(dt);
          for (size_t i = 0; i < r.nout; i++) {
            double mag, ref = dw_ref(&c->s, &d, i, &mag);
            float f;
            gs_cpu_load_f32(dt, gs_cpu_at(dt, r.out, i), &f, 1);
            cr_assert(fabs(f - ref) <= rel * mag + 1e-30, "%s at %s: out[%zu] = %.9g, want %.9g",
                      what, lv, i, (double)f, ref);
          }
          rel = ndgrad ? 1.0 / 256 : dt_tol(dt);
          for (size_t i = 0; i < r.nin; i++) {
            float f;
            gs_cpu_load_f32(dt, gs_cpu_at(dt, r.din, i), &f, 1);
            cr_assert(fabs(f - din_ref[i]) <= rel * din_mag[i] + 1e-30,
                      "%s at %s: din[%zu] = %.9g, want %.9g", what, lv, i, (double)f,
                      din_ref[i]);
          }
          if (nfwd)
            check_repeat(c, GS_BF16, level, &d, &r, false, "native bf16");
        }
        result_free(&r);
      }
      if (first_level >= 0)
        result_free(&first_direct);
      result_free(&base);
    }
    free(din_ref), free(din_mag);
    conv_ref_free(&cref);
    conv_data_free(&d);
  }
}

static conv_case mk(uint32_t n, uint32_t h, uint32_t w, uint32_t c, uint32_t k, uint32_t stride,
                    bool same, uint32_t f, bool depthwise, const char *name) {
  conv_case cc = {.s = {.n = n, .h = h, .w = w, .c = c, .kh = k, .kw = k, .stride = stride,
                        .same = same, .f = depthwise ? c : f},
                  .depthwise = depthwise, .name = name};
  gs_conv_shape_init(&cc.s);
  return cc;
}

Test(kernels_isa, depthwise_same_bits_every_level, .init = setup, .fini = teardown) {
  conv_case cs[] = {
      mk(2, 9, 7, 7, 3, 1, true, 0, true, "dw 3x3 c=7"),
      mk(3, 7, 9, 13, 3, 2, true, 0, true, "dw 3x3 s2 c=13"),
      mk(2, 8, 5, 40, 3, 1, true, 0, true, "dw 3x3 c=40"),
      mk(1, 6, 6, 133, 5, 1, false, 0, true, "dw 5x5 valid c=133"),
      mk(2, 5, 5, 256, 3, 1, true, 0, true, "dw 3x3 c=256"),
  };
  for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
    check_conv(&cs[i]);
}

Test(kernels_isa, conv2d_same_bits_every_level, .init = setup, .fini = teardown) {
  conv_case cs[] = {
      mk(2, 7, 9, 3, 3, 1, true, 13, false, "conv 3x3 3->13"),
      mk(2, 9, 7, 7, 5, 2, true, 11, false, "conv 5x5 s2 7->11"),
      mk(3, 5, 5, 13, 1, 1, false, 7, false, "conv 1x1 13->7"),
      /* the direct loops' tails: output channels in two blocks (48 + 22),
       * rows of 17 in tiles of 9 and 8, input channels in tiles of 7, 7, 6 */
      mk(2, 6, 17, 20, 3, 1, true, 70, false, "conv 3x3 20->70"),
      /* read in place at stride 2; 33 channels, the last vector one lane */
      mk(3, 8, 8, 40, 1, 2, false, 33, false, "conv 1x1 s2 40->33"),
      /* rows of 29 in tiles of 10, 10, 9 */
      mk(1, 30, 29, 2, 3, 1, true, 16, false, "conv 3x3 2->16 wide"),
  };
  for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
    check_conv(&cs[i]);
}

/* The direct loops in chunks of images (as a small workspace makes them
 * take) give the bits of one chunk: each image is its own sum in the
 * forward, and dw adds images in order either way. */
static void direct_chunks(int level);

Test(kernels_isa, conv2d_direct_chunks_same_bits, .init = setup, .fini = teardown) {
  if (gs_cpu_isa_max() < GS_CPU_ISA_AVX2)
    cr_skip_test("this CPU has no AVX2: the direct conv loops do not run here (%s)",
                 gs_cpu_isa_name(gs_cpu_isa_max()));
  for (int level = GS_CPU_ISA_AVX2; level <= gs_cpu_isa_max(); level++)
    direct_chunks(level);
}

static void direct_chunks(int level) {
  cr_assert_eq(gs_cpu_isa_set(level), 0);
  gs_cpu_geo g = {.n = 5, .h = 9, .w = 11, .c = 6, .kh = 3, .kw = 3, .stride = 1, .f = 10,
                  .oh = 9, .ow = 11, .pt = 1, .pl = 1};
  size_t nin = (size_t)(g.n * g.h * g.w * g.c), nw = (size_t)(g.kh * g.kw * g.c * g.f),
         nout = (size_t)(g.n * g.oh * g.ow * g.f), one = gs_cpu_dconv_pad_floats(&g, 1);
  cr_assert_gt(one, 0);
  float *in = malloc(nin * 4), *w = malloc(nw * 4), *b = malloc((size_t)g.f * 4),
        *dout = malloc(nout * 4), *ws = malloc(one * (size_t)g.n * 4);
  for (size_t i = 0; i < nin; i++)
    in[i] = frand();
  for (size_t i = 0; i < nw; i++)
    w[i] = frand();
  for (long i = 0; i < g.f; i++)
    b[i] = frand();
  for (size_t i = 0; i < nout; i++)
    dout[i] = frand();
  float *out[3], *dw[3];
  size_t room[3] = {one * (size_t)g.n, one * 2 + one / 2, one};
  for (int k = 0; k < 3; k++) {
    out[k] = malloc(nout * 4), dw[k] = calloc(nw, 4);
    cr_assert(gs_cpu_dconv_forward(EX, &g, in, w, b, true, out[k], ws, room[k]));
    cr_assert(gs_cpu_dconv_wgrad(EX, &g, in, dout, dw[k], ws, room[k]));
  }
  for (int k = 1; k < 3; k++) {
    char what[64];
    snprintf(what, sizeof what, "direct conv in chunks of %zu images", room[k] / one);
    expect_same(what, "out", level, out[0], out[k], nout * 4);
    expect_same(what, "dw", level, dw[0], dw[k], nw * 4);
  }
  cr_assert(!gs_cpu_dconv_forward(EX, &g, in, w, b, false, out[1], ws, one - 1),
            "a workspace short of one image's padded copy is refused");
  for (int k = 0; k < 3; k++)
    free(out[k]), free(dw[k]);
  free(in), free(w), free(b), free(dout), free(ws);
}

/* ---- pooling, relu, conversions, adam ---- */

Test(kernels_isa, pool_relu_same_bits_every_level, .init = setup, .fini = teardown) {
  gs_conv_shape s = {.n = 3, .h = 7, .w = 9, .c = 133, .kh = 3, .kw = 3, .stride = 2, .f = 133};
  gs_conv_shape_init(&s);
  size_t nin = (size_t)s.n * s.h * s.w * s.c, nout = (size_t)s.n * s.oh * s.ow * s.c,
         ngap = (size_t)s.n * s.c;
  float *tmp = malloc(nin * 4);
  for (size_t k = 0; k < sizeof DTS / sizeof DTS[0]; k++) {
    gs_dtype dt = DTS[k];
    size_t es = gs_dtype_size(dt);
    void *in = rand_dt(dt, nin, tmp), *dout = rand_dt(dt, nout, tmp);
    void *dgap = rand_dt(dt, ngap, tmp);
    void *base[5] = {0};
    size_t sz[5] = {nout * es, nin * es, ngap * es, nin * es, nin * es};
    for (int level = GS_CPU_ISA_BASELINE; level <= gs_cpu_isa_max(); level++) {
      cr_assert_eq(gs_cpu_isa_set(level), 0);
      void *got[5];
      for (int i = 0; i < 5; i++)
        got[i] = calloc(sz[i] + 1, 1);
      cr_assert_eq(B->maxpool_forward(EX, dt, got[0], in, &s), 0);
      cr_assert_eq(B->maxpool_backward(EX, dt, got[1], dout, in, &s), 0);
      cr_assert_eq(B->gap_forward(EX, dt, got[2], in, s.n, s.h, s.w, s.c), 0);
      cr_assert_eq(B->gap_backward(EX, dt, got[3], dgap, s.n, s.h, s.w, s.c), 0);
      cr_assert_eq(B->relu_forward(EX, dt, got[4], in, nin), 0);
      static const char *names[5] = {"maxpool out", "maxpool din", "gap out", "gap din", "relu"};
      for (int i = 0; i < 5; i++) {
        if (level == GS_CPU_ISA_BASELINE)
          base[i] = got[i];
        else {
          expect_same(names[i], gs_dtype_name(dt), level, base[i], got[i], sz[i]);
          free(got[i]);
        }
      }
    }
    for (int i = 0; i < 5; i++)
      free(base[i]);
    free(in), free(dout), free(dgap);
  }
  free(tmp);
}

/* conversions over bit patterns: every level gives the reference's bits
 * (dtype.c), NaN, inf and subnormals included; counts that leave every
 * vector tail */
Test(kernels_isa, conversions_same_bits_every_level, .init = setup, .fini = teardown) {
  const size_t n = 4099;
  float *f = malloc(n * 4), *back = malloc(n * 4);
  uint16_t *h = malloc(n * 2), *want = malloc(n * 2);
  for (size_t i = 0; i < n; i++) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    uint32_t x = (uint32_t)(rng >> 32);
    if (i % 5 == 1)
      x &= 0x807fffffu; /* subnormal */
    if (i % 7 == 2)
      x |= 0x7f800000u; /* inf or NaN */
    if (i % 3 == 0) /* near the fp16 range */
      x = (x & 0x80ffffffu) | (uint32_t)(0x30 + i % 32) << 23;
    memcpy(f + i, &x, 4);
  }
  for (int level = GS_CPU_ISA_BASELINE; level <= gs_cpu_isa_max(); level++) {
    cr_assert_eq(gs_cpu_isa_set(level), 0);
    for (size_t len = n - 19; len <= n; len += 3) {
      gs_cpu_store_f32(GS_F16, h, f, len);
      for (size_t i = 0; i < len; i++)
        cr_assert_eq(h[i], gs_f32_to_f16(f[i]), "%s fp16 store [%zu] of %zu",
                     gs_cpu_isa_name(level), i, len);
      gs_cpu_load_f32(GS_F16, h, back, len);
      for (size_t i = 0; i < len; i++) {
        float r = gs_f16_to_f32(h[i]);
        cr_assert(!memcmp(&r, back + i, 4), "%s fp16 load [%zu]", gs_cpu_isa_name(level), i);
      }
      gs_cpu_store_f32(GS_BF16, h, f, len);
      for (size_t i = 0; i < len; i++)
        cr_assert_eq(h[i], gs_f32_to_bf16(f[i]), "%s bf16 store [%zu]", gs_cpu_isa_name(level),
                     i);
      gs_cpu_load_f32(GS_BF16, h, back, len);
      for (size_t i = 0; i < len; i++) {
        float r = gs_bf16_to_f32(h[i]);
        cr_assert(!memcmp(&r, back + i, 4), "%s bf16 load [%zu]", gs_cpu_isa_name(level), i);
      }
    }
  }
  free(f), free(back), free(h), free(want);
}

Test(kernels_isa, adam_same_bits_every_level, .init = setup, .fini = teardown) {
  const size_t n = 70001;
  float *w0 = malloc(n * 4), *g0 = malloc(n * 4), *base = NULL;
  for (size_t i = 0; i < n; i++)
    w0[i] = frand(), g0[i] = frand() * 0.1f;
  for (int level = GS_CPU_ISA_BASELINE; level <= gs_cpu_isa_max(); level++) {
    cr_assert_eq(gs_cpu_isa_set(level), 0);
    float *w = malloc(n * 4), *g = malloc(n * 4), *m = calloc(n, 4), *v = calloc(n, 4);
    memcpy(w, w0, n * 4);
    for (uint64_t t = 1; t <= 3; t++) {
      memcpy(g, g0, n * 4);
      cr_assert_eq(B->adam_step(EX, w, g, m, v, n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, true, t,
                                NULL), 0);
    }
    if (!base)
      base = w;
    else {
      expect_same("adam", "w", level, base, w, n * 4);
      free(w);
    }
    free(g), free(m), free(v);
  }
  free(base), free(w0), free(g0);
}

/* GELU's own exponential is plain float arithmetic: every clone the same
 * bits, forward and backward, over the whole range and the non-finite */
Test(kernels_isa, gelu_same_bits_every_level, .init = setup, .fini = teardown) {
  const size_t n = 20011;
  float *x = malloc(n * 4), *d = malloc(n * 4), *base_y = NULL, *base_g = NULL;
  for (size_t i = 0; i < n; i++)
    x[i] = frand() * 12.0f, d[i] = frand();
  x[0] = -60.0f, x[1] = 60.0f, x[2] = NAN, x[3] = INFINITY, x[4] = -INFINITY, x[5] = 0.0f;
  for (int level = GS_CPU_ISA_BASELINE; level <= gs_cpu_isa_max(); level++) {
    cr_assert_eq(gs_cpu_isa_set(level), 0);
    float *y = malloc(n * 4), *g = malloc(n * 4);
    cr_assert_eq(B->gelu_forward(EX, GS_F32, y, x, n), 0);
    cr_assert_eq(B->gelu_backward(EX, GS_F32, g, d, x, n), 0);
    if (!base_y) {
      base_y = y, base_g = g;
      cr_expect(isnan(y[2]) && isnan(g[2]), "NaN in, NaN out");
      cr_expect(y[3] == INFINITY, "gelu(inf) = inf");
      cr_expect(y[1] == 60.0f && y[5] == 0.0f);
      cr_expect(y[0] <= 0.0f && y[0] > -1e-30f, "gelu(-60) = %g", (double)y[0]);
    } else {
      expect_same("gelu", "out", level, base_y, y, n * 4);
      expect_same("gelu", "din", level, base_g, g, n * 4);
      free(y), free(g);
    }
  }
  free(base_y), free(base_g), free(x), free(d);
}

/* GS_CPU_ISA is read once; gs_cpu_isa_set refuses what the CPU lacks */
Test(kernels_isa, levels, .init = setup, .fini = teardown) {
  int max = gs_cpu_isa_max();
  cr_assert(max >= GS_CPU_ISA_BASELINE && max < GS_CPU_ISA_LEVELS);
  cr_assert_eq(gs_cpu_isa_set(GS_CPU_ISA_LEVELS), -EINVAL);
  cr_assert_eq(gs_cpu_isa_set(-1), -EINVAL);
  if (max < GS_CPU_ISA_AVX512BF16)
    cr_assert_eq(gs_cpu_isa_set(max + 1), -EINVAL);
  cr_assert_eq(gs_cpu_isa_set(GS_CPU_ISA_BASELINE), 0);
  cr_assert_eq(gs_cpu_isa(), GS_CPU_ISA_BASELINE);
  cr_assert_str_eq(gs_cpu_isa_name(GS_CPU_ISA_AVX2), "avx2");
  cr_assert_str_eq(gs_cpu_isa_name(GS_CPU_ISA_AVX512BF16), "avx512bf16");
}
