/*
 * wire.h: how gpushare messages travel over a stream socket.
 *
 * Every frame is a 4-byte big-endian length followed by that many bytes of
 * one packed gpushare.v1.Request or Response. The daemon reads with libuv in
 * whatever pieces the kernel hands it, so the decoder is incremental: it keeps
 * the header bytes seen so far and the body being filled, and delivers each
 * complete frame in order. A length over the limit is refused from the four
 * header bytes alone, before any allocation, and the body buffer grows with
 * the bytes that arrive (doubling from 64 KiB, never past the announced
 * length), so a peer cannot make the daemon reserve memory it announces but
 * never sends: what a partly received frame holds is at most about twice
 * what has arrived. A buffer over 64 KiB is released once its frame has been
 * delivered. The caller may watch every change of the buffer's size, and
 * refuse a growth, through a grow hook (the daemon's budget across
 * connections). Clients and tests, which may
 * block, use gs_wire_write_all and gs_wire_read_frame instead.
 */
#ifndef GS_WIRE_H
#define GS_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "proto/gpushare.pb-c.h"

#define GS_WIRE_MAX_FRAME (16u << 20) /* 16 MiB: body bytes of one frame */

#define GS_WIRE_KEEP (64u << 10) /* a body buffer up to this size is kept between frames */

/* Told before the body buffer changes size, from `from` to `to` bytes (to <
 * from: shrunk or released, which cannot be refused). A growth goes ahead
 * when it returns 0; a negative errno refuses it and gs_wire_feed returns
 * that value, the buffer and the bytes received so far unchanged. */
typedef int (*gs_wire_grow_fn)(void *u, uint32_t from, uint32_t to);

typedef struct gs_wire_decoder {
  uint8_t hdr[4];   /* length prefix of the frame being read */
  uint32_t hdr_len; /* how many of hdr's bytes have arrived (0..4) */
  uint32_t max;     /* largest body accepted, in bytes */
  uint32_t need;    /* announced body length of the current frame */
  uint32_t have;    /* body bytes received so far */
  uint8_t *body;    /* buffer of body_cap bytes, reused across frames */
  uint32_t body_cap;
  int failed;       /* set after -EMSGSIZE: the stream is out of sync */
  gs_wire_grow_fn grow; /* NULL, or told of every change of body_cap */
  void *grow_u;
} gs_wire_decoder;

void gs_wire_decoder_init(gs_wire_decoder *d, uint32_t max_frame);
/* Releases the body buffer (telling the grow hook); the decoder may be fed
 * again afterwards, from the start of a frame. */
void gs_wire_decoder_free(gs_wire_decoder *d);
void gs_wire_decoder_set_grow(gs_wire_decoder *d, gs_wire_grow_fn fn, void *u);
/* True between frames: no byte of the next frame has arrived. */
int gs_wire_decoder_idle(const gs_wire_decoder *d);

/* Feed bytes as they arrive (partial and coalesced reads). Calls on_frame once
 * per complete frame, in order; a zero-length frame is delivered as
 * (some pointer, 0). If on_frame returns non-zero, stops and returns that
 * value (the bytes after that frame are not consumed). Returns 0, or
 * -EMSGSIZE when a length prefix exceeds max_frame: detected from the 4 header
 * bytes, before any allocation for the body; the decoder is then unusable and
 * every further feed returns -EMSGSIZE (the caller closes the connection).
 * -ENOMEM when the body buffer cannot be allocated, or what the grow hook
 * returned when it refused a growth (the bytes of this feed from the one that
 * needed it on are not consumed; the caller closes the connection). */
int gs_wire_feed(gs_wire_decoder *d, const uint8_t *data, size_t len,
                 int (*on_frame)(void *u, const uint8_t *body, size_t len), void *u);

/* Frame a message: a malloc'd buffer with the 4-byte big-endian length and the
 * packed body. Returns 0, -EMSGSIZE when the packed message is over
 * GS_WIRE_MAX_FRAME, -ENOMEM. */
int gs_wire_frame(const ProtobufCMessage *msg, uint8_t **out, size_t *out_len);

/* Unpack a frame body with checks; on failure NULL and e set
 * (GS_INVALID_ARGUMENT, a message that says what was wrong, e.g. "frame of 12
 * bytes is not a gpushare.v1.Request: field 1 has wire type 7 at byte 0").
 * e->field is "frame" for a malformed frame, or the path of the string field
 * that is not UTF-8 text or holds a NUL ("create_tenant.name"). Free with gpushare__v1__request__free_unpacked(r, NULL). */
Gpushare__V1__Request *gs_wire_unpack_request(const uint8_t *body, size_t len, gs_err *e);
Gpushare__V1__Response *gs_wire_unpack_response(const uint8_t *body, size_t len, gs_err *e);

/* Blocking helpers for clients and tests. write_all writes every byte
 * (retrying on EINTR and short writes; MSG_NOSIGNAL on sockets): 0 or -errno.
 * read_frame reads one frame, checks the announced length against max_frame
 * before allocating *body (malloc'd, at least 1 byte even for an empty frame;
 * the caller frees it): 0, -EMSGSIZE, -ECONNRESET on end of file inside a
 * frame, -EPIPE on a clean end of file before any header byte, or -errno. */
int gs_wire_write_all(int fd, const uint8_t *buf, size_t len);
int gs_wire_read_frame(int fd, uint32_t max_frame, uint8_t **body, size_t *len);

#endif
