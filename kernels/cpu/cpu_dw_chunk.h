/*
 * cpu_dw_chunk.h: the fp32 depthwise loops that keep a chunk of channel
 * blocks in vector registers, written once for any vector width and
 * included by cpu_conv.c once per width: DW_VT is the vector type (gs_v8,
 * gs_v16), DW_VW its floats, DW_NAME(x) the name of x at that width. The
 * AVX-512 clone of each depthwise loop takes the 16-float blocks, the rest
 * the 8-float ones; every output adds the same terms in the same order at
 * either width, so both give the bits of the plain loop.
 */
#define DW_LOAD(v, p) memcpy(&(v), (p), sizeof(DW_VT))
#define DW_STORE(p, v) memcpy((p), &(v), sizeof(DW_VT))

/* acc[b] += a[b] * w[b] for nb blocks of DW_VW floats (pointers, so no
 * vector crosses a call boundary; always inlined) */
static inline __attribute__((always_inline)) void DW_NAME(mac)(DW_VT *acc, const float *a,
                                                         const float *w, long nb) {
  DW_VT x, y;
  for (long b = 0; b < nb; b++) {
    DW_LOAD(x, a + b * DW_VW);
    DW_LOAD(y, w + b * DW_VW);
    acc[b] += x * y;
  }
}

static inline __attribute__((always_inline)) void DW_NAME(store_n)(float *o, const DW_VT *acc,
                                                             long nb) {
  for (long b = 0; b < nb; b++)
    DW_STORE(o + b * DW_VW, acc[b]);
}

/* the same for fp32 and nb <= DW_CHUNK whole blocks from c0: the
 * accumulators stay in registers, and each tap reads all nb blocks of its
 * input row at once */
static inline __attribute__((always_inline)) void
DW_NAME(dw_fwd_chunk)(const struct dw_job *j, long img, long oy, long ox, long ky0, long ky1, long kx0,
                 long kx1, long c0, long nb) {
  const geo *g = j->g;
  DW_VT acc[DW_CHUNK];
  for (long b = 0; b < nb; b++) {
    if (j->bf)
      DW_LOAD(acc[b], j->bf + c0 + b * DW_VW);
    else
      acc[b] = (DW_VT){0};
  }
  for (long ky = ky0; ky < ky1; ky++) {
    long iy = oy * g->stride - g->pt + ky;
    const float *xr = (const float *)j->src + (img * g->h + iy) * g->w * g->c + c0;
    for (long kx = kx0; kx < kx1; kx++) {
      const float *xp = xr + (ox * g->stride - g->pl + kx) * g->c;
      const float *wp = j->wf + (ky * g->kw + kx) * g->c + c0;
      DW_NAME(mac)(acc, xp, wp, nb);
    }
  }
  DW_NAME(store_n)((float *)j->dst + ((img * g->oh + oy) * g->ow + ox) * g->c + c0, acc, nb);
}


/* The weight-gradient loops' sums, acc[t][b] for taps t of dw and dbacc[b]
 * of db, blocks b from channel c0 (j, g and c0 in scope): read in from dw
 * and db (db's from 0 when there is no db), and written back. */
#define DW_WG_READ(acc, dbacc, taps, nb)                                                       \
  do {                                                                                         \
    for (long b_ = 0; b_ < (nb); b_++) {                                                       \
      for (long t_ = 0; t_ < (taps); t_++)                                                     \
        DW_LOAD((acc)[t_][b_], j->dw + t_ * g->c + c0 + b_ * DW_VW);                           \
      (dbacc)[b_] = (DW_VT){0};                                                                \
      if (j->db)                                                                               \
        DW_LOAD((dbacc)[b_], j->db + c0 + b_ * DW_VW);                                         \
    }                                                                                          \
  } while (0)
#define DW_WG_WRITE(acc, dbacc, taps, nb)                                                      \
  do {                                                                                         \
    for (long b_ = 0; b_ < (nb); b_++) {                                                       \
      for (long t_ = 0; t_ < (taps); t_++)                                                     \
        DW_STORE(j->dw + t_ * g->c + c0 + b_ * DW_VW, (acc)[t_][b_]);                          \
      if (j->db)                                                                               \
        DW_STORE(j->db + c0 + b_ * DW_VW, (dbacc)[b_]);                                        \
    }                                                                                          \
  } while (0)

/* the same for fp32, nb <= DW_CHUNK whole blocks from c0 and a window of at
 * most DW_LOCAL_TAPS taps: db's sums and dw's stay in an aligned array on
 * the stack, read from db and dw first and written back last, and each
 * pixel reads all nb blocks of its input row at once. (One block at a time
 * streamed the input once per block, using half of each cache line, and
 * adding straight into dw chained every pixel's load-add-store of a tap to
 * the previous one's through the store buffer.) */
static inline __attribute__((always_inline)) void DW_NAME(dw_wgrad_chunk)(const struct dw_job *j,
                                                                     long c0, long nb) {
  const geo *g = j->g;
  const float *src = j->src, *in = j->in;
  DW_VT acc[DW_LOCAL_TAPS][DW_CHUNK], dbacc[DW_CHUNK], d[DW_CHUNK], x;
  long taps = j->dw ? g->kh * g->kw : 0;
  DW_WG_READ(acc, dbacc, taps, nb);
  for (long img = 0; img < g->n; img++)
    for (long oy = 0; oy < g->oh; oy++) {
      long ky0, ky1;
      tap_range(oy, g->stride, g->pt, g->kh, g->h, &ky0, &ky1);
      for (long ox = 0; ox < g->ow; ox++) {
        const float *dp = src + ((img * g->oh + oy) * g->ow + ox) * g->c + c0;
        for (long b = 0; b < nb; b++) {
          DW_LOAD(d[b], dp + b * DW_VW);
          dbacc[b] += d[b];
        }
        if (!taps)
          continue;
        long kx0, kx1;
        tap_range(ox, g->stride, g->pl, g->kw, g->w, &kx0, &kx1);
        for (long ky = ky0; ky < ky1; ky++) {
          long iy = oy * g->stride - g->pt + ky;
          const float *xr = in + (img * g->h + iy) * g->w * g->c + c0;
          for (long kx = kx0; kx < kx1; kx++) {
            long ix = ox * g->stride - g->pl + kx;
            DW_VT *ar = acc[ky * g->kw + kx];
            for (long b = 0; b < nb; b++) {
              DW_LOAD(x, xr + ix * g->c + b * DW_VW);
              ar[b] += d[b] * x;
            }
          }
        }
      }
    }
  DW_WG_WRITE(acc, dbacc, taps, nb);
}

/* dw_wgrad_chunk for a 3x3 window and nb <= DW_W3_NB(DW_VW) blocks: every
 * tap's accumulator is named by constants, so all nine stay in registers
 * (the general loop indexes them by a run-time tap number, which keeps
 * them on the stack and chains each pixel's add to the previous one's
 * through memory). The same terms in the same order: the same bits. */
#define DW_W3_NB(vw) ((vw) == 16 ? 2 : 1)
static inline __attribute__((always_inline)) void DW_NAME(dw_wgrad3_chunk)(const struct dw_job *j,
                                                                      long c0, long nb) {
  const geo *g = j->g;
  const float *src = j->src, *in = j->in;
  DW_VT acc[9][DW_W3_NB(DW_VW)], dbacc[DW_W3_NB(DW_VW)], d[DW_W3_NB(DW_VW)], x;
  DW_WG_READ(acc, dbacc, 9, nb);
  for (long img = 0; img < g->n; img++)
    for (long oy = 0; oy < g->oh; oy++) {
      long ky0, ky1;
      tap_range(oy, g->stride, g->pt, 3, g->h, &ky0, &ky1);
      for (long ox = 0; ox < g->ow; ox++) {
        const float *dp = src + ((img * g->oh + oy) * g->ow + ox) * g->c + c0;
        for (long b = 0; b < nb; b++) {
          DW_LOAD(d[b], dp + b * DW_VW);
          dbacc[b] += d[b];
        }
        long kx0, kx1;
        tap_range(ox, g->stride, g->pl, 3, g->w, &kx0, &kx1);
        for (long ky = 0; ky < 3; ky++) {
          if (ky < ky0 || ky >= ky1)
            continue;
          long iy = oy * g->stride - g->pt + ky;
          for (long kx = 0; kx < 3; kx++) {
            if (kx < kx0 || kx >= kx1)
              continue;
            const float *xp = in + ((img * g->h + iy) * g->w + ox * g->stride - g->pl + kx) * g->c + c0;
            for (long b = 0; b < nb; b++) {
              DW_LOAD(x, xp + b * DW_VW);
              acc[ky * 3 + kx][b] += d[b] * x;
            }
          }
        }
      }
    }
  DW_WG_WRITE(acc, dbacc, 9, nb);
}

/* the same for fp32 and nb <= DW_CHUNK whole blocks from c0 */
static inline __attribute__((always_inline)) void DW_NAME(dw_dgrad_chunk)(const struct dw_job *j,
                                                                     long img, long iy, long ix,
                                                                     const struct dw_first *t,
                                                                     long c0, long nb) {
  const geo *g = j->g;
  DW_VT acc[DW_CHUNK];
  for (long b = 0; b < nb; b++)
    acc[b] = (DW_VT){0};
  for (long ky = t->ky, oy = t->oy; ky < g->kh && oy >= 0; ky += g->stride, oy--) {
    if (oy >= g->oh)
      continue;
    for (long kx = t->kx, ox = t->ox; kx < g->kw && ox >= 0; kx += g->stride, ox--) {
      if (ox >= g->ow)
        continue;
      const float *dp = (const float *)j->src + ((img * g->oh + oy) * g->ow + ox) * g->c + c0;
      const float *wp = j->wf + (ky * g->kw + kx) * g->c + c0;
      DW_NAME(mac)(acc, dp, wp, nb);
    }
  }
  DW_NAME(store_n)((float *)j->dst + ((img * g->h + iy) * g->w + ix) * g->c + c0, acc, nb);
}

#undef DW_WG_READ
#undef DW_WG_WRITE
#undef DW_LOAD
#undef DW_STORE
