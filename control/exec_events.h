/*
 * exec_events.h: the executors as the job layer sees them: starting them,
 * what happens when one reports (progress, an epoch, a job finished, failed
 * or out of memory, the executor ready or dead), and carrying out the
 * scheduler's decisions on them.
 *
 * One executor per device (supervisor.c runs the processes). A job sent to
 * an executor is "placed"; when the executor dies, each placed job counts
 * the crash and goes back to "resume pending" (it stays RUNNING in the
 * store) to resume from its checkpoint once the executor is back; a job
 * placed during two executor deaths fails with the reason, so one bad job
 * cannot crash-loop a device. The loop never waits on a job: executors
 * report progress and results as messages.
 */
#ifndef GS_EXEC_EVENTS_H
#define GS_EXEC_EVENTS_H

#include <stdbool.h>
#include <stdint.h>

#include "common/error.h"
#include "control/daemon.h"
#include "control/job.h"
#include "control/store.h"

/* What a device's executor last reported of a vdev. */
typedef struct gs_vdev_live {
  uint64_t in_use, reserved, peak, steps;
  double device_seconds;
  uint32_t running;
  bool has_free;         /* the executor reported the next three (it has an allocator) */
  uint64_t free;         /* the limit less in_use */
  uint64_t largest_free; /* the largest one allocation could get now */
  double fragmentation;  /* 1 - largest_free / free, 0..1 */
} gs_vdev_live;

/* Start one executor per device (after gs_jobs_load). */
int gs_exec_events_init(gs_daemon *d, gs_err *e);
/* SIGTERM: executors checkpoint their running jobs and exit; the loop ends
 * once they have. No job starts after this. */
void gs_exec_events_shutdown(gs_daemon *d);
bool gs_exec_events_shutting_down(const gs_daemon *d);
void gs_exec_events_free(gs_daemon *d);

/* Run the queues (sched.c decides): resume what waits for its executor,
 * start the queued jobs the scheduler starts. Without executors (d->execs
 * NULL) nothing starts. */
void gs_exec_events_schedule(gs_daemon *d);
/* Vdevs were created or deleted: tell the executors, run the queues. */
void gs_exec_events_vdevs_changed(gs_daemon *d);
/* Cancel a job that has not ended: a placed one is asked to stop at its
 * next step (and ends when its executor says so), any other ends now. */
void gs_exec_events_cancel(gs_daemon *d, gs_job *j, const char *who);
/* Called once a second: runs the queues when a job requeued after an OOM
 * may start again. */
void gs_exec_events_tick(gs_daemon *d);

/* The least vdev v's running jobs can hold: their peaks at micro-batch 1
 * and their datasets (on the cpu device). 0 with *least, or a negative
 * errno with e set. */
int gs_exec_events_least_memory(gs_daemon *d, const gs_vdev *v, uint64_t *least, gs_err *e);
/* Vdev old became nv (stored already): the running jobs that no longer
 * fit nv's limit (sched.c's gs_sched_shrink) are paused at their next step
 * boundary, auto_fit ones to resume at once with a smaller micro-batch,
 * the others requeued PREEMPTED; waiting jobs that no longer fit even
 * alone are re-planned (auto_fit) or named; then the executors hear of the
 * change and the queues run (a larger vdev starts what now fits). One line per job
 * acted on goes to actions (each owned by the caller, freed with free()):
 * *n_actions of them. */
void gs_exec_events_vdev_resized(gs_daemon *d, const gs_vdev *old, const gs_vdev *nv,
                                 char ***actions, size_t *n_actions);

/* A vdev's live figures as its executor last reported (0s when idle). */
void gs_exec_events_vdev_live(const gs_daemon *d, const char *vdev, gs_vdev_live *out);
/* Restarts of the device's executor. */
uint32_t gs_exec_events_restarts(const gs_daemon *d, size_t device);

#endif
