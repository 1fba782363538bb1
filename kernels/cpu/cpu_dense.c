/*
 * cpu_dense.c: the fully connected layer, in (N, C) . w (C, OC) + b (OC).
 *
 * fp32 runs cblas_sgemm straight on the caller's buffers (each GEMM part
 * writes its block's bias rows and accumulates onto them), so an fp32 step
 * makes no copies of its own. 16-bit storage converts in, w (and dout) into
 * the workspace, runs the same fp32 GEMMs there and rounds the result once
 * on store, which is what a GPU's fp32-accumulating GEMM does.
 *
 * fp32 with a mostly-zero input (image background, a relu's output) takes
 * cpu_sparse.c's path for the forward and the weight gradient instead: a
 * multiply-add per nonzero input, not per input. Its workspace, the
 * nonzeros' lists, is fp32's workspace (0 for layers too small for it).
 *
 * Workspace (16-bit), in floats: in (N*C) + w (C*OC) + out or dout
 * (N*OC). Backward reuses the converted-input slot for din once dw is done,
 * so forward and backward need the same bytes.
 */
#include <string.h>

#include "kernels/cpu/cpu_internal.h"

size_t gs_cpu_dense_workspace(gs_dtype dt, uint32_t n, uint32_t c, uint32_t oc) {
  if (dt == GS_F32) /* the nonzeros' lists, for a mostly-zero input */
    return gs_cpu_sparse_workspace(n, c, oc);
  return sizeof(float) * ((size_t)n * c + (size_t)c * oc + (size_t)n * oc);
}

/* out (N, OC) f32: every row = b (dt), or nothing when there is no bias. */
static void fill_bias_rows(gs_dtype dt, float *out, const void *b, uint32_t n, uint32_t oc) {
  gs_cpu_load_f32(dt, b, out, oc);
  for (uint32_t i = 1; i < n; i++)
    memcpy(out + (size_t)i * oc, out, sizeof(float) * oc);
}

/* in (N, C), w (C, OC), b (OC) or NULL, out (N, OC); all dt. relu: out =
 * relu(out), in each GEMM part (16-bit: on the fp32 result before it is
 * rounded, the same bits as after: rounding keeps the sign and 0). */
int gs_cpu_dense_forward(gs_exec *ex, gs_dtype dt, void *out, const void *in, const void *w,
                         const void *b, uint32_t n, uint32_t c, uint32_t oc, void *ws,
                         bool relu) {
  if (n == 0 || oc == 0)
    return 0;
  const float *inf = in, *wf = w;
  float *outf = out;
  if (dt != GS_F32) {
    float *p = ws;
    gs_cpu_load_f32_par(ex, dt, in, p, (size_t)n * c);
    inf = p;
    p += (size_t)n * c;
    gs_cpu_load_f32_par(ex, dt, w, p, (size_t)c * oc);
    wf = p;
    p += (size_t)c * oc;
    outf = p;
  }
  if (dt == GS_F32) { /* each GEMM part starts its block as bias rows */
    if (gs_cpu_sparse_forward(ex, outf, inf, wf, b, n, c, oc, relu, ws))
      return 0;
    gs_cpu_sgemm_fwd(ex, n, oc, c, inf, c, wf, oc, b, 0.0f, relu, outf, oc);
  } else {
    if (b)
      fill_bias_rows(dt, outf, b, n, oc);
    gs_cpu_sgemm_fwd(ex, n, oc, c, inf, c, wf, oc, NULL, b ? 1.0f : 0.0f, relu, outf, oc);
  }
  if (dt != GS_F32)
    gs_cpu_store_f32_par(ex, dt, out, outf, (size_t)n * oc);
  return 0;
}

/* A small layer's two backward GEMMs (each under GS_CPU_GEMM_PAIR_MAX):
 * din on the caller, dw and db on a worker, side by side (fashion-mlp's
 * 128x10 head): neither is large enough to split well. */
struct linear_bwd_pair {
  float *din, *dw, *db;
  const float *dout, *in, *w;
  size_t m, k, f;
};

static void linear_bwd_pair_part(void *ctx, size_t lo, size_t hi) {
  const struct linear_bwd_pair *j = ctx;
  for (size_t i = lo; i < hi; i++) {
    if (i == 0) {
      gs_cpu_sgemm_here(false, true, j->m, j->k, j->f, 1.0f, j->dout, j->f, j->w, j->f, 0.0f,
                        j->din, j->k);
    } else {
      if (j->db)
        gs_cpu_bias_grad_here(j->db, j->dout, j->m, j->f);
      gs_cpu_sgemm_here(true, false, j->k, j->f, j->m, 1.0f, j->in, j->k, j->dout, j->f, 1.0f,
                        j->dw, j->f);
    }
  }
}

void gs_cpu_linear_backward(gs_exec *ex, float *din, float *dw, float *db, const float *dout,
                            const float *in, const float *w, size_t m, size_t k, size_t f) {
  if (dw && din && din != in && ex->threads > 1 && m * k * f < GS_CPU_GEMM_PAIR_MAX) {
    struct linear_bwd_pair j = {.din = din, .dw = dw, .db = db, .dout = dout, .in = in,
                                .w = w, .m = m, .k = k, .f = f};
    gs_cpu_parallel(ex, 2, 1, linear_bwd_pair_part, &j);
    return;
  }
  if (db)
    gs_cpu_bias_grad(ex, db, dout, m, f);
  if (dw)
    gs_cpu_sgemm(ex, true, false, k, f, m, 1.0f, in, k, dout, f, 1.0f, dw, f);
  if (din) /* after dw: din may be where in was (dense's 16-bit workspace) */
    gs_cpu_sgemm(ex, false, true, m, k, f, 1.0f, dout, f, w, f, 0.0f, din, k);
}

/* dw (C, OC) f32 += in^T . dout; db (OC) f32 += sum_n dout;
 * din (N, C) dt = dout (N, OC) . w^T; din, dw, db may each be NULL. */
int gs_cpu_dense_backward(gs_exec *ex, gs_dtype dt, void *din, float *dw, float *db,
                          const void *dout, const void *in, const void *w, uint32_t n,
                          uint32_t c, uint32_t oc, void *ws) {
  if (n == 0)
    return 0;
  const float *inf = in, *wf = w, *doutf = dout;
  float *dinf = din, *inbuf = NULL;
  if (dt != GS_F32) {
    float *p = ws;
    inbuf = p;
    if (dw)
      gs_cpu_load_f32_par(ex, dt, in, inbuf, (size_t)n * c);
    inf = inbuf;
    p += (size_t)n * c;
    if (din)
      gs_cpu_load_f32_par(ex, dt, w, p, (size_t)c * oc);
    wf = p;
    p += (size_t)c * oc;
    gs_cpu_load_f32_par(ex, dt, dout, p, (size_t)n * oc);
    doutf = p;
    dinf = inbuf; /* the converted input is dead once dw is done */
  } else if (dw && gs_cpu_sparse_wgrad(ex, dw, doutf, inf, n, c, oc, ws))
    dw = NULL; /* done, on the input's nonzeros */
  gs_cpu_linear_backward(ex, din ? dinf : NULL, dw, db, doutf, inf, wf, n, c, oc);
  if (din && dt != GS_F32)
    gs_cpu_store_f32_par(ex, dt, din, dinf, (size_t)n * c);
  return 0;
}
