/*
 * runtime/idx.h: the one IDX reader: header, then body, as a stream.
 *
 * IDX (the MNIST family): a 4-byte magic (0, 0, type, number of dims), one
 * big-endian u32 per dimension, then the elements. gpushare reads unsigned
 * bytes only (type 0x08): images with 3 dims (count, rows, columns) or 4
 * (count, rows, columns, channels), labels with 1 (count). A file is raw or
 * gzip (1f 8b; concatenated members are followed, as gzip(1) does).
 *
 * Three places read IDX and all three use this reader, so they accept and
 * refuse the same files with the same words: the dataset loader (the
 * runtime, from memory), the control plane's check of an upload (from the
 * stored file, body discarded) and its probe of a job's datasets at submit
 * (the header, and the labels' largest value).
 *
 * An upload is untrusted, so the header is read and checked BEFORE any body
 * memory: the product of the dims must stay under GS_DATASET_MAX_ELEMS
 * (stepwise, so it cannot overflow). A raw input's length is known and
 * checked against the header first. A gzip input's body buffer grows with
 * what really inflates (from 1 MiB, doubling, up to the header's claim), so
 * a few bytes claiming 4 GiB cost what they inflate to. After the body, a
 * probe tells trailing bytes from a clean end, and a gzip stream must end
 * with its end marker. Every way an input can be wrong has its own return
 * value (GS_DATASET_E* below) and a sentence naming the input,
 * the value found and what was expected.
 */
#ifndef GS_RUNTIME_IDX_H
#define GS_RUNTIME_IDX_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"

/* Most pixels (n*h*w*c) and most labels one IDX file may claim: 4 GiB. A
 * header that claims more is refused before anything is allocated. */
#define GS_DATASET_MAX_ELEMS (UINT64_C(1) << 32)

/* Return values of the loaders (negative, errno-style, one per way an IDX
 * upload can be wrong, so callers and tests can tell them apart; e->code is
 * GS_INVALID_ARGUMENT for all of them, GS_RESOURCE_EXHAUSTED for ETOOBIG).
 * Other failures return -errno (-ENOENT for a missing file, -ENOMEM). */
#define GS_DATASET_EMAGIC (-EILSEQ)    /* first bytes are not an IDX magic */
#define GS_DATASET_ETYPE (-ENOTSUP)    /* element type byte is not 0x08 */
#define GS_DATASET_ERANK (-EDOM)       /* wrong number of dimensions */
#define GS_DATASET_EZERO (-ENODATA)    /* a dimension is 0 */
#define GS_DATASET_ETOOBIG (-EFBIG)    /* dims claim more than the limit */
#define GS_DATASET_ETRUNC (-ENOMSG)    /* fewer bytes than the header says */
#define GS_DATASET_ETRAIL (-E2BIG)     /* bytes after the last item */
#define GS_DATASET_EGZIP (-EBADMSG)    /* gzip stream truncated or corrupt */
#define GS_DATASET_ECOUNT (-ERANGE)    /* images and labels counts differ */

typedef enum gs_idx_kind {
  GS_IDX_ANY = 0, /* either: decided by the number of dims */
  GS_IDX_IMAGES,  /* 3 or 4 dims */
  GS_IDX_LABELS,  /* 1 dim */
} gs_idx_kind;

typedef struct gs_idx_header {
  gs_idx_kind kind; /* IMAGES or LABELS, as read */
  uint32_t ndims;
  uint32_t dims[4]; /* count first; the rest 0 past ndims */
  uint64_t elems;   /* product of dims: the body's bytes */
  bool gzip;
} gs_idx_header;

typedef struct gs_idx gs_idx; /* one IDX input being read */

/* Read from memory (borrowed until gs_idx_close) or from the file at
 * `path`. `name` names the input in messages ("train-images.gz", "the
 * images data"), `field` is the gs_err field of every error. Returns 0 or a
 * negative errno (-ENOENT, -ENOMEM) with e filled. */
int gs_idx_open_mem(const uint8_t *p, size_t len, const char *name, const char *field,
                    gs_idx **out, gs_err *e);
int gs_idx_open_file(const char *path, const char *name, const char *field, gs_idx **out,
                     gs_err *e);
void gs_idx_close(gs_idx *x);

/* Read and check the header (magic, type, rank for `want`, no zero dim,
 * under GS_DATASET_MAX_ELEMS). Returns 0 or a GS_DATASET_E* code. */
int gs_idx_read_header(gs_idx *x, gs_idx_kind want, gs_idx_header *h, gs_err *e);

/* Read the body the header promised, exactly: fewer bytes, trailing bytes
 * or a gzip stream without its end marker are refused. body: receives the
 * malloc'd elements (h->elems bytes), or NULL to read and discard them.
 * max_value (may be NULL): the largest element (labels: classes - 1).
 * Returns 0 or a GS_DATASET_E* code / -ENOMEM. */
int gs_idx_read_body(gs_idx *x, const gs_idx_header *h, uint8_t **body, uint8_t *max_value,
                     gs_err *e);

#endif
