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
/* One line describing an event of a job trained in `precision` (a
 * Precision, or -1 when not known: see table_fscale), into buf. */
void gpuctl_event_line(const Gpushare__V1__JobEvent *ev, int precision, char *buf, size_t n);
/* The width of the terminal on fd, for the live line: its TIOCGWINSZ size
 * when fd is a terminal that has one, else $COLUMNS, else 80. */
int gpuctl_term_width(int fd);
/* The Precision job id was submitted with, or -1 when it cannot be asked. */
int gpuctl_job_precision(gpuctl_cli *x, uint64_t id);

#endif
