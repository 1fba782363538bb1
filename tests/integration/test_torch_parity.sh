#!/usr/bin/env bash
# The cpu backend against PyTorch: gpushare-run and tests/bench/torch_ref.py
# (Debian's python3-torch) train each Fashion-MNIST example from the same
# start, the same Glorot-uniform weights drawn from the spec's seed and the
# same data order (torch_ref.py --start gpushare), so whatever differs is
# arithmetic: the mean training loss of the first steps agrees to 1e-4
# relative, and so do the test loss and accuracy after
# them. Where gpushare's init, data order, forward, backward, loss, Adam or
# learning-rate schedule parted from PyTorch's, the losses would part at the
# first or second step by far more; a PyTorch run from its own draw
# (--start torch) shows the size of that gap. Skips where PyTorch is not
# installed (scripts/test.sh installs it).
# Arguments: $1 gpushared $2 gpuctl (unused: gpushare-run needs no daemon).
set -u
BUILD=${GS_BUILD_DIR:-$(cd "$(dirname "$0")/../../build" && pwd)}
SRC=${GS_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
RUN=$BUILD/bin/gpushare-run
PY=/usr/bin/python3
DATA=/usr/share/datasets/fashion-mnist
PASSED=0
FAILED=0
pass() { PASSED=$((PASSED + 1)); echo "ok - $*"; }
fail() { FAILED=$((FAILED + 1)); echo "FAIL - $*"; }

[ -x "$RUN" ] || { echo "skip: $RUN is not built"; exit 77; }
[ -f "$DATA/train-images-idx3-ubyte.gz" ] ||
  { echo "skip: Fashion-MNIST is not installed ($DATA; apt-get install dataset-fashion-mnist)"; exit 77; }
"$PY" -c 'import torch, numpy' 2>/dev/null ||
  { echo "skip: PyTorch is not installed (apt-get install python3-torch): gpushare's parity with it is not checked"; exit 77; }
T=$(mktemp -d /tmp/gs-torch-parity-XXXXXX)
trap 'rm -rf "$T"' EXIT

# last FILE KEY: KEY of the last JSON line of FILE
last() { "$PY" -c "import json,sys; print(json.loads([l for l in open(sys.argv[1]) if l.startswith('{')][-1])[sys.argv[2]])" "$1" "$2"; }
# close A B TOL: |A - B| <= TOL * max(|A|, |B|), or within TOL absolute when TOL ends in "abs"
close() { "$PY" -c "
import sys
a, b, tol = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
ok = abs(a - b) <= float(tol[:-3]) if tol.endswith('abs') else abs(a - b) <= float(tol) * max(abs(a), abs(b))
sys.exit(0 if ok else 1)" "$1" "$2" "$3"; }

# parity MODEL STEPS: both sides for STEPS optimizer steps, compared
parity() {
  local m=$1 steps=$2 sched=constant
  grep -q 'kind: COSINE' "$SRC/examples/fashion-$m.txtpb" && sched=cosine
  "$RUN" "$BUILD/examples/fashion-$m.pb" --json --max-steps "$steps" --threads 1 \
    >"$T/gs.$m" 2>"$T/gs.$m.err" || { fail "$m: gpushare-run failed: $(tail -n 3 "$T/gs.$m.err")"; return; }
  "$PY" "$SRC/tests/bench/torch_ref.py" "$m" --max-steps "$steps" --threads 1 --schedule "$sched" \
    >"$T/pt.$m" 2>"$T/pt.$m.err" || { fail "$m: torch_ref.py failed: $(tail -n 3 "$T/pt.$m.err")"; return; }
  local k a b
  for k in train_loss test_loss test_accuracy; do
    a=$(last "$T/gs.$m" $k) b=$(last "$T/pt.$m" $k)
    local tol=1e-4
    [ $k = test_accuracy ] && tol=0.003abs
    if close "$a" "$b" $tol; then pass "$m, $steps steps: $k $a (gpushare) against $b (PyTorch)"
    else fail "$m, $steps steps: $k $a (gpushare) against $b (PyTorch), allowed $tol"; fi
  done
}

parity mlp 1
parity mlp 60
parity cnn 3
parity mobilenet 3

# The comparison can tell: PyTorch from its own draw of weights and order
# lands far outside the tolerance above after one step.
"$RUN" "$BUILD/examples/fashion-mlp.pb" --json --max-steps 1 --threads 1 >"$T/gs.one" 2>/dev/null
"$PY" "$SRC/tests/bench/torch_ref.py" mlp --max-steps 1 --threads 1 --schedule cosine --start torch \
  >"$T/pt.own" 2>/dev/null
a=$(last "$T/gs.one" train_loss) b=$(last "$T/pt.own" train_loss)
if close "$a" "$b" 1e-4; then fail "mlp from PyTorch's own start: loss $b matches gpushare's $a: the check above cannot tell starts apart"
else pass "mlp from PyTorch's own start: loss $b against gpushare's $a (outside 1e-4)"; fi

echo "$PASSED passed, $FAILED failed"
[ "$FAILED" -eq 0 ]
