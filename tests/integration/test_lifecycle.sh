#!/usr/bin/env bash
# gpushared as a service: --help and bad arguments, sd_notify READY/STOPPING,
# SIGHUP reloading the config (and refusing a broken one), a stale socket
# replaced and a live one left alone, systemd socket activation, and
# detaching without --foreground.
set -u
. "$(dirname "$0")/lib.sh"

expect_ok "gpushared --help" "$GPUSHARED" --help
[[ "$LAST_OUT" == *--state-dir* ]] && pass "--help lists the options" || fail "$LAST_OUT"
expect_ok "gpushared --version" "$GPUSHARED" --version
expect_fail "unknown option exits 2" 2 "--bogus" "$GPUSHARED" --bogus
expect_fail "missing --config file" 1 "$T/nope.conf" "$GPUSHARED" --foreground --config "$T/nope.conf" --socket "$SOCK" --state-dir "$STATE"
printf 'cpu_memory = 4XB\n' >"$T/bad.conf"
expect_fail "bad config value names file, line and key" 1 "bad.conf:1 cpu_memory" \
  "$GPUSHARED" --foreground --config "$T/bad.conf" --socket "$SOCK" --state-dir "$STATE"

# sd_notify: READY=1 once serving, STOPPING=1 on SIGTERM, and READY=1 after
# every RELOADING=1 (sd_notify(3): a reload is over only when READY=1 comes,
# whatever came of it; without it systemd shows the unit "reloading").
NOTIFY=$T/notify.sock
# notify_listen LOG: a datagram socket at $NOTIFY that writes each message
# to LOG as one line (newlines shown as " | "), until STOPPING=1.
notify_listen() {
  rm -f "$NOTIFY"; NLOG=$1
  $PY - "$NOTIFY" >"$NLOG" <<'PY' &
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
s.settimeout(20)
try:
    while True:
        msg = s.recv(4096).decode()
        print(msg.replace("\n", " | "), flush=True)
        if "STOPPING=1" in msg:
            break
except socket.timeout:
    pass
PY
  LPID=$!
  for _ in $(seq 50); do [ -S "$NOTIFY" ] && break; sleep 0.1; done
}
# hup_notified WHAT TEXT: SIGHUP the daemon; its last two messages must be
# RELOADING=1 with MONOTONIC_USEC= and then READY=1 with a STATUS= holding TEXT.
hup_notified() {
  local what=$1 text=$2 n
  n=$(grep -c "READY=1" "$NLOG")
  kill -HUP "$DPID"
  for _ in $(seq 50); do [ "$(grep -c "READY=1" "$NLOG")" -gt "$n" ] && break; sleep 0.1; done
  local msgs; msgs=$(grep -v '^WATCHDOG=1$' "$NLOG" | tail -n 2)
  local first=${msgs%%$'\n'*} last=${msgs##*$'\n'}
  if [[ "$first" != *RELOADING=1* || "$first" != *MONOTONIC_USEC=[0-9]* ]]; then
    fail "$what: no RELOADING=1 with MONOTONIC_USEC: $msgs"
  elif [[ "$last" != *READY=1* ]]; then fail "$what: no READY=1 after RELOADING=1: $msgs"
  elif [[ "$last" != *"STATUS="*"$text"* ]]; then fail "$what: STATUS lacks \"$text\": $last"
  else pass "$what: RELOADING=1, then READY=1 with STATUS=...$text..."; fi
}
notify_listen "$T/notify.log"
NOTIFY_SOCKET=$NOTIFY start_daemon
sleep 0.3
grep -q "READY=1" "$T/notify.log" && pass "READY=1 sent" || fail "no READY=1: $(cat "$T/notify.log")"

# A live daemon's socket is not taken over.
expect_fail "a second daemon on a live socket refuses" 1 "another gpushared" \
  "$GPUSHARED" --foreground --config "$CONF" --socket "$SOCK" --state-dir "$T/state2"

# SIGHUP: a broken file is refused and the old config stays; a good one applies.
cp "$CONF" "$T/conf.good"
printf 'admin_group = users\nthis is not a line\n' >>"$CONF"
hup_notified "SIGHUP with a broken file" "reload refused: $CONF:"
grep -q "keeping the running configuration" "$T/daemon.log" && pass "SIGHUP with a broken file keeps the running config" \
  || fail "broken reload not reported"
expect_ok "still admin after the broken reload" ctl_as 65534 100 tenant create hup1
mv "$CONF" "$T/conf.away"
hup_notified "SIGHUP with the --config file gone" "running configuration kept"
cp "$T/conf.good" "$CONF"; sed -i 's/^admin_group = users/admin_group = daemon/' "$CONF"
hup_notified "SIGHUP with a good file" "configuration reloaded from $CONF"
grep -q "configuration reloaded" "$T/daemon.log" && pass "SIGHUP reload logged" || fail "no reload log"
expect_fail "admin_group change applies live" 1 PERMISSION_DENIED ctl_as 65534 100 tenant create hup2
expect_ok "the new admin group works" ctl_as 65534 "$(getent group daemon | cut -d: -f3)" tenant create hup3
stop_daemon
wait "$LPID" 2>/dev/null
grep -q "STOPPING=1" "$T/notify.log" && pass "STOPPING=1 sent" || fail "no STOPPING=1"
grep -q "RELOADING=0" "$T/notify.log" && fail "RELOADING=0 is no sd_notify field" || pass "no RELOADING=0"
cp "$T/conf.good" "$CONF"

# Without --config (as gpushared.service starts it) the daemon reads
# /etc/gpushared.conf if it exists, at start and at SIGHUP alike; where it
# does not, a reload keeps the defaults and still ends with READY=1.
notify_listen "$T/notify2.log"
NOTIFY_SOCKET=$NOTIFY "$GPUSHARED" --foreground --socket "$SOCK" --state-dir "$STATE" \
  >>"$T/daemon.log" 2>&1 &
DPID=$!
for _ in $(seq 100); do ctl version >/dev/null 2>&1 && break; sleep 0.1; done
if [ -e /etc/gpushared.conf ]; then
  hup_notified "SIGHUP without --config (this machine has /etc/gpushared.conf)" ""
else
  hup_notified "SIGHUP without --config and no /etc/gpushared.conf" "nothing changed"
fi
expect_ok "serving after that reload" ctl tenant list
stop_daemon
wait "$LPID" 2>/dev/null

# A stale socket (nobody listening) is replaced.
$PY -c "import socket,sys; s=socket.socket(socket.AF_UNIX); s.bind(sys.argv[1])" "$SOCK"
[ -S "$SOCK" ] && pass "stale socket file made" || fail "could not make a stale socket"
start_daemon
pass "started over a stale socket"
stop_daemon
[ ! -e "$SOCK" ] && pass "socket removed at exit" || fail "socket left behind"

# Socket activation: systemd-socket-activate passes the listening socket.
if command -v systemd-socket-activate >/dev/null; then
  systemd-socket-activate -l "$SOCK" "$GPUSHARED" --foreground --config "$CONF" \
    --state-dir "$STATE" >>"$T/daemon.log" 2>&1 &
  DPID=$!
  ok=0; for _ in $(seq 50); do ctl version >/dev/null 2>&1 && { ok=1; break; }; sleep 0.1; done
  [ $ok = 1 ] && pass "serves on the socket systemd passed" || fail "socket activation"
  grep -q "passed by systemd" "$T/daemon.log" && pass "uses LISTEN_FDS" || fail "did not use LISTEN_FDS"
  expect_ok "state kept across runs" ctl tenant list
  [[ "$LAST_OUT" == *hup3* ]] && pass "tenants from before" || fail "$LAST_OUT"
  stop_daemon
else
  echo "skip - systemd-socket-activate not installed"
fi

# Without --foreground: the starting process returns once the socket answers.
expect_ok "gpushared detaches" "$GPUSHARED" --config "$CONF" --socket "$SOCK" --state-dir "$STATE"
expect_ok "and answers at once" ctl version
pid=$(pgrep -f -- "--state-dir $STATE" | head -1)
[ -n "$pid" ] && kill -TERM "$pid"
for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$pid" 2>/dev/null && fail "detached daemon did not stop" || pass "detached daemon stopped on SIGTERM"
grep -q "serving on" "$STATE/gpushared.log" && pass "detached daemon logs to STATE_DIR/gpushared.log" || fail "no log file"
finish
