#!/usr/bin/env bash
# Elastic sharing through a real daemon, as tenants and admins see it in
# gpuctl: a priority-9 job preempts a running priority-0 job on a full vdev
# and the preempted one resumes and ends with the same weights, bit for bit,
# as an uninterrupted run; a vdev shrunk under a running auto_fit job goes on
# with a smaller micro-batch and the allocator's peak stays under the new
# limit, and a job without auto_fit waits PREEMPTED until a grow starts it
# again; a run-time OOM of an auto_fit job is come back from.
set -u
. "$(dirname "$0")/lib.sh"
need_protoc
cat >>"$CONF" <<CONF
preempt_min_run_s = 0
CONF
# oom: every run of the job named "oomer" that plans more than 10,300,000
# bytes gets an allocator of that size (between its micro-batch 32 and 64
# plans below), as if its vdev had shrunk under it.
export GPUSHARE_EXECUTOR_FAILPOINT=oom:oomer:10300000
start_daemon
unset GPUSHARE_EXECUTOR_FAILPOINT
OUTD=$T/out; mkdir -p "$OUTD"; chmod 777 "$OUTD"   # where the tenant writes fetched files
expect_ok "tenant a" ctl tenant create a --uid 4001
expect_ok "vdev a0" ctl vdev create a0 --memory 1GiB --compute 50 --policy growth --tenant a
# job NAME EXTRA: a dense net on a small synthetic set (all jobs share it,
# so its 2 MiB are charged to the vdev once).
job() { printf '%s\n' "name: \"$1\" vdev: \"a0\" seed: 3 epochs: 100 checkpoint_every_steps: 50
model { input { height: 16 width: 16 channels: 1 } layer { flatten {} }
  layer { dense { units: 2048 activation: RELU } } layer { dense { units: 4 } } }
train { synthetic { examples: 8192 seed: 5 classes: 4 } } test { synthetic { examples: 256 seed: 5 classes: 4 } }
optimizer { adam { learning_rate: 0.001 } } $2" |
    protoc --encode=gpushare.v1.JobSpec --proto_path="$PROTO" gpushare.proto >"$T/$1.pb"
  chmod 644 "$T/$1.pb"; }
submit() { local out; out=$(A submit "$T/$1.pb" 2>&1)
  [[ "$out" =~ ^job\ ([0-9]+)\ submitted ]] && echo "${BASH_REMATCH[1]}" || { echo "submit $1: $out" >&2; echo 0; }; }
field() { A --json status "$1" | json_field "['job']$2"; }
steps_at_least() { for _ in $(seq 600); do [ "$(field "$1" ".get('step', 0)")" -ge "$2" ] && return 0; sleep 0.05; done; return 1; }

job low "batch_size: 32 max_steps: 1200"
job high "batch_size: 32 max_steps: 100 priority: 9"
job fit "batch_size: 64 max_steps: 2000 auto_fit: true"
job oomer "batch_size: 64 max_steps: 200 auto_fit: true"
plan() { A --json plan "$T/$1.pb" | json_field "['plan']['$2']"; }
peak32=$(plan low peak_bytes); peak64=$(plan fit peak_bytes); data=$(plan low data_bytes)
echo "# planned peaks: micro-batch 32 $peak32, 64 $peak64; data $data"
[ "$peak32" -lt 10300000 ] && [ "$peak64" -gt 10300000 ] && pass "the failpoint's 10,300,000 bytes lie between the micro-batch 32 and 64 plans" ||
  fail "plans moved: 32 -> $peak32, 64 -> $peak64 (the failpoint wants them around 10,300,000)"

# --- preemption ---------------------------------------------------------------
# Room for one job and a half: the priority-9 job cannot start beside the other.
full=$((data + peak32 + peak32 / 2))
expect_ok "the vdev shrinks to $full bytes while idle" ctl vdev set a0 --memory "$full"
lo=$(submit low)
steps_at_least "$lo" 120 && pass "job $lo (priority 0) runs" || fail "job $lo did not run"
hi=$(submit high)
for _ in $(seq 600); do [ "$(field "$lo" ".get('preemptions', 0)")" -ge 1 ] && break; sleep 0.05; done
[ "$(field "$lo" ".get('preemptions', 0)")" -ge 1 ] && pass "job $lo is preempted for job $hi" ||
  fail "job $lo was not preempted"
A logs "$lo" | grep -q "PREEMPTED: preempted by job $hi (high, priority 9 over its 0).*checkpointed at step" &&
  pass "its log has PREEMPTED, job $hi and the checkpoint" || fail "log: $(A logs "$lo" | tail -3)"
wait_state "$hi" SUCCEEDED 120 && pass "job $hi SUCCEEDED" || fail "job $hi did not succeed"
wait_state "$lo" SUCCEEDED 180 && pass "job $lo resumed and SUCCEEDED" || fail "job $lo did not finish"
[ "$(field "$lo" "['preemptions']")" = 1 ] && pass "its record counts 1 preemption" || fail "preemptions: $(field "$lo" ".get('preemptions')")"
[ "$(field "$lo" "['usage'].get('preemptions', 0)")" = 1 ] && pass "its usage counts the preemption" ||
  fail "usage: $(field "$lo" ".get('usage')")"
A logs "$lo" >"$T/low.log"
grep -q "PREEMPTED" "$T/low.log" && grep -q "resuming from its checkpoint" "$T/low.log" &&
  pass "its log has the preemption and the resume" || fail "log: $(tail -5 "$T/low.log")"
ctl metrics >"$T/m.txt"
grep -q 'gpushare_job_preemptions_total{vdev="a0"} 1' "$T/m.txt" && pass "metrics count the preemption" ||
  fail "metrics: $(grep preemptions "$T/m.txt")"
expect_ok "fetch the preempted job's weights" A fetch "$lo" -o "$OUTD/low.safetensors"
ref=$(submit low)
wait_state "$ref" SUCCEEDED 180 && pass "the same job uninterrupted (job $ref)" || fail "job $ref did not finish"
[ "$(field "$ref" ".get('preemptions', 0)")" = 0 ] && pass "job $ref was not preempted" || fail "job $ref was preempted"
expect_ok "fetch its weights" A fetch "$ref" -o "$OUTD/ref.safetensors"
cmp -s "$OUTD/low.safetensors" "$OUTD/ref.safetensors" && pass "the preempted job's weights are bit-identical to the uninterrupted run's" ||
  fail "the weights differ after preemption"

# --- live shrink ----------------------------------------------------------------
expect_ok "the vdev grows to 16 MiB" ctl vdev set a0 --memory 16MiB
fit=$(submit fit)
steps_at_least "$fit" 100 && pass "job $fit runs at micro-batch 64" || fail "job $fit did not run"
expect_fail "a shrink below what its jobs need at micro-batch 1 is refused" 1 "even at micro-batch 1" \
  ctl vdev set a0 --memory 1MiB
[ "$(ctl --json vdev list | json_field "['vdev'][0]['memory_limit']")" = 16777216 ] && pass "the refused shrink changed nothing" || fail "limit changed"
waiter=$(submit fit)
[ "$(field "$waiter" "['state']")" = QUEUED ] && pass "job $waiter waits behind it" || fail "job $waiter: $(field "$waiter" "['state']")"
small=$((data + peak32 + (peak64 - peak32) / 2))
expect_ok "shrink to $small bytes under the running job" ctl vdev set a0 --memory "$small"
echo "$LAST_OUT"
[[ "$LAST_OUT" == *"re-planned from micro-batch 64 x 1 to 32 x 2"* ]] && pass "gpuctl says it is re-planned to 32 x 2" || fail "vdev set said: $LAST_OUT"
[[ "$LAST_OUT" == *"job $waiter (QUEUED): re-planned from micro-batch 64 x 1 to 32 x 2"* ]] &&
  pass "and the queued job $waiter is re-planned too" || fail "vdev set said: $LAST_OUT"
wait_state "$fit" SUCCEEDED 180 && pass "job $fit SUCCEEDED" || fail "job $fit did not finish"
wait_state "$waiter" SUCCEEDED 180 && pass "job $waiter SUCCEEDED after it" || fail "job $waiter did not finish"
[ "$(field "$fit" "['micro_batch']")" = 32 ] && [ "$(field "$fit" "['accumulation_steps']")" = 2 ] &&
  pass "it ended at micro-batch 32 x 2 (effective batch 64 kept)" || fail "batch: $(field "$fit" "['micro_batch']") x $(field "$fit" "['accumulation_steps']")"
vpeak=$(ctl --json vdev list | json_field "['vdev'][0]['memory_peak']")
[ "$vpeak" -le "$small" ] && pass "the allocator's peak since the shrink ($vpeak) is within the new limit ($small)" ||
  fail "peak $vpeak passed the limit $small"
tpeak=$(A --json memory "$fit" | json_field "['timeline']['peak_bytes']")
[ "$tpeak" -le "$small" ] && pass "the job's measured peak after the shrink ($tpeak) is within it" || fail "job peak $tpeak"
A logs "$fit" | grep -q "shrunk.*resuming with micro-batch 32 x 2" && pass "its log says why and how it goes on" || fail "no re-plan in its log"

# --- a shrink without auto_fit, and a grow that starts what now fits --------------
expect_ok "the vdev grows to 16 MiB" ctl vdev set a0 --memory 16MiB
fixed=$(submit low)
steps_at_least "$fixed" 60 && pass "job $fixed (no auto_fit) runs" || fail "job $fixed did not run"
tight=$((data + peak32 - 262144))
expect_ok "shrink to $tight bytes: below its plan" ctl vdev set a0 --memory "$tight"
[[ "$LAST_OUT" == *"job $fixed: checkpointed and requeued PREEMPTED (no auto_fit)"* ]] &&
  pass "gpuctl says it is checkpointed and requeued" || fail "vdev set said: $LAST_OUT"
wait_state "$fixed" PREEMPTED 60 && pass "job $fixed waits PREEMPTED" || fail "job $fixed is not PREEMPTED"
[[ "$(field "$fixed" "['reason']")" == *"shrunk"*"no auto_fit"*checkpointed* ]] &&
  pass "its reason says the vdev shrank and where it stopped" || fail "reason: $(field "$fixed" "['reason']")"
sleep 1
[ "$(field "$fixed" "['state']")" = PREEMPTED ] && pass "it stays PREEMPTED while it cannot fit" || fail "job $fixed: $(field "$fixed" "['state']")"
expect_ok "the vdev grows back to 16 MiB" ctl vdev set a0 --memory 16MiB
for _ in $(seq 100); do [ "$(field "$fixed" "['state']")" != PREEMPTED ] && break; sleep 0.05; done
[ "$(field "$fixed" "['state']")" != PREEMPTED ] && pass "the grow starts it at once" || fail "job $fixed still waits"
wait_state "$fixed" SUCCEEDED 180 && pass "job $fixed resumed and SUCCEEDED" || fail "job $fixed did not finish"

# --- OOM recovery ---------------------------------------------------------------
oo=$(submit oomer)
wait_state "$oo" SUCCEEDED 600 && pass "job $oo came back from its run-time OOM and SUCCEEDED" || fail "job $oo: $(field "$oo" ".get('reason')")"
[ "$(field "$oo" "['oom_retries']")" = 1 ] && pass "one OOM come back from" || fail "oom_retries: $(field "$oo" ".get('oom_retries')")"
[ "$(field "$oo" "['micro_batch']")" = 32 ] && pass "at micro-batch 32 x 2" || fail "micro-batch $(field "$oo" "['micro_batch']")"
[ "$(field "$oo" "['oom']['cause']")" = QUOTA ] && pass "its OOM report (QUOTA) is kept" || fail "no OOM report kept"
A logs "$oo" | grep -q "run-time OOM (QUOTA) at micro-batch 64: resuming from its last checkpoint with micro-batch 32 x 2" &&
  pass "its log says what happened" || fail "log: $(A logs "$oo" | tail -3)"

# --- a clean stop and start under a running job: both in its log ------------------
cl=$(submit low)
steps_at_least "$cl" 60 && pass "job $cl runs" || fail "job $cl did not run"
stop_daemon
start_daemon
wait_state "$cl" SUCCEEDED 600 && pass "job $cl resumed after the restart and SUCCEEDED" || fail "job $cl did not finish"
A logs "$cl" >"$T/cl.log"
grep -q "gpushared is stopping: checkpointed at step" "$T/cl.log" &&
  grep -q "gpushared started again: resuming from the checkpoint written when it stopped" "$T/cl.log" &&
  pass "its log has gpushared's stop and start" || fail "log: $(tail -5 "$T/cl.log")"
stop_daemon
finish
