/*
 * fuzz_ckpt: checkpoint bytes through runtime/ckpt.c's reader, what a
 * restarted gpushared or executor runs on the files of its state directory
 * (gs_ckpt_load / gs_ckpt_load_mem).
 *
 * Input: byte 0 is the mode, the rest the file. Mode bit 0 set: before
 * loading, write the magic, version 1, the real length into the header and
 * a correct CRC-32 at the end (when the file is long enough for them), so
 * mutations reach the structure behind the checksum; clear: the bytes as
 * they are (magic, version, length and CRC refusals). Mode bits 5-7 == 7:
 * load through a file (gs_ckpt_load) instead of memory.
 * Checked: a refusal fills e with a message and a "checkpoint..." field;
 * an acceptance gives tensors that are found by name, pass gs_ckpt_expect
 * with their own dtype and shape and fail it with another shape, whose data
 * lies inside the file and is 16-byte aligned, that pass gs_ckpt_validate,
 * and that encode (gs_ckpt_encode) into a checkpoint that loads to the same
 * meta and tensors and encodes to the same bytes again.
 */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "runtime/ckpt.h"
#include "tests/fuzz/fuzz_tmp.h"

static char tmpdir[PATH_MAX];

static void cleanup(void) {
  static const char *const files[] = {"ckpt"};
  fuzz_tmpdir_remove(tmpdir, files, 1);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  fuzz_tmpdir_make(tmpdir, sizeof tmpdir, "ckpt");
  atexit(cleanup);
  return 0;
}

static void put_le(uint8_t *p, uint64_t v, int n) {
  for (int i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void same(const gs_ckpt *a, const gs_ckpt *b) {
  if (a->meta.step != b->meta.step || a->meta.epoch != b->meta.epoch ||
      a->meta.data_pos != b->meta.data_pos || a->meta.opt_t != b->meta.opt_t ||
      memcmp(&a->meta.loss_scale, &b->meta.loss_scale, 4) != 0 ||
      a->meta.good_steps != b->meta.good_steps || a->meta.skipped_steps != b->meta.skipped_steps ||
      a->meta.seed != b->meta.seed || strcmp(a->meta.spec, b->meta.spec) != 0 ||
      a->count != b->count)
    abort();
  for (size_t i = 0; i < a->count; i++) {
    const gs_ckpt_tensor *x = &a->tensors[i], *y = &b->tensors[i];
    if (strcmp(x->name, y->name) || x->dtype != y->dtype || x->rank != y->rank ||
        memcmp(x->shape, y->shape, sizeof(uint64_t) * x->rank) || x->bytes != y->bytes ||
        (x->bytes && memcmp(x->data, y->data, (size_t)x->bytes)))
      abort();
  }
}

static void check(const gs_ckpt *c) {
  const uint8_t *lo = c->buf__, *hi = c->buf__ + c->len__;
  if (strnlen(c->meta.spec, sizeof c->meta.spec) > GS_CKPT_SPEC_MAX) abort();
  for (size_t i = 0; i < c->count; i++) {
    const gs_ckpt_tensor *t = &c->tensors[i];
    size_t nl = strlen(t->name);
    if (nl == 0 || nl > GS_CKPT_NAME_MAX || t->rank > GS_CKPT_RANK_MAX) abort();
    if (!gs_ckpt_dtype_size(t->dtype)) abort();
    const uint8_t *d = t->data;
    if (d < lo || d > hi || t->bytes > (uint64_t)(hi - d)) abort();
    if ((uintptr_t)d % 16) abort();
    if (gs_ckpt_find(c, t->name) != t) abort();
    gs_err e;
    gs_err_clear(&e);
    const gs_ckpt_tensor *got = NULL;
    if (gs_ckpt_expect(c, t->name, t->dtype, t->rank, t->shape, &got, &e) != 0 || got != t)
      abort();
    uint64_t other[4];
    memcpy(other, t->shape, sizeof other);
    other[0] += 1;
    gs_err_clear(&e);
    if (t->rank && gs_ckpt_expect(c, t->name, t->dtype, t->rank, other, NULL, &e) != GS_CKPT_ESHAPE)
      abort();
    char sh[160];
    gs_ckpt_shape_str(t->rank, t->shape, sh, sizeof sh);
    volatile uint8_t last = t->bytes ? d[t->bytes - 1] : 0; /* ASan: in bounds */
    (void)last;
  }
  gs_err e;
  gs_err_clear(&e);
  if (gs_ckpt_find(c, "") != NULL) abort();
  if (gs_ckpt_validate(&c->meta, c->tensors, c->count, &e) != 0) abort();
  uint8_t *enc1, *enc2;
  size_t n1, n2;
  if (gs_ckpt_encode(&c->meta, c->tensors, c->count, &enc1, &n1, &e) != 0) abort();
  gs_ckpt *c2;
  if (gs_ckpt_load_mem(enc1, n1, &c2, &e) != 0) abort();
  same(c, c2);
  if (gs_ckpt_encode(&c2->meta, c2->tensors, c2->count, &enc2, &n2, &e) != 0) abort();
  if (n1 != n2 || memcmp(enc1, enc2, n1) != 0) abort();
  gs_ckpt_free(c2);
  free(enc1);
  free(enc2);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  uint8_t mode = data[0];
  size_t len = size - 1;
  uint8_t *buf = malloc(len ? len : 1);
  if (!buf) abort();
  if (len) memcpy(buf, data + 1, len);
  if ((mode & 1) && len >= 28) {
    memcpy(buf, GS_CKPT_MAGIC, 8);
    put_le(buf + 8, GS_CKPT_VERSION, 4);
    put_le(buf + 16, len, 8);
    put_le(buf + len - 4, (uint32_t)crc32(crc32(0, NULL, 0), buf, (uInt)(len - 4)), 4);
  }
  gs_ckpt *c = NULL;
  gs_err e;
  gs_err_clear(&e);
  int rc;
  if ((mode >> 5) == 7) {
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/ckpt", tmpdir);
    FILE *f = fopen(p, "wb");
    if (!f || (len && fwrite(buf, 1, len, f) != len) || fclose(f) != 0) abort();
    rc = gs_ckpt_load(p, &c, &e);
  } else {
    rc = gs_ckpt_load_mem(buf, len, &c, &e);
  }
  if (rc != 0) {
    if (rc > 0 || c || e.code == GS_OK || !e.msg[0]) abort();
    if (strncmp(e.field, "checkpoint", 10) != 0) abort();
  } else {
    if (!c) abort();
    check(c);
    gs_ckpt_free(c);
  }
  free(buf);
  return 0;
}
