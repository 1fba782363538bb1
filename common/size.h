/*
 * size.h: byte sizes as people write them ("4GiB", "512MiB", "1.5GB") and as
 * gpushare prints them ("5.00 GiB").
 *
 * Suffixes are case-insensitive: KiB MiB GiB TiB PiB EiB and the bare
 * letters K M G T P E are powers of 1024 (what memory limits mean); kB MB GB
 * TB PB EB, a letter then B, are powers of 1000 (what disk vendors mean);
 * "B" or no suffix is bytes. One space may separate number and suffix. A
 * decimal fraction is allowed with a multiplier suffix and rounds down to
 * whole bytes ("1.5GB" is 1500000000).
 */
#ifndef GS_SIZE_H
#define GS_SIZE_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"

/* Parse s into *out. Refuses empty text, a sign ("-1", "+1"), an unknown
 * suffix ("4XB"), a value past UINT64_MAX, trailing garbage, NaN/inf, a
 * fraction of a byte count without suffix ("1.5"). On refusal returns
 * -EINVAL and fills e with GS_INVALID_ARGUMENT,
 * e->field left "" (callers prefix it), a message naming the text and what
 * is allowed. */
int gs_size_parse(const char *s, uint64_t *out, gs_err *e);

/* 5368709120 -> "5.00 GiB", 512 -> "512 B", 1536 -> "1.50 KiB";
 * buf of at least 32 bytes. Returns buf. */
const char *gs_size_format(uint64_t bytes, char *buf, size_t len);

#endif
