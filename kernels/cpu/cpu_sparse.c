/*
 * cpu_sparse.c: fp32 dense layers whose input is mostly zeros.
 *
 * Image data is: half of Fashion-MNIST's pixels are exactly 0 (background),
 * and a layer after a relu sees about as many zeros. A dense layer's forward
 * (out = in . w + b) and its weight gradient (dw += in^T . dout) spend a
 * multiply-add on every element of `in`, zero or not; here they spend one
 * on each nonzero only. fashion-mlp's first layer (128 x 784 -> 256, 49%
 * nonzero) is 80% of its step's multiply-adds, so the path halves most of
 * a step's arithmetic. `bench_kernels` prints the layer on this path
 * against the dense GEMMs, listing included (its figures are in
 * tests/bench/RESULTS.md).
 *
 * How: the nonzeros of `in` are listed once per call (forward: by row, for
 * each sample the pixels that are not 0; weight gradient: by column, for
 * each pixel the samples), with AVX2 (a compare, a mask and a permute from
 * a table of 256 shuffles put 8 floats' nonzeros side by side). Then each
 * 64-column tile of the output is eight vector accumulators in registers:
 * for each listed (value, row of the dense operand), acc += value * row. The
 * dense operand is taken 128 rows at a time and copied into a 32 KB block
 * with rows 256 bytes apart (w's own rows are 1 KB apart in fashion-mlp,
 * and 64 of them fall on 16 sets of the 8-way L1: the copy is what keeps
 * the rows a list walks apart in the cache).
 * The forward's threads split the tiles and copy w's blocks as they go; the
 * gradient copies all of dout once, into its workspace, and its threads
 * then take its rows of dw 16 at a time, each the next 16 not taken (the
 * counts of a column's nonzeros vary too much for an even split).
 *
 * Bits: each output is its initial value (bias, 0, or dw as it was) plus
 * the products in the order of `in`'s index (pixels ascending for the
 * forward, samples ascending for the gradient), each a fused multiply-add
 * (one rounding, as in OpenBLAS's kernel; the path exists only where the
 * CPU has FMA, so no baseline build has to match it). How the
 * work is split over threads never changes that order, so the result has
 * the same bits on 1 thread or 16; it is not OpenBLAS's order, so it
 * differs from the dense path's in the last bits. A zero input adds
 * nothing, even against an infinite or NaN weight, where a dense GEMM
 * would add 0 x inf = NaN; a NaN or infinite input is listed like any
 * nonzero and propagates as in the dense path.
 *
 * When: fp32 only, with AVX2 and FMA, for layers of at least
 * GS_CPU_SPARSE_MIN_MACS multiply-adds with at least 64 units, 8 inputs
 * and a batch of 8, and only when the input holds at most
 * GS_CPU_SPARSE_MAX_DENSITY nonzeros. Its first 8 rows are counted first,
 * to turn a plainly dense input away before listing it, but against the
 * looser GS_CPU_SPARSE_PROBE_DENSITY: 8 images vary too much to judge a
 * batch by (at the whole batch's threshold, many random Fashion-MNIST
 * batches would be turned away by their first 8 images, though none of
 * them is over it whole).
 * That is decided per
 * call from the data alone, never from a part of the split, so the same
 * data always takes the same path on any thread count. Anything else runs
 * the dense GEMM (cpu_dense.c).
 */
#include <stdatomic.h>
#include <string.h>

#include "kernels/cpu/cpu_internal.h"

_Atomic uint64_t gs_cpu_sparse_calls;

#if defined(__x86_64__) && defined(__GNUC__)
#define GS_SPARSE_X86 1
#include <immintrin.h>
#else
#define GS_SPARSE_X86 0
#endif

/* Output columns in one register tile (eight 8-float accumulators), and
 * rows of the dense operand in one packed block (a multiple of 8): 128, a
 * 32 KB block. For the weight gradient that is all of a 128-sample batch's
 * dout, so each row of dw is read and written once per tile (64 costs a
 * second pass over dw, 800 KB in fashion-mlp's first layer). For the
 * forward, 64 rows (16 KB, all of it in L1 beside the lists) made a list's
 * run through a block half as long, and the block's loop and its
 * accumulators' loads and stores cost more than the L1 saved. */
#define SP_NB 64
#define SP_KB 128

static size_t nblocks(size_t k, size_t kb) { return (k + kb - 1) / kb; }

/* The nonzeros of one side, as lists: list r holds entries
 * [blk[r * (nb + 1)], blk[r * (nb + 1) + nb]), the first of block b at
 * blk[r * (nb + 1) + b]; entry e is the value val[e] and off[e], the index
 * along the other side times SP_NB (its row's offset in a packed block). A
 * list's entries start at r * cap, cap = its length + 8 (a group of 8 is
 * stored whole and then only the nonzeros counted). */
struct sp_lists {
  float *val;
  uint32_t *off;
  uint32_t *blk;
  size_t kb;  /* indices per block */
  size_t nb;  /* blocks along the listed index */
  size_t cap; /* entries reserved per list */
};

/* The lists' layout in a workspace for `nlists` lists over `len` indices. */
/* Entries list r holds (its nonzeros). */
static size_t list_len(const struct sp_lists *s, size_t r) {
  return s->blk[r * (s->nb + 1) + s->nb] - r * s->cap;
}

static size_t lists_bytes(size_t nlists, size_t len, size_t kb) {
  size_t cap = len + 8;
  return nlists * cap * (sizeof(float) + sizeof(uint32_t)) +
         nlists * (nblocks(len, kb) + 1) * sizeof(uint32_t);
}

static struct sp_lists lists_at(void *ws, size_t nlists, size_t len, size_t kb) {
  struct sp_lists s;
  s.cap = len + 8;
  s.kb = kb;
  s.nb = nblocks(len, kb);
  s.val = ws;
  s.off = (uint32_t *)(s.val + nlists * s.cap);
  s.blk = s.off + nlists * s.cap;
  return s;
}

static size_t tiles_of(size_t oc) { return (oc + SP_NB - 1) / SP_NB; }

/* The weight gradient packs dout once for all of its items (below), in
 * front of its lists in the workspace: n rows of every tile, and 64 bytes
 * to align them. */
static size_t packed_bytes(size_t n, size_t oc) {
  return tiles_of(oc) * n * SP_NB * sizeof(float) + 64;
}

bool gs_cpu_sparse_eligible(size_t n, size_t c, size_t oc) {
#if GS_SPARSE_X86
  /* oc: a tile is 64 columns wide whatever the layer's width, so a
   * narrower layer would pay for columns it does not have (a 10-class
   * head: 6.4 times its multiply-adds) */
  if (n < 8 || c < 8 || oc < SP_NB)
    return false;
  /* entries are numbered, and offsets (index x 64) kept, in 32 bits */
  double dn = (double)n, dc = (double)c;
  if (dn * (dc + 8) > UINT32_MAX || dc * (dn + 8) > UINT32_MAX ||
      n > UINT32_MAX / SP_NB || c > UINT32_MAX / SP_NB)
    return false;
  return dn * dc * (double)oc >= (double)GS_CPU_SPARSE_MIN_MACS;
#else
  (void)n, (void)c, (void)oc;
  return false;
#endif
}

size_t gs_cpu_sparse_workspace(size_t n, size_t c, size_t oc) {
  if (!gs_cpu_sparse_eligible(n, c, oc))
    return 0;
  size_t fwd = lists_bytes(n, c, SP_KB),
         wgrad = packed_bytes(n, oc) + lists_bytes(c, n, SP_KB);
  return fwd > wgrad ? fwd : wgrad;
}

#if GS_SPARSE_X86

#define SP_AVX2 __attribute__((target("avx2,fma")))

/* AVX2 and FMA, at the level in use (GS_CPU_ISA=baseline turns the path
 * off) */
static bool cpu_has_avx2(void) { return gs_cpu_isa() >= GS_CPU_ISA_AVX2; }

/* LEFT[m]: the positions of the set bits of m, first to last, then zeros. */
static uint32_t LEFT[256][8];
static pthread_once_t left_once = PTHREAD_ONCE_INIT;
static void left_init(void) {
  for (unsigned m = 0; m < 256; m++) {
    unsigned q = 0;
    for (unsigned b = 0; b < 8; b++)
      if (m >> b & 1u)
        LEFT[m][q++] = b;
    while (q < 8) LEFT[m][q++] = 0;
  }
}

/* Append the nonzeros of v (8 floats at indices base..base+7) at val/off +
 * p; returns how many. Stores 8 entries, so the list needs 8 spare. */
SP_AVX2 static inline uint32_t append8(__m256 v, uint32_t base, float *val, uint32_t *off) {
  int m = _mm256_movemask_ps(_mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_NEQ_UQ));
  __m256i perm = _mm256_loadu_si256((const __m256i *)LEFT[m]);
  _mm256_storeu_ps(val, _mm256_permutevar8x32_ps(v, perm));
  __m256i idx = _mm256_add_epi32(perm, _mm256_set1_epi32((int)base));
  _mm256_storeu_si256((__m256i *)off, _mm256_slli_epi32(idx, 6)); /* x SP_NB */
  return (uint32_t)__builtin_popcount((unsigned)m);
}

static inline uint32_t append1(float v, uint32_t index, float *val, uint32_t *off) {
  *val = v;
  *off = index * SP_NB;
  return v != 0.0f;
}

/* ---- listing: rows of in (N, C), for the forward ---- */
struct rows_job {
  const float *in;
  size_t n, c;
  struct sp_lists s;
};

SP_AVX2 static void list_rows_part(void *ctx, size_t lo, size_t hi) {
  const struct rows_job *j = ctx;
  const struct sp_lists *s = &j->s;
  for (size_t r = lo; r < hi; r++) {
    const float *x = j->in + r * j->c;
    uint32_t *blk = s->blk + r * (s->nb + 1);
    uint32_t p = (uint32_t)(r * s->cap);
    size_t k = 0;
    for (; k + 8 <= j->c; k += 8) {
      if (k % s->kb == 0)
        blk[k / s->kb] = p;
      p += append8(_mm256_loadu_ps(x + k), (uint32_t)k, s->val + p, s->off + p);
    }
    for (; k < j->c; k++) {
      if (k % s->kb == 0)
        blk[k / s->kb] = p;
      p += append1(x[k], (uint32_t)k, s->val + p, s->off + p);
    }
    blk[s->nb] = p;
  }
}

/* 8 rows of 8 floats -> the 8 columns, in place. */
SP_AVX2 static inline void transpose8(__m256 r[8]) {
  __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
  r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
  r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
  r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
  r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
  r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
  r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
  r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

/* ---- listing: columns [lo, hi) of in (N, C), for the weight gradient;
 * lo is a multiple of 8 ---- */
SP_AVX2 static void list_cols(const float *in, size_t n, size_t c, const struct sp_lists *s,
                              size_t lo, size_t hi) {
  size_t k0 = lo;
  for (; k0 + 8 <= hi; k0 += 8) {
    uint32_t p[8];
    for (int q = 0; q < 8; q++) p[q] = (uint32_t)((k0 + q) * s->cap);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      if (i % s->kb == 0)
        for (int q = 0; q < 8; q++) s->blk[(k0 + q) * (s->nb + 1) + i / s->kb] = p[q];
      __m256 r[8];
      for (int q = 0; q < 8; q++) r[q] = _mm256_loadu_ps(in + (i + q) * c + k0);
      transpose8(r);
      for (int q = 0; q < 8; q++)
        p[q] += append8(r[q], (uint32_t)i, s->val + p[q], s->off + p[q]);
    }
    for (; i < n; i++) {
      if (i % s->kb == 0)
        for (int q = 0; q < 8; q++) s->blk[(k0 + q) * (s->nb + 1) + i / s->kb] = p[q];
      for (int q = 0; q < 8; q++)
        p[q] += append1(in[i * c + k0 + q], (uint32_t)i, s->val + p[q], s->off + p[q]);
    }
    for (int q = 0; q < 8; q++) s->blk[(k0 + q) * (s->nb + 1) + s->nb] = p[q];
  }
  for (size_t k = k0; k < hi; k++) {
    uint32_t p = (uint32_t)(k * s->cap);
    uint32_t *blk = s->blk + k * (s->nb + 1);
    for (size_t i = 0; i < n; i++) {
      if (i % s->kb == 0)
        blk[i / s->kb] = p;
      p += append1(in[i * c + k], (uint32_t)i, s->val + p, s->off + p);
    }
    blk[s->nb] = p;
  }
}

/* ---- the product: out rows [r0, r1), columns [n0, n0 + w), w <= SP_NB ----
 * out[r] = init + sum over list r's entries e of val[e] * d[off[e] / SP_NB];
 * d (K, ldd) is the dense operand, K = s->kb * s->nb at most. init: bias
 * (bias != NULL), 0 (!accumulate) or out as it is. */
struct tile_job {
  const struct sp_lists *s;
  const float *d;
  size_t ldd, kdim;
  float *out;
  size_t ldo;
  const float *bias;
  bool accumulate, relu;
};

/* Rows [k0, k0 + kn) of d's columns [n0, n0 + w) into pk (32-byte
 * aligned), rows SP_NB apart, zeros after column w. A whole tile's row is
 * copied in registers, with the row 8 ahead asked for: a memcpy call a row
 * paid a call per row and a cache miss on each strided row. */
SP_AVX2 static void pack_rows(float *pk, const float *d, size_t ldd, size_t k0, size_t kn,
                              size_t n0, size_t w) {
  if (w == SP_NB) {
    for (size_t k = 0; k < kn; k++) {
      const float *src = d + (k0 + k) * ldd + n0;
      if (k + 8 < kn)
        for (int q = 0; q < 4; q++)
          _mm_prefetch((const char *)(src + 8 * ldd) + 64 * q, _MM_HINT_T0);
      for (int q = 0; q < 8; q++)
        _mm256_store_ps(pk + k * SP_NB + 8 * q, _mm256_loadu_ps(src + 8 * q));
    }
    return;
  }
  for (size_t k = 0; k < kn; k++) {
    memcpy(pk + k * SP_NB, d + (k0 + k) * ldd + n0, w * sizeof(float));
    if (w < SP_NB)
      memset(pk + k * SP_NB + w, 0, (SP_NB - w) * sizeof(float));
  }
}

/* Block b's products into out rows [r0, r1), columns [n0, n0 + w): pk holds
 * the block's rows of d, packed (pack_rows), 32-byte aligned. */
SP_AVX2 static void tile_block(const struct tile_job *j, const float *pk, size_t b, size_t r0,
                               size_t r1, size_t n0, size_t w) {
  _Alignas(64) float part[SP_NB]; /* a narrow tile's row, padded */
  _Alignas(64) float binit[SP_NB];
  const struct sp_lists *s = j->s;
  bool first = b == 0, last = b + 1 == s->nb;
  if (first && !j->accumulate) {
    memset(binit, 0, sizeof binit);
    if (j->bias)
      memcpy(binit, j->bias + n0, w * sizeof(float));
  }
  uint32_t koff = (uint32_t)(b * s->kb * SP_NB); /* off[e] counts from row 0 */
  for (size_t r = r0; r < r1; r++) {
    float *o = j->out + r * j->ldo + n0;
    const float *src = first ? (j->accumulate ? o : binit) : o;
    if (w < SP_NB) {
      if (src == o) {
        memcpy(part, o, w * sizeof(float));
        memset(part + w, 0, (SP_NB - w) * sizeof(float));
      } else
        memcpy(part, src, sizeof part);
      src = part;
    }
    __m256 a0 = _mm256_loadu_ps(src), a1 = _mm256_loadu_ps(src + 8);
    __m256 a2 = _mm256_loadu_ps(src + 16), a3 = _mm256_loadu_ps(src + 24);
    __m256 a4 = _mm256_loadu_ps(src + 32), a5 = _mm256_loadu_ps(src + 40);
    __m256 a6 = _mm256_loadu_ps(src + 48), a7 = _mm256_loadu_ps(src + 56);
    const uint32_t *blk = s->blk + r * (s->nb + 1);
    const float *val = s->val;
    const uint32_t *off = s->off;
    for (uint32_t e = blk[b], end = blk[b + 1]; e < end; e++) {
      const float *d = pk + (off[e] - koff);
      __m256 v = _mm256_broadcast_ss(val + e);
      a0 = _mm256_fmadd_ps(v, _mm256_load_ps(d), a0);
      a1 = _mm256_fmadd_ps(v, _mm256_load_ps(d + 8), a1);
      a2 = _mm256_fmadd_ps(v, _mm256_load_ps(d + 16), a2);
      a3 = _mm256_fmadd_ps(v, _mm256_load_ps(d + 24), a3);
      a4 = _mm256_fmadd_ps(v, _mm256_load_ps(d + 32), a4);
      a5 = _mm256_fmadd_ps(v, _mm256_load_ps(d + 40), a5);
      a6 = _mm256_fmadd_ps(v, _mm256_load_ps(d + 48), a6);
      a7 = _mm256_fmadd_ps(v, _mm256_load_ps(d + 56), a7);
    }
    float *dst = w < SP_NB ? part : o;
    _mm256_storeu_ps(dst, a0);
    _mm256_storeu_ps(dst + 8, a1);
    _mm256_storeu_ps(dst + 16, a2);
    _mm256_storeu_ps(dst + 24, a3);
    _mm256_storeu_ps(dst + 32, a4);
    _mm256_storeu_ps(dst + 40, a5);
    _mm256_storeu_ps(dst + 48, a6);
    _mm256_storeu_ps(dst + 56, a7);
    if (last && j->relu)
      gs_cpu_relu_rows(dst, 1, w, w);
    if (w < SP_NB)
      memcpy(o, part, w * sizeof(float));
  }
}

/* ---- the forward: parts over 64-column tiles, all rows each ---- */
struct fwd_job {
  struct tile_job t;
  size_t n, oc;
};

SP_AVX2 static void fwd_part(void *ctx, size_t lo, size_t hi) {
  const struct fwd_job *j = ctx;
  const struct sp_lists *s = j->t.s;
  _Alignas(64) float pk[SP_KB * SP_NB]; /* 32 KB: every thread here has 8 MiB */
  for (size_t t = lo; t < hi; t++) {
    size_t n0 = t * SP_NB, w = j->oc - n0 < SP_NB ? j->oc - n0 : SP_NB;
    for (size_t b = 0; b < s->nb; b++) {
      size_t k0 = b * s->kb;
      pack_rows(pk, j->t.d, j->t.ldd, k0, j->t.kdim - k0 < s->kb ? j->t.kdim - k0 : s->kb, n0,
                w);
      tile_block(&j->t, pk, b, 0, j->n, n0, w);
    }
  }
}

static size_t count_nonzeros(const float *x, size_t count) {
  size_t nz = 0;
  for (size_t i = 0; i < count; i++) nz += x[i] != 0.0f;
  return nz;
}

static bool too_dense(size_t nonzeros, size_t total, double max_density) {
  return (double)nonzeros > max_density * (double)total;
}

/* Whether a call may take the path at all: a workspace, a layer of the
 * sizes, a CPU with AVX2 and FMA, and first rows that are not plainly
 * dense (enough to turn a dense input away before listing all of it). */
static bool may_list(const float *in, size_t n, size_t c, size_t oc, const void *ws) {
  if (!ws || !gs_cpu_sparse_eligible(n, c, oc) || !cpu_has_avx2())
    return false;
  size_t probe = (n < 8 ? n : 8) * c;
  if (too_dense(count_nonzeros(in, probe), probe, GS_CPU_SPARSE_PROBE_DENSITY))
    return false;
  pthread_once(&left_once, left_init);
  return true;
}

bool gs_cpu_sparse_forward(gs_exec *ex, float *out, const float *in, const float *w,
                           const float *b, size_t n, size_t c, size_t oc, bool relu, void *ws) {
  if (!may_list(in, n, c, oc, ws))
    return false;
  struct rows_job rj = {.in = in, .n = n, .c = c, .s = lists_at(ws, n, c, SP_KB)};
  gs_cpu_parallel(ex, n, 8, list_rows_part, &rj);
  size_t nz = 0;
  for (size_t r = 0; r < n; r++) nz += list_len(&rj.s, r);
  if (too_dense(nz, n * c, GS_CPU_SPARSE_MAX_DENSITY))
    return false;
  struct fwd_job fj = {
      .t = {.s = &rj.s, .d = w, .ldd = oc, .kdim = c, .out = out, .ldo = oc, .bias = b,
            .accumulate = false, .relu = relu},
      .n = n,
      .oc = oc};
  gs_cpu_parallel(ex, tiles_of(oc), 1, fwd_part, &fj);
  atomic_fetch_add_explicit(&gs_cpu_sparse_calls, 1, memory_order_relaxed);
  return true;
}

/* ---- the weight gradient. First a range over groups of 8 columns of in
 * (rows of dw): each part lists its columns and packs its share of dout's
 * rows for every tile, once for the whole product. Then the product, as
 * items of SP_WG_ITEM rows of dw that the threads take in turn, each the
 * next one not taken: a column's entries are far from even (a batch of
 * Fashion-MNIST holds 54% of its nonzeros in the lower half of the image),
 * and a thread of a shared host may run slower than its peer for a while;
 * an even split of the rows left one thread waiting on the other. ---- */
#define SP_WG_ITEM 16

struct wgrad_job {
  const float *in;
  size_t n, c, oc;
  struct sp_lists s;
  struct tile_job t;
  float *packed; /* tile t's rows of dout at packed + t * n * SP_NB */
  size_t items;
  _Atomic size_t nonzeros;
  _Atomic size_t next; /* the next item not taken */
};

SP_AVX2 static void wgrad_list_part(void *ctx, size_t lo, size_t hi) {
  struct wgrad_job *j = ctx;
  size_t k0 = lo * 8, k1 = hi * 8 < j->c ? hi * 8 : j->c;
  list_cols(j->in, j->n, j->c, &j->s, k0, k1);
  size_t nz = 0;
  for (size_t k = k0; k < k1; k++) nz += list_len(&j->s, k);
  atomic_fetch_add_explicit(&j->nonzeros, nz, memory_order_relaxed);
  /* the part's rows of dout: the parts' [lo, hi) cover the groups, so
   * these cover [0, n) */
  size_t groups = (j->c + 7) / 8, i0 = lo * j->n / groups, i1 = hi * j->n / groups;
  for (size_t t = 0; t < tiles_of(j->oc); t++) {
    size_t n0 = t * SP_NB;
    pack_rows(j->packed + (t * j->n + i0) * SP_NB, j->t.d, j->t.ldd, i0, i1 - i0, n0,
              j->oc - n0 < SP_NB ? j->oc - n0 : SP_NB);
  }
}

/* [lo, hi) is not used: each part takes items until none is left. */
SP_AVX2 static void wgrad_part(void *ctx, size_t lo, size_t hi) {
  struct wgrad_job *j = ctx;
  const struct sp_lists *s = &j->s;
  (void)lo, (void)hi;
  for (;;) {
    size_t i = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
    if (i >= j->items)
      return;
    size_t k0 = i * SP_WG_ITEM, k1 = k0 + SP_WG_ITEM < j->c ? k0 + SP_WG_ITEM : j->c;
    for (size_t t = 0; t < tiles_of(j->oc); t++) {
      size_t n0 = t * SP_NB, w = j->oc - n0 < SP_NB ? j->oc - n0 : SP_NB;
      for (size_t b = 0; b < s->nb; b++)
        tile_block(&j->t, j->packed + (t * j->n + b * s->kb) * SP_NB, b, k0, k1, n0, w);
    }
  }
}

bool gs_cpu_sparse_wgrad(gs_exec *ex, float *dw, const float *dout, const float *in, size_t n,
                         size_t c, size_t oc, void *ws) {
  if (!may_list(in, n, c, oc, ws))
    return false;
  struct wgrad_job j;
  j.in = in;
  j.n = n;
  j.c = c;
  j.oc = oc;
  j.packed = (float *)(((uintptr_t)ws + 63) & ~(uintptr_t)63);
  j.s = lists_at((char *)ws + packed_bytes(n, oc), c, n, SP_KB);
  j.items = (c + SP_WG_ITEM - 1) / SP_WG_ITEM;
  atomic_init(&j.nonzeros, 0);
  atomic_init(&j.next, 0);
  j.t = (struct tile_job){.s = &j.s, .d = dout, .ldd = oc, .kdim = n, .out = dw, .ldo = oc,
                          .bias = NULL, .accumulate = true, .relu = false};
  /* Two ranges: whether the product runs at all is decided on the whole
   * input's count, so that it does not depend on how the columns were
   * split over threads. */
  gs_cpu_parallel(ex, (c + 7) / 8, 1, wgrad_list_part, &j);
  if (too_dense(atomic_load_explicit(&j.nonzeros, memory_order_relaxed), n * c,
                GS_CPU_SPARSE_MAX_DENSITY))
    return false;
  gs_cpu_parallel(ex, j.items, 1, wgrad_part, &j);
  atomic_fetch_add_explicit(&gs_cpu_sparse_calls, 1, memory_order_relaxed);
  return true;
}

#else /* no AVX2 path on this architecture */

bool gs_cpu_sparse_forward(gs_exec *ex, float *out, const float *in, const float *w,
                           const float *b, size_t n, size_t c, size_t oc, bool relu, void *ws) {
  (void)ex, (void)out, (void)in, (void)w, (void)b, (void)n, (void)c, (void)oc, (void)relu,
      (void)ws;
  return false;
}

bool gs_cpu_sparse_wgrad(gs_exec *ex, float *dw, const float *dout, const float *in, size_t n,
                         size_t c, size_t oc, void *ws) {
  (void)ex, (void)dw, (void)dout, (void)in, (void)n, (void)c, (void)oc, (void)ws;
  return false;
}

#endif
