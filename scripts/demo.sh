#!/usr/bin/env bash
# demo.sh [EPOCHS]: gpushare end to end on this machine's CPU device.
# Builds (scripts/setup.sh), starts gpushared on a private socket, creates a
# tenant, a quota and a vdev as an ops team would, uploads Fashion-MNIST as
# the tenant's datasets, then submits examples/fashion-mlp (EPOCHS, default
# 10), watches it train to the end and prints its test accuracy.
set -euo pipefail
cd "$(dirname "$0")/.."
EPOCHS=${1:-10}
scripts/setup.sh build
B=$PWD/build
D=$(mktemp -d /tmp/gpushare-demo-XXXXXX)
export GPUSHARE_SOCKET=$D/gpushared.sock
cleanup() { [ -n "${DPID:-}" ] && kill -TERM "$DPID" 2>/dev/null && wait "$DPID" 2>/dev/null; rm -rf "$D"; }
trap cleanup EXIT

echo
echo "== gpushared on $GPUSHARE_SOCKET (state in $D/state)"
"$B/bin/gpushared" --foreground --state-dir "$D/state" 2>"$D/gpushared.log" &
DPID=$!
for _ in $(seq 100); do "$B/bin/gpuctl" version >/dev/null 2>&1 && break; sleep 0.1; done
gpuctl() { echo "\$ gpuctl $*"; "$B/bin/gpuctl" "$@"; echo; }
gpuctl devices
gpuctl tenant create ml-team --uid "$(id -u)"
gpuctl quota set ml-team --memory 4GiB --compute 100 --max-running 2 --max-queued 8
gpuctl vdev create ml0 --device cpu --memory 2GiB --compute 100 --policy growth --tenant ml-team
gpuctl tenant list
gpuctl vdev list

echo "== the tenant's data: Debian's Fashion-MNIST, uploaded once (content-addressed)"
FM=/usr/share/datasets/fashion-mnist
for f in train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz; do
  "$B/bin/gpuctl" dataset add "$f" "$FM/$f" >/dev/null
done
gpuctl dataset list

echo "== examples/fashion-mlp (784-256-128-10, Adam, batch 128, $EPOCHS epochs): plan, submit, watch"
JOB=$D/fashion-mlp.pb
# The example trains 10 epochs; the demo's length is its argument.
sed "s/^epochs: .*/epochs: $EPOCHS/" examples/fashion-mlp.txtpb >"$D/fashion-mlp.txtpb"
gpuctl job encode "$D/fashion-mlp.txtpb" -o "$JOB"
gpuctl plan "$JOB" --vdev ml0
echo "\$ gpuctl submit $JOB --watch"
"$B/bin/gpuctl" submit "$JOB" --watch
ID=$("$B/bin/gpuctl" --json list | python3 -c "import json,sys; print(json.load(sys.stdin)['job'][-1]['id'])")
echo
gpuctl status "$ID"
ACC=$("$B/bin/gpuctl" --json status "$ID" | python3 -c "import json,sys; print('%.4f' % json.load(sys.stdin)['job']['epoch'][-1]['test_accuracy'])")
echo "== fashion-mlp: test accuracy $ACC after $EPOCHS epochs"
