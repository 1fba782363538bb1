#!/usr/bin/env bash
# test.sh: the whole gpushare test suite, from a fresh Debian 12 machine.
# Builds twice (plain, then AddressSanitizer + UndefinedBehaviorSanitizer)
# and runs every unit and integration test in each build. GPU tests skip
# with their reason where no GPU answers.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=$(nproc)

echo "== build (RelWithDebInfo)"
# python3-torch: the peer test_torch_parity trains the examples against
GS_EXTRA_PKGS=python3-torch scripts/setup.sh build -DCMAKE_BUILD_TYPE=RelWithDebInfo
echo "== tests"
ctest --test-dir build --output-on-failure -j"$JOBS"

echo "== build (ASan + UBSan)"
scripts/setup.sh build-asan -DCMAKE_BUILD_TYPE=Debug -DGS_SANITIZE=ON
echo "== tests under ASan + UBSan"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
ctest --test-dir build-asan --output-on-failure -j"$JOBS"
echo "== fuzz (libFuzzer + ASan + UBSan, 30 s per target on the committed corpus)"
scripts/fuzz.sh 30
echo "== all tests passed in both builds"
