/* supervisor.c: executor processes, started and restarted (see supervisor.h). */
#include "control/supervisor.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "control/log.h"
#include "proto/wire.h"

struct gs_executor {
  gs_daemon *d;
  size_t device;               /* index into d->devices */
  gs_supervisor_events ev;
  uv_process_t proc;
  uv_pipe_t pipe;              /* our end of the socketpair */
  uv_timer_t backoff;          /* restart delay */
  gs_wire_decoder dec;
  bool running;                /* a process exists */
  bool pipe_open;
  bool ready;                  /* it sent Ready */
  bool stopping;               /* Shutdown sent: no restart */
  uint32_t restarts;
  uint64_t started_ms;         /* for the backoff reset */
  unsigned delay_ms;           /* next restart delay */
  int exit_status, term_signal;
  bool exited, pipe_closed;    /* both must happen before the next start */
};

typedef struct write_req {
  uv_write_t req;
  uint8_t *frame;
} write_req;

static void spawn(gs_executor *x);
static void on_backoff(uv_timer_t *t) { spawn(t->data); }

const char *gs_supervisor_path(char *buf, size_t len) {
  const char *env = getenv("GS_EXECUTOR");
  if (env && *env) return env;
  char self[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return "gpushare-executor";
  self[n] = '\0';
  char *slash = strrchr(self, '/');
  if (slash) *slash = '\0';
  snprintf(buf, len, "%s/gpushare-executor", self);
  return buf;
}

static void maybe_restart(gs_executor *x) {
  if (!x->exited || !x->pipe_closed) return;
  char why[96];
  if (x->term_signal)
    snprintf(why, sizeof why, "killed by signal %d (%s)", x->term_signal, strsignal(x->term_signal));
  else
    snprintf(why, sizeof why, "exited with status %d", x->exit_status);
  bool planned = x->stopping;
  if (!planned)
    gs_warn("executor for %s %s; restarting in %u ms", x->d->devices.dev[x->device].name, why,
            x->delay_ms);
  x->ready = false;
  x->running = false;
  if (x->ev.died) x->ev.died(x->d, x, why, planned);
  if (planned) return;
  uint64_t up = uv_now(x->d->loop) - x->started_ms;
  if (up > 60000) x->delay_ms = 500;
  x->restarts++;
  uv_timer_start(&x->backoff, on_backoff, x->delay_ms, 0);
  x->delay_ms = x->delay_ms >= 15000 ? 30000 : x->delay_ms * 2;
}

static void on_pipe_closed(uv_handle_t *h) {
  gs_executor *x = h->data;
  x->pipe_closed = true;
  x->pipe_open = false;
  gs_wire_decoder_free(&x->dec);
  maybe_restart(x);
}

static void close_pipe(gs_executor *x) {
  if (!x->pipe_open || uv_is_closing((uv_handle_t *)&x->pipe)) return;
  uv_read_stop((uv_stream_t *)&x->pipe);
  uv_close((uv_handle_t *)&x->pipe, on_pipe_closed);
}

static void on_proc_closed(uv_handle_t *h) {
  gs_executor *x = h->data;
  x->exited = true;
  maybe_restart(x);
}

static void on_proc_exit(uv_process_t *p, int64_t status, int sig) {
  gs_executor *x = p->data;
  x->exit_status = (int)status;
  x->term_signal = sig;
  close_pipe(x);
  uv_close((uv_handle_t *)p, on_proc_closed);
}

static int on_frame(void *u, const uint8_t *body, size_t len) {
  gs_executor *x = u;
  Gpushare__Exec__V1__FromExecutor *m = gpushare__exec__v1__from_executor__unpack(NULL, len, body);
  if (!m) {
    gs_error("executor for %s sent a frame that is not a FromExecutor (%zu bytes); restarting it",
             x->d->devices.dev[x->device].name, len);
    return -EPROTO;
  }
  if (m->msg_case == GPUSHARE__EXEC__V1__FROM_EXECUTOR__MSG_READY) {
    x->ready = true;
    gs_info("executor for %s ready (pid %d)", x->d->devices.dev[x->device].name, x->proc.pid);
    if (x->ev.ready) x->ev.ready(x->d, x);
  } else if (x->ev.message) {
    x->ev.message(x->d, x, m);
  }
  gpushare__exec__v1__from_executor__free_unpacked(m, NULL);
  return 0;
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)h;
  size_t n = suggested < 65536 ? 65536 : suggested;
  buf->base = malloc(n);
  buf->len = buf->base ? n : 0;
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf) {
  gs_executor *x = st->data;
  if (nread > 0) {
    if (gs_wire_feed(&x->dec, (const uint8_t *)buf->base, (size_t)nread, on_frame, x) < 0) {
      /* A broken stream: the executor is not trustworthy any more. */
      if (x->running) uv_process_kill(&x->proc, SIGKILL);
      close_pipe(x);
    }
  } else if (nread < 0) {
    close_pipe(x);
    if (x->running && !x->stopping) uv_process_kill(&x->proc, SIGKILL);
  }
  free(buf->base);
}

static void spawn(gs_executor *x) {
  gs_daemon *d = x->d;
  const gs_device *dev = &d->devices.dev[x->device];
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
    gs_error("executor for %s: socketpair: %s", dev->name, strerror(errno));
    uv_timer_start(&x->backoff, on_backoff, x->delay_ms, 0);
    return;
  }
  char path[PATH_MAX + 32], threads[16], memory[32];
  const char *exe = gs_supervisor_path(path, sizeof path);
  snprintf(threads, sizeof threads, "%u", dev->threads);
  snprintf(memory, sizeof memory, "%" PRIu64, dev->usable);
  /* --device-memory: the executor keeps the regions of all vdevs within the
   * device's usable bytes, so an oversubscribed device runs out as a job's
   * OOM (cause PHYSICAL), never the machine's. */
  char *args[] = {(char *)exe,   "--device",  (char *)dev->name, "--fd", "3",
                  "--state-dir", d->cfg.state_dir, "--threads", threads,
                  "--device-memory", memory, NULL};
  uv_stdio_container_t stdio[4] = {
      {.flags = UV_INHERIT_FD, .data.fd = 0},
      {.flags = UV_INHERIT_FD, .data.fd = 1},
      {.flags = UV_INHERIT_FD, .data.fd = 2},
      {.flags = UV_INHERIT_FD, .data.fd = sv[1]},
  };
  uv_process_options_t o = {.exit_cb = on_proc_exit, .file = exe, .args = args,
                             .stdio_count = 4, .stdio = stdio};
  x->proc.data = x;
  x->exited = x->pipe_closed = false;
  int rc = uv_spawn(d->loop, &x->proc, &o);
  close(sv[1]);
  if (rc < 0) {
    close(sv[0]);
    gs_error("cannot start %s for device %s: %s; retrying in %u ms", exe, dev->name,
             uv_strerror(rc), x->delay_ms);
    uv_close((uv_handle_t *)&x->proc, NULL);
    uv_timer_start(&x->backoff, on_backoff, x->delay_ms, 0);
    x->delay_ms = x->delay_ms >= 15000 ? 30000 : x->delay_ms * 2;
    return;
  }
  x->running = true;
  x->started_ms = uv_now(d->loop);
  gs_wire_decoder_init(&x->dec, GS_WIRE_MAX_FRAME);
  uv_pipe_init(d->loop, &x->pipe, 0);
  x->pipe.data = x;
  uv_pipe_open(&x->pipe, sv[0]);
  x->pipe_open = true;
  uv_read_start((uv_stream_t *)&x->pipe, on_alloc, on_read);
  gs_debug("executor for %s started: pid %d", dev->name, x->proc.pid);
}

int gs_supervisor_start(gs_daemon *d, size_t device, const gs_supervisor_events *ev,
                      gs_executor **out, gs_err *e) {
  gs_executor *x = calloc(1, sizeof *x);
  if (!x) return gs_err_set(e, GS_INTERNAL, "", "out of memory");
  x->d = d;
  x->device = device;
  x->ev = *ev;
  x->delay_ms = 500;
  uv_timer_init(d->loop, &x->backoff);
  x->backoff.data = x;
  spawn(x);
  *out = x;
  return 0;
}

static void on_written(uv_write_t *req, int status) {
  (void)status;
  write_req *w = (write_req *)req;
  free(w->frame);
  free(w);
}

int gs_supervisor_send(gs_executor *x, const Gpushare__Exec__V1__ToExecutor *m) {
  if (!x->running || !x->pipe_open || !x->ready) return -EAGAIN; /* not running: sent again after ready */
  write_req *w = malloc(sizeof *w);
  size_t len;
  if (!w || gs_wire_frame(&m->base, &w->frame, &len) < 0) {
    free(w);
    return -ENOMEM;
  }
  uv_buf_t b = uv_buf_init((char *)w->frame, (unsigned)len);
  if (uv_write(&w->req, (uv_stream_t *)&x->pipe, &b, 1, on_written) < 0) {
    free(w->frame);
    free(w);
    return -EIO;
  }
  return 0;
}

bool gs_supervisor_ready(const gs_executor *x) { return x->ready && x->running; }
const char *gs_supervisor_device(const gs_executor *x) { return x->d->devices.dev[x->device].name; }
size_t gs_supervisor_device_index(const gs_executor *x) { return x->device; }
int gs_supervisor_pid(const gs_executor *x) { return x->running ? x->proc.pid : 0; }
uint32_t gs_supervisor_restarts(const gs_executor *x) { return x->restarts; }

void gs_supervisor_stop(gs_executor *x) {
  x->stopping = true;
  uv_timer_stop(&x->backoff);
  uv_close((uv_handle_t *)&x->backoff, NULL);
  if (!x->running) {
    if (x->ev.died) x->ev.died(x->d, x, "not running", true);
    return;
  }
  Gpushare__Exec__V1__ToExecutor m = GPUSHARE__EXEC__V1__TO_EXECUTOR__INIT;
  Gpushare__Exec__V1__Shutdown s = GPUSHARE__EXEC__V1__SHUTDOWN__INIT;
  m.msg_case = GPUSHARE__EXEC__V1__TO_EXECUTOR__MSG_SHUTDOWN;
  m.shutdown = &s;
  if (gs_supervisor_send(x, &m) < 0) uv_process_kill(&x->proc, SIGTERM);
}

void gs_supervisor_free(gs_executor *x) { free(x); }
