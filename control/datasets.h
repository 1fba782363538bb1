/*
 * datasets.h: the store's content-addressed dataset blobs, and the
 * resolution of a job's dataset references to those blobs.
 */
#ifndef GS_DATASETS_H
#define GS_DATASETS_H

#include <stddef.h>

#include "common/error.h"
#include "control/daemon.h"
#include "proto/gpushare.pb-c.h"

/* Create STATE_DIR/datasets and uploads/, and empty uploads/ (what a crash
 * cut off was never visible and is not kept). */
int gs_datasets_init(gs_daemon *d, gs_err *e);
/* STATE_DIR/sub. */
void gs_datasets_dir(const gs_daemon *d, const char *sub, char *buf, size_t len);

/* A job's reference ("sha256:HEX", or the name of one of the tenant's
 * datasets) to the blob's path; anything that looks like a client path is
 * refused, naming `field`. */
int gs_datasets_resolve(gs_daemon *d, const char *tenant, const char *ref, const char *field,
                        char *path, size_t len, gs_err *e);
/* A job's Dataset to the blob paths of its images and labels (an idx, npy
 * or named pair), of its stream in images and "" in labels (text, tokens),
 * or "" both (synthetic); errors name field.idx.images, field.text.path, ... */
int gs_datasets_resolve_set(gs_daemon *d, const char *tenant, const Gpushare__V1__Dataset *ds,
                            const char *field, char *images, char *labels, size_t len,
                            gs_err *e);
void gs_dataset_blob_path(const gs_daemon *d, const char *sha256, char *buf, size_t len);

#endif
