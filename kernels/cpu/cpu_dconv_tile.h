/*
 * cpu_dconv_tile.h: the register blocks of the direct conv loops
 * (cpu_conv_direct.c), written once for any vector width and included
 * once per width: DC_VT is the vector type, DC_W its floats, DC_MT the
 * mask of the last vector's lanes, DC_TARGET the function attribute,
 * DC_NAME(x) the name of x at that width, DC_RMAX the table of the largest
 * R for each V (1..DC_VMAX), and DC_MASK(n), DC_LOADU, DC_LOADM, DC_STOREU,
 * DC_STOREM, DC_SET1, DC_FMADD, DC_ZERO, DC_RELU the operations. A block
 * is R x V accumulators (at most 14 x 4); only its last vector may be
 * short of lanes. The loops over r and v unroll in full, so each
 * acc[r][v] is a register.
 *
 * Every output (and every dw element) is one chain of fused
 * multiply-adds over the same terms in the same order whatever R, V and
 * the width, so both widths give the same bits.
 */

/* vecs[v] = the V vectors at p, the last one masked */
static inline __attribute__((always_inline)) DC_TARGET void
DC_NAME(dc_loadv)(const int V, DC_VT *vecs, DC_MT m, const float *p) {
#pragma GCC unroll 16
  for (int v = 0; v < V - 1; v++)
    vecs[v] = DC_LOADU(p + DC_W * v);
  vecs[V - 1] = DC_LOADM(m, p + DC_W * (V - 1));
}

/* the V vectors of vecs to p, the last one masked */
static inline __attribute__((always_inline)) DC_TARGET void
DC_NAME(dc_storev)(const int V, float *p, DC_MT m, const DC_VT *vecs) {
#pragma GCC unroll 16
  for (int v = 0; v < V - 1; v++)
    DC_STOREU(p + DC_W * v, vecs[v]);
  DC_STOREM(p + DC_W * (V - 1), m, vecs[V - 1]);
}

/* acc[r][v] += x[r * xs] * vecs[v]: R broadcasts, R*V fused multiply-adds */
static inline __attribute__((always_inline)) DC_TARGET void
DC_NAME(dc_fma)(const int R, const int V, DC_VT acc[14][4], const float *x, long xs,
                const DC_VT *vecs) {
#pragma GCC unroll 16
  for (int r = 0; r < R; r++) {
    DC_VT xv = DC_SET1(x[r * xs]);
#pragma GCC unroll 16
    for (int v = 0; v < V; v++)
      acc[r][v] = DC_FMADD(xv, vecs[v], acc[r][v]);
  }
}

/* R output pixels x V vectors of output channels */
static inline __attribute__((always_inline)) DC_TARGET void
DC_NAME(fwd_tile)(const int R, const int V, const struct fwd_args *x) {
  DC_VT acc[14][4], wv[4];
  DC_MT m = DC_MASK(x->left - DC_W * (V - 1));
  if (x->b)
    DC_NAME(dc_loadv)(V, wv, m, x->b);
#pragma GCC unroll 16
  for (int v = 0; v < V; v++)
#pragma GCC unroll 16
    for (int r = 0; r < R; r++)
      acc[r][v] = x->b ? wv[v] : DC_ZERO;
  for (long ky = 0; ky < x->kh; ky++)
    for (long kx = 0; kx < x->kw; kx++) {
      const float *ap = x->a + ky * x->rowp + kx * x->c;
      const float *wp = x->w + (ky * x->kw + kx) * x->c * x->f;
      for (long ci = 0; ci < x->c; ci++, wp += x->f) {
        DC_NAME(dc_loadv)(V, wv, m, wp);
        DC_NAME(dc_fma)(R, V, acc, ap + ci, x->sp, wv);
      }
    }
#pragma GCC unroll 16
  for (int r = 0; r < R; r++) {
    if (x->relu) /* gs_cpu_relu1: NaN passes, -0 becomes +0 */
#pragma GCC unroll 16
      for (int v = 0; v < V; v++)
        acc[r][v] = DC_RELU(acc[r][v]);
    DC_NAME(dc_storev)(V, x->o + r * x->f, m, acc[r]);
  }
}

/* R input channels x V vectors of output channels, over every pixel */
static inline __attribute__((always_inline)) DC_TARGET void
DC_NAME(wg_tile)(const int R, const int V, const struct wg_args *x) {
  DC_VT acc[14][4], dv[4];
  DC_MT m = DC_MASK(x->left - DC_W * (V - 1));
#pragma GCC unroll 16
  for (int r = 0; r < R; r++)
    DC_NAME(dc_loadv)(V, acc[r], m, x->dw + r * x->f);
  const float *d = x->d;
  for (long oy = 0; oy < x->oh; oy++) {
    const float *ap = x->a + oy * x->rs * x->rowp;
    for (long ox = 0; ox < x->ow; ox++, ap += x->sp, d += x->f) {
      DC_NAME(dc_loadv)(V, dv, m, d);
      DC_NAME(dc_fma)(R, V, acc, ap, 1, dv);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; r++)
    DC_NAME(dc_storev)(V, x->dw + r * x->f, m, acc[r]);
}

DC_TARGET static void DC_NAME(fwd_tile_any)(long r, long v, const struct fwd_args *x) {
  DC_DISPATCH(DC_NAME(fwd_tile), r, v, x)
}

DC_TARGET static void DC_NAME(wg_tile_any)(long r, long v, const struct wg_args *x) {
  DC_DISPATCH(DC_NAME(wg_tile), r, v, x)
}

static const long DC_NAME(rmax)[] = {DC_RMAX};

static const struct dc_width DC_NAME(width) = {
    .w = DC_W, .vmax = sizeof DC_NAME(rmax) / sizeof DC_NAME(rmax)[0], .rmax = DC_NAME(rmax),
    .fwd = DC_NAME(fwd_tile_any), .wg = DC_NAME(wg_tile_any)};
