/*
 * test_executor.c: the real gpushare-executor, driven as gpushared drives it.
 *
 * Each test starts the built executable (GS_EXECUTOR_PATH) on one end of a
 * socketpair, as descriptor 3, with a fresh state directory and a thread
 * budget of 1, and plays the control plane: SetVdevs, StartJob with a
 * JobSpec written here in C (Flatten + Dense on a synthetic set, small
 * enough for the sanitizers), CancelJob, Shutdown, end of file. It reads the
 * FromExecutor frames the executor sends (Ready, Progress, Finished, Stats)
 * and checks what a control plane relies on: the outcome and its reason, the
 * OOM report, memory back to 0 after a job, the checkpoint and export files,
 * the exit status, and the 3:1 split of steps between vdevs with shares 75
 * and 25 (a ratio of step counts read in one run, never a duration).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kernels/backend.h"
#include "proto/executor.pb-c.h"
#include "proto/gpushare.pb-c.h"
#include "proto/wire.h"
#include "runtime/plan.h"
#include "convert/spec_pb.h"

#ifndef GS_EXECUTOR_PATH
#error "GS_EXECUTOR_PATH must name the built gpushare-executor"
#endif

#define RECV_GUARD_MS 600000 /* a hung executor fails the test instead of hanging it */

typedef Gpushare__Exec__V1__FromExecutor from_msg;

typedef struct ex {
  pid_t pid;
  int fd;
  char dir[64];
  uint64_t total_bytes;
} ex;

/* ------------------------------------------------------------ the process --- */

static from_msg *ex_recv(ex *x) {
  struct pollfd p = {.fd = x->fd, .events = POLLIN};
  int n = poll(&p, 1, RECV_GUARD_MS);
  cr_assert_gt(n, 0, "the executor sent nothing for %d s", RECV_GUARD_MS / 1000);
  uint8_t *body = NULL;
  size_t len = 0;
  int rc = gs_wire_read_frame(x->fd, GS_WIRE_MAX_FRAME, &body, &len);
  cr_assert_eq(rc, 0, "reading a frame from the executor: %s", strerror(-rc));
  from_msg *m = gpushare__exec__v1__from_executor__unpack(NULL, len, body);
  free(body);
  cr_assert_not_null(m, "a frame of %zu bytes is not a FromExecutor", len);
  return m;
}

static void ex_send(ex *x, Gpushare__Exec__V1__ToExecutor *m) {
  uint8_t *buf;
  size_t len;
  cr_assert_eq(gs_wire_frame(&m->base, &buf, &len), 0);
  cr_assert_eq(gs_wire_write_all(x->fd, buf, len), 0);
  free(buf);
}

static void ex_start(ex *x) {
  memset(x, 0, sizeof *x);
  snprintf(x->dir, sizeof x->dir, "/tmp/gs-exec-XXXXXX");
  cr_assert_not_null(mkdtemp(x->dir));
  int sv[2];
  cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    if (dup2(sv[1], 3) < 0) _exit(127); /* dup2 clears close-on-exec on fd 3 */
    execl(GS_EXECUTOR_PATH, "gpushare-executor", "--device", "cpu", "--fd", "3", "--state-dir",
          x->dir, "--threads", "1", (char *)NULL);
    _exit(127);
  }
  close(sv[1]);
  x->pid = pid;
  x->fd = sv[0];
  from_msg *m = ex_recv(x);
  cr_assert_eq(m->msg_case, GPUSHARE__EXEC__V1__FROM_EXECUTOR__MSG_READY,
               "the first message is not Ready");
  cr_assert_str_eq(m->ready->device, "cpu");
  cr_assert(m->ready->has_total_bytes && m->ready->total_bytes > 0);
  x->total_bytes = m->ready->total_bytes;
  gpushare__exec__v1__from_executor__free_unpacked(m, NULL);
}

/* Wait for the executor to exit; returns its exit status (or 128 + signal). */
static int ex_wait(ex *x) {
  int st = 0;
  cr_assert_eq(waitpid(x->pid, &st, 0), x->pid);
  x->pid = 0;
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", x->dir);
  cr_expect_eq(system(cmd), 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* End of file: the executor stops what runs and exits 0. */
static void ex_close(ex *x) {
  close(x->fd);
  cr_expect_eq(ex_wait(x), 0, "the executor did not exit 0 at end of file");
}

/* ----------------------------------------------------------- the messages --- */

static void set_vdevs(ex *x, size_t n, const char *const *names, const uint64_t *limits,
                      const uint32_t *shares, Gpushare__V1__Policy policy) {
  Gpushare__Exec__V1__VdevConfig c[8], *pc[8];
  cr_assert_leq(n, 8);
  for (size_t i = 0; i < n; i++) {
    Gpushare__Exec__V1__VdevConfig init = GPUSHARE__EXEC__V1__VDEV_CONFIG__INIT;
    c[i] = init;
    c[i].name = (char *)names[i];
    c[i].has_memory_limit = c[i].has_compute_share = c[i].has_policy = true;
    c[i].memory_limit = limits[i];
    c[i].compute_share = shares[i];
    c[i].policy = policy;
    pc[i] = &c[i];
  }
  Gpushare__Exec__V1__SetVdevs sv = GPUSHARE__EXEC__V1__SET_VDEVS__INIT;
  sv.n_vdev = n;
  sv.vdev = pc;
  Gpushare__Exec__V1__ToExecutor m = GPUSHARE__EXEC__V1__TO_EXECUTOR__INIT;
  m.msg_case = GPUSHARE__EXEC__V1__TO_EXECUTOR__MSG_SET_VDEVS;
  m.set_vdevs = &sv;
  ex_send(x, &m);
}

/* The job every test runs: 8x8x1 inputs, Flatten, Dense 16 relu, Dense 4,
 * SGD, on 256 synthetic examples (16 steps of 16 per epoch). */
typedef struct job_spec {
  Gpushare__V1__JobSpec spec;
  Gpushare__V1__Model model;
  Gpushare__V1__InputShape in;
  Gpushare__V1__Layer l[3], *pl[3];
  Gpushare__V1__Flatten flatten;
  Gpushare__V1__Dense d1, d2;
  Gpushare__V1__Dataset train;
  Gpushare__V1__SyntheticDataset syn;
  Gpushare__V1__Optimizer opt;
  Gpushare__V1__Sgd sgd;
} job_spec;

static void job_spec_init(job_spec *j, uint64_t max_steps, uint32_t epochs) {
  memset(j, 0, sizeof *j);
  Gpushare__V1__JobSpec spec = GPUSHARE__V1__JOB_SPEC__INIT;
  Gpushare__V1__Model model = GPUSHARE__V1__MODEL__INIT;
  Gpushare__V1__InputShape in = GPUSHARE__V1__INPUT_SHAPE__INIT;
  Gpushare__V1__Layer layer = GPUSHARE__V1__LAYER__INIT;
  Gpushare__V1__Flatten flatten = GPUSHARE__V1__FLATTEN__INIT;
  Gpushare__V1__Dense dense = GPUSHARE__V1__DENSE__INIT;
  Gpushare__V1__Dataset ds = GPUSHARE__V1__DATASET__INIT;
  Gpushare__V1__SyntheticDataset syn = GPUSHARE__V1__SYNTHETIC_DATASET__INIT;
  Gpushare__V1__Optimizer opt = GPUSHARE__V1__OPTIMIZER__INIT;
  Gpushare__V1__Sgd sgd = GPUSHARE__V1__SGD__INIT;
  j->spec = spec;
  j->model = model;
  j->in = in;
  j->in.has_height = j->in.has_width = j->in.has_channels = true;
  j->in.height = 8;
  j->in.width = 8;
  j->in.channels = 1;
  j->flatten = flatten;
  j->d1 = dense;
  j->d1.has_units = j->d1.has_activation = true;
  j->d1.units = 16;
  j->d1.activation = GPUSHARE__V1__ACTIVATION__RELU;
  j->d2 = dense;
  j->d2.has_units = true;
  j->d2.units = 4;
  for (int i = 0; i < 3; i++) {
    j->l[i] = layer;
    j->pl[i] = &j->l[i];
  }
  j->l[0].kind_case = GPUSHARE__V1__LAYER__KIND_FLATTEN;
  j->l[0].flatten = &j->flatten;
  j->l[1].kind_case = GPUSHARE__V1__LAYER__KIND_DENSE;
  j->l[1].dense = &j->d1;
  j->l[2].kind_case = GPUSHARE__V1__LAYER__KIND_DENSE;
  j->l[2].dense = &j->d2;
  j->model.input = &j->in;
  j->model.n_layer = 3;
  j->model.layer = j->pl;
  j->syn = syn;
  j->syn.has_examples = j->syn.has_seed = j->syn.has_classes = true;
  j->syn.examples = 256;
  j->syn.seed = 7;
  j->syn.classes = 4;
  j->train = ds;
  j->train.source_case = GPUSHARE__V1__DATASET__SOURCE_SYNTHETIC;
  j->train.synthetic = &j->syn;
  j->sgd = sgd;
  j->sgd.has_learning_rate = true;
  j->sgd.learning_rate = 0.05f;
  j->opt = opt;
  j->opt.kind_case = GPUSHARE__V1__OPTIMIZER__KIND_SGD;
  j->opt.sgd = &j->sgd;
  j->spec.name = "executor-test";
  j->spec.model = &j->model;
  j->spec.train = &j->train;
  j->spec.has_batch_size = true;
  j->spec.batch_size = 16;
  j->spec.has_max_steps = true;
  j->spec.max_steps = max_steps;
  j->spec.has_epochs = true;
  j->spec.epochs = epochs;
  j->spec.has_seed = true;
  j->spec.seed = 1;
  j->spec.optimizer = &j->opt;
}

/* A job that runs until it is cancelled or shut down: 10,000 epochs (the most
 * a job may ask for) of 65,536 examples, 41 million steps, minutes even at a
 * microsecond a step, so a cancel sent after the first Progress always
 * finds it running. */
static void job_spec_until_cancelled(job_spec *j) {
  job_spec_init(j, 0, 10000);
  j->syn.examples = 65536;
}

static void start_job(ex *x, uint64_t id, const char *vdev, job_spec *js, const char *ckpt,
                      const char *export_path) {
  Gpushare__Exec__V1__StartJob s = GPUSHARE__EXEC__V1__START_JOB__INIT;
  s.has_job_id = true;
  s.job_id = id;
  s.vdev = (char *)vdev;
  s.spec = &js->spec;
  s.checkpoint_path = (char *)ckpt;
  s.export_path = (char *)export_path;
  s.has_threads = true;
  s.threads = 1;
  Gpushare__Exec__V1__ToExecutor m = GPUSHARE__EXEC__V1__TO_EXECUTOR__INIT;
  m.msg_case = GPUSHARE__EXEC__V1__TO_EXECUTOR__MSG_START;
  m.start = &s;
  ex_send(x, &m);
}

static void cancel_job(ex *x, uint64_t id) {
  Gpushare__Exec__V1__CancelJob c = GPUSHARE__EXEC__V1__CANCEL_JOB__INIT;
  c.has_job_id = true;
  c.job_id = id;
  Gpushare__Exec__V1__ToExecutor m = GPUSHARE__EXEC__V1__TO_EXECUTOR__INIT;
  m.msg_case = GPUSHARE__EXEC__V1__TO_EXECUTOR__MSG_CANCEL;
  m.cancel = &c;
  ex_send(x, &m);
}

static void shutdown_executor(ex *x) {
  Gpushare__Exec__V1__Shutdown s = GPUSHARE__EXEC__V1__SHUTDOWN__INIT;
  Gpushare__Exec__V1__ToExecutor m = GPUSHARE__EXEC__V1__TO_EXECUTOR__INIT;
  m.msg_case = GPUSHARE__EXEC__V1__TO_EXECUTOR__MSG_SHUTDOWN;
  m.shutdown = &s;
  ex_send(x, &m);
}

/* Read until a message of `kind` (for job `id` when it is a Progress or a
 * Finished; 0: any job). Other messages are dropped. */
static from_msg *recv_until(ex *x, Gpushare__Exec__V1__FromExecutor__MsgCase kind, uint64_t id) {
  for (;;) {
    from_msg *m = ex_recv(x);
    if (m->msg_case == kind) {
      uint64_t got = kind == GPUSHARE__EXEC__V1__FROM_EXECUTOR__MSG_PROGRESS ? m->progress->job_id
                     : kind == GPUSHARE__EXEC__V1__FROM_EXECUTOR__MSG_FINISHED
                         ? m->finished->job_id
                         : 0;
      if (!id || got == id) return m;
    }
    gpushare__exec__v1__from_executor__free_unpacked(m, NULL);
  }
}

static const Gpushare__Exec__V1__VdevStats *stats_of(const from_msg *m, const char *vdev) {
  for (size_t i = 0; i < m->stats->n_vdev; i++)
    if (!strcmp(m->stats->vdev[i]->name, vdev)) return m->stats->vdev[i];
  cr_assert_fail("Stats has no vdev %s", vdev);
  return NULL;
}

static off_t file_size(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 ? st.st_size : -1;
}

static const char *const G0[] = {"g0"};
static const uint64_t MIB64[] = {64u << 20};
static const uint32_t FULL[] = {100};

/* ------------------------------------------------------------------ tests --- */

Test(executor, a_job_reports_progress_and_succeeds_with_an_export, .timeout = 600) {
  ex x;
  ex_start(&x);
  set_vdevs(&x, 1, G0, MIB64, FULL, GPUSHARE__V1__POLICY__GROWTH);
  job_spec js;
  job_spec_init(&js, 30, 2);
  char ckpt[128], out[128];
  snprintf(ckpt, sizeof ckpt, "%s/1.ckpt", x.dir);
  snprintf(out, sizeof out, "%s/1.safetensors", x.dir);
  start_job(&x, 1, "g0", &js, ckpt, out);

  int progress = 0, epoch_ends = 0;
  bool first_step = false;
  from_msg *m;
  for (;;) {
    m = ex_recv(&x);
    if (m->msg_case == GPUSHARE__EXEC__V1__FROM_EXECUTOR__MSG_FINISHED) break;
    if (m->msg_case == GPUSHARE__EXEC__V1__FROM_EXECUTOR__MSG_PROGRESS) {
      const Gpushare__V1__JobEvent *ev = m->progress->event;
      cr_assert_eq(m->progress->job_id, 1);
      cr_assert_not_null(ev);
      cr_expect_eq(ev->state, GPUSHARE__V1__JOB_STATE__RUNNING);
      cr_expect_eq(ev->memory_limit, 64u << 20);
      if (ev->epoch_end) {
        epoch_ends++;
        cr_expect_eq(ev->epoch_end->epoch, 1);
        cr_expect_eq(ev->step, 16, "epoch 1 ends after 256 / 16 steps");
      } else {
        progress++;
        if (ev->step == 1) first_step = true;
        cr_expect_eq(ev->total_steps, 30);
        cr_expect_gt(ev->memory_in_use, 0);
        cr_expect(isfinite(ev->loss) && ev->loss > 0, "loss %f", (double)ev->loss);
        /* What the job holds: alone in g0, its tensors are g0's in use. */
        const Gpushare__Exec__V1__Progress *pr = m->progress;
        cr_expect(pr->has_device_bytes && pr->has_host_bytes && pr->has_host_data_bytes);
        cr_expect_eq(pr->device_bytes, ev->memory_in_use);
        cr_expect_gt(pr->host_data_bytes, 0);
        cr_expect_gt(pr->host_bytes, pr->host_data_bytes, "its own buffers besides the datasets");
      }
    }
    gpushare__exec__v1__from_executor__free_unpacked(m, NULL);
  }
  const Gpushare__Exec__V1__Finished *f = m->finished;
  cr_expect_eq(f->job_id, 1);
  cr_expect_eq(f->state, GPUSHARE__V1__JOB_STATE__SUCCEEDED, "state %d: %s", f->state,
               f->reason ? f->reason : "");
  cr_expect_eq(f->steps, 30);
  /* epoch 1 whole, then max_steps stops it 14 steps into epoch 2 */
  cr_assert_eq(f->n_epoch, 2);
  cr_expect(!f->epoch[0]->partial);
  cr_expect_eq(f->epoch[1]->epoch, 2);
  cr_expect(f->epoch[1]->partial, "the last epoch is partial");
  cr_expect(isfinite(f->epoch[1]->train_loss) && f->epoch[1]->train_loss > 0, "loss %f",
            (double)f->epoch[1]->train_loss);
  cr_expect_gt(f->peak_memory_bytes, 0);
  cr_expect_gt(f->device_seconds, 0);
  cr_expect(!f->interrupted);
  cr_expect_not_null(f->timeline);
  if (f->timeline) cr_expect_gt(f->timeline->n_at_peak, 0, "memory by layer is reported");
  cr_expect(first_step, "the first step is always reported");
  cr_expect_geq(progress, 1);
  cr_expect_eq(epoch_ends, 1);
  gpushare__exec__v1__from_executor__free_unpacked(m, NULL);
  cr_expect_gt(file_size(out), 8, "the safetensors export %s is missing", out);
  cr_expect_gt(file_size(ckpt), 0, "the checkpoint %s is missing", ckpt);

  m = recv_until(&x, GPUSHARE__EXEC__V1__FROM_EXECUTOR__MSG_STATS, 0);
  const Gpushare__Exec__V1__VdevStats *vs = stats_of(m, "g0");
  cr_expect_eq(vs->in_use, 0, "the job's memory went back to g0");
  cr_expect_eq(vs->running_jobs, 0);
  cr_expect_eq(vs->steps, 30);
  cr_expect(vs->has_free_bytes && vs->has_largest_free_bytes && vs->has_fragmentation);
  cr_expect_eq(vs->free_bytes, 64u << 20);
  cr_expect_eq(vs->largest_free_bytes, 64u << 20, "an empty GROWTH vdev could take its limit");
  cr_expect_eq(vs->fragmentation, 0.0);
  gpushare__exec__v1__from_executor__free_unpacked(m, NULL);
  ex_close(&x);
}

Test(executor, an_oom_names_the_layer_and_spares_the_other_vdev, .timeout = 600) {
  ex x;
  ex_start(&x);
  static const char *const names[] = {"tiny", "g0"};
  static const uint64_t limits[] = {1024, 64u << 20};
  static const uint32_t shares[] = {50, 50};
  set_vdevs(&x, 2, names, limits, shares, GPUSHARE__V1__POLICY__GROWTH);
  job_spec js;
  job_spec_init(&js, 30, 2);
  start_job(&x, 1, "tiny", &js, "", "");
  start_job(&x, 2, "g0", &js, "", "");

  bool seen1 = false, seen2 = false;
  while (!seen1 || !seen2) {
    from_msg *m = recv_until(&x, GPUSHARE__EXEC__V1__FROM_EXECUTOR__MSG_FINISHED, 0);
    const Gpushare__Exec__V1__Finished *f = m->finished;
    if (f->job_id == 1) {
      seen1 = true;
      cr_expect_eq(f->state, GPUSHARE__V1__JOB_STATE__FAILED);
      cr_expect_not_null(f->reason);
      cr_assert_not_null(f->oom, "a failed allocation comes with an OomReport");
      const Gpushare__V1__OomReport *o = f->oom;
      cr_expect_eq(o->cause, GPUSHARE__V1__OOM_CAUSE__QUOTA);
      /* The first tensor placed is dense_1's kernel: 64 x 16 fp32 = 4 KiB. */
      cr_expect_str_eq(o->layer, "dense_1");
      cr_expect_str_eq(o->role, "weights");
      cr_expect_str_eq(o->shape, "(64, 16)");
      cr_expect_str_eq(o->dtype, "float32");
      cr_expect_eq(o->bytes, 4096);
      cr_expect_str_eq(o->vdev, "tiny");
      cr_expect_eq(o->limit_bytes, 1024);
      cr_expect_eq(o->in_use_bytes, 0);
      cr_expect_not_null(o->explanation);
      cr_log_info("OOM explanation: %s", o->explanation);
      cr_expect(strstr(o->explanation, "tiny") && strstr(o->explanation, "dense_1") &&
                    strstr(o->explanation, "limit"),
                "explanation: %s", o->explanation);
      cr_expect_eq(o->n_suggestion, 0);
    } else {
      cr_assert_eq(f->job_id, 2);
      seen2 = true;
      cr_expect_eq(f->state, GPUSHARE__V1__JOB_STATE__SUCCEEDED, "job 2: %s",
                   f->reason ? f->reason : "");
      cr_expect_eq(f->steps, 30);
    }
    gpushare__exec__v1__from_executor__free_unpacked(m, NULL);
  }
  ex_close(&x);
}

/* A vdev 256 bytes short of the job's planned peak: the report says what
 * would fit, from the planner, and it does fit. */
Test(executor, an_oom_report_says_what_would_fit, .timeout = 600) {
  job_spec js;
  job_spec_init(&js, 30, 2);
  gs_plan plan;
  gs_err e;
  gs_job_spec rs;
  cr_assert_eq(gs_spec_pb_job(&js.spec, &rs, &e), 0, "%s", e.msg);
  cr_assert_eq(gs_plan_job(&rs, gs_backend_cpu(), &plan, &e), 0, "%s", e.msg);
  gs_spec_pb_job_free(&rs);
  uint64_t limit = plan.peak_bytes - 256;
  gs_plan_free(&plan);

  ex x;
  ex_start(&x);
  /* PREALLOCATE: one region, filled in order, so the failure is the quota. */
  static const char *const names[] = {"snug"};
  const uint64_t limits[] = {limit};
  set_vdevs(&x, 1, names, limits, FULL, GPUSHARE__V1__POLICY__PREALLOCATE);
  start_job(&x, 5, "snug", &js, "", "");
  from_msg *m = recv_until(&x, GPUSHARE__EXEC__V1__FROM_EXECUTOR__MSG_FINISHED, 5);
  const Gpushare__Exec__V1__Finished *f = m->finished;
  cr_expect_eq(f->state, GPUSHARE__V1__JOB_STATE__FAILED);
  cr_assert_not_null(f->oom);
  cr_expect_eq(f->oom->cause, GPUSHARE__V1__OOM_CAUSE__QUOTA);
  cr_expect_eq(f->oom->limit_bytes, limit);
  cr_assert_gt(f->oom->n_suggestion, 0, "no suggestion for a job 256 bytes over its limit");
  for (size_t i = 0; i < f->oom->n_suggestion; i++) {
    const Gpushare__V1__OomSuggestion *sg = f->oom->suggestion[i];
    cr_log_info("suggestion: %s (peak %llu of %llu)", sg->what,
                (unsigned long long)sg->predicted_peak_bytes, (unsigned long long)limit);
    cr_expect_leq(sg->predicted_peak_bytes, limit);
    cr_expect_gt(sg->saving_bytes, 0);
  }
  uint32_t mb = f->oom->suggestion[0]->micro_batch;
  uint32_t k = f->oom->suggestion[0]->accumulation_steps;
  gpushare__exec__v1__from_executor__free_unpacked(m, NULL);

  /* Taking the first suggestion, the same job runs in the same vdev. */
  if (mb * k == 16 && mb < 16) {
    js.spec.batch_size = mb;
    js.spec.has_accumulation_steps = true;
    js.spec.accumulation_steps = k;
    start_job(&x, 6, "snug", &js, "", "");
    m = recv_until(&x, GPUSHARE__EXEC__V1__FROM_EXECUTOR__MSG_FINISHED, 6);
    cr_expect_eq(m->finished->state, GPUSHARE__V1__JOB_STATE__SUCCEEDED, "%s",
                 m->finished->reason ? m->finished->reason : "");
    cr_assert_not_null(m->finished->timeline);
    cr_expect_gt(m->finished->timeline->planned_peak_bytes, 0);
    cr_expect_eq(m->finished->timeline->planned_peak_bytes, m->finished->timeline->peak_bytes,
                 "the planner's peak %llu is the allocator's %llu",
                 (unsigned long long)m->finished->timeline->planned_peak_bytes,
                 (unsigned long long)m->finished->timeline->peak_bytes);
    gpushare__exec__v1__from_executor__free_unpacked(m, NULL);
  }
  ex_close(&x);
}

/* job id on g0 until it has made progress, then cancelled: its Finished */
static from_msg *run_and_cancel(ex *x, uint64_t id) {
  job_spec js;
  job_spec_until_cancelled(&js);
  start_job(x, id, "g0", &js, "", "");
  from_msg *m = recv_until(x, GPUSHARE__EXEC__V1__FROM_EXECUTOR__MSG_PROGRESS, id);
  gpushare__exec__v1__from_executor__free_unpacked(m, NULL);
  cancel_job(x, id);
  return recv_until(x, GPUSHARE__EXEC__V1__FROM_EXECUTOR__MSG_FINISHED, id);
}

Test(executor, cancel_stops_a_running_job_and_frees_its_memory, .timeout = 600) {
  ex x;
  ex_start(&x);
  set_vdevs(&x, 1, G0, MIB64, FULL, GPUSHARE__V1__POLICY__GROWTH);
  from_msg *m = run_and_cancel(&x, 7);
  cr_expect_eq(m->finished->state, GPUSHARE__V1__JOB_STATE__CANCELLED);
  cr_expect(!m->finished->interrupted);
  cr_expect_not_null(m->finished->reason);
  cr_expect_lt(m->finished->steps, 4096u * 10000u);
  gpushare__exec__v1__from_executor__free_unpacked(m, NULL);
  m = recv_until(&x, GPUSHARE__EXEC__V1__FROM_EXECUTOR__MSG_STATS, 0);
  const Gpushare__Exec__V1__VdevStats *vs = stats_of(m, "g0");
  cr_expect_eq(vs->in_use, 0, "g0 still has %llu bytes in use", (unsigned long long)vs->in_use);
  cr_expect_eq(vs->reserved, 0, "a GROWTH vdev gives its regions back when idle");
  cr_expect_gt(vs->peak_in_use, 0);
  cr_expect_eq(vs->running_jobs, 0);
  gpushare__exec__v1__from_executor__free_unpacked(m, NULL);
  ex_close(&x);
}

/* A job the control plane heard end (Finished) is over, even while its
 * thread has not been joined yet: a StartJob for the same id right after
 * (a preempted job dispatched again at once) runs it anew, not "already
 * runs here". */
Test(executor, a_job_started_again_right_after_it_finished_runs, .timeout = 120) {
  ex x;
  ex_start(&x);
  set_vdevs(&x, 1, G0, MIB64, FULL, GPUSHARE__V1__POLICY__GROWTH);
  for (int round = 0; round < 3; round++) {
    from_msg *m = run_and_cancel(&x, 7);
    cr_expect_eq(m->finished->state, GPUSHARE__V1__JOB_STATE__CANCELLED, "round %d", round);
    gpushare__exec__v1__from_executor__free_unpacked(m, NULL);
  }
  ex_close(&x);
}

Test(executor, shutdown_checkpoints_the_jobs_and_exits_0, .timeout = 600) {
  ex x;
  ex_start(&x);
  set_vdevs(&x, 1, G0, MIB64, FULL, GPUSHARE__V1__POLICY__PREALLOCATE);
  job_spec js;
  job_spec_until_cancelled(&js);
  char ckpt[128];
  snprintf(ckpt, sizeof ckpt, "%s/3.ckpt", x.dir);
  start_job(&x, 3, "g0", &js, ckpt, "");
  from_msg *m = recv_until(&x, GPUSHARE__EXEC__V1__FROM_EXECUTOR__MSG_PROGRESS, 3);
  gpushare__exec__v1__from_executor__free_unpacked(m, NULL);
  shutdown_executor(&x);
  m = recv_until(&x, GPUSHARE__EXEC__V1__FROM_EXECUTOR__MSG_FINISHED, 3);
  cr_expect(m->finished->has_interrupted && m->finished->interrupted,
            "a job stopped by Shutdown is interrupted, not final");
  cr_expect_gt(m->finished->steps, 0);
  cr_log_info("shutdown: %s", m->finished->reason ? m->finished->reason : "");
  gpushare__exec__v1__from_executor__free_unpacked(m, NULL);
  cr_expect_gt(file_size(ckpt), 0, "no checkpoint at %s", ckpt);
  /* Then the executor closes its end and exits 0. */
  for (;;) {
    uint8_t *body = NULL;
    size_t len = 0;
    int rc = gs_wire_read_frame(x.fd, GS_WIRE_MAX_FRAME, &body, &len);
    free(body);
    if (rc) {
      cr_expect_eq(rc, -EPIPE, "the executor's end of the stream: %s", strerror(-rc));
      break;
    }
  }
  close(x.fd);
  cr_expect_eq(ex_wait(&x), 0);
}

/* The window the ratio is read over, in the s25 vdev's device seconds. The
 * device changes hands in 50 ms slices, so either vdev's count can be off by
 * up to one slice at the window's ends: over 1.25 s of s25's time (5 s of
 * device time in all) that is 4% of its steps at most, well inside the 15%
 * the test allows. A window counted in steps would shrink as steps get
 * faster, down to a few slices, where one slice more fails the test. Device
 * time is CPU time here, so the window is the same under the sanitizers and
 * on a busy machine. */
#define SHARES_WINDOW_S 1.25

Test(executor, shares_75_25_give_3_steps_to_1, .timeout = 900) {
  ex x;
  ex_start(&x);
  static const char *const names[] = {"s75", "s25"};
  static const uint64_t limits[] = {64u << 20, 64u << 20};
  static const uint32_t shares[] = {75, 25};
  set_vdevs(&x, 2, names, limits, shares, GPUSHARE__V1__POLICY__GROWTH);
  job_spec js;
  /* Far more steps than the window needs: both jobs run until it closes,
   * and closing the socket then cancels them. */
  job_spec_until_cancelled(&js);
  start_job(&x, 1, "s75", &js, "", "");
  start_job(&x, 2, "s25", &js, "", "");

  /* Baseline: the first Stats with both jobs running (each job's start sends
   * one), so steps one job took alone before the other joined do not count.
   * The window ends at the first Stats (about one a second) once s25 has had
   * SHARES_WINDOW_S of device time since then. */
  uint64_t a0 = 0, b0 = 0, a1 = 0, b1 = 0;
  double da0 = 0, db0 = 0, da1 = 0, db1 = 0;
  bool based = false;
  for (;;) {
    from_msg *m = ex_recv(&x);
    cr_assert_neq(m->msg_case, GPUSHARE__EXEC__V1__FROM_EXECUTOR__MSG_FINISHED,
                  "job %llu ended before the window closed: %s",
                  (unsigned long long)(m->finished ? m->finished->job_id : 0),
                  m->finished && m->finished->reason ? m->finished->reason : "(no reason)");
    if (m->msg_case == GPUSHARE__EXEC__V1__FROM_EXECUTOR__MSG_STATS) {
      const Gpushare__Exec__V1__VdevStats *a = stats_of(m, "s75"), *b = stats_of(m, "s25");
      bool both = a->running_jobs == 1 && b->running_jobs == 1;
      if (!based && both) {
        based = true;
        a0 = a->steps;
        b0 = b->steps;
        da0 = a->device_seconds;
        db0 = b->device_seconds;
      } else if (based && b->device_seconds - db0 >= SHARES_WINDOW_S) {
        cr_assert(both, "a job stopped inside the window");
        a1 = a->steps;
        b1 = b->steps;
        da1 = a->device_seconds;
        db1 = b->device_seconds;
        gpushare__exec__v1__from_executor__free_unpacked(m, NULL);
        break;
      }
    }
    gpushare__exec__v1__from_executor__free_unpacked(m, NULL);
  }
  cr_assert_gt(b1 - b0, 0, "s25 took no step in the window");
  double ratio = (double)(a1 - a0) / (double)(b1 - b0);
  double dratio = (da1 - da0) / (db1 - db0);
  cr_log_info("shares 75/25: steps %llu and %llu in the window (from %llu / %llu): %.3f",
              (unsigned long long)(a1 - a0), (unsigned long long)(b1 - b0),
              (unsigned long long)a0, (unsigned long long)b0, ratio);
  cr_log_info("shares 75/25: device seconds %.3f and %.3f: %.3f", da1 - da0, db1 - db0, dratio);
  cr_expect_float_eq(ratio, 3.0, 0.45, "step ratio %.3f, want 3 within 15%% (device seconds %.3f)",
                     ratio, dratio);
  /* Closing the socket cancels both jobs. */
  ex_close(&x);
}

Test(executor, start_job_on_an_unknown_vdev_fails_with_the_reason, .timeout = 120) {
  ex x;
  ex_start(&x);
  set_vdevs(&x, 1, G0, MIB64, FULL, GPUSHARE__V1__POLICY__GROWTH);
  job_spec js;
  job_spec_init(&js, 5, 1);
  start_job(&x, 9, "nope", &js, "", "");
  from_msg *m = recv_until(&x, GPUSHARE__EXEC__V1__FROM_EXECUTOR__MSG_FINISHED, 9);
  cr_expect_eq(m->finished->state, GPUSHARE__V1__JOB_STATE__FAILED);
  cr_assert_not_null(m->finished->reason);
  cr_expect(strstr(m->finished->reason, "nope") != NULL, "reason: %s", m->finished->reason);
  gpushare__exec__v1__from_executor__free_unpacked(m, NULL);
  /* An invalid spec is a failure of the job, never of the executor. */
  js.spec.batch_size = 0;
  start_job(&x, 10, "g0", &js, "", "");
  m = recv_until(&x, GPUSHARE__EXEC__V1__FROM_EXECUTOR__MSG_FINISHED, 10);
  cr_expect_eq(m->finished->state, GPUSHARE__V1__JOB_STATE__FAILED);
  cr_assert_not_null(m->finished->reason);
  cr_expect(strstr(m->finished->reason, "batch_size") != NULL, "reason: %s",
            m->finished->reason);
  gpushare__exec__v1__from_executor__free_unpacked(m, NULL);
  ex_close(&x);
}

Test(executor, sigterm_is_a_shutdown, .timeout = 600) {
  ex x;
  ex_start(&x);
  set_vdevs(&x, 1, G0, MIB64, FULL, GPUSHARE__V1__POLICY__GROWTH);
  job_spec js;
  job_spec_until_cancelled(&js);
  start_job(&x, 4, "g0", &js, "", ""); /* no path: the checkpoint goes to the state dir */
  from_msg *m = recv_until(&x, GPUSHARE__EXEC__V1__FROM_EXECUTOR__MSG_PROGRESS, 4);
  gpushare__exec__v1__from_executor__free_unpacked(m, NULL);
  cr_assert_eq(kill(x.pid, SIGTERM), 0);
  m = recv_until(&x, GPUSHARE__EXEC__V1__FROM_EXECUTOR__MSG_FINISHED, 4);
  cr_expect(m->finished->interrupted);
  gpushare__exec__v1__from_executor__free_unpacked(m, NULL);
  char ckpt[128];
  snprintf(ckpt, sizeof ckpt, "%s/job-4.ckpt", x.dir);
  cr_expect_gt(file_size(ckpt), 0, "no checkpoint at %s", ckpt);
  close(x.fd);
  cr_expect_eq(ex_wait(&x), 0);
}

/* A control plane killed with -9 takes its executor with it: the executor's
 * end of the socket closes, which is all the test waits for. */
Test(executor, dies_with_its_parent, .timeout = 120) {
  int sv[2];
  cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  char dir[] = "/tmp/gs-exec-XXXXXX";
  cr_assert_not_null(mkdtemp(dir));
  pid_t parent = fork();
  cr_assert_geq(parent, 0);
  if (parent == 0) {
    close(sv[0]);
    pid_t child = fork();
    if (child == 0) {
      if (dup2(sv[1], 3) < 0) _exit(127);
      execl(GS_EXECUTOR_PATH, "gpushare-executor", "--device", "cpu", "--fd", "3",
            "--state-dir", dir, "--threads", "1", (char *)NULL);
      _exit(127);
    }
    close(sv[1]);
    for (;;) pause(); /* the stand-in control plane, until SIGKILL */
  }
  close(sv[1]);
  ex x = {.fd = sv[0]};
  from_msg *m = ex_recv(&x);
  cr_assert_eq(m->msg_case, GPUSHARE__EXEC__V1__FROM_EXECUTOR__MSG_READY);
  gpushare__exec__v1__from_executor__free_unpacked(m, NULL);
  cr_assert_eq(kill(parent, SIGKILL), 0);
  cr_assert_eq(waitpid(parent, NULL, 0), parent);
  struct pollfd p = {.fd = sv[0], .events = POLLIN};
  cr_assert_gt(poll(&p, 1, RECV_GUARD_MS), 0, "the executor outlived its parent");
  uint8_t *body = NULL;
  size_t len = 0;
  int rc = gs_wire_read_frame(sv[0], GS_WIRE_MAX_FRAME, &body, &len);
  free(body);
  cr_expect_eq(rc, -EPIPE, "the executor's socket is still open (%d)", rc);
  close(sv[0]);
  rmdir(dir);
}

/* gpuN: on a machine with the CUDA plugin and a GPU the same job runs on
 * gpu0; elsewhere the executor refuses the device and exits 1 (it never
 * falls back to the CPU behind the control plane's back). */
Test(executor, gpu0_runs_a_job_or_is_refused, .timeout = 600) {
  int sv[2];
  cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  ex x;
  memset(&x, 0, sizeof x);
  snprintf(x.dir, sizeof x.dir, "/tmp/gs-exec-XXXXXX");
  cr_assert_not_null(mkdtemp(x.dir));
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    if (dup2(sv[1], 3) < 0) _exit(127);
    execl(GS_EXECUTOR_PATH, "gpushare-executor", "--device", "gpu0", "--fd", "3", "--state-dir",
          x.dir, (char *)NULL);
    _exit(127);
  }
  close(sv[1]);
  x.pid = pid;
  x.fd = sv[0];
  struct pollfd p = {.fd = x.fd, .events = POLLIN};
  cr_assert_gt(poll(&p, 1, RECV_GUARD_MS), 0);
  uint8_t *body = NULL;
  size_t len = 0;
  int rc = gs_wire_read_frame(x.fd, GS_WIRE_MAX_FRAME, &body, &len);
  if (rc == -EPIPE) {
    free(body);
    close(x.fd);
    cr_expect_eq(ex_wait(&x), 1, "without a usable GPU the executor exits 1");
    cr_log_info("no usable gpu0 here: refused");
    return;
  }
  cr_assert_eq(rc, 0);
  from_msg *m = gpushare__exec__v1__from_executor__unpack(NULL, len, body);
  free(body);
  cr_assert_not_null(m);
  cr_assert_eq(m->msg_case, GPUSHARE__EXEC__V1__FROM_EXECUTOR__MSG_READY);
  cr_expect_str_eq(m->ready->device, "gpu0");
  gpushare__exec__v1__from_executor__free_unpacked(m, NULL);
  set_vdevs(&x, 1, G0, MIB64, FULL, GPUSHARE__V1__POLICY__GROWTH);
  job_spec js;
  job_spec_init(&js, 30, 2);
  start_job(&x, 1, "g0", &js, "", "");
  m = recv_until(&x, GPUSHARE__EXEC__V1__FROM_EXECUTOR__MSG_FINISHED, 1);
  cr_expect_eq(m->finished->state, GPUSHARE__V1__JOB_STATE__SUCCEEDED, "on gpu0: %s",
               m->finished->reason ? m->finished->reason : "");
  cr_expect_eq(m->finished->steps, 30);
  gpushare__exec__v1__from_executor__free_unpacked(m, NULL);
  ex_close(&x);
}
