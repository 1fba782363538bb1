/*
 * fuzz_size: sizes as people write them, through common/size.c
 * (gs_size_parse, which reads --memory, quotas and the configuration file)
 * and back out through gs_size_format (what gpuctl and the logs print).
 *
 * The input is the text (a NUL ends it early, as it would a C string).
 * Checked:
 *  - a refusal is -EINVAL with code INVALID_ARGUMENT and a message;
 *  - an accepted size v prints (gs_size_format) as text that parses again,
 *    to v within the rounding of the two decimals printed (half a
 *    hundredth of the unit, and exactly for sizes under 1 KiB; a hundredth
 *    over 15.995 EiB, printed "15.99 EiB" since 16 EiB is past UINT64_MAX);
 *  - v written as plain bytes ("%llu" and "%llu B") parses to v exactly;
 *  - the suffix is case-insensitive: the text upper-cased parses to v.
 */
#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/size.h"

static int parse(const char *s, uint64_t *v) {
  gs_err e;
  gs_err_clear(&e);
  int rc = gs_size_parse(s, v, &e);
  if (rc != 0 && (rc != -EINVAL || e.code != GS_INVALID_ARGUMENT || !e.msg[0])) abort();
  if (rc == 0 && e.code != GS_OK) abort();
  return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 256) return 0;
  char s[257];
  memcpy(s, data, size);
  s[size] = '\0';
  uint64_t v;
  if (parse(s, &v) != 0) return 0;

  char buf[64], plain[64];
  gs_size_format(v, buf, sizeof buf);
  if (strlen(buf) >= 32) abort(); /* size.h: 32 bytes are enough */
  uint64_t back;
  if (parse(buf, &back) != 0) {
    fprintf(stderr, "size %s = %llu bytes prints as \"%s\", which does not parse\n", s,
            (unsigned long long)v, buf);
    abort();
  }
  /* The unit printed, and the rounding its two decimals allow. */
  uint64_t unit = 1;
  while (unit <= UINT64_MAX / 1024 && v / unit >= 1024) unit *= 1024;
  uint64_t tol = v < 1024 ? 0 : unit / 200 + unit / 1024 + 1; /* 0.005 unit, + float slack */
  if (strcmp(buf, "15.99 EiB") == 0)
    tol = unit / 100; /* over 15.995 EiB, "15.99 EiB": 16.00 would not parse */
  uint64_t diff = back > v ? back - v : v - back;
  if (diff > tol) {
    fprintf(stderr, "size %s = %llu bytes prints as \"%s\" = %llu bytes (off by %llu)\n", s,
            (unsigned long long)v, buf, (unsigned long long)back, (unsigned long long)diff);
    abort();
  }

  snprintf(plain, sizeof plain, "%llu", (unsigned long long)v);
  if (parse(plain, &back) != 0 || back != v) abort();
  snprintf(plain, sizeof plain, "%llu B", (unsigned long long)v);
  if (parse(plain, &back) != 0 || back != v) abort();

  for (size_t i = 0; s[i]; i++) s[i] = (char)toupper((unsigned char)s[i]);
  if (parse(s, &back) != 0 || back != v) abort();
  return 0;
}
