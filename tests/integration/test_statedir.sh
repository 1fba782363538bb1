#!/usr/bin/env bash
# The state directory belongs to one daemon: a second gpushared started on a
# directory a running one holds (with another socket) refuses to start,
# naming the holder, and the first one goes on serving; once the first has
# stopped, the directory can be taken again. The directory is made private
# (0700) when it was open to others, and the database and its -wal and -shm
# files are 0600, also when an earlier run left them open to others.
set -u
. "$(dirname "$0")/lib.sh"

mkdir -p "$STATE" && chmod 0755 "$STATE"
start_daemon
expect_ok "the first daemon serves" ctl tenant create first --uid 4101

# A second daemon, another socket, the same state directory.
timeout 20 "$GPUSHARED" --foreground --config "$CONF" --socket "$T/second.sock" --state-dir "$STATE" \
  >"$T/second.log" 2>&1
rc=$?
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && pass "a second gpushared on the same state directory refuses to start (exit $rc)" ||
  fail "second gpushared: exit $rc: $(tail -3 "$T/second.log")"
grep -q "held by another gpushared (pid $DPID" "$T/second.log" &&
  pass "it names the holder: $(grep -o 'held by another gpushared (pid [0-9]*' "$T/second.log")" ||
  fail "the refusal does not name pid $DPID: $(tail -3 "$T/second.log")"
[ ! -S "$T/second.sock" ] && pass "the second daemon left no socket" || fail "a socket $T/second.sock exists"
expect_ok "the first daemon still serves" ctl tenant list
echo "$LAST_OUT" | grep -q first && pass "with its state" || fail "tenant list: $LAST_OUT"

mode=$(stat -c %a "$STATE")
[ "$mode" = 700 ] && pass "the state directory was made private (0755 -> 0700)" || fail "state directory mode $mode"
for f in gpushared.db gpushared.db-wal gpushared.db-shm; do
  mode=$(stat -c %a "$STATE/$f")
  [ "$mode" = 600 ] && pass "$f is 0600" || fail "$f mode $mode"
done

kill9_daemon   # leaves the -wal and -shm files behind
chmod 0644 "$STATE/gpushared.db" "$STATE/gpushared.db-wal" "$STATE/gpushared.db-shm"
umask 022
start_daemon
for f in gpushared.db gpushared.db-wal gpushared.db-shm; do
  mode=$(stat -c %a "$STATE/$f")
  [ "$mode" = 600 ] && pass "$f left 0644 by an earlier run is 0600 again" || fail "$f mode $mode after a restart"
done
stop_daemon
start_daemon
expect_ok "after a stop, a daemon takes the directory again, state kept" ctl tenant list
echo "$LAST_OUT" | grep -q first && pass "tenant first is still there" || fail "tenant list: $LAST_OUT"
stop_daemon
finish
