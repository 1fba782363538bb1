/*
 * cpu_attn.c: the transformer ops of the cpu backend: token and learned
 * position embeddings, and the core of causal multi-head self-attention.
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
 *
 * Attention runs each (n, h) pair on one thread, pairs spread over the
 * job's threads, in blocks of GS_CPU_ATTN_RB query rows: the scores of a
 * block against the keys it may see (rows t0..t1-1 x columns 0..t1-1, so
 * the GEMMs skip most of the masked upper triangle) are one cblas_sgemm
 * straight into probs, the masked softmax rewrites them in place, and
 * out = probs . v is a second. The backward walks the same blocks: dP =
 * dout . v^T into a block of scratch, turned into dS in place, then dv +=
 * probs^T . dout, dq = dS . k / sqrt(D) and dk += dS^T . q / sqrt(D). fp32
 * storage reads q, k, v and dout and writes out and dqkv where they are
 * (the GEMMs take the row stride 3*H*D); 16-bit storage stages the pair's
 * q, k, v (and dout, and the gradients) as fp32 in scratch and rounds once
 * on store. Every pair is computed the same way whichever thread takes
 * it, so the bits do not depend on the thread count.
 *
 * Scratch: at most GS_CPU_ATTN_SLOTS pairs run at once, each with a slot of
 * the workspace (a part of the split takes the slot of its first index):
 * RB x T floats for dP, plus 7 x T x D for the 16-bit staging. The
 * workspace is a function of the shape alone, as the planner needs, and a
 * small one: probs, which the runtime keeps, is the tensor that grows with
 * T^2. One pair uses one thread: a job with fewer pairs than threads (one
 * sample of one head) leaves threads idle here.
 */
#include <errno.h>
#include <math.h>
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
GS_CPU_RANGE(emb_bwd_part, ctx, lo, hi, isa) {
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
  gs_cpu_parallel(ex, blocks, emb_grain(blocks, (size_t)rows * c), GS_CPU_PICK(emb_bwd_part), &j);
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
GS_CPU_RANGE(pos_fwd_part, ctx, lo, hi, isa) {
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
  gs_cpu_parallel(ex, rows, (GS_CPU_EMB_GRAIN + c - 1) / c, GS_CPU_PICK(pos_fwd_part), &j);
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
GS_CPU_RANGE(pos_bwd_part, ctx, lo, hi, isa) {
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
  gs_cpu_parallel(ex, blocks, emb_grain(blocks, tc * n), GS_CPU_PICK(pos_bwd_part), &j);
  if (din && din != dout)
    memmove(din, dout, tc * n * gs_dtype_size(dt));
  return 0;
}

/* ---- causal multi-head self-attention ---- */

/* Query rows per block of the GEMMs, and (n, h) pairs in flight at most,
 * one workspace slot each. */
#define GS_CPU_ATTN_RB 64
#define GS_CPU_ATTN_SLOTS 32

static size_t attn_slots(uint32_t n, uint32_t heads) {
  size_t pairs = (size_t)n * heads;
  return pairs < GS_CPU_ATTN_SLOTS ? pairs : GS_CPU_ATTN_SLOTS;
}

/* floats of one slot, rounded to 64 bytes */
static size_t attn_slot_floats(gs_dtype dt, uint32_t t, uint32_t d) {
  size_t rb = t < GS_CPU_ATTN_RB ? t : GS_CPU_ATTN_RB;
  size_t f = rb * t + (dt == GS_F32 ? 0 : (size_t)7 * t * d);
  return (f + 15) / 16 * 16;
}

size_t gs_cpu_attention_workspace(gs_dtype dt, uint32_t n, uint32_t t, uint32_t heads,
                                  uint32_t head_size) {
  if ((size_t)n * t * heads * head_size == 0)
    return 0;
  return sizeof(float) * attn_slots(n, heads) * attn_slot_floats(dt, t, head_size);
}

struct attn_job {
  gs_dtype dt;
  void *out;           /* forward: (N, T, HD) */
  float *probs_out;    /* forward: written */
  const float *probs;  /* backward: read */
  const void *qkv;     /* (N, T, 3HD) */
  void *dqkv;          /* backward: (N, T, 3HD) */
  const void *dout;    /* backward: (N, T, HD) */
  uint32_t n, t, h, d;
  size_t slots, slot_floats;
  float *ws;
};

/* One pair's operands as fp32 matrices with a row stride: where they are
 * (fp32) or staged in the slot (16-bit). */
struct attn_pair {
  const float *q, *k, *v; /* (T, D) each, row stride ld */
  const float *dout;      /* (T, D), row stride ldo */
  float *o;               /* forward: (T, D), row stride ldo */
  float *dq, *dk, *dv;    /* backward: (T, D), row stride ld */
  size_t ld, ldo;
  float *w;               /* RB x T scratch, row stride T */
};

/* rows 0..t-1 of the (T, D) block at column `col` of a (rows, width) dt
 * matrix of sample bn, as fp32 (T, D) at dst */
static void attn_stage_in(const struct attn_job *j, const void *src, size_t width, size_t col,
                          uint32_t bn, float *dst) {
  for (size_t s = 0; s < j->t; s++)
    gs_cpu_load_f32(j->dt, gs_cpu_at(j->dt, src, ((size_t)bn * j->t + s) * width + col),
                    dst + s * j->d, j->d);
}

static void attn_stage_out(const struct attn_job *j, void *dst, size_t width, size_t col,
                           uint32_t bn, const float *src) {
  for (size_t s = 0; s < j->t; s++)
    gs_cpu_store_f32(j->dt, gs_cpu_at_mut(j->dt, dst, ((size_t)bn * j->t + s) * width + col),
                     src + s * j->d, j->d);
}

/* Pair (bn, bh)'s operands. Slot layout (16-bit): w (RB x T), then q, k, v,
 * dout, dq, dk, dv (T x D each); the forward's out takes dout's place. */
static struct attn_pair attn_pair_of(const struct attn_job *j, uint32_t bn, uint32_t bh,
                                     float *slot, bool backward) {
  size_t hd = (size_t)j->h * j->d, ld3 = 3 * hd, col = (size_t)bh * j->d;
  size_t td = (size_t)j->t * j->d;
  struct attn_pair a = {.w = slot};
  if (j->dt == GS_F32) {
    const float *base = (const float *)j->qkv + (size_t)bn * j->t * ld3 + col;
    a.q = base, a.k = base + hd, a.v = base + 2 * hd, a.ld = ld3, a.ldo = hd;
    if (backward) {
      a.dout = (const float *)j->dout + (size_t)bn * j->t * hd + col;
      a.dq = (float *)j->dqkv + (size_t)bn * j->t * ld3 + col;
      a.dk = a.dq + hd, a.dv = a.dq + 2 * hd;
    } else {
      a.o = (float *)j->out + (size_t)bn * j->t * hd + col;
    }
    return a;
  }
  size_t rb = j->t < GS_CPU_ATTN_RB ? j->t : GS_CPU_ATTN_RB;
  float *p = slot + rb * j->t;
  float *q = p, *k = p + td, *v = p + 2 * td, *o = p + 3 * td;
  attn_stage_in(j, j->qkv, ld3, col, bn, q);
  attn_stage_in(j, j->qkv, ld3, hd + col, bn, k);
  attn_stage_in(j, j->qkv, ld3, 2 * hd + col, bn, v);
  a.q = q, a.k = k, a.v = v, a.ld = j->d, a.ldo = j->d;
  if (backward) {
    attn_stage_in(j, j->dout, hd, col, bn, o);
    a.dout = o;
    a.dq = p + 4 * td, a.dk = p + 5 * td, a.dv = p + 6 * td;
  } else {
    a.o = o;
  }
  return a;
}

/* row[0..n) = softmax(row[0..n)), max subtracted; row[n..len) = 0 */
static void attn_softmax_row(float *row, size_t n, size_t len) {
  float mx = row[0];
  for (size_t i = 1; i < n; i++)
    if (row[i] > mx)
      mx = row[i];
  float sum = 0.0f;
  for (size_t i = 0; i < n; i++) {
    float e = expf(row[i] - mx);
    row[i] = e;
    sum += e;
  }
  float inv = 1.0f / sum;
  for (size_t i = 0; i < n; i++)
    row[i] *= inv;
  memset(row + n, 0, (len - n) * sizeof(float));
}

static void attn_fwd_pair(const struct attn_job *j, size_t pair, float *slot) {
  uint32_t bn = (uint32_t)(pair / j->h), bh = (uint32_t)(pair % j->h);
  struct attn_pair a = attn_pair_of(j, bn, bh, slot, false);
  size_t T = j->t, D = j->d;
  float *P = j->probs_out + pair * T * T;
  float scale = 1.0f / sqrtf((float)D);
  for (size_t t0 = 0; t0 < T; t0 += GS_CPU_ATTN_RB) {
    size_t t1 = t0 + GS_CPU_ATTN_RB < T ? t0 + GS_CPU_ATTN_RB : T, m = t1 - t0;
    /* scores of rows t0..t1-1 against keys 0..t1-1 */
    gs_cpu_sgemm_here(false, true, m, t1, D, scale, a.q + t0 * a.ld, a.ld, a.k, a.ld, 0.0f,
                      P + t0 * T, T);
    for (size_t r = t0; r < t1; r++)
      attn_softmax_row(P + r * T, r + 1, T);
    gs_cpu_sgemm_here(false, false, m, D, t1, 1.0f, P + t0 * T, T, a.v, a.ld, 0.0f,
                      a.o + t0 * a.ldo, a.ldo);
  }
  if (j->dt != GS_F32)
    attn_stage_out(j, j->out, (size_t)j->h * D, (size_t)bh * D, bn, a.o);
}

static void attn_bwd_pair(const struct attn_job *j, size_t pair, float *slot) {
  uint32_t bn = (uint32_t)(pair / j->h), bh = (uint32_t)(pair % j->h);
  struct attn_pair a = attn_pair_of(j, bn, bh, slot, true);
  size_t T = j->t, D = j->d;
  const float *P = j->probs + pair * T * T;
  float scale = 1.0f / sqrtf((float)D);
  for (size_t s = 0; s < T; s++) { /* dk, dv accumulate over the blocks */
    memset(a.dk + s * a.ld, 0, D * sizeof(float));
    memset(a.dv + s * a.ld, 0, D * sizeof(float));
  }
  for (size_t t0 = 0; t0 < T; t0 += GS_CPU_ATTN_RB) {
    size_t t1 = t0 + GS_CPU_ATTN_RB < T ? t0 + GS_CPU_ATTN_RB : T, m = t1 - t0;
    /* dP = dout . v^T, then dS = P * (dP - sum P dP) in place, 0 where masked */
    gs_cpu_sgemm_here(false, true, m, t1, D, 1.0f, a.dout + t0 * a.ldo, a.ldo, a.v, a.ld, 0.0f,
                      a.w, T);
    for (size_t r = t0; r < t1; r++) {
      float *ds = a.w + (r - t0) * T;
      const float *p = P + r * T;
      float dot = 0.0f;
      for (size_t i = 0; i <= r; i++)
        dot += p[i] * ds[i];
      for (size_t i = 0; i <= r; i++)
        ds[i] = p[i] * (ds[i] - dot);
      for (size_t i = r + 1; i < t1; i++)
        ds[i] = 0.0f;
    }
    gs_cpu_sgemm_here(true, false, t1, D, m, 1.0f, P + t0 * T, T, a.dout + t0 * a.ldo, a.ldo,
                      1.0f, a.dv, a.ld);
    gs_cpu_sgemm_here(false, false, m, D, t1, scale, a.w, T, a.k, a.ld, 0.0f, a.dq + t0 * a.ld,
                      a.ld);
    gs_cpu_sgemm_here(true, false, t1, D, m, scale, a.w, T, a.q + t0 * a.ld, a.ld, 1.0f, a.dk,
                      a.ld);
  }
  if (j->dt != GS_F32) {
    size_t hd = (size_t)j->h * D, col = (size_t)bh * D;
    attn_stage_out(j, j->dqkv, 3 * hd, col, bn, a.dq);
    attn_stage_out(j, j->dqkv, 3 * hd, hd + col, bn, a.dk);
    attn_stage_out(j, j->dqkv, 3 * hd, 2 * hd + col, bn, a.dv);
  }
}

/* slots [lo, hi): the pairs from lo's share to hi's, on lo's scratch */
static void attn_part(const struct attn_job *j, size_t lo, size_t hi, bool backward) {
  size_t pairs = (size_t)j->n * j->h;
  float *slot = j->ws + lo * j->slot_floats;
  for (size_t p = pairs * lo / j->slots; p < pairs * hi / j->slots; p++) {
    if (backward)
      attn_bwd_pair(j, p, slot);
    else
      attn_fwd_pair(j, p, slot);
  }
}

static void attn_fwd_part(void *ctx, size_t lo, size_t hi) { attn_part(ctx, lo, hi, false); }
static void attn_bwd_part(void *ctx, size_t lo, size_t hi) { attn_part(ctx, lo, hi, true); }

/* qkv (N, T, 3HD) dt, probs (N, H, T, T) f32 written, out (N, T, HD) dt */
int gs_cpu_attention_forward(gs_exec *ex, gs_dtype dt, void *out, float *probs,
                             const void *qkv, uint32_t n, uint32_t t, uint32_t heads,
                             uint32_t head_size, void *ws) {
  if ((size_t)n * t * heads * head_size == 0)
    return 0;
  struct attn_job j = {.dt = dt, .out = out, .probs_out = probs, .qkv = qkv, .n = n, .t = t,
                       .h = heads, .d = head_size, .slots = attn_slots(n, heads),
                       .slot_floats = attn_slot_floats(dt, t, head_size), .ws = ws};
  gs_cpu_parallel(ex, j.slots, 1, attn_fwd_part, &j);
  return 0;
}

/* dqkv (N, T, 3HD) dt overwritten from dout (N, T, HD) dt, qkv and probs */
int gs_cpu_attention_backward(gs_exec *ex, gs_dtype dt, void *dqkv, const void *dout,
                              const void *qkv, const float *probs, uint32_t n, uint32_t t,
                              uint32_t heads, uint32_t head_size, void *ws) {
  if ((size_t)n * t * heads * head_size == 0)
    return 0;
  struct attn_job j = {.dt = dt, .probs = probs, .qkv = qkv, .dqkv = dqkv,
                       .dout = dout, .n = n, .t = t, .h = heads, .d = head_size,
                       .slots = attn_slots(n, heads),
                       .slot_floats = attn_slot_floats(dt, t, head_size), .ws = ws};
  gs_cpu_parallel(ex, j.slots, 1, attn_bwd_part, &j);
  return 0;
}
