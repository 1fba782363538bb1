/*
 * runtime/npy.h: the one NumPy .npy reader: header, then body.
 *
 * A .npy file (NumPy's format 1.0 or 2.0) is the magic "\x93NUMPY", a
 * major and a minor version byte, the header's length (a little-endian
 * uint16 in 1.0, a uint32 in 2.0), the header, then the array's bytes. The
 * header is a Python dict literal with exactly the keys 'descr' (the dtype,
 * e.g. '<f4'), 'fortran_order' (True or False) and 'shape' (a tuple of
 * integers), padded with spaces and ended with a newline.
 *
 * gpushare reads C-order, little-endian arrays: images of dtype uint8
 * (|u1) or float32 (<f4), shape (N, H, W) or (N, H, W, C); labels of an
 * integer dtype (|u1 |i1 <u2 <i2 <u4 <i4 <u8 <i8), shape (N,), every label
 * from 0 to GS_NPY_MAX_LABEL. The header is parsed strictly (no other key,
 * no key twice, nothing but padding after the dict) and checked before any
 * body memory; the body must be exactly as long as the shape says, float
 * pixels finite, labels in range. The control plane checks an upload with
 * gs_npy_check_file (64 KiB at a time), the loader (runtime/data.c) with
 * gs_npy_read_header and gs_npy_scan on the bytes in memory: both accept
 * and refuse the same files with the same words.
 *
 * Every way a file can be wrong has its own return value (GS_NPY_E* below,
 * and runtime/idx.h's GS_DATASET_E* where the fault is the same as an IDX
 * file's) and a sentence naming the input, the value found and what is
 * allowed.
 */
#ifndef GS_RUNTIME_NPY_H
#define GS_RUNTIME_NPY_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "runtime/idx.h" /* GS_DATASET_E*: magic, rank, zero, too big, truncated, trailing */

#define GS_NPY_EHEADER (-EPROTO)          /* the header is no dict literal gpushare reads */
#define GS_NPY_EVERSION (-EPROTONOSUPPORT) /* format version other than 1.0 or 2.0 */
#define GS_NPY_EDTYPE GS_DATASET_ETYPE     /* a dtype the array's role does not take */
#define GS_NPY_EOBJECT (-EBADR)           /* an object array ('|O') */
#define GS_NPY_EENDIAN (-EBADE)           /* a big-endian (or native '=') dtype */
#define GS_NPY_EORDER (-EMEDIUMTYPE)      /* fortran_order True */
#define GS_NPY_ENEGATIVE (-EBADRQC)       /* a negative label */
#define GS_NPY_ELABEL (-EBADSLT)          /* a label above GS_NPY_MAX_LABEL */
#define GS_NPY_ENONFINITE (-EBADFD)       /* a NaN or infinite float pixel */

/* The largest label: a model has at most 65536 classes. */
#define GS_NPY_MAX_LABEL 65535
/* The longest header gpushare reads (NumPy itself writes under 100 bytes). */
#define GS_NPY_MAX_HEADER ((size_t)64 << 10)

typedef enum gs_npy_dtype {
  GS_NPY_U1 = 0,
  GS_NPY_I1,
  GS_NPY_U2,
  GS_NPY_I2,
  GS_NPY_U4,
  GS_NPY_I4,
  GS_NPY_U8,
  GS_NPY_I8,
  GS_NPY_F4,
} gs_npy_dtype;

typedef enum gs_npy_kind {
  GS_NPY_ANY = 0, /* either: decided by the rank */
  GS_NPY_IMAGES,  /* rank 3 or 4, |u1 or <f4 */
  GS_NPY_LABELS,  /* rank 1, an integer dtype */
} gs_npy_kind;

typedef struct gs_npy_header {
  gs_npy_kind kind;      /* IMAGES or LABELS, as read */
  uint8_t major;         /* format version: 1 or 2 */
  gs_npy_dtype dtype;
  uint32_t itemsize;     /* bytes per element */
  uint32_t ndims;
  uint64_t dims[4];      /* count first; 0 past ndims */
  uint64_t elems;        /* product of dims */
  uint64_t data_offset;  /* bytes before the array's data */
} gs_npy_header;

/* Parse and check the header at the start of p[0..len) (len may run past
 * it). `name` names the input in messages ("train-images.npy"), `field` is
 * the gs_err field of every error. Returns 0 or a GS_NPY_E* /
 * GS_DATASET_E* code with e filled. */
int gs_npy_read_header(const uint8_t *p, size_t len, const char *name, const char *field,
                       gs_npy_kind want, gs_npy_header *h, gs_err *e);

/* Check elements [first, first + count) of the array, whose bytes are at
 * body: float pixels finite, labels from 0 to GS_NPY_MAX_LABEL. *max_label
 * (labels; may be NULL) is raised to the largest label seen. Returns 0 or
 * GS_NPY_ENONFINITE / GS_NPY_ENEGATIVE / GS_NPY_ELABEL naming the element. */
int gs_npy_scan(const gs_npy_header *h, const uint8_t *body, uint64_t first, uint64_t count,
                const char *name, const char *field, uint64_t *max_label, gs_err *e);

/* The length check of a whole input of `total` bytes against its header:
 * GS_DATASET_ETRUNC or GS_DATASET_ETRAIL with e filled, or 0. */
int gs_npy_check_length(const gs_npy_header *h, uint64_t total, const char *name,
                        const char *field, gs_err *e);

/* The whole file at `path`, header, length and every element, 64 KiB at a
 * time (the control plane's check of an upload and its probe at submit).
 * *max_label (may be NULL): the largest label of a labels file. Returns 0,
 * a code above, or -ENOENT / -errno with e filled. */
int gs_npy_check_file(const char *path, const char *name, const char *field, gs_npy_kind want,
                      gs_npy_header *h, uint64_t *max_label, gs_err *e);
/* The header and the length only (an upload already checked the elements). */
int gs_npy_probe_file(const char *path, const char *name, const char *field, gs_npy_kind want,
                      gs_npy_header *h, gs_err *e);

/* Element i of an integer array whose bytes are at body, sign-extended
 * (a uint64 above INT64_MAX reads as INT64_MAX). */
int64_t gs_npy_int(const gs_npy_header *h, const uint8_t *body, uint64_t i);

/* "|u1", "<f4", ...: the dtype as NumPy writes it. */
const char *gs_npy_dtype_name(gs_npy_dtype t);

#endif
