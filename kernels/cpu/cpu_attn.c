/*
 * cpu_attn.c: the transformer ops of the cpu backend: token and learned
 * position embeddings.
 *
 * Embeddings move rows: the forward copies table rows (token) or adds a
 * position row (position), split over rows across the job's threads. Their
 * weight gradients are sums over tokens, and a split over tokens would
 * race (two tokens of one id) or, summed per part, change the bits with
 * the thread count. So the backwards split over channels instead: each
 * part owns a slice of every gradient row and adds the tokens' slices in
 * token order (position: in n order), the order one thread would take and
 * the CUDA kernels take too, so the bits depend neither on the threads nor
 * on the device.
 */
#include <errno.h>
#include <string.h>

#include "kernels/cpu/cpu_internal.h"

/* Channels one part of a gradient owns, at the least: a few cache lines of
 * every gradient row it walks. */
#define GS_CPU_EMB_CB 16

/* Elements (rows x channels) under which an embedding op stays on the
 * calling thread: handing a range to a worker costs about as much. */
#define GS_CPU_EMB_GRAIN ((size_t)1 << 14)

/* Parts of [0, blocks) for work of `elems` elements: one when small. */
static size_t emb_grain(size_t blocks, size_t elems) {
  return elems < GS_CPU_EMB_GRAIN ? blocks : 1;
}

/* ---- token embedding ---- */

static bool ids_valid(const int32_t *ids, uint32_t rows, uint32_t v) {
  for (uint32_t i = 0; i < rows; i++)
    if (ids[i] < 0 || (uint32_t)ids[i] >= v)
      return false;
  return true;
}

struct emb_fwd {
  void *out;
  const int32_t *ids;
  const void *table;
  size_t row_bytes;
};

static void emb_fwd_part(void *ctx, size_t lo, size_t hi) {
  const struct emb_fwd *j = ctx;
  for (size_t i = lo; i < hi; i++)
    memcpy((char *)j->out + i * j->row_bytes,
           (const char *)j->table + (size_t)j->ids[i] * j->row_bytes, j->row_bytes);
}

/* ids (ROWS) int32, table (V, C) dt, out (ROWS, C) dt = table[ids] */
int gs_cpu_embedding_forward(gs_exec *ex, gs_dtype dt, void *out, const int32_t *ids,
                             const void *table, uint32_t rows, uint32_t v, uint32_t c) {
  if (!ids_valid(ids, rows, v))
    return -EINVAL;
  if (rows == 0 || c == 0)
    return 0;
  struct emb_fwd j = {.out = out, .ids = ids, .table = table,
                      .row_bytes = (size_t)c * gs_dtype_size(dt)};
  size_t grain = (GS_CPU_EMB_GRAIN + c - 1) / c;
  gs_cpu_parallel(ex, rows, grain, emb_fwd_part, &j);
  return 0;
}

struct emb_bwd {
  gs_dtype dt;
  float *dtable;
  const void *dout;
  const int32_t *ids;
  uint32_t rows, c;
};

/* channel blocks [lo, hi) of every dtable row, tokens in order */
GS_CPU_HOT static void emb_bwd_part(void *ctx, size_t lo, size_t hi) {
  const struct emb_bwd *j = ctx;
  size_t c0 = lo * GS_CPU_EMB_CB, c1 = hi * GS_CPU_EMB_CB;
  if (c1 > j->c)
    c1 = j->c;
  float buf[GS_CPU_CB];
  for (size_t b0 = c0; b0 < c1; b0 += GS_CPU_CB) {
    size_t nb = c1 - b0 < GS_CPU_CB ? c1 - b0 : GS_CPU_CB;
    for (uint32_t i = 0; i < j->rows; i++) {
      float *restrict dst = j->dtable + (size_t)j->ids[i] * j->c + b0;
      const float *src;
      if (j->dt == GS_F32) {
        src = (const float *)j->dout + (size_t)i * j->c + b0;
      } else {
        gs_cpu_load_f32(j->dt, gs_cpu_at(j->dt, j->dout, (size_t)i * j->c + b0), buf, nb);
        src = buf;
      }
      for (size_t q = 0; q < nb; q++)
        dst[q] += src[q];
    }
  }
}

/* dtable (V, C) f32 += the dout (ROWS, C) rows of each id, in token order */
int gs_cpu_embedding_backward(gs_exec *ex, gs_dtype dt, float *dtable, const void *dout,
                              const int32_t *ids, uint32_t rows, uint32_t v, uint32_t c) {
  if (!ids_valid(ids, rows, v))
    return -EINVAL;
  if (rows == 0 || c == 0)
    return 0;
  struct emb_bwd j = {.dt = dt, .dtable = dtable, .dout = dout, .ids = ids, .rows = rows,
                      .c = c};
  size_t blocks = (c + GS_CPU_EMB_CB - 1) / GS_CPU_EMB_CB;
  gs_cpu_parallel(ex, blocks, emb_grain(blocks, (size_t)rows * c), emb_bwd_part, &j);
  return 0;
}

/* ---- learned position embedding ---- */

struct pos_fwd {
  gs_dtype dt;
  void *out;
  const void *in, *pos;
  uint32_t t, c;
};

/* rows [lo, hi) of (N*T, C): out = in + pos[row % T] */
GS_CPU_HOT static void pos_fwd_part(void *ctx, size_t lo, size_t hi) {
  const struct pos_fwd *j = ctx;
  float a[GS_CPU_CB], p[GS_CPU_CB];
  for (size_t r = lo; r < hi; r++) {
    size_t row = r * j->c, prow = (r % j->t) * j->c;
    for (size_t b0 = 0; b0 < j->c; b0 += GS_CPU_CB) {
      size_t nb = j->c - b0 < GS_CPU_CB ? j->c - b0 : GS_CPU_CB;
      if (j->dt == GS_F32) {
        const float *x = (const float *)j->in + row + b0;
        const float *restrict y = (const float *)j->pos + prow + b0;
        float *o = (float *)j->out + row + b0; /* may be x: element by element */
        for (size_t q = 0; q < nb; q++)
          o[q] = x[q] + y[q];
      } else {
        gs_cpu_load_f32(j->dt, gs_cpu_at(j->dt, j->in, row + b0), a, nb);
        gs_cpu_load_f32(j->dt, gs_cpu_at(j->dt, j->pos, prow + b0), p, nb);
        for (size_t q = 0; q < nb; q++)
          a[q] += p[q];
        gs_cpu_store_f32(j->dt, gs_cpu_at_mut(j->dt, j->out, row + b0), a, nb);
      }
    }
  }
}

/* in (N, T, C) dt, pos (T, C) dt, out (N, T, C) dt = in + pos[t]; out may
 * be in */
int gs_cpu_posembed_forward(gs_exec *ex, gs_dtype dt, void *out, const void *in,
                            const void *pos, uint32_t n, uint32_t t, uint32_t c) {
  size_t rows = (size_t)n * t;
  if (rows == 0 || c == 0)
    return 0;
  struct pos_fwd j = {.dt = dt, .out = out, .in = in, .pos = pos, .t = t, .c = c};
  gs_cpu_parallel(ex, rows, (GS_CPU_EMB_GRAIN + c - 1) / c, pos_fwd_part, &j);
  return 0;
}

struct pos_bwd {
  gs_dtype dt;
  float *dpos;
  const void *dout;
  size_t tc; /* T * C: one sample of dout */
  uint32_t n;
};

/* elements [lo, hi) * GS_CPU_EMB_CB of dpos (T*C) += dout over n, in order */
GS_CPU_HOT static void pos_bwd_part(void *ctx, size_t lo, size_t hi) {
  const struct pos_bwd *j = ctx;
  size_t e0 = lo * GS_CPU_EMB_CB, e1 = hi * GS_CPU_EMB_CB;
  if (e1 > j->tc)
    e1 = j->tc;
  float buf[GS_CPU_CB];
  for (size_t b0 = e0; b0 < e1; b0 += GS_CPU_CB) {
    size_t nb = e1 - b0 < GS_CPU_CB ? e1 - b0 : GS_CPU_CB;
    float *restrict dst = j->dpos + b0;
    for (uint32_t s = 0; s < j->n; s++) {
      const float *src;
      if (j->dt == GS_F32) {
        src = (const float *)j->dout + s * j->tc + b0;
      } else {
        gs_cpu_load_f32(j->dt, gs_cpu_at(j->dt, j->dout, s * j->tc + b0), buf, nb);
        src = buf;
      }
      for (size_t q = 0; q < nb; q++)
        dst[q] += src[q];
    }
  }
}

/* dpos (T, C) f32 += sum over n of dout (N, T, C); din = dout (may be dout
 * itself, or NULL) */
int gs_cpu_posembed_backward(gs_exec *ex, gs_dtype dt, void *din, float *dpos,
                             const void *dout, uint32_t n, uint32_t t, uint32_t c) {
  size_t tc = (size_t)t * c;
  if (tc == 0 || n == 0)
    return 0;
  struct pos_bwd j = {.dt = dt, .dpos = dpos, .dout = dout, .tc = tc, .n = n};
  size_t blocks = (tc + GS_CPU_EMB_CB - 1) / GS_CPU_EMB_CB;
  gs_cpu_parallel(ex, blocks, emb_grain(blocks, tc * n), pos_bwd_part, &j);
  if (din && din != dout)
    memmove(din, dout, tc * n * gs_dtype_size(dt));
  return 0;
}
