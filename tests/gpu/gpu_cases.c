/*
 * gpu_cases.c: every op of the CUDA backend against the CPU backend (see
 * gpu_cases.h for how a case reports).
 *
 * Inputs are random values exactly representable in the storage type, so
 * both backends start from the same numbers; shapes are odd (unaligned
 * leading dimensions, stride 2 SAME and VALID, 1x1 and 5x5 windows) so the
 * GEMM plans meet unaligned operands and the window kernels meet padding.
 * Weight and bias gradients start from the same non-zero values on both
 * sides, so accumulation (+=) is checked, not just the sum.
 *
 * Tolerances, abs + |ref| * rel:
 *  - sums of K products (GEMMs, conv, depthwise): the two devices add in a
 *    different order (and the GPU fuses multiply-adds), so abs = K * 2^-20
 *    and rel = 2^-16 for fp32 results; a result stored in 16 bits may land
 *    one rounding step apart, so it adds eps(dt) to abs and rel = 2 eps(dt)
 *    (eps: 2^-10 for fp16, 2^-7 for bf16). Weight gradients are fp32 sums
 *    of exact products, so they take the fp32 pair with K the batch extent;
 *  - relu, casts, max pool forward, unscale and the loss-scale machine:
 *    bit for bit (max pool backward through 16 bits: the CPU rounds each
 *    overlapping window's addition, so eps(dt) abs and 2 eps(dt) rel);
 *  - global average pool: same order of additions, abs = HW * 2^-24;
 *  - cross-entropy: abs 1e-5 and rel 1e-5 for the loss (expf/logf differ in
 *    the last bit), rel 1e-5 for the gradient, argmax exact (ties too);
 *  - SGD/Adam: rel 1e-6, abs 1e-7 (fused multiply-adds);
 *  - add and accumulate: bit for bit;
 *  - embeddings: bit for bit (copies, one add, sums in token order);
 *    attention: see case_attention;
 *  - batch and layer norm: abs 1e-5 and rel 1e-5 for out in fp32 (the GPU
 *    sums fp32 runs where the CPU sums in double, and fuses multiply-adds),
 *    four times that for din (a difference of three terms), plus eps(dt)
 *    abs and 2 eps(dt) rel through 16 bits; mean, rstd and the running
 *    statistics 1e-6 abs and 1e-5 rel; dgamma and dbeta as weight gradients;
 *  - GELU: abs 1e-6 and rel 1e-5 (tanhf of two libraries), plus the 16-bit
 *    rounding step;
 *  - dropout: bit for bit (the same mask from the same hash, one multiply);
 *  - average pool: bit for bit (the same sums in the same order);
 *  - the 50-step MLP trajectory: fp32 losses within 1e-4 + 1e-3 |ref|,
 *    16-bit within 2e-2 + 2e-2 |ref| (rounding differences compound over
 *    steps), and the loss must fall on both devices.
 */
#include "tests/gpu/gpu_cases.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/loader.h"

/* ---- environment ---- */

int gs_gpu_env_open(gs_gpu_env *env) {
  memset(env, 0, sizeof *env);
  env->cpu = gs_backend_cpu();
  gs_exec_config ccfg = {.threads = 2, .device_index = 0};
  if (env->cpu->exec_create(env->cpu, &ccfg, &env->cex)) {
    snprintf(env->why, sizeof env->why, "cannot create a cpu exec");
    return -ENOMEM;
  }
  env->gpu = gs_backend_cuda_load(env->why, sizeof env->why);
  if (!env->gpu) {
    env->cpu->exec_destroy(env->cex);
    env->cex = NULL;
    return -ENODEV;
  }
  gs_exec_config gcfg = {.threads = 1, .device_index = 0};
  int rc = env->gpu->exec_create(env->gpu, &gcfg, &env->gex);
  if (rc) {
    snprintf(env->why, sizeof env->why, "cannot create an exec on GPU 0 (%d)", rc);
    env->cpu->exec_destroy(env->cex);
    env->cex = NULL;
    return -ENODEV;
  }
  return 0;
}

void gs_gpu_env_close(gs_gpu_env *env) {
  if (env->gex)
    env->gpu->exec_destroy(env->gex);
  if (env->cex)
    env->cpu->exec_destroy(env->cex);
  env->gex = env->cex = NULL;
}

/* ---- per-case context: host and device buffers, freed together ---- */

#define TC_MAX 160 /* buffers of one case, all its shapes together */

typedef struct tc {
  gs_gpu_env *e;
  void *dev[TC_MAX];
  size_t dbytes[TC_MAX];
  int nd;
  void *host[TC_MAX];
  int nh;
  int err;       /* first device error */
  int bad;       /* mismatching elements */
  char *msg;
  size_t len;
  gs_dtype dt;
} tc;

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float urand(void) { /* [-1, 1) */
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return (float)((double)(rng >> 11) * 0x1p-52 - 1.0);
}

static float round_dt(gs_dtype dt, float v) {
  if (dt == GS_F16)
    return gs_f16_to_f32(gs_f32_to_f16(v));
  if (dt == GS_BF16)
    return gs_bf16_to_f32(gs_f32_to_bf16(v));
  return v;
}

static double eps_dt(gs_dtype dt) {
  return dt == GS_F16 ? 0x1p-10 : dt == GS_BF16 ? 0x1p-7 : 0x1p-20;
}

static float get_dt(gs_dtype dt, const void *p, size_t i) {
  if (dt == GS_F32)
    return ((const float *)p)[i];
  if (dt == GS_F16)
    return gs_f16_to_f32(((const uint16_t *)p)[i]);
  return gs_bf16_to_f32(((const uint16_t *)p)[i]);
}

static void set_dt(gs_dtype dt, void *p, size_t i, float v) {
  if (dt == GS_F32)
    ((float *)p)[i] = v;
  else if (dt == GS_F16)
    ((uint16_t *)p)[i] = gs_f32_to_f16(v);
  else
    ((uint16_t *)p)[i] = gs_f32_to_bf16(v);
}

static void fail(tc *t, const char *fmt, ...) {
  t->bad++;
  if (t->bad > 1 || !t->msg || !t->len)
    return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(t->msg, t->len, fmt, ap);
  va_end(ap);
}

static void *halloc(tc *t, size_t bytes) {
  void *p = calloc(1, bytes ? bytes : 1);
  if (!p || t->nh == TC_MAX) {
    free(p);
    if (!t->err)
      t->err = -ENOMEM;
    return NULL;
  }
  t->host[t->nh++] = p;
  return p;
}

/* host array of count random dt-exact values in [-scale, scale) */
static void *hrand(tc *t, gs_dtype dt, size_t count, float scale) {
  void *p = halloc(t, count * gs_dtype_size(dt));
  if (p)
    for (size_t i = 0; i < count; i++)
      set_dt(dt, p, i, urand() * scale);
  return p;
}

/* a device copy of host (bytes), or an empty device buffer when host is NULL */
static void *dput(tc *t, const void *host, size_t bytes) {
  if (t->err || t->nd == TC_MAX) {
    if (!t->err)
      t->err = -ENOMEM;
    return NULL;
  }
  gs_backend *g = t->e->gpu;
  void *d = NULL;
  size_t rb = bytes ? bytes : 256;
  int rc = g->region_reserve(g, 0, rb, &d);
  if (!rc && host && bytes)
    rc = g->copy_in(t->e->gex, d, host, bytes);
  if (rc) {
    t->err = rc;
    return NULL;
  }
  t->dev[t->nd] = d;
  t->dbytes[t->nd++] = rb;
  return d;
}

/* host copy of a device buffer */
static void *dget(tc *t, const void *d, size_t bytes) {
  void *h = halloc(t, bytes);
  if (!h || t->err)
    return h;
  int rc = t->e->gpu->copy_out(t->e->gex, h, d, bytes);
  if (!rc)
    rc = t->e->gpu->synchronize(t->e->gex);
  if (rc)
    t->err = rc;
  return h;
}

static void *hdup(tc *t, const void *p, size_t bytes) {
  void *h = halloc(t, bytes);
  if (h && p)
    memcpy(h, p, bytes);
  return h;
}

static int tc_end(tc *t) {
  if (t->e->gex)
    t->e->gpu->synchronize(t->e->gex);
  for (int i = 0; i < t->nd; i++)
    t->e->gpu->region_release(t->e->gpu, 0, t->dev[i], t->dbytes[i]);
  for (int i = 0; i < t->nh; i++)
    free(t->host[i]);
  if (t->err) {
    if (t->msg && t->len && !t->bad)
      snprintf(t->msg, t->len, "a backend call failed (%d)", t->err);
    return t->err;
  }
  return t->bad;
}

static void tc_call(tc *t, const char *what, int rc) {
  if (rc && !t->err) {
    t->err = rc;
    if (t->msg && t->len)
      snprintf(t->msg, t->len, "%s returned %d", what, rc);
  }
}

/* compare count elements of dt (ref from the CPU, got from the GPU) */
static void cmp(tc *t, const char *what, gs_dtype dt, const void *ref, const void *got,
                size_t count, double atol, double rtol) {
  if (t->err || !ref || !got)
    return;
  for (size_t i = 0; i < count; i++) {
    double r = get_dt(dt, ref, i), g = get_dt(dt, got, i);
    double tol = atol + fabs(r) * rtol;
    bool ok = fabs(g - r) <= tol || (isnan(r) && isnan(g));
    if (!ok)
      fail(t, "%s %s[%zu]: gpu %.9g, cpu %.9g (tol %.3g)", gs_dtype_name(t->dt), what, i, g, r,
           tol);
  }
}

static void cmp_bits(tc *t, const char *what, const void *ref, const void *got, size_t bytes,
                     size_t esz) {
  if (t->err || !ref || !got)
    return;
  for (size_t i = 0; i < bytes / esz; i++)
    if (memcmp((const char *)ref + i * esz, (const char *)got + i * esz, esz)) {
      uint32_t r = 0, g = 0;
      memcpy(&r, (const char *)ref + i * esz, esz);
      memcpy(&g, (const char *)got + i * esz, esz);
      fail(t, "%s %s[%zu]: gpu bits 0x%x, cpu bits 0x%x", gs_dtype_name(t->dt), what, i, g, r);
    }
}

/* tolerance of a sum of k products stored in out_dt */
static void tol_sum(gs_dtype out_dt, size_t k, double *atol, double *rtol) {
  *atol = (double)k * 0x1p-20 + (out_dt == GS_F32 ? 0.0 : eps_dt(out_dt));
  *rtol = out_dt == GS_F32 ? 0x1p-16 : 2 * eps_dt(out_dt);
}

#define TC_BEGIN(env, dt_, msg_, len_)                                                            \
  tc T_ = {.e = (env), .msg = (msg_), .len = (len_), .dt = (dt_)};                                \
  tc *t = &T_;                                                                                    \
  gs_backend *C = t->e->cpu, *G = t->e->gpu;                                                      \
  gs_exec *CX = t->e->cex, *GX = t->e->gex;                                                       \
  if (msg_ && len_)                                                                               \
    msg_[0] = '\0'

/* ---- dense ---- */

/* bias_off: the bias vector starts that many elements into its buffer (an
 * unaligned bias takes the GEMM's no-epilogue path) */
static void dense_one(tc *t, gs_dtype dt, uint32_t n, uint32_t c, uint32_t oc,
                      uint32_t bias_off) {
  gs_backend *C = t->e->cpu, *G = t->e->gpu;
  gs_exec *CX = t->e->cex, *GX = t->e->gex;
  size_t es = gs_dtype_size(dt);
  void *x = hrand(t, dt, (size_t)n * c, 1), *w = hrand(t, dt, (size_t)c * oc, 1);
  void *b = hrand(t, dt, oc, 1), *dout = hrand(t, dt, (size_t)n * oc, 1);
  float *dw0 = hrand(t, GS_F32, (size_t)c * oc, 1), *db0 = hrand(t, GS_F32, oc, 1);
  size_t cws = C->dense_workspace(dt, n, c, oc), gws = G->dense_workspace(dt, n, c, oc);
  void *cw = halloc(t, cws), *out = halloc(t, (size_t)n * oc * es);
  void *out2 = halloc(t, (size_t)n * oc * es), *din = halloc(t, (size_t)n * c * es);
  float *dw = hdup(t, dw0, (size_t)c * oc * 4), *db = hdup(t, db0, (size_t)oc * 4);
  if (t->err)
    return;
  tc_call(t, "cpu dense_forward", C->dense_forward(CX, dt, out, x, w, b, n, c, oc, cw, false));
  /* out2: no bias, relu in the same op */
  tc_call(t, "cpu dense_forward", C->dense_forward(CX, dt, out2, x, w, NULL, n, c, oc, cw, true));
  tc_call(t, "cpu dense_backward",
          C->dense_backward(CX, dt, din, dw, db, dout, x, w, n, c, oc, cw));
  void *gx = dput(t, x, (size_t)n * c * es), *gw = dput(t, w, (size_t)c * oc * es);
  void *bpad = halloc(t, (size_t)(oc + bias_off) * es);
  if (bpad && b)
    memcpy((char *)bpad + (size_t)bias_off * es, b, (size_t)oc * es);
  void *gbpad = dput(t, bpad, (size_t)(oc + bias_off) * es);
  void *gb = gbpad ? (char *)gbpad + (size_t)bias_off * es : NULL;
  void *gdout = dput(t, dout, (size_t)n * oc * es);
  void *gout = dput(t, NULL, (size_t)n * oc * es), *gout2 = dput(t, NULL, (size_t)n * oc * es);
  void *gdin = dput(t, NULL, (size_t)n * c * es), *gwsp = dput(t, NULL, gws);
  float *gdw = dput(t, dw0, (size_t)c * oc * 4), *gdb = dput(t, db0, (size_t)oc * 4);
  if (t->err)
    return;
  tc_call(t, "gpu dense_forward", G->dense_forward(GX, dt, gout, gx, gw, gb, n, c, oc, gwsp, false));
  tc_call(t, "gpu dense_forward",
          G->dense_forward(GX, dt, gout2, gx, gw, NULL, n, c, oc, gwsp, true));
  tc_call(t, "gpu dense_backward",
          G->dense_backward(GX, dt, gdin, gdw, gdb, gdout, gx, gw, n, c, oc, gwsp));
  double a, r;
  tol_sum(dt, c, &a, &r);
  cmp(t, "dense out", dt, out, dget(t, gout, (size_t)n * oc * es), (size_t)n * oc, a, r);
  cmp(t, "dense out (no bias, relu)", dt, out2, dget(t, gout2, (size_t)n * oc * es), (size_t)n * oc, a,
      r);
  tol_sum(dt, oc, &a, &r);
  cmp(t, "dense din", dt, din, dget(t, gdin, (size_t)n * c * es), (size_t)n * c, a, r);
  tol_sum(GS_F32, n, &a, &r);
  cmp(t, "dense dw", GS_F32, dw, dget(t, gdw, (size_t)c * oc * 4), (size_t)c * oc, a, r);
  cmp(t, "dense db", GS_F32, db, dget(t, gdb, (size_t)oc * 4), oc, a, r);
}

static int case_dense(gs_gpu_env *env, gs_dtype dt, char *msg, size_t len) {
  TC_BEGIN(env, dt, msg, len);
  (void)C, (void)G, (void)CX, (void)GX;
  dense_one(t, dt, 37, 45, 29, 0); /* odd: unaligned rows */
  dense_one(t, dt, 64, 128, 96, 0);
  dense_one(t, dt, 1, 7, 3, 0);
  dense_one(t, dt, 64, 128, 96, 1); /* bias at 2 or 4 bytes past alignment */
  dense_one(t, dt, 3000, 33, 17, 0); /* many rows: db in chunks */
  return tc_end(t);
}

/* ---- conv2d and depthwise ---- */

static gs_conv_shape shape(uint32_t n, uint32_t h, uint32_t w, uint32_t c, uint32_t k,
                           uint32_t stride, bool same, uint32_t f) {
  gs_conv_shape s = {.n = n, .h = h, .w = w, .c = c, .kh = k, .kw = k, .stride = stride,
                     .same = same, .f = f};
  gs_conv_shape_init(&s);
  return s;
}

static void conv_one(tc *t, gs_dtype dt, gs_conv_shape s, bool depthwise) {
  gs_backend *C = t->e->cpu, *G = t->e->gpu;
  gs_exec *CX = t->e->cex, *GX = t->e->gex;
  size_t es = gs_dtype_size(dt);
  size_t nx = (size_t)s.n * s.h * s.w * s.c, ny = (size_t)s.n * s.oh * s.ow * s.f;
  size_t nw = depthwise ? (size_t)s.kh * s.kw * s.c : (size_t)s.kh * s.kw * s.c * s.f;
  size_t nb = s.f;
  void *x = hrand(t, dt, nx, 1), *w = hrand(t, dt, nw, 1), *b = hrand(t, dt, nb, 1);
  void *dout = hrand(t, dt, ny, 1);
  float *dw0 = hrand(t, GS_F32, nw, 1), *db0 = hrand(t, GS_F32, nb, 1);
  size_t cws = depthwise ? C->depthwise_workspace(dt, &s) : C->conv2d_workspace(dt, &s);
  size_t gws = depthwise ? G->depthwise_workspace(dt, &s) : G->conv2d_workspace(dt, &s);
  void *cw = halloc(t, cws), *out = halloc(t, ny * es), *din = halloc(t, nx * es);
  void *out2 = halloc(t, ny * es);
  float *dw = hdup(t, dw0, nw * 4), *db = hdup(t, db0, nb * 4);
  void *gx = dput(t, x, nx * es), *gw = dput(t, w, nw * es), *gb = dput(t, b, nb * es);
  void *gdout = dput(t, dout, ny * es), *gout = dput(t, NULL, ny * es);
  void *gout2 = dput(t, NULL, ny * es);
  void *gdin = dput(t, NULL, nx * es), *gwsp = gws ? dput(t, NULL, gws) : NULL;
  float *gdw = dput(t, dw0, nw * 4), *gdb = dput(t, db0, nb * 4);
  if (t->err)
    return;
  /* out2: the same forward with the layer's relu in the op */
  if (depthwise) {
    tc_call(t, "cpu depthwise_forward", C->depthwise_forward(CX, dt, out, x, w, b, &s, cw, false));
    tc_call(t, "cpu depthwise_forward", C->depthwise_forward(CX, dt, out2, x, w, b, &s, cw, true));
    tc_call(t, "cpu depthwise_backward",
            C->depthwise_backward(CX, dt, din, dw, db, dout, x, w, &s, cw));
    tc_call(t, "gpu depthwise_forward", G->depthwise_forward(GX, dt, gout, gx, gw, gb, &s, gwsp, false));
    tc_call(t, "gpu depthwise_forward",
            G->depthwise_forward(GX, dt, gout2, gx, gw, gb, &s, gwsp, true));
    tc_call(t, "gpu depthwise_backward",
            G->depthwise_backward(GX, dt, gdin, gdw, gdb, gdout, gx, gw, &s, gwsp));
  } else {
    tc_call(t, "cpu conv2d_forward", C->conv2d_forward(CX, dt, out, x, w, b, &s, cw, false));
    tc_call(t, "cpu conv2d_forward", C->conv2d_forward(CX, dt, out2, x, w, b, &s, cw, true));
    tc_call(t, "cpu conv2d_backward",
            C->conv2d_backward(CX, dt, din, dw, db, dout, x, w, &s, cw));
    tc_call(t, "gpu conv2d_forward", G->conv2d_forward(GX, dt, gout, gx, gw, gb, &s, gwsp, false));
    tc_call(t, "gpu conv2d_forward", G->conv2d_forward(GX, dt, gout2, gx, gw, gb, &s, gwsp, true));
    tc_call(t, "gpu conv2d_backward",
            G->conv2d_backward(GX, dt, gdin, gdw, gdb, gdout, gx, gw, &s, gwsp));
  }
  const char *nm = depthwise ? "depthwise" : "conv2d";
  char what[64];
  size_t taps = (size_t)s.kh * s.kw;
  double a, r;
  tol_sum(dt, depthwise ? taps : taps * s.c, &a, &r);
  snprintf(what, sizeof what, "%s out", nm);
  cmp(t, what, dt, out, dget(t, gout, ny * es), ny, a, r);
  snprintf(what, sizeof what, "%s out (relu)", nm);
  cmp(t, what, dt, out2, dget(t, gout2, ny * es), ny, a, r);
  tol_sum(dt, depthwise ? taps : taps * s.f, &a, &r);
  snprintf(what, sizeof what, "%s din", nm);
  cmp(t, what, dt, din, dget(t, gdin, nx * es), nx, a, r);
  tol_sum(GS_F32, (size_t)s.n * s.oh * s.ow, &a, &r);
  snprintf(what, sizeof what, "%s dw", nm);
  cmp(t, what, GS_F32, dw, dget(t, gdw, nw * 4), nw, a, r);
  snprintf(what, sizeof what, "%s db", nm);
  cmp(t, what, GS_F32, db, dget(t, gdb, nb * 4), nb, a, r);
}

static int case_conv2d(gs_gpu_env *env, gs_dtype dt, char *msg, size_t len) {
  TC_BEGIN(env, dt, msg, len);
  (void)C, (void)G, (void)CX, (void)GX;
  conv_one(t, dt, shape(2, 9, 7, 3, 3, 1, true, 8), false);
  conv_one(t, dt, shape(3, 8, 8, 5, 3, 2, false, 6), false);
  conv_one(t, dt, shape(2, 6, 5, 16, 1, 1, true, 12), false); /* pointwise */
  conv_one(t, dt, shape(1, 11, 10, 4, 5, 2, true, 7), false);
  /* one image's im2col (127*127 rows of 3*3*64, as fp32) is past half the
   * GPU's 64 MiB chunk: two chunks, the second's out and dout at an odd
   * offset (other GEMM plans), and a bias gradient over 32258 rows */
  conv_one(t, dt, shape(2, 127, 127, 64, 3, 1, true, 7), false);
  return tc_end(t);
}

static int case_depthwise(gs_gpu_env *env, gs_dtype dt, char *msg, size_t len) {
  TC_BEGIN(env, dt, msg, len);
  (void)C, (void)G, (void)CX, (void)GX;
  conv_one(t, dt, shape(2, 9, 7, 13, 3, 1, true, 13), true);
  conv_one(t, dt, shape(2, 10, 9, 40, 5, 2, true, 40), true);
  conv_one(t, dt, shape(3, 8, 8, 8, 3, 2, false, 8), true);
  /* 3136 positions: the weight gradient in 25 chunks through the
   * workspace, 33 channels over two blocks of 32 */
  conv_one(t, dt, shape(4, 28, 28, 33, 3, 1, true, 33), true);
  return tc_end(t);
}

/* ---- pools ---- */

static void maxpool_one(tc *t, gs_dtype dt, gs_conv_shape s) {
  gs_backend *C = t->e->cpu, *G = t->e->gpu;
  gs_exec *CX = t->e->cex, *GX = t->e->gex;
  gs_conv_shape v = s;
  v.same = false;
  gs_conv_shape_init(&v);
  size_t es = gs_dtype_size(dt), nx = (size_t)s.n * s.h * s.w * s.c;
  size_t ny = (size_t)v.n * v.oh * v.ow * v.c;
  void *x = halloc(t, nx * es);
  if (!x)
    return;
  for (size_t i = 0; i < nx; i++) /* few levels: many ties, the first maximum matters */
    set_dt(dt, x, i, floorf(urand() * 4.0f) / 4.0f);
  void *dout = hrand(t, dt, ny, 1), *out = halloc(t, ny * es), *din = halloc(t, nx * es);
  void *gx = dput(t, x, nx * es), *gdout = dput(t, dout, ny * es);
  void *gout = dput(t, NULL, ny * es), *gdin = dput(t, NULL, nx * es);
  if (t->err)
    return;
  tc_call(t, "cpu maxpool_forward", C->maxpool_forward(CX, dt, out, x, &s));
  tc_call(t, "cpu maxpool_backward", C->maxpool_backward(CX, dt, din, dout, x, &s));
  tc_call(t, "gpu maxpool_forward", G->maxpool_forward(GX, dt, gout, gx, &s));
  tc_call(t, "gpu maxpool_backward", G->maxpool_backward(GX, dt, gdin, gdout, gx, &s));
  cmp_bits(t, "maxpool out", out, dget(t, gout, ny * es), ny * es, es);
  cmp(t, "maxpool din", dt, din, dget(t, gdin, nx * es), nx, dt == GS_F32 ? 0.0 : eps_dt(dt),
      dt == GS_F32 ? 0.0 : 2 * eps_dt(dt));
}

static int case_maxpool(gs_gpu_env *env, gs_dtype dt, char *msg, size_t len) {
  TC_BEGIN(env, dt, msg, len);
  (void)C, (void)G, (void)CX, (void)GX;
  maxpool_one(t, dt, shape(2, 8, 8, 5, 2, 2, false, 5));
  maxpool_one(t, dt, shape(2, 9, 9, 3, 3, 2, true, 3)); /* overlapping; same is ignored */
  maxpool_one(t, dt, shape(1, 7, 6, 33, 3, 1, false, 33));
  return tc_end(t);
}

static void gap_one(tc *t, gs_dtype dt, uint32_t n, uint32_t h, uint32_t w, uint32_t c) {
  gs_backend *C = t->e->cpu, *G = t->e->gpu;
  gs_exec *CX = t->e->cex, *GX = t->e->gex;
  size_t es = gs_dtype_size(dt), nx = (size_t)n * h * w * c, ny = (size_t)n * c;
  void *x = hrand(t, dt, nx, 1), *dout = hrand(t, dt, ny, 1);
  void *out = halloc(t, ny * es), *din = halloc(t, nx * es);
  void *gx = dput(t, x, nx * es), *gdout = dput(t, dout, ny * es);
  void *gout = dput(t, NULL, ny * es), *gdin = dput(t, NULL, nx * es);
  if (t->err)
    return;
  tc_call(t, "cpu gap_forward", C->gap_forward(CX, dt, out, x, n, h, w, c));
  tc_call(t, "cpu gap_backward", C->gap_backward(CX, dt, din, dout, n, h, w, c));
  tc_call(t, "gpu gap_forward", G->gap_forward(GX, dt, gout, gx, n, h, w, c));
  tc_call(t, "gpu gap_backward", G->gap_backward(GX, dt, gdin, gdout, n, h, w, c));
  double a = (double)h * w * 0x1p-24;
  cmp(t, "gap out", dt, out, dget(t, gout, ny * es), ny, a, 0x1p-22);
  cmp(t, "gap din", dt, din, dget(t, gdin, nx * es), nx, 0x1p-24, 0x1p-22);
}

static int case_gap(gs_gpu_env *env, gs_dtype dt, char *msg, size_t len) {
  TC_BEGIN(env, dt, msg, len);
  (void)C, (void)G, (void)CX, (void)GX;
  gap_one(t, dt, 3, 5, 7, 19);
  gap_one(t, dt, 2, 1, 1, 64);
  gap_one(t, dt, 4, 14, 14, 40);
  return tc_end(t);
}

/* ---- relu ---- */

static int case_relu(gs_gpu_env *env, gs_dtype dt, char *msg, size_t len) {
  TC_BEGIN(env, dt, msg, len);
  size_t n = 4099, es = gs_dtype_size(dt);
  void *x = hrand(t, dt, n, 2);
  void *dout = hrand(t, dt, n, 1);
  if (!x || !dout)
    return tc_end(t);
  const float specials[] = {NAN, -NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1e-40f, -1e-40f,
                            6e-8f, -6e-8f, 65504.0f, -65504.0f};
  for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++)
    set_dt(dt, x, i * 7, specials[i]);
  void *out = halloc(t, n * es), *din = halloc(t, n * es);
  void *gx = dput(t, x, n * es), *gdout = dput(t, dout, n * es), *gout = dput(t, NULL, n * es);
  void *gdin = dput(t, NULL, n * es);
  if (t->err)
    return tc_end(t);
  tc_call(t, "cpu relu_forward", C->relu_forward(CX, dt, out, x, n));
  tc_call(t, "cpu relu_backward", C->relu_backward(CX, dt, din, dout, out, n));
  tc_call(t, "gpu relu_forward", G->relu_forward(GX, dt, gout, gx, n));
  tc_call(t, "gpu relu_backward", G->relu_backward(GX, dt, gdin, gdout, gout, n));
  cmp_bits(t, "relu out", out, dget(t, gout, n * es), n * es, es);
  cmp_bits(t, "relu din", din, dget(t, gdin, n * es), n * es, es);
  /* in place (out aliases in, din aliases dout), as the runtime calls it */
  tc_call(t, "gpu relu_forward (in place)", G->relu_forward(GX, dt, gx, gx, n));
  tc_call(t, "gpu relu_backward (in place)", G->relu_backward(GX, dt, gdout, gdout, gx, n));
  cmp_bits(t, "relu out (in place)", out, dget(t, gx, n * es), n * es, es);
  cmp_bits(t, "relu din (in place)", din, dget(t, gdout, n * es), n * es, es);
  return tc_end(t);
}

/* ---- softmax cross-entropy ---- */

static void xent_one(tc *t, uint32_t n, uint32_t k) {
  gs_backend *C = t->e->cpu, *G = t->e->gpu;
  gs_exec *CX = t->e->cex, *GX = t->e->gex;
  float *x = hrand(t, GS_F32, (size_t)n * k, 8);
  int32_t *lab = halloc(t, n * 4u);
  if (!x || !lab)
    return;
  for (uint32_t i = 0; i < n; i++) {
    urand();
    lab[i] = (int32_t)((rng >> 17) % k);
  }
  for (uint32_t j = 0; j < k; j++) /* row 0: all equal, argmax is 0 */
    x[j] = 0.5f;
  if (n > 1 && k > 3) { /* row 1: a tie for the maximum at 1 and k-1 */
    x[k + 1] = 20.0f;
    x[k + k - 1] = 20.0f;
  }
  float scale = 4.0f, norm = (float)n;
  float *loss = halloc(t, n * 4u), *dl = halloc(t, (size_t)n * k * 4);
  int32_t *pred = halloc(t, n * 4u);
  float *gx = dput(t, x, (size_t)n * k * 4), *gscale = dput(t, &scale, 4);
  int32_t *glab = dput(t, lab, n * 4u), *gpred = dput(t, NULL, n * 4u);
  float *gloss = dput(t, NULL, n * 4u), *gdl = dput(t, NULL, (size_t)n * k * 4);
  if (t->err)
    return;
  tc_call(t, "cpu xent", C->xent_forward_backward(CX, loss, pred, dl, x, lab, n, k, &scale, norm));
  tc_call(t, "gpu xent",
          G->xent_forward_backward(GX, gloss, gpred, gdl, gx, glab, n, k, gscale, norm));
  cmp(t, "xent loss", GS_F32, loss, dget(t, gloss, n * 4u), n, 1e-5, 1e-5);
  cmp_bits(t, "xent pred", pred, dget(t, gpred, n * 4u), n * 4u, 4);
  cmp(t, "xent dlogits", GS_F32, dl, dget(t, gdl, (size_t)n * k * 4), (size_t)n * k, 1e-7, 1e-5);
  /* without pred and dlogits, and with no grad_scale */
  tc_call(t, "cpu xent (loss only)",
          C->xent_forward_backward(CX, loss, NULL, NULL, x, lab, n, k, NULL, norm));
  tc_call(t, "gpu xent (loss only)",
          G->xent_forward_backward(GX, gloss, NULL, NULL, gx, glab, n, k, NULL, norm));
  cmp(t, "xent loss (loss only)", GS_F32, loss, dget(t, gloss, n * 4u), n, 1e-5, 1e-5);
}

static int case_xent(gs_gpu_env *env, gs_dtype dt, char *msg, size_t len) {
  TC_BEGIN(env, dt, msg, len);
  (void)C, (void)G, (void)CX, (void)GX;
  xent_one(t, 37, 10);
  xent_one(t, 5, 1000);
  xent_one(t, 300, 3);
  return tc_end(t);
}

/* ---- casts ---- */

static int case_cast(gs_gpu_env *env, gs_dtype dt, char *msg, size_t len) {
  TC_BEGIN(env, dt, msg, len);
  enum { N = 1031 };
  float *f = halloc(t, N * 4);
  if (!f)
    return tc_end(t);
  for (int i = 0; i < N; i++) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    uint32_t bits = (uint32_t)(rng >> 32);
    if (i % 4 == 1) /* near the fp16 range, subnormals included */
      bits = (bits & 0x87ffffffu) | 0x30000000u;
    memcpy(&f[i], &bits, 4);
  }
  f[0] = NAN, f[1] = INFINITY, f[2] = -0.0f, f[3] = 65520.0f, f[5] = 0x1p-25f, f[6] = -NAN;
  const gs_dtype all[3] = {GS_F32, GS_F16, GS_BF16};
  for (int s = 0; s < 3; s++) {
    /* the source: f as that type (through the CPU's own cast) */
    void *src = halloc(t, N * gs_dtype_size(all[s]));
    if (!src)
      break;
    tc_call(t, "cpu cast", C->cast(CX, src, all[s], f, GS_F32, N));
    void *gsrc = dput(t, src, N * gs_dtype_size(all[s]));
    for (int d = 0; d < 3 && !t->err; d++) {
      size_t db = N * gs_dtype_size(all[d]);
      void *ref = halloc(t, db), *gdst = dput(t, NULL, db);
      if (t->err)
        break;
      tc_call(t, "cpu cast", C->cast(CX, ref, all[d], src, all[s], N));
      tc_call(t, "gpu cast", G->cast(GX, gdst, all[d], gsrc, all[s], N));
      char what[64];
      snprintf(what, sizeof what, "cast %s->%s", gs_dtype_name(all[s]), gs_dtype_name(all[d]));
      cmp_bits(t, what, ref, dget(t, gdst, db), db, gs_dtype_size(all[d]));
    }
  }
  return tc_end(t);
}

/* A same-type cast over overlapping ranges moves, as memmove does (the cpu
 * backend's is one): shifted up and down by less than the count, and by a
 * few bytes, so the chunked copy runs many chunks both ways. */
static int case_cast_overlap(gs_gpu_env *env, gs_dtype dt, char *msg, size_t len) {
  TC_BEGIN(env, dt, msg, len);
  enum { N = 4099 };
  size_t es = gs_dtype_size(dt);
  const long shifts[] = {3, -3, 1000, -1000, 1, -1};
  for (size_t k = 0; k < sizeof shifts / sizeof shifts[0] && !t->err; k++) {
    uint8_t *h = halloc(t, N * es);
    if (!h)
      break;
    for (size_t i = 0; i < N * es; i++) h[i] = (uint8_t)(i * 131 + k);
    void *g = dput(t, h, N * es);
    size_t count = N - 1000;
    long s = shifts[k];
    size_t from = s > 0 ? 0 : (size_t)-s, to = s > 0 ? (size_t)s : 0;
    tc_call(t, "cpu cast", C->cast(CX, h + to * es, dt, h + from * es, dt, count));
    tc_call(t, "gpu cast", G->cast(GX, (uint8_t *)g + to * es, dt, (uint8_t *)g + from * es, dt,
                                   count));
    char what[64];
    snprintf(what, sizeof what, "overlapping %s cast by %ld", gs_dtype_name(dt), s);
    cmp_bits(t, what, h, dget(t, g, N * es), N * es, es);
  }
  return tc_end(t);
}

/* ---- mixed precision bookkeeping ---- */

static int case_unscale(gs_gpu_env *env, gs_dtype dt, char *msg, size_t len) {
  TC_BEGIN(env, dt, msg, len);
  size_t n = (1u << 20) + 17;
  float *g = hrand(t, GS_F32, n, 1000), scale = 512.0f;
  int32_t found = 0, zero = 0;
  if (!g)
    return tc_end(t);
  float *gg = dput(t, g, n * 4), *gscale = dput(t, &scale, 4);
  int32_t *gfound = dput(t, &zero, 4);
  if (t->err)
    return tc_end(t);
  tc_call(t, "cpu unscale_check", C->unscale_check(CX, g, n, &scale, &found));
  tc_call(t, "gpu unscale_check", G->unscale_check(GX, gg, n, gscale, gfound));
  cmp_bits(t, "unscale g", g, dget(t, gg, n * 4), n * 4, 4);
  cmp_bits(t, "unscale found_inf (finite)", &found, dget(t, gfound, 4), 4, 4);
  g[n - 1] = INFINITY; /* the last element, in the grid-stride tail */
  float *gg2 = dput(t, g, n * 4);
  if (t->err)
    return tc_end(t);
  tc_call(t, "cpu unscale_check", C->unscale_check(CX, g, n, &scale, &found));
  tc_call(t, "gpu unscale_check", G->unscale_check(GX, gg2, n, gscale, gfound));
  int32_t *got = dget(t, gfound, 4);
  if (got && (found != 1 || *got != 1))
    fail(t, "unscale found_inf: gpu %d, cpu %d, want 1", *got, found);
  return tc_end(t);
}

typedef struct ls_state {
  float scale;
  int32_t good, found;
  int32_t pad;
  int64_t skipped;
} ls_state;

static int case_loss_scale(gs_gpu_env *env, gs_dtype dt, char *msg, size_t len) {
  TC_BEGIN(env, dt, msg, len);
  ls_state c = {.scale = 3.0f, .good = 1}, *gs = dput(t, &c, sizeof c);
  if (t->err)
    return tc_end(t);
  /* overflow steps halve (not below 1) and count; 3 finite ones double */
  const int32_t pattern[] = {1, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0, 1};
  for (size_t i = 0; i < sizeof pattern / sizeof pattern[0] && !t->err; i++) {
    c.found = pattern[i];
    tc_call(t, "gpu copy_in", G->copy_in(GX, &gs->found, &pattern[i], 4));
    tc_call(t, "cpu loss_scale_update",
            C->loss_scale_update(CX, &c.scale, &c.good, &c.found, &c.skipped, 3));
    tc_call(t, "gpu loss_scale_update",
            G->loss_scale_update(GX, &gs->scale, &gs->good, &gs->found, &gs->skipped, 3));
    ls_state *g = dget(t, gs, sizeof c);
    if (g && (g->scale != c.scale || g->good != c.good || g->found != c.found ||
              g->skipped != c.skipped))
      fail(t, "loss_scale step %zu: gpu scale %g good %d found %d skipped %lld, cpu %g %d %d %lld",
           i, g->scale, g->good, g->found, (long long)g->skipped, c.scale, c.good, c.found,
           (long long)c.skipped);
  }
  /* growth stops at GS_LOSS_SCALE_MAX on both */
  c = (ls_state){.scale = GS_LOSS_SCALE_MAX * 0.75f, .good = 2};
  tc_call(t, "gpu copy_in", G->copy_in(GX, gs, &c, sizeof c));
  for (int i = 0; i < 3 && !t->err; i++) {
    tc_call(t, "cpu loss_scale_update",
            C->loss_scale_update(CX, &c.scale, &c.good, &c.found, &c.skipped, 3));
    tc_call(t, "gpu loss_scale_update",
            G->loss_scale_update(GX, &gs->scale, &gs->good, &gs->found, &gs->skipped, 3));
  }
  ls_state *g = dget(t, gs, sizeof c);
  if (g && (c.scale != GS_LOSS_SCALE_MAX || g->scale != c.scale))
    fail(t, "loss_scale at its maximum: gpu %g, cpu %g, want %g", g ? g->scale : 0.0, c.scale,
         GS_LOSS_SCALE_MAX);
  return tc_end(t);
}

/* ---- optimizers ---- */

static int case_sgd(gs_gpu_env *env, gs_dtype dt, char *msg, size_t len) {
  TC_BEGIN(env, dt, msg, len);
  size_t n = 100003;
  float *w = hrand(t, GS_F32, n, 1), *g0 = hrand(t, GS_F32, n, 1), *m = hrand(t, GS_F32, n, 1);
  float *g = halloc(t, n * 4), *zeros = halloc(t, n * 4);
  int32_t one = 1, zero = 0;
  float *gw = dput(t, w, n * 4), *gg = dput(t, g0, n * 4), *gm = dput(t, m, n * 4);
  int32_t *gone = dput(t, &one, 4), *gzero = dput(t, &zero, 4);
  if (t->err)
    return tc_end(t);
  /* each step consumes (zeroes) its gradient: both sides start from g0 */
  for (int nesterov = 0; nesterov < 3; nesterov++) {
    bool mom = nesterov < 2;
    memcpy(g, g0, n * 4);
    tc_call(t, "gpu g", G->copy_in(GX, gg, g0, n * 4));
    tc_call(t, "cpu sgd", C->sgd_step(CX, w, g, mom ? m : NULL, n, mom ? 0.1f : 0.05f,
                                      mom ? 0.9f : 0.0f, nesterov == 1, mom ? 0.01f : 0.0f,
                                      NULL));
    tc_call(t, "gpu sgd", G->sgd_step(GX, gw, gg, mom ? gm : NULL, n, mom ? 0.1f : 0.05f,
                                      mom ? 0.9f : 0.0f, nesterov == 1, mom ? 0.01f : 0.0f,
                                      mom ? gzero : NULL));
    cmp_bits(t, "sgd g consumed (cpu)", zeros, g, n * 4, 4);
    cmp_bits(t, "sgd g consumed (gpu)", zeros, dget(t, gg, n * 4), n * 4, 4);
  }
  /* skip: nothing moves, and the gradient is still consumed */
  tc_call(t, "gpu g", G->copy_in(GX, gg, g0, n * 4));
  tc_call(t, "gpu sgd (skip)", G->sgd_step(GX, gw, gg, gm, n, 0.1f, 0.9f, false, 0.01f, gone));
  cmp(t, "sgd w", GS_F32, w, dget(t, gw, n * 4), n, 1e-7, 1e-6);
  cmp(t, "sgd m", GS_F32, m, dget(t, gm, n * 4), n, 1e-7, 1e-6);
  cmp_bits(t, "sgd g consumed by a skipped step", zeros, dget(t, gg, n * 4), n * 4, 4);
  return tc_end(t);
}

static int case_adam(gs_gpu_env *env, gs_dtype dt, char *msg, size_t len) {
  TC_BEGIN(env, dt, msg, len);
  size_t n = 100003;
  float *w = hrand(t, GS_F32, n, 1), *g0 = hrand(t, GS_F32, n, 1), *m = hrand(t, GS_F32, n, 0.1f);
  float *v = halloc(t, n * 4), *g = halloc(t, n * 4), *zeros = halloc(t, n * 4);
  int32_t one = 1;
  if (!v || !g || !zeros)
    return tc_end(t);
  for (size_t i = 0; i < n; i++)
    v[i] = fabsf(urand()) * 0.01f;
  float *gw = dput(t, w, n * 4), *gg = dput(t, g0, n * 4), *gm = dput(t, m, n * 4);
  float *gv = dput(t, v, n * 4);
  int32_t *gone = dput(t, &one, 4);
  if (t->err)
    return tc_end(t);
  /* each step consumes (zeroes) its gradient: both sides start from g0 */
  for (int dec = 0; dec < 2; dec++) {
    memcpy(g, g0, n * 4);
    tc_call(t, "gpu g", G->copy_in(GX, gg, g0, n * 4));
    tc_call(t, "cpu adam",
            C->adam_step(CX, w, g, m, v, n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, dec, 3 + dec, NULL));
    tc_call(t, "gpu adam", G->adam_step(GX, gw, gg, gm, gv, n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f,
                                        dec, 3 + dec, NULL));
    cmp_bits(t, "adam g consumed (cpu)", zeros, g, n * 4, 4);
    cmp_bits(t, "adam g consumed (gpu)", zeros, dget(t, gg, n * 4), n * 4, 4);
  }
  tc_call(t, "gpu g", G->copy_in(GX, gg, g0, n * 4));
  tc_call(t, "gpu adam (skip)",
          G->adam_step(GX, gw, gg, gm, gv, n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.1f, false, 5, gone));
  cmp(t, "adam w", GS_F32, w, dget(t, gw, n * 4), n, 1e-7, 1e-6);
  cmp(t, "adam m", GS_F32, m, dget(t, gm, n * 4), n, 1e-7, 1e-6);
  cmp(t, "adam v", GS_F32, v, dget(t, gv, n * 4), n, 1e-9, 1e-6);
  cmp_bits(t, "adam g consumed by a skipped step", zeros, dget(t, gg, n * 4), n * 4, 4);
  return tc_end(t);
}

/* ---- the MLP trajectory ---- */

enum { MLP_N = 64, MLP_C = 96, MLP_H = 128, MLP_K = 10 };

typedef struct mlp_bufs {
  float *x32, *w1, *b1, *w2, *b2, *gw1, *gb1, *gw2, *gb2, *mw1, *mb1, *mw2, *mb2;
  float *logits, *dlog, *loss, *scale;
  int32_t *labels, *good, *found;
  int64_t *skipped;
  void *x, *w1d, *b1d, *w2d, *b2d, *h1, *lgd, *dlgd, *dh1, *ws;
} mlp_bufs;

static size_t mlp_ws(gs_backend *b, gs_dtype dt) {
  size_t a = b->dense_workspace(dt, MLP_N, MLP_C, MLP_H);
  size_t c = b->dense_workspace(dt, MLP_N, MLP_H, MLP_K);
  return a > c ? a : c;
}

/* carve the buffers out of base (NULL: just count); returns the bytes */
static size_t mlp_carve(gs_backend *b, gs_dtype dt, char *base, mlp_bufs *m) {
  size_t at = 0, es = gs_dtype_size(dt);
#define MLP_TAKE(field, bytes)                                                                    \
  do {                                                                                            \
    if (base)                                                                                     \
      m->field = (void *)(base + at);                                                             \
    at += ((size_t)(bytes) + 255) & ~(size_t)255;                                                 \
  } while (0)
  MLP_TAKE(x32, MLP_N * MLP_C * 4);
  MLP_TAKE(w1, MLP_C * MLP_H * 4);
  MLP_TAKE(b1, MLP_H * 4);
  MLP_TAKE(w2, MLP_H * MLP_K * 4);
  MLP_TAKE(b2, MLP_K * 4);
  MLP_TAKE(gw1, MLP_C * MLP_H * 4);
  MLP_TAKE(gb1, MLP_H * 4);
  MLP_TAKE(gw2, MLP_H * MLP_K * 4);
  MLP_TAKE(gb2, MLP_K * 4);
  MLP_TAKE(mw1, MLP_C * MLP_H * 4);
  MLP_TAKE(mb1, MLP_H * 4);
  MLP_TAKE(mw2, MLP_H * MLP_K * 4);
  MLP_TAKE(mb2, MLP_K * 4);
  MLP_TAKE(logits, MLP_N * MLP_K * 4);
  MLP_TAKE(dlog, MLP_N * MLP_K * 4);
  MLP_TAKE(loss, MLP_N * 4);
  MLP_TAKE(scale, 4);
  MLP_TAKE(labels, MLP_N * 4);
  MLP_TAKE(good, 4);
  MLP_TAKE(found, 4);
  MLP_TAKE(skipped, 8);
  MLP_TAKE(x, MLP_N * MLP_C * es);
  MLP_TAKE(w1d, MLP_C * MLP_H * es);
  MLP_TAKE(b1d, MLP_H * es);
  MLP_TAKE(w2d, MLP_H * MLP_K * es);
  MLP_TAKE(b2d, MLP_K * es);
  MLP_TAKE(h1, MLP_N * MLP_H * es);
  MLP_TAKE(lgd, MLP_N * MLP_K * es);
  MLP_TAKE(dlgd, MLP_N * MLP_K * es);
  MLP_TAKE(dh1, MLP_N * MLP_H * es);
  MLP_TAKE(ws, mlp_ws(b, dt));
#undef MLP_TAKE
  return at;
}

size_t gs_gpu_mlp_bytes(gs_backend *b, gs_dtype dt) { return mlp_carve(b, dt, NULL, NULL); }

#define MLP_OP(call)                                                                              \
  do {                                                                                            \
    if ((rc = (call)))                                                                            \
      goto done;                                                                                  \
  } while (0)

int gs_gpu_mlp_train(gs_backend *b, gs_exec *ex, gs_dtype dt, int steps, gs_gpu_alloc_fn alloc,
                     void *u, float *losses) {
  mlp_bufs m;
  memset(&m, 0, sizeof m);
  char *base = alloc(u, gs_gpu_mlp_bytes(b, dt));
  if (!base)
    return -ENOMEM;
  mlp_carve(b, dt, base, &m);
  int rc = 0;
  /* host side: data, labels (argmax of the first 10 inputs), Glorot weights */
  uint64_t s = 12345;
#define MLP_RAND() (s ^= s << 13, s ^= s >> 7, s ^= s << 17, (float)((double)(s >> 11) * 0x1p-52 - 1.0))
  float *hx = malloc(MLP_N * MLP_C * 4), *hw1 = malloc(MLP_C * MLP_H * 4);
  float *hw2 = malloc(MLP_H * MLP_K * 4), *hl = malloc(MLP_N * 4);
  int32_t *hlab = malloc(MLP_N * 4);
  if (!hx || !hw1 || !hw2 || !hl || !hlab) {
    rc = -ENOMEM;
    goto done;
  }
  for (int i = 0; i < MLP_N * MLP_C; i++)
    hx[i] = round_dt(dt, MLP_RAND());
  for (int i = 0; i < MLP_N; i++) {
    int arg = 0;
    for (int j = 1; j < MLP_K; j++)
      if (hx[i * MLP_C + j] > hx[i * MLP_C + arg])
        arg = j;
    hlab[i] = arg;
  }
  float g1 = sqrtf(6.0f / (MLP_C + MLP_H)), g2 = sqrtf(6.0f / (MLP_H + MLP_K));
  for (int i = 0; i < MLP_C * MLP_H; i++)
    hw1[i] = MLP_RAND() * g1;
  for (int i = 0; i < MLP_H * MLP_K; i++)
    hw2[i] = MLP_RAND() * g2;
#undef MLP_RAND
  bool fp16 = dt == GS_F16;
  float scale0 = fp16 ? 32768.0f : 1.0f;
  int64_t zero64 = 0;
  MLP_OP(b->copy_in(ex, m.x32, hx, MLP_N * MLP_C * 4));
  MLP_OP(b->copy_in(ex, m.labels, hlab, MLP_N * 4));
  MLP_OP(b->copy_in(ex, m.w1, hw1, MLP_C * MLP_H * 4));
  MLP_OP(b->copy_in(ex, m.w2, hw2, MLP_H * MLP_K * 4));
  MLP_OP(b->copy_in(ex, m.scale, &scale0, 4));
  MLP_OP(b->copy_in(ex, m.skipped, &zero64, 8));
  MLP_OP(b->zero(ex, m.b1, MLP_H * 4));
  MLP_OP(b->zero(ex, m.b2, MLP_K * 4));
  MLP_OP(b->zero(ex, m.mw1, MLP_C * MLP_H * 4));
  MLP_OP(b->zero(ex, m.mb1, MLP_H * 4));
  MLP_OP(b->zero(ex, m.mw2, MLP_H * MLP_K * 4));
  MLP_OP(b->zero(ex, m.mb2, MLP_K * 4));
  MLP_OP(b->zero(ex, m.good, 4));
  MLP_OP(b->zero(ex, m.found, 4));
  MLP_OP(b->cast(ex, m.x, dt, m.x32, GS_F32, MLP_N * MLP_C));
  float *params[4] = {m.w1, m.b1, m.w2, m.b2}, *grads[4] = {m.gw1, m.gb1, m.gw2, m.gb2};
  float *moms[4] = {m.mw1, m.mb1, m.mw2, m.mb2};
  void *work[4] = {m.w1d, m.b1d, m.w2d, m.b2d};
  const size_t counts[4] = {MLP_C * MLP_H, MLP_H, MLP_H * MLP_K, MLP_K};
  for (int step = 0; step < steps; step++) {
    for (int p = 0; p < 4; p++) {
      MLP_OP(b->cast(ex, work[p], dt, params[p], GS_F32, counts[p]));
      MLP_OP(b->zero(ex, grads[p], counts[p] * 4));
    }
    MLP_OP(b->dense_forward(ex, dt, m.h1, m.x, m.w1d, m.b1d, MLP_N, MLP_C, MLP_H, m.ws, true));
    MLP_OP(b->dense_forward(ex, dt, m.lgd, m.h1, m.w2d, m.b2d, MLP_N, MLP_H, MLP_K, m.ws, false));
    MLP_OP(b->cast(ex, m.logits, GS_F32, m.lgd, dt, MLP_N * MLP_K));
    MLP_OP(b->synchronize(ex)); /* the CPU's xent reads the scale directly */
    MLP_OP(b->xent_forward_backward(ex, m.loss, NULL, m.dlog, m.logits, m.labels, MLP_N, MLP_K,
                                    fp16 ? m.scale : NULL, (float)MLP_N));
    MLP_OP(b->cast(ex, m.dlgd, dt, m.dlog, GS_F32, MLP_N * MLP_K));
    MLP_OP(b->dense_backward(ex, dt, m.dh1, m.gw2, m.gb2, m.dlgd, m.h1, m.w2d, MLP_N, MLP_H, MLP_K,
                             m.ws));
    MLP_OP(b->relu_backward(ex, dt, m.dh1, m.dh1, m.h1, MLP_N * MLP_H));
    MLP_OP(b->dense_backward(ex, dt, NULL, m.gw1, m.gb1, m.dh1, m.x, m.w1d, MLP_N, MLP_C, MLP_H,
                             m.ws));
    if (fp16)
      for (int p = 0; p < 4; p++)
        MLP_OP(b->unscale_check(ex, grads[p], counts[p], m.scale, m.found));
    for (int p = 0; p < 4; p++)
      MLP_OP(b->sgd_step(ex, params[p], grads[p], moms[p], counts[p], 0.1f, 0.9f, false, 0.0f,
                         fp16 ? m.found : NULL));
    if (fp16)
      MLP_OP(b->loss_scale_update(ex, m.scale, m.good, m.found, m.skipped, 2000));
    MLP_OP(b->copy_out(ex, hl, m.loss, MLP_N * 4));
    MLP_OP(b->synchronize(ex));
    double sum = 0;
    for (int i = 0; i < MLP_N; i++)
      sum += hl[i];
    losses[step] = (float)(sum / MLP_N);
  }
done:
  free(hx);
  free(hw1);
  free(hw2);
  free(hl);
  free(hlab);
  return rc;
}

static void *cpu_block(void *u, size_t bytes) {
  void **slot = u;
  *slot = malloc(bytes);
  return *slot;
}

static void *gpu_block(void *u, size_t bytes) {
  tc *t = u;
  return dput(t, NULL, bytes);
}

static int case_mlp(gs_gpu_env *env, gs_dtype dt, char *msg, size_t len) {
  TC_BEGIN(env, dt, msg, len);
  enum { STEPS = 50 };
  float cl[STEPS], gl[STEPS];
  void *cblock = NULL;
  int rc = gs_gpu_mlp_train(C, CX, dt, STEPS, cpu_block, &cblock, cl);
  free(cblock);
  tc_call(t, "cpu mlp", rc);
  tc_call(t, "gpu mlp", gs_gpu_mlp_train(G, GX, dt, STEPS, gpu_block, t, gl));
  if (!t->err) {
    double a = dt == GS_F32 ? 1e-4 : 2e-2, r = dt == GS_F32 ? 1e-3 : 2e-2;
    for (int i = 0; i < STEPS; i++)
      if (!(fabs(gl[i] - cl[i]) <= a + r * fabs(cl[i])))
        fail(t, "%s mlp loss at step %d: gpu %.6g, cpu %.6g", gs_dtype_name(dt), i, gl[i], cl[i]);
    if (!(cl[STEPS - 1] < 0.7 * cl[0]) || !(gl[STEPS - 1] < 0.7 * gl[0]))
      fail(t, "%s mlp did not learn: cpu %.4g -> %.4g, gpu %.4g -> %.4g", gs_dtype_name(dt),
           cl[0], cl[STEPS - 1], gl[0], gl[STEPS - 1]);
  }
  return tc_end(t);
}

/* ---- transformer ops: embeddings ---- */

/* The gradients are sums in token (n) order on both devices, plain fp32
 * additions: bit for bit, as are the copies and the single add of the
 * forwards. */
static void embedding_one(tc *t, gs_dtype dt, uint32_t rows, uint32_t v, uint32_t c) {
  gs_backend *C = t->e->cpu, *G = t->e->gpu;
  gs_exec *CX = t->e->cex, *GX = t->e->gex;
  size_t es = gs_dtype_size(dt), nt = (size_t)v * c, no = (size_t)rows * c;
  void *tab = hrand(t, dt, nt, 1), *dout = hrand(t, dt, no, 1);
  float *dtab0 = hrand(t, GS_F32, nt, 1);
  int32_t *ids = halloc(t, (size_t)rows * 4 + 4);
  void *out = halloc(t, no * es);
  float *dtab = hdup(t, dtab0, nt * 4);
  if (t->err)
    return;
  for (uint32_t i = 0; i < rows; i++) { /* skewed: low ids often, id v-1 never */
    urand();
    uint32_t r = (uint32_t)(rng >> 20);
    ids[i] = (int32_t)(v > 1 ? (r % 3 ? r % (v - 1) : r % ((v + 3) / 4)) : 0);
  }
  tc_call(t, "cpu embedding_forward", C->embedding_forward(CX, dt, out, ids, tab, rows, v, c));
  tc_call(t, "cpu embedding_backward",
          C->embedding_backward(CX, dt, dtab, dout, ids, rows, v, c));
  void *gtab = dput(t, tab, nt * es), *gdout = dput(t, dout, no * es);
  int32_t *gids = dput(t, ids, (size_t)rows * 4);
  void *gout = dput(t, NULL, no * es);
  float *gdtab = dput(t, dtab0, nt * 4);
  if (t->err)
    return;
  tc_call(t, "gpu embedding_forward", G->embedding_forward(GX, dt, gout, gids, gtab, rows, v, c));
  tc_call(t, "gpu embedding_backward",
          G->embedding_backward(GX, dt, gdtab, gdout, gids, rows, v, c));
  cmp_bits(t, "embedding out", out, dget(t, gout, no * es), no * es, es);
  cmp_bits(t, "embedding dtable", dtab, dget(t, gdtab, nt * 4), nt * 4, 4);
  if (rows < 2)
    return;
  /* an id out of range (the cpu refuses it): the gpu writes NaN for that
   * row and leaves its dout out of dtable, here the cpu's sums with that
   * token's dout row zero (x + 0 is x, bit for bit, for the non-zero x) */
  uint32_t bad = rows / 2;
  int32_t *ids2 = hdup(t, ids, (size_t)rows * 4);
  void *dout2 = hdup(t, dout, no * es);
  float *dtab2 = hdup(t, dtab0, nt * 4);
  if (t->err)
    return;
  memset((char *)dout2 + (size_t)bad * c * es, 0, (size_t)c * es);
  tc_call(t, "cpu embedding_backward",
          C->embedding_backward(CX, dt, dtab2, dout2, ids2, rows, v, c));
  ids2[bad] = (int32_t)v;
  int32_t *gids2 = dput(t, ids2, (size_t)rows * 4);
  float *gdtab2 = dput(t, dtab0, nt * 4);
  if (t->err)
    return;
  tc_call(t, "gpu embedding_forward (bad id)",
          G->embedding_forward(GX, dt, gout, gids2, gtab, rows, v, c));
  tc_call(t, "gpu embedding_backward (bad id)",
          G->embedding_backward(GX, dt, gdtab2, gdout, gids2, rows, v, c));
  void *o2 = dget(t, gout, no * es);
  if (t->err || !o2)
    return;
  for (uint32_t q = 0; q < c; q++)
    if (!isnan(get_dt(dt, o2, (size_t)bad * c + q)))
      fail(t, "%s embedding out[%u, %u] for id %u of %u: %g, want NaN", gs_dtype_name(dt), bad, q,
           v, v, get_dt(dt, o2, (size_t)bad * c + q));
  cmp_bits(t, "embedding out (other rows)", out, o2, (size_t)bad * c * es, es);
  cmp_bits(t, "embedding dtable (bad id)", dtab2, dget(t, gdtab2, nt * 4), nt * 4, 4);
}

static int case_embedding(gs_gpu_env *env, gs_dtype dt, char *msg, size_t len) {
  TC_BEGIN(env, dt, msg, len);
  (void)C, (void)G, (void)CX, (void)GX;
  embedding_one(t, dt, 21, 13, 7);
  embedding_one(t, dt, 1, 1, 3);
  embedding_one(t, dt, 300, 97, 131); /* several tiles, row blocks, channel blocks */
  embedding_one(t, dt, 4096, 2000, 64);
  return tc_end(t);
}

static void posembed_one(tc *t, gs_dtype dt, uint32_t n, uint32_t tt, uint32_t c) {
  gs_backend *C = t->e->cpu, *G = t->e->gpu;
  gs_exec *CX = t->e->cex, *GX = t->e->gex;
  size_t es = gs_dtype_size(dt), tc_ = (size_t)tt * c, all = tc_ * n;
  void *in = hrand(t, dt, all, 1), *pos = hrand(t, dt, tc_, 1), *dout = hrand(t, dt, all, 1);
  float *dpos0 = hrand(t, GS_F32, tc_, 1);
  void *out = halloc(t, all * es), *din = halloc(t, all * es);
  float *dpos = hdup(t, dpos0, tc_ * 4);
  if (t->err)
    return;
  tc_call(t, "cpu posembed_forward", C->posembed_forward(CX, dt, out, in, pos, n, tt, c));
  tc_call(t, "cpu posembed_backward", C->posembed_backward(CX, dt, din, dpos, dout, n, tt, c));
  void *gin = dput(t, in, all * es), *gpos = dput(t, pos, tc_ * es);
  void *gdout = dput(t, dout, all * es), *gout = dput(t, NULL, all * es);
  void *gdin = dput(t, NULL, all * es);
  float *gdpos = dput(t, dpos0, tc_ * 4);
  if (t->err)
    return;
  tc_call(t, "gpu posembed_forward", G->posembed_forward(GX, dt, gout, gin, gpos, n, tt, c));
  tc_call(t, "gpu posembed_backward", G->posembed_backward(GX, dt, gdin, gdpos, gdout, n, tt, c));
  cmp_bits(t, "posembed out", out, dget(t, gout, all * es), all * es, es);
  cmp_bits(t, "posembed din", din, dget(t, gdin, all * es), all * es, es);
  cmp_bits(t, "posembed dpos", dpos, dget(t, gdpos, tc_ * 4), tc_ * 4, 4);
  /* in place (out is in, din is dout) */
  tc_call(t, "gpu posembed_forward (in place)",
          G->posembed_forward(GX, dt, gin, gin, gpos, n, tt, c));
  tc_call(t, "gpu posembed_backward (din is dout)",
          G->posembed_backward(GX, dt, gdout, gdpos, gdout, n, tt, c));
  cmp_bits(t, "posembed out (in place)", out, dget(t, gin, all * es), all * es, es);
  cmp_bits(t, "posembed dout (din is dout)", dout, dget(t, gdout, all * es), all * es, es);
}

static int case_posembed(gs_gpu_env *env, gs_dtype dt, char *msg, size_t len) {
  TC_BEGIN(env, dt, msg, len);
  (void)C, (void)G, (void)CX, (void)GX;
  posembed_one(t, dt, 3, 7, 13);
  posembed_one(t, dt, 1, 1, 5);
  posembed_one(t, dt, 8, 256, 96);
  return tc_end(t);
}

/* ---- transformer ops: causal self-attention ---- */

/* Both devices compute in fp32 but sum in different orders (OpenBLAS
 * blocks against the GPU's per-row loops, fused multiply-adds on both):
 * probs within 2^-20 + 2^-16 |ref|; out, a sum over T, as a sum of T
 * products; dqkv within 2^-16 + 2^-16 |ref| (16-bit: plus the rounding
 * step, as every sum), some fifteen times the cpu's own largest error
 * against a double definition at N 4, T 256, H 6, D 64 (1e-6, values up
 * to 2.4). Masked probs are exactly 0 on both. */
static void attention_one(tc *t, gs_dtype dt, uint32_t n, uint32_t tt, uint32_t h, uint32_t d) {
  gs_backend *C = t->e->cpu, *G = t->e->gpu;
  gs_exec *CX = t->e->cex, *GX = t->e->gex;
  size_t es = gs_dtype_size(dt), hd = (size_t)h * d, nq = (size_t)n * tt * 3 * hd;
  size_t no = (size_t)n * tt * hd, np = (size_t)n * h * tt * tt;
  void *qkv = hrand(t, dt, nq, 1.5f), *dout = hrand(t, dt, no, 1);
  size_t cws = C->attention_workspace(dt, n, tt, h, d);
  size_t gws = G->attention_workspace(dt, n, tt, h, d);
  void *cw = halloc(t, cws), *out = halloc(t, no * es), *dqkv = halloc(t, nq * es);
  float *probs = halloc(t, np * 4);
  if (t->err)
    return;
  tc_call(t, "cpu attention_forward",
          C->attention_forward(CX, dt, out, probs, qkv, n, tt, h, d, cw));
  tc_call(t, "cpu attention_backward",
          C->attention_backward(CX, dt, dqkv, dout, qkv, probs, n, tt, h, d, cw));
  void *gqkv = dput(t, qkv, nq * es), *gdout = dput(t, dout, no * es);
  void *gout = dput(t, NULL, no * es), *gdqkv = dput(t, NULL, nq * es), *gw = dput(t, NULL, gws);
  float *gprobs = dput(t, NULL, np * 4);
  if (t->err)
    return;
  /* garbage first: every element of out, probs and dqkv must be written */
  void *junk = halloc(t, nq * es > np * 4 ? nq * es : np * 4);
  if (!junk)
    return;
  memset(junk, 0x7f, nq * es > np * 4 ? nq * es : np * 4);
  tc_call(t, "gpu copy_in", G->copy_in(GX, gout, junk, no * es));
  tc_call(t, "gpu copy_in", G->copy_in(GX, gprobs, junk, np * 4));
  tc_call(t, "gpu copy_in", G->copy_in(GX, gdqkv, junk, nq * es));
  tc_call(t, "gpu attention_forward",
          G->attention_forward(GX, dt, gout, gprobs, gqkv, n, tt, h, d, gw));
  tc_call(t, "gpu attention_backward",
          G->attention_backward(GX, dt, gdqkv, gdout, gqkv, gprobs, n, tt, h, d, gw));
  float *hp = dget(t, gprobs, np * 4);
  cmp(t, "attention probs", GS_F32, probs, hp, np, 0x1p-20, 0x1p-16);
  if (hp && !t->err)
    for (size_t i = 0; i < np; i++)
      if (i % tt > i / tt % tt && hp[i] != 0.0f)
        fail(t, "%s attention probs[%zu] (t %zu, s %zu) masked but %g", gs_dtype_name(dt), i,
             i / tt % tt, i % tt, (double)hp[i]);
  double a, r;
  tol_sum(dt, tt, &a, &r);
  cmp(t, "attention out", dt, out, dget(t, gout, no * es), no, a, r);
  a = 0x1p-16 + (dt == GS_F32 ? 0.0 : eps_dt(dt));
  r = dt == GS_F32 ? 0x1p-16 : 2 * eps_dt(dt);
  cmp(t, "attention dqkv", dt, dqkv, dget(t, gdqkv, nq * es), nq, a, r);
}

static int case_attention(gs_gpu_env *env, gs_dtype dt, char *msg, size_t len) {
  TC_BEGIN(env, dt, msg, len);
  (void)C, (void)G, (void)CX, (void)GX;
  attention_one(t, dt, 2, 7, 3, 5);
  attention_one(t, dt, 2, 1, 3, 5);
  attention_one(t, dt, 1, 64, 3, 5);
  attention_one(t, dt, 1, 130, 2, 16); /* past one block of 128 threads */
  attention_one(t, dt, 4, 256, 6, 64); /* a small GPT's layer */
  return tc_end(t);
}

/* ---- the table ---- */

/* ==== normalisation and element-wise ops (cpu_norm.c, cuda_norm.cu) ==== */

/* ---- residual sums: bit for bit (one fp32 add, one rounding) ---- */

static int case_add(gs_gpu_env *env, gs_dtype dt, char *msg, size_t len) {
  TC_BEGIN(env, dt, msg, len);
  size_t n = 70001, es = gs_dtype_size(dt);
  void *a = hrand(t, dt, n, 4), *b = hrand(t, dt, n, 4);
  void *out = halloc(t, n * es), *acc = hdup(t, a, n * es);
  void *ga = dput(t, a, n * es), *gb = dput(t, b, n * es), *gout = dput(t, NULL, n * es);
  if (t->err)
    return tc_end(t);
  tc_call(t, "cpu add_forward", C->add_forward(CX, dt, out, a, b, n));
  tc_call(t, "cpu accumulate", C->accumulate(CX, dt, acc, b, n));
  tc_call(t, "gpu add_forward", G->add_forward(GX, dt, gout, ga, gb, n));
  cmp_bits(t, "add out", out, dget(t, gout, n * es), n * es, es);
  tc_call(t, "gpu accumulate", G->accumulate(GX, dt, ga, gb, n));
  cmp_bits(t, "accumulate dst", acc, dget(t, ga, n * es), n * es, es);
  return tc_end(t);
}

/* ---- batch and layer normalisation ---- */

/* tolerance of a normalised value stored in dt: the two devices sum the
 * statistics in another order (fp32 runs on the GPU) and fuse multiply-adds */
static void tol_norm(gs_dtype dt, double *atol, double *rtol) {
  *atol = 1e-5 + (dt == GS_F32 ? 0.0 : eps_dt(dt));
  *rtol = dt == GS_F32 ? 1e-5 : 2 * eps_dt(dt);
}

/* One BatchNorm (layer = false) or LayerNorm (layer = true) of (m, c):
 * forward (BatchNorm: training, then evaluation from the updated running
 * statistics) and backward, every output compared. */
static void norm_one(tc *t, gs_dtype dt, bool layer, uint32_t m, uint32_t c) {
  gs_backend *C = t->e->cpu, *G = t->e->gpu;
  gs_exec *CX = t->e->cex, *GX = t->e->gex;
  size_t es = gs_dtype_size(dt), n = (size_t)m * c, ns = layer ? m : c;
  void *x = hrand(t, dt, n, 2), *g = hrand(t, dt, c, 1), *b = hrand(t, dt, c, 1);
  void *dout = hrand(t, dt, n, 1);
  float *rm0 = hrand(t, GS_F32, c, 1), *rv0 = hrand(t, GS_F32, c, 1);
  float *dg0 = hrand(t, GS_F32, c, 1), *db0 = hrand(t, GS_F32, c, 1);
  if (t->err)
    return;
  for (uint32_t j = 0; j < c; j++)
    rv0[j] = 1.0f + 0.5f * rv0[j]; /* a variance: positive */
  size_t cws = layer ? C->layernorm_workspace(dt, m, c) : C->batchnorm_workspace(dt, m, c);
  size_t gws = layer ? G->layernorm_workspace(dt, m, c) : G->batchnorm_workspace(dt, m, c);
  void *cw = halloc(t, cws), *out = halloc(t, n * es), *out2 = halloc(t, n * es);
  void *din = halloc(t, n * es);
  float *mean = halloc(t, ns * 4), *rstd = halloc(t, ns * 4);
  float *rm = hdup(t, rm0, c * 4), *rv = hdup(t, rv0, c * 4);
  float *dg = hdup(t, dg0, c * 4), *db = hdup(t, db0, c * 4);
  void *gx = dput(t, x, n * es), *gg = dput(t, g, c * es), *gb = dput(t, b, c * es);
  void *gdout = dput(t, dout, n * es), *gout = dput(t, NULL, n * es);
  void *gout2 = dput(t, NULL, n * es), *gdin = dput(t, NULL, n * es);
  void *gwsp = dput(t, NULL, gws);
  float *gmean = dput(t, NULL, ns * 4), *grstd = dput(t, NULL, ns * 4);
  float *grm = dput(t, rm0, c * 4), *grv = dput(t, rv0, c * 4);
  float *gdg = dput(t, dg0, c * 4), *gdb = dput(t, db0, c * 4);
  if (t->err)
    return;
  const float eps = 1e-5f;
  if (layer) {
    tc_call(t, "cpu layernorm_forward",
            C->layernorm_forward(CX, dt, out, mean, rstd, x, g, b, m, c, eps));
    tc_call(t, "cpu layernorm_backward",
            C->layernorm_backward(CX, dt, din, dg, db, dout, x, g, mean, rstd, m, c, cw));
    tc_call(t, "gpu layernorm_forward",
            G->layernorm_forward(GX, dt, gout, gmean, grstd, gx, gg, gb, m, c, eps));
    tc_call(t, "gpu layernorm_backward",
            G->layernorm_backward(GX, dt, gdin, gdg, gdb, gdout, gx, gg, gmean, grstd, m, c,
                                  gwsp));
  } else {
    tc_call(t, "cpu batchnorm_forward",
            C->batchnorm_forward(CX, dt, out, mean, rstd, rm, rv, x, g, b, m, c, eps, 0.1f,
                                 true, cw));
    tc_call(t, "cpu batchnorm_backward",
            C->batchnorm_backward(CX, dt, din, dg, db, dout, x, g, mean, rstd, m, c, cw));
    tc_call(t, "cpu batchnorm_forward (eval)",
            C->batchnorm_forward(CX, dt, out2, NULL, NULL, rm, rv, x, g, b, m, c, eps, 0.1f,
                                 false, cw));
    tc_call(t, "gpu batchnorm_forward",
            G->batchnorm_forward(GX, dt, gout, gmean, grstd, grm, grv, gx, gg, gb, m, c, eps,
                                 0.1f, true, gwsp));
    tc_call(t, "gpu batchnorm_backward",
            G->batchnorm_backward(GX, dt, gdin, gdg, gdb, gdout, gx, gg, gmean, grstd, m, c,
                                  gwsp));
    tc_call(t, "gpu batchnorm_forward (eval)",
            G->batchnorm_forward(GX, dt, gout2, NULL, NULL, grm, grv, gx, gg, gb, m, c, eps,
                                 0.1f, false, gwsp));
  }
  const char *nm = layer ? "layernorm" : "batchnorm";
  char what[64];
  double a, r;
  tol_norm(dt, &a, &r);
  snprintf(what, sizeof what, "%s out", nm);
  cmp(t, what, dt, out, dget(t, gout, n * es), n, a, r);
  snprintf(what, sizeof what, "%s din", nm);
  cmp(t, what, dt, din, dget(t, gdin, n * es), n, a * 4, r * 4);
  snprintf(what, sizeof what, "%s mean", nm);
  cmp(t, what, GS_F32, mean, dget(t, gmean, ns * 4), ns, 1e-6, 1e-5);
  snprintf(what, sizeof what, "%s rstd", nm);
  cmp(t, what, GS_F32, rstd, dget(t, grstd, ns * 4), ns, 1e-6, 1e-5);
  tol_sum(GS_F32, m, &a, &r);
  snprintf(what, sizeof what, "%s dgamma", nm);
  cmp(t, what, GS_F32, dg, dget(t, gdg, c * 4), c, a, r);
  snprintf(what, sizeof what, "%s dbeta", nm);
  cmp(t, what, GS_F32, db, dget(t, gdb, c * 4), c, a, r);
  if (!layer) {
    cmp(t, "batchnorm running_mean", GS_F32, rm, dget(t, grm, c * 4), c, 1e-6, 1e-5);
    cmp(t, "batchnorm running_var", GS_F32, rv, dget(t, grv, c * 4), c, 1e-6, 1e-5);
    tol_norm(dt, &a, &r);
    cmp(t, "batchnorm out (eval)", dt, out2, dget(t, gout2, n * es), n, a, r);
  }
}

static int case_batchnorm(gs_gpu_env *env, gs_dtype dt, char *msg, size_t len) {
  TC_BEGIN(env, dt, msg, len);
  (void)C, (void)G, (void)CX, (void)GX;
  norm_one(t, dt, false, 13, 7);
  norm_one(t, dt, false, 1, 5);     /* one row: var 0, running_var from it */
  norm_one(t, dt, false, 300, 45);  /* columns past one block of 32 */
  norm_one(t, dt, false, 128 * 28 * 28, 16); /* many chunks */
  return tc_end(t);
}

static int case_layernorm(gs_gpu_env *env, gs_dtype dt, char *msg, size_t len) {
  TC_BEGIN(env, dt, msg, len);
  (void)C, (void)G, (void)CX, (void)GX;
  norm_one(t, dt, true, 13, 7);
  norm_one(t, dt, true, 5, 600);   /* rows longer than a warp's stride many times */
  norm_one(t, dt, true, 4096, 768); /* GPT-2 small's width, many chunks */
  norm_one(t, dt, true, 70, 1);
  return tc_end(t);
}

/* ---- GELU ---- */

static int case_gelu(gs_gpu_env *env, gs_dtype dt, char *msg, size_t len) {
  TC_BEGIN(env, dt, msg, len);
  size_t n = 70001, es = gs_dtype_size(dt);
  void *x = hrand(t, dt, n, 6), *dout = hrand(t, dt, n, 1);
  void *out = halloc(t, n * es), *din = halloc(t, n * es);
  void *gx = dput(t, x, n * es), *gdout = dput(t, dout, n * es), *gout = dput(t, NULL, n * es);
  void *gdin = dput(t, NULL, n * es);
  if (t->err)
    return tc_end(t);
  tc_call(t, "cpu gelu_forward", C->gelu_forward(CX, dt, out, x, n));
  tc_call(t, "cpu gelu_backward", C->gelu_backward(CX, dt, din, dout, x, n));
  tc_call(t, "gpu gelu_forward", G->gelu_forward(GX, dt, gout, gx, n));
  tc_call(t, "gpu gelu_backward", G->gelu_backward(GX, dt, gdin, gdout, gx, n));
  /* tanhf differs by an ulp or two between the libraries */
  double a = 1e-6 + (dt == GS_F32 ? 0.0 : eps_dt(dt)), r = dt == GS_F32 ? 1e-5 : 2 * eps_dt(dt);
  cmp(t, "gelu out", dt, out, dget(t, gout, n * es), n, a, r);
  cmp(t, "gelu din", dt, din, dget(t, gdin, n * es), n, a, r);
  return tc_end(t);
}

/* ---- dropout: the same mask and bits on both devices ---- */

static int case_dropout(gs_gpu_env *env, gs_dtype dt, char *msg, size_t len) {
  TC_BEGIN(env, dt, msg, len);
  size_t n = 100003, es = gs_dtype_size(dt);
  void *x = hrand(t, dt, n, 4);
  void *out = halloc(t, n * es), *gx = dput(t, x, n * es), *gout = dput(t, NULL, n * es);
  if (t->err)
    return tc_end(t);
  const float rates[] = {0.0f, 0.1f, 0.5f, 0.9f};
  for (size_t i = 0; i < sizeof rates / sizeof rates[0]; i++) {
    uint64_t seed = 0x9e3779b97f4a7c15ull * (i + 1);
    tc_call(t, "cpu dropout_forward", C->dropout_forward(CX, dt, out, x, n, rates[i], seed));
    tc_call(t, "gpu dropout_forward", G->dropout_forward(GX, dt, gout, gx, n, rates[i], seed));
    cmp_bits(t, "dropout out", out, dget(t, gout, n * es), n * es, es);
    tc_call(t, "gpu dropout_backward", G->dropout_backward(GX, dt, gout, gx, n, rates[i], seed));
    cmp_bits(t, "dropout din", out, dget(t, gout, n * es), n * es, es);
  }
  return tc_end(t);
}

/* ---- average pool: the same sums in the same order, bit for bit ---- */

static void avgpool_one(tc *t, gs_dtype dt, gs_conv_shape s) {
  gs_backend *C = t->e->cpu, *G = t->e->gpu;
  gs_exec *CX = t->e->cex, *GX = t->e->gex;
  size_t es = gs_dtype_size(dt);
  uint32_t oh = gs_window_out(s.h, s.kh, s.stride, false);
  uint32_t ow = gs_window_out(s.w, s.kw, s.stride, false);
  size_t nx = (size_t)s.n * s.h * s.w * s.c, ny = (size_t)s.n * oh * ow * s.c;
  void *x = hrand(t, dt, nx, 2), *dout = hrand(t, dt, ny, 1);
  void *out = halloc(t, ny * es), *din = halloc(t, nx * es);
  void *gx = dput(t, x, nx * es), *gdout = dput(t, dout, ny * es);
  void *gout = dput(t, NULL, ny * es), *gdin = dput(t, NULL, nx * es);
  if (t->err)
    return;
  tc_call(t, "cpu avgpool_forward", C->avgpool_forward(CX, dt, out, x, &s));
  tc_call(t, "cpu avgpool_backward", C->avgpool_backward(CX, dt, din, dout, &s));
  tc_call(t, "gpu avgpool_forward", G->avgpool_forward(GX, dt, gout, gx, &s));
  tc_call(t, "gpu avgpool_backward", G->avgpool_backward(GX, dt, gdin, gdout, &s));
  cmp_bits(t, "avgpool out", out, dget(t, gout, ny * es), ny * es, es);
  cmp_bits(t, "avgpool din", din, dget(t, gdin, nx * es), nx * es, es);
}

static int case_avgpool(gs_gpu_env *env, gs_dtype dt, char *msg, size_t len) {
  TC_BEGIN(env, dt, msg, len);
  (void)C, (void)G, (void)CX, (void)GX;
  avgpool_one(t, dt, shape(2, 7, 9, 3, 3, 2, false, 3));
  avgpool_one(t, dt, shape(1, 5, 5, 4, 2, 1, false, 4));  /* overlapping windows */
  avgpool_one(t, dt, shape(3, 8, 7, 5, 2, 3, false, 5));  /* gaps between windows */
  avgpool_one(t, dt, shape(2, 2, 3, 3, 3, 1, false, 3));  /* no window fits: din 0 */
  avgpool_one(t, dt, shape(8, 32, 32, 64, 2, 2, false, 64));
  return tc_end(t);
}

const gs_gpu_case gs_gpu_cases[] = {
    {"dense", case_dense, true},       {"conv2d", case_conv2d, true},
    {"depthwise", case_depthwise, true}, {"maxpool", case_maxpool, true},
    {"gap", case_gap, true},           {"relu", case_relu, true},
    {"xent", case_xent, false},        {"cast", case_cast, false},
    {"cast_overlap", case_cast_overlap, true},
    {"unscale_check", case_unscale, false}, {"loss_scale_update", case_loss_scale, false},
    {"sgd", case_sgd, false},          {"adam", case_adam, false},
    {"mlp_trajectory", case_mlp, true},
    /* normalisation and element-wise ops */
    {"add", case_add, true},
    /* transformer ops */
    {"embedding", case_embedding, true}, {"posembed", case_posembed, true},
    {"attention", case_attention, true},
    {"batchnorm", case_batchnorm, true},
    {"layernorm", case_layernorm, true},
    {"gelu", case_gelu, true},
    {"dropout", case_dropout, true},
    {"avgpool", case_avgpool, true},
};
const size_t gs_gpu_ncases = sizeof gs_gpu_cases / sizeof gs_gpu_cases[0];

int gs_gpu_run(gs_gpu_env *env, const char *name, gs_dtype dt, char *msg, size_t len) {
  for (size_t i = 0; i < gs_gpu_ncases; i++)
    if (strcmp(gs_gpu_cases[i].name, name) == 0)
      return gs_gpu_cases[i].fn(env, dt, msg, len);
  if (msg && len)
    snprintf(msg, len, "no case named %s", name);
  return -ENOENT;
}
