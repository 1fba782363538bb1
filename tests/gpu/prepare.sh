#!/usr/bin/env bash
# tests/gpu/prepare.sh [BUNDLE_DIR]: run on the Debian 12 build machine (not
# the GPU machine) to fill the bundle the GPU machine's check needs and
# cannot make itself (it has CUDA, CMake, a C compiler and PyTorch, but no
# Debian packages and no network):
#  - .deb files: OpenBLAS (pthread build) and its runtime libraries, for
#    the cpu reference backend that every GPU test compares against; zlib's
#    headers, which the training runtime is built with; and the libraries
#    the daemon's programs load (libuv, protobuf-c, SQLite: what `ldd` of
#    gpushared, gpushare-executor and gpuctl shows outside glibc);
#  - product/bin: gpushared, gpushare-executor and gpuctl built here
#    (Release, without the CUDA plugin: the executor loads the one
#    check.sh builds there, through $GS_CUDA_PLUGIN; they need glibc 2.34);
#  - product/fashion-mnist: the four IDX files of Debian's
#    dataset-fashion-mnist, for the examples; product/text/cookie, Debian's
#    fortunes text the GPT example trains on.
# It lands in BUNDLE_DIR (default build-gpu-bundle/ at the repository root,
# ignored by git through /build*/; about 50 MiB), which is carried to the
# GPU machine with the device tool's `carry`; tests/gpu/check.sh unpacks
# the .debs there into a private prefix and runs tests/gpu/product.sh with
# product/. Nothing is installed here.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-build-gpu-bundle}
mkdir -p "$out"
cd "$out"
rm -f ./*.deb
pkgs=(libopenblas0-pthread libopenblas-pthread-dev libopenblas-dev libgfortran5 libquadmath0
      zlib1g zlib1g-dev libuv1 libprotobuf-c1 libsqlite3-0)
if ! apt-get download "${pkgs[@]}"; then
  echo "prepare.sh: apt-get download failed; run 'apt-get update' first (as root)" >&2
  exit 1
fi
ls -l ./*.deb
cd - >/dev/null

# The daemon's programs, built here.
build=build-gpu-product
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DGS_CUDA=OFF -DGS_TESTS=OFF >/dev/null
cmake --build "$build" -j"$(nproc)" --target gpushared gpushare-executor gpuctl >/dev/null
rm -rf "$out/product" && mkdir -p "$out/product/bin" "$out/product/fashion-mnist" "$out/product/text"
for p in gpushared gpushare-executor gpuctl; do
  cp "$build/bin/$p" "$out/product/bin/" && strip "$out/product/bin/$p"
done
libs=$(ldd "$build"/bin/gpushared "$build"/bin/gpushare-executor "$build"/bin/gpuctl |
       awk '/=>/ {print $1}' | sort -u | grep -Ev '^(libc|libm|libgcc_s|ld-linux.*)\.so' | tr '\n' ' ')
echo "prepare.sh: the programs load, beyond glibc: $libs"
data=${GS_FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
if ! cp "$data"/{train,t10k}-{images-idx3,labels-idx1}-ubyte.gz "$out/product/fashion-mnist/"; then
  echo "prepare.sh: Fashion-MNIST not found in $data (apt-get install dataset-fashion-mnist)" >&2
  exit 1
fi
text=${GS_GPT_TEXT:-/usr/share/games/fortunes/cookie}
if ! cp "$text" "$out/product/text/cookie"; then
  echo "prepare.sh: the GPT example's text $text is missing (apt-get install fortunes)" >&2
  exit 1
fi
chmod -R a+rX "$out/product"
cd "$out"
echo "prepare.sh: bundle ready in $(pwd) ($(du -sh . | cut -f1)); carry '$out' to the GPU machine"
