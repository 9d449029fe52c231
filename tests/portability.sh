#!/bin/sh
# Portability beyond the host (make portability; CI runs it). Each part says what it checks:
#   x87      the whole suite built by an i686 cross compiler (x87 floating point, no SSE: float
#            maths in 80-bit registers, FLT_EVAL_METHOD 2, a 32-bit size_t), run under qemu-i386;
#   s390x    the whole suite on a 64-bit big-endian CPU (FLT_EVAL_METHOD 1 there), under qemu;
#   examples the same seed gives the same numbers with gcc, clang and tcc: examples/mlp.c's
#            printed losses must be identical (its layers are made in a set order).
# A missing tool is a skip (a failure under CI=true). Ends with "N passed, M failed".
set -u
cd "$(dirname "$0")/.." || exit 1
mkdir -p build

# suite NAME CROSS_GCC QEMU SYSROOT: build tests/*.c with the cross compiler, run it under
# qemu-user; says PASS, FAIL or SKIP in build/portability-NAME.out
suite() {
    name=$1 cc=$2 qemu=$3 root=$4 flags=${5:-} out=build/portability-$1.out log=build/portability-$1.log
    if ! command -v "$cc" >/dev/null 2>&1 || ! command -v "$qemu" >/dev/null 2>&1; then
        echo "SKIP portability.$name: needs $cc and $qemu" >"$out"; return
    fi
    start=$(date +%s)
    if ! "$cc" -O2 -std=c99 -Wall -Wextra -pedantic -Werror -g $flags -I. -o "build/test-$name" tests/*.c -lm \
        >"$log" 2>&1; then
        { echo "FAIL portability.$name: $cc does not build the suite"; cat "$log"; } >"$out"; return
    fi
    # (CI unset inside: the OpenBLAS-hook test skips there, since the cross build links no BLAS)
    # (left out: safetensors.racing_saves_leave_whole_files forks writer processes, and under
    # qemu-user 7.2 a forked child spins inside the emulator with no system call for minutes)
    if env -u CI MLC_DEVICE=cpu timeout 1200 "$qemu" -L "$root" "build/test-$name" \
        -safetensors.racing_saves_leave_whole_files >"$log" 2>&1; then
        echo "PASS portability.$name: $(tail -n 1 "$log") ($(( $(date +%s) - start )) s)" >"$out"
    else
        { echo "FAIL portability.$name"; grep -E '^(FAIL|SKIP)|passed' "$log"; } >"$out"
    fi
}

# examples: mlp.c built by each compiler prints the same losses
examples() {
    out=build/portability-examples.out ref="" ok=1 used=""
    for cc in gcc clang tcc; do
        command -v $cc >/dev/null 2>&1 || continue
        $cc -std=c99 -O2 -I. -o "build/mlp-$cc" examples/mlp.c -lm || { ok=0; continue; }
        MLC_DEVICE=cpu "build/mlp-$cc" 2>/dev/null | grep Loss >"build/mlp-$cc.txt"
        used="$used $cc"
        if [ -z "$ref" ]; then ref=build/mlp-$cc.txt
        elif ! cmp -s "$ref" "build/mlp-$cc.txt"; then ok=0; diff "$ref" "build/mlp-$cc.txt" | head -4; fi
    done
    if [ "$(echo $used | wc -w)" -lt 2 ]; then echo "SKIP portability.examples: fewer than two compilers" >"$out"
    elif [ $ok = 1 ]; then echo "PASS portability.examples: mlp.c's losses identical with$used" >"$out"
    else echo "FAIL portability.examples: mlp.c's losses differ between$used" >"$out"; fi
}

# qemu-i386 7.2 (Debian 12) hangs in pthread_create (a two-line pthread program does too), so the
# x87 suite runs without mlc's threads; the s390x suite runs with them.
suite x87 i686-linux-gnu-gcc qemu-i386 /usr/i686-linux-gnu -DMLC_NO_THREADS &
suite s390x s390x-linux-gnu-gcc qemu-s390x /usr/s390x-linux-gnu &
examples
wait
cat build/portability-x87.out build/portability-s390x.out build/portability-examples.out
passed=$(cat build/portability-*.out | grep -c '^PASS')
failed=$(cat build/portability-*.out | grep -c '^FAIL')
skipped=$(cat build/portability-*.out | grep -c '^SKIP')
if [ "$skipped" -gt 0 ] && [ "${CI:-}" = "true" ]; then
    echo "CI=true: nothing may be skipped"; failed=$((failed + skipped))
fi
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
