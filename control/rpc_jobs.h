/*
 * rpc_jobs.h: the job calls, and the watch streams they open.
 */
#ifndef GS_RPC_JOBS_H
#define GS_RPC_JOBS_H

#include "control/call.h"

int gs_rpc_plan(gs_call *c, const Gpushare__V1__Request *rq, gs_err *e);
int gs_rpc_submit(gs_call *c, const Gpushare__V1__Request *rq, gs_err *e);
int gs_rpc_job_status(gs_call *c, const Gpushare__V1__Request *rq, gs_err *e);
int gs_rpc_list_jobs(gs_call *c, const Gpushare__V1__Request *rq, gs_err *e);
int gs_rpc_watch(gs_call *c, const Gpushare__V1__Request *rq, gs_err *e);
int gs_rpc_cancel(gs_call *c, const Gpushare__V1__Request *rq, gs_err *e);
int gs_rpc_logs(gs_call *c, const Gpushare__V1__Request *rq, gs_err *e);
int gs_rpc_fetch(gs_call *c, const Gpushare__V1__Request *rq, gs_err *e);
int gs_rpc_memory(gs_call *c, const Gpushare__V1__Request *rq, gs_err *e);
/* Usage per tenant and job: an admin's of every tenant (or the one named),
 * a member's of its own tenant. */
int gs_rpc_usage(gs_call *c, const Gpushare__V1__Request *rq, gs_err *e);

/* Drop every watch stream (at exit; a closing connection drops its own). */
void gs_rpc_jobs_free(gs_daemon *d);

#endif
