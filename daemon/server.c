/*
 * server.c: the control socket (in the manner of OpenBSD's control.c).
 *
 * gs_server_listen binds the Unix socket, or adopts the one systemd passes
 * (gpushared.socket, LISTEN_FDS). Binding sets the mode with umask around
 * bind(2), not uv_pipe_chmod (which adds bits for everyone), then gives the
 * socket to the configured group. A socket file left by a dead daemon is
 * replaced; one that a live daemon still answers on is not.
 *
 * Each accepted connection reads its peer's credentials once (auth.c),
 * then feeds what it reads to an incremental frame decoder (wire.c): a
 * length prefix over the limit closes that connection before anything is
 * allocated for it; a body that is not a Request gets an INVALID_ARGUMENT
 * answer and the connection goes on. Nothing here blocks: requests are
 * short SQLite transactions on the loop thread.
 *
 * Draining (SIGTERM): stop accepting, stop reading, let queued responses
 * flush, close every connection; the loop then runs out of handles and
 * gs_server_run returns.
 */
#include "server.h"

#include <errno.h>
#include <grp.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "auth.h"
#include "datasets.h"
#include "jobs.h"
#include "log.h"
#include "notify.h"
#include "rpc.h"
#include "wire.h"

typedef struct gs_conn conn;
struct gs_conn {
  uv_pipe_t pipe;        /* first: the handle's address is the conn's */
  gs_server *srv;
  gs_peer peer;          /* credentials read at accept */
  gs_wire_decoder dec;   /* frames arrive in pieces */
  uint64_t frames;       /* frames handled on this connection */
  bool closing;
  conn *prev, *next;
};

struct gs_server {
  gs_daemon *d;
  uv_pipe_t listener;
  bool listening;
  bool owns_path;        /* we bound it (and unlink it at exit) */
  char path[108];
  conn *conns;           /* every open connection */
  size_t n_conns;
  bool draining;
  uv_signal_t sig_term, sig_int, sig_hup;
  uv_timer_t drain_timer;
};

typedef struct write_req {
  uv_write_t req;
  uint8_t *frame;
} write_req;

static void on_conn_closed(uv_handle_t *h) {
  conn *c = (conn *)h;
  gs_server *s = c->srv;
  /* Streams and uploads of this connection end with it. */
  gs_jobs_conn_closed(s->d, c);
  gs_datasets_conn_closed(s->d, c);
  if (c->prev) c->prev->next = c->next;
  else s->conns = c->next;
  if (c->next) c->next->prev = c->prev;
  s->n_conns--;
  gs_wire_decoder_free(&c->dec);
  free(c);
}

static void conn_close(conn *c) {
  if (c->closing) return;
  c->closing = true;
  uv_read_stop((uv_stream_t *)&c->pipe);
  uv_close((uv_handle_t *)&c->pipe, on_conn_closed);
}

static void on_shutdown(uv_shutdown_t *req, int status) {
  (void)status;
  conn *c = req->data;
  free(req);
  uv_close((uv_handle_t *)&c->pipe, on_conn_closed);
}

/* Close once what is queued for writing has gone out (uv_close alone would
 * cancel pending writes: a refusal or a last answer must reach the client). */
static void conn_finish(conn *c) {
  if (c->closing) return;
  c->closing = true;
  uv_read_stop((uv_stream_t *)&c->pipe);
  uv_shutdown_t *req = malloc(sizeof *req);
  if (req) {
    req->data = c;
    if (uv_shutdown(req, (uv_stream_t *)&c->pipe, on_shutdown) == 0) return;
    free(req);
  }
  uv_close((uv_handle_t *)&c->pipe, on_conn_closed);
}

static void on_written(uv_write_t *req, int status) {
  write_req *w = (write_req *)req;
  if (status < 0 && status != UV_ECANCELED)
    gs_debug("write to a client failed: %s", uv_strerror(status));
  free(w->frame);
  free(w);
}

static int conn_send(conn *c, uint8_t *frame, size_t len) {
  write_req *w = malloc(sizeof *w);
  if (!w) {
    free(frame);
    return -1;
  }
  w->frame = frame;
  uv_buf_t buf = uv_buf_init((char *)frame, (unsigned)len);
  int rc = uv_write(&w->req, (uv_stream_t *)&c->pipe, &buf, 1, on_written);
  if (rc < 0) {
    free(frame);
    free(w);
    return -1;
  }
  return 0;
}

int gs_conn_send_response(gs_conn *c, Gpushare__V1__Response *resp) {
  if (c->closing) return -1;
  uint8_t *frame;
  size_t len;
  if (gs_wire_frame(&resp->base, &frame, &len) < 0) return -1;
  return conn_send(c, frame, len);
}

static int on_frame(void *u, const uint8_t *body, size_t len) {
  conn *c = u;
  uint8_t *frame = NULL;
  size_t flen = 0;
  c->frames++;
  if (gs_rpc_handle(c->srv->d, c, &c->peer, body, len, &frame, &flen) < 0) return -ENOMEM;
  if (!frame) return 0; /* a stream: its handler sends */
  return conn_send(c, frame, flen) < 0 ? -EIO : 0;
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)h;
  /* A fixed read buffer per read; the decoder copies what it keeps. */
  size_t n = suggested < 65536 ? 65536 : suggested;
  buf->base = malloc(n);
  buf->len = buf->base ? n : 0;
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf) {
  conn *c = (conn *)st;
  if (nread > 0 && !c->closing) {
    int rc = gs_wire_feed(&c->dec, (const uint8_t *)buf->base, (size_t)nread, on_frame, c);
    if (rc == -EMSGSIZE) {
      gs_warn("uid %" PRIu32 " pid %d sent a frame longer than %" PRIu64
              " bytes; connection closed",
              c->peer.uid, (int)c->peer.pid, c->srv->d->cfg.max_frame);
      conn_close(c);
    } else if (rc < 0) {
      gs_warn("connection of uid %" PRIu32 " closed: %s", c->peer.uid, strerror(-rc));
      conn_close(c);
    }
  } else if (nread < 0) {
    /* UV_EOF or an error; nread == 0 is not end of file (EAGAIN). */
    conn_close(c);
  }
  free(buf->base);
}

static void on_connection(uv_stream_t *l, int status) {
  gs_server *s = l->data;
  if (status < 0) {
    gs_warn("accept: %s", uv_strerror(status));
    return;
  }
  conn *c = calloc(1, sizeof *c);
  if (!c) return;
  c->srv = s;
  uv_pipe_init(s->d->loop, &c->pipe, 0);
  c->next = s->conns;
  if (s->conns) s->conns->prev = c;
  s->conns = c;
  s->n_conns++;
  gs_wire_decoder_init(&c->dec, (uint32_t)s->d->cfg.max_frame);
  if (uv_accept(l, (uv_stream_t *)&c->pipe) < 0) {
    conn_close(c);
    return;
  }
  uv_os_fd_t fd;
  gs_err e;
  gs_err_clear(&e);
  if (uv_fileno((uv_handle_t *)&c->pipe, &fd) < 0 || gs_auth_peer_from_fd(fd, &c->peer, &e) < 0) {
    gs_warn("refusing a connection: %s", e.msg[0] ? e.msg : "no credentials");
    conn_close(c);
    return;
  }
  if (s->draining || (s->d->cfg.max_connections && s->n_conns > s->d->cfg.max_connections)) {
    /* Tell the client why before closing, in a Response it can read. */
    Gpushare__V1__Response r = GPUSHARE__V1__RESPONSE__INIT;
    r.has_code = 1;
    r.code = GPUSHARE__V1__CODE__UNAVAILABLE;
    r.message = s->draining ? "gpushared is shutting down" : "too many connections; try again";
    uint8_t *frame;
    size_t len;
    if (gs_wire_frame(&r.base, &frame, &len) == 0) conn_send(c, frame, len);
    conn_finish(c);
    return;
  }
  gs_debug("connection from uid %" PRIu32 " gid %" PRIu32 " pid %d", c->peer.uid, c->peer.gid,
           (int)c->peer.pid);
  uv_read_start((uv_stream_t *)&c->pipe, on_alloc, on_read);
}

/* Is something answering on path? (a live daemon: don't steal its socket) */
static bool socket_alive(const char *path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
  bool alive = connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
  close(fd);
  return alive;
}

static int bind_path(gs_server *s, gs_err *e) {
  const gs_config *cfg = &s->d->cfg;
  struct stat st;
  if (lstat(s->path, &st) == 0) {
    if (!S_ISSOCK(st.st_mode))
      return gs_err_set(e, GS_FAILED_PRECONDITION, "socket_path",
                        "%s exists and is not a socket; refusing to replace it", s->path);
    if (socket_alive(s->path))
      return gs_err_set(e, GS_ALREADY_EXISTS, "socket_path",
                        "another gpushared is serving on %s", s->path);
    gs_info("replacing stale socket %s", s->path);
    unlink(s->path);
  }
  mode_t old = umask(~(mode_t)cfg->socket_mode & 0777);
  int rc = uv_pipe_bind(&s->listener, s->path);
  umask(old);
  if (rc < 0)
    return gs_err_set(e, GS_FAILED_PRECONDITION, "socket_path", "cannot bind %s: %s", s->path,
                      uv_strerror(rc));
  s->owns_path = true;
  if (cfg->socket_group[0]) {
    struct group *g = getgrnam(cfg->socket_group);
    if (!g)
      gs_warn("socket group %s does not exist; %s keeps gpushared's group", cfg->socket_group,
              s->path);
    else if (chown(s->path, (uid_t)-1, g->gr_gid) < 0)
      gs_warn("cannot give %s to group %s: %s", s->path, cfg->socket_group, strerror(errno));
  }
  return 0;
}

static void on_signal(uv_signal_t *h, int signum);

int gs_server_listen(gs_daemon *d, gs_server **out, gs_err *e) {
  gs_server *s = calloc(1, sizeof *s);
  if (!s) return gs_err_set(e, GS_INTERNAL, "", "out of memory");
  s->d = d;
  snprintf(s->path, sizeof s->path, "%s", d->cfg.socket_path);
  uv_pipe_init(d->loop, &s->listener, 0);
  s->listener.data = s;
  int fd = gs_listen_fd();
  if (fd >= 0) {
    int rc = uv_pipe_open(&s->listener, fd);
    if (rc < 0) {
      gs_err_set(e, GS_FAILED_PRECONDITION, "", "cannot use the socket systemd passed: %s",
                 uv_strerror(rc));
      goto fail;
    }
    snprintf(s->path, sizeof s->path, "(socket activation)");
    gs_info("using the listening socket passed by systemd");
  } else if (bind_path(s, e) < 0) {
    goto fail;
  }
  int rc = uv_listen((uv_stream_t *)&s->listener, 128, on_connection);
  if (rc < 0) {
    gs_err_set(e, GS_FAILED_PRECONDITION, "socket_path", "cannot listen on %s: %s", s->path,
               uv_strerror(rc));
    goto fail;
  }
  s->listening = true;
  uv_signal_init(d->loop, &s->sig_term);
  uv_signal_init(d->loop, &s->sig_int);
  uv_signal_init(d->loop, &s->sig_hup);
  s->sig_term.data = s->sig_int.data = s->sig_hup.data = s;
  uv_signal_start(&s->sig_term, on_signal, SIGTERM);
  uv_signal_start(&s->sig_int, on_signal, SIGINT);
  uv_signal_start(&s->sig_hup, on_signal, SIGHUP);
  uv_timer_init(d->loop, &s->drain_timer);
  s->drain_timer.data = s;
  *out = s;
  d->server = s;
  return 0;
fail:
  if (s->owns_path) unlink(s->path);
  uv_close((uv_handle_t *)&s->listener, NULL);
  uv_run(d->loop, UV_RUN_NOWAIT);
  free(s);
  return -1;
}

const char *gs_server_path(const gs_server *s) { return s->path; }
size_t gs_server_connections(const gs_server *s) { return s->n_conns; }

static void on_drain_timeout(uv_timer_t *t) {
  gs_server *s = t->data;
  /* Responses still queued after the grace period: close anyway. */
  for (conn *c = s->conns; c; c = c->next)
    if (!uv_is_closing((uv_handle_t *)&c->pipe)) uv_close((uv_handle_t *)&c->pipe, on_conn_closed);
}

void gs_server_drain(gs_server *s) {
  if (s->draining) return;
  s->draining = true;
  gs_notify("STOPPING=1\nSTATUS=draining connections");
  gs_info("draining: %zu connection%s open", s->n_conns, s->n_conns == 1 ? "" : "s");
  if (s->listening) {
    uv_close((uv_handle_t *)&s->listener, NULL);
    s->listening = false;
  }
  uv_close((uv_handle_t *)&s->sig_term, NULL);
  uv_close((uv_handle_t *)&s->sig_int, NULL);
  uv_close((uv_handle_t *)&s->sig_hup, NULL);
  /* Stop reading; what is already queued for writing still goes out. */
  for (conn *c = s->conns; c; c = c->next) conn_finish(c);
  /* Executors checkpoint their running jobs and exit; the loop ends when
   * they are gone. */
  gs_jobs_shutdown(s->d);
  uv_timer_start(&s->drain_timer, on_drain_timeout, 5000, 0);
  uv_unref((uv_handle_t *)&s->drain_timer);
}

static void reload(gs_server *s) {
  gs_daemon *d = s->d;
  if (!d->config_path[0]) {
    gs_info("SIGHUP: no config file in use; nothing to reload");
    return;
  }
  gs_config neu = d->cfg;
  gs_err e;
  gs_err_clear(&e);
  /* Re-read on top of the defaults, as at start, then keep the values the
   * command line fixed (socket and state directory). */
  gs_config_defaults(&neu);
  if (gs_config_load(d->config_path, &neu, &e) < 0) {
    gs_error("SIGHUP: %s: %s; keeping the running configuration", e.field, e.msg);
    return;
  }
  snprintf(neu.socket_path, sizeof neu.socket_path, "%s", d->cfg.socket_path);
  snprintf(neu.state_dir, sizeof neu.state_dir, "%s", d->cfg.state_dir);
  char *restart = gs_config_restart_needed(&d->cfg, &neu);
  if (restart) {
    gs_warn("SIGHUP: %s changed; that needs a restart, keeping the running value", restart);
    free(restart);
  }
  /* Apply the keys that can change live. */
  snprintf(d->cfg.admin_group, sizeof d->cfg.admin_group, "%s", neu.admin_group);
  snprintf(d->cfg.log_level, sizeof d->cfg.log_level, "%s", neu.log_level);
  d->cfg.max_connections = neu.max_connections;
  d->cfg.max_inflight = neu.max_inflight;
  d->cfg.idle_timeout_s = neu.idle_timeout_s;
  d->cfg.max_upload = neu.max_upload;
  gs_log_set_level(d->cfg.log_level);
  gs_daemon_resolve_admin(d);
  gs_info("SIGHUP: configuration reloaded from %s", d->config_path);
  gs_notify("RELOADING=0\nREADY=1\nSTATUS=configuration reloaded");
}

static void on_signal(uv_signal_t *h, int signum) {
  gs_server *s = h->data;
  if (signum == SIGHUP) {
    gs_notify("RELOADING=1");
    reload(s);
    return;
  }
  gs_info("%s: shutting down", signum == SIGTERM ? "SIGTERM" : "SIGINT");
  gs_server_drain(s);
}

void gs_server_free(gs_server *s) {
  if (!s) return;
  if (s->owns_path) unlink(s->path);
  if (!uv_is_closing((uv_handle_t *)&s->drain_timer)) uv_close((uv_handle_t *)&s->drain_timer, NULL);
  uv_run(s->d->loop, UV_RUN_NOWAIT);
  s->d->server = NULL;
  free(s);
}
