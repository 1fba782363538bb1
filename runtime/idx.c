/*
 * runtime/idx.c: the IDX reader (see idx.h for the format and the rules).
 *
 * One input is a sequence of chunks: a memory input hands out slices of
 * its buffer (at most 1 GiB each, so zlib's 32-bit counters never
 * overflow), a file input reads 64 KiB at a time into the reader's own
 * buffer. Raw bytes are copied out of the chunks; gzip bytes go through one
 * z_stream fed from them. So the check of a 4 GiB upload holds 64 KiB of
 * it at a time, and the loader decodes straight from the job file's bytes.
 */
#include "runtime/idx.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>


#define CHUNK_FILE ((size_t)64 << 10)
#define CHUNK_MEM ((size_t)1 << 30)

struct gs_idx {
  const uint8_t *mem;    /* memory input (NULL: a file) */
  size_t mem_len, mem_off; /* its length; bytes handed out as chunks */
  int fd;                /* file input, or -1 */
  uint64_t total;        /* the input's length (st_size for a file) */
  uint64_t delivered;    /* input bytes handed out as chunks so far */
  const uint8_t *in;     /* the current chunk */
  size_t in_len, in_pos; /* its length; raw: bytes of it consumed */
  bool eof;              /* no chunk left */
  bool gz, z_init, z_end; /* gzip input; stream set up; its last member ended */
  z_stream strm;
  uint64_t header_bytes; /* raw: bytes of header consumed (for messages) */
  gs_idx_kind kind;      /* as read, for messages */
  char name[256];        /* the input in messages */
  char field[64];        /* gs_err field of every error */
  uint8_t buf[];         /* file input: CHUNK_FILE bytes */
};

static const char *kind_name(gs_idx_kind k) { return k == GS_IDX_LABELS ? "labels" : "images"; }

static gs_idx *reader_new(size_t extra, const char *name, const char *field) {
  gs_idx *x = calloc(1, sizeof *x + extra);
  if (!x) return NULL;
  x->fd = -1;
  snprintf(x->name, sizeof x->name, "%s", name ? name : "the data");
  snprintf(x->field, sizeof x->field, "%s", field ? field : "");
  return x;
}

int gs_idx_open_mem(const uint8_t *p, size_t len, const char *name, const char *field,
                    gs_idx **out, gs_err *e) {
  *out = NULL;
  gs_idx *x = reader_new(0, name, field);
  if (!x) return gs_err_set(e, GS_RESOURCE_EXHAUSTED, field, "no memory to read %s", name);
  x->mem = p ? p : (const uint8_t *)"";
  x->mem_len = p ? len : 0;
  x->total = x->mem_len;
  *out = x;
  return 0;
}

int gs_idx_open_file(const char *path, const char *name, const char *field, gs_idx **out,
                     gs_err *e) {
  *out = NULL;
  gs_idx *x = reader_new(CHUNK_FILE, name, field);
  if (!x) return gs_err_set(e, GS_RESOURCE_EXHAUSTED, field, "no memory to read %s", name);
  int rc = 0;
  x->fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (x->fd < 0 || fstat(x->fd, &st) != 0) {
    rc = -errno;
    gs_err_set(e, rc == -ENOENT ? GS_NOT_FOUND : GS_INTERNAL, field, "cannot read %s: %s", name,
               strerror(errno));
    gs_idx_close(x);
    return rc;
  }
  x->total = (uint64_t)st.st_size;
  *out = x;
  return 0;
}

void gs_idx_close(gs_idx *x) {
  if (!x) return;
  if (x->z_init) inflateEnd(&x->strm);
  if (x->fd >= 0) close(x->fd);
  free(x);
}

/* The next chunk of input into x->in (in_len 0 and eof at the end). */
static int next_chunk(gs_idx *x, gs_err *e) {
  x->in_pos = 0;
  x->in_len = 0;
  if (x->mem) {
    size_t left = x->mem_len - x->mem_off;
    x->in = x->mem + x->mem_off;
    x->in_len = left < CHUNK_MEM ? left : CHUNK_MEM;
    x->mem_off += x->in_len;
  } else {
    ssize_t n;
    do n = read(x->fd, x->buf, CHUNK_FILE);
    while (n < 0 && errno == EINTR);
    if (n < 0) return gs_err_set(e, GS_INTERNAL, x->field, "cannot read %s: %s", x->name,
                                 strerror(errno));
    x->in = x->buf;
    x->in_len = (size_t)n;
  }
  x->delivered += x->in_len;
  if (x->in_len == 0) x->eof = true;
  if (x->gz) {
    x->strm.next_in = (Bytef *)(uintptr_t)x->in;
    x->strm.avail_in = (uInt)x->in_len;
  }
  return 0;
}

/* Inflate until `want` bytes land in dst, the stream ends, or it fails.
 * Returns 0 with *got set, or GS_DATASET_EGZIP with e filled. */
static int inflate_some(gs_idx *x, uint8_t *dst, uint64_t want, uint64_t *got, gs_err *e) {
  *got = 0;
  while (*got < want && !x->z_end) {
    if (x->strm.avail_in == 0 && !x->eof && next_chunk(x, e) < 0) return GS_DATASET_EGZIP;
    uint64_t left = want - *got;
    x->strm.next_out = dst + *got;
    x->strm.avail_out = left > UINT_MAX ? UINT_MAX : (uInt)left;
    uInt before = x->strm.avail_out;
    int rc = inflate(&x->strm, Z_NO_FLUSH);
    *got += before - x->strm.avail_out;
    if (rc == Z_STREAM_END) {
      /* Another member follows? Continue into it, else we are done. */
      if (x->strm.avail_in == 0 && !x->eof && next_chunk(x, e) < 0) return GS_DATASET_EGZIP;
      if (x->strm.avail_in >= 2 && x->strm.next_in[0] == 0x1f && x->strm.next_in[1] == 0x8b) {
        if (inflateReset(&x->strm) != Z_OK) {
          gs_err_set(e, GS_INTERNAL, x->field, "zlib could not restart on %s", x->name);
          return GS_DATASET_EGZIP;
        }
        continue;
      }
      x->z_end = true;
      break;
    }
    if (rc == Z_BUF_ERROR && x->strm.avail_in == 0) {
      if (!x->eof) continue; /* wants the next chunk */
      gs_err_set(e, GS_INVALID_ARGUMENT, x->field,
                 "%s is a truncated gzip file: the compressed stream stops after %llu bytes "
                 "without its end marker (an interrupted download or copy?)",
                 x->name, (unsigned long long)x->total);
      return GS_DATASET_EGZIP;
    }
    if (rc != Z_OK) {
      gs_err_set(e, GS_INVALID_ARGUMENT, x->field,
                 "%s is not a valid gzip file: zlib says \"%s\" at compressed byte %llu", x->name,
                 x->strm.msg ? x->strm.msg : zError(rc),
                 (unsigned long long)(x->delivered - x->strm.avail_in));
      return GS_DATASET_EGZIP;
    }
  }
  return 0;
}

/* Up to `want` bytes; fewer only when the input ends (*got says). */
static int read_some(gs_idx *x, uint8_t *dst, uint64_t want, uint64_t *got, gs_err *e) {
  if (x->gz) return inflate_some(x, dst, want, got, e);
  *got = 0;
  while (*got < want) {
    if (x->in_pos == x->in_len) {
      if (x->eof) break;
      int rc = next_chunk(x, e);
      if (rc) return rc;
      continue;
    }
    size_t avail = x->in_len - x->in_pos;
    size_t k = want - *got < avail ? (size_t)(want - *got) : avail;
    memcpy(dst + *got, x->in + x->in_pos, k);
    x->in_pos += k;
    *got += k;
  }
  return 0;
}

/* Bytes of input left after the body: raw, counted; gzip, probed (any
 * further decompressed output, or non-gzip bytes after the last member). */
static int trailing(gs_idx *x, uint64_t consumed, uint64_t *extra, gs_err *e) {
  *extra = 0;
  if (!x->gz) {
    *extra = x->total > consumed ? x->total - consumed : 0;
    return 0;
  }
  uint8_t probe[256];
  uint64_t got;
  int rc = inflate_some(x, probe, sizeof probe, &got, e);
  if (rc) return rc;
  *extra = got;
  if (*extra == 0 && x->strm.avail_in == 0 && !x->eof && (rc = next_chunk(x, e))) return rc;
  if (*extra == 0 && x->strm.avail_in > 0) *extra = x->strm.avail_in;
  return 0;
}

int gs_idx_read_header(gs_idx *x, gs_idx_kind want, gs_idx_header *h, gs_err *e) {
  memset(h, 0, sizeof *h);
  int rc = next_chunk(x, e);
  if (rc) return rc;
  if (x->in_len >= 2 && x->in[0] == 0x1f && x->in[1] == 0x8b) {
    x->gz = true;
    x->strm.next_in = (Bytef *)(uintptr_t)x->in;
    x->strm.avail_in = (uInt)x->in_len;
    if (inflateInit2(&x->strm, 15 + 16) != Z_OK)
      return gs_err_set(e, GS_RESOURCE_EXHAUSTED, x->field, "zlib could not start inflating %s",
                        x->name),
             -ENOMEM;
    x->z_init = true;
  }
  h->gzip = x->gz;
  const char *unz = x->gz ? " after decompression" : "";

  uint8_t magic[4];
  uint64_t got;
  if ((rc = read_some(x, magic, 4, &got, e))) return rc;
  if (got < 4)
    return gs_err_set(e, GS_INVALID_ARGUMENT, x->field,
                      "%s has %llu bytes%s; an IDX file starts with a 4-byte magic and its "
                      "dimensions",
                      x->name, (unsigned long long)got, unz),
           GS_DATASET_ETRUNC;
  uint32_t m = (uint32_t)magic[0] << 24 | (uint32_t)magic[1] << 16 | (uint32_t)magic[2] << 8 |
               magic[3];
  const char *want_magic = want == GS_IDX_IMAGES   ? "0x00000803 for images"
                           : want == GS_IDX_LABELS ? "0x00000801 for labels"
                                                   : "0x00000801 (labels), 0x00000803 or "
                                                     "0x00000804 (images)";
  if (magic[0] != 0 || magic[1] != 0)
    return gs_err_set(e, GS_INVALID_ARGUMENT, x->field,
                      "%s is not an IDX file: its magic number is 0x%08x, expected %s",
                      x->name, m, want_magic),
           GS_DATASET_EMAGIC;
  if (magic[2] != 0x08)
    return gs_err_set(e, GS_INVALID_ARGUMENT, x->field,
                      "%s has element type 0x%02x (magic 0x%08x); gpushare reads unsigned bytes "
                      "only (type 0x08)",
                      x->name, magic[2], m),
           GS_DATASET_ETYPE;
  uint32_t nd = magic[3];
  if (want == GS_IDX_IMAGES && nd != 3 && nd != 4)
    return gs_err_set(e, GS_INVALID_ARGUMENT, x->field,
                      "%s has %u dimensions (magic 0x%08x); an images file needs 3 (count, "
                      "rows, columns) or 4 (count, rows, columns, channels)%s",
                      x->name, nd, m, nd == 1 ? ": is it the labels file?" : ""),
           GS_DATASET_ERANK;
  if (want == GS_IDX_LABELS && nd != 1)
    return gs_err_set(e, GS_INVALID_ARGUMENT, x->field,
                      "%s has %u dimensions (magic 0x%08x); a labels file needs 1 (count)%s",
                      x->name, nd, m, nd >= 3 ? ": is it the images file?" : ""),
           GS_DATASET_ERANK;
  if (want == GS_IDX_ANY && nd != 1 && nd != 3 && nd != 4)
    return gs_err_set(e, GS_INVALID_ARGUMENT, x->field,
                      "%s has %u dimensions (magic 0x%08x); gpushare reads labels (1: count) "
                      "and images (3: count, rows, columns, or 4 with channels)",
                      x->name, nd, m),
           GS_DATASET_ERANK;
  x->kind = h->kind = nd == 1 ? GS_IDX_LABELS : GS_IDX_IMAGES;
  h->ndims = nd;

  uint8_t raw_dims[16];
  if ((rc = read_some(x, raw_dims, 4u * nd, &got, e))) return rc;
  if (got < 4u * nd)
    return gs_err_set(e, GS_INVALID_ARGUMENT, x->field,
                      "%s is truncated inside its header: %u dimensions need %u bytes after the "
                      "magic, found %llu",
                      x->name, nd, 4u * nd, (unsigned long long)got),
           GS_DATASET_ETRUNC;
  static const char *const axis[2][4] = {{"count", "rows", "columns", "channels"},
                                         {"count", "", "", ""}};
  const int ax = h->kind == GS_IDX_LABELS;
  for (uint32_t i = 0; i < nd; i++) {
    const uint8_t *d = raw_dims + 4 * i;
    h->dims[i] = (uint32_t)d[0] << 24 | (uint32_t)d[1] << 16 | (uint32_t)d[2] << 8 | d[3];
    if (h->dims[i] == 0)
      return gs_err_set(e, GS_INVALID_ARGUMENT, x->field,
                        "%s has dimension %u (%s) = 0; every dimension must be at least 1",
                        x->name, i, axis[ax][i]),
             GS_DATASET_EZERO;
  }
  /* Stepwise product: elems <= 2^32 and dims[i] < 2^32, so no step overflows. */
  uint64_t elems = 1;
  for (uint32_t i = 0; i < nd; i++) {
    elems *= h->dims[i];
    if (elems > GS_DATASET_MAX_ELEMS) {
      char shape[96];
      int o = 0;
      for (uint32_t j = 0; j < nd; j++)
        o += snprintf(shape + o, sizeof shape - (size_t)o, "%s%u", j ? "x" : "", h->dims[j]);
      return gs_err_set(e, GS_RESOURCE_EXHAUSTED, x->field,
                        "%s claims dimensions %s, more than %llu %s (4 GiB) that gpushare reads "
                        "from one file",
                        x->name, shape, (unsigned long long)GS_DATASET_MAX_ELEMS,
                        h->kind == GS_IDX_IMAGES ? "pixels" : "labels"),
             GS_DATASET_ETOOBIG;
    }
  }
  h->elems = elems;
  x->header_bytes = 4 + 4u * nd;
  return 0;
}

int gs_idx_read_body(gs_idx *x, const gs_idx_header *h, uint8_t **body, uint8_t *max_value,
                     gs_err *e) {
  int rc = 0;
  uint8_t *buf = NULL;
  const uint64_t elems = h->elems;
  const char *what = kind_name(h->kind);
  if (body) *body = NULL;
  uint8_t maxv = 0;

  /* Raw input: its length is known, so check it before allocating. */
  if (!x->gz && x->total - x->header_bytes != elems) {
    uint64_t have = x->total - x->header_bytes;
    if (have < elems)
      return gs_err_set(e, GS_INVALID_ARGUMENT, x->field,
                        "%s is truncated: its header promises %llu bytes of %s after the "
                        "%llu-byte header, the file has %llu",
                        x->name, (unsigned long long)elems, what,
                        (unsigned long long)x->header_bytes, (unsigned long long)have),
             GS_DATASET_ETRUNC;
    return gs_err_set(e, GS_INVALID_ARGUMENT, x->field,
                      "%s has %llu trailing bytes after the %llu bytes of %s its header promises",
                      x->name, (unsigned long long)(have - elems), (unsigned long long)elems,
                      what),
           GS_DATASET_ETRAIL;
  }

  uint64_t got = 0, more;
  if (body) {
    /* Raw: elems is the input's own length. Gzip: the header's claim is not
     * yet backed by anything, so the buffer grows with what really inflates
     * (from 1 MiB, doubling, up to elems). */
    uint64_t cap = x->gz && elems > (UINT64_C(1) << 20) ? UINT64_C(1) << 20 : elems;
    for (;;) {
      uint8_t *nb = realloc(buf, cap);
      if (!nb) {
        rc = -ENOMEM;
        gs_err_set(e, GS_RESOURCE_EXHAUSTED, x->field, "no memory for the %llu bytes of %s",
                   (unsigned long long)elems, x->name);
        goto fail;
      }
      buf = nb;
      if ((rc = read_some(x, buf + got, cap - got, &more, e))) goto fail;
      got += more;
      if (got < cap || cap == elems) break; /* the input ended, or all is here */
      cap = cap > elems / 2 ? elems : cap * 2;
    }
    for (uint64_t i = 0; max_value && i < got; i++)
      if (buf[i] > maxv) maxv = buf[i];
  } else {
    /* Discarded: 64 KiB at a time through one scratch buffer. */
    buf = malloc(CHUNK_FILE);
    if (!buf) {
      rc = -ENOMEM;
      gs_err_set(e, GS_RESOURCE_EXHAUSTED, x->field, "no memory to read %s", x->name);
      goto fail;
    }
    do {
      uint64_t want = elems - got < CHUNK_FILE ? elems - got : CHUNK_FILE;
      if ((rc = read_some(x, buf, want, &more, e))) goto fail;
      for (uint64_t i = 0; max_value && i < more; i++)
        if (buf[i] > maxv) maxv = buf[i];
      got += more;
    } while (more > 0 && got < elems);
  }
  if (got < elems) {
    rc = GS_DATASET_ETRUNC;
    gs_err_set(e, GS_INVALID_ARGUMENT, x->field,
               "%s is truncated: its header promises %llu bytes of %s, the decompressed file "
               "has %llu",
               x->name, (unsigned long long)elems, what, (unsigned long long)got);
    goto fail;
  }
  uint64_t extra;
  if ((rc = trailing(x, x->header_bytes + got, &extra, e))) goto fail;
  if (extra) {
    rc = GS_DATASET_ETRAIL;
    gs_err_set(e, GS_INVALID_ARGUMENT, x->field,
               "%s has trailing bytes after the %llu bytes of %s its header promises%s", x->name,
               (unsigned long long)elems, what, x->gz && x->z_end ? " (after the gzip stream)" : "");
    goto fail;
  }
  if (x->gz && !x->z_end) {
    rc = GS_DATASET_EGZIP;
    gs_err_set(e, GS_INVALID_ARGUMENT, x->field,
               "%s is a truncated gzip file: the data stops before the stream's end marker",
               x->name);
    goto fail;
  }
  if (max_value) *max_value = maxv;
  if (body) {
    *body = buf;
    buf = NULL;
  }
fail:
  free(buf);
  return rc;
}
