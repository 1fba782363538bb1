/*
 * backend.h: the compute contract every gpushare device implements.
 *
 * A backend is a table of functions over device buffers. The training runtime
 * (runtime/) never touches tensor memory itself: it asks the backend to
 * reserve regions (the vdev allocator carves tensors out of them), to copy
 * batches in and results out, and to run the ops below. Two backends share
 * this one contract: `cpu` (kernels/cpu/, C11 + OpenBLAS, the reference) and
 * `cuda` (kernels/cuda/, a plugin loaded where a driver answers). Every CUDA
 * op is tested against its CPU twin on the same inputs.
 *
 * Conventions, the same for every op:
 *  - Tensors are dense, row-major, NHWC for images. Shapes are spelled out in
 *    the comment above each op, as in llm.c.
 *  - `dt` is the storage type of activations and of the working copy of the
 *    weights (fp32, or the 16-bit copy in mixed precision). Math is fp32:
 *    16-bit values are converted on load and rounded (nearest even) on store.
 *  - Weight and bias gradients are always fp32 and are ACCUMULATED (+=), so
 *    gradient accumulation over micro-batches is free and the caller zeroes
 *    them once per optimizer step. Input gradients (`din`) are stored in `dt`
 *    and OVERWRITTEN; `din` may be NULL when the layer is the first.
 *  - Ops that need scratch memory take `ws`, at least the bytes that the
 *    matching `*_workspace` query returns for the same arguments; the runtime
 *    takes it from the job's vdev allocator, so it is charged to the quota.
 *  - Every op returns 0, or a negative value on a device error (never on a
 *    shape error: the runtime validates shapes before it runs anything).
 *    -ENOTRECOVERABLE means the device is lost to this process (a CUDA
 *    sticky error: a kernel fault, an illegal address): every later call
 *    fails the same way, so the process must end and a new one start; the
 *    job whose op saw it first is the one whose step raised it, when steps
 *    of different jobs do not overlap on the device.
 *  - Scalars that a step decides on the device (the loss scale, the
 *    found-inf flag) are passed as device pointers, so a GPU step needs no
 *    host synchronisation.
 *  - `ex` is one job's execution context on the device (its thread budget on
 *    the CPU, its stream on a GPU); ops of one ex run in order.
 */
#ifndef GS_KERNELS_BACKEND_H
#define GS_KERNELS_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The contract's version. The CUDA plugin exports the one it was built
 * against (gs_cuda_plugin_abi, loader.h) and the loader refuses any other:
 * a plugin from before a change of an op's arguments or meaning, of this
 * table's layout or of a type the two share (gs_exec_config, gs_gpu_info)
 * would be called wrongly. Raise it with every such change.
 *   1: the first versioned contract (the optimizers consume their gradient;
 *      the layer forwards take relu).
 *   2: the ops of residual networks and transformers, and the layer
 *      graph's copy_2d, appended to the table. */
#define GS_BACKEND_ABI 2

/* The largest loss scale loss_scale_update grows to: 2^24. */
#define GS_LOSS_SCALE_MAX 16777216.0f

typedef enum gs_dtype {
  GS_F32 = 0,
  GS_F16 = 1,  /* IEEE binary16 */
  GS_BF16 = 2, /* bfloat16 */
} gs_dtype;

size_t gs_dtype_size(gs_dtype dt);
const char *gs_dtype_name(gs_dtype dt); /* "float32", "float16", "bfloat16" */

/* Scalar conversions, round to nearest even; subnormals, infinities and NaN
 * handled. The CPU backend uses them; the tests check them bit for bit. */
uint16_t gs_f32_to_f16(float f);
float gs_f16_to_f32(uint16_t h);
uint16_t gs_f32_to_bf16(float f);
float gs_bf16_to_f32(uint16_t h);

/* Output size of a conv/pool window along one axis. SAME: ceil(in/stride);
 * VALID: floor((in - k) / stride) + 1 (0 when k > in). */
uint32_t gs_window_out(uint32_t in, uint32_t k, uint32_t stride, bool same);
/* Padding before the first element (TensorFlow's SAME: total/2 at the top). */
uint32_t gs_window_pad(uint32_t in, uint32_t k, uint32_t stride, bool same);

/* Geometry of a conv2d / depthwise conv2d / pool: NHWC in, NHWC out. */
typedef struct gs_conv_shape {
  uint32_t n, h, w, c; /* input (N, H, W, C) */
  uint32_t kh, kw;     /* window */
  uint32_t stride;     /* same along both axes */
  bool same;           /* SAME (true) or VALID padding */
  uint32_t f;          /* output channels (conv2d); = c for depthwise/pool */
  uint32_t oh, ow;     /* output height and width: set by gs_conv_shape_init */
} gs_conv_shape;

/* Fill oh/ow (and pad) from the rest; f must be set by the caller. */
void gs_conv_shape_init(gs_conv_shape *s);

typedef struct gs_exec gs_exec;       /* one job's context on a device */
typedef struct gs_backend gs_backend; /* one device */

typedef struct gs_exec_config {
  int threads;      /* CPU: max threads for this job's ops (>= 1) */
  int device_index; /* GPU ordinal; ignored on the CPU */
} gs_exec_config;

struct gs_backend {
  const char *name; /* "cpu" or "cuda" */
  void *impl;       /* backend-private state */

  /* ---- device and memory ---- */
  /* Physical bytes of the device (for the cpu backend: RAM). */
  int (*device_memory)(gs_backend *b, int device_index, uint64_t *total,
                       uint64_t *free_bytes);
  /* Reserve a region of `bytes` (CPU: mmap'd, GPU: cudaMalloc). Returns 0 and
   * *region, or -ENOMEM when the physical device has no more. */
  int (*region_reserve)(gs_backend *b, int device_index, size_t bytes, void **region);
  void (*region_release)(gs_backend *b, int device_index, void *region, size_t bytes);

  int (*exec_create)(gs_backend *b, const gs_exec_config *cfg, gs_exec **ex);
  void (*exec_destroy)(gs_exec *ex);
  /* Wait until every op queued on ex has finished. */
  int (*synchronize)(gs_exec *ex);
  /* The device time of ex's work between timer_start and timer_stop, for the
   * scheduler's per-step accounting of compute shares. cpu: core-seconds of
   * the calling thread and of ex's pool workers, read from their thread CPU
   * clocks, so neither other jobs' threads nor the time the kernel gave the
   * cores to other processes is charged; cuda: the elapsed time between two
   * events recorded on ex's stream (timer_stop waits for the second). Both
   * are called from the thread that queues ex's ops. */
  int (*timer_start)(gs_exec *ex);
  int (*timer_stop)(gs_exec *ex, double *seconds);

  /* Host <-> device copies, ordered with the ops of ex. */
  int (*copy_in)(gs_exec *ex, void *dev_dst, const void *host_src, size_t bytes);
  int (*copy_out)(gs_exec *ex, void *host_dst, const void *dev_src, size_t bytes);
  int (*copy)(gs_exec *ex, void *dev_dst, const void *dev_src, size_t bytes);
  int (*zero)(gs_exec *ex, void *dev_dst, size_t bytes);

  /* The three layer forwards below take `relu`: true applies relu to the
   * output in the same op, the very bits relu_forward(out, out) would give
   * after it (NaN passes). The cpu backend makes no pass of its own for it
   * (each GEMM part's block, each depthwise output row, while still in
   * cache); cuda runs its relu kernel after, on the same stream. */

  /* ---- dense: in (N, C), w (C, OC), b (OC), out (N, OC) ----
   * The cpu backend may skip the zeros of a mostly-zero fp32 input
   * (cpu/cpu_sparse.c): there a zero input adds nothing to out and dw even
   * against an infinite or NaN weight or dout, where a GEMM adds NaN. A
   * non-finite input still propagates. */
  size_t (*dense_workspace)(gs_dtype dt, uint32_t n, uint32_t c, uint32_t oc);
  int (*dense_forward)(gs_exec *ex, gs_dtype dt, void *out, const void *in,
                       const void *w, const void *b, uint32_t n, uint32_t c,
                       uint32_t oc, void *ws, bool relu);
  /* dw (C, OC) f32 +=, db (OC) f32 +=, din (N, C) dt = dout . w^T */
  int (*dense_backward)(gs_exec *ex, gs_dtype dt, void *din, float *dw, float *db,
                        const void *dout, const void *in, const void *w,
                        uint32_t n, uint32_t c, uint32_t oc, void *ws);

  /* ---- conv2d: in (N, H, W, C), w (KH, KW, C, F), b (F), out (N, OH, OW, F) */
  size_t (*conv2d_workspace)(gs_dtype dt, const gs_conv_shape *s);
  int (*conv2d_forward)(gs_exec *ex, gs_dtype dt, void *out, const void *in,
                        const void *w, const void *b, const gs_conv_shape *s, void *ws,
                        bool relu);
  int (*conv2d_backward)(gs_exec *ex, gs_dtype dt, void *din, float *dw, float *db,
                         const void *dout, const void *in, const void *w,
                         const gs_conv_shape *s, void *ws);

  /* ---- depthwise conv2d (multiplier 1): in (N, H, W, C), w (KH, KW, C),
   *      b (C), out (N, OH, OW, C); s->f == s->c. In bf16 on a CPU with
   *      AVX512-BF16 the cpu backend's forward and stride-1 input gradient
   *      multiply bf16 pairs natively (vdpbf16ps: subnormal inputs as zero,
   *      its own rounding of each pair's sum), each output within 2^-8 of
   *      the sum of its terms' magnitudes of the exact value, and the same
   *      bits on any thread count ---- */
  size_t (*depthwise_workspace)(gs_dtype dt, const gs_conv_shape *s);
  int (*depthwise_forward)(gs_exec *ex, gs_dtype dt, void *out, const void *in,
                           const void *w, const void *b, const gs_conv_shape *s, void *ws,
                           bool relu);
  int (*depthwise_backward)(gs_exec *ex, gs_dtype dt, void *din, float *dw, float *db,
                            const void *dout, const void *in, const void *w,
                            const gs_conv_shape *s, void *ws);

  /* ---- max pool (VALID windows, s->same ignored: always VALID):
   *      in (N, H, W, C), out (N, OH, OW, C). Backward routes dout to the
   *      first maximum of each window (recomputed from in), din overwritten. */
  int (*maxpool_forward)(gs_exec *ex, gs_dtype dt, void *out, const void *in,
                         const gs_conv_shape *s);
  int (*maxpool_backward)(gs_exec *ex, gs_dtype dt, void *din, const void *dout,
                          const void *in, const gs_conv_shape *s);

  /* ---- global average pool: in (N, H, W, C), out (N, C) ---- */
  int (*gap_forward)(gs_exec *ex, gs_dtype dt, void *out, const void *in,
                     uint32_t n, uint32_t h, uint32_t w, uint32_t c);
  int (*gap_backward)(gs_exec *ex, gs_dtype dt, void *din, const void *dout,
                      uint32_t n, uint32_t h, uint32_t w, uint32_t c);

  /* ---- relu over `count` elements; out may alias in, din may alias dout.
   *      Backward uses the forward output: din = out > 0 ? dout : 0. ---- */
  int (*relu_forward)(gs_exec *ex, gs_dtype dt, void *out, const void *in, size_t count);
  int (*relu_backward)(gs_exec *ex, gs_dtype dt, void *din, const void *dout,
                       const void *out, size_t count);

  /* ---- softmax cross-entropy, fused and stable (max-subtracted):
   *      logits (N, K) f32, labels (N) int32 in [0, K).
   *      loss (N) f32: -log softmax(logits)[label], per example.
   *      pred (N) int32: argmax of the logits (first on ties); may be NULL.
   *      dlogits (N, K) f32 = (softmax - onehot) * (*grad_scale) / norm, when
   *      not NULL; grad_scale is a device pointer (the loss scale, or 1), norm
   *      the host divisor (examples per optimizer step). ---- */
  int (*xent_forward_backward)(gs_exec *ex, float *loss, int32_t *pred, float *dlogits,
                               const float *logits, const int32_t *labels,
                               uint32_t n, uint32_t k, const float *grad_scale,
                               float norm);

  /* ---- casts: count elements from src (src_dt) to dst (dst_dt) ---- */
  int (*cast)(gs_exec *ex, void *dst, gs_dtype dst_dt, const void *src, gs_dtype src_dt,
              size_t count);

  /* ---- mixed precision bookkeeping ----
   * unscale_check: g (count) f32 *= 1 / (*scale); sets *found_inf = 1 (device
   * int32, never cleared here) if any element of g is inf or NaN. */
  int (*unscale_check)(gs_exec *ex, float *g, size_t count, const float *scale,
                       int32_t *found_inf);
  /* Dynamic loss scaling after a step: if *found_inf: scale *= 0.5 (not below
   * 1), *good = 0, (*skipped)++; else (*good)++ and when *good reaches
   * growth_interval: scale *= 2 (not above GS_LOSS_SCALE_MAX, so a job whose
   * gradients never overflow keeps a finite scale, and 1/scale stays a
   * normal fp32), *good = 0. Then *found_inf = 0. All device. */
  int (*loss_scale_update)(gs_exec *ex, float *scale, int32_t *good, int32_t *found_inf,
                           int64_t *skipped, uint32_t growth_interval);

  /* ---- optimizers over fp32 masters; `skip` (device int32, may be NULL):
   *      when *skip != 0 w, m and v do not change (the fp16 overflow step).
   *      Either way the step consumes g: it leaves every element +0, ready
   *      for the next step's gradients to accumulate into. Clearing in the
   *      update's own pass, where each element has just been read, costs a
   *      store; a clear of its own, before or after the update, would read
   *      all of g again. ----
   * SGD: g' = g + wd*w; m = momentum*m + g' (when momentum > 0);
   *      w -= lr * (nesterov ? g' + momentum*m : (momentum > 0 ? m : g')). */
  int (*sgd_step)(gs_exec *ex, float *w, float *g, float *m, size_t count,
                  float lr, float momentum, bool nesterov, float weight_decay,
                  const int32_t *skip);
  /* Adam / AdamW, t = 1-based step after this update (bias correction).
   * Adam:  g' = g + wd*w.  AdamW (decoupled): w -= lr*wd*w separately.
   * m = b1 m + (1-b1) g'; v = b2 v + (1-b2) g'^2;
   * w -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps). */
  int (*adam_step)(gs_exec *ex, float *w, float *g, float *m, float *v,
                   size_t count, float lr, float beta1, float beta2, float eps,
                   float weight_decay, bool decoupled, uint64_t t, const int32_t *skip);

  /* Device buffers are ordinary host memory (cpu): a caller may write and
   * read them directly, as copy_in and copy_out would, instead of staging
   * through host buffers. false for a GPU. */
  bool host_memory;

  /* Run fn(ctx, lo, hi) over parts of [0, n), each at least `grain` items
   * (but one), on the threads ex's ops run on, the caller's among them;
   * returns when every part is done. For the job's host-side work that feeds
   * its ops: the batch gather, which otherwise runs on one thread while the
   * others wait. NULL where ex has no host threads of its own (cuda): the
   * caller runs fn(ctx, 0, n). */
  void (*host_parallel)(gs_exec *ex, size_t n, size_t grain,
                        void (*fn)(void *ctx, size_t lo, size_t hi), void *ctx);

  /* ==== normalisation and element-wise ops of residual networks and
   *      transformers (cpu/cpu_norm.c, cuda/cuda_norm.cu) ==== */

  /* ---- residual sums over `count` elements of dt, fp32 math, one
   *      rounding per result; bit for bit the same on every backend.
   * add_forward: out = a + b; out may alias a or b (or both).
   * accumulate: dst += src; src is dst itself (doubling it) or does not
   * overlap it. ---- */
  int (*add_forward)(gs_exec *ex, gs_dtype dt, void *out, const void *a, const void *b,
                     size_t count);
  int (*accumulate)(gs_exec *ex, gs_dtype dt, void *dst, const void *src, size_t count);

  /* ---- batch normalisation over channels: in, out (M, C) dt, where M =
   *      N*H*W for NHWC images or N for flat features; gamma, beta (C) dt.
   * Training (training = true): per channel c, over the M rows, the batch
   * mean and then the biased variance var = mean((x - mean)^2), each summed
   * in double over a split of the rows fixed by M (a GPU adds short runs
   * of rows in fp32 first), so the result does not depend on the thread
   * count; rstd = 1 / sqrt(var + eps); out = (x - mean) * rstd *
   * gamma + beta, from the fp32 mean and rstd it saves in mean (C) and
   * rstd (C) f32 for the backward. running_mean, running_var (C) f32 are
   * updated as PyTorch does: r = (1 - momentum) * r + momentum * stat,
   * running_var from the unbiased variance var * M / (M - 1) (var itself
   * when M = 1).
   * Evaluation (training = false): out as above from running_mean and
   * rstd = 1 / sqrt(running_var + eps); nothing else is written (mean and
   * rstd may be NULL).
   * The layer passes PyTorch's defaults, eps = 1e-5 and momentum = 0.1.
   * ws: batchnorm_workspace(dt, m, c) bytes, for the forward (in either
   * mode) and the backward alike. ---- */
  size_t (*batchnorm_workspace)(gs_dtype dt, uint32_t m, uint32_t c);
  int (*batchnorm_forward)(gs_exec *ex, gs_dtype dt, void *out, float *mean, float *rstd,
                           float *running_mean, float *running_var, const void *in,
                           const void *gamma, const void *beta, uint32_t m, uint32_t c,
                           float eps, float momentum, bool training, void *ws);
  /* The training backward, from in and the saved mean and rstd (xhat =
   * (x - mean) * rstd recomputed): dgamma (C) f32 += sum over rows of dout *
   * xhat, dbeta (C) f32 += sum of dout, and
   * din (M, C) dt = gamma * rstd / M * (M * dout - sum(dout) - xhat *
   * sum(dout * xhat)), overwritten (computed as gamma * rstd * (dout -
   * sum(dout) / M - xhat * sum(dout * xhat) / M)); din may be NULL. The
   * sums are taken as the forward's, over the same split of the rows. */
  int (*batchnorm_backward)(gs_exec *ex, gs_dtype dt, void *din, float *dgamma, float *dbeta,
                            const void *dout, const void *in, const void *gamma,
                            const float *mean, const float *rstd, uint32_t m, uint32_t c,
                            void *ws);

  /* ---- layer normalisation over the last dimension: in, out (M, C) dt,
   *      gamma, beta (C) dt. Per row r: mean and biased variance var of its
   *      C values (the squares of x - mean summed after the mean; sums in
   *      double on the cpu, fp32 on a GPU),
   *      rstd = 1 / sqrt(var + eps), out = (x - mean) * rstd * gamma + beta;
   *      mean (M) and rstd (M) f32 saved for the backward (either may be
   *      NULL when no backward follows). The layer passes eps = 1e-5. ---- */
  int (*layernorm_forward)(gs_exec *ex, gs_dtype dt, void *out, float *mean, float *rstd,
                           const void *in, const void *gamma, const void *beta, uint32_t m,
                           uint32_t c, float eps);
  /* From in and the saved mean and rstd (xhat = (x - mean) * rstd), with
   * g = dout * gamma per element: dgamma (C) f32 += sum over rows of dout *
   * xhat, dbeta (C) f32 += sum of dout (double over a split of the rows
   * fixed by M, as batchnorm's), din (M, C) dt = rstd * (g - mean_c(g) -
   * xhat * mean_c(g * xhat)) per row, overwritten; din may be NULL.
   * ws: layernorm_workspace(dt, m, c) bytes. */
  size_t (*layernorm_workspace)(gs_dtype dt, uint32_t m, uint32_t c);
  int (*layernorm_backward)(gs_exec *ex, gs_dtype dt, void *din, float *dgamma, float *dbeta,
                            const void *dout, const void *in, const void *gamma,
                            const float *mean, const float *rstd, uint32_t m, uint32_t c,
                            void *ws);

  /* ---- GELU, the tanh approximation (GPT-2, llm.c, PyTorch's
   *      GELU(approximate='tanh')) over `count` elements:
   *      out = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3);
   *      din = dout * (0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) sqrt(2/pi)
   *      (1 + 3 * 0.044715 x^2)), from the forward's input `in`.
   *      out may alias in (where no backward follows: the backward needs
   *      in); din may alias dout, not in. ---- */
  int (*gelu_forward)(gs_exec *ex, gs_dtype dt, void *out, const void *in, size_t count);
  int (*gelu_backward)(gs_exec *ex, gs_dtype dt, void *din, const void *dout, const void *in,
                       size_t count);

  /* ---- dropout over `count` elements, its mask a pure function of a
   *      64-bit seed and the element's index i (no mask buffer), the same
   *      on every backend: h(i) is output i (0-based) of splitmix64 seeded
   *      with seed, i.e. with all arithmetic mod 2^64,
   *        z = seed + (i + 1) * 0x9E3779B97F4A7C15
   *        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
   *        z = (z ^ (z >> 27)) * 0x94D049BB133111EB
   *        h = z ^ (z >> 31)
   *      and element i is kept iff (h >> 40) >= ceil(rate * 2^24), i.e. iff
   *      the 24-bit uniform (h >> 40) / 2^24 is >= rate. rate in [0, 1).
   *      Forward: out = kept ? x * scale : +0, scale = 1 / (1 - rate)
   *      computed in fp32 (1.0f / (1.0f - rate)), one rounding to dt.
   *      Backward: din = kept ? dout * scale : +0, the same mask from the
   *      same seed. out may alias in, din may alias dout. rate = 0 keeps
   *      every element with scale 1 (out = in). ---- */
  int (*dropout_forward)(gs_exec *ex, gs_dtype dt, void *out, const void *in, size_t count,
                         float rate, uint64_t seed);
  int (*dropout_backward)(gs_exec *ex, gs_dtype dt, void *din, const void *dout,
                          size_t count, float rate, uint64_t seed);

  /* ---- average pool (VALID windows, s->same ignored: always VALID, as
   *      max pool): in (N, H, W, C), out (N, OH, OW, C) = the mean of each
   *      KH x KW window (fp32 sum in window order, divided by KH*KW).
   *      Backward: each input element gets the sum of dout over the windows
   *      that contain it (overlapping windows add), divided by KH*KW; din
   *      overwritten, 0 where no window reaches. ---- */
  int (*avgpool_forward)(gs_exec *ex, gs_dtype dt, void *out, const void *in,
                         const gs_conv_shape *s);
  int (*avgpool_backward)(gs_exec *ex, gs_dtype dt, void *din, const void *dout,
                          const gs_conv_shape *s);
  /* ==== the layer graph (cpu/cpu_backend.c, cuda/cuda_backend.cu) ==== */

  /* ---- rows x width bytes from src (rows spitch bytes apart) to dst (rows
   *      dpitch bytes apart): concat's forward (each input into its
   *      columns) and backward (each input's columns out). The two regions
   *      do not overlap; width <= both pitches. ---- */
  int (*copy_2d)(gs_exec *ex, void *dst, size_t dpitch, const void *src, size_t spitch,
                 size_t width, size_t rows);
  /* ---- transformer ops: embeddings and causal self-attention
   *      (cpu/cpu_attn.c, cuda/cuda_attn.cu) ----
   * Token embedding: ids (ROWS) int32 in [0, V) (device), table (V, C) dt,
   * out (ROWS, C) dt = table[ids], copied bit for bit (ROWS = N*T).
   * Backward: dtable (V, C) f32 += the dout rows of each id, added in token
   * order (so the two backends give the same bits, whatever the threads).
   * An id outside [0, V): the cpu returns -EINVAL before writing anything;
   * cuda (which cannot return it without a synchronisation) writes NaN for
   * that row of out and leaves dtable without its row's contribution. */
  int (*embedding_forward)(gs_exec *ex, gs_dtype dt, void *out, const int32_t *ids,
                           const void *table, uint32_t rows, uint32_t v, uint32_t c);
  int (*embedding_backward)(gs_exec *ex, gs_dtype dt, float *dtable, const void *dout,
                            const int32_t *ids, uint32_t rows, uint32_t v, uint32_t c);
  /* Learned position embedding: in (N, T, C) dt, pos (T, C) dt,
   * out (N, T, C) dt = in + pos[t] (fp32 add, one rounding); out may alias
   * in. Backward: dpos (T, C) f32 += the sum over N of dout, added in n
   * order; din (N, T, C) dt = dout, bit for bit; din may be dout itself
   * (nothing to copy) or NULL. */
  int (*posembed_forward)(gs_exec *ex, gs_dtype dt, void *out, const void *in, const void *pos,
                          uint32_t n, uint32_t t, uint32_t c);
  int (*posembed_backward)(gs_exec *ex, gs_dtype dt, void *din, float *dpos, const void *dout,
                           uint32_t n, uint32_t t, uint32_t c);
  /* Causal multi-head self-attention, the core between the projections
   * (H heads of D channels; HD = H*D):
   *   qkv (N, T, 3*HD) dt: q | k | v, head h's q at columns h*D .. h*D+D-1,
   *       its k at HD + h*D, its v at 2*HD + h*D (llm.c's layout, and
   *       PyTorch's nn.MultiheadAttention in_proj);
   *   probs (N, H, T, T) f32, written by the forward, kept for the backward:
   *       row t = softmax over s <= t of q_t . k_s / sqrt(D) (max
   *       subtracted, fp32 whatever dt), exactly 0 for s > t;
   *   out (N, T, HD) dt: out_t of head h = sum over s of probs[t][s] v_s.
   * Backward: dqkv (N, T, 3*HD) dt OVERWRITTEN from dout (N, T, HD), qkv
   * and probs: dv_s = sum_t probs[t][s] dout_t; dP = dout_t . v_s;
   * dS = probs * (dP - sum_s probs dP); dq_t = dS_t . k / sqrt(D);
   * dk_s = sum_t dS[t][s] q_t / sqrt(D). A masked (t, s) adds nothing to
   * any gradient. ws: attention_workspace(dt, n, t, heads, head_size)
   * bytes, for the forward and the backward alike. */
  size_t (*attention_workspace)(gs_dtype dt, uint32_t n, uint32_t t, uint32_t heads,
                                uint32_t head_size);
  int (*attention_forward)(gs_exec *ex, gs_dtype dt, void *out, float *probs, const void *qkv,
                           uint32_t n, uint32_t t, uint32_t heads, uint32_t head_size,
                           void *ws);
  int (*attention_backward)(gs_exec *ex, gs_dtype dt, void *dqkv, const void *dout,
                            const void *qkv, const float *probs, uint32_t n, uint32_t t,
                            uint32_t heads, uint32_t head_size, void *ws);
};

/* The CPU backend: always available. */
gs_backend *gs_backend_cpu(void);

/* The instruction-set level the CPU backend's own loops run at (*name:
 * "baseline", "avx2", "avx512" or "avx512bf16"; the GEMMs are OpenBLAS's
 * own choice): the highest this CPU has, or the lower one the environment
 * variable GS_CPU_ISA names. Returns 0, or -EINVAL with why (a sentence
 * naming the variable, its value and what is allowed) when GS_CPU_ISA
 * names no level or one this CPU lacks; the highest runs then. */
int gs_cpu_isa_status(const char **name, char *why, size_t why_len);

#endif
