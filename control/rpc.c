/*
 * rpc.c: one request in, one response out.
 *
 * gs_rpc_handle takes the body of one frame from a peer, unpacks it with
 * checks (a body that is not a gpushare.v1.Request is answered, not
 * dropped), identifies the peer against the store (auth.c), finds the
 * handler for its call in `calls[]` (each entry states the role it needs),
 * and packs the Response. Handlers build their results in a per-request
 * arena, freed in one go after packing, so no handler has a cleanup ladder
 * for the response it returns. Errors travel as gs_err: code, field path
 * (prefixed with the call's name: "create_vdev.memory_limit") and message.
 *
 * The handlers live by group, below this dispatcher: rpc_admin.c (devices,
 * tenants, quotas, vdevs, version, metrics), rpc_jobs.c (plan, submit and
 * the job calls) and rpc_datasets.c (uploads). The server hands frames in
 * through a function pointer main.c gives it, so a handler may use the
 * connection (server.h) without a circle.
 */
#include "control/rpc.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/size.h"
#include "control/auth.h"
#include "control/log.h"
#include "control/rpc_admin.h"
#include "control/rpc_datasets.h"
#include "control/rpc_jobs.h"
#include "proto/wire.h"

static int oom(gs_call *c, gs_err *e) {
  (void)c;
  return gs_err_set(e, GS_INTERNAL, "", "gpushared ran out of memory building the response");
}

static const struct call {
  const char *name; /* the oneof field name, used in messages and field paths */
  gs_need need;
  gs_rpc_handler fn;
} calls[] = {
    /* docs/protocol.md, Authentication: anyone connected may list devices;
     * tenants and their quotas are the admins' (a member reads its own with
     * get_quota). */
    [GPUSHARE__V1__REQUEST__CALL_LIST_DEVICES] = {"list_devices", GS_NEED_ANY, gs_rpc_list_devices},
    [GPUSHARE__V1__REQUEST__CALL_CREATE_TENANT] = {"create_tenant", GS_NEED_ADMIN, gs_rpc_create_tenant},
    [GPUSHARE__V1__REQUEST__CALL_LIST_TENANTS] = {"list_tenants", GS_NEED_ADMIN, gs_rpc_list_tenants},
    [GPUSHARE__V1__REQUEST__CALL_DELETE_TENANT] = {"delete_tenant", GS_NEED_ADMIN, gs_rpc_delete_tenant},
    [GPUSHARE__V1__REQUEST__CALL_SET_QUOTA] = {"set_quota", GS_NEED_ADMIN, gs_rpc_set_quota},
    [GPUSHARE__V1__REQUEST__CALL_GET_QUOTA] = {"get_quota", GS_NEED_TENANT, gs_rpc_get_quota},
    [GPUSHARE__V1__REQUEST__CALL_CREATE_VDEV] = {"create_vdev", GS_NEED_ADMIN, gs_rpc_create_vdev},
    [GPUSHARE__V1__REQUEST__CALL_LIST_VDEVS] = {"list_vdevs", GS_NEED_TENANT, gs_rpc_list_vdevs},
    [GPUSHARE__V1__REQUEST__CALL_DELETE_VDEV] = {"delete_vdev", GS_NEED_ADMIN, gs_rpc_delete_vdev},
    [GPUSHARE__V1__REQUEST__CALL_UPDATE_VDEV] = {"update_vdev", GS_NEED_ADMIN, gs_rpc_update_vdev},
    [GPUSHARE__V1__REQUEST__CALL_UPLOAD_DATASET] = {"upload_dataset", GS_NEED_TENANT, gs_rpc_upload_dataset},
    [GPUSHARE__V1__REQUEST__CALL_LIST_DATASETS] = {"list_datasets", GS_NEED_TENANT, gs_rpc_list_datasets},
    [GPUSHARE__V1__REQUEST__CALL_REMOVE_DATASET] = {"remove_dataset", GS_NEED_TENANT, gs_rpc_remove_dataset},
    [GPUSHARE__V1__REQUEST__CALL_PLAN] = {"plan", GS_NEED_TENANT, gs_rpc_plan},
    [GPUSHARE__V1__REQUEST__CALL_SUBMIT] = {"submit", GS_NEED_TENANT, gs_rpc_submit},
    [GPUSHARE__V1__REQUEST__CALL_JOB_STATUS] = {"job_status", GS_NEED_TENANT, gs_rpc_job_status},
    [GPUSHARE__V1__REQUEST__CALL_LIST_JOBS] = {"list_jobs", GS_NEED_TENANT, gs_rpc_list_jobs},
    [GPUSHARE__V1__REQUEST__CALL_WATCH] = {"watch", GS_NEED_TENANT, gs_rpc_watch},
    [GPUSHARE__V1__REQUEST__CALL_CANCEL] = {"cancel", GS_NEED_TENANT, gs_rpc_cancel},
    [GPUSHARE__V1__REQUEST__CALL_LOGS] = {"logs", GS_NEED_TENANT, gs_rpc_logs},
    [GPUSHARE__V1__REQUEST__CALL_FETCH] = {"fetch", GS_NEED_TENANT, gs_rpc_fetch},
    [GPUSHARE__V1__REQUEST__CALL_MEMORY] = {"memory", GS_NEED_TENANT, gs_rpc_memory},
    [GPUSHARE__V1__REQUEST__CALL_METRICS] = {"metrics", GS_NEED_ADMIN, gs_rpc_metrics},
    [GPUSHARE__V1__REQUEST__CALL_VERSION] = {"version", GS_NEED_ANY, gs_rpc_version},
    /* An admin reads every tenant's usage, a member its own tenant's. */
    [GPUSHARE__V1__REQUEST__CALL_USAGE] = {"usage", GS_NEED_TENANT, gs_rpc_usage},
};
#define N_CALLS (sizeof calls / sizeof calls[0])

/* Each call's oneof member is a message pointer in the same union slot; a
 * present-but-NULL one cannot come out of protobuf-c, but check anyway. */
static bool call_present(const Gpushare__V1__Request *rq) { return rq->list_devices != NULL; }

/* Why a Request has no call we know, in words: nothing set, the field
 * numbers it does carry, or the shape of a Response sent the wrong way. */
static void unknown_call_why(const Gpushare__V1__Request *rq, char *buf, size_t len) {
  size_t n = rq->base.n_unknown_fields;
  if (n == 0) {
    snprintf(buf, len, "the call field is empty");
    return;
  }
  bool response = false;
  size_t o = (size_t)snprintf(buf, len, "field%s ", n == 1 ? "" : "s");
  for (size_t i = 0; i < n && o < len; i++) {
    uint32_t t = rq->base.unknown_fields[i].tag;
    response |= t >= 2 && t <= 5; /* Response.code, message, field, plan */
    o += (size_t)snprintf(buf + o, len - o, "%s%" PRIu32, i ? ", " : "", t);
  }
  if (o < len)
    snprintf(buf + o, len - o, "%s",
             response ? ": a gpushare.v1.Response's code/message, not a Request"
                      : " from a newer protocol");
}

/* max_job_spec: a submit's or plan's JobSpec, packed, before any handler
 * reads it (a spec is stored with its job and read back at every restart). */
static int spec_fits(const gs_daemon *d, const Gpushare__V1__Request *rq, gs_err *e) {
  const Gpushare__V1__JobSpec *spec = NULL;
  if (rq->call_case == GPUSHARE__V1__REQUEST__CALL_SUBMIT) spec = rq->submit->spec;
  else if (rq->call_case == GPUSHARE__V1__REQUEST__CALL_PLAN) spec = rq->plan->spec;
  if (!spec) return 0;
  size_t n = protobuf_c_message_get_packed_size(&spec->base);
  if (n <= d->cfg.max_job_spec) return 0;
  char sz[2][32];
  return gs_err_set(e, GS_INVALID_ARGUMENT, "spec",
                    "the job spec is %s (%zu bytes); this daemon takes job specs of at most %s "
                    "(max_job_spec)",
                    gs_size_format(n, sz[0], sizeof sz[0]), n,
                    gs_size_format(d->cfg.max_job_spec, sz[1], sizeof sz[1]));
}

static int pack(Gpushare__V1__Response *resp, uint8_t **frame, size_t *len) {
  return gs_wire_frame(&resp->base, frame, len);
}

int gs_rpc_handle(gs_daemon *d, gs_conn *conn, const gs_peer *peer, const uint8_t *body,
                  size_t len, uint8_t **frame, size_t *frame_len) {
  gs_err e;
  gs_err_clear(&e);
  gs_call c = {.d = d, .peer = peer, .conn = conn};
  *frame = NULL;
  *frame_len = 0;
  Gpushare__V1__Response resp = GPUSHARE__V1__RESPONSE__INIT;
  c.resp = &resp;
  d->requests++;

  Gpushare__V1__Request *rq = gs_wire_unpack_request(body, len, &e);
  const struct call *call = NULL;
  if (rq) {
    resp.has_id = rq->has_id;
    resp.id = rq->id;
    c.req_id = rq->id;
    size_t k = (size_t)rq->call_case;
    if (k == 0 || k >= N_CALLS || !calls[k].fn) {
      char why[160];
      unknown_call_why(rq, why, sizeof why);
      gs_err_set(&e, GS_INVALID_ARGUMENT, "call",
                 "request %" PRIu64 " carries no call this gpushared knows (%s); see "
                 "proto/gpushare.proto for the calls of gpushare.v1",
                 rq->id, why);
    } else if (!call_present(rq)) {
      gs_err_set(&e, GS_INVALID_ARGUMENT, "call", "request %" PRIu64 " has an empty call", rq->id);
    } else {
      call = &calls[k];
      if (gs_auth_identify(d->store, peer, d->have_admin_gid, d->admin_gid, &c.id, &e) == 0 &&
          gs_auth_check(peer, &c.id, call->need, call->name, &e) == 0 &&
          spec_fits(d, rq, &e) == 0 && call->fn(&c, rq, &e) == 0 && !c.ar.failed) {
        resp.has_code = 1;
        resp.code = GPUSHARE__V1__CODE__OK;
      } else {
        if (c.ar.failed && e.code == GS_OK) oom(&c, &e);
        gs_err_prefix(&e, e.field[0] ? call->name : "");
        resp.result_case = GPUSHARE__V1__RESPONSE__RESULT__NOT_SET;
      }
    }
  }
  if (e.code != GS_OK) {
    resp.has_code = 1;
    resp.code = (Gpushare__V1__Code)e.code;
    resp.message = e.msg;
    if (e.field[0]) resp.field = e.field;
    gs_debug("uid %" PRIu32 " %s: %s: %s (%s)", peer->uid, call ? call->name : "request",
             gs_code_name(e.code), e.msg, e.field);
  }
  int rc = c.deferred && e.code == GS_OK ? 0 : pack(&resp, frame, frame_len);
  if (rq) gpushare__v1__request__free_unpacked(rq, NULL);
  gs_call_arena_free(&c.ar);
  return rc;
}

void gs_rpc_free(gs_daemon *d) {
  gs_rpc_jobs_free(d);
  gs_rpc_datasets_free(d);
}
