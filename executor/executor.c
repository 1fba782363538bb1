/*
 * executor.c: gpushare-executor, the process that runs one device's jobs.
 *
 * The control plane (gpushared) never runs a kernel nor touches device
 * memory; for each physical device it starts one executor and speaks to it
 * over a socketpair, in the framing of proto/wire.h, with the messages of
 * proto/executor.proto (ToExecutor in, FromExecutor out). A fault in compute
 * can then take down an executor, never the control plane, which restarts it
 * and resumes its jobs from their checkpoints.
 *
 *   gpushare-executor --device cpu --fd 3 --state-dir DIR [--threads N]
 *
 * What lives here:
 *  - the device: one backend (cpu; a GPU needs the CUDA loader), announced
 *    with Ready{device, total_bytes} as soon as it is open;
 *  - the vdevs (SetVdevs): one allocator each (alloc.h; PREALLOCATE reserves
 *    the whole limit at once) and one fair-share slot (fairshare.h). A vdev
 *    that is no longer listed, or whose limit or policy changed, keeps its
 *    allocator until the last job in it has ended;
 *  - the jobs (StartJob): each on its own thread, which takes its datasets
 *    (one shared, read-only copy per distinct set in the executor, loaded
 *    by the first job that needs it and freed with the last), creates the job with gs_train_create on the vdev's allocator and then
 *    drives it one optimizer step at a time, each step between
 *    gs_fairshare_acquire and gs_fairshare_release, so the device is shared
 *    by compute_share and a cancel (an atomic flag) acts before the next
 *    step (each step is charged the device time the backend's timer
 *    gives: core-seconds of the job's own threads on the cpu device,
 *    stream events on a GPU; see gs_train_last_device_seconds; and the
 *    switch to it, see switch_seconds). Whatever
 *    the outcome, the job's memory goes
 *    back to its vdev before Finished is sent, and a job's failure is a
 *    Finished{FAILED}, never the executor's end.
 *    Checkpoints are written where StartJob's checkpoint_path says (every
 *    checkpoint_every_steps and at epoch ends); a job without one is only
 *    checkpointed when a Shutdown interrupts it, to DIR/job-ID.ckpt, which is
 *    also where resume looks for it;
 *  - the main thread: reads frames (poll on the socket and on a self-pipe
 *    that job threads and signals write to), dispatches them, joins the
 *    threads of ended jobs and sends Stats about once a second while jobs
 *    run, and after every change (vdevs set, job started or ended).
 * Several threads write to the socket; each whole frame is written under one
 * mutex, so frames never interleave.
 *
 * PauseJob: that job alone stops before its next step, writes its
 * checkpoint, gives its memory back and reports Finished{paused} with the
 * reason it was given; the control plane starts it again, resuming.
 *
 * Shutdown (or SIGTERM): every job stops before its next step, writes a
 * checkpoint and reports Finished{interrupted}; then the executor exits 0.
 * End of file on the socket (the control plane is gone or gave up on this
 * executor): jobs are cancelled without checkpoint, and it exits 0. The
 * executor asks the kernel for SIGKILL when its parent dies, so a control
 * plane killed with -9 does not leave it running.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/error.h"
#include "common/size.h"
#include "executor/fairshare.h"
#include "kernels/backend.h"
#include "proto/executor.pb-c.h"
#include "proto/gpushare.pb-c.h"
#include "proto/wire.h"
#include "runtime/alloc.h"
#include "runtime/data.h"
#include "runtime/model.h"
#include "runtime/oom.h"
#include "convert/spec_pb.h"
#include "runtime/train.h"
/* executor.cmake defines these where the pieces are part of the build. */
#include "kernels/loader.h" /* the CUDA plugin loader: gpuN devices */
#include "runtime/plan.h" /* planned peaks and what would fit after an OOM */

#define VDEV_NAME_MAX 64
#define PROGRESS_INTERVAL 0.25 /* seconds between two Progress of one job: ~4/s */
#define STATS_INTERVAL 1.0     /* seconds between two Stats while jobs run */
#define FAIRSHARE_GRACE 0.05   /* see fairshare.h: a job's gap between steps */
#define FAIRSHARE_SLICE 0.05   /* see fairshare.h: device time between two switches */
#define EXIT_DEVICE_LOST 69      /* exit status of device_lost (EX_UNAVAILABLE) */

enum { STOP_CANCEL = 1, STOP_INTERRUPT = 2, STOP_PAUSE = 3 };

typedef struct vdev {
  char name[VDEV_NAME_MAX];
  uint64_t limit;          /* bytes the allocator may reserve */
  gs_alloc_policy policy;
  uint32_t share;          /* compute_share, percent */
  gs_alloc *alloc;         /* NULL when PREALLOCATE could not reserve the limit */
  int alloc_rc;            /* why alloc is NULL */
  int slot;                /* fair-share slot */
  uint32_t running;        /* jobs started here and not yet ended */
  bool listed;             /* in the last SetVdevs */
  bool pending;            /* new_limit/new_policy wait for running == 0 */
  uint64_t new_limit;
  gs_alloc_policy new_policy;
  struct vdev *next;
} vdev;

typedef struct job {
  uint64_t id;
  vdev *v;                 /* held (v->running) until the job ends */
  Gpushare__Exec__V1__ToExecutor *msg; /* the StartJob frame, owned */
  const Gpushare__Exec__V1__StartJob *start; /* inside msg */
  char ckpt[PATH_MAX];     /* checkpoint path (StartJob's, or under the state dir) */
  bool ckpt_named;         /* StartJob named it: checkpoints as the job goes */
  atomic_int cancel;       /* the runtime's flag: != 0 stops before the next step */
  atomic_int stop;         /* STOP_CANCEL, STOP_INTERRUPT or STOP_PAUSE once asked to stop */
  char pause_reason[512];  /* PauseJob's reason (set before stop, under X.lock) */
  atomic_bool reported;    /* Finished is being sent: the job is over */
  atomic_bool done;        /* Finished is sent: the main thread may join */
  pthread_t th;
  double last_progress;    /* monotonic time of the last Progress sent */
  bool progress_sent;
  Gpushare__V1__EpochMetrics *epochs; /* one per epoch end, for Finished */
  size_t n_epochs, cap_epochs;
  uint64_t epoch_step;     /* the step of the last epoch end this run (0: none) */
  double device_seconds;   /* time on the device this run */
  uint64_t data_bytes;     /* host bytes of its datasets' (shared) copy */
  struct job *next;
} job;

static struct {
  int fd;                        /* the control plane's socket */
  pthread_mutex_t write_lock;    /* one whole frame at a time */
  pthread_mutex_t lock;          /* vdevs and jobs lists */
  gs_backend *b;
  int device_index;
  char device[32];
  uint64_t total_bytes;
  int threads;                   /* the device's thread budget */
  char state_dir[PATH_MAX];
  gs_fairshare *fs;
  _Atomic double freed;          /* mono_s() of the device's last release */
  vdev *vdevs;
  job *jobs;
  int wake[2];                   /* self-pipe into the main loop */
  bool stopping;                 /* Shutdown or EOF seen: no new jobs */
  /* The device budget (--device-memory): the device backend wrapped so that
   * the regions of all vdevs together stay within the bytes the control
   * plane calls usable. Vdev limits are checked at admission; with
   * memory_oversubscribe, GROWTH vdevs may add up to more, and a region
   * past the budget is refused here as a full GPU refuses cudaMalloc: the
   * job that asked fails with an OOM report of cause PHYSICAL. */
  char crash_path[PATH_MAX + 64]; /* STATE/executor-DEVICE.crash (see on_fatal) */
  int crash_spare_fd;            /* /dev/null, closed in on_fatal to free a slot */
  struct {                       /* GPUSHARE_EXECUTOR_FAILPOINT (see failpoint_parse) */
    char job[128];               /* the job name it applies to; "" = none */
    uint64_t calls;              /* kernel-crash: crash in its dense_forward call number N */
    bool fault;                  /* device-fault: that call faults the device instead */
    uint64_t oom_bytes;          /* oom: its tensors get an allocator this small */
  } fp;
  gs_backend table;              /* X.b's ops with the failpoint's wrapper */
  gs_backend *inner_b;           /* what the wrapper calls */
  struct {
    gs_backend b;                /* first: X.b points here when capped */
    gs_backend *inner;
    uint64_t cap, used;          /* used guarded by lock */
    pthread_mutex_t lock;
  } budget;
  _Atomic uint64_t holder;       /* the job whose step holds the device, 0 when none */
} X = {.fd = -1, .wake = {-1, -1}, .crash_spare_fd = -1,
       .budget = {.lock = PTHREAD_MUTEX_INITIALIZER}};

/* The job whose thread this is (0 on the main thread), for on_fatal, and
 * that thread's dense_forward calls, for the failpoint. */
static __thread uint64_t tl_job_id;
static __thread const char *tl_job_name;
static __thread uint64_t tl_dense_calls;

/* A fatal signal (a kernel that faults, an abort) ends the executor, but
 * first says which job's thread it hit: the job id goes into
 * STATE/executor-DEVICE.crash with open(2) and write(2) only,
 * async-signal-safe, and the control plane reads it (and removes it) when
 * it sees the executor die (control/exec_events.c), so the job that crashed
 * the device is the one charged with it and the others resume from their
 * checkpoints uncharged. The file exists only when there is a job to name:
 * a spare descriptor is closed first so that the open finds a free slot
 * even in a process that ran out of them. Then the default action runs
 * (the core dump, the exit status the supervisor logs). */
static void crash_file_write(uint64_t id) {
  if (X.crash_path[0] && id) {
    char buf[24];
    int n = 0;
    char rev[24];
    do {
      rev[n++] = (char)('0' + id % 10);
      id /= 10;
    } while (id && n < 20);
    for (int i = 0; i < n; i++) buf[i] = rev[n - 1 - i];
    buf[n++] = '\n';
    if (X.crash_spare_fd >= 0) close(X.crash_spare_fd);
    int fd = open(X.crash_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd >= 0) {
      ssize_t w = write(fd, buf, (size_t)n);
      (void)w;
      close(fd);
    }
  }
}

static void on_fatal(int sig) {
  crash_file_write(tl_job_id);
  signal(sig, SIG_DFL);
  raise(sig);
}

/* GPUSHARE_EXECUTOR_FAILPOINT=kernel-crash:JOB:N makes the N-th
 * dense_forward call of every job named JOB raise SIGSEGV inside the op, as
 * a faulting kernel would: the fault tests (tests/integration/
 * test_executor_crash.sh) use it to prove that a crash in compute never
 * takes the control plane down.
 * GPUSHARE_EXECUTOR_FAILPOINT=oom:JOB:BYTES gives every run of a job named
 * JOB whose planned peak passes BYTES an allocator of BYTES instead of its
 * vdev's (as if the vdev had shrunk under it), so it meets a real QUOTA OOM
 * at run time with its report (tests/integration/test_elastic.sh).
 * GPUSHARE_EXECUTOR_FAILPOINT=device-fault:JOB:N makes that call fault the
 * device instead: on a GPU a real illegal-address fault in the GEMM (a
 * sticky error, the device lost for the process), on the cpu the op's
 * -ENOTRECOVERABLE; the job's thread then ends the executor naming it
 * (device_lost), for tests/integration/test_device_lost.sh and the GPU
 * check.
 * Unset, nothing is wrapped. */
static int failpoint_parse(const char *v) {
  const char *p = v ? strchr(v, ':') : NULL;
  const char *q = p ? strrchr(v, ':') : NULL;
  bool crash = v && !strncmp(v, "kernel-crash:", 13), oom = v && !strncmp(v, "oom:", 4);
  bool fault = v && !strncmp(v, "device-fault:", 13);
  crash = crash || fault;
  X.fp.fault = fault;
  if ((!crash && !oom) || p == q || (size_t)(q - p - 1) >= sizeof X.fp.job) return -1;
  snprintf(X.fp.job, sizeof X.fp.job, "%.*s", (int)(q - p - 1), p + 1);
  char *end;
  errno = 0;
  unsigned long long n = strtoull(q + 1, &end, 10);
  if (errno || *end || n == 0 || !X.fp.job[0]) return -1;
  if (crash) X.fp.calls = n;
  else X.fp.oom_bytes = n;
  return 0;
}

static int failpoint_dense_forward(gs_exec *ex, gs_dtype dt, void *out, const void *in,
                                   const void *w, const void *b, uint32_t n, uint32_t c,
                                   uint32_t oc, void *ws, bool relu) {
  if (tl_job_name && !strcmp(tl_job_name, X.fp.job) && ++tl_dense_calls == X.fp.calls) {
    if (!X.fp.fault) raise(SIGSEGV);
    /* device-fault: on a GPU, a real kernel fault (the GEMM writes to an
     * address no allocation holds: an illegal address, a sticky error);
     * the cpu has no such state, so its op answers as the CUDA checker
     * does for one. */
    if (X.inner_b->host_memory) return -ENOTRECOVERABLE;
    out = (void *)(uintptr_t)4096;
  }
  return X.inner_b->dense_forward(ex, dt, out, in, w, b, n, c, oc, ws, relu);
}

static int budget_reserve(gs_backend *b, int dev, size_t bytes, void **region) {
  (void)b;
  pthread_mutex_lock(&X.budget.lock);
  int rc = -ENOMEM;
  if (bytes <= X.budget.cap - X.budget.used) {
    rc = X.budget.inner->region_reserve(X.budget.inner, dev, bytes, region);
    if (rc == 0) X.budget.used += bytes;
  }
  pthread_mutex_unlock(&X.budget.lock);
  return rc;
}

static void budget_release(gs_backend *b, int dev, void *region, size_t bytes) {
  (void)b;
  X.budget.inner->region_release(X.budget.inner, dev, region, bytes);
  pthread_mutex_lock(&X.budget.lock);
  X.budget.used -= bytes <= X.budget.used ? bytes : X.budget.used;
  pthread_mutex_unlock(&X.budget.lock);
}

static volatile sig_atomic_t g_signal; /* SIGTERM/SIGINT seen */

static void logf_(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void logf_(const char *fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  fprintf(stderr, "gpushare-executor[%s]: %s\n", X.device[0] ? X.device : "-", buf);
}

/* The device is lost to this process (backend.h: -ENOTRECOVERABLE, a CUDA
 * sticky error): no job's next call can succeed here, and no later job's
 * first. The job whose step held the device raised it (steps of different
 * jobs do not overlap: the fair share hands the device to one at a time,
 * and a step ends waiting for its last op), else the job that saw it. Its
 * id goes to the crash file, as on_fatal's does, and the executor exits:
 * the control plane restarts it, charges that job, and resumes the others
 * from their checkpoints. */
static void device_lost(uint64_t observer, const char *why) {
  uint64_t blame = atomic_load(&X.holder);
  if (!blame) blame = observer;
  logf_("device %s lost in job %" PRIu64 "'s step (%s): the executor exits so that a new one "
        "gets a working device",
        X.device, blame, why);
  crash_file_write(blame);
  _exit(EXIT_DEVICE_LOST);
}

static double mono_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The switch to a job that was given the device at `got` after asking at
 * `asked`: how long the device stood free for it, from the later of its
 * asking and the last release, until its thread ran. Its vdev pays for
 * it: a vdev whose many short jobs hand the device to each other would
 * otherwise spend device time in wake-ups that no step's timer counts,
 * taking it from the other vdevs (a thousand jobs of a few tens of
 * microseconds a step held a vdev of the same share to a fifth of its
 * time). A switch past GS_EXEC_SWITCH_MAX is the host's scheduler, not
 * the hand-over: counted up to that. */
#define GS_EXEC_SWITCH_MAX 0.005
static double switch_seconds(double asked, double got) {
  double freed = atomic_load(&X.freed), from = freed > asked ? freed : asked;
  double d = got - from;
  return d <= 0 ? 0 : d > GS_EXEC_SWITCH_MAX ? GS_EXEC_SWITCH_MAX : d;
}

static int64_t unix_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void wake_main(void) {
  char c = 1;
  ssize_t n = write(X.wake[1], &c, 1); /* non-blocking: a full pipe is awake enough */
  (void)n;
}

/* ---------------------------------------------------------------- output --- */

static int send_msg(Gpushare__Exec__V1__FromExecutor *m) {
  uint8_t *buf;
  size_t len;
  int rc = gs_wire_frame(&m->base, &buf, &len);
  if (rc) {
    logf_("cannot frame a message (%s)", strerror(-rc));
    return rc;
  }
  pthread_mutex_lock(&X.write_lock);
  rc = gs_wire_write_all(X.fd, buf, len);
  pthread_mutex_unlock(&X.write_lock);
  free(buf);
  return rc; /* a gone peer is seen by the main loop as end of file */
}

static void send_ready(void) {
  Gpushare__Exec__V1__Ready r = GPUSHARE__EXEC__V1__READY__INIT;
  r.device = X.device;
  r.has_total_bytes = true;
  r.total_bytes = X.total_bytes;
  Gpushare__Exec__V1__FromExecutor m = GPUSHARE__EXEC__V1__FROM_EXECUTOR__INIT;
  m.msg_case = GPUSHARE__EXEC__V1__FROM_EXECUTOR__MSG_READY;
  m.ready = &r;
  send_msg(&m);
}

/* Stats of every vdev that is listed or still has jobs. */
static void send_stats(void) {
  pthread_mutex_lock(&X.lock);
  size_t n = 0;
  for (vdev *v = X.vdevs; v; v = v->next) n++;
  Gpushare__Exec__V1__VdevStats *vs = calloc(n ? n : 1, sizeof *vs);
  Gpushare__Exec__V1__VdevStats **pv = calloc(n ? n : 1, sizeof *pv);
  if (!vs || !pv) {
    pthread_mutex_unlock(&X.lock);
    free(vs);
    free(pv);
    return;
  }
  size_t i = 0;
  for (vdev *v = X.vdevs; v; v = v->next, i++) {
    Gpushare__Exec__V1__VdevStats init = GPUSHARE__EXEC__V1__VDEV_STATS__INIT;
    vs[i] = init;
    vs[i].name = v->name;
    gs_alloc_stats st = {0};
    if (v->alloc) gs_alloc_stats_get(v->alloc, &st);
    gs_fairshare_stats fst = {0};
    gs_fairshare_stats_get(X.fs, v->slot, &fst);
    vs[i].has_in_use = vs[i].has_reserved = vs[i].has_peak_in_use = true;
    vs[i].in_use = st.in_use;
    vs[i].reserved = st.reserved;
    vs[i].peak_in_use = st.peak_in_use;
    vs[i].has_device_seconds = vs[i].has_steps = vs[i].has_running_jobs = true;
    vs[i].device_seconds = fst.device_seconds;
    vs[i].steps = fst.steps;
    vs[i].running_jobs = v->running;
    if (v->alloc) {
      vs[i].has_free_bytes = vs[i].has_largest_free_bytes = vs[i].has_fragmentation = true;
      vs[i].free_bytes = st.headroom;
      vs[i].largest_free_bytes = st.largest_placeable;
      vs[i].fragmentation = st.headroom_fragmentation;
    }
    pv[i] = &vs[i];
  }
  Gpushare__Exec__V1__Stats s = GPUSHARE__EXEC__V1__STATS__INIT;
  s.n_vdev = n;
  s.vdev = pv;
  Gpushare__Exec__V1__FromExecutor m = GPUSHARE__EXEC__V1__FROM_EXECUTOR__INIT;
  m.msg_case = GPUSHARE__EXEC__V1__FROM_EXECUTOR__MSG_STATS;
  m.stats = &s;
  /* Framed under X.lock (the names live in the vdevs), written after. */
  uint8_t *buf = NULL;
  size_t len = 0;
  int rc = gs_wire_frame(&m.base, &buf, &len);
  pthread_mutex_unlock(&X.lock);
  free(vs);
  free(pv);
  if (rc) return;
  pthread_mutex_lock(&X.write_lock);
  gs_wire_write_all(X.fd, buf, len);
  pthread_mutex_unlock(&X.write_lock);
  free(buf);
}

static void err_text(const gs_err *e, char *out, size_t len) {
  if (e->field[0])
    snprintf(out, len, "%s: %s", e->field, e->msg);
  else
    snprintf(out, len, "%s", e->msg[0] ? e->msg : "unknown error");
}

/* A Finished for a job that never got a thread (refused at StartJob). */
static void send_refusal(uint64_t id, bool interrupted, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void send_refusal(uint64_t id, bool interrupted, const char *fmt, ...) {
  char reason[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(reason, sizeof reason, fmt, ap);
  va_end(ap);
  logf_("job %" PRIu64 ": %s", id, reason);
  Gpushare__Exec__V1__Finished f = GPUSHARE__EXEC__V1__FINISHED__INIT;
  f.has_job_id = true;
  f.job_id = id;
  f.has_state = true;
  f.state = interrupted ? GPUSHARE__V1__JOB_STATE__CANCELLED : GPUSHARE__V1__JOB_STATE__FAILED;
  f.reason = reason;
  f.has_interrupted = interrupted;
  f.interrupted = interrupted;
  f.has_steps = true;
  Gpushare__Exec__V1__FromExecutor m = GPUSHARE__EXEC__V1__FROM_EXECUTOR__INIT;
  m.msg_case = GPUSHARE__EXEC__V1__FROM_EXECUTOR__MSG_FINISHED;
  m.finished = &f;
  send_msg(&m);
}

/* ----------------------------------------------------------------- vdevs --- */

static vdev *vdev_find(const char *name) {
  for (vdev *v = X.vdevs; v; v = v->next)
    if (!strcmp(v->name, name)) return v;
  return NULL;
}

static void vdev_make_alloc(vdev *v) {
  char sz[32];
  v->alloc = NULL;
  v->alloc_rc = gs_alloc_create(X.b, X.device_index, v->limit, v->policy, &v->alloc);
  if (v->alloc_rc)
    logf_("vdev %s: cannot %s its %s limit on %s: %s", v->name,
          v->policy == GS_POLICY_PREALLOCATE ? "reserve" : "set up",
          gs_size_format(v->limit, sz, sizeof sz), X.device, strerror(-v->alloc_rc));
}

/* Unlink and free a vdev with no job (X.lock held). */
static void vdev_destroy(vdev *v) {
  for (vdev **pp = &X.vdevs; *pp; pp = &(*pp)->next)
    if (*pp == v) {
      *pp = v->next;
      break;
    }
  gs_alloc_destroy(v->alloc);
  gs_fairshare_remove(X.fs, v->slot);
  free(v);
}

/* A new limit SetVdevs gave while v's jobs run (X.lock held): applied to
 * the allocator as soon as what is in use fits under it (at once for a
 * larger one; for a smaller one, once the jobs that no longer fit have
 * stopped, each job's end trying again), so the limit is never passed. A
 * PREALLOCATE vdev shrunk this way keeps its region until it is idle. */
static void vdev_try_limit(vdev *v) {
  if (!v->pending || v->new_policy != v->policy || !v->alloc || v->limit == v->new_limit) return;
  char a[32], b[32];
  uint64_t old = v->limit;
  int rc = gs_alloc_set_limit(v->alloc, v->new_limit);
  if (rc == 0) {
    v->limit = v->new_limit;
    v->pending = v->policy == GS_POLICY_PREALLOCATE && v->new_limit < old;
    logf_("vdev %s: limit %s -> %s with %u job(s) running", v->name,
          gs_size_format(old, a, sizeof a), gs_size_format(v->limit, b, sizeof b), v->running);
  } else if (rc != -EBUSY) {
    logf_("vdev %s: cannot take its new limit %s while jobs run (%s); it applies once they end",
          v->name, gs_size_format(v->new_limit, b, sizeof b), strerror(-rc));
  }
}

/* The last job of v ended (X.lock held): give GROWTH regions back, and apply
 * what SetVdevs decided while jobs ran. */
static void vdev_idle(vdev *v) {
  if (!v->listed) {
    vdev_destroy(v);
    return;
  }
  if (v->pending) {
    gs_alloc_destroy(v->alloc);
    v->limit = v->new_limit;
    v->policy = v->new_policy;
    v->pending = false;
    vdev_make_alloc(v);
  } else if (v->alloc) {
    gs_alloc_trim(v->alloc);
  }
}

static void on_set_vdevs(const Gpushare__Exec__V1__SetVdevs *sv) {
  pthread_mutex_lock(&X.lock);
  for (vdev *v = X.vdevs; v; v = v->next) v->listed = false;
  for (size_t i = 0; i < sv->n_vdev; i++) {
    const Gpushare__Exec__V1__VdevConfig *c = sv->vdev[i];
    if (!c->name || !c->name[0] || strlen(c->name) >= VDEV_NAME_MAX) {
      logf_("SetVdevs: vdev[%zu] has %s name; ignored", i,
            !c->name || !c->name[0] ? "an empty" : "a too long (64 bytes or more)");
      continue;
    }
    if (!c->has_memory_limit || c->memory_limit == 0) {
      logf_("SetVdevs: vdev %s has no memory_limit; ignored", c->name);
      continue;
    }
    gs_alloc_policy pol =
        c->has_policy && c->policy == GPUSHARE__V1__POLICY__GROWTH ? GS_POLICY_GROWTH
                                                                    : GS_POLICY_PREALLOCATE;
    uint32_t share = c->has_compute_share ? c->compute_share : 100;
    vdev *v = vdev_find(c->name);
    if (v) {
      v->listed = true;
      v->share = share;
      gs_fairshare_set_share(X.fs, v->slot, share);
      bool changed = c->memory_limit != v->limit || pol != v->policy;
      if (v->running) {
        /* The running jobs keep the allocator they were created on: a new
         * limit applies to it when it can, a new policy once they end. */
        v->pending = changed;
        v->new_limit = c->memory_limit;
        v->new_policy = pol;
        vdev_try_limit(v);
      } else if (changed || !v->alloc) { /* a failed PREALLOCATE is retried */
        gs_alloc_destroy(v->alloc);
        v->limit = c->memory_limit;
        v->policy = pol;
        v->pending = false;
        vdev_make_alloc(v);
      }
      continue;
    }
    v = calloc(1, sizeof *v);
    if (!v) {
      logf_("SetVdevs: out of host memory for vdev %s", c->name);
      continue;
    }
    snprintf(v->name, sizeof v->name, "%s", c->name);
    v->limit = c->memory_limit;
    v->policy = pol;
    v->share = share;
    v->listed = true;
    if (gs_fairshare_add(X.fs, share, &v->slot)) {
      logf_("SetVdevs: out of host memory for vdev %s", c->name);
      free(v);
      continue;
    }
    vdev_make_alloc(v);
    v->next = X.vdevs;
    X.vdevs = v;
  }
  /* Vdevs no longer listed go now, or when their last job ends. */
  for (vdev *v = X.vdevs, *next; v; v = next) {
    next = v->next;
    if (!v->listed && !v->running) vdev_destroy(v);
  }
  pthread_mutex_unlock(&X.lock);
  send_stats();
}

/* ------------------------------------------------------------------ jobs --- */

/* A stored set of the job: the blob paths the control plane resolved into
 * StartJob (the executor never opens a path a client named): an IDX or
 * .npy pair, or a text or token stream (its path in *_images). Empty test
 * paths mean no test set. */
static int load_idx(const void *user, const char *which, const gs_spec_dataset *d, gs_dataset *out,
                    gs_err *e) {
  const Gpushare__Exec__V1__StartJob *s = user;
  bool train = strcmp(which, "train") == 0;
  const char *images = train ? s->train_images : s->test_images;
  const char *labels = train ? s->train_labels : s->test_labels;
  bool stream = d->source == GS_DATASET_TEXT || d->source == GS_DATASET_TOKENS;
  if (!train && (!images || !images[0])) return 0;
  if (!images || !images[0] || (!stream && (!labels || !labels[0])))
    return gs_err_set(e, GS_FAILED_PRECONDITION, which,
                      "the %s dataset is stored data, but StartJob gave no %s_images%s path to "
                      "read it from",
                      which, which, stream ? "" : " and labels");
  int rc;
  if (d->source == GS_DATASET_NPY) rc = gs_dataset_load_npy(images, labels, out, e);
  else if (stream)
    rc = gs_dataset_load_tokens(images, d->source == GS_DATASET_TEXT ? GS_TOKENS_TEXT : GS_TOKENS_U16,
                                d->vocab_size, d->sequence_length, out, e);
  else rc = gs_dataset_load_idx(images, labels, out, e);
  if (rc && stream) /* the file's fault (its fields were checked before) */
    snprintf(e->field, sizeof e->field, "%s.path", d->source == GS_DATASET_TEXT ? "text" : "tokens");
  if (rc) gs_err_prefix(e, which);
  return rc;
}

/* The datasets of running jobs, one copy per distinct set: a thousand jobs
 * on one dataset hold it once. A set is known by everything its loading
 * reads: the train and test descriptions, the model's input shape
 * (synthetic images take it) and the blob paths StartJob gave. Training
 * only reads a dataset, so jobs share it without a lock. */
typedef struct shared_sets {
  struct shared_sets *next;
  uint8_t *key;
  size_t key_len;
  unsigned refs;
  gs_dataset train, test;
  bool has_test;
} shared_sets;

static pthread_mutex_t sets_mu = PTHREAD_MUTEX_INITIALIZER;
static shared_sets *sets_list;

/* A set's key: length-prefixed pieces, compared byte for byte. */
typedef struct set_key {
  uint8_t *p;
  size_t len, cap;
  bool failed;
} set_key;

static void key_put(set_key *k, const void *v, size_t n) {
  uint64_t len = n;
  const void *parts[2] = {&len, v};
  size_t sizes[2] = {sizeof len, n};
  for (int i = 0; i < 2 && !k->failed; i++) {
    if (k->len + sizes[i] > k->cap) {
      size_t cap = (k->len + sizes[i]) * 2;
      uint8_t *q = realloc(k->p, cap);
      if (!q) {
        k->failed = true;
        return;
      }
      k->p = q;
      k->cap = cap;
    }
    if (sizes[i]) memcpy(k->p + k->len, parts[i], sizes[i]);
    k->len += sizes[i];
  }
}

static void key_msg(set_key *k, const ProtobufCMessage *m) {
  size_t n = m ? protobuf_c_message_get_packed_size(m) : 0;
  uint8_t *b = malloc(n ? n : 1);
  if (!b) {
    k->failed = true;
    return;
  }
  if (n) protobuf_c_message_pack(m, b);
  key_put(k, b, n);
  free(b);
}

static void key_str(set_key *k, const char *v) { key_put(k, v ? v : "", v ? strlen(v) : 0); }

/* The job's sets, shared: loaded here or taken from a running job. */
static shared_sets *sets_take(const Gpushare__Exec__V1__StartJob *s, const gs_job_spec *spec,
                              gs_err *e) {
  const Gpushare__V1__JobSpec *js = s->spec;
  set_key k = {0};
  key_msg(&k, js->train ? &js->train->base : NULL);
  key_msg(&k, js->test ? &js->test->base : NULL);
  key_msg(&k, js->model && js->model->input ? &js->model->input->base : NULL);
  key_str(&k, s->train_images);
  key_str(&k, s->train_labels);
  key_str(&k, s->test_images);
  key_str(&k, s->test_labels);
  shared_sets *n = k.failed ? NULL : calloc(1, sizeof *n);
  if (!n) {
    free(k.p);
    gs_err_set(e, GS_INTERNAL, "", "out of host memory");
    return NULL;
  }
  n->key = k.p;
  n->key_len = k.len;
  for (int pass = 0; pass < 2; pass++) {
    /* First a running job's copy; after loading, again: another job may
     * have loaded the same sets meanwhile, and one copy stays. */
    pthread_mutex_lock(&sets_mu);
    for (shared_sets *x = sets_list; x; x = x->next)
      if (x->key_len == n->key_len && !memcmp(x->key, n->key, n->key_len)) {
        x->refs++;
        pthread_mutex_unlock(&sets_mu);
        gs_dataset_free(&n->train);
        gs_dataset_free(&n->test);
        free(n->key);
        free(n);
        return x;
      }
    if (pass == 1) {
      n->refs = 1;
      n->next = sets_list;
      sets_list = n;
    }
    pthread_mutex_unlock(&sets_mu);
    if (pass == 1) return n;
    /* Loaded outside the lock: other jobs go on starting meanwhile. */
    if (gs_dataset_load_job(spec, load_idx, s, &n->train, &n->test, &n->has_test, e)) {
      free(n->key);
      free(n);
      return NULL;
    }
  }
  return NULL; /* not reached */
}

/* Host bytes a loaded set holds. */
static uint64_t set_bytes(const gs_dataset *d) { return gs_dataset_host_bytes(d); }

static void sets_drop(shared_sets *x) {
  if (!x) return;
  pthread_mutex_lock(&sets_mu);
  bool last = --x->refs == 0;
  if (last)
    for (shared_sets **p = &sets_list; *p; p = &(*p)->next)
      if (*p == x) {
        *p = x->next;
        break;
      }
  pthread_mutex_unlock(&sets_mu);
  if (!last) return;
  gs_dataset_free(&x->train);
  gs_dataset_free(&x->test);
  free(x->key);
  free(x);
}

/* A job's event to the control plane, as Progress; after a step, with
 * what the job holds (p). */
static void send_progress(const job *j, Gpushare__V1__JobEvent *ev, const gs_train_progress *p) {
  Gpushare__Exec__V1__Progress pr = GPUSHARE__EXEC__V1__PROGRESS__INIT;
  pr.has_job_id = true;
  pr.job_id = j->id;
  pr.event = ev;
  if (p) {
    pr.has_device_bytes = pr.has_host_bytes = pr.has_host_data_bytes = true;
    pr.device_bytes = p->job_bytes;
    pr.host_data_bytes = j->data_bytes;
    pr.host_bytes = p->host_bytes + j->data_bytes;
  }
  /* Called on the job's own thread, the one that adds to device_seconds. */
  pr.has_device_seconds = true;
  pr.device_seconds = j->device_seconds;
  Gpushare__Exec__V1__FromExecutor m = GPUSHARE__EXEC__V1__FROM_EXECUTOR__INIT;
  m.msg_case = GPUSHARE__EXEC__V1__FROM_EXECUTOR__MSG_PROGRESS;
  m.progress = &pr;
  send_msg(&m);
}

static void on_step(void *user, const gs_train_progress *p) {
  job *j = user;
  double now = mono_s();
  bool last = p->step == p->total_steps;
  if (j->progress_sent && now - j->last_progress < PROGRESS_INTERVAL && !last) return;
  j->progress_sent = true;
  j->last_progress = now;
  Gpushare__V1__JobEvent ev = GPUSHARE__V1__JOB_EVENT__INIT;
  ev.has_job_id = ev.has_time_unix_ms = ev.has_state = true;
  ev.job_id = j->id;
  ev.time_unix_ms = unix_ms();
  ev.state = GPUSHARE__V1__JOB_STATE__RUNNING;
  ev.has_epoch = ev.has_step = ev.has_total_steps = true;
  ev.epoch = p->epoch;
  ev.step = p->step;
  ev.total_steps = p->total_steps;
  ev.has_loss = ev.has_samples_per_second = true;
  ev.loss = p->loss;
  ev.samples_per_second = p->samples_per_second;
  ev.has_memory_in_use = ev.has_memory_limit = ev.has_loss_scale = true;
  ev.memory_in_use = p->memory_in_use;
  ev.memory_limit = j->v->limit;
  ev.loss_scale = p->loss_scale;
  send_progress(j, &ev, p);
}

/* An epoch's figures as the protocol carries them. */
static void epoch_metrics(const gs_train_epoch *e, Gpushare__V1__EpochMetrics *em) {
  *em = (Gpushare__V1__EpochMetrics)GPUSHARE__V1__EPOCH_METRICS__INIT;
  em->has_epoch = em->has_train_loss = em->has_test_loss = em->has_test_accuracy = true;
  em->epoch = e->epoch;
  em->train_loss = e->train_loss;
  em->test_loss = e->test_loss;
  em->test_accuracy = e->test_accuracy;
  em->has_samples_per_second = em->has_peak_memory_bytes = true;
  em->samples_per_second = e->samples_per_second;
  em->peak_memory_bytes = e->peak_memory_bytes;
  em->has_loss_scale = em->has_skipped_steps = true;
  em->loss_scale = e->loss_scale;
  em->skipped_steps = e->skipped_steps;
}

/* Kept for Finished (dropped when out of memory: the events had it). */
static void epoch_keep(job *j, const Gpushare__V1__EpochMetrics *em) {
  if (j->n_epochs == j->cap_epochs) {
    size_t cap = j->cap_epochs ? 2 * j->cap_epochs : 8;
    Gpushare__V1__EpochMetrics *g = realloc(j->epochs, cap * sizeof *g);
    if (g) {
      j->epochs = g;
      j->cap_epochs = cap;
    }
  }
  if (j->n_epochs < j->cap_epochs) j->epochs[j->n_epochs++] = *em;
}

/* A job that ended inside an epoch (max_steps): that epoch's figures so
 * far (train loss over the steps it ran, the test set evaluated at the
 * last step), marked partial, so its end reports where the model stands. */
static void epoch_partial(job *j, const gs_train_result *res) {
  if (res->steps == 0 || res->steps == j->epoch_step) return;
  gs_train_epoch e = {.epoch = res->epochs_done + 1,
                      .step = res->steps,
                      .train_loss = res->train_loss,
                      .test_loss = res->test_loss,
                      .test_accuracy = res->test_accuracy,
                      .samples_per_second = res->samples_per_second,
                      .peak_memory_bytes = res->peak_memory_bytes,
                      .loss_scale = res->loss_scale,
                      .skipped_steps = res->skipped_steps};
  Gpushare__V1__EpochMetrics em;
  epoch_metrics(&e, &em);
  em.has_partial = em.partial = true;
  epoch_keep(j, &em);
}

static void on_epoch(void *user, const gs_train_epoch *e) {
  job *j = user;
  Gpushare__V1__EpochMetrics em;
  epoch_metrics(e, &em);
  epoch_keep(j, &em);
  j->epoch_step = e->step;

  Gpushare__V1__JobEvent ev = GPUSHARE__V1__JOB_EVENT__INIT;
  ev.has_job_id = ev.has_time_unix_ms = ev.has_state = true;
  ev.job_id = j->id;
  ev.time_unix_ms = unix_ms();
  ev.state = GPUSHARE__V1__JOB_STATE__RUNNING;
  ev.has_epoch = ev.has_step = true;
  ev.epoch = e->epoch;
  ev.step = e->step;
  ev.has_loss = ev.has_accuracy = true;
  ev.loss = e->train_loss;
  ev.accuracy = e->test_accuracy;
  ev.has_samples_per_second = ev.has_loss_scale = true;
  ev.samples_per_second = e->samples_per_second;
  ev.loss_scale = e->loss_scale;
  ev.has_memory_limit = true;
  ev.memory_limit = j->v->limit;
  ev.epoch_end = &em;
  send_progress(j, &ev, NULL);
}

/* The job's OomReport, from the runtime's one builder (runtime/oom.h): the
 * vdev by name and, where the device budget is shared by oversubscribed
 * vdevs, what the device holds, so the report can say who holds it. */
static int oom_report(const gs_job_spec *spec, const gs_train_failure *f, const vdev *v,
                      Gpushare__V1__OomReport **out) {
  gs_oom_where w = {.vdev = v->name};
  if (X.budget.cap) {
    pthread_mutex_lock(&X.budget.lock);
    w.device_usable = X.budget.cap;
    w.device_held = X.budget.used;
    pthread_mutex_unlock(&X.budget.lock);
  }
  gs_oom_report r;
  gs_err e;
  gs_err_clear(&e);
  if (gs_oom_report_build(spec, X.b, f, &w, &r, &e)) return -1;
  logf_("vdev %s: OOM (%s): %s", v->name, gs_oom_cause_name(r.cause), r.explanation);
  return gs_spec_pb_oom_report(&r, out);
}

static bool file_exists(const char *p) {
  struct stat st;
  return stat(p, &st) == 0;
}

/* One job, start to end, on its own thread. */
static void *job_main(void *arg) {
  job *j = arg;
  const Gpushare__Exec__V1__StartJob *s = j->start;
  tl_job_id = j->id;
  tl_job_name = s->spec && s->spec->name ? s->spec->name : "";
  vdev *v = j->v;
  gs_err e;
  gs_err_clear(&e);
  shared_sets *sets = NULL;
  gs_train *t = NULL;
  gs_train_failure fail;
  memset(&fail, 0, sizeof fail);
  bool done = false;
  char reason[1024] = "";
  gs_job_spec spec;
  gs_job_spec_init(&spec);
  Gpushare__V1__OomReport *oom = NULL;
  Gpushare__V1__MemoryTimeline *tl = NULL;
  uint64_t planned_peak = 0;
  gs_train_result res;
  memset(&res, 0, sizeof res);
  Gpushare__V1__JobState state = GPUSHARE__V1__JOB_STATE__FAILED;
  bool interrupted = false, paused = false;
  gs_alloc *fp_alloc = NULL; /* the oom failpoint's allocator */

  if (gs_spec_pb_job(s->spec, &spec, &e)) {
    err_text(&e, reason, sizeof reason);
    goto report;
  }
  if (!(sets = sets_take(j->start, &spec, &e))) {
    err_text(&e, reason, sizeof reason);
    goto report;
  }
  j->data_bytes = set_bytes(&sets->train) + (sets->has_test ? set_bytes(&sets->test) : 0);
  if (atomic_load(&j->stop)) goto report;
  {
    /* The planner's peak, reported beside the measured one. */
    gs_plan plan;
    gs_err pe;
    gs_err_clear(&pe);
    if (gs_plan_job(&spec, X.b, &plan, &pe) == 0) {
      planned_peak = plan.peak_bytes;
      gs_plan_free(&plan);
    }
  }
  gs_train_options opt = {0};
  opt.threads = X.threads;
  if (s->has_threads && s->threads > 0 && (int)s->threads < X.threads)
    opt.threads = (int)s->threads;
  opt.on_step = on_step;
  opt.on_epoch = on_epoch;
  opt.user = j;
  opt.cancel = &j->cancel;
  /* Periodic checkpoints where the control plane asked for them; a
   * Shutdown checkpoints every job (to the state directory if unnamed). */
  opt.checkpoint_path = j->ckpt_named ? j->ckpt : NULL;
  if (s->has_resume && s->resume) {
    if (file_exists(j->ckpt))
      opt.resume_path = j->ckpt;
    else
      logf_("job %" PRIu64 ": no checkpoint at %s yet; starting from the beginning", j->id,
            j->ckpt);
  }
  pthread_mutex_lock(&X.lock);
  /* Alone in its vdev: the peak it reports is its own, not an earlier job's. */
  if (v->running == 1) gs_alloc_reset_peak(v->alloc);
  pthread_mutex_unlock(&X.lock);
  gs_alloc *alloc = v->alloc;
  if (X.fp.oom_bytes && !strcmp(tl_job_name, X.fp.job) && planned_peak > X.fp.oom_bytes &&
      gs_alloc_create(X.b, X.device_index, X.fp.oom_bytes, GS_POLICY_GROWTH, &fp_alloc) == 0)
    alloc = fp_alloc;
  int crc = gs_train_create(&spec, X.b, alloc, &sets->train, sets->has_test ? &sets->test : NULL,
                            &opt, &t, &fail, &e);
  if (crc) {
    err_text(&e, reason, sizeof reason);
    if (crc == -ENOTRECOVERABLE) device_lost(j->id, reason);
    if (fail.oom && oom_report(&spec, &fail, v, &oom)) oom = NULL;
    goto report;
  }
  if (opt.resume_path) {
    gs_train_result r0;
    gs_train_result_get(t, &r0);
    logf_("job %" PRIu64 ": resumed from step %" PRIu64 " (checkpoint %s)", j->id, r0.steps,
          opt.resume_path);
  }
  gs_fairshare_join(X.fs, v->slot);
  send_stats(); /* a job started: its memory is in use now */

  int rc = 0;
  while (!done && !atomic_load(&j->cancel)) {
    double asked = mono_s();
    gs_fairshare_acquire(X.fs, v->slot);
    double sw = switch_seconds(asked, mono_s());
    if (atomic_load(&j->cancel)) { /* asked to stop while it waited */
      atomic_store(&X.freed, mono_s());
      gs_fairshare_release(X.fs, v->slot, sw);
      break;
    }
    atomic_store(&X.holder, j->id);
    rc = gs_train_steps(t, 1, &done, &e);
    if (rc == -ENOTRECOVERABLE) {
      err_text(&e, reason, sizeof reason);
      device_lost(j->id, reason);
    }
    atomic_store(&X.holder, 0);
    double el = gs_train_last_device_seconds(t) + sw;
    atomic_store(&X.freed, mono_s());
    gs_fairshare_release(X.fs, v->slot, el);
    j->device_seconds += el;
    if (rc) break;
  }
  gs_fairshare_leave(X.fs, v->slot);
  gs_train_result_get(t, &res);
  {
    gs_timeline mt;
    if (gs_train_memory_timeline(t, planned_peak, &mt) == 0) {
      if (gs_spec_pb_timeline(&mt, &tl)) tl = NULL;
      gs_timeline_free(&mt);
    }
  }
  if (rc) {
    err_text(&e, reason, sizeof reason);
  } else if (done && !res.cancelled) {
    state = GPUSHARE__V1__JOB_STATE__SUCCEEDED;
    epoch_partial(j, &res);
    if (s->export_path && s->export_path[0] &&
        gs_train_export_safetensors(t, s->export_path, &e)) {
      state = GPUSHARE__V1__JOB_STATE__FAILED;
      gs_err_prefix(&e, "export");
      err_text(&e, reason, sizeof reason);
    }
  } else if (atomic_load(&j->stop) == STOP_PAUSE || atomic_load(&j->stop) == STOP_INTERRUPT) {
    /* Paused (for another job, a smaller vdev) or interrupted (the
     * executor's shutdown): checkpointed, to resume. */
    state = GPUSHARE__V1__JOB_STATE__CANCELLED;
    paused = atomic_load(&j->stop) == STOP_PAUSE;
    interrupted = !paused;
    char what[600], why[400];
    if (paused) snprintf(what, sizeof what, "%s", j->pause_reason);
    else snprintf(what, sizeof what, "interrupted by the executor's shutdown");
    if (gs_train_checkpoint(t, j->ckpt, &e)) {
      err_text(&e, why, sizeof why);
      snprintf(reason, sizeof reason,
               "%s; stopped at step %" PRIu64 " but its checkpoint could not be written (%s), "
               "so it resumes from the previous one",
               what, res.steps, why);
    } else {
      snprintf(reason, sizeof reason, "%s; checkpointed at step %" PRIu64 " of %" PRIu64, what,
               res.steps, gs_train_total_steps(t));
    }
  } else {
    state = GPUSHARE__V1__JOB_STATE__CANCELLED;
    snprintf(reason, sizeof reason, "cancelled at step %" PRIu64 " of %" PRIu64, res.steps,
             gs_train_total_steps(t));
  }

report:
  if (!t && reason[0] == '\0') {
    /* Asked to stop before the job was created: nothing ran. */
    int stop = atomic_load(&j->stop);
    if (stop == STOP_PAUSE) {
      state = GPUSHARE__V1__JOB_STATE__CANCELLED;
      paused = true;
      snprintf(reason, sizeof reason, "%s; stopped before its first step of this run",
               j->pause_reason);
    } else if (stop) {
      state = GPUSHARE__V1__JOB_STATE__CANCELLED;
      interrupted = stop == STOP_INTERRUPT;
      snprintf(reason, sizeof reason, "%s before its first step",
               interrupted ? "interrupted by the executor's shutdown" : "cancelled");
    }
  }
  /* Every byte goes back to the vdev before the control plane hears of the end. */
  gs_train_destroy(t);
  gs_alloc_destroy(fp_alloc);
  sets_drop(sets);

  Gpushare__Exec__V1__Finished f = GPUSHARE__EXEC__V1__FINISHED__INIT;
  f.has_job_id = true;
  f.job_id = j->id;
  f.has_state = true;
  f.state = state;
  if (state != GPUSHARE__V1__JOB_STATE__SUCCEEDED) f.reason = reason;
  f.oom = oom;
  Gpushare__V1__EpochMetrics **pe = calloc(j->n_epochs ? j->n_epochs : 1, sizeof *pe);
  if (pe) {
    for (size_t i = 0; i < j->n_epochs; i++) pe[i] = &j->epochs[i];
    f.n_epoch = j->n_epochs;
    f.epoch = pe;
  }
  f.has_steps = f.has_peak_memory_bytes = f.has_device_seconds = true;
  f.steps = res.steps;
  f.peak_memory_bytes = res.peak_memory_bytes;
  f.device_seconds = j->device_seconds;
  f.has_interrupted = true;
  f.interrupted = interrupted;
  f.has_paused = true;
  f.paused = paused;

  f.timeline = tl;

  pthread_mutex_lock(&X.lock);
  if (--v->running == 0) vdev_idle(v);
  else vdev_try_limit(v);
  j->v = NULL;
  pthread_mutex_unlock(&X.lock);

  Gpushare__Exec__V1__FromExecutor m = GPUSHARE__EXEC__V1__FROM_EXECUTOR__INIT;
  m.msg_case = GPUSHARE__EXEC__V1__FROM_EXECUTOR__MSG_FINISHED;
  m.finished = &f;
  atomic_store(&j->reported, true);
  send_msg(&m);
  send_stats();
  if (state == GPUSHARE__V1__JOB_STATE__FAILED)
    logf_("job %" PRIu64 " failed: %s", j->id, reason);
  free(pe);
  if (tl) gpushare__v1__memory_timeline__free_unpacked(tl, NULL);
  if (oom) gpushare__v1__oom_report__free_unpacked(oom, NULL);
  gs_spec_pb_job_free(&spec);
  atomic_store(&j->done, true);
  wake_main();
  return NULL;
}

static void job_free(job *j) {
  if (!j) return;
  if (j->msg) gpushare__exec__v1__to_executor__free_unpacked(j->msg, NULL);
  free(j->epochs);
  free(j);
}

/* The job that runs under id. One that has reported Finished is over (its
 * memory is back, the control plane heard its end) even before its thread
 * is joined: a StartJob for the id right after starts a new one. */
static job *job_find(uint64_t id) {
  for (job *j = X.jobs; j; j = j->next)
    if (j->id == id && !atomic_load(&j->reported)) return j;
  return NULL;
}

/* Takes ownership of msg (the ToExecutor holding the StartJob). */
static void on_start(Gpushare__Exec__V1__ToExecutor *msg) {
  const Gpushare__Exec__V1__StartJob *s = msg->start;
  uint64_t id = s->has_job_id ? s->job_id : 0;
  char sz[32];
  job *j = NULL;
  if (!s->has_job_id) {
    logf_("StartJob without job_id; ignored");
    goto drop;
  }
  if (X.stopping) {
    send_refusal(id, true, "the executor is shutting down; the job did not start");
    goto drop;
  }
  if (!s->spec) {
    send_refusal(id, false, "StartJob for job %" PRIu64 " carries no spec", id);
    goto drop;
  }
  pthread_mutex_lock(&X.lock);
  if (job_find(id)) {
    pthread_mutex_unlock(&X.lock);
    /* Answering would end the job that runs under this id: only log. */
    logf_("StartJob for job %" PRIu64 ", which already runs here; ignored", id);
    goto drop;
  }
  vdev *v = s->vdev ? vdev_find(s->vdev) : NULL;
  if (!v || !v->listed) {
    pthread_mutex_unlock(&X.lock);
    send_refusal(id, false, "vdev \"%s\" is not on device %s (SetVdevs did not list it)",
                 s->vdev ? s->vdev : "", X.device);
    goto drop;
  }
  if (!v->alloc) {
    int arc = v->alloc_rc;
    pthread_mutex_unlock(&X.lock);
    send_refusal(id, false, "vdev %s could not reserve its %s limit on device %s (%s)",
                 v->name, gs_size_format(v->limit, sz, sizeof sz), X.device, strerror(-arc));
    goto drop;
  }
  j = calloc(1, sizeof *j);
  if (!j) {
    pthread_mutex_unlock(&X.lock);
    send_refusal(id, false, "the executor is out of host memory");
    goto drop;
  }
  j->id = id;
  j->v = v;
  j->msg = msg;
  j->start = s;
  j->ckpt_named = s->checkpoint_path && s->checkpoint_path[0];
  if (j->ckpt_named)
    snprintf(j->ckpt, sizeof j->ckpt, "%s", s->checkpoint_path);
  else
    snprintf(j->ckpt, sizeof j->ckpt, "%s/job-%" PRIu64 ".ckpt", X.state_dir, id);
  v->running++;
  int rc = pthread_create(&j->th, NULL, job_main, j);
  if (rc) {
    if (--v->running == 0) vdev_idle(v);
    pthread_mutex_unlock(&X.lock);
    j->msg = NULL;
    job_free(j);
    send_refusal(id, false, "the executor cannot start a thread for the job: %s",
                 strerror(rc));
    goto drop;
  }
  j->next = X.jobs;
  X.jobs = j;
  pthread_mutex_unlock(&X.lock);
  return;
drop:
  gpushare__exec__v1__to_executor__free_unpacked(msg, NULL);
}

static void stop_all(int how) {
  pthread_mutex_lock(&X.lock);
  X.stopping = true;
  for (job *j = X.jobs; j; j = j->next) {
    int none = 0;
    atomic_compare_exchange_strong(&j->stop, &none, how);
    atomic_store(&j->cancel, 1);
  }
  pthread_mutex_unlock(&X.lock);
}

static void on_cancel(const Gpushare__Exec__V1__CancelJob *c) {
  uint64_t id = c->has_job_id ? c->job_id : 0;
  pthread_mutex_lock(&X.lock);
  job *j = job_find(id);
  if (j) {
    int none = 0;
    atomic_compare_exchange_strong(&j->stop, &none, STOP_CANCEL);
    atomic_store(&j->cancel, 1);
  }
  pthread_mutex_unlock(&X.lock);
  if (!j) logf_("CancelJob for job %" PRIu64 ", which does not run here; ignored", id);
}

static void on_pause(const Gpushare__Exec__V1__PauseJob *p) {
  uint64_t id = p->has_job_id ? p->job_id : 0;
  pthread_mutex_lock(&X.lock);
  job *j = job_find(id);
  if (j && !atomic_load(&j->stop)) {
    snprintf(j->pause_reason, sizeof j->pause_reason, "%s",
             p->reason && p->reason[0] ? p->reason : "paused by the control plane");
    int none = 0;
    atomic_compare_exchange_strong(&j->stop, &none, STOP_PAUSE);
    atomic_store(&j->cancel, 1);
  }
  pthread_mutex_unlock(&X.lock);
  if (!j) logf_("PauseJob for job %" PRIu64 ", which does not run here; ignored", id);
}

/* Join the threads of jobs that have reported Finished. Returns how many
 * jobs are left. */
static int reap_jobs(void) {
  int left = 0;
  pthread_mutex_lock(&X.lock);
  job **pp = &X.jobs;
  while (*pp) {
    job *j = *pp;
    if (atomic_load(&j->done)) {
      *pp = j->next;
      pthread_mutex_unlock(&X.lock);
      pthread_join(j->th, NULL);
      job_free(j);
      pthread_mutex_lock(&X.lock);
      pp = &X.jobs; /* the list may have changed while unlocked */
      continue;
    }
    left++;
    pp = &j->next;
  }
  pthread_mutex_unlock(&X.lock);
  return left;
}

/* Jobs that have not reported Finished yet. */
static int running_jobs(void) {
  int n = 0;
  pthread_mutex_lock(&X.lock);
  for (job *j = X.jobs; j; j = j->next) n += !atomic_load(&j->reported);
  pthread_mutex_unlock(&X.lock);
  return n;
}

/* ------------------------------------------------------------- main loop --- */

static int on_frame(void *u, const uint8_t *body, size_t len) {
  (void)u;
  Gpushare__Exec__V1__ToExecutor *m = gpushare__exec__v1__to_executor__unpack(NULL, len, body);
  if (!m) {
    logf_("a frame of %zu bytes is not a gpushare.exec.v1.ToExecutor; ignored", len);
    return 0;
  }
  switch (m->msg_case) {
  case GPUSHARE__EXEC__V1__TO_EXECUTOR__MSG_SET_VDEVS:
    on_set_vdevs(m->set_vdevs);
    break;
  case GPUSHARE__EXEC__V1__TO_EXECUTOR__MSG_START:
    on_start(m);
    return 0; /* on_start owns m */
  case GPUSHARE__EXEC__V1__TO_EXECUTOR__MSG_CANCEL:
    on_cancel(m->cancel);
    break;
  case GPUSHARE__EXEC__V1__TO_EXECUTOR__MSG_PAUSE:
    on_pause(m->pause);
    break;
  case GPUSHARE__EXEC__V1__TO_EXECUTOR__MSG_SHUTDOWN:
    logf_("shutdown: checkpointing and stopping every job");
    stop_all(STOP_INTERRUPT);
    break;
  default:
    logf_("a ToExecutor frame with no message; ignored");
    break;
  }
  gpushare__exec__v1__to_executor__free_unpacked(m, NULL);
  return 0;
}

static void on_signal(int sig) {
  g_signal = sig;
  char c = 1;
  ssize_t n = write(X.wake[1], &c, 1);
  (void)n;
}

static int main_loop(void) {
  gs_wire_decoder dec;
  gs_wire_decoder_init(&dec, GS_WIRE_MAX_FRAME);
  uint8_t buf[65536];
  bool eof = false;
  double next_stats = mono_s() + STATS_INTERVAL;
  for (;;) {
    int left = reap_jobs();
    if ((X.stopping || eof) && left == 0) break;
    if (g_signal && !X.stopping) {
      logf_("signal %d: checkpointing and stopping every job", (int)g_signal);
      stop_all(STOP_INTERRUPT);
    }
    int timeout = -1;
    if (left > 0) {
      double now = mono_s();
      if (now >= next_stats) {
        send_stats();
        next_stats = now + STATS_INTERVAL;
      }
      timeout = (int)((next_stats - now) * 1000.0) + 1;
    }
    struct pollfd p[2] = {{.fd = X.wake[0], .events = POLLIN},
                          {.fd = eof ? -1 : X.fd, .events = POLLIN}};
    int n = poll(p, 2, timeout);
    if (n < 0) {
      if (errno == EINTR) continue;
      logf_("poll: %s", strerror(errno));
      break;
    }
    if (p[0].revents & POLLIN) {
      char drain[256];
      while (read(X.wake[0], drain, sizeof drain) > 0) {
      }
    }
    if (!eof && (p[1].revents & (POLLIN | POLLHUP | POLLERR))) {
      ssize_t got = read(X.fd, buf, sizeof buf);
      if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      if (got <= 0) {
        /* ECONNRESET: the peer closed with our frames unread; an end all the same. */
        if (got < 0 && errno != ECONNRESET)
          logf_("reading the control socket: %s", strerror(errno));
        int live = running_jobs();
        if (live) logf_("the control plane closed the socket: cancelling %d job(s)", live);
        eof = true;
        stop_all(STOP_CANCEL);
        continue;
      }
      int rc = gs_wire_feed(&dec, buf, (size_t)got, on_frame, NULL);
      if (rc) {
        logf_("the control socket is out of sync (%s): stopping", strerror(-rc));
        eof = true;
        stop_all(STOP_CANCEL);
      }
    }
  }
  gs_wire_decoder_free(&dec);
  return 0;
}

/* ------------------------------------------------------------- arguments --- */

static void usage(FILE *f) {
  fprintf(f,
          "usage: gpushare-executor --device NAME --fd N --state-dir DIR [--threads N]\n"
          "                         [--device-memory BYTES]\n"
          "       gpushare-executor --list-devices\n"
          "Run the training jobs of one device for gpushared, which starts it and speaks\n"
          "gpushare.exec.v1 (proto/executor.proto) over the socket on descriptor N.\n"
          "\n"
          "  --device NAME     the device: cpu, or gpuN (through the CUDA plugin)\n"
          "  --fd N            the control plane's end of a SOCK_STREAM socketpair\n"
          "  --state-dir DIR   the daemon's state directory (checkpoints of jobs\n"
          "                    that name none go there)\n"
          "  --threads N       the device's thread budget: each step uses it whole\n"
          "                    (default: all online cores)\n"
          "  --device-memory BYTES  the device's usable memory: the regions of all\n"
          "                    vdevs together never pass it (default: no budget\n"
          "                    beyond what the device itself has)\n"
          "  --list-devices    print the GPUs the CUDA plugin can open, one per line\n"
          "                    (gpu INDEX BYTES CC NAME), or \"unavailable WHY\", and exit\n"
          "  -h, --help        this text\n"
          "Exit status: 0 after Shutdown or end of file, 1 on a start-up failure, 2 usage.\n");
}

/* --list-devices: the GPUs this process can open, for the control plane,
 * which never loads CUDA itself (a CUDA context in gpushared would hold
 * device memory and tie the control plane's life to the driver's). One line
 * per GPU, tab-separated: "gpu INDEX TOTAL_BYTES MAJOR.MINOR FREE_BYTES
 * NAME"; or one line "unavailable WHY" where the plugin, a driver or a
 * device is missing. FREE_BYTES is what the device has free once a job
 * could run: after the context, a stream, a cuBLASLt handle and a first
 * matmul exist (first_free), so the control plane budgets vdevs from what
 * is really there (0 when it could not be measured). Exit 0 either way:
 * no GPU is an answer, not a failure. */
static uint64_t first_free(gs_backend *b, int index) {
  const uint32_t n = 64;
  size_t ws = b->dense_workspace(GS_F32, n, n, n), mat = (size_t)n * n * sizeof(float);
  size_t bytes = 3 * mat + ws + GS_ALLOC_ALIGN;
  gs_exec_config cfg = {.threads = 1, .device_index = index};
  gs_exec *ex = NULL;
  void *region = NULL;
  uint64_t total = 0, free_bytes = 0;
  bool ran = false;
  if (b->exec_create(b, &cfg, &ex)) return 0;
  if (b->region_reserve(b, index, bytes, &region) == 0) {
    char *p = region;
    /* operands cleared: the matmul's numbers do not matter, its plans do */
    ran = !b->zero(ex, p, 3 * mat) &&
          !b->dense_forward(ex, GS_F32, p + 2 * mat, p, p + mat, NULL, n, n, n,
                            ws ? p + 3 * mat : NULL, false) &&
          !b->synchronize(ex);
    b->region_release(b, index, region, bytes);
  }
  /* measured while the exec (stream, cuBLASLt handle, plans) still lives */
  if (!ran || b->device_memory(b, index, &total, &free_bytes)) free_bytes = 0;
  b->exec_destroy(ex);
  return free_bytes;
}

static int list_devices(void) {
  char why[512] = "";
  gs_backend *b = gs_backend_cuda_load(why, sizeof why);
  if (!b) {
    printf("unavailable\t%s\n", why[0] ? why : "the CUDA backend did not load");
    return 0;
  }
  int n = gs_cuda_device_count(b);
  for (int i = 0; i < n; i++) {
    gs_gpu_info g;
    if (gs_cuda_device_info(b, i, &g)) continue;
    for (char *c = g.name; *c; c++)
      if (*c == '\t' || *c == '\n') *c = ' ';
    printf("gpu\t%d\t%" PRIu64 "\t%d.%d\t%" PRIu64 "\t%s\n", i, g.total_bytes, g.major,
           g.minor, first_free(b, i), g.name);
  }
  if (n == 0) printf("unavailable\tthe CUDA backend reports no GPU\n");
  return fflush(stdout) == 0 ? 0 : 1;
}

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "gpushare-executor: ");
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, "\nTry 'gpushare-executor --help'.\n");
  return 2;
}

static int parse_int(const char *s, long lo, long hi, long *out) {
  if (!s || !*s) return -1;
  errno = 0;
  char *end;
  long v = strtol(s, &end, 10);
  if (errno || *end || v < lo || v > hi) return -1;
  *out = v;
  return 0;
}

int main(int argc, char **argv) {
  const char *device = NULL, *state_dir = NULL;
  long fd = -1, threads = 0;
  uint64_t device_memory = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      return 0;
    }
    if (!strcmp(a, "--list-devices")) return list_devices();
    const char *val = NULL;
    char flag[32];
    const char *eq = strchr(a, '=');
    if (!strncmp(a, "--", 2) && eq) {
      snprintf(flag, sizeof flag, "%.*s", (int)(eq - a), a);
      val = eq + 1;
    } else {
      snprintf(flag, sizeof flag, "%s", a);
      val = i + 1 < argc ? argv[i + 1] : NULL;
      if (val) i++;
    }
    if (strcmp(flag, "--device") && strcmp(flag, "--fd") && strcmp(flag, "--state-dir") &&
        strcmp(flag, "--threads") && strcmp(flag, "--device-memory"))
      return usage_error("unknown option %s", a);
    if (!val) return usage_error("%s needs a value", flag);
    if (!strcmp(flag, "--device")) {
      device = val;
    } else if (!strcmp(flag, "--fd")) {
      if (parse_int(val, 0, INT_MAX, &fd))
        return usage_error("--fd: \"%s\" is not a file descriptor number", val);
    } else if (!strcmp(flag, "--state-dir")) {
      state_dir = val;
    } else if (!strcmp(flag, "--device-memory")) {
      char *end;
      errno = 0;
      unsigned long long v = strtoull(val, &end, 10);
      if (!isdigit((unsigned char)val[0]) || errno || *end || v == 0)
        return usage_error("--device-memory: \"%s\" is not a positive number of bytes", val);
      device_memory = v;
    } else if (parse_int(val, 1, 1024, &threads)) {
      return usage_error("--threads: \"%s\" is not an integer from 1 to 1024", val);
    }
  }
  if (!device) return usage_error("--device is required (cpu)");
  if (fd < 0) return usage_error("--fd is required: the control plane's socket");
  if (!state_dir || !*state_dir) return usage_error("--state-dir is required");

  /* Die with the control plane, even when it is killed with -9. The parent
   * may have died before the request took effect: then it is gone already.
   * (A parent that died even before getppid() leaves its socket closed, and
   * the first read ends the executor.) */
  pid_t parent = getppid();
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent) {
    fprintf(stderr, "gpushare-executor: the control plane that started it is gone\n");
    return 1;
  }
  snprintf(X.device, sizeof X.device, "%s", device);

  struct stat st;
  if (stat(state_dir, &st) || !S_ISDIR(st.st_mode)) {
    logf_("--state-dir %s is not a directory", state_dir);
    return 2;
  }
  snprintf(X.state_dir, sizeof X.state_dir, "%s", state_dir);
  if (fcntl((int)fd, F_GETFD) < 0) {
    logf_("--fd %ld is not an open descriptor", fd);
    return 2;
  }
  X.fd = (int)fd;

  if (!strcmp(device, "cpu")) {
    X.b = gs_backend_cpu();
    X.device_index = 0;
    const char *isa;
    char why[192];
    if (gs_cpu_isa_status(&isa, why, sizeof why))
      logf_("%s; the cpu kernels run at %s", why, isa);
  } else if (!strncmp(device, "gpu", 3)) {
    long index;
    if (parse_int(device + 3, 0, 1023, &index))
      return usage_error("--device: \"%s\" is not a device: cpu, or gpuN", device);
    char why[512] = "";
    X.b = gs_backend_cuda_load(why, sizeof why);
    if (!X.b) {
      logf_("device %s: the CUDA backend is not available: %s", device, why);
      return 1;
    }
    int count = gs_cuda_device_count(X.b);
    if (index >= count) {
      logf_("device %s: this machine has %d GPU(s) (gpu0..gpu%d)", device, count, count - 1);
      return 1;
    }
    X.device_index = (int)index;
  } else {
    return usage_error("--device: \"%s\" is not a device: cpu, or gpuN", device);
  }
  if (device_memory) {
    X.budget.inner = X.b;
    X.budget.b = *X.b;
    X.budget.b.region_reserve = budget_reserve;
    X.budget.b.region_release = budget_release;
    X.budget.cap = device_memory;
    X.b = &X.budget.b;
  }
  const char *fp = getenv("GPUSHARE_EXECUTOR_FAILPOINT");
  if (fp && *fp) {
    if (failpoint_parse(fp))
      return usage_error("GPUSHARE_EXECUTOR_FAILPOINT=\"%s\": expected kernel-crash:JOB:N, "
                         "device-fault:JOB:N or oom:JOB:BYTES (N, BYTES >= 1)",
                         fp);
    if (X.fp.calls) {
      X.inner_b = X.b;
      X.table = *X.b;
      X.table.dense_forward = failpoint_dense_forward;
      X.b = &X.table;
      logf_("failpoint: job %s %s in its dense_forward call %" PRIu64, X.fp.job,
            X.fp.fault ? "faults the device" : "crashes", X.fp.calls);
    } else {
      logf_("failpoint: job %s runs in %" PRIu64 " bytes whenever it plans more", X.fp.job,
            X.fp.oom_bytes);
    }
  }
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  X.threads = threads > 0 ? (int)threads : (ncpu > 0 ? (int)ncpu : 1);
  uint64_t free_bytes = 0;
  if (X.b->device_memory(X.b, X.device_index, &X.total_bytes, &free_bytes)) {
    logf_("the %s backend cannot say how much memory the device has", X.b->name);
    return 1;
  }

  int status = 1;
  if (pthread_mutex_init(&X.write_lock, NULL)) return 1;
  if (pthread_mutex_init(&X.lock, NULL)) goto fail_write_lock;
  if (gs_fairshare_create(FAIRSHARE_GRACE, FAIRSHARE_SLICE, &X.fs)) goto fail_lock;
  if (pipe2(X.wake, O_CLOEXEC | O_NONBLOCK)) {
    logf_("pipe: %s", strerror(errno));
    goto fail_fs;
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = SIG_IGN;
  sigaction(SIGPIPE, &sa, NULL); /* a gone peer is an error value, not a death */
  sa.sa_handler = on_signal;
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  /* A crash file left by an older executor was read when it died; one
   * that is still here names no death of this one. */
  snprintf(X.crash_path, sizeof X.crash_path, "%s/executor-%s.crash", X.state_dir, X.device);
  if (unlink(X.crash_path) < 0 && errno != ENOENT)
    logf_("cannot remove %s (%s)", X.crash_path, strerror(errno));
  X.crash_spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  sa.sa_handler = on_fatal;
  const int fatal[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
  for (size_t i = 0; i < sizeof fatal / sizeof fatal[0]; i++) sigaction(fatal[i], &sa, NULL);

  logf_("ready: %d thread(s), %" PRIu64 " bytes", X.threads, X.total_bytes);
  send_ready();
  status = main_loop();

  /* Every job has ended: the vdevs go. */
  pthread_mutex_lock(&X.lock);
  while (X.vdevs) vdev_destroy(X.vdevs);
  pthread_mutex_unlock(&X.lock);
  close(X.wake[0]);
  close(X.wake[1]);
fail_fs:
  gs_fairshare_destroy(X.fs);
fail_lock:
  pthread_mutex_destroy(&X.lock);
fail_write_lock:
  pthread_mutex_destroy(&X.write_lock);
  return status;
}
