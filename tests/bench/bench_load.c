/*
 * bench_load.c: many concurrent clients against one gpushared, through
 * libgpushare (gs_client.h), for a fixed time; the load part of
 * tests/bench/bench_daemon.sh.
 *
 * Each client is one thread with its own connection, which it keeps for the
 * whole run and uses for one call at a time, as gpuctl does. Clients are
 * split round-robin over roles given with --as UID:GID[+GROUP...]:JOB:CALLS:
 * for each role a child process takes that uid, primary gid and
 * supplementary groups (so the daemon sees the peer credentials of that
 * user: uid 0 or a member of admin_group is an admin, a tenant's uid is that
 * tenant) and runs its clients; CALLS are the calls each of them cycles
 * through, starting at a different one per client:
 *   s  JobStatus of job JOB      l  ListJobs      m  Metrics (admin only)
 *   v  ListVdevs                 d  ListDevices   V  Version
 * All clients connect first; they start together at one instant and stop
 * at another (CLOCK_MONOTONIC is system-wide, so the roles' processes share
 * it), and only the calls in between count. A call is an error when the
 * connection fails or the daemon answers anything but OK; the first error
 * of each role is printed. Latency is from sending the request to having
 * the whole response, per call.
 *
 * Prints a table (totals, requests/s, p50/p90/p99/max latency, per call)
 * and a last line of JSON for scripts. Times are printed, never asserted.
 * Exit status: 0 ran (errors or not: they are in the figures), 1 the run
 * could not be made (no connection, a role's process died), 2 usage.
 *
 *   bench_load --socket PATH [--seconds S] [--clients N] --as UID:GID:JOB:CALLS ...
 */
#include <errno.h>
#include <grp.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "client/client.h"
#include "common/error.h"
#include "proto/gpushare.pb-c.h"

#define MAX_ROLES 16
#define MAX_CLIENTS 4096
#define KINDS "slmvdV"
#define N_KINDS 6
static const char *kind_name[N_KINDS] = {"status", "list", "metrics", "vdevs", "devices",
                                         "version"};

typedef struct {
  unsigned uid, gid;
  gid_t groups[8]; /* supplementary */
  int ngroups;
  uint64_t job;
  char calls[16];
  int clients;
} role;

/* What one client measured; latencies in microseconds. */
typedef struct {
  const role *r;
  const char *socket;
  int index; /* within its role: where it starts in CALLS */
  struct timespec start, stop;
  uint64_t ok, err;
  uint32_t *lat;
  uint8_t *kind;
  size_t n, cap;
  char first_err[1024];
  int connect_rc;
  pthread_barrier_t *ready;
} client;

static double ts_s(const struct timespec *t) { return (double)t->tv_sec + (double)t->tv_nsec * 1e-9; }

static int kind_of(char c) {
  const char *p = strchr(KINDS, c);
  return p && c ? (int)(p - KINDS) : -1;
}

static int one_call(gs_client *c, int k, uint64_t job, gs_err *e) {
  Gpushare__V1__Request rq = GPUSHARE__V1__REQUEST__INIT;
  Gpushare__V1__JobStatusRequest st = GPUSHARE__V1__JOB_STATUS_REQUEST__INIT;
  Gpushare__V1__ListJobsRequest lj = GPUSHARE__V1__LIST_JOBS_REQUEST__INIT;
  Gpushare__V1__MetricsRequest me = GPUSHARE__V1__METRICS_REQUEST__INIT;
  Gpushare__V1__ListVdevsRequest lv = GPUSHARE__V1__LIST_VDEVS_REQUEST__INIT;
  Gpushare__V1__ListDevicesRequest ld = GPUSHARE__V1__LIST_DEVICES_REQUEST__INIT;
  Gpushare__V1__VersionRequest ve = GPUSHARE__V1__VERSION_REQUEST__INIT;
  switch (k) {
  case 0:
    st.has_id = 1;
    st.id = job;
    rq.call_case = GPUSHARE__V1__REQUEST__CALL_JOB_STATUS;
    rq.job_status = &st;
    break;
  case 1:
    rq.call_case = GPUSHARE__V1__REQUEST__CALL_LIST_JOBS;
    rq.list_jobs = &lj;
    break;
  case 2:
    rq.call_case = GPUSHARE__V1__REQUEST__CALL_METRICS;
    rq.metrics = &me;
    break;
  case 3:
    rq.call_case = GPUSHARE__V1__REQUEST__CALL_LIST_VDEVS;
    rq.list_vdevs = &lv;
    break;
  case 4:
    rq.call_case = GPUSHARE__V1__REQUEST__CALL_LIST_DEVICES;
    rq.list_devices = &ld;
    break;
  default:
    rq.call_case = GPUSHARE__V1__REQUEST__CALL_VERSION;
    rq.version = &ve;
    break;
  }
  Gpushare__V1__Response *resp = NULL;
  int rc = gs_client_call(c, &rq, &resp, e);
  if (resp) gs_client_free_response(resp);
  return rc;
}

static int push(client *cl, uint32_t us, uint8_t k) {
  if (cl->n == cl->cap) {
    size_t cap = cl->cap ? cl->cap * 2 : 4096;
    uint32_t *l = realloc(cl->lat, cap * sizeof *l);
    if (!l) return -1;
    cl->lat = l;
    uint8_t *kk = realloc(cl->kind, cap);
    if (!kk) return -1;
    cl->kind = kk;
    cl->cap = cap;
  }
  cl->lat[cl->n] = us;
  cl->kind[cl->n++] = k;
  return 0;
}

static void *client_main(void *arg) {
  client *cl = arg;
  gs_client *c = NULL;
  gs_err e;
  gs_err_clear(&e);
  cl->connect_rc = gs_client_connect(cl->socket, &c, &e);
  if (cl->connect_rc) snprintf(cl->first_err, sizeof cl->first_err, "%s", e.msg);
  pthread_barrier_wait(cl->ready);
  if (cl->connect_rc) return NULL;
  clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &cl->start, NULL);
  size_t ncalls = strlen(cl->r->calls);
  double stop = ts_s(&cl->stop);
  for (size_t i = (size_t)cl->index;; i++) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (ts_s(&t0) >= stop) break;
    int k = kind_of(cl->r->calls[i % ncalls]);
    gs_err_clear(&e);
    int rc = c ? one_call(c, k, cl->r->job, &e) : -ENOTCONN;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (rc) {
      if (cl->err++ == 0)
        snprintf(cl->first_err, sizeof cl->first_err, "%s: %s: %s", kind_name[k],
                 gs_code_name(e.code), e.msg);
      if (rc != GS_CLIENT_REFUSED) { /* the connection is gone: make another */
        gs_client_close(c);
        c = NULL;
        gs_err_clear(&e);
        if (gs_client_connect(cl->socket, &c, &e)) c = NULL;
      }
      continue;
    }
    cl->ok++;
    double us = (ts_s(&t1) - ts_s(&t0)) * 1e6;
    if (push(cl, us > 4e9 ? 4000000000u : (uint32_t)us, (uint8_t)k)) {
      snprintf(cl->first_err, sizeof cl->first_err, "out of memory for latencies");
      break;
    }
  }
  if (c) gs_client_close(c);
  return NULL;
}

static int write_all(int fd, const void *buf, size_t len) {
  const char *p = buf;
  while (len) {
    ssize_t w = write(fd, p, len);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    p += w;
    len -= (size_t)w;
  }
  return 0;
}

static int read_all(int fd, void *buf, size_t len) {
  char *p = buf;
  while (len) {
    ssize_t r = read(fd, p, len);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    p += r;
    len -= (size_t)r;
  }
  return 0;
}

/* What a role's process sends its parent. */
typedef struct {
  uint64_t ok, err, n;
  int32_t connect_failures;
  char first_err[1024];
} report;

/* Run one role's clients in this (child) process; write the report. */
static int run_role(const role *r, const char *socket, struct timespec start,
                    struct timespec stop, int fd) {
  if (getuid() != r->uid || getgid() != r->gid || r->ngroups) {
    if (setgroups((size_t)r->ngroups, r->groups) || setgid(r->gid) || setuid(r->uid)) {
      fprintf(stderr, "bench_load: cannot become uid %u gid %u: %s (run as root)\n", r->uid,
              r->gid, strerror(errno));
      return 1;
    }
  }
  client *cl = calloc((size_t)r->clients, sizeof *cl);
  pthread_t *th = calloc((size_t)r->clients, sizeof *th);
  pthread_barrier_t ready;
  if (!cl || !th || pthread_barrier_init(&ready, NULL, (unsigned)r->clients)) return 1;
  for (int i = 0; i < r->clients; i++) {
    cl[i] = (client){.r = r, .socket = socket, .index = i, .start = start, .stop = stop,
                     .ready = &ready};
    if (pthread_create(&th[i], NULL, client_main, &cl[i])) {
      fprintf(stderr, "bench_load: cannot start client thread %d\n", i);
      _exit(1); /* the others would wait at the barrier forever */
    }
  }
  report rep = {0};
  for (int i = 0; i < r->clients; i++) {
    pthread_join(th[i], NULL);
    rep.ok += cl[i].ok;
    rep.err += cl[i].err;
    rep.n += cl[i].n;
    if (cl[i].connect_rc) rep.connect_failures++;
    if (!rep.first_err[0] && cl[i].first_err[0])
      snprintf(rep.first_err, sizeof rep.first_err, "%s", cl[i].first_err);
  }
  /* The report, then every latency, then every call kind, in client order. */
  if (write_all(fd, &rep, sizeof rep)) return 1;
  for (int i = 0; i < r->clients; i++)
    if (cl[i].n && write_all(fd, cl[i].lat, cl[i].n * sizeof *cl[i].lat)) return 1;
  for (int i = 0; i < r->clients; i++)
    if (cl[i].n && write_all(fd, cl[i].kind, cl[i].n)) return 1;
  return 0;
}

static int cmp_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of sorted v[0..n). */
static double pct(const uint32_t *v, size_t n, double p) {
  if (!n) return 0;
  size_t i = (size_t)(p / 100.0 * (double)n + 0.999999);
  if (i < 1) i = 1;
  if (i > n) i = n;
  return v[i - 1] / 1000.0;
}

static int usage(const char *why) {
  if (why) fprintf(stderr, "bench_load: %s\n", why);
  fprintf(stderr,
          "usage: bench_load --socket PATH [--seconds S] [--clients N] --as UID:GID:JOB:CALLS ...\n"
          "  --seconds S   how long the clients call (default 10, 1..3600)\n"
          "  --clients N   connections in all, split round-robin over the roles (default 64, "
          "1..%d)\n"
          "  --as R        a role, UID:GID[+GROUP...]:JOB:CALLS: its clients connect as uid\n"
          "                UID, gid GID (and supplementary groups GROUP) and cycle through\n"
          "                CALLS: s JobStatus of job JOB, l ListJobs, m Metrics, v ListVdevs,\n"
          "                d ListDevices, V Version (e.g. 0:0:1:slm, 4001:65534+100:2:sl)\n",
          MAX_CLIENTS);
  return 2;
}

int main(int argc, char **argv) {
  const char *socket = NULL;
  long seconds = 10, nclients = 64;
  role roles[MAX_ROLES];
  int nroles = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(NULL);
      return 0;
    }
    if (i + 1 >= argc) return usage("an option is missing its value");
    const char *v = argv[++i];
    char *end;
    if (!strcmp(a, "--socket")) {
      socket = v;
    } else if (!strcmp(a, "--seconds")) {
      seconds = strtol(v, &end, 10);
      if (*end || seconds < 1 || seconds > 3600) return usage("--seconds: want 1..3600");
    } else if (!strcmp(a, "--clients")) {
      nclients = strtol(v, &end, 10);
      if (*end || nclients < 1 || nclients > MAX_CLIENTS) return usage("--clients: out of range");
    } else if (!strcmp(a, "--as")) {
      if (nroles == MAX_ROLES) return usage("too many --as roles (at most 16)");
      role *r = &roles[nroles];
      memset(r, 0, sizeof *r);
      unsigned long long job;
      int used = 0, more = 0;
      bool bad = sscanf(v, "%u:%u%n", &r->uid, &r->gid, &used) != 2;
      while (!bad && v[used] == '+') {
        unsigned g;
        if (r->ngroups == 8 || sscanf(v + used, "+%u%n", &g, &more) != 1) {
          bad = true;
          break;
        }
        r->groups[r->ngroups++] = (gid_t)g;
        used += more;
      }
      if (bad || sscanf(v + used, ":%llu:%15[" KINDS "]%n", &job, r->calls, &more) != 2 ||
          v[used + more]) {
        fprintf(stderr,
                "bench_load: --as \"%s\": want UID:GID[+GROUP...]:JOB:CALLS (at most 8 "
                "groups), CALLS of %s\n",
                v, KINDS);
        return 2;
      }
      r->job = job;
      if (strchr(r->calls, 's') && !job) {
        fprintf(stderr, "bench_load: --as \"%s\": call s (status) needs a JOB id above 0\n", v);
        return 2;
      }
      nroles++;
    } else {
      fprintf(stderr, "bench_load: unknown option \"%s\"\n", a);
      return usage(NULL);
    }
  }
  if (!socket) return usage("--socket is required");
  if (!nroles) return usage("at least one --as role is required");
  if (nclients < nroles) return usage("--clients must be at least the number of roles");
  for (long i = 0; i < nclients; i++) roles[i % nroles].clients++;

  /* Connecting takes a moment under load; everyone starts together after. */
  struct timespec start, stop;
  clock_gettime(CLOCK_MONOTONIC, &start);
  start.tv_sec += 2;
  stop = start;
  stop.tv_sec += seconds;
  signal(SIGPIPE, SIG_IGN);

  pid_t pid[MAX_ROLES];
  int fd[MAX_ROLES];
  for (int r = 0; r < nroles; r++) {
    int p[2];
    if (pipe(p)) return perror("bench_load: pipe"), 1;
    fflush(NULL);
    pid[r] = fork();
    if (pid[r] < 0) return perror("bench_load: fork"), 1;
    if (pid[r] == 0) {
      close(p[0]);
      alarm((unsigned)seconds + 60); /* a daemon that stops answering must not hang us */
      _exit(run_role(&roles[r], socket, start, stop, p[1]));
    }
    close(p[1]);
    fd[r] = p[0];
  }

  uint64_t ok = 0, err = 0, n = 0;
  long connect_failures = 0;
  uint32_t *lat = NULL;
  uint8_t *kind = NULL;
  int failed = 0;
  for (int r = 0; r < nroles; r++) {
    report rep;
    bool whole = read_all(fd[r], &rep, sizeof rep) == 0;
    if (whole) {
      uint32_t *l = realloc(lat, (size_t)(n + rep.n + 1) * sizeof *l);
      if (l) lat = l;
      uint8_t *k = realloc(kind, (size_t)(n + rep.n + 1));
      if (k) kind = k;
      if (!l || !k) return fprintf(stderr, "bench_load: out of memory\n"), 1;
      whole = !read_all(fd[r], lat + n, (size_t)rep.n * sizeof *lat) &&
              !read_all(fd[r], kind + n, (size_t)rep.n);
    }
    if (!whole) {
      fprintf(stderr, "bench_load: the clients of role %u:%u sent no whole report\n",
              roles[r].uid, roles[r].gid);
      failed = 1;
      close(fd[r]);
      continue;
    }
    close(fd[r]);
    n += rep.n;
    ok += rep.ok;
    err += rep.err;
    connect_failures += rep.connect_failures;
    if (rep.first_err[0])
      printf("role %u:%u (%d clients): first error: %s\n", roles[r].uid, roles[r].gid,
             roles[r].clients, rep.first_err);
  }
  for (int r = 0; r < nroles; r++) {
    int st = 0;
    if (waitpid(pid[r], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st)) {
      fprintf(stderr, "bench_load: the process of role %u:%u %s %d\n", roles[r].uid,
              roles[r].gid, WIFSIGNALED(st) ? "died of signal" : "exited",
              WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
      failed = 1;
    }
  }
  if (failed) return 1;
  if (connect_failures) {
    fprintf(stderr, "bench_load: %ld of %ld clients could not connect\n", connect_failures,
            nclients);
    return 1;
  }

  /* Per kind, then all together: count and latency percentiles (ms). */
  double secs = (double)seconds;
  uint32_t *tmp = malloc((size_t)(n + 1) * sizeof *tmp);
  if (!tmp) return fprintf(stderr, "bench_load: out of memory\n"), 1;
  printf("%-9s %10s %10s %9s %9s %9s %9s\n", "call", "requests", "req/s", "p50_ms", "p90_ms",
         "p99_ms", "max_ms");
  for (int k = 0; k <= N_KINDS; k++) {
    size_t m = 0;
    for (uint64_t i = 0; i < n; i++)
      if (k == N_KINDS || kind[i] == k) tmp[m++] = lat[i];
    if (!m && k < N_KINDS) continue;
    qsort(tmp, m, sizeof *tmp, cmp_u32);
    printf("%-9s %10zu %10.0f %9.2f %9.2f %9.2f %9.2f\n", k == N_KINDS ? "all" : kind_name[k], m,
           (double)m / secs, pct(tmp, m, 50), pct(tmp, m, 90), pct(tmp, m, 99),
           m ? tmp[m - 1] / 1000.0 : 0.0);
  }
  qsort(lat, n, sizeof *lat, cmp_u32);
  printf("{\"clients\":%ld,\"seconds\":%ld,\"requests\":%" PRIu64 ",\"ok\":%" PRIu64
         ",\"errors\":%" PRIu64 ",\"requests_per_second\":%.1f,\"p50_ms\":%.3f,"
         "\"p90_ms\":%.3f,\"p99_ms\":%.3f,\"max_ms\":%.3f}\n",
         nclients, seconds, ok + err, ok, err, (double)(ok + err) / secs, pct(lat, n, 50),
         pct(lat, n, 90), pct(lat, n, 99), n ? lat[n - 1] / 1000.0 : 0.0);
  free(tmp);
  free(lat);
  free(kind);
  return 0;
}
