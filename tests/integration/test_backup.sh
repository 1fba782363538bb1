#!/usr/bin/env bash
# A backup of a running gpushared, taken with the commands of
# docs/operations.md ("Backup", "Restore") as they stand there, while one
# job trains and rewrites its checkpoint many times a second and another
# waits in the queue. Restored into an empty directory, a second daemon
# (its own socket and state directory) finds every tenant, vdev, dataset
# and job the first one had, hands out the finished job's weights byte for
# byte, and resumes the running job from the checkpoint the copy holds.
set -u
. "$(dirname "$0")/lib.sh"
need_protoc
for tool in sqlite3 rsync; do
  command -v "$tool" >/dev/null || { echo "skip: $tool not installed (scripts/setup.sh installs it)"; exit 77; }
done
DOC=${GS_SOURCE_DIR:-$HERE/../..}/docs/operations.md
# recipe TITLE: the ```sh block of operations.md whose first line is "# TITLE".
recipe() { $PY - "$DOC" "$1" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
for block in re.findall(r"^```sh\n(.*?)^```", text, re.S | re.M):
    if block.startswith("# " + sys.argv[2] + "\n"):
        sys.stdout.write(block)
        sys.exit(0)
sys.exit("no sh block starting with '# %s' in %s" % (sys.argv[2], sys.argv[1]))
PY
}
job() { printf '%s\n' "$2" | protoc --encode=gpushare.v1.JobSpec --proto_path="$PROTO" gpushare.proto >"$T/$1.pb"
  chmod 644 "$T/$1.pb"; }
# at SOCKET UID ARGS...: gpuctl against one of the two daemons, as UID (0: root).
at() { local s=$1 uid=$2; shift 2
  if [ "$uid" = 0 ]; then "$GPUCTL" --socket "$s" "$@"
  else setpriv --reuid="$uid" --regid=65534 --clear-groups "$GPUCTL" --socket "$s" "$@"; fi; }
# lists SOCKET: every admin and tenant listing, the vdevs' live memory
# figures left out (the executor's, on their own schedule).
lists() {
  at "$1" 0 --json tenant list
  at "$1" 0 --json vdev list | $PY -c "
import json, sys
d = json.load(sys.stdin)
for v in d.get('vdev', []):
    for k in ('memory_in_use', 'memory_reserved', 'memory_peak', 'memory_free',
              'memory_largest_free', 'memory_fragmentation'): v.pop(k, None)
print(json.dumps(d, sort_keys=True))"
  at "$1" 0 --json quota show a; at "$1" 0 --json quota show b
  at "$1" 4001 --json dataset list; at "$1" 4002 --json dataset list; }

OUTD=$T/out; mkdir -m 777 "$OUTD"   # where the tenants write fetched weights
FILES=$T/files; mkdir -m 755 "$FILES"
# Three IDX pairs of 8x8 images, 4 classes: a's train and test sets, b's.
mkdir -m 755 "$FILES/a" "$FILES/at" "$FILES/b"
idx() { $PY "$HERE/idxfile.py" "$FILES/$1/images" 803 "$2" 8 8 --seed "$3" &&
  $PY "$HERE/idxfile.py" "$FILES/$1/labels" 801 "$2" --seed "$3"; }
idx a 512 1; idx at 128 2; idx b 256 3
chmod -R a+r "$FILES"

start_daemon
expect_ok "tenant a" ctl tenant create a --uid 4001
expect_ok "tenant b, one job running at a time" ctl tenant create b --uid 4002 --max-running 1
expect_ok "quota of a" ctl quota set a --memory 1GiB --compute 60
expect_ok "vdev a0 (growth)" ctl vdev create a0 --memory 256MiB --compute 50 --policy growth --tenant a
expect_ok "vdev b0 (preallocate)" ctl vdev create b0 --memory 256MiB --compute 40 --policy preallocate --tenant b
for p in a at; do
  expect_ok "a uploads dataset pair $p" at "$SOCK" 4001 dataset add "$p" "$FILES/$p/images" "$FILES/$p/labels"
done
expect_ok "b uploads dataset pair b" at "$SOCK" 4002 dataset add b "$FILES/b/images" "$FILES/b/labels"

NET='model { input { height: 8 width: 8 channels: 1 } layer { flatten {} } layer { dense { units: 64 activation: RELU } } layer { dense { units: 4 } } }'
job "done" "name: \"done\" vdev: \"a0\" $NET train { name: \"a\" } test { name: \"at\" }
batch_size: 32 epochs: 3 seed: 3 checkpoint_every_steps: 10 optimizer { adam { learning_rate: 0.003 } }"
expect_ok "a's job runs to its end" at "$SOCK" 4001 submit "$T/done.pb" --watch
done_id=$(ctl --json list --all | json_field "['job'][0]['id']")
# b's long job checkpoints every 20 steps (many times a second), so the
# copy runs while its checkpoint is being replaced.
job long "name: \"long\" vdev: \"b0\" ${LONG_JOB/epochs: 10000/epochs: 10000 checkpoint_every_steps: 20}"
out=$(at "$SOCK" 4002 submit "$T/long.pb" 2>&1)
[[ "$out" =~ ^job\ ([0-9]+)\ submitted ]] && long_id=${BASH_REMATCH[1]} || { fail "submit long: $out"; finish; exit 1; }
wait_state "$long_id" RUNNING && pass "b's long job runs" || fail "b's long job is not running"
job queued "name: \"queued\" vdev: \"b0\" $NET train { name: \"b\" } batch_size: 16 epochs: 2"
out=$(at "$SOCK" 4002 submit "$T/queued.pb" 2>&1)
[[ "$out" =~ ^job\ ([0-9]+)\ submitted ]] && queued_id=${BASH_REMATCH[1]} || { fail "submit queued: $out"; finish; exit 1; }
wait_state "$queued_id" QUEUED && pass "b's second job waits (max_running 1)" || fail "b's second job is not queued"
ck=$STATE/jobs/$long_id/checkpoint.ckpt
for _ in $(seq 600); do [ -f "$ck" ] && break; sleep 0.1; done
[ -f "$ck" ] && pass "the long job has written a checkpoint" || fail "no checkpoint at $ck"
ctl metrics >/dev/null   # the usage accrued so far goes to the store

# --- backup, with the documented commands, while the daemon runs ----------
BACKUP=$T/backup
OWNER=$(id -u):$(id -g)
export STATE BACKUP OWNER
recipe "backup, while gpushared runs" >"$T/backup.sh" || { fail "no backup recipe"; finish; exit 1; }
state_before=$(ctl --json status "$long_id" | json_field "['job']['state']")
out=$(bash -eu -o pipefail "$T/backup.sh" 2>&1); rc=$?
[ "$rc" -eq 0 ] && [ "$out" = ok ] && pass "the backup recipe ran while the daemon served: it printed only ok" ||
  fail "backup recipe: exit $rc: $out"
[ "$state_before" = RUNNING ] && [ "$(ctl --json status "$long_id" | json_field "['job']['state']")" = RUNNING ] &&
  pass "the long job ran through the backup" || fail "the long job was not running through the backup"
ls "$BACKUP" | sort | tr '\n' ' ' | grep -qx "datasets gpushared.db jobs " &&
  pass "the backup holds gpushared.db, datasets/, jobs/ and nothing else" || fail "backup holds: $(ls -A "$BACKUP")"
[ -z "$(find "$BACKUP" -name '*.tmp')" ] && pass "no .tmp file in the backup" || fail "tmp files: $(find "$BACKUP" -name '*.tmp')"
lists "$SOCK" >"$T/lists.before"
ctl --json list --all >"$T/jobs.before"
for id in "$done_id" "$queued_id"; do ctl --json status "$id" >"$T/status.$id.before"; done
expect_ok "a fetches its weights from the first daemon" at "$SOCK" 4001 fetch "$done_id" -o "$OUTD/done.1.safetensors"
# The step of the checkpoint the copy holds (ckpt.h: a u64 after the 24-byte header).
ck_step=$($PY -c "import struct,sys; print(struct.unpack_from('<Q', open(sys.argv[1],'rb').read(), 24)[0])" \
  "$BACKUP/jobs/$long_id/checkpoint.ckpt")
[ "$ck_step" -gt 0 ] && pass "the copied checkpoint is at step $ck_step" || fail "copied checkpoint step: $ck_step"

# --- restore into an empty directory; a second daemon serves it -----------
RSTATE=$T/restored RSOCK=$T/restored.sock
recipe "restore, into an empty directory" >"$T/restore.sh" || { fail "no restore recipe"; finish; exit 1; }
out=$(STATE=$RSTATE bash -eu -o pipefail "$T/restore.sh" 2>&1); rc=$?
[ "$rc" -eq 0 ] && pass "the restore recipe ran" || fail "restore recipe: exit $rc: $out"
[ "$(stat -c %a "$RSTATE")" = 700 ] && [ "$(stat -c %a "$RSTATE/gpushared.db")" = 600 ] &&
  pass "restored directory 0700, store 0600" || fail "modes: $(stat -c '%n %a' "$RSTATE" "$RSTATE/gpushared.db")"
mkdir "$T/nonempty"; touch "$T/nonempty/gpushared.db-wal"
out=$(STATE=$T/nonempty bash -eu -o pipefail "$T/restore.sh" 2>&1) &&
  fail "the restore recipe went on into a directory that was not empty" ||
  { [[ "$out" == *"is not empty"* ]] && [ ! -e "$T/nonempty/gpushared.db" ] &&
    pass "the restore recipe refuses a directory that is not empty" || fail "restore into nonempty: $out"; }

"$GPUSHARED" --foreground --config "$CONF" --socket "$RSOCK" --state-dir "$RSTATE" >>"$T/restored.log" 2>&1 &
RPID=$!
trap 'kill -KILL "$RPID" 2>/dev/null; [ "$FAILS" -ne 0 ] && tail -n 40 "$T/restored.log"; cleanup' EXIT
for _ in $(seq 100); do at "$RSOCK" 0 version >/dev/null 2>&1 && break; kill -0 "$RPID" 2>/dev/null || break; sleep 0.1; done
at "$RSOCK" 0 version >/dev/null 2>&1 && pass "a second gpushared serves the restored directory beside the first" ||
  { fail "the restored daemon did not come up"; finish; exit 1; }
lists "$RSOCK" >"$T/lists.after"
cmp -s "$T/lists.before" "$T/lists.after" &&
  pass "tenants, quotas, vdevs and both tenants' datasets are as the first daemon lists them" ||
  fail "listings differ: $(diff "$T/lists.before" "$T/lists.after" | head -20)"
at "$RSOCK" 0 --json list --all >"$T/jobs.after"
$PY - "$T/jobs.before" "$T/jobs.after" <<'PY' && pass "the same jobs: ids, names, tenants, vdevs" || fail "job lists differ"
import json, sys
key = lambda j: (j["id"], j["name"], j["tenant"], j["vdev"])
b, a = (sorted(map(key, json.load(open(p))["job"])) for p in sys.argv[1:])
print("before:", b, "after:", a) if a != b else None
sys.exit(a != b or len(a) != 3)
PY
at "$RSOCK" 0 --json status "$done_id" >"$T/status.$done_id.after"
cmp -s "$T/status.$done_id.before" "$T/status.$done_id.after" &&
  pass "the finished job's record (spec, epochs, usage) is whole" ||
  fail "job $done_id: $(diff "$T/status.$done_id.before" "$T/status.$done_id.after")"
expect_ok "a fetches its weights from the restored daemon" at "$RSOCK" 4001 fetch "$done_id" -o "$OUTD/done.2.safetensors"
cmp -s "$OUTD/done.1.safetensors" "$OUTD/done.2.safetensors" && [ -s "$OUTD/done.2.safetensors" ] &&
  pass "the weights are byte for byte those of the first daemon" || fail "the fetched weights differ"
SOCK=$RSOCK   # wait_state asks the restored daemon from here on
wait_state "$long_id" RUNNING && pass "the long job runs in the restored daemon" || fail "long job not running after the restore"
for _ in $(seq 600); do grep -q "job $long_id: resumed from step $ck_step " "$T/restored.log" && break; sleep 0.1; done
grep -q "job $long_id: resumed from step $ck_step " "$T/restored.log" &&
  pass "it resumed from the copied checkpoint's step $ck_step" ||
  fail "no 'resumed from step $ck_step' for job $long_id: $(grep "job $long_id" "$T/restored.log" | tail -3)"
s=0; for _ in $(seq 600); do
  s=$(at "$RSOCK" 0 --json status "$long_id" | json_field "['job']['step']"); [ "$s" -gt "$ck_step" ] && break; sleep 0.1; done
[ "$s" -gt "$ck_step" ] && pass "and trains on: step $s" || fail "long job stuck at step $s (checkpoint $ck_step)"
# To the restored daemon the snapshot is a daemon that stopped under the job.
[[ "$(at "$RSOCK" 4002 logs "$long_id")" == *"stopping without checkpointing this job"*"resuming from its last checkpoint"* ]] &&
  pass "its log says gpushared stopped under it and it resumes from its last checkpoint" || fail "logs: $(at "$RSOCK" 4002 logs "$long_id" | tail -3)"
wait_state "$queued_id" QUEUED && pass "the queued job still waits behind it" || fail "queued job not queued"
$PY - "$T/status.$queued_id.before" <(at "$RSOCK" 0 --json status "$queued_id") <<'PY' &&
import json, sys
b, a = (json.load(open(p))["job"] for p in sys.argv[1:])
sys.exit(any(b.get(k) != a.get(k) for k in ("spec", "tenant", "vdev", "priority", "submitted_unix")))
PY
  pass "the queued job's spec is whole" || fail "the queued job's record differs"

# Both daemons stop cleanly, each its own.
for s in "$SOCK" "$T/gpushared.sock"; do at "$s" 4002 cancel "$long_id" >/dev/null; at "$s" 4002 cancel "$queued_id" >/dev/null; done
kill -TERM "$RPID"; rc=0; wait "$RPID" || rc=$?
[ "$rc" -eq 0 ] && pass "SIGTERM: the restored gpushared exited 0" || fail "the restored gpushared exited $rc"
stop_daemon
finish
