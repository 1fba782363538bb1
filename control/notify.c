/*
 * notify.c: the systemd notification, watchdog and socket-activation
 * protocols, spoken directly over sockets (see notify.h for why).
 *
 * gs_notify sends one SOCK_DGRAM datagram to $NOTIFY_SOCKET, which is either
 * a filesystem path or, with a leading '@', a name in Linux's abstract
 * namespace (the '@' becomes a NUL byte and the address length counts only
 * the bytes used). The socket is opened per call: gpushared notifies a
 * handful of times in its life (READY, STATUS, RELOADING, STOPPING,
 * WATCHDOG), so keeping one open buys nothing and costs a descriptor.
 *
 * gs_notify_listen_fd checks what gpushared.socket handed over before trusting it:
 * fd 3 must be a listening AF_UNIX stream socket. A wrong fd (another unit
 * file, a stale environment inherited by a child) is refused with -1 so the
 * daemon binds its own socket instead of serving on something unexpected.
 * The LISTEN_* variables are removed so the executors gpushared starts do
 * not think the socket is theirs.
 */
#include "control/notify.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define GS_NOTIFY_LISTEN_FD 3 /* SD_LISTEN_FDS_START */

/* Parse a whole decimal string into an unsigned 64-bit value; -EINVAL if it
   is empty, has trailing bytes or overflows. */
static int gs_notify__parse_u64(const char *s, uint64_t *out) {
  if (s == NULL || *s < '0' || *s > '9') return -EINVAL;
  char *end = NULL;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno != 0 || end == s || *end != '\0') return -EINVAL;
  *out = (uint64_t)v;
  return 0;
}

int gs_notify(const char *state) {
  const char *path = getenv("NOTIFY_SOCKET");
  if (path == NULL || path[0] == '\0') return 0;
  if (state == NULL) return -EINVAL;

  struct sockaddr_un sa;
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  size_t len = strlen(path);
  if (path[0] != '/' && path[0] != '@') return -EAFNOSUPPORT; /* vsock etc. */
  if (len >= sizeof sa.sun_path) return -ENAMETOOLONG;
  memcpy(sa.sun_path, path, len);
  socklen_t salen;
  if (path[0] == '@') {
    sa.sun_path[0] = '\0';
    salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len);
  } else {
    salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len + 1);
  }

  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  int rc = 0;
  ssize_t n = sendto(fd, state, strlen(state), MSG_NOSIGNAL,
                     (const struct sockaddr *)&sa, salen);
  if (n < 0)
    rc = -errno;
  else if ((size_t)n != strlen(state))
    rc = -EMSGSIZE;
  close(fd);
  return rc;
}

int gs_notifyf(const char *fmt, ...) {
  if (getenv("NOTIFY_SOCKET") == NULL) return 0;
  va_list ap;
  va_start(ap, fmt);
  char *s = NULL;
  int n = vasprintf(&s, fmt, ap);
  va_end(ap);
  if (n < 0) return -ENOMEM;
  int rc = gs_notify(s);
  free(s);
  return rc;
}

uint64_t gs_notify_watchdog_usec(void) {
  uint64_t usec = 0, pid = 0;
  if (gs_notify__parse_u64(getenv("WATCHDOG_USEC"), &usec) != 0) return 0;
  const char *p = getenv("WATCHDOG_PID");
  if (p != NULL) {
    if (gs_notify__parse_u64(p, &pid) != 0) return 0;
    if (pid != (uint64_t)getpid()) return 0; /* meant for our parent */
  }
  return usec;
}

int gs_notify_listen_fd(void) {
  uint64_t pid = 0, nfds = 0;
  if (gs_notify__parse_u64(getenv("LISTEN_PID"), &pid) != 0) return -1;
  if (pid != (uint64_t)getpid()) return -1;
  int have = gs_notify__parse_u64(getenv("LISTEN_FDS"), &nfds) == 0 && nfds >= 1;
  /* From here on the variables are ours: drop them whatever fd 3 turns out
     to be, so no child inherits them. */
  unsetenv("LISTEN_PID");
  unsetenv("LISTEN_FDS");
  unsetenv("LISTEN_FDNAMES");
  if (!have) return -1;

  int fd = GS_NOTIFY_LISTEN_FD;
  int v = 0;
  socklen_t l = sizeof v;
  if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &v, &l) != 0 || v != AF_UNIX) return -1;
  l = sizeof v;
  if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &v, &l) != 0 || v != SOCK_STREAM) return -1;
  l = sizeof v;
  if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &v, &l) != 0 || v == 0) return -1;
  int flags = fcntl(fd, F_GETFD);
  if (flags < 0 || fcntl(fd, F_SETFD, flags | FD_CLOEXEC) < 0) return -1;
  return fd;
}
