/* test_wire.c: the framing gpushare's daemon and clients speak. Frames must
 * come out whole and in order however the bytes are split, an oversized
 * length must be refused before anything is allocated for it, and a body that
 * is not a Request must be refused with a reason a person can act on. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "proto/wire.h"

/* Collects delivered frames (copied) for inspection. */
typedef struct sink {
  int n;
  size_t len[16];
  uint8_t *body[16];
  int stop_after; /* return non-zero after this many frames; 0 = never */
} sink;

static int collect(void *u, const uint8_t *body, size_t len) {
  sink *s = u;
  cr_assert_lt(s->n, 16);
  cr_assert(body != NULL || len == 0);
  s->len[s->n] = len;
  s->body[s->n] = malloc(len ? len : 1);
  if (len) memcpy(s->body[s->n], body, len);
  s->n++;
  if (s->stop_after && s->n == s->stop_after) return 42;
  return 0;
}

static void sink_free(sink *s) {
  for (int i = 0; i < s->n; i++) free(s->body[i]);
}

/* A framed Request {id, list_jobs{all}} or {id, job_status{id}}. */
static uint8_t *frame_request(uint64_t id, int status, size_t *len) {
  Gpushare__V1__Request req = GPUSHARE__V1__REQUEST__INIT;
  Gpushare__V1__ListJobsRequest lj = GPUSHARE__V1__LIST_JOBS_REQUEST__INIT;
  Gpushare__V1__JobStatusRequest js = GPUSHARE__V1__JOB_STATUS_REQUEST__INIT;
  req.has_id = 1;
  req.id = id;
  if (status) {
    js.has_id = 1;
    js.id = id * 10;
    req.call_case = GPUSHARE__V1__REQUEST__CALL_JOB_STATUS;
    req.job_status = &js;
  } else {
    lj.has_all = 1;
    lj.all = 1;
    req.call_case = GPUSHARE__V1__REQUEST__CALL_LIST_JOBS;
    req.list_jobs = &lj;
  }
  uint8_t *out;
  cr_assert_eq(gs_wire_frame(&req.base, &out, len), 0);
  return out;
}

static Gpushare__V1__Request *unpack_ok(const uint8_t *body, size_t len) {
  gs_err e = {0};
  Gpushare__V1__Request *r = gs_wire_unpack_request(body, len, &e);
  cr_assert_not_null(r, "unpack failed: %s", e.msg);
  return r;
}

Test(wire, frame_has_big_endian_length) {
  size_t len;
  uint8_t *f = frame_request(7, 0, &len);
  uint32_t n = ((uint32_t)f[0] << 24) | ((uint32_t)f[1] << 16) | ((uint32_t)f[2] << 8) | f[3];
  cr_assert_eq(n + 4, len);
  free(f);
}

Test(wire, round_trip_request_with_oneof) {
  Gpushare__V1__Request req = GPUSHARE__V1__REQUEST__INIT;
  Gpushare__V1__CreateVdevRequest cv = GPUSHARE__V1__CREATE_VDEV_REQUEST__INIT;
  cv.name = "alice-small";
  cv.device = "cpu";
  cv.tenant = "alice";
  cv.has_memory_limit = 1;
  cv.memory_limit = 4ull << 30;
  cv.has_compute_share = 1;
  cv.compute_share = 25;
  cv.has_policy = 1;
  cv.policy = GPUSHARE__V1__POLICY__GROWTH;
  req.has_id = 1;
  req.id = 99;
  req.call_case = GPUSHARE__V1__REQUEST__CALL_CREATE_VDEV;
  req.create_vdev = &cv;
  uint8_t *f;
  size_t len;
  cr_assert_eq(gs_wire_frame(&req.base, &f, &len), 0);

  gs_wire_decoder d;
  gs_wire_decoder_init(&d, GS_WIRE_MAX_FRAME);
  sink s = {0};
  cr_assert_eq(gs_wire_feed(&d, f, len, collect, &s), 0);
  cr_assert_eq(s.n, 1);
  Gpushare__V1__Request *r = unpack_ok(s.body[0], s.len[0]);
  cr_assert_eq(r->id, 99);
  cr_assert_eq(r->call_case, GPUSHARE__V1__REQUEST__CALL_CREATE_VDEV);
  cr_assert_str_eq(r->create_vdev->name, "alice-small");
  cr_assert_str_eq(r->create_vdev->tenant, "alice");
  cr_assert_eq(r->create_vdev->memory_limit, 4ull << 30);
  cr_assert_eq(r->create_vdev->compute_share, 25);
  cr_assert_eq(r->create_vdev->policy, GPUSHARE__V1__POLICY__GROWTH);
  gpushare__v1__request__free_unpacked(r, NULL);
  sink_free(&s);
  gs_wire_decoder_free(&d);
  free(f);
}

Test(wire, byte_by_byte) {
  size_t l1, l2;
  uint8_t *f1 = frame_request(1, 0, &l1), *f2 = frame_request(2, 1, &l2);
  uint8_t buf[256];
  memcpy(buf, f1, l1);
  memcpy(buf + l1, f2, l2);
  gs_wire_decoder d;
  gs_wire_decoder_init(&d, GS_WIRE_MAX_FRAME);
  sink s = {0};
  for (size_t i = 0; i < l1 + l2; i++) {
    cr_assert_eq(gs_wire_feed(&d, buf + i, 1, collect, &s), 0);
    cr_assert_eq(s.n, i + 1 >= l1 + l2 ? 2 : i + 1 >= l1 ? 1 : 0, "after byte %zu", i);
  }
  Gpushare__V1__Request *r1 = unpack_ok(s.body[0], s.len[0]);
  Gpushare__V1__Request *r2 = unpack_ok(s.body[1], s.len[1]);
  cr_assert_eq(r1->id, 1);
  cr_assert_eq(r1->call_case, GPUSHARE__V1__REQUEST__CALL_LIST_JOBS);
  cr_assert_eq(r2->id, 2);
  cr_assert_eq(r2->job_status->id, 20);
  gpushare__v1__request__free_unpacked(r1, NULL);
  gpushare__v1__request__free_unpacked(r2, NULL);
  sink_free(&s);
  gs_wire_decoder_free(&d);
  free(f1);
  free(f2);
}

Test(wire, coalesced_frames_in_one_feed) {
  uint8_t buf[1024];
  size_t off = 0;
  for (int i = 0; i < 5; i++) {
    size_t l;
    uint8_t *f = frame_request((uint64_t)i + 1, i % 2, &l);
    memcpy(buf + off, f, l);
    off += l;
    free(f);
  }
  /* and the first half of a sixth, completed by a second feed */
  size_t l6;
  uint8_t *f6 = frame_request(6, 0, &l6);
  memcpy(buf + off, f6, l6 / 2);
  gs_wire_decoder d;
  gs_wire_decoder_init(&d, GS_WIRE_MAX_FRAME);
  sink s = {0};
  cr_assert_eq(gs_wire_feed(&d, buf, off + l6 / 2, collect, &s), 0);
  cr_assert_eq(s.n, 5);
  cr_assert_eq(gs_wire_feed(&d, f6 + l6 / 2, l6 - l6 / 2, collect, &s), 0);
  cr_assert_eq(s.n, 6);
  for (int i = 0; i < 6; i++) {
    Gpushare__V1__Request *r = unpack_ok(s.body[i], s.len[i]);
    cr_assert_eq(r->id, (uint64_t)i + 1, "frame %d out of order", i);
    gpushare__v1__request__free_unpacked(r, NULL);
  }
  sink_free(&s);
  gs_wire_decoder_free(&d);
  free(f6);
}

Test(wire, callback_stop_leaves_rest_unconsumed) {
  size_t l1, l2;
  uint8_t *f1 = frame_request(1, 0, &l1), *f2 = frame_request(2, 0, &l2);
  uint8_t buf[256];
  memcpy(buf, f1, l1);
  memcpy(buf + l1, f2, l2);
  gs_wire_decoder d;
  gs_wire_decoder_init(&d, GS_WIRE_MAX_FRAME);
  sink s = {.stop_after = 1};
  cr_assert_eq(gs_wire_feed(&d, buf, l1 + l2, collect, &s), 42);
  cr_assert_eq(s.n, 1);
  sink_free(&s);
  gs_wire_decoder_free(&d);
  free(f1);
  free(f2);
}

Test(wire, oversized_prefix_refused_before_allocation) {
  const uint8_t hdr[4] = {0x80, 0x00, 0x00, 0x00}; /* 2 GiB */
  gs_wire_decoder d;
  gs_wire_decoder_init(&d, GS_WIRE_MAX_FRAME);
  sink s = {0};
  cr_assert_eq(gs_wire_feed(&d, hdr, 3, collect, &s), 0);
  cr_assert_eq(gs_wire_feed(&d, hdr + 3, 1, collect, &s), -EMSGSIZE);
  cr_assert_null(d.body, "a body buffer was allocated for a refused length");
  cr_assert_eq(d.body_cap, 0);
  cr_assert_eq(s.n, 0);
  /* the stream is out of sync: further bytes are refused too */
  const uint8_t zero[4] = {0};
  cr_assert_eq(gs_wire_feed(&d, zero, 4, collect, &s), -EMSGSIZE);
  cr_assert_eq(s.n, 0);
  gs_wire_decoder_free(&d);
}

/* A frame announced at the limit but sent a few bytes at a time costs what
 * has arrived, not what was announced; the body still arrives whole. */
Test(wire, buffer_grows_with_what_arrives) {
  const uint32_t n = 3u << 20; /* 3 MiB announced */
  uint8_t *frame = malloc(4 + (size_t)n);
  cr_assert_not_null(frame);
  frame[0] = (uint8_t)(n >> 24), frame[1] = (uint8_t)(n >> 16), frame[2] = (uint8_t)(n >> 8),
  frame[3] = (uint8_t)n;
  for (uint32_t i = 0; i < n; i++) frame[4 + i] = (uint8_t)(i * 31u);
  gs_wire_decoder d;
  gs_wire_decoder_init(&d, GS_WIRE_MAX_FRAME);
  sink s = {0};
  cr_assert_eq(gs_wire_feed(&d, frame, 14, collect, &s), 0);
  cr_expect_leq(d.body_cap, 65536u, "10 bytes of a 3 MiB frame took a %u-byte buffer",
                d.body_cap);
  size_t at = 14;
  while (at < 4 + (size_t)n) {
    size_t chunk = 4 + (size_t)n - at < 100000 ? 4 + (size_t)n - at : 100000;
    cr_assert_eq(gs_wire_feed(&d, frame + at, chunk, collect, &s), 0);
    at += chunk;
    if (at < 4 + (size_t)n)
      cr_assert_leq(d.body_cap, 2 * (at - 4) + 65536, "buffer %u after %zu bytes", d.body_cap,
                    at - 4);
  }
  cr_assert_eq(s.n, 1);
  cr_assert_eq(s.len[0], n);
  cr_expect(memcmp(s.body[0], frame + 4, n) == 0, "the body arrived whole");
  cr_expect_leq(d.body_cap, n, "never past the announced length");
  sink_free(&s);
  free(frame);
  gs_wire_decoder_free(&d);
}

/* A grow hook that counts what the decoder holds, like the daemon's budget
 * across connections, and refuses a growth past `budget`. */
typedef struct tally {
  uint64_t held;   /* bytes the decoder says it holds */
  uint64_t peak;
  uint64_t budget; /* a growth past it is refused with -ENOBUFS */
  int grows, shrinks, refusals;
} tally;

static int count_grow(void *u, uint32_t from, uint32_t to) {
  tally *t = u;
  cr_assert_eq(t->held, from, "the hook was told %u bytes held, it counted %llu", from,
               (unsigned long long)t->held);
  if (to > from && to > t->budget) {
    t->refusals++;
    return -ENOBUFS;
  }
  if (to > from) t->grows++;
  else t->shrinks++;
  t->held = to;
  if (to > t->peak) t->peak = to;
  return 0;
}

/* A 16 MiB frame sent in 4 KiB pieces: at every step the buffer is at most
 * about twice what has arrived (never the announced 16 MiB up front), every
 * change goes through the hook, and the big buffer is released once the
 * frame is delivered; a small frame after it reuses a small buffer. */
Test(wire, growth_is_told_and_released_after_the_frame) {
  const uint32_t n = GS_WIRE_MAX_FRAME;
  uint8_t *frame = malloc(4 + (size_t)n);
  cr_assert_not_null(frame);
  frame[0] = (uint8_t)(n >> 24), frame[1] = (uint8_t)(n >> 16), frame[2] = (uint8_t)(n >> 8),
  frame[3] = (uint8_t)n;
  for (uint32_t i = 0; i < n; i++) frame[4 + i] = (uint8_t)(i * 7u + 3);
  gs_wire_decoder d;
  gs_wire_decoder_init(&d, GS_WIRE_MAX_FRAME);
  tally t = {.budget = UINT64_MAX};
  gs_wire_decoder_set_grow(&d, count_grow, &t);
  sink s = {0};
  cr_assert(gs_wire_decoder_idle(&d));
  size_t at = 0;
  while (at < 4 + (size_t)n) {
    size_t chunk = 4 + (size_t)n - at < 4096 ? 4 + (size_t)n - at : 4096;
    cr_assert_eq(gs_wire_feed(&d, frame + at, chunk, collect, &s), 0);
    at += chunk;
    if (at < 4 + (size_t)n) {
      size_t got = at - 4;
      cr_assert(!gs_wire_decoder_idle(&d));
      cr_assert_eq(t.held, d.body_cap);
      cr_assert_leq(d.body_cap, 2 * got + GS_WIRE_KEEP, "%u bytes held after %zu arrived",
                    d.body_cap, got);
      cr_assert_geq(d.body_cap, got);
    }
  }
  cr_assert_eq(s.n, 1);
  cr_assert_eq(s.len[0], n);
  cr_expect(memcmp(s.body[0], frame + 4, n) == 0, "the body arrived whole");
  cr_assert(gs_wire_decoder_idle(&d));
  cr_assert_eq(t.peak, n, "peak %llu: never past the announced length",
               (unsigned long long)t.peak);
  cr_assert_eq(d.body_cap, 0, "the 16 MiB buffer is kept after its frame");
  cr_assert_null(d.body);
  cr_assert_eq(t.held, 0);
  cr_assert_eq(t.grows, 9, "64 KiB doubling to 16 MiB is 9 sizes, got %d", t.grows);
  cr_assert_eq(t.shrinks, 1);
  /* A small frame split in two keeps its small buffer between frames. */
  const uint8_t small[4 + 10] = {0, 0, 0, 10, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  for (int k = 0; k < 2; k++) {
    cr_assert_eq(gs_wire_feed(&d, small, 7, collect, &s), 0);
    cr_assert_eq(gs_wire_feed(&d, small + 7, 7, collect, &s), 0);
  }
  cr_assert_eq(s.n, 3);
  cr_assert_eq(s.len[2], 10);
  cr_assert_eq(d.body_cap, 10);
  cr_assert_eq(t.held, 10);
  gs_wire_decoder_free(&d);
  cr_assert_eq(t.held, 0, "free tells the hook");
  sink_free(&s);
  free(frame);
}

/* A refused growth: the feed fails with the hook's error, nothing past the
 * bytes already held is taken, and the accounting still matches. */
Test(wire, refused_growth_stops_the_feed) {
  const uint32_t n = 1u << 20; /* 1 MiB announced, 200 KiB allowed */
  uint8_t *frame = calloc(1, 4 + (size_t)n);
  cr_assert_not_null(frame);
  frame[1] = (uint8_t)(n >> 16);
  gs_wire_decoder d;
  gs_wire_decoder_init(&d, GS_WIRE_MAX_FRAME);
  tally t = {.budget = 200u << 10};
  gs_wire_decoder_set_grow(&d, count_grow, &t);
  sink s = {0};
  cr_assert_eq(gs_wire_feed(&d, frame, 4 + 100000, collect, &s), 0);
  cr_assert_eq(d.body_cap, 128u << 10);
  cr_assert_eq(gs_wire_feed(&d, frame + 4 + 100000, 100000, collect, &s), -ENOBUFS);
  cr_assert_eq(t.refusals, 1);
  cr_assert_eq(d.body_cap, 128u << 10, "a refused growth left the buffer as it was");
  cr_assert_eq(t.held, d.body_cap);
  cr_assert_eq(s.n, 0);
  gs_wire_decoder_free(&d);
  cr_assert_eq(t.held, 0);
  free(frame);
}

Test(wire, limit_is_inclusive) {
  /* a frame of exactly max bytes passes, max + 1 is refused */
  uint8_t buf[4 + 8] = {0, 0, 0, 8};
  gs_wire_decoder d;
  gs_wire_decoder_init(&d, 8);
  sink s = {0};
  cr_assert_eq(gs_wire_feed(&d, buf, sizeof buf, collect, &s), 0);
  cr_assert_eq(s.n, 1);
  cr_assert_eq(s.len[0], 8);
  const uint8_t nine[4] = {0, 0, 0, 9};
  cr_assert_eq(gs_wire_feed(&d, nine, 4, collect, &s), -EMSGSIZE);
  sink_free(&s);
  gs_wire_decoder_free(&d);
}

Test(wire, zero_length_frames) {
  const uint8_t buf[12] = {0};
  gs_wire_decoder d;
  gs_wire_decoder_init(&d, GS_WIRE_MAX_FRAME);
  sink s = {0};
  cr_assert_eq(gs_wire_feed(&d, buf, 12, collect, &s), 0);
  cr_assert_eq(s.n, 3);
  for (int i = 0; i < 3; i++) cr_assert_eq(s.len[i], 0);
  /* an empty body is a valid, empty Request */
  Gpushare__V1__Request *r = unpack_ok(s.body[0], 0);
  cr_assert_eq(r->has_id, 0);
  cr_assert_eq(r->call_case, GPUSHARE__V1__REQUEST__CALL__NOT_SET);
  gpushare__v1__request__free_unpacked(r, NULL);
  sink_free(&s);
  gs_wire_decoder_free(&d);
}

static void unpack_refused(const uint8_t *body, size_t len, const char *needle) {
  gs_err e = {0};
  Gpushare__V1__Request *r = gs_wire_unpack_request(body, len, &e);
  cr_assert_null(r);
  cr_assert_eq(e.code, GS_INVALID_ARGUMENT);
  cr_assert_str_eq(e.field, "frame");
  cr_assert(strstr(e.msg, "is not a gpushare.v1.Request"), "%s", e.msg);
  cr_assert(strstr(e.msg, needle), "message \"%s\" lacks \"%s\"", e.msg, needle);
}

Test(wire, garbage_body_refused_with_reason) {
  const uint8_t garbage[12] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                               0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
  unpack_refused(garbage, sizeof garbage, "frame of 12 bytes");
  /* wire type 7 on field 1 */
  const uint8_t wt7[2] = {0x0f, 0x00};
  unpack_refused(wt7, 2, "wire type 7");
  /* id (field 1, a varint) sent as length-delimited */
  const uint8_t wrong_type[3] = {0x0a, 0x01, 0x00};
  unpack_refused(wrong_type, 3, "field id (number 1)");
  /* a length past the end of the frame */
  const uint8_t overrun[3] = {0x0a, 0x7f, 0x00};
  unpack_refused(overrun, 3, "announces 127 bytes, 1 remain");
  /* a truncated varint */
  const uint8_t trunc[2] = {0x08, 0x80};
  unpack_refused(trunc, 2, "truncated varint");
  /* a fault inside a nested message is located by its path:
     job_status (field 24, length 2) holding field id as wire type 5 */
  const uint8_t nested[8] = {0xc2, 0x01, 0x05, 0x0d, 0x00, 0x00, 0x00, 0x00};
  unpack_refused(nested, 8, "field job_status.id (number 1) at byte 3 has wire type 32-bit");
}

Test(wire, response_unpack) {
  Gpushare__V1__Response resp = GPUSHARE__V1__RESPONSE__INIT;
  Gpushare__V1__MetricsResponse m = GPUSHARE__V1__METRICS_RESPONSE__INIT;
  m.text = "gpushare_jobs_running 3\n";
  resp.has_id = 1;
  resp.id = 5;
  resp.has_code = 1;
  resp.code = GPUSHARE__V1__CODE__OK;
  resp.result_case = GPUSHARE__V1__RESPONSE__RESULT_METRICS;
  resp.metrics = &m;
  uint8_t *f;
  size_t len;
  cr_assert_eq(gs_wire_frame(&resp.base, &f, &len), 0);
  gs_err e = {0};
  Gpushare__V1__Response *r = gs_wire_unpack_response(f + 4, len - 4, &e);
  cr_assert_not_null(r, "%s", e.msg);
  cr_assert_str_eq(r->metrics->text, "gpushare_jobs_running 3\n");
  gpushare__v1__response__free_unpacked(r, NULL);
  free(f);
  const uint8_t bad[1] = {0x08};
  cr_assert_null(gs_wire_unpack_response(bad, 1, &e));
  cr_assert(strstr(e.msg, "is not a gpushare.v1.Response"), "%s", e.msg);
}

Test(wire, blocking_write_and_read_over_a_socketpair) {
  int sv[2];
  cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  size_t l;
  uint8_t *f = frame_request(11, 1, &l);
  cr_assert_eq(gs_wire_write_all(sv[0], f, l), 0);
  uint8_t *body;
  size_t blen;
  cr_assert_eq(gs_wire_read_frame(sv[1], GS_WIRE_MAX_FRAME, &body, &blen), 0);
  cr_assert_eq(blen, l - 4);
  cr_assert_eq(memcmp(body, f + 4, blen), 0);
  free(body);
  /* an oversized announcement is refused without reading the body */
  const uint8_t big[4] = {0x80, 0, 0, 0};
  cr_assert_eq(gs_wire_write_all(sv[0], big, 4), 0);
  cr_assert_eq(gs_wire_read_frame(sv[1], GS_WIRE_MAX_FRAME, &body, &blen), -EMSGSIZE);
  /* end of file inside a frame, then a clean end of file */
  const uint8_t partial[6] = {0, 0, 0, 9, 1, 2};
  cr_assert_eq(gs_wire_write_all(sv[0], partial, 6), 0);
  close(sv[0]);
  cr_assert_eq(gs_wire_read_frame(sv[1], GS_WIRE_MAX_FRAME, &body, &blen), -ECONNRESET);
  cr_assert_eq(gs_wire_read_frame(sv[1], GS_WIRE_MAX_FRAME, &body, &blen), -EPIPE);
  close(sv[1]);
  free(f);
}

Test(wire, frame_refuses_oversized_message) {
  Gpushare__V1__Request req = GPUSHARE__V1__REQUEST__INIT;
  Gpushare__V1__UploadDatasetRequest up = GPUSHARE__V1__UPLOAD_DATASET_REQUEST__INIT;
  size_t n = GS_WIRE_MAX_FRAME + 1;
  uint8_t *data = calloc(1, n);
  cr_assert_not_null(data);
  up.has_data = 1;
  up.data.data = data;
  up.data.len = n;
  req.call_case = GPUSHARE__V1__REQUEST__CALL_UPLOAD_DATASET;
  req.upload_dataset = &up;
  uint8_t *out = NULL;
  size_t len = 0;
  cr_assert_eq(gs_wire_frame(&req.base, &out, &len), -EMSGSIZE);
  cr_assert_null(out);
  free(data);
}

/* Strings are text: a request whose string is not UTF-8, or holds a NUL
 * that C would cut it at, is refused naming the field, before any handler
 * could keep or echo it. */
Test(wire, strings_must_be_utf8_without_nul) {
  /* Request{id 3, create_tenant{name: ...}} */
  static const uint8_t nul[] = {0x08, 0x03, 0x5a, 0x05, 0x0a, 0x03, 'a', 0x00, 'b'};
  static const uint8_t ff[] = {0x08, 0x03, 0x5a, 0x03, 0x0a, 0x01, 0xff};
  static const uint8_t ok[] = {0x08, 0x03, 0x5a, 0x06, 0x0a, 0x04, 'c', 'a', 0xc3, 0xa9};
  gs_err e;
  gs_err_clear(&e);
  cr_assert_null(gs_wire_unpack_request(nul, sizeof nul, &e));
  cr_assert_eq(e.code, GS_INVALID_ARGUMENT);
  cr_assert_str_eq(e.field, "create_tenant.name");
  cr_assert(strstr(e.msg, "a NUL byte at byte 1"), "%s", e.msg);
  gs_err_clear(&e);
  cr_assert_null(gs_wire_unpack_request(ff, sizeof ff, &e));
  cr_assert_str_eq(e.field, "create_tenant.name");
  cr_assert(strstr(e.msg, "not UTF-8"), "%s", e.msg);
  gs_err_clear(&e);
  Gpushare__V1__Request *r = gs_wire_unpack_request(ok, sizeof ok, &e);
  cr_assert_not_null(r, "%s", e.msg);
  cr_assert_str_eq(r->create_tenant->name, "ca\xc3\xa9");
  gpushare__v1__request__free_unpacked(r, NULL);
}
