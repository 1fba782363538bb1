/* test_client.c: libgpushare against a scripted gpushared.
 *
 * A thread plays the daemon on a temporary socket: it reads real frames and
 * answers each call from a small script (echoing or deliberately breaking
 * the request id, refusing with a code, reassembling uploads, serving a file
 * in chunks, streaming watch events). The client library and the gpuctl
 * binary are driven against it, so the framing, the id checks, the chunking
 * and gpuctl's exit codes are tested without the real daemon. SHA-256 is
 * checked against the FIPS 180-4 example vectors. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client/client.h"
#include "common/sha256.h"
#include "proto/wire.h"

static void hex_of(const char *s, size_t n, char hex[65]) {
  gs_sha256 h;
  uint8_t d[32];
  gs_sha256_init(&h);
  gs_sha256_update(&h, s, n);
  gs_sha256_final(&h, d);
  gs_sha256_hex(d, hex);
}

Test(sha256, fips_vectors) {
  char hex[65];
  hex_of("", 0, hex);
  cr_assert_str_eq(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  hex_of("abc", 3, hex);
  cr_assert_str_eq(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const char *m = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  hex_of(m, strlen(m), hex);
  cr_assert_str_eq(hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

Test(sha256, million_a_in_odd_pieces) {
  char *a = malloc(1000000);
  memset(a, 'a', 1000000);
  gs_sha256 h;
  gs_sha256_init(&h);
  size_t off = 0, step = 1;
  while (off < 1000000) { /* pieces of 1, 2, 3, ... bytes cross block edges */
    size_t n = step < 1000000 - off ? step : 1000000 - off;
    gs_sha256_update(&h, a + off, n);
    off += n;
    step = step % 131 + 1;
  }
  uint8_t d[32];
  char hex[65];
  gs_sha256_final(&h, d);
  gs_sha256_hex(d, hex);
  cr_assert_str_eq(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  free(a);
}

/* ---------------------------------------------------------- fake daemon --- */

enum mode { ECHO, WRONG_ID, REFUSE };

static struct {
  char path[108];
  int lfd;
  pthread_t th;
  enum mode mode;
  /* upload reassembly */
  uint8_t *up;
  size_t up_len;
  int chunks;
  char up_name[64];
  char up_sha[65];
  /* what fetch serves */
  uint8_t *blob;
  size_t blob_len;
  /* what submit received */
  char images[128], labels[128];
} fake;

static void send_resp(int fd, Gpushare__V1__Response *r) {
  uint8_t *buf;
  size_t len;
  cr_assert_eq(gs_wire_frame(&r->base, &buf, &len), 0);
  gs_wire_write_all(fd, buf, len);
  free(buf);
}

static void serve_one(int fd, const Gpushare__V1__Request *q) {
  Gpushare__V1__Response r = GPUSHARE__V1__RESPONSE__INIT;
  r.has_id = 1;
  r.id = fake.mode == WRONG_ID ? q->id + 100 : q->id;
  if (fake.mode == REFUSE) {
    r.has_code = 1;
    r.code = GPUSHARE__V1__CODE__NOT_FOUND;
    r.message = "no vdev named \"nope\"";
    r.field = "vdev";
    send_resp(fd, &r);
    return;
  }
  switch (q->call_case) {
    case GPUSHARE__V1__REQUEST__CALL_VERSION: {
      Gpushare__V1__VersionResponse v = GPUSHARE__V1__VERSION_RESPONSE__INIT;
      v.version = "0.1.0-test";
      v.has_uid = 1;
      v.uid = 1234;
      v.tenant = "alice \"quoted\"";
      r.result_case = GPUSHARE__V1__RESPONSE__RESULT_VERSION;
      r.version = &v;
      send_resp(fd, &r);
      return;
    }
    case GPUSHARE__V1__REQUEST__CALL_UPLOAD_DATASET: {
      const Gpushare__V1__UploadDatasetRequest *u = q->upload_dataset;
      Gpushare__V1__UploadDatasetResponse ur = GPUSHARE__V1__UPLOAD_DATASET_RESPONSE__INIT;
      Gpushare__V1__DatasetInfo di = GPUSHARE__V1__DATASET_INFO__INIT;
      if (fake.chunks == 0) {
        snprintf(fake.up_name, sizeof fake.up_name, "%s", u->name ? u->name : "");
        fake.up = malloc(u->total_bytes + 1);
      } else {
        cr_assert_eq(u->upload_id, 77, "later chunks carry the daemon's upload id");
      }
      cr_assert_leq(u->data.len, GS_CLIENT_CHUNK);
      if (u->data.len) memcpy(fake.up + fake.up_len, u->data.data, u->data.len);
      fake.up_len += u->data.len;
      fake.chunks++;
      ur.has_upload_id = 1;
      ur.upload_id = 77;
      ur.has_received_bytes = 1;
      ur.received_bytes = fake.up_len;
      if (u->commit) {
        snprintf(fake.up_sha, sizeof fake.up_sha, "%s", u->sha256 ? u->sha256 : "");
        di.name = fake.up_name;
        di.sha256 = fake.up_sha;
        di.has_bytes = 1;
        di.bytes = fake.up_len;
        ur.dataset = &di;
      }
      r.result_case = GPUSHARE__V1__RESPONSE__RESULT_UPLOAD_DATASET;
      r.upload_dataset = &ur;
      send_resp(fd, &r);
      return;
    }
    case GPUSHARE__V1__REQUEST__CALL_FETCH: {
      Gpushare__V1__FetchResponse fr = GPUSHARE__V1__FETCH_RESPONSE__INIT;
      uint64_t off = q->fetch->offset;
      size_t n = fake.blob_len - off < GS_CLIENT_CHUNK ? fake.blob_len - off : GS_CLIENT_CHUNK;
      fr.has_data = 1;
      fr.data.data = fake.blob + off;
      fr.data.len = n;
      fr.has_offset = 1;
      fr.offset = off;
      fr.has_total_bytes = 1;
      fr.total_bytes = fake.blob_len;
      fr.has_last = 1;
      fr.last = off + n == fake.blob_len;
      r.result_case = GPUSHARE__V1__RESPONSE__RESULT_FETCH;
      r.fetch = &fr;
      send_resp(fd, &r);
      return;
    }
    case GPUSHARE__V1__REQUEST__CALL_WATCH: {
      /* as gpushared streams it: the job as it stands, progress, an epoch
       * end, then the final state with the reason; job 10 succeeds, any
       * other fails */
      int ok = q->watch->id == 10;
      for (int i = 0; i < 4; i++) {
        Gpushare__V1__WatchResponse w = GPUSHARE__V1__WATCH_RESPONSE__INIT;
        Gpushare__V1__JobEvent ev = GPUSHARE__V1__JOB_EVENT__INIT;
        Gpushare__V1__EpochMetrics em = GPUSHARE__V1__EPOCH_METRICS__INIT;
        ev.has_job_id = ev.has_state = ev.has_step = ev.has_total_steps = 1;
        ev.job_id = q->watch->id;
        ev.state = GPUSHARE__V1__JOB_STATE__RUNNING;
        ev.step = (uint64_t)(i + 1) * 10;
        ev.total_steps = 30;
        if (i == 1) {
          ev.has_epoch = ev.has_loss = ev.has_samples_per_second = 1;
          ev.has_memory_in_use = ev.has_memory_limit = ev.has_loss_scale = 1;
          ev.epoch = 1;
          ev.loss = 0.5f;
          ev.samples_per_second = 1234;
          ev.memory_in_use = 1024;
          ev.memory_limit = 4096;
          ev.loss_scale = 1024;
        }
        if (i == 2) {
          em.has_epoch = em.has_test_accuracy = em.has_train_loss = em.has_test_loss = 1;
          em.epoch = 1;
          em.train_loss = 0.5f;
          em.test_loss = 0.625f;
          em.test_accuracy = 0.875f;
          ev.epoch_end = &em;
        }
        if (i == 3) {
          ev.state = ok ? GPUSHARE__V1__JOB_STATE__SUCCEEDED : GPUSHARE__V1__JOB_STATE__FAILED;
          ev.message = ok ? "SUCCEEDED" : "FAILED: out of memory in dense_1";
        }
        w.event = &ev;
        w.has_final = 1;
        w.final = i == 3;
        r.result_case = GPUSHARE__V1__RESPONSE__RESULT_WATCH;
        r.watch = &w;
        send_resp(fd, &r);
      }
      return;
    }
    case GPUSHARE__V1__REQUEST__CALL_JOB_STATUS: {
      if (q->job_status->id != 9 && q->job_status->id != 10) {
        r.has_code = 1;
        r.code = GPUSHARE__V1__CODE__NOT_FOUND;
        r.message = "no job";
        send_resp(fd, &r);
        return;
      }
      int ok = q->job_status->id == 10;
      Gpushare__V1__JobStatusResponse js = GPUSHARE__V1__JOB_STATUS_RESPONSE__INIT;
      Gpushare__V1__Job j = GPUSHARE__V1__JOB__INIT;
      Gpushare__V1__EpochMetrics em = GPUSHARE__V1__EPOCH_METRICS__INIT, *eps[1] = {&em};
      Gpushare__V1__OomReport o = GPUSHARE__V1__OOM_REPORT__INIT;
      Gpushare__V1__OomSuggestion sg = GPUSHARE__V1__OOM_SUGGESTION__INIT, *sgs[1] = {&sg};
      j.has_id = j.has_state = j.has_step = j.has_total_steps = 1;
      j.id = q->job_status->id;
      j.state = ok ? GPUSHARE__V1__JOB_STATE__SUCCEEDED : GPUSHARE__V1__JOB_STATE__FAILED;
      j.step = ok ? 30 : 20;
      j.total_steps = 30;
      j.vdev = "small";
      j.tenant = "alice";
      em.has_epoch = em.has_test_accuracy = 1;
      em.epoch = 1;
      em.test_accuracy = ok ? 0.9f : 0.875f;
      j.n_epoch = 1;
      j.epoch = eps;
      if (!ok) {
        j.reason = "out of memory in dense_1 (activations)";
        o.layer = "dense_1";
        o.role = "activations";
        o.shape = "(128, 4096)";
        o.dtype = "f32";
        o.has_bytes = o.has_limit_bytes = o.has_in_use_bytes = o.has_largest_free_bytes = 1;
        o.bytes = 2097152;
        o.vdev = "small";
        o.limit_bytes = 4194304;
        o.in_use_bytes = 3145728;
        o.largest_free_bytes = 1048576;
        o.has_cause = 1;
        o.cause = GPUSHARE__V1__OOM_CAUSE__QUOTA;
        o.explanation = "dense_1 needs 2 MiB more than the vdev has left";
        sg.what = "micro-batch 32 x 4 accumulation steps";
        sg.has_predicted_peak_bytes = sg.has_saving_bytes = 1;
        sg.predicted_peak_bytes = 2097152;
        sg.saving_bytes = 3145728;
        o.n_suggestion = 1;
        o.suggestion = sgs;
        j.oom = &o;
      }
      js.job = &j;
      r.result_case = GPUSHARE__V1__RESPONSE__RESULT_JOB_STATUS;
      r.job_status = &js;
      send_resp(fd, &r);
      return;
    }
    case GPUSHARE__V1__REQUEST__CALL_LIST_JOBS: {
      /* job 1 runs and has reported no step yet; job 2 is in its epoch 3 */
      Gpushare__V1__ListJobsResponse lr = GPUSHARE__V1__LIST_JOBS_RESPONSE__INIT;
      Gpushare__V1__Job j1 = GPUSHARE__V1__JOB__INIT, j2 = GPUSHARE__V1__JOB__INIT, *js[2] = {&j1, &j2};
      Gpushare__V1__EpochMetrics e1 = GPUSHARE__V1__EPOCH_METRICS__INIT, e2 = GPUSHARE__V1__EPOCH_METRICS__INIT;
      Gpushare__V1__EpochMetrics *es[2] = {&e1, &e2};
      j1.has_id = j2.has_id = j1.has_state = j2.has_state = 1;
      j1.id = 1;
      j2.id = 2;
      j1.state = j2.state = GPUSHARE__V1__JOB_STATE__RUNNING;
      j2.has_step = j2.has_total_steps = 1;
      j2.step = 250;
      j2.total_steps = 1000;
      e1.has_epoch = e2.has_epoch = 1;
      e1.epoch = 1;
      e2.epoch = 2;
      j2.n_epoch = 2;
      j2.epoch = es;
      lr.n_job = 2;
      lr.job = js;
      r.result_case = GPUSHARE__V1__RESPONSE__RESULT_LIST_JOBS;
      r.list_jobs = &lr;
      send_resp(fd, &r);
      return;
    }
    case GPUSHARE__V1__REQUEST__CALL_MEMORY: {
      Gpushare__V1__MemoryResponse mr = GPUSHARE__V1__MEMORY_RESPONSE__INIT;
      Gpushare__V1__MemoryTimeline tl = GPUSHARE__V1__MEMORY_TIMELINE__INIT;
      Gpushare__V1__MemoryStep st[50], *stp[50];
      for (int i = 0; i < 50; i++) {
        Gpushare__V1__MemoryStep init = GPUSHARE__V1__MEMORY_STEP__INIT;
        st[i] = init;
        st[i].has_step = st[i].has_peak_in_use_bytes = 1;
        st[i].step = (uint64_t)i + 1;
        st[i].peak_in_use_bytes = 1000u * (uint64_t)(i < 25 ? i + 1 : 50 - i);
        stp[i] = &st[i];
      }
      Gpushare__V1__PlanRow pr = GPUSHARE__V1__PLAN_ROW__INIT, *prs[1] = {&pr};
      pr.layer = "dense_1";
      pr.kind = "dense";
      pr.has_weights_bytes = pr.has_activation_bytes = 1;
      pr.weights_bytes = 10000;
      pr.activation_bytes = 15000;
      tl.n_step = 50;
      tl.step = stp;
      tl.n_at_peak = 1;
      tl.at_peak = prs;
      tl.has_peak_bytes = tl.has_planned_peak_bytes = 1;
      tl.peak_bytes = 25000;
      tl.planned_peak_bytes = 30000;
      mr.timeline = &tl;
      r.result_case = GPUSHARE__V1__RESPONSE__RESULT_MEMORY;
      r.memory = &mr;
      send_resp(fd, &r);
      return;
    }
    case GPUSHARE__V1__REQUEST__CALL_SUBMIT: {
      const Gpushare__V1__JobSpec *sp = q->submit->spec;
      snprintf(fake.images, sizeof fake.images, "%s", sp->train->idx->images);
      snprintf(fake.labels, sizeof fake.labels, "%s", sp->train->idx->labels);
      Gpushare__V1__SubmitResponse sr = GPUSHARE__V1__SUBMIT_RESPONSE__INIT;
      Gpushare__V1__Job j = GPUSHARE__V1__JOB__INIT;
      j.has_id = 1;
      j.id = 42;
      j.vdev = "small";
      sr.job = &j;
      r.result_case = GPUSHARE__V1__RESPONSE__RESULT_SUBMIT;
      r.submit = &sr;
      send_resp(fd, &r);
      return;
    }
    default:
      r.has_code = 1;
      r.code = GPUSHARE__V1__CODE__INTERNAL;
      r.message = "the scripted daemon does not know this call";
      send_resp(fd, &r);
  }
}

static void *fake_main(void *arg) {
  (void)arg;
  for (;;) {
    int fd = accept(fake.lfd, NULL, NULL);
    if (fd < 0) return NULL;
    uint8_t *body;
    size_t len;
    while (gs_wire_read_frame(fd, GS_WIRE_MAX_FRAME, &body, &len) == 0) {
      gs_err e = {0};
      Gpushare__V1__Request *q = gs_wire_unpack_request(body, len, &e);
      free(body);
      if (!q) break;
      serve_one(fd, q);
      gpushare__v1__request__free_unpacked(q, NULL);
    }
    close(fd);
  }
}

static void fake_start(void) {
  memset(&fake, 0, sizeof fake);
  snprintf(fake.path, sizeof fake.path, "/tmp/gs-test-client-%d.sock", (int)getpid());
  unlink(fake.path);
  fake.lfd = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  strcpy(sa.sun_path, fake.path);
  cr_assert_eq(bind(fake.lfd, (struct sockaddr *)&sa, sizeof sa), 0);
  cr_assert_eq(listen(fake.lfd, 4), 0);
  pthread_create(&fake.th, NULL, fake_main, NULL);
}

static void fake_stop(void) {
  shutdown(fake.lfd, SHUT_RDWR);
  close(fake.lfd);
  pthread_join(fake.th, NULL);
  unlink(fake.path);
  free(fake.up);
  free(fake.blob);
}

TestSuite(client, .init = fake_start, .fini = fake_stop);
TestSuite(gpuctl, .init = fake_start, .fini = fake_stop);

Test(client, connect_to_missing_socket_names_it) {
  gs_client *c = NULL;
  gs_err e = {0};
  int rc = gs_client_connect("/tmp/gs-no-such-daemon.sock", &c, &e);
  cr_assert_eq(rc, -ENOENT);
  cr_assert_str_eq(e.msg, "cannot connect to /tmp/gs-no-such-daemon.sock: No such file or directory");
}

Test(client, call_assigns_ids_and_checks_echo) {
  gs_client *c;
  gs_err e = {0};
  cr_assert_eq(gs_client_connect(fake.path, &c, &e), 0, "%s", e.msg);
  for (uint64_t want = 1; want <= 3; want++) {
    Gpushare__V1__Request req = GPUSHARE__V1__REQUEST__INIT;
    Gpushare__V1__VersionRequest v = GPUSHARE__V1__VERSION_REQUEST__INIT;
    req.call_case = GPUSHARE__V1__REQUEST__CALL_VERSION;
    req.version = &v;
    Gpushare__V1__Response *r;
    cr_assert_eq(gs_client_call(c, &req, &r, &e), 0, "%s", e.msg);
    cr_assert_eq(req.id, want);
    cr_assert_eq(r->id, want);
    cr_assert_str_eq(r->version->version, "0.1.0-test");
    cr_assert_eq(r->version->uid, 1234);
    gs_client_free_response(r);
  }
  fake.mode = WRONG_ID;
  Gpushare__V1__Request req = GPUSHARE__V1__REQUEST__INIT;
  Gpushare__V1__VersionRequest v = GPUSHARE__V1__VERSION_REQUEST__INIT;
  req.call_case = GPUSHARE__V1__REQUEST__CALL_VERSION;
  req.version = &v;
  Gpushare__V1__Response *r;
  cr_assert_eq(gs_client_call(c, &req, &r, &e), -EPROTO);
  cr_assert_null(r);
  cr_assert(strstr(e.msg, "answered request 4 with id 104"), "%s", e.msg);
  gs_client_close(c);
}

Test(client, refusal_carries_code_message_field) {
  gs_client *c;
  gs_err e = {0};
  cr_assert_eq(gs_client_connect(fake.path, &c, &e), 0, "%s", e.msg);
  fake.mode = REFUSE;
  Gpushare__V1__Request req = GPUSHARE__V1__REQUEST__INIT;
  Gpushare__V1__DeleteVdevRequest d = GPUSHARE__V1__DELETE_VDEV_REQUEST__INIT;
  d.name = "nope";
  req.call_case = GPUSHARE__V1__REQUEST__CALL_DELETE_VDEV;
  req.delete_vdev = &d;
  Gpushare__V1__Response *r;
  cr_assert_eq(gs_client_call(c, &req, &r, &e), GS_CLIENT_REFUSED);
  cr_assert_not_null(r);
  cr_assert_eq(e.code, GS_NOT_FOUND);
  cr_assert_str_eq(e.field, "vdev");
  cr_assert_str_eq(e.msg, "no vdev named \"nope\"");
  gs_client_free_response(r);
  gs_client_close(c);
}

static void write_file(const char *path, const uint8_t *p, size_t n) {
  FILE *f = fopen(path, "wb");
  cr_assert_not_null(f);
  cr_assert_eq(fwrite(p, 1, n, f), n);
  fclose(f);
}

Test(client, upload_in_chunks_with_sha256) {
  size_t n = 2 * GS_CLIENT_CHUNK + 12345;
  uint8_t *data = malloc(n);
  for (size_t i = 0; i < n; i++) data[i] = (uint8_t)(i * 131 + (i >> 9));
  char path[128];
  snprintf(path, sizeof path, "/tmp/gs-test-upload-%d.bin", (int)getpid());
  write_file(path, data, n);
  char want[65];
  hex_of((const char *)data, n, want);

  gs_client *c;
  gs_err e = {0};
  cr_assert_eq(gs_client_connect(fake.path, &c, &e), 0, "%s", e.msg);
  char got[65];
  Gpushare__V1__DatasetInfo *info;
  cr_assert_eq(gs_client_upload_file(c, "fmnist-train", path, got, &info, &e), 0, "%s", e.msg);
  cr_assert_eq(fake.chunks, 3);
  cr_assert_eq(fake.up_len, n);
  cr_assert_eq(memcmp(fake.up, data, n), 0);
  cr_assert_str_eq(fake.up_name, "fmnist-train");
  cr_assert_str_eq(fake.up_sha, want);
  cr_assert_str_eq(got, want);
  cr_assert_not_null(info);
  cr_assert_eq(info->bytes, n);
  gpushare__v1__dataset_info__free_unpacked(info, NULL);
  char h2[65];
  uint64_t bytes;
  cr_assert_eq(gs_client_sha256_file(path, h2, &bytes, &e), 0);
  cr_assert_str_eq(h2, want);
  cr_assert_eq(bytes, n);
  gs_client_close(c);
  unlink(path);
  free(data);
}

Test(client, upload_of_empty_file_is_one_committing_chunk) {
  char path[128];
  snprintf(path, sizeof path, "/tmp/gs-test-empty-%d.bin", (int)getpid());
  write_file(path, (const uint8_t *)"", 0);
  gs_client *c;
  gs_err e = {0};
  cr_assert_eq(gs_client_connect(fake.path, &c, &e), 0, "%s", e.msg);
  char got[65];
  cr_assert_eq(gs_client_upload_file(c, "empty", path, got, NULL, &e), 0, "%s", e.msg);
  cr_assert_eq(fake.chunks, 1);
  cr_assert_str_eq(got, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  gs_client_close(c);
  unlink(path);
}

Test(client, fetch_by_offset) {
  fake.blob_len = GS_CLIENT_CHUNK + 999;
  fake.blob = malloc(fake.blob_len);
  for (size_t i = 0; i < fake.blob_len; i++) fake.blob[i] = (uint8_t)(i ^ (i >> 8));
  char path[128];
  snprintf(path, sizeof path, "/tmp/gs-test-fetch-%d.bin", (int)getpid());
  int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
  gs_client *c;
  gs_err e = {0};
  cr_assert_eq(gs_client_connect(fake.path, &c, &e), 0, "%s", e.msg);
  uint64_t total;
  cr_assert_eq(gs_client_fetch(c, 5, 0, fd, &total, &e), 0, "%s", e.msg);
  cr_assert_eq(total, fake.blob_len);
  uint8_t *back = malloc(fake.blob_len);
  cr_assert_eq(pread(fd, back, fake.blob_len, 0), (ssize_t)fake.blob_len);
  cr_assert_eq(memcmp(back, fake.blob, fake.blob_len), 0);
  free(back);
  close(fd);
  unlink(path);
  gs_client_close(c);
}

Test(client, watch_stream_until_final) {
  gs_client *c;
  gs_err e = {0};
  cr_assert_eq(gs_client_connect(fake.path, &c, &e), 0, "%s", e.msg);
  Gpushare__V1__Request req = GPUSHARE__V1__REQUEST__INIT;
  Gpushare__V1__WatchRequest w = GPUSHARE__V1__WATCH_REQUEST__INIT;
  w.has_id = 1;
  w.id = 9;
  req.call_case = GPUSHARE__V1__REQUEST__CALL_WATCH;
  req.watch = &w;
  uint64_t id;
  cr_assert_eq(gs_client_send(c, &req, &id, &e), 0);
  int n = 0, final = 0;
  while (!final) {
    Gpushare__V1__Response *r;
    cr_assert_eq(gs_client_recv(c, id, &r, &e), 0, "%s", e.msg);
    cr_assert_eq(r->watch->event->job_id, 9);
    final = r->watch->final;
    n++;
    gs_client_free_response(r);
  }
  cr_assert_eq(n, 4);
  gs_client_close(c);
}

/* Run gpuctl against the scripted daemon; returns its exit status and
 * leaves its stdout in out. */
static int run_gpuctl(const char *args, char *out, size_t n) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "%s --socket %s %s 2>&1", GPUCTL_PATH, fake.path, args);
  FILE *p = popen(cmd, "r");
  cr_assert_not_null(p);
  size_t got = fread(out, 1, n - 1, p);
  out[got] = '\0';
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

Test(gpuctl, version_json_escapes_strings) {
  char out[4096];
  cr_assert_eq(run_gpuctl("--json version", out, sizeof out), 0, "%s", out);
  cr_assert(strstr(out, "\"version\":\"0.1.0-test\""), "%s", out);
  cr_assert(strstr(out, "\"uid\":1234"), "%s", out);
  cr_assert(strstr(out, "\"tenant\":\"alice \\\"quoted\\\"\""), "%s", out);
}

Test(gpuctl, refusal_exit_1_with_code_and_field) {
  fake.mode = REFUSE;
  char out[4096];
  cr_assert_eq(run_gpuctl("vdev delete nope", out, sizeof out), 1, "%s", out);
  cr_assert_str_eq(out, "gpuctl: NOT_FOUND: no vdev named \"nope\" (field: vdev)\n");
}

Test(gpuctl, watch_exit_code_follows_the_job) {
  char out[8192];
  cr_assert_eq(run_gpuctl("watch 9", out, sizeof out), 1, "%s", out);
  cr_assert(strstr(out, "job 9 RUNNING at step 10/30"), "the first event is the job as it stands: %s", out);
  cr_assert(strstr(out, "job 9  epoch 1  step 20/30 (66.7%)  loss 0.5000  1234 samples/s  mem 1.00 KiB / 4.00 KiB"
                        "  scale 1024"),
            "%s", out);
  cr_assert(strstr(out, "epoch 1 done: train loss 0.5000, test loss 0.6250, test accuracy 87.50%"), "%s", out);
  cr_assert(strstr(out, "gpuctl: job 9 FAILED: out of memory in dense_1 (activations)"),
            "the reason is the job's, asked for after the final event: %s", out);
  cr_assert(strstr(out, "tensor   layer dense_1, role activations, shape (128, 4096), f32, 2.00 MiB"),
            "the OOM report: %s", out);
  cr_assert(strstr(out, "out of memory: QUOTA (the vdev's memory limit is reached)"), "%s", out);
  cr_assert_eq(run_gpuctl("watch 10", out, sizeof out), 0, "%s", out);
  cr_assert(strstr(out, "job 10 SUCCEEDED at step 30/30 after 1 epoch: test accuracy 90.00%"), "%s", out);
  cr_assert_null(strstr(out, "out of memory"), "%s", out);
  cr_assert_eq(run_gpuctl("--json watch 9", out, sizeof out), 1, "%s", out);
  cr_assert(strstr(out, "\"final\":true"), "%s", out);
  cr_assert(strstr(out, "\"state\":\"FAILED\""), "%s", out);
  cr_assert(strstr(out, "\"epoch_end\":{\"epoch\":1"), "%s", out);
}

Test(gpuctl, status_prints_epochs_reason_and_oom_report) {
  char out[8192];
  cr_assert_eq(run_gpuctl("status 9", out, sizeof out), 0, "%s", out);
  cr_assert(strstr(out, "state:        FAILED"), "%s", out);
  cr_assert(strstr(out, "reason:       out of memory in dense_1 (activations)"), "%s", out);
  cr_assert(strstr(out, "87.50%"), "the epochs table: %s", out);
  cr_assert(strstr(out, "vdev     small: limit 4.00 MiB, in use 3.00 MiB"), "%s", out);
  cr_assert(strstr(out, "largest free block 1.00 MiB"), "%s", out);
  cr_assert(strstr(out, "why      dense_1 needs 2 MiB more"), "%s", out);
  cr_assert(strstr(out, "fits     micro-batch 32 x 4 accumulation steps"), "%s", out);
}

Test(gpuctl, memory_charts_steps_and_breaks_down_the_peak) {
  char out[16384];
  cr_assert_eq(run_gpuctl("memory 9", out, sizeof out), 0, "%s", out);
  cr_assert(strstr(out, "(measured is 83.3% of planned)"), "%s", out);
  /* 50 steps in 20 rows; the highest row (steps 25-26 hold 25000) is the
   * longest bar, the planned peak's '|' lies beyond it */
  cr_assert(strstr(out, "steps 1-2 "), "%s", out);
  cr_assert(strstr(out, "steps 48-50"), "%s", out);
  const char *row = strstr(out, "steps 26-27");
  cr_assert_not_null(row, "%s", out);
  cr_assert(strstr(row, "########################################"), "%s", out);
  cr_assert(strstr(out, "|"), "%s", out);
  cr_assert(strstr(out, "dense_1"), "%s", out);
  cr_assert(strstr(out, "total"), "%s", out);
}

/* ------------------------------------------------------- gpuctl job ... --- */

/* A fresh directory for one test's job files. */
static void job_dir(char *dir, size_t n) {
  snprintf(dir, n, "/tmp/gs-test-job-XXXXXX");
  cr_assert_not_null(mkdtemp(dir));
}

static void write_text(const char *path, const char *text) {
  write_file(path, (const uint8_t *)text, strlen(text));
}

static int dir_entries(const char *dir) {
  char cmd[256], out[64];
  snprintf(cmd, sizeof cmd, "ls -A %s | wc -l", dir);
  FILE *p = popen(cmd, "r");
  cr_assert_not_null(p);
  size_t got = fread(out, 1, sizeof out - 1, p);
  out[got] = '\0';
  pclose(p);
  return atoi(out);
}

static void rm_dir(const char *dir) {
  char cmd[256];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  cr_assert_eq(system(cmd), 0);
}

static const char small_job[] =
    "# a comment, as tenants write them\n"
    "name: \"tiny\"\n"
    "model {\n"
    "  input { height: 8 width: 8 channels: 1 }\n"
    "  layer { flatten {} }\n"
    "  layer { dense { units: 4 } }\n"
    "}\n"
    "train { idx { images: \"fashion-train-images\" labels: \"fashion-train-labels\" } }\n"
    "batch_size: 16\n"
    "accumulation_steps: 4\n"
    "precision: MIXED_FLOAT16\n"
    "optimizer { sgd { learning_rate: 0.05 momentum: 0.9 } }\n";

Test(gpuctl, job_encode_writes_a_pb_that_unpacks) {
  char dir[64], src[128], pb[128], args[512], out[4096];
  job_dir(dir, sizeof dir);
  snprintf(src, sizeof src, "%s/tiny.txtpb", dir);
  snprintf(pb, sizeof pb, "%s/tiny.pb", dir);
  write_text(src, small_job);
  snprintf(args, sizeof args, "job encode %s", src);
  cr_assert_eq(run_gpuctl(args, out, sizeof out), 0, "%s", out);
  cr_assert(strstr(out, "tiny.pb"), "%s", out);
  FILE *f = fopen(pb, "rb");
  cr_assert_not_null(f, "the default output is the input's name with .pb");
  uint8_t buf[4096];
  size_t n = fread(buf, 1, sizeof buf, f);
  fclose(f);
  Gpushare__V1__JobSpec *spec = gpushare__v1__job_spec__unpack(NULL, n, buf);
  cr_assert_not_null(spec);
  cr_assert_str_eq(spec->name, "tiny");
  cr_assert_eq(spec->batch_size, 16);
  cr_assert_eq(spec->accumulation_steps, 4);
  cr_assert_eq(spec->precision, GPUSHARE__V1__PRECISION__MIXED_FLOAT16);
  cr_assert_eq(spec->model->n_layer, 2);
  cr_assert_eq(spec->model->layer[1]->dense->units, 4);
  cr_assert_str_eq(spec->train->idx->images, "fashion-train-images");
  cr_assert_eq(spec->optimizer->kind_case, GPUSHARE__V1__OPTIMIZER__KIND_SGD);
  gpushare__v1__job_spec__free_unpacked(spec, NULL);
  /* -o names the output */
  snprintf(args, sizeof args, "job encode %s -o %s/other.pb", src, dir);
  cr_assert_eq(run_gpuctl(args, out, sizeof out), 0, "%s", out);
  cr_assert_eq(dir_entries(dir), 3, "tiny.txtpb, tiny.pb, other.pb and nothing else");
  rm_dir(dir);
}

Test(gpuctl, job_encode_syntax_error_names_the_file_and_writes_nothing) {
  char dir[64], src[128], args[512], out[4096];
  job_dir(dir, sizeof dir);
  snprintf(src, sizeof src, "%s/broken.txtpb", dir);
  write_text(src, "name: \"broken\"\nbatch_size: lots\n");
  snprintf(args, sizeof args, "job encode %s", src);
  cr_assert_eq(run_gpuctl(args, out, sizeof out), 1, "%s", out);
  char want[160];
  snprintf(want, sizeof want, "%s:2:13: Expected integer", src);
  cr_assert(strstr(out, want), "protoc's message, naming the file, line and column: %s", out);
  cr_assert(strstr(out, "nothing was written"), "%s", out);
  cr_assert_eq(dir_entries(dir), 1, "no broken.pb and no temporary file are left");
  rm_dir(dir);
}

Test(gpuctl, job_show_round_trips) {
  char dir[64], src[128], args[512], out[8192], again[128];
  job_dir(dir, sizeof dir);
  snprintf(src, sizeof src, "%s/tiny.txtpb", dir);
  write_text(src, small_job);
  snprintf(args, sizeof args, "job encode %s", src);
  cr_assert_eq(run_gpuctl(args, out, sizeof out), 0, "%s", out);
  snprintf(args, sizeof args, "job show %s/tiny.pb", dir);
  cr_assert_eq(run_gpuctl(args, out, sizeof out), 0, "%s", out);
  cr_assert(strstr(out, "name: \"tiny\""), "%s", out);
  cr_assert(strstr(out, "precision: MIXED_FLOAT16"), "%s", out);
  /* what show prints encodes to the same bytes */
  snprintf(again, sizeof again, "%s/again.txtpb", dir);
  write_text(again, out);
  snprintf(args, sizeof args, "job encode %s", again);
  cr_assert_eq(run_gpuctl(args, out, sizeof out), 0, "%s", out);
  snprintf(args, sizeof args, "cmp %s/tiny.pb %s/again.pb", dir, dir);
  cr_assert_eq(system(args), 0, "show then encode gives the same JobSpec bytes");
  /* --json needs no protoc */
  snprintf(args, sizeof args, "--json job show %s/tiny.pb", dir);
  cr_assert_eq(run_gpuctl(args, out, sizeof out), 0, "%s", out);
  cr_assert(strstr(out, "\"batch_size\":16"), "%s", out);
  rm_dir(dir);
}

Test(gpuctl, job_show_refuses_a_truncated_pb) {
  char dir[64], src[128], pb[128], args[512], out[4096];
  job_dir(dir, sizeof dir);
  snprintf(src, sizeof src, "%s/tiny.txtpb", dir);
  snprintf(pb, sizeof pb, "%s/tiny.pb", dir);
  write_text(src, small_job);
  snprintf(args, sizeof args, "job encode %s", src);
  cr_assert_eq(run_gpuctl(args, out, sizeof out), 0, "%s", out);
  cr_assert_eq(truncate(pb, 20), 0);
  snprintf(args, sizeof args, "job show %s", pb);
  cr_assert_eq(run_gpuctl(args, out, sizeof out), 1, "%s", out);
  cr_assert(strstr(out, "is not a binary gpushare.v1.JobSpec"), "%s", out);
  snprintf(args, sizeof args, "job show %s", src);
  cr_assert_eq(run_gpuctl(args, out, sizeof out), 1, "%s", out);
  cr_assert(strstr(out, "it looks like text"), "%s", out);
  rm_dir(dir);
}

Test(gpuctl, job_encode_without_protoc_says_how_to_get_it) {
  char dir[64], src[128], out[4096], cmd[512];
  job_dir(dir, sizeof dir);
  snprintf(src, sizeof src, "%s/tiny.txtpb", dir);
  write_text(src, small_job);
  /* a PATH with no protoc on it */
  snprintf(cmd, sizeof cmd, "PATH=%s %s job encode %s 2>&1", dir, GPUCTL_PATH, src);
  FILE *p = popen(cmd, "r");
  cr_assert_not_null(p);
  size_t got = fread(out, 1, sizeof out - 1, p);
  out[got] = '\0';
  int st = pclose(p);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 1, "%s", out);
  cr_assert(strstr(out, "gpuctl job encode needs protoc (Debian: apt-get install protobuf-compiler)"), "%s", out);
  cr_assert_eq(dir_entries(dir), 1, "nothing written");
  rm_dir(dir);
}

Test(gpuctl, job_help_answers) {
  char out[4096];
  cr_assert_eq(run_gpuctl("job --help", out, sizeof out), 0, "%s", out);
  cr_assert(strstr(out, "job encode JOB.txtpb"), "%s", out);
  cr_assert(strstr(out, "job show JOB.pb"), "%s", out);
  cr_assert_eq(run_gpuctl("job encode --help", out, sizeof out), 0, "%s", out);
  cr_assert(strstr(out, "-o, --output JOB.pb"), "%s", out);
  cr_assert_eq(run_gpuctl("job", out, sizeof out), 2, "%s", out);
}

/* With --json every error is one JSON object on stderr, whatever made it,
 * and the exit status is the one the text form has. */
static int starts(const char *s, const char *prefix) { return !strncmp(s, prefix, strlen(prefix)); }

static int run_gpuctl_stderr(const char *args, char *out, size_t n) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "%s --socket %s %s 2>&1 >/dev/null", GPUCTL_PATH, fake.path, args);
  FILE *p = popen(cmd, "r");
  cr_assert_not_null(p);
  size_t got = fread(out, 1, n - 1, p);
  out[got] = '\0';
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

Test(gpuctl, json_errors_are_one_object_on_stderr) {
  char out[8192];
  fake.mode = REFUSE;
  cr_assert_eq(run_gpuctl_stderr("--json vdev delete nope", out, sizeof out), 1, "%s", out);
  cr_assert_str_eq(out, "{\"error\":{\"code\":\"NOT_FOUND\",\"message\":\"no vdev named \\\"nope\\\"\","
                        "\"field\":\"vdev\"}}\n");
  fake.mode = ECHO;
  cr_assert_eq(run_gpuctl_stderr("vdev create v --tenant t --memory 4XB --json", out, sizeof out), 2, "%s", out);
  cr_assert(starts(out, "{\"error\":{\"code\":\"USAGE\",\"message\":\"--memory: size \\\"4XB\\\""), "%s", out);
  cr_assert(strstr(out, "\"field\":\"vdev create\"}}\n"), "%s", out);
  cr_assert_null(strstr(out, "Try "), "%s", out);
  cr_assert_eq(run_gpuctl_stderr("--json plan /nonexistent/job.pb", out, sizeof out), 1, "%s", out);
  cr_assert(starts(out, "{\"error\":{\"code\":\"LOCAL\",\"message\":\""), "%s", out);
  cr_assert_eq(run_gpuctl_stderr("--json frobnicate", out, sizeof out), 2, "%s", out);
  cr_assert_str_eq(out, "{\"error\":{\"code\":\"USAGE\",\"message\":\"unknown command \\\"frobnicate\\\"\"}}\n");
  /* a watched job that failed: its state as the code, the job (with its
   * OOM report) as detail; no text report */
  cr_assert_eq(run_gpuctl_stderr("--json watch 9", out, sizeof out), 1, "%s", out);
  cr_assert(starts(out, "{\"error\":{\"code\":\"JOB_FAILED\",\"message\":\"job 9 FAILED: out of memory in dense_1 "
                          "(activations)\",\"job\":{\"id\":9,"), "%s", out);
  cr_assert(strstr(out, "\"oom\":{\"layer\":\"dense_1\""), "%s", out);
  cr_assert_eq(strchr(out, '\n') - out + 1, (long)strlen(out), "one line: %s", out);
  /* without --json the same errors are text */
  cr_assert_eq(run_gpuctl_stderr("frobnicate", out, sizeof out), 2, "%s", out);
  cr_assert(starts(out, "gpuctl: unknown command \"frobnicate\"\nTry 'gpuctl --help'.\n"), "%s", out);
}

/* gpuctl watch 9 on a pseudo-terminal of `cols` columns (0: one that
 * reports no size) with COLUMNS=`columns` (NULL: unset); its output in out. */
static void watch_on_pty(int cols, const char *columns, char *out, size_t n) {
  int m = posix_openpt(O_RDWR | O_NOCTTY);
  cr_assert_geq(m, 0);
  cr_assert_eq(grantpt(m), 0);
  cr_assert_eq(unlockpt(m), 0);
  char *name = ptsname(m);
  cr_assert_not_null(name);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    setsid();
    int s = open(name, O_RDWR);
    if (s < 0) _exit(126);
    struct winsize ws = {.ws_row = 24, .ws_col = (unsigned short)cols};
    ioctl(s, TIOCSWINSZ, &ws);
    dup2(s, 1);
    dup2(s, 2);
    if (columns) setenv("COLUMNS", columns, 1);
    else unsetenv("COLUMNS");
    execl(GPUCTL_PATH, GPUCTL_PATH, "--socket", fake.path, "watch", "9", (char *)NULL);
    _exit(127);
  }
  size_t got = 0;
  for (;;) {
    ssize_t k = read(m, out + got, n - 1 - got);
    if (k <= 0) break; /* EIO once the child has closed the terminal */
    got += (size_t)k;
  }
  out[got] = '\0';
  int st;
  waitpid(pid, &st, 0);
  close(m);
}

/* The live line ("\r" LINE "\033[K") as shown: its length. */
static size_t live_len(const char *out) {
  const char *a = strstr(out, "\rjob 9  epoch 1");
  cr_assert_not_null(a, "no live line: %s", out);
  const char *b = strstr(a, "\033[K");
  cr_assert_not_null(b, "%s", out);
  return (size_t)(b - a - 1);
}

Test(gpuctl, watch_live_line_fits_the_terminal) {
  /* the live line is "job 9  epoch 1  step 20/30 (66.7%)  loss 0.5000  1234
   * samples/s  mem 1.00 KiB / 4.00 KiB  scale 1024": 100 characters */
  char out[16384];
  watch_on_pty(200, "50", out, sizeof out);
  cr_assert_eq(live_len(out), 100, "a 200-column terminal shows it whole: %s", out);
  watch_on_pty(60, NULL, out, sizeof out);
  cr_assert_eq(live_len(out), 59, "cut to 60 - 1 columns: %s", out);
  watch_on_pty(0, "70", out, sizeof out);
  cr_assert_eq(live_len(out), 69, "no size: $COLUMNS, 70 - 1: %s", out);
  watch_on_pty(0, NULL, out, sizeof out);
  cr_assert_eq(live_len(out), 79, "no size, no $COLUMNS: 80 - 1: %s", out);
}

Test(gpuctl, list_shows_where_running_jobs_are) {
  char out[4096];
  cr_assert_eq(run_gpuctl("list", out, sizeof out), 0, "%s", out);
  cr_assert(strstr(out, "PROGRESS"), "%s", out);
  cr_assert(strstr(out, "RUNNING  starting"), "no step yet: starting, not 0: %s", out);
  cr_assert(strstr(out, "RUNNING  epoch 3, step 250/1000 (25.0%)"), "%s", out);
}

Test(gpuctl, usage_error_exits_2_without_connecting) {
  char out[4096];
  /* the scripted daemon would answer anything: a usage error must not get there */
  cr_assert_eq(run_gpuctl("vdev create v --tenant t --memory 4XB", out, sizeof out), 2, "%s", out);
  cr_assert(strstr(out, "--memory: size \"4XB\" has an unknown suffix"), "%s", out);
  cr_assert_eq(run_gpuctl("status 12x", out, sizeof out), 2, "%s", out);
}

Test(gpuctl, submit_uploads_local_idx_and_rewrites_to_sha256) {
  char data_path[128], job_path[128];
  snprintf(data_path, sizeof data_path, "/tmp/gs-test-images-%d.idx", (int)getpid());
  snprintf(job_path, sizeof job_path, "/tmp/gs-test-job-%d.pb", (int)getpid());
  const char *bytes = "not really idx, but bytes to upload";
  write_file(data_path, (const uint8_t *)bytes, strlen(bytes));
  char want[65];
  hex_of(bytes, strlen(bytes), want);

  Gpushare__V1__JobSpec spec = GPUSHARE__V1__JOB_SPEC__INIT;
  Gpushare__V1__Dataset train = GPUSHARE__V1__DATASET__INIT;
  Gpushare__V1__IdxFiles idx = GPUSHARE__V1__IDX_FILES__INIT;
  idx.images = data_path;
  idx.labels = "sha256:0123";
  train.source_case = GPUSHARE__V1__DATASET__SOURCE_IDX;
  train.idx = &idx;
  spec.train = &train;
  size_t n = gpushare__v1__job_spec__get_packed_size(&spec);
  uint8_t *buf = malloc(n);
  gpushare__v1__job_spec__pack(&spec, buf);
  write_file(job_path, buf, n);
  free(buf);

  char args[300], out[4096];
  snprintf(args, sizeof args, "submit %s", job_path);
  cr_assert_eq(run_gpuctl(args, out, sizeof out), 0, "%s", out);
  cr_assert(strstr(out, "job 42 submitted: vdev small"), "%s", out);
  cr_assert_str_eq(fake.up_name, strrchr(data_path, '/') + 1);
  cr_assert_str_eq(fake.up_sha, want);
  char ref[80];
  snprintf(ref, sizeof ref, "sha256:%s", want);
  cr_assert_str_eq(fake.images, ref);
  cr_assert_str_eq(fake.labels, "sha256:0123", "a store reference is sent as it is");
  unlink(data_path);
  unlink(job_path);
}

Test(gpuctl, submit_sends_store_names_as_they_are) {
  char job_path[128];
  snprintf(job_path, sizeof job_path, "/tmp/gs-test-job-names-%d.pb", (int)getpid());
  Gpushare__V1__JobSpec spec = GPUSHARE__V1__JOB_SPEC__INIT;
  Gpushare__V1__Dataset train = GPUSHARE__V1__DATASET__INIT;
  Gpushare__V1__IdxFiles idx = GPUSHARE__V1__IDX_FILES__INIT;
  idx.images = "fashion-train-images-no-such-file";
  idx.labels = "fashion-train-labels-no-such-file";
  train.source_case = GPUSHARE__V1__DATASET__SOURCE_IDX;
  train.idx = &idx;
  spec.train = &train;
  size_t n = gpushare__v1__job_spec__get_packed_size(&spec);
  uint8_t *buf = malloc(n);
  gpushare__v1__job_spec__pack(&spec, buf);
  write_file(job_path, buf, n);
  free(buf);
  char args[300], out[4096];
  snprintf(args, sizeof args, "submit %s", job_path);
  cr_assert_eq(run_gpuctl(args, out, sizeof out), 0, "%s", out);
  cr_assert_str_eq(fake.images, "fashion-train-images-no-such-file", "a name that is no file is a store name");
  cr_assert_str_eq(fake.labels, "fashion-train-labels-no-such-file");
  cr_assert_eq(fake.chunks, 0, "nothing uploaded");
  unlink(job_path);
}
