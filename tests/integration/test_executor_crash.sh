#!/usr/bin/env bash
# A crash inside a kernel never takes the control plane down. The executor's
# failpoint (GPUSHARE_EXECUTOR_FAILPOINT=kernel-crash:crasher:40) makes the
# 40th dense_forward of the job named "crasher" raise SIGSEGV inside the op.
# Tenant b's job runs beside it with checkpoints. Expected: the executor dies
# and is restarted; b's job resumes from its checkpoint (not from step 0),
# uncharged, and succeeds; the crasher, which brings the executor down a
# second time when it resumes, fails with the reason; a watcher and a client
# polling status throughout see no error; gpushared itself never restarts.
# Then an executor killed from outside (kill -9) is restarted too and the
# job it ran resumes. The crash file (STATE/executor-cpu.crash) exists only
# between a crash and the control plane's reading of it: a running or
# cleanly stopped executor leaves none.
set -u
. "$(dirname "$0")/lib.sh"
need_protoc
executor_pid() { pgrep -f "gpushare-executor --device cpu .*$STATE" | head -n 1; }

export GPUSHARE_EXECUTOR_FAILPOINT=kernel-crash:crasher:40
start_daemon
unset GPUSHARE_EXECUTOR_FAILPOINT
expect_ok "tenant a" ctl tenant create a --uid 4001
expect_ok "tenant b" ctl tenant create b --uid 4002
expect_ok "vdev a0" ctl vdev create a0 --memory 256MiB --compute 50 --tenant a
expect_ok "vdev b0" ctl vdev create b0 --memory 256MiB --compute 50 --tenant b
[ ! -e "$STATE/executor-cpu.crash" ] && pass "a running executor leaves no crash file" ||
  fail "a crash file exists before any crash: $(ls -l "$STATE/executor-cpu.crash")"
mlp_job steady b0 3000; mlp_job crasher a0 400
expect_ok "b's job" B submit "$T/steady.pb"; jb=$(B --json list | json_field "['job'][-1]['id']")
wait_state "$jb" RUNNING || fail "b's job not running"
B watch "$jb" >"$T/watch.out" 2>&1 & WPID=$!
# A client polling throughout; it records every failure.
( while [ ! -f "$T/stop-poll" ]; do ctl status "$jb" >/dev/null 2>>"$T/poll.err" || echo fail >>"$T/poll.fails"; sleep 0.05; done ) & PPID_=$!
for _ in $(seq 300); do [ "$(st "$jb" ".get('step',0)")" -ge 60 ] && break; sleep 0.1; done
x1=$(executor_pid)
expect_ok "the crasher is admitted" A submit "$T/crasher.pb"; jc=$(A --json list | json_field "['job'][-1]['id']")
wait_state "$jc" FAILED 120 && pass "the crasher failed" || fail "the crasher did not fail"
reason=$(st "$jc" "['reason']")
echo "reason: $reason"
echo "$reason" | grep -q "crashed the executor of cpu twice" && pass "its reason says it crashed the executor twice" || fail "reason: $reason"
grep -q "the executor of cpu died in job $jc's thread" "$T/daemon.log" &&
  pass "the crash report named the crasher (job $jc)" || fail "no crash report named job $jc"
for _ in $(seq 100); do x2=$(executor_pid); [ -n "$x2" ] && break; sleep 0.1; done
[ ! -e "$STATE/executor-cpu.crash" ] && pass "the crash report was read and removed" ||
  fail "the crash file is still there: $(ls -l "$STATE/executor-cpu.crash")"
[ -n "$x2" ] && [ "$x1" != "$x2" ] && pass "the executor was restarted (pid $x1 -> $x2)" || fail "executor pids $x1 / $x2"
for _ in $(seq 100); do grep -q "job $jb: resumed from step [1-9]" "$T/daemon.log" && break; sleep 0.1; done
grep -q "job $jb: resumed from step [1-9]" "$T/daemon.log" && pass "b's job resumed from a checkpoint: $(grep -o "job $jb: resumed from step [0-9]*" "$T/daemon.log" | tail -n 1)" || { fail "b's job did not resume from a checkpoint"; grep -E "job $jb|resum" "$T/daemon.log" | grep -v debug | head; }
[ "$(st "$jb" "['state']")" = RUNNING ] && pass "b's job runs on" || fail "b's job is $(st "$jb" "['state']")"

# --- an executor killed from outside ------------------------------------------
for _ in $(seq 100); do x2=$(executor_pid); [ -n "$x2" ] && break; sleep 0.1; done
before=$(st "$jb" ".get('step',0)")
kill -KILL "$x2" && pass "kill -9 the executor (pid $x2) at b's step $before"
wait_state "$jb" SUCCEEDED 180 && pass "b's job succeeded through three executor deaths" || fail "b's job did not succeed"
r=$(st "$jb" ".get('restarts',0)"); [ "$r" = 3 ] && pass "b's job counts 3 restarts" || fail "b's restarts: $r"
wait "$WPID"; wrc=$?
[ "$wrc" = 0 ] && pass "the watcher ran through every crash and exited 0 with the job" || { fail "watch exited $wrc"; tail -n 5 "$T/watch.out"; }
grep -qi "error" "$T/watch.out" && fail "the watcher printed an error: $(grep -i error "$T/watch.out" | head -n 2)" || pass "the watcher saw no error"
touch "$T/stop-poll"; wait "$PPID_"
[ ! -s "$T/poll.fails" ] && pass "every status poll during the crashes was answered" || fail "$(wc -l <"$T/poll.fails") polls failed: $(head -n 2 "$T/poll.err")"
kill -0 "$DPID" && pass "gpushared (pid $DPID) never went down" || fail "gpushared died"
expect_ok "metrics count the restarts" ctl metrics
echo "$LAST_OUT" | grep -qE '^gpushare_executor_restarts_total\{device="cpu"\} 3$' && pass "executor_restarts_total 3" || fail "$(echo "$LAST_OUT" | grep executor_restarts)"
stop_daemon
[ ! -e "$STATE/executor-cpu.crash" ] && pass "a clean stop leaves no crash file" ||
  fail "a clean stop left $(ls -l "$STATE/executor-cpu.crash")"
finish
