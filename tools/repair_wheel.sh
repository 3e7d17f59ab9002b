#!/usr/bin/env bash
# Repairs a wheel built on Linux into a manylinux wheel, as `make wheel` and the release
# workflow (cibuildwheel's repair step) do:
#
#   tools/repair_wheel.sh WHEEL DEST_DIR
#
# auditwheel copies the shared libraries the compiled modules need beyond the manylinux
# policy (libjpeg-turbo, for fastload._jpeg) into fastload.libs/ under unique names, points
# the modules at them, tags the wheel with the oldest manylinux its symbols allow, and
# strips the debug information from every shared object. Then the result is checked:
# both compiled modules there, libjpeg inside, no C or Cython sources.
set -euo pipefail
wheel=$1
dest=$2
auditwheel repair --strip --wheel-dir "$dest" "$wheel"
repaired=$dest/$(basename "$wheel" | sed -E 's/-linux_([a-z0-9_]+)\.whl$/-*\1.whl/')
# shellcheck disable=SC2086 # the glob names the repaired wheel
repaired=$(ls -t $repaired | head -1)
contents=$(python -m zipfile -l "$repaired")
fail() { echo "repair_wheel.sh: $repaired: $1" >&2; exit 1; }
grep -q 'fastload/_core\.' <<<"$contents" || fail "no fastload._core"
grep -q 'fastload/_jpeg\.' <<<"$contents" || fail "no fastload._jpeg: built without libjpeg"
grep -q 'fastload\.libs/libjpeg' <<<"$contents" || fail "libjpeg-turbo is not vendored"
if grep -E '\.(c|pyx|pxi|pxd) ' <<<"$contents"; then fail "C or Cython sources inside"; fi
echo "repaired: $repaired"
