/* test_job.c: the job state machine (control/job.c): the legal moves, a
 * transition the machine does not have leaves the job as it was, and a
 * state change the store cannot take is not told until it has. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sqlite3.h>

#include "control/daemon.h"
#include "control/job.h"
#include "control/store.h"

enum { Q = GPUSHARE__V1__JOB_STATE__QUEUED, R = GPUSHARE__V1__JOB_STATE__RUNNING,
       S = GPUSHARE__V1__JOB_STATE__SUCCEEDED, F = GPUSHARE__V1__JOB_STATE__FAILED,
       C = GPUSHARE__V1__JOB_STATE__CANCELLED, P = GPUSHARE__V1__JOB_STATE__PREEMPTED };

Test(job, legal_moves) {
  /* from x to: Q R S F C P */
  static const bool want[6][6] = {
      [Q] = {0, 1, 0, 0, 1, 0},
      [R] = {1, 0, 1, 1, 1, 1},
      [P] = {0, 1, 0, 0, 1, 0},
  };
  for (int from = 0; from < 6; from++)
    for (int to = 0; to < 6; to++)
      cr_assert_eq(gs_job_legal(from, to), want[from][to], "%s -> %s", gs_job_state_name(from),
                   gs_job_state_name(to));
  cr_assert(!gs_job_final(Q) && !gs_job_final(R) && !gs_job_final(P));
  cr_assert(gs_job_waiting(Q) && gs_job_waiting(P) && !gs_job_waiting(R) && !gs_job_waiting(S));
  cr_assert(gs_job_final(S) && gs_job_final(F) && gs_job_final(C));
}

static int events;
static bool last_final;
static void sink(void *arg, const gs_job *j, const Gpushare__V1__JobEvent *ev, bool final) {
  (void)arg;
  cr_assert_eq(ev->job_id, j->rec->id);
  events++;
  last_final = final;
}

Test(job, transitions_are_stored_and_told) {
  char dir[64];
  snprintf(dir, sizeof dir, "/tmp/gs-test-job-XXXXXX");
  cr_assert_not_null(mkdtemp(dir));
  static gs_daemon d;
  gs_err e;
  gs_err_clear(&e);
  snprintf(d.cfg.state_dir, sizeof d.cfg.state_dir, "%s", dir);
  cr_assert_eq(gs_store_open(dir, &d.store, &e), 0, "%s", e.msg);
  cr_assert_eq(gs_jobs_load(&d, &e), 0, "%s", e.msg);
  gs_jobs_set_sink(d.jobs, sink, NULL);
  gs_tenant t = {0};
  snprintf(t.name, sizeof t.name, "alice");
  cr_assert_eq(gs_store_tenant_create(d.store, &t, &e), 0, "%s", e.msg);
  gs_vdev v = {0};
  snprintf(v.name, sizeof v.name, "va");
  snprintf(v.device, sizeof v.device, "cpu");
  snprintf(v.tenant, sizeof v.tenant, "alice");
  v.memory_limit = 1 << 20;
  v.compute_share = 10;
  gs_device_limits lim = {.usable = 1 << 30};
  cr_assert_eq(gs_store_vdev_create(d.store, &v, &lim, &e), 0, "%s", e.msg);

  /* A stored job, as submit writes it. */
  Gpushare__V1__JobSpec spec = GPUSHARE__V1__JOB_SPEC__INIT;
  Gpushare__V1__Job rec = GPUSHARE__V1__JOB__INIT;
  rec.has_state = 1;
  rec.state = GPUSHARE__V1__JOB_STATE__QUEUED;
  rec.tenant = "alice";
  rec.vdev = "va";
  rec.spec = &spec;
  gs_job_row row = {.state = Q};
  snprintf(row.tenant, sizeof row.tenant, "alice");
  snprintf(row.vdev, sizeof row.vdev, "va");
  uint64_t id;
  cr_assert_eq(gs_store_job_insert(d.store, &row, &id, &e), 0, "%s", e.msg);
  rec.has_id = 1;
  rec.id = id;
  Gpushare__V1__Job *owned = gs_job_msg_dup(&rec.base);
  gs_job *j;
  cr_assert_eq(gs_job_add(&d, owned, &j, &e), 0);
  cr_assert_eq(gs_job_get(&d, id), j);
  cr_assert_eq(gs_jobs_count(&d, "alice", Q), 1);

  cr_assert_eq(gs_job_transition(&d, j, GPUSHARE__V1__JOB_STATE__SUCCEEDED, NULL), -EINVAL,
               "QUEUED cannot succeed");
  cr_assert_eq(j->rec->state, Q);
  cr_assert_eq(events, 0);
  cr_assert_eq(gs_job_transition(&d, j, GPUSHARE__V1__JOB_STATE__RUNNING, NULL), 0);
  cr_assert(j->rec->has_started_unix);
  cr_assert_eq(events, 1);
  cr_assert(!last_final);
  cr_assert_eq(gs_job_transition(&d, j, GPUSHARE__V1__JOB_STATE__FAILED, "boom"), 0);
  cr_assert(last_final);
  cr_assert_str_eq(j->rec->reason, "boom");
  cr_assert_eq(gs_job_transition(&d, j, GPUSHARE__V1__JOB_STATE__RUNNING, NULL), -EINVAL,
               "a final state is final");

  /* What the store holds comes back the same at the next start. */
  gs_jobs_free(&d);
  cr_assert_eq(gs_jobs_load(&d, &e), 0, "%s", e.msg);
  cr_assert_eq(gs_job_get(&d, id)->rec->state, F);
  gs_jobs_free(&d);
  gs_store_close(d.store);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  cr_assert_eq(system(cmd), 0);
}

static int told_states[8];
static int n_told;
static void record_sink(void *arg, const gs_job *j, const Gpushare__V1__JobEvent *ev, bool final) {
  (void)arg;
  (void)j;
  (void)final;
  if (n_told < 8) told_states[n_told++] = ev->state;
}

/* Another process holding the database's write lock makes every write of
 * the store fail (after its busy timeout), as a full disk would. */
Test(job, a_state_the_store_refused_is_not_told, .timeout = 60) {
  char dir[64];
  snprintf(dir, sizeof dir, "/tmp/gs-test-job-XXXXXX");
  cr_assert_not_null(mkdtemp(dir));
  static gs_daemon d;
  gs_err e;
  gs_err_clear(&e);
  snprintf(d.cfg.state_dir, sizeof d.cfg.state_dir, "%s", dir);
  cr_assert_eq(gs_store_open(dir, &d.store, &e), 0, "%s", e.msg);
  cr_assert_eq(gs_jobs_load(&d, &e), 0, "%s", e.msg);
  gs_jobs_set_sink(d.jobs, record_sink, NULL);
  gs_tenant t = {0};
  snprintf(t.name, sizeof t.name, "alice");
  cr_assert_eq(gs_store_tenant_create(d.store, &t, &e), 0, "%s", e.msg);
  Gpushare__V1__JobSpec spec = GPUSHARE__V1__JOB_SPEC__INIT;
  Gpushare__V1__Job rec = GPUSHARE__V1__JOB__INIT;
  rec.has_state = rec.has_id = 1;
  rec.state = GPUSHARE__V1__JOB_STATE__QUEUED;
  rec.tenant = "alice";
  rec.vdev = "va";
  rec.spec = &spec;
  gs_job_row row = {.state = Q};
  snprintf(row.tenant, sizeof row.tenant, "alice");
  snprintf(row.vdev, sizeof row.vdev, "va");
  cr_assert_eq(gs_store_job_insert(d.store, &row, &rec.id, &e), 0, "%s", e.msg);
  gs_job *j;
  cr_assert_eq(gs_job_add(&d, gs_job_msg_dup(&rec.base), &j, &e), 0);
  cr_assert_eq(gs_job_transition(&d, j, GPUSHARE__V1__JOB_STATE__RUNNING, NULL), 0);
  cr_assert_eq(n_told, 1);

  char db[128];
  snprintf(db, sizeof db, "%s/gpushared.db", dir);
  sqlite3 *other;
  cr_assert_eq(sqlite3_open(db, &other), SQLITE_OK);
  cr_assert_eq(sqlite3_exec(other, "BEGIN EXCLUSIVE", NULL, NULL, NULL), SQLITE_OK);

  /* The job fails while the store cannot be written: the daemon acts on
   * FAILED, clients are still told RUNNING, and hear nothing yet. */
  cr_assert_lt(gs_job_transition(&d, j, GPUSHARE__V1__JOB_STATE__FAILED, "boom"), 0);
  cr_assert_eq(j->rec->state, F);
  cr_assert(j->unsaved && j->state_unsaved);
  cr_assert_eq(gs_job_told_state(j), R);
  Gpushare__V1__Job told;
  gs_job_told(j, &told);
  cr_assert_eq(told.state, R);
  cr_assert(!told.has_finished_unix && told.reason == NULL);
  cr_assert_eq(n_told, 1, "the FAILED event waits for the store");
  cr_assert_eq(d.jobs->unsaved, 1);
  cr_assert_neq(d.jobs->store_error[0], 0);

  /* A restart now finds what clients were told: RUNNING, to resume. */
  cr_assert_eq(sqlite3_exec(other, "ROLLBACK", NULL, NULL, NULL), SQLITE_OK);
  static gs_daemon d2;
  snprintf(d2.cfg.state_dir, sizeof d2.cfg.state_dir, "%s", dir);
  d2.store = d.store;
  cr_assert_eq(gs_jobs_load(&d2, &e), 0, "%s", e.msg);
  cr_assert_eq(gs_job_get(&d2, rec.id)->rec->state, R);
  cr_assert(gs_job_get(&d2, rec.id)->resume_pending);
  gs_jobs_free(&d2);

  /* Once the store takes it, the event goes out and the state is kept. */
  cr_assert_eq(gs_jobs_save_pending(&d), 0);
  cr_assert(!j->unsaved && !j->state_unsaved);
  cr_assert_eq(n_told, 2);
  cr_assert_eq(told_states[1], F);
  cr_assert_eq(gs_job_told_state(j), F);
  gs_jobs_free(&d);
  cr_assert_eq(gs_jobs_load(&d, &e), 0, "%s", e.msg);
  cr_assert_eq(gs_job_get(&d, rec.id)->rec->state, F);
  cr_assert_str_eq(gs_job_get(&d, rec.id)->rec->reason, "boom");
  gs_jobs_free(&d);
  sqlite3_close(other);
  gs_store_close(d.store);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  cr_assert_eq(system(cmd), 0);
}
