/*
 * present.h: gpushare's artefacts as text for people.
 *
 * A plan, an OOM report and a memory timeline are built once (runtime/) and
 * travel as gpushare.v1 messages; every surface that prints one (the
 * daemon's Plan.summary, gpushare-run, gpuctl) formats the message with the
 * functions here, so a person reads the same table and the same report
 * wherever it came from. They take the message, not the runtime's structs:
 * gpuctl sees only messages, and this library links gsproto and gscommon,
 * nothing of the runtime.
 *
 * Each returns malloc'd text ending in a newline (free it), or NULL when
 * out of memory.
 */
#ifndef GS_PRESENT_H
#define GS_PRESENT_H

#include "proto/gpushare.pb-c.h"

/* The plan as a model summary: a row per layer (name, output shape,
 * parameters, bytes by role, with only the roles that hold memory), the
 * job-wide row, totals, the micro-batch, accumulation and precision, the
 * predicted peak and, when limit_bytes > 0, whether it fits (a growth vdev,
 * only a preallocated one, or neither, by how much). */
char *gs_present_plan(const Gpushare__V1__Plan *p);

/* The OOM report: the cause, the tensor, the vdev's numbers, the
 * explanation and what would fit (one line each). */
char *gs_present_oom(const Gpushare__V1__OomReport *r);

/* The memory timeline: the peak against the plan, a bar per step (at most
 * 40 lines; more steps merge by max) and the bytes by layer and role at the
 * peak. */
char *gs_present_timeline(const Gpushare__V1__MemoryTimeline *tl);

#endif
