/*
 * main.c: gpushared, the control plane.
 *
 *   gpushared [--config F] [--socket P] [--state-dir D] [--foreground]
 *
 * Start-up order: configuration (defaults, then the file, then the command
 * line), the store (migrated), the devices, the socket; then READY=1 to
 * systemd and the loop. Without --foreground the daemon detaches and the
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
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "control/config.h"
#include "control/daemon.h"
#include "control/datasets.h"
#include "control/jobs.h"
#include "control/devices.h"
#include "control/log.h"
#include "control/supervisor.h"
#include "control/notify.h"
#include "control/server.h"
#include "common/size.h"
#include "control/store.h"

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

void gs_daemon_resolve_admin(gs_daemon *d) {
  struct group *g = d->cfg.admin_group[0] ? getgrnam(d->cfg.admin_group) : NULL;
  d->have_admin_gid = g != NULL;
  d->admin_gid = g ? (uint32_t)g->gr_gid : 0;
  if (!g)
    gs_warn("admin group %s does not exist: only root can administer gpushare",
            d->cfg.admin_group);
}

/* Detach; the parent waits for a byte on `ready` (or its closing) and exits
 * with 0 once the child listens, 1 when it failed to start. */
static int daemonize(const char *state_dir, int *ready_fd) {
  int p[2];
  if (pipe2(p, O_CLOEXEC) < 0) return -1;
  pid_t pid = fork();
  if (pid < 0) return -1;
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
  char log[4200];
  snprintf(log, sizeof log, "%s/gpushared.log", state_dir);
  mkdir(state_dir, 0750);
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
  uv_timer_t watchdog;
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
    char exe[4200], why[600];
    int gpus = gs_devices_probe_gpus(&d.cfg, gs_executor_path(exe, sizeof exe), &d.devices,
                                     why, sizeof why);
    if (gpus == 0) gs_info("no GPU device: %s; serving the cpu device", why);
  }
  gs_daemon_resolve_admin(&d);
  /* Listen first: taking a socket-activated descriptor clears LISTEN_FDS,
   * so the executors gs_jobs_init starts inherit neither it nor the
   * variables (nothing is served before uv_run). */
  gs_server *srv;
  if (gs_server_listen(&d, &srv, &e) < 0) {
    gs_error("%s", e.msg);
    goto out;
  }
  if (gs_datasets_init(&d, &e) < 0 || gs_jobs_init(&d, &e) < 0) {
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
  uv_run(&loop, UV_RUN_DEFAULT);
  if (watchdog_usec) uv_close((uv_handle_t *)&watchdog, NULL);
  gs_server_free(srv);
  gs_info("stopped after %" PRIu64 " requests", d.requests);
  rc = 0;
out:
  if (ready_fd >= 0) close(ready_fd);
  if (d.jobs && rc != 0) {
    gs_jobs_shutdown(&d);
    uv_run(&loop, UV_RUN_DEFAULT);
  }
  gs_jobs_free(&d);
  gs_datasets_shutdown(&d);
  gs_store_close(d.store);
  uv_run(&loop, UV_RUN_NOWAIT);
  uv_loop_close(&loop);
  return rc;
}
