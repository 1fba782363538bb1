/*
 * rpc_internal.h: what the rpc handlers share (rpc.c for the admin calls,
 * datasets.c and jobs.c for theirs): the per-request arena their results
 * are built in, and the call context.
 */
#ifndef GS_RPC_INTERNAL_H
#define GS_RPC_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "control/auth.h"
#include "control/daemon.h"
#include "proto/gpushare.pb-c.h"

/* A per-request arena: protobuf-c result messages are built here and freed
 * in one go once packed, so no handler needs a cleanup ladder for them. */
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

typedef struct gs_conn gs_conn; /* a client connection (server.c) */

typedef struct call_ctx {
  gs_daemon *d;
  const gs_peer *peer;
  gs_conn *conn;     /* for streams (watch) */
  uint64_t req_id;   /* the request's id, echoed */
  gs_identity id;
  arena ar;
  Gpushare__V1__Response *resp;
  bool deferred;     /* the handler answers later (a stream); send nothing now */
} call_ctx;

/* Handlers: fill c->resp's result (from c->ar) and return 0, or fill e. */
typedef int (*gs_rpc_handler)(call_ctx *c, const Gpushare__V1__Request *rq, gs_err *e);

/* Send a whole framed Response to a connection later (streams). Returns -1
 * when the connection is gone. */
int gs_conn_send_response(gs_conn *conn, Gpushare__V1__Response *resp);
/* Stable for the life of the connection; streams hold it, and are told by
 * gs_jobs_conn_closed when it goes. */

#endif
