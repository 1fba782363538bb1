#!/usr/bin/env bash
# test.sh: the whole gpushare test suite, from a fresh Debian 12 machine.
# Builds four ways and runs the tests in each, warnings as errors
# (GS_WERROR, set by scripts/setup.sh):
#   build/        gcc, RelWithDebInfo: every unit and integration test
#   build-asan/   gcc, Debug, AddressSanitizer + UndefinedBehaviorSanitizer:
#                 every unit and integration test but the two that train the
#                 examples on real data (PyTorch parity, the examples' short
#                 runs), minutes each unsanitized and many times that in a
#                 Debug build under the sanitizers
#   build-release gcc, Release: the unit tests and the integration tests
#   build-clang   clang, the default build type: the unit tests and the
#                 integration tests
# then 20 s of each libFuzzer target. GPU tests skip with their reason where
# no GPU answers. The CUDA plugin is built (nvcc, warnings as errors) in the
# first two passes; nvcc compiles it the same whatever the C compiler, so
# the Release and clang passes leave it out (GS_CUDA=OFF), and the
# integration tests of the operating system's side (the Debian package,
# systemd, socket activation, limits and floods, protocol garbage, executor
# crashes, a full disk) and the two that measure (PyTorch parity, compute
# shares): what they check does not change with the compiler, and the first
# two passes run them.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=$(nproc)
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
SAME='integration_test_(torch_parity|examples|shares|package|systemd|socket_activation|limits|garbage|executor_crash|diskfull|jobflood|floods|slurm)'
# The two that train the examples on real data for minutes: their ops and
# layers run under the sanitizers in the unit tests (test_layers,
# test_graph, test_norm_ops, test_attn_ops), at a fraction of the cost.
TRAINS='integration_test_(torch_parity|examples)'

echo "== build (gcc, RelWithDebInfo)"
# python3-torch: the peer test_torch_parity trains the examples against
GS_EXTRA_PKGS=python3-torch scripts/setup.sh build -DCMAKE_BUILD_TYPE=RelWithDebInfo
echo "== tests"
ctest --test-dir build --output-on-failure -j"$JOBS"

echo "== build (gcc, Debug, ASan + UBSan)"
scripts/setup.sh build-asan -DCMAKE_BUILD_TYPE=Debug -DGS_SANITIZE=ON
echo "== tests under ASan + UBSan"
ctest --test-dir build-asan --output-on-failure -j"$JOBS" -E "$TRAINS"

echo "== build (gcc, Release)"
scripts/setup.sh build-release -DCMAKE_BUILD_TYPE=Release -DGS_CUDA=OFF
echo "== tests (Release)"
ctest --test-dir build-release --output-on-failure -j"$JOBS" -E "$SAME"

echo "== build (clang, default build type)"
CC=clang scripts/setup.sh build-clang -DGS_CUDA=OFF
echo "== tests (clang)"
ctest --test-dir build-clang --output-on-failure -j"$JOBS" -E "$SAME"

echo "== fuzz (libFuzzer + ASan + UBSan, 20 s per target on the committed corpus)"
scripts/fuzz.sh 20
echo "== all tests passed in every build"
