/*
 * alloc.c: the vdev allocator, the one place a job's device bytes come from.
 *
 * What it manages. A vdev has a memory limit; its allocator obtains regions
 * from the backend (mmap'd host memory on the CPU, cudaMalloc'd memory on a
 * GPU) and carves tensors out of them. The host may not be able to touch a
 * region (GPU memory), so no byte of bookkeeping lives inside one: every
 * block is described by a host-side header (gs__block) that records its
 * address and size. Headers come from slabs that are never given back while
 * the allocator lives, so a steady training loop mallocs nothing here.
 *
 * Regions. PREALLOCATE reserves one region of the whole limit (rounded down
 * to 256 bytes) at create. GROWTH reserves on demand: a new region is
 * min(twice the last region reserved, what the limit leaves), but at least
 * the block being placed; the first is max(block, min(2 MiB, limit)). If the
 * device refuses that size, one more try asks for exactly the block, so a
 * device that is nearly full still serves a request that fits in it. Before
 * GROWTH declares a block unplaceable, it releases regions holding no live
 * block when that makes room for one region large enough. gs_alloc_trim
 * releases empty regions on request.
 *
 * Blocks. Each region's blocks form a doubly linked list in address order, so
 * a freed block merges with a free neighbour in O(1); neighbours are always
 * in one region, since regions are separate lists. Every block start and size
 * is a multiple of 256 (GS_ALLOC_ALIGN), so a split always leaves a remainder
 * of at least 256 bytes or none. The lower part of a split is handed out.
 *
 * Free blocks sit in size-class bins: sizes below 16 units (a unit is 256
 * bytes) have a bin each; above, every power of two is cut into 8 classes
 * (as in TLSF), 512 bins in all, with a bitmap of non-empty bins. Each bin's
 * list is kept sorted by size, so best fit is: walk the request's own bin to
 * the first block that is large enough, else take the head of the next
 * non-empty bin (found with the bitmap: 8 words at most). Inserting a free
 * block walks only past the smaller blocks of its own bin (sizes within
 * 12.5% of each other; small bins hold one size). The largest free block is
 * the tail of the highest non-empty bin, so the stats are O(bins / 64)
 * (and, for GROWTH, a walk of the regions: what a new region could be).
 *
 * Live blocks are found by address in a chained hash map (power-of-two
 * buckets, grown at load 1; a failed growth only lengthens chains). A pointer
 * not in it is a bug in the caller (foreign pointer or double free) and
 * aborts with a message, as a corrupted allocator must not go on serving.
 *
 * Why an allocation fails, in this order (need = gs_alloc_block_size(bytes),
 * cap = the limit rounded down to 256):
 *   1. QUOTA: cap - in_use < need. The free bytes of the reserved regions
 *      plus what the limit still lets us reserve are exactly cap - in_use, so
 *      no arrangement of the vdev's memory could hold the block.
 *   2. PHYSICAL: the limit leaves room for a region that would hold the block
 *      (GROWTH), but the backend refused it (both the rule's size and the
 *      exact block), or the host could not give memory for bookkeeping.
 *   3. FRAGMENTATION: the bytes within the limit suffice, but they are
 *      scattered: no free block is large enough and no region can be added
 *      (PREALLOCATE, or GROWTH with too little of the limit left unreserved
 *      even after releasing empty regions).
 *
 * Tags. A block points to an interned (layer, role) entry that keeps the
 * live bytes of that pair, so gs_alloc_foreach_tag is one walk over the
 * distinct pairs. The layer string is copied once, on first use.
 *
 * Locking: one pthread mutex per allocator around every operation. Backend
 * calls (region reserve/release) run under it; they are rare. The callback
 * of gs_alloc_foreach_tag runs under it too, so it must not call back into
 * the same allocator.
 *
 * Small points of the contract: a NULL tag (or layer) is counted as layer
 * "untagged", role workspace; gs_alloc_free_all counts each block it frees
 * in `frees`; gs_alloc_block_size returns 0 for a size that cannot be
 * rounded up in a size_t, and such a request fails with QUOTA.
 */
#include "runtime/alloc.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GS__UNIT_SHIFT 8 /* log2(GS_ALLOC_ALIGN) */
#define GS__NBINS 512
#define GS__BITMAP_WORDS (GS__NBINS / 64)
#define GS__EXACT_UNITS 16 /* sizes below 16 units have a bin each */
#define GS__SUBCLASS_BITS 3 /* 8 classes per power of two above */
#define GS__GROWTH_FIRST ((size_t)2 << 20) /* first GROWTH region, at least */
#define GS__SLAB_BLOCKS 256
#define GS__HASH_MIN_BITS 10
#define GS__TAG_MIN_BITS 6
#define GS__UNTAGGED "untagged"

_Static_assert(GS_ALLOC_ALIGN == (1 << GS__UNIT_SHIFT), "unit shift matches alignment");

typedef struct gs__tagent {
  struct gs__tagent *next; /* next entry in the same tag-table bucket */
  char *layer;             /* copied layer name */
  gs_role role;
  uint64_t hash;           /* hash of (layer, role) */
  uint64_t bytes;          /* bytes in live blocks with this tag */
} gs__tagent;

typedef struct gs__region gs__region;

typedef struct gs__block {
  uintptr_t addr;                  /* device address of the block's first byte */
  size_t size;                     /* bytes, a multiple of GS_ALLOC_ALIGN */
  gs__region *region;              /* the region the block lies in */
  struct gs__block *prev, *next;   /* neighbours in address order, same region */
  struct gs__block *fprev, *fnext; /* free: bin list; pooled: fnext chains */
  struct gs__block *hnext;         /* live: chain in the address hash map */
  gs__tagent *tag;                 /* live: owner; NULL when free */
  bool is_free;
} gs__block;

struct gs__region {
  gs__region *prev, *next; /* all regions of the allocator */
  uintptr_t base;          /* address the backend returned */
  size_t size;             /* bytes reserved from the backend */
  gs__block *first;        /* lowest-address block */
  uint64_t live;           /* live blocks inside; 0 means one free block spans it */
};

typedef struct gs__slab {
  struct gs__slab *next;                 /* slabs, for destroy */
  gs__block blocks[GS__SLAB_BLOCKS];
} gs__slab;

typedef struct gs__bin {
  gs__block *head, *tail; /* ascending by size */
} gs__bin;

struct gs_alloc {
  pthread_mutex_t mu;      /* guards everything below */
  gs_backend *b;           /* where regions come from */
  int device;              /* device index passed to the backend */
  gs_alloc_policy policy;
  uint64_t limit;          /* the vdev's limit as given */
  uint64_t cap;            /* limit rounded down to GS_ALLOC_ALIGN */

  gs__region *regions;     /* every reserved region */
  size_t last_region;      /* size of the most recently reserved region */

  gs__bin bins[GS__NBINS];
  uint64_t bitmap[GS__BITMAP_WORDS]; /* bit i: bins[i] is not empty */

  gs__block **hash;        /* live blocks by address */
  unsigned hash_bits;      /* log2 of the bucket count */

  gs__block *pool;         /* unused headers */
  size_t pool_count;
  gs__slab *slabs;

  gs__tagent **tags;       /* interned (layer, role) pairs */
  unsigned tag_bits;
  size_t ntags;

  uint64_t in_use, peak_in_use;
  uint64_t reserved, peak_reserved;
  uint64_t allocations, frees, live_blocks;
};

const char *gs_role_name(gs_role r) {
  static const char *const names[GS_ROLE_COUNT] = {
      "weights", "master", "gradients", "optimizer", "activations", "workspace", "batch",
  };
  if ((unsigned)r >= GS_ROLE_COUNT) return "unknown";
  return names[r];
}

size_t gs_alloc_block_size(size_t bytes) {
  if (bytes == 0) bytes = 1;
  if (bytes > SIZE_MAX - (GS_ALLOC_ALIGN - 1)) return 0; /* not representable */
  return (bytes + (GS_ALLOC_ALIGN - 1)) & ~(size_t)(GS_ALLOC_ALIGN - 1);
}

/* ---- size-class bins ---- */

static unsigned gs__bin_of(size_t size) {
  uint64_t u = (uint64_t)size >> GS__UNIT_SHIFT;
  if (u < GS__EXACT_UNITS) return (unsigned)u;
  unsigned fl = 63u - (unsigned)__builtin_clzll(u); /* >= 4 */
  unsigned sl = (unsigned)(u >> (fl - GS__SUBCLASS_BITS)) & ((1u << GS__SUBCLASS_BITS) - 1);
  return GS__EXACT_UNITS + ((fl - 4) << GS__SUBCLASS_BITS) + sl;
}

/* First non-empty bin at index >= from, or GS__NBINS. */
static unsigned gs__bin_next(const gs_alloc *a, unsigned from) {
  if (from >= GS__NBINS) return GS__NBINS;
  unsigned w = from / 64;
  uint64_t word = a->bitmap[w] & (~(uint64_t)0 << (from % 64));
  for (;;) {
    if (word) return w * 64 + (unsigned)__builtin_ctzll(word);
    if (++w == GS__BITMAP_WORDS) return GS__NBINS;
    word = a->bitmap[w];
  }
}

static uint64_t gs__largest_free(const gs_alloc *a) {
  for (unsigned w = GS__BITMAP_WORDS; w-- > 0;) {
    if (a->bitmap[w]) {
      unsigned i = w * 64 + 63u - (unsigned)__builtin_clzll(a->bitmap[w]);
      return a->bins[i].tail->size;
    }
  }
  return 0;
}

static void gs__bin_insert(gs_alloc *a, gs__block *blk) {
  unsigned i = gs__bin_of(blk->size);
  gs__bin *bin = &a->bins[i];
  gs__block *cur = bin->head;
  while (cur && cur->size < blk->size) cur = cur->fnext;
  /* insert before cur (equal sizes: newest first), or at the tail */
  blk->fnext = cur;
  blk->fprev = cur ? cur->fprev : bin->tail;
  if (blk->fprev) blk->fprev->fnext = blk;
  else bin->head = blk;
  if (cur) cur->fprev = blk;
  else bin->tail = blk;
  a->bitmap[i / 64] |= (uint64_t)1 << (i % 64);
}

static void gs__bin_remove(gs_alloc *a, gs__block *blk) {
  unsigned i = gs__bin_of(blk->size);
  gs__bin *bin = &a->bins[i];
  if (blk->fprev) blk->fprev->fnext = blk->fnext;
  else bin->head = blk->fnext;
  if (blk->fnext) blk->fnext->fprev = blk->fprev;
  else bin->tail = blk->fprev;
  blk->fprev = blk->fnext = NULL;
  if (!bin->head) a->bitmap[i / 64] &= ~((uint64_t)1 << (i % 64));
}

/* Smallest free block of at least `need` bytes, or NULL. */
static gs__block *gs__bin_find(gs_alloc *a, size_t need) {
  unsigned i = gs__bin_of(need);
  for (gs__block *cur = a->bins[i].head; cur; cur = cur->fnext)
    if (cur->size >= need) return cur;
  i = gs__bin_next(a, i + 1);
  return i < GS__NBINS ? a->bins[i].head : NULL;
}

/* ---- block header pool ---- */

static int gs__pool_ensure(gs_alloc *a, size_t n) {
  while (a->pool_count < n) {
    gs__slab *s = malloc(sizeof *s);
    if (!s) return -ENOMEM;
    s->next = a->slabs;
    a->slabs = s;
    for (size_t i = 0; i < GS__SLAB_BLOCKS; i++) {
      s->blocks[i].fnext = a->pool;
      a->pool = &s->blocks[i];
    }
    a->pool_count += GS__SLAB_BLOCKS;
  }
  return 0;
}

/* The caller has made sure the pool is not empty. */
static gs__block *gs__hdr_get(gs_alloc *a) {
  gs__block *blk = a->pool;
  a->pool = blk->fnext;
  a->pool_count--;
  memset(blk, 0, sizeof *blk);
  return blk;
}

static void gs__hdr_put(gs_alloc *a, gs__block *blk) {
  blk->fnext = a->pool;
  a->pool = blk;
  a->pool_count++;
}

/* ---- live blocks by address ---- */

static size_t gs__hash_addr(uintptr_t addr, unsigned bits) {
  return (size_t)(((uint64_t)(addr >> GS__UNIT_SHIFT) * 0x9E3779B97F4A7C15ull) >> (64 - bits));
}

static void gs__hash_grow(gs_alloc *a) {
  unsigned bits = a->hash_bits + 1;
  gs__block **nh = calloc((size_t)1 << bits, sizeof *nh);
  if (!nh) return; /* chains grow longer; lookups stay correct */
  for (size_t i = 0; i < ((size_t)1 << a->hash_bits); i++) {
    gs__block *blk = a->hash[i];
    while (blk) {
      gs__block *next = blk->hnext;
      size_t h = gs__hash_addr(blk->addr, bits);
      blk->hnext = nh[h];
      nh[h] = blk;
      blk = next;
    }
  }
  free(a->hash);
  a->hash = nh;
  a->hash_bits = bits;
}

static void gs__hash_insert(gs_alloc *a, gs__block *blk) {
  if (a->live_blocks > ((uint64_t)1 << a->hash_bits)) gs__hash_grow(a);
  size_t h = gs__hash_addr(blk->addr, a->hash_bits);
  blk->hnext = a->hash[h];
  a->hash[h] = blk;
}

/* Remove and return the live block at addr, or NULL. */
static gs__block *gs__hash_take(gs_alloc *a, uintptr_t addr) {
  gs__block **pp = &a->hash[gs__hash_addr(addr, a->hash_bits)];
  for (; *pp; pp = &(*pp)->hnext) {
    if ((*pp)->addr == addr) {
      gs__block *blk = *pp;
      *pp = blk->hnext;
      blk->hnext = NULL;
      return blk;
    }
  }
  return NULL;
}

/* ---- tags ---- */

static uint64_t gs__tag_hash(const char *layer, gs_role role) {
  uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
  for (const unsigned char *s = (const unsigned char *)layer; *s; s++) {
    h ^= *s;
    h *= 0x100000001b3ull;
  }
  h ^= (uint64_t)role + 1;
  h *= 0x100000001b3ull;
  return h;
}

static void gs__tag_grow(gs_alloc *a) {
  unsigned bits = a->tag_bits + 1;
  gs__tagent **nt = calloc((size_t)1 << bits, sizeof *nt);
  if (!nt) return;
  for (size_t i = 0; i < ((size_t)1 << a->tag_bits); i++) {
    gs__tagent *t = a->tags[i];
    while (t) {
      gs__tagent *next = t->next;
      size_t h = (size_t)(t->hash >> (64 - bits));
      t->next = nt[h];
      nt[h] = t;
      t = next;
    }
  }
  free(a->tags);
  a->tags = nt;
  a->tag_bits = bits;
}

/* The interned entry for (layer, role), created on first use; NULL when the
 * host has no memory for a new one. */
static gs__tagent *gs__tag_intern(gs_alloc *a, const char *layer, gs_role role) {
  uint64_t hash = gs__tag_hash(layer, role);
  size_t h = (size_t)(hash >> (64 - a->tag_bits));
  for (gs__tagent *t = a->tags[h]; t; t = t->next)
    if (t->hash == hash && t->role == role && strcmp(t->layer, layer) == 0) return t;

  gs__tagent *t = calloc(1, sizeof *t);
  if (!t) goto fail;
  t->layer = strdup(layer);
  if (!t->layer) goto fail_entry;
  t->role = role;
  t->hash = hash;
  if (a->ntags >= ((size_t)1 << a->tag_bits)) {
    gs__tag_grow(a);
    h = (size_t)(hash >> (64 - a->tag_bits));
  }
  t->next = a->tags[h];
  a->tags[h] = t;
  a->ntags++;
  return t;

fail_entry:
  free(t);
fail:
  return NULL;
}

/* ---- regions ---- */

/* Reserve a region of `size` bytes and put its one free block in the bins. */
static int gs__region_add(gs_alloc *a, size_t size) {
  if (gs__pool_ensure(a, 1) < 0) return -ENOMEM;
  gs__region *r = calloc(1, sizeof *r);
  if (!r) return -ENOMEM;
  void *base = NULL;
  int rc = a->b->region_reserve(a->b, a->device, size, &base);
  if (rc < 0 || !base) goto fail_region;
  if ((uintptr_t)base % GS_ALLOC_ALIGN != 0) {
    /* Backends hand out page- or 256-byte-aligned memory; one that does not
     * cannot serve aligned blocks, so it counts as a device refusal. */
    fprintf(stderr, "gpushare alloc: backend %s returned a region at %p, not %d-byte aligned\n",
            a->b->name ? a->b->name : "?", base, GS_ALLOC_ALIGN);
    a->b->region_release(a->b, a->device, base, size);
    goto fail_region;
  }
  r->base = (uintptr_t)base;
  r->size = size;
  gs__block *blk = gs__hdr_get(a);
  blk->addr = r->base;
  blk->size = size;
  blk->region = r;
  blk->is_free = true;
  r->first = blk;
  r->next = a->regions;
  if (a->regions) a->regions->prev = r;
  a->regions = r;
  gs__bin_insert(a, blk);
  a->last_region = size;
  a->reserved += size;
  if (a->reserved > a->peak_reserved) a->peak_reserved = a->reserved;
  return 0;

fail_region:
  free(r);
  return -ENOMEM;
}

/* Give an empty region (one free block spans it) back to the backend. */
static void gs__region_release(gs_alloc *a, gs__region *r) {
  gs__block *blk = r->first;
  gs__bin_remove(a, blk);
  gs__hdr_put(a, blk);
  if (r->prev) r->prev->next = r->next;
  else a->regions = r->next;
  if (r->next) r->next->prev = r->prev;
  a->reserved -= r->size;
  a->b->region_release(a->b, a->device, (void *)r->base, r->size);
  free(r);
}

static void gs__trim_locked(gs_alloc *a) {
  gs__region *r = a->regions;
  while (r) {
    gs__region *next = r->next;
    if (r->live == 0) gs__region_release(a, r);
    r = next;
  }
}

/* No free block holds `need`: add a region if the policy and the limit allow,
 * else say why not. Returns 0 when a region that fits was added. */
static int gs__grow(gs_alloc *a, size_t need, gs_oom_cause *cause) {
  if (a->cap - a->in_use < need) {
    *cause = GS_OOM_QUOTA;
    return -ENOMEM;
  }
  if (a->policy != GS_POLICY_GROWTH) {
    *cause = GS_OOM_FRAGMENTATION;
    return -ENOMEM;
  }
  uint64_t headroom = a->cap - a->reserved;
  if (headroom < need) {
    uint64_t empty = 0;
    for (gs__region *r = a->regions; r; r = r->next)
      if (r->live == 0) empty += r->size;
    if (headroom + empty < need) {
      *cause = GS_OOM_FRAGMENTATION;
      return -ENOMEM;
    }
    gs__trim_locked(a);
    headroom = a->cap - a->reserved;
  }
  uint64_t want = GS__GROWTH_FIRST;
  if (a->last_region) want = a->last_region > headroom / 2 ? headroom : 2 * (uint64_t)a->last_region;
  if (want > headroom) want = headroom;
  if (want < need) want = need;
  if (gs__region_add(a, (size_t)want) == 0) return 0;
  if (want > need && gs__region_add(a, need) == 0) return 0;
  *cause = GS_OOM_PHYSICAL;
  return -ENOMEM;
}

/* ---- public API ---- */

int gs_alloc_create(gs_backend *b, int device_index, uint64_t limit, gs_alloc_policy policy,
                    gs_alloc **out) {
  int rc = -EINVAL;
  if (!out) goto fail;
  *out = NULL;
  if (!b || !b->region_reserve || !b->region_release) goto fail;
  if (policy != GS_POLICY_PREALLOCATE && policy != GS_POLICY_GROWTH) goto fail;
  uint64_t cap = limit & ~(uint64_t)(GS_ALLOC_ALIGN - 1);
  if (cap == 0 || cap > SIZE_MAX) goto fail;

  rc = -ENOMEM;
  gs_alloc *a = calloc(1, sizeof *a);
  if (!a) goto fail;
  a->b = b;
  a->device = device_index;
  a->policy = policy;
  a->limit = limit;
  a->cap = cap;
  a->hash_bits = GS__HASH_MIN_BITS;
  a->hash = calloc((size_t)1 << a->hash_bits, sizeof *a->hash);
  if (!a->hash) goto fail_alloc;
  a->tag_bits = GS__TAG_MIN_BITS;
  a->tags = calloc((size_t)1 << a->tag_bits, sizeof *a->tags);
  if (!a->tags) goto fail_hash;
  if (pthread_mutex_init(&a->mu, NULL) != 0) goto fail_tags;
  if (gs__pool_ensure(a, GS__SLAB_BLOCKS) < 0) goto fail_mutex;
  if (policy == GS_POLICY_PREALLOCATE && gs__region_add(a, (size_t)cap) < 0) goto fail_pool;
  *out = a;
  return 0;

fail_pool:
  while (a->slabs) {
    gs__slab *s = a->slabs;
    a->slabs = s->next;
    free(s);
  }
fail_mutex:
  pthread_mutex_destroy(&a->mu);
fail_tags:
  free(a->tags);
fail_hash:
  free(a->hash);
fail_alloc:
  free(a);
fail:
  return rc;
}

void gs_alloc_destroy(gs_alloc *a) {
  if (!a) return;
  while (a->regions) {
    gs__region *r = a->regions;
    a->regions = r->next;
    a->b->region_release(a->b, a->device, (void *)r->base, r->size);
    free(r);
  }
  while (a->slabs) {
    gs__slab *s = a->slabs;
    a->slabs = s->next;
    free(s);
  }
  for (size_t i = 0; i < ((size_t)1 << a->tag_bits); i++) {
    gs__tagent *t = a->tags[i];
    while (t) {
      gs__tagent *next = t->next;
      free(t->layer);
      free(t);
      t = next;
    }
  }
  free(a->tags);
  free(a->hash);
  pthread_mutex_destroy(&a->mu);
  free(a);
}

static void gs__stats_locked(const gs_alloc *a, gs_alloc_stats *st) {
  st->limit = a->limit;
  st->in_use = a->in_use;
  st->peak_in_use = a->peak_in_use;
  st->reserved = a->reserved;
  st->peak_reserved = a->peak_reserved;
  st->allocations = a->allocations;
  st->frees = a->frees;
  st->live_blocks = a->live_blocks;
  st->largest_free = gs__largest_free(a);
  st->total_free = a->reserved - a->in_use;
  st->fragmentation =
      st->total_free ? 1.0 - (double)st->largest_free / (double)st->total_free : 0.0;
  /* A PREALLOCATE allocator whose limit was lowered holds regions past cap:
   * only cap - in_use may be handed out (the QUOTA check of malloc). */
  st->headroom = a->cap > a->in_use ? a->cap - a->in_use : 0;
  uint64_t place = st->largest_free;
  if (a->policy == GS_POLICY_GROWTH) { /* as gs__grow would reserve */
    uint64_t empty = 0;
    for (const gs__region *r = a->regions; r; r = r->next)
      if (r->live == 0) empty += r->size;
    uint64_t fresh = a->cap > a->reserved ? a->cap - a->reserved + empty : empty;
    if (fresh > place) place = fresh;
  }
  st->largest_placeable = place < st->headroom ? place : st->headroom;
  st->headroom_fragmentation =
      st->headroom ? 1.0 - (double)st->largest_placeable / (double)st->headroom : 0.0;
}

int gs_alloc_malloc(gs_alloc *a, size_t bytes, const gs_alloc_tag *tag, void **out,
                    gs_alloc_failure *why) {
  if (!a || !out) return -EINVAL;
  *out = NULL;
  const char *layer = tag && tag->layer ? tag->layer : GS__UNTAGGED;
  gs_role role = tag ? tag->role : GS_ROLE_WORKSPACE;
  if ((unsigned)role >= GS_ROLE_COUNT) return -EINVAL;
  size_t need = gs_alloc_block_size(bytes);

  pthread_mutex_lock(&a->mu);
  gs_oom_cause cause = GS_OOM_QUOTA;
  /* QUOTA: larger than what the limit leaves (a PREALLOCATE vdev whose
   * limit was lowered may hold free reserved bytes past it). */
  if (need == 0 || need > a->cap || need > a->cap - a->in_use) goto fail;
  gs__tagent *t = gs__tag_intern(a, layer, role);
  /* Two headers: a new region's free block (gs__grow) and the split's
   * remainder below can both be taken by this one call. */
  if (!t || gs__pool_ensure(a, 2) < 0) {
    cause = GS_OOM_PHYSICAL; /* the host has no memory for bookkeeping */
    goto fail;
  }
  gs__block *blk = gs__bin_find(a, need);
  if (!blk) {
    if (gs__grow(a, need, &cause) < 0) goto fail;
    blk = gs__bin_find(a, need);
  }

  gs__bin_remove(a, blk);
  if (blk->size > need) { /* split: the remainder is >= GS_ALLOC_ALIGN */
    gs__block *rest = gs__hdr_get(a);
    rest->addr = blk->addr + need;
    rest->size = blk->size - need;
    rest->region = blk->region;
    rest->is_free = true;
    rest->prev = blk;
    rest->next = blk->next;
    if (blk->next) blk->next->prev = rest;
    blk->next = rest;
    blk->size = need;
    gs__bin_insert(a, rest);
  }
  blk->is_free = false;
  blk->tag = t;
  t->bytes += need;
  blk->region->live++;
  gs__hash_insert(a, blk);
  a->in_use += need;
  if (a->in_use > a->peak_in_use) a->peak_in_use = a->in_use;
  a->allocations++;
  a->live_blocks++;
  pthread_mutex_unlock(&a->mu);
  *out = (void *)blk->addr;
  return 0;

fail:
  if (why) {
    why->cause = cause;
    why->requested = need ? need : bytes;
    gs__stats_locked(a, &why->stats);
  }
  pthread_mutex_unlock(&a->mu);
  return -ENOMEM;
}

static void gs__free_locked(gs_alloc *a, gs__block *blk) {
  blk->tag->bytes -= blk->size;
  blk->tag = NULL;
  blk->is_free = true;
  blk->region->live--;
  a->in_use -= blk->size;
  a->frees++;
  a->live_blocks--;

  gs__block *prev = blk->prev, *next = blk->next;
  if (next && next->is_free) { /* absorb the right neighbour */
    gs__bin_remove(a, next);
    blk->size += next->size;
    blk->next = next->next;
    if (next->next) next->next->prev = blk;
    gs__hdr_put(a, next);
  }
  if (prev && prev->is_free) { /* the left neighbour absorbs this block */
    gs__bin_remove(a, prev);
    prev->size += blk->size;
    prev->next = blk->next;
    if (blk->next) blk->next->prev = prev;
    gs__hdr_put(a, blk);
    blk = prev;
  }
  gs__bin_insert(a, blk);
}

void gs_alloc_free(gs_alloc *a, void *p) {
  if (!p) return;
  pthread_mutex_lock(&a->mu);
  gs__block *blk = gs__hash_take(a, (uintptr_t)p);
  if (!blk) {
    fprintf(stderr,
            "gpushare alloc: free of %p, which is not a live block of allocator %p "
            "(a pointer from elsewhere, or freed twice)\n",
            p, (void *)a);
    abort();
  }
  gs__free_locked(a, blk);
  pthread_mutex_unlock(&a->mu);
}

void gs_alloc_free_all(gs_alloc *a) {
  pthread_mutex_lock(&a->mu);
  for (size_t i = 0; i < ((size_t)1 << a->hash_bits); i++) {
    while (a->hash[i]) {
      gs__block *blk = a->hash[i];
      a->hash[i] = blk->hnext;
      blk->hnext = NULL;
      gs__free_locked(a, blk);
    }
  }
  pthread_mutex_unlock(&a->mu);
}

int gs_alloc_set_limit(gs_alloc *a, uint64_t limit) {
  uint64_t cap = limit & ~(uint64_t)(GS_ALLOC_ALIGN - 1);
  if (cap == 0 || cap > SIZE_MAX) return -EINVAL;
  int rc = 0;
  pthread_mutex_lock(&a->mu);
  if (cap < a->in_use) {
    rc = -EBUSY;
    goto out;
  }
  if (a->policy == GS_POLICY_GROWTH && cap < a->reserved) {
    gs__trim_locked(a);
    if (cap < a->reserved) {
      rc = -EBUSY;
      goto out;
    }
  }
  if (a->policy == GS_POLICY_PREALLOCATE && cap > a->reserved &&
      (rc = gs__region_add(a, (size_t)(cap - a->reserved))) < 0)
    goto out;
  a->limit = limit;
  a->cap = cap;
  a->peak_in_use = a->in_use;
  a->peak_reserved = a->reserved;
out:
  pthread_mutex_unlock(&a->mu);
  return rc;
}

void gs_alloc_trim(gs_alloc *a) {
  pthread_mutex_lock(&a->mu);
  if (a->policy == GS_POLICY_GROWTH) gs__trim_locked(a);
  pthread_mutex_unlock(&a->mu);
}

void gs_alloc_stats_get(gs_alloc *a, gs_alloc_stats *st) {
  pthread_mutex_lock(&a->mu);
  gs__stats_locked(a, st);
  pthread_mutex_unlock(&a->mu);
}

void gs_alloc_reset_peak(gs_alloc *a) {
  pthread_mutex_lock(&a->mu);
  a->peak_in_use = a->in_use;
  a->peak_reserved = a->reserved;
  pthread_mutex_unlock(&a->mu);
}

void gs_alloc_foreach_tag(gs_alloc *a,
                          void (*fn)(void *u, const char *layer, gs_role role, uint64_t bytes),
                          void *u) {
  pthread_mutex_lock(&a->mu);
  for (size_t i = 0; i < ((size_t)1 << a->tag_bits); i++)
    for (gs__tagent *t = a->tags[i]; t; t = t->next)
      if (t->bytes) fn(u, t->layer, t->role, t->bytes);
  pthread_mutex_unlock(&a->mu);
}
