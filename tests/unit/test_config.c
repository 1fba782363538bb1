/*
 * test_config.c: gpushared.conf as an operator writes it, and as they
 * mistype it.
 *
 * Each test writes a file in a temporary directory and loads it into a
 * gs_config. Valid files must set exactly what they say; each kind of
 * mistake must be refused with the file and line, the key, the value and
 * what is allowed, and must leave the configuration as it was, since a
 * SIGHUP reload relies on that.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "control/config.h"

static char tmpdir[64];
static char cfgpath[128];

static void setup(void) {
  unsetenv("GPUSHARE_SOCKET");
  snprintf(tmpdir, sizeof tmpdir, "/tmp/gs-config-XXXXXX");
  cr_assert_not_null(mkdtemp(tmpdir), "mkdtemp: %s", strerror(errno));
  snprintf(cfgpath, sizeof cfgpath, "%s/gpushared.conf", tmpdir);
}

static void teardown(void) {
  unlink(cfgpath);
  rmdir(tmpdir);
}

TestSuite(config, .init = setup, .fini = teardown);

static void write_file(const char *text) {
  FILE *f = fopen(cfgpath, "w");
  cr_assert_not_null(f);
  cr_assert_eq(fputs(text, f) >= 0, 1);
  cr_assert_eq(fclose(f), 0);
}

/* Load text over defaults, expecting a refusal: the config must be
   untouched, the field must be "PATH:LINE key" and msg must contain each of
   the given words. */
/* text loads over the defaults into *c. */
static void load_ok(const char *text, gs_config *c) {
  write_file(text);
  gs_config_defaults(c);
  gs_err e;
  gs_err_clear(&e);
  cr_assert_eq(gs_config_load(cfgpath, c, &e), 0, "%s: %s", e.field, e.msg);
}

static void expect_refusal(const char *text, unsigned line, const char *key,
                           const char *word1, const char *word2) {
  write_file(text);
  gs_config c, before;
  gs_config_defaults(&c);
  before = c;
  gs_err e;
  gs_err_clear(&e);
  cr_assert_lt(gs_config_load(cfgpath, &c, &e), 0, "accepted:\n%s", text);
  cr_assert_eq(memcmp(&c, &before, sizeof c), 0, "config changed by a refused file");
  cr_assert_eq(e.code, GS_INVALID_ARGUMENT);
  char want[256];
  snprintf(want, sizeof want, "%s:%u%s%s", cfgpath, line, key[0] ? " " : "", key);
  cr_assert_str_eq(e.field, want);
  cr_assert_not_null(strstr(e.msg, word1), "msg \"%s\" lacks \"%s\"", e.msg, word1);
  if (word2)
    cr_assert_not_null(strstr(e.msg, word2), "msg \"%s\" lacks \"%s\"", e.msg, word2);
}

Test(config, defaults) {
  gs_config c;
  gs_config_defaults(&c);
  cr_assert_str_eq(c.socket_path, "/run/gpushared.sock");
  cr_assert_str_eq(c.state_dir, "/var/lib/gpushared");
  cr_assert_str_eq(c.socket_group, "gpushare");
  cr_assert_eq(c.socket_mode, 0660);
  cr_assert_str_eq(c.admin_group, "gpushare-admin");
  cr_assert_eq(c.cpu_memory, 0);
  cr_assert_eq(c.gpu_reserve, 1ull << 30);
  cr_assert_eq(c.cpu_threads, 0);
  cr_assert_eq(c.max_connections, 256);
  cr_assert_eq(c.max_connections_per_uid, 32);
  cr_assert_eq(c.admin_reserved_connections, 8);
  cr_assert_eq(c.max_inflight, 64);
  cr_assert_eq(c.idle_timeout_s, 600);
  cr_assert_eq(c.idle_timeout_norole_s, 10);
  cr_assert_eq(c.frame_timeout_s, 10);
  cr_assert_eq(c.max_frame, 16ull << 20);
  cr_assert_eq(c.max_pending_frame_bytes, 64ull << 20);
  cr_assert_eq(c.max_upload, 1ull << 30);
  cr_assert_eq(c.max_tenant_datasets, 16ull << 30);
  cr_assert_eq(c.max_job_spec, 1ull << 20);
  cr_assert_str_eq(c.log_level, "info");
}

Test(config, socket_default_from_environment) {
  gs_config c;
  setenv("GPUSHARE_SOCKET", "/tmp/gs-test.sock", 1);
  gs_config_defaults(&c);
  cr_assert_str_eq(c.socket_path, "/tmp/gs-test.sock");
  char longp[200];
  memset(longp, 'a', sizeof longp - 1);
  longp[0] = '/';
  longp[sizeof longp - 1] = '\0';
  setenv("GPUSHARE_SOCKET", longp, 1);
  gs_config_defaults(&c);
  cr_assert_str_eq(c.socket_path, "/run/gpushared.sock", "a path no socket can bind is ignored");
}

Test(config, full_file) {
  write_file("# gpushared.conf written by an operator\n"
             "\n"
             "socket_path = /run/gs/alt.sock\n"
             "state_dir=/srv/gpushared\n"
             "  socket_group   =  ml-users  \n"
             "socket_mode = 0600\n"
             "\tadmin_group = ml-admins\r\n"
             "cpu_memory = 8GiB\n"
             "gpu_reserve = 512MiB\n"
             "   # an indented comment\n"
             "cpu_threads = 12\n"
             "memory_oversubscribe = yes\n"
             "max_connections = 1024\n"
             "max_connections_per_uid = 16\n"
             "admin_reserved_connections = 0\n"
             "max_inflight = 8\n"
             "idle_timeout_s = 0\n"
             "idle_timeout_norole_s = 0\n"
             "frame_timeout_s = 3600\n"
             "max_frame = 4MiB\n"
             "max_pending_frame_bytes = 4MiB\n"
             "max_upload = 2.5GB\n"
             "max_tenant_datasets = 100GiB\n"
             "max_job_spec = 64KiB\n"
             "log_level = debug"); /* no newline at the end */
  gs_config c;
  gs_config_defaults(&c);
  gs_err e;
  gs_err_clear(&e);
  cr_assert_eq(gs_config_load(cfgpath, &c, &e), 0, "%s: %s", e.field, e.msg);
  cr_assert_str_eq(c.socket_path, "/run/gs/alt.sock");
  cr_assert_str_eq(c.state_dir, "/srv/gpushared");
  cr_assert_str_eq(c.socket_group, "ml-users");
  cr_assert_eq(c.socket_mode, 0600);
  cr_assert_str_eq(c.admin_group, "ml-admins");
  cr_assert_eq(c.cpu_memory, 8ull << 30);
  cr_assert_eq(c.gpu_reserve, 512ull << 20);
  cr_assert_eq(c.cpu_threads, 12);
  cr_assert_eq(c.memory_oversubscribe, 1);
  cr_assert_eq(c.max_connections, 1024);
  cr_assert_eq(c.max_connections_per_uid, 16);
  cr_assert_eq(c.admin_reserved_connections, 0);
  cr_assert_eq(c.max_inflight, 8);
  cr_assert_eq(c.idle_timeout_s, 0);
  cr_assert_eq(c.idle_timeout_norole_s, 0);
  cr_assert_eq(c.frame_timeout_s, 3600);
  cr_assert_eq(c.max_frame, 4ull << 20);
  cr_assert_eq(c.max_pending_frame_bytes, 4ull << 20);
  cr_assert_eq(c.max_upload, 2500000000ull);
  cr_assert_eq(c.max_tenant_datasets, 100ull << 30);
  cr_assert_eq(c.max_job_spec, 64ull << 10);
  cr_assert_str_eq(c.log_level, "debug");
}

Test(config, partial_file_keeps_other_values) {
  write_file("log_level = warn\n");
  gs_config c;
  gs_config_defaults(&c);
  c.max_inflight = 7; /* a value a previous load set */
  cr_assert_eq(gs_config_load(cfgpath, &c, NULL), 0);
  cr_assert_str_eq(c.log_level, "warn");
  cr_assert_eq(c.max_inflight, 7);
}

Test(config, empty_file) {
  write_file("");
  gs_config c, d;
  gs_config_defaults(&c);
  d = c;
  cr_assert_eq(gs_config_load(cfgpath, &c, NULL), 0);
  cr_assert_eq(memcmp(&c, &d, sizeof c), 0);
}

Test(config, unknown_key) {
  expect_refusal("log_level = info\nmax_jobs = 4\n", 2, "max_jobs", "unknown key \"max_jobs\"",
                 "max_inflight");
  /* The list of allowed keys is whole: the last ones are not cut off. */
  expect_refusal("max_jobs = 4\n", 1, "max_jobs", "max_job_spec", "log_level");
}

Test(config, bad_size) {
  expect_refusal("max_upload = 12XB\n", 1, "max_upload", "12XB", NULL);
  expect_refusal("gpu_reserve = -1GiB\n", 1, "gpu_reserve", "-1GiB", NULL);
  expect_refusal("max_frame = 32MiB\n", 1, "max_frame", "32MiB", "16.00 MiB");
  expect_refusal("max_frame = 100\n", 1, "max_frame", "\"100\"", "2.00 MiB to 16.00 MiB");
  expect_refusal("max_upload = 0\n", 1, "max_upload", "at least 1 B", NULL);
}

Test(config, dataset_and_spec_limits) {
  expect_refusal("max_tenant_datasets = 0\n", 1, "max_tenant_datasets", "\"0\" is too small",
                 "max_tenant_datasets must be at least 1 B");
  expect_refusal("max_tenant_datasets = lots\n", 1, "max_tenant_datasets",
                 "max_tenant_datasets: ", "lots");
  expect_refusal("max_job_spec = 512\n", 1, "max_job_spec", "\"512\" is out of range",
                 "max_job_spec allows 1.00 KiB to 16.00 MiB");
  expect_refusal("max_job_spec = 17MiB\n", 1, "max_job_spec", "17MiB", "1.00 KiB to 16.00 MiB");
  expect_refusal("log_level = info\nmax_job_spec = 4KiB\nmax_job_spec = 8KiB\n", 3,
                 "max_job_spec", "set again (first on line 2)", NULL);
  /* The bounds themselves are allowed. */
  gs_config c;
  load_ok("max_job_spec = 1KiB\nmax_tenant_datasets = 1\n", &c);
  cr_assert_eq(c.max_job_spec, 1024);
  cr_assert_eq(c.max_tenant_datasets, 1);
  load_ok("max_job_spec = 16MiB\n", &c);
  cr_assert_eq(c.max_job_spec, 16ull << 20);
}

/* The limits that keep one local user from locking others out: each bound
   of its own, then the pairs checked together (whatever the line order),
   each refusal naming the key, the value and what is allowed. */
Test(config, connection_limits) {
  expect_refusal("max_connections_per_uid = 0\n", 1, "max_connections_per_uid", "\"0\"",
                 "max_connections_per_uid takes a whole number from 1 to 1000000");
  expect_refusal("admin_reserved_connections = -1\n", 1, "admin_reserved_connections", "\"-1\"",
                 "from 0 to 999999");
  expect_refusal("frame_timeout_s = 0\n", 1, "frame_timeout_s", "\"0\"",
                 "frame_timeout_s takes a whole number from 1 to 3600");
  expect_refusal("frame_timeout_s = 3601\n", 1, "frame_timeout_s", "3601", "1 to 3600");
  expect_refusal("idle_timeout_norole_s = 10s\n", 1, "idle_timeout_norole_s", "\"10s\"",
                 "from 0 to 31536000");
  expect_refusal("max_pending_frame_bytes = 1MiB\n", 1, "max_pending_frame_bytes", "\"1MiB\"",
                 "at least 2.00 MiB");
  expect_refusal("max_pending_frame_bytes = many\n", 1, "max_pending_frame_bytes",
                 "max_pending_frame_bytes: ", "many");
  /* The reserve must leave room for others: here it is the later line... */
  expect_refusal("max_connections = 8\nadmin_reserved_connections = 8\n", 2,
                 "admin_reserved_connections", "admin_reserved_connections 8 with max_connections 8",
                 "allowed: admin_reserved_connections from 0 to max_connections - 1 (7)");
  /* ...here max_connections, set below the default reserve of 8. */
  expect_refusal("log_level = info\nmax_connections = 4\n", 2, "max_connections",
                 "admin_reserved_connections 8 with max_connections 4", "(3)");
  expect_refusal("admin_reserved_connections = 20\nmax_connections = 10\n", 2,
                 "max_connections", "admin_reserved_connections 20", NULL);
  /* One frame of the largest size must fit the budget. */
  expect_refusal("max_pending_frame_bytes = 8MiB\n", 1, "max_pending_frame_bytes",
                 "max_pending_frame_bytes 8.00 MiB is less than max_frame 16.00 MiB",
                 "allowed: max_pending_frame_bytes from max_frame up");
  expect_refusal("max_pending_frame_bytes = 4MiB\nmax_frame = 8MiB\n", 2, "max_frame",
                 "less than max_frame 8.00 MiB", NULL);
  /* The bounds themselves are allowed. */
  gs_config c;
  load_ok("max_connections = 1\nadmin_reserved_connections = 0\nmax_connections_per_uid = 1\n"
          "frame_timeout_s = 1\nidle_timeout_norole_s = 0\nmax_frame = 2MiB\n"
          "max_pending_frame_bytes = 2MiB\n",
          &c);
  cr_assert_eq(c.max_connections, 1);
  cr_assert_eq(c.admin_reserved_connections, 0);
  cr_assert_eq(c.max_connections_per_uid, 1);
  cr_assert_eq(c.frame_timeout_s, 1);
  cr_assert_eq(c.idle_timeout_norole_s, 0);
  cr_assert_eq(c.max_pending_frame_bytes, 2ull << 20);
  load_ok("max_connections = 1000000\nadmin_reserved_connections = 999999\n"
          "max_connections_per_uid = 1000000\nframe_timeout_s = 3600\n",
          &c);
  cr_assert_eq(c.admin_reserved_connections, 999999);
}

Test(config, bad_mode) {
  expect_refusal("socket_mode = 660\n", 1, "socket_mode", "\"660\"", "leading 0");
  expect_refusal("socket_mode = 0990\n", 1, "socket_mode", "0990", "0777");
  expect_refusal("socket_mode = 01777\n", 1, "socket_mode", "01777", NULL);
  expect_refusal("socket_mode = 0660 # group rw\n", 1, "socket_mode", "0660 # group rw", NULL);
}

Test(config, bad_number) {
  expect_refusal("max_connections = 0\n", 1, "max_connections", "from 1", NULL);
  expect_refusal("cpu_threads = four\n", 1, "cpu_threads", "\"four\"", "whole number");
  expect_refusal("max_inflight = -3\n", 1, "max_inflight", "-3", NULL);
  expect_refusal("idle_timeout_s = 99999999999999999999999\n", 1, "idle_timeout_s",
                 "99999999999999999999999", NULL);
}

Test(config, booleans) {
  const char *yes[] = {"yes", "true", "on", "1"}, *no[] = {"no", "false", "off", "0"};
  for (int i = 0; i < 4; i++) {
    char text[64];
    gs_config c;
    gs_config_defaults(&c);
    cr_assert_eq(c.memory_oversubscribe, 0, "memory_oversubscribe defaults to no");
    snprintf(text, sizeof text, "memory_oversubscribe = %s\n", yes[i]);
    write_file(text);
    cr_assert_eq(gs_config_load(cfgpath, &c, NULL), 0, "%s", text);
    cr_expect_eq(c.memory_oversubscribe, 1, "%s", text);
    snprintf(text, sizeof text, "memory_oversubscribe = %s\n", no[i]);
    write_file(text);
    cr_assert_eq(gs_config_load(cfgpath, &c, NULL), 0, "%s", text);
    cr_expect_eq(c.memory_oversubscribe, 0, "%s", text);
  }
  expect_refusal("memory_oversubscribe = maybe\n", 1, "memory_oversubscribe", "\"maybe\"",
                 "yes or no");
  expect_refusal("memory_oversubscribe = YES\n", 1, "memory_oversubscribe", "\"YES\"", NULL);
}

Test(config, missing_equals) {
  expect_refusal("\n# comment\nlog_level debug\n", 3, "", "no '='", "log_level debug");
  expect_refusal(" = debug\n", 1, "", "no key", NULL);
}

Test(config, value_too_long) {
  char text[400];
  char longp[200];
  memset(longp, 'a', sizeof longp - 1);
  longp[0] = '/';
  longp[sizeof longp - 1] = '\0';
  snprintf(text, sizeof text, "socket_path = %s\n", longp);
  expect_refusal(text, 1, "socket_path", "199 bytes", "at most 107");
  snprintf(text, sizeof text, "admin_group = %.100s\n", longp + 1);
  expect_refusal(text, 1, "admin_group", "at most 63", NULL);
}

Test(config, bad_strings) {
  expect_refusal("log_level = verbose\n", 1, "log_level", "verbose", "error, warn, info, debug");
  expect_refusal("state_dir = var/lib/gs\n", 1, "state_dir", "absolute", NULL);
  expect_refusal("socket_group = ml users\n", 1, "socket_group", "\"ml users\"", "group name");
  expect_refusal("admin_group = -x\n", 1, "admin_group", "not first", NULL);
  expect_refusal("admin_group =\n", 1, "admin_group", "empty value", NULL);
}

Test(config, duplicate_key) {
  expect_refusal("log_level = info\n\nlog_level = debug\n", 3, "log_level", "first on line 1",
                 NULL);
}

Test(config, unchanged_after_late_error) {
  /* Valid lines before the error must not leak into the result. */
  write_file("log_level = debug\nmax_inflight = 3\nsocket_mode = 0666\nbogus = 1\n");
  gs_config c, before;
  gs_config_defaults(&c);
  before = c;
  gs_err e;
  gs_err_clear(&e);
  cr_assert_lt(gs_config_load(cfgpath, &c, &e), 0);
  cr_assert_eq(memcmp(&c, &before, sizeof c), 0);
  cr_assert_str_eq(c.log_level, "info");
  cr_assert_eq(c.max_inflight, 64);
}

Test(config, missing_file) {
  gs_config c, before;
  gs_config_defaults(&c);
  before = c;
  gs_err e;
  gs_err_clear(&e);
  cr_assert_lt(gs_config_load(cfgpath, &c, &e), 0);
  cr_assert_eq(errno, ENOENT);
  cr_assert_eq(e.code, GS_NOT_FOUND, "a missing file must be told apart from a bad one");
  cr_assert_str_eq(e.field, cfgpath);
  cr_assert_eq(memcmp(&c, &before, sizeof c), 0);
}

Test(config, long_path_keeps_line_and_key) {
  /* e.field is 160 bytes: with a long path, the line and key must survive. */
  char dir[256];
  snprintf(dir, sizeof dir, "%s/", tmpdir);
  size_t n = strlen(dir);
  memset(dir + n, 'd', 180);
  dir[n + 180] = '\0';
  cr_assert_eq(mkdir(dir, 0700), 0, "mkdir: %s", strerror(errno));
  char path[300];
  snprintf(path, sizeof path, "%s/c.conf", dir);
  FILE *f = fopen(path, "w");
  cr_assert_not_null(f);
  fputs("bogus = 1\n", f);
  fclose(f);
  gs_config c;
  gs_config_defaults(&c);
  gs_err e;
  gs_err_clear(&e);
  int rc = gs_config_load(path, &c, &e);
  unlink(path);
  rmdir(dir);
  cr_assert_lt(rc, 0);
  size_t fl = strlen(e.field);
  cr_assert_lt(fl, sizeof e.field);
  cr_assert_str_eq(e.field + fl - strlen("d/c.conf:1 bogus"), "d/c.conf:1 bogus");
  cr_assert_eq(strncmp(e.field, "...", 3), 0);
}

Test(config, restart_needed) {
  gs_config a, b;
  gs_config_defaults(&a);
  b = a;
  cr_assert_null(gs_config_restart_needed(&a, &b));
  /* Live keys: a reload applies them, no restart. */
  snprintf(b.admin_group, sizeof b.admin_group, "ops");
  snprintf(b.log_level, sizeof b.log_level, "debug");
  b.max_connections = 5;
  b.max_connections_per_uid = 5;
  b.admin_reserved_connections = 1;
  b.max_inflight = 5;
  b.idle_timeout_s = 5;
  b.idle_timeout_norole_s = 1;
  b.frame_timeout_s = 1;
  b.max_pending_frame_bytes = 1 << 30;
  b.max_frame = 1 << 20;
  b.max_upload = 1 << 20;
  b.max_tenant_datasets = 1 << 20;
  b.max_job_spec = 4096;
  cr_assert_null(gs_config_restart_needed(&a, &b));
  /* Fixed keys. */
  snprintf(b.socket_path, sizeof b.socket_path, "/run/other.sock");
  b.cpu_threads = 4;
  b.socket_mode = 0600;
  char *s = gs_config_restart_needed(&a, &b);
  cr_assert_not_null(s);
  cr_assert_str_eq(s, "socket_path (/run/gpushared.sock -> /run/other.sock), socket_mode "
                      "(0660 -> 0600), cpu_threads (0 -> 4)");
  free(s);
  b = a;
  b.gpu_reserve = 0;
  snprintf(b.state_dir, sizeof b.state_dir, "/srv/gs");
  snprintf(b.socket_group, sizeof b.socket_group, "x");
  b.cpu_memory = 1;
  s = gs_config_restart_needed(&a, &b);
  cr_assert_not_null(s);
  cr_assert_not_null(strstr(s, "state_dir"));
  cr_assert_not_null(strstr(s, "socket_group"));
  cr_assert_not_null(strstr(s, "cpu_memory (0 -> 1)"));
  cr_assert_not_null(strstr(s, "gpu_reserve (1073741824 -> 0)"));
  free(s);
}
