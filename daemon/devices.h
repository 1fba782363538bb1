/*
 * devices.h: the physical devices gpushared splits into vdevs.
 *
 * The `cpu` device is always there: the embedded default, with usable memory
 * from the config (cpu_memory; default half of RAM), so the daemon, its tests
 * and its demo run on any machine. GPUs join the list where the CUDA plugin
 * loads and a driver answers; each reports total memory from the driver and
 * usable = total minus gpu_reserve (contexts, cuBLAS workspaces).
 */
#ifndef GS_DEVICES_H
#define GS_DEVICES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "gs_error.h"

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

#endif
