/*
 * cpu_convert.c: array conversions between the storage types and fp32.
 *
 * Mixed-precision ops convert every 16-bit tensor on load and round every
 * result on store, so these loops run over each activation and weight of a
 * step. fp16 goes through F16C (vcvtph2ps / vcvtps2ph, round to nearest
 * even) where the CPU has it, chosen once at run time, else through the
 * scalar reference of dtype.c; both give the same bits, which
 * test_kernels checks over random patterns. bf16 is a shift (load) and an
 * add-and-shift (store) that the compiler vectorises.
 */
#include <string.h>

#include "kernels/cpu/cpu_internal.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define GS_CPU_X86 1

__attribute__((target("avx,f16c"))) static void f16_load_f16c(const uint16_t *s, float *d,
                                                               size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
  for (; i < n; i++)
    d[i] = gs_f16_to_f32(s[i]);
}

__attribute__((target("avx,f16c"))) static void f16_store_f16c(uint16_t *d, const float *s,
                                                                size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128((__m128i *)(d + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; i++)
    d[i] = gs_f32_to_f16(s[i]);
}

/* F16C through CPUID leaf 1 (ECX bit 29): clang 14's __builtin_cpu_supports
 * does not know "f16c". AVX also needs the OS to save the YMM state
 * (OSXSAVE and XCR0), which __builtin_cpu_supports("avx") checks. */
static int cpu_has_f16c(void) {
  static int have = -1; /* races only to write the same value */
  if (have < 0) {
    unsigned a, b, c, d;
    __builtin_cpu_init();
    have = __builtin_cpu_supports("avx") && __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
  }
  return have;
}
#endif

static void bf16_load(const uint16_t *s, float *d, size_t n) {
  for (size_t i = 0; i < n; i++) {
    uint32_t x = (uint32_t)s[i] << 16;
    memcpy(d + i, &x, 4);
  }
}

static void bf16_store(uint16_t *d, const float *s, size_t n) {
  for (size_t i = 0; i < n; i++) {
    uint32_t x;
    memcpy(&x, s + i, 4);
    uint32_t r = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    uint32_t q = (x >> 16) | 0x40u;
    d[i] = (uint16_t)((x & 0x7fffffffu) > 0x7f800000u ? q : r);
  }
}

void gs_cpu_load_f32(gs_dtype dt, const void *src, float *dst, size_t count) {
  switch (dt) {
  case GS_F32:
    if (dst != src)
      memcpy(dst, src, count * 4);
    return;
  case GS_F16:
#ifdef GS_CPU_X86
    if (cpu_has_f16c()) {
      f16_load_f16c(src, dst, count);
      return;
    }
#endif
    for (size_t i = 0; i < count; i++)
      dst[i] = gs_f16_to_f32(((const uint16_t *)src)[i]);
    return;
  case GS_BF16:
    bf16_load(src, dst, count);
    return;
  }
}

void gs_cpu_store_f32(gs_dtype dt, void *dst, const float *src, size_t count) {
  switch (dt) {
  case GS_F32:
    if (dst != src)
      memcpy(dst, src, count * 4);
    return;
  case GS_F16:
#ifdef GS_CPU_X86
    if (cpu_has_f16c()) {
      f16_store_f16c(dst, src, count);
      return;
    }
#endif
    for (size_t i = 0; i < count; i++)
      ((uint16_t *)dst)[i] = gs_f32_to_f16(src[i]);
    return;
  case GS_BF16:
    bf16_store(dst, src, count);
    return;
  }
}

/* Elements per part below which a conversion stays on the job's thread. */
#define GS_CPU_CONVERT_GRAIN ((size_t)1 << 16)

struct convert_job {
  gs_dtype dt;
  const void *src;
  void *dst;
};

static void load_part(void *ctx, size_t lo, size_t hi) {
  const struct convert_job *j = ctx;
  gs_cpu_load_f32(j->dt, gs_cpu_at(j->dt, j->src, lo), (float *)j->dst + lo, hi - lo);
}

static void store_part(void *ctx, size_t lo, size_t hi) {
  const struct convert_job *j = ctx;
  gs_cpu_store_f32(j->dt, gs_cpu_at_mut(j->dt, j->dst, lo), (const float *)j->src + lo, hi - lo);
}

void gs_cpu_load_f32_par(gs_exec *ex, gs_dtype dt, const void *src, float *dst, size_t count) {
  struct convert_job j = {.dt = dt, .src = src, .dst = dst};
  gs_cpu_parallel(ex, count, GS_CPU_CONVERT_GRAIN, load_part, &j);
}

void gs_cpu_store_f32_par(gs_exec *ex, gs_dtype dt, void *dst, const float *src, size_t count) {
  struct convert_job j = {.dt = dt, .src = src, .dst = dst};
  gs_cpu_parallel(ex, count, GS_CPU_CONVERT_GRAIN, store_part, &j);
}
