/*
 * gpu_tests.c: the GPU machine's test program (tests/gpu/check.sh runs it).
 * That machine has CUDA, a C compiler and CMake but no Criterion, so this
 * is a plain main with a tiny harness: each check prints PASS or FAIL with
 * the first disagreement, and the last line is "N passed, N failed"; the
 * exit status is 0 only when nothing failed (and 2 when no GPU answered,
 * which on the GPU machine is itself a failure).
 *
 * What it runs:
 *  - every case of gpu_cases.c (each op against the CPU op, in fp32, fp16
 *    and bf16, and the 50-step MLP loss trajectory; hand-built from the
 *    backend ops, not the training runtime, which needs protobuf-c);
 *  - two vdevs on one GPU through the vdev allocator (runtime/alloc.c), in
 *    two threads at once: job A allocates past its quota and must get
 *    -ENOMEM with cause GS_OOM_QUOTA, while job B trains the MLP to the end
 *    inside its own limit; neither allocator's peaks pass its limit.
 * Arguments, if any, are case names to run alone ("dense", "vdevs", ...).
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/alloc.h"
#include "tests/gpu/gpu_cases.h"

static int passed, failed;

static void report(const char *name, const char *dt, int rc, const char *msg) {
  if (rc == 0) {
    passed++;
    printf("PASS %s %s\n", name, dt);
  } else {
    failed++;
    printf("FAIL %s %s: %s (%d)\n", name, dt, msg && msg[0] ? msg : "failed", rc);
  }
  fflush(stdout);
}

static bool wanted(int argc, char **argv, const char *name) {
  if (argc < 2)
    return true;
  for (int i = 1; i < argc; i++)
    if (strcmp(argv[i], name) == 0)
      return true;
  return false;
}

/* ---- two vdevs on one GPU ---- */

#define MIB ((uint64_t)1 << 20)

typedef struct vjob {
  gs_backend *b;
  gs_alloc *a;
  int rc;                /* 0 when the job did what it should */
  char msg[256];
  gs_alloc_failure oom;  /* job A: the refusal */
  float losses[50];      /* job B: its trajectory */
} vjob;

/* job A: three 24 MiB tensors in a 64 MiB vdev: the third is over quota */
static void *vjob_over_quota(void *p) {
  vjob *j = p;
  gs_exec_config cfg = {.threads = 1, .device_index = 0};
  gs_exec *ex = NULL;
  if ((j->rc = j->b->exec_create(j->b, &cfg, &ex))) {
    snprintf(j->msg, sizeof j->msg, "exec_create: %d", j->rc);
    return NULL;
  }
  gs_alloc_tag tag = {.layer = "dense_1", .role = GS_ROLE_ACTIVATIONS};
  void *t[3] = {NULL, NULL, NULL};
  int got = 0;
  for (int i = 0; i < 3; i++) {
    memset(&j->oom, 0, sizeof j->oom);
    int rc = gs_alloc_malloc(j->a, 24 * MIB, &tag, &t[i], &j->oom);
    if (rc) {
      if (i != 2 || rc != -ENOMEM || j->oom.cause != GS_OOM_QUOTA) {
        snprintf(j->msg, sizeof j->msg, "tensor %d: rc %d cause %d (want the third, QUOTA)", i,
                 rc, (int)j->oom.cause);
        j->rc = -1;
      }
      break;
    }
    got++;
    if ((rc = j->b->zero(ex, t[i], 24 * MIB))) { /* the memory is really there */
      snprintf(j->msg, sizeof j->msg, "zero: %d", rc);
      j->rc = rc;
    }
  }
  if (!j->rc && got != 2) {
    snprintf(j->msg, sizeof j->msg, "%d tensors of 24 MiB fit a 64 MiB vdev", got);
    j->rc = -1;
  }
  j->b->synchronize(ex);
  for (int i = 0; i < 3; i++)
    gs_alloc_free(j->a, t[i]);
  j->b->exec_destroy(ex);
  return NULL;
}

static void *vjob_block(void *u, size_t bytes) {
  vjob *j = u;
  gs_alloc_tag tag = {.layer = "job", .role = GS_ROLE_WORKSPACE};
  void *p = NULL;
  return gs_alloc_malloc(j->a, bytes, &tag, &p, NULL) ? NULL : p;
}

/* job B: the bf16 MLP, 50 steps, inside its vdev */
static void *vjob_train(void *p) {
  vjob *j = p;
  gs_exec_config cfg = {.threads = 1, .device_index = 0};
  gs_exec *ex = NULL;
  if ((j->rc = j->b->exec_create(j->b, &cfg, &ex))) {
    snprintf(j->msg, sizeof j->msg, "exec_create: %d", j->rc);
    return NULL;
  }
  j->rc = gs_gpu_mlp_train(j->b, ex, GS_BF16, 50, vjob_block, j, j->losses);
  if (j->rc)
    snprintf(j->msg, sizeof j->msg, "training failed: %d", j->rc);
  else if (!(j->losses[49] < 0.7f * j->losses[0])) {
    snprintf(j->msg, sizeof j->msg, "did not learn: %.4g -> %.4g", j->losses[0], j->losses[49]);
    j->rc = -1;
  }
  j->b->exec_destroy(ex);
  gs_alloc_free_all(j->a);
  return NULL;
}

static int check_vdevs(gs_backend *gpu, char *msg, size_t len) {
  uint64_t limit_b = gs_gpu_mlp_bytes(gpu, GS_BF16) + 4 * MIB;
  limit_b = (limit_b + MIB - 1) / MIB * MIB;
  vjob a = {.b = gpu}, b = {.b = gpu};
  int rc = gs_alloc_create(gpu, 0, 64 * MIB, GS_POLICY_GROWTH, &a.a);
  if (!rc)
    rc = gs_alloc_create(gpu, 0, limit_b, GS_POLICY_PREALLOCATE, &b.a);
  if (rc) {
    snprintf(msg, len, "gs_alloc_create: %d", rc);
    if (a.a)
      gs_alloc_destroy(a.a);
    return rc;
  }
  pthread_t ta, tb;
  pthread_create(&ta, NULL, vjob_over_quota, &a);
  pthread_create(&tb, NULL, vjob_train, &b);
  pthread_join(ta, NULL);
  pthread_join(tb, NULL);
  gs_alloc_stats sa, sb;
  gs_alloc_stats_get(a.a, &sa);
  gs_alloc_stats_get(b.a, &sb);
  int bad = 0;
  if (a.rc)
    snprintf(msg, len, "job A (over quota): %s", a.msg), bad++;
  else if (b.rc)
    snprintf(msg, len, "job B (training): %s", b.msg), bad++;
  else if (sa.peak_reserved > 64 * MIB || sa.peak_in_use > 64 * MIB)
    snprintf(msg, len, "vdev A peaks %llu/%llu past 64 MiB",
             (unsigned long long)sa.peak_reserved, (unsigned long long)sa.peak_in_use), bad++;
  else if (sb.peak_reserved > limit_b || sb.peak_in_use > limit_b)
    snprintf(msg, len, "vdev B peaks %llu/%llu past %llu", (unsigned long long)sb.peak_reserved,
             (unsigned long long)sb.peak_in_use, (unsigned long long)limit_b), bad++;
  else
    printf("     vdev A refused %llu bytes (quota, %llu in use of 64 MiB); vdev B trained, "
           "loss %.4f -> %.4f, peak %llu of %llu bytes\n",
           (unsigned long long)a.oom.requested, (unsigned long long)a.oom.stats.in_use,
           b.losses[0], b.losses[49], (unsigned long long)sb.peak_in_use,
           (unsigned long long)limit_b);
  gs_alloc_destroy(a.a);
  gs_alloc_destroy(b.a);
  return bad;
}

int main(int argc, char **argv) {
  gs_gpu_env env;
  if (gs_gpu_env_open(&env) != 0) {
    printf("no CUDA device: %s\n0 passed, 1 failed\n", env.why);
    return 2;
  }
  const gs_dtype all[3] = {GS_F32, GS_F16, GS_BF16};
  char msg[512];
  for (size_t i = 0; i < gs_gpu_ncases; i++) {
    const gs_gpu_case *c = &gs_gpu_cases[i];
    if (!wanted(argc, argv, c->name))
      continue;
    for (int d = 0; d < (c->per_dtype ? 3 : 1); d++) {
      msg[0] = '\0';
      int rc = c->fn(&env, all[d], msg, sizeof msg);
      report(c->name, c->per_dtype ? gs_dtype_name(all[d]) : "-", rc, msg);
    }
  }
  if (wanted(argc, argv, "vdevs")) {
    msg[0] = '\0';
    report("vdevs", "-", check_vdevs(env.gpu, msg, sizeof msg), msg);
  }
  gs_gpu_env_close(&env);
  printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
