# results.sh: sourced by the benchmark scripts (POSIX sh). gs_bench_record
# writes one benchmark's figures into tests/bench/RESULTS.md: the section
# between its own markers,
#   <!-- KEY: begin -->  ...  <!-- KEY: end -->
# is replaced and every other line of the file is kept; a section not yet
# in the file is appended. The section states the machine (nproc, the CPU
# model from /proc/cpuinfo and the vector units its flags name, which the
# CPU kernels and PyTorch's both choose by, then $GS_BENCH_MACHINE when
# set: a GPU's name),
# the date and the run's settings (NOTE).
# GS_BENCH_RESULTS names another file (a scratch copy, a run elsewhere);
# GS_BENCH_RECORD=0 leaves the file alone (a trial run).
#
#   gs_bench_record KEY TITLE FILE [NOTE]
#     KEY    the markers' name: bench_train, bench_daemon.overhead, ...
#     TITLE  the section's heading
#     FILE   the figures, as the script printed them (kept verbatim)
#     NOTE   the run's settings (ROUNDS=4 MODELS=mlp, ...)
#
# Names are prefixed _gsr_: the scripts that source this use plain ones.

_gsr_dir=$(cd "$(dirname "${BASH_SOURCE:-$0}")" && pwd)

gs_bench_record() {
  [ "${GS_BENCH_RECORD:-1}" = 0 ] && return 0
  _gsr_key=$1 _gsr_title=$2 _gsr_body=$3 _gsr_note=${4:-}
  _gsr_res=${GS_BENCH_RESULTS:-$_gsr_dir/RESULTS.md}
  [ -f "$_gsr_body" ] || { echo "gs_bench_record: no figures file $_gsr_body" >&2; return 1; }
  _gsr_cpu=$(sed -n 's/^model name[[:space:]]*:[[:space:]]*//p' /proc/cpuinfo 2>/dev/null | head -n 1)
  _gsr_isa=$(sed -n 's/^flags[[:space:]]*:[[:space:]]*//p' /proc/cpuinfo 2>/dev/null | head -n 1 |
    tr ' ' '\n' | grep -x -E 'avx2|avx512f|avx512_bf16|amx_tile' | tr '\n' ' ' | sed 's/ $//')
  _gsr_sec=$(mktemp) || return 1
  {
    echo "<!-- $_gsr_key: begin -->"
    echo "## $_gsr_title"
    echo
    echo "Machine: $(nproc) CPUs (nproc), ${_gsr_cpu:-CPU model unknown}${_gsr_isa:+ ($_gsr_isa)}${GS_BENCH_MACHINE:+; $GS_BENCH_MACHINE}."
    echo "Date: $(date -u '+%Y-%m-%d %H:%M UTC')."
    [ -z "$_gsr_note" ] || echo "Run: $_gsr_note."
    echo
    echo '```text'
    cat "$_gsr_body"
    echo '```'
    echo "<!-- $_gsr_key: end -->"
  } >"$_gsr_sec"
  if [ ! -f "$_gsr_res" ]; then
    printf '# Benchmark results\n\nWritten by the scripts in tests/bench/; see docs/operations.md, Benchmarks.\n' >"$_gsr_res"
  fi
  # The new file beside the old one, then renamed over it: a run stopped
  # halfway leaves the previous file whole.
  _gsr_new=$(mktemp "$_gsr_res.XXXXXX") || { rm -f "$_gsr_sec"; return 1; }
  if awk -v begin="<!-- $_gsr_key: begin -->" -v end="<!-- $_gsr_key: end -->" -v sec="$_gsr_sec" '
      function put(  l) { while ((getline l < sec) > 0) print l; close(sec); done = 1 }
      $0 == begin { put(); skip = 1; next }
      skip && $0 == end { skip = 0; next }
      skip { next }
      { print }
      END { if (skip) exit 1; if (!done) { print ""; put() } }' "$_gsr_res" >"$_gsr_new"; then
    chmod 644 "$_gsr_new"
    mv "$_gsr_new" "$_gsr_res"
    echo "figures written to $_gsr_res (section $_gsr_key)"
  else
    echo "gs_bench_record: $_gsr_res has \"<!-- $_gsr_key: begin -->\" without its end marker; left as it was" >&2
    rm -f "$_gsr_new"
  fi
  rm -f "$_gsr_sec"
}
