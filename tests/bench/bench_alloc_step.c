/*
 * bench_alloc_step.c: the vdev allocator's share of a training step.
 *
 * gpushare's runtime allocates every tensor of a job once, at job start
 * (train.h), so a step should spend nothing in the allocator. This measures
 * it on the shipped examples (build/examples/NAME.pb, float32, their own
 * micro-batch, synthetic data of the same shape, CPU backend):
 *  - the allocator operations a step makes (allocations + frees counted by
 *    the allocator across the timed steps: expected 0),
 *  - the wall time of placing and freeing the job's whole buffer list (the
 *    list gs_train_buffers produces, through gs_alloc_malloc/gs_alloc_free,
 *    repeated), which is the allocator's entire cost for the job,
 *  - the mean time of one optimizer step,
 * and prints the share per step (allocator ns per step / step ns) and the
 * one-time cost amortised over one epoch of 60000 examples. Per-operation
 * costs against malloc/free are bench_alloc's. It asserts nothing.
 *
 *   bench_alloc_step [steps] [threads]     (defaults 5, 1)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "proto/gpushare.pb-c.h"
#include "runtime/alloc.h"
#include "runtime/data.h"
#include "convert/spec_pb.h"
#include "runtime/train.h"

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

typedef struct place_ctx {
  gs_alloc *a;
  void *ptr[4096];
  size_t n;
} place_ctx;

static int place(void *u, const gs_train_buffer *bf) {
  place_ctx *c = u;
  if (c->n == sizeof c->ptr / sizeof c->ptr[0]) return -1;
  gs_alloc_tag tag = {.layer = bf->layer ? bf->layer->name : "job", .role = bf->role};
  return gs_alloc_malloc(c->a, (size_t)bf->bytes, &tag, &c->ptr[c->n++], NULL);
}

static int bench(const char *dir, const char *name, uint64_t steps, int threads) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s.pb", dir, name);
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "bench_alloc_step: cannot open %s (build the gs_examples target)\n", path);
    return -1;
  }
  static uint8_t buf[1 << 16];
  size_t len = fread(buf, 1, sizeof buf, f);
  fclose(f);
  Gpushare__V1__JobSpec *spec = gpushare__v1__job_spec__unpack(NULL, len, buf);
  if (!spec) return -1;
  gs_err e;
  gs_err_clear(&e);
  gs_model m;
  gs_job_spec js;
  if (gs_spec_pb_job(spec, &js, &e) || gs_model_build(&js, &m, &e)) {
    fprintf(stderr, "%s: %s\n", name, e.msg);
    return -1;
  }
  gs_backend *b = gs_backend_cpu();
  const uint32_t micro = m.recipe.batch_size;
  gs_dataset tr;
  int rc = gs_dataset_synthetic((uint64_t)micro * (steps + 1) * m.recipe.accumulation_steps,
                                m.input.h, m.input.w, m.input.c, m.classes, 1, &tr, &e);
  if (rc) goto out_model;

  /* The whole buffer list, placed and freed, repeated. */
  gs_alloc *a;
  if (gs_alloc_create(b, 0, 4ull << 30, GS_POLICY_GROWTH, &a)) goto out_data;
  place_ctx *pc = calloc(1, sizeof *pc);
  pc->a = a;
  const int reps = 200;
  double t0 = now_ns();
  size_t nbuf = 0;
  for (int r = 0; r < reps; r++) {
    pc->n = 0;
    if (gs_train_buffers(&m, &m.recipe, b, 0, place, pc)) {
      fprintf(stderr, "%s: placing the buffers failed\n", name);
      break;
    }
    nbuf = pc->n;
    for (size_t i = pc->n; i-- > 0;) gs_alloc_free(a, pc->ptr[i]);
  }
  double list_ns = (now_ns() - t0) / reps;
  free(pc);
  gs_alloc_destroy(a);

  /* Steps of the real job. */
  if (gs_alloc_create(b, 0, 4ull << 30, GS_POLICY_GROWTH, &a)) goto out_data;
  gs_train_options o = {.threads = threads};
  gs_train *t;
  gs_train_failure fail;
  if (gs_train_create(&js, b, a, &tr, NULL, &o, &t, &fail, &e)) {
    fprintf(stderr, "%s: %s\n", name, e.msg);
    gs_alloc_destroy(a);
    goto out_data;
  }
  bool done;
  gs_train_steps(t, 1, &done, &e); /* warm-up */
  gs_alloc_stats s0, s1;
  gs_alloc_stats_get(a, &s0);
  t0 = now_ns();
  if (gs_train_steps(t, steps, &done, &e)) fprintf(stderr, "%s: %s\n", name, e.msg);
  double step_ns = (now_ns() - t0) / (double)steps;
  gs_alloc_stats_get(a, &s1);
  uint64_t ops = (s1.allocations - s0.allocations) + (s1.frees - s0.frees);
  /* A step's allocator time: its operations at the mean cost of one
   * operation of the buffer list (placing or freeing). */
  double per_op = list_ns / (2.0 * (double)nbuf);
  double alloc_step_ns = (double)ops / (double)steps * per_op;
  double epoch_steps = 60000.0 / ((double)micro * m.recipe.accumulation_steps);
  printf("%-18s %7zu %10.1f %8.1f %12.2f %10.1f %12.6f %14.6f\n", name, nbuf, list_ns / 1e3,
         per_op, step_ns / 1e6, (double)ops / (double)steps, alloc_step_ns / step_ns * 100.0,
         list_ns / (epoch_steps * step_ns) * 100.0);
  gs_train_destroy(t);
  gs_alloc_destroy(a);
out_data:
  gs_dataset_free(&tr);
out_model:
  gs_model_free(&m);
  gs_spec_pb_job_free(&js);
  gpushare__v1__job_spec__free_unpacked(spec, NULL);
  return 0;
}

int main(int argc, char **argv) {
  uint64_t steps = argc > 1 ? strtoull(argv[1], NULL, 10) : 5;
  int threads = argc > 2 ? atoi(argv[2]) : 1;
  if (steps == 0) steps = 1;
  if (threads < 1) threads = 1;
  printf("allocator share of a training step (float32, CPU backend, %d thread%s, %llu steps)\n",
         threads, threads == 1 ? "" : "s", (unsigned long long)steps);
  printf("%-18s %7s %10s %8s %12s %10s %12s %14s\n", "job", "buffers", "list_us", "ns/op",
         "step_ms", "ops/step", "share_%", "epoch_share_%");
  const char *names[] = {"fashion-mlp", "fashion-cnn", "fashion-mobilenet"};
  for (size_t i = 0; i < 3; i++) bench(GS_EXAMPLES_PB_DIR, names[i], steps, threads);
  printf("list_us: placing + freeing the job's whole buffer list once (its whole allocator "
         "cost);\nshare_%%: allocator time per step / step time; epoch_share_%%: the one-time "
         "cost over one 60000-example epoch.\n");
  return 0;
}
