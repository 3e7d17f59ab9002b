#!/usr/bin/env bash
# Builds the native core with sanitizers and runs pytest on that build:
#
#   tools/sanitize.sh address [pytest arguments]   AddressSanitizer + UndefinedBehaviorSanitizer
#   tools/sanitize.sh thread  [pytest arguments]   ThreadSanitizer
#
# The build lives in a copy of the tree, build/sanitize-<kind>, so that the in-place .so
# files of the normal build are never replaced. The copy keeps its build outputs between
# runs and its sources keep their times, so a rerun recompiles only what changed.
# The interpreter is not instrumented: the runtime is preloaded, and only the C core and
# its Cython bindings are checked.
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:-}
[ $# -gt 0 ] && shift
root=$PWD
py=$root/.venv/bin/python
dir=$root/build/sanitize-$kind

case $kind in
address)
    flags="-fsanitize=address,undefined,float-cast-overflow -fno-sanitize-recover=all"
    runtime=libasan.so
    # The interpreter's own allocations at exit are not ours to report; every pymalloc
    # allocation goes through malloc, so that ASan sees overruns of Python objects too.
    export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:strict_string_checks=1
    export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
    export PYTHONMALLOC=malloc
    ;;
thread)
    flags="-fsanitize=thread"
    runtime=libtsan.so
    # Forked worker processes run on after the fork: their parent has threads. What is
    # suppressed, and why, is in tools/tsan.supp.
    export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:die_after_fork=0:suppressions=$root/tools/tsan.supp"
    ;;
*)
    echo "usage: $0 address|thread [pytest arguments]" >&2
    exit 2
    ;;
esac

# The sources as they are now (tracked and new files, not ignored ones) over the copy;
# what was deleted here goes there too, the build outputs stay.
mkdir -p "$dir"
find "$dir" -type f ! -path "$dir/build/*" ! -name '*.so' ! -path "$dir/fastload/_*.c" \
    ! -name .flags -delete
git ls-files -z --cached --others --exclude-standard |
    while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
    tar --null -T - -cf - | tar -xf - -C "$dir"
# The C that Cython generated for the in-place build, with its times: it does not depend on
# the compiler's flags, and Cython leaves a module alone whose C is newer than its sources.
for f in fastload/_*.c; do [ -e "$f" ] && cp -p "$f" "$dir/$f"; done

# setuptools rebuilds when a source is newer than its module, not when flags change.
force=
[ "$(cat "$dir/.flags" 2>/dev/null)" = "$flags" ] || force=--force
echo "building the $kind-sanitized core in ${dir#"$root"/}"
(cd "$dir" && CC=gcc CFLAGS="$flags -fno-omit-frame-pointer -g" LDFLAGS="$flags" \
    FASTLOAD_OPT=-O1 "$py" setup.py --quiet build_ext --inplace --parallel 2 $force)
echo "$flags" > "$dir/.flags"

cd "$dir"
# libstdc++ too: the runtime finds the C++ functions it intercepts (exceptions thrown in
# jaxlib, torch) only in libraries loaded when it starts.
export LD_PRELOAD
LD_PRELOAD="$(gcc -print-file-name="$runtime") $(gcc -print-file-name=libstdc++.so)"
export PYTHONPATH=$dir
export FASTLOAD_HANG_GUARD_S=${FASTLOAD_HANG_GUARD_S:-300}
"$py" -c "import fastload._core as c; assert c.__file__.startswith('$dir'), c.__file__"
exec "$py" -m pytest -q -p no:cacheprovider "$@"
