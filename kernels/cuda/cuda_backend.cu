/*
 * cuda_backend.cu: the `cuda` device of gpushare: opening the plugin,
 * memory, execs, copies, and the table that ties the ops (cuda_gemm.cu,
 * cuda_ops.cu, cuda_norm.cu) to the contract in backend.h.
 *
 * Opening. gs_cuda_backend_open asks the runtime for the device count; no
 * driver (cudaErrorInsufficientDriver, cudaErrorNoDevice, a stub libcuda)
 * answers NULL with CUDA's reason, so a machine without a GPU falls back to
 * the cpu backend. It also fixes the cuBLASLt workspace every GEMM op asks
 * for in its *_workspace query: 32 MiB when any device is Hopper (sm_90) or
 * newer, as NVIDIA recommends there, 4 MiB otherwise.
 *
 * Memory. A region is a plain cudaMalloc (never managed memory, which can
 * hang a GPU when oversubscribed), released with cudaFree. cudaMalloc
 * returns 256-byte aligned pointers, which the vdev allocator requires.
 * device_memory is cudaMemGetInfo on that device.
 *
 * Execs. One job = one non-blocking stream + one cuBLASLt handle + a small
 * cache of matmul plans. Every op of the job is queued on that stream, so
 * ops return before they finish; synchronize is cudaStreamSynchronize, and
 * its return value carries any fault of the job's kernels.
 *
 * Copies. copy_in/copy_out are cudaMemcpyAsync on the job's stream. Host
 * buffers may be pageable (the runtime's batch buffers are plain malloc):
 * then CUDA stages them, a host-to-device copy has taken its bytes from the
 * host buffer when the call returns, and a device-to-host copy into
 * pageable memory returns once the bytes are there. Callers must still call
 * synchronize before reading what copy_out wrote (the training runtime
 * does): with pinned buffers the copy would be truly asynchronous.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <atomic>
#include <new>

#include "kernels/cuda/cuda_internal.h"
#include "kernels/loader.h"

#define GS_CUDA_EXPORT extern "C" __attribute__((visibility("default")))

size_t gs_cuda_lt_workspace = (size_t)4 << 20;

/* ---- the checker ---- */

/* Set once a sticky error was seen: the context is gone for this process. */
static std::atomic<bool> cuda_lost{false};

/* The errors CUDA documents as leaving "the process in an inconsistent
 * state": every later CUDA call of the process returns the same error, and
 * only a new process gets a working context. A kernel fault raises no
 * signal, so without this the executor would live on with a dead context:
 * every job's next call failing, every later job failing at its first
 * allocation. */
static bool sticky(cudaError_t e) {
  switch (e) {
  case cudaErrorIllegalAddress:
  case cudaErrorLaunchFailure:
  case cudaErrorLaunchTimeout:
  case cudaErrorHardwareStackError:
  case cudaErrorIllegalInstruction:
  case cudaErrorMisalignedAddress:
  case cudaErrorInvalidAddressSpace:
  case cudaErrorInvalidPc:
  case cudaErrorAssert:
  case cudaErrorECCUncorrectable:
  case cudaErrorContextIsDestroyed:
    return true;
  default:
    return false;
  }
}

bool gs_cuda_device_lost(void) { return cuda_lost.load(std::memory_order_relaxed); }

int gs_cuda_check(cudaError_t e, const char *what, const char *file, int line) {
  if (e == cudaSuccess)
    return 0;
  /* A failed call is also the thread's "last error" until someone reads it;
   * left there, the next GS_LAUNCHED would blame a kernel that launched
   * fine. Read it off here (a sticky fault stays: every later call fails). */
  (void)cudaGetLastError();
  bool lost = sticky(e);
  if (lost && !cuda_lost.exchange(true))
    fprintf(stderr, "gpushare cuda: the device is lost (%s): the process must end\n",
            cudaGetErrorName(e));
  fprintf(stderr, "gpushare cuda: %s:%d: %s: %s (%s)\n", file, line, what, cudaGetErrorName(e),
          cudaGetErrorString(e));
  if (lost)
    return -ENOTRECOVERABLE;
  return e == cudaErrorMemoryAllocation ? -ENOMEM : -EIO;
}

int gs_cuda_check_lt(cublasStatus_t s, const char *what, const char *file, int line) {
  if (s == CUBLAS_STATUS_SUCCESS)
    return 0;
  fprintf(stderr, "gpushare cuda: %s:%d: %s: %s (%s)\n", file, line, what,
          cublasLtGetStatusName(s), cublasLtGetStatusString(s));
  /* cuBLASLt reports a dead context as its own failure; the runtime's
   * error says which. */
  cudaError_t ce = cudaGetLastError();
  if (ce != cudaSuccess && sticky(ce))
    return gs_cuda_check(ce, what, file, line);
  if (s == CUBLAS_STATUS_ALLOC_FAILED)
    return -ENOMEM;
  if (s == CUBLAS_STATUS_NOT_SUPPORTED)
    return -ENOTSUP;
  return -EIO;
}

int gs_cuda_enter(gs_exec *ex) {
  if (gs_cuda_device_lost())
    return -ENOTRECOVERABLE; /* nothing more runs in this process */
  int cur = -1;
  cudaError_t e = cudaGetDevice(&cur);
  if (e == cudaSuccess && cur == ex->device)
    return 0;
  if (e != cudaSuccess)
    (void)cudaGetLastError(); /* cudaSetDevice below says what is wrong */
  return GS_CU(cudaSetDevice(ex->device));
}

static int cuda_set_device(int device_index) {
  if (gs_cuda_device_lost())
    return -ENOTRECOVERABLE;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError(); /* not a kernel's error: keep GS_LAUNCHED clean */
    return -ENODEV;
  }
  if (device_index < 0 || device_index >= count)
    return -ENODEV;
  return GS_CU(cudaSetDevice(device_index));
}

/* ---- device and memory ---- */

static int cuda_device_memory(gs_backend *b, int device_index, uint64_t *total,
                              uint64_t *free_bytes) {
  (void)b;
  int rc = cuda_set_device(device_index);
  if (rc)
    return rc;
  size_t fr = 0, tot = 0;
  if ((rc = GS_CU(cudaMemGetInfo(&fr, &tot))))
    return rc;
  if (total)
    *total = tot;
  if (free_bytes)
    *free_bytes = fr;
  return 0;
}

static int cuda_region_reserve(gs_backend *b, int device_index, size_t bytes, void **region) {
  (void)b;
  if (bytes == 0)
    return -EINVAL;
  int rc = cuda_set_device(device_index);
  if (rc)
    return rc;
  void *p = NULL;
  cudaError_t e = cudaMalloc(&p, bytes);
  if (e == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError(); /* not sticky: clear it so the job's next check is clean */
    return -ENOMEM;
  }
  if ((rc = GS_CU(e)))
    return rc;
  *region = p;
  return 0;
}

static void cuda_region_release(gs_backend *b, int device_index, void *region, size_t bytes) {
  (void)b;
  (void)bytes;
  if (!region || cuda_set_device(device_index))
    return;
  (void)GS_CU(cudaFree(region)); /* a failure is logged; nothing else to do */
}

/* ---- execs ---- */

static void cuda_exec_destroy(gs_exec *ex) {
  if (!ex)
    return;
  if (gs_cuda_enter(ex) == 0) {
    if (ex->stream)
      (void)GS_CU(cudaStreamSynchronize(ex->stream));
    gs_cuda_plans_clear(ex);
    if (ex->t0)
      (void)GS_CU(cudaEventDestroy(ex->t0));
    if (ex->t1)
      (void)GS_CU(cudaEventDestroy(ex->t1));
    if (ex->lt)
      (void)GS_LT(cublasLtDestroy(ex->lt));
    if (ex->stream)
      (void)GS_CU(cudaStreamDestroy(ex->stream));
  }
  delete ex;
}

static int cuda_exec_create(gs_backend *b, const gs_exec_config *cfg, gs_exec **out) {
  (void)b;
  if (!cfg)
    return -EINVAL;
  int rc = cuda_set_device(cfg->device_index);
  if (rc)
    return rc;
  gs_exec *ex = new (std::nothrow) gs_exec();
  if (!ex)
    return -ENOMEM;
  memset(ex->plans, 0, sizeof ex->plans);
  ex->device = cfg->device_index;
  ex->stream = NULL;
  ex->lt = NULL;
  ex->t0 = ex->t1 = NULL;
  if ((rc = GS_CU(cudaStreamCreateWithFlags(&ex->stream, cudaStreamNonBlocking))))
    goto fail;
  if ((rc = GS_CU(cudaEventCreate(&ex->t0))) || (rc = GS_CU(cudaEventCreate(&ex->t1))))
    goto fail;
  if ((rc = GS_LT(cublasLtCreate(&ex->lt))))
    goto fail;
  *out = ex;
  return 0;
fail:
  cuda_exec_destroy(ex); /* destroys what was made so far */
  return rc;
}

static int cuda_synchronize(gs_exec *ex) {
  int rc = gs_cuda_enter(ex);
  return rc ? rc : GS_CU(cudaStreamSynchronize(ex->stream));
}

/* Device time between two events on the job's stream: what the scheduler
 * charges a step, whatever the host thread did meanwhile. */
static int cuda_timer_start(gs_exec *ex) {
  int rc = gs_cuda_enter(ex);
  return rc ? rc : GS_CU(cudaEventRecord(ex->t0, ex->stream));
}

static int cuda_timer_stop(gs_exec *ex, double *seconds) {
  *seconds = 0;
  int rc = gs_cuda_enter(ex);
  if (rc || (rc = GS_CU(cudaEventRecord(ex->t1, ex->stream))) ||
      (rc = GS_CU(cudaEventSynchronize(ex->t1))))
    return rc;
  float ms = 0;
  if ((rc = GS_CU(cudaEventElapsedTime(&ms, ex->t0, ex->t1))))
    return rc;
  *seconds = ms > 0 ? ms * 1e-3 : 0;
  return 0;
}

static int cuda_copy_in(gs_exec *ex, void *dst, const void *src, size_t bytes) {
  int rc = gs_cuda_enter(ex);
  if (rc || !bytes)
    return rc;
  return GS_CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, ex->stream));
}

static int cuda_copy_out(gs_exec *ex, void *dst, const void *src, size_t bytes) {
  int rc = gs_cuda_enter(ex);
  if (rc || !bytes)
    return rc;
  return GS_CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, ex->stream));
}

static int cuda_copy(gs_exec *ex, void *dst, const void *src, size_t bytes) {
  int rc = gs_cuda_enter(ex);
  if (rc || !bytes)
    return rc;
  return GS_CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, ex->stream));
}

static int cuda_zero(gs_exec *ex, void *dst, size_t bytes) {
  int rc = gs_cuda_enter(ex);
  if (rc || !bytes)
    return rc;
  return GS_CU(cudaMemsetAsync(dst, 0, bytes, ex->stream));
}

static int cuda_copy_2d(gs_exec *ex, void *dst, size_t dpitch, const void *src, size_t spitch,
                        size_t width, size_t rows) {
  int rc = gs_cuda_enter(ex);
  if (rc || !width || !rows)
    return rc;
  return GS_CU(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows,
                                 cudaMemcpyDeviceToDevice, ex->stream));
}

/* ---- the table ---- */

static gs_backend cuda_backend = {
    /* .name = */ "cuda",
    /* .impl = */ NULL,
    /* .device_memory = */ cuda_device_memory,
    /* .region_reserve = */ cuda_region_reserve,
    /* .region_release = */ cuda_region_release,
    /* .exec_create = */ cuda_exec_create,
    /* .exec_destroy = */ cuda_exec_destroy,
    /* .synchronize = */ cuda_synchronize,
    /* .timer_start = */ cuda_timer_start,
    /* .timer_stop = */ cuda_timer_stop,
    /* .copy_in = */ cuda_copy_in,
    /* .copy_out = */ cuda_copy_out,
    /* .copy = */ cuda_copy,
    /* .zero = */ cuda_zero,
    /* .dense_workspace = */ gs_cuda_dense_workspace,
    /* .dense_forward = */ gs_cuda_dense_forward,
    /* .dense_backward = */ gs_cuda_dense_backward,
    /* .conv2d_workspace = */ gs_cuda_conv2d_workspace,
    /* .conv2d_forward = */ gs_cuda_conv2d_forward,
    /* .conv2d_backward = */ gs_cuda_conv2d_backward,
    /* .depthwise_workspace = */ gs_cuda_depthwise_workspace,
    /* .depthwise_forward = */ gs_cuda_depthwise_forward,
    /* .depthwise_backward = */ gs_cuda_depthwise_backward,
    /* .maxpool_forward = */ gs_cuda_maxpool_forward,
    /* .maxpool_backward = */ gs_cuda_maxpool_backward,
    /* .gap_forward = */ gs_cuda_gap_forward,
    /* .gap_backward = */ gs_cuda_gap_backward,
    /* .relu_forward = */ gs_cuda_relu_forward,
    /* .relu_backward = */ gs_cuda_relu_backward,
    /* .xent_forward_backward = */ gs_cuda_xent,
    /* .cast = */ gs_cuda_cast,
    /* .unscale_check = */ gs_cuda_unscale_check,
    /* .loss_scale_update = */ gs_cuda_loss_scale_update,
    /* .sgd_step = */ gs_cuda_sgd_step,
    /* .adam_step = */ gs_cuda_adam_step,
    /* .host_memory = */ false, /* device memory: the runtime stages batches through copy_in */
    /* .host_parallel = */ NULL, /* no host threads of its own: the gather runs on the caller's */
    /* normalisation and element-wise ops (cuda_norm.cu) */
    /* .add_forward = */ gs_cuda_add_forward,
    /* .accumulate = */ gs_cuda_accumulate,
    /* .batchnorm_workspace = */ gs_cuda_batchnorm_workspace,
    /* .batchnorm_forward = */ gs_cuda_batchnorm_forward,
    /* .batchnorm_backward = */ gs_cuda_batchnorm_backward,
    /* .layernorm_forward = */ gs_cuda_layernorm_forward,
    /* .layernorm_workspace = */ gs_cuda_layernorm_workspace,
    /* .layernorm_backward = */ gs_cuda_layernorm_backward,
    /* .gelu_forward = */ gs_cuda_gelu_forward,
    /* .gelu_backward = */ gs_cuda_gelu_backward,
    /* .dropout_forward = */ gs_cuda_dropout_forward,
    /* .dropout_backward = */ gs_cuda_dropout_backward,
    /* .avgpool_forward = */ gs_cuda_avgpool_forward,
    /* .avgpool_backward = */ gs_cuda_avgpool_backward,
    /* the layer graph */
    /* .copy_2d = */ cuda_copy_2d,
    /* transformer ops (cuda_attn.cu) */
    /* .embedding_forward = */ gs_cuda_embedding_forward,
    /* .embedding_backward = */ gs_cuda_embedding_backward,
    /* .posembed_forward = */ gs_cuda_posembed_forward,
    /* .posembed_backward = */ gs_cuda_posembed_backward,
    /* .attention_workspace = */ gs_cuda_attention_workspace,
    /* .attention_forward = */ gs_cuda_attention_forward,
    /* .attention_backward = */ gs_cuda_attention_backward,
};

static void say(char *why, size_t why_len, const char *fmt, const char *a, const char *b) {
  if (why && why_len)
    snprintf(why, why_len, fmt, a, b);
}

/* The contract this plugin was built against: the loader refuses it unless
 * it is the core's own (loader.h). */
GS_CUDA_EXPORT const uint32_t gs_cuda_plugin_abi = GS_BACKEND_ABI;

/* The backend, or NULL and why: no driver, no device, a driver older than
 * this runtime. Safe to call more than once (the table is static). */
GS_CUDA_EXPORT gs_backend *gs_cuda_backend_open(char *why, size_t why_len) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    const char *kind = (e == cudaErrorNoDevice) ? "no CUDA device: %s (%s)"
                                                : "CUDA driver not available: %s (%s)";
    say(why, why_len, kind, cudaGetErrorString(e), cudaGetErrorName(e));
    (void)cudaGetLastError();
    return NULL;
  }
  if (count == 0) {
    say(why, why_len, "no CUDA device: %s%s", "the driver reports 0 GPUs", "");
    return NULL;
  }
  int newest = 0;
  for (int i = 0; i < count; i++) {
    int major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, i) != cudaSuccess)
      (void)cudaGetLastError();
    else if (major > newest)
      newest = major;
  }
  /* the rule the control plane plans with (cuda_sizes.h) */
  gs_cuda_lt_workspace = gs_cuda_lt_workspace_for(newest);
  return &cuda_backend;
}

/* GPU `index`: 0 and *out, or -ENODEV past the last one. */
GS_CUDA_EXPORT int gs_cuda_plugin_device_info(int index, gs_gpu_info *out) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return -ENODEV;
  }
  if (index < 0 || index >= count || !out)
    return -ENODEV;
  cudaDeviceProp p;
  int rc = GS_CU(cudaGetDeviceProperties(&p, index));
  if (rc)
    return rc;
  memset(out, 0, sizeof *out);
  snprintf(out->name, sizeof out->name, "%s", p.name);
  out->major = p.major;
  out->minor = p.minor;
  out->total_bytes = p.totalGlobalMem;
  out->multiprocessors = p.multiProcessorCount;
  if (cudaDeviceGetPCIBusId(out->pci_bus_id, (int)sizeof out->pci_bus_id, index) != cudaSuccess) {
    (void)cudaGetLastError();
    out->pci_bus_id[0] = '\0';
  }
  return 0;
}
