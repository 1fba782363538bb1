/*
 * notify.h: gpushared's side of the systemd service protocol, without
 * linking libsystemd.
 *
 * Three things the service manager offers a Type=notify, socket-activated
 * daemon: a datagram socket to report readiness and status on
 * ($NOTIFY_SOCKET), a watchdog interval ($WATCHDOG_USEC, $WATCHDOG_PID) and
 * listening sockets passed from gpushared.socket ($LISTEN_PID, $LISTEN_FDS,
 * from fd 3 on). Each is a few lines of plain socket code, so gpushared
 * speaks the protocol itself and runs the same with or without systemd:
 * every function is a no-op when its variables are unset.
 */
#ifndef GS_NOTIFY_H
#define GS_NOTIFY_H

#include <stdint.h>

/* sd_notify without libsystemd: send one datagram to $NOTIFY_SOCKET (path or
   abstract '@' name). No-op returning 0 when NOTIFY_SOCKET is unset. */
int gs_notify(const char *state);            /* e.g. "READY=1\nSTATUS=serving 2 devices" */
int gs_notifyf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Watchdog interval from WATCHDOG_USEC (and WATCHDOG_PID matching getpid), 0 if none. */
uint64_t gs_notify_watchdog_usec(void);
/* Socket activation: if LISTEN_PID == getpid() and LISTEN_FDS >= 1, return the first
   fd (3) after checking it is a listening AF_UNIX stream socket (set CLOEXEC), and unset
   LISTEN_PID/LISTEN_FDS/LISTEN_FDNAMES; else -1. */
int gs_notify_listen_fd(void);

#endif
