/*
 * test_cuda_load.c: the CUDA plugin loader on machines with and without
 * CUDA. gpushared and gpushare-run call gs_backend_cuda_load at start; on a
 * machine without a plugin, a driver or a GPU it must answer NULL with one
 * line that says which, and never crash, so the daemon falls back to the
 * cpu backend and tells the operator why.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/loader.h"

/* The build tree's plugin, when CMake built one (kernels/CMakeLists.txt). */
static const char *built_plugin(void) {
  const char *p = getenv("GS_TEST_CUDA_PLUGIN");
  return p && p[0] && access(p, F_OK) == 0 ? p : NULL;
}

Test(cuda_load, missing_file_names_the_path) {
  setenv("GS_CUDA_PLUGIN", "/nonexistent/gpushare/libgskernels_cuda.so", 1);
  char why[512] = "";
  gs_backend *b = gs_backend_cuda_load(why, sizeof why);
  cr_assert_null(b);
  cr_expect(strstr(why, "/nonexistent/gpushare/libgskernels_cuda.so") != NULL, "why: %s", why);
  cr_expect(strstr(why, "No such file") != NULL, "why: %s", why);
}

Test(cuda_load, not_a_shared_object) {
  char path[] = "/tmp/gs_cuda_plugin_XXXXXX";
  int fd = mkstemp(path);
  cr_assert(fd >= 0);
  cr_assert_eq(write(fd, "not an ELF file\n", 16), 16);
  close(fd);
  setenv("GS_CUDA_PLUGIN", path, 1);
  char why[512] = "";
  gs_backend *b = gs_backend_cuda_load(why, sizeof why);
  unlink(path);
  cr_assert_null(b);
  cr_expect(strstr(why, "cannot load the CUDA plugin") != NULL, "why: %s", why);
  cr_expect(strstr(why, path) != NULL, "why: %s", why);
}

/* A plugin built against another backend contract, or before contracts had
 * a version, is refused before any of its code runs, with both versions. */
static void expect_refused(const char *env, const char *says) {
  const char *p = getenv(env);
  if (!p || !p[0] || access(p, F_OK) != 0)
    cr_skip_test("%s names no fake plugin (ctest sets it, kernels/CMakeLists.txt)", env);
  setenv("GS_CUDA_PLUGIN", p, 1);
  char why[1024] = "";
  gs_backend *b = gs_backend_cuda_load(why, sizeof why);
  cr_assert_null(b);
  cr_expect(strstr(why, p) != NULL, "names the plugin: %s", why);
  cr_expect(strstr(why, says) != NULL, "says '%s': %s", says, why);
  char need[64];
  snprintf(need, sizeof need, "this gpushare needs %d", GS_BACKEND_ABI);
  cr_expect(strstr(why, need) != NULL, "says '%s': %s", need, why);
  cr_expect(strstr(why, "gs_cuda_backend_open ran") == NULL, "never called: %s", why);
  cr_expect(strchr(why, '\n') == NULL, "one line: %s", why);
}

Test(cuda_load, plugin_of_another_contract_is_refused) {
  expect_refused("GS_TEST_FAKE_PLUGIN_OTHER", "was built for backend contract 999");
}

Test(cuda_load, plugin_without_a_contract_version_is_refused) {
  expect_refused("GS_TEST_FAKE_PLUGIN_UNVERSIONED", "was built for an unversioned backend");
}

/* The plugin CMake built (or none): a backend only where a GPU answers,
 * else NULL and a reason of one of the documented kinds. */
Test(cuda_load, built_plugin_answers_or_explains) {
  const char *p = built_plugin();
  if (p)
    setenv("GS_CUDA_PLUGIN", p, 1);
  else
    unsetenv("GS_CUDA_PLUGIN");
  char why[512] = "";
  gs_backend *b = gs_backend_cuda_load(why, sizeof why);
  if (!b) {
    cr_expect(why[0] != '\0', "a NULL backend comes with a reason");
    cr_expect(strchr(why, '\n') == NULL, "one line: %s", why);
    bool known = strstr(why, "no CUDA plugin found (looked in ") ||
                 strstr(why, "CUDA driver not available: ") || strstr(why, "no CUDA device: ") ||
                 strstr(why, "cannot load the CUDA plugin ") ||
                 strstr(why, " was built for "); /* an installed plugin of another contract */
    cr_expect(known, "why: %s", why);
    if (p) /* the plugin is there: the reason is about the driver, not the file */
      cr_expect(strstr(why, "no CUDA plugin found") == NULL, "why: %s", why);
    cr_expect_eq(gs_cuda_device_count(b), 0);
    cr_log_info("no CUDA backend here: %s", why);
    return;
  }
  cr_expect_str_eq(b->name, "cuda");
  cr_expect(gs_backend_cuda_load(why, sizeof why) == b, "opened once, the same backend after");
  int n = gs_cuda_device_count(b);
  cr_expect(n >= 1);
  gs_gpu_info info;
  cr_assert_eq(gs_cuda_device_info(b, 0, &info), 0);
  cr_expect(info.name[0] != '\0');
  cr_expect(info.major >= 1 && info.total_bytes > 0, "cc %d.%d, %llu bytes", info.major,
            info.minor, (unsigned long long)info.total_bytes);
  cr_expect_eq(gs_cuda_device_info(b, n, &info), -ENODEV);
  uint64_t total = 0, fr = 0;
  cr_expect_eq(b->device_memory(b, 0, &total, &fr), 0);
  cr_expect(total > 0 && fr <= total);
}

Test(cuda_load, search_without_env_does_not_crash) {
  unsetenv("GS_CUDA_PLUGIN");
  char why[8]; /* a short buffer: the reason is cut, never overrun */
  memset(why, 'x', sizeof why);
  gs_backend *b = gs_backend_cuda_load(why, sizeof why);
  if (!b)
    cr_expect(memchr(why, '\0', sizeof why) != NULL, "terminated");
  cr_expect(gs_backend_cuda_load(NULL, 0) == b, "no reason buffer is fine too");
}

Test(cuda_load, device_info_of_other_backends) {
  gs_gpu_info info;
  cr_expect_eq(gs_cuda_device_info(NULL, 0, &info), -ENODEV);
  cr_expect_eq(gs_cuda_device_info(gs_backend_cpu(), 0, &info), -ENODEV);
  cr_expect_eq(gs_cuda_device_count(gs_backend_cpu()), 0);
}
