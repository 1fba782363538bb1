/*
 * ref_blas.c (kernels/ref_blas): a plain cblas_sgemm for the CPU
 * reference on the GPU machine when the OpenBLAS bundle (tests/gpu/
 * prepare.sh) did not come along. The GPU tests' CPU GEMMs are small
 * (thousands to a few million multiply-adds), so a loop with the k index
 * outermost per row is fast enough; every product is accumulated in fp32,
 * as OpenBLAS does, in k order. Row-major only: the cpu backend asks for
 * nothing else.
 */
#include <stddef.h>

#include "kernels/ref_blas/cblas.h"

void cblas_sgemm(enum CBLAS_ORDER order, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb,
                 blasint m, blasint n, blasint k, float alpha, const float *a, blasint lda,
                 const float *b, blasint ldb, float beta, float *c, blasint ldc) {
  (void)order; /* CblasRowMajor */
  for (blasint i = 0; i < m; i++) {
    float *ci = c + (size_t)i * ldc;
    for (blasint j = 0; j < n; j++)
      ci[j] = beta == 0.0f ? 0.0f : beta * ci[j];
    for (blasint p = 0; p < k; p++) {
      float aip = alpha * (ta == CblasTrans ? a[(size_t)p * lda + i] : a[(size_t)i * lda + p]);
      if (tb == CblasTrans)
        for (blasint j = 0; j < n; j++)
          ci[j] += aip * b[(size_t)j * ldb + p];
      else
        for (blasint j = 0; j < n; j++)
          ci[j] += aip * b[(size_t)p * ldb + j];
    }
  }
}

void openblas_set_num_threads(int n) { (void)n; /* single-threaded already */ }
