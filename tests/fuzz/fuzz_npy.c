/*
 * fuzz_npy: .npy pairs and token streams through runtime/data.c and the
 * file checks the control plane runs on an upload (runtime/npy.c,
 * runtime/tokens.c).
 *
 * Input: byte 0 is the mode, bytes 1-2 (little-endian) the split point
 * (modulo the rest's length + 1) or, for a token stream, the vocabulary
 * and the sequence length, the rest the file(s). Mode bits 0-1:
 *   0: an .npy images part then an .npy labels part
 *   1: a text stream, sequence length 1 + byte 1 % 64
 *   2: a uint16 token stream, vocabulary byte 1 * 256 + byte 2 (refused
 *      below 2), sequence length 1 + byte 2 % 64
 * Checked: a refusal fills e with a field and a message and leaves the set
 * zeroed, and the check of the same bytes as a file (64 KiB at a time)
 * agrees with the loader (same code, same message, for the damaged part);
 * an acceptance gives a set that can be gathered and sliced within its
 * buffers.
 */
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/data.h"
#include "runtime/npy.h"
#include "runtime/tokens.h"
#include "tests/fuzz/fuzz_tmp.h"

static char tmpdir[PATH_MAX];

static void cleanup(void) {
  static const char *const files[] = {"part"};
  fuzz_tmpdir_remove(tmpdir, files, 1);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  fuzz_tmpdir_make(tmpdir, sizeof tmpdir, "npy");
  atexit(cleanup);
  return 0;
}

static const char *write_part(const uint8_t *p, size_t n) {
  static char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/part", tmpdir);
  FILE *f = fopen(path, "wb");
  if (!f || (n && fwrite(p, 1, n, f) != n) || fclose(f) != 0) abort();
  return path;
}

static void check_images(const gs_dataset *d) {
  if (d->kind != GS_DATA_IMAGES || d->n == 0 || d->h == 0 || d->w == 0 || d->c == 0 ||
      d->classes < 2 || !d->labels || !d->images == !d->images_f32)
    abort();
  uint64_t img = gs_dataset_image_bytes(d);
  for (uint64_t i = 0; i < d->n; i++)
    if (d->labels[i] < 0 || (uint32_t)d->labels[i] >= d->classes) abort();
  if (img <= 1u << 16) {
    uint64_t idx[2] = {0, d->n - 1};
    float *out = malloc(sizeof(float) * 2 * img);
    int32_t lab[2];
    if (!out) abort();
    gs_dataset_gather_f32(d, idx, 2, out, lab);
    for (uint64_t i = 0; i < 2 * img; i++)
      if (!isfinite(out[i])) abort();
    free(out);
  }
  gs_dataset s;
  gs_err e;
  gs_err_clear(&e);
  if (gs_dataset_slice(d, d->n - 1, 1, &s, &e) != 0) abort();
  gs_dataset_free(&s);
}

static void check_tokens(const gs_dataset *d, size_t n_tokens) {
  if (d->kind != GS_DATA_TOKENS || d->n == 0 || d->seq_len == 0 || !d->tokens ||
      d->n * d->seq_len + 1 > n_tokens)
    abort();
  uint64_t t = d->seq_len, idx[2] = {0, d->n - 1};
  int32_t *in = malloc(sizeof *in * 2 * t), *tg = malloc(sizeof *tg * 2 * t);
  if (!in || !tg) abort();
  gs_dataset_gather_tokens(d, idx, 2, in, tg);
  for (uint64_t i = 0; i < 2 * t; i++)
    if (in[i] < 0 || (uint32_t)in[i] >= d->classes || tg[i] < 0 || (uint32_t)tg[i] >= d->classes)
      abort();
  free(in);
  free(tg);
  gs_dataset s;
  gs_err e;
  gs_err_clear(&e);
  if (gs_dataset_slice(d, d->n - 1, 1, &s, &e) != 0 || s.tokens[t] != d->tokens[d->n * t]) abort();
  gs_dataset_free(&s);
}

static void refused(int rc, const gs_err *e, const gs_dataset *d) {
  if (rc > 0 || e->code == GS_OK || !e->msg[0] || !e->field[0]) abort();
  if (d->n || d->images || d->images_f32 || d->labels || d->tokens) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 3) return 0;
  const int mode = data[0] & 3;
  const uint8_t *p = data + 3;
  const size_t rest = size - 3;
  gs_dataset d;
  gs_err e, fe;
  gs_err_clear(&e);
  gs_err_clear(&fe);
  if (mode == 0) {
    size_t split = ((size_t)data[1] | (size_t)data[2] << 8) % (rest + 1);
    int rc = gs_dataset_load_npy_mem_named(p, split, "images", p + split, rest - split, "labels",
                                           &d, &e);
    if (rc == 0) {
      check_images(&d);
      gs_dataset_free(&d);
      return 0;
    }
    refused(rc, &e, &d);
    if (rc == GS_DATASET_ECOUNT || rc == -ENOMEM) return 0;
    /* The damaged part, checked as a file the way an upload is. */
    bool img = strcmp(e.field, "images") == 0;
    gs_npy_header h;
    const char *path = img ? write_part(p, split) : write_part(p + split, rest - split);
    int frc = gs_npy_check_file(path, img ? "images" : "labels", e.field,
                                img ? GS_NPY_IMAGES : GS_NPY_LABELS, &h, NULL, &fe);
    if (frc != rc || strcmp(fe.msg, e.msg) != 0) abort();
    return 0;
  }
  const gs_token_format f = mode == 1 ? GS_TOKENS_TEXT : GS_TOKENS_U16;
  uint32_t vocab = mode == 1 ? 0 : (uint32_t)data[1] * 256 + data[2];
  uint32_t t = 1 + (mode == 1 ? data[1] : data[2]) % 64;
  int rc = gs_dataset_load_tokens_mem_named(p, rest, "stream", f, vocab, t, &d, &e);
  if (rc == 0) {
    check_tokens(&d, rest / gs_tokens_width(f));
    gs_dataset_free(&d);
    return 0;
  }
  refused(rc, &e, &d);
  if (strcmp(e.field, "data") != 0 || rc == -ENOMEM) return 0; /* a field, not the file */
  uint64_t n;
  int frc = gs_tokens_check_file(write_part(p, rest), f, f == GS_TOKENS_TEXT ? 256 : vocab,
                                 (uint64_t)t + 1, "stream", "data", &n, &fe);
  if (frc != rc || strcmp(fe.msg, e.msg) != 0) abort();
  return 0;
}
