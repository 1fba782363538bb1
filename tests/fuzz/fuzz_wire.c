/*
 * fuzz_wire: the incremental frame decoder of proto/wire.c (gs_wire_feed),
 * as gpushared's connections run it: bytes arrive in pieces of any size.
 *
 * Input: byte 0 picks the limit (bit 7 clear: GS_WIRE_MAX_FRAME, the
 * daemon's; set: a small limit, 0..127, so refusals are reached often);
 * byte 1 is the number of pieces k (0..31); the next k bytes are piece
 * sizes (0..255); the rest is the stream. The stream is fed once in those
 * pieces (the last piece takes what remains) and once whole, to a second
 * decoder. Checked:
 *  - both deliver the same frames and end the same way (0 or -EMSGSIZE);
 *  - every frame delivered is, header and body, the next bytes of the
 *    stream, and no frame is over the limit;
 *  - -EMSGSIZE comes only from a header announcing more than the limit, and
 *    after it every feed is refused again;
 *  - each delivered body goes through gs_wire_unpack_request, as the
 *    daemon's dispatcher does;
 *  - the piecewise decoder's grow hook, as the daemon's budget uses it, is
 *    told of every change of its buffer (what it counts always matches),
 *    a growth never goes past the announced length, a buffer over
 *    GS_WIRE_KEEP is never kept between frames, and freeing tells it all.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/wire.h"

#define MAX_FRAMES 4096

typedef struct frames {
  const uint8_t *stream; /* the whole stream, to check each frame against */
  size_t stream_len;
  size_t off;            /* where the next frame's header must start */
  uint32_t max;
  size_t n;
  size_t len[MAX_FRAMES];
  uint32_t sum[MAX_FRAMES]; /* a cheap digest of each body */
  int unpack;            /* also unpack the bodies as Requests */
} frames;

static uint32_t digest(const uint8_t *p, size_t n) {
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 16777619u;
  return h;
}

static uint32_t be32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static int on_frame(void *u, const uint8_t *body, size_t len) {
  frames *f = u;
  if (!body) abort(); /* a zero-length frame still comes with a pointer */
  if (len > f->max) abort();
  /* The frame is exactly the next header + body of the stream. */
  if (f->off + 4 + len > f->stream_len) abort();
  if (be32(f->stream + f->off) != len) abort();
  if (len && memcmp(f->stream + f->off + 4, body, len) != 0) abort();
  f->off += 4 + len;
  if (f->n < MAX_FRAMES) {
    f->len[f->n] = len;
    f->sum[f->n] = digest(body, len);
  }
  f->n++;
  if (f->unpack) {
    gs_err e;
    gs_err_clear(&e);
    Gpushare__V1__Request *rq = gs_wire_unpack_request(body, len, &e);
    if (rq) {
      gpushare__v1__request__free_unpacked(rq, NULL);
    } else if (e.code == GS_OK || !e.msg[0]) {
      abort(); /* a refusal always says why */
    }
  }
  return 0;
}

/* The daemon's view of one decoder's buffer, through the grow hook. */
typedef struct held {
  const gs_wire_decoder *d;
  uint64_t bytes; /* what the hook was told the buffer holds */
} held;

static int on_grow(void *u, uint32_t from, uint32_t to) {
  held *h = u;
  if (from != h->bytes || from != h->d->body_cap) abort();
  if (to > from && to > h->d->need) abort(); /* never past the announced length */
  h->bytes = to;
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2) return 0;
  uint32_t max = (data[0] & 0x80) ? (uint32_t)(data[0] & 0x7f) : GS_WIRE_MAX_FRAME;
  size_t k = data[1] & 31;
  if (size < 2 + k) return 0;
  const uint8_t *sizes = data + 2;
  const uint8_t *stream = data + 2 + k;
  size_t len = size - 2 - k;

  static frames a, b; /* large: not on the stack */
  memset(&a, 0, sizeof a);
  memset(&b, 0, sizeof b);
  a.stream = b.stream = stream;
  a.stream_len = b.stream_len = len;
  a.max = b.max = max;
  a.unpack = 1;

  /* In pieces. */
  gs_wire_decoder d;
  gs_wire_decoder_init(&d, max);
  held h = {.d = &d};
  gs_wire_decoder_set_grow(&d, on_grow, &h);
  size_t pos = 0;
  int rc_a = 0;
  for (size_t i = 0; i <= k && rc_a == 0; i++) {
    size_t take = i < k ? sizes[i] : len - pos;
    if (take > len - pos) take = len - pos;
    rc_a = gs_wire_feed(&d, stream + pos, take, on_frame, &a);
    pos += take;
    if (h.bytes != d.body_cap) abort();
    if (gs_wire_decoder_idle(&d) && d.body_cap > GS_WIRE_KEEP) abort();
  }
  if (rc_a != 0 && rc_a != -EMSGSIZE) abort(); /* -ENOMEM aside, nothing else */
  if (rc_a == -EMSGSIZE) {
    /* Refused from the header of the frame after the last one delivered. */
    if (a.off + 4 > len || be32(stream + a.off) <= max) abort();
    uint8_t more[8] = {0};
    if (gs_wire_feed(&d, more, sizeof more, on_frame, &a) != -EMSGSIZE) abort();
  } else {
    /* What is left undelivered is less than one whole frame. */
    size_t left = len - a.off;
    if (left >= 4 && 4 + (size_t)be32(stream + a.off) <= left) abort();
  }
  gs_wire_decoder_free(&d);
  if (h.bytes != 0) abort();

  /* Whole, into a second decoder: the same frames, the same ending. */
  gs_wire_decoder_init(&d, max);
  int rc_b = gs_wire_feed(&d, stream, len, on_frame, &b);
  gs_wire_decoder_free(&d);
  if (rc_a != rc_b || a.n != b.n || a.off != b.off) abort();
  size_t n = a.n < MAX_FRAMES ? a.n : MAX_FRAMES;
  for (size_t i = 0; i < n; i++)
    if (a.len[i] != b.len[i] || a.sum[i] != b.sum[i]) abort();
  return 0;
}
