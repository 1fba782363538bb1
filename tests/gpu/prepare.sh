#!/usr/bin/env bash
# tests/gpu/prepare.sh [BUNDLE_DIR]: run on the Debian 12 build machine (not
# the GPU machine) to fetch the Debian packages the GPU machine's build
# cannot install itself (it reaches no network): OpenBLAS (pthread build)
# and its runtime libraries, for the cpu reference backend that every GPU
# test compares against, and zlib's headers, which the training runtime
# (libgsruntime) is built with. They land as .deb files in BUNDLE_DIR (default
# build-gpu-bundle/ at the repository root, ignored by git through
# /build*/), which is carried to the GPU machine with the device tool's
# `carry`; tests/gpu/check.sh unpacks them there into a private prefix.
# Nothing is installed here. The runtime needs no protobuf-c: only the
# control plane, which the GPU build leaves out (GS_CONTROL=OFF), does.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-build-gpu-bundle}
mkdir -p "$out"
cd "$out"
rm -f ./*.deb
pkgs=(libopenblas0-pthread libopenblas-pthread-dev libopenblas-dev libgfortran5 libquadmath0
      zlib1g zlib1g-dev)
if ! apt-get download "${pkgs[@]}"; then
  echo "prepare.sh: apt-get download failed; run 'apt-get update' first (as root)" >&2
  exit 1
fi
ls -l ./*.deb
echo "prepare.sh: bundle ready in $(pwd) ($(du -sh . | cut -f1)); carry '$out' to the GPU machine"
