#!/bin/sh
# The MPI suite (make test-mpi): tests/mpi/test_mpi.c on 1, 2, 3 and 4 ranks, a resume on 2
# ranks from a checkpoint written on 4, and ranks that fail (exit, an mlc error, a hang, a
# kill): the job must end non-zero within 30 s with a message naming the rank. Ends with
# "N passed, M failed" (every check below counts one; each mpirun of the suite counts its tests).
# usage: sh tests/mpi/run.sh BINARY MPIRUN
# Open MPI runs as root (CI) with OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 and
# --oversubscribe (more ranks than cores); MPICH's mpirun oversubscribes by itself.
bin=$1
mpirun=${2:-mpirun}
passed=0
failed=0
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mlc-mpi.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
flags=
if "$mpirun" --version 2>&1 | grep -qiE "open ?mpi|open-mpi|openrte"; then flags=--oversubscribe; impl="Open MPI"; else impl=MPICH; fi
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
        ok "a rank failing ($1 3, $2 ranks) ends the job in $took s with status $status: $(grep -m1 "$3" "$tmp/out")"
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

echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
