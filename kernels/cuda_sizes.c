/*
 * cuda_sizes.c: the `cuda` backend's workspace sizes (see cuda_sizes.h).
 *
 * dense: cuBLASLt's workspace, whatever the shape (the bias gradient's
 * partial column sums reuse it before the GEMMs do). conv2d: cuBLASLt's,
 * then the im2col buffer of one chunk of whole images as fp32 (the input
 * gradient's dcol is fp32), none for a 1x1 stride-1 conv, which multiplies
 * the input itself. depthwise: the weight and bias gradients' partial sums
 * per chunk of positions (gs_cuda_depthwise_chunks), none when one chunk
 * suffices; the weights are converted as they are read.
 */
#include "kernels/cuda_sizes.h"

size_t gs_cuda_lt_workspace_for(int cc_major) {
  return cc_major >= 9 ? (size_t)32 << 20 : (size_t)4 << 20;
}

uint32_t gs_cuda_conv_chunk_images(const gs_conv_shape *s) {
  uint32_t oh = gs_window_out(s->h, s->kh, s->stride, s->same);
  uint32_t ow = gs_window_out(s->w, s->kw, s->stride, s->same);
  uint64_t per = 4 * (uint64_t)oh * ow * ((uint64_t)s->kh * s->kw * s->c);
  uint64_t ipc = per ? GS_CUDA_COL_BYTES / per : s->n;
  if (ipc < 1) ipc = 1;
  return (uint32_t)(ipc < s->n ? ipc : s->n);
}

size_t gs_cuda_size_dense(size_t lt, gs_dtype dt, uint32_t n, uint32_t c, uint32_t oc) {
  (void)dt;
  (void)n;
  (void)c;
  (void)oc;
  return lt;
}

size_t gs_cuda_size_conv2d(size_t lt, gs_dtype dt, const gs_conv_shape *s) {
  (void)dt;
  uint32_t oh = gs_window_out(s->h, s->kh, s->stride, s->same);
  uint32_t ow = gs_window_out(s->w, s->kw, s->stride, s->same);
  uint64_t p = (uint64_t)oh * ow, k = (uint64_t)s->kh * s->kw * s->c;
  if (s->n == 0 || p == 0) return lt;
  bool pointwise = s->kh == 1 && s->kw == 1 && s->stride == 1;
  return lt + (pointwise ? 0 : (size_t)4 * gs_cuda_conv_chunk_images(s) * p * k);
}

uint32_t gs_cuda_depthwise_chunks(const gs_conv_shape *s) {
  uint32_t oh = gs_window_out(s->h, s->kh, s->stride, s->same);
  uint32_t ow = gs_window_out(s->w, s->kw, s->stride, s->same);
  uint64_t positions = (uint64_t)s->n * oh * ow;
  uint64_t blocks = ((uint64_t)s->c + 31) / 32 * ((uint64_t)s->kh * s->kw + 1);
  if (positions == 0 || blocks == 0) return 1;
  uint64_t chunks = (positions + GS_CUDA_DW_MIN_POSITIONS - 1) / GS_CUDA_DW_MIN_POSITIONS;
  uint64_t want = (GS_CUDA_DW_BLOCKS + blocks - 1) / blocks;
  if (chunks > want) chunks = want;
  if (chunks > 65535) chunks = 65535; /* gridDim.z */
  return chunks < 1 ? 1 : (uint32_t)chunks;
}

size_t gs_cuda_size_depthwise(size_t lt, gs_dtype dt, const gs_conv_shape *s) {
  (void)lt;
  (void)dt;
  uint32_t chunks = gs_cuda_depthwise_chunks(s);
  if (chunks <= 1) return 0;
  /* per chunk, the partial sums of every tap and the bias, per channel */
  return (size_t)chunks * ((size_t)s->kh * s->kw + 1) * s->c * sizeof(float);
}

void gs_cuda_norm_split(size_t m, size_t *chunk, size_t *nk) {
  const size_t span = (size_t)GS_CUDA_NORM_ROWS * 65535;
  size_t per = GS_CUDA_NORM_ROWS * ((m + span - 1) / span);
  if (per == 0) per = GS_CUDA_NORM_ROWS;
  *chunk = per;
  *nk = m ? (m + per - 1) / per : 1;
}

/* The partials (2 nk, C) double, then two fp32 arrays of C (evaluation:
 * mean and rstd from the running statistics; backward: sum(dout) / M and
 * sum(dout xhat) / M). */
size_t gs_cuda_size_batchnorm(gs_dtype dt, uint32_t m, uint32_t c) {
  (void)dt;
  size_t chunk, nk;
  gs_cuda_norm_split(m, &chunk, &nk);
  return 2 * nk * (size_t)c * sizeof(double) + 2 * (size_t)c * sizeof(float);
}

/* The gradient partials (2 nk, C) double. */
size_t gs_cuda_size_layernorm(gs_dtype dt, uint32_t m, uint32_t c) {
  (void)dt;
  size_t chunk, nk;
  gs_cuda_norm_split(m, &chunk, &nk);
  return 2 * nk * (size_t)c * sizeof(double);
}

/* The row sums of attention's backward first pass. */
size_t gs_cuda_size_attention(gs_dtype dt, uint32_t n, uint32_t t, uint32_t heads,
                              uint32_t head_size) {
  (void)dt;
  if (head_size == 0) return 0;
  return sizeof(float) * n * (size_t)heads * t;
}
