/*
 * cuda_plan.h: the table the control plane plans a GPU vdev with: the CUDA
 * plugin's workspace queries (cuda_sizes.h) in a backend that runs nothing.
 */
#ifndef GS_KERNELS_CUDA_PLAN_H
#define GS_KERNELS_CUDA_PLAN_H

#include "kernels/backend.h"

/* A backend table for planning a GPU whose machine's newest GPU has compute
 * capability major `cc_major`: named "cuda", host_memory false, its
 * *_workspace members those of cuda_sizes.h. It runs nothing: the ops are
 * the cpu backend's (the planner's check that the ops exist, never called),
 * and so are the workspace queries of ops this file does not size. */
const gs_backend *gs_backend_cuda_sizes(int cc_major);

#endif
