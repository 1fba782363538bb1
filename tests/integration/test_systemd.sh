#!/bin/sh
# test_systemd.sh: the systemd units gpushare ships load without a single
# complaint.
#
# Usage: test_systemd.sh PATH_TO_GPUSHARED   (exit 0 pass, 1 fail, 77 skip)
#
# `systemd-analyze verify` exits 0 on unknown keys, misspelt sections and
# similar mistakes, and only prints a warning, so this test fails on ANY
# output it produces, not just on its exit status. Before trusting that
# silence, it verifies a copy of the service with a deliberately unknown
# key and requires a complaint, so a verifier that checks nothing cannot
# pass the test.
#
# verify also insists that ExecStart= names an existing executable; the
# units say /usr/bin/gpushared, so the copies checked here name the built
# binary given as $1 instead (or /bin/true, said so, while it is not built).
#
# The sysusers.d file is applied to an empty temporary root with
# systemd-sysusers --root, which must create the two groups and the user
# and say nothing but what it created; the tmpfiles.d file is then applied
# to the same root and must make /var/lib/gpushared mode 0700 for that user.
#
# `systemd-analyze security --offline=yes` scores the service's sandbox
# (0 = fully locked down, 10 = none); the score is printed and must stay at
# or below 3.0 ("OK" and better). A copy with the sandbox's main settings
# removed must score worse, so an analyzer that ignored the file could not
# pass.
set -u

here=$(cd "$(dirname "$0")" && pwd)
units="$here/../../systemd"
fail=0

if ! command -v systemd-analyze >/dev/null 2>&1; then
  echo "SKIP: systemd-analyze is not installed; the units were not checked"
  exit 77
fi

bin=${1:-}
if [ -n "$bin" ] && [ -x "$bin" ]; then
  bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
  echo "ExecStart= checked against the built binary $bin"
else
  echo "NOTE: gpushared binary '${bin:-<none given>}' is not built; ExecStart= checked against /bin/true"
  bin=/bin/true
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/gs-systemd-XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM

# copy_units DIR: the units, with ExecStart's binary substituted.
copy_units() {
  mkdir -p "$1"
  sed "s|/usr/bin/gpushared|$bin|g" "$units/gpushared.service" >"$1/gpushared.service"
  cp "$units/gpushared.socket" "$1/gpushared.socket"
}

# verify DIR OUTFILE: run systemd-analyze verify on both units of DIR;
# prints its exit status; all its output goes to OUTFILE.
verify() {
  (cd "$1" && systemd-analyze verify --man=no ./gpushared.service ./gpushared.socket) \
    >"$2" 2>&1
  echo $?
}

# 1. The canary: an unknown key must be reported.
copy_units "$tmp/canary"
printf '[Service]\nGpushareNoSuchKey=1\n' >>"$tmp/canary/gpushared.service"
verify "$tmp/canary" "$tmp/canary.out" >/dev/null
if grep -q "GpushareNoSuchKey" "$tmp/canary.out"; then
  echo "ok: systemd-analyze verify reports an unknown key (checked on a copy)"
else
  echo "FAIL: systemd-analyze verify did not report an unknown key; its silence proves nothing:"
  sed 's/^/  | /' "$tmp/canary.out"
  fail=1
fi

# 2. The real units: exit 0 and no output at all.
copy_units "$tmp/units"
rc=$(verify "$tmp/units" "$tmp/units.out")
if [ "$rc" -eq 0 ] && [ ! -s "$tmp/units.out" ]; then
  echo "ok: systemd-analyze verify gpushared.service gpushared.socket: exit 0, no output"
else
  echo "FAIL: systemd-analyze verify gpushared.service gpushared.socket: exit $rc, output:"
  sed 's/^/  | /' "$tmp/units.out"
  fail=1
fi

# 3. sysusers.d: creates gpushare, gpushare-admin and the gpushare user.
if command -v systemd-sysusers >/dev/null 2>&1; then
  mkdir -p "$tmp/root/etc"
  systemd-sysusers --root="$tmp/root" "$units/sysusers.d/gpushare.conf" >"$tmp/sysusers.out" 2>&1
  rc=$?
  noise=$(grep -v "^Creating " "$tmp/sysusers.out")
  if [ "$rc" -eq 0 ] && [ -z "$noise" ] &&
     grep -q "^gpushare:" "$tmp/root/etc/group" &&
     grep -q "^gpushare-admin:" "$tmp/root/etc/group" &&
     grep -q "^gpushare:.*:/var/lib/gpushared:" "$tmp/root/etc/passwd"; then
    echo "ok: sysusers.d/gpushare.conf creates groups gpushare, gpushare-admin and user gpushare"
  else
    echo "FAIL: systemd-sysusers sysusers.d/gpushare.conf: exit $rc, output:"
    sed 's/^/  | /' "$tmp/sysusers.out"
    fail=1
  fi
else
  echo "NOTE: systemd-sysusers is not installed; sysusers.d/gpushare.conf not checked"
fi

# 4. tmpfiles.d: the state directory, private to the gpushare user.
if command -v systemd-tmpfiles >/dev/null 2>&1 && [ -f "$tmp/root/etc/passwd" ]; then
  systemd-tmpfiles --root="$tmp/root" --create "$units/tmpfiles.d/gpushare.conf" \
    >"$tmp/tmpfiles.out" 2>&1
  rc=$?
  uid=$(awk -F: '$1 == "gpushare" { print $3 }' "$tmp/root/etc/passwd")
  st=$(stat -c '%a %u' "$tmp/root/var/lib/gpushared" 2>/dev/null)
  if [ "$rc" -eq 0 ] && [ ! -s "$tmp/tmpfiles.out" ] && [ "$st" = "700 $uid" ]; then
    echo "ok: tmpfiles.d/gpushare.conf makes /var/lib/gpushared 0700, owned by gpushare"
  else
    echo "FAIL: systemd-tmpfiles tmpfiles.d/gpushare.conf: exit $rc, directory '$st' (want '700 $uid'), output:"
    sed 's/^/  | /' "$tmp/tmpfiles.out"
    fail=1
  fi
else
  echo "NOTE: systemd-tmpfiles (or the sysusers root) missing; tmpfiles.d/gpushare.conf not checked"
fi

# 5. The sandbox's exposure score.
# exposure DIR: the overall exposure level of DIR/gpushared.service ("" if none).
exposure() {
  (cd "$1" && systemd-analyze security --offline=yes --no-pager ./gpushared.service) \
    >"$1/security.out" 2>&1
  sed -n 's/.*Overall exposure level for gpushared.service: \([0-9.]*\).*/\1/p' "$1/security.out"
}
if systemd-analyze security --help 2>/dev/null | grep -q -- "--offline"; then
  score=$(exposure "$tmp/units")
  mkdir -p "$tmp/weak"
  grep -vE '^(User|Group|CapabilityBoundingSet|SystemCallFilter|PrivateNetwork|ProtectSystem|ProtectHome)=' \
    "$tmp/units/gpushared.service" >"$tmp/weak/gpushared.service"
  cp "$tmp/units/gpushared.socket" "$tmp/weak/"
  weak=$(exposure "$tmp/weak")
  if [ -z "$score" ] || [ -z "$weak" ]; then
    echo "FAIL: systemd-analyze security gave no overall exposure level:"
    tail -n 5 "$tmp/units/security.out" | sed 's/^/  | /'
    fail=1
  elif ! awk -v a="$weak" -v b="$score" 'BEGIN { exit !(a > b) }'; then
    echo "FAIL: a copy without User=, CapabilityBoundingSet=, SystemCallFilter=, ... scores $weak, not worse than $score: the analyzer did not read the unit"
    fail=1
  elif awk -v s="$score" 'BEGIN { exit !(s <= 3.0) }'; then
    echo "ok: systemd-analyze security gpushared.service: exposure $score (at most 3.0; $weak without the main sandbox settings)"
  else
    echo "FAIL: systemd-analyze security gpushared.service: exposure $score, above 3.0:"
    grep "✗" "$tmp/units/security.out" | sed 's/^/  | /'
    fail=1
  fi
else
  echo "NOTE: this systemd-analyze has no security --offline; the exposure score was not checked"
fi

if [ "$fail" -ne 0 ]; then
  echo "FAIL: the systemd units have problems (see above)"
  exit 1
fi
echo "PASS: systemd units verified"
exit 0
