#!/usr/bin/env bash
# Every client-facing limit of gpushared, with small values: max_connections
# (the ones past it wait and are served, the daemon's descriptors stay
# bounded), max_inflight (reading stops until answers go out), max_frame
# (and a SIGHUP reload that changes it, for open connections too),
# idle_timeout_s (an idle connection closes, a watching one does not),
# max_tenant_datasets and max_job_spec (refused, naming the limit, changing
# nothing). Times are checked with wide margins only.
set -u
. "$(dirname "$0")/lib.sh"
need_protoc
[ "$(id -u)" -eq 0 ] || { echo "skip: needs root (clients act as tenant uids)"; exit 77; }

L() { $PY "$HERE/limits_client.py" "$@"; }
R() { $PY "$HERE/rawframe.py" "$SOCK" "$@"; }
val() { sed -n "s/.*\b$1=\([^ ]*\).*/\1/p" <<<"$2" | head -n1; }   # val KEY OUTPUT
wait_state() {  # wait_state ID STATE
  local s; for _ in $(seq 600); do
    s=$(A --json status "$1" 2>/dev/null | json_field "['job']['state']" 2>/dev/null)
    [ "$s" = "$2" ] && return 0; sleep 0.1; done
  echo "job $1 is $s, not $2"; return 1; }
reloads() { grep -c "configuration reloaded" "$T/daemon.log"; }
reload() {  # reload: SIGHUP, and wait until the daemon says it applied the file
  local n; n=$(reloads); kill -HUP "$DPID"
  for _ in $(seq 100); do [ "$(reloads)" -gt "$n" ] && return 0; sleep 0.1; done
  fail "SIGHUP: no \"configuration reloaded\" in the log"; }

cat >>"$CONF" <<CONF
cpu_threads = 1
max_connections = 8
admin_reserved_connections = 2
max_inflight = 4
idle_timeout_s = 0
max_frame = 2MiB
max_tenant_datasets = 1MiB
max_job_spec = 4KiB
CONF
start_daemon
expect_ok "tenant a (one job at a time)" ctl tenant create a --uid 4001 --max-running 1
expect_ok "vdev a0" ctl vdev create a0 --memory 256MiB --compute 50 --policy growth --tenant a
printf '%s\n' "name: \"long\" vdev: \"a0\" $LONG_JOB seed: 1" \
  'optimizer { adam { learning_rate: 0.003 } }' >"$T/long.txtpb"
protoc --encode=gpushare.v1.JobSpec --proto_path="$PROTO" gpushare.proto <"$T/long.txtpb" >"$T/long.pb"
chmod 644 "$T/long.pb"
# One job runs for as long as the test needs; the ones behind it stay QUEUED:
# jobs to watch that do not end on their own (LONG_JOB, lib.sh).
expect_ok "submit a job that runs until cancelled" A submit "$T/long.pb"
run_id=$(A --json list | json_field "['job'][-1]['id']")
wait_state "$run_id" RUNNING && pass "job $run_id runs" || fail "job $run_id does not run"
queued() { A submit "$T/long.pb" >/dev/null && A --json list | json_field "['job'][-1]['id']"; }

# --- max_connections = 8 ------------------------------------------------------
out=$(L conns "$SOCK" "$DPID" 20 8 2>&1); echo "$out"
[ "$(val answered_first "$out")" = 8 ] && pass "20 clients connect (none refused), 8 are served while all stay" \
  || fail "max_connections: $out"
base=$(val fds_base "$out"); peak=$(val fds_peak "$out")
[ -n "$base" ] && [ -n "$peak" ] && [ "$peak" -le $((base + 8 + 1)) ] \
  && pass "daemon descriptors: $base with no client, $peak with 20 connected (bound: $((base + 9)))" \
  || fail "daemon descriptors: $base -> $peak with 20 clients: $out"
[ "$(val answered_total "$out")" = 20 ] && pass "the 12 that waited are served as the first ones hang up" \
  || fail "waiting clients not served: $out"
grep -q "warn: 8 connections open (max_connections 8): accepting paused" "$T/daemon.log" \
  && pass "the pause is logged, with the count" || fail "no \"accepting paused\" warning in the log"
[ "$(grep -c "warn: .*accepting paused" "$T/daemon.log")" -eq 1 ] && pass "logged once, not once per client" \
  || fail "$(grep -c "accepting paused" "$T/daemon.log") pause lines in the log"
expect_ok "gpuctl served afterwards" ctl version

# --- max_inflight = 4 ---------------------------------------------------------
out=$(L pipeline "$SOCK" 50 2>&1); echo "$out"
[ "$out" = "answers=50 in_order=1" ] && pass "50 requests in one write: every answer, in order" || fail "pipeline: $out"
grep -q "requests in flight (max_inflight): reading paused" "$T/daemon.log" \
  && pass "reading paused at 4 in flight (logged at debug)" || fail "no max_inflight pause in the log"
j=$(queued)
out=$(L inflight "$SOCK" 4001 "$j" 2>&1); echo "$out"
[ "$(val version_before_watches_end "$out")" = 0 ] \
  && pass "4 watches streaming: a 5th request waits (not read, not refused)" || fail "inflight: $out"
[ "$(val order "$out")" = "final1,final2,final3,final4,answer5" ] || [ "$(val order "$out")" = "final4,final3,final2,final1,answer5" ] \
  && pass "it is answered once the watches end" || fail "inflight order: $out"

# --- max_tenant_datasets = 1MiB -----------------------------------------------
mkdir -p "$T/files"; chmod 755 "$T/files"
$PY "$HERE/idxfile.py" "$T/files/d1" 803 600 32 32 --seed 1
$PY "$HERE/idxfile.py" "$T/files/d2" 803 600 32 32 --seed 2
chmod 644 "$T/files/"*
expect_ok "a 600 KiB dataset fits" A dataset add d1 "$T/files/d1"
before=$(A --json dataset list)
expect_fail "a second 600 KiB dataset passes max_tenant_datasets" 1 \
  "tenant a holds 600.02 KiB in datasets; dataset d2 (600.02 KiB) would take it past 1.00 MiB (max_tenant_datasets)" \
  A dataset add d2 "$T/files/d2"
[[ "$LAST_OUT" == *RESOURCE_EXHAUSTED* && "$LAST_OUT" == *upload_dataset.total_bytes* ]] \
  && pass "RESOURCE_EXHAUSTED, field upload_dataset.total_bytes" || fail "quota refusal: $LAST_OUT"
[ "$(A --json dataset list)" = "$before" ] && pass "dataset list unchanged" || fail "dataset list changed"
[ -z "$(ls -A "$STATE/uploads")" ] && pass "no upload left behind" || fail "uploads left: $(ls "$STATE/uploads")"

# --- max_job_spec = 4KiB ------------------------------------------------------
big=$(head -c 5000 /dev/zero | tr '\0' 'n')
out=$(R --as-uid 4001 --text "id: 2 submit { spec { name: \"$big\" vdev: \"a0\" } }" 2>&1)
[[ "$out" == *"code=INVALID_ARGUMENT field=submit.spec"*"KiB (50"*" bytes); this daemon takes job specs of at most 4.00 KiB (max_job_spec)"* ]] \
  && pass "submit: a 5 KiB spec is refused, naming submit.spec, its size and the limit" || fail "submit spec: $out"
out=$(R --as-uid 4001 --text "id: 2 plan { spec { name: \"$big\" } vdev: \"a0\" }" 2>&1)
[[ "$out" == *"code=INVALID_ARGUMENT field=plan.spec"*"(max_job_spec)"* ]] \
  && pass "plan: the same" || fail "plan spec: $out"
n_jobs=$(ctl --json list --all | json_field "['job'].__len__()")
[ "$n_jobs" = 2 ] && pass "no job was added" || fail "$n_jobs jobs"

# --- max_frame: 2 MiB, then 4 MiB after SIGHUP --------------------------------
out=$(L frame "$SOCK" 3145728 2>&1)
[[ "$out" == frame=CLOSED* ]] && pass "a 3 MiB frame is over max_frame = 2 MiB: connection closed" || fail "3 MiB frame: $out"
grep -q "longer than 2097152 bytes (max_frame)" "$T/daemon.log" && pass "logged with the limit" || fail "no max_frame log line"
out=$(L frame "$SOCK" 1048576 2>&1)
[[ "$out" == "frame=OK id=7"* ]] && pass "a 1 MiB frame is served" || fail "1 MiB frame: $out"
L frame "$SOCK" 3145728 --hold "$T/go" >"$T/held.out" 2>&1 &
hpid=$!
sleep 0.5
sed -i 's/^max_frame = .*/max_frame = 4MiB/' "$CONF"
reload
touch "$T/go"; wait "$hpid"
out=$(cat "$T/held.out")
[[ "$out" == "frame=OK id=7"* ]] && pass "after SIGHUP (max_frame = 4 MiB): 3 MiB on a connection opened before" || fail "held 3 MiB frame: $out"
out=$(L frame "$SOCK" 3145728 2>&1)
[[ "$out" == "frame=OK id=7"* ]] && pass "and on a new one" || fail "new 3 MiB frame: $out"
out=$(L frame "$SOCK" 5242880 2>&1)
[[ "$out" == frame=CLOSED* ]] && pass "5 MiB is still over it" || fail "5 MiB frame: $out"

# --- idle_timeout_s = 2 (live) ------------------------------------------------
sed -i 's/^idle_timeout_s = .*/idle_timeout_s = 2/' "$CONF"
reload
j=$(queued)
out=$(L idle "$SOCK" 4001 "$j" 2>&1); echo "$out"
t_idle=$(val idle_closed_after "$out")
$PY -c "import sys; sys.exit(0 if 2 <= float('$t_idle') <= 10 else 1)" 2>/dev/null \
  && pass "a connection with nothing in flight is closed after ${t_idle} s (2..10)" || fail "idle: $out"
[ "$(val watch_open_after_idle "$out")" = 1 ] && pass "the one with a watch streaming is not" || fail "watch closed: $out"
t_w=$(val watch_closed_after_final "$out")
$PY -c "import sys; sys.exit(0 if 2 <= float('$t_w') <= 10 else 1)" 2>/dev/null \
  && pass "once the watch ends, it is idle too: closed ${t_w} s after the final event" || fail "watch idle: $out"
grep -q "idle for 2 s (idle_timeout_s)" "$T/daemon.log" && pass "idle closes are logged at debug" || fail "no idle log line"

expect_ok "cancel the running job" A cancel "$run_id"
expect_ok "gpuctl still served" ctl version
stop_daemon
finish
