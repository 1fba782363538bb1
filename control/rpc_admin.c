/*
 * rpc_admin.c: the calls about the machine and its division: version,
 * list_devices, tenants (create, list, delete), quotas (set, get), vdevs
 * (create, list, delete) and metrics. Each states in rpc.c's table the
 * role it needs; tenants, quotas and vdevs are the admins', and a tenant
 * reads its own quota and vdevs only. A vdev created or deleted is told to
 * the executors and may start queued jobs (exec_events.c).
 */
#include "control/rpc_admin.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/size.h"
#include "control/exec_events.h"
#include "control/log.h"
#include "control/metrics.h"
#include "control/store.h"
#include "control/usage.h"

static int oom(gs_call *c, gs_err *e) {
  (void)c;
  return gs_err_set(e, GS_INTERNAL, "", "gpushared ran out of memory building the response");
}

/* ------------------------------------------------------------ converters --- */

static Gpushare__V1__Quota *quota_msg(gs_call_arena *a, const gs_quota *q) {
  Gpushare__V1__Quota *m = GS_CALL_MSG(a, Gpushare__V1__Quota, GPUSHARE__V1__QUOTA__INIT);
  if (!m) return NULL;
  m->has_memory_bytes = m->has_compute_share = m->has_max_running = m->has_max_queued = 1;
  m->memory_bytes = q->memory;
  m->compute_share = q->compute;
  m->max_running = q->max_running;
  m->max_queued = q->max_queued;
  return m;
}

static Gpushare__V1__Tenant *tenant_msg(gs_call_arena *a, const gs_tenant *t) {
  Gpushare__V1__Tenant *m = GS_CALL_MSG(a, Gpushare__V1__Tenant, GPUSHARE__V1__TENANT__INIT);
  if (!m) return NULL;
  m->name = gs_call_strdup(a, t->name);
  m->n_uids = t->n_uids;
  m->uids = gs_call_alloc(a, t->n_uids * sizeof *m->uids + 1);
  if (m->uids && t->n_uids) memcpy(m->uids, t->uids, t->n_uids * sizeof *m->uids);
  m->n_gids = t->n_gids;
  m->gids = gs_call_alloc(a, t->n_gids * sizeof *m->gids + 1);
  if (m->gids && t->n_gids) memcpy(m->gids, t->gids, t->n_gids * sizeof *m->gids);
  m->quota = quota_msg(a, &t->quota);
  m->has_memory_allocated = m->has_compute_allocated = m->has_vdev_count = 1;
  m->has_created_unix = 1;
  m->memory_allocated = t->memory_allocated;
  m->compute_allocated = t->compute_allocated;
  m->vdev_count = t->vdev_count;
  m->created_unix = t->created;
  return m;
}

static Gpushare__V1__Vdev *vdev_msg(gs_daemon *d, gs_call_arena *a, const gs_vdev *v) {
  Gpushare__V1__Vdev *m = GS_CALL_MSG(a, Gpushare__V1__Vdev, GPUSHARE__V1__VDEV__INIT);
  if (!m) return NULL;
  m->name = gs_call_strdup(a, v->name);
  m->device = gs_call_strdup(a, v->device);
  m->tenant = gs_call_strdup(a, v->tenant);
  m->has_memory_limit = m->has_compute_share = m->has_policy = m->has_created_unix = 1;
  m->memory_limit = v->memory_limit;
  m->compute_share = v->compute_share;
  m->policy = v->policy == 1 ? GPUSHARE__V1__POLICY__GROWTH : GPUSHARE__V1__POLICY__PREALLOCATE;
  m->created_unix = v->created;
  /* As the device's executor last reported: GROWTH vdevs hold memory while
   * jobs run in them, PREALLOCATE ones their whole limit once reserved. */
  m->has_memory_in_use = m->has_memory_reserved = m->has_memory_peak = 1;
  gs_vdev_live l;
  gs_exec_events_vdev_live(d, v->name, &l);
  m->memory_in_use = l.in_use;
  m->memory_reserved = l.reserved;
  m->memory_peak = l.peak;
  if (l.has_free) {
    m->has_memory_free = m->has_memory_largest_free = m->has_memory_fragmentation = 1;
    m->memory_free = l.free;
    m->memory_largest_free = l.largest_free;
    m->memory_fragmentation = l.fragmentation;
  }
  return m;
}

/* ------------------------------------------------------------- handlers --- */

int gs_rpc_version(gs_call *c, const Gpushare__V1__Request *rq, gs_err *e) {
  (void)rq;
  Gpushare__V1__VersionResponse *m =
      GS_CALL_MSG(&c->ar, Gpushare__V1__VersionResponse, GPUSHARE__V1__VERSION_RESPONSE__INIT);
  if (!m) return oom(c, e);
  m->version = gs_call_strdup(&c->ar, GS_VERSION);
  m->has_uid = m->has_admin = 1;
  m->uid = c->peer->uid;
  m->admin = c->id.admin;
  if (c->id.tenant[0]) m->tenant = gs_call_strdup(&c->ar, c->id.tenant);
  c->resp->result_case = GPUSHARE__V1__RESPONSE__RESULT_VERSION;
  c->resp->version = m;
  return 0;
}

int gs_rpc_list_devices(gs_call *c, const Gpushare__V1__Request *rq, gs_err *e) {
  (void)rq;
  Gpushare__V1__ListDevicesResponse *m = GS_CALL_MSG(&c->ar, Gpushare__V1__ListDevicesResponse,
                                                GPUSHARE__V1__LIST_DEVICES_RESPONSE__INIT);
  if (!m) return oom(c, e);
  const gs_devices *ds = &c->d->devices;
  m->device = gs_call_alloc(&c->ar, ds->n * sizeof *m->device);
  if (!m->device) return oom(c, e);
  for (size_t i = 0; i < ds->n; i++) {
    const gs_device *dv = &ds->dev[i];
    gs_device_usage u;
    if (gs_store_device_usage(c->d->store, dv->name, &u, e) < 0) return gs_err_rc(e);
    Gpushare__V1__Device *x = GS_CALL_MSG(&c->ar, Gpushare__V1__Device, GPUSHARE__V1__DEVICE__INIT);
    if (!x) return oom(c, e);
    x->name = gs_call_strdup(&c->ar, dv->name);
    x->kind = gs_call_strdup(&c->ar, dv->kind);
    x->model = gs_call_strdup(&c->ar, dv->model);
    if (dv->compute_capability[0])
      x->compute_capability = gs_call_strdup(&c->ar, dv->compute_capability);
    x->has_total_bytes = x->has_usable_bytes = x->has_allocated_bytes = 1;
    x->has_compute_allocated = x->has_oversubscribed = x->has_vdev_count = 1;
    x->total_bytes = dv->total;
    x->usable_bytes = dv->usable;
    x->allocated_bytes = u.memory;
    x->compute_allocated = u.compute;
    x->oversubscribed = dv->oversubscribed;
    x->vdev_count = u.vdevs;
    m->device[m->n_device++] = x;
  }
  c->resp->result_case = GPUSHARE__V1__RESPONSE__RESULT_LIST_DEVICES;
  c->resp->list_devices = m;
  return 0;
}

/* Copy a request's Quota into q, refusing values no quota can have. */
static void quota_from(const Gpushare__V1__Quota *m, gs_quota_update *u) {
  memset(u, 0, sizeof *u);
  if (!m) return;
  u->set_memory = m->has_memory_bytes;
  u->q.memory = m->memory_bytes;
  u->set_compute = m->has_compute_share;
  u->q.compute = m->compute_share;
  u->set_max_running = m->has_max_running;
  u->q.max_running = m->max_running;
  u->set_max_queued = m->has_max_queued;
  u->q.max_queued = m->max_queued;
}

int gs_rpc_create_tenant(gs_call *c, const Gpushare__V1__Request *rq, gs_err *e) {
  const Gpushare__V1__CreateTenantRequest *r = rq->create_tenant;
  gs_tenant t;
  memset(&t, 0, sizeof t);
  if (gs_store_name_valid(r->name, "name", e) < 0) return gs_err_rc(e);
  snprintf(t.name, sizeof t.name, "%s", r->name);
  t.uids = r->uids;
  t.n_uids = r->n_uids;
  t.gids = r->gids;
  t.n_gids = r->n_gids;
  gs_quota_update u;
  quota_from(r->quota, &u);
  t.quota = u.q;
  if (gs_store_tenant_create(c->d->store, &t, e) < 0) return gs_err_rc(e);
  gs_tenant got;
  if (gs_store_tenant_get(c->d->store, r->name, &got, e) < 0) return gs_err_rc(e);
  Gpushare__V1__CreateTenantResponse *m = GS_CALL_MSG(&c->ar, Gpushare__V1__CreateTenantResponse,
                                                 GPUSHARE__V1__CREATE_TENANT_RESPONSE__INIT);
  if (m) m->tenant = tenant_msg(&c->ar, &got);
  gs_tenant_clear(&got);
  if (!m) return oom(c, e);
  gs_info("tenant %s created by uid %" PRIu32 " (%zu uid%s, %zu gid%s)", r->name, c->peer->uid,
          r->n_uids, r->n_uids == 1 ? "" : "s", r->n_gids, r->n_gids == 1 ? "" : "s");
  c->resp->result_case = GPUSHARE__V1__RESPONSE__RESULT_CREATE_TENANT;
  c->resp->create_tenant = m;
  return 0;
}

int gs_rpc_list_tenants(gs_call *c, const Gpushare__V1__Request *rq, gs_err *e) {
  (void)rq;
  gs_tenant *list;
  size_t n;
  if (gs_store_tenant_list(c->d->store, &list, &n, e) < 0) return gs_err_rc(e);
  Gpushare__V1__ListTenantsResponse *m = GS_CALL_MSG(&c->ar, Gpushare__V1__ListTenantsResponse,
                                                GPUSHARE__V1__LIST_TENANTS_RESPONSE__INIT);
  if (m) m->tenant = gs_call_alloc(&c->ar, n * sizeof *m->tenant + 1);
  for (size_t i = 0; m && m->tenant && i < n; i++) m->tenant[m->n_tenant++] = tenant_msg(&c->ar, &list[i]);
  gs_tenant_list_free(list, n);
  if (!m || c->ar.failed) return oom(c, e);
  c->resp->result_case = GPUSHARE__V1__RESPONSE__RESULT_LIST_TENANTS;
  c->resp->list_tenants = m;
  return 0;
}

int gs_rpc_delete_tenant(gs_call *c, const Gpushare__V1__Request *rq, gs_err *e) {
  const char *name = rq->delete_tenant->name;
  if (gs_store_name_valid(name, "name", e) < 0) return gs_err_rc(e);
  if (gs_store_tenant_delete(c->d->store, name, e) < 0) return gs_err_rc(e);
  gs_info("tenant %s deleted by uid %" PRIu32, name, c->peer->uid);
  c->resp->result_case = GPUSHARE__V1__RESPONSE__RESULT_DELETE_TENANT;
  c->resp->delete_tenant = GS_CALL_MSG(&c->ar, Gpushare__V1__DeleteTenantResponse,
                                  GPUSHARE__V1__DELETE_TENANT_RESPONSE__INIT);
  return c->resp->delete_tenant ? 0 : oom(c, e);
}

static int tenant_reply(gs_call *c, const char *name, Gpushare__V1__Tenant **out, gs_err *e) {
  gs_tenant t;
  if (gs_store_tenant_get(c->d->store, name, &t, e) < 0) return gs_err_rc(e);
  *out = tenant_msg(&c->ar, &t);
  gs_tenant_clear(&t);
  return *out ? 0 : oom(c, e);
}

int gs_rpc_set_quota(gs_call *c, const Gpushare__V1__Request *rq, gs_err *e) {
  const Gpushare__V1__SetQuotaRequest *r = rq->set_quota;
  if (gs_store_name_valid(r->tenant, "tenant", e) < 0) return gs_err_rc(e);
  gs_quota_update u;
  quota_from(r->quota, &u);
  if (!u.set_memory && !u.set_compute && !u.set_max_running && !u.set_max_queued)
    return gs_err_set(e, GS_INVALID_ARGUMENT, "quota",
                      "no quota field given: set memory_bytes, compute_share, max_running or "
                      "max_queued");
  if (gs_store_quota_set(c->d->store, r->tenant, &u, e) < 0) return gs_err_rc(e);
  Gpushare__V1__SetQuotaResponse *m = GS_CALL_MSG(&c->ar, Gpushare__V1__SetQuotaResponse,
                                             GPUSHARE__V1__SET_QUOTA_RESPONSE__INIT);
  if (!m) return oom(c, e);
  if (tenant_reply(c, r->tenant, &m->tenant, e) < 0) return gs_err_rc(e);
  gs_info("quota of tenant %s changed by uid %" PRIu32, r->tenant, c->peer->uid);
  c->resp->result_case = GPUSHARE__V1__RESPONSE__RESULT_SET_QUOTA;
  c->resp->set_quota = m;
  return 0;
}

int gs_rpc_get_quota(gs_call *c, const Gpushare__V1__Request *rq, gs_err *e) {
  const char *name = rq->get_quota->tenant;
  if (!name || !*name) name = c->id.tenant; /* a tenant asks for its own */
  if (gs_store_name_valid(name, "tenant", e) < 0) return gs_err_rc(e);
  if (!c->id.admin && strcmp(name, c->id.tenant) != 0)
    return gs_err_set(e, GS_PERMISSION_DENIED, "tenant",
                      "uid %" PRIu32 " acts as tenant %s and cannot read tenant %s's quota",
                      c->peer->uid, c->id.tenant, name);
  Gpushare__V1__GetQuotaResponse *m = GS_CALL_MSG(&c->ar, Gpushare__V1__GetQuotaResponse,
                                             GPUSHARE__V1__GET_QUOTA_RESPONSE__INIT);
  if (!m) return oom(c, e);
  if (tenant_reply(c, name, &m->tenant, e) < 0) return gs_err_rc(e);
  c->resp->result_case = GPUSHARE__V1__RESPONSE__RESULT_GET_QUOTA;
  c->resp->get_quota = m;
  return 0;
}

int gs_rpc_create_vdev(gs_call *c, const Gpushare__V1__Request *rq, gs_err *e) {
  const Gpushare__V1__CreateVdevRequest *r = rq->create_vdev;
  if (gs_store_name_valid(r->name, "name", e) < 0) return gs_err_rc(e);
  if (gs_store_name_valid(r->tenant, "tenant", e) < 0) return gs_err_rc(e);
  const char *devname = r->device && *r->device ? r->device : "cpu";
  const gs_device *dev = gs_devices_find(&c->d->devices, devname);
  if (!dev) {
    char known[256] = "";
    size_t o = 0;
    for (size_t i = 0; i < c->d->devices.n && o < sizeof known; i++)
      o += (size_t)snprintf(known + o, sizeof known - o, "%s%s", i ? ", " : "",
                            c->d->devices.dev[i].name);
    return gs_err_set(e, GS_NOT_FOUND, "device",
                      "no device named \"%.40s\" on this machine; devices: %s (gpuctl devices)",
                      devname, known);
  }
  if (!r->has_memory_limit || r->memory_limit == 0)
    return gs_err_set(e, GS_INVALID_ARGUMENT, "memory_limit",
                      "memory_limit is missing or 0: give the vdev's size, e.g. 4GiB");
  if (!r->has_compute_share)
    return gs_err_set(e, GS_INVALID_ARGUMENT, "compute_share",
                      "compute_share is missing: give a percent of the device, 1..100");
  if (r->has_policy && r->policy != GPUSHARE__V1__POLICY__PREALLOCATE &&
      r->policy != GPUSHARE__V1__POLICY__GROWTH)
    return gs_err_set(e, GS_INVALID_ARGUMENT, "policy",
                      "policy %d is not PREALLOCATE (0) or GROWTH (1)", (int)r->policy);
  gs_vdev v;
  memset(&v, 0, sizeof v);
  snprintf(v.name, sizeof v.name, "%s", r->name);
  snprintf(v.device, sizeof v.device, "%s", dev->name);
  snprintf(v.tenant, sizeof v.tenant, "%s", r->tenant);
  v.memory_limit = r->memory_limit;
  v.compute_share = r->compute_share;
  v.policy = r->has_policy && r->policy == GPUSHARE__V1__POLICY__GROWTH ? 1 : 0;
  gs_device_limits lim = {.usable = dev->usable, .oversubscribed = dev->oversubscribed};
  if (gs_store_vdev_create(c->d->store, &v, &lim, e) < 0) return gs_err_rc(e);
  gs_vdev got;
  if (gs_store_vdev_get(c->d->store, v.name, &got, e) < 0) return gs_err_rc(e);
  Gpushare__V1__CreateVdevResponse *m = GS_CALL_MSG(&c->ar, Gpushare__V1__CreateVdevResponse,
                                               GPUSHARE__V1__CREATE_VDEV_RESPONSE__INIT);
  if (!m || !(m->vdev = vdev_msg(c->d, &c->ar, &got))) return oom(c, e);
  gs_info("vdev %s created on %s for tenant %s: %" PRIu64 " bytes, compute %" PRIu32 "%%, %s",
          v.name, v.device, v.tenant, v.memory_limit, v.compute_share,
          v.policy ? "growth" : "preallocate");
  c->resp->result_case = GPUSHARE__V1__RESPONSE__RESULT_CREATE_VDEV;
  c->resp->create_vdev = m;
  gs_exec_events_vdevs_changed(c->d);
  return 0;
}

int gs_rpc_list_vdevs(gs_call *c, const Gpushare__V1__Request *rq, gs_err *e) {
  (void)rq;
  gs_vdev *list;
  size_t n;
  if (gs_store_vdev_list(c->d->store, &list, &n, e) < 0) return gs_err_rc(e);
  Gpushare__V1__ListVdevsResponse *m = GS_CALL_MSG(&c->ar, Gpushare__V1__ListVdevsResponse,
                                              GPUSHARE__V1__LIST_VDEVS_RESPONSE__INIT);
  if (m) m->vdev = gs_call_alloc(&c->ar, n * sizeof *m->vdev + 1);
  for (size_t i = 0; m && m->vdev && i < n; i++) {
    if (!c->id.admin && strcmp(list[i].tenant, c->id.tenant) != 0) continue;
    m->vdev[m->n_vdev++] = vdev_msg(c->d, &c->ar, &list[i]);
  }
  free(list);
  if (!m || c->ar.failed) return oom(c, e);
  c->resp->result_case = GPUSHARE__V1__RESPONSE__RESULT_LIST_VDEVS;
  c->resp->list_vdevs = m;
  return 0;
}

/* A vdev changed while its jobs run: a larger limit at once; a smaller one
 * if its running jobs can fit it even at micro-batch 1, the ones that no
 * longer fit re-planned or requeued (exec_events.c). */
int gs_rpc_update_vdev(gs_call *c, const Gpushare__V1__Request *rq, gs_err *e) {
  const Gpushare__V1__UpdateVdevRequest *r = rq->update_vdev;
  if (gs_store_name_valid(r->name, "name", e) < 0) return gs_err_rc(e);
  gs_vdev old;
  if (gs_store_vdev_get(c->d->store, r->name, &old, e) < 0) return gs_err_rc(e);
  if (!r->has_memory_limit && !r->has_compute_share && !r->has_policy)
    return gs_err_set(e, GS_INVALID_ARGUMENT, "",
                      "nothing to change: give memory_limit, compute_share or policy");
  if (r->has_policy && r->policy != GPUSHARE__V1__POLICY__PREALLOCATE &&
      r->policy != GPUSHARE__V1__POLICY__GROWTH)
    return gs_err_set(e, GS_INVALID_ARGUMENT, "policy",
                      "policy %d is not PREALLOCATE (0) or GROWTH (1)", (int)r->policy);
  gs_vdev nv = old;
  if (r->has_memory_limit) nv.memory_limit = r->memory_limit;
  if (r->has_compute_share) nv.compute_share = r->compute_share;
  if (r->has_policy) nv.policy = r->policy == GPUSHARE__V1__POLICY__GROWTH ? 1 : 0;
  if (nv.memory_limit < old.memory_limit && nv.memory_limit > 0) {
    uint64_t least;
    if (gs_exec_events_least_memory(c->d, &old, &least, e) < 0) return gs_err_rc(e);
    if (least > nv.memory_limit) {
      char a[32], b[32];
      return gs_err_set(e, GS_FAILED_PRECONDITION, "memory_limit",
                        "vdev %s's running jobs need %s even at micro-batch 1 (with their "
                        "data); %s is below that: cancel one of them, or wait for one to end",
                        old.name, gs_size_format(least, a, sizeof a),
                        gs_size_format(nv.memory_limit, b, sizeof b));
    }
  }
  const gs_device *dev = gs_devices_find(&c->d->devices, old.device);
  gs_device_limits lim = {.usable = dev ? dev->usable : 0,
                          .oversubscribed = dev && dev->oversubscribed};
  if (!dev)
    return gs_err_set(e, GS_FAILED_PRECONDITION, "name",
                      "vdev %s is on device %s, which this machine does not have now",
                      old.name, old.device);
  if (gs_store_vdev_update(c->d->store, &nv, &lim, e) < 0) return gs_err_rc(e);
  gs_vdev got;
  if (gs_store_vdev_get(c->d->store, nv.name, &got, e) < 0) return gs_err_rc(e);
  gs_info("vdev %s changed by uid %" PRIu32 ": %" PRIu64 " -> %" PRIu64 " bytes, compute %" PRIu32
          " -> %" PRIu32 "%%, %s -> %s",
          old.name, c->peer->uid, old.memory_limit, got.memory_limit, old.compute_share,
          got.compute_share, old.policy ? "growth" : "preallocate",
          got.policy ? "growth" : "preallocate");
  char **actions;
  size_t n_actions;
  gs_exec_events_vdev_resized(c->d, &old, &got, &actions, &n_actions);
  Gpushare__V1__UpdateVdevResponse *m = GS_CALL_MSG(&c->ar, Gpushare__V1__UpdateVdevResponse,
                                                    GPUSHARE__V1__UPDATE_VDEV_RESPONSE__INIT);
  int rc = 0;
  if (!m || !(m->vdev = vdev_msg(c->d, &c->ar, &got)) ||
      !(m->action = gs_call_alloc(&c->ar, (n_actions + 1) * sizeof *m->action))) {
    rc = oom(c, e);
  } else {
    for (size_t i = 0; i < n_actions; i++)
      if ((m->action[m->n_action] = gs_call_strdup(&c->ar, actions[i]))) m->n_action++;
    c->resp->result_case = GPUSHARE__V1__RESPONSE__RESULT_UPDATE_VDEV;
    c->resp->update_vdev = m;
  }
  for (size_t i = 0; i < n_actions; i++) free(actions[i]);
  free(actions);
  return rc;
}

int gs_rpc_delete_vdev(gs_call *c, const Gpushare__V1__Request *rq, gs_err *e) {
  const char *name = rq->delete_vdev->name;
  if (gs_store_name_valid(name, "name", e) < 0) return gs_err_rc(e);
  if (gs_store_vdev_delete(c->d->store, name, e) < 0) return gs_err_rc(e);
  gs_info("vdev %s deleted by uid %" PRIu32, name, c->peer->uid);
  gs_exec_events_vdevs_changed(c->d);
  c->resp->result_case = GPUSHARE__V1__RESPONSE__RESULT_DELETE_VDEV;
  c->resp->delete_vdev = GS_CALL_MSG(&c->ar, Gpushare__V1__DeleteVdevResponse,
                                GPUSHARE__V1__DELETE_VDEV_RESPONSE__INIT);
  return c->resp->delete_vdev ? 0 : oom(c, e);
}

int gs_rpc_metrics(gs_call *c, const Gpushare__V1__Request *rq, gs_err *e) {
  (void)rq;
  char *text;
  /* The usage counters shown are the stored ones: written first, so a
   * kill -9 right after cannot take back what a scrape saw and the
   * counters never go down across a restart. (When the store refuses the
   * write, what is kept in memory is shown.) */
  gs_usage_flush(c->d);
  if (gs_metrics_text(c->d, &text, e) < 0) return gs_err_rc(e);
  Gpushare__V1__MetricsResponse *m =
      GS_CALL_MSG(&c->ar, Gpushare__V1__MetricsResponse, GPUSHARE__V1__METRICS_RESPONSE__INIT);
  if (m) m->text = gs_call_strdup(&c->ar, text);
  free(text);
  if (!m || !m->text) return gs_err_set(e, GS_INTERNAL, "", "out of memory");
  c->resp->result_case = GPUSHARE__V1__RESPONSE__RESULT_METRICS;
  c->resp->metrics = m;
  return 0;
}
