/*
 * size.c: parsing and printing byte sizes for gpushare's users.
 *
 * Memory limits and quotas are written by people ("--memory 4GiB"), so the
 * parser is strict about what it accepts and says exactly what it refused.
 * It works in integers only: the whole part and up to 19 fraction digits are
 * read as decimal integers and scaled with overflow checks, so "16EiB" is
 * refused instead of wrapping and "1.5GB" is exactly 1500000000 bytes, with
 * no float rounding. NaN, inf and hex floats never reach strtod because
 * strtod is never called.
 */
#include "common/size.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#define ALLOWED "a whole number of bytes, or a number with a suffix: KiB MiB GiB TiB PiB EiB " \
                "or K M G T P E (powers of 1024), kB MB GB TB PB EB (powers of 1000), B"

/* The multiplier a suffix names; 0 when unknown. */
static uint64_t suffix_multiplier(const char *s) {
  static const char letters[] = "kmgtpe";
  size_t n = strlen(s);
  if (n == 0) return 1;
  if (n == 1 && (s[0] == 'b' || s[0] == 'B')) return 1;
  const char *l = strchr(letters, tolower((unsigned char)s[0]));
  if (!l || s[0] == '\0') return 0;
  int power = (int)(l - letters) + 1;
  uint64_t base;
  if (n == 1) base = 1024;
  else if (n == 2 && tolower((unsigned char)s[1]) == 'b') base = 1000;
  else if (n == 3 && tolower((unsigned char)s[1]) == 'i' && tolower((unsigned char)s[2]) == 'b')
    base = 1024;
  else return 0;
  uint64_t m = 1;
  for (int i = 0; i < power; i++) m *= base;
  return m;
}

int gs_size_parse(const char *s, uint64_t *out, gs_err *e) {
  if (!s || !*s) {
    gs_err_set(e, GS_INVALID_ARGUMENT, "", "size is empty; expected " ALLOWED);
    return -EINVAL;
  }
  const char *p = s;
  if (*p == '-' || *p == '+') {
    gs_err_set(e, GS_INVALID_ARGUMENT, "", "size \"%s\" has a sign; expected " ALLOWED, s);
    return -EINVAL;
  }
  if (!isdigit((unsigned char)*p)) {
    gs_err_set(e, GS_INVALID_ARGUMENT, "", "size \"%s\" does not start with a digit; expected " ALLOWED, s);
    return -EINVAL;
  }
  /* Whole part, with overflow check. */
  uint64_t whole = 0;
  int whole_overflow = 0;
  for (; isdigit((unsigned char)*p); p++) {
    unsigned d = (unsigned)(*p - '0');
    if (whole > (UINT64_MAX - d) / 10) whole_overflow = 1;
    else whole = whole * 10 + d;
  }
  /* Fraction: up to 19 digits kept exactly (frac / 10^fdigits); more are
   * below a byte for any suffix up to EiB and are dropped. */
  uint64_t frac = 0, fscale = 1;
  int has_frac = 0;
  if (*p == '.') {
    p++;
    if (!isdigit((unsigned char)*p)) {
      gs_err_set(e, GS_INVALID_ARGUMENT, "", "size \"%s\" has no digit after the decimal point; expected " ALLOWED, s);
      return -EINVAL;
    }
    has_frac = 1;
    for (int nd = 0; isdigit((unsigned char)*p); p++, nd++) {
      if (nd < 19) {
        frac = frac * 10 + (uint64_t)(*p - '0');
        fscale *= 10;
      }
    }
  }
  if (*p == ' ') p++;
  uint64_t mult = suffix_multiplier(p);
  if (mult == 0 || (*p == ' ')) {
    gs_err_set(e, GS_INVALID_ARGUMENT, "", "size \"%s\" has an unknown suffix \"%s\"; expected " ALLOWED, s, p);
    return -EINVAL;
  }
  if (p > s && p[-1] == ' ' && *p == '\0') {
    gs_err_set(e, GS_INVALID_ARGUMENT, "", "size \"%s\" ends with a space; expected " ALLOWED, s);
    return -EINVAL;
  }
  if (has_frac && mult == 1) {
    gs_err_set(e, GS_INVALID_ARGUMENT, "", "size \"%s\" is a fraction of a byte count; write whole bytes or use a suffix, e.g. \"1.5GiB\"", s);
    return -EINVAL;
  }
  if (whole_overflow || (mult > 1 && whole > UINT64_MAX / mult)) {
    gs_err_set(e, GS_INVALID_ARGUMENT, "", "size \"%s\" is larger than the largest size, %llu bytes (16 EiB - 1)", s,
               (unsigned long long)UINT64_MAX);
    return -EINVAL;
  }
  uint64_t v = whole * mult;
  if (has_frac) {
    /* frac * mult / fscale without overflowing: split mult = q*fscale + r. */
    uint64_t q = mult / fscale, r = mult % fscale;
    unsigned __int128 part = (unsigned __int128)frac * q + ((unsigned __int128)frac * r) / fscale;
    if (part > UINT64_MAX - v) {
      gs_err_set(e, GS_INVALID_ARGUMENT, "", "size \"%s\" is larger than the largest size, %llu bytes (16 EiB - 1)", s,
                 (unsigned long long)UINT64_MAX);
      return -EINVAL;
    }
    v += (uint64_t)part;
  }
  *out = v;
  return 0;
}

const char *gs_size_format(uint64_t bytes, char *buf, size_t len) {
  static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) {
    snprintf(buf, len, "%llu B", (unsigned long long)bytes);
    return buf;
  }
  int u = 0;
  uint64_t div = 1;
  while (u < 6 && bytes / div >= 1024) {
    div *= 1024;
    u++;
  }
  double v = (double)bytes / (double)div;
  /* 1023.999 KiB would print as "1024.00 KiB"; say "1.00 MiB" instead. */
  if (v >= 1023.995 && u < 6) {
    v /= 1024.0;
    u++;
  }
  /* Past 15.995 EiB, "%.2f" rounds to "16.00 EiB", more than UINT64_MAX,
   * which gs_size_parse refuses: print the hundredth below instead, so what
   * gpushare prints can always be typed back. */
  if (u == 6 && v >= 15.995) v = 15.99;
  snprintf(buf, len, "%.2f %s", v, units[u]);
  return buf;
}
