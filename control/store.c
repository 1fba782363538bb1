/*
 * store.c: gpushared's SQLite store (see store.h for the contract).
 *
 * Design:
 *  - One connection, opened by the control plane's loop thread and used only
 *    there. WAL journal (readers never block the writer), synchronous=FULL
 *    (a committed quota change survives power loss, not just a crash),
 *    busy_timeout so an ops team's `sqlite3 gpushared.db .backup` does not
 *    make the daemon fail, foreign keys on.
 *  - Statements are prepared once, on first use, and kept (sql[] below is
 *    the whole query vocabulary of the daemon).
 *  - Mutations run in BEGIN IMMEDIATE ... COMMIT with their admission checks
 *    inside, through one ladder: any failure rolls back and leaves the
 *    database exactly as it was.
 *  - Migrations: migrations[i] takes the schema from version i to i + 1 and
 *    is applied in the same transaction that sets PRAGMA user_version, so a
 *    crash mid-migration leaves the old version intact. A database newer
 *    than this binary is refused instead of being misread.
 */
#include "control/store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "control/log.h"

static const char *const migrations[] = {
    /* 0 -> 1: tenants, their members, vdevs. */
    "CREATE TABLE tenants("
    "  name TEXT PRIMARY KEY,"
    "  quota_memory INTEGER NOT NULL DEFAULT 0,"
    "  quota_compute INTEGER NOT NULL DEFAULT 0,"
    "  max_running INTEGER NOT NULL DEFAULT 0,"
    "  max_queued INTEGER NOT NULL DEFAULT 0,"
    "  created INTEGER NOT NULL);"
    "CREATE TABLE members("
    "  tenant TEXT NOT NULL REFERENCES tenants(name) ON DELETE CASCADE,"
    "  kind TEXT NOT NULL CHECK (kind IN ('uid', 'gid')),"
    "  id INTEGER NOT NULL,"
    "  UNIQUE (kind, id));"
    "CREATE INDEX members_tenant ON members(tenant);"
    "CREATE TABLE vdevs("
    "  name TEXT PRIMARY KEY,"
    "  device TEXT NOT NULL,"
    "  tenant TEXT NOT NULL REFERENCES tenants(name),"
    "  memory_limit INTEGER NOT NULL CHECK (memory_limit > 0),"
    "  compute_share INTEGER NOT NULL CHECK (compute_share BETWEEN 1 AND 100),"
    "  policy INTEGER NOT NULL CHECK (policy IN (0, 1)),"
    "  created INTEGER NOT NULL);"
    "CREATE INDEX vdevs_device ON vdevs(device);"
    "CREATE INDEX vdevs_tenant ON vdevs(tenant);",
    /* 1 -> 2: datasets (content-addressed blobs named per tenant), jobs
     * (the packed gpushare.v1.Job is the record; the columns are what the
     * scheduler and the permission checks query), their events. */
    "CREATE TABLE datasets("
    "  tenant TEXT NOT NULL REFERENCES tenants(name),"
    "  name TEXT NOT NULL,"
    "  sha256 TEXT NOT NULL,"
    "  bytes INTEGER NOT NULL,"
    "  created INTEGER NOT NULL,"
    "  PRIMARY KEY (tenant, name));"
    "CREATE INDEX datasets_sha ON datasets(sha256);"
    "CREATE TABLE jobs("
    "  id INTEGER PRIMARY KEY AUTOINCREMENT,"
    "  tenant TEXT NOT NULL REFERENCES tenants(name),"
    "  vdev TEXT NOT NULL,"
    "  state INTEGER NOT NULL,"
    "  priority INTEGER NOT NULL,"
    "  submitted INTEGER NOT NULL,"
    "  crashes INTEGER NOT NULL DEFAULT 0,"
    "  record BLOB NOT NULL);"
    "CREATE INDEX jobs_state ON jobs(state, vdev);"
    "CREATE INDEX jobs_tenant ON jobs(tenant);"
    "CREATE TABLE job_events("
    "  job_id INTEGER NOT NULL REFERENCES jobs(id),"
    "  seq INTEGER NOT NULL,"
    "  record BLOB NOT NULL,"
    "  PRIMARY KEY (job_id, seq));",
    /* 2 -> 3: usage, per job, vdev and UTC day (unix seconds / 86400), added
     * to once a second (control/usage.c). job_id 0 is a vdev's reserved
     * memory while no job ran; no foreign keys, so what a tenant used stays
     * when its jobs' or its own rows go. */
    "CREATE TABLE usage("
    "  job_id INTEGER NOT NULL,"
    "  tenant TEXT NOT NULL,"
    "  vdev TEXT NOT NULL,"
    "  day INTEGER NOT NULL,"
    "  device_seconds REAL NOT NULL DEFAULT 0,"
    "  reserved_gib_s REAL NOT NULL DEFAULT 0,"
    "  in_use_gib_s REAL NOT NULL DEFAULT 0,"
    "  steps INTEGER NOT NULL DEFAULT 0,"
    "  samples INTEGER NOT NULL DEFAULT 0,"
    "  preemptions INTEGER NOT NULL DEFAULT 0,"
    "  PRIMARY KEY (job_id, tenant, vdev, day));"
    "CREATE INDEX usage_tenant_day ON usage(tenant, day);",
};
#define N_MIGRATIONS (sizeof migrations / sizeof migrations[0])
_Static_assert(N_MIGRATIONS == GS_STORE_SCHEMA_VERSION, "one migration per schema version");

enum {
  Q_TENANT_INSERT,
  Q_TENANT_GET,
  Q_TENANT_LIST,
  Q_TENANT_DELETE,
  Q_TENANT_USAGE,
  Q_MEMBER_INSERT,
  Q_MEMBER_OWNER,
  Q_MEMBERS_OF,
  Q_QUOTA_UPDATE,
  Q_VDEV_INSERT,
  Q_VDEV_GET,
  Q_VDEV_LIST,
  Q_VDEV_DELETE,
  Q_VDEV_UPDATE,
  Q_DEVICE_USAGE,
  Q_TENANTS_OF_UID,
  Q_TENANTS_OF_GID,
  Q_DATASET_INSERT,
  Q_DATASET_GET,
  Q_DATASET_BY_SHA,
  Q_DATASET_LIST,
  Q_DATASET_LIST_ALL,
  Q_DATASET_DELETE,
  Q_BLOB_REFS,
  Q_JOB_INSERT,
  Q_JOB_UPDATE,
  Q_JOB_GET,
  Q_JOB_LIST,
  Q_JOB_COUNT,
  Q_EVENT_INSERT,
  Q_EVENT_LIST,
  Q_VDEV_JOBS,
  Q_USAGE_ADD,
  Q_USAGE_LIST,
  Q_COUNT
};

static const char *const sql[Q_COUNT] = {
    [Q_TENANT_INSERT] = "INSERT INTO tenants(name, quota_memory, quota_compute, max_running,"
                        " max_queued, created) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    [Q_TENANT_GET] = "SELECT name, quota_memory, quota_compute, max_running, max_queued,"
                     " created FROM tenants WHERE name = ?1",
    [Q_TENANT_LIST] = "SELECT name FROM tenants ORDER BY name",
    [Q_TENANT_DELETE] = "DELETE FROM tenants WHERE name = ?1",
    [Q_TENANT_USAGE] = "SELECT COALESCE(SUM(memory_limit), 0), COALESCE(SUM(compute_share), 0),"
                       " COUNT(*) FROM vdevs WHERE tenant = ?1",
    [Q_MEMBER_INSERT] = "INSERT INTO members(tenant, kind, id) VALUES (?1, ?2, ?3)",
    [Q_MEMBER_OWNER] = "SELECT tenant FROM members WHERE kind = ?1 AND id = ?2",
    [Q_MEMBERS_OF] = "SELECT kind, id FROM members WHERE tenant = ?1 ORDER BY kind, id",
    [Q_QUOTA_UPDATE] = "UPDATE tenants SET quota_memory = ?2, quota_compute = ?3,"
                       " max_running = ?4, max_queued = ?5 WHERE name = ?1",
    [Q_VDEV_INSERT] = "INSERT INTO vdevs(name, device, tenant, memory_limit, compute_share,"
                      " policy, created) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    [Q_VDEV_GET] = "SELECT name, device, tenant, memory_limit, compute_share, policy, created"
                   " FROM vdevs WHERE name = ?1",
    [Q_VDEV_LIST] = "SELECT name, device, tenant, memory_limit, compute_share, policy, created"
                    " FROM vdevs ORDER BY device, name",
    [Q_VDEV_DELETE] = "DELETE FROM vdevs WHERE name = ?1",
    [Q_VDEV_UPDATE] = "UPDATE vdevs SET memory_limit = ?2, compute_share = ?3, policy = ?4"
                      " WHERE name = ?1",
    [Q_DEVICE_USAGE] = "SELECT COALESCE(SUM(memory_limit), 0), COALESCE(SUM(compute_share), 0),"
                       " COUNT(*) FROM vdevs WHERE device = ?1",
    [Q_TENANTS_OF_UID] = "SELECT tenant FROM members WHERE kind = 'uid' AND id = ?1",
    [Q_TENANTS_OF_GID] = "SELECT tenant, id FROM members WHERE kind = 'gid' AND id = ?1",
    [Q_DATASET_INSERT] = "INSERT INTO datasets(tenant, name, sha256, bytes, created)"
                         " VALUES (?1, ?2, ?3, ?4, ?5)",
    [Q_DATASET_GET] = "SELECT tenant, name, sha256, bytes, created FROM datasets"
                      " WHERE tenant = ?1 AND name = ?2",
    [Q_DATASET_BY_SHA] = "SELECT tenant, name, sha256, bytes, created FROM datasets"
                         " WHERE tenant = ?1 AND sha256 = ?2 ORDER BY name LIMIT 1",
    [Q_DATASET_LIST] = "SELECT tenant, name, sha256, bytes, created FROM datasets"
                       " WHERE tenant = ?1 ORDER BY name",
    [Q_DATASET_LIST_ALL] = "SELECT tenant, name, sha256, bytes, created FROM datasets"
                           " ORDER BY tenant, name",
    [Q_DATASET_DELETE] = "DELETE FROM datasets WHERE tenant = ?1 AND name = ?2",
    [Q_BLOB_REFS] = "SELECT COUNT(*) FROM datasets WHERE sha256 = ?1",
    [Q_JOB_INSERT] = "INSERT INTO jobs(tenant, vdev, state, priority, submitted, record)"
                     " VALUES (?1, ?2, ?3, ?4, ?5, x'')",
    [Q_JOB_UPDATE] = "UPDATE jobs SET state = ?2, crashes = ?3, record = ?4 WHERE id = ?1",
    [Q_JOB_GET] = "SELECT id, tenant, vdev, state, priority, submitted, crashes, record"
                  " FROM jobs WHERE id = ?1",
    [Q_JOB_LIST] = "SELECT id, tenant, vdev, state, priority, submitted, crashes, record"
                   " FROM jobs ORDER BY id",
    [Q_JOB_COUNT] = "SELECT COUNT(*) FROM jobs WHERE tenant = ?1 AND state = ?2",
    [Q_EVENT_INSERT] = "INSERT INTO job_events(job_id, seq, record) VALUES (?1,"
                       " (SELECT COALESCE(MAX(seq), 0) + 1 FROM job_events WHERE job_id = ?1), ?2)",
    [Q_EVENT_LIST] = "SELECT record FROM job_events WHERE job_id = ?1 ORDER BY seq",
    [Q_VDEV_JOBS] = "SELECT COUNT(*) FROM jobs WHERE vdev = ?1 AND state IN (0, 1)",
    [Q_USAGE_ADD] = "INSERT INTO usage(job_id, tenant, vdev, day, device_seconds, reserved_gib_s,"
                    " in_use_gib_s, steps, samples, preemptions)"
                    " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"
                    " ON CONFLICT (job_id, tenant, vdev, day) DO UPDATE SET"
                    " device_seconds = device_seconds + excluded.device_seconds,"
                    " reserved_gib_s = reserved_gib_s + excluded.reserved_gib_s,"
                    " in_use_gib_s = in_use_gib_s + excluded.in_use_gib_s,"
                    " steps = steps + excluded.steps, samples = samples + excluded.samples,"
                    " preemptions = preemptions + excluded.preemptions",
    [Q_USAGE_LIST] = "SELECT job_id, tenant, vdev, MIN(day), SUM(device_seconds),"
                     " SUM(reserved_gib_s), SUM(in_use_gib_s), SUM(steps), SUM(samples),"
                     " SUM(preemptions) FROM usage WHERE day >= ?1 AND (?2 IS NULL OR tenant = ?2)"
                     " GROUP BY tenant, job_id, vdev ORDER BY tenant, job_id, vdev",
};

struct gs_store {
  sqlite3 *db;              /* the one connection, loop thread only */
  int txn_depth;            /* > 0: inside gs_store_txn_begin; calls join it */
  sqlite3_stmt *st[Q_COUNT]; /* prepared on first use */
  char path[PATH_MAX];      /* STATE_DIR/gpushared.db, for messages */
  int lock_fd;              /* STATE_DIR/gpushared.lock, flock'd while open */
};

static int db_fail(gs_store *s, gs_err *e, const char *what) {
  return gs_err_set(e, GS_INTERNAL, "", "store: %s: %s (database %s)", what,
                    sqlite3_errmsg(s->db), s->path);
}

/* The prepared statement for q, reset and with its bindings cleared. */
static sqlite3_stmt *stmt(gs_store *s, int q, gs_err *e) {
  if (!s->st[q] && sqlite3_prepare_v3(s->db, sql[q], -1, SQLITE_PREPARE_PERSISTENT,
                                      &s->st[q], NULL) != SQLITE_OK) {
    db_fail(s, e, "prepare");
    return NULL;
  }
  sqlite3_reset(s->st[q]);
  sqlite3_clear_bindings(s->st[q]);
  return s->st[q];
}

static int exec(gs_store *s, const char *text, gs_err *e) {
  char *msg = NULL;
  if (sqlite3_exec(s->db, text, NULL, NULL, &msg) != SQLITE_OK) {
    gs_err_set(e, GS_INTERNAL, "", "store: %s: %s (database %s)", text,
               msg ? msg : sqlite3_errmsg(s->db), s->path);
    sqlite3_free(msg);
    return gs_err_rc(e);
  }
  return 0;
}

/* Inside an outer gs_store_txn_begin, a call's own transaction becomes a
 * savepoint, so its failure undoes just that call and the outer caller
 * decides about the rest. */
static int begin(gs_store *s, gs_err *e) {
  if (s->txn_depth++ > 0) return exec(s, "SAVEPOINT call", e) < 0 ? (s->txn_depth--, -1) : 0;
  if (exec(s, "BEGIN IMMEDIATE", e) < 0) {
    s->txn_depth--;
    return gs_err_rc(e);
  }
  return 0;
}
static int commit(gs_store *s, gs_err *e) {
  if (--s->txn_depth > 0) return exec(s, "RELEASE call", e);
  if (exec(s, "COMMIT", e) < 0) {
    sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
    return gs_err_rc(e);
  }
  return 0;
}
static int rollback(gs_store *s) {
  if (--s->txn_depth > 0) {
    sqlite3_exec(s->db, "ROLLBACK TO call; RELEASE call", NULL, NULL, NULL);
    return -1;
  }
  sqlite3_exec(s->db, "ROLLBACK", NULL, NULL, NULL);
  return -1;
}

int gs_store_txn_begin(gs_store *s, gs_err *e) { return begin(s, e); }
int gs_store_txn_commit(gs_store *s, gs_err *e) { return commit(s, e); }
void gs_store_txn_rollback(gs_store *s) { rollback(s); }

/* Run a statement that returns no row; SQLITE_CONSTRAINT is reported by the
 * caller, which knows what the constraint means. */
static int step_done(gs_store *s, sqlite3_stmt *q, gs_err *e, const char *what) {
  int rc = sqlite3_step(q);
  sqlite3_reset(q);
  if (rc == SQLITE_DONE) return 0;
  if ((rc & 0xff) == SQLITE_CONSTRAINT) return -2;
  return db_fail(s, e, what);
}

static int user_version(gs_store *s) {
  sqlite3_stmt *q = NULL;
  int v = -1;
  if (sqlite3_prepare_v2(s->db, "PRAGMA user_version", -1, &q, NULL) == SQLITE_OK &&
      sqlite3_step(q) == SQLITE_ROW)
    v = sqlite3_column_int(q, 0);
  sqlite3_finalize(q);
  return v;
}

static int migrate(gs_store *s, gs_err *e) {
  int v = user_version(s);
  if (v < 0) return db_fail(s, e, "read schema version");
  if (v > (int)N_MIGRATIONS)
    return gs_err_set(e, GS_FAILED_PRECONDITION, "state_dir",
                      "the database %s has schema version %d, newer than this gpushared "
                      "(version %d): run the gpushared that wrote it, or restore a backup",
                      s->path, v, GS_STORE_SCHEMA_VERSION);
  for (; v < (int)N_MIGRATIONS; v++) {
    char set[64];
    snprintf(set, sizeof set, "PRAGMA user_version = %d", v + 1);
    if (begin(s, e) < 0) return gs_err_rc(e);
    if (exec(s, migrations[v], e) < 0 || exec(s, set, e) < 0) return rollback(s);
    if (commit(s, e) < 0) return gs_err_rc(e);
  }
  return 0;
}

/* The state directory private to the daemon's user: refused when it is
 * someone else's and others may use it; tightened (and said so) when it
 * is ours. */
static int private_dir(const char *dir, gs_err *e) {
  struct stat st;
  if (stat(dir, &st) < 0)
    return gs_err_set(e, GS_FAILED_PRECONDITION, "state_dir", "cannot use the state directory %s: %s",
                      dir, strerror(errno));
  if (!S_ISDIR(st.st_mode))
    return gs_err_set(e, GS_FAILED_PRECONDITION, "state_dir", "the state directory %s is not a directory",
                      dir);
  if (!(st.st_mode & 077)) return 0;
  if (st.st_uid != geteuid())
    return gs_err_set(e, GS_FAILED_PRECONDITION, "state_dir",
                      "the state directory %s belongs to uid %u and others may use it (mode %04o): "
                      "give gpushared a directory of its own, mode 0700",
                      dir, (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777));
  if (chmod(dir, st.st_mode & 07700) < 0)
    return gs_err_set(e, GS_FAILED_PRECONDITION, "state_dir",
                      "the state directory %s is mode %04o, open to others, and cannot be made "
                      "private: %s",
                      dir, (unsigned)(st.st_mode & 07777), strerror(errno));
  gs_warn("the state directory %s was mode %04o; it is now %04o, the daemon's alone", dir,
          (unsigned)(st.st_mode & 07777), (unsigned)(st.st_mode & 07700));
  return 0;
}

/* One daemon per state directory: an exclusive flock on STATE/gpushared.lock,
 * held while the store is open (the kernel drops it when the process ends,
 * however it ends), with the holder's pid written inside for the refusal
 * of a second one. */
static int lock_dir(gs_store *s, const char *dir, gs_err *e) {
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/gpushared.lock", dir);
  s->lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (s->lock_fd < 0)
    return gs_err_set(e, GS_FAILED_PRECONDITION, "state_dir", "cannot open the lock file %s: %s",
                      path, strerror(errno));
  if (flock(s->lock_fd, LOCK_EX | LOCK_NB) < 0) {
    int err = errno;
    char pid[32] = "";
    ssize_t n = pread(s->lock_fd, pid, sizeof pid - 1, 0);
    pid[n > 0 ? n : 0] = '\0';
    pid[strcspn(pid, "\n")] = '\0';
    if (err == EWOULDBLOCK)
      return gs_err_set(e, GS_FAILED_PRECONDITION, "state_dir",
                        "the state directory %s is held by another gpushared (pid %s, lock file "
                        "%s): stop that daemon, or give this one a state directory of its own",
                        dir, pid[0] ? pid : "unknown", path);
    return gs_err_set(e, GS_FAILED_PRECONDITION, "state_dir", "cannot lock %s: %s", path,
                      strerror(err));
  }
  char pid[32];
  int len = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
  if (ftruncate(s->lock_fd, 0) < 0 || pwrite(s->lock_fd, pid, (size_t)len, 0) != len)
    gs_warn("cannot write the pid into %s: %s", path, strerror(errno));
  return 0;
}

static int refuse_lost_db(const char *state_dir, const char *path, gs_err *e);

int gs_store_open(const char *state_dir, gs_store **out, gs_err *e) {
  *out = NULL;
  if (mkdir(state_dir, 0700) < 0 && errno != EEXIST)
    return gs_err_set(e, GS_FAILED_PRECONDITION, "state_dir",
                      "cannot create the state directory %s: %s", state_dir, strerror(errno));
  if (private_dir(state_dir, e) < 0) return gs_err_rc(e);
  gs_store *s = calloc(1, sizeof *s);
  if (!s) return gs_err_set(e, GS_INTERNAL, "", "store: out of memory");
  s->lock_fd = -1;
  int n = snprintf(s->path, sizeof s->path, "%s/gpushared.db", state_dir);
  if (n < 0 || (size_t)n >= sizeof s->path) {
    free(s);
    return gs_err_set(e, GS_INVALID_ARGUMENT, "state_dir", "state directory path too long");
  }
  if (lock_dir(s, state_dir, e) < 0 || refuse_lost_db(state_dir, s->path, e) < 0) goto fail;
  /* The database and the WAL and shared-memory files SQLite makes beside it
   * (with the database's mode) are the daemon's alone. */
  int fd = open(s->path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0 || fchmod(fd, 0600) < 0) {
    gs_err_set(e, GS_FAILED_PRECONDITION, "state_dir", "cannot create %s with mode 0600: %s",
               s->path, strerror(errno));
    if (fd >= 0) close(fd);
    goto fail;
  }
  close(fd);
  /* SQLite gives the WAL and shared-memory files the database's mode when
   * it creates them, but keeps the mode of ones left by an earlier run
   * (or an older gpushared): they hold the same data, so they are made
   * 0600 too. */
  for (int k = 0; k < 2; k++) {
    char side[PATH_MAX + 8];
    snprintf(side, sizeof side, "%s%s", s->path, k ? "-shm" : "-wal");
    int sfd = open(side, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (sfd < 0 && errno == ENOENT) continue;
    if (sfd < 0 || fchmod(sfd, 0600) < 0) {
      gs_err_set(e, GS_FAILED_PRECONDITION, "state_dir", "cannot make %s mode 0600: %s", side,
                 strerror(errno));
      if (sfd >= 0) close(sfd);
      goto fail;
    }
    close(sfd);
  }
  if (sqlite3_open_v2(s->path, &s->db,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                      NULL) != SQLITE_OK) {
    gs_err_set(e, GS_FAILED_PRECONDITION, "state_dir", "cannot open %s: %s", s->path,
               s->db ? sqlite3_errmsg(s->db) : "out of memory");
    goto fail;
  }
  sqlite3_busy_timeout(s->db, 5000);
  /* Checked before anything writes to it. */
  if (gs_store_check(s, e) < 0) goto fail;
  if (exec(s, "PRAGMA journal_mode = WAL", e) < 0 ||
      exec(s, "PRAGMA synchronous = FULL", e) < 0 ||
      exec(s, "PRAGMA foreign_keys = ON", e) < 0 || migrate(s, e) < 0)
    goto fail;
  *out = s;
  return 0;
fail:
  gs_store_close(s);
  return gs_err_rc(e);
}

void gs_store_close(gs_store *s) {
  if (!s) return;
  for (int i = 0; i < Q_COUNT; i++) sqlite3_finalize(s->st[i]);
  sqlite3_close(s->db);
  if (s->lock_fd >= 0) close(s->lock_fd); /* releases the flock */
  free(s);
}

int gs_store_schema_version(gs_store *s) { return user_version(s); }

/* The store is damaged: what SQLite found, and what an operator does. */
static int refuse_damaged(gs_store *s, const char *found, gs_err *e) {
  return gs_err_set(e, GS_FAILED_PRECONDITION, "state_dir",
                    "%s is damaged (%s); gpushared does not serve a damaged store. Restore it "
                    "from a backup (see Backup in the operations guide), removing any "
                    "gpushared.db-wal and gpushared.db-shm beside it, or move the state "
                    "directory's content aside to start empty",
                    s->path, found);
}

int gs_store_check(gs_store *s, gs_err *e) {
  /* integrity_check reads every page and index; past GS_STORE_FULL_CHECK_MAX
   * bytes quick_check (pages and structure, not index contents) keeps the
   * start short. */
  struct stat st;
  bool full = stat(s->path, &st) < 0 || (uint64_t)st.st_size <= GS_STORE_FULL_CHECK_MAX;
  const char *pragma = full ? "PRAGMA integrity_check(5)" : "PRAGMA quick_check(5)";
  sqlite3_stmt *q = NULL;
  if (sqlite3_prepare_v2(s->db, pragma, -1, &q, NULL) != SQLITE_OK) {
    int code = sqlite3_errcode(s->db);
    if (code == SQLITE_CORRUPT || code == SQLITE_NOTADB) {
      char found[300];
      snprintf(found, sizeof found, "%s", sqlite3_errmsg(s->db));
      return refuse_damaged(s, found, e);
    }
    return db_fail(s, e, pragma + 7);
  }
  char found[600] = "";
  size_t o = 0;
  int rc, rows = 0;
  while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
    const char *t = (const char *)sqlite3_column_text(q, 0);
    if (rows++ == 0 && t && !strcmp(t, "ok")) continue;
    if (o < sizeof found - 1)
      o += (size_t)snprintf(found + o, sizeof found - o, "%s%s", o ? "; " : "", t ? t : "?");
  }
  int code = sqlite3_errcode(s->db);
  sqlite3_finalize(q);
  for (char *c = found; *c; c++)
    if (*c == '\n' || *c == '\t') *c = ' '; /* one line in the log */
  if (rc != SQLITE_DONE) {
    if (o == 0) snprintf(found, sizeof found, "%s", sqlite3_errstr(code));
    return refuse_damaged(s, found, e);
  }
  if (o) {
    char why[700];
    snprintf(why, sizeof why, "%s says: %s", full ? "integrity_check" : "quick_check", found);
    return refuse_damaged(s, why, e);
  }
  return 0;
}

/* An entry of dir other than . and .. (the directory missing: none). */
static long dir_entries(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return 0;
  long n = 0;
  struct dirent *de;
  while ((de = readdir(d)))
    if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) n++;
  closedir(d);
  return n;
}

/* A missing or empty database beside jobs and datasets of an earlier one
 * would start an empty store and orphan them. */
static int refuse_lost_db(const char *state_dir, const char *path, gs_err *e) {
  struct stat st;
  bool missing = stat(path, &st) < 0;
  if (!missing && st.st_size > 0) return 0;
  char jobs[PATH_MAX], datasets[PATH_MAX];
  snprintf(jobs, sizeof jobs, "%s/jobs", state_dir);
  snprintf(datasets, sizeof datasets, "%s/datasets", state_dir);
  long nj = dir_entries(jobs), nd = dir_entries(datasets);
  if (!nj && !nd) return 0;
  return gs_err_set(e, GS_FAILED_PRECONDITION, "state_dir",
                    "%s is %s, but %s holds %ld job director%s and %ld dataset file%s of an "
                    "earlier store; starting would leave them orphaned. Restore gpushared.db "
                    "from a backup (see Backup in the operations guide), or, to start empty, "
                    "move jobs/ and datasets/ out of the state directory first",
                    path, missing ? "missing" : "empty (0 bytes)", state_dir, nj,
                    nj == 1 ? "y" : "ies", nd, nd == 1 ? "" : "s");
}

int gs_store_job_ids_above(gs_store *s, uint64_t id, gs_err *e) {
  char sql[200];
  snprintf(sql, sizeof sql,
           "UPDATE sqlite_sequence SET seq = %" PRIu64 " WHERE name = 'jobs' AND seq < %" PRIu64
           "; INSERT INTO sqlite_sequence(name, seq) SELECT 'jobs', %" PRIu64
           " WHERE NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'jobs')",
           id, id, id);
  return exec(s, sql, e);
}

/* Print a name for a message: printable ASCII as is, anything else as \xNN,
 * cut to a readable length, so control characters never reach a terminal. */
static const char *shown(const char *name, char *buf, size_t len) {
  size_t o = 0;
  for (const unsigned char *p = (const unsigned char *)name; *p && o + 5 < len; p++) {
    if (o > 80) {
      memcpy(buf + o, "...", 3);
      o += 3;
      break;
    }
    if (*p >= 0x20 && *p < 0x7f && *p != '"') buf[o++] = (char)*p;
    else o += (size_t)snprintf(buf + o, len - o, "\\x%02x", *p);
  }
  buf[o] = '\0';
  return buf;
}

int gs_store_name_valid(const char *name, const char *what, gs_err *e) {
  char b[128];
  size_t n = name ? strlen(name) : 0;
  if (n == 0) return gs_err_set(e, GS_INVALID_ARGUMENT, what, "%s is empty: give 1 to %d characters of A-Z a-z 0-9 . _ -", what, GS_NAME_MAX);
  if (n > GS_NAME_MAX)
    return gs_err_set(e, GS_INVALID_ARGUMENT, what,
                      "%s \"%s\" is %zu characters long; at most %d are allowed", what,
                      shown(name, b, sizeof b), n, GS_NAME_MAX);
  for (size_t i = 0; i < n; i++) {
    char c = name[i];
    bool alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    if (!alnum && (i == 0 || (c != '.' && c != '_' && c != '-')))
      return gs_err_set(e, GS_INVALID_ARGUMENT, what,
                        "%s \"%s\" has '%s' at position %zu; names are A-Z a-z 0-9 . _ - "
                        "and start with a letter or digit",
                        what, shown(name, b, sizeof b),
                        shown((char[]){c, 0}, b + 100, 28), i + 1);
  }
  return 0;
}

void gs_tenant_clear(gs_tenant *t) {
  if (!t) return;
  free(t->uids);
  free(t->gids);
  memset(t, 0, sizeof *t);
}

void gs_tenant_list_free(gs_tenant *list, size_t n) {
  for (size_t i = 0; i < n; i++) gs_tenant_clear(&list[i]);
  free(list);
}

static int i64_ok(uint64_t v) { return v <= (uint64_t)INT64_MAX; }

/* Which tenant already has this uid or gid, if any (into owner). */
static int member_owner(gs_store *s, const char *kind, uint32_t id, char *owner, gs_err *e) {
  sqlite3_stmt *q = stmt(s, Q_MEMBER_OWNER, e);
  if (!q) return gs_err_rc(e);
  sqlite3_bind_text(q, 1, kind, -1, SQLITE_STATIC);
  sqlite3_bind_int64(q, 2, id);
  int rc = sqlite3_step(q);
  owner[0] = '\0';
  if (rc == SQLITE_ROW) snprintf(owner, GS_NAME_MAX + 1, "%s", sqlite3_column_text(q, 0));
  sqlite3_reset(q);
  if (rc != SQLITE_ROW && rc != SQLITE_DONE) return db_fail(s, e, "member lookup");
  return 0;
}

static int add_members(gs_store *s, const char *tenant, const char *kind, const uint32_t *ids,
                       size_t n, gs_err *e) {
  for (size_t i = 0; i < n; i++) {
    char owner[GS_NAME_MAX + 1];
    for (size_t j = 0; j < i; j++)
      if (ids[j] == ids[i])
        return gs_err_set(e, GS_INVALID_ARGUMENT, kind, "%s %" PRIu32 " is listed twice", kind,
                          ids[i]);
    if (member_owner(s, kind, ids[i], owner, e) < 0) return gs_err_rc(e);
    if (owner[0])
      return gs_err_set(e, GS_ALREADY_EXISTS, kind,
                        "%s %" PRIu32 " already belongs to tenant %s; a %s can be a member "
                        "of one tenant only",
                        kind, ids[i], owner, kind);
    sqlite3_stmt *q = stmt(s, Q_MEMBER_INSERT, e);
    if (!q) return gs_err_rc(e);
    sqlite3_bind_text(q, 1, tenant, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 2, kind, -1, SQLITE_STATIC);
    sqlite3_bind_int64(q, 3, ids[i]);
    if (step_done(s, q, e, "insert member") != 0) return db_fail(s, e, "insert member");
  }
  return 0;
}

int gs_store_tenant_create(gs_store *s, const gs_tenant *t, gs_err *e) {
  if (gs_store_name_valid(t->name, "name", e) < 0) return gs_err_rc(e);
  if (t->n_uids + t->n_gids > GS_MEMBERS_MAX)
    return gs_err_set(e, GS_INVALID_ARGUMENT, "uids", "%zu members given; at most %d allowed",
                      t->n_uids + t->n_gids, GS_MEMBERS_MAX);
  if (!i64_ok(t->quota.memory))
    return gs_err_set(e, GS_INVALID_ARGUMENT, "quota.memory_bytes",
                      "memory quota %" PRIu64 " is past the largest allowed (%" PRId64 ")",
                      t->quota.memory, INT64_MAX);
  if (t->quota.compute > 100 * 1024)
    return gs_err_set(e, GS_INVALID_ARGUMENT, "quota.compute_share",
                      "compute quota %" PRIu32 " is not a sum of percentages", t->quota.compute);
  if (begin(s, e) < 0) return gs_err_rc(e);
  sqlite3_stmt *q = stmt(s, Q_TENANT_INSERT, e);
  if (!q) return rollback(s);
  sqlite3_bind_text(q, 1, t->name, -1, SQLITE_STATIC);
  sqlite3_bind_int64(q, 2, (int64_t)t->quota.memory);
  sqlite3_bind_int64(q, 3, t->quota.compute);
  sqlite3_bind_int64(q, 4, t->quota.max_running);
  sqlite3_bind_int64(q, 5, t->quota.max_queued);
  sqlite3_bind_int64(q, 6, (int64_t)time(NULL));
  int rc = step_done(s, q, e, "insert tenant");
  if (rc == -2) {
    rollback(s);
    return gs_err_set(e, GS_ALREADY_EXISTS, "name", "tenant %s already exists", t->name);
  }
  if (rc < 0 || add_members(s, t->name, "uid", t->uids, t->n_uids, e) < 0 ||
      add_members(s, t->name, "gid", t->gids, t->n_gids, e) < 0)
    return rollback(s);
  return commit(s, e);
}

static int usage_of(gs_store *s, int query, const char *key, gs_device_usage *u, gs_err *e) {
  sqlite3_stmt *q = stmt(s, query, e);
  if (!q) return gs_err_rc(e);
  sqlite3_bind_text(q, 1, key, -1, SQLITE_STATIC);
  if (sqlite3_step(q) != SQLITE_ROW) {
    sqlite3_reset(q);
    return db_fail(s, e, "usage");
  }
  u->memory = (uint64_t)sqlite3_column_int64(q, 0);
  u->compute = (uint32_t)sqlite3_column_int64(q, 1);
  u->vdevs = (uint32_t)sqlite3_column_int64(q, 2);
  sqlite3_reset(q);
  return 0;
}

static int push_id(uint32_t **arr, size_t *n, uint32_t id) {
  uint32_t *p = realloc(*arr, (*n + 1) * sizeof **arr);
  if (!p) return -1;
  p[(*n)++] = id;
  *arr = p;
  return 0;
}

int gs_store_tenant_get(gs_store *s, const char *name, gs_tenant *out, gs_err *e) {
  memset(out, 0, sizeof *out);
  sqlite3_stmt *q = stmt(s, Q_TENANT_GET, e);
  if (!q) return gs_err_rc(e);
  sqlite3_bind_text(q, 1, name, -1, SQLITE_TRANSIENT);
  int rc = sqlite3_step(q);
  if (rc == SQLITE_DONE) {
    sqlite3_reset(q);
    char b[128];
    return gs_err_set(e, GS_NOT_FOUND, "tenant", "no tenant named \"%s\"", shown(name, b, sizeof b));
  }
  if (rc != SQLITE_ROW) {
    sqlite3_reset(q);
    return db_fail(s, e, "get tenant");
  }
  snprintf(out->name, sizeof out->name, "%s", sqlite3_column_text(q, 0));
  out->quota.memory = (uint64_t)sqlite3_column_int64(q, 1);
  out->quota.compute = (uint32_t)sqlite3_column_int64(q, 2);
  out->quota.max_running = (uint32_t)sqlite3_column_int64(q, 3);
  out->quota.max_queued = (uint32_t)sqlite3_column_int64(q, 4);
  out->created = sqlite3_column_int64(q, 5);
  sqlite3_reset(q);

  q = stmt(s, Q_MEMBERS_OF, e);
  if (!q) goto fail;
  sqlite3_bind_text(q, 1, out->name, -1, SQLITE_STATIC);
  while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
    bool uid = strcmp((const char *)sqlite3_column_text(q, 0), "uid") == 0;
    uint32_t id = (uint32_t)sqlite3_column_int64(q, 1);
    if (uid ? push_id(&out->uids, &out->n_uids, id) : push_id(&out->gids, &out->n_gids, id)) {
      sqlite3_reset(q);
      gs_err_set(e, GS_INTERNAL, "", "store: out of memory");
      goto fail;
    }
  }
  sqlite3_reset(q);
  if (rc != SQLITE_DONE) {
    db_fail(s, e, "members");
    goto fail;
  }
  gs_device_usage u;
  if (usage_of(s, Q_TENANT_USAGE, out->name, &u, e) < 0) goto fail;
  out->memory_allocated = u.memory;
  out->compute_allocated = u.compute;
  out->vdev_count = u.vdevs;
  return 0;
fail:
  gs_tenant_clear(out);
  return gs_err_rc(e);
}

int gs_store_tenant_list(gs_store *s, gs_tenant **out, size_t *n, gs_err *e) {
  *out = NULL;
  *n = 0;
  char(*names)[GS_NAME_MAX + 1] = NULL;
  size_t count = 0;
  sqlite3_stmt *q = stmt(s, Q_TENANT_LIST, e);
  if (!q) return gs_err_rc(e);
  int rc;
  while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
    void *p = realloc(names, (count + 1) * sizeof *names);
    if (!p) {
      sqlite3_reset(q);
      free(names);
      return gs_err_set(e, GS_INTERNAL, "", "store: out of memory");
    }
    names = p;
    snprintf(names[count++], GS_NAME_MAX + 1, "%s", sqlite3_column_text(q, 0));
  }
  sqlite3_reset(q);
  if (rc != SQLITE_DONE) {
    free(names);
    return db_fail(s, e, "list tenants");
  }
  gs_tenant *list = count ? calloc(count, sizeof *list) : NULL;
  if (count && !list) {
    free(names);
    return gs_err_set(e, GS_INTERNAL, "", "store: out of memory");
  }
  for (size_t i = 0; i < count; i++) {
    if (gs_store_tenant_get(s, names[i], &list[i], e) < 0) {
      gs_tenant_list_free(list, i);
      free(names);
      return gs_err_rc(e);
    }
  }
  free(names);
  *out = list;
  *n = count;
  return 0;
}

int gs_store_tenant_delete(gs_store *s, const char *name, gs_err *e) {
  gs_tenant t;
  if (begin(s, e) < 0) return gs_err_rc(e);
  if (gs_store_tenant_get(s, name, &t, e) < 0) return rollback(s);
  uint32_t vdevs = t.vdev_count;
  gs_tenant_clear(&t);
  if (vdevs > 0) {
    rollback(s);
    return gs_err_set(e, GS_FAILED_PRECONDITION, "name",
                      "tenant %s still has %" PRIu32 " vdev%s: delete them first "
                      "(gpuctl vdev list)",
                      name, vdevs, vdevs == 1 ? "" : "s");
  }
  gs_dataset_row *ds;
  size_t nds;
  if (gs_store_dataset_list(s, name, &ds, &nds, e) < 0) return rollback(s);
  free(ds);
  if (nds > 0) {
    rollback(s);
    return gs_err_set(e, GS_FAILED_PRECONDITION, "name",
                      "tenant %s still has %zu dataset%s: remove them first (gpuctl dataset rm)",
                      name, nds, nds == 1 ? "" : "s");
  }
  /* With no vdev left, every job of the tenant has ended (vdevs with queued
   * or running jobs cannot be deleted): its history goes with it. */
  static const char *const purge[] = {
      "DELETE FROM job_events WHERE job_id IN (SELECT id FROM jobs WHERE tenant = ?1)",
      "DELETE FROM jobs WHERE tenant = ?1"};
  for (size_t i = 0; i < 2; i++) {
    sqlite3_stmt *p = NULL;
    if (sqlite3_prepare_v2(s->db, purge[i], -1, &p, NULL) != SQLITE_OK) {
      rollback(s);
      return db_fail(s, e, "purge jobs");
    }
    sqlite3_bind_text(p, 1, name, -1, SQLITE_TRANSIENT);
    int rc = sqlite3_step(p);
    sqlite3_finalize(p);
    if (rc != SQLITE_DONE) {
      rollback(s);
      return db_fail(s, e, "purge jobs");
    }
  }
  sqlite3_stmt *q = stmt(s, Q_TENANT_DELETE, e);
  if (!q) return rollback(s);
  sqlite3_bind_text(q, 1, name, -1, SQLITE_TRANSIENT);
  if (step_done(s, q, e, "delete tenant") != 0) {
    rollback(s);
    return db_fail(s, e, "delete tenant");
  }
  return commit(s, e);
}

int gs_store_quota_set(gs_store *s, const char *tenant, const gs_quota_update *u, gs_err *e) {
  gs_tenant t;
  if (begin(s, e) < 0) return gs_err_rc(e);
  if (gs_store_tenant_get(s, tenant, &t, e) < 0) return rollback(s);
  gs_quota q = t.quota;
  if (u->set_memory) q.memory = u->q.memory;
  if (u->set_compute) q.compute = u->q.compute;
  if (u->set_max_running) q.max_running = u->q.max_running;
  if (u->set_max_queued) q.max_queued = u->q.max_queued;
  uint64_t mem_used = t.memory_allocated;
  uint32_t cpu_used = t.compute_allocated;
  gs_tenant_clear(&t);
  if (!i64_ok(q.memory)) {
    rollback(s);
    return gs_err_set(e, GS_INVALID_ARGUMENT, "quota.memory_bytes",
                      "memory quota %" PRIu64 " is past the largest allowed", q.memory);
  }
  if (u->set_memory && q.memory != 0 && q.memory < mem_used) {
    rollback(s);
    return gs_err_set(e, GS_FAILED_PRECONDITION, "quota.memory_bytes",
                      "tenant %s's vdevs already hold %" PRIu64 " bytes; a memory quota of "
                      "%" PRIu64 " bytes is below that: shrink vdevs first (gpuctl vdev set "
                      "NAME --memory SIZE) or delete them",
                      tenant, mem_used, q.memory);
  }
  if (u->set_compute && q.compute != 0 && q.compute < cpu_used) {
    rollback(s);
    return gs_err_set(e, GS_FAILED_PRECONDITION, "quota.compute_share",
                      "tenant %s's vdevs already hold compute share %" PRIu32
                      "; a compute quota of %" PRIu32 " is below that",
                      tenant, cpu_used, q.compute);
  }
  sqlite3_stmt *st = stmt(s, Q_QUOTA_UPDATE, e);
  if (!st) return rollback(s);
  sqlite3_bind_text(st, 1, tenant, -1, SQLITE_TRANSIENT);
  sqlite3_bind_int64(st, 2, (int64_t)q.memory);
  sqlite3_bind_int64(st, 3, q.compute);
  sqlite3_bind_int64(st, 4, q.max_running);
  sqlite3_bind_int64(st, 5, q.max_queued);
  if (step_done(s, st, e, "update quota") != 0) {
    rollback(s);
    return db_fail(s, e, "update quota");
  }
  return commit(s, e);
}

int gs_store_device_usage(gs_store *s, const char *device, gs_device_usage *u, gs_err *e) {
  return usage_of(s, Q_DEVICE_USAGE, device, u, e);
}

/* The figures of a vdev, checked alone. */
static int vdev_values_ok(const gs_vdev *v, gs_err *e) {
  if (v->memory_limit == 0)
    return gs_err_set(e, GS_INVALID_ARGUMENT, "memory_limit",
                      "memory limit is 0; give the vdev's size, e.g. --memory 4GiB");
  if (!i64_ok(v->memory_limit))
    return gs_err_set(e, GS_INVALID_ARGUMENT, "memory_limit",
                      "memory limit %" PRIu64 " bytes is past the largest allowed",
                      v->memory_limit);
  if (v->compute_share < 1 || v->compute_share > 100)
    return gs_err_set(e, GS_INVALID_ARGUMENT, "compute_share",
                      "compute share %" PRIu32 " is outside 1..100 (percent of the device)",
                      v->compute_share);
  if (v->policy != 0 && v->policy != 1)
    return gs_err_set(e, GS_INVALID_ARGUMENT, "policy",
                      "policy %d is not PREALLOCATE (0) or GROWTH (1)", v->policy);
  return 0;
}

/* Inside a transaction: is there room for v in its tenant's quota and on
 * its device, beside the other vdevs (old: v's present row, whose figures
 * v replaces; NULL for a new vdev)? 0, or a negative errno with e set (the
 * transaction is left open). */
static int vdev_room(gs_store *s, const gs_vdev *v, const gs_vdev *old,
                     const gs_device_limits *dev, gs_err *e) {
  gs_tenant t;
  if (gs_store_tenant_get(s, v->tenant, &t, e) < 0) return gs_err_rc(e);
  gs_quota tq = t.quota;
  uint64_t t_mem = t.memory_allocated - (old ? old->memory_limit : 0);
  uint32_t t_cpu = t.compute_allocated - (old ? old->compute_share : 0);
  gs_tenant_clear(&t);

  gs_device_usage du;
  if (gs_store_device_usage(s, v->device, &du, e) < 0) return gs_err_rc(e);
  if (old) {
    du.memory -= old->memory_limit;
    du.compute -= old->compute_share;
    du.vdevs--;
  }
  if (tq.memory != 0 && (v->memory_limit > tq.memory || t_mem > tq.memory - v->memory_limit)) {
    return gs_err_set(e, GS_RESOURCE_EXHAUSTED, "memory_limit",
                      "tenant %s's memory quota is %" PRIu64 " bytes and its vdevs hold %" PRIu64
                      "; vdev %s asks for %" PRIu64 " more (at most %" PRIu64 " is left)",
                      v->tenant, tq.memory, t_mem, v->name, v->memory_limit,
                      t_mem < tq.memory ? tq.memory - t_mem : 0);
  }
  if (tq.compute != 0 && t_cpu + v->compute_share > tq.compute) {
    return gs_err_set(e, GS_RESOURCE_EXHAUSTED, "compute_share",
                      "tenant %s's compute quota is %" PRIu32 " and its vdevs hold %" PRIu32
                      "; vdev %s asks for %" PRIu32 " more",
                      v->tenant, tq.compute, t_cpu, v->name, v->compute_share);
  }
  bool over_device = v->memory_limit > dev->usable || du.memory > dev->usable - v->memory_limit;
  if (over_device && !(dev->oversubscribed && v->policy == 1)) {
    uint64_t left = du.memory < dev->usable ? dev->usable - du.memory : 0;
    return gs_err_set(e, GS_RESOURCE_EXHAUSTED, "memory_limit",
                      "device %s has %" PRIu64 " usable bytes, %" PRIu64
                      " already given to %" PRIu32 " vdev%s; %" PRIu64
                      " bytes are left, and vdev %s asks for %" PRIu64,
                      v->device, dev->usable, du.memory, du.vdevs, du.vdevs == 1 ? "" : "s",
                      left, v->name, v->memory_limit);
  }
  if (du.compute + v->compute_share > 100) {
    return gs_err_set(e, GS_RESOURCE_EXHAUSTED, "compute_share",
                      "device %s already gives compute share %" PRIu32
                      " to its%s vdevs; %" PRIu32 " more would pass 100 (at most %" PRIu32
                      " is left)",
                      v->device, du.compute, old ? " other" : "", v->compute_share,
                      100 - du.compute);
  }
  return 0;
}

int gs_store_vdev_create(gs_store *s, const gs_vdev *v, const gs_device_limits *dev,
                         gs_err *e) {
  if (gs_store_name_valid(v->name, "name", e) < 0) return gs_err_rc(e);
  if (vdev_values_ok(v, e) < 0) return gs_err_rc(e);
  if (begin(s, e) < 0) return gs_err_rc(e);
  if (vdev_room(s, v, NULL, dev, e) < 0) return rollback(s);
  sqlite3_stmt *q = stmt(s, Q_VDEV_INSERT, e);
  if (!q) return rollback(s);
  sqlite3_bind_text(q, 1, v->name, -1, SQLITE_STATIC);
  sqlite3_bind_text(q, 2, v->device, -1, SQLITE_STATIC);
  sqlite3_bind_text(q, 3, v->tenant, -1, SQLITE_STATIC);
  sqlite3_bind_int64(q, 4, (int64_t)v->memory_limit);
  sqlite3_bind_int64(q, 5, v->compute_share);
  sqlite3_bind_int64(q, 6, v->policy);
  sqlite3_bind_int64(q, 7, (int64_t)time(NULL));
  int rc = step_done(s, q, e, "insert vdev");
  if (rc == -2) {
    rollback(s);
    return gs_err_set(e, GS_ALREADY_EXISTS, "name", "vdev %s already exists", v->name);
  }
  if (rc < 0) return rollback(s);
  return commit(s, e);
}

static void vdev_row(sqlite3_stmt *q, gs_vdev *v) {
  memset(v, 0, sizeof *v);
  snprintf(v->name, sizeof v->name, "%s", sqlite3_column_text(q, 0));
  snprintf(v->device, sizeof v->device, "%s", sqlite3_column_text(q, 1));
  snprintf(v->tenant, sizeof v->tenant, "%s", sqlite3_column_text(q, 2));
  v->memory_limit = (uint64_t)sqlite3_column_int64(q, 3);
  v->compute_share = (uint32_t)sqlite3_column_int64(q, 4);
  v->policy = sqlite3_column_int(q, 5);
  v->created = sqlite3_column_int64(q, 6);
}

int gs_store_vdev_get(gs_store *s, const char *name, gs_vdev *out, gs_err *e) {
  sqlite3_stmt *q = stmt(s, Q_VDEV_GET, e);
  if (!q) return gs_err_rc(e);
  sqlite3_bind_text(q, 1, name, -1, SQLITE_TRANSIENT);
  int rc = sqlite3_step(q);
  if (rc == SQLITE_ROW) vdev_row(q, out);
  sqlite3_reset(q);
  if (rc == SQLITE_DONE) {
    char b[128];
    return gs_err_set(e, GS_NOT_FOUND, "name", "no vdev named \"%s\"", shown(name, b, sizeof b));
  }
  return rc == SQLITE_ROW ? 0 : db_fail(s, e, "get vdev");
}

int gs_store_vdev_list(gs_store *s, gs_vdev **out, size_t *n, gs_err *e) {
  *out = NULL;
  *n = 0;
  sqlite3_stmt *q = stmt(s, Q_VDEV_LIST, e);
  if (!q) return gs_err_rc(e);
  gs_vdev *list = NULL;
  size_t count = 0;
  int rc;
  while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
    gs_vdev *p = realloc(list, (count + 1) * sizeof *list);
    if (!p) {
      sqlite3_reset(q);
      free(list);
      return gs_err_set(e, GS_INTERNAL, "", "store: out of memory");
    }
    list = p;
    vdev_row(q, &list[count++]);
  }
  sqlite3_reset(q);
  if (rc != SQLITE_DONE) {
    free(list);
    return db_fail(s, e, "list vdevs");
  }
  *out = list;
  *n = count;
  return 0;
}

int gs_store_vdev_update(gs_store *s, const gs_vdev *v, const gs_device_limits *dev,
                         gs_err *e) {
  if (vdev_values_ok(v, e) < 0) return gs_err_rc(e);
  if (begin(s, e) < 0) return gs_err_rc(e);
  gs_vdev old;
  if (gs_store_vdev_get(s, v->name, &old, e) < 0) return rollback(s);
  gs_vdev nv = old;
  nv.memory_limit = v->memory_limit;
  nv.compute_share = v->compute_share;
  nv.policy = v->policy;
  if (vdev_room(s, &nv, &old, dev, e) < 0) return rollback(s);
  sqlite3_stmt *q = stmt(s, Q_VDEV_UPDATE, e);
  if (!q) return rollback(s);
  sqlite3_bind_text(q, 1, v->name, -1, SQLITE_STATIC);
  sqlite3_bind_int64(q, 2, (int64_t)nv.memory_limit);
  sqlite3_bind_int64(q, 3, nv.compute_share);
  sqlite3_bind_int64(q, 4, nv.policy);
  if (step_done(s, q, e, "update vdev") < 0) return rollback(s);
  return commit(s, e);
}

int gs_store_vdev_delete(gs_store *s, const char *name, gs_err *e) {
  gs_vdev v;
  if (begin(s, e) < 0) return gs_err_rc(e);
  if (gs_store_vdev_get(s, name, &v, e) < 0) return rollback(s);
  uint32_t active;
  if (gs_store_vdev_active_jobs(s, name, &active, e) < 0) return rollback(s);
  if (active) {
    rollback(s);
    return gs_err_set(e, GS_FAILED_PRECONDITION, "name",
                      "vdev %s has %" PRIu32 " queued or running job%s: cancel them first "
                      "(gpuctl list --all)",
                      name, active, active == 1 ? "" : "s");
  }
  sqlite3_stmt *q = stmt(s, Q_VDEV_DELETE, e);
  if (!q) return rollback(s);
  sqlite3_bind_text(q, 1, name, -1, SQLITE_TRANSIENT);
  if (step_done(s, q, e, "delete vdev") != 0) {
    rollback(s);
    return db_fail(s, e, "delete vdev");
  }
  return commit(s, e);
}

int gs_store_tenants_of(gs_store *s, uint32_t uid, const uint32_t *gids, size_t n_gids,
                        char (*names)[GS_NAME_MAX + 1], bool *by_uid, size_t max, size_t *n,
                        gs_err *e) {
  *n = 0;
  sqlite3_stmt *q = stmt(s, Q_TENANTS_OF_UID, e);
  if (!q) return gs_err_rc(e);
  sqlite3_bind_int64(q, 1, uid);
  if (sqlite3_step(q) == SQLITE_ROW && *n < max) {
    snprintf(names[*n], GS_NAME_MAX + 1, "%s", sqlite3_column_text(q, 0));
    by_uid[(*n)++] = true;
  }
  sqlite3_reset(q);
  for (size_t i = 0; i < n_gids; i++) {
    q = stmt(s, Q_TENANTS_OF_GID, e);
    if (!q) return gs_err_rc(e);
    sqlite3_bind_int64(q, 1, gids[i]);
    if (sqlite3_step(q) == SQLITE_ROW) {
      const char *t = (const char *)sqlite3_column_text(q, 0);
      bool seen = false;
      for (size_t j = 0; j < *n; j++) seen |= strcmp(names[j], t) == 0;
      if (!seen && *n < max) {
        snprintf(names[*n], GS_NAME_MAX + 1, "%s", t);
        by_uid[(*n)++] = false;
      }
    }
    sqlite3_reset(q);
  }
  return 0;
}

/* ------------------------------------------------------------ datasets --- */

static void dataset_row(sqlite3_stmt *q, gs_dataset_row *d) {
  memset(d, 0, sizeof *d);
  snprintf(d->tenant, sizeof d->tenant, "%s", sqlite3_column_text(q, 0));
  snprintf(d->name, sizeof d->name, "%s", sqlite3_column_text(q, 1));
  snprintf(d->sha256, sizeof d->sha256, "%s", sqlite3_column_text(q, 2));
  d->bytes = (uint64_t)sqlite3_column_int64(q, 3);
  d->created = sqlite3_column_int64(q, 4);
}

/* Run q (already bound) expecting at most one row into *d; NOT_FOUND via
 * the caller's message when none. Returns 1 found, 0 none, -1 error. */
static int one_dataset(gs_store *s, sqlite3_stmt *q, gs_dataset_row *d, gs_err *e) {
  int rc = sqlite3_step(q);
  if (rc == SQLITE_ROW) dataset_row(q, d);
  sqlite3_reset(q);
  if (rc == SQLITE_ROW) return 1;
  if (rc == SQLITE_DONE) return 0;
  return db_fail(s, e, "dataset lookup");
}

int gs_store_dataset_get(gs_store *s, const char *tenant, const char *name, gs_dataset_row *out,
                         gs_err *e) {
  sqlite3_stmt *q = stmt(s, Q_DATASET_GET, e);
  if (!q) return gs_err_rc(e);
  sqlite3_bind_text(q, 1, tenant, -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(q, 2, name, -1, SQLITE_TRANSIENT);
  int rc = one_dataset(s, q, out, e);
  if (rc < 0) return gs_err_rc(e);
  if (rc == 0) {
    char b[128];
    return gs_err_set(e, GS_NOT_FOUND, "name", "tenant %s has no dataset named \"%s\"", tenant,
                      shown(name, b, sizeof b));
  }
  return 0;
}

int gs_store_dataset_by_sha(gs_store *s, const char *tenant, const char *sha256,
                            gs_dataset_row *out, gs_err *e) {
  sqlite3_stmt *q = stmt(s, Q_DATASET_BY_SHA, e);
  if (!q) return gs_err_rc(e);
  sqlite3_bind_text(q, 1, tenant, -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(q, 2, sha256, -1, SQLITE_TRANSIENT);
  int rc = one_dataset(s, q, out, e);
  if (rc < 0) return gs_err_rc(e);
  if (rc == 0)
    return gs_err_set(e, GS_NOT_FOUND, "", "tenant %s has no dataset with content sha256:%.64s",
                      tenant, sha256);
  return 0;
}

int gs_store_dataset_add(gs_store *s, const gs_dataset_row *d, gs_err *e) {
  if (gs_store_name_valid(d->name, "name", e) < 0) return gs_err_rc(e);
  if (begin(s, e) < 0) return gs_err_rc(e);
  gs_dataset_row old;
  sqlite3_stmt *q = stmt(s, Q_DATASET_GET, e);
  if (!q) return rollback(s);
  sqlite3_bind_text(q, 1, d->tenant, -1, SQLITE_STATIC);
  sqlite3_bind_text(q, 2, d->name, -1, SQLITE_STATIC);
  int found = one_dataset(s, q, &old, e);
  if (found < 0) return rollback(s);
  if (found) {
    rollback(s);
    if (strcmp(old.sha256, d->sha256) == 0) return 0;
    return gs_err_set(e, GS_ALREADY_EXISTS, "name",
                      "tenant %s already has a dataset %s with other content (sha256:%.12s...); "
                      "remove it first or choose another name",
                      d->tenant, d->name, old.sha256);
  }
  q = stmt(s, Q_DATASET_INSERT, e);
  if (!q) return rollback(s);
  sqlite3_bind_text(q, 1, d->tenant, -1, SQLITE_STATIC);
  sqlite3_bind_text(q, 2, d->name, -1, SQLITE_STATIC);
  sqlite3_bind_text(q, 3, d->sha256, -1, SQLITE_STATIC);
  sqlite3_bind_int64(q, 4, (int64_t)d->bytes);
  sqlite3_bind_int64(q, 5, d->created ? d->created : (int64_t)time(NULL));
  if (step_done(s, q, e, "insert dataset") != 0) {
    rollback(s);
    return db_fail(s, e, "insert dataset");
  }
  return commit(s, e);
}

int gs_store_dataset_list(gs_store *s, const char *tenant, gs_dataset_row **out, size_t *n,
                          gs_err *e) {
  *out = NULL;
  *n = 0;
  sqlite3_stmt *q = stmt(s, tenant ? Q_DATASET_LIST : Q_DATASET_LIST_ALL, e);
  if (!q) return gs_err_rc(e);
  if (tenant) sqlite3_bind_text(q, 1, tenant, -1, SQLITE_TRANSIENT);
  gs_dataset_row *list = NULL;
  size_t count = 0;
  int rc;
  while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
    gs_dataset_row *p = realloc(list, (count + 1) * sizeof *list);
    if (!p) {
      sqlite3_reset(q);
      free(list);
      return gs_err_set(e, GS_INTERNAL, "", "store: out of memory");
    }
    list = p;
    dataset_row(q, &list[count++]);
  }
  sqlite3_reset(q);
  if (rc != SQLITE_DONE) {
    free(list);
    return db_fail(s, e, "list datasets");
  }
  *out = list;
  *n = count;
  return 0;
}

int gs_store_dataset_remove(gs_store *s, const char *tenant, const char *name,
                            gs_dataset_row *removed, uint64_t *refs_left, gs_err *e) {
  if (begin(s, e) < 0) return gs_err_rc(e);
  if (gs_store_dataset_get(s, tenant, name, removed, e) < 0) return rollback(s);
  sqlite3_stmt *q = stmt(s, Q_DATASET_DELETE, e);
  if (!q) return rollback(s);
  sqlite3_bind_text(q, 1, tenant, -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(q, 2, name, -1, SQLITE_TRANSIENT);
  if (step_done(s, q, e, "delete dataset") != 0) {
    rollback(s);
    return db_fail(s, e, "delete dataset");
  }
  q = stmt(s, Q_BLOB_REFS, e);
  if (!q) return rollback(s);
  sqlite3_bind_text(q, 1, removed->sha256, -1, SQLITE_STATIC);
  if (sqlite3_step(q) != SQLITE_ROW) {
    sqlite3_reset(q);
    rollback(s);
    return db_fail(s, e, "blob refs");
  }
  *refs_left = (uint64_t)sqlite3_column_int64(q, 0);
  sqlite3_reset(q);
  return commit(s, e);
}

/* ---------------------------------------------------------------- jobs --- */

int gs_store_job_insert(gs_store *s, const gs_job_row *j, uint64_t *id, gs_err *e) {
  sqlite3_stmt *q = stmt(s, Q_JOB_INSERT, e);
  if (!q) return gs_err_rc(e);
  sqlite3_bind_text(q, 1, j->tenant, -1, SQLITE_STATIC);
  sqlite3_bind_text(q, 2, j->vdev, -1, SQLITE_STATIC);
  sqlite3_bind_int(q, 3, j->state);
  sqlite3_bind_int(q, 4, j->priority);
  sqlite3_bind_int64(q, 5, j->submitted_ms);
  if (step_done(s, q, e, "insert job") != 0) return db_fail(s, e, "insert job");
  *id = (uint64_t)sqlite3_last_insert_rowid(s->db);
  return 0;
}

int gs_store_job_update(gs_store *s, uint64_t id, int state, uint32_t crashes,
                        const uint8_t *record, size_t len, gs_err *e) {
  sqlite3_stmt *q = stmt(s, Q_JOB_UPDATE, e);
  if (!q) return gs_err_rc(e);
  sqlite3_bind_int64(q, 1, (int64_t)id);
  sqlite3_bind_int(q, 2, state);
  sqlite3_bind_int64(q, 3, crashes);
  sqlite3_bind_blob(q, 4, record ? (const void *)record : "", (int)len, SQLITE_STATIC);
  if (step_done(s, q, e, "update job") != 0) return db_fail(s, e, "update job");
  if (sqlite3_changes(s->db) != 1)
    return gs_err_set(e, GS_NOT_FOUND, "id", "no job %" PRIu64, id);
  return 0;
}

void gs_store_job_rows_free(gs_job_row *rows, size_t n) {
  for (size_t i = 0; i < n; i++) free(rows[i].record);
  free(rows);
}

int gs_store_job_list(gs_store *s, gs_job_row **out, size_t *n, gs_err *e) {
  *out = NULL;
  *n = 0;
  sqlite3_stmt *q = stmt(s, Q_JOB_LIST, e);
  if (!q) return gs_err_rc(e);
  gs_job_row *list = NULL;
  size_t count = 0;
  int rc;
  while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
    gs_job_row *p = realloc(list, (count + 1) * sizeof *list);
    if (!p) goto oom;
    list = p;
    gs_job_row *j = &list[count];
    memset(j, 0, sizeof *j);
    j->id = (uint64_t)sqlite3_column_int64(q, 0);
    snprintf(j->tenant, sizeof j->tenant, "%s", sqlite3_column_text(q, 1));
    snprintf(j->vdev, sizeof j->vdev, "%s", sqlite3_column_text(q, 2));
    j->state = sqlite3_column_int(q, 3);
    j->priority = sqlite3_column_int(q, 4);
    j->submitted_ms = sqlite3_column_int64(q, 5);
    j->crashes = (uint32_t)sqlite3_column_int64(q, 6);
    j->record_len = (size_t)sqlite3_column_bytes(q, 7);
    j->record = malloc(j->record_len + 1);
    if (!j->record) goto oom;
    if (j->record_len) memcpy(j->record, sqlite3_column_blob(q, 7), j->record_len);
    count++;
  }
  sqlite3_reset(q);
  if (rc != SQLITE_DONE) {
    gs_store_job_rows_free(list, count);
    return db_fail(s, e, "list jobs");
  }
  *out = list;
  *n = count;
  return 0;
oom:
  sqlite3_reset(q);
  gs_store_job_rows_free(list, count);
  return gs_err_set(e, GS_INTERNAL, "", "store: out of memory");
}

int gs_store_job_event_add(gs_store *s, uint64_t id, const uint8_t *record, size_t len,
                           gs_err *e) {
  sqlite3_stmt *q = stmt(s, Q_EVENT_INSERT, e);
  if (!q) return gs_err_rc(e);
  sqlite3_bind_int64(q, 1, (int64_t)id);
  sqlite3_bind_blob(q, 2, record ? (const void *)record : "", (int)len, SQLITE_STATIC);
  if (step_done(s, q, e, "insert job event") != 0) return db_fail(s, e, "insert job event");
  return 0;
}

int gs_store_job_events(gs_store *s, uint64_t id,
                        void (*fn)(void *u, const uint8_t *rec, size_t len), void *u,
                        gs_err *e) {
  sqlite3_stmt *q = stmt(s, Q_EVENT_LIST, e);
  if (!q) return gs_err_rc(e);
  sqlite3_bind_int64(q, 1, (int64_t)id);
  int rc;
  while ((rc = sqlite3_step(q)) == SQLITE_ROW)
    fn(u, sqlite3_column_blob(q, 0), (size_t)sqlite3_column_bytes(q, 0));
  sqlite3_reset(q);
  return rc == SQLITE_DONE ? 0 : db_fail(s, e, "list job events");
}

int gs_store_vdev_active_jobs(gs_store *s, const char *vdev, uint32_t *n, gs_err *e) {
  sqlite3_stmt *q = stmt(s, Q_VDEV_JOBS, e);
  if (!q) return gs_err_rc(e);
  sqlite3_bind_text(q, 1, vdev, -1, SQLITE_TRANSIENT);
  int rc = sqlite3_step(q);
  *n = rc == SQLITE_ROW ? (uint32_t)sqlite3_column_int64(q, 0) : 0;
  sqlite3_reset(q);
  return rc == SQLITE_ROW ? 0 : db_fail(s, e, "vdev jobs");
}

/* --------------------------------------------------------------- usage --- */

int gs_store_usage_add(gs_store *s, const gs_usage_row *rows, size_t n, gs_err *e) {
  if (n == 0) return 0;
  if (begin(s, e) < 0) return gs_err_rc(e);
  for (size_t i = 0; i < n; i++) {
    const gs_usage_row *r = &rows[i];
    if (!i64_ok(r->job_id) || !i64_ok(r->sum.steps) || !i64_ok(r->sum.samples)) {
      gs_err_set(e, GS_INTERNAL, "", "store: usage of job %" PRIu64 " out of range", r->job_id);
      return rollback(s);
    }
    sqlite3_stmt *q = stmt(s, Q_USAGE_ADD, e);
    if (!q) return rollback(s);
    sqlite3_bind_int64(q, 1, (int64_t)r->job_id);
    sqlite3_bind_text(q, 2, r->tenant, -1, SQLITE_STATIC);
    sqlite3_bind_text(q, 3, r->vdev, -1, SQLITE_STATIC);
    sqlite3_bind_int64(q, 4, r->day);
    sqlite3_bind_double(q, 5, r->sum.device_seconds);
    sqlite3_bind_double(q, 6, r->sum.reserved_gib_s);
    sqlite3_bind_double(q, 7, r->sum.in_use_gib_s);
    sqlite3_bind_int64(q, 8, (int64_t)r->sum.steps);
    sqlite3_bind_int64(q, 9, (int64_t)r->sum.samples);
    sqlite3_bind_int64(q, 10, r->sum.preemptions);
    if (step_done(s, q, e, "add usage") != 0) {
      db_fail(s, e, "add usage");
      return rollback(s);
    }
  }
  return commit(s, e);
}

int gs_store_usage_list(gs_store *s, const char *tenant, int64_t since_day, gs_usage_row **out,
                        size_t *n, gs_err *e) {
  *out = NULL;
  *n = 0;
  sqlite3_stmt *q = stmt(s, Q_USAGE_LIST, e);
  if (!q) return gs_err_rc(e);
  sqlite3_bind_int64(q, 1, since_day);
  if (tenant) sqlite3_bind_text(q, 2, tenant, -1, SQLITE_TRANSIENT);
  gs_usage_row *list = NULL;
  size_t count = 0, cap = 0;
  int rc;
  while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
    if (count == cap) {
      size_t c2 = cap ? 2 * cap : 16;
      gs_usage_row *p = realloc(list, c2 * sizeof *list);
      if (!p) {
        sqlite3_reset(q);
        free(list);
        return gs_err_set(e, GS_INTERNAL, "", "store: out of memory");
      }
      list = p;
      cap = c2;
    }
    gs_usage_row *r = &list[count++];
    memset(r, 0, sizeof *r);
    r->job_id = (uint64_t)sqlite3_column_int64(q, 0);
    snprintf(r->tenant, sizeof r->tenant, "%s", sqlite3_column_text(q, 1));
    snprintf(r->vdev, sizeof r->vdev, "%s", sqlite3_column_text(q, 2));
    r->day = sqlite3_column_int64(q, 3);
    r->sum.device_seconds = sqlite3_column_double(q, 4);
    r->sum.reserved_gib_s = sqlite3_column_double(q, 5);
    r->sum.in_use_gib_s = sqlite3_column_double(q, 6);
    r->sum.steps = (uint64_t)sqlite3_column_int64(q, 7);
    r->sum.samples = (uint64_t)sqlite3_column_int64(q, 8);
    r->sum.preemptions = (uint32_t)sqlite3_column_int64(q, 9);
  }
  sqlite3_reset(q);
  if (rc != SQLITE_DONE) {
    free(list);
    return db_fail(s, e, "list usage");
  }
  *out = list;
  *n = count;
  return 0;
}
