/*
 * cpu_norm.c: the ops that residual networks and transformers add to the
 * layer kinds of cpu_conv.c and cpu_dense.c: the residual sums (add,
 * accumulate), batch and layer normalisation, GELU, dropout and average
 * pooling, exactly as backend.h writes their formulas.
 *
 * Storage. 16-bit tensors are converted to fp32 a stack block at a time
 * (GS_NORM_BLK floats), computed in fp32 and rounded once on store, so an
 * element's result does not depend on where a part of the range begins:
 * the element-wise ops give the same bits for any thread count.
 *
 * Reductions over rows (batchnorm's statistics and both norms' gamma/beta
 * gradients) cut the M rows into norm_chunks(M) chunks, a number fixed by
 * M alone; each chunk sums its rows in order into double partials in the
 * workspace (the chunks are the items that the exec's threads share out),
 * and the caller adds the chunks' partials in chunk order. So the sums have the same bits for
 * any thread count, and stay accurate over a 100,000-row batch (128 images
 * of 28x28). The statistics take two passes, the mean first, then the
 * squares of x - mean, rather than sum(x^2) - mean^2, which cancels.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cpu/cpu_internal.h"

/* Elements below which an element-wise op stays on the job's thread (as
 * cpu_elem.c's grain: a handed-off range costs a few microseconds). */
#define GS_NORM_GRAIN ((size_t)1 << 13)
/* Floats of one stack block of converted 16-bit values. */
#define GS_NORM_BLK 512

/* ---- residual sums ---- */

struct add_job {
  gs_dtype dt;
  void *dst;
  const void *a, *b; /* add: dst = a + b; accumulate: a = dst, b = src */
};

GS_CPU_RANGE(add_part, ctx, lo, hi, isa) {
  const struct add_job *j = ctx;
  if (j->dt == GS_F32) {
    /* no restrict: out may be a or b, and each element reads its own only */
    const float *a = j->a, *b = j->b;
    float *y = j->dst;
    for (size_t i = lo; i < hi; i++)
      y[i] = a[i] + b[i];
    return;
  }
  float x[GS_NORM_BLK], z[GS_NORM_BLK];
  for (size_t i = lo; i < hi; i += GS_NORM_BLK) {
    size_t n = hi - i < GS_NORM_BLK ? hi - i : GS_NORM_BLK;
    gs_cpu_load_f32(j->dt, gs_cpu_at(j->dt, j->a, i), x, n);
    gs_cpu_load_f32(j->dt, gs_cpu_at(j->dt, j->b, i), z, n);
    for (size_t k = 0; k < n; k++)
      x[k] += z[k];
    gs_cpu_store_f32(j->dt, gs_cpu_at_mut(j->dt, j->dst, i), x, n);
  }
}

int gs_cpu_add_forward(gs_exec *ex, gs_dtype dt, void *out, const void *a, const void *b,
                       size_t count) {
  struct add_job j = {.dt = dt, .dst = out, .a = a, .b = b};
  gs_cpu_parallel(ex, count, GS_NORM_GRAIN, GS_CPU_PICK(add_part), &j);
  return 0;
}

int gs_cpu_accumulate(gs_exec *ex, gs_dtype dt, void *dst, const void *src, size_t count) {
  struct add_job j = {.dt = dt, .dst = dst, .a = dst, .b = src};
  gs_cpu_parallel(ex, count, GS_NORM_GRAIN, GS_CPU_PICK(add_part), &j);
  return 0;
}

/* ---- shared helpers ---- */

/* n values of dt from element i of p, as fp32: p itself when dt is fp32,
 * else converted into tmp */
static inline const float *ld(gs_dtype dt, const void *p, size_t i, float *tmp, size_t n) {
  if (dt == GS_F32)
    return (const float *)p + i;
  gs_cpu_load_f32(dt, gs_cpu_at(dt, p, i), tmp, n);
  return tmp;
}

/* Chunks of a row reduction: at least GS_NORM_CHUNK_ROWS rows each, at
 * most GS_NORM_CHUNKS of them (more threads than that leave some idle). */
#define GS_NORM_CHUNKS 64
#define GS_NORM_CHUNK_ROWS 32

static size_t norm_chunks(size_t m) {
  size_t k = (m + GS_NORM_CHUNK_ROWS - 1) / GS_NORM_CHUNK_ROWS;
  return k < 1 ? 1 : k > GS_NORM_CHUNKS ? GS_NORM_CHUNKS : k;
}

/* rows [*r0, *r1) of chunk k of nk over m rows */
static inline void chunk_rows(size_t m, size_t k, size_t nk, size_t *r0, size_t *r1) {
  *r0 = m * k / nk;
  *r1 = m * (k + 1) / nk;
}

/* ---- batch normalisation ---- */

/* Workspace: double partials, two per chunk and channel (the forward's
 * sums, the backward's two sums), then four fp32 arrays of C (the
 * per-channel coefficients of the element pass). */
size_t gs_cpu_batchnorm_workspace(gs_dtype dt, uint32_t m, uint32_t c) {
  (void)dt;
  return norm_chunks(m) * 2 * (size_t)c * sizeof(double) + 4 * (size_t)c * sizeof(float);
}

struct bn_job {
  gs_dtype dt;
  size_t m, c, nk;
  const void *in, *dout;
  void *out;               /* forward: out; backward: din */
  double *part;            /* (2 nk, C) partial sums */
  const double *dmean;     /* (C) the mean of the first pass, double */
  const float *mean, *rstd;/* (C) the fp32 statistics the element pass uses */
  const float *f0, *f1, *f2; /* (C) element pass: gamma, beta (forward);
                              gamma * rstd, sum(dout) / M, sum(dout xhat) / M */
};

/* chunk k: part[k][c] = sum of x over its rows */
GS_CPU_RANGE(bn_sum_part, ctx, lo, hi, isa) {
  const struct bn_job *j = ctx;
  float tmp[GS_NORM_BLK];
  for (size_t k = lo; k < hi; k++) {
    size_t r0, r1;
    chunk_rows(j->m, k, j->nk, &r0, &r1);
    double *acc = j->part + k * j->c;
    memset(acc, 0, j->c * sizeof *acc);
    for (size_t r = r0; r < r1; r++)
      for (size_t c0 = 0; c0 < j->c; c0 += GS_NORM_BLK) {
        size_t cb = j->c - c0 < GS_NORM_BLK ? j->c - c0 : GS_NORM_BLK;
        const float *x = ld(j->dt, j->in, r * j->c + c0, tmp, cb);
        for (size_t q = 0; q < cb; q++)
          acc[c0 + q] += x[q];
      }
  }
}

/* chunk k: part[k][c] = sum of (x - mean)^2 over its rows */
GS_CPU_RANGE(bn_sq_part, ctx, lo, hi, isa) {
  const struct bn_job *j = ctx;
  float tmp[GS_NORM_BLK];
  for (size_t k = lo; k < hi; k++) {
    size_t r0, r1;
    chunk_rows(j->m, k, j->nk, &r0, &r1);
    double *acc = j->part + k * j->c;
    memset(acc, 0, j->c * sizeof *acc);
    for (size_t r = r0; r < r1; r++)
      for (size_t c0 = 0; c0 < j->c; c0 += GS_NORM_BLK) {
        size_t cb = j->c - c0 < GS_NORM_BLK ? j->c - c0 : GS_NORM_BLK;
        const float *x = ld(j->dt, j->in, r * j->c + c0, tmp, cb);
        const double *mu = j->dmean + c0;
        for (size_t q = 0; q < cb; q++) {
          double d = (double)x[q] - mu[q];
          acc[c0 + q] += d * d;
        }
      }
  }
}

/* rows [lo, hi): out = (x - mean) * rstd * gamma + beta */
GS_CPU_RANGE(bn_norm_part, ctx, lo, hi, isa) {
  const struct bn_job *j = ctx;
  float tmp[GS_NORM_BLK], y[GS_NORM_BLK];
  for (size_t r = lo; r < hi; r++)
    for (size_t c0 = 0; c0 < j->c; c0 += GS_NORM_BLK) {
      size_t cb = j->c - c0 < GS_NORM_BLK ? j->c - c0 : GS_NORM_BLK;
      const float *x = ld(j->dt, j->in, r * j->c + c0, tmp, cb);
      const float *mu = j->mean + c0, *rs = j->rstd + c0, *g = j->f0 + c0, *b = j->f1 + c0;
      for (size_t q = 0; q < cb; q++)
        y[q] = (x[q] - mu[q]) * rs[q] * g[q] + b[q];
      gs_cpu_store_f32(j->dt, gs_cpu_at_mut(j->dt, j->out, r * j->c + c0), y, cb);
    }
}

/* Rows an element pass over C channels takes at least per part. */
static size_t rows_grain(size_t c) {
  size_t g = GS_NORM_GRAIN / (c ? c : 1);
  return g ? g : 1;
}

int gs_cpu_batchnorm_forward(gs_exec *ex, gs_dtype dt, void *out, float *mean, float *rstd,
                             float *running_mean, float *running_var, const void *in,
                             const void *gamma, const void *beta, uint32_t m, uint32_t c,
                             float eps, float momentum, bool training, void *ws) {
  if (m == 0 || c == 0)
    return 0;
  size_t nk = norm_chunks(m);
  double *part = ws, *dmean = part + nk * c;
  float *mu = (float *)(part + 2 * nk * c), *rs = mu + c, *g = rs + c, *b = g + c;
  gs_cpu_load_f32(dt, gamma, g, c);
  gs_cpu_load_f32(dt, beta, b, c);
  struct bn_job j = {.dt = dt, .m = m, .c = c, .nk = nk, .in = in, .out = out, .part = part,
                     .dmean = dmean, .mean = mu, .rstd = rs, .f0 = g, .f1 = b};
  if (training) {
    /* the chunks' sums in the first half of part, the mean in the second */
    gs_cpu_parallel(ex, nk, 1, GS_CPU_PICK(bn_sum_part), &j);
    for (size_t q = 0; q < c; q++) {
      double s = 0.0;
      for (size_t k = 0; k < nk; k++)
        s += part[k * c + q];
      dmean[q] = s / (double)m;
    }
    gs_cpu_parallel(ex, nk, 1, GS_CPU_PICK(bn_sq_part), &j);
    for (size_t q = 0; q < c; q++) {
      double s = 0.0;
      for (size_t k = 0; k < nk; k++)
        s += part[k * c + q];
      double var = s / (double)m, unbiased = m > 1 ? s / (double)(m - 1) : var;
      mu[q] = (float)dmean[q];
      rs[q] = (float)(1.0 / sqrt(var + (double)eps));
      mean[q] = mu[q];
      rstd[q] = rs[q];
      running_mean[q] = (1.0f - momentum) * running_mean[q] + momentum * mu[q];
      running_var[q] = (1.0f - momentum) * running_var[q] + momentum * (float)unbiased;
    }
  } else {
    for (size_t q = 0; q < c; q++) {
      mu[q] = running_mean[q];
      rs[q] = (float)(1.0 / sqrt((double)running_var[q] + (double)eps));
    }
  }
  gs_cpu_parallel(ex, m, rows_grain(c), GS_CPU_PICK(bn_norm_part), &j);
  return 0;
}

/* chunk k: part[k][c] = sum of dout, part[nk + k][c] = sum of dout * xhat */
GS_CPU_RANGE(bn_bwd_sum_part, ctx, lo, hi, isa) {
  const struct bn_job *j = ctx;
  float tx[GS_NORM_BLK], td[GS_NORM_BLK];
  for (size_t k = lo; k < hi; k++) {
    size_t r0, r1;
    chunk_rows(j->m, k, j->nk, &r0, &r1);
    double *s1 = j->part + k * j->c, *s2 = j->part + (j->nk + k) * j->c;
    memset(s1, 0, j->c * sizeof *s1);
    memset(s2, 0, j->c * sizeof *s2);
    for (size_t r = r0; r < r1; r++)
      for (size_t c0 = 0; c0 < j->c; c0 += GS_NORM_BLK) {
        size_t cb = j->c - c0 < GS_NORM_BLK ? j->c - c0 : GS_NORM_BLK;
        const float *x = ld(j->dt, j->in, r * j->c + c0, tx, cb);
        const float *d = ld(j->dt, j->dout, r * j->c + c0, td, cb);
        const float *mu = j->mean + c0, *rs = j->rstd + c0;
        for (size_t q = 0; q < cb; q++) {
          float xh = (x[q] - mu[q]) * rs[q];
          s1[c0 + q] += d[q];
          s2[c0 + q] += (double)d[q] * xh;
        }
      }
  }
}

/* rows [lo, hi): din = gamma rstd (dout - sum(dout)/M - xhat sum(dout xhat)/M) */
GS_CPU_RANGE(bn_bwd_din_part, ctx, lo, hi, isa) {
  const struct bn_job *j = ctx;
  float tx[GS_NORM_BLK], td[GS_NORM_BLK], y[GS_NORM_BLK];
  for (size_t r = lo; r < hi; r++)
    for (size_t c0 = 0; c0 < j->c; c0 += GS_NORM_BLK) {
      size_t cb = j->c - c0 < GS_NORM_BLK ? j->c - c0 : GS_NORM_BLK;
      const float *x = ld(j->dt, j->in, r * j->c + c0, tx, cb);
      const float *d = ld(j->dt, j->dout, r * j->c + c0, td, cb);
      const float *mu = j->mean + c0, *rs = j->rstd + c0;
      const float *a = j->f0 + c0, *m1 = j->f1 + c0, *m2 = j->f2 + c0;
      for (size_t q = 0; q < cb; q++) {
        float xh = (x[q] - mu[q]) * rs[q];
        y[q] = a[q] * (d[q] - m1[q] - xh * m2[q]);
      }
      gs_cpu_store_f32(j->dt, gs_cpu_at_mut(j->dt, j->out, r * j->c + c0), y, cb);
    }
}

int gs_cpu_batchnorm_backward(gs_exec *ex, gs_dtype dt, void *din, float *dgamma, float *dbeta,
                              const void *dout, const void *in, const void *gamma,
                              const float *mean, const float *rstd, uint32_t m, uint32_t c,
                              void *ws) {
  if (m == 0 || c == 0)
    return 0;
  size_t nk = norm_chunks(m);
  double *part = ws;
  float *a = (float *)(part + 2 * nk * c), *m1 = a + c, *m2 = m1 + c;
  struct bn_job j = {.dt = dt, .m = m, .c = c, .nk = nk, .in = in, .dout = dout, .out = din,
                     .part = part, .mean = mean, .rstd = rstd, .f0 = a, .f1 = m1, .f2 = m2};
  gs_cpu_parallel(ex, nk, 1, GS_CPU_PICK(bn_bwd_sum_part), &j);
  gs_cpu_load_f32(dt, gamma, a, c);
  for (size_t q = 0; q < c; q++) {
    double s1 = 0.0, s2 = 0.0;
    for (size_t k = 0; k < nk; k++) {
      s1 += part[k * c + q];
      s2 += part[(nk + k) * c + q];
    }
    dbeta[q] += (float)s1;
    dgamma[q] += (float)s2;
    a[q] *= rstd[q];
    m1[q] = (float)(s1 / (double)m);
    m2[q] = (float)(s2 / (double)m);
  }
  if (din)
    gs_cpu_parallel(ex, m, rows_grain(c), GS_CPU_PICK(bn_bwd_din_part), &j);
  return 0;
}

/* ---- layer normalisation ---- */

struct ln_job {
  gs_dtype dt;
  size_t m, c, nk;
  const void *in, *dout, *gamma, *beta;
  void *out;               /* forward: out; backward: din (or NULL) */
  float *mean, *rstd;      /* (M) saved statistics; the forward's may be NULL */
  const float *cmean, *crstd;
  double *part;            /* backward: (2 nk, C) partial sums */
  float eps;
};

/* rows [lo, hi): statistics in double, then out = (x - mean) * rstd * gamma + beta */
GS_CPU_RANGE(ln_fwd_part, ctx, lo, hi, isa) {
  const struct ln_job *j = ctx;
  float tx[GS_NORM_BLK], tg[GS_NORM_BLK], tb[GS_NORM_BLK], y[GS_NORM_BLK];
  const size_t c = j->c;
  for (size_t r = lo; r < hi; r++) {
    double s = 0.0, s2 = 0.0;
    for (size_t c0 = 0; c0 < c; c0 += GS_NORM_BLK) {
      size_t cb = c - c0 < GS_NORM_BLK ? c - c0 : GS_NORM_BLK;
      const float *x = ld(j->dt, j->in, r * c + c0, tx, cb);
      for (size_t q = 0; q < cb; q++)
        s += x[q];
    }
    double dmu = s / (double)c;
    for (size_t c0 = 0; c0 < c; c0 += GS_NORM_BLK) {
      size_t cb = c - c0 < GS_NORM_BLK ? c - c0 : GS_NORM_BLK;
      const float *x = ld(j->dt, j->in, r * c + c0, tx, cb);
      for (size_t q = 0; q < cb; q++) {
        double d = (double)x[q] - dmu;
        s2 += d * d;
      }
    }
    float mu = (float)dmu, rs = (float)(1.0 / sqrt(s2 / (double)c + (double)j->eps));
    if (j->mean)
      j->mean[r] = mu;
    if (j->rstd)
      j->rstd[r] = rs;
    for (size_t c0 = 0; c0 < c; c0 += GS_NORM_BLK) {
      size_t cb = c - c0 < GS_NORM_BLK ? c - c0 : GS_NORM_BLK;
      const float *x = ld(j->dt, j->in, r * c + c0, tx, cb);
      const float *g = ld(j->dt, j->gamma, c0, tg, cb), *b = ld(j->dt, j->beta, c0, tb, cb);
      for (size_t q = 0; q < cb; q++)
        y[q] = (x[q] - mu) * rs * g[q] + b[q];
      gs_cpu_store_f32(j->dt, gs_cpu_at_mut(j->dt, j->out, r * c + c0), y, cb);
    }
  }
}

int gs_cpu_layernorm_forward(gs_exec *ex, gs_dtype dt, void *out, float *mean, float *rstd,
                             const void *in, const void *gamma, const void *beta, uint32_t m,
                             uint32_t c, float eps) {
  if (m == 0 || c == 0)
    return 0;
  struct ln_job j = {.dt = dt, .m = m, .c = c, .in = in, .gamma = gamma, .beta = beta,
                     .out = out, .mean = mean, .rstd = rstd, .eps = eps};
  gs_cpu_parallel(ex, m, rows_grain(c), GS_CPU_PICK(ln_fwd_part), &j);
  return 0;
}

/* Workspace: double partials of the two gradient sums, per chunk. */
size_t gs_cpu_layernorm_workspace(gs_dtype dt, uint32_t m, uint32_t c) {
  (void)dt;
  return norm_chunks(m) * 2 * (size_t)c * sizeof(double);
}

/* chunk k: its rows' din, and part[k][c] = sum of dout, part[nk + k][c] =
 * sum of dout * xhat over them */
GS_CPU_RANGE(ln_bwd_part, ctx, lo, hi, isa) {
  const struct ln_job *j = ctx;
  float tx[GS_NORM_BLK], td[GS_NORM_BLK], tg[GS_NORM_BLK], y[GS_NORM_BLK];
  const size_t c = j->c;
  for (size_t k = lo; k < hi; k++) {
    size_t r0, r1;
    chunk_rows(j->m, k, j->nk, &r0, &r1);
    double *p1 = j->part + k * c, *p2 = j->part + (j->nk + k) * c;
    memset(p1, 0, c * sizeof *p1);
    memset(p2, 0, c * sizeof *p2);
    for (size_t r = r0; r < r1; r++) {
      const float mu = j->cmean[r], rs = j->crstd[r];
      double sg = 0.0, sgx = 0.0; /* sums of g and g * xhat over the row */
      for (size_t c0 = 0; c0 < c; c0 += GS_NORM_BLK) {
        size_t cb = c - c0 < GS_NORM_BLK ? c - c0 : GS_NORM_BLK;
        const float *x = ld(j->dt, j->in, r * c + c0, tx, cb);
        const float *d = ld(j->dt, j->dout, r * c + c0, td, cb);
        const float *g = ld(j->dt, j->gamma, c0, tg, cb);
        for (size_t q = 0; q < cb; q++) {
          float xh = (x[q] - mu) * rs, gq = d[q] * g[q];
          p1[c0 + q] += d[q];
          p2[c0 + q] += (double)d[q] * xh;
          sg += gq;
          sgx += (double)gq * xh;
        }
      }
      if (!j->out)
        continue;
      const float m1 = (float)(sg / (double)c), m2 = (float)(sgx / (double)c);
      for (size_t c0 = 0; c0 < c; c0 += GS_NORM_BLK) {
        size_t cb = c - c0 < GS_NORM_BLK ? c - c0 : GS_NORM_BLK;
        const float *x = ld(j->dt, j->in, r * c + c0, tx, cb);
        const float *d = ld(j->dt, j->dout, r * c + c0, td, cb);
        const float *g = ld(j->dt, j->gamma, c0, tg, cb);
        for (size_t q = 0; q < cb; q++) {
          float xh = (x[q] - mu) * rs;
          y[q] = rs * (d[q] * g[q] - m1 - xh * m2);
        }
        gs_cpu_store_f32(j->dt, gs_cpu_at_mut(j->dt, j->out, r * c + c0), y, cb);
      }
    }
  }
}

int gs_cpu_layernorm_backward(gs_exec *ex, gs_dtype dt, void *din, float *dgamma, float *dbeta,
                              const void *dout, const void *in, const void *gamma,
                              const float *mean, const float *rstd, uint32_t m, uint32_t c,
                              void *ws) {
  if (m == 0 || c == 0)
    return 0;
  size_t nk = norm_chunks(m);
  struct ln_job j = {.dt = dt, .m = m, .c = c, .nk = nk, .in = in, .dout = dout,
                     .gamma = gamma, .out = din, .cmean = mean, .crstd = rstd, .part = ws};
  gs_cpu_parallel(ex, nk, 1, GS_CPU_PICK(ln_bwd_part), &j);
  const double *part = ws;
  for (size_t q = 0; q < c; q++) {
    double s1 = 0.0, s2 = 0.0;
    for (size_t k = 0; k < nk; k++) {
      s1 += part[k * c + q];
      s2 += part[(nk + k) * c + q];
    }
    dbeta[q] += (float)s1;
    dgamma[q] += (float)s2;
  }
  return 0;
}

/* ---- GELU (tanh approximation) ---- */

#define GS_GELU_K 0.7978845608028654f /* sqrt(2 / pi) */
#define GS_GELU_A 0.044715f

struct gelu_job {
  gs_dtype dt;
  void *dst;
  const void *a, *b; /* forward: a = in; backward: a = dout, b = in */
};

/* e^v for v in [-18, 87], as the GELU loops need it: v = n ln2 + r with
 * |r| <= ln2 / 2, e^r by its Taylor polynomial to degree 7 (within 6e-9
 * of it there), 2^n put into the exponent bits. Plain float arithmetic
 * and bit moves, so every clone vectorizes it and all give the same bits
 * (libm's expf or tanhf, a call an element, was most of a GPT's step).
 * NaN stays NaN. */
static inline float gelu_exp(float v) {
  float k = v * 1.44269504088896341f + 12582912.0f; /* 1.5 * 2^23 + n: n in the low bits */
  float n = k - 12582912.0f;
  float r = v - n * 0.693145751953125f; /* ln 2 in two parts: this one exact times n */
  r = r - n * 1.42860682030941723e-6f;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  uint32_t kb, sb;
  memcpy(&kb, &k, sizeof kb);
  sb = (kb - 0x4B400000u + 127u) << 23; /* 0x4B400000: 1.5 * 2^23's bits */
  float scale;
  memcpy(&scale, &sb, sizeof scale);
  return p * scale;
}

/* GELU through the logistic function: 0.5 (1 + tanh(u)) = s = 1 / (1 +
 * e^-2u) and 0.5 (1 - tanh(u)^2) = 2 s (1 - s), 1 - s = s e^-2u, each
 * to a few ulps even where tanh(u) is near -1 and 1 + tanh(u) would lose
 * its digits. u is clamped to [-43, 9]: past 9, s is 1 in float; below
 * -43, s is under 2^-124 and the output under the rounding of x's. */
static inline void gelu_s(float x, float *s, float *sc) {
  float u = GS_GELU_K * (x + GS_GELU_A * x * x * x);
  u = u > 9.0f ? 9.0f : u;
  u = u < -43.0f ? -43.0f : u;
  float w = gelu_exp(-2.0f * u);
  *s = 1.0f / (1.0f + w);
  *sc = *s * w;
}

static inline float gelu1(float x) {
  float s, sc;
  gelu_s(x, &s, &sc);
  return x * s;
}

static inline float gelu_grad1(float x) {
  float s, sc;
  gelu_s(x, &s, &sc);
  return s + 2.0f * x * s * sc * GS_GELU_K * (1.0f + 3.0f * GS_GELU_A * x * x);
}

GS_CPU_RANGE(gelu_fwd_part, ctx, lo, hi, isa) {
  const struct gelu_job *j = ctx;
  float tx[GS_NORM_BLK], y[GS_NORM_BLK];
  for (size_t i = lo; i < hi; i += GS_NORM_BLK) {
    size_t n = hi - i < GS_NORM_BLK ? hi - i : GS_NORM_BLK;
    const float *x = ld(j->dt, j->a, i, tx, n);
    for (size_t q = 0; q < n; q++)
      y[q] = gelu1(x[q]);
    gs_cpu_store_f32(j->dt, gs_cpu_at_mut(j->dt, j->dst, i), y, n);
  }
}

GS_CPU_RANGE(gelu_bwd_part, ctx, lo, hi, isa) {
  const struct gelu_job *j = ctx;
  float tx[GS_NORM_BLK], td[GS_NORM_BLK], y[GS_NORM_BLK];
  for (size_t i = lo; i < hi; i += GS_NORM_BLK) {
    size_t n = hi - i < GS_NORM_BLK ? hi - i : GS_NORM_BLK;
    const float *d = ld(j->dt, j->a, i, td, n), *x = ld(j->dt, j->b, i, tx, n);
    for (size_t q = 0; q < n; q++)
      y[q] = d[q] * gelu_grad1(x[q]);
    gs_cpu_store_f32(j->dt, gs_cpu_at_mut(j->dt, j->dst, i), y, n);
  }
}

int gs_cpu_gelu_forward(gs_exec *ex, gs_dtype dt, void *out, const void *in, size_t count) {
  struct gelu_job j = {.dt = dt, .dst = out, .a = in};
  gs_cpu_parallel(ex, count, GS_NORM_GRAIN / 4, GS_CPU_PICK(gelu_fwd_part), &j);
  return 0;
}

int gs_cpu_gelu_backward(gs_exec *ex, gs_dtype dt, void *din, const void *dout, const void *in,
                         size_t count) {
  struct gelu_job j = {.dt = dt, .dst = din, .a = dout, .b = in};
  gs_cpu_parallel(ex, count, GS_NORM_GRAIN / 4, GS_CPU_PICK(gelu_bwd_part), &j);
  return 0;
}

/* ---- dropout ---- */

/* output i of splitmix64 seeded with seed (backend.h) */
static inline uint64_t dropout_hash(uint64_t seed, uint64_t i) {
  uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* ceil(rate * 2^24): element i is kept iff (h(i) >> 40) >= this */
static uint32_t dropout_threshold(float rate) {
  return (uint32_t)ceil((double)rate * 16777216.0);
}

struct dropout_job {
  gs_dtype dt;
  void *dst;
  const void *src;
  uint64_t seed;
  uint32_t thr;
  float scale;
};

GS_CPU_RANGE(dropout_part, ctx, lo, hi, isa) {
  const struct dropout_job *j = ctx;
  float tx[GS_NORM_BLK], y[GS_NORM_BLK];
  for (size_t i = lo; i < hi; i += GS_NORM_BLK) {
    size_t n = hi - i < GS_NORM_BLK ? hi - i : GS_NORM_BLK;
    const float *x = ld(j->dt, j->src, i, tx, n);
    for (size_t q = 0; q < n; q++) {
      bool keep = (uint32_t)(dropout_hash(j->seed, i + q) >> 40) >= j->thr;
      y[q] = keep ? x[q] * j->scale : 0.0f;
    }
    gs_cpu_store_f32(j->dt, gs_cpu_at_mut(j->dt, j->dst, i), y, n);
  }
}

static void dropout_run(gs_exec *ex, gs_dtype dt, void *dst, const void *src, size_t count,
                        float rate, uint64_t seed) {
  struct dropout_job j = {.dt = dt, .dst = dst, .src = src, .seed = seed,
                          .thr = dropout_threshold(rate), .scale = 1.0f / (1.0f - rate)};
  gs_cpu_parallel(ex, count, GS_NORM_GRAIN, GS_CPU_PICK(dropout_part), &j);
}

int gs_cpu_dropout_forward(gs_exec *ex, gs_dtype dt, void *out, const void *in, size_t count,
                           float rate, uint64_t seed) {
  dropout_run(ex, dt, out, in, count, rate, seed);
  return 0;
}

int gs_cpu_dropout_backward(gs_exec *ex, gs_dtype dt, void *din, const void *dout,
                            size_t count, float rate, uint64_t seed) {
  dropout_run(ex, dt, din, dout, count, rate, seed);
  return 0;
}

/* ---- average pool (VALID) ---- */

struct avgpool_job {
  gs_dtype dt;
  void *dst;
  const void *src;
  gs_conv_shape s; /* oh, ow: VALID */
};

/* output rows (img, oy) [lo, hi) */
GS_CPU_RANGE(avgpool_fwd_part, ctx, lo, hi, isa) {
  const struct avgpool_job *j = ctx;
  const gs_conv_shape *s = &j->s;
  const size_t c = s->c, taps = (size_t)s->kh * s->kw;
  float tx[GS_NORM_BLK], acc[GS_NORM_BLK];
  for (size_t row = lo; row < hi; row++) {
    size_t img = row / s->oh, oy = row % s->oh;
    for (size_t ox = 0; ox < s->ow; ox++)
      for (size_t c0 = 0; c0 < c; c0 += GS_NORM_BLK) {
        size_t cb = c - c0 < GS_NORM_BLK ? c - c0 : GS_NORM_BLK;
        memset(acc, 0, cb * sizeof *acc);
        for (size_t ky = 0; ky < s->kh; ky++)
          for (size_t kx = 0; kx < s->kw; kx++) {
            size_t iy = oy * s->stride + ky, ix = ox * s->stride + kx;
            const float *x = ld(j->dt, j->src, ((img * s->h + iy) * s->w + ix) * c + c0, tx, cb);
            for (size_t q = 0; q < cb; q++)
              acc[q] += x[q];
          }
        for (size_t q = 0; q < cb; q++)
          acc[q] /= (float)taps;
        gs_cpu_store_f32(j->dt, gs_cpu_at_mut(j->dt, j->dst, ((img * s->oh + oy) * s->ow + ox) * c + c0),
                         acc, cb);
      }
  }
}

/* input rows (img, iy) [lo, hi): each element gathers dout over the windows
 * that contain it */
GS_CPU_RANGE(avgpool_bwd_part, ctx, lo, hi, isa) {
  const struct avgpool_job *j = ctx;
  const gs_conv_shape *s = &j->s;
  const size_t c = s->c, taps = (size_t)s->kh * s->kw, st = s->stride;
  float td[GS_NORM_BLK], acc[GS_NORM_BLK];
  for (size_t row = lo; row < hi; row++) {
    size_t img = row / s->h, iy = row % s->h;
    /* windows oy with oy * st <= iy <= oy * st + kh - 1, likewise ox */
    size_t oy0 = iy + 1 <= s->kh ? 0 : (iy - s->kh + st) / st;
    size_t oy1 = iy / st < s->oh ? iy / st : s->oh - 1;
    for (size_t ix = 0; ix < s->w; ix++) {
      size_t ox0 = ix + 1 <= s->kw ? 0 : (ix - s->kw + st) / st;
      size_t ox1 = ix / st < s->ow ? ix / st : s->ow - 1;
      for (size_t c0 = 0; c0 < c; c0 += GS_NORM_BLK) {
        size_t cb = c - c0 < GS_NORM_BLK ? c - c0 : GS_NORM_BLK;
        memset(acc, 0, cb * sizeof *acc);
        for (size_t oy = oy0; oy <= oy1; oy++)
          for (size_t ox = ox0; ox <= ox1; ox++) {
            const float *d =
                ld(j->dt, j->src, ((img * s->oh + oy) * s->ow + ox) * c + c0, td, cb);
            for (size_t q = 0; q < cb; q++)
              acc[q] += d[q];
          }
        for (size_t q = 0; q < cb; q++)
          acc[q] /= (float)taps;
        gs_cpu_store_f32(j->dt, gs_cpu_at_mut(j->dt, j->dst, ((img * s->h + iy) * s->w + ix) * c + c0),
                         acc, cb);
      }
    }
  }
}

static gs_conv_shape valid_shape(const gs_conv_shape *s) {
  gs_conv_shape v = *s;
  v.same = false;
  v.oh = gs_window_out(s->h, s->kh, s->stride, false);
  v.ow = gs_window_out(s->w, s->kw, s->stride, false);
  return v;
}

int gs_cpu_avgpool_forward(gs_exec *ex, gs_dtype dt, void *out, const void *in,
                           const gs_conv_shape *s) {
  struct avgpool_job j = {.dt = dt, .dst = out, .src = in, .s = valid_shape(s)};
  size_t rows = (size_t)j.s.n * j.s.oh;
  if (rows == 0 || j.s.ow == 0 || j.s.c == 0)
    return 0;
  gs_cpu_parallel(ex, rows, 1, GS_CPU_PICK(avgpool_fwd_part), &j);
  return 0;
}

int gs_cpu_avgpool_backward(gs_exec *ex, gs_dtype dt, void *din, const void *dout,
                            const gs_conv_shape *s) {
  struct avgpool_job j = {.dt = dt, .dst = din, .src = dout, .s = valid_shape(s)};
  size_t rows = (size_t)j.s.n * j.s.h;
  if (rows == 0 || j.s.w == 0 || j.s.c == 0)
    return 0;
  if (j.s.oh == 0 || j.s.ow == 0) { /* no window: no gradient */
    memset(din, 0, rows * j.s.w * j.s.c * gs_dtype_size(dt));
    return 0;
  }
  gs_cpu_parallel(ex, rows, 1, GS_CPU_PICK(avgpool_bwd_part), &j);
  return 0;
}
