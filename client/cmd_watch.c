/*
 * cmd_watch.c: following a job as it runs: gpuctl watch, and submit --watch.
 *
 * The daemon streams the job's events (a Watch call: one Response per event
 * until one is final). On a terminal the progress is one live line,
 * rewritten in place; otherwise a line per epoch and at most one progress
 * line every few seconds. After the final event the job is asked for once
 * more, to say how it ended. This file also owns the one-line description
 * of an event that logs prints (gpuctl_event_line).
 */
#include <inttypes.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "client/cli.h"
#include "client/client.h"
#include "client/cmd_watch.h"
#include "client/gpuctl.h"
#include "client/pbjson.h"
#include "client/table.h"
#include "present/present.h"

/* ---------------------------------------------------------------- events --- */

/* One line describing an event: "job 7 RUNNING epoch 1 step 340/1875 ...". */
void gpuctl_event_line(const Gpushare__V1__JobEvent *ev, int precision, char *buf, size_t n) {
  size_t off = 0;
#define ADD(...) \
  do { \
    if (off < n) off += (size_t)snprintf(buf + off, n - off, __VA_ARGS__); \
  } while (0)
  ADD("job %" PRIu64 " %s", ev->job_id, table_state_name(ev->state));
  if (ev->has_epoch) ADD("  epoch %" PRIu32, ev->epoch);
  if (ev->has_step) {
    if (ev->total_steps) ADD("  step %" PRIu64 "/%" PRIu64 " (%.1f%%)", ev->step, ev->total_steps,
                             100.0 * (double)ev->step / (double)ev->total_steps);
    else ADD("  step %" PRIu64, ev->step);
  }
  if (ev->has_loss) ADD("  loss %.4f", ev->loss);
  if (ev->has_accuracy) ADD("  acc %.2f%%", 100.0 * ev->accuracy);
  if (ev->has_samples_per_second) ADD("  %.0f samples/s", ev->samples_per_second);
  if (ev->has_memory_in_use) {
    ADD("  mem %s", table_fsize(ev->memory_in_use));
    if (ev->memory_limit) ADD(" / %s", table_fsize(ev->memory_limit));
  }
  const char *scale = table_fscale(precision, ev->has_loss_scale, ev->loss_scale);
  if (strcmp(scale, "-")) ADD("  scale %s", scale);
  const Gpushare__V1__EpochMetrics *m = ev->epoch_end;
  if (m) {
    ADD("  epoch %" PRIu32 " done: train loss %.4f, %s, peak %s", m->epoch, m->train_loss,
        table_ftest(m->test_loss, m->test_accuracy), table_fsize(m->peak_memory_bytes));
    if (strcmp(table_fscale(precision, m->has_loss_scale, m->loss_scale), "-"))
      ADD(", %" PRIu64 " step%s skipped", m->skipped_steps, m->skipped_steps == 1 ? "" : "s");
  }
  if (ev->message && *ev->message) ADD("  %s", ev->message);
#undef ADD
}

/* ----------------------------------------------------------------- watch --- */

/* What gpuctl watch shows, and how (see watch_job). */
typedef struct watch_view {
  int tty;             /* stdout is a terminal: one live line */
  int cols;            /* its width (gpuctl_term_width; the live line is cut to fit) */
  int live;            /* a live line is on screen, without its newline */
  double last_plain;   /* monotonic time of the last plain progress line */
  int have_acc;        /* an epoch has ended: acc is its test accuracy */
  float acc;
  int last_state;      /* -1 before the first event */
  int precision;       /* the job's Precision, -1 when not known */
} watch_view;

#define WATCH_PLAIN_INTERVAL 5.0 /* seconds between two progress lines off a terminal */

static double mono_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* "job 7  epoch 2  step 340/1875 (18.1%)  loss 0.4123  acc 86.20%
 *  12345 samples/s  mem 1.20 MiB / 64.0 MiB  scale 32768" */
static void progress_line(const watch_view *v, const Gpushare__V1__JobEvent *ev, char *buf, size_t n) {
  size_t off = 0;
#define ADD(...) \
  do { \
    if (off < n) off += (size_t)snprintf(buf + off, n - off, __VA_ARGS__); \
  } while (0)
  ADD("job %" PRIu64, ev->job_id);
  if (ev->has_epoch) ADD("  epoch %" PRIu32, ev->epoch);
  if (ev->total_steps)
    ADD("  step %" PRIu64 "/%" PRIu64 " (%.1f%%)", ev->step, ev->total_steps,
        100.0 * (double)ev->step / (double)ev->total_steps);
  else if (ev->has_step)
    ADD("  step %" PRIu64, ev->step);
  if (ev->has_loss) ADD("  loss %.4f", ev->loss);
  if (v->have_acc) ADD("  acc %.2f%%", 100.0 * v->acc);
  if (ev->has_samples_per_second && ev->samples_per_second > 0) ADD("  %.0f samples/s", ev->samples_per_second);
  if (ev->has_memory_in_use) {
    ADD("  mem %s", table_fsize(ev->memory_in_use));
    if (ev->memory_limit) ADD(" / %s", table_fsize(ev->memory_limit));
  }
  /* fp16's dynamic loss scale; fp32 and bf16 have none */
  const char *scale = table_fscale(v->precision, ev->has_loss_scale, ev->loss_scale);
  if (strcmp(scale, "-")) ADD("  scale %s", scale);
#undef ADD
}

static void epoch_line(const watch_view *v, uint64_t id, const Gpushare__V1__EpochMetrics *m, char *buf,
                       size_t n) {
  int k = snprintf(buf, n,
                   "job %" PRIu64 "  epoch %" PRIu32 " done: train loss %.4f, %s, %.0f samples/s, peak %s",
                   id, m->epoch, m->train_loss, table_ftest(m->test_loss, m->test_accuracy),
                   m->samples_per_second, table_fsize(m->peak_memory_bytes));
  const char *scale = table_fscale(v->precision, m->has_loss_scale, m->loss_scale);
  if (k > 0 && (size_t)k < n && strcmp(scale, "-"))
    snprintf(buf + k, n - (size_t)k, ", loss scale %s, %" PRIu64 " of its steps skipped", scale,
             m->skipped_steps);
}

/* A line that stays: it replaces the live line on a terminal. */
static void watch_put(watch_view *v, const char *line) {
  if (v->tty && v->live) fputs("\r\033[K", stdout);
  printf("%s\n", line);
  v->live = 0;
  fflush(stdout);
}

int gpuctl_term_width(int fd) {
  struct winsize ws;
  if (isatty(fd) && ioctl(fd, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  const char *c = getenv("COLUMNS");
  if (c && *c && strspn(c, "0123456789") == strlen(c) && strlen(c) <= 5) {
    int n = atoi(c);
    if (n > 0) return n;
  }
  return 80;
}

/* A progress line: live on a terminal, else at most every few seconds.
 * The width is read at each line, so a resized terminal is followed. */
static void watch_progress(watch_view *v, const char *line) {
  if (v->tty) {
    v->cols = gpuctl_term_width(STDOUT_FILENO);
    int w = v->cols > 1 ? v->cols - 1 : 1;
    printf("\r%.*s\033[K", w, line);
    v->live = 1;
  } else {
    double now = mono_now();
    if (v->last_plain > 0 && now - v->last_plain < WATCH_PLAIN_INTERVAL) return;
    v->last_plain = now;
    printf("%s\n", line);
  }
  fflush(stdout);
}

/* A state event's message without the "STATE: " the daemon puts first. */
static const char *event_reason(const Gpushare__V1__JobEvent *ev) {
  const char *m = ev->message;
  if (!m || !*m) return NULL;
  const char *st = table_state_name(ev->state);
  size_t n = strlen(st);
  if (!strncmp(m, st, n)) {
    if (!m[n]) return NULL;
    if (m[n] == ':' && m[n + 1] == ' ') return m + n + 2;
  }
  return m;
}

static void watch_event(watch_view *v, const Gpushare__V1__JobEvent *ev) {
  char line[1024];
  if (ev->epoch_end) {
    v->have_acc = !isnan(ev->epoch_end->test_accuracy); /* NaN: no test set */
    v->acc = ev->epoch_end->test_accuracy;
    epoch_line(v, ev->job_id, ev->epoch_end, line, sizeof line);
    watch_put(v, line);
  } else if (v->last_state < 0 || (int)ev->state != v->last_state) {
    /* the first event (the job as it stands) and every change of state */
    if (v->last_state < 0 && ev->has_accuracy && ev->has_epoch) {
      v->have_acc = 1;
      v->acc = ev->accuracy;
    }
    const char *why = event_reason(ev);
    int k = snprintf(line, sizeof line, "job %" PRIu64 " %s", ev->job_id, table_state_name(ev->state));
    if (k > 0 && (size_t)k < sizeof line && ev->step)
      k += snprintf(line + k, sizeof line - (size_t)k, " at step %" PRIu64 "/%" PRIu64, ev->step, ev->total_steps);
    if (k > 0 && (size_t)k < sizeof line && why) snprintf(line + k, sizeof line - (size_t)k, ": %s", why);
    watch_put(v, line);
  } else {
    progress_line(v, ev, line, sizeof line);
    watch_progress(v, line);
  }
  if (ev->has_state) v->last_state = (int)ev->state;
}

/* The job as the daemon has it (after its end, for watch); NULL when it
 * cannot be asked (the final event then says how it ended). Freed with
 * gs_client_free_response. */
static Gpushare__V1__Response *job_record(gpuctl_cli *x, uint64_t id) {
  GPUCTL_REQ(req, job_status, JOB_STATUS, Gpushare__V1__JobStatusRequest, GPUSHARE__V1__JOB_STATUS_REQUEST__INIT);
  job_status_msg.has_id = 1;
  job_status_msg.id = id;
  Gpushare__V1__Response *r = NULL;
  gs_err e = {0};
  if (gs_client_call(x->c, &req, &r, &e) || r->result_case != GPUSHARE__V1__RESPONSE__RESULT_JOB_STATUS ||
      !r->job_status->job) {
    gs_client_free_response(r);
    return NULL;
  }
  return r;
}

int gpuctl_job_precision(gpuctl_cli *x, uint64_t id) {
  Gpushare__V1__Response *r = job_record(x, id);
  int p = r ? table_job_precision(r->job_status->job) : -1;
  gs_client_free_response(r);
  return p;
}

/* Follow job id to its end. Exit 0 only when it SUCCEEDED. After the final
 * event the job is asked for once more: its record has the reason, the
 * epochs and, when it ran out of memory, the OomReport. */
int gpuctl_watch_job(gpuctl_cli *x, uint64_t id) {
  if (cli_connect(x)) return GPUCTL_EXIT_FAIL;
  /* asked before the stream starts: whether the job has a loss scale */
  int precision = x->json ? -1 : gpuctl_job_precision(x, id);
  GPUCTL_REQ(req, watch, WATCH, Gpushare__V1__WatchRequest, GPUSHARE__V1__WATCH_REQUEST__INIT);
  watch_msg.has_id = 1;
  watch_msg.id = id;
  gs_err e = {0};
  uint64_t rid;
  int rc = gs_client_send(x->c, &req, &rid, &e);
  if (rc) return cli_report(rc, &e);
  watch_view v = {.tty = isatty(STDOUT_FILENO), .last_state = -1, .precision = precision};
  int final_state = -1;
  char final_msg[512] = "";
  for (;;) {
    Gpushare__V1__Response *r;
    rc = gs_client_recv(x->c, rid, &r, &e);
    if (rc) {
      if (v.live) fputc('\n', stdout);
      gs_client_free_response(r);
      if (rc == GS_CLIENT_REFUSED) return cli_report(rc, &e); /* the daemon said why: no such job, not yours */
      if (!x->json) cli_report(rc, &e);
      return cli_error("UNAVAILABLE", NULL, NULL, NULL,
                       "lost the daemon while watching job %" PRIu64 " (%s); gpuctl watch %" PRIu64
                       " follows it again",
                       id, e.msg[0] ? e.msg : strerror(-rc), id);
    }
    if (r->result_case != GPUSHARE__V1__RESPONSE__RESULT_WATCH) {
      gs_client_free_response(r);
      if (v.live) fputc('\n', stdout);
      return cli_error("INTERNAL", NULL, NULL, NULL, "INTERNAL: gpushared answered a watch with another call's result");
    }
    const Gpushare__V1__WatchResponse *w = r->watch;
    const Gpushare__V1__JobEvent *ev = w->event;
    int final = w->has_final && w->final;
    if (x->json) pbjson_print(&w->base);
    else if (ev && !final) watch_event(&v, ev);
    if (final && ev) {
      final_state = ev->has_state ? (int)ev->state : -1;
      const char *why = event_reason(ev);
      if (why) snprintf(final_msg, sizeof final_msg, "%s", why);
    }
    gs_client_free_response(r);
    if (final) break;
  }
  if (v.live) fputc('\n', stdout);
  fflush(stdout);

  Gpushare__V1__Response *sr = job_record(x, id);
  const Gpushare__V1__Job *j = sr ? sr->job_status->job : NULL;
  int st = j && j->has_state ? (int)j->state : final_state;
  const char *why = j && j->reason && *j->reason ? j->reason : final_msg[0] ? final_msg : NULL;
  if (!x->json) {
    /* the last line: how it ended, with the test accuracy of its last epoch */
    printf("job %" PRIu64 " %s", id, st >= 0 ? table_state_name(st) : "ended");
    if (j && j->step) printf(" at step %" PRIu64 "/%" PRIu64, j->step, j->total_steps);
    if (j && j->n_epoch) {
      const Gpushare__V1__EpochMetrics *m = j->epoch[j->n_epoch - 1];
      /* a partial last epoch: max_steps stopped the job inside it */
      size_t whole = j->n_epoch - (m->partial ? 1 : 0);
      if (m->partial) printf(" inside epoch %" PRIu32, m->epoch);
      else printf(" after %zu epoch%s", whole, whole == 1 ? "" : "s");
      if (isnan(m->test_accuracy))
        printf(": train loss %.4f (no test set)", m->train_loss);
      else
        printf(": test accuracy %.2f%%, test loss %.4f", 100.0 * m->test_accuracy, m->test_loss);
    } else if (v.have_acc) {
      printf(": test accuracy %.2f%%", 100.0 * v.acc);
    }
    if (j && j->started_unix && j->finished_unix >= j->started_unix)
      printf(" (%" PRId64 " s)", j->finished_unix - j->started_unix);
    printf("\n");
    if (j) table_skip_warnings(stdout, j);
    fflush(stdout);
  }
  int out = GPUCTL_EXIT_OK;
  if (st != GPUSHARE__V1__JOB_STATE__SUCCEEDED) {
    out = GPUCTL_EXIT_FAIL;
    char code[64];
    snprintf(code, sizeof code, "JOB_%s", st >= 0 ? table_state_name(st) : "UNKNOWN");
    if (st < 0)
      cli_error(code, NULL, "job", j ? &j->base : NULL, "gpushared did not say how job %" PRIu64 " ended", id);
    else
      cli_error(code, NULL, "job", j ? &j->base : NULL, "job %" PRIu64 " %s%s%s", id, table_state_name(st),
                why ? ": " : "", why ? why : "");
    if (j && j->oom && !x->json) {
      fputc('\n', stderr);
      cli_print_text(stderr, gs_present_oom(j->oom));
    }
  }
  gs_client_free_response(sr);
  return out;
}

int gpuctl_cmd_watch(gpuctl_cli *x, gpuctl_parsed *p) {
  uint64_t id;
  if (cli_parse_job_id(x, p->pos[0], &id)) return GPUCTL_EXIT_USAGE;
  return gpuctl_watch_job(x, id);
}
