/*
 * fake_cuda_plugin.c: stand-ins for the CUDA plugin built against another
 * backend contract (FAKE_ABI) or before contracts had a version (no
 * gs_cuda_plugin_abi at all), for test_cuda_load's refusals. Built twice by
 * kernels/CMakeLists.txt; neither needs CUDA.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kernels/backend.h"

#ifdef FAKE_ABI
__attribute__((visibility("default"))) const uint32_t gs_cuda_plugin_abi = FAKE_ABI;
#endif

/* The loader must refuse the plugin before it calls this. */
__attribute__((visibility("default"))) gs_backend *gs_cuda_backend_open(char *why,
                                                                        size_t why_len) {
  if (why && why_len)
    snprintf(why, why_len, "the fake plugin's gs_cuda_backend_open ran");
  return NULL;
}
