/*
 * devices.h: the physical devices gpushared splits into vdevs.
 *
 * The `cpu` device is always there: the embedded default, with usable memory
 * from the config (cpu_memory; default half of RAM), so the daemon, its tests
 * and its demo run on any machine. GPUs join the list where the CUDA plugin
 * loads and a driver answers; each reports total memory from the driver and
 * usable = total minus gpu_reserve (contexts, cuBLAS workspaces), or what
 * the executor found free once a context, a cuBLASLt handle and a first
 * matmul existed, when that is less.
 */
#ifndef GS_DEVICES_H
#define GS_DEVICES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "control/config.h"

typedef struct gs_device {
  char name[32];     /* "cpu", "gpu0", ... */
  char kind[8];      /* "cpu" or "cuda" */
  char model[128];   /* CPU model name, GPU product name */
  char compute_capability[8]; /* "9.0" on a GPU, "" on the CPU */
  uint64_t total;    /* physical bytes */
  uint64_t usable;   /* bytes vdev limits may add up to */
  bool oversubscribed;
  unsigned threads;  /* CPU: threads the device may use in all */
} gs_device;

#define GS_DEVICES_MAX 17

typedef struct gs_devices {
  gs_device dev[GS_DEVICES_MAX];
  size_t n;
} gs_devices;

/* Discover devices; fails only when the config asks for more CPU memory
 * than the machine has. */
int gs_devices_discover(const gs_config *c, gs_devices *out, gs_err *e);
const gs_device *gs_devices_find(const gs_devices *d, const char *name);
/* Is a vdev's memory on the device named `name` host memory (the cpu
 * device), so that its jobs' dataset bytes count in the vdev's limit? On a
 * GPU they are bounded apart, by a host budget of the same size. */
bool gs_device_data_in_memory(const char *name);
/* Add the GPUs that `EXE --list-devices` (gpushare-executor, which loads the
 * CUDA plugin; the control plane never does) reports, as gpu0, gpu1, ...
 * with usable = min(total - gpu_reserve, free after a first matmul). Returns how many were added; with none,
 * why says why (no plugin, no driver, no device), for one line of log. */
int gs_devices_probe_gpus(const gs_config *c, const char *exe, gs_devices *d, char *why,
                          size_t why_len);

#endif
