/*
 * test_train_run.h: what the training tests share to run jobs: a cpu
 * backend and a 512 MiB growth allocator per test (run_setup,
 * run_teardown), a job made or the test failed (make), its weights read
 * back (params), and the runs that check a resume (resume_runs).
 */
#ifndef GS_TEST_TRAIN_RUN_H
#define GS_TEST_TRAIN_RUN_H

#include <criterion/criterion.h>
#include <stdlib.h>
#include <unistd.h>

#include "runtime/alloc.h"
#include "runtime/train.h"
#include "tests/unit/test_train_util.h"

static gs_backend *B;
static gs_alloc *A;
static gs_err e;

static inline void run_setup(void) {
  B = gs_backend_cpu();
  cr_assert_eq(gs_alloc_create(B, 0, 512ull << 20, GS_POLICY_GROWTH, &A), 0);
  gs_err_clear(&e);
}

static inline void run_teardown(void) { gs_alloc_destroy(A); }

static inline gs_train *make(tspec *s, const gs_dataset *tr, const gs_dataset *te,
                             gs_train_options *o) {
  gs_train *t = NULL;
  gs_train_failure f;
  cr_assert_eq(gs_train_create(&s->spec, B, A, tr, te, o, &t, &f, &e), 0, "create: %s: %s",
               e.field, e.msg);
  return t;
}

/* every parameter of the job, layer by layer, as fp32 (malloc'd) */
static inline float *params(gs_train *t, size_t *count) {
  const gs_model *m = gs_train_model(t);
  size_t n = 0;
  for (uint32_t i = 0; i < m->n_layers; i++) n += m->layers[i].param_count;
  float *v = malloc(n * sizeof *v);
  cr_assert(v);
  size_t o = 0;
  for (uint32_t i = 0; i < m->n_layers; i++)
    for (uint32_t p = 0; p < m->layers[i].n_params; p++) {
      size_t c = m->layers[i].params[p].count;
      cr_assert_eq(gs_train_read_param(t, i, p, v + o, c), 0);
      o += c;
    }
  *count = n;
  return v;
}

/* What resume_runs leaves: both runs' final weights (n each, malloc'd) and
 * results. */
typedef struct resumed {
  float *w_full, *w_res;
  size_t n;
  gs_train_result full, res;
} resumed;

/* Spec s three times from options o: `steps` steps uninterrupted (o.user =
 * full); then `stop` steps writing a checkpoint every 7 steps (and at the
 * stop), and a fresh job resumed from it to `steps` (both o.user = part). */
static inline void resume_runs(tspec *s, const gs_dataset *tr, const gs_dataset *te,
                               gs_train_options o, void *full, void *part, uint64_t steps,
                               uint64_t stop, resumed *r) {
  char path[] = "/tmp/gs_test_resume_XXXXXX";
  int fd = mkstemp(path);
  cr_assert_geq(fd, 0);
  close(fd);
  o.user = full;
  o.has_max_steps = true;
  o.max_steps = steps;
  gs_train *t = make(s, tr, te, &o);
  cr_assert_eq(gs_train_run(t, &e), 0, "%s", e.msg);
  r->w_full = params(t, &r->n);
  gs_train_result_get(t, &r->full);
  gs_train_destroy(t);

  o.user = part;
  o.max_steps = stop;
  o.checkpoint_path = path;
  o.checkpoint_every = 7;
  t = make(s, tr, te, &o);
  cr_assert_eq(gs_train_run(t, &e), 0, "%s", e.msg);
  gs_train_destroy(t);

  o.max_steps = steps;
  o.checkpoint_path = NULL;
  o.resume_path = path;
  t = make(s, tr, te, &o);
  cr_assert_eq(gs_train_run(t, &e), 0, "%s", e.msg);
  r->w_res = params(t, &r->n);
  gs_train_result_get(t, &r->res);
  gs_train_destroy(t);
  unlink(path);
}

#endif
