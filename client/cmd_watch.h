/*
 * cmd_watch.h: following a job (cmd_watch.c): the watch command, and the watch loop
 * and event lines that submit --watch and logs use.
 */
#ifndef GPUCTL_CMD_WATCH_H
#define GPUCTL_CMD_WATCH_H

#include <stddef.h>
#include <stdint.h>

#include "client/gpuctl.h"

gpuctl_cmd_fn gpuctl_cmd_watch;
/* Follow job id to its end; 0 only when it SUCCEEDED. */
int gpuctl_watch_job(gpuctl_cli *x, uint64_t id);
/* One line describing an event, into buf. */
void gpuctl_event_line(const Gpushare__V1__JobEvent *ev, char *buf, size_t n);

#endif
