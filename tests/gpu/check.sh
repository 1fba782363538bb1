#!/usr/bin/env bash
# tests/gpu/check.sh: every GPU check of gpushare, in one run on the GPU
# machine (CUDA, a C compiler, CMake and PyTorch; no libuv, protobuf-c,
# SQLite, Criterion or OpenBLAS development files; no network).
#
#  1. unpacks the OpenBLAS .deb bundle of tests/gpu/prepare.sh (default
#     build-gpu-bundle/, or $GS_GPU_BUNDLE) into a private prefix with
#     dpkg-deb -x (ar + tar where dpkg-deb is missing); without a bundle the
#     cpu reference uses tests/gpu/fallback/ref_blas.c;
#  2. builds gpushare's own CMake project for a bare GPU host
#     (GS_CONTROL=OFF: common/, kernels/ with the CUDA plugin, runtime/;
#     GS_GPU_CHECKS=ON: gpu_tests and bench_gpu), the same libraries
#     gpushared links;
#  3. runs gpu_tests: every op against the cpu op in fp32/fp16/bf16, the
#     50-step MLP trajectory, two vdevs on one GPU (over-quota OOM vs a job
#     that finishes); then, where compute-sanitizer exists, a memcheck pass
#     over the layer ops;
#  4. runs the GPU benchmark (tests/bench/bench_gpu.sh): gpushare vs
#     PyTorch eager on a bf16 MLP of 4 x 8192, batch 8192, and the ratio.
# Everything goes to $OUT/gpu-check.log (or ./gpu-check.log), and
# tests/bench/RESULTS.md with the benchmark's section to $OUT/RESULTS.md. Each stage
# has its own time limit, the whole well under 8 minutes. Exit 0 only when
# the build and gpu_tests passed (the benchmark reports, never fails).
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
log=${OUT:-.}/gpu-check.log
exec > >(tee "$log") 2>&1
export PATH=/usr/local/cuda/bin:$PATH
jobs=$(nproc 2>/dev/null || echo 4)
stage() { echo; echo "== $* ($(date +%T))"; }

stage "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader 2>&1 || true
nvcc --version 2>&1 | tail -1
cmake --version 2>&1 | head -1
cc --version 2>&1 | head -1
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1 || true

stage "OpenBLAS bundle"
bundle=${GS_GPU_BUNDLE:-$root/build-gpu-bundle}
prefix=/tmp/gs-gpu-prefix
cmake_blas=(-DGS_REF_BLAS=ON)
blas_libs=
# run a gpushare program with the bundle's libraries (PyTorch runs without them)
ours() { env LD_LIBRARY_PATH="$blas_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$@"; }
if ls "$bundle"/*.deb >/dev/null 2>&1; then
  rm -rf "$prefix" && mkdir -p "$prefix"
  for f in "$bundle"/*.deb; do
    if command -v dpkg-deb >/dev/null; then
      dpkg-deb -x "$f" "$prefix"
    else
      (t=$(mktemp -d) && cd "$t" && ar x "$f" && tar -xf data.tar.* -C "$prefix" && rm -rf "$t")
    fi || echo "check.sh: could not unpack $f"
  done
  cmake_blas=(-DGS_BLAS_PREFIX="$prefix" -DCMAKE_PREFIX_PATH="$prefix/usr")
  # for gpushare's programs only (libopenblas finds libgfortran through it);
  # PyTorch runs without it, on its own libraries
  blas_libs="$prefix/usr/lib/x86_64-linux-gnu/openblas-pthread:$prefix/usr/lib/x86_64-linux-gnu"
  echo "unpacked $(ls "$bundle"/*.deb | wc -l) packages into $prefix"
else
  echo "no bundle in $bundle: the cpu reference uses tests/gpu/fallback/ref_blas.c"
fi

stage "build"
build=$root/build-gpu
t0=$(date +%s)
# machine code for this GPU only (9.0 -> 90-real): a third of nvcc's time
# of the default 80-real;90-real;90-virtual, which the device minutes pay for
cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
arch=()
case $cap in [0-9][0-9]|[0-9][0-9][0-9]) arch=(-DGS_CUDA_ARCHS="$cap-real") ;; esac
echo "CUDA architectures: ${arch[*]:-the plugin default}"
configure() { timeout 120 cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGS_CONTROL=OFF -DGS_TESTS=OFF -DGS_GPU_CHECKS=ON "${arch[@]}" "$@" >/tmp/gs-gpu-cmake.log 2>&1 || { cat /tmp/gs-gpu-cmake.log; return 1; }; grep "gskernels:" /tmp/gs-gpu-cmake.log; }
rm -rf "$build"
if ! configure "${cmake_blas[@]}"; then
  echo "check.sh: configure failed"; exit 1
fi
if ! timeout 240 cmake --build "$build" -j"$jobs" --target gpu_tests bench_gpu; then
  echo "check.sh: build failed"; exit 1
fi
if ours ldd "$build/bin/gpu_tests" | grep -q "not found"; then
  echo "check.sh: the bundled OpenBLAS does not load here; rebuilding on the fallback GEMM"
  ours ldd "$build/bin/gpu_tests" | grep "not found"
  rm -rf "$build"
  blas_libs=
  configure -DGS_REF_BLAS=ON && timeout 240 cmake --build "$build" -j"$jobs" --target gpu_tests bench_gpu || { echo "check.sh: build failed"; exit 1; }
fi
echo "built in $(( $(date +%s) - t0 )) s"
export GS_CUDA_PLUGIN=$build/kernels/cuda/libgskernels_cuda.so

stage "gpu_tests"
ours timeout 240 "$build/bin/gpu_tests"
tests_rc=$?
[ $tests_rc -eq 124 ] && echo "check.sh: gpu_tests ran past 240 s"

if command -v compute-sanitizer >/dev/null; then
  stage "compute-sanitizer memcheck (layer ops)"
  ours timeout 120 compute-sanitizer --tool memcheck --error-exitcode 3 "$build/bin/gpu_tests" dense conv2d depthwise maxpool gap relu xent cast \
    add batchnorm layernorm gelu dropout avgpool
  san_rc=$?
  case $san_rc in
    0) echo "memcheck: clean" ;;
    124) echo "memcheck: not finished in 120 s (not counted)" ;;
    *) echo "memcheck: FAILED ($san_rc)"; [ $tests_rc -eq 0 ] && tests_rc=3 ;;
  esac
fi

stage "benchmark"
GS_BENCH_LD_LIBRARY_PATH="$blas_libs" timeout 200 bash tests/bench/bench_gpu.sh "$build/bin/bench_gpu" || echo "check.sh: benchmark did not finish"

# bench_gpu.sh wrote its section of tests/bench/RESULTS.md: bring it back
[ -n "${OUT:-}" ] && cp tests/bench/RESULTS.md "$OUT/RESULTS.md" 2>/dev/null

stage "summary"
if [ $tests_rc -eq 0 ]; then echo "GPU checks passed"; else echo "GPU checks FAILED ($tests_rc)"; fi
exit $tests_rc
