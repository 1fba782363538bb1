/*
 * test_kernels.c: the cpu backend against plain definitions.
 *
 * Every layer op is checked three ways on odd shapes (stride 2 VALID and
 * SAME, 1x1 and 5x5 windows, batch 1 and 3, odd H/W/C):
 *  - forward against a naive double-precision reference written straight
 *    from the definition (direct loops, explicit padding);
 *  - backward (din, dw, db) against central finite differences of the
 *    double reference on the scalar loss sum(out * R), R fixed and random;
 *    dw/db start from a non-zero value to check they accumulate;
 *  - fp16/bf16 storage against the fp32 op on the same (rounded) inputs,
 *    within abs + |ref| * eps(dtype).
 * Workspaces are allocated with exactly the queried bytes, so an op that
 * needs more shows up under ASan. The optimizers, the loss-scale state
 * machine, unscale/check, casts and the cross-entropy are checked against
 * hand-computed values and direct double computations.
 */
#include <cblas.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_internal.h" /* the pool, for its placement test */
#include "test_ops_util.h"

/* ---- helpers ---- */

/* fill x with random values exactly representable in dt */
static void fill(gs_dtype dt, double *x, size_t n, double scale) {
  for (size_t i = 0; i < n; i++)
    x[i] = round_dt(dt, urand() * scale);
}

static gs_backend *B;
static gs_exec *EX;

static void setup_ex(void) {
  B = gs_backend_cpu();
  gs_exec_config cfg = {.threads = 2, .device_index = 0};
  cr_assert_eq(B->exec_create(B, &cfg, &EX), 0);
  ops_seed();
}

static void teardown_ex(void) { B->exec_destroy(EX); }

/* ---- the layer ops under test, as one case type ---- */

enum op { OP_DENSE, OP_CONV, OP_DW, OP_MAXPOOL, OP_GAP, OP_RELU };

typedef struct tcase {
  enum op op;
  const char *name;
  gs_conv_shape s; /* image ops; for dense: n, c = in features, f = out features */
  size_t count;    /* relu */
} tcase;

typedef struct layer {
  const tcase *t;
  size_t nx, nw, nb, ny;
  double *x, *w, *b, *r, *y; /* input, weight, bias, loss weights R, ref output */
  long oh, ow, pt, pl;
} layer;

static void layer_geometry(layer *L) {
  const gs_conv_shape *s = &L->t->s;
  bool same = L->t->op == OP_MAXPOOL ? false : s->same;
  L->oh = gs_window_out(s->h, s->kh, s->stride, same);
  L->ow = gs_window_out(s->w, s->kw, s->stride, same);
  L->pt = gs_window_pad(s->h, s->kh, s->stride, same);
  L->pl = gs_window_pad(s->w, s->kw, s->stride, same);
  size_t n = s->n, img = (size_t)s->n * s->h * s->w * s->c;
  switch (L->t->op) {
  case OP_DENSE:
    L->nx = n * s->c, L->nw = (size_t)s->c * s->f, L->nb = s->f, L->ny = n * s->f;
    break;
  case OP_CONV:
    L->nx = img, L->nw = (size_t)s->kh * s->kw * s->c * s->f, L->nb = s->f;
    L->ny = n * L->oh * L->ow * s->f;
    break;
  case OP_DW:
    L->nx = img, L->nw = (size_t)s->kh * s->kw * s->c, L->nb = s->c;
    L->ny = n * L->oh * L->ow * s->c;
    break;
  case OP_MAXPOOL:
    L->nx = img, L->nw = L->nb = 0, L->ny = n * L->oh * L->ow * s->c;
    break;
  case OP_GAP:
    L->nx = img, L->nw = L->nb = 0, L->ny = n * s->c;
    break;
  case OP_RELU:
    L->nx = L->ny = L->t->count, L->nw = L->nb = 0;
    break;
  }
}

/* The definitions, in double, with padding spelled out. */
static void ref_forward(layer *L) {
  const gs_conv_shape *s = &L->t->s;
  long N = s->n, H = s->h, W = s->w, C = s->c, KH = s->kh, KW = s->kw, S = s->stride, F = s->f;
  double *y = L->y;
  switch (L->t->op) {
  case OP_DENSE:
    for (long i = 0; i < N; i++)
      for (long o = 0; o < F; o++) {
        double a = L->b[o];
        for (long k = 0; k < C; k++)
          a += L->x[i * C + k] * L->w[k * F + o];
        y[i * F + o] = a;
      }
    return;
  case OP_CONV:
  case OP_DW:
  case OP_MAXPOOL: {
    long FO = L->t->op == OP_CONV ? F : C;
    for (long n = 0; n < N; n++)
      for (long oy = 0; oy < L->oh; oy++)
        for (long ox = 0; ox < L->ow; ox++)
          for (long o = 0; o < FO; o++) {
            double a = L->t->op == OP_MAXPOOL ? -INFINITY : L->b[o];
            for (long ky = 0; ky < KH; ky++)
              for (long kx = 0; kx < KW; kx++) {
                long iy = oy * S - L->pt + ky, ix = ox * S - L->pl + kx;
                if (iy < 0 || iy >= H || ix < 0 || ix >= W)
                  continue; /* zero padding */
                const double *px = L->x + ((n * H + iy) * W + ix) * C;
                if (L->t->op == OP_CONV) {
                  for (long c = 0; c < C; c++)
                    a += px[c] * L->w[((ky * KW + kx) * C + c) * F + o];
                } else if (L->t->op == OP_DW) {
                  a += px[o] * L->w[(ky * KW + kx) * C + o];
                } else if (px[o] > a) {
                  a = px[o];
                }
              }
            y[((n * L->oh + oy) * L->ow + ox) * FO + o] = a;
          }
    return;
  }
  case OP_GAP:
    for (long n = 0; n < N; n++)
      for (long c = 0; c < C; c++) {
        double a = 0;
        for (long q = 0; q < H * W; q++)
          a += L->x[(n * H * W + q) * C + c];
        y[n * C + c] = a / (double)(H * W);
      }
    return;
  case OP_RELU:
    for (size_t i = 0; i < L->nx; i++)
      y[i] = L->x[i] > 0 ? L->x[i] : 0;
    return;
  }
}

static double ref_loss(layer *L) {
  ref_forward(L);
  double l = 0;
  for (size_t i = 0; i < L->ny; i++)
    l += L->y[i] * L->r[i];
  return l;
}

/* d loss / d v[i] by central differences (exact for the piecewise-linear
 * ops here, up to double rounding, as long as no kink lies within h) */
static double layer_loss(void *L) { return ref_loss(L); }
static void layer_fd_grad(layer *L, double *v, size_t n, double *g) {
  fd_grad(layer_loss, L, v, n, 1e-4, g);
}

static void layer_init(layer *L, const tcase *t, gs_dtype dt) {
  memset(L, 0, sizeof *L);
  L->t = t;
  layer_geometry(L);
  L->x = calloc(L->nx + 1, sizeof(double));
  L->w = calloc(L->nw + 1, sizeof(double));
  L->b = calloc(L->nb + 1, sizeof(double));
  L->r = calloc(L->ny + 1, sizeof(double));
  L->y = calloc(L->ny + 1, sizeof(double));
  fill(dt, L->x, L->nx, 1.0);
  if (t->op == OP_RELU || t->op == OP_MAXPOOL) {
    /* keep inputs away from the kinks (0 for relu, ties for max) */
    for (size_t i = 0; i < L->nx; i++) {
      double v = (double)((i * 7919) % (L->nx * 2 + 1)) / (double)L->nx - 1.0;
      L->x[i] = round_dt(dt, v + (v >= 0 ? 0.01 : -0.01));
    }
  }
  fill(dt, L->w, L->nw, 0.5);
  fill(dt, L->b, L->nb, 0.5);
  fill(dt, L->r, L->ny, 1.0);
}

static void layer_free(layer *L) {
  free(L->x);
  free(L->w);
  free(L->b);
  free(L->r);
  free(L->y);
}

/* Run the backend's forward and backward in dt; fill out (ny), din (nx),
 * dw (nw), db (nb), as doubles. dw/db start at 0.25 and 0.25 is taken off
 * again, which fails if the op overwrote instead of accumulating. */
static void run_backend(layer *L, gs_dtype dt, double *out, double *din, double *dw, double *db) {
  const tcase *t = L->t;
  const gs_conv_shape *s = &t->s;
  void *x = to_dt(dt, L->x, L->nx), *w = to_dt(dt, L->w, L->nw), *b = to_dt(dt, L->b, L->nb);
  void *r = to_dt(dt, L->r, L->ny);
  void *y = calloc(L->ny + 1, gs_dtype_size(dt)), *dx = calloc(L->nx + 1, gs_dtype_size(dt));
  float *gw = malloc((L->nw + 1) * sizeof(float)), *gb = malloc((L->nb + 1) * sizeof(float));
  for (size_t i = 0; i < L->nw; i++)
    gw[i] = 0.25f;
  for (size_t i = 0; i < L->nb; i++)
    gb[i] = 0.25f;
  size_t wsb = 0;
  switch (t->op) {
  case OP_DENSE:
    wsb = B->dense_workspace(dt, s->n, s->c, s->f);
    break;
  case OP_CONV:
    wsb = B->conv2d_workspace(dt, s);
    break;
  case OP_DW:
    wsb = B->depthwise_workspace(dt, s);
    break;
  default:
    break;
  }
  void *ws = ws_alloc(wsb);
  int rc = 0;
  switch (t->op) {
  case OP_DENSE:
    rc |= B->dense_forward(EX, dt, y, x, w, b, s->n, s->c, s->f, ws, false);
    rc |= B->dense_backward(EX, dt, dx, gw, gb, r, x, w, s->n, s->c, s->f, ws);
    break;
  case OP_CONV:
    rc |= B->conv2d_forward(EX, dt, y, x, w, b, s, ws, false);
    rc |= B->conv2d_backward(EX, dt, dx, gw, gb, r, x, w, s, ws);
    break;
  case OP_DW:
    rc |= B->depthwise_forward(EX, dt, y, x, w, b, s, ws, false);
    rc |= B->depthwise_backward(EX, dt, dx, gw, gb, r, x, w, s, ws);
    break;
  case OP_MAXPOOL:
    rc |= B->maxpool_forward(EX, dt, y, x, s);
    memset(dx, 0x55, L->nx * gs_dtype_size(dt)); /* din is overwritten, not added to */
    rc |= B->maxpool_backward(EX, dt, dx, r, x, s);
    break;
  case OP_GAP:
    rc |= B->gap_forward(EX, dt, y, x, s->n, s->h, s->w, s->c);
    rc |= B->gap_backward(EX, dt, dx, r, s->n, s->h, s->w, s->c);
    break;
  case OP_RELU:
    rc |= B->relu_forward(EX, dt, y, x, t->count);
    /* relu backward reads the forward output: din = out > 0 ? dout : 0 */
    rc |= B->relu_backward(EX, dt, dx, r, y, t->count);
    break;
  }
  cr_assert_eq(rc, 0, "%s: an op failed", t->name);
  for (size_t i = 0; i < L->ny; i++)
    out[i] = get_dt(dt, y, i);
  for (size_t i = 0; i < L->nx; i++)
    din[i] = get_dt(dt, dx, i);
  for (size_t i = 0; i < L->nw; i++)
    dw[i] = (double)gw[i] - 0.25;
  for (size_t i = 0; i < L->nb; i++)
    db[i] = (double)gb[i] - 0.25;
  free(ws);
  free(x), free(w), free(b), free(r), free(y), free(dx), free(gw), free(gb);
}

static const tcase CASES[] = {
    {OP_DENSE, "dense 3x7->5", {.n = 3, .c = 7, .f = 5}, 0},
    {OP_DENSE, "dense 1x33->17", {.n = 1, .c = 33, .f = 17}, 0},
    {OP_DENSE, "dense 37x9->3", {.n = 37, .c = 9, .f = 3}, 0},
    {OP_CONV, "conv 3x3 s2 VALID", {.n = 3, .h = 7, .w = 6, .c = 3, .kh = 3, .kw = 3, .stride = 2, .same = false, .f = 4}, 0},
    {OP_CONV, "conv 3x3 s2 SAME", {.n = 3, .h = 7, .w = 6, .c = 3, .kh = 3, .kw = 3, .stride = 2, .same = true, .f = 4}, 0},
    {OP_CONV, "conv 5x5 s1 SAME n1", {.n = 1, .h = 5, .w = 7, .c = 5, .kh = 5, .kw = 5, .stride = 1, .same = true, .f = 3}, 0},
    {OP_CONV, "conv 5x5 s2 VALID", {.n = 3, .h = 9, .w = 7, .c = 3, .kh = 5, .kw = 5, .stride = 2, .same = false, .f = 2}, 0},
    {OP_CONV, "conv 1x1 s1", {.n = 3, .h = 5, .w = 3, .c = 7, .kh = 1, .kw = 1, .stride = 1, .same = true, .f = 5}, 0},
    {OP_CONV, "conv 1x1 s2 SAME", {.n = 3, .h = 7, .w = 5, .c = 3, .kh = 1, .kw = 1, .stride = 2, .same = true, .f = 2}, 0},
    {OP_CONV, "conv 3x5 s2 SAME", {.n = 1, .h = 6, .w = 9, .c = 3, .kh = 3, .kw = 5, .stride = 2, .same = true, .f = 3}, 0},
    {OP_CONV, "conv 5x5 s1 SAME c=16", {.n = 2, .h = 6, .w = 5, .c = 16, .kh = 5, .kw = 5, .stride = 1, .same = true, .f = 9}, 0},
    {OP_DW, "dw 3x3 s2 VALID", {.n = 3, .h = 7, .w = 6, .c = 5, .kh = 3, .kw = 3, .stride = 2, .same = false, .f = 5}, 0},
    {OP_DW, "dw 3x3 s2 SAME", {.n = 3, .h = 7, .w = 6, .c = 5, .kh = 3, .kw = 3, .stride = 2, .same = true, .f = 5}, 0},
    {OP_DW, "dw 5x5 s1 SAME n1", {.n = 1, .h = 5, .w = 7, .c = 3, .kh = 5, .kw = 5, .stride = 1, .same = true, .f = 3}, 0},
    {OP_DW, "dw 1x1 s1", {.n = 3, .h = 3, .w = 5, .c = 7, .kh = 1, .kw = 1, .stride = 1, .same = false, .f = 7}, 0},
    {OP_DW, "dw 3x3 s1 SAME c=133", {.n = 1, .h = 3, .w = 3, .c = 133, .kh = 3, .kw = 3, .stride = 1, .same = true, .f = 133}, 0},
    /* the fp32 vector paths: whole blocks of 8 channels, chunks of 64 plus
     * a block, a remainder after blocks, and a window too large for the
     * wgrad loop's stack (8x8 = 64 taps) */
    {OP_DW, "dw 3x3 s2 SAME c=16", {.n = 2, .h = 7, .w = 6, .c = 16, .kh = 3, .kw = 3, .stride = 2, .same = true, .f = 16}, 0},
    {OP_DW, "dw 3x3 s1 SAME c=72", {.n = 1, .h = 4, .w = 5, .c = 72, .kh = 3, .kw = 3, .stride = 1, .same = true, .f = 72}, 0},
    {OP_DW, "dw 5x5 s1 VALID c=21", {.n = 2, .h = 6, .w = 7, .c = 21, .kh = 5, .kw = 5, .stride = 1, .same = false, .f = 21}, 0},
    {OP_DW, "dw 8x8 s1 SAME c=8", {.n = 1, .h = 9, .w = 9, .c = 8, .kh = 8, .kw = 8, .stride = 1, .same = true, .f = 8}, 0},
    {OP_MAXPOOL, "maxpool 2x2 s2 odd", {.n = 3, .h = 7, .w = 6, .c = 5, .kh = 2, .kw = 2, .stride = 2, .f = 5}, 0},
    {OP_MAXPOOL, "maxpool 3x3 s2 overlap", {.n = 3, .h = 7, .w = 7, .c = 3, .kh = 3, .kw = 3, .stride = 2, .f = 3}, 0},
    {OP_MAXPOOL, "maxpool 3x3 s1 same ignored", {.n = 1, .h = 5, .w = 6, .c = 3, .kh = 3, .kw = 3, .stride = 1, .same = true, .f = 3}, 0},
    {OP_GAP, "gap", {.n = 3, .h = 5, .w = 3, .c = 7}, 0},
    {OP_GAP, "gap c=131", {.n = 1, .h = 2, .w = 3, .c = 131}, 0},
    {OP_RELU, "relu", {0}, 37},
};
#define NCASES (sizeof CASES / sizeof CASES[0])

/* fp32 forward vs the definition, backward vs finite differences */
static void check_gradients(const tcase *t) {
  layer L;
  layer_init(&L, t, GS_F32);
  double *out = calloc(L.ny + 1, 8), *din = calloc(L.nx + 1, 8), *dw = calloc(L.nw + 1, 8),
         *db = calloc(L.nb + 1, 8), *fd = calloc(L.nx + L.nw + L.nb + 1, 8);
  run_backend(&L, GS_F32, out, din, dw, db);
  ref_forward(&L);
  for (size_t i = 0; i < L.ny; i++)
    expect_close(t->name, "out", i, out[i], L.y[i], 1e-5, 1e-5);
  layer_fd_grad(&L, L.x, L.nx, fd);
  for (size_t i = 0; i < L.nx; i++)
    expect_close(t->name, "din", i, din[i], fd[i], 1e-5, 1e-5);
  layer_fd_grad(&L, L.w, L.nw, fd);
  for (size_t i = 0; i < L.nw; i++)
    expect_close(t->name, "dw", i, dw[i], fd[i], 1e-5, 1e-5);
  layer_fd_grad(&L, L.b, L.nb, fd);
  for (size_t i = 0; i < L.nb; i++)
    expect_close(t->name, "db", i, db[i], fd[i], 1e-5, 1e-5);
  free(out), free(din), free(dw), free(db), free(fd);
  layer_free(&L);
}

TestSuite(kernels, .init = setup_ex, .fini = teardown_ex);

Test(kernels, fp32_forward_and_gradients) {
  for (size_t i = 0; i < NCASES; i++)
    check_gradients(&CASES[i]);
}

/* 16-bit storage vs the fp32 op on the same rounded inputs: the math is
 * fp32 in both, so they differ by the final rounding of each result. */
static void check_low_precision(const tcase *t, gs_dtype dt) {
  layer L;
  layer_init(&L, t, dt);
  double *o16 = calloc(L.ny + 1, 8), *x16 = calloc(L.nx + 1, 8), *w16 = calloc(L.nw + 1, 8),
         *b16 = calloc(L.nb + 1, 8);
  double *o32 = calloc(L.ny + 1, 8), *x32 = calloc(L.nx + 1, 8), *w32 = calloc(L.nw + 1, 8),
         *b32 = calloc(L.nb + 1, 8);
  run_backend(&L, dt, o16, x16, w16, b16);
  run_backend(&L, GS_F32, o32, x32, w32, b32);
  double e = eps_dt(dt), ae = 1e-6;
  char what[96];
  snprintf(what, sizeof what, "%s (%s)", t->name, gs_dtype_name(dt));
  for (size_t i = 0; i < L.ny; i++)
    expect_close(what, "out", i, o16[i], o32[i], ae, e);
  /* overlapping pool windows add in 16 bits, one rounding per window */
  double de = t->op == OP_MAXPOOL ? 4 * e : e;
  for (size_t i = 0; i < L.nx; i++)
    expect_close(what, "din", i, x16[i], x32[i], ae, de);
  for (size_t i = 0; i < L.nw; i++)
    expect_close(what, "dw", i, w16[i], w32[i], 1e-5, 1e-5);
  for (size_t i = 0; i < L.nb; i++)
    expect_close(what, "db", i, b16[i], b32[i], 1e-5, 1e-5);
  free(o16), free(x16), free(w16), free(b16), free(o32), free(x32), free(w32), free(b32);
  layer_free(&L);
}

Test(kernels, fp16_matches_fp32) {
  for (size_t i = 0; i < NCASES; i++)
    check_low_precision(&CASES[i], GS_F16);
}

Test(kernels, bf16_matches_fp32) {
  for (size_t i = 0; i < NCASES; i++)
    check_low_precision(&CASES[i], GS_BF16);
}

/* A layer forward with relu gives the bits of the same forward followed by
 * relu_forward, in every dtype, with and without bias, NaN passing through
 * (x[0] is NaN in every other round). */
static int forward_op(const tcase *t, gs_dtype dt, void *y, const void *x, const void *w,
                      const void *b, void *ws, bool relu) {
  gs_conv_shape s = t->s;
  gs_conv_shape_init(&s);
  switch (t->op) {
  case OP_DENSE: return B->dense_forward(EX, dt, y, x, w, b, s.n, s.c, s.f, ws, relu);
  case OP_CONV: return B->conv2d_forward(EX, dt, y, x, w, b, &s, ws, relu);
  case OP_DW: return B->depthwise_forward(EX, dt, y, x, w, b, &s, ws, relu);
  default: return -EINVAL;
  }
}

static void check_fused_relu(const tcase *t, gs_dtype dt, bool bias, bool nan) {
  layer L;
  layer_init(&L, t, dt);
  if (nan)
    L.x[0] = NAN;
  const size_t es = gs_dtype_size(dt);
  void *x = to_dt(dt, L.x, L.nx), *w = to_dt(dt, L.w, L.nw), *b = to_dt(dt, L.b, L.nb);
  void *want = calloc(L.ny + 1, es), *got = calloc(L.ny + 1, es);
  size_t wsb = t->op == OP_DENSE ? B->dense_workspace(dt, t->s.n, t->s.c, t->s.f)
               : t->op == OP_CONV ? B->conv2d_workspace(dt, &t->s)
                                  : B->depthwise_workspace(dt, &t->s);
  void *ws = ws_alloc(wsb);
  cr_assert_eq(forward_op(t, dt, want, x, w, bias ? b : NULL, ws, false), 0, "%s", t->name);
  cr_assert_eq(B->relu_forward(EX, dt, want, want, L.ny), 0);
  memset(got, 0x5a, L.ny * es); /* every element must be written */
  cr_assert_eq(forward_op(t, dt, got, x, w, bias ? b : NULL, ws, true), 0, "%s", t->name);
  size_t bad = 0;
  for (size_t i = 0; i < L.ny && bad < 3; i++)
    if (memcmp((char *)got + i * es, (char *)want + i * es, es) != 0) {
      cr_expect_fail("%s, %s%s%s: out[%zu] is %g fused, %g by relu_forward after", t->name,
                     gs_dtype_name(dt), bias ? ", bias" : "", nan ? ", a NaN input" : "", i,
                     get_dt(dt, got, i), get_dt(dt, want, i));
      bad++;
    }
  free(x), free(w), free(b), free(want), free(got), free(ws);
  layer_free(&L);
}

Test(kernels, forward_relu_fused_same_bits) {
  static const tcase big[] = { /* GEMMs split over the exec's two threads */
      {OP_DENSE, "dense 128x300->200", {.n = 128, .c = 300, .f = 200}, 0},
      {OP_CONV, "conv 3x3 s1 SAME 16x12x12x8->24", {.n = 16, .h = 12, .w = 12, .c = 8, .kh = 3, .kw = 3, .stride = 1, .same = true, .f = 24}, 0},
      {OP_CONV, "conv 1x1 16x12x12x8->24", {.n = 16, .h = 12, .w = 12, .c = 8, .kh = 1, .kw = 1, .stride = 1, .same = true, .f = 24}, 0},
      {OP_DW, "dw 3x3 s1 SAME 8x10x10x40", {.n = 8, .h = 10, .w = 10, .c = 40, .kh = 3, .kw = 3, .stride = 1, .same = true, .f = 40}, 0},
  };
  const gs_dtype dts[] = {GS_F32, GS_BF16, GS_F16};
  for (size_t i = 0; i < NCASES + sizeof big / sizeof big[0]; i++) {
    const tcase *t = i < NCASES ? &CASES[i] : &big[i - NCASES];
    if (t->op != OP_DENSE && t->op != OP_CONV && t->op != OP_DW)
      continue;
    for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++)
      for (int r = 0; r < 4; r++)
        check_fused_relu(t, dts[d], r & 1, r & 2);
  }
}

Test(kernels, workspace_sizes) {
  gs_conv_shape pw = {.n = 4, .h = 5, .w = 5, .c = 8, .kh = 1, .kw = 1, .stride = 1, .f = 16};
  gs_conv_shape_init(&pw);
  cr_expect_eq(B->dense_workspace(GS_F32, 128, 784, 256), gs_cpu_sparse_workspace(128, 784, 256),
               "fp32 dense: the sparse path's lists, or nothing");
  cr_expect_eq(B->dense_workspace(GS_F32, 128, 128, 10), 0, "too small for the sparse path");
  cr_expect_eq(B->conv2d_workspace(GS_F32, &pw), 4 * 8 * 16,
               "fp32 1x1 conv: w turned for the direct loops' input gradient");
  cr_expect_eq(B->depthwise_workspace(GS_F32, &pw), 0);
  cr_expect_eq(B->dense_workspace(GS_F16, 3, 7, 5), 4 * (3 * 7 + 7 * 5 + 3 * 5));
  gs_conv_shape c3 = {.n = 2, .h = 6, .w = 6, .c = 3, .kh = 3, .kw = 3, .stride = 1, .same = true, .f = 4};
  gs_conv_shape_init(&c3);
  cr_expect_eq(B->conv2d_workspace(GS_F32, &c3), 4 * 2 * 36 * 27,
               "im2col of the batch (F > C: the input gradient gathers dcol back)");
  gs_conv_shape c4 = c3;
  c4.c = 5;
  gs_conv_shape_init(&c4);
  cr_expect_eq(B->conv2d_workspace(GS_F32, &c4), 4 * 2 * 36 * 45,
               "F <= C: the input gradient's im2col of dout (3x3x4 a row) and turned weights "
               "fit in the forward's im2col (3x3x5 a row)");
  gs_conv_shape c3s2 = c3;
  c3s2.stride = 2;
  gs_conv_shape_init(&c3s2);
  cr_expect_eq(B->conv2d_workspace(GS_F32, &c3s2), 4 * 2 * 9 * 27,
               "stride 2: im2col of the batch, for both passes");
  cr_expect_eq(B->conv2d_workspace(GS_BF16, &c3), 4 * (2 * 36 * 27 + 27 * 4 + 2 * 36 * 4));
  cr_expect_eq(B->depthwise_workspace(GS_F16, &c3), 4 * (9 * 3 + 3));
  /* a large batch is taken in chunks, so the workspace stays bounded */
  gs_conv_shape big = {.n = 4096, .h = 32, .w = 32, .c = 32, .kh = 3, .kw = 3, .stride = 1, .same = true, .f = 32};
  gs_conv_shape_init(&big);
  cr_expect_leq(B->conv2d_workspace(GS_F32, &big), (size_t)16 << 20);
}

/* A batch large enough to be split over chunks and threads gives the same
 * result as one image at a time. */
Test(kernels, conv_chunks_and_threads_agree) {
  gs_conv_shape s = {.n = 9, .h = 33, .w = 31, .c = 32, .kh = 3, .kw = 3, .stride = 1, .same = true, .f = 8};
  gs_conv_shape_init(&s);
  gs_conv_shape one = s;
  one.n = 1;
  size_t nin = (size_t)s.n * s.h * s.w * s.c, nw = 9 * 32 * 8, img_out = (size_t)s.oh * s.ow * s.f;
  float *in = malloc(nin * 4), *w = malloc(nw * 4), *out = malloc(s.n * img_out * 4),
        *out1 = malloc(img_out * 4);
  for (size_t i = 0; i < nin; i++)
    in[i] = (float)urand();
  for (size_t i = 0; i < nw; i++)
    w[i] = (float)urand();
  void *ws = ws_alloc(B->conv2d_workspace(GS_F32, &s)), *ws1 = ws_alloc(B->conv2d_workspace(GS_F32, &one));
  cr_assert_lt(B->conv2d_workspace(GS_F32, &s), (size_t)s.n * s.oh * s.ow * 9 * 32 * 4,
               "this batch should need more than one chunk");
  cr_assert_eq(B->conv2d_forward(EX, GS_F32, out, in, w, NULL, &s, ws, false), 0);
  for (uint32_t n = 0; n < s.n; n++) {
    cr_assert_eq(B->conv2d_forward(EX, GS_F32, out1, in + n * (size_t)s.h * s.w * s.c, w, NULL, &one, ws1,
                                     false),
                 0);
    for (size_t i = 0; i < img_out; i++)
      expect_close("chunked conv", "out", n * img_out + i, out[n * img_out + i], out1[i], 1e-5, 1e-5);
  }
  free(ws), free(ws1), free(in), free(w), free(out), free(out1);
}

/* A dense layer's weights (small), bias and output gradient. */
static void fill_dense_operands(float *w, size_t nw, float *b, size_t oc, float *d, size_t no) {
  for (size_t i = 0; i < nw; i++)
    w[i] = (float)urand() * 0.05f;
  for (size_t i = 0; i < oc; i++)
    b[i] = (float)urand();
  for (size_t i = 0; i < no; i++)
    d[i] = (float)urand();
}

/* Split over 2 threads (by columns of the output for the MLP's first layer,
 * by rows for a tall one, din's GEMM beside dw's for a small head), dense
 * forward and backward give what one thread gives: each part's bias rows,
 * the column-split bias gradient, dw, din. */
static void dense_threads_case(uint32_t n, uint32_t c, uint32_t oc) {
  size_t ni = (size_t)n * c, nw = (size_t)c * oc, no = (size_t)n * oc;
  float *in = malloc(ni * 4), *w = malloc(nw * 4), *b = malloc(oc * 4), *d = malloc(no * 4);
  float *o[2], *di[2], *dw[2], *db[2];
  for (int t = 0; t < 2; t++) {
    o[t] = malloc(no * 4), di[t] = malloc(ni * 4);
    dw[t] = calloc(nw, 4), db[t] = calloc(oc, 4);
  }
  for (size_t i = 0; i < ni; i++)
    in[i] = (float)urand();
  fill_dense_operands(w, nw, b, oc, d, no);
  gs_exec *one;
  gs_exec_config cfg = {.threads = 1};
  cr_assert_eq(B->exec_create(B, &cfg, &one), 0);
  gs_exec *ex[2] = {one, EX};
  for (int t = 0; t < 2; t++) {
    cr_assert_eq(B->dense_forward(ex[t], GS_F32, o[t], in, w, b, n, c, oc, NULL, false), 0);
    cr_assert_eq(B->dense_backward(ex[t], GS_F32, di[t], dw[t], db[t], d, in, w, n, c, oc, NULL), 0);
  }
  char what[64];
  snprintf(what, sizeof what, "dense %ux%u->%u, 1 vs 2 threads", n, c, oc);
  for (size_t i = 0; i < no; i++)
    expect_close(what, "out", i, o[1][i], o[0][i], 1e-5, 1e-5);
  for (size_t i = 0; i < ni; i++)
    expect_close(what, "din", i, di[1][i], di[0][i], 1e-5, 1e-5);
  for (size_t i = 0; i < nw; i++)
    expect_close(what, "dw", i, dw[1][i], dw[0][i], 1e-5, 1e-5);
  for (size_t i = 0; i < oc; i++)
    cr_expect_eq(db[1][i], db[0][i], "%s: db[%zu] %g vs %g (summed in the same order)", what, i,
                 (double)db[1][i], (double)db[0][i]);
  B->exec_destroy(one);
  for (int t = 0; t < 2; t++)
    free(o[t]), free(di[t]), free(dw[t]), free(db[t]);
  free(in), free(w), free(b), free(d);
}

Test(kernels, dense_threads_agree) {
  dense_threads_case(128, 784, 256); /* split by columns */
  dense_threads_case(1000, 96, 40);  /* split by rows */
  dense_threads_case(128, 128, 10);  /* a small head: din beside dw and db */
}

/* fp32 dense layers on mostly-zero inputs take cpu_sparse.c's path (a
 * multiply-add per nonzero input): its forward (bias, relu) and weight
 * gradient against double-precision sums, the same bits on 1, 2 and 3
 * threads, and the dense path for an input with too many nonzeros. zero:
 * the share of inputs that are 0 (whole groups of 8 too, as image
 * background gives); the counter says which path ran. */
static void sparse_case(uint32_t n, uint32_t c, uint32_t oc, double zero, bool dense_tail,
                        bool relu, bool want_sparse) {
  size_t ni = (size_t)n * c, nw = (size_t)c * oc, no = (size_t)n * oc;
  float *in = malloc(ni * 4), *w = malloc(nw * 4), *b = malloc(oc * 4), *d = malloc(no * 4);
  for (size_t i = 0; i < ni; i++) {
    bool z = (i / 8) % 5 == 0 ? zero > 0.15 : (urand() + 1) / 2 < zero;
    if (dense_tail && i >= 8 * (size_t)c) /* past the probe's rows: no zeros */
      z = false;
    in[i] = z ? 0.0f : (float)(urand() + 1.5) / 2.5f;
  }
  fill_dense_operands(w, nw, b, oc, d, no);
  size_t wsb = B->dense_workspace(GS_F32, n, c, oc);
  cr_assert(wsb > 0, "dense %ux%u->%u: no workspace for the sparse path", n, c, oc);
  void *ws = ws_alloc(wsb);
  float *o[3], *dw[3];
  gs_exec *ex[3];
  for (int t = 0; t < 3; t++) {
    gs_exec_config cfg = {.threads = t + 1};
    cr_assert_eq(B->exec_create(B, &cfg, &ex[t]), 0);
    o[t] = malloc(no * 4);
    dw[t] = malloc(nw * 4);
    for (size_t i = 0; i < nw; i++)
      dw[t][i] = 0.25f; /* dw accumulates */
    uint64_t before = atomic_load(&gs_cpu_sparse_calls);
    cr_assert_eq(B->dense_forward(ex[t], GS_F32, o[t], in, w, b, n, c, oc, ws, relu), 0);
    cr_assert_eq(B->dense_backward(ex[t], GS_F32, NULL, dw[t], NULL, d, in, w, n, c, oc, ws), 0);
    uint64_t took = atomic_load(&gs_cpu_sparse_calls) - before;
    cr_assert_eq(took, want_sparse ? 2u : 0u,
                 "dense %ux%u->%u, %.0f%% zeros, %d threads: %lu of 2 calls took the sparse "
                 "path, want %d",
                 n, c, oc, zero * 100, t + 1, (unsigned long)took, want_sparse ? 2 : 0);
  }
  char what[80];
  snprintf(what, sizeof what, "dense %ux%u->%u, %.0f%% zeros", n, c, oc, zero * 100);
  for (size_t r = 0; r < n; r++)
    for (size_t j = 0; j < oc; j++) {
      double ref = b[j], mag = fabs(b[j]);
      for (size_t k = 0; k < c; k++) {
        ref += (double)in[r * c + k] * w[k * oc + j];
        mag += fabs((double)in[r * c + k] * w[k * oc + j]);
      }
      if (relu && ref < 0)
        ref = 0;
      expect_close(what, "out", r * oc + j, o[0][r * oc + j], ref, 1e-6 + 4e-7 * mag, 0);
    }
  for (size_t k = 0; k < c; k++)
    for (size_t j = 0; j < oc; j++) {
      double ref = 0.25, mag = 0.25;
      for (size_t r = 0; r < n; r++) {
        ref += (double)in[r * c + k] * d[r * oc + j];
        mag += fabs((double)in[r * c + k] * d[r * oc + j]);
      }
      expect_close(what, "dw", k * oc + j, dw[0][k * oc + j], ref, 1e-6 + 4e-7 * mag, 0);
    }
  if (want_sparse) /* the split never changes the order of a sum */
    for (int t = 1; t < 3; t++) {
      cr_assert(memcmp(o[t], o[0], no * 4) == 0, "%s: out differs on %d threads", what, t + 1);
      cr_assert(memcmp(dw[t], dw[0], nw * 4) == 0, "%s: dw differs on %d threads", what, t + 1);
    }
  for (int t = 0; t < 3; t++)
    B->exec_destroy(ex[t]), free(o[t]), free(dw[t]);
  free(ws), free(in), free(w), free(b), free(d);
}

Test(kernels, sparse_input_dense_layer) {
  if (gs_cpu_sparse_workspace(128, 784, 256) == 0)
    cr_skip_test("the sparse path needs x86-64 (AVX2); the dense path runs everywhere else");
  if (gs_cpu_isa() < GS_CPU_ISA_AVX2)
    cr_skip_test("this CPU lacks AVX2 or FMA, or GS_CPU_ISA=baseline: dense layers run the "
                 "dense path only");
  sparse_case(128, 784, 256, 0.5, false, true, true);  /* fashion-mlp's first layer */
  sparse_case(37, 300, 100, 0.6, false, false, true);  /* odd sizes, a narrow last tile */
  sparse_case(9, 1030, 130, 0.8, false, true, true);   /* c off the blocks of 8 and 128 */
  sparse_case(300, 200, 64, 0.6, false, false, true);  /* the gradient in 3 blocks of n */
  sparse_case(64, 200, 96, 0.0, false, false, false);  /* all nonzero: the probe refuses */
  /* 64% nonzero: past the probe (80%), the count after listing sends both
   * calls to the dense GEMM; and the same from sparse first rows, 93% */
  sparse_case(64, 200, 96, 0.2, false, false, false);
  sparse_case(64, 200, 96, 0.6, true, false, false);
}

/* Zeros skip even an infinite weight (documented in cpu_sparse.c); a NaN
 * or infinite input is a nonzero and propagates as in the dense path. */
Test(kernels, sparse_path_non_finite) {
  if (gs_cpu_sparse_workspace(64, 256, 64) == 0 || gs_cpu_isa() < GS_CPU_ISA_AVX2)
    cr_skip_test("no sparse path here (x86-64 with AVX2 and FMA only, not GS_CPU_ISA=baseline)");
  uint32_t n = 64, c = 256, oc = 64;
  float *in = calloc((size_t)n * c, 4), *w = malloc((size_t)c * oc * 4), *o = malloc((size_t)n * oc * 4);
  for (size_t i = 0; i < (size_t)c * oc; i++)
    w[i] = 0.5f;
  w[3 * oc + 7] = INFINITY; /* row 3 of w: pixel 3 */
  for (uint32_t r = 0; r < n; r++)
    in[r * c + 10] = 1.0f; /* every row: pixel 10 only */
  in[5 * c + 3] = 2.0f;      /* row 5 also has pixel 3 */
  in[6 * c + 20] = NAN;      /* row 6: a NaN input */
  void *ws = ws_alloc(B->dense_workspace(GS_F32, n, c, oc));
  uint64_t before = atomic_load(&gs_cpu_sparse_calls);
  cr_assert_eq(B->dense_forward(EX, GS_F32, o, in, w, NULL, n, c, oc, ws, false), 0);
  cr_assert_eq(atomic_load(&gs_cpu_sparse_calls) - before, 1u, "the sparse path ran");
  cr_expect_eq(o[0 * oc + 7], 0.5f, "a zero input adds nothing against an inf weight");
  cr_expect(isinf(o[5 * oc + 7]), "a nonzero input meets the inf weight: %g", (double)o[5 * oc + 7]);
  cr_expect(isnan(o[6 * oc + 0]), "a NaN input propagates: %g", (double)o[6 * oc]);
  /* the weight gradient: dout is 1 except an inf in row 0, whose only
   * nonzero input is pixel 10 */
  float *d = malloc((size_t)n * oc * 4), *dw = calloc((size_t)c * oc, 4);
  for (size_t i = 0; i < (size_t)n * oc; i++)
    d[i] = 1.0f;
  d[0 * oc + 7] = INFINITY;
  before = atomic_load(&gs_cpu_sparse_calls);
  cr_assert_eq(B->dense_backward(EX, GS_F32, NULL, dw, NULL, d, in, w, n, c, oc, ws), 0);
  cr_assert_eq(atomic_load(&gs_cpu_sparse_calls) - before, 1u, "the sparse path ran");
  cr_expect(isinf(dw[10 * oc + 7]), "pixel 10 meets the inf: %g", (double)dw[10 * oc + 7]);
  cr_expect_eq(dw[3 * oc + 7], 2.0f, "pixel 3 (row 5 only) skips row 0's inf: %g",
               (double)dw[3 * oc + 7]);
  cr_expect(isnan(dw[20 * oc + 1]), "the NaN input reaches dw: %g", (double)dw[20 * oc + 1]);
  free(ws), free(in), free(w), free(o), free(d), free(dw);
}

/* gs_cpu_sgemm with beta 0 clears C itself (memset) and has OpenBLAS add
 * A.B into the zeros. On one thread (one part, one cblas_sgemm) with A or B
 * transposed that must be OpenBLAS's own beta-0 result bit for bit,
 * whatever C held, NaN included; split over two, each part is its own
 * OpenBLAS call (whose rounding can differ in the last bit from one call over
 * the whole), and a non-transposed beta-0 call may take AVX-512 OpenBLAS's
 * separate small-matrix kernel (sgemm_direct), so there the check is the
 * value. Nothing outside C's columns (ldc > n) may change. */
static void sgemm_beta0_case(gs_exec *ex, bool exact, bool ta, bool tb, size_t m, size_t n,
                             size_t k) {
  const size_t ldc = n + 3, lda = ta ? m : k, ldb = tb ? k : n;
  float *a = malloc(m * k * 4), *b = malloc(k * n * 4);
  float *ours = malloc(m * ldc * 4), *ref = malloc(m * ldc * 4);
  cr_assert(a && b && ours && ref);
  for (size_t i = 0; i < m * k; i++)
    a[i] = (float)urand();
  for (size_t i = 0; i < k * n; i++)
    b[i] = (float)urand();
  for (size_t i = 0; i < m * ldc; i++)
    ours[i] = ref[i] = i % ldc >= n ? (float)i : (i % 7 ? (float)urand() : NAN);
  gs_cpu_sgemm(ex, ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, ours, ldc);
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              (blasint)m, (blasint)n, (blasint)k, 1.0f, a, (blasint)lda, b, (blasint)ldb, 0.0f,
              ref, (blasint)ldc);
  char what[64];
  snprintf(what, sizeof what, "%zux%zux%zu%s%s beta 0", m, n, k, ta ? " A^T" : "",
           tb ? " B^T" : "");
  size_t bad = 0;
  for (size_t i = 0; i < m * ldc && bad < 5; i++) {
    bool same = memcmp(&ours[i], &ref[i], 4) == 0;
    if (!exact && i % ldc < n && !same) {
      expect_close(what, "C", i, ours[i], ref[i], 1e-5, 1e-5);
      continue;
    }
    if (same)
      continue;
    cr_expect_fail("%s: C[%zu][%zu] is %a, OpenBLAS's gives %a", what, i / ldc, i % ldc,
                   (double)ours[i], (double)ref[i]);
    bad++;
  }
  free(a), free(b), free(ours), free(ref);
}

Test(kernels, sgemm_beta0_overwrites_c) {
  gs_exec *one;
  gs_exec_config cfg = {.threads = 1};
  cr_assert_eq(B->exec_create(B, &cfg, &one), 0);
  for (int t = 0; t < 2; t++) {
    gs_exec *ex = t ? EX : one;
    sgemm_beta0_case(ex, !t, false, true, 128, 256, 128); /* dense din: split in two */
    sgemm_beta0_case(ex, !t, false, true, 128, 128, 10);  /* a head's din: one part */
    sgemm_beta0_case(ex, !t, true, false, 1000, 96, 40);  /* split by rows */
    sgemm_beta0_case(ex, false, false, false, 3, 5, 7);
    sgemm_beta0_case(ex, !t, true, true, 3, 5, 7);
  }
  B->exec_destroy(one);
}

/* The per-step device timer (backend.h): the exec's own work is charged,
 * time it spends off the cores is not. */
static double thread_cpu_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

Test(kernels, timer_charges_work_not_waiting) {
  cr_assert_not_null(B->timer_start);
  cr_assert_not_null(B->timer_stop);
  double s = -1;
  cr_assert_eq(B->timer_start(EX), 0);
  struct timespec nap = {0, 100000000}; /* 100 ms off the cores */
  nanosleep(&nap, NULL);
  cr_assert_eq(B->timer_stop(EX, &s), 0);
  cr_expect(s >= 0 && s < 0.02, "a 100 ms sleep was charged %.4f s", s);

  uint32_t n = 128, c = 784, oc = 256;
  float *in = calloc((size_t)n * c, 4), *w = calloc((size_t)c * oc, 4);
  float *out = malloc((size_t)n * oc * 4);
  cr_assert(in && w && out);
  double own0 = thread_cpu_s();
  cr_assert_eq(B->timer_start(EX), 0);
  for (int i = 0; i < 20; i++)
    cr_assert_eq(B->dense_forward(EX, GS_F32, out, in, w, NULL, n, c, oc, NULL, false), 0);
  cr_assert_eq(B->timer_stop(EX, &s), 0);
  double own = thread_cpu_s() - own0;
  /* The job's thread plus its pool workers: at least the thread's own share. */
  cr_expect(s > 0 && s >= own * 0.999, "20 GEMMs charged %.4f s, the calling thread alone %.4f s",
            s, own);
  free(in), free(w), free(out);
}

/* ---- cross-entropy ---- */

static void xent_ref(const float *x, int32_t lab, uint32_t k, double *loss, double *p) {
  double mx = x[0];
  for (uint32_t j = 1; j < k; j++)
    mx = fmax(mx, x[j]);
  double s = 0;
  for (uint32_t j = 0; j < k; j++)
    s += exp((double)x[j] - mx);
  *loss = log(s) - ((double)x[lab] - mx);
  for (uint32_t j = 0; j < k; j++)
    p[j] = exp((double)x[j] - mx) / s;
}

Test(kernels, xent_against_double) {
  enum { N = 5, K = 7 };
  float x[N * K], d[N * K], loss[N];
  int32_t lab[N] = {0, 6, 3, 2, 5}, pred[N];
  for (int i = 0; i < N * K; i++)
    x[i] = (float)(urand() * 4);
  /* huge logits: a naive exp overflows; a stable one stays exact */
  float huge[K] = {1000.0f, -1000.0f, 500.0f, 999.0f, 0.0f, -50.0f, 998.5f};
  memcpy(x + 4 * K, huge, sizeof huge);
  x[2 * K + 1] = x[2 * K + 4] = 30.0f; /* a tie: the first one is the prediction */
  float scale = 8.0f, norm = 4.0f;
  cr_assert_eq(B->xent_forward_backward(EX, loss, pred, d, x, lab, N, K, &scale, norm), 0);
  for (int i = 0; i < N; i++) {
    double l, p[K];
    xent_ref(x + i * K, lab[i], K, &l, p);
    cr_expect(isfinite(loss[i]), "row %d loss %g", i, loss[i]);
    expect_close("xent", "loss", (size_t)i, loss[i], l, 1e-5, 1e-5);
    int arg = 0;
    for (int j = 1; j < K; j++)
      if (x[i * K + j] > x[i * K + arg])
        arg = j;
    cr_expect_eq(pred[i], arg, "row %d", i);
    for (int j = 0; j < K; j++) {
      double want = (p[j] - (j == lab[i])) * scale / norm;
      expect_close("xent", "dlogits", (size_t)(i * K + j), d[i * K + j], want, 1e-6, 1e-5);
    }
  }
  cr_expect_eq(pred[2], 1, "first of the tied maxima");
  cr_expect_eq(pred[4], 0);
  /* label 5 of the huge row: 1000 + log(1 + e^-1 + e^-1.5 + ...) + 50 */
  double l4, p4[K];
  xent_ref(huge, 5, K, &l4, p4);
  cr_expect(fabs(l4 - 1050.4643687841080) < 1e-6, "reference itself: %.12f", l4);
  /* without dlogits and pred */
  float loss2[N];
  cr_assert_eq(B->xent_forward_backward(EX, loss2, NULL, NULL, x, lab, N, K, NULL, 1.0f), 0);
  for (int i = 0; i < N; i++)
    cr_expect_eq(loss2[i], loss[i]);
  /* a label out of range, even after good rows: refused, nothing written */
  int32_t bad[N] = {0, 0, 0, 7, 0};
  float kept[N];
  for (int i = 0; i < N; i++)
    kept[i] = loss2[i] = -1.0f;
  cr_expect_eq(B->xent_forward_backward(EX, loss2, NULL, NULL, x, bad, N, K, NULL, 1.0f), -EINVAL);
  cr_expect_arr_eq(loss2, kept, sizeof kept, "loss written for a batch with a bad label");
  bad[3] = -1;
  cr_expect_eq(B->xent_forward_backward(EX, loss2, NULL, NULL, x, bad, N, K, NULL, 1.0f), -EINVAL);
}

/* Rows split over the exec's threads give the bits of one thread: each row
 * is computed whole, by one thread, the same way. */
Test(kernels, xent_split_over_threads_same_bits) {
  if (EX->nworkers < 1) /* exec_create clamps threads to the CPUs it may use */
    cr_skip_test("the 2-thread exec has no worker on this 1-CPU machine: nothing is split");
  enum { N = 301, K = 10 };
  static float x[N * K], d[2][N * K], loss[2][N];
  int32_t lab[N], pred[2][N];
  for (int i = 0; i < N * K; i++)
    x[i] = (float)(urand() * 8 - 4);
  for (int i = 0; i < N; i++)
    lab[i] = (int32_t)(i * 7 % K);
  gs_exec *one;
  gs_exec_config cfg = {.threads = 1};
  cr_assert_eq(B->exec_create(B, &cfg, &one), 0);
  gs_exec *ex[2] = {one, EX};
  float scale = 4.0f;
  for (int t = 0; t < 2; t++)
    cr_assert_eq(B->xent_forward_backward(ex[t], loss[t], pred[t], d[t], x, lab, N, K, &scale,
                                          128.0f), 0);
  cr_expect_arr_eq(loss[1], loss[0], sizeof loss[0]);
  cr_expect_arr_eq(pred[1], pred[0], sizeof pred[0]);
  cr_expect_arr_eq(d[1], d[0], sizeof d[0]);
  B->exec_destroy(one);
}

/* dlogits with scale 1, norm 1 is the gradient of the summed loss */
Test(kernels, xent_gradient_is_finite_difference) {
  enum { N = 3, K = 5 };
  float x[N * K], d[N * K], loss[N];
  int32_t lab[N] = {4, 0, 2};
  for (int i = 0; i < N * K; i++)
    x[i] = (float)(urand() * 3);
  float one = 1.0f;
  cr_assert_eq(B->xent_forward_backward(EX, loss, NULL, d, x, lab, N, K, &one, 1.0f), 0);
  for (int i = 0; i < N; i++)
    for (int j = 0; j < K; j++) {
      double xd[K], lp, lm, p[K];
      float xf[K];
      for (int q = 0; q < K; q++)
        xd[q] = x[i * K + q];
      const double h = 1e-3;
      xd[j] += h;
      for (int q = 0; q < K; q++)
        xf[q] = (float)xd[q];
      xent_ref(xf, lab[i], K, &lp, p);
      xd[j] -= 2 * h;
      for (int q = 0; q < K; q++)
        xf[q] = (float)xd[q];
      xent_ref(xf, lab[i], K, &lm, p);
      expect_close("xent fd", "dlogits", (size_t)(i * K + j), d[i * K + j], (lp - lm) / (2 * h), 1e-4, 1e-3);
    }
}

/* ---- casts ---- */

Test(kernels, casts_are_bit_exact) {
  enum { N = 1031 }; /* odd: the vector loops' tails run too */
  float f[N], back[N];
  uint16_t h[N], h2[N];
  for (int i = 0; i < N; i++) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    uint32_t bits = (uint32_t)(rng_state >> 32);
    if (i % 4 == 1) /* many near the fp16 range, subnormals included */
      bits = (bits & 0x87ffffffu) | 0x30000000u;
    memcpy(&f[i], &bits, 4);
  }
  f[0] = NAN, f[1] = INFINITY, f[2] = -0.0f, f[3] = 65520.0f, f[5] = 0x1p-25f;
  cr_assert_eq(B->cast(EX, h, GS_F16, f, GS_F32, N), 0);
  for (int i = 0; i < N; i++)
    cr_assert_eq(h[i], gs_f32_to_f16(f[i]), "f32->f16 [%d] %a", i, f[i]);
  cr_assert_eq(B->cast(EX, back, GS_F32, h, GS_F16, N), 0);
  for (int i = 0; i < N; i++) {
    float want = gs_f16_to_f32(h[i]);
    cr_assert(memcmp(&back[i], &want, 4) == 0, "f16->f32 [%d]", i);
  }
  cr_assert_eq(B->cast(EX, h, GS_BF16, f, GS_F32, N), 0);
  for (int i = 0; i < N; i++)
    cr_assert_eq(h[i], gs_f32_to_bf16(f[i]), "f32->bf16 [%d] %a", i, f[i]);
  cr_assert_eq(B->cast(EX, back, GS_F32, h, GS_BF16, N), 0);
  for (int i = 0; i < N; i++) {
    float want = gs_bf16_to_f32(h[i]);
    cr_assert(memcmp(&back[i], &want, 4) == 0, "bf16->f32 [%d]", i);
  }
  cr_assert_eq(B->cast(EX, h2, GS_F16, h, GS_BF16, N), 0);
  for (int i = 0; i < N; i++)
    cr_assert_eq(h2[i], gs_f32_to_f16(gs_bf16_to_f32(h[i])), "bf16->f16 [%d]", i);
  cr_assert_eq(B->cast(EX, back, GS_F32, f, GS_F32, N), 0);
  cr_assert(memcmp(back, f, sizeof f) == 0);
}

/* ---- mixed precision bookkeeping ---- */

Test(kernels, unscale_check) {
  float g[5] = {2, 4, -8, 1, 0.5f}, scale = 2.0f;
  int32_t found = 0;
  cr_assert_eq(B->unscale_check(EX, g, 5, &scale, &found), 0);
  float want[5] = {1, 2, -4, 0.5f, 0.25f};
  for (int i = 0; i < 5; i++)
    cr_expect_eq(g[i], want[i]);
  cr_expect_eq(found, 0);
  g[3] = INFINITY;
  cr_assert_eq(B->unscale_check(EX, g, 5, &scale, &found), 0);
  cr_expect_eq(found, 1, "inf");
  found = 0;
  g[3] = NAN;
  cr_assert_eq(B->unscale_check(EX, g, 5, &scale, &found), 0);
  cr_expect_eq(found, 1, "NaN");
  g[3] = 1.0f;
  cr_assert_eq(B->unscale_check(EX, g, 5, &scale, &found), 0);
  cr_expect_eq(found, 1, "never cleared by unscale_check");
  /* a large array, split over threads, with one bad element at the end */
  size_t n = 1 << 20;
  float *big = malloc(n * 4);
  for (size_t i = 0; i < n; i++)
    big[i] = 3.0f;
  big[n - 1] = -INFINITY;
  found = 0;
  scale = 4.0f;
  cr_assert_eq(B->unscale_check(EX, big, n, &scale, &found), 0);
  cr_expect_eq(found, 1);
  cr_expect_eq(big[12345], 0.75f);
  free(big);
}

Test(kernels, loss_scale_update) {
  float scale = 1024.0f;
  int32_t good = 7, found = 1;
  int64_t skipped = 3;
  cr_assert_eq(B->loss_scale_update(EX, &scale, &good, &found, &skipped, 2000), 0);
  cr_expect_eq(scale, 512.0f, "halved on overflow");
  cr_expect_eq(good, 0);
  cr_expect_eq(skipped, 4);
  cr_expect_eq(found, 0, "found_inf cleared");
  scale = 1.5f, found = 1;
  B->loss_scale_update(EX, &scale, &good, &found, &skipped, 2000);
  cr_expect_eq(scale, 1.0f, "not below 1");
  found = 1;
  B->loss_scale_update(EX, &scale, &good, &found, &skipped, 2000);
  cr_expect_eq(scale, 1.0f);
  cr_expect_eq(skipped, 6);
  scale = 32768.0f, good = 1998;
  B->loss_scale_update(EX, &scale, &good, &found, &skipped, 2000);
  cr_expect_eq(good, 1999);
  cr_expect_eq(scale, 32768.0f);
  B->loss_scale_update(EX, &scale, &good, &found, &skipped, 2000);
  cr_expect_eq(scale, 65536.0f, "doubled after growth_interval finite steps");
  cr_expect_eq(good, 0);
  cr_expect_eq(skipped, 6);
}

Test(kernels, loss_scale_stops_at_its_maximum) {
  /* A job whose gradients never overflow grows its scale every interval:
   * it must stop at GS_LOSS_SCALE_MAX, never reach +inf (1/inf would zero
   * every gradient, and inf * 0.5 never comes back). */
  float scale = 1.0f;
  int32_t good = 0, found = 0;
  int64_t skipped = 0;
  for (int i = 0; i < 300; i++)
    cr_assert_eq(B->loss_scale_update(EX, &scale, &good, &found, &skipped, 1), 0);
  cr_expect_eq(scale, GS_LOSS_SCALE_MAX, "scale %g after 300 growths", scale);
  cr_expect(isfinite(1.0f / scale) && 1.0f / scale > 0.0f);
  scale = GS_LOSS_SCALE_MAX * 0.75f;
  B->loss_scale_update(EX, &scale, &good, &found, &skipped, 1);
  cr_expect_eq(scale, GS_LOSS_SCALE_MAX, "a doubling past the maximum stops at it");
  found = 1;
  B->loss_scale_update(EX, &scale, &good, &found, &skipped, 1);
  cr_expect_eq(scale, GS_LOSS_SCALE_MAX * 0.5f, "an overflow still halves it");
  cr_expect_eq(skipped, 1);
}

/* ---- optimizers ---- */

Test(kernels, sgd_hand_computed) {
  /* g' = 0.5 + 0.01*1 = 0.51; m = 0.9*0.2 + 0.51 = 0.69. Every step
   * consumes the gradient: g is 0 after it, skipped or not. */
  float w = 1.0f, g = 0.5f, m = 0.2f;
  cr_assert_eq(B->sgd_step(EX, &w, &g, &m, 1, 0.1f, 0.9f, false, 0.01f, NULL), 0);
  cr_expect(fabsf(w - 0.931f) < 1e-6f, "momentum: %.9g", w);
  cr_expect(fabsf(m - 0.69f) < 1e-6f, "m: %.9g", m);
  cr_expect(g == 0.0f && !signbit(g), "g consumed: %g", g);
  w = 1.0f, m = 0.2f, g = 0.5f;
  cr_assert_eq(B->sgd_step(EX, &w, &g, &m, 1, 0.1f, 0.9f, true, 0.01f, NULL), 0);
  cr_expect(fabsf(w - 0.8869f) < 1e-6f, "nesterov: %.9g", w); /* 1 - 0.1*(0.51 + 0.9*0.69) */
  cr_expect(g == 0.0f);
  w = 1.0f, g = 0.5f;
  cr_assert_eq(B->sgd_step(EX, &w, &g, NULL, 1, 0.1f, 0.0f, false, 0.01f, NULL), 0);
  cr_expect(fabsf(w - 0.949f) < 1e-6f, "plain: %.9g", w);
  cr_expect(g == 0.0f);
  int32_t skip = 1;
  w = 1.0f, m = 0.2f, g = INFINITY;
  cr_assert_eq(B->sgd_step(EX, &w, &g, &m, 1, 0.1f, 0.9f, false, 0.01f, &skip), 0);
  cr_expect(w == 1.0f && m == 0.2f, "skip leaves weights and momentum");
  cr_expect(g == 0.0f, "a skipped step clears the overflowed gradient: %g", g);
  skip = 0, g = 0.5f;
  cr_assert_eq(B->sgd_step(EX, &w, &g, &m, 1, 0.1f, 0.9f, false, 0.01f, &skip), 0);
  cr_expect(fabsf(w - 0.931f) < 1e-6f);
  /* momentum without a buffer: refused, nothing consumed */
  g = 0.5f;
  cr_expect_eq(B->sgd_step(EX, &w, &g, NULL, 1, 0.1f, 0.9f, false, 0.01f, NULL), -EINVAL);
  cr_expect(g == 0.5f);
}

Test(kernels, adam_hand_computed) {
  /* t = 3, b1 0.9, b2 0.999, lr 0.01, wd 0.1, eps 1e-8; w 1.5, g -0.2,
   * m 0.1, v 0.01. Adam: g' = -0.05, m = 0.085, v = 0.0099925,
   * w = 1.49828226566. AdamW: m = 0.07, v = 0.01003, w = 1.49708804218. */
  float w = 1.5f, g = -0.2f, m = 0.1f, v = 0.01f;
  cr_assert_eq(B->adam_step(EX, &w, &g, &m, &v, 1, 0.01f, 0.9f, 0.999f, 1e-8f, 0.1f, false, 3, NULL), 0);
  cr_expect(fabsf(m - 0.085f) < 1e-7f, "m %.9g", m);
  cr_expect(fabsf(v - 0.0099925f) < 1e-8f, "v %.9g", v);
  cr_expect(fabs(w - 1.4982822656599715) < 2e-6, "adam w %.9g", w);
  cr_expect(g == 0.0f && !signbit(g), "g consumed: %g", g);
  w = 1.5f, m = 0.1f, v = 0.01f, g = -0.2f;
  cr_assert_eq(B->adam_step(EX, &w, &g, &m, &v, 1, 0.01f, 0.9f, 0.999f, 1e-8f, 0.1f, true, 3, NULL), 0);
  cr_expect(fabsf(m - 0.07f) < 1e-7f, "m %.9g", m);
  cr_expect(fabsf(v - 0.01003f) < 1e-8f, "v %.9g", v);
  cr_expect(fabs(w - 1.4970880421763182) < 2e-6, "adamw w %.9g", w);
  cr_expect(g == 0.0f);
  /* first step: the bias correction makes the update lr * sign(g) */
  float w1[3] = {0, 0, 0}, g1[3] = {0.3f, -2.0f, 1e-3f}, m1[3] = {0}, v1[3] = {0};
  cr_assert_eq(B->adam_step(EX, w1, g1, m1, v1, 3, 0.1f, 0.9f, 0.999f, 1e-8f, 0.0f, false, 1, NULL), 0);
  cr_expect(fabsf(w1[0] + 0.1f) < 1e-5f && fabsf(w1[1] - 0.1f) < 1e-5f && fabsf(w1[2] + 0.1f) < 1e-4f,
            "%g %g %g", w1[0], w1[1], w1[2]);
  cr_expect(g1[0] == 0.0f && g1[1] == 0.0f && g1[2] == 0.0f);
  int32_t skip = 1;
  float ws = 2.0f, ms = 0.5f, vs = 0.25f;
  g = NAN;
  cr_assert_eq(B->adam_step(EX, &ws, &g, &ms, &vs, 1, 0.1f, 0.9f, 0.999f, 1e-8f, 0.1f, true, 5, &skip), 0);
  cr_expect(ws == 2.0f && ms == 0.5f && vs == 0.25f, "skip leaves w, m and v");
  cr_expect(g == 0.0f, "a skipped step clears the overflowed gradient: %g", g);
  /* t = 0: refused, nothing consumed */
  g = -0.2f;
  cr_expect_eq(B->adam_step(EX, &ws, &g, &ms, &vs, 1, 0.1f, 0.9f, 0.999f, 1e-8f, 0.1f, true, 0, NULL), -EINVAL);
  cr_expect(g == -0.2f);
}

/* ---- device, memory, execs ---- */

/* Whether addr lies in a mapping of this process; *end: that mapping's end
 * (adjacent mappings with the same rights may be listed apart, so a span
 * that continues is followed). */
static bool mapped_span(uintptr_t addr, uintptr_t *end) {
  FILE *f = fopen("/proc/self/maps", "r");
  cr_assert_not_null(f);
  unsigned long a, b;
  char line[512];
  bool in = false;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "%lx-%lx", &a, &b) == 2) {
      if (!in && addr >= a && addr < b) {
        in = true;
        *end = b;
      } else if (in && a == *end) {
        *end = b;
      }
    }
  fclose(f);
  return in;
}

Test(kernels, memory_and_execs) {
  uint64_t total = 0, avail = 0;
  cr_assert_eq(B->device_memory(B, 0, &total, &avail), 0);
  cr_expect_gt(total, 0);
  cr_expect_leq(avail, total);
  void *r = NULL;
  cr_assert_eq(B->region_reserve(B, 0, 1 << 20, &r), 0);
  memset(r, 0xab, 1 << 20);
  cr_expect_eq(((unsigned char *)r)[(1 << 20) - 1], 0xab);
  B->region_release(B, 0, r, 1 << 20);
  /* 2 MiB and more: on a 2 MiB boundary (huge pages), every byte of an odd
   * length usable and mapped, and the region released whole (both by
   * /proc/self/maps); twice */
  for (int rep = 0; rep < 2; rep++) {
    size_t big = ((size_t)5 << 20) + 12345, page = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t end = 0;
    cr_assert_eq(B->region_reserve(B, 0, big, &r), 0);
    uintptr_t lo = (uintptr_t)r, hi = lo + (big + page - 1) / page * page;
    cr_expect_eq(lo % ((uintptr_t)2 << 20), 0, "region %p not 2 MiB aligned", r);
    memset(r, 0xcd, big);
    cr_expect_eq(((unsigned char *)r)[big - 1], 0xcd);
    cr_expect(mapped_span(lo, &end) && end >= hi, "region not one mapping to its end");
    B->region_release(B, 0, r, big);
    cr_expect(!mapped_span(lo, &end) && !mapped_span(hi - 1, &end), "region still mapped");
  }
  cr_expect_eq(B->region_reserve(B, 0, (size_t)1 << 60, &r), -ENOMEM);
  cr_expect_eq(B->region_reserve(B, 0, 0, &r), -EINVAL);
  gs_exec *ex;
  gs_exec_config bad = {.threads = 0};
  cr_expect_eq(B->exec_create(B, &bad, &ex), -EINVAL);
  gs_exec_config many = {.threads = 64};
  cr_assert_eq(B->exec_create(B, &many, &ex), 0, "more threads than cores is clamped");
  float a[4] = {1, 2, 3, 4}, c[4];
  cr_expect_eq(B->copy_in(ex, c, a, sizeof a), 0);
  cr_expect_eq(B->synchronize(ex), 0);
  cr_expect(memcmp(a, c, sizeof a) == 0);
  cr_expect_eq(B->zero(ex, c, sizeof c), 0);
  cr_expect_eq(c[3], 0.0f);
  B->exec_destroy(ex);
  cr_expect_str_eq(B->name, "cpu");
}

/* Two jobs, each with its own exec, running GEMMs at the same time (the
 * executor's situation): each gets the result it gets alone. */
struct job_arg {
  const float *in, *w, *want;
  float *out;
  int bad;
};

static void *job_main(void *p) {
  struct job_arg *a = p;
  gs_exec *ex;
  gs_exec_config cfg = {.threads = 2};
  if (B->exec_create(B, &cfg, &ex))
    return (a->bad = 1, NULL);
  for (int r = 0; r < 20; r++) {
    B->dense_forward(ex, GS_F32, a->out, a->in, a->w, NULL, 64, 300, 200, NULL, false);
    if (memcmp(a->out, a->want, 64 * 200 * sizeof(float)))
      a->bad = 1;
  }
  B->exec_destroy(ex);
  return NULL;
}

Test(kernels, concurrent_execs) {
  size_t nin = 64 * 300, nw = 300 * 200, nout = 64 * 200;
  struct job_arg a[2];
  pthread_t t[2];
  for (int j = 0; j < 2; j++) {
    float *in = malloc(nin * 4), *w = malloc(nw * 4), *want = malloc(nout * 4);
    for (size_t i = 0; i < nin; i++)
      in[i] = (float)urand();
    for (size_t i = 0; i < nw; i++)
      w[i] = (float)urand();
    cr_assert_eq(B->dense_forward(EX, GS_F32, want, in, w, NULL, 64, 300, 200, NULL, false), 0);
    a[j] = (struct job_arg){.in = in, .w = w, .want = want, .out = malloc(nout * 4)};
  }
  for (int j = 0; j < 2; j++)
    pthread_create(&t[j], NULL, job_main, &a[j]);
  for (int j = 0; j < 2; j++) {
    pthread_join(t[j], NULL);
    cr_expect_eq(a[j].bad, 0, "job %d saw a different result", j);
    free((void *)a[j].in), free((void *)a[j].w), free((void *)a[j].want), free(a[j].out);
  }
}

/* The cpu pool's placement fix (cpu_backend.c, leave_poster_cpu): a worker
 * woken on the core its job thread posted the range from moves to another
 * core it may use, then has its whole set back. The worker is held on the
 * poster's core by affinity while it sleeps, which is where Linux's wake-up
 * placement put it when jobs of several vdevs took turns. */
struct where {
  int cpu[2];
};

static void record_cpu(void *ctx, size_t lo, size_t hi) {
  struct where *w = ctx;
  for (size_t i = lo; i < hi; i++)
    w->cpu[i] = sched_getcpu();
}

Test(kernels, pool_worker_leaves_its_posters_core) {
  cpu_set_t all;
  cr_assert_eq(sched_getaffinity(0, sizeof all, &all), 0);
  if (CPU_COUNT(&all) < 2)
    cr_skip_test("needs two CPUs in this process's affinity set, it has %d", CPU_COUNT(&all));
  int here = -1;
  for (int c = 0; c < CPU_SETSIZE && here < 0; c++)
    if (CPU_ISSET(c, &all)) here = c;
  gs_exec *ex;
  gs_exec_config cfg = {.threads = 2};
  cr_assert_eq(B->exec_create(B, &cfg, &ex), 0); /* its worker starts with all of `all` */
  cr_assert_eq(ex->nworkers, 1);
  pthread_t self = pthread_self(), worker = ex->workers[0].tid;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(here, &one);
  cpu_set_t mine;
  cr_assert_eq(pthread_getaffinity_np(self, sizeof mine, &mine), 0);
  cr_assert_eq(pthread_setaffinity_np(self, sizeof one, &one), 0);
  for (int trial = 0; trial < 3; trial++) {
    cr_assert_eq(pthread_setaffinity_np(worker, sizeof one, &one), 0);
    /* The worker spins 50 us, then sleeps: wait until it does (on a busy
     * machine that takes more than any fixed nap), so the range below
     * wakes it rather than finding it still spinning. */
    struct timespec nap = {0, 1000000};
    for (int ms = 0; atomic_load(&ex->sleepers) == 0 && ms < 5000; ms++) nanosleep(&nap, NULL);
    cr_assert_gt(atomic_load(&ex->sleepers), 0, "trial %d: the worker never went to sleep", trial);
    struct where w = {{-1, -1}};
    gs_cpu_parallel(ex, 2, 1, record_cpu, &w);
    cr_expect_eq(w.cpu[0], here, "trial %d: the job's thread ran on CPU %d, pinned to %d", trial,
                 w.cpu[0], here);
    cr_expect_neq(w.cpu[1], here,
                  "trial %d: the worker ran its part on CPU %d, the core its job thread posted "
                  "from", trial, w.cpu[1]);
    cpu_set_t now;
    cr_assert_eq(pthread_getaffinity_np(worker, sizeof now, &now), 0);
    cr_expect(CPU_EQUAL(&now, &all), "trial %d: the worker kept a narrowed CPU set (%d of %d CPUs)",
              trial, CPU_COUNT(&now), CPU_COUNT(&all));
  }
  pthread_setaffinity_np(self, sizeof mine, &mine);
  B->exec_destroy(ex);
}
