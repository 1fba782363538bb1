/*
 * cmd_admin.c: the commands that set up and look at the daemon's resources:
 * devices; vdev create, list and delete; tenant create, list and delete;
 * quota set and show; metrics; version.
 *
 * Each command builds one gpushare.v1 request from its parsed arguments and
 * prints the answer (cli_simple): a table or a few lines, or with --json the
 * result message. Those that change anything but quota show's reading are
 * the administrator's ("(admin)" in --help); the daemon decides. The delete
 * path (gpuctl_delete) is shared with dataset rm.
 */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "client/cli.h"
#include "client/client.h"
#include "client/cmd_admin.h"
#include "client/gpuctl.h"
#include "client/table.h"

#ifndef GS_VERSION
#define GS_VERSION "unknown"
#endif

static const char *fsize_or_unlimited(uint64_t b) { return b ? table_fsize(b) : "unlimited"; }

static const char *policy_name(int p) {
  return p == GPUSHARE__V1__POLICY__GROWTH ? "growth" : p == GPUSHARE__V1__POLICY__PREALLOCATE ? "preallocate" : "?";
}

/* --------------------------------------------------------------- devices --- */

static void devices_human(gpuctl_cli *x, const Gpushare__V1__Response *r) {
  (void)x;
  table t = {0};
  table_header(&t, (1u << 3) | (1u << 4) | (1u << 5) | (1u << 6) | (1u << 7),
               (const char *const[]){"NAME", "KIND", "MODEL", "TOTAL", "USABLE", "ALLOCATED", "COMPUTE", "VDEVS",
                                     "CC", "OVERSUB", NULL});
  const Gpushare__V1__ListDevicesResponse *l = r->list_devices;
  for (size_t i = 0; i < l->n_device; i++) {
    const Gpushare__V1__Device *d = l->device[i];
    table_cell(&t, "%s", d->name ? d->name : "");
    table_cell(&t, "%s", d->kind ? d->kind : "");
    table_cell(&t, "%s", d->model && *d->model ? d->model : "-");
    table_cell(&t, "%s", table_fsize(d->total_bytes));
    table_cell(&t, "%s", table_fsize(d->usable_bytes));
    table_cell(&t, "%s", table_fsize(d->allocated_bytes));
    table_cell(&t, "%" PRIu32 "%%", d->compute_allocated);
    table_cell(&t, "%" PRIu32, d->vdev_count);
    table_cell(&t, "%s", d->compute_capability && *d->compute_capability ? d->compute_capability : "-");
    table_cell(&t, "%s", d->oversubscribed ? "yes" : "no");
  }
  table_print(&t);
}

int gpuctl_cmd_devices(gpuctl_cli *x, gpuctl_parsed *p) {
  (void)p;
  GPUCTL_REQ(req, list_devices, LIST_DEVICES, Gpushare__V1__ListDevicesRequest, GPUSHARE__V1__LIST_DEVICES_REQUEST__INIT);
  return cli_simple(x, &req, GPUSHARE__V1__RESPONSE__RESULT_LIST_DEVICES, devices_human);
}

/* ------------------------------------------------------------ slurm-gres --- */

/* Slurm's view of this node, from the daemon's device table: one shard is
 * slurm_unit bytes of a device's usable memory. Slurm 22.05 attaches shards
 * to a gres/gpu with a File; the cpu device has none, so /dev/null stands in. */
static uint64_t slurm_unit = 1ull << 30;

static void slurm_gres_human(gpuctl_cli *x, const Gpushare__V1__Response *r) {
  (void)x;
  const Gpushare__V1__ListDevicesResponse *l = r->list_devices;
  uint64_t gpus = 0, shards = 0;
  printf("# gres.conf (one shard = %s of usable memory)\n", table_fsize(slurm_unit));
  for (size_t i = 0; i < l->n_device; i++) {
    const Gpushare__V1__Device *d = l->device[i];
    if (!d->name) continue;
    uint64_t n = d->usable_bytes / slurm_unit;
    char file[64];
    if (!strncmp(d->name, "gpu", 3)) snprintf(file, sizeof file, "/dev/nvidia%s", d->name + 3);
    else snprintf(file, sizeof file, "/dev/null");
    printf("Name=gpu File=%s%s\n", file, strncmp(d->name, "gpu", 3) ? "  # gpushare's cpu device" : "");
    printf("Name=shard Count=%" PRIu64 " File=%s\n", n, file);
    gpus++;
    shards += n;
  }
  printf("# slurm.conf: GresTypes=gpu,shard and on this node's NodeName line\n");
  printf("Gres=gpu:%" PRIu64 ",shard:%" PRIu64 "\n", gpus, shards);
}

int gpuctl_cmd_slurm_gres(gpuctl_cli *x, gpuctl_parsed *p) {
  if (p->nval[0] && cli_parse_size(x, "--unit", p->val[0][0], &slurm_unit)) return GPUCTL_EXIT_USAGE;
  if (!slurm_unit) return cli_usage_error(x, "--unit: 0 is not a shard size; expected a size above 0 such as 1GiB");
  GPUCTL_REQ(req, list_devices, LIST_DEVICES, Gpushare__V1__ListDevicesRequest, GPUSHARE__V1__LIST_DEVICES_REQUEST__INIT);
  return cli_simple(x, &req, GPUSHARE__V1__RESPONSE__RESULT_LIST_DEVICES, slurm_gres_human);
}

/* ------------------------------------------------------------------ vdev --- */

static void vdev_row(table *t, const Gpushare__V1__Vdev *v) {
  table_cell(t, "%s", v->name ? v->name : "");
  table_cell(t, "%s", v->device ? v->device : "");
  table_cell(t, "%s", v->tenant ? v->tenant : "");
  table_cell(t, "%s", table_fsize(v->memory_limit));
  table_cell(t, "%" PRIu32 "%%", v->compute_share);
  table_cell(t, "%s", policy_name(v->policy));
  table_cell(t, "%s", table_fsize(v->memory_in_use));
  table_cell(t, "%s", table_fsize(v->memory_reserved));
  table_cell(t, "%s", table_fsize(v->memory_peak));
  /* What the next allocation could get; "-" until the executor says. */
  table_cell(t, "%s", v->has_memory_largest_free ? table_fsize(v->memory_largest_free) : "-");
  if (v->has_memory_fragmentation)
    table_cell(t, "%.1f%%", v->memory_fragmentation * 100.0);
  else
    table_cell(t, "-");
  table_cell(t, "%s", table_ftime(v->created_unix));
}

static const char *const vdev_cols[] = {"NAME",    "DEVICE", "TENANT",   "LIMIT", "COMPUTE",
                                        "POLICY",  "IN-USE", "RESERVED", "PEAK",  "LARGEST-FREE",
                                        "FRAG",    "CREATED", NULL};
#define VDEV_RIGHT \
  ((1u << 3) | (1u << 4) | (1u << 6) | (1u << 7) | (1u << 8) | (1u << 9) | (1u << 10))

static void vdev_create_human(gpuctl_cli *x, const Gpushare__V1__Response *r) {
  (void)x;
  const Gpushare__V1__Vdev *v = r->create_vdev->vdev;
  if (!v) {
    printf("vdev created\n");
    return;
  }
  printf("vdev %s created on %s for tenant %s: %s, compute %" PRIu32 "%%, %s\n", v->name ? v->name : "?",
         v->device ? v->device : "?", v->tenant ? v->tenant : "?", table_fsize(v->memory_limit),
         v->compute_share, policy_name(v->policy));
}

static int parse_policy(gpuctl_cli *x, const char *pol, Gpushare__V1__Policy *out) {
  if (!strcasecmp(pol, "preallocate")) *out = GPUSHARE__V1__POLICY__PREALLOCATE;
  else if (!strcasecmp(pol, "growth")) *out = GPUSHARE__V1__POLICY__GROWTH;
  else return cli_usage_error(x, "--policy: \"%s\" is not a policy; expected preallocate or growth", pol);
  return 0;
}

int gpuctl_cmd_vdev_create(gpuctl_cli *x, gpuctl_parsed *p) {
  GPUCTL_REQ(req, create_vdev, CREATE_VDEV, Gpushare__V1__CreateVdevRequest, GPUSHARE__V1__CREATE_VDEV_REQUEST__INIT);
  create_vdev_msg.name = (char *)p->pos[0];
  if (p->nval[0]) create_vdev_msg.device = (char *)p->val[0][0];
  if (cli_parse_size(x, "--memory", p->val[1][0], &create_vdev_msg.memory_limit)) return GPUCTL_EXIT_USAGE;
  create_vdev_msg.has_memory_limit = 1;
  if (p->nval[2]) {
    if (cli_parse_u32(x, "--compute", p->val[2][0], 1, 100, &create_vdev_msg.compute_share)) return GPUCTL_EXIT_USAGE;
    create_vdev_msg.has_compute_share = 1;
  }
  if (p->nval[3]) {
    if (parse_policy(x, p->val[3][0], &create_vdev_msg.policy)) return GPUCTL_EXIT_USAGE;
    create_vdev_msg.has_policy = 1;
  }
  create_vdev_msg.tenant = (char *)p->val[4][0];
  return cli_simple(x, &req, GPUSHARE__V1__RESPONSE__RESULT_CREATE_VDEV, vdev_create_human);
}

static void vdev_set_human(gpuctl_cli *x, const Gpushare__V1__Response *r) {
  (void)x;
  const Gpushare__V1__UpdateVdevResponse *u = r->update_vdev;
  const Gpushare__V1__Vdev *v = u->vdev;
  if (v)
    printf("vdev %s: %s, compute %" PRIu32 "%%, %s\n", v->name ? v->name : "?",
           table_fsize(v->memory_limit), v->compute_share, policy_name(v->policy));
  for (size_t i = 0; i < u->n_action; i++) printf("  %s\n", u->action[i]);
  if (v && !u->n_action) printf("  no running job had to change\n");
}

int gpuctl_cmd_vdev_set(gpuctl_cli *x, gpuctl_parsed *p) {
  GPUCTL_REQ(req, update_vdev, UPDATE_VDEV, Gpushare__V1__UpdateVdevRequest, GPUSHARE__V1__UPDATE_VDEV_REQUEST__INIT);
  update_vdev_msg.name = (char *)p->pos[0];
  if (p->nval[0]) {
    if (cli_parse_size(x, "--memory", p->val[0][0], &update_vdev_msg.memory_limit)) return GPUCTL_EXIT_USAGE;
    update_vdev_msg.has_memory_limit = 1;
  }
  if (p->nval[1]) {
    if (cli_parse_u32(x, "--compute", p->val[1][0], 1, 100, &update_vdev_msg.compute_share)) return GPUCTL_EXIT_USAGE;
    update_vdev_msg.has_compute_share = 1;
  }
  if (p->nval[2]) {
    if (parse_policy(x, p->val[2][0], &update_vdev_msg.policy)) return GPUCTL_EXIT_USAGE;
    update_vdev_msg.has_policy = 1;
  }
  if (!p->nval[0] && !p->nval[1] && !p->nval[2])
    return cli_usage_error(x, "vdev set: nothing to change; give --memory, --compute or --policy");
  return cli_simple(x, &req, GPUSHARE__V1__RESPONSE__RESULT_UPDATE_VDEV, vdev_set_human);
}

static void vdev_list_human(gpuctl_cli *x, const Gpushare__V1__Response *r) {
  (void)x;
  table t = {0};
  table_header(&t, VDEV_RIGHT, vdev_cols);
  for (size_t i = 0; i < r->list_vdevs->n_vdev; i++) vdev_row(&t, r->list_vdevs->vdev[i]);
  table_print(&t);
}

int gpuctl_cmd_vdev_list(gpuctl_cli *x, gpuctl_parsed *p) {
  (void)p;
  GPUCTL_REQ(req, list_vdevs, LIST_VDEVS, Gpushare__V1__ListVdevsRequest, GPUSHARE__V1__LIST_VDEVS_REQUEST__INIT);
  return cli_simple(x, &req, GPUSHARE__V1__RESPONSE__RESULT_LIST_VDEVS, vdev_list_human);
}

static const char *deleted_what, *deleted_name;

static void deleted_human(gpuctl_cli *x, const Gpushare__V1__Response *r) {
  (void)x;
  (void)r;
  printf("%s %s deleted\n", deleted_what, deleted_name);
}

int gpuctl_delete(gpuctl_cli *x, Gpushare__V1__Request *req, int result_case, const char *what,
                  const char *name) {
  deleted_what = what;
  deleted_name = name;
  return cli_simple(x, req, result_case, deleted_human);
}

int gpuctl_cmd_vdev_delete(gpuctl_cli *x, gpuctl_parsed *p) {
  GPUCTL_REQ(req, delete_vdev, DELETE_VDEV, Gpushare__V1__DeleteVdevRequest, GPUSHARE__V1__DELETE_VDEV_REQUEST__INIT);
  delete_vdev_msg.name = (char *)p->pos[0];
  return gpuctl_delete(x, &req, GPUSHARE__V1__RESPONSE__RESULT_DELETE_VDEV, "vdev", p->pos[0]);
}

/* ---------------------------------------------------------------- tenant --- */

/* --memory, --compute, --max-running, --max-queued at flag indices first..first+3. */
static int parse_quota(gpuctl_cli *x, gpuctl_parsed *p, int first, Gpushare__V1__Quota *q, int *any) {
  *any = 0;
  if (p->nval[first]) {
    if (cli_parse_size(x, "--memory", p->val[first][0], &q->memory_bytes)) return GPUCTL_EXIT_USAGE;
    q->has_memory_bytes = 1;
    *any = 1;
  }
  if (p->nval[first + 1]) {
    if (cli_parse_u32(x, "--compute", p->val[first + 1][0], 0, UINT32_MAX, &q->compute_share)) return GPUCTL_EXIT_USAGE;
    q->has_compute_share = 1;
    *any = 1;
  }
  if (p->nval[first + 2]) {
    if (cli_parse_u32(x, "--max-running", p->val[first + 2][0], 0, UINT32_MAX, &q->max_running)) return GPUCTL_EXIT_USAGE;
    q->has_max_running = 1;
    *any = 1;
  }
  if (p->nval[first + 3]) {
    if (cli_parse_u32(x, "--max-queued", p->val[first + 3][0], 0, UINT32_MAX, &q->max_queued)) return GPUCTL_EXIT_USAGE;
    q->has_max_queued = 1;
    *any = 1;
  }
  return 0;
}

static void tenant_show(const Gpushare__V1__Tenant *t) {
  static const Gpushare__V1__Quota zero = GPUSHARE__V1__QUOTA__INIT;
  const Gpushare__V1__Quota *q = t->quota ? t->quota : &zero;
  printf("tenant:       %s\n", t->name ? t->name : "");
  printf("uids:         %s\n", table_ids_list(t->uids, t->n_uids));
  printf("gids:         %s\n", table_ids_list(t->gids, t->n_gids));
  printf("memory:       %s of %s\n", table_fsize(t->memory_allocated), fsize_or_unlimited(q->memory_bytes));
  printf("compute:      %" PRIu32 " of %s\n", t->compute_allocated, table_fcount_or_unlimited(q->compute_share));
  printf("max running:  %s\n", table_fcount_or_unlimited(q->max_running));
  printf("max queued:   %s\n", table_fcount_or_unlimited(q->max_queued));
  printf("vdevs:        %" PRIu32 "\n", t->vdev_count);
  if (t->created_unix) printf("created:      %s\n", table_ftime(t->created_unix));
}

static void tenant_create_human(gpuctl_cli *x, const Gpushare__V1__Response *r) {
  (void)x;
  if (r->create_tenant->tenant) tenant_show(r->create_tenant->tenant);
  else printf("tenant created\n");
}

int gpuctl_cmd_tenant_create(gpuctl_cli *x, gpuctl_parsed *p) {
  GPUCTL_REQ(req, create_tenant, CREATE_TENANT, Gpushare__V1__CreateTenantRequest, GPUSHARE__V1__CREATE_TENANT_REQUEST__INIT);
  uint32_t uids[GPUCTL_MAX_ARGS], gids[GPUCTL_MAX_ARGS];
  Gpushare__V1__Quota q = GPUSHARE__V1__QUOTA__INIT;
  create_tenant_msg.name = (char *)p->pos[0];
  for (int i = 0; i < p->nval[0]; i++)
    if (cli_parse_u32(x, "--uid", p->val[0][i], 0, UINT32_MAX - 1, &uids[i])) return GPUCTL_EXIT_USAGE;
  for (int i = 0; i < p->nval[1]; i++)
    if (cli_parse_u32(x, "--gid", p->val[1][i], 0, UINT32_MAX - 1, &gids[i])) return GPUCTL_EXIT_USAGE;
  create_tenant_msg.n_uids = (size_t)p->nval[0];
  create_tenant_msg.uids = uids;
  create_tenant_msg.n_gids = (size_t)p->nval[1];
  create_tenant_msg.gids = gids;
  int any;
  if (parse_quota(x, p, 2, &q, &any)) return GPUCTL_EXIT_USAGE;
  if (any) create_tenant_msg.quota = &q;
  return cli_simple(x, &req, GPUSHARE__V1__RESPONSE__RESULT_CREATE_TENANT, tenant_create_human);
}

static void tenant_list_human(gpuctl_cli *x, const Gpushare__V1__Response *r) {
  (void)x;
  static const Gpushare__V1__Quota zero = GPUSHARE__V1__QUOTA__INIT;
  table t = {0};
  table_header(&t, (1u << 3) | (1u << 4) | (1u << 5) | (1u << 6) | (1u << 7),
               (const char *const[]){"NAME", "UIDS", "GIDS", "MEMORY", "COMPUTE", "VDEVS", "MAX-RUNNING",
                                     "MAX-QUEUED", "CREATED", NULL});
  for (size_t i = 0; i < r->list_tenants->n_tenant; i++) {
    const Gpushare__V1__Tenant *tn = r->list_tenants->tenant[i];
    const Gpushare__V1__Quota *q = tn->quota ? tn->quota : &zero;
    table_cell(&t, "%s", tn->name ? tn->name : "");
    table_cell(&t, "%s", table_ids_list(tn->uids, tn->n_uids));
    table_cell(&t, "%s", table_ids_list(tn->gids, tn->n_gids));
    table_cell(&t, "%s / %s", table_fsize(tn->memory_allocated), fsize_or_unlimited(q->memory_bytes));
    table_cell(&t, "%" PRIu32 " / %s", tn->compute_allocated, table_fcount_or_unlimited(q->compute_share));
    table_cell(&t, "%" PRIu32, tn->vdev_count);
    table_cell(&t, "%s", table_fcount_or_unlimited(q->max_running));
    table_cell(&t, "%s", table_fcount_or_unlimited(q->max_queued));
    table_cell(&t, "%s", table_ftime(tn->created_unix));
  }
  table_print(&t);
}

int gpuctl_cmd_tenant_list(gpuctl_cli *x, gpuctl_parsed *p) {
  (void)p;
  GPUCTL_REQ(req, list_tenants, LIST_TENANTS, Gpushare__V1__ListTenantsRequest, GPUSHARE__V1__LIST_TENANTS_REQUEST__INIT);
  return cli_simple(x, &req, GPUSHARE__V1__RESPONSE__RESULT_LIST_TENANTS, tenant_list_human);
}

int gpuctl_cmd_tenant_delete(gpuctl_cli *x, gpuctl_parsed *p) {
  GPUCTL_REQ(req, delete_tenant, DELETE_TENANT, Gpushare__V1__DeleteTenantRequest, GPUSHARE__V1__DELETE_TENANT_REQUEST__INIT);
  delete_tenant_msg.name = (char *)p->pos[0];
  return gpuctl_delete(x, &req, GPUSHARE__V1__RESPONSE__RESULT_DELETE_TENANT, "tenant", p->pos[0]);
}

/* ----------------------------------------------------------------- quota --- */

static void quota_set_human(gpuctl_cli *x, const Gpushare__V1__Response *r) {
  (void)x;
  if (r->set_quota->tenant) tenant_show(r->set_quota->tenant);
  else printf("quota set\n");
}

int gpuctl_cmd_quota_set(gpuctl_cli *x, gpuctl_parsed *p) {
  GPUCTL_REQ(req, set_quota, SET_QUOTA, Gpushare__V1__SetQuotaRequest, GPUSHARE__V1__SET_QUOTA_REQUEST__INIT);
  Gpushare__V1__Quota q = GPUSHARE__V1__QUOTA__INIT;
  set_quota_msg.tenant = (char *)p->pos[0];
  int any;
  if (parse_quota(x, p, 0, &q, &any)) return GPUCTL_EXIT_USAGE;
  if (!any) return cli_usage_error(x, "nothing to set; give at least one of --memory, --compute, --max-running, --max-queued");
  set_quota_msg.quota = &q;
  return cli_simple(x, &req, GPUSHARE__V1__RESPONSE__RESULT_SET_QUOTA, quota_set_human);
}

static void quota_show_human(gpuctl_cli *x, const Gpushare__V1__Response *r) {
  (void)x;
  if (r->get_quota->tenant) tenant_show(r->get_quota->tenant);
}

int gpuctl_cmd_quota_show(gpuctl_cli *x, gpuctl_parsed *p) {
  GPUCTL_REQ(req, get_quota, GET_QUOTA, Gpushare__V1__GetQuotaRequest, GPUSHARE__V1__GET_QUOTA_REQUEST__INIT);
  get_quota_msg.tenant = (char *)p->pos[0];
  return cli_simple(x, &req, GPUSHARE__V1__RESPONSE__RESULT_GET_QUOTA, quota_show_human);
}

/* ------------------------------------------------------------ the daemon --- */

static void metrics_human(gpuctl_cli *x, const Gpushare__V1__Response *r) {
  (void)x;
  if (r->metrics->text) fputs(r->metrics->text, stdout);
}

int gpuctl_cmd_metrics(gpuctl_cli *x, gpuctl_parsed *p) {
  (void)p;
  GPUCTL_REQ(req, metrics, METRICS, Gpushare__V1__MetricsRequest, GPUSHARE__V1__METRICS_REQUEST__INIT);
  return cli_simple(x, &req, GPUSHARE__V1__RESPONSE__RESULT_METRICS, metrics_human);
}

static void version_human(gpuctl_cli *x, const Gpushare__V1__Response *r) {
  const Gpushare__V1__VersionResponse *v = r->version;
  printf("gpuctl:    %s\n", GS_VERSION);
  printf("gpushared: %s at %s\n", v->version ? v->version : "?", gs_client_socket_path(x->c));
  printf("you:       uid %" PRIu32 "%s, tenant %s\n", v->uid, v->admin ? " (admin)" : "",
         v->tenant && *v->tenant ? v->tenant : "(none)");
}

int gpuctl_cmd_version(gpuctl_cli *x, gpuctl_parsed *p) {
  (void)p;
  GPUCTL_REQ(req, version, VERSION, Gpushare__V1__VersionRequest, GPUSHARE__V1__VERSION_REQUEST__INIT);
  return cli_simple(x, &req, GPUSHARE__V1__RESPONSE__RESULT_VERSION, version_human);
}
