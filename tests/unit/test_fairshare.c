/*
 * test_fairshare.c: compute shares across the vdevs of one device.
 *
 * Each test runs "jobs" as threads that acquire the device, hold it for a
 * few microseconds of real time and release it with a SIMULATED step
 * duration, so the accounting the scheduler sees is exact and the assertions
 * are about the order of turns and the ratio of device seconds, never about
 * wall-clock time. Every test also checks that only one step is ever on the
 * device at once. The tests that count turns use a grace of 0.5 s, so a
 * worker the kernel is slow to reschedule on a loaded machine keeps its
 * vdev's claim, as a real job's few milliseconds between steps do.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <time.h>
#include <unistd.h>

#include "executor/fairshare.h"

#define MAX_GRANTS 200000

static atomic_int g_inside;        /* steps on the device right now */
static atomic_int g_overlap;       /* times two steps were on the device */
static int g_seq[MAX_GRANTS];      /* vdev slot of each grant, in order */
static atomic_int g_nseq;
static atomic_bool g_stop;

typedef struct worker {
  gs_fairshare *fs;
  int slot;
  double step_s;     /* simulated duration of one step */
  uint64_t limit;    /* stop after this many steps (0: until g_stop) */
  bool join;         /* join/leave around the loop */
  uint64_t done;     /* steps this job did */
  double seconds;    /* device seconds this job was charged */
  pthread_t th;
} worker;

static void tiny_work(void) {
  struct timespec ts = {0, 20000}; /* 20 us: the thread really holds the device */
  nanosleep(&ts, NULL);
}

static void *run_worker(void *arg) {
  worker *w = arg;
  if (w->join) gs_fairshare_join(w->fs, w->slot);
  while (!atomic_load(&g_stop) && (!w->limit || w->done < w->limit)) {
    gs_fairshare_acquire(w->fs, w->slot);
    if (atomic_fetch_add(&g_inside, 1) != 0) atomic_fetch_add(&g_overlap, 1);
    int i = atomic_fetch_add(&g_nseq, 1);
    if (i < MAX_GRANTS) g_seq[i] = w->slot;
    tiny_work();
    atomic_fetch_sub(&g_inside, 1);
    gs_fairshare_release(w->fs, w->slot, w->step_s);
    w->done++;
    w->seconds += w->step_s;
  }
  if (w->join) gs_fairshare_leave(w->fs, w->slot);
  return NULL;
}

static void start(worker *w) { cr_assert_eq(pthread_create(&w->th, NULL, run_worker, w), 0); }
static void finish(worker *w) { pthread_join(w->th, NULL); }

static void reset(void) {
  atomic_store(&g_inside, 0);
  atomic_store(&g_overlap, 0);
  atomic_store(&g_nseq, 0);
  atomic_store(&g_stop, false);
}

static void wait_grants(int n) {
  struct timespec ts = {0, 1000000};
  while (atomic_load(&g_nseq) < n) nanosleep(&ts, NULL);
}

static uint64_t slot_steps(gs_fairshare *fs, int slot) {
  gs_fairshare_stats st;
  cr_assert_eq(gs_fairshare_stats_get(fs, slot, &st), 0);
  return st.steps;
}

Test(fairshare, shares_75_25_split_device_time_3_to_1, .timeout = 120) {
  reset();
  gs_fairshare *fs;
  cr_assert_eq(gs_fairshare_create(0.5, 0, &fs), 0);
  int a, b;
  cr_assert_eq(gs_fairshare_add(fs, 75, &a), 0);
  cr_assert_eq(gs_fairshare_add(fs, 25, &b), 0);
  /* Different step lengths: the share is of device time, not of steps. */
  worker wa = {.fs = fs, .slot = a, .step_s = 0.001, .join = true};
  worker wb = {.fs = fs, .slot = b, .step_s = 0.003, .join = true};
  /* Both join before either steps, so both are busy for the whole run. */
  gs_fairshare_join(fs, a);
  gs_fairshare_join(fs, b);
  wa.join = wb.join = false;
  start(&wa);
  start(&wb);
  wait_grants(4000);
  atomic_store(&g_stop, true);
  finish(&wa);
  finish(&wb);
  gs_fairshare_leave(fs, a);
  gs_fairshare_leave(fs, b);
  gs_fairshare_stats sa, sb;
  gs_fairshare_stats_get(fs, a, &sa);
  gs_fairshare_stats_get(fs, b, &sb);
  double ratio = sa.device_seconds / sb.device_seconds;
  cr_log_info("75/25: device seconds %.3f / %.3f = %.3f, steps %llu / %llu", sa.device_seconds,
              sb.device_seconds, ratio, (unsigned long long)sa.steps,
              (unsigned long long)sb.steps);
  cr_expect_float_eq(ratio, 3.0, 0.09, "device time ratio %.3f, want 3 within 3%%", ratio);
  /* 1 ms vs 3 ms steps: 9 steps of a for every step of b. */
  cr_expect_float_eq((double)sa.steps / (double)sb.steps, 9.0, 0.45);
  cr_expect_eq(atomic_load(&g_overlap), 0, "two steps were on the device at once");
  gs_fairshare_destroy(fs);
}

/* With a 10 ms slice the device changes hands about every 10 ms of steps,
 * not at every step, and the split is still 3:1. */
Test(fairshare, slices_keep_the_shares_and_switch_less, .timeout = 120) {
  reset();
  gs_fairshare *fs;
  cr_assert_eq(gs_fairshare_create(0.5, 0.01, &fs), 0);
  int a, b;
  cr_assert_eq(gs_fairshare_add(fs, 75, &a), 0);
  cr_assert_eq(gs_fairshare_add(fs, 25, &b), 0);
  gs_fairshare_join(fs, a);
  gs_fairshare_join(fs, b);
  worker wa = {.fs = fs, .slot = a, .step_s = 0.001};
  worker wb = {.fs = fs, .slot = b, .step_s = 0.001};
  start(&wa);
  start(&wb);
  wait_grants(8000);
  atomic_store(&g_stop, true);
  finish(&wa);
  finish(&wb);
  gs_fairshare_leave(fs, a);
  gs_fairshare_leave(fs, b);
  int n = atomic_load(&g_nseq);
  int switches = 0;
  for (int i = 1; i < n; i++) switches += g_seq[i] != g_seq[i - 1];
  double ratio = wa.seconds / wb.seconds;
  cr_log_info("slices: %d grants, %d switches, device time ratio %.3f", n, switches, ratio);
  cr_expect_float_eq(ratio, 3.0, 0.09, "device time ratio %.3f", ratio);
  /* 1 ms steps in 10 ms slices: a switch every 10 steps at most (the per-step
   * schedule switches every 2 of 4 grants). */
  cr_expect_leq(switches, n / 8, "%d switches in %d grants", switches, n);
  cr_expect_eq(atomic_load(&g_overlap), 0);
  gs_fairshare_destroy(fs);
}

Test(fairshare, jobs_of_one_vdev_take_turns, .timeout = 120) {
  reset();
  gs_fairshare *fs;
  cr_assert_eq(gs_fairshare_create(0.5, 0, &fs), 0);
  int a, b;
  cr_assert_eq(gs_fairshare_add(fs, 50, &a), 0);
  cr_assert_eq(gs_fairshare_add(fs, 50, &b), 0);
  gs_fairshare_join(fs, a);
  gs_fairshare_join(fs, a);
  gs_fairshare_join(fs, b);
  worker w1 = {.fs = fs, .slot = a, .step_s = 0.002};
  worker w2 = {.fs = fs, .slot = a, .step_s = 0.002};
  worker w3 = {.fs = fs, .slot = b, .step_s = 0.002};
  start(&w1);
  start(&w2);
  start(&w3);
  wait_grants(3000);
  atomic_store(&g_stop, true);
  finish(&w1);
  finish(&w2);
  finish(&w3);
  cr_log_info("two jobs of a: %llu + %llu steps, one job of b: %llu",
              (unsigned long long)w1.done, (unsigned long long)w2.done,
              (unsigned long long)w3.done);
  /* The vdevs split 1:1 however many jobs each runs... */
  double vdev_ratio = (w1.seconds + w2.seconds) / w3.seconds;
  cr_expect_float_eq(vdev_ratio, 1.0, 0.05, "vdev ratio %.3f", vdev_ratio);
  /* ...and a's two jobs share a's half. Within a vdev the turns go by
   * ticket (first come, first served), so they alternate while both wait;
   * when the kernel is slow to reschedule the thread that just released, the
   * other job takes the turn instead (work-conserving), so the split is only
   * roughly even on a loaded machine: each must get at least a third. */
  double job_ratio = w1.seconds / w2.seconds;
  cr_log_info("a's jobs: device time ratio %.3f", job_ratio);
  cr_expect(job_ratio >= 0.5 && job_ratio <= 2.0, "a's two jobs split %.3f:1", job_ratio);
  cr_expect_eq(atomic_load(&g_overlap), 0);
  gs_fairshare_destroy(fs);
}

Test(fairshare, an_idle_vdev_does_not_block_others, .timeout = 120) {
  reset();
  gs_fairshare *fs;
  cr_assert_eq(gs_fairshare_create(0.02, 0, &fs), 0);
  int a, idle, parked;
  cr_assert_eq(gs_fairshare_add(fs, 25, &a), 0);
  cr_assert_eq(gs_fairshare_add(fs, 75, &idle), 0);  /* no job at all */
  cr_assert_eq(gs_fairshare_add(fs, 75, &parked), 0); /* a job, never waiting */
  gs_fairshare_join(fs, parked);

  worker wa = {.fs = fs, .slot = a, .step_s = 0.001, .limit = 300, .join = true};
  start(&wa);
  finish(&wa);
  cr_expect_eq(wa.done, 300, "the only busy vdev did %llu of 300 steps",
               (unsigned long long)wa.done);

  /* The parked job takes one step, then stays away: its claim lapses after
   * the grace, and a gets the device back for all of its steps. */
  gs_fairshare_acquire(fs, parked);
  gs_fairshare_release(fs, parked, 0.0001);
  worker wa2 = {.fs = fs, .slot = a, .step_s = 0.001, .limit = 100, .join = true};
  start(&wa2);
  finish(&wa2);
  cr_expect_eq(wa2.done, 100);
  cr_expect_eq(slot_steps(fs, parked), 1);
  cr_expect_eq(slot_steps(fs, idle), 0);
  gs_fairshare_leave(fs, parked);
  cr_expect_eq(atomic_load(&g_overlap), 0);
  gs_fairshare_destroy(fs);
}

Test(fairshare, a_vdev_joining_late_gets_no_burst, .timeout = 120) {
  reset();
  gs_fairshare *fs;
  cr_assert_eq(gs_fairshare_create(0.5, 0, &fs), 0);
  int a, b;
  cr_assert_eq(gs_fairshare_add(fs, 50, &a), 0);
  cr_assert_eq(gs_fairshare_add(fs, 50, &b), 0);
  worker wa = {.fs = fs, .slot = a, .step_s = 0.001, .join = true};
  worker wb = {.fs = fs, .slot = b, .step_s = 0.001, .join = true};
  start(&wa);
  /* a runs alone for 500 steps: 0.5 s of virtual lead that b must not
   * "catch up" on. */
  struct timespec ts = {0, 1000000};
  while (slot_steps(fs, a) < 500) nanosleep(&ts, NULL);
  start(&wb);
  while (slot_steps(fs, b) < 200) nanosleep(&ts, NULL);
  atomic_store(&g_stop, true);
  finish(&wa);
  finish(&wb);

  int n = atomic_load(&g_nseq);
  if (n > MAX_GRANTS) n = MAX_GRANTS;
  int first = -1;
  for (int i = 0; i < n; i++)
    if (g_seq[i] == b) {
      first = i;
      break;
    }
  cr_assert_geq(first, 500);
  cr_assert_geq(n - first, 200);
  int b40 = 0, b200 = 0;
  for (int i = first; i < first + 200; i++) {
    if (g_seq[i] == b) {
      b200++;
      if (i < first + 40) b40++;
    }
  }
  cr_log_info("late joiner: %d of the first 40 grants, %d of 200", b40, b200);
  /* Without the catch-up b would take 40 of 40 (and the next 460 too). */
  cr_expect_leq(b40, 24, "b took %d of the first 40 turns after joining", b40);
  cr_expect_geq(b40, 16);
  cr_expect_geq(b200, 90);
  cr_expect_leq(b200, 110);
  cr_expect_eq(atomic_load(&g_overlap), 0);
  gs_fairshare_destroy(fs);
}

Test(fairshare, slots_are_added_changed_and_removed) {
  gs_fairshare *fs;
  cr_assert_eq(gs_fairshare_create(0.05, 0, &fs), 0);
  int a, b, c;
  cr_assert_eq(gs_fairshare_add(fs, 0, &a), 0);
  cr_assert_eq(gs_fairshare_add(fs, 40, &b), 0);
  cr_assert_neq(a, b);
  gs_fairshare_stats st;
  cr_assert_eq(gs_fairshare_stats_get(fs, a, &st), 0);
  cr_expect_eq(st.share, 1, "a share of 0 is a weight of 1");
  cr_expect_eq(gs_fairshare_set_share(fs, b, 60), 0);
  cr_assert_eq(gs_fairshare_stats_get(fs, b, &st), 0);
  cr_expect_eq(st.share, 60);

  gs_fairshare_join(fs, b);
  gs_fairshare_acquire(fs, b);
  gs_fairshare_release(fs, b, 0.6);
  cr_assert_eq(gs_fairshare_stats_get(fs, b, &st), 0);
  cr_expect_float_eq(st.vtime, 1.0, 1e-9, "0.6 s at share 60 is 1.0 of virtual time");
  cr_expect_eq(st.jobs, 1);
  cr_expect_eq(gs_fairshare_remove(fs, b), -EBUSY);
  gs_fairshare_leave(fs, b);
  cr_expect_eq(gs_fairshare_remove(fs, b), 0);
  cr_expect_eq(gs_fairshare_stats_get(fs, b, &st), -ENOENT);
  cr_expect_eq(gs_fairshare_set_share(fs, b, 10), -ENOENT);
  cr_expect_eq(gs_fairshare_remove(fs, 99), -ENOENT);
  /* The freed slot is reused, with fresh accounting. */
  cr_assert_eq(gs_fairshare_add(fs, 30, &c), 0);
  cr_expect_eq(c, b);
  cr_assert_eq(gs_fairshare_stats_get(fs, c, &st), 0);
  cr_expect_eq(st.steps, 0);
  cr_expect_float_eq(st.device_seconds, 0.0, 1e-12);
  gs_fairshare_destroy(fs);
}
