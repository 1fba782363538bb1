/*
 * test_npy.c: the .npy reader (runtime/npy.c) and the .npy pair loader
 * (runtime/data.c) on tenants' uploads.
 *
 * Every fixture is built here byte by byte as numpy.save writes it (the
 * magic, the version, the header's length, the dict padded with spaces to
 * a multiple of 64 and ended with a newline, then the data), in format 1.0
 * and 2.0, then damaged in exactly one way. Each damage must give its own
 * return value and a message with the words that tell a tenant what is
 * wrong, the same from the loader (bytes in memory) and from the control
 * plane's check of a file (64 KiB at a time), and the loader must leave
 * its output zeroed.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/data.h"
#include "runtime/npy.h"

static char dir[64];

static void mkdir_tmp(void) {
  snprintf(dir, sizeof dir, "/tmp/gs_test_npy.XXXXXX");
  cr_assert_not_null(mkdtemp(dir));
}
static void rm_tmp(void) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  cr_assert_eq(system(cmd), 0);
}

typedef struct blob {
  uint8_t *p;
  size_t len;
} blob;

/* A .npy file of format `major`.0 with header dict `dict` (as written,
 * padded here) and `data_len` bytes of data copied from data (NULL: a
 * pattern). */
static blob npy_raw(int major, const char *dict, const void *data, size_t data_len) {
  size_t pre = major == 1 ? 10 : 12;
  size_t hl = strlen(dict) + 1;
  size_t total_h = (pre + hl + 63) / 64 * 64;
  hl = total_h - pre;
  blob b = {calloc(1, total_h + data_len + 1), total_h + data_len};
  cr_assert_not_null(b.p);
  memcpy(b.p, "\x93NUMPY", 6);
  b.p[6] = (uint8_t)major;
  b.p[7] = 0;
  for (size_t i = 0; i < (major == 1 ? 2u : 4u); i++) b.p[8 + i] = (uint8_t)(hl >> (8 * i));
  memset(b.p + pre, ' ', hl);
  memcpy(b.p + pre, dict, strlen(dict));
  b.p[pre + hl - 1] = '\n';
  for (size_t i = 0; i < data_len; i++)
    b.p[total_h + i] = data ? ((const uint8_t *)data)[i] : (uint8_t)(i * 7 + 3);
  return b;
}

/* numpy.save's dict for descr and a shape written as "(2, 3, 4)". */
static blob npy(int major, const char *descr, const char *shape, const void *data, size_t len) {
  char dict[256];
  snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }", descr,
           shape);
  return npy_raw(major, dict, data, len);
}

/* Labels 0, 1, ..., classes-1, 0, ... as int32. */
static blob labels_i4(uint32_t n, uint32_t classes) {
  int32_t *v = malloc(4 * n);
  for (uint32_t i = 0; i < n; i++) v[i] = (int32_t)(i % classes);
  char shape[32];
  snprintf(shape, sizeof shape, "(%u,)", n);
  blob b = npy(1, "<i4", shape, v, 4 * (size_t)n);
  free(v);
  return b;
}

static const char *put(const char *name, blob b) {
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

#define HAS(msg, word) \
  cr_assert(strstr((msg), (word)) != NULL, "message \"%s\" lacks \"%s\"", (msg), (word))

/* images + labels must be refused with rc by the loader (output zeroed,
 * e->field `field`) and, for the damaged file alone, by the file check
 * with the same code and message. `which` says which file is damaged. */
static void refused(blob img, blob lab, int rc, const char *field, const char *word) {
  gs_dataset d;
  gs_err e = {0};
  memset(&d, 0xab, sizeof d);
  int got = gs_dataset_load_npy_mem_named(img.p, img.len, "img.npy", lab.p, lab.len, "lab.npy",
                                          &d, &e);
  cr_assert_eq(got, rc, "loader: rc %d, want %d (%s)", got, rc, e.msg);
  cr_assert_str_eq(e.field, field);
  HAS(e.msg, word);
  cr_assert_eq(d.n, 0);
  cr_assert_null(d.images);
  cr_assert_null(d.images_f32);
  cr_assert_null(d.labels);
  if (rc == GS_DATASET_ECOUNT) return; /* a pair's fault, no one file's */
  /* The file check reads the damaged file as the upload check does. */
  bool is_img = !strcmp(field, "images");
  blob b = is_img ? img : lab;
  gs_err fe = {0};
  gs_npy_header h;
  const char *path = put(is_img ? "img.npy" : "lab.npy", b);
  int frc = gs_npy_check_file(path, is_img ? "img.npy" : "lab.npy", field,
                              is_img ? GS_NPY_IMAGES : GS_NPY_LABELS, &h, NULL, &fe);
  cr_assert_eq(frc, rc, "file check: rc %d, want %d (%s)", frc, rc, fe.msg);
  cr_assert_str_eq(fe.msg, e.msg);
}

TestSuite(npy, .init = mkdir_tmp, .fini = rm_tmp);

Test(npy, uint8_images_v1_load_as_bytes_and_gather_like_idx) {
  blob img = npy(1, "|u1", "(5, 3, 4)", NULL, 60);
  blob lab = labels_i4(5, 3);
  gs_dataset d;
  gs_err e = {0};
  cr_assert_eq(gs_dataset_load_npy(put("i.npy", img), put("l.npy", lab), &d, &e), 0, "%s", e.msg);
  cr_assert_eq(d.kind, GS_DATA_IMAGES);
  cr_assert_eq(d.n, 5);
  cr_assert_eq(d.h, 3);
  cr_assert_eq(d.w, 4);
  cr_assert_eq(d.c, 1);
  cr_assert_eq(d.classes, 3);
  cr_assert_null(d.images_f32);
  cr_assert_arr_eq(d.images, img.p + img.len - 60, 60);
  for (int i = 0; i < 5; i++) cr_assert_eq(d.labels[i], i % 3);
  uint64_t idx[2] = {4, 1};
  float out[24];
  int32_t l[2];
  gs_dataset_gather_f32(&d, idx, 2, out, l);
  for (int k = 0; k < 12; k++) {
    cr_assert_eq(out[k], (float)d.images[48 + k] / 255.0f);
    cr_assert_eq(out[12 + k], (float)d.images[12 + k] / 255.0f);
  }
  cr_assert_eq(l[0], 1);
  cr_assert_eq(l[1], 1);
  cr_assert_eq(gs_dataset_host_bytes(&d), 5 * (12 + 4));
  gs_dataset_free(&d);
  free(img.p);
  free(lab.p);
}

Test(npy, float32_images_v2_are_used_as_given) {
  float px[3 * 2 * 2 * 3];
  for (int i = 0; i < 36; i++) px[i] = -1.5f + 0.25f * (float)i;
  blob img = npy(2, "<f4", "(3, 2, 2, 3)", px, sizeof px);
  cr_assert_eq(img.p[6], 2);
  blob lab = labels_i4(3, 2);
  gs_dataset d;
  gs_err e = {0};
  cr_assert_eq(gs_dataset_load_npy_mem_named(img.p, img.len, NULL, lab.p, lab.len, NULL, &d, &e),
               0, "%s", e.msg);
  cr_assert_eq(d.c, 3);
  cr_assert_null(d.images);
  cr_assert_not_null(d.images_f32);
  uint64_t idx[3] = {2, 0, 1};
  float out[36];
  gs_dataset_gather_f32(&d, idx, 3, out, NULL);
  cr_assert_arr_eq(out, px + 24, 12 * sizeof(float));
  cr_assert_arr_eq(out + 12, px, 12 * sizeof(float));
  cr_assert_arr_eq(out + 24, px + 12, 12 * sizeof(float));
  /* A slice keeps the float pixels. */
  gs_dataset s;
  cr_assert_eq(gs_dataset_slice(&d, 1, 2, &s, &e), 0, "%s", e.msg);
  cr_assert_arr_eq(s.images_f32, px + 12, 24 * sizeof(float));
  cr_assert_eq(gs_dataset_host_bytes(&s), 2 * (12 * 4 + 4));
  gs_dataset_free(&s);
  gs_dataset_free(&d);
  free(img.p);
  free(lab.p);
}

Test(npy, every_integer_label_dtype_loads) {
  static const char *const descr[] = {"|u1", "|i1", "<u2", "<i2", "<u4", "<i4", "<u8", "<i8"};
  static const size_t size[] = {1, 1, 2, 2, 4, 4, 8, 8};
  blob img = npy(1, "|u1", "(4, 2, 2)", NULL, 16);
  for (int t = 0; t < 8; t++) {
    uint8_t data[32] = {0};
    for (int i = 0; i < 4; i++) data[i * size[t]] = (uint8_t)(i == 3 ? 6 : i); /* LE */
    for (int major = 1; major <= 2; major++) {
      blob lab = npy(major, descr[t], "(4,)", data, 4 * size[t]);
      gs_dataset d;
      gs_err e = {0};
      cr_assert_eq(gs_dataset_load_npy_mem_named(img.p, img.len, NULL, lab.p, lab.len, NULL, &d,
                                                 &e),
                   0, "%s v%d: %s", descr[t], major, e.msg);
      cr_assert_eq(d.classes, 7, "%s", descr[t]);
      cr_assert_eq(d.labels[3], 6);
      cr_assert_eq(d.labels[1], 1);
      gs_dataset_free(&d);
      uint64_t top = 0;
      gs_npy_header h;
      cr_assert_eq(gs_npy_check_file(put("l.npy", lab), "l", "labels", GS_NPY_ANY, &h, &top, &e),
                   0, "%s", e.msg);
      cr_assert_eq(h.kind, GS_NPY_LABELS);
      cr_assert_eq(top, 6);
      free(lab.p);
    }
  }
  free(img.p);
}

Test(npy, header_forms_numpy_writes_are_read) {
  /* Double quotes, keys in another order, no trailing comma, a 1-tuple
   * with a space, big dims. */
  blob img = npy_raw(1, "{\"shape\": (2, 3, 3), \"fortran_order\": False, \"descr\": \"|u1\"}",
                     NULL, 18);
  blob lab = npy_raw(1, "{'descr': '<i8', 'fortran_order': False, 'shape': (2 ,)}", NULL, 16);
  memset(lab.p + lab.len - 16, 0, 16);
  gs_dataset d;
  gs_err e = {0};
  cr_assert_eq(gs_dataset_load_npy_mem_named(img.p, img.len, NULL, lab.p, lab.len, NULL, &d, &e),
               0, "%s", e.msg);
  cr_assert_eq(d.n, 2);
  cr_assert_eq(d.classes, 2);
  gs_dataset_free(&d);
  free(img.p);
  free(lab.p);
}

Test(npy, each_damage_has_its_own_error) {
  blob gi = npy(1, "|u1", "(2, 2, 2)", NULL, 8);
  blob gl = labels_i4(2, 2);
  blob b;

  b = npy(1, "|u1", "(2, 2, 2)", NULL, 8);
  b.p[1] = 'X';
  refused(b, gl, GS_DATASET_EMAGIC, "images", "is not a .npy file");
  free(b.p);

  b = npy(1, "|u1", "(2, 2, 2)", NULL, 8);
  b.p[6] = 3;
  refused(b, gl, GS_NPY_EVERSION, "images", "version 3.0");
  free(b.p);

  b = npy(1, "|u1", "(2, 2, 2)", NULL, 8);
  b.len = 9;
  refused(b, gl, GS_DATASET_ETRUNC, "images", "truncated inside its preamble");
  b.len = 40;
  refused(b, gl, GS_DATASET_ETRUNC, "images", "truncated inside its header");
  free(b.p);

  b = npy_raw(1, "descr: |u1", NULL, 8);
  refused(b, gl, GS_NPY_EHEADER, "images", "no '{'");
  free(b.p);

  b = npy_raw(1, "{'descr': '|u1', 'fortran_order': False, 'shape': (2, 2, 2), 'x': 1}", NULL, 8);
  refused(b, gl, GS_NPY_EHEADER, "images", "header key 'x'");
  free(b.p);

  b = npy_raw(1, "{'descr': '|u1', 'descr': '|u1', 'fortran_order': False, 'shape': (2, 2, 2)}",
              NULL, 8);
  refused(b, gl, GS_NPY_EHEADER, "images", "'descr' twice");
  free(b.p);

  b = npy_raw(1, "{'descr': '|u1', 'shape': (2, 2, 2)}", NULL, 8);
  refused(b, gl, GS_NPY_EHEADER, "images", "no 'fortran_order'");
  free(b.p);

  b = npy_raw(1, "{'descr': '|u1', 'fortran_order': False, 'shape': (2, 'a', 2)}", NULL, 8);
  refused(b, gl, GS_NPY_EHEADER, "images", "other than integers");
  free(b.p);

  b = npy_raw(1, "{'descr': '|u1', 'fortran_order': False, 'shape': (2, 2, 2)} x", NULL, 8);
  refused(b, gl, GS_NPY_EHEADER, "images", "text after the dict");
  free(b.p);

  b = npy(1, "|O", "(2, 2, 2)", NULL, 64);
  refused(b, gl, GS_NPY_EOBJECT, "images", "object array");
  free(b.p);

  b = npy_raw(1, "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2, 2, 2)}", NULL,
              32);
  refused(b, gl, GS_NPY_EDTYPE, "images", "structured array");
  free(b.p);

  b = npy_raw(1, "{'descr': '|u1', 'fortran_order': True, 'shape': (2, 2, 2)}", NULL, 8);
  refused(b, gl, GS_NPY_EORDER, "images", "Fortran order");
  free(b.p);

  b = npy(1, ">f4", "(2, 2, 2)", NULL, 32);
  refused(b, gl, GS_NPY_EENDIAN, "images", "big-endian");
  free(b.p);

  b = npy(1, "<i4", "(2, 2, 2)", NULL, 32);
  refused(b, gl, GS_NPY_EDTYPE, "images", "|u1 (uint8) or <f4 (float32)");
  free(b.p);

  b = npy(1, "|u1", "(2, 8)", NULL, 16);
  refused(b, gl, GS_DATASET_ERANK, "images", "2 dimensions");
  free(b.p);

  b = npy(1, "|u1", "(2, 0, 2)", NULL, 0);
  refused(b, gl, GS_DATASET_EZERO, "images", "dimension 1 (H) = 0");
  free(b.p);

  b = npy(1, "<f4", "(65536, 256, 256)", NULL, 8);
  refused(b, gl, GS_DATASET_ETOOBIG, "images", "4 GiB");
  free(b.p);

  b = npy(1, "|u1", "(2, 2, 2)", NULL, 7);
  refused(b, gl, GS_DATASET_ETRUNC, "images", "is truncated: its shape and dtype |u1 promise 8");
  free(b.p);

  b = npy(1, "|u1", "(2, 2, 2)", NULL, 9);
  refused(b, gl, GS_DATASET_ETRAIL, "images", "1 trailing bytes");
  free(b.p);

  float px[8] = {0, 1, 2, 3, NAN, 5, 6, 7};
  b = npy(1, "<f4", "(2, 2, 2)", px, sizeof px);
  refused(b, gl, GS_NPY_ENONFINITE, "images", "pixel 4 (of example 1) = nan");
  free(b.p);

  /* The labels file. */
  b = npy(1, "<f4", "(2,)", NULL, 8);
  refused(gi, b, GS_NPY_EDTYPE, "labels", "an integer dtype");
  free(b.p);

  b = npy(1, ">i4", "(2,)", NULL, 8);
  refused(gi, b, GS_NPY_EENDIAN, "labels", "little-endian");
  free(b.p);

  b = npy(1, "|u1", "(2, 2, 2)", NULL, 8);
  refused(gi, b, GS_DATASET_ERANK, "labels", "is it the images file?");
  free(b.p);

  int32_t neg[2] = {1, -3};
  b = npy(1, "<i4", "(2,)", neg, sizeof neg);
  refused(gi, b, GS_NPY_ENEGATIVE, "labels", "label -3 at index 1");
  free(b.p);

  int32_t big[2] = {70000, 1};
  b = npy(1, "<i4", "(2,)", big, sizeof big);
  refused(gi, b, GS_NPY_ELABEL, "labels", "label 70000 at index 0");
  free(b.p);

  b = labels_i4(3, 2);
  refused(gi, b, GS_DATASET_ECOUNT, "labels", "has 3 labels but the images file img.npy has 2");
  free(b.p);

  free(gi.p);
  free(gl.p);
}

Test(npy, a_large_file_is_checked_across_chunks) {
  /* 40000 float pixels (160 KB, three 64 KiB reads) with one NaN late. */
  size_t n = 40000;
  float *px = calloc(n, sizeof *px);
  px[n - 3] = INFINITY;
  blob b = npy(1, "<f4", "(100, 20, 20)", px, n * 4);
  gs_npy_header h;
  gs_err e = {0};
  int rc = gs_npy_check_file(put("big.npy", b), "big.npy", "data", GS_NPY_ANY, &h, NULL, &e);
  cr_assert_eq(rc, GS_NPY_ENONFINITE, "%s", e.msg);
  HAS(e.msg, "pixel 39997 (of example 99) = inf");
  px[n - 3] = 0;
  free(b.p);
  b = npy(1, "<f4", "(100, 20, 20)", px, n * 4);
  cr_assert_eq(gs_npy_check_file(put("big.npy", b), "big.npy", "data", GS_NPY_ANY, &h, NULL, &e),
               0, "%s", e.msg);
  cr_assert_eq(h.kind, GS_NPY_IMAGES);
  cr_assert_eq(h.elems, n);
  /* A probe reads the header and the length only. */
  px[0] = NAN;
  free(b.p);
  b = npy(1, "<f4", "(100, 20, 20)", px, n * 4);
  cr_assert_eq(gs_npy_probe_file(put("big.npy", b), "big.npy", "data", GS_NPY_IMAGES, &h, &e), 0);
  cr_assert_eq(gs_npy_check_file(put("big.npy", b), "big.npy", "data", GS_NPY_IMAGES, &h, NULL, &e),
               GS_NPY_ENONFINITE);
  free(b.p);
  free(px);
}

Test(npy, a_missing_file_is_not_found) {
  gs_dataset d;
  gs_err e = {0};
  blob l = labels_i4(2, 2);
  cr_assert_eq(gs_dataset_load_npy("/nonexistent/x.npy", put("l.npy", l), &d, &e), -ENOENT);
  cr_assert_null(d.images);
  gs_npy_header h;
  cr_assert_eq(gs_npy_check_file("/nonexistent/x.npy", "x", "data", GS_NPY_ANY, &h, NULL, &e),
               -ENOENT);
  free(l.p);
}
