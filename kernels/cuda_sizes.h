/*
 * cuda_sizes.h: the `cuda` backend's memory sizes, as pure functions of the
 * shapes, in plain C.
 *
 * The planner sizes a job with the backend of its vdev's device (plan.h),
 * and on a GPU that is the CUDA plugin's workspace queries. The control
 * plane plans every submit but never loads CUDA (a context in gpushared
 * would hold device memory and tie it to the driver), so the queries live
 * here, in the core kernels library, and the plugin compiles this same
 * file: its *_workspace ops call these functions, so what the control plane
 * plans is what the executor's job asks its allocator for, byte for byte.
 *
 * The one figure that is not a function of the shapes is cuBLASLt's
 * workspace, which the plugin fixes at open from the GPUs it sees (32 MiB
 * when any is Hopper, compute capability 9, or newer; 4 MiB otherwise, as
 * NVIDIA recommends); the control plane applies the same rule to the GPUs
 * `gpushare-executor --list-devices` reported (gs_cuda_lt_workspace_for).
 */
#ifndef GS_KERNELS_CUDA_SIZES_H
#define GS_KERNELS_CUDA_SIZES_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* cuBLASLt workspace bytes for a machine whose newest GPU has compute
 * capability major `cc_major`: 32 MiB from 9 (Hopper) on, else 4 MiB. */
size_t gs_cuda_lt_workspace_for(int cc_major);

/* Upper bound on one chunk of conv2d im2col rows, counted as fp32 (dcol). */
#define GS_CUDA_COL_BYTES ((size_t)64 << 20)

/* Whole images per conv2d im2col chunk: as many as GS_CUDA_COL_BYTES holds
 * as fp32 rows, at least 1, at most s->n. */
uint32_t gs_cuda_conv_chunk_images(const gs_conv_shape *s);

/* Chunks the depthwise weight gradient's positions (N x OH x OW) are cut
 * into, each block summing one chunk of 32 channels of one tap (or of the
 * bias) into the workspace, a second pass adding the chunks in order: about
 * GS_CUDA_DW_BLOCKS blocks in all, at least GS_CUDA_DW_MIN_POSITIONS
 * positions a chunk, 1 (no workspace, one pass) when that is all. */
#define GS_CUDA_DW_BLOCKS 4096
#define GS_CUDA_DW_MIN_POSITIONS 128
uint32_t gs_cuda_depthwise_chunks(const gs_conv_shape *s);

/* The workspace queries of backend.h, with cuBLASLt's bytes `lt`. */
size_t gs_cuda_size_dense(size_t lt, gs_dtype dt, uint32_t n, uint32_t c, uint32_t oc);
size_t gs_cuda_size_conv2d(size_t lt, gs_dtype dt, const gs_conv_shape *s);
size_t gs_cuda_size_depthwise(size_t lt, gs_dtype dt, const gs_conv_shape *s);

/* The normalisation ops' column reductions: rows per chunk and chunks for
 * m rows (a grid's y dimension is at most 65535), and their workspaces. */
#define GS_CUDA_NORM_ROWS 128
void gs_cuda_norm_split(size_t m, size_t *chunk, size_t *nk);
size_t gs_cuda_size_batchnorm(gs_dtype dt, uint32_t m, uint32_t c);
size_t gs_cuda_size_layernorm(gs_dtype dt, uint32_t m, uint32_t c);
size_t gs_cuda_size_attention(gs_dtype dt, uint32_t n, uint32_t t, uint32_t heads,
                              uint32_t head_size);

#ifdef __cplusplus
}
#endif

#endif
