/*
 * cpu_backend.c: the `cpu` device of gpushare: memory, execs, copies, and
 * the table that ties the ops (cpu_dense.c, cpu_conv.c, cpu_elem.c) to the
 * contract in backend.h. It is the reference every other backend is tested
 * against, and the device a machine without a GPU trains on.
 *
 * Memory. A region is an anonymous private mmap, so a vdev's memory is the
 * process's own and goes back to the system at release; one of 2 MiB or
 * more is aligned to and advised for huge pages (region_map). A reserve larger
 * than MemAvailable answers -ENOMEM up front (the kernel would overcommit and
 * the job would die later, far from the cause); device_memory reports RAM and
 * MemAvailable.
 *
 * Threads: how one job's ops keep to gs_exec_config.threads.
 * Debian 12's libopenblas-dev pulls in the pthread build of OpenBLAS 0.3.21
 * (/etc/alternatives/libopenblas.so -> openblas-pthread/). In that build the
 * thread count is one process-wide variable (blas_cpu_number), set by
 * openblas_set_num_threads() and read at every call; per-thread settings
 * came only in 0.3.27. Setting it before each call, under a lock or not,
 * lets a second job's call change the first one's bound mid-call, or
 * serialises all jobs behind one lock. So gpushare sets OpenBLAS to ONE
 * thread for the whole process, once (gs_backend_cpu), and does the
 * splitting itself: each exec owns a pool of threads-1 workers (the calling
 * job thread is the last one), and gs_cpu_sgemm cuts a GEMM into row blocks
 * of C (column blocks when C is short and wide), each a single-threaded
 * cblas_sgemm on one of the exec's threads. With nthreads == 1, OpenBLAS
 * runs the call on the caller's thread with its per-call buffers taken from
 * its locked memory pool, so concurrent calls from different jobs are safe
 * and each job uses exactly the threads its exec was given, never more.
 * The cost is that each part packs its own copy of B, which is small next
 * to the GEMMs gpushare runs (batch x features), and smaller than what
 * OpenBLAS's own threads spend handing packed panels to each other: a
 * layer split in halves here runs faster than the same GEMM as one
 * two-thread OpenBLAS call. The OpenMP build would read
 * omp_get_max_threads() per call but keeps it in the same global, racing
 * between jobs; the serial build would work like this one but is not what
 * the Debian package installs.
 * Element-wise ops go through the same pool (gs_cpu_parallel) only above a
 * grain where the split pays for handing a range to a worker; small ones
 * run on the job's thread. A worker spins for the next range for up to
 * GS_CPU_SPIN_NS before it sleeps on a condition variable, and so does the
 * caller waiting for its workers: a step posts a range every few hundred
 * microseconds, and a futex wake-up costs tens of them on a virtual machine,
 * a large part of a step when every range waits for one.
 *
 * Ops are synchronous: they have finished when they return, so synchronize
 * has nothing to wait for, and copies are memcpy.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <cblas.h>

#include "kernels/cpu/cpu_internal.h"
#include "kernels/fpenv.h"

/* ---- worker pool ---- */

/* How long a worker waits for the next range, and the caller for its
 * workers, before blocking: longer than the gaps inside a training step
 * (the serial parts between two parallel ops), short enough that a job
 * between steps, or waiting for its fair share, leaves its cores alone.
 * The spin is charged to the job like any of its CPU time. */
#define GS_CPU_SPIN_NS 50000

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

static uint64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Spin until ready(ex, arg) (true) or the spin budget runs out (false). */
static bool spin_until(bool (*ready)(gs_exec *, uint64_t), gs_exec *ex, uint64_t arg) {
  uint64_t t0 = 0;
  for (unsigned i = 1;; i++) {
    if (ready(ex, arg))
      return true;
    cpu_relax();
    if ((i & 127) == 0) {
      uint64_t t = mono_ns();
      if (!t0)
        t0 = t;
      else if (t - t0 > GS_CPU_SPIN_NS)
        return false;
    }
  }
}

/* a range after generation `seen` was posted */
static bool posted_after(gs_exec *ex, uint64_t seen) {
  return atomic_load_explicit(&ex->gen, memory_order_acquire) != seen;
}

/* every worker finished the current range */
static bool all_done(gs_exec *ex, uint64_t unused) {
  (void)unused;
  return atomic_load_explicit(&ex->pending, memory_order_acquire) == 0;
}

/* A worker that wakes for a range on the very CPU its poster runs on moves
 * itself to another one it may use, then gives the scheduler back its whole
 * set (so it is not pinned: it stays where it went until the scheduler
 * moves it). Why: a sleeping worker is woken by the job's thread, and Linux
 * places a wakee near its waker when the other cores look busy. That is the
 * case each time jobs of several vdevs take turns on the cpu device: the
 * job that just lost its turn still has a worker spinning out its last
 * GS_CPU_SPIN_NS on the other core, the new job's worker lands beside its
 * own job thread, and the two hand ranges to each other on one core (tens
 * of switches a millisecond) until the load balancer notices, which it
 * hardly does while only one of them is runnable at a time: milliseconds
 * lost at the start of every fair-share slice. */
static void leave_poster_cpu(struct gs_cpu_worker *wk) {
  const gs_exec *ex = wk->ex;
  int poster = atomic_load_explicit(&ex->poster_cpu, memory_order_relaxed);
  if (poster < 0 || !ex->have_allowed || sched_getcpu() != poster)
    return;
  cpu_set_t others = ex->allowed;
  CPU_CLR(poster, &others);
  if (CPU_COUNT(&others) == 0)
    return; /* nowhere else to go */
  if (pthread_setaffinity_np(pthread_self(), sizeof others, &others) == 0)
    (void)pthread_setaffinity_np(pthread_self(), sizeof ex->allowed, &ex->allowed);
}

static void *cpu_worker_main(void *arg) {
  struct gs_cpu_worker *wk = arg;
  (void)gs_fpenv_flush_denormals(); /* fpenv.h: as the job's own thread */
  gs_exec *ex = wk->ex;
  uint64_t seen = 0;
  for (;;) {
    bool slept = false;
    if (!spin_until(posted_after, ex, seen)) {
      slept = true;
      /* Dekker with the poster: sleepers goes up before gen is read again,
       * the poster bumps gen before it reads sleepers (both seq_cst), so
       * one of the two sees the other and no wake-up is lost. */
      pthread_mutex_lock(&ex->mu);
      atomic_fetch_add(&ex->sleepers, 1);
      while (!atomic_load(&ex->stop) && atomic_load(&ex->gen) == seen)
        pthread_cond_wait(&ex->wake, &ex->mu);
      atomic_fetch_sub(&ex->sleepers, 1);
      pthread_mutex_unlock(&ex->mu);
    }
    if (atomic_load(&ex->stop))
      break;
    seen = atomic_load_explicit(&ex->gen, memory_order_acquire);
    if (slept)
      leave_poster_cpu(wk);
    int parts = ex->parts;
    if (wk->id < parts)
      ex->fn(ex->ctx, ex->n * (size_t)wk->id / (size_t)parts,
             ex->n * (size_t)(wk->id + 1) / (size_t)parts);
    if (atomic_fetch_sub(&ex->pending, 1) == 1 && atomic_load(&ex->waiting)) {
      pthread_mutex_lock(&ex->mu);
      pthread_cond_signal(&ex->done);
      pthread_mutex_unlock(&ex->mu);
    }
  }
  return NULL;
}

void gs_cpu_parallel(gs_exec *ex, size_t n, size_t grain, gs_cpu_range_fn fn, void *ctx) {
  if (n == 0)
    return;
  size_t parts = grain ? n / grain : n;
  if (parts > (size_t)ex->nworkers + 1)
    parts = (size_t)ex->nworkers + 1;
  if (parts <= 1) {
    fn(ctx, 0, n);
    return;
  }
  /* The workers of the last range have all counted down (pending is 0), so
   * none reads these fields until gen moves. */
  ex->fn = fn;
  ex->ctx = ctx;
  ex->n = n;
  ex->parts = (int)parts;
  atomic_store_explicit(&ex->pending, ex->nworkers, memory_order_relaxed);
  atomic_store_explicit(&ex->poster_cpu, sched_getcpu(), memory_order_relaxed);
  atomic_fetch_add(&ex->gen, 1); /* seq_cst: publishes the range */
  if (atomic_load(&ex->sleepers) > 0) {
    pthread_mutex_lock(&ex->mu);
    pthread_cond_broadcast(&ex->wake);
    pthread_mutex_unlock(&ex->mu);
  }
  fn(ctx, 0, n / parts);
  if (!spin_until(all_done, ex, 0)) {
    pthread_mutex_lock(&ex->mu);
    atomic_store(&ex->waiting, true);
    while (atomic_load(&ex->pending) > 0)
      pthread_cond_wait(&ex->done, &ex->mu);
    atomic_store(&ex->waiting, false);
    pthread_mutex_unlock(&ex->mu);
  }
}

/* ---- GEMM split over the exec's threads ---- */

/* Rows (or columns) per block: parts are whole blocks. 8, not 16:
 * fashion-mlp's dW1 is 784 rows, 49 blocks of 16, and the thread with 25
 * of them kept the one with 24 waiting at every step; 98 blocks of 8 split
 * evenly, and a part ending on an 8-row edge runs no slower. */
#define GS_CPU_GEMM_BLOCK 8

struct sgemm_job {
  bool ta, tb, by_rows;
  size_t m, n, k;
  float alpha, beta;
  const float *a, *b;
  const float *bias; /* (N): each part starts its block of C as bias rows */
  bool relu;         /* and ends it with relu over the block */
  float *c;
  size_t lda, ldb, ldc;
};

static void sgemm_part(void *ctx, size_t lo, size_t hi) {
  const struct sgemm_job *j = ctx;
  size_t span = j->by_rows ? j->m : j->n;
  lo *= GS_CPU_GEMM_BLOCK;
  hi *= GS_CPU_GEMM_BLOCK;
  if (hi > span)
    hi = span;
  if (lo >= hi)
    return;
  const float *a = j->a, *b = j->b;
  float *c = j->c;
  size_t m = j->m, n = j->n;
  if (j->by_rows) {
    a += j->ta ? lo : lo * j->lda;
    c += lo * j->ldc;
    m = hi - lo;
  } else {
    b += j->tb ? lo * j->ldb : lo;
    c += lo;
    n = hi - lo;
  }
  float beta = j->beta;
  if (j->bias) { /* the part's own block of C, on the thread that GEMMs it */
    const float *bias = j->bias + (j->by_rows ? 0 : lo);
    for (size_t r = 0; r < m; r++)
      memcpy(c + r * j->ldc, bias, n * sizeof(float));
    beta = 1.0f;
  }
  if (beta == 0.0f) {
    /* OpenBLAS clears C for beta 0 in a pass of its own before adding A.B
     * into it, one scalar store a float (sgemm_beta, a visible part of the
     * job thread's time for the input gradients). memset stores vectors, and A.B added into those zeros is
     * the same bits as after OpenBLAS's own clear (test_kernels), except
     * where an AVX-512 build of OpenBLAS would have taken its separate
     * small-matrix kernel (sgemm_direct, non-transposed beta-0 calls only),
     * whose rounding may differ: with beta 1 every call takes the packed
     * kernel. */
    for (size_t r = 0; r < m; r++)
      memset(c + r * j->ldc, 0, n * sizeof(float));
    beta = 1.0f;
  }
  if (j->k == 0) { /* C = beta * C, which BLAS leaves to the caller's reading */
    if (beta != 1.0f)
      for (size_t r = 0; r < m; r++)
        for (size_t q = 0; q < n; q++)
          c[r * j->ldc + q] *= beta;
  } else {
    cblas_sgemm(CblasRowMajor, j->ta ? CblasTrans : CblasNoTrans,
                j->tb ? CblasTrans : CblasNoTrans, (blasint)m, (blasint)n, (blasint)j->k,
                j->alpha, a, (blasint)j->lda, b, (blasint)j->ldb, beta, c, (blasint)j->ldc);
  }
  if (j->relu)
    gs_cpu_relu_rows(c, m, n, j->ldc);
}

static void sgemm_run(gs_exec *ex, struct sgemm_job j) {
  size_t m = j.m, n = j.n;
  if (m == 0 || n == 0)
    return;
  size_t work = m * n * (j.k ? j.k : 1);
  size_t parts = work / GS_CPU_GEMM_GRAIN;
  size_t rblocks = (m + GS_CPU_GEMM_BLOCK - 1) / GS_CPU_GEMM_BLOCK;
  size_t cblocks = (n + GS_CPU_GEMM_BLOCK - 1) / GS_CPU_GEMM_BLOCK;
  if (parts > (size_t)ex->threads)
    parts = (size_t)ex->threads;
  /* Each part packs its own slice of one operand and the whole of the
   * other: split rows of C (each part packs all of B, K x N) when B is the
   * smaller operand, columns (each packs all of A, M x K) otherwise, unless
   * that side has too few blocks to give each part one. */
  bool rows_ok = rblocks >= parts, cols_ok = cblocks >= parts;
  j.by_rows = rows_ok && cols_ok ? n <= m : rows_ok || (!cols_ok && rblocks >= cblocks);
  size_t blocks = j.by_rows ? rblocks : cblocks;
  if (parts <= 1 || blocks <= 1) {
    sgemm_part(&j, 0, blocks);
    return;
  }
  gs_cpu_parallel(ex, blocks, blocks / parts ? blocks / parts : 1, sgemm_part, &j);
}

void gs_cpu_sgemm(gs_exec *ex, bool trans_a, bool trans_b, size_t m, size_t n, size_t k,
                  float alpha, const float *a, size_t lda, const float *b, size_t ldb,
                  float beta, float *c, size_t ldc) {
  sgemm_run(ex, (struct sgemm_job){.ta = trans_a, .tb = trans_b, .m = m, .n = n, .k = k,
                                   .alpha = alpha, .beta = beta, .a = a, .b = b, .c = c,
                                   .lda = lda, .ldb = ldb, .ldc = ldc});
}

void gs_cpu_sgemm_here(bool trans_a, bool trans_b, size_t m, size_t n, size_t k, float alpha,
                       const float *a, size_t lda, const float *b, size_t ldb, float beta,
                       float *c, size_t ldc) {
  if (m == 0 || n == 0)
    return;
  struct sgemm_job j = {.ta = trans_a, .tb = trans_b, .by_rows = true, .m = m, .n = n, .k = k,
                        .alpha = alpha, .beta = beta, .a = a, .b = b, .c = c, .lda = lda,
                        .ldb = ldb, .ldc = ldc};
  sgemm_part(&j, 0, (m + GS_CPU_GEMM_BLOCK - 1) / GS_CPU_GEMM_BLOCK);
}

void gs_cpu_sgemm_fwd(gs_exec *ex, size_t m, size_t n, size_t k, const float *a, size_t lda,
                      const float *b, size_t ldb, const float *bias, float beta, bool relu,
                      float *c, size_t ldc) {
  sgemm_run(ex, (struct sgemm_job){.m = m, .n = n, .k = k, .alpha = 1.0f, .beta = beta,
                                   .a = a, .b = b, .bias = bias, .relu = relu, .c = c,
                                   .lda = lda, .ldb = ldb, .ldc = ldc});
}

/* db (F) += column sums of dout (M, F), columns [lo, hi) * GS_CPU_GEMM_BLOCK */
struct bias_grad_job {
  float *db;
  const float *dout;
  size_t m, f;
};

GS_CPU_RANGE(bias_grad_part, ctx, lo, hi, isa) {
  const struct bias_grad_job *j = ctx;
  size_t c0 = lo * GS_CPU_GEMM_BLOCK, c1 = hi * GS_CPU_GEMM_BLOCK;
  if (c1 > j->f)
    c1 = j->f;
  float *restrict db = j->db;
  for (size_t i = 0; i < j->m; i++) {
    const float *restrict row = j->dout + i * j->f;
    for (size_t q = c0; q < c1; q++)
      db[q] += row[q];
  }
}

void gs_cpu_bias_grad_here(float *db, const float *dout, size_t m, size_t f) {
  struct bias_grad_job j = {.db = db, .dout = dout, .m = m, .f = f};
  GS_CPU_PICK(bias_grad_part)(&j, 0, (f + GS_CPU_GEMM_BLOCK - 1) / GS_CPU_GEMM_BLOCK);
}

void gs_cpu_bias_grad(gs_exec *ex, float *db, const float *dout, size_t m, size_t f) {
  struct bias_grad_job j = {.db = db, .dout = dout, .m = m, .f = f};
  size_t blocks = (f + GS_CPU_GEMM_BLOCK - 1) / GS_CPU_GEMM_BLOCK;
  size_t grain = blocks * GS_CPU_GEMM_BLOCK * m < ((size_t)1 << 15) ? blocks : 1;
  gs_cpu_parallel(ex, blocks, grain, GS_CPU_PICK(bias_grad_part), &j);
}

/* ---- device and memory ---- */

static int64_t cpu_mem_available(void) {
  FILE *f = fopen("/proc/meminfo", "r");
  if (f) {
    char line[256];
    long long kb;
    while (fgets(line, sizeof line, f))
      if (sscanf(line, "MemAvailable: %lld kB", &kb) == 1) {
        fclose(f);
        return (int64_t)kb * 1024;
      }
    fclose(f);
  }
  long pages = sysconf(_SC_AVPHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
  return pages > 0 && psz > 0 ? (int64_t)pages * psz : -1;
}

static int cpu_device_memory(gs_backend *b, int device_index, uint64_t *total,
                             uint64_t *free_bytes) {
  (void)b;
  (void)device_index; /* one device: the machine's RAM */
  long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || psz <= 0)
    return -EIO;
  int64_t avail = cpu_mem_available();
  if (avail < 0)
    return -EIO;
  if (total)
    *total = (uint64_t)pages * (uint64_t)psz;
  if (free_bytes)
    *free_bytes = (uint64_t)avail;
  return 0;
}

/* A region of 2 MiB or more starts on a 2 MiB boundary and is advised
 * MADV_HUGEPAGE: Linux then backs it with huge pages even where transparent
 * huge pages are "madvise" only (Debian's default). A training step walks
 * its weights, gradients and optimizer state (fashion-mlp: 3.8 MB) several
 * times, and on 4 KiB pages the TLB misses of those walks make its rate
 * swing with the machine's load. The unaligned head and tail of
 * the larger mapping go straight back. */
#define GS_CPU_HUGE_PAGE ((size_t)2 << 20)

static char *anon_map(size_t len) {
  void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? NULL : p;
}

static void *region_map(size_t bytes) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  if (bytes > SIZE_MAX - GS_CPU_HUGE_PAGE - page)
    return NULL; /* no machine has it; and the sums below must not wrap */
  size_t len = (bytes + page - 1) / page * page, span = len + GS_CPU_HUGE_PAGE;
#ifdef MADV_HUGEPAGE
  char *raw = len >= GS_CPU_HUGE_PAGE ? anon_map(span) : NULL;
#else
  char *raw = NULL;
#endif
  if (!raw) /* small, or no room for the aligned span: as asked */
    return anon_map(len);
  char *p = (char *)(((uintptr_t)raw + GS_CPU_HUGE_PAGE - 1) & ~(uintptr_t)(GS_CPU_HUGE_PAGE - 1));
  if (p > raw)
    munmap(raw, (size_t)(p - raw));
  if (raw + span > p + len)
    munmap(p + len, (size_t)(raw + span - (p + len)));
#ifdef MADV_HUGEPAGE
  (void)madvise(p, len, MADV_HUGEPAGE); /* advice: a kernel without THP refuses, no harm */
#endif
  return p;
}

static int cpu_region_reserve(gs_backend *b, int device_index, size_t bytes, void **region) {
  (void)b;
  (void)device_index;
  if (bytes == 0)
    return -EINVAL;
  int64_t avail = cpu_mem_available();
  if (avail >= 0 && bytes > (uint64_t)avail)
    return -ENOMEM;
  *region = region_map(bytes);
  return *region ? 0 : -ENOMEM;
}

static void cpu_region_release(gs_backend *b, int device_index, void *region, size_t bytes) {
  (void)b;
  (void)device_index;
  if (region && bytes)
    munmap(region, bytes);
}

/* ---- execs ---- */

static void cpu_exec_destroy(gs_exec *ex) {
  if (!ex)
    return;
  pthread_mutex_lock(&ex->mu);
  atomic_store(&ex->stop, true);
  pthread_cond_broadcast(&ex->wake);
  pthread_mutex_unlock(&ex->mu);
  for (int i = 0; i < ex->nworkers; i++)
    pthread_join(ex->workers[i].tid, NULL);
  pthread_cond_destroy(&ex->done);
  pthread_cond_destroy(&ex->wake);
  pthread_mutex_destroy(&ex->mu);
  free(ex->workers);
  free(ex);
}

static int cpu_exec_create(gs_backend *b, const gs_exec_config *cfg, gs_exec **out) {
  (void)b;
  if (!cfg || cfg->threads < 1)
    return -EINVAL;
  int threads = cfg->threads;
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  if (ncpu > 0 && threads > ncpu)
    threads = (int)ncpu; /* more threads than cores only adds switches */
  gs_exec *ex = calloc(1, sizeof *ex);
  if (!ex)
    return -ENOMEM;
  ex->threads = threads;
  atomic_init(&ex->poster_cpu, -1);
  pthread_mutex_init(&ex->mu, NULL);
  pthread_cond_init(&ex->wake, NULL);
  pthread_cond_init(&ex->done, NULL);
  int rc = -ENOMEM;
  if (threads > 1) {
    ex->workers = calloc((size_t)threads - 1, sizeof *ex->workers);
    if (!ex->workers)
      goto fail_pool;
    /* the set a new thread inherits from this one, read here rather than
     * by each worker, before anything can narrow it */
    ex->have_allowed =
        pthread_getaffinity_np(pthread_self(), sizeof ex->allowed, &ex->allowed) == 0;
    for (int i = 0; i < threads - 1; i++) {
      ex->workers[i].ex = ex;
      ex->workers[i].id = i + 1;
      int e = pthread_create(&ex->workers[i].tid, NULL, cpu_worker_main, &ex->workers[i]);
      if (e) {
        rc = -e;
        goto fail_pool;
      }
      ex->nworkers++;
    }
  }
  *out = ex;
  return 0;
fail_pool:
  cpu_exec_destroy(ex); /* joins the workers started so far */
  return rc;
}

static int cpu_synchronize(gs_exec *ex) {
  (void)ex; /* every op has finished when it returns */
  return 0;
}

static double clock_seconds(clockid_t id) {
  struct timespec ts;
  if (clock_gettime(id, &ts)) return 0;
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Core-seconds so far of the calling thread and of ex's workers. */
static double exec_cpu_seconds(gs_exec *ex) {
  double s = clock_seconds(CLOCK_THREAD_CPUTIME_ID);
  for (int i = 0; i < ex->nworkers; i++) {
    clockid_t id;
    if (pthread_getcpuclockid(ex->workers[i].tid, &id) == 0) s += clock_seconds(id);
  }
  return s;
}

static int cpu_timer_start(gs_exec *ex) {
  ex->timer_t0 = exec_cpu_seconds(ex);
  return 0;
}

static int cpu_timer_stop(gs_exec *ex, double *seconds) {
  double d = exec_cpu_seconds(ex) - ex->timer_t0;
  *seconds = d > 0 ? d : 0;
  return 0;
}

/* Bytes below which zeroing stays on the job's thread: a memset of a
 * step's gradients (fashion-mlp: 0.9 MB) gains little from a split, which
 * must first hand the range to a worker. */
#define GS_CPU_BYTES_GRAIN ((size_t)128 << 10)

static void zero_part(void *ctx, size_t lo, size_t hi) { memset((char *)ctx + lo, 0, hi - lo); }

/* A copy stays one memmove on the job's thread: what it copies was mostly
 * just written there, and split, the other half crossed to the worker's
 * core first, which costs more than the copy. */
static int cpu_copy(gs_exec *ex, void *dst, const void *src, size_t bytes) {
  (void)ex;
  if (bytes)
    memmove(dst, src, bytes);
  return 0;
}

typedef struct copy_2d_job {
  uint8_t *dst;
  const uint8_t *src;
  size_t dpitch, spitch, width;
} copy_2d_job;

static void copy_2d_part(void *ctx, size_t lo, size_t hi) {
  const copy_2d_job *j = ctx;
  for (size_t r = lo; r < hi; r++) memcpy(j->dst + r * j->dpitch, j->src + r * j->spitch, j->width);
}

/* Rows split over the job's threads where there are enough bytes to pay. */
static int cpu_copy_2d(gs_exec *ex, void *dst, size_t dpitch, const void *src, size_t spitch,
                       size_t width, size_t rows) {
  if (!width || !rows) return 0;
  copy_2d_job j = {.dst = dst, .src = src, .dpitch = dpitch, .spitch = spitch, .width = width};
  size_t grain = width >= GS_CPU_BYTES_GRAIN ? 1 : GS_CPU_BYTES_GRAIN / width;
  gs_cpu_parallel(ex, rows, grain, copy_2d_part, &j);
  return 0;
}

static int cpu_zero(gs_exec *ex, void *dst, size_t bytes) {
  if (bytes)
    gs_cpu_parallel(ex, bytes, GS_CPU_BYTES_GRAIN, zero_part, dst);
  return 0;
}

/* ---- the table ---- */

static gs_backend cpu_backend = {
    .name = "cpu",
    .impl = NULL,
    .device_memory = cpu_device_memory,
    .region_reserve = cpu_region_reserve,
    .region_release = cpu_region_release,
    .exec_create = cpu_exec_create,
    .exec_destroy = cpu_exec_destroy,
    .synchronize = cpu_synchronize,
    .timer_start = cpu_timer_start,
    .timer_stop = cpu_timer_stop,
    .copy_in = cpu_copy,
    .copy_out = cpu_copy,
    .copy = cpu_copy,
    .zero = cpu_zero,
    .dense_workspace = gs_cpu_dense_workspace,
    .dense_forward = gs_cpu_dense_forward,
    .dense_backward = gs_cpu_dense_backward,
    .conv2d_workspace = gs_cpu_conv2d_workspace,
    .conv2d_forward = gs_cpu_conv2d_forward,
    .conv2d_backward = gs_cpu_conv2d_backward,
    .depthwise_workspace = gs_cpu_depthwise_workspace,
    .depthwise_forward = gs_cpu_depthwise_forward,
    .depthwise_backward = gs_cpu_depthwise_backward,
    .maxpool_forward = gs_cpu_maxpool_forward,
    .maxpool_backward = gs_cpu_maxpool_backward,
    .gap_forward = gs_cpu_gap_forward,
    .gap_backward = gs_cpu_gap_backward,
    .relu_forward = gs_cpu_relu_forward,
    .relu_backward = gs_cpu_relu_backward,
    .xent_forward_backward = gs_cpu_xent,
    .cast = gs_cpu_cast,
    .unscale_check = gs_cpu_unscale_check,
    .loss_scale_update = gs_cpu_loss_scale_update,
    .sgd_step = gs_cpu_sgd_step,
    .adam_step = gs_cpu_adam_step,
    .host_memory = true,
    .host_parallel = gs_cpu_parallel,
    /* normalisation and element-wise ops (cpu_norm.c) */
    .add_forward = gs_cpu_add_forward,
    .accumulate = gs_cpu_accumulate,
    .batchnorm_workspace = gs_cpu_batchnorm_workspace,
    .batchnorm_forward = gs_cpu_batchnorm_forward,
    .batchnorm_backward = gs_cpu_batchnorm_backward,
    .layernorm_forward = gs_cpu_layernorm_forward,
    .layernorm_workspace = gs_cpu_layernorm_workspace,
    .layernorm_backward = gs_cpu_layernorm_backward,
    .gelu_forward = gs_cpu_gelu_forward,
    .gelu_backward = gs_cpu_gelu_backward,
    .dropout_forward = gs_cpu_dropout_forward,
    .dropout_backward = gs_cpu_dropout_backward,
    .avgpool_forward = gs_cpu_avgpool_forward,
    .avgpool_backward = gs_cpu_avgpool_backward,
    /* the layer graph */
    .copy_2d = cpu_copy_2d,
    /* transformer ops (cpu_attn.c) */
    .embedding_forward = gs_cpu_embedding_forward,
    .embedding_backward = gs_cpu_embedding_backward,
    .posembed_forward = gs_cpu_posembed_forward,
    .posembed_backward = gs_cpu_posembed_backward,
    .attention_workspace = gs_cpu_attention_workspace,
    .attention_forward = gs_cpu_attention_forward,
    .attention_backward = gs_cpu_attention_backward,
};

static pthread_once_t cpu_once = PTHREAD_ONCE_INIT;

static void cpu_init(void) { openblas_set_num_threads(1); }

gs_backend *gs_backend_cpu(void) {
  pthread_once(&cpu_once, cpu_init);
  return &cpu_backend;
}
