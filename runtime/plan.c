/*
 * plan.c: a job's memory, known before it runs, and explained when it did
 * not fit.
 *
 * Exact by construction. The training runtime allocates every device tensor
 * of a job once, at gs_train_create, from the list gs_train_buffers()
 * produces (train.h). The planner walks that same list for the same model,
 * recipe and backend and adds up each buffer's block_bytes (the allocator's
 * gs_alloc_block_size rounding), so its peak is the sum the allocator's
 * peak_in_use measures, with nothing allocated: there is no second model of
 * the runtime's memory here to drift out of date. The one input the planner
 * may not know is the size of the last, partial test micro-batch (the op
 * scratch covers it): it reads it from a synthetic test set and assumes a
 * full one otherwise, which is the same bytes on backends whose workspace
 * grows with the batch (the CPU backend's does).
 *
 * Variants. Admission, auto-fit and the suggestions plan shallow copies of
 * the JobSpec with batch_size, accumulation_steps or precision replaced.
 * spec.batch_size is the micro-batch b; the effective batch is E = b * k
 * (k = accumulation_steps) and auto-fit keeps E: it tries the divisors of E
 * from the largest down (with k = E / b within the recipe's bounds) and
 * takes the first that fits. Mixed precision is offered to FLOAT32 jobs
 * only when it lowers the peak (it adds fp32 masters, so a model whose
 * parameters dominate needs MORE memory in mixed precision).
 *
 * What people read (the plan table, OOM reports, the memory chart) is not
 * here: runtime/oom.c builds the OOM report from the planner's suggestions,
 * convert/spec_pb.c turns plans and reports into messages and present/
 * writes them as text.
 */
#include "runtime/plan.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/size.h"
#include "common/strbuf.h"
#include "runtime/model.h"
#include "runtime/train.h"


static void sb_json_str(gs_strbuf *s, const char *v) {
  gs_strbuf_printf(s, "\"");
  for (const unsigned char *p = (const unsigned char *)(v ? v : ""); *p; p++) {
    if (*p == '"' || *p == '\\')
      gs_strbuf_printf(s, "\\%c", *p);
    else if (*p < 0x20)
      gs_strbuf_printf(s, "\\u%04x", *p);
    else
      gs_strbuf_printf(s, "%c", *p);
  }
  gs_strbuf_printf(s, "\"");
}

static const char *sz(uint64_t bytes, char *buf) { return gs_size_format(bytes, buf, 32); }

static const char *precision_name(gs_precision p) { return gs_precision_name(p); }

/* ------------------------------------------------------------- planning --- */

typedef struct plan_ctx {
  gs_plan *p;
  const gs_model *m;
  size_t cap; /* of p->blocks */
} plan_ctx;

/* "qkv (32, 64, 384) 1.50 MiB" appended to the row's keeps; attention's
 * scores say what they grow with. */
static void keeps_add(gs_plan_row *r, const gs_train_buffer *bf) {
  char shape[96] = "(", b[32];
  size_t o = 1;
  for (uint32_t i = 0; i < bf->rank && o < sizeof shape; i++)
    o += (size_t)snprintf(shape + o, sizeof shape - o, "%s%" PRIu64, i ? ", " : "", bf->shape[i]);
  if (o < sizeof shape) snprintf(shape + o, sizeof shape - o, ")");
  const char *dot = strchr(bf->tensor, '.');
  const char *what = dot ? dot + 1 : bf->tensor;
  size_t n = strlen(r->keeps);
  snprintf(r->keeps + n, sizeof r->keeps - n, "%s%s %s %s %s%s", n ? ", " : "", what, shape,
           gs_dtype_name(bf->dtype), sz(bf->block_bytes, b),
           bf->layer && bf->layer->kind == GS_LAYER_CAUSAL_SELF_ATTENTION &&
                   strcmp(what, "scores") == 0
               ? " (heads x T x T: the square of the sequence length)"
               : "");
}

static int plan_one(void *u, const gs_train_buffer *bf) {
  plan_ctx *c = u;
  if (c->p->n_blocks == c->cap) {
    size_t cap = c->cap ? 2 * c->cap : 64;
    uint64_t *nb = realloc(c->p->blocks, cap * sizeof *nb);
    if (!nb) return -ENOMEM;
    c->p->blocks = nb;
    c->cap = cap;
  }
  c->p->blocks[c->p->n_blocks++] = bf->block_bytes;
  size_t row = bf->layer ? (size_t)(bf->layer - c->m->layers) : c->m->n_layers;
  c->p->rows[row].bytes[bf->role] += bf->block_bytes;
  if (bf->slot == GS_TSLOT_SAVED) keeps_add(&c->p->rows[row], bf);
  c->p->by_role[bf->role] += bf->block_bytes;
  c->p->peak_bytes += bf->block_bytes;
  return 0;
}

/* The size of the last, partial test micro-batch, where the spec tells it. */
static uint32_t eval_remainder(const gs_job_spec *spec, uint32_t micro) {
  if (spec->test.source != GS_DATASET_SYNTHETIC || micro == 0) return 0;
  return (uint32_t)(spec->test.examples % micro);
}

int gs_plan_job(const gs_job_spec *spec, const gs_backend *b, gs_plan *out,
                gs_err *e) {
  gs_model m;
  memset(out, 0, sizeof *out);
  if (!spec)
    return gs_err_set(e, GS_INVALID_ARGUMENT, "", "there is no job spec to plan"), -EINVAL;
  int rc = gs_model_build(spec, &m, e);
  if (rc) return rc < 0 ? rc : -EINVAL;
  out->rows = calloc((size_t)m.n_layers + 1, sizeof *out->rows);
  if (!out->rows) {
    rc = gs_err_set(e, GS_INTERNAL, "", "out of host memory for the plan");
    rc = -ENOMEM;
    goto fail;
  }
  out->n_rows = (size_t)m.n_layers + 1;
  const gs_recipe *r = &m.recipe;
  for (uint32_t i = 0; i < m.n_layers; i++) {
    gs_plan_row *row = &out->rows[i];
    const gs_layer *l = &m.layers[i];
    snprintf(row->layer, sizeof row->layer, "%s", l->name);
    snprintf(row->kind, sizeof row->kind, "%s", gs_layer_kind_name(l->kind));
    gs_shape_format(&l->out, r->batch_size, row->output_shape, sizeof row->output_shape);
    row->parameters = l->param_count;
  }
  gs_plan_row *job = &out->rows[m.n_layers];
  snprintf(job->layer, sizeof job->layer, "job");
  snprintf(job->kind, sizeof job->kind, "job");
  out->parameters = m.param_count;
  out->micro_batch = r->batch_size;
  out->accumulation_steps = r->accumulation_steps;
  out->precision = r->precision;
  plan_ctx c = {.p = out, .m = &m};
  rc = gs_train_buffers(&m, r, b, eval_remainder(spec, r->batch_size), plan_one, &c);
  if (rc) {
    gs_err_set(e, GS_INTERNAL, "", "planning the job's buffers failed (%d)", rc);
    goto fail;
  }
  gs_model_free(&m);
  return 0;
fail:
  gs_model_free(&m);
  gs_plan_free(out);
  return rc < 0 ? rc : -EINVAL;
}

void gs_plan_free(gs_plan *p) {
  if (!p) return;
  free(p->rows);
  free(p->blocks);
  p->rows = NULL;
  p->n_rows = 0;
  p->blocks = NULL;
  p->n_blocks = 0;
}

/* Would the job's blocks, allocated in order with nothing freed (what
 * gs_train_create does), all be placed by a fresh allocator of `limit`
 * bytes? PREALLOCATE is one region of the whole limit: the blocks pack
 * end to end, so the sum decides. GROWTH adds regions as alloc.c does (the
 * first max(block, min(2 MiB, limit)), then min(twice the last, what the
 * limit leaves), at least the block) and a block never spans two regions,
 * so a large late block can find only the scraps of a limit cut into
 * regions: simulate it, best fit over the regions' free tails as the
 * allocator's bins do. A device that refuses regions (PHYSICAL) is out of
 * the planner's sight. */
bool gs_plan_fits(const gs_plan *p, uint64_t limit, gs_alloc_policy policy) {
  if (limit == 0) return true;
  const uint64_t cap = limit & ~(uint64_t)(GS_ALLOC_ALIGN - 1);
  if (policy != GS_POLICY_GROWTH) return p->peak_bytes <= cap;
  if (p->peak_bytes > cap) return false;
  /* Regions' free tails; a job has a few dozen blocks and few regions. */
  uint64_t tails[64];
  size_t nt = 0;
  uint64_t in_use = 0, reserved = 0, last = 0;
  for (size_t i = 0; i < p->n_blocks; i++) {
    uint64_t need = p->blocks[i];
    size_t best = SIZE_MAX;
    for (size_t j = 0; j < nt; j++)
      if (tails[j] >= need && (best == SIZE_MAX || tails[j] < tails[best])) best = j;
    if (best == SIZE_MAX) {
      if (need > cap || cap - in_use < need) return false; /* QUOTA */
      uint64_t headroom = cap - reserved;
      if (headroom < need) return false; /* FRAGMENTATION across regions */
      uint64_t want = (uint64_t)2 << 20;
      if (last) want = last > headroom / 2 ? headroom : 2 * last;
      if (want > headroom) want = headroom;
      if (want < need) want = need;
      if (nt == sizeof tails / sizeof tails[0]) return false;
      tails[nt] = want;
      best = nt++;
      reserved += want;
      last = want;
    }
    tails[best] -= need;
    in_use += need;
  }
  return true;
}

/* A copy of spec with the micro-batch, accumulation and precision replaced
 * (shallow: it points into spec's sub-messages). */
static gs_job_spec variant(const gs_job_spec *spec, uint32_t micro, uint32_t accum,
                           gs_precision precision) {
  gs_job_spec v = *spec;
  v.batch_size = micro;
  v.accumulation_steps = accum;
  v.precision = precision;
  return v;
}

/* Plan of a variant into *p; false when the variant is not a valid job
 * (accumulation out of bounds). */
static bool variant_plan(const gs_job_spec *spec, const gs_backend *b,
                         uint32_t micro, uint32_t accum, gs_precision precision, gs_plan *p) {
  gs_job_spec v = variant(spec, micro, accum, precision);
  gs_err e;
  gs_err_clear(&e);
  return gs_plan_job(&v, b, p, &e) == 0;
}

/* The largest micro-batch dividing `eff` whose plan fits `limit` (0: none).
 * Divisors are tried from the largest down; `below` (when > 0) skips those
 * >= below. */
static uint32_t largest_fit(const gs_job_spec *spec, const gs_backend *b,
                            uint64_t eff, gs_precision precision, uint64_t limit, gs_alloc_policy pol,
                            uint32_t below, uint64_t *peak, gs_plan *keep) {
  uint64_t start = eff < GS_MODEL_MAX_BATCH ? eff : GS_MODEL_MAX_BATCH;
  if (below && start >= below) start = below - 1;
  for (uint64_t d = start; d >= 1; d--) {
    if (eff % d) continue;
    uint64_t k = eff / d;
    if (k > GS_MODEL_MAX_ACCUMULATION) break; /* smaller divisors only raise k */
    gs_plan tmp;
    if (!variant_plan(spec, b, (uint32_t)d, (uint32_t)k, precision, &tmp)) continue;
    if (gs_plan_fits(&tmp, limit, pol)) {
      *peak = tmp.peak_bytes;
      if (keep)
        *keep = tmp;
      else
        gs_plan_free(&tmp);
      return (uint32_t)d;
    }
    gs_plan_free(&tmp);
  }
  return 0;
}

/* ------------------------------------------------------------------ JSON --- */

char *gs_plan_json(const gs_plan *p, uint64_t limit) {
  gs_strbuf s = {0};
  gs_strbuf_printf(&s, "{\"micro_batch\":%u,\"accumulation_steps\":%u,\"effective_batch\":%" PRIu64
                ",\"precision\":\"%s\",\"parameters\":%" PRIu64 ",\"peak_bytes\":%" PRIu64
                ",\"limit_bytes\":%" PRIu64,
            p->micro_batch, p->accumulation_steps,
            (uint64_t)p->micro_batch * p->accumulation_steps, precision_name(p->precision),
            p->parameters, p->peak_bytes, limit);
  if (limit)
    gs_strbuf_printf(&s, ",\"fits\":%s,\"fits_preallocate\":%s",
              gs_plan_fits(p, limit, GS_POLICY_GROWTH) ? "true" : "false",
              gs_plan_fits(p, limit, GS_POLICY_PREALLOCATE) ? "true" : "false");
  gs_strbuf_printf(&s, ",\"by_role\":{");
  for (int r = 0; r < GS_ROLE_COUNT; r++)
    gs_strbuf_printf(&s, "%s\"%s\":%" PRIu64, r ? "," : "", gs_role_name((gs_role)r), p->by_role[r]);
  gs_strbuf_printf(&s, "},\"rows\":[");
  for (size_t i = 0; i < p->n_rows; i++) {
    const gs_plan_row *row = &p->rows[i];
    gs_strbuf_printf(&s, "%s{\"layer\":", i ? "," : "");
    sb_json_str(&s, row->layer);
    gs_strbuf_printf(&s, ",\"kind\":");
    sb_json_str(&s, row->kind);
    gs_strbuf_printf(&s, ",\"output_shape\":");
    sb_json_str(&s, row->output_shape);
    gs_strbuf_printf(&s, ",\"parameters\":%" PRIu64 ",\"bytes\":{", row->parameters);
    for (int r = 0; r < GS_ROLE_COUNT; r++)
      gs_strbuf_printf(&s, "%s\"%s\":%" PRIu64, r ? "," : "", gs_role_name((gs_role)r), row->bytes[r]);
    gs_strbuf_printf(&s, "}}");
  }
  gs_strbuf_printf(&s, "]}");
  return gs_strbuf_take(&s);
}

/* ---------------------------------------------------------- suggestions --- */

static void suggestion(gs_plan_suggestion *s, uint32_t micro, uint32_t accum, gs_precision precision,
                       uint64_t peak, uint64_t current, bool precision_changed) {
  char a[32], bb[32];
  memset(s, 0, sizeof *s);
  s->micro_batch = micro;
  s->accumulation_steps = accum;
  s->precision = precision;
  s->predicted_peak_bytes = peak;
  s->saving_bytes = current > peak ? current - peak : 0;
  int o = snprintf(s->what, sizeof s->what, "%s%smicro-batch %u x %u accumulation step%s",
                   precision_changed ? precision_name(precision) : "",
                   precision_changed ? " at " : "", micro, accum, accum == 1 ? "" : "s");
  if (o > 0 && (size_t)o < sizeof s->what)
    snprintf(s->what + o, sizeof s->what - (size_t)o, " (effective batch %" PRIu64
             "): peak %s, saves %s",
             (uint64_t)micro * accum, sz(peak, a), sz(s->saving_bytes, bb));
}

int gs_plan_suggest(const gs_job_spec *spec, const gs_backend *b, uint64_t limit,
                    gs_plan_suggestion *out, size_t max, size_t *n, gs_err *e) {
  return gs_plan_suggest_policy(spec, b, limit, GS_POLICY_GROWTH, out, max, n, e);
}

int gs_plan_suggest_policy(const gs_job_spec *spec, const gs_backend *b,
                           uint64_t limit, gs_alloc_policy pol, gs_plan_suggestion *out,
                           size_t max, size_t *n, gs_err *e) {
  gs_plan cur;
  *n = 0;
  int rc = gs_plan_job(spec, b, &cur, e);
  if (rc) return rc;
  const uint64_t eff = (uint64_t)cur.micro_batch * cur.accumulation_steps;
  const uint64_t lim = limit ? limit : UINT64_MAX;
  uint64_t peak = 0;
  /* 1. The largest smaller micro-batch that fits, same precision. */
  uint32_t d = largest_fit(spec, b, eff, cur.precision, lim, pol, cur.micro_batch, &peak, NULL);
  uint64_t dpeak = peak;
  if (d && *n < max && limit)
    suggestion(&out[(*n)++], d, (uint32_t)(eff / d), cur.precision, peak, cur.peak_bytes, false);
  /* 2. Mixed precision, for an fp32 job, where it lowers the peak: at the
   * current micro-batch if that fits, else at the largest that fits. */
  if (cur.precision == GS_PRECISION_FLOAT32 && *n < max) {
    const gs_precision mp = GS_PRECISION_MIXED_BFLOAT16;
    gs_plan mpl;
    bool ok = variant_plan(spec, b, cur.micro_batch, cur.accumulation_steps, mp, &mpl);
    uint64_t mpk = ok ? mpl.peak_bytes : 0;
    bool mfits = ok && gs_plan_fits(&mpl, limit, pol);
    if (ok) gs_plan_free(&mpl);
    if (ok && mpk < cur.peak_bytes && mfits) {
      suggestion(&out[(*n)++], cur.micro_batch, cur.accumulation_steps, mp, mpk, cur.peak_bytes,
                 true);
    } else if (limit) {
      uint32_t dm = largest_fit(spec, b, eff, mp, lim, pol, 0, &peak, NULL);
      /* Worth listing when it keeps a larger micro-batch than the fp32
       * suggestion, or the same one for less memory. */
      if (dm && (dm > d || (dm == d && peak < dpeak)) && peak < cur.peak_bytes)
        suggestion(&out[(*n)++], dm, (uint32_t)(eff / dm), mp, peak, cur.peak_bytes, true);
    }
  }
  /* 3. A language model: the longest shorter sequence that fits as it
   * stands (attention's scores shrink with its square). */
  const uint32_t T = spec->input.sequence_length;
  if (T > 1 && limit && *n < max) {
    for (uint32_t t = T / 2; t >= 1; t /= 2) {
      gs_job_spec v = *spec;
      v.input.sequence_length = t;
      gs_plan tp;
      gs_err te;
      gs_err_clear(&te);
      if (gs_plan_job(&v, b, &tp, &te) != 0) break;
      bool fits = gs_plan_fits(&tp, limit, pol);
      uint64_t pk = tp.peak_bytes;
      gs_plan_free(&tp);
      if (!fits) continue;
      gs_plan_suggestion *sg = &out[(*n)++];
      suggestion(sg, cur.micro_batch, cur.accumulation_steps, cur.precision, pk, cur.peak_bytes,
                 false);
      sg->sequence_length = t;
      char tail[sizeof sg->what];
      snprintf(tail, sizeof tail, "%s", sg->what);
      snprintf(sg->what, sizeof sg->what, "sequence_length %u (from %u) at %s", t, T, tail);
      break;
    }
  }
  gs_plan_free(&cur);
  return 0;
}

/* ------------------------------------------------------------ admission --- */

/* Why nothing fits, from the plan at micro-batch 1: the batch-independent
 * roles (weights, masters, gradients, optimizer) against the rest. */
static void explain_no_fit(const gs_job_spec *spec, const gs_backend *b,
                           const gs_plan *p1, uint64_t limit, gs_alloc_policy pol, char *why,
                           size_t len) {
  char a[32], bb[32], c[32], d[32];
  uint64_t fixed = p1->by_role[GS_ROLE_WEIGHTS] + p1->by_role[GS_ROLE_MASTER] +
                   p1->by_role[GS_ROLE_GRADIENTS] + p1->by_role[GS_ROLE_OPTIMIZER];
  size_t o = strlen(why);
  if (fixed >= limit) {
    o += (size_t)snprintf(why + o, len - o,
                          "parameters and optimizer state alone need %s (weights %s, gradients "
                          "%s, optimizer %s",
                          sz(fixed, a), sz(p1->by_role[GS_ROLE_WEIGHTS], bb),
                          sz(p1->by_role[GS_ROLE_GRADIENTS], c),
                          sz(p1->by_role[GS_ROLE_OPTIMIZER], d));
    if (o < len && p1->by_role[GS_ROLE_MASTER])
      o += (size_t)snprintf(why + o, len - o, ", fp32 masters %s",
                            sz(p1->by_role[GS_ROLE_MASTER], a));
    if (o < len)
      o += (size_t)snprintf(why + o, len - o,
                            ") against the %s limit: the model does not fit this vdev at any "
                            "batch size",
                            sz(limit, a));
  } else {
    int top = GS_ROLE_ACTIVATIONS;
    for (int r = GS_ROLE_ACTIVATIONS; r < GS_ROLE_COUNT; r++)
      if (p1->by_role[r] > p1->by_role[top]) top = r;
    o += (size_t)snprintf(why + o, len - o,
                          "even at micro-batch 1 the job needs %s against the %s limit: "
                          "parameters and optimizer state take %s, and %s (the largest role "
                          "that grows with the batch) %s",
                          sz(p1->peak_bytes, a), sz(limit, bb), sz(fixed, c),
                          gs_role_name((gs_role)top), sz(p1->by_role[top], d));
  }
  if (o >= len) return;
  /* Would mixed precision fit at micro-batch 1? It adds masters, so only
   * say so when it does. */
  bool ok = false;
  uint64_t mpk = 0;
  gs_plan mpl;
  if (p1->precision == GS_PRECISION_FLOAT32 &&
      variant_plan(spec, b, 1, p1->accumulation_steps, GS_PRECISION_MIXED_BFLOAT16,
                   &mpl)) {
    mpk = mpl.peak_bytes;
    ok = gs_plan_fits(&mpl, limit, pol);
    gs_plan_free(&mpl);
  }
  if (ok)
    snprintf(why + o, len - o, "; try mixed_bfloat16 precision (peak %s at micro-batch 1) or a "
             "vdev of at least %s", sz(mpk, a), sz(p1->peak_bytes, bb));
  else
    snprintf(why + o, len - o, "; it needs a vdev of at least %s%s", sz(p1->peak_bytes, a),
             p1->precision == GS_PRECISION_FLOAT32
                 ? " (mixed precision would not help: its fp32 masters add to the parameters)"
                 : "");
}

int gs_plan_admit(const gs_job_spec *spec, const gs_backend *b, uint64_t limit,
                  bool auto_fit, gs_admission *out, gs_err *e) {
  return gs_plan_admit_policy(spec, b, limit, GS_POLICY_GROWTH, auto_fit, out, e);
}

int gs_plan_admit_policy(const gs_job_spec *spec, const gs_backend *b, uint64_t limit,
                         gs_alloc_policy pol, bool auto_fit, gs_admission *out, gs_err *e) {
  memset(out, 0, sizeof *out);
  int rc = gs_plan_job(spec, b, &out->plan, e);
  if (rc) return rc;
  out->micro_batch = out->plan.micro_batch;
  out->accumulation_steps = out->plan.accumulation_steps;
  if (gs_plan_fits(&out->plan, limit, pol)) {
    out->fits = true;
    return 0;
  }
  char a[32], bb[32], c[32];
  const uint64_t eff = (uint64_t)out->plan.micro_batch * out->plan.accumulation_steps;
  const gs_precision prec = out->plan.precision;
  uint64_t peak = 0;
  if (auto_fit) {
    gs_plan fit;
    uint32_t d = largest_fit(spec, b, eff, prec, limit, pol, out->plan.micro_batch, &peak, &fit);
    if (d) {
      gs_plan_free(&out->plan);
      out->plan = fit;
      out->fits = out->chosen = true;
      out->micro_batch = d;
      out->accumulation_steps = (uint32_t)(eff / d);
      return 0;
    }
  }
  size_t o;
  if (out->plan.peak_bytes > limit)
    o = (size_t)snprintf(out->why, sizeof out->why,
                         "the job needs %s at micro-batch %u x %u accumulation step%s (%s), "
                         "over the vdev's %s limit by %s; ",
                         sz(out->plan.peak_bytes, a), out->plan.micro_batch,
                         out->plan.accumulation_steps,
                         out->plan.accumulation_steps == 1 ? "" : "s", precision_name(prec),
                         sz(limit, bb), sz(out->plan.peak_bytes - limit, c));
  else
    o = (size_t)snprintf(out->why, sizeof out->why,
                         "the job needs %s at micro-batch %u x %u accumulation step%s (%s), "
                         "under the vdev's %s limit, but a growth vdev reserves its memory in "
                         "regions (2 MiB, then doubling) and a buffer never spans two: the "
                         "largest of this job's buffers finds no region that holds it (a "
                         "preallocated vdev of this limit would); ",
                         sz(out->plan.peak_bytes, a), out->plan.micro_batch,
                         out->plan.accumulation_steps,
                         out->plan.accumulation_steps == 1 ? "" : "s", precision_name(prec),
                         sz(limit, bb));
  gs_plan_suggestion sg[4];
  size_t n = 0;
  gs_err e2;
  gs_err_clear(&e2);
  if (gs_plan_suggest_policy(spec, b, limit, pol, sg, 4, &n, &e2) == 0 && n > 0) {
    o += (size_t)snprintf(out->why + o, sizeof out->why - o, "what fits: ");
    for (size_t i = 0; i < n && o < sizeof out->why; i++)
      o += (size_t)snprintf(out->why + o, sizeof out->why - o, "%s%s", i ? "; or " : "",
                            sg[i].what);
    if (o < sizeof out->why && sg[0].precision == prec)
      snprintf(out->why + o, sizeof out->why - o,
               " (set auto_fit, or gpushare-run --auto-fit, to take the first)");
    return 0;
  }
  /* Nothing fits even at micro-batch 1: say which role dominates. */
  if (eff > GS_MODEL_MAX_ACCUMULATION) {
    snprintf(out->why + o, sizeof out->why - o,
             "no micro-batch dividing the effective batch %" PRIu64 " fits with at most %u "
             "accumulation steps",
             eff, GS_MODEL_MAX_ACCUMULATION);
    return 0;
  }
  gs_job_spec v1 = variant(spec, 1, (uint32_t)eff, prec);
  gs_plan p1;
  if (gs_plan_job(&v1, b, &p1, &e2) == 0) {
    explain_no_fit(spec, b, &p1, limit, pol, out->why, sizeof out->why);
    gs_plan_free(&p1);
  }
  return 0;
}

void gs_admission_free(gs_admission *a) {
  if (a) gs_plan_free(&a->plan);
}
