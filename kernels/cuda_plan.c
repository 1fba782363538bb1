/*
 * cuda_plan.c: gs_backend_cuda_sizes (cuda_plan.h), the table the control
 * plane plans a GPU vdev with. Apart from cuda_sizes.c because the plugin
 * compiles that file and has no cpu backend to copy.
 */
#include <pthread.h>

#include "kernels/cuda_plan.h"
#include "kernels/cuda_sizes.h"

/* Two tables, one per cuBLASLt workspace: the queries of backend.h take no
 * backend argument, so each table's functions name their figure. */
#define GS__SIZES(NAME, LT)                                                                  \
  static size_t NAME##_dense(gs_dtype dt, uint32_t n, uint32_t c, uint32_t oc) {             \
    return gs_cuda_size_dense(LT, dt, n, c, oc);                                             \
  }                                                                                          \
  static size_t NAME##_conv2d(gs_dtype dt, const gs_conv_shape *s) {                         \
    return gs_cuda_size_conv2d(LT, dt, s);                                                   \
  }                                                                                          \
  static size_t NAME##_depthwise(gs_dtype dt, const gs_conv_shape *s) {                      \
    return gs_cuda_size_depthwise(LT, dt, s);                                                \
  }
GS__SIZES(pre_hopper, (size_t)4 << 20)
GS__SIZES(hopper, (size_t)32 << 20)

static gs_backend sizes_pre_hopper, sizes_hopper;
static pthread_once_t sizes_once = PTHREAD_ONCE_INIT;

static void sizes_fill(gs_backend *t, size_t (*dense)(gs_dtype, uint32_t, uint32_t, uint32_t),
                       size_t (*conv)(gs_dtype, const gs_conv_shape *),
                       size_t (*dw)(gs_dtype, const gs_conv_shape *)) {
  *t = *gs_backend_cpu();
  t->name = "cuda";
  t->impl = NULL;
  t->host_memory = false;
  t->host_parallel = NULL;
  t->dense_workspace = dense;
  t->conv2d_workspace = conv;
  t->depthwise_workspace = dw;
  t->batchnorm_workspace = gs_cuda_size_batchnorm;
  t->layernorm_workspace = gs_cuda_size_layernorm;
  t->attention_workspace = gs_cuda_size_attention;
}

static void sizes_init(void) {
  sizes_fill(&sizes_pre_hopper, pre_hopper_dense, pre_hopper_conv2d, pre_hopper_depthwise);
  sizes_fill(&sizes_hopper, hopper_dense, hopper_conv2d, hopper_depthwise);
}

const gs_backend *gs_backend_cuda_sizes(int cc_major) {
  pthread_once(&sizes_once, sizes_init);
  return gs_cuda_lt_workspace_for(cc_major) == ((size_t)32 << 20) ? &sizes_hopper
                                                                 : &sizes_pre_hopper;
}
