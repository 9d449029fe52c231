#!/bin/sh
# The examples as command-line programs: each prints a usage with "usage" in it to stdout and exits
# 0 on --help, prints it to stderr and exits 2 on an unknown option (and on a missing value), and
# those that read data find it when started from another directory (cd /tmp), in their quickest
# mode. Builds the C examples with make (build/...) and examples/cpp_demo.cpp with g++ (skipped
# without it; a failure under CI=true); Fashion-MNIST's run is skipped without Debian's
# dataset-fashion-mnist (also a failure under CI=true). About 10 s. Ends with "N passed, M failed".
# Usage: sh tests/examples_cli.sh   (MAKE and BUILD as for make; BUILD must be inside the repository
# for the data to be found from elsewhere: the examples look in their own directory's parent)
set -u
cd "$(dirname "$0")/.." || exit 1
root=$(pwd)
build=${BUILD:-build}
case $build in /*) bin=$build ;; *) bin=$root/$build ;; esac      # run from /tmp: absolute
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0 skip=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL examples_cli.$1"; head -c 1500 "$tmp/err"; }
skipped() {
    echo "SKIPPED examples_cli.$1"
    if [ "${CI:-}" = "true" ]; then fail=$((fail + 1)); else skip=$((skip + 1)); fi
}

examples="mlp digits devices fashion_mnist gpt minilm backend_skeleton mobilenet"
targets=""
for e in $examples; do targets="$targets $build/$e"; done
# shellcheck disable=SC2086
if ! ${MAKE:-make} -s BUILD="$build" $targets >"$tmp/err" 2>&1; then
    bad build; echo "examples_cli: 0 passed, 1 failed"; exit 1
fi
if command -v g++ >/dev/null 2>&1; then
    if [ "$bin/cpp_demo" -nt examples/cpp_demo.cpp ] && [ "$bin/cpp_demo" -nt mlc.h ] ||
       g++ -std=c++11 -I. -o "$bin/cpp_demo" examples/cpp_demo.cpp 2>"$tmp/err"; then examples="$examples cpp_demo"
    else bad build.cpp_demo; fi
else skipped "cpp_demo (no g++)"; fi

cd /tmp || exit 1
export MLC_DEVICE=cpu
for e in $examples; do
    "$bin/$e" --help >"$tmp/out" 2>"$tmp/err"
    rc=$?
    if [ $rc -eq 0 ] && grep -qi usage "$tmp/out"; then ok; else bad "$e.help (exit $rc)"; fi
    "$bin/$e" --no-such-option >"$tmp/out" 2>"$tmp/err"
    rc=$?
    if [ $rc -eq 2 ] && grep -qi usage "$tmp/err"; then ok; else bad "$e.unknown_option (exit $rc, want 2)"; fi
done
for cmd in "gpt --steps" "fashion_mnist --epochs" "devices --device" "minilm --max-len" \
           "fashion_mnist --calibration" "digits --calibration" "mobilenet --width"; do  # no value
    # shellcheck disable=SC2086
    set -- $cmd
    "$bin/$1" "$2" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    if [ $rc -eq 2 ]; then ok; else bad "$1.missing_value (exit $rc, want 2)"; fi
done
# refused TEST PATTERN EXAMPLE ARGS...: the example exits 2 with PATTERN (grep -E) on stderr
refused() {
    test=$1 pattern=$2 name=$3; shift 3
    "$bin/$name" "$@" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    if [ $rc -eq 2 ] && grep -qE -- "$pattern" "$tmp/err"; then ok
    else bad "$name.$test ($name $*: exit $rc, want 2)"; fi
}
for cmd in "minilm --int8 --dtype bf16 x" "minilm --dtype f16 --int8 x"; do   # int8 quantizes float32 only
    # shellcheck disable=SC2086
    set -- $cmd
    refused int8_with_dtype "--int8" "$@"
done
# --calibration: a count of batches with --int8 only; each refused before any data is read, with
# exit 2 and a message naming the option
for cmd in "fashion_mnist --calibration 8" "fashion_mnist --int8 --calibration 0 --model cnn" \
           "fashion_mnist --model cnn --int8 --calibration 938" "fashion_mnist --int8 --calibration -1" \
           "digits --calibration 8" "digits --int8 --calibration 0" "digits --int8 --calibration 25" \
           "digits --int8 --calibration x"; do
    # shellcheck disable=SC2086
    set -- $cmd
    refused int8_misuse "--int8|--calibration" "$@"
done

# mobilenet's sizes out of range: exit 2 naming the option, before anything is built
for cmd in "mobilenet --width 0" "mobilenet --width abc" "mobilenet --size 8" "mobilenet --batch 0" \
           "mobilenet --runs 0"; do
    # shellcheck disable=SC2086
    set -- $cmd
    refused out_of_range "$2" "$@"
done

# The data-reading examples from /tmp, each in its quickest mode: they find data/ beside build/.
run() {  # name, grep pattern for its output, command...
    name=$1 pattern=$2; shift 2
    "$@" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    if [ $rc -eq 0 ] && grep -q "$pattern" "$tmp/out"; then ok
    else cat "$tmp/out" >>"$tmp/err"; bad "$name.from_elsewhere (exit $rc)"; fi
}
run digits "^test accuracy" "$bin/digits"
run digits.int8 "^int8 test accuracy" "$bin/digits" --int8 --calibration 2
run devices "^  cpu: " "$bin/devices" --device cpu
run gpt "^step *20 " "$bin/gpt" --steps 20 --every 20
run mobilenet "^first run" "$bin/mobilenet" --width 0.35 --size 96 --runs 1
if [ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
    run fashion_mnist "^done in" "$bin/fashion_mnist" --epochs 1 --batch 256
else skipped "fashion_mnist run (no /usr/share/datasets/fashion-mnist: apt install dataset-fashion-mnist)"; fi

if [ $skip -gt 0 ]; then echo "examples_cli: $pass passed, $fail failed, $skip skipped"
else echo "examples_cli: $pass passed, $fail failed"; fi
[ $fail -eq 0 ]
