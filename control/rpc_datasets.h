/*
 * rpc_datasets.h: the dataset calls (uploads into the store's blobs, the
 * tenant's list, removal). Uploads in progress live in d->uploads, made at
 * the first upload; each ends with the connection that started it.
 */
#ifndef GS_RPC_DATASETS_H
#define GS_RPC_DATASETS_H

#include "control/call.h"

int gs_rpc_upload_dataset(gs_call *c, const Gpushare__V1__Request *rq, gs_err *e);
int gs_rpc_list_datasets(gs_call *c, const Gpushare__V1__Request *rq, gs_err *e);
int gs_rpc_remove_dataset(gs_call *c, const Gpushare__V1__Request *rq, gs_err *e);

/* Drop the uploads a closing connection had started (arg: the gs_daemon);
 * registered with gs_server_on_close. */
void gs_rpc_datasets_conn_closed(void *arg, gs_conn *conn);
/* Drop every upload in progress (at exit). */
void gs_rpc_datasets_free(gs_daemon *d);

#endif
