/*
 * call.h: one request's call context, shared by the dispatcher (rpc.c) and
 * the handlers (rpc_admin.c, rpc_jobs.c, rpc_datasets.c).
 *
 * A handler gets a call_ctx: the daemon, the peer and the identity auth.c
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
typedef struct ar_chunk ar_chunk;
typedef struct arena {
  ar_chunk *head;
  bool failed; /* an allocation failed: the handler's result is not sent */
} arena;

void *ar_alloc(arena *a, size_t n);   /* zeroed, 16-byte aligned */
char *ar_strdup(arena *a, const char *s);
void *ar_memdup(arena *a, const void *p, size_t n);
void ar_free(arena *a);
void *ar_init(arena *a, size_t n, const void *init);
/* A protobuf-c message of type T from the arena, set to its INIT value. */
#define AR_MSG(a, T, INIT) ((T *)ar_init((a), sizeof(T), &(T)INIT))

typedef struct gs_conn gs_conn; /* a client connection (server.c); NULL outside one */

typedef struct call_ctx {
  gs_daemon *d;
  const gs_peer *peer;
  gs_conn *conn;     /* for streams (watch) and per-connection state (uploads) */
  uint64_t req_id;   /* the request's id, echoed */
  gs_identity id;
  arena ar;
  Gpushare__V1__Response *resp;
  bool deferred;     /* the handler answers later (a stream); send nothing now */
} call_ctx;

/* Handlers: fill c->resp's result (from c->ar) and return 0, or fill e. */
typedef int (*gs_rpc_handler)(call_ctx *c, const Gpushare__V1__Request *rq, gs_err *e);

#endif
