#!/usr/bin/env bash
# Devices: the control plane asks gpushare-executor --list-devices which GPUs
# the CUDA plugin can open (it never loads CUDA itself). Without a driver
# (CI), the daemon logs once why there is no GPU and serves the cpu device.
# With an executor that reports a GPU (a stand-in script, since this machine
# may have none), the GPU is listed with its name, compute capability, total
# memory and usable = total - gpu_reserve, and vdevs can be placed on it.
set -u
. "$(dirname "$0")/lib.sh"
EXE=$(dirname "$GPUSHARED")/gpushare-executor

out=$("$EXE" --list-devices); rc=$?
[ "$rc" = 0 ] && pass "gpushare-executor --list-devices exits 0 ($out)" || fail "--list-devices exited $rc"
if echo "$out" | grep -q '^gpu'; then
  echo "note - this machine has a GPU: the no-GPU checks are skipped"
  have_gpu=1
else
  have_gpu=0
  echo "$out" | grep -qE '^unavailable	.+' && pass "no GPU: it says why" || fail "no reason: $out"
  o2=$(GS_CUDA_PLUGIN=/nonexistent/libgskernels_cuda.so "$EXE" --list-devices)
  echo "$o2" | grep -q "/nonexistent/libgskernels_cuda.so" && pass "a missing plugin is named: $o2" || fail "missing plugin: $o2"
fi

start_daemon
if [ "$have_gpu" = 0 ]; then
  n=$(grep -c "no GPU device:" "$T/daemon.log")
  [ "$n" = 1 ] && pass "the daemon logs once why it has no GPU: $(grep -o 'no GPU device:.*' "$T/daemon.log")" || fail "$n 'no GPU' lines"
  expect_ok "devices" ctl --json devices
  names=$(echo "$LAST_OUT" | $PY -c "import json,sys; print(' '.join(x['name'] for x in json.load(sys.stdin)['device']))")
  [ "$names" = cpu ] && pass "only the cpu device" || fail "devices: $names"
fi
stop_daemon

# A stand-in executor that reports one H200 and runs the real one otherwise.
cat >"$T/fake-executor" <<FAKE
#!/bin/sh
if [ "\$1" = --list-devices ]; then
  printf 'gpu\t0\t150323855360\t9.0\tNVIDIA H200\n'; exit 0
fi
exec "$EXE" "\$@"
FAKE
chmod 755 "$T/fake-executor"
echo "gpu_reserve = 2GiB" >>"$CONF"
GS_EXECUTOR=$T/fake-executor start_daemon
expect_ok "devices with a GPU" ctl --json devices
echo "$LAST_OUT" | $PY -c "
import json,sys
d={x['name']:x for x in json.load(sys.stdin)['device']}
g=d['gpu0']
assert g['kind']=='cuda' and g['model']=='NVIDIA H200' and g['compute_capability']=='9.0', g
assert int(g['total_bytes'])==150323855360 and int(g['usable_bytes'])==150323855360-2*2**30, g
" && pass "gpu0: NVIDIA H200, 9.0, usable = total - gpu_reserve" || fail "gpu0 listed wrong"
expect_ok "gpuctl devices (table)" ctl devices
echo "$LAST_OUT"
echo "$LAST_OUT" | grep -q "NVIDIA H200" && pass "the table names the GPU" || fail "table: $LAST_OUT"
expect_ok "tenant" ctl tenant create t --uid 4001
expect_ok "a vdev on gpu0" ctl vdev create g0 --device gpu0 --memory 40GiB --compute 50 --tenant t
expect_fail "a vdev past gpu0's usable memory" 1 RESOURCE_EXHAUSTED ctl vdev create g1 --device gpu0 --memory 139GiB --compute 10 --tenant t
kill -0 "$DPID" && pass "gpushared serves while gpu0's executor cannot open CUDA here" || fail "gpushared died"
stop_daemon

# An executor that measured what is free after a context, cuBLASLt and a
# first matmul (less than total - gpu_reserve): vdevs get that.
cat >"$T/fake-executor" <<FAKE
#!/bin/sh
if [ "\$1" = --list-devices ]; then
  printf 'gpu\t0\t150323855360\t9.0\t100000000000\tNVIDIA H200\n'; exit 0
fi
exec "$EXE" "\$@"
FAKE
GS_EXECUTOR=$T/fake-executor start_daemon
expect_ok "devices with a measured GPU" ctl --json devices
echo "$LAST_OUT" | $PY -c "
import json,sys
d={x['name']:x for x in json.load(sys.stdin)['device']}
g=d['gpu0']
assert g['model']=='NVIDIA H200' and int(g['usable_bytes'])==100000000000, g
" && pass "gpu0: usable = what the executor found free, below total - gpu_reserve" || fail "gpu0: $LAST_OUT"
expect_fail "a vdev past what is free" 1 RESOURCE_EXHAUSTED ctl vdev create g2 --device gpu0 --memory 95GiB --compute 10 --tenant t
stop_daemon
finish
