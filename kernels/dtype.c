/*
 * dtype.c: the storage types gpushare trains in, and window geometry.
 *
 * Mixed precision keeps activations and the working copy of the weights in
 * 16 bits and does all math in fp32, on the CPU exactly as on a GPU. The
 * conversions here are the scalar reference for both backends: round to
 * nearest, ties to even, subnormals kept (fp16 has them, bf16 shares fp32's
 * exponent range), overflow goes to infinity, and a NaN stays a NaN (made
 * quiet, the top payload bits kept), which is what F16C's vcvtps2ph and
 * CUDA's __float2half_rn produce, so a CPU and a GPU step agree bit for bit.
 *
 * The window helpers give TensorFlow's SAME/VALID geometry, which the job
 * spec promises: SAME pads so that out = ceil(in / stride), with the odd
 * padding element at the bottom/right.
 */
#include <string.h>

#include "kernels/backend.h"

size_t gs_dtype_size(gs_dtype dt) {
  switch (dt) {
  case GS_F32:
    return 4;
  case GS_F16:
  case GS_BF16:
    return 2;
  }
  return 0;
}

const char *gs_dtype_name(gs_dtype dt) {
  switch (dt) {
  case GS_F32:
    return "float32";
  case GS_F16:
    return "float16";
  case GS_BF16:
    return "bfloat16";
  }
  return "unknown";
}

static uint32_t f32_bits(float f) {
  uint32_t x;
  memcpy(&x, &f, sizeof x);
  return x;
}

static float bits_f32(uint32_t x) {
  float f;
  memcpy(&f, &x, sizeof f);
  return f;
}

uint16_t gs_f32_to_f16(float f) {
  uint32_t x = f32_bits(f);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
  uint32_t a = x & 0x7fffffffu;
  if (a >= 0x7f800000u) { /* inf, or NaN made quiet with its top payload */
    if (a > 0x7f800000u)
      return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    return (uint16_t)(sign | 0x7c00u);
  }
  if (a >= 0x477ff000u) /* >= 65520 rounds past 65504, the largest finite */
    return (uint16_t)(sign | 0x7c00u);
  if (a < 0x38800000u) { /* below 2^-14: an fp16 subnormal or zero */
    uint32_t e = a >> 23;
    if (e < 102) /* below 2^-25: rounds to zero (2^-25 itself ties to 0) */
      return sign;
    uint32_t m = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - e; /* 14..24: units of 2^-24 */
    uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u)))
      r++; /* may carry into 0x400, the smallest normal: still right */
    return (uint16_t)(sign | r);
  }
  uint32_t r = a - 0x38000000u; /* rebias the exponent from 127 to 15 */
  uint32_t h = r >> 13, rem = r & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
    h++; /* a mantissa carry moves into the exponent, as it should */
  return (uint16_t)(sign | h);
}

float gs_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) {
    float v = (float)m * 0x1p-24f; /* exact: m < 2^10 */
    return sign ? -v : v;
  }
  if (e == 31)
    return bits_f32(sign | 0x7f800000u | (m << 13));
  return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

uint16_t gs_f32_to_bf16(float f) {
  uint32_t x = f32_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u)
    return (uint16_t)((x >> 16) | 0x40u); /* NaN stays NaN, made quiet */
  x += 0x7fffu + ((x >> 16) & 1u);          /* ties to even; overflow -> inf */
  return (uint16_t)(x >> 16);
}

float gs_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint32_t gs_window_out(uint32_t in, uint32_t k, uint32_t stride, bool same) {
  if (stride == 0)
    return 0;
  if (same)
    return (in + stride - 1) / stride;
  if (k > in)
    return 0;
  return (in - k) / stride + 1;
}

uint32_t gs_window_pad(uint32_t in, uint32_t k, uint32_t stride, bool same) {
  if (!same || stride == 0)
    return 0;
  uint64_t out = (in + (uint64_t)stride - 1) / stride;
  if (out == 0)
    return 0;
  uint64_t need = (out - 1) * stride + k;
  return need > in ? (uint32_t)((need - in) / 2) : 0;
}

void gs_conv_shape_init(gs_conv_shape *s) {
  s->oh = gs_window_out(s->h, s->kh, s->stride, s->same);
  s->ow = gs_window_out(s->w, s->kw, s->stride, s->same);
}
