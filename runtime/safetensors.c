/*
 * safetensors.c: gpushare's safetensors writer and its strict reader.
 *
 * The writer builds the JSON header in memory (it is small: one entry per
 * tensor), pads it with spaces to a multiple of 8 so every tensor's data
 * starts 8-aligned in the file, then streams the header and each tensor's
 * bytes through gs_ckpt_atomic, so an export that fails leaves no partial
 * file where a tenant expects a model. Names and metadata are escaped as
 * JSON strings; caller metadata is parsed with the same parser the reader
 * uses, so only an object of string values gets through, and it is
 * re-emitted rather than pasted.
 *
 * The reader is a small recursive-descent JSON parser for exactly the shape
 * safetensors uses (an object of objects; strings, arrays of unsigned
 * integers), with UTF-8 checked and \u escapes decoded. It validates what
 * the Rust crate validates: header length within the file, known dtypes,
 * offsets matching shape * dtype size, tensors contiguous from offset 0 and
 * covering the data exactly.
 */
#include "runtime/safetensors.h"

#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/file.h"

#define ST_EFORMAT (-EPROTO)
#define ST_ETRUNC (-ENOMSG)

/* ---- small growable string ----------------------------------------------- */

typedef struct sbuf {
  char *p;
  size_t len, cap;
  bool oom;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
  if (b->oom) return;
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n + 1) cap *= 2;
    char *np = realloc(b->p, cap);
    if (!np) {
      b->oom = true;
      return;
    }
    b->p = np;
    b->cap = cap;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = '\0';
}
static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }
static void sb_u64(sbuf *b, uint64_t v) {
  char t[24];
  int n = snprintf(t, sizeof t, "%llu", (unsigned long long)v);
  sb_put(b, t, (size_t)n);
}
/* A JSON string literal; s is valid UTF-8 (checked by the callers). */
static void sb_json(sbuf *b, const char *s) {
  sb_put(b, "\"", 1);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\') {
      char t[2] = {'\\', (char)*p};
      sb_put(b, t, 2);
    } else if (*p < 0x20) {
      char t[8];
      snprintf(t, sizeof t, "\\u%04x", *p);
      sb_put(b, t, 6);
    } else {
      sb_put(b, (const char *)p, 1);
    }
  }
  sb_put(b, "\"", 1);
}

static bool utf8_valid(const unsigned char *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    unsigned char c = s[i];
    size_t k;
    uint32_t cp;
    if (c < 0x80) {
      i++;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      k = 1;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      k = 2;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      k = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (n - i <= k) return false;
    for (size_t j = 1; j <= k; j++) {
      if ((s[i + j] & 0xC0) != 0x80) return false;
      cp = cp << 6 | (s[i + j] & 0x3F);
    }
    static const uint32_t min[4] = {0, 0x80, 0x800, 0x10000};
    if (cp < min[k] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += k + 1;
  }
  return true;
}

/* ---- JSON parsing ------------------------------------------------------- */

typedef struct jp {
  const char *p;
  size_t pos, len;
  char *arena;      /* decoded strings, NUL-terminated */
  size_t arena_pos; /* never exceeds the raw bytes consumed */
  gs_err *e;
  const char *field;
} jp;

static int jfail(jp *j, const char *what) {
  gs_err_set(j->e, GS_INVALID_ARGUMENT, j->field, "header JSON is malformed at byte %zu: %s",
             j->pos, what);
  return ST_EFORMAT;
}

static void jws(jp *j) {
  while (j->pos < j->len && (j->p[j->pos] == ' ' || j->p[j->pos] == '\t' ||
                             j->p[j->pos] == '\n' || j->p[j->pos] == '\r'))
    j->pos++;
}

static bool jeat(jp *j, char c) {
  jws(j);
  if (j->pos < j->len && j->p[j->pos] == c) {
    j->pos++;
    return true;
  }
  return false;
}

static int hex4(const char *s, uint32_t *v) {
  *v = 0;
  for (int i = 0; i < 4; i++) {
    char c = s[i];
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
          : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (d < 0) return -1;
    *v = *v << 4 | (uint32_t)d;
  }
  return 0;
}

/* A string: *out points into the arena. */
static int jstring(jp *j, char **out) {
  jws(j);
  if (j->pos >= j->len || j->p[j->pos] != '"') return jfail(j, "expected a string");
  j->pos++;
  char *dst = j->arena + j->arena_pos, *start = dst;
  size_t raw_start = j->pos;
  for (;;) {
    if (j->pos >= j->len) return jfail(j, "unterminated string");
    unsigned char c = (unsigned char)j->p[j->pos];
    if (c == '"') {
      j->pos++;
      break;
    }
    if (c < 0x20) return jfail(j, "control character inside a string");
    if (c != '\\') {
      *dst++ = (char)c;
      j->pos++;
      continue;
    }
    if (j->pos + 1 >= j->len) return jfail(j, "unterminated escape");
    char x = j->p[j->pos + 1];
    j->pos += 2;
    const char *simple = strchr("\"\\/bfnrt", x);
    if (x && simple) {
      static const char map[] = "\"\\/\b\f\n\r\t";
      *dst++ = map[simple - "\"\\/bfnrt"];
      continue;
    }
    if (x != 'u') return jfail(j, "unknown escape");
    uint32_t cp, lo;
    if (j->len - j->pos < 4 || hex4(j->p + j->pos, &cp)) return jfail(j, "bad \\u escape");
    j->pos += 4;
    if (cp >= 0xD800 && cp <= 0xDBFF) {
      if (j->len - j->pos < 6 || j->p[j->pos] != '\\' || j->p[j->pos + 1] != 'u' ||
          hex4(j->p + j->pos + 2, &lo) || lo < 0xDC00 || lo > 0xDFFF)
        return jfail(j, "unpaired surrogate in \\u escape");
      j->pos += 6;
      cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
    } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
      return jfail(j, "unpaired surrogate in \\u escape");
    }
    if (cp == 0) return jfail(j, "\\u0000 inside a string");
    if (cp < 0x80) {
      *dst++ = (char)cp;
    } else if (cp < 0x800) {
      *dst++ = (char)(0xC0 | cp >> 6);
      *dst++ = (char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      *dst++ = (char)(0xE0 | cp >> 12);
      *dst++ = (char)(0x80 | (cp >> 6 & 0x3F));
      *dst++ = (char)(0x80 | (cp & 0x3F));
    } else {
      *dst++ = (char)(0xF0 | cp >> 18);
      *dst++ = (char)(0x80 | (cp >> 12 & 0x3F));
      *dst++ = (char)(0x80 | (cp >> 6 & 0x3F));
      *dst++ = (char)(0x80 | (cp & 0x3F));
    }
  }
  (void)raw_start;
  *dst++ = '\0';
  if (!utf8_valid((const unsigned char *)start, (size_t)(dst - start - 1)))
    return jfail(j, "string is not valid UTF-8");
  j->arena_pos += (size_t)(dst - start);
  *out = start;
  return 0;
}

static int juint(jp *j, uint64_t *v) {
  jws(j);
  size_t s = j->pos;
  *v = 0;
  while (j->pos < j->len && j->p[j->pos] >= '0' && j->p[j->pos] <= '9') {
    if (__builtin_mul_overflow(*v, 10, v) ||
        __builtin_add_overflow(*v, (uint64_t)(j->p[j->pos] - '0'), v))
      return jfail(j, "integer larger than 2^64 - 1");
    j->pos++;
  }
  if (j->pos == s) return jfail(j, "expected an unsigned integer");
  if (j->pos - s > 1 && j->p[s] == '0') return jfail(j, "integer with a leading zero");
  if (j->pos < j->len && (j->p[j->pos] == '.' || j->p[j->pos] == 'e' || j->p[j->pos] == 'E'))
    return jfail(j, "expected an integer, found a fraction or exponent");
  return 0;
}

/* [u64, ...] with at most max entries. */
static int juint_array(jp *j, uint64_t *v, uint32_t max, uint32_t *n, const char *what) {
  *n = 0;
  if (!jeat(j, '[')) return jfail(j, "expected '['");
  if (jeat(j, ']')) return 0;
  for (;;) {
    uint64_t x;
    int rc = juint(j, &x);
    if (rc) return rc;
    if (*n >= max) {
      gs_err_set(j->e, GS_INVALID_ARGUMENT, j->field, "%s has more than %u entries", what, max);
      return ST_EFORMAT;
    }
    v[(*n)++] = x;
    if (jeat(j, ']')) return 0;
    if (!jeat(j, ',')) return jfail(j, "expected ',' or ']' in an array");
  }
}

/* {"k":"v",...} into kvs (grown with realloc). */
static int jstring_object(jp *j, gs_safetensors_kv **kvs, size_t *n) {
  size_t cap = 0;
  *kvs = NULL;
  *n = 0;
  if (!jeat(j, '{')) return jfail(j, "__metadata__ must be an object");
  if (jeat(j, '}')) return 0;
  for (;;) {
    char *k, *v;
    int rc = jstring(j, &k);
    if (rc) return rc;
    if (!jeat(j, ':')) return jfail(j, "expected ':'");
    jws(j);
    if (j->pos >= j->len || j->p[j->pos] != '"') {
      gs_err_set(j->e, GS_INVALID_ARGUMENT, j->field,
                 "__metadata__ value of \"%s\" is not a string; safetensors metadata maps "
                 "strings to strings",
                 k);
      return ST_EFORMAT;
    }
    if ((rc = jstring(j, &v))) return rc;
    for (size_t i = 0; i < *n; i++)
      if (strcmp((*kvs)[i].key, k) == 0) {
        gs_err_set(j->e, GS_INVALID_ARGUMENT, j->field, "__metadata__ key \"%s\" appears twice",
                   k);
        return ST_EFORMAT;
      }
    if (*n == cap) {
      cap = cap ? 2 * cap : 8;
      gs_safetensors_kv *nk = realloc(*kvs, cap * sizeof *nk);
      if (!nk) return gs_err_set(j->e, GS_RESOURCE_EXHAUSTED, j->field, "no memory"), -ENOMEM;
      *kvs = nk;
    }
    (*kvs)[*n].key = k;
    (*kvs)[*n].value = v;
    (*n)++;
    if (jeat(j, '}')) return 0;
    if (!jeat(j, ',')) return jfail(j, "expected ',' or '}' in __metadata__");
  }
}

static int dtype_from_name(const char *s) {
  static const int all[] = {GS_CKPT_F32, GS_CKPT_F16, GS_CKPT_BF16,
                            GS_CKPT_I32, GS_CKPT_I64, GS_CKPT_U8};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    if (strcmp(s, gs_ckpt_dtype_name(all[i])) == 0) return all[i];
  return -1;
}

/* ---- writing ------------------------------------------------------------- */

/* The padded header; *out malloc'd, *hlen its length (a multiple of 8). */
static int build_header(const gs_ckpt_tensor *t, size_t count, const char *metadata_json,
                        char **out, size_t *hlen, gs_err *e) {
  int rc = 0;
  sbuf b = {0};
  gs_safetensors_kv *kvs = NULL;
  char *arena = NULL;
  size_t nkv = 0;
  if (count && !t) {
    rc = (gs_err_set(e, GS_INVALID_ARGUMENT, "tensor", "%zu tensors but no array", count), -EINVAL);
    goto fail;
  }
  for (size_t i = 0; i < count; i++) {
    char field[32];
    snprintf(field, sizeof field, "tensor[%zu]", i);
    if (!t[i].name || !*t[i].name) {
      rc = (gs_err_set(e, GS_INVALID_ARGUMENT, field, "tensor has no name"), ST_EFORMAT);
      goto fail;
    }
    if (strcmp(t[i].name, "__metadata__") == 0 ||
        !utf8_valid((const unsigned char *)t[i].name, strlen(t[i].name))) {
      rc = (gs_err_set(e, GS_INVALID_ARGUMENT, field,
                      "tensor name is \"__metadata__\" (reserved) or not valid UTF-8"), ST_EFORMAT);
      goto fail;
    }
    size_t es = gs_ckpt_dtype_size(t[i].dtype);
    if (!es) {
      rc = (gs_err_set(e, GS_INVALID_ARGUMENT, field,
                      "tensor %s has dtype %d; safetensors export takes F32, F16, BF16, I32, "
                      "I64, U8",
                      t[i].name, t[i].dtype), ST_EFORMAT);
      goto fail;
    }
    if (t[i].rank > GS_CKPT_RANK_MAX) {
      rc = (gs_err_set(e, GS_INVALID_ARGUMENT, field, "tensor %s has rank %u; at most %u",
                      t[i].name, t[i].rank, GS_CKPT_RANK_MAX), ST_EFORMAT);
      goto fail;
    }
    uint64_t elems = 1, want;
    bool over = false;
    for (uint32_t k = 0; k < t[i].rank; k++)
      over |= __builtin_mul_overflow(elems, t[i].shape[k], &elems);
    over |= __builtin_mul_overflow(elems, (uint64_t)es, &want);
    if (over || want != t[i].bytes || (t[i].bytes && !t[i].data)) {
      char sh[128];
      rc = (gs_err_set(e, GS_INVALID_ARGUMENT, field,
                      "tensor %s of shape %s and dtype %s needs %llu bytes, %llu given%s",
                      t[i].name, gs_ckpt_shape_str(t[i].rank, t[i].shape, sh, sizeof sh),
                      gs_ckpt_dtype_name(t[i].dtype), (unsigned long long)want,
                      (unsigned long long)t[i].bytes, t[i].data ? "" : " (no data)"), ST_EFORMAT);
      goto fail;
    }
    for (size_t k = 0; k < i; k++)
      if (strcmp(t[k].name, t[i].name) == 0) {
        rc = (gs_err_set(e, GS_INVALID_ARGUMENT, field, "tensor name %s appears twice",
                        t[i].name), ST_EFORMAT);
        goto fail;
      }
  }
  if (metadata_json) {
    size_t ml = strlen(metadata_json);
    arena = malloc(ml + 1);
    if (!arena) {
      rc = (gs_err_set(e, GS_RESOURCE_EXHAUSTED, "metadata", "no memory"), -ENOMEM);
      goto fail;
    }
    jp j = {.p = metadata_json, .len = ml, .arena = arena, .e = e, .field = "metadata"};
    if ((rc = jstring_object(&j, &kvs, &nkv))) goto fail;
    jws(&j);
    if (j.pos != j.len) {
      rc = jfail(&j, "bytes after the metadata object");
      goto fail;
    }
  }

  sb_str(&b, "{");
  bool first = true;
  if (nkv) {
    sb_str(&b, "\"__metadata__\":{");
    for (size_t i = 0; i < nkv; i++) {
      if (i) sb_str(&b, ",");
      sb_json(&b, kvs[i].key);
      sb_str(&b, ":");
      sb_json(&b, kvs[i].value);
    }
    sb_str(&b, "}");
    first = false;
  }
  uint64_t off = 0;
  for (size_t i = 0; i < count; i++) {
    if (!first) sb_str(&b, ",");
    first = false;
    sb_json(&b, t[i].name);
    sb_str(&b, ":{\"dtype\":\"");
    sb_str(&b, gs_ckpt_dtype_name(t[i].dtype));
    sb_str(&b, "\",\"shape\":[");
    for (uint32_t k = 0; k < t[i].rank; k++) {
      if (k) sb_str(&b, ",");
      sb_u64(&b, t[i].shape[k]);
    }
    sb_str(&b, "],\"data_offsets\":[");
    sb_u64(&b, off);
    sb_str(&b, ",");
    off += t[i].bytes;
    sb_u64(&b, off);
    sb_str(&b, "]}");
  }
  sb_str(&b, "}");
  while (!b.oom && b.len % 8) sb_str(&b, " ");
  if (b.oom) {
    rc = (gs_err_set(e, GS_RESOURCE_EXHAUSTED, "tensor", "no memory for the header"), -ENOMEM);
    goto fail;
  }
  if (b.len > GS_SAFETENSORS_HEADER_MAX) {
    rc = (gs_err_set(e, GS_INVALID_ARGUMENT, "tensor",
                    "header of %zu bytes exceeds the %u that safetensors readers accept", b.len,
                    GS_SAFETENSORS_HEADER_MAX), ST_EFORMAT);
    goto fail;
  }
  *out = b.p;
  *hlen = b.len;
  b.p = NULL;
fail:
  free(b.p);
  free(kvs);
  free(arena);
  return rc;
}

static void le64(uint8_t *b, uint64_t v) {
  for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
}

int gs_safetensors_encode(const gs_ckpt_tensor *tensors, size_t count, const char *metadata_json,
                          uint8_t **out, size_t *len, gs_err *e) {
  char *hdr;
  size_t hl;
  int rc = build_header(tensors, count, metadata_json, &hdr, &hl, e);
  if (rc) return rc;
  uint64_t total = 8 + hl;
  for (size_t i = 0; i < count; i++) total += tensors[i].bytes;
  uint8_t *buf = total <= SIZE_MAX ? malloc((size_t)total) : NULL;
  if (!buf) {
    free(hdr);
    return gs_err_set(e, GS_RESOURCE_EXHAUSTED, "tensor", "no memory for %llu bytes",
                      (unsigned long long)total),
           -ENOMEM;
  }
  le64(buf, hl);
  memcpy(buf + 8, hdr, hl);
  size_t o = 8 + hl;
  for (size_t i = 0; i < count; i++) {
    if (tensors[i].bytes) memcpy(buf + o, tensors[i].data, (size_t)tensors[i].bytes);
    o += (size_t)tensors[i].bytes;
  }
  free(hdr);
  *out = buf;
  *len = (size_t)total;
  return 0;
}

int gs_safetensors_write(const char *path, const gs_ckpt_tensor *tensors, size_t count,
                         const char *metadata_json, gs_err *e) {
  char *hdr;
  size_t hl;
  int rc = build_header(tensors, count, metadata_json, &hdr, &hl, e);
  if (rc) return rc;
  gs_ckpt_atomic a;
  if ((rc = gs_ckpt_atomic_begin(&a, path, e))) {
    free(hdr);
    return rc;
  }
  uint8_t n[8];
  le64(n, hl);
  bool ok = fwrite(n, 1, 8, a.f) == 8 && fwrite(hdr, 1, hl, a.f) == hl;
  for (size_t i = 0; ok && i < count; i++)
    ok = !tensors[i].bytes ||
         fwrite(tensors[i].data, 1, (size_t)tensors[i].bytes, a.f) == tensors[i].bytes;
  free(hdr);
  if (!ok) {
    int err = errno ? errno : EIO;
    gs_err_set(e, err == ENOSPC ? GS_RESOURCE_EXHAUSTED : GS_INTERNAL, "path",
               "writing %s failed: %s", a.tmp, strerror(err));
    gs_ckpt_atomic_abort(&a);
    return -err;
  }
  return gs_ckpt_atomic_commit(&a, e);
}

/* ---- reading ------------------------------------------------------------- */

static int cmp_offset(const void *a, const void *b) {
  const gs_ckpt_tensor *x = a, *y = b;
  /* data still holds the begin offset here (see parse_header) */
  uintptr_t u = (uintptr_t)x->data, v = (uintptr_t)y->data;
  return u < v ? -1 : u > v;
}

/* Takes ownership of buf. */
static int read_buf(uint8_t *buf, size_t len, gs_safetensors **out, gs_err *e) {
  int rc = 0;
  gs_safetensors *s = calloc(1, sizeof *s);
  uint64_t *ends = NULL;
  size_t cap = 0;
  *out = NULL;
  if (!s) {
    free(buf);
    return gs_err_set(e, GS_RESOURCE_EXHAUSTED, "safetensors", "no memory"), -ENOMEM;
  }
  s->buf__ = buf;
  s->len__ = len;
  if (len < 8) {
    rc = (gs_err_set(e, GS_INVALID_ARGUMENT, "safetensors",
                    "file has %zu bytes; a safetensors file starts with an 8-byte header "
                    "length",
                    len), ST_ETRUNC);
    goto fail;
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = n << 8 | buf[i];
  if (n > GS_SAFETENSORS_HEADER_MAX) {
    rc = (gs_err_set(e, GS_INVALID_ARGUMENT, "safetensors",
                    "header length %llu exceeds the %u bytes safetensors allows",
                    (unsigned long long)n, GS_SAFETENSORS_HEADER_MAX), ST_EFORMAT);
    goto fail;
  }
  if (n > len - 8) {
    rc = (gs_err_set(e, GS_INVALID_ARGUMENT, "safetensors",
                    "truncated: the header claims %llu bytes, the file has %zu after the length",
                    (unsigned long long)n, len - 8), ST_ETRUNC);
    goto fail;
  }
  s->header_len = n;
  s->strings__ = malloc((size_t)n + 1);
  if (!s->strings__) {
    rc = (gs_err_set(e, GS_RESOURCE_EXHAUSTED, "safetensors", "no memory"), -ENOMEM);
    goto fail;
  }
  jp j = {.p = (const char *)buf + 8, .len = (size_t)n, .arena = s->strings__, .e = e,
          .field = "safetensors"};
  if (n == 0 || j.p[0] != '{') {
    rc = jfail(&j, "the header must start with '{'");
    goto fail;
  }
  j.pos = 1;
  uint64_t data_len = len - 8 - n;
  if (!jeat(&j, '}')) {
    for (;;) {
      char *key;
      if ((rc = jstring(&j, &key))) goto fail;
      if (!jeat(&j, ':')) {
        rc = jfail(&j, "expected ':'");
        goto fail;
      }
      if (strcmp(key, "__metadata__") == 0) {
        if (s->meta) {
          rc = jfail(&j, "__metadata__ appears twice");
          goto fail;
        }
        if ((rc = jstring_object(&j, &s->meta, &s->meta_count))) goto fail;
      } else {
        if (s->count == cap) {
          cap = cap ? 2 * cap : 16;
          gs_ckpt_tensor *nt = realloc(s->tensors, cap * sizeof *nt);
          uint64_t *ne = nt ? realloc(ends, cap * sizeof *ne) : NULL;
          if (nt) s->tensors = nt;
          if (ne) ends = ne;
          if (!nt || !ne) {
            rc = (gs_err_set(e, GS_RESOURCE_EXHAUSTED, "safetensors", "no memory"), -ENOMEM);
            goto fail;
          }
        }
        gs_ckpt_tensor *t = &s->tensors[s->count];
        memset(t, 0, sizeof *t);
        t->name = key;
        t->dtype = -1;
        bool have_shape = false, have_off = false;
        uint64_t off[2];
        if (!jeat(&j, '{')) {
          rc = jfail(&j, "a tensor entry must be an object");
          goto fail;
        }
        for (bool firstk = true;; firstk = false) {
          if (firstk && jeat(&j, '}')) break;
          char *k;
          if ((rc = jstring(&j, &k))) goto fail;
          if (!jeat(&j, ':')) {
            rc = jfail(&j, "expected ':'");
            goto fail;
          }
          uint32_t cnt;
          if (strcmp(k, "dtype") == 0 && t->dtype == -1) {
            char *dn;
            if ((rc = jstring(&j, &dn))) goto fail;
            t->dtype = dtype_from_name(dn);
            if (t->dtype < 0) {
              rc = (gs_err_set(e, GS_INVALID_ARGUMENT, "safetensors",
                              "tensor %s has dtype \"%s\"; this reader knows F32, F16, BF16, "
                              "I32, I64, U8",
                              key, dn), ST_EFORMAT);
              goto fail;
            }
          } else if (strcmp(k, "shape") == 0 && !have_shape) {
            if ((rc = juint_array(&j, t->shape, GS_CKPT_RANK_MAX, &cnt, "shape"))) goto fail;
            t->rank = cnt;
            have_shape = true;
          } else if (strcmp(k, "data_offsets") == 0 && !have_off) {
            if ((rc = juint_array(&j, off, 2, &cnt, "data_offsets"))) goto fail;
            if (cnt != 2) {
              rc = jfail(&j, "data_offsets needs 2 entries");
              goto fail;
            }
            have_off = true;
          } else {
            rc = (gs_err_set(e, GS_INVALID_ARGUMENT, "safetensors",
                            "tensor %s has an unknown or repeated key \"%s\"", key, k), ST_EFORMAT);
            goto fail;
          }
          if (jeat(&j, '}')) break;
          if (!jeat(&j, ',')) {
            rc = jfail(&j, "expected ',' or '}' in a tensor entry");
            goto fail;
          }
        }
        if (t->dtype < 0 || !have_shape || !have_off) {
          rc = (gs_err_set(e, GS_INVALID_ARGUMENT, "safetensors",
                          "tensor %s lacks dtype, shape or data_offsets", key), ST_EFORMAT);
          goto fail;
        }
        uint64_t elems = 1, want;
        bool over = false;
        for (uint32_t k = 0; k < t->rank; k++)
          over |= __builtin_mul_overflow(elems, t->shape[k], &elems);
        over |= __builtin_mul_overflow(elems, (uint64_t)gs_ckpt_dtype_size(t->dtype), &want);
        if (off[1] < off[0] || off[1] > data_len || over || off[1] - off[0] != want) {
          rc = (gs_err_set(e, GS_INVALID_ARGUMENT, "safetensors",
                          "tensor %s has data_offsets [%llu, %llu], which do not match its "
                          "shape and dtype or lie outside the %llu data bytes",
                          key, (unsigned long long)off[0], (unsigned long long)off[1],
                          (unsigned long long)data_len), ST_EFORMAT);
          goto fail;
        }
        for (size_t i = 0; i < s->count; i++)
          if (strcmp(s->tensors[i].name, key) == 0) {
            rc = (gs_err_set(e, GS_INVALID_ARGUMENT, "safetensors",
                            "tensor %s appears twice", key), ST_EFORMAT);
            goto fail;
          }
        t->bytes = want;
        t->data = (const void *)(uintptr_t)off[0]; /* offset until sorted */
        ends[s->count] = off[1];
        s->count++;
      }
      if (jeat(&j, '}')) break;
      if (!jeat(&j, ',')) {
        rc = jfail(&j, "expected ',' or '}' at the top level");
        goto fail;
      }
    }
  }
  /* Only the padding may follow the top-level object. */
  jws(&j);
  if (j.pos != j.len) {
    rc = jfail(&j, "bytes after the header object");
    goto fail;
  }
  if (s->count) qsort(s->tensors, s->count, sizeof *s->tensors, cmp_offset);
  uint64_t at = 0;
  for (size_t i = 0; i < s->count; i++) {
    uint64_t begin = (uintptr_t)s->tensors[i].data;
    if (begin != at) {
      rc = (gs_err_set(e, GS_INVALID_ARGUMENT, "safetensors",
                      "tensor %s starts at data offset %llu, expected %llu: tensors must be "
                      "contiguous without overlap",
                      s->tensors[i].name, (unsigned long long)begin, (unsigned long long)at), ST_EFORMAT);
      goto fail;
    }
    at = begin + s->tensors[i].bytes;
    s->tensors[i].data = buf + 8 + n + begin;
  }
  if (at != data_len) {
    rc = (gs_err_set(e, GS_INVALID_ARGUMENT, "safetensors",
                    "the tensors cover %llu data bytes but the file has %llu",
                    (unsigned long long)at, (unsigned long long)data_len), at < data_len ? ST_EFORMAT : ST_ETRUNC);
    goto fail;
  }
  free(ends);
  *out = s;
  return 0;
fail:
  free(ends);
  gs_safetensors_free(s);
  return rc;
}

int gs_safetensors_read_mem(const uint8_t *data, size_t len, gs_safetensors **out, gs_err *e) {
  *out = NULL;
  uint8_t *buf = malloc(len ? len : 1);
  if (!buf) return gs_err_set(e, GS_RESOURCE_EXHAUSTED, "safetensors", "no memory"), -ENOMEM;
  if (len) memcpy(buf, data, len);
  return read_buf(buf, len, out, e);
}

int gs_safetensors_read(const char *path, gs_safetensors **out, gs_err *e) {
  uint8_t *buf;
  size_t len;
  *out = NULL;
  int rc = gs_file_read(path, SIZE_MAX - 1, "safetensors", &buf, &len, e);
  if (rc) return rc;
  return read_buf(buf, len, out, e);
}

const gs_ckpt_tensor *gs_safetensors_find(const gs_safetensors *s, const char *name) {
  if (!s || !name) return NULL;
  for (size_t i = 0; i < s->count; i++)
    if (strcmp(s->tensors[i].name, name) == 0) return &s->tensors[i];
  return NULL;
}

const char *gs_safetensors_meta(const gs_safetensors *s, const char *key) {
  if (!s || !key) return NULL;
  for (size_t i = 0; i < s->meta_count; i++)
    if (strcmp(s->meta[i].key, key) == 0) return s->meta[i].value;
  return NULL;
}

void gs_safetensors_free(gs_safetensors *s) {
  if (!s) return;
  free(s->tensors);
  free(s->meta);
  free(s->strings__);
  free(s->buf__);
  free(s);
}
