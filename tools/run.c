/*
 * run.c: gpushare-run, one training job in one process, without the daemon.
 *
 * It is the executor's runtime (train.h) driven from a shell: read a binary
 * gpushare.v1.JobSpec (encoded from text with protoc --encode), load the
 * datasets it names (IDX or .npy files, a token file or a synthetic set),
 * create a GROWTH vdev allocator on the CPU backend limited to half the
 * machine's RAM, train,
 * print progress, per-epoch test metrics and a summary (with --json, a JSON
 * object on the last line, for scripts and benchmarks). Exit status: 0 done,
 * 1 the job failed (the gs_err field and message are printed), 2 usage.
 *
 * Dataset paths: absolute paths are used as they are; relative paths with a
 * directory part are relative to the job file's directory; a bare file name
 * is looked up in the job file's directory, then in --data-dir (default
 * /usr/share/datasets/fashion-mnist, Debian's dataset-fashion-mnist), so the
 * examples run as shipped.
 *
 * Memory: the job runs in one vdev allocator of
 * --memory-limit bytes (default half the machine's RAM) with --policy growth
 * (default) or preallocate. Before any dataset is read the job is planned
 * (plan.h) and admitted against that limit: over it, the run is refused with
 * the plan and what would fit (exit 1), unless the spec's auto_fit or
 * --auto-fit lets it take the largest micro-batch that fits, keeping the
 * effective batch. --plan prints the plan and exits. An allocation that
 * fails anyway (the device ran out, a fragmented vdev; forced in tests with
 * --no-admission and --device-memory) fails the job, never the process, and
 * prints the OOM report the daemon would store. --memory-report prints the
 * job's memory timeline after the run.
 *
 * Synthetic sets: gs_dataset_load_job (runtime/data.h), as in the executor:
 * train and test of one seed and classes are drawn from one generator and
 * split, so the test examples are unseen examples of the same task.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/error.h"
#include "common/file.h"
#include "common/size.h"
#include "kernels/backend.h"
#include "present/present.h"
#include "proto/gpushare.pb-c.h"
#include "runtime/alloc.h"
#include "runtime/data.h"
#include "runtime/model.h"
#include "runtime/oom.h"
#include "runtime/plan.h"
#include "convert/spec_pb.h"
#include "runtime/train.h"

#define DEFAULT_DATA_DIR "/usr/share/datasets/fashion-mnist"
#define JOB_MAX_BYTES (16u << 20) /* the wire's frame limit: a spec is small */

static atomic_int g_cancel;

static void on_signal(int sig) {
  (void)sig;
  atomic_store(&g_cancel, 1);
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: gpushare-run JOB.pb [options]\n"
          "Train one gpushare job (a binary gpushare.v1.JobSpec) on the CPU backend.\n"
          "\n"
          "  --epochs N          override the spec's epochs (1..%u)\n"
          "  --max-steps N       stop after N optimizer steps (0: no limit)\n"
          "  --precision P       float32 | mixed_float16 | mixed_bfloat16\n"
          "  --threads N         CPU threads for the ops (default 1)\n"
          "  --json              print the final result as JSON on the last line\n"
          "  --checkpoint PATH   write checkpoints there (every checkpoint_every_steps\n"
          "                      steps and at each epoch end)\n"
          "  --resume PATH       continue from a checkpoint\n"
          "  --export FILE       write the trained weights as safetensors\n"
          "  --data-dir DIR      where bare IDX file names are found\n"
          "                      (default " DEFAULT_DATA_DIR ")\n"
          "\n"
          "Memory:\n"
          "  --plan              print the job's memory plan (per layer and role, the\n"
          "                      predicted peak; with --memory-limit whether it fits)\n"
          "                      and exit 0; with --json the plan as JSON\n"
          "  --memory-limit SIZE the vdev's limit (\"512MiB\", \"2GiB\"; default half the\n"
          "                      RAM). A job whose plan exceeds it is refused (exit 1)\n"
          "                      with what would fit\n"
          "  --auto-fit          over the limit, take the largest micro-batch dividing\n"
          "                      the effective batch that fits, and the accumulation\n"
          "                      that keeps it (as the spec's auto_fit does)\n"
          "  --policy P          growth (reserve on demand, default) | preallocate\n"
          "                      (reserve the whole limit up front)\n"
          "  --memory-report     after the run, print the peak in use per step and the\n"
          "                      bytes by layer and role at the peak\n"
          "  --json              (with a run) also reports planned_peak_bytes; an OOM\n"
          "                      prints {\"oom\":{...}} as the last line\n"
          "Testing the out-of-memory paths:\n"
          "  --no-admission      skip the admission check: an over-limit job then fails\n"
          "                      at allocation with an OOM report (cause QUOTA)\n"
          "  --device-memory SIZE pretend the device has only SIZE bytes for regions, so\n"
          "                      a GROWTH vdev runs out of device first (cause PHYSICAL)\n"
          "  -h, --help          this text\n"
          "\n"
          "Encode a text job with:\n"
          "  protoc --encode=gpushare.v1.JobSpec --proto_path=proto gpushare.proto \\\n"
          "    < job.txtpb > job.pb\n"
          "Exit status: 0 done, 1 the job failed, 2 usage.\n",
          GS_MODEL_MAX_EPOCHS);
}

static int bad_flag(const char *flag, const char *value, const char *want) {
  if (value)
    fprintf(stderr, "gpushare-run: %s: invalid value \"%s\": %s\n", flag, value, want);
  else
    fprintf(stderr, "gpushare-run: %s: %s\n", flag, want);
  fprintf(stderr, "Try 'gpushare-run --help'.\n");
  return 2;
}

/* A CPU backend whose device has only `cap` bytes for regions (--device-memory):
 * regions past it are refused as a full GPU refuses cudaMalloc. */
typedef struct capped_backend {
  gs_backend b;       /* first, so the allocator's gs_backend * is this struct */
  gs_backend *inner;
  uint64_t cap, used;
} capped_backend;

static int capped_reserve(gs_backend *b, int dev, size_t bytes, void **region) {
  capped_backend *c = (capped_backend *)b;
  if (c->used + bytes > c->cap) return -ENOMEM;
  int rc = c->inner->region_reserve(c->inner, dev, bytes, region);
  if (rc == 0) c->used += bytes;
  return rc;
}

static void capped_release(gs_backend *b, int dev, void *region, size_t bytes) {
  capped_backend *c = (capped_backend *)b;
  c->inner->region_release(c->inner, dev, region, bytes);
  c->used -= bytes;
}

static int parse_u64(const char *s, uint64_t max, uint64_t *out) {
  if (!s || !*s || *s == '-' || *s == '+') return -1;
  errno = 0;
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || *end || v > max) return -1;
  *out = v;
  return 0;
}

/* The job file, whole: a JobSpec is small (its datasets are separate files),
 * at most the wire's frame. */
static char *read_job(const char *path, size_t *len, gs_err *e) {
  uint8_t *buf;
  int rc = gs_file_read(path, JOB_MAX_BYTES, "job", &buf, len, e);
  if (rc == -EFBIG)
    gs_err_set(e, GS_INVALID_ARGUMENT, "job", "the job file %s is over %u bytes: a JobSpec "
               "is small (datasets are separate files)", path, JOB_MAX_BYTES);
  else if (rc == -ENOENT)
    gs_err_set(e, GS_NOT_FOUND, "job", "cannot open the job file %s: %s", path, strerror(ENOENT));
  return rc ? NULL : (char *)buf;
}

static bool file_exists(const char *p) {
  struct stat st;
  return stat(p, &st) == 0;
}

/* Resolve a dataset path from the spec (see the file comment). */
static void resolve(const char *p, const char *job_dir, const char *data_dir, char *out,
                    size_t len) {
  if (p[0] == '/') {
    snprintf(out, len, "%s", p);
  } else if (strchr(p, '/')) {
    snprintf(out, len, "%s/%s", job_dir, p);
  } else {
    snprintf(out, len, "%s/%s", job_dir, p);
    if (!file_exists(out)) snprintf(out, len, "%s/%s", data_dir, p);
  }
}

/* Where gpushare-run finds a job's IDX files (see the file comment). */
typedef struct idx_dirs {
  const char *job_dir, *data_dir;
} idx_dirs;

/* A stored set of the job (an IDX or .npy pair, a text or token stream),
 * from files; a set named in the daemon's store is refused, since
 * gpushare-run has no store. */
static int load_idx(const void *user, const char *which, const gs_spec_dataset *d, gs_dataset *out,
                    gs_err *e) {
  const idx_dirs *dirs = user;
  char img[PATH_MAX], lab[PATH_MAX];
  int rc;
  switch (d->source) {
  case GS_DATASET_NPY:
    if (!d->images || !d->images[0] || !d->labels || !d->labels[0]) {
      gs_err_set(e, GS_INVALID_ARGUMENT, !d->images || !d->images[0] ? "npy.images" : "npy.labels",
                 "the %s dataset's npy needs both images and labels paths", which);
      break;
    }
    if (!strncmp(d->images, "sha256:", 7) || !strncmp(d->labels, "sha256:", 7)) {
      gs_err_set(e, GS_INVALID_ARGUMENT, "npy.images",
                 "the %s dataset names a blob in the daemon's store (sha256:...); "
                 "gpushare-run reads .npy files: give their paths",
                 which);
      break;
    }
    resolve(d->images, dirs->job_dir, dirs->data_dir, img, sizeof img);
    resolve(d->labels, dirs->job_dir, dirs->data_dir, lab, sizeof lab);
    rc = gs_dataset_load_npy(img, lab, out, e);
    if (rc) {
      if (!e->field[0]) snprintf(e->field, sizeof e->field, "images");
      gs_err_prefix(e, "npy");
      gs_err_prefix(e, which);
    }
    return rc;
  case GS_DATASET_TEXT:
  case GS_DATASET_TOKENS: {
    const char *k = d->source == GS_DATASET_TEXT ? "text" : "tokens";
    if (!strncmp(d->path, "sha256:", 7)) {
      gs_err_set(e, GS_INVALID_ARGUMENT, d->source == GS_DATASET_TEXT ? "text.path" : "tokens.path",
                 "the %s dataset names a blob in the daemon's store (sha256:...); "
                 "gpushare-run reads %s files: give its path",
                 which, k);
      break;
    }
    resolve(d->path, dirs->job_dir, dirs->data_dir, img, sizeof img);
    rc = gs_dataset_load_tokens(img, d->source == GS_DATASET_TEXT ? GS_TOKENS_TEXT : GS_TOKENS_U16,
                                d->vocab_size, d->sequence_length, out, e);
    if (rc) {
      /* vocab_size and sequence_length were checked before: the file's. */
      snprintf(e->field, sizeof e->field, "%s.path", k);
      gs_err_prefix(e, which);
    }
    return rc;
  }
  case GS_DATASET_IDX:
    if (!d->images || !d->images[0] || !d->labels || !d->labels[0]) {
      gs_err_set(e, GS_INVALID_ARGUMENT, !d->images || !d->images[0] ? "idx.images" : "idx.labels",
                 "the %s dataset's idx needs both images and labels paths", which);
      break;
    }
    if (!strncmp(d->images, "sha256:", 7) || !strncmp(d->labels, "sha256:", 7)) {
      gs_err_set(e, GS_INVALID_ARGUMENT, "idx.images",
                 "the %s dataset names a blob in the daemon's store (sha256:...); "
                 "gpushare-run reads IDX files: give their paths",
                 which);
      break;
    }
    resolve(d->images, dirs->job_dir, dirs->data_dir, img, sizeof img);
    resolve(d->labels, dirs->job_dir, dirs->data_dir, lab, sizeof lab);
    rc = gs_dataset_load_idx(img, lab, out, e);
    if (rc) {
      if (!e->field[0]) snprintf(e->field, sizeof e->field, "images");
      gs_err_prefix(e, "idx");
      gs_err_prefix(e, which);
      if (rc == -ENOENT) {
        size_t used = strlen(e->msg);
        snprintf(e->msg + used, sizeof e->msg - used,
                 " (looked for %s and %s; --data-dir sets where bare file names are found)",
                 img, lab);
      }
      return rc;
    }
    return 0;
  case GS_DATASET_NAME:
    gs_err_set(e, GS_INVALID_ARGUMENT, "name",
               "the %s dataset \"%s\" is a name in the daemon's store; gpushare-run needs idx "
               "file paths or a synthetic set",
               which, d->name ? d->name : "");
    break;
  default:
    gs_err_set(e, GS_INVALID_ARGUMENT, "", "the %s dataset has no source: idx {images labels} "
               "or synthetic {examples seed}", which);
    break;
  }
  gs_err_prefix(e, which);
  return -EINVAL;
}

typedef struct ui {
  bool tty;        /* progress bar with \r on stderr */
  bool json;
  uint64_t every;  /* plain progress line every N steps (not a TTY) */
  double last_draw;
  bool bar_open;   /* a \r line is on screen */
} ui;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void on_step(void *u, const gs_train_progress *p) {
  ui *x = u;
  if (x->tty) {
    double t = now_s();
    if (t - x->last_draw < 0.1 && p->step_in_epoch != p->steps_per_epoch) return;
    x->last_draw = t;
    int width = 30;
    int fill = (int)((double)p->step_in_epoch / (double)p->steps_per_epoch * width);
    char bar[64];
    for (int i = 0; i < width; i++) bar[i] = i < fill ? '=' : (i == fill ? '>' : ' ');
    bar[width] = '\0';
    fprintf(stderr, "\repoch %u/%u [%s] %" PRIu64 "/%" PRIu64 " loss %.4f %.0f samples/s",
            p->epoch, p->epochs, bar, p->step_in_epoch, p->steps_per_epoch, (double)p->loss,
            (double)p->samples_per_second);
    if (p->loss_scale != 1.0f) fprintf(stderr, " scale %g", (double)p->loss_scale);
    fprintf(stderr, "\033[K");
    x->bar_open = true;
  } else if (p->step % x->every == 0 || p->step == p->total_steps) {
    fprintf(stderr, "epoch %u/%u step %" PRIu64 "/%" PRIu64 " loss %.4f %.0f samples/s",
            p->epoch, p->epochs, p->step, p->total_steps, (double)p->loss,
            (double)p->samples_per_second);
    if (p->loss_scale != 1.0f)
      fprintf(stderr, " scale %g skipped %" PRIu64, (double)p->loss_scale, p->skipped_steps);
    fprintf(stderr, "\n");
  }
}

static void on_epoch(void *u, const gs_train_epoch *m) {
  ui *x = u;
  if (x->bar_open) {
    fprintf(stderr, "\n");
    x->bar_open = false;
  }
  printf("epoch %u: train_loss %.4f test_loss %.4f test_accuracy %.4f %.0f samples/s "
         "peak_memory %" PRIu64 " bytes",
         m->epoch, (double)m->train_loss, (double)m->test_loss, (double)m->test_accuracy,
         (double)m->samples_per_second, m->peak_memory_bytes);
  if (m->loss_scale != 1.0f || m->skipped_steps)
    printf(" loss_scale %g skipped %" PRIu64, (double)m->loss_scale, m->skipped_steps);
  printf("\n");
  fflush(stdout);
}

static const char *cause_word(int c) {
  switch (c) {
  case GPUSHARE__V1__OOM_CAUSE__PHYSICAL: return "PHYSICAL";
  case GPUSHARE__V1__OOM_CAUSE__FRAGMENTATION: return "FRAGMENTATION";
  default: return "QUOTA";
  }
}

static void json_str(const char *v) {
  putchar('"');
  for (const unsigned char *p = (const unsigned char *)(v ? v : ""); *p; p++) {
    if (*p == '"' || *p == '\\')
      printf("\\%c", *p);
    else if (*p < 0x20)
      printf("\\u%04x", *p);
    else
      putchar(*p);
  }
  putchar('"');
}

static void json_num(const char *k, double v, bool last) {
  if (isfinite(v))
    printf("\"%s\":%.9g%s", k, v, last ? "" : ",");
  else
    printf("\"%s\":null%s", k, last ? "" : ",");
}

/* The plan table as the daemon's Plan.summary has it: through the message. */
static char *plan_text(const gs_plan *p, uint64_t limit, gs_alloc_policy policy) {
  Gpushare__V1__Plan *m = NULL;
  if (gs_spec_pb_plan(p, limit, policy, &m)) return NULL;
  char *txt = gs_present_plan(m);
  gpushare__v1__plan__free_unpacked(m, NULL);
  return txt;
}

int main(int argc, char **argv) {
  const char *job = NULL, *ckpt = NULL, *resume = NULL, *export = NULL;
  const char *data_dir = DEFAULT_DATA_DIR;
  gs_train_options opt = {.threads = 1};
  bool json = false, plan_only = false, auto_fit = false, memory_report = false;
  bool no_admission = false;
  uint64_t memory_limit = 0, device_memory = 0;
  gs_alloc_policy policy = GS_POLICY_GROWTH;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout);
      return 0;
    }
    if (a[0] != '-' || !strcmp(a, "-")) {
      if (job) return bad_flag(a, NULL, "only one job file is taken");
      job = a;
      continue;
    }
    if (!strcmp(a, "--json")) {
      json = true;
      continue;
    }
    if (!strcmp(a, "--plan")) {
      plan_only = true;
      continue;
    }
    if (!strcmp(a, "--auto-fit")) {
      auto_fit = true;
      continue;
    }
    if (!strcmp(a, "--memory-report")) {
      memory_report = true;
      continue;
    }
    if (!strcmp(a, "--no-admission")) {
      no_admission = true;
      continue;
    }
    /* Every other flag takes a value: --flag VALUE or --flag=VALUE. */
    char flag[64];
    const char *val;
    const char *eq = strchr(a, '=');
    if (eq) {
      snprintf(flag, sizeof flag, "%.*s", (int)(eq - a), a);
      val = eq + 1;
    } else {
      snprintf(flag, sizeof flag, "%s", a);
      val = i + 1 < argc ? argv[++i] : NULL;
    }
    static const char *const valued[] = {"--epochs", "--max-steps", "--precision", "--threads",
                                         "--checkpoint", "--resume", "--export", "--data-dir",
                                         "--memory-limit", "--policy", "--device-memory"};
    bool known = false;
    for (size_t k = 0; k < sizeof valued / sizeof valued[0]; k++) known |= !strcmp(flag, valued[k]);
    if (!known) return bad_flag(flag, NULL, "unknown option");
    if (!val) return bad_flag(flag, NULL, "needs a value");
    uint64_t v;
    if (!strcmp(flag, "--epochs")) {
      if (parse_u64(val, GS_MODEL_MAX_EPOCHS, &v) || v < 1)
        return bad_flag(flag, val, "an integer from 1 to 10000");
      opt.epochs = (uint32_t)v;
    } else if (!strcmp(flag, "--max-steps")) {
      if (parse_u64(val, UINT64_MAX, &v)) return bad_flag(flag, val, "an integer >= 0");
      opt.has_max_steps = true;
      opt.max_steps = v;
    } else if (!strcmp(flag, "--threads")) {
      if (parse_u64(val, 1024, &v) || v < 1) return bad_flag(flag, val, "an integer from 1 to 1024");
      opt.threads = (int)v;
    } else if (!strcmp(flag, "--precision")) {
      opt.has_precision = true;
      if (!strcmp(val, "float32"))
        opt.precision = GS_PRECISION_FLOAT32;
      else if (!strcmp(val, "mixed_float16"))
        opt.precision = GS_PRECISION_MIXED_FLOAT16;
      else if (!strcmp(val, "mixed_bfloat16"))
        opt.precision = GS_PRECISION_MIXED_BFLOAT16;
      else
        return bad_flag(flag, val, "float32, mixed_float16 or mixed_bfloat16");
    } else if (!strcmp(flag, "--memory-limit") || !strcmp(flag, "--device-memory")) {
      gs_err se;
      gs_err_clear(&se);
      if (gs_size_parse(val, &v, &se) || v == 0)
        return bad_flag(flag, val, v == 0 && !se.msg[0] ? "a size above 0, e.g. 512MiB or 2GiB"
                                                        : se.msg);
      if (!strcmp(flag, "--memory-limit"))
        memory_limit = v;
      else
        device_memory = v;
    } else if (!strcmp(flag, "--policy")) {
      if (!strcmp(val, "growth"))
        policy = GS_POLICY_GROWTH;
      else if (!strcmp(val, "preallocate"))
        policy = GS_POLICY_PREALLOCATE;
      else
        return bad_flag(flag, val, "growth or preallocate");
    } else if (!*val) {
      return bad_flag(flag, val, "a non-empty path");
    } else if (!strcmp(flag, "--checkpoint")) {
      ckpt = val;
    } else if (!strcmp(flag, "--resume")) {
      resume = val;
    } else if (!strcmp(flag, "--export")) {
      export = val;
    } else {
      data_dir = val;
    }
  }
  if (!job) return bad_flag("JOB.pb", NULL, "missing: the job file to run");
  /* the cpu backend's instruction-set level: GS_CPU_ISA may only lower it */
  const char *isa = NULL;
  char isa_why[192];
  if (gs_cpu_isa_status(&isa, isa_why, sizeof isa_why)) {
    fprintf(stderr, "gpushare-run: %s\n", isa_why);
    return 2;
  }

  gs_err e;
  gs_err_clear(&e);
  int status = 1;
  size_t len = 0;
  char *buf = NULL;
  Gpushare__V1__JobSpec *spec = NULL;
  gs_dataset train = {0}, test = {0};
  bool have_test = false;
  gs_alloc *alloc = NULL;
  gs_train *t = NULL;
  gs_train_failure fail;
  gs_admission adm;
  bool have_adm = false;
  gs_job_spec run_spec;
  gs_job_spec_init(&run_spec);
  Gpushare__V1__OomReport *oom = NULL;
  gs_backend *cpu = gs_backend_cpu(), *b = cpu;
  capped_backend capped = {.inner = cpu, .cap = device_memory};
  uint64_t limit = 0, planned_peak = 0;
  memset(&fail, 0, sizeof fail);
  memset(&adm, 0, sizeof adm);

  if (!(buf = read_job(job, &len, &e))) goto fail;
  spec = gpushare__v1__job_spec__unpack(NULL, len, (const uint8_t *)buf);
  if (!spec) {
    gs_err_set(&e, GS_INVALID_ARGUMENT, "job",
               "%s (%zu bytes) is not a binary gpushare.v1.JobSpec; encode a text job with "
               "protoc --encode=gpushare.v1.JobSpec",
               job, len);
    goto fail;
  }
  char job_dir[PATH_MAX];
  snprintf(job_dir, sizeof job_dir, "%s", job);
  char *slash = strrchr(job_dir, '/');
  if (slash)
    *slash = '\0';
  else
    snprintf(job_dir, sizeof job_dir, ".");

  /* The spec as it will run: --precision replaces the spec's (and
   * auto-fit its micro-batch and accumulation below), so the planner, the
   * runtime and an OOM report all see the same job. */
  if (gs_spec_pb_job(spec, &run_spec, &e)) goto fail;
  if (opt.has_precision) {
    run_spec.precision = opt.precision;
    opt.has_precision = false;
  }
  /* The spec is validated before any dataset is read. */
  gs_model m;
  if (gs_model_build(&run_spec, &m, &e)) goto fail;
  gs_model_free(&m);

  if (device_memory) {
    capped.b = *cpu;
    capped.b.region_reserve = capped_reserve;
    capped.b.region_release = capped_release;
    b = &capped.b;
  }
  uint64_t total = 0, free_bytes = 0;
  if (cpu->device_memory(cpu, 0, &total, &free_bytes) || total == 0) {
    gs_err_set(&e, GS_INTERNAL, "", "the %s backend cannot say how much memory it has",
               cpu->name);
    goto fail;
  }
  limit = memory_limit ? memory_limit : total / 2;

  /* Plan and admission. */
  bool fit_ok = auto_fit || run_spec.auto_fit;
  if (gs_plan_admit_policy(&run_spec, b, limit, policy, fit_ok && !no_admission, &adm, &e))
    goto fail;
  have_adm = true;
  if (plan_only) {
    char *txt = json ? gs_plan_json(&adm.plan, limit) : plan_text(&adm.plan, limit, policy);
    if (!txt) {
      gs_err_set(&e, GS_INTERNAL, "", "out of host memory for the plan");
      goto fail;
    }
    if (adm.chosen && !json)
      printf("auto-fit: micro-batch %u x %u accumulation steps instead of %u x %u "
             "(the effective batch stays %" PRIu64 ")\n",
             adm.micro_batch, adm.accumulation_steps, run_spec.batch_size,
             run_spec.accumulation_steps, (uint64_t)adm.micro_batch * adm.accumulation_steps);
    printf("%s\n", txt);
    if (!adm.fits && !json) printf("%s\n", adm.why);
    free(txt);
    status = 0;
    goto out;
  }
  if (!adm.fits && !no_admission) {
    char *txt = plan_text(&adm.plan, limit, policy);
    fflush(stdout);
    fprintf(stderr, "gpushare-run: the job does not fit its %s vdev: %s\n%s",
            memory_limit ? "--memory-limit" : "default (half the RAM)", adm.why, txt ? txt : "");
    free(txt);
    status = 1;
    goto out;
  }
  if (adm.chosen) {
    char a1[32], a2[32];
    printf("auto-fit: micro-batch %u x %u accumulation steps instead of %u x %u (effective "
           "batch %" PRIu64 "): predicted peak %s fits the %s limit\n",
           adm.micro_batch, adm.accumulation_steps, run_spec.batch_size,
           run_spec.accumulation_steps, (uint64_t)adm.micro_batch * adm.accumulation_steps,
           gs_size_format(adm.plan.peak_bytes, a1, sizeof a1),
           gs_size_format(limit, a2, sizeof a2));
    run_spec.batch_size = adm.micro_batch;
    run_spec.accumulation_steps = adm.accumulation_steps;
  }
  planned_peak = adm.plan.peak_bytes;
  idx_dirs dirs = {.job_dir = job_dir, .data_dir = data_dir};
  if (gs_dataset_load_job(&run_spec, load_idx, &dirs, &train, &test, &have_test, &e)) goto fail;

  if (gs_alloc_create(b, 0, limit, policy, &alloc)) {
    gs_err_set(&e, GS_RESOURCE_EXHAUSTED, "", "cannot create a %" PRIu64 "-byte %s vdev on %s",
               limit, policy == GS_POLICY_PREALLOCATE ? "preallocated" : "growth", b->name);
    goto fail;
  }

  ui u = {.tty = isatty(STDERR_FILENO) == 1, .json = json};
  opt.on_step = on_step;
  opt.on_epoch = on_epoch;
  opt.user = &u;
  opt.cancel = &g_cancel;
  opt.checkpoint_path = ckpt;
  opt.resume_path = resume;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);

  if (gs_train_create(&run_spec, b, alloc, &train, have_test ? &test : NULL, &opt, &t, &fail,
                      &e))
    goto fail;
  const gs_model *gm = gs_train_model(t);
  const gs_recipe *r = gs_train_recipe(t);
  uint64_t spe = train.n / ((uint64_t)r->batch_size * r->accumulation_steps);
  u.every = spe / 10 ? spe / 10 : 1;
  printf("job %s: %u layers, %" PRIu64 " parameters, %s, batch %u x %u accumulation = %u, "
         "%" PRIu64 " train / %" PRIu64 " test examples, %" PRIu64 " steps (%" PRIu64
         " per epoch)\n",
         spec->name && spec->name[0] ? spec->name : job, gm->n_layers, gm->param_count,
         gs_precision_name(r->precision), r->batch_size, r->accumulation_steps,
         r->batch_size * r->accumulation_steps, train.n, have_test ? test.n : 0,
         gs_train_total_steps(t), spe);
  fflush(stdout);
  double t0 = now_s();
  if (gs_train_run(t, &e)) goto fail;
  double secs = now_s() - t0;
  if (u.bar_open) fprintf(stderr, "\n");
  gs_train_result res;
  gs_train_result_get(t, &res);
  if (export && gs_train_export_safetensors(t, export, &e)) goto fail;
  printf("%s after %" PRIu64 " steps (%.1f s): train_loss %.4f test_loss %.4f "
         "test_accuracy %.4f, %.0f samples/s, peak memory %" PRIu64 " bytes",
         res.cancelled ? "cancelled" : "done", res.steps, secs, (double)res.train_loss,
         (double)res.test_loss, (double)res.test_accuracy, (double)res.samples_per_second,
         res.peak_memory_bytes);
  if (r->precision == GS_PRECISION_MIXED_FLOAT16)
    printf(", loss_scale %g, skipped %" PRIu64, (double)res.loss_scale, res.skipped_steps);
  printf("\n");
  if (export) printf("weights written to %s\n", export);
  if (memory_report) {
    gs_timeline tl;
    Gpushare__V1__MemoryTimeline *tlm = NULL;
    char *txt = NULL;
    if (gs_train_memory_timeline(t, planned_peak, &tl) == 0) {
      if (gs_spec_pb_timeline(&tl, &tlm) == 0) txt = gs_present_timeline(tlm);
      gs_timeline_free(&tl);
    }
    if (txt)
      printf("%s", txt);
    else
      fprintf(stderr, "gpushare-run: out of host memory for the memory report\n");
    free(txt);
    if (tlm) gpushare__v1__memory_timeline__free_unpacked(tlm, NULL);
  }
  if (json) {
    printf("{");
    json_num("test_accuracy", res.test_accuracy, false);
    json_num("test_loss", res.test_loss, false);
    json_num("train_loss", res.train_loss, false);
    printf("\"steps\":%" PRIu64 ",\"epochs\":%u,", res.steps, res.epochs_done);
    json_num("samples_per_second", res.samples_per_second, false);
    printf("\"peak_memory_bytes\":%" PRIu64 ",\"planned_peak_bytes\":%" PRIu64
           ",\"memory_limit_bytes\":%" PRIu64 ",\"auto_fit\":%s,",
           res.peak_memory_bytes, planned_peak, limit, adm.chosen ? "true" : "false");
    json_num("loss_scale", res.loss_scale, false);
    printf("\"skipped_steps\":%" PRIu64 ",\"precision\":\"%s\",\"batch_size\":%u,"
           "\"accumulation_steps\":%u,\"parameters\":%" PRIu64 ",\"threads\":%d,",
           res.skipped_steps, gs_precision_name(r->precision), r->batch_size,
           r->accumulation_steps, gm->param_count, opt.threads);
    printf("\"cpu_isa\":");
    json_str(isa);
    putchar(',');
    json_num("seconds", secs, true);
    printf(",\"cancelled\":%s}\n", res.cancelled ? "true" : "false");
  }
  status = res.cancelled ? 1 : 0;
  goto out;
fail:
  fflush(stdout);
  fprintf(stderr, "gpushare-run: %s%s%s (%s)\n", e.field, e.field[0] ? ": " : "", e.msg,
          gs_code_name(e.code));
  if (fail.oom) {
    /* The same OomReport the daemon stores, printed for a person. */
    gs_err e2;
    gs_err_clear(&e2);
    char *txt = NULL;
    const gs_oom_where where = {.vdev = "gpushare-run"};
    gs_oom_report rep;
    if (gs_oom_report_build(&run_spec, b, &fail, &where, &rep, &e2) == 0 &&
        gs_spec_pb_oom_report(&rep, &oom) == 0 && (txt = gs_present_oom(oom)))
      fprintf(stderr, "%s", txt);
    free(txt);
    if (json && oom) {
      printf("{\"oom\":{\"cause\":\"%s\",\"layer\":", cause_word(oom->cause));
      json_str(oom->layer);
      printf(",\"role\":");
      json_str(oom->role);
      printf(",\"shape\":");
      json_str(oom->shape);
      printf(",\"dtype\":");
      json_str(oom->dtype);
      printf(",\"bytes\":%" PRIu64 ",\"limit_bytes\":%" PRIu64 ",\"in_use_bytes\":%" PRIu64
             ",\"reserved_bytes\":%" PRIu64 ",\"largest_free_bytes\":%" PRIu64
             ",\"suggestions\":%zu}}\n",
             oom->bytes, oom->limit_bytes, oom->in_use_bytes, oom->reserved_bytes,
             oom->largest_free_bytes, oom->n_suggestion);
    }
  }
  status = 1;
out:
  if (oom) gpushare__v1__oom_report__free_unpacked(oom, NULL);
  gs_spec_pb_job_free(&run_spec);
  if (have_adm) gs_admission_free(&adm);
  gs_train_destroy(t);
  gs_alloc_destroy(alloc);
  gs_dataset_free(&train);
  gs_dataset_free(&test);
  if (spec) gpushare__v1__job_spec__free_unpacked(spec, NULL);
  free(buf);
  return status;
}
