/*
 * fairshare.c: stride scheduling of one device's time across its vdevs.
 *
 * The policy is described in fairshare.h. The mechanism: one mutex guards
 * every slot, one condition variable (on CLOCK_MONOTONIC) wakes the waiters.
 * A job in acquire takes a ticket of its vdev and waits until (1) the device
 * is free, (2) its ticket is the one its vdev serves next, and (3) choose()
 * names its vdev. choose() looks at the active vdevs (a job joined) that
 * either have a job waiting or released the device less than `grace` ago,
 * and picks the smallest virtual time; when the pick is a vdev still inside
 * its grace, the waiters sleep until that grace ends (or until it comes back
 * and takes its turn). Before that, the vdev holding the current slice
 * keeps the device while it is a candidate and its slice has time left; a
 * grant to any vdev outside a running slice starts a new slice. A leave, a
 * share change and a removal broadcast; a release broadcasts only when
 * choose() then names a vdev with a job waiting, that is when a waiter can
 * take the device now. Inside a slice the releasing vdev keeps its claim,
 * so waking the other vdevs' jobs on each of its steps only had them
 * re-check, sleep again and take cores from the step in flight (four jobs
 * on four vdevs of the cpu device: 12 context switches a step against 2.5
 * for one job alone). Every wait is timed instead: a grace that runs out is
 * seen by the timed wait, and a waiter re-checks at least every
 * max(grace, 10 ms) whatever else happened. Slots live in an array of
 * pointers so a job's slot index stays valid while SetVdevs adds others.
 */
#include "executor/fairshare.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>

typedef struct fs_slot {
  bool used;             /* a vdev holds this slot */
  uint32_t share;        /* weight, >= 1 */
  double vt;             /* virtual time */
  double device_seconds; /* accounted device time */
  uint64_t steps;        /* releases */
  uint32_t jobs;         /* joined jobs */
  uint32_t waiting;      /* jobs blocked in acquire */
  uint64_t next_ticket;  /* ticket the next acquire of this vdev takes */
  uint64_t serving;      /* ticket that may take the vdev's next turn */
  double last_release;   /* monotonic seconds of the last release; -INFINITY: none */
} fs_slot;

struct gs_fairshare {
  pthread_mutex_t lock;
  pthread_cond_t cond;   /* on CLOCK_MONOTONIC */
  fs_slot **slots;       /* cap entries; NULL past n */
  int n, cap;            /* slots created so far, array size */
  bool busy;             /* a step is on the device */
  double grace;          /* seconds a vdev keeps its claim after a release */
  double slice;          /* device seconds a vdev keeps the device for */
  int current;           /* the vdev whose slice runs; -1: none */
  double slice_used;     /* device seconds of the current slice so far */
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int gs_fairshare_create(double grace_seconds, double slice_seconds, gs_fairshare **out) {
  *out = NULL;
  gs_fairshare *fs = calloc(1, sizeof *fs);
  if (!fs) return -ENOMEM;
  pthread_condattr_t ca;
  if (pthread_condattr_init(&ca)) goto fail_free;
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  int rc = pthread_cond_init(&fs->cond, &ca);
  pthread_condattr_destroy(&ca);
  if (rc) goto fail_free;
  if (pthread_mutex_init(&fs->lock, NULL)) goto fail_cond;
  fs->grace = grace_seconds > 0 && isfinite(grace_seconds) ? grace_seconds : 0;
  fs->slice = slice_seconds > 0 && isfinite(slice_seconds) ? slice_seconds : 0;
  fs->current = -1;
  *out = fs;
  return 0;
fail_cond:
  pthread_cond_destroy(&fs->cond);
fail_free:
  free(fs);
  return -ENOMEM;
}

void gs_fairshare_destroy(gs_fairshare *fs) {
  if (!fs) return;
  for (int i = 0; i < fs->n; i++) free(fs->slots[i]);
  free(fs->slots);
  pthread_mutex_destroy(&fs->lock);
  pthread_cond_destroy(&fs->cond);
  free(fs);
}

static fs_slot *slot_at(gs_fairshare *fs, int slot) {
  if (slot < 0 || slot >= fs->n || !fs->slots[slot]->used) return NULL;
  return fs->slots[slot];
}

int gs_fairshare_add(gs_fairshare *fs, uint32_t share, int *slot) {
  int rc = 0;
  pthread_mutex_lock(&fs->lock);
  int idx = -1;
  for (int i = 0; i < fs->n; i++)
    if (!fs->slots[i]->used) {
      idx = i;
      break;
    }
  if (idx < 0) {
    if (fs->n == fs->cap) {
      int cap = fs->cap ? fs->cap * 2 : 8;
      fs_slot **grown = realloc(fs->slots, (size_t)cap * sizeof *grown);
      if (!grown) {
        rc = -ENOMEM;
        goto out;
      }
      fs->slots = grown;
      fs->cap = cap;
    }
    fs_slot *s = calloc(1, sizeof *s);
    if (!s) {
      rc = -ENOMEM;
      goto out;
    }
    idx = fs->n;
    fs->slots[fs->n++] = s;
  }
  fs_slot *s = fs->slots[idx];
  *s = (fs_slot){.used = true, .share = share ? share : 1, .last_release = -INFINITY};
  *slot = idx;
out:
  pthread_mutex_unlock(&fs->lock);
  return rc;
}

int gs_fairshare_set_share(gs_fairshare *fs, int slot, uint32_t share) {
  pthread_mutex_lock(&fs->lock);
  fs_slot *s = slot_at(fs, slot);
  if (s) s->share = share ? share : 1;
  pthread_cond_broadcast(&fs->cond);
  pthread_mutex_unlock(&fs->lock);
  return s ? 0 : -ENOENT;
}

int gs_fairshare_remove(gs_fairshare *fs, int slot) {
  int rc = 0;
  pthread_mutex_lock(&fs->lock);
  fs_slot *s = slot_at(fs, slot);
  if (!s)
    rc = -ENOENT;
  else if (s->jobs)
    rc = -EBUSY;
  else
    s->used = false;
  if (rc == 0 && fs->current == slot) fs->current = -1;
  pthread_cond_broadcast(&fs->cond);
  pthread_mutex_unlock(&fs->lock);
  return rc;
}

void gs_fairshare_join(gs_fairshare *fs, int slot) {
  pthread_mutex_lock(&fs->lock);
  fs_slot *s = slot_at(fs, slot);
  if (s && s->jobs++ == 0) {
    /* No credit for idling: start where the busiest-behind active vdev is. */
    double min_vt = INFINITY;
    for (int i = 0; i < fs->n; i++) {
      fs_slot *o = fs->slots[i];
      if (o != s && o->used && o->jobs && o->vt < min_vt) min_vt = o->vt;
    }
    if (isfinite(min_vt) && s->vt < min_vt) s->vt = min_vt;
  }
  pthread_mutex_unlock(&fs->lock);
}

void gs_fairshare_leave(gs_fairshare *fs, int slot) {
  pthread_mutex_lock(&fs->lock);
  fs_slot *s = slot_at(fs, slot);
  if (s && s->jobs) s->jobs--;
  pthread_cond_broadcast(&fs->cond);
  pthread_mutex_unlock(&fs->lock);
}

/* The vdev that should take the free device next, or -1 when the best
 * claim belongs to a vdev inside its grace (then *wake_at says until when
 * to wait). Among equal virtual times a vdev with a job waiting wins, then
 * the lower index. */
static int choose(gs_fairshare *fs, double now, double *wake_at) {
  if (fs->current >= 0 && fs->slice_used < fs->slice) {
    fs_slot *c = fs->slots[fs->current];
    if (c->used && (c->jobs || c->waiting)) {
      if (c->waiting) return fs->current;
      if (now - c->last_release < fs->grace) {
        *wake_at = c->last_release + fs->grace;
        return -1;
      }
    }
  }
  int best = -1;
  bool best_waiting = false;
  double best_vt = INFINITY;
  for (int i = 0; i < fs->n; i++) {
    fs_slot *s = fs->slots[i];
    if (!s->used || (!s->jobs && !s->waiting)) continue;
    bool waiting = s->waiting > 0;
    if (!waiting && !(now - s->last_release < fs->grace)) continue;
    if (s->vt < best_vt || (s->vt == best_vt && waiting && !best_waiting)) {
      best = i;
      best_vt = s->vt;
      best_waiting = waiting;
    }
  }
  if (best >= 0 && !best_waiting) {
    *wake_at = fs->slots[best]->last_release + fs->grace;
    return -1;
  }
  return best;
}

/* The longest a waiter sleeps before it looks again. */
static double recheck_s(const gs_fairshare *fs) { return fs->grace > 0.01 ? fs->grace : 0.01; }

static void wait_until(gs_fairshare *fs, double t) {
  struct timespec ts;
  double whole = floor(t);
  ts.tv_sec = (time_t)whole;
  ts.tv_nsec = (long)((t - whole) * 1e9);
  if (ts.tv_nsec >= 1000000000L) ts.tv_nsec = 999999999L;
  pthread_cond_timedwait(&fs->cond, &fs->lock, &ts);
}

void gs_fairshare_acquire(gs_fairshare *fs, int slot) {
  pthread_mutex_lock(&fs->lock);
  fs_slot *s = slot_at(fs, slot);
  if (!s) {
    /* Not a vdev of this device: a caller bug; still keep one step at a time. */
    while (fs->busy) wait_until(fs, now_s() + recheck_s(fs));
    fs->busy = true;
    pthread_mutex_unlock(&fs->lock);
    return;
  }
  uint64_t ticket = s->next_ticket++;
  s->waiting++;
  for (;;) {
    if (!fs->busy && s->serving == ticket) {
      double wake_at = 0;
      int pick = choose(fs, now_s(), &wake_at);
      if (pick == slot) break;
      if (pick < 0 && wake_at > 0) {
        wait_until(fs, wake_at);
        continue;
      }
    }
    wait_until(fs, now_s() + recheck_s(fs));
  }
  fs->busy = true;
  s->waiting--;
  s->serving++;
  if (fs->current != slot || fs->slice_used >= fs->slice) {
    fs->current = slot; /* a new slice */
    fs->slice_used = 0;
  }
  pthread_mutex_unlock(&fs->lock);
}

void gs_fairshare_release(gs_fairshare *fs, int slot, double elapsed_seconds) {
  double d = elapsed_seconds > 0 && isfinite(elapsed_seconds) ? elapsed_seconds : 0;
  pthread_mutex_lock(&fs->lock);
  fs_slot *s = slot_at(fs, slot);
  if (s) {
    s->device_seconds += d;
    s->steps++;
    s->vt += d * 100.0 / s->share;
    if (fs->current == slot) fs->slice_used += d;
    s->last_release = now_s();
  }
  fs->busy = false;
  double wake_at = 0;
  if (choose(fs, now_s(), &wake_at) >= 0) pthread_cond_broadcast(&fs->cond);
  pthread_mutex_unlock(&fs->lock);
}

int gs_fairshare_stats_get(gs_fairshare *fs, int slot, gs_fairshare_stats *st) {
  pthread_mutex_lock(&fs->lock);
  fs_slot *s = slot_at(fs, slot);
  if (s)
    *st = (gs_fairshare_stats){.share = s->share,
                               .device_seconds = s->device_seconds,
                               .steps = s->steps,
                               .vtime = s->vt,
                               .jobs = s->jobs,
                               .waiting = s->waiting};
  pthread_mutex_unlock(&fs->lock);
  return s ? 0 : -ENOENT;
}
