/*
 * metrics.h: the daemon's state as Prometheus text (the metrics call).
 */
#ifndef GS_METRICS_H
#define GS_METRICS_H

#include "common/error.h"
#include "control/daemon.h"

/* The exposition, malloc'd (the caller frees it). 0, or -1 with e set. */
int gs_metrics_text(gs_daemon *d, char **out, gs_err *e);

#endif
