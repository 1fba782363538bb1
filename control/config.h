/*
 * config.h: gpushared's configuration file.
 *
 * One flat file of `key = value` lines, read at start and again on SIGHUP.
 * Keys are the field names of gs_config, so the file, this header and
 * docs/operations.md name each setting the same way. A file is parsed into
 * a copy and applied only when every line is valid, so a typo in a reload
 * never leaves the daemon half reconfigured; the error names FILE:LINE, the
 * key, the value and what is allowed. Some settings (socket, state
 * directory, device sizes) are fixed once the daemon listens and owns its
 * devices: gs_config_restart_needed tells a reload which of them changed so
 * the daemon can say that a restart is needed instead of ignoring them
 * silently.
 */
#ifndef GS_CONFIG_H
#define GS_CONFIG_H

#include <limits.h>
#include <stdint.h>

#include "common/error.h"

/* The longest state directory: PATH_MAX less room for the longest name
 * gpushared makes under it (jobs/ID/checkpoint.ckpt.tmp,
 * datasets/SHA256, uploads/...), so every such path fits a PATH_MAX
 * buffer whole. */
#define GS_STATE_DIR_MAX (PATH_MAX - 256)

/* Read when gpushared is started without --config, at start and again at
   each SIGHUP; a missing file there means "all defaults" (gpushared.service
   starts the daemon this way). A file named with --config must exist, at a
   reload too. */
#define GS_CONFIG_DEFAULT_PATH "/etc/gpushared.conf"

typedef struct gs_config {
  char socket_path[108];     /* default: $GPUSHARE_SOCKET, else /run/gpushared.sock */
  char state_dir[GS_STATE_DIR_MAX]; /* default /var/lib/gpushared */
  char socket_group[64];     /* group owning the socket; default "gpushare" (if the group does not exist: keep the daemon's group and log) */
  unsigned socket_mode;      /* default 0660 */
  char admin_group[64];      /* default "gpushare-admin" */
  uint64_t cpu_memory;       /* usable bytes of the cpu device; 0 = default: half of RAM */
  uint64_t gpu_reserve;      /* bytes held back per GPU for contexts/cuBLAS; default 1 GiB */
  unsigned cpu_threads;      /* threads the cpu device may use in all; 0 = all cores */
  unsigned memory_oversubscribe; /* yes: GROWTH vdevs' limits may add up past a device's
                                    usable memory (a job then fails with an OOM report of
                                    cause PHYSICAL when the device runs out); default no */
  unsigned max_connections;  /* default 256 */
  unsigned max_connections_per_uid; /* of one uid that is not an admin; default 32 */
  unsigned admin_reserved_connections; /* the last of max_connections, for admins only;
                                          default 8, less than max_connections */
  unsigned max_inflight;     /* per connection; default 64 */
  unsigned idle_timeout_s;   /* default 600; 0 = never */
  unsigned idle_timeout_norole_s; /* for a peer neither admin nor in a tenant (the shorter
                                     of this and idle_timeout_s); default 10; 0 = never */
  unsigned frame_timeout_s;  /* from a frame's first byte to its last; default 10 */
  uint64_t max_frame;        /* default 16 MiB, at most 16 MiB */
  uint64_t max_pending_frame_bytes; /* held for partly received frames, all connections
                                       together; default 64 MiB, at least max_frame */
  uint64_t max_upload;       /* per dataset; default 1 GiB */
  uint64_t max_tenant_datasets; /* bytes of one tenant's datasets in all (each content once);
                                   default 16 GiB */
  uint64_t max_job_spec;     /* packed JobSpec of a submit or plan request; default 1 MiB */
  unsigned preempt_min_run_s; /* a run younger than this is not preempted; default 60 */
  unsigned preempt_interval_s; /* nor a job preempted less than this ago; default 300 */
  unsigned oom_retries;      /* run-time OOMs an auto_fit job comes back from; default 3 */
  char log_level[16];        /* error|warn|info|debug, default info */
} gs_config;

void gs_config_defaults(gs_config *c);
/* Parse a file of `key = value` lines (# comments, blank lines, keys as the
   field names above; sizes through gs_size_parse; modes in octal like 0660).
   On error: -1 and e names "FILE:LINE key" in field and the value and what is
   allowed in msg; c is left unchanged (parse into a copy). Unknown keys are errors,
   and so are two keys at odds (admin_reserved_connections not under
   max_connections, max_pending_frame_bytes under max_frame): the error then
   names the line of the one the file sets (the later one when it sets both).
   A file that cannot be opened: -1, errno kept, e->field the path and e->code
   GS_NOT_FOUND when it does not exist (so the caller can accept a missing
   GS_CONFIG_DEFAULT_PATH), GS_FAILED_PRECONDITION otherwise. */
int gs_config_load(const char *path, gs_config *c, gs_err *e);
/* Which keys SIGHUP can change live (admin_group, limits, log_level); the rest
   need a restart: returns a malloc'd text listing keys that differ and need a restart, or NULL. */
char *gs_config_restart_needed(const gs_config *old, const gs_config *neu);

#endif
