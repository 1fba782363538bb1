/*
 * test_idx.c: runtime/idx.c read from files, as the control plane reads an
 * upload and probes a job's datasets: chunk boundaries (raw and gzip inputs
 * larger than the reader's 64 KiB chunk), the body discarded or kept, the
 * largest label, either kind decided by the header, and refusals that name
 * the input. The loader's path (from memory) is test_data.c's.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "runtime/data.h"
#include "runtime/idx.h"

static char dir[64];
static void setup(void) {
  snprintf(dir, sizeof dir, "/tmp/gs-test-idx-XXXXXX");
  cr_assert_not_null(mkdtemp(dir));
}
static void teardown(void) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  cr_assert_eq(system(cmd), 0);
}
TestSuite(idx_file, .init = setup, .fini = teardown);

/* Byte i of a body: a hash of i below mod, so gzip cannot shrink it much. */
static uint8_t pat(size_t i, unsigned mod) {
  uint64_t x = (uint64_t)i * UINT64_C(0x9E3779B97F4A7C15);
  x = (x ^ (x >> 29)) * UINT64_C(0xBF58476D1CE4E5B9);
  return (uint8_t)((x ^ (x >> 32)) % mod);
}

/* An IDX file of `magic` and dims whose body is `body` bytes of pat(i, mod);
 * gzip when gz. Returns its path (static). */
static const char *put(const char *name, uint32_t magic, const uint32_t *dims, int nd,
                       size_t body, unsigned mod, int gz) {
  static char path[128];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  size_t n = 4 + 4 * (size_t)nd + body;
  uint8_t *p = malloc(n), *q = p;
  for (int s = 24; s >= 0; s -= 8) *q++ = (uint8_t)(magic >> s);
  for (int i = 0; i < nd; i++)
    for (int s = 24; s >= 0; s -= 8) *q++ = (uint8_t)(dims[i] >> s);
  for (size_t i = 0; i < body; i++) q[i] = pat(i, mod);
  if (gz) {
    gzFile f = gzopen(path, "wb1");
    cr_assert_not_null(f);
    cr_assert_eq(gzwrite(f, p, (unsigned)n), (int)n);
    gzclose(f);
  } else {
    FILE *f = fopen(path, "wb");
    cr_assert_eq(fwrite(p, 1, n, f), n);
    fclose(f);
  }
  free(p);
  return path;
}

static int scan(const char *path, gs_idx_kind want, gs_idx_header *h, uint8_t **body,
                uint8_t *maxv, gs_err *e) {
  gs_idx *x;
  int rc = gs_idx_open_file(path, "the upload", "data", &x, e);
  if (rc) return rc;
  rc = gs_idx_read_header(x, want, h, e);
  if (!rc) rc = gs_idx_read_body(x, h, body, maxv, e);
  gs_idx_close(x);
  return rc;
}

Test(idx_file, big_raw_images_across_chunks) {
  uint32_t dims[3] = {100, 40, 40}; /* 160,000 bytes: three chunks */
  const char *p = put("img", 0x803, dims, 3, 160000, 256, 0);
  gs_idx_header h;
  uint8_t *body = NULL;
  gs_err e = {0};
  cr_assert_eq(scan(p, GS_IDX_ANY, &h, &body, NULL, &e), 0, "%s", e.msg);
  cr_assert_eq(h.kind, GS_IDX_IMAGES);
  cr_assert_eq(h.elems, 160000);
  cr_assert_not(h.gzip);
  for (size_t i = 0; i < 160000; i++) cr_assert_eq(body[i], pat(i, 256));
  free(body);
}

Test(idx_file, big_gzip_labels_discarded_with_their_max) {
  uint32_t dims[1] = {300000};
  const char *p = put("lab.gz", 0x801, dims, 1, 300000, 10, 1);
  gs_idx_header h;
  uint8_t maxv = 0;
  gs_err e = {0};
  cr_assert_eq(scan(p, GS_IDX_ANY, &h, NULL, &maxv, &e), 0, "%s", e.msg);
  cr_assert_eq(h.kind, GS_IDX_LABELS);
  cr_assert(h.gzip);
  cr_assert_eq(h.dims[0], 300000);
  cr_assert_eq(maxv, 9);
}

Test(idx_file, gzip_kept_equals_raw) {
  uint32_t dims[4] = {50, 30, 30, 3};
  uint8_t *a = NULL, *b = NULL;
  gs_idx_header h;
  gs_err e = {0};
  cr_assert_eq(scan(put("raw", 0x804, dims, 4, 135000, 251, 0), GS_IDX_IMAGES, &h, &a, NULL, &e),
               0, "%s", e.msg);
  cr_assert_eq(scan(put("z.gz", 0x804, dims, 4, 135000, 251, 1), GS_IDX_IMAGES, &h, &b, NULL, &e),
               0, "%s", e.msg);
  cr_assert_eq(memcmp(a, b, 135000), 0);
  free(a);
  free(b);
}

Test(idx_file, refusals_name_the_input_and_field) {
  uint32_t dims[1] = {10};
  gs_idx_header h;
  gs_err e = {0};
  /* trailing byte, raw */
  cr_assert_eq(scan(put("trail", 0x801, dims, 1, 11, 4, 0), GS_IDX_ANY, &h, NULL, NULL, &e),
               GS_DATASET_ETRAIL);
  cr_assert_str_eq(e.field, "data");
  cr_assert(strstr(e.msg, "the upload") && strstr(e.msg, "trailing"), "%s", e.msg);
  /* short body, gzip */
  uint32_t big[1] = {200000};
  cr_assert_eq(scan(put("short.gz", 0x801, big, 1, 150000, 4, 1), GS_IDX_ANY, &h, NULL, NULL, &e),
               GS_DATASET_ETRUNC);
  cr_assert(strstr(e.msg, "promises 200000 bytes"), "%s", e.msg);
  /* a rank gpushare does not read, with either kind allowed */
  uint32_t two[2] = {2, 2};
  cr_assert_eq(scan(put("rank2", 0x802, two, 2, 4, 4, 0), GS_IDX_ANY, &h, NULL, NULL, &e),
               GS_DATASET_ERANK);
  cr_assert(strstr(e.msg, "2 dimensions"), "%s", e.msg);
  /* the wrong kind where one is asked for */
  cr_assert_eq(scan(put("lab", 0x801, dims, 1, 10, 4, 0), GS_IDX_IMAGES, &h, NULL, NULL, &e),
               GS_DATASET_ERANK);
  cr_assert(strstr(e.msg, "is it the labels file"), "%s", e.msg);
  /* a missing file */
  char missing[96];
  snprintf(missing, sizeof missing, "%s/none", dir);
  cr_assert_eq(scan(missing, GS_IDX_ANY, &h, NULL, NULL, &e), -ENOENT);
  cr_assert_eq(e.code, GS_NOT_FOUND);
}

Test(idx_file, truncated_gzip_file_across_chunks) {
  uint32_t dims[1] = {400000};
  const char *p = put("cut.gz", 0x801, dims, 1, 400000, 256, 1);
  FILE *f = fopen(p, "rb");
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fclose(f);
  cr_assert_gt(n, 70000, "the compressed file should span chunks: %ld bytes", n);
  cr_assert_eq(truncate(p, n - 5000), 0);
  gs_idx_header h;
  gs_err e = {0};
  cr_assert_eq(scan(p, GS_IDX_ANY, &h, NULL, NULL, &e), GS_DATASET_EGZIP);
  cr_assert(strstr(e.msg, "truncated gzip"), "%s", e.msg);
}
