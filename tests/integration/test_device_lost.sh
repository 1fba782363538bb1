#!/usr/bin/env bash
# A lost device (a CUDA sticky error: a kernel fault raises no signal, and
# every later call of the process fails) ends the executor, naming the job
# whose step raised it; the control plane restarts the executor and the
# other job resumes from its checkpoint. The executor's failpoint
# GPUSHARE_EXECUTOR_FAILPOINT=device-fault:faulter:40 makes the 40th
# dense_forward of the job named "faulter" fault the device (on the cpu
# device the op answers -ENOTRECOVERABLE, as the CUDA checker does for a
# sticky error; tests/gpu/check.sh runs the same on a GPU with a real
# illegal-address fault). Expected: b's job resumes from a checkpoint,
# uncharged, and succeeds; the faulter, which loses the device again when
# it resumes, fails charged with both; gpushared never goes down.
set -u
. "$(dirname "$0")/lib.sh"
need_protoc

export GPUSHARE_EXECUTOR_FAILPOINT=device-fault:faulter:40
start_daemon
unset GPUSHARE_EXECUTOR_FAILPOINT
expect_ok "tenant a" ctl tenant create a --uid 4001
expect_ok "tenant b" ctl tenant create b --uid 4002
expect_ok "vdev a0" ctl vdev create a0 --memory 256MiB --compute 50 --tenant a
expect_ok "vdev b0" ctl vdev create b0 --memory 256MiB --compute 50 --tenant b
mlp_job steady b0 1500; mlp_job faulter a0 400
expect_ok "b's job" B submit "$T/steady.pb"; jb=$(B --json list | json_field "['job'][-1]['id']")
wait_state "$jb" RUNNING || fail "b's job not running"
for _ in $(seq 300); do [ "$(st "$jb" ".get('step',0)")" -ge 60 ] && break; sleep 0.1; done
expect_ok "the faulter is admitted" A submit "$T/faulter.pb"; jf=$(A --json list | json_field "['job'][-1]['id']")
wait_state "$jf" FAILED 120 && pass "the faulter failed" || fail "the faulter did not fail"
grep -q "device cpu lost in job $jf's step" "$T/daemon.log" &&
  pass "the executor said the device was lost in job $jf's step" ||
  fail "no device-lost line for job $jf: $(grep -i lost "$T/daemon.log" | head -n 3)"
grep -q "the executor of cpu died in job $jf's thread" "$T/daemon.log" &&
  pass "the control plane charged the faulter (job $jf)" || fail "the faulter was not named"
reason=$(st "$jf" "['reason']")
echo "$reason" | grep -q "crashed the executor of cpu twice" && pass "its reason: $reason" || fail "reason: $reason"
wait_state "$jb" SUCCEEDED 180 && pass "b's job succeeded" || fail "b's job did not succeed"
# b's job may be requeued after the faulter's end, so its resume line is
# looked for once it has succeeded.
grep -q "job $jb: resumed from step [1-9]" "$T/daemon.log" &&
  pass "b's job resumed from a checkpoint: $(grep -o "job $jb: resumed from step [0-9]*" "$T/daemon.log" | tail -n 1)" ||
  fail "b's job did not resume from a checkpoint"
r=$(st "$jb" ".get('restarts',0)"); [ "$r" = 2 ] && pass "b's job counts 2 restarts, uncharged" || fail "b's restarts: $r"
kill -0 "$DPID" && pass "gpushared (pid $DPID) never went down" || fail "gpushared died"
stop_daemon
finish
