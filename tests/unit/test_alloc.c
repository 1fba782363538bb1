/*
 * test_alloc.c: the vdev allocator against a fake device.
 *
 * The fake backend hands out host memory (posix_memalign) as regions, with a
 * configurable physical capacity so a test can make the "device" run out,
 * and records every reservation, so the tests can check what the allocator
 * promises a vdev's tenant: it never reserves past the limit, every block is
 * 256-byte aligned and inside a region, live blocks never overlap, freed
 * neighbours coalesce, GROWTH regions double, the stats are exact, and an
 * OOM names the right cause (quota, physical, fragmentation).
 *
 * The randomized tests replay seeded alloc/free sequences (a few long ones,
 * and 2000 short ones on vdevs of assorted limits) and compare the
 * allocator with a simple model (a list of live blocks): the
 * model's sums must equal the stats, and since freed neighbours always
 * merge, the largest gap between live blocks in a region must equal the
 * allocator's largest free block.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/alloc.h"

#define MiB ((size_t)1 << 20)
#define KiB ((size_t)1 << 10)
#define FAKE_MAX_REGIONS 4096

typedef struct fake_region {
  void *p;
  size_t n;
} fake_region;

typedef struct fake_dev {
  size_t cap;           /* physical bytes the fake device has */
  size_t reserved;      /* bytes now handed out */
  size_t reserve_calls; /* every region_reserve, failed ones too */
  size_t refused;       /* region_reserve calls that failed */
  size_t sizes[FAKE_MAX_REGIONS]; /* sizes of successful reservations, in order */
  size_t nsizes;
  fake_region live[FAKE_MAX_REGIONS]; /* regions now handed out */
  size_t nlive;
} fake_dev;

static int fake_device_memory(gs_backend *b, int device_index, uint64_t *total,
                              uint64_t *free_bytes) {
  fake_dev *d = b->impl;
  (void)device_index;
  *total = d->cap;
  *free_bytes = d->cap - d->reserved;
  return 0;
}

static int fake_reserve(gs_backend *b, int device_index, size_t bytes, void **region) {
  fake_dev *d = b->impl;
  cr_assert_eq(device_index, 3, "the allocator passes its device index through");
  d->reserve_calls++;
  cr_assert(bytes > 0 && bytes % GS_ALLOC_ALIGN == 0, "region of %zu bytes", bytes);
  if (bytes > d->cap - d->reserved || d->nlive == FAKE_MAX_REGIONS) {
    d->refused++;
    return -ENOMEM;
  }
  void *p = NULL;
  if (posix_memalign(&p, 4096, bytes) != 0) { /* page-aligned, as mmap gives */
    d->refused++;
    return -ENOMEM;
  }
  d->reserved += bytes;
  if (d->nsizes < FAKE_MAX_REGIONS) d->sizes[d->nsizes++] = bytes;
  d->live[d->nlive++] = (fake_region){p, bytes};
  *region = p;
  return 0;
}

static void fake_release(gs_backend *b, int device_index, void *region, size_t bytes) {
  fake_dev *d = b->impl;
  cr_assert_eq(device_index, 3);
  for (size_t i = 0; i < d->nlive; i++) {
    if (d->live[i].p == region) {
      cr_assert_eq(d->live[i].n, bytes, "region released with its reserved size");
      d->live[i] = d->live[--d->nlive];
      d->reserved -= bytes;
      free(region);
      return;
    }
  }
  cr_assert_fail("release of %p, which the fake device never handed out", region);
}

static fake_dev *dev;
static gs_backend backend;

static void fake_init(size_t cap) {
  dev = calloc(1, sizeof *dev);
  cr_assert_not_null(dev);
  dev->cap = cap;
  memset(&backend, 0, sizeof backend);
  backend.name = "fake";
  backend.impl = dev;
  backend.device_memory = fake_device_memory;
  backend.region_reserve = fake_reserve;
  backend.region_release = fake_release;
}

static void fake_fini(void) {
  cr_assert_eq(dev->nlive, 0, "every region went back to the device (%zu left)", dev->nlive);
  cr_assert_eq(dev->reserved, 0);
  free(dev);
  dev = NULL;
}

static gs_alloc *make(uint64_t limit, gs_alloc_policy policy) {
  gs_alloc *a = NULL;
  cr_assert_eq(gs_alloc_create(&backend, 3, limit, policy, &a), 0);
  cr_assert_not_null(a);
  return a;
}

static void *must_alloc(gs_alloc *a, size_t bytes) {
  void *p = NULL;
  gs_alloc_failure why;
  gs_alloc_tag tag = {"test", GS_ROLE_WORKSPACE};
  int rc = gs_alloc_malloc(a, bytes, &tag, &p, &why);
  cr_assert_eq(rc, 0, "malloc(%zu) failed, cause %d", bytes, (int)why.cause);
  cr_assert_not_null(p);
  return p;
}

static bool in_some_region(const void *p, size_t n) {
  uintptr_t x = (uintptr_t)p;
  for (size_t i = 0; i < dev->nlive; i++) {
    uintptr_t b = (uintptr_t)dev->live[i].p;
    if (x >= b && x + n <= b + dev->live[i].n) return true;
  }
  return false;
}

static gs_alloc_stats stats_of(gs_alloc *a) {
  gs_alloc_stats st;
  memset(&st, 0xa5, sizeof st);
  gs_alloc_stats_get(a, &st);
  return st;
}

/* ---- basics ---- */

Test(alloc, block_size_rounds_to_alignment) {
  cr_assert_eq(gs_alloc_block_size(0), 256);
  cr_assert_eq(gs_alloc_block_size(1), 256);
  cr_assert_eq(gs_alloc_block_size(255), 256);
  cr_assert_eq(gs_alloc_block_size(256), 256);
  cr_assert_eq(gs_alloc_block_size(257), 512);
  cr_assert_eq(gs_alloc_block_size(1000), 1024);
  cr_assert_eq(gs_alloc_block_size(MiB + 1), MiB + 256);
  cr_assert_eq(gs_alloc_block_size(SIZE_MAX), 0, "not representable");
}

Test(alloc, role_names) {
  const char *want[] = {"weights", "master", "gradients", "optimizer",
                        "activations", "workspace", "batch"};
  for (int r = 0; r < GS_ROLE_COUNT; r++) cr_assert_str_eq(gs_role_name((gs_role)r), want[r]);
  cr_assert_str_eq(gs_role_name(GS_ROLE_COUNT), "unknown");
}

Test(alloc, create_rejects_bad_arguments) {
  fake_init(SIZE_MAX);
  gs_alloc *a = (gs_alloc *)&a;
  cr_assert_eq(gs_alloc_create(&backend, 3, 0, GS_POLICY_GROWTH, &a), -EINVAL);
  cr_assert_null(a);
  cr_assert_eq(gs_alloc_create(&backend, 3, 255, GS_POLICY_PREALLOCATE, &a), -EINVAL);
  cr_assert_eq(gs_alloc_create(&backend, 3, MiB, (gs_alloc_policy)7, &a), -EINVAL);
  cr_assert_eq(gs_alloc_create(NULL, 3, MiB, GS_POLICY_GROWTH, &a), -EINVAL);
  cr_assert_eq(dev->reserve_calls, 0);
  fake_fini();
}

Test(alloc, split_coalesce_and_best_fit) {
  fake_init(SIZE_MAX);
  gs_alloc *a = make(MiB, GS_POLICY_PREALLOCATE);
  gs_alloc_stats st = stats_of(a);
  cr_assert_eq(st.reserved, MiB);
  cr_assert_eq(st.largest_free, MiB);
  cr_assert_eq(st.fragmentation, 0.0);

  char *A = must_alloc(a, 1000), *B = must_alloc(a, 3000), *C = must_alloc(a, 1);
  cr_assert_eq((uintptr_t)A % 256, 0);
  cr_assert_eq(B, A + 1024, "split hands out the low part; A was charged 1024");
  cr_assert_eq(C, B + 3072);
  st = stats_of(a);
  size_t used = 1024 + 3072 + 256;
  cr_assert_eq(st.in_use, used);
  cr_assert_eq(st.live_blocks, 3);
  cr_assert_eq(st.largest_free, MiB - used);
  cr_assert_eq(st.total_free, MiB - used);

  gs_alloc_free(a, B);
  st = stats_of(a);
  cr_assert_eq(st.in_use, 1024 + 256);
  cr_assert_eq(st.largest_free, MiB - used, "B's hole is smaller than the tail");
  cr_assert_eq(st.total_free, MiB - used + 3072);
  cr_assert_float_eq(st.fragmentation, 1.0 - (double)(MiB - used) / (double)(MiB - used + 3072),
                     1e-12);

  gs_alloc_free(a, A); /* A merges with B's hole into one 4096-byte block */
  char *D = must_alloc(a, 4096);
  cr_assert_eq(D, A, "best fit takes the exact 4096-byte hole, not the tail");
  char *E = must_alloc(a, 3000);
  cr_assert_neq(E, A + 1024, "no hole is left at A: E comes from the tail");
  cr_assert_eq(E, C + 256);
  gs_alloc_free(a, D);
  gs_alloc_free(a, E);
  gs_alloc_free(a, C); /* C joins the hole on its left and the tail on its right */
  st = stats_of(a);
  cr_assert_eq(st.in_use, 0);
  cr_assert_eq(st.live_blocks, 0);
  cr_assert_eq(st.largest_free, MiB, "one free block spans the region again");
  cr_assert_eq(st.fragmentation, 0.0);
  cr_assert_eq(st.allocations, 5);
  cr_assert_eq(st.frees, 5);
  cr_assert_eq(st.peak_in_use, 4096 + 256 + 3072);
  gs_alloc_free(a, NULL);
  gs_alloc_destroy(a);
  fake_fini();
}

Test(alloc, every_block_aligned_and_inside_a_region) {
  fake_init(SIZE_MAX);
  gs_alloc *a = make(64 * MiB, GS_POLICY_GROWTH);
  void *ps[300];
  uint64_t x = 88172645463325252ull;
  for (int i = 0; i < 300; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    size_t n = 1 + (size_t)(x % (64 * KiB));
    ps[i] = must_alloc(a, n);
    cr_assert_eq((uintptr_t)ps[i] % GS_ALLOC_ALIGN, 0, "%p for %zu bytes", ps[i], n);
    cr_assert(in_some_region(ps[i], gs_alloc_block_size(n)));
    memset(ps[i], i & 0xff, n); /* host memory here: ASan checks the bounds */
  }
  for (int i = 0; i < 300; i += 2) gs_alloc_free(a, ps[i]);
  for (int i = 1; i < 300; i += 2) gs_alloc_free(a, ps[i]);
  gs_alloc_trim(a);
  cr_assert_eq(stats_of(a).reserved, 0);
  gs_alloc_destroy(a);
  fake_fini();
}

/* ---- randomized, against a model ---- */

typedef struct live_blk {
  char *p;
  size_t req;     /* bytes asked for */
  size_t charged; /* gs_alloc_block_size(req) */
  uint64_t stamp; /* written at both ends of the block */
} live_blk;

static int cmp_live(const void *x, const void *y) {
  const live_blk *a = x, *b = y;
  return a->p < b->p ? -1 : a->p > b->p;
}

static int cmp_region(const void *x, const void *y) {
  const fake_region *a = x, *b = y;
  return (char *)a->p < (char *)b->p ? -1 : (char *)a->p > (char *)b->p;
}

static uint64_t rng_next(uint64_t *s) {
  uint64_t x = *s;
  x ^= x << 13, x ^= x >> 7, x ^= x << 17;
  return *s = x;
}

/* Sizes like a training step's tensors: mostly small, some up to max. */
static size_t rng_size(uint64_t *s, size_t max) {
  uint64_t r = rng_next(s);
  switch (r % 4) {
  case 0: return 1 + (size_t)((r >> 8) % 512);                 /* biases, scalars */
  case 1: return 1 + (size_t)((r >> 8) % (64 * KiB));
  default: {
    unsigned bits = 8 + (unsigned)((r >> 8) % 14);             /* log-uniform 256 B.. */
    size_t n = ((size_t)1 << bits) + (size_t)((r >> 24) % ((size_t)1 << bits));
    return n > max ? max : n;
  }
  }
}

static void check_layout(gs_alloc *a, live_blk *live, size_t n) {
  static live_blk sorted[1024];
  memcpy(sorted, live, n * sizeof *live);
  qsort(sorted, n, sizeof *sorted, cmp_live);
  for (size_t i = 0; i + 1 < n; i++)
    cr_assert(sorted[i].p + sorted[i].charged <= sorted[i + 1].p,
              "blocks %p (+%zu) and %p overlap", sorted[i].p, sorted[i].charged,
              sorted[i + 1].p);
  /* Free space is what lies between live blocks in each region. Freed
   * neighbours always merge, so each gap is exactly one free block. */
  fake_region regs[FAKE_MAX_REGIONS];
  memcpy(regs, dev->live, dev->nlive * sizeof *regs);
  qsort(regs, dev->nlive, sizeof *regs, cmp_region);
  uint64_t largest = 0, total = 0;
  size_t j = 0;
  for (size_t r = 0; r < dev->nlive; r++) {
    char *cur = regs[r].p, *end = cur + regs[r].n;
    for (; j < n && sorted[j].p < end; j++) {
      cr_assert(sorted[j].p >= cur && sorted[j].p + sorted[j].charged <= end,
                "block %p lies inside a region", sorted[j].p);
      uint64_t gap = (uint64_t)(sorted[j].p - cur);
      total += gap;
      if (gap > largest) largest = gap;
      cur = sorted[j].p + sorted[j].charged;
    }
    uint64_t gap = (uint64_t)(end - cur);
    total += gap;
    if (gap > largest) largest = gap;
  }
  cr_assert_eq(j, n, "every live block lies in a region the device handed out");
  gs_alloc_stats st = stats_of(a);
  cr_assert_eq(st.total_free, total);
  cr_assert_eq(st.largest_free, largest, "largest free %llu, model's largest gap %llu",
               (unsigned long long)st.largest_free, (unsigned long long)largest);
}

static uint64_t last_quota, last_frag; /* failures seen by the last run */

static void run_random(gs_alloc_policy policy, uint64_t seed, size_t limit, int ops) {
  fake_init(SIZE_MAX);
  gs_alloc *a = make(limit, policy);
  static live_blk live[1024];
  size_t n = 0;
  uint64_t in_use = 0, allocs = 0, frees = 0, quota = 0, frag = 0;
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int op = 0; op < ops; op++) {
    uint64_t r = rng_next(&s) % 100;
    if (policy == GS_POLICY_GROWTH && r == 99) {
      gs_alloc_trim(a);
    } else if (n == 0 || (n < 1024 && r < 55)) {
      size_t req = rng_size(&s, limit / 4);
      size_t charged = gs_alloc_block_size(req);
      void *p = NULL;
      gs_alloc_failure why;
      gs_alloc_tag tag = {"layer", (gs_role)(op % GS_ROLE_COUNT)};
      int rc = gs_alloc_malloc(a, req, &tag, &p, &why);
      if (rc == 0) {
        cr_assert_eq((uintptr_t)p % GS_ALLOC_ALIGN, 0);
        cr_assert(in_some_region(p, charged), "%p (+%zu) inside a region", p, charged);
        live_blk *l = &live[n++];
        *l = (live_blk){p, req, charged, rng_next(&s)};
        memcpy(l->p, &l->stamp, 8);
        memcpy(l->p + charged - 8, &l->stamp, 8);
        in_use += charged;
        allocs++;
      } else {
        cr_assert_eq(rc, -ENOMEM);
        cr_assert_null(p);
        cr_assert_eq(why.requested, charged);
        cr_assert_eq(why.stats.in_use, in_use);
        /* No physical cap here: only the limit or scattering can refuse. */
        if ((limit & ~(size_t)255) - in_use < charged) {
          cr_assert_eq(why.cause, GS_OOM_QUOTA);
          quota++;
        } else {
          cr_assert_eq(why.cause, GS_OOM_FRAGMENTATION, "cause %d for %zu bytes",
                       (int)why.cause, charged);
          cr_assert(why.stats.largest_free < charged);
          frag++;
        }
      }
    } else {
      size_t i = (size_t)(rng_next(&s) % n);
      live_blk l = live[i];
      uint64_t head, tail;
      memcpy(&head, l.p, 8);
      memcpy(&tail, l.p + l.charged - 8, 8);
      cr_assert(head == l.stamp && tail == l.stamp, "block %p was overwritten", l.p);
      gs_alloc_free(a, l.p);
      live[i] = live[--n];
      in_use -= l.charged;
      frees++;
    }
    gs_alloc_stats st = stats_of(a);
    cr_assert_eq(st.in_use, in_use);
    cr_assert_eq(st.live_blocks, n);
    cr_assert_eq(st.allocations, allocs);
    cr_assert_eq(st.frees, frees);
    cr_assert_eq(st.reserved, dev->reserved, "reserved is what the device handed out");
    cr_assert_leq(st.reserved, limit, "never past the limit");
    cr_assert_leq(st.in_use, st.reserved);
    cr_assert_leq(st.peak_reserved, limit);
    cr_assert_geq(st.peak_in_use, st.in_use);
    cr_assert_eq(st.total_free, st.reserved - st.in_use);
    cr_assert_leq(st.largest_free, st.total_free);
    double f = st.total_free ? 1.0 - (double)st.largest_free / (double)st.total_free : 0.0;
    cr_assert_float_eq(st.fragmentation, f, 1e-12);
    if (op % 16 == 0) check_layout(a, live, n);
  }
  cr_assert_gt(allocs, (uint64_t)ops / 3, "the sequence mostly succeeds");
  last_quota = quota;
  last_frag = frag;
  while (n > 0) {
    size_t i = (size_t)(rng_next(&s) % n);
    gs_alloc_free(a, live[i].p);
    live[i] = live[--n];
  }
  gs_alloc_stats st = stats_of(a);
  cr_assert_eq(st.in_use, 0);
  cr_assert_eq(st.live_blocks, 0);
  if (policy == GS_POLICY_PREALLOCATE) {
    cr_assert_eq(dev->nlive, 1);
    cr_assert_eq(st.reserved, limit & ~(size_t)255);
    cr_assert_eq(st.largest_free, st.reserved, "one free block spans the region");
    cr_assert_eq(st.fragmentation, 0.0);
  } else {
    gs_alloc_trim(a);
    st = stats_of(a);
    cr_assert_eq(st.reserved, 0);
    cr_assert_eq(dev->reserved, 0);
    cr_assert_eq(st.largest_free, 0);
  }
  gs_alloc_destroy(a);
  fake_fini();
}

Test(alloc, random_preallocate) {
  for (uint64_t seed = 1; seed <= 4; seed++) run_random(GS_POLICY_PREALLOCATE, seed, 24 * MiB + 100, 5000);
}

Test(alloc, random_growth) {
  for (uint64_t seed = 11; seed <= 14; seed++) run_random(GS_POLICY_GROWTH, seed, 24 * MiB + 100, 5000);
}

Test(alloc, random_tight_limit_hits_quota_and_fragmentation) {
  /* A small vdev under the same traffic fails often; each failure must
   * carry the cause the model predicts (checked inside run_random). */
  run_random(GS_POLICY_PREALLOCATE, 21, 3 * MiB, 4000);
  cr_assert_gt(last_quota, 0, "a 3 MiB vdev under this traffic reaches its quota");
  run_random(GS_POLICY_GROWTH, 22, 3 * MiB, 4000);
  cr_assert_gt(last_quota, 0);
}

Test(alloc, random_thousands_of_short_sequences) {
  /* Many short sequences, each on a fresh vdev, beside the few long ones
   * above: 1000 seeds per policy, 200 operations each, on limits from
   * 256 KiB to 8.25 MiB (never a multiple of 256), so some sequences stay
   * roomy and others reach the quota or scatter their free bytes. run_random
   * checks every operation against the model (the limit, no overlap, exact
   * stats and causes) and that all memory returns at the end. Larger limits
   * cost ASan more in fresh pages than they add in paths (about 4 s there
   * for this test, 0.25 s in a plain build). */
  uint64_t quota = 0, frag = 0;
  for (uint64_t seed = 1000; seed < 2000; seed++) {
    for (int pol = 0; pol < 2; pol++) {
      uint64_t h = (seed * 2 + (uint64_t)pol) * 0xD1B54A32D192ED03ull;
      h ^= h >> 29;
      size_t limit = 256 * KiB + (size_t)(h % (8 * MiB)) + 1 + (size_t)(h >> 40) % 255;
      run_random(pol ? GS_POLICY_GROWTH : GS_POLICY_PREALLOCATE, seed, limit, 200);
      quota += last_quota;
      frag += last_frag;
    }
  }
  cr_assert_gt(quota, 0, "some sequences reach their quota");
  cr_assert_gt(frag, 0, "some sequences fail on scattered free bytes");
}

/* ---- GROWTH ---- */

Test(alloc, growth_regions_double_up_to_the_limit) {
  fake_init(SIZE_MAX);
  gs_alloc *a = make(20 * MiB, GS_POLICY_GROWTH);
  cr_assert_eq(stats_of(a).reserved, 0, "GROWTH reserves nothing at create");
  void *ps[32];
  int n = 0;
  for (;;) {
    void *p = NULL;
    gs_alloc_failure why;
    if (gs_alloc_malloc(a, MiB, NULL, &p, &why) != 0) {
      cr_assert_eq(why.cause, GS_OOM_QUOTA);
      cr_assert_eq(why.stats.in_use, 20 * MiB);
      cr_assert_eq(why.stats.reserved, 20 * MiB);
      break;
    }
    cr_assert_lt(n, 32);
    ps[n++] = p;
    cr_assert_leq(dev->reserved, 20 * MiB);
  }
  cr_assert_eq(n, 20);
  /* 2 MiB first, then doubling, the last one cut to what the limit leaves */
  size_t want[] = {2 * MiB, 4 * MiB, 8 * MiB, 6 * MiB};
  cr_assert_eq(dev->nsizes, 4);
  for (size_t i = 0; i < 4; i++) cr_assert_eq(dev->sizes[i], want[i], "region %zu", i);
  gs_alloc_stats st = stats_of(a);
  cr_assert_eq(st.peak_reserved, 20 * MiB);
  cr_assert_eq(st.largest_free, 0);
  for (int i = 0; i < n; i++) gs_alloc_free(a, ps[i]);
  gs_alloc_trim(a);
  st = stats_of(a);
  cr_assert_eq(st.reserved, 0);
  cr_assert_eq(st.peak_reserved, 20 * MiB, "peak survives the trim");
  gs_alloc_reset_peak(a);
  st = stats_of(a);
  cr_assert_eq(st.peak_reserved, 0);
  cr_assert_eq(st.peak_in_use, 0);
  gs_alloc_destroy(a);
  fake_fini();
}

Test(alloc, growth_region_at_least_the_block_never_past_the_limit) {
  fake_init(SIZE_MAX);
  gs_alloc *a = make(30 * MiB, GS_POLICY_GROWTH);
  void *p = must_alloc(a, 5 * MiB + 1); /* first region: the block, over 2 MiB */
  void *q = must_alloc(a, 256);         /* region 1 is full: twice the last */
  void *r = must_alloc(a, 12 * MiB);    /* twice would pass the limit: what it leaves */
  void *s = must_alloc(a, 6 * MiB);     /* fits in region 2's remainder */
  cr_assert_eq(dev->nsizes, 3);
  cr_assert_eq(dev->sizes[0], 5 * MiB + 256);
  cr_assert_eq(dev->sizes[1], 2 * (5 * MiB + 256));
  cr_assert_eq(dev->sizes[2], 30 * MiB - 3 * (5 * MiB + 256), "what the limit leaves");
  cr_assert_eq(dev->reserved, 30 * MiB);
  /* 7 MiB - 512 of the limit is free, in pieces of 4 MiB + 256 and 3 MiB - 768 */
  void *t = NULL;
  gs_alloc_failure why;
  cr_assert_eq(gs_alloc_malloc(a, 5 * MiB, NULL, &t, &why), -ENOMEM);
  cr_assert_eq(why.cause, GS_OOM_FRAGMENTATION);
  cr_assert_eq(why.stats.total_free, 7 * MiB - 512);
  cr_assert_eq(why.stats.largest_free, 4 * MiB + 256);
  cr_assert_eq(dev->nsizes, 3, "no region past the limit was asked for");
  gs_alloc_free(a, p);
  gs_alloc_free(a, q);
  gs_alloc_free(a, r);
  gs_alloc_free(a, s);
  gs_alloc_destroy(a);
  fake_fini();

  fake_init(SIZE_MAX);
  a = make(100 * MiB, GS_POLICY_GROWTH);
  p = must_alloc(a, MiB);      /* 2 MiB region */
  q = must_alloc(a, 30 * MiB); /* twice the last is 4 MiB: the block wins */
  cr_assert_eq(dev->sizes[1], 30 * MiB);
  gs_alloc_free_all(a);
  gs_alloc_trim(a);
  cr_assert_eq(dev->reserved, 0);
  gs_alloc_destroy(a);
  fake_fini();

  fake_init(SIZE_MAX);
  a = make(MiB, GS_POLICY_GROWTH); /* smaller than the 2 MiB first region */
  p = must_alloc(a, 100);
  cr_assert_eq(dev->sizes[0], MiB, "the first region never passes the limit");
  gs_alloc_free(a, p);
  gs_alloc_destroy(a);
  fake_fini();
}

/* One allocation can take two block headers from the allocator's pool: the
 * new region's free block and the remainder of the split. Whatever the
 * pool holds when a region must be added (k small blocks first, past a
 * slab's 256 headers), the allocation that grows and splits succeeds. */
Test(alloc, growth_and_split_in_one_call_at_any_pool_level) {
  for (int k = 0; k < 600; k += 1) {
    fake_init(SIZE_MAX);
    gs_alloc *a = make(1024 * MiB, GS_POLICY_GROWTH);
    void **p = calloc((size_t)k + 2, sizeof *p);
    cr_assert(p);
    for (int i = 0; i < k; i++) p[i] = must_alloc(a, 256); /* each splits the first region */
    p[k] = must_alloc(a, 3 * MiB);                         /* a new region, then a split */
    p[k + 1] = must_alloc(a, 256);
    for (int i = 0; i < k + 2; i++) gs_alloc_free(a, p[i]);
    free(p);
    gs_alloc_destroy(a);
    fake_fini();
  }
}

Test(alloc, growth_releases_empty_regions_to_make_room) {
  fake_init(SIZE_MAX);
  gs_alloc *a = make(4 * MiB, GS_POLICY_GROWTH);
  void *p = must_alloc(a, 2 * MiB), *q = must_alloc(a, 2 * MiB);
  cr_assert_eq(dev->nsizes, 2);
  gs_alloc_free(a, p);
  gs_alloc_free(a, q);
  /* Two empty 2 MiB regions, no room left in the limit: releasing them
   * makes room for one region that holds 3 MiB. */
  void *r = must_alloc(a, 3 * MiB);
  cr_assert_eq(dev->nlive, 1);
  cr_assert_eq(dev->sizes[2], 4 * MiB);
  gs_alloc_stats st = stats_of(a);
  cr_assert_eq(st.reserved, 4 * MiB);
  cr_assert_eq(st.in_use, 3 * MiB);
  gs_alloc_free(a, r);
  gs_alloc_destroy(a);
  fake_fini();
}

/* ---- causes ---- */

Test(alloc, quota) {
  fake_init(SIZE_MAX);
  gs_alloc *a = make(MiB, GS_POLICY_PREALLOCATE);
  void *p = must_alloc(a, MiB - 1);
  void *q = (void *)1;
  gs_alloc_failure why;
  memset(&why, 0xa5, sizeof why);
  cr_assert_eq(gs_alloc_malloc(a, 1, NULL, &q, &why), -ENOMEM);
  cr_assert_null(q);
  cr_assert_eq(why.cause, GS_OOM_QUOTA);
  cr_assert_eq(why.requested, 256);
  cr_assert_eq(why.stats.limit, MiB);
  cr_assert_eq(why.stats.in_use, MiB);
  cr_assert_eq(why.stats.reserved, MiB);
  cr_assert_eq(why.stats.largest_free, 0);
  cr_assert_eq(why.stats.total_free, 0);
  cr_assert_eq(why.stats.fragmentation, 0.0);
  cr_assert_eq(why.stats.allocations, 1);
  /* a block larger than the whole limit, and one whose size cannot be
   * rounded, are quota too */
  cr_assert_eq(gs_alloc_malloc(a, 2 * MiB, NULL, &q, &why), -ENOMEM);
  cr_assert_eq(why.cause, GS_OOM_QUOTA);
  cr_assert_eq(why.requested, 2 * MiB);
  cr_assert_eq(gs_alloc_malloc(a, SIZE_MAX, NULL, &q, &why), -ENOMEM);
  cr_assert_eq(why.cause, GS_OOM_QUOTA);
  cr_assert_eq(gs_alloc_malloc(a, 1, NULL, &q, NULL), -ENOMEM, "why may be NULL");
  gs_alloc_free(a, p);
  gs_alloc_destroy(a);
  fake_fini();

  fake_init(SIZE_MAX);
  a = make(3 * MiB, GS_POLICY_GROWTH);
  p = must_alloc(a, 2 * MiB);
  cr_assert_eq(gs_alloc_malloc(a, MiB + 256, NULL, &q, &why), -ENOMEM);
  cr_assert_eq(why.cause, GS_OOM_QUOTA);
  cr_assert_eq(why.stats.reserved, 2 * MiB, "nothing reserved past the limit");
  cr_assert_eq(dev->reserve_calls, 1, "quota is decided before asking the device");
  gs_alloc_free(a, p);
  gs_alloc_destroy(a);
  fake_fini();
}

Test(alloc, physical) {
  fake_init(3 * MiB); /* the device has less than the vdev's limit */
  gs_alloc *a = NULL;
  cr_assert_eq(gs_alloc_create(&backend, 3, 8 * MiB, GS_POLICY_PREALLOCATE, &a), -ENOMEM);
  cr_assert_null(a);
  cr_assert_eq(dev->refused, 1);
  dev->refused = 0;
  a = make(64 * MiB, GS_POLICY_GROWTH);
  void *p = must_alloc(a, MiB), *q = must_alloc(a, MiB); /* one 2 MiB region */
  /* The rule asks for 4 MiB, the device has 1 MiB left: the exact block */
  void *r = must_alloc(a, MiB);
  cr_assert_eq(dev->refused, 1);
  cr_assert_eq(dev->reserved, 3 * MiB);
  void *s = NULL;
  gs_alloc_failure why;
  cr_assert_eq(gs_alloc_malloc(a, 256, NULL, &s, &why), -ENOMEM);
  cr_assert_eq(why.cause, GS_OOM_PHYSICAL);
  cr_assert_eq(why.requested, 256);
  cr_assert_eq(why.stats.in_use, 3 * MiB);
  cr_assert_eq(why.stats.reserved, 3 * MiB);
  cr_assert_eq(why.stats.limit, 64 * MiB);
  cr_assert_eq(why.stats.largest_free, 0);
  cr_assert_eq(why.stats.allocations, 3);
  gs_alloc_free(a, q);
  s = must_alloc(a, 256); /* a freed block serves without the device */
  gs_alloc_free(a, p);
  gs_alloc_free(a, r);
  gs_alloc_free(a, s);
  gs_alloc_destroy(a);
  fake_fini();
}

static void fragment(gs_alloc_policy policy) {
  fake_init(SIZE_MAX);
  gs_alloc *a = make(MiB, policy);
  enum { N = MiB / 256 };
  static void *ps[N];
  for (size_t i = 0; i < N; i++) ps[i] = must_alloc(a, 256);
  for (size_t i = 0; i < N; i += 2) gs_alloc_free(a, ps[i]);
  void *p = NULL;
  gs_alloc_failure why;
  cr_assert_eq(gs_alloc_malloc(a, 512, NULL, &p, &why), -ENOMEM);
  cr_assert_eq(why.cause, GS_OOM_FRAGMENTATION);
  cr_assert_eq(why.requested, 512);
  cr_assert_eq(why.stats.in_use, MiB / 2);
  cr_assert_eq(why.stats.reserved, MiB);
  cr_assert_eq(why.stats.total_free, MiB / 2);
  cr_assert_eq(why.stats.largest_free, 256);
  cr_assert_float_eq(why.stats.fragmentation, 1.0 - 256.0 / (double)(MiB / 2), 1e-12);
  cr_assert_eq(why.stats.live_blocks, N / 2);
  /* freeing one neighbour makes a 768-byte hole: the 512 fits again */
  gs_alloc_free(a, ps[1]);
  cr_assert_eq(stats_of(a).largest_free, 768);
  p = must_alloc(a, 512);
  cr_assert_eq(p, ps[0]);
  gs_alloc_free_all(a);
  gs_alloc_stats st = stats_of(a);
  cr_assert_eq(st.in_use, 0);
  cr_assert_eq(st.live_blocks, 0);
  cr_assert_eq(st.frees, st.allocations, "free_all counts what it frees");
  cr_assert_eq(st.reserved, MiB, "free_all keeps the regions");
  cr_assert_eq(st.largest_free, MiB);
  gs_alloc_destroy(a);
  fake_fini();
}

Test(alloc, fragmentation_preallocate) { fragment(GS_POLICY_PREALLOCATE); }
Test(alloc, fragmentation_growth) { fragment(GS_POLICY_GROWTH); }

/* ---- tags ---- */

typedef struct tag_sum {
  char layer[32];
  gs_role role;
  uint64_t bytes;
} tag_sum;

typedef struct tag_sums {
  tag_sum s[16];
  int n;
} tag_sums;

static void collect(void *u, const char *layer, gs_role role, uint64_t bytes) {
  tag_sums *t = u;
  cr_assert_lt(t->n, 16);
  for (int i = 0; i < t->n; i++)
    cr_assert(!(t->s[i].role == role && strcmp(t->s[i].layer, layer) == 0),
              "(%s, %s) reported twice", layer, gs_role_name(role));
  snprintf(t->s[t->n].layer, sizeof t->s[t->n].layer, "%s", layer);
  t->s[t->n].role = role;
  t->s[t->n].bytes = bytes;
  t->n++;
}

static uint64_t sum_of(const tag_sums *t, const char *layer, gs_role role) {
  for (int i = 0; i < t->n; i++)
    if (t->s[i].role == role && strcmp(t->s[i].layer, layer) == 0) return t->s[i].bytes;
  return 0;
}

Test(alloc, foreach_tag_sums_live_bytes) {
  fake_init(SIZE_MAX);
  gs_alloc *a = make(8 * MiB, GS_POLICY_PREALLOCATE);
  char name[16];
  void *p[5];
  gs_alloc_tag tag = {name, GS_ROLE_WEIGHTS};
  strcpy(name, "dense_1");
  cr_assert_eq(gs_alloc_malloc(a, 1000, &tag, &p[0], NULL), 0);
  cr_assert_eq(gs_alloc_malloc(a, 4096, &tag, &p[1], NULL), 0);
  tag.role = GS_ROLE_GRADIENTS;
  cr_assert_eq(gs_alloc_malloc(a, 300, &tag, &p[2], NULL), 0);
  strcpy(name, "conv2d_1"); /* the allocator kept its own copy of "dense_1" */
  tag.role = GS_ROLE_ACTIVATIONS;
  cr_assert_eq(gs_alloc_malloc(a, MiB, &tag, &p[3], NULL), 0);
  cr_assert_eq(gs_alloc_malloc(a, 10, NULL, &p[4], NULL), 0);
  strcpy(name, "clobbered");

  tag_sums t = {0};
  gs_alloc_foreach_tag(a, collect, &t);
  cr_assert_eq(t.n, 4);
  cr_assert_eq(sum_of(&t, "dense_1", GS_ROLE_WEIGHTS), 1024 + 4096);
  cr_assert_eq(sum_of(&t, "dense_1", GS_ROLE_GRADIENTS), 512);
  cr_assert_eq(sum_of(&t, "conv2d_1", GS_ROLE_ACTIVATIONS), MiB);
  cr_assert_eq(sum_of(&t, "untagged", GS_ROLE_WORKSPACE), 256);
  uint64_t total = 0;
  for (int i = 0; i < t.n; i++) total += t.s[i].bytes;
  cr_assert_eq(total, stats_of(a).in_use, "tags account for every live byte");

  gs_alloc_free(a, p[0]);
  gs_alloc_free(a, p[2]);
  memset(&t, 0, sizeof t);
  gs_alloc_foreach_tag(a, collect, &t);
  cr_assert_eq(t.n, 3, "a pair holding nothing is not reported");
  cr_assert_eq(sum_of(&t, "dense_1", GS_ROLE_WEIGHTS), 4096);
  cr_assert_eq(sum_of(&t, "dense_1", GS_ROLE_GRADIENTS), 0);

  tag.role = (gs_role)GS_ROLE_COUNT;
  void *bad = (void *)1;
  cr_assert_eq(gs_alloc_malloc(a, 10, &tag, &bad, NULL), -EINVAL);
  cr_assert_null(bad);

  gs_alloc_free_all(a);
  memset(&t, 0, sizeof t);
  gs_alloc_foreach_tag(a, collect, &t);
  cr_assert_eq(t.n, 0);
  gs_alloc_destroy(a);
  fake_fini();
}

/* ---- misuse and threads ---- */

Test(alloc, free_of_a_foreign_pointer_aborts, .signal = SIGABRT) {
  fake_init(SIZE_MAX);
  gs_alloc *a = make(MiB, GS_POLICY_PREALLOCATE);
  char *p = must_alloc(a, 512);
  gs_alloc_free(a, p + 256); /* inside a block, but not one */
}

Test(alloc, double_free_aborts, .signal = SIGABRT) {
  fake_init(SIZE_MAX);
  gs_alloc *a = make(MiB, GS_POLICY_PREALLOCATE);
  void *p = must_alloc(a, 512);
  must_alloc(a, 512);
  gs_alloc_free(a, p);
  gs_alloc_free(a, p);
}

typedef struct worker {
  gs_alloc *a;
  uint64_t seed;
  int failures;
} worker;

static void *work(void *u) {
  worker *w = u;
  void *mine[32] = {0};
  for (int i = 0; i < 20000; i++) {
    size_t k = (size_t)(rng_next(&w->seed) % 32);
    if (mine[k]) {
      gs_alloc_free(w->a, mine[k]);
      mine[k] = NULL;
    } else if (gs_alloc_malloc(w->a, rng_size(&w->seed, 256 * KiB), NULL, &mine[k], NULL) != 0) {
      w->failures++;
    }
  }
  for (int k = 0; k < 32; k++) gs_alloc_free(w->a, mine[k]);
  return NULL;
}

Test(alloc, threads_share_one_allocator) {
  /* 4 threads x 32 blocks x 256 KiB at most: 32 MiB live in a 128 MiB vdev,
   * so nothing fails */
  fake_init(SIZE_MAX);
  gs_alloc *a = make(128 * MiB, GS_POLICY_GROWTH);
  pthread_t th[4];
  worker w[4];
  for (int i = 0; i < 4; i++) {
    w[i] = (worker){a, (uint64_t)i * 7919 + 1, 0};
    cr_assert_eq(pthread_create(&th[i], NULL, work, &w[i]), 0);
  }
  for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
  gs_alloc_stats st = stats_of(a);
  for (int i = 0; i < 4; i++) cr_assert_eq(w[i].failures, 0);
  cr_assert_eq(st.in_use, 0);
  cr_assert_eq(st.live_blocks, 0);
  cr_assert_eq(st.allocations, st.frees);
  cr_assert_gt(st.allocations, 0);
  cr_assert_leq(st.peak_reserved, st.limit);
  gs_alloc_destroy(a);
  fake_fini();
}

static int try_alloc(gs_alloc *a, size_t bytes, gs_oom_cause *cause) {
  void *p = NULL;
  gs_alloc_failure why;
  gs_alloc_tag tag = {"test", GS_ROLE_WORKSPACE};
  int rc = gs_alloc_malloc(a, bytes, &tag, &p, &why);
  if (rc && cause) *cause = why.cause;
  return rc;
}

Test(alloc, set_limit_growth) {
  fake_init(SIZE_MAX);
  gs_alloc *a = make(4 * MiB, GS_POLICY_GROWTH);
  char *x = must_alloc(a, 3 * MiB);
  /* Lower than what is in use: refused, nothing changes. */
  cr_assert_eq(gs_alloc_set_limit(a, 2 * MiB), -EBUSY);
  cr_assert_eq(stats_of(a).limit, 4 * MiB);
  cr_assert_eq(gs_alloc_set_limit(a, 0), -EINVAL);
  gs_alloc_free(a, x);
  /* Nothing in use: the empty regions go back, the limit takes. */
  cr_assert_eq(gs_alloc_set_limit(a, 2 * MiB), 0);
  gs_alloc_stats st = stats_of(a);
  cr_assert_eq(st.limit, 2 * MiB);
  cr_assert_leq(st.reserved, 2 * MiB);
  gs_oom_cause cause;
  cr_assert_eq(try_alloc(a, 3 * MiB, &cause), -ENOMEM);
  cr_assert_eq(cause, GS_OOM_QUOTA);
  x = must_alloc(a, 2 * MiB - 256);
  cr_assert_leq(stats_of(a).peak_in_use, 2 * MiB, "the peak never passes the new limit");
  /* Raised while a block lives: at once. */
  cr_assert_eq(gs_alloc_set_limit(a, 8 * MiB), 0);
  char *y = must_alloc(a, 5 * MiB);
  gs_alloc_free(a, x);
  gs_alloc_free(a, y);
  gs_alloc_destroy(a);
  fake_fini();
}

Test(alloc, set_limit_preallocate) {
  fake_init(SIZE_MAX);
  gs_alloc *a = make(4 * MiB, GS_POLICY_PREALLOCATE);
  char *x = must_alloc(a, MiB);
  /* Lowered: the region stays, but no more than the new limit is handed out. */
  cr_assert_eq(gs_alloc_set_limit(a, 2 * MiB), 0);
  gs_alloc_stats st = stats_of(a);
  cr_assert_eq(st.limit, 2 * MiB);
  cr_assert_eq(st.reserved, 4 * MiB);
  gs_oom_cause cause;
  cr_assert_eq(try_alloc(a, MiB + 256, &cause), -ENOMEM, "free reserved bytes past the limit");
  cr_assert_eq(cause, GS_OOM_QUOTA);
  char *y = must_alloc(a, MiB);
  cr_assert_eq(stats_of(a).in_use, 2 * MiB);
  /* Raised: one more region of the difference. */
  cr_assert_eq(gs_alloc_set_limit(a, 6 * MiB), 0);
  st = stats_of(a);
  cr_assert_eq(st.reserved, 6 * MiB);
  char *z = must_alloc(a, 2 * MiB), *w = must_alloc(a, 2 * MiB); /* one in each region */
  cr_assert_eq(stats_of(a).in_use, 6 * MiB);
  gs_alloc_free(a, x);
  gs_alloc_free(a, y);
  gs_alloc_free(a, z);
  gs_alloc_free(a, w);
  gs_alloc_destroy(a);
  fake_fini();
}

/* ---- what the next allocation could get (headroom, largest placeable) ---- */

/* largest_placeable is exact: a block of it is placed, one 256 bytes larger
 * is not. Leaves the allocator as it was. */
static void placeable_is_exact(gs_alloc *a) {
  gs_alloc_stats st = stats_of(a);
  cr_assert_gt(st.largest_placeable, 0);
  gs_oom_cause cause;
  cr_assert_eq(try_alloc(a, st.largest_placeable + GS_ALLOC_ALIGN, &cause), -ENOMEM,
               "a block past largest_placeable %llu was placed",
               (unsigned long long)st.largest_placeable);
  char *p = must_alloc(a, st.largest_placeable);
  gs_alloc_free(a, p);
}

Test(alloc, placeable_preallocate) {
  fake_init(SIZE_MAX);
  gs_alloc *a = make(MiB, GS_POLICY_PREALLOCATE);
  gs_alloc_stats st = stats_of(a);
  cr_assert_eq(st.headroom, MiB);
  cr_assert_eq(st.largest_placeable, MiB);
  cr_assert_eq(st.headroom_fragmentation, 0.0);

  char *A = must_alloc(a, 1024), *B = must_alloc(a, 3072), *C = must_alloc(a, 256);
  gs_alloc_free(a, B); /* a 3072-byte hole before C, the tail after it */
  st = stats_of(a);
  size_t tail = MiB - 1024 - 3072 - 256;
  cr_assert_eq(st.headroom, MiB - 1024 - 256);
  cr_assert_eq(st.largest_placeable, tail, "the region's largest free block: the tail");
  cr_assert_float_eq(st.headroom_fragmentation, 1.0 - (double)tail / (double)(MiB - 1280), 1e-12);
  cr_assert_eq(st.headroom_fragmentation, st.fragmentation, "one region of the whole limit");
  placeable_is_exact(a);

  /* Lowered: the region stays, the free tail is larger than what the
   * limit lets be handed out. */
  cr_assert_eq(gs_alloc_set_limit(a, 512 * KiB), 0);
  st = stats_of(a);
  cr_assert_eq(st.headroom, 512 * KiB - 1280);
  cr_assert_eq(st.largest_placeable, 512 * KiB - 1280, "capped by the limit, not the region");
  cr_assert_eq(st.headroom_fragmentation, 0.0);
  cr_assert_gt(st.largest_free, st.largest_placeable);
  placeable_is_exact(a);
  char *D = must_alloc(a, 512 * KiB - 1280);
  st = stats_of(a);
  cr_assert_eq(st.headroom, 0);
  cr_assert_eq(st.largest_placeable, 0);
  cr_assert_eq(st.headroom_fragmentation, 0.0);
  gs_alloc_free(a, A);
  gs_alloc_free(a, C);
  gs_alloc_free(a, D);
  gs_alloc_destroy(a);
  fake_fini();
}

Test(alloc, placeable_growth) {
  fake_init(SIZE_MAX);
  gs_alloc *a = make(8 * MiB, GS_POLICY_GROWTH);
  gs_alloc_stats st = stats_of(a);
  cr_assert_eq(st.reserved, 0);
  cr_assert_eq(st.largest_placeable, 8 * MiB, "no region yet: one region of the whole limit");
  cr_assert_eq(st.headroom_fragmentation, 0.0);
  placeable_is_exact(a);
  gs_alloc_destroy(a); /* anew: the region sizes below follow the first */
  a = make(8 * MiB, GS_POLICY_GROWTH);

  char *x = must_alloc(a, MiB); /* the first region: 2 MiB */
  char *y = must_alloc(a, 2 * MiB); /* the next: twice the last, 4 MiB */
  st = stats_of(a);
  cr_assert_eq(st.reserved, 6 * MiB);
  cr_assert_eq(st.headroom, 5 * MiB);
  cr_assert_eq(st.largest_free, 2 * MiB);
  cr_assert_eq(st.largest_placeable, 2 * MiB, "free blocks and the 2 MiB left unreserved");
  cr_assert_float_eq(st.headroom_fragmentation, 1.0 - 2.0 / 5.0, 1e-12);

  gs_alloc_free(a, x); /* the first region is empty: it would be released */
  st = stats_of(a);
  cr_assert_eq(st.headroom, 6 * MiB);
  cr_assert_eq(st.largest_free, 2 * MiB);
  cr_assert_eq(st.largest_placeable, 4 * MiB, "2 MiB unreserved + the empty 2 MiB region");
  cr_assert_float_eq(st.headroom_fragmentation, 1.0 - 4.0 / 6.0, 1e-12);
  placeable_is_exact(a);
  gs_alloc_free(a, y);
  gs_alloc_destroy(a);
  fake_fini();
}
