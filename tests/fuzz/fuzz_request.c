/*
 * fuzz_request: one frame body as gpushared's dispatcher receives it.
 *
 * gs_rpc_handle (control/rpc.c) needs a live daemon: the peer's identity and
 * every handler go to the store, and submit/plan/watch to the job table and
 * the executors. What it runs on the bytes before any of that is fuzzed
 * here, with the real functions:
 *  - gs_wire_unpack_request (proto/wire.c): the checked unpack, whose
 *    refusal must always carry a message with field "frame"; the same bytes
 *    also go through gs_wire_unpack_response (what gpuctl runs on replies);
 *  - the call's own checks that come before the store: gs_store_name_valid
 *    for the names of create_tenant, delete_tenant, set_quota, get_quota,
 *    create_vdev, delete_vdev, upload_dataset, remove_dataset and the vdev of
 *    plan/submit (control/store.c); for plan, gs_plan_job and the plan's text,
 *    JSON and message (runtime/plan.c); for submit, the name length check's
 *    input, gs_model_build (runtime/model.c), the dataset references
 *    through gs_datasets_resolve (control/datasets.c, which refuses anything
 *    that looks like a client path) against a real store opened in a
 *    temporary directory, and gs_plan_admit with the spec's auto_fit against
 *    a 256 MiB vdev, as gs_rpc_submit does;
 *  - a pack/unpack round trip of the request: what the daemon unpacked packs
 *    (gs_wire_frame) and unpacks again to the same bytes.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/backend.h"
#include "control/daemon.h"
#include "control/datasets.h"
#include "runtime/model.h"
#include "runtime/plan.h"
#include "runtime/spec_pb.h"
#include "present/present.h"
#include "control/store.h"
#include "tests/fuzz/fuzz_tmp.h"
#include "proto/wire.h"

/* gpushared's main.c defines this for server.c's SIGHUP reload, which the
 * linker pulls in with datasets.c; nothing here reloads a configuration. */
void gs_daemon_resolve_admin(gs_daemon *d) {
  (void)d;
  abort();
}

static gs_daemon daemon_;
static char tmpdir[4096];
#define TENANT "alice"
#define SHA "3f5a0e8b1c2d4e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7"

static void cleanup(void) {
  if (daemon_.store) gs_store_close(daemon_.store);
  daemon_.store = NULL;
  static const char *const files[] = {"gpushared.db", "gpushared.db-wal", "gpushared.db-shm"};
  fuzz_tmpdir_remove(tmpdir, files, sizeof files / sizeof files[0]);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  fuzz_tmpdir_make(tmpdir, sizeof tmpdir, "request");
  snprintf(daemon_.cfg.state_dir, sizeof daemon_.cfg.state_dir, "%s", tmpdir);
  gs_err e;
  gs_err_clear(&e);
  if (gs_store_open(tmpdir, &daemon_.store, &e) < 0) {
    fprintf(stderr, "fuzz_request: store: %s\n", e.msg);
    exit(1);
  }
  atexit(cleanup);
  /* A tenant with two datasets, so references can resolve. */
  gs_tenant tn;
  memset(&tn, 0, sizeof tn);
  snprintf(tn.name, sizeof tn.name, TENANT);
  gs_dataset_row r = {.bytes = 100, .created = 1};
  snprintf(r.tenant, sizeof r.tenant, TENANT);
  snprintf(r.sha256, sizeof r.sha256, SHA);
  if (gs_store_tenant_create(daemon_.store, &tn, &e) < 0) goto fail;
  snprintf(r.name, sizeof r.name, "fashion.images");
  if (gs_store_dataset_add(daemon_.store, &r, &e) < 0) goto fail;
  snprintf(r.name, sizeof r.name, "fashion.labels");
  if (gs_store_dataset_add(daemon_.store, &r, &e) < 0) goto fail;
  return 0;
fail:
  fprintf(stderr, "fuzz_request: store setup: %s\n", e.msg);
  exit(1);
}

/* A refusal must say what and where. */
static void check_refusal(int rc, const gs_err *e) {
  if (rc < 0 && (e->code == GS_OK || !e->msg[0])) abort();
  if (rc == 0 && e->code != GS_OK) abort();
}

static void name(const char *s, const char *what) {
  gs_err e;
  gs_err_clear(&e);
  int rc = gs_store_name_valid(s, what, &e);
  check_refusal(rc, &e);
  if (rc == 0 && (strlen(s) == 0 || strlen(s) > GS_NAME_MAX)) abort();
}

static void resolve(const char *ref, const char *field) {
  gs_err e;
  gs_err_clear(&e);
  char path[4200];
  int rc = gs_datasets_resolve(&daemon_, TENANT, ref, field, path, sizeof path, &e);
  check_refusal(rc, &e);
  if (rc == 0) {
    /* Only ever a blob of the store, never a path the client named. */
    char want[4200];
    gs_dataset_blob_path(&daemon_, SHA, want, sizeof want);
    if (strcmp(path, want) != 0) abort();
  }
}

static void datasets(const Gpushare__V1__Dataset *ds, const char *field) {
  if (!ds) return;
  char f[96];
  if (ds->source_case == GPUSHARE__V1__DATASET__SOURCE_IDX) {
    snprintf(f, sizeof f, "%s.idx.images", field);
    resolve(ds->idx->images, f);
    snprintf(f, sizeof f, "%s.idx.labels", field);
    resolve(ds->idx->labels, f);
  } else if (ds->source_case == GPUSHARE__V1__DATASET__SOURCE_NAME) {
    /* jobs.c resolve_dataset: NAME.images and NAME.labels */
    char n[GS_NAME_MAX + 8];
    snprintf(f, sizeof f, "%s.name", field);
    snprintf(n, sizeof n, "%s.images", ds->name);
    resolve(n, f);
    snprintf(n, sizeof n, "%s.labels", ds->name);
    resolve(n, f);
  }
}

static void plan(const Gpushare__V1__JobSpec *spec, uint64_t limit) {
  gs_err e;
  gs_err_clear(&e);
  gs_plan p;
  gs_job_spec js;
  int rc = gs_spec_pb_job(spec, &js, &e);
  if (rc == 0) rc = gs_plan_job(&js, gs_backend_cpu(), &p, &e);
  gs_spec_pb_job_free(&js);
  check_refusal(rc, &e);
  if (rc) return;
  char *json = gs_plan_json(&p, limit);
  Gpushare__V1__Plan *msg = NULL;
  if (gs_spec_pb_plan(&p, limit, GS_POLICY_GROWTH, &msg) == 0) {
    msg->summary = gs_present_plan(msg);
    uint8_t *frame;
    size_t n;
    if (gs_wire_frame(&msg->base, &frame, &n) == 0) free(frame);
    gpushare__v1__plan__free_unpacked(msg, NULL);
  }
  free(json);
  gs_plan_free(&p);
}

static void submit(const Gpushare__V1__JobSpec *spec) {
  if (!spec) return;
  if (spec->vdev && *spec->vdev) name(spec->vdev, "spec.vdev");
  gs_err e;
  gs_err_clear(&e);
  gs_model m;
  gs_job_spec js;
  int rc = gs_spec_pb_job(spec, &js, &e);
  if (rc == 0) rc = gs_model_build(&js, &m, &e);
  check_refusal(rc, &e);
  if (rc) {
    gs_spec_pb_job_free(&js);
    return;
  }
  if (!spec->train || spec->train->source_case == GPUSHARE__V1__DATASET__SOURCE__NOT_SET) {
    gs_model_free(&m);
    gs_spec_pb_job_free(&js);
    return;
  }
  datasets(spec->train, "spec.train");
  datasets(spec->test, "spec.test");
  gs_model_free(&m);
  gs_admission adm;
  gs_err_clear(&e);
  bool auto_fit = spec->has_auto_fit && spec->auto_fit;
  rc = gs_plan_admit(&js, gs_backend_cpu(), 256ull << 20, auto_fit, &adm, &e);
  gs_spec_pb_job_free(&js);
  check_refusal(rc, &e);
  if (rc) return;
  if (adm.fits && !gs_plan_fits(&adm.plan, 256ull << 20, GS_POLICY_GROWTH)) abort();
  if (!adm.fits && !adm.why[0]) abort(); /* a refusal says why */
  gs_admission_free(&adm);
}

static void validate(const Gpushare__V1__Request *rq) {
  switch (rq->call_case) {
    case GPUSHARE__V1__REQUEST__CALL_CREATE_TENANT:
      name(rq->create_tenant->name, "name");
      break;
    case GPUSHARE__V1__REQUEST__CALL_DELETE_TENANT:
      name(rq->delete_tenant->name, "name");
      break;
    case GPUSHARE__V1__REQUEST__CALL_SET_QUOTA:
      name(rq->set_quota->tenant, "tenant");
      break;
    case GPUSHARE__V1__REQUEST__CALL_GET_QUOTA:
      if (rq->get_quota->tenant && *rq->get_quota->tenant) name(rq->get_quota->tenant, "tenant");
      break;
    case GPUSHARE__V1__REQUEST__CALL_CREATE_VDEV:
      name(rq->create_vdev->name, "name");
      name(rq->create_vdev->tenant, "tenant");
      break;
    case GPUSHARE__V1__REQUEST__CALL_DELETE_VDEV:
      name(rq->delete_vdev->name, "name");
      break;
    case GPUSHARE__V1__REQUEST__CALL_UPLOAD_DATASET:
      if (!rq->upload_dataset->has_upload_id || !rq->upload_dataset->upload_id)
        name(rq->upload_dataset->name, "name");
      break;
    case GPUSHARE__V1__REQUEST__CALL_REMOVE_DATASET:
      name(rq->remove_dataset->name, "name");
      break;
    case GPUSHARE__V1__REQUEST__CALL_PLAN:
      if (rq->plan->vdev && *rq->plan->vdev) name(rq->plan->vdev, "vdev");
      if (rq->plan->spec) plan(rq->plan->spec, 256ull << 20);
      break;
    case GPUSHARE__V1__REQUEST__CALL_SUBMIT:
      submit(rq->submit->spec);
      break;
    default:
      break;
  }
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
  if (!rq) {
    if (e.code != GS_INVALID_ARGUMENT || strcmp(e.field, "frame") != 0 || !e.msg[0]) abort();
  } else {
    validate(rq);
    round_trip(rq);
    gpushare__v1__request__free_unpacked(rq, NULL);
  }
  gs_err_clear(&e);
  Gpushare__V1__Response *rs = gs_wire_unpack_response(data, size, &e);
  if (rs) gpushare__v1__response__free_unpacked(rs, NULL);
  else if (e.code != GS_INVALID_ARGUMENT || !e.msg[0]) abort();
  return 0;
}
