/*
 * datasets.c: the store's content-addressed dataset blobs, and the
 * resolution of a job's dataset references to them.
 *
 * Blobs live in STATE_DIR/datasets/<sha256>, shared between the tenants'
 * names for them (rows of the store). The daemon never opens a path a
 * client names: a reference is "sha256:HEX" or the name of one of the
 * tenant's datasets, and anything that looks like a path is refused. The
 * uploads that make blobs are rpc_datasets.c's; this module only makes the
 * directories, empties uploads/ at start (what a crash cut off was never
 * visible) and answers "which file is this reference?".
 */
#include "control/datasets.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "control/log.h"
#include "control/store.h"

void gs_datasets_dir(const gs_daemon *d, const char *sub, char *buf, size_t len) {
  snprintf(buf, len, "%s/%s", d->cfg.state_dir, sub);
}

void gs_dataset_blob_path(const gs_daemon *d, const char *sha256, char *buf, size_t len) {
  snprintf(buf, len, "%s/datasets/%s", d->cfg.state_dir, sha256);
}

int gs_datasets_init(gs_daemon *d, gs_err *e) {
  char dir[PATH_MAX];
  const char *subs[] = {"datasets", "uploads"};
  for (size_t i = 0; i < 2; i++) {
    gs_datasets_dir(d, subs[i], dir, sizeof dir);
    if (mkdir(dir, 0750) < 0 && errno != EEXIST)
      return gs_err_set(e, GS_FAILED_PRECONDITION, "state_dir", "cannot create %s: %s", dir,
                        strerror(errno));
  }
  /* Uploads cut off by a crash: never committed, never visible. */
  gs_datasets_dir(d, "uploads", dir, sizeof dir);
  DIR *dh = opendir(dir);
  unsigned removed = 0;
  for (struct dirent *de; dh && (de = readdir(dh));) {
    if (de->d_name[0] == '.') continue;
    char p[4500];
    snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
    if (unlink(p) == 0) removed++;
  }
  if (dh) closedir(dh);
  if (removed) gs_info("removed %u unfinished upload%s", removed, removed == 1 ? "" : "s");
  return 0;
}

int gs_datasets_resolve(gs_daemon *d, const char *tenant, const char *ref, const char *field,
                        char *path, size_t len, gs_err *e) {
  gs_dataset_row row;
  if (ref && strncmp(ref, "sha256:", 7) == 0) {
    const char *hex = ref + 7;
    if (strlen(hex) != 64 || strspn(hex, "0123456789abcdef") != 64)
      return gs_err_set(e, GS_INVALID_ARGUMENT, field,
                        "\"%.80s\" is not a dataset reference: sha256: and 64 lowercase hex digits",
                        ref);
    if (gs_store_dataset_by_sha(d->store, tenant, hex, &row, e) < 0) {
      gs_err_set(e, GS_NOT_FOUND, field,
                 "tenant %s has no dataset with content %.20s...: upload it with gpuctl "
                 "dataset add (gpuctl submit does so for the paths in a job)",
                 tenant, ref);
      return gs_err_rc(e);
    }
  } else if (ref && *ref && !strchr(ref, '/') && gs_store_name_valid(ref, field, NULL) == 0) {
    if (gs_store_dataset_get(d->store, tenant, ref, &row, e) < 0) {
      gs_err_prefix(e, "");
      snprintf(e->field, sizeof e->field, "%s", field);
      return gs_err_rc(e);
    }
  } else {
    return gs_err_set(e, GS_INVALID_ARGUMENT, field,
                      "\"%.200s\" is a path; gpushared never opens a path a client names: "
                      "gpuctl submit uploads the file and sends its sha256 instead",
                      ref ? ref : "");
  }
  gs_dataset_blob_path(d, row.sha256, path, len);
  return 0;
}

int gs_datasets_resolve_set(gs_daemon *d, const char *tenant, const Gpushare__V1__Dataset *ds,
                            const char *field, char *images, char *labels, size_t len,
                            gs_err *e) {
  images[0] = labels[0] = '\0';
  char f[96];
  if (!ds) return 0;
  if (ds->source_case == GPUSHARE__V1__DATASET__SOURCE_IDX) {
    snprintf(f, sizeof f, "%s.idx.images", field);
    if (gs_datasets_resolve(d, tenant, ds->idx->images, f, images, len, e) < 0) return gs_err_rc(e);
    snprintf(f, sizeof f, "%s.idx.labels", field);
    return gs_datasets_resolve(d, tenant, ds->idx->labels, f, labels, len, e);
  }
  if (ds->source_case == GPUSHARE__V1__DATASET__SOURCE_NAME) {
    /* A named pair: the tenant's datasets NAME.images and NAME.labels. */
    char n1[GS_NAME_MAX + 8], n2[GS_NAME_MAX + 8];
    snprintf(n1, sizeof n1, "%s.images", ds->name);
    snprintf(n2, sizeof n2, "%s.labels", ds->name);
    snprintf(f, sizeof f, "%s.name", field);
    if (gs_datasets_resolve(d, tenant, n1, f, images, len, e) < 0 ||
        gs_datasets_resolve(d, tenant, n2, f, labels, len, e) < 0) {
      gs_err_set(e, GS_NOT_FOUND, f,
                 "dataset name \"%.63s\" needs the tenant's datasets %s and %s (gpuctl dataset "
                 "add %s IMAGES_FILE and %s LABELS_FILE)",
                 ds->name, n1, n2, n1, n2);
      return gs_err_rc(e);
    }
    return 0;
  }
  if (ds->source_case == GPUSHARE__V1__DATASET__SOURCE_NPY) {
    snprintf(f, sizeof f, "%s.npy.images", field);
    if (gs_datasets_resolve(d, tenant, ds->npy->images, f, images, len, e) < 0) return gs_err_rc(e);
    snprintf(f, sizeof f, "%s.npy.labels", field);
    return gs_datasets_resolve(d, tenant, ds->npy->labels, f, labels, len, e);
  }
  if (ds->source_case == GPUSHARE__V1__DATASET__SOURCE_TEXT) {
    snprintf(f, sizeof f, "%s.text.path", field);
    return gs_datasets_resolve(d, tenant, ds->text->path, f, images, len, e);
  }
  if (ds->source_case == GPUSHARE__V1__DATASET__SOURCE_TOKENS) {
    snprintf(f, sizeof f, "%s.tokens.path", field);
    return gs_datasets_resolve(d, tenant, ds->tokens->path, f, images, len, e);
  }
  return 0; /* synthetic: nothing to resolve */
}
