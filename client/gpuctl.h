/*
 * gpuctl.h: what the files of gpuctl, the command line, share.
 *
 * gpuctl is one program in several files: cli.c reads the command line and
 * runs one command; cmd_admin.c, cmd_dataset.c, cmd_job.c and cmd_watch.c
 * hold the commands; table.c and pbjson.c print their results as text or
 * JSON. This header is the vocabulary between them: the context a command
 * runs in (gpuctl_cli), its parsed arguments (gpuctl_parsed), the exit
 * statuses, and the commands' entry points, which cli.c's command table
 * names. Every name here starts with gpuctl_ (GPUCTL_ for macros); what one
 * file lends the others through its own header starts with that file's name
 * (cli_, table_, pbjson_), and what serves one file only is static there.
 */
#ifndef GPUCTL_H
#define GPUCTL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "gs_client.h"

#define GPUCTL_EXIT_OK 0
#define GPUCTL_EXIT_FAIL 1  /* refused by the daemon, or failed */
#define GPUCTL_EXIT_USAGE 2 /* the command line is wrong; nothing was done */

#define GPUCTL_MAX_ARGS 128 /* positional arguments or values of one flag */
#define GPUCTL_MAX_FLAGS 8

/* A command's arguments, parsed against its flag table (cli.c): pos[] the
 * positional ones, val[i][] the values given for flag i of the table, in
 * the table's order. */
typedef struct gpuctl_parsed {
  const char *pos[GPUCTL_MAX_ARGS];
  int npos;
  const char *val[GPUCTL_MAX_FLAGS][GPUCTL_MAX_ARGS]; /* values given for flag i */
  int nval[GPUCTL_MAX_FLAGS];
} gpuctl_parsed;

struct gpuctl_command; /* a row of cli.c's command table */

/* The context of one run of gpuctl. */
typedef struct gpuctl_cli {
  const char *socket; /* --socket, or NULL for the default */
  int json;           /* --json */
  gs_client *c;       /* connected on first use */
  const struct gpuctl_command *cmd;
} gpuctl_cli;

/* Declare Request `var` whose call is `field`, with its message
 * `field##_msg` initialised, on the stack. */
#define GPUCTL_REQ(var, field, CASE, Type, INIT) \
  Gpushare__V1__Request var = GPUSHARE__V1__REQUEST__INIT; \
  Type field##_msg = INIT; \
  var.call_case = GPUSHARE__V1__REQUEST__CALL_##CASE; \
  var.field = &field##_msg

/* A command: runs with its arguments parsed and checked, returns the exit
 * status. */
typedef int gpuctl_cmd_fn(gpuctl_cli *x, gpuctl_parsed *p);

/* cmd_admin.c: devices, vdevs, tenants, quotas, the daemon itself. */
gpuctl_cmd_fn gpuctl_cmd_devices, gpuctl_cmd_vdev_create, gpuctl_cmd_vdev_list, gpuctl_cmd_vdev_delete,
    gpuctl_cmd_tenant_create, gpuctl_cmd_tenant_list, gpuctl_cmd_tenant_delete, gpuctl_cmd_quota_set,
    gpuctl_cmd_quota_show, gpuctl_cmd_metrics, gpuctl_cmd_version;
/* Make a delete call; on success say "WHAT NAME deleted". */
int gpuctl_delete(gpuctl_cli *x, Gpushare__V1__Request *req, int result_case, const char *what,
                  const char *name);

/* cmd_dataset.c: the dataset store, and the datasets a job spec names. */
gpuctl_cmd_fn gpuctl_cmd_dataset_add, gpuctl_cmd_dataset_list, gpuctl_cmd_dataset_rm;
/* Rewrite the idx paths of spec's datasets to "sha256:HEX"; with upload,
 * first make sure the store holds their bytes. Needs a connection. */
int gpuctl_resolve_spec(gpuctl_cli *x, Gpushare__V1__JobSpec *spec, int upload);
/* The part of path after its last '/'. */
const char *gpuctl_base_name(const char *path);

/* cmd_job.c: job specs and jobs. */
gpuctl_cmd_fn gpuctl_cmd_job_encode, gpuctl_cmd_job_show, gpuctl_cmd_plan, gpuctl_cmd_submit, gpuctl_cmd_status,
    gpuctl_cmd_list, gpuctl_cmd_cancel, gpuctl_cmd_logs, gpuctl_cmd_fetch, gpuctl_cmd_memory;
/* An OomReport as a reader wants it. */
void gpuctl_oom_print(FILE *f, const Gpushare__V1__OomReport *o);

/* cmd_watch.c: following a job. */
gpuctl_cmd_fn gpuctl_cmd_watch;
/* Follow job id to its end; 0 only when it SUCCEEDED. */
int gpuctl_watch_job(gpuctl_cli *x, uint64_t id);
/* One line describing an event, into buf. */
void gpuctl_event_line(const Gpushare__V1__JobEvent *ev, char *buf, size_t n);

#endif
