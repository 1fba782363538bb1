#!/usr/bin/env bash
# No local user can lock the others out of gpushared. As an attacker with no
# role (uids with no tenant, not admins), flood_client.py opens more
# connections than one uid may, announces 16 MiB frames on 64 connections
# and pushes their bytes without ever finishing them, trickles frames a byte
# at a time, holds idle connections and connects in a loop; meanwhile an
# admin (gpuctl as root) and a tenant member (uid 4001) must each be served
# within 1 s, round after round, the daemon's RSS must stay under 100 MB, and
# the daemon must refuse, close or evict the attacker's connections, naming
# the limit, as docs/security.md (Limits) says. Small limits make it quick:
# frame_timeout_s 3, idle_timeout_norole_s 2, max_pending_frame_bytes 32 MiB.
# Under ASan/UBSan (GS_SANITIZED) the daemon and gpuctl run several times
# slower and the RSS holds the sanitizer's shadow and quarantine: "served"
# then allows 3 s rather than 1 s (measured: up to 1.6 s with another ASan
# test beside it on 2 cores, against at most about 0.2 s in the optimized
# build), and the RSS bound is not checked.
set -u
. "$(dirname "$0")/lib.sh"
[ "$(id -u)" -eq 0 ] || { echo "skip: needs root (the attacker and the tenants are other uids)"; exit 77; }

F() { $PY "$HERE/flood_client.py" "$@"; }
val() { sed -n "s/.*\b$1=\([^ ]*\).*/\1/p" <<<"$2" | head -n1; }   # val KEY OUTPUT
between() { $PY -c "import sys; sys.exit(0 if $2 <= float('$1') <= $3 else 1)" 2>/dev/null; }

cat >>"$CONF" <<CONF
max_connections = 100
admin_reserved_connections = 8
max_connections_per_uid = 32
frame_timeout_s = 3
idle_timeout_norole_s = 2
max_pending_frame_bytes = 32MiB
CONF
start_daemon
expect_ok "tenant a (uid 4001)" ctl tenant create a --uid 4001
expect_ok "tenant b (uid 4002)" ctl tenant create b --uid 4002
expect_ok "tenant c (uid 4003)" ctl tenant create c --uid 4003

# hold_until_ready OUT FLAG SPEC...: flood_client.py hold in the background
# until it has made its connections; HPID is its pid.
hold() { local out=$1 flag=$2; shift 2
  F hold "$SOCK" "$flag" "$@" >"$out" 2>&1 &
  HPID=$!
  for _ in $(seq 300); do grep -q '^ready=1' "$out" && return 0
    kill -0 "$HPID" 2>/dev/null || break; sleep 0.1; done
  fail "flood_client.py hold did not get ready: $(cat "$out")"; }

# --- admin_reserved_connections: the last 8 of 100 are for admins -----------
# Tenant members fill the 92 others (32 + 32 + 28, under the per-uid cap).
hold "$T/fill.out" "$T/fill.go" 4001:32 4002:32 4003:29
out=$(cat "$T/fill.out"); echo "$out"
[[ "$out" == *"uid=4001 answered=32 refused=0"* && "$out" == *"uid=4002 answered=32 refused=0"* \
   && "$out" == *"uid=4003 answered=28 refused=1"* ]] \
  && pass "92 connections of tenant members served, the 93rd refused" || fail "reserve fill: $out"
[[ "$out" == *"uid=4003 refusal=RESOURCE_EXHAUSTED: 92 connections are open; the last 8 of the 100 this daemon serves (max_connections) are kept for admins (admin_reserved_connections)"* ]] \
  && pass "the refusal is RESOURCE_EXHAUSTED and names admin_reserved_connections" || fail "reserve refusal: $out"
expect_fail "gpuctl of a tenant member is refused the same way" 1 "(admin_reserved_connections)" \
  ctl_as 4003 65534 list
for k in 1 2 3; do expect_ok "an admin is served in a reserved slot ($k)" ctl version; done
touch "$T/fill.go"; wait "$HPID" || fail "hold: $(cat "$T/fill.out")"
[[ "$(cat "$T/fill.out")" == *"uid=4003 held_served=28"* ]] && pass "the 92 held connections are all still served" \
  || fail "held: $(cat "$T/fill.out")"

# --- max_connections_per_uid = 32, for a uid with no role ---------------------
hold "$T/cap.out" "$T/cap.go" 4101:36
out=$(cat "$T/cap.out"); echo "$out"
[[ "$out" == *"uid=4101 answered=32 refused=4"* ]] && pass "uid 4101: 32 connections served, 4 more refused" \
  || fail "per-uid cap: $out"
[[ "$out" == *"uid=4101 refusal=RESOURCE_EXHAUSTED: uid 4101 has 32 connections open, as many as one uid may (max_connections_per_uid 32)"* ]] \
  && pass "each refusal is an answer (id 0, RESOURCE_EXHAUSTED) naming max_connections_per_uid, then EOF" \
  || fail "per-uid refusal: $out"
expect_fail "gpuctl as uid 4101 prints the refusal" 1 "RESOURCE_EXHAUSTED" ctl_as 4101 65534 version
[[ "$LAST_OUT" == *"max_connections_per_uid 32"* ]] && pass "naming the limit" || fail "gpuctl: $LAST_OUT"
expect_ok "another uid with no role is served meanwhile" ctl_as_nobody version
expect_ok "so is a tenant member" ctl_as 4001 65534 list
touch "$T/cap.go"; wait "$HPID"
grep -q "warn: refusing a connection of uid 4003 pid [0-9]*: 92 connections are open" "$T/daemon.log" \
  && pass "refusals are logged at warn with uid, pid and why" || fail "no refusal in the log"

# --- frame_timeout_s = 3 and idle_timeout_norole_s = 2 -------------------------
# Trickled frames and idle connections of uids with no role, and an idle
# connection of a tenant member beside them, which must stay.
F trickle "$SOCK" 4102 4 20 >"$T/trickle.out" 2>&1 & tpid=$!
F idle "$SOCK" 4103 4 20 >"$T/idle.out" 2>&1 & ipid=$!
F idle "$SOCK" 4002 1 8 >"$T/tidle.out" 2>&1 & tipid=$!
wait "$tpid" "$ipid" "$tipid"
out=$(cat "$T/trickle.out"); echo "$out"
[ "$(val trickle_closed "$out")" = 4 ] && pass "4 connections trickling a byte each 0.5 s are closed" \
  || fail "trickle: $out"
between "$(val trickle_after_min "$out")" 3 20 && between "$(val trickle_after_max "$out")" 3 20 \
  && pass "after the frame deadline: $(val trickle_after_min "$out")..$(val trickle_after_max "$out") s (frame_timeout_s 3)" \
  || fail "trickle times: $out"
grep -q "info: closing the connection of uid 4102 pid [0-9]*: [0-9]* of a frame's 1048576 bytes arrived in 3 s (frame_timeout_s 3)" "$T/daemon.log" \
  && pass "logged at info with uid, pid and frame_timeout_s" || fail "no frame_timeout_s log line"
out=$(cat "$T/idle.out"); echo "$out"
[ "$(val idle_closed "$out")" = 4 ] && pass "4 idle connections of a uid with no role are closed" || fail "idle: $out"
between "$(val idle_after_min "$out")" 2 20 && between "$(val idle_after_max "$out")" 2 20 \
  && pass "after $(val idle_after_min "$out")..$(val idle_after_max "$out") s (idle_timeout_norole_s 2)" \
  || fail "idle times: $out"
out=$(cat "$T/tidle.out"); echo "$out"
[ "$(val idle_closed "$out")" = 0 ] && pass "a tenant member's idle connection stays (idle_timeout_s 600)" \
  || fail "tenant idle: $out"
grep -q "closing the connection of uid 4103 pid [0-9]*: idle for 2 s (idle_timeout_norole_s)" "$T/daemon.log" \
  && pass "logged with idle_timeout_norole_s" || fail "no idle_timeout_norole_s log line"

# --- the flood: 64 connections announcing 16 MiB, and connects in a loop -------
# Two uids with no role, 32 connections each (their cap), push 16 MiB frames
# as fast as the daemon reads and never finish them, and each connects and
# hangs up in a loop. Every round, an admin and a tenant member must be
# served within 1 s: measured per call, gpuctl's own start included.
FLOOD_S=8
BOUND_MS=1000
[ "${GS_SANITIZED:-0}" = 1 ] && BOUND_MS=3000
F flood "$SOCK" "$DPID" "$FLOOD_S" 65534 4104 >"$T/flood.out" 2>&1 & fpid=$!
sleep 1
worst=0; rounds=0; slow=
for r in 1 2 3 4 5 6; do
  for who in admin tenant; do
    t0=$EPOCHREALTIME
    if [ "$who" = admin ]; then ctl version >/dev/null 2>&1; rc=$?
    else ctl_as 4001 65534 list >/dev/null 2>&1; rc=$?; fi
    t1=$EPOCHREALTIME
    ms=$($PY -c "print(int(($t1 - $t0) * 1000))")
    echo "round $r: $who served in $ms ms (exit $rc)"
    [ "$rc" -eq 0 ] || slow="$slow $who:exit$rc"
    [ "$ms" -lt "$BOUND_MS" ] || slow="$slow $who:${ms}ms"
    [ "$ms" -gt "$worst" ] && worst=$ms
  done
  rounds=$r
  sleep 0.5
done
wait "$fpid" || fail "flood_client.py flood failed"
out=$(cat "$T/flood.out"); echo "$out"
[ -z "$slow" ] && pass "$rounds rounds under the flood: admin and tenant each served within $((BOUND_MS / 1000)) s (worst ${worst} ms)" \
  || fail "under the flood:$slow"
base=$(val rss_base_kb "$out"); peak=$(val rss_peak_kb "$out")
echo "daemon VmRSS: ${base} kB before the flood, ${peak} kB at its peak"
if [ "${GS_SANITIZED:-0}" = 1 ]; then
  echo "skip the RSS bound: a sanitizer's shadow memory and quarantine are in RSS"
else
  [ -n "$peak" ] && [ "$peak" -lt 102400 ] && pass "daemon RSS peaked at $((peak / 1024)) MiB (< 100 MB) with 64 connections announcing 16 MiB" \
    || fail "daemon RSS peaked at ${peak} kB"
fi
[[ "$out" == *"uid=65534 big_pusher made="* && "$out" == *"uid=4104 big_pusher made="* ]] \
  && pass "both attacker uids pushed big frames" || fail "flood: $out"
n=$(sed -n 's/.*big_pusher .*closed_by_daemon=\([0-9]*\).*/\1/p' <<<"$out" | awk '{s += $1} END {print s + 0}')
[ "${n:-0}" -gt 0 ] && pass "the daemon closed $n of the attackers' big-frame connections" || fail "none closed: $out"
grep -q "warn: uid [0-9]* holds .* in partly received frames, the most of any uid, and all connections would hold .* (max_pending_frame_bytes 32.00 MiB)" "$T/daemon.log" \
  && pass "evictions over max_pending_frame_bytes are logged at warn" || fail "no max_pending_frame_bytes log line"
expect_ok "gpuctl served after the flood" ctl version
expect_ok "and the tenant member" ctl_as 4001 65534 list
stop_daemon
finish
