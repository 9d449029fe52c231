#!/bin/sh
# Compile checks: mlc.h builds warning-free as C99 with gcc and clang, as C++ with g++, links
# from two translation units (extern and MLC_STATIC), needs no stdio under MLC_NO_STDIO and no
# malloc, getenv or x86 intrinsics under MLC_NO_MALLOC.
# A missing compiler is reported as skipped; under CI=true nothing may be skipped.
set -u
cd "$(dirname "$0")/.." || exit 1
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
passed=0 failed=0 skipped=""
strict="-std=c99 -Wall -Wextra -pedantic -Werror"

check() {  # name, command...
    name=$1; shift
    if "$@" >"$tmp/log" 2>&1; then passed=$((passed + 1))
    else failed=$((failed + 1)); echo "FAIL compile.$name: $*"; head -c 2000 "$tmp/log"; fi
}

printf '#define MLC_IMPLEMENTATION\n#include "mlc.h"\nint main(void) { mlc_ctx *c = mlc_create(NULL); mlc_destroy(c); return 0; }\n' >"$tmp/impl.c"
cat >"$tmp/a.c" <<'SRC'
#define MLC_IMPLEMENTATION
#include "mlc.h"
float use_from_b(mlc_ctx *ctx);
int main(void) { mlc_ctx *c = mlc_create(NULL); int bad = use_from_b(c) != 6.0f; mlc_destroy(c); return bad; }
SRC
cat >"$tmp/b.c" <<'SRC'
#include "mlc.h"
float use_from_b(mlc_ctx *ctx) { return mlc_item(mlc_sum_all(mlc_full(ctx, MLC_SHAPE(2, 3), 1.0f))); }
SRC
printf '#define MLC_STATIC\n' | cat - "$tmp/a.c" >"$tmp/sa.c"
printf '#define MLC_STATIC\n#define MLC_IMPLEMENTATION\n' | cat - "$tmp/b.c" >"$tmp/sb.c"

for cc in gcc clang; do
    if ! command -v $cc >/dev/null 2>&1; then skipped="$skipped $cc"; continue; fi
    for opt in -O0 -O2; do
        check "$cc$opt" $cc $strict $opt -I. -o "$tmp/impl" "$tmp/impl.c" -lm
    done
    for ex in examples/*.c; do check "$cc.$(basename "$ex" .c)" $cc $strict -O2 -I. -c -o "$tmp/ex.o" "$ex"; done
    check "$cc.two_units" sh -c "$cc $strict -I. -o '$tmp/two' '$tmp/a.c' '$tmp/b.c' -lm && '$tmp/two'"
    check "$cc.two_units_static" sh -c "$cc $strict -I. -o '$tmp/two' '$tmp/sa.c' '$tmp/sb.c' -lm && '$tmp/two'"
    # MLC_NO_MALLOC (bare metal): no allocator, environment or x86 code referenced or included
    check "$cc.no_malloc" sh -c "$cc $strict -DMLC_NO_MALLOC -I. -c -o '$tmp/nm.o' '$tmp/impl.c' && \
        ! nm -u '$tmp/nm.o' | grep -wE 'malloc|calloc|realloc|free|getenv|__cpu_model|__cpu_indicator_init' \
        && \
        ! $cc -DMLC_NO_MALLOC -I. -H -fsyntax-only '$tmp/impl.c' 2>&1 | grep -E 'immintrin|cpuid'"
    check "$cc.no_stdio" sh -c "$cc $strict -DMLC_NO_STDIO -I. -c -o '$tmp/ns.o' '$tmp/impl.c' && ! nm -u '$tmp/ns.o' | grep -E 'printf|puts|fopen|fwrite|stderr|stdout'"
done
if command -v g++ >/dev/null 2>&1; then
    check "g++" g++ -x c++ -Wall -Wextra -Werror -I. -o "$tmp/cpp" "$tmp/impl.c"
    check "g++.two_units" sh -c "g++ -x c++ -Wall -Wextra -Werror -I. -c -o '$tmp/ca.o' '$tmp/impl.c' && g++ -x c++ -Wall -Wextra -Werror -I. -c -o '$tmp/cb.o' '$tmp/b.c'"
else skipped="$skipped g++"; fi

# MLC_USE_CBLAS: the header routes products to cblas_sgemm (OpenBLAS here) and gets them right.
cat >"$tmp/cblas.c" <<'SRC'
#define MLC_USE_CBLAS
#define MLC_IMPLEMENTATION
#include "mlc.h"
int main(void) {
    static const float a[6] = { 1, 2, 3, 4, 5, 6 }, b[6] = { 1, 0, 0, 1, 1, 1 };
    float c[4];
    mlc_ctx *ctx = mlc_create(NULL);
    mlc_gemm(ctx, 0, 0, 2, 2, 3, a, b, 0.0f, c);
    mlc_destroy(ctx);
    return !(c[0] == 4 && c[1] == 5 && c[2] == 10 && c[3] == 11);
}
SRC
if printf '#include <cblas.h>\nint main(void){return 0;}\n' | gcc -x c - -o "$tmp/probe" -lopenblas >/dev/null 2>&1; then
    check "gcc.use_cblas" sh -c "gcc $strict -I. -o '$tmp/cblas' '$tmp/cblas.c' -lopenblas -lm && '$tmp/cblas'"
else skipped="$skipped MLC_USE_CBLAS(libopenblas-dev)"; fi

# Every ```c block of the README is a complete program that compiles with only mlc.h beside it,
# and runs (on the CPU).
mkdir -p "$tmp/readme" && cp mlc.h "$tmp/readme/"
awk -v dir="$tmp/readme" '/^```c$/ { n++; on = 1; next } /^```$/ { on = 0; next }
    on { print > (dir "/block" n ".c") }' README.md
for block in "$tmp"/readme/block*.c; do
    [ -e "$block" ] || { failed=$((failed + 1)); echo "FAIL compile.readme: no C block in README.md"; break; }
    check "readme.$(basename "$block" .c)" sh -c "cd '$tmp/readme' && cc $strict -o prog '$block' -lm && MLC_DEVICE=cpu ./prog >/dev/null"
done

if [ -n "$skipped" ]; then
    echo "compile checks SKIPPED for:$skipped (not installed)"
    if [ "${CI:-}" = "true" ]; then echo "CI=true: nothing may be skipped"; exit 1; fi
fi
echo "compile checks: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
