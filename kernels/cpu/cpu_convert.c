/*
 * cpu_convert.c: array conversions between the storage types and fp32.
 *
 * Mixed-precision ops convert every 16-bit tensor on load and round every
 * result on store, so these loops run over each activation and weight of a
 * step. fp16 goes through F16C (vcvtph2ps / vcvtps2ph, round to nearest
 * even), 8 at a time at the AVX2 level and 16 at the AVX-512 one
 * (gs_cpu_isa), else through the scalar reference of dtype.c; all give
 * the same bits, which test_kernels and test_kernels_isa check over random
 * patterns. bf16 is a shift (load) and an add-and-shift (store) that the
 * compiler vectorises, once per level.
 */
#include <string.h>

#include "kernels/cpu/cpu_internal.h"

#if GS_CPU_X86_TARGETS
#include <immintrin.h>

GS_CPU_TARGET_AVX2 static void f16_load_avx2(const uint16_t *s, float *d, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
  for (; i < n; i++)
    d[i] = gs_f16_to_f32(s[i]);
}

GS_CPU_TARGET_AVX2 static void f16_store_avx2(uint16_t *d, const float *s, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128((__m128i *)(d + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; i++)
    d[i] = gs_f32_to_f16(s[i]);
}

/* 16 at a time, and the tail under a mask rather than one by one */
GS_CPU_TARGET_AVX512 static void f16_load_avx512(const uint16_t *s, float *d, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(d + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + i))));
  if (i < n) {
    __mmask16 k = (__mmask16)((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(d + i, k, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, s + i)));
  }
}

GS_CPU_TARGET_AVX512 static void f16_store_avx512(uint16_t *d, const float *s, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256((__m256i *)(d + i),
                        _mm512_cvtps_ph(_mm512_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
  if (i < n) {
    __mmask16 k = (__mmask16)((1u << (n - i)) - 1);
    _mm256_mask_storeu_epi16(d + i, k,
                             _mm512_cvtps_ph(_mm512_maskz_loadu_ps(k, s + i),
                                             _MM_FROUND_TO_NEAREST_INT));
  }
}
#endif

/* bf16 as integer arithmetic, which every clone vectorises to the same
 * bits (the AVX512-BF16 vcvtneps2bf16 would flush denormals to zero) */
static inline __attribute__((always_inline)) void bf16_load(const uint16_t *s, float *d,
                                                             size_t n) {
  for (size_t i = 0; i < n; i++) {
    uint32_t x = (uint32_t)s[i] << 16;
    memcpy(d + i, &x, 4);
  }
}

static inline __attribute__((always_inline)) void bf16_store(uint16_t *d, const float *s,
                                                              size_t n) {
  for (size_t i = 0; i < n; i++) {
    uint32_t x;
    memcpy(&x, s + i, 4);
    uint32_t r = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    uint32_t q = (x >> 16) | 0x40u;
    d[i] = (uint16_t)((x & 0x7fffffffu) > 0x7f800000u ? q : r);
  }
}

static void bf16_load_base(const uint16_t *s, float *d, size_t n) { bf16_load(s, d, n); }
static void bf16_store_base(uint16_t *d, const float *s, size_t n) { bf16_store(d, s, n); }
GS_CPU_TARGET_AVX2 static void bf16_load_avx2(const uint16_t *s, float *d, size_t n) {
  bf16_load(s, d, n);
}
GS_CPU_TARGET_AVX2 static void bf16_store_avx2(uint16_t *d, const float *s, size_t n) {
  bf16_store(d, s, n);
}
GS_CPU_TARGET_AVX512 static void bf16_load_avx512(const uint16_t *s, float *d, size_t n) {
  bf16_load(s, d, n);
}
GS_CPU_TARGET_AVX512 static void bf16_store_avx512(uint16_t *d, const float *s, size_t n) {
  bf16_store(d, s, n);
}

static void f16_load_base(const uint16_t *s, float *d, size_t n) {
  for (size_t i = 0; i < n; i++)
    d[i] = gs_f16_to_f32(s[i]);
}
static void f16_store_base(uint16_t *d, const float *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    d[i] = gs_f32_to_f16(s[i]);
}

typedef void (*load_fn)(const uint16_t *, float *, size_t);
typedef void (*store_fn)(uint16_t *, const float *, size_t);
#if GS_CPU_X86_TARGETS
static const load_fn f16_loads[3] = {f16_load_base, f16_load_avx2, f16_load_avx512};
static const store_fn f16_stores[3] = {f16_store_base, f16_store_avx2, f16_store_avx512};
#else
static const load_fn f16_loads[3] = {f16_load_base, f16_load_base, f16_load_base};
static const store_fn f16_stores[3] = {f16_store_base, f16_store_base, f16_store_base};
#endif
static const load_fn bf16_loads[3] = {bf16_load_base, bf16_load_avx2, bf16_load_avx512};
static const store_fn bf16_stores[3] = {bf16_store_base, bf16_store_avx2, bf16_store_avx512};

void gs_cpu_load_f32(gs_dtype dt, const void *src, float *dst, size_t count) {
  switch (dt) {
  case GS_F32:
    if (dst != src)
      memcpy(dst, src, count * 4);
    return;
  case GS_F16:
    f16_loads[gs_cpu_clone()](src, dst, count);
    return;
  case GS_BF16:
    bf16_loads[gs_cpu_clone()](src, dst, count);
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
    f16_stores[gs_cpu_clone()](dst, src, count);
    return;
  case GS_BF16:
    bf16_stores[gs_cpu_clone()](dst, src, count);
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
