#!/usr/bin/env bash
# A job that lives through a kill -9 of gpushared: it resumes from its last
# checkpoint and ends with its whole history, the epochs before the crash
# and after it, in gpuctl status and in watch's last line; its log says
# gpushared went down under it.
set -u
. "$(dirname "$0")/lib.sh"
need_protoc
start_daemon
expect_ok "tenant a" ctl tenant create a --uid 4001
expect_ok "vdev a0" ctl vdev create a0 --memory 256MiB --compute 50 --tenant a
# Four epochs of 4096 steps (seconds each: gpushared stores an epoch end
# at once when the last was stored more than a second before, and a crash
# right after an epoch end it had not stored yet would lose that epoch's
# figures), a checkpoint at each epoch end.
printf 'name: "four" vdev: "a0" model { input { height: 28 width: 28 channels: 1 } layer { flatten {} } layer { dense { units: 256 activation: RELU } } layer { dense { units: 4 } } } train { synthetic { examples: 131072 seed: 5 classes: 4 } } test { synthetic { examples: 512 seed: 5 classes: 4 } } batch_size: 32 epochs: 4\n' |
  protoc --encode=gpushare.v1.JobSpec --proto_path="$PROTO" gpushare.proto >"$T/four.pb"
chmod 644 "$T/four.pb"
out=$(ctl_as 4001 65534 submit "$T/four.pb" 2>&1)
[[ "$out" =~ ^job\ ([0-9]+)\ submitted ]] || { fail "submit: $out"; finish; exit 1; }
id=${BASH_REMATCH[1]}
epochs() { ctl --json status "$id" | json_field ".get('job', {}).get('epoch', []).__len__()"; }
n=0
for _ in $(seq 1200); do n=$(epochs); [ "$n" -ge 2 ] && break; sleep 0.1; done
[ "$n" -ge 2 ] && [ "$n" -lt 4 ] && pass "epoch $n of 4 done: gpushared is killed (kill -9)" ||
  fail "the job had $n epochs when the crash was due (2 or 3 wanted)"
kill9_daemon
start_daemon
expect_ok "after the restart, watch follows the job to its end" ctl_as 4001 65534 watch "$id"
[[ "$LAST_OUT" == *"SUCCEEDED"*"after 4 epochs"* ]] && pass "watch: SUCCEEDED after 4 epochs" ||
  fail "watch: $LAST_OUT"
ctl --json status "$id" >"$T/four.json"
$PY - "$T/four.json" <<'PY' && pass "its record has epochs 1, 2, 3 and 4, each once" ||
import json, sys
e = [m["epoch"] for m in json.load(open(sys.argv[1]))["job"]["epoch"]]
assert e == [1, 2, 3, 4], e
PY
  fail "epochs after the restart: $($PY -c "import json,sys; print([m['epoch'] for m in json.load(open(sys.argv[1]))['job']['epoch']])" "$T/four.json")"
A_logs=$(ctl_as 4001 65534 logs "$id")
[[ "$A_logs" == *"gpushared started again after stopping without checkpointing this job"* ]] &&
  pass "its log says gpushared died under it and it resumed" || fail "no crash line in its log"
stop_daemon
finish
