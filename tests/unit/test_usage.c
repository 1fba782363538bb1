/* test_usage.c: the arithmetic of control/usage.c: one vdev interval split
 * among its running jobs (in use by planned peak, reserved in proportion,
 * idle reserved to no job), steps as a high-water mark, a run's device
 * seconds counted once across reports and restarts, UTC days. The daemon's
 * accrual through the executors' messages, the store and the usage call is
 * in test_rpc. */
#include <criterion/criterion.h>
#include <math.h>

#include "control/usage.h"

#define GiB (1ull << 30)

Test(usage, one_job_uses_its_peak_and_the_whole_reserved) {
  uint64_t peak[] = {GiB / 2};
  double in_use[1], res[1];
  double idle = gs_usage_interval(4.0, 2 * GiB, peak, 1, in_use, res);
  cr_assert_eq(idle, 0);
  cr_assert_float_eq(in_use[0], 2.0, 1e-12); /* 0.5 GiB x 4 s */
  cr_assert_float_eq(res[0], 8.0, 1e-12);    /* 2 GiB x 4 s */
}

Test(usage, reserved_is_split_by_planned_peak) {
  uint64_t peak[] = {GiB, 3 * GiB};
  double in_use[2], res[2];
  double idle = gs_usage_interval(2.0, 8 * GiB, peak, 2, in_use, res);
  cr_assert_eq(idle, 0);
  cr_assert_float_eq(in_use[0], 2.0, 1e-12);
  cr_assert_float_eq(in_use[1], 6.0, 1e-12);
  cr_assert_float_eq(res[0], 4.0, 1e-12);  /* a quarter of 16 GiB-s */
  cr_assert_float_eq(res[1], 12.0, 1e-12);
  cr_assert_float_eq(res[0] + res[1], 16.0, 1e-12, "the shares add up to the vdev's");
}

Test(usage, jobs_without_a_peak_share_equally) {
  uint64_t peak[] = {0, 0, 0, 0};
  double in_use[4], res[4];
  gs_usage_interval(1.0, 4 * GiB, peak, 4, in_use, res);
  for (int i = 0; i < 4; i++) {
    cr_assert_float_eq(res[i], 1.0, 1e-12);
    cr_assert_eq(in_use[i], 0);
  }
}

Test(usage, idle_reserved_goes_to_no_job) {
  cr_assert_float_eq(gs_usage_interval(10.0, GiB, NULL, 0, NULL, NULL), 10.0, 1e-12);
  cr_assert_eq(gs_usage_interval(10.0, 0, NULL, 0, NULL, NULL), 0);
}

Test(usage, steps_count_the_high_water_mark) {
  cr_assert_eq(gs_usage_step_delta(0, 10), 10);
  cr_assert_eq(gs_usage_step_delta(10, 25), 15);
  /* resumed from an older checkpoint: steps 20..25 again count nothing */
  cr_assert_eq(gs_usage_step_delta(25, 20), 0);
  cr_assert_eq(gs_usage_step_delta(25, 25), 0);
  cr_assert_eq(gs_usage_step_delta(25, 30), 5);
}

Test(usage, a_runs_device_seconds_count_once) {
  double seen = 0;
  cr_assert_float_eq(gs_usage_run_delta(&seen, 1.5), 1.5, 1e-12);
  cr_assert_float_eq(gs_usage_run_delta(&seen, 4.0), 2.5, 1e-12);
  cr_assert_eq(gs_usage_run_delta(&seen, 4.0), 0);
  /* a new run (its executor restarted) reports from 0 again: counted whole */
  cr_assert_float_eq(gs_usage_run_delta(&seen, 0.75), 0.75, 1e-12);
  cr_assert_float_eq(gs_usage_run_delta(&seen, 1.0), 0.25, 1e-12);
  cr_assert_float_eq(seen, 1.0, 1e-12);
}

Test(usage, utc_days) {
  cr_assert_eq(gs_usage_day(0), 0);
  cr_assert_eq(gs_usage_day(86399), 0);
  cr_assert_eq(gs_usage_day(86400), 1);
  cr_assert_eq(gs_usage_day(1717113600), 19874); /* 2024-05-31T00:00:00Z */
  cr_assert_eq(gs_usage_day(-1), -1);
}

Test(usage, sums_add) {
  gs_usage_sums a = {1.0, 2.0, 3.0, 4, 5, 6}, b = {0.5, 0.25, 0.125, 1, 2, 1};
  gs_usage_sums_add(&a, &b);
  cr_assert_float_eq(a.device_seconds, 1.5, 1e-12);
  cr_assert_float_eq(a.reserved_gib_s, 2.25, 1e-12);
  cr_assert_float_eq(a.in_use_gib_s, 3.125, 1e-12);
  cr_assert_eq(a.steps, 5);
  cr_assert_eq(a.samples, 7);
  cr_assert_eq(a.preemptions, 7);
}
