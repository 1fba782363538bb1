#!/usr/bin/env bash
# control_deps.sh [DIR]: the include graph of control/ (default: the
# repository's), one module a line with what it includes, and a check that
# it has no cycle. X.c and X.h are one module; an edge is a line
# `#include "control/Y.h"` in X.c or X.h, Y not X. tsort(1) orders the
# modules (lowest first) or names a loop; the script exits 1 on a loop.
set -euo pipefail
DIR=${1:-$(dirname "$0")/../control}
edges=$(for f in "$DIR"/*.c "$DIR"/*.h; do
  m=$(basename "$f"); m=${m%.*}
  sed -n 's|^#include "control/\([A-Za-z0-9_]*\)\.h".*|\1|p' "$f" | while read -r dep; do
    [ "$dep" = "$m" ] || echo "$m $dep"
  done
done | sort -u)
echo "== control/ include graph (module: what it includes)"
echo "$edges" | awk '{d[$1] = d[$1] " " $2} END {for (m in d) print m ":" d[m]}' | sort
err=$(mktemp)
trap 'rm -f "$err"' EXIT
order=$(echo "$edges" | tsort 2>"$err") || true
if [ -s "$err" ]; then
  cat "$err" >&2
  echo "control_deps: the include graph of control/ has a cycle (above)" >&2
  exit 1
fi
echo "== acyclic; from the top down:"
echo $order
