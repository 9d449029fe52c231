#!/bin/sh
# bench/run.sh - build and run mlc's benchmark suite and print one table (`make bench` runs it).
#   sh bench/run.sh [--quick]      --quick: short runs, to try the suite out (numbers are rough)
# Steps: build build/bench (-O2 -fopenmp -fno-math-errno, with OpenBLAS and zlib when they are found)
# and build/bench-plain (the default build a user makes of a header: cc -O2 -std=c99, nothing
# else), run the memory child, bench/torch_bench.py when a python3 with torch is found, then
# build/bench, which measures mlc (running build/bench-plain's epoch rows beside its own) and
# prints the tables with the other runs' numbers. The epoch rows include bf16 autocast (issue 25)
# where the CPU has AVX-512 BF16: mlc under mlc_autocast_begin and PyTorch under torch.autocast,
# each PyTorch run with OPENBLAS_NUM_THREADS set to its thread count. The micro-benchmarks end
# with the int8 rows (issue 26): the CNN's batch-1 latency on 1 thread, int8 (mlc_quantize_static)
# against float32 and against PyTorch's statically quantized model (onednn, qnnpack).
set -e
cd "$(dirname "$0")/.."
CC=${CC:-cc}
BUILD=build
QUICK=
[ "$1" = "--quick" ] && QUICK=--quick
mkdir -p "$BUILD"
start=$(date +%s)

CFLAGS="-O2 -fopenmp -fno-math-errno -std=c99 -Wall -Wextra -pedantic -I."
LIBS="-lm"

# probe NAME PROGRAM FLAGS...: does PROGRAM compile and link with FLAGS?
probe() {
    printf '%s\n' "$2" > "$BUILD/probe_$1.c"
    file="$BUILD/probe_$1.c"; shift 2
    $CC $CFLAGS -o "$BUILD/probe" "$file" "$@" >/dev/null 2>&1
}
openblas_test='#include <cblas.h>
int main(void) { openblas_set_num_threads(1); return openblas_get_config() == 0; }'
if probe openblas "$openblas_test" -lopenblas; then
    CFLAGS="$CFLAGS -DBENCH_OPENBLAS"; LIBS="-lopenblas $LIBS"
elif probe openblas "$openblas_test" -I/usr/include/openblas -lopenblas; then
    CFLAGS="$CFLAGS -I/usr/include/openblas -DBENCH_OPENBLAS"; LIBS="-lopenblas $LIBS"
else
    echo "bench: OpenBLAS (cblas.h + -lopenblas) not found: its columns are skipped"
fi
if probe zlib '#include <zlib.h>
int main(void) { return zlibVersion() == 0; }' -lz; then
    CFLAGS="$CFLAGS -DBENCH_ZLIB"; LIBS="$LIBS -lz"
else
    echo "bench: zlib not found: the dataset is read through 'gzip -dc'"
fi
rm -f "$BUILD"/probe "$BUILD"/probe_*.c
# the CPU features the bf16 rows name (bench.c asks cpuid itself; this is for the log)
if [ -r /proc/cpuinfo ]; then
    flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
    has() { case "$flags" in *" $1 "*) echo yes ;; *) echo no ;; esac; }
    echo "bench: CPU has AVX-512 BF16: $(has avx512_bf16) (the bf16 rows), AMX-BF16: $(has amx_bf16)" \
        "(the bf16 / float32 target)"
    echo "bench: CPU has AVX-512 VNNI: $(has avx512_vnni), AVX-VNNI: $(has avx_vnni)," \
        "AMX-INT8: $(has amx_int8) (the int8 GEMM rows' target)"
fi
echo "bench: $CC $CFLAGS -o $BUILD/bench bench/bench.c $LIBS"
$CC $CFLAGS -o "$BUILD/bench" bench/bench.c $LIBS
echo "bench: $CC -O2 -std=c99 -I. -o $BUILD/bench-plain bench/bench.c -lm"
$CC -O2 -std=c99 -I. -o "$BUILD/bench-plain" bench/bench.c -lm

# Other processes lower every number, the 2-thread ones most (a thread that waits for its
# partner at a barrier can lose a whole scheduler time slice), so we say how busy they were:
# cpu_ticks prints the busy and total ticks of all CPUs so far (/proc/stat), "0 0" without it.
cpu_ticks() {
    if [ -r /proc/stat ]; then
        read -r _ u n s i w q sq st _ < /proc/stat
        echo "$((u + n + s + q + sq + st)) $((u + n + s + i + w + q + sq + st))"
    else
        echo "0 0"
    fi
}
before=$(cpu_ticks); sleep 1; set -- $before $(cpu_ticks)
[ "$4" -gt "$2" ] && echo "bench: other processes used $(( 100 * ($3 - $1) / ($4 - $2) ))% of the CPUs" \
    "in the second before the run (above ~10%, expect low and noisy numbers)"
run_start=$(cpu_ticks)

# 5. memory, in a process of its own
"$BUILD/bench" --rss-child > "$BUILD/bench_rss.txt"

# 0. the plain build: build/bench runs its epoch rows (1 thread, it has no OpenMP) just before
# each of its own 1-thread runs, so that both see the machine in the same state
PLAIN_ARGS="--plain-exe $BUILD/bench-plain"

# 6. PyTorch: the first python3 on PATH that can import torch, else Debian's own
TORCH_ARGS=
TORCH_PY=
for py in python3 /usr/bin/python3; do
    if command -v "$py" >/dev/null 2>&1 && "$py" -c 'import torch' >/dev/null 2>&1; then
        TORCH_PY=$py
        echo "bench: running bench/torch_bench.py with $py"
        # its micro-benchmarks now; its epoch runs come one by one, each just before mlc's run on
        # as many threads (--torch-cmd), so that each ratio compares the two at the same moment
        if "$py" bench/torch_bench.py $QUICK --no-epochs > "$BUILD/bench_torch.txt"; then
            TORCH_ARGS="--torch $BUILD/bench_torch.txt"
        else
            echo "bench: bench/torch_bench.py failed: the PyTorch column is skipped"
        fi
        break
    fi
done
[ -z "$TORCH_ARGS" ] && echo "bench: no python3 with torch (Debian: apt-get install python3-torch): the PyTorch column is skipped"

# 1-4. mlc (and OpenBLAS), then the table
echo "bench: measuring mlc ..."
if [ -n "$TORCH_ARGS" ]; then
    "$BUILD/bench" $QUICK --rss "$BUILD/bench_rss.txt" $TORCH_ARGS --torch-cmd "$TORCH_PY bench/torch_bench.py" \
        $PLAIN_ARGS
else
    "$BUILD/bench" $QUICK --rss "$BUILD/bench_rss.txt" $PLAIN_ARGS
fi
# CPU time of other processes during the run: all busy ticks minus our own CPU time (`times`:
# the second line is the children's user and system time, as 1m2.5s).
set -- $run_start $(cpu_ticks)
times > "$BUILD/bench_times.txt"    # in this shell: a subshell's children times start at 0
ours=$(awk 'NR == 2 { for (i = 1; i <= 2; i++) { sub(/s$/, "", $i); split($i, t, "m"); s += t[1] * 60 + t[2] } print s }' "$BUILD/bench_times.txt")
if [ "$4" -gt "$2" ] && [ -n "$ours" ]; then
    awk -v busy="$(( $3 - $1 ))" -v total="$(( $4 - $2 ))" -v ours="$ours" -v hz="$(getconf CLK_TCK 2>/dev/null || echo 100)" \
        'BEGIN { p = 100 * (busy - ours * hz) / total; if (p < 0) p = 0
                 printf "bench: other processes used %.0f%% of the CPUs during the run%s\n", p,
                        (p > 10 ? " (the numbers above are disturbed; run again on a quieter machine)" : "") }'
fi
# 7. all-MiniLM-L6-v2 sentence embeddings (when sh tools/fetch_minilm.sh has fetched the model):
# examples/minilm.c built with OpenMP on 1 and 2 threads, and PyTorch on 1 and 2 threads (its
# best counts), on the 32 sentences of bench/minilm_sentences.txt, batches of 32; the median of
# RUNS passes after one warm-up, tokenisation not timed.
MINILM=$BUILD/models/all-MiniLM-L6-v2
RUNS=20
[ -n "$QUICK" ] && RUNS=3
if [ -f "$MINILM/model.safetensors" ]; then
    echo "bench: $CC -O2 -fopenmp -fno-math-errno -std=c99 -I. -o $BUILD/minilm-bench examples/minilm.c -lm"
    $CC -O2 -fopenmp -fno-math-errno -std=c99 -I. -o "$BUILD/minilm-bench" examples/minilm.c -lm
    "$BUILD/minilm-bench" --model "$MINILM" --ids --file bench/minilm_sentences.txt > "$BUILD/minilm_ids.txt"
    sps() { sed -n 's/.* \([0-9.]*\) sentences\/s$/\1/p'; }
    m1=$(OMP_NUM_THREADS=1 "$BUILD/minilm-bench" --model "$MINILM" --file bench/minilm_sentences.txt --bench $RUNS | sps)
    m2=$(OMP_NUM_THREADS=2 "$BUILD/minilm-bench" --model "$MINILM" --file bench/minilm_sentences.txt --bench $RUNS | sps)
    t1=- t2=- others=-
    if [ -n "$TORCH_PY" ] && "$TORCH_PY" bench/torch_bench.py --minilm "$MINILM" "$BUILD/minilm_ids.txt" $RUNS \
           > "$BUILD/bench_minilm_torch.txt"; then
        t1=$(awk '$1 == "minilm_torch_sps_1" { print $2 }' "$BUILD/bench_minilm_torch.txt")
        t2=$(awk '$1 == "minilm_torch_sps_2" { print $2 }' "$BUILD/bench_minilm_torch.txt")
        others=$(awk '$1 == "others_percent" { print $2 }' "$BUILD/bench_minilm_torch.txt")
    fi
    echo
    echo "| all-MiniLM-L6-v2, 32 sentences, batch 32 | mlc 1 thread | mlc 2 threads | PyTorch 1 thread | PyTorch 2 threads | best vs best |"
    echo "|------------------------------------------|-------------:|--------------:|-----------------:|------------------:|-------------:|"
    awk -v m1="$m1" -v m2="$m2" -v t1="$t1" -v t2="$t2" 'BEGIN {
        m = m1 > m2 ? m1 : m2; t = t1 > t2 ? t1 : t2
        printf "| sentences/s (median of passes)           | %12s | %13s | %16s | %17s | %11s |\n",
               m1, m2, t1, t2, (t1 == "-" || t <= 0) ? "-" : sprintf("%.2fx", m / t) }'
    echo "(other processes used $others% of the CPUs during the PyTorch part)"
    # issue 25's MiniLM rows: the model in bf16 (--dtype bf16: every linear and attention product
    # on bf16 weights) beside PyTorch float32 and PyTorch under bf16 autocast, 1 thread; the
    # second target needs AMX or AVX-512 BF16 (mlc's bf16 kernel), else it is skipped
    b1=$(OMP_NUM_THREADS=1 "$BUILD/minilm-bench" --model "$MINILM" --dtype bf16 --file bench/minilm_sentences.txt \
             --bench $RUNS | sps)
    tb1=-
    if [ -n "$TORCH_PY" ] && "$TORCH_PY" bench/torch_bench.py --minilm "$MINILM" "$BUILD/minilm_ids.txt" $RUNS \
           --amp bf16 > "$BUILD/bench_minilm_torch_bf16.txt"; then
        tb1=$(awk '$1 == "minilm_torch_bf16_sps_1" { print $2 }' "$BUILD/bench_minilm_torch_bf16.txt")
    fi
    bf16_cpu=no
    grep -qE '\b(avx512_bf16|amx_bf16)\b' /proc/cpuinfo 2>/dev/null && bf16_cpu=yes
    echo
    echo "| all-MiniLM-L6-v2, 1 thread (issue 25) | sentences/s | mlc bf16 / it | target  | result |"
    echo "|---------------------------------------|------------:|--------------:|---------|--------|"
    awk -v b="$b1" -v m="$m1" -v t="$t1" -v tb="$tb1" -v cpu="$bf16_cpu" 'BEGIN {
        printf "| mlc, the model in bf16 (--dtype bf16) | %11s | %13s | %-7s | %s |\n", b, "-", "", ""
        printf "| mlc float32                           | %11s | %13s | %-7s | %s |\n", m,
               (m > 0 && b > 0) ? sprintf("%.2fx", b / m) : "-", "", ""
        r = (t > 0 && b > 0) ? b / t : 0
        printf "| PyTorch float32                       | %11s | %13s | %-7s | %s |\n", t,
               r ? sprintf("%.2fx", r) : "-", ">= 2x", r ? (r >= 2 ? "met" : "not met") : "-"
        r = (tb > 0 && b > 0) ? b / tb : 0
        printf "| PyTorch under bf16 autocast           | %11s | %13s | %-7s | %s |\n", tb,
               r ? sprintf("%.2fx", r) : "-", ">= 1.5x",
               cpu != "yes" ? "skipped: no AMX or AVX-512 BF16" : r ? (r >= 1.5 ? "met" : "not met") : "-" }'
else
    echo "bench: no model in $MINILM (sh tools/fetch_minilm.sh): the all-MiniLM-L6-v2 row is skipped"
fi
echo "bench: the whole run took $(( $(date +%s) - start )) s"
