# lib.sh: what every integration test shares. Source it after `set -u`.
#
# Each test gets its own directory (socket, state, config, logs) under /tmp,
# a daemon started with --foreground and stopped at exit, and helpers that
# check an exit status and the error text together, since a refusal that
# says the wrong thing is as much a bug as one that does not happen.
GPUSHARED=${1:?usage: test.sh GPUSHARED GPUCTL}
GPUCTL=${2:?usage: test.sh GPUSHARED GPUCTL}
PY=/usr/bin/python3
T=$(mktemp -d /tmp/gs-it-XXXXXX)
chmod 755 "$T"   # an unprivileged peer must reach the socket inside
SOCK=$T/gpushared.sock
STATE=$T/state
CONF=$T/gpushared.conf
DPID=
FAILS=0
CHECKS=0

cat >"$CONF" <<CONF
# written by tests/integration/lib.sh
socket_group = nogroup
socket_mode = 0660
admin_group = users
cpu_memory = 2GiB
log_level = debug
CONF

cleanup() {
  if [ -n "$DPID" ] && kill -0 "$DPID" 2>/dev/null; then kill -KILL "$DPID" 2>/dev/null; fi
  if [ "$FAILS" -ne 0 ] && [ -f "$T/daemon.log" ]; then
    echo "---- daemon log (last 40 lines, connections left out) ----"
    grep -v ' debug: connection from ' "$T/daemon.log" | tail -n 40
  fi
  rm -rf "$T"
}
trap cleanup EXIT

ctl() { "$GPUCTL" --socket "$SOCK" "$@"; }
# As uid/gid 65534 (nobody/nogroup), with extra groups given as a list.
ctl_as_nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups "$GPUCTL" --socket "$SOCK" "$@"; }
ctl_as() { local uid=$1 groups=$2; shift 2
  setpriv --reuid="$uid" --regid=65534 --groups="$groups" "$GPUCTL" --socket "$SOCK" "$@"; }

pass() { CHECKS=$((CHECKS + 1)); echo "ok - $*"; }
fail() { CHECKS=$((CHECKS + 1)); FAILS=$((FAILS + 1)); echo "FAIL - $*"; }

start_daemon() {
  "$GPUSHARED" --foreground --config "$CONF" --socket "$SOCK" --state-dir "$STATE" \
    >>"$T/daemon.log" 2>&1 &
  DPID=$!
  for _ in $(seq 1 100); do
    if ctl version >/dev/null 2>&1; then return 0; fi
    if ! kill -0 "$DPID" 2>/dev/null; then break; fi
    sleep 0.1
  done
  fail "gpushared did not come up"; tail -n 20 "$T/daemon.log"; exit 1
}

stop_daemon() {  # SIGTERM: must drain and exit 0
  kill -TERM "$DPID"
  local rc=0; wait "$DPID" || rc=$?
  DPID=
  [ "$rc" -eq 0 ] && pass "SIGTERM: gpushared exited 0" || fail "SIGTERM: gpushared exited $rc"
}

kill9_daemon() {
  kill -KILL "$DPID"; wait "$DPID" 2>/dev/null || true; DPID=
}

# expect_ok DESCRIPTION CMD...: exit 0.
expect_ok() {
  local what=$1; shift
  local out
  if out=$("$@" 2>&1); then pass "$what"; else fail "$what: exit $? : $out"; fi
  LAST_OUT=$out
}

# expect_fail DESCRIPTION EXIT CODE_OR_TEXT CMD...: that exit status, and the
# output (stderr included) contains the text.
expect_fail() {
  local what=$1 want=$2 text=$3; shift 3
  local out rc=0
  out=$("$@" 2>&1) || rc=$?
  if [ "$rc" -ne "$want" ]; then fail "$what: exit $rc, wanted $want: $out"
  elif [[ "$out" != *"$text"* ]]; then fail "$what: output lacks \"$text\": $out"
  else pass "$what"; fi
  LAST_OUT=$out
}

# A snapshot of all admin state, to check that a refusal changed nothing.
# The vdevs' live memory figures (in use, reserved, peak, free) come from the
# executor's Stats, which arrive on their own schedule (a PREALLOCATE vdev's
# reservation shows up a moment after a start), so they are left out.
snapshot() { ctl --json tenant list
  ctl --json vdev list | $PY -c "
import json, sys
d = json.load(sys.stdin)
for v in d.get('vdev', []):
    for k in ('memory_in_use', 'memory_reserved', 'memory_peak', 'memory_free',
              'memory_largest_free', 'memory_fragmentation'): v.pop(k, None)
print(json.dumps(d, sort_keys=True))"
  ctl --json devices; }

finish() {
  echo "$((CHECKS - FAILS)) passed, $FAILS failed"
  [ "$FAILS" -eq 0 ]
}

# Where the tests and the protocol's .proto are (for protoc --encode).
HERE=$(cd "$(dirname "$0")" && pwd)
PROTO=${GS_SOURCE_DIR:-$HERE/../..}/proto
export GS_PROTO_DIR=$PROTO
# A job (text format, no vdev or name) that runs until cancelled: long by its
# size, 20 million steps of a 64-256-4 net, hours on any machine, not by a
# step count that faster kernels would finish before the tests using it.
LONG_JOB='model { input { height: 8 width: 8 channels: 1 } layer { flatten {} } layer { dense { units: 256 activation: RELU } } layer { dense { units: 4 } } } train { synthetic { examples: 65536 seed: 1 classes: 4 } } batch_size: 32 epochs: 10000'
# need_protoc: a test that encodes jobs skips (77) where protoc is missing.
need_protoc() { command -v protoc >/dev/null || { echo "skip: protoc not installed"; exit 77; }; }
# json_field EXPR: print d<EXPR> of the JSON document on stdin.
json_field() { $PY -c "import json,sys; d=json.load(sys.stdin); print(eval('d'+sys.argv[1]))" "$1"; }
# A ARGS / B ARGS: gpuctl as tenant a's user (uid 4001) and tenant b's
# (uid 4002), unprivileged.
A() { ctl_as 4001 65534 "$@"; }
B() { ctl_as 4002 65534 "$@"; }
# st ID EXPR: d['job']EXPR of job ID's status, e.g. st 3 "['state']".
st() { ctl --json status "$1" | json_field "['job']$2"; }
# mlp_job NAME VDEV STEPS [UNITS [EXAMPLES [MORE]]]: $T/NAME.pb (and
# .txtpb), a 784-UNITS-10 MLP (UNITS 256) on EXAMPLES (4096) synthetic
# examples for STEPS steps, with MORE in the spec (default: a checkpoint
# every 25 steps).
mlp_job() {
  cat >"$T/$1.txtpb" <<JOB
name: "$1" vdev: "$2"
model { input { height: 28 width: 28 channels: 1 }
  layer { flatten {} } layer { dense { units: ${4:-256} activation: RELU } } layer { dense { units: 10 } } }
train { synthetic { examples: ${5:-4096} seed: 7 classes: 10 } }
batch_size: 64 epochs: 1000 max_steps: $3 seed: 1 ${6-checkpoint_every_steps: 25}
optimizer { adam { learning_rate: 0.001 } }
JOB
  protoc --encode=gpushare.v1.JobSpec --proto_path="$PROTO" gpushare.proto <"$T/$1.txtpb" >"$T/$1.pb"
  chmod 644 "$T/$1.pb"; }
# wait_state ID STATE [SECONDS]: until job ID is in STATE (default 60 s).
wait_state() {
  local s; for _ in $(seq $((${3:-60} * 10))); do
    s=$(ctl --json status "$1" 2>/dev/null | json_field "['job']['state']" 2>/dev/null)
    [ "$s" = "$2" ] && return 0; sleep 0.1; done
  echo "job $1 is $s, not $2"; return 1; }
