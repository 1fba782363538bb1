/* test_sched.c: the scheduler as a pure function (control/sched.c): per-vdev
 * queues by priority then age, memory limits with the head of a queue
 * blocking the jobs behind it, max_running across vdevs, executors not
 * ready, vdevs and tenants gone, empty inputs; host data charged once per
 * key (in the limit on the cpu device, in a budget of its own on a GPU);
 * preemption (victims, guards), the shrink choice and the OOM rule. */
#include <criterion/criterion.h>
#include <string.h>

#include "control/sched.h"

#define MiB (1ull << 20)

static gs_sched_decision out[64];
static size_t n_out;

static int64_t now = 10000, min_run = 60, interval = 300;

static void run(const gs_sched_job *jobs, size_t nj, const gs_sched_vdev *vdevs, size_t nv,
                const gs_sched_quota *quotas, size_t nq) {
  gs_sched_input in = {jobs, nj, vdevs, nv, quotas, nq, now, min_run, interval, NULL, 0, NULL};
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
  return (gs_sched_job){id, "alice", vdev, GS_SCHED_QUEUED, prio, at, peak, 0, 0, false, 0, 0, false, false, 0};
}
static gs_sched_job r(uint64_t id, const char *vdev, uint64_t peak) {
  return (gs_sched_job){id, "alice", vdev, GS_SCHED_RUNNING, 0, 1, peak, 0, 0, false, 0, 0, false, false, 0};
}

static const gs_sched_quota alice = {"alice", 0};

Test(sched, empty_inputs) {
  run(NULL, 0, NULL, 0, NULL, 0);
  cr_assert_eq(n_out, 0);
  gs_sched_vdev v = {"v", 100 * MiB, true, true};
  run(NULL, 0, &v, 1, &alice, 1);
  cr_assert_eq(n_out, 0);
  /* Only running jobs: nothing to decide. */
  gs_sched_job j = r(1, "v", 10 * MiB);
  run(&j, 1, &v, 1, &alice, 1);
  cr_assert_eq(n_out, 0);
}

Test(sched, priority_then_age_then_id) {
  gs_sched_vdev v = {"v", 100 * MiB, true, true};
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
  gs_sched_vdev v = {"v", 100 * MiB, true, true};
  gs_sched_job jobs[] = {r(1, "v", 60 * MiB), q(2, "v", 0, 10, 50 * MiB),
                         q(3, "v", 0, 20, 10 * MiB)};
  run(jobs, 3, &v, 1, &alice, 1);
  cr_assert_eq(n_out, 2);
  cr_assert_eq(why_of(2), GS_SCHED_WAIT_MEMORY);
  cr_assert_eq(why_of(3), GS_SCHED_WAIT_BEHIND);
  cr_assert_str_neq(gs_sched_reason_text(GS_SCHED_WAIT_MEMORY), "");
}

Test(sched, fills_the_vdev_then_waits) {
  gs_sched_vdev v = {"v", 100 * MiB, true, true};
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
  gs_sched_vdev v = {"v", 100 * MiB, true, true};
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
  gs_sched_vdev vs[] = {{"a", 100 * MiB, true, true}, {"b", 100 * MiB, true, true}, {"c", 10 * MiB, true, true}};
  gs_sched_quota quotas[] = {{"alice", 1}, {"bob", 0}};
  gs_sched_job jobs[] = {
      q(1, "b", 9, 1, MiB),                                 /* alice, started first: b... */
      q(2, "a", 0, 1, MiB),                                 /* ...no: a comes first */
      {3, "bob", "c", GS_SCHED_QUEUED, 0, 1, 20 * MiB, 0, 0, false, 0, 0, false, false, 0},     /* bob's: too big for c */
      {4, "bob", "c", GS_SCHED_QUEUED, 0, 2, 5 * MiB, 0, 0, false, 0, 0, false, false, 0},
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
  gs_sched_vdev vs[] = {{"down", 100 * MiB, false, true}, {"up", 100 * MiB, true, true}};
  gs_sched_job jobs[] = {q(1, "down", 0, 1, MiB), q(2, "gone", 0, 1, MiB),
                         {3, "carol", "up", GS_SCHED_QUEUED, 0, 1, MiB, 0, 0, false, 0, 0, false, false, 0}, q(4, "up", 0, 2, MiB)};
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

static gs_sched_job qd(uint64_t id, int64_t at, uint64_t peak, uint64_t data, uint64_t key) {
  gs_sched_job j = q(id, "v", 0, at, peak);
  j.data_bytes = data;
  j.data_key = key;
  return j;
}

Test(sched, host_data_counts_in_a_cpu_vdev_once_per_key) {
  gs_sched_vdev v = {"v", 100 * MiB, true, true};
  /* 10 MiB peaks with 30 MiB of data each, all different: two fit (80), a
   * third would need 120. */
  gs_sched_job jobs[] = {qd(1, 1, 10 * MiB, 30 * MiB, 1), qd(2, 2, 10 * MiB, 30 * MiB, 2),
                         qd(3, 3, 10 * MiB, 30 * MiB, 3)};
  run(jobs, 3, &v, 1, &alice, 1);
  cr_assert_eq(why_of(1), GS_SCHED_START);
  cr_assert_eq(why_of(2), GS_SCHED_START);
  cr_assert_eq(why_of(3), GS_SCHED_WAIT_MEMORY);
  /* One key: its copy counts once, so seven fit (30 + 7 x 10 = 100). */
  gs_sched_job same[8];
  for (int i = 0; i < 8; i++) same[i] = qd((uint64_t)i + 1, i, 10 * MiB, 30 * MiB, 7);
  run(same, 8, &v, 1, &alice, 1);
  for (uint64_t id = 1; id <= 7; id++)
    cr_assert_eq(why_of(id), GS_SCHED_START, "job %llu", (unsigned long long)id);
  cr_assert_eq(why_of(8), GS_SCHED_WAIT_MEMORY);
  /* A running job's copy is shared by a queued job of its key. */
  gs_sched_job held[] = {qd(1, 1, 60 * MiB, 30 * MiB, 9), qd(2, 2, 10 * MiB, 30 * MiB, 9),
                         qd(3, 3, 5 * MiB, 10 * MiB, 4)};
  held[0].state = GS_SCHED_RUNNING;
  run(held, 3, &v, 1, &alice, 1);
  cr_assert_eq(why_of(2), GS_SCHED_START);       /* 60 + 30 + 10 = 100 */
  cr_assert_eq(why_of(3), GS_SCHED_WAIT_MEMORY); /* another key: 15 more */
  /* Jobs without data (old records) count their peaks only. */
  gs_sched_job plain[] = {qd(1, 1, 50 * MiB, 0, 0), qd(2, 2, 50 * MiB, 0, 0)};
  run(plain, 2, &v, 1, &alice, 1);
  cr_assert_eq(why_of(2), GS_SCHED_START);
}

Test(sched, host_data_on_a_gpu_vdev_has_a_budget_of_its_own) {
  gs_sched_vdev v = {"v", 100 * MiB, true, false};
  /* Peaks 40 + 40 fit the device; data 60 + 60 is over the host budget. */
  gs_sched_job jobs[] = {qd(1, 1, 40 * MiB, 60 * MiB, 1), qd(2, 2, 40 * MiB, 60 * MiB, 2)};
  run(jobs, 2, &v, 1, &alice, 1);
  cr_assert_eq(why_of(1), GS_SCHED_START);
  cr_assert_eq(why_of(2), GS_SCHED_WAIT_MEMORY);
  /* One key: one copy, both start (peaks 80, data 60). */
  jobs[1].data_key = 1;
  run(jobs, 2, &v, 1, &alice, 1);
  cr_assert_eq(why_of(2), GS_SCHED_START);
  /* The device's bytes still bound the peaks. */
  gs_sched_job big[] = {qd(1, 1, 60 * MiB, MiB, 1), qd(2, 2, 60 * MiB, MiB, 1)};
  run(big, 2, &v, 1, &alice, 1);
  cr_assert_eq(why_of(2), GS_SCHED_WAIT_MEMORY);
}

Test(sched, sums_near_the_top_of_uint64_do_not_wrap) {
  gs_sched_vdev v = {"v", UINT64_MAX - 1, true, true};
  gs_sched_job jobs[] = {qd(1, 1, UINT64_MAX / 2, UINT64_MAX / 2, 1), qd(2, 2, 8, 8, 2)};
  jobs[0].state = GS_SCHED_RUNNING;
  run(jobs, 2, &v, 1, &alice, 1);
  cr_assert_eq(why_of(2), GS_SCHED_WAIT_MEMORY);
  gs_sched_job over[] = {qd(1, 1, UINT64_MAX, 0, 0), qd(2, 2, UINT64_MAX, 0, 0), qd(3, 3, 1, 0, 0)};
  over[0].state = over[1].state = GS_SCHED_RUNNING;
  run(over, 3, &v, 1, &alice, 1);
  cr_assert_eq(why_of(3), GS_SCHED_WAIT_MEMORY);
}

/* ------------------------------------------------------------ preemption --- */

/* A running job of priority prio whose run began at `since`. */
static gs_sched_job rp(uint64_t id, int32_t prio, int64_t since, uint64_t peak) {
  gs_sched_job j = r(id, "v", peak);
  j.priority = prio;
  j.run_started = since;
  j.preemptible = true;
  return j;
}

static bool preempted(uint64_t id, uint64_t for_job) {
  for (size_t i = 0; i < n_out; i++)
    if (out[i].job == id && out[i].why == GS_SCHED_PREEMPT) {
      cr_assert_eq(out[i].for_job, for_job, "job %llu preempted for %llu, not %llu",
                   (unsigned long long)id, (unsigned long long)out[i].for_job,
                   (unsigned long long)for_job);
      return true;
    }
  return false;
}

Test(sched, preempts_lowest_priority_most_recent_fewest) {
  gs_sched_vdev v = {"v", 100 * MiB, true, false};
  /* 90 MiB held by four jobs; job 9 (priority 9) needs 40. */
  gs_sched_job jobs[] = {rp(1, 0, 100, 30 * MiB), rp(2, 0, 500, 20 * MiB),
                         rp(3, 1, 900, 20 * MiB), rp(4, 9, 50, 20 * MiB),
                         q(9, "v", 9, 1000, 40 * MiB)};
  run(jobs, 5, &v, 1, &alice, 1);
  /* Lowest priority first (1 and 2), the most recent of them first (2, then
   * 1): 2 frees 20 (room 30), 1 frees 30 (room 60): 40 fits. Then 2 is given
   * back (room 40 without it still fits), so only 1 stops. */
  cr_assert_eq(why_of(9), GS_SCHED_WAIT_PREEMPTING);
  cr_assert(preempted(1, 9));
  cr_assert_not(preempted(2, 9));
  cr_assert_not(preempted(3, 9));
  cr_assert_not(preempted(4, 9));
  /* Needing 60: two of priority 0 are needed (2 then 1), not the priority-1 one. */
  jobs[4].planned_peak = 60 * MiB;
  run(jobs, 5, &v, 1, &alice, 1);
  cr_assert(preempted(1, 9) && preempted(2, 9));
  cr_assert_not(preempted(3, 9));
  /* Needing 80: priority 0 and 1 all go; the one of equal priority stays. */
  jobs[4].planned_peak = 80 * MiB;
  run(jobs, 5, &v, 1, &alice, 1);
  cr_assert(preempted(1, 9) && preempted(2, 9) && preempted(3, 9));
  cr_assert_not(preempted(4, 9));
  /* Needing 95: even all three lower ones leave only 80: nobody is stopped. */
  jobs[4].planned_peak = 95 * MiB;
  run(jobs, 5, &v, 1, &alice, 1);
  cr_assert_eq(why_of(9), GS_SCHED_WAIT_MEMORY);
  cr_assert_eq(n_out, 1);
}

Test(sched, preemption_guards) {
  gs_sched_vdev v = {"v", 100 * MiB, true, false};
  gs_sched_job jobs[] = {rp(1, 0, now - 10, 80 * MiB), q(9, "v", 9, 1, 50 * MiB)};
  /* Its run began 10 s ago: under the 60 s minimum. */
  run(jobs, 2, &v, 1, &alice, 1);
  cr_assert_eq(why_of(9), GS_SCHED_WAIT_MEMORY);
  jobs[0].run_started = now - 60;
  run(jobs, 2, &v, 1, &alice, 1);
  cr_assert(preempted(1, 9));
  /* Preempted 299 s ago: within the 300 s interval. */
  jobs[0].last_preempted = now - 299;
  run(jobs, 2, &v, 1, &alice, 1);
  cr_assert_eq(why_of(9), GS_SCHED_WAIT_MEMORY);
  jobs[0].last_preempted = now - 300;
  run(jobs, 2, &v, 1, &alice, 1);
  cr_assert(preempted(1, 9));
  /* Not preemptible. */
  jobs[0].preemptible = false;
  run(jobs, 2, &v, 1, &alice, 1);
  cr_assert_eq(why_of(9), GS_SCHED_WAIT_MEMORY);
  /* Equal priority is no reason to stop a job. */
  jobs[0].preemptible = true;
  jobs[0].priority = 9;
  run(jobs, 2, &v, 1, &alice, 1);
  cr_assert_eq(why_of(9), GS_SCHED_WAIT_MEMORY);
  /* One already stopping: the head waits for it, nobody else is chosen. */
  gs_sched_job two[] = {rp(1, 0, 1, 40 * MiB), rp(2, 0, 2, 40 * MiB), q(9, "v", 9, 1, 60 * MiB)};
  two[0].stopping = true;
  run(two, 3, &v, 1, &alice, 1);
  cr_assert_eq(why_of(9), GS_SCHED_WAIT_PREEMPTING);
  cr_assert_not(preempted(2, 9));
  /* Only the head of a queue preempts; the job behind it waits behind it. */
  gs_sched_job three[] = {rp(1, 0, 1, 90 * MiB), q(9, "v", 9, 1, 20 * MiB),
                          q(8, "v", 8, 1, 5 * MiB)};
  run(three, 3, &v, 1, &alice, 1);
  cr_assert(preempted(1, 9));
  cr_assert_eq(why_of(8), GS_SCHED_WAIT_BEHIND);
  /* Another vdev's jobs are never victims. */
  gs_sched_vdev vs[] = {{"v", 100 * MiB, true, false}, {"w", 100 * MiB, true, false}};
  gs_sched_job other = r(2, "w", 90 * MiB);
  other.preemptible = true;
  gs_sched_job four[] = {other, rp(1, 5, 1, 90 * MiB), q(9, "v", 9, 1, 20 * MiB)};
  four[1].preemptible = false;
  run(four, 3, vs, 2, &alice, 1);
  cr_assert_eq(why_of(9), GS_SCHED_WAIT_MEMORY);
  cr_assert_not(preempted(2, 9));
}

Test(sched, preemption_counts_shared_data_once) {
  /* cpu device: data is vdev memory. Victim 1 and keeper 2 share a 30 MiB
   * dataset: stopping 1 frees its peak only, the data stays with 2. */
  gs_sched_vdev v = {"v", 100 * MiB, true, true};
  gs_sched_job a = rp(1, 0, 1, 20 * MiB), b = rp(2, 9, 1, 20 * MiB);
  a.data_bytes = b.data_bytes = 30 * MiB;
  a.data_key = b.data_key = 7;
  gs_sched_job head = q(9, "v", 9, 1, 45 * MiB);
  gs_sched_job jobs[] = {a, b, head};
  run(jobs, 3, &v, 1, &alice, 1);
  /* Held: 20 + 20 + 30 = 70, 30 left; without 1: 50 used, 50 left >= 45. */
  cr_assert(preempted(1, 9));
  jobs[2].planned_peak = 51 * MiB; /* 50 left is not enough: nobody stops */
  run(jobs, 3, &v, 1, &alice, 1);
  cr_assert_eq(why_of(9), GS_SCHED_WAIT_MEMORY);
  cr_assert_not(preempted(1, 9));
}

/* ---------------------------------------------------------------- shrink --- */

Test(sched, shrink_keeps_high_priority_then_oldest) {
  gs_sched_vdev v = {"v", 50 * MiB, true, false};
  gs_sched_job jobs[] = {rp(1, 0, 100, 20 * MiB), rp(2, 5, 300, 20 * MiB),
                         rp(3, 0, 50, 20 * MiB), rp(4, 0, 200, 5 * MiB)};
  bool keep[4];
  gs_err e;
  gs_err_clear(&e);
  cr_assert_eq(gs_sched_shrink(jobs, 4, &v, keep, &e), 0);
  /* 2 (priority 5) first: 20; then by age 3 (50): 40; 1 (100) would be 60:
   * re-planned; 4 (200) fits in the 10 left. */
  cr_assert(keep[1] && keep[2] && keep[3]);
  cr_assert_not(keep[0]);
  /* Everything fits: all kept. */
  v.memory_limit = 65 * MiB;
  cr_assert_eq(gs_sched_shrink(jobs, 4, &v, keep, &e), 0);
  cr_assert(keep[0] && keep[1] && keep[2] && keep[3]);
  /* Nothing fits. */
  v.memory_limit = 4 * MiB;
  cr_assert_eq(gs_sched_shrink(jobs, 4, &v, keep, &e), 0);
  cr_assert_not(keep[0] || keep[1] || keep[2] || keep[3]);
  cr_assert_eq(gs_sched_shrink(NULL, 0, &v, keep, &e), 0);
}

/* ------------------------------------------------------------------- OOM --- */

Test(sched, oom_decisions) {
  gs_sched_oom_in in = {.cause = 0, .auto_fit = true, .retries = 0, .max_retries = 3,
                        .micro_batch = 32};
  cr_assert_eq(gs_sched_oom_decide(&in), GS_SCHED_OOM_SMALLER);
  in.cause = 2; /* FRAGMENTATION: the same */
  cr_assert_eq(gs_sched_oom_decide(&in), GS_SCHED_OOM_SMALLER);
  in.retries = 3; /* used up */
  cr_assert_eq(gs_sched_oom_decide(&in), GS_SCHED_OOM_FAIL);
  in.retries = 0;
  in.micro_batch = 1; /* nothing smaller */
  cr_assert_eq(gs_sched_oom_decide(&in), GS_SCHED_OOM_FAIL);
  in.cause = 1; /* PHYSICAL: requeued whatever else holds */
  cr_assert_eq(gs_sched_oom_decide(&in), GS_SCHED_OOM_REQUEUE);
  in.retries = 50;
  in.auto_fit = false;
  cr_assert_eq(gs_sched_oom_decide(&in), GS_SCHED_OOM_REQUEUE);
  /* Without auto_fit: as the spec asks, while retries last. */
  in.cause = 0;
  in.retries = 0;
  in.micro_batch = 32;
  cr_assert_eq(gs_sched_oom_decide(&in), GS_SCHED_OOM_FAIL);
  in.requeue = true;
  cr_assert_eq(gs_sched_oom_decide(&in), GS_SCHED_OOM_REQUEUE);
  in.retries = 3;
  cr_assert_eq(gs_sched_oom_decide(&in), GS_SCHED_OOM_FAIL);
  in.max_retries = 0;
  in.retries = 0;
  cr_assert_eq(gs_sched_oom_decide(&in), GS_SCHED_OOM_FAIL);
}

/* ------------------------------------------------------- device shortage --- */

Test(sched, physical_wait_preempts_on_the_device) {
  /* Two GROWTH vdevs of 100 MiB on an oversubscribed device of 120 MiB. */
  gs_sched_vdev vs[] = {{"a", 100 * MiB, true, false}, {"b", 100 * MiB, true, false}};
  const char *vdev_dev[] = {"gpu0", "gpu0"};
  gs_sched_device dev = {"gpu0", 120 * MiB, 0};
  gs_sched_job bj = rp(1, 0, 1, 90 * MiB);
  bj.vdev = "b";
  bj.device_bytes = 90 * MiB;
  gs_sched_job head = q(9, "a", 9, 1, 50 * MiB);
  head.physical_wait = true;
  head.device_bytes = 50 * MiB;
  gs_sched_job jobs[] = {bj, head};
  gs_sched_input in = {jobs, 2, vs, 2, &alice, 1, now, min_run, interval, &dev, 1, vdev_dev};
  gs_err e;
  gs_err_clear(&e);
  cr_assert_eq(gs_sched_run(&in, out, &n_out, &e), 0);
  /* 90 + 50 > 120: b's lower-priority job is stopped, on another vdev. */
  cr_assert_eq(why_of(9), GS_SCHED_WAIT_PREEMPTING);
  cr_assert(preempted(1, 9));
  for (size_t i = 0; i < n_out; i++)
    if (out[i].job == 1) cr_assert_str_eq(out[i].vdev, "b");
  /* Not preemptible: it waits for the device. */
  jobs[0].preemptible = false;
  cr_assert_eq(gs_sched_run(&in, out, &n_out, &e), 0);
  cr_assert_eq(why_of(9), GS_SCHED_WAIT_DEVICE);
  /* Room on the device: it starts. */
  jobs[0].device_bytes = 70 * MiB;
  cr_assert_eq(gs_sched_run(&in, out, &n_out, &e), 0);
  cr_assert_eq(why_of(9), GS_SCHED_START);
  /* PREALLOCATE vdevs' regions count whatever runs. */
  dev.fixed = 10 * MiB;
  cr_assert_eq(gs_sched_run(&in, out, &n_out, &e), 0);
  cr_assert_eq(why_of(9), GS_SCHED_WAIT_DEVICE);
  dev.fixed = 0;
  /* A job that did not meet a full device is not held back by it. */
  jobs[0].device_bytes = 90 * MiB;
  jobs[1].physical_wait = false;
  cr_assert_eq(gs_sched_run(&in, out, &n_out, &e), 0);
  cr_assert_eq(why_of(9), GS_SCHED_START);
}
