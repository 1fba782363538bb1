/*
 * fuzz_jobspec: a packed gpushare.v1.JobSpec through the model builder
 * (convert/spec_pb.c: JobSpec -> gs_job_spec; runtime/model.c: gs_model_build, recipe validation and shape
 * inference) and the planner (runtime/plan.c: gs_plan_job, which walks
 * gs_train_buffers with the cpu backend's workspace queries; no tensor is
 * allocated). The same path serves gpushare-run --plan, `gpuctl plan` and
 * the daemon's submit.
 *
 * Checked on every spec the builder accepts:
 *  - a refusal fills e (code, message); an acceptance leaves it clear;
 *  - shapes chain (layer i's output is layer i+1's input, the first input is
 *    the model's), no per-example tensor exceeds GS_MODEL_MAX_ELEMENTS,
 *    max_elements covers every one, parameter counts are the products of
 *    their dims and sum to the model's, the last layer is the Dense whose
 *    units are the classes, layer names are unique;
 *  - for conv/depthwise/pool layers, the kernels' own geometry
 *    (gs_model_conv_shape -> gs_conv_shape_init) gives the inferred output;
 *  - gs_model_check_dataset accepts the model's own input and classes;
 *  - the plan's text, JSON and message build; PREALLOCATE fits exactly at
 *    the peak, not a byte under; what fits GROWTH fits PREALLOCATE.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "present/present.h"
#include "proto/gpushare.pb-c.h"
#include "runtime/model.h"
#include "runtime/plan.h"
#include "convert/spec_pb.h"

static void check_shape(const gs_shape *s, const gs_model *m) {
  if (s->rank != 1 && s->rank != 3) abort();
  if (s->rank == 1 && (s->h != 1 || s->w != 1)) abort();
  uint64_t n = gs_shape_elements(s);
  if (n == 0 || n > GS_MODEL_MAX_ELEMENTS || n > m->max_elements) abort();
}

static bool same_shape(const gs_shape *a, const gs_shape *b) {
  return a->rank == b->rank && a->h == b->h && a->w == b->w && a->c == b->c;
}

static void check_model(const gs_model *m) {
  if (m->n_layers == 0 || m->n_layers > GS_MODEL_MAX_LAYERS || !m->layers) abort();
  check_shape(&m->input, m);
  uint64_t params = 0;
  char buf[128];
  for (uint32_t i = 0; i < m->n_layers; i++) {
    const gs_layer *l = &m->layers[i];
    if (l->kind >= GS_LAYER_KIND_COUNT) abort();
    if (!memchr(l->name, 0, sizeof l->name) || !l->name[0]) abort();
    for (uint32_t j = 0; j < i; j++)
      if (!strcmp(m->layers[j].name, l->name)) abort();
    check_shape(&l->in, m);
    check_shape(&l->out, m);
    if (!same_shape(&l->in, i ? &m->layers[i - 1].out : &m->input)) abort();
    if (l->n_params > 2) abort();
    uint64_t lp = 0;
    for (uint32_t k = 0; k < l->n_params; k++) {
      const gs_param_shape *p = &l->params[k];
      if (p->rank < 1 || p->rank > 4) abort();
      uint64_t c = 1;
      for (uint32_t d = 0; d < p->rank; d++) c *= p->dims[d];
      if (c != p->count || c == 0) abort();
      lp += c;
    }
    if (lp != l->param_count) abort();
    params += lp;
    if (l->kind == GS_LAYER_CONV2D || l->kind == GS_LAYER_DEPTHWISE_CONV2D ||
        l->kind == GS_LAYER_MAX_POOL2D) {
      gs_conv_shape cs = gs_model_conv_shape(l, m->recipe.batch_size);
      if (l->in.rank != 3 || l->out.rank != 3) abort();
      if (cs.oh != l->out.h || cs.ow != l->out.w) abort();
      if (cs.n != m->recipe.batch_size || cs.h != l->in.h || cs.w != l->in.w || cs.c != l->in.c)
        abort();
    }
    gs_shape_format(&l->out, m->recipe.batch_size, buf, sizeof buf);
    gs_layer_kind_name(l->kind);
  }
  if (params != m->param_count) abort();
  const gs_layer *last = &m->layers[m->n_layers - 1];
  if (last->kind != GS_LAYER_DENSE || last->units != m->classes || m->classes < 1) abort();
  if (last->out.rank != 1 || last->out.c != m->classes) abort();
  gs_err e;
  gs_err_clear(&e);
  uint32_t h = m->input.rank == 3 ? m->input.h : 1, w = m->input.rank == 3 ? m->input.w : 1;
  if (m->classes >= 2 &&
      gs_model_check_dataset(m, "train", h, w, m->input.c, m->classes, &e) != 0)
    abort();
}

static void check_plan(const gs_job_spec *spec) {
  gs_err e;
  gs_err_clear(&e);
  gs_plan p;
  int rc = gs_plan_job(spec, gs_backend_cpu(), &p, &e);
  if (rc) { /* the builder accepted the spec: the planner must too */
    abort();
  }
  if (p.peak_bytes == 0 || !p.rows || p.n_rows < 2) abort();
  if (!gs_plan_fits(&p, p.peak_bytes, GS_POLICY_PREALLOCATE)) abort();
  if (gs_plan_fits(&p, p.peak_bytes - 1, GS_POLICY_PREALLOCATE)) abort();
  const uint64_t limits[] = {p.peak_bytes, p.peak_bytes + (p.peak_bytes >> 3),
                             p.peak_bytes * 2, 256ull << 20};
  for (size_t i = 0; i < sizeof limits / sizeof limits[0]; i++)
    if (gs_plan_fits(&p, limits[i], GS_POLICY_GROWTH) &&
        !gs_plan_fits(&p, limits[i], GS_POLICY_PREALLOCATE))
      abort();
  free(gs_plan_json(&p, p.peak_bytes / 2));
  Gpushare__V1__Plan *msg = NULL;
  if (gs_spec_pb_plan(&p, p.peak_bytes / 2, GS_POLICY_GROWTH, &msg) == 0) {
    free(gs_present_plan(msg));
    gpushare__v1__plan__free_unpacked(msg, NULL);
  }
  gs_plan_free(&p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  Gpushare__V1__JobSpec *spec = gpushare__v1__job_spec__unpack(NULL, size, data);
  if (!spec) return 0;
  gs_err e;
  gs_err_clear(&e);
  gs_model m;
  gs_job_spec js;
  int rc = gs_spec_pb_job(spec, &js, &e);
  if (rc) abort(); /* only a NULL spec or no memory fail the conversion */
  rc = gs_model_build(&js, &m, &e);
  if (rc != 0) {
    if (rc > 0 || e.code == GS_OK || !e.msg[0]) abort();
  } else {
    if (e.code != GS_OK) abort();
    check_model(&m);
    gs_model_free(&m);
    check_plan(&js);
  }
  gs_spec_pb_job_free(&js);
  gpushare__v1__job_spec__free_unpacked(spec, NULL);
  return 0;
}
