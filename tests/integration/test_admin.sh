#!/usr/bin/env bash
# An ops team administers gpushare: devices, tenants, quotas, vdevs; every
# refusal says why and changes nothing; state survives a restart and kill -9.
set -u
. "$(dirname "$0")/lib.sh"

start_daemon

expect_ok "devices lists the cpu device" ctl devices
[[ "$LAST_OUT" == *cpu* ]] && pass "cpu device shown" || fail "no cpu device in: $LAST_OUT"
expect_ok "devices --json" ctl --json devices
[[ "$LAST_OUT" == *'"usable_bytes":2147483648'* ]] && pass "usable memory from cpu_memory" \
  || fail "cpu_memory = 2GiB not reflected: $LAST_OUT"

expect_ok "tenant create with uids and gids" ctl tenant create team-a --uid 1000 --uid 1001 --gid 2000
expect_ok "tenant create b" ctl tenant create team-b --uid 1002
expect_ok "quota set" ctl quota set team-a --memory 1GiB --compute 80 --max-running 2 --max-queued 4
expect_ok "quota show" ctl --json quota show team-a
[[ "$LAST_OUT" == *'"memory_bytes":1073741824'* && "$LAST_OUT" == *'"max_queued":4'* ]] \
  && pass "quota stored" || fail "quota not as set: $LAST_OUT"
expect_ok "vdev create (growth)" ctl vdev create a0 --device cpu --memory 512MiB --compute 50 --policy growth --tenant team-a
expect_ok "vdev create (preallocate)" ctl vdev create b0 --device cpu --memory 1.5GB --compute 20 --policy preallocate --tenant team-b
expect_ok "vdev list" ctl vdev list
[[ "$LAST_OUT" == *a0* && "$LAST_OUT" == *b0* ]] && pass "both vdevs listed" || fail "vdev list: $LAST_OUT"
expect_ok "tenant list" ctl tenant list
[[ "$LAST_OUT" == *team-a* && "$LAST_OUT" == *team-b* ]] && pass "both tenants listed" || fail "tenant list: $LAST_OUT"

before=$(snapshot)
# usable 2 GiB; a0 0.5 GiB + b0 1.5 GB (1.40 GiB) leave about 0.1 GiB.
expect_fail "vdev past the device's usable memory" 1 RESOURCE_EXHAUSTED \
  ctl vdev create b1 --device cpu --memory 300MiB --compute 5 --tenant team-b
[[ "$LAST_OUT" == *"device cpu"* ]] && pass "names the device" || fail "does not name the device: $LAST_OUT"
expect_fail "vdev past the tenant's memory quota" 1 "memory quota" \
  ctl vdev create a1 --device cpu --memory 600MiB --compute 5 --tenant team-a
expect_fail "compute shares over 100 on a device" 1 "pass 100" \
  ctl vdev create b1 --device cpu --memory 1MiB --compute 31 --tenant team-b
expect_fail "vdev past the tenant's compute quota" 1 "compute quota" \
  ctl vdev create a1 --device cpu --memory 1MiB --compute 31 --tenant team-a
expect_fail "vdev on an unknown device" 1 NOT_FOUND \
  ctl vdev create a1 --device gpu7 --memory 1MiB --compute 1 --tenant team-a
expect_fail "vdev for an unknown tenant" 1 NOT_FOUND \
  ctl vdev create a1 --memory 1MiB --compute 1 --tenant nobody
expect_fail "duplicate vdev" 1 ALREADY_EXISTS ctl vdev create a0 --memory 1MiB --compute 1 --tenant team-a
expect_fail "duplicate tenant" 1 ALREADY_EXISTS ctl tenant create team-a
expect_fail "a uid in two tenants" 1 "already belongs to tenant team-a" ctl tenant create team-c --uid 1000
expect_fail "deleting a tenant that has vdevs" 1 FAILED_PRECONDITION ctl tenant delete team-a
expect_fail "lowering a quota below its vdevs" 1 FAILED_PRECONDITION ctl quota set team-a --memory 100MiB
expect_fail "bad name (path separator)" 1 INVALID_ARGUMENT ctl tenant create 'a/b'
expect_fail "bad name (control character)" 1 INVALID_ARGUMENT ctl tenant create $'a\tb'
expect_fail "bad name (too long)" 1 "at most 63" ctl tenant create "$(printf 'x%.0s' $(seq 1 200))"
expect_fail "size -1" 2 "-1" ctl vdev create a1 --memory -1 --compute 1 --tenant team-a
expect_fail "size 4XB" 2 "4XB" ctl vdev create a1 --memory 4XB --compute 1 --tenant team-a
expect_fail "size overflow" 2 "99999999999TiB" ctl vdev create a1 --memory 99999999999TiB --compute 1 --tenant team-a
expect_fail "bad policy" 2 "sometimes" ctl vdev create a1 --memory 1MiB --compute 1 --policy sometimes --tenant team-a
expect_fail "unknown command" 2 "frobnicate" ctl frobnicate
after=$(snapshot)
[ "$before" = "$after" ] && pass "refusals changed nothing" || fail "state changed by refusals"

expect_ok "quota raise" ctl quota set team-a --memory 2GiB
expect_ok "vdev delete" ctl vdev delete b0
expect_ok "room returns after delete" ctl vdev create a1 --memory 600MiB --compute 5 --tenant team-a
# A share is the percent of the device a vdev is guaranteed while it has
# work: the shares of a device add up to 100 at most, and to exactly 100.
expect_ok "shares that fill the device to 100 exactly (50 + 5 + 45)" \
  ctl vdev create b1 --device cpu --memory 1MiB --compute 45 --tenant team-b
expect_fail "one share more on a full device" 1 "would pass 100 (at most 0 is left)" \
  ctl vdev create b2 --device cpu --memory 1MiB --compute 1 --tenant team-b
expect_ok "vdev delete b1" ctl vdev delete b1
expect_ok "vdev create --help" ctl vdev create --help
[[ "$LAST_OUT" == *"guaranteed while it has work"* && "$LAST_OUT" == *"add up to at most 100"* ]] &&
  pass "--help says what a share guarantees and that a device's shares add up to at most 100" ||
  fail "vdev create --help: $LAST_OUT"

# Restart (SIGTERM) keeps all state.
before=$(snapshot)
stop_daemon
start_daemon
after=$(snapshot)
[ "$before" = "$after" ] && pass "restart keeps all state" || { fail "restart lost state"; diff <(echo "$before") <(echo "$after"); }

# kill -9 keeps all state, and the database is intact.
expect_ok "tenant create just before kill -9" ctl tenant create team-d --gid 3000
before=$(snapshot)
kill9_daemon
expect_ok "integrity_check after kill -9" sqlite3 "$STATE/gpushared.db" "PRAGMA integrity_check"
[ "$LAST_OUT" = ok ] && pass "database intact" || fail "integrity_check: $LAST_OUT"
start_daemon
after=$(snapshot)
[ "$before" = "$after" ] && pass "kill -9 keeps all state" || { fail "kill -9 lost state"; diff <(echo "$before") <(echo "$after"); }

expect_ok "vdev delete a1" ctl vdev delete a1
expect_ok "vdev delete a0" ctl vdev delete a0
expect_ok "tenant delete once empty" ctl tenant delete team-a
expect_fail "tenant gone" 1 NOT_FOUND ctl quota show team-a
stop_daemon
finish
