#!/usr/bin/env bash
# test_package.sh: the gpushare Debian package, built and opened.
#
# Usage: test_package.sh GPUSHARED GPUCTL   (exit 0 pass, 1 fail, 77 skip)
#
# Builds the package with `cpack -G DEB` from the build directory
# ($GS_BUILD_DIR, set by ctest; else the one two levels above GPUSHARED),
# writing it and CPack's staging tree to a temporary directory so the build
# directory is left as it was. Then, without installing anything on this
# machine:
#   - dpkg-deb -x into a scratch root: every program, unit, sysusers.d and
#     tmpfiles.d entry, doc and example is there, root-owned, with the mode
#     it should have, and nothing is group- or world-writable;
#   - the unpacked gpushared and gpuctl run and report the package version;
#   - the control file: name, version, architecture, Depends: from
#     dpkg-shlibdeps naming the libraries the programs link;
#   - the maintainer scripts: valid sh, the group creation as documented,
#     and postinst run for real against the scratch root (DPKG_ROOT), where
#     it must create groups gpushare and gpushare-admin, user gpushare and a
#     private /var/lib/gpushared, enable gpushared.socket there, and touch
#     nothing outside that root; postrm purge there undoes the enablement;
#   - the packaged gpushare.proto, man pages and bash completion, and the
#     unpacked gpuctl encoding the shipped example with that proto.
set -u
. "$(dirname "$0")/lib.sh"

for tool in cpack dpkg-deb; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "SKIP: $tool is not installed; the Debian package was not built"
    exit 77
  fi
done
BUILD=${GS_BUILD_DIR:-$(cd "$(dirname "$GPUSHARED")/.." && pwd)}
if [ ! -f "$BUILD/CPackConfig.cmake" ]; then
  echo "SKIP: $BUILD has no CPackConfig.cmake (configured before cmake/Packaging.cmake existed?)"
  exit 77
fi

# --- build ----------------------------------------------------------------
OUTD=$T/pkg
if (cd "$BUILD" && cpack -G DEB -B "$OUTD") >"$T/cpack.log" 2>&1; then
  pass "cpack -G DEB"
else
  fail "cpack -G DEB failed:"; sed 's/^/  | /' "$T/cpack.log"; finish; exit 1
fi
debs=("$OUTD"/gpushare_*.deb)
if [ "${#debs[@]}" -eq 1 ] && [ -f "${debs[0]}" ]; then
  DEB=${debs[0]}; pass "one package: $(basename "$DEB")"
else
  fail "expected one gpushare_*.deb in $OUTD: $(ls "$OUTD")"; finish; exit 1
fi

# --- contents -------------------------------------------------------------
ROOT=$T/root
CTRL=$T/control
dpkg-deb -x "$DEB" "$ROOT" && dpkg-deb -e "$DEB" "$CTRL" \
  && pass "dpkg-deb -x / -e" || { fail "cannot unpack $DEB"; finish; exit 1; }

# want MODE PATH...: each path exists as a regular file with that mode.
want() { local mode=$1; shift
  for p in "$@"; do
    if [ ! -f "$ROOT$p" ]; then fail "missing $p"
    else
      local m; m=$(stat -c %a "$ROOT$p")
      [ "$m" = "$mode" ] && pass "$p ($m)" || fail "$p has mode $m, want $mode"
    fi
  done; }
want 755 /usr/bin/gpushared /usr/bin/gpuctl /usr/bin/gpushare-executor /usr/bin/gpushare-run
want 644 /usr/lib/systemd/system/gpushared.service /usr/lib/systemd/system/gpushared.socket \
  /usr/lib/sysusers.d/gpushare.conf /usr/lib/tmpfiles.d/gpushare.conf \
  /usr/share/doc/gpushare/README.md /usr/share/doc/gpushare/operations.md \
  /usr/share/doc/gpushare/security.md /usr/share/doc/gpushare/examples/README.md \
  /usr/share/doc/gpushare/examples/synthetic-small.txtpb
want 644 /usr/share/gpushare/gpushare.proto /usr/share/bash-completion/completions/gpuctl \
  /usr/share/man/man1/gpuctl.1.gz /usr/share/man/man1/gpushare-run.1.gz \
  /usr/share/man/man5/gpushared.conf.5.gz /usr/share/man/man8/gpushared.8.gz \
  /usr/share/man/man8/gpushare-executor.8.gz
if [ -f "$BUILD/examples/synthetic-small.pb" ]; then
  want 644 /usr/share/doc/gpushare/examples/synthetic-small.pb
fi
if [ -f "$BUILD/kernels/cuda/libgskernels_cuda.so" ]; then
  # A plugin, not a library to link: in gpushare's own directory, where
  # loader.c looks beside the installed programs (../lib/gpushare).
  want 644 /usr/lib/gpushare/libgskernels_cuda.so
else
  echo "note - the CUDA plugin is not built here; not expected in the package"
fi
if [ -f "$BUILD/lib/gpushare_spank.so" ]; then
  want 644 /usr/lib/gpushare/gpushare_spank.so   # plugstack.conf names this path
else
  echo "note - the Slurm plugin is not built here (no slurm/spank.h); not expected in the package"
fi
# The shipped units are the source tree's, word for word, and name the
# binary where the package puts it.
SRC=${GS_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
for u in gpushared.service gpushared.socket; do
  cmp -s "$SRC/systemd/$u" "$ROOT/usr/lib/systemd/system/$u" && pass "$u is systemd/$u" \
    || fail "$u differs from systemd/$u"
done
grep -q '^ExecStart=/usr/bin/gpushared ' "$ROOT/usr/lib/systemd/system/gpushared.service" \
  && pass "ExecStart= names /usr/bin/gpushared" || fail "ExecStart= does not name /usr/bin/gpushared"
listing=$(dpkg-deb -c "$DEB")
bad_owner=$(echo "$listing" | awk '$2 != "root/root"')
[ -z "$bad_owner" ] && pass "every entry is root/root" || fail "not root-owned: $bad_owner"
writable=$(cd "$ROOT" && find . -perm /022 ! -type l)
[ -z "$writable" ] && pass "nothing group- or world-writable" || fail "writable by others: $writable"
setid=$(cd "$ROOT" && find . -perm /6000)
[ -z "$setid" ] && pass "no setuid/setgid files" || fail "set-id files: $setid"
(cd "$ROOT" && md5sum --quiet -c "$CTRL/md5sums") >"$T/md5.out" 2>&1 \
  && pass "md5sums match the files" || { fail "md5sums:"; cat "$T/md5.out"; }
empty=$(cd "$ROOT" && find . -type d -empty)
[ -z "$empty" ] || echo "note - empty directories in the package: $empty"

# --- the programs run from the unpacked tree ------------------------------
VERSION=$(sed -n 's/^Version: //p' "$CTRL/control")
out=$("$ROOT/usr/bin/gpushared" --version 2>&1)
[ "$out" = "gpushared $VERSION" ] && pass "gpushared --version: $out" \
  || fail "gpushared --version said \"$out\", want \"gpushared $VERSION\""
rc=0; out=$("$ROOT/usr/bin/gpuctl" --version 2>&1) || rc=$?
if [ "$rc" -eq 2 ] && [[ "$out" == *"unknown option --version"* ]]; then
  echo "note - gpuctl has no --version option (client/main.c); checking --help instead"
  expect_ok "gpuctl --help" "$ROOT/usr/bin/gpuctl" --help
elif [ "$rc" -eq 0 ] && [[ "$out" == *"$VERSION"* ]]; then
  pass "gpuctl --version: $out"
else
  fail "gpuctl --version: exit $rc: $out"
fi
if command -v protoc >/dev/null; then
  # BIN/../share/gpushare/gpushare.proto: the packaged one, as installed
  expect_ok "the unpacked gpuctl job encode finds the packaged gpushare.proto" env -u GPUSHARE_PROTO \
    "$ROOT/usr/bin/gpuctl" job encode "$ROOT/usr/share/doc/gpushare/examples/synthetic-small.txtpb" -o "$T/enc.pb"
  cmp -s "$T/enc.pb" "$ROOT/usr/share/doc/gpushare/examples/synthetic-small.pb" \
    && pass "it encodes the example as the build did" || fail "job encode of the example differs from the packaged .pb"
fi
expect_ok "gpushare-executor --help" "$ROOT/usr/bin/gpushare-executor" --help
expect_ok "gpushare-run --help" "$ROOT/usr/bin/gpushare-run" --help

# --- the unpacked daemon runs a job ----------------------------------------
# gpushared, its executor (found beside it) and gpuctl from the package's
# tree, as lib.sh starts a daemon: the shipped example, encoded above by the
# unpacked gpuctl, runs to the end.
if [ "$(id -u)" -ne 0 ]; then
  echo "skip - a job on the unpacked daemon: creating a tenant and a vdev needs root (admin)"
elif [ -f "$T/enc.pb" ]; then
  GPUSHARED=$ROOT/usr/bin/gpushared GPUCTL=$ROOT/usr/bin/gpuctl
  start_daemon
  expect_ok "tenant pkg" ctl tenant create pkg --uid "$(id -u)"
  expect_ok "vdev pkg0" ctl vdev create pkg0 --memory 256MiB --compute 50 --tenant pkg
  expect_ok "the example job runs to the end on the unpacked daemon" ctl submit "$T/enc.pb" --vdev pkg0 --watch
  stop_daemon
fi

# --- control --------------------------------------------------------------
field() { sed -n "s/^$1: //p" "$CTRL/control"; }
[ "$(field Package)" = gpushare ] && pass "Package: gpushare" || fail "Package: $(field Package)"
arch=$(dpkg --print-architecture 2>/dev/null || echo amd64)
[ "$(field Architecture)" = "$arch" ] && pass "Architecture: $arch" || fail "Architecture: $(field Architecture)"
[[ "$(basename "$DEB")" == "gpushare_${VERSION}_${arch}.deb" ]] && pass "file name gpushare_${VERSION}_${arch}.deb" \
  || fail "file name $(basename "$DEB")"
DEPENDS=$(field Depends)
echo "Depends: $DEPENDS"
for lib in libc6 libuv1 libsqlite3-0 libprotobuf-c1 zlib1g libopenblas; do
  [[ "$DEPENDS" == *"$lib"* ]] && pass "Depends names $lib" || fail "Depends lacks $lib"
done
[[ "$(field Recommends)" == *protobuf-compiler* ]] && pass "Recommends: protobuf-compiler" \
  || fail "Recommends: $(field Recommends)"
[[ "$(field Recommends)" == *python3-protobuf* ]] && pass "Recommends: python3-protobuf" \
  || fail "Recommends: $(field Recommends)"
[[ "$DEPENDS" == *"python3:any"* ]] && pass "Depends: python3:any (the Python client)" \
  || fail "Depends lacks python3:any: $DEPENDS"
if [ -f "$BUILD/kernels/cuda/libgskernels_cuda.so" ]; then
  for lib in libcudart libcublaslt; do
    [[ "$(field Suggests)" == *"$lib"* ]] && pass "Suggests names $lib" || fail "Suggests: $(field Suggests)"
  done
fi
[[ "$DEPENDS" == *"libc6 (>= "* ]] && pass "versioned libc6 (dpkg-shlibdeps ran)" || fail "no versioned libc6: $DEPENDS"
[[ "$DEPENDS" == *"adduser"* ]] && pass "Depends: adduser (postinst's fallback)" \
  || fail "Depends lacks adduser"

# --- lintian: no errors -----------------------------------------------------
if command -v lintian >/dev/null; then
  lintian --no-tag-display-limit "$DEB" >"$T/lintian.out" 2>&1
  errors=$(grep '^E: ' "$T/lintian.out")
  [ -z "$errors" ] && pass "lintian: no errors" || fail "lintian errors:
$errors"
  grep '^W: ' "$T/lintian.out" | sed 's/^/note - lintian /'
else
  echo "skip - lintian is not installed; the package was not checked with it"
fi
ddeb=("$OUTD"/gpushare-dbgsym_*.ddeb)
[ -f "${ddeb[0]}" ] && dpkg-deb -c "${ddeb[0]}" | grep '/usr/lib/debug/.build-id/' >/dev/null \
  && pass "the symbols are in $(basename "${ddeb[0]}")" || fail "no gpushare-dbgsym .ddeb with build-id files"

# --- maintainer scripts ---------------------------------------------------
for s in postinst prerm postrm; do
  if [ ! -f "$CTRL/$s" ]; then fail "no $s"; continue; fi
  [ "$(stat -c %a "$CTRL/$s")" = 755 ] && pass "$s is 0755" || fail "$s mode $(stat -c %a "$CTRL/$s")"
  sh -n "$CTRL/$s" && pass "$s is valid sh" || fail "$s: syntax error"
done
P=$CTRL/postinst
grep -q 'systemd-sysusers .*gpushare.conf' "$P" && pass "postinst runs systemd-sysusers gpushare.conf" \
  || fail "postinst does not run systemd-sysusers"
for g in gpushare gpushare-admin; do
  grep -q "getent group $g >/dev/null || addgroup --system $g\$" "$P" \
    && pass "postinst falls back to addgroup --system $g" || fail "no addgroup fallback for $g"
done
grep -q 'adduser --system --ingroup gpushare --home /var/lib/gpushared' "$P" \
  && pass "postinst falls back to adduser --system gpushare" || fail "no adduser fallback"

if command -v systemd-sysusers >/dev/null && command -v systemd-tmpfiles >/dev/null; then
  mkdir -p "$ROOT/etc"
  host_group=$(md5sum /etc/group /etc/passwd)
  if DPKG_ROOT=$ROOT DPKG_MAINTSCRIPT_PACKAGE=gpushare DPKG_MAINTSCRIPT_NAME=postinst sh "$P" configure "" >"$T/postinst.out" 2>&1; then
    pass "postinst configure under DPKG_ROOT"
  else
    fail "postinst configure under DPKG_ROOT failed:"; sed 's/^/  | /' "$T/postinst.out"
  fi
  for g in gpushare gpushare-admin; do
    grep -q "^$g:" "$ROOT/etc/group" && pass "group $g created" || fail "group $g missing"
  done
  uid=$(awk -F: '$1 == "gpushare" { print $3 }' "$ROOT/etc/passwd")
  gid=$(awk -F: '$1 == "gpushare" { print $3 }' "$ROOT/etc/group")
  [ -n "$uid" ] && pass "user gpushare created (uid $uid)" || fail "user gpushare missing"
  [ -n "$uid" ] && [ "$uid" -lt 1000 ] && [ "$uid" -gt 0 ] && pass "gpushare is a system uid" \
    || fail "gpushare uid '$uid' is not a system uid"
  st=$(stat -c '%a %u %g' "$ROOT/var/lib/gpushared" 2>/dev/null)
  [ "$st" = "700 $uid $gid" ] && pass "/var/lib/gpushared: mode 0700, owned by gpushare" \
    || fail "/var/lib/gpushared is '$st', want '700 $uid $gid'"
  [ "$(md5sum /etc/group /etc/passwd)" = "$host_group" ] && pass "the host's users and groups untouched" \
    || fail "postinst under DPKG_ROOT changed this machine's /etc/group or /etc/passwd"
  link=$ROOT/etc/systemd/system/sockets.target.wants/gpushared.socket
  if command -v deb-systemd-helper >/dev/null; then
    [ -L "$link" ] && pass "gpushared.socket enabled in the root: $(readlink "$link")" \
      || fail "postinst did not enable gpushared.socket (no $link)"
  fi
  DPKG_ROOT=$ROOT DPKG_MAINTSCRIPT_PACKAGE=gpushare DPKG_MAINTSCRIPT_NAME=postinst sh "$P" configure "" >"$T/postinst2.out" 2>&1 \
    && [ "$(grep -c '^gpushare' "$ROOT/etc/group")" = 2 ] \
    && pass "postinst again (upgrade): no duplicate groups" || fail "second postinst: $(cat "$T/postinst2.out")"
  if command -v deb-systemd-helper >/dev/null; then
    DPKG_ROOT=$ROOT DPKG_MAINTSCRIPT_PACKAGE=gpushare DPKG_MAINTSCRIPT_NAME=postrm sh "$CTRL/postrm" purge >"$T/postrm.out" 2>&1 && pass "postrm purge under DPKG_ROOT" \
      || fail "postrm purge: $(cat "$T/postrm.out")"
    [ ! -e "$link" ] && [ ! -L "$link" ] && pass "purge removed the socket's enablement" \
      || fail "$link is still there after purge"
  fi
else
  echo "note - systemd-sysusers/systemd-tmpfiles missing; postinst not run"
fi
finish
