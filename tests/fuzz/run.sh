#!/usr/bin/env bash
# Bounded fuzzing of every libFuzzer target in tests/fuzz.
#
# A target is a file tests/fuzz/fuzz_<name>.c defining LLVMFuzzerTestOneInput.
# It names the project sources it needs in one comment line (globs allowed,
# relative to the repository root), and optionally extra link flags:
#   // FUZZ_SOURCES: src/engine/safetensors.c src/core/*.c
#   // FUZZ_LIBS: -ldnnl
# Seeds live in tests/fuzz/corpus/<name>/ (read only; inputs libFuzzer finds
# go to build-fuzz/corpus/<name>/), an optional dictionary in
# tests/fuzz/<name>.dict. Crashes are written to build-fuzz/<name>-crash-*.
#
#   tests/fuzz/run.sh                      every target, FUZZ_SECONDS each
#   tests/fuzz/run.sh tests/fuzz/fuzz_config.c   selected targets
#   FUZZ_SECONDS=300 tests/fuzz/run.sh     longer runs
#   FUZZ_BUILD_ONLY=1 tests/fuzz/run.sh    compile, run each seed once only
#
# Exits non-zero if any target fails to build, crashes, leaks or times out.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2

CC=${FUZZ_CC:-clang-14}
SECS=${FUZZ_SECONDS:-20}
OUT=${FUZZ_OUT:-build-fuzz}
PKGS="jansson libpcre2-8 libutf8proc"
PKG_CFLAGS=$(pkg-config --cflags $PKGS)
PKG_LIBS=$(pkg-config --libs $PKGS)
CFLAGS="-std=c17 -D_GNU_SOURCE -g -O1 -Wall -Wextra -Wno-unused-parameter -fno-strict-aliasing
        -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
        -pthread -Isrc"

if ! command -v "$CC" >/dev/null; then
    echo "fuzz: $CC not found (set FUZZ_CC)" >&2
    exit 2
fi
mkdir -p "$OUT"

if [ $# -gt 0 ]; then targets=("$@"); else targets=(tests/fuzz/fuzz_*.c); fi
# One target: build, then fuzz; its output goes to $OUT/<name>.out and a
# failure leaves $OUT/<name>.failed. Targets run FUZZ_JOBS at a time, one
# by default: `make -j2 test` already runs the fuzzers beside other parts.
fuzz_one() {
    local src=$1 bin name line libs sources work seeds opts what
    bin=$(basename "$src" .c)
    name=${bin#fuzz_}
    line=$(grep -m1 '^// FUZZ_SOURCES:' "$src" | sed 's|^// FUZZ_SOURCES:||')
    libs=$(grep -m1 '^// FUZZ_LIBS:' "$src" | sed 's|^// FUZZ_LIBS:||')
    if [ -z "$line" ]; then
        echo "fuzz: $src has no '// FUZZ_SOURCES:' line" >&2
        return 1
    fi
    # shellcheck disable=SC2086  # word splitting and globbing are wanted here
    sources=$(ls -1 $line 2>/dev/null | grep -v '^src/cli/main\.c$' | sort -u)
    echo "== fuzz $name: building"
    # shellcheck disable=SC2086
    if ! $CC $CFLAGS $PKG_CFLAGS "$src" $sources -o "$OUT/$bin" $PKG_LIBS $libs -lm; then
        echo "fuzz: $name: build failed" >&2
        return 1
    fi
    work="$OUT/corpus/$name"
    mkdir -p "$work"
    seeds=()
    [ -d "tests/fuzz/corpus/$name" ] && seeds+=("tests/fuzz/corpus/$name")
    opts=(-rss_limit_mb=2048 -timeout=20 -print_final_stats=1 "-artifact_prefix=$OUT/$name-")
    [ -f "tests/fuzz/$name.dict" ] && opts+=("-dict=tests/fuzz/$name.dict")
    if [ -n "${FUZZ_BUILD_ONLY:-}" ]; then
        opts+=(-runs=0)
        what="seeds only"
    else
        opts+=("-max_total_time=$SECS")
        what="${SECS}s"
    fi
    echo "== fuzz $name: running $what"
    if ! "$OUT/$bin" "${opts[@]}" "$work" "${seeds[@]}" >"$OUT/$name.log" 2>&1; then
        tail -60 "$OUT/$name.log" >&2
        echo "fuzz: $name FAILED (log: $OUT/$name.log)" >&2
        return 1
    fi
    grep -aE 'stat::number_of_executed_units|Done [0-9]+ runs' "$OUT/$name.log" | tail -1
}

JOBS=${FUZZ_JOBS:-1}
names=()
for src in "${targets[@]}"; do
    if [ ! -f "$src" ]; then
        echo "fuzz: no such target $src" >&2
        names+=("$src")
        rm -f "$OUT/$(basename "$src" .c).out"
        echo > "$OUT/$(basename "$src" .c).failed"
        continue
    fi
    name=$(basename "$src" .c)
    names+=("$name")
    rm -f "$OUT/$name.failed"
    ( fuzz_one "$src" || echo > "$OUT/$name.failed" ) > "$OUT/$name.out" 2>&1 &
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
done
wait
failed=()
for name in "${names[@]}"; do
    n=$(basename "$name" .c)
    [ -f "$OUT/$n.out" ] && cat "$OUT/$n.out"
    [ -f "$OUT/$n.failed" ] && failed+=("${n#fuzz_}")
done

if [ ${#failed[@]} -gt 0 ]; then
    echo "fuzz: FAILED: ${failed[*]}" >&2
    exit 1
fi
echo "fuzz: all targets passed"
