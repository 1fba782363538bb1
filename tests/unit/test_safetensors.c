/*
 * test_safetensors.c: the export a tenant loads into PyTorch or any other
 * framework.
 *
 * A one-tensor file is compared byte for byte with the format written out
 * by hand; larger exports round-trip through gpushare's reader (names,
 * dtypes, shapes, bytes, metadata with escapes and non-ASCII text); the
 * header must be JSON, space-padded to a multiple of 8. Where python3
 * exists its json module parses the header too, an independent reader. The
 * writer refuses what safetensors cannot hold, the reader refuses damaged
 * or inconsistent files, and the write is atomic like a checkpoint's.
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/file.h"
#include "runtime/safetensors.h"

static char dir[64];
static void mkdir_tmp(void) {
  snprintf(dir, sizeof dir, "/tmp/gs_test_st.XXXXXX");
  cr_assert_not_null(mkdtemp(dir));
}
static void rm_tmp(void) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  cr_assert_eq(system(cmd), 0);
}
TestSuite(st, .init = mkdir_tmp, .fini = rm_tmp);

#define HAS(msg, word) \
  cr_assert(strstr((msg), (word)) != NULL, "message \"%s\" lacks \"%s\"", (msg), (word))

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

static uint64_t hdr_len(const uint8_t *b) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = n << 8 | b[i];
  return n;
}

Test(st, one_tensor_matches_the_format_by_hand) {
  float w[2] = {1.0f, 2.0f};
  gs_ckpt_tensor t = {"w", GS_CKPT_F32, 1, {2}, w, 8};
  gs_err e = {0};
  const char *p = path_of("w.safetensors");
  cr_assert_eq(gs_safetensors_write(p, &t, 1, NULL, &e), 0, "%s", e.msg);
  cr_assert_neq(access(path_of("w.safetensors.tmp"), F_OK), 0, "a .tmp was left behind");
  size_t n;
  uint8_t *b = slurp(p, &n);
  const char *json = "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
  size_t jl = strlen(json), padded = (jl + 7) / 8 * 8;
  cr_assert_eq(hdr_len(b), padded);
  cr_assert_eq(n, 8 + padded + 8);
  cr_assert_arr_eq(b + 8, json, jl);
  for (size_t i = jl; i < padded; i++) cr_assert_eq(b[8 + i], ' ');
  /* little-endian 1.0f and 2.0f */
  const uint8_t data[8] = {0, 0, 0x80, 0x3f, 0, 0, 0, 0x40};
  cr_assert_arr_eq(b + 8 + padded, data, 8);
  free(b);
}

static uint16_t h16[3 * 4];
static uint16_t b16[5];
static float f32[2 * 3 * 4 * 2];
static float scalar = 3.5f;

static size_t model(gs_ckpt_tensor *t) {
  for (size_t i = 0; i < sizeof f32 / sizeof f32[0]; i++) f32[i] = (float)i / 3.0f;
  for (int i = 0; i < 12; i++) h16[i] = (uint16_t)(0x3c00 + i);
  for (int i = 0; i < 5; i++) b16[i] = (uint16_t)(0x4000 - i);
  t[0] = (gs_ckpt_tensor){"conv2d_1.kernel", GS_CKPT_F32, 4, {2, 3, 4, 2}, f32, sizeof f32};
  t[1] = (gs_ckpt_tensor){"dense_1.kernel", GS_CKPT_F16, 2, {3, 4}, h16, sizeof h16};
  t[2] = (gs_ckpt_tensor){"dense_1.bias", GS_CKPT_BF16, 1, {5}, b16, sizeof b16};
  t[3] = (gs_ckpt_tensor){"odd \"name\"\\with\tescapes", GS_CKPT_F32, 0, {0}, &scalar, 4};
  return 4;
}

static const char *META =
    "{ \"format\" : \"pt\", \"job\":\"42\", \"note\":\"caf\\u00e9 \\\"q\\\" \\\\ \xe2\x82\xac\" }";

Test(st, round_trip_through_the_reader) {
  gs_ckpt_tensor t[4];
  size_t count = model(t);
  gs_err e = {0};
  const char *p = path_of("m.safetensors");
  cr_assert_eq(gs_safetensors_write(p, t, count, META, &e), 0, "%s", e.msg);
  gs_safetensors *s;
  cr_assert_eq(gs_safetensors_read(p, &s, &e), 0, "%s", e.msg);
  cr_assert_eq(s->count, count);
  cr_assert_eq(s->header_len % 8, 0);
  for (size_t i = 0; i < count; i++) {
    const gs_ckpt_tensor *r = gs_safetensors_find(s, t[i].name);
    cr_assert_not_null(r, "%s missing", t[i].name);
    cr_assert_eq(r->dtype, t[i].dtype);
    cr_assert_eq(r->rank, t[i].rank);
    for (uint32_t k = 0; k < r->rank; k++) cr_assert_eq(r->shape[k], t[i].shape[k]);
    cr_assert_eq(r->bytes, t[i].bytes);
    cr_assert_arr_eq(r->data, t[i].data, t[i].bytes);
    /* offset order equals the order given */
    cr_assert_str_eq(s->tensors[i].name, t[i].name);
  }
  cr_assert_eq(s->meta_count, 3);
  cr_assert_str_eq(gs_safetensors_meta(s, "job"), "42");
  cr_assert_str_eq(gs_safetensors_meta(s, "format"), "pt");
  cr_assert_str_eq(gs_safetensors_meta(s, "note"), "caf\xc3\xa9 \"q\" \\ \xe2\x82\xac");
  cr_assert_null(gs_safetensors_meta(s, "absent"));
  gs_safetensors_free(s);

  /* encode writes the same bytes as write */
  uint8_t *m;
  size_t ml, fl;
  cr_assert_eq(gs_safetensors_encode(t, count, META, &m, &ml, &e), 0);
  uint8_t *f = slurp(p, &fl);
  cr_assert_eq(ml, fl);
  cr_assert_arr_eq(m, f, ml);
  free(m);
  free(f);
}

Test(st, python_json_reads_the_header) {
  if (system("command -v python3 >/dev/null 2>&1") != 0)
    cr_skip_test("python3 is not installed: the independent JSON check is skipped");
  gs_ckpt_tensor t[4];
  size_t count = model(t);
  gs_err e = {0};
  const char *p = path_of("py.safetensors");
  cr_assert_eq(gs_safetensors_write(p, t, count, META, &e), 0, "%s", e.msg);
  char cmd[1024];
  snprintf(cmd, sizeof cmd,
           "python3 -c '\n"
           "import json, struct, sys\n"
           "b = open(sys.argv[1], \"rb\").read()\n"
           "n = struct.unpack(\"<Q\", b[:8])[0]\n"
           "assert n %% 8 == 0\n"
           "h = json.loads(b[8:8+n].decode(\"utf-8\"))\n"
           "assert h[\"__metadata__\"][\"note\"] == \"caf\\u00e9 \\\"q\\\" \\\\ \\u20ac\"\n"
           "assert h[\"dense_1.kernel\"] == {\"dtype\": \"F16\", \"shape\": [3, 4], "
           "\"data_offsets\": [192, 216]}\n"
           "assert h[\"odd \\\"name\\\"\\\\with\\tescapes\"][\"shape\"] == []\n"
           "end = max(v[\"data_offsets\"][1] for k, v in h.items() if k != \"__metadata__\")\n"
           "assert 8 + n + end == len(b)\n"
           "' '%s'",
           p);
  cr_assert_eq(system(cmd), 0, "python3 rejected the header of %s", p);
}

Test(st, empty_model_is_an_empty_object) {
  gs_err e = {0};
  uint8_t *b;
  size_t n;
  cr_assert_eq(gs_safetensors_encode(NULL, 0, NULL, &b, &n, &e), 0, "%s", e.msg);
  cr_assert_eq(n, 16);
  cr_assert_eq(hdr_len(b), 8);
  cr_assert_arr_eq(b + 8, "{}      ", 8);
  gs_safetensors *s;
  cr_assert_eq(gs_safetensors_read_mem(b, n, &s, &e), 0, "%s", e.msg);
  cr_assert_eq(s->count, 0);
  gs_safetensors_free(s);
  free(b);
}

Test(st, writer_refuses_what_safetensors_cannot_hold) {
  gs_ckpt_tensor t[4];
  model(t);
  gs_err e = {0};
  const char *p = path_of("bad.safetensors");
  cr_assert_lt(gs_safetensors_write(p, t, 2, "{\"epochs\": 3}", &e), 0);
  cr_assert_str_eq(e.field, "metadata");
  HAS(e.msg, "not a string");
  cr_assert_lt(gs_safetensors_write(p, t, 2, "[\"a\"]", &e), 0);
  cr_assert_lt(gs_safetensors_write(p, t, 2, "{\"a\":\"b\"} x", &e), 0);
  HAS(e.msg, "after the metadata");
  cr_assert_lt(gs_safetensors_write(p, t, 2, "{\"a\":\"b\",\"a\":\"c\"}", &e), 0);
  HAS(e.msg, "twice");
  gs_ckpt_tensor d[2] = {t[1], t[1]};
  cr_assert_lt(gs_safetensors_write(p, d, 2, NULL, &e), 0);
  HAS(e.msg, "appears twice");
  d[1].name = "__metadata__";
  cr_assert_lt(gs_safetensors_write(p, d, 2, NULL, &e), 0);
  cr_assert_str_eq(e.field, "tensor[1]");
  d[1] = t[1];
  d[1].name = "x";
  d[1].bytes = 23;
  cr_assert_lt(gs_safetensors_write(p, d, 2, NULL, &e), 0);
  HAS(e.msg, "needs 24 bytes, 23 given");
  d[1].bytes = 24;
  d[1].dtype = 99;
  cr_assert_lt(gs_safetensors_write(p, d, 2, NULL, &e), 0);
  d[1].dtype = GS_CKPT_F16;
  d[1].name = "bad\xff utf8";
  cr_assert_lt(gs_safetensors_write(p, d, 2, NULL, &e), 0);
  cr_assert_neq(access(p, F_OK), 0, "a refused export created the file");

  char missing[200];
  snprintf(missing, sizeof missing, "%s/gone/m.safetensors", dir);
  cr_assert_eq(gs_safetensors_write(missing, t, 2, NULL, &e), -ENOENT);
  HAS(e.msg, "gone/m.safetensors.tmp");
}

/* A file with a hand-written header and `data` bytes of payload. */
static int read_crafted(const char *json, size_t data, gs_err *e) {
  size_t jl = strlen(json);
  uint8_t *b = calloc(1, 8 + jl + data + 1);
  for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)jl >> (8 * i));
  memcpy(b + 8, json, jl);
  gs_safetensors *s = (gs_safetensors *)1;
  int rc = gs_safetensors_read_mem(b, 8 + jl + data, &s, e);
  if (rc) cr_assert_null(s);
  else gs_safetensors_free(s);
  free(b);
  return rc;
}

Test(st, reader_refuses_damaged_files) {
  gs_err e = {0};
  /* sanity: the crafted helper accepts a good file */
  cr_assert_eq(read_crafted("{\"a\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]}}", 3,
                            &e),
               0, "%s", e.msg);
  /* data shorter than the offsets */
  cr_assert_lt(read_crafted("{\"a\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]}}", 2,
                            &e),
               0);
  HAS(e.msg, "outside");
  /* data longer than the tensors cover */
  cr_assert_lt(read_crafted("{\"a\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]}}", 4,
                            &e),
               0);
  HAS(e.msg, "cover 3 data bytes but the file has 4");
  /* offsets that disagree with the shape */
  cr_assert_lt(read_crafted("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,3]}}",
                            3, &e),
               0);
  /* overlapping tensors */
  cr_assert_lt(read_crafted("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
                            "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[1,3]}}",
                            3, &e),
               0);
  HAS(e.msg, "contiguous");
  /* a gap */
  cr_assert_lt(read_crafted("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}", 2,
                            &e),
               0);
  /* unknown dtype, unknown key, missing key, duplicate tensor */
  cr_assert_lt(read_crafted("{\"a\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}",
                            8, &e),
               0);
  HAS(e.msg, "\"F64\"");
  cr_assert_lt(read_crafted("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],"
                            "\"x\":\"y\"}}",
                            1, &e),
               0);
  cr_assert_lt(read_crafted("{\"a\":{\"dtype\":\"U8\",\"shape\":[1]}}", 1, &e), 0);
  cr_assert_lt(read_crafted("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                            "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
                            2, &e),
               0);
  HAS(e.msg, "twice");
  /* malformed JSON */
  const char *bad[] = {"", "[]", "{", "{\"a\"", "{\"a\":{}", "{\"a\":{\"shape\":[01]}}",
                       "{\"a\":{\"shape\":[-1]}}", "{\"a\":{\"shape\":[1.5]}}", "{\"a\":{}}x",
                       "{\"\\ud800\":{}}", "{\"\xc3\x28\":{}}", "{\"a\":{\"shape\":[1,2,3,4,5]}}",
                       "{\"a\":{\"shape\":[99999999999999999999]}}"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    cr_assert_lt(read_crafted(bad[i], 0, &e), 0, "accepted header %s", bad[i]);
    cr_assert_str_eq(e.field, "safetensors");
  }
  /* header length beyond the file, and beyond the limit */
  uint8_t b[16] = {200, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
  gs_safetensors *s;
  cr_assert_eq(gs_safetensors_read_mem(b, 16, &s, &e), -ENOMSG);
  HAS(e.msg, "truncated");
  b[0] = 0;
  b[5] = 1;
  cr_assert_eq(gs_safetensors_read_mem(b, 16, &s, &e), -EPROTO);
  cr_assert_eq(gs_safetensors_read_mem(b, 3, &s, &e), -ENOMSG);
  cr_assert_eq(gs_safetensors_read(path_of("absent"), &s, &e), -ENOENT);
}

Test(st, every_cut_of_an_export_is_refused) {
  gs_ckpt_tensor t[4];
  size_t count = model(t);
  gs_err e = {0};
  uint8_t *b;
  size_t n;
  cr_assert_eq(gs_safetensors_encode(t, count, META, &b, &n, &e), 0);
  for (size_t i = 0; i < n; i++) {
    gs_safetensors *s;
    cr_assert_lt(gs_safetensors_read_mem(b, i, &s, &e), 0, "cut at %zu of %zu accepted", i, n);
  }
  free(b);
}
