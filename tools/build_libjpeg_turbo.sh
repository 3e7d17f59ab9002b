#!/usr/bin/env bash
# Builds libjpeg-turbo from its release source into PREFIX, for the release wheels
# (cibuildwheel's before-all step, on Linux in the manylinux image, on macOS on the
# runner), so that every wheel carries the same, current libjpeg-turbo:
#
#   tools/build_libjpeg_turbo.sh PREFIX
#
# Built for this machine's architecture, with SIMD required (nasm on x86_64, installed
# here when missing), and on macOS for $MACOSX_DEPLOYMENT_TARGET, so that delocate can
# vendor it into wheels for that macOS and later (a Homebrew library targets the
# runner's own macOS). The source archive is checked against its SHA-256.
set -euo pipefail
prefix=$1
version=3.1.4.1
sha256=ecae8008e2cc9ade2f2c1bb9d5e6d4fb73e7c433866a056bd82980741571a022
url=https://github.com/libjpeg-turbo/libjpeg-turbo/releases/download/$version/libjpeg-turbo-$version.tar.gz

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
curl -fsSL -o "$work/src.tar.gz" "$url"
if command -v sha256sum >/dev/null; then
    echo "$sha256  $work/src.tar.gz" | sha256sum -c -
else
    echo "$sha256  $work/src.tar.gz" | shasum -a 256 -c -
fi
tar -xzf "$work/src.tar.gz" -C "$work"

if [ "$(uname -m)" = x86_64 ] && ! command -v nasm >/dev/null; then
    if command -v dnf >/dev/null; then dnf install -y nasm; else brew install nasm; fi
fi
options=()
if [ "$(uname)" = Darwin ]; then
    options+=(-DCMAKE_OSX_DEPLOYMENT_TARGET="${MACOSX_DEPLOYMENT_TARGET:?}"
              -DCMAKE_INSTALL_NAME_DIR="$prefix/lib")
fi
cmake -S "$work/libjpeg-turbo-$version" -B "$work/build" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_INSTALL_PREFIX="$prefix" -DCMAKE_INSTALL_LIBDIR=lib -DENABLE_STATIC=0 \
    -DWITH_TURBOJPEG=0 -DREQUIRE_SIMD=1 "${options[@]}"
cmake --build "$work/build" --parallel
cmake --install "$work/build"
