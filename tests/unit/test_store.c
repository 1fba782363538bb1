/* test_store.c: the store's migrations, persistence and accounting. */
#include <criterion/criterion.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "control/store.h"

static char dir[64];
static gs_store *s;
static gs_err e;

static void setup(void) {
  snprintf(dir, sizeof dir, "/tmp/gs-test-store-XXXXXX");
  cr_assert_not_null(mkdtemp(dir));
  gs_err_clear(&e);
  cr_assert_eq(gs_store_open(dir, &s, &e), 0, "%s", e.msg);
}

static void teardown(void) {
  gs_store_close(s);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  cr_assert_eq(system(cmd), 0);
}

static void mk_tenant(const char *name, uint64_t mem, uint32_t compute, uint32_t uid) {
  gs_tenant t = {0};
  snprintf(t.name, sizeof t.name, "%s", name);
  t.quota.memory = mem;
  t.quota.compute = compute;
  t.uids = &uid;
  t.n_uids = 1;
  cr_assert_eq(gs_store_tenant_create(s, &t, &e), 0, "%s", e.msg);
}

static int mk_vdev(const char *name, const char *tenant, uint64_t mem, uint32_t compute,
                   uint64_t usable) {
  gs_vdev v = {0};
  snprintf(v.name, sizeof v.name, "%s", name);
  snprintf(v.device, sizeof v.device, "cpu");
  snprintf(v.tenant, sizeof v.tenant, "%s", tenant);
  v.memory_limit = mem;
  v.compute_share = compute;
  gs_device_limits lim = {.usable = usable};
  gs_err_clear(&e);
  return gs_store_vdev_create(s, &v, &lim, &e);
}

TestSuite(store, .init = setup, .fini = teardown);

Test(store, one_store_per_state_directory) {
  gs_store *second = NULL;
  gs_err e2 = {0};
  cr_assert_lt(gs_store_open(dir, &second, &e2), 0, "a second store on the directory opened");
  cr_assert_null(second);
  cr_assert_eq(e2.code, GS_FAILED_PRECONDITION);
  char pid[32];
  snprintf(pid, sizeof pid, "pid %ld", (long)getpid());
  cr_assert(strstr(e2.msg, "held by another gpushared") && strstr(e2.msg, pid), "%s", e2.msg);
  /* Closed, the directory is free again. */
  gs_store_close(s);
  s = NULL;
  cr_assert_eq(gs_store_open(dir, &second, &e2), 0, "%s", e2.msg);
  s = second;
}

Test(store, state_directory_and_database_are_private) {
  char db[128];
  snprintf(db, sizeof db, "%s/gpushared.db", dir);
  struct stat st;
  cr_assert_eq(stat(db, &st), 0);
  cr_assert_eq(st.st_mode & 0777, 0600, "database mode %04o", st.st_mode & 0777);
  gs_store_close(s);
  s = NULL;
  cr_assert_eq(chmod(dir, 0757), 0);
  cr_assert_eq(gs_store_open(dir, &s, &e), 0, "%s", e.msg);
  cr_assert_eq(stat(dir, &st), 0);
  cr_assert_eq(st.st_mode & 0777, 0700, "state directory mode %04o", st.st_mode & 0777);
}

Test(store, fresh_database_is_migrated) {
  cr_assert_eq(gs_store_schema_version(s), GS_STORE_SCHEMA_VERSION);
  cr_assert_eq(gs_store_check(s, &e), 0);
}

Test(store, newer_schema_is_refused) {
  gs_store_close(s);
  s = NULL;
  char path[128];
  snprintf(path, sizeof path, "%s/gpushared.db", dir);
  sqlite3 *db;
  cr_assert_eq(sqlite3_open(path, &db), SQLITE_OK);
  cr_assert_eq(sqlite3_exec(db, "PRAGMA user_version = 99", 0, 0, 0), SQLITE_OK);
  sqlite3_close(db);
  cr_assert_lt(gs_store_open(dir, &s, &e), 0);
  cr_assert_eq(e.code, GS_FAILED_PRECONDITION);
  cr_assert(strstr(e.msg, "schema version 99"), "%s", e.msg);
}

Test(store, state_survives_reopen) {
  mk_tenant("team-a", 0, 0, 1000);
  cr_assert_eq(mk_vdev("a0", "team-a", 1 << 20, 50, 1 << 30), 0, "%s", e.msg);
  gs_store_close(s);
  cr_assert_eq(gs_store_open(dir, &s, &e), 0, "%s", e.msg);
  gs_tenant t;
  cr_assert_eq(gs_store_tenant_get(s, "team-a", &t, &e), 0, "%s", e.msg);
  cr_assert_eq(t.n_uids, 1);
  cr_assert_eq(t.uids[0], 1000);
  cr_assert_eq(t.vdev_count, 1);
  cr_assert_eq(t.memory_allocated, 1 << 20);
  gs_tenant_clear(&t);
  gs_vdev v;
  cr_assert_eq(gs_store_vdev_get(s, "a0", &v, &e), 0);
  cr_assert_eq(v.compute_share, 50);
}

Test(store, names_are_checked) {
  cr_assert_eq(gs_store_name_valid("ok-name_1.x", "name", &e), 0);
  cr_assert_lt(gs_store_name_valid("", "name", &e), 0);
  cr_assert_lt(gs_store_name_valid("-lead", "name", &e), 0);
  cr_assert_lt(gs_store_name_valid("a/b", "name", &e), 0);
  cr_assert(strstr(e.msg, "'/'"), "%s", e.msg);
  cr_assert_lt(gs_store_name_valid("a\nb", "name", &e), 0);
  cr_assert(strstr(e.msg, "\\x0a"), "control characters are shown escaped: %s", e.msg);
  char longname[100];
  memset(longname, 'x', 99);
  longname[99] = 0;
  cr_assert_lt(gs_store_name_valid(longname, "name", &e), 0);
  cr_assert(strstr(e.msg, "99 characters"), "%s", e.msg);
}

Test(store, duplicates_refused) {
  mk_tenant("t", 0, 0, 1);
  gs_tenant t = {0};
  snprintf(t.name, sizeof t.name, "t");
  cr_assert_lt(gs_store_tenant_create(s, &t, &e), 0);
  cr_assert_eq(e.code, GS_ALREADY_EXISTS);
  cr_assert_eq(mk_vdev("v", "t", 100, 10, 1000), 0);
  cr_assert_lt(mk_vdev("v", "t", 100, 10, 1000), 0);
  cr_assert_eq(e.code, GS_ALREADY_EXISTS);
}

Test(store, uid_in_one_tenant_only) {
  mk_tenant("a", 0, 0, 1000);
  gs_tenant t = {0};
  uint32_t uid = 1000;
  snprintf(t.name, sizeof t.name, "b");
  t.uids = &uid;
  t.n_uids = 1;
  cr_assert_lt(gs_store_tenant_create(s, &t, &e), 0);
  cr_assert_eq(e.code, GS_ALREADY_EXISTS);
  cr_assert(strstr(e.msg, "tenant a"), "%s", e.msg);
  /* Nothing of b was kept. */
  gs_tenant got;
  cr_assert_lt(gs_store_tenant_get(s, "b", &got, &e), 0);
  cr_assert_eq(e.code, GS_NOT_FOUND);
}

Test(store, device_memory_accounting) {
  mk_tenant("t", 0, 0, 1);
  cr_assert_eq(mk_vdev("v1", "t", 600, 10, 1000), 0);
  cr_assert_lt(mk_vdev("v2", "t", 500, 10, 1000), 0);
  cr_assert_eq(e.code, GS_RESOURCE_EXHAUSTED);
  cr_assert(strstr(e.msg, "400 bytes are left"), "%s", e.msg);
  cr_assert_eq(mk_vdev("v2", "t", 400, 10, 1000), 0, "exactly what is left fits");
  gs_device_usage u;
  cr_assert_eq(gs_store_device_usage(s, "cpu", &u, &e), 0);
  cr_assert_eq(u.memory, 1000);
  cr_assert_eq(u.vdevs, 2);
  cr_assert_eq(gs_store_vdev_delete(s, "v1", &e), 0);
  cr_assert_eq(mk_vdev("v3", "t", 600, 10, 1000), 0, "deleting returns the memory");
}

Test(store, compute_over_100_refused) {
  mk_tenant("t", 0, 0, 1);
  cr_assert_eq(mk_vdev("v1", "t", 1, 75, 1000), 0);
  cr_assert_lt(mk_vdev("v2", "t", 1, 26, 1000), 0);
  cr_assert_eq(e.code, GS_RESOURCE_EXHAUSTED);
  cr_assert_str_eq(e.field, "compute_share");
  cr_assert_eq(mk_vdev("v2", "t", 1, 25, 1000), 0);
  cr_assert_lt(mk_vdev("v3", "t", 1, 0, 1000), 0);
  cr_assert_eq(e.code, GS_INVALID_ARGUMENT);
}

Test(store, tenant_quota_accounting) {
  mk_tenant("t", 1000, 60, 1);
  cr_assert_eq(mk_vdev("v1", "t", 800, 30, 1 << 20), 0);
  cr_assert_lt(mk_vdev("v2", "t", 300, 10, 1 << 20), 0);
  cr_assert_eq(e.code, GS_RESOURCE_EXHAUSTED);
  cr_assert(strstr(e.msg, "memory quota"), "%s", e.msg);
  cr_assert_lt(mk_vdev("v2", "t", 200, 31, 1 << 20), 0);
  cr_assert(strstr(e.msg, "compute quota"), "%s", e.msg);
  cr_assert_eq(mk_vdev("v2", "t", 200, 30, 1 << 20), 0);
  /* Lowering the quota below what is held is refused and changes nothing. */
  gs_quota_update u = {.set_memory = true, .q.memory = 500};
  cr_assert_lt(gs_store_quota_set(s, "t", &u, &e), 0);
  cr_assert_eq(e.code, GS_FAILED_PRECONDITION);
  gs_tenant t;
  cr_assert_eq(gs_store_tenant_get(s, "t", &t, &e), 0);
  cr_assert_eq(t.quota.memory, 1000);
  gs_tenant_clear(&t);
  u = (gs_quota_update){.set_max_running = true, .q.max_running = 3};
  cr_assert_eq(gs_store_quota_set(s, "t", &u, &e), 0, "%s", e.msg);
  cr_assert_eq(gs_store_tenant_get(s, "t", &t, &e), 0);
  cr_assert_eq(t.quota.max_running, 3);
  cr_assert_eq(t.quota.memory, 1000, "fields not set are kept");
  gs_tenant_clear(&t);
}

Test(store, tenant_with_vdevs_not_deleted) {
  mk_tenant("t", 0, 0, 1);
  cr_assert_eq(mk_vdev("v", "t", 1, 1, 10), 0);
  cr_assert_lt(gs_store_tenant_delete(s, "t", &e), 0);
  cr_assert_eq(e.code, GS_FAILED_PRECONDITION);
  cr_assert_eq(gs_store_vdev_delete(s, "v", &e), 0);
  cr_assert_eq(gs_store_tenant_delete(s, "t", &e), 0, "%s", e.msg);
  cr_assert_lt(gs_store_tenant_delete(s, "t", &e), 0);
  cr_assert_eq(e.code, GS_NOT_FOUND);
}

Test(store, vdev_needs_existing_tenant) {
  cr_assert_lt(mk_vdev("v", "nobody", 1, 1, 10), 0);
  cr_assert_eq(e.code, GS_NOT_FOUND);
}

Test(store, tenants_of_peer) {
  gs_tenant t = {0};
  uint32_t gid = 500;
  snprintf(t.name, sizeof t.name, "bygroup");
  t.gids = &gid;
  t.n_gids = 1;
  cr_assert_eq(gs_store_tenant_create(s, &t, &e), 0, "%s", e.msg);
  mk_tenant("byuid", 0, 0, 42);
  char names[4][GS_NAME_MAX + 1];
  bool by_uid[4];
  size_t n;
  uint32_t gids[] = {7, 500};
  cr_assert_eq(gs_store_tenants_of(s, 42, gids, 2, names, by_uid, 4, &n, &e), 0);
  cr_assert_eq(n, 2);
  cr_assert_str_eq(names[0], "byuid");
  cr_assert(by_uid[0]);
  cr_assert_str_eq(names[1], "bygroup");
  cr_assert_eq(gs_store_tenants_of(s, 43, gids, 1, names, by_uid, 4, &n, &e), 0);
  cr_assert_eq(n, 0);
}

Test(store, v1_database_is_migrated_forward) {
  gs_store_close(s);
  s = NULL;
  char path[128];
  snprintf(path, sizeof path, "%s/gpushared.db", dir);
  unlink(path);
  sqlite3 *db;
  cr_assert_eq(sqlite3_open(path, &db), SQLITE_OK);
  /* A schema-1 database as gpushared 0.1 wrote it, with a tenant in it. */
  cr_assert_eq(sqlite3_exec(db,
                            "CREATE TABLE tenants(name TEXT PRIMARY KEY, quota_memory INTEGER NOT NULL DEFAULT 0,"
                            " quota_compute INTEGER NOT NULL DEFAULT 0, max_running INTEGER NOT NULL DEFAULT 0,"
                            " max_queued INTEGER NOT NULL DEFAULT 0, created INTEGER NOT NULL);"
                            "CREATE TABLE members(tenant TEXT NOT NULL, kind TEXT NOT NULL, id INTEGER NOT NULL, UNIQUE(kind, id));"
                            "CREATE TABLE vdevs(name TEXT PRIMARY KEY, device TEXT NOT NULL, tenant TEXT NOT NULL,"
                            " memory_limit INTEGER NOT NULL, compute_share INTEGER NOT NULL, policy INTEGER NOT NULL,"
                            " created INTEGER NOT NULL);"
                            "INSERT INTO tenants(name, created) VALUES ('old', 1);"
                            "PRAGMA user_version = 1;",
                            0, 0, 0),
               SQLITE_OK);
  sqlite3_close(db);
  cr_assert_eq(gs_store_open(dir, &s, &e), 0, "%s", e.msg);
  cr_assert_eq(gs_store_schema_version(s), GS_STORE_SCHEMA_VERSION);
  gs_tenant t;
  cr_assert_eq(gs_store_tenant_get(s, "old", &t, &e), 0, "data kept across the migration");
  gs_tenant_clear(&t);
  gs_dataset_row d = {.bytes = 3};
  strcpy(d.tenant, "old");
  strcpy(d.name, "x");
  strcpy(d.sha256, "ab");
  cr_assert_eq(gs_store_dataset_add(s, &d, &e), 0, "%s", e.msg);
}

Test(store, datasets_per_tenant_and_dedup) {
  mk_tenant("a", 0, 0, 1);
  mk_tenant("b", 0, 0, 2);
  gs_dataset_row d = {.bytes = 10};
  strcpy(d.tenant, "a");
  strcpy(d.name, "train");
  strcpy(d.sha256, "1111");
  cr_assert_eq(gs_store_dataset_add(s, &d, &e), 0, "%s", e.msg);
  cr_assert_eq(gs_store_dataset_add(s, &d, &e), 0, "the same content again is fine");
  strcpy(d.sha256, "2222");
  cr_assert_lt(gs_store_dataset_add(s, &d, &e), 0);
  cr_assert_eq(e.code, GS_ALREADY_EXISTS);
  strcpy(d.tenant, "b");
  strcpy(d.sha256, "1111");
  cr_assert_eq(gs_store_dataset_add(s, &d, &e), 0, "b names the same blob");
  gs_dataset_row got;
  cr_assert_eq(gs_store_dataset_by_sha(s, "a", "1111", &got, &e), 0);
  cr_assert_lt(gs_store_dataset_by_sha(s, "a", "2222", &got, &e), 0);
  cr_assert_eq(e.code, GS_NOT_FOUND);
  uint64_t refs;
  cr_assert_eq(gs_store_dataset_remove(s, "a", "train", &got, &refs, &e), 0);
  cr_assert_eq(refs, 1, "b still names the blob");
  cr_assert_lt(gs_store_dataset_get(s, "a", "train", &got, &e), 0);
  cr_assert_lt(gs_store_tenant_delete(s, "b", &e), 0, "a tenant with datasets stays");
  cr_assert(strstr(e.msg, "dataset"), "%s", e.msg);
}

Test(store, jobs_in_one_transaction) {
  mk_tenant("a", 0, 0, 1);
  cr_assert_eq(mk_vdev("v", "a", 100, 10, 1000), 0);
  gs_job_row j = {.state = 0, .priority = 5, .submitted_ms = 1234};
  strcpy(j.tenant, "a");
  strcpy(j.vdev, "v");
  uint64_t id = 0;
  cr_assert_eq(gs_store_txn_begin(s, &e), 0);
  cr_assert_eq(gs_store_job_insert(s, &j, &id, &e), 0, "%s", e.msg);
  cr_assert_eq(gs_store_job_update(s, id, 0, 0, (const uint8_t *)"rec", 3, &e), 0);
  cr_assert_eq(gs_store_txn_commit(s, &e), 0);
  /* A transaction rolled back leaves no job behind. */
  cr_assert_eq(gs_store_txn_begin(s, &e), 0);
  uint64_t id2;
  cr_assert_eq(gs_store_job_insert(s, &j, &id2, &e), 0);
  gs_store_txn_rollback(s);
  gs_job_row *rows;
  size_t n;
  cr_assert_eq(gs_store_job_list(s, &rows, &n, &e), 0);
  cr_assert_eq(n, 1);
  cr_assert_eq(rows[0].id, id);
  cr_assert_eq(rows[0].record_len, 3);
  cr_assert_eq(memcmp(rows[0].record, "rec", 3), 0);
  gs_store_job_rows_free(rows, n);
  cr_assert_lt(gs_store_vdev_delete(s, "v", &e), 0, "a vdev with a queued job stays");
  cr_assert_eq(e.code, GS_FAILED_PRECONDITION);
  cr_assert_eq(gs_store_job_update(s, id, 2, 0, (const uint8_t *)"done", 4, &e), 0);
  cr_assert_eq(gs_store_job_event_add(s, id, (const uint8_t *)"e1", 2, &e), 0);
  cr_assert_eq(gs_store_job_event_add(s, id, (const uint8_t *)"e2", 2, &e), 0);
  cr_assert_eq(gs_store_vdev_delete(s, "v", &e), 0, "%s", e.msg);
  cr_assert_eq(gs_store_tenant_delete(s, "a", &e), 0, "ended jobs go with their tenant: %s", e.msg);
}

/* Reopen the store of `dir` after do_what to its files; the error, if any. */
static int reopen(gs_err *e2) {
  gs_store_close(s);
  s = NULL;
  gs_err_clear(e2);
  return gs_store_open(dir, &s, e2);
}

Test(store, damaged_database_is_refused) {
  mk_tenant("a", 0, 0, 1);
  for (int i = 0; i < 200; i++) {
    char n[32];
    snprintf(n, sizeof n, "t%d", i);
    mk_tenant(n, 0, 0, (uint32_t)(100 + i));
  }
  gs_store_close(s);
  s = NULL;
  /* Checkpoint the WAL into the file, then overwrite its middle pages. */
  char path[128], cmd[256];
  snprintf(path, sizeof path, "%s/gpushared.db", dir);
  sqlite3 *db;
  cr_assert_eq(sqlite3_open(path, &db), SQLITE_OK);
  cr_assert_eq(sqlite3_exec(db, "PRAGMA wal_checkpoint(TRUNCATE)", NULL, NULL, NULL), SQLITE_OK);
  sqlite3_close(db);
  struct stat st;
  cr_assert_eq(stat(path, &st), 0);
  cr_assert_gt(st.st_size, 4 * 4096, "a database of %lld bytes", (long long)st.st_size);
  FILE *f = fopen(path, "r+");
  cr_assert_not_null(f);
  cr_assert_eq(fseek(f, 4096 + 100, SEEK_SET), 0);
  for (int i = 0; i < 3000; i++) fputc(0xA5, f);
  fclose(f);
  gs_err e2;
  cr_assert_lt(reopen(&e2), 0, "a damaged database opened");
  cr_assert_null(s);
  cr_assert_eq(e2.code, GS_FAILED_PRECONDITION);
  cr_assert(strstr(e2.msg, path) && strstr(e2.msg, "damaged") && strstr(e2.msg, "backup"), "%s",
            e2.msg);
  /* Put back a fresh store for the teardown. */
  snprintf(cmd, sizeof cmd, "rm -f %s %s-wal %s-shm", path, path, path);
  cr_assert_eq(system(cmd), 0);
  cr_assert_eq(reopen(&e2), 0, "%s", e2.msg);
}

Test(store, lost_database_beside_jobs_is_refused) {
  char path[128], jobs[128], job[140];
  snprintf(path, sizeof path, "%s/gpushared.db", dir);
  snprintf(jobs, sizeof jobs, "%s/jobs", dir);
  snprintf(job, sizeof job, "%s/7", jobs);
  cr_assert_eq(mkdir(jobs, 0700), 0);
  cr_assert_eq(mkdir(job, 0700), 0);
  gs_err e2;
  gs_store_close(s);
  s = NULL;
  cr_assert_eq(truncate(path, 0), 0);
  cr_assert_lt(reopen(&e2), 0, "an emptied database beside jobs/ opened");
  cr_assert(strstr(e2.msg, "empty (0 bytes)") && strstr(e2.msg, "1 job directory") &&
            strstr(e2.msg, "backup"), "%s", e2.msg);
  cr_assert_eq(unlink(path), 0);
  cr_assert_lt(reopen(&e2), 0, "a missing database beside jobs/ opened");
  cr_assert(strstr(e2.msg, "missing"), "%s", e2.msg);
  /* jobs/ empty (a fresh directory): a new store starts. */
  cr_assert_eq(rmdir(job), 0);
  cr_assert_eq(reopen(&e2), 0, "%s", e2.msg);
}

Test(store, job_ids_skip_reserved_directories) {
  mk_tenant("a", 0, 0, 1);
  gs_job_row j = {.state = 0};
  strcpy(j.tenant, "a");
  strcpy(j.vdev, "v");
  uint64_t id = 0;
  cr_assert_eq(gs_store_job_insert(s, &j, &id, &e), 0, "%s", e.msg);
  cr_assert_eq(id, 1);
  cr_assert_eq(gs_store_job_ids_above(s, 41, &e), 0, "%s", e.msg);
  cr_assert_eq(gs_store_job_insert(s, &j, &id, &e), 0, "%s", e.msg);
  cr_assert_eq(id, 42);
  cr_assert_eq(gs_store_job_ids_above(s, 10, &e), 0, "%s", e.msg);
  cr_assert_eq(gs_store_job_insert(s, &j, &id, &e), 0, "%s", e.msg);
  cr_assert_eq(id, 43, "a lower mark never lowers the next id");
}
