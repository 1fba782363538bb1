/*
 * data.h: the datasets a gpushare training job reads, in memory.
 *
 * A job names its train and test sets in its JobSpec: IDX files (the MNIST
 * family, gzip or raw) or NumPy .npy pairs that gpuctl uploaded into the
 * daemon's content-addressed store, a seeded synthetic set, or a token
 * stream (raw text, or uint16 token ids) for a language model. The runtime
 * sees one gs_dataset of one of two kinds:
 *  - images: every image as bytes 0..255 in NHWC order (IDX, .npy uint8,
 *    synthetic) or as float32 used as given (.npy float32), and one int32
 *    label per image;
 *  - tokens: a stream of T*n + 1 token ids cut into n examples of
 *    sequence length T: example i's inputs are tokens [i*T, i*T + T), its
 *    targets tokens [i*T + 1, i*T + T + 1), so consecutive examples share
 *    one token and no input; the tail that does not fill an example is
 *    dropped.
 * Either is loaded and validated ONCE, before any memory of the job's vdev
 * is reserved, so a bad upload is refused with a sentence that names the
 * file, the value found and what was expected.
 *
 * Batches are gathered from the host copy by index (gs_dataset_gather_f32,
 * gs_dataset_gather_tokens); the order of an epoch is a Fisher-Yates
 * permutation from a splitmix64 stream seeded by (seed, epoch),
 * integer-only, so a job sees the same order on every machine and after a
 * resume from checkpoint.
 */
#ifndef GS_TRAIN_DATA_H
#define GS_TRAIN_DATA_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "runtime/idx.h" /* GS_DATASET_MAX_ELEMS, the GS_DATASET_E* codes */
#include "runtime/npy.h" /* the GS_NPY_E* codes */
#include "runtime/spec.h"
#include "runtime/tokens.h" /* gs_token_format, the GS_TOKENS_E* codes */

typedef enum gs_dataset_kind {
  GS_DATA_IMAGES = 0, /* images and labels */
  GS_DATA_TOKENS = 1, /* token examples: int32 inputs (T) and targets (T) */
} gs_dataset_kind;

typedef struct gs_dataset {
  gs_dataset_kind kind; /* images (the default: 0) or tokens */
  uint64_t n;           /* number of examples */
  uint32_t h, w, c;     /* image height, width, channels (0 for tokens) */
  uint32_t classes;     /* images: max label + 1, at least 2; tokens: the vocabulary */
  uint8_t *images;      /* n*h*w*c bytes, NHWC, 0..255, or NULL; owned, gs_dataset_free */
  float *images_f32;    /* n*h*w*c floats, NHWC, used as given (.npy float32), or NULL; owned */
  int32_t *labels;      /* n labels in [0, classes); owned (NULL for tokens) */
  uint16_t *tokens;     /* tokens: n*seq_len + 1 ids below classes; owned */
  uint32_t seq_len;     /* tokens: T, the tokens of one example's inputs */
} gs_dataset;

/* Load an IDX pair from files (gzip detected by its 1f 8b magic, else raw).
 * Images: magic 0x00000803 (count, rows, columns; c = 1) or 0x00000804
 * (count, rows, columns, channels); labels: 0x00000801. Validates type byte
 * 0x08, nonzero dims under GS_DATASET_MAX_ELEMS, exact lengths, equal counts.
 * e->field is "images" or "labels"; messages name the file's base name. On
 * failure *out is left zeroed. */
int gs_dataset_load_idx(const char *images_path, const char *labels_path, gs_dataset *out,
                        gs_err *e);

/* The same from bytes in memory (the daemon's dataset store). Messages call
 * the inputs "the images data" / "the labels data". */
int gs_dataset_load_idx_mem(const uint8_t *img, size_t img_len, const uint8_t *lab,
                            size_t lab_len, gs_dataset *out, gs_err *e);

/* As gs_dataset_load_idx_mem, with names for the messages (a dataset's name
 * in the store, or its file name); NULL names fall back to the above. */
int gs_dataset_load_idx_mem_named(const uint8_t *img, size_t img_len, const char *img_name,
                                  const uint8_t *lab, size_t lab_len, const char *lab_name,
                                  gs_dataset *out, gs_err *e);

/* Load a .npy pair from files (npy.h: format 1.0 or 2.0, little-endian, C
 * order; images |u1 or <f4 of shape (N, H, W) or (N, H, W, C), labels of
 * an integer dtype of shape (N,), each 0..GS_NPY_MAX_LABEL). uint8 images
 * are held as bytes (gathered as pixel/255), float32 ones as given.
 * e->field is "images" or "labels"; messages name the file's base name. On
 * failure *out is left zeroed. */
int gs_dataset_load_npy(const char *images_path, const char *labels_path, gs_dataset *out,
                        gs_err *e);

/* The same from bytes in memory, with names for the messages (NULL: "the
 * images data" / "the labels data"). */
int gs_dataset_load_npy_mem_named(const uint8_t *img, size_t img_len, const char *img_name,
                                  const uint8_t *lab, size_t lab_len, const char *lab_name,
                                  gs_dataset *out, gs_err *e);

/* A token stream from bytes in memory (tokens.h: text, a token per byte,
 * vocabulary 256; or little-endian uint16 ids, each < vocab_size, 2..65536),
 * cut into every whole example of seq_len (>= 1) tokens it holds: at least
 * seq_len + 1 tokens. e->field is "sequence_length", "vocab_size" or
 * "data"; messages name the input as `name` (NULL: "the token data"). On
 * failure *out is left zeroed. */
int gs_dataset_load_tokens_mem_named(const uint8_t *p, size_t len, const char *name,
                                     gs_token_format format, uint32_t vocab_size,
                                     uint32_t seq_len, gs_dataset *out, gs_err *e);

/* The same from the file at `path`, named by its base name. */
int gs_dataset_load_tokens(const char *path, gs_token_format format, uint32_t vocab_size,
                           uint32_t seq_len, gs_dataset *out, gs_err *e);

/* A deterministic, learnable set: each class has a fixed random prototype
 * image drawn from `seed`, each example is its class's prototype plus
 * bounded noise, labels are drawn uniformly. Same arguments, same bytes on
 * every machine. n, h, w, c >= 1, 2 <= classes <= 65536,
 * n*h*w*c <= GS_DATASET_MAX_ELEMS; e->field names the offending argument
 * ("examples", "height", "width", "channels", "classes"). The prototypes
 * depend only on (seed, h, w, c, classes), and example i of a larger n is
 * example i of a smaller one: make train and test from ONE call and split
 * it with gs_dataset_slice, or they will share examples. */
int gs_dataset_synthetic(uint64_t n, uint32_t h, uint32_t w, uint32_t c, uint32_t classes,
                         uint64_t seed, gs_dataset *out, gs_err *e);

/* A copy of examples [first, first+count) of src (count >= 1); out->classes
 * is src->classes, so a slice keeps the model's output width. A slice of
 * a token set holds the count*T + 1 tokens its examples read. */
int gs_dataset_slice(const gs_dataset *src, uint64_t first, uint64_t count, gs_dataset *out,
                     gs_err *e);

/* Loads one stored set of a job (`which`: "train" or "test"; an IDX, named,
 * .npy, text or token set) from wherever the caller keeps it: gpushare-run
 * from files beside the job, the executor from the blob paths the control
 * plane gave it. A text or token set is loaded whole (every example the
 * file holds, with d->sequence_length, already checked to be >= 1, and
 * d->vocab_size); gs_dataset_load_job takes its examples from it. It may
 * leave *out empty (n 0) to say it has no such set. Errors name fields
 * under `which` ("train.idx.images"). */
typedef int (*gs_dataset_idx_fn)(const void *user, const char *which, const gs_spec_dataset *d,
                                 gs_dataset *out, gs_err *e);

/* A job's train set and, where the spec has one, its test set (*has_test).
 * A synthetic set takes its image shape from the model's input. Two
 * synthetic sets of one seed and one number of classes are one task: drawn
 * together from one generator, then split, so the test examples are unseen
 * examples of the train set's classes (a different seed is a different
 * task). A text or token set takes the first `examples` examples of its
 * file (0: all); train and test that name one stream (the same source, path,
 * sequence_length and vocab_size) split it the same way: train takes
 * examples [0, train.examples) (which must be set), test the next
 * test.examples (0: the rest). Every other set comes from load_idx. On
 * failure both sets are freed, and errors name "train..." or "test..."
 * fields. */
int gs_dataset_load_job(const gs_job_spec *spec, gs_dataset_idx_fn load_idx, const void *user,
                        gs_dataset *train, gs_dataset *test, bool *has_test, gs_err *e);

/* Frees what a loader allocated and zeroes *d; NULL and zeroed are fine. */
void gs_dataset_free(gs_dataset *d);

/* Bytes of one image: h*w*c. */
static inline uint64_t gs_dataset_image_bytes(const gs_dataset *d) {
  return (uint64_t)d->h * d->w * d->c;
}

/* Batch assembly of an images set: images_out is (count, h, w, c) fp32,
 * pixel/255 in [0,1] for uint8 images, the values as given for float32
 * ones; labels_out (count) may be NULL. Every idx[i] must be < d->n (the
 * runtime's permutation guarantees it). */
void gs_dataset_gather_f32(const gs_dataset *d, const uint64_t *idx, uint32_t count,
                           float *images_out, int32_t *labels_out);

/* Batch assembly of a token set: inputs and targets are (count, T) int32,
 * example idx[i]'s tokens [idx*T, idx*T + T) and one token later. Every
 * idx[i] must be < d->n. */
void gs_dataset_gather_tokens(const gs_dataset *d, const uint64_t *idx, uint32_t count,
                              int32_t *inputs, int32_t *targets);

/* Host bytes the set holds (images, labels, tokens). */
uint64_t gs_dataset_host_bytes(const gs_dataset *d);


/* Fills perm[0..n) with a permutation of 0..n-1: identity, then Fisher-Yates
 * with an unbiased bounded draw from a splitmix64 stream seeded from (seed,
 * epoch). Depends only on its arguments, never on perm's previous content. */
void gs_dataset_shuffle(uint64_t *perm, uint64_t n, uint64_t seed, uint64_t epoch);

/* The PRNG gpushare uses wherever a job must be reproducible (data order,
 * synthetic data, Glorot init): splitmix64. *state is any 64-bit value;
 * each call advances it. */
uint64_t gs_rng_next(uint64_t *state);
/* Uniform float in [0, 1): the top 24 bits of gs_rng_next / 2^24. */
float gs_rng_uniform(uint64_t *state);
/* Uniform integer in [0, bound), bound >= 1, without modulo bias. */
uint64_t gs_rng_below(uint64_t *state, uint64_t bound);
/* A state for stream `stream` of seed `seed` (e.g. one per layer or per
 * epoch): the two are mixed so neighbouring seeds give unrelated streams. */
uint64_t gs_rng_seed(uint64_t seed, uint64_t stream);

#endif
