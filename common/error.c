/* error.c: gs_err, the one error value every gpushare module reports with. */
#include "common/error.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int gs_code_errno(int code) {
  switch (code) {
    case GS_OK: return 0;
    case GS_INVALID_ARGUMENT: return -EINVAL;
    case GS_NOT_FOUND: return -ENOENT;
    case GS_ALREADY_EXISTS: return -EEXIST;
    case GS_PERMISSION_DENIED: return -EACCES;
    case GS_RESOURCE_EXHAUSTED: return -ENOSPC;
    case GS_FAILED_PRECONDITION: return -EBUSY;
    case GS_UNAVAILABLE: return -EAGAIN;
    default: return -EIO;
  }
}

int gs_err_rc(const gs_err *e) {
  return !e || e->code == GS_OK ? -EIO : gs_code_errno(e->code);
}

int gs_err_set(gs_err *e, int code, const char *field, const char *fmt, ...) {
  int rc = code == GS_OK ? -EIO : gs_code_errno(code);
  if (!e) return rc;
  e->code = code;
  snprintf(e->field, sizeof e->field, "%s", field ? field : "");
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(e->msg, sizeof e->msg, fmt, ap);
  va_end(ap);
  return rc;
}

void gs_err_prefix(gs_err *e, const char *prefix) {
  if (!e || !prefix || !*prefix) return;
  char joined[2 * sizeof e->field + 2];
  const char *sep = (e->field[0] == '\0' || e->field[0] == '[') ? "" : ".";
  snprintf(joined, sizeof joined, "%s%s%s", prefix, sep, e->field);
  size_t n = strlen(joined);
  if (n >= sizeof e->field) n = sizeof e->field - 1; /* keep the head: it locates */
  memcpy(e->field, joined, n);
  e->field[n] = '\0';
}

void gs_err_clear(gs_err *e) {
  if (!e) return;
  e->code = GS_OK;
  e->field[0] = '\0';
  e->msg[0] = '\0';
}

const char *gs_code_name(int code) {
  static const char *const names[] = {
      "OK",         "INVALID_ARGUMENT",   "NOT_FOUND",
      "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
      "FAILED_PRECONDITION", "UNAVAILABLE", "INTERNAL",
  };
  if (code < 0 || code >= (int)(sizeof names / sizeof names[0])) return "UNKNOWN";
  return names[code];
}
