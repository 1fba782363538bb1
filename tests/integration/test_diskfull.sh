#!/usr/bin/env bash
# A full disk under a running daemon: what a client was told is what the
# store keeps. The state directory is a small tmpfs (root only); jobs that
# checkpoint every few steps are watched by `gpuctl watch`, then the disk is
# filled. Their checkpoints fail, so they end FAILED, and the store cannot
# take that either. While it is full, no watcher hears of a state the store
# does not hold, and `gpuctl status` says what the store says. Once space
# returns the held ends go out; after a restart every job is in the state
# its watcher saw and none runs again. A second round kills the daemon
# (kill -9) while the disk is full: the jobs come back in the state clients
# were last told, RUNNING, and resume.
set -u
. "$(dirname "$0")/lib.sh"
need_protoc
command -v sqlite3 >/dev/null || { echo "skip: the sqlite3 CLI is not installed"; exit 77; }
[ "$(id -u)" = 0 ] || { echo "skip: mounting a tmpfs for the state directory needs root"; exit 77; }
mkdir -p "$STATE" && chmod 0700 "$STATE"
mount -t tmpfs -o size=24m,mode=0700 gs-diskfull "$STATE" 2>"$T/mount.err" ||
  { echo "skip: cannot mount a tmpfs: $(cat "$T/mount.err")"; exit 77; }
unmount() { umount -l "$STATE" 2>/dev/null; }
trap 'unmount; cleanup' EXIT

# job NAME: a job that runs until the disk fills (a checkpoint every 50 steps).
job() {
  printf 'name: "%s" vdev: "a0" %s max_steps: 100000000 checkpoint_every_steps: 50\n' "$1" "$LONG_JOB" \
    | protoc --encode=gpushare.v1.JobSpec --proto_path="$PROTO" gpushare.proto >"$T/$1.pb"
  chmod 644 "$T/$1.pb"
}
db_state() {  # db_state ID: the state the store holds, by name
  local s; s=$(sqlite3 "file:$STATE/gpushared.db?mode=ro" "SELECT state FROM jobs WHERE id = $1" 2>/dev/null)
  case "$s" in 0) echo QUEUED ;; 1) echo RUNNING ;; 2) echo SUCCEEDED ;; 3) echo FAILED ;; 4) echo CANCELLED ;; *) echo "?$s" ;; esac
}
seen_state() {  # seen_state ID: the last state job ID's watcher heard
  $PY -c "
import json, sys
s = 'none'
for line in open(sys.argv[1]):
    try: s = json.loads(line)['event']['state']
    except Exception: pass
print(s)" "$T/watch.$1"
}
told_state() { ctl --json status "$1" 2>/dev/null | json_field "['job']['state']" 2>/dev/null; }
step_of() { ctl --json status "$1" 2>/dev/null | json_field "['job'].get('step', 0)" 2>/dev/null; }
fill() { dd if=/dev/zero of="$STATE/filler" bs=64k status=none 2>/dev/null; sync; }
unsaved() { ctl metrics 2>/dev/null | awk '$1 == "gpushare_jobs_unsaved" { print $2 }'; }

# submit_round N: N jobs, each RUNNING past its first checkpoint, watched.
IDS=()
submit_round() {
  IDS=()
  local i out
  for i in $(seq 1 "$1"); do
    job "r$ROUND-$i"
    out=$(A submit "$T/r$ROUND-$i.pb" 2>&1) && [[ "$out" =~ ^job\ ([0-9]+)\ submitted ]] ||
      { fail "round $ROUND: submit: $out"; return 1; }
    IDS+=("${BASH_REMATCH[1]}")
  done
  for id in "${IDS[@]}"; do
    A --json watch "$id" >"$T/watch.$id" 2>/dev/null &
    wait_state "$id" RUNNING 30 >/dev/null || { fail "round $ROUND: job $id did not start"; return 1; }
  done
  for id in "${IDS[@]}"; do
    for _ in $(seq 100); do [ "$(step_of "$id")" -gt 100 ] 2>/dev/null && break; sleep 0.1; done
  done
  pass "round $ROUND: ${#IDS[@]} jobs running, watched: ${IDS[*]}"
}

# compare WHAT: each job's state as its watcher heard it, as status tells it,
# and as the store holds it agree (a watcher that heard nothing final and a
# RUNNING store agree too).
compare() {
  local id seen told db bad=0 detail=
  for id in "${IDS[@]}"; do
    seen=$(seen_state "$id"); told=$(told_state "$id"); db=$(db_state "$id")
    detail+=" $id:$seen/$told/$db"
    if [ "$seen" != "$db" ] && ! { [ "$seen" = none ] && [ "$db" = RUNNING ]; }; then bad=1; fi
    if [ -n "$told" ] && [ "$told" != "$db" ]; then bad=1; fi
  done
  [ $bad = 0 ] && pass "$1: watchers, status and store agree (watch/status/store:$detail)" ||
    fail "$1: watch/status/store disagree:$detail"
}

start_daemon
expect_ok "tenant a" ctl tenant create a --uid 4001
expect_ok "vdev a0" ctl vdev create a0 --memory 256MiB --compute 100 --tenant a

# ---- round 1: fill, free, restart ----------------------------------------------
ROUND=1
submit_round 4
fill
pass "round 1: the state directory is full ($(df -h --output=avail "$STATE" | tail -1 | tr -d ' ') left)"
# Each job fails at its next checkpoint and the store cannot take it.
n=0; for _ in $(seq 100); do n=$(unsaved); [ "${n:-0}" -ge "${#IDS[@]}" ] && break; sleep 0.1; done
[ "${n:-0}" -ge 1 ] && pass "round 1: the store refused $n job state changes (gpushare_jobs_unsaved)" ||
  fail "round 1: no state change was refused by the full store (gpushare_jobs_unsaved ${n:-none}); the test did not test"
grep -q "not on disk yet" "$T/daemon.log" && pass "round 1: the daemon logs the changes it could not store" ||
  fail "round 1: nothing logged as not on disk"
compare "round 1, disk full"
for id in "${IDS[@]}"; do
  [ "$(seen_state "$id")" = RUNNING ] || { fail "round 1: job $id's watcher heard $(seen_state "$id") while the disk was full"; }
done
expect_fail "round 1: a cancel the store cannot take is not acknowledged" 1 "store cannot be written" \
  A cancel "${IDS[0]}"

rm -f "$STATE/filler"
for id in "${IDS[@]}"; do
  for _ in $(seq 100); do [ "$(seen_state "$id")" = RUNNING ] || break; sleep 0.1; done
done
n=$(unsaved)
[ "${n:-1}" = 0 ] && pass "round 1: space back, every record stored (gpushare_jobs_unsaved 0)" ||
  fail "round 1: space back, gpushare_jobs_unsaved ${n:-none}"
compare "round 1, space back"
declare -A SEEN STEP
for id in "${IDS[@]}"; do SEEN[$id]=$(seen_state "$id"); STEP[$id]=$(step_of "$id"); done
stop_daemon
start_daemon
sleep 1
bad=
for id in "${IDS[@]}"; do
  s=$(told_state "$id"); st=$(step_of "$id")
  [ "$s" = "${SEEN[$id]}" ] && [ "$st" = "${STEP[$id]}" ] || bad+=" $id: seen ${SEEN[$id]} at step ${STEP[$id]}, now $s at step $st;"
done
[ -z "$bad" ] && pass "round 1, restarted: every job is as its watcher saw it, none runs again" ||
  fail "round 1, restarted:$bad"

# ---- round 2: fill, kill -9, free, restart -----------------------------------
ROUND=2
submit_round 3
fill
n=0; for _ in $(seq 100); do n=$(unsaved); [ "${n:-0}" -ge "${#IDS[@]}" ] && break; sleep 0.1; done
compare "round 2, disk full"
kill9_daemon
wait 2>/dev/null
rm -f "$STATE/filler"
start_daemon
resumed=0
for id in "${IDS[@]}"; do
  s=$(seen_state "$id")
  [ "$s" = RUNNING ] || fail "round 2: job $id's watcher heard $s before the kill"
  if w=$(wait_state "$id" RUNNING 30); then resumed=$((resumed + 1))
  else echo "# $w; its log:"; A logs "$id" 2>&1 | tail -n 5 | sed 's/^/#   /'; fi
done
[ $resumed = "${#IDS[@]}" ] && pass "round 2: after kill -9 and a restart, the jobs are RUNNING, as clients were told, and resume" ||
  fail "round 2: $resumed of ${#IDS[@]} jobs RUNNING after the restart"
for id in "${IDS[@]}"; do A cancel "$id" >/dev/null 2>&1; done
ok=0; for id in "${IDS[@]}"; do
  if w=$(wait_state "$id" CANCELLED 30); then ok=$((ok + 1)); else echo "# $w"; fi; done
[ $ok = "${#IDS[@]}" ] && pass "round 2: cancelled, and stored so" || fail "round 2: $ok of ${#IDS[@]} cancelled"
stop_daemon
finish
