/*
 * cmd_dataset.c: the tenant's dataset store: dataset add, list and rm, and
 * the datasets that a job spec names (used by plan and submit in cmd_job.c,
 * since resolving them is a question for the store: which bytes it holds,
 * what to upload and under which name).
 *
 * Datasets named by path in a job (idx and npy images/labels, text and
 * tokens paths) are hashed here, uploaded (as their format, which the
 * daemon checks them as) unless the tenant's store already holds that
 * sha256, and the job is rewritten to refer to "sha256:HEX": the daemon
 * never opens a client's path.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "client/cli.h"
#include "client/client.h"
#include "client/cmd_admin.h"
#include "client/cmd_dataset.h"
#include "client/gpuctl.h"
#include "client/pbjson.h"
#include "client/table.h"

/* --------------------------------------------------------------- dataset --- */

const char *gpuctl_base_name(const char *path) {
  const char *s = strrchr(path, '/');
  return s ? s + 1 : path;
}

static void dataset_row(table *t, const Gpushare__V1__DatasetInfo *d, int full_hash) {
  table_cell(t, "%s", d->name ? d->name : "");
  table_cell(t, "%s", d->tenant ? d->tenant : "");
  table_cell(t, "%s", table_fsize(d->bytes));
  table_cell(t, "%.*s", full_hash ? 64 : 16, d->sha256 ? d->sha256 : "");
  table_cell(t, "%s", table_ftime(d->created_unix));
}

static const char *const dataset_cols[] = {"NAME", "TENANT", "SIZE", "SHA256", "CREATED", NULL};

/* --format's words, in gpushare.v1.DatasetFormat's order. */
static const char *const format_words[] = {"idx", "npy", "text", "tokens"};

/* Does the file start as a .npy file does (\x93NUMPY)? */
static int looks_npy(const char *path) {
  unsigned char b[6];
  FILE *f = fopen(path, "rb");
  if (!f) return 0;
  size_t n = fread(b, 1, sizeof b, f);
  fclose(f);
  return n == 6 && !memcmp(b, "\x93NUMPY", 6);
}

int gpuctl_cmd_dataset_add(gpuctl_cli *x, gpuctl_parsed *p) {
  const char *name = p->pos[0];
  int nfiles = p->npos - 1;
  int format = -1; /* -1: by each file's first bytes */
  uint32_t vocab = 0;
  if (p->nval[0]) {
    for (int f = 0; f < 4; f++)
      if (!strcmp(p->val[0][0], format_words[f])) format = f;
    if (format < 0)
      return cli_usage_error(x, "--format \"%s\" is no dataset format: idx, npy, text or tokens",
                             p->val[0][0]);
  }
  if (p->nval[1] && format != GPUSHARE__V1__DATASET_FORMAT__DATASET_FORMAT_TOKENS_U16)
    return cli_usage_error(x, "--vocab-size goes with --format tokens");
  if (format == GPUSHARE__V1__DATASET_FORMAT__DATASET_FORMAT_TOKENS_U16) {
    if (!p->nval[1])
      return cli_usage_error(x, "--format tokens needs --vocab-size N: every token id must be below N");
    if (cli_parse_u32(x, "--vocab-size", p->val[1][0], 2, 65536, &vocab)) return GPUCTL_EXIT_USAGE;
  }
  /* Every file must be readable before anything is uploaded. */
  for (int i = 1; i < p->npos; i++) {
    struct stat st;
    if (stat(p->pos[i], &st) < 0) return cli_fail("cannot read %s: %s", p->pos[i], strerror(errno));
    if (!S_ISREG(st.st_mode)) return cli_fail("cannot upload %s: not a regular file", p->pos[i]);
  }
  if (cli_connect(x)) return GPUCTL_EXIT_FAIL;
  table t = {0};
  table_header(&t, 1u << 2, dataset_cols);
  int rc = 0;
  pbjson j = {.f = stdout};
  if (x->json) pbjson_open(&j, NULL, '[');
  for (int i = 1; i < p->npos; i++) {
    /* The name goes to the daemon whole, however long: it says what is wrong
     * with it (a name cut here would be refused with a length it never had). */
    char *dsname = nfiles == 1 ? strdup(name) : NULL;
    if (nfiles != 1 && asprintf(&dsname, "%s.%s", name, gpuctl_base_name(p->pos[i])) < 0) dsname = NULL;
    if (!dsname) {
      table_free(&t);
      return cli_fail("out of memory");
    }
    gs_err e = {0};
    Gpushare__V1__DatasetInfo *info = NULL;
    char hex[65];
    int f = format >= 0 ? format
                        : looks_npy(p->pos[i]) ? GPUSHARE__V1__DATASET_FORMAT__DATASET_FORMAT_NPY
                                               : GPUSHARE__V1__DATASET_FORMAT__DATASET_FORMAT_IDX;
    int urc = gs_client_upload_file_as(x->c, dsname, p->pos[i], (Gpushare__V1__DatasetFormat)f,
                                       vocab, hex, &info, &e);
    if (urc) {
      /* what was added before the failure is still shown */
      if (x->json) {
        pbjson_close(&j, ']');
        fputc('\n', stdout);
      } else if (t.ncells > (size_t)t.ncols) {
        table_print(&t);
      }
      table_free(&t);
      if (x->json) {
        char ctx[256];
        snprintf(ctx, sizeof ctx, "dataset %.80s%s (%s) was not added", dsname, strlen(dsname) > 80 ? "..." : "",
                 p->pos[i]);
        cli_report_detail(urc, &e, ctx, NULL, NULL);
      } else {
        cli_report(urc, &e);
        fprintf(stderr, "gpuctl: dataset %.80s%s (%s) was not added\n", dsname,
                strlen(dsname) > 80 ? "..." : "", p->pos[i]);
      }
      free(dsname);
      rc = GPUCTL_EXIT_FAIL;
      break;
    }
    if (x->json) {
      if (info) pbjson_message(&j, NULL, &info->base);
      else {
        pbjson_open(&j, NULL, '{');
        pbjson_str(&j, "name", dsname);
        pbjson_str(&j, "sha256", hex);
        pbjson_close(&j, '}');
      }
    } else if (info) {
      dataset_row(&t, info, 1);
    } else {
      table_cell(&t, "%s", dsname);
      table_cell(&t, "-");
      table_cell(&t, "-");
      table_cell(&t, "%s", hex);
      table_cell(&t, "-");
    }
    if (info) gpushare__v1__dataset_info__free_unpacked(info, NULL);
    free(dsname);
  }
  if (!rc) {
    if (x->json) {
      pbjson_close(&j, ']');
      fputc('\n', stdout);
    } else {
      table_print(&t);
    }
  }
  return rc;
}

static void dataset_list_human(gpuctl_cli *x, const Gpushare__V1__Response *r) {
  (void)x;
  table t = {0};
  table_header(&t, 1u << 2, dataset_cols);
  for (size_t i = 0; i < r->list_datasets->n_dataset; i++) dataset_row(&t, r->list_datasets->dataset[i], 0);
  table_print(&t);
}

int gpuctl_cmd_dataset_list(gpuctl_cli *x, gpuctl_parsed *p) {
  (void)p;
  GPUCTL_REQ(req, list_datasets, LIST_DATASETS, Gpushare__V1__ListDatasetsRequest, GPUSHARE__V1__LIST_DATASETS_REQUEST__INIT);
  return cli_simple(x, &req, GPUSHARE__V1__RESPONSE__RESULT_LIST_DATASETS, dataset_list_human);
}

int gpuctl_cmd_dataset_rm(gpuctl_cli *x, gpuctl_parsed *p) {
  GPUCTL_REQ(req, remove_dataset, REMOVE_DATASET, Gpushare__V1__RemoveDatasetRequest, GPUSHARE__V1__REMOVE_DATASET_REQUEST__INIT);
  remove_dataset_msg.name = (char *)p->pos[0];
  return gpuctl_delete(x, &req, GPUSHARE__V1__RESPONSE__RESULT_REMOVE_DATASET, "dataset", p->pos[0]);
}

/* ------------------------------------------------ datasets of a job spec --- */

/* Datasets already in the store, listed once per submit. */
typedef struct store_list {
  Gpushare__V1__Response *resp;
  int loaded;
} store_list;

static int have_sha(gpuctl_cli *x, store_list *s, const char *hex) {
  if (!s->loaded) {
    s->loaded = 1;
    GPUCTL_REQ(req, list_datasets, LIST_DATASETS, Gpushare__V1__ListDatasetsRequest, GPUSHARE__V1__LIST_DATASETS_REQUEST__INIT);
    gs_err e = {0};
    if (gs_client_call(x->c, &req, &s->resp, &e)) {
      gs_client_free_response(s->resp); /* not fatal: we just upload */
      s->resp = NULL;
    }
  }
  if (!s->resp || s->resp->result_case != GPUSHARE__V1__RESPONSE__RESULT_LIST_DATASETS) return 0;
  for (size_t i = 0; i < s->resp->list_datasets->n_dataset; i++) {
    const char *h = s->resp->list_datasets->dataset[i]->sha256;
    if (h && !strcasecmp(h, hex)) return 1;
  }
  return 0;
}

/* Is path a local file that resolving uploads (see resolve_path)? */
static int is_upload(const char *path) {
  struct stat st;
  if (!path || !*path || !strncmp(path, "sha256:", 7)) return 0;
  return !(stat(path, &st) < 0 && errno == ENOENT && !strchr(path, '/'));
}

/* The file slots of a Dataset (up to 2), the format each is uploaded as
 * and the field each is named by ("idx.images"). */
typedef struct file_slots {
  char **slot[2];
  const char *field[2];
  int n;
  Gpushare__V1__DatasetFormat format;
  uint32_t vocab_size;
} file_slots;

static void dataset_slots(Gpushare__V1__Dataset *d, file_slots *f) {
  memset(f, 0, sizeof *f);
  if (!d) return;
  switch (d->source_case) {
  case GPUSHARE__V1__DATASET__SOURCE_IDX:
    if (!d->idx) return;
    *f = (file_slots){{&d->idx->images, &d->idx->labels}, {"idx.images", "idx.labels"}, 2,
                      GPUSHARE__V1__DATASET_FORMAT__DATASET_FORMAT_IDX, 0};
    return;
  case GPUSHARE__V1__DATASET__SOURCE_NPY:
    if (!d->npy) return;
    *f = (file_slots){{&d->npy->images, &d->npy->labels}, {"npy.images", "npy.labels"}, 2,
                      GPUSHARE__V1__DATASET_FORMAT__DATASET_FORMAT_NPY, 0};
    return;
  case GPUSHARE__V1__DATASET__SOURCE_TEXT:
    if (!d->text) return;
    *f = (file_slots){{&d->text->path, NULL}, {"text.path", NULL}, 1,
                      GPUSHARE__V1__DATASET_FORMAT__DATASET_FORMAT_TEXT, 0};
    return;
  case GPUSHARE__V1__DATASET__SOURCE_TOKENS:
    if (!d->tokens) return;
    *f = (file_slots){{&d->tokens->path, NULL}, {"tokens.path", NULL}, 1,
                      GPUSHARE__V1__DATASET_FORMAT__DATASET_FORMAT_TOKENS_U16,
                      d->tokens->vocab_size};
    return;
  default: return;
  }
}

int gpuctl_spec_uploads(const Gpushare__V1__JobSpec *spec) {
  Gpushare__V1__Dataset *sets[2] = {spec->train, spec->test};
  for (int i = 0; i < 2; i++) {
    file_slots f;
    dataset_slots(sets[i], &f);
    for (int k = 0; k < f.n; k++)
      if (is_upload(*f.slot[k])) return 1;
  }
  return 0;
}

/* Turn one file path of the spec into "sha256:HEX"; with upload, make sure
 * the store has the bytes (uploading as dataset basename, or basename-SHA12
 * when that name holds other bytes), checked by the daemon as `format`. */
static int resolve_path(gpuctl_cli *x, store_list *s, const char *field, char **slotp,
                        Gpushare__V1__DatasetFormat format, uint32_t vocab_size, int upload) {
  char *path = *slotp;
  /* A local file is uploaded; a bare name that is no file here is one of
   * the tenant's datasets (gpuctl dataset add NAME FILE), which the daemon
   * looks up itself. "./NAME" always means the file. */
  if (!is_upload(path)) return 0;
  gs_err e = {0};
  char hex[65];
  uint64_t bytes = 0;
  if (gs_client_sha256_file(path, hex, &bytes, &e))
    return cli_fail("%s: %s", field, e.msg);
  if (upload) {
    if (!have_sha(x, s, hex)) {
      if (!x->json) fprintf(stderr, "uploading %s (%s) as %s\n", path, table_fsize(bytes), gpuctl_base_name(path));
      char got[65];
      int rc = gs_client_upload_file_as(x->c, gpuctl_base_name(path), path, format, vocab_size,
                                        got, NULL, &e);
      if (rc == GS_CLIENT_REFUSED && e.code == GS_ALREADY_EXISTS) {
        char alt[300];
        snprintf(alt, sizeof alt, "%s-%.12s", gpuctl_base_name(path), hex);
        gs_err_clear(&e);
        rc = gs_client_upload_file_as(x->c, alt, path, format, vocab_size, got, NULL, &e);
        if (rc == GS_CLIENT_REFUSED && e.code == GS_ALREADY_EXISTS) rc = 0; /* same bytes, same name */
        else if (!rc) snprintf(hex, sizeof hex, "%s", got);
      } else if (!rc) {
        snprintf(hex, sizeof hex, "%s", got);
      }
      if (rc) {
        cli_report(rc, &e);
        return cli_fail("%s: could not upload %s", field, path);
      }
    }
  }
  char *ref = malloc(7 + 64 + 1);
  if (!ref) return cli_fail("out of memory");
  snprintf(ref, 72, "sha256:%s", hex);
  free(path); /* unpacked with the default allocator */
  *slotp = ref;
  return 0;
}

static int resolve_dataset(gpuctl_cli *x, store_list *s, const char *which, Gpushare__V1__Dataset *d, int upload) {
  file_slots fs;
  dataset_slots(d, &fs);
  for (int k = 0; k < fs.n; k++) {
    char f[64];
    snprintf(f, sizeof f, "spec.%s.%s", which, fs.field[k]);
    if (resolve_path(x, s, f, fs.slot[k], fs.format, fs.vocab_size, upload)) return GPUCTL_EXIT_FAIL;
  }
  return 0;
}

int gpuctl_resolve_spec(gpuctl_cli *x, Gpushare__V1__JobSpec *spec, int upload) {
  store_list s = {0};
  int rc = resolve_dataset(x, &s, "train", spec->train, upload);
  if (!rc) rc = resolve_dataset(x, &s, "test", spec->test, upload);
  gs_client_free_response(s.resp);
  return rc;
}
