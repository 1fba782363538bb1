/*
 * job.h: the job records of the control plane and their state machine.
 *
 * A job lives in memory as its gpushare.v1.Job record (an unpacked
 * protobuf-c message this module owns and edits field by field with
 * malloc'd values, so free_unpacked releases it) and in the store as that
 * record packed. Every state change goes through gs_job_transition, which
 * refuses the moves the state machine does not have, writes the record to
 * the store, appends the event to the job's log, and then tells whoever
 * listens (the event sink: the watch streams of rpc_jobs.c) — in that
 * order, so nobody hears of a state the store does not hold. When the
 * store cannot take the record (disk full, I/O error), the daemon acts on
 * the new state, clients are told the stored one (gs_job_told), the event
 * is held, and gs_jobs_save_pending writes the record again each second
 * until it is stored and the held events go out.
 *
 *   QUEUED    -> RUNNING | CANCELLED
 *   RUNNING   -> SUCCEEDED | FAILED | CANCELLED
 *              | PREEMPTED (stopped with a checkpoint for a higher-priority
 *                job or a shrunk vdev; resumes when it fits again)
 *              | QUEUED (a run-time OOM it is to come back from)
 *   PREEMPTED -> RUNNING | CANCELLED
 *   SUCCEEDED, FAILED, CANCELLED: final
 *
 * A job accepted is a job kept: submit writes the job (QUEUED) in one store
 * transaction before it answers (rpc_jobs.c). At start, gs_jobs_load reads
 * every job of the store back: RUNNING ones wait to resume from their
 * checkpoint, QUEUED ones are queued again.
 */
#ifndef GS_JOB_H
#define GS_JOB_H

#include <stdbool.h>
#include <stdint.h>

#include "common/error.h"
#include "control/daemon.h"
#include "proto/gpushare.pb-c.h"

#define GS_JOB_STATES 6 /* gpushare.v1.JobState values, QUEUED .. PREEMPTED */

/* A job's state as the store holds it, kept while the record in memory
 * has moved past it and could not be written yet (disk full, I/O error):
 * clients are told this one until the newer record is on disk. */
typedef struct gs_job_saved {
  Gpushare__V1__JobState state;
  char *reason;            /* owned */
  int64_t started_unix;    /* 0: not started */
  int64_t finished_unix;   /* 0: not finished */
} gs_job_saved;

/* An event of a state change held back until the record that has that
 * state is on disk (packed JobEvent). */
typedef struct gs_job_held {
  uint8_t *ev;
  size_t len;
  bool final;
} gs_job_held;

typedef struct gs_job {
  Gpushare__V1__Job *rec;  /* owned; what the daemon acts on: the store holds it
                            * packed, or will once `unsaved` clears */
  uint32_t crashes;        /* executor deaths while placed */
  int placed;              /* device index it runs on, -1 when not on an executor */
  bool resume_pending;     /* RUNNING, waiting to be (re)started on its executor */
  bool cancel_requested;
  double device_seconds;
  uint64_t epoch_saved_ms; /* loop time the last epoch end was stored and logged */
  bool unsaved;            /* rec is newer than the store's copy: written again
                            * by gs_jobs_save_pending until it is */
  bool state_unsaved;      /* and its state differs from `saved`'s */
  gs_job_saved saved;      /* valid while state_unsaved */
  gs_job_held *held;       /* state-change events waiting for the store */
  size_t n_held;
  uint64_t data_key;       /* hash of what its datasets are loaded from (train, test,
                            * model input): one key, one copy in the executor */
  bool pausing;            /* PauseJob sent: it stops at its next step boundary */
  int pause_kind;          /* why (exec_events.c): preempted, re-planned, requeued */
  uint32_t replan_micro;   /* re-planned: the micro-batch and accumulation it */
  uint32_t replan_accum;   /* resumes with, and their planned peak */
  uint64_t replan_peak;
  uint64_t retry_after_ms; /* requeued after an OOM: not started before (gs_job_now_ms) */
  bool mem_known;          /* placed, and its run reported what it holds (below) */
  uint64_t mem_device;     /* bytes of its tensors in its vdev */
  uint64_t mem_host;       /* host bytes its run holds, datasets included */
  uint64_t mem_host_data;  /* of which its datasets' shared copy */
} gs_job;

/* Told of every event of every job, after it is stored; `final` when the
 * job has ended (its last event). */
typedef void (*gs_job_sink)(void *arg, const gs_job *j, const Gpushare__V1__JobEvent *ev,
                            bool final);

struct gs_jobs {
  gs_job **by_id;          /* index = job id (ids are dense, from the store) */
  uint64_t cap;
  uint64_t submitted;      /* since start */
  uint64_t finished[GS_JOB_STATES]; /* since start, by final state */
  uint64_t unsaved;        /* jobs whose record the store does not hold yet */
  char store_error[256];   /* why the last write failed */
  gs_job_sink sink;        /* NULL: nobody listens */
  void *sink_arg;
};

/* Create d->jobs from the store (and STATE_DIR/jobs); RUNNING jobs become
 * resume-pending, a RUNNING job whose cancel was acknowledged ends
 * CANCELLED. */
int gs_jobs_load(gs_daemon *d, gs_err *e);
void gs_jobs_free(gs_daemon *d);
void gs_jobs_set_sink(gs_jobs *J, gs_job_sink fn, void *arg);

gs_job *gs_job_get(gs_daemon *d, uint64_t id);
/* Add a job just stored (takes rec). */
int gs_job_add(gs_daemon *d, Gpushare__V1__Job *rec, gs_job **out, gs_err *e);

const char *gs_job_state_name(int state);
bool gs_job_final(int state);
/* QUEUED or PREEMPTED: in a queue, waiting to start or resume. */
bool gs_job_waiting(int state);
/* Is from -> to a move of the state machine? */
bool gs_job_legal(int from, int to);

/* Change state (refused, logged, when not legal), persist, log the event
 * and tell the sink; a final state ends the job's streams. 0, or -EINVAL
 * when the move is not legal, or the store's negative errno when the
 * record could not be written: the daemon then acts on the new state, but
 * clients are told the stored one (gs_job_told_state) and hear the event
 * only once gs_jobs_save_pending has written it. */
int gs_job_transition(gs_daemon *d, gs_job *j, Gpushare__V1__JobState st, const char *reason);
/* Write the record to the store (0, or a negative errno, logged; the job
 * is then unsaved and written again by gs_jobs_save_pending). */
int gs_job_persist(gs_daemon *d, gs_job *j);
/* Write every unsaved job again; those written release their held events,
 * in order. Called once a second by main.c, and before exit. Returns how
 * many jobs are still unsaved. */
uint64_t gs_jobs_save_pending(gs_daemon *d);
/* The state clients are told: the store's, while a newer one is unsaved. */
Gpushare__V1__JobState gs_job_told_state(const gs_job *j);
/* The record as clients are to see it: *out is a shallow copy of j->rec
 * with the stored state, reason and times while a state change is unsaved. */
void gs_job_told(const gs_job *j, Gpushare__V1__Job *out);
/* An event describing the job as it stands (state, step, last metrics);
 * message is borrowed. */
void gs_job_state_event(const gs_job *j, Gpushare__V1__JobEvent *ev, const char *message);
/* Append an event to the job's stored log. */
void gs_job_log_event(gs_daemon *d, gs_job *j, const Gpushare__V1__JobEvent *ev);
/* Tell the sink of an event that is not a state change (progress). */
void gs_job_publish(gs_daemon *d, const gs_job *j, const Gpushare__V1__JobEvent *ev, bool final);
/* Append an epoch's metrics to the record (the last GS_EPOCHS_KEPT kept). */
void gs_job_append_epoch(gs_job *j, const Gpushare__V1__EpochMetrics *m);
void gs_job_set_str(char **field, const char *v);
/* A deep copy of a protobuf-c message that free_unpacked can release. */
void *gs_job_msg_dup(const ProtobufCMessage *m);

/* Jobs of a tenant in a state. */
uint32_t gs_jobs_count(gs_daemon *d, const char *tenant, int state);
/* A job that has not ended and uses the dataset blob (0: none). */
uint64_t gs_jobs_using_blob(gs_daemon *d, const char *sha256);
/* STATE_DIR/jobs/ID and a file in it. */
void gs_job_dir(const gs_daemon *d, uint64_t id, char *buf, size_t len);
void gs_job_file(const gs_daemon *d, uint64_t id, const char *name, char *buf, size_t len);
uint64_t gs_job_now_ms(void);

#endif
