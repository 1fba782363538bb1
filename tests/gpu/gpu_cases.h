/*
 * gpu_cases.h: the CUDA backend against the CPU backend, op by op, as
 * functions that any harness can run: tests/unit/test_cuda_ops.c (Criterion,
 * in CI, where each test skips without a device) and tests/gpu/gpu_tests.c
 * (a plain main for the GPU machine, which has no Criterion).
 *
 * A case runs one op on both backends on the same inputs (exactly
 * representable in the storage type) and compares every output element
 * within abs + |ref| * rel, the pair stated per op in gpu_cases.c. It
 * returns 0 when all agree, the number of disagreeing elements otherwise
 * (msg then names the first: op, dtype, tensor, index, both values, the
 * tolerance), or a negative value when a backend call failed.
 */
#ifndef GS_TESTS_GPU_CASES_H
#define GS_TESTS_GPU_CASES_H

#include <stdbool.h>
#include <stddef.h>

#include "kernels/backend.h"

typedef struct gs_gpu_env {
  gs_backend *cpu, *gpu; /* the reference and the backend under test */
  gs_exec *cex, *gex;    /* one exec on each */
  char why[512];         /* why gs_gpu_env_open found no GPU */
} gs_gpu_env;

/* Load the CUDA plugin and make an exec on GPU 0 and on the CPU. 0, or
 * -ENODEV with env->why saying why there is no device. */
int gs_gpu_env_open(gs_gpu_env *env);
void gs_gpu_env_close(gs_gpu_env *env);

typedef int (*gs_gpu_case_fn)(gs_gpu_env *env, gs_dtype dt, char *msg, size_t len);

typedef struct gs_gpu_case {
  const char *name;  /* "dense", "conv2d", ... */
  gs_gpu_case_fn fn;
  bool per_dtype;    /* run for fp32, fp16 and bf16 (else once, dt ignored) */
} gs_gpu_case;

extern const gs_gpu_case gs_gpu_cases[];
extern const size_t gs_gpu_ncases;

/* Run the case named `name` for dt; as a case function. */
int gs_gpu_run(gs_gpu_env *env, const char *name, gs_dtype dt, char *msg, size_t len);

/* The hand-built MLP training loop of the trajectory case, on any backend:
 * `steps` SGD steps of in (64, 96) -> dense 128 -> relu -> dense 10 -> softmax
 * cross-entropy on a fixed synthetic batch, weights fp32 masters cast to dt
 * each step (fp16 with dynamic loss scaling: unscale, skip, update). Device
 * memory comes from alloc(u, bytes) (one block, freed by the caller); losses
 * gets the mean loss of each step. 0 or a negative error. */
typedef void *(*gs_gpu_alloc_fn)(void *u, size_t bytes);
int gs_gpu_mlp_train(gs_backend *b, gs_exec *ex, gs_dtype dt, int steps, gs_gpu_alloc_fn alloc,
                     void *u, float *losses);
/* Bytes gs_gpu_mlp_train asks alloc for on b in dt. */
size_t gs_gpu_mlp_bytes(gs_backend *b, gs_dtype dt);

#endif
