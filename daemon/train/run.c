/*
 * run.c: gpushare-run, one training job in one process, without the daemon.
 *
 * It is the executor's runtime (train.h) driven from a shell: read a binary
 * gpushare.v1.JobSpec (encoded from text with protoc --encode), load the
 * datasets it names (IDX files or a synthetic set), create a GROWTH vdev
 * allocator on the CPU backend limited to half the machine's RAM, train,
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
 * Synthetic sets: gs_dataset_synthetic draws the class prototypes from the
 * seed, so a test set with another seed is another task. When train and test
 * are synthetic with the same seed and classes, the runner draws
 * train.examples + test.examples from that one generator and splits them:
 * the test examples are unseen examples of the same task.
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

#include "alloc.h"
#include "backend.h"
#include "data.h"
#include "gpushare.pb-c.h"
#include "gs_error.h"
#include "model.h"
#include "train.h"

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

static int parse_u64(const char *s, uint64_t max, uint64_t *out) {
  if (!s || !*s || *s == '-' || *s == '+') return -1;
  errno = 0;
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || *end || v > max) return -1;
  *out = v;
  return 0;
}

static char *read_file(const char *path, size_t *len, gs_err *e) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    gs_err_set(e, GS_NOT_FOUND, "job", "cannot open the job file %s: %s", path,
               strerror(errno));
    return NULL;
  }
  char *buf = malloc(JOB_MAX_BYTES + 1);
  size_t n = buf ? fread(buf, 1, JOB_MAX_BYTES + 1, f) : 0;
  int err = ferror(f);
  fclose(f);
  if (!buf || err) {
    gs_err_set(e, GS_INTERNAL, "job", "cannot read the job file %s", path);
    free(buf);
    return NULL;
  }
  if (n > JOB_MAX_BYTES) {
    gs_err_set(e, GS_INVALID_ARGUMENT, "job", "the job file %s is over %u bytes: a JobSpec "
               "is small (datasets are separate files)", path, JOB_MAX_BYTES);
    free(buf);
    return NULL;
  }
  *len = n;
  return buf;
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

static int load_dataset(const Gpushare__V1__Dataset *d, const char *which,
                        const Gpushare__V1__JobSpec *spec, const char *job_dir,
                        const char *data_dir, gs_dataset *out, gs_err *e) {
  char img[PATH_MAX], lab[PATH_MAX];
  int rc;
  switch (d->source_case) {
  case GPUSHARE__V1__DATASET__SOURCE_IDX:
    if (!d->idx->images || !d->idx->images[0] || !d->idx->labels || !d->idx->labels[0]) {
      gs_err_set(e, GS_INVALID_ARGUMENT, !d->idx->images || !d->idx->images[0] ? "idx.images"
                                                                               : "idx.labels",
                 "the %s dataset's idx needs both images and labels paths", which);
      break;
    }
    if (!strncmp(d->idx->images, "sha256:", 7) || !strncmp(d->idx->labels, "sha256:", 7)) {
      gs_err_set(e, GS_INVALID_ARGUMENT, "idx.images",
                 "the %s dataset names a blob in the daemon's store (sha256:...); "
                 "gpushare-run reads IDX files: give their paths",
                 which);
      break;
    }
    resolve(d->idx->images, job_dir, data_dir, img, sizeof img);
    resolve(d->idx->labels, job_dir, data_dir, lab, sizeof lab);
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
  case GPUSHARE__V1__DATASET__SOURCE_NAME:
    gs_err_set(e, GS_INVALID_ARGUMENT, "name",
               "the %s dataset \"%s\" is a name in the daemon's store; gpushare-run needs idx "
               "file paths or a synthetic set",
               which, d->name);
    break;
  case GPUSHARE__V1__DATASET__SOURCE_SYNTHETIC: {
    const Gpushare__V1__SyntheticDataset *s = d->synthetic;
    const Gpushare__V1__InputShape *in = spec->model ? spec->model->input : NULL;
    if (!in) {
      gs_err_set(e, GS_INVALID_ARGUMENT, "model.input",
                 "a synthetic dataset takes its image shape from model.input, which is missing");
      return -EINVAL;
    }
    rc = gs_dataset_synthetic(s->examples, in->height, in->width, in->channels, s->classes,
                              s->seed, out, e);
    if (rc) {
      gs_err_prefix(e, "synthetic");
      gs_err_prefix(e, which);
    }
    return rc;
  }
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

static const char *precision_name(int p) {
  switch (p) {
  case GPUSHARE__V1__PRECISION__MIXED_FLOAT16: return "mixed_float16";
  case GPUSHARE__V1__PRECISION__MIXED_BFLOAT16: return "mixed_bfloat16";
  default: return "float32";
  }
}

static void json_num(const char *k, double v, bool last) {
  if (isfinite(v))
    printf("\"%s\":%.9g%s", k, v, last ? "" : ",");
  else
    printf("\"%s\":null%s", k, last ? "" : ",");
}

int main(int argc, char **argv) {
  const char *job = NULL, *ckpt = NULL, *resume = NULL, *export = NULL;
  const char *data_dir = DEFAULT_DATA_DIR;
  gs_train_options opt = {.threads = 1};
  bool json = false;
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
                                         "--checkpoint", "--resume", "--export", "--data-dir"};
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
        opt.precision = GPUSHARE__V1__PRECISION__FLOAT32;
      else if (!strcmp(val, "mixed_float16"))
        opt.precision = GPUSHARE__V1__PRECISION__MIXED_FLOAT16;
      else if (!strcmp(val, "mixed_bfloat16"))
        opt.precision = GPUSHARE__V1__PRECISION__MIXED_BFLOAT16;
      else
        return bad_flag(flag, val, "float32, mixed_float16 or mixed_bfloat16");
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

  if (!(buf = read_file(job, &len, &e))) goto fail;
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

  /* The spec is validated before any dataset is read. */
  gs_model m;
  if (gs_model_build(spec, &m, &e)) goto fail;
  gs_model_free(&m);
  if (!spec->train) {
    gs_err_set(&e, GS_INVALID_ARGUMENT, "train", "the job has no train dataset");
    goto fail;
  }
  const Gpushare__V1__Dataset *tr = spec->train, *te = spec->test;
  if (te && tr->source_case == GPUSHARE__V1__DATASET__SOURCE_SYNTHETIC &&
      te->source_case == GPUSHARE__V1__DATASET__SOURCE_SYNTHETIC &&
      tr->synthetic->seed == te->synthetic->seed &&
      tr->synthetic->classes == te->synthetic->classes && tr->synthetic->examples > 0 &&
      te->synthetic->examples > 0) {
    /* One seed, one task: the test examples are drawn after the train
     * examples from the same generator (same class prototypes, unseen
     * examples). A different seed is a different task. */
    Gpushare__V1__SyntheticDataset both = *tr->synthetic;
    both.examples = tr->synthetic->examples + te->synthetic->examples;
    Gpushare__V1__Dataset d = *tr;
    d.synthetic = &both;
    gs_dataset all = {0};
    if (load_dataset(&d, "train", spec, job_dir, data_dir, &all, &e)) goto fail;
    int rc = gs_dataset_slice(&all, 0, tr->synthetic->examples, &train, &e);
    if (!rc) rc = gs_dataset_slice(&all, tr->synthetic->examples, te->synthetic->examples, &test, &e);
    gs_dataset_free(&all);
    if (rc) goto fail;
    have_test = true;
  } else {
    if (load_dataset(tr, "train", spec, job_dir, data_dir, &train, &e)) goto fail;
    if (te) {
      if (load_dataset(te, "test", spec, job_dir, data_dir, &test, &e)) goto fail;
      have_test = true;
    }
  }

  gs_backend *b = gs_backend_cpu();
  uint64_t total = 0, free_bytes = 0;
  if (b->device_memory(b, 0, &total, &free_bytes) || total == 0) {
    gs_err_set(&e, GS_INTERNAL, "", "the %s backend cannot say how much memory it has",
               b->name);
    goto fail;
  }
  if (gs_alloc_create(b, 0, total / 2, GS_POLICY_GROWTH, &alloc)) {
    gs_err_set(&e, GS_RESOURCE_EXHAUSTED, "", "cannot create a %" PRIu64 "-byte vdev on %s",
               total / 2, b->name);
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

  if (gs_train_create(spec, b, alloc, &train, have_test ? &test : NULL, &opt, &t, &fail, &e))
    goto fail;
  const gs_model *gm = gs_train_model(t);
  const gs_recipe *r = gs_train_recipe(t);
  uint64_t spe = train.n / ((uint64_t)r->batch_size * r->accumulation_steps);
  u.every = spe / 10 ? spe / 10 : 1;
  printf("job %s: %u layers, %" PRIu64 " parameters, %s, batch %u x %u accumulation = %u, "
         "%" PRIu64 " train / %" PRIu64 " test examples, %" PRIu64 " steps (%" PRIu64
         " per epoch)\n",
         spec->name && spec->name[0] ? spec->name : job, gm->n_layers, gm->param_count,
         precision_name(r->precision), r->batch_size, r->accumulation_steps,
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
  if (r->precision == GPUSHARE__V1__PRECISION__MIXED_FLOAT16)
    printf(", loss_scale %g, skipped %" PRIu64, (double)res.loss_scale, res.skipped_steps);
  printf("\n");
  if (export) printf("weights written to %s\n", export);
  if (json) {
    printf("{");
    json_num("test_accuracy", res.test_accuracy, false);
    json_num("test_loss", res.test_loss, false);
    json_num("train_loss", res.train_loss, false);
    printf("\"steps\":%" PRIu64 ",\"epochs\":%u,", res.steps, res.epochs_done);
    json_num("samples_per_second", res.samples_per_second, false);
    printf("\"peak_memory_bytes\":%" PRIu64 ",", res.peak_memory_bytes);
    json_num("loss_scale", res.loss_scale, false);
    printf("\"skipped_steps\":%" PRIu64 ",\"precision\":\"%s\",\"batch_size\":%u,"
           "\"accumulation_steps\":%u,\"parameters\":%" PRIu64 ",\"threads\":%d,",
           res.skipped_steps, precision_name(r->precision), r->batch_size,
           r->accumulation_steps, gm->param_count, opt.threads);
    json_num("seconds", secs, true);
    printf(",\"cancelled\":%s}\n", res.cancelled ? "true" : "false");
  }
  status = res.cancelled ? 1 : 0;
  goto out;
fail:
  fflush(stdout);
  fprintf(stderr, "gpushare-run: %s%s%s (%s)\n", e.field, e.field[0] ? ": " : "", e.msg,
          gs_code_name(e.code));
  status = 1;
out:
  gs_train_destroy(t);
  gs_alloc_destroy(alloc);
  gs_dataset_free(&train);
  gs_dataset_free(&test);
  if (spec) gpushare__v1__job_spec__free_unpacked(spec, NULL);
  free(buf);
  return status;
}
