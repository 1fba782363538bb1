#!/usr/bin/env bash
# bench_daemon.sh: what gpushared costs a job, how four vdevs of one device
# add up, and how the control plane holds up under many clients.
#
#   overhead  the same job through the daemon (one vdev, compute 100 on the
#             cpu device, `gpuctl submit --watch`) and through gpushare-run
#             with the executor's thread count, alternating run/daemon
#             ROUNDS times each in the same run; samples/s of both and the
#             daemon's overhead in percent (target: under 2%), and the CPU
#             seconds each side spent on the whole job
#   vdevs     four identical jobs on four vdevs (compute 25 each) of the
#             cpu device at once against one job alone on a vdev with
#             compute 100, alternating VDEV_ROUNDS times: aggregate
#             samples/s over windows of VDEV_SECONDS and their ratio
#             (target: at least 95%), and the executor's CPU per step
#   load      64 clients (libgpushare, one connection each: bench_load.c)
#             calling status/list/metrics as admins and as tenants for
#             LOAD_SECONDS while two jobs train: requests, errors, requests/s,
#             latency percentiles, and gpushared's RSS and open descriptors
#             before and after each of LOAD_ROUNDS rounds
#
# A benchmark, never a test: it prints figures and ratios and asserts none
# (the targets are printed beside them). Run as root (the daemon runs as
# root, the tenants' clients take their uids with setpriv), on an otherwise
# quiet machine for figures worth comparing: on a shared one the wall-clock
# rates move with the other load, and the CPU-time figures printed beside
# them are the ones to read. Every daemon, job and temporary directory it
# made is gone when it exits, however it exits. bench_load is taken from
# BUILD_DIR (bin/bench_load) when CMake built it, else compiled here
# against BUILD_DIR's libgsclient.a. Each part that completes replaces its
# own section of tests/bench/RESULTS.md (bench_daemon.overhead, .vdevs,
# .load; results.sh) with the summary it printed; GS_BENCH_RECORD=0
# prints only.
#
# usage: tests/bench/bench_daemon.sh [BUILD_DIR] [overhead|vdevs|load|all]
#   BUILD_DIR defaults to build/. Environment, with defaults:
#   ROUNDS=2 OV_EPOCHS=5 OV_EXAMPLES=60000    overhead: rounds, job size
#   VDEV_ROUNDS=2 VDEV_SECONDS=10 SETTLE_SECONDS=3   vdevs: rounds, window
#   LOAD_SECONDS=10 LOAD_CLIENTS=64 LOAD_ROUNDS=2
set -u
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
build=$(cd "${1:-$src/build}" 2>/dev/null && pwd) || { echo "bench_daemon: no build directory ${1:-$src/build}" >&2; exit 2; }
parts=${2:-all}
case $parts in overhead|vdevs|load) ;; all) parts="overhead vdevs load" ;;
  *) echo "usage: bench_daemon.sh [BUILD_DIR] [overhead|vdevs|load|all]" >&2; exit 2 ;; esac
ROUNDS=${ROUNDS:-2}
OV_EPOCHS=${OV_EPOCHS:-5}
OV_EXAMPLES=${OV_EXAMPLES:-60000}
VDEV_SECONDS=${VDEV_SECONDS:-10}
VDEV_ROUNDS=${VDEV_ROUNDS:-2}
SETTLE_SECONDS=${SETTLE_SECONDS:-3}
LOAD_SECONDS=${LOAD_SECONDS:-10}
LOAD_CLIENTS=${LOAD_CLIENTS:-64}
LOAD_ROUNDS=${LOAD_ROUNDS:-2}
PY=${PY:-/usr/bin/python3}
FIG="$PY $here/bench_daemon.py"
. "$here/results.sh"

GPUSHARED=$build/bin/gpushared
GPUCTL=$build/bin/gpuctl
RUN=$build/bin/gpushare-run
for b in "$GPUSHARED" "$GPUCTL" "$RUN"; do
  [ -x "$b" ] || { echo "bench_daemon: $b not built (cmake --build $build)" >&2; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "bench_daemon: run as root (tenants' clients take their uids with setpriv)" >&2; exit 1; }
command -v protoc >/dev/null || { echo "bench_daemon: protoc not installed (apt-get install protobuf-compiler)" >&2; exit 1; }

T=$(mktemp -d /tmp/gs-bench-XXXXXX)
chmod 755 "$T"   # the tenants' clients must reach the socket and read the jobs
DPID=
BGPIDS=()
cleanup() {
  for p in "${BGPIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done
  if [ -n "$DPID" ] && kill -0 "$DPID" 2>/dev/null; then kill -KILL "$DPID" 2>/dev/null; wait "$DPID" 2>/dev/null; fi
  rm -rf "$T"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

die() { echo "bench_daemon: $*" >&2; [ -n "${DLOG:-}" ] && [ -f "$DLOG" ] && tail -n 20 "$DLOG" >&2; exit 1; }
ctl() { "$GPUCTL" --socket "$SOCK" "$@"; }
ctl_as() { local uid=$1; shift; setpriv --reuid="$uid" --regid=65534 --clear-groups "$GPUCTL" --socket "$SOCK" "$@"; }
jget() { $PY -c "import json,sys; d=json.load(sys.stdin); print(eval('d'+sys.argv[1]))" "$1"; }
now() { date +%s.%N; }
calc() { $PY -c "print($*)"; }

# start_daemon NAME: a fresh gpushared in $T/NAME (socket, state, log, config
# as tests/integration/lib.sh writes it); waits for it and for its executor.
start_daemon() {
  local d=$T/$1
  mkdir -p "$d"; chmod 755 "$d"
  SOCK=$d/gpushared.sock DLOG=$d/daemon.log
  cat >"$d/gpushared.conf" <<CONF
# written by tests/bench/bench_daemon.sh
socket_group = nogroup
socket_mode = 0660
admin_group = users
cpu_memory = 4GiB
log_level = info
CONF
  "$GPUSHARED" --foreground --config "$d/gpushared.conf" --socket "$SOCK" --state-dir "$d/state" >>"$DLOG" 2>&1 &
  DPID=$!
  local i
  for i in $(seq 200); do
    ctl version >/dev/null 2>&1 && grep -q "ready: .* thread" "$DLOG" && return 0
    kill -0 "$DPID" 2>/dev/null || break
    sleep 0.1
  done
  die "gpushared did not come up in $d"
}
stop_daemon() {
  kill -TERM "$DPID" 2>/dev/null
  local i
  for i in $(seq 100); do kill -0 "$DPID" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$DPID" 2>/dev/null
  wait "$DPID" 2>/dev/null
  DPID=
}
executor_threads() { sed -n 's/.*ready: \([0-9]*\) thread.*/\1/p' "$DLOG" | tail -n 1; }

# job NAME EXAMPLES EPOCHS MAX_STEPS: $T/NAME.pb, the MLP of
# examples/fashion-mlp.txtpb (784-256-128-10, batch 128, Adam) on a
# synthetic set of Fashion-MNIST's shape (no upload, no file to read).
BATCH=128
job() {
  cat >"$T/$1.txtpb" <<JOB
name: "bench-$1"
model { input { height: 28 width: 28 channels: 1 }
  layer { flatten {} }
  layer { dense { units: 256 activation: RELU } }
  layer { dense { units: 128 activation: RELU } }
  layer { dense { units: 10 } } }
train { synthetic { examples: $2 seed: 7 classes: 10 } }
batch_size: $BATCH epochs: $3 max_steps: $4 seed: 1
optimizer { adam { learning_rate: 0.001 } }
JOB
  protoc --encode=gpushare.v1.JobSpec --proto_path="$src/proto" gpushare.proto <"$T/$1.txtpb" >"$T/$1.pb" ||
    die "cannot encode $T/$1.txtpb"
  chmod 644 "$T/$1.pb"
}
# submit UID JOB: the new job's id
submit() { ctl_as "$1" --json submit "$T/$2.pb" | jget "['job']['id']"; }
# steps_now FILE: one metrics snapshot (steps of the jobs, device seconds
# and steps of the vdevs), stamped with the time halfway through the call,
# and the executor's CPU seconds and context switches (all its threads)
steps_now() {
  local t0 t1
  t0=$(now); ctl metrics >"$T/metrics.txt" || die "gpuctl metrics failed"; t1=$(now)
  echo "{\"t\": $(calc "($t0 + $t1) / 2"), \"steps\": $($FIG steps "$T/metrics.txt"), \"exec\": $(exec_stats), \"steal_s\": $(steal_s)}" >"$1"
}
# steal_s: CPU seconds the hypervisor gave to others while this machine's
# vCPUs had work, all vCPUs (/proc/stat's steal; 0 on bare metal): a window
# with steal measured a machine that was not all there
steal_s() { awk -v t="$($PY -c 'import os; print(os.sysconf("SC_CLK_TCK"))')" '$1 == "cpu" { print ($9 + 0) / t; exit }' /proc/stat; }
proc_cpu() { # CPU seconds (utime + stime) of process $1 so far
  $PY -c "import os,sys; f=open('/proc/%s/stat'%sys.argv[1]).read().rsplit(')',1)[1].split(); print((int(f[11])+int(f[12]))/os.sysconf('SC_CLK_TCK'))" "$1"
}
executor_pid() { sed -n 's/.*executor for cpu ready (pid \([0-9]*\)).*/\1/p' "$DLOG" | tail -n 1; }
exec_stats() { # {"cpu_s": utime+stime, "ctxsw": voluntary+involuntary, "threads": n}
  local p; p=$(executor_pid)
  [ -n "$p" ] && [ -r /proc/"$p"/stat ] || { echo '{"cpu_s": 0, "ctxsw": 0, "threads": 0}'; return; }
  $PY - "$p" <<'PY'
import glob, json, os, sys
p, tck = sys.argv[1], os.sysconf("SC_CLK_TCK")
f = open("/proc/%s/stat" % p).read().rsplit(")", 1)[1].split()
cpu = (int(f[11]) + int(f[12])) / tck
sw, n = 0, 0
for st in glob.glob("/proc/%s/task/*/status" % p):
    try:
        for l in open(st):
            if l.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                sw += int(l.split()[1])
        n += 1
    except OSError:
        pass  # a thread that ended meanwhile
print(json.dumps({"cpu_s": cpu, "ctxsw": sw, "threads": n}))
PY
}
# wait_stepping ID...: until every job has made a step (loading its set is done)
wait_stepping() {
  local i
  for i in $(seq 600); do
    steps_now "$T/wait.json"
    $PY -c "import json,sys; s=json.load(open('$T/wait.json'))['steps']['job']; sys.exit(0 if all(s.get(j,0)>0 for j in sys.argv[1:]) else 1)" "$@" && return 0
    sleep 0.2
  done
  die "jobs $* did not start stepping in 120 s"
}
# cancel_wait ID...: cancel and wait until each job has ended
cancel_wait() {
  local j i st
  for j in "$@"; do ctl cancel "$j" >/dev/null || die "cannot cancel job $j"; done
  for j in "$@"; do
    for i in $(seq 300); do
      st=$(ctl --json status "$j" | jget "['job']['state']")
      case $st in QUEUED|RUNNING) sleep 0.1 ;; *) break ;; esac
    done
  done
}
# gpushare_requests_total: the daemon counts a request as it takes it, so
# the call that reads the counter is in it
requests_total() { ctl metrics | sed -n 's/^gpushare_requests_total //p'; }
daemon_mem() { # RSS and descriptors of gpushared now
  echo "$(awk '/^VmRSS:/ {print $2}' /proc/"$DPID"/status) $(ls /proc/"$DPID"/fd | wc -l)"
}

# --------------------------------------------------------------- overhead ---
part_overhead() {
  echo "== overhead: one job through gpushared and through gpushare-run"
  start_daemon overhead
  local threads; threads=$(executor_threads)
  [ -n "$threads" ] || die "no thread count in the executor's ready line"
  ctl tenant create ov --uid 4001 >/dev/null || die "tenant create"
  ctl vdev create ov0 --device cpu --memory 512MiB --compute 100 --policy growth --tenant ov >/dev/null || die "vdev create"
  job ov "$OV_EXAMPLES" "$OV_EPOCHS" 0
  local r out id c0 c1
  : >"$T/overhead.jsonl"
  for r in $(seq "$ROUNDS"); do
    # A: gpushare-run, with the thread count the executor uses
    $FIG stamp-run "$T/run.$r.out" "$T/run.$r.err" "$RUN" "$T/ov.pb" --threads "$threads" --json ||
      { cat "$T/run.$r.err" >&2; die "gpushare-run failed in round $r"; }
    out=$($FIG run-rate "$T/run.$r.out") || die "no rates from gpushare-run round $r"
    echo "{\"round\": $r, \"side\": \"run\", ${out#\{}" >>"$T/overhead.jsonl"
    # B: the same job through the daemon, watched as a tenant would
    c0=$(calc "$(exec_stats | jget "['cpu_s']") + $(proc_cpu "$DPID")")
    ctl_as 4001 submit "$T/ov.pb" --watch >"$T/watch.$r.log" 2>&1 || { tail -n 5 "$T/watch.$r.log" >&2; die "daemon job failed in round $r"; }
    c1=$(calc "$(exec_stats | jget "['cpu_s']") + $(proc_cpu "$DPID")")
    id=$(ctl --json list --all | jget "['job'][-1]['id']")
    ctl --json status "$id" >"$T/status.$r.json" && ctl --json logs "$id" >"$T/logs.$r.json" || die "status/logs of job $id"
    out=$($FIG daemon-rate "$T/status.$r.json" "$T/logs.$r.json") || die "no rates from daemon job $id"
    echo "{\"round\": $r, \"side\": \"daemon\", \"cpu_s\": $(calc "$c1 - $c0"), ${out#\{}" >>"$T/overhead.jsonl"
  done
  stop_daemon
  {
    $FIG overhead "$T/overhead.jsonl"
    echo "job: 784-256-128-10 MLP, batch $BATCH, Adam, $OV_EXAMPLES synthetic 28x28 examples, $OV_EPOCHS epochs (rates over epochs 2..$OV_EPOCHS); $threads threads both sides; $ROUNDS rounds, run/daemon alternating"
  } | tee "$T/overhead.table"
  gs_bench_record bench_daemon.overhead "bench_daemon.sh overhead: one job through gpushared and through gpushare-run" \
    "$T/overhead.table" "ROUNDS=$ROUNDS OV_EPOCHS=$OV_EPOCHS OV_EXAMPLES=$OV_EXAMPLES"
  echo
}

# ------------------------------------------------------------------ vdevs ---
# window ID...: steps of these jobs over VDEV_SECONDS, after SETTLE_SECONDS
# (JSON: seconds, per_job, steps, sps)
window() {
  wait_stepping "$@"
  sleep "$SETTLE_SECONDS"
  steps_now "$T/w0.json"; sleep "$VDEV_SECONDS"; steps_now "$T/w1.json"
  $PY - "$T/w0.json" "$T/w1.json" "$BATCH" "$@" <<'PY'
import json, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
batch, jobs = int(sys.argv[3]), sys.argv[4:]
per = {j: b["steps"]["job"].get(j, 0) - a["steps"]["job"].get(j, 0) for j in jobs}
secs = b["t"] - a["t"]
dev = sum(v["device_s"] - a["steps"]["vdev"].get(k, {"device_s": 0})["device_s"]
          for k, v in b["steps"]["vdev"].items())
steps = sum(per.values())
print(json.dumps({"seconds": secs, "per_job": per, "steps": steps, "batch": batch,
                  "sps": steps * batch / secs, "device_s": dev,
                  "exec_cpu_s": b["exec"]["cpu_s"] - a["exec"]["cpu_s"],
                  "exec_ctxsw": b["exec"]["ctxsw"] - a["exec"]["ctxsw"],
                  "exec_threads": b["exec"]["threads"],
                  "steal_s": b.get("steal_s", 0) - a.get("steal_s", 0)}))
PY
}
part_vdevs() {
  echo "== vdevs: four jobs on four vdevs (compute 25) against one (compute 100)"
  start_daemon vdevs
  job long 60000 10000 100000000
  local r t j ids out
  ctl tenant create solo --uid 4100 >/dev/null || die "tenant solo"
  for t in 1 2 3 4; do ctl tenant create "q$t" --uid $((4100 + t)) >/dev/null || die "tenant q$t"; done
  : >"$T/vdevs.jsonl"
  # The shares of one device add up to at most 100: the solo vdev and the
  # four exist in turn, alternating VDEV_ROUNDS times so that a change in
  # the machine's load falls on both cases alike.
  for r in $(seq "$VDEV_ROUNDS"); do
    ctl vdev create solo0 --device cpu --memory 256MiB --compute 100 --policy growth --tenant solo >/dev/null ||
      die "vdev solo0"
    j=$(submit 4100 long) || die "submit solo"
    out=$(window "$j") || exit 1
    echo "{\"round\": $r, \"case\": \"single\", ${out#\{}" >>"$T/vdevs.jsonl"
    cancel_wait "$j"
    ctl vdev delete solo0 >/dev/null || die "vdev delete solo0"
    ids=()
    for t in 1 2 3 4; do
      ctl vdev create "q$t-0" --device cpu --memory 256MiB --compute 25 --policy growth --tenant "q$t" >/dev/null ||
        die "vdev q$t-0"
    done
    for t in 1 2 3 4; do ids+=("$(submit $((4100 + t)) long)") || die "submit q$t"; done
    out=$(window "${ids[@]}") || exit 1
    echo "{\"round\": $r, \"case\": \"four\", ${out#\{}" >>"$T/vdevs.jsonl"
    cancel_wait "${ids[@]}"
    for t in 1 2 3 4; do ctl vdev delete "q$t-0" >/dev/null || die "vdev delete q$t-0"; done
  done
  stop_daemon
  {
    $FIG vdevs "$T/vdevs.jsonl"
    echo "job: the overhead part's MLP on 60000 synthetic examples, batch $BATCH; windows of ${VDEV_SECONDS} s after every job has stepped for ${SETTLE_SECONDS} s, $VDEV_ROUNDS rounds single/four alternating; steps from one gpuctl metrics snapshot at each end"
  } | tee "$T/vdevs.table"
  gs_bench_record bench_daemon.vdevs "bench_daemon.sh vdevs: four vdevs of compute 25 against one of compute 100" \
    "$T/vdevs.table" "VDEV_ROUNDS=$VDEV_ROUNDS VDEV_SECONDS=$VDEV_SECONDS SETTLE_SECONDS=$SETTLE_SECONDS"
  echo
}

# ------------------------------------------------------------------- load ---
bench_load_bin() { # the load generator: built by CMake, else built here
  local b
  b=$build/bin/bench_load
  [ -x "$b" ] && { echo "$b"; return 0; }
  b=$T/bench_load
  # shellcheck disable=SC2046
  cc -std=c11 -D_GNU_SOURCE -O2 -Wall -Wextra -Werror -I"$src" -I"$src/client" -I"$src/common" -I"$build/proto" \
    -o "$b" "$here/bench_load.c" "$build/client/libgsclient.a" "$build/proto/libgsproto.a" \
    "$build/common/libgscommon.a" $(pkg-config --libs libprotobuf-c) -pthread >&2 || return 1
  echo "$b"
}
part_load() {
  echo "== load: $LOAD_CLIENTS clients calling status/list/metrics for ${LOAD_SECONDS} s while two jobs train"
  local bl; bl=$(bench_load_bin) || die "cannot build the load generator bench_load.c"
  start_daemon load
  job long 60000 10000 100000000
  ctl tenant create la --uid 4201 >/dev/null && ctl tenant create lb --uid 4202 >/dev/null || die "tenants"
  ctl vdev create la0 --device cpu --memory 256MiB --compute 50 --policy growth --tenant la >/dev/null &&
    ctl vdev create lb0 --device cpu --memory 256MiB --compute 50 --policy growth --tenant lb >/dev/null || die "vdevs"
  local ja jb; ja=$(submit 4201 long) && jb=$(submit 4202 long) || die "submit"
  wait_stepping "$ja" "$jb"
  # Admins: root (uid 0) and uid 4300 by its supplementary group 100
  # (admin_group = users): status, list, metrics. Tenants: status of their
  # own job, list. All but root reach the socket by its group, nogroup.
  local roles=(--as "0:0:$ja:slm" --as "4300:65534+100:$jb:slm" --as "4201:65534:$ja:sl" --as "4202:65534:$jb:sl")
  local r mem0 mem1 req0 req1 dcpu0 dcpu1 res
  : >"$T/load.txt"
  printf '%-6s %9s %7s %9s %8s %8s %14s %9s %10s %8s\n' round requests errors "req/s" p50_ms p99_ms \
    "rss_kB" "fds" "daemon_req" "cpu_us/r" >>"$T/load.txt"
  for r in $(seq "$LOAD_ROUNDS"); do
    steps_now "$T/l0.json"; mem0=$(daemon_mem); dcpu0=$(proc_cpu "$DPID"); req0=$(requests_total)
    "$bl" --socket "$SOCK" --seconds "$LOAD_SECONDS" --clients "$LOAD_CLIENTS" "${roles[@]}" >"$T/load.$r.out" 2>&1 ||
      { cat "$T/load.$r.out" >&2; die "bench_load failed in round $r"; }
    req1=$(requests_total); dcpu1=$(proc_cpu "$DPID"); mem1=$(daemon_mem); steps_now "$T/l1.json"
    kill -0 "$DPID" 2>/dev/null || die "gpushared died under load"
    echo "-- round $r (bench_load)"; sed '$d' "$T/load.$r.out"
    res=$(tail -n 1 "$T/load.$r.out")
    # shellcheck disable=SC2086
    set -- $mem0 $mem1
    printf '%-6s %9s %7s %9s %8s %8s %14s %9s %10s %8s\n' "$r" \
      "$(echo "$res" | jget "['requests']")" "$(echo "$res" | jget "['errors']")" \
      "$(echo "$res" | jget "['requests_per_second']")" "$(echo "$res" | jget "['p50_ms']")" \
      "$(echo "$res" | jget "['p99_ms']")" "$1->$3" "$2->$4" "$((req1 - req0 - 1))" \
      "$(calc "round(($dcpu1 - $dcpu0) * 1e6 / max(1, $req1 - $req0 - 1), 1)")" >>"$T/load.txt"
    $PY - "$T/l0.json" "$T/l1.json" "$BATCH" "$ja" "$jb" >>"$T/load.txt" <<'PY'
import json, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
d = b["t"] - a["t"]
print("       training meanwhile: " + ", ".join(
    "job %s %.0f samples/s" % (j, (b["steps"]["job"].get(j, 0) - a["steps"]["job"].get(j, 0)) * int(sys.argv[3]) / d)
    for j in sys.argv[4:]))
PY
  done
  cancel_wait "$ja" "$jb"
  local warns; warns=$(grep -c -E '\b(warn|error)\b' "$DLOG")
  stop_daemon
  echo "-- summary"
  {
    cat "$T/load.txt"
    echo "rss_kB, fds: gpushared (the control plane) before->after the round; daemon_req: requests the daemon counted in the round (gpushare_requests_total, less the metrics call that read it); cpu_us/r: gpushared's CPU time per request"
    echo "daemon log lines with warn/error: $warns; clients: roles 0:0 and 4300 with group 100 (admins) status+list+metrics, tenants 4201, 4202 status+list; $LOAD_CLIENTS connections, one call at a time each"
  } | tee "$T/load.table"
  gs_bench_record bench_daemon.load "bench_daemon.sh load: $LOAD_CLIENTS clients against one gpushared" \
    "$T/load.table" "LOAD_SECONDS=$LOAD_SECONDS LOAD_CLIENTS=$LOAD_CLIENTS LOAD_ROUNDS=$LOAD_ROUNDS"
  echo
}

for p in $parts; do "part_$p"; done
