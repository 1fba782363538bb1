#!/usr/bin/env bash
# A run-time out-of-memory through the daemon: the cpu device is
# oversubscribed (memory_oversubscribe = yes: two GROWTH vdevs of 100 MiB on
# a device with 120 MiB usable), tenant b's job holds about 60 MiB, and
# tenant a's job, admitted against its own vdev, finds the device full when
# it reserves its memory. a's job must go back to the queue with an OOM
# report of cause PHYSICAL, shown by `gpuctl status`, while b's job runs on
# and succeeds; then a's job, tried again once the memory is there,
# succeeds. The executor's device budget (--device-memory) never lets the
# two vdevs' regions pass the device's usable bytes.
set -u
. "$(dirname "$0")/lib.sh"
need_protoc
sed -i 's/^cpu_memory = .*/cpu_memory = 120MiB/' "$CONF"
echo "memory_oversubscribe = yes" >>"$CONF"
echo "preempt_min_run_s = 0" >>"$CONF"

# job NAME VDEV STEPS: a 784-4096-10 MLP, about 60 MiB planned with Adam
job() { mlp_job "$1" "$2" "$3" 4096 2048 ""; }  # job NAME VDEV STEPS: a 784-4096-10 MLP

start_daemon
expect_ok "devices" ctl --json devices
echo "$LAST_OUT" | json_field "['device'][0]['oversubscribed']" | grep -qx True \
  && pass "the cpu device says it is oversubscribed" || fail "cpu device not oversubscribed: $LAST_OUT"
expect_ok "tenant a" ctl tenant create a --uid 4001
expect_ok "tenant b" ctl tenant create b --uid 4002
expect_ok "vdev b0 (100 MiB, growth)" ctl vdev create b0 --memory 100MiB --compute 50 --policy growth --tenant b
expect_ok "vdev a0 (100 MiB, growth) past the device's 120 MiB: oversubscribed" \
  ctl vdev create a0 --memory 100MiB --compute 50 --policy growth --tenant a
expect_fail "a PREALLOCATE vdev is never oversubscribed" 1 RESOURCE_EXHAUSTED \
  ctl vdev create c0 --memory 100MiB --compute 10 --policy preallocate --tenant a

job long b0 60; job victim a0 5
expect_ok "the plan fits a0's quota" A plan "$T/victim.pb" --vdev a0
expect_ok "b's job" B submit "$T/long.pb"; jb=$(B --json list | json_field "['job'][-1]['id']")
wait_state "$jb" RUNNING && pass "b's job running" || fail "b's job not running"
for _ in $(seq 100); do  # until b's job holds its memory
  m=$(ctl --json status "$jb" | json_field "['job'].get('step',0)"); [ "$m" -ge 1 ] && break; sleep 0.1; done
expect_ok "a's job is admitted against its own vdev" A submit "$T/victim.pb"
ja=$(A --json list | json_field "['job'][-1]['id']")
for _ in $(seq 600); do
  [ "$(A --json status "$ja" | json_field "['job'].get('oom_retries', 0)")" -ge 1 ] && break; sleep 0.1; done
[ "$(A --json status "$ja" | json_field "['job'].get('oom_retries', 0)")" -ge 1 ] &&
  pass "a's job met the full device and was requeued" || fail "a's job never met its OOM"
A logs "$ja" | grep -q "QUEUED: run-time OOM (PHYSICAL): device cpu is held by other vdevs; requeued" &&
  pass "its log says it waits for the device's memory" || fail "log: $(A logs "$ja" | tail -3)"
expect_ok "status of a's job" A status "$ja"
echo "$LAST_OUT" | sed -n '1,40p'
echo "$LAST_OUT" | grep -q "PHYSICAL" && pass "the OOM report says the device (PHYSICAL) ran out" || fail "no PHYSICAL cause: $LAST_OUT"
A --json status "$ja" | json_field "['job']['oom']['bytes']" | grep -qE '^[1-9][0-9]*$' \
  && pass "the report names the bytes asked for" || fail "no bytes in the report"
echo "$LAST_OUT" | grep -q "other vdevs' jobs hold" && pass "and who holds the device" || fail "the report does not say who holds the device"
[ "$(ctl --json status "$jb" | json_field "['job']['state']")" = RUNNING ] \
  && pass "b's job is still running" || fail "b's job stopped with a's OOM"
wait_state "$jb" SUCCEEDED 120 && pass "b's job succeeded beside a's OOM" || fail "b's job did not succeed"
wait_state "$ja" SUCCEEDED 120 && pass "a's job, tried again with the memory back, succeeded" ||
  fail "a's job did not succeed once b's ended"
peak=$(ctl --json status "$jb" | json_field "['job']['epoch'][-1]['peak_memory_bytes']")
$PY -c "import sys; sys.exit(0 if 0 < $peak <= 100*2**20 else 1)" \
  && pass "b's peak $peak stayed within its 100 MiB" || fail "b's peak $peak"

# A job of a higher priority that meets the full device does not wait for
# the device's other jobs to end: once requeued, it preempts b's job (in
# another vdev of the device), runs, and b's job resumes after it.
job long2 b0 400
sed 's/^name: "victim" vdev: "a0"/name: "urgent" vdev: "a0" priority: 9/' "$T/victim.txtpb" >"$T/urgent.txtpb"
protoc --encode=gpushare.v1.JobSpec --proto_path="$PROTO" gpushare.proto <"$T/urgent.txtpb" >"$T/urgent.pb"
chmod 644 "$T/urgent.pb"
expect_ok "b's long job" B submit "$T/long2.pb"; jb=$(B --json list | json_field "['job'][-1]['id']")
for _ in $(seq 300); do
  m=$(ctl --json status "$jb" | json_field "['job'].get('step',0)"); [ "$m" -ge 1 ] && break; sleep 0.1; done
expect_ok "a's priority-9 job" A submit "$T/urgent.pb"; ju=$(A --json list | json_field "['job'][-1]['id']")
wait_state "$ju" SUCCEEDED 120 && pass "a's priority-9 job succeeded" || fail "a's job did not succeed"
wait_state "$jb" SUCCEEDED 180 && pass "b's job resumed and succeeded" || fail "b's job did not finish"
[ "$(ctl --json status "$ju" | json_field "['job'].get('oom_retries', 0)")" -ge 1 ] &&
  pass "a's job met the full device first" || fail "a's job never met the full device"
[ "$(ctl --json status "$jb" | json_field "['job'].get('preemptions', 0)")" = 1 ] &&
  pass "b's job was preempted once" || fail "b's job was not preempted"
ctl logs "$jb" | grep -q "preempted by job $ju (urgent, priority 9" &&
  pass "b's job's log names a's job" || fail "log: $(ctl logs "$jb" | tail -4)"
stop_daemon
finish
