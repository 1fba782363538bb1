/*
 * bench_gpu.c: how close the cuda backend's GEMM path comes to the GPU's
 * matrix rate, on a GEMM-bound model: a bf16 MLP of 4 dense layers of 8192
 * units (ReLU between them), batch 8192, forward and backward (dw fp32 +=,
 * db, din except for the first layer) through the backend's ops, exactly as
 * the training runtime calls them. No loss and no optimizer: they are
 * element-wise and would only blur the GEMM measurement.
 *
 * FLOP per step: 3 GEMMs per layer (forward, dw, din; din skipped for the
 * first) of 2 * B * D * D each. Prints samples/s and the FLOP rate against
 * 990 TFLOP/s (an H100/H200's dense bf16 peak, the datasheet's number) on
 * one machine-readable line that bench_gpu.sh sets against PyTorch eager.
 * Timing is wall-clock around whole steps after warm-up, each step ending
 * in a synchronize: a benchmark, never a test.
 *
 * Usage: bench_gpu [BATCH [WIDTH [STEPS]]] (defaults 8192 8192 10).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/backend.h"
#include "kernels/loader.h"

#define LAYERS 4
#define PEAK_TFLOPS 990.0

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#define CHECK(call)                                                                               \
  do {                                                                                            \
    int rc_ = (call);                                                                             \
    if (rc_) {                                                                                    \
      fprintf(stderr, "bench_gpu: %s failed (%d)\n", #call, rc_);                                 \
      return 1;                                                                                   \
    }                                                                                             \
  } while (0)

int main(int argc, char **argv) {
  uint32_t B = argc > 1 ? (uint32_t)atoi(argv[1]) : 8192;
  uint32_t D = argc > 2 ? (uint32_t)atoi(argv[2]) : 8192;
  int steps = argc > 3 ? atoi(argv[3]) : 10;
  char why[512];
  gs_backend *g = gs_backend_cuda_load(why, sizeof why);
  if (!g) {
    fprintf(stderr, "bench_gpu: %s\n", why);
    return 2;
  }
  gs_exec_config cfg = {.threads = 1, .device_index = 0};
  gs_exec *ex;
  CHECK(g->exec_create(g, &cfg, &ex));
  const gs_dtype dt = GS_BF16;
  size_t act = (size_t)B * D * 2, wb = (size_t)D * D * 2;
  void *h[LAYERS + 1], *w[LAYERS], *bias[LAYERS], *dh[2], *dout, *ws;
  float *dw[LAYERS], *db[LAYERS];
  for (int i = 0; i <= LAYERS; i++)
    CHECK(g->region_reserve(g, 0, act, &h[i]));
  for (int i = 0; i < 2; i++)
    CHECK(g->region_reserve(g, 0, act, &dh[i]));
  CHECK(g->region_reserve(g, 0, act, &dout));
  for (int l = 0; l < LAYERS; l++) {
    CHECK(g->region_reserve(g, 0, wb, &w[l]));
    CHECK(g->region_reserve(g, 0, (size_t)D * 2, &bias[l]));
    CHECK(g->region_reserve(g, 0, (size_t)D * D * 4, (void **)&dw[l]));
    CHECK(g->region_reserve(g, 0, (size_t)D * 4, (void **)&db[l]));
  }
  size_t wsb = g->dense_workspace(dt, B, D, D);
  CHECK(g->region_reserve(g, 0, wsb, &ws));
  /* random bf16 weights (scaled like Glorot), input and output gradient */
  size_t n = (size_t)D * D > (size_t)B * D ? (size_t)D * D : (size_t)B * D;
  uint16_t *host = malloc(n * 2);
  if (!host)
    return 1;
  uint64_t s = 88172645463325252ull;
  float scale = 1.0f / (float)D;
  for (int t = 0; t < LAYERS + 2; t++) {
    size_t cnt = t < LAYERS ? (size_t)D * D : (size_t)B * D;
    for (size_t i = 0; i < cnt; i++) {
      s ^= s << 13, s ^= s >> 7, s ^= s << 17;
      float v = (float)((double)(s >> 11) * 0x1p-52 - 1.0) * (t < LAYERS ? scale * 40 : 1.0f);
      host[i] = gs_f32_to_bf16(v);
    }
    void *dst = t < LAYERS ? w[t] : t == LAYERS ? h[0] : dout;
    CHECK(g->copy_in(ex, dst, host, cnt * 2));
  }
  for (int l = 0; l < LAYERS; l++)
    CHECK(g->zero(ex, bias[l], (size_t)D * 2));
  CHECK(g->synchronize(ex));
  free(host);
  /* dout is the output gradient; the backward pass ping-pongs dh[0], dh[1] */
  double t0 = 0;
  int warm = 3;
  for (int it = 0; it < warm + steps; it++) {
    if (it == warm) {
      CHECK(g->synchronize(ex));
      t0 = now();
    }
    for (int l = 0; l < LAYERS; l++) {
      CHECK(g->dense_forward(ex, dt, h[l + 1], h[l], w[l], bias[l], B, D, D, ws, false));
      if (l < LAYERS - 1)
        CHECK(g->relu_forward(ex, dt, h[l + 1], h[l + 1], (size_t)B * D));
    }
    const void *d = dout;
    for (int l = LAYERS - 1; l >= 0; l--) {
      void *din = l > 0 ? dh[l & 1] : NULL;
      CHECK(g->dense_backward(ex, dt, din, dw[l], db[l], d, h[l], w[l], B, D, D, ws));
      if (l > 0)
        CHECK(g->relu_backward(ex, dt, din, din, h[l], (size_t)B * D));
      d = din;
    }
  }
  CHECK(g->synchronize(ex));
  double sec = now() - t0;
  double flop = (double)steps * 2.0 * B * D * D * (3.0 * LAYERS - 1.0);
  double tflops = flop / sec / 1e12;
  printf("gpushare bf16 MLP %dx%u, batch %u: %.1f ms/step, %.0f samples/s, %.1f TFLOP/s, "
         "%.1f%% of %.0f\n",
         LAYERS, D, B, sec / steps * 1e3, B * steps / sec, tflops, 100.0 * tflops / PEAK_TFLOPS,
         PEAK_TFLOPS);
  printf("RESULT gpushare samples_per_s=%.1f tflops=%.2f\n", B * steps / sec, tflops);
  g->exec_destroy(ex);
  return 0;
}
