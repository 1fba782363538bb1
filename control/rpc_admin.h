/*
 * rpc_admin.h: the calls about the machine and its division (devices,
 * tenants, quotas, vdevs, version, metrics).
 */
#ifndef GS_RPC_ADMIN_H
#define GS_RPC_ADMIN_H

#include "control/call.h"

int gs_rpc_version(gs_call *c, const Gpushare__V1__Request *rq, gs_err *e);
int gs_rpc_list_devices(gs_call *c, const Gpushare__V1__Request *rq, gs_err *e);
int gs_rpc_create_tenant(gs_call *c, const Gpushare__V1__Request *rq, gs_err *e);
int gs_rpc_list_tenants(gs_call *c, const Gpushare__V1__Request *rq, gs_err *e);
int gs_rpc_delete_tenant(gs_call *c, const Gpushare__V1__Request *rq, gs_err *e);
int gs_rpc_set_quota(gs_call *c, const Gpushare__V1__Request *rq, gs_err *e);
int gs_rpc_get_quota(gs_call *c, const Gpushare__V1__Request *rq, gs_err *e);
int gs_rpc_create_vdev(gs_call *c, const Gpushare__V1__Request *rq, gs_err *e);
int gs_rpc_list_vdevs(gs_call *c, const Gpushare__V1__Request *rq, gs_err *e);
int gs_rpc_delete_vdev(gs_call *c, const Gpushare__V1__Request *rq, gs_err *e);
int gs_rpc_update_vdev(gs_call *c, const Gpushare__V1__Request *rq, gs_err *e);
int gs_rpc_metrics(gs_call *c, const Gpushare__V1__Request *rq, gs_err *e);

#endif
