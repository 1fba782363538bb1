/*
 * gs_client.h: libgpushare, the C client of gpushared.
 *
 * A gs_client is one blocking connection to the daemon's Unix socket. Calls
 * are strictly one at a time: gs_client_call frames a Request, gives it the
 * next request id, and reads Responses until the one carrying that id
 * arrives (a different id is a protocol error, since nothing else is in
 * flight). A Watch is a call whose answer is a stream: gs_client_send starts
 * it, gs_client_recv returns each Response of the stream until one has
 * `final` set. The daemon knows who we are from the socket's credentials;
 * nothing in a request claims an identity.
 *
 * Return values: 0 when the daemon answered OK; GS_CLIENT_REFUSED when it
 * answered with another code (e carries code, message and field exactly as
 * the daemon sent them, and *resp is still returned, since a refusal may
 * carry detail such as the Plan of a job that does not fit); another
 * negative -errno when the connection failed (e->code GS_UNAVAILABLE, or
 * GS_INTERNAL for a malformed answer, with a message naming the socket).
 */
#ifndef GS_CLIENT_H
#define GS_CLIENT_H

#include <errno.h>
#include <stdint.h>

#include "common/error.h"
#include "proto/gpushare.pb-c.h"

#define GS_CLIENT_DEFAULT_SOCKET "/run/gpushared.sock"
#define GS_CLIENT_REFUSED (-EREMOTEIO) /* the daemon answered, with a non-OK code */
#define GS_CLIENT_CHUNK (1u << 20)     /* upload/download chunk: 1 MiB */

typedef struct gs_client gs_client;

/* $GPUSHARE_SOCKET if set and non-empty, else GS_CLIENT_DEFAULT_SOCKET. */
const char *gs_client_default_socket(void);

/* Connect to socket_path (NULL: gs_client_default_socket()). On failure
 * e->msg is "cannot connect to PATH: REASON". */
int gs_client_connect(const char *socket_path, gs_client **c, gs_err *e);
void gs_client_close(gs_client *c);
const char *gs_client_socket_path(const gs_client *c);

/* One request, one response. req->id is assigned here; the echoed id is
 * checked. *resp (may be set also on GS_CLIENT_REFUSED) is freed with
 * gs_client_free_response. */
int gs_client_call(gs_client *c, Gpushare__V1__Request *req, Gpushare__V1__Response **resp,
                   gs_err *e);

/* Streams (Watch): send a request without waiting; *id receives its id. */
int gs_client_send(gs_client *c, Gpushare__V1__Request *req, uint64_t *id, gs_err *e);
/* Read the next Response of request id (blocking). -EPIPE with e set when
 * the daemon closed the connection. */
int gs_client_recv(gs_client *c, uint64_t id, Gpushare__V1__Response **resp, gs_err *e);

void gs_client_free_response(Gpushare__V1__Response *resp);

/* --- typed helpers for the calls that are more than one round trip --- */

/* Upload the file at path as dataset `name` in GS_CLIENT_CHUNK chunks,
 * computing its sha256 on the way and sending it at commit. sha256_hex
 * (65 bytes, may be NULL) receives the daemon's digest of the committed
 * dataset (ours when the daemon does not echo one); *info (may be NULL)
 * the daemon's DatasetInfo, freed with gpushare__v1__dataset_info__free_unpacked
 * (NULL, it is a deep copy). Local read errors fill e with GS_INVALID_ARGUMENT
 * and field "file". */
int gs_client_upload_file(gs_client *c, const char *name, const char *path, char sha256_hex[65],
                          Gpushare__V1__DatasetInfo **info, gs_err *e);
/* The same for a file of another format (gpushare.v1.DatasetFormat: the
 * daemon checks the file as that at commit; vocab_size for
 * DATASET_FORMAT_TOKENS_U16). gs_client_upload_file is this with
 * DATASET_FORMAT_IDX. */
int gs_client_upload_file_as(gs_client *c, const char *name, const char *path,
                             Gpushare__V1__DatasetFormat format, uint32_t vocab_size,
                             char sha256_hex[65], Gpushare__V1__DatasetInfo **info, gs_err *e);

/* sha256 of a local file, as lowercase hex; 0 or -errno with e set. */
int gs_client_sha256_file(const char *path, char hex[65], uint64_t *bytes, gs_err *e);

/* Download a job's weights (or its last checkpoint) to fd, chunked by
 * offset; *total receives the byte count. */
int gs_client_fetch(gs_client *c, uint64_t job_id, int checkpoint, int fd, uint64_t *total,
                    gs_err *e);

#endif
