/*
 * runtime/tokens.c: token-stream files (see tokens.h for the layouts).
 *
 * A text file needs no check beyond its length: every byte is a token of
 * the 256. A uint16 file is read as whole pairs of bytes, little-endian
 * whatever the host, and each id is compared with the vocabulary; the
 * first that is not below it is named with its offset, so a file written
 * with the wrong tokenizer is found at once.
 */
#include "runtime/tokens.h"

#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CHUNK ((size_t)64 << 10)

int gs_tokens_vocab(gs_token_format f, uint32_t vocab_size, const char *field, uint32_t *vocab,
                    gs_err *e) {
  if (f == GS_TOKENS_TEXT) {
    *vocab = 256;
    return 0;
  }
  if (vocab_size < 2 || vocab_size > 65536)
    return gs_err_set(e, GS_INVALID_ARGUMENT, field,
                      "vocab_size is %" PRIu32 "; uint16 token ids need a vocabulary of 2 to "
                      "65536",
                      vocab_size);
  *vocab = vocab_size;
  return 0;
}

int gs_tokens_count(gs_token_format f, uint64_t bytes, uint64_t min_tokens, const char *name,
                    const char *field, uint64_t *n_tokens, gs_err *e) {
  *n_tokens = 0;
  if (f == GS_TOKENS_U16 && bytes % 2)
    return gs_err_set(e, GS_INVALID_ARGUMENT, field,
                      "%s has %" PRIu64 " bytes, an odd number; a uint16 token file holds 2 "
                      "bytes per token (is it text, or an llm.c .bin with its header cut "
                      "wrongly?)",
                      name, bytes),
           GS_TOKENS_EODD;
  uint64_t n = bytes / gs_tokens_width(f);
  if (n > GS_TOKENS_MAX)
    return gs_err_set(e, GS_RESOURCE_EXHAUSTED, field,
                      "%s holds %" PRIu64 " tokens, more than the %" PRIu64 " gpushare reads "
                      "from one file",
                      name, n, (uint64_t)GS_TOKENS_MAX),
           GS_DATASET_ETOOBIG;
  if (n < min_tokens)
    return gs_err_set(e, GS_INVALID_ARGUMENT, field,
                      "%s holds %" PRIu64 " token%s; it needs at least %" PRIu64
                      " (one example: sequence_length + 1)",
                      name, n, n == 1 ? "" : "s", min_tokens),
           GS_TOKENS_ESHORT;
  *n_tokens = n;
  return 0;
}

int gs_tokens_scan(gs_token_format f, const uint8_t *p, size_t len, uint64_t first,
                   uint32_t vocab, const char *name, const char *field, gs_err *e) {
  if (f == GS_TOKENS_TEXT) {
    if (vocab >= 256) return 0;
    for (size_t i = 0; i < len; i++)
      if (p[i] >= vocab)
        return gs_err_set(e, GS_INVALID_ARGUMENT, field,
                          "%s has byte %u at offset %" PRIu64 "; the vocabulary is %" PRIu32,
                          name, p[i], first + i, vocab),
               GS_TOKENS_EVOCAB;
    return 0;
  }
  for (size_t i = 0; i + 1 < len; i += 2) {
    uint32_t id = (uint32_t)p[i] | (uint32_t)p[i + 1] << 8;
    if (id >= vocab)
      return gs_err_set(e, GS_INVALID_ARGUMENT, field,
                        "%s has token id %" PRIu32 " at byte offset %" PRIu64 " (token %" PRIu64
                        "); every id must be below vocab_size %" PRIu32,
                        name, id, (first + i / 2) * 2, first + i / 2, vocab),
             GS_TOKENS_EVOCAB;
  }
  return 0;
}

int gs_tokens_check_file(const char *path, gs_token_format f, uint32_t vocab, uint64_t min_tokens,
                         const char *name, const char *field, uint64_t *n_tokens, gs_err *e) {
  int rc = 0;
  uint8_t *buf = NULL;
  *n_tokens = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) {
    rc = -errno;
    gs_err_set(e, rc == -ENOENT ? GS_NOT_FOUND : GS_INTERNAL, field, "cannot read %s: %s", name,
               strerror(errno));
    goto out;
  }
  uint64_t n;
  if ((rc = gs_tokens_count(f, (uint64_t)st.st_size, min_tokens, name, field, &n, e))) goto out;
  if (f == GS_TOKENS_U16 || vocab < 256) {
    buf = malloc(CHUNK);
    if (!buf) {
      rc = -ENOMEM;
      gs_err_set(e, GS_RESOURCE_EXHAUSTED, field, "no memory to read %s", name);
      goto out;
    }
    const uint32_t w = gs_tokens_width(f);
    uint64_t done = 0;
    while (done < n) {
      uint64_t want = (n - done) * w < CHUNK ? (n - done) * w : CHUNK;
      size_t got = 0;
      while (got < want) {
        ssize_t r = read(fd, buf + got, (size_t)want - got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
          rc = -errno;
          gs_err_set(e, GS_INTERNAL, field, "cannot read %s: %s", name, strerror(errno));
          goto out;
        }
        if (r == 0) break;
        got += (size_t)r;
      }
      if (got < want) {
        rc = GS_TOKENS_ESHORT;
        gs_err_set(e, GS_INVALID_ARGUMENT, field,
                   "%s ended after %" PRIu64 " of its %" PRIu64 " tokens while it was read",
                   name, done + got / w, n);
        goto out;
      }
      if ((rc = gs_tokens_scan(f, buf, got, done, vocab, name, field, e))) goto out;
      done += got / w;
    }
  }
  *n_tokens = n;
out:
  free(buf);
  if (fd >= 0) close(fd);
  return rc;
}
