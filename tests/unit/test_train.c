/*
 * test_train.c: the training runtime (runtime/train.c) on the CPU
 * backend and a real vdev allocator.
 *
 * What gpushare promises a tenant, checked end to end on small models:
 * gradient accumulation equals one big batch, fp16 loss scaling skips an
 * overflowing step and grows after its interval, mixed precision lands near
 * fp32, the same seed gives the same bits, a resumed job reproduces an
 * uninterrupted one bit for bit, an allocation failure names the tensor and
 * frees everything, and the MLP learns Fashion-MNIST.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/alloc.h"
#include "runtime/data.h"
#include "runtime/safetensors.h"
#include "runtime/train.h"
#include "tests/unit/test_train_run.h"

#define MAX_STEPS_REC 4096


TestSuite(train, .init = run_setup, .fini = run_teardown, .timeout = 600);

typedef struct rec {
  size_t n;
  float loss[MAX_STEPS_REC];
  float scale[MAX_STEPS_REC];
  uint64_t skipped[MAX_STEPS_REC];
  uint32_t epochs_seen;
  gs_train_epoch last_epoch;
} rec;

static void rec_step(void *u, const gs_train_progress *p) {
  rec *r = u;
  if (r->n < MAX_STEPS_REC) {
    r->loss[r->n] = p->loss;
    r->scale[r->n] = p->loss_scale;
    r->skipped[r->n] = p->skipped_steps;
    r->n++;
  }
}
static void rec_epoch(void *u, const gs_train_epoch *m) {
  rec *r = u;
  r->epochs_seen++;
  r->last_epoch = *m;
}

/* 8x8x1 images, 4 classes; train and test are disjoint draws of one task. */
static void synth(uint64_t n_train, uint64_t n_test, gs_dataset *train, gs_dataset *test) {
  gs_dataset all;
  cr_assert_eq(gs_dataset_synthetic(n_train + n_test, 8, 8, 1, 4, 11, &all, &e), 0, "%s", e.msg);
  cr_assert_eq(gs_dataset_slice(&all, 0, n_train, train, &e), 0);
  if (test) cr_assert_eq(gs_dataset_slice(&all, n_train, n_test, test, &e), 0);
  gs_dataset_free(&all);
}

static tspec *small_mlp(uint32_t batch, uint32_t accum, uint32_t epochs, gs_precision precision) {
  tspec *t = ts_new(8, 8, 1);
  ts_flatten(t);
  ts_dense(t, 16, true);
  ts_dense(t, 4, false);
  ts_recipe(t, batch, accum, epochs, 5, precision);
  ts_adam(t, 3e-3f);
  return t;
}

/* Train spec s on tr to the end on `threads` threads, each step's loss into
 * r; frees s. */
static void train_rec(tspec *s, const gs_dataset *tr, int threads, rec *r) {
  gs_train_options o = {.threads = threads, .on_step = rec_step, .user = r};
  gs_train *t = make(s, tr, NULL, &o);
  cr_assert_eq(gs_train_run(t, &e), 0, "%s", e.msg);
  gs_train_destroy(t);
  free(s);
}

Test(train, accumulation_equals_one_big_batch) {
  gs_dataset tr;
  synth(1024, 0, &tr, NULL);
  tspec *big = small_mlp(64, 1, 1, GS_PRECISION_FLOAT32);
  tspec *acc = small_mlp(16, 4, 1, GS_PRECISION_FLOAT32);
  ts_sgd(big, 0.1f, 0.9f);
  ts_sgd(acc, 0.1f, 0.9f);
  gs_train_options o = {.threads = 1, .has_max_steps = true, .max_steps = 10};
  rec ra = {0}, rb = {0};
  o.on_step = rec_step;
  o.user = &ra;
  gs_train *a = make(big, &tr, NULL, &o);
  o.user = &rb;
  gs_train *b = make(acc, &tr, NULL, &o);
  cr_assert_eq(gs_train_run(a, &e), 0, "%s", e.msg);
  cr_assert_eq(gs_train_run(b, &e), 0, "%s", e.msg);
  cr_assert_eq(ra.n, 10);
  cr_assert_eq(rb.n, 10);
  size_t na, nb;
  float *wa = params(a, &na), *wb = params(b, &nb);
  cr_assert_eq(na, nb);
  double num = 0, den = 0;
  for (size_t i = 0; i < na; i++) {
    num += ((double)wa[i] - wb[i]) * ((double)wa[i] - wb[i]);
    den += (double)wa[i] * wa[i];
  }
  double rel = sqrt(num / den);
  cr_expect_lt(rel, 1e-5, "k=4 x 16 vs k=1 x 64: relative weight error %g", rel);
  for (size_t i = 0; i < 10; i++)
    cr_expect_lt(fabsf(ra.loss[i] - rb.loss[i]), 1e-5f * (1 + fabsf(ra.loss[i])),
                 "step %zu loss %g vs %g", i + 1, ra.loss[i], rb.loss[i]);
  free(wa);
  free(wb);
  gs_train_destroy(a);
  gs_train_destroy(b);
  free(big);
  free(acc);
  gs_dataset_free(&tr);
}

Test(train, fp16_overflow_skips_step_and_halves_scale) {
  gs_dataset tr;
  synth(256, 0, &tr, NULL);
  /* 4 steps per epoch, 60 epochs: from 1e38 about 110 halvings bring the
   * scaled fp16 gradients back into range. */
  tspec *s = small_mlp(32, 2, 60, GS_PRECISION_MIXED_FLOAT16);
  ts_loss_scale(s, 1e38f, 2000);
  rec r = {0};
  gs_train_options o = {.threads = 1, .on_step = rec_step, .user = &r};
  gs_train *t = make(s, &tr, NULL, &o);
  size_t n;
  float *before = params(t, &n);
  bool done;
  cr_assert_eq(gs_train_steps(t, 1, &done, &e), 0, "%s", e.msg);
  float *after = params(t, &n);
  cr_expect_eq(memcmp(before, after, n * sizeof(float)), 0, "a skipped step leaves the weights");
  gs_train_result res;
  gs_train_result_get(t, &res);
  cr_expect_eq(res.skipped_steps, 1);
  cr_expect_eq(res.loss_scale, 1e38f * 0.5f, "scale %g", res.loss_scale);
  cr_expect_eq(r.skipped[0], 1);
  cr_expect(isfinite(r.loss[0]), "the reported loss is the unscaled fp32 loss");
  /* The scale keeps halving until gradients fit, then training proceeds. */
  cr_assert_eq(gs_train_run(t, &e), 0, "%s", e.msg);
  gs_train_result_get(t, &res);
  cr_log_info("1e38 start: %llu of %llu steps skipped, final scale %g",
              (unsigned long long)res.skipped_steps, (unsigned long long)res.steps,
              res.loss_scale);
  cr_expect_gt(res.skipped_steps, 100);
  cr_expect_lt(res.skipped_steps, res.steps, "the last steps are not skipped");
  cr_expect_lt(res.loss_scale, 1e8f, "halved down to where fp16 gradients fit");
  float *end = params(t, &n);
  cr_expect_neq(memcmp(before, end, n * sizeof(float)), 0, "unskipped steps move the weights");
  free(before);
  free(after);
  free(end);
  gs_train_destroy(t);
  free(s);
  gs_dataset_free(&tr);
}

/* A run whose every step overflowed never trained: it ends in an error that
 * says so, not as a success at chance accuracy. Each epoch reports its own
 * skipped steps, not the run's total so far. */
Test(train, fp16_every_step_skipped_fails_the_run) {
  gs_dataset tr;
  synth(256, 0, &tr, NULL);
  /* 4 steps per epoch, 3 epochs: from 3e38, 12 halvings stay far above
   * where fp16 gradients fit, so every step is skipped. */
  tspec *s = small_mlp(32, 2, 3, GS_PRECISION_MIXED_FLOAT16);
  ts_loss_scale(s, 3e38f, 2000);
  rec r = {0};
  gs_train_options o = {.threads = 1, .on_step = rec_step, .on_epoch = rec_epoch, .user = &r};
  gs_train *t = make(s, &tr, NULL, &o);
  int rc = gs_train_run(t, &e);
  cr_expect_eq(rc, -EBUSY, "rc %d", rc);
  cr_expect_eq(e.code, GS_FAILED_PRECONDITION);
  cr_expect_str_eq(e.field, "precision");
  cr_expect(strstr(e.msg, "all 12 optimizer steps of the run were skipped") != NULL, "%s", e.msg);
  cr_expect(strstr(e.msg, "MIXED_BFLOAT16 or FLOAT32") != NULL, "%s", e.msg);
  cr_expect(strstr(e.msg, "lower learning rate") != NULL, "%s", e.msg);
  gs_train_result res;
  gs_train_result_get(t, &res);
  cr_expect_eq(res.steps, 12);
  cr_expect_eq(res.skipped_steps, 12, "the result counts the whole run");
  cr_expect_eq(r.epochs_seen, 3);
  cr_expect_eq(r.last_epoch.skipped_steps, 4, "epoch 3 skipped its own 4 steps, not 12");
  gs_train_destroy(t);
  free(s);

  /* The same run in bf16 has no loss scale and trains. */
  s = small_mlp(32, 2, 3, GS_PRECISION_MIXED_BFLOAT16);
  memset(&r, 0, sizeof r);
  t = make(s, &tr, NULL, &o);
  cr_expect_eq(gs_train_run(t, &e), 0, "%s", e.msg);
  cr_expect_eq(r.last_epoch.skipped_steps, 0);
  gs_train_destroy(t);
  free(s);
  gs_dataset_free(&tr);
}

Test(train, fp16_scale_grows_after_interval) {
  gs_dataset tr;
  synth(512, 0, &tr, NULL);
  tspec *s = small_mlp(32, 1, 1, GS_PRECISION_MIXED_FLOAT16);
  ts_loss_scale(s, 256.0f, 3);
  rec r = {0};
  gs_train_options o = {.threads = 1, .on_step = rec_step, .user = &r};
  gs_train *t = make(s, &tr, NULL, &o);
  cr_assert_eq(gs_train_steps(t, 7, NULL, &e), 0, "%s", e.msg);
  cr_assert_eq(r.n, 7);
  cr_expect_eq(r.scale[0], 256.0f);
  cr_expect_eq(r.scale[1], 256.0f);
  cr_expect_eq(r.scale[2], 512.0f, "x2 after 3 finite steps, got %g", r.scale[2]);
  cr_expect_eq(r.scale[5], 1024.0f, "got %g", r.scale[5]);
  cr_expect_eq(r.scale[6], 1024.0f);
  cr_expect_eq(r.skipped[6], 0);
  gs_train_destroy(t);
  free(s);
  gs_dataset_free(&tr);
}

/* Final mean train loss of the last epoch and test accuracy. */
static void train_synthetic(gs_precision precision, float *loss, float *acc) {
  gs_dataset tr, te;
  synth(2048, 512, &tr, &te);
  tspec *s = small_mlp(32, 1, 3, precision);
  rec r = {0};
  gs_train_options o = {.threads = 1, .on_epoch = rec_epoch, .user = &r};
  gs_train *t = make(s, &tr, &te, &o);
  cr_assert_eq(gs_train_run(t, &e), 0, "%s", e.msg);
  cr_assert_eq(r.epochs_seen, 3);
  *loss = r.last_epoch.train_loss;
  *acc = r.last_epoch.test_accuracy;
  gs_train_destroy(t);
  free(s);
  gs_dataset_free(&tr);
  gs_dataset_free(&te);
}

Test(train, mixed_precision_tracks_fp32) {
  float l32, a32, lbf, abf, l16, a16;
  train_synthetic(GS_PRECISION_FLOAT32, &l32, &a32);
  train_synthetic(GS_PRECISION_MIXED_BFLOAT16, &lbf, &abf);
  train_synthetic(GS_PRECISION_MIXED_FLOAT16, &l16, &a16);
  cr_log_info("final train loss: fp32 %.5f bf16 %.5f fp16 %.5f; test acc %.4f %.4f %.4f", l32,
              lbf, l16, a32, abf, a16);
  cr_expect_lt(l32, 0.2f, "the synthetic task is learnable (fp32 loss %g)", l32);
  /* bf16 keeps 8 bits of mantissa: its final loss stays within 0.05 (absolute)
   * of fp32's; fp16 (11 bits) within 0.02. */
  cr_expect_lt(fabsf(lbf - l32), 0.05f, "bf16 %g vs fp32 %g", lbf, l32);
  cr_expect_lt(fabsf(l16 - l32), 0.02f, "fp16 %g vs fp32 %g", l16, l32);
  cr_expect_gt(abf, a32 - 0.03f);
  cr_expect_gt(a16, a32 - 0.03f);
}

Test(train, same_seed_same_bits) {
  gs_dataset tr;
  synth(512, 0, &tr, NULL);
  rec *r = calloc(3, sizeof *r);
  for (int i = 0; i < 3; i++) {
    tspec *s = small_mlp(16, 2, 2, GS_PRECISION_MIXED_BFLOAT16);
    if (i == 2) s->spec.seed = 6;
    train_rec(s, &tr, 2, &r[i]);
  }
  cr_assert_eq(r[0].n, 32);
  cr_assert_eq(r[1].n, r[0].n);
  cr_expect_eq(memcmp(r[0].loss, r[1].loss, r[0].n * sizeof(float)), 0,
               "same seed: bit-identical losses");
  cr_expect_neq(memcmp(r[0].loss, r[2].loss, r[0].n * sizeof(float)), 0,
                "another seed: another run");
  free(r);
  gs_dataset_free(&tr);
}

/* The batch gather runs on the exec's threads (host_parallel): with 28x28
 * examples a batch of 16 is split in two, and two threads must train on the
 * very batches one thread does (every GEMM here, 16 x 784 x 4 = 50,176
 * multiply-adds at most, is under GS_CPU_GEMM_GRAIN, 65,536, and runs whole
 * on one thread, so the losses are bit-identical only if the batches are;
 * a lower grain would split them and fail this test for that reason). */
Test(train, gather_split_over_threads_same_bits) {
  cpu_set_t cpus; /* the exec clamps its threads to the CPUs it may use */
  if (sched_getaffinity(0, sizeof cpus, &cpus) == 0 && CPU_COUNT(&cpus) < 2)
    cr_skip_test("needs two CPUs in this process's affinity set, it has %d: nothing is split",
                 CPU_COUNT(&cpus));
  gs_dataset tr;
  cr_assert_eq(gs_dataset_synthetic(256, 28, 28, 1, 4, 11, &tr, &e), 0, "%s", e.msg);
  rec *r = calloc(2, sizeof *r);
  for (int i = 0; i < 2; i++) {
    tspec *s = ts_new(28, 28, 1);
    ts_flatten(s);
    ts_dense(s, 4, true);
    ts_dense(s, 4, false);
    ts_recipe(s, 16, 1, 1, 5, GS_PRECISION_FLOAT32);
    ts_adam(s, 3e-3f);
    train_rec(s, &tr, i + 1, &r[i]);
  }
  cr_assert_eq(r[0].n, 16);
  cr_assert_eq(r[1].n, r[0].n);
  for (size_t k = 0; k < r[0].n; k++)
    cr_expect_eq(r[1].loss[k], r[0].loss[k], "step %zu: loss %.9g on 2 threads, %.9g on 1", k,
                 (double)r[1].loss[k], (double)r[0].loss[k]);
  free(r);
  gs_dataset_free(&tr);
}

static void resume_case(gs_precision precision, uint32_t threads) {
  gs_dataset tr, te;
  synth(512, 64, &tr, &te);
  const uint64_t S = 40, N = 21; /* 16 steps per epoch: stops mid-epoch 2 */
  tspec *s = small_mlp(16, 2, 3, precision);
  ts_loss_scale(s, 1024.0f, 4);
  rec *full = calloc(1, sizeof *full), *part = calloc(1, sizeof *part);
  gs_train_options o = {.threads = (int)threads, .on_step = rec_step};
  resumed r;
  resume_runs(s, &tr, &te, o, full, part, S, N, &r);
  cr_assert_eq(full->n, S);
  cr_assert_eq(part->n, S, "N steps, then S - N after the resume");
  cr_expect_eq(memcmp(full->loss, part->loss, S * sizeof(float)), 0,
               "the loss sequence continues as if never stopped");
  cr_expect_eq(memcmp(r.w_full, r.w_res, r.n * sizeof(float)), 0, "bit-identical final weights");
  cr_expect_eq(r.res.steps, S);
  cr_expect_eq(r.res.loss_scale, r.full.loss_scale);
  cr_expect_eq(r.res.skipped_steps, r.full.skipped_steps);
  cr_expect_eq(r.res.test_accuracy, r.full.test_accuracy);
  free(r.w_full);
  free(r.w_res);
  free(full);
  free(part);
  free(s);
  gs_dataset_free(&tr);
  gs_dataset_free(&te);
}

Test(train, resume_is_bit_exact_fp32) { resume_case(GS_PRECISION_FLOAT32, 1); }

/* Periodic checkpoints are written by a thread of their own while the job
 * steps on: a job stopped between them (as by a crash of the job, or its
 * executor's shutdown destroying it) leaves the last one whole, and a resume
 * from it continues exactly. */
Test(train, background_checkpoint_resumes_exactly) {
  gs_dataset tr, te;
  synth(512, 64, &tr, &te);
  char path[] = "/tmp/gs_test_train_bgckpt_XXXXXX";
  int fd = mkstemp(path);
  cr_assert_geq(fd, 0);
  close(fd);
  const uint64_t S = 30;
  tspec *s = small_mlp(16, 1, 3, GS_PRECISION_FLOAT32);
  rec *full = calloc(1, sizeof *full), *part = calloc(1, sizeof *part);
  gs_train_options o = {.threads = 2, .on_step = rec_step, .user = full,
                        .has_max_steps = true, .max_steps = S};
  gs_train *t = make(s, &tr, &te, &o);
  cr_assert_eq(gs_train_run(t, &e), 0, "%s", e.msg);
  size_t n;
  float *w_full = params(t, &n);
  gs_train_destroy(t);

  o.user = part;
  o.checkpoint_path = path;
  o.checkpoint_every = 5;
  t = make(s, &tr, &te, &o);
  bool done = false;
  cr_assert_eq(gs_train_steps(t, 12, &done, &e), 0, "%s", e.msg); /* last at step 10 */
  cr_assert(!done);
  gs_train_destroy(t); /* waits for the write in flight */
  part->n = 10;         /* what a resume replays from */
  o.checkpoint_path = NULL;
  o.resume_path = path;
  t = make(s, &tr, &te, &o);
  gs_train_result r;
  gs_train_result_get(t, &r);
  cr_expect_eq(r.steps, 10, "the checkpoint of step 10, written in the background");
  cr_assert_eq(gs_train_run(t, &e), 0, "%s", e.msg);
  float *w_res = params(t, &n);
  gs_train_destroy(t);
  cr_assert_eq(part->n, S);
  cr_expect_eq(memcmp(full->loss, part->loss, S * sizeof(float)), 0,
               "the loss sequence continues as if never stopped");
  cr_expect_eq(memcmp(w_full, w_res, n * sizeof(float)), 0, "bit-identical final weights");
  free(w_full), free(w_res), free(full), free(part), free(s);
  unlink(path);
  gs_dataset_free(&tr);
  gs_dataset_free(&te);
}
Test(train, resume_is_bit_exact_fp16) { resume_case(GS_PRECISION_MIXED_FLOAT16, 2); }

/* A COSINE schedule's rates depend on the run's total steps: a resume with
 * another run length is refused with the field and both horizons, while
 * one with the same length, or a CONSTANT schedule, resumes. */
Test(train, resume_keeps_the_cosine_horizon) {
  gs_dataset tr;
  synth(256, 0, &tr, NULL);
  char path[] = "/tmp/gs_test_train_ckpt_XXXXXX";
  int fd = mkstemp(path);
  cr_assert_geq(fd, 0);
  close(fd);
  /* 16 steps per epoch, 2 epochs: a horizon of 32 */
  tspec *s = small_mlp(16, 1, 2, GS_PRECISION_FLOAT32);
  s->spec.optimizer.has_schedule = true;
  s->spec.optimizer.schedule.kind = GS_LR_COSINE;
  s->spec.optimizer.schedule.final_fraction = 0.1f;
  gs_train_options o = {.threads = 1};
  gs_train *t = make(s, &tr, NULL, &o);
  cr_assert_eq(gs_train_steps(t, 5, NULL, &e), 0, "%s", e.msg);
  cr_assert_eq(gs_train_checkpoint(t, path, &e), 0, "%s", e.msg);
  gs_train_destroy(t);
  gs_train_failure f;

  o.resume_path = path;
  o.epochs = 3; /* 48 steps */
  cr_expect_lt(gs_train_create(&s->spec, B, A, &tr, NULL, &o, &t, &f, &e), 0);
  cr_expect_null(t);
  cr_expect_eq(e.code, GS_FAILED_PRECONDITION);
  cr_expect_str_eq(e.field, "epochs");
  cr_expect(strstr(e.msg, "a run of 32 optimizer steps") && strstr(e.msg, "this run has 48") &&
                strstr(e.msg, "epochs 3 x 16 steps per epoch") && strstr(e.msg, "COSINE"),
            "%s", e.msg);

  o.epochs = 0;
  o.has_max_steps = true;
  o.max_steps = 20;
  cr_expect_lt(gs_train_create(&s->spec, B, A, &tr, NULL, &o, &t, &f, &e), 0);
  cr_expect_str_eq(e.field, "max_steps");
  cr_expect(strstr(e.msg, "this run has 20 (max_steps 20)"), "%s", e.msg);
  gs_alloc_stats st;
  gs_alloc_stats_get(A, &st);
  cr_expect_eq(st.in_use, 0, "a refused resume frees the job");

  /* The same length (max_steps past the epochs changes nothing) resumes. */
  o.max_steps = 100;
  t = make(s, &tr, NULL, &o);
  cr_expect_eq(gs_train_run(t, &e), 0, "%s", e.msg);
  gs_train_result res;
  gs_train_result_get(t, &res);
  cr_expect_eq(res.steps, 32);
  gs_train_destroy(t);

  /* A CONSTANT schedule does not depend on the length: a longer run resumes. */
  s->spec.optimizer.has_schedule = false;
  o.resume_path = NULL;
  o.has_max_steps = false;
  t = make(s, &tr, NULL, &o);
  cr_assert_eq(gs_train_steps(t, 5, NULL, &e), 0, "%s", e.msg);
  cr_assert_eq(gs_train_checkpoint(t, path, &e), 0, "%s", e.msg);
  gs_train_destroy(t);
  o.resume_path = path;
  o.epochs = 3;
  t = make(s, &tr, NULL, &o);
  cr_expect_eq(gs_train_total_steps(t), 48);
  gs_train_destroy(t);

  unlink(path);
  free(s);
  gs_dataset_free(&tr);
}

Test(train, resume_refuses_another_model) {
  gs_dataset tr;
  synth(256, 0, &tr, NULL);
  char path[] = "/tmp/gs_test_train_ckpt_XXXXXX";
  int fd = mkstemp(path);
  cr_assert_geq(fd, 0);
  close(fd);
  tspec *s = small_mlp(16, 1, 1, GS_PRECISION_FLOAT32);
  gs_train_options o = {.threads = 1};
  gs_train *t = make(s, &tr, NULL, &o);
  cr_assert_eq(gs_train_steps(t, 2, NULL, &e), 0);
  cr_assert_eq(gs_train_checkpoint(t, path, &e), 0, "%s", e.msg);
  gs_train_destroy(t);
  s->layer[1].units = 24; /* dense_1 is now (64, 24) */
  o.resume_path = path;
  gs_train_failure f;
  cr_expect_lt(gs_train_create(&s->spec, B, A, &tr, NULL, &o, &t, &f, &e), 0);
  cr_expect_null(t);
  cr_expect(strstr(e.field, "dense_1.kernel"), "field %s: %s", e.field, e.msg);
  gs_alloc_stats st;
  gs_alloc_stats_get(A, &st);
  cr_expect_eq(st.in_use, 0, "a refused resume frees the job");
  unlink(path);
  free(s);
  gs_dataset_free(&tr);
}

Test(train, oom_names_the_tensor_and_frees_everything) {
  gs_alloc *small;
  cr_assert_eq(gs_alloc_create(B, 0, 1u << 20, GS_POLICY_GROWTH, &small), 0);
  gs_dataset tr;
  cr_assert_eq(gs_dataset_synthetic(128, 28, 28, 1, 10, 1, &tr, &e), 0);
  tspec *s = ts_new(28, 28, 1);
  ts_flatten(s);
  ts_dense(s, 256, true);
  ts_dense(s, 10, false);
  ts_recipe(s, 32, 1, 1, 1, GS_PRECISION_FLOAT32);
  gs_train *t = (gs_train *)1;
  gs_train_failure f;
  int rc = gs_train_create(&s->spec, B, small, &tr, NULL, NULL, &t, &f, &e);
  cr_assert_lt(rc, 0);
  cr_expect_null(t);
  cr_expect_eq(e.code, GS_RESOURCE_EXHAUSTED);
  cr_expect(f.oom);
  cr_expect_str_eq(f.layer, "dense_1");
  cr_expect_eq(f.role, GS_ROLE_GRADIENTS, "weights fit (784 KiB), their gradients do not");
  cr_expect_str_eq(f.shape, "(784, 256)");
  cr_expect_eq(f.bytes, 784u * 256 * 4);
  cr_expect_eq(f.why.cause, GS_OOM_QUOTA);
  cr_expect_str_eq(e.field, "model.layer[1]");
  cr_expect(strstr(e.msg, "dense_1.kernel") && strstr(e.msg, "gradients") &&
                strstr(e.msg, "802816"),
            "%s", e.msg);
  gs_alloc_stats st;
  gs_alloc_stats_get(small, &st);
  cr_expect_eq(st.in_use, 0, "everything allocated was freed");
  cr_expect_eq(st.live_blocks, 0);
  gs_alloc_destroy(small);
  free(s);
  gs_dataset_free(&tr);
}

Test(train, spec_and_dataset_errors) {
  gs_dataset tr, three;
  synth(64, 0, &tr, NULL);
  cr_assert_eq(gs_dataset_synthetic(64, 8, 8, 1, 3, 1, &three, &e), 0);
  tspec *s = small_mlp(16, 1, 1, GS_PRECISION_FLOAT32);
  gs_train *t;
  cr_expect_lt(gs_train_create(&s->spec, B, A, &three, NULL, NULL, &t, NULL, &e), 0);
  cr_expect_str_eq(e.field, "model.layer[2].dense.units", "%s", e.msg);
  gs_dataset five;
  cr_assert_eq(gs_dataset_synthetic(64, 8, 8, 1, 5, 1, &five, &e), 0);
  cr_expect_lt(gs_train_create(&s->spec, B, A, &tr, &five, NULL, &t, NULL, &e), 0);
  cr_expect(strstr(e.msg, "test") && strstr(e.msg, "5 classes"), "%s", e.msg);
  gs_dataset_free(&five);
  /* A test set whose labels stop below the model's classes is fine. */
  cr_expect_eq(gs_train_create(&s->spec, B, A, &tr, &three, NULL, &t, NULL, &e), 0, "%s", e.msg);
  gs_train_destroy(t);
  ts_recipe(s, 16, 8, 1, 1, 0); /* effective batch 128 > 64 examples */
  cr_expect_lt(gs_train_create(&s->spec, B, A, &tr, NULL, NULL, &t, NULL, &e), 0);
  cr_expect_str_eq(e.field, "batch_size");
  cr_expect(strstr(e.msg, "128"), "%s", e.msg);
  gs_alloc_stats st;
  gs_alloc_stats_get(A, &st);
  cr_expect_eq(st.in_use, 0);
  free(s);
  gs_dataset_free(&tr);
  gs_dataset_free(&three);
}

Test(train, cancel_and_max_steps) {
  gs_dataset tr, te;
  synth(512, 64, &tr, &te);
  tspec *s = small_mlp(16, 1, 5, GS_PRECISION_FLOAT32);
  atomic_int cancel = 1;
  gs_train_options o = {.threads = 1, .cancel = &cancel};
  gs_train *t = make(s, &tr, &te, &o);
  cr_assert_eq(gs_train_total_steps(t), 5 * 32);
  cr_assert_eq(gs_train_run(t, &e), 0);
  gs_train_result r;
  gs_train_result_get(t, &r);
  cr_expect(r.cancelled);
  cr_expect_eq(r.steps, 0);
  gs_train_destroy(t);
  o.cancel = NULL;
  o.has_max_steps = true;
  o.max_steps = 40; /* stops 8 steps into epoch 2, still evaluated */
  t = make(s, &tr, &te, &o);
  cr_assert_eq(gs_train_run(t, &e), 0);
  gs_train_result_get(t, &r);
  cr_expect(!r.cancelled);
  cr_expect_eq(r.steps, 40);
  cr_expect_eq(r.epochs_done, 1);
  cr_expect(r.test_accuracy >= 0.0f && r.test_accuracy <= 1.0f, "%g", r.test_accuracy);
  cr_expect_gt(r.peak_memory_bytes, 0);
  gs_train_destroy(t);
  free(s);
  gs_dataset_free(&tr);
  gs_dataset_free(&te);
}

Test(train, export_safetensors_names_and_values) {
  gs_dataset tr;
  synth(256, 0, &tr, NULL);
  tspec *s = small_mlp(16, 1, 1, GS_PRECISION_MIXED_BFLOAT16);
  gs_train *t = make(s, &tr, NULL, NULL);
  cr_assert_eq(gs_train_steps(t, 3, NULL, &e), 0);
  char path[] = "/tmp/gs_test_train_st_XXXXXX";
  int fd = mkstemp(path);
  cr_assert_geq(fd, 0);
  close(fd);
  cr_assert_eq(gs_train_export_safetensors(t, path, &e), 0, "%s", e.msg);
  gs_safetensors *st;
  cr_assert_eq(gs_safetensors_read(path, &st, &e), 0, "%s", e.msg);
  cr_expect_eq(st->count, 4);
  const gs_ckpt_tensor *k = gs_safetensors_find(st, "dense_1.kernel");
  const gs_ckpt_tensor *b = gs_safetensors_find(st, "dense_2.bias");
  cr_assert_not_null(k);
  cr_assert_not_null(b);
  cr_expect_eq(k->dtype, GS_CKPT_F32);
  cr_expect_eq(k->rank, 2);
  cr_expect_eq(k->shape[0], 64);
  cr_expect_eq(k->shape[1], 16);
  cr_expect_eq(b->shape[0], 4);
  float w[64 * 16];
  cr_assert_eq(gs_train_read_param(t, 1, 0, w, 64 * 16), 0);
  cr_expect_eq(memcmp(k->data, w, sizeof w), 0, "the fp32 masters are exported");
  cr_expect_str_eq(gs_safetensors_meta(st, "step"), "3");
  gs_safetensors_free(st);
  unlink(path);
  gs_train_destroy(t);
  free(s);
  gs_dataset_free(&tr);
}

Test(train, conv_depthwise_pool_gap_learn) {
  gs_dataset tr, te;
  synth(1024, 256, &tr, &te);
  tspec *s = ts_new(8, 8, 1);
  ts_conv(s, 8, 3, 1, true, true);
  ts_pool(s, 2, 0);
  ts_dw(s, 3, 1, true, true);
  ts_conv(s, 16, 1, 1, true, false);
  ts_relu(s);
  ts_gap(s);
  ts_dense(s, 4, false);
  ts_recipe(s, 32, 1, 4, 2, GS_PRECISION_FLOAT32);
  ts_adam(s, 1e-2f);
  rec r = {0};
  gs_train_options o = {.threads = 1, .on_step = rec_step,
                        .on_epoch = rec_epoch, .user = &r};
  gs_train *t = make(s, &tr, &te, &o);
  cr_assert_eq(gs_train_run(t, &e), 0, "%s", e.msg);
  cr_log_info("conv net: first loss %.4f, last epoch %.4f, test acc %.4f", r.loss[0],
              r.last_epoch.train_loss, r.last_epoch.test_accuracy);
  cr_expect_lt(r.last_epoch.train_loss, 0.7f * r.loss[0], "the loss falls: %g -> %g",
               r.loss[0], r.last_epoch.train_loss);
  cr_expect_gt(r.last_epoch.test_accuracy, 0.5f, "above chance (0.25): %g",
               r.last_epoch.test_accuracy);
  gs_train_destroy(t);
  free(s);
  gs_dataset_free(&tr);
  gs_dataset_free(&te);
}

Test(train, fashion_mnist_mlp_one_epoch_on_5000) {
  const char *dir = GS_FASHION_DIR;
  char ti[512], tl[512], vi[512], vl[512];
  snprintf(ti, sizeof ti, "%s/train-images-idx3-ubyte.gz", dir);
  snprintf(tl, sizeof tl, "%s/train-labels-idx1-ubyte.gz", dir);
  snprintf(vi, sizeof vi, "%s/t10k-images-idx3-ubyte.gz", dir);
  snprintf(vl, sizeof vl, "%s/t10k-labels-idx1-ubyte.gz", dir);
  if (access(ti, R_OK) || access(tl, R_OK) || access(vi, R_OK) || access(vl, R_OK)) {
    cr_skip_test("Fashion-MNIST not found in %s (Debian: apt install dataset-fashion-mnist)",
                 dir);
    return;
  }
  gs_dataset full, tr, te;
  cr_assert_eq(gs_dataset_load_idx(ti, tl, &full, &e), 0, "%s", e.msg);
  cr_assert_eq(gs_dataset_slice(&full, 0, 5000, &tr, &e), 0);
  gs_dataset_free(&full);
  cr_assert_eq(gs_dataset_load_idx(vi, vl, &te, &e), 0, "%s", e.msg);
  tspec *s = ts_new(28, 28, 1);
  ts_flatten(s);
  ts_dense(s, 256, true);
  ts_dense(s, 128, true);
  ts_dense(s, 10, false);
  ts_recipe(s, 32, 1, 1, 1, GS_PRECISION_FLOAT32);
  ts_adam(s, 1e-3f);
  rec r = {0};
  gs_train_options o = {.threads = 2, .on_epoch = rec_epoch, .user = &r};
  gs_train *t = make(s, &tr, &te, &o);
  cr_assert_eq(gs_train_run(t, &e), 0, "%s", e.msg);
  cr_log_info("MLP, 5000 examples, 1 epoch: test accuracy %.4f, loss %.4f",
              r.last_epoch.test_accuracy, r.last_epoch.test_loss);
  cr_expect_eq(r.epochs_seen, 1);
  cr_expect_geq(r.last_epoch.test_accuracy, 0.75f, "test accuracy %g on the 10000 test images",
                r.last_epoch.test_accuracy);
  gs_train_destroy(t);
  free(s);
  gs_dataset_free(&tr);
  gs_dataset_free(&te);
}
