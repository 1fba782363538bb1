/*
 * cmd_job.h: gpuctl's job commands (cmd_job.c): job specs, jobs and their usage.
 */
#ifndef GPUCTL_CMD_JOB_H
#define GPUCTL_CMD_JOB_H

#include <stdio.h>

#include "client/gpuctl.h"

gpuctl_cmd_fn gpuctl_cmd_job_encode, gpuctl_cmd_job_show, gpuctl_cmd_plan, gpuctl_cmd_submit, gpuctl_cmd_status,
    gpuctl_cmd_list, gpuctl_cmd_cancel, gpuctl_cmd_logs, gpuctl_cmd_fetch, gpuctl_cmd_memory, gpuctl_cmd_usage;

#endif
