#!/usr/bin/env bash
# fuzz.sh [SECONDS] [TARGET...]: build gpushare's libFuzzer targets
# (tests/fuzz/) with clang, AddressSanitizer and UndefinedBehaviorSanitizer,
# and run each for SECONDS (default 30) on a copy of its committed corpus
# (tests/fuzz/corpus/TARGET/); the repository is never written to.
# TARGET is wire, request, jobspec, idx, npy, ckpt or size (default: all, one
# after the other). Prints the executions per target; exits non-zero on any
# crash, leak, timeout or out-of-memory, naming the reproducer, which can be
# rerun with: build-fuzz/bin/fuzz_TARGET REPRODUCER
# Environment: GS_FUZZ_BUILD (default build-fuzz), GS_FUZZ_WORK (default a
# temporary directory, removed afterwards unless something failed),
# GS_FUZZ_JOBS (build parallelism, default nproc), GS_FUZZ_CC (default clang).
# Installs nothing: clang and its libFuzzer runtime must be there.
set -euo pipefail
cd "$(dirname "$0")/.."
ALL=(wire request jobspec idx npy ckpt size)
SECS=${1:-30}
shift || true
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=("${ALL[@]}")
case "$SECS" in '' | *[!0-9]*) echo "fuzz.sh: SECONDS must be a whole number, not \"$SECS\"" >&2; exit 2 ;; esac
for t in "${TARGETS[@]}"; do
  [[ " ${ALL[*]} " == *" $t "* ]] || {
    echo "fuzz.sh: no fuzz target \"$t\"; targets: ${ALL[*]}" >&2
    exit 2
  }
done

CC=${GS_FUZZ_CC:-clang} # not $CC: a CI that sets CC=gcc for the main builds still fuzzes with clang
command -v "$CC" >/dev/null || {
  echo "fuzz.sh: $CC is not installed; the fuzz targets need clang with libFuzzer" \
       "(Debian 12: apt-get install clang libclang-rt-14-dev)" >&2
  exit 1
}
"$CC" --version | head -1 | grep -qi clang || {
  echo "fuzz.sh: CC=$CC is not clang; libFuzzer is clang's" >&2
  exit 1
}
rt=$("$CC" -print-file-name=libclang_rt.fuzzer-x86_64.a 2>/dev/null || true)
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
printf 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n) { (void)d; (void)n; return 0; }\n' >"$probe/p.c"
"$CC" -fsanitize=fuzzer,address,undefined "$probe/p.c" -o "$probe/p" 2>"$probe/err" || {
  echo "fuzz.sh: $CC cannot link -fsanitize=fuzzer,address,undefined: the libFuzzer runtime" \
       "(${rt:-libclang_rt.fuzzer}) or a sanitizer runtime is missing" \
       "(Debian 12: apt-get install libclang-rt-14-dev, which clang only recommends):" >&2
  sed 's/^/  /' "$probe/err" >&2
  exit 1
}

BUILD=${GS_FUZZ_BUILD:-build-fuzz}
JOBS=${GS_FUZZ_JOBS:-$(nproc)}
echo "== fuzz: building ${TARGETS[*]} in $BUILD"
CC="$CC" cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGS_SANITIZE=ON \
  -DGS_TESTS=OFF -DGS_CUDA=OFF \
  "-DCMAKE_C_FLAGS=-fsanitize=fuzzer-no-link -Wno-unknown-warning-option" \
  -DGS_FUZZ=ON -DGS_WERROR=ON >/dev/null
cmake --build "$BUILD" -j"$JOBS" --target "${TARGETS[@]/#/fuzz_}" >/dev/null

WORK=${GS_FUZZ_WORK:-$(mktemp -d "${TMPDIR:-/tmp}/gs-fuzz.XXXXXX")}
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:detect_stack_use_after_return=1:allocator_may_return_null=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
failed=()
for t in "${TARGETS[@]}"; do
  bin="$PWD/$BUILD/bin/fuzz_$t"
  dir="$WORK/$t"
  rm -rf "$dir"
  mkdir -p "$dir/corpus" "$dir/artifacts" "$dir/tmp"
  cp -R "tests/fuzz/corpus/$t/." "$dir/corpus/"
  set +e
  # -rss_limit_mb: a target that needs more than 2 GiB for one input is a
  # finding (the daemon would too); -timeout: one input over 10 s as well.
  (cd "$dir" && TMPDIR="$dir/tmp" "$bin" -max_total_time="$SECS" -timeout=10 \
      -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$dir/artifacts/" \
      corpus >"$dir/log" 2>&1)
  rc=$?
  set -e
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$dir/log" | tail -1)
  cov=$(grep -Eo 'cov: [0-9]+' "$dir/log" | tail -1 || true)
  repro=$(find "$dir/artifacts" -type f \( -name "crash-*" -o -name "leak-*" -o -name "timeout-*" -o -name "oom-*" \) | head -1)
  if [ $rc -ne 0 ] || [ -n "$repro" ]; then
    echo "fuzz $t: FAILED (exit $rc) after ${execs:-?} executions; reproducer: ${repro:-none written}"
    grep -E 'ERROR|SUMMARY|runtime error|^size |deadly|leak' "$dir/log" | head -8 | sed 's/^/  /'
    echo "  log: $dir/log"
    failed+=("$t")
  else
    echo "fuzz $t: ok, ${execs:-?} executions in ${SECS}s (${cov:-cov: ?}, corpus $(find "$dir/corpus" -type f | wc -l) inputs)"
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "== fuzz: ${#failed[@]} target(s) failed: ${failed[*]} (work kept in $WORK)" >&2
  exit 1
fi
[ -n "${GS_FUZZ_WORK:-}" ] || rm -rf "$WORK"
echo "== fuzz: all ${#TARGETS[@]} target(s) ran ${SECS}s without a finding"
