/*
 * fuzz_idx: an IDX images/labels pair through runtime/data.c, the
 * loader every job's uploaded dataset goes through.
 *
 * Input: byte 0 is the mode, bytes 1-2 (little-endian) the split point
 * (modulo the rest's length + 1), the rest is the images part then the
 * labels part. Mode bits:
 *   bit 0: gzip the images part before loading (a valid gzip stream around
 *          fuzzed IDX bytes, so the inflating path parses headers and
 *          bodies; without it gzip input is whatever the fuzzer wrote,
 *          which exercises the corrupt-stream paths)
 *   bit 1: the same for the labels part
 *   bit 2: gzip members are split in two (concatenated members)
 *   bits 5-7 == 7: load from files (gs_dataset_load_idx) instead of memory
 * Checked: a refusal fills e with field "images" or "labels" and a message;
 * an acceptance gives n*h*w*c pixels and n labels, every label below
 * classes, and the set can be gathered, sliced and shuffled.
 */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "runtime/data.h"
#include "tests/fuzz/fuzz_tmp.h"

static char tmpdir[PATH_MAX];

static void cleanup(void) {
  static const char *const files[] = {"images", "labels"};
  fuzz_tmpdir_remove(tmpdir, files, 2);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  fuzz_tmpdir_make(tmpdir, sizeof tmpdir, "idx");
  atexit(cleanup);
  return 0;
}

/* gzip of p (one member, or two when split), malloc'd. */
static uint8_t *gzip(const uint8_t *p, size_t n, int split, size_t *out_len) {
  size_t cap = 2 * (compressBound((uLong)n) + 64);
  uint8_t *out = malloc(cap);
  if (!out) abort();
  size_t o = 0;
  size_t cut = split ? n / 2 : n;
  for (int part = 0; part < (split ? 2 : 1); part++) {
    const uint8_t *src = part ? p + cut : p;
    size_t len = part ? n - cut : cut;
    z_stream s;
    memset(&s, 0, sizeof s);
    if (deflateInit2(&s, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) abort();
    s.next_in = (Bytef *)(uintptr_t)src;
    s.avail_in = (uInt)len;
    s.next_out = out + o;
    s.avail_out = (uInt)(cap - o);
    if (deflate(&s, Z_FINISH) != Z_STREAM_END) abort();
    o += cap - o - s.avail_out;
    deflateEnd(&s);
  }
  *out_len = o;
  return out;
}

static void write_file(const char *path, const uint8_t *p, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f || (n && fwrite(p, 1, n, f) != n) || fclose(f) != 0) abort();
}

static void check_set(const gs_dataset *d) {
  if (d->n == 0 || d->h == 0 || d->w == 0 || d->c == 0 || d->classes < 2) abort();
  uint64_t px = d->n * gs_dataset_image_bytes(d);
  if (px > GS_DATASET_MAX_ELEMS || !d->images || !d->labels) abort();
  volatile uint8_t last = d->images[px - 1]; /* ASan: the buffer is as long as claimed */
  (void)last;
  for (uint64_t i = 0; i < d->n; i++)
    if (d->labels[i] < 0 || (uint32_t)d->labels[i] >= d->classes) abort();
  /* A small batch: the first and last examples. */
  uint64_t idx[2] = {0, d->n - 1};
  uint64_t img = gs_dataset_image_bytes(d);
  if (img <= 1u << 16) {
    float *out = malloc(sizeof(float) * 2 * img);
    int32_t lab[2];
    if (!out) abort();
    gs_dataset_gather_f32(d, idx, 2, out, lab);
    for (uint64_t i = 0; i < 2 * img; i++)
      if (!(out[i] >= 0.0f && out[i] <= 1.0f)) abort();
    if (lab[0] != d->labels[0] || lab[1] != d->labels[d->n - 1]) abort();
    free(out);
  }
  gs_dataset s;
  gs_err e;
  gs_err_clear(&e);
  if (gs_dataset_slice(d, d->n - 1, 1, &s, &e) != 0) abort();
  if (s.n != 1 || s.classes != d->classes || s.labels[0] != d->labels[d->n - 1]) abort();
  gs_dataset_free(&s);
  if (d->n <= 4096) {
    uint64_t perm[4096];
    gs_dataset_shuffle(perm, d->n, 1, 2);
    uint8_t seen[4096] = {0};
    for (uint64_t i = 0; i < d->n; i++) {
      if (perm[i] >= d->n || seen[perm[i]]) abort();
      seen[perm[i]] = 1;
    }
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 3) return 0;
  uint8_t mode = data[0];
  size_t rest = size - 3;
  size_t split = ((size_t)data[1] | (size_t)data[2] << 8) % (rest + 1);
  const uint8_t *img = data + 3, *lab = data + 3 + split;
  size_t img_len = split, lab_len = rest - split;
  uint8_t *gi = NULL, *gl = NULL;
  if (mode & 1) img = gi = gzip(img, img_len, mode & 4, &img_len);
  if (mode & 2) lab = gl = gzip(lab, lab_len, mode & 4, &lab_len);

  gs_dataset d;
  gs_err e;
  gs_err_clear(&e);
  int rc;
  if ((mode >> 5) == 7) {
    char ip[PATH_MAX], lp[PATH_MAX];
    snprintf(ip, sizeof ip, "%s/images", tmpdir);
    snprintf(lp, sizeof lp, "%s/labels", tmpdir);
    write_file(ip, img, img_len);
    write_file(lp, lab, lab_len);
    rc = gs_dataset_load_idx(ip, lp, &d, &e);
  } else {
    rc = gs_dataset_load_idx_mem(img, img_len, lab, lab_len, &d, &e);
  }
  if (rc != 0) {
    if (rc > 0 || e.code == GS_OK || !e.msg[0]) abort();
    if (strcmp(e.field, "images") != 0 && strcmp(e.field, "labels") != 0) abort();
    if (d.images || d.labels || d.n) abort(); /* left zeroed */
  } else {
    check_set(&d);
    gs_dataset_free(&d);
  }
  free(gi);
  free(gl);
  return 0;
}
