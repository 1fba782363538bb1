/*
 * server.c: the control socket (in the manner of OpenBSD's control.c).
 *
 * gs_server_listen binds the Unix socket, or adopts the one systemd passes
 * (gpushared.socket, LISTEN_FDS). Binding sets the mode with umask around
 * bind(2), not uv_pipe_chmod (which adds bits for everyone), then gives the
 * socket to the configured group. A socket file left by a dead daemon is
 * replaced; one that a live daemon still answers on is not.
 *
 * Accepting is done here (accept4 when a uv_poll_t says the socket is
 * readable), not by uv_listen, so that it can pause: at max_connections
 * (or fewer, when RLIMIT_NOFILE leaves less room beside the descriptors
 * kept for the rest of the daemon), and when accept fails with EMFILE or
 * ENFILE (retried each second). A paused daemon leaves new clients in the
 * kernel's listen queue: their connect succeeds and they are served, in
 * order, as connections close. libuv's own EMFILE answer would accept and
 * drop them instead.
 *
 * Each accepted connection reads its peer's credentials once (auth.c) and
 * is admitted or refused: a uid that is not an admin may hold
 * max_connections_per_uid connections, and only while fewer than
 * max_connections - admin_reserved_connections are served, so that however
 * many users flood the socket an admin can still get in. A refused
 * connection is answered before anything is read from it, with one
 * RESOURCE_EXHAUSTED Response (id 0) naming the limit, and closed once that
 * is written: the client learns why, and a connect loop costs the daemon an
 * accept and a write. An admitted one notes whether its peer was an admin,
 * a tenant's member or neither, for the idle timeouts.
 *
 * Then it feeds what it reads to an incremental frame decoder (wire.c), one
 * frame at a time: a length prefix over max_frame closes that connection
 * before anything is allocated for it; a body that is not a Request gets
 * an INVALID_ARGUMENT answer and the connection goes on. A request is in
 * flight from the moment its frame is decoded until its answer has been
 * written to the socket (a watch: until its final event has); at
 * max_inflight the connection stops reading, keeping the rest of what it
 * read, and goes on when an answer goes out. A client that sends without
 * reading its answers is thus held to max_inflight answers queued in the
 * daemon, its further requests waiting in its own socket buffer.
 *
 * What a partly received frame costs is bounded three ways. The decoder's
 * buffer grows with the bytes that arrive, never with what the length
 * prefix announces. All connections together hold at most
 * max_pending_frame_bytes in such buffers: the decoder asks conn_grow
 * before each growth, and past the budget the connections of the uid
 * holding the most are closed, the largest first, until it fits (often
 * the growing one itself), so a uid flooding large frames pays with its own
 * connections and no one else's frame is stopped. And a frame must arrive
 * whole within frame_timeout_s of its first byte (the clock restarts when
 * the daemon reads again after a pause of its own, at max_inflight): a
 * client trickling bytes holds no slot.
 *
 * A once-a-second sweep closes those late frames, and the connections with
 * nothing in flight that sent nothing for idle_timeout_s, or for the
 * shorter idle_timeout_norole_s when the peer had no role. Nothing here
 * blocks: requests are short SQLite transactions on the loop thread.
 *
 * The server does not know the calls: main.c gives it the dispatcher
 * (gs_rpc_handle), and the handlers below that use what server.h exports
 * on a connection: gs_server_send for the frames of a stream, and
 * gs_server_on_close for what must end with the connection (a watch, an
 * upload). Signals and the configuration reload are main.c's; after a
 * reload it calls gs_server_limits_changed.
 *
 * Draining (SIGTERM, from main.c): stop accepting, stop reading, let queued
 * responses flush, close every connection; the loop then runs out of
 * handles and returns.
 */
#include "control/server.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/size.h"
#include "control/auth.h"
#include "control/log.h"
#include "control/notify.h"
#include "proto/wire.h"

typedef struct gs_conn conn;

#define GS_SERVER_CLOSE_HOOKS 4 /* distinct close hooks a connection holds */
#define GS_SERVER_UID_BUCKETS 256 /* chains of the per-uid tally */

/* What a connection's peer was when it connected: an admin, a member of
 * some tenant (or of several, through its groups), or neither. */
enum { ROLE_NONE, ROLE_TENANT, ROLE_ADMIN };

/* One uid's share of the server: its connections (refused ones aside) and
 * the body bytes their decoders hold. Freed with its last connection. */
typedef struct uid_tally {
  uint32_t uid;
  unsigned conns;        /* open connections of this uid, refused ones not counted */
  uint64_t pending;      /* bytes its decoders hold for partly received frames */
  struct uid_tally *next; /* next in its bucket's chain */
} uid_tally;

typedef struct close_hook {
  gs_server_close_fn fn;
  void *arg;
} close_hook;

struct gs_conn {
  uv_pipe_t pipe;        /* first: the handle's address is the conn's */
  gs_server *srv;
  gs_peer peer;          /* credentials read at accept */
  gs_wire_decoder dec;   /* frames arrive in pieces */
  uint64_t frames;       /* frames handled on this connection */
  unsigned inflight;     /* requests read whose answer is not written yet; an open
                            watch counts until its final event is written */
  bool reading;          /* uv_read_start is in effect */
  uint8_t *pend;         /* a read buffer not fed to the decoder yet: reading paused
                            at max_inflight in the middle of it */
  size_t pend_off, pend_len;
  uint64_t last_active;  /* uv_now() when bytes last arrived or an answer went out */
  uint64_t frame_since;  /* uv_now() when the first byte of the frame being read was fed
                            (or reading resumed in its middle); 0 between frames */
  uint64_t seq;          /* accept order: among equals, the newest is evicted */
  uid_tally *who;        /* its uid's tally; NULL until admitted (and for a refused one) */
  int role;              /* ROLE_*, as of accept */
  uint32_t held;         /* body bytes its decoder holds, counted in the server's pending */
  bool refused;          /* over a connection limit: the refusal is written, then it closes */
  bool feeding;          /* inside gs_wire_feed: its decoder is in use */
  bool yielded;          /* reading stopped until the loop's next turn (on_yield_check) */
  size_t burst;          /* bytes read since it last yielded */
  bool closing;
  close_hook hooks[GS_SERVER_CLOSE_HOOKS]; /* called once it has closed */
  conn *prev, *next;
};

enum { PAUSE_NONE, PAUSE_FULL, PAUSE_FDS }; /* why accepting is paused */

struct gs_server {
  gs_daemon *d;
  gs_server_dispatch dispatch; /* one request frame in, its answer out */
  int listen_fd;         /* the listening socket; -1 once closed */
  uv_poll_t listener;    /* readable listen_fd: clients wait in the kernel's queue */
  bool listening;        /* listener initialized and not closed */
  bool accepting;        /* listener's poll started */
  int paused;            /* PAUSE_*: why not */
  uint64_t paused_at;    /* uv_now() of the pause */
  uint64_t pause_logged; /* uv_now() of the last pause logged at warn (0: never) */
  unsigned pauses_quiet; /* pauses since then not logged at warn */
  unsigned conn_cap;     /* connections served at once: max_connections, or fewer when
                            the descriptor limit leaves less room */
  bool owns_path;        /* we bound it (and unlink it at exit) */
  char path[108];
  conn *conns;           /* every open connection */
  size_t n_conns;
  size_t n_refused;      /* of those, refused ones still closing (not served) */
  uint64_t accepted;     /* connections accepted since start: the next seq */
  uid_tally *uids[GS_SERVER_UID_BUCKETS]; /* per-uid tallies, chained by uid % buckets */
  uint64_t pending;      /* body bytes all decoders hold: at most max_pending_frame_bytes */
  uint64_t refuse_logged; /* uv_now() of the last refusal logged at warn (0: never) */
  unsigned refusals_quiet; /* refusals since then not logged at warn */
  uint64_t evict_logged; /* the same for connections closed over max_pending_frame_bytes */
  unsigned evictions_quiet;
  bool draining;
  uv_timer_t drain_timer;
  uv_timer_t retry_timer; /* accept again after EMFILE/ENFILE */
  uv_timer_t sweep_timer; /* once a second: close idle and overdue connections */
  uv_check_t yield_check; /* after a loop's poll: reading again where it yielded */
};

/* Descriptors kept for everything but client connections: the store, the
 * executors' pipes, upload and checkpoint files, log and notify sockets. */
#define GS_SERVER_FD_RESERVE 64
#define GS_SERVER_ACCEPT_BATCH 32 /* accepts per wakeup, then the loop's other work */
#define GS_SERVER_RETRY_MS 1000   /* after EMFILE/ENFILE, until a connection closes */
#define GS_SERVER_PAUSE_LOG_MS 10000 /* at most one pause per this logged at warn */
#define GS_SERVER_FLOOD_LOG_MS 10000 /* and one refusal, and one eviction */
/* Bytes a connection reads before it lets the others have the loop: libuv
 * reads a readable stream up to 32 times (2 MiB) per turn, so 64 clients
 * pushing large frames would make each turn copy 128 MiB before a request
 * that came meanwhile is read. */
#define GS_SERVER_READ_BURST (128u << 10)

typedef struct write_req {
  uv_write_t req;
  conn *c;               /* alive until this completes: libuv runs write callbacks
                            (UV_ECANCELED on close) before the close callback */
  bool ends;             /* the last frame of a request: it leaves flight when written */
  uint8_t *frame;
} write_req;

static void conn_feed(conn *c);
static void accept_resume(gs_server *s);
static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf);

/* ------------------------------------------------------------ tallies --- */

static uid_tally **uid_bucket(gs_server *s, uint32_t uid) {
  return &s->uids[uid % GS_SERVER_UID_BUCKETS];
}

/* The tally of uid, made at its first connection; NULL when out of memory. */
static uid_tally *uid_get(gs_server *s, uint32_t uid) {
  uid_tally **b = uid_bucket(s, uid);
  for (uid_tally *t = *b; t; t = t->next)
    if (t->uid == uid) return t;
  uid_tally *t = calloc(1, sizeof *t);
  if (!t) return NULL;
  t->uid = uid;
  t->next = *b;
  *b = t;
  return t;
}

/* Free t once it counts nothing. */
static void uid_drop(gs_server *s, uid_tally *t) {
  if (t->conns || t->pending) return;
  for (uid_tally **p = uid_bucket(s, t->uid); *p; p = &(*p)->next)
    if (*p == t) {
      *p = t->next;
      free(t);
      return;
    }
}

/* One connection of t's uid has closed (its decoder already freed). */
static void uid_release(gs_server *s, uid_tally *t) {
  if (t->conns) t->conns--;
  uid_drop(s, t);
}

/* Logging under a flood: the first event in GS_SERVER_FLOOD_LOG_MS at warn
 * (with how many were quiet since the last), the others at debug. True when
 * this one is loud; *quiet_out is then the count to report. */
static bool flood_loud(gs_server *s, uint64_t *logged, unsigned *quiet, unsigned *quiet_out) {
  uint64_t now = uv_now(s->d->loop);
  if (*logged && now - *logged < GS_SERVER_FLOOD_LOG_MS) {
    (*quiet)++;
    return false;
  }
  *quiet_out = *quiet;
  *logged = now;
  *quiet = 0;
  return true;
}

static void on_conn_closed(uv_handle_t *h) {
  conn *c = (conn *)h;
  gs_server *s = c->srv;
  /* Streams and uploads of this connection end with it. */
  for (size_t i = 0; i < GS_SERVER_CLOSE_HOOKS && c->hooks[i].fn; i++)
    c->hooks[i].fn(c->hooks[i].arg, c);
  if (c->prev) c->prev->next = c->next;
  else s->conns = c->next;
  if (c->next) c->next->prev = c->prev;
  s->n_conns--;
  if (c->refused) s->n_refused--;
  gs_wire_decoder_free(&c->dec); /* conn_grow takes its bytes off the tallies */
  if (c->who) uid_release(s, c->who);
  free(c->pend);
  free(c);
  accept_resume(s);
}

/* A closing connection reads no more: the frame it was receiving is given
 * up, and its buffer goes back to max_pending_frame_bytes now rather than
 * when the handle has closed (unless the decoder is in use up the stack;
 * on_conn_closed frees it then). */
static void conn_drop_frame(conn *c) {
  if (!c->feeding) gs_wire_decoder_free(&c->dec);
}

static void conn_close(conn *c) {
  if (c->closing) return;
  c->closing = true;
  c->reading = false;
  uv_read_stop((uv_stream_t *)&c->pipe);
  conn_drop_frame(c);
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
  c->reading = false;
  uv_read_stop((uv_stream_t *)&c->pipe);
  conn_drop_frame(c);
  uv_shutdown_t *req = malloc(sizeof *req);
  if (req) {
    req->data = c;
    if (uv_shutdown(req, (uv_stream_t *)&c->pipe, on_shutdown) == 0) return;
    free(req);
  }
  uv_close((uv_handle_t *)&c->pipe, on_conn_closed);
}

/* -------------------------------------------- partly received frames --- */

/* Whom to close so that c's decoder may grow by `more` bytes: the uid that
 * holds the most in partly received frames, c's own counted as grown (on a
 * tie, c's); of its connections, the one holding the most (on a tie, c, else
 * the newest). c itself when that is where the bytes are; NULL when only
 * connections already closing hold any (one closed from inside its own
 * feed, which keeps its buffer until its handle has closed). */
static conn *pending_victim(gs_server *s, conn *c, uint64_t more) {
  uid_tally *top = c->who;
  uint64_t top_b = c->who->pending + more;
  for (size_t i = 0; i < GS_SERVER_UID_BUCKETS; i++)
    for (uid_tally *t = s->uids[i]; t; t = t->next)
      if (t->pending > top_b) {
        top = t;
        top_b = t->pending;
      }
  conn *v = top == c->who ? c : NULL;
  uint64_t vb = v ? c->held + more : 0;
  for (conn *x = s->conns; x; x = x->next) {
    if (x == c || x->who != top || x->closing || !x->held) continue;
    if (x->held > vb || (x->held == vb && v != c && (!v || x->seq > v->seq))) {
      v = x;
      vb = x->held;
    }
  }
  return v;
}

/* The decoder's grow hook: every change of a connection's body buffer is
 * counted here, and a growth that would take the bytes held by all
 * connections past max_pending_frame_bytes first closes connections of the
 * uid holding the most (pending_victim), which may be c's own: a flood of
 * large frames from one uid costs that uid its connections, not the others
 * theirs. Refusing c's growth makes gs_wire_feed fail and c close. */
static int conn_grow(void *u, uint32_t from, uint32_t to) {
  conn *c = u;
  gs_server *s = c->srv;
  if (to > from) {
    uint64_t more = to - from, budget = s->d->cfg.max_pending_frame_bytes;
    while (s->pending + more > budget) {
      conn *v = pending_victim(s, c, more);
      unsigned quiet = 0;
      char held[32], total[32], cap[32];
      gs_size_format(v ? v->who->pending + (v == c ? more : 0) : 0, held, sizeof held);
      gs_size_format(s->pending + more, total, sizeof total);
      gs_size_format(budget, cap, sizeof cap);
      if (!v || flood_loud(s, &s->evict_logged, &s->evictions_quiet, &quiet)) {
        if (v)
          gs_warn("uid %" PRIu32 " holds %s in partly received frames, the most of any uid, "
                  "and all connections would hold %s (max_pending_frame_bytes %s): closing "
                  "its connection from pid %d, %u of whose frame's %u bytes have arrived "
                  "(%u more such closes since the last message)",
                  v->who->uid, held, total, cap, (int)v->peer.pid, v->dec.have, v->dec.need,
                  quiet);
        else
          gs_warn("uid %" PRIu32 " pid %d: all connections would hold %s in partly received "
                  "frames (max_pending_frame_bytes %s), the rest on connections already "
                  "closing: connection closed",
                  c->peer.uid, (int)c->peer.pid, total, cap);
      } else {
        gs_debug("uid %" PRIu32 " pid %d closed: its uid holds the most in partly received "
                 "frames (max_pending_frame_bytes)",
                 v->who->uid, (int)v->peer.pid);
      }
      if (!v || v == c) return -ENOBUFS;
      conn_close(v); /* gives its buffer back: only c is being fed */
    }
  }
  s->pending = s->pending - from + to;
  c->who->pending = c->who->pending - from + to;
  c->held = to;
  return 0;
}

/* One request has its answer out: the idle clock restarts, and a
 * connection paused at max_inflight may read again (not from inside
 * conn_feed: `feed` is false there; one that yielded reads again on its own). */
static void request_done(conn *c, bool feed) {
  if (c->inflight) c->inflight--;
  c->last_active = uv_now(c->srv->d->loop);
  if (feed && !c->closing && !c->reading && !c->yielded && !c->srv->draining) conn_feed(c);
}

static void on_written(uv_write_t *req, int status) {
  write_req *w = (write_req *)req;
  conn *c = w->c;
  bool ends = w->ends;
  if (status < 0 && status != UV_ECANCELED)
    gs_debug("write to a client failed: %s", uv_strerror(status));
  free(w->frame);
  free(w);
  if (ends) request_done(c, true);
}

static int conn_send(conn *c, uint8_t *frame, size_t len, bool ends) {
  write_req *w = malloc(sizeof *w);
  if (!w) {
    free(frame);
    if (ends) request_done(c, false);
    return -ENOMEM;
  }
  w->c = c;
  w->ends = ends;
  w->frame = frame;
  uv_buf_t buf = uv_buf_init((char *)frame, (unsigned)len);
  int rc = uv_write(&w->req, (uv_stream_t *)&c->pipe, &buf, 1, on_written);
  if (rc < 0) {
    free(frame);
    free(w);
    if (ends) request_done(c, false);
    return -ENOMEM;
  }
  return 0;
}

int gs_server_on_close(gs_conn *c, gs_server_close_fn fn, void *arg) {
  if (!c) return 0;
  for (size_t i = 0; i < GS_SERVER_CLOSE_HOOKS; i++) {
    if (c->hooks[i].fn == fn && c->hooks[i].arg == arg) return 0;
    if (!c->hooks[i].fn) {
      c->hooks[i].fn = fn;
      c->hooks[i].arg = arg;
      return 0;
    }
  }
  return -ENOSPC;
}

int gs_server_send(gs_conn *c, Gpushare__V1__Response *resp) {
  if (!c || c->closing) return -EPIPE;
  /* Every streamed frame but a watch's non-final events ends its request. */
  bool ends = !(resp->result_case == GPUSHARE__V1__RESPONSE__RESULT_WATCH && resp->watch &&
                !(resp->watch->has_final && resp->watch->final));
  uint8_t *frame;
  size_t len;
  if (gs_wire_frame(&resp->base, &frame, &len) < 0) {
    if (ends) request_done(c, false);
    return -ENOMEM;
  }
  return conn_send(c, frame, len, ends);
}

static int on_frame(void *u, const uint8_t *body, size_t len) {
  conn *c = u;
  uint8_t *frame = NULL;
  size_t flen = 0;
  c->frames++;
  c->inflight++;
  if (c->srv->dispatch(c->srv->d, c, &c->peer, body, len, &frame, &flen) < 0) return -ENOMEM;
  if (!frame) return 0; /* a stream: in flight until gs_server_send sends its end */
  return conn_send(c, frame, flen, true) < 0 ? -EIO : 0;
}

/* How many of the len bytes at p complete the decoder's next frame (all
 * of them when they do not): feeding one frame at a time lets reading stop
 * at max_inflight between two frames of one read. */
static size_t frame_span(const gs_wire_decoder *d, const uint8_t *p, size_t len) {
  uint32_t hl = d->hdr_len, need = d->need, have = d->have;
  size_t off = 0;
  if (hl < 4) {
    uint8_t h[4];
    memcpy(h, d->hdr, hl);
    while (hl < 4 && off < len) h[hl++] = p[off++];
    if (hl < 4) return len;
    need = (uint32_t)h[0] << 24 | (uint32_t)h[1] << 16 | (uint32_t)h[2] << 8 | h[3];
    have = 0;
  }
  uint64_t end = off + (uint64_t)(need - have);
  return end < len ? (size_t)end : len;
}

/* Feed what was read, frame by frame, while the connection is under
 * max_inflight; over it, keep the rest and stop reading (backpressure: the
 * client's writes then wait in the socket), and go on when an answer has
 * gone out (request_done). */
static void conn_feed(conn *c) {
  gs_server *s = c->srv;
  while (!c->closing) {
    if (c->inflight >= s->d->cfg.max_inflight) {
      if (c->reading) {
        uv_read_stop((uv_stream_t *)&c->pipe);
        c->reading = false;
        gs_debug("uid %" PRIu32 " pid %d has %u request%s in flight (max_inflight): reading "
                 "paused until answers go out",
                 c->peer.uid, (int)c->peer.pid, c->inflight, c->inflight == 1 ? "" : "s");
      }
      return;
    }
    if (!c->pend) break;
    size_t k = frame_span(&c->dec, c->pend + c->pend_off, c->pend_len - c->pend_off);
    c->feeding = true;
    int rc = gs_wire_feed(&c->dec, c->pend + c->pend_off, k, on_frame, c);
    c->feeding = false;
    if (gs_wire_decoder_idle(&c->dec)) c->frame_since = 0;
    else if (!c->frame_since) c->frame_since = uv_now(s->d->loop);
    c->pend_off += k;
    if (c->pend_off == c->pend_len) {
      free(c->pend);
      c->pend = NULL;
    }
    if (rc == -EMSGSIZE) {
      gs_warn("uid %" PRIu32 " pid %d sent a frame longer than %" PRIu64
              " bytes (max_frame); connection closed",
              c->peer.uid, (int)c->peer.pid, s->d->cfg.max_frame);
      conn_close(c);
      return;
    }
    if (rc == -ENOBUFS) {
      conn_close(c); /* conn_grow said why */
      return;
    }
    if (rc < 0) {
      gs_warn("connection of uid %" PRIu32 " closed: %s", c->peer.uid, strerror(-rc));
      conn_close(c);
      return;
    }
  }
  if (!c->closing && !c->reading && !s->draining) {
    /* A frame's clock stops while the daemon does not read: it restarts here. */
    if (!gs_wire_decoder_idle(&c->dec)) c->frame_since = uv_now(s->d->loop);
    c->reading = true;
    if (uv_read_start((uv_stream_t *)&c->pipe, on_alloc, on_read) < 0) conn_close(c);
  }
}
static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)h;
  /* A fixed read buffer per read; the decoder copies what it keeps. */
  size_t n = suggested < 65536 ? 65536 : suggested;
  buf->base = malloc(n);
  buf->len = buf->base ? n : 0;
}

static void on_yield_check(uv_check_t *h) {
  gs_server *s = h->data;
  uv_check_stop(h);
  for (conn *c = s->conns; c; c = c->next) {
    if (!c->yielded) continue;
    c->yielded = false;
    if (c->closing || c->reading || s->draining || c->pend) continue;
    c->reading = true; /* the frame's clock runs on: the client was not held up */
    if (uv_read_start((uv_stream_t *)&c->pipe, on_alloc, on_read) < 0) conn_close(c);
  }
}

/* After GS_SERVER_READ_BURST bytes, stop reading c until the loop's next
 * turn, so that every connection, and the listening socket, is served once
 * a turn however fast one client sends. */
static void conn_yield(conn *c) {
  gs_server *s = c->srv;
  c->burst = 0;
  if (c->closing || !c->reading) return; /* already paused, at max_inflight */
  uv_read_stop((uv_stream_t *)&c->pipe);
  c->reading = false;
  c->yielded = true;
  uv_check_start(&s->yield_check, on_yield_check);
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf) {
  conn *c = (conn *)st;
  if (nread > 0 && !c->closing && !c->pend) {
    c->last_active = uv_now(c->srv->d->loop);
    c->pend = (uint8_t *)buf->base; /* conn_feed frees it once fed */
    c->pend_off = 0;
    c->pend_len = (size_t)nread;
    c->burst += (size_t)nread;
    conn_feed(c);
    if (c->burst >= GS_SERVER_READ_BURST) conn_yield(c);
    return;
  }
  if (nread < 0) {
    /* UV_EOF or an error; nread == 0 is not end of file (EAGAIN). */
    conn_close(c);
  }
  free(buf->base);
}

/* --------------------------------------------------------------- accept --- */

/* How many connections the descriptor limit leaves room for, raising the
 * soft RLIMIT_NOFILE toward the hard one when max_connections needs it:
 * accepting pauses at the smaller of the two, before descriptors run out. */
static void conn_budget(gs_server *s) {
  unsigned want = s->d->cfg.max_connections;
  struct rlimit rl;
  s->conn_cap = want;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return;
  rlim_t need = (rlim_t)want + GS_SERVER_FD_RESERVE;
  if (rl.rlim_cur < need && (rl.rlim_max == RLIM_INFINITY || rl.rlim_max > rl.rlim_cur)) {
    struct rlimit up = {rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= need ? need : rl.rlim_max,
                        rl.rlim_max};
    if (setrlimit(RLIMIT_NOFILE, &up) == 0) rl.rlim_cur = up.rlim_cur;
  }
  if (rl.rlim_cur >= need) return;
  rlim_t room = rl.rlim_cur > 2 * GS_SERVER_FD_RESERVE ? rl.rlim_cur - GS_SERVER_FD_RESERVE
                                                         : rl.rlim_cur / 2;
  s->conn_cap = room > 0 ? (unsigned)room : 1;
  gs_warn("max_connections is %u, but the descriptor limit (RLIMIT_NOFILE %llu, hard %llu) "
          "leaves room for %u connections besides the %u descriptors kept for the rest; at most "
          "%u are served at once (raise LimitNOFILE= to serve more)",
          want, (unsigned long long)rl.rlim_cur,
          rl.rlim_max == RLIM_INFINITY ? 0ull : (unsigned long long)rl.rlim_max, s->conn_cap,
          GS_SERVER_FD_RESERVE, s->conn_cap);
}

static void on_listen(uv_poll_t *h, int status, int events);
static void on_retry_timer(uv_timer_t *t);

/* Stop taking connections off the listening socket: clients that connect
 * now wait in the kernel's queue (their connect succeeds) until
 * accept_resume. Logged at warn once per pause, at most one in
 * GS_SERVER_PAUSE_LOG_MS (a limit reached again and again is counted). */
static void accept_pause(gs_server *s, int why, int err) {
  if (s->accepting) {
    uv_poll_stop(&s->listener);
    s->accepting = false;
  }
  if (why == PAUSE_FDS) uv_timer_start(&s->retry_timer, on_retry_timer, GS_SERVER_RETRY_MS, 0);
  if (s->paused == why) return;
  uint64_t now = uv_now(s->d->loop);
  bool loud = !s->pause_logged || now - s->pause_logged >= GS_SERVER_PAUSE_LOG_MS;
  char more[64] = "";
  if (loud && s->pauses_quiet)
    snprintf(more, sizeof more, " (%u more pauses since the last message)", s->pauses_quiet);
  if (why == PAUSE_FULL) {
    if (loud)
      gs_warn("%zu connections open (max_connections %u%s): accepting paused; new clients "
              "wait in the listen queue until one closes%s",
              s->n_conns, s->conn_cap, s->conn_cap < s->d->cfg.max_connections ?
              ", lowered by the descriptor limit" : "", more);
    else
      gs_debug("%zu connections open: accepting paused", s->n_conns);
  } else {
    if (loud)
      gs_warn("accept: %s with %zu connections open: accepting paused; retrying every %d ms "
            "and when a connection closes%s",
            strerror(err), s->n_conns, GS_SERVER_RETRY_MS, more);
    else
      gs_debug("accept: %s: accepting paused", strerror(err));
  }
  if (loud) {
    s->pause_logged = now;
    s->pauses_quiet = 0;
  } else {
    s->pauses_quiet++;
  }
  s->paused = why;
  s->paused_at = now;
}

static void accept_resume(gs_server *s) {
  if (s->draining || !s->listening || s->accepting || s->n_conns >= s->conn_cap) return;
  if (s->paused) {
    uv_timer_stop(&s->retry_timer);
    gs_debug("accepting again after %" PRIu64 " ms: %zu connections open",
             uv_now(s->d->loop) - s->paused_at, s->n_conns);
    s->paused = PAUSE_NONE;
  }
  if (uv_poll_start(&s->listener, UV_READABLE, on_listen) == 0) s->accepting = true;
}

static void on_retry_timer(uv_timer_t *t) {
  gs_server *s = t->data;
  if (s->paused != PAUSE_FDS) return;
  s->paused = PAUSE_NONE; /* on_listen pauses again if accept still fails */
  accept_resume(s);
}

/* Answer a connection over a limit with one Response (id 0: no request of
 * its own was read; RESOURCE_EXHAUSTED and why), then close it once that
 * is written. Logged at warn once per GS_SERVER_FLOOD_LOG_MS, at debug
 * otherwise. */
static void conn_refuse(conn *c, const char *why) {
  gs_server *s = c->srv;
  unsigned quiet = 0;
  if (flood_loud(s, &s->refuse_logged, &s->refusals_quiet, &quiet))
    gs_warn("refusing a connection of uid %" PRIu32 " pid %d: %s (%u more refusals since the "
            "last message)",
            c->peer.uid, (int)c->peer.pid, why, quiet);
  else
    gs_debug("refusing a connection of uid %" PRIu32 " pid %d: %s", c->peer.uid,
             (int)c->peer.pid, why);
  c->refused = true;
  s->n_refused++;
  Gpushare__V1__Response resp = GPUSHARE__V1__RESPONSE__INIT;
  resp.has_id = 1;
  resp.id = 0;
  resp.has_code = 1;
  resp.code = GPUSHARE__V1__CODE__RESOURCE_EXHAUSTED;
  resp.message = (char *)why;
  uint8_t *frame;
  size_t len;
  if (gs_wire_frame(&resp.base, &frame, &len) == 0) conn_send(c, frame, len, false);
  conn_finish(c);
}

/* Admit a connection whose credentials are known, or refuse it: a uid that
 * is not an admin may hold max_connections_per_uid connections, and only
 * while fewer than max_connections - admin_reserved_connections are served
 * (the last ones are kept for admins, so that an admin can always get in to
 * see and stop a flood). Then note its role for the idle timeouts. */
static void conn_admit(conn *c) {
  gs_server *s = c->srv;
  gs_daemon *d = s->d;
  bool admin = gs_auth_is_admin(&c->peer, d->have_admin_gid, d->admin_gid);
  uid_tally *t = uid_get(s, c->peer.uid);
  if (!t) {
    gs_warn("out of memory for a connection of uid %" PRIu32 "; closing it", c->peer.uid);
    conn_close(c);
    return;
  }
  unsigned reserved = d->cfg.admin_reserved_connections;
  if (reserved >= s->conn_cap) reserved = s->conn_cap - 1; /* the descriptor limit lowered it */
  size_t served = s->n_conns - s->n_refused - 1;           /* besides c */
  char why[320];
  why[0] = '\0';
  if (!admin && t->conns >= d->cfg.max_connections_per_uid)
    snprintf(why, sizeof why,
             "uid %" PRIu32 " has %u connection%s open, as many as one uid may "
             "(max_connections_per_uid %u); close one and connect again",
             c->peer.uid, t->conns, t->conns == 1 ? "" : "s", d->cfg.max_connections_per_uid);
  else if (!admin && served >= s->conn_cap - reserved)
    snprintf(why, sizeof why,
             "%zu connections are open; the last %u of the %u this daemon serves "
             "(max_connections) are kept for admins (admin_reserved_connections); try again "
             "once some close",
             served, reserved, s->conn_cap);
  if (why[0]) {
    uid_drop(s, t);
    conn_refuse(c, why);
    return;
  }
  c->who = t;
  t->conns++;
  c->role = ROLE_ADMIN;
  if (!admin) {
    gs_identity id;
    gs_err e;
    gs_err_clear(&e);
    /* A store that cannot say counts as a tenant: the short timeout is for
     * peers known to have no role. */
    if (gs_auth_identify(d->store, &c->peer, d->have_admin_gid, d->admin_gid, &id, &e) < 0)
      c->role = ROLE_TENANT;
    else
      c->role = id.tenant[0] || id.ambiguous[0] ? ROLE_TENANT : ROLE_NONE;
  }
  gs_wire_decoder_set_grow(&c->dec, conn_grow, c);
  gs_debug("connection from uid %" PRIu32 " gid %" PRIu32 " pid %d (%s; %zu open, %u of this "
           "uid)",
           c->peer.uid, c->peer.gid, (int)c->peer.pid,
           c->role == ROLE_ADMIN ? "admin" : c->role == ROLE_TENANT ? "tenant member" : "no role",
           s->n_conns, t->conns);
  conn_feed(c); /* nothing read yet: starts reading */
}

static void conn_open(gs_server *s, int fd) {
  conn *c = calloc(1, sizeof *c);
  if (!c) {
    gs_warn("out of memory for a connection; closing it");
    close(fd);
    return;
  }
  c->srv = s;
  c->seq = ++s->accepted;
  uv_pipe_init(s->d->loop, &c->pipe, 0);
  c->next = s->conns;
  if (s->conns) s->conns->prev = c;
  s->conns = c;
  s->n_conns++;
  c->last_active = uv_now(s->d->loop);
  gs_wire_decoder_init(&c->dec, (uint32_t)s->d->cfg.max_frame);
  int rc = uv_pipe_open(&c->pipe, fd);
  if (rc < 0) {
    gs_warn("cannot serve an accepted connection: %s", uv_strerror(rc));
    close(fd);
    conn_close(c);
    return;
  }
  gs_err e;
  gs_err_clear(&e);
  if (gs_auth_peer_from_fd(fd, &c->peer, &e) < 0) {
    gs_warn("refusing a connection: %s", e.msg[0] ? e.msg : "no credentials");
    conn_close(c);
    return;
  }
  conn_admit(c);
}

static void on_listen(uv_poll_t *h, int status, int events) {
  (void)events;
  gs_server *s = h->data;
  if (status < 0) {
    gs_warn("listening socket: %s", uv_strerror(status));
    return;
  }
  for (int i = 0; i < GS_SERVER_ACCEPT_BATCH && !s->draining; i++) {
    if (s->n_conns >= s->conn_cap) {
      accept_pause(s, PAUSE_FULL, 0);
      return;
    }
    int fd = accept4(s->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      int err = errno;
      if (err == EINTR || err == ECONNABORTED) continue;
      if (err == EAGAIN || err == EWOULDBLOCK) return;
      if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
        accept_pause(s, PAUSE_FDS, err);
        return;
      }
      gs_warn("accept: %s", strerror(err));
      return;
    }
    conn_open(s, fd);
  }
  if (s->n_conns >= s->conn_cap) accept_pause(s, PAUSE_FULL, 0);
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
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  if (strlen(s->path) >= sizeof addr.sun_path)
    return gs_err_set(e, GS_INVALID_ARGUMENT, "socket_path",
                      "%s is %zu bytes long; a Unix socket path has at most %zu", s->path,
                      strlen(s->path), sizeof addr.sun_path - 1);
  memcpy(addr.sun_path, s->path, strlen(s->path) + 1);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return gs_err_set(e, GS_FAILED_PRECONDITION, "socket_path", "cannot make a socket: %s",
                      strerror(errno));
  mode_t old = umask(~(mode_t)cfg->socket_mode & 0777);
  int rc = bind(fd, (struct sockaddr *)&addr, sizeof addr);
  int err = errno;
  umask(old);
  if (rc < 0) {
    close(fd);
    return gs_err_set(e, GS_FAILED_PRECONDITION, "socket_path", "cannot bind %s: %s", s->path,
                      strerror(err));
  }
  s->listen_fd = fd;
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

/* Bytes waiting unread on c's socket (the loop was held up, and timers run
 * before reads): the client is not idle, nor late with its frame. */
static bool conn_unread(conn *c) {
  uv_os_fd_t fd;
  int unread = 0;
  return uv_fileno((uv_handle_t *)&c->pipe, &fd) == 0 && ioctl(fd, FIONREAD, &unread) == 0 &&
         unread > 0;
}

/* The idle limit of c in seconds, 0 for none: idle_timeout_s, or for a peer
 * with no role the shorter idle_timeout_norole_s. */
static unsigned conn_idle_limit(const gs_server *s, const conn *c) {
  unsigned idle = s->d->cfg.idle_timeout_s, norole = s->d->cfg.idle_timeout_norole_s;
  if (c->role == ROLE_NONE && norole && (!idle || norole < idle)) return norole;
  return idle;
}

/* Once a second. Close the connections that began a frame more than
 * frame_timeout_s ago and have not sent the rest while the daemon was
 * reading (a client trickling bytes holds no slot past that), and the
 * connections with nothing in flight (no request unanswered, no watch
 * streaming) and nothing read for their idle limit (0 turns it off). */
static void on_sweep_timer(uv_timer_t *t) {
  gs_server *s = t->data;
  if (s->draining) return;
  uint64_t now = uv_now(s->d->loop);
  uint64_t frame_ms = (uint64_t)s->d->cfg.frame_timeout_s * 1000;
  for (conn *c = s->conns; c; c = c->next) {
    if (c->closing || c->refused) continue;
    if (c->reading && c->frame_since && now - c->frame_since >= frame_ms && !conn_unread(c)) {
      if (c->dec.hdr_len < 4)
        gs_info("closing the connection of uid %" PRIu32 " pid %d: %u of a frame's 4 length "
                "bytes arrived in %" PRIu64 " s (frame_timeout_s %u)",
                c->peer.uid, (int)c->peer.pid, c->dec.hdr_len, (now - c->frame_since) / 1000,
                s->d->cfg.frame_timeout_s);
      else
        gs_info("closing the connection of uid %" PRIu32 " pid %d: %" PRIu32 " of a frame's %"
                PRIu32 " bytes arrived in %" PRIu64 " s (frame_timeout_s %u)",
                c->peer.uid, (int)c->peer.pid, c->dec.have, c->dec.need,
                (now - c->frame_since) / 1000, s->d->cfg.frame_timeout_s);
      conn_close(c); /* not conn_finish: such a client may not read its answers either */
      continue;
    }
    unsigned idle = conn_idle_limit(s, c);
    if (!idle || c->inflight || now - c->last_active < (uint64_t)idle * 1000 || conn_unread(c))
      continue;
    gs_debug("closing the connection of uid %" PRIu32 " pid %d: idle for %u s (%s)",
             c->peer.uid, (int)c->peer.pid, idle,
             idle == s->d->cfg.idle_timeout_s ? "idle_timeout_s" : "idle_timeout_norole_s");
    conn_finish(c);
  }
}

int gs_server_listen(gs_daemon *d, gs_server_dispatch dispatch, gs_server **out, gs_err *e) {
  gs_server *s = calloc(1, sizeof *s);
  if (!s) return gs_err_set(e, GS_INTERNAL, "", "out of memory");
  s->d = d;
  s->dispatch = dispatch;
  s->listen_fd = -1;
  snprintf(s->path, sizeof s->path, "%s", d->cfg.socket_path);
  int fd = gs_notify_listen_fd();
  if (fd >= 0) {
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) {
      gs_err_set(e, GS_FAILED_PRECONDITION, "", "cannot use the socket systemd passed: %s",
                 strerror(errno));
      close(fd);
      goto fail;
    }
    s->listen_fd = fd;
    snprintf(s->path, sizeof s->path, "(socket activation)");
    gs_info("using the listening socket passed by systemd");
  } else if (bind_path(s, e) < 0) {
    goto fail;
  } else if (listen(s->listen_fd, SOMAXCONN) < 0) {
    gs_err_set(e, GS_FAILED_PRECONDITION, "socket_path", "cannot listen on %s: %s", s->path,
               strerror(errno));
    goto fail;
  }
  /* Accepting is ours, not uv_listen's, so that it can pause (at
   * max_connections, or out of descriptors) with clients left waiting in
   * the kernel's queue rather than accepted and dropped. */
  int rc = uv_poll_init(d->loop, &s->listener, s->listen_fd);
  if (rc < 0) {
    gs_err_set(e, GS_FAILED_PRECONDITION, "socket_path", "cannot poll %s: %s", s->path,
               uv_strerror(rc));
    goto fail;
  }
  s->listener.data = s;
  s->listening = true;
  uv_timer_init(d->loop, &s->retry_timer);
  uv_timer_init(d->loop, &s->sweep_timer);
  s->retry_timer.data = s->sweep_timer.data = s;
  uv_unref((uv_handle_t *)&s->retry_timer);
  uv_timer_start(&s->sweep_timer, on_sweep_timer, 1000, 1000);
  uv_unref((uv_handle_t *)&s->sweep_timer);
  uv_check_init(d->loop, &s->yield_check);
  s->yield_check.data = s;
  conn_budget(s);
  accept_resume(s);
  uv_timer_init(d->loop, &s->drain_timer);
  s->drain_timer.data = s;
  *out = s;
  d->server = s;
  return 0;
fail:
  if (s->owns_path) unlink(s->path);
  if (s->listen_fd >= 0) close(s->listen_fd);
  free(s);
  return gs_err_rc(e);
}

const char *gs_server_path(const gs_server *s) { return s->path; }
size_t gs_server_connections(const gs_server *s) { return s->n_conns; }

static void on_drain_timeout(uv_timer_t *t) {
  gs_server *s = t->data;
  /* Responses still queued after the grace period: close anyway. */
  for (conn *c = s->conns; c; c = c->next)
    if (!uv_is_closing((uv_handle_t *)&c->pipe)) uv_close((uv_handle_t *)&c->pipe, on_conn_closed);
}

/* Stop accepting for good: clients still in the listen queue see the
 * socket close. */
static void listener_close(gs_server *s) {
  if (!s->listening) return;
  uv_close((uv_handle_t *)&s->listener, NULL); /* stops the poll first */
  s->listening = s->accepting = false;
  close(s->listen_fd);
  s->listen_fd = -1;
}

void gs_server_drain(gs_server *s) {
  if (s->draining) return;
  s->draining = true;
  gs_notify("STOPPING=1\nSTATUS=draining connections");
  gs_info("draining: %zu connection%s open", s->n_conns, s->n_conns == 1 ? "" : "s");
  listener_close(s);
  uv_close((uv_handle_t *)&s->retry_timer, NULL);
  uv_close((uv_handle_t *)&s->sweep_timer, NULL);
  uv_close((uv_handle_t *)&s->yield_check, NULL);
  /* Stop reading; what is already queued for writing still goes out. */
  for (conn *c = s->conns; c; c = c->next) conn_finish(c);
  uv_timer_start(&s->drain_timer, on_drain_timeout, 5000, 0);
  uv_unref((uv_handle_t *)&s->drain_timer);
}

/* After a reload: max_frame from each connection's next frame (one being
 * read was checked against the old value), accepting and reading resumed
 * where a limit went up. */
void gs_server_limits_changed(gs_server *s) {
  gs_daemon *d = s->d;
  conn_budget(s);
  for (conn *c = s->conns; c; c = c->next) {
    c->dec.max = (uint32_t)d->cfg.max_frame;
    if (!c->closing && !c->reading && !c->yielded && c->inflight < d->cfg.max_inflight)
      conn_feed(c);
  }
  accept_resume(s);
}

void gs_server_free(gs_server *s) {
  if (!s) return;
  if (s->owns_path) unlink(s->path);
  listener_close(s);
  uv_handle_t *timers[] = {(uv_handle_t *)&s->drain_timer, (uv_handle_t *)&s->retry_timer,
                           (uv_handle_t *)&s->sweep_timer, (uv_handle_t *)&s->yield_check};
  for (size_t i = 0; i < 4; i++)
    if (!uv_is_closing(timers[i])) uv_close(timers[i], NULL);
  uv_run(s->d->loop, UV_RUN_NOWAIT);
  s->d->server = NULL;
  free(s);
}
