#!/usr/bin/env bash
# demo.sh [EPOCHS]: gpushare end to end on this machine's CPU device.
# Builds (scripts/setup.sh), starts gpushared on a private socket, creates a
# tenant and a vdev as an ops team would and shows them, then trains the
# Fashion-MNIST MLP (examples/fashion-mlp.txtpb) with progress and prints its
# test accuracy.
set -euo pipefail
cd "$(dirname "$0")/.."
EPOCHS=${1:-3}
scripts/setup.sh build
B=$PWD/build
D=$(mktemp -d /tmp/gpushare-demo-XXXXXX)
export GPUSHARE_SOCKET=$D/gpushared.sock
cleanup() { [ -n "${DPID:-}" ] && kill -TERM "$DPID" 2>/dev/null && wait "$DPID" 2>/dev/null; rm -rf "$D"; }
trap cleanup EXIT

echo
echo "== gpushared on $GPUSHARE_SOCKET (state in $D/state)"
"$B/daemon/gpushared" --foreground --state-dir "$D/state" 2>"$D/gpushared.log" &
DPID=$!
for _ in $(seq 100); do "$B/client/gpuctl" version >/dev/null 2>&1 && break; sleep 0.1; done
gpuctl() { echo "\$ gpuctl $*"; "$B/client/gpuctl" "$@"; echo; }
gpuctl devices
gpuctl tenant create ml-team --uid "$(id -u)"
gpuctl quota set ml-team --memory 4GiB --compute 100 --max-running 2 --max-queued 8
gpuctl vdev create ml0 --device cpu --memory 2GiB --compute 100 --policy growth --tenant ml-team
gpuctl tenant list
gpuctl vdev list

echo "== training examples/fashion-mlp on Fashion-MNIST (60,000 images), $EPOCHS epochs"
echo "\$ gpushare-run build/examples/fashion-mlp.pb --epochs $EPOCHS --threads $(nproc)"
"$B/daemon/train/gpushare-run" "$B/examples/fashion-mlp.pb" --epochs "$EPOCHS" --threads "$(nproc)"
