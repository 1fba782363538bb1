/*
 * fpenv.h: the floating-point mode gpushare's CPU training runs in.
 *
 * Training drives values toward zero: once a job has learned its data,
 * gradients, Adam's moments and many activations become fp32 subnormals,
 * and x86 cores take a microcode assist for each operation on one, which
 * slows a step more and more as the job's loss falls. GPUs flush these in their fast paths, and PyTorch's
 * set_flush_denormal does the same on CPUs. So the job thread (gs_train
 * around each batch of steps) and the cpu backend's pool workers run with
 * flush-to-zero and denormals-are-zero set; conversions between the storage
 * types are bit operations (dtype.c, F16C) and keep fp16 subnormals.
 * Header-only: the kernels and the runtime both use it.
 */
#ifndef GS_KERNELS_FPENV_H
#define GS_KERNELS_FPENV_H

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#define GS_FPENV_FLUSH 0x8040u /* MXCSR: FTZ (bit 15) | DAZ (bit 6) */
typedef unsigned int gs_fpenv;
static inline gs_fpenv gs_fpenv_flush_denormals(void) {
  gs_fpenv old = _mm_getcsr();
  _mm_setcsr(old | GS_FPENV_FLUSH);
  return old;
}
static inline void gs_fpenv_restore(gs_fpenv old) { _mm_setcsr(old); }
#elif defined(__aarch64__)
typedef unsigned long gs_fpenv;
static inline gs_fpenv gs_fpenv_flush_denormals(void) {
  gs_fpenv old;
  __asm__ volatile("mrs %0, fpcr" : "=r"(old));
  __asm__ volatile("msr fpcr, %0" ::"r"(old | (1ul << 24))); /* FZ */
  return old;
}
static inline void gs_fpenv_restore(gs_fpenv old) { __asm__ volatile("msr fpcr, %0" ::"r"(old)); }
#else
typedef int gs_fpenv; /* elsewhere: IEEE subnormals, only slower */
static inline gs_fpenv gs_fpenv_flush_denormals(void) { return 0; }
static inline void gs_fpenv_restore(gs_fpenv old) { (void)old; }
#endif

#endif
