/*
 * test_attn_ops.c: the cpu backend's transformer ops (cpu_attn.c) against
 * plain definitions.
 *
 * As test_kernels does for the layers: each forward against a double
 * precision reference written from the definition; each gradient against
 * central finite differences of that reference on the scalar loss
 * sum(out * R), R fixed and random, with weight gradients starting from a
 * non-zero value so that accumulation (+=) is checked; fp16 and bf16
 * storage against fp32 on the same rounded inputs; and the bits of a
 * multi-thread run equal to those of one thread. Shapes are odd (C = 7,
 * V = 13, H = 3 heads of D = 5). Workspaces get exactly the queried bytes,
 * so an op that needs more shows up under ASan.
 *
 * Attention is checked at T = 1, 7, 64 and 100 (one block of query rows,
 * a full one, and a second, partial one): probs and out against the
 * definition, dqkv against finite differences, the masked probabilities
 * exactly 0, and causality bit for bit: a later position's k and v change
 * nothing before it, and a dout that is zero from some row on leaves
 * exactly zero dq from that row and dk, dv from that position.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "test_ops_util.h"

/* ---- helpers ---- */

/* x (n) random in [-scale, scale), exactly representable in dt */
static double *rand_dt(gs_dtype dt, size_t n, double scale) {
  double *x = calloc(n + 1, sizeof *x);
  for (size_t i = 0; i < n; i++)
    x[i] = round_dt(dt, urand() * scale);
  return x;
}

static float *f32_filled(size_t n, float v) {
  float *p = malloc((n + 1) * sizeof *p);
  for (size_t i = 0; i < n; i++)
    p[i] = v;
  return p;
}

static gs_backend *B;
static gs_exec *EX;  /* 2 threads: the ops split */
static gs_exec *EX1; /* 1 thread: the reference bits */

static void setup_ex(void) {
  B = gs_backend_cpu();
  gs_exec_config cfg = {.threads = 2, .device_index = 0};
  cr_assert_eq(B->exec_create(B, &cfg, &EX), 0);
  gs_exec_config one = {.threads = 1, .device_index = 0};
  cr_assert_eq(B->exec_create(B, &one, &EX1), 0);
  ops_seed();
}

static void teardown_ex(void) {
  B->exec_destroy(EX);
  B->exec_destroy(EX1);
}

/* central differences' step for the attention ops' references */
static const double FD_H = 1e-4;

static const gs_dtype ALL_DT[3] = {GS_F32, GS_F16, GS_BF16};

TestSuite(attn_ops, .init = setup_ex, .fini = teardown_ex);

/* ---- token embedding ---- */

typedef struct emb_case {
  uint32_t rows, v, c;
  int32_t *ids;
  double *table, *r; /* (V, C), loss weights (ROWS, C) */
} emb_case;

/* ids cover [0, V-1) with repeats; id V-1 is never used */
static void emb_init(emb_case *e, gs_dtype dt, uint32_t rows, uint32_t v, uint32_t c) {
  e->rows = rows, e->v = v, e->c = c;
  e->ids = malloc((rows + 1) * sizeof *e->ids);
  for (uint32_t i = 0; i < rows; i++)
    e->ids[i] = (int32_t)((i * 5u + 3u + (i / 7u) * (i % 3u)) % (v - 1));
  e->table = rand_dt(dt, (size_t)v * c, 1.0);
  e->r = rand_dt(dt, (size_t)rows * c, 1.0);
}

static void emb_free(emb_case *e) {
  free(e->ids), free(e->table), free(e->r);
}

static double emb_ref_loss(void *ctx) {
  const emb_case *e = ctx;
  double l = 0;
  for (uint32_t i = 0; i < e->rows; i++)
    for (uint32_t q = 0; q < e->c; q++)
      l += e->table[(size_t)e->ids[i] * e->c + q] * e->r[(size_t)i * e->c + q];
  return l;
}

/* forward and backward on ex in dt: out (ROWS, C) dt, dtable (V, C) f32
 * from 0.25 */
static void emb_run(gs_exec *ex, const emb_case *e, gs_dtype dt, void **out, float **dtable) {
  void *tab = to_dt(dt, e->table, (size_t)e->v * e->c);
  void *dout = to_dt(dt, e->r, (size_t)e->rows * e->c);
  *out = calloc((size_t)e->rows * e->c + 1, gs_dtype_size(dt));
  *dtable = f32_filled((size_t)e->v * e->c, 0.25f);
  cr_assert_eq(B->embedding_forward(ex, dt, *out, e->ids, tab, e->rows, e->v, e->c), 0);
  cr_assert_eq(B->embedding_backward(ex, dt, *dtable, dout, e->ids, e->rows, e->v, e->c), 0);
  free(tab), free(dout);
}

Test(attn_ops, embedding_forward_copies_rows_and_gradient_is_fd) {
  for (int k = 0; k < 3; k++) {
    gs_dtype dt = ALL_DT[k];
    emb_case e;
    emb_init(&e, dt, 21, 13, 7);
    void *out;
    float *dtab;
    emb_run(EX, &e, dt, &out, &dtab);
    void *tab = to_dt(dt, e.table, (size_t)e.v * e.c);
    size_t rb = (size_t)e.c * gs_dtype_size(dt);
    for (uint32_t i = 0; i < e.rows; i++)
      cr_assert(memcmp((char *)out + i * rb, (char *)tab + (size_t)e.ids[i] * rb, rb) == 0,
                "%s embedding row %u is not table row %d", gs_dtype_name(dt), i, e.ids[i]);
    /* the gradient of sum(out * R) with respect to the table */
    size_t nt = (size_t)e.v * e.c;
    double *fd = calloc(nt + 1, sizeof *fd);
    fd_grad(emb_ref_loss, &e, e.table, nt, FD_H, fd);
    for (size_t i = 0; i < nt; i++)
      expect_close(gs_dtype_name(dt), "embedding dtable", i, (double)dtab[i] - 0.25, fd[i],
                   1e-5, 1e-5);
    /* the id never used: its row untouched, bit for bit */
    for (uint32_t q = 0; q < e.c; q++)
      cr_assert_eq(dtab[(size_t)(e.v - 1) * e.c + q], 0.25f);
    free(fd), free(tab), free(out), free(dtab);
    emb_free(&e);
  }
}

/* 16-bit dout holds the same numbers as the fp32 one (R is exact in dt):
 * the fp32 sums in token order are the same bits */
Test(attn_ops, embedding_16bit_gradient_equals_fp32) {
  emb_case e;
  emb_init(&e, GS_BF16, 21, 13, 7);
  for (size_t i = 0; i < (size_t)e.rows * e.c; i++) /* R exact in both 16-bit types */
    e.r[i] = round_dt(GS_F16, round_dt(GS_BF16, e.r[i]));
  void *o32, *o16;
  float *d32, *d16;
  emb_run(EX, &e, GS_F32, &o32, &d32);
  for (int k = 1; k < 3; k++) {
    emb_run(EX, &e, ALL_DT[k], &o16, &d16);
    cr_assert(memcmp(d16, d32, (size_t)e.v * e.c * sizeof(float)) == 0,
              "%s dtable differs from fp32's", gs_dtype_name(ALL_DT[k]));
    free(o16), free(d16);
  }
  free(o32), free(d32);
  emb_free(&e);
}

Test(attn_ops, embedding_threads_give_the_same_bits) {
  for (int k = 0; k < 3; k++) {
    gs_dtype dt = ALL_DT[k];
    emb_case e;
    emb_init(&e, dt, 301, 53, 71); /* large enough to split (rows * C >= 2^14) */
    void *o1, *o2;
    float *d1, *d2;
    emb_run(EX1, &e, dt, &o1, &d1);
    emb_run(EX, &e, dt, &o2, &d2);
    cr_assert(memcmp(o1, o2, (size_t)e.rows * e.c * gs_dtype_size(dt)) == 0, "%s out",
              gs_dtype_name(dt));
    cr_assert(memcmp(d1, d2, (size_t)e.v * e.c * sizeof(float)) == 0, "%s dtable",
              gs_dtype_name(dt));
    free(o1), free(o2), free(d1), free(d2);
    emb_free(&e);
  }
}

Test(attn_ops, embedding_id_out_of_range_is_refused_untouched) {
  emb_case e;
  emb_init(&e, GS_F32, 9, 13, 7);
  void *tab = to_dt(GS_F32, e.table, (size_t)e.v * e.c);
  float *out = f32_filled((size_t)e.rows * e.c, 7.0f), *dtab = f32_filled((size_t)e.v * e.c, 7.0f);
  const int32_t bad[2] = {13, -1};
  for (int k = 0; k < 2; k++) {
    e.ids[5] = bad[k];
    cr_assert_eq(B->embedding_forward(EX, GS_F32, out, e.ids, tab, e.rows, e.v, e.c), -EINVAL,
                 "id %d", bad[k]);
    cr_assert_eq(B->embedding_backward(EX, GS_F32, dtab, out, e.ids, e.rows, e.v, e.c), -EINVAL,
                 "id %d", bad[k]);
    for (size_t i = 0; i < (size_t)e.rows * e.c; i++)
      cr_assert_eq(out[i], 7.0f, "out written before the id was checked");
    for (size_t i = 0; i < (size_t)e.v * e.c; i++)
      cr_assert_eq(dtab[i], 7.0f, "dtable written before the id was checked");
  }
  free(tab), free(out), free(dtab);
  emb_free(&e);
}

/* ---- learned position embedding ---- */

typedef struct pos_case {
  uint32_t n, t, c;
  double *in, *pos, *r; /* (N, T, C), (T, C), (N, T, C) */
} pos_case;

static void pos_init(pos_case *p, gs_dtype dt, uint32_t n, uint32_t t, uint32_t c) {
  p->n = n, p->t = t, p->c = c;
  size_t all = (size_t)n * t * c;
  p->in = rand_dt(dt, all, 1.0);
  p->pos = rand_dt(dt, (size_t)t * c, 1.0);
  p->r = rand_dt(dt, all, 1.0);
  /* exact in both 16-bit types, so every dtype sums the same numbers */
  for (size_t i = 0; i < all; i++)
    p->r[i] = round_dt(GS_F16, round_dt(GS_BF16, p->r[i]));
}

static void pos_free(pos_case *p) { free(p->in), free(p->pos), free(p->r); }

static double pos_ref_loss(void *ctx) {
  const pos_case *p = ctx;
  double l = 0;
  size_t tc = (size_t)p->t * p->c;
  for (size_t i = 0; i < p->n * tc; i++)
    l += (p->in[i] + p->pos[i % tc]) * p->r[i];
  return l;
}

typedef struct pos_out {
  void *out, *din; /* (N, T, C) dt */
  float *dpos;     /* (T, C), from 0.25 */
} pos_out;

static void pos_run(gs_exec *ex, const pos_case *p, gs_dtype dt, pos_out *o) {
  size_t all = (size_t)p->n * p->t * p->c, tc = (size_t)p->t * p->c;
  void *in = to_dt(dt, p->in, all), *pos = to_dt(dt, p->pos, tc), *dout = to_dt(dt, p->r, all);
  o->out = calloc(all + 1, gs_dtype_size(dt));
  o->din = calloc(all + 1, gs_dtype_size(dt));
  memset(o->din, 0x55, all * gs_dtype_size(dt)); /* overwritten, every element */
  o->dpos = f32_filled(tc, 0.25f);
  cr_assert_eq(B->posembed_forward(ex, dt, o->out, in, pos, p->n, p->t, p->c), 0);
  cr_assert_eq(B->posembed_backward(ex, dt, o->din, o->dpos, dout, p->n, p->t, p->c), 0);
  cr_assert(memcmp(o->din, dout, all * gs_dtype_size(dt)) == 0, "%s din is not dout",
            gs_dtype_name(dt));
  free(in), free(pos), free(dout);
}

static void pos_out_free(pos_out *o) { free(o->out), free(o->din), free(o->dpos); }

Test(attn_ops, posembed_forward_and_gradients) {
  for (int k = 0; k < 3; k++) {
    gs_dtype dt = ALL_DT[k];
    pos_case p;
    pos_init(&p, dt, 3, 7, 13);
    pos_out o;
    pos_run(EX, &p, dt, &o);
    size_t tc = (size_t)p.t * p.c, all = p.n * tc;
    /* one fp32 add, then the store's rounding */
    for (size_t i = 0; i < all; i++)
      cr_assert_eq(get_dt(dt, o.out, i), round_dt(dt, (float)(p.in[i] + p.pos[i % tc])),
                   "%s out[%zu]", gs_dtype_name(dt), i);
    double *fd = calloc(all + 1, sizeof *fd);
    fd_grad(pos_ref_loss, &p, p.pos, tc, FD_H, fd);
    for (size_t i = 0; i < tc; i++)
      expect_close(gs_dtype_name(dt), "posembed dpos", i, (double)o.dpos[i] - 0.25, fd[i], 1e-5,
                   1e-5);
    fd_grad(pos_ref_loss, &p, p.in, all, FD_H, fd);
    for (size_t i = 0; i < all; i++)
      expect_close(gs_dtype_name(dt), "posembed din", i, get_dt(dt, o.din, i), fd[i], 1e-5, 1e-5);
    free(fd);
    pos_out_free(&o);
    pos_free(&p);
  }
}

Test(attn_ops, posembed_in_place_and_without_din) {
  for (int k = 0; k < 3; k++) {
    gs_dtype dt = ALL_DT[k];
    pos_case p;
    pos_init(&p, dt, 2, 5, 9);
    pos_out o;
    pos_run(EX, &p, dt, &o);
    size_t tc = (size_t)p.t * p.c, all = p.n * tc, es = gs_dtype_size(dt);
    /* out aliasing in: the same bits */
    void *x = to_dt(dt, p.in, all), *pos = to_dt(dt, p.pos, tc), *dout = to_dt(dt, p.r, all);
    cr_assert_eq(B->posembed_forward(EX, dt, x, x, pos, p.n, p.t, p.c), 0);
    cr_assert(memcmp(x, o.out, all * es) == 0, "%s in-place forward differs", gs_dtype_name(dt));
    /* din == dout: nothing moves; din NULL: dpos alone */
    float *dpos = f32_filled(tc, 0.25f);
    cr_assert_eq(B->posembed_backward(EX, dt, dout, dpos, dout, p.n, p.t, p.c), 0);
    void *want = to_dt(dt, p.r, all);
    cr_assert(memcmp(dout, want, all * es) == 0, "%s dout changed", gs_dtype_name(dt));
    cr_assert_eq(B->posembed_backward(EX, dt, NULL, dpos, dout, p.n, p.t, p.c), 0);
    for (size_t i = 0; i < tc; i++) /* twice the gradient, each pass from o's */
      expect_close(gs_dtype_name(dt), "posembed dpos (twice)", i, (double)dpos[i] - 0.25,
                   2 * ((double)o.dpos[i] - 0.25), 1e-6, 1e-6);
    free(x), free(pos), free(dout), free(want), free(dpos);
    pos_out_free(&o);
    pos_free(&p);
  }
}

Test(attn_ops, posembed_16bit_gradient_equals_fp32_and_threads_agree) {
  pos_case p;
  pos_init(&p, GS_BF16, 11, 37, 61); /* large enough to split */
  for (size_t i = 0; i < (size_t)p.n * p.t * p.c; i++)
    p.in[i] = round_dt(GS_F16, p.in[i]);
  for (size_t i = 0; i < (size_t)p.t * p.c; i++)
    p.pos[i] = round_dt(GS_F16, p.pos[i]);
  pos_out o32, o1, o2;
  pos_run(EX, &p, GS_F32, &o32);
  size_t tc = (size_t)p.t * p.c, all = p.n * tc;
  for (int k = 0; k < 3; k++) {
    gs_dtype dt = ALL_DT[k];
    pos_run(EX1, &p, dt, &o1);
    pos_run(EX, &p, dt, &o2);
    cr_assert(memcmp(o1.out, o2.out, all * gs_dtype_size(dt)) == 0, "%s out: threads differ",
              gs_dtype_name(dt));
    cr_assert(memcmp(o1.dpos, o2.dpos, tc * sizeof(float)) == 0, "%s dpos: threads differ",
              gs_dtype_name(dt));
    cr_assert(memcmp(o2.dpos, o32.dpos, tc * sizeof(float)) == 0, "%s dpos differs from fp32's",
              gs_dtype_name(dt));
    pos_out_free(&o1);
    pos_out_free(&o2);
  }
  pos_out_free(&o32);
  pos_free(&p);
}

/* ---- causal multi-head self-attention ---- */

typedef struct attn_case {
  uint32_t n, t, h, d;
  double *qkv, *r;     /* (N, T, 3HD), loss weights (N, T, HD) */
  double *out, *probs; /* the definition's: (N, T, HD), (N, H, T, T) */
} attn_case;

static size_t attn_nqkv(const attn_case *a) { return (size_t)a->n * a->t * 3 * a->h * a->d; }
static size_t attn_nout(const attn_case *a) { return (size_t)a->n * a->t * a->h * a->d; }
static size_t attn_nprobs(const attn_case *a) { return (size_t)a->n * a->h * a->t * a->t; }

static void attn_init(attn_case *a, gs_dtype dt, uint32_t n, uint32_t t, uint32_t h,
                      uint32_t d) {
  a->n = n, a->t = t, a->h = h, a->d = d;
  a->qkv = rand_dt(dt, attn_nqkv(a), 1.5);
  a->r = rand_dt(dt, attn_nout(a), 1.0);
  a->out = calloc(attn_nout(a) + 1, sizeof(double));
  a->probs = calloc(attn_nprobs(a) + 1, sizeof(double));
}

static void attn_free(attn_case *a) { free(a->qkv), free(a->r), free(a->out), free(a->probs); }

/* the definition, in double */
static void attn_ref(attn_case *a) {
  size_t T = a->t, H = a->h, D = a->d, HD = H * D;
  double *row = calloc(T + 1, sizeof *row);
  for (size_t n = 0; n < a->n; n++)
    for (size_t h = 0; h < H; h++)
      for (size_t t = 0; t < T; t++) {
        const double *q = a->qkv + (n * T + t) * 3 * HD + h * D;
        double mx = -INFINITY, sum = 0;
        for (size_t s = 0; s <= t; s++) {
          const double *k = a->qkv + (n * T + s) * 3 * HD + HD + h * D;
          double dot = 0;
          for (size_t i = 0; i < D; i++)
            dot += q[i] * k[i];
          row[s] = dot / sqrt((double)D);
          if (row[s] > mx)
            mx = row[s];
        }
        for (size_t s = 0; s <= t; s++)
          sum += exp(row[s] - mx);
        double *p = a->probs + ((n * H + h) * T + t) * T;
        double *o = a->out + (n * T + t) * HD + h * D;
        for (size_t i = 0; i < D; i++)
          o[i] = 0;
        for (size_t s = 0; s < T; s++) {
          p[s] = s <= t ? exp(row[s] - mx) / sum : 0.0;
          if (s > t)
            continue;
          const double *v = a->qkv + (n * T + s) * 3 * HD + 2 * HD + h * D;
          for (size_t i = 0; i < D; i++)
            o[i] += p[s] * v[i];
        }
      }
  free(row);
}

static double attn_ref_loss(void *ctx) {
  attn_case *a = ctx;
  attn_ref(a);
  double l = 0;
  for (size_t i = 0; i < attn_nout(a); i++)
    l += a->out[i] * a->r[i];
  return l;
}

typedef struct attn_res {
  void *out, *dqkv; /* dt */
  float *probs;
} attn_res;

static void attn_res_free(attn_res *o) { free(o->out), free(o->dqkv), free(o->probs); }

/* the backend's forward and backward in dt on ex; qkv and dout given in dt
 * (NULL: the case's qkv and R) */
static void attn_run(gs_exec *ex, const attn_case *a, gs_dtype dt, const void *qkv_dt,
                     const void *dout_dt, attn_res *o) {
  size_t es = gs_dtype_size(dt);
  void *qkv = to_dt(dt, a->qkv, attn_nqkv(a)), *dout = to_dt(dt, a->r, attn_nout(a));
  size_t wsb = B->attention_workspace(dt, a->n, a->t, a->h, a->d);
  cr_assert_eq(wsb, B->attention_workspace(dt, a->n, a->t, a->h, a->d), "not a pure query");
  void *ws = wsb ? malloc(wsb) : NULL; /* exactly the bytes asked for */
  o->out = malloc(attn_nout(a) * es + 1);
  o->dqkv = malloc(attn_nqkv(a) * es + 1);
  o->probs = malloc(attn_nprobs(a) * sizeof(float) + 1);
  memset(o->out, 0x55, attn_nout(a) * es); /* everything is written */
  memset(o->dqkv, 0x55, attn_nqkv(a) * es);
  memset(o->probs, 0x55, attn_nprobs(a) * sizeof(float));
  const void *x = qkv_dt ? qkv_dt : qkv, *g = dout_dt ? dout_dt : dout;
  cr_assert_eq(B->attention_forward(ex, dt, o->out, o->probs, x, a->n, a->t, a->h, a->d, ws), 0);
  cr_assert_eq(B->attention_backward(ex, dt, o->dqkv, g, x, o->probs, a->n, a->t, a->h, a->d, ws),
               0);
  free(ws), free(qkv), free(dout);
}

static const uint32_t ATTN_SHAPES[][4] = { /* n, t, heads, head_size */
    {2, 1, 3, 5}, {2, 7, 3, 5}, {1, 64, 3, 5}, {1, 100, 3, 5}, {3, 9, 1, 8},
};
#define ATTN_NSHAPES (sizeof ATTN_SHAPES / sizeof ATTN_SHAPES[0])

Test(attn_ops, attention_fp32_against_definition_and_fd, .timeout = 120) {
  for (size_t k = 0; k < ATTN_NSHAPES; k++) {
    const uint32_t *sh = ATTN_SHAPES[k];
    char what[64];
    snprintf(what, sizeof what, "attention n%u t%u h%u d%u", sh[0], sh[1], sh[2], sh[3]);
    attn_case a;
    attn_init(&a, GS_F32, sh[0], sh[1], sh[2], sh[3]);
    attn_res o;
    attn_run(EX, &a, GS_F32, NULL, NULL, &o);
    attn_ref(&a);
    size_t T = a.t;
    for (size_t i = 0; i < attn_nprobs(&a); i++) {
      size_t t = i / T % T, s = i % T;
      if (s > t)
        cr_assert(o.probs[i] == 0.0f && !signbit(o.probs[i]), "%s probs[%zu] masked: %g", what,
                  i, (double)o.probs[i]);
      else
        expect_close(what, "probs", i, o.probs[i], a.probs[i], 1e-6, 1e-5);
    }
    for (size_t i = 0; i < attn_nout(&a); i++)
      expect_close(what, "out", i, get_dt(GS_F32, o.out, i), a.out[i], 1e-5, 1e-5);
    double *fd = calloc(attn_nqkv(&a) + 1, sizeof *fd);
    fd_grad(attn_ref_loss, &a, a.qkv, attn_nqkv(&a), FD_H, fd);
    for (size_t i = 0; i < attn_nqkv(&a); i++)
      expect_close(what, "dqkv", i, get_dt(GS_F32, o.dqkv, i), fd[i], 2e-5, 1e-4);
    free(fd);
    attn_res_free(&o);
    attn_free(&a);
  }
}

/* A later position's k and v (here large, 16-bit-exact values) change no
 * bit of the earlier rows' out and probs; a dout that is zero from row c
 * on gives exactly zero dq from row c and dk, dv from position c. */
Test(attn_ops, attention_is_causal_bit_for_bit) {
  for (int k = 0; k < 3; k++) {
    gs_dtype dt = ALL_DT[k];
    attn_case a;
    attn_init(&a, dt, 2, 70, 3, 5);
    const size_t T = a.t, HD = (size_t)a.h * a.d, cut = 37, es = gs_dtype_size(dt);
    for (size_t i = 0; i < attn_nout(&a); i++)
      if (i / HD % T >= cut)
        a.r[i] = 0;
    attn_res o1, o2;
    attn_run(EX, &a, dt, NULL, NULL, &o1);
    for (size_t n = 0; n < a.n; n++)
      for (size_t t = cut; t < T; t++)
        for (size_t c = HD; c < 3 * HD; c++)
          a.qkv[(n * T + t) * 3 * HD + c] = (c % 2 ? 1000.0 : -512.0);
    attn_run(EX, &a, dt, NULL, NULL, &o2);
    for (size_t i = 0; i < attn_nout(&a); i++)
      if (i / HD % T < cut)
        cr_assert(memcmp((char *)o1.out + i * es, (char *)o2.out + i * es, es) == 0,
                  "%s out[%zu] (row %zu) moved with a later k, v", gs_dtype_name(dt), i,
                  i / HD % T);
    for (size_t i = 0; i < attn_nprobs(&a); i++)
      if (i / T % T < cut)
        cr_assert(memcmp(o1.probs + i, o2.probs + i, 4) == 0, "%s probs[%zu] moved",
                  gs_dtype_name(dt), i);
    for (size_t i = 0; i < attn_nqkv(&a); i++) {
      size_t t = i / (3 * HD) % T, c = i % (3 * HD);
      bool q = c < HD;
      if (t >= cut) /* q of a row without dout, k and v of a position no such row sees */
        cr_assert(get_dt(dt, o1.dqkv, i) == 0.0, "%s dqkv[%zu] (t %zu, %s) = %g, want 0",
                  gs_dtype_name(dt), i, t, q ? "q" : c < 2 * HD ? "k" : "v",
                  get_dt(dt, o1.dqkv, i));
    }
    attn_res_free(&o1);
    attn_res_free(&o2);
    attn_free(&a);
  }
}

/* 16-bit storage against fp32 on the same (rounded) qkv and dout: the
 * math is the same fp32, so out and dqkv differ by their rounding on
 * store, probs (fp32 in both) by the order of nothing */
Test(attn_ops, attention_16bit_matches_fp32) {
  for (int k = 1; k < 3; k++) {
    gs_dtype dt = ALL_DT[k];
    for (size_t s = 0; s < ATTN_NSHAPES; s++) {
      const uint32_t *sh = ATTN_SHAPES[s];
      attn_case a;
      attn_init(&a, dt, sh[0], sh[1], sh[2], sh[3]);
      attn_res o16, o32;
      attn_run(EX, &a, dt, NULL, NULL, &o16);
      attn_run(EX, &a, GS_F32, NULL, NULL, &o32);
      char what[80];
      snprintf(what, sizeof what, "attention %s t%u", gs_dtype_name(dt), sh[1]);
      double e = eps_dt(dt);
      for (size_t i = 0; i < attn_nprobs(&a); i++)
        expect_close(what, "probs", i, o16.probs[i], o32.probs[i], 1e-7, 1e-6);
      for (size_t i = 0; i < attn_nout(&a); i++)
        expect_close(what, "out", i, get_dt(dt, o16.out, i), get_dt(GS_F32, o32.out, i), 1e-6, e);
      for (size_t i = 0; i < attn_nqkv(&a); i++)
        expect_close(what, "dqkv", i, get_dt(dt, o16.dqkv, i), get_dt(GS_F32, o32.dqkv, i), 1e-6,
                     e);
      attn_res_free(&o16);
      attn_res_free(&o32);
      attn_free(&a);
    }
  }
}

Test(attn_ops, attention_threads_give_the_same_bits) {
  for (int k = 0; k < 3; k++) {
    gs_dtype dt = ALL_DT[k];
    attn_case a;
    attn_init(&a, dt, 3, 70, 3, 8);
    attn_res o1, o2;
    attn_run(EX1, &a, dt, NULL, NULL, &o1);
    attn_run(EX, &a, dt, NULL, NULL, &o2);
    size_t es = gs_dtype_size(dt);
    cr_assert(memcmp(o1.out, o2.out, attn_nout(&a) * es) == 0, "%s out", gs_dtype_name(dt));
    cr_assert(memcmp(o1.probs, o2.probs, attn_nprobs(&a) * 4) == 0, "%s probs",
              gs_dtype_name(dt));
    cr_assert(memcmp(o1.dqkv, o2.dqkv, attn_nqkv(&a) * es) == 0, "%s dqkv", gs_dtype_name(dt));
    attn_res_free(&o1);
    attn_res_free(&o2);
    attn_free(&a);
  }
}

Test(attn_ops, attention_workspace_is_a_function_of_the_shape) {
  cr_assert_eq(B->attention_workspace(GS_F32, 0, 7, 3, 5), 0);
  cr_assert_eq(B->attention_workspace(GS_F16, 2, 0, 3, 5), 0);
  /* grows with T, not with T^2 per pair: far below probs at T = 1024 */
  size_t ws = B->attention_workspace(GS_BF16, 8, 1024, 12, 64);
  size_t probs = (size_t)8 * 12 * 1024 * 1024 * sizeof(float);
  cr_assert(ws > 0 && ws < probs / 2, "workspace %zu bytes against probs %zu", ws, probs);
  cr_assert(B->attention_workspace(GS_F32, 8, 1024, 12, 64) <= ws,
            "fp32 stages nothing, so needs no more than 16-bit storage");
}
