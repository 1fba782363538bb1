/*
 * supervisor.h: the control plane's side of the executors.
 *
 * One executor process per device (gpushare-executor, beside gpushared),
 * started with uv_spawn and one end of a socketpair as its fd 3, speaking
 * proto/executor.proto with the control socket's framing. The supervisor
 * restarts an executor that dies, with exponential backoff (0.5 s doubling
 * to 30 s; reset once it has stayed up for a minute), and tells the job
 * layer what happened so it can resume or fail that executor's jobs. The
 * loop never blocks on an executor: writes are queued, reads are decoded as
 * they arrive.
 */
#ifndef GS_SUPERVISOR_H
#define GS_SUPERVISOR_H

#include <stdbool.h>
#include <stdint.h>

#include "control/daemon.h"
#include "proto/executor.pb-c.h"

typedef struct gs_executor gs_executor;

typedef struct gs_supervisor_events {
  void (*ready)(gs_daemon *d, gs_executor *x);
  void (*message)(gs_daemon *d, gs_executor *x, const Gpushare__Exec__V1__FromExecutor *m);
  /* The process exited or its socket broke; `why` is human text
   * ("killed by signal 9", "exited with status 1"). `planned` when we asked
   * it to stop. */
  void (*died)(gs_daemon *d, gs_executor *x, const char *why, bool planned);
} gs_supervisor_events;

/* Start the executor for device `device` (index into d->devices). */
/* The gpushare-executor program: $GS_EXECUTOR, else beside gpushared. */
const char *gs_supervisor_path(char *buf, size_t len);

int gs_supervisor_start(gs_daemon *d, size_t device, const gs_supervisor_events *ev,
                      gs_executor **out, gs_err *e);
/* Queue one message: 0, -EAGAIN when the executor is not running (the
 * caller keeps the job pending and sends it again after `ready`), -ENOMEM
 * or -EIO. */
int gs_supervisor_send(gs_executor *x, const Gpushare__Exec__V1__ToExecutor *m);
bool gs_supervisor_ready(const gs_executor *x);
const char *gs_supervisor_device(const gs_executor *x);
size_t gs_supervisor_device_index(const gs_executor *x);
int gs_supervisor_pid(const gs_executor *x);
uint32_t gs_supervisor_restarts(const gs_executor *x);
/* Ask it to checkpoint its jobs and exit (Shutdown); no restart after. */
void gs_supervisor_stop(gs_executor *x);
/* Free once the process is gone (after died with planned). */
void gs_supervisor_free(gs_executor *x);

#endif
