#!/usr/bin/env bash
# Usage that is kept: two jobs of a tenant run and finish, and gpuctl usage
# shows for each its device seconds, its steps (the job's own), its samples
# (steps x micro-batch x accumulation steps) and the tenant's total as the
# sum of its rows (jobs and the vdev's idle reserved memory); gpuctl status
# shows a job's own. Then gpushared is killed (kill -9) while a third job
# runs: after the restart the job resumes and finishes, its usage is no
# less than before the kill, and the Prometheus counter of the vdev's
# device seconds did not go down.
set -u
. "$(dirname "$0")/lib.sh"
need_protoc
start_daemon
expect_ok "tenant a" ctl tenant create a --uid 4001
expect_ok "vdev a0" ctl vdev create a0 --memory 256MiB --compute 50 --tenant a
MODEL='model { input { height: 8 width: 8 channels: 1 } layer { flatten {} } layer { dense { units: 64 activation: RELU } } layer { dense { units: 4 } } }'
spec() { printf '%s\n' "$2" | protoc --encode=gpushare.v1.JobSpec --proto_path="$PROTO" gpushare.proto >"$T/$1.pb"
  chmod 644 "$T/$1.pb"; }
submit() {
  local out; out=$(ctl_as 4001 65534 submit "$T/$1.pb" 2>&1)
  [[ "$out" =~ ^job\ ([0-9]+)\ submitted ]] || { fail "submit $1: $out"; finish; exit 1; }
  echo "${BASH_REMATCH[1]}"; }
spec one "name: \"one\" vdev: \"a0\" $MODEL train { synthetic { examples: 1024 seed: 1 classes: 4 } } batch_size: 16 max_steps: 300"
spec two "name: \"two\" vdev: \"a0\" $MODEL train { synthetic { examples: 1024 seed: 2 classes: 4 } } batch_size: 8 accumulation_steps: 3 max_steps: 200"
J1=$(submit one); J2=$(submit two)
wait_state "$J1" SUCCEEDED 120 && wait_state "$J2" SUCCEEDED 120 && pass "jobs $J1 and $J2 succeeded" ||
  fail "jobs $J1 and $J2 did not both succeed"
ctl --json status "$J1" >"$T/s1.json"; ctl --json status "$J2" >"$T/s2.json"
expect_ok "usage as the tenant" ctl_as 4001 65534 --json usage
printf '%s\n' "$LAST_OUT" >"$T/u.json"
$PY - "$T/u.json" "$T/s1.json" "$T/s2.json" <<'PY' && pass "each job's device seconds, steps and samples; the total is the sum" ||
import json, sys
u = json.load(open(sys.argv[1]))
assert [t["tenant"] for t in u["tenant"]] == ["a"], u
t = u["tenant"][0]
rows = {int(r.get("job_id", 0)): r for r in t["job"]}
for path in sys.argv[2:]:
    j = json.load(open(path))["job"]
    r = rows[int(j["id"])]
    us = r["usage"]
    steps = int(j["step"])
    assert steps > 0 and int(us["steps"]) == steps, (steps, us)
    batch = int(j["micro_batch"]) * int(j["accumulation_steps"])
    assert int(us["samples"]) == steps * batch, (us, batch)
    assert float(us["device_seconds"]) > 0, us
    assert float(us["in_use_gib_seconds"]) > 0 and float(us["reserved_gib_seconds"]) > 0, us
    assert r["vdev"] == "a0" and r["name"] == j["name"], r
    # the status of the job carries the same figures
    assert int(j["usage"]["steps"]) == steps, j["usage"]
for k in ("device_seconds", "reserved_gib_seconds", "in_use_gib_seconds", "steps", "samples"):
    s = sum(float(r["usage"].get(k, 0)) for r in t["job"])
    tot = float(t["total"].get(k, 0))
    assert abs(tot - s) <= 1e-9 * max(1.0, abs(s)), (k, tot, s)
PY
  fail "usage: $(cat "$T/u.json")"
expect_ok "gpuctl status shows the job's usage" ctl_as 4001 65534 status "$J1"
[[ "$LAST_OUT" == *"usage:"*"device-s"*" steps"* ]] && pass "status has a usage line" || fail "status: $LAST_OUT"
expect_ok "gpuctl usage prints a table" ctl usage --tenant a
[[ "$LAST_OUT" == *"tenant a"*"DEVICE-S"*"total"*"one"*"two"* ]] && pass "usage table: total, then the jobs" ||
  fail "usage table: $LAST_OUT"
expect_fail "a bad --since is a usage error" 2 "is not a date" ctl usage --since 2024-13
expect_fail "a --since in the future is refused" 2 "in the future" ctl usage --since 2999-01-01
expect_ok "usage --since today" ctl --json usage --since "$(date -u +%F)"

# --- kill -9 mid-job -----------------------------------------------------------
spec three "name: \"three\" vdev: \"a0\" model { input { height: 28 width: 28 channels: 1 } layer { flatten {} } layer { dense { units: 256 activation: RELU } } layer { dense { units: 4 } } } train { synthetic { examples: 8192 seed: 3 classes: 4 } } batch_size: 32 epochs: 100 max_steps: 3000 checkpoint_every_steps: 100"
J3=$(submit three)
step() { ctl --json status "$J3" | json_field ".get('job', {}).get('step', 0)"; }
s=0
for _ in $(seq 300); do s=$(step); [ "$s" -ge 400 ] && break; sleep 0.1; done
[ "$s" -ge 400 ] && [ "$s" -lt 3000 ] && pass "job $J3 at step $s of 3000: gpushared is killed (kill -9)" ||
  fail "job $J3 was at step $s when the kill was due (400 to 2999 wanted)"
vdev_ds() { ctl metrics | sed -n 's/^gpushare_vdev_device_seconds_total{vdev="a0".*} //p'; }
vdev_steps() { ctl metrics | sed -n 's/^gpushare_vdev_steps_total{vdev="a0".*} //p'; }
m1=$(vdev_ds)   # metrics writes the usage first: this much is stored
s1=$(vdev_steps)
ctl --json usage >"$T/before.json"
kill9_daemon
start_daemon
m2=$(vdev_ds)
s2=$(vdev_steps)
[ "$s1" -gt 0 ] && [ "$s2" -ge "$s1" ] && pass "vdev steps did not go down across the restart ($s1 -> $s2)" ||
  fail "vdev steps went from $s1 to $s2 across the restart"
$PY -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); sys.exit(0 if b >= a > 0 else 1)" "$m1" "$m2" &&
  pass "vdev device seconds did not go down across the restart ($m1 -> $m2)" ||
  fail "vdev device seconds went from $m1 to $m2 across the restart"
wait_state "$J3" SUCCEEDED 120 && pass "job $J3 resumed and succeeded" || fail "job $J3 did not succeed"
ctl --json status "$J3" >"$T/s3.json"
ctl --json usage >"$T/after.json"
m3=$(vdev_ds)
$PY - "$T/before.json" "$T/after.json" "$T/s3.json" "$J3" "$m2" "$m3" <<'PY' && pass "usage after the restart is no less than before; steps are the job's" ||
import json, sys
def rows(p):
    t = {t["tenant"]: t for t in json.load(open(p))["tenant"]}["a"]
    return t, {(int(r.get("job_id", 0)), r["vdev"]): r["usage"] for r in t["job"]}
tb, b = rows(sys.argv[1])
ta, a = rows(sys.argv[2])
j = json.load(open(sys.argv[3]))["job"]
j3 = int(sys.argv[4])
for key, u in b.items():
    for k in ("device_seconds", "reserved_gib_seconds", "in_use_gib_seconds", "steps", "samples"):
        assert float(a[key].get(k, 0)) >= float(u.get(k, 0)), (key, k, u, a[key])
for k in ("device_seconds", "reserved_gib_seconds", "in_use_gib_seconds", "steps", "samples"):
    assert float(ta["total"].get(k, 0)) >= float(tb["total"].get(k, 0)), (k, tb["total"], ta["total"])
u3 = a[(j3, "a0")]
assert int(u3["steps"]) == int(j["step"]) == 3000, (u3, j["step"])
assert int(u3["samples"]) == 3000 * 32, u3
assert float(u3["device_seconds"]) > float(b[(j3, "a0")]["device_seconds"]), (u3, b[(j3, "a0")])
assert float(sys.argv[6]) >= float(sys.argv[5]), (sys.argv[5], sys.argv[6])
PY
  fail "usage before: $(cat "$T/before.json") after: $(cat "$T/after.json")"
ctl metrics | $PY "$HERE/prom_check.py" >/dev/null && pass "metrics are well formed" || fail "metrics format"
steps=$(cat "$T/s1.json" "$T/s2.json" "$T/s3.json" | $PY -c "
import json, sys
print(sum(int(json.loads(l)['job']['step']) for l in sys.stdin))")
ctl metrics | grep -q "^gpushare_tenant_steps_total{tenant=\"a\"} $steps\$" && pass "tenant a: its jobs' $steps steps in metrics" ||
  fail "tenant steps: $(ctl metrics | grep tenant_steps_total), wanted $steps"
stop_daemon
finish
