/*
 * common/strbuf.h: text built piece by piece into one malloc'd string.
 *
 * The plan's JSON and the text present/ writes are built with printf-style
 * appends. A failed allocation is remembered rather than reported at every
 * append: the builder stops growing, and gs_strbuf_take says so once, by
 * returning NULL.
 */
#ifndef GS_COMMON_STRBUF_H
#define GS_COMMON_STRBUF_H

#include <stdbool.h>
#include <stddef.h>

typedef struct gs_strbuf {
  char *buf;       /* the text so far, NUL-terminated once anything is in it */
  size_t len, cap; /* its length; the bytes allocated */
  bool failed;     /* an allocation or a format failed: take returns NULL */
} gs_strbuf;

/* Append printf-style. Start from a zeroed gs_strbuf. */
void gs_strbuf_printf(gs_strbuf *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The text (malloc'd, "" when nothing was appended; the caller frees it),
 * or NULL when an append failed. The builder is spent. */
char *gs_strbuf_take(gs_strbuf *s);

#endif
