/*
 * cpu_elem.c: the element-wise ops of a step: relu, the fused softmax
 * cross-entropy, casts, the mixed-precision bookkeeping (unscale and check,
 * dynamic loss scale) and the optimizers (SGD with momentum / nesterov /
 * weight decay, Adam and AdamW), exactly as backend.h writes their formulas.
 *
 * relu works on the 16-bit patterns directly (a sign test; NaN passes
 * through so an overflow still reaches the found-inf check), so it needs no
 * conversion. Large arrays are split over the exec's threads through
 * gs_cpu_parallel; below the grain they run on the job's thread, where a
 * worker's wake-up would cost more than the loop.
 */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu_internal.h"

/* "No dependence between iterations" for gcc's vectoriser; clang (the fuzz
 * build) vectorises these loops with its own alias checks. */
#if defined(__GNUC__) && !defined(__clang__)
#define GS_IVDEP _Pragma("GCC ivdep")
#else
#define GS_IVDEP
#endif

/* Elements below which an element-wise op stays on the job's thread: a
 * few microseconds of work, about what handing a range to a spinning
 * worker costs (cpu_backend.c). */
#define GS_CPU_ELEM_GRAIN ((size_t)1 << 13)

/* ---- relu ---- */

struct relu_job {
  gs_dtype dt;
  void *dst;
  const void *a, *b; /* forward: a = in; backward: a = dout, b = out */
};

/* Patterns of +inf: a 16-bit value v is > 0 iff 1 <= v <= inf. */
static uint16_t inf_bits(gs_dtype dt) { return dt == GS_F16 ? 0x7c00 : 0x7f80; }

/* y[i] = relu(x[i]), i < n; y may be x (in place). */
static inline __attribute__((always_inline)) void relu_f32(float *y, const float *x, size_t n) {
GS_IVDEP
  for (size_t i = 0; i < n; i++)
    y[i] = gs_cpu_relu1(x[i]);
}

static inline __attribute__((always_inline)) void relu_rows(float *c, size_t m, size_t n,
                                                            size_t ldc) {
  for (size_t r = 0; r < m; r++)
    relu_f32(c + r * ldc, c + r * ldc, n);
}
static void relu_rows_base(float *c, size_t m, size_t n, size_t ldc) { relu_rows(c, m, n, ldc); }
GS_CPU_TARGET_AVX2 static void relu_rows_avx2(float *c, size_t m, size_t n, size_t ldc) {
  relu_rows(c, m, n, ldc);
}
GS_CPU_TARGET_AVX512 static void relu_rows_avx512(float *c, size_t m, size_t n, size_t ldc) {
  relu_rows(c, m, n, ldc);
}

void gs_cpu_relu_rows(float *c, size_t m, size_t n, size_t ldc) {
  static void (*const clone[3])(float *, size_t, size_t, size_t) = {
      relu_rows_base, relu_rows_avx2, relu_rows_avx512};
  clone[gs_cpu_clone()](c, m, n, ldc);
}

GS_CPU_RANGE(relu_fwd_part, ctx, lo, hi, isa) {
  const struct relu_job *j = ctx;
  if (j->dt == GS_F32) {
    relu_f32((float *)j->dst + lo, (const float *)j->a + lo, hi - lo);
    return;
  }
  const uint16_t *x = j->a;
  uint16_t *y = j->dst;
  uint16_t inf = inf_bits(j->dt);
  for (size_t i = lo; i < hi; i++) {
    uint16_t v = x[i];
    bool keep = !(v & 0x8000u) || (uint16_t)(v & 0x7fffu) > inf; /* >= 0, or NaN */
    y[i] = keep ? v : 0;
  }
}

GS_CPU_RANGE(relu_bwd_part, ctx, lo, hi, isa) {
  const struct relu_job *j = ctx;
  if (j->dt == GS_F32) {
    const float *d = j->a, *o = j->b;
    float *g = j->dst; /* may be d: the runtime passes din == dout */
    /* ivdep: g[i] depends on d[i] and o[i] only, so even in place there is
     * no dependence between iterations. */
GS_IVDEP
    for (size_t i = lo; i < hi; i++) {
      /* Both loads unconditional, so the select vectorises (a load under
       * the condition kept this loop scalar). */
      float dv = d[i], ov = o[i];
      g[i] = ov > 0.0f ? dv : 0.0f;
    }
    return;
  }
  const uint16_t *d = j->a, *o = j->b;
  uint16_t *g = j->dst;
  uint16_t inf = inf_bits(j->dt);
  for (size_t i = lo; i < hi; i++)
    g[i] = (uint16_t)(o[i] - 1u) < inf ? d[i] : 0; /* 0 < out <= +inf */
}

int gs_cpu_relu_forward(gs_exec *ex, gs_dtype dt, void *out, const void *in, size_t count) {
  struct relu_job j = {.dt = dt, .dst = out, .a = in};
  gs_cpu_parallel(ex, count, GS_CPU_ELEM_GRAIN, GS_CPU_PICK(relu_fwd_part), &j);
  return 0;
}

int gs_cpu_relu_backward(gs_exec *ex, gs_dtype dt, void *din, const void *dout,
                         const void *out, size_t count) {
  struct relu_job j = {.dt = dt, .dst = din, .a = dout, .b = out};
  gs_cpu_parallel(ex, count, GS_CPU_ELEM_GRAIN, GS_CPU_PICK(relu_bwd_part), &j);
  return 0;
}

/* ---- softmax cross-entropy ---- */

/* logits (N, K) f32, labels (N) in [0, K): loss (N), pred (N) or NULL,
 * dlogits (N, K) or NULL = (softmax - onehot) * (*grad_scale) / norm.
 * A label outside [0, K) is bad data, not a shape: -EINVAL before anything
 * is read out of bounds or written. Rows are split over the exec's threads. */
struct xent_job {
  float *loss, *dlogits;
  int32_t *pred;
  const float *logits;
  const int32_t *labels;
  uint32_t k;
  float g;
};

static void xent_part(void *ctx, size_t lo, size_t hi) {
  const struct xent_job *j = ctx;
  const uint32_t k = j->k;
  const float g = j->g;
  for (size_t i = lo; i < hi; i++) {
    const float *x = j->logits + i * k;
    int32_t lab = j->labels[i];
    float mx = x[0];
    uint32_t arg = 0;
    for (uint32_t c = 1; c < k; c++)
      if (x[c] > mx) {
        mx = x[c];
        arg = c;
      }
    /* Each exponential is taken once: it waits in dlogits for the sum
     * (expf is most of this op). */
    float *d = j->dlogits ? j->dlogits + i * k : NULL;
    const float xlab = x[lab] - mx; /* read before d is written */
    float sum = 0.0f;
    for (uint32_t c = 0; c < k; c++) {
      float ec = expf(x[c] - mx);
      if (d)
        d[c] = ec;
      sum += ec;
    }
    if (j->loss)
      j->loss[i] = logf(sum) - xlab;
    if (j->pred)
      j->pred[i] = (int32_t)arg;
    if (d) {
      float inv = 1.0f / sum;
      for (uint32_t c = 0; c < k; c++)
        d[c] = d[c] * inv * g;
      d[lab] -= g;
    }
  }
}

/* Rows a part of the loss should have at least, as exponentials: 10-class
 * logits of a 128 batch split in two, rather than run on the job's thread
 * while its workers wait. */
#define GS_CPU_XENT_GRAIN 512u

int gs_cpu_xent(gs_exec *ex, float *loss, int32_t *pred, float *dlogits, const float *logits,
                const int32_t *labels, uint32_t n, uint32_t k, const float *grad_scale,
                float norm) {
  if (k == 0)
    return n ? -EINVAL : 0;
  for (uint32_t i = 0; i < n; i++) /* all checked before anything is written */
    if (labels[i] < 0 || (uint32_t)labels[i] >= k)
      return -EINVAL;
  struct xent_job j = {.loss = loss, .dlogits = dlogits, .pred = pred, .logits = logits,
                       .labels = labels, .k = k,
                       .g = dlogits ? (grad_scale ? *grad_scale : 1.0f) / norm : 0.0f};
  gs_cpu_parallel(ex, n, k >= GS_CPU_XENT_GRAIN ? 1 : GS_CPU_XENT_GRAIN / k, xent_part, &j);
  return 0;
}

/* ---- casts ---- */

struct cast_job {
  gs_dtype dst_dt, src_dt;
  void *dst;
  const void *src;
};

static void cast_part(void *ctx, size_t lo, size_t hi) {
  const struct cast_job *j = ctx;
  const void *src = gs_cpu_at(j->src_dt, j->src, lo);
  void *dst = gs_cpu_at_mut(j->dst_dt, j->dst, lo);
  size_t count = hi - lo;
  if (j->src_dt == GS_F32) {
    gs_cpu_store_f32(j->dst_dt, dst, src, count);
  } else if (j->dst_dt == GS_F32) {
    gs_cpu_load_f32(j->src_dt, src, dst, count);
  } else { /* fp16 <-> bf16 through fp32, a stack block at a time */
    float tmp[1024];
    for (size_t i = 0; i < count; i += 1024) {
      size_t m = count - i < 1024 ? count - i : 1024;
      gs_cpu_load_f32(j->src_dt, gs_cpu_at(j->src_dt, src, i), tmp, m);
      gs_cpu_store_f32(j->dst_dt, gs_cpu_at_mut(j->dst_dt, dst, i), tmp, m);
    }
  }
}

int gs_cpu_cast(gs_exec *ex, void *dst, gs_dtype dst_dt, const void *src, gs_dtype src_dt,
                size_t count) {
  if (count == 0)
    return 0;
  if (dst_dt == src_dt) {
    memmove(dst, src, count * gs_dtype_size(src_dt));
    return 0;
  }
  struct cast_job j = {.dst_dt = dst_dt, .src_dt = src_dt, .dst = dst, .src = src};
  gs_cpu_parallel(ex, count, GS_CPU_ELEM_GRAIN, cast_part, &j);
  return 0;
}

/* ---- mixed precision bookkeeping ---- */

struct unscale_job {
  float *g;
  float inv;
  int32_t *found_inf;
};

GS_CPU_RANGE(unscale_part, ctx, lo, hi, isa) {
  const struct unscale_job *j = ctx;
  uint32_t bad = 0;
  for (size_t i = lo; i < hi; i++) {
    float v = j->g[i] * j->inv;
    j->g[i] = v;
    uint32_t x;
    memcpy(&x, &v, 4);
    bad |= (x & 0x7f800000u) == 0x7f800000u; /* inf or NaN */
  }
  if (bad)
    __atomic_store_n(j->found_inf, 1, __ATOMIC_RELAXED);
}

/* g (count) *= 1 / *scale; *found_inf = 1 when an element is inf or NaN. */
int gs_cpu_unscale_check(gs_exec *ex, float *g, size_t count, const float *scale,
                         int32_t *found_inf) {
  struct unscale_job j = {.g = g, .inv = 1.0f / *scale, .found_inf = found_inf};
  gs_cpu_parallel(ex, count, GS_CPU_ELEM_GRAIN, GS_CPU_PICK(unscale_part), &j);
  return 0;
}

int gs_cpu_loss_scale_update(gs_exec *ex, float *scale, int32_t *good, int32_t *found_inf,
                             int64_t *skipped, uint32_t growth_interval) {
  (void)ex;
  if (*found_inf) {
    float s = *scale * 0.5f;
    *scale = s < 1.0f ? 1.0f : s;
    *good = 0;
    (*skipped)++;
  } else {
    (*good)++;
    if ((uint32_t)*good >= growth_interval) {
      float s = *scale * 2.0f;
      *scale = s > GS_LOSS_SCALE_MAX ? GS_LOSS_SCALE_MAX : s;
      *good = 0;
    }
  }
  *found_inf = 0;
  return 0;
}

/* ---- optimizers ---- */

/* Both optimizers consume g: each element is cleared right after it is
 * read, in the same pass (backend.h), and a skipped step clears it too. */

struct sgd_job {
  float *w, *m, *g;
  float lr, momentum, wd;
  bool nesterov;
};

GS_CPU_RANGE(sgd_part, ctx, lo, hi, isa) {
  const struct sgd_job *j = ctx;
  float *restrict w = j->w, *restrict m = j->m; /* as adam_part: vectorisable */
  float *restrict g = j->g;
  const float lr = j->lr, mu = j->momentum, wd = j->wd;
  const bool nesterov = j->nesterov;
  if (mu > 0.0f) {
    for (size_t i = lo; i < hi; i++) {
      float gi = g[i] + wd * w[i];
      g[i] = 0.0f;
      float mi = mu * m[i] + gi;
      m[i] = mi;
      w[i] -= lr * (nesterov ? gi + mu * mi : mi);
    }
  } else {
    for (size_t i = lo; i < hi; i++) {
      w[i] -= lr * (g[i] + wd * w[i]);
      g[i] = 0.0f;
    }
  }
}

/* w, g, m (count) f32; m may be NULL when momentum == 0. */
int gs_cpu_sgd_step(gs_exec *ex, float *w, float *g, float *m, size_t count, float lr,
                    float momentum, bool nesterov, float weight_decay, const int32_t *skip) {
  if (momentum > 0.0f && !m)
    return -EINVAL;
  if (skip && *skip) {
    if (count)
      memset(g, 0, count * sizeof *g);
    return 0;
  }
  struct sgd_job j = {.w = w, .m = m, .g = g, .lr = lr, .momentum = momentum,
                      .wd = weight_decay, .nesterov = nesterov};
  gs_cpu_parallel(ex, count, GS_CPU_ELEM_GRAIN / 4, GS_CPU_PICK(sgd_part), &j);
  return 0;
}

struct adam_job {
  float *w, *m, *v, *g;
  float lr, b1, b2, eps, wd, bc1, bc2;
  bool decoupled;
};

GS_CPU_RANGE(adam_part, ctx, lo, hi, isa) {
  const struct adam_job *j = ctx;
  /* restrict and local scalars: the stores to w, m and v may not alias the
   * job's fields, so the loop vectorises (sqrtf inlines with -fno-math-errno,
   * kernels/CMakeLists.txt); scalar, it would be a large part of an MLP
   * step. */
  float *restrict w = j->w, *restrict m = j->m, *restrict v = j->v, *restrict g = j->g;
  const float lr = j->lr, b1 = j->b1, b2 = j->b2, eps = j->eps, wd = j->wd;
  const float cwd = j->decoupled ? 0.0f : wd, dwd = j->decoupled ? lr * wd : 0.0f;
  /* lr * (m / bc1) / (sqrt(v / bc2) + eps), arranged as PyTorch's Adam does
   * but with one division where it has two: the bias corrections are
   * per-step constants, and the divider is what bounds this loop. The same
   * value up to rounding. */
  const float step = lr / j->bc1, inv_sqrt_bc2 = 1.0f / sqrtf(j->bc2);
  for (size_t i = lo; i < hi; i++) {
    float wi = w[i];
    float gi = g[i] + cwd * wi;
    g[i] = 0.0f;
    float mi = b1 * m[i] + (1.0f - b1) * gi;
    float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    wi -= dwd * wi;
    w[i] = wi - step * mi / (sqrtf(vi) * inv_sqrt_bc2 + eps);
  }
}

/* w, g, m, v (count) f32; t is the 1-based step after this update. */
int gs_cpu_adam_step(gs_exec *ex, float *w, float *g, float *m, float *v, size_t count,
                     float lr, float beta1, float beta2, float eps, float weight_decay,
                     bool decoupled, uint64_t t, const int32_t *skip) {
  if (t == 0)
    return -EINVAL; /* bias correction would divide by zero */
  if (skip && *skip) {
    if (count)
      memset(g, 0, count * sizeof *g);
    return 0;
  }
  struct adam_job j = {.w = w, .m = m, .v = v, .g = g, .lr = lr, .b1 = beta1, .b2 = beta2,
                       .eps = eps, .wd = weight_decay, .decoupled = decoupled,
                       .bc1 = (float)(1.0 - pow((double)beta1, (double)t)),
                       .bc2 = (float)(1.0 - pow((double)beta2, (double)t))};
  gs_cpu_parallel(ex, count, GS_CPU_ELEM_GRAIN / 4, GS_CPU_PICK(adam_part), &j);
  return 0;
}
