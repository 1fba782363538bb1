/*
 * test_dtype.c: the fp16/bf16 conversions are the reference both backends
 * round against, so they are checked bit for bit: exact values, the largest
 * finite value and overflow, subnormals, ties to even, NaN, and every one of
 * the 65536 16-bit patterns round-tripping. Window geometry is checked
 * against TensorFlow's SAME/VALID numbers.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "kernels/backend.h"

static float fb(uint32_t x) {
  float f;
  memcpy(&f, &x, 4);
  return f;
}

static uint32_t bf(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  return x;
}

Test(dtype, sizes_and_names) {
  cr_expect_eq(gs_dtype_size(GS_F32), 4);
  cr_expect_eq(gs_dtype_size(GS_F16), 2);
  cr_expect_eq(gs_dtype_size(GS_BF16), 2);
  cr_expect_str_eq(gs_dtype_name(GS_F32), "float32");
  cr_expect_str_eq(gs_dtype_name(GS_F16), "float16");
  cr_expect_str_eq(gs_dtype_name(GS_BF16), "bfloat16");
}

Test(dtype, f16_exact_values) {
  cr_expect_eq(gs_f32_to_f16(1.0f), 0x3c00);
  cr_expect_eq(gs_f32_to_f16(-2.0f), 0xc000);
  cr_expect_eq(gs_f32_to_f16(0.0f), 0x0000);
  cr_expect_eq(gs_f32_to_f16(-0.0f), 0x8000);
  cr_expect_eq(gs_f32_to_f16(0.5f), 0x3800);
  cr_expect_eq(gs_f16_to_f32(0x3c00), 1.0f);
  cr_expect_eq(gs_f16_to_f32(0x3555), 0x1.554p-2f);
}

Test(dtype, f16_max_and_overflow) {
  cr_expect_eq(gs_f32_to_f16(65504.0f), 0x7bff);
  cr_expect_eq(gs_f16_to_f32(0x7bff), 65504.0f);
  cr_expect_eq(gs_f32_to_f16(65519.0f), 0x7bff, "below the midpoint stays finite");
  cr_expect_eq(gs_f32_to_f16(65520.0f), 0x7c00, "the midpoint ties to even: inf");
  cr_expect_eq(gs_f32_to_f16(1e6f), 0x7c00);
  cr_expect_eq(gs_f32_to_f16(-1e30f), 0xfc00);
  cr_expect_eq(gs_f32_to_f16(INFINITY), 0x7c00);
  cr_expect_eq(gs_f32_to_f16(-INFINITY), 0xfc00);
  cr_expect(isinf(gs_f16_to_f32(0x7c00)) && gs_f16_to_f32(0x7c00) > 0);
  cr_expect(isinf(gs_f16_to_f32(0xfc00)) && gs_f16_to_f32(0xfc00) < 0);
}

Test(dtype, f16_subnormals) {
  cr_expect_eq(gs_f32_to_f16(0x1p-24f), 0x0001, "smallest subnormal");
  cr_expect_eq(gs_f16_to_f32(0x0001), 0x1p-24f);
  cr_expect_eq(gs_f32_to_f16(-0x1p-24f), 0x8001);
  cr_expect_eq(gs_f32_to_f16(0x1p-25f), 0x0000, "half the smallest ties to even zero");
  cr_expect_eq(gs_f32_to_f16(0x1.0002p-25f), 0x0001, "just above the tie rounds up");
  cr_expect_eq(gs_f32_to_f16(0x1.8p-24f), 0x0002, "1.5 units ties to even 2");
  cr_expect_eq(gs_f32_to_f16(0x1.4p-23f), 0x0002, "2.5 units ties to even 2");
  cr_expect_eq(gs_f32_to_f16(0x1p-14f), 0x0400, "smallest normal");
  cr_expect_eq(gs_f16_to_f32(0x03ff), 1023.0f * 0x1p-24f, "largest subnormal");
  cr_expect_eq(gs_f32_to_f16(0x1.ff8p-15f), 0x03ff);
  cr_expect_eq(gs_f32_to_f16(0x1.ffcp-15f), 0x0400, "1023.5 units ties to even 1024");
  cr_expect_eq(gs_f32_to_f16(0x1.ffep-15f), 0x0400, "rounding carries into the normals");
  cr_expect_eq(gs_f32_to_f16(0x1p-30f), 0x0000);
  cr_expect_eq(gs_f32_to_f16(fb(0x00000001)), 0x0000, "fp32 subnormal flushes by rounding");
}

Test(dtype, f16_ties_to_even) {
  cr_expect_eq(gs_f32_to_f16(1.0f + 0x1p-11f), 0x3c00, "tie, even below");
  cr_expect_eq(gs_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02, "tie, even above");
  cr_expect_eq(gs_f32_to_f16(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01, "above the tie");
  cr_expect_eq(gs_f32_to_f16(1.0f + 0x1p-11f - 0x1p-20f), 0x3c00, "below the tie");
  cr_expect_eq(gs_f32_to_f16(2047.0f + 0.5f), 0x67ff + 1, "2047.5 ties up to 2048");
}

Test(dtype, f16_nan) {
  uint16_t h = gs_f32_to_f16(NAN);
  cr_expect_eq(h & 0x7c00, 0x7c00);
  cr_expect_neq(h & 0x03ff, 0, "a NaN must not become inf");
  cr_expect_neq(h & 0x0200, 0, "made quiet");
  /* a NaN whose payload lives only in the low fp32 bits stays NaN */
  h = gs_f32_to_f16(fb(0x7f800001));
  cr_expect((h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0);
  cr_expect(isnan(gs_f16_to_f32(0x7e00)));
  cr_expect(isnan(gs_f16_to_f32(0xfe01)));
  cr_expect(isnan(gs_f16_to_f32(gs_f32_to_f16(-NAN))));
}

Test(dtype, f16_every_pattern_round_trips) {
  for (uint32_t i = 0; i < 65536; i++) {
    uint16_t h = (uint16_t)i;
    float f = gs_f16_to_f32(h);
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) {
      cr_assert(isnan(f), "pattern %04x", h);
      uint16_t back = gs_f32_to_f16(f);
      cr_assert((back & 0x7c00) == 0x7c00 && (back & 0x3ff), "pattern %04x", h);
      continue;
    }
    cr_assert_eq(gs_f32_to_f16(f), h, "pattern %04x -> %a -> %04x", h, f, gs_f32_to_f16(f));
  }
}

Test(dtype, f16_midpoints_round_to_even) {
  /* the exact midpoint between two consecutive finite positive halves */
  for (uint32_t h = 0; h < 0x7bff; h++) {
    double lo = gs_f16_to_f32((uint16_t)h), hi = gs_f16_to_f32((uint16_t)(h + 1));
    float mid = (float)((lo + hi) / 2); /* exact in fp32 */
    uint16_t want = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
    cr_assert_eq(gs_f32_to_f16(mid), want, "midpoint of %04x and %04x", h, h + 1);
  }
}

Test(dtype, bf16_values) {
  cr_expect_eq(gs_f32_to_bf16(1.0f), 0x3f80);
  cr_expect_eq(gs_bf16_to_f32(0x3f80), 1.0f);
  cr_expect_eq(gs_f32_to_bf16(-2.0f), 0xc000);
  cr_expect_eq(gs_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80, "tie, even below");
  cr_expect_eq(gs_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82, "tie, even above");
  cr_expect_eq(gs_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
  cr_expect_eq(gs_bf16_to_f32(0x7f7f), fb(0x7f7f0000), "max finite");
  cr_expect_eq(gs_f32_to_bf16(fb(0x7f7f0000)), 0x7f7f);
  cr_expect_eq(gs_f32_to_bf16(fb(0x7f7f7fff)), 0x7f7f);
  cr_expect_eq(gs_f32_to_bf16(fb(0x7f7fffff)), 0x7f80, "FLT_MAX overflows to inf");
  cr_expect_eq(gs_f32_to_bf16(-INFINITY), 0xff80);
  cr_expect_eq(gs_f32_to_bf16(fb(0x00010000)), 0x0001, "smallest subnormal");
  cr_expect_eq(gs_f32_to_bf16(fb(0x00008000)), 0x0000, "half of it ties to zero");
  cr_expect_eq(gs_f32_to_bf16(fb(0x00018000)), 0x0002, "1.5 units ties to 2");
  cr_expect_eq(gs_f32_to_bf16(fb(0x00008001)), 0x0001);
  cr_expect_eq(gs_bf16_to_f32(0x0001), fb(0x00010000));
}

Test(dtype, bf16_nan) {
  uint16_t h = gs_f32_to_bf16(NAN);
  cr_expect((h & 0x7f80) == 0x7f80 && (h & 0x7f) != 0);
  h = gs_f32_to_bf16(fb(0x7f800001)); /* payload only in the dropped bits */
  cr_expect((h & 0x7f80) == 0x7f80 && (h & 0x7f) != 0, "got %04x", h);
  h = gs_f32_to_bf16(fb(0xffffffff));
  cr_expect(isnan(gs_bf16_to_f32(h)), "got %04x", h);
}

Test(dtype, bf16_every_pattern_round_trips) {
  for (uint32_t i = 0; i < 65536; i++) {
    uint16_t h = (uint16_t)i;
    float f = gs_bf16_to_f32(h);
    cr_assert_eq(bf(f) >> 16, h);
    if ((h & 0x7f80) == 0x7f80 && (h & 0x7f)) {
      cr_assert(isnan(gs_bf16_to_f32(gs_f32_to_bf16(f))));
      continue;
    }
    cr_assert_eq(gs_f32_to_bf16(f), h, "pattern %04x", h);
  }
}

Test(dtype, window_geometry) {
  /* SAME: ceil(in/stride), TensorFlow puts the odd pad at the end */
  cr_expect_eq(gs_window_out(7, 3, 2, true), 4);
  cr_expect_eq(gs_window_pad(7, 3, 2, true), 1);
  cr_expect_eq(gs_window_out(8, 4, 1, true), 8);
  cr_expect_eq(gs_window_pad(8, 4, 1, true), 1);
  cr_expect_eq(gs_window_out(6, 1, 2, true), 3);
  cr_expect_eq(gs_window_pad(6, 1, 2, true), 0);
  cr_expect_eq(gs_window_out(5, 5, 1, true), 5);
  cr_expect_eq(gs_window_pad(5, 5, 1, true), 2);
  cr_expect_eq(gs_window_out(28, 3, 1, true), 28);
  cr_expect_eq(gs_window_pad(28, 3, 1, true), 1);
  /* VALID: floor((in-k)/stride)+1, no padding, 0 when the window is larger */
  cr_expect_eq(gs_window_out(7, 3, 2, false), 3);
  cr_expect_eq(gs_window_out(28, 2, 2, false), 14);
  cr_expect_eq(gs_window_out(9, 2, 2, false), 4);
  cr_expect_eq(gs_window_out(4, 5, 1, false), 0);
  cr_expect_eq(gs_window_pad(7, 3, 2, false), 0);

  gs_conv_shape s = {.n = 2, .h = 9, .w = 7, .c = 3, .kh = 3, .kw = 5, .stride = 2,
                     .same = false, .f = 4};
  gs_conv_shape_init(&s);
  cr_expect_eq(s.oh, 4);
  cr_expect_eq(s.ow, 2);
  s.same = true;
  gs_conv_shape_init(&s);
  cr_expect_eq(s.oh, 5);
  cr_expect_eq(s.ow, 4);
}
