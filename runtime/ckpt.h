/*
 * ckpt.h: gpushare's checkpoint file, what lets a job outlive its daemon.
 *
 * A training job writes one every checkpoint_every_steps into the state
 * directory; a restarted gpushared (or executor) resumes the job from its
 * last one, bit for bit: weights, optimizer state, loss-scaler state, the
 * position in the epoch's data order and the step counters all come back.
 *
 * Layout (all integers little-endian, independent of the host):
 *
 *   "GSCKPT01"                              8 bytes, magic
 *   u32 version (GS_CKPT_VERSION)  u32 tensor count
 *   u64 file bytes (the whole file, CRC included)
 *   metadata: u64 step, u32 epoch, u32 0, u64 data_pos, u64 opt_t,
 *             f32 loss_scale, i32 good_steps, i64 skipped_steps, u64 seed,
 *             u64 horizon (version 2 on; absent in version 1),
 *             u32 spec length (<= GS_CKPT_SPEC_MAX), spec bytes
 *   per tensor: u16 name length (1..255), name, u32 dtype, u32 rank (<= 4),
 *             u64 shape[rank], u64 data bytes, zero padding to a multiple of
 *             64 from the file's start, data
 *   u32 CRC-32 (zlib) of every byte before it
 *
 * The reader checks, in this order and each with its own error: magic,
 * version, the length against the smallest file and the recorded file
 * length against the real one (truncated / trailing bytes), the CRC, then every
 * size it parses against the bytes that remain, so no allocation ever comes
 * from an unchecked number. Writes are atomic (path.tmp, fsync, rename,
 * fsync of the directory): a crash leaves the old checkpoint or the new one,
 * never half of one.
 *
 * Versions: 2 added the horizon. The reader takes version 1 files too and
 * gives them horizon 0 (not recorded); the writer writes version 2.
 */
#ifndef GS_TRAIN_CKPT_H
#define GS_TRAIN_CKPT_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/error.h"

#define GS_CKPT_MAGIC "GSCKPT01"
#define GS_CKPT_VERSION 2u
#define GS_CKPT_SPEC_MAX 4096u /* bytes of the free-form spec string */
#define GS_CKPT_NAME_MAX 255u  /* bytes of a tensor name */
#define GS_CKPT_RANK_MAX 4u

/* Element types. F32/F16/BF16 have the numbers of gs_dtype
 * (kernels/backend.h), so the runtime passes its dtype straight through;
 * the integer types hold optimizer counters or data-order state. */
enum gs_ckpt_dtype {
  GS_CKPT_F32 = 0,
  GS_CKPT_F16 = 1,
  GS_CKPT_BF16 = 2,
  GS_CKPT_I32 = 16,
  GS_CKPT_I64 = 17,
  GS_CKPT_U8 = 18,
};
/* Bytes of one element, 0 for an unknown dtype. */
size_t gs_ckpt_dtype_size(int dtype);
/* "F32", "F16", "BF16", "I32", "I64", "U8" (the safetensors spellings), or
 * "unknown". */
const char *gs_ckpt_dtype_name(int dtype);

/* Return values, negative errno-style, one per failure a caller may want
 * to tell apart (e->code in parentheses). I/O failures return -errno. */
#define GS_CKPT_ENOTCKPT (-EILSEQ) /* magic is not GSCKPT01 (INVALID_ARGUMENT) */
#define GS_CKPT_EVERSION (-ENOTSUP) /* written by a newer gpushare (FAILED_PRECONDITION) */
#define GS_CKPT_ETRUNC (-ENOMSG)   /* shorter than it says (INVALID_ARGUMENT) */
#define GS_CKPT_ETRAIL (-E2BIG)    /* longer than it says (INVALID_ARGUMENT) */
#define GS_CKPT_ECRC (-EBADMSG)    /* checksum mismatch (INVALID_ARGUMENT) */
#define GS_CKPT_EFORMAT (-EPROTO)  /* checksum right but structure wrong, or
                                      bad tensors given to a writer (INVALID_ARGUMENT) */
#define GS_CKPT_EMISSING (-ENOENT) /* gs_ckpt_expect: no such tensor (NOT_FOUND) */
#define GS_CKPT_ESHAPE (-EDOM)     /* gs_ckpt_expect: dtype or shape differs
                                      (FAILED_PRECONDITION) */

/* One named tensor, as given to the writers and as handed back by the
 * readers (where name and data point into the loaded file's buffer). */
typedef struct gs_ckpt_tensor {
  const char *name;   /* 1..GS_CKPT_NAME_MAX bytes, unique, e.g. "dense_1.kernel" */
  int dtype;          /* enum gs_ckpt_dtype */
  uint32_t rank;      /* 0..GS_CKPT_RANK_MAX */
  uint64_t shape[4];  /* shape[0..rank) */
  const void *data;   /* little-endian elements, row-major */
  uint64_t bytes;     /* product(shape) * dtype size, checked */
} gs_ckpt_tensor;

/* Where a job stands, saved beside its tensors. */
typedef struct gs_ckpt_meta {
  uint64_t step;          /* optimizer steps done */
  uint32_t epoch;         /* epoch in progress (0-based) */
  uint64_t data_pos;      /* examples of this epoch's permutation consumed */
  uint64_t opt_t;         /* optimizer's step counter (Adam's t) */
  float loss_scale;       /* fp16 dynamic loss scale, 1 otherwise */
  int32_t good_steps;     /* finite steps since the last scale change */
  int64_t skipped_steps;  /* steps skipped on inf/nan */
  uint64_t seed;          /* the job's seed */
  uint64_t horizon;       /* optimizer steps the learning-rate schedule spans
                             (the run's total steps when written); 0: not
                             recorded (a version 1 file) */
  char spec[GS_CKPT_SPEC_MAX + 1]; /* NUL-terminated free text (job spec digest) */
} gs_ckpt_meta;

/* A loaded checkpoint: one buffer, tensors pointing into it (data 16-byte
 * aligned at least). Read-only; release with gs_ckpt_free. */
typedef struct gs_ckpt {
  gs_ckpt_meta meta;
  size_t count;             /* tensors, in file order */
  gs_ckpt_tensor *tensors;
  uint8_t *buf__;           /* the file's bytes: private */
  size_t len__;
} gs_ckpt;

/* Checks tensors (names, dtypes, ranks, bytes == product(shape) * size,
 * no duplicate names) and meta (spec NUL-terminated within bounds). */
int gs_ckpt_validate(const gs_ckpt_meta *meta, const gs_ckpt_tensor *tensors, size_t count,
                     gs_err *e);

/* Writes path atomically (see the file comment). On failure the old file at
 * path is untouched and path.tmp is removed. */
int gs_ckpt_write(const char *path, const gs_ckpt_meta *meta, const gs_ckpt_tensor *tensors,
                  size_t count, gs_err *e);

/* The same bytes into a malloc'd buffer (*out, *len; free() it): for tests,
 * fuzz seeds and sending a checkpoint over the socket. */
int gs_ckpt_encode(const gs_ckpt_meta *meta, const gs_ckpt_tensor *tensors, size_t count,
                   uint8_t **out, size_t *len, gs_err *e);

/* Reads and validates a checkpoint; *out is NULL on failure. e->field is
 * "checkpoint" (or "checkpoint.tensor[i]" for a malformed tensor record). */
int gs_ckpt_load(const char *path, gs_ckpt **out, gs_err *e);
/* The same from memory (the bytes are copied). */
int gs_ckpt_load_mem(const uint8_t *data, size_t len, gs_ckpt **out, gs_err *e);
void gs_ckpt_free(gs_ckpt *c);

/* The tensor called name, or NULL. */
const gs_ckpt_tensor *gs_ckpt_find(const gs_ckpt *c, const char *name);

/* The runtime's check of a checkpoint against its model: the tensor called
 * name must exist with this dtype and shape. Returns 0 and sets *out (may be
 * NULL), or GS_CKPT_EMISSING ("checkpoint has no tensor dense_1.kernel; the
 * model needs it with shape (784, 256)") or GS_CKPT_ESHAPE ("checkpoint
 * tensor dense_1.kernel has shape (784, 128) but the model needs (784,
 * 256)", and the same for dtype), e->field = "checkpoint.<name>". */
int gs_ckpt_expect(const gs_ckpt *c, const char *name, int dtype, uint32_t rank,
                   const uint64_t *shape, const gs_ckpt_tensor **out, gs_err *e);

/* "(784, 256)" into buf (for messages); returns buf. */
const char *gs_ckpt_shape_str(uint32_t rank, const uint64_t *shape, char *buf, size_t cap);

/* Atomic file replacement, shared with safetensors.c and usable by any
 * writer of the state directory: begin opens path.tmp (O_EXCL is not used:
 * a stale .tmp from a crash is replaced), commit flushes, fsyncs, renames
 * over path and fsyncs the directory; abort closes and unlinks path.tmp.
 * After a failed commit the .tmp is already removed. */
typedef struct gs_ckpt_atomic {
  FILE *f;
  char *path; /* owned copies */
  char *tmp;
} gs_ckpt_atomic;
int gs_ckpt_atomic_begin(gs_ckpt_atomic *a, const char *path, gs_err *e);
int gs_ckpt_atomic_commit(gs_ckpt_atomic *a, gs_err *e);
void gs_ckpt_atomic_abort(gs_ckpt_atomic *a);

#endif
