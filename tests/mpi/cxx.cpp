// mlc_mpi.h compiles as C++ (make test-mpi builds this with the MPI's C++ wrapper, warnings as
// errors): its implementation included after mlc.h's, as a C++ program would.
#define MLC_IMPLEMENTATION
#include "mlc.h"
#include "mlc_mpi.h"

int main(int argc, char **argv) {
    mlc_mpi mpi;
    if (mlc_mpi_init(&argc, &argv, &mpi) != MLC_OK) return 1;
    mlc_dist_sampler_opts opts = { 1, 7, 0 };
    mlc_dist_sampler *s = mlc_dist_sampler_create(&mpi, 10, opts);
    int ok = s && mlc_dist_sampler_count(s) > 0;
    mlc_dist_sampler_free(s);
    mlc_mpi_finalize(&mpi);
    return ok ? 0 : 1;
}
