/*
 * test_cuda_ops.c: every op of the CUDA backend against the CPU backend,
 * for fp32, fp16 and bf16 storage (the cases and their tolerances are in
 * tests/gpu/gpu_cases.c, shared with the GPU machine's own harness).
 *
 * Where the plugin was not built, or no driver or GPU answers (CI), each
 * test is skipped with the loader's reason, so the report says why nothing
 * ran; on a machine with a GPU they run and must pass.
 */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "tests/gpu/gpu_cases.h"

static gs_gpu_env ENV;

static void setup(void) {
  /* the build tree's plugin, when CMake built one (see kernels/CMakeLists.txt) */
  const char *built = getenv("GS_TEST_CUDA_PLUGIN");
  if (built && built[0] && !getenv("GS_CUDA_PLUGIN"))
    setenv("GS_CUDA_PLUGIN", built, 1);
  if (gs_gpu_env_open(&ENV) != 0)
    cr_skip_test("no CUDA device: %s", ENV.why);
}

static void teardown(void) { gs_gpu_env_close(&ENV); }

TestSuite(cuda_ops, .init = setup, .fini = teardown);

static void run(const char *name, bool per_dtype) {
  const gs_dtype all[3] = {GS_F32, GS_F16, GS_BF16};
  for (int i = 0; i < (per_dtype ? 3 : 1); i++) {
    char msg[512];
    int rc = gs_gpu_run(&ENV, name, all[i], msg, sizeof msg);
    cr_expect_eq(rc, 0, "%s (%s): %d: %s", name, gs_dtype_name(all[i]), rc, msg);
  }
}

Test(cuda_ops, dense) { run("dense", true); }
Test(cuda_ops, conv2d) { run("conv2d", true); }
Test(cuda_ops, depthwise) { run("depthwise", true); }
Test(cuda_ops, maxpool) { run("maxpool", true); }
Test(cuda_ops, gap) { run("gap", true); }
Test(cuda_ops, relu) { run("relu", true); }
Test(cuda_ops, xent) { run("xent", false); }
Test(cuda_ops, cast) { run("cast", false); }
Test(cuda_ops, cast_overlap) { run("cast_overlap", true); }
Test(cuda_ops, unscale_check) { run("unscale_check", false); }
Test(cuda_ops, loss_scale_update) { run("loss_scale_update", false); }
Test(cuda_ops, sgd) { run("sgd", false); }
Test(cuda_ops, adam) { run("adam", false); }
Test(cuda_ops, mlp_trajectory) { run("mlp_trajectory", true); }
/* normalisation and element-wise ops */
Test(cuda_ops, add) { run("add", true); }
Test(cuda_ops, embedding) { run("embedding", true); }
Test(cuda_ops, posembed) { run("posembed", true); }
Test(cuda_ops, attention) { run("attention", true); }
Test(cuda_ops, batchnorm) { run("batchnorm", true); }
Test(cuda_ops, layernorm) { run("layernorm", true); }
Test(cuda_ops, gelu) { run("gelu", true); }
Test(cuda_ops, dropout) { run("dropout", true); }
Test(cuda_ops, avgpool) { run("avgpool", true); }
