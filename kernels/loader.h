/*
 * loader.h: finding and opening the `cuda` backend, a plugin.
 *
 * The CUDA backend lives in its own shared library, libgskernels_cuda.so,
 * so that gpushared, gpushare-run and the tests link and start on machines
 * without CUDA: nothing of CUDA is loaded until gs_backend_cuda_load asks
 * for it, and a machine without the plugin, without a driver or without a
 * GPU gets NULL and one line saying which, never a crash. The daemon then
 * uses the `cpu` backend and says why.
 *
 * Where the plugin is looked for, first found wins:
 *   1. $GS_CUDA_PLUGIN, a path to the .so (only there, when it is set);
 *   2. the running executable's directory;
 *   3. its kernels/cuda, ../kernels/cuda and ../../kernels/cuda (the build
 *      tree: build/bin/gpushared, gpushare-run and the tests reach
 *      build/kernels/cuda/libgskernels_cuda.so);
 *   4. its ../lib/gpushare (an installed tree: /usr/bin/gpushared reaches
 *      /usr/lib/gpushare/libgskernels_cuda.so, whatever the prefix it was
 *      configured with), then the configured one (GS_INSTALL_LIBDIR, the
 *      install library directory's gpushare/, e.g. /usr/local/lib/gpushare);
 *   5. the plain name, through the dynamic linker's own search.
 * The plugin is opened once per process and stays loaded (the CUDA runtime
 * does not support being unloaded while contexts exist); later calls return
 * the same backend.
 *
 * The plugin exports three C symbols:
 *   const uint32_t gs_cuda_plugin_abi;   (GS_BACKEND_ABI when it was built)
 *   gs_backend *gs_cuda_backend_open(char *why, size_t why_len);
 *   int gs_cuda_plugin_device_info(int index, gs_gpu_info *out);
 * A plugin whose gs_cuda_plugin_abi is missing or not this build's
 * GS_BACKEND_ABI is refused before any of its entry points is called, with
 * a reason that names both versions.
 */
#ifndef GS_KERNELS_LOADER_H
#define GS_KERNELS_LOADER_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What the daemon lists about one GPU (gpuctl devices). */
typedef struct gs_gpu_info {
  char name[256];          /* product name, "NVIDIA H200" */
  int major, minor;        /* compute capability, 9.0 */
  uint64_t total_bytes;    /* device memory */
  int multiprocessors;     /* SM count */
  char pci_bus_id[32];     /* "0000:01:00.0" */
} gs_gpu_info;

/* The CUDA backend, or NULL with a one-line reason in why (why may be NULL
 * when why_len is 0): "no CUDA plugin found (looked in ...)", "cannot load
 * the CUDA plugin PATH: ...", "CUDA driver not available: ...", "no CUDA
 * device: ...". Thread-safe. */
gs_backend *gs_backend_cuda_load(char *why, size_t why_len);

/* GPU `index` of the loaded CUDA backend b: 0, or -ENODEV past the last one
 * (or when b is not the loaded CUDA backend), or another negative error. */
int gs_cuda_device_info(gs_backend *b, int index, gs_gpu_info *out);
/* How many GPUs b has (0 when b is not the loaded CUDA backend). */
int gs_cuda_device_count(gs_backend *b);

/* Entry points the plugin exports (dlsym names above). */
typedef gs_backend *(*gs_cuda_open_fn)(char *why, size_t why_len);
typedef int (*gs_cuda_info_fn)(int index, gs_gpu_info *out);

#ifdef __cplusplus
}
#endif

#endif
