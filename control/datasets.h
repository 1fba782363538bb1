/*
 * datasets.h: uploads into the store's content-addressed blobs, and the
 * resolution of a job's dataset references to those blobs.
 */
#ifndef GS_DATASETS_H
#define GS_DATASETS_H

#include "control/rpc_internal.h"

/* Create STATE_DIR/datasets and uploads/, and empty uploads/ (what a crash
 * cut off was never visible and is not kept). */
int gs_datasets_init(gs_daemon *d, gs_err *e);
void gs_datasets_shutdown(gs_daemon *d);
/* Drop the uploads a closing connection had started. */
void gs_datasets_conn_closed(gs_daemon *d, const gs_conn *conn);

int gs_rpc_upload_dataset(call_ctx *c, const Gpushare__V1__Request *rq, gs_err *e);
int gs_rpc_list_datasets(call_ctx *c, const Gpushare__V1__Request *rq, gs_err *e);
int gs_rpc_remove_dataset(call_ctx *c, const Gpushare__V1__Request *rq, gs_err *e);

/* A job's reference ("sha256:HEX", or the name of one of the tenant's
 * datasets) to the blob's path; anything that looks like a client path is
 * refused, naming `field`. */
int gs_datasets_resolve(gs_daemon *d, const char *tenant, const char *ref, const char *field,
                        char *path, size_t len, gs_err *e);
void gs_dataset_blob_path(const gs_daemon *d, const char *sha256, char *buf, size_t len);

#endif
