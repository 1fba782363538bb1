/*
 * cpu_internal.h: what the files of the cpu backend share, and nothing
 * more: the exec (one job's thread budget and its small worker pool), the
 * parallel-range helper, the row-split GEMM and the array conversions
 * between the storage types and fp32. Not installed, not part of the
 * contract; backend.h is.
 */
#ifndef GS_KERNELS_CPU_INTERNAL_H
#define GS_KERNELS_CPU_INTERNAL_H

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/backend.h"

/* fn(ctx, lo, hi) processes items [lo, hi) of a range split over threads. */
typedef void (*gs_cpu_range_fn)(void *ctx, size_t lo, size_t hi);

struct gs_cpu_worker {
  gs_exec *ex;   /* the exec whose ranges this thread runs */
  int id;        /* 1..nworkers: the part of each range it takes */
  pthread_t tid; /* the thread */
};

struct gs_exec {
  int threads;            /* threads this job's ops may use, caller included */
  int nworkers;           /* pool threads (threads - 1) actually started */
  struct gs_cpu_worker *workers; /* the pool, started at exec_create */
  cpu_set_t allowed;      /* the CPUs the workers may run on, as started */
  bool have_allowed;      /* pthread_getaffinity_np answered */
  /* Posting a range and waiting for it spin first and sleep only after
   * GS_CPU_SPIN_NS: a training step posts one range every few hundred
   * microseconds, and a futex wake-up of a sleeping worker costs tens of
   * them on a virtual machine. The atomics below are the fast path; mu and
   * the condition variables are for a thread that gave up spinning. */
  _Atomic uint64_t gen;   /* bumped (release) once a range is posted */
  _Atomic int poster_cpu; /* the CPU the caller posted the range from, -1: unknown */
  _Atomic int pending;    /* workers still running the current range */
  _Atomic int sleepers;   /* workers blocked on `wake` */
  _Atomic bool waiting;   /* the caller is blocked on `done` */
  _Atomic bool stop;      /* exec_destroy asked the pool to leave */
  pthread_mutex_t mu;     /* pairs with wake and done, guards no data */
  pthread_cond_t wake;    /* gen changed or stop, for sleeping workers */
  pthread_cond_t done;    /* pending reached 0, for a sleeping caller */
  gs_cpu_range_fn fn;     /* the current range's function (published by gen) */
  void *ctx;              /* and its argument */
  size_t n;               /* items in the current range */
  int parts;              /* parts it is split into (part 0 is the caller's) */
  double timer_t0;        /* core-seconds at timer_start */
};

/* Split [0, n) into at most ex->threads parts of at least `grain` items and
 * run them on the pool (the caller runs part 0); returns when all are done. */
void gs_cpu_parallel(gs_exec *ex, size_t n, size_t grain, gs_cpu_range_fn fn, void *ctx);

/* Row-major C (M,N) = alpha * op(A) op(B) + beta * C with cblas_sgemm, split
 * over rows of C (or columns when C is short and wide) across ex's threads,
 * each part a single-threaded OpenBLAS call. */
void gs_cpu_sgemm(gs_exec *ex, bool trans_a, bool trans_b, size_t m, size_t n, size_t k,
                  float alpha, const float *a, size_t lda, const float *b, size_t ldb,
                  float beta, float *c, size_t ldc);

/* Multiply-adds (M*N*K) a part of gs_cpu_sgemm has at least; a smaller
 * GEMM runs on the calling thread. A part of 2^16 still takes OpenBLAS
 * several times as long as a spinning worker needs to start on a posted
 * range, so even a small layer such as fashion-mlp's 128x128 -> 10 head
 * (164,000) is split. */
#define GS_CPU_GEMM_GRAIN ((size_t)1 << 16)

/* Multiply-adds under which a layer's two backward GEMMs run side by side,
 * one on each of two threads (gs_cpu_linear_backward), rather than each
 * split over the threads in turn: each is too small to split well and the
 * two are independent (fashion-mlp's 128x10 head). */
#define GS_CPU_GEMM_PAIR_MAX ((size_t)1 << 19)

/* gs_cpu_sgemm on the calling thread only: for a part of a parallel range,
 * which may not post a range of its own. */
void gs_cpu_sgemm_here(bool trans_a, bool trans_b, size_t m, size_t n, size_t k, float alpha,
                       const float *a, size_t lda, const float *b, size_t ldb, float beta,
                       float *c, size_t ldc);

/* A layer's forward GEMM: row-major C (M,N) = A (M,K) . B (K,N) + bias (N)
 * in every row, or + beta * C when bias is NULL; then, with relu, relu(C)
 * (gs_cpu_relu_rows). Split as gs_cpu_sgemm; each part writes its own
 * block's bias rows first and applies relu to its block last, while it is
 * still in the core's cache. */
void gs_cpu_sgemm_fwd(gs_exec *ex, size_t m, size_t n, size_t k, const float *a, size_t lda,
                      const float *b, size_t ldb, const float *bias, float beta, bool relu,
                      float *c, size_t ldc);

/* relu of one fp32 value, as every relu of the cpu backend computes it: NaN
 * passes through, -0 becomes +0. */
static inline float gs_cpu_relu1(float v) { return (v > 0.0f || v != v) ? v : 0.0f; }

/* relu over rows [0, m) x columns [0, n) of a row-major block with stride
 * ldc, in place: the bits of relu_forward. */
void gs_cpu_relu_rows(float *c, size_t m, size_t n, size_t ldc);

/* db (F) += the column sums of dout (M, F), split by columns across ex's
 * threads: each column is summed in row order, as on one thread. */
void gs_cpu_bias_grad(gs_exec *ex, float *db, const float *dout, size_t m, size_t f);
/* The same on the calling thread, with the same sums. */
void gs_cpu_bias_grad_here(float *db, const float *dout, size_t m, size_t f);

/* count elements of dt at src -> fp32 at dst, and back (nearest even). */
void gs_cpu_load_f32(gs_dtype dt, const void *src, float *dst, size_t count);
void gs_cpu_store_f32(gs_dtype dt, void *dst, const float *src, size_t count);
/* The same over ex's threads, for large arrays. */
void gs_cpu_load_f32_par(gs_exec *ex, gs_dtype dt, const void *src, float *dst, size_t count);
void gs_cpu_store_f32_par(gs_exec *ex, gs_dtype dt, void *dst, const float *src, size_t count);

/* Element offset -> byte pointer for a tensor of dt. */
static inline const void *gs_cpu_at(gs_dtype dt, const void *p, size_t i) {
  return (const char *)p + i * gs_dtype_size(dt);
}
static inline void *gs_cpu_at_mut(gs_dtype dt, void *p, size_t i) {
  return (char *)p + i * gs_dtype_size(dt);
}

/* Channel block that inner loops keep on the stack (floats). */
#define GS_CPU_CB 128
/* Floats in one AVX vector: the block of loops written for registers. */
#define GS_CPU_VB 8

/* The hot loops of the cpu backend are built three times, for the
 * baseline, for AVX2 (with FMA and F16C) and for AVX-512 (F, BW, VL, DQ),
 * and each call picks one by the instruction-set level in use
 * (gs_cpu_isa: the highest this CPU has, or a lower one named by the
 * environment variable GS_CPU_ISA), so the package runs anywhere, uses the
 * wide vectors where they exist, and a test can run every path the host
 * has. A range function is written once:
 *
 *   GS_CPU_RANGE(name, ctx, lo, hi, isa) { ...body... }
 *
 * which defines the body (always inlined) and one clone per level, each
 * compiled with that level's target attribute, and GS_CPU_PICK(name) is
 * the clone for the level in use. `isa` is the clone's level as a
 * constant (GS_CPU_ISA_BASELINE, _AVX2, _AVX512), for a body that blocks
 * its registers by the vector width. The clones compute the same bits:
 * -ffp-contract=off keeps the compiler from contracting a * b + c into an
 * FMA, and without -ffast-math it never reorders a sum, so only the vector
 * width differs (test_kernels_isa checks every level's bits against the
 * baseline's). */
enum {
  GS_CPU_ISA_BASELINE = 0, /* SSE2 */
  GS_CPU_ISA_AVX2 = 1,     /* AVX2, FMA, F16C */
  GS_CPU_ISA_AVX512 = 2,   /* AVX-512 F, BW, VL, DQ */
  GS_CPU_ISA_AVX512BF16 = 3, /* the same and AVX512-BF16 (vdpbf16ps) */
  GS_CPU_ISA_LEVELS = 4
};
/* The level in use: GS_CPU_ISA's, where it names one this CPU has, else
 * the highest this CPU has. Read once; cheap after. */
int gs_cpu_isa(void);
/* The highest level this CPU has. */
int gs_cpu_isa_max(void);
/* "baseline", "avx2", "avx512", "avx512bf16" */
const char *gs_cpu_isa_name(int level);
/* Run at `level` from now on (the tests' way through every path): 0, or
 * -EINVAL when this CPU lacks it. Not for a process with jobs running. */
int gs_cpu_isa_set(int level);
/* The clone of the GS_CPU_RANGE loops for the level in use. */
static inline int gs_cpu_clone(void) {
  int l = gs_cpu_isa();
  return l > GS_CPU_ISA_AVX512 ? GS_CPU_ISA_AVX512 : l;
}

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define GS_CPU_X86_TARGETS 1
/* GCC's vectoriser keeps to 256-bit vectors with AVX-512 unless told to
 * prefer 512 (clang has no such target option) */
#ifdef __clang__
#define GS_CPU_PREFER512
#else
#define GS_CPU_PREFER512 ",prefer-vector-width=512"
#endif
#define GS_CPU_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define GS_CPU_TARGET_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c" GS_CPU_PREFER512)))
#define GS_CPU_TARGET_AVX512BF16                                                      \
  __attribute__((target("avx512bf16,avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c" \
                        GS_CPU_PREFER512)))
#else
#define GS_CPU_TARGET_AVX2
#define GS_CPU_TARGET_AVX512
#define GS_CPU_TARGET_AVX512BF16
#endif

#define GS_CPU_RANGE(name, ctx, lo, hi, isa)                                                  \
  static inline __attribute__((always_inline)) void name##_body(                             \
      void *ctx, size_t lo, size_t hi, __attribute__((unused)) const int isa);               \
  static void name##_base(void *c_, size_t l_, size_t h_) {                                  \
    name##_body(c_, l_, h_, GS_CPU_ISA_BASELINE);                                            \
  }                                                                                          \
  GS_CPU_TARGET_AVX2 static void name##_avx2(void *c_, size_t l_, size_t h_) {               \
    name##_body(c_, l_, h_, GS_CPU_ISA_AVX2);                                                \
  }                                                                                          \
  GS_CPU_TARGET_AVX512 static void name##_avx512(void *c_, size_t l_, size_t h_) {           \
    name##_body(c_, l_, h_, GS_CPU_ISA_AVX512);                                              \
  }                                                                                          \
  static const gs_cpu_range_fn name##_isa[3] = {name##_base, name##_avx2, name##_avx512};    \
  static inline __attribute__((always_inline)) void name##_body(                             \
      void *ctx, size_t lo, size_t hi, __attribute__((unused)) const int isa)
#define GS_CPU_PICK(name) (name##_isa[gs_cpu_clone()])

/* GS_CPU_VB floats as one value (GCC's vector extension: one AVX register
 * in the AVX2 and AVX-512 clones, two SSE registers in the baseline one). Loads and
 * stores go through memcpy, so they need no alignment. Macros, not
 * functions: a vector passed by value would change the calling convention
 * between the clones. */
typedef float gs_v8 __attribute__((vector_size(GS_CPU_VB * sizeof(float))));
#define GS_V8_LOAD(v, p) memcpy(&(v), (p), sizeof(gs_v8))
#define GS_V8_STORE(p, v) memcpy((p), &(v), sizeof(gs_v8))
/* 16 floats: one AVX-512 register, for the loops that block by it in the
 * AVX-512 clone (the same loads and stores through memcpy). */
typedef float gs_v16 __attribute__((vector_size(16 * sizeof(float))));

/* fp32 dense layers on mostly-zero inputs (cpu_sparse.c): the forward and
 * the weight gradient spend a multiply-add on each nonzero input only.
 * Taken when the input holds at most MAX_DENSITY nonzeros (below the
 * density at which the path breaks even with OpenBLAS on fashion-mlp's
 * first layer, forward and gradient alike) and its
 * first 8 rows at most PROBE_DENSITY (a cheap first look that turns a
 * plainly dense input away before it is listed), for layers of at least
 * MIN_MACS multiply-adds (N * C * OC). */
#define GS_CPU_SPARSE_MAX_DENSITY 0.55
#define GS_CPU_SPARSE_PROBE_DENSITY 0.8
#define GS_CPU_SPARSE_MIN_MACS ((size_t)1 << 20)
/* Whether a layer of these sizes may take the path; its workspace (bytes,
 * 0 when it may not). */
bool gs_cpu_sparse_eligible(size_t n, size_t c, size_t oc);
size_t gs_cpu_sparse_workspace(size_t n, size_t c, size_t oc);
/* out (N, OC) = in (N, C) . w (C, OC) + b (or 0 when b is NULL), relu'd
 * when asked; false (out untouched; the workspace may hold lists) when the
 * path does not apply: no workspace, not eligible, no AVX2 and FMA, or too
 * many nonzeros. */
bool gs_cpu_sparse_forward(gs_exec *ex, float *out, const float *in, const float *w,
                           const float *b, size_t n, size_t c, size_t oc, bool relu, void *ws);
/* dw (C, OC) += in^T . dout (N, OC); false (dw untouched) as above. */
bool gs_cpu_sparse_wgrad(gs_exec *ex, float *dw, const float *dout, const float *in, size_t n,
                         size_t c, size_t oc, void *ws);
/* Calls that took the path, for the tests that check it was taken. */
extern _Atomic uint64_t gs_cpu_sparse_calls;

/* The backward of a linear map out (M, F) = in (M, K) . w (K, F) + b, all
 * fp32: db (F) += column sums of dout, dw (K, F) += in^T . dout, din (M, K)
 * = dout . w^T; each may be NULL, and din may be `in` itself (written last).
 * Dense layers and 1x1 convolutions (cpu_dense.c). */
void gs_cpu_linear_backward(gs_exec *ex, float *din, float *dw, float *db, const float *dout,
                            const float *in, const float *w, size_t m, size_t k, size_t f);

/* Ops, one group a file (cpu_dense.c, cpu_conv.c, cpu_elem.c). */
size_t gs_cpu_dense_workspace(gs_dtype dt, uint32_t n, uint32_t c, uint32_t oc);
int gs_cpu_dense_forward(gs_exec *ex, gs_dtype dt, void *out, const void *in, const void *w,
                         const void *b, uint32_t n, uint32_t c, uint32_t oc, void *ws,
                         bool relu);
int gs_cpu_dense_backward(gs_exec *ex, gs_dtype dt, void *din, float *dw, float *db,
                          const void *dout, const void *in, const void *w, uint32_t n,
                          uint32_t c, uint32_t oc, void *ws);

/* A convolution's geometry as the conv loops use it: input (N, H, W, C),
 * window KH x KW at `stride`, F output channels, output OH x OW, padding
 * pt above and pl left. */
typedef struct gs_cpu_geo {
  long n, h, w, c, kh, kw, stride, f, oh, ow, pt, pl;
} gs_cpu_geo;
/* fp32 conv2d by direct AVX2/AVX-512 loops (cpu_conv_direct.c): whether dt at
 * the level in use takes them; the floats of workspace the padded copy of
 * `images` images takes (0 where the input is read in place); out (N, OH,
 * OW, F) = conv(in, w) + b (or 0 when b is NULL), relu'd when asked; dw
 * (KH, KW, C, F) += in^T . dout per tap. Each returns false (nothing
 * written) when ws_floats cannot hold one image's padded copy. */
bool gs_cpu_dconv_ok(gs_dtype dt);
size_t gs_cpu_dconv_pad_floats(const gs_cpu_geo *g, long images);
bool gs_cpu_dconv_forward(gs_exec *ex, const gs_cpu_geo *g, const float *in, const float *w,
                          const float *b, bool relu, float *out, float *ws, size_t ws_floats);
bool gs_cpu_dconv_wgrad(gs_exec *ex, const gs_cpu_geo *g, const float *in, const float *dout,
                        float *dw, float *ws, size_t ws_floats);
size_t gs_cpu_conv2d_workspace(gs_dtype dt, const gs_conv_shape *s);
int gs_cpu_conv2d_forward(gs_exec *ex, gs_dtype dt, void *out, const void *in, const void *w,
                          const void *b, const gs_conv_shape *s, void *ws, bool relu);
int gs_cpu_conv2d_backward(gs_exec *ex, gs_dtype dt, void *din, float *dw, float *db,
                           const void *dout, const void *in, const void *w,
                           const gs_conv_shape *s, void *ws);
size_t gs_cpu_depthwise_workspace(gs_dtype dt, const gs_conv_shape *s);
int gs_cpu_depthwise_forward(gs_exec *ex, gs_dtype dt, void *out, const void *in,
                             const void *w, const void *b, const gs_conv_shape *s, void *ws,
                             bool relu);
int gs_cpu_depthwise_backward(gs_exec *ex, gs_dtype dt, void *din, float *dw, float *db,
                              const void *dout, const void *in, const void *w,
                              const gs_conv_shape *s, void *ws);
int gs_cpu_maxpool_forward(gs_exec *ex, gs_dtype dt, void *out, const void *in,
                           const gs_conv_shape *s);
int gs_cpu_maxpool_backward(gs_exec *ex, gs_dtype dt, void *din, const void *dout,
                            const void *in, const gs_conv_shape *s);
int gs_cpu_gap_forward(gs_exec *ex, gs_dtype dt, void *out, const void *in, uint32_t n,
                       uint32_t h, uint32_t w, uint32_t c);
int gs_cpu_gap_backward(gs_exec *ex, gs_dtype dt, void *din, const void *dout, uint32_t n,
                        uint32_t h, uint32_t w, uint32_t c);

int gs_cpu_relu_forward(gs_exec *ex, gs_dtype dt, void *out, const void *in, size_t count);
int gs_cpu_relu_backward(gs_exec *ex, gs_dtype dt, void *din, const void *dout,
                         const void *out, size_t count);
int gs_cpu_xent(gs_exec *ex, float *loss, int32_t *pred, float *dlogits, const float *logits,
                const int32_t *labels, uint32_t n, uint32_t k, const float *grad_scale,
                float norm);
int gs_cpu_cast(gs_exec *ex, void *dst, gs_dtype dst_dt, const void *src, gs_dtype src_dt,
                size_t count);
int gs_cpu_unscale_check(gs_exec *ex, float *g, size_t count, const float *scale,
                         int32_t *found_inf);
int gs_cpu_loss_scale_update(gs_exec *ex, float *scale, int32_t *good, int32_t *found_inf,
                             int64_t *skipped, uint32_t growth_interval);
int gs_cpu_sgd_step(gs_exec *ex, float *w, float *g, float *m, size_t count, float lr,
                    float momentum, bool nesterov, float weight_decay, const int32_t *skip);
int gs_cpu_adam_step(gs_exec *ex, float *w, float *g, float *m, float *v, size_t count,
                     float lr, float beta1, float beta2, float eps, float weight_decay,
                     bool decoupled, uint64_t t, const int32_t *skip);

/* Normalisation and element-wise ops of residual networks and transformers
 * (cpu_norm.c). */
int gs_cpu_add_forward(gs_exec *ex, gs_dtype dt, void *out, const void *a, const void *b,
                       size_t count);
int gs_cpu_accumulate(gs_exec *ex, gs_dtype dt, void *dst, const void *src, size_t count);
size_t gs_cpu_batchnorm_workspace(gs_dtype dt, uint32_t m, uint32_t c);
int gs_cpu_batchnorm_forward(gs_exec *ex, gs_dtype dt, void *out, float *mean, float *rstd,
                             float *running_mean, float *running_var, const void *in,
                             const void *gamma, const void *beta, uint32_t m, uint32_t c,
                             float eps, float momentum, bool training, void *ws);
int gs_cpu_batchnorm_backward(gs_exec *ex, gs_dtype dt, void *din, float *dgamma, float *dbeta,
                              const void *dout, const void *in, const void *gamma,
                              const float *mean, const float *rstd, uint32_t m, uint32_t c,
                              void *ws);
int gs_cpu_layernorm_forward(gs_exec *ex, gs_dtype dt, void *out, float *mean, float *rstd,
                             const void *in, const void *gamma, const void *beta, uint32_t m,
                             uint32_t c, float eps);
size_t gs_cpu_layernorm_workspace(gs_dtype dt, uint32_t m, uint32_t c);
int gs_cpu_layernorm_backward(gs_exec *ex, gs_dtype dt, void *din, float *dgamma, float *dbeta,
                              const void *dout, const void *in, const void *gamma,
                              const float *mean, const float *rstd, uint32_t m, uint32_t c,
                              void *ws);
int gs_cpu_gelu_forward(gs_exec *ex, gs_dtype dt, void *out, const void *in, size_t count);
int gs_cpu_gelu_backward(gs_exec *ex, gs_dtype dt, void *din, const void *dout, const void *in,
                         size_t count);
int gs_cpu_dropout_forward(gs_exec *ex, gs_dtype dt, void *out, const void *in, size_t count,
                           float rate, uint64_t seed);
int gs_cpu_dropout_backward(gs_exec *ex, gs_dtype dt, void *din, const void *dout,
                            size_t count, float rate, uint64_t seed);
int gs_cpu_avgpool_forward(gs_exec *ex, gs_dtype dt, void *out, const void *in,
                           const gs_conv_shape *s);
int gs_cpu_avgpool_backward(gs_exec *ex, gs_dtype dt, void *din, const void *dout,
                            const gs_conv_shape *s);
/* Transformer ops (cpu_attn.c). */
int gs_cpu_embedding_forward(gs_exec *ex, gs_dtype dt, void *out, const int32_t *ids,
                             const void *table, uint32_t rows, uint32_t v, uint32_t c);
int gs_cpu_embedding_backward(gs_exec *ex, gs_dtype dt, float *dtable, const void *dout,
                              const int32_t *ids, uint32_t rows, uint32_t v, uint32_t c);
int gs_cpu_posembed_forward(gs_exec *ex, gs_dtype dt, void *out, const void *in,
                            const void *pos, uint32_t n, uint32_t t, uint32_t c);
int gs_cpu_posembed_backward(gs_exec *ex, gs_dtype dt, void *din, float *dpos,
                             const void *dout, uint32_t n, uint32_t t, uint32_t c);
size_t gs_cpu_attention_workspace(gs_dtype dt, uint32_t n, uint32_t t, uint32_t heads,
                                  uint32_t head_size);
int gs_cpu_attention_forward(gs_exec *ex, gs_dtype dt, void *out, float *probs,
                             const void *qkv, uint32_t n, uint32_t t, uint32_t heads,
                             uint32_t head_size, void *ws);
int gs_cpu_attention_backward(gs_exec *ex, gs_dtype dt, void *dqkv, const void *dout,
                              const void *qkv, const float *probs, uint32_t n, uint32_t t,
                              uint32_t heads, uint32_t head_size, void *ws);

#endif
