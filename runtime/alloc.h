/*
 * alloc.h: the vdev allocator. Every byte a job uses comes from here.
 *
 * A vdev is a slice of a device with a memory limit. Its allocator asks the
 * backend for regions (PREALLOCATE: one region of the whole limit at create;
 * GROWTH: regions on demand, each the smaller of twice the last region and
 * what the limit leaves) and sub-allocates tensors inside them: best-fit
 * size-class bins, split on allocation, coalesce on free, 256-byte alignment.
 * It never reserves past the limit: over quota is an error value, not a
 * crash. Each block carries a tag (layer, role), so an OOM can say what it
 * could not place and a memory report can say who holds the bytes.
 * Thread-safe: one mutex per allocator.
 */
#ifndef GS_ALLOC_H
#define GS_ALLOC_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/backend.h"

#define GS_ALLOC_ALIGN 256

typedef enum gs_alloc_policy {
  GS_POLICY_PREALLOCATE = 0, /* mirrors gpushare.v1.Policy */
  GS_POLICY_GROWTH = 1,
} gs_alloc_policy;

/* What a tensor is for; the planner counts bytes by the same roles. */
typedef enum gs_role {
  GS_ROLE_WEIGHTS = 0,    /* the working copy the forward pass reads (16-bit in mixed) */
  GS_ROLE_MASTER,         /* fp32 master weights (mixed precision only) */
  GS_ROLE_GRADIENTS,      /* fp32 weight/bias gradients */
  GS_ROLE_OPTIMIZER,      /* momentum, Adam m and v */
  GS_ROLE_ACTIVATIONS,    /* layer outputs saved for backward */
  GS_ROLE_WORKSPACE,      /* op scratch, activation gradients */
  GS_ROLE_BATCH,          /* input batch, labels, logits, losses */
  GS_ROLE_COUNT
} gs_role;

const char *gs_role_name(gs_role r); /* "weights", "master", ... */

typedef struct gs_alloc_tag {
  const char *layer; /* "dense_1", or "job" for job-wide buffers; copied */
  gs_role role;
} gs_alloc_tag;

typedef struct gs_alloc_stats {
  uint64_t limit;          /* the vdev's memory limit */
  uint64_t in_use;         /* bytes in live blocks (after alignment) */
  uint64_t peak_in_use;
  uint64_t reserved;       /* bytes in regions obtained from the backend */
  uint64_t peak_reserved;
  uint64_t allocations;    /* successful allocations so far */
  uint64_t frees;
  uint64_t live_blocks;
  uint64_t largest_free;   /* largest block that could be handed out now
                              without reserving (0 when none) */
  uint64_t total_free;     /* reserved - in_use */
  double fragmentation;    /* 1 - largest_free / total_free (0 when no free) */
  /* What the next allocations could get, device permitting: what the
   * live-reporting figures (gpuctl vdev list, metrics) show. */
  uint64_t headroom;       /* the limit (rounded down to 256) - in_use: bytes
                              that may still be in use at once */
  uint64_t largest_placeable; /* the largest block one allocation could get
                              now, at most headroom: PREALLOCATE, the largest
                              free block of its regions; GROWTH, the larger of
                              that and one new region of what the limit leaves
                              unreserved (the regions with no live block
                              counted as released), if the device gives it */
  double headroom_fragmentation; /* 1 - largest_placeable / headroom (0 when
                              headroom is 0): the share of the headroom no
                              single allocation can take */
} gs_alloc_stats;

/* Why an allocation failed; filled by gs_alloc_malloc on failure. */
typedef enum gs_oom_cause {
  GS_OOM_QUOTA = 0,         /* the limit does not leave room */
  GS_OOM_PHYSICAL = 1,      /* the backend could not reserve a region */
  GS_OOM_FRAGMENTATION = 2, /* enough free bytes, no block large enough */
} gs_oom_cause;

typedef struct gs_alloc_failure {
  gs_oom_cause cause;
  size_t requested;         /* bytes asked for (after alignment) */
  gs_alloc_stats stats;     /* the allocator at the moment of failure */
} gs_alloc_failure;

typedef struct gs_alloc gs_alloc;

/* Create an allocator of `limit` bytes on device `device_index` of `b`.
 * PREALLOCATE reserves the whole limit now (fails with -ENOMEM if the device
 * cannot give it). Returns 0 or a negative errno. */
int gs_alloc_create(gs_backend *b, int device_index, uint64_t limit,
                    gs_alloc_policy policy, gs_alloc **out);
/* Releases every region; live blocks are freed with it. */
void gs_alloc_destroy(gs_alloc *a);

/* Allocate `bytes` (0 is treated as 1) tagged with `tag`. Returns 0 and *out,
 * or -ENOMEM and, when `why` is not NULL, the cause and stats. */
int gs_alloc_malloc(gs_alloc *a, size_t bytes, const gs_alloc_tag *tag, void **out,
                    gs_alloc_failure *why);
/* NULL is a no-op; a pointer not from this allocator aborts (a bug). */
void gs_alloc_free(gs_alloc *a, void *p);
/* Free every live block (end of a job); regions stay reserved. */
void gs_alloc_free_all(gs_alloc *a);
/* Change the limit while blocks live. Lowering it is refused (-EBUSY)
 * while more than the new limit is in use, or, GROWTH, reserved once the
 * regions with no live block are released; a PREALLOCATE allocator keeps
 * its region and lets no more than the new limit be in use (the region
 * shrinks when the allocator is made again). Raising it takes effect at
 * once (PREALLOCATE reserves the difference as one more region: -ENOMEM
 * when the device cannot give it). The peaks restart from now. 0, or a
 * negative errno with the allocator unchanged. */
int gs_alloc_set_limit(gs_alloc *a, uint64_t limit);
/* GROWTH: release regions with no live block. PREALLOCATE: nothing. */
void gs_alloc_trim(gs_alloc *a);

void gs_alloc_stats_get(gs_alloc *a, gs_alloc_stats *st);
/* Reset peak_in_use / peak_reserved to the current values. */
void gs_alloc_reset_peak(gs_alloc *a);

/* Live bytes by (layer, role), for memory reports: calls fn once per
 * distinct (layer, role) pair with the bytes it holds now. */
void gs_alloc_foreach_tag(gs_alloc *a,
                          void (*fn)(void *u, const char *layer, gs_role role,
                                     uint64_t bytes),
                          void *u);

/* The block size gs_alloc_malloc charges for `bytes` (alignment rounding),
 * so the planner predicts exactly what the allocator will count. */
size_t gs_alloc_block_size(size_t bytes);

#endif
