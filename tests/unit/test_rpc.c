/* test_rpc.c: the control plane's calls through the real dispatcher
 * (gs_rpc_handle) on a daemon with a store in a temporary state directory
 * and no executors: an admin sets up a tenant, its quota and a vdev; a
 * tenant plans and submits a synthetic job (stored QUEUED: nothing runs it
 * here); bad input comes back INVALID_ARGUMENT with the field path; a
 * tenant sees none of another's jobs; usage accrues from executor reports
 * (fed here by hand), is stored, read back after a restart, and read by
 * whom it belongs to. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "control/config.h"
#include "control/daemon.h"
#include "control/datasets.h"
#include "control/job.h"
#include "control/rpc.h"
#include "control/store.h"
#include "control/usage.h"
#include "proto/wire.h"

#define MiB (1ull << 20)

static char dir[64];
static gs_daemon d;
static uv_loop_t loop;
static const gs_peer admin = {.pid = 1, .uid = 0, .gid = 0, .gids = {0}, .n_gids = 1};
static const gs_peer alice = {.pid = 2, .uid = 1000, .gid = 1000, .gids = {1000}, .n_gids = 1};
static const gs_peer bob = {.pid = 3, .uid = 1001, .gid = 1001, .gids = {1001}, .n_gids = 1};
static const gs_peer nobody = {.pid = 4, .uid = 1002, .gid = 1002, .gids = {1002}, .n_gids = 1};

static void setup(void) {
  snprintf(dir, sizeof dir, "/tmp/gs-test-rpc-XXXXXX");
  cr_assert_not_null(mkdtemp(dir));
  memset(&d, 0, sizeof d);
  gs_config_defaults(&d.cfg);
  snprintf(d.cfg.state_dir, sizeof d.cfg.state_dir, "%s", dir);
  uv_loop_init(&loop);
  d.loop = &loop;
  gs_err e;
  gs_err_clear(&e);
  cr_assert_eq(gs_store_open(dir, &d.store, &e), 0, "%s", e.msg);
  cr_assert_eq(gs_devices_discover(&d.cfg, &d.devices, &e), 0, "%s", e.msg);
  cr_assert_eq(gs_datasets_init(&d, &e), 0, "%s", e.msg);
  cr_assert_eq(gs_jobs_load(&d, &e), 0, "%s", e.msg);
  cr_assert_eq(gs_usage_init(&d, &e), 0, "%s", e.msg);
}

static void teardown(void) {
  gs_rpc_free(&d);
  gs_usage_free(&d);
  gs_jobs_free(&d);
  gs_store_close(d.store);
  uv_loop_close(&loop);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  cr_assert_eq(system(cmd), 0);
}

/* One call as peer: the request packed, dispatched, the answer unpacked. */
static Gpushare__V1__Response *call(const gs_peer *peer, Gpushare__V1__Request *rq) {
  rq->has_id = 1;
  rq->id = 7;
  size_t n = gpushare__v1__request__get_packed_size(rq);
  uint8_t *body = malloc(n + 1);
  cr_assert_not_null(body);
  gpushare__v1__request__pack(rq, body);
  uint8_t *frame = NULL;
  size_t flen = 0;
  cr_assert_eq(gs_rpc_handle(&d, NULL, peer, body, n, &frame, &flen), 0);
  free(body);
  cr_assert_not_null(frame, "no answer");
  gs_err e;
  gs_err_clear(&e);
  Gpushare__V1__Response *r = gs_wire_unpack_response(frame + 4, flen - 4, &e);
  free(frame);
  cr_assert_not_null(r, "%s", e.msg);
  cr_assert(r->has_id && r->id == 7, "the request id is echoed");
  return r;
}

static void expect_ok(const Gpushare__V1__Response *r) {
  cr_assert_eq(r->code, GPUSHARE__V1__CODE__OK, "code %d: %s (%s)", (int)r->code,
               r->message ? r->message : "", r->field ? r->field : "");
}

static void expect_err(const Gpushare__V1__Response *r, Gpushare__V1__Code code,
                       const char *field) {
  cr_assert_eq(r->code, code, "code %d, want %d: %s", (int)r->code, (int)code,
               r->message ? r->message : "");
  cr_assert(r->message && r->message[0], "a refusal says why");
  cr_assert_str_eq(r->field ? r->field : "", field);
}

static void create_tenant(const char *name, uint32_t uid, uint32_t max_queued) {
  Gpushare__V1__Request rq = GPUSHARE__V1__REQUEST__INIT;
  Gpushare__V1__CreateTenantRequest ct = GPUSHARE__V1__CREATE_TENANT_REQUEST__INIT;
  Gpushare__V1__Quota q = GPUSHARE__V1__QUOTA__INIT;
  q.has_memory_bytes = q.has_compute_share = 1;
  q.memory_bytes = 512 * MiB;
  q.compute_share = 100;
  if (max_queued) {
    q.has_max_queued = 1;
    q.max_queued = max_queued;
  }
  ct.name = (char *)name;
  ct.n_uids = 1;
  ct.uids = &uid;
  ct.quota = &q;
  rq.call_case = GPUSHARE__V1__REQUEST__CALL_CREATE_TENANT;
  rq.create_tenant = &ct;
  Gpushare__V1__Response *r = call(&admin, &rq);
  expect_ok(r);
  cr_assert_str_eq(r->create_tenant->tenant->name, name);
  gpushare__v1__response__free_unpacked(r, NULL);
}

static Gpushare__V1__Response *create_vdev(const gs_peer *p, const char *name, const char *tenant,
                                           uint64_t limit) {
  Gpushare__V1__Request rq = GPUSHARE__V1__REQUEST__INIT;
  Gpushare__V1__CreateVdevRequest cv = GPUSHARE__V1__CREATE_VDEV_REQUEST__INIT;
  cv.name = (char *)name;
  cv.tenant = (char *)tenant;
  cv.device = "cpu";
  cv.has_memory_limit = limit != 0;
  cv.memory_limit = limit;
  cv.has_compute_share = 1;
  cv.compute_share = 50;
  rq.call_case = GPUSHARE__V1__REQUEST__CALL_CREATE_VDEV;
  rq.create_vdev = &cv;
  return call(p, &rq);
}

static void setup_alice_bob(void) {
  create_tenant("alice", 1000, 0);
  create_tenant("bob", 1001, 0);
  Gpushare__V1__Response *r = create_vdev(&admin, "va", "alice", 256 * MiB);
  expect_ok(r);
  gpushare__v1__response__free_unpacked(r, NULL);
  r = create_vdev(&admin, "vb", "bob", 256 * MiB);
  expect_ok(r);
  gpushare__v1__response__free_unpacked(r, NULL);
}

/* A synthetic job of a few KiB: 8x8x1 in, dense 32, dense 4. */
typedef struct spec_buf {
  Gpushare__V1__JobSpec spec;
  Gpushare__V1__Model model;
  Gpushare__V1__InputShape in;
  Gpushare__V1__Layer l[3], *lp[3];
  Gpushare__V1__Flatten fl;
  Gpushare__V1__Dense d1, d2;
  Gpushare__V1__Dataset train;
  Gpushare__V1__SyntheticDataset syn;
} spec_buf;

static void spec_init(spec_buf *s, uint64_t examples) {
  *s = (spec_buf){.spec = GPUSHARE__V1__JOB_SPEC__INIT,
                  .model = GPUSHARE__V1__MODEL__INIT,
                  .in = GPUSHARE__V1__INPUT_SHAPE__INIT,
                  .fl = GPUSHARE__V1__FLATTEN__INIT,
                  .d1 = GPUSHARE__V1__DENSE__INIT,
                  .d2 = GPUSHARE__V1__DENSE__INIT,
                  .train = GPUSHARE__V1__DATASET__INIT,
                  .syn = GPUSHARE__V1__SYNTHETIC_DATASET__INIT};
  for (int i = 0; i < 3; i++) {
    s->l[i] = (Gpushare__V1__Layer)GPUSHARE__V1__LAYER__INIT;
    s->lp[i] = &s->l[i];
  }
  s->in.has_height = s->in.has_width = s->in.has_channels = 1;
  s->in.height = s->in.width = 8;
  s->in.channels = 1;
  s->l[0].kind_case = GPUSHARE__V1__LAYER__KIND_FLATTEN;
  s->l[0].flatten = &s->fl;
  s->d1.has_units = s->d2.has_units = 1;
  s->d1.units = 32;
  s->d2.units = 4;
  s->l[1].kind_case = s->l[2].kind_case = GPUSHARE__V1__LAYER__KIND_DENSE;
  s->l[1].dense = &s->d1;
  s->l[2].dense = &s->d2;
  s->model.input = &s->in;
  s->model.n_layer = 3;
  s->model.layer = s->lp;
  s->syn.has_examples = s->syn.has_classes = 1;
  s->syn.examples = examples;
  s->syn.classes = 4;
  s->train.source_case = GPUSHARE__V1__DATASET__SOURCE_SYNTHETIC;
  s->train.synthetic = &s->syn;
  s->spec.name = "tiny";
  s->spec.model = &s->model;
  s->spec.train = &s->train;
}

static Gpushare__V1__Response *submit(const gs_peer *p, Gpushare__V1__JobSpec *spec) {
  Gpushare__V1__Request rq = GPUSHARE__V1__REQUEST__INIT;
  Gpushare__V1__SubmitRequest sr = GPUSHARE__V1__SUBMIT_REQUEST__INIT;
  sr.spec = spec;
  rq.call_case = GPUSHARE__V1__REQUEST__CALL_SUBMIT;
  rq.submit = &sr;
  return call(p, &rq);
}

static Gpushare__V1__Response *job_status(const gs_peer *p, uint64_t id) {
  Gpushare__V1__Request rq = GPUSHARE__V1__REQUEST__INIT;
  Gpushare__V1__JobStatusRequest js = GPUSHARE__V1__JOB_STATUS_REQUEST__INIT;
  js.has_id = 1;
  js.id = id;
  rq.call_case = GPUSHARE__V1__REQUEST__CALL_JOB_STATUS;
  rq.job_status = &js;
  return call(p, &rq);
}

TestSuite(rpc, .init = setup, .fini = teardown);

Test(rpc, admin_sets_up_tenant_quota_vdev) {
  create_tenant("alice", 1000, 0);
  Gpushare__V1__Request rq = GPUSHARE__V1__REQUEST__INIT;
  Gpushare__V1__SetQuotaRequest sq = GPUSHARE__V1__SET_QUOTA_REQUEST__INIT;
  Gpushare__V1__Quota q = GPUSHARE__V1__QUOTA__INIT;
  q.has_max_running = 1;
  q.max_running = 3;
  sq.tenant = "alice";
  sq.quota = &q;
  rq.call_case = GPUSHARE__V1__REQUEST__CALL_SET_QUOTA;
  rq.set_quota = &sq;
  Gpushare__V1__Response *r = call(&admin, &rq);
  expect_ok(r);
  cr_assert_eq(r->set_quota->tenant->quota->max_running, 3);
  gpushare__v1__response__free_unpacked(r, NULL);

  r = create_vdev(&admin, "va", "alice", 256 * MiB);
  expect_ok(r);
  cr_assert_str_eq(r->create_vdev->vdev->name, "va");
  cr_assert_eq(r->create_vdev->vdev->memory_limit, 256 * MiB);
  cr_assert_eq(r->create_vdev->vdev->memory_in_use, 0, "no executor has reported");
  gpushare__v1__response__free_unpacked(r, NULL);

  /* The tenant reads its own quota and vdevs. */
  Gpushare__V1__Request lq = GPUSHARE__V1__REQUEST__INIT;
  Gpushare__V1__ListVdevsRequest lv = GPUSHARE__V1__LIST_VDEVS_REQUEST__INIT;
  lq.call_case = GPUSHARE__V1__REQUEST__CALL_LIST_VDEVS;
  lq.list_vdevs = &lv;
  r = call(&alice, &lq);
  expect_ok(r);
  cr_assert_eq(r->list_vdevs->n_vdev, 1);
  gpushare__v1__response__free_unpacked(r, NULL);

  /* ... but is no admin. */
  r = create_vdev(&alice, "vx", "alice", 64 * MiB);
  cr_assert_eq(r->code, GPUSHARE__V1__CODE__PERMISSION_DENIED);
  gpushare__v1__response__free_unpacked(r, NULL);
}

Test(rpc, plan_and_submit_store_the_job_queued) {
  setup_alice_bob();
  spec_buf s;
  spec_init(&s, 256);
  Gpushare__V1__Request rq = GPUSHARE__V1__REQUEST__INIT;
  Gpushare__V1__PlanRequest pr = GPUSHARE__V1__PLAN_REQUEST__INIT;
  pr.spec = &s.spec;
  pr.vdev = "va";
  rq.call_case = GPUSHARE__V1__REQUEST__CALL_PLAN;
  rq.plan = &pr;
  Gpushare__V1__Response *r = call(&alice, &rq);
  expect_ok(r);
  cr_assert(r->plan_result->plan->fits);
  /* 256 examples of 8x8x1 bytes and an int32 label, on the host: on the
   * cpu device vdev memory, so the plan has what they leave. */
  const uint64_t data = 256 * (8 * 8 + 4);
  cr_assert_eq(r->plan_result->plan->data_bytes, data);
  cr_assert_eq(r->plan_result->plan->limit_bytes, 256 * MiB - data);
  cr_assert(strstr(r->plan_result->plan->summary, "datasets: 17.00 KiB on the host"), "%s",
            r->plan_result->plan->summary);
  uint64_t peak = r->plan_result->plan->peak_bytes;
  cr_assert_gt(peak, 0);
  gpushare__v1__response__free_unpacked(r, NULL);

  r = submit(&alice, &s.spec);
  expect_ok(r);
  const Gpushare__V1__Job *j = r->submit->job;
  cr_assert_eq(j->id, 1);
  cr_assert_eq(j->state, GPUSHARE__V1__JOB_STATE__QUEUED, "no executor: it waits");
  cr_assert_str_eq(j->tenant, "alice");
  cr_assert_str_eq(j->vdev, "va", "the tenant's only vdev");
  cr_assert_eq(j->planned_peak_bytes, peak);
  cr_assert_eq(j->data_bytes, data, "charged to the vdev with the peak");
  cr_assert_null(j->spec, "the answer leaves the spec out");
  cr_assert(r->submit->plan && r->submit->plan->fits);
  gpushare__v1__response__free_unpacked(r, NULL);

  /* In the store, QUEUED, with its record. */
  gs_job_row *rows;
  size_t n;
  gs_err e;
  gs_err_clear(&e);
  cr_assert_eq(gs_store_job_list(d.store, &rows, &n, &e), 0, "%s", e.msg);
  cr_assert_eq(n, 1);
  cr_assert_eq(rows[0].state, GPUSHARE__V1__JOB_STATE__QUEUED);
  cr_assert_str_eq(rows[0].tenant, "alice");
  gs_store_job_rows_free(rows, n);

  r = job_status(&alice, 1);
  expect_ok(r);
  cr_assert_eq(r->job_status->job->state, GPUSHARE__V1__JOB_STATE__QUEUED);
  cr_assert_not_null(r->job_status->job->spec);
  gpushare__v1__response__free_unpacked(r, NULL);

  /* Cancelled while queued: it ends at once. */
  Gpushare__V1__Request cq = GPUSHARE__V1__REQUEST__INIT;
  Gpushare__V1__CancelRequest cr = GPUSHARE__V1__CANCEL_REQUEST__INIT;
  cr.has_id = 1;
  cr.id = 1;
  cq.call_case = GPUSHARE__V1__REQUEST__CALL_CANCEL;
  cq.cancel = &cr;
  r = call(&alice, &cq);
  expect_ok(r);
  cr_assert_eq(r->cancel->job->state, GPUSHARE__V1__JOB_STATE__CANCELLED);
  gpushare__v1__response__free_unpacked(r, NULL);
  r = call(&alice, &cq);
  expect_err(r, GPUSHARE__V1__CODE__FAILED_PRECONDITION, "cancel.id");
  gpushare__v1__response__free_unpacked(r, NULL);
}

Test(rpc, max_queued_refuses_the_next_submit) {
  create_tenant("carol", 1000, 1);
  Gpushare__V1__Response *r = create_vdev(&admin, "vc", "carol", 256 * MiB);
  expect_ok(r);
  gpushare__v1__response__free_unpacked(r, NULL);
  spec_buf s;
  spec_init(&s, 256);
  r = submit(&alice, &s.spec);
  expect_ok(r);
  gpushare__v1__response__free_unpacked(r, NULL);
  r = submit(&alice, &s.spec);
  expect_err(r, GPUSHARE__V1__CODE__RESOURCE_EXHAUSTED, "submit.max_queued");
  gpushare__v1__response__free_unpacked(r, NULL);
}

Test(rpc, bad_input_names_the_field) {
  setup_alice_bob();
  Gpushare__V1__Response *r = create_vdev(&admin, "vz", "alice", 0);
  expect_err(r, GPUSHARE__V1__CODE__INVALID_ARGUMENT, "create_vdev.memory_limit");
  gpushare__v1__response__free_unpacked(r, NULL);
  r = create_vdev(&admin, "bad name!", "alice", 64 * MiB);
  expect_err(r, GPUSHARE__V1__CODE__INVALID_ARGUMENT, "create_vdev.name");
  gpushare__v1__response__free_unpacked(r, NULL);

  spec_buf s;
  spec_init(&s, 0);
  r = submit(&alice, &s.spec);
  expect_err(r, GPUSHARE__V1__CODE__INVALID_ARGUMENT, "submit.spec.train.synthetic.examples");
  gpushare__v1__response__free_unpacked(r, NULL);

  spec_init(&s, 256);
  s.train.source_case = GPUSHARE__V1__DATASET__SOURCE_IDX;
  Gpushare__V1__IdxFiles idx = GPUSHARE__V1__IDX_FILES__INIT;
  idx.images = "/etc/passwd";
  idx.labels = "/etc/shadow";
  s.train.idx = &idx;
  r = submit(&alice, &s.spec);
  expect_err(r, GPUSHARE__V1__CODE__INVALID_ARGUMENT, "submit.spec.train.idx.images");
  gpushare__v1__response__free_unpacked(r, NULL);

  /* Sets that cannot be held: one too large, and a pair of one seed whose
   * counts add past 2^64 (drawn together, they would wrap to nothing). */
  spec_init(&s, UINT64_C(1) << 40);
  r = submit(&alice, &s.spec);
  expect_err(r, GPUSHARE__V1__CODE__INVALID_ARGUMENT, "submit.spec.train.synthetic.examples");
  gpushare__v1__response__free_unpacked(r, NULL);
  spec_init(&s, 256);
  Gpushare__V1__SyntheticDataset tsyn = s.syn;
  tsyn.examples = UINT64_MAX - 100;
  Gpushare__V1__Dataset test = GPUSHARE__V1__DATASET__INIT;
  test.source_case = GPUSHARE__V1__DATASET__SOURCE_SYNTHETIC;
  test.synthetic = &tsyn;
  s.spec.test = &test;
  r = submit(&alice, &s.spec);
  expect_err(r, GPUSHARE__V1__CODE__INVALID_ARGUMENT, "submit.spec.test.synthetic.examples");
  cr_assert(strstr(r->message, "drawn together"), "%s", r->message);
  gpushare__v1__response__free_unpacked(r, NULL);

  spec_init(&s, 256);
  s.spec.vdev = "vb"; /* bob's */
  r = submit(&alice, &s.spec);
  expect_err(r, GPUSHARE__V1__CODE__NOT_FOUND, "submit.spec.vdev");
  gpushare__v1__response__free_unpacked(r, NULL);

  /* A body that is no Request at all is answered, not dropped. */
  uint8_t junk[] = {0xff, 0xff, 0xff};
  uint8_t *frame = NULL;
  size_t flen = 0;
  cr_assert_eq(gs_rpc_handle(&d, NULL, &alice, junk, sizeof junk, &frame, &flen), 0);
  gs_err e;
  gs_err_clear(&e);
  r = gs_wire_unpack_response(frame + 4, flen - 4, &e);
  free(frame);
  cr_assert_not_null(r);
  expect_err(r, GPUSHARE__V1__CODE__INVALID_ARGUMENT, "frame");
  gpushare__v1__response__free_unpacked(r, NULL);
}

Test(rpc, a_tenant_cannot_see_another_tenants_job) {
  setup_alice_bob();
  spec_buf s;
  spec_init(&s, 256);
  Gpushare__V1__Response *r = submit(&alice, &s.spec);
  expect_ok(r);
  uint64_t id = r->submit->job->id;
  gpushare__v1__response__free_unpacked(r, NULL);

  r = job_status(&bob, id);
  expect_err(r, GPUSHARE__V1__CODE__NOT_FOUND, "job_status.id");
  gpushare__v1__response__free_unpacked(r, NULL);
  r = job_status(&nobody, id);
  cr_assert_eq(r->code, GPUSHARE__V1__CODE__PERMISSION_DENIED, "no tenant, no admin");
  gpushare__v1__response__free_unpacked(r, NULL);

  Gpushare__V1__Request rq = GPUSHARE__V1__REQUEST__INIT;
  Gpushare__V1__ListJobsRequest lj = GPUSHARE__V1__LIST_JOBS_REQUEST__INIT;
  rq.call_case = GPUSHARE__V1__REQUEST__CALL_LIST_JOBS;
  rq.list_jobs = &lj;
  r = call(&bob, &rq);
  expect_ok(r);
  cr_assert_eq(r->list_jobs->n_job, 0);
  gpushare__v1__response__free_unpacked(r, NULL);
  lj.has_all = lj.all = 1;
  r = call(&bob, &rq);
  expect_err(r, GPUSHARE__V1__CODE__PERMISSION_DENIED, "list_jobs.all");
  gpushare__v1__response__free_unpacked(r, NULL);
  r = call(&admin, &rq);
  expect_ok(r);
  cr_assert_eq(r->list_jobs->n_job, 1);
  gpushare__v1__response__free_unpacked(r, NULL);
  r = job_status(&admin, id);
  expect_ok(r);
  gpushare__v1__response__free_unpacked(r, NULL);

  /* A watch streams on a connection; this call has none. */
  Gpushare__V1__Request wq = GPUSHARE__V1__REQUEST__INIT;
  Gpushare__V1__WatchRequest w = GPUSHARE__V1__WATCH_REQUEST__INIT;
  w.has_id = 1;
  w.id = id;
  wq.call_case = GPUSHARE__V1__REQUEST__CALL_WATCH;
  wq.watch = &w;
  r = call(&bob, &wq);
  expect_err(r, GPUSHARE__V1__CODE__NOT_FOUND, "watch.id");
  gpushare__v1__response__free_unpacked(r, NULL);
  r = call(&alice, &wq);
  cr_assert_eq(r->code, GPUSHARE__V1__CODE__FAILED_PRECONDITION);
  gpushare__v1__response__free_unpacked(r, NULL);
}

Test(rpc, metrics_count_the_queued_job) {
  setup_alice_bob();
  spec_buf s;
  spec_init(&s, 256);
  Gpushare__V1__Response *r = submit(&alice, &s.spec);
  expect_ok(r);
  gpushare__v1__response__free_unpacked(r, NULL);
  Gpushare__V1__Request rq = GPUSHARE__V1__REQUEST__INIT;
  Gpushare__V1__MetricsRequest m = GPUSHARE__V1__METRICS_REQUEST__INIT;
  rq.call_case = GPUSHARE__V1__REQUEST__CALL_METRICS;
  rq.metrics = &m;
  r = call(&admin, &rq);
  expect_ok(r);
  cr_assert_not_null(strstr(r->metrics->text, "gpushare_jobs{state=\"QUEUED\"} 1\n"));
  cr_assert_not_null(
      strstr(r->metrics->text, "gpushare_vdev_queue_length{vdev=\"va\",device=\"cpu\",tenant=\"alice\"} 1\n"));
  gpushare__v1__response__free_unpacked(r, NULL);
  r = call(&alice, &rq);
  cr_assert_eq(r->code, GPUSHARE__V1__CODE__PERMISSION_DENIED);
  gpushare__v1__response__free_unpacked(r, NULL);
}

static Gpushare__V1__Response *usage_call(const gs_peer *p, const char *tenant, bool has_since,
                                          int64_t since) {
  Gpushare__V1__Request rq = GPUSHARE__V1__REQUEST__INIT;
  Gpushare__V1__UsageRequest u = GPUSHARE__V1__USAGE_REQUEST__INIT;
  u.tenant = (char *)tenant;
  u.has_since_unix = has_since;
  u.since_unix = since;
  rq.call_case = GPUSHARE__V1__REQUEST__CALL_USAGE;
  rq.usage = &u;
  return call(p, &rq);
}

/* The executor's reports of one vdev: its reserved bytes, jobs running. */
static void stats(const char *vdev, uint64_t reserved, uint32_t running) {
  Gpushare__Exec__V1__VdevStats v = GPUSHARE__EXEC__V1__VDEV_STATS__INIT, *pv = &v;
  v.name = (char *)vdev;
  v.has_reserved = v.has_running_jobs = 1;
  v.reserved = reserved;
  v.running_jobs = running;
  Gpushare__Exec__V1__Stats st = GPUSHARE__EXEC__V1__STATS__INIT;
  st.n_vdev = 1;
  st.vdev = &pv;
  gs_usage_stats(&d, &st);
}

static void progress(uint64_t id, uint64_t step, double device_seconds) {
  Gpushare__V1__JobEvent ev = GPUSHARE__V1__JOB_EVENT__INIT;
  ev.has_step = 1;
  ev.step = step;
  Gpushare__Exec__V1__Progress p = GPUSHARE__EXEC__V1__PROGRESS__INIT;
  p.has_job_id = p.has_device_seconds = 1;
  p.job_id = id;
  p.event = &ev;
  p.device_seconds = device_seconds;
  gs_usage_progress(&d, &p);
}

static void later(unsigned ms) {
  usleep(ms * 1000);
  uv_update_time(&loop);
}

/* The tenant's block of a usage answer, the job's row in it. */
static const Gpushare__V1__JobUsage *job_row(const Gpushare__V1__TenantUsage *t, uint64_t id) {
  for (size_t i = 0; i < t->n_job; i++)
    if (t->job[i]->job_id == id) return t->job[i];
  return NULL;
}

static void check_total_is_the_sum(const Gpushare__V1__TenantUsage *t) {
  double ds = 0, res = 0, in_use = 0;
  uint64_t steps = 0, samples = 0;
  for (size_t i = 0; i < t->n_job; i++) {
    ds += t->job[i]->usage->device_seconds;
    res += t->job[i]->usage->reserved_gib_seconds;
    in_use += t->job[i]->usage->in_use_gib_seconds;
    steps += t->job[i]->usage->steps;
    samples += t->job[i]->usage->samples;
  }
  cr_assert_float_eq(t->total->device_seconds, ds, 1e-9);
  cr_assert_float_eq(t->total->reserved_gib_seconds, res, 1e-9);
  cr_assert_float_eq(t->total->in_use_gib_seconds, in_use, 1e-9);
  cr_assert_eq(t->total->steps, steps);
  cr_assert_eq(t->total->samples, samples);
}

Test(rpc, usage_accrues_is_stored_and_read_back) {
  setup_alice_bob();
  spec_buf s;
  spec_init(&s, 256);
  Gpushare__V1__Response *r = submit(&alice, &s.spec);
  expect_ok(r);
  uint64_t id = r->submit->job->id;
  gpushare__v1__response__free_unpacked(r, NULL);
  gs_job *j = gs_job_get(&d, id);
  cr_assert_not_null(j);
  uint64_t batch = (uint64_t)j->rec->micro_batch * j->rec->accumulation_steps;
  double peak_gib = (double)j->rec->planned_peak_bytes / GS_USAGE_GIB;
  cr_assert(batch > 0 && peak_gib > 0);
  /* As exec_events.c sees a job start: RUNNING, placed on an executor. */
  j->rec->state = GPUSHARE__V1__JOB_STATE__RUNNING;
  j->placed = 0;
  uv_update_time(&loop);
  stats("va", 256 * MiB, 1); /* the first report: figures taken, nothing charged */
  later(200);
  progress(id, 10, 0.5);
  stats("va", 256 * MiB, 1); /* ~0.2 s of the job's peak and the vdev's 0.25 GiB */
  later(100);
  Gpushare__Exec__V1__Finished f = GPUSHARE__EXEC__V1__FINISHED__INIT;
  f.has_job_id = f.has_steps = f.has_device_seconds = 1;
  f.job_id = id;
  f.steps = 20;
  f.device_seconds = 1.25;
  gs_usage_finished(&d, &f);
  j->placed = -1;
  j->rec->state = GPUSHARE__V1__JOB_STATE__SUCCEEDED;
  cr_assert_eq(gs_usage_flush(&d), 0);

  double before_ds = 0, before_res = 0;
  for (int round = 0; round < 2; round++) {
    r = usage_call(&alice, NULL, false, 0);
    expect_ok(r);
    cr_assert_eq(r->usage->n_tenant, 1, "a member sees its own tenant only");
    const Gpushare__V1__TenantUsage *t = r->usage->tenant[0];
    cr_assert_str_eq(t->tenant, "alice");
    const Gpushare__V1__JobUsage *ju = job_row(t, id);
    cr_assert_not_null(ju);
    cr_assert_str_eq(ju->name, "tiny");
    cr_assert_str_eq(ju->vdev, "va");
    cr_assert_float_eq(ju->usage->device_seconds, 1.25, 1e-9);
    cr_assert_eq(ju->usage->steps, 20);
    cr_assert_eq(ju->usage->samples, 20 * batch);
    /* charged from the second report to the end: 0.3 s, give or take the
     * scheduling of this test */
    cr_assert(ju->usage->in_use_gib_seconds >= peak_gib * 0.29 &&
                  ju->usage->in_use_gib_seconds <= peak_gib * 2.0,
              "in use %g GiB-s for a peak of %g GiB over ~0.3 s", ju->usage->in_use_gib_seconds, peak_gib);
    cr_assert(ju->usage->reserved_gib_seconds >= 0.25 * 0.29 && ju->usage->reserved_gib_seconds <= 0.5,
              "reserved %g GiB-s", ju->usage->reserved_gib_seconds);
    check_total_is_the_sum(t);
    if (round == 1) {
      cr_assert_float_eq(ju->usage->device_seconds, before_ds, 1e-9);
      cr_assert_float_eq(ju->usage->reserved_gib_seconds, before_res, 1e-9);
    }
    before_ds = ju->usage->device_seconds;
    before_res = ju->usage->reserved_gib_seconds;
    gpushare__v1__response__free_unpacked(r, NULL);

    r = job_status(&alice, id);
    expect_ok(r);
    cr_assert_not_null(r->job_status->job->usage);
    cr_assert_eq(r->job_status->job->usage->steps, 20);
    cr_assert_float_eq(r->job_status->job->usage->device_seconds, 1.25, 1e-9);
    gpushare__v1__response__free_unpacked(r, NULL);

    /* A restart: the totals come back from the store. */
    gs_usage_free(&d);
    gs_err e;
    gs_err_clear(&e);
    cr_assert_eq(gs_usage_init(&d, &e), 0, "%s", e.msg);
  }

  /* A report after the restart counts on from the stored steps. */
  j->rec->state = GPUSHARE__V1__JOB_STATE__RUNNING;
  progress(id, 25, 0.25);
  gs_usage_sums u;
  cr_assert(gs_usage_job(&d, id, &u));
  cr_assert_eq(u.steps, 25);
  cr_assert_float_eq(u.device_seconds, 1.5, 1e-9);
  gs_usage_preempted(&d, id);
  cr_assert(gs_usage_job(&d, id, &u));
  cr_assert_eq(u.preemptions, 1);

  Gpushare__V1__Request rq = GPUSHARE__V1__REQUEST__INIT;
  Gpushare__V1__MetricsRequest m = GPUSHARE__V1__METRICS_REQUEST__INIT;
  rq.call_case = GPUSHARE__V1__REQUEST__CALL_METRICS;
  rq.metrics = &m;
  r = call(&admin, &rq);
  expect_ok(r);
  cr_assert_not_null(strstr(r->metrics->text,
                            "gpushare_vdev_device_seconds_total{vdev=\"va\",device=\"cpu\",tenant=\"alice\"} 1.500\n"),
                     "%s", r->metrics->text);
  cr_assert_not_null(strstr(r->metrics->text, "gpushare_tenant_steps_total{tenant=\"alice\"} 25\n"));
  cr_assert_not_null(strstr(r->metrics->text, "gpushare_tenant_preemptions_total{tenant=\"alice\"} 1\n"));
  cr_assert_not_null(strstr(r->metrics->text, "gpushare_tenant_steps_total{tenant=\"bob\"} 0\n"));
  gpushare__v1__response__free_unpacked(r, NULL);
}

Test(rpc, usage_is_read_by_whom_it_belongs_to) {
  setup_alice_bob();
  Gpushare__V1__Response *r = usage_call(&admin, NULL, false, 0);
  expect_ok(r);
  cr_assert_eq(r->usage->n_tenant, 2, "an admin sees every tenant");
  cr_assert_str_eq(r->usage->tenant[0]->tenant, "alice");
  cr_assert_str_eq(r->usage->tenant[1]->tenant, "bob");
  cr_assert_eq(r->usage->tenant[1]->total->steps, 0);
  gpushare__v1__response__free_unpacked(r, NULL);
  r = usage_call(&admin, "bob", false, 0);
  expect_ok(r);
  cr_assert_eq(r->usage->n_tenant, 1);
  cr_assert_str_eq(r->usage->tenant[0]->tenant, "bob");
  gpushare__v1__response__free_unpacked(r, NULL);
  r = usage_call(&bob, "alice", false, 0);
  expect_err(r, GPUSHARE__V1__CODE__PERMISSION_DENIED, "usage.tenant");
  gpushare__v1__response__free_unpacked(r, NULL);
  r = usage_call(&nobody, NULL, false, 0);
  cr_assert_eq(r->code, GPUSHARE__V1__CODE__PERMISSION_DENIED);
  gpushare__v1__response__free_unpacked(r, NULL);
  r = usage_call(&admin, "nope", false, 0);
  expect_err(r, GPUSHARE__V1__CODE__NOT_FOUND, "usage.tenant");
  gpushare__v1__response__free_unpacked(r, NULL);
  r = usage_call(&alice, NULL, true, -5);
  expect_err(r, GPUSHARE__V1__CODE__INVALID_ARGUMENT, "usage.since_unix");
  cr_assert_not_null(strstr(r->message, "-5"), "%s", r->message);
  gpushare__v1__response__free_unpacked(r, NULL);
  r = usage_call(&alice, NULL, true, (int64_t)time(NULL) + 3 * 86400);
  expect_err(r, GPUSHARE__V1__CODE__INVALID_ARGUMENT, "usage.since_unix");
  cr_assert_not_null(strstr(r->message, "in the future"), "%s", r->message);
  gpushare__v1__response__free_unpacked(r, NULL);
  r = usage_call(&alice, NULL, true, (int64_t)time(NULL));
  expect_ok(r);
  gpushare__v1__response__free_unpacked(r, NULL);
}

/* ---- uploads of the other formats, and jobs on them ---------------------- */

/* A .npy file: header dict (padded as numpy.save pads it), then data. */
static size_t npy_dict(uint8_t *out, const char *dict, const void *data, size_t len) {
  int n = (int)strlen(dict);
  size_t hl = (10 + (size_t)n + 1 + 63) / 64 * 64 - 10;
  memcpy(out, "\x93NUMPY\x01\x00", 8);
  out[8] = (uint8_t)hl;
  out[9] = (uint8_t)(hl >> 8);
  memset(out + 10, ' ', hl);
  memcpy(out + 10, dict, (size_t)n);
  out[10 + hl - 1] = '\n';
  memcpy(out + 10 + hl, data, len);
  return 10 + hl + len;
}

/* numpy.save's header for descr and shape, then data. */
static size_t npy_bytes(uint8_t *out, const char *descr, const char *shape, const void *data,
                        size_t len) {
  char dict[128];
  snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }", descr,
           shape);
  return npy_dict(out, dict, data, len);
}

/* One whole upload in one chunk; format -1: none named. */
static Gpushare__V1__Response *upload(const gs_peer *p, const char *name, const void *data,
                                      size_t len, int format, uint32_t vocab) {
  Gpushare__V1__Request rq = GPUSHARE__V1__REQUEST__INIT;
  Gpushare__V1__UploadDatasetRequest up = GPUSHARE__V1__UPLOAD_DATASET_REQUEST__INIT;
  up.name = (char *)name;
  up.has_data = up.has_commit = up.commit = 1;
  up.data.data = (uint8_t *)data;
  up.data.len = len;
  if (format >= 0) {
    up.has_format = 1;
    up.format = (Gpushare__V1__DatasetFormat)format;
  }
  if (vocab) {
    up.has_vocab_size = 1;
    up.vocab_size = vocab;
  }
  rq.call_case = GPUSHARE__V1__REQUEST__CALL_UPLOAD_DATASET;
  rq.upload_dataset = &up;
  return call(p, &rq);
}

/* Files under STATE/sub. */
static int files_in(const char *sub) {
  char cmd[256];
  snprintf(cmd, sizeof cmd, "test $(ls -A '%s/%s' | wc -l) -eq 0", dir, sub);
  int none = system(cmd) == 0;
  snprintf(cmd, sizeof cmd, "test $(ls -A '%s/%s' | wc -l) -eq 1", dir, sub);
  return none ? 0 : system(cmd) == 0 ? 1 : 2;
}

#define NPY GPUSHARE__V1__DATASET_FORMAT__DATASET_FORMAT_NPY
#define TEXT GPUSHARE__V1__DATASET_FORMAT__DATASET_FORMAT_TEXT
#define TOKENS GPUSHARE__V1__DATASET_FORMAT__DATASET_FORMAT_TOKENS_U16

static void refused_upload(const char *name, const void *data, size_t len, int format,
                           uint32_t vocab, const char *field, const char *word) {
  Gpushare__V1__Response *r = upload(&alice, name, data, len, format, vocab);
  expect_err(r, GPUSHARE__V1__CODE__INVALID_ARGUMENT, field);
  cr_assert(strstr(r->message, word), "\"%s\" lacks \"%s\"", r->message, word);
  cr_assert(strstr(r->message, name) || strcmp(field, "upload_dataset.data"),
            "the message names the dataset: %s", r->message);
  gpushare__v1__response__free_unpacked(r, NULL);
  cr_assert_eq(files_in("datasets"), 0, "nothing was stored");
  cr_assert_eq(files_in("uploads"), 0, "no upload is left behind");
  gs_dataset_row row;
  gs_err e;
  gs_err_clear(&e);
  cr_assert_lt(gs_store_dataset_get(d.store, "alice", name, &row, &e), 0, "no row for %s", name);
}

Test(rpc, uploads_are_checked_as_their_format_and_refusals_keep_nothing) {
  setup_alice_bob();
  uint8_t buf[4096];
  static const uint8_t zeros[64];
  size_t n;
  int32_t lab[4] = {0, 1, 2, -1};
  n = npy_bytes(buf, "<i4", "(4,)", lab, sizeof lab);
  refused_upload("neg.npy", buf, n, NPY, 0, "upload_dataset.data", "label -1 at index 3");
  n = npy_dict(buf, "{'descr': '|u1', 'fortran_order': True, 'shape': (2, 2, 2), }", zeros, 8);
  refused_upload("f.npy", buf, n, NPY, 0, "upload_dataset.data", "Fortran order");
  n = npy_bytes(buf, ">f4", "(2, 2, 2)", zeros, 32);
  refused_upload("be.npy", buf, n, NPY, 0, "upload_dataset.data", "big-endian");
  n = npy_bytes(buf, "|O", "(2, 2, 2)", zeros, 8);
  refused_upload("o.npy", buf, n, NPY, 0, "upload_dataset.data", "object array");
  n = npy_bytes(buf, "|u1", "(2, 2, 2)", zeros, 8);
  refused_upload("t.npy", buf, n - 1, NPY, 0, "upload_dataset.data", "truncated");
  /* An .npy upload named as IDX (the default) is checked as IDX. */
  n = npy_bytes(buf, "|u1", "(2, 2, 2)", zeros, 8);
  refused_upload("i.npy", buf, n, -1, 0, "upload_dataset.data", "not an IDX file");
  uint16_t ids[6] = {1, 2, 3, 40000, 5, 6};
  refused_upload("ids.bin", ids, sizeof ids, TOKENS, 1000, "upload_dataset.data",
                 "token id 40000 at byte offset 6");
  refused_upload("ids.bin", ids, 11, TOKENS, 65536, "upload_dataset.data", "odd number");
  refused_upload("ids.bin", ids, sizeof ids, TOKENS, 0, "upload_dataset.vocab_size",
                 "vocab_size is 0");
  refused_upload("ids.bin", ids, sizeof ids, 9, 0, "upload_dataset.format", "format 9");
  refused_upload("one.txt", "x", 1, TEXT, 0, "upload_dataset.data", "holds 1 token");

  /* Good files of each format are kept. */
  Gpushare__V1__Response *r = upload(&alice, "ids.bin", ids, sizeof ids, TOKENS, 65536);
  expect_ok(r);
  gpushare__v1__response__free_unpacked(r, NULL);
  r = upload(&alice, "book.txt", "to be or not to be", 18, TEXT, 0);
  expect_ok(r);
  gpushare__v1__response__free_unpacked(r, NULL);
  n = npy_bytes(buf, "|u1", "(2, 2, 2)", zeros, 8);
  r = upload(&alice, "x.npy", buf, n, NPY, 0);
  expect_ok(r);
  gpushare__v1__response__free_unpacked(r, NULL);
  cr_assert_eq(files_in("uploads"), 0);
}

Test(rpc, npy_and_token_jobs_are_checked_at_submit) {
  setup_alice_bob();
  /* 64 examples of 8x8 float32, labels 0..3 as uint8. */
  static uint8_t img[64 * 64 * 4 + 128], lab[64 + 128];
  static float px[64 * 64];
  uint8_t y[64];
  for (int i = 0; i < 64 * 64; i++) px[i] = (float)(i % 13) / 13.0f;
  for (int i = 0; i < 64; i++) y[i] = (uint8_t)(i % 4);
  size_t ni = npy_bytes(img, "<f4", "(64, 8, 8)", px, sizeof px);
  size_t nl = npy_bytes(lab, "|u1", "(64,)", y, sizeof y);
  Gpushare__V1__Response *r = upload(&alice, "x.npy", img, ni, NPY, 0);
  expect_ok(r);
  char xref[80], yref[80];
  snprintf(xref, sizeof xref, "sha256:%s", r->upload_dataset->dataset->sha256);
  gpushare__v1__response__free_unpacked(r, NULL);
  r = upload(&alice, "y.npy", lab, nl, NPY, 0);
  expect_ok(r);
  snprintf(yref, sizeof yref, "sha256:%s", r->upload_dataset->dataset->sha256);
  gpushare__v1__response__free_unpacked(r, NULL);

  spec_buf s;
  spec_init(&s, 64);
  Gpushare__V1__NpyFiles npy = GPUSHARE__V1__NPY_FILES__INIT;
  npy.images = xref;
  npy.labels = yref;
  s.train.source_case = GPUSHARE__V1__DATASET__SOURCE_NPY;
  s.train.npy = &npy;
  s.spec.has_batch_size = 1;
  s.spec.batch_size = 16;
  r = submit(&alice, &s.spec);
  expect_ok(r);
  gpushare__v1__response__free_unpacked(r, NULL);

  /* The labels named as images, and a model of another input shape. */
  npy.images = yref;
  r = submit(&alice, &s.spec);
  expect_err(r, GPUSHARE__V1__CODE__INVALID_ARGUMENT, "submit.spec.train.npy.images");
  cr_assert(strstr(r->message, "is it the labels file?"), "%s", r->message);
  gpushare__v1__response__free_unpacked(r, NULL);
  npy.images = xref;
  s.in.height = 7;
  r = submit(&alice, &s.spec);
  cr_assert_eq(r->code, GPUSHARE__V1__CODE__INVALID_ARGUMENT, "%s", r->message);
  gpushare__v1__response__free_unpacked(r, NULL);
  s.in.height = 8;

  /* A token stream: its file is checked, then the model is named. */
  uint16_t ids[65];
  for (int i = 0; i < 65; i++) ids[i] = (uint16_t)(i * 3);
  r = upload(&alice, "ids.bin", ids, sizeof ids, TOKENS, 200);
  expect_ok(r);
  char tref[80];
  snprintf(tref, sizeof tref, "sha256:%s", r->upload_dataset->dataset->sha256);
  gpushare__v1__response__free_unpacked(r, NULL);
  Gpushare__V1__TokenFile tok = GPUSHARE__V1__TOKEN_FILE__INIT;
  tok.path = tref;
  tok.has_vocab_size = 1;
  tok.vocab_size = 150; /* ids go to 192 */
  s.train.source_case = GPUSHARE__V1__DATASET__SOURCE_TOKENS;
  s.train.tokens = &tok;
  s.train.has_sequence_length = 1;
  s.train.sequence_length = 4;
  r = submit(&alice, &s.spec);
  expect_err(r, GPUSHARE__V1__CODE__INVALID_ARGUMENT, "submit.spec.train.tokens.path");
  cr_assert(strstr(r->message, "token id 150 at byte offset 100"), "%s", r->message);
  gpushare__v1__response__free_unpacked(r, NULL);
  tok.vocab_size = 256;
  s.train.sequence_length = 0;
  r = submit(&alice, &s.spec);
  expect_err(r, GPUSHARE__V1__CODE__INVALID_ARGUMENT, "submit.spec.train.sequence_length");
  gpushare__v1__response__free_unpacked(r, NULL);
  s.train.sequence_length = 4;
  tok.has_examples = 1;
  tok.examples = 17; /* (65 - 1) / 4 = 16 */
  r = submit(&alice, &s.spec);
  expect_err(r, GPUSHARE__V1__CODE__INVALID_ARGUMENT, "submit.spec.train.tokens.examples");
  gpushare__v1__response__free_unpacked(r, NULL);
  tok.examples = 0;
  r = submit(&alice, &s.spec);
  expect_err(r, GPUSHARE__V1__CODE__INVALID_ARGUMENT, "submit.spec.train.tokens");
  cr_assert(strstr(r->message, "the model takes images of 8x8x1"), "%s", r->message);
  cr_assert(strstr(r->message, "needs a model whose input is token ids"), "%s", r->message);
  gpushare__v1__response__free_unpacked(r, NULL);
}
