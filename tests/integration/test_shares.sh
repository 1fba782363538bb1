#!/usr/bin/env bash
# Compute shares between vdevs of one device, through the daemon: two
# tenants' vdevs with compute shares 75 and 25 run the same job on the cpu
# device; while both run, their step rates must be 3:1 within 15%,
# and the device time the executor charged them 3:1 as well. The rates are a
# ratio of two jobs measured over the same seconds, so a slow or loaded
# machine slows both alike; under ASan+UBSan the ratio is printed, not
# checked (the instrumentation's cost is not the job's own).
set -u
. "$(dirname "$0")/lib.sh"
need_protoc
# snapshot: steps and device seconds of vdevs a0 and b0, from one gpuctl
# metrics (one Stats of the executor), so both vdevs are read at one moment:
# prints "steps_a0 steps_b0 seconds_a0 seconds_b0".
snapshot() { ctl metrics | $PY -c "
import sys
v = {}
for l in sys.stdin:
    for m in ('steps_total', 'device_seconds_total'):
        for d in ('a0', 'b0'):
            if l.startswith('gpushare_vdev_%s{' % m) and 'vdev=\"%s\"' % d in l: v[m, d] = l.split()[-1]
print(*(v.get(k, 0) for k in (('steps_total', 'a0'), ('steps_total', 'b0'),
                              ('device_seconds_total', 'a0'), ('device_seconds_total', 'b0'))))"; }

start_daemon
expect_ok "tenant a" ctl tenant create a --uid 4001
expect_ok "tenant b" ctl tenant create b --uid 4002
expect_ok "vdev a0 (share 75)" ctl vdev create a0 --memory 256MiB --compute 75 --tenant a
expect_ok "vdev b0 (share 25)" ctl vdev create b0 --memory 256MiB --compute 25 --tenant b
# Steps of a few milliseconds, as real jobs have (shares are accounted per step).
for v in a0 b0; do
  cat >"$T/$v.txtpb" <<JOB
name: "share-$v" vdev: "$v"
model { input { height: 28 width: 28 channels: 1 }
  layer { flatten {} } layer { dense { units: 512 activation: RELU } } layer { dense { units: 10 } } }
train { synthetic { examples: 8192 seed: 7 classes: 10 } }
batch_size: 64 epochs: 10000 max_steps: 1000000 seed: 1
optimizer { adam { learning_rate: 0.001 } }
JOB
  protoc --encode=gpushare.v1.JobSpec --proto_path="$PROTO" gpushare.proto <"$T/$v.txtpb" >"$T/$v.pb"
  chmod 644 "$T/$v.pb"
done
expect_ok "job on a0" ctl_as 4001 65534 submit "$T/a0.pb"; ja=$(ctl_as 4001 65534 --json list | json_field "['job'][-1]['id']")
expect_ok "job on b0" ctl_as 4002 65534 submit "$T/b0.pb"; jb=$(ctl_as 4002 65534 --json list | json_field "['job'][-1]['id']")
for _ in $(seq 100); do
  [ "$(ctl --json status "$ja" | json_field "['job']['state']")" = RUNNING ] &&
  [ "$(ctl --json status "$jb" | json_field "['job']['state']")" = RUNNING ] && break; sleep 0.1; done
sleep 2
read -r a1 b1 da1 db1 < <(snapshot)
sleep "${GS_SHARES_SECONDS:-10}"
read -r a2 b2 da2 db2 < <(snapshot)
read -r ratio dratio < <($PY -c "print(round(($a2-$a1)/max(1,$b2-$b1),2), round(($da2-$da1)/max(1e-9,$db2-$db1),2))")
echo "steps: a0 $((a2 - a1)), b0 $((b2 - b1)): ratio $ratio (want 3 +- 15%)"
echo "device seconds: a0 $($PY -c "print(round($da2-$da1,3))"), b0 $($PY -c "print(round($db2-$db1,3))"): ratio $dratio"
if [ "${GS_SANITIZED:-0}" != 1 ]; then
  $PY -c "import sys; sys.exit(0 if 2.55 <= $ratio <= 3.45 else 1)" && pass "75/25 shares give step rates $ratio:1" || fail "step rate ratio $ratio, want 2.55..3.45"
  $PY -c "import sys; sys.exit(0 if 2.55 <= $dratio <= 3.45 else 1)" && pass "and device time $dratio:1" || fail "device time ratio $dratio"
else
  echo "note - ratios not checked under ASan+UBSan"
fi
expect_ok "cancel a0's job" ctl cancel "$ja"
expect_ok "cancel b0's job" ctl cancel "$jb"
stop_daemon
finish
