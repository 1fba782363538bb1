/*
 * client.c: libgpushare's connection to gpushared.
 *
 * The connection is a plain blocking AF_UNIX stream socket: a CLI or a test
 * has nothing else to do while it waits for the daemon. Framing is
 * proto/wire.c's; every read checks the announced length against
 * GS_WIRE_MAX_FRAME before allocating, exactly as the daemon does. Request
 * ids count up from 1 per connection, and a response must echo the id of the
 * request in flight, so a confused peer is caught at once instead of
 * answering the wrong question. The one answer with id 0 is the daemon's
 * refusal of the connection itself (over a connection limit), written as
 * it accepts and followed by its close: it is the answer to whatever request
 * was sent, and is read even when sending failed because the daemon had
 * already closed. Uploads and downloads go in 1 MiB chunks so
 * no frame comes near the 16 MiB limit, however large the dataset.
 */
#include "client/client.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/sha256.h"
#include "proto/wire.h"

struct gs_client {
  int fd;           /* connected socket */
  uint64_t next_id; /* id of the next request */
  char path[108];   /* socket path, for messages */
};

const char *gs_client_default_socket(void) {
  const char *env = getenv("GPUSHARE_SOCKET");
  return (env && *env) ? env : GS_CLIENT_DEFAULT_SOCKET;
}

int gs_client_connect(const char *socket_path, gs_client **out, gs_err *e) {
  if (!socket_path) socket_path = gs_client_default_socket();
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  if (strlen(socket_path) >= sizeof sa.sun_path) {
    gs_err_set(e, GS_INVALID_ARGUMENT, "socket",
               "cannot connect to %s: the path is longer than %zu bytes", socket_path,
               sizeof sa.sun_path - 1);
    return -ENAMETOOLONG;
  }
  strcpy(sa.sun_path, socket_path);
  gs_client *c = calloc(1, sizeof *c);
  if (!c) {
    gs_err_set(e, GS_INTERNAL, "", "out of memory");
    return -ENOMEM;
  }
  int rc;
  c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (c->fd < 0) {
    rc = -errno;
    gs_err_set(e, GS_UNAVAILABLE, "", "cannot connect to %s: %s", socket_path, strerror(errno));
    goto fail_alloc;
  }
  while (connect(c->fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
    if (errno == EINTR) continue;
    rc = -errno;
    gs_err_set(e, GS_UNAVAILABLE, "", "cannot connect to %s: %s", socket_path, strerror(errno));
    goto fail_socket;
  }
  c->next_id = 1;
  snprintf(c->path, sizeof c->path, "%s", socket_path);
  *out = c;
  return 0;
fail_socket:
  close(c->fd);
fail_alloc:
  free(c);
  return rc;
}

void gs_client_close(gs_client *c) {
  if (!c) return;
  close(c->fd);
  free(c);
}

const char *gs_client_socket_path(const gs_client *c) { return c->path; }

void gs_client_free_response(Gpushare__V1__Response *resp) {
  if (resp) gpushare__v1__response__free_unpacked(resp, NULL);
}

int gs_client_send(gs_client *c, Gpushare__V1__Request *req, uint64_t *id, gs_err *e) {
  req->has_id = 1;
  req->id = c->next_id++;
  uint8_t *buf;
  size_t len;
  int rc = gs_wire_frame(&req->base, &buf, &len);
  if (rc) {
    gs_err_set(e, GS_INVALID_ARGUMENT, "",
               rc == -EMSGSIZE ? "the request is larger than the %u-byte frame limit"
                               : "cannot frame the request (%u-byte limit): out of memory",
               GS_WIRE_MAX_FRAME);
    return rc;
  }
  rc = gs_wire_write_all(c->fd, buf, len);
  free(buf);
  if (rc == -EPIPE || rc == -ECONNRESET) {
    /* Closed by the daemon: a refusal it wrote first is still there to read. */
    Gpushare__V1__Response *r = NULL;
    gs_err re;
    gs_err_clear(&re);
    if (gs_client_recv(c, 0, &r, &re) == GS_CLIENT_REFUSED) {
      gs_client_free_response(r);
      if (e) *e = re;
      return GS_CLIENT_REFUSED;
    }
    gs_client_free_response(r);
  }
  if (rc) {
    gs_err_set(e, GS_UNAVAILABLE, "", "lost the connection to %s while sending: %s", c->path,
               strerror(-rc));
    return rc;
  }
  if (id) *id = req->id;
  return 0;
}

int gs_client_recv(gs_client *c, uint64_t id, Gpushare__V1__Response **out, gs_err *e) {
  uint8_t *body;
  size_t len;
  *out = NULL;
  int rc = gs_wire_read_frame(c->fd, GS_WIRE_MAX_FRAME, &body, &len);
  if (rc == -EPIPE || rc == -ECONNRESET) {
    gs_err_set(e, GS_UNAVAILABLE, "", "gpushared at %s closed the connection%s", c->path,
               rc == -ECONNRESET ? " in the middle of a response" : "");
    return -EPIPE;
  }
  if (rc == -EMSGSIZE) {
    gs_err_set(e, GS_INTERNAL, "frame",
               "gpushared at %s announced a response over the %u-byte frame limit", c->path,
               GS_WIRE_MAX_FRAME);
    return rc;
  }
  if (rc) {
    gs_err_set(e, GS_UNAVAILABLE, "", "cannot read from %s: %s", c->path, strerror(-rc));
    return rc;
  }
  Gpushare__V1__Response *r = gs_wire_unpack_response(body, len, e);
  free(body);
  if (!r) {
    if (e) e->code = GS_INTERNAL;
    return -EPROTO;
  }
  int refusal = r->has_id && r->id == 0 && r->has_code && r->code != GPUSHARE__V1__CODE__OK;
  if (!refusal && (!r->has_id || r->id != id)) {
    gs_err_set(e, GS_INTERNAL, "id", "gpushared answered request %llu with id %llu%s",
               (unsigned long long)id, (unsigned long long)r->id, r->has_id ? "" : " (unset)");
    gs_client_free_response(r);
    return -EPROTO;
  }
  *out = r;
  int code = r->has_code ? (int)r->code : GS_OK;
  if (code != GS_OK) {
    gs_err_set(e, code, r->field ? r->field : "", "%s",
               r->message && *r->message ? r->message : "(the daemon gave no reason)");
    return GS_CLIENT_REFUSED;
  }
  return 0;
}

int gs_client_call(gs_client *c, Gpushare__V1__Request *req, Gpushare__V1__Response **resp,
                   gs_err *e) {
  uint64_t id;
  *resp = NULL;
  int rc = gs_client_send(c, req, &id, e);
  if (rc) return rc;
  return gs_client_recv(c, id, resp, e);
}

/* ------------------------------------------------------------- helpers --- */

int gs_client_sha256_file(const char *path, char hex[65], uint64_t *bytes, gs_err *e) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int rc = -errno;
    gs_err_set(e, GS_INVALID_ARGUMENT, "file", "cannot read %s: %s", path, strerror(errno));
    return rc;
  }
  uint8_t *buf = malloc(GS_CLIENT_CHUNK);
  int rc = 0;
  if (!buf) {
    rc = -ENOMEM;
    gs_err_set(e, GS_INTERNAL, "", "out of memory");
    goto fail_fd;
  }
  gs_sha256 s;
  gs_sha256_init(&s);
  for (;;) {
    ssize_t n = read(fd, buf, GS_CLIENT_CHUNK);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      rc = -errno;
      gs_err_set(e, GS_INVALID_ARGUMENT, "file", "cannot read %s: %s", path, strerror(errno));
      goto fail_buf;
    }
    if (n == 0) break;
    gs_sha256_update(&s, buf, (size_t)n);
  }
  uint8_t d[32];
  if (bytes) *bytes = s.bytes;
  gs_sha256_final(&s, d);
  gs_sha256_hex(d, hex);
fail_buf:
  free(buf);
fail_fd:
  close(fd);
  return rc;
}

/* Read up to len bytes (short only at end of file). */
static ssize_t read_full(int fd, uint8_t *buf, size_t len) {
  size_t got = 0;
  while (got < len) {
    ssize_t n = read(fd, buf + got, len - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -1;
    if (n == 0) break;
    got += (size_t)n;
  }
  return (ssize_t)got;
}

static Gpushare__V1__DatasetInfo *dup_info(const Gpushare__V1__DatasetInfo *in) {
  size_t n = gpushare__v1__dataset_info__get_packed_size(in);
  uint8_t *buf = malloc(n ? n : 1);
  if (!buf) return NULL;
  gpushare__v1__dataset_info__pack(in, buf);
  Gpushare__V1__DatasetInfo *out = gpushare__v1__dataset_info__unpack(NULL, n, buf);
  free(buf);
  return out;
}

int gs_client_upload_file(gs_client *c, const char *name, const char *path, char sha256_hex[65],
                          Gpushare__V1__DatasetInfo **info, gs_err *e) {
  return gs_client_upload_file_as(c, name, path, GPUSHARE__V1__DATASET_FORMAT__DATASET_FORMAT_IDX,
                                  0, sha256_hex, info, e);
}

int gs_client_upload_file_as(gs_client *c, const char *name, const char *path,
                             Gpushare__V1__DatasetFormat format, uint32_t vocab_size,
                             char sha256_hex[65], Gpushare__V1__DatasetInfo **info, gs_err *e) {
  int rc;
  if (info) *info = NULL;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    rc = -errno;
    gs_err_set(e, GS_INVALID_ARGUMENT, "file", "cannot read %s: %s", path, strerror(errno));
    return rc;
  }
  off_t size = lseek(fd, 0, SEEK_END);
  if (size < 0 || lseek(fd, 0, SEEK_SET) < 0) {
    rc = -errno;
    gs_err_set(e, GS_INVALID_ARGUMENT, "file", "cannot read %s: %s (not a regular file?)", path,
               strerror(errno));
    goto fail_fd;
  }
  uint8_t *buf = malloc(GS_CLIENT_CHUNK);
  if (!buf) {
    rc = -ENOMEM;
    gs_err_set(e, GS_INTERNAL, "", "out of memory");
    goto fail_fd;
  }
  gs_sha256 s;
  gs_sha256_init(&s);
  char hex[65] = "";
  uint64_t upload_id = 0, sent = 0;
  Gpushare__V1__Response *resp = NULL;
  for (int first = 1;; first = 0) {
    ssize_t n = read_full(fd, buf, GS_CLIENT_CHUNK);
    if (n < 0) {
      rc = -errno;
      gs_err_set(e, GS_INVALID_ARGUMENT, "file", "cannot read %s: %s", path, strerror(errno));
      goto fail_buf;
    }
    gs_sha256_update(&s, buf, (size_t)n);
    sent += (uint64_t)n;
    /* The last chunk is the one that reaches the announced size (or a
     * short read: the file shrank, and the daemon's size check says so). */
    int last = sent >= (uint64_t)size || (size_t)n < GS_CLIENT_CHUNK;
    Gpushare__V1__Request req = GPUSHARE__V1__REQUEST__INIT;
    Gpushare__V1__UploadDatasetRequest up = GPUSHARE__V1__UPLOAD_DATASET_REQUEST__INIT;
    req.call_case = GPUSHARE__V1__REQUEST__CALL_UPLOAD_DATASET;
    req.upload_dataset = &up;
    if (first) {
      up.name = (char *)name;
      up.has_total_bytes = 1;
      up.total_bytes = (uint64_t)size;
      /* IDX is the default: an older daemon, which knows no format, is
       * sent none. */
      if (format != GPUSHARE__V1__DATASET_FORMAT__DATASET_FORMAT_IDX) {
        up.has_format = 1;
        up.format = format;
      }
      if (format == GPUSHARE__V1__DATASET_FORMAT__DATASET_FORMAT_TOKENS_U16) {
        up.has_vocab_size = 1;
        up.vocab_size = vocab_size;
      }
    } else {
      up.has_upload_id = 1;
      up.upload_id = upload_id;
    }
    up.has_data = 1;
    up.data.data = buf;
    up.data.len = (size_t)n;
    if (last) {
      uint8_t d[32];
      gs_sha256_final(&s, d);
      gs_sha256_hex(d, hex);
      up.has_commit = 1;
      up.commit = 1;
      up.sha256 = hex;
    }
    gs_client_free_response(resp);
    rc = gs_client_call(c, &req, &resp, e);
    if (rc) {
      if (rc == GS_CLIENT_REFUSED && e && !e->field[0]) snprintf(e->field, sizeof e->field, "upload");
      goto fail_resp;
    }
    if (resp->result_case != GPUSHARE__V1__RESPONSE__RESULT_UPLOAD_DATASET) {
      rc = -EPROTO;
      gs_err_set(e, GS_INTERNAL, "", "gpushared answered an upload chunk with another call's result");
      goto fail_resp;
    }
    if (first) upload_id = resp->upload_dataset->upload_id;
    if (last) break;
  }
  const Gpushare__V1__DatasetInfo *di = resp->upload_dataset->dataset;
  if (sha256_hex) snprintf(sha256_hex, 65, "%s", di && di->sha256 && *di->sha256 ? di->sha256 : hex);
  if (info && di) {
    *info = dup_info(di);
    if (!*info) {
      rc = -ENOMEM;
      gs_err_set(e, GS_INTERNAL, "", "out of memory");
      goto fail_resp;
    }
  }
  rc = 0;
fail_resp:
  gs_client_free_response(resp);
fail_buf:
  free(buf);
fail_fd:
  close(fd);
  return rc;
}

int gs_client_fetch(gs_client *c, uint64_t job_id, int checkpoint, int fd, uint64_t *total,
                    gs_err *e) {
  uint64_t offset = 0;
  for (;;) {
    Gpushare__V1__Request req = GPUSHARE__V1__REQUEST__INIT;
    Gpushare__V1__FetchRequest fr = GPUSHARE__V1__FETCH_REQUEST__INIT;
    req.call_case = GPUSHARE__V1__REQUEST__CALL_FETCH;
    req.fetch = &fr;
    fr.has_id = 1;
    fr.id = job_id;
    fr.has_checkpoint = 1;
    fr.checkpoint = checkpoint ? 1 : 0;
    fr.has_offset = 1;
    fr.offset = offset;
    Gpushare__V1__Response *resp;
    int rc = gs_client_call(c, &req, &resp, e);
    if (rc) {
      gs_client_free_response(resp);
      return rc;
    }
    const Gpushare__V1__FetchResponse *f = resp->fetch;
    if (resp->result_case != GPUSHARE__V1__RESPONSE__RESULT_FETCH ||
        (f->has_offset && f->offset != offset)) {
      gs_err_set(e, GS_INTERNAL, "", "gpushared answered a fetch at offset %llu with %s",
                 (unsigned long long)offset,
                 resp->result_case != GPUSHARE__V1__RESPONSE__RESULT_FETCH ? "another call's result"
                                                                            : "another offset");
      gs_client_free_response(resp);
      return -EPROTO;
    }
    size_t n = f->has_data ? f->data.len : 0;
    rc = n ? gs_wire_write_all(fd, f->data.data, n) : 0;
    int last = f->has_last && f->last;
    uint64_t announced = f->total_bytes;
    gs_client_free_response(resp);
    if (rc) {
      gs_err_set(e, GS_INVALID_ARGUMENT, "output", "cannot write the download: %s", strerror(-rc));
      return rc;
    }
    offset += n;
    if (last) break;
    if (n == 0) {
      gs_err_set(e, GS_INTERNAL, "", "gpushared sent an empty chunk at offset %llu of %llu without "
                 "marking it last", (unsigned long long)offset, (unsigned long long)announced);
      return -EPROTO;
    }
  }
  if (total) *total = offset;
  return 0;
}
