/*
 * data.h: the datasets a gpushare training job reads, in memory.
 *
 * A job names its train and test sets in its JobSpec: IDX files (the MNIST
 * family, gzip or raw) that gpuctl uploaded into the daemon's
 * content-addressed store, or a seeded synthetic set. Either way the runtime
 * sees one gs_dataset: every image as bytes 0..255 in NHWC order and one
 * int32 label per image, loaded and validated ONCE, before any memory of the
 * job's vdev is reserved, so a bad upload is refused with a sentence that
 * names the file, the value found and what was expected.
 *
 * Batches are gathered from the host copy by index (gs_dataset_gather_f32)
 * into fp32 in [0,1]; the order of an epoch is a Fisher-Yates permutation
 * from a splitmix64 stream seeded by (seed, epoch), integer-only, so a job
 * sees the same order on every machine and after a resume from checkpoint.
 */
#ifndef GS_TRAIN_DATA_H
#define GS_TRAIN_DATA_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "runtime/idx.h" /* GS_DATASET_MAX_ELEMS, the GS_DATASET_E* codes */
#include "runtime/spec.h"

typedef struct gs_dataset {
  uint64_t n;       /* number of examples */
  uint32_t h, w, c; /* image height, width, channels */
  uint32_t classes; /* max label + 1, at least 2 */
  uint8_t *images;  /* n*h*w*c bytes, NHWC, 0..255; owned, gs_dataset_free */
  int32_t *labels;  /* n labels in [0, classes); owned */
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
 * is src->classes, so a slice keeps the model's output width. */
int gs_dataset_slice(const gs_dataset *src, uint64_t first, uint64_t count, gs_dataset *out,
                     gs_err *e);

/* Loads one IDX or named set of a job (`which`: "train" or "test") from
 * wherever the caller keeps it: gpushare-run from files beside the job, the
 * executor from the blob paths the control plane gave it. It may leave
 * *out empty (n 0) to say it has no such set. Errors name fields under
 * `which` ("train.idx.images"). */
typedef int (*gs_dataset_idx_fn)(const void *user, const char *which, const gs_spec_dataset *d,
                                 gs_dataset *out, gs_err *e);

/* A job's train set and, where the spec has one, its test set (*has_test).
 * A synthetic set takes its image shape from the model's input. Two
 * synthetic sets of one seed and one number of classes are one task: drawn
 * together from one generator, then split, so the test examples are unseen
 * examples of the train set's classes (a different seed is a different
 * task). Every other set comes from load_idx. On failure both sets are
 * freed, and errors name "train..." or "test..." fields. */
int gs_dataset_load_job(const gs_job_spec *spec, gs_dataset_idx_fn load_idx, const void *user,
                        gs_dataset *train, gs_dataset *test, bool *has_test, gs_err *e);

/* Frees what a loader allocated and zeroes *d; NULL and zeroed are fine. */
void gs_dataset_free(gs_dataset *d);

/* Bytes of one image: h*w*c. */
static inline uint64_t gs_dataset_image_bytes(const gs_dataset *d) {
  return (uint64_t)d->h * d->w * d->c;
}

/* Batch assembly: images_out is (count, h, w, c) fp32, pixel/255 in [0,1];
 * labels_out (count) may be NULL. Every idx[i] must be < d->n (the runtime's
 * permutation guarantees it). */
void gs_dataset_gather_f32(const gs_dataset *d, const uint64_t *idx, uint32_t count,
                           float *images_out, int32_t *labels_out);

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
