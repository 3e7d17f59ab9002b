#!/usr/bin/env bash
# Installs built wheels and sdists into fresh virtual environments, as a user would, and
# runs the smoke test (tools/smoke.py) on each (`make wheel-check`, the release workflow):
#
#   tools/wheel_check.sh PYTHON DIST...       (DIST: a .whl or a .tar.gz)
#
# - The wheel, with the system's libjpeg hidden: as root, in a mount namespace of its own
#   (unshare -m) where /dev/null is bind-mounted over every libjpeg the dynamic loader
#   knows, so that the wheel must decode with the libjpeg-turbo it carries. Not root (or
#   without unshare), it says so and runs the smoke test as is.
# - The sdist, with libjpeg's headers hidden the same way: it builds and installs, without
#   fastload._jpeg, and decodes JPEG through simplejpeg. Not root, FASTLOAD_LIBJPEG=0 stands in for the
#   missing headers.
# PYTHON makes the environments: the interpreter the wheels were built for.
set -euo pipefail
python=$1
shift
dists=()
for dist in "$@"; do dists+=("$(realpath "$dist")"); done
cd "$(dirname "$0")/.."
root=$PWD
out=$root/build/wheel-check
rm -rf "$out"
mkdir -p "$out"

can_hide=
if [ "$(id -u)" = 0 ] && command -v unshare >/dev/null && unshare -m true 2>/dev/null; then
    can_hide=1
fi

# Runs "$@" with each file of $hide replaced by an empty one, in a mount namespace that
# ends with the command.
hiding() {
    # shellcheck disable=SC2016 # expanded by the inner shell
    unshare -m sh -c 'for f in $0; do mount --bind /dev/null "$f" || exit 1; done; exec "$@"' \
        "$hide" "$@"
}

smoke() {
    local venv=$1
    shift
    (cd "$out" && "$venv/bin/python" -I "$root/tools/smoke.py" "$@")
}

check_wheel() {
    local wheel=$1 venv=$out/venv-$(basename "$1" .whl)
    echo "== the wheel: $(basename "$wheel")"
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$wheel"
    if [ -n "$can_hide" ]; then
        hide=$(ldconfig -p | awk '/libjpeg\.so/ {print $NF}' | xargs -r realpath | sort -u | xargs)
        if [ -n "$hide" ]; then
            echo "hiding the system's libjpeg: $hide"
            (cd "$out" && hiding "$venv/bin/python" -I "$root/tools/smoke.py" \
                --decoder libjpeg-turbo --libjpeg-hidden)
        else
            echo "no system libjpeg to hide: the smoke test runs as is"
            smoke "$venv" --decoder libjpeg-turbo
        fi
    else
        echo "not root (or no unshare): the system's libjpeg cannot be hidden;" \
            "the smoke test runs as is"
        smoke "$venv" --decoder libjpeg-turbo
    fi
}

check_sdist() {
    local sdist=$1 venv=$out/venv-$(basename "$1" .tar.gz) header install
    echo "== the sdist: $(basename "$sdist")"
    "$python" -m venv "$venv"
    install=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$sdist")
    header=$(printf '#include <stdio.h>\n#include <jpeglib.h>\n' | ${CC:-cc} -x c -E - 2>/dev/null |
             sed -nE 's/^# [0-9]+ "([^"]*\/jpeglib\.h)".*/\1/p' | head -1 || true)
    if [ -n "$can_hide" ] && [ -n "$header" ]; then
        hide=$(realpath "$header")
        echo "hiding libjpeg's headers: $hide"
        hiding "${install[@]}"
    elif [ -n "$header" ]; then
        echo "not root: libjpeg's headers cannot be hidden; FASTLOAD_LIBJPEG=0 builds without them"
        FASTLOAD_LIBJPEG=0 "${install[@]}"
    else
        "${install[@]}"
    fi
    smoke "$venv" --decoder "simplejpeg (built without libjpeg's headers)"
}

for dist in "${dists[@]}"; do
    case $dist in
    *.whl) check_wheel "$dist" ;;
    *.tar.gz) check_sdist "$dist" ;;
    *) echo "wheel_check.sh: $dist is neither a wheel nor an sdist" >&2 && exit 2 ;;
    esac
done
echo "wheel-check passed: ${#dists[@]} distributions"
