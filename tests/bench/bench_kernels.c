/*
 * bench_kernels.c: how fast the cpu backend runs the layers gpushare's
 * benchmark models are made of, per exec thread count. Prints minimum and median
 * milliseconds over repeated runs; it asserts nothing (timings belong in a
 * report, not in a test). The minimum is the figure to quote on a shared
 * machine; the median shows how much others were running.
 *   bench_kernels [threads]   (default: 1 and every count up to the cores)
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cblas.h>
#include <zlib.h>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_internal.h" /* gs_cpu_sparse_calls: did the path run */

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static float *rnd(size_t n, float scale) {
  float *p = malloc(n * sizeof *p);
  for (size_t i = 0; i < n; i++)
    p[i] = scale * ((float)rand() / (float)RAND_MAX - 0.5f);
  return p;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

#define REPS 21
#define TIME(label, body)                                                                  \
  do {                                                                                     \
    double t_[REPS];                                                                       \
    for (int r_ = 0; r_ < REPS; r_++) {                                                    \
      double t0_ = now_ms();                                                               \
      body;                                                                                \
      t_[r_] = now_ms() - t0_;                                                             \
    }                                                                                      \
    qsort(t_, REPS, sizeof t_[0], cmp);                                                    \
    printf("  %-44s min %8.3f  median %8.3f ms\n", label, t_[0], t_[REPS / 2]);                                     \
  } while (0)

/* dense forward + backward in dt; 16-bit buffers are just reinterpreted */
static void dense_pair(gs_backend *b, gs_exec *ex, gs_dtype dt, uint32_t n, uint32_t c,
                       uint32_t oc, void *in, void *w, void *bias, void *out, void *din, float *dw,
                       float *db, void *ws) {
  b->dense_forward(ex, dt, out, in, w, bias, n, c, oc, ws, false);
  b->dense_backward(ex, dt, din, dw, db, out, in, w, n, c, oc, ws);
}

static void run(gs_backend *b, int threads) {
  gs_exec *ex;
  gs_exec_config cfg = {.threads = threads};
  if (b->exec_create(b, &cfg, &ex))
    return;
  printf("threads=%d\n", threads);
  /* the MLP: 784-256-128-10, batch 128, fp32, SGD momentum */
  uint32_t N = 128, L[4] = {784, 256, 128, 10};
  float *x = rnd(N * 784, 1), *w[3], *bb[3], *a[4], *g[4], *dw[3], *db[3], *m[3];
  a[0] = x;
  for (int l = 0; l < 3; l++) {
    w[l] = rnd((size_t)L[l] * L[l + 1], 0.1f);
    bb[l] = rnd(L[l + 1], 0.1f);
    dw[l] = calloc((size_t)L[l] * L[l + 1], 4);
    m[l] = calloc((size_t)L[l] * L[l + 1], 4);
    db[l] = calloc(L[l + 1], 4);
    a[l + 1] = calloc((size_t)N * L[l + 1], 4);
    g[l + 1] = calloc((size_t)N * L[l + 1], 4);
  }
  g[0] = calloc((size_t)N * 784, 4);
  float loss[128], one = 1.0f;
  int32_t lab[128];
  for (int i = 0; i < 128; i++)
    lab[i] = i % 10;
  void *ws16 = malloc(b->dense_workspace(GS_F16, N, 784, 256));
  TIME("dense 128x784x256 fwd+bwd fp32",
       dense_pair(b, ex, GS_F32, N, 784, 256, x, w[0], bb[0], a[1], g[0], dw[0], db[0], NULL));
  TIME("dense 128x784x256 fwd+bwd bf16 storage",
       dense_pair(b, ex, GS_BF16, N, 784, 256, x, w[0], bb[0], a[1], g[0], dw[0], db[0], ws16));
  TIME("MLP 784-256-128-10 b128 train step fp32", {
    for (int l = 0; l < 3; l++) /* relu in the op, as the runtime runs it */
      b->dense_forward(ex, GS_F32, a[l + 1], a[l], w[l], bb[l], N, L[l], L[l + 1], NULL, l < 2);
    b->xent_forward_backward(ex, loss, NULL, g[3], a[3], lab, N, 10, &one, (float)N);
    for (int l = 2; l >= 0; l--) {
      if (l < 2)
        b->relu_backward(ex, GS_F32, g[l + 1], g[l + 1], a[l + 1], (size_t)N * L[l + 1]);
      b->dense_backward(ex, GS_F32, l ? g[l] : NULL, dw[l], db[l], g[l + 1], a[l], w[l], N, L[l],
                        L[l + 1], NULL);
    }
    for (int l = 0; l < 3; l++) { /* each step consumes (zeroes) its gradient */
      b->sgd_step(ex, w[l], dw[l], m[l], (size_t)L[l] * L[l + 1], 0.01f, 0.9f, false, 0, NULL);
      b->sgd_step(ex, bb[l], db[l], NULL, L[l + 1], 0.01f, 0.0f, false, 0, NULL);
    }
  });
  /* CNN / MobileNet-style layers, batch 128 */
  struct {
    const char *name;
    gs_conv_shape s;
    int depthwise;
  } convs[] = {
      {"conv 3x3 28x28x1->32 SAME", {128, 28, 28, 1, 3, 3, 1, true, 32, 0, 0}, 0},
      {"conv 3x3 14x14x32->64 SAME", {128, 14, 14, 32, 3, 3, 1, true, 64, 0, 0}, 0},
      {"conv 1x1 14x14x64->128", {128, 14, 14, 64, 1, 1, 1, true, 128, 0, 0}, 0},
      {"depthwise 3x3 14x14x64 SAME", {128, 14, 14, 64, 3, 3, 1, true, 64, 0, 0}, 1},
      {"depthwise 3x3 s2 28x28x32 SAME", {128, 28, 28, 32, 3, 3, 2, true, 32, 0, 0}, 1},
  };
  for (size_t i = 0; i < sizeof convs / sizeof convs[0]; i++) {
    gs_conv_shape s = convs[i].s;
    gs_conv_shape_init(&s);
    size_t nin = (size_t)s.n * s.h * s.w * s.c, nout = (size_t)s.n * s.oh * s.ow * s.f;
    size_t nw = convs[i].depthwise ? (size_t)s.kh * s.kw * s.c : (size_t)s.kh * s.kw * s.c * s.f;
    float *in = rnd(nin, 1), *out = calloc(nout, 4), *din = calloc(nin, 4), *cw = rnd(nw, 0.1f);
    float *cb = rnd(s.f, 0.1f), *cdw = calloc(nw, 4), *cdb = calloc(s.f, 4);
    size_t wsb = convs[i].depthwise ? b->depthwise_workspace(GS_F32, &s) : b->conv2d_workspace(GS_F32, &s);
    void *ws = wsb ? malloc(wsb) : NULL;
    char label[96];
    snprintf(label, sizeof label, "%s fwd+bwd fp32", convs[i].name);
    if (convs[i].depthwise)
      TIME(label, {
        b->depthwise_forward(ex, GS_F32, out, in, cw, cb, &s, ws, false);
        b->depthwise_backward(ex, GS_F32, din, cdw, cdb, out, in, cw, &s, ws);
      });
    else
      TIME(label, {
        b->conv2d_forward(ex, GS_F32, out, in, cw, cb, &s, ws, false);
        b->conv2d_backward(ex, GS_F32, din, cdw, cdb, out, in, cw, &s, ws);
      });
    gs_conv_shape p = {s.n, s.oh, s.ow, s.f, 2, 2, 2, false, s.f, 0, 0};
    if (i == 0) {
      gs_conv_shape_init(&p);
      float *po = calloc((size_t)p.n * p.oh * p.ow * p.c, 4);
      TIME("maxpool 2x2 28x28x32 fwd+bwd fp32", {
        b->maxpool_forward(ex, GS_F32, po, out, &p);
        b->maxpool_backward(ex, GS_F32, out, po, out, &p);
      });
      free(po);
    }
    free(in), free(out), free(din), free(cw), free(cb), free(cdw), free(cdb), free(ws);
  }
  for (int l = 0; l < 3; l++)
    free(w[l]), free(bb[l]), free(dw[l]), free(m[l]), free(db[l]), free(a[l + 1]), free(g[l + 1]);
  free(x), free(g[0]), free(ws16);
  b->exec_destroy(ex);
}

/* The floor under the MLP's training step: its eight GEMMs (three forward;
 * dW of each layer; dX of the upper two) as single cblas_sgemm calls on one
 * thread, nothing else. A step on T threads cannot take less than this / T:
 * it is what "samples/s against PyTorch" on the MLP is bounded by. */
static void gemm_floor(void) {
  const int N = 128, L[4] = {784, 256, 128, 10};
  float *act[4], *grad[4], *w[3], *dw[3];
  for (int l = 0; l < 4; l++)
    act[l] = rnd((size_t)N * L[l], 1), grad[l] = rnd((size_t)N * L[l], 1);
  for (int l = 0; l < 3; l++)
    w[l] = rnd((size_t)L[l] * L[l + 1], 0.1f), dw[l] = calloc((size_t)L[l] * L[l + 1], 4);
  double t[REPS];
  for (int r = 0; r < REPS; r++) {
    double t0 = now_ms();
    for (int l = 0; l < 3; l++)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, L[l + 1], L[l], 1.0f, act[l],
                  L[l], w[l], L[l + 1], 1.0f, act[l + 1], L[l + 1]);
    for (int l = 2; l >= 0; l--) {
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, L[l], L[l + 1], N, 1.0f, act[l], L[l],
                  grad[l + 1], L[l + 1], 1.0f, dw[l], L[l + 1]);
      if (l)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, L[l], L[l + 1], 1.0f,
                    grad[l + 1], L[l + 1], w[l], L[l + 1], 0.0f, grad[l], L[l]);
    }
    t[r] = now_ms() - t0;
  }
  qsort(t, REPS, sizeof t[0], cmp);
  double flops = 0;
  for (int l = 0; l < 3; l++)
    flops += 2.0 * N * L[l] * L[l + 1] * (l ? 3 : 2);
  printf("MLP 784-256-128-10 b128: its 8 GEMMs alone, one cblas_sgemm each, 1 thread:\n"
         "  min %.3f  median %.3f ms (%.1f GFLOP/s at the median); on T threads a step\n"
         "  takes at least median / T: %.0f samples/s per thread\n",
         t[0], t[REPS / 2], flops / t[REPS / 2] * 1e-6, N / t[REPS / 2] * 1e3);
  for (int l = 0; l < 4; l++)
    free(act[l]), free(grad[l]);
  for (int l = 0; l < 3; l++)
    free(w[l]), free(dw[l]);
}

/* The first n Fashion-MNIST training images as the MLP's first layer sees
 * them (x / 255), or NULL when Debian's dataset-fashion-mnist is not
 * installed. */
static float *fashion_batch(size_t n) {
  gzFile f = gzopen("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz", "rb");
  if (!f)
    return NULL;
  unsigned char *raw = malloc(16 + n * 784);
  int got = gzread(f, raw, (unsigned)(16 + n * 784));
  gzclose(f);
  float *x = NULL;
  if (got == (int)(16 + n * 784)) {
    x = malloc(n * 784 * sizeof *x);
    for (size_t i = 0; i < n * 784; i++)
      x[i] = (float)raw[16 + i] / 255.0f;
  }
  free(raw);
  return x;
}

/* fashion-mlp's first layer (128 x 784 -> 256) on real batches, a new one
 * each repetition as in training: the forward and the weight gradient on
 * the input's nonzeros (cpu_sparse.c: the path an fp32 dense layer takes
 * when given its workspace) against the dense GEMMs (no workspace), the
 * two alternating on the same batch. */
#define SPARSE_BATCHES 16
#define SPARSE_REPS 401 /* more than REPS: each is under a millisecond */
static void sparse_first_layer(gs_backend *b, int threads) {
  const uint32_t n = 128, c = 784, oc = 256;
  float *xs = fashion_batch((size_t)n * SPARSE_BATCHES);
  if (!xs) {
    printf("first layer on Fashion-MNIST batches: skipped, "
           "/usr/share/datasets/fashion-mnist not installed\n");
    return;
  }
  gs_exec *ex;
  gs_exec_config cfg = {.threads = threads};
  if (b->exec_create(b, &cfg, &ex)) {
    free(xs);
    return;
  }
  size_t nz = 0;
  for (size_t i = 0; i < (size_t)n * c * SPARSE_BATCHES; i++)
    nz += xs[i] != 0.0f;
  float *w = rnd((size_t)c * oc, 0.1f), *bias = rnd(oc, 0.1f), *out = rnd((size_t)n * oc, 1);
  float *dout = rnd((size_t)n * oc, 1), *dw = calloc((size_t)c * oc, 4);
  size_t wsb = b->dense_workspace(GS_F32, n, c, oc);
  void *ws = wsb ? malloc(wsb) : NULL;
  uint64_t calls0 = atomic_load(&gs_cpu_sparse_calls);
  double t[4][SPARSE_REPS];
  for (int r = 0; r < SPARSE_REPS; r++)
    for (int v = 0; v < 2; v++) {
      void *use = v ? ws : NULL;
      const float *x = xs + (size_t)(r % SPARSE_BATCHES) * n * c;
      double t0 = now_ms();
      b->dense_forward(ex, GS_F32, out, x, w, bias, n, c, oc, use, true);
      double t1 = now_ms();
      b->dense_backward(ex, GS_F32, NULL, dw, NULL, dout, x, w, n, c, oc, use);
      t[v][r] = t1 - t0;
      t[2 + v][r] = now_ms() - t1;
    }
  bool took = atomic_load(&gs_cpu_sparse_calls) - calls0 == 2u * SPARSE_REPS;
  enum { MID = SPARSE_REPS / 2 };
  for (int k = 0; k < 4; k++)
    qsort(t[k], SPARSE_REPS, sizeof t[k][0], cmp);
  printf("first layer 128x784 -> 256 on Fashion-MNIST batches (%.1f%% nonzero), %d thread(s)%s:\n"
         "  forward  dense GEMM min %.3f median %.3f ms, on the nonzeros min %.3f median %.3f ms"
         " (%.2fx)\n"
         "  dw       dense GEMM min %.3f median %.3f ms, on the nonzeros min %.3f median %.3f ms"
         " (%.2fx)\n",
         100.0 * (double)nz / ((double)n * c * SPARSE_BATCHES), threads,
         took ? "" : " (the sparse path did not run every time: see cpu_sparse.c's conditions)",
         t[0][0], t[0][MID], t[1][0], t[1][MID], t[1][MID] / t[0][MID], t[2][0], t[2][MID],
         t[3][0], t[3][MID], t[3][MID] / t[2][MID]);
  free(ws), free(xs), free(w), free(bias), free(out), free(dout), free(dw);
  b->exec_destroy(ex);
}

int main(int argc, char **argv) {
  gs_backend *b = gs_backend_cpu(); /* sets OpenBLAS to one thread */
  gemm_floor();
  sparse_first_layer(b, 1);
  sparse_first_layer(b, 2);
  if (argc > 1) {
    run(b, atoi(argv[1]));
    return 0;
  }
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  for (int t = 1; t <= ncpu; t *= 2)
    run(b, t);
  return 0;
}
