/*
 * test_ckpt.c: the checkpoint file a gpushare job resumes from.
 *
 * A checkpoint written here must come back bit for bit (metadata and every
 * tensor), and each way a file on disk goes bad must be told apart: not a
 * checkpoint, newer version, truncated, trailing bytes, checksum mismatch,
 * and (with a valid checksum, i.e. crafted) impossible sizes, which must be
 * refused without allocating from them. Every single-byte flip and every
 * truncation of a small file is refused. The atomic writer must leave no
 * .tmp behind and must not touch the previous checkpoint when it fails.
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "common/file.h"
#include "runtime/ckpt.h"

static char dir[64];
static void mkdir_tmp(void) {
  snprintf(dir, sizeof dir, "/tmp/gs_test_ckpt.XXXXXX");
  cr_assert_not_null(mkdtemp(dir));
}
static void rm_tmp(void) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "chmod -R u+w '%s'; rm -rf '%s'", dir, dir);
  cr_assert_eq(system(cmd), 0);
}
TestSuite(ckpt, .init = mkdir_tmp, .fini = rm_tmp);

#define HAS(msg, word) \
  cr_assert(strstr((msg), (word)) != NULL, "message \"%s\" lacks \"%s\"", (msg), (word))

/* A small model's state: kernel, bias (bf16), a step counter, an order. */
static float kernel[784 * 128];
static uint16_t bias[128];
static int64_t counter = 123456789012345LL;
static uint8_t order[7] = {6, 5, 4, 3, 2, 1, 0};
static gs_ckpt_tensor T[4];
static gs_ckpt_meta M;

static void fixture(void) {
  for (int i = 0; i < 784 * 128; i++) kernel[i] = (float)i * 0.5f - 7.25f;
  for (int i = 0; i < 128; i++) bias[i] = (uint16_t)(0x3f80 + i);
  T[0] = (gs_ckpt_tensor){"dense_1.kernel", GS_CKPT_F32, 2, {784, 128}, kernel, sizeof kernel};
  T[1] = (gs_ckpt_tensor){"dense_1.bias", GS_CKPT_BF16, 1, {128}, bias, sizeof bias};
  T[2] = (gs_ckpt_tensor){"adam.t", GS_CKPT_I64, 0, {0}, &counter, 8};
  T[3] = (gs_ckpt_tensor){"data.order", GS_CKPT_U8, 1, {7}, order, 7};
  memset(&M, 0, sizeof M);
  M.step = 4242;
  M.epoch = 3;
  M.data_pos = 1280;
  M.opt_t = 4242;
  M.loss_scale = 32768.0f;
  M.good_steps = 1999;
  M.skipped_steps = -1; /* any value survives */
  M.seed = UINT64_C(0xdeadbeefcafef00d);
  M.horizon = 93750;
  snprintf(M.spec, sizeof M.spec, "sha256:%064d", 7);
}

static char *path_of(const char *name) {
  static char p[4][160];
  static int k;
  char *s = p[k++ % 4];
  snprintf(s, 160, "%s/%s", dir, name);
  return s;
}

static uint8_t *slurp(const char *path, size_t *len) {
  uint8_t *b;
  gs_err e = {0};
  cr_assert_eq(gs_file_read(path, SIZE_MAX - 1, NULL, &b, len, &e), 0, "%s", e.msg);
  return b;
}

static void spit(const char *path, const uint8_t *b, size_t len) {
  FILE *f = fopen(path, "wb");
  cr_assert_not_null(f);
  cr_assert_eq(fwrite(b, 1, len, f), len);
  fclose(f);
}

/* Recompute the trailing CRC after a deliberate edit (a crafted file). */
static void fix_crc(uint8_t *b, size_t len) {
  uint32_t c = (uint32_t)crc32(0, b, (uInt)(len - 4));
  for (int i = 0; i < 4; i++) b[len - 4 + i] = (uint8_t)(c >> (8 * i));
}

Test(ckpt, round_trip) {
  fixture();
  gs_err e = {0};
  const char *p = path_of("job.ckpt");
  cr_assert_eq(gs_ckpt_write(p, &M, T, 4, &e), 0, "%s", e.msg);
  cr_assert_neq(access(path_of("job.ckpt.tmp"), F_OK), 0, "a .tmp was left behind");
  struct stat st;
  cr_assert_eq(stat(p, &st), 0);
  cr_assert_eq(st.st_mode & 077, 0, "a tenant's weights must not be world-readable");

  gs_ckpt *c;
  cr_assert_eq(gs_ckpt_load(p, &c, &e), 0, "%s", e.msg);
  cr_assert_eq(c->meta.step, M.step);
  cr_assert_eq(c->meta.epoch, M.epoch);
  cr_assert_eq(c->meta.data_pos, M.data_pos);
  cr_assert_eq(c->meta.opt_t, M.opt_t);
  cr_assert_eq(c->meta.loss_scale, M.loss_scale);
  cr_assert_eq(c->meta.good_steps, M.good_steps);
  cr_assert_eq(c->meta.skipped_steps, M.skipped_steps);
  cr_assert_eq(c->meta.seed, M.seed);
  cr_assert_eq(c->meta.horizon, M.horizon);
  cr_assert_str_eq(c->meta.spec, M.spec);
  cr_assert_eq(c->count, 4);
  for (int i = 0; i < 4; i++) {
    const gs_ckpt_tensor *t = gs_ckpt_find(c, T[i].name);
    cr_assert_not_null(t, "%s", T[i].name);
    cr_assert_str_eq(t->name, T[i].name);
    cr_assert_eq(t->dtype, T[i].dtype);
    cr_assert_eq(t->rank, T[i].rank);
    for (uint32_t k = 0; k < t->rank; k++) cr_assert_eq(t->shape[k], T[i].shape[k]);
    cr_assert_eq(t->bytes, T[i].bytes);
    cr_assert_arr_eq(t->data, T[i].data, T[i].bytes);
    cr_assert_eq((uintptr_t)t->data % 16, 0, "tensor data must be usable in place");
  }
  cr_assert_null(gs_ckpt_find(c, "dense_2.kernel"));

  /* The in-memory encoder writes the same bytes. */
  uint8_t *mem;
  size_t len, flen;
  cr_assert_eq(gs_ckpt_encode(&M, T, 4, &mem, &len, &e), 0);
  uint8_t *file = slurp(p, &flen);
  cr_assert_eq(len, flen);
  cr_assert_arr_eq(mem, file, len);
  gs_ckpt *m;
  cr_assert_eq(gs_ckpt_load_mem(mem, len, &m, &e), 0, "%s", e.msg);
  cr_assert_eq(m->count, 4);
  gs_ckpt_free(m);
  free(mem);
  free(file);
  gs_ckpt_free(c);
  gs_ckpt_free(NULL);

  /* Overwriting replaces the whole file. */
  M.step = 9;
  cr_assert_eq(gs_ckpt_write(p, &M, T + 2, 1, &e), 0, "%s", e.msg);
  cr_assert_eq(gs_ckpt_load(p, &c, &e), 0, "%s", e.msg);
  cr_assert_eq(c->meta.step, 9);
  cr_assert_eq(c->count, 1);
  gs_ckpt_free(c);
}

Test(ckpt, empty_checkpoint) {
  gs_ckpt_meta m = {.step = 1, .loss_scale = 1.0f};
  uint8_t *b;
  size_t n;
  gs_err e = {0};
  cr_assert_eq(gs_ckpt_encode(&m, NULL, 0, &b, &n, &e), 0, "%s", e.msg);
  gs_ckpt *c;
  cr_assert_eq(gs_ckpt_load_mem(b, n, &c, &e), 0, "%s", e.msg);
  cr_assert_eq(c->count, 0);
  cr_assert_str_eq(c->meta.spec, "");
  gs_ckpt_free(c);
  free(b);
}

/* Version 1 had no horizon: its files are still read, with horizon 0 (not
 * recorded). One is made from a version 2 encoding without tensors (whose
 * records' padding would move) by taking the horizon's 8 bytes out. */
Test(ckpt, version_1_is_read_without_horizon) {
  fixture();
  uint8_t *b;
  size_t n;
  gs_err e = {0};
  gs_ckpt *c;
  cr_assert_eq(gs_ckpt_encode(&M, NULL, 0, &b, &n, &e), 0, "%s", e.msg);
  cr_assert_eq(b[8], 2, "the writer writes version 2");
  const size_t horizon_at = 24 + 56;
  memmove(b + horizon_at, b + horizon_at + 8, n - horizon_at - 8);
  n -= 8;
  b[8] = 1;
  for (int i = 0; i < 8; i++) b[16 + i] = (uint8_t)((uint64_t)n >> (8 * i));
  fix_crc(b, n);
  cr_assert_eq(gs_ckpt_load_mem(b, n, &c, &e), 0, "%s", e.msg);
  cr_assert_eq(c->meta.step, M.step);
  cr_assert_eq(c->meta.seed, M.seed);
  cr_assert_eq(c->meta.horizon, 0, "version 1 did not record it");
  cr_assert_str_eq(c->meta.spec, M.spec);
  gs_ckpt_free(c);

  /* A version 2 header on those bytes: the spec length now reads as part of
   * the horizon and the rest does not fit. */
  b[8] = 2;
  fix_crc(b, n);
  cr_assert_lt(gs_ckpt_load_mem(b, n, &c, &e), 0);
  cr_assert_null(c);
  free(b);
}

static int load_bytes(uint8_t *b, size_t n, gs_err *e) {
  const char *p = path_of("bad.ckpt");
  spit(p, b, n);
  gs_ckpt *c = (gs_ckpt *)1;
  int rc = gs_ckpt_load(p, &c, e);
  cr_assert_null(c);
  cr_assert_str_eq(e->field, "checkpoint");
  if (rc) HAS(e->msg, p);
  return rc;
}

Test(ckpt, each_corruption_has_its_own_error) {
  fixture();
  uint8_t *b;
  size_t n;
  gs_err e = {0};
  cr_assert_eq(gs_ckpt_encode(&M, T, 4, &b, &n, &e), 0);
  uint8_t *w = malloc(n + 16);

  memcpy(w, b, n);
  w[n / 2] ^= 0x01; /* inside the kernel's data */
  cr_assert_eq(load_bytes(w, n, &e), GS_CKPT_ECRC);
  HAS(e.msg, "checksum mismatch");

  memcpy(w, b, n);
  cr_assert_eq(load_bytes(w, n - 100, &e), GS_CKPT_ETRUNC);
  HAS(e.msg, "truncated");
  HAS(e.msg, "header says");

  memcpy(w, b, n);
  memset(w + n, 0, 16);
  cr_assert_eq(load_bytes(w, n + 16, &e), GS_CKPT_ETRAIL);
  HAS(e.msg, "16 bytes after");

  memcpy(w, b, n);
  memcpy(w, "GSCKPT00", 8);
  cr_assert_eq(load_bytes(w, n, &e), GS_CKPT_ENOTCKPT);
  HAS(e.msg, "not a gpushare checkpoint");
  cr_assert_eq(load_bytes((uint8_t *)"hello, world\n", 13, &e), GS_CKPT_ENOTCKPT);
  cr_assert_eq(load_bytes((uint8_t *)"GSCK", 4, &e), GS_CKPT_ETRUNC);
  cr_assert_eq(load_bytes((uint8_t *)"", 0, &e), GS_CKPT_ETRUNC);

  memcpy(w, b, n);
  w[8] = 99; /* version 99, checksum left stale: the version is checked first */
  cr_assert_eq(load_bytes(w, n, &e), GS_CKPT_EVERSION);
  cr_assert_eq(e.code, GS_FAILED_PRECONDITION);
  HAS(e.msg, "version 99");
  HAS(e.msg, "newer");
  free(w);
  free(b);
}

Test(ckpt, crafted_sizes_are_checked_not_trusted) {
  fixture();
  uint8_t *b, *w;
  size_t n;
  gs_err e = {0};
  gs_ckpt *c;
  cr_assert_eq(gs_ckpt_encode(&M, T + 2, 2, &b, &n, &e), 0);
  w = malloc(n);

  /* 4 billion tensors claimed in a small file. */
  memcpy(w, b, n);
  memset(w + 12, 0xff, 4);
  fix_crc(w, n);
  cr_assert_eq(gs_ckpt_load_mem(w, n, &c, &e), GS_CKPT_EFORMAT);
  HAS(e.msg, "4294967295 tensors");

  /* A spec string longer than the limit. */
  memcpy(w, b, n);
  size_t spec_len_at = 24 + 64;
  w[spec_len_at + 2] = 0x10;
  fix_crc(w, n);
  cr_assert_eq(gs_ckpt_load_mem(w, n, &c, &e), GS_CKPT_EFORMAT);
  cr_assert_str_eq(e.field, "checkpoint.spec");

  /* The first tensor's byte count set to 2^63. */
  memcpy(w, b, n);
  size_t rec = 24 + 68 + strlen(M.spec);
  size_t bytes_at = rec + 2 + strlen("adam.t") + 4 + 4; /* rank 0: no shape */
  cr_assert_eq(w[bytes_at], 8);
  w[bytes_at + 7] = 0x80;
  fix_crc(w, n);
  cr_assert_eq(gs_ckpt_load_mem(w, n, &c, &e), GS_CKPT_EFORMAT);
  cr_assert_str_eq(e.field, "checkpoint.tensor[0]");

  /* A rank of 9. */
  memcpy(w, b, n);
  w[rec + 2 + 6 + 4] = 9;
  fix_crc(w, n);
  cr_assert_eq(gs_ckpt_load_mem(w, n, &c, &e), GS_CKPT_EFORMAT);
  HAS(e.msg, "rank 9");
  free(w);
  free(b);
}

Test(ckpt, every_flip_and_every_cut_is_refused) {
  fixture();
  uint8_t *b;
  size_t n;
  gs_err e = {0};
  gs_ckpt *c;
  cr_assert_eq(gs_ckpt_encode(&M, T + 1, 3, &b, &n, &e), 0);
  uint8_t *w = malloc(n);
  for (size_t i = 0; i < n; i++) {
    memcpy(w, b, n);
    w[i] ^= 0x5a;
    int rc = gs_ckpt_load_mem(w, n, &c, &e);
    cr_assert_lt(rc, 0, "flip at byte %zu of %zu accepted", i, n);
    cr_assert_null(c);
  }
  for (size_t i = 0; i < n; i++) {
    int rc = gs_ckpt_load_mem(b, i, &c, &e);
    cr_assert_lt(rc, 0, "cut at %zu of %zu accepted", i, n);
    cr_assert(rc == GS_CKPT_ETRUNC || rc == GS_CKPT_ENOTCKPT, "cut at %zu gave %d", i, rc);
  }
  free(w);
  free(b);
}

Test(ckpt, writer_refuses_bad_tensors) {
  fixture();
  gs_err e = {0};
  gs_ckpt_tensor t[2] = {T[1], T[1]};
  cr_assert_eq(gs_ckpt_write(path_of("x"), &M, t, 2, &e), GS_CKPT_EFORMAT);
  HAS(e.msg, "appears twice");
  t[1].name = "other";
  t[1].bytes = 255;
  cr_assert_eq(gs_ckpt_write(path_of("x"), &M, t, 2, &e), GS_CKPT_EFORMAT);
  cr_assert_str_eq(e.field, "tensor[1]");
  HAS(e.msg, "(128,)");
  t[1] = T[0];
  t[1].rank = 5;
  cr_assert_eq(gs_ckpt_write(path_of("x"), &M, t, 2, &e), GS_CKPT_EFORMAT);
  t[1] = T[0];
  t[1].dtype = 7;
  cr_assert_eq(gs_ckpt_write(path_of("x"), &M, t, 2, &e), GS_CKPT_EFORMAT);
  HAS(e.msg, "dtype 7");
  char longname[300];
  memset(longname, 'a', 299);
  longname[299] = 0;
  t[1] = T[0];
  t[1].name = longname;
  cr_assert_eq(gs_ckpt_write(path_of("x"), &M, t, 2, &e), GS_CKPT_EFORMAT);
  cr_assert_neq(access(path_of("x"), F_OK), 0, "a refused write created the file");
  cr_assert_neq(access(path_of("x.tmp"), F_OK), 0);
}

Test(ckpt, failed_write_keeps_the_old_checkpoint) {
  fixture();
  gs_err e = {0};
  const char *p = path_of("keep.ckpt");
  cr_assert_eq(gs_ckpt_write(p, &M, T, 4, &e), 0, "%s", e.msg);
  size_t n0, n1;
  uint8_t *before = slurp(p, &n0);

  /* The directory is missing: nothing is created. */
  char missing[200];
  snprintf(missing, sizeof missing, "%s/no/such/dir/job.ckpt", dir);
  int rc = gs_ckpt_write(missing, &M, T, 4, &e);
  cr_assert_eq(rc, -ENOENT, "%d %s", rc, e.msg);
  HAS(e.msg, "no/such/dir/job.ckpt.tmp");

  /* path.tmp cannot be created (a directory sits there; this works as root
   * too): the write fails and the old file is untouched. */
  char tmp[200];
  snprintf(tmp, sizeof tmp, "%s.tmp", p);
  cr_assert_eq(mkdir(tmp, 0700), 0);
  M.step = 1;
  cr_assert_lt(gs_ckpt_write(p, &M, T, 4, &e), 0);
  cr_assert_eq(rmdir(tmp), 0);
  uint8_t *after = slurp(p, &n1);
  cr_assert_eq(n0, n1);
  cr_assert_arr_eq(before, after, n0);
  free(after);

  /* A directory without write permission (meaningful only without root). */
  if (geteuid() != 0) {
    cr_assert_eq(chmod(dir, 0500), 0);
    cr_assert_lt(gs_ckpt_write(p, &M, T, 4, &e), 0);
    cr_assert_eq(chmod(dir, 0700), 0);
    after = slurp(p, &n1);
    cr_assert_arr_eq(before, after, n0);
    free(after);
  }
  cr_assert_neq(access(tmp, F_OK), 0);
  gs_ckpt *c;
  cr_assert_eq(gs_ckpt_load(p, &c, &e), 0, "%s", e.msg);
  cr_assert_eq(c->meta.step, 4242);
  gs_ckpt_free(c);
  free(before);
}

Test(ckpt, load_errors_name_the_path) {
  gs_err e = {0};
  gs_ckpt *c;
  cr_assert_eq(gs_ckpt_load(path_of("absent.ckpt"), &c, &e), -ENOENT);
  cr_assert_eq(e.code, GS_NOT_FOUND);
  HAS(e.msg, "absent.ckpt");
  cr_assert_lt(gs_ckpt_load(dir, &c, &e), 0);
  HAS(e.msg, "not a regular file");
}

Test(ckpt, expect_checks_the_model) {
  fixture();
  uint8_t *b;
  size_t n;
  gs_err e = {0};
  gs_ckpt *c;
  cr_assert_eq(gs_ckpt_encode(&M, T, 4, &b, &n, &e), 0);
  cr_assert_eq(gs_ckpt_load_mem(b, n, &c, &e), 0);
  const gs_ckpt_tensor *t;
  uint64_t good[2] = {784, 128}, wide[2] = {784, 256};
  cr_assert_eq(gs_ckpt_expect(c, "dense_1.kernel", GS_CKPT_F32, 2, good, &t, &e), 0);
  cr_assert_eq(t->data, gs_ckpt_find(c, "dense_1.kernel")->data);

  cr_assert_eq(gs_ckpt_expect(c, "dense_1.kernel", GS_CKPT_F32, 2, wide, &t, &e),
               GS_CKPT_ESHAPE);
  cr_assert_null(t);
  cr_assert_eq(e.code, GS_FAILED_PRECONDITION);
  cr_assert_str_eq(e.field, "checkpoint.dense_1.kernel");
  cr_assert_str_eq(e.msg,
                   "checkpoint tensor dense_1.kernel has shape (784, 128) but the model needs "
                   "(784, 256)");

  uint64_t flat[1] = {784 * 128};
  cr_assert_eq(gs_ckpt_expect(c, "dense_1.kernel", GS_CKPT_F32, 1, flat, NULL, &e),
               GS_CKPT_ESHAPE);
  HAS(e.msg, "but the model needs (100352,)");

  cr_assert_eq(gs_ckpt_expect(c, "dense_1.kernel", GS_CKPT_F16, 2, good, NULL, &e),
               GS_CKPT_ESHAPE);
  HAS(e.msg, "has dtype F32 but the model needs F16");

  cr_assert_eq(gs_ckpt_expect(c, "dense_2.kernel", GS_CKPT_F32, 2, wide, NULL, &e),
               GS_CKPT_EMISSING);
  cr_assert_eq(e.code, GS_NOT_FOUND);
  HAS(e.msg, "checkpoint has no tensor dense_2.kernel");
  HAS(e.msg, "(784, 256)");
  gs_ckpt_free(c);
  free(b);
}
