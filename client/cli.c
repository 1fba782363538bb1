/*
 * cli.c: what gpuctl's commands share to talk to a person and the daemon:
 * the messages (usage errors, local failures, what the daemon refused),
 * the strict parsing of argument values (sizes through gs_size_parse,
 * integers strictly decimal and range-checked), the connection to the
 * daemon and the one-call-one-answer path most commands take (cli_simple).
 */
#include <ctype.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client/cli.h"
#include "client/client.h"
#include "client/gpuctl.h"
#include "client/pbjson.h"
#include "common/size.h"

/* ------------------------------------------------------------ messages --- */

/* --json: errors are JSON objects too (see cli_error). */
static int json_errors;

void cli_set_json_errors(int on) { json_errors = on; }
int cli_json_errors(void) { return json_errors; }

static void error_object(const char *code, const char *field, const char *msg, const char *key,
                         const ProtobufCMessage *detail) {
  pbjson j = {.f = stderr};
  pbjson_open(&j, NULL, '{');
  pbjson_open(&j, "error", '{');
  pbjson_str(&j, "code", code);
  pbjson_str(&j, "message", msg);
  if (field && *field) pbjson_str(&j, "field", field);
  if (key && detail) pbjson_message(&j, key, detail);
  pbjson_close(&j, '}');
  pbjson_close(&j, '}');
  fputc('\n', stderr);
  fflush(stderr);
}

int cli_error(const char *code, const char *field, const char *key, const ProtobufCMessage *detail,
              const char *fmt, ...) {
  char msg[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (json_errors) error_object(code, field, msg, key, detail);
  else fprintf(stderr, "gpuctl: %s\n", msg);
  return GPUCTL_EXIT_FAIL;
}

int cli_usage_error(const gpuctl_cli *x, const char *fmt, ...) {
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (json_errors) {
    error_object("USAGE", x->cmd ? x->cmd->name : "", msg, NULL, NULL);
  } else {
    fprintf(stderr, "gpuctl: %s%s%s", x->cmd ? x->cmd->name : "", x->cmd ? ": " : "", msg);
    fprintf(stderr, "\nTry 'gpuctl %s%s--help'.\n", x->cmd ? x->cmd->name : "", x->cmd ? " " : "");
  }
  return GPUCTL_EXIT_USAGE;
}

/* A local failure (a file that cannot be read, a spec that does not parse). */
int cli_fail(const char *fmt, ...) {
  char msg[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return cli_error("LOCAL", NULL, NULL, NULL, "%s", msg);
}

int cli_report_detail(int rc, const gs_err *e, const char *context, const char *key,
                      const ProtobufCMessage *detail) {
  const char *pre = context ? context : "", *sep = context ? ": " : "";
  if (rc == GS_CLIENT_REFUSED) {
    if (json_errors)
      return cli_error(gs_code_name(e->code), e->field, key, detail, "%s%s%s", pre, sep, e->msg);
    return cli_error("", "", NULL, NULL, "%s%s%s: %s%s%s%s", pre, sep, gs_code_name(e->code), e->msg,
                     e->field[0] ? " (field: " : "", e->field, e->field[0] ? ")" : "");
  }
  /* the connection failed (UNAVAILABLE) or its answer was malformed (INTERNAL) */
  return cli_error(e->code ? gs_code_name(e->code) : "UNAVAILABLE", e->field, NULL, NULL, "%s%s%s", pre,
                   sep, e->msg[0] ? e->msg : strerror(-rc));
}

/* What the daemon refused, or why talking to it failed. */
int cli_report(int rc, const gs_err *e) { return cli_report_detail(rc, e, NULL, NULL, NULL); }

int cli_connect(gpuctl_cli *x) {
  if (x->c) return 0;
  gs_err e = {0};
  const char *path = x->socket ? x->socket : gs_client_default_socket();
  int rc = gs_client_connect(path, &x->c, &e);
  if (rc)
    return cli_error("UNAVAILABLE", NULL, NULL, NULL,
                     "%s (is gpushared running? set --socket or GPUSHARE_SOCKET)", e.msg);
  return 0;
}

/* Connect if needed, make the call; on any failure print it and return 1.
 * On a refusal *resp is still set when the daemon sent detail (with
 * --json, a refusal's Plan goes into the error object as "plan"). */
int cli_call(gpuctl_cli *x, Gpushare__V1__Request *req, Gpushare__V1__Response **resp) {
  *resp = NULL;
  if (cli_connect(x)) return GPUCTL_EXIT_FAIL;
  gs_err e = {0};
  int rc = gs_client_call(x->c, req, resp, &e);
  if (rc)
    return cli_report_detail(rc, &e, NULL, "plan",
                             *resp && (*resp)->plan ? &(*resp)->plan->base : NULL);
  return 0;
}

void cli_print_text(FILE *f, char *text) {
  if (!text) {
    cli_fail("out of memory");
    return;
  }
  fputs(text, f);
  free(text);
}

/* ------------------------------------------------------- value parsing --- */

/* Strict decimal: digits only, within [min, max]. */
int cli_parse_u64(const gpuctl_cli *x, const char *what, const char *s, uint64_t min, uint64_t max,
                  uint64_t *out) {
  uint64_t v = 0;
  const char *p = s;
  if (!*p) return cli_usage_error(x, "%s: the value is empty; expected a whole number from %" PRIu64 " to %" PRIu64, what, min, max);
  for (; *p; p++) {
    if (!isdigit((unsigned char)*p))
      return cli_usage_error(x, "%s: \"%s\" is not a whole number; expected %" PRIu64 " to %" PRIu64, what, s, min, max);
    unsigned d = (unsigned)(*p - '0');
    if (v > (UINT64_MAX - d) / 10) {
      v = UINT64_MAX;
      goto range;
    }
    v = v * 10 + d;
  }
  if (v < min || v > max) {
range:
    return cli_usage_error(x, "%s: %s is out of range; expected %" PRIu64 " to %" PRIu64, what, s, min, max);
  }
  *out = v;
  return 0;
}

int cli_parse_u32(const gpuctl_cli *x, const char *what, const char *s, uint32_t min, uint32_t max,
                  uint32_t *out) {
  uint64_t v;
  int rc = cli_parse_u64(x, what, s, min, max, &v);
  if (!rc) *out = (uint32_t)v;
  return rc;
}

int cli_parse_i32(const gpuctl_cli *x, const char *what, const char *s, int32_t *out) {
  bool neg = s[0] == '-';
  const char *d = s + neg;
  if (!*d || strspn(d, "0123456789") != strlen(d))
    return cli_usage_error(x, "%s: \"%s\" is not a whole number; expected %d to %d", what, s, INT32_MIN,
                           INT32_MAX);
  uint64_t max = neg ? (uint64_t)INT32_MAX + 1 : INT32_MAX, v = 0;
  for (const char *p = d; *p; p++)
    if ((v = v * 10 + (uint64_t)(*p - '0')) > max)
      return cli_usage_error(x, "%s: %s is out of range; expected %d to %d", what, s, INT32_MIN, INT32_MAX);
  *out = neg ? (int32_t)(-(int64_t)v) : (int32_t)v;
  return 0;
}

int cli_parse_size(const gpuctl_cli *x, const char *what, const char *s, uint64_t *out) {
  gs_err e = {0};
  if (gs_size_parse(s, out, &e)) return cli_usage_error(x, "%s: %s", what, e.msg);
  return 0;
}

int cli_parse_date(const gpuctl_cli *x, const char *what, const char *s, int64_t *out) {
  int y, m, d, n = 0;
  if (strlen(s) != 10 || sscanf(s, "%4d-%2d-%2d%n", &y, &m, &d, &n) != 3 || n != 10 ||
      strspn(s, "0123456789-") != 10 || s[4] != '-' || s[7] != '-')
    return cli_usage_error(x, "%s: \"%s\" is not a date; expected YYYY-MM-DD (a UTC day), e.g. 2024-05-31",
                           what, s);
  struct tm tm = {.tm_year = y - 1900, .tm_mon = m - 1, .tm_mday = d};
  time_t t = timegm(&tm);
  /* timegm normalises: 2024-02-30 comes back as another day */
  if (y < 1970 || m < 1 || m > 12 || d < 1 || t == (time_t)-1 || tm.tm_mday != d || tm.tm_mon != m - 1)
    return cli_usage_error(x, "%s: %s is no day of the calendar from 1970-01-01 on; expected YYYY-MM-DD",
                           what, s);
  time_t now = time(NULL);
  if (t > now) {
    char today[16];
    struct tm g;
    gmtime_r(&now, &g);
    strftime(today, sizeof today, "%Y-%m-%d", &g);
    return cli_usage_error(x, "%s: %s is in the future; today is %s (UTC)", what, s, today);
  }
  *out = (int64_t)t;
  return 0;
}

int cli_parse_job_id(const gpuctl_cli *x, const char *s, uint64_t *id) {
  return cli_parse_u64(x, "ID", s, 1, UINT64_MAX, id);
}

/* --------------------------------------------------------------- calls --- */

/* Check the result is the one asked for: a daemon that answers a different
 * call is a bug we want to hear about, not a crash. */
int cli_expect(Gpushare__V1__Response *r, int result_case) {
  if ((int)r->result_case == result_case) return 0;
  return cli_error("INTERNAL", NULL, NULL, NULL,
                   "INTERNAL: gpushared answered with another call's result (case %d, expected %d)",
                   (int)r->result_case, result_case);
}

/* Run one call whose answer is printed as JSON or by `human`. */
int cli_simple(gpuctl_cli *x, Gpushare__V1__Request *req, int result_case,
               void (*human)(gpuctl_cli *x, const Gpushare__V1__Response *r)) {
  Gpushare__V1__Response *r;
  int rc = cli_call(x, req, &r);
  if (!rc) rc = cli_expect(r, result_case);
  if (!rc) {
    if (x->json) {
      /* the result member of the oneof is the message to print */
      const ProtobufCFieldDescriptor *f =
          protobuf_c_message_descriptor_get_field(&gpushare__v1__response__descriptor, (unsigned)result_case);
      pbjson_print(*(ProtobufCMessage *const *)((const char *)r + f->offset));
    } else {
      human(x, r);
    }
  }
  gs_client_free_response(r);
  return rc;
}

