#!/bin/sh
# tools/figures.sh (make figures): the README's figures that drift as the code changes, measured
# now instead of typed by hand: the suite's test count on this machine (CPU; with the fake device
# and on OpenCL when built so), and the Cortex-M4F builds' flash and RAM, float32 and int8 (after
# make embedded).
# Each line says the date, the commit and what produced it.
set -u
cd "$(dirname "$0")/.." || exit 1
BUILD=${BUILD:-build}
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
echo "figures: $(date -u +%Y-%m-%d), commit $commit, $(uname -m), $(${CC:-cc} --version | head -1)"

summary() {   # the runner's last line, for a run of "$@"
    "$@" 2>&1 | grep -E '^[0-9]+ passed, [0-9]+ failed' | tail -1
}
if [ -x "$BUILD/test" ]; then
    echo "suite, CPU ($BUILD/test): $(summary env MLC_DEVICE=cpu "$BUILD/test")"
    echo "suite, fake device (MLC_TEST_FAKE_DEVICE=1): $(summary env MLC_TEST_FAKE_DEVICE=1 "$BUILD/test")"
    if [ -x "$BUILD/test-opencl" ] && "$BUILD/test-opencl" --devices >/dev/null 2>&1; then
        echo "suite, OpenCL ($BUILD/test-opencl, MLC_DEVICE=opencl):" \
             "$(summary env MLC_DEVICE=opencl POCL_CACHE_DIR="$BUILD/pocl-cache" "$BUILD/test-opencl")"
    else
        echo "suite, OpenCL: SKIPPED ($BUILD/test-opencl not built, or no OpenCL device here)"
    fi
else
    echo "suite: SKIPPED ($BUILD/test is not built: run make test first)"
fi

# One Cortex-M4F build: label, its ELF, what it printed under qemu, the prefix of its weights' arrays
embedded() {
    label=$1 elf=$2 printed=$3 prefix=$4
    set -- $(arm-none-eabi-size "$elf" | awk 'NR == 2 { print $1, $2, $3 }')
    text=$1 data=$2 bss=$3
    code=$(arm-none-eabi-nm --size-sort -S -t d "$elf" | awk '$4 ~ /^mlc/ { s += $2 }
                                                              END { print s + 0 }')
    weights=$(arm-none-eabi-nm -S -t d "$elf" | awk -v p="$prefix" 'index($4, p) == 1 { s += $2 }
                                                                   END { print s + 0 }')
    echo "Cortex-M4F, $label (make embedded, arm-none-eabi-size and nm):"
    echo "  flash, all (text + data): $((text + data)) bytes; of which mlc code (every mlc* symbol): $code;" \
         "weights (${prefix}* arrays): $weights"
    echo "  RAM, all (data + bss, stack reserve included): $((data + bss)) bytes"
    if [ -f "$printed" ]; then
        sed -n 's/^\(arena peak\|pool\|stack\) bytes: /  \1 used: /p' "$printed" | sed 's/$/ bytes/'
    fi
}
if [ -f "$BUILD/embedded/digits.elf" ] && command -v arm-none-eabi-size >/dev/null 2>&1; then
    embedded float32 "$BUILD/embedded/digits.elf" "$BUILD/embedded/qemu.txt" w_
    if [ -f "$BUILD/embedded/digits_int8.elf" ]; then
        embedded int8 "$BUILD/embedded/digits_int8.elf" "$BUILD/embedded/qemu-int8.txt" q_
    fi
else
    echo "Cortex-M4F: SKIPPED (run make embedded first; needs gcc-arm-none-eabi)"
fi
