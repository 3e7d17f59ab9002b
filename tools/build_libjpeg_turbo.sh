#!/usr/bin/env bash
# Builds libjpeg-turbo from its release source into PREFIX, for the macOS wheels of the
# release workflow (cibuildwheel's before-all step; the Linux wheels take the build
# image's package instead):
#
#   tools/build_libjpeg_turbo.sh PREFIX
#
# Built for this machine's architecture and for $MACOSX_DEPLOYMENT_TARGET, so that
# delocate can vendor the library into wheels for that macOS version and later (a
# Homebrew library targets the runner's own macOS). Needs cmake, and nasm on x86_64 for
# the SIMD decoder; the source archive is checked against its SHA-256.
set -euo pipefail
prefix=$1
version=3.1.4.1
sha256=ecae8008e2cc9ade2f2c1bb9d5e6d4fb73e7c433866a056bd82980741571a022
url=https://github.com/libjpeg-turbo/libjpeg-turbo/releases/download/$version/libjpeg-turbo-$version.tar.gz

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
curl -fsSL -o "$work/src.tar.gz" "$url"
echo "$sha256  $work/src.tar.gz" | shasum -a 256 -c -
tar -xzf "$work/src.tar.gz" -C "$work"
if [ "$(uname -m)" = x86_64 ] && ! command -v nasm >/dev/null; then
    brew install nasm
fi
cmake -S "$work/libjpeg-turbo-$version" -B "$work/build" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_INSTALL_PREFIX="$prefix" -DCMAKE_INSTALL_LIBDIR=lib -DENABLE_STATIC=0 \
    -DCMAKE_INSTALL_NAME_DIR="$prefix/lib" -DWITH_TURBOJPEG=0 -DREQUIRE_SIMD=1 \
    -DCMAKE_OSX_DEPLOYMENT_TARGET="${MACOSX_DEPLOYMENT_TARGET:-11.0}"
cmake --build "$work/build" --parallel
cmake --install "$work/build"
