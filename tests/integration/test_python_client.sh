#!/usr/bin/env bash
# The Python client (clients/python, the gpushare package as the build
# assembles it) against a real daemon: python_client.py makes every call of
# the protocol through it, checks errors and permissions, and runs the
# session of clients/python/README.md as it stands.
set -u
. "$(dirname "$0")/lib.sh"
$PY -c "import google.protobuf" 2>/dev/null || { echo "skip: python3-protobuf not installed"; exit 77; }
BUILD=${GS_BUILD_DIR:-$(cd "$(dirname "$GPUSHARED")/.." && pwd)}
PKG=$BUILD/clients/python
[ -f "$PKG/gpushare/gpushare_pb2.py" ] || { fail "no $PKG/gpushare/gpushare_pb2.py: build the gs_python target"; finish; exit 1; }
export GS_BUILD_DIR=$BUILD

start_daemon
WORK=$T/py; mkdir -p "$WORK"
if GPUSHARE_SOCKET=$SOCK PYTHONPATH=$PKG $PY "$HERE/python_client.py" "$GPUCTL" "${GS_SOURCE_DIR:-$HERE/../..}" "$WORK"; then
  pass "python_client.py"
else
  fail "python_client.py"
fi
stop_daemon
finish
