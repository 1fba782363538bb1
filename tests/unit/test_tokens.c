/*
 * test_tokens.c: token streams (runtime/tokens.c) and their examples
 * (runtime/data.c): text at byte level, uint16 ids, the cut into examples
 * of sequence length T (T + 1 tokens each, one token shared with the
 * next), the gather into int32 inputs and targets, and a job's train/test
 * split of one stream.
 *
 * Fixtures are written byte by byte here. Each way a file can be wrong
 * must give its own return value and a message naming the value, the same
 * from the loader (bytes in memory) and from the control plane's check of
 * a file, and the loader must leave its output zeroed.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/data.h"
#include "runtime/tokens.h"

static char dir[64];

static void mkdir_tmp(void) {
  snprintf(dir, sizeof dir, "/tmp/gs_test_tokens.XXXXXX");
  cr_assert_not_null(mkdtemp(dir));
}
static void rm_tmp(void) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  cr_assert_eq(system(cmd), 0);
}

static const char *put(const char *name, const void *p, size_t len) {
  static char path[8][128];
  static int k;
  char *s = path[k++ % 8];
  snprintf(s, 128, "%s/%s", dir, name);
  FILE *f = fopen(s, "wb");
  cr_assert_not_null(f);
  cr_assert_eq(fwrite(p, 1, len, f), len);
  fclose(f);
  return s;
}

/* n little-endian uint16 ids: id i is (i * 7) % mod. */
static uint8_t *u16_stream(size_t n, uint32_t mod) {
  uint8_t *b = malloc(2 * n);
  for (size_t i = 0; i < n; i++) {
    uint32_t v = (uint32_t)(i * 7) % mod;
    b[2 * i] = (uint8_t)v;
    b[2 * i + 1] = (uint8_t)(v >> 8);
  }
  return b;
}

#define HAS(msg, word) \
  cr_assert(strstr((msg), (word)) != NULL, "message \"%s\" lacks \"%s\"", (msg), (word))

TestSuite(tokens, .init = mkdir_tmp, .fini = rm_tmp);

Test(tokens, text_is_a_token_per_byte_cut_into_examples) {
  const char *text = "hello, world!"; /* 13 bytes: (13 - 1) / 4 = 3 examples of T = 4 */
  gs_dataset d;
  gs_err e = {0};
  cr_assert_eq(gs_dataset_load_tokens(put("t.txt", text, 13), GS_TOKENS_TEXT, 0, 4, &d, &e), 0,
               "%s", e.msg);
  cr_assert_eq(d.kind, GS_DATA_TOKENS);
  cr_assert_eq(d.n, 3);
  cr_assert_eq(d.seq_len, 4);
  cr_assert_eq(d.classes, 256);
  cr_assert_null(d.labels);
  cr_assert_eq(gs_dataset_host_bytes(&d), 13 * 2);
  uint64_t idx[3] = {2, 0, 1};
  int32_t in[12], tg[12];
  gs_dataset_gather_tokens(&d, idx, 3, in, tg);
  /* example i: inputs text[4i .. 4i+4), targets one later */
  for (int k = 0; k < 4; k++) {
    cr_assert_eq(in[k], text[8 + k]);
    cr_assert_eq(tg[k], text[9 + k]);
    cr_assert_eq(in[4 + k], text[k]);
    cr_assert_eq(tg[4 + k], text[1 + k]);
    cr_assert_eq(in[8 + k], text[4 + k]);
    cr_assert_eq(tg[8 + k], text[5 + k]);
  }
  /* Example 2's last target is the 13th byte: no tail was dropped. */
  cr_assert_eq(tg[3], '!');
  gs_dataset_free(&d);
}

Test(tokens, uint16_ids_are_little_endian_and_the_tail_is_dropped) {
  uint8_t *b = u16_stream(23, 50); /* 22 / 5 = 4 examples, 2 tokens dropped */
  gs_dataset d;
  gs_err e = {0};
  cr_assert_eq(gs_dataset_load_tokens_mem_named(b, 46, "ids.bin", GS_TOKENS_U16, 50, 5, &d, &e),
               0, "%s", e.msg);
  cr_assert_eq(d.n, 4);
  cr_assert_eq(d.classes, 50);
  for (int i = 0; i <= 20; i++) cr_assert_eq(d.tokens[i], (i * 7) % 50);
  uint64_t idx[1] = {3};
  int32_t in[5], tg[5];
  gs_dataset_gather_tokens(&d, idx, 1, in, tg);
  for (int k = 0; k < 5; k++) {
    cr_assert_eq(in[k], ((15 + k) * 7) % 50);
    cr_assert_eq(tg[k], ((16 + k) * 7) % 50);
  }
  gs_dataset_free(&d);
  /* Ids above 255 keep their high byte. */
  uint8_t hi[6] = {0x34, 0x12, 0xff, 0xff, 0x00, 0x01};
  cr_assert_eq(gs_dataset_load_tokens_mem_named(hi, 6, NULL, GS_TOKENS_U16, 65536, 2, &d, &e), 0,
               "%s", e.msg);
  cr_assert_eq(d.tokens[0], 0x1234);
  cr_assert_eq(d.tokens[1], 0xffff);
  cr_assert_eq(d.tokens[2], 0x0100);
  gs_dataset_free(&d);
  free(b);
}

/* p must be refused with rc by the loader (zeroed output, field) and, for a
 * file fault, by the file check with the same code and message. */
static void refused(const void *p, size_t len, gs_token_format f, uint32_t vocab, uint32_t t,
                    int rc, const char *field, const char *word) {
  gs_dataset d;
  gs_err e = {0};
  memset(&d, 0xab, sizeof d);
  int got = gs_dataset_load_tokens_mem_named(p, len, "ids.bin", f, vocab, t, &d, &e);
  cr_assert_eq(got, rc, "loader: rc %d, want %d (%s)", got, rc, e.msg);
  cr_assert_str_eq(e.field, field);
  HAS(e.msg, word);
  cr_assert_eq(d.n, 0);
  cr_assert_null(d.tokens);
  if (strcmp(field, "data")) return;
  gs_err fe = {0};
  uint64_t n = 7;
  int frc = gs_tokens_check_file(put("ids.bin", p, len), f, vocab, (uint64_t)t + 1, "ids.bin",
                                 "data", &n, &fe);
  cr_assert_eq(frc, rc, "file check: rc %d, want %d (%s)", frc, rc, fe.msg);
  cr_assert_str_eq(fe.msg, e.msg);
  cr_assert_eq(n, 0);
}

Test(tokens, each_fault_has_its_own_error) {
  uint8_t *b = u16_stream(40, 1000);
  /* id 700 at token 20 (byte offset 40), vocabulary 500 */
  b[40] = 700 & 0xff;
  b[41] = 700 >> 8;
  refused(b, 80, GS_TOKENS_U16, 500, 4, GS_TOKENS_EVOCAB, "data",
          "token id 700 at byte offset 40 (token 20); every id must be below vocab_size 500");
  refused(b, 79, GS_TOKENS_U16, 1000, 4, GS_TOKENS_EODD, "data", "79 bytes, an odd number");
  refused(b, 8, GS_TOKENS_U16, 1000, 4, GS_TOKENS_ESHORT, "data",
          "holds 4 tokens; it needs at least 5");
  refused(b, 0, GS_TOKENS_TEXT, 0, 1, GS_TOKENS_ESHORT, "data", "holds 0 tokens");
  refused(b, 80, GS_TOKENS_U16, 0, 4, -EINVAL, "vocab_size", "vocab_size is 0");
  refused(b, 80, GS_TOKENS_U16, 65537, 4, -EINVAL, "vocab_size", "2 to 65536");
  refused(b, 80, GS_TOKENS_U16, 1000, 0, -EINVAL, "sequence_length", "sequence_length is 0");
  free(b);
  /* A good file passes the check with its count. */
  b = u16_stream(40, 1000);
  uint64_t n;
  gs_err e = {0};
  cr_assert_eq(gs_tokens_check_file(put("ok.bin", b, 80), GS_TOKENS_U16, 1000, 2, "ok", "data",
                                    &n, &e),
               0, "%s", e.msg);
  cr_assert_eq(n, 40);
  free(b);
}

Test(tokens, a_large_file_is_checked_across_chunks) {
  size_t n = 100000; /* 200 KB: four 64 KiB reads */
  uint8_t *b = u16_stream(n, 30000);
  b[2 * 99990] = 0x30; /* 0x7530 = 30000 */
  b[2 * 99990 + 1] = 0x75;
  uint64_t cnt;
  gs_err e = {0};
  cr_assert_eq(gs_tokens_check_file(put("big.bin", b, 2 * n), GS_TOKENS_U16, 30000, 2, "big",
                                    "data", &cnt, &e),
               GS_TOKENS_EVOCAB);
  HAS(e.msg, "token id 30000 at byte offset 199980 (token 99990)");
  free(b);
}

/* ---- a job's split ------------------------------------------------------ */

/* Streams by path, for gs_dataset_load_job's callback. */
typedef struct streams {
  const char *path[2];
  const uint8_t *p[2];
  size_t len[2];
  int loads;
} streams;

static int load_stream(const void *user, const char *which, const gs_spec_dataset *d,
                       gs_dataset *out, gs_err *e) {
  streams *s = (streams *)user;
  s->loads++;
  for (int i = 0; i < 2; i++)
    if (s->path[i] && !strcmp(s->path[i], d->path)) {
      int rc = gs_dataset_load_tokens_mem_named(
          s->p[i], s->len[i], d->path, d->source == GS_DATASET_TEXT ? GS_TOKENS_TEXT : GS_TOKENS_U16,
          d->vocab_size, d->sequence_length, out, e);
      if (rc) gs_err_prefix(e, which);
      return rc;
    }
  return gs_err_set(e, GS_NOT_FOUND, which, "no stream %s", d->path);
}

static void stream_spec(gs_job_spec *s, gs_dataset_source src, const char *tr, uint64_t tr_n,
                        const char *te, uint64_t te_n) {
  gs_job_spec_init(s);
  s->train.source = src;
  s->train.path = tr;
  s->train.examples = tr_n;
  s->train.vocab_size = 1000;
  s->train.sequence_length = 4;
  if (te) {
    s->test = s->train;
    s->test.path = te;
    s->test.examples = te_n;
  }
}

Test(tokens, one_stream_for_train_and_test_is_split_in_order) {
  uint8_t *b = u16_stream(41, 1000); /* 10 examples of T = 4 */
  streams st = {{"ids", NULL}, {b, NULL}, {82, 0}, 0};
  gs_job_spec s;
  gs_dataset tr, te;
  bool has_test;
  gs_err e = {0};
  stream_spec(&s, GS_DATASET_TOKENS, "ids", 7, "ids", 0);
  cr_assert_eq(gs_dataset_load_job(&s, load_stream, &st, &tr, &te, &has_test, &e), 0, "%s", e.msg);
  cr_assert_eq(st.loads, 1, "one stream is read once");
  cr_assert(has_test);
  cr_assert_eq(tr.n, 7);
  cr_assert_eq(te.n, 3, "test takes the rest");
  /* test example 0 is stream example 7: tokens 28..32 */
  for (int k = 0; k <= 12; k++) cr_assert_eq(te.tokens[k], ((28 + k) * 7) % 1000);
  for (int k = 0; k <= 28; k++) cr_assert_eq(tr.tokens[k], (k * 7) % 1000);
  gs_dataset_free(&tr);
  gs_dataset_free(&te);
  /* The same spec again: the same split (deterministic). */
  gs_dataset tr2, te2;
  cr_assert_eq(gs_dataset_load_job(&s, load_stream, &st, &tr2, &te2, &has_test, &e), 0);
  cr_assert_eq(te2.tokens[0], (28 * 7) % 1000);
  gs_dataset_free(&tr2);
  gs_dataset_free(&te2);
  /* test.examples takes the next ones only. */
  stream_spec(&s, GS_DATASET_TOKENS, "ids", 5, "ids", 2);
  cr_assert_eq(gs_dataset_load_job(&s, load_stream, &st, &tr, &te, &has_test, &e), 0, "%s", e.msg);
  cr_assert_eq(tr.n, 5);
  cr_assert_eq(te.n, 2);
  cr_assert_eq(te.tokens[0], (20 * 7) % 1000);
  gs_dataset_free(&tr);
  gs_dataset_free(&te);
  free(b);
}

Test(tokens, split_errors_name_their_field) {
  uint8_t *b = u16_stream(41, 1000);
  streams st = {{"ids", "other"}, {b, b}, {82, 42}, 0};
  gs_job_spec s;
  gs_dataset tr, te;
  bool has_test;
  gs_err e = {0};
  stream_spec(&s, GS_DATASET_TOKENS, "ids", 0, "ids", 0);
  cr_assert_lt(gs_dataset_load_job(&s, load_stream, &st, &tr, &te, &has_test, &e), 0);
  cr_assert_str_eq(e.field, "train.tokens.examples");
  HAS(e.msg, "test names the same file");
  stream_spec(&s, GS_DATASET_TOKENS, "ids", 10, "ids", 0);
  cr_assert_lt(gs_dataset_load_job(&s, load_stream, &st, &tr, &te, &has_test, &e), 0);
  cr_assert_str_eq(e.field, "test.tokens.examples");
  HAS(e.msg, "none are left for test");
  stream_spec(&s, GS_DATASET_TOKENS, "ids", 8, "ids", 3);
  cr_assert_lt(gs_dataset_load_job(&s, load_stream, &st, &tr, &te, &has_test, &e), 0);
  cr_assert_str_eq(e.field, "test.tokens.examples");
  HAS(e.msg, "test takes 3 examples from example 8 on, but the file holds 10");
  cr_assert_null(tr.tokens, "train is freed when test fails");
  stream_spec(&s, GS_DATASET_TOKENS, "ids", 11, NULL, 0);
  cr_assert_lt(gs_dataset_load_job(&s, load_stream, &st, &tr, &te, &has_test, &e), 0);
  cr_assert_str_eq(e.field, "train.tokens.examples");
  /* Fields checked before the file is read. */
  stream_spec(&s, GS_DATASET_TOKENS, "ids", 0, NULL, 0);
  s.train.sequence_length = 0;
  st.loads = 0;
  cr_assert_lt(gs_dataset_load_job(&s, load_stream, &st, &tr, &te, &has_test, &e), 0);
  cr_assert_str_eq(e.field, "train.sequence_length");
  s.train.sequence_length = 4;
  s.train.vocab_size = 1;
  cr_assert_lt(gs_dataset_load_job(&s, load_stream, &st, &tr, &te, &has_test, &e), 0);
  cr_assert_str_eq(e.field, "train.tokens.vocab_size");
  s.train.vocab_size = 1000;
  s.train.path = "";
  cr_assert_lt(gs_dataset_load_job(&s, load_stream, &st, &tr, &te, &has_test, &e), 0);
  cr_assert_str_eq(e.field, "train.tokens.path");
  cr_assert_eq(st.loads, 0);
  /* An id over the vocabulary is named under train. */
  stream_spec(&s, GS_DATASET_TOKENS, "ids", 0, NULL, 0);
  s.train.vocab_size = 100;
  cr_assert_eq(gs_dataset_load_job(&s, load_stream, &st, &tr, &te, &has_test, &e),
               GS_TOKENS_EVOCAB);
  cr_assert_str_eq(e.field, "train.data");
  free(b);
}

Test(tokens, separate_files_are_each_their_own_set) {
  uint8_t *a = u16_stream(41, 1000), *c = u16_stream(13, 1000);
  streams st = {{"train.bin", "test.bin"}, {a, c}, {82, 26}, 0};
  gs_job_spec s;
  gs_dataset tr, te;
  bool has_test;
  gs_err e = {0};
  stream_spec(&s, GS_DATASET_TOKENS, "train.bin", 0, "test.bin", 0);
  cr_assert_eq(gs_dataset_load_job(&s, load_stream, &st, &tr, &te, &has_test, &e), 0, "%s", e.msg);
  cr_assert_eq(tr.n, 10);
  cr_assert_eq(te.n, 3);
  cr_assert_eq(te.tokens[0], 0, "the test file's own first token");
  gs_dataset_free(&tr);
  gs_dataset_free(&te);
  /* A text stream and its byte vocabulary. */
  const uint8_t *txt = (const uint8_t *)"the quick brown fox";
  streams ts = {{"t.txt", NULL}, {txt, NULL}, {19, 0}, 0};
  stream_spec(&s, GS_DATASET_TEXT, "t.txt", 2, "t.txt", 0);
  s.train.vocab_size = s.test.vocab_size = 0;
  cr_assert_eq(gs_dataset_load_job(&s, load_stream, &ts, &tr, &te, &has_test, &e), 0, "%s", e.msg);
  cr_assert_eq(tr.n, 2);
  cr_assert_eq(te.n, 2); /* (19 - 1) / 4 = 4 examples */
  cr_assert_eq(te.tokens[0], 'k'); /* stream example 2: byte 8 */
  cr_assert_eq(tr.classes, 256);
  gs_dataset_free(&tr);
  gs_dataset_free(&te);
  free(a);
  free(c);
}
