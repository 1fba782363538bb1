/* devices.c: see devices.h. */
#include "devices.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static void cpu_model(char *buf, size_t len) {
  snprintf(buf, len, "CPU");
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f) return;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, "model name", 10) == 0) {
      char *v = strchr(line, ':');
      if (v) {
        v++;
        while (*v == ' ' || *v == '\t') v++;
        v[strcspn(v, "\n")] = '\0';
        snprintf(buf, len, "%s", v);
      }
      break;
    }
  }
  fclose(f);
}

int gs_devices_discover(const gs_config *c, gs_devices *out, gs_err *e) {
  memset(out, 0, sizeof *out);
  gs_device *cpu = &out->dev[out->n++];
  snprintf(cpu->name, sizeof cpu->name, "cpu");
  snprintf(cpu->kind, sizeof cpu->kind, "cpu");
  cpu_model(cpu->model, sizeof cpu->model);
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  cpu->total = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
  cpu->usable = c->cpu_memory ? c->cpu_memory : cpu->total / 2;
  if (cpu->usable > cpu->total)
    return gs_err_set(e, GS_INVALID_ARGUMENT, "cpu_memory",
                      "cpu_memory is %" PRIu64 " bytes but this machine has %" PRIu64
                      " bytes of RAM",
                      cpu->usable, cpu->total);
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  cpu->threads = c->cpu_threads ? c->cpu_threads : (unsigned)(cores > 0 ? cores : 1);
  cpu->oversubscribed = c->memory_oversubscribe != 0;
  return 0;
}

const gs_device *gs_devices_find(const gs_devices *d, const char *name) {
  for (size_t i = 0; i < d->n; i++)
    if (strcmp(d->dev[i].name, name) == 0) return &d->dev[i];
  return NULL;
}
