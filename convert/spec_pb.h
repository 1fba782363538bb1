/*
 * spec_pb.h: the one place where the runtime's plain structs meet protobuf.
 *
 * The runtime (gsruntime) speaks plain C: gs_job_spec in, gs_plan,
 * gs_oom_report and gs_timeline out. The daemon, the executor and
 * gpushare-run speak gpushare.v1 messages. This small library (gsspec_pb,
 * linking gsruntime and gsproto) converts between them, in both directions
 * the edges need, so no other runtime file includes a generated header and
 * every surface that shows a plan, a report or a timeline starts from the
 * same message.
 */
#ifndef GS_RUNTIME_SPEC_PB_H
#define GS_RUNTIME_SPEC_PB_H

#include <stdint.h>

#include "common/error.h"
#include "proto/gpushare.pb-c.h"
#include "runtime/alloc.h"
#include "runtime/oom.h"
#include "runtime/plan.h"
#include "runtime/spec.h"
#include "runtime/train.h"

/* JobSpec -> gs_job_spec. Every field the runtime reads is copied with its
 * protobuf default where unset; strings point into `pb`, which must outlive
 * *out. An enum value the runtime does not know is passed through as its
 * number, and a Layer without a kind becomes GS_LAYER_KIND_COUNT, so
 * gs_model_build rejects them with the JobSpec's field path
 * ("precision", "model.layer[2]") in the order it checks everything else.
 * Returns 0, -EINVAL (pb is NULL: "the job has no spec") or -ENOMEM, with e
 * filled. Free with gs_spec_pb_job_free. */
int gs_spec_pb_job(const Gpushare__V1__JobSpec *pb, gs_job_spec *out, gs_err *e);
void gs_spec_pb_job_free(gs_job_spec *s);

/* Enum mappings, for flags and fields the edges handle themselves. */
gs_precision gs_spec_pb_precision(Gpushare__V1__Precision p);
Gpushare__V1__Precision gs_spec_pb_precision_to_pb(gs_precision p);

/* gs_plan -> gpushare.v1.Plan: rows, peak, parameters, micro-batch,
 * accumulation, precision, limit_bytes = limit; fits as judged for a vdev of
 * `limit` bytes and `policy` (always true without a limit), and, with a
 * limit, fits_growth and fits_preallocate for the table's wording. summary
 * is left NULL: present/ writes it from the message. Everything in *out is
 * malloc'd: free with gpushare__v1__plan__free_unpacked(*out, NULL).
 * Returns 0 or -ENOMEM. */
int gs_spec_pb_plan(const gs_plan *p, uint64_t limit, gs_alloc_policy policy,
                    Gpushare__V1__Plan **out);

/* gs_oom_report -> gpushare.v1.OomReport (malloc'd: free with
 * gpushare__v1__oom_report__free_unpacked). Returns 0 or -ENOMEM. */
int gs_spec_pb_oom_report(const gs_oom_report *r, Gpushare__V1__OomReport **out);

/* gs_timeline -> gpushare.v1.MemoryTimeline (malloc'd: free with
 * gpushare__v1__memory_timeline__free_unpacked); planned_peak_bytes is set
 * when the timeline has one. Returns 0 or -ENOMEM. */
int gs_spec_pb_timeline(const gs_timeline *tl, Gpushare__V1__MemoryTimeline **out);

#endif
