#!/usr/bin/env bash
# gpushare-run's memory features, end to end: the plan as a model summary
# and as JSON; a job over --memory-limit refused with what would fit; with
# --auto-fit (or the spec's auto_fit) it runs at the chosen micro-batch and
# accumulation, keeps the effective batch and its measured peak stays under
# the limit and equals the plan; forced run-time OOMs print the report with
# the right cause (QUOTA past admission, PHYSICAL on a device that runs out,
# FRAGMENTATION where a growth vdev's regions leave no room for one buffer).
# Arguments: $1 gpushared $2 gpuctl (unused: gpushare-run needs no daemon).
set -u
BUILD=${GS_BUILD_DIR:-$(cd "$(dirname "$0")/../../build" && pwd)}
SRC=${GS_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
RUN=$BUILD/bin/gpushare-run
PY=/usr/bin/python3
PASSED=0
FAILED=0
pass() { PASSED=$((PASSED + 1)); echo "ok - $*"; }
fail() { FAILED=$((FAILED + 1)); echo "FAIL - $*"; }

[ -x "$RUN" ] || { echo "skip: $RUN is not built"; exit 77; }
PROTOC=$(command -v protoc) || { echo "skip: protoc is needed to encode the test job"; exit 77; }
T=$(mktemp -d /tmp/gs-run-mem-XXXXXX)
trap 'rm -rf "$T"' EXIT

# json FILE KEY: the value of KEY in the last JSON line of FILE (nested keys as a.b).
json() {
  "$PY" - "$1" "$2" <<'PYEOF'
import json, sys
lines = [l for l in open(sys.argv[1]) if l.startswith("{")]
v = json.loads(lines[-1])
for k in sys.argv[2].split("."):
    v = v[int(k)] if isinstance(v, list) else v[k]
print(str(v).lower() if isinstance(v, bool) else v)
PYEOF
}

# A synthetic convolutional job whose activations dominate, so a smaller
# micro-batch fits where the submitted one does not.
cat >"$T/conv.txtpb" <<'EOF'
name: "conv-synthetic"
model {
  input { height: 16 width: 16 channels: 1 }
  layer { conv2d { filters: 16 kernel_size: 3 padding: SAME activation: RELU } }
  layer { conv2d { filters: 16 kernel_size: 3 padding: SAME activation: RELU } }
  layer { flatten {} }
  layer { dense { units: 4 } }
}
train { synthetic { examples: 512 seed: 3 classes: 4 } }
test { synthetic { examples: 96 seed: 3 classes: 4 } }
batch_size: 64
epochs: 1
seed: 1
precision: FLOAT32
optimizer { adam { learning_rate: 0.001 } }
EOF
encode() { "$PROTOC" --encode=gpushare.v1.JobSpec --proto_path="$SRC/proto" gpushare.proto <"$1" >"$2"; }
encode "$T/conv.txtpb" "$T/conv.pb" || { fail "protoc could not encode the test job"; exit 1; }
{ cat "$T/conv.txtpb"; echo "auto_fit: true"; } >"$T/conv-autofit.txtpb"
encode "$T/conv-autofit.txtpb" "$T/conv-autofit.pb"
# The same job at micro-batch 32 x 2 accumulation steps: its 4.5 MiB
# workspace comes after 2.3 MiB of other buffers, past a growth vdev's first
# regions (2 MiB, then 4 MiB).
sed 's/^batch_size: 64$/batch_size: 32\naccumulation_steps: 2/' "$T/conv.txtpb" >"$T/conv32.txtpb"
encode "$T/conv32.txtpb" "$T/conv32.pb"

# 1. The plan of a shipped example, as a table and as JSON.
MLP=$BUILD/examples/fashion-mlp.pb
if "$RUN" "$MLP" --plan >"$T/plan.txt" 2>&1; then pass "--plan exits 0"; else fail "--plan failed: $(cat "$T/plan.txt")"; fi
grep -q "dense_1" "$T/plan.txt" && grep -q "Param #" "$T/plan.txt" && grep -q "Predicted peak" "$T/plan.txt" &&
  grep -q "200,960" "$T/plan.txt" && pass "plan lists layers, parameters and the peak" ||
  fail "plan table: $(cat "$T/plan.txt")"
"$RUN" "$MLP" --plan --memory-limit 1MiB >"$T/plan2.txt" 2>&1
grep -q "does NOT fit by" "$T/plan2.txt" && pass "--plan with a small limit says it does not fit" ||
  fail "no verdict: $(cat "$T/plan2.txt")"
"$RUN" "$MLP" --plan --memory-limit 1GiB >"$T/plan3.txt" 2>&1
grep -q "fits (" "$T/plan3.txt" && pass "--plan with a large limit says it fits, with the spare" ||
  fail "no verdict: $(cat "$T/plan3.txt")"
"$RUN" "$T/conv.pb" --plan --json >"$T/plan.json" 2>&1
PEAK=$(json "$T/plan.json" peak_bytes 2>/dev/null)
[[ "$PEAK" =~ ^[0-9]+$ ]] && [ "$PEAK" -gt 0 ] && pass "--plan --json gives peak_bytes ($PEAK)" ||
  fail "--plan --json: $(cat "$T/plan.json")"
[ "$(json "$T/plan.json" rows.0.layer 2>/dev/null)" = "conv2d_1" ] && pass "JSON rows name the layers" ||
  fail "JSON rows: $(cat "$T/plan.json")"

# 2. Over the limit: refused at admission with what fits.
LIMIT=$((PEAK * 6 / 10))
"$RUN" "$T/conv.pb" --memory-limit "$LIMIT" --max-steps 3 >"$T/refused.out" 2>"$T/refused.err"
rc=$?
[ $rc -eq 1 ] && pass "over the limit: exit 1" || fail "over the limit: exit $rc"
grep -q "does not fit" "$T/refused.err" && grep -q "what fits: micro-batch" "$T/refused.err" &&
  grep -q "does NOT fit by" "$T/refused.err" && pass "refusal carries the plan and the suggestion" ||
  fail "refusal text: $(cat "$T/refused.err")"
grep -q "^done" "$T/refused.out" && fail "a refused job trained" || pass "a refused job does not train"

# 3. --auto-fit: runs at the chosen micro-batch, same effective batch, under the limit.
"$RUN" "$T/conv.pb" --memory-limit "$LIMIT" --auto-fit --max-steps 3 --json >"$T/fit.out" 2>"$T/fit.err"
rc=$?
[ $rc -eq 0 ] && pass "--auto-fit runs (exit 0)" || fail "--auto-fit: exit $rc: $(cat "$T/fit.err")"
grep -q "^auto-fit: micro-batch" "$T/fit.out" && pass "says what it chose: $(grep '^auto-fit' "$T/fit.out")" ||
  fail "auto-fit choice not reported: $(cat "$T/fit.out")"
MB=$(json "$T/fit.out" batch_size 2>/dev/null); ACC=$(json "$T/fit.out" accumulation_steps 2>/dev/null)
MP=$(json "$T/fit.out" peak_memory_bytes 2>/dev/null); PP=$(json "$T/fit.out" planned_peak_bytes 2>/dev/null)
if [[ "$MB" =~ ^[0-9]+$ && "$ACC" =~ ^[0-9]+$ ]]; then
  [ "$MB" -lt 64 ] && [ $((64 % MB)) -eq 0 ] && [ $((MB * ACC)) -eq 64 ] &&
    pass "micro-batch $MB x $ACC keeps the effective batch 64" || fail "micro-batch $MB x $ACC"
else
  fail "no batch_size/accumulation_steps in: $(tail -1 "$T/fit.out")"
fi
if [[ "$MP" =~ ^[0-9]+$ && "$PP" =~ ^[0-9]+$ ]]; then
  [ "$MP" -le "$LIMIT" ] && pass "measured peak $MP <= limit $LIMIT" || fail "peak $MP over the limit $LIMIT"
  [ "$MP" -le $((PP + PP / 20)) ] && [ "$MP" -ge $((PP - PP / 20)) ] &&
    pass "measured peak $MP within 5% of planned $PP" || fail "measured $MP vs planned $PP"
else
  fail "no peak_memory_bytes/planned_peak_bytes in: $(tail -1 "$T/fit.out")"
fi
[ "$(json "$T/fit.out" auto_fit 2>/dev/null)" = "true" ] && pass "JSON says auto_fit" || fail "JSON auto_fit"
"$RUN" "$T/conv-autofit.pb" --memory-limit "$LIMIT" --max-steps 2 --json >"$T/fit2.out" 2>&1
rc=$?
[ $rc -eq 0 ] && [ "$(json "$T/fit2.out" batch_size 2>/dev/null)" = "$MB" ] &&
  pass "the spec's auto_fit chooses the same micro-batch" || fail "spec auto_fit: exit $rc: $(tail -3 "$T/fit2.out")"

# 4. The memory report after a run.
"$RUN" "$T/conv.pb" --max-steps 3 --memory-report --policy preallocate --memory-limit 64MiB >"$T/report.out" 2>&1
rc=$?
[ $rc -eq 0 ] && grep -q "measured peak:" "$T/report.out" && grep -q "  step 3 " "$T/report.out" &&
  grep -q "at the peak, by layer and role" "$T/report.out" && grep -q "conv2d_2" "$T/report.out" &&
  pass "--memory-report prints the timeline and the per-layer breakdown (preallocate)" ||
  fail "memory report: exit $rc: $(cat "$T/report.out")"

# 5. Forced run-time OOMs: the job fails cleanly with the report.
"$RUN" "$T/conv.pb" --memory-limit "$LIMIT" --no-admission --max-steps 2 --json >"$T/quota.out" 2>"$T/quota.err"
rc=$?
[ $rc -eq 1 ] && pass "QUOTA OOM: exit 1, not a crash" || fail "QUOTA OOM: exit $rc"
grep -q "out of memory: QUOTA" "$T/quota.err" && grep -q "  tensor   layer " "$T/quota.err" &&
  grep -q "  vdev     " "$T/quota.err" && grep -q "  fits     micro-batch" "$T/quota.err" &&
  pass "QUOTA report: tensor, vdev, cause, what fits" || fail "QUOTA report: $(cat "$T/quota.err")"
[ "$(json "$T/quota.out" oom.cause 2>/dev/null)" = "QUOTA" ] && pass "JSON oom.cause QUOTA" ||
  fail "JSON oom: $(tail -1 "$T/quota.out")"
"$RUN" "$T/conv.pb" --memory-limit 1GiB --device-memory 2MiB --max-steps 2 --json >"$T/phys.out" 2>"$T/phys.err"
rc=$?
[ $rc -eq 1 ] && grep -q "out of memory: PHYSICAL" "$T/phys.err" && grep -q "physical device ran out" "$T/phys.err" &&
  pass "PHYSICAL report when the device runs out before the limit" || fail "PHYSICAL: exit $rc: $(cat "$T/phys.err")"
[ "$(json "$T/phys.out" oom.cause 2>/dev/null)" = "PHYSICAL" ] && pass "JSON oom.cause PHYSICAL" ||
  fail "JSON oom: $(tail -1 "$T/phys.out")"

# A growth vdev holding only this job, whose regions leave no single one for
# its largest buffer though its total fits: FRAGMENTATION, explained as the
# growth layout (not as holes), with a suggestion that fits a growth vdev.
"$RUN" "$T/conv32.pb" --plan --json >"$T/plan32.json" 2>&1
PEAK32=$(json "$T/plan32.json" peak_bytes 2>/dev/null)
if [[ "$PEAK32" =~ ^[0-9]+$ ]]; then
  L32=$((PEAK32 * 11 / 10))
  "$RUN" "$T/conv32.pb" --plan --json --memory-limit "$L32" >"$T/plan32l.json" 2>&1
  [ "$(json "$T/plan32l.json" fits 2>/dev/null)" = "false" ] &&
    [ "$(json "$T/plan32l.json" fits_preallocate 2>/dev/null)" = "true" ] &&
    pass "32 x 2 at $L32 fits a preallocate vdev, not a growth one (the case's premise)" ||
    fail "premise: $(tail -1 "$T/plan32l.json")"
  "$RUN" "$T/conv32.pb" --memory-limit "$L32" --no-admission --max-steps 2 --json >"$T/frag.out" 2>"$T/frag.err"
  rc=$?
  [ $rc -eq 1 ] && [ "$(json "$T/frag.out" oom.cause 2>/dev/null)" = "FRAGMENTATION" ] &&
    grep -q "out of memory: FRAGMENTATION" "$T/frag.err" &&
    pass "growth layout OOM: exit 1, cause FRAGMENTATION" || fail "growth layout OOM: exit $rc: $(cat "$T/frag.err")"
  grep -q "a growth vdev reserves its memory in regions" "$T/frag.err" &&
    grep -q "cannot span two regions" "$T/frag.err" && grep -q "a preallocate vdev of this limit" "$T/frag.err" &&
    pass "the report explains the growth regions" || fail "growth explanation: $(cat "$T/frag.err")"
  grep -q "without holes" "$T/frag.err" && fail "the report claims the job would run on this vdev without holes" ||
    pass "no claim that the job would run on an empty vdev of this kind"
  "$RUN" "$T/conv32.pb" --memory-limit "$L32" --auto-fit --max-steps 2 --json >"$T/fit32.out" 2>&1
  rc=$?
  MB32=$(json "$T/fit32.out" batch_size 2>/dev/null); ACC32=$(json "$T/fit32.out" accumulation_steps 2>/dev/null)
  [ $rc -eq 0 ] && grep -q "^  fits     micro-batch $MB32 x $ACC32 " "$T/frag.err" &&
    pass "the report suggests micro-batch $MB32 x $ACC32, what --auto-fit runs at this limit" ||
    fail "suggestion vs --auto-fit ($rc, $MB32 x $ACC32): $(grep -A2 '^  fits' "$T/frag.err")"
else
  fail "--plan --json of the 32 x 2 job: $(cat "$T/plan32.json")"
fi

# 6. Bad values are usage errors.
"$RUN" "$T/conv.pb" --memory-limit 12XB >/dev/null 2>"$T/bad.err"; rc=$?
[ $rc -eq 2 ] && grep -q -- "--memory-limit" "$T/bad.err" && pass "bad --memory-limit: exit 2" || fail "bad size: exit $rc"
"$RUN" "$T/conv.pb" --policy sometimes >/dev/null 2>&1; rc=$?
[ $rc -eq 2 ] && pass "bad --policy: exit 2" || fail "bad policy: exit $rc"
"$RUN" --help | grep -q -- "--memory-report" && pass "--help documents the memory options" || fail "--help"

echo "$PASSED passed, $FAILED failed"
[ "$FAILED" -eq 0 ]
