/*
 * store.h: gpushared's durable state, in one SQLite database.
 *
 * The store owns the database file (STATE_DIR/gpushared.db). Everything an
 * ops team configures (tenants and their members, quotas, vdevs) lives here
 * and survives restarts and kill -9: WAL journal, synchronous=FULL, and every
 * mutation in one IMMEDIATE transaction whose checks (a vdev past its
 * device's usable memory, past its tenant's quota, compute shares over 100)
 * run inside the same transaction as the write, so accounting can never be
 * raced or half-applied. The schema moves forward by numbered migrations
 * recorded in PRAGMA user_version. Only the control plane's loop thread
 * calls the store: one writer, by construction.
 *
 * Every function returns 0 or -1 with e filled (a gs_code, the field and a
 * message meant for the person at gpuctl).
 */
#ifndef GS_STORE_H
#define GS_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"

#define GS_NAME_MAX 63 /* tenants, vdevs, datasets: [A-Za-z0-9][A-Za-z0-9._-]* */
#define GS_DEVICE_NAME_MAX 31
#define GS_MEMBERS_MAX 1024

typedef struct gs_quota {
  uint64_t memory;      /* total vdev memory, bytes; 0 = unlimited */
  uint32_t compute;     /* total compute share over its vdevs; 0 = unlimited */
  uint32_t max_running; /* 0 = unlimited */
  uint32_t max_queued;  /* 0 = unlimited */
} gs_quota;

typedef struct gs_tenant {
  char name[GS_NAME_MAX + 1];
  uint32_t *uids; /* malloc'd by the store; gs_tenant_clear frees */
  size_t n_uids;
  uint32_t *gids;
  size_t n_gids;
  gs_quota quota;
  int64_t created;            /* unix seconds */
  uint64_t memory_allocated;  /* sum of its vdev limits (filled by get/list) */
  uint32_t compute_allocated; /* sum of its vdev compute shares */
  uint32_t vdev_count;
} gs_tenant;

typedef struct gs_vdev {
  char name[GS_NAME_MAX + 1];
  char device[GS_DEVICE_NAME_MAX + 1];
  char tenant[GS_NAME_MAX + 1];
  uint64_t memory_limit;
  uint32_t compute_share; /* 1..100 percent of the device */
  int policy;             /* gs_alloc_policy: 0 PREALLOCATE, 1 GROWTH */
  int64_t created;
} gs_vdev;

/* What the store needs to know of a device to admit a vdev on it. */
typedef struct gs_device_limits {
  uint64_t usable;     /* bytes vdev limits may add up to */
  bool oversubscribed; /* GROWTH vdevs may then exceed usable in sum */
} gs_device_limits;

/* Per-device sums over vdevs. */
typedef struct gs_device_usage {
  uint64_t memory;
  uint32_t compute;
  uint32_t vdevs;
} gs_device_usage;

typedef struct gs_store gs_store;

#define GS_STORE_SCHEMA_VERSION 3

/* Open (creating the directory and its database if needed) and migrate.
 * The state directory is the daemon's alone: one already open to other
 * users is made private (0700) when it is ours and refused when it is
 * not, the database is created 0600, and STATE/gpushared.lock is held
 * (flock) until gs_store_close, so a second daemon (or store) on the same
 * directory is refused with FAILED_PRECONDITION naming the holder's pid.
 * A damaged database (gs_store_check) is refused before anything writes to
 * it, and so is a missing or empty one beside jobs/ or datasets/ entries
 * of an earlier store, each naming the file and what to do. */
int gs_store_open(const char *state_dir, gs_store **out, gs_err *e);
void gs_store_close(gs_store *s);
int gs_store_schema_version(gs_store *s);
/* A database up to this size gets SQLite's integrity_check at open; a
 * larger one the quicker quick_check. */
#define GS_STORE_FULL_CHECK_MAX (256ull << 20)
/* The database passes SQLite's check (run by gs_store_open before anything
 * writes): 0, or GS_FAILED_PRECONDITION naming the file, what
 * SQLite found, and what to do (restore from a backup). */
int gs_store_check(gs_store *s, gs_err *e);
/* The next job id is above `id` (a jobs/ID directory an earlier store
 * left, e.g. after an older backup was restored): ids never reuse one. */
int gs_store_job_ids_above(gs_store *s, uint64_t id, gs_err *e);

/* Names: 1..63 of [A-Za-z0-9._-], starting with a letter or digit. `what`
 * is the field path used in the error ("name", "tenant"). */
int gs_store_name_valid(const char *name, const char *what, gs_err *e);

void gs_tenant_clear(gs_tenant *t);
int gs_store_tenant_create(gs_store *s, const gs_tenant *t, gs_err *e);
/* NOT_FOUND when absent; out must be cleared with gs_tenant_clear. */
int gs_store_tenant_get(gs_store *s, const char *name, gs_tenant *out, gs_err *e);
/* *out is a malloc'd array of *n tenants, each to be cleared. */
int gs_store_tenant_list(gs_store *s, gs_tenant **out, size_t *n, gs_err *e);
void gs_tenant_list_free(gs_tenant *list, size_t n);
/* FAILED_PRECONDITION while it still has vdevs. */
int gs_store_tenant_delete(gs_store *s, const char *name, gs_err *e);

/* Change the fields whose `set_*` flag is set. Lowering memory or compute
 * below what the tenant's vdevs already hold is refused. */
typedef struct gs_quota_update {
  bool set_memory, set_compute, set_max_running, set_max_queued;
  gs_quota q;
} gs_quota_update;
int gs_store_quota_set(gs_store *s, const char *tenant, const gs_quota_update *u,
                       gs_err *e);

/* Admit and record a vdev: name free, tenant exists, limit > 0 and within the
 * device's usable memory and the tenant's memory quota after the existing
 * vdevs, compute share 1..100 and within 100 on the device and within the
 * tenant's compute quota. */
int gs_store_vdev_create(gs_store *s, const gs_vdev *v, const gs_device_limits *dev,
                         gs_err *e);
int gs_store_vdev_get(gs_store *s, const char *name, gs_vdev *out, gs_err *e);
int gs_store_vdev_list(gs_store *s, gs_vdev **out, size_t *n, gs_err *e);
/* Change v->name's memory_limit, compute_share and policy to v's, with
 * the checks of create (the tenant's quota and the device's room counted
 * without the vdev's present figures). */
int gs_store_vdev_update(gs_store *s, const gs_vdev *v, const gs_device_limits *dev,
                         gs_err *e);
int gs_store_vdev_delete(gs_store *s, const char *name, gs_err *e);
int gs_store_device_usage(gs_store *s, const char *device, gs_device_usage *u,
                          gs_err *e);

/* Every tenant a peer belongs to: by uid, or through one of its gids.
 * Fills names (up to max) and returns how many matched in *n; by_uid[i]
 * tells whether tenant i matched through the uid itself. */
int gs_store_tenants_of(gs_store *s, uint32_t uid, const uint32_t *gids, size_t n_gids,
                        char (*names)[GS_NAME_MAX + 1], bool *by_uid, size_t max,
                        size_t *n, gs_err *e);

/* ---- transactions spanning several calls (e.g. a job row and its record)
 * Calls made inside run in that transaction; they do not open their own. */
int gs_store_txn_begin(gs_store *s, gs_err *e);
int gs_store_txn_commit(gs_store *s, gs_err *e);
void gs_store_txn_rollback(gs_store *s);

/* ---- datasets: a tenant's name for a content-addressed blob ---- */
typedef struct gs_dataset_row {
  char tenant[GS_NAME_MAX + 1];
  char name[GS_NAME_MAX + 1];
  char sha256[65]; /* lowercase hex; the blob is STATE_DIR/datasets/<sha256> */
  uint64_t bytes;
  int64_t created;
} gs_dataset_row;

/* The same name with the same content is accepted again (idempotent);
 * with other content it is ALREADY_EXISTS. */
int gs_store_dataset_add(gs_store *s, const gs_dataset_row *d, gs_err *e);
int gs_store_dataset_get(gs_store *s, const char *tenant, const char *name,
                         gs_dataset_row *out, gs_err *e);
/* NOT_FOUND unless the tenant has a dataset with that content. */
int gs_store_dataset_by_sha(gs_store *s, const char *tenant, const char *sha256,
                            gs_dataset_row *out, gs_err *e);
/* tenant NULL: every tenant's. */
int gs_store_dataset_list(gs_store *s, const char *tenant, gs_dataset_row **out, size_t *n,
                          gs_err *e);
/* *refs_left: how many dataset rows (any tenant) still name the blob. */
int gs_store_dataset_remove(gs_store *s, const char *tenant, const char *name,
                            gs_dataset_row *removed, uint64_t *refs_left, gs_err *e);

/* ---- jobs: the packed gpushare.v1.Job is the record ---- */
typedef struct gs_job_row {
  uint64_t id;
  char tenant[GS_NAME_MAX + 1];
  char vdev[GS_NAME_MAX + 1];
  int state;            /* gpushare.v1.JobState */
  int32_t priority;
  int64_t submitted_ms;
  uint32_t crashes;     /* executor deaths while this job ran */
  uint8_t *record;      /* malloc'd by list/get */
  size_t record_len;
} gs_job_row;

/* Insert a row (record empty) and return its id: the caller then packs the
 * record with that id and calls gs_store_job_update, both inside one
 * gs_store_txn_begin/commit so the job appears whole or not at all. */
int gs_store_job_insert(gs_store *s, const gs_job_row *j, uint64_t *id, gs_err *e);
int gs_store_job_update(gs_store *s, uint64_t id, int state, uint32_t crashes,
                        const uint8_t *record, size_t len, gs_err *e);
int gs_store_job_list(gs_store *s, gs_job_row **out, size_t *n, gs_err *e);
void gs_store_job_rows_free(gs_job_row *rows, size_t n);
int gs_store_job_event_add(gs_store *s, uint64_t id, const uint8_t *record, size_t len,
                           gs_err *e);
/* Calls fn for each stored event of the job, oldest first. */
int gs_store_job_events(gs_store *s, uint64_t id,
                        void (*fn)(void *u, const uint8_t *rec, size_t len), void *u,
                        gs_err *e);
/* Jobs QUEUED or RUNNING in the vdev (a vdev with any is not deleted). */
int gs_store_vdev_active_jobs(gs_store *s, const char *vdev, uint32_t *n, gs_err *e);

/* ---- usage: what jobs used, per job, vdev and UTC day (control/usage.c) */
typedef struct gs_usage_sums {
  double device_seconds;  /* time on the device the job's steps were charged */
  double reserved_gib_s;  /* the vdev's reserved GiB x seconds, this job's share */
  double in_use_gib_s;    /* the job's planned peak in GiB x seconds it ran */
  uint64_t steps;         /* optimizer steps */
  uint64_t samples;       /* steps x micro-batch x accumulation steps */
  uint32_t preemptions;
} gs_usage_sums;

typedef struct gs_usage_row {
  uint64_t job_id;        /* 0: the vdev's reserved memory while no job ran */
  char tenant[GS_NAME_MAX + 1];
  char vdev[GS_NAME_MAX + 1];
  int64_t day;            /* UTC day, unix seconds / 86400 (list: the first one summed) */
  gs_usage_sums sum;
} gs_usage_row;

/* Add each row's sums to the stored row of its (job, tenant, vdev, day),
 * all in one transaction. */
int gs_store_usage_add(gs_store *s, const gs_usage_row *rows, size_t n, gs_err *e);
/* The stored usage of the days from since_day on, summed per (tenant,
 * job, vdev) and ordered so; tenant NULL: every tenant's. *out is
 * malloc'd. */
int gs_store_usage_list(gs_store *s, const char *tenant, int64_t since_day, gs_usage_row **out,
                        size_t *n, gs_err *e);

#endif
