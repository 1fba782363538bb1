#!/usr/bin/env bash
# setup.sh [BUILD_DIR [CMAKE_ARGS...]]: everything a fresh Debian 12 machine
# needs to build gpushare: the missing Debian packages (installed as root),
# then configure and build. Safe to run again: it installs only what is
# missing and rebuilds only what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
shift || true

PKGS=(build-essential cmake pkg-config libuv1-dev libprotobuf-c-dev protobuf-c-compiler
      clang dataset-fashion-mnist dpkg-dev fortunes libclang-rt-14-dev libcriterion-dev
      libopenblas-dev
      libslurm-dev libsqlite3-dev lintian procps protobuf-compiler python3 python3-numpy
      python3-protobuf rsync sqlite3 systemd util-linux zlib1g-dev)
# Callers add packages of their own that gpushare can do without:
# scripts/test.sh adds python3-torch, the PyTorch that test_torch_parity
# checks the cpu backend's training against. One that cannot be installed
# is reported and skipped (the test that needs it skips, saying why).
read -r -a extra <<<"${GS_EXTRA_PKGS:-}"
not_installed() { # the given packages that dpkg does not have installed
  local p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || echo "$p"
  done
}
mapfile -t missing < <(not_installed "${PKGS[@]}")
mapfile -t optional < <(not_installed "${extra[@]}")
export DEBIAN_FRONTEND=noninteractive
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: these Debian packages are missing and installing them needs root: ${missing[*]}" >&2
    exit 1
  fi
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if [ ${#optional[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: not root, so not installing ${optional[*]}; the tests that need them skip" >&2
  else
    echo "setup: installing ${optional[*]}"
    { [ ${#missing[@]} -gt 0 ] || apt-get update -qq; } &&
      apt-get install -y -qq --no-install-recommends "${optional[@]}" >/dev/null ||
      echo "setup: could not install ${optional[*]}; the tests that need them skip" >&2
  fi
fi

cmake -S . -B "$BUILD" -DGS_WERROR=ON "$@" >/dev/null
cmake --build "$BUILD" -j"$(nproc)"
