#!/usr/bin/env bash
# 1000 frames of garbage and a 2 GiB length prefix leave the daemon serving
# others, with its memory bounded.
set -u
. "$(dirname "$0")/lib.sh"
start_daemon
rss_before=$(awk '/VmRSS/ {print $2}' /proc/$DPID/status)
expect_ok "garbage.py: every garbage frame answered, 2 GiB prefix closed, others served" \
  $PY "$(dirname "$0")/garbage.py" "$SOCK"
echo "$LAST_OUT"
rss_after=$(awk '/VmRSS/ {print $2}' /proc/$DPID/status)
echo "daemon RSS: ${rss_before} kB before, ${rss_after} kB after"
[ "$rss_after" -lt $((rss_before + 65536)) ] && pass "no 2 GiB allocation (RSS grew by $((rss_after - rss_before)) kB)" \
  || fail "RSS grew from $rss_before kB to $rss_after kB"
expect_ok "gpuctl still served" ctl devices
grep -q "longer than" "$T/daemon.log" && pass "the oversized frame is logged" || fail "no log line for the 2 GiB prefix"
stop_daemon
finish
