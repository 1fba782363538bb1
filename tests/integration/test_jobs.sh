#!/usr/bin/env bash
# Jobs through the daemon, as tenants use it: submit, watch, cancel, quotas,
# admission and auto-fit, run-time OOM, datasets, isolation between tenants,
# kill -9 in the middle of training, and metrics.
set -u
. "$(dirname "$0")/lib.sh"
need_protoc

# job NAME TXTPB: encode a text JobSpec into $T/NAME.pb
job() { printf '%s\n' "$2" >"$T/$1.txtpb"
  protoc --encode=gpushare.v1.JobSpec --proto_path="$PROTO" gpushare.proto <"$T/$1.txtpb" >"$T/$1.pb"
  chmod 644 "$T/$1.pb"; }
# synth NAME VDEV STEPS [EXTRA]: a small synthetic job
synth() { job "$1" "name: \"$1\" vdev: \"$2\"
model { input { height: 8 width: 8 channels: 1 }
  layer { flatten {} } layer { dense { units: 64 activation: RELU } } layer { dense { units: 4 } } }
train { synthetic { examples: 4096 seed: 7 classes: 4 } }
test { synthetic { examples: 512 seed: 7 classes: 4 } }
batch_size: 32 epochs: 10000 max_steps: $3 seed: 1 ${4:-checkpoint_every_steps: 20}
optimizer { adam { learning_rate: 0.003 } }"; }

OUTD=$T/out; mkdir -p "$OUTD"; chmod 777 "$OUTD"   # where tenants write fetched files
start_daemon
expect_ok "tenant a" ctl tenant create a --uid 4001 --max-running 4 --max-queued 3
expect_ok "tenant b" ctl tenant create b --uid 4002
expect_ok "vdev a0 (256 MiB)" ctl vdev create a0 --memory 256MiB --compute 65 --policy growth --tenant a
expect_ok "vdev b0 (256 MiB)" ctl vdev create b0 --memory 256MiB --compute 25 --policy growth --tenant b

# --- submit -> watch -> SUCCEEDED on real data ------------------------------
if $PY "$HERE/fashion_slice.py" 6000 "$T" >/dev/null; then
  chmod 644 "$T"/*.gz
  job fashion "name: \"fashion-slice\" vdev: \"a0\"
model { input { height: 28 width: 28 channels: 1 }
  layer { flatten {} } layer { dense { units: 128 activation: RELU } } layer { dense { units: 10 } } }
train { idx { images: \"$T/train-images.gz\" labels: \"$T/train-labels.gz\" } }
test { idx { images: \"$T/t10k-images.gz\" labels: \"$T/t10k-labels.gz\" } }
batch_size: 32 epochs: 2 seed: 1 optimizer { adam { learning_rate: 0.001 } }"
  expect_ok "submit --watch a Fashion-MNIST slice (uploads the IDX files)" A submit "$T/fashion.pb" --watch
  echo "$LAST_OUT" | tail -n 3
  id=$(A --json list | json_field "['job'][0]['id']")
  acc=$(A --json status "$id" | json_field "['job']['epoch'][-1]['test_accuracy']")
  $PY -c "import sys; sys.exit(0 if float('$acc') >= 0.72 else 1)" \
    && pass "test accuracy $acc >= 0.72 after 2 epochs on 6,000 images" || fail "accuracy $acc below 0.72"
  expect_ok "the tenant's datasets were uploaded once" A --json dataset list
  n=$(echo "$LAST_OUT" | json_field "['dataset'].__len__()")
  [ "$n" = 4 ] && pass "4 datasets (images, labels x train, test)" || fail "$n datasets: $LAST_OUT"
  # The same files, run long enough that the cancel below finds it running.
  sed 's/epochs: 2 /epochs: 500 /' "$T/fashion.txtpb" >"$T/fashion_long.txtpb"
  job fashion_long "$(cat "$T/fashion_long.txtpb")"
  expect_ok "submit again reuses the uploads" A submit "$T/fashion_long.pb"
  A --json dataset list | json_field "['dataset'].__len__()" | grep -qx 4 && pass "no duplicate uploads" || fail "datasets duplicated"
  id2=$(A --json list | json_field "['job'][-1]['id']")
  expect_ok "cancel the second one" A cancel "$id2"
  expect_ok "fetch the trained weights" A fetch "$id" -o "$OUTD/model.safetensors"
  head -c 8 "$OUTD/model.safetensors" | od -An -tu8 | grep -q . && pass "safetensors file written" || fail "no safetensors"
  expect_ok "logs" A logs "$id"
  [[ "$LAST_OUT" == *SUCCEEDED* ]] && pass "logs end in SUCCEEDED" || fail "logs: $LAST_OUT"
  # Tenant b sees none of it.
  expect_fail "b cannot see a's job" 1 NOT_FOUND B status "$id"
  expect_fail "b cannot watch a's job" 1 NOT_FOUND B watch "$id"
  expect_fail "b cannot cancel a's job" 1 NOT_FOUND B cancel "$id"
  expect_fail "b cannot fetch a's weights" 1 NOT_FOUND B fetch "$id" -o "$OUTD/stolen"
  expect_ok "b's job list is empty" B --json list
  [[ "$LAST_OUT" != *fashion* ]] && pass "b lists none of a's jobs" || fail "b saw: $LAST_OUT"
  sha=$(A --json dataset list | json_field "['dataset'][0]['sha256']")
  job steal "name: \"steal\" vdev: \"b0\" model { input { height: 28 width: 28 channels: 1 } layer { flatten {} } layer { dense { units: 10 } } }
train { idx { images: \"sha256:$sha\" labels: \"sha256:$sha\" } } batch_size: 8"
  expect_fail "b cannot use a's datasets" 1 NOT_FOUND B submit "$T/steal.pb"
else
  echo "skip - Fashion-MNIST not installed: real-data part skipped"
fi

# --- admission: over the vdev refused with the suggestion; auto_fit runs ----
job big "name: \"big\" vdev: \"b0\"
model { input { height: 28 width: 28 channels: 1 }
  layer { conv2d { filters: 64 kernel_size: 3 padding: SAME activation: RELU } }
  layer { flatten {} } layer { dense { units: 10 } } }
train { synthetic { examples: 2048 seed: 7 classes: 10 } }
batch_size: 1024 max_steps: 3 seed: 1"
expect_fail "a job over its vdev is refused" 1 RESOURCE_EXHAUSTED B submit "$T/big.pb"
[[ "$LAST_OUT" == *micro-batch* ]] && pass "the refusal suggests a micro-batch" || fail "no suggestion: $LAST_OUT"
printf 'auto_fit: true\n' >>"$T/big.txtpb"
protoc --encode=gpushare.v1.JobSpec --proto_path="$PROTO" gpushare.proto <"$T/big.txtpb" >"$T/big.pb"
expect_ok "with auto_fit it runs to success" B submit "$T/big.pb" --watch
bid=$(B --json list | json_field "['job'][-1]['id']")
B --json status "$bid" >"$T/big.json"
mb=$(json_field "['job']['micro_batch']" <"$T/big.json"); acc=$(json_field "['job']['accumulation_steps']" <"$T/big.json")
[ "$mb" -lt 1024 ] && [ $((mb * acc)) = 1024 ] && pass "auto_fit chose micro-batch $mb x $acc (effective 1024)" || fail "auto_fit: $mb x $acc"

# --- admission by the vdev's policy: a job that fits a preallocate vdev of
# exactly its planned peak plus its data (on the cpu device the dataset's
# host bytes are vdev memory), but not a growth vdev of that size, whose
# regions (2 MiB, then 4 MiB, then the rest) hold no block for its 4.5 MiB
# workspace.
# (a0 leaves compute share 10 of the cpu device for these two vdevs.)
conv32() { job "$1" "name: \"$1\" vdev: \"$2\"
model { input { height: 16 width: 16 channels: 1 }
  layer { conv2d { filters: 16 kernel_size: 3 padding: SAME activation: RELU } }
  layer { conv2d { filters: 16 kernel_size: 3 padding: SAME activation: RELU } }
  layer { flatten {} } layer { dense { units: 4 } } }
train { synthetic { examples: 512 seed: 3 classes: 4 } }
batch_size: 32 accumulation_steps: 2 max_steps: 3 seed: 1
optimizer { adam { learning_rate: 0.001 } }"; }
conv32 probe32 b0; conv32 pre32 b1; conv32 grow32 b2; conv32 small32 bsmall
peak=$(B --json plan "$T/probe32.pb" | json_field "['plan']['peak_bytes']")
data=$(B --json plan "$T/probe32.pb" --vdev b0 | json_field "['plan']['data_bytes']")
[ "$data" = $((512 * (16 * 16 + 4))) ] &&
  pass "plan --vdev: the dataset holds $data bytes on the host (512 x (256 pixels + a label))" ||
  fail "plan data_bytes: $data"
expect_ok "vdev bsmall: preallocate, the planned peak alone" \
  ctl vdev create bsmall --memory "$peak" --compute 5 --policy preallocate --tenant b
expect_fail "refused there: the data is vdev memory on the cpu device" 1 RESOURCE_EXHAUSTED \
  B submit "$T/small32.pb"
[[ "$LAST_OUT" == *"datasets hold 130.00 KiB of vdev bsmall's"*"(on the cpu device data is vdev memory)"* ]] &&
  pass "the refusal names the data and the vdev" || fail "data refusal: $LAST_OUT"
expect_ok "vdev bsmall deleted" ctl vdev delete bsmall
expect_ok "vdev b1: preallocate, exactly the job's planned peak plus its data ($peak + $data bytes)" \
  ctl vdev create b1 --memory $((peak + data)) --compute 5 --policy preallocate --tenant b
expect_ok "vdev b2: growth, the same size" ctl vdev create b2 --memory $((peak + data)) --compute 5 --policy growth --tenant b
[ "$(B --json plan "$T/pre32.pb" --vdev b1 | json_field "['plan']['fits']")" = True ] &&
  pass "gpuctl plan --vdev b1: fits the preallocate vdev" || fail "plan --vdev b1: $(B --json plan "$T/pre32.pb" --vdev b1 | head -c 300)"
[ "$(B --json plan "$T/grow32.pb" --vdev b2 | json_field "['plan']['fits']")" = False ] &&
  pass "gpuctl plan --vdev b2: does not fit the growth vdev" || fail "plan --vdev b2: $(B --json plan "$T/grow32.pb" --vdev b2 | head -c 300)"
expect_ok "admitted on the preallocate vdev as submitted, and runs to success" B submit "$T/pre32.pb" --watch
pid32=$(B --json list | json_field "['job'][-1]['id']")
B --json status "$pid32" >"$T/pre32.json"
[ "$(json_field "['job']['micro_batch']" <"$T/pre32.json") x $(json_field "['job']['accumulation_steps']" <"$T/pre32.json")" = "32 x 2" ] &&
  [ "$(json_field "['job']['state']" <"$T/pre32.json")" = SUCCEEDED ] &&
  pass "it ran at micro-batch 32 x 2 and SUCCEEDED" || fail "preallocate job: $(head -c 400 "$T/pre32.json")"
expect_fail "refused on the growth vdev of the same size" 1 RESOURCE_EXHAUSTED B submit "$T/grow32.pb"
[[ "$LAST_OUT" == *"growth vdev reserves its memory in regions"* ]] &&
  pass "the refusal names the growth regions" || fail "growth refusal: $LAST_OUT"

# --- submit's flags: --vdev and --priority take the place of the spec's,
# and a job that cannot fit the vdev it names uploads nothing.
out=$(B --json submit "$T/probe32.pb" --vdev b1 --priority 7) &&
  [ "$(echo "$out" | json_field "['job']['vdev']")" = b1 ] &&
  [ "$(echo "$out" | json_field "['job']['priority']")" = 7 ] &&
  pass "submit --vdev b1 --priority 7: the spec's vdev b0 and priority 0 are replaced" ||
  fail "submit --vdev --priority: $out"
wait_state "$(echo "$out" | json_field "['job']['id']")" SUCCEEDED 60 >/dev/null ||
  fail "the job submitted with --vdev b1 did not succeed"
expect_fail "submit --priority 2147483648: refused as a usage error" 2 "2147483648 is out of range" \
  B submit "$T/probe32.pb" --priority 2147483648
# A job without a test set has no test loss or accuracy: none is printed.
job notest "name: \"notest\" vdev: \"b0\"
model { input { height: 8 width: 8 channels: 1 } layer { flatten {} } layer { dense { units: 4 } } }
train { synthetic { examples: 256 seed: 3 classes: 4 } } batch_size: 32 epochs: 1"
expect_ok "a job without a test set runs one epoch" B submit "$T/notest.pb" --watch
[[ "$LAST_OUT" == *"(no test set)"* ]] && ! grep -qiw nan <<<"$LAST_OUT" &&
  pass "watch says it has no test set, and prints no nan" || fail "watch without a test set: $LAST_OUT"
nid=$(echo "$LAST_OUT" | sed -n 's/^job \([0-9]*\) submitted.*/\1/p')
expect_ok "its status" B status "$nid"
! grep -qiw nan <<<"$LAST_OUT" && [[ "$LAST_OUT" == *"TEST-ACC"* ]] && pass "its status prints no nan" || fail "status without a test set: $LAST_OUT"
# A job that max_steps stops inside an epoch reports that epoch so far.
job midway "name: \"midway\" vdev: \"b0\"
model { input { height: 8 width: 8 channels: 1 } layer { flatten {} } layer { dense { units: 4 } } }
train { synthetic { examples: 4096 seed: 3 classes: 4 } } test { synthetic { examples: 512 seed: 3 classes: 4 } }
batch_size: 32 epochs: 3 max_steps: 50"
expect_ok "a job stopped by max_steps at step 50 of epoch 1's 128" B submit "$T/midway.pb" --watch
[[ "$LAST_OUT" == *"SUCCEEDED at step 50/50 inside epoch 1: test accuracy "* ]] &&
  pass "watch's last line gives its test accuracy inside epoch 1" || fail "watch midway: $LAST_OUT"
mid=$(echo "$LAST_OUT" | sed -n 's/^job \([0-9]*\) submitted.*/\1/p')
B --json status "$mid" >"$T/midway.json"
$PY - "$T/midway.json" <<'PY' && pass "its record has epoch 1, partial, with a train loss and a test accuracy" ||
import json, math, sys
e = json.load(open(sys.argv[1]))["job"]["epoch"]
assert len(e) == 1 and e[0]["epoch"] == 1 and e[0]["partial"], e
assert not math.isnan(float(e[0]["train_loss"])) and 0 <= float(e[0]["test_accuracy"]) <= 1, e
PY
  fail "midway's epochs: $(head -c 400 "$T/midway.json")"
# FLOAT32 has no loss scale and skips no step: status and logs say none.
B status "$nid" | grep -E '^ *1 ' | grep -qE -- ' -  +-$' && pass "an fp32 epoch's LOSS-SCALE and SKIPPED are -" ||
  fail "fp32 status row: $(B status "$nid")"
! B logs "$nid" | grep -q "scale 1" && pass "an fp32 job's logs show no loss scale" || fail "fp32 logs: $(B logs "$nid")"
# MIXED_FLOAT16 whose every step overflows never trains: it fails and says
# why, instead of succeeding at chance accuracy.
fp16() { job "$1" "name: \"$1\" vdev: \"b0\"
model { input { height: 8 width: 8 channels: 1 } layer { flatten {} } layer { dense { units: 16 activation: RELU } } layer { dense { units: 4 } } }
train { synthetic { examples: 256 seed: 3 classes: 4 } } test { synthetic { examples: 64 seed: 3 classes: 4 } }
batch_size: 32 epochs: $2 seed: 1 precision: MIXED_FLOAT16 loss_scale { initial: $3 }"; }
fp16 overflow 2 3e38
expect_fail "an fp16 job whose every step overflowed ends FAILED" 1 \
  "all 16 optimizer steps of the run were skipped" B submit "$T/overflow.pb" --watch
[[ "$LAST_OUT" == *"MIXED_BFLOAT16 or FLOAT32, or with a lower learning rate"* ]] &&
  pass "its reason suggests bf16, fp32 or a lower learning rate" || fail "overflow reason: $LAST_OUT"
# From 1e10 the first epoch's 8 steps are all skipped, then the scale fits:
# status counts each epoch's own skipped steps and warns of epoch 1.
fp16 settles 4 1e10
expect_ok "an fp16 job that overflows at first succeeds" B submit "$T/settles.pb" --watch
sid=$(echo "$LAST_OUT" | sed -n 's/^job \([0-9]*\) submitted.*/\1/p')
[[ "$LAST_OUT" == *"warning: epoch 1: 8 of its 8 optimizer steps were skipped"* ]] &&
  pass "watch warns that epoch 1 skipped all its steps" || fail "settles watch: $LAST_OUT"
expect_ok "its status" B status "$sid"
[[ "$LAST_OUT" == *"warning: epoch 1: 8 of its 8 optimizer steps were skipped"* ]] &&
  pass "status warns of epoch 1" || fail "settles status: $LAST_OUT"
B --json status "$sid" >"$T/settles.json"
$PY - "$T/settles.json" <<'PY' && pass "SKIPPED is per epoch: 8 in epoch 1, fewer in epoch 4" ||
import json, sys
e = json.load(open(sys.argv[1]))["job"]["epoch"]
s = [int(x.get("skipped_steps", 0)) for x in e]
assert len(s) == 4 and s[0] == 8 and s[3] < s[0], s
PY
  fail "settles epochs: $(head -c 600 "$T/settles.json")"
expect_fail "watch of a job that does not exist" 1 NOT_FOUND B watch 999999
[[ "$LAST_OUT" != *"lost the daemon"* ]] && pass "it says the job is not found, not that the daemon was lost" ||
  fail "watch 999999: $LAST_OUT"
expect_ok "vdev b1 deleted" ctl vdev delete b1
expect_ok "vdev b2 deleted" ctl vdev delete b2
mkdir -m 755 "$T/up"
$PY "$HERE/idxfile.py" "$T/up/imgs" 803 512 16 16 && $PY "$HERE/idxfile.py" "$T/up/labs" 801 512 &&
  chmod 644 "$T/up/imgs" "$T/up/labs"
job upload32 "name: \"upload32\" vdev: \"bsmall\"
model { input { height: 16 width: 16 channels: 1 }
  layer { conv2d { filters: 16 kernel_size: 3 padding: SAME activation: RELU } }
  layer { conv2d { filters: 16 kernel_size: 3 padding: SAME activation: RELU } }
  layer { flatten {} } layer { dense { units: 4 } } }
train { idx { images: \"$T/up/imgs\" labels: \"$T/up/labs\" } }
batch_size: 32 accumulation_steps: 2 max_steps: 3 seed: 1"
expect_ok "vdev bsmall: half the job's planned peak" \
  ctl vdev create bsmall --memory $((peak / 2)) --compute 5 --policy preallocate --tenant b
nsets() { B --json dataset list | $PY -c "import json,sys; print(len(json.load(sys.stdin).get('dataset', [])))"; }
before=$(nsets)
expect_fail "a job over its vdev is refused before its files go up" 1 "does not fit vdev bsmall" \
  B submit "$T/upload32.pb"
[[ "$LAST_OUT" == *"nothing was uploaded"* && "$LAST_OUT" != *"uploading"* ]] &&
  [ -n "$before" ] && [ "$(nsets)" = "$before" ] &&
  pass "nothing was uploaded: the store holds $before datasets as before" || fail "precheck: $LAST_OUT"
expect_ok "vdev bsmall deleted" ctl vdev delete bsmall

# --- quotas: max_queued, max_running -----------------------------------------
expect_ok "quota: a may run 1 job" ctl quota set a --max-running 1 --max-queued 2
# a million steps each (the most 4096 examples allow is 1.28 million): long1
# must outlast the checks below on any machine; 100,000 was a second of it.
synth long1 a0 1000000; synth long2 a0 1000000; synth long3 a0 1000000; synth long4 a0 1000000
expect_ok "submit long1" A submit "$T/long1.pb"; l1=$(A --json list | json_field "['job'][-1]['id']")
wait_state "$l1" RUNNING && pass "long1 running" || fail "long1 not running"
expect_ok "submit long2 (queued behind max_running)" A submit "$T/long2.pb"; l2=$(A --json list | json_field "['job'][-1]['id']")
expect_ok "submit long3" A submit "$T/long3.pb"; l3=$(A --json list | json_field "['job'][-1]['id']")
sleep 0.5
A --json status "$l2" | json_field "['job']['state']" | grep -qx QUEUED && pass "max_running keeps long2 queued" || fail "long2 not queued"
expect_fail "max_queued refuses a third queued job" 1 max_queued A submit "$T/long4.pb"
# --- cancel: queued, then running ---------------------------------------------
expect_ok "cancel a queued job" A cancel "$l3"
wait_state "$l3" CANCELLED 5 && pass "queued job cancelled" || fail "queued cancel"
expect_ok "cancel a running job" A cancel "$l1"
wait_state "$l1" CANCELLED 10 && pass "running job cancelled within a step" || fail "running cancel"
wait_state "$l2" RUNNING 10 && pass "the next job starts when the first is cancelled" || fail "long2 did not start"
expect_ok "cancel long2" A cancel "$l2"; wait_state "$l2" CANCELLED 10
expect_ok "quota back" ctl quota set a --max-running 4 --max-queued 8

# --- metrics -------------------------------------------------------------------
expect_ok "metrics" ctl metrics
echo "$LAST_OUT" | $PY "$HERE/prom_check.py" && pass "metrics parse as Prometheus text" || fail "metrics malformed"
expect_fail "metrics are for admins" 1 PERMISSION_DENIED A metrics

# --- kill -9 in the middle of training: resume from the checkpoint ------------
synth crash a0 400 'checkpoint_every_steps: 25'
expect_ok "submit a 400-step job" A submit "$T/crash.pb"; cid=$(A --json list | json_field "['job'][-1]['id']")
for _ in $(seq 200); do st=$(ctl --json status "$cid" | json_field "['job'].get('step',0)"); [ "$st" -ge 60 ] && break; sleep 0.1; done
kill9_daemon
sleep 0.5
pgrep -f "gpushare-executor.*$STATE" >/dev/null && fail "executor outlived its control plane" || pass "executor died with the control plane"
expect_ok "integrity_check after kill -9" sqlite3 "$STATE/gpushared.db" "PRAGMA integrity_check"
[ "$LAST_OUT" = ok ] && pass "store intact" || fail "integrity: $LAST_OUT"
start_daemon
wait_state "$cid" SUCCEEDED 120 && pass "the job resumed and succeeded" || fail "job $cid did not finish"
ctl logs "$cid" | grep -q "QUEUED" && pass "one job, its log kept" || fail "log lost"
n=$(ctl --json list --all | $PY -c "import json,sys; print([j['id'] for j in json.load(sys.stdin)['job']].count($cid))")
[ "$n" = 1 ] && pass "the job exists exactly once" || fail "job $cid listed $n times"
steps=$(ctl --json status "$cid" | json_field "['job']['step']")
[ "$steps" = 400 ] && pass "it ran exactly its 400 steps" || fail "it ran $steps steps"

# --- an upload cut off half-way leaves nothing -----------------------------------
setpriv --reuid=4002 --regid=65534 --clear-groups $PY "$HERE/upload_cut.py" "$SOCK" halfway
sleep 0.3
B --json dataset list | grep -q halfway && fail "a half upload is visible" || pass "a half upload is not visible"
ls "$STATE/uploads" | grep -q . && fail "the half upload left a file" || pass "and left no file"

stop_daemon
finish
