/*
 * test_plan_backend.c: the planner takes its sizes from the backend it is
 * given, and the control plane gives it the backend of the vdev's device.
 *
 * A stub backend is the cpu backend with other workspace queries (odd sizes
 * no constant of the runtime could produce): the plan's workspace follows
 * them byte for byte, and a job created and stepped on the stub holds, role
 * by role, what the stub's plan says. Then the CUDA plugin's size table
 * (kernels/cuda_sizes.h), which the control plane plans GPU vdevs with,
 * answers cuBLASLt's workspace by compute capability, and admission
 * (control/admit.c) refuses on a gpu vdev what the same limit admits on the
 * cpu device, because the GPU plan holds that workspace.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "control/admit.h"
#include "convert/spec_pb.h"
#include "kernels/cuda_plan.h"
#include "kernels/cuda_sizes.h"
#include "runtime/alloc.h"
#include "runtime/data.h"
#include "runtime/plan.h"
#include "runtime/train.h"

static gs_err e;
static void setup(void) { gs_err_clear(&e); }
TestSuite(plan_backend, .init = setup, .timeout = 600);

/* ---- a stub backend: the cpu's ops, workspace sizes of our choosing ---- */

static size_t stub_ws = 0; /* what every workspace query of the stub answers */
static size_t stub_dense(gs_dtype dt, uint32_t n, uint32_t c, uint32_t oc) {
  (void)dt, (void)n, (void)c, (void)oc;
  return stub_ws;
}
static size_t stub_window(gs_dtype dt, const gs_conv_shape *s) {
  (void)dt, (void)s;
  return stub_ws;
}
static gs_backend stub_backend(void) {
  gs_backend b = *gs_backend_cpu();
  b.name = "stub";
  b.dense_workspace = stub_dense;
  b.conv2d_workspace = stub_window;
  b.depthwise_workspace = stub_window;
  return b;
}

static Gpushare__V1__JobSpec *load_pb(const char *name) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s.pb", GS_EXAMPLES_PB_DIR, name);
  FILE *f = fopen(path, "rb");
  cr_assert_not_null(f, "%s is missing: the build encodes the examples (target gs_examples)",
                     path);
  static uint8_t buf[1 << 16];
  size_t n = fread(buf, 1, sizeof buf, f);
  fclose(f);
  Gpushare__V1__JobSpec *pb = gpushare__v1__job_spec__unpack(NULL, n, buf);
  cr_assert_not_null(pb, "%s does not decode as a JobSpec", path);
  return pb;
}

static uint64_t plan_ws(const gs_job_spec *s, const gs_backend *b, uint64_t *peak) {
  gs_plan p;
  cr_assert_eq(gs_plan_job(s, b, &p, &e), 0, "plan: %s", e.msg);
  uint64_t ws = p.by_role[GS_ROLE_WORKSPACE];
  *peak = p.peak_bytes;
  gs_plan_free(&p);
  return ws;
}

Test(plan_backend, workspace_comes_from_the_backend) {
  Gpushare__V1__JobSpec *pb = load_pb("fashion-cnn");
  gs_job_spec s;
  cr_assert_eq(gs_spec_pb_job(pb, &s, &e), 0, "%s", e.msg);
  gs_backend b = stub_backend();
  /* Two sizes past anything the cpu backend asks for this model, neither a
   * multiple of the allocator's 256 bytes. */
  const size_t small = ((size_t)3 << 20) + 4097, large = ((size_t)7 << 20) + 1;
  uint64_t peak_s, peak_l;
  stub_ws = small;
  uint64_t ws_s = plan_ws(&s, &b, &peak_s);
  stub_ws = large;
  uint64_t ws_l = plan_ws(&s, &b, &peak_l);
  uint64_t grow = gs_alloc_block_size(large) - gs_alloc_block_size(small);
  cr_expect_eq(ws_l - ws_s, grow,
               "the plan's workspace grew by %llu bytes, the backend's query by %llu",
               (unsigned long long)(ws_l - ws_s), (unsigned long long)grow);
  cr_expect_geq(peak_l - peak_s, grow / 2, "the peak follows the workspace");
  gs_spec_pb_job_free(&s);
  gpushare__v1__job_spec__free_unpacked(pb, NULL);
}

typedef struct role_sum {
  uint64_t by_role[GS_ROLE_COUNT];
} role_sum;
static void sum_tag(void *u, const char *layer, gs_role role, uint64_t bytes) {
  (void)layer;
  ((role_sum *)u)->by_role[role] += bytes;
}

Test(plan_backend, a_job_on_the_stub_holds_the_stub_plan) {
  Gpushare__V1__JobSpec *pb = load_pb("fashion-mlp");
  gs_job_spec s;
  cr_assert_eq(gs_spec_pb_job(pb, &s, &e), 0, "%s", e.msg);
  gs_backend b = stub_backend();
  stub_ws = ((size_t)5 << 20) + 777;
  gs_plan p;
  cr_assert_eq(gs_plan_job(&s, &b, &p, &e), 0, "%s", e.msg);
  gs_dataset tr;
  uint64_t eff = (uint64_t)p.micro_batch * p.accumulation_steps;
  cr_assert_eq(gs_dataset_synthetic(2 * eff, s.input.height, s.input.width, s.input.channels,
                                    s.layers[s.n_layers - 1].units, 5, &tr, &e),
               0, "%s", e.msg);
  gs_alloc *a;
  cr_assert_eq(gs_alloc_create(&b, 0, 4ull << 30, GS_POLICY_GROWTH, &a), 0);
  gs_train *t;
  gs_train_failure f;
  gs_train_options o = {.threads = 1};
  cr_assert_eq(gs_train_create(&s, &b, a, &tr, NULL, &o, &t, &f, &e), 0, "%s", e.msg);
  role_sum rs = {0};
  gs_alloc_foreach_tag(a, sum_tag, &rs);
  for (int r = 0; r < GS_ROLE_COUNT; r++)
    cr_expect_eq(rs.by_role[r], p.by_role[r], "role %s: allocator holds %llu, plan says %llu",
                 gs_role_name((gs_role)r), (unsigned long long)rs.by_role[r],
                 (unsigned long long)p.by_role[r]);
  bool done;
  cr_assert_eq(gs_train_steps(t, 1, &done, &e), 0, "%s", e.msg);
  gs_train_result res;
  gs_train_result_get(t, &res);
  cr_expect_eq(res.peak_memory_bytes, p.peak_bytes, "measured %llu, planned %llu",
               (unsigned long long)res.peak_memory_bytes, (unsigned long long)p.peak_bytes);
  gs_train_destroy(t);
  gs_alloc_destroy(a);
  gs_dataset_free(&tr);
  gs_plan_free(&p);
  gs_spec_pb_job_free(&s);
  gpushare__v1__job_spec__free_unpacked(pb, NULL);
}

/* ---- the CUDA plugin's sizes, as the control plane plans with them ---- */

Test(plan_backend, cuda_sizes_follow_the_compute_capability) {
  cr_expect_eq(gs_cuda_lt_workspace_for(8), (size_t)4 << 20);
  cr_expect_eq(gs_cuda_lt_workspace_for(9), (size_t)32 << 20);
  cr_expect_eq(gs_cuda_lt_workspace_for(10), (size_t)32 << 20);
  const gs_backend *h = gs_backend_cuda_sizes(9), *a = gs_backend_cuda_sizes(8);
  cr_expect_str_eq(h->name, "cuda");
  cr_expect(!h->host_memory);
  cr_expect_eq(h->dense_workspace(GS_BF16, 8192, 8192, 8192), (size_t)32 << 20);
  cr_expect_eq(a->dense_workspace(GS_F32, 7, 13, 5), (size_t)4 << 20);
  /* conv2d: cuBLASLt's, then one chunk of fp32 im2col rows; 3x3 SAME on
   * 28x28x1, 13 images: 13 * 784 * 9 * 4 bytes after the 32 MiB. */
  gs_conv_shape cs = {.n = 13, .h = 28, .w = 28, .c = 1, .kh = 3, .kw = 3, .stride = 1,
                      .same = true, .f = 7};
  gs_conv_shape_init(&cs);
  cr_expect_eq(h->conv2d_workspace(GS_F32, &cs), ((size_t)32 << 20) + (size_t)13 * 784 * 9 * 4);
  /* a 1x1 stride-1 conv multiplies the input itself */
  gs_conv_shape pw = {.n = 13, .h = 7, .w = 7, .c = 5, .kh = 1, .kw = 1, .stride = 1,
                      .same = true, .f = 3};
  gs_conv_shape_init(&pw);
  cr_expect_eq(h->conv2d_workspace(GS_BF16, &pw), (size_t)32 << 20);
  /* depthwise: its weight gradient's partial sums, 13 * 784 positions in
   * 80 chunks of 128, 9 taps and the bias, 1 channel; none in one chunk */
  cr_expect_eq(gs_cuda_depthwise_chunks(&cs), 80);
  cr_expect_eq(h->depthwise_workspace(GS_F16, &cs), (size_t)80 * 10 * 1 * 4);
  gs_conv_shape one = cs;
  one.n = 1, one.h = one.w = 8;
  gs_conv_shape_init(&one);
  cr_expect_eq(h->depthwise_workspace(GS_F16, &one), 0);
}

static void devices_with_gpu(gs_devices *ds, const char *cc) {
  memset(ds, 0, sizeof *ds);
  snprintf(ds->dev[0].name, sizeof ds->dev[0].name, "cpu");
  snprintf(ds->dev[0].kind, sizeof ds->dev[0].kind, "cpu");
  snprintf(ds->dev[1].name, sizeof ds->dev[1].name, "gpu0");
  snprintf(ds->dev[1].kind, sizeof ds->dev[1].kind, "cuda");
  snprintf(ds->dev[1].compute_capability, sizeof ds->dev[1].compute_capability, "%s", cc);
  ds->n = 2;
}

Test(plan_backend, the_control_plane_plans_a_gpu_vdev_with_cuda_sizes) {
  gs_devices ds;
  devices_with_gpu(&ds, "9.0");
  cr_expect_eq(gs_admit_backend(&ds, "cpu"), gs_backend_cpu());
  cr_expect_eq(gs_admit_backend(&ds, "gpu0"), gs_backend_cuda_sizes(9));
  cr_expect_eq(gs_admit_backend(&ds, "gpu7"), gs_backend_cpu(), "an unknown device plans as cpu");
  devices_with_gpu(&ds, "8.6");
  cr_expect_eq(gs_admit_backend(&ds, "gpu0"), gs_backend_cuda_sizes(8));

  /* The MLP's cpu plan fits a limit 8 MiB above it; on a Hopper GPU the
   * plan holds 32 MiB of cuBLASLt workspace and is refused there. */
  devices_with_gpu(&ds, "9.0");
  Gpushare__V1__JobSpec *pb = load_pb("fashion-mlp");
  gs_job_spec s;
  cr_assert_eq(gs_spec_pb_job(pb, &s, &e), 0, "%s", e.msg);
  uint64_t cpu_peak, gpu_peak;
  plan_ws(&s, gs_backend_cpu(), &cpu_peak);
  plan_ws(&s, gs_backend_cuda_sizes(9), &gpu_peak);
  cr_assert_gt(gpu_peak, cpu_peak + (8u << 20), "cpu %llu, gpu %llu",
               (unsigned long long)cpu_peak, (unsigned long long)gpu_peak);
  gs_spec_pb_job_free(&s);
  gs_vdev v;
  memset(&v, 0, sizeof v);
  snprintf(v.name, sizeof v.name, "v");
  snprintf(v.tenant, sizeof v.tenant, "t");
  v.memory_limit = cpu_peak + (8u << 20);
  v.policy = GS_POLICY_PREALLOCATE;
  v.compute_share = 50;
  gs_admit adm;
  gs_call_arena ar = {0};
  snprintf(v.device, sizeof v.device, "cpu");
  cr_assert_eq(gs_admit_job(&ds, &ar, pb, &v, 0, &adm, &e), 0, "%s", e.msg);
  cr_expect(adm.fits, "cpu vdev: %s", adm.why);
  cr_expect_eq(adm.peak_bytes, cpu_peak);
  snprintf(v.device, sizeof v.device, "gpu0");
  cr_assert_eq(gs_admit_job(&ds, &ar, pb, &v, 0, &adm, &e), 0, "%s", e.msg);
  cr_expect(!adm.fits, "a gpu vdev holds cuBLASLt's workspace too");
  cr_expect_eq(adm.peak_bytes, gpu_peak);
  /* least peak on the gpu includes the workspace as well */
  uint64_t least_cpu, least_gpu;
  cr_assert_eq(gs_admit_least_peak(&ds, "cpu", pb, 32, 1, &least_cpu, &e), 0, "%s", e.msg);
  cr_assert_eq(gs_admit_least_peak(&ds, "gpu0", pb, 32, 1, &least_gpu, &e), 0, "%s", e.msg);
  cr_expect_gt(least_gpu, least_cpu + (8u << 20));
  gs_call_arena_free(&ar);
  gpushare__v1__job_spec__free_unpacked(pb, NULL);
}
