/*
 * usage.h: what each job and each tenant used, kept in the store so it
 * survives restarts and kill -9.
 *
 * Per job (and per vdev and UTC day, so a report can start at a date):
 * device-seconds (the executor's own per-step charge, as fair share counts
 * it), GiB-seconds of vdev memory reserved and of memory in use, steps,
 * samples and preemptions. exec_events.c tells this module of each
 * executor report (Stats, Progress, Finished); it accrues in memory and
 * gs_usage_flush, once a second from main.c, before each metrics answer
 * and at exit, integrates up to the moment and writes what accrued since
 * the last flush in one transaction. A kill -9 loses at most that second.
 * At start the stored totals are read back, so totals and the Prometheus
 * counters built on them go on from where they were.
 *
 * The arithmetic is pure (gs_usage_interval, gs_usage_step_delta,
 * gs_usage_run_delta) and unit-tested on its own (test_usage).
 */
#ifndef GS_USAGE_H
#define GS_USAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "control/daemon.h"
#include "control/store.h"
#include "proto/executor.pb-c.h"

#define GS_USAGE_GIB 1073741824.0
#define GS_USAGE_DAY_SECONDS 86400

/* ---- the arithmetic (pure) ---- */

/* One interval of dt seconds of a vdev that held `reserved` bytes while n
 * jobs of planned peaks peaks[i] ran in it: job i used peaks[i] x dt of
 * memory (in_use_gib_s[i]) and is charged reserved x dt in proportion to
 * its peak (reserved_gib_s[i]; equal parts when every peak is 0). Returns
 * the reserved GiB-seconds charged to no job: all of them when n is 0
 * (the vdev held memory while idle, e.g. PREALLOCATE), else 0. */
double gs_usage_interval(double dt, uint64_t reserved, const uint64_t *peaks, size_t n,
                         double *in_use_gib_s, double *reserved_gib_s);
/* Steps a report of step `step` adds when `counted` are counted already:
 * the job's high-water mark moves, so steps run again after a resume from
 * an older checkpoint are not counted twice (their device time is). */
uint64_t gs_usage_step_delta(uint64_t counted, uint64_t step);
/* Device seconds a report of `now` (this run's device time so far) adds
 * when `*seen` of this run are counted; *seen becomes now. A figure below
 * *seen is a new run of the job (its executor restarted), counted whole. */
double gs_usage_run_delta(double *seen, double now);
/* The UTC day of a unix time. */
int64_t gs_usage_day(int64_t unix_s);
void gs_usage_sums_add(gs_usage_sums *to, const gs_usage_sums *add);

/* ---- the daemon's accrual ---- */

/* Create d->usage with the store's totals (after the store is open). */
int gs_usage_init(gs_daemon *d, gs_err *e);
void gs_usage_free(gs_daemon *d);

/* An executor's Stats: each vdev's interval since its last report is
 * charged (its reserved bytes, its running jobs), then its new figures
 * and the jobs now running in it are taken. */
void gs_usage_stats(gs_daemon *d, const Gpushare__Exec__V1__Stats *s);
/* A job's Progress: its device time this run, its step. */
void gs_usage_progress(gs_daemon *d, const Gpushare__Exec__V1__Progress *p);
/* A job's run ended (before its record changes): its vdev's interval up
 * to now, its device time and steps of the run. */
void gs_usage_finished(gs_daemon *d, const Gpushare__Exec__V1__Finished *f);
/* The job was preempted once more. */
void gs_usage_preempted(gs_daemon *d, uint64_t job);

/* Charge every vdev up to now and write what accrued since the last flush
 * in one transaction (kept for the next flush when the store refuses it).
 * 0, or the store's negative errno. */
int gs_usage_flush(gs_daemon *d);

/* Totals over every day, stored and not yet flushed: a job's (false when it
 * has none), a tenant's (its jobs and its vdevs' idle reserved memory), a
 * vdev's. */
bool gs_usage_job(const gs_daemon *d, uint64_t job, gs_usage_sums *out);
void gs_usage_tenant(const gs_daemon *d, const char *tenant, gs_usage_sums *out);
void gs_usage_vdev(const gs_daemon *d, const char *vdev, gs_usage_sums *out);

/* The usage of the days from since_day on, per (tenant, job, vdev) as
 * gs_store_usage_list orders it, with what is not flushed yet added;
 * tenant NULL: every tenant's. *out is malloc'd. */
int gs_usage_report(gs_daemon *d, const char *tenant, int64_t since_day, gs_usage_row **out,
                    size_t *n, gs_err *e);

#endif
