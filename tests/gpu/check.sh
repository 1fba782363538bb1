#!/usr/bin/env bash
# tests/gpu/check.sh: every GPU check of gpushare, in one run on the GPU
# machine (CUDA, a C compiler, CMake and PyTorch; no libuv, protobuf-c,
# SQLite, Criterion or OpenBLAS development files; no network). Its bundle
# comes from tests/gpu/prepare.sh on the build machine (default
# build-gpu-bundle/, or $GS_GPU_BUNDLE, carried with the tree).
#
#  1. machine: the GPU, nvcc, CMake, the compiler, PyTorch;
#  2. bundle: unpacks the bundle's .deb files (OpenBLAS, the daemon's
#     libraries) into a private prefix with dpkg-deb -x (ar + tar where
#     dpkg-deb is missing); without a bundle the cpu reference uses
#     kernels/ref_blas and the product part is skipped;
#  3. build: gpushare's own CMake project for a bare GPU host (GS_CONTROL=OFF:
#     common/, kernels/ with the CUDA plugin, runtime/; GS_GPU_CHECKS=ON:
#     gpu_tests and bench_gpu), warnings not errors (a newer compiler than
#     Debian's must not spend the run);
#  4. gpu_tests: every op against the cpu op in fp32/fp16/bf16, the 50-step
#     MLP trajectory, two vdevs on one GPU; then, where compute-sanitizer
#     exists, a memcheck pass over the layer ops;
#  5. product: tests/gpu/product.sh, the real gpushared with its CUDA
#     executor serving gpu0 (the bundle's programs, this build's plugin):
#     two tenants, vdevs of compute 75 and 25, the Fashion-MNIST examples
#     through gpuctl submit --watch, planned against measured peaks, the
#     step ratio, a refused job, kill -9 of the executor, a run-time OOM,
#     a device fault in one of two jobs;
#  6. benchmark (tests/bench/bench_gpu.sh): gpushare vs PyTorch eager on a
#     bf16 MLP of 4 x 8192, batch 8192, and the ratio.
# Each part runs whatever an earlier one gave (a part that needs the build
# says so and fails), and prints "PART NAME: PASS|FAIL|SKIP" as it ends; the
# summary lists them all. Everything goes to $OUT/gpu-check.log (or
# ./gpu-check.log), tests/bench/RESULTS.md with the benchmark's section to
# $OUT/RESULTS.md, the product's daemon log to $OUT/product-daemon.log. Each
# part has its own time limit, the whole under 8 minutes. Exit 0 only when
# every part that ran passed (the benchmark reports, never fails).
#
# --device cpu runs the product part alone, on the cpu device, with the
# programs of ./build (or $GS_PRODUCT_BIN): the dry run of its logic on any
# machine.
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
results=()
result() { echo "PART $1: $2"; results+=("$1: $2"); }

if [ "${1:-}" = --device ]; then
  [ "${2:-}" = cpu ] || { echo "check.sh: --device takes cpu (the GPU run is the default)" >&2; exit 2; }
  bash tests/gpu/product.sh --device cpu --bin "${GS_PRODUCT_BIN:-$root/build/bin}" --steps "${GS_PRODUCT_STEPS:-40}"
  exit $?
fi

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
ldd --version 2>&1 | head -1

stage "bundle"
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
  result bundle PASS
else
  echo "no bundle in $bundle: the cpu reference uses kernels/ref_blas, no product part"
  result bundle "SKIP (no bundle: run tests/gpu/prepare.sh on the build machine)"
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
# warnings are not errors here: a compiler newer than Debian's may warn
# where gcc 12 does not, and must not spend the run
configure() { timeout 120 cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGS_CONTROL=OFF -DGS_TESTS=OFF -DGS_GPU_CHECKS=ON -DGS_WERROR=OFF -DGS_CUDA_WERROR=OFF "${arch[@]}" "$@" >/tmp/gs-gpu-cmake.log 2>&1 || { cat /tmp/gs-gpu-cmake.log; return 1; }; grep "gskernels:" /tmp/gs-gpu-cmake.log; }
built=0
rm -rf "$build"
if configure "${cmake_blas[@]}" && timeout 240 cmake --build "$build" -j"$jobs" --target gpu_tests bench_gpu; then
  built=1
  if ours ldd "$build/bin/gpu_tests" | grep -q "not found"; then
    echo "check.sh: the bundled OpenBLAS does not load here; rebuilding on the fallback GEMM"
    ours ldd "$build/bin/gpu_tests" | grep "not found"
    rm -rf "$build"
    blas_libs=
    built=0
    configure -DGS_REF_BLAS=ON && timeout 240 cmake --build "$build" -j"$jobs" --target gpu_tests bench_gpu && built=1
  fi
fi
echo "built in $(( $(date +%s) - t0 )) s"
if [ $built = 1 ]; then result build PASS; else result build FAIL; fi
export GS_CUDA_PLUGIN=$build/kernels/cuda/libgskernels_cuda.so

stage "gpu_tests"
if [ $built = 1 ]; then
  ours timeout 240 "$build/bin/gpu_tests"
  tests_rc=$?
  [ $tests_rc -eq 124 ] && echo "check.sh: gpu_tests ran past 240 s"
  [ $tests_rc -eq 0 ] && result gpu_tests PASS || result gpu_tests "FAIL ($tests_rc)"
  if command -v compute-sanitizer >/dev/null; then
    stage "compute-sanitizer memcheck (layer ops)"
    ours timeout 120 compute-sanitizer --tool memcheck --error-exitcode 3 "$build/bin/gpu_tests" dense conv2d depthwise maxpool gap relu xent cast cast_overlap \
      add batchnorm layernorm gelu dropout avgpool embedding posembed attention
    case $? in
      0) result memcheck PASS ;;
      124) result memcheck "SKIP (not finished in 120 s)" ;;
      *) result memcheck FAIL ;;
    esac
  fi
else
  result gpu_tests "FAIL (no build)"
fi

stage "product: gpushared with its CUDA executor on gpu0"
pbin=$bundle/product/bin
if [ $built != 1 ] || [ ! -x "$pbin/gpushared" ]; then
  result product "FAIL (needs the build and the bundle's product/bin)"
else
  # The bundle's programs with the bundle's libraries, this build's plugin.
  plibs="$prefix/usr/lib/x86_64-linux-gnu:$prefix/usr/lib/x86_64-linux-gnu/openblas-pthread"
  LD_LIBRARY_PATH="$plibs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ldd "$pbin/gpushared" "$pbin/gpushare-executor" | grep -E "not found|GLIBC" && echo "check.sh: the bundle's programs lack a library here"
  LD_LIBRARY_PATH="$plibs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" timeout 300 \
    bash tests/gpu/product.sh --device gpu0 --bin "$pbin" --data "$bundle/product/fashion-mnist" \
      --text "$bundle/product/text/cookie" --steps "${GS_PRODUCT_STEPS:-200}"
  case $? in 0) result product PASS ;; 124) result product "FAIL (ran past 300 s)" ;; *) result product FAIL ;; esac
fi

stage "benchmark"
if [ $built = 1 ]; then
  GS_BENCH_LD_LIBRARY_PATH="$blas_libs" timeout 200 bash tests/bench/bench_gpu.sh "$build/bin/bench_gpu" &&
    result benchmark "done (figures above)" || result benchmark "FAIL (did not finish)"
  # bench_gpu.sh wrote its section of tests/bench/RESULTS.md: bring it back
  [ -n "${OUT:-}" ] && cp tests/bench/RESULTS.md "$OUT/RESULTS.md" 2>/dev/null
else
  result benchmark "FAIL (no build)"
fi

stage "summary"
rc=0
for r in "${results[@]}"; do
  echo "  $r"
  case $r in *": FAIL"*) rc=1 ;; esac
done
if [ $rc -eq 0 ]; then echo "GPU checks passed"; else echo "GPU checks FAILED"; fi
exit $rc
