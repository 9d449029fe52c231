#!/bin/sh
# Data parallelism over MPI (issue 27), from one run: a whole Fashion-MNIST training epoch
# (60,000 images, examples/fashion_mnist_mpi.c) of the CNN (global batch 64) and the MLP (128)
#   - on 2 ranks x 1 thread, on 1 rank x 1 thread (the same global batch), and on 1 process x 2
#     of mlc's own threads; the ratios of epoch times, medians of REPEAT runs taken in turn;
#   - the share of the step a rank waits on MPI after its backward (median of the 2-rank runs);
#   - overlap: backward with its all-reduces / (backward alone + the all-reduces alone), from
#     the medians and from the fastest of 15 steps each, default buckets and 0.25 MiB buckets.
# usage: sh bench/mpi.sh BINARY   (make bench-mpi; MPIRUN=mpirun.mpich, REPEAT=3)
# Ranks are not bound to cores (--bind-to none for Open MPI), as the threads of one process are not.
bin=${1:-build/fashion_mnist_mpi}
mpirun=${MPIRUN:-mpirun}
repeat=${REPEAT:-3}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
flags=
if "$mpirun" --version 2>&1 | grep -qiE "open ?mpi|open-mpi|openrte"; then
    flags="--oversubscribe --bind-to none"
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mlc-bench-mpi.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)] }'; }

# run NAME NP THREADS MODEL: one epoch, its seconds and MPI wait share appended to $tmp/NAME
run() {
    $mpirun $flags -np "$2" "$bin" --model "$4" --epochs 1 --threads "$3" >"$tmp/out" 2>&1 ||
        { cat "$tmp/out"; exit 1; }
    sed -n 's/^epoch  1\/1 .* \([0-9.]*\) s (.*MPI wait \([0-9.]*\)%)$/\1 \2/p' "$tmp/out" >>"$tmp/$1"
}

echo "bench/mpi.sh: $(uname -m), $(nproc) CPUs, $("$mpirun" --version 2>&1 | head -1)," \
     "load average $(cut -d' ' -f1-3 /proc/loadavg)"
for model in cnn mlp; do
    i=0
    while [ $i -lt "$repeat" ]; do
        run "$model-1x1" 1 1 $model
        run "$model-2x1" 2 1 $model
        run "$model-1x2" 1 2 $model
        i=$((i + 1))
    done
    one=$(cut -d' ' -f1 "$tmp/$model-1x1" | median)
    two=$(cut -d' ' -f1 "$tmp/$model-2x1" | median)
    threads=$(cut -d' ' -f1 "$tmp/$model-1x2" | median)
    wait=$(cut -d' ' -f2 "$tmp/$model-2x1" | median)
    echo "$model epoch: 1 rank x 1 thread $one s, 2 ranks x 1 thread $two s," \
         "1 process x 2 threads $threads s (medians of $repeat)"
    awk -v a="$one" -v b="$two" -v c="$threads" -v w="$wait" -v m="$model" 'BEGIN {
        printf "%s: 2 ranks x 1 thread / 1 rank x 1 thread: %.2fx;", m, a / b
        printf " 2 ranks x 1 thread / 1 process x 2 threads: %.2fx;", c / b
        printf " waiting on MPI %.1f%% of the step\n", w }'
done
for model in cnn mlp; do
    for mb in 0 0.25; do
        extra=
        [ "$mb" = 0 ] || extra="--bucket-mb $mb"
        $mpirun $flags -np 2 "$bin" --model $model --epochs 1 --limit 4096 --overlap $extra \
            >"$tmp/out" 2>&1 ||
            { cat "$tmp/out"; exit 1; }
        buckets=$(grep -o '[0-9]* buckets\?' "$tmp/out" | head -1)
        grep '^overlap' "$tmp/out" | while read -r line; do
            size=$([ "$mb" = 0 ] && echo "default buckets" || echo "$mb MiB buckets")
            echo "$model, 2 ranks, $size ($buckets): $line"
        done
    done
done
