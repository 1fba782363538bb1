/*
 * cmd_dataset.h: gpuctl's dataset commands (cmd_dataset.c), and the rewriting of the
 * datasets a job spec names, which plan and submit use.
 */
#ifndef GPUCTL_CMD_DATASET_H
#define GPUCTL_CMD_DATASET_H

#include "client/gpuctl.h"

gpuctl_cmd_fn gpuctl_cmd_dataset_add, gpuctl_cmd_dataset_list, gpuctl_cmd_dataset_rm;
/* Rewrite the idx paths of spec's datasets to "sha256:HEX"; with upload,
 * first make sure the store holds their bytes. Needs a connection. */
int gpuctl_resolve_spec(gpuctl_cli *x, Gpushare__V1__JobSpec *spec, int upload);
/* Does resolving spec with upload send a local file (an IDX path that is
 * a file here, not a sha256: reference or a stored dataset's name)? */
int gpuctl_spec_uploads(const Gpushare__V1__JobSpec *spec);
/* The part of path after its last '/'. */
const char *gpuctl_base_name(const char *path);

#endif
