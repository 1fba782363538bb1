/* common/strbuf.c: text built piece by piece (see strbuf.h). */
#include "common/strbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void gs_strbuf_printf(gs_strbuf *s, const char *fmt, ...) {
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

char *gs_strbuf_take(gs_strbuf *s) {
  char *out = s->buf;
  if (s->failed || !out) {
    free(out);
    out = s->failed ? NULL : strdup("");
  }
  s->buf = NULL;
  s->len = s->cap = 0;
  return out;
}
