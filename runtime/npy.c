/*
 * runtime/npy.c: the .npy reader (see npy.h for the format and the rules).
 *
 * The header is a small dict literal, parsed by hand with a cursor over
 * its bytes: a key, a colon, a value, a comma, in any order of keys, each
 * key once. Anything else (another key, a structured dtype's list, a
 * shape that is no tuple of integers) is refused with the text found.
 * The body is checked element by element through gs_npy_scan, on the whole
 * array in memory (the loader) or on 64 KiB chunks of a file (the control
 * plane), so both say the same about the same file.
 */
#include "runtime/npy.h"

#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CHUNK ((size_t)64 << 10)

static const char *const dtype_names[] = {"|u1", "|i1", "<u2", "<i2", "<u4",
                                          "<i4", "<u8", "<i8", "<f4"};
static const uint32_t dtype_size[] = {1, 1, 2, 2, 4, 4, 8, 8, 4};

const char *gs_npy_dtype_name(gs_npy_dtype t) {
  return (unsigned)t < sizeof dtype_names / sizeof *dtype_names ? dtype_names[t] : "?";
}

/* ---- the header's dict literal ------------------------------------------ */

typedef struct cursor {
  const char *p, *end;
} cursor;

static void skip_space(cursor *c) {
  while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
    c->p++;
}

static bool take(cursor *c, char ch) {
  skip_space(c);
  if (c->p < c->end && *c->p == ch) {
    c->p++;
    return true;
  }
  return false;
}

/* A quoted string ('...' or "...", no escapes) into out. */
static bool string_lit(cursor *c, char *out, size_t cap) {
  skip_space(c);
  if (c->p >= c->end || (*c->p != '\'' && *c->p != '"')) return false;
  char q = *c->p++;
  size_t n = 0;
  while (c->p < c->end && *c->p != q) {
    if (*c->p == '\\' || n + 1 >= cap) return false;
    out[n++] = *c->p++;
  }
  if (c->p >= c->end) return false;
  c->p++;
  out[n] = '\0';
  return true;
}

static bool word(cursor *c, const char *w) {
  skip_space(c);
  size_t n = strlen(w);
  if ((size_t)(c->end - c->p) < n || memcmp(c->p, w, n) != 0) return false;
  c->p += n;
  return true;
}

/* The text at the cursor, for a message: up to 24 printable characters. */
static const char *near(const cursor *c, char *buf, size_t cap) {
  size_t n = 0;
  for (const char *q = c->p; q < c->end && n + 1 < cap && n < 24; q++)
    buf[n++] = *q >= 0x20 && *q < 0x7f ? *q : '?';
  buf[n] = '\0';
  return n ? buf : "(the end of the header)";
}

static int header_error(const char *name, const char *field, const cursor *c, const char *what,
                        gs_err *e) {
  char nb[32];
  gs_err_set(e, GS_INVALID_ARGUMENT, field,
             "%s has a header gpushare cannot read: %s, found \"%s\"; the header must be a dict "
             "{'descr': ..., 'fortran_order': False, 'shape': (...)} as numpy.save writes it",
             name, what, near(c, nb, sizeof nb));
  return GS_NPY_EHEADER;
}

/* descr's value to a dtype, or the error that says why not. */
static int parse_descr(const char *d, gs_npy_kind want, uint32_t ndims, const char *name,
                       const char *field, gs_npy_dtype *out, gs_err *e) {
  const bool labels = want == GS_NPY_LABELS || (want == GS_NPY_ANY && ndims == 1);
  const char *allowed = labels ? "an integer dtype (|u1 |i1 <u2 <i2 <u4 <i4 <u8 <i8)"
                               : "|u1 (uint8) or <f4 (float32)";
  const char *role = labels ? "labels" : "images";
  if (strchr(d, 'O') && strlen(d) <= 3)
    return gs_err_set(e, GS_INVALID_ARGUMENT, field,
                      "%s is an object array (dtype '%s'); gpushare reads %s of %s, not Python "
                      "objects",
                      name, d, role, allowed),
           GS_NPY_EOBJECT;
  if (strlen(d) == 3 && (d[0] == '<' || d[0] == '>' || d[0] == '|' || d[0] == '=')) {
    for (size_t t = 0; t < sizeof dtype_names / sizeof *dtype_names; t++) {
      if (strcmp(d + 1, dtype_names[t] + 1) != 0) continue;
      /* One-byte types have no byte order; wider ones must be '<'. */
      if (dtype_size[t] > 1 && d[0] != '<')
        return gs_err_set(e, GS_INVALID_ARGUMENT, field,
                          "%s has dtype '%s', %s; gpushare reads little-endian arrays only "
                          "('<%s'): convert with arr.astype('<%s')",
                          name, d, d[0] == '>' ? "big-endian" : "of no stated byte order",
                          d + 1, d + 1),
               GS_NPY_EENDIAN;
      bool is_float = t == GS_NPY_F4;
      if (labels ? is_float : !(t == GS_NPY_U1 || t == GS_NPY_F4)) break;
      *out = (gs_npy_dtype)t;
      return 0;
    }
  }
  return gs_err_set(e, GS_INVALID_ARGUMENT, field, "%s has dtype '%s'; gpushare reads %s of %s",
                    name, d, role, allowed),
         GS_NPY_EDTYPE;
}

int gs_npy_read_header(const uint8_t *p, size_t len, const char *name, const char *field,
                       gs_npy_kind want, gs_npy_header *h, gs_err *e) {
  memset(h, 0, sizeof *h);
  static const uint8_t magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
  if (len < 6 || memcmp(p, magic, 6) != 0) {
    char got[32] = "";
    int o = 0;
    for (size_t i = 0; i < len && i < 6; i++)
      o += snprintf(got + o, sizeof got - (size_t)o, "%s%02x", i ? " " : "", p[i]);
    return gs_err_set(e, GS_INVALID_ARGUMENT, field,
                      "%s is not a .npy file: it starts with %s%s, a .npy file with \\x93NUMPY "
                      "(93 4e 55 4d 50 59)",
                      name, len ? got : "nothing", len && len < 6 ? " and ends" : ""),
           GS_DATASET_EMAGIC;
  }
  if (len < 8)
    return gs_err_set(e, GS_INVALID_ARGUMENT, field,
                      "%s is truncated inside its preamble: %zu bytes, a .npy file has at least "
                      "10 before its header",
                      name, len),
           GS_DATASET_ETRUNC;
  if ((p[6] != 1 && p[6] != 2) || p[7] != 0)
    return gs_err_set(e, GS_INVALID_ARGUMENT, field,
                      "%s is .npy format version %u.%u; gpushare reads versions 1.0 and 2.0 "
                      "(numpy.save writes 1.0)",
                      name, p[6], p[7]),
           GS_NPY_EVERSION;
  h->major = p[6];
  size_t lenbytes = h->major == 1 ? 2 : 4;
  if (len < 8 + lenbytes)
    return gs_err_set(e, GS_INVALID_ARGUMENT, field,
                      "%s is truncated inside its preamble: %zu bytes, version %u.0 has %zu "
                      "before its header",
                      name, len, h->major, 8 + lenbytes),
           GS_DATASET_ETRUNC;
  uint64_t hlen = (uint64_t)p[8] | (uint64_t)p[9] << 8;
  if (lenbytes == 4) hlen |= (uint64_t)p[10] << 16 | (uint64_t)p[11] << 24;
  if (hlen > GS_NPY_MAX_HEADER)
    return gs_err_set(e, GS_INVALID_ARGUMENT, field,
                      "%s declares a header of %" PRIu64 " bytes; gpushare reads headers of at "
                      "most %zu",
                      name, hlen, GS_NPY_MAX_HEADER),
           GS_NPY_EHEADER;
  h->data_offset = 8 + lenbytes + hlen;
  if (len < h->data_offset)
    return gs_err_set(e, GS_INVALID_ARGUMENT, field,
                      "%s is truncated inside its header: the header is %" PRIu64
                      " bytes, the file has %zu after the preamble",
                      name, hlen, len - 8 - lenbytes),
           GS_DATASET_ETRUNC;

  cursor c = {(const char *)p + 8 + lenbytes, (const char *)p + h->data_offset};
  char descr[64] = "";
  bool have[3] = {false, false, false}; /* descr, fortran_order, shape */
  bool fortran = false;
  if (!take(&c, '{')) return header_error(name, field, &c, "no '{'", e);
  while (!take(&c, '}')) {
    char key[32];
    cursor at = c;
    if (!string_lit(&c, key, sizeof key)) return header_error(name, field, &at, "no quoted key", e);
    int k = !strcmp(key, "descr") ? 0 : !strcmp(key, "fortran_order") ? 1 : !strcmp(key, "shape") ? 2 : -1;
    if (k < 0)
      return gs_err_set(e, GS_INVALID_ARGUMENT, field,
                        "%s has the header key '%s'; a .npy header has exactly 'descr', "
                        "'fortran_order' and 'shape'",
                        name, key),
             GS_NPY_EHEADER;
    if (have[k])
      return gs_err_set(e, GS_INVALID_ARGUMENT, field, "%s has the header key '%s' twice", name,
                        key),
             GS_NPY_EHEADER;
    have[k] = true;
    if (!take(&c, ':')) return header_error(name, field, &c, "no ':' after a key", e);
    at = c;
    if (k == 0) {
      skip_space(&c);
      if (c.p < c.end && *c.p == '[')
        return gs_err_set(e, GS_INVALID_ARGUMENT, field,
                          "%s is a structured array (its descr is a list of fields); gpushare "
                          "reads plain arrays of one dtype",
                          name),
               GS_NPY_EDTYPE;
      if (!string_lit(&c, descr, sizeof descr))
        return header_error(name, field, &at, "'descr' is no quoted dtype", e);
    } else if (k == 1) {
      if (word(&c, "False")) fortran = false;
      else if (word(&c, "True")) fortran = true;
      else return header_error(name, field, &at, "'fortran_order' is neither True nor False", e);
    } else {
      if (!take(&c, '(')) return header_error(name, field, &at, "'shape' is no tuple", e);
      for (;;) {
        if (take(&c, ')')) break;
        skip_space(&c);
        if (c.p >= c.end || *c.p < '0' || *c.p > '9')
          return header_error(name, field, &c, "'shape' holds something other than integers", e);
        uint64_t v = 0;
        while (c.p < c.end && *c.p >= '0' && *c.p <= '9') {
          if (v > (UINT64_MAX - 9) / 10)
            return header_error(name, field, &at, "a 'shape' dimension is too large", e);
          v = v * 10 + (uint64_t)(*c.p++ - '0');
        }
        if (h->ndims < 4) h->dims[h->ndims] = v;
        h->ndims++;
        if (take(&c, ',')) continue;
        if (take(&c, ')')) break;
        return header_error(name, field, &c, "'shape' is no tuple of integers", e);
      }
    }
    if (take(&c, ',')) continue;
    if (take(&c, '}')) break;
    return header_error(name, field, &c, "no ',' or '}' after a value", e);
  }
  skip_space(&c);
  if (c.p != c.end) return header_error(name, field, &c, "text after the dict", e);
  for (int k = 0; k < 3; k++)
    if (!have[k])
      return gs_err_set(e, GS_INVALID_ARGUMENT, field,
                        "%s has no '%s' in its header; a .npy header has 'descr', "
                        "'fortran_order' and 'shape'",
                        name, k == 0 ? "descr" : k == 1 ? "fortran_order" : "shape"),
             GS_NPY_EHEADER;

  /* The rank says the role where the caller takes either. */
  uint32_t nd = h->ndims;
  if (want == GS_NPY_IMAGES && nd != 3 && nd != 4)
    return gs_err_set(e, GS_INVALID_ARGUMENT, field,
                      "%s has %u dimensions; an images array needs 3 (N, H, W) or 4 (N, H, W, "
                      "C)%s",
                      name, nd, nd == 1 ? ": is it the labels file?" : ""),
           GS_DATASET_ERANK;
  if (want == GS_NPY_LABELS && nd != 1)
    return gs_err_set(e, GS_INVALID_ARGUMENT, field,
                      "%s has %u dimensions; a labels array needs 1 (N,)%s", name, nd,
                      nd >= 3 ? ": is it the images file?" : ""),
           GS_DATASET_ERANK;
  if (want == GS_NPY_ANY && nd != 1 && nd != 3 && nd != 4)
    return gs_err_set(e, GS_INVALID_ARGUMENT, field,
                      "%s has %u dimensions; gpushare reads labels (1: N) and images (3: N, H, "
                      "W, or 4 with C)",
                      name, nd),
           GS_DATASET_ERANK;
  h->kind = nd == 1 ? GS_NPY_LABELS : GS_NPY_IMAGES;
  int rc = parse_descr(descr, h->kind, nd, name, field, &h->dtype, e);
  if (rc) return rc;
  h->itemsize = dtype_size[h->dtype];
  if (fortran)
    return gs_err_set(e, GS_INVALID_ARGUMENT, field,
                      "%s is in Fortran order (fortran_order True); gpushare reads C-order "
                      "arrays: save np.ascontiguousarray(arr)",
                      name),
           GS_NPY_EORDER;
  static const char *const axis[4] = {"N", "H", "W", "C"};
  uint64_t bytes = h->itemsize;
  for (uint32_t i = 0; i < nd; i++) {
    if (h->dims[i] == 0)
      return gs_err_set(e, GS_INVALID_ARGUMENT, field,
                        "%s has dimension %u (%s) = 0; every dimension must be at least 1", name,
                        i, axis[i]),
             GS_DATASET_EZERO;
    if (h->dims[i] > GS_DATASET_MAX_ELEMS || (bytes *= h->dims[i]) > GS_DATASET_MAX_ELEMS) {
      char shape[128];
      int o = 0;
      for (uint32_t j = 0; j < nd; j++)
        o += snprintf(shape + o, sizeof shape - (size_t)o, "%s%" PRIu64, j ? ", " : "",
                      h->dims[j]);
      return gs_err_set(e, GS_RESOURCE_EXHAUSTED, field,
                        "%s has shape (%s%s) of %s, more than the %" PRIu64
                        " bytes (4 GiB) gpushare reads from one file",
                        name, shape, nd == 1 ? "," : "", dtype_names[h->dtype],
                        (uint64_t)GS_DATASET_MAX_ELEMS),
             GS_DATASET_ETOOBIG;
    }
  }
  h->elems = bytes / h->itemsize;
  return 0;
}

int gs_npy_check_length(const gs_npy_header *h, uint64_t total, const char *name,
                        const char *field, gs_err *e) {
  uint64_t want = h->elems * h->itemsize, have = total - h->data_offset;
  if (have < want)
    return gs_err_set(e, GS_INVALID_ARGUMENT, field,
                      "%s is truncated: its shape and dtype %s promise %" PRIu64
                      " bytes after the %" PRIu64 "-byte header, the file has %" PRIu64,
                      name, dtype_names[h->dtype], want, h->data_offset, have),
           GS_DATASET_ETRUNC;
  if (have > want)
    return gs_err_set(e, GS_INVALID_ARGUMENT, field,
                      "%s has %" PRIu64 " trailing bytes after the %" PRIu64
                      " bytes its shape and dtype %s promise",
                      name, have - want, want, dtype_names[h->dtype]),
           GS_DATASET_ETRAIL;
  return 0;
}

/* ---- the body ------------------------------------------------------------ */

int64_t gs_npy_int(const gs_npy_header *h, const uint8_t *b, uint64_t i) {
  const gs_npy_dtype t = h->dtype;
  const uint8_t *q = b + i * dtype_size[t];
  uint64_t u = 0;
  for (uint32_t k = 0; k < dtype_size[t]; k++) u |= (uint64_t)q[k] << (8 * k);
  switch (t) {
  case GS_NPY_I1: return (int8_t)u;
  case GS_NPY_I2: return (int16_t)u;
  case GS_NPY_I4: return (int32_t)u;
  case GS_NPY_I8: return (int64_t)u;
  case GS_NPY_U8: return u > INT64_MAX ? INT64_MAX : (int64_t)u;
  default: return (int64_t)u;
  }
}

int gs_npy_scan(const gs_npy_header *h, const uint8_t *body, uint64_t first, uint64_t count,
                const char *name, const char *field, uint64_t *max_label, gs_err *e) {
  if (h->kind == GS_NPY_IMAGES) {
    if (h->dtype != GS_NPY_F4) return 0; /* every byte is a pixel */
    for (uint64_t i = 0; i < count; i++) {
      float v;
      memcpy(&v, body + i * 4, 4);
      if (!isfinite(v))
        return gs_err_set(e, GS_INVALID_ARGUMENT, field,
                          "%s has pixel %" PRIu64 " (of example %" PRIu64 ") = %f; float32 "
                          "pixels must be finite numbers",
                          name, first + i, (first + i) / (h->elems / h->dims[0]), (double)v),
               GS_NPY_ENONFINITE;
    }
    return 0;
  }
  uint64_t top = max_label ? *max_label : 0;
  for (uint64_t i = 0; i < count; i++) {
    int64_t v = gs_npy_int(h, body, i);
    if (v < 0)
      return gs_err_set(e, GS_INVALID_ARGUMENT, field,
                        "%s has label %" PRId64 " at index %" PRIu64 "; labels are classes 0 "
                        "and up",
                        name, v, first + i),
             GS_NPY_ENEGATIVE;
    if (v > GS_NPY_MAX_LABEL)
      return gs_err_set(e, GS_INVALID_ARGUMENT, field,
                        "%s has label %" PRId64 " at index %" PRIu64 "; labels are classes 0 "
                        "to %d (a model has at most %d classes)",
                        name, v, first + i, GS_NPY_MAX_LABEL, GS_NPY_MAX_LABEL + 1),
             GS_NPY_ELABEL;
    if ((uint64_t)v > top) top = (uint64_t)v;
  }
  if (max_label) *max_label = top;
  return 0;
}

/* ---- a file, 64 KiB at a time ------------------------------------------- */

/* Up to n bytes from fd (fewer only at its end). */
static ssize_t read_full(int fd, uint8_t *b, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(fd, b + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -1;
    if (r == 0) break;
    got += (size_t)r;
  }
  return (ssize_t)got;
}

/* The file's header and length, and with scan its elements. */
static int check_file(const char *path, const char *name, const char *field, gs_npy_kind want,
                      bool scan, gs_npy_header *h, uint64_t *max_label, gs_err *e) {
  int rc = 0;
  uint8_t *buf = NULL;
  if (max_label) *max_label = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) {
    rc = -errno;
    gs_err_set(e, rc == -ENOENT ? GS_NOT_FOUND : GS_INTERNAL, field, "cannot read %s: %s", name,
               strerror(errno));
    goto fail;
  }
  /* The header (at most GS_NPY_MAX_HEADER after a 12-byte preamble) first. */
  const size_t cap = GS_NPY_MAX_HEADER + 12 > CHUNK ? GS_NPY_MAX_HEADER + 12 : CHUNK;
  buf = malloc(cap);
  if (!buf) {
    rc = -ENOMEM;
    gs_err_set(e, GS_RESOURCE_EXHAUSTED, field, "no memory to read %s", name);
    goto fail;
  }
  ssize_t n = read_full(fd, buf, cap);
  if (n < 0) goto fail_read;
  if ((rc = gs_npy_read_header(buf, (size_t)n, name, field, want, h, e))) goto fail;
  if ((rc = gs_npy_check_length(h, (uint64_t)st.st_size, name, field, e))) goto fail;
  if (!scan) goto out;
  /* The body in whole elements: what is left of the first read, then more. */
  size_t have = (size_t)n - (size_t)h->data_offset;
  memmove(buf, buf + h->data_offset, have);
  uint64_t done = 0;
  for (;;) {
    uint64_t count = have / h->itemsize;
    if (count > h->elems - done) count = h->elems - done;
    if ((rc = gs_npy_scan(h, buf, done, count, name, field, max_label, e))) goto fail;
    done += count;
    size_t used = (size_t)(count * h->itemsize);
    memmove(buf, buf + used, have - used);
    have -= used;
    if (done == h->elems) break;
    n = read_full(fd, buf + have, CHUNK - have);
    if (n < 0) goto fail_read;
    if (n == 0) {
      /* The file shrank under us: its length was checked above. */
      rc = GS_DATASET_ETRUNC;
      gs_err_set(e, GS_INVALID_ARGUMENT, field,
                 "%s is truncated: it ended after %" PRIu64 " of its %" PRIu64 " elements", name,
                 done, h->elems);
      goto fail;
    }
    have += (size_t)n;
  }
  goto out;
fail_read:
  rc = -errno;
  gs_err_set(e, GS_INTERNAL, field, "cannot read %s: %s", name, strerror(errno));
fail:
out:
  free(buf);
  if (fd >= 0) close(fd);
  return rc;
}

int gs_npy_check_file(const char *path, const char *name, const char *field, gs_npy_kind want,
                      gs_npy_header *h, uint64_t *max_label, gs_err *e) {
  return check_file(path, name, field, want, true, h, max_label, e);
}

int gs_npy_probe_file(const char *path, const char *name, const char *field, gs_npy_kind want,
                      gs_npy_header *h, gs_err *e) {
  return check_file(path, name, field, want, false, h, NULL, e);
}
