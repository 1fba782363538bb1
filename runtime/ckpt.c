/*
 * ckpt.c: writing and reading gpushare checkpoints (layout in ckpt.h).
 *
 * One encoder serves the file writer and the in-memory encoder: it streams
 * the fields through a sink that updates the CRC-32 as it goes, so a
 * checkpoint of a large model is never copied whole before it reaches the
 * disk. The exact size is computed first and recorded in the header, which
 * is what lets the reader tell "truncated" from "corrupted" before it even
 * looks at the checksum.
 *
 * The reader loads the whole file into one buffer (its length comes from
 * fstat, i.e. from the file, never from the file's contents), checks it in
 * the order the header comment gives, then parses with a bounds-checked
 * cursor. Tensors point into that buffer; their data sits at 64-byte file
 * offsets so the runtime can use it as float arrays in place.
 */
#include "runtime/ckpt.h"

#include <fcntl.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "common/file.h"

#define HDR_BYTES 24u       /* magic, version, count, file bytes */
#define META_FIXED 68u      /* metadata before the spec bytes (version 2) */
#define META_FIXED_V1 60u   /* the same in version 1: no horizon */
#define CRC_BYTES 4u
#define MIN_FILE (HDR_BYTES + META_FIXED_V1 + CRC_BYTES) /* of any version */
#define REC_MIN 19u         /* smallest tensor record: 2 + 1 + 4 + 4 + 8 */
#define DATA_ALIGN 64u

size_t gs_ckpt_dtype_size(int dtype) {
  switch (dtype) {
  case GS_CKPT_F32: return 4;
  case GS_CKPT_F16: return 2;
  case GS_CKPT_BF16: return 2;
  case GS_CKPT_I32: return 4;
  case GS_CKPT_I64: return 8;
  case GS_CKPT_U8: return 1;
  default: return 0;
  }
}

const char *gs_ckpt_dtype_name(int dtype) {
  switch (dtype) {
  case GS_CKPT_F32: return "F32";
  case GS_CKPT_F16: return "F16";
  case GS_CKPT_BF16: return "BF16";
  case GS_CKPT_I32: return "I32";
  case GS_CKPT_I64: return "I64";
  case GS_CKPT_U8: return "U8";
  default: return "unknown";
  }
}

const char *gs_ckpt_shape_str(uint32_t rank, const uint64_t *shape, char *buf, size_t cap) {
  size_t o = 0;
  if (cap == 0) return buf;
  buf[0] = '\0';
  o += (size_t)snprintf(buf + o, cap - o, "(");
  for (uint32_t i = 0; i < rank && o < cap; i++)
    o += (size_t)snprintf(buf + o, cap - o, "%s%llu", i ? ", " : "",
                          (unsigned long long)shape[i]);
  if (o < cap) snprintf(buf + o, cap - o, rank == 1 ? ",)" : ")");
  return buf;
}

/* ---- validation ---------------------------------------------------------- */

int gs_ckpt_validate(const gs_ckpt_meta *meta, const gs_ckpt_tensor *tensors, size_t count,
                     gs_err *e) {
  if (!meta) return gs_err_set(e, GS_INVALID_ARGUMENT, "meta", "no metadata given"), -EINVAL;
  if (strnlen(meta->spec, sizeof meta->spec) > GS_CKPT_SPEC_MAX)
    return gs_err_set(e, GS_INVALID_ARGUMENT, "meta.spec",
                      "the spec string is not NUL-terminated within %u bytes", GS_CKPT_SPEC_MAX),
           GS_CKPT_EFORMAT;
  if (count && !tensors)
    return gs_err_set(e, GS_INVALID_ARGUMENT, "tensor", "%zu tensors but no array", count),
           -EINVAL;
  if (count > UINT32_MAX)
    return gs_err_set(e, GS_INVALID_ARGUMENT, "tensor", "%zu tensors; at most %u", count,
                      UINT32_MAX),
           GS_CKPT_EFORMAT;
  for (size_t i = 0; i < count; i++) {
    const gs_ckpt_tensor *t = &tensors[i];
    char field[32];
    snprintf(field, sizeof field, "tensor[%zu]", i);
    size_t nl = t->name ? strnlen(t->name, GS_CKPT_NAME_MAX + 1) : 0;
    if (nl == 0 || nl > GS_CKPT_NAME_MAX)
      return gs_err_set(e, GS_INVALID_ARGUMENT, field,
                        "tensor name is %s; names are 1 to %u bytes",
                        nl ? "too long" : "empty", GS_CKPT_NAME_MAX),
             GS_CKPT_EFORMAT;
    size_t es = gs_ckpt_dtype_size(t->dtype);
    if (!es)
      return gs_err_set(e, GS_INVALID_ARGUMENT, field,
                        "tensor %s has dtype %d; allowed: F32 (0), F16 (1), BF16 (2), I32 (16), "
                        "I64 (17), U8 (18)",
                        t->name, t->dtype),
             GS_CKPT_EFORMAT;
    if (t->rank > GS_CKPT_RANK_MAX)
      return gs_err_set(e, GS_INVALID_ARGUMENT, field, "tensor %s has rank %u; at most %u",
                        t->name, t->rank, GS_CKPT_RANK_MAX),
             GS_CKPT_EFORMAT;
    uint64_t elems = 1;
    bool over = false;
    for (uint32_t k = 0; k < t->rank; k++) over |= __builtin_mul_overflow(elems, t->shape[k], &elems);
    uint64_t want;
    over |= __builtin_mul_overflow(elems, (uint64_t)es, &want);
    char sh[128];
    if (over || want != t->bytes)
      return gs_err_set(e, GS_INVALID_ARGUMENT, field,
                        "tensor %s of shape %s and dtype %s needs %s bytes, %llu given", t->name,
                        gs_ckpt_shape_str(t->rank, t->shape, sh, sizeof sh),
                        gs_ckpt_dtype_name(t->dtype), over ? "more than 2^64" : "other than",
                        (unsigned long long)t->bytes),
             GS_CKPT_EFORMAT;
    if (t->bytes && !t->data)
      return gs_err_set(e, GS_INVALID_ARGUMENT, field, "tensor %s has no data", t->name),
             -EINVAL;
    for (size_t j = 0; j < i; j++)
      if (strcmp(tensors[j].name, t->name) == 0)
        return gs_err_set(e, GS_INVALID_ARGUMENT, field,
                          "tensor name %s appears twice (tensor[%zu] and tensor[%zu])", t->name,
                          j, i),
               GS_CKPT_EFORMAT;
  }
  return 0;
}

/* ---- encoding ------------------------------------------------------------ */

typedef struct sink {
  FILE *f;        /* file sink, or NULL for memory */
  uint8_t *mem;   /* memory sink: exactly `size` bytes */
  uint64_t off;   /* bytes emitted so far */
  uLong crc;      /* CRC-32 of bytes emitted so far */
  bool failed;    /* a write failed */
} sink;

static void put(sink *s, const void *p, uint64_t n) {
  if (!n || s->failed) return;
  s->crc = crc32_z(s->crc, p, (z_size_t)n);
  if (s->f) {
    if (fwrite(p, 1, (size_t)n, s->f) != n) s->failed = true;
  } else {
    memcpy(s->mem + s->off, p, (size_t)n);
  }
  s->off += n;
}

static void put_u16(sink *s, uint16_t v) {
  uint8_t b[2] = {(uint8_t)v, (uint8_t)(v >> 8)};
  put(s, b, 2);
}
static void put_u32(sink *s, uint32_t v) {
  uint8_t b[4];
  for (int i = 0; i < 4; i++) b[i] = (uint8_t)(v >> (8 * i));
  put(s, b, 4);
}
static void put_u64(sink *s, uint64_t v) {
  uint8_t b[8];
  for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
  put(s, b, 8);
}

static uint64_t pad_to(uint64_t off) { return (DATA_ALIGN - off % DATA_ALIGN) % DATA_ALIGN; }

/* Exact encoded size; tensors already validated. */
static uint64_t enc_size(const gs_ckpt_meta *m, const gs_ckpt_tensor *t, size_t count) {
  uint64_t off = HDR_BYTES + META_FIXED + strlen(m->spec);
  for (size_t i = 0; i < count; i++) {
    off += 2 + strlen(t[i].name) + 4 + 4 + 8ull * t[i].rank + 8;
    off += pad_to(off) + t[i].bytes;
  }
  return off + CRC_BYTES;
}

static void encode(sink *s, const gs_ckpt_meta *m, const gs_ckpt_tensor *t, size_t count,
                   uint64_t size) {
  static const uint8_t zeros[DATA_ALIGN];
  put(s, GS_CKPT_MAGIC, 8);
  put_u32(s, GS_CKPT_VERSION);
  put_u32(s, (uint32_t)count);
  put_u64(s, size);
  put_u64(s, m->step);
  put_u32(s, m->epoch);
  put_u32(s, 0);
  put_u64(s, m->data_pos);
  put_u64(s, m->opt_t);
  uint32_t ls;
  memcpy(&ls, &m->loss_scale, 4);
  put_u32(s, ls);
  put_u32(s, (uint32_t)m->good_steps);
  put_u64(s, (uint64_t)m->skipped_steps);
  put_u64(s, m->seed);
  put_u64(s, m->horizon);
  uint32_t sl = (uint32_t)strlen(m->spec);
  put_u32(s, sl);
  put(s, m->spec, sl);
  for (size_t i = 0; i < count; i++) {
    uint16_t nl = (uint16_t)strlen(t[i].name);
    put_u16(s, nl);
    put(s, t[i].name, nl);
    put_u32(s, (uint32_t)t[i].dtype);
    put_u32(s, t[i].rank);
    for (uint32_t k = 0; k < t[i].rank; k++) put_u64(s, t[i].shape[k]);
    put_u64(s, t[i].bytes);
    put(s, zeros, pad_to(s->off));
    put(s, t[i].data, t[i].bytes);
  }
  uint32_t crc = (uint32_t)s->crc;
  put_u32(s, crc);
}

int gs_ckpt_encode(const gs_ckpt_meta *meta, const gs_ckpt_tensor *tensors, size_t count,
                   uint8_t **out, size_t *len, gs_err *e) {
  int rc = gs_ckpt_validate(meta, tensors, count, e);
  if (rc) return rc;
  uint64_t size = enc_size(meta, tensors, count);
  if (size > SIZE_MAX) return gs_err_set(e, GS_RESOURCE_EXHAUSTED, "checkpoint", "checkpoint of %llu bytes does not fit in memory", (unsigned long long)size), -ENOMEM;
  uint8_t *buf = malloc((size_t)size);
  if (!buf)
    return gs_err_set(e, GS_RESOURCE_EXHAUSTED, "checkpoint",
                      "no memory for a checkpoint of %llu bytes", (unsigned long long)size),
           -ENOMEM;
  sink s = {.mem = buf, .crc = crc32(0, NULL, 0)};
  encode(&s, meta, tensors, count, size);
  *out = buf;
  *len = (size_t)size;
  return 0;
}

/* ---- atomic replacement -------------------------------------------------- */

int gs_ckpt_atomic_begin(gs_ckpt_atomic *a, const char *path, gs_err *e) {
  memset(a, 0, sizeof *a);
  size_t n = strlen(path);
  a->path = strdup(path);
  a->tmp = malloc(n + 5);
  if (!a->path || !a->tmp) {
    gs_ckpt_atomic_abort(a);
    return gs_err_set(e, GS_RESOURCE_EXHAUSTED, "path", "no memory"), -ENOMEM;
  }
  memcpy(a->tmp, path, n);
  memcpy(a->tmp + n, ".tmp", 5);
  /* 0600: checkpoints and exports hold a tenant's weights; the daemon hands
   * them out over the socket, never by file permission. */
  int fd = open(a->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    int err = errno;
    gs_err_set(e, err == ENOENT ? GS_NOT_FOUND : GS_FAILED_PRECONDITION, "path",
               "cannot create %s: %s", a->tmp, strerror(err));
    free(a->path);
    free(a->tmp);
    memset(a, 0, sizeof *a);
    return -err;
  }
  a->f = fdopen(fd, "wb");
  if (!a->f) {
    int err = errno;
    close(fd);
    unlink(a->tmp);
    gs_ckpt_atomic_abort(a);
    return gs_err_set(e, GS_INTERNAL, "path", "fdopen: %s", strerror(err)), -err;
  }
  return 0;
}

void gs_ckpt_atomic_abort(gs_ckpt_atomic *a) {
  if (a->f) {
    fclose(a->f);
    a->f = NULL;
    if (a->tmp) unlink(a->tmp);
  }
  free(a->path);
  free(a->tmp);
  a->path = a->tmp = NULL;
}

int gs_ckpt_atomic_commit(gs_ckpt_atomic *a, gs_err *e) {
  int err = 0, dfd = -1;
  const char *what = "writing", *target = a->tmp;
  char *dir = NULL;
  if (fflush(a->f) != 0 || ferror(a->f)) {
    err = errno ? errno : EIO;
    goto fail;
  }
  what = "fsync of";
  if (fsync(fileno(a->f)) != 0) {
    err = errno;
    goto fail;
  }
  what = "closing";
  FILE *f = a->f;
  a->f = NULL;
  if (fclose(f) != 0) {
    err = errno;
    unlink(a->tmp);
    goto fail;
  }
  what = "renaming over";
  target = a->path;
  if (rename(a->tmp, a->path) != 0) {
    err = errno;
    unlink(a->tmp);
    goto fail;
  }
  /* The rename is durable only once the directory entry is on disk. If
   * this last step fails the new file is already in place; the error says
   * only that its durability is in doubt. */
  what = "fsync of the directory of";
  dir = strdup(a->path);
  if (!dir) {
    err = ENOMEM;
    goto fail;
  }
  char *slash = strrchr(dir, '/');
  const char *d = dir;
  if (!slash) d = ".";
  else if (slash == dir) slash[1] = '\0';
  else *slash = '\0';
  dfd = open(d, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0 || fsync(dfd) != 0) {
    err = errno;
    goto fail;
  }
  close(dfd);
  free(dir);
  gs_ckpt_atomic_abort(a);
  return 0;
fail:
  gs_err_set(e, err == ENOSPC ? GS_RESOURCE_EXHAUSTED : GS_INTERNAL, "path", "%s %s failed: %s",
             what, target, strerror(err));
  if (dfd >= 0) close(dfd);
  free(dir);
  gs_ckpt_atomic_abort(a);
  return -err;
}

int gs_ckpt_write(const char *path, const gs_ckpt_meta *meta, const gs_ckpt_tensor *tensors,
                  size_t count, gs_err *e) {
  int rc = gs_ckpt_validate(meta, tensors, count, e);
  if (rc) return rc;
  gs_ckpt_atomic a;
  if ((rc = gs_ckpt_atomic_begin(&a, path, e))) return rc;
  uint64_t size = enc_size(meta, tensors, count);
  sink s = {.f = a.f, .crc = crc32(0, NULL, 0)};
  encode(&s, meta, tensors, count, size);
  if (s.failed) {
    int err = errno ? errno : EIO;
    gs_err_set(e, err == ENOSPC ? GS_RESOURCE_EXHAUSTED : GS_INTERNAL, "path",
               "writing %s failed after %llu of %llu bytes: %s", a.tmp,
               (unsigned long long)s.off, (unsigned long long)size, strerror(err));
    gs_ckpt_atomic_abort(&a);
    return -err;
  }
  return gs_ckpt_atomic_commit(&a, e);
}

/* ---- decoding ------------------------------------------------------------ */

typedef struct cursor {
  const uint8_t *p;
  size_t pos, end; /* end: start of the CRC */
} cursor;

static bool take(cursor *c, size_t n, const uint8_t **out) {
  if (c->end - c->pos < n) return false;
  *out = c->p + c->pos;
  c->pos += n;
  return true;
}
static uint64_t le(const uint8_t *b, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; i--) v = v << 8 | b[i];
  return v;
}
static bool get_u16(cursor *c, uint16_t *v) {
  const uint8_t *b;
  if (!take(c, 2, &b)) return false;
  *v = (uint16_t)le(b, 2);
  return true;
}
static bool get_u32(cursor *c, uint32_t *v) {
  const uint8_t *b;
  if (!take(c, 4, &b)) return false;
  *v = (uint32_t)le(b, 4);
  return true;
}
static bool get_u64(cursor *c, uint64_t *v) {
  const uint8_t *b;
  if (!take(c, 8, &b)) return false;
  *v = le(b, 8);
  return true;
}

/* Parse the tensor records. With names == NULL only count their bytes
 * (*names_len); otherwise fill t[] with names copied into `names`. */
static int parse_tensors(cursor c, uint32_t count, gs_ckpt_tensor *t, char *names,
                         size_t *names_len, gs_err *e) {
  size_t nused = 0;
  for (uint32_t i = 0; i < count; i++) {
    char field[48];
    snprintf(field, sizeof field, "checkpoint.tensor[%u]", i);
    uint16_t nl;
    const uint8_t *name, *data;
    uint32_t dtype, rank;
    uint64_t shape[4] = {0}, bytes;
    if (!get_u16(&c, &nl) || !take(&c, nl, &name) || !get_u32(&c, &dtype) ||
        !get_u32(&c, &rank))
      goto short_record;
    if (nl == 0 || nl > GS_CKPT_NAME_MAX || memchr(name, 0, nl))
      return gs_err_set(e, GS_INVALID_ARGUMENT, field,
                        "tensor record has a name of %u bytes (or with a NUL); names are 1 to %u "
                        "bytes",
                        nl, GS_CKPT_NAME_MAX),
             GS_CKPT_EFORMAT;
    if (rank > GS_CKPT_RANK_MAX)
      return gs_err_set(e, GS_INVALID_ARGUMENT, field, "tensor %.*s has rank %u; at most %u",
                        (int)nl, (const char *)name, rank, GS_CKPT_RANK_MAX),
             GS_CKPT_EFORMAT;
    for (uint32_t k = 0; k < rank; k++)
      if (!get_u64(&c, &shape[k])) goto short_record;
    if (!get_u64(&c, &bytes)) goto short_record;
    size_t es = gs_ckpt_dtype_size((int)dtype);
    uint64_t elems = 1, want = 0;
    bool over = false;
    for (uint32_t k = 0; k < rank; k++) over |= __builtin_mul_overflow(elems, shape[k], &elems);
    over |= __builtin_mul_overflow(elems, (uint64_t)es, &want);
    if (!es || over || want != bytes)
      return gs_err_set(e, GS_INVALID_ARGUMENT, field,
                        "tensor %.*s has dtype %u, %u dims and %llu bytes, which do not agree",
                        (int)nl, (const char *)name, dtype, rank, (unsigned long long)bytes),
             GS_CKPT_EFORMAT;
    size_t pad = (size_t)pad_to(c.pos);
    const uint8_t *skip;
    if (!take(&c, pad, &skip) || bytes > c.end - c.pos || !take(&c, (size_t)bytes, &data))
      goto short_record;
    if (names) {
      memcpy(names + nused, name, nl);
      names[nused + nl] = '\0';
      t[i].name = names + nused;
      t[i].dtype = (int)dtype;
      t[i].rank = rank;
      memcpy(t[i].shape, shape, sizeof shape);
      t[i].data = data;
      t[i].bytes = bytes;
      for (uint32_t j = 0; j < i; j++)
        if (strcmp(t[j].name, t[i].name) == 0)
          return gs_err_set(e, GS_INVALID_ARGUMENT, field, "tensor name %s appears twice",
                            t[i].name),
                 GS_CKPT_EFORMAT;
    }
    nused += (size_t)nl + 1;
    continue;
  short_record:
    return gs_err_set(e, GS_INVALID_ARGUMENT, field,
                      "tensor record %u of %u runs past the end of the checkpoint's data", i,
                      count),
           GS_CKPT_EFORMAT;
  }
  if (c.pos != c.end)
    return gs_err_set(e, GS_INVALID_ARGUMENT, "checkpoint",
                      "%zu unexplained bytes after the last tensor", c.end - c.pos),
           GS_CKPT_EFORMAT;
  *names_len = nused;
  return 0;
}

/* Takes ownership of buf (freed on failure). */
static int load_buf(uint8_t *buf, size_t len, const char *what, gs_ckpt **out, gs_err *e) {
  int rc;
  gs_ckpt *c = NULL;
  *out = NULL;
  static const char magic[8] = GS_CKPT_MAGIC;
  if (len < 8 || memcmp(buf, magic, 8) != 0) {
    if (len < 8 && memcmp(buf, magic, len) == 0) {
      rc = GS_CKPT_ETRUNC;
      gs_err_set(e, GS_INVALID_ARGUMENT, "checkpoint",
                 "%s is truncated: %zu bytes, a checkpoint has at least %u", what, len,
                 MIN_FILE);
    } else {
      rc = GS_CKPT_ENOTCKPT;
      gs_err_set(e, GS_INVALID_ARGUMENT, "checkpoint",
                 "%s is not a gpushare checkpoint: it does not start with \"GSCKPT01\"", what);
    }
    goto fail;
  }
  /* The version first (it needs only 12 bytes): a newer file may be laid
   * out differently after it, so nothing else of it is judged. */
  uint32_t version = len >= 12 ? (uint32_t)le(buf + 8, 4) : 1;
  if (version > GS_CKPT_VERSION) {
    rc = GS_CKPT_EVERSION;
    gs_err_set(e, GS_FAILED_PRECONDITION, "checkpoint",
               "%s has format version %u, newer than the %u this gpushare reads; upgrade "
               "gpushare to resume from it",
               what, version, GS_CKPT_VERSION);
    goto fail;
  }
  if (version == 0) {
    rc = GS_CKPT_EFORMAT;
    gs_err_set(e, GS_INVALID_ARGUMENT, "checkpoint",
               "%s has format version 0, which no gpushare writes", what);
    goto fail;
  }
  if (len < HDR_BYTES) {
    rc = GS_CKPT_ETRUNC;
    gs_err_set(e, GS_INVALID_ARGUMENT, "checkpoint",
               "%s is truncated: %zu bytes, a checkpoint has at least %u", what, len, MIN_FILE);
    goto fail;
  }
  uint32_t count = (uint32_t)le(buf + 12, 4);
  uint64_t fbytes = le(buf + 16, 8);
  if (fbytes > len || len < MIN_FILE) {
    rc = GS_CKPT_ETRUNC;
    gs_err_set(e, GS_INVALID_ARGUMENT, "checkpoint",
               "%s is truncated: it has %zu bytes but its header says %llu (a write that did "
               "not finish?)",
               what, len, (unsigned long long)fbytes);
    goto fail;
  }
  if (fbytes < len) {
    rc = GS_CKPT_ETRAIL;
    gs_err_set(e, GS_INVALID_ARGUMENT, "checkpoint",
               "%s has %llu bytes after the %llu its header says", what,
               (unsigned long long)(len - fbytes), (unsigned long long)fbytes);
    goto fail;
  }
  uint32_t stored = (uint32_t)le(buf + len - CRC_BYTES, 4);
  uint32_t crc = (uint32_t)crc32_z(crc32(0, NULL, 0), buf, len - CRC_BYTES);
  if (crc != stored) {
    rc = GS_CKPT_ECRC;
    gs_err_set(e, GS_INVALID_ARGUMENT, "checkpoint",
               "%s is corrupted: checksum mismatch (CRC-32 of the contents is %08x, the file "
               "records %08x)",
               what, crc, stored);
    goto fail;
  }

  c = calloc(1, sizeof *c);
  if (!c) {
    rc = -ENOMEM;
    gs_err_set(e, GS_RESOURCE_EXHAUSTED, "checkpoint", "no memory");
    goto fail;
  }
  cursor cur = {.p = buf, .pos = HDR_BYTES, .end = len - CRC_BYTES};
  const uint8_t *b;
  uint32_t pad, ls, gs, sl = 0;
  uint64_t sk;
  /* The fixed block of version 1 always fits: len >= MIN_FILE. */
  get_u64(&cur, &c->meta.step);
  get_u32(&cur, &c->meta.epoch);
  get_u32(&cur, &pad);
  get_u64(&cur, &c->meta.data_pos);
  get_u64(&cur, &c->meta.opt_t);
  get_u32(&cur, &ls);
  memcpy(&c->meta.loss_scale, &ls, 4);
  get_u32(&cur, &gs);
  c->meta.good_steps = (int32_t)gs;
  get_u64(&cur, &sk);
  c->meta.skipped_steps = (int64_t)sk;
  get_u64(&cur, &c->meta.seed);
  if (version >= 2 && !get_u64(&cur, &c->meta.horizon)) {
    rc = GS_CKPT_EFORMAT;
    gs_err_set(e, GS_INVALID_ARGUMENT, "checkpoint",
               "%s is too short for the metadata of format version %u", what, version);
    goto fail;
  }
  if (!get_u32(&cur, &sl) || sl > GS_CKPT_SPEC_MAX || !take(&cur, sl, &b) || memchr(b, 0, sl)) {
    rc = GS_CKPT_EFORMAT;
    gs_err_set(e, GS_INVALID_ARGUMENT, "checkpoint.spec",
               "%s records a spec string of %u bytes (at most %u, no NUL, within the file)",
               what, sl, GS_CKPT_SPEC_MAX);
    goto fail;
  }
  memcpy(c->meta.spec, b, sl);
  c->meta.spec[sl] = '\0';
  if ((uint64_t)count * REC_MIN > cur.end - cur.pos) {
    rc = GS_CKPT_EFORMAT;
    gs_err_set(e, GS_INVALID_ARGUMENT, "checkpoint",
               "%s claims %u tensors, more than its %zu remaining bytes can hold", what, count,
               cur.end - cur.pos);
    goto fail;
  }
  size_t names_len = 0;
  if ((rc = parse_tensors(cur, count, NULL, NULL, &names_len, e))) goto fail;
  /* One block: the tensor array, then the names. */
  size_t arr = sizeof(gs_ckpt_tensor) * count;
  uint8_t *block = malloc(arr + names_len + 1);
  if (!block) {
    rc = -ENOMEM;
    gs_err_set(e, GS_RESOURCE_EXHAUSTED, "checkpoint", "no memory for %u tensor records",
               count);
    goto fail;
  }
  c->tensors = (gs_ckpt_tensor *)block;
  if ((rc = parse_tensors(cur, count, c->tensors, (char *)block + arr, &names_len, e)))
    goto fail;
  c->count = count;
  c->buf__ = buf;
  c->len__ = len;
  *out = c;
  return 0;
fail:
  if (c) free(c->tensors);
  free(c);
  free(buf);
  return rc;
}

int gs_ckpt_load_mem(const uint8_t *data, size_t len, gs_ckpt **out, gs_err *e) {
  *out = NULL;
  uint8_t *buf = malloc(len ? len : 1);
  if (!buf)
    return gs_err_set(e, GS_RESOURCE_EXHAUSTED, "checkpoint", "no memory for %zu bytes", len),
           -ENOMEM;
  if (len) memcpy(buf, data, len);
  return load_buf(buf, len, "the checkpoint data", out, e);
}

int gs_ckpt_load(const char *path, gs_ckpt **out, gs_err *e) {
  uint8_t *buf;
  size_t len;
  *out = NULL;
  int rc = gs_file_read(path, SIZE_MAX - 1, "checkpoint", &buf, &len, e);
  if (rc) return rc;
  return load_buf(buf, len, path, out, e);
}

void gs_ckpt_free(gs_ckpt *c) {
  if (!c) return;
  free(c->tensors);
  free(c->buf__);
  free(c);
}

const gs_ckpt_tensor *gs_ckpt_find(const gs_ckpt *c, const char *name) {
  if (!c || !name) return NULL;
  for (size_t i = 0; i < c->count; i++)
    if (strcmp(c->tensors[i].name, name) == 0) return &c->tensors[i];
  return NULL;
}

int gs_ckpt_expect(const gs_ckpt *c, const char *name, int dtype, uint32_t rank,
                   const uint64_t *shape, const gs_ckpt_tensor **out, gs_err *e) {
  char field[GS_CKPT_NAME_MAX + 16], want[128], have[128];
  snprintf(field, sizeof field, "checkpoint.%s", name);
  if (out) *out = NULL;
  gs_ckpt_shape_str(rank, shape, want, sizeof want);
  const gs_ckpt_tensor *t = gs_ckpt_find(c, name);
  if (!t)
    return gs_err_set(e, GS_NOT_FOUND, field,
                      "checkpoint has no tensor %s; the model needs it with shape %s and dtype "
                      "%s",
                      name, want, gs_ckpt_dtype_name(dtype)),
           GS_CKPT_EMISSING;
  gs_ckpt_shape_str(t->rank, t->shape, have, sizeof have);
  bool same = t->rank == rank;
  for (uint32_t k = 0; same && k < rank; k++) same = t->shape[k] == shape[k];
  if (!same)
    return gs_err_set(e, GS_FAILED_PRECONDITION, field,
                      "checkpoint tensor %s has shape %s but the model needs %s", name, have,
                      want),
           GS_CKPT_ESHAPE;
  if (t->dtype != dtype)
    return gs_err_set(e, GS_FAILED_PRECONDITION, field,
                      "checkpoint tensor %s has dtype %s but the model needs %s", name,
                      gs_ckpt_dtype_name(t->dtype), gs_ckpt_dtype_name(dtype)),
           GS_CKPT_ESHAPE;
  if (out) *out = t;
  return 0;
}
