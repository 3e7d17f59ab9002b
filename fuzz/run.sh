#!/usr/bin/env bash
# Builds the fuzz targets of fuzz/ and runs each for a bounded time:
#
#   fuzz/run.sh [SECONDS] [TARGET...]     (default: 30 s each, every target)
#
# The C targets are libFuzzer binaries (clang, with ASan and UBSan) linked with the C core;
# `packed` (damaged packed files) and `tarstream` (damaged tar files, plain and compressed,
# read by tar_samples) are the Python targets, coverage-guided through atheris when it is
# installed;
# `binding` calls every entry point of fastload._core with random arguments in child
# processes (tests/test_core_fuzz.py, SECONDS batches of calls: about a second each).
# Each target's corpus grows in build/fuzz/corpus/<target>, from the seeds that
# fuzz/seeds.py writes; a failing input is kept as build/fuzz/crashes/<target>-*, and the
# run fails naming the command that reproduces it.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-30}
[ $# -gt 0 ] && shift
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(qoi_decode jpeg_size jpeg_decode pipeline packed tarstream binding)
out=build/fuzz
py=$PWD/.venv/bin/python
mkdir -p "$out/crashes"

# JPEG decodes in C (csrc/jpeg.c) only with libjpeg's headers; without them its target
# has nothing to fuzz.
jpeg=()
if printf '#include <stdio.h>\n#include <jpeglib.h>\n' | clang -x c -E - >/dev/null 2>&1; then
    jpeg=(csrc/jpeg.c -ljpeg)
fi

build() {
    local target=$1 sources=(csrc/status.c csrc/pool.c csrc/engine.c csrc/imagesource.c csrc/image.c
                             csrc/augment.c csrc/qoi.c)
    local binary=$out/$target newest
    newest=$(ls -t "fuzz/$target.c" csrc/*.c csrc/*.h | head -1)
    [ -x "$binary" ] && [ "$binary" -nt "$newest" ] && return
    clang -g -O1 -std=c99 -D_GNU_SOURCE -Icsrc -fno-sanitize-recover=all \
        -fsanitize=fuzzer,address,undefined,float-cast-overflow \
        "fuzz/$target.c" "${sources[@]}" "${jpeg[@]}" -lm -pthread -o "$binary"
}

# Written again when a target has none yet (a target added since they were).
for target in "${targets[@]}"; do
    if [ "$target" != binding ] && [ ! -d "$out/seeds/$target" ]; then
        "$py" fuzz/seeds.py "$out/seeds"
        break
    fi
done

failed=()
for target in "${targets[@]}"; do
    if [ "$target" = jpeg_decode ] && [ ${#jpeg[@]} -eq 0 ]; then
        echo "$target: skipped (built without libjpeg)"
        continue
    fi
    if [ "$target" = binding ]; then
        log=$out/$target.log
        if FASTLOAD_FUZZ_EXAMPLES=$seconds FASTLOAD_HANG_GUARD_S=$((seconds * 10 + 60)) \
            "$py" -m pytest -q -m fuzz tests/test_core_fuzz.py >"$log" 2>&1; then
            echo "$target: $seconds batches of calls, none fatal"
        else
            failed+=("$target")
            grep -E 'interpreter|Error' "$log" | head -20
            echo "$target: FAILED (log: $log)"
        fi
        continue
    fi
    corpus=$out/corpus/$target
    mkdir -p "$corpus"
    options=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=0
             -artifact_prefix="$out/crashes/$target-" "$corpus" "$out/seeds/$target")
    if [ "$target" = packed ] || [ "$target" = tarstream ]; then
        command=("$py" "fuzz/$target.py")
    else
        build "$target"
        command=("$out/$target")
    fi
    log=$out/$target.log
    if "${command[@]}" "${options[@]}" >"$log" 2>&1; then
        echo "$target: $(grep -E '^Done' "$log" | tail -1)," \
             "corpus of $(ls "$corpus" | wc -l)"
    else
        failed+=("$target")
        grep -E 'ERROR|runtime error|Traceback|Error:|Test unit written|crash-' "$log" | head -20
        echo "$target: FAILED (log: $log; rerun an input with: ${command[*]} <input>)"
    fi
done
[ ${#failed[@]} -eq 0 ] || { echo "fuzz targets that failed: ${failed[*]}"; exit 1; }
