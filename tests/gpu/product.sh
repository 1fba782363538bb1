#!/usr/bin/env bash
# tests/gpu/product.sh: the product itself on one device: a real gpushared
# with its executor serving DEVICE (gpu0 on the GPU machine; cpu for the dry
# run on any machine), driven with gpuctl as an ops team and two tenants
# would. tests/gpu/check.sh runs it on the GPU machine with the programs
# tests/gpu/prepare.sh built here and the libraries it carried.
#
#   product.sh --bin DIR [--device gpu0|cpu] [--data DIR] [--steps N]
#     --bin DIR     gpushared, gpushare-executor and gpuctl
#     --device D    the device the vdevs are on (default gpu0)
#     --data DIR    Fashion-MNIST's four .gz IDX files (default
#                   /usr/share/datasets/fashion-mnist)
#     --text FILE   the text the GPT example trains on (default Debian's
#                   fortunes, /usr/share/games/fortunes/cookie)
#     --steps N     optimizer steps of each example job (default 300)
#     --parts "A B" only these parts (devices always runs first)
#   $GS_CUDA_PLUGIN names the plugin the executor loads (check.sh's build).
#
# Parts, each run whatever the others gave, each ending in one line
# "PART NAME: PASS" or "PART NAME: FAIL (n of m checks)":
#   devices   the daemon lists DEVICE; two tenants, vdevs a0 (compute 75)
#             and b0 (compute 25) on it
#   examples  the Fashion-MNIST MLP and CNN in FLOAT32 and MIXED_BFLOAT16,
#             the MobileNet in MIXED_FLOAT16, the ResNet in MIXED_BFLOAT16
#             and the text GPT in MIXED_BFLOAT16, each through
#             `gpuctl submit --watch` as tenant a, to SUCCEEDED
#   peaks     planned against measured peak memory of each of those jobs
#             (the allocator's peak must be within 5% of the plan)
#   shares    one job in each vdev at once: their step ratio (75/25 = 3)
#   refused   a job over its vdev is refused with the plan
#   kill9     kill -9 of the executor mid-job: it restarts, the job resumes
#             from its checkpoint and trains on
#   oom       a run-time OOM (the executor's oom failpoint: the job's
#             allocator smaller than its plan) fails the job with its report
#   fault     a device fault in one of two jobs (device-fault failpoint: a
#             real illegal-address kernel on a GPU): the executor exits
#             naming it, the other job resumes from its checkpoint
# The figures (peaks, step ratio) are printed as they are measured. Exit 0
# when every part passed.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
BIN= DEV=gpu0 DATA=/usr/share/datasets/fashion-mnist STEPS=300 PARTS=
TEXT=/usr/share/games/fortunes/cookie
while [ $# -gt 0 ]; do
  case $1 in
    --bin) BIN=$2; shift 2 ;;
    --device) DEV=$2; shift 2 ;;
    --data) DATA=$2; shift 2 ;;
    --text) TEXT=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --parts) PARTS=" $2 "; shift 2 ;;
    *) echo "product.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -x "$BIN/gpushared" ] && [ -x "$BIN/gpuctl" ] && [ -x "$BIN/gpushare-executor" ] ||
  { echo "product.sh: no gpushared, gpuctl and gpushare-executor in '$BIN'" >&2; exit 2; }
BIN=$(cd "$BIN" && pwd)
PY=$(command -v python3)
T=$(mktemp -d /tmp/gs-product-XXXXXX)
chmod 755 "$T"
SOCK=$T/gpushared.sock STATE=$T/state CONF=$T/gpushared.conf LOG=$T/daemon.log
DPID=
cat >"$CONF" <<CONF
socket_group = nogroup
socket_mode = 0660
admin_group = users
cpu_memory = 8GiB
log_level = info
CONF
cleanup() {
  [ -n "$DPID" ] && kill -KILL "$DPID" 2>/dev/null
  [ -n "${OUT:-}" ] && cp "$LOG" "$OUT/product-daemon.log" 2>/dev/null
  rm -rf "$T"
}
trap cleanup EXIT

ctl() { "$BIN/gpuctl" --socket "$SOCK" "$@"; }
A() { setpriv --reuid=4001 --regid=65534 --groups=65534 "$BIN/gpuctl" --socket "$SOCK" "$@"; }
B() { setpriv --reuid=4002 --regid=65534 --groups=65534 "$BIN/gpuctl" --socket "$SOCK" "$@"; }
json() { $PY -c "import json,sys; d=json.load(sys.stdin); print(eval('d'+sys.argv[1]))" "$1"; }
st() { ctl --json status "$1" 2>/dev/null | json "['job']$2" 2>/dev/null; }
wait_state() {  # wait_state ID STATE SECONDS
  local s; for _ in $(seq $(($3 * 10))); do
    s=$(st "$1" "['state']"); [ "$s" = "$2" ] && return 0
    case $s in SUCCEEDED|FAILED|CANCELLED) [ "$s" != "$2" ] && break ;; esac
    sleep 0.1; done
  echo "job $1 is ${s:-unknown}, not $2 ($(st "$1" ".get('reason','')"))"; return 1; }
wait_step() {  # wait_step ID STEP SECONDS
  for _ in $(seq $(($3 * 10))); do [ "$(st "$1" ".get('step',0)")" -ge "$2" ] 2>/dev/null && return 0; sleep 0.1; done
  return 1; }
last_id() { "$@" --json list | json "['job'][-1]['id']"; }
executor_pid() { pgrep -f "gpushare-executor --device $DEV " | head -n 1; }

# ---- checks and parts ----
PART_CHECKS=0 PART_FAILS=0 FAILED_PARTS= SERVED=0
ok() { PART_CHECKS=$((PART_CHECKS + 1)); echo "ok - $*"; }
bad() { PART_CHECKS=$((PART_CHECKS + 1)); PART_FAILS=$((PART_FAILS + 1)); echo "FAIL - $*"; }
check() { local what=$1; shift; local out; if out=$("$@" 2>&1); then ok "$what"; else bad "$what: exit $?: $(echo "$out" | tail -n 3)"; fi; LAST=$out; }
part() {
  local name=$1; shift
  [ -z "$PARTS" ] || [ "$name" = devices ] || [[ "$PARTS" == *" $name "* ]] || return 0
  if [ "$name" != devices ] && [ $SERVED = 0 ]; then
    echo "PART $name: FAIL (not run: the daemon does not serve $DEV)"; FAILED_PARTS="$FAILED_PARTS $name"; return
  fi
  echo; echo "== part $name ($(date +%T))"
  PART_CHECKS=0 PART_FAILS=0
  "$@"
  if [ $PART_FAILS -eq 0 ] && [ $PART_CHECKS -gt 0 ]; then echo "PART $name: PASS"
  else echo "PART $name: FAIL ($PART_FAILS of $PART_CHECKS checks)"; FAILED_PARTS="$FAILED_PARTS $name"; fi
}

start_daemon() {  # start_daemon [FAILPOINT]
  GPUSHARE_EXECUTOR_FAILPOINT=${1:-} "$BIN/gpushared" --foreground --config "$CONF" \
    --socket "$SOCK" --state-dir "$STATE" >>"$LOG" 2>&1 &
  DPID=$!
  for _ in $(seq 100); do ctl version >/dev/null 2>&1 && return 0; kill -0 "$DPID" 2>/dev/null || break; sleep 0.1; done
  bad "gpushared did not come up: $(tail -n 5 "$LOG")"; return 1
}
stop_daemon() {
  [ -n "$DPID" ] || return 0
  kill -TERM "$DPID"; local rc=0; wait "$DPID" || rc=$?; DPID=
  [ $rc -eq 0 ] && ok "gpushared stopped cleanly" || bad "gpushared exited $rc at SIGTERM"
}

# job NAME MODEL PRECISION VDEV STEPS [TEXT...]: T/NAME.pb from the shipped
# example (fashion-MODEL, or text-gpt for gpt), its IDX files from DATA
# (its text from TEXT), STEPS optimizer steps.
job() {
  local name=$1 model=$2 prec=$3 vdev=$4 steps=$5; shift 5
  local batch="batch_size: 128" src=$ROOT/examples/fashion-$model.txtpb
  [ "$model" = gpt ] && batch="batch_size: 32" src=$ROOT/examples/text-gpt.txtpb
  [[ "$*" == *batch_size* ]] && batch=
  sed -e '/^name:/d;/^precision:/d;/^epochs:/d;/^batch_size:/d' \
      -e "s#\"\\([a-z0-9]*-[a-z0-9-]*-ubyte.gz\\)\"#\"$DATA/\\1\"#g" \
      -e "s#\"/usr/share/games/fortunes/cookie\"#\"$TEXT\"#" \
      "$src" >"$T/$name.txtpb"
  echo "name: \"$name\" vdev: \"$vdev\" precision: $prec epochs: 1000 max_steps: $steps $batch $*" >>"$T/$name.txtpb"
  ctl job encode "$T/$name.txtpb" -o "$T/$name.pb" >/dev/null && chmod 644 "$T/$name.pb"
}

# ---- the parts ----
part_devices() {
  start_daemon || return
  check "gpuctl devices" ctl --json devices
  echo "$LAST" | $PY -c "import json,sys; d={x['name']:x for x in json.load(sys.stdin)['device']}; g=d['$DEV']; print('$DEV:', g.get('model'), g.get('compute_capability',''), 'total', g.get('total_bytes'), 'usable', g.get('usable_bytes'))" &&
    { ok "the daemon serves $DEV"; SERVED=1; } || bad "no device $DEV: $LAST ($(grep -i gpu "$LOG" | head -n 3))"
  local mem=4GiB; [ "$DEV" = cpu ] && mem=1536MiB
  check "tenant a" ctl tenant create a --uid 4001
  check "tenant b" ctl tenant create b --uid 4002
  check "vdev a0 on $DEV, compute 75" ctl vdev create a0 --device "$DEV" --memory $mem --compute 75 --tenant a
  check "vdev b0 on $DEV, compute 25" ctl vdev create b0 --device "$DEV" --memory $mem --compute 25 --tenant b
}

EXAMPLE_IDS=
part_examples() {
  local spec name model prec id
  for spec in mlp:FLOAT32 mlp:MIXED_BFLOAT16 cnn:FLOAT32 cnn:MIXED_BFLOAT16 mobilenet:MIXED_FLOAT16 \
      resnet:MIXED_BFLOAT16 gpt:MIXED_BFLOAT16; do
    model=${spec%%:*} prec=${spec#*:} name=$model-$(echo "$prec" | tr 'A-Z_' 'a-z-')
    job "$name" "$model" "$prec" a0 "$STEPS" || { bad "$name: could not write the job"; continue; }
    local t0=$SECONDS
    (cd "$T" && timeout 600 setpriv --reuid=4001 --regid=65534 --groups=65534 "$BIN/gpuctl" \
      --socket "$SOCK" submit "$name.pb" --watch) >"$T/$name.watch" 2>&1
    local rc=$?
    id=$(last_id A)
    local s=$(st "$id" "['state']")
    if [ $rc -eq 0 ] && [ "$s" = SUCCEEDED ]; then
      ok "$name: job $id SUCCEEDED in $((SECONDS - t0)) s: $(tail -n 2 "$T/$name.watch" | tr '\n' ' ')"
      EXAMPLE_IDS="$EXAMPLE_IDS $name:$id"
    else
      bad "$name: submit --watch exited $rc, job ${id:-?} ${s:-?}: $(tail -n 4 "$T/$name.watch")"
    fi
  done
}

part_peaks() {
  [ -n "$EXAMPLE_IDS" ] || { bad "no example job finished"; return; }
  printf '%-26s %14s %14s %9s\n' job planned measured error
  local e name id
  for e in $EXAMPLE_IDS; do
    name=${e%%:*} id=${e#*:}
    ctl --json status "$id" >"$T/s.json" 2>&1
    local line
    line=$($PY - "$T/s.json" "$name" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))['job']
tl = j.get('timeline', {})
planned = int(j.get('planned_peak_bytes', 0) or tl.get('planned_peak_bytes', 0))
measured = int(tl.get('peak_bytes', 0) or max([int(x.get('peak_memory_bytes', 0)) for x in j.get('epoch', [])] or [0]))
err = abs(measured - planned) / planned if planned else 1.0
print(f"{sys.argv[2]:26s} {planned:14d} {measured:14d} {100 * err:8.3f}% {'ok' if planned and measured and err <= 0.05 else 'bad'}")
PY
)
    echo "$line"
    case $line in *" ok") ok "$name: measured peak within 5% of the plan" ;; *) bad "$name: $line" ;; esac
  done
}

part_shares() {
  local secs=15; [ "$DEV" = cpu ] && secs=10
  job share-a mlp FLOAT32 a0 100000000
  job share-b mlp FLOAT32 b0 100000000
  (cd "$T" && A submit share-a.pb) >/dev/null 2>&1; local ja=$(last_id A)
  (cd "$T" && B submit share-b.pb) >"$T/b.out" 2>&1; local jb=$(last_id B)
  if ! wait_step "$ja" 20 120 || ! wait_step "$jb" 5 120; then
    bad "the two jobs did not both run ($(st "$ja" "['state']") / $(st "$jb" "['state']"); $(tail -n 2 "$T/b.out"))"
  else
    sleep 2  # both past their start
    local a1=$(st "$ja" "['step']") b1=$(st "$jb" "['step']"); sleep $secs
    local a2=$(st "$ja" "['step']") b2=$(st "$jb" "['step']")
    local ratio=$($PY -c "print('%.3f' % (($a2 - $a1) / max(1, $b2 - $b1)))")
    echo "steps in ${secs}s: a0 (75) $((a2 - a1)), b0 (25) $((b2 - b1)); ratio $ratio (want 3)"
    $PY -c "import sys; sys.exit(0 if 2.25 <= $ratio <= 3.75 else 1)" &&
      ok "step ratio $ratio within 25% of 3" || bad "step ratio $ratio, not within 25% of 3"
  fi
  A cancel "$ja" >/dev/null 2>&1; B cancel "$jb" >/dev/null 2>&1
  wait_state "$ja" CANCELLED 60 >/dev/null; wait_state "$jb" CANCELLED 60 >/dev/null
}

part_refused() {
  # the CNN's activations at micro-batch 60000 hold several GiB
  job big cnn FLOAT32 a0 10 batch_size: 60000 || { bad "could not write the job"; return; }
  local out rc=0
  out=$(cd "$T" && A submit big.pb 2>&1) || rc=$?
  echo "$out" | head -n 30
  [ $rc -ne 0 ] && [[ "$out" == *"does not fit"* ]] &&
    ok "a job over its vdev is refused: $(echo "$out" | grep -o 'does not fit vdev.*limit [0-9.]* [KMGT]iB' | head -n 1)" ||
    bad "the big job was not refused for its size (exit $rc)"
  [[ "$out" == *workspace* ]] && ok "the refusal shows the plan (its roles)" || bad "no plan in the refusal"
}

# resumed ID AFTER: job ID resumed from a checkpoint and trains on past
# step AFTER; then it is cancelled (a job long enough to be mid-run on any
# device when its executor goes down).
resumed() {
  for _ in $(seq 300); do grep -q "job $1: resumed from step [1-9]" "$LOG" && break; sleep 0.1; done
  local r; r=$(grep -o "job $1: resumed from step [0-9]*" "$LOG" | tail -n 1 | grep -o '[0-9]*$')
  [ -n "$r" ] && [ "$r" -gt 0 ] && ok "job $1 resumed from its checkpoint at step $r (killed at step $2 or later)" ||
    { bad "job $1 did not resume from a checkpoint"; r=0; }
  wait_step "$1" $((r + 10)) 120 && ok "job $1 trains on past step $r (step $(st "$1" "['step']"))" ||
    bad "job $1 is $(st "$1" "['state']") at step $(st "$1" "['step']")"
  ctl cancel "$1" >/dev/null 2>&1; wait_state "$1" CANCELLED 60 >/dev/null
}

part_kill9() {
  job steady mlp FLOAT32 b0 100000000 checkpoint_every_steps: 25
  (cd "$T" && B submit steady.pb) >/dev/null 2>&1; local jb=$(last_id B)
  wait_step "$jb" 60 120 || { bad "job $jb did not reach step 60"; return; }
  local x1=$(executor_pid) before=$(st "$jb" "['step']")
  kill -KILL "$x1" && ok "kill -9 the executor (pid $x1) at step $before"
  local x2=; for _ in $(seq 100); do x2=$(executor_pid); [ -n "$x2" ] && [ "$x2" != "$x1" ] && break; sleep 0.1; done
  [ -n "$x2" ] && [ "$x2" != "$x1" ] && ok "the executor was restarted (pid $x2)" || bad "no new executor"
  resumed "$jb" "$before"
}

part_oom() {
  stop_daemon
  start_daemon oom:oomer:1048576 || return
  job oomer mlp FLOAT32 a0 50
  (cd "$T" && A submit oomer.pb) >/dev/null 2>&1; local j=$(last_id A)
  wait_state "$j" FAILED 120 && ok "the job failed at run time" || bad "job $j did not fail"
  local out; out=$(A status "$j" 2>&1)
  echo "$out" | sed -n '1,40p'
  [ "$(st "$j" ".get('oom',{}).get('cause','')")" != "" ] && ok "its OOM report: cause $(st "$j" "['oom']['cause']")" ||
    bad "no OOM report in its status"
  stop_daemon
}

part_fault() {
  start_daemon device-fault:faulter:40 || return
  job steady2 mlp FLOAT32 b0 100000000 checkpoint_every_steps: 25
  job faulter mlp FLOAT32 a0 $STEPS
  (cd "$T" && B submit steady2.pb) >/dev/null 2>&1; local jb=$(last_id B)
  wait_step "$jb" 60 120 || bad "job $jb did not reach step 60"
  local before=$(st "$jb" "['step']")
  (cd "$T" && A submit faulter.pb) >/dev/null 2>&1; local jf=$(last_id A)
  wait_state "$jf" FAILED 180 && ok "the faulting job failed: $(st "$jf" "['reason']")" || bad "the faulter did not fail"
  grep -q "device $DEV lost in job $jf's step" "$LOG" && ok "the executor said the device was lost in job $jf's step: $(grep -o "device $DEV lost in job $jf's step ([^)]*)" "$LOG" | head -n 1)" ||
    bad "no device-lost line for job $jf"
  resumed "$jb" "$before"
  stop_daemon
}

echo "product checks on $DEV with $BIN (data $DATA, $STEPS steps a job)"
command -v setpriv >/dev/null || echo "product.sh: setpriv (util-linux) is missing: the tenants' calls will fail"
[ "$(id -u)" = 0 ] || echo "product.sh: not root: the tenants' calls (setpriv to their uids) will fail"
for f in t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz; do
  [ -f "$DATA/$f" ] || echo "product.sh: $DATA/$f is missing: the example parts will fail"
done
part devices part_devices
part examples part_examples
part peaks part_peaks
part shares part_shares
part refused part_refused
part kill9 part_kill9
part oom part_oom
part fault part_fault
echo
if [ -z "$FAILED_PARTS" ]; then echo "product checks: every part passed"; exit 0; fi
echo "product checks: FAILED:$FAILED_PARTS"; tail -n 30 "$LOG"
exit 1
