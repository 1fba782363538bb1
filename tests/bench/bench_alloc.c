/*
 * bench_alloc.c: what the vdev allocator costs a training job, next to
 * glibc's malloc/free measured in the same run on the same sequence.
 *
 * Two workloads:
 *  - mixed: a seeded sequence of alloc/free operations over 256 live slots
 *    (an occupied slot is freed, an empty one allocated) with sizes
 *    log-uniform from 256 B to 4 MiB, like the tensors of a training step;
 *  - step: one simulated training step of a 12-layer model, about 50
 *    allocations and frees of activation-, gradient- and workspace-sized
 *    blocks in the order the runtime makes them (forward, then backward in
 *    reverse), repeated.
 * The sequences are generated before the clock starts. Neither side touches
 * the blocks' bytes (the allocator never does: regions may be GPU memory),
 * so this measures bookkeeping only. The regions come from an mmap with
 * MAP_NORESERVE, as the CPU backend reserves them. It prints; it asserts
 * nothing about time.
 *
 *   bench_alloc [ops]      (default 1000000)
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

#include "runtime/alloc.h"

#define SLOTS 256
#define MiB ((size_t)1 << 20)

static int bench_reserve(gs_backend *b, int device_index, size_t bytes, void **region) {
  (void)b;
  (void)device_index;
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                 -1, 0);
  if (p == MAP_FAILED) return -ENOMEM;
  *region = p;
  return 0;
}

static void bench_release(gs_backend *b, int device_index, void *region, size_t bytes) {
  (void)b;
  (void)device_index;
  munmap(region, bytes);
}

static gs_backend bench_backend = {
    .name = "bench-mmap",
    .region_reserve = bench_reserve,
    .region_release = bench_release,
};

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static uint64_t rng(uint64_t *s) {
  uint64_t x = *s;
  x ^= x << 13, x ^= x >> 7, x ^= x << 17;
  return *s = x;
}

typedef struct op {
  uint32_t slot; /* which live slot the op works on */
  size_t bytes;  /* for an allocation; the free case ignores it */
} op;

/* ---- mixed sequence ---- */

static op *make_mixed(size_t n) {
  op *ops = malloc(n * sizeof *ops);
  if (!ops) return NULL;
  uint64_t s = 0x5eed5eedULL;
  for (size_t i = 0; i < n; i++) {
    uint64_t r = rng(&s);
    unsigned bits = 8 + (unsigned)(r % 14); /* 256 B .. 4 MiB */
    size_t lo = (size_t)1 << bits;
    ops[i].slot = (uint32_t)((r >> 8) % SLOTS);
    ops[i].bytes = lo + (size_t)((r >> 20) % lo);
    if (ops[i].bytes > 4 * MiB) ops[i].bytes = 4 * MiB;
  }
  return ops;
}

static double run_mixed_gs(gs_alloc *a, const op *ops, size_t n, size_t *failed) {
  void *live[SLOTS] = {0};
  gs_alloc_tag tag = {"bench", GS_ROLE_ACTIVATIONS};
  *failed = 0;
  double t0 = now_ns();
  for (size_t i = 0; i < n; i++) {
    void **p = &live[ops[i].slot];
    if (*p) {
      gs_alloc_free(a, *p);
      *p = NULL;
    } else if (gs_alloc_malloc(a, ops[i].bytes, &tag, p, NULL) != 0) {
      (*failed)++;
    }
  }
  double t = now_ns() - t0;
  for (int k = 0; k < SLOTS; k++) gs_alloc_free(a, live[k]);
  return t / (double)n;
}

static double run_mixed_libc(const op *ops, size_t n) {
  void *live[SLOTS] = {0};
  double t0 = now_ns();
  for (size_t i = 0; i < n; i++) {
    void **p = &live[ops[i].slot];
    if (*p) {
      free(*p);
      *p = NULL;
    } else {
      *p = malloc(ops[i].bytes);
    }
  }
  double t = now_ns() - t0;
  for (int k = 0; k < SLOTS; k++) free(live[k]);
  return t / (double)n;
}

/* ---- simulated training step ---- */

#define LAYERS 12
#define STEP_MAX_OPS 128

typedef struct step_op {
  int alloc;     /* 1: allocate into slot, 0: free slot */
  int slot;
  size_t bytes;
  gs_role role;
} step_op;

/* Forward: each layer allocates its output (saved for backward) and a
 * workspace it frees at once. Backward, last layer first: allocate the
 * input gradient and a workspace, free the workspace, the layer's saved
 * output and the gradient that came in. Sizes shrink with depth as in a
 * conv net on 32x32 images, batch 64, fp32. */
static int make_step(step_op *s) {
  int n = 0;
  size_t act[LAYERS + 1];
  act[0] = (size_t)64 * 32 * 32 * 3 * 4; /* the input batch */
  for (int l = 1; l <= LAYERS; l++) {
    size_t hw = (size_t)32 >> ((l - 1) / 3); /* halves every 3 layers */
    size_t c = (size_t)32 << ((l - 1) / 3);
    act[l] = 64 * hw * hw * c * 4;
  }
  s[n++] = (step_op){1, 0, act[0], GS_ROLE_BATCH};
  for (int l = 1; l <= LAYERS; l++) {
    s[n++] = (step_op){1, l, act[l], GS_ROLE_ACTIVATIONS};
    s[n++] = (step_op){1, 40, act[l] / 2 + 4096, GS_ROLE_WORKSPACE};
    s[n++] = (step_op){0, 40, 0, GS_ROLE_WORKSPACE};
  }
  s[n++] = (step_op){1, 20 + LAYERS, act[LAYERS], GS_ROLE_WORKSPACE}; /* dlogits */
  for (int l = LAYERS; l >= 1; l--) {
    s[n++] = (step_op){1, 20 + l - 1, act[l - 1], GS_ROLE_WORKSPACE}; /* din */
    s[n++] = (step_op){1, 40, act[l] / 4 + 256, GS_ROLE_WORKSPACE};
    s[n++] = (step_op){0, 40, 0, GS_ROLE_WORKSPACE};
    s[n++] = (step_op){0, l, 0, GS_ROLE_ACTIVATIONS};
    s[n++] = (step_op){0, 20 + l, 0, GS_ROLE_WORKSPACE};
  }
  s[n++] = (step_op){0, 20, 0, GS_ROLE_WORKSPACE};
  s[n++] = (step_op){0, 0, 0, GS_ROLE_BATCH};
  return n;
}

static double run_step_gs(gs_alloc *a, const step_op *s, int n, int steps, size_t *failed) {
  void *slot[64] = {0};
  *failed = 0;
  double t0 = now_ns();
  for (int it = 0; it < steps; it++) {
    for (int i = 0; i < n; i++) {
      if (s[i].alloc) {
        gs_alloc_tag tag = {"layer", s[i].role};
        if (gs_alloc_malloc(a, s[i].bytes, &tag, &slot[s[i].slot], NULL) != 0) (*failed)++;
      } else {
        gs_alloc_free(a, slot[s[i].slot]);
        slot[s[i].slot] = NULL;
      }
    }
  }
  return (now_ns() - t0) / (double)steps / 1e3;
}

static double run_step_libc(const step_op *s, int n, int steps) {
  void *slot[64] = {0};
  double t0 = now_ns();
  for (int it = 0; it < steps; it++) {
    for (int i = 0; i < n; i++) {
      if (s[i].alloc) {
        slot[s[i].slot] = malloc(s[i].bytes);
      } else {
        free(slot[s[i].slot]);
        slot[s[i].slot] = NULL;
      }
    }
  }
  return (now_ns() - t0) / (double)steps / 1e3;
}

int main(int argc, char **argv) {
  size_t n = argc > 1 ? strtoull(argv[1], NULL, 10) : 1000000;
  if (n == 0) {
    fprintf(stderr, "usage: bench_alloc [ops > 0]\n");
    return 2;
  }
  op *ops = make_mixed(n);
  if (!ops) {
    fprintf(stderr, "bench_alloc: no memory for %zu ops\n", n);
    return 1;
  }
  /* 256 slots of at most 4 MiB: 1 GiB can hold every live set */
  const uint64_t limit = (uint64_t)1 << 30;
  printf("mixed: %zu ops over %d slots, sizes 256 B..4 MiB, vdev limit 1 GiB\n", n, SLOTS);
  double libc = run_mixed_libc(ops, n);
  printf("  %-24s %8.1f ns/op\n", "malloc/free", libc);
  for (int pol = 0; pol < 2; pol++) {
    gs_alloc *a = NULL;
    if (gs_alloc_create(&bench_backend, 0, limit, (gs_alloc_policy)pol, &a) != 0) {
      fprintf(stderr, "bench_alloc: cannot create a 1 GiB allocator\n");
      free(ops);
      return 1;
    }
    size_t failed;
    double t = run_mixed_gs(a, ops, n, &failed);
    gs_alloc_stats st;
    gs_alloc_stats_get(a, &st);
    printf("  %-24s %8.1f ns/op  (%.2fx malloc; %zu failed; peak in use %.1f MiB, "
           "peak reserved %.1f MiB)\n",
           pol ? "gs_alloc GROWTH" : "gs_alloc PREALLOCATE", t, t / libc, failed,
           (double)st.peak_in_use / (double)MiB, (double)st.peak_reserved / (double)MiB);
    gs_alloc_destroy(a);
  }
  free(ops);

  step_op s[STEP_MAX_OPS];
  int ns = make_step(s);
  const int steps = 20000;
  printf("step: %d allocs/frees per simulated step (12 layers), %d steps\n", ns, steps);
  double lstep = run_step_libc(s, ns, steps);
  printf("  %-24s %8.2f us/step\n", "malloc/free", lstep);
  gs_alloc *a = NULL;
  if (gs_alloc_create(&bench_backend, 0, limit, GS_POLICY_PREALLOCATE, &a) != 0) return 1;
  size_t failed;
  double gstep = run_step_gs(a, s, ns, steps, &failed);
  gs_alloc_stats st;
  gs_alloc_stats_get(a, &st);
  printf("  %-24s %8.2f us/step  (%.2fx malloc; %zu failed; peak in use %.1f MiB)\n",
         "gs_alloc PREALLOCATE", gstep, gstep / lstep, failed,
         (double)st.peak_in_use / (double)MiB);
  gs_alloc_destroy(a);
  return 0;
}
