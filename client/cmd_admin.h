/*
 * cmd_admin.h: the admin commands of gpuctl (cmd_admin.c): devices, vdevs, tenants,
 * quotas, the daemon itself; and the delete call dataset rm shares.
 */
#ifndef GPUCTL_CMD_ADMIN_H
#define GPUCTL_CMD_ADMIN_H

#include "client/gpuctl.h"

gpuctl_cmd_fn gpuctl_cmd_devices, gpuctl_cmd_slurm_gres, gpuctl_cmd_vdev_create, gpuctl_cmd_vdev_list, gpuctl_cmd_vdev_delete,
    gpuctl_cmd_vdev_set,
    gpuctl_cmd_tenant_create, gpuctl_cmd_tenant_list, gpuctl_cmd_tenant_delete, gpuctl_cmd_quota_set,
    gpuctl_cmd_quota_show, gpuctl_cmd_metrics, gpuctl_cmd_version;
/* Make a delete call; on success say "WHAT NAME deleted". */
int gpuctl_delete(gpuctl_cli *x, Gpushare__V1__Request *req, int result_case, const char *what,
                  const char *name);

#endif
