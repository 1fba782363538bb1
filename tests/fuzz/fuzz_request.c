/*
 * fuzz_request: one frame body as gpushared's dispatcher receives it.
 *
 * The bytes go to the real dispatcher, gs_rpc_handle (control/rpc.c), on a
 * daemon with a store and a state directory in a temporary directory and
 * no executors (jobs that are accepted stay QUEUED), twice: as an admin
 * (uid 0) and as a member of tenant alice, who has a vdev and two datasets
 * (their rows only: a job naming them gets as far as reading the blob).
 * Every handler the call reaches runs as in the daemon: validation and its
 * field paths, plan and submit through the planner and the model
 * (control/admit.c), the dataset references through gs_datasets_resolve
 * (which refuses anything that looks like a client path), the store.
 * Checked on each answer: the dispatcher answers (a frame, never a
 * deferred one: there is no connection to stream on), the answer unpacks
 * as a gpushare.v1.Response echoing the request id, and a refusal has a
 * message. Also:
 *  - gs_wire_unpack_request's refusal always carries a message and a field:
 *    "frame", or the path of a string that is not UTF-8 text (inside the
 *    request's call, and the message starts with it); the same bytes also go through gs_wire_unpack_response (what
 *    gpuctl runs on replies);
 *  - a pack/unpack round trip of the request: what the daemon unpacked packs
 *    (gs_wire_frame) and unpacks again to the same bytes.
 * State carries over between inputs (tenants, vdevs, jobs the fuzzer
 * made); the fixture is put back when an input removed it, alice's
 * max_queued bounds the jobs kept, and uploads are dropped after each
 * input as a closing connection drops them.
 */
#define _XOPEN_SOURCE 700
#include <ftw.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "control/daemon.h"
#include "control/datasets.h"
#include "control/job.h"
#include "control/rpc.h"
#include "control/rpc_datasets.h"
#include "control/store.h"
#include "proto/wire.h"
#include "tests/fuzz/fuzz_tmp.h"

static gs_daemon daemon_;
static uv_loop_t loop_;
static char tmpdir[PATH_MAX];
#define TENANT "alice"
#define SHA "3f5a0e8b1c2d4e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7"

static const gs_peer admin = {.pid = 1, .uid = 0, .gid = 0, .gids = {0}, .n_gids = 1};
static const gs_peer member = {.pid = 2, .uid = 1000, .gid = 1000, .gids = {1000}, .n_gids = 1};

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *f) {
  (void)st;
  (void)flag;
  (void)f;
  return remove(p);
}

static void cleanup(void) {
  gs_rpc_free(&daemon_);
  gs_jobs_free(&daemon_);
  if (daemon_.store) gs_store_close(daemon_.store);
  daemon_.store = NULL;
  nftw(tmpdir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static void die(const char *what, const gs_err *e) {
  fprintf(stderr, "fuzz_request: %s: %s\n", what, e->msg);
  exit(1);
}

/* Tenant alice (uid 1000, max_queued 8), its vdev and its datasets, made
 * again when an input deleted them. */
static void fixture(void) {
  gs_err e;
  gs_err_clear(&e);
  gs_tenant got;
  if (gs_store_tenant_get(daemon_.store, TENANT, &got, NULL) == 0) {
    gs_tenant_clear(&got);
  } else {
    gs_tenant tn;
    memset(&tn, 0, sizeof tn);
    uint32_t uid = member.uid;
    snprintf(tn.name, sizeof tn.name, TENANT);
    tn.uids = &uid;
    tn.n_uids = 1;
    tn.quota.max_queued = 8;
    if (gs_store_tenant_create(daemon_.store, &tn, &e) < 0) die("tenant", &e);
  }
  gs_vdev v;
  if (gs_store_vdev_get(daemon_.store, "va", &v, NULL) < 0) {
    memset(&v, 0, sizeof v);
    snprintf(v.name, sizeof v.name, "va");
    snprintf(v.device, sizeof v.device, "cpu");
    snprintf(v.tenant, sizeof v.tenant, TENANT);
    v.memory_limit = 256ull << 20;
    v.compute_share = 10;
    gs_device_limits lim = {.usable = UINT64_MAX / 2, .oversubscribed = true};
    gs_err_clear(&e);
    gs_store_vdev_create(daemon_.store, &v, &lim, &e); /* a fuzzed vdev may hold the name */
  }
  static const char *const names[] = {"fashion.images", "fashion.labels"};
  for (size_t i = 0; i < 2; i++) {
    gs_dataset_row r = {.bytes = 100, .created = 1};
    if (gs_store_dataset_get(daemon_.store, TENANT, names[i], &r, NULL) == 0) continue;
    snprintf(r.tenant, sizeof r.tenant, TENANT);
    snprintf(r.sha256, sizeof r.sha256, SHA);
    snprintf(r.name, sizeof r.name, "%s", names[i]);
    gs_err_clear(&e);
    gs_store_dataset_add(daemon_.store, &r, &e);
  }
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  fuzz_tmpdir_make(tmpdir, sizeof tmpdir, "request");
  gs_config_defaults(&daemon_.cfg);
  snprintf(daemon_.cfg.state_dir, sizeof daemon_.cfg.state_dir, "%s", tmpdir);
  uv_loop_init(&loop_);
  daemon_.loop = &loop_;
  gs_err e;
  gs_err_clear(&e);
  if (gs_store_open(tmpdir, &daemon_.store, &e) < 0) die("store", &e);
  atexit(cleanup);
  if (gs_devices_discover(&daemon_.cfg, &daemon_.devices, &e) < 0) die("devices", &e);
  if (gs_datasets_init(&daemon_, &e) < 0) die("datasets", &e);
  if (gs_jobs_load(&daemon_, &e) < 0) die("jobs", &e);
  fixture();
  return 0;
}

/* The dispatcher answers, the answer reads back, a refusal says why. */
static void handle(const gs_peer *peer, const uint8_t *data, size_t size, bool has_id,
                   uint64_t id) {
  uint8_t *frame = NULL;
  size_t flen = 0;
  if (gs_rpc_handle(&daemon_, NULL, peer, data, size, &frame, &flen) != 0) abort();
  if (!frame || flen < 4) abort();
  gs_err e;
  gs_err_clear(&e);
  Gpushare__V1__Response *r = gs_wire_unpack_response(frame + 4, flen - 4, &e);
  free(frame);
  if (!r) abort(); /* what gpushared answers, gpuctl reads */
  if (has_id && (!r->has_id || r->id != id)) abort();
  if (!r->has_code) abort();
  if (r->code != GPUSHARE__V1__CODE__OK && (!r->message || !r->message[0])) abort();
  if (r->code == GPUSHARE__V1__CODE__OK && r->result_case == GPUSHARE__V1__RESPONSE__RESULT__NOT_SET)
    abort(); /* an answer to a call carries its result */
  gpushare__v1__response__free_unpacked(r, NULL);
  /* A closing connection drops its uploads; these calls had none. */
  gs_rpc_datasets_conn_closed(&daemon_, NULL);
}

static void round_trip(const Gpushare__V1__Request *rq) {
  uint8_t *f1, *f2;
  size_t n1, n2;
  if (gs_wire_frame(&rq->base, &f1, &n1) != 0) return; /* over the limit */
  gs_err e;
  gs_err_clear(&e);
  Gpushare__V1__Request *again = gs_wire_unpack_request(f1 + 4, n1 - 4, &e);
  if (!again) abort(); /* what gpushare packs, gpushare reads */
  if (gs_wire_frame(&again->base, &f2, &n2) != 0) abort();
  if (n1 != n2 || memcmp(f1, f2, n1) != 0) abort();
  free(f1);
  free(f2);
  gpushare__v1__request__free_unpacked(again, NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  gs_err e;
  gs_err_clear(&e);
  Gpushare__V1__Request *rq = gs_wire_unpack_request(data, size, &e);
  bool has_id = false;
  uint64_t id = 0;
  if (!rq) {
    if (e.code != GS_INVALID_ARGUMENT || !e.field[0] || !e.msg[0]) abort();
    if (strcmp(e.field, "frame") != 0 &&
        (!strchr(e.field, '.') || strncmp(e.msg, e.field, strlen(e.field)) != 0))
      abort(); /* a string's path is inside a call, and its refusal starts with it */
  } else {
    has_id = rq->has_id;
    id = rq->id;
    round_trip(rq);
    gpushare__v1__request__free_unpacked(rq, NULL);
  }
  fixture();
  handle(&member, data, size, has_id, id);
  handle(&admin, data, size, has_id, id);
  gs_err_clear(&e);
  Gpushare__V1__Response *rs = gs_wire_unpack_response(data, size, &e);
  if (rs) gpushare__v1__response__free_unpacked(rs, NULL);
  else if (e.code != GS_INVALID_ARGUMENT || !e.msg[0]) abort();
  return 0;
}
