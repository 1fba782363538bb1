/*
 * cpu_isa.c: which instruction-set level the cpu backend's own loops run
 * at (cpu_internal.h, GS_CPU_RANGE).
 *
 * The level is the highest this CPU has (CPUID, and the OS saving the
 * vector state, which __builtin_cpu_supports checks), lowered by the
 * environment variable GS_CPU_ISA where it names a lower level: a host
 * with AVX-512 can run, and test, its AVX2 and baseline paths too. The
 * answer is settled once, on first use, and only a test changes it after
 * (gs_cpu_isa_set). A GS_CPU_ISA that names no level, or one above what
 * the CPU has, leaves the highest in use; gs_cpu_isa_status says why, for
 * gpushare-run and the executor to report.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_internal.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

static const char *const isa_names[GS_CPU_ISA_LEVELS] = {"baseline", "avx2", "avx512",
                                                         "avx512bf16"};

static int isa_max = GS_CPU_ISA_BASELINE;  /* the CPU's highest, set once */
static _Atomic int isa_use = -1;           /* the level in use, -1: not yet read */
static char isa_why[160];                  /* what was wrong with GS_CPU_ISA, or "" */
static pthread_once_t isa_once = PTHREAD_ONCE_INIT;

static int detect(void) {
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
  unsigned a, b, c, d;
  __builtin_cpu_init();
  /* F16C: CPUID leaf 1, ECX bit 29 (clang 14's __builtin_cpu_supports does
   * not know "f16c") */
  bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
  if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c))
    return GS_CPU_ISA_BASELINE;
  if (!(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")))
    return GS_CPU_ISA_AVX2;
  /* AVX512-BF16: CPUID leaf 7 sub-leaf 1, EAX bit 5 */
  if (__get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 5)))
    return GS_CPU_ISA_AVX512BF16;
  return GS_CPU_ISA_AVX512;
#else
  return GS_CPU_ISA_BASELINE;
#endif
}

static void isa_init(void) {
  isa_max = detect();
  int use = isa_max;
  const char *env = getenv("GS_CPU_ISA");
  if (env && *env) {
    int want = -1;
    for (int l = 0; l < GS_CPU_ISA_LEVELS; l++)
      if (!strcmp(env, isa_names[l]))
        want = l;
    if (want < 0)
      snprintf(isa_why, sizeof isa_why,
               "GS_CPU_ISA: invalid value \"%.40s\": one of baseline, avx2, avx512, avx512bf16",
               env);
    else if (want > isa_max)
      snprintf(isa_why, sizeof isa_why,
               "GS_CPU_ISA: \"%s\" is more than this CPU has (at most %s)", env,
               isa_names[isa_max]);
    else
      use = want;
  }
  atomic_store_explicit(&isa_use, use, memory_order_release);
}

int gs_cpu_isa(void) {
  int l = atomic_load_explicit(&isa_use, memory_order_acquire);
  if (l >= 0)
    return l;
  pthread_once(&isa_once, isa_init);
  return atomic_load_explicit(&isa_use, memory_order_relaxed);
}

int gs_cpu_isa_max(void) {
  pthread_once(&isa_once, isa_init);
  return isa_max;
}

const char *gs_cpu_isa_name(int level) {
  return level >= 0 && level < GS_CPU_ISA_LEVELS ? isa_names[level] : "unknown";
}

int gs_cpu_isa_set(int level) {
  if (level < 0 || level > gs_cpu_isa_max())
    return -EINVAL;
  atomic_store_explicit(&isa_use, level, memory_order_relaxed);
  return 0;
}

int gs_cpu_isa_status(const char **name, char *why, size_t why_len) {
  pthread_once(&isa_once, isa_init); /* isa_why is written there */
  int l = gs_cpu_isa();
  if (name)
    *name = isa_names[l];
  if (why && why_len)
    snprintf(why, why_len, "%s", isa_why);
  return isa_why[0] ? -EINVAL : 0;
}
