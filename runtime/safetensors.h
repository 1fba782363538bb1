/*
 * safetensors.h: exporting a trained gpushare model so any framework loads it.
 *
 * `gpuctl fetch ID -o model.safetensors` hands a tenant the job's weights in
 * the safetensors format (huggingface/safetensors), which PyTorch, JAX,
 * NumPy and Rust read without running code from the file:
 *
 *   u64 N (little-endian), N bytes of UTF-8 JSON, the tensor bytes.
 *   JSON: {"__metadata__":{"k":"v",...}, "name":{"dtype":"F32",
 *          "shape":[784,256],"data_offsets":[begin,end]}, ...}
 *   offsets are relative to the end of the header, contiguous from 0, in
 *   the order the tensors were given; the header is padded with spaces so
 *   the data starts at a multiple of 8.
 *
 * The writer is atomic like checkpoints (gs_ckpt_atomic). The reader exists
 * for gpushare's own tests and tools: it parses the header JSON strictly
 * (objects, arrays, strings with escapes, unsigned integers) and validates
 * dtypes, shapes, offsets against sizes, coverage of the whole buffer.
 */
#ifndef GS_TRAIN_SAFETENSORS_H
#define GS_TRAIN_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "runtime/ckpt.h"

/* The largest header the reader accepts (the Rust crate's limit). */
#define GS_SAFETENSORS_HEADER_MAX (100u * 1024u * 1024u)

/* Writes tensors (dtypes F32, F16, BF16, I32, I64, U8; names unique, not
 * "__metadata__") to path. metadata_json may be NULL or a JSON object whose
 * values are all strings, e.g. "{\"job\":\"42\",\"format\":\"pt\"}"; it is
 * parsed, checked and re-emitted. e->field: "tensor[i]" or "metadata". */
int gs_safetensors_write(const char *path, const gs_ckpt_tensor *tensors, size_t count,
                         const char *metadata_json, gs_err *e);

/* The same bytes into a malloc'd buffer (free() it). */
int gs_safetensors_encode(const gs_ckpt_tensor *tensors, size_t count,
                          const char *metadata_json, uint8_t **out, size_t *len, gs_err *e);

typedef struct gs_safetensors_kv {
  char *key, *value; /* NUL-terminated, decoded */
} gs_safetensors_kv;

/* A parsed file: tensors (in offset order) point into one owned buffer. */
typedef struct gs_safetensors {
  size_t count;
  gs_ckpt_tensor *tensors;   /* names are NUL-terminated copies */
  size_t meta_count;
  gs_safetensors_kv *meta;   /* __metadata__ entries, in file order */
  uint64_t header_len;       /* N */
  uint8_t *buf__;            /* private */
  size_t len__;
  char *strings__;           /* private */
} gs_safetensors;

/* Returns 0 or a negative value (-EPROTO for a malformed file, -ENOMSG when
 * truncated, -errno for I/O), e->field "safetensors". */
int gs_safetensors_read(const char *path, gs_safetensors **out, gs_err *e);
int gs_safetensors_read_mem(const uint8_t *data, size_t len, gs_safetensors **out, gs_err *e);
const gs_ckpt_tensor *gs_safetensors_find(const gs_safetensors *s, const char *name);
/* The value of __metadata__[key], or NULL. */
const char *gs_safetensors_meta(const gs_safetensors *s, const char *key);
void gs_safetensors_free(gs_safetensors *s);

#endif
