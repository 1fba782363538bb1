/*
 * admit.c: everything the control plane asks of the training runtime, in
 * one file: the plan of a job (plan), the model and dataset checks and the
 * admission against a vdev (submit), and the check of an uploaded IDX file
 * (upload_dataset). The handlers (rpc_jobs.c, rpc_datasets.c) call these
 * and see no runtime type: what comes back is a gpushare.v1.Plan built in
 * the request's arena, or the plain figures of gs_admit.
 *
 * Plans are made with the device's backend as the executor would see it
 * (the CPU's sizes: the control plane never touches a device), and a vdev's
 * fit is judged with its allocator policy.
 */
#include "control/admit.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "control/datasets.h"
#include "kernels/backend.h"
#include "runtime/data.h"
#include "runtime/model.h"
#include "runtime/plan.h"

/* ------------------------------------------------------------- submit --- */

static const gs_backend *device_backend(void) { return gs_backend_cpu(); }

/* The dimensions an IDX blob declares (gzip or raw): images (n, h, w, c),
 * labels (n) and, for labels, the number of classes (max + 1). Only the
 * daemon's own blobs are read. */
static int idx_probe(const char *path, bool labels, uint64_t *n, uint32_t *h, uint32_t *w,
                     uint32_t *c, uint32_t *classes, const char *field, gs_err *e) {
  gzFile f = gzopen(path, "rb");
  if (!f) return gs_err_set(e, GS_INTERNAL, field, "cannot open the stored dataset %s", path);
  uint8_t hdr[20];
  int want = labels ? 8 : 16;
  int got = gzread(f, hdr, (unsigned)want);
  int rc = 0;
  uint32_t magic = got >= 4 ? (uint32_t)hdr[0] << 24 | hdr[1] << 16 | hdr[2] << 8 | hdr[3] : 0;
  uint32_t dims = magic & 0xff;
  if (got < want || hdr[0] || hdr[1] || hdr[2] != 0x08 || (labels ? dims != 1 : (dims != 3 && dims != 4))) {
    rc = gs_err_set(e, GS_INVALID_ARGUMENT, field,
                    "the dataset is not an IDX %s file (magic 0x%08x): expected 0x0000080%d",
                    labels ? "labels" : "images", magic, labels ? 1 : 3);
    goto out;
  }
  uint32_t d4[4] = {1, 1, 1, 1};
  for (uint32_t i = 0; i < (labels ? 1u : 3u); i++)
    d4[i] = (uint32_t)hdr[4 + 4 * i] << 24 | hdr[5 + 4 * i] << 16 | hdr[6 + 4 * i] << 8 | hdr[7 + 4 * i];
  if (!labels && dims == 4) {
    uint8_t x[4];
    if (gzread(f, x, 4) != 4) {
      rc = gs_err_set(e, GS_INVALID_ARGUMENT, field, "truncated IDX header");
      goto out;
    }
    d4[3] = (uint32_t)x[0] << 24 | x[1] << 16 | x[2] << 8 | x[3];
  }
  *n = d4[0];
  if (!labels) {
    *h = d4[1];
    *w = d4[2];
    *c = d4[3];
  } else {
    uint32_t max = 0;
    uint8_t buf[65536];
    uint64_t seen = 0;
    int r;
    while ((r = gzread(f, buf, sizeof buf)) > 0) {
      for (int i = 0; i < r; i++) max = buf[i] > max ? buf[i] : max;
      seen += (uint64_t)r;
    }
    if (seen != *n) {
      rc = gs_err_set(e, GS_INVALID_ARGUMENT, field,
                      "the labels file declares %" PRIu64 " labels but holds %" PRIu64, *n, seen);
      goto out;
    }
    *classes = max + 1 < 2 ? 2 : max + 1;
  }
out:
  gzclose(f);
  return rc;
}

/* Validate the datasets of a spec against its model (input shape, classes). */
static int check_datasets(gs_daemon *d, const char *tenant, const Gpushare__V1__JobSpec *spec,
                          const gs_model *m, gs_err *e) {
  if (!spec->train || spec->train->source_case == GPUSHARE__V1__DATASET__SOURCE__NOT_SET)
    return gs_err_set(e, GS_INVALID_ARGUMENT, "spec.train",
                      "the job has no training dataset: set train { idx { images labels } }, "
                      "train { name } or train { synthetic { examples } }");
  const Gpushare__V1__Dataset *sets[2] = {spec->train, spec->test};
  const char *names[2] = {"spec.train", "spec.test"};
  uint64_t train_examples = 0;
  for (int k = 0; k < 2; k++) {
    const Gpushare__V1__Dataset *ds = sets[k];
    if (!ds || ds->source_case == GPUSHARE__V1__DATASET__SOURCE__NOT_SET) continue;
    if (ds->source_case == GPUSHARE__V1__DATASET__SOURCE_SYNTHETIC) {
      const Gpushare__V1__SyntheticDataset *sy = ds->synthetic;
      char f[64];
      snprintf(f, sizeof f, "%s.synthetic.examples", names[k]);
      if (sy->examples < 1)
        return gs_err_set(e, GS_INVALID_ARGUMENT, f,
                          "%s.synthetic.examples is 0; a synthetic set needs at least 1 example",
                          names[k] + 5);
      snprintf(f, sizeof f, "%s.synthetic.classes", names[k]);
      if (sy->classes < 2 || sy->classes > 65536)
        return gs_err_set(e, GS_INVALID_ARGUMENT, f,
                          "%s.synthetic.classes %" PRIu32 " is out of range: from 2 to 65536",
                          names[k] + 5, sy->classes);
      uint32_t classes = sy->classes;
      if (k == 1 && classes < m->classes) classes = m->classes; /* as for IDX below */
      if (gs_model_check_dataset(m, names[k] + 5, m->input.h, m->input.w, m->input.c, classes,
                                 e) < 0) {
        gs_err_prefix(e, "spec");
        return -1;
      }
      if (k == 0) train_examples = sy->examples;
      continue;
    }
    char ip[4200], lp[4200];
    if (gs_datasets_resolve_set(d, tenant, ds, names[k], ip, lp, sizeof ip, e) < 0) return -1;
    uint64_t ni = 0, nl = 0;
    uint32_t h = 0, w = 0, c = 0, classes = 0, u;
    char f[64];
    snprintf(f, sizeof f, "%s.idx.images", names[k]);
    if (idx_probe(ip, false, &ni, &h, &w, &c, &u, f, e) < 0) return -1;
    snprintf(f, sizeof f, "%s.idx.labels", names[k]);
    if (idx_probe(lp, true, &nl, &u, &u, &u, &classes, f, e) < 0) return -1;
    if (ni != nl)
      return gs_err_set(e, GS_INVALID_ARGUMENT, names[k],
                        "%s has %" PRIu64 " images but %" PRIu64 " labels", names[k] + 5, ni, nl);
    if (k == 1 && classes < m->classes) classes = m->classes; /* a test set may lack a class */
    if (gs_model_check_dataset(m, names[k] + 5, h, w, c, classes, e) < 0) {
      gs_err_prefix(e, "spec");
      return -1;
    }
    if (k == 0) train_examples = ni;
  }
  /* One step is one whole effective batch; the last partial one is dropped. */
  uint64_t eff = (uint64_t)m->recipe.batch_size * m->recipe.accumulation_steps;
  if (train_examples < eff)
    return gs_err_set(e, GS_INVALID_ARGUMENT,
                      m->recipe.accumulation_steps > 1 ? "spec.accumulation_steps" : "spec.batch_size",
                      "the effective batch (batch_size %" PRIu32 " x accumulation_steps %" PRIu32
                      " = %" PRIu64 ") is larger than the %" PRIu64 " training examples: a "
                      "step needs one whole effective batch",
                      m->recipe.batch_size, m->recipe.accumulation_steps, eff, train_examples);
  return 0;
}

/* The vdev's allocator policy, as the planner takes it: what fits a vdev
 * depends on it (a growth vdev's regions can leave no room for a large
 * buffer that a preallocated vdev of the same limit holds). */
static gs_alloc_policy vdev_policy(const gs_vdev *v) {
  return v->policy == GS_POLICY_GROWTH ? GS_POLICY_GROWTH : GS_POLICY_PREALLOCATE;
}

/* The plan as a message; fits is judged for a vdev of `limit` bytes and
 * `policy` (always true without a limit). */
static Gpushare__V1__Plan *plan_msg(arena *a, const gs_plan *p, uint64_t limit,
                                    gs_alloc_policy policy) {
  Gpushare__V1__Plan *m = AR_MSG(a, Gpushare__V1__Plan, GPUSHARE__V1__PLAN__INIT);
  if (!m) return NULL;
  m->row = ar_alloc(a, (p->n_rows + 1) * sizeof *m->row);
  for (size_t i = 0; m->row && i < p->n_rows; i++) {
    const gs_plan_row *r = &p->rows[i];
    Gpushare__V1__PlanRow *x = AR_MSG(a, Gpushare__V1__PlanRow, GPUSHARE__V1__PLAN_ROW__INIT);
    if (!x) break;
    x->layer = ar_strdup(a, r->layer);
    x->kind = ar_strdup(a, r->kind);
    x->output_shape = ar_strdup(a, r->output_shape);
    x->has_parameters = x->has_weights_bytes = x->has_master_bytes = x->has_gradient_bytes = 1;
    x->has_optimizer_bytes = x->has_activation_bytes = x->has_workspace_bytes = x->has_batch_bytes = 1;
    x->parameters = r->parameters;
    x->weights_bytes = r->bytes[GS_ROLE_WEIGHTS];
    x->master_bytes = r->bytes[GS_ROLE_MASTER];
    x->gradient_bytes = r->bytes[GS_ROLE_GRADIENTS];
    x->optimizer_bytes = r->bytes[GS_ROLE_OPTIMIZER];
    x->activation_bytes = r->bytes[GS_ROLE_ACTIVATIONS];
    x->workspace_bytes = r->bytes[GS_ROLE_WORKSPACE];
    x->batch_bytes = r->bytes[GS_ROLE_BATCH];
    m->row[m->n_row++] = x;
  }
  m->has_peak_bytes = m->has_parameters = m->has_micro_batch = m->has_accumulation_steps = 1;
  m->has_precision = m->has_limit_bytes = m->has_fits = 1;
  m->peak_bytes = p->peak_bytes;
  m->parameters = p->parameters;
  m->micro_batch = p->micro_batch;
  m->accumulation_steps = p->accumulation_steps;
  m->precision = (Gpushare__V1__Precision)p->precision;
  m->limit_bytes = limit;
  m->fits = gs_plan_fits(p, limit, policy);
  char *text = gs_plan_format(p, limit);
  if (text) {
    m->summary = ar_strdup(a, text);
    free(text);
  }
  return m;
}


/* --------------------------------------------------------- IDX upload --- */

/* An uploaded file read as a stream of IDX bytes: raw, or inflated. */
typedef struct idx_stream {
  int fd;
  bool gz, z_end, eof;   /* gzip input; its last member ended; no more input */
  z_stream z;
  uint8_t in[65536];
  size_t in_len, in_pos; /* raw: the bytes of `in` not yet consumed */
  uint64_t in_total;     /* compressed bytes read so far */
} idx_stream;

static int idx_fill(idx_stream *s) {
  ssize_t n;
  do n = read(s->fd, s->in, sizeof s->in);
  while (n < 0 && errno == EINTR);
  if (n < 0) return -errno;
  if (n == 0) s->eof = true;
  s->in_len = (size_t)n;
  s->in_pos = 0;
  s->in_total += (uint64_t)n;
  if (s->gz) {
    s->z.next_in = s->in;
    s->z.avail_in = (uInt)n;
  }
  return 0;
}

/* Up to `want` bytes into dst; *got < want only at the end of the data.
 * 0, or -1 with e set (a broken or truncated gzip stream). */
static int idx_next(idx_stream *s, const char *name, uint8_t *dst, size_t want, size_t *got,
                    gs_err *e) {
  *got = 0;
  while (*got < want) {
    if (!s->gz) {
      if (s->in_pos == s->in_len) {
        if (s->eof || idx_fill(s) < 0 || s->eof) return 0;
      }
      size_t k = s->in_len - s->in_pos < want - *got ? s->in_len - s->in_pos : want - *got;
      memcpy(dst + *got, s->in + s->in_pos, k);
      s->in_pos += k;
      *got += k;
      continue;
    }
    if (s->z_end) return 0;
    if (s->z.avail_in == 0 && !s->eof && idx_fill(s) < 0)
      return gs_err_set(e, GS_INTERNAL, "data", "cannot read the upload of %s back: %s", name,
                        strerror(errno));
    if (s->z.avail_in == 0 && s->eof)
      return gs_err_set(e, GS_INVALID_ARGUMENT, "data",
                        "dataset %s is a truncated gzip file: the compressed stream stops after "
                        "%" PRIu64 " bytes without its end marker (an interrupted download or "
                        "copy?)",
                        name, s->in_total);
    s->z.next_out = dst + *got;
    s->z.avail_out = (uInt)(want - *got);
    uInt before = s->z.avail_out;
    int rc = inflate(&s->z, Z_NO_FLUSH);
    *got += before - s->z.avail_out;
    if (rc == Z_STREAM_END) {
      /* Concatenated members (cat a.gz b.gz) go on, as gzip(1) reads them. */
      if (s->z.avail_in == 0 && !s->eof && idx_fill(s) < 0) return 0;
      if (s->z.avail_in >= 2 && s->z.next_in[0] == 0x1f && s->z.next_in[1] == 0x8b) {
        inflateReset(&s->z);
        continue;
      }
      s->z_end = true;
      return 0;
    }
    if (rc != Z_OK && !(rc == Z_BUF_ERROR && s->z.avail_in == 0))
      return gs_err_set(e, GS_INVALID_ARGUMENT, "data",
                        "dataset %s is not a valid gzip file: zlib says \"%s\" near compressed "
                        "byte %" PRIu64,
                        name, s->z.msg ? s->z.msg : zError(rc),
                        s->in_total - (uint64_t)s->z.avail_in);
  }
  return 0;
}

/* Is the file at path an IDX file gpushare can train on? 0, or -1 with e
 * set: INVALID_ARGUMENT, field "data", naming the dataset and what is wrong. */
static int idx_check(const char *path, const char *name, gs_err *e) {
  idx_stream *s = calloc(1, sizeof *s);
  if (!s) return gs_err_set(e, GS_INTERNAL, "", "out of memory");
  int rc = -1;
  s->fd = open(path, O_RDONLY | O_CLOEXEC);
  if (s->fd < 0) {
    gs_err_set(e, GS_INTERNAL, "", "cannot read the upload of %s back: %s", name, strerror(errno));
    goto out_free;
  }
  if (idx_fill(s) < 0) {
    gs_err_set(e, GS_INTERNAL, "", "cannot read the upload of %s back: %s", name, strerror(errno));
    goto out_close;
  }
  if (s->in_len >= 2 && s->in[0] == 0x1f && s->in[1] == 0x8b) {
    s->gz = true;
    s->z.next_in = s->in;
    s->z.avail_in = (uInt)s->in_len;
    if (inflateInit2(&s->z, 15 + 16) != Z_OK) {
      gs_err_set(e, GS_INTERNAL, "", "zlib could not start inflating %s", name);
      goto out_close;
    }
  }
  uint8_t hdr[20];
  size_t got;
  const char *unz = s->gz ? " after decompression" : "";
  if (idx_next(s, name, hdr, 4, &got, e) < 0) goto out_z;
  if (got < 4) {
    gs_err_set(e, GS_INVALID_ARGUMENT, "data",
               "dataset %s has %zu bytes%s; an IDX file starts with a 4-byte magic and its "
               "dimensions",
               name, got, unz);
    goto out_z;
  }
  uint32_t magic = (uint32_t)hdr[0] << 24 | (uint32_t)hdr[1] << 16 | (uint32_t)hdr[2] << 8 | hdr[3];
  unsigned nd = hdr[3];
  if (hdr[0] || hdr[1] || hdr[2] != 0x08 || (nd != 1 && nd != 3 && nd != 4)) {
    gs_err_set(e, GS_INVALID_ARGUMENT, "data",
               "dataset %s is not an IDX file gpushare reads: its magic number is 0x%08x%s; "
               "expected 0x00000801 (labels), 0x00000803 or 0x00000804 (images), unsigned bytes",
               name, magic, unz);
    goto out_z;
  }
  if (idx_next(s, name, hdr + 4, 4 * nd, &got, e) < 0) goto out_z;
  if (got < 4 * nd) {
    gs_err_set(e, GS_INVALID_ARGUMENT, "data",
               "dataset %s is truncated inside its header: %u dimensions need %u bytes after the "
               "magic, found %zu",
               name, nd, 4 * nd, got);
    goto out_z;
  }
  uint64_t elems = 1;
  char shape[64];
  int o = 0;
  for (unsigned i = 0; i < nd; i++) {
    const uint8_t *p = hdr + 4 + 4 * i;
    uint32_t dim = (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
    o += snprintf(shape + o, sizeof shape - (size_t)o, "%s%" PRIu32, i ? "x" : "", dim);
    if (dim == 0) {
      gs_err_set(e, GS_INVALID_ARGUMENT, "data",
                 "dataset %s has dimension %u = 0; every dimension must be at least 1", name, i);
      goto out_z;
    }
    if (elems <= GS_DATASET_MAX_ELEMS) elems *= dim; /* <= 2^32 * 2^32: no overflow */
  }
  if (elems > GS_DATASET_MAX_ELEMS) {
    gs_err_set(e, GS_INVALID_ARGUMENT, "data",
               "dataset %s claims dimensions %s, more than the %" PRIu64 " bytes (4 GiB) gpushare "
               "reads from one file",
               name, shape, (uint64_t)GS_DATASET_MAX_ELEMS);
    goto out_z;
  }
  uint64_t body = 0;
  uint8_t buf[65536];
  do {
    uint64_t left = elems + 1 - body; /* one byte past the promise tells trailing bytes */
    if (idx_next(s, name, buf, left < sizeof buf ? (size_t)left : sizeof buf, &got, e) < 0)
      goto out_z;
    body += got;
  } while (got > 0 && body <= elems);
  if (body < elems) {
    gs_err_set(e, GS_INVALID_ARGUMENT, "data",
               "dataset %s is truncated: its header (%s) promises %" PRIu64 " bytes after it, "
               "the file%s has %" PRIu64,
               name, shape, elems, unz, body);
    goto out_z;
  }
  if (body == elems && s->gz && !s->z_end) {
    /* every promised byte came: the stream must end here, marker and all */
    if (idx_next(s, name, buf, 1, &got, e) < 0) goto out_z;
    body += got;
  }
  if (body > elems || (s->gz && s->z.avail_in > 0)) {
    gs_err_set(e, GS_INVALID_ARGUMENT, "data",
               "dataset %s has trailing bytes after the %" PRIu64 " bytes its header (%s) "
               "promises",
               name, elems, shape);
    goto out_z;
  }
  rc = 0;
out_z:
  if (s->gz) inflateEnd(&s->z);
out_close:
  close(s->fd);
out_free:
  free(s);
  return rc;
}


/* ------------------------------------------------------------- entries --- */

int gs_admit_plan(arena *a, const Gpushare__V1__JobSpec *spec, const gs_vdev *vdev,
                  Gpushare__V1__Plan **out, gs_err *e) {
  uint64_t limit = 0;
  gs_alloc_policy policy = GS_POLICY_GROWTH; /* no vdev, no limit: it fits */
  if (vdev) {
    limit = vdev->memory_limit;
    policy = vdev_policy(vdev);
  }
  gs_plan p;
  if (gs_plan_job(spec, device_backend(), &p, e) < 0) {
    gs_err_prefix(e, "spec");
    return -1;
  }
  *out = plan_msg(a, &p, limit, policy);
  gs_plan_free(&p);
  if (!*out) return gs_err_set(e, GS_INTERNAL, "", "out of memory");
  return 0;
}

int gs_admit_check(gs_daemon *d, const char *tenant, const Gpushare__V1__JobSpec *spec,
                   gs_err *e) {
  gs_model model;
  if (gs_model_build(spec, &model, e) < 0) {
    gs_err_prefix(e, "spec");
    return -1;
  }
  int rc = check_datasets(d, tenant, spec, &model, e);
  gs_model_free(&model);
  return rc;
}

int gs_admit_job(arena *a, const Gpushare__V1__JobSpec *spec, const gs_vdev *v, gs_admit *out,
                 gs_err *e) {
  memset(out, 0, sizeof *out);
  gs_admission adm;
  bool auto_fit = spec->has_auto_fit && spec->auto_fit;
  if (gs_plan_admit_policy(spec, device_backend(), v->memory_limit, vdev_policy(v), auto_fit,
                           &adm, e) < 0) {
    gs_err_prefix(e, "spec");
    return -1;
  }
  out->fits = adm.fits;
  out->chosen = adm.chosen;
  out->micro_batch = adm.micro_batch;
  out->accumulation_steps = adm.accumulation_steps;
  out->peak_bytes = adm.plan.peak_bytes;
  out->plan = plan_msg(a, &adm.plan, v->memory_limit, vdev_policy(v));
  if (!adm.fits) snprintf(out->why, sizeof out->why, "%s", adm.why);
  gs_admission_free(&adm);
  return 0;
}

int gs_admit_idx_check(const char *path, const char *name, gs_err *e) {
  return idx_check(path, name, e);
}
