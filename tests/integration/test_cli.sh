#!/usr/bin/env bash
# gpuctl as a script sees it: plan's exit status (3 when the job does not
# fit its vdev, with what would fit still printed), the vdev plan chooses
# (as submit does: the named one, else the tenant's only one; several must
# be named), counts in the singular, list's PROGRESS of a running job and
# its --all refused as the admins' view, and --json errors as JSON.
set -u
. "$(dirname "$0")/lib.sh"
need_protoc

# job NAME TXTPB: encode a text JobSpec into $T/NAME.pb
job() { printf '%s\n' "$2" >"$T/$1.txtpb"
  protoc --encode=gpushare.v1.JobSpec --proto_path="$PROTO" gpushare.proto <"$T/$1.txtpb" >"$T/$1.pb"
  chmod 644 "$T/$1.pb"; }

start_daemon
expect_ok "tenant a" ctl tenant create a --uid 4001
expect_ok "vdev a0 (64 MiB)" ctl vdev create a0 --memory 64MiB --compute 10 --tenant a
# 1024 x 28x28x64 activations: about 600 MiB planned, far over a0
job big "name: \"big\"
model { input { height: 28 width: 28 channels: 1 }
  layer { conv2d { filters: 64 kernel_size: 3 padding: SAME activation: RELU } }
  layer { flatten {} } layer { dense { units: 10 } } }
train { synthetic { examples: 2048 seed: 7 classes: 10 } }
batch_size: 1024 max_steps: 3 seed: 1"
job small "name: \"small\"
model { input { height: 8 width: 8 channels: 1 } layer { flatten {} } layer { dense { units: 4 } } }
train { synthetic { examples: 256 seed: 3 classes: 4 } } batch_size: 32 epochs: 1"
job long "name: \"long\" $LONG_JOB"

# --- plan: the tenant's only vdev, exit 3 when the job does not fit --------
expect_fail "plan of a job over the tenant's only vdev exits 3" 3 "does NOT fit" A plan "$T/big.pb"
[[ "$LAST_OUT" == *"vdev: a0 (your tenant's only vdev)"* ]] && pass "plan names the vdev it chose" ||
  fail "plan did not name a0: $LAST_OUT"
[[ "$LAST_OUT" == *"peak: "*" of vdev a0's "*" limit: does NOT fit"* && "$LAST_OUT" == *"what fits: micro-batch 128 x 8"* ]] &&
  pass "it still prints the plan and what fits" || fail "plan output: $LAST_OUT"
[[ "$LAST_OUT" == *"micro-batch 1024 x 1 accumulation step"$'\n'* && "$LAST_OUT" != *"x 1 accumulation steps"* ]] &&
  pass "one accumulation step, in the singular" || fail "plural: $LAST_OUT"
A --json plan "$T/big.pb" >"$T/big.json"; rc=$?
[ "$rc" = 3 ] && [ "$(json_field "['plan']['vdev']" <"$T/big.json")" = a0 ] &&
  [ "$(json_field "['plan']['fits']" <"$T/big.json")" = False ] &&
  pass "--json plan: exit 3, the plan against a0 on stdout" || fail "--json plan: exit $rc: $(head -c 300 "$T/big.json")"
expect_ok "plan of a job that fits exits 0" A plan "$T/small.pb"
[[ "$LAST_OUT" == *"of vdev a0's"*"limit: fits"* ]] && pass "it fits a0" || fail "small plan: $LAST_OUT"
expect_ok "an admin of no tenant plans without a limit" ctl plan "$T/big.pb"
[[ "$LAST_OUT" != *"limit"* ]] && pass "no limit, no vdev" || fail "admin plan: $LAST_OUT"
expect_ok "vdev a1" ctl vdev create a1 --memory 64MiB --compute 10 --tenant a
expect_fail "with two vdevs plan asks which" 1 "tenant a has 2 (a0, a1): name one with gpuctl plan --vdev NAME" \
  A plan "$T/big.pb"
expect_fail "and so does submit, in its own words" 1 "tenant a has 2 (a0, a1): name one with vdev: \"NAME\" in the job or gpuctl submit --vdev NAME" \
  A submit "$T/small.pb"
expect_fail "plan --vdev a1 judges a1" 3 "of vdev a1's" A plan "$T/big.pb" --vdev a1
expect_ok "vdev a1 deleted" ctl vdev delete a1

# --- list: PROGRESS of a running job; --all is the admins' view ------------
expect_ok "submit a long job" A submit "$T/long.pb"
lid=$(echo "$LAST_OUT" | sed -n 's/^job \([0-9]*\) submitted.*/\1/p')
wait_state "$lid" RUNNING || fail "the long job is not running"
for _ in $(seq 100); do [ "$(A --json status "$lid" | json_field "['job'].get('step',0)")" -gt 0 ] && break; sleep 0.1; done
expect_ok "list" A list
row=$(echo "$LAST_OUT" | awk -v id="$lid" '$1 == id')
[[ "$row" =~ RUNNING\ +epoch\ [0-9]+,\ step\ [0-9]+/20480000\ \([0-9.]+%\) ]] &&
  pass "a running job's PROGRESS is its epoch and step: $(echo "$row" | grep -o 'epoch.*%)')" || fail "list row: $LAST_OUT"
expect_ok "list --help says what list lists" A list --help
[[ "$LAST_OUT" == *"finished ones included"* && "$LAST_OUT" == *"every tenant's jobs"*"(an admin view)"* ]] &&
  pass "list --help: finished jobs included, --all an admin view" || fail "list --help: $LAST_OUT"
expect_fail "a tenant's --all is refused as the admins' view" 1 \
  "--all is the admins' view of every tenant's jobs; uid 4001 is not root and not in the admin group (without --all, gpuctl list shows tenant a's jobs)" \
  A list --all
expect_ok "cancel the long job" A cancel "$lid"

# --- --json errors: one object on stderr, the exit status unchanged ---------
out=$(A --json list --all 2>&1 >/dev/null); rc=$?
[ "$rc" = 1 ] && echo "$out" | $PY -c "
import json, sys
e = json.loads(sys.stdin.read())['error']
assert e['code'] == 'PERMISSION_DENIED' and e['field'] == 'list_jobs.all' and 'admins' in e['message'], e" &&
  pass "--json list --all: exit 1, a PERMISSION_DENIED object on stderr" || fail "--json list --all: exit $rc: $out"
out=$(A --json submit "$T/big.pb" 2>&1 >/dev/null); rc=$?
[ "$rc" = 1 ] && echo "$out" | $PY -c "
import json, sys
e = json.loads(sys.stdin.read())['error']
assert e['code'] == 'RESOURCE_EXHAUSTED' and 'what fits' in e['message'] and e['plan']['fits'] is False, e" &&
  pass "--json submit over the vdev: the refusal with its plan, as one object" || fail "--json submit: exit $rc: $out"

stop_daemon
finish
