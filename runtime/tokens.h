/*
 * runtime/tokens.h: the token-stream files a language model trains on.
 *
 * Two layouts, both without a header:
 *  - text (GS_TOKENS_TEXT): raw bytes, each a token, vocabulary 256, so
 *    any file is valid text;
 *  - uint16 (GS_TOKENS_U16): a flat array of little-endian uint16 token
 *    ids, the layout of llm.c's .bin token files after their 1024-byte
 *    header (256 int32: magic, version, count, ...), which gpushare does
 *    not take: strip it with `tail -c +1025`. Every id must be below the
 *    vocabulary the job or the upload names (2..65536).
 *
 * The control plane checks an upload or a job's file with
 * gs_tokens_check_file (64 KiB at a time); the loader (runtime/data.c)
 * checks the bytes in memory with gs_tokens_scan: both refuse the same
 * files with the same words, the first offending id named by its offset.
 */
#ifndef GS_RUNTIME_TOKENS_H
#define GS_RUNTIME_TOKENS_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "runtime/idx.h" /* GS_DATASET_MAX_ELEMS, GS_DATASET_ETOOBIG */

#define GS_TOKENS_EODD (-EXFULL)   /* a uint16 file of an odd number of bytes */
#define GS_TOKENS_EVOCAB (-ENOANO) /* an id at or above the vocabulary */
#define GS_TOKENS_ESHORT (-ENOSTR) /* fewer tokens than one example needs */

/* The most tokens one file may hold (4 Gi). */
#define GS_TOKENS_MAX GS_DATASET_MAX_ELEMS

typedef enum gs_token_format {
  GS_TOKENS_TEXT = 0, /* a byte per token, vocabulary 256 */
  GS_TOKENS_U16 = 1,  /* little-endian uint16 ids */
} gs_token_format;

/* Bytes per token: 1 or 2. */
static inline uint32_t gs_tokens_width(gs_token_format f) { return f == GS_TOKENS_U16 ? 2 : 1; }

/* The vocabulary a file of format f is read with: 256 for text, else
 * vocab_size, which must be 2..65536 (field names it otherwise). */
int gs_tokens_vocab(gs_token_format f, uint32_t vocab_size, const char *field, uint32_t *vocab,
                    gs_err *e);

/* The token count of a file of `bytes` bytes: odd bytes of a uint16 file
 * (GS_TOKENS_EODD), fewer than `min_tokens` (GS_TOKENS_ESHORT) or more than
 * GS_TOKENS_MAX (GS_DATASET_ETOOBIG) are refused. `name` names the input
 * in messages, `field` is the error's field. */
int gs_tokens_count(gs_token_format f, uint64_t bytes, uint64_t min_tokens, const char *name,
                    const char *field, uint64_t *n_tokens, gs_err *e);

/* Every id of p[0..len) (whole tokens; the first is token number `first`)
 * below vocab; else GS_TOKENS_EVOCAB naming the first offending id's byte
 * offset in the file and its value. */
int gs_tokens_scan(gs_token_format f, const uint8_t *p, size_t len, uint64_t first,
                   uint32_t vocab, const char *name, const char *field, gs_err *e);

/* The whole file at `path`: count (at least min_tokens) and ids, 64 KiB at
 * a time. Returns 0 with *n_tokens, a code above, or -ENOENT / -errno. */
int gs_tokens_check_file(const char *path, gs_token_format f, uint32_t vocab, uint64_t min_tokens,
                         const char *name, const char *field, uint64_t *n_tokens, gs_err *e);

#endif
