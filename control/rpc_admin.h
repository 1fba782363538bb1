/*
 * rpc_admin.h: the calls about the machine and its division (devices,
 * tenants, quotas, vdevs, version, metrics).
 */
#ifndef GS_RPC_ADMIN_H
#define GS_RPC_ADMIN_H

#include "control/call.h"

int gs_rpc_version(call_ctx *c, const Gpushare__V1__Request *rq, gs_err *e);
int gs_rpc_list_devices(call_ctx *c, const Gpushare__V1__Request *rq, gs_err *e);
int gs_rpc_create_tenant(call_ctx *c, const Gpushare__V1__Request *rq, gs_err *e);
int gs_rpc_list_tenants(call_ctx *c, const Gpushare__V1__Request *rq, gs_err *e);
int gs_rpc_delete_tenant(call_ctx *c, const Gpushare__V1__Request *rq, gs_err *e);
int gs_rpc_set_quota(call_ctx *c, const Gpushare__V1__Request *rq, gs_err *e);
int gs_rpc_get_quota(call_ctx *c, const Gpushare__V1__Request *rq, gs_err *e);
int gs_rpc_create_vdev(call_ctx *c, const Gpushare__V1__Request *rq, gs_err *e);
int gs_rpc_list_vdevs(call_ctx *c, const Gpushare__V1__Request *rq, gs_err *e);
int gs_rpc_delete_vdev(call_ctx *c, const Gpushare__V1__Request *rq, gs_err *e);
int gs_rpc_metrics(call_ctx *c, const Gpushare__V1__Request *rq, gs_err *e);

#endif
