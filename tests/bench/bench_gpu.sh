#!/usr/bin/env bash
# bench_gpu.sh BENCH_GPU_BINARY [BATCH WIDTH STEPS]: gpushare's cuda backend
# against PyTorch eager on the same GEMM-bound bf16 MLP (4 x 8192 units,
# batch 8192, forward + backward), in the same run, on the same GPU; prints
# both and the ratio of samples/s. A benchmark: it reports, it never fails
# on a number. Called by tests/gpu/check.sh. What it printed replaces the
# bench_gpu section of tests/bench/RESULTS.md (results.sh), with the GPU's
# name; GS_BENCH_RECORD=0 prints only.
set -uo pipefail
bin=${1:?usage: bench_gpu.sh BENCH_GPU_BINARY [BATCH WIDTH STEPS]}
shift
if [ $# -ge 1 ]; then args=("$@"); else args=(8192 8192 10); fi
here=$(cd "$(dirname "$0")" && pwd)
. "$here/results.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# GS_BENCH_LD_LIBRARY_PATH: libraries for gpushare's binary alone (check.sh's
# OpenBLAS bundle), kept away from PyTorch's process
ld=${GS_BENCH_LD_LIBRARY_PATH:-}
ours=$(LD_LIBRARY_PATH="$ld${LD_LIBRARY_PATH:+${ld:+:}$LD_LIBRARY_PATH}" "$bin" "${args[@]}") || { echo "bench_gpu: gpushare run failed"; exit 1; }
echo "$ours" | grep -v '^RESULT' | tee "$tmp/table"
theirs=$(python3 "$here/bench_gpu.py" "${args[@]}" 2>&1)
prc=$?
echo "$theirs" | grep -v '^RESULT' | tee -a "$tmp/table"
if [ $prc -ne 0 ]; then
  echo "bench_gpu: PyTorch run failed ($prc); no ratio" | tee -a "$tmp/table"
else
  a=$(echo "$ours" | sed -n 's/^RESULT gpushare samples_per_s=\([0-9.]*\).*/\1/p')
  b=$(echo "$theirs" | sed -n 's/^RESULT pytorch samples_per_s=\([0-9.]*\).*/\1/p')
  if [ -n "$a" ] && [ -n "$b" ]; then
    awk -v a="$a" -v b="$b" 'BEGIN { printf "ratio gpushare / pytorch (samples/s): %.3f\n", a / b }' | tee -a "$tmp/table"
  fi
fi
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
GS_BENCH_MACHINE="GPU ${gpu:-unknown}" gs_bench_record bench_gpu "bench_gpu.sh: the cuda backend against PyTorch eager" \
  "$tmp/table" "batch, width, steps: ${args[*]}"
exit 0
