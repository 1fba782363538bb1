/*
 * cuda_internal.h: what the files of the `cuda` plugin share: the exec (one
 * job's stream, its cuBLASLt handle and its cache of matmul plans), the one
 * error checker every CUDA and cuBLAS call goes through, launch helpers, and
 * the op entry points that cuda_backend.cu puts into the gs_backend table.
 * Not installed, not part of the contract; backend.h is.
 *
 * Errors. The daemon must outlive any job, so no call here exits or aborts:
 * GS_CU / GS_LT turn a failure into a negative errno-style value
 * (-ENOMEM for an allocation failure, -ENOTSUP for an unsupported GEMM,
 * -EIO for the rest) after one line on stderr naming the call, the file and
 * line, and CUDA's own name for the error. Kernel launches are checked with
 * cudaGetLastError right after the launch (GS_LAUNCHED), which reports a bad
 * configuration now and an asynchronous fault at a later call of the job.
 */
#ifndef GS_KERNELS_CUDA_INTERNAL_H
#define GS_KERNELS_CUDA_INTERNAL_H

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

/* backend.h is C and has no extern "C" of its own: the dtype and window
 * helpers it declares are dtype.c's C symbols. */
extern "C" {
#include "kernels/backend.h"
#include "kernels/cuda_sizes.h"
}

/* Entries of an exec's matmul plan cache (open addressing, power of two).
 * A step's distinct GEMMs: three per dense or conv layer (forward, weight
 * and input gradient), again for a conv's last, shorter im2col chunk and
 * for the evaluation's last, partial batch: past 100 for a MobileNet, which
 * a 64-slot cache evicted and re-planned every step. 512 slots (about
 * 200 bytes each, per job) keep every shape of any example with room for
 * the eight probes. */
#define GS_CUDA_PLANS 512

/* One cached cuBLASLt plan: the descriptors and the heuristic's algorithm
 * for one GEMM shape, types, epilogue and pointer alignments. */
typedef struct gs_cuda_plan_key {
  uint64_t m, n, k;        /* column-major GEMM sizes (cuBLAS's terms) */
  int64_t lda, ldb, ldd;   /* leading dimensions, in elements */
  int32_t ta, tb;          /* cublasOperation_t of A and B */
  int32_t ab_type, cd_type;/* cudaDataType_t of A/B and of C/D */
  int32_t bias;            /* 1: CUBLASLT_EPILOGUE_BIAS */
  uint32_t align;          /* log2 alignments of A, B, D, bias, 4 bits each */
} gs_cuda_plan_key;

typedef struct gs_cuda_plan {
  gs_cuda_plan_key key;    /* what this plan was made for */
  int used;                /* 1 when the slot holds a plan */
  int bias_fallback;       /* 1: no algorithm has the BIAS epilogue for this
                              shape; bias rows are written first, beta = 1 */
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t a, b, d; /* C shares D's layout (C == D) */
  cublasLtMatmulAlgo_t algo;
  size_t ws_bytes;         /* workspace the algorithm asked for */
} gs_cuda_plan;

struct gs_exec {
  int device;              /* CUDA ordinal this job runs on */
  cudaStream_t stream;     /* every op and copy of the job, in order */
  cublasLtHandle_t lt;     /* the job's cuBLASLt handle */
  gs_cuda_plan plans[GS_CUDA_PLANS]; /* matmul plan cache, this exec only */
  cudaEvent_t t0, t1;      /* timer_start / timer_stop marks on the stream */
};

/* Bytes of cuBLASLt workspace each GEMM op takes from its `ws` (32 MiB when
 * a device is Hopper or newer, 4 MiB otherwise); set once at open. */
extern size_t gs_cuda_lt_workspace;

/* ---- the checker ---- */
int gs_cuda_check(cudaError_t e, const char *what, const char *file, int line);
int gs_cuda_check_lt(cublasStatus_t s, const char *what, const char *file, int line);
#define GS_CU(call) gs_cuda_check((call), #call, __FILE__, __LINE__)
/* A sticky error was seen (gs_cuda_check answers -ENOTRECOVERABLE for it,
 * and every op after it does too, without calling CUDA). */
bool gs_cuda_device_lost(void);
#define GS_LT(call) gs_cuda_check_lt((call), #call, __FILE__, __LINE__)
#define GS_LAUNCHED(name) gs_cuda_check(cudaGetLastError(), name, __FILE__, __LINE__)

/* Make ex's device current on the calling thread (jobs of several devices
 * may share a thread pool). */
int gs_cuda_enter(gs_exec *ex);

/* Blocks for a grid-stride loop over `count` items, 256 threads each. */
static inline unsigned gs_cuda_blocks(size_t count) {
  size_t b = (count + 255) / 256;
  if (b > 65536)
    b = 65536;
  return b ? (unsigned)b : 1u;
}

/* ---- GEMM (cuda_gemm.cu) ---- */
void gs_cuda_plans_clear(gs_exec *ex);

size_t gs_cuda_dense_workspace(gs_dtype dt, uint32_t n, uint32_t c, uint32_t oc);
int gs_cuda_dense_forward(gs_exec *ex, gs_dtype dt, void *out, const void *in, const void *w,
                          const void *b, uint32_t n, uint32_t c, uint32_t oc, void *ws,
                          bool relu);
int gs_cuda_dense_backward(gs_exec *ex, gs_dtype dt, void *din, float *dw, float *db,
                           const void *dout, const void *in, const void *w, uint32_t n,
                           uint32_t c, uint32_t oc, void *ws);
size_t gs_cuda_conv2d_workspace(gs_dtype dt, const gs_conv_shape *s);
int gs_cuda_conv2d_forward(gs_exec *ex, gs_dtype dt, void *out, const void *in, const void *w,
                           const void *b, const gs_conv_shape *s, void *ws, bool relu);
int gs_cuda_conv2d_backward(gs_exec *ex, gs_dtype dt, void *din, float *dw, float *db,
                            const void *dout, const void *in, const void *w,
                            const gs_conv_shape *s, void *ws);

/* ---- everything else (cuda_ops.cu) ---- */
/* db (cols) f32 += column sums of x (rows, cols) of dt. ws: NULL, or the
 * GEMM op's workspace, whose first gs_cuda_lt_workspace bytes hold per-chunk
 * partial sums (before the op's GEMMs use them, in stream order). */
int gs_cuda_colsum_add(gs_exec *ex, gs_dtype dt, float *db, const void *x, size_t rows,
                       size_t cols, void *ws);
size_t gs_cuda_depthwise_workspace(gs_dtype dt, const gs_conv_shape *s);
/* memmove of bytes on ex's stream (overlap allowed) */
int gs_cuda_move(gs_exec *ex, void *dst, const void *src, size_t bytes);
int gs_cuda_depthwise_forward(gs_exec *ex, gs_dtype dt, void *out, const void *in,
                              const void *w, const void *b, const gs_conv_shape *s, void *ws,
                              bool relu);
int gs_cuda_depthwise_backward(gs_exec *ex, gs_dtype dt, void *din, float *dw, float *db,
                               const void *dout, const void *in, const void *w,
                               const gs_conv_shape *s, void *ws);
int gs_cuda_maxpool_forward(gs_exec *ex, gs_dtype dt, void *out, const void *in,
                            const gs_conv_shape *s);
int gs_cuda_maxpool_backward(gs_exec *ex, gs_dtype dt, void *din, const void *dout,
                             const void *in, const gs_conv_shape *s);
int gs_cuda_gap_forward(gs_exec *ex, gs_dtype dt, void *out, const void *in, uint32_t n,
                        uint32_t h, uint32_t w, uint32_t c);
int gs_cuda_gap_backward(gs_exec *ex, gs_dtype dt, void *din, const void *dout, uint32_t n,
                         uint32_t h, uint32_t w, uint32_t c);
int gs_cuda_relu_forward(gs_exec *ex, gs_dtype dt, void *out, const void *in, size_t count);
int gs_cuda_relu_backward(gs_exec *ex, gs_dtype dt, void *din, const void *dout,
                          const void *out, size_t count);
int gs_cuda_xent(gs_exec *ex, float *loss, int32_t *pred, float *dlogits, const float *logits,
                 const int32_t *labels, uint32_t n, uint32_t k, const float *grad_scale,
                 float norm);
int gs_cuda_cast(gs_exec *ex, void *dst, gs_dtype dst_dt, const void *src, gs_dtype src_dt,
                 size_t count);
int gs_cuda_unscale_check(gs_exec *ex, float *g, size_t count, const float *scale,
                          int32_t *found_inf);
int gs_cuda_loss_scale_update(gs_exec *ex, float *scale, int32_t *good, int32_t *found_inf,
                              int64_t *skipped, uint32_t growth_interval);
int gs_cuda_sgd_step(gs_exec *ex, float *w, float *g, float *m, size_t count, float lr,
                     float momentum, bool nesterov, float weight_decay, const int32_t *skip);
int gs_cuda_adam_step(gs_exec *ex, float *w, float *g, float *m, float *v, size_t count,
                      float lr, float beta1, float beta2, float eps, float weight_decay,
                      bool decoupled, uint64_t t, const int32_t *skip);

/* ---- normalisation and element-wise ops (cuda_norm.cu) ---- */
int gs_cuda_add_forward(gs_exec *ex, gs_dtype dt, void *out, const void *a, const void *b,
                        size_t count);
int gs_cuda_accumulate(gs_exec *ex, gs_dtype dt, void *dst, const void *src, size_t count);
size_t gs_cuda_batchnorm_workspace(gs_dtype dt, uint32_t m, uint32_t c);
int gs_cuda_batchnorm_forward(gs_exec *ex, gs_dtype dt, void *out, float *mean, float *rstd,
                              float *running_mean, float *running_var, const void *in,
                              const void *gamma, const void *beta, uint32_t m, uint32_t c,
                              float eps, float momentum, bool training, void *ws);
int gs_cuda_batchnorm_backward(gs_exec *ex, gs_dtype dt, void *din, float *dgamma,
                               float *dbeta, const void *dout, const void *in, const void *gamma,
                               const float *mean, const float *rstd, uint32_t m, uint32_t c,
                               void *ws);
int gs_cuda_layernorm_forward(gs_exec *ex, gs_dtype dt, void *out, float *mean, float *rstd,
                              const void *in, const void *gamma, const void *beta, uint32_t m,
                              uint32_t c, float eps);
size_t gs_cuda_layernorm_workspace(gs_dtype dt, uint32_t m, uint32_t c);
int gs_cuda_layernorm_backward(gs_exec *ex, gs_dtype dt, void *din, float *dgamma,
                               float *dbeta, const void *dout, const void *in, const void *gamma,
                               const float *mean, const float *rstd, uint32_t m, uint32_t c,
                               void *ws);
int gs_cuda_gelu_forward(gs_exec *ex, gs_dtype dt, void *out, const void *in, size_t count);
int gs_cuda_gelu_backward(gs_exec *ex, gs_dtype dt, void *din, const void *dout, const void *in,
                          size_t count);
int gs_cuda_dropout_forward(gs_exec *ex, gs_dtype dt, void *out, const void *in, size_t count,
                            float rate, uint64_t seed);
int gs_cuda_dropout_backward(gs_exec *ex, gs_dtype dt, void *din, const void *dout,
                             size_t count, float rate, uint64_t seed);
int gs_cuda_avgpool_forward(gs_exec *ex, gs_dtype dt, void *out, const void *in,
                            const gs_conv_shape *s);
int gs_cuda_avgpool_backward(gs_exec *ex, gs_dtype dt, void *din, const void *dout,
                             const gs_conv_shape *s);

/* Used by cuda_gemm.cu for conv2d: im2col of images [n0, n0+nc) of in (dt)
 * into col (rows, KH*KW*C) of dt; col2im gathers dcol (f32) onto din (dt). */
int gs_cuda_im2col(gs_exec *ex, gs_dtype dt, const gs_conv_shape *s, const void *in, void *col,
                   uint32_t n0, uint32_t nc);
int gs_cuda_col2im(gs_exec *ex, gs_dtype dt, const gs_conv_shape *s, const float *dcol,
                   void *din, uint32_t n0, uint32_t nc);
/* out (rows, cols) of dt: every row = b (cols, dt) */
int gs_cuda_fill_rows(gs_exec *ex, gs_dtype dt, void *out, const void *b, size_t rows,
                      size_t cols);

/* ---- transformer ops (cuda_attn.cu) ---- */
int gs_cuda_embedding_forward(gs_exec *ex, gs_dtype dt, void *out, const int32_t *ids,
                              const void *table, uint32_t rows, uint32_t v, uint32_t c);
int gs_cuda_embedding_backward(gs_exec *ex, gs_dtype dt, float *dtable, const void *dout,
                               const int32_t *ids, uint32_t rows, uint32_t v, uint32_t c);
int gs_cuda_posembed_forward(gs_exec *ex, gs_dtype dt, void *out, const void *in,
                             const void *pos, uint32_t n, uint32_t t, uint32_t c);
int gs_cuda_posembed_backward(gs_exec *ex, gs_dtype dt, void *din, float *dpos,
                              const void *dout, uint32_t n, uint32_t t, uint32_t c);
size_t gs_cuda_attention_workspace(gs_dtype dt, uint32_t n, uint32_t t, uint32_t heads,
                                   uint32_t head_size);
int gs_cuda_attention_forward(gs_exec *ex, gs_dtype dt, void *out, float *probs, const void *qkv,
                              uint32_t n, uint32_t t, uint32_t heads, uint32_t head_size,
                              void *ws);
int gs_cuda_attention_backward(gs_exec *ex, gs_dtype dt, void *dqkv, const void *dout,
                               const void *qkv, const float *probs, uint32_t n, uint32_t t,
                               uint32_t heads, uint32_t head_size, void *ws);

#endif
