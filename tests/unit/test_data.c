/*
 * test_data.c: the dataset loaders gpushare runs on tenants' uploads.
 *
 * Every fixture is made here: IDX bytes built field by field, written raw or
 * through zlib's gzopen into a fresh temporary directory, then damaged in
 * exactly one way. Each damage must give its own return value and a message
 * with the words that tell a tenant what is wrong. The real Fashion-MNIST
 * test set from Debian is loaded when the package is installed. The
 * synthetic set is checked for determinism, balance and learnability (a
 * nearest-class-mean classifier, fitted on one half, must classify the other
 * half), the shuffle for being a deterministic permutation.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "common/file.h"
#include "runtime/data.h"

#define FASHION "/usr/share/datasets/fashion-mnist"

static char dir[64];

static void mkdir_tmp(void) {
  snprintf(dir, sizeof dir, "/tmp/gs_test_data.XXXXXX");
  cr_assert_not_null(mkdtemp(dir));
}
static void rm_tmp(void) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  cr_assert_eq(system(cmd), 0);
}

/* IDX bytes: magic, dims, body (body_len bytes of a pattern). */
typedef struct blob {
  uint8_t *p;
  size_t len;
} blob;

static blob idx(uint32_t magic, const uint32_t *dims, int nd, size_t body_len) {
  blob b = {malloc(4 + 4 * (size_t)nd + body_len + 1), 4 + 4 * (size_t)nd + body_len};
  cr_assert_not_null(b.p);
  uint8_t *q = b.p;
  for (int s = 24; s >= 0; s -= 8) *q++ = (uint8_t)(magic >> s);
  for (int i = 0; i < nd; i++)
    for (int s = 24; s >= 0; s -= 8) *q++ = (uint8_t)(dims[i] >> s);
  for (size_t i = 0; i < body_len; i++) q[i] = (uint8_t)(i * 7 + 3);
  return b;
}

/* n images of h x w and n labels 0, 1, ..., classes-1, 0, ... */
static blob images(uint32_t n, uint32_t h, uint32_t w) {
  uint32_t d[3] = {n, h, w};
  return idx(0x00000803, d, 3, (size_t)n * h * w);
}
static blob labels(uint32_t n, uint32_t classes) {
  uint32_t d[1] = {n};
  blob b = idx(0x00000801, d, 1, n);
  for (uint32_t i = 0; i < n; i++) b.p[8 + i] = (uint8_t)(i % classes);
  return b;
}

static const char *put_raw(const char *name, blob b) {
  static char path[8][128];
  static int k;
  char *p = path[k++ % 8];
  snprintf(p, 128, "%s/%s", dir, name);
  FILE *f = fopen(p, "wb");
  cr_assert_not_null(f);
  cr_assert_eq(fwrite(b.p, 1, b.len, f), b.len);
  fclose(f);
  return p;
}

static const char *put_gz(const char *name, blob b) {
  static char path[8][128];
  static int k;
  char *p = path[k++ % 8];
  snprintf(p, 128, "%s/%s", dir, name);
  gzFile g = gzopen(p, "wb");
  cr_assert_not_null(g);
  cr_assert_eq(gzwrite(g, b.p, (unsigned)b.len), (int)b.len);
  cr_assert_eq(gzclose(g), Z_OK);
  return p;
}

static blob slurp(const char *path) {
  blob b;
  gs_err e = {0};
  cr_assert_eq(gs_file_read(path, SIZE_MAX - 1, NULL, &b.p, &b.len, &e), 0, "%s", e.msg);
  return b;
}

#define HAS(msg, word) cr_assert(strstr((msg), (word)) != NULL, "message \"%s\" lacks \"%s\"", (msg), (word))

TestSuite(idx, .init = mkdir_tmp, .fini = rm_tmp);

Test(idx, raw_pair_loads) {
  blob bi = images(5, 4, 3), bl = labels(5, 5);
  gs_dataset d;
  gs_err e = {0};
  cr_assert_eq(gs_dataset_load_idx(put_raw("i", bi), put_raw("l", bl), &d, &e), 0, "%s", e.msg);
  cr_assert_eq(d.n, 5);
  cr_assert_eq(d.h, 4);
  cr_assert_eq(d.w, 3);
  cr_assert_eq(d.c, 1);
  cr_assert_eq(d.classes, 5);
  cr_assert_arr_eq(d.images, bi.p + 16, 60);
  for (int i = 0; i < 5; i++) cr_assert_eq(d.labels[i], i);
  gs_dataset_free(&d);
  cr_assert_null(d.images);
  free(bi.p);
  free(bl.p);
}

Test(idx, gzip_pair_loads_and_equals_raw) {
  blob bi = images(50, 7, 6), bl = labels(50, 10);
  gs_dataset d, r;
  gs_err e = {0};
  cr_assert_eq(gs_dataset_load_idx(put_gz("i.gz", bi), put_gz("l.gz", bl), &d, &e), 0, "%s",
               e.msg);
  cr_assert_eq(gs_dataset_load_idx_mem(bi.p, bi.len, bl.p, bl.len, &r, &e), 0, "%s", e.msg);
  cr_assert_eq(d.n, 50);
  cr_assert_eq(d.h, 7);
  cr_assert_eq(d.w, 6);
  cr_assert_eq(d.classes, 10);
  cr_assert_arr_eq(d.images, r.images, 50 * 42);
  cr_assert_arr_eq(d.labels, r.labels, 50 * sizeof(int32_t));
  gs_dataset_free(&d);
  gs_dataset_free(&r);
  free(bi.p);
  free(bl.p);
}

Test(idx, four_dims_give_channels) {
  uint32_t dims[4] = {2, 3, 4, 3};
  blob bi = idx(0x00000804, dims, 4, 2 * 36), bl = labels(2, 2);
  gs_dataset d;
  gs_err e = {0};
  cr_assert_eq(gs_dataset_load_idx_mem(bi.p, bi.len, bl.p, bl.len, &d, &e), 0, "%s", e.msg);
  cr_assert_eq(d.c, 3);
  cr_assert_eq(gs_dataset_image_bytes(&d), 36);
  gs_dataset_free(&d);
  free(bi.p);
  free(bl.p);
}

Test(idx, one_class_still_has_two_outputs) {
  blob bi = images(3, 2, 2), bl = labels(3, 1);
  gs_dataset d;
  gs_err e = {0};
  cr_assert_eq(gs_dataset_load_idx_mem(bi.p, bi.len, bl.p, bl.len, &d, &e), 0, "%s", e.msg);
  cr_assert_eq(d.classes, 2);
  gs_dataset_free(&d);
  free(bi.p);
  free(bl.p);
}

/* Load images file `ip` with good labels of n, expect rc and words. */
static void expect_images_error(const char *ip, uint32_t n, int want, const char *w1,
                                const char *w2) {
  blob bl = labels(n, 3);
  gs_dataset d;
  gs_err e = {0};
  int rc = gs_dataset_load_idx(ip, put_raw("good-labels", bl), &d, &e);
  cr_assert_eq(rc, want, "rc %d, want %d: %s", rc, want, e.msg);
  cr_assert_str_eq(e.field, "images");
  HAS(e.msg, strrchr(ip, '/') + 1);
  HAS(e.msg, w1);
  if (w2) HAS(e.msg, w2);
  cr_assert_null(d.images);
  cr_assert_eq(d.n, 0);
  free(bl.p);
}

Test(idx, wrong_magic) {
  blob b = images(4, 2, 2);
  b.p[0] = 0x50; /* "PK..": a zip, say */
  b.p[1] = 0x4b;
  expect_images_error(put_raw("zip-images", b), 4, GS_DATASET_EMAGIC, "not an IDX file",
                      "0x00000803");
  free(b.p);
}

Test(idx, wrong_type_byte) {
  blob b = images(4, 2, 2);
  b.p[2] = 0x0d; /* float */
  expect_images_error(put_raw("float-images", b), 4, GS_DATASET_ETYPE, "element type 0x0d",
                      "unsigned bytes");
  free(b.p);
}

Test(idx, wrong_number_of_dims) {
  uint32_t dims[2] = {4, 4};
  blob b = idx(0x00000802, dims, 2, 16);
  expect_images_error(put_raw("flat-images", b), 4, GS_DATASET_ERANK, "has 2 dimensions",
                      "needs 3");
  free(b.p);
  /* A labels file given as images, and the other way round. */
  blob l = labels(4, 2);
  expect_images_error(put_raw("swapped", l), 4, GS_DATASET_ERANK, "is it the labels file", NULL);
  blob bi = images(4, 2, 2);
  gs_dataset d;
  gs_err e = {0};
  cr_assert_eq(gs_dataset_load_idx_mem(bi.p, bi.len, bi.p, bi.len, &d, &e), GS_DATASET_ERANK);
  cr_assert_str_eq(e.field, "labels");
  HAS(e.msg, "is it the images file");
  free(l.p);
  free(bi.p);
}

Test(idx, truncated_raw) {
  blob b = images(4, 3, 3);
  b.len -= 5;
  expect_images_error(put_raw("short-images", b), 4, GS_DATASET_ETRUNC, "truncated",
                      "promises 36 bytes");
  b.len = 10; /* inside the header */
  expect_images_error(put_raw("stub-images", b), 4, GS_DATASET_ETRUNC, "inside its header",
                      NULL);
  b.len = 0;
  expect_images_error(put_raw("empty-images", b), 4, GS_DATASET_ETRUNC, "0 bytes", NULL);
  free(b.p);
}

Test(idx, trailing_bytes_raw_and_gzip) {
  blob b = images(4, 3, 3);
  b.len += 3;
  b.p = realloc(b.p, b.len);
  expect_images_error(put_raw("long-images", b), 4, GS_DATASET_ETRAIL, "3 trailing bytes",
                      NULL);
  expect_images_error(put_gz("long-images.gz", b), 4, GS_DATASET_ETRAIL, "trailing bytes",
                      NULL);
  free(b.p);
}

Test(idx, truncated_content_inside_complete_gzip) {
  blob b = images(4, 3, 3);
  b.len -= 1;
  expect_images_error(put_gz("short-images.gz", b), 4, GS_DATASET_ETRUNC, "truncated",
                      "decompressed");
  free(b.p);
}

Test(idx, truncated_gzip_stream) {
  /* Incompressible pixels so the cut lands inside the deflate data. */
  blob b = images(64, 16, 16);
  uint64_t st = 1;
  for (size_t i = 16; i < b.len; i++) b.p[i] = (uint8_t)gs_rng_next(&st);
  blob z = slurp(put_gz("whole.gz", b));
  size_t cuts[3] = {z.len / 2, z.len - 4 /* inside the gzip trailer */, 12};
  for (int k = 0; k < 3; k++) {
    blob cut = {z.p, cuts[k]};
    expect_images_error(put_raw("cut-images.gz", cut), 64, GS_DATASET_EGZIP,
                        "truncated gzip file", NULL);
  }
  /* A flipped bit inside the compressed data is a corrupt (not truncated) file. */
  z.p[z.len / 2] ^= 0x10;
  blob bad = {z.p, z.len};
  expect_images_error(put_raw("bad-images.gz", bad), 64, GS_DATASET_EGZIP, "gzip", NULL);
  free(z.p);
  free(b.p);
}

Test(idx, count_mismatch_names_both_files) {
  blob bi = images(10, 2, 2), bl = labels(9, 3);
  gs_dataset d;
  gs_err e = {0};
  int rc = gs_dataset_load_idx(put_gz("t10k-images-idx3-ubyte.gz", bi),
                               put_gz("t10k-labels-idx1-ubyte.gz", bl), &d, &e);
  cr_assert_eq(rc, GS_DATASET_ECOUNT, "%s", e.msg);
  cr_assert_eq(e.code, GS_INVALID_ARGUMENT);
  cr_assert_str_eq(e.field, "labels");
  HAS(e.msg, "t10k-labels-idx1-ubyte.gz has 9 labels but the images file "
             "t10k-images-idx3-ubyte.gz has 10 images");
  free(bi.p);
  free(bl.p);
}

Test(idx, huge_claim_refused_before_allocation) {
  /* 100000 x 1000 x 1000 = 100 GB of pixels, in a 16-byte file: refused on
   * the header alone, raw and gzip. */
  uint32_t dims[3] = {100000, 1000, 1000};
  blob b = idx(0x00000803, dims, 3, 0);
  expect_images_error(put_raw("huge-images", b), 4, GS_DATASET_ETOOBIG, "100000x1000x1000",
                      "4 GiB");
  expect_images_error(put_gz("huge-images.gz", b), 4, GS_DATASET_ETOOBIG, "4 GiB", NULL);
  gs_err e = {0};
  gs_dataset d;
  blob bl = labels(4, 2);
  cr_assert_eq(gs_dataset_load_idx_mem(b.p, b.len, bl.p, bl.len, &d, &e), GS_DATASET_ETOOBIG);
  cr_assert_eq(e.code, GS_RESOURCE_EXHAUSTED);
  /* Each dim < 2^32 but their product overflows 64 bits: still refused. */
  uint32_t big[3] = {0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF};
  blob o = idx(0x00000803, big, 3, 0);
  cr_assert_eq(gs_dataset_load_idx_mem(o.p, o.len, bl.p, bl.len, &d, &e), GS_DATASET_ETOOBIG);
  free(o.p);
  free(bl.p);
  free(b.p);
}

Test(idx, zero_dims) {
  uint32_t dims[3] = {4, 0, 2};
  blob b = idx(0x00000803, dims, 3, 0);
  expect_images_error(put_raw("zero-images", b), 4, GS_DATASET_EZERO, "dimension 1 (rows) = 0",
                      NULL);
  uint32_t n0[1] = {0};
  blob l = idx(0x00000801, n0, 1, 0), bi = images(1, 1, 1);
  gs_dataset d;
  gs_err e = {0};
  cr_assert_eq(gs_dataset_load_idx_mem(bi.p, bi.len, l.p, l.len, &d, &e), GS_DATASET_EZERO);
  cr_assert_str_eq(e.field, "labels");
  HAS(e.msg, "(count) = 0");
  free(b.p);
  free(l.p);
  free(bi.p);
}

Test(idx, missing_file) {
  gs_dataset d;
  gs_err e = {0};
  blob bl = labels(1, 2);
  cr_assert_eq(gs_dataset_load_idx("/nonexistent/x", put_raw("l", bl), &d, &e), -ENOENT);
  cr_assert_eq(e.code, GS_NOT_FOUND);
  cr_assert_str_eq(e.field, "images");
  HAS(e.msg, "/nonexistent/x");
  free(bl.p);
}

Test(idx, unnamed_memory_inputs) {
  blob bi = images(2, 2, 2);
  bi.p[0] = 1;
  blob bl = labels(2, 2);
  gs_dataset d;
  gs_err e = {0};
  cr_assert_eq(gs_dataset_load_idx_mem(bi.p, bi.len, bl.p, bl.len, &d, &e), GS_DATASET_EMAGIC);
  HAS(e.msg, "the images data");
  free(bi.p);
  free(bl.p);
}

Test(fashion, debian_test_set) {
  const char *ip = FASHION "/t10k-images-idx3-ubyte.gz", *lp = FASHION "/t10k-labels-idx1-ubyte.gz";
  if (access(ip, R_OK) != 0 || access(lp, R_OK) != 0)
    cr_skip_test("Fashion-MNIST is not installed (apt install dataset-fashion-mnist)");
  gs_dataset d;
  gs_err e = {0};
  cr_assert_eq(gs_dataset_load_idx(ip, lp, &d, &e), 0, "%s", e.msg);
  cr_assert_eq(d.n, 10000);
  cr_assert_eq(d.h, 28);
  cr_assert_eq(d.w, 28);
  cr_assert_eq(d.c, 1);
  cr_assert_eq(d.classes, 10);
  int count[10] = {0};
  for (uint64_t i = 0; i < d.n; i++) count[d.labels[i]]++;
  for (int k = 0; k < 10; k++) cr_assert_eq(count[k], 1000, "class %d has %d", k, count[k]);
  gs_dataset s;
  cr_assert_eq(gs_dataset_slice(&d, 5000, 5000, &s, &e), 0);
  cr_assert_eq(s.n, 5000);
  cr_assert_eq(s.classes, 10);
  cr_assert_arr_eq(s.images, d.images + 5000 * 784, 5000 * 784);
  gs_dataset_free(&s);
  gs_dataset_free(&d);
}

/* ---- synthetic ----------------------------------------------------------- */

Test(synthetic, deterministic_and_seeded) {
  gs_dataset a, b, c;
  gs_err e = {0};
  cr_assert_eq(gs_dataset_synthetic(300, 8, 8, 2, 5, 42, &a, &e), 0, "%s", e.msg);
  cr_assert_eq(gs_dataset_synthetic(300, 8, 8, 2, 5, 42, &b, &e), 0);
  cr_assert_eq(gs_dataset_synthetic(300, 8, 8, 2, 5, 43, &c, &e), 0);
  cr_assert_arr_eq(a.images, b.images, 300 * 128);
  cr_assert_arr_eq(a.labels, b.labels, 300 * sizeof(int32_t));
  cr_assert(memcmp(a.images, c.images, 300 * 128) != 0);
  cr_assert_eq(a.classes, 5);
  cr_assert_eq(a.c, 2);
  gs_dataset_free(&a);
  gs_dataset_free(&b);
  gs_dataset_free(&c);
}

Test(synthetic, balanced_and_learnable) {
  enum { N = 4000, K = 10, P = 12 * 12 };
  gs_dataset d;
  gs_err e = {0};
  cr_assert_eq(gs_dataset_synthetic(N, 12, 12, 1, K, 7, &d, &e), 0, "%s", e.msg);
  int count[K] = {0};
  for (int i = 0; i < N; i++) {
    cr_assert(d.labels[i] >= 0 && d.labels[i] < K);
    count[d.labels[i]]++;
  }
  for (int k = 0; k < K; k++)
    cr_assert(count[k] > N / K * 8 / 10 && count[k] < N / K * 12 / 10, "class %d: %d", k,
              count[k]);
  /* Nearest class mean, fitted on the first half, scored on the second. */
  static double mean[K][P];
  int seen[K] = {0};
  for (int i = 0; i < N / 2; i++) {
    seen[d.labels[i]]++;
    for (int p = 0; p < P; p++) mean[d.labels[i]][p] += d.images[(size_t)i * P + p];
  }
  for (int k = 0; k < K; k++)
    for (int p = 0; p < P; p++) mean[k][p] /= seen[k];
  int right = 0;
  for (int i = N / 2; i < N; i++) {
    int best = -1;
    double bd = 0;
    for (int k = 0; k < K; k++) {
      double s = 0;
      for (int p = 0; p < P; p++) {
        double t = d.images[(size_t)i * P + p] - mean[k][p];
        s += t * t;
      }
      if (best < 0 || s < bd) best = k, bd = s;
    }
    right += best == d.labels[i];
  }
  cr_assert_gt(right, N / 2 * 95 / 100, "nearest-mean accuracy %d / %d", right, N / 2);
  gs_dataset_free(&d);
}

Test(synthetic, refuses_bad_arguments) {
  gs_dataset d;
  gs_err e = {0};
  cr_assert_lt(gs_dataset_synthetic(0, 2, 2, 1, 2, 1, &d, &e), 0);
  cr_assert_str_eq(e.field, "examples");
  cr_assert_lt(gs_dataset_synthetic(5, 2, 0, 1, 2, 1, &d, &e), 0);
  cr_assert_str_eq(e.field, "width");
  cr_assert_lt(gs_dataset_synthetic(5, 2, 2, 1, 1, 1, &d, &e), 0);
  cr_assert_str_eq(e.field, "classes");
  HAS(e.msg, "classes is 1");
  cr_assert_eq(gs_dataset_synthetic(100000000, 1000, 1000, 1, 2, 1, &d, &e), GS_DATASET_ETOOBIG);
  cr_assert_null(d.images);
}

/* ---- slicing, batches, order --------------------------------------------- */

Test(batch, slice_and_gather) {
  gs_dataset d, s;
  gs_err e = {0};
  cr_assert_eq(gs_dataset_synthetic(20, 3, 2, 1, 4, 9, &d, &e), 0);
  cr_assert_lt(gs_dataset_slice(&d, 15, 6, &s, &e), 0);
  cr_assert_str_eq(e.field, "slice");
  cr_assert_lt(gs_dataset_slice(&d, 0, 0, &s, &e), 0);
  cr_assert_eq(gs_dataset_slice(&d, 5, 10, &s, &e), 0);
  cr_assert_arr_eq(s.labels, d.labels + 5, 10 * sizeof(int32_t));
  uint64_t idx[3] = {9, 0, 4};
  float img[18];
  int32_t lab[3];
  gs_dataset_gather_f32(&s, idx, 3, img, lab);
  for (int i = 0; i < 3; i++) {
    cr_assert_eq(lab[i], d.labels[5 + idx[i]]);
    for (int p = 0; p < 6; p++) {
      float want = (float)d.images[(5 + idx[i]) * 6 + p] / 255.0f;
      cr_assert_eq(img[i * 6 + p], want);
      cr_assert(img[i * 6 + p] >= 0.0f && img[i * 6 + p] <= 1.0f);
    }
  }
  gs_dataset_gather_f32(&s, idx, 3, img, NULL); /* labels optional */
  gs_dataset_free(&s);
  gs_dataset_free(&d);
  gs_dataset_free(&d); /* twice is harmless */
}

/* The gather's pixel conversion is x / 255 to the bit for every byte value,
 * at every position of a row (the vector body and its tail), in the build
 * data.c picked at load for this CPU (x86-64-v3 or the baseline). */
Test(batch, gather_pixels_exact) {
  enum { W = 263 }; /* not a multiple of 8 or 32: a tail each row */
  static uint8_t pix[256 * W];
  int32_t lab[256] = {0};
  for (int i = 0; i < 256; i++)
    for (int p = 0; p < W; p++)
      pix[i * W + p] = (uint8_t)(i + p);
  gs_dataset d = {.n = 256, .h = 1, .w = W, .c = 1, .classes = 2, .images = pix, .labels = lab};
  uint64_t idx[256];
  for (int i = 0; i < 256; i++)
    idx[i] = (uint64_t)(255 - i);
  static float img[256 * W];
  gs_dataset_gather_f32(&d, idx, 256, img, NULL);
  for (int i = 0; i < 256; i++)
    for (int p = 0; p < W; p++) {
      volatile float v = (float)pix[idx[i] * W + p]; /* volatile: a real division */
      float want = v / 255.0f;
      cr_assert_eq(img[i * W + p], want, "pixel %u: %a, want %a", (unsigned)v,
                   (double)img[i * W + p], (double)want);
    }
}

Test(rng, splitmix64_reference_values) {
  /* splitmix64 from state 0 (Vigna's reference implementation). */
  uint64_t st = 0;
  cr_assert_eq(gs_rng_next(&st), UINT64_C(0xe220a8397b1dcdaf));
  cr_assert_eq(gs_rng_next(&st), UINT64_C(0x6e789e6aa1b965f4));
  cr_assert_eq(gs_rng_next(&st), UINT64_C(0x06c45d188009454f));
  for (int i = 0; i < 10000; i++) {
    float u = gs_rng_uniform(&st);
    cr_assert(u >= 0.0f && u < 1.0f);
    cr_assert_lt(gs_rng_below(&st, 7), 7);
  }
  cr_assert_eq(gs_rng_below(&st, 1), 0);
  cr_assert_neq(gs_rng_seed(1, 0), gs_rng_seed(2, 0));
  cr_assert_neq(gs_rng_seed(1, 0), gs_rng_seed(1, 1));
}

Test(shuffle, deterministic_permutation) {
  enum { N = 1000 };
  static uint64_t a[N], b[N], c[N];
  static uint8_t seen[N];
  gs_dataset_shuffle(a, N, 5, 0);
  memset(b, 0xff, sizeof b); /* previous content must not matter */
  gs_dataset_shuffle(b, N, 5, 0);
  gs_dataset_shuffle(c, N, 5, 1);
  cr_assert_arr_eq(a, b, sizeof a);
  cr_assert(memcmp(a, c, sizeof a) != 0, "epochs 0 and 1 gave the same order");
  int fixed = 0;
  for (int i = 0; i < N; i++) {
    cr_assert_lt(a[i], N);
    cr_assert_eq(seen[a[i]], 0, "%llu appears twice", (unsigned long long)a[i]);
    seen[a[i]] = 1;
    fixed += a[i] == (uint64_t)i;
  }
  cr_assert_lt(fixed, 20, "%d fixed points: not shuffled", fixed);
  uint64_t one = 99;
  gs_dataset_shuffle(&one, 1, 5, 0);
  cr_assert_eq(one, 0);
  gs_dataset_shuffle(NULL, 0, 5, 0);
}
