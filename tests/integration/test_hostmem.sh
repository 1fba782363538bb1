#!/usr/bin/env bash
# Host memory for data: jobs on the same dataset share one copy of it in
# their executor. Six jobs train at once on a synthetic set of 70,000
# 28x28 images (about 53 MiB of pixels and labels); the executor's resident
# memory with six must stay below what one job's own copy would add beside
# the first (the copy is loaded by the first job and freed with the last).
set -u
. "$(dirname "$0")/lib.sh"
need_protoc
start_daemon
expect_ok "tenant a" ctl tenant create a --uid 4001
expect_ok "vdev a0" ctl vdev create a0 --memory 1GiB --compute 100 --tenant a
printf 'vdev: "a0" model { input { height: 28 width: 28 channels: 1 } layer { flatten {} } layer { dense { units: 16 } } layer { dense { units: 4 } } } train { synthetic { examples: 60000 seed: 1 classes: 4 } } test { synthetic { examples: 10000 seed: 1 classes: 4 } } batch_size: 32 epochs: 10000\n' |
  protoc --encode=gpushare.v1.JobSpec --proto_path="$PROTO" gpushare.proto >"$T/j.pb"
chmod 644 "$T/j.pb"
COPY=$((70000 * (28 * 28 + 4) / 1024))   # KiB of one copy of the sets
EX=$(pgrep -f "gpushare-executor.*$STATE" | head -1)
rss() { awk '/VmRSS/ { print $2 }' "/proc/$EX/status"; }
ids=()
for i in 1 2 3 4 5 6; do
  out=$(ctl_as 4001 65534 submit "$T/j.pb" 2>&1)
  [[ "$out" =~ ^job\ ([0-9]+)\ submitted ]] || { fail "submit: $out"; break; }
  ids+=("${BASH_REMATCH[1]}")
  wait_state "${BASH_REMATCH[1]}" RUNNING 30 >/dev/null || fail "job ${BASH_REMATCH[1]} did not start"
  # Past its start: the sets are loaded (or taken) before the first step.
  for _ in $(seq 100); do
    s=$(ctl --json status "${BASH_REMATCH[1]}" | json_field "['job'].get('step', 0)")
    [ "$s" -gt 0 ] && break; sleep 0.1; done
  [ "$i" = 1 ] && one=$(rss)
done
six=$(rss)
grow=$((six - one))
[ "$grow" -lt "$COPY" ] &&
  pass "executor RSS with 1 job $((one / 1024)) MiB, with 6 $((six / 1024)) MiB: +$((grow / 1024)) MiB for 5 more jobs, less than one copy of the sets ($((COPY / 1024)) MiB)" ||
  fail "executor RSS grew by $((grow / 1024)) MiB from 1 to 6 jobs on one dataset; one copy is $((COPY / 1024)) MiB"
for id in "${ids[@]}"; do ctl cancel "$id" >/dev/null 2>&1; done
for id in "${ids[@]}"; do wait_state "$id" CANCELLED 30 >/dev/null || fail "job $id not cancelled"; done
last=$(rss)
if [ "${GS_SANITIZED:-0}" = 1 ]; then
  echo "# skipped under AddressSanitizer, whose quarantine keeps freed memory: the copy's release"
elif [ "$last" -lt $((one - COPY / 2)) ]; then pass "with every job ended the copy is freed: $((last / 1024)) MiB"
else fail "executor RSS $((last / 1024)) MiB after every job ended (with one job: $((one / 1024)) MiB)"; fi
stop_daemon
finish
