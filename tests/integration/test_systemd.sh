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
# and say nothing but what it created.
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

if [ "$fail" -ne 0 ]; then
  echo "FAIL: the systemd units have problems (see above)"
  exit 1
fi
echo "PASS: systemd units verified"
exit 0
