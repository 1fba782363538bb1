/*
 * fairshare.h: how the vdevs of one device share its time (compute shares).
 *
 * An executor runs the jobs of every vdev of its device as threads, but only
 * one optimizer step is on the device at a time, and that step has the
 * device's whole thread budget (CPU) or stream priority (GPU). Which job
 * steps next is decided here, per step, by stride scheduling with virtual
 * time, the way CFS and WFQ share a processor:
 *  - each vdev (a "slot") has a share (its compute_share, a weight) and a
 *    virtual time vt; a step of d seconds advances the vdev's vt by
 *    d * 100 / share, so a vdev with 3x the share advances 3x slower;
 *  - when the device is free, the vdev with the smallest vt among those with
 *    a job waiting goes next. Over any interval where several vdevs are busy
 *    their device seconds are in proportion to their shares;
 *  - work-conserving: a vdev with no job waiting never holds up the others.
 *    A job that just finished a step is between steps for microseconds
 *    (bookkeeping on the host); its vdev keeps its claim for `grace` seconds
 *    after each release, so that this gap does not hand the turn to the
 *    other vdev every time (which would make every share 1:1). A vdev that
 *    does not come back within the grace is treated as idle;
 *  - idling earns no credit: a vdev whose first job joins (or which comes
 *    back after having none) starts at the smallest vt of the vdevs already
 *    active, so it cannot take the device in a burst to "catch up";
 *  - jobs of one vdev take turns (FIFO tickets per vdev);
 *  - the device changes hands in slices: once a vdev has the device it keeps
 *    it for `slice` seconds of steps (while it has a job waiting) before the
 *    smallest virtual time is looked at again. Virtual time still counts
 *    every step, so the shares are the same; the slice only sets how often
 *    the device switches. A switch is not free: the job coming in finds its
 *    data out of the caches, and with one switch per step the vdev with the
 *    smaller share pays that on every one of its steps. The executor's 50 ms
 *    slice makes a switch cost one step in dozens; with steps longer than
 *    the slice it is the per-step schedule again.
 * Time is accounted per step from the elapsed seconds the caller measured,
 * so the scheduler itself never reads a step's duration from a clock; this
 * also lets the unit test drive it with simulated durations.
 *
 * Thread-safe: one mutex and one condition variable for the whole device.
 */
#ifndef GS_FAIRSHARE_H
#define GS_FAIRSHARE_H

#include <stdint.h>

typedef struct gs_fairshare gs_fairshare;

typedef struct gs_fairshare_stats {
  uint32_t share;        /* the weight (compute_share, percent) */
  double device_seconds; /* device time its steps used (sum of release's elapsed) */
  uint64_t steps;        /* releases so far */
  double vtime;          /* virtual time: device seconds * 100 / share, plus catch-ups */
  uint32_t jobs;         /* jobs joined now */
  uint32_t waiting;      /* jobs blocked in acquire now */
} gs_fairshare_stats;

/* A scheduler for one device. grace_seconds: how long after a release a vdev
 * keeps its claim on the next turn; slice_seconds: how much device time a
 * vdev gets before the turn is decided again (0: every step). See above; the
 * executor uses a grace of 50 ms and a slice of 50 ms; negative values are
 * taken as 0. Returns 0
 * or -ENOMEM. */
int gs_fairshare_create(double grace_seconds, double slice_seconds, gs_fairshare **out);
/* No job may be joined any more. NULL is a no-op. */
void gs_fairshare_destroy(gs_fairshare *fs);

/* A new vdev with `share` (0 is taken as 1): *slot is its index (slots of
 * removed vdevs are reused). Returns 0 or -ENOMEM. */
int gs_fairshare_add(gs_fairshare *fs, uint32_t share, int *slot);
/* Change a vdev's share; steps from now on accrue at the new rate.
 * Returns 0 or -ENOENT for a slot that is not in use. */
int gs_fairshare_set_share(gs_fairshare *fs, int slot, uint32_t share);
/* Forget a vdev. Returns 0, -ENOENT, or -EBUSY while a job is joined. */
int gs_fairshare_remove(gs_fairshare *fs, int slot);

/* A job of the vdev starts (join) or ends (leave). A job calls acquire and
 * release only between its join and its leave. */
void gs_fairshare_join(gs_fairshare *fs, int slot);
void gs_fairshare_leave(gs_fairshare *fs, int slot);

/* Block until it is this vdev's turn and this job's turn within it; the
 * caller then owns the device until release. */
void gs_fairshare_acquire(gs_fairshare *fs, int slot);
/* Give the device back after a step that took elapsed_seconds (negative or
 * NaN counts as 0). */
void gs_fairshare_release(gs_fairshare *fs, int slot, double elapsed_seconds);

/* A vdev's accounting now. Returns 0 or -ENOENT. */
int gs_fairshare_stats_get(gs_fairshare *fs, int slot, gs_fairshare_stats *st);

#endif
