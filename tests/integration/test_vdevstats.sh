#!/usr/bin/env bash
# What a vdev holds, always visible: gpuctl vdev list (table and --json)
# and the metrics show each vdev's largest free block and fragmentation as
# its executor reports them, and they change when a job takes memory and
# when it gives it back; gpuctl status shows a running job's device and
# host memory, and the metrics its host memory.
set -u
. "$(dirname "$0")/lib.sh"
need_protoc
start_daemon
LIMIT=$((64 * 1024 * 1024))
expect_ok "tenant a" ctl tenant create a --uid 4001
expect_ok "vdev p0 (preallocate)" ctl vdev create p0 --memory 64MiB --compute 50 --tenant a
expect_ok "vdev g0 (growth)" ctl vdev create g0 --memory 64MiB --compute 50 --tenant a --policy growth
printf 'name: "long" vdev: "p0" %s\n' "$LONG_JOB" |
  protoc --encode=gpushare.v1.JobSpec --proto_path="$PROTO" gpushare.proto >"$T/j.pb"
chmod 644 "$T/j.pb"

# vdev_field VDEV KEY: the vdev's field of gpuctl vdev list --json ("" if absent).
vdev_field() { ctl --json vdev list | $PY -c "
import json, sys
v = [v for v in json.load(sys.stdin)['vdev'] if v['name'] == sys.argv[1]][0]
print(v.get(sys.argv[2], ''))" "$1" "$2"; }
# until_vdev VDEV PYEXPR: wait (up to 30 s) until PYEXPR holds of the vdev's
# JSON object `v`; prints it.
until_vdev() {
  local out; for _ in $(seq 300); do
    out=$(ctl --json vdev list | $PY -c "
import json, sys
v = [v for v in json.load(sys.stdin)['vdev'] if v['name'] == sys.argv[1]][0]
if eval(sys.argv[2]): print(json.dumps(v))" "$1" "$2") && [ -n "$out" ] && { echo "$out"; return 0; }
    sleep 0.1; done
  return 1; }

# Idle: the whole limit is one free block, nothing is fragmented.
idle=$(until_vdev p0 "'memory_largest_free' in v and int(v['memory_in_use']) == 0") &&
  $PY -c "
import json, sys
v = json.loads(sys.argv[1]); lim = int(sys.argv[2])
assert int(v['memory_reserved']) == lim, v
assert int(v['memory_largest_free']) == lim and int(v['memory_free']) == lim, v
assert float(v['memory_fragmentation']) == 0.0, v" "$idle" "$LIMIT" &&
  pass "idle preallocate vdev: largest free = free = limit, fragmentation 0" ||
  fail "idle p0: ${idle:-no largest free reported}"
gidle=$(until_vdev g0 "'memory_largest_free' in v") &&
  $PY -c "
import json, sys
v = json.loads(sys.argv[1]); lim = int(sys.argv[2])
assert int(v['memory_largest_free']) == lim and float(v['memory_fragmentation']) == 0.0, v" "$gidle" "$LIMIT" &&
  pass "idle growth vdev: largest free is what its limit lets it reserve" || fail "idle g0: ${gidle:-none}"
expect_ok "vdev list table" ctl vdev list
[[ "$LAST_OUT" == *LARGEST-FREE*FRAG* && "$LAST_OUT" == *"p0"*"64.00 MiB"*"0.0%"* ]] &&
  pass "the table has LARGEST-FREE and FRAG" || fail "vdev list: $LAST_OUT"

out=$(ctl_as 4001 65534 submit "$T/j.pb" 2>&1)
[[ "$out" =~ ^job\ ([0-9]+)\ submitted ]] || { fail "submit: $out"; finish; exit 1; }
J=${BASH_REMATCH[1]}
wait_state "$J" RUNNING 30 >/dev/null || fail "job $J did not start"
# Its run reports what it holds after its first steps.
for _ in $(seq 300); do
  ctl --json status "$J" >"$T/s.json"
  grep -q host_memory_bytes "$T/s.json" && break; sleep 0.1; done
busy=$(until_vdev p0 "int(v['memory_in_use']) > 0")
$PY - "$T/s.json" "$busy" "$LIMIT" <<'PY' && pass "a running job: largest free and fragmentation move, and match its memory" ||
import json, sys
j = json.load(open(sys.argv[1]))["job"]
v = json.loads(sys.argv[2]); lim = int(sys.argv[3])
use, free, big = int(v["memory_in_use"]), int(v["memory_free"]), int(v["memory_largest_free"])
frag = float(v["memory_fragmentation"])
assert use + free == lim, v                       # free is the limit less in use
assert 0 < big <= free < lim, v                   # smaller than when idle
assert 0.0 <= frag <= 1.0, v
assert abs(frag - (1 - big / free)) < 1e-9, v
# The job is alone in its vdev: its tensors are the vdev's in use.
assert int(j["memory_in_use"]) == use, (j, v)
assert use <= int(j["planned_peak_bytes"]), j
# Its datasets as the executor loaded them, as admission counted them.
assert int(j["host_data_bytes"]) == int(j["data_bytes"]) > 0, j
assert int(j["host_memory_bytes"]) > int(j["host_data_bytes"]), j
PY
  fail "running: $(cat "$T/s.json") vdev ${busy:-none}"
expect_ok "status of a running job" ctl_as 4001 65534 status "$J"
[[ "$LAST_OUT" =~ memory:\ +device\ [0-9.]+\ [KMG]?i?B\ in\ use\ /\ [0-9.]+\ [KMG]?i?B\ planned\ peak,\ host\ [0-9.]+\ [KMG]?i?B\ \(datasets ]] &&
  pass "status shows device and host memory" || fail "status: $LAST_OUT"

expect_ok "metrics" ctl metrics
printf '%s\n' "$LAST_OUT" >"$T/m.txt"
$PY - "$T/m.txt" "$LIMIT" "$J" <<'PY' && pass "metrics: largest free, fragmentation, a job's host memory" ||
import re, sys
text = open(sys.argv[1]).read(); lim = int(sys.argv[2]); job = sys.argv[3]
for name in ("vdev_largest_free_bytes", "vdev_fragmentation_ratio", "job_host_memory_bytes"):
    assert f"# HELP gpushare_{name} " in text and f"# TYPE gpushare_{name} gauge" in text, name
def sample(name, labels):
    m = re.search(r"^gpushare_%s\{%s\} (\S+)$" % (name, re.escape(labels)), text, re.M)
    assert m, (name, labels)
    return float(m.group(1))
big = sample("vdev_largest_free_bytes", 'vdev="p0",device="cpu",tenant="a"')
frag = sample("vdev_fragmentation_ratio", 'vdev="p0",device="cpu",tenant="a"')
assert 0 < big < lim and 0.0 <= frag <= 1.0, (big, frag)
assert sample("vdev_largest_free_bytes", 'vdev="g0",device="cpu",tenant="a"') == lim
host = sample("job_host_memory_bytes", f'job="{job}",tenant="a",vdev="p0"')
assert host > 0, host
PY
  fail "metrics: $(grep -E 'largest_free|fragmentation|host_memory' "$T/m.txt")"

expect_ok "cancel" ctl cancel "$J"
wait_state "$J" CANCELLED 30 >/dev/null || fail "job $J not cancelled"
after=$(until_vdev p0 "int(v['memory_in_use']) == 0") &&
  $PY -c "
import json, sys
v = json.loads(sys.argv[1]); lim = int(sys.argv[2])
assert int(v['memory_largest_free']) == lim and float(v['memory_fragmentation']) == 0.0, v" "$after" "$LIMIT" &&
  pass "the job's memory back: the whole limit is one free block again" || fail "after: ${after:-none}"
ctl --json status "$J" | grep -q host_memory_bytes && fail "an ended job still shows host memory" ||
  pass "an ended job shows no live memory"
stop_daemon
finish
