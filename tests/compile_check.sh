#!/bin/sh
# Compile checks: mlc.h builds warning-free as C99 with gcc and clang, as C++ (11 and 20) with
# g++, with tcc and arm-none-eabi-gcc, links from two translation units (extern and MLC_STATIC),
# needs no stdio under MLC_NO_STDIO and no malloc, getenv or x86 intrinsics under MLC_NO_MALLOC.
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
    for ex in examples/*.c; do
        if grep -q '^#include "\.\./mlc_mpi\.h"\|^#include "mlc_mpi\.h"' "$ex"; then   # MPI's: through mpicc
            if command -v mpicc >/dev/null 2>&1; then
                check "$cc.$(basename "$ex" .c)" env OMPI_CC=$cc MPICH_CC=$cc mpicc $strict -O2 -I. -c -o "$tmp/ex.o" "$ex"
            else skipped="$skipped $cc.$(basename "$ex" .c)(mpicc)"; fi
            continue
        fi
        check "$cc.$(basename "$ex" .c)" $cc $strict -O2 -I. -c -o "$tmp/ex.o" "$ex"
    done
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
    check "g++" g++ -x c++ -O2 -Wall -Wextra -Werror -I. -o "$tmp/cpp" "$tmp/impl.c"
    check "g++.two_units" sh -c "g++ -x c++ -Wall -Wextra -Werror -I. -c -o '$tmp/ca.o' '$tmp/impl.c' && g++ -x c++ -Wall -Wextra -Werror -I. -c -o '$tmp/cb.o' '$tmp/b.c'"
    # C++11 and C++20 (enum-float arithmetic is deprecated there), and MLC_SHAPE with run-time
    # sizes from C++ (no compound literals): examples/cpp_demo.cpp builds, runs and learns.
    for std in c++11 c++20; do
        check "g++.$std.cpp_demo" sh -c "g++ -std=$std -O2 -Wall -Wextra -Wdouble-promotion -Werror -I. -o '$tmp/cppdemo' examples/cpp_demo.cpp && '$tmp/cppdemo' 40 >/dev/null"
    done
else skipped="$skipped g++"; fi

# Warning-free where users turn more on: -Wdouble-promotion (float stays float), Clang with
# -fopenmp (omp simd hints it cannot honour), and a build without double maths (MLC_FLOAT_ONLY).
check "gcc.double_promotion" gcc $strict -Wdouble-promotion -O2 -I. -c -o "$tmp/dp.o" "$tmp/impl.c"
check "gcc.float_only" gcc $strict -Wdouble-promotion -DMLC_FLOAT_ONLY -O2 -I. -c -o "$tmp/fo.o" "$tmp/impl.c"
if command -v clang >/dev/null 2>&1; then
    check "clang.openmp" clang $strict -fopenmp -O2 -I. -c -o "$tmp/omp.o" "$tmp/impl.c"
fi
# A user's function-like macros named like mlc's struct members (<tgmath.h>'s log, a leak
# checker's free) do not reach mlc's calls through those members.
cat >"$tmp/macros.c" <<'SRC'
#include <tgmath.h>
#include <stdlib.h>
static int frees;
static void counted_free(void *p) { frees++; (free)(p); }
#define free(p) counted_free(p)
#define alloc(n) no_such_function(n)
#define MLC_IMPLEMENTATION
#include "mlc.h"
int main(void) { mlc_ctx *c = mlc_create(NULL); mlc_destroy(c); return frees == 0; }
SRC
check "gcc.user_macros" sh -c "gcc $strict -I. -o '$tmp/macros' '$tmp/macros.c' -lm && '$tmp/macros'"
# tcc (no vector extensions, no OpenMP): builds and runs the two-unit program, and builds the
# whole test suite and runs a quick part of it.
if command -v tcc >/dev/null 2>&1; then
    check "tcc" sh -c "tcc -I. -o '$tmp/tcc' '$tmp/a.c' '$tmp/b.c' -lm && '$tmp/tcc'"
    check "tcc.suite" sh -c "tcc -I. -o '$tmp/tcc_test' tests/*.c -lm && '$tmp/tcc_test' tensor. ops. attention."
else skipped="$skipped tcc"; fi
# The Cortex-M4F's compiler: short enums, no stdio, warning-free.
if command -v arm-none-eabi-gcc >/dev/null 2>&1; then
    check "arm-none-eabi" arm-none-eabi-gcc -mcpu=cortex-m4 -mthumb -mfloat-abi=hard -mfpu=fpv4-sp-d16 $strict \
        -Wdouble-promotion -DMLC_NO_STDIO -DMLC_FLOAT_ONLY -O2 -I. -c -o "$tmp/arm.o" "$tmp/impl.c"
else skipped="$skipped arm-none-eabi-gcc(gcc-arm-none-eabi)"; fi

# The old names (mlc.h's api-deprecated section) still build and run, and each use makes the
# compiler name its replacement.
cat >"$tmp/old_names.c" <<'SRC'
#define MLC_IMPLEMENTATION
#include "mlc.h"
int main(void) {
    mlc_ctx *ctx = mlc_create(NULL);
    mlc_module *m = mlc_nn_linear(ctx, 2, 1);
    mlc_sgd_config s = { 0.1f, 0, 0, 0, 0 };
    mlc_adam_config a = { 0.1f, 0, 0, 0, 0, 0 };
    mlc_rmsprop_config r = { 0.1f, 0, 0, 0, 0, 0 };
    mlc_batch_config b = { 1, 0, 0 };
    int ok = mlc_sgd(ctx, m, s) && mlc_adam(ctx, m, a) && mlc_rmsprop(ctx, m, r)
             && mlc_module_load_memory(m, "", 0, NULL) == MLC_ERR_IO
             && mlc_checkpoint_load_memory("", 0, m, NULL, NULL) == MLC_ERR_IO;
    (void)b;
    mlc_destroy(ctx);
    return !ok;
}
SRC
check "gcc.old_names" sh -c "gcc -std=c99 -Wall -Wextra -pedantic -I. -o '$tmp/old' '$tmp/old_names.c' -lm 2>'$tmp/old.log' \
    && '$tmp/old' && for new in mlc_sgd_opts mlc_adam_opts mlc_rmsprop_opts mlc_batch_opts mlc_module_load_from_memory \
    mlc_checkpoint_load_from_memory; do grep -q \"use \$new\" '$tmp/old.log' || exit 1; done"

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

# Every ```c block of the README is a complete program that compiles with only mlc.h beside it
# (with -O2, as the README says to build them), and runs (on the CPU); so is every ```cpp block,
# built by g++ as C++11.
mkdir -p "$tmp/readme" && cp mlc.h "$tmp/readme/"
awk -v dir="$tmp/readme" '/^```(c|cpp)$/ { n++; on = 1; ext = substr($0, 4); next } /^```$/ { on = 0; next }
    on { print > (dir "/block" n "." ext) }' README.md
# A block that reads Debian's dataset-fashion-mnist is only compiled where the data is missing
# (its run is then SKIPPED; under CI=true that fails).
for block in "$tmp"/readme/block*.c; do
    [ -e "$block" ] || { failed=$((failed + 1)); echo "FAIL compile.readme: no C block in README.md"; break; }
    name=$(basename "$block" .c)
    if grep -q /usr/share/datasets/fashion-mnist "$block" && [ ! -d /usr/share/datasets/fashion-mnist ]; then
        check "readme.$name" sh -c "cd '$tmp/readme' && cc $strict -O2 -o prog '$block' -lm"
        skipped="$skipped readme.$name(run:dataset-fashion-mnist)"
        continue
    fi
    check "readme.$name" sh -c "cd '$tmp/readme' && cc $strict -O2 -o prog '$block' -lm && MLC_DEVICE=cpu ./prog >/dev/null"
done
if command -v g++ >/dev/null 2>&1; then
    for block in "$tmp"/readme/block*.cpp; do
        [ -e "$block" ] || { failed=$((failed + 1)); echo "FAIL compile.readme: no C++ block in README.md"; break; }
        check "readme.$(basename "$block" .cpp).cpp" sh -c "cd '$tmp/readme' && g++ -std=c++11 -O2 -Wall -Wextra -Werror \
            -o prog '$block' && MLC_DEVICE=cpu ./prog >/dev/null"
    done
fi

if [ -n "$skipped" ]; then
    echo "compile checks SKIPPED for:$skipped (not installed)"
    if [ "${CI:-}" = "true" ]; then echo "CI=true: nothing may be skipped"; exit 1; fi
fi
echo "compile checks: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
