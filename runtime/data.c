/*
 * data.c: IDX and synthetic datasets for gpushare's training runtime.
 *
 * IDX pairs (the MNIST family) are read by runtime/idx.c, the one IDX
 * reader, which checks every header before it allocates a body; .npy pairs
 * by runtime/npy.c, token streams by runtime/tokens.c. Here an images file
 * and a labels file of equal counts become one gs_dataset, its images on
 * huge pages where the set is big, and a token file a set of examples.
 *
 * The synthetic set and the data order use splitmix64 with integer-only
 * arithmetic, so they are identical on every machine.
 */
#include "runtime/data.h"

#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/file.h"
#include "runtime/idx.h"
#include "runtime/npy.h"
#include "runtime/tokens.h"

/* ---- PRNG ---------------------------------------------------------------- */

uint64_t gs_rng_next(uint64_t *state) {
  uint64_t z = (*state += UINT64_C(0x9E3779B97F4A7C15));
  z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
  z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
  return z ^ (z >> 31);
}

float gs_rng_uniform(uint64_t *state) {
  return (float)(gs_rng_next(state) >> 40) * (1.0f / 16777216.0f);
}

uint64_t gs_rng_below(uint64_t *state, uint64_t bound) {
  if (bound <= 1) return 0;
  /* Reject the lowest (2^64 mod bound) values so every residue is equally
   * likely: threshold = 2^64 mod bound, computed in 64-bit arithmetic. */
  uint64_t threshold = (0 - bound) % bound;
  for (;;) {
    uint64_t r = gs_rng_next(state);
    if (r >= threshold) return r % bound;
  }
}

uint64_t gs_rng_seed(uint64_t seed, uint64_t stream) {
  uint64_t s = seed ^ UINT64_C(0x6A09E667F3BCC909);
  uint64_t a = gs_rng_next(&s);
  uint64_t t = stream ^ a ^ UINT64_C(0xBB67AE8584CAA73B);
  return gs_rng_next(&t) ^ a;
}

void gs_dataset_shuffle(uint64_t *perm, uint64_t n, uint64_t seed, uint64_t epoch) {
  for (uint64_t i = 0; i < n; i++) perm[i] = i;
  uint64_t st = gs_rng_seed(seed, epoch);
  for (uint64_t i = n; i > 1; i--) {
    uint64_t j = gs_rng_below(&st, i);
    uint64_t t = perm[i - 1];
    perm[i - 1] = perm[j];
    perm[j] = t;
  }
}

/* ---- IDX (runtime/idx.c reads; here the pair becomes a dataset) -------- */

/* Images of a big set on 2 MiB pages. A batch gathers examples from
 * anywhere in the set, each a TLB miss on 4 KiB pages, and the gather runs
 * on the job's thread every step. Linux backs a 2 MiB-aligned range advised
 * MADV_HUGEPAGE with huge pages even where transparent huge pages are
 * "madvise" only, Debian's default. Below HUGE_MIN, or where that fails,
 * the ordinary heap. */
#define HUGE_PAGE ((size_t)2 << 20)
#define HUGE_MIN ((size_t)4 << 20)
/* A loaded set is moved (images_rehome) only up to this: the move holds two
 * copies for a moment, and a bigger set keeps its 4 KiB pages rather than
 * double the loader's peak. */
#define HUGE_REHOME_MAX ((size_t)1 << 30)

static void *images_alloc(size_t bytes) {
#ifdef MADV_HUGEPAGE
  void *p;
  if (bytes >= HUGE_MIN && posix_memalign(&p, HUGE_PAGE, bytes) == 0) {
    (void)madvise(p, bytes & ~(HUGE_PAGE - 1), MADV_HUGEPAGE); /* advice: may be refused */
    return p;
  }
#endif
  return malloc(bytes ? bytes : 1);
}

/* buf (bytes, from the heap) moved to images_alloc's memory where that is
 * huge pages, up to HUGE_REHOME_MAX; buf itself otherwise. */
static uint8_t *images_rehome(uint8_t *buf, size_t bytes) {
  if (bytes < HUGE_MIN || bytes > HUGE_REHOME_MAX) return buf;
  uint8_t *p = images_alloc(bytes);
  if (!p) return buf;
  memcpy(p, buf, bytes);
  free(buf);
  return p;
}

static const char *base_name(const char *path) {
  const char *s = strrchr(path, '/');
  return s ? s + 1 : path;
}

/* One IDX input in memory: its header, then its whole body (malloc'd). */
static int read_idx(const uint8_t *p, size_t len, const char *name, const char *field,
                    gs_idx_kind kind, gs_idx_header *h, uint8_t **body, gs_err *e) {
  gs_idx *x;
  int rc = gs_idx_open_mem(p, len, name, field, &x, e);
  if (rc) return rc;
  rc = gs_idx_read_header(x, kind, h, e);
  if (!rc) rc = gs_idx_read_body(x, h, body, NULL, e);
  gs_idx_close(x);
  return rc;
}

int gs_dataset_load_idx_mem_named(const uint8_t *img, size_t img_len, const char *img_name,
                                  const uint8_t *lab, size_t lab_len, const char *lab_name,
                                  gs_dataset *out, gs_err *e) {
  int rc;
  uint8_t *pix = NULL, *lb = NULL;
  int32_t *labels = NULL;
  uint64_t ilen = 0, llen = 0;
  memset(out, 0, sizeof *out);

  const char *iname = img_name ? img_name : "the images data";
  const char *lname = lab_name ? lab_name : "the labels data";
  gs_idx_header ih, lh;
  if ((rc = read_idx(img, img_len, iname, "images", GS_IDX_IMAGES, &ih, &pix, e))) goto fail;
  if ((rc = read_idx(lab, lab_len, lname, "labels", GS_IDX_LABELS, &lh, &lb, e))) goto fail;
  ilen = ih.elems;
  llen = lh.elems;
  if (lh.dims[0] != ih.dims[0]) {
    rc = GS_DATASET_ECOUNT;
    gs_err_set(e, GS_INVALID_ARGUMENT, "labels",
               "%s has %u labels but the images file %s has %u images", lname, lh.dims[0],
               iname, ih.dims[0]);
    goto fail;
  }
  labels = malloc(sizeof *labels * llen);
  if (!labels) {
    rc = -ENOMEM;
    gs_err_set(e, GS_RESOURCE_EXHAUSTED, "labels", "no memory for %llu labels",
               (unsigned long long)llen);
    goto fail;
  }
  /* Labels are unsigned bytes, so each is < 256 by construction. */
  uint32_t maxl = 0;
  for (uint64_t i = 0; i < llen; i++) {
    labels[i] = lb[i];
    if (lb[i] > maxl) maxl = lb[i];
  }
  free(lb);
  lb = NULL;
  out->n = ih.dims[0];
  out->h = ih.dims[1];
  out->w = ih.dims[2];
  out->c = ih.ndims == 4 ? ih.dims[3] : 1;
  out->classes = maxl + 1 < 2 ? 2 : maxl + 1;
  out->images = images_rehome(pix, (size_t)ilen);
  out->labels = labels;
  return 0;
fail:
  free(pix);
  free(lb);
  free(labels);
  return rc;
}

int gs_dataset_load_idx_mem(const uint8_t *img, size_t img_len, const uint8_t *lab,
                            size_t lab_len, gs_dataset *out, gs_err *e) {
  return gs_dataset_load_idx_mem_named(img, img_len, NULL, lab, lab_len, NULL, out, e);
}

int gs_dataset_load_idx(const char *images_path, const char *labels_path, gs_dataset *out,
                        gs_err *e) {
  uint8_t *img = NULL, *lab = NULL;
  size_t ilen = 0, llen = 0;
  int rc;
  memset(out, 0, sizeof *out);
  /* An IDX file is at most its header and GS_DATASET_MAX_ELEMS bytes, or
   * smaller compressed. */
  const uint64_t cap = GS_DATASET_MAX_ELEMS + 20;
  if ((rc = gs_file_read(images_path, cap, "images", &img, &ilen, e))) goto fail;
  if ((rc = gs_file_read(labels_path, cap, "labels", &lab, &llen, e))) goto fail;
  rc = gs_dataset_load_idx_mem_named(img, ilen, base_name(images_path), lab, llen,
                                     base_name(labels_path), out, e);
fail:
  free(img);
  free(lab);
  return rc;
}

/* ---- .npy (runtime/npy.c reads; here the pair becomes a dataset) -------- */

/* One .npy input in memory, checked whole: header, length, elements. */
static int check_npy(const uint8_t *p, size_t len, const char *name, const char *field,
                     gs_npy_kind kind, gs_npy_header *h, uint64_t *max_label, gs_err *e) {
  int rc = gs_npy_read_header(p, len, name, field, kind, h, e);
  if (!rc) rc = gs_npy_check_length(h, len, name, field, e);
  if (!rc) rc = gs_npy_scan(h, p + h->data_offset, 0, h->elems, name, field, max_label, e);
  return rc;
}

int gs_dataset_load_npy_mem_named(const uint8_t *img, size_t img_len, const char *img_name,
                                  const uint8_t *lab, size_t lab_len, const char *lab_name,
                                  gs_dataset *out, gs_err *e) {
  int rc;
  void *pix = NULL;
  int32_t *labels = NULL;
  memset(out, 0, sizeof *out);
  const char *iname = img_name ? img_name : "the images data";
  const char *lname = lab_name ? lab_name : "the labels data";
  gs_npy_header ih, lh;
  uint64_t maxl = 0;
  if ((rc = check_npy(img, img_len, iname, "images", GS_NPY_IMAGES, &ih, NULL, e))) goto fail;
  if ((rc = check_npy(lab, lab_len, lname, "labels", GS_NPY_LABELS, &lh, &maxl, e))) goto fail;
  if (lh.dims[0] != ih.dims[0]) {
    rc = GS_DATASET_ECOUNT;
    gs_err_set(e, GS_INVALID_ARGUMENT, "labels",
               "%s has %llu labels but the images file %s has %llu images", lname,
               (unsigned long long)lh.dims[0], iname, (unsigned long long)ih.dims[0]);
    goto fail;
  }
  const size_t bytes = (size_t)(ih.elems * ih.itemsize);
  pix = images_alloc(bytes);
  labels = malloc(sizeof *labels * (size_t)lh.elems);
  if (!pix || !labels) {
    rc = -ENOMEM;
    gs_err_set(e, GS_RESOURCE_EXHAUSTED, "images", "no memory for the %llu examples of %s",
               (unsigned long long)ih.dims[0], iname);
    goto fail;
  }
  /* Little-endian in the file and on every host gpushare builds for. */
  _Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "float32 pixels are copied as bytes");
  memcpy(pix, img + ih.data_offset, bytes);
  const uint8_t *lb = lab + lh.data_offset;
  for (uint64_t i = 0; i < lh.elems; i++) labels[i] = (int32_t)gs_npy_int(&lh, lb, i);
  out->n = ih.dims[0];
  out->h = (uint32_t)ih.dims[1];
  out->w = (uint32_t)ih.dims[2];
  out->c = ih.ndims == 4 ? (uint32_t)ih.dims[3] : 1;
  out->classes = maxl + 1 < 2 ? 2 : (uint32_t)maxl + 1;
  if (ih.dtype == GS_NPY_F4) out->images_f32 = pix;
  else out->images = pix;
  out->labels = labels;
  return 0;
fail:
  free(pix);
  free(labels);
  return rc;
}

int gs_dataset_load_npy(const char *images_path, const char *labels_path, gs_dataset *out,
                        gs_err *e) {
  uint8_t *img = NULL, *lab = NULL;
  size_t ilen = 0, llen = 0;
  int rc;
  memset(out, 0, sizeof *out);
  /* A .npy file is at most its header and GS_DATASET_MAX_ELEMS bytes. */
  const uint64_t cap = GS_DATASET_MAX_ELEMS + GS_NPY_MAX_HEADER + 12;
  if ((rc = gs_file_read(images_path, cap, "images", &img, &ilen, e))) goto out;
  if ((rc = gs_file_read(labels_path, cap, "labels", &lab, &llen, e))) goto out;
  rc = gs_dataset_load_npy_mem_named(img, ilen, base_name(images_path), lab, llen,
                                     base_name(labels_path), out, e);
out:
  free(img);
  free(lab);
  return rc;
}

/* ---- token streams (runtime/tokens.c checks; here they become examples) - */

int gs_dataset_load_tokens_mem_named(const uint8_t *p, size_t len, const char *name,
                                     gs_token_format format, uint32_t vocab_size,
                                     uint32_t seq_len, gs_dataset *out, gs_err *e) {
  memset(out, 0, sizeof *out);
  const char *nm = name ? name : "the token data";
  uint32_t vocab;
  uint64_t n;
  int rc = gs_tokens_vocab(format, vocab_size, "vocab_size", &vocab, e);
  if (rc) return rc;
  if (seq_len == 0)
    return gs_err_set(e, GS_INVALID_ARGUMENT, "sequence_length",
                      "sequence_length is 0; a token dataset needs the model's sequence length "
                      "T >= 1 (each example reads T + 1 tokens)");
  if ((rc = gs_tokens_count(format, len, (uint64_t)seq_len + 1, nm, "data", &n, e))) return rc;
  if ((rc = gs_tokens_scan(format, p, len, 0, vocab, nm, "data", e))) return rc;
  uint16_t *t = malloc(sizeof *t * (size_t)n);
  if (!t)
    return gs_err_set(e, GS_RESOURCE_EXHAUSTED, "data", "no memory for the %llu tokens of %s",
                      (unsigned long long)n, nm),
           -ENOMEM;
  if (format == GS_TOKENS_TEXT)
    for (uint64_t i = 0; i < n; i++) t[i] = p[i];
  else
    for (uint64_t i = 0; i < n; i++) t[i] = (uint16_t)(p[2 * i] | p[2 * i + 1] << 8);
  out->kind = GS_DATA_TOKENS;
  out->n = (n - 1) / seq_len;
  out->seq_len = seq_len;
  out->classes = vocab;
  /* The dropped tail is not kept: the set holds what its examples read. */
  uint16_t *fit = realloc(t, sizeof *t * (size_t)(out->n * seq_len + 1));
  out->tokens = fit ? fit : t;
  return 0;
}

int gs_dataset_load_tokens(const char *path, gs_token_format format, uint32_t vocab_size,
                           uint32_t seq_len, gs_dataset *out, gs_err *e) {
  uint8_t *p = NULL;
  size_t len = 0;
  memset(out, 0, sizeof *out);
  int rc = gs_file_read(path, GS_TOKENS_MAX * gs_tokens_width(format), "data", &p, &len, e);
  if (!rc)
    rc = gs_dataset_load_tokens_mem_named(p, len, base_name(path), format, vocab_size, seq_len,
                                          out, e);
  free(p);
  return rc;
}

/* ---- a job's sets -------------------------------------------------------- */

static int load_synthetic(const gs_job_spec *spec, const char *which, uint64_t examples,
                          const gs_spec_dataset *d, gs_dataset *out, gs_err *e) {
  if (!spec->has_input)
    return gs_err_set(e, GS_INVALID_ARGUMENT, "model.input",
                      "a synthetic dataset takes its image shape from model.input, which is "
                      "missing");
  int rc = gs_dataset_synthetic(examples, spec->input.height, spec->input.width,
                                spec->input.channels, d->classes, d->seed, out, e);
  if (rc) {
    gs_err_prefix(e, "synthetic");
    gs_err_prefix(e, which);
  }
  return rc;
}

static bool is_stream(const gs_spec_dataset *d) {
  return d->source == GS_DATASET_TEXT || d->source == GS_DATASET_TOKENS;
}

static const char *stream_key(const gs_spec_dataset *d) {
  return d->source == GS_DATASET_TEXT ? "text" : "tokens";
}

/* A stream's fields, checked before its file is read. */
static int check_stream(const char *which, const gs_spec_dataset *d, gs_err *e) {
  const char *k = stream_key(d);
  char f[64];
  uint32_t vocab;
  if (!d->path || !d->path[0]) {
    snprintf(f, sizeof f, "%s.%s.path", which, k);
    return gs_err_set(e, GS_INVALID_ARGUMENT, f, "the %s dataset's %s names no file: set path",
                      which, k);
  }
  if (d->sequence_length == 0) {
    snprintf(f, sizeof f, "%s.sequence_length", which);
    return gs_err_set(e, GS_INVALID_ARGUMENT, f,
                      "%s.sequence_length is 0; a %s dataset is cut into examples of the "
                      "model's sequence length T >= 1, each reading T + 1 tokens",
                      which, k);
  }
  snprintf(f, sizeof f, "%s.tokens.vocab_size", which);
  return gs_tokens_vocab(d->source == GS_DATASET_TEXT ? GS_TOKENS_TEXT : GS_TOKENS_U16,
                         d->vocab_size, f, &vocab, e);
}

/* Do train and test read one stream (then they split it)? */
static bool same_stream(const gs_spec_dataset *a, const gs_spec_dataset *b) {
  return is_stream(a) && a->source == b->source && a->path && b->path &&
         strcmp(a->path, b->path) == 0 && a->sequence_length == b->sequence_length &&
         (a->source == GS_DATASET_TEXT || a->vocab_size == b->vocab_size);
}

/* Examples [first, first + count) of a loaded stream into out (count 0:
 * all from first on); *all is moved, not copied, when that is all of it,
 * and freed by the caller either way. */
static int stream_take(gs_dataset *all, const char *which, const gs_spec_dataset *d,
                       uint64_t first, uint64_t count, gs_dataset *out, gs_err *e) {
  char f[64];
  snprintf(f, sizeof f, "%s.%s.examples", which, stream_key(d));
  uint64_t left = first < all->n ? all->n - first : 0;
  if (count == 0) count = left;
  if (count == 0 || count > left)
    return gs_err_set(e, GS_INVALID_ARGUMENT, f,
                      "%s takes %llu examples from example %llu on, but the file holds %llu "
                      "examples of sequence_length %u (%llu tokens)",
                      which, (unsigned long long)count, (unsigned long long)first,
                      (unsigned long long)all->n, all->seq_len,
                      (unsigned long long)(all->n * all->seq_len + 1));
  if (first == 0 && count == all->n) {
    *out = *all;
    memset(all, 0, sizeof *all);
    return 0;
  }
  int rc = gs_dataset_slice(all, first, count, out, e);
  if (rc) gs_err_prefix(e, which);
  return rc;
}

static int load_set(const gs_job_spec *spec, const char *which, const gs_spec_dataset *d,
                    gs_dataset_idx_fn load_idx, const void *user, gs_dataset *out, gs_err *e) {
  if (d->source == GS_DATASET_SYNTHETIC)
    return load_synthetic(spec, which, d->examples, d, out, e);
  if (!is_stream(d)) return load_idx(user, which, d, out, e);
  gs_dataset all;
  int rc = check_stream(which, d, e);
  if (!rc) rc = load_idx(user, which, d, &all, e);
  if (rc) return rc;
  if (all.n == 0) {
    *out = all;
    return 0;
  }
  rc = stream_take(&all, which, d, 0, d->examples, out, e);
  gs_dataset_free(&all);
  return rc;
}

/* Train and test of one stream: train its first train.examples, test the
 * next test.examples (0: the rest), as synthetic sets of one task split. */
static int load_shared_stream(const gs_job_spec *spec, gs_dataset_idx_fn load_idx,
                              const void *user, gs_dataset *train, gs_dataset *test, gs_err *e) {
  const gs_spec_dataset *tr = &spec->train, *te = &spec->test;
  char f[64];
  if (tr->examples == 0) {
    snprintf(f, sizeof f, "train.%s.examples", stream_key(tr));
    return gs_err_set(e, GS_INVALID_ARGUMENT, f,
                      "train.%s.examples is 0, but test names the same file: set how many "
                      "examples train takes (test takes the next test.%s.examples, 0: the rest)",
                      stream_key(tr), stream_key(tr));
  }
  gs_dataset all;
  int rc = check_stream("train", tr, e);
  if (!rc) rc = load_idx(user, "train", tr, &all, e);
  if (rc) return rc;
  if (tr->examples == all.n) {
    snprintf(f, sizeof f, "test.%s.examples", stream_key(te));
    rc = gs_err_set(e, GS_INVALID_ARGUMENT, f,
                    "the file holds %llu examples and train takes them all "
                    "(train.%s.examples %llu): none are left for test",
                    (unsigned long long)all.n, stream_key(tr), (unsigned long long)tr->examples);
  }
  /* train takes fewer than all (or is refused): a copy, all stays whole. */
  if (!rc) rc = stream_take(&all, "train", tr, 0, tr->examples, train, e);
  if (!rc) rc = stream_take(&all, "test", te, tr->examples, te->examples, test, e);
  gs_dataset_free(&all);
  return rc;
}

int gs_dataset_load_job(const gs_job_spec *spec, gs_dataset_idx_fn load_idx, const void *user,
                        gs_dataset *train, gs_dataset *test, bool *has_test, gs_err *e) {
  const gs_spec_dataset *tr = &spec->train, *te = &spec->test;
  int rc = 0;
  *has_test = false;
  memset(train, 0, sizeof *train);
  memset(test, 0, sizeof *test);
  if (tr->source == GS_DATASET_NONE)
    return gs_err_set(e, GS_INVALID_ARGUMENT, "train", "the job has no train dataset");
  if (tr->source == GS_DATASET_SYNTHETIC && te->source == GS_DATASET_SYNTHETIC &&
      tr->seed == te->seed && tr->classes == te->classes && tr->examples > 0 &&
      te->examples > 0 && tr->examples <= UINT64_MAX - te->examples) {
    gs_dataset all;
    rc = load_synthetic(spec, "train", tr->examples + te->examples, tr, &all, e);
    if (rc) return rc;
    rc = gs_dataset_slice(&all, 0, tr->examples, train, e);
    if (!rc) rc = gs_dataset_slice(&all, tr->examples, te->examples, test, e);
    gs_dataset_free(&all);
    if (rc) goto fail;
    *has_test = true;
    return 0;
  }
  if (same_stream(tr, te)) {
    if ((rc = load_shared_stream(spec, load_idx, user, train, test, e))) goto fail;
    *has_test = true;
    return 0;
  }
  if ((rc = load_set(spec, "train", tr, load_idx, user, train, e))) goto fail;
  if (train->n == 0) {
    rc = gs_err_set(e, GS_INVALID_ARGUMENT, "train", "the job's train dataset is empty");
    goto fail;
  }
  if (te->source == GS_DATASET_NONE) return 0;
  if ((rc = load_set(spec, "test", te, load_idx, user, test, e))) goto fail;
  *has_test = test->n > 0;
  return 0;
fail:
  gs_dataset_free(train);
  gs_dataset_free(test);
  return rc;
}

/* ---- synthetic, slice, gather ------------------------------------------- */

int gs_dataset_synthetic(uint64_t n, uint32_t h, uint32_t w, uint32_t c, uint32_t classes,
                         uint64_t seed, gs_dataset *out, gs_err *e) {
  int rc = 0;
  uint8_t *proto = NULL, *pix = NULL;
  int32_t *labels = NULL;
  memset(out, 0, sizeof *out);
  if (n == 0) return gs_err_set(e, GS_INVALID_ARGUMENT, "examples", "examples is 0; a synthetic set needs at least 1"), -EINVAL;
  if (h == 0) return gs_err_set(e, GS_INVALID_ARGUMENT, "height", "height is 0; images need at least 1 row"), -EINVAL;
  if (w == 0) return gs_err_set(e, GS_INVALID_ARGUMENT, "width", "width is 0; images need at least 1 column"), -EINVAL;
  if (c == 0) return gs_err_set(e, GS_INVALID_ARGUMENT, "channels", "channels is 0; images need at least 1 channel"), -EINVAL;
  if (classes < 2 || classes > 65536)
    return gs_err_set(e, GS_INVALID_ARGUMENT, "classes",
                      "classes is %u; a synthetic set has 2 to 65536 classes", classes),
           -EINVAL;
  uint64_t img = (uint64_t)h * w; /* < 2^64: both < 2^32 */
  if (img > GS_DATASET_MAX_ELEMS || (img *= c) > GS_DATASET_MAX_ELEMS ||
      n > GS_DATASET_MAX_ELEMS / img)
    return gs_err_set(e, GS_RESOURCE_EXHAUSTED, "examples",
                      "%llu examples of %ux%ux%u are more than the %llu pixels (4 GiB) a "
                      "dataset may hold",
                      (unsigned long long)n, h, w, c, (unsigned long long)GS_DATASET_MAX_ELEMS),
           GS_DATASET_ETOOBIG;
  if ((uint64_t)classes > GS_DATASET_MAX_ELEMS / img)
    return gs_err_set(e, GS_RESOURCE_EXHAUSTED, "classes",
                      "%u class prototypes of %ux%ux%u are more than %llu pixels", classes, h,
                      w, c, (unsigned long long)GS_DATASET_MAX_ELEMS),
           GS_DATASET_ETOOBIG;
  proto = malloc((size_t)(img * classes));
  pix = images_alloc((size_t)(img * n));
  labels = malloc(sizeof *labels * (size_t)n);
  if (!proto || !pix || !labels) {
    rc = -ENOMEM;
    gs_err_set(e, GS_RESOURCE_EXHAUSTED, "examples",
               "no memory for %llu synthetic examples of %ux%ux%u", (unsigned long long)n, h, w,
               c);
    goto fail;
  }
  /* Prototypes: each pixel uniform in [32, 224), leaving room for the noise. */
  uint64_t st = gs_rng_seed(seed, 0x70726f746fULL /* "proto" */);
  for (uint64_t i = 0; i < img * classes; i++) proto[i] = (uint8_t)(32 + gs_rng_below(&st, 192));
  /* Examples: prototype + noise uniform in [-32, 32]; labels uniform. */
  uint64_t sl = gs_rng_seed(seed, 0x6c6162656cULL /* "label" */);
  uint64_t sn = gs_rng_seed(seed, 0x6e6f697365ULL /* "noise" */);
  for (uint64_t i = 0; i < n; i++) {
    uint32_t y = (uint32_t)gs_rng_below(&sl, classes);
    labels[i] = (int32_t)y;
    const uint8_t *p = proto + (uint64_t)y * img;
    uint8_t *dst = pix + i * img;
    for (uint64_t k = 0; k < img; k++) {
      int v = (int)p[k] + (int)gs_rng_below(&sn, 65) - 32;
      dst[k] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
    }
  }
  free(proto);
  out->n = n;
  out->h = h;
  out->w = w;
  out->c = c;
  out->classes = classes;
  out->images = pix;
  out->labels = labels;
  return 0;
fail:
  free(proto);
  free(pix);
  free(labels);
  return rc;
}

int gs_dataset_slice(const gs_dataset *src, uint64_t first, uint64_t count, gs_dataset *out,
                     gs_err *e) {
  memset(out, 0, sizeof *out);
  if (count == 0 || first >= src->n || count > src->n - first)
    return gs_err_set(e, GS_INVALID_ARGUMENT, "slice",
                      "slice [%llu, %llu + %llu) is outside the dataset's %llu examples (or "
                      "empty)",
                      (unsigned long long)first, (unsigned long long)first,
                      (unsigned long long)count, (unsigned long long)src->n),
           -EINVAL;
  if (src->kind == GS_DATA_TOKENS) {
    const uint64_t t = (uint64_t)src->seq_len;
    uint16_t *tok = malloc(sizeof *tok * (size_t)(count * t + 1));
    if (!tok)
      return gs_err_set(e, GS_RESOURCE_EXHAUSTED, "slice",
                        "no memory for a slice of %llu examples", (unsigned long long)count),
             -ENOMEM;
    memcpy(tok, src->tokens + first * t, sizeof *tok * (size_t)(count * t + 1));
    *out = *src;
    out->n = count;
    out->tokens = tok;
    return 0;
  }
  uint64_t img = gs_dataset_image_bytes(src);
  const size_t px = src->images_f32 ? sizeof(float) : 1;
  uint8_t *pix = images_alloc((size_t)(img * count) * px);
  int32_t *labels = malloc(sizeof *labels * (size_t)count);
  if (!pix || !labels) {
    free(pix);
    free(labels);
    return gs_err_set(e, GS_RESOURCE_EXHAUSTED, "slice", "no memory for a slice of %llu examples",
                      (unsigned long long)count),
           -ENOMEM;
  }
  const uint8_t *from = src->images_f32 ? (const uint8_t *)src->images_f32 : src->images;
  memcpy(pix, from + first * img * px, (size_t)(img * count) * px);
  memcpy(labels, src->labels + first, sizeof *labels * (size_t)count);
  *out = *src;
  out->n = count;
  if (src->images_f32) out->images_f32 = (float *)(void *)pix;
  else out->images = pix;
  out->labels = labels;
  return 0;
}

void gs_dataset_free(gs_dataset *d) {
  if (!d) return;
  free(d->images);
  free(d->images_f32);
  free(d->labels);
  free(d->tokens);
  memset(d, 0, sizeof *d);
}

uint64_t gs_dataset_host_bytes(const gs_dataset *d) {
  if (d->kind == GS_DATA_TOKENS) return d->tokens ? (d->n * d->seq_len + 1) * sizeof *d->tokens : 0;
  uint64_t px = d->images_f32 ? sizeof(float) : 1;
  return d->n * (gs_dataset_image_bytes(d) * px + sizeof(int32_t));
}

void gs_dataset_gather_tokens(const gs_dataset *d, const uint64_t *idx, uint32_t count,
                              int32_t *inputs, int32_t *targets) {
  const uint64_t t = d->seq_len;
  for (uint32_t i = 0; i < count; i++) {
    const uint16_t *src = d->tokens + idx[i] * t;
    int32_t *in = inputs + (uint64_t)i * t, *tg = targets + (uint64_t)i * t;
    for (uint64_t k = 0; k < t; k++) {
      in[k] = src[k];
      tg[k] = src[k + 1];
    }
  }
}

/* Examples the gather asks memory for ahead of the one it converts. */
#define GATHER_AHEAD 4

/* Built for x86-64-v3 and the baseline and picked at load (an ifunc): the
 * same bits from both, the division 8 pixels at a time where AVX exists.
 * GCC only (clang 14 would leave callers in other files unlinked). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(GS_NO_TARGET_CLONES)
__attribute__((target_clones("arch=x86-64-v3", "default")))
#endif
void gs_dataset_gather_f32(const gs_dataset *d, const uint64_t *idx, uint32_t count,
                           float *images_out, int32_t *labels_out) {
  uint64_t img = gs_dataset_image_bytes(d);
  if (d->images_f32) {
    /* float32 pixels are used as given. */
    for (uint32_t i = 0; i < count; i++) {
      memcpy(images_out + (uint64_t)i * img, d->images_f32 + idx[i] * img, sizeof(float) * img);
      if (labels_out) labels_out[i] = d->labels[idx[i]];
    }
    return;
  }
  for (uint32_t i = 0; i < count; i++) {
    const uint8_t *restrict src = d->images + idx[i] * img;
    float *restrict dst = images_out + (uint64_t)i * img;
    /* Examples come in shuffled order, each from anywhere in the set: ask
     * for the cache lines of the next GATHER_AHEAD while this one converts
     * (fashion-mlp's gather of 128 images waited on memory). */
    for (uint32_t a = i ? i + GATHER_AHEAD : 1; a <= i + GATHER_AHEAD && a < count; a++)
      for (uint64_t off = 0; off < img; off += 64)
        __builtin_prefetch(d->images + idx[a] * img + off);
    /* A vector division is as exact as a scalar one, so this is the table of
     * x / 255 it replaced, bit for bit, at 8 pixels an instruction: the
     * gather of a batch runs on the job's thread while its workers wait.
     * data.c is built with -O3 (runtime/CMakeLists.txt). */
    for (uint64_t k = 0; k < img; k++) dst[k] = (float)src[k] / 255.0f;
    if (labels_out) labels_out[i] = d->labels[idx[i]];
  }
}
