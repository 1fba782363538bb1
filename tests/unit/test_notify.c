/*
 * test_notify.c: gpushared's systemd protocols against real sockets.
 *
 * The notify tests play the service manager: they bind an AF_UNIX datagram
 * socket (in a temporary directory, or under an abstract name), point
 * NOTIFY_SOCKET at it and read back what gs_notify sent. AF_UNIX datagrams
 * are queued on the receiver before sendto returns, so a non-blocking recv
 * sees the message, or proves its absence, without any waiting.
 *
 * Socket activation needs the socket at fd 3, which Criterion's own
 * plumbing may hold in the test process, so those tests run in a forked
 * child that reports through its exit status which check failed.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "control/notify.h"

static char tmpdir[64];
static char sockpath[128];

static void setup(void) {
  unsetenv("NOTIFY_SOCKET");
  unsetenv("WATCHDOG_USEC");
  unsetenv("WATCHDOG_PID");
  unsetenv("LISTEN_PID");
  unsetenv("LISTEN_FDS");
  unsetenv("LISTEN_FDNAMES");
  snprintf(tmpdir, sizeof tmpdir, "/tmp/gs-notify-XXXXXX");
  cr_assert_not_null(mkdtemp(tmpdir), "mkdtemp: %s", strerror(errno));
  snprintf(sockpath, sizeof sockpath, "%s/notify", tmpdir);
}

static void teardown(void) {
  unlink(sockpath);
  rmdir(tmpdir);
}

TestSuite(notify, .init = setup, .fini = teardown);

/* A datagram socket bound to path, or to an abstract name when path starts
   with '@'. */
static int bind_dgram(const char *path) {
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  cr_assert_geq(fd, 0, "socket: %s", strerror(errno));
  struct sockaddr_un sa;
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  size_t len = strlen(path);
  memcpy(sa.sun_path, path, len);
  socklen_t salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len + 1);
  if (path[0] == '@') {
    sa.sun_path[0] = '\0';
    salen--;
  }
  cr_assert_eq(bind(fd, (struct sockaddr *)&sa, salen), 0, "bind %s: %s", path,
               strerror(errno));
  return fd;
}

/* What is queued on fd, "" when nothing is (EAGAIN). */
static void recv_now(int fd, char *buf, size_t cap) {
  ssize_t n = recv(fd, buf, cap - 1, MSG_DONTWAIT);
  if (n < 0) {
    cr_assert_eq(errno, EAGAIN, "recv: %s", strerror(errno));
    n = 0;
  }
  buf[n] = '\0';
}

Test(notify, sends_state_to_path_socket) {
  int fd = bind_dgram(sockpath);
  setenv("NOTIFY_SOCKET", sockpath, 1);
  cr_assert_eq(gs_notify("READY=1\nSTATUS=serving 2 devices"), 0);
  char buf[256];
  recv_now(fd, buf, sizeof buf);
  cr_assert_str_eq(buf, "READY=1\nSTATUS=serving 2 devices");
  recv_now(fd, buf, sizeof buf);
  cr_assert_str_eq(buf, "", "one call sends exactly one datagram");
  close(fd);
}

Test(notify, sends_to_abstract_socket) {
  char name[64];
  snprintf(name, sizeof name, "@gs-test-notify-%ld-%s", (long)getpid(), tmpdir + 14);
  int fd = bind_dgram(name);
  setenv("NOTIFY_SOCKET", name, 1);
  cr_assert_eq(gs_notify("WATCHDOG=1"), 0);
  char buf[64];
  recv_now(fd, buf, sizeof buf);
  cr_assert_str_eq(buf, "WATCHDOG=1");
  close(fd);
}

Test(notify, formats_with_notifyf) {
  int fd = bind_dgram(sockpath);
  setenv("NOTIFY_SOCKET", sockpath, 1);
  cr_assert_eq(gs_notifyf("STATUS=%d jobs on %s", 3, "cpu"), 0);
  char buf[64];
  recv_now(fd, buf, sizeof buf);
  cr_assert_str_eq(buf, "STATUS=3 jobs on cpu");
  close(fd);
}

Test(notify, unset_is_a_noop) {
  int fd = bind_dgram(sockpath);
  cr_assert_eq(gs_notify("READY=1"), 0);
  cr_assert_eq(gs_notifyf("STATUS=%s", "x"), 0);
  char buf[64];
  recv_now(fd, buf, sizeof buf);
  cr_assert_str_eq(buf, "", "nothing may be sent without NOTIFY_SOCKET");
  close(fd);
}

Test(notify, missing_socket_is_an_error) {
  setenv("NOTIFY_SOCKET", sockpath, 1); /* nothing bound there */
  int rc = gs_notify("READY=1");
  cr_assert(rc == -ENOENT || rc == -ECONNREFUSED, "rc %d", rc);
  setenv("NOTIFY_SOCKET", "vsock:2:1234", 1);
  cr_assert_lt(gs_notify("READY=1"), 0, "an address family we do not speak is refused");
}

Test(notify, watchdog_interval) {
  cr_assert_eq(gs_notify_watchdog_usec(), 0);
  setenv("WATCHDOG_USEC", "30000000", 1);
  cr_assert_eq(gs_notify_watchdog_usec(), 30000000);
  char pid[32];
  snprintf(pid, sizeof pid, "%ld", (long)getpid());
  setenv("WATCHDOG_PID", pid, 1);
  cr_assert_eq(gs_notify_watchdog_usec(), 30000000);
  snprintf(pid, sizeof pid, "%ld", (long)getpid() + 1);
  setenv("WATCHDOG_PID", pid, 1);
  cr_assert_eq(gs_notify_watchdog_usec(), 0, "a watchdog meant for another process");
  unsetenv("WATCHDOG_PID");
  setenv("WATCHDOG_USEC", "30s", 1);
  cr_assert_eq(gs_notify_watchdog_usec(), 0, "not a number of microseconds");
  setenv("WATCHDOG_USEC", "-5", 1);
  cr_assert_eq(gs_notify_watchdog_usec(), 0);
}

/* Checks run in a child that owns fd 3; each returns the number of the
   failed step, 0 when all passed. */
enum fd3_kind { FD3_LISTENING, FD3_UNLISTENED, FD3_DGRAM, FD3_PIPE };

static int put_on_fd3(enum fd3_kind kind, const char *path) {
  int fd = -1, p[2];
  if (kind == FD3_PIPE) {
    if (pipe(p) != 0) return -1;
    fd = p[0];
  } else {
    fd = socket(AF_UNIX, kind == FD3_DGRAM ? SOCK_DGRAM : SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0) return -1;
    if (kind == FD3_LISTENING && listen(fd, 4) != 0) return -1;
  }
  if (fd != 3 && (dup2(fd, 3) != 3 || close(fd) != 0)) return -1;
  return 0;
}

static int child_activation(enum fd3_kind kind, int same_pid) {
  if (put_on_fd3(kind, sockpath) != 0) return 10;
  char pid[32];
  snprintf(pid, sizeof pid, "%ld", (long)getpid() + (same_pid ? 0 : 1));
  setenv("LISTEN_PID", pid, 1);
  setenv("LISTEN_FDS", "1", 1);
  setenv("LISTEN_FDNAMES", "gpushared.socket", 1);
  int fd = gs_notify_listen_fd();
  if (!same_pid) {
    if (fd != -1) return 11;
    if (getenv("LISTEN_PID") == NULL) return 12; /* not ours: left for its owner */
    return 0;
  }
  if (getenv("LISTEN_PID") || getenv("LISTEN_FDS") || getenv("LISTEN_FDNAMES")) return 13;
  if (kind != FD3_LISTENING) return fd == -1 ? 0 : 14;
  if (fd != 3) return 15;
  int flags = fcntl(3, F_GETFD);
  if (flags < 0 || !(flags & FD_CLOEXEC)) return 16;
  if (gs_notify_listen_fd() != -1) return 17; /* the variables are gone: second call finds none */
  return 0;
}

static void run_activation(enum fd3_kind kind, int same_pid) {
  pid_t pid = fork();
  cr_assert_geq(pid, 0, "fork: %s", strerror(errno));
  if (pid == 0) _exit(child_activation(kind, same_pid));
  int st = 0;
  cr_assert_eq(waitpid(pid, &st, 0), pid);
  cr_assert(WIFEXITED(st), "child died with status 0x%x", st);
  cr_assert_eq(WEXITSTATUS(st), 0,
               "activation check %d failed (fd3 kind %d, same pid %d): 10 setup, 11 took "
               "another pid's fd, 12 removed another pid's variables, 13 variables left, "
               "14 accepted a wrong fd, 15 wrong fd, 16 no CLOEXEC, 17 second call",
               WEXITSTATUS(st), kind, same_pid);
}

Test(notify, listen_fd_takes_listening_socket) { run_activation(FD3_LISTENING, 1); }
Test(notify, listen_fd_ignores_other_pid) { run_activation(FD3_LISTENING, 0); }
Test(notify, listen_fd_refuses_unlistened_socket) { run_activation(FD3_UNLISTENED, 1); }
Test(notify, listen_fd_refuses_datagram_socket) { run_activation(FD3_DGRAM, 1); }
Test(notify, listen_fd_refuses_pipe) { run_activation(FD3_PIPE, 1); }

Test(notify, listen_fd_without_variables) {
  cr_assert_lt(gs_notify_listen_fd(), 0);
  char pid[32];
  snprintf(pid, sizeof pid, "%ld", (long)getpid());
  setenv("LISTEN_PID", pid, 1);
  setenv("LISTEN_FDS", "0", 1);
  cr_assert_eq(gs_notify_listen_fd(), -1, "LISTEN_FDS=0 passes no socket");
  cr_assert_null(getenv("LISTEN_FDS"));
}
