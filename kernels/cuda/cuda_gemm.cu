/*
 * cuda_gemm.cu: the GEMM-bound layers of the `cuda` backend, dense and
 * conv2d, through cuBLASLt with fp32 accumulation (CUBLAS_COMPUTE_32F,
 * fp32 alpha/beta) on fp32, fp16 or bf16 storage.
 *
 * Row-major to cuBLAS. gpushare's tensors are row-major; cuBLASLt is
 * column-major. A row-major X (r, c) with leading dimension ld is, read
 * column-major, X^T (c, r) with the same ld, so C = op(A) op(B) row-major is
 * C^T = op(B)^T op(A)^T column-major: gemm_rm swaps the operands and the
 * sizes and keeps each transpose flag. The calls then read exactly like the
 * CPU backend's cblas_sgemm calls (cpu_dense.c), which is what they are
 * tested against:
 *   forward   out (N, OC) = in (N, C) . w (C, OC) + b    (BIAS epilogue)
 *   dw        dw (C, OC) += in^T . dout                  (C/D fp32, beta 1)
 *   din       din (N, C)  = dout . w^T                   (C/D dt, beta 0)
 * The bias is added in the GEMM's fp32 epilogue before the one rounding to
 * dt, as on the CPU. A/B 16-bit with C/D fp32 under CUBLAS_COMPUTE_32F is a
 * combination cuBLASLt lists (the "16F/16BF in, 32F out" rows of its type
 * table), so weight gradients accumulate in fp32 with no extra pass. Bias
 * gradients are a column-sum kernel that adds onto db (cuda_ops.cu): the
 * BGRADA/BGRADB epilogues overwrite their output, and db accumulates. Its
 * per-chunk partial sums borrow the cuBLASLt part of the op's ws before the
 * GEMMs run (stream order keeps the two apart).
 *
 * Plans. Descriptors, layouts and the heuristic's algorithm depend only on
 * the shape, the types, the epilogue and the pointers' alignment (the
 * heuristic assumes 256-byte operands unless told otherwise, and reads the
 * bias pointer for its alignment), so they are made once per such key and
 * kept in the exec's small open-addressed cache (GS_CUDA_PLANS slots, eight
 * probes, the home slot replaced when all are taken). A training step
 * repeats the same few shapes, so after the first step no plan is made.
 * Should no algorithm offer the BIAS epilogue for a shape, the bias vector
 * be under 16-byte alignment, or the matmul refuse the epilogue after the
 * heuristic offered it, the plan says so (bias_fallback) and the bias rows
 * are written into out first, then the GEMM adds onto them (beta = 1), as
 * the CPU does.
 *
 * Workspace. Every GEMM op's *_workspace includes gs_cuda_lt_workspace
 * bytes at the start of its ws for cuBLASLt, so the vdev is charged for it;
 * conv2d adds the im2col buffer after it.
 *
 * conv2d. im2col builds, for a chunk of whole images, one row per output
 * pixel (KH*KW*C wide, in dt), and the chunk is a dense layer over those
 * rows; a 1x1 stride-1 conv is a dense layer over the input itself. For the
 * input gradient the GEMM writes dcol in fp32 (so the sums of overlapping
 * windows are rounded once) and col2im gathers it onto din, one thread per
 * input element, no atomics. The chunk is at most GS_CUDA_COL_BYTES (at
 * least one image), so the workspace is bounded whatever the batch.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "kernels/cuda/cuda_internal.h"

static cudaDataType_t lt_type(gs_dtype dt) {
  return dt == GS_F16 ? CUDA_R_16F : dt == GS_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

static size_t type_size(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }

static uint32_t align_log2(const void *p) {
  uintptr_t a = (uintptr_t)p;
  if (!a)
    return 8;
  uint32_t l = (uint32_t)__builtin_ctzll((unsigned long long)a);
  return l > 8 ? 8 : l; /* 256 bytes is all the heuristic asks about */
}

static void plan_destroy(gs_cuda_plan *p) {
  if (!p->used)
    return;
  if (p->a)
    (void)GS_LT(cublasLtMatrixLayoutDestroy(p->a));
  if (p->b)
    (void)GS_LT(cublasLtMatrixLayoutDestroy(p->b));
  if (p->d)
    (void)GS_LT(cublasLtMatrixLayoutDestroy(p->d));
  if (p->desc)
    (void)GS_LT(cublasLtMatmulDescDestroy(p->desc));
  memset(p, 0, sizeof *p);
}

void gs_cuda_plans_clear(gs_exec *ex) {
  for (int i = 0; i < GS_CUDA_PLANS; i++)
    plan_destroy(&ex->plans[i]);
}

static uint64_t key_hash(const gs_cuda_plan_key *k) {
  const unsigned char *p = (const unsigned char *)k;
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (size_t i = 0; i < sizeof *k; i++)
    h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

/* desc for key k, with or without the BIAS epilogue */
static int make_desc(const gs_cuda_plan_key *k, bool bias, const void *bias_ptr,
                     cublasLtMatmulDesc_t *out) {
  cublasLtMatmulDesc_t d = NULL;
  int rc = GS_LT(cublasLtMatmulDescCreate(&d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  if (rc)
    return rc;
  int32_t ta = k->ta, tb = k->tb;
  if ((rc = GS_LT(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta))))
    goto fail;
  if ((rc = GS_LT(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb))))
    goto fail;
  if (bias) {
    uint32_t epi = CUBLASLT_EPILOGUE_BIAS;
    int32_t bt = k->cd_type; /* the bias is stored like out */
    if ((rc = GS_LT(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                                   sizeof epi))))
      goto fail;
    if ((rc = GS_LT(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt,
                                                   sizeof bt))))
      goto fail;
    if ((rc = GS_LT(cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                   &bias_ptr, sizeof bias_ptr))))
      goto fail;
  }
  *out = d;
  return 0;
fail:
  (void)GS_LT(cublasLtMatmulDescDestroy(d));
  return rc;
}

/* Ask the heuristic for one algorithm; 1 found, 0 none, < 0 an error. */
static int pick_algo(gs_exec *ex, gs_cuda_plan *p, cublasLtMatmulPreference_t pref) {
  cublasLtMatmulHeuristicResult_t r;
  int found = 0;
  memset(&r, 0, sizeof r);
  cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(ex->lt, p->desc, p->a, p->b, p->d, p->d, pref,
                                                    1, &r, &found);
  if (s == CUBLAS_STATUS_NOT_SUPPORTED || (s == CUBLAS_STATUS_SUCCESS && found == 0))
    return 0;
  int rc = GS_LT(s);
  if (rc)
    return rc;
  if (r.state != CUBLAS_STATUS_SUCCESS)
    return 0;
  p->algo = r.algo;
  p->ws_bytes = r.workspaceSize;
  return 1;
}

/* Bias pointers below this alignment never get the BIAS epilogue: cuBLASLt
 * kernels load the bias vector in 16-byte pieces and refuse (at the matmul,
 * after the heuristic said yes) a vector that is not so aligned. */
#define GS_CUDA_BIAS_ALIGN_LOG2 4

/* A plan for key k; with no_epilogue (or a bias pointer under 16-byte
 * alignment) the bias goes in as rows of C with beta = 1 (bias_fallback). */
static int plan_make(gs_exec *ex, gs_cuda_plan *p, const gs_cuda_plan_key *k,
                     const void *bias_ptr, bool no_epilogue) {
  memset(p, 0, sizeof *p);
  p->used = 1;
  p->key = *k;
  cublasLtMatmulPreference_t pref = NULL;
  uint64_t wsb = gs_cuda_lt_workspace;
  uint32_t al[4];
  int rc, got;
  for (int i = 0; i < 4; i++)
    al[i] = 1u << ((k->align >> (4 * i)) & 15u);
  uint64_t ar = k->ta == CUBLAS_OP_N ? k->m : k->k, ac = k->ta == CUBLAS_OP_N ? k->k : k->m;
  uint64_t br = k->tb == CUBLAS_OP_N ? k->k : k->n, bc = k->tb == CUBLAS_OP_N ? k->n : k->k;
  if ((rc = GS_LT(cublasLtMatrixLayoutCreate(&p->a, (cudaDataType_t)k->ab_type, ar, ac, k->lda))))
    goto fail;
  if ((rc = GS_LT(cublasLtMatrixLayoutCreate(&p->b, (cudaDataType_t)k->ab_type, br, bc, k->ldb))))
    goto fail;
  if ((rc = GS_LT(cublasLtMatrixLayoutCreate(&p->d, (cudaDataType_t)k->cd_type, k->m, k->n,
                                             k->ldd))))
    goto fail;
  if ((rc = GS_LT(cublasLtMatmulPreferenceCreate(&pref))))
    goto fail;
  if ((rc = GS_LT(cublasLtMatmulPreferenceSetAttribute(
           pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb))))
    goto fail;
  {
    const cublasLtMatmulPreferenceAttributes_t which[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    const uint32_t val[4] = {al[0], al[1], al[2], al[2]}; /* C is D */
    for (int i = 0; i < 4; i++)
      if ((rc = GS_LT(cublasLtMatmulPreferenceSetAttribute(pref, which[i], &val[i],
                                                           sizeof val[i]))))
        goto fail;
  }
  {
    bool epi = k->bias && !no_epilogue &&
               ((k->align >> 12) & 15u) >= GS_CUDA_BIAS_ALIGN_LOG2;
    if ((rc = make_desc(k, epi, bias_ptr, &p->desc)))
      goto fail;
    got = epi || !k->bias ? pick_algo(ex, p, pref) : 0;
  }
  if (got == 0 && k->bias) { /* no BIAS epilogue here: bias rows + beta 1 */
    (void)GS_LT(cublasLtMatmulDescDestroy(p->desc));
    p->desc = NULL;
    if ((rc = make_desc(k, false, NULL, &p->desc)))
      goto fail;
    p->bias_fallback = 1;
    got = pick_algo(ex, p, pref);
  }
  if (got < 0) {
    rc = got;
    goto fail;
  }
  if (got == 0) {
    fprintf(stderr,
            "gpushare cuda: cuBLASLt has no algorithm for a %llux%llux%llu GEMM "
            "(types %d/%d, ld %lld/%lld/%lld, alignment %u/%u/%u)\n",
            (unsigned long long)k->m, (unsigned long long)k->n, (unsigned long long)k->k,
            k->ab_type, k->cd_type, (long long)k->lda, (long long)k->ldb, (long long)k->ldd,
            al[0], al[1], al[2]);
    rc = -ENOTSUP;
    goto fail;
  }
  (void)GS_LT(cublasLtMatmulPreferenceDestroy(pref));
  return 0;
fail:
  if (pref)
    (void)GS_LT(cublasLtMatmulPreferenceDestroy(pref));
  plan_destroy(p);
  return rc;
}

static int plan_get(gs_exec *ex, const gs_cuda_plan_key *k, const void *bias_ptr,
                    gs_cuda_plan **out) {
  uint64_t h = key_hash(k);
  gs_cuda_plan *slot = NULL;
  for (int i = 0; i < 8; i++) {
    gs_cuda_plan *p = &ex->plans[(h + (uint64_t)i) & (GS_CUDA_PLANS - 1)];
    if (p->used && memcmp(&p->key, k, sizeof *k) == 0) {
      *out = p;
      return 0;
    }
    if (!p->used && !slot)
      slot = p;
  }
  if (!slot) { /* all eight probes taken: replace the home slot */
    slot = &ex->plans[h & (GS_CUDA_PLANS - 1)];
    plan_destroy(slot);
  }
  int rc = plan_make(ex, slot, k, bias_ptr, false);
  if (rc)
    return rc;
  *out = slot;
  return 0;
}

/* Row-major C (M, N) = op(A) op(B) [+ bias per column] + beta C, in fp32:
 * A and B of ab (dt), C of cd (dt or fp32). ws: the op's workspace, whose
 * first gs_cuda_lt_workspace bytes are cuBLASLt's. */
static int gemm_rm(gs_exec *ex, bool ta, bool tb, uint64_t M, uint64_t N, uint64_t K,
                   cudaDataType_t ab, const void *A, int64_t lda, const void *B, int64_t ldb,
                   cudaDataType_t cd, void *C, int64_t ldc, float beta, const void *bias,
                   void *ws) {
  if (M == 0 || N == 0)
    return 0;
  gs_dtype cdt = cd == CUDA_R_32F ? GS_F32 : cd == CUDA_R_16F ? GS_F16 : GS_BF16;
  if (K == 0) { /* no products: C = bias rows, or beta C */
    if (bias)
      return gs_cuda_fill_rows(ex, cdt, C, bias, M, N);
    if (beta == 0.0f)
      return GS_CU(cudaMemsetAsync(C, 0, (size_t)(M * (uint64_t)ldc) * type_size(cd), ex->stream));
    return 0;
  }
  gs_cuda_plan_key k;
  memset(&k, 0, sizeof k); /* padding too: the key is hashed and compared as bytes */
  k.m = N;                 /* column-major: C^T (N, M) = op(B)^T op(A)^T */
  k.n = M;
  k.k = K;
  k.lda = ldb;
  k.ldb = lda;
  k.ldd = ldc;
  k.ta = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  k.tb = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  k.ab_type = ab;
  k.cd_type = cd;
  k.bias = bias != NULL;
  k.align = align_log2(B) | align_log2(A) << 4 | align_log2(C) << 8 |
            (bias ? align_log2(bias) : 0u) << 12;
  gs_cuda_plan *p;
  int rc = plan_get(ex, &k, bias, &p);
  if (rc)
    return rc;
  if (p->ws_bytes && !ws)
    return -EINVAL;
  if (bias && p->bias_fallback) {
    if ((rc = gs_cuda_fill_rows(ex, cdt, C, bias, M, N)))
      return rc;
    beta = 1.0f;
  } else if (bias) {
    if ((rc = GS_LT(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                   &bias, sizeof bias))))
      return rc;
  }
  float alpha = 1.0f;
  cublasStatus_t st =
      cublasLtMatmul(ex->lt, p->desc, &alpha, B, p->a, A, p->b, &beta, C, p->d, C, p->d, &p->algo,
                     p->ws_bytes ? ws : NULL, p->ws_bytes, ex->stream);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED && bias && !p->bias_fallback) {
    /* the heuristic offered the BIAS epilogue but the kernel refuses this
     * call: remake the plan without it, for this and every later call */
    plan_destroy(p);
    if ((rc = plan_make(ex, p, &k, bias, true)))
      return rc;
    if ((rc = gs_cuda_fill_rows(ex, cdt, C, bias, M, N)))
      return rc;
    beta = 1.0f;
    st = cublasLtMatmul(ex->lt, p->desc, &alpha, B, p->a, A, p->b, &beta, C, p->d, C, p->d,
                        &p->algo, p->ws_bytes ? ws : NULL, p->ws_bytes, ex->stream);
  }
  return GS_LT(st);
}

/* ---- dense ---- */

size_t gs_cuda_dense_workspace(gs_dtype dt, uint32_t n, uint32_t c, uint32_t oc) {
  return gs_cuda_size_dense(gs_cuda_lt_workspace, dt, n, c, oc);
}

/* in (N, C), w (C, OC), b (OC) or NULL, out (N, OC); all dt. relu: the relu
 * kernel over out after the GEMM, on the same stream. cuBLASLt's RELU_BIAS
 * epilogue would save that pass, but it is documented as max(x, 0) with
 * nothing said of NaN (fmaxf makes it 0), and the contract passes NaN. */
int gs_cuda_dense_forward(gs_exec *ex, gs_dtype dt, void *out, const void *in, const void *w,
                          const void *b, uint32_t n, uint32_t c, uint32_t oc, void *ws,
                          bool relu) {
  int rc = gs_cuda_enter(ex);
  if (rc || n == 0 || oc == 0)
    return rc;
  cudaDataType_t t = lt_type(dt);
  if ((rc = gemm_rm(ex, false, false, n, oc, c, t, in, c, w, oc, t, out, oc, 0.0f, b, ws)))
    return rc;
  return relu ? gs_cuda_relu_forward(ex, dt, out, out, (size_t)n * oc) : 0;
}

/* dw (C, OC) f32 += in^T . dout; db (OC) f32 += sum_n dout;
 * din (N, C) dt = dout (N, OC) . w^T; din, dw, db may each be NULL. */
int gs_cuda_dense_backward(gs_exec *ex, gs_dtype dt, void *din, float *dw, float *db,
                           const void *dout, const void *in, const void *w, uint32_t n,
                           uint32_t c, uint32_t oc, void *ws) {
  int rc = gs_cuda_enter(ex);
  if (rc || n == 0)
    return rc;
  cudaDataType_t t = lt_type(dt);
  if (db && (rc = gs_cuda_colsum_add(ex, dt, db, dout, n, oc, ws)))
    return rc;
  if (dw && (rc = gemm_rm(ex, true, false, c, oc, n, t, in, c, dout, oc, CUDA_R_32F, dw, oc, 1.0f,
                          NULL, ws)))
    return rc;
  if (din && (rc = gemm_rm(ex, false, true, n, c, oc, t, dout, oc, w, oc, t, din, c, 0.0f, NULL,
                           ws)))
    return rc;
  return 0;
}

/* ---- conv2d ---- */

typedef struct conv_geo {
  uint64_t p, k, f; /* output pixels per image, window length KH*KW*C, filters */
  uint32_t ipc;     /* images per im2col chunk */
  bool pointwise;   /* 1x1 stride 1: the input is already the GEMM operand */
} conv_geo;

static conv_geo conv_geo_of(const gs_conv_shape *s) {
  conv_geo g;
  uint32_t oh = gs_window_out(s->h, s->kh, s->stride, s->same);
  uint32_t ow = gs_window_out(s->w, s->kw, s->stride, s->same);
  g.p = (uint64_t)oh * ow;
  g.k = (uint64_t)s->kh * s->kw * s->c;
  g.f = s->f;
  g.pointwise = s->kh == 1 && s->kw == 1 && s->stride == 1;
  g.ipc = gs_cuda_conv_chunk_images(s);
  return g;
}

size_t gs_cuda_conv2d_workspace(gs_dtype dt, const gs_conv_shape *s) {
  return gs_cuda_size_conv2d(gs_cuda_lt_workspace, dt, s);
}

/* in (N, H, W, C), w (KH, KW, C, F), b (F) or NULL, out (N, OH, OW, F);
 * relu as dense's */
int gs_cuda_conv2d_forward(gs_exec *ex, gs_dtype dt, void *out, const void *in, const void *w,
                           const void *b, const gs_conv_shape *s, void *ws, bool relu) {
  int rc = gs_cuda_enter(ex);
  conv_geo g = conv_geo_of(s);
  if (rc || s->n == 0 || g.p == 0 || g.f == 0)
    return rc;
  cudaDataType_t t = lt_type(dt);
  size_t esz = gs_dtype_size(dt);
  size_t count = (size_t)s->n * g.p * g.f;
  if (g.pointwise) {
    if ((rc = gemm_rm(ex, false, false, (uint64_t)s->n * g.p, g.f, g.k, t, in, (int64_t)g.k, w,
                      (int64_t)g.f, t, out, (int64_t)g.f, 0.0f, b, ws)))
      return rc;
    return relu ? gs_cuda_relu_forward(ex, dt, out, out, count) : 0;
  }
  void *col = (char *)ws + gs_cuda_lt_workspace;
  for (uint32_t n0 = 0; n0 < s->n; n0 += g.ipc) {
    uint32_t nc = s->n - n0 < g.ipc ? s->n - n0 : g.ipc;
    uint64_t m = (uint64_t)nc * g.p;
    if ((rc = gs_cuda_im2col(ex, dt, s, in, col, n0, nc)))
      return rc;
    void *dst = (char *)out + (size_t)n0 * g.p * g.f * esz;
    if ((rc = gemm_rm(ex, false, false, m, g.f, g.k, t, col, (int64_t)g.k, w, (int64_t)g.f, t, dst,
                      (int64_t)g.f, 0.0f, b, ws)))
      return rc;
  }
  return relu ? gs_cuda_relu_forward(ex, dt, out, out, count) : 0;
}

/* dw (KH, KW, C, F) f32 +=, db (F) f32 +=, din (N, H, W, C) dt overwritten;
 * any of the three may be NULL. */
int gs_cuda_conv2d_backward(gs_exec *ex, gs_dtype dt, void *din, float *dw, float *db,
                            const void *dout, const void *in, const void *w,
                            const gs_conv_shape *s, void *ws) {
  int rc = gs_cuda_enter(ex);
  conv_geo g = conv_geo_of(s);
  if (rc || s->n == 0)
    return rc;
  size_t esz = gs_dtype_size(dt);
  if (g.p == 0 || g.f == 0) { /* no output: no gradient reaches the input */
    if (din)
      return GS_CU(cudaMemsetAsync(din, 0, (size_t)s->n * s->h * s->w * s->c * esz, ex->stream));
    return 0;
  }
  cudaDataType_t t = lt_type(dt);
  uint64_t M = (uint64_t)s->n * g.p;
  if (db && (rc = gs_cuda_colsum_add(ex, dt, db, dout, M, g.f, ws)))
    return rc;
  if (g.pointwise) {
    if (dw && (rc = gemm_rm(ex, true, false, g.k, g.f, M, t, in, (int64_t)g.k, dout, (int64_t)g.f,
                            CUDA_R_32F, dw, (int64_t)g.f, 1.0f, NULL, ws)))
      return rc;
    if (din && (rc = gemm_rm(ex, false, true, M, g.k, g.f, t, dout, (int64_t)g.f, w,
                             (int64_t)g.f, t, din, (int64_t)g.k, 0.0f, NULL, ws)))
      return rc;
    return 0;
  }
  void *col = (char *)ws + gs_cuda_lt_workspace;
  for (uint32_t n0 = 0; n0 < s->n; n0 += g.ipc) {
    uint32_t nc = s->n - n0 < g.ipc ? s->n - n0 : g.ipc;
    uint64_t m = (uint64_t)nc * g.p;
    const void *d = (const char *)dout + (size_t)n0 * g.p * g.f * esz;
    if (dw) {
      if ((rc = gs_cuda_im2col(ex, dt, s, in, col, n0, nc)))
        return rc;
      if ((rc = gemm_rm(ex, true, false, g.k, g.f, m, t, col, (int64_t)g.k, d, (int64_t)g.f,
                        CUDA_R_32F, dw, (int64_t)g.f, 1.0f, NULL, ws)))
        return rc;
    }
    if (din) { /* dcol (m, K) f32 = dout . w^T, then gathered onto din */
      if ((rc = gemm_rm(ex, false, true, m, g.k, g.f, t, d, (int64_t)g.f, w, (int64_t)g.f,
                        CUDA_R_32F, col, (int64_t)g.k, 0.0f, NULL, ws)))
        return rc;
      if ((rc = gs_cuda_col2im(ex, dt, s, (const float *)col, din, n0, nc)))
        return rc;
    }
  }
  return 0;
}
