/*
 * rpc_jobs.h: the job calls, and the watch streams they open.
 */
#ifndef GS_RPC_JOBS_H
#define GS_RPC_JOBS_H

#include "control/call.h"

int gs_rpc_plan(call_ctx *c, const Gpushare__V1__Request *rq, gs_err *e);
int gs_rpc_submit(call_ctx *c, const Gpushare__V1__Request *rq, gs_err *e);
int gs_rpc_job_status(call_ctx *c, const Gpushare__V1__Request *rq, gs_err *e);
int gs_rpc_list_jobs(call_ctx *c, const Gpushare__V1__Request *rq, gs_err *e);
int gs_rpc_watch(call_ctx *c, const Gpushare__V1__Request *rq, gs_err *e);
int gs_rpc_cancel(call_ctx *c, const Gpushare__V1__Request *rq, gs_err *e);
int gs_rpc_logs(call_ctx *c, const Gpushare__V1__Request *rq, gs_err *e);
int gs_rpc_fetch(call_ctx *c, const Gpushare__V1__Request *rq, gs_err *e);
int gs_rpc_memory(call_ctx *c, const Gpushare__V1__Request *rq, gs_err *e);

/* Drop every watch stream (at exit; a closing connection drops its own). */
void gs_rpc_jobs_free(gs_daemon *d);

#endif
