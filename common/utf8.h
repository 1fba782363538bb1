/*
 * common/utf8.h: is a byte string text?
 *
 * Names and every other string a peer sends travel as protobuf strings,
 * which must be UTF-8. C reads them up to their first NUL, so a string
 * with a NUL inside would be silently cut ("a\0b" read as "a"), and one
 * that is not UTF-8 would be stored and later printed as invalid JSON.
 * gs_utf8_text tells both apart before anything keeps the string.
 */
#ifndef GS_COMMON_UTF8_H
#define GS_COMMON_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* 0 when p[0..n) is well-formed UTF-8 (no overlong forms, no surrogates,
 * nothing past U+10FFFF) without a NUL byte; otherwise -EILSEQ, with *at
 * (may be NULL) the offset of the first byte that is not, and *why (may
 * be NULL) "a NUL byte" or "bytes that are not UTF-8". */
int gs_utf8_text(const uint8_t *p, size_t n, size_t *at, const char **why);

#endif
