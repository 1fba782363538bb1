/*
 * test_file.c: common/file.c (read a whole file) and common/error.c's
 * errno convention.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"
#include "common/file.h"

static char dir[64];

static void setup(void) {
  snprintf(dir, sizeof dir, "/tmp/gs-test-file-XXXXXX");
  cr_assert_not_null(mkdtemp(dir));
}
static void teardown(void) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  cr_assert_eq(system(cmd), 0);
}
TestSuite(file, .init = setup, .fini = teardown);

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "wb");
  cr_assert_not_null(f);
  fputs(text, f);
  fclose(f);
}

Test(file, reads_whole_file_with_nul_after) {
  char p[128];
  snprintf(p, sizeof p, "%s/a", dir);
  write_file(p, "hello");
  uint8_t *buf;
  size_t n;
  gs_err e = {0};
  cr_assert_eq(gs_file_read(p, 100, "job", &buf, &n, &e), 0);
  cr_assert_eq(n, 5);
  cr_assert_str_eq((char *)buf, "hello");
  free(buf);
}

Test(file, empty_file_is_empty) {
  char p[128];
  snprintf(p, sizeof p, "%s/empty", dir);
  write_file(p, "");
  uint8_t *buf;
  size_t n = 9;
  gs_err e = {0};
  cr_assert_eq(gs_file_read(p, 100, NULL, &buf, &n, &e), 0);
  cr_assert_eq(n, 0);
  cr_assert_eq(buf[0], 0);
  free(buf);
}

Test(file, over_the_cap_is_refused_with_size_and_cap) {
  char p[128];
  snprintf(p, sizeof p, "%s/big", dir);
  write_file(p, "0123456789");
  uint8_t *buf = (uint8_t *)"x";
  size_t n;
  gs_err e = {0};
  cr_assert_eq(gs_file_read(p, 9, "train.idx.images", &buf, &n, &e), -EFBIG);
  cr_assert_null(buf);
  cr_assert_eq(e.code, GS_RESOURCE_EXHAUSTED);
  cr_assert_str_eq(e.field, "train.idx.images");
  cr_assert(strstr(e.msg, "10 bytes") && strstr(e.msg, "9"), "%s", e.msg);
}

Test(file, missing_is_not_found_and_a_directory_is_refused) {
  char p[128];
  snprintf(p, sizeof p, "%s/none", dir);
  uint8_t *buf;
  size_t n;
  gs_err e = {0};
  cr_assert_eq(gs_file_read(p, 100, "job", &buf, &n, &e), -ENOENT);
  cr_assert_eq(e.code, GS_NOT_FOUND);
  cr_assert(strstr(e.msg, p), "%s", e.msg);
  gs_err_clear(&e);
  cr_assert_eq(gs_file_read(dir, 100, "job", &buf, &n, &e), -EINVAL);
  cr_assert_eq(e.code, GS_INVALID_ARGUMENT);
  cr_assert(strstr(e.msg, "is a directory, not a regular file"), "%s", e.msg);
}

/* A writer on the other end of a FIFO: `n` bytes of 'x'. */
typedef struct fifo_writer {
  char path[128];
  size_t n;
} fifo_writer;

static void *write_fifo(void *arg) {
  fifo_writer *w = arg;
  FILE *f = fopen(w->path, "wb");
  for (size_t i = 0; f && i < w->n; i++)
    if (fputc('x', f) == EOF) break; /* the reader stopped at its cap: EPIPE */
  if (f) fclose(f);
  return NULL;
}

static int read_fifo(size_t n, uint64_t max, uint8_t **buf, size_t *len, gs_err *e) {
  fifo_writer w = {.n = n};
  snprintf(w.path, sizeof w.path, "%s/fifo-%zu-%llu", dir, n, (unsigned long long)max);
  cr_assert_eq(mkfifo(w.path, 0600), 0);
  /* A reader that stops at its cap closes the pipe under the writer: the
   * writer must see EPIPE, not die of SIGPIPE. */
  signal(SIGPIPE, SIG_IGN);
  pthread_t t;
  pthread_create(&t, NULL, write_fifo, &w);
  int rc = gs_file_read(w.path, max, "job", buf, len, e);
  pthread_join(t, NULL);
  return rc;
}

Test(file, a_pipe_is_read_to_its_end_within_the_cap) {
  uint8_t *buf;
  size_t n;
  gs_err e = {0};
  cr_assert_eq(read_fifo(200000, 300000, &buf, &n, &e), 0, "%s", e.msg);
  cr_assert_eq(n, 200000);
  cr_assert_eq(buf[0], 'x');
  cr_assert_eq(buf[199999], 'x');
  cr_assert_eq(buf[200000], 0);
  free(buf);
  cr_assert_eq(read_fifo(200000, 1000, &buf, &n, &e), -EFBIG);
  cr_assert_eq(e.code, GS_RESOURCE_EXHAUSTED);
}

Test(error, set_returns_the_codes_errno) {
  gs_err e = {0};
  cr_assert_eq(gs_err_set(&e, GS_INVALID_ARGUMENT, "batch_size", "bad %d", 0), -EINVAL);
  cr_assert_str_eq(e.field, "batch_size");
  cr_assert_str_eq(e.msg, "bad 0");
  cr_assert_eq(gs_err_set(NULL, GS_NOT_FOUND, NULL, "x"), -ENOENT);
  cr_assert_eq(gs_err_set(&e, GS_RESOURCE_EXHAUSTED, NULL, "x"), -ENOSPC);
  cr_assert_eq(gs_err_set(&e, GS_PERMISSION_DENIED, NULL, "x"), -EACCES);
  cr_assert_eq(gs_err_set(&e, GS_OK, NULL, "x"), -EIO);
  cr_assert_eq(gs_code_errno(GS_OK), 0);
  cr_assert_eq(gs_code_errno(99), -EIO);
}
