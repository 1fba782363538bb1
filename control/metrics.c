/*
 * metrics.c: the Prometheus text exposition of the daemon's state: devices,
 * executors, vdevs (limits, and what their executors last reported),
 * tenants (and what they used, usage.c), jobs by state, requests served.
 * Read-only: it looks at the store, the job table, the usage totals and the
 * executors' last reports, and changes nothing.
 */
#include "control/metrics.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "control/exec_events.h"
#include "control/job.h"
#include "control/store.h"
#include "control/usage.h"

typedef struct text {
  char *buf;
  size_t len, cap;
  bool failed;
} text;

__attribute__((format(printf, 2, 3))) static void tprintf(text *t, const char *fmt, ...) {
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(t->buf ? t->buf + t->len : NULL, t->buf ? t->cap - t->len : 0, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if (t->buf && t->len + (size_t)n < t->cap) {
      t->len += (size_t)n;
      return;
    }
    size_t cap = (t->cap ? t->cap * 2 : 8192) + (size_t)n;
    char *p = realloc(t->buf, cap);
    if (!p) {
      t->failed = true;
      return;
    }
    t->buf = p;
    t->cap = cap;
  }
}

static void metric(text *t, const char *name, const char *type, const char *help) {
  tprintf(t, "# HELP gpushare_%s %s\n# TYPE gpushare_%s %s\n", name, help, name, type);
}

/* A gauge of bytes per job that has not ended: its planned peak, or its
 * datasets' host bytes. */
static void job_bytes(text *t, const gs_jobs *J, const char *name, const char *help, bool data) {
  metric(t, name, "gauge", help);
  for (uint64_t x = 0; J && x < J->cap; x++) {
    const gs_job *j = J->by_id[x];
    if (j && !gs_job_final(j->rec->state))
      tprintf(t, "gpushare_%s{job=\"%" PRIu64 "\",tenant=\"%s\",vdev=\"%s\"} %" PRIu64 "\n", name,
              j->rec->id, j->rec->tenant, j->rec->vdev,
              data ? j->rec->data_bytes : j->rec->planned_peak_bytes);
  }
}

int gs_metrics_text(gs_daemon *d, char **out, gs_err *e) {
  *out = NULL;
  const gs_jobs *J = d->jobs;
  text t = {0};
  gs_vdev *vdevs = NULL;
  size_t nv = 0;
  gs_tenant *tenants = NULL;
  size_t nt = 0;
  if (gs_store_vdev_list(d->store, &vdevs, &nv, e) < 0) return gs_err_rc(e);
  if (gs_store_tenant_list(d->store, &tenants, &nt, e) < 0) {
    free(vdevs);
    return gs_err_rc(e);
  }
  metric(&t, "device_memory_total_bytes", "gauge", "Physical memory of the device.");
  for (size_t i = 0; i < d->devices.n; i++)
    tprintf(&t, "gpushare_device_memory_total_bytes{device=\"%s\"} %" PRIu64 "\n", d->devices.dev[i].name, d->devices.dev[i].total);
  metric(&t, "device_memory_usable_bytes", "gauge", "Memory of the device that vdev limits may add up to.");
  for (size_t i = 0; i < d->devices.n; i++)
    tprintf(&t, "gpushare_device_memory_usable_bytes{device=\"%s\"} %" PRIu64 "\n", d->devices.dev[i].name, d->devices.dev[i].usable);
  metric(&t, "device_memory_allocated_bytes", "gauge", "Sum of the memory limits of the device's vdevs.");
  for (size_t i = 0; i < d->devices.n; i++) {
    gs_device_usage u = {0};
    gs_store_device_usage(d->store, d->devices.dev[i].name, &u, NULL);
    tprintf(&t, "gpushare_device_memory_allocated_bytes{device=\"%s\"} %" PRIu64 "\n", d->devices.dev[i].name, u.memory);
  }
  metric(&t, "executor_restarts_total", "counter", "Times the device's executor was restarted after dying.");
  for (size_t i = 0; i < d->devices.n; i++)
    tprintf(&t, "gpushare_executor_restarts_total{device=\"%s\"} %" PRIu32 "\n", d->devices.dev[i].name,
            gs_exec_events_restarts(d, i));

  static const struct { const char *name, *type, *help; } vm[] = {
      {"vdev_memory_limit_bytes", "gauge", "Memory limit of the vdev."},
      {"vdev_memory_in_use_bytes", "gauge", "Bytes of the vdev's live tensors."},
      {"vdev_memory_reserved_bytes", "gauge", "Bytes the vdev holds from its device."},
      {"vdev_memory_peak_bytes", "gauge", "Peak bytes in use in the vdev."},
      {"vdev_device_seconds_total", "counter",
       "Device time the vdev's jobs used, kept across restarts."},
      {"vdev_steps_total", "counter", "Optimizer steps run in the vdev."},
      {"vdev_queue_length", "gauge", "Jobs queued in the vdev."},
      {"vdev_running_jobs", "gauge", "Jobs running in the vdev."},
      {"vdev_largest_free_bytes", "gauge",
       "Largest block one allocation in the vdev could get now: of its region (PREALLOCATE), "
       "or of its regions and what its limit leaves unreserved (GROWTH, device permitting)."},
      {"vdev_fragmentation_ratio", "gauge",
       "Share of the vdev's free bytes (limit less in use) that no single allocation can "
       "take: 1 - largest free / free, 0..1."},
  };
  for (size_t k = 0; k < sizeof vm / sizeof vm[0]; k++) {
    metric(&t, vm[k].name, vm[k].type, vm[k].help);
    for (size_t i = 0; i < nv; i++) {
      gs_vdev_live live, *l = &live;
      gs_exec_events_vdev_live(d, vdevs[i].name, &live);
      if (k >= 8 && !l->has_free) continue; /* not known: no sample */
      uint64_t queued = 0, running = 0;
      for (uint64_t x = 0; J && x < J->cap; x++) {
        gs_job *j = J->by_id[x];
        if (!j || strcmp(j->rec->vdev, vdevs[i].name)) continue;
        queued += gs_job_waiting(j->rec->state);
        running += j->rec->state == GPUSHARE__V1__JOB_STATE__RUNNING;
      }
      tprintf(&t, "gpushare_%s{vdev=\"%s\",device=\"%s\",tenant=\"%s\"} ", vm[k].name, vdevs[i].name,
              vdevs[i].device, vdevs[i].tenant);
      switch (k) {
      case 0: tprintf(&t, "%" PRIu64 "\n", vdevs[i].memory_limit); break;
      case 1: tprintf(&t, "%" PRIu64 "\n", l->in_use); break;
      case 2: tprintf(&t, "%" PRIu64 "\n", l->reserved); break;
      case 3: tprintf(&t, "%" PRIu64 "\n", l->peak); break;
      case 4:
      case 5: { /* kept in the store: monotone across restarts */
        gs_usage_sums u;
        gs_usage_vdev(d, vdevs[i].name, &u);
        if (k == 4) tprintf(&t, "%.3f\n", u.device_seconds);
        else tprintf(&t, "%" PRIu64 "\n", u.steps);
        break;
      }
      case 6: tprintf(&t, "%" PRIu64 "\n", queued); break;
      case 7: tprintf(&t, "%" PRIu64 "\n", running); break;
      case 8: tprintf(&t, "%" PRIu64 "\n", l->largest_free); break;
      default: tprintf(&t, "%.6f\n", l->fragmentation); break;
      }
    }
  }
  /* From the job records, which the store keeps: monotone across restarts. */
  for (int k = 0; k < 2; k++) {
    if (k)
      metric(&t, "job_oom_comebacks_total", "counter",
             "Run-time OOMs the vdev's jobs were requeued or re-planned after instead of failing.");
    else
      metric(&t, "job_preemptions_total", "counter",
             "Times the vdev's jobs were stopped with a checkpoint for a higher-priority job or "
             "a shrink.");
    for (size_t i = 0; i < nv; i++) {
      uint64_t n = 0;
      for (uint64_t x = 0; J && x < J->cap; x++) {
        const gs_job *j = J->by_id[x];
        if (j && !strcmp(j->rec->vdev, vdevs[i].name))
          n += k ? j->rec->oom_retries : j->rec->preemptions;
      }
      tprintf(&t, "gpushare_job_%s_total{vdev=\"%s\"} %" PRIu64 "\n",
              k ? "oom_comebacks" : "preemptions", vdevs[i].name, n);
    }
  }
  metric(&t, "tenant_memory_quota_bytes", "gauge", "Memory quota of the tenant (0: unlimited).");
  for (size_t i = 0; i < nt; i++)
    tprintf(&t, "gpushare_tenant_memory_quota_bytes{tenant=\"%s\"} %" PRIu64 "\n", tenants[i].name, tenants[i].quota.memory);
  metric(&t, "tenant_memory_allocated_bytes", "gauge", "Sum of the memory limits of the tenant's vdevs.");
  for (size_t i = 0; i < nt; i++)
    tprintf(&t, "gpushare_tenant_memory_allocated_bytes{tenant=\"%s\"} %" PRIu64 "\n", tenants[i].name, tenants[i].memory_allocated);
  static const struct { const char *name, *help; } um[] = {
      {"tenant_device_seconds_total", "Device time the tenant's jobs used."},
      {"tenant_reserved_gib_seconds_total",
       "GiB-seconds of vdev memory reserved for the tenant, its jobs' shares and idle."},
      {"tenant_in_use_gib_seconds_total", "GiB-seconds of memory the tenant's running jobs held."},
      {"tenant_steps_total", "Optimizer steps of the tenant's jobs."},
      {"tenant_samples_total", "Training samples of the tenant's jobs' steps."},
      {"tenant_preemptions_total", "Times the tenant's jobs were preempted."},
  };
  for (size_t k = 0; k < sizeof um / sizeof um[0]; k++) {
    metric(&t, um[k].name, "counter", um[k].help);
    for (size_t i = 0; i < nt; i++) {
      gs_usage_sums u;
      gs_usage_tenant(d, tenants[i].name, &u);
      tprintf(&t, "gpushare_%s{tenant=\"%s\"} ", um[k].name, tenants[i].name);
      switch (k) {
      case 0: tprintf(&t, "%.3f\n", u.device_seconds); break;
      case 1: tprintf(&t, "%.3f\n", u.reserved_gib_s); break;
      case 2: tprintf(&t, "%.3f\n", u.in_use_gib_s); break;
      case 3: tprintf(&t, "%" PRIu64 "\n", u.steps); break;
      case 4: tprintf(&t, "%" PRIu64 "\n", u.samples); break;
      default: tprintf(&t, "%" PRIu32 "\n", u.preemptions); break;
      }
    }
  }
  metric(&t, "tenant_jobs", "gauge", "Jobs of the tenant by state.");
  for (size_t i = 0; i < nt; i++)
    for (int s = 0; s < GS_JOB_STATES; s++) {
      uint64_t n = 0;
      for (uint64_t x = 0; J && x < J->cap; x++)
        n += J->by_id[x] && (int)gs_job_told_state(J->by_id[x]) == s && !strcmp(J->by_id[x]->rec->tenant, tenants[i].name);
      tprintf(&t, "gpushare_tenant_jobs{tenant=\"%s\",state=\"%s\"} %" PRIu64 "\n", tenants[i].name, gs_job_state_name(s), n);
    }
  metric(&t, "jobs", "gauge", "Jobs by state.");
  for (int s = 0; s < GS_JOB_STATES; s++) {
    uint64_t n = 0;
    for (uint64_t x = 0; J && x < J->cap; x++) n += J->by_id[x] && (int)gs_job_told_state(J->by_id[x]) == s;
    tprintf(&t, "gpushare_jobs{state=\"%s\"} %" PRIu64 "\n", gs_job_state_name(s), n);
  }
  metric(&t, "jobs_unsaved", "gauge",
         "Jobs whose latest record the store could not take yet (disk full, I/O error); "
         "written again every second.");
  tprintf(&t, "gpushare_jobs_unsaved %" PRIu64 "\n", J ? J->unsaved : 0);
  metric(&t, "job_step", "gauge", "Optimizer steps done by the job.");
  for (uint64_t x = 0; J && x < J->cap; x++) {
    gs_job *j = J->by_id[x];
    if (j && j->rec->state == GPUSHARE__V1__JOB_STATE__RUNNING)
      tprintf(&t, "gpushare_job_step{job=\"%" PRIu64 "\",tenant=\"%s\",vdev=\"%s\"} %" PRIu64 "\n", j->rec->id,
              j->rec->tenant, j->rec->vdev, j->rec->step);
  }
  job_bytes(&t, J, "job_planned_peak_bytes", "Planned peak memory of the job.", false);
  job_bytes(&t, J, "job_data_bytes", "Host bytes of the job's datasets, charged to its vdev.", true);
  metric(&t, "job_host_memory_bytes", "gauge",
         "Host bytes the job's run holds in its executor, as it last reported: its datasets' "
         "copy (shared with the jobs on the same sets), batch staging, a checkpoint being "
         "written; 0 while it does not run.");
  for (uint64_t x = 0; J && x < J->cap; x++) {
    const gs_job *j = J->by_id[x];
    if (j && !gs_job_final(j->rec->state))
      tprintf(&t, "gpushare_job_host_memory_bytes{job=\"%" PRIu64 "\",tenant=\"%s\",vdev=\"%s\"} %" PRIu64 "\n",
              j->rec->id, j->rec->tenant, j->rec->vdev,
              j->mem_known && j->placed >= 0 ? j->mem_host : 0);
  }
  metric(&t, "requests_total", "counter", "Requests served on the control socket since start.");
  tprintf(&t, "gpushare_requests_total %" PRIu64 "\n", d->requests);
  free(vdevs);
  gs_tenant_list_free(tenants, nt);
  if (t.failed) {
    free(t.buf);
    return gs_err_set(e, GS_INTERNAL, "", "out of memory");
  }
  *out = t.buf ? t.buf : strdup("");
  if (!*out) return gs_err_set(e, GS_INTERNAL, "", "out of memory");
  return 0;
}
