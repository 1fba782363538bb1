#!/usr/bin/env bash
# A tenant floods its small vdev with a thousand jobs (a quarter of that
# under the sanitizers), each on a dataset of its own; another tenant's job
# trains beside it. What must hold:
#  - only the jobs whose planned peaks and data fit the vdev run; the rest
#    wait QUEUED and count against max_queued (the submits past it are
#    refused, naming the quota);
#  - the executor's resident memory stays within the charged bytes of the
#    vdevs (their limits) plus a stated margin for what is not a job's:
#    the executor itself, and a thread's stack and bookkeeping per running
#    job;
#  - the other tenant's job keeps its compute share and its speed: during
#    the flood its vdev gets at least 40% of the device seconds charged (its
#    share is half), and its steps per device second (core-seconds of its
#    own threads, as the cpu device charges them) are at least half of
#    what they are alone: the flood does not slow its steps. Both are
#    ratios within one run, so a busy machine moves them little; its wall
#    rate, which the machine's other load moves, is printed.
set -u
. "$(dirname "$0")/lib.sh"
need_protoc
start_daemon
N=1000
QUEUE=960
if [ "${GS_SANITIZED:-0}" = 1 ]; then
  # Under AddressSanitizer a submit takes five times as long: a quarter of
  # the flood keeps the test within its minute, with the same shape.
  N=250
  QUEUE=210
fi
expect_ok "tenant a" ctl tenant create a --uid 4001
expect_ok "tenant b" ctl tenant create b --uid 4002
expect_ok "a may queue $QUEUE jobs, run any number" ctl quota set a --max-queued $QUEUE
expect_ok "vdev a0: 64 MiB, half the cpu" ctl vdev create a0 --memory 64MiB --compute 50 --tenant a
expect_ok "vdev b0: 64 MiB, half the cpu" ctl vdev create b0 --memory 64MiB --compute 50 --tenant b
LIMITS=$((128 * 1024))   # KiB charged at most: the two vdevs' limits

# b's job: long, about a millisecond a step (a share is kept per step: a
# step of tens of microseconds would time the turn-taking, not the share).
printf 'vdev: "b0" model { input { height: 28 width: 28 channels: 1 } layer { flatten {} } layer { dense { units: 256 activation: RELU } } layer { dense { units: 10 } } } train { synthetic { examples: 8192 seed: 1 classes: 10 } } batch_size: 64 epochs: 10000\n' |
  protoc --encode=gpushare.v1.JobSpec --proto_path="$PROTO" gpushare.proto >"$T/b.pb"
# a's jobs: 2,000 examples of 28x28 (1.5 MiB on the host) each, one seed
# each, so no two share a copy. Encoded once with seed 12345 (two varint
# bytes, b9 60) and patched: seeds 10000-10999 are two varint bytes too.
printf 'vdev: "a0" model { input { height: 28 width: 28 channels: 1 } layer { flatten {} } layer { dense { units: 8 } } layer { dense { units: 4 } } } train { synthetic { examples: 2000 seed: 12345 classes: 4 } } batch_size: 32 epochs: 10000\n' |
  protoc --encode=gpushare.v1.JobSpec --proto_path="$PROTO" gpushare.proto >"$T/a.pb"
mkdir "$T/a"
$PY - "$T/a.pb" "$T/a" "$N" <<'PY' || fail "could not write the job files"
import sys
tpl = open(sys.argv[1], "rb").read()
seed = bytes([0xb9, 0x60])               # 12345
assert tpl.count(seed) == 1, "the seed's bytes are not unique in the template"
for i in range(int(sys.argv[3])):
    s = 10000 + i
    b = bytes([(s & 0x7f) | 0x80, s >> 7])
    open(f"{sys.argv[2]}/{i:04d}.pb", "wb").write(tpl.replace(seed, b))
PY
chmod -R a+rX "$T/a" "$T/b.pb"

EX=$(pgrep -f "gpushare-executor.*$STATE" | head -1)
rss() { awk '/VmRSS/ { print $2 }' "/proc/$EX/status"; }
step_of() { ctl --json status "$1" | json_field "['job'].get('step', 0)"; }
# The device seconds charged to a vdev so far.
dev_s() { ctl metrics | awk -v v="vdev=\"$1\"" '/^gpushare_vdev_device_seconds_total/ && index($0, v) { print $2 }'; }
# rate ID SECONDS: "steps/s steps/device-second b0's-device-seconds a0's"
# of job ID (on b0) over that many seconds.
rate() { local s0 s1 t0 t1 b0 b1 a0 a1
  s0=$(step_of "$1"); b0=$(dev_s b0); a0=$(dev_s a0); t0=$(date +%s.%N); sleep "$2"
  s1=$(step_of "$1"); b1=$(dev_s b0); a1=$(dev_s a0); t1=$(date +%s.%N)
  $PY -c "print(($s1 - $s0) / ($t1 - $t0), ($s1 - $s0) / max($b1 - $b0, 1e-9), $b1 - $b0, $a1 - $a0)"; }

out=$(ctl_as 4002 65534 submit "$T/b.pb" 2>&1)
[[ "$out" =~ ^job\ ([0-9]+)\ submitted ]] || { fail "b's submit: $out"; finish; exit 1; }
B=${BASH_REMATCH[1]}
wait_state "$B" RUNNING 30 >/dev/null || fail "b's job did not start"
sleep 1
read -r alone alone_cpu _ _ <<<"$(rate "$B" 4)"
base=$(rss)

# The flood: $N submits, four at a time.
t0=$(date +%s)
ls "$T"/a/*.pb | xargs -P 4 -n 1 setpriv --reuid=4001 --regid=65534 --clear-groups \
  "$GPUCTL" --socket "$SOCK" submit >"$T/submits" 2>&1
took=$(($(date +%s) - t0))
ok=$(grep -c '^job [0-9]* submitted' "$T/submits")
refused=$(grep -c 'RESOURCE_EXHAUSTED.*max_queued' "$T/submits")
other=$((N - ok - refused))
echo "# $N submits in $took s: $ok accepted, $refused refused by max_queued, $other otherwise"
[ "$other" = 0 ] || fail "submits that were neither accepted nor refused by max_queued: $(grep -v '^job [0-9]* submitted' "$T/submits" | grep -v max_queued | head -3)"
ctl --json list --all >"$T/list.json"
counts=$($PY - "$T/list.json" <<'PY'
import json, sys
jobs = [j for j in json.load(open(sys.argv[1]))["job"] if j["tenant"] == "a"]
run = [j for j in jobs if j["state"] == "RUNNING"]
held = sum(int(j["planned_peak_bytes"]) + int(j["data_bytes"]) for j in run)
print(len(run), sum(j["state"] == "QUEUED" for j in jobs), held,
      len([j for j in jobs if j["state"] not in ("RUNNING", "QUEUED")]))
PY
)
read -r running queued held ended <<<"$counts"
echo "# a: $running RUNNING holding $((held / 1024)) KiB, $queued QUEUED, $ended ended"
[ "$running" -gt 1 ] && [ "$held" -le $((64 << 20)) ] &&
  pass "a's running jobs ($running) hold $((held / 1024)) KiB of peaks and data, within its 64 MiB vdev" ||
  fail "a runs $running jobs holding $held bytes in a 64 MiB vdev"
[ "$queued" = "$QUEUE" ] && [ "$ended" = 0 ] && [ $((running + queued + refused)) = "$N" ] &&
  pass "the rest wait QUEUED up to max_queued ($queued) and the $refused past it were refused" ||
  fail "queued $queued (max_queued $QUEUE), running $running, refused $refused, ended $ended of $N"

# Every running job past its first step: their sets are loaded.
sleep 3
read -r during during_cpu b_dev a_dev <<<"$(rate "$B" 4)"
peak=0
for _ in 1 2 3 4 5; do r=$(rss); [ "$r" -gt "$peak" ] && peak=$r; sleep 0.2; done
MARGIN=$((48 * 1024 + running * 256))   # KiB: the executor, and 256 KiB a running job
if [ "${GS_SANITIZED:-0}" = 1 ]; then
  echo "# skipped under AddressSanitizer, whose shadow memory and quarantine are in the RSS: the RSS bound ($((peak / 1024)) MiB)"
elif [ "$peak" -le $((LIMITS + MARGIN)) ]; then
  pass "executor RSS $((peak / 1024)) MiB (before the flood $((base / 1024)) MiB) is within the vdevs' 128 MiB plus the margin of $((MARGIN / 1024)) MiB"
else
  fail "executor RSS $((peak / 1024)) MiB is over the vdevs' 128 MiB plus the margin of $((MARGIN / 1024)) MiB"
fi
$PY -c "import sys; sys.exit(0 if $b_dev >= 0.4 * ($a_dev + $b_dev) else 1)" &&
  pass "b's vdev got $(printf %.2f "$b_dev") device seconds during the flood, a's $(printf %.2f "$a_dev") (shares 50:50)" ||
  fail "b's vdev got $b_dev device seconds during the flood and a's $a_dev: under 40% with a share of half"
$PY -c "import sys; sys.exit(0 if $during_cpu >= $alone_cpu / 2 else 1)" &&
  pass "b's job did $(printf %.0f "$during_cpu") steps per device second during the flood, $(printf %.0f "$alone_cpu") alone" ||
  fail "b's steps per device second fell from $alone_cpu alone to $during_cpu during the flood"
# Its wall rate, for the record: it moves with whatever else the machine
# runs between the two windows, so it is shown, not checked.
echo "# b's job: $(printf %.0f "$during") steps/s during the flood, $(printf %.0f "$alone") alone"

stop_daemon
finish
