/*
 * loader.c: finding, opening and asking the `cuda` plugin (see loader.h for
 * the search order and why the CUDA backend is a plugin at all).
 *
 * The first candidate file that exists is the one dlopen()ed: a plugin that
 * is there but cannot be loaded (a missing libcudart, a wrong architecture)
 * is reported as such instead of silently trying the next one, so an
 * operator sees the real problem. Only when no candidate exists is the plain
 * name handed to the dynamic linker (LD_LIBRARY_PATH, ld.so.cache). A loaded
 * plugin whose gs_cuda_backend_open answers NULL (no driver, no device) is
 * closed again and its reason returned; a successful one is kept for the
 * life of the process and later calls return the same backend. One mutex
 * makes this safe from any thread.
 */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/loader.h"

#define GS_CUDA_PLUGIN_NAME "libgskernels_cuda.so"

#ifndef GS_INSTALL_LIBDIR
#define GS_INSTALL_LIBDIR "/usr/local/lib/gpushare"
#endif

static pthread_mutex_t loader_mu = PTHREAD_MUTEX_INITIALIZER;
static void *loader_handle;         /* the plugin, once it opened a backend */
static gs_backend *loader_backend;  /* what it returned */
static gs_cuda_info_fn loader_info; /* its device-info entry point, or NULL */

static void say(char *why, size_t why_len, const char *fmt, const char *a, const char *b) {
  if (why && why_len)
    snprintf(why, why_len, fmt, a, b ? b : "");
}

/* dirname of the running executable into dir; false when unknown */
static bool exe_dir(char *dir, size_t len) {
  char path[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
  if (n <= 0)
    return false;
  path[n] = '\0';
  char *slash = strrchr(path, '/');
  if (!slash)
    return false;
  *slash = '\0';
  return (size_t)snprintf(dir, len, "%s", path[0] ? path : "/") < len;
}

/* dlopen path and ask it for the backend; NULL and why on failure */
static gs_backend *open_plugin(const char *path, char *why, size_t why_len) {
  dlerror();
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char *e = dlerror();
    say(why, why_len, "cannot load the CUDA plugin %s: %s", path, e ? e : "unknown error");
    return NULL;
  }
  /* Before any of its entry points is called (dlopen has run its
   * constructors, which register its kernels and nothing more): a plugin
   * built against another contract would be handed arguments it reads
   * otherwise. */
  const uint32_t *abi = dlsym(h, "gs_cuda_plugin_abi");
  if (!abi || *abi != GS_BACKEND_ABI) {
    char msg[96];
    if (abi)
      snprintf(msg, sizeof msg, "backend contract %u, and this gpushare needs %d",
               (unsigned)*abi, GS_BACKEND_ABI);
    else
      snprintf(msg, sizeof msg, "an unversioned backend contract, and this gpushare needs %d",
               GS_BACKEND_ABI);
    say(why, why_len,
        "the CUDA plugin %s was built for %s: install the plugin built with this gpushare",
        path, msg);
    dlclose(h);
    return NULL;
  }
  gs_cuda_open_fn open_fn;
  void *sym = dlsym(h, "gs_cuda_backend_open");
  memcpy(&open_fn, &sym, sizeof open_fn); /* object to function pointer, as POSIX allows */
  if (!open_fn) {
    say(why, why_len, "the CUDA plugin %s has no gs_cuda_backend_open%s", path, "");
    dlclose(h);
    return NULL;
  }
  char reason[512] = "";
  gs_backend *b = open_fn(reason, sizeof reason);
  if (!b) {
    say(why, why_len, "%s", reason[0] ? reason : "CUDA driver not available: no reason given",
        NULL);
    /* Stays loaded: the CUDA runtime may have started threads or
     * registered handlers that must not outlive their code. */
    return NULL;
  }
  sym = dlsym(h, "gs_cuda_plugin_device_info");
  memcpy(&loader_info, &sym, sizeof loader_info);
  loader_handle = h;
  loader_backend = b;
  return b;
}

gs_backend *gs_backend_cuda_load(char *why, size_t why_len) {
  pthread_mutex_lock(&loader_mu);
  gs_backend *b = loader_backend;
  if (b)
    goto done;

  const char *env = getenv("GS_CUDA_PLUGIN");
  if (env && env[0]) {
    if (access(env, F_OK) != 0) {
      char err[128];
      snprintf(err, sizeof err, "%s", strerror(errno));
      say(why, why_len, "no CUDA plugin at GS_CUDA_PLUGIN=%s: %s", env, err);
      goto done;
    }
    b = open_plugin(env, why, why_len);
    goto done;
  }

  char dir[PATH_MAX], cand[6][PATH_MAX + 64];
  int nc = 0;
  if (exe_dir(dir, sizeof dir)) {
    snprintf(cand[nc++], sizeof cand[0], "%s/%s", dir, GS_CUDA_PLUGIN_NAME);
    snprintf(cand[nc++], sizeof cand[0], "%s/kernels/cuda/%s", dir, GS_CUDA_PLUGIN_NAME);
    snprintf(cand[nc++], sizeof cand[0], "%s/../kernels/cuda/%s", dir, GS_CUDA_PLUGIN_NAME);
    snprintf(cand[nc++], sizeof cand[0], "%s/../../kernels/cuda/%s", dir, GS_CUDA_PLUGIN_NAME);
    snprintf(cand[nc++], sizeof cand[0], "%s/../lib/gpushare/%s", dir, GS_CUDA_PLUGIN_NAME);
  }
  snprintf(cand[nc++], sizeof cand[0], "%s/%s", GS_INSTALL_LIBDIR, GS_CUDA_PLUGIN_NAME);
  for (int i = 0; i < nc; i++)
    if (access(cand[i], F_OK) == 0) {
      b = open_plugin(cand[i], why, why_len);
      goto done;
    }

  /* none of ours: the dynamic linker's own search, by name */
  dlerror();
  void *h = dlopen(GS_CUDA_PLUGIN_NAME, RTLD_NOW | RTLD_LOCAL);
  if (h) {
    dlclose(h); /* the second open below finds it again, counted once more */
    b = open_plugin(GS_CUDA_PLUGIN_NAME, why, why_len);
    goto done;
  }
  if (why && why_len) {
    char looked[6 * (PATH_MAX + 64) + 64] = "";
    size_t at = 0;
    for (int i = 0; i < nc && at < sizeof looked; i++)
      at += (size_t)snprintf(looked + at, sizeof looked - at, "%s%s", i ? ", " : "", cand[i]);
    if (at < sizeof looked)
      snprintf(looked + at, sizeof looked - at, "%s%s", nc ? ", " : "",
               "the dynamic linker's path");
    say(why, why_len, "no CUDA plugin found (looked in %s)%s", looked, "");
  }
done:
  pthread_mutex_unlock(&loader_mu);
  return b;
}

int gs_cuda_device_info(gs_backend *b, int index, gs_gpu_info *out) {
  pthread_mutex_lock(&loader_mu);
  gs_cuda_info_fn fn = (b && b == loader_backend) ? loader_info : NULL;
  pthread_mutex_unlock(&loader_mu);
  if (!fn || !out)
    return -ENODEV;
  return fn(index, out);
}

int gs_cuda_device_count(gs_backend *b) {
  gs_gpu_info info;
  int n = 0;
  while (n < 1024 && gs_cuda_device_info(b, n, &info) == 0)
    n++;
  return n;
}
