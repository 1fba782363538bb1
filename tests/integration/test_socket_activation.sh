#!/usr/bin/env bash
# test_socket_activation.sh: gpushared started the way gpushared.socket and
# gpushared.service start it, with systemd-socket-activate playing systemd.
#
# Usage: test_socket_activation.sh GPUSHARED GPUCTL   (exit 0 pass, 1 fail, 77 skip)
#
# systemd-socket-activate binds the socket, waits for the first connection
# and only then execs gpushared in its own process, with LISTEN_FDS and
# LISTEN_PID set and everything else in the environment cleared but what -E
# passes: here NOTIFY_SOCKET (a datagram socket this test reads, with
# SO_PASSCRED so each message carries its sender's pid, as systemd checks
# for NotifyAccess=main) and WATCHDOG_USEC/WATCHDOG_PID (what WatchdogSec=
# sets). Two runs:
#   1. as root, WATCHDOG_USEC=200000 for this very process: the connection
#      that woke the daemon is answered, not refused; READY=1 and then
#      repeated WATCHDOG=1 come from the main pid; the executors inherit none
#      of the LISTEN_* and WATCHDOG_* variables; SIGTERM sends STOPPING=1,
#      exits 0 and leaves the socket, which is systemd's, where it was.
#   2. as an unprivileged user (uid 65534 standing in for User=gpushare), the
#      watchdog addressed to another pid: no WATCHDOG=1 at all; the daemon
#      and its executor hold no capabilities, tenants are still told apart
#      by SO_PEERCRED, and a job runs to SUCCEEDED with its checkpoints in
#      a state directory only that user can read.
# (tests/integration/test_lifecycle.sh checks plain socket activation and
# the notify messages of a daemon started by hand.)
set -u
. "$(dirname "$0")/lib.sh"
HERE=$(cd "$(dirname "$0")" && pwd)
PROTO=${GS_SOURCE_DIR:-$HERE/../..}/proto

if ! command -v systemd-socket-activate >/dev/null 2>&1; then
  echo "SKIP: systemd-socket-activate is not installed"
  exit 77
fi

# Environment a sanitized build needs; systemd-socket-activate clears the rest.
PASS_ENV=()
for v in ASAN_OPTIONS UBSAN_OPTIONS LSAN_OPTIONS LD_LIBRARY_PATH GS_CUDA_PLUGIN; do
  [ -n "${!v:-}" ] && PASS_ENV+=(-E "$v")
done

# listen SOCKET LOG: record "PID UID MESSAGE" for each datagram until
# STOPPING=1 (or 120 s of silence).
listen() {
  $PY - "$1" >"$2" <<'PY' &
import socket, struct, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
s.bind(sys.argv[1])
import os; os.chmod(sys.argv[1], 0o777)   # an unprivileged daemon may send
s.settimeout(120)
try:
    while True:
        msg, anc, _, _ = s.recvmsg(4096, socket.CMSG_SPACE(12))
        pid = uid = -1
        for level, kind, data in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                pid, uid, _ = struct.unpack("iII", data[:12])
        print(pid, uid, msg.decode().replace("\n", " | "), flush=True)
        if b"STOPPING=1" in msg:
            break
except socket.timeout:
    pass
PY
  LPID=$!
  for _ in $(seq 100); do [ -S "$1" ] && return 0; sleep 0.05; done
  fail "the notify listener did not start"; finish; exit 1
}

# activate AS_UID WATCHDOG_PID_EXPR SOCKET STATE: start gpushared under
# systemd-socket-activate in the background (DPID: the process that becomes
# gpushared). WATCHDOG_PID_EXPR is evaluated by the shell that execs, so '$$'
# is the daemon's own pid.
activate() {
  local as=$1 wpid=$2 sock=$3 state=$4
  local run=()
  [ "$as" != 0 ] && run=(setpriv --reuid="$as" --regid="$as" --clear-groups)
  "${run[@]}" sh -c 'sock=$1 notify=$2 state=$3 conf=$4 bin=$5 wpid=$6; shift 6
    [ "$wpid" = self ] && wpid=$$
    exec systemd-socket-activate -l "$sock" -E NOTIFY_SOCKET="$notify" \
      -E WATCHDOG_USEC=200000 -E WATCHDOG_PID="$wpid" "$@" \
      "$bin" --foreground --config "$conf" --state-dir "$state"' \
    sh "$sock" "$NOTIFY" "$state" "$CONF" "$GPUSHARED" "$wpid" "${PASS_ENV[@]}" \
    >>"$T/daemon.log" 2>&1 &
  DPID=$!
  for _ in $(seq 100); do [ -S "$sock" ] && return 0; sleep 0.05; done
  fail "systemd-socket-activate did not bind $sock"; finish; exit 1
}

exe_of() { basename "$(readlink "/proc/$1/exe" 2>/dev/null)"; }
# wait_for FILE PATTERN COUNT: until FILE has COUNT lines matching (60 s at most)
wait_for() { for _ in $(seq 600); do
    [ "$(grep -c -- "$2" "$1")" -ge "$3" ] && return 0; sleep 0.1; done; return 1; }
# the executors gpushared started
executors() { pgrep -P "$DPID" -f gpushare-executor; }

# --- 1. root, watchdog for this process -----------------------------------
NOTIFY=$T/notify.sock
listen "$NOTIFY" "$T/notify1.log"
activate 0 self "$SOCK" "$STATE"
sleep 0.3
[ "$(exe_of "$DPID")" = systemd-socket-activate ] \
  && pass "before any connection only the socket exists (gpushared not started)" \
  || fail "pid $DPID is $(exe_of "$DPID") before the first connection"
# One attempt, no retry: this connection is what starts the daemon, and it
# must wait in the socket's backlog for an answer, not be refused.
expect_ok "the first connection starts gpushared and is answered" ctl version
[ "$(exe_of "$DPID")" = gpushared ] && pass "the process holding the socket became gpushared" \
  || fail "pid $DPID is $(exe_of "$DPID")"
grep -q "passed by systemd" "$T/daemon.log" && pass "serves on the socket it was passed" \
  || fail "did not use LISTEN_FDS"
wait_for "$T/notify1.log" "READY=1" 1 && pass "READY=1 sent" || fail "no READY=1: $(cat "$T/notify1.log")"
grep -q "^$DPID .*READY=1.*(socket activation)" "$T/notify1.log" \
  && pass "READY=1 from the main pid, status names the passed socket" \
  || fail "READY=1 not from pid $DPID or without the status: $(cat "$T/notify1.log")"
if wait_for "$T/notify1.log" "WATCHDOG=1" 5; then
  pass "WATCHDOG=1 arrives again and again ($(grep -c WATCHDOG=1 "$T/notify1.log") so far)"
else
  fail "fewer than 5 WATCHDOG=1 in 60 s: $(cat "$T/notify1.log")"
fi
others=$(grep "WATCHDOG=1" "$T/notify1.log" | awk -v p="$DPID" '$1 != p')
[ -z "$others" ] && pass "every WATCHDOG=1 comes from the main pid $DPID" || fail "from other pids: $others"
grep -q "watchdog: WATCHDOG=1 every 100 ms" "$T/daemon.log" \
  && pass "pings at half of WATCHDOG_USEC (100 ms of 200 ms)" || fail "no watchdog log line"
# The executor starts at boot; its environment must not claim the watchdog
# or the socket.
wait_for "$T/daemon.log" "executor for cpu ready" 1 || true
xs=$(executors)
if [ -z "$xs" ]; then
  fail "no executor process under gpushared (pid $DPID)"
else
  for x in $xs; do
    env_x=$(tr '\0' '\n' <"/proc/$x/environ")
    if echo "$env_x" | grep -qE '^(WATCHDOG_USEC|WATCHDOG_PID)='; then
      fail "executor $x inherited: $(echo "$env_x" | grep -E '^WATCHDOG_')"
    else
      pass "executor $x inherits no WATCHDOG_* variables"
    fi
    # LISTEN_PID names gpushared, so an executor could not take the socket
    # for its own even if it looked; fd 3 in the executor is its socketpair.
    [ "$(readlink "/proc/$x/fd/3")" != "$(readlink "/proc/$DPID/fd/3")" ] \
      && pass "executor $x does not hold the listening socket" \
      || fail "executor $x holds the listening socket as fd 3"
    if echo "$env_x" | grep -qE '^LISTEN_(PID|FDS|FDNAMES)='; then
      fail "executor $x inherits $(echo "$env_x" | grep -E '^LISTEN_' | tr '\n' ' ')"
    else
      pass "executor $x inherits no LISTEN_* variables (the socket is taken before executors start)"
    fi
  done
fi
stop_daemon
wait "$LPID" 2>/dev/null
grep -q "^[0-9-]* [0-9-]* STOPPING=1" "$T/notify1.log" && pass "STOPPING=1 sent" || fail "no STOPPING=1"
[ -S "$SOCK" ] && pass "the passed socket is left in place (systemd owns it)" \
  || fail "gpushared removed a socket it did not bind"
rm -f "$SOCK" "$NOTIFY"

# --- 2. unprivileged, watchdog for another pid ----------------------------
U=65534
RUN=$T/run; mkdir -m 0755 "$RUN"; chown "$U:$U" "$RUN"   # like /run, for the socket
USTATE=$T/ustate; mkdir -m 0700 "$USTATE"; chown "$U:$U" "$USTATE"   # StateDirectoryMode=0700
USOCK=$RUN/gpushared.sock
chmod 644 "$CONF"
listen "$NOTIFY" "$T/notify2.log"
activate "$U" 1 "$USOCK" "$USTATE"
# The daemon made the socket as uid 65534; clients of other uids need it
# open, as SocketMode=0660 with group gpushare gives tenants.
for _ in $(seq 50); do [ -S "$USOCK" ] && break; sleep 0.05; done
chmod 666 "$USOCK"
C() { "$GPUCTL" --socket "$USOCK" "$@"; }
expect_ok "unprivileged gpushared answers the first connection" C version
wait_for "$T/notify2.log" "READY=1" 1 && pass "READY=1 sent" || fail "no READY=1"
[ "$(awk '/READY=1/ { print $2; exit }' "$T/notify2.log")" = "$U" ] \
  && pass "the daemon runs as uid $U" || fail "READY=1 not from uid $U: $(cat "$T/notify2.log")"
caps=$(awk '/^CapEff:/ { print $2 }' "/proc/$DPID/status")
[ "$caps" = 0000000000000000 ] && pass "gpushared holds no capabilities" || fail "CapEff $caps"
expect_ok "root (uid 0) administers" C tenant create a --uid 4001
expect_fail "an unknown uid is refused by SO_PEERCRED" 1 PERMISSION_DENIED \
  setpriv --reuid=4002 --regid=4002 --clear-groups "$GPUCTL" --socket "$USOCK" tenant create b
expect_ok "vdev for tenant a" C vdev create a0 --memory 128MiB --compute 100 --tenant a
wait_for "$T/daemon.log" "executor for cpu ready" 2 || true
for x in $(executors); do
  st=$(awk '/^Uid:/ { print $2 } /^CapEff:/ { print $2 }' "/proc/$x/status" | tr '\n' ' ')
  [ "$st" = "$U 0000000000000000 " ] && pass "executor $x: uid $U, no capabilities" \
    || fail "executor $x: uid/CapEff $st"
done
if command -v protoc >/dev/null; then
  printf '%s\n' 'name: "sa" vdev: "a0"
model { input { height: 4 width: 4 channels: 1 }
  layer { flatten {} } layer { dense { units: 16 activation: RELU } } layer { dense { units: 2 } } }
train { synthetic { examples: 256 seed: 3 classes: 2 } }
batch_size: 16 epochs: 100 max_steps: 40 seed: 1 checkpoint_every_steps: 10
optimizer { adam { learning_rate: 0.01 } }' >"$T/sa.txtpb"
  protoc --encode=gpushare.v1.JobSpec --proto_path="$PROTO" gpushare.proto <"$T/sa.txtpb" >"$T/sa.pb"
  chmod 644 "$T/sa.pb"
  expect_ok "a tenant's job runs to the end under the unprivileged daemon" \
    setpriv --reuid=4001 --regid=65534 --clear-groups "$GPUCTL" --socket "$USOCK" submit "$T/sa.pb" --watch
  [[ "$LAST_OUT" == *SUCCEEDED* ]] && pass "job SUCCEEDED" || fail "job did not succeed: $LAST_OUT"
  foreign=$(find "$USTATE" ! -user "$U")
  [ -z "$foreign" ] && pass "everything in the state directory belongs to uid $U" \
    || fail "files not owned by $U: $foreign"
  [ -n "$(find "$USTATE" -type f -newer "$T/sa.pb" -path '*ckpt*' -o -type f -newer "$T/sa.pb" -name '*.safetensors')" ] \
    && pass "the executor wrote checkpoints into the state directory" \
    || echo "note - no checkpoint file found by name under $USTATE: $(find "$USTATE" -type f | head)"
else
  echo "note - protoc not installed; no job run under the unprivileged daemon"
fi
ctl_a() { setpriv --reuid=4001 --regid=65534 --clear-groups "$GPUCTL" --socket "$USOCK" "$@"; }
expect_ok "tenant a lists its jobs" ctl_a list
stop_daemon
wait "$LPID" 2>/dev/null
n=$(grep -c "WATCHDOG=1" "$T/notify2.log")
[ "$n" = 0 ] && pass "no WATCHDOG=1 when WATCHDOG_PID names another process" \
  || fail "$n WATCHDOG=1 sent although WATCHDOG_PID=1"
grep -q "STOPPING=1" "$T/notify2.log" && pass "STOPPING=1 sent" || fail "no STOPPING=1"
finish
