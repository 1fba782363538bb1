/*
 * server.h: the control socket: listen (bind with the configured mode and
 * group, or adopt systemd's socket), accept with peer credentials, frame,
 * hand each request to the dispatcher main.c gives it, write the answers.
 *
 * The server knows frames and connections, not calls: the dispatcher is a
 * function pointer (gs_rpc_handle in gpushared), so the handlers below it
 * may use the connection API here without a circle. What a handler may do
 * with its connection: send a response later (a stream), and have a
 * function called when the connection closes (to drop its watchers or
 * uploads).
 */
#ifndef GS_SERVER_H
#define GS_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "control/auth.h"
#include "control/daemon.h"
#include "proto/gpushare.pb-c.h"

typedef struct gs_conn gs_conn;

/* One frame body from peer in; *frame the framed answer (malloc'd), or NULL
 * when the answer comes later through gs_server_send. 0, or -1 when no
 * answer could be built at all. */
typedef int (*gs_server_dispatch)(gs_daemon *d, gs_conn *conn, const gs_peer *peer,
                                  const uint8_t *body, size_t len, uint8_t **frame,
                                  size_t *frame_len);

int gs_server_listen(gs_daemon *d, gs_server_dispatch dispatch, gs_server **out, gs_err *e);
/* Stop accepting and close every connection once its answers are out. */
void gs_server_drain(gs_server *s);
void gs_server_free(gs_server *s);
const char *gs_server_path(const gs_server *s);
size_t gs_server_connections(const gs_server *s);
/* The live limits of d->cfg changed (a reload): max_connections,
 * max_inflight and max_frame apply from now on; the per-uid and admin
 * connection limits from the next connection, the timeouts from the next
 * sweep, max_pending_frame_bytes from the next growth of a frame buffer. */
void gs_server_limits_changed(gs_server *s);

/* Send a whole framed Response on a connection later (streams). Returns 0,
 * -EPIPE when the connection is gone (or conn is NULL), or -ENOMEM. */
int gs_server_send(gs_conn *conn, Gpushare__V1__Response *resp);
/* Call fn(arg, conn) once conn closes; registering the same fn and arg
 * again is a no-op. A NULL conn (a call made outside a connection: tests,
 * the fuzzer) never closes: 0, nothing registered. -ENOSPC when the
 * connection has no room for another hook. */
typedef void (*gs_server_close_fn)(void *arg, gs_conn *conn);
int gs_server_on_close(gs_conn *conn, gs_server_close_fn fn, void *arg);

#endif
