/* common/utf8.c: UTF-8 without NUL (see utf8.h), after RFC 3629's table. */
#include "common/utf8.h"

#include <errno.h>

static int bad(size_t i, const char *what, size_t *at, const char **why) {
  if (at) *at = i;
  if (why) *why = what;
  return -EILSEQ;
}

int gs_utf8_text(const uint8_t *p, size_t n, size_t *at, const char **why) {
  static const char *const not_utf8 = "bytes that are not UTF-8";
  size_t i = 0;
  while (i < n) {
    uint8_t c = p[i];
    if (c == 0) return bad(i, "a NUL byte", at, why);
    if (c < 0x80) {
      i++;
      continue;
    }
    size_t len;
    uint8_t lo = 0x80, hi = 0xbf; /* the range of the second byte */
    if (c >= 0xc2 && c <= 0xdf) len = 2;
    else if (c >= 0xe0 && c <= 0xef) {
      len = 3;
      if (c == 0xe0) lo = 0xa0;      /* no overlong forms */
      else if (c == 0xed) hi = 0x9f; /* no surrogates */
    } else if (c >= 0xf0 && c <= 0xf4) {
      len = 4;
      if (c == 0xf0) lo = 0x90;      /* no overlong forms */
      else if (c == 0xf4) hi = 0x8f; /* nothing past U+10FFFF */
    } else
      return bad(i, not_utf8, at, why);
    if (n - i < len || p[i + 1] < lo || p[i + 1] > hi) return bad(i, not_utf8, at, why);
    for (size_t k = 2; k < len; k++)
      if (p[i + k] < 0x80 || p[i + k] > 0xbf) return bad(i, not_utf8, at, why);
    i += len;
  }
  return 0;
}
