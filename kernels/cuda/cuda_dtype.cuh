/*
 * cuda_dtype.cuh: the device side of the storage types, shared by the
 * kernel files of the `cuda` plugin (cuda_ops.cu, cuda_norm.cu, cuda_attn.cu): loads and
 * stores of fp32 / fp16 / bf16 that give the CPU backend's bits (dtype.c,
 * cpu_convert.c: the hardware conversion for every number, the CPU's own
 * rule for NaN), the st<DT> trait the kernels are templated over,
 * GS_DT_SWITCH to pick an instance at run time, and the grid-stride loop.
 */
#ifndef GS_KERNELS_CUDA_DTYPE_CUH
#define GS_KERNELS_CUDA_DTYPE_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "kernels/cuda/cuda_internal.h"

__device__ __forceinline__ float f16_load(uint16_t h) {
  if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu)) /* NaN: as gs_f16_to_f32 */
    return __uint_as_float(((uint32_t)(h & 0x8000u) << 16) | 0x7f800000u |
                           ((uint32_t)(h & 0x3ffu) << 13));
  return __half2float(__ushort_as_half(h));
}

__device__ __forceinline__ uint16_t f16_store(float f) {
  uint32_t x = __float_as_uint(f), a = x & 0x7fffffffu;
  if (a > 0x7f800000u) /* NaN: as gs_f32_to_f16 */
    return (uint16_t)(((x >> 16) & 0x8000u) | 0x7e00u | ((a >> 13) & 0x3ffu));
  return __half_as_ushort(__float2half_rn(f));
}

__device__ __forceinline__ float bf16_load(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

__device__ __forceinline__ uint16_t bf16_store(float f) { /* as gs_f32_to_bf16 */
  uint32_t x = __float_as_uint(f);
  if ((x & 0x7fffffffu) > 0x7f800000u)
    return (uint16_t)((x >> 16) | 0x40u);
  return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

template <int DT> struct st;
template <> struct st<GS_F32> {
  typedef float T;
  static __device__ __forceinline__ float load(float v) { return v; }
  static __device__ __forceinline__ float store(float v) { return v; }
};
template <> struct st<GS_F16> {
  typedef uint16_t T;
  static __device__ __forceinline__ float load(uint16_t v) { return f16_load(v); }
  static __device__ __forceinline__ uint16_t store(float v) { return f16_store(v); }
};
template <> struct st<GS_BF16> {
  typedef uint16_t T;
  static __device__ __forceinline__ float load(uint16_t v) { return bf16_load(v); }
  static __device__ __forceinline__ uint16_t store(float v) { return bf16_store(v); }
};

#define GS_DT_SWITCH(dt, D, ...)                                                                  \
  switch (dt) {                                                                                   \
  case GS_F32: {                                                                                  \
    constexpr int D = GS_F32;                                                                     \
    __VA_ARGS__;                                                                                  \
  } break;                                                                                        \
  case GS_F16: {                                                                                  \
    constexpr int D = GS_F16;                                                                     \
    __VA_ARGS__;                                                                                  \
  } break;                                                                                        \
  default: {                                                                                      \
    constexpr int D = GS_BF16;                                                                    \
    __VA_ARGS__;                                                                                  \
  } break;                                                                                        \
  }

#define GS_GRID_STRIDE(i, count)                                                                  \
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (count);                     \
       i += (size_t)gridDim.x * blockDim.x)

#endif
