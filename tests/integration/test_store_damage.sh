#!/usr/bin/env bash
# A damaged store is never served: gpushared refuses to start on a database
# with pages overwritten, on one cut to half its length, and on an emptied
# or deleted one beside the jobs/ of an earlier store, each time naming the
# file and the remedy and leaving no socket. The good copy put back starts
# with its state; an older backup put back starts too, and the next job
# takes an id above every jobs/ directory, so none is reused.
set -u
. "$(dirname "$0")/lib.sh"
need_protoc
command -v sqlite3 >/dev/null || { echo "skip: the sqlite3 CLI is not installed"; exit 77; }
DB=$STATE/gpushared.db

printf 'name: "short" vdev: "a0" %s max_steps: 20\n' "$LONG_JOB" |
  protoc --encode=gpushare.v1.JobSpec --proto_path="$PROTO" gpushare.proto >"$T/short.pb"
chmod 644 "$T/short.pb"
submit_short() {
  local out; out=$(A submit "$T/short.pb" 2>&1)
  [[ "$out" =~ ^job\ ([0-9]+)\ submitted ]] || { fail "submit: $out"; return 1; }
  JOB=${BASH_REMATCH[1]}; wait_state "$JOB" SUCCEEDED 60 >/dev/null || fail "job $JOB did not succeed"
}
# backup NAME: a consistent copy of the database, with the daemon down.
backup() { sqlite3 "$DB" ".backup '$T/$1.db'"; }
restore() { rm -f "$DB" "$DB-wal" "$DB-shm"; cp "$T/$1.db" "$DB"; chmod 600 "$DB"; }
# refused WHAT TEXT: gpushared exits non-zero, names the database and TEXT.
refused() {
  local rc=0
  timeout 30 "$GPUSHARED" --foreground --config "$CONF" --socket "$SOCK" --state-dir "$STATE" \
    >"$T/start.log" 2>&1 || rc=$?
  local msg; msg=$(grep -m1 -E "damaged|missing|empty" "$T/start.log")
  if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ]; then fail "$1: gpushared started (exit $rc)"
  elif [[ "$msg" != *"$DB"* || "$msg" != *"$2"* || "$msg" != *backup* ]]; then
    fail "$1: exit $rc, but the refusal does not name $DB, \"$2\" and a backup: $(tail -2 "$T/start.log")"
  elif [ -S "$SOCK" ]; then fail "$1: refused, but left a socket"
  else pass "$1: refused (exit $rc): ${msg#*gpushared }"; fi
}

start_daemon
expect_ok "tenant a" ctl tenant create a --uid 4001
expect_ok "vdev a0" ctl vdev create a0 --memory 256MiB --compute 100 --tenant a
submit_short; FIRST=$JOB
stop_daemon
backup old
start_daemon
submit_short; SECOND=$JOB
stop_daemon
backup good
[ -d "$STATE/jobs/$SECOND" ] && pass "jobs $FIRST and $SECOND ran, job $SECOND has $STATE/jobs/$SECOND" ||
  fail "no directory for job $SECOND"

# Pages in the middle overwritten, the header kept: SQLite opens it.
restore good
size=$(stat -c %s "$DB")
$PY -c "
import sys
with open(sys.argv[1], 'r+b') as f:
    f.seek(4096 + 64); f.write(b'\xa5' * min(8192, max(1, $size - 4096 - 64)))" "$DB"
refused "a database with overwritten pages" damaged

restore good
truncate -s $((size / 2)) "$DB"
refused "a database cut to half its length ($size -> $((size / 2)) bytes)" damaged

restore good
: >"$DB"
refused "an emptied database beside jobs/" "empty (0 bytes)"

rm -f "$DB"
refused "a deleted database beside jobs/" missing

restore good
start_daemon
expect_ok "the good copy put back: gpushared starts" ctl tenant list
[[ "$LAST_OUT" == *a* ]] && pass "with its tenants" || fail "tenant list: $LAST_OUT"
stop_daemon

# An older backup: it knows job $FIRST only; jobs/$SECOND is still there.
restore old
start_daemon
grep -q "belongs to no job in the store" "$T/daemon.log" &&
  pass "the directory of a job the backup does not know is reported" || fail "no report of jobs/$SECOND"
submit_short
[ "$JOB" -gt "$SECOND" ] && pass "the next job is $JOB, above every jobs/ directory (the highest: $SECOND)" ||
  fail "the next job took id $JOB, reusing jobs/$JOB"
stop_daemon
finish
