/*
 * rpc_datasets.c: the dataset calls: upload_dataset, list_datasets,
 * remove_dataset.
 *
 * The daemon never opens a path a client names: `gpuctl dataset add` (and
 * `gpuctl submit`, for the file paths in a job) sends the bytes in chunks.
 * An upload writes STATE_DIR/uploads/<id>.part while it lasts, hashing as it
 * goes; commit checks the size and the sha256 the client computed, checks
 * the file as the training runtime will read it, as the format the first
 * chunk named (IDX unless it names another: admit.c), fsyncs, and
 * renames the file to STATE_DIR/datasets/<sha256> (or drops it when that
 * content is already there: blobs are shared, deduplicated by content),
 * then records the tenant's name for it in the store. Until that row exists
 * nothing of the upload is visible; a connection that closes mid-upload
 * (a close hook on the connection, server.h), a daemon killed mid-upload
 * (datasets.c empties the uploads directory at start) or a checksum that
 * does not match leaves nothing behind. An upload id is only valid on the
 * connection that started it.
 */
#include "control/rpc_datasets.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/sha256.h"
#include "common/size.h"
#include "control/admit.h"
#include "control/datasets.h"
#include "control/job.h"
#include "control/log.h"
#include "control/server.h"
#include "control/store.h"

typedef struct upload {
  uint64_t id;
  const gs_conn *conn;  /* the connection that owns it (NULL: a call made outside one) */
  char tenant[GS_NAME_MAX + 1];
  char name[GS_NAME_MAX + 1];
  char path[PATH_MAX];      /* the .part file */
  int fd;
  gs_sha256 sha;
  uint64_t received, total; /* total 0: not announced */
  int format;               /* gpushare.v1.DatasetFormat: what commit checks the file as */
  uint32_t vocab_size;      /* DATASET_FORMAT_TOKENS_U16: every id below it */
  struct upload *next;
} upload;

struct gs_uploads {
  upload *list;
  uint64_t next_id;     /* the last id handed out (ids start at 1) */
};

static void upload_drop(gs_daemon *d, upload *u) {
  upload **pp = &d->uploads->list;
  while (*pp && *pp != u) pp = &(*pp)->next;
  if (*pp) *pp = u->next;
  if (u->fd >= 0) close(u->fd);
  unlink(u->path);
  free(u);
}

void gs_rpc_datasets_conn_closed(void *arg, gs_conn *conn) {
  gs_daemon *d = arg;
  if (!d->uploads) return;
  for (upload *u = d->uploads->list, *n; u; u = n) {
    n = u->next;
    if (u->conn == conn) {
      gs_info("upload %" PRIu64 " of %s/%s dropped: its connection closed after %" PRIu64 " bytes",
              u->id, u->tenant, u->name, u->received);
      upload_drop(d, u);
    }
  }
}

void gs_rpc_datasets_free(gs_daemon *d) {
  if (!d->uploads) return;
  while (d->uploads->list) upload_drop(d, d->uploads->list);
  free(d->uploads);
  d->uploads = NULL;
}

static Gpushare__V1__DatasetInfo *info_msg(gs_call_arena *a, const gs_dataset_row *r) {
  Gpushare__V1__DatasetInfo *m =
      GS_CALL_MSG(a, Gpushare__V1__DatasetInfo, GPUSHARE__V1__DATASET_INFO__INIT);
  if (!m) return NULL;
  m->name = gs_call_strdup(a, r->name);
  m->tenant = gs_call_strdup(a, r->tenant);
  m->sha256 = gs_call_strdup(a, r->sha256);
  m->has_bytes = m->has_created_unix = 1;
  m->bytes = r->bytes;
  m->created_unix = r->created;
  return m;
}

/* The tenant a dataset call acts for: the caller's own (admins too: data
 * belongs to a tenant, and an admin who is no member has none). */
static int acting_tenant(gs_call *c, gs_err *e) {
  if (c->id.tenant[0]) return 0;
  return gs_err_set(e, GS_FAILED_PRECONDITION, "",
                    "uid %" PRIu32 " is not a member of any tenant; datasets belong to a tenant",
                    c->peer->uid);
}

/* max_tenant_datasets: would `bytes` more (content `sha`, when known, counts
 * nothing if the tenant already holds it) take the tenant past its limit?
 * Held bytes count each content the tenant's datasets name once. */
static int quota_check(gs_daemon *d, const char *tenant, const char *name, const char *sha,
                       uint64_t bytes, const char *field, gs_err *e) {
  gs_dataset_row *rows;
  size_t n;
  if (gs_store_dataset_list(d->store, tenant, &rows, &n, e) < 0) return gs_err_rc(e);
  uint64_t held = 0;
  for (size_t i = 0; i < n; i++) {
    bool seen = false;
    for (size_t j = 0; j < i && !seen; j++) seen = strcmp(rows[i].sha256, rows[j].sha256) == 0;
    if (!seen) held += rows[i].bytes;
    if (sha && strcmp(rows[i].sha256, sha) == 0) bytes = 0;
  }
  free(rows);
  uint64_t lim = d->cfg.max_tenant_datasets;
  if (held <= lim && bytes <= lim - held) return 0;
  char sz[3][32];
  return gs_err_set(e, GS_RESOURCE_EXHAUSTED, field,
                    "tenant %s holds %s in datasets; dataset %s (%s) would take it past %s "
                    "(max_tenant_datasets); nothing was kept: remove a dataset first",
                    tenant, gs_size_format(held, sz[0], sizeof sz[0]), name,
                    gs_size_format(bytes, sz[1], sizeof sz[1]),
                    gs_size_format(lim, sz[2], sizeof sz[2]));
}

static int commit_upload(gs_call *c, upload *u, const char *want_sha, gs_dataset_row *row,
                         gs_err *e) {
  gs_daemon *d = c->d;
  char sizes[2][32];
  if (u->total && u->received != u->total)
    return gs_err_set(e, GS_INVALID_ARGUMENT, "total_bytes",
                      "upload of %s announced %" PRIu64 " bytes but %" PRIu64
                      " arrived; nothing was kept",
                      u->name, u->total, u->received);
  uint8_t dig[32];
  char hex[65];
  gs_sha256_final(&u->sha, dig);
  gs_sha256_hex(dig, hex);
  if (want_sha && *want_sha && strcmp(want_sha, hex) != 0)
    return gs_err_set(e, GS_INVALID_ARGUMENT, "sha256",
                      "upload of %s has sha256 %s but the client computed %.64s; the data was "
                      "damaged on the way, nothing was kept",
                      u->name, hex, want_sha);
  if (gs_admit_upload_check(u->path, u->name, u->format, u->vocab_size, e) < 0)
    return gs_err_rc(e);
  if (quota_check(d, u->tenant, u->name, hex, u->received, "data", e) < 0)
    return gs_err_rc(e);
  if (fsync(u->fd) < 0)
    return gs_err_set(e, GS_INTERNAL, "", "fsync %s: %s", u->path, strerror(errno));
  close(u->fd);
  u->fd = -1;
  char blob[PATH_MAX];
  gs_dataset_blob_path(d, hex, blob, sizeof blob);
  struct stat st;
  if (stat(blob, &st) == 0) {
    unlink(u->path); /* the same content is already stored */
  } else if (rename(u->path, blob) < 0) {
    return gs_err_set(e, GS_INTERNAL, "", "rename %s: %s", blob, strerror(errno));
  } else {
    char dir[PATH_MAX];
    gs_datasets_dir(d, "datasets", dir, sizeof dir);
    int dfd = open(dir, O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) {
      fsync(dfd);
      close(dfd);
    }
  }
  memset(row, 0, sizeof *row);
  snprintf(row->tenant, sizeof row->tenant, "%s", u->tenant);
  snprintf(row->name, sizeof row->name, "%s", u->name);
  snprintf(row->sha256, sizeof row->sha256, "%s", hex);
  row->bytes = u->received;
  row->created = (int64_t)time(NULL);
  if (gs_store_dataset_add(d->store, row, e) < 0) {
    /* The blob stays only if another dataset names it. */
    gs_dataset_row *all;
    size_t n;
    bool used = false;
    if (gs_store_dataset_list(d->store, NULL, &all, &n, NULL) == 0) {
      for (size_t i = 0; i < n; i++) used |= strcmp(all[i].sha256, hex) == 0;
      free(all);
      if (!used) unlink(blob);
    }
    return gs_err_rc(e);
  }
  gs_info("dataset %s/%s stored: %s, sha256 %.16s...", row->tenant, row->name,
          gs_size_format(row->bytes, sizes[0], sizeof sizes[0]), hex);
  return 0;
}

int gs_rpc_upload_dataset(gs_call *c, const Gpushare__V1__Request *rq, gs_err *e) {
  const Gpushare__V1__UploadDatasetRequest *r = rq->upload_dataset;
  gs_daemon *d = c->d;
  if (acting_tenant(c, e) < 0) return gs_err_rc(e);
  upload *u = NULL;
  char sz[2][32];
  if (!r->has_upload_id || r->upload_id == 0) {
    if (gs_store_name_valid(r->name, "name", e) < 0) return gs_err_rc(e);
    int format = r->has_format ? (int)r->format : GPUSHARE__V1__DATASET_FORMAT__DATASET_FORMAT_IDX;
    if (format < GPUSHARE__V1__DATASET_FORMAT__DATASET_FORMAT_IDX ||
        format > GPUSHARE__V1__DATASET_FORMAT__DATASET_FORMAT_TOKENS_U16)
      return gs_err_set(e, GS_INVALID_ARGUMENT, "format",
                        "format %d is no dataset format this daemon knows: DATASET_FORMAT_IDX "
                        "(0), _NPY (1), _TEXT (2) or _TOKENS_U16 (3)",
                        format);
    if (format == GPUSHARE__V1__DATASET_FORMAT__DATASET_FORMAT_TOKENS_U16 &&
        (r->vocab_size < 2 || r->vocab_size > 65536))
      return gs_err_set(e, GS_INVALID_ARGUMENT, "vocab_size",
                        "vocab_size is %" PRIu32 "; an upload of uint16 token ids names its "
                        "vocabulary, 2 to 65536, and every id must be below it",
                        r->vocab_size);
    if (r->has_total_bytes && r->total_bytes > d->cfg.max_upload)
      return gs_err_set(e, GS_RESOURCE_EXHAUSTED, "total_bytes",
                        "dataset %s is %s; this daemon takes uploads of at most %s (max_upload)",
                        r->name, gs_size_format(r->total_bytes, sz[0], sizeof sz[0]),
                        gs_size_format(d->cfg.max_upload, sz[1], sizeof sz[1]));
    if (r->has_total_bytes &&
        quota_check(d, c->id.tenant, r->name, NULL, r->total_bytes, "total_bytes", e) < 0)
      return gs_err_rc(e);
    if (!d->uploads && !(d->uploads = calloc(1, sizeof *d->uploads)))
      return gs_err_set(e, GS_INTERNAL, "", "out of memory");
    /* The upload ends with its connection. */
    if (gs_server_on_close(c->conn, gs_rpc_datasets_conn_closed, d) < 0)
      return gs_err_set(e, GS_INTERNAL, "", "cannot follow this connection's close");
    u = calloc(1, sizeof *u);
    if (!u) return gs_err_set(e, GS_INTERNAL, "", "out of memory");
    u->id = ++d->uploads->next_id;
    u->conn = c->conn;
    snprintf(u->tenant, sizeof u->tenant, "%s", c->id.tenant);
    snprintf(u->name, sizeof u->name, "%s", r->name);
    u->total = r->has_total_bytes ? r->total_bytes : 0;
    u->format = format;
    u->vocab_size = r->vocab_size;
    snprintf(u->path, sizeof u->path, "%s/uploads/%" PRIu64 ".part", d->cfg.state_dir, u->id);
    u->fd = open(u->path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
    if (u->fd < 0) {
      int err = errno;
      free(u);
      return gs_err_set(e, GS_INTERNAL, "", "cannot create an upload file: %s", strerror(err));
    }
    gs_sha256_init(&u->sha);
    u->next = d->uploads->list;
    d->uploads->list = u;
  } else {
    for (upload *p = d->uploads ? d->uploads->list : NULL; p; p = p->next)
      if (p->id == r->upload_id && p->conn == c->conn) u = p;
    if (!u)
      return gs_err_set(e, GS_NOT_FOUND, "upload_id",
                        "no upload %" PRIu64 " on this connection (uploads do not survive a "
                        "reconnect or a restart: start again)",
                        r->upload_id);
  }
  if (r->has_data && r->data.len) {
    uint64_t after = u->received + r->data.len;
    if (after > d->cfg.max_upload || (u->total && after > u->total)) {
      gs_err_set(e, GS_RESOURCE_EXHAUSTED, "data",
                 "upload of %s passes %s (%s); nothing was kept", u->name,
                 gs_size_format(u->total && u->total < d->cfg.max_upload ? u->total
                                                                          : d->cfg.max_upload,
                                sz[0], sizeof sz[0]),
                 u->total && after > u->total ? "the size it announced" : "max_upload");
      upload_drop(d, u);
      return gs_err_rc(e);
    }
    if (quota_check(d, u->tenant, u->name, NULL, after, "data", e) < 0) {
      upload_drop(d, u);
      return gs_err_rc(e);
    }
    const uint8_t *p = r->data.data;
    size_t left = r->data.len;
    while (left) {
      ssize_t w = write(u->fd, p, left);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        gs_err_set(e, GS_RESOURCE_EXHAUSTED, "data", "cannot store the upload: %s",
                   strerror(errno));
        upload_drop(d, u);
        return gs_err_rc(e);
      }
      p += w;
      left -= (size_t)w;
    }
    gs_sha256_update(&u->sha, r->data.data, r->data.len);
    u->received = after;
  }
  Gpushare__V1__UploadDatasetResponse *m = GS_CALL_MSG(&c->ar, Gpushare__V1__UploadDatasetResponse,
                                                  GPUSHARE__V1__UPLOAD_DATASET_RESPONSE__INIT);
  if (!m) return gs_err_set(e, GS_INTERNAL, "", "out of memory");
  m->has_upload_id = m->has_received_bytes = 1;
  m->upload_id = u->id;
  m->received_bytes = u->received;
  if (r->has_commit && r->commit) {
    gs_dataset_row row;
    int rc = commit_upload(c, u, r->sha256, &row, e);
    upload_drop(d, u);
    if (rc < 0) return gs_err_rc(e);
    m->dataset = info_msg(&c->ar, &row);
  }
  c->resp->result_case = GPUSHARE__V1__RESPONSE__RESULT_UPLOAD_DATASET;
  c->resp->upload_dataset = m;
  return 0;
}

int gs_rpc_list_datasets(gs_call *c, const Gpushare__V1__Request *rq, gs_err *e) {
  (void)rq;
  gs_dataset_row *rows;
  size_t n;
  if (!c->id.admin && acting_tenant(c, e) < 0) return gs_err_rc(e);
  if (gs_store_dataset_list(c->d->store, c->id.admin ? NULL : c->id.tenant, &rows, &n, e) < 0)
    return gs_err_rc(e);
  Gpushare__V1__ListDatasetsResponse *m = GS_CALL_MSG(&c->ar, Gpushare__V1__ListDatasetsResponse,
                                                 GPUSHARE__V1__LIST_DATASETS_RESPONSE__INIT);
  if (m) m->dataset = gs_call_alloc(&c->ar, n * sizeof *m->dataset + 1);
  for (size_t i = 0; m && m->dataset && i < n; i++) m->dataset[m->n_dataset++] = info_msg(&c->ar, &rows[i]);
  free(rows);
  if (!m || c->ar.failed) return gs_err_set(e, GS_INTERNAL, "", "out of memory");
  c->resp->result_case = GPUSHARE__V1__RESPONSE__RESULT_LIST_DATASETS;
  c->resp->list_datasets = m;
  return 0;
}

int gs_rpc_remove_dataset(gs_call *c, const Gpushare__V1__Request *rq, gs_err *e) {
  const char *name = rq->remove_dataset->name;
  if (acting_tenant(c, e) < 0) return gs_err_rc(e);
  if (gs_store_name_valid(name, "name", e) < 0) return gs_err_rc(e);
  gs_dataset_row row;
  if (gs_store_dataset_get(c->d->store, c->id.tenant, name, &row, e) < 0) return gs_err_rc(e);
  uint64_t job = gs_jobs_using_blob(c->d, row.sha256);
  if (job)
    return gs_err_set(e, GS_FAILED_PRECONDITION, "name",
                      "dataset %s is used by job %" PRIu64 ", which has not ended; cancel it or "
                      "wait for it",
                      name, job);
  uint64_t refs;
  if (gs_store_dataset_remove(c->d->store, c->id.tenant, name, &row, &refs, e) < 0) return gs_err_rc(e);
  if (refs == 0) {
    char blob[PATH_MAX];
    gs_dataset_blob_path(c->d, row.sha256, blob, sizeof blob);
    unlink(blob);
  }
  gs_info("dataset %s/%s removed%s", row.tenant, name, refs ? " (its content stays: shared)" : "");
  c->resp->result_case = GPUSHARE__V1__RESPONSE__RESULT_REMOVE_DATASET;
  c->resp->remove_dataset = GS_CALL_MSG(&c->ar, Gpushare__V1__RemoveDatasetResponse,
                                   GPUSHARE__V1__REMOVE_DATASET_RESPONSE__INIT);
  return c->resp->remove_dataset ? 0 : gs_err_set(e, GS_INTERNAL, "", "out of memory");
}

