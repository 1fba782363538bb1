#!/bin/sh
# bench_train.sh: gpushare-run against PyTorch on the examples: the four
# Fashion-MNIST ones (MLP, CNN, small MobileNet, small ResNet) and the
# byte-level GPT on Debian's fortunes, same recipe, same thread count, CPU.
#
# Prints, per example, training samples/s of both (tokens/s for the GPT),
# their ratio, and both test accuracies (the GPT: both held-out losses, in
# nats a byte). A benchmark, never a test: nothing here is asserted in ctest.
#
# usage: tests/bench/bench_train.sh [BUILD_DIR]     (BUILD_DIR: build/)
#   EPOCHS=1 THREADS=2 MAX_STEPS=0 MODELS="mlp cnn mobilenet resnet gpt" ROUNDS=1
#   SEEDS="" TORCH_START=gpushare to change
#   the run. ROUNDS=N runs both sides N times, alternating, and takes each
#   side's best samples/s: on a shared machine the load of the moment moves
#   either side by tens of percent, and the best run is the one it moved
#   least (accuracies are the first round's; both sides are seeded).
#   SEEDS="1 2 3" trains each model from each of those seeds instead of the
#   example's own (the job re-encoded with protoc, PyTorch given --seed) and
#   prints the mean accuracies, each seed's under the table: one epoch of
#   the MobileNet moves by points with any change of rounding, a seed or a
#   thread count or how a GEMM is split, on both sides.
# PyTorch starts from gpushare-run's own initial weights and data order
# (torch_ref.py --start gpushare), so the two accuracies differ only by the
# arithmetic and compare after one epoch; TORCH_START=torch gives PyTorch its
# own draw instead.
# PyTorch: Debian's python3-torch (/usr/bin/python3 -c 'import torch'); without
# it only gpushare's numbers are printed.
# At the end the table replaces the bench_train section of
# tests/bench/RESULTS.md (results.sh; GS_BENCH_RECORD=0: print only).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
build=${1:-$src/build}
EPOCHS=${EPOCHS:-1}
THREADS=${THREADS:-2}
MAX_STEPS=${MAX_STEPS:-0}
MODELS=${MODELS:-"mlp cnn mobilenet resnet gpt"}
ROUNDS=${ROUNDS:-1}
SEEDS=${SEEDS:-}
PROTOC=${PROTOC:-protoc}
PY=${PY:-/usr/bin/python3}
TORCH_START=${TORCH_START:-gpushare}
run=$build/bin/gpushare-run
[ -x "$run" ] || { echo "bench_train: $run not built (cmake --build $build --target gpushare-run gs_examples)" >&2; exit 1; }
have_torch=0
if "$PY" -c 'import torch' 2>/dev/null; then have_torch=1; fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM
. "$here/results.sh"

jget() { # jget FILE KEY: a number from the last line's JSON object
  tail -n 1 "$1" | "$PY" -c "import json,sys; v=json.load(sys.stdin).get('$2'); print('nan' if v is None else v)"
}

if [ -n "$SEEDS" ] && ! command -v "$PROTOC" >/dev/null 2>&1; then
  echo "bench_train: SEEDS needs protoc to re-encode the jobs (apt-get install protobuf-compiler)" >&2
  exit 2
fi
nseeds=0
for s in $SEEDS; do
  # decimal only: protoc's text format reads a leading 0 as octal
  case $s in ''|*[!0-9]*|0?*) echo "bench_train: SEEDS: '$s' is not a seed (a decimal integer, no leading zeros)" >&2; exit 2 ;; esac
  nseeds=$((nseeds + 1))
done
if [ -n "$SEEDS" ] && [ "$nseeds" = 0 ]; then
  echo "bench_train: SEEDS is set but names no seed" >&2; exit 2
fi
: > "$tmp/seeds"
printf '%-10s %14s %14s %8s %10s %10s\n' model gpushare/s torch/s ratio acc_gs acc_torch | tee "$tmp/table"
for m in $MODELS; do
  ex=fashion-$m       # the example's file name; the GPT's counts tokens and reports losses
  per=1 key=test_accuracy
  if [ "$m" = gpt ]; then ex=text-gpt per=64 key=test_loss; fi
  [ -f "$build/examples/$ex.pb" ] || { echo "bench_train: $build/examples/$ex.pb missing" >&2; exit 1; }
  ms=""
  [ "$MAX_STEPS" != 0 ] && ms="--max-steps $MAX_STEPS"
  sched=constant  # the example's learning-rate schedule, for the peer too
  grep -q 'kind: COSINE' "$src/examples/$ex.txtpb" && sched=cosine
  own=$(sed -n 's/^seed: *\([0-9]*\).*/\1/p' "$src/examples/$ex.txtpb")
  gs_sps=0; pt_sps=0; gs_accs=; pt_accs=
  for seed in ${SEEDS:-${own:-1}}; do
    job=$build/examples/$ex.pb
    if [ -n "$SEEDS" ]; then
      grep -q '^seed:' "$src/examples/$ex.txtpb" ||
        { echo "bench_train: examples/$ex.txtpb has no top-level seed: line to replace" >&2; exit 1; }
      job=$tmp/$ex.$seed.pb
      sed "s/^seed: .*/seed: $seed/" "$src/examples/$ex.txtpb" |
        "$PROTOC" --encode=gpushare.v1.JobSpec --proto_path="$src/proto" gpushare.proto > "$job"
    fi
    gs_acc=; pt_acc=
    r=0
    while [ "$r" -lt "$ROUNDS" ]; do
      r=$((r + 1))
      # shellcheck disable=SC2086
      "$run" "$job" --json --epochs "$EPOCHS" --threads "$THREADS" $ms > "$tmp/gs.$m" 2> "$tmp/gs.$m.err" ||
        { echo "bench_train: gpushare-run failed on $m:" >&2; cat "$tmp/gs.$m.err" >&2; exit 1; }
      gs_sps=$("$PY" -c "print(max($gs_sps, $per * $(jget "$tmp/gs.$m" samples_per_second)))")
      [ -n "$gs_acc" ] || gs_acc=$(jget "$tmp/gs.$m" $key)
      if [ $have_torch = 1 ]; then
        # The three first examples by name (batch 128), the others by their
        # spec (its batch and schedule).
        case $m in
          mlp|cnn|mobilenet) set -- "$m" --batch 128 --schedule "$sched" ;;
          *) set -- --spec "$src/examples/$ex.txtpb" ;;
        esac
        "$PY" "$here/torch_ref.py" "$@" --epochs "$EPOCHS" --threads "$THREADS" \
          --max-steps "$MAX_STEPS" --start "$TORCH_START" --seed "$seed" > "$tmp/pt.$m"
        pt_sps=$("$PY" -c "print(max($pt_sps, $per * $(jget "$tmp/pt.$m" samples_per_second)))")
        [ -n "$pt_acc" ] || pt_acc=$(jget "$tmp/pt.$m" $key)
      fi
    done
    gs_accs="$gs_accs $gs_acc"
    pt_accs="$pt_accs ${pt_acc:-nan}"
    echo "  $m seed $seed: accuracy gpushare $gs_acc, PyTorch ${pt_acc:-n/a}" >> "$tmp/seeds"
  done
  mean() { "$PY" -c "import sys; v=[float(x) for x in sys.argv[1:]]; print('%.4f' % (sum(v) / len(v)))" "$@"; }
  # shellcheck disable=SC2086
  gs_acc=$(mean $gs_accs)
  if [ $have_torch = 1 ]; then
    ratio=$("$PY" -c "print('%.2f' % ($gs_sps / $pt_sps))")
    pt_sps=$("$PY" -c "print('%.0f' % $pt_sps)")
    # shellcheck disable=SC2086
    pt_acc=$(mean $pt_accs)
  else
    pt_sps=n/a; pt_acc=n/a; ratio=n/a
  fi
  printf '%-10s %14.0f %14s %8s %10.4f %10s\n' "$m" "$gs_sps" "$pt_sps" "$ratio" "$gs_acc" "$pt_acc" | tee -a "$tmp/table"
done
{
  if [ -n "$SEEDS" ]; then
    echo "accuracies: the mean over seeds $SEEDS; each seed's:"
    cat "$tmp/seeds"
  fi
  [ $have_torch = 1 ] || echo "(PyTorch not found: apt-get install python3-torch for the peer numbers)"
  best="best of $ROUNDS round(s) each"
  [ -n "$SEEDS" ] && best="best of $((ROUNDS * nseeds)) runs each ($ROUNDS round(s) x $nseeds seeds)"
  echo "epochs $EPOCHS, threads $THREADS, each example's batch (128; the GPT 32 sequences of 64 bytes), CPU, $best; ratio = gpushare / torch samples/s (training steps only; the GPT: tokens/s, and its acc columns hold the held-out loss in nats a byte); PyTorch started from $TORCH_START's initial weights and data order"
} | tee -a "$tmp/table"
gs_bench_record bench_train "bench_train.sh: gpushare-run against PyTorch" "$tmp/table" \
  "EPOCHS=$EPOCHS THREADS=$THREADS MAX_STEPS=$MAX_STEPS MODELS=\"$MODELS\" ROUNDS=$ROUNDS SEEDS=\"$SEEDS\" TORCH_START=$TORCH_START"
