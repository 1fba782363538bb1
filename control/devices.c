/* devices.c: see devices.h. */
#include "control/devices.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
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

bool gs_device_data_in_memory(const char *name) { return !strcmp(name, "cpu"); }

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

/* One line of `gpushare-executor --list-devices` into a device:
 * gpu INDEX TOTAL MAJOR.MINOR FREE NAME (FREE: what a first job would find
 * free, 0 when unmeasured; an executor from before it printed none). */
static int gpu_line(const gs_config *c, char *line, gs_device *g) {
  char *f[6] = {0};
  char *save = NULL, *p = line;
  for (int i = 0; i < 5; i++) {
    f[i] = strtok_r(p, i < 4 ? "\t" : "\n", &save);
    p = NULL;
    if (!f[i]) return -1;
  }
  char *end;
  unsigned long long free_bytes = 0;
  char *tab = strchr(f[4], '\t');
  if (tab) { /* FREE, then the name */
    *tab = '\0';
    errno = 0;
    free_bytes = strtoull(f[4], &end, 10);
    if (errno || *end) return -1;
    f[4] = tab + 1;
  }
  errno = 0;
  long idx = strtol(f[1], &end, 10);
  if (errno || *end || idx < 0 || idx >= GS_DEVICES_MAX - 1) return -1;
  unsigned long long total = strtoull(f[2], &end, 10);
  if (errno || *end || total == 0) return -1;
  memset(g, 0, sizeof *g);
  snprintf(g->name, sizeof g->name, "gpu%ld", idx);
  snprintf(g->kind, sizeof g->kind, "cuda");
  snprintf(g->model, sizeof g->model, "%s", f[4]);
  snprintf(g->compute_capability, sizeof g->compute_capability, "%.7s", f[3]);
  g->total = total;
  g->usable = total > c->gpu_reserve ? total - c->gpu_reserve : 0;
  /* gpu_reserve guesses what the context and cuBLASLt hold; where the
   * executor measured what is left after them (and after whatever other
   * processes hold), the smaller figure is what vdevs can have. */
  if (free_bytes && free_bytes < g->usable) g->usable = free_bytes;
  g->oversubscribed = c->memory_oversubscribe != 0;
  g->threads = 2; /* host threads of a GPU job: it queues kernels, the GPU computes */
  return 0;
}

int gs_devices_probe_gpus(const gs_config *c, const char *exe, gs_devices *d, char *why,
                          size_t why_len) {
  snprintf(why, why_len, "no GPU found");
  int fds[2];
  if (pipe(fds) < 0) {
    snprintf(why, why_len, "cannot ask %s for GPUs: pipe: %s", exe, strerror(errno));
    return 0;
  }
  pid_t pid = fork();
  if (pid < 0) {
    snprintf(why, why_len, "cannot ask %s for GPUs: fork: %s", exe, strerror(errno));
    close(fds[0]);
    close(fds[1]);
    return 0;
  }
  if (pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    close(fds[0]);
    close(fds[1]);
    execl(exe, exe, "--list-devices", (char *)NULL);
    _exit(127);
  }
  close(fds[1]);
  FILE *f = fdopen(fds[0], "r");
  int added = 0;
  char line[1024];
  bool said = false;
  while (f && fgets(line, sizeof line, f)) {
    if (!strncmp(line, "unavailable\t", 12)) {
      line[strcspn(line, "\n")] = '\0';
      snprintf(why, why_len, "%s", line + 12);
      said = true;
      continue;
    }
    if (d->n >= GS_DEVICES_MAX) break;
    if (!strncmp(line, "gpu\t", 4) && gpu_line(c, line, &d->dev[d->n]) == 0) {
      d->n++;
      added++;
    }
  }
  if (f)
    fclose(f);
  else
    close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!said && !added) {
    if (WIFEXITED(status) && WEXITSTATUS(status) == 127)
      snprintf(why, why_len, "cannot run %s --list-devices", exe);
    else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
      snprintf(why, why_len, "%s --list-devices failed (status %d)", exe, status);
  }
  return added;
}
