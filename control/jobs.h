/*
 * jobs.h: jobs in the control plane: submit and admission, the per-vdev
 * queues (sched), the executors that run them, watchers, crash recovery,
 * and metrics.
 *
 * A job accepted is a job kept: submit writes the job (QUEUED) in one
 * store transaction before it answers. At start, every RUNNING job of the
 * store is resumed from its checkpoint and every QUEUED job is queued
 * again. The loop never waits on a job: executors report progress and
 * results as messages.
 */
#ifndef GS_JOBS_H
#define GS_JOBS_H

#include "control/rpc_internal.h"

/* Load the jobs of the store, start one executor per device. */
int gs_jobs_init(gs_daemon *d, gs_err *e);
/* SIGTERM: executors checkpoint their running jobs and exit; the loop ends
 * once they have. */
void gs_jobs_shutdown(gs_daemon *d);
void gs_jobs_free(gs_daemon *d);

/* Vdevs were created or deleted: tell the executors, run the queues. */
void gs_jobs_vdevs_changed(gs_daemon *d);
/* A connection closed: forget its watchers. */
void gs_jobs_conn_closed(gs_daemon *d, const gs_conn *conn);
/* A job that has not ended and uses the dataset blob (0: none). */
uint64_t gs_jobs_using_blob(gs_daemon *d, const char *sha256);

int gs_rpc_plan(call_ctx *c, const Gpushare__V1__Request *rq, gs_err *e);
int gs_rpc_submit(call_ctx *c, const Gpushare__V1__Request *rq, gs_err *e);
int gs_rpc_job_status(call_ctx *c, const Gpushare__V1__Request *rq, gs_err *e);
int gs_rpc_list_jobs(call_ctx *c, const Gpushare__V1__Request *rq, gs_err *e);
int gs_rpc_watch(call_ctx *c, const Gpushare__V1__Request *rq, gs_err *e);
int gs_rpc_cancel(call_ctx *c, const Gpushare__V1__Request *rq, gs_err *e);
int gs_rpc_logs(call_ctx *c, const Gpushare__V1__Request *rq, gs_err *e);
int gs_rpc_fetch(call_ctx *c, const Gpushare__V1__Request *rq, gs_err *e);
int gs_rpc_memory(call_ctx *c, const Gpushare__V1__Request *rq, gs_err *e);
int gs_rpc_metrics(call_ctx *c, const Gpushare__V1__Request *rq, gs_err *e);

/* Live memory of a vdev as its executor last reported (0s when idle). */
void gs_jobs_vdev_memory(gs_daemon *d, const char *vdev, uint64_t *in_use, uint64_t *reserved,
                         uint64_t *peak);

#endif
