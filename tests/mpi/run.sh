#!/bin/sh
# The MPI suite (make test-mpi): tests/mpi/test_mpi.c on 1, 2, 3 and 4 ranks, a resume on 2
# ranks from a checkpoint written on 4, and ranks that fail (exit, an mlc error, a hang, a
# kill): the job must end non-zero within 30 s with a message naming the rank. Ends with
# "N passed, M failed" (every check below counts one; each mpirun of the suite counts its tests).
# With EXAMPLE (build/fashion_mnist_mpi), also that example on 2 ranks: an epoch on 2000 images
# saved, resumed on 1 rank, and a global batch the ranks cannot share refused (exit status 2).
# usage: sh tests/mpi/run.sh BINARY MPIRUN [EXAMPLE]
# Open MPI runs as root (CI) with OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 and
# --oversubscribe (more ranks than cores); MPICH's mpirun oversubscribes by itself.
bin=$1
mpirun=${2:-mpirun}
example=${3:-}
passed=0
failed=0
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mlc-mpi.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
flags=
if "$mpirun" --version 2>&1 | grep -qiE "open ?mpi|open-mpi|openrte"; then
    flags=--oversubscribe
    impl="Open MPI"
else
    impl=MPICH
fi
echo "$mpirun ($impl) $bin"

ok() { echo "ok $1"; passed=$((passed + 1)); }
fail() { echo "FAIL $1"; failed=$((failed + 1)); }

# the suite's own tests, on each number of ranks (summed from its "N passed, M failed")
for n in 1 2 3 4; do
    timeout 120 "$mpirun" $flags -np $n "$bin" >"$tmp/out" 2>&1
    status=$?
    grep -E '^(ok|FAIL) ' "$tmp/out"
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$tmp/out" | tail -1)
    if [ -z "$line" ] || [ $status -ne 0 ]; then
        cat "$tmp/out"
        fail "suite on $n ranks (exit status $status)"
    fi
    if [ -n "$line" ]; then
        passed=$((passed + $(echo "$line" | cut -d' ' -f1)))
        failed=$((failed + $(echo "$line" | cut -d' ' -f3)))
    fi
done

# resume: written on 4 ranks, read on 2, the same losses
if timeout 120 "$mpirun" $flags -np 4 "$bin" --resume write "$tmp/ckpt" "$tmp/losses" >"$tmp/out" 2>&1 &&
   timeout 120 "$mpirun" $flags -np 2 "$bin" --resume read "$tmp/ckpt" "$tmp/losses" >"$tmp/out" 2>&1 &&
   grep -q '^ok resume_on_2_ranks_same_losses' "$tmp/out"; then
    ok "resume_on_2_ranks_from_a_checkpoint_written_on_4"
else
    cat "$tmp/out"
    fail "resume_on_2_ranks_from_a_checkpoint_written_on_4"
fi

# a failing rank: MODE, ranks, the words its message must hold
failure() {
    start=$(date +%s)
    timeout 60 "$mpirun" $flags -np "$2" "$bin" "$1" 3 >"$tmp/out" 2>&1
    status=$?
    took=$(( $(date +%s) - start ))
    if [ $status -ne 0 ] && [ $status -ne 124 ] && [ $took -le 30 ] && grep -q "$3" "$tmp/out"; then
        said=$(grep -m1 "$3" "$tmp/out")
        ok "a rank failing ($1 3, $2 ranks) ends the job in $took s, status $status: $said"
    else
        cat "$tmp/out"
        fail "a rank failing ($1 3, $2 ranks): status $status after $took s, message '$3' wanted"
    fi
}
failure --exit-at 3 "mlc_mpi: rank 1 of 3 .*exited"
failure --error-at 3 "mlc_mpi: rank 2 of 3 .*failed in mlc_ddp_backward: mlc_linear"
failure --hang-at 3 "mlc_mpi: rank [01] of 3 .*waited 5 s"
# a rank killed by a signal: mpirun reports it (Open MPI names the rank; MPICH gives its pid)
if [ "$impl" = "Open MPI" ]; then failure --kill-at 3 "process rank 1 .*signal 9"
else failure --kill-at 3 "BAD TERMINATION"; fi

# the example (Fashion-MNIST from Debian's dataset-fashion-mnist)
if [ -n "$example" ]; then
    data=/usr/share/datasets/fashion-mnist
    if [ ! -f "$data/train-images-idx3-ubyte.gz" ]; then
        echo "SKIPPED example: no $data (install dataset-fashion-mnist)"
        if [ "${CI:-}" = "true" ]; then fail "the example may not be skipped in CI"; fi
    else
        run="timeout 120 $mpirun $flags"
        if $run -np 2 "$example" --limit 2000 --epochs 1 --save "$tmp/fm.ckpt" >"$tmp/out" 2>&1 &&
           grep -q '^epoch  1/1 ' "$tmp/out" &&
           $run -np 1 "$example" --limit 2000 --epochs 2 --resume "$tmp/fm.ckpt" >"$tmp/out2" 2>&1 &&
           grep -q 'resumed from .* after epoch 1' "$tmp/out2" && grep -q '^epoch  2/2 ' "$tmp/out2"; then
            ok "example: $(grep '^epoch  1/1 ' "$tmp/out")"
        else
            cat "$tmp/out" "$tmp/out2" 2>/dev/null
            fail "example: an epoch on 2 ranks, resumed on 1"
        fi
        $run -np 2 "$example" --batch 3 >"$tmp/out" 2>&1
        status=$?
        if [ $status -eq 2 ] && grep -q 'not a multiple of the 2 ranks' "$tmp/out"; then
            ok "example: --batch 3 on 2 ranks refused (status 2)"
        else
            cat "$tmp/out"
            fail "example: --batch 3 on 2 ranks gave status $status"
        fi
    fi
fi

echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
