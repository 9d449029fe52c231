#!/bin/sh
# make test-install: make install into a temporary prefix, then build and run
# tests/install_consumer/main.c against it the two ways a user would: cc with
# $(pkg-config --cflags --libs mlc), and CMake's find_package(mlc) with mlc::mlc (then the
# OpenCL and OpenBLAS components' targets, and a version the package must refuse). Then a
# DESTDIR install and make uninstall, which must leave nothing behind. One PASS, FAIL or SKIPPED
# line per check; a missing pkg-config or cmake is SKIPPED, a failure under CI=true.
# Run from the repository root; MAKE and CC come from make. The programs are built without -O
# (mlc.h's implementation takes 1 s so, 4 s at -O2): this checks the install, not speed.
set -u
MAKE=${MAKE:-make}
CC=${CC:-cc}
export CC
version=$(sed -n 's/^#define MLC_VERSION_STRING "\(.*\)".*/\1/p' mlc.h)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mlc-install.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
status=0
pass() { echo "PASS install: $*"; }
fail() { echo "FAIL install: $*"; status=1; }
skip() {
    echo "SKIPPED install: $*"
    if [ "${CI:-}" = "true" ]; then echo "CI=true: install checks may not be skipped in CI"; status=1; fi
}
# run LOG CMD...: CMD with its output in LOG, shown when it fails
run() {
    log=$1; shift
    "$@" >"$log" 2>&1 && return 0
    sed 's/^/    /' "$log" | tail -n 20
    return 1
}

[ -n "$version" ] || { echo "FAIL install: no MLC_VERSION_STRING in mlc.h"; exit 1; }
if ! run "$tmp/install.log" "$MAKE" --no-print-directory install PREFIX="$prefix"; then
    echo "FAIL install: make install PREFIX=$prefix"; exit 1
fi
missing=
for f in include/mlc.h include/mlc_opencl.h lib/pkgconfig/mlc.pc lib/cmake/mlc/mlc-config.cmake \
         lib/cmake/mlc/mlc-config-version.cmake; do
    [ -f "$prefix/$f" ] || missing="$missing $f"
done
if [ -n "$missing" ]; then
    fail "make install did not install:$missing"
else
    pass "make install PREFIX=<tmp> ($version)"
fi

# pkg-config
if command -v pkg-config >/dev/null 2>&1; then
    PKG_CONFIG_PATH=$prefix/lib/pkgconfig
    export PKG_CONFIG_PATH
    got=$(pkg-config --modversion mlc 2>&1)
    if [ "$got" != "$version" ]; then
        fail "pkg-config --modversion mlc gave '$got', mlc.h says $version"
    elif ! flags=$(echo $(pkg-config --cflags --libs mlc)) || \
         ! run "$tmp/pc-build.log" $CC -std=c99 -Wall -Wextra -pedantic -o "$tmp/app-pc" \
             tests/install_consumer/main.c $flags; then
        fail "pkg-config: $CC tests/install_consumer/main.c \$(pkg-config --cflags --libs mlc) does not build"
    elif ! out=$("$tmp/app-pc" 2>&1); then
        fail "pkg-config: the program failed: $out"
    else
        pass "pkg-config: $CC main.c $flags -> $out"
    fi
else
    skip "pkg-config is not installed (Debian: pkg-config)"
fi

# CMake: cmake_consumer NAME [CACHE ARGS...] configures and builds tests/install_consumer
cmake_consumer() {
    name=$1; shift
    run "$tmp/$name-configure.log" cmake -S tests/install_consumer -B "$tmp/$name" \
        -DCMAKE_PREFIX_PATH="$prefix" "$@" &&
    run "$tmp/$name-build.log" cmake --build "$tmp/$name" --parallel 2
}
if command -v cmake >/dev/null 2>&1; then
    if ! cmake_consumer cmake -DMLC_CONSUMER_VERSION="$version"; then
        fail "cmake: find_package(mlc $version REQUIRED) + mlc::mlc does not configure or build"
    elif ! grep -qx "mlc_DIR:PATH=$prefix/lib/cmake/mlc" "$tmp/cmake/CMakeCache.txt"; then
        fail "cmake: found another mlc: $(grep '^mlc_DIR' "$tmp/cmake/CMakeCache.txt")"
    elif ! out=$("$tmp/cmake/app" 2>&1); then
        fail "cmake: the program failed: $out"
    else
        pass "cmake: find_package(mlc $version REQUIRED), mlc::mlc -> $out"
    fi
    # a version the package must refuse (a later major version)
    if cmake_consumer cmake-refuse -DMLC_CONSUMER_VERSION=99.0 >/dev/null 2>&1; then
        fail "cmake: find_package(mlc 99.0) accepted mlc $version"
    else
        pass "cmake: find_package(mlc 99.0) refuses mlc $version"
    fi
    # the components, where their headers and libraries are installed
    if ! printf '#include <CL/cl.h>\nint main(void){return 0;}\n' | \
            $CC -x c - -c -o /dev/null >/dev/null 2>&1; then
        skip "cmake components: no OpenCL headers (CL/cl.h; Debian: opencl-headers)"
    elif ! printf '#include <cblas.h>\nint main(void){return 0;}\n' | \
            $CC -x c - -o /dev/null -lopenblas >/dev/null 2>&1; then
        skip "cmake components: no OpenBLAS (cblas.h, -lopenblas; Debian: libopenblas-dev)"
    elif ! cmake_consumer cmake-components -DMLC_CONSUMER_VERSION="$version" \
                                           -DMLC_CONSUMER_COMPONENTS=ON; then
        fail "cmake: COMPONENTS OpenCL OpenBLAS + mlc::opencl mlc::openblas does not configure or build"
    elif ! out=$("$tmp/cmake-components/app-components" 2>&1); then
        fail "cmake components: the program failed: $out"
    else
        pass "cmake: COMPONENTS OpenCL OpenBLAS, mlc::opencl mlc::openblas -> $out"
    fi
else
    skip "cmake is not installed (Debian: cmake)"
fi

# DESTDIR staging: the files under DESTDIR, the paths inside them without it
stage=$tmp/stage
if ! run "$tmp/destdir.log" "$MAKE" --no-print-directory install DESTDIR="$stage" PREFIX=/opt/mlc; then
    fail "make install DESTDIR=<tmp> PREFIX=/opt/mlc"
elif [ ! -f "$stage/opt/mlc/include/mlc.h" ] ||
     ! grep -qx 'prefix=/opt/mlc' "$stage/opt/mlc/lib/pkgconfig/mlc.pc"; then
    fail "make install DESTDIR=<tmp> PREFIX=/opt/mlc: not staged under DESTDIR with prefix /opt/mlc"
else
    pass "make install DESTDIR=<tmp> PREFIX=/opt/mlc stages the files, mlc.pc says prefix=/opt/mlc"
fi

# make uninstall leaves no file behind
run "$tmp/uninstall.log" "$MAKE" --no-print-directory uninstall PREFIX="$prefix" || status=1
run "$tmp/uninstall2.log" "$MAKE" --no-print-directory uninstall DESTDIR="$stage" PREFIX=/opt/mlc || status=1
left=$(find "$prefix" "$stage" -type f 2>/dev/null)
if [ -n "$left" ]; then fail "make uninstall left: $left"; else pass "make uninstall removes every file"; fi

[ $status -eq 0 ] && echo "test-install: passed" || echo "test-install: FAILED"
exit $status
