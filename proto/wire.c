/*
 * wire.c: gpushare's framing (4-byte big-endian length + packed protobuf)
 * and the checked unpack of one frame.
 *
 * The incremental decoder is a two-state machine: collect 4 header bytes,
 * then collect `need` body bytes. The length is checked against the limit
 * the moment the fourth header byte arrives, so nothing is ever allocated
 * from an unchecked length. The body buffer grows with the bytes that have
 * arrived, doubling from 64 KiB and never past the announced length, so a
 * peer that announces 16 MiB and sends 10 bytes costs 64 KiB, and one that
 * has sent n bytes of a frame costs under 2n + 64 KiB. A buffer of up to
 * GS_WIRE_KEEP is kept between frames (a steady stream of small frames costs
 * no allocation per frame); a larger one is released once its frame has
 * been delivered, so a connection that sent one big frame does not hold its
 * size for the rest of its life. A frame that arrives whole inside one feed
 * is delivered straight from the caller's bytes, without a copy.
 *
 * Every change of the buffer's size goes through the optional grow hook
 * first: the daemon counts the bytes all its connections hold in partly
 * received frames there and refuses (or makes room for) a growth past its
 * budget.
 *
 * protobuf_c_message_unpack says only "NULL" when it refuses a frame, and a
 * user staring at "bad frame" learns nothing. So before unpacking we walk the
 * bytes ourselves with the message descriptor: every tag, varint and length
 * is checked, known fields must carry the wire type their declaration
 * implies, and nested messages are walked in turn. The first fault is
 * reported with its byte offset and the field path ("call.submit.spec.model
 * field 2 ..."). If the walk finds nothing and protobuf-c still refuses, we
 * say that too, with the frame's size.
 */
#include "proto/wire.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/utf8.h"

/* ------------------------------------------------------------ decoder --- */

void gs_wire_decoder_init(gs_wire_decoder *d, uint32_t max_frame) {
  memset(d, 0, sizeof *d);
  d->max = max_frame;
}

void gs_wire_decoder_set_grow(gs_wire_decoder *d, gs_wire_grow_fn fn, void *u) {
  d->grow = fn;
  d->grow_u = u;
}

int gs_wire_decoder_idle(const gs_wire_decoder *d) { return d->hdr_len == 0; }

/* Give the body buffer back (told to the grow hook first). */
static void decoder_release(gs_wire_decoder *d) {
  if (d->grow && d->body_cap) d->grow(d->grow_u, d->body_cap, 0);
  free(d->body);
  d->body = NULL;
  d->body_cap = 0;
}

void gs_wire_decoder_free(gs_wire_decoder *d) {
  decoder_release(d);
  d->hdr_len = d->have = d->need = 0;
}

static uint32_t be32(const uint8_t *p) {
  return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

/* Make room in d->body for `upto` bytes of the current frame's body. The
 * buffer grows with what has arrived (doubling, from 64 KiB, never past the
 * announced length), so a peer that announces 16 MiB and sends 10 bytes
 * costs 64 KiB, not 16 MiB (fuzz_wire's finding). The grow hook may refuse. */
static int decoder_reserve(gs_wire_decoder *d, uint32_t upto) {
  if (upto <= d->body_cap && d->body) return 0;
  uint32_t cap = d->body_cap ? d->body_cap : GS_WIRE_KEEP;
  while (cap < upto) cap = cap > UINT32_MAX / 2 ? UINT32_MAX : cap * 2;
  if (cap > d->need) cap = d->need ? d->need : 1;
  if (cap < upto) cap = upto;
  if (d->grow && cap > d->body_cap) {
    int rc = d->grow(d->grow_u, d->body_cap, cap);
    if (rc) return rc;
  }
  uint8_t *nb = realloc(d->body, cap);
  if (!nb) {
    if (d->grow && cap > d->body_cap) d->grow(d->grow_u, cap, d->body_cap);
    return -ENOMEM;
  }
  d->body = nb;
  d->body_cap = cap;
  return 0;
}

/* A frame has been delivered from d->body: a buffer past GS_WIRE_KEEP goes. */
static void decoder_done(gs_wire_decoder *d) {
  d->hdr_len = 0;
  if (d->body_cap > GS_WIRE_KEEP) decoder_release(d);
}

int gs_wire_feed(gs_wire_decoder *d, const uint8_t *data, size_t len,
                 int (*on_frame)(void *u, const uint8_t *body, size_t len), void *u) {
  static const uint8_t empty[1] = {0};
  if (d->failed) return -EMSGSIZE;
  while (len > 0) {
    if (d->hdr_len < 4) {
      size_t take = 4 - d->hdr_len;
      if (take > len) take = len;
      memcpy(d->hdr + d->hdr_len, data, take);
      d->hdr_len += (uint32_t)take;
      data += take;
      len -= take;
      if (d->hdr_len < 4) return 0;
      d->need = be32(d->hdr);
      d->have = 0;
      if (d->need > d->max) {
        d->failed = 1;
        return -EMSGSIZE;
      }
      /* Whole body already here: deliver from the caller's bytes. */
      if (len >= d->need) {
        const uint8_t *body = d->need ? data : empty;
        data += d->need;
        len -= d->need;
        d->hdr_len = 0;
        int rc = on_frame(u, body, d->need);
        if (rc) return rc;
        continue;
      }
    }
    size_t take = d->need - d->have;
    if (take > len) take = len;
    int grc = decoder_reserve(d, d->have + (uint32_t)take);
    if (grc) return grc;
    if (take) memcpy(d->body + d->have, data, take);
    d->have += (uint32_t)take;
    data += take;
    len -= take;
    if (d->have < d->need) return 0;
    d->hdr_len = 0;
    int rc = on_frame(u, d->body, d->need);
    decoder_done(d);
    if (rc) return rc;
  }
  return 0;
}

/* -------------------------------------------------------------- frame --- */

int gs_wire_frame(const ProtobufCMessage *msg, uint8_t **out, size_t *out_len) {
  size_t n = protobuf_c_message_get_packed_size(msg);
  if (n > GS_WIRE_MAX_FRAME) return -EMSGSIZE;
  uint8_t *buf = malloc(4 + n);
  if (!buf) return -ENOMEM;
  buf[0] = (uint8_t)(n >> 24);
  buf[1] = (uint8_t)(n >> 16);
  buf[2] = (uint8_t)(n >> 8);
  buf[3] = (uint8_t)n;
  size_t packed = protobuf_c_message_pack(msg, buf + 4);
  if (packed != n) {
    free(buf);
    return -EPROTO;
  }
  *out = buf;
  *out_len = 4 + n;
  return 0;
}

/* ------------------------------------------------------ checked unpack --- */

#define WALK_MAX_DEPTH 32

typedef struct walk {
  const uint8_t *base; /* start of the frame, for byte offsets */
  char path[256];      /* field path of the message being walked */
  char why[512];       /* the first fault found */
  char field[256];     /* the string field at fault, when one is ("create_tenant.name") */
} walk;

/* Read a varint at *p (< end). 0, or -1 when truncated or over 10 bytes. */
static int walk_varint(const uint8_t **p, const uint8_t *end, uint64_t *v) {
  uint64_t r = 0;
  for (int shift = 0; shift < 70; shift += 7) {
    if (*p >= end) return -1;
    uint8_t b = *(*p)++;
    r |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) {
      *v = r;
      return 0;
    }
  }
  return -1;
}

static const char *wire_type_name(unsigned wt) {
  switch (wt) {
    case 0: return "varint";
    case 1: return "64-bit";
    case 2: return "length-delimited";
    case 3: return "start-group";
    case 4: return "end-group";
    case 5: return "32-bit";
    default: return "invalid";
  }
}

/* The wire type a field of this type is sent with (unpacked form). */
static unsigned expected_wire_type(ProtobufCType t) {
  switch (t) {
    case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_FIXED32:
    case PROTOBUF_C_TYPE_FLOAT: return 5;
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_FIXED64:
    case PROTOBUF_C_TYPE_DOUBLE: return 1;
    case PROTOBUF_C_TYPE_STRING:
    case PROTOBUF_C_TYPE_BYTES:
    case PROTOBUF_C_TYPE_MESSAGE: return 2;
    default: return 0;
  }
}

static int walk_message(walk *w, const ProtobufCMessageDescriptor *desc, const uint8_t *p,
                        const uint8_t *end, int depth) {
  if (depth > WALK_MAX_DEPTH) {
    snprintf(w->why, sizeof w->why, "messages nested deeper than %d at %s", WALK_MAX_DEPTH,
             w->path[0] ? w->path : "top level");
    return -1;
  }
  while (p < end) {
    size_t at = (size_t)(p - w->base);
    uint64_t tag;
    if (walk_varint(&p, end, &tag)) {
      snprintf(w->why, sizeof w->why, "truncated field tag at byte %zu%s%s", at,
               w->path[0] ? " in " : "", w->path);
      return -1;
    }
    uint64_t num = tag >> 3;
    unsigned wt = (unsigned)(tag & 7);
    if (num == 0 || num > 536870911u) {
      snprintf(w->why, sizeof w->why, "field number %llu at byte %zu%s%s is not valid",
               (unsigned long long)num, at, w->path[0] ? " in " : "", w->path);
      return -1;
    }
    const ProtobufCFieldDescriptor *f =
        protobuf_c_message_descriptor_get_field(desc, (unsigned)num);
    const uint8_t *val = p;
    uint64_t vlen = 0;
    switch (wt) {
      case 0: {
        uint64_t v;
        if (walk_varint(&p, end, &v)) {
          snprintf(w->why, sizeof w->why, "truncated varint for field %llu at byte %zu%s%s",
                   (unsigned long long)num, at, w->path[0] ? " in " : "", w->path);
          return -1;
        }
        break;
      }
      case 1:
      case 5: {
        size_t n = wt == 1 ? 8 : 4;
        if ((size_t)(end - p) < n) {
          snprintf(w->why, sizeof w->why,
                   "field %llu at byte %zu%s%s needs %zu bytes, %zu remain",
                   (unsigned long long)num, at, w->path[0] ? " in " : "", w->path, n,
                   (size_t)(end - p));
          return -1;
        }
        p += n;
        break;
      }
      case 2:
        if (walk_varint(&p, end, &vlen) || vlen > (uint64_t)(end - p)) {
          snprintf(w->why, sizeof w->why,
                   "field %llu at byte %zu%s%s announces %llu bytes, %zu remain",
                   (unsigned long long)num, at, w->path[0] ? " in " : "", w->path,
                   (unsigned long long)vlen, (size_t)(end - p));
          return -1;
        }
        val = p;
        p += vlen;
        break;
      default:
        snprintf(w->why, sizeof w->why,
                 "field %llu at byte %zu%s%s has wire type %u (%s), which gpushare never sends",
                 (unsigned long long)num, at, w->path[0] ? " in " : "", w->path, wt,
                 wire_type_name(wt));
        return -1;
    }
    if (!f) continue; /* unknown fields are kept by protobuf-c; newer peers may send them */
    unsigned want = expected_wire_type(f->type);
    int packed_ok = f->label == PROTOBUF_C_LABEL_REPEATED && wt == 2 && want != 2;
    if (wt != want && !packed_ok) {
      snprintf(w->why, sizeof w->why,
               "field %s%s%s (number %llu) at byte %zu has wire type %s, its declaration needs %s",
               w->path, w->path[0] ? "." : "", f->name, (unsigned long long)num, at,
               wire_type_name(wt), wire_type_name(want));
      return -1;
    }
    if (f->type == PROTOBUF_C_TYPE_STRING) {
      /* Strings are text: protobuf requires UTF-8, and C would cut one at
       * a NUL. Refused here, so no handler keeps or echoes such bytes. */
      size_t off;
      const char *what;
      if (gs_utf8_text(val, (size_t)vlen, &off, &what) < 0) {
        snprintf(w->field, sizeof w->field, "%s%s%s", w->path, w->path[0] ? "." : "", f->name);
        snprintf(w->why, sizeof w->why,
                 "%s has %s at byte %zu of its %llu: strings are UTF-8 text without NUL", w->field,
                 what, off, (unsigned long long)vlen);
        return -1;
      }
    }
    if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
      size_t plen = strlen(w->path);
      snprintf(w->path + plen, sizeof w->path - plen, "%s%s", plen ? "." : "", f->name);
      int rc = walk_message(w, f->descriptor, val, val + vlen, depth + 1);
      if (rc) return rc;
      w->path[plen] = '\0';
    }
  }
  return 0;
}

static void *unpack_checked(const ProtobufCMessageDescriptor *desc, const uint8_t *body,
                            size_t len, gs_err *e) {
  static const uint8_t empty[1] = {0};
  if (len > GS_WIRE_MAX_FRAME) {
    gs_err_set(e, GS_INVALID_ARGUMENT, "frame", "frame of %zu bytes is over the %u-byte limit",
               len, GS_WIRE_MAX_FRAME);
    return NULL;
  }
  if (!body) body = empty;
  walk w = {.base = body};
  if (walk_message(&w, desc, body, body + len, 0)) {
    if (w.field[0])
      gs_err_set(e, GS_INVALID_ARGUMENT, w.field, "%s", w.why);
    else
      gs_err_set(e, GS_INVALID_ARGUMENT, "frame", "frame of %zu bytes is not a %s: %s", len,
                 desc->name, w.why);
    return NULL;
  }
  ProtobufCMessage *m = protobuf_c_message_unpack(desc, NULL, len, body);
  if (!m) {
    gs_err_set(e, GS_INVALID_ARGUMENT, "frame",
               "frame of %zu bytes is not a %s: its fields are well formed but protobuf-c "
               "refused a value (a string that is not UTF-8, a oneof or enum it cannot hold, "
               "or out of memory)",
               len, desc->name);
    return NULL;
  }
  return m;
}

Gpushare__V1__Request *gs_wire_unpack_request(const uint8_t *body, size_t len, gs_err *e) {
  return unpack_checked(&gpushare__v1__request__descriptor, body, len, e);
}

Gpushare__V1__Response *gs_wire_unpack_response(const uint8_t *body, size_t len, gs_err *e) {
  return unpack_checked(&gpushare__v1__response__descriptor, body, len, e);
}

/* ------------------------------------------------------ blocking helpers --- */

int gs_wire_write_all(int fd, const uint8_t *buf, size_t len) {
  struct stat st;
  int is_sock = fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode);
  while (len > 0) {
    ssize_t n = is_sock ? send(fd, buf, len, MSG_NOSIGNAL) : write(fd, buf, len);
    if (n < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    buf += n;
    len -= (size_t)n;
  }
  return 0;
}

/* Read exactly len bytes. 0; -EPIPE at end of file before any byte when
 * eof_ok_at_start, else -ECONNRESET; -errno. */
static int read_exact(int fd, uint8_t *buf, size_t len, int eof_ok_at_start) {
  size_t got = 0;
  while (got < len) {
    ssize_t n = read(fd, buf + got, len - got);
    if (n < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    if (n == 0) return (got == 0 && eof_ok_at_start) ? -EPIPE : -ECONNRESET;
    got += (size_t)n;
  }
  return 0;
}

int gs_wire_read_frame(int fd, uint32_t max_frame, uint8_t **body, size_t *len) {
  uint8_t hdr[4];
  int rc = read_exact(fd, hdr, 4, 1);
  if (rc) return rc;
  uint32_t n = be32(hdr);
  if (n > max_frame) return -EMSGSIZE;
  uint8_t *b = malloc(n ? n : 1);
  if (!b) return -ENOMEM;
  rc = read_exact(fd, b, n, 0);
  if (rc) goto fail_body;
  *body = b;
  *len = n;
  return 0;
fail_body:
  free(b);
  return rc;
}
