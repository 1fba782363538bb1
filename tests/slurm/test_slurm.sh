#!/usr/bin/env bash
# gpushare as the fence of Slurm job steps, against a real one-node Slurm on
# loopback: slurmctld, slurmd and munged run in the foreground under this
# test, with their configuration, keys, state and logs in its temporary
# directory (SLURM_CONF; the machine's /etc/slurm and munge are not used).
# The SPANK plugin gives each step a vdev, gpuctl submit inside the step
# uses it, shards queue steps, and a step's end, scancel or a kill -9 of its
# slurmstepd leave no vdev behind.
# usage: test_slurm.sh GPUSHARED GPUCTL GPUSHARE_SPANK_SO
set -u
SPANK_SO=${3:?usage: test_slurm.sh GPUSHARED GPUCTL GPUSHARE_SPANK_SO}
. "$(dirname "$0")/../integration/lib.sh"

[ "$(id -u)" = 0 ] || { echo "skip: needs root (useradd, slurmd, munged)"; exit 77; }
command -v protoc >/dev/null || { echo "skip: protoc not installed"; exit 77; }
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v srun >/dev/null ||
   ! command -v munged >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge \
    >"$T/apt.log" 2>&1 || { echo "skip: cannot install slurmctld slurmd slurm-client munge:"; tail -n 5 "$T/apt.log"; exit 77; }
fi

S=$T/slurm; mkdir -p "$S/state" "$S/spool" "$S/log" "$S/run"
USERS=(gst-slurm-a gst-slurm-b)
SPIDS=()
slurm_cleanup() {
  local p
  # jobs first, while slurmctld can still end them
  command -v scancel >/dev/null && [ -f "$S/slurm.conf" ] && SLURM_CONF=$S/slurm.conf timeout 10 scancel --full \
    -u "${USERS[0]}" -u "${USERS[1]}" >/dev/null 2>&1
  for p in "${SPIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${SPIDS[@]}"; do for _ in $(seq 1 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  # the steps' slurmstepd of this test's slurmd
  for p in $(pgrep -x slurmstepd); do
    grep -qs "$S" "/proc/$p/environ" && kill -KILL "$p" 2>/dev/null; done
  for u in "${USERS[@]}"; do pkill -KILL -u "$u" 2>/dev/null; userdel "$u" 2>/dev/null; done
  cleanup
}
trap slurm_cleanup EXIT

for u in "${USERS[@]}"; do id "$u" >/dev/null 2>&1 && userdel "$u" 2>/dev/null
  useradd --system --no-create-home --shell /bin/bash "$u" || { fail "useradd $u"; exit 1; }; done
UA=$(id -u "${USERS[0]}"); UB=$(id -u "${USERS[1]}")

# free ports on loopback for slurmctld and slurmd
read -r PCTLD PD < <($PY -c 'import socket
s=[socket.socket() for _ in range(2)]
[x.bind(("127.0.0.1",0)) for x in s]; print(*[x.getsockname()[1] for x in s])')

dd if=/dev/urandom of="$S/munge.key" bs=1024 count=1 2>/dev/null; chmod 600 "$S/munge.key"
# the node's gres, from the daemon's device table: one shard = 256 MiB
# (plugstack.conf unit=256MiB)
start_daemon
ctl slurm-gres --unit 256MiB >"$S/gres.out" || { fail "gpuctl slurm-gres"; exit 1; }
grep '^Name=' "$S/gres.out" >"$S/gres.conf"
GRES=$(sed -n 's/^Gres=//p' "$S/gres.out"); SHARDS=${GRES##*shard:}
if grep -q "^Name=shard Count=$SHARDS File=/dev/null" "$S/gres.conf" && [ "$SHARDS" -ge 4 ]; then
  pass "gpuctl slurm-gres: $GRES"; else fail "gpuctl slurm-gres: $(cat "$S/gres.out")"; exit 1; fi
cat >"$S/slurm.conf" <<CONF
ClusterName=gstest
SlurmctldHost=localhost
SlurmctldPort=$PCTLD
SlurmdPort=$PD
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$S/run/munge.sock
CryptoType=crypto/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu,shard
StateSaveLocation=$S/state
SlurmdSpoolDir=$S/spool
SlurmctldPidFile=$S/run/slurmctld.pid
SlurmdPidFile=$S/run/slurmd.pid
SlurmctldLogFile=$S/log/slurmctld.log
SlurmdLogFile=$S/log/slurmd.log
SlurmdDebug=info
MailProg=/bin/true
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
PlugStackConfig=$S/plugstack.conf
Epilog=/bin/true
NodeName=localhost CPUs=2 Gres=$GRES State=UNKNOWN
PartitionName=p Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
echo "required $SPANK_SO socket=$SOCK unit=256MiB" >"$S/plugstack.conf"
export SLURM_CONF=$S/slurm.conf

munged --force -F --socket="$S/run/munge.sock" --key-file="$S/munge.key" --log-file="$S/log/munged.log" \
  --pid-file="$S/run/munged.pid" --seed-file="$S/run/munged.seed" >>"$S/log/munged.out" 2>&1 &
SPIDS+=($!)
expect_ok "tenant a" ctl tenant create a --uid "$UA"
expect_ok "tenant b" ctl tenant create b --uid "$UB"
# the reason the plugin gives a cancel is an admin's alone, and short
out=$($PY "$HERE/../integration/rawframe.py" "$SOCK" --as-uid "$UA" --text 'id: 1 cancel { id: 1 reason: "x" }')
grep -q 'code=PERMISSION_DENIED field=cancel.reason' <<<"$out" && pass "a member's cancel with a reason is refused" \
  || fail "member's cancel with a reason: $out"
long=$(printf 'r%.0s' $(seq 1 161))
out=$($PY "$HERE/../integration/rawframe.py" "$SOCK" --text "id: 1 cancel { id: 1 reason: \"$long\" }")
grep -q 'code=INVALID_ARGUMENT field=cancel.reason.*161 bytes' <<<"$out" && pass "a cancel's reason of 161 bytes is refused" \
  || fail "long cancel reason: $out"
slurmctld -D -i >>"$S/log/slurmctld.out" 2>&1 & SPIDS+=($!)
slurmd -D >>"$S/log/slurmd.out" 2>&1 & SPIDS+=($!)

# wait_for DESC CMD...: until CMD succeeds (bounded, with the reason on failure)
wait_for() { local d=$1; shift
  for _ in $(seq 1 600); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
  fail "$d"; return 1; }
node_idle() { sinfo -h -n localhost -o %t | grep -qx idle; }
wait_for "slurmd registered with slurmctld" node_idle || { tail -n 20 "$S/log/"*.out; exit 1; }

as() { local u=$1; shift; setpriv --reuid="$u" --regid=65534 --clear-groups env SLURM_CONF="$SLURM_CONF" "$@"; }
job() { printf '%s\n' "$2" >"$T/$1.txtpb"
  protoc --encode=gpushare.v1.JobSpec --proto_path="$PROTO" gpushare.proto <"$T/$1.txtpb" >"$T/$1.pb"
  chmod 644 "$T/$1.pb"; }
# synth NAME STEPS: a small synthetic job that names no vdev
synth() { job "$1" "name: \"$1\"
model { input { height: 8 width: 8 channels: 1 }
  layer { flatten {} } layer { dense { units: 64 activation: RELU } } layer { dense { units: 4 } } }
train { synthetic { examples: 4096 seed: 7 classes: 4 } }
test { synthetic { examples: 512 seed: 7 classes: 4 } }
batch_size: 32 epochs: 10000 max_steps: $2 seed: 1
optimizer { adam { learning_rate: 0.003 } }"; }
synth quick 40
synth long 100000000
# too big for 256 MiB: 4096x8192 fp32 weights with their Adam moments and gradients
job big "name: \"big\"
model { input { height: 64 width: 64 channels: 1 }
  layer { flatten {} } layer { dense { units: 8192 activation: RELU } } layer { dense { units: 4 } } }
train { synthetic { examples: 256 seed: 7 classes: 4 } }
batch_size: 32 epochs: 1 seed: 1 optimizer { adam { learning_rate: 0.001 } }"
cd "$T" || exit 1

# --- a step's vdev: there while it runs, gone after -------------------------
out=$(as "$UA" srun --gres=shard:1 --gpushare-mem=256MiB bash -c \
  "echo VDEV=\$GPUSHARE_VDEV; $GPUCTL vdev list; $GPUCTL submit $T/quick.pb --watch" 2>&1)
rc=$?
if [ $rc -eq 0 ] && grep -q '^VDEV=slurm-[0-9]*-0$' <<<"$out"; then pass "srun --gpushare-mem=256MiB trains a job in the step's vdev"
else fail "srun with gpushare (rc $rc): $out"; fi
v=$(sed -n 's/^VDEV=//p' <<<"$out")
if [ -n "$v" ] && grep -E "^$v +" <<<"$out" | grep -q "256"; then pass "inside the step, gpuctl vdev list shows $v at 256 MiB"
else fail "vdev list inside the step did not show $v with 256 MiB: $out"; fi
if [ -n "$v" ] && ! ctl vdev list | grep -q "^$v "; then pass "after the step, $v is gone"
else fail "after the step: $(ctl vdev list)"; fi
if ctl --json list --all | $PY -c 'import json,sys
js=[j for j in json.load(sys.stdin).get("job",[]) if j.get("name")=="quick"]
sys.exit(0 if js and js[0]["state"]=="SUCCEEDED" and js[0]["vdev"].startswith("slurm-") else 1)'; then
  pass "the job ran in the step's vdev and succeeded"
else fail "the quick job: $(ctl list --all)"; fi

# --- a bad --gpushare-mem is refused at submission --------------------------
out=$(as "$UA" srun --gpushare-mem=12parsecs true 2>&1); rc=$?
if [ $rc -ne 0 ] && grep -q -- '--gpushare-mem' <<<"$out" && grep -q '12parsecs' <<<"$out"; then
  pass "srun refuses --gpushare-mem=12parsecs naming the option"
else fail "bad --gpushare-mem (rc $rc): $out"; fi
out=$(as "$UA" srun --gres=shard:1 --gpushare-mem=1GiB echo STARTED 2>&1); rc=$?
# the step's task says why on the user's stderr, and runs nothing
if [ $rc -ne 0 ] && ! grep -q STARTED <<<"$out" && grep -q 'needs 4 shards of 256.00 MiB.*--gres=shard:4' <<<"$out" &&
   grep -q 'needs 4 shards of 256.00 MiB.*--gres=shard:4' "$S/log/slurmd.log"; then pass "a step whose shards do not cover --gpushare-mem fails, telling the user how many it needs"
else fail "shards below --gpushare-mem (rc $rc): $out"; fi
# the daemon out of reach: the step fails saying so; its job's epilog
# cannot reach it either, and the node stays up (Slurm drains a node whose
# epilog fails). The earlier jobs' epilogs run first, with the real socket.
wait_for "the node is idle before the daemon goes out of reach" node_idle
echo "required $SPANK_SO socket=$T/nowhere.sock unit=256MiB" >"$S/plugstack.conf"
out=$(as "$UA" srun --gres=shard:1 --gpushare-mem=256MiB echo STARTED 2>&1); rc=$?
echo "$out" | sed "s/^/  | /"
if [ $rc -ne 0 ] && ! grep -q STARTED <<<"$out" && grep -q "cannot reach gpushared on this node.*nowhere.sock" <<<"$out"; then
  pass "with gpushared out of reach, the step fails telling the user so"
else fail "daemon out of reach (rc $rc): $out"; fi
wait_for "the node is still up after a job whose step and epilog could not reach gpushared" node_idle \
  && pass "the node is not drained: $(sinfo -h -n localhost -o %t)"
grep -q "the vdevs of Slurm job [0-9]* (slurm-[0-9]*-\*) are left in gpushared" "$S/log/slurmd.log" &&
  pass "the epilog logs what it leaves by name" || fail "no epilog line in slurmd.log: $(tail -n 5 "$S/log/slurmd.log")"
echo "required $SPANK_SO socket=$SOCK unit=256MiB" >"$S/plugstack.conf"

# --- two tenants' steps at once; one job over its vdev is refused -----------
as "$UA" srun --gres=shard:1 --gpushare-mem=256MiB "$GPUCTL" submit "$T/quick.pb" --watch >"$T/a.out" 2>&1 & PA=$!
out=$(as "$UB" srun --gres=shard:1 --gpushare-mem=256MiB bash -c "echo VDEV=\$GPUSHARE_VDEV; $GPUCTL submit $T/big.pb" 2>&1); rc=$?
if [ $rc -ne 0 ] && grep -q '^VDEV=slurm-' <<<"$out" && grep -qi "does not fit\|out of memory\|peak" <<<"$out"; then pass "tenant b's job over its step's 256 MiB is refused with its plan"
else fail "big job in b's step (rc $rc): $out"; fi
if wait $PA && grep -q SUCCEEDED "$T/a.out"; then pass "tenant a's job in its own step succeeded meanwhile"; else fail "a's concurrent step: $(cat "$T/a.out")"; fi
vb=$(sed -n 's/^VDEV=//p' <<<"$out")
va=$(ctl --json list --all | $PY -c 'import json,sys
print([j["vdev"] for j in json.load(sys.stdin).get("job",[]) if j.get("name")=="quick"][-1])')
[ -n "$vb" ] && [ -n "$va" ] && [ "$vb" != "$va" ] && pass "each step had its own vdev ($vb)" || fail "the steps shared a vdev or named none: a=$va b=$vb"

# --- shards queue steps; scancel removes the vdev and cancels the job -------
j1=$(as "$UA" sbatch --parsable --gres=shard:$SHARDS --gpushare-mem=2GiB -o /dev/null \
  --wrap "$GPUCTL submit $T/long.pb --watch")
j2=$(as "$UB" sbatch --parsable --gres=shard:$SHARDS -o /dev/null --wrap "$GPUCTL submit $T/quick.pb --watch")
state() { squeue -h -j "$1" -o %T 2>/dev/null; }
gs_running() { ctl --json list --all | $PY -c 'import json,sys
sys.exit(0 if any(j.get("vdev")==sys.argv[1] and j["state"]=="RUNNING" for j in json.load(sys.stdin).get("job",[])) else 1)' "$1"; }
wait_for "slurm job $j1 running in gpushare" gs_running "slurm-$j1-batch" || { grep -v pmix "$S/log/slurmd.log" | tail -n 20; }
[ "$(state "$j2")" = PENDING ] && pass "a job asking for all shards while they are taken is PENDING" \
  || fail "job $j2 is $(state "$j2"), not PENDING"
expect_ok "scancel $j1" scancel "$j1"
vdev_gone() { ! ctl vdev list | grep -q "^$1 "; }
gs_running "slurm-$j1-batch" && wait_for "scancel removed slurm-$j1-batch" vdev_gone "slurm-$j1-batch" && pass "scancel removed the step's vdev"
if ctl --json list --all | $PY -c 'import json,sys
js=[j for j in json.load(sys.stdin).get("job",[]) if j.get("vdev")==sys.argv[1]]
sys.exit(0 if js and all(j["state"]=="CANCELLED" and "Slurm" in j.get("reason","") for j in js) else 1)' "slurm-$j1-batch"; then
  pass "scancel cancelled the step's gpushare job, the reason naming the Slurm step"
else fail "after scancel: $(ctl list --all)"; fi
done_j() { [ -z "$(state "$1")" ]; }
wait_for "job $j2 started and ended after $j1" done_j "$j2" && pass "the queued job ran once the shards were free"

# --- kill -9 of a step's slurmstepd: the epilog cleans up --------------------
j3=$(as "$UA" sbatch --parsable --gres=shard:1 --gpushare-mem=256MiB -o /dev/null --wrap "$GPUCTL submit $T/long.pb --watch")
wait_for "slurm job $j3 in gpushare" gs_running "slurm-$j3-batch"
sp=$(pgrep -f "^slurmstepd: \[$j3.batch\]")
if [ -n "$sp" ]; then kill -KILL $sp; pass "killed slurmstepd $sp of job $j3"; else fail "no slurmstepd for $j3"; fi
# the step's exit hook died with it; ending the job runs the epilog
gs_running "slurm-$j3-batch" && pass "the killed step's vdev and job outlive it" || fail "slurm-$j3-batch gone before the epilog"
expect_ok "scancel $j3 (its slurmstepd is gone)" scancel "$j3"
[ -n "$sp" ] && wait_for "the epilog removed slurm-$j3-batch" vdev_gone "slurm-$j3-batch" && pass "after a kill -9 of slurmstepd, the epilog removed the vdev"
if ctl --json list --all | $PY -c 'import json,sys
sys.exit(1 if [j for j in json.load(sys.stdin).get("job",[]) if j["state"] in ("QUEUED","RUNNING")] else 0)'; then
  pass "no gpushare job is left queued or running"; else fail "left: $(ctl list --all)"; fi
[ "$FAILS" -ne 0 ] && { grep -v pmix "$S/log/slurmd.log" | tail -n 40; tail -n 20 "$S/log/slurmctld.log"; }
finish
