#!/usr/bin/env bash
# kill -9 of gpushared at 20 moments chosen by a seeded RNG, each followed by
# a restart, as a power cut or an OOM kill would do it. Rounds cycle through
# four moments: a burst of `gpuctl submit` in flight, a multi-MiB `gpuctl
# dataset add` in flight, jobs writing a checkpoint every 1-3 steps (with a
# cancel racing the kill), and short jobs finishing. After each kill, with
# the daemon down: the store passes PRAGMA integrity_check, the dataset blobs
# are whole and content-addressed, every checkpoint and export is whole and
# one checkpoint resumes in gpushare-run. After each restart: every submit
# gpuctl saw accepted is listed exactly once under its id, no job twice, no
# dataset but whole ones the test sent (and each accepted one), no job
# FAILED. At the end every job SUCCEEDED after exactly its steps, or is
# CANCELLED where the test cancelled it.
#
# GS_FAULTS_SEED=N replays a run (the seed is printed first); the delays are
# drawn before anything runs, so a seed names the same schedule.
set -u
. "$(dirname "$0")/lib.sh"
need_protoc
command -v sqlite3 >/dev/null || { echo "skip: the sqlite3 CLI is not installed"; exit 77; }
RUN=${GS_BUILD_DIR:+$GS_BUILD_DIR/bin/gpushare-run}
[ -x "${RUN:-}" ] || RUN=$(dirname "$GPUSHARED")/train/gpushare-run
[ -x "$RUN" ] || { echo "skip: gpushare-run not found beside $GPUSHARED"; exit 77; }
CHECK="$PY $HERE/faults_check.py"
ROUNDS=20
SLOW=1; [ "${GS_SANITIZED:-0}" = 1 ] && SLOW=3   # ASan: everything takes ~3x as long

SEED=${GS_FAULTS_SEED:-$(( $(date +%s%N) % 1000000007 ))}
echo "# seed $SEED (replay: GS_FAULTS_SEED=$SEED)"
# The whole schedule, drawn up front so that timing cannot change it.
RANDOM=$SEED
declare -a DELAY BURST STEPS EVERY CDELAY ONACK
for r in $(seq 0 $((ROUNDS - 1))); do
  case $((r % 4)) in
    1) DELAY[r]=$((RANDOM % (700 * SLOW))) ;;  # an upload of 4.5 MiB lasts ~0.5 s
    3) DELAY[r]=$((RANDOM % (150 * SLOW))) ;;  # the short jobs end within ~0.1-0.3 s
    *) DELAY[r]=$((RANDOM % 300)) ;;
  esac
  BURST[r]=$((3 + RANDOM % 4))
  STEPS[r]="$((20 + RANDOM % 100)) $((20 + RANDOM % 100)) $((20 + RANDOM % 100)) $((20 + RANDOM % 100)) $((20 + RANDOM % 100)) $((20 + RANDOM % 100))"
  EVERY[r]=$((1 + RANDOM % 3))
  CDELAY[r]=$((RANDOM % 300))
  ONACK[r]=$((RANDOM % 2))   # checkpoint rounds: kill the moment the cancel is acknowledged
done

BOOK=$T/book; mkdir -p "$BOOK"; touch "$BOOK"/{submitted,accepted,cancel_wanted,cancel_acked,ds_tried,ds_accepted}
# job NAME TXTPB: encode a text JobSpec into $T/NAME.pb
job() { printf '%s\n' "$2" >"$T/$1.txtpb"
  protoc --encode=gpushare.v1.JobSpec --proto_path="$PROTO" gpushare.proto <"$T/$1.txtpb" >"$T/$1.pb"
  chmod 644 "$T/$1.pb"; }
# synth NAME STEPS CHECKPOINT_EVERY: a small synthetic job on vdev a0
synth() { job "$1" "name: \"$1\" vdev: \"a0\"
model { input { height: 8 width: 8 channels: 1 }
  layer { flatten {} } layer { dense { units: 64 activation: RELU } } layer { dense { units: 4 } } }
train { synthetic { examples: 4096 seed: 7 classes: 4 } }
test { synthetic { examples: 512 seed: 7 classes: 4 } }
batch_size: 32 epochs: 10000 max_steps: $2 seed: 1 checkpoint_every_steps: $3
optimizer { adam { learning_rate: 0.003 } }"; }
ms() { printf '%d.%03d' $(($1 / 1000)) $(($1 % 1000)); }
# submit NAME STEPS: as the tenant, booking what gpuctl said. 0 if accepted.
submit() {
  echo "$1 $2" >>"$BOOK/submitted"
  local out; out=$(A submit "$T/$1.pb" 2>"$T/$1.err") || return 1
  [[ "$out" =~ ^job\ ([0-9]+)\ submitted ]] || { echo "# $1: gpuctl exited 0 saying: $out"; return 1; }
  echo "$1 ${BASH_REMATCH[1]}" >>"$BOOK/accepted"
}
refused() { echo "submit $1 refused: $(cat "$T/$1.err")"; }
id_of() { awk -v n="$1" '$1 == n { print $2 }' "$BOOK/accepted"; }
cancel() {  # cancel NAME: booked as wanted, and as acknowledged when gpuctl says so
  echo "$1" >>"$BOOK/cancel_wanted"
  A cancel "$(id_of "$1")" >/dev/null 2>&1 && echo "$1" >>"$BOOK/cancel_acked"
}
states_of() {  # states_of NAME...: NAME=STATE for each (from $T/list.json)
  $PY -c "import json,sys; s={j['name']: j['state'] for j in json.load(open(sys.argv[1]))['job']}
print(' '.join('%s=%s' % (n, s.get(n, 'absent')) for n in sys.argv[2:]))" "$T/list.json" "$@"
}
# Long jobs still going (their cancel cut off by a kill, or lost): cancel them.
cancel_leftovers() {
  local n
  for n in $(states_of $(awk '$1 ~ /^cx-/ {print $1}' "$BOOK/accepted") | tr ' ' '\n' | grep -E '=(RUNNING|QUEUED)$' | cut -d= -f1); do
    cancel "$n"
  done
}

# --- the kill, and what must hold with the daemon down ----------------------
crash() { kill9_daemon; remains "$@"; }  # crash WHAT [N]: kill -9 now, check the remains
remains() {  # remains WHAT [N]: with the daemon down, what it left must be whole
  local gone=0
  for _ in $(seq $((100 * SLOW))); do pgrep -f "gpushare-executor.*$STATE" >/dev/null || { gone=1; break; }; sleep 0.05; done
  [ $gone = 1 ] || fail "$1: the executor outlived its control plane by $((5 * SLOW)) s"
  local out
  out=$(sqlite3 "$STATE/gpushared.db" "PRAGMA integrity_check" 2>&1)
  [ "$out" = ok ] && pass "$1: integrity_check ok" || fail "$1: integrity_check: $out"
  if out=$($CHECK offline "$STATE"); then
    pass "$1: datasets, checkpoints and exports on disk are whole$(grep '^note' <<<"$out" | sed 's/^note/;/' | tr '\n' ' ')"
  else fail "$1: $(grep -v '^ckpt' <<<"$out")"; fi
  # One checkpoint (of a job whose spec the test knows) resumes and trains a step.
  local c id step path name n=0
  c=$(grep '^ckpt' <<<"$out" | while read -r _ id step path; do
        name=$(awk -v i="$id" '$2 == i { print $1 }' "$BOOK/accepted")
        [ -n "$name" ] && echo "$name $step $path"; done)
  n=$(grep -c . <<<"$c")
  if [ -n "$c" ]; then
    read -r name step path < <(sed -n "$(( ${2:-0} % n + 1 ))p" <<<"$c")
    cp "$path" "$T/resume.ckpt"
    if out=$("$RUN" "$T/$name.pb" --resume "$T/resume.ckpt" --max-steps $((step + 1)) 2>&1); then
      pass "$1: $name's checkpoint (step $step) resumes in gpushare-run"
    else fail "$1: $name's checkpoint (step $step) does not resume: $out"; fi
  fi
}
# --- what must hold once it is back -----------------------------------------
check_up() {  # check_up WHAT [--final]
  ctl --json list --all >"$T/list.json" 2>"$T/list.err" || { fail "$1: list --all: $(cat "$T/list.err")"; return; }
  A --json dataset list >"$T/ds.json" 2>"$T/ds.err" || { fail "$1: dataset list: $(cat "$T/ds.err")"; return; }
  local out
  if out=$($CHECK online "$STATE" "$BOOK" "$T/list.json" "$T/ds.json" ${2:-}); then pass "$1: $out"
  else fail "$1: $out"; fi
}

# --- set-up -------------------------------------------------------------------
for k in 0 1 2; do $CHECK gen "$T/ds$k.idx" 6000 $((SEED + k)); done
chmod 644 "$T"/ds*.idx
start_daemon
expect_ok "tenant a" ctl tenant create a --uid 4001
expect_ok "vdev a0" ctl vdev create a0 --memory 512MiB --compute 100 --policy growth --tenant a
echo "ds-base $T/ds0.idx" >>"$BOOK/ds_tried"
expect_ok "a dataset before any kill" A dataset add ds-base "$T/ds0.idx" && echo ds-base >>"$BOOK/ds_accepted"
synth base 60 5; submit base 60 && pass "a job before any kill" || fail "$(refused base)"

for r in $(seq 0 $((ROUNDS - 1))); do
  d=${DELAY[r]}; read -ra st <<<"${STEPS[r]}"
  [ "$r" -gt 0 ] && cancel_leftovers   # of earlier rounds, cut off by their kill
  case $((r % 4)) in
  0) what="round $r: kill $(ms "$d") s into a burst of ${BURST[r]} submits"
     names=()
     for k in $(seq 0 $((BURST[r] - 1))); do synth "sub-$r-$k" "${st[k]}" 5; names+=("sub-$r-$k"); done
     ( for k in $(seq 0 $((BURST[r] - 1))); do submit "sub-$r-$k" "${st[k]}"; done ) &
     bg=$!; sleep "$(ms "$d")"; crash "$what" "$r"; wait "$bg"
     echo "# $what: $(grep -c "^sub-$r-" "$BOOK/accepted") accepted" ;;
  1) f="$T/ds$(( (r / 4) % 3 )).idx"
     what="round $r: kill $(ms "$d") s into the upload of $(basename "$f") as ds-$r"
     echo "ds-$r $f" >>"$BOOK/ds_tried"
     ( A dataset add "ds-$r" "$f" >/dev/null 2>&1 && echo "ds-$r" >>"$BOOK/ds_accepted" ) &
     bg=$!; sleep "$(ms "$d")"; crash "$what" "$r"; wait "$bg"
     names=()
     grep -qx "ds-$r" "$BOOK/ds_accepted" && echo "# $what: accepted" || echo "# $what: refused" ;;
  2) if [ "${ONACK[r]}" = 1 ]; then
       what="round $r: checkpoints every ${EVERY[r]} step(s), a cancel at $(ms "${CDELAY[r]}") s, kill when it is acknowledged"
     else what="round $r: kill $(ms "$d") s into checkpoints every ${EVERY[r]} step(s), cancel at $(ms "${CDELAY[r]}") s"; fi
     synth "ck-$r" 150 "${EVERY[r]}"; synth "cx-$r" 1000000 10
     submit "ck-$r" 150 || fail "$what: $(refused "ck-$r")"
     submit "cx-$r" 1000000 || fail "$what: $(refused "cx-$r")"
     names=("ck-$r" "cx-$r")
     for _ in $(seq 100); do  # until ck is training (and so checkpointing)
       s=$(ctl --json status "$(id_of "ck-$r")" 2>/dev/null | $PY -c "import json,sys; print(json.load(sys.stdin)['job'].get('step', 0))" 2>/dev/null)
       [ "${s:-0}" -gt 0 ] && break; sleep 0.05; done
     if [ "${ONACK[r]}" = 1 ]; then
       sleep "$(ms "${CDELAY[r]}")"; cancel "cx-$r"; crash "$what" "$r"
     else
       ( sleep "$(ms "${CDELAY[r]}")"; cancel "cx-$r" ) &
       bg=$!; sleep "$(ms "$d")"; crash "$what" "$r"; wait "$bg"
     fi
     echo "# $what: ck-$r at step ${s:-0}+ when the kill came; cancel $(grep -qx "cx-$r" "$BOOK/cancel_acked" && echo acknowledged || echo cut off)" ;;
  3) what="round $r: kill $(ms "$d") s after 3 short jobs were submitted"
     names=()
     for k in 0 1 2; do
       n="fin-$r-$k"; steps=$(( st[k] / 4 + 5 ))
       synth "$n" "$steps" 5; submit "$n" "$steps" || fail "$what: $(refused "$n")"; names+=("$n")
     done
     sleep "$(ms "$d")"; crash "$what" "$r" ;;
  esac
  start_daemon
  check_up "round $r: after the restart"
  [ ${#names[@]} -gt 0 ] && echo "# round $r after the restart: $(states_of "${names[@]}")"
done

# --- the end: every job ends --------------------------------------------------
ctl --json list --all >"$T/list.json"; cancel_leftovers
left=
for _ in $(seq $((120 * SLOW * 3))); do
  ctl --json list --all >"$T/list.json" 2>/dev/null || break
  left=$($PY -c "import json,sys; print(' '.join(j['name'] for j in json.load(open(sys.argv[1]))['job'] if j['state'] in ('QUEUED', 'RUNNING')))" "$T/list.json")
  [ -z "$left" ] && break; sleep 0.3
done
[ -z "$left" ] && pass "every job ended after the last restart" || fail "jobs still not ended: $left"
check_up "at the end" --final
stop_daemon
remains "after SIGTERM" 0
# Under ASan+UBSan a report in any daemon's or executor's log is a failure.
if grep -qE "runtime error:|AddressSanitizer|LeakSanitizer" "$T/daemon.log"; then
  fail "sanitizer reports in the daemon log: $(grep -m3 -E 'runtime error:|Sanitizer' "$T/daemon.log")"
else pass "no sanitizer report in the logs of the 21 daemons"; fi
finish
