/*
 * present.c: the plan table, the OOM report and the memory chart (present.h).
 *
 * Everything is computed from the message alone: role totals are the sums
 * of the rows, the last plan row is the job-wide one, and whether a plan
 * fits each vdev policy comes from the plan's fits_growth and
 * fits_preallocate (a plan message from before they existed is judged by
 * its fits and its peak against the limit). Text goes through a small
 * growing buffer so a table of any width or length is one allocation.
 */
#include "present/present.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/size.h"
#include "common/strbuf.h"


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

/* The roles, in the order of the runtime's gs_role and the table's columns. */
enum { ROLES = 7 };
static const char *const role_names[ROLES] = {"weights",     "master",    "gradients", "optimizer",
                                              "activations", "workspace", "batch"};

static void row_bytes(const Gpushare__V1__PlanRow *r, uint64_t v[ROLES]) {
  v[0] = r->weights_bytes;
  v[1] = r->master_bytes;
  v[2] = r->gradient_bytes;
  v[3] = r->optimizer_bytes;
  v[4] = r->activation_bytes;
  v[5] = r->workspace_bytes;
  v[6] = r->batch_bytes;
}

static const char *str(const char *s) { return s ? s : ""; }

/* ------------------------------------------------------------- the plan --- */

/* "stem (conv2d)"; a generated name (dense_1) already says its kind. */
static void row_name(const Gpushare__V1__PlanRow *row, bool job, char *buf, size_t len) {
  const char *layer = str(row->layer), *kind = str(row->kind);
  size_t k = strlen(kind);
  if (job)
    snprintf(buf, len, "job");
  else if (!strncmp(layer, kind, k) && layer[k] == '_')
    snprintf(buf, len, "%s", layer);
  else
    snprintf(buf, len, "%s (%s)", layer, kind);
}

char *gs_present_plan(const Gpushare__V1__Plan *p) {
  gs_strbuf s = {0};
  char a[32], bb[32], g[40];
  uint64_t by_role[ROLES] = {0};
  bool col[ROLES] = {0};
  const size_t n = p->n_row;
  for (size_t i = 0; i < n; i++) {
    uint64_t v[ROLES];
    row_bytes(p->row[i], v);
    for (int r = 0; r < ROLES; r++) by_role[r] += v[r];
  }
  for (int r = 0; r < ROLES; r++) col[r] = by_role[r] > 0;
  /* Column widths: the layer column fits its longest name. */
  int wl = 14, ws = 12;
  for (size_t i = 0; i < n; i++) {
    char name[160];
    row_name(p->row[i], i + 1 == n, name, sizeof name);
    int w = (int)strlen(name);
    if (w > wl) wl = w;
    int k = (int)strlen(str(p->row[i]->output_shape));
    if (k > ws) ws = k;
  }
  const int wn = 12, wb = 11;
  int width = wl + 1 + ws + 1 + wn;
  gs_strbuf_printf(&s, "%-*s %-*s %*s", wl, "Layer", ws, "Output shape", wn, "Param #");
  for (int r = 0; r < ROLES; r++)
    if (col[r]) {
      gs_strbuf_printf(&s, " %*s", wb, role_names[r]);
      width += wb + 1;
    }
  gs_strbuf_printf(&s, " %*s\n", wb, "total");
  width += wb + 1;
  char rule[512];
  int rw = width < (int)sizeof rule - 1 ? width : (int)sizeof rule - 1;
  memset(rule, '=', (size_t)rw);
  rule[rw] = '\0';
  gs_strbuf_printf(&s, "%s\n", rule);
  for (size_t i = 0; i < n; i++) {
    const Gpushare__V1__PlanRow *row = p->row[i];
    char name[160];
    row_name(row, i + 1 == n, name, sizeof name);
    uint64_t v[ROLES], tot = 0;
    row_bytes(row, v);
    for (int r = 0; r < ROLES; r++) tot += v[r];
    gs_strbuf_printf(&s, "%-*s %-*s %*s", wl, name, ws, str(row->output_shape), wn,
              i + 1 == n ? "" : grouped(row->parameters, g, sizeof g));
    for (int r = 0; r < ROLES; r++)
      if (col[r]) gs_strbuf_printf(&s, " %*s", wb, v[r] ? sz(v[r], a) : "-");
    gs_strbuf_printf(&s, " %*s\n", wb, tot ? sz(tot, a) : "-");
  }
  memset(rule, '-', (size_t)rw);
  gs_strbuf_printf(&s, "%s\n", rule);
  gs_strbuf_printf(&s, "%-*s %-*s %*s", wl, "Total", ws, "", wn, grouped(p->parameters, g, sizeof g));
  for (int r = 0; r < ROLES; r++)
    if (col[r]) gs_strbuf_printf(&s, " %*s", wb, sz(by_role[r], a));
  gs_strbuf_printf(&s, " %*s\n", wb, sz(p->peak_bytes, a));
  gs_strbuf_printf(&s, "%s\n", rule);
  bool keeps = false;
  for (size_t i = 0; i < n; i++) {
    const Gpushare__V1__PlanRow *row = p->row[i];
    if (!row->keeps || !row->keeps[0]) continue;
    if (!keeps) gs_strbuf_printf(&s, "Kept for the backward pass besides the outputs (in activations):\n");
    keeps = true;
    gs_strbuf_printf(&s, "  %s: %s\n", str(row->layer), row->keeps);
  }
  gs_strbuf_printf(&s,
            "Parameters: %s; micro-batch %u x %u accumulation step%s (effective batch %" PRIu64
            "), %s\n",
            grouped(p->parameters, g, sizeof g), p->micro_batch, p->accumulation_steps,
            p->accumulation_steps == 1 ? "" : "s",
            (uint64_t)p->micro_batch * p->accumulation_steps, precision_name(p->precision));
  gs_strbuf_printf(&s, "Predicted peak: %s (%" PRIu64 " bytes; every tensor is allocated once, at job "
                "start)\n",
            sz(p->peak_bytes, a), p->peak_bytes);
  const uint64_t limit = p->limit_bytes;
  if (limit) {
    bool grow = p->has_fits_growth ? p->fits_growth : p->fits;
    bool pre = p->has_fits_preallocate ? p->fits_preallocate : p->peak_bytes <= limit;
    if (grow)
      gs_strbuf_printf(&s, "Limit %s: fits (%s to spare)\n", sz(limit, a), sz(limit - p->peak_bytes, bb));
    else if (pre)
      gs_strbuf_printf(&s,
                "Limit %s: fits a preallocated vdev (%s to spare) but NOT a growth one: its "
                "regions (2 MiB, then doubling) leave no single region for the largest "
                "buffers\n",
                sz(limit, a), sz(limit - p->peak_bytes, bb));
    else
      gs_strbuf_printf(&s, "Limit %s: does NOT fit by %s\n", sz(limit, a),
                sz(p->peak_bytes > limit ? p->peak_bytes - limit : 0, bb));
  }
  return gs_strbuf_take(&s);
}

/* ------------------------------------------------------- the OOM report --- */

static const char *cause_name(int c) {
  switch (c) {
  case GPUSHARE__V1__OOM_CAUSE__PHYSICAL: return "PHYSICAL (the device is out of memory)";
  case GPUSHARE__V1__OOM_CAUSE__FRAGMENTATION: return "FRAGMENTATION (no free block is large enough)";
  default: return "QUOTA (the vdev's memory limit is reached)";
  }
}

char *gs_present_oom(const Gpushare__V1__OomReport *r) {
  gs_strbuf s = {0};
  char a[32], bb[32], c[32], d[32];
  gs_strbuf_printf(&s, "out of memory: %s\n", cause_name(r->cause));
  gs_strbuf_printf(&s, "  tensor   layer %s, role %s, shape %s, %s, %s (%" PRIu64 " bytes)\n",
            r->layer ? r->layer : "?", r->role ? r->role : "?", r->shape ? r->shape : "?",
            r->dtype ? r->dtype : "?", sz(r->bytes, a), r->bytes);
  gs_strbuf_printf(&s, "  vdev     %s%slimit %s, in use %s, reserved %s, largest free block %s, "
                "fragmentation %.0f%%\n",
            r->vdev && r->vdev[0] ? r->vdev : "", r->vdev && r->vdev[0] ? ": " : "",
            sz(r->limit_bytes, a), sz(r->in_use_bytes, bb), sz(r->reserved_bytes, c),
            sz(r->largest_free_bytes, d), (double)r->fragmentation * 100.0);
  gs_strbuf_printf(&s, "  why      %s\n", r->explanation ? r->explanation : "");
  if (r->n_suggestion == 0)
    gs_strbuf_printf(&s, "  fits     nothing smaller of this job fits\n");
  for (size_t i = 0; i < r->n_suggestion; i++)
    gs_strbuf_printf(&s, "  %-8s %s\n", i ? "" : "fits", str(r->suggestion[i]->what));
  return gs_strbuf_take(&s);
}

/* ------------------------------------------------------ memory timeline --- */

/* A text table: cells row by row, columns padded to their widest cell, two
 * spaces apart, those in the `right` mask right-aligned. */
typedef struct tbl {
  char (*cells)[12][32]; /* cap rows of up to 12 cells */
  size_t rows, cap, cols;
  unsigned right;
} tbl;

static void tbl_row(tbl *t, const char *const *cells) {
  if (t->rows == t->cap) return;
  for (size_t c = 0; c < t->cols; c++)
    snprintf(t->cells[t->rows][c], sizeof t->cells[0][0], "%s", cells[c]);
  t->rows++;
}

static void tbl_emit(gs_strbuf *s, const tbl *t) {
  size_t w[12] = {0};
  for (size_t r = 0; r < t->rows; r++)
    for (size_t c = 0; c < t->cols; c++)
      if (strlen(t->cells[r][c]) > w[c]) w[c] = strlen(t->cells[r][c]);
  for (size_t r = 0; r < t->rows; r++)
    for (size_t c = 0; c < t->cols; c++) {
      bool last = c == t->cols - 1;
      if (t->right & (1u << c)) gs_strbuf_printf(s, "%*s", (int)w[c], t->cells[r][c]);
      else if (last) gs_strbuf_printf(s, "%s", t->cells[r][c]);
      else gs_strbuf_printf(s, "%-*s", (int)w[c], t->cells[r][c]);
      gs_strbuf_printf(s, "%s", last ? "\n" : "  ");
    }
}

#define CHART_ROWS 20  /* rows of the per-step chart; steps are grouped to fit */
#define CHART_WIDTH 50 /* characters of the longest bar */

/* Peak in use by step, grouped into at most CHART_ROWS rows by max, the
 * planned peak marked '|' where no bar covers it. */
static void timeline_chart(gs_strbuf *s, const Gpushare__V1__MemoryTimeline *tl) {
  char a[32];
  size_t n = tl->n_step, rows = n < CHART_ROWS ? n : CHART_ROWS;
  uint64_t top = tl->planned_peak_bytes;
  for (size_t i = 0; i < n; i++)
    if (tl->step[i]->peak_in_use_bytes > top) top = tl->step[i]->peak_in_use_bytes;
  if (!top) top = 1;
  size_t plan_col =
      tl->planned_peak_bytes ? (size_t)((double)tl->planned_peak_bytes / (double)top * CHART_WIDTH) : 0;
  if (plan_col >= CHART_WIDTH) plan_col = CHART_WIDTH - 1;
  gs_strbuf_printf(s, "\npeak in use by step (%s full scale", sz(top, a));
  if (tl->planned_peak_bytes) gs_strbuf_printf(s, "; | is the planned peak %s", sz(tl->planned_peak_bytes, a));
  gs_strbuf_printf(s, "):\n");
  for (size_t r = 0; r < rows; r++) {
    size_t lo = r * n / rows, hi = (r + 1) * n / rows; /* steps [lo, hi) of the list */
    uint64_t peak = 0;
    for (size_t i = lo; i < hi; i++)
      if (tl->step[i]->peak_in_use_bytes > peak) peak = tl->step[i]->peak_in_use_bytes;
    char label[48], bar[CHART_WIDTH + 1];
    if (hi - lo == 1) snprintf(label, sizeof label, "step %" PRIu64, tl->step[lo]->step);
    else
      snprintf(label, sizeof label, "steps %" PRIu64 "-%" PRIu64, tl->step[lo]->step,
               tl->step[hi - 1]->step);
    size_t len = (size_t)((double)peak / (double)top * CHART_WIDTH + 0.5);
    if (len > CHART_WIDTH) len = CHART_WIDTH;
    for (size_t c = 0; c < CHART_WIDTH; c++) bar[c] = c < len ? '#' : ' ';
    if (tl->planned_peak_bytes && bar[plan_col] == ' ') bar[plan_col] = '|';
    bar[CHART_WIDTH] = '\0';
    gs_strbuf_printf(s, "  %-20s %s %s\n", label, bar, sz(peak, a));
  }
}

/* The bytes by layer and role at the peak, with a total row and column. */
static void timeline_at_peak(gs_strbuf *s, const Gpushare__V1__MemoryTimeline *tl) {
  tbl t = {.cap = tl->n_at_peak + 2, .cols = 11, .right = 0x7f8u};
  t.cells = calloc(t.cap, sizeof *t.cells);
  if (!t.cells) {
    s->failed = true;
    return;
  }
  tbl_row(&t, (const char *const[]){"LAYER", "KIND", "OUTPUT", "WEIGHTS", "MASTER", "GRADIENTS",
                                    "OPTIMIZER", "ACTIVATIONS", "WORKSPACE", "BATCH", "TOTAL"});
  uint64_t sum[ROLES + 1] = {0};
  char cell[ROLES + 1][32];
  for (size_t i = 0; i < tl->n_at_peak; i++) {
    const Gpushare__V1__PlanRow *r = tl->at_peak[i];
    uint64_t v[ROLES], tot = 0;
    row_bytes(r, v);
    for (int k = 0; k < ROLES; k++) {
      sz(v[k], cell[k]);
      sum[k] += v[k];
      tot += v[k];
    }
    sum[ROLES] += tot;
    sz(tot, cell[ROLES]);
    tbl_row(&t, (const char *const[]){str(r->layer), r->kind && *r->kind ? r->kind : "-",
                                      r->output_shape && *r->output_shape ? r->output_shape : "-",
                                      cell[0], cell[1], cell[2], cell[3], cell[4], cell[5], cell[6],
                                      cell[7]});
  }
  for (int k = 0; k <= ROLES; k++) sz(sum[k], cell[k]);
  tbl_row(&t, (const char *const[]){"total", "", "", cell[0], cell[1], cell[2], cell[3], cell[4],
                                    cell[5], cell[6], cell[7]});
  gs_strbuf_printf(s, "\nat the peak, by layer and role:\n");
  tbl_emit(s, &t);
  free(t.cells);
}

char *gs_present_timeline(const Gpushare__V1__MemoryTimeline *tl) {
  gs_strbuf s = {0};
  char a[32];
  if (!tl->n_step && !tl->n_at_peak && !tl->peak_bytes) {
    gs_strbuf_printf(&s, "planned peak:  %s\n", sz(tl->planned_peak_bytes, a));
    gs_strbuf_printf(&s, "(the measured timeline is there once the job has ended)\n");
    return gs_strbuf_take(&s);
  }
  gs_strbuf_printf(&s, "measured peak: %s\n", sz(tl->peak_bytes, a));
  if (tl->planned_peak_bytes)
    gs_strbuf_printf(&s, "planned peak:  %s (measured is %.1f%% of planned)\n", sz(tl->planned_peak_bytes, a),
              100.0 * (double)tl->peak_bytes / (double)tl->planned_peak_bytes);
  if (tl->n_step) timeline_chart(&s, tl);
  if (tl->n_at_peak) timeline_at_peak(&s, tl);
  return gs_strbuf_take(&s);
}
