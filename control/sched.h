/*
 * sched.h: the scheduler, a pure function.
 *
 * In: the jobs that are QUEUED or RUNNING (vdev, tenant, priority, age,
 * planned peak, the host bytes of their datasets), the vdevs (memory limit,
 * whether their device's executor is up to take a job, whether their
 * memory is host memory), the tenants' quotas (max_running). Out:
 * for each queued job, whether it starts now or why it waits. No store, no
 * loop, no I/O: exec_events.c gathers the inputs, calls gs_sched_run and
 * starts what it says.
 *
 * The rule: each vdev's queue runs by priority (higher first), then submit
 * time, then id. Its jobs start while what the vdev's running jobs hold
 * plus what the next one adds fits the vdev's memory limit, and the tenant
 * is under max_running (counted over all its vdevs, the jobs
 * started in this same run included). The first job of a queue that must
 * wait blocks the ones behind it, so a large job is never starved by
 * smaller later ones. Vdevs are taken in the order given.
 *
 * Preemption: when the head of a vdev's queue waits for memory, the
 * running jobs of that vdev that may be stopped for it are those marked
 * preemptible, of a lower priority, that have run at least min_run_s in
 * their current run and were not preempted in the last interval_s. Taken
 * lowest priority first, then the most recently started, until the head
 * fits; then each one the head fits without is given back (so the fewest
 * are stopped). Those get GS_SCHED_PREEMPT (for_job names the head), the
 * head waits with GS_SCHED_WAIT_PREEMPTING, and while any job of the vdev
 * is stopping (its pause sent, its memory not yet free) no more are
 * chosen. A head that cannot fit even so waits for memory.
 *
 * A job that met a full device (physical_wait: requeued after a PHYSICAL
 * OOM on an oversubscribed device) starts, once it is its vdev's turn,
 * only when its device_bytes fit beside the device's fixed bytes and the
 * device_bytes of all running jobs of its vdevs within its usable bytes;
 * if not, running jobs of that device that hold device_bytes may be
 * preempted for it, chosen as above (from any of its vdevs), else it waits
 * with GS_SCHED_WAIT_DEVICE.
 *
 * What a vdev's jobs hold: their planned peaks, and their datasets' host
 * bytes, counted once per data key (jobs of a vdev that train on the same
 * datasets share one copy in the executor). On the cpu device both are
 * host memory and share the memory limit; on a GPU the peaks go against
 * the limit and the host data against a bound of the same size.
 */
#ifndef GS_SCHED_H
#define GS_SCHED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"

typedef enum gs_sched_state { GS_SCHED_QUEUED, GS_SCHED_RUNNING } gs_sched_state;

typedef struct gs_sched_job {
  uint64_t id;
  const char *tenant;
  const char *vdev;
  gs_sched_state state;
  int32_t priority;        /* higher runs first */
  int64_t submitted;       /* unix seconds; earlier runs first at equal priority */
  uint64_t planned_peak;   /* bytes the job holds in its vdev */
  uint64_t data_bytes;     /* host bytes of its datasets, once loaded */
  uint64_t data_key;       /* jobs with one key in one vdev hold one copy */
  bool preemptible;        /* RUNNING: may be stopped for a higher-priority job */
  int64_t run_started;     /* RUNNING: unix seconds its current run began */
  int64_t last_preempted;  /* unix seconds it was last preempted (0: never) */
  bool stopping;           /* RUNNING: asked to pause; its memory is not free yet */
  bool physical_wait;      /* QUEUED after a PHYSICAL OOM: starts when its device has room */
  uint64_t device_bytes;   /* what its vdev may reserve from the device for it (GROWTH:
                            * regions double, so up to about twice its peak, within the
                            * vdev's limit; 0 in a PREALLOCATE vdev, whose region is held
                            * whether jobs run or not) */
} gs_sched_job;

typedef struct gs_sched_vdev {
  const char *name;
  uint64_t memory_limit;
  bool ready;              /* its device's executor is up and can take a job */
  bool data_in_memory;     /* host data counts in memory_limit (the cpu device) */
} gs_sched_vdev;

/* A physical device: the bytes its vdevs' jobs may hold in all. */
typedef struct gs_sched_device {
  const char *name;
  uint64_t usable;
  uint64_t fixed;          /* held whatever runs: its PREALLOCATE vdevs' limits */
} gs_sched_device;

typedef struct gs_sched_quota {
  const char *tenant;
  uint32_t max_running;    /* 0: no limit */
} gs_sched_quota;

typedef enum gs_sched_reason {
  GS_SCHED_START,          /* starts now */
  GS_SCHED_WAIT_MEMORY,    /* its peak (and data) do not fit beside the vdev's running jobs */
  GS_SCHED_WAIT_MAX_RUNNING, /* its tenant runs max_running jobs */
  GS_SCHED_WAIT_BEHIND,    /* a job ahead of it in the vdev's queue waits */
  GS_SCHED_WAIT_EXECUTOR,  /* the vdev's device has no executor up */
  GS_SCHED_WAIT_NO_VDEV,   /* its vdev does not exist */
  GS_SCHED_WAIT_NO_TENANT, /* its tenant has no quota row (deleted) */
  GS_SCHED_WAIT_PREEMPTING, /* lower-priority jobs of its vdev are being stopped for it */
  GS_SCHED_PREEMPT,        /* a RUNNING job: stop it (checkpointed) for for_job */
  GS_SCHED_WAIT_DEVICE,    /* met a full device; the running jobs there leave no room */
} gs_sched_reason;

typedef struct gs_sched_decision {
  uint64_t job;
  const char *vdev;        /* the job's vdev (borrowed from the input) */
  gs_sched_reason why;
  uint64_t for_job;        /* GS_SCHED_PREEMPT: the job it makes room for */
} gs_sched_decision;

typedef struct gs_sched_input {
  const gs_sched_job *jobs;
  size_t n_jobs;
  const gs_sched_vdev *vdevs;
  size_t n_vdevs;
  const gs_sched_quota *quotas;
  size_t n_quotas;
  int64_t now;             /* unix seconds, for the preemption guards */
  int64_t preempt_min_run_s;  /* a run this young is not preempted */
  int64_t preempt_interval_s; /* nor a job preempted this recently */
  const gs_sched_device *devices;
  size_t n_devices;
  const char *const *vdev_device; /* per vdevs[i], the name of its device (NULL: none given) */
} gs_sched_input;

/* One decision per queued job of in, and one per running job to preempt,
 * into out (room for in->n_jobs): the jobs that start first, in the order
 * they are to start, then the ones that wait and the ones to stop. *n_out is how many were written. 0, or -1 with e set (out of
 * memory). */
int gs_sched_run(const gs_sched_input *in, gs_sched_decision *out, size_t *n_out, gs_err *e);
/* A vdev's limit becomes vd->memory_limit while jobs[0..n) (its RUNNING
 * jobs) run: which of them keep running as they are. They are taken by
 * priority (higher first), then the oldest run first, then id, and kept
 * while they fit the new limit (peaks and data as gs_sched_run counts
 * them); keep[i] is false for each one that must be re-planned at its next
 * step boundary (a smaller micro-batch, or checkpointed and requeued). 0,
 * or a negative errno with e set (out of memory). */
int gs_sched_shrink(const gs_sched_job *jobs, size_t n, const gs_sched_vdev *vd, bool *keep,
                    gs_err *e);

/* What a run-time OOM does to a job. */
typedef enum gs_sched_oom {
  GS_SCHED_OOM_FAIL,       /* it ends FAILED with its OOM report */
  GS_SCHED_OOM_SMALLER,    /* it resumes from its checkpoint with a smaller micro-batch */
  GS_SCHED_OOM_REQUEUE,    /* it goes back to the queue and resumes as it was */
} gs_sched_oom;

typedef struct gs_sched_oom_in {
  int cause;               /* gpushare.v1.OomCause: 0 QUOTA, 1 PHYSICAL, 2 FRAGMENTATION */
  bool auto_fit;           /* the spec's */
  bool requeue;            /* the spec's on_oom is OOM_REQUEUE */
  uint32_t retries;        /* OOMs it came back from so far */
  uint32_t max_retries;    /* the daemon's oom_retries */
  uint32_t micro_batch;    /* what it ran with */
} gs_sched_oom_in;

/* The rule: a PHYSICAL OOM (another vdev holds the device) is requeued
 * whatever the spec says, as the memory may come back; with auto_fit, a
 * QUOTA or FRAGMENTATION OOM is retried with a smaller micro-batch while
 * retries < max_retries and the micro-batch is above 1; without, on_oom
 * REQUEUE requeues it while retries < max_retries; anything else fails. */
gs_sched_oom gs_sched_oom_decide(const gs_sched_oom_in *in);

/* The reason in words ("waits for memory: ..."), static text. */
const char *gs_sched_reason_text(gs_sched_reason why);

#endif
