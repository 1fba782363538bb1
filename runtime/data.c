/*
 * data.c: IDX and synthetic datasets for gpushare's training runtime.
 *
 * IDX (the MNIST family): a 4-byte magic (0, 0, type, number of dims), one
 * big-endian u32 per dimension, then the elements. gpushare reads unsigned
 * bytes only (type 0x08): images with 3 dims (count, rows, columns) or 4
 * (count, rows, columns, channels), labels with 1 (count).
 *
 * A tenant's upload is untrusted, so the header is read and checked BEFORE
 * the body is allocated: the product of the dims must stay under
 * GS_DATASET_MAX_ELEMS (stepwise, so it cannot overflow), and only then is
 * a buffer allocated: for a raw file, of exactly that size once the file's
 * length agrees. A gzip file (1f 8b) is inflated with zlib in three stages
 * over one stream: the 4-byte magic, the dims, then the body into a buffer
 * that grows with what inflates, up to the size the header claims; a probe
 * afterwards tells trailing bytes from a clean end. So a claimed 100 GB
 * dimension costs 16 bytes of inflation, and a claimed 4 GiB what the
 * stream really holds, not a 4 GiB allocation. Every way a file can be
 * wrong has its own return value (data.h) and a sentence naming the file,
 * the value found and what was expected.
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
#include <zlib.h>

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

/* ---- IDX ----------------------------------------------------------------- */

enum { IDX_IMAGES, IDX_LABELS };

/* One IDX input being decoded: raw bytes, or a zlib stream over them. */
typedef struct idx_src {
  const uint8_t *p;   /* input bytes */
  size_t len;         /* input length */
  size_t pos;         /* raw: bytes consumed */
  bool gz;            /* gzip input */
  bool z_init;        /* strm initialised */
  bool z_end;         /* Z_STREAM_END seen */
  z_stream strm;
  const char *field;  /* "images" / "labels" */
  const char *name;   /* for messages */
} idx_src;

static const char *idx_kind(int kind) { return kind == IDX_IMAGES ? "images" : "labels"; }

/* Inflate until `want` bytes land in dst, the stream ends, or it fails.
 * Returns 0 with *got set, or GS_DATASET_EGZIP with e filled. Concatenated
 * gzip members (what `cat a.gz b.gz` makes) are followed, as gzip(1) does. */
static int idx_inflate(idx_src *s, uint8_t *dst, uint64_t want, uint64_t *got, gs_err *e) {
  *got = 0;
  while (*got < want && !s->z_end) {
    uint64_t left = want - *got;
    s->strm.next_out = dst + *got;
    s->strm.avail_out = left > UINT_MAX ? UINT_MAX : (uInt)left;
    uInt before = s->strm.avail_out;
    int rc = inflate(&s->strm, Z_NO_FLUSH);
    *got += before - s->strm.avail_out;
    if (rc == Z_STREAM_END) {
      /* Another member follows? Continue into it, else we are done. */
      if (s->strm.avail_in >= 2 && s->strm.next_in[0] == 0x1f && s->strm.next_in[1] == 0x8b) {
        if (inflateReset(&s->strm) != Z_OK) {
          gs_err_set(e, GS_INTERNAL, s->field, "zlib could not restart on %s", s->name);
          return GS_DATASET_EGZIP;
        }
        continue;
      }
      s->z_end = true;
      break;
    }
    if (rc == Z_BUF_ERROR && s->strm.avail_in == 0) {
      gs_err_set(e, GS_INVALID_ARGUMENT, s->field,
                 "%s is a truncated gzip file: the compressed stream stops after %zu bytes "
                 "without its end marker (an interrupted download or copy?)",
                 s->name, s->len);
      return GS_DATASET_EGZIP;
    }
    if (rc != Z_OK) {
      gs_err_set(e, GS_INVALID_ARGUMENT, s->field,
                 "%s is not a valid gzip file: zlib says \"%s\" at compressed byte %zu", s->name,
                 s->strm.msg ? s->strm.msg : zError(rc), s->len - (size_t)s->strm.avail_in);
      return GS_DATASET_EGZIP;
    }
  }
  return 0;
}

/* Read exactly `want` bytes, or fewer when the input ends (*got says). */
static int idx_read(idx_src *s, uint8_t *dst, uint64_t want, uint64_t *got, gs_err *e) {
  if (s->gz) return idx_inflate(s, dst, want, got, e);
  uint64_t avail = s->len - s->pos;
  *got = want < avail ? want : avail;
  if (*got) memcpy(dst, s->p + s->pos, (size_t)*got);
  s->pos += (size_t)*got;
  return 0;
}

/* Bytes of input left after the body: raw, counted; gzip, probed (any
 * further decompressed output, or non-gzip bytes after the last member). */
static int idx_trailing(idx_src *s, uint64_t *extra, gs_err *e) {
  *extra = 0;
  if (!s->gz) {
    *extra = s->len - s->pos;
    return 0;
  }
  uint8_t probe[256];
  uint64_t got;
  int rc = idx_inflate(s, probe, sizeof probe, &got, e);
  if (rc) return rc;
  *extra = got; /* idx_inflate returned at the stream's end or with output */
  if (*extra == 0 && s->strm.avail_in > 0) *extra = s->strm.avail_in;
  return 0;
}

/* Parse one IDX input. On success *body is a malloc'd copy of the elements
 * and dims/ndims are filled. */
static int idx_parse(idx_src *s, int kind, uint32_t dims[4], uint32_t *ndims, uint8_t **body,
                     uint64_t *body_len, gs_err *e) {
  int rc = 0;
  uint8_t *buf = NULL;
  *body = NULL;
  if (s->len >= 2 && s->p[0] == 0x1f && s->p[1] == 0x8b) {
    s->gz = true;
    memset(&s->strm, 0, sizeof s->strm);
    s->strm.next_in = (Bytef *)(uintptr_t)s->p;
    s->strm.avail_in = s->len > UINT_MAX ? UINT_MAX : (uInt)s->len;
    if (s->len > UINT_MAX) {
      rc = -EFBIG;
      gs_err_set(e, GS_RESOURCE_EXHAUSTED, s->field,
                 "%s is %zu bytes of gzip; gpushare reads at most %u compressed bytes", s->name,
                 s->len, UINT_MAX);
      goto fail;
    }
    if (inflateInit2(&s->strm, 15 + 16) != Z_OK) {
      rc = -ENOMEM;
      gs_err_set(e, GS_RESOURCE_EXHAUSTED, s->field, "zlib could not start inflating %s",
                 s->name);
      goto fail;
    }
    s->z_init = true;
  }

  uint8_t magic[4];
  uint64_t got;
  if ((rc = idx_read(s, magic, 4, &got, e))) goto fail;
  if (got < 4) {
    rc = GS_DATASET_ETRUNC;
    gs_err_set(e, GS_INVALID_ARGUMENT, s->field,
               "%s has %llu bytes%s; an IDX file starts with a 4-byte magic and its dimensions",
               s->name, (unsigned long long)got, s->gz ? " after decompression" : "");
    goto fail;
  }
  uint32_t m = (uint32_t)magic[0] << 24 | (uint32_t)magic[1] << 16 | (uint32_t)magic[2] << 8 |
               magic[3];
  const char *want_magic = kind == IDX_IMAGES ? "0x00000803" : "0x00000801";
  if (magic[0] != 0 || magic[1] != 0) {
    rc = GS_DATASET_EMAGIC;
    gs_err_set(e, GS_INVALID_ARGUMENT, s->field,
               "%s is not an IDX file: its magic number is 0x%08x, expected %s for %s", s->name,
               m, want_magic, idx_kind(kind));
    goto fail;
  }
  if (magic[2] != 0x08) {
    rc = GS_DATASET_ETYPE;
    gs_err_set(e, GS_INVALID_ARGUMENT, s->field,
               "%s has element type 0x%02x (magic 0x%08x); gpushare reads unsigned bytes only "
               "(type 0x08)",
               s->name, magic[2], m);
    goto fail;
  }
  *ndims = magic[3];
  if (kind == IDX_IMAGES && *ndims != 3 && *ndims != 4) {
    rc = GS_DATASET_ERANK;
    gs_err_set(e, GS_INVALID_ARGUMENT, s->field,
               "%s has %u dimensions (magic 0x%08x); an images file needs 3 (count, rows, "
               "columns) or 4 (count, rows, columns, channels)%s",
               s->name, *ndims, m, *ndims == 1 ? ": is it the labels file?" : "");
    goto fail;
  }
  if (kind == IDX_LABELS && *ndims != 1) {
    rc = GS_DATASET_ERANK;
    gs_err_set(e, GS_INVALID_ARGUMENT, s->field,
               "%s has %u dimensions (magic 0x%08x); a labels file needs 1 (count)%s", s->name,
               *ndims, m, *ndims >= 3 ? ": is it the images file?" : "");
    goto fail;
  }

  uint8_t raw_dims[16];
  if ((rc = idx_read(s, raw_dims, 4u * *ndims, &got, e))) goto fail;
  if (got < 4u * *ndims) {
    rc = GS_DATASET_ETRUNC;
    gs_err_set(e, GS_INVALID_ARGUMENT, s->field,
               "%s is truncated inside its header: %u dimensions need %u bytes after the magic, "
               "found %llu",
               s->name, *ndims, 4u * *ndims, (unsigned long long)got);
    goto fail;
  }
  static const char *const axis[2][4] = {{"count", "rows", "columns", "channels"},
                                         {"count", "", "", ""}};
  uint64_t elems = 1;
  for (uint32_t i = 0; i < *ndims; i++) {
    const uint8_t *d = raw_dims + 4 * i;
    dims[i] = (uint32_t)d[0] << 24 | (uint32_t)d[1] << 16 | (uint32_t)d[2] << 8 | d[3];
    if (dims[i] == 0) {
      rc = GS_DATASET_EZERO;
      gs_err_set(e, GS_INVALID_ARGUMENT, s->field,
                 "%s has dimension %u (%s) = 0; every dimension must be at least 1", s->name, i,
                 axis[kind][i]);
      goto fail;
    }
  }
  /* Stepwise product: elems <= 2^32 and dims[i] < 2^32, so no step overflows. */
  for (uint32_t i = 0; i < *ndims; i++) {
    elems *= dims[i];
    if (elems > GS_DATASET_MAX_ELEMS) {
      rc = GS_DATASET_ETOOBIG;
      char shape[96];
      int o = 0;
      for (uint32_t j = 0; j < *ndims; j++)
        o += snprintf(shape + o, sizeof shape - (size_t)o, "%s%u", j ? "x" : "", dims[j]);
      gs_err_set(e, GS_RESOURCE_EXHAUSTED, s->field,
                 "%s claims dimensions %s, more than %llu %s (4 GiB) that gpushare reads from "
                 "one file",
                 s->name, shape, (unsigned long long)GS_DATASET_MAX_ELEMS,
                 kind == IDX_IMAGES ? "pixels" : "labels");
      goto fail;
    }
  }

  /* Raw input: its length is known, so check it before allocating. */
  if (!s->gz && s->len - s->pos != elems) {
    uint64_t have = s->len - s->pos;
    rc = have < elems ? GS_DATASET_ETRUNC : GS_DATASET_ETRAIL;
    if (have < elems)
      gs_err_set(e, GS_INVALID_ARGUMENT, s->field,
                 "%s is truncated: its header promises %llu bytes of %s after the %zu-byte "
                 "header, the file has %llu",
                 s->name, (unsigned long long)elems, idx_kind(kind), s->pos,
                 (unsigned long long)have);
    else
      gs_err_set(e, GS_INVALID_ARGUMENT, s->field,
                 "%s has %llu trailing bytes after the %llu bytes of %s its header promises",
                 s->name, (unsigned long long)(have - elems), (unsigned long long)elems,
                 idx_kind(kind));
    goto fail;
  }

  /* Raw: elems is the input's own length. Gzip: the header's claim is not
   * yet backed by anything, so the buffer grows with what really inflates
   * (from 1 MiB, doubling, up to elems), and a few bytes claiming 4 GiB
   * cost what they inflate to, not a 4 GiB allocation. */
  uint64_t cap = s->gz && elems > (UINT64_C(1) << 20) ? UINT64_C(1) << 20 : elems;
  got = 0;
  for (;;) {
    uint8_t *nb = realloc(buf, cap);
    if (!nb) {
      rc = -ENOMEM;
      gs_err_set(e, GS_RESOURCE_EXHAUSTED, s->field, "no memory for the %llu bytes of %s",
                 (unsigned long long)elems, s->name);
      goto fail;
    }
    buf = nb;
    uint64_t more;
    if ((rc = idx_read(s, buf + got, cap - got, &more, e))) goto fail;
    got += more;
    if (got < cap || cap == elems) break; /* the input ended, or all is here */
    cap = cap > elems / 2 ? elems : cap * 2;
  }
  if (got < elems) {
    rc = GS_DATASET_ETRUNC;
    gs_err_set(e, GS_INVALID_ARGUMENT, s->field,
               "%s is truncated: its header promises %llu bytes of %s, the decompressed file "
               "has %llu",
               s->name, (unsigned long long)elems, idx_kind(kind), (unsigned long long)got);
    goto fail;
  }
  uint64_t extra;
  if ((rc = idx_trailing(s, &extra, e))) goto fail;
  if (extra) {
    rc = GS_DATASET_ETRAIL;
    gs_err_set(e, GS_INVALID_ARGUMENT, s->field,
               "%s has trailing bytes after the %llu bytes of %s its header promises%s", s->name,
               (unsigned long long)elems, idx_kind(kind),
               s->gz && s->z_end ? " (after the gzip stream)" : "");
    goto fail;
  }
  if (s->gz && !s->z_end) {
    rc = GS_DATASET_EGZIP;
    gs_err_set(e, GS_INVALID_ARGUMENT, s->field,
               "%s is a truncated gzip file: the data stops before the stream's end marker",
               s->name);
    goto fail;
  }
  *body = buf;
  *body_len = elems;
  buf = NULL;
fail:
  free(buf);
  if (s->z_init) inflateEnd(&s->strm);
  s->z_init = false;
  return rc;
}

/* Images of a big set on 2 MiB pages. A batch gathers examples from
 * anywhere in the set, each a TLB miss on 4 KiB pages (fashion-mlp's gather
 * of a batch: 26 us of a 0.9 ms step on 4 KiB pages, 19 us on 2 MiB ones,
 * `gpushare-run --threads 2`). Linux backs a 2 MiB-aligned range advised
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

int gs_dataset_load_idx_mem_named(const uint8_t *img, size_t img_len, const char *img_name,
                                  const uint8_t *lab, size_t lab_len, const char *lab_name,
                                  gs_dataset *out, gs_err *e) {
  int rc;
  uint8_t *pix = NULL, *lb = NULL;
  int32_t *labels = NULL;
  uint32_t idims[4] = {0}, ldims[4] = {0}, ind = 0, lnd = 0;
  uint64_t ilen = 0, llen = 0;
  memset(out, 0, sizeof *out);

  idx_src si = {.p = img, .len = img ? img_len : 0, .field = "images",
                .name = img_name ? img_name : "the images data"};
  idx_src sl = {.p = lab, .len = lab ? lab_len : 0, .field = "labels",
                .name = lab_name ? lab_name : "the labels data"};
  if ((rc = idx_parse(&si, IDX_IMAGES, idims, &ind, &pix, &ilen, e))) goto fail;
  if ((rc = idx_parse(&sl, IDX_LABELS, ldims, &lnd, &lb, &llen, e))) goto fail;
  if (ldims[0] != idims[0]) {
    rc = GS_DATASET_ECOUNT;
    gs_err_set(e, GS_INVALID_ARGUMENT, "labels",
               "%s has %u labels but the images file %s has %u images", sl.name, ldims[0],
               si.name, idims[0]);
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
  out->n = idims[0];
  out->h = idims[1];
  out->w = idims[2];
  out->c = ind == 4 ? idims[3] : 1;
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

/* Read a whole file. Its size (from fstat, not from its contents) is capped
 * at what the largest valid IDX file could be, compressed or not. */
static int read_file(const char *path, const char *field, uint8_t **out, size_t *len,
                     gs_err *e) {
  int rc = 0;
  uint8_t *buf = NULL;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    rc = -errno;
    gs_err_set(e, rc == -ENOENT ? GS_NOT_FOUND : GS_INVALID_ARGUMENT, field,
               "cannot open %s: %s", path, strerror(errno));
    return rc;
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    rc = -errno;
    gs_err_set(e, GS_INTERNAL, field, "cannot stat %s: %s", path, strerror(errno));
    goto fail;
  }
  if (!S_ISREG(st.st_mode)) {
    rc = -EINVAL;
    gs_err_set(e, GS_INVALID_ARGUMENT, field, "%s is not a regular file", path);
    goto fail;
  }
  uint64_t cap = GS_DATASET_MAX_ELEMS + 20;
  if ((uint64_t)st.st_size > cap) {
    rc = GS_DATASET_ETOOBIG;
    gs_err_set(e, GS_RESOURCE_EXHAUSTED, field,
               "%s is %lld bytes; gpushare reads IDX files of at most %llu bytes", path,
               (long long)st.st_size, (unsigned long long)cap);
    goto fail;
  }
  size_t n = (size_t)st.st_size;
  buf = malloc(n ? n : 1);
  if (!buf) {
    rc = -ENOMEM;
    gs_err_set(e, GS_RESOURCE_EXHAUSTED, field, "no memory to read the %zu bytes of %s", n,
               path);
    goto fail;
  }
  size_t off = 0;
  while (off < n) {
    ssize_t r = read(fd, buf + off, n - off);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      rc = -errno;
      gs_err_set(e, GS_INTERNAL, field, "cannot read %s: %s", path, strerror(errno));
      goto fail;
    }
    if (r == 0) break; /* shrank while we read: parse what is there */
    off += (size_t)r;
  }
  close(fd);
  *out = buf;
  *len = off;
  return 0;
fail:
  free(buf);
  close(fd);
  return rc;
}

static const char *base_name(const char *path) {
  const char *s = strrchr(path, '/');
  return s ? s + 1 : path;
}

int gs_dataset_load_idx(const char *images_path, const char *labels_path, gs_dataset *out,
                        gs_err *e) {
  uint8_t *img = NULL, *lab = NULL;
  size_t ilen = 0, llen = 0;
  int rc;
  memset(out, 0, sizeof *out);
  if ((rc = read_file(images_path, "images", &img, &ilen, e))) goto fail;
  if ((rc = read_file(labels_path, "labels", &lab, &llen, e))) goto fail;
  rc = gs_dataset_load_idx_mem_named(img, ilen, base_name(images_path), lab, llen,
                                     base_name(labels_path), out, e);
fail:
  free(img);
  free(lab);
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
  uint64_t img = gs_dataset_image_bytes(src);
  uint8_t *pix = images_alloc((size_t)(img * count));
  int32_t *labels = malloc(sizeof *labels * (size_t)count);
  if (!pix || !labels) {
    free(pix);
    free(labels);
    return gs_err_set(e, GS_RESOURCE_EXHAUSTED, "slice", "no memory for a slice of %llu examples",
                      (unsigned long long)count),
           -ENOMEM;
  }
  memcpy(pix, src->images + first * img, (size_t)(img * count));
  memcpy(labels, src->labels + first, sizeof *labels * (size_t)count);
  *out = *src;
  out->n = count;
  out->images = pix;
  out->labels = labels;
  return 0;
}

void gs_dataset_free(gs_dataset *d) {
  if (!d) return;
  free(d->images);
  free(d->labels);
  memset(d, 0, sizeof *d);
}

/* Examples the gather asks memory for ahead of the one it converts. */
#define GATHER_AHEAD 4

/* Built for x86-64-v3 and the baseline and picked at load, as the cpu
 * backend's hot loops are (kernels/cpu/cpu_internal.h, GS_CPU_HOT): the
 * same bits from both, the division 8 pixels at a time where AVX exists.
 * GCC only, as there (clang 14 would leave callers in other files unlinked). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(GS_NO_TARGET_CLONES)
__attribute__((target_clones("arch=x86-64-v3", "default")))
#endif
void gs_dataset_gather_f32(const gs_dataset *d, const uint64_t *idx, uint32_t count,
                           float *images_out, int32_t *labels_out) {
  uint64_t img = gs_dataset_image_bytes(d);
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
     * gather of a batch ran on the job's thread while its workers waited
     * (fashion-mlp: 4% of a step). data.c is built with -O3 (io.cmake). */
    for (uint64_t k = 0; k < img; k++) dst[k] = (float)src[k] / 255.0f;
    if (labels_out) labels_out[i] = d->labels[idx[i]];
  }
}
