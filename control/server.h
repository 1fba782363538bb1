/*
 * server.h: the control socket: listen (bind with the configured mode and
 * group, or adopt systemd's socket), accept with peer credentials, frame
 * and dispatch, drain on SIGTERM/SIGINT, reload on SIGHUP.
 */
#ifndef GS_SERVER_H
#define GS_SERVER_H

#include <stddef.h>

#include "control/daemon.h"
#include "common/error.h"

int gs_server_listen(gs_daemon *d, gs_server **out, gs_err *e);
/* Stop accepting and close every connection once its answers are out. */
void gs_server_drain(gs_server *s);
void gs_server_free(gs_server *s);
const char *gs_server_path(const gs_server *s);
size_t gs_server_connections(const gs_server *s);

#endif
