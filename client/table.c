/*
 * table.c: gpuctl's text output: the aligned table every listing prints,
 * and the small formatters the commands share (sizes as "5.00 GiB", local
 * times, enum names, id lists).
 *
 * A table is built cell by cell into memory and printed at the end, so each
 * column is as wide as its widest cell. The formatters write into a ring of
 * static slots, so several can appear in one printf; nothing is freed.
 */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client/client.h" /* the gpushare.v1 enums */
#include "client/gpuctl.h"
#include "client/table.h"
#include "common/size.h"

void table_cell(table *t, const char *fmt, ...) {
  if (t->ncells == t->cap) {
    size_t cap = t->cap ? 2 * t->cap : 64;
    char **nc = realloc(t->cells, cap * sizeof *nc);
    if (!nc) {
      fprintf(stderr, "gpuctl: out of memory\n");
      exit(GPUCTL_EXIT_FAIL);
    }
    t->cells = nc;
    t->cap = cap;
  }
  va_list ap;
  va_start(ap, fmt);
  char *s = NULL;
  if (vasprintf(&s, fmt, ap) < 0) s = NULL;
  va_end(ap);
  if (!s) {
    fprintf(stderr, "gpuctl: out of memory\n");
    exit(GPUCTL_EXIT_FAIL);
  }
  t->cells[t->ncells++] = s;
}

void table_header(table *t, unsigned right, const char *const *names) {
  t->ncols = 0;
  t->right = right;
  for (; names[t->ncols]; t->ncols++) table_cell(t, "%s", names[t->ncols]);
}

void table_free(table *t) {
  for (size_t i = 0; i < t->ncells; i++) free(t->cells[i]);
  free(t->cells);
  t->cells = NULL;
  t->ncells = t->cap = 0;
}

void table_fprint(FILE *f, table *t) {
  size_t w[32] = {0};
  for (size_t i = 0; i < t->ncells; i++) {
    size_t n = strlen(t->cells[i]);
    if (n > w[i % (size_t)t->ncols]) w[i % (size_t)t->ncols] = n;
  }
  for (size_t i = 0; i < t->ncells; i++) {
    int col = (int)(i % (size_t)t->ncols);
    int lastcol = col == t->ncols - 1;
    if (t->right & (1u << col)) fprintf(f, "%*s", (int)w[col], t->cells[i]);
    else if (lastcol) fprintf(f, "%s", t->cells[i]);
    else fprintf(f, "%-*s", (int)w[col], t->cells[i]);
    fputs(lastcol ? "\n" : "  ", f);
  }
  table_free(t);
}

void table_print(table *t) { table_fprint(stdout, t); }

/* Small formatting helpers, each into its own static ring slot so several
 * can appear in one printf. */
static char *slot(void) {
  static char ring[16][64];
  static int next;
  return ring[next++ % 16];
}

const char *table_fsize(uint64_t b) { return gs_size_format(b, slot(), 64); }

const char *table_fnum(const char *fmt, double v) {
  if (isnan(v)) return "-";
  char *s = slot();
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
  snprintf(s, 64, fmt, v);
#pragma GCC diagnostic pop
  return s;
}

const char *table_ftest(double loss, double accuracy) {
  if (isnan(loss) || isnan(accuracy)) return "no test set";
  char *s = slot();
  snprintf(s, 64, "test loss %.4f, test accuracy %.2f%%", loss, 100.0 * accuracy);
  return s;
}

const char *table_fcount_or_unlimited(uint32_t n) {
  if (!n) return "unlimited";
  char *s = slot();
  snprintf(s, 64, "%" PRIu32, n);
  return s;
}

const char *table_ftime(int64_t t) {
  if (t <= 0) return "-";
  char *s = slot();
  time_t tt = (time_t)t;
  struct tm tm;
  if (!localtime_r(&tt, &tm) || !strftime(s, 64, "%Y-%m-%d %H:%M:%S", &tm)) return "-";
  return s;
}

const char *table_fprogress(const Gpushare__V1__Job *j) {
  int running = j->state == GPUSHARE__V1__JOB_STATE__RUNNING;
  if (!j->step && !j->total_steps) return running ? "starting" : "-";
  /* the epoch it is in: the one after the last that ended, unless that one
   * is partial (max_steps stopped it there) or the job is not running */
  uint32_t epoch = 0;
  if (j->n_epoch) {
    const Gpushare__V1__EpochMetrics *m = j->epoch[j->n_epoch - 1];
    epoch = m->epoch + (running && !m->partial ? 1 : 0);
  } else if (running) {
    epoch = 1;
  }
  char *s = slot();
  int k = epoch ? snprintf(s, 64, "epoch %" PRIu32 ", ", epoch) : 0;
  if (k < 0) k = 0;
  if (j->total_steps)
    snprintf(s + k, 64 - (size_t)k, "step %" PRIu64 "/%" PRIu64 " (%.1f%%)", j->step, j->total_steps,
             100.0 * (double)j->step / (double)j->total_steps);
  else
    snprintf(s + k, 64 - (size_t)k, "step %" PRIu64, j->step);
  return s;
}

const char *table_enum_name(const ProtobufCEnumDescriptor *d, int v) {
  const ProtobufCEnumValue *ev = protobuf_c_enum_descriptor_get_value(d, v);
  if (ev) return ev->name;
  char *s = slot();
  snprintf(s, 64, "%d", v);
  return s;
}

const char *table_state_name(int s) { return table_enum_name(&gpushare__v1__job_state__descriptor, s); }
const char *table_precision_name(int s) { return table_enum_name(&gpushare__v1__precision__descriptor, s); }

const char *table_ids_list(const uint32_t *v, size_t n) {
  if (n == 0) return "-";
  char *s = slot();
  size_t off = 0;
  for (size_t i = 0; i < n && off < 60; i++)
    off += (size_t)snprintf(s + off, 64 - off, "%s%" PRIu32, i ? "," : "", v[i]);
  if (off >= 60) strcpy(s + 56, "...");
  return s;
}

const char *table_fscale(int precision, int has, float scale) {
  if (!has || (precision >= 0 && precision != GPUSHARE__V1__PRECISION__MIXED_FLOAT16) ||
      (precision < 0 && scale == 1.0f))
    return "-";
  char *s = slot();
  snprintf(s, 64, "%g", scale);
  return s;
}

int table_job_precision(const Gpushare__V1__Job *j) { return j && j->spec ? (int)j->spec->precision : -1; }

/* The optimizer steps of one whole epoch of job j. exact is set when they
 * are known: total_steps is epochs x steps per epoch unless max_steps cut the
 * run short. Otherwise the bound is an upper one: the whole epochs so far
 * fit in the steps done. 0 when nothing is known. */
static uint64_t epoch_steps(const Gpushare__V1__Job *j, int *exact) {
  uint32_t epochs = j->spec ? j->spec->epochs : 0;
  uint64_t max_steps = j->spec ? j->spec->max_steps : 0;
  *exact = 0;
  if (j->total_steps && epochs && (max_steps == 0 || j->total_steps != max_steps)) {
    *exact = 1;
    return j->total_steps / epochs;
  }
  uint32_t whole = 0;
  for (size_t i = 0; i < j->n_epoch; i++)
    if (!j->epoch[i]->partial && j->epoch[i]->epoch > whole) whole = j->epoch[i]->epoch;
  return whole ? j->step / whole : 0;
}

size_t table_skip_warnings(FILE *f, const Gpushare__V1__Job *j) {
  if (table_job_precision(j) != GPUSHARE__V1__PRECISION__MIXED_FLOAT16) return 0;
  int exact;
  uint64_t per = epoch_steps(j, &exact);
  uint32_t whole = 0;
  size_t n = 0;
  for (size_t i = 0; i < j->n_epoch; i++) {
    const Gpushare__V1__EpochMetrics *m = j->epoch[i];
    uint64_t steps = per;
    if (m->partial) { /* the steps after the last whole epoch */
      if (!exact) continue;
      uint64_t before = (uint64_t)whole * per;
      steps = j->step > before ? j->step - before : 0;
    } else if (m->epoch > whole) {
      whole = m->epoch;
    }
    if (!steps || m->skipped_steps * 2 <= steps) continue;
    fprintf(f, "warning: epoch %" PRIu32 "%s: ", m->epoch, m->partial ? " (part)" : "");
    if (exact)
      fprintf(f, "%" PRIu64 " of its %" PRIu64 " optimizer step%s", m->skipped_steps, steps,
              steps == 1 ? "" : "s");
    else
      fprintf(f, "%" PRIu64 " optimizer step%s, more than half of it,", m->skipped_steps,
              m->skipped_steps == 1 ? "" : "s");
    fprintf(f, " were skipped (fp16 gradients overflowed; loss scale %g at its end), so its "
               "updates were mostly lost; train in MIXED_BFLOAT16 or FLOAT32, or with a lower "
               "learning rate\n",
            m->loss_scale);
    n++;
  }
  return n;
}
