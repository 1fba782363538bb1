/*
 * call.h: one request's call context, shared by the dispatcher (rpc.c) and
 * the handlers (rpc_admin.c, rpc_jobs.c, rpc_datasets.c).
 *
 * A handler gets a gs_call: the daemon, the peer and the identity auth.c
 * gave it, the connection it came on (opaque: what a handler may do with it
 * is in server.h), the request's id, and a per-request arena. Protobuf-c
 * result messages are built in the arena and freed in one go once the
 * response is packed, so no handler needs a cleanup ladder for them.
 */
#ifndef GS_CALL_H
#define GS_CALL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "control/auth.h"
#include "control/daemon.h"
#include "proto/gpushare.pb-c.h"

/* The per-request arena. */
typedef struct gs_call_chunk gs_call_chunk;
typedef struct gs_call_arena {
  gs_call_chunk *head;
  bool failed; /* an allocation failed: the handler's result is not sent */
} gs_call_arena;

void *gs_call_alloc(gs_call_arena *a, size_t n);   /* zeroed, 16-byte aligned */
char *gs_call_strdup(gs_call_arena *a, const char *s);
void *gs_call_memdup(gs_call_arena *a, const void *p, size_t n);
void gs_call_arena_free(gs_call_arena *a);
void *gs_call_msg_init(gs_call_arena *a, size_t n, const void *init);
/* A protobuf-c message of type T from the arena, set to its INIT value. */
#define GS_CALL_MSG(a, T, INIT) ((T *)gs_call_msg_init((a), sizeof(T), &(T)INIT))

typedef struct gs_conn gs_conn; /* a client connection (server.c); NULL outside one */

typedef struct gs_call {
  gs_daemon *d;
  const gs_peer *peer;
  gs_conn *conn;     /* for streams (watch) and per-connection state (uploads) */
  uint64_t req_id;   /* the request's id, echoed */
  gs_identity id;
  gs_call_arena ar;
  Gpushare__V1__Response *resp;
  bool deferred;     /* the handler answers later (a stream); send nothing now */
} gs_call;

/* Handlers: fill c->resp's result (from c->ar) and return 0, or fill e. */
typedef int (*gs_rpc_handler)(gs_call *c, const Gpushare__V1__Request *rq, gs_err *e);

#endif
