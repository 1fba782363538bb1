/* test_sched.c: the scheduler as a pure function (control/sched.c): per-vdev
 * queues by priority then age, memory limits with the head of a queue
 * blocking the jobs behind it, max_running across vdevs, executors not
 * ready, vdevs and tenants gone, empty inputs. */
#include <criterion/criterion.h>
#include <string.h>

#include "control/sched.h"

#define MiB (1ull << 20)

static gs_sched_decision out[64];
static size_t n_out;

static void run(const gs_sched_job *jobs, size_t nj, const gs_sched_vdev *vdevs, size_t nv,
                const gs_sched_quota *quotas, size_t nq) {
  gs_sched_input in = {jobs, nj, vdevs, nv, quotas, nq};
  gs_err e;
  gs_err_clear(&e);
  memset(out, 0, sizeof out);
  cr_assert_eq(gs_sched_run(&in, out, &n_out, &e), 0, "%s", e.msg);
}

static gs_sched_reason why_of(uint64_t id) {
  for (size_t i = 0; i < n_out; i++)
    if (out[i].job == id) return out[i].why;
  cr_assert_fail("job %llu has no decision", (unsigned long long)id);
  return GS_SCHED_START;
}

static gs_sched_job q(uint64_t id, const char *vdev, int32_t prio, int64_t at, uint64_t peak) {
  return (gs_sched_job){id, "alice", vdev, GS_SCHED_QUEUED, prio, at, peak};
}
static gs_sched_job r(uint64_t id, const char *vdev, uint64_t peak) {
  return (gs_sched_job){id, "alice", vdev, GS_SCHED_RUNNING, 0, 1, peak};
}

static const gs_sched_quota alice = {"alice", 0};

Test(sched, empty_inputs) {
  run(NULL, 0, NULL, 0, NULL, 0);
  cr_assert_eq(n_out, 0);
  gs_sched_vdev v = {"v", 100 * MiB, true};
  run(NULL, 0, &v, 1, &alice, 1);
  cr_assert_eq(n_out, 0);
  /* Only running jobs: nothing to decide. */
  gs_sched_job j = r(1, "v", 10 * MiB);
  run(&j, 1, &v, 1, &alice, 1);
  cr_assert_eq(n_out, 0);
}

Test(sched, priority_then_age_then_id) {
  gs_sched_vdev v = {"v", 100 * MiB, true};
  gs_sched_job jobs[] = {q(1, "v", 0, 100, MiB), q(2, "v", 5, 200, MiB), q(3, "v", 0, 50, MiB),
                         q(4, "v", 5, 200, MiB), q(5, "v", -1, 1, MiB)};
  run(jobs, 5, &v, 1, &alice, 1);
  cr_assert_eq(n_out, 5);
  uint64_t want[] = {2, 4, 3, 1, 5}; /* priority 5 (id order), then older first, then -1 */
  for (size_t i = 0; i < 5; i++) {
    cr_assert_eq(out[i].job, want[i], "start %zu: job %llu, want %llu", i,
                 (unsigned long long)out[i].job, (unsigned long long)want[i]);
    cr_assert_eq(out[i].why, GS_SCHED_START);
    cr_assert_str_eq(out[i].vdev, "v");
  }
}

Test(sched, head_that_does_not_fit_blocks_smaller_later_ones) {
  /* 60 MiB run; the head (50) does not fit in the 40 left; a later 10 MiB
   * job would, but waits behind it: a large job is never starved. */
  gs_sched_vdev v = {"v", 100 * MiB, true};
  gs_sched_job jobs[] = {r(1, "v", 60 * MiB), q(2, "v", 0, 10, 50 * MiB),
                         q(3, "v", 0, 20, 10 * MiB)};
  run(jobs, 3, &v, 1, &alice, 1);
  cr_assert_eq(n_out, 2);
  cr_assert_eq(why_of(2), GS_SCHED_WAIT_MEMORY);
  cr_assert_eq(why_of(3), GS_SCHED_WAIT_BEHIND);
  cr_assert_str_neq(gs_sched_reason_text(GS_SCHED_WAIT_MEMORY), "");
}

Test(sched, fills_the_vdev_then_waits) {
  gs_sched_vdev v = {"v", 100 * MiB, true};
  gs_sched_job jobs[] = {q(1, "v", 0, 1, 40 * MiB), q(2, "v", 0, 2, 40 * MiB),
                         q(3, "v", 0, 3, 40 * MiB), q(4, "v", 0, 4, 20 * MiB)};
  run(jobs, 4, &v, 1, &alice, 1);
  cr_assert_eq(why_of(1), GS_SCHED_START);
  cr_assert_eq(why_of(2), GS_SCHED_START);
  cr_assert_eq(why_of(3), GS_SCHED_WAIT_MEMORY);
  cr_assert_eq(why_of(4), GS_SCHED_WAIT_BEHIND);
  /* exactly the limit fits */
  gs_sched_job exact[] = {r(1, "v", 70 * MiB), q(2, "v", 0, 1, 30 * MiB)};
  run(exact, 2, &v, 1, &alice, 1);
  cr_assert_eq(why_of(2), GS_SCHED_START);
}

Test(sched, max_running_counts_running_and_started_jobs) {
  gs_sched_vdev v = {"v", 100 * MiB, true};
  gs_sched_quota two = {"alice", 2};
  gs_sched_job jobs[] = {r(1, "v", MiB), q(2, "v", 0, 1, MiB), q(3, "v", 0, 2, MiB)};
  run(jobs, 3, &v, 1, &two, 1);
  cr_assert_eq(why_of(2), GS_SCHED_START);
  cr_assert_eq(why_of(3), GS_SCHED_WAIT_MAX_RUNNING);
  /* 0 is no limit */
  gs_sched_quota none = {"alice", 0};
  run(jobs, 3, &v, 1, &none, 1);
  cr_assert_eq(why_of(3), GS_SCHED_START);
}

Test(sched, several_vdevs_in_order_max_running_across_them) {
  gs_sched_vdev vs[] = {{"a", 100 * MiB, true}, {"b", 100 * MiB, true}, {"c", 10 * MiB, true}};
  gs_sched_quota quotas[] = {{"alice", 1}, {"bob", 0}};
  gs_sched_job jobs[] = {
      q(1, "b", 9, 1, MiB),                                 /* alice, started first: b... */
      q(2, "a", 0, 1, MiB),                                 /* ...no: a comes first */
      {3, "bob", "c", GS_SCHED_QUEUED, 0, 1, 20 * MiB},     /* bob's: too big for c */
      {4, "bob", "c", GS_SCHED_QUEUED, 0, 2, 5 * MiB},
  };
  run(jobs, 4, vs, 3, quotas, 2);
  cr_assert_eq(n_out, 4);
  cr_assert_eq(out[0].job, 2); /* vdev a's queue runs before b's */
  cr_assert_eq(out[0].why, GS_SCHED_START);
  cr_assert_eq(why_of(1), GS_SCHED_WAIT_MAX_RUNNING); /* alice's one slot went in a */
  cr_assert_eq(why_of(3), GS_SCHED_WAIT_MEMORY);
  cr_assert_eq(why_of(4), GS_SCHED_WAIT_BEHIND);
  /* the running bytes of one vdev do not count in another */
  gs_sched_job other[] = {r(1, "a", 100 * MiB), q(2, "b", 0, 1, 100 * MiB)};
  gs_sched_quota free_ = {"alice", 0};
  run(other, 2, vs, 2, &free_, 1);
  cr_assert_eq(why_of(2), GS_SCHED_START);
}

Test(sched, executor_not_ready_vdev_and_tenant_gone) {
  gs_sched_vdev vs[] = {{"down", 100 * MiB, false}, {"up", 100 * MiB, true}};
  gs_sched_job jobs[] = {q(1, "down", 0, 1, MiB), q(2, "gone", 0, 1, MiB),
                         {3, "carol", "up", GS_SCHED_QUEUED, 0, 1, MiB}, q(4, "up", 0, 2, MiB)};
  run(jobs, 4, vs, 2, &alice, 1);
  cr_assert_eq(n_out, 4);
  cr_assert_eq(why_of(1), GS_SCHED_WAIT_EXECUTOR);
  cr_assert_eq(why_of(2), GS_SCHED_WAIT_NO_VDEV);
  cr_assert_eq(why_of(3), GS_SCHED_WAIT_NO_TENANT);
  cr_assert_eq(why_of(4), GS_SCHED_WAIT_BEHIND); /* behind carol's, as one queue */
  /* starts come first in the output, waits after */
  gs_sched_job two[] = {q(1, "down", 0, 1, MiB), q(5, "up", 0, 1, MiB)};
  run(two, 2, vs, 2, &alice, 1);
  cr_assert_eq(out[0].job, 5);
  cr_assert_eq(out[0].why, GS_SCHED_START);
  cr_assert_eq(out[1].why, GS_SCHED_WAIT_EXECUTOR);
}
