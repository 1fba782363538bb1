/*
 * admit.c: everything the control plane asks of the training runtime, in
 * one file: the plan of a job (plan), the model and dataset checks and the
 * admission against a vdev (submit), and the check of an uploaded file as
 * the format its upload names (upload_dataset). The handlers (rpc_jobs.c, rpc_datasets.c) call these
 * and see no runtime type: what comes back is a gpushare.v1.Plan built in
 * the request's arena, or the plain figures of gs_admit.
 *
 * Plans are made with the sizes of the vdev's device's backend as the
 * executor will run it (gs_admit_backend: the cpu backend, or the CUDA
 * plugin's size queries compiled into the core, since the control plane
 * never loads CUDA), and a vdev's fit is judged with its allocator policy.
 */
#include "control/admit.h"

#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/size.h"
#include "control/datasets.h"
#include "kernels/backend.h"
#include "kernels/cuda_plan.h"
#include "present/present.h"
#include "runtime/idx.h"
#include "runtime/model.h"
#include "runtime/npy.h"
#include "runtime/plan.h"
#include "runtime/tokens.h"
#include "convert/spec_pb.h"

/* ------------------------------------------------------------- submit --- */

const gs_backend *gs_admit_backend(const gs_devices *ds, const char *device) {
  const gs_device *dev = ds && device ? gs_devices_find(ds, device) : NULL;
  if (!dev || strcmp(dev->kind, "cuda")) return gs_backend_cpu();
  /* The plugin sizes cuBLASLt's workspace by the newest GPU it sees
   * (cuda_backend.cu), the same set --list-devices reported. */
  int newest = 0;
  for (size_t i = 0; i < ds->n; i++)
    if (!strcmp(ds->dev[i].kind, "cuda")) {
      int major = atoi(ds->dev[i].compute_capability);
      if (major > newest) newest = major;
    }
  return gs_backend_cuda_sizes(newest);
}

/* What an IDX blob of the store declares (runtime/idx.c, as the loader will
 * read it): its header and, for labels, the number of classes (the largest
 * label + 1, at least 2), read through to the end, so a blob that is not
 * what its header says is refused here, at submit. `what` names it in
 * messages ("the train labels"), `field` in the error's path. */
static int idx_probe(const char *path, gs_idx_kind kind, const char *what, const char *field,
                     gs_idx_header *h, uint32_t *classes, gs_err *e) {
  gs_idx *x;
  int rc = gs_idx_open_file(path, what, field, &x, e);
  if (rc) return rc;
  rc = gs_idx_read_header(x, kind, h, e);
  if (!rc && kind == GS_IDX_LABELS) {
    uint8_t top = 0;
    rc = gs_idx_read_body(x, h, NULL, &top, e);
    *classes = top + 1u < 2 ? 2 : top + 1u;
  }
  gs_idx_close(x);
  return rc;
}

/* Host bytes a loaded set of n examples holds (runtime/data.h's
 * gs_dataset: `image` bytes of pixels, an int32 label), saturating. */
static uint64_t set_bytes(uint64_t n, uint64_t image) {
  uint64_t each = image + sizeof(int32_t);
  return n > UINT64_MAX / each ? UINT64_MAX : n * each;
}

/* A .npy pair of the store (runtime/npy.c, as the loader reads it): the
 * images' header and length, the labels whole (their largest is the
 * number of classes - 1). Fills the shape, the classes and the bytes a
 * pixel holds. */
static int npy_probe(const char *ip, const char *lp, const char *set, uint64_t *n, uint32_t *h,
                     uint32_t *w, uint32_t *c, uint32_t *classes, uint64_t *pixel_bytes,
                     gs_err *e) {
  char f[64], what[32];
  gs_npy_header hi, hl;
  uint64_t top = 0;
  snprintf(f, sizeof f, "spec.%s.npy.images", set);
  snprintf(what, sizeof what, "the %s images", set);
  if (gs_npy_probe_file(ip, what, f, GS_NPY_IMAGES, &hi, e) < 0) return gs_err_rc(e);
  snprintf(f, sizeof f, "spec.%s.npy.labels", set);
  snprintf(what, sizeof what, "the %s labels", set);
  if (gs_npy_check_file(lp, what, f, GS_NPY_LABELS, &hl, &top, e) < 0) return gs_err_rc(e);
  if (hi.dims[0] != hl.dims[0]) {
    snprintf(f, sizeof f, "spec.%s", set);
    return gs_err_set(e, GS_INVALID_ARGUMENT, f,
                      "%s has %" PRIu64 " image%s but %" PRIu64 " label%s", set, hi.dims[0],
                      hi.dims[0] == 1 ? "" : "s", hl.dims[0], hl.dims[0] == 1 ? "" : "s");
  }
  *n = hi.dims[0];
  *h = (uint32_t)hi.dims[1];
  *w = (uint32_t)hi.dims[2];
  *c = hi.ndims == 4 ? (uint32_t)hi.dims[3] : 1;
  *classes = top + 1 < 2 ? 2 : (uint32_t)top + 1;
  *pixel_bytes = hi.itemsize;
  return 0;
}

/* A text or token set of the spec: its fields, then its file (every id
 * below the vocabulary, at least one example), then the job's model: a
 * model of tokens whose sequence length, vocabulary and head agree with it
 * (gs_model_check_tokens). *examples: the examples the set gives. */
static int stream_check(gs_daemon *d, const char *tenant, const Gpushare__V1__JobSpec *spec,
                        int k, const char *set, const gs_model *m, uint64_t *examples,
                        uint64_t *bytes, gs_err *e) {
  const Gpushare__V1__Dataset *ds = k ? spec->test : spec->train;
  const bool text = ds->source_case == GPUSHARE__V1__DATASET__SOURCE_TEXT;
  const char *key = text ? "text" : "tokens";
  const uint32_t t = ds->sequence_length ? ds->sequence_length : m->tokens ? m->input.w : 0;
  char f[64], what[32], path[PATH_MAX], unused[PATH_MAX];
  uint32_t vocab;
  if (t == 0) {
    snprintf(f, sizeof f, "spec.%s.sequence_length", set);
    return gs_err_set(e, GS_INVALID_ARGUMENT, f,
                      "%s.sequence_length is 0; a %s dataset is cut into examples of the model's "
                      "sequence length T >= 1, each reading T + 1 tokens",
                      set, key);
  }
  snprintf(f, sizeof f, "spec.%s.tokens.vocab_size", set);
  if (gs_tokens_vocab(text ? GS_TOKENS_TEXT : GS_TOKENS_U16, text ? 0 : ds->tokens->vocab_size,
                      f, &vocab, e) < 0)
    return gs_err_rc(e);
  snprintf(f, sizeof f, "spec.%s", set);
  if (gs_datasets_resolve_set(d, tenant, ds, f, path, unused, sizeof path, e) < 0)
    return gs_err_rc(e);
  snprintf(f, sizeof f, "spec.%s.%s.path", set, key);
  snprintf(what, sizeof what, "the %s %s", set, text ? "text" : "token file");
  uint64_t n;
  if (gs_tokens_check_file(path, text ? GS_TOKENS_TEXT : GS_TOKENS_U16, vocab, (uint64_t)t + 1,
                           what, f, &n, e) < 0)
    return gs_err_rc(e);
  uint64_t want = text ? ds->text->examples : ds->tokens->examples;
  uint64_t have = (n - 1) / t;
  if (want > have) {
    snprintf(f, sizeof f, "spec.%s.%s.examples", set, key);
    return gs_err_set(e, GS_INVALID_ARGUMENT, f,
                      "%s.%s.examples is %" PRIu64 ", but %s holds %" PRIu64 " examples of "
                      "sequence_length %" PRIu32 " (%" PRIu64 " tokens)",
                      set, key, want, what, have, t, n);
  }
  if (!m->tokens) {
    snprintf(f, sizeof f, "spec.%s.%s", set, key);
    return gs_err_set(e, GS_INVALID_ARGUMENT, f,
                      "the %s dataset is a token stream (%s, sequence_length %" PRIu32
                      ", vocabulary %" PRIu32 "), but the model takes images of %" PRIu32
                      "x%" PRIu32 "x%" PRIu32 " (model.input): a token dataset needs a model "
                      "whose input is token ids (model.input { sequence_length })",
                      set, key, t, vocab, m->input.h, m->input.w, m->input.c);
  }
  if (gs_model_check_tokens(m, set, t, vocab, e) < 0) {
    gs_err_prefix(e, "spec");
    return gs_err_rc(e);
  }
  *examples = want ? want : have;
  *bytes = n * sizeof(uint16_t);
  return 0;
}

/* Validate the datasets of a spec against its model (input shape, classes);
 * *data_bytes is what the loaded sets hold on the host. */
static int check_datasets(gs_daemon *d, const char *tenant, const Gpushare__V1__JobSpec *spec,
                          const gs_model *m, uint64_t *data_bytes, gs_err *e) {
  *data_bytes = 0;
  if (!spec->train || spec->train->source_case == GPUSHARE__V1__DATASET__SOURCE__NOT_SET)
    return gs_err_set(e, GS_INVALID_ARGUMENT, "spec.train",
                      "the job has no training dataset: set train { idx { images labels } }, "
                      "train { npy { images labels } }, train { name }, train { synthetic { "
                      "examples } }, train { text { path } } or train { tokens { path "
                      "vocab_size } }");
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
      /* The set is drawn in memory, image by image: it must fit the 4 GiB
       * a dataset may hold, and a test set drawn with the train set (one
       * seed, one number of classes) together with it. */
      const uint64_t image = gs_shape_elements(&m->input);
      uint64_t examples = sy->examples;
      const Gpushare__V1__SyntheticDataset *tr = spec->train->synthetic;
      bool joint = k == 1 && spec->train->source_case == GPUSHARE__V1__DATASET__SOURCE_SYNTHETIC &&
                   tr->seed == sy->seed && tr->classes == sy->classes;
      if (joint) examples = sy->examples > UINT64_MAX - tr->examples ? UINT64_MAX
                                                                     : sy->examples + tr->examples;
      snprintf(f, sizeof f, "%s.synthetic.examples", names[k]);
      if (examples > GS_DATASET_MAX_ELEMS / image)
        return gs_err_set(e, GS_INVALID_ARGUMENT, f,
                          "%s.synthetic.examples %" PRIu64 "%s of %" PRIu64
                          " pixels each are more than the %" PRIu64 " pixels (4 GiB) a dataset "
                          "may hold: at most %" PRIu64 " examples",
                          names[k] + 5, sy->examples,
                          joint ? " with the train set's (drawn together: one seed)" : "", image,
                          (uint64_t)GS_DATASET_MAX_ELEMS,
                          GS_DATASET_MAX_ELEMS / image - (joint ? tr->examples : 0));
      uint32_t classes = sy->classes;
      if (k == 1 && classes < m->classes) classes = m->classes; /* as for IDX below */
      if (gs_model_check_dataset(m, names[k] + 5, m->input.h, m->input.w, m->input.c, classes,
                                 e) < 0) {
        gs_err_prefix(e, "spec");
        return gs_err_rc(e);
      }
      if (k == 0) train_examples = sy->examples;
      *data_bytes += set_bytes(sy->examples, image);
      continue;
    }
    if (ds->source_case == GPUSHARE__V1__DATASET__SOURCE_TEXT ||
        ds->source_case == GPUSHARE__V1__DATASET__SOURCE_TOKENS) {
      uint64_t n = 0, bytes = 0;
      if (stream_check(d, tenant, spec, k, names[k] + 5, m, &n, &bytes, e) < 0)
        return gs_err_rc(e);
      if (k == 0) train_examples = n;
      *data_bytes += bytes;
      continue;
    }
    char ip[PATH_MAX], lp[PATH_MAX];
    if (gs_datasets_resolve_set(d, tenant, ds, names[k], ip, lp, sizeof ip, e) < 0) return gs_err_rc(e);
    if (ds->source_case == GPUSHARE__V1__DATASET__SOURCE_NPY) {
      uint64_t n = 0, px = 0;
      uint32_t h = 0, w = 0, c = 0, classes = 0;
      if (npy_probe(ip, lp, names[k] + 5, &n, &h, &w, &c, &classes, &px, e) < 0)
        return gs_err_rc(e);
      if (k == 1 && classes < m->classes) classes = m->classes; /* as for IDX below */
      if (gs_model_check_dataset(m, names[k] + 5, h, w, c, classes, e) < 0) {
        gs_err_prefix(e, "spec");
        return gs_err_rc(e);
      }
      if (k == 0) train_examples = n;
      *data_bytes += set_bytes(n, (uint64_t)h * w * c * px);
      continue;
    }
    gs_idx_header hi, hl;
    uint32_t classes = 0;
    char f[64], what[32];
    snprintf(f, sizeof f, "%s.idx.images", names[k]);
    snprintf(what, sizeof what, "the %s images", names[k] + 5);
    if (idx_probe(ip, GS_IDX_IMAGES, what, f, &hi, NULL, e) < 0) return gs_err_rc(e);
    snprintf(f, sizeof f, "%s.idx.labels", names[k]);
    snprintf(what, sizeof what, "the %s labels", names[k] + 5);
    if (idx_probe(lp, GS_IDX_LABELS, what, f, &hl, &classes, e) < 0) return gs_err_rc(e);
    uint64_t ni = hi.dims[0], nl = hl.dims[0];
    uint32_t h = hi.dims[1], w = hi.dims[2], c = hi.ndims == 4 ? hi.dims[3] : 1;
    if (ni != nl)
      return gs_err_set(e, GS_INVALID_ARGUMENT, names[k],
                        "%s has %" PRIu64 " image%s but %" PRIu64 " label%s", names[k] + 5, ni,
                        ni == 1 ? "" : "s", nl, nl == 1 ? "" : "s");
    if (k == 1 && classes < m->classes) classes = m->classes; /* a test set may lack a class */
    if (gs_model_check_dataset(m, names[k] + 5, h, w, c, classes, e) < 0) {
      gs_err_prefix(e, "spec");
      return gs_err_rc(e);
    }
    if (k == 0) train_examples = ni;
    *data_bytes += set_bytes(ni, (uint64_t)h * w * c);
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

/* protobuf-c allocations from the request's arena, freed with it. */
static void *arena_pb_alloc(void *a, size_t n) { return gs_call_alloc(a, n); }
static void arena_pb_free(void *a, void *p) { (void)a, (void)p; }

/* The plan as a message in the request's arena (convert/spec_pb.c's, with
 * present/'s table as its summary); fits is judged for a vdev of `limit`
 * bytes and `policy` (always true without a limit). */
static Gpushare__V1__Plan *plan_msg(gs_call_arena *a, const gs_plan *p, uint64_t limit,
                                    gs_alloc_policy policy) {
  Gpushare__V1__Plan *m = NULL, *out = NULL;
  if (gs_spec_pb_plan(p, limit, policy, &m) < 0) return NULL;
  m->summary = gs_present_plan(m);
  size_t n = gpushare__v1__plan__get_packed_size(m);
  uint8_t *buf = malloc(n ? n : 1);
  if (buf) {
    gpushare__v1__plan__pack(m, buf);
    ProtobufCAllocator al = {.alloc = arena_pb_alloc, .free = arena_pb_free, .allocator_data = a};
    out = gpushare__v1__plan__unpack(&al, n, buf);
  }
  free(buf);
  gpushare__v1__plan__free_unpacked(m, NULL);
  return out;
}

/* ------------------------------------------------------------- entries --- */

/* What the data leaves of v's limit for the plan: on the cpu device the
 * data is vdev memory; on a GPU it has a host budget of its own. 0 when
 * the data alone does not fit. */
static uint64_t plan_limit(const gs_vdev *v, uint64_t data_bytes) {
  if (data_bytes >= v->memory_limit) return 0;
  return gs_device_data_in_memory(v->device) ? v->memory_limit - data_bytes : v->memory_limit;
}

int gs_admit_plan(gs_daemon *d, gs_call_arena *a, const Gpushare__V1__JobSpec *spec,
                  const gs_vdev *vdev, Gpushare__V1__Plan **out, gs_err *e) {
  uint64_t limit = 0, data_bytes = 0;
  gs_alloc_policy policy = GS_POLICY_GROWTH; /* no vdev, no limit: it fits */
  if (vdev) {
    /* The datasets as submit would read them; a spec whose datasets do
     * not check is still planned (submit names what is wrong). */
    gs_err quiet;
    gs_err_clear(&quiet);
    if (gs_admit_check(d, vdev->tenant, spec, &data_bytes, &quiet) < 0) data_bytes = 0;
    limit = plan_limit(vdev, data_bytes);
    policy = vdev_policy(vdev);
  }
  gs_job_spec js;
  gs_plan p;
  int rc = gs_spec_pb_job(spec, &js, e);
  if (!rc)
    rc = gs_plan_job(&js, gs_admit_backend(&d->devices, vdev ? vdev->device : "cpu"), &p, e);
  gs_spec_pb_job_free(&js);
  if (rc < 0) {
    gs_err_prefix(e, "spec");
    return rc;
  }
  /* A limit of 0 is "no limit" to the planner: data that fills the vdev
   * is judged here. */
  *out = plan_msg(a, &p, vdev && !limit ? vdev->memory_limit : limit, policy);
  gs_plan_free(&p);
  if (!*out) return gs_err_set(e, GS_INTERNAL, "", "out of memory");
  if (vdev && !limit) (*out)->fits = (*out)->fits_growth = (*out)->fits_preallocate = false;
  if (vdev && !((*out)->vdev = gs_call_strdup(a, vdev->name)))
    return gs_err_set(e, GS_INTERNAL, "", "out of memory");
  if (vdev && data_bytes) {
    Gpushare__V1__Plan *m = *out;
    m->has_data_bytes = true;
    m->data_bytes = data_bytes;
    char data[32], lim[32], left[32], line[512];
    gs_size_format(data_bytes, data, sizeof data);
    gs_size_format(vdev->memory_limit, lim, sizeof lim);
    gs_size_format(limit, left, sizeof left);
    if (!limit)
      snprintf(line, sizeof line, "datasets: %s on the host, more than vdev %s's %s\n", data,
               vdev->name, lim);
    else if (gs_device_data_in_memory(vdev->device))
      snprintf(line, sizeof line,
               "datasets: %s on the host, vdev memory on the cpu device: the plan has %s of "
               "vdev %s's %s\n",
               data, left, vdev->name, lim);
    else
      snprintf(line, sizeof line, "datasets: %s on the host, within vdev %s's host budget of %s\n",
               data, vdev->name, lim);
    size_t n = strlen(m->summary ? m->summary : "") + strlen(line) + 1;
    char *sum = gs_call_alloc(a, n);
    if (!sum) return gs_err_set(e, GS_INTERNAL, "", "out of memory");
    snprintf(sum, n, "%s%s", m->summary ? m->summary : "", line);
    m->summary = sum;
  }
  if (vdev && !(*out)->fits) {
    /* What submit would say, with what fits: the same words and
     * suggestions as its refusal (auto_fit off: the job as written). */
    Gpushare__V1__JobSpec sp = *spec;
    sp.has_auto_fit = 1;
    sp.auto_fit = 0;
    gs_admit adm;
    gs_err quiet;
    gs_err_clear(&quiet);
    if (gs_admit_job(&d->devices, a, &sp, vdev, data_bytes, &adm, &quiet) == 0 && !adm.fits &&
        adm.why[0]) {
      Gpushare__V1__Plan *m = *out;
      size_t n = strlen(m->summary ? m->summary : "") + strlen(adm.why) + 32;
      char *sum = gs_call_alloc(a, n);
      if (!sum) return gs_err_set(e, GS_INTERNAL, "", "out of memory");
      snprintf(sum, n, "%sdoes not fit: %s\n", m->summary ? m->summary : "", adm.why);
      m->summary = sum;
    }
  }
  return 0;
}

int gs_admit_check(gs_daemon *d, const char *tenant, const Gpushare__V1__JobSpec *spec,
                   uint64_t *data_bytes, gs_err *e) {
  gs_job_spec js;
  gs_model model;
  int rc = gs_spec_pb_job(spec, &js, e);
  if (!rc) rc = gs_model_build(&js, &model, e);
  gs_spec_pb_job_free(&js);
  if (rc < 0) {
    gs_err_prefix(e, "spec");
    return rc;
  }
  rc = check_datasets(d, tenant, spec, &model, data_bytes, e);
  gs_model_free(&model);
  return rc;
}

int gs_admit_job(const gs_devices *ds, gs_call_arena *a, const Gpushare__V1__JobSpec *spec,
                 const gs_vdev *v, uint64_t data_bytes, gs_admit *out, gs_err *e) {
  memset(out, 0, sizeof *out);
  gs_admission adm;
  bool auto_fit = spec->has_auto_fit && spec->auto_fit;
  bool in_memory = gs_device_data_in_memory(v->device);
  char data[32], lim[32];
  gs_size_format(data_bytes, data, sizeof data);
  gs_size_format(v->memory_limit, lim, sizeof lim);
  if (data_bytes >= v->memory_limit) {
    /* Nothing the planner can shrink: refused before planning. */
    snprintf(out->why, sizeof out->why,
             in_memory ? "its datasets hold %s on the host, which on the cpu device is vdev "
                         "memory: vdev %s's limit is %s; train on fewer examples or use a "
                         "larger vdev"
                       : "its datasets hold %s on the host, more than vdev %s's limit of %s, "
                         "which bounds the host bytes of its jobs' data too; train on fewer "
                         "examples or use a larger vdev",
             data, v->name, lim);
    return 0;
  }
  uint64_t limit = plan_limit(v, data_bytes);
  gs_job_spec js;
  int rc = gs_spec_pb_job(spec, &js, e);
  if (!rc)
    rc = gs_plan_admit_policy(&js, gs_admit_backend(ds, v->device), limit, vdev_policy(v),
                              auto_fit, &adm, e);
  gs_spec_pb_job_free(&js);
  if (rc < 0) {
    gs_err_prefix(e, "spec");
    return rc;
  }
  out->fits = adm.fits;
  out->chosen = adm.chosen;
  out->micro_batch = adm.micro_batch;
  out->accumulation_steps = adm.accumulation_steps;
  out->peak_bytes = adm.plan.peak_bytes;
  out->plan = plan_msg(a, &adm.plan, limit, vdev_policy(v));
  if (!adm.fits && in_memory && data_bytes) {
    char left[32];
    snprintf(out->why, sizeof out->why,
             "its datasets hold %s of vdev %s's %s (on the cpu device data is vdev memory), "
             "leaving %s for the plan: %s",
             data, v->name, lim, gs_size_format(limit, left, sizeof left), adm.why);
  } else if (!adm.fits) {
    snprintf(out->why, sizeof out->why, "%s", adm.why);
  }
  gs_admission_free(&adm);
  return 0;
}

/* Admission of spec run with micro-batch m and accumulation acc, auto-fit off. */
static int admit_at(const gs_devices *ds, const Gpushare__V1__JobSpec *spec, const gs_vdev *v,
                    uint64_t data_bytes, uint32_t m, uint32_t acc, gs_admit *out, gs_err *e) {
  Gpushare__V1__JobSpec sp = *spec;
  sp.has_batch_size = sp.has_accumulation_steps = sp.has_auto_fit = 1;
  sp.batch_size = m;
  sp.accumulation_steps = acc;
  sp.auto_fit = 0;
  gs_call_arena a = {0};
  int rc = gs_admit_job(ds, &a, &sp, v, data_bytes, out, e);
  out->plan = NULL; /* lived in the arena */
  gs_call_arena_free(&a);
  return rc;
}

int gs_admit_replan(const gs_devices *ds, const Gpushare__V1__JobSpec *spec, const gs_vdev *v,
                    uint64_t limit,
                    uint64_t data_bytes, uint32_t micro, uint32_t accum, bool below,
                    gs_admit *out, gs_err *e) {
  memset(out, 0, sizeof *out);
  uint64_t eff = (uint64_t)micro * accum;
  gs_vdev at = *v;
  at.memory_limit = limit;
  for (uint32_t m = below ? micro - 1 : micro; m >= 1 && m <= micro; m--) {
    if (eff % m || eff / m > UINT32_MAX) continue;
    int rc = admit_at(ds, spec, &at, data_bytes, m, (uint32_t)(eff / m), out, e);
    if (rc < 0) return rc;
    if (out->fits) {
      out->chosen = m != micro;
      return 0;
    }
  }
  out->fits = false;
  return 0;
}

int gs_admit_least_peak(const gs_devices *ds, const char *device,
                        const Gpushare__V1__JobSpec *spec, uint32_t micro, uint32_t accum,
                        uint64_t *peak, gs_err *e) {
  uint64_t eff = (uint64_t)micro * accum;
  if (eff > UINT32_MAX) eff = UINT32_MAX;
  gs_vdev v;
  memset(&v, 0, sizeof v);
  snprintf(v.name, sizeof v.name, "%s", "plan");
  snprintf(v.device, sizeof v.device, "%s", device);
  v.memory_limit = UINT64_MAX / 2;
  v.policy = 1; /* GROWTH */
  gs_admit out;
  int rc = admit_at(ds, spec, &v, 0, 1, (uint32_t)eff, &out, e);
  *peak = out.peak_bytes;
  return rc;
}

int gs_admit_idx_check(const char *path, const char *name, gs_err *e) {
  char what[GS_NAME_MAX + 16];
  snprintf(what, sizeof what, "dataset %s", name);
  gs_idx *x;
  int rc = gs_idx_open_file(path, what, "data", &x, e);
  if (rc) return rc;
  gs_idx_header h;
  rc = gs_idx_read_header(x, GS_IDX_ANY, &h, e);
  if (!rc) rc = gs_idx_read_body(x, &h, NULL, NULL, e);
  gs_idx_close(x);
  return rc;
}

int gs_admit_upload_check(const char *path, const char *name, int format, uint32_t vocab_size,
                          gs_err *e) {
  char what[GS_NAME_MAX + 16];
  snprintf(what, sizeof what, "dataset %s", name);
  uint64_t n;
  switch (format) {
  case GPUSHARE__V1__DATASET_FORMAT__DATASET_FORMAT_IDX: return gs_admit_idx_check(path, name, e);
  case GPUSHARE__V1__DATASET_FORMAT__DATASET_FORMAT_NPY: {
    gs_npy_header h;
    return gs_npy_check_file(path, what, "data", GS_NPY_ANY, &h, NULL, e);
  }
  case GPUSHARE__V1__DATASET_FORMAT__DATASET_FORMAT_TEXT:
    /* Any bytes are text; one example needs two tokens. */
    return gs_tokens_check_file(path, GS_TOKENS_TEXT, 256, 2, what, "data", &n, e);
  case GPUSHARE__V1__DATASET_FORMAT__DATASET_FORMAT_TOKENS_U16: {
    uint32_t vocab;
    int rc = gs_tokens_vocab(GS_TOKENS_U16, vocab_size, "vocab_size", &vocab, e);
    if (rc) return rc;
    return gs_tokens_check_file(path, GS_TOKENS_U16, vocab, 2, what, "data", &n, e);
  }
  default:
    return gs_err_set(e, GS_INVALID_ARGUMENT, "format",
                      "format %d is no dataset format this daemon knows: DATASET_FORMAT_IDX (0), "
                      "_NPY (1), _TEXT (2) or _TOKENS_U16 (3)",
                      format);
  }
}
