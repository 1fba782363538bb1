/*
 * daemon.h: the control plane's state, owned by its loop thread.
 *
 * One gs_daemon per gpushared process: the configuration in force, the
 * store, the devices, the resolved admin group and the libuv loop, and a
 * pointer to each module's own state (opaque here). Only the loop thread
 * reads or writes it, so it needs no lock.
 */
#ifndef GS_DAEMON_H
#define GS_DAEMON_H

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "control/config.h"
#include "control/devices.h"
#include "control/store.h"

#define GS_VERSION "0.1.0"

typedef struct gs_server gs_server;
typedef struct gs_uploads gs_uploads;
typedef struct gs_jobs gs_jobs;
typedef struct gs_execs gs_execs;
typedef struct gs_watches gs_watches;
typedef struct gs_usage gs_usage;

typedef struct gs_daemon {
  gs_config cfg;            /* in force now (SIGHUP may replace the live keys) */
  char config_path[PATH_MAX];   /* the file read; "" when running on defaults */
  bool config_named;        /* --config named it, so it must exist at a reload too;
                               false: GS_CONFIG_DEFAULT_PATH, and a missing one means
                               defaults, at start and at a reload alike */
  gs_store *store;
  gs_devices devices;
  bool have_admin_gid;      /* false when cfg.admin_group does not exist */
  uint32_t admin_gid;
  uv_loop_t *loop;
  gs_server *server;
  uint64_t requests;        /* served since start, for the status line */
  gs_uploads *uploads;      /* dataset uploads in progress (rpc_datasets.c) */
  gs_jobs *jobs;            /* the job records (job.c) */
  gs_execs *execs;          /* the executors and their reports (exec_events.c) */
  gs_watches *watches;      /* watch streams (rpc_jobs.c) */
  gs_usage *usage;          /* what jobs and tenants used (usage.c) */
} gs_daemon;

#endif
