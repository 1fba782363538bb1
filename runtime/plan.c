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
 * OOM reports. gs_plan_oom_report turns a gs_train_failure into the
 * gpushare.v1.OomReport the daemon stores and gpushare-run prints (one
 * builder, so both say the same), with the cause worded for an ML engineer
 * and what would fit: for QUOTA against the vdev's limit, for PHYSICAL
 * against what the vdev could actually reserve, for FRAGMENTATION against
 * the largest free block.
 */
#include "runtime/plan.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/model.h"
#include "common/size.h"
#include "runtime/train.h"

/* ------------------------------------------------------- string builder --- */

typedef struct sb {
  char *buf;
  size_t len, cap;
  bool failed;
} sb;

static void sb_printf(sb *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sb *s, const char *fmt, ...) {
  if (s->failed) return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    size_t room = s->cap - s->len;
    int n = vsnprintf(s->buf ? s->buf + s->len : NULL, room, fmt, ap);
    va_end(ap);
    if (n < 0) {
      s->failed = true;
      return;
    }
    if ((size_t)n < room) {
      s->len += (size_t)n;
      return;
    }
    size_t cap = s->cap ? s->cap * 2 : 1024;
    while (cap - s->len <= (size_t)n) cap *= 2;
    char *nb = realloc(s->buf, cap);
    if (!nb) {
      s->failed = true;
      return;
    }
    s->buf = nb;
    s->cap = cap;
  }
}

static char *sb_take(sb *s) {
  if (s->failed || !s->buf) {
    free(s->buf);
    return s->failed ? NULL : strdup("");
  }
  return s->buf;
}

static void sb_json_str(sb *s, const char *v) {
  sb_printf(s, "\"");
  for (const unsigned char *p = (const unsigned char *)(v ? v : ""); *p; p++) {
    if (*p == '"' || *p == '\\')
      sb_printf(s, "\\%c", *p);
    else if (*p < 0x20)
      sb_printf(s, "\\u%04x", *p);
    else
      sb_printf(s, "%c", *p);
  }
  sb_printf(s, "\"");
}

static const char *sz(uint64_t bytes, char *buf) { return gs_size_format(bytes, buf, 32); }

static const char *precision_name(int p) {
  switch (p) {
  case GPUSHARE__V1__PRECISION__MIXED_FLOAT16: return "mixed_float16";
  case GPUSHARE__V1__PRECISION__MIXED_BFLOAT16: return "mixed_bfloat16";
  default: return "float32";
  }
}

/* "1,234,567" */
static const char *grouped(uint64_t v, char *buf, size_t len) {
  char raw[32];
  int n = snprintf(raw, sizeof raw, "%" PRIu64, v);
  size_t o = 0;
  for (int i = 0; i < n && o + 2 < len; i++) {
    if (i && (n - i) % 3 == 0) buf[o++] = ',';
    buf[o++] = raw[i];
  }
  buf[o] = '\0';
  return buf;
}

/* ------------------------------------------------------------- planning --- */

typedef struct plan_ctx {
  gs_plan *p;
  const gs_model *m;
  size_t cap; /* of p->blocks */
} plan_ctx;

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
  c->p->by_role[bf->role] += bf->block_bytes;
  c->p->peak_bytes += bf->block_bytes;
  return 0;
}

/* The size of the last, partial test micro-batch, where the spec tells it. */
static uint32_t eval_remainder(const Gpushare__V1__JobSpec *spec, uint32_t micro) {
  const Gpushare__V1__Dataset *te = spec->test;
  if (!te || te->source_case != GPUSHARE__V1__DATASET__SOURCE_SYNTHETIC || !te->synthetic ||
      micro == 0)
    return 0;
  return (uint32_t)(te->synthetic->examples % micro);
}

int gs_plan_job(const Gpushare__V1__JobSpec *spec, const gs_backend *b, gs_plan *out,
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
static Gpushare__V1__JobSpec variant(const Gpushare__V1__JobSpec *spec, uint32_t micro,
                                     uint32_t accum, int precision) {
  Gpushare__V1__JobSpec v = *spec;
  v.has_batch_size = true;
  v.batch_size = micro;
  v.has_accumulation_steps = true;
  v.accumulation_steps = accum;
  v.has_precision = true;
  v.precision = (Gpushare__V1__Precision)precision;
  return v;
}

/* Plan of a variant into *p; false when the variant is not a valid job
 * (accumulation out of bounds). */
static bool variant_plan(const Gpushare__V1__JobSpec *spec, const gs_backend *b,
                         uint32_t micro, uint32_t accum, int precision, gs_plan *p) {
  Gpushare__V1__JobSpec v = variant(spec, micro, accum, precision);
  gs_err e;
  gs_err_clear(&e);
  return gs_plan_job(&v, b, p, &e) == 0;
}

/* The largest micro-batch dividing `eff` whose plan fits `limit` (0: none).
 * Divisors are tried from the largest down; `below` (when > 0) skips those
 * >= below. */
static uint32_t largest_fit(const Gpushare__V1__JobSpec *spec, const gs_backend *b,
                            uint64_t eff, int precision, uint64_t limit, gs_alloc_policy pol,
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

/* ------------------------------------------------------------- the table --- */

/* "stem (conv2d)"; a generated name (dense_1) already says its kind. */
static void row_name(const gs_plan_row *row, bool job, char *buf, size_t len) {
  size_t k = strlen(row->kind);
  if (job)
    snprintf(buf, len, "job");
  else if (!strncmp(row->layer, row->kind, k) && row->layer[k] == '_')
    snprintf(buf, len, "%s", row->layer);
  else
    snprintf(buf, len, "%s (%s)", row->layer, row->kind);
}

char *gs_plan_format(const gs_plan *p, uint64_t limit) {
  sb s = {0};
  char a[32], bb[32], g[40];
  bool col[GS_ROLE_COUNT] = {0};
  for (int r = 0; r < GS_ROLE_COUNT; r++) col[r] = p->by_role[r] > 0;
  /* Column widths: the layer column fits its longest name. */
  int wl = 14, ws = 12;
  for (size_t i = 0; i < p->n_rows; i++) {
    char name[160];
    row_name(&p->rows[i], i + 1 == p->n_rows, name, sizeof name);
    int n = (int)strlen(name);
    if (n > wl) wl = n;
    int k = (int)strlen(p->rows[i].output_shape);
    if (k > ws) ws = k;
  }
  const int wn = 12, wb = 11;
  int width = wl + 1 + ws + 1 + wn;
  sb_printf(&s, "%-*s %-*s %*s", wl, "Layer", ws, "Output shape", wn, "Param #");
  for (int r = 0; r < GS_ROLE_COUNT; r++)
    if (col[r]) {
      sb_printf(&s, " %*s", wb, gs_role_name((gs_role)r));
      width += wb + 1;
    }
  sb_printf(&s, " %*s\n", wb, "total");
  width += wb + 1;
  char rule[512];
  int rw = width < (int)sizeof rule - 1 ? width : (int)sizeof rule - 1;
  memset(rule, '=', (size_t)rw);
  rule[rw] = '\0';
  sb_printf(&s, "%s\n", rule);
  for (size_t i = 0; i < p->n_rows; i++) {
    const gs_plan_row *row = &p->rows[i];
    char name[160];
    row_name(row, i + 1 == p->n_rows, name, sizeof name);
    uint64_t tot = 0;
    for (int r = 0; r < GS_ROLE_COUNT; r++) tot += row->bytes[r];
    sb_printf(&s, "%-*s %-*s %*s", wl, name, ws, row->output_shape, wn,
              i + 1 == p->n_rows ? "" : grouped(row->parameters, g, sizeof g));
    for (int r = 0; r < GS_ROLE_COUNT; r++)
      if (col[r]) sb_printf(&s, " %*s", wb, row->bytes[r] ? sz(row->bytes[r], a) : "-");
    sb_printf(&s, " %*s\n", wb, tot ? sz(tot, a) : "-");
  }
  memset(rule, '-', (size_t)rw);
  sb_printf(&s, "%s\n", rule);
  sb_printf(&s, "%-*s %-*s %*s", wl, "Total", ws, "", wn, grouped(p->parameters, g, sizeof g));
  for (int r = 0; r < GS_ROLE_COUNT; r++)
    if (col[r]) sb_printf(&s, " %*s", wb, sz(p->by_role[r], a));
  sb_printf(&s, " %*s\n", wb, sz(p->peak_bytes, a));
  sb_printf(&s, "%s\n", rule);
  sb_printf(&s,
            "Parameters: %s; micro-batch %u x %u accumulation step%s (effective batch %" PRIu64
            "), %s\n",
            grouped(p->parameters, g, sizeof g), p->micro_batch, p->accumulation_steps,
            p->accumulation_steps == 1 ? "" : "s",
            (uint64_t)p->micro_batch * p->accumulation_steps, precision_name(p->precision));
  sb_printf(&s, "Predicted peak: %s (%" PRIu64 " bytes; every tensor is allocated once, at job "
                "start)\n",
            sz(p->peak_bytes, a), p->peak_bytes);
  if (limit) {
    bool grow = gs_plan_fits(p, limit, GS_POLICY_GROWTH);
    bool pre = gs_plan_fits(p, limit, GS_POLICY_PREALLOCATE);
    if (grow)
      sb_printf(&s, "Limit %s: fits (%s to spare)\n", sz(limit, a), sz(limit - p->peak_bytes, bb));
    else if (pre)
      sb_printf(&s,
                "Limit %s: fits a preallocated vdev (%s to spare) but NOT a growth one: its "
                "regions (2 MiB, then doubling) leave no single region for the largest "
                "buffers\n",
                sz(limit, a), sz(limit - p->peak_bytes, bb));
    else
      sb_printf(&s, "Limit %s: does NOT fit by %s\n", sz(limit, a),
                sz(p->peak_bytes - limit, bb));
  }
  return sb_take(&s);
}

char *gs_plan_json(const gs_plan *p, uint64_t limit) {
  sb s = {0};
  sb_printf(&s, "{\"micro_batch\":%u,\"accumulation_steps\":%u,\"effective_batch\":%" PRIu64
                ",\"precision\":\"%s\",\"parameters\":%" PRIu64 ",\"peak_bytes\":%" PRIu64
                ",\"limit_bytes\":%" PRIu64,
            p->micro_batch, p->accumulation_steps,
            (uint64_t)p->micro_batch * p->accumulation_steps, precision_name(p->precision),
            p->parameters, p->peak_bytes, limit);
  if (limit)
    sb_printf(&s, ",\"fits\":%s,\"fits_preallocate\":%s",
              gs_plan_fits(p, limit, GS_POLICY_GROWTH) ? "true" : "false",
              gs_plan_fits(p, limit, GS_POLICY_PREALLOCATE) ? "true" : "false");
  sb_printf(&s, ",\"by_role\":{");
  for (int r = 0; r < GS_ROLE_COUNT; r++)
    sb_printf(&s, "%s\"%s\":%" PRIu64, r ? "," : "", gs_role_name((gs_role)r), p->by_role[r]);
  sb_printf(&s, "},\"rows\":[");
  for (size_t i = 0; i < p->n_rows; i++) {
    const gs_plan_row *row = &p->rows[i];
    sb_printf(&s, "%s{\"layer\":", i ? "," : "");
    sb_json_str(&s, row->layer);
    sb_printf(&s, ",\"kind\":");
    sb_json_str(&s, row->kind);
    sb_printf(&s, ",\"output_shape\":");
    sb_json_str(&s, row->output_shape);
    sb_printf(&s, ",\"parameters\":%" PRIu64 ",\"bytes\":{", row->parameters);
    for (int r = 0; r < GS_ROLE_COUNT; r++)
      sb_printf(&s, "%s\"%s\":%" PRIu64, r ? "," : "", gs_role_name((gs_role)r), row->bytes[r]);
    sb_printf(&s, "}}");
  }
  sb_printf(&s, "]}");
  return sb_take(&s);
}

static Gpushare__V1__PlanRow *row_message(const gs_plan_row *row) {
  Gpushare__V1__PlanRow *r = malloc(sizeof *r);
  if (!r) return NULL;
  gpushare__v1__plan_row__init(r);
  r->layer = strdup(row->layer);
  r->kind = strdup(row->kind);
  r->output_shape = strdup(row->output_shape);
  r->has_parameters = r->has_weights_bytes = r->has_master_bytes = true;
  r->has_gradient_bytes = r->has_optimizer_bytes = r->has_activation_bytes = true;
  r->has_workspace_bytes = r->has_batch_bytes = true;
  r->parameters = row->parameters;
  r->weights_bytes = row->bytes[GS_ROLE_WEIGHTS];
  r->master_bytes = row->bytes[GS_ROLE_MASTER];
  r->gradient_bytes = row->bytes[GS_ROLE_GRADIENTS];
  r->optimizer_bytes = row->bytes[GS_ROLE_OPTIMIZER];
  r->activation_bytes = row->bytes[GS_ROLE_ACTIVATIONS];
  r->workspace_bytes = row->bytes[GS_ROLE_WORKSPACE];
  r->batch_bytes = row->bytes[GS_ROLE_BATCH];
  if (!r->layer || !r->kind || !r->output_shape) {
    gpushare__v1__plan_row__free_unpacked(r, NULL);
    return NULL;
  }
  return r;
}

int gs_plan_message(const gs_plan *p, uint64_t limit, Gpushare__V1__Plan **out) {
  *out = NULL;
  Gpushare__V1__Plan *m = malloc(sizeof *m);
  if (!m) return -ENOMEM;
  gpushare__v1__plan__init(m);
  m->row = calloc(p->n_rows ? p->n_rows : 1, sizeof *m->row);
  if (!m->row) goto fail;
  for (size_t i = 0; i < p->n_rows; i++) {
    if (!(m->row[i] = row_message(&p->rows[i]))) goto fail;
    m->n_row++;
  }
  m->has_peak_bytes = m->has_parameters = m->has_micro_batch = true;
  m->has_accumulation_steps = m->has_precision = m->has_limit_bytes = m->has_fits = true;
  m->peak_bytes = p->peak_bytes;
  m->parameters = p->parameters;
  m->micro_batch = p->micro_batch;
  m->accumulation_steps = p->accumulation_steps;
  m->precision = (Gpushare__V1__Precision)p->precision;
  m->limit_bytes = limit;
  m->fits = gs_plan_fits(p, limit, GS_POLICY_GROWTH);
  if (!(m->summary = gs_plan_format(p, limit))) goto fail;
  *out = m;
  return 0;
fail:
  gpushare__v1__plan__free_unpacked(m, NULL);
  return -ENOMEM;
}

/* ---------------------------------------------------------- suggestions --- */

static void suggestion(gs_plan_suggestion *s, uint32_t micro, uint32_t accum, int precision,
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

int gs_plan_suggest(const Gpushare__V1__JobSpec *spec, const gs_backend *b, uint64_t limit,
                    gs_plan_suggestion *out, size_t max, size_t *n, gs_err *e) {
  return gs_plan_suggest_policy(spec, b, limit, GS_POLICY_GROWTH, out, max, n, e);
}

int gs_plan_suggest_policy(const Gpushare__V1__JobSpec *spec, const gs_backend *b,
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
  if (cur.precision == GPUSHARE__V1__PRECISION__FLOAT32 && *n < max) {
    const int mp = GPUSHARE__V1__PRECISION__MIXED_BFLOAT16;
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
  gs_plan_free(&cur);
  return 0;
}

/* ------------------------------------------------------------ admission --- */

/* Why nothing fits, from the plan at micro-batch 1: the batch-independent
 * roles (weights, masters, gradients, optimizer) against the rest. */
static void explain_no_fit(const Gpushare__V1__JobSpec *spec, const gs_backend *b,
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
  if (p1->precision == GPUSHARE__V1__PRECISION__FLOAT32 &&
      variant_plan(spec, b, 1, p1->accumulation_steps, GPUSHARE__V1__PRECISION__MIXED_BFLOAT16,
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
             p1->precision == GPUSHARE__V1__PRECISION__FLOAT32
                 ? " (mixed precision would not help: its fp32 masters add to the parameters)"
                 : "");
}

int gs_plan_admit(const Gpushare__V1__JobSpec *spec, const gs_backend *b, uint64_t limit,
                  bool auto_fit, gs_admission *out, gs_err *e) {
  return gs_plan_admit_policy(spec, b, limit, GS_POLICY_GROWTH, auto_fit, out, e);
}

int gs_plan_admit_policy(const Gpushare__V1__JobSpec *spec, const gs_backend *b, uint64_t limit,
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
  const int prec = out->plan.precision;
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
  Gpushare__V1__JobSpec v1 = variant(spec, 1, (uint32_t)eff, prec);
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

/* ----------------------------------------------------------- OOM report --- */

static char *dupf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *dupf(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *s = NULL;
  if (vasprintf(&s, fmt, ap) < 0) s = NULL;
  va_end(ap);
  return s;
}

int gs_plan_oom_report(const Gpushare__V1__JobSpec *spec, const gs_backend *b,
                       const gs_train_failure *f, const char *vdev_name,
                       Gpushare__V1__OomReport **out, gs_err *e) {
  *out = NULL;
  if (!f || !f->oom)
    return gs_err_set(e, GS_INVALID_ARGUMENT, "", "the failure is not an out-of-memory one"),
           -EINVAL;
  const gs_alloc_stats *st = &f->why.stats;
  Gpushare__V1__OomReport *r = malloc(sizeof *r);
  if (!r) return gs_err_set(e, GS_INTERNAL, "", "out of host memory"), -ENOMEM;
  gpushare__v1__oom_report__init(r);
  char a[32], bb[32], c[32], d[32], l[32];
  r->layer = strdup(f->layer);
  r->role = strdup(gs_role_name(f->role));
  r->shape = strdup(f->shape);
  r->dtype = strdup(gs_dtype_name(f->dtype));
  r->vdev = strdup(vdev_name ? vdev_name : "");
  r->has_bytes = r->has_limit_bytes = r->has_in_use_bytes = r->has_reserved_bytes = true;
  r->has_largest_free_bytes = r->has_fragmentation = r->has_cause = true;
  r->bytes = f->bytes;
  r->limit_bytes = st->limit;
  r->in_use_bytes = st->in_use;
  r->reserved_bytes = st->reserved;
  r->largest_free_bytes = st->largest_free;
  r->fragmentation = (float)st->fragmentation;
  uint64_t need = gs_alloc_block_size((size_t)f->bytes);
  uint64_t fit_limit = st->limit; /* what a suggestion must fit */
  switch (f->why.cause) {
  case GS_OOM_PHYSICAL:
    r->cause = GPUSHARE__V1__OOM_CAUSE__PHYSICAL;
    r->explanation = dupf(
        "the physical device ran out of memory before this vdev reached its limit: the vdev "
        "holds %s of its %s limit and has reserved %s, but the device refused the region "
        "for %s (%s of %s %s). Other vdevs or processes hold the rest of the device (it may "
        "be oversubscribed); the job's own quota is not what is full.",
        sz(st->in_use, a), sz(st->limit, bb), sz(st->reserved, c), f->tensor, sz(f->bytes, d),
        f->layer, gs_role_name(f->role));
    fit_limit = st->reserved;
    break;
  case GS_OOM_FRAGMENTATION: {
    r->cause = GPUSHARE__V1__OOM_CAUSE__FRAGMENTATION;
    /* What the job as planned needs, to say only what is true of it. */
    gs_plan jp;
    gs_err e2;
    gs_err_clear(&e2);
    bool planned = spec && gs_plan_job(spec, b, &jp, &e2) == 0;
    bool fits_pre = planned && gs_plan_fits(&jp, st->limit, GS_POLICY_PREALLOCATE);
    bool fits_grow = planned && gs_plan_fits(&jp, st->limit, GS_POLICY_GROWTH);
    if (planned) gs_plan_free(&jp);
    const char *tail;
    if (st->reserved < (st->limit & ~(uint64_t)(GS_ALLOC_ALIGN - 1))) {
      /* Part of the limit is unreserved, so this is a GROWTH vdev (a
       * preallocated one reserves all of it at creation): the free bytes
       * are split between its regions and the unreserved rest, and a
       * tensor cannot span two regions. Suggest what fits this layout. */
      if (fits_pre)
        tail = "The job's total is under the limit: a preallocate vdev of this limit (one "
               "region) would run it, and so would a smaller micro-batch (what fits, below) "
               "on this growth vdev.";
      else if (planned)
        tail = "The job as planned needs more than the limit in any layout, so it must "
               "shrink: what fits below fits this growth vdev.";
      else
        tail = "A preallocate vdev reserves the whole limit as one region and has no such "
               "boundaries.";
      r->explanation = dupf(
          "a growth vdev reserves its memory in regions as the job asks for it (2 MiB, then "
          "twice the last, capped by what the limit leaves) and a tensor cannot span two "
          "regions: %s (%s of %s) needs %s in one block, but the largest free block of the "
          "%s reserved is %s and the %s of the %s limit still unreserved cannot hold it "
          "either. %s",
          f->tensor, gs_role_name(f->role), f->layer, sz(need, a), sz(st->reserved, bb),
          sz(st->largest_free, c), sz(st->limit - st->reserved, d), sz(st->limit, l), tail);
      break; /* fit_limit stays the limit: gs_plan_suggest lays each candidate out in
                growth regions, so what it suggests fits this vdev */
    }
    /* The whole limit is reserved: the free bytes lie in holes between live
     * blocks (or, on a growth vdev, between its regions). */
    if (fits_grow)
      tail = " The job as planned fits the limit; on a vdev without holes (nothing else "
             "allocated in it) it would run.";
    else if (fits_pre)
      tail = " The job as planned fits a preallocate vdev of this limit with nothing else "
             "allocated in it, though not a growth vdev's regions.";
    else if (planned)
      tail = " The job as planned needs more than the limit, so it must shrink anyway.";
    else
      tail = "";
    r->explanation = dupf(
        "the vdev has %s free in total but its largest free block is %s, smaller than the "
        "%s that %s (%s of %s) needs: free memory is fragmented (%.0f%%) and this vdev "
        "cannot reserve more.%s",
        sz(st->total_free, a), sz(st->largest_free, bb), sz(need, c), f->tensor,
        gs_role_name(f->role), f->layer, st->fragmentation * 100.0, tail);
    fit_limit = st->largest_free;
    break;
  }
  default:
    r->cause = GPUSHARE__V1__OOM_CAUSE__QUOTA;
    r->explanation = dupf(
        "the job needs more memory than its vdev's limit allows: %s of the %s limit are in "
        "use and %s (%s of %s) needs %s more. The device may have room; the vdev's quota is "
        "full, so the job must shrink (a smaller micro-batch with more accumulation steps "
        "keeps the effective batch) or move to a larger vdev.",
        sz(st->in_use, a), sz(st->limit, bb), f->tensor, gs_role_name(f->role), f->layer,
        sz(need, c));
    break;
  }
  if (!r->layer || !r->role || !r->shape || !r->dtype || !r->vdev || !r->explanation) goto nomem;
  if (spec) {
    gs_plan_suggestion sg[4];
    size_t n = 0;
    gs_err e2;
    gs_err_clear(&e2);
    if (fit_limit && gs_plan_suggest(spec, b, fit_limit, sg, 4, &n, &e2) == 0 && n) {
      r->suggestion = calloc(n, sizeof *r->suggestion);
      if (!r->suggestion) goto nomem;
      for (size_t i = 0; i < n; i++) {
        Gpushare__V1__OomSuggestion *s = malloc(sizeof *s);
        if (!s) goto nomem;
        gpushare__v1__oom_suggestion__init(s);
        r->suggestion[r->n_suggestion++] = s;
        if (!(s->what = strdup(sg[i].what))) goto nomem;
        s->has_micro_batch = s->has_accumulation_steps = s->has_precision = true;
        s->has_predicted_peak_bytes = s->has_saving_bytes = true;
        s->micro_batch = sg[i].micro_batch;
        s->accumulation_steps = sg[i].accumulation_steps;
        s->precision = (Gpushare__V1__Precision)sg[i].precision;
        s->predicted_peak_bytes = sg[i].predicted_peak_bytes;
        s->saving_bytes = sg[i].saving_bytes;
      }
    }
  }
  *out = r;
  return 0;
nomem:
  gpushare__v1__oom_report__free_unpacked(r, NULL);
  return gs_err_set(e, GS_INTERNAL, "", "out of host memory for the OOM report"), -ENOMEM;
}

void gs_plan_oom_report_free(Gpushare__V1__OomReport *r) {
  if (r) gpushare__v1__oom_report__free_unpacked(r, NULL);
}

static const char *cause_name(int c) {
  switch (c) {
  case GPUSHARE__V1__OOM_CAUSE__PHYSICAL: return "PHYSICAL (the device is out of memory)";
  case GPUSHARE__V1__OOM_CAUSE__FRAGMENTATION: return "FRAGMENTATION (no free block is large enough)";
  default: return "QUOTA (the vdev's memory limit is reached)";
  }
}

char *gs_plan_oom_format(const Gpushare__V1__OomReport *r) {
  sb s = {0};
  char a[32], bb[32], c[32], d[32];
  sb_printf(&s, "out of memory: %s\n", cause_name(r->cause));
  sb_printf(&s, "  tensor   layer %s, role %s, shape %s, %s, %s (%" PRIu64 " bytes)\n",
            r->layer ? r->layer : "?", r->role ? r->role : "?", r->shape ? r->shape : "?",
            r->dtype ? r->dtype : "?", sz(r->bytes, a), r->bytes);
  sb_printf(&s, "  vdev     %s%slimit %s, in use %s, reserved %s, largest free block %s, "
                "fragmentation %.0f%%\n",
            r->vdev && r->vdev[0] ? r->vdev : "", r->vdev && r->vdev[0] ? ": " : "",
            sz(r->limit_bytes, a), sz(r->in_use_bytes, bb), sz(r->reserved_bytes, c),
            sz(r->largest_free_bytes, d), (double)r->fragmentation * 100.0);
  sb_printf(&s, "  why      %s\n", r->explanation ? r->explanation : "");
  if (r->n_suggestion == 0)
    sb_printf(&s, "  fits     nothing smaller of this job fits\n");
  for (size_t i = 0; i < r->n_suggestion; i++)
    sb_printf(&s, "  %-8s %s\n", i ? "" : "fits", r->suggestion[i]->what);
  return sb_take(&s);
}

/* ------------------------------------------------------ memory timeline --- */

char *gs_plan_timeline_format(const Gpushare__V1__MemoryTimeline *tl) {
  sb s = {0};
  char a[32], bb[32];
  uint64_t top = tl->peak_bytes;
  if (tl->planned_peak_bytes > top) top = tl->planned_peak_bytes;
  for (size_t i = 0; i < tl->n_step; i++)
    if (tl->step[i]->peak_in_use_bytes > top) top = tl->step[i]->peak_in_use_bytes;
  sb_printf(&s, "memory timeline: peak %s", sz(tl->peak_bytes, a));
  if (tl->has_planned_peak_bytes)
    sb_printf(&s, ", planned %s (%+.2f%%)", sz(tl->planned_peak_bytes, bb),
              tl->planned_peak_bytes
                  ? ((double)tl->peak_bytes - (double)tl->planned_peak_bytes) * 100.0 /
                        (double)tl->planned_peak_bytes
                  : 0.0);
  sb_printf(&s, "\n");
  /* One bar per entry, at most 40 lines: entries beyond merge by max. */
  const size_t lines = tl->n_step < 40 ? tl->n_step : 40;
  const int width = 40;
  for (size_t l = 0; l < lines; l++) {
    size_t i0 = l * tl->n_step / lines, i1 = (l + 1) * tl->n_step / lines;
    uint64_t pk = 0, step = 0;
    for (size_t i = i0; i < i1; i++) {
      if (tl->step[i]->peak_in_use_bytes > pk) pk = tl->step[i]->peak_in_use_bytes;
      step = tl->step[i]->step;
    }
    int fill = top ? (int)((double)pk / (double)top * width + 0.5) : 0;
    char bar[64];
    for (int k = 0; k < width; k++) bar[k] = k < fill ? '#' : ' ';
    bar[width] = '\0';
    sb_printf(&s, "  step %8" PRIu64 " |%s| %s\n", step, bar, sz(pk, a));
  }
  if (tl->n_at_peak) {
    static const char *const roles[] = {"weights", "master", "gradients", "optimizer",
                                        "activations", "workspace", "batch"};
    sb_printf(&s, "at the peak, by layer and role:\n  %-24s", "layer");
    for (int r = 0; r < 7; r++) sb_printf(&s, " %11s", roles[r]);
    sb_printf(&s, " %11s\n", "total");
    for (size_t i = 0; i < tl->n_at_peak; i++) {
      const Gpushare__V1__PlanRow *r = tl->at_peak[i];
      uint64_t v[7] = {r->weights_bytes,    r->master_bytes,    r->gradient_bytes,
                       r->optimizer_bytes,  r->activation_bytes, r->workspace_bytes,
                       r->batch_bytes};
      uint64_t tot = 0;
      sb_printf(&s, "  %-24s", r->layer ? r->layer : "");
      for (int k = 0; k < 7; k++) {
        tot += v[k];
        sb_printf(&s, " %11s", v[k] ? sz(v[k], a) : "-");
      }
      sb_printf(&s, " %11s\n", sz(tot, a));
    }
  }
  return sb_take(&s);
}
