/*
 * rpc.h: the control plane's dispatcher: one request frame in, one framed
 * response out. Every handler states the role it needs (auth.h); input
 * errors come back as the Response's code, field and message.
 */
#ifndef GS_RPC_H
#define GS_RPC_H

#include <stddef.h>
#include <stdint.h>

#include "control/auth.h"
#include "control/call.h"
#include "control/daemon.h"

/* Handle one frame body from peer (conn: the connection it came on, NULL
 * for a call made outside one). On return *frame holds the framed Response
 * (malloc'd; the caller writes and frees it), or NULL when the handler
 * answers later (a watch stream sends its responses itself through
 * gs_server_send). Returns 0, or -1 when no response could be built at all
 * (out of memory). A gs_server_dispatch. */
int gs_rpc_handle(gs_daemon *d, gs_conn *conn, const gs_peer *peer, const uint8_t *body,
                  size_t len, uint8_t **frame, size_t *frame_len);
/* Free what the handlers keep between calls (watch streams, uploads). */
void gs_rpc_free(gs_daemon *d);

#endif
