/*
 * cblas.h (tests/gpu/fallback): the two OpenBLAS entry points the cpu
 * backend calls, for the GPU machine's build when no OpenBLAS bundle was
 * carried there (see ref_blas.c and docs/gpu.md). Same names and values as
 * OpenBLAS's cblas.h, so kernels/cpu/ compiles unchanged against it.
 */
#ifndef GS_FALLBACK_CBLAS_H
#define GS_FALLBACK_CBLAS_H

typedef int blasint;
typedef enum CBLAS_ORDER { CblasRowMajor = 101, CblasColMajor = 102 } CBLAS_ORDER;
typedef enum CBLAS_TRANSPOSE { CblasNoTrans = 111, CblasTrans = 112 } CBLAS_TRANSPOSE;

void cblas_sgemm(enum CBLAS_ORDER order, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb,
                 blasint m, blasint n, blasint k, float alpha, const float *a, blasint lda,
                 const float *b, blasint ldb, float beta, float *c, blasint ldc);
void openblas_set_num_threads(int n);

#endif
