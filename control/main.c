/*
 * main.c: gpushared, the control plane.
 *
 *   gpushared [--config F] [--socket P] [--state-dir D] [--foreground]
 *
 * Start-up order: configuration (defaults, then the file, then the command
 * line), the store (migrated), the devices, the socket (with gs_rpc_handle
 * as its dispatcher), the signals, the jobs of the store, the usage totals
 * of the store, the executors; then READY=1 to systemd and the loop.
 *
 * Signals are handled here: SIGTERM/SIGINT drain the server and stop the
 * executors (each checkpoints its running jobs); SIGHUP reloads the
 * configuration and tells the server its live limits changed. Nothing
 * calls up into this file. Without --foreground the daemon detaches and the
 * starting process exits 0 only once the socket answers, so a script can
 * call gpuctl right after it; its log goes to STATE_DIR/gpushared.log.
 *
 * Watchdog: when the service manager asks for one (WatchdogSec= in
 * gpushared.service sets WATCHDOG_USEC, and WATCHDOG_PID names the main
 * process), a timer on the loop sends WATCHDOG=1 at half that interval, as
 * sd_notify(3) recommends. The ping comes from the loop itself, so a loop
 * stuck in a callback stops pinging and systemd restarts the daemon; a
 * helper thread pinging on its own would hide exactly that hang.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <grp.h>
#include <inttypes.h>
#include <limits.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <time.h>

#include "common/size.h"
#include "control/config.h"
#include "control/daemon.h"
#include "control/datasets.h"
#include "control/devices.h"
#include "control/exec_events.h"
#include "control/job.h"
#include "control/log.h"
#include "control/notify.h"
#include "control/rpc.h"
#include "control/server.h"
#include "control/store.h"
#include "control/supervisor.h"
#include "control/usage.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: gpushared [--config FILE] [--socket PATH] [--state-dir DIR] [--foreground]\n"
          "\n"
          "The gpushare daemon: owns this machine's devices, splits them into quota-limited\n"
          "vdevs and serves gpuctl on a Unix socket.\n"
          "\n"
          "  --config FILE     configuration file (default " GS_CONFIG_DEFAULT_PATH
          ", if it exists)\n"
          "  --socket PATH     control socket (default $GPUSHARE_SOCKET, else "
          "/run/gpushared.sock)\n"
          "  --state-dir DIR   where the database and job data live (default "
          "/var/lib/gpushared)\n"
          "  --foreground      stay attached; log to stderr (systemd runs it so)\n"
          "  --version         print the version and exit\n"
          "  --help            this text\n"
          "\n"
          "Signals: SIGTERM/SIGINT drain and exit 0, SIGHUP reloads the config file.\n"
          "See docs/operations.md.\n");
}

/* Resolve cfg.admin_group to a gid (logs when the group does not exist). */
static void resolve_admin(gs_daemon *d) {
  struct group *g = d->cfg.admin_group[0] ? getgrnam(d->cfg.admin_group) : NULL;
  d->have_admin_gid = g != NULL;
  d->admin_gid = g ? (uint32_t)g->gr_gid : 0;
  if (!g)
    gs_warn("admin group %s does not exist: only root can administer gpushare",
            d->cfg.admin_group);
}

/* SIGHUP: read the configuration again, as a restart would: the file named
 * with --config (which must still exist), else GS_CONFIG_DEFAULT_PATH, whose
 * absence means every default, as at start (so an operator of the unit,
 * which starts the daemon without --config, can create the file and reload).
 * The live keys are applied; the others keep their running values and the
 * log says a restart is needed for them.
 *
 * on_signal has told systemd RELOADING=1, and sd_notify(3) wants READY=1
 * once the reload is over, whatever came of it: without it the unit stays
 * "reloading" and `systemctl reload` waits. So every way out of here sends
 * READY=1, with a STATUS= line saying what happened. */
static void reload(gs_daemon *d) {
  const char *path = d->config_named ? d->config_path : GS_CONFIG_DEFAULT_PATH;
  gs_config neu;
  gs_err e;
  gs_err_clear(&e);
  /* Re-read on top of the defaults, as at start, then keep the values the
   * command line fixed (socket and state directory). A file that fails
   * leaves neu untouched, at the defaults. */
  gs_config_defaults(&neu);
  bool missing = false;
  if (gs_config_load(path, &neu, &e) < 0) {
    if (d->config_named || e.code != GS_NOT_FOUND) {
      gs_error("SIGHUP: %s: %s; keeping the running configuration", e.field, e.msg);
      gs_notifyf("READY=1\nSTATUS=reload refused: %s: %s; running configuration kept", e.field,
                 e.msg);
      return;
    }
    missing = true;
  }
  bool had_file = d->config_path[0] != '\0';
  snprintf(neu.socket_path, sizeof neu.socket_path, "%s", d->cfg.socket_path);
  snprintf(neu.state_dir, sizeof neu.state_dir, "%s", d->cfg.state_dir);
  char *restart = gs_config_restart_needed(&d->cfg, &neu);
  if (restart) gs_warn("SIGHUP: %s changed; that needs a restart, keeping the running value", restart);
  /* Apply the keys that can change live. */
  snprintf(d->cfg.admin_group, sizeof d->cfg.admin_group, "%s", neu.admin_group);
  snprintf(d->cfg.log_level, sizeof d->cfg.log_level, "%s", neu.log_level);
  d->cfg.max_connections = neu.max_connections;
  d->cfg.max_connections_per_uid = neu.max_connections_per_uid;
  d->cfg.admin_reserved_connections = neu.admin_reserved_connections;
  d->cfg.max_inflight = neu.max_inflight;
  d->cfg.idle_timeout_s = neu.idle_timeout_s;
  d->cfg.idle_timeout_norole_s = neu.idle_timeout_norole_s;
  d->cfg.frame_timeout_s = neu.frame_timeout_s;
  d->cfg.max_pending_frame_bytes = neu.max_pending_frame_bytes;
  d->cfg.max_upload = neu.max_upload;
  d->cfg.max_tenant_datasets = neu.max_tenant_datasets;
  d->cfg.max_job_spec = neu.max_job_spec;
  d->cfg.max_frame = neu.max_frame;
  gs_log_set_level(d->cfg.log_level);
  /* Limits on connections in force now. */
  gs_server_limits_changed(d->server);
  resolve_admin(d);
  char what[PATH_MAX];
  if (!missing) {
    snprintf(what, sizeof what, "configuration reloaded from %s", path);
    if (path != d->config_path) snprintf(d->config_path, sizeof d->config_path, "%s", path);
  } else if (!had_file) {
    snprintf(what, sizeof what, "no configuration file (%s does not exist); running on "
             "defaults, nothing changed", path);
  } else {
    d->config_path[0] = '\0';
    snprintf(what, sizeof what, "%s no longer exists; live settings back to their defaults",
             path);
  }
  gs_info("SIGHUP: %s", what);
  gs_notifyf("READY=1\nSTATUS=%s%s%s", what, restart ? "; restart needed for " : "",
             restart ? restart : "");
  free(restart);
}

/* SIGTERM/SIGINT: stop serving (the server drains its connections) and let
 * the executors checkpoint their running jobs and exit; the loop ends once
 * every handle is closed. SIGHUP: reload. */
static uv_signal_t sig_term, sig_int, sig_hup;

static void on_signal(uv_signal_t *h, int signum) {
  gs_daemon *d = h->data;
  if (signum == SIGHUP) {
    /* MONOTONIC_USEC lets a Type=notify-reload manager (systemd >= 253) tell
     * this reload from an earlier one; older ones ignore it. */
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    gs_notifyf("RELOADING=1\nMONOTONIC_USEC=%" PRIu64 "\nSTATUS=reloading the configuration",
               (uint64_t)now.tv_sec * 1000000u + (uint64_t)now.tv_nsec / 1000u);
    reload(d);
    return;
  }
  gs_info("%s: shutting down", signum == SIGTERM ? "SIGTERM" : "SIGINT");
  uv_close((uv_handle_t *)&sig_term, NULL);
  uv_close((uv_handle_t *)&sig_int, NULL);
  uv_close((uv_handle_t *)&sig_hup, NULL);
  gs_server_drain(d->server);
  gs_exec_events_shutdown(d);
}

static void signals_start(gs_daemon *d) {
  uv_signal_t *h[] = {&sig_term, &sig_int, &sig_hup};
  int num[] = {SIGTERM, SIGINT, SIGHUP};
  for (size_t i = 0; i < 3; i++) {
    uv_signal_init(d->loop, h[i]);
    h[i]->data = d;
    uv_signal_start(h[i], on_signal, num[i]);
  }
}

/* Once a second: write again the job records the store refused (disk
 * full, I/O error), so their held events go out once it takes them; write
 * the usage accrued since the last second; and start the jobs whose
 * back-off after a run-time OOM is over. */
static void on_save_timer(uv_timer_t *t) {
  gs_jobs_save_pending(t->data);
  gs_usage_flush(t->data);
  gs_exec_events_tick(t->data);
}

/* Detach; the parent waits for a byte on `ready` (or its closing) and exits
 * with 0 once the child listens, 1 when it failed to start. */
static int daemonize(const char *state_dir, int *ready_fd) {
  int p[2];
  if (pipe2(p, O_CLOEXEC) < 0) return -errno;
  pid_t pid = fork();
  if (pid < 0) return -errno;
  if (pid > 0) {
    close(p[1]);
    char b = 0;
    ssize_t n;
    do n = read(p[0], &b, 1);
    while (n < 0 && errno == EINTR);
    _exit(n == 1 && b == 'R' ? 0 : 1);
  }
  close(p[0]);
  setsid();
  char log[PATH_MAX];
  snprintf(log, sizeof log, "%s/gpushared.log", state_dir);
  mkdir(state_dir, 0700);
  int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
  int null = open("/dev/null", O_RDWR);
  if (null >= 0) {
    dup2(null, 0);
    dup2(fd >= 0 ? fd : null, 1);
    dup2(fd >= 0 ? fd : null, 2);
    if (null > 2) close(null);
  }
  if (fd > 2) close(fd);
  *ready_fd = p[1];
  return 0;
}

/* The watchdog ping; the timer is unref'd so it never keeps the loop (and
 * so the drain at exit) alive on its own. A failing ping is logged once,
 * and again only after it has worked in between, not every interval. */
static void on_watchdog(uv_timer_t *t) {
  (void)t;
  static bool failing;
  int rc = gs_notify("WATCHDOG=1");
  if (rc < 0 && !failing)
    gs_warn("watchdog: cannot notify the service manager: %s", strerror(-rc));
  failing = rc < 0;
}

/* The interval the service manager asks for (0: none), read once the
 * process is the one that will serve (after detaching, so WATCHDOG_PID is
 * checked against the right pid). WATCHDOG_USEC and WATCHDOG_PID are then
 * removed, before any executor starts, so no child takes the watchdog for
 * its own. */
static uint64_t watchdog_take(void) {
  uint64_t usec = gs_notify_watchdog_usec();
  unsetenv("WATCHDOG_USEC");
  unsetenv("WATCHDOG_PID");
  return usec;
}

/* Ping at half the interval from the loop, starting once READY=1 is sent
 * (systemd arms the watchdog when start-up completes). */
static void watchdog_start(uv_loop_t *loop, uv_timer_t *t, uint64_t usec) {
  uint64_t ms = usec / 2000;
  if (ms == 0) ms = 1;
  uv_timer_init(loop, t);
  uv_timer_start(t, on_watchdog, ms, ms);
  uv_unref((uv_handle_t *)t);
  gs_info("watchdog: WATCHDOG=1 every %" PRIu64 " ms (the service manager allows %" PRIu64
          " ms)", ms, usec / 1000);
}

int main(int argc, char **argv) {
  static const struct option opts[] = {
      {"config", required_argument, 0, 'c'},   {"socket", required_argument, 0, 's'},
      {"state-dir", required_argument, 0, 'd'}, {"foreground", no_argument, 0, 'f'},
      {"version", no_argument, 0, 'V'},         {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0}};
  const char *config = NULL, *socket_path = NULL, *state_dir = NULL;
  bool foreground = false;
  /* A client that hangs up (a watcher stopping with ^C) must cost its
   * connection an EPIPE, never the daemon its life. */
  struct sigaction ign;
  memset(&ign, 0, sizeof ign);
  ign.sa_handler = SIG_IGN;
  sigaction(SIGPIPE, &ign, NULL);
  /* Frames being received take buffers of up to 16 MiB that live for
   * seconds (server.c, max_pending_frame_bytes). glibc would raise its mmap
   * threshold after the first such buffer is freed and serve the next ones
   * from the heap, which keeps what a flood of them freed; a fixed threshold
   * keeps every large buffer its own mapping, given back when freed (and
   * grown by mremap, without a copy). */
  mallopt(M_MMAP_THRESHOLD, 256 << 10);
  int o;
  opterr = 0;
  while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
    switch (o) {
    case 'c': config = optarg; break;
    case 's': socket_path = optarg; break;
    case 'd': state_dir = optarg; break;
    case 'f': foreground = true; break;
    case 'V': printf("gpushared %s\n", GS_VERSION); return 0;
    case 'h': usage(stdout); return 0;
    default:
      fprintf(stderr, "gpushared: %s: unknown option or missing value\n", argv[optind - 1]);
      usage(stderr);
      return 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "gpushared: unexpected argument \"%s\"\n", argv[optind]);
    usage(stderr);
    return 2;
  }
  if (socket_path && strlen(socket_path) >= sizeof((gs_config *)0)->socket_path) {
    fprintf(stderr, "gpushared: --socket: path of %zu bytes is longer than a Unix socket allows (107)\n",
            strlen(socket_path));
    return 2;
  }

  static gs_daemon d;
  gs_err e;
  gs_err_clear(&e);
  gs_config_defaults(&d.cfg);
  const char *path = config ? config : GS_CONFIG_DEFAULT_PATH;
  d.config_named = config != NULL;
  if (gs_config_load(path, &d.cfg, &e) == 0) {
    snprintf(d.config_path, sizeof d.config_path, "%s", path);
  } else if (config || e.code != GS_NOT_FOUND) {
    fprintf(stderr, "gpushared: %s: %s\n", e.field, e.msg);
    return 1;
  }
  if (socket_path) snprintf(d.cfg.socket_path, sizeof d.cfg.socket_path, "%s", socket_path);
  if (state_dir) {
    if (strlen(state_dir) >= sizeof d.cfg.state_dir) {
      fprintf(stderr, "gpushared: --state-dir: path too long\n");
      return 2;
    }
    snprintf(d.cfg.state_dir, sizeof d.cfg.state_dir, "%s", state_dir);
  }
  gs_log_set_level(d.cfg.log_level);

  int ready_fd = -1;
  if (!foreground && daemonize(d.cfg.state_dir, &ready_fd) < 0) {
    fprintf(stderr, "gpushared: cannot detach: %s\n", strerror(errno));
    return 1;
  }

  int rc = 1;
  uint64_t watchdog_usec = watchdog_take();
  uv_timer_t watchdog, save_timer;
  bool save_timer_on = false;
  uv_loop_t loop;
  uv_loop_init(&loop);
  d.loop = &loop;
  if (gs_store_open(d.cfg.state_dir, &d.store, &e) < 0) {
    gs_error("%s", e.msg);
    goto out;
  }
  if (gs_devices_discover(&d.cfg, &d.devices, &e) < 0) {
    gs_error("%s: %s", e.field, e.msg);
    goto out;
  }
  {
    char exe[PATH_MAX], why[600];
    int gpus = gs_devices_probe_gpus(&d.cfg, gs_supervisor_path(exe, sizeof exe), &d.devices,
                                     why, sizeof why);
    if (gpus == 0) gs_info("no GPU device: %s; serving the cpu device", why);
  }
  resolve_admin(&d);
  /* Listen first: taking a socket-activated descriptor clears LISTEN_FDS,
   * so the executors gs_exec_events_init starts inherit neither it nor the
   * variables (nothing is served before uv_run). */
  gs_server *srv;
  if (gs_server_listen(&d, gs_rpc_handle, &srv, &e) < 0) {
    gs_error("%s", e.msg);
    goto out;
  }
  signals_start(&d);
  if (gs_datasets_init(&d, &e) < 0 || gs_jobs_load(&d, &e) < 0 || gs_usage_init(&d, &e) < 0 ||
      gs_exec_events_init(&d, &e) < 0) {
    gs_error("%s", e.msg);
    goto out;
  }
  for (size_t i = 0; i < d.devices.n; i++) {
    char total[32], usable[32];
    gs_info("device %s (%s): %s total, %s usable", d.devices.dev[i].name,
            d.devices.dev[i].model, gs_size_format(d.devices.dev[i].total, total, sizeof total),
            gs_size_format(d.devices.dev[i].usable, usable, sizeof usable));
  }
  gs_info("gpushared %s serving on %s, state in %s (schema %d)", GS_VERSION,
          gs_server_path(srv), d.cfg.state_dir, gs_store_schema_version(d.store));
  gs_notifyf("READY=1\nSTATUS=serving %zu device%s on %s", d.devices.n,
             d.devices.n == 1 ? "" : "s", gs_server_path(srv));
  if (ready_fd >= 0) {
    if (write(ready_fd, "R", 1) != 1) gs_warn("cannot tell the starting process we are ready");
    close(ready_fd);
    ready_fd = -1;
  }
  if (watchdog_usec) watchdog_start(&loop, &watchdog, watchdog_usec);
  uv_timer_init(&loop, &save_timer);
  save_timer.data = &d;
  uv_timer_start(&save_timer, on_save_timer, 1000, 1000);
  uv_unref((uv_handle_t *)&save_timer);
  save_timer_on = true;
  uv_run(&loop, UV_RUN_DEFAULT);
  if (watchdog_usec) uv_close((uv_handle_t *)&watchdog, NULL);
  gs_server_free(srv);
  gs_info("stopped after %" PRIu64 " request%s", d.requests, d.requests == 1 ? "" : "s");
  rc = 0;
out:
  if (ready_fd >= 0) close(ready_fd);
  if (d.execs && rc != 0) {
    gs_exec_events_shutdown(&d);
    uv_run(&loop, UV_RUN_DEFAULT);
  }
  if (save_timer_on) uv_close((uv_handle_t *)&save_timer, NULL);
  uint64_t unsaved = gs_jobs_save_pending(&d);
  if (unsaved)
    gs_error("%" PRIu64 " job%s' latest state could not be written to the store (%s); at the "
             "next start %s from the state the store holds, which is what clients were told",
             unsaved, unsaved == 1 ? "" : "s", d.jobs->store_error,
             unsaved == 1 ? "it goes on" : "they go on");
  uv_update_time(&loop);
  if (gs_usage_flush(&d) < 0)
    gs_error("the usage of the last second could not be written to the store; it is lost");
  gs_exec_events_free(&d);
  gs_rpc_free(&d);
  gs_usage_free(&d);
  gs_jobs_free(&d);
  gs_store_close(d.store);
  uv_run(&loop, UV_RUN_NOWAIT);
  uv_loop_close(&loop);
  return rc;
}
