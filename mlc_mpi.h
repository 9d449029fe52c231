/* mlc_mpi.h - data-parallel training over MPI for mlc - MIT licence (see LICENSE)

   DO THIS in the one .c file that defines MLC_IMPLEMENTATION, after mlc.h:
       #define MLC_IMPLEMENTATION
       #include "mlc.h"
       #include "mlc_mpi.h"
   and build with your MPI's compiler wrapper (mpicc; any MPI-3 library: Open MPI, MPICH, the
   vendors' builds). Other files include both headers without the define. mlc.h names no MPI.

   QUICK START (PyTorch's DistributedDataParallel, the same names where there are some)
       mlc_mpi mpi;
       if (mlc_mpi_init(&argc, &argv, &mpi) != MLC_OK) return 1;
       mlc_ctx *ctx = mlc_create(&(mlc_config){ .seed = 1 });
       mlc_module *net = make_model(ctx);                     the same model on every rank
       mlc_optim *opt = mlc_adam(ctx, net, (mlc_adam_opts){ .lr = 1e-3f });
       mlc_ddp *ddp = mlc_ddp_wrap(&mpi, net, (mlc_ddp_opts){ 0 });   rank 0's weights everywhere
       mlc_mpi_check(&mpi, ctx, "wrap");                     a failure ends the whole job
       mlc_dist_sampler *s = mlc_dist_sampler_create(&mpi, n, (mlc_dist_sampler_opts){ .shuffle = 1 });
       for (epoch ...) {
           mlc_dist_sampler_set_epoch(s, epoch);
           for (int step = 0; step < mlc_dist_sampler_steps(s, B, 0); step++) {
               mlc_frame f = mlc_frame_begin(ctx);
               mlc_dist_sampler_batch(s, x, y, step, B, &bx, &by);   this rank's B rows
               mlc_tensor *loss = mlc_cross_entropy(mlc_ddp_forward(ddp, bx), by, ...);
               mlc_zero_grad(opt);
               mlc_ddp_backward(ddp, loss);                   gradients averaged over the ranks
               mlc_step(opt);                                  the same step on every rank
               mlc_frame_end(f);
           }
       }
       mlc_ddp_free(ddp); mlc_destroy(ctx); mlc_mpi_finalize(&mpi);
   Run it with mpirun -np 4 ./train (or srun under Slurm; README, "More than one machine").

   WHAT IT DOES
   - mlc_ddp_wrap checks that every rank built the same model (a fingerprint of the names,
     shapes and dtypes of its parameters and buffers; a mismatch is an error on every rank, and
     the rank that differs names the first tensor that does), then broadcasts rank 0's
     parameters and buffers.
   - mlc_ddp_backward runs mlc_backward with mlc's grad-ready hook: gradients are grouped into
     buckets of at most bucket_cap_mb (25 MiB by default, the first at most 1 MiB) in reverse
     registration order, and a bucket's MPI_Iallreduce starts as soon as its last gradient is
     complete (buckets start in their order on every rank, as MPI requires), so sending
     overlaps the rest of backward.
     Before it returns it waits for every bucket and writes the average over the ranks into the
     gradients: the optimiser's step, the same on every rank, keeps the ranks' parameters
     bitwise equal. A parameter the backward never reached (unused in this step, PyTorch's
     find_unused_parameters) sends the gradient it holds (zeros after mlc_zero_grad). On one
     rank it is mlc_backward. A rank that waits polls MPI, then naps between polls (nanosleep
     where declared), so it gives its core to a rank it waits for on a crowded machine.
   - mlc_ddp_no_sync(ddp, 1): backwards only accumulate locally (gradient accumulation); the
     next backward with it off averages the sums.
   - mlc_ddp_forward broadcasts rank 0's buffers (BatchNorm's running statistics) before the
     forward, as PyTorch's broadcast_buffers=True; a BatchNorm's batch statistics are each
     rank's own unless mlc_ddp_sync_batch_norm makes them SyncBatchNorm's.
   - Device tensors (OpenCL) go through host buffers: no GPU-aware MPI is assumed.
     mlc_mpi_device picks "opencl:K" by local rank when a node has several GPUs.
   - The data: mlc_dist_sampler is torch.utils.data.DistributedSampler: the same shuffle of
     0..n-1 for a given (seed, epoch) on every rank, rank r takes positions r, r + W, ...,
     padded by repeating the start (or, drop_last, cut) so every rank has as many. A global
     step s covers the same samples whatever the number of ranks W when the per-rank batch is
     global / W, so a checkpoint (epoch, step) resumes on another number of ranks.
   - Checkpoints: mlc_ddp_checkpoint_save writes on rank 0 only (mlc_checkpoint_save, atomic)
     and every rank returns rank 0's result; mlc_ddp_checkpoint_load reads on every rank.
   - Failure: mlc_mpi_check(mpi, ctx, what) ends the whole job (MPI_Abort, exit status 1) with
     a message naming the rank, its host and mlc's error when the context holds one. mlc_ddp_*
     check for themselves: an mlc error in a backward, an MPI error (the library's
     communicator returns errors: MPI_ERRORS_RETURN), or a bucket that waits longer than
     timeout_s (a rank that hangs or took another path) aborts the job with a message. A rank
     that calls exit() between mlc_mpi_init and mlc_mpi_finalize aborts the job from an atexit
     handler, naming itself; a rank killed by a signal is reported by mpirun, which ends the
     job. A message of a rank that failed goes to stderr as one line starting "mlc_mpi: rank".

   LIMITS: float32 parameters (autocast keeps float32 master weights: fine); one DDP wrapper
   per context at a time (it owns the context's grad-ready hook during mlc_ddp_backward);
   SyncBatchNorm takes its statistics from float32 sums per rank (added in double), and at
   most 64 of them (two a module) wait for a backward; no gradient compression, no
   rebuilding of buckets from the order gradients arrive in (PyTorch's after its first step). */
#ifndef MLC_MPI_H
#define MLC_MPI_H
#if defined(__cplusplus) && !defined(OMPI_SKIP_MPICXX)
#define OMPI_SKIP_MPICXX 1              /* the C API only: no MPI-2 C++ bindings (removed in MPI-3) */
#endif
#if defined(__cplusplus) && !defined(MPICH_SKIP_MPICXX)
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>
#include <stdint.h>
#include <stddef.h>
#ifndef MLC_H
#error "include mlc.h before mlc_mpi.h"
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ============================================================================================
   @section mpi-api  Public API: the job, data-parallel modules, samplers, metrics, checkpoints
   ============================================================================================ */

/* One process's place in the job. comm is the library's own duplicate of MPI_COMM_WORLD (its
   errors are returned, not fatal); local_rank and local_size count the ranks on this node. */
typedef struct mlc_mpi {
    MPI_Comm comm;
    int rank, size, local_rank, local_size;
    char host[MPI_MAX_PROCESSOR_NAME];
    int initialized_mpi;                /* 1: mlc_mpi_init called MPI_Init (finalize ends it) */
} mlc_mpi;

/* MPI_Init when MPI is not initialised yet, then the fields above. MLC_ERR_DEVICE (with a
   message on stderr) when MPI fails. From here until mlc_mpi_finalize, a rank that calls exit()
   aborts the job (naming itself) instead of leaving the other ranks waiting. */
MLCDEF mlc_result mlc_mpi_init(int *argc, char ***argv, mlc_mpi *mpi);
MLCDEF void mlc_mpi_finalize(mlc_mpi *mpi);
/* A device name for mlc_config.device: "opencl:K" for this rank's GPU (the local rank's turn
   among the node's GPUs) when the node has at least one OpenCL GPU, else "cpu". */
MLCDEF const char *mlc_mpi_device(const mlc_mpi *mpi, char *buf, size_t cap);
/* Ends the whole job when ctx holds an error (or ctx is NULL): prints "mlc_mpi: rank R of W
   (host H) failed in WHAT: <mlc's message>" and calls MPI_Abort (exit status 1). Returns only
   when all is well. */
MLCDEF void mlc_mpi_check(const mlc_mpi *mpi, mlc_ctx *ctx, const char *what);
/* Ends the whole job with "mlc_mpi: rank R of W (host H): <message>". */
MLCDEF void mlc_mpi_fail(const mlc_mpi *mpi, const char *fmt, ...);
/* Metrics for printing: values[0..n) summed over the ranks, in place (every rank gets the
   sums); the mean of one value; the sum of a count. An MPI failure ends the job. */
MLCDEF void mlc_mpi_allreduce_sum(const mlc_mpi *mpi, double *values, int n);
MLCDEF double mlc_mpi_mean(const mlc_mpi *mpi, double value);
MLCDEF double mlc_mpi_sum(const mlc_mpi *mpi, double value);
MLCDEF void mlc_mpi_barrier(const mlc_mpi *mpi);

typedef struct mlc_ddp mlc_ddp;
typedef struct mlc_ddp_opts {           /* zero means default for every field */
    float bucket_cap_mb;                /* a bucket's most (MiB; 25; the first: 1 MiB at most, as
                                           PyTorch's). MLC_ZERO: one parameter each */
    int no_broadcast_buffers;           /* 1: each rank keeps its own buffers (broadcast_buffers=False) */
    double timeout_s;                   /* a bucket waiting longer ends the job (300 s) */
} mlc_ddp_opts;
typedef struct mlc_ddp_stats {
    long long steps;                    /* synchronised backwards                          */
    long long buckets, bytes;           /* all-reduces started and bytes they carried      */
    double backward_s;                  /* in mlc_ddp_backward, all of it                  */
    double wait_s;                      /* of that, after mlc_backward: finishing buckets  */
    int n_buckets;                      /* buckets of the model                            */
} mlc_ddp_stats;

/* Wrap m (its parameters and buffers as mlc_module_state lists them) for data-parallel
   training on mpi's ranks: checks the fingerprint, broadcasts rank 0's state and gives every
   parameter a gradient buffer. Collective (every rank calls it). NULL on error, with the
   context's error saying why (mismatched models: on every rank, naming the tensor). */
MLCDEF mlc_ddp *mlc_ddp_wrap(const mlc_mpi *mpi, mlc_module *m, mlc_ddp_opts opts);
MLCDEF void mlc_ddp_free(mlc_ddp *ddp);     /* SyncBatchNorm modules become BatchNorm again */
MLCDEF mlc_module *mlc_ddp_module(const mlc_ddp *ddp);
/* mlc_forward(m, x) after broadcasting rank 0's buffers (unless no_broadcast_buffers). */
MLCDEF mlc_tensor *mlc_ddp_forward(mlc_ddp *ddp, mlc_tensor *x);
/* mlc_backward(loss), then the gradients averaged over the ranks (none under no_sync). An mlc
   error in the backward ends the job (mlc_mpi_check). Collective. */
MLCDEF mlc_result mlc_ddp_backward(mlc_ddp *ddp, mlc_tensor *loss);
MLCDEF int mlc_ddp_no_sync(mlc_ddp *ddp, int on);     /* returns the previous setting */
/* torch.nn.SyncBatchNorm.convert_sync_batchnorm: every BatchNorm in the wrapped module, at any
   depth, normalises in training with the mean and variance of all ranks' batches together
   (two small all-reduces in its forward, two more in backward, on a communicator of their own),
   and its running statistics follow them, so W ranks of batch B train as one process of batch
   W·B. Eval mode is BatchNorm's. Collective from here on: every rank runs the same forwards, in
   training, in the same order, each followed by its mlc_ddp_backward before the next forward.
   Returns how many modules it converted (their type becomes "SyncBatchNorm"). */
MLCDEF int mlc_ddp_sync_batch_norm(mlc_ddp *ddp);
MLCDEF mlc_ddp_stats mlc_ddp_get_stats(const mlc_ddp *ddp);
/* Sum every bucket as a backward does (MPI_Iallreduce in bucket order, then the same wait), with
   no backward: what the all-reduces cost alone, in seconds (benchmarks; the gradients are left
   alone, the stats do not count them). Collective. */
MLCDEF double mlc_ddp_time_allreduce(mlc_ddp *ddp);
/* Checkpoints (mlc_checkpoint_save's file): rank 0 writes and every rank gets its result;
   every rank loads, and an error on any rank is an error on every rank. Collective. */
MLCDEF mlc_result mlc_ddp_checkpoint_save(mlc_ddp *ddp, const char *path, mlc_optim *opt,
                                          const mlc_train_state *state);
MLCDEF mlc_result mlc_ddp_checkpoint_load(mlc_ddp *ddp, const char *path, mlc_optim *opt,
                                          mlc_train_state *state);

/* torch.utils.data.DistributedSampler over n samples */
typedef struct mlc_dist_sampler mlc_dist_sampler;
typedef struct mlc_dist_sampler_opts {
    int shuffle;                        /* 1: a permutation drawn from (seed, epoch) */
    uint64_t seed;
    int drop_last;                      /* 1: cut the tail so the ranks share it evenly; else pad */
} mlc_dist_sampler_opts;
MLCDEF mlc_dist_sampler *mlc_dist_sampler_create(const mlc_mpi *mpi, int n, mlc_dist_sampler_opts opts);
/* The same with an explicit rank and world size (tests; one process planning for W ranks). */
MLCDEF mlc_dist_sampler *mlc_dist_sampler_create_for(int rank, int world, int n, mlc_dist_sampler_opts opts);
MLCDEF void mlc_dist_sampler_free(mlc_dist_sampler *s);
MLCDEF void mlc_dist_sampler_set_epoch(mlc_dist_sampler *s, long long epoch);
MLCDEF int mlc_dist_sampler_count(const mlc_dist_sampler *s);        /* samples of this rank */
MLCDEF const int *mlc_dist_sampler_indices(const mlc_dist_sampler *s);   /* this rank's, this epoch */
/* Batches of batch_size of this rank's samples per epoch; drop_last_batch 1 leaves out a short
   last one. */
MLCDEF int mlc_dist_sampler_steps(const mlc_dist_sampler *s, int batch_size, int drop_last_batch);
/* This rank's batch number step of the epoch: rows of x [N, ...] and y [N, ...] (y may be NULL)
   as new tensors in the current frame. 1, or 0 past the end or on an error (the context's). */
MLCDEF int mlc_dist_sampler_batch(mlc_dist_sampler *s, mlc_tensor *x, mlc_tensor *y, int step,
                                  int batch_size, mlc_tensor **bx, mlc_tensor **by);

#ifdef __cplusplus
}
#endif
#endif /* MLC_MPI_H */

/* ============================================================================================
   @section mpi-implementation  Implementation (with mlc's, in the file that defines
   MLC_IMPLEMENTATION: it keeps a device gradient's books with mlc's own helpers)
   ============================================================================================ */
#if defined(MLC_IMPLEMENTATION) && !defined(MLC_MPI_IMPLEMENTATION_DONE)
#define MLC_MPI_IMPLEMENTATION_DONE
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
/* Waiting for another rank: MPI polls, and a rank that polls keeps its core while the rank it
   waits for may be waiting for one (more ranks or other programs than cores). A waiting rank
   yields its core between polls (sched_yield: at once back when nothing else wants it) for
   MLC_MPI__SPIN_S, then naps 20 µs between polls, where nanosleep and sched_yield are declared
   (POSIX; glibc says so in __USE_POSIX199309, fixed when its first header came in), else it
   polls on. Napping sooner costs the step: a nap lasts some 60 µs (the timer's slack) and an
   all-reduce of a few hundred thousand floats needs both ranks' polls for each of its rounds
   (bench/RESULTS.md: napping after 200 µs cost the CNN's epoch on 2 ranks about 7 %). */
#define MLC_MPI__SPIN_S 0.01
#if defined(__GLIBC__) ? defined(__USE_POSIX199309) : defined(__APPLE__) || (defined(__unix__) && \
    (defined(_POSIX_C_SOURCE) || defined(_GNU_SOURCE) || defined(_DEFAULT_SOURCE) || defined(_BSD_SOURCE)))
#include <sched.h>
#define MLC_MPI__NAP() do { struct timespec nap_ = { 0, 20000 }; nanosleep(&nap_, NULL); } while (0)
#define MLC_MPI__YIELD() ((void)sched_yield())
#else
#define MLC_MPI__NAP() ((void)0)
#define MLC_MPI__YIELD() ((void)0)
#endif

/* ---- The job: start, failure, metrics ------------------------------------------------------ */

/* The job the atexit guard ends: a copy (the caller's mlc_mpi may be gone by then, on main's
   stack), live from mlc_mpi_init to mlc_mpi_finalize */
static mlc_mpi mlc_mpi__job;
static int mlc_mpi__live;

static void mlc_mpi__abort(const mlc_mpi *mpi, const char *message) {
    int rank = 0, size = 1;
    const char *host = "?";
    if (mpi) { rank = mpi->rank; size = mpi->size; host = mpi->host; }
    double start;
    fprintf(stderr, "mlc_mpi: rank %d of %d (host %s): %s; ending the job\n", rank, size, host, message);
    fflush(stderr);
    fflush(stdout);
    start = MPI_Wtime();                /* 0.2 s for the launcher to pass the line on (MPICH's */
    while (MPI_Wtime() - start < 0.2)   /* mpiexec sometimes lost it to the abort) */
        MLC_MPI__NAP();
    MPI_Abort(MPI_COMM_WORLD, 1);
}

/* exit() between init and finalize: the other ranks would wait for this one in their next
   collective, so the job ends here, with this rank named. */
static void mlc_mpi__atexit(void) {
    int finalized = 0, initialized = 0;
    if (!mlc_mpi__live) return;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (initialized && !finalized)
        mlc_mpi__abort(&mlc_mpi__job, "exited (exit() or a return from main) before mlc_mpi_finalize");
}

MLCDEF void mlc_mpi_fail(const mlc_mpi *mpi, const char *fmt, ...) {
    char message[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    mlc_mpi__abort(mpi, message);
}

MLCDEF void mlc_mpi_check(const mlc_mpi *mpi, mlc_ctx *ctx, const char *what) {
    if (!ctx) mlc_mpi_fail(mpi, "failed in %s: no context (mlc_create failed)", what ? what : "?");
    else if (mlc_error(ctx))
        mlc_mpi_fail(mpi, "failed in %s: %s", what ? what : "?", mlc_error_message(ctx));
}

/* An MPI call's result: anything but MPI_SUCCESS ends the job with MPI's words for it. */
static void mlc_mpi__ok(const mlc_mpi *mpi, int rc, const char *call) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (rc == MPI_SUCCESS) return;
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) snprintf(text, sizeof text, "error %d", rc);
    mlc_mpi_fail(mpi, "%s failed: %s", call, text);
}

MLCDEF mlc_result mlc_mpi_init(int *argc, char ***argv, mlc_mpi *mpi) {
    int initialized = 0, len = 0, rc;
    MPI_Comm node;
    if (!mpi) return MLC_ERR_NULL;
    memset(mpi, 0, sizeof *mpi);
    MPI_Initialized(&initialized);
    if (!initialized) {
        if (MPI_Init(argc, argv) != MPI_SUCCESS) {
            fprintf(stderr, "mlc_mpi: MPI_Init failed\n");
            return MLC_ERR_DEVICE;
        }
        mpi->initialized_mpi = 1;
    }
    rc = MPI_Comm_dup(MPI_COMM_WORLD, &mpi->comm);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_set_errhandler(mpi->comm, MPI_ERRORS_RETURN);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(mpi->comm, &mpi->rank);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_size(mpi->comm, &mpi->size);
    if (rc == MPI_SUCCESS) rc = MPI_Get_processor_name(mpi->host, &len);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_split_type(mpi->comm, MPI_COMM_TYPE_SHARED, mpi->rank,
                                                    MPI_INFO_NULL, &node);
    if (rc == MPI_SUCCESS) {
        MPI_Comm_rank(node, &mpi->local_rank);
        MPI_Comm_size(node, &mpi->local_size);
        MPI_Comm_free(&node);
    }
    if (rc != MPI_SUCCESS) {
        fprintf(stderr, "mlc_mpi: setting up the library's communicator failed (MPI error %d)\n", rc);
        return MLC_ERR_DEVICE;
    }
    if (!mlc_mpi__live) {
        static int registered;
        if (!registered) registered = atexit(mlc_mpi__atexit) == 0;
        mlc_mpi__job = *mpi;
        mlc_mpi__live = 1;
    }
    return MLC_OK;
}

MLCDEF void mlc_mpi_finalize(mlc_mpi *mpi) {
    if (!mpi) return;
    if (mlc_mpi__live && mlc_mpi__job.comm == mpi->comm) mlc_mpi__live = 0;
    if (mpi->comm != MPI_COMM_NULL && mpi->comm != MPI_COMM_WORLD) MPI_Comm_free(&mpi->comm);
    if (mpi->initialized_mpi) {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!finalized) MPI_Finalize();
    }
}

MLCDEF const char *mlc_mpi_device(const mlc_mpi *mpi, char *buf, size_t cap) {
    mlc_device_info info[16];
    int n = mlc_devices(info, 16), gpus = 0, i, want;
    if (!buf || !cap) return NULL;
    if (n > 16) n = 16;
    for (i = 0; i < n; i++) gpus += !strcmp(info[i].type, "gpu");
    snprintf(buf, cap, "cpu");
    if (!gpus) return buf;
    want = (mpi ? mpi->local_rank : 0) % gpus;
    for (i = 0; i < n; i++)
        if (!strcmp(info[i].type, "gpu") && want-- == 0) {
            snprintf(buf, cap, "opencl:%d", info[i].index);
            break;
        }
    return buf;
}

MLCDEF void mlc_mpi_allreduce_sum(const mlc_mpi *mpi, double *values, int n) {
    mlc_mpi__ok(mpi, MPI_Allreduce(MPI_IN_PLACE, values, n, MPI_DOUBLE, MPI_SUM, mpi->comm), "MPI_Allreduce");
}
MLCDEF double mlc_mpi_sum(const mlc_mpi *mpi, double value) {
    mlc_mpi_allreduce_sum(mpi, &value, 1);
    return value;
}
MLCDEF double mlc_mpi_mean(const mlc_mpi *mpi, double value) {
    return mlc_mpi_sum(mpi, value) / mpi->size;
}
MLCDEF void mlc_mpi_barrier(const mlc_mpi *mpi) {
    mlc_mpi__ok(mpi, MPI_Barrier(mpi->comm), "MPI_Barrier");
}

/* ---- Data-parallel modules ------------------------------------------------------------------
   Parameters are numbered in reverse registration order (the order backward tends to finish
   them in) and laid out back to back in buckets; bucket b holds parameters first[b] ..
   first[b + 1] - 1, its floats in buf[b]. A report from the grad-ready hook copies the gradient
   into its place; the bucket whose last gradient arrived, and every full bucket after the last
   started one, start their MPI_Iallreduce in bucket order. */

struct mlc_ddp {
    const mlc_mpi *mpi;
    mlc_module *module;
    mlc_ctx *ctx;
    mlc_ddp_opts opts;
    int n_params, n_buffers, n_buckets;
    mlc_tensor **params;                /* reverse registration order */
    mlc_tensor **buffers;
    size_t *offset;                     /* a parameter's first float in its bucket */
    int *bucket_of, *first;             /* parameter -> bucket; bucket -> its first parameter */
    float **buf;                        /* per bucket */
    size_t *floats;                     /* per bucket */
    MPI_Request *req;                   /* per bucket */
    MPI_Status *status;                 /* per bucket (MPICH's headers make GCC 12 warn about
                                           MPI_STATUSES_IGNORE in MPI_Testall) */
    int *missing;                       /* per bucket: gradients not yet copied this backward */
    unsigned char *reported;            /* per parameter, this backward */
    int next_start;                     /* the first bucket not started */
    int next_guess;                     /* where the hook looks first */
    int no_sync;
    mlc_ddp_stats stats;
    MPI_Comm bn_comm;                   /* SyncBatchNorm's own communicator (or MPI_COMM_NULL) */
    int n_sync_bn;                      /* modules converted */
    mlc_forward_fn bn_forward;          /* BatchNorm's own forward, for mlc_ddp_free to put back */
    struct mlc_mpi__bn_pending {        /* SyncBatchNorm forwards waiting for their backward: */
        mlc_tensor *tap, *sum;          /* a zero leaf whose report says `sum`'s gradient is */
    } pending[64];                      /* whole; `sum` is a per-channel sum over this rank */
    int n_pending;
};

static double mlc_mpi__now(void) { return MPI_Wtime(); }

/* dst = src / ranks over n floats (summed gradients averaged), apart: in runs of a count the
   compiler knows, so that it vectorises at plain -O2 (a scalar division a float took 7 % of an
   MLP's training on 2 ranks) */
static void mlc_mpi__average(float *MLC__RESTRICT dst, const float *MLC__RESTRICT src, size_t n,
                             float ranks) {
    size_t j;
    MLC__VECTOR_LOOP_OF(8, j, 0, n, { dst[j] = src[j] / ranks; });
}

/* A parameter's gradient buffer on the host, made where the parameter has none yet (a zero
   backward through it), current. NULL on error. */
static float *mlc_mpi__grad_buffer(mlc_tensor *p) {
    float *g = mlc_host_grad(p);
    if (!g && !mlc_error(p->ctx)) {
        mlc_frame f = mlc_frame_begin(p->ctx);
        int was = mlc_set_grad_enabled(p->ctx, 1);
        mlc_backward(mlc_mul_scalar(mlc_sum_all(p), 0.0f));
        mlc_set_grad_enabled(p->ctx, was);
        mlc_frame_end(f);
        g = mlc_host_grad(p);
    }
    return g;
}

/* The fingerprint: "name dtype [shape];" for every state tensor, in order */
static char *mlc_mpi__fingerprint(mlc_named_tensor *state, int n, size_t *len) {
    size_t cap = 64, used = 0;
    char *text = (char *)malloc(cap), line[256];
    int i, k;
    for (i = 0; text && i < n; i++) {
        mlc_tensor *t = state[i].tensor;
        int at = snprintf(line, sizeof line, "%s %s [", state[i].name, mlc_dtype_name(mlc_dtype(t)));
        for (k = 0; k < t->ndim && at < (int)sizeof line - 16; k++)
            at += snprintf(line + at, sizeof line - (size_t)at, k ? ", %d" : "%d", t->shape[k]);
        at += snprintf(line + at, sizeof line - (size_t)at, "];");
        if (used + (size_t)at + 1 > cap) {
            char *grown;
            while (used + (size_t)at + 1 > cap) cap *= 2;
            grown = (char *)realloc(text, cap);
            if (!grown) { free(text); return NULL; }
            text = grown;
        }
        memcpy(text + used, line, (size_t)at + 1);
        used += (size_t)at;
    }
    if (len) *len = used;
    return text;
}

/* The first entry ("name ...;") where a and b differ, into out */
static void mlc_mpi__first_difference(const char *a, const char *b, char *out, size_t cap) {
    const char *ea, *eb;
    for (;;) {
        ea = strchr(a, ';');
        eb = strchr(b, ';');
        if (!ea || !eb) break;
        if (ea - a != eb - b || memcmp(a, b, (size_t)(ea - a))) break;
        a = ea + 1;
        b = eb + 1;
    }
    if (!ea && !eb) snprintf(out, cap, "(none found)");
    else if (!eb) snprintf(out, cap, "rank 0 has no tensor where this rank has %.*s", (int)(ea - a), a);
    else if (!ea) snprintf(out, cap, "this rank has no tensor where rank 0 has %.*s", (int)(eb - b), b);
    else snprintf(out, cap, "this rank has %.*s where rank 0 has %.*s", (int)(ea - a), a, (int)(eb - b), b);
}

static void mlc_mpi__fail_ctx(mlc_ctx *ctx, mlc_result code, const char *message) {
    mlc_set_error(ctx, code, message);
}

/* The fingerprints of every rank against rank 0's; 1 when they all agree. A rank that differs
   says where in its context's error; the others say which ranks differ. */
static int mlc_mpi__same_model(const mlc_mpi *mpi, mlc_ctx *ctx, mlc_named_tensor *state, int n) {
    size_t len = 0;
    char *mine = mlc_mpi__fingerprint(state, n, &len), *root = NULL, message[768], where[600];
    long long root_len = (long long)len;
    int differs, bad_ranks = 0, first_bad = -1, *all = NULL, i;
    if (!mine) mlc_mpi_fail(mpi, "mlc_ddp_wrap: out of memory");
    mlc_mpi__ok(mpi, MPI_Bcast(&root_len, 1, MPI_LONG_LONG, 0, mpi->comm), "MPI_Bcast");
    root = (char *)malloc((size_t)root_len + 1);
    if (!root) mlc_mpi_fail(mpi, "mlc_ddp_wrap: out of memory");
    if (mpi->rank == 0) memcpy(root, mine, (size_t)root_len);
    mlc_mpi__ok(mpi, MPI_Bcast(root, (int)root_len, MPI_CHAR, 0, mpi->comm), "MPI_Bcast");
    root[root_len] = 0;
    differs = strcmp(root, mine) != 0;
    all = (int *)malloc(sizeof(int) * (size_t)mpi->size);
    if (!all) mlc_mpi_fail(mpi, "mlc_ddp_wrap: out of memory");
    mlc_mpi__ok(mpi, MPI_Allgather(&differs, 1, MPI_INT, all, 1, MPI_INT, mpi->comm), "MPI_Allgather");
    for (i = 0; i < mpi->size; i++)
        if (all[i]) { bad_ranks++; if (first_bad < 0) first_bad = i; }
    if (differs) {
        mlc_mpi__first_difference(mine, root, where, sizeof where);
        snprintf(message, sizeof message, "mlc_ddp_wrap: the model on rank %d differs from rank 0's: %s",
                 mpi->rank, where);
        mlc_mpi__fail_ctx(ctx, MLC_ERR_STATE, message);
    } else if (bad_ranks) {
        snprintf(message, sizeof message, "mlc_ddp_wrap: the model differs from rank 0's on %d rank%s "
                 "(the first: rank %d, whose error names the tensor)", bad_ranks, bad_ranks > 1 ? "s" : "",
                 first_bad);
        mlc_mpi__fail_ctx(ctx, MLC_ERR_STATE, message);
    }
    free(all);
    free(root);
    free(mine);
    return bad_ranks == 0;
}

/* Wait for requests req[0..n) (polling: yielding, then napping, as above); after timeout_s, end the job
   saying what waited */
static void mlc_mpi__wait_all(const mlc_mpi *mpi, int n, MPI_Request *req, MPI_Status *status,
                              double timeout_s, const char *what) {
    double start = MPI_Wtime(), now;
    int flag = 0;
    for (;;) {
        mlc_mpi__ok(mpi, MPI_Testall(n, req, &flag, status), "MPI_Testall");
        if (flag) return;
        now = MPI_Wtime();
        if (now - start > timeout_s)
            mlc_mpi_fail(mpi, "%s waited %.0f s (timeout_s) for another rank (it hangs, died, or left the "
                         "training loop early)", what, timeout_s);
        if (now - start > MLC_MPI__SPIN_S) MLC_MPI__NAP();
        else MLC_MPI__YIELD();
    }
}

/* Rank 0's values of tensors t[0..n) on every rank, through one packed host buffer. */
static int mlc_mpi__broadcast(const mlc_mpi *mpi, mlc_tensor **t, int n, double timeout_s) {
    size_t total = 0, at = 0;
    float *pack;
    int i, bad = 0;
    if (mpi->size == 1 || n == 0) return 1;
    for (i = 0; i < n; i++) total += t[i]->size;
    pack = (float *)malloc(total * sizeof(float) + 1);
    if (!pack) mlc_mpi_fail(mpi, "broadcasting the model: out of memory (%zu floats)", total);
    if (mpi->rank == 0)
        for (i = 0; i < n; i++) {
            if (mlc_read(t[i], pack + at, t[i]->size) != MLC_OK) bad = 1;
            at += t[i]->size;
        }
    if (bad) mlc_mpi_check(mpi, t[0]->ctx, "broadcasting the model (reading rank 0's tensors)");
    for (at = 0; at < total;) {                         /* in pieces an int counts */
        size_t piece = total - at < (size_t)1 << 30 ? total - at : (size_t)1 << 30;
        MPI_Request req;
        MPI_Status status;
        mlc_mpi__ok(mpi, MPI_Ibcast(pack + at, (int)piece, MPI_FLOAT, 0, mpi->comm, &req), "MPI_Ibcast");
        mlc_mpi__wait_all(mpi, 1, &req, &status, timeout_s, "broadcasting rank 0's tensors");
        at += piece;
    }
    if (mpi->rank != 0)
        for (i = 0, at = 0; i < n; i++) {
            if (mlc_write(t[i], pack + at, t[i]->size) != MLC_OK) bad = 1;
            at += t[i]->size;
        }
    free(pack);
    return !bad;
}

static int mlc_mpi__convert_bn(mlc_ddp *ddp, mlc_module *m, int undo);

MLCDEF void mlc_ddp_free(mlc_ddp *ddp) {
    int b;
    if (!ddp) return;
    if (ddp->n_sync_bn) mlc_mpi__convert_bn(ddp, ddp->module, 1);   /* BatchNorm again */
    if (ddp->buf) for (b = 0; b < ddp->n_buckets; b++) free(ddp->buf[b]);
    free(ddp->buf);
    free(ddp->params);
    free(ddp->buffers);
    free(ddp->offset);
    free(ddp->bucket_of);
    free(ddp->first);
    free(ddp->floats);
    free(ddp->req);
    free(ddp->status);
    free(ddp->missing);
    free(ddp->reported);
    if (ddp->bn_comm != MPI_COMM_NULL && ddp->bn_comm != (MPI_Comm)0) MPI_Comm_free(&ddp->bn_comm);
    free(ddp);
}

MLCDEF mlc_ddp *mlc_ddp_wrap(const mlc_mpi *mpi, mlc_module *m, mlc_ddp_opts opts) {
    mlc_ddp *ddp;
    mlc_named_tensor *state;
    mlc_ctx *ctx;
    int n_state, i, b, np = 0, nb = 0;
    size_t cap_floats, fill = 0;
    if (!mpi || !m) return NULL;
    ctx = m->ctx;
    if (mlc_error(ctx)) return NULL;
    n_state = mlc_module_state(m, NULL, 0);
    state = (mlc_named_tensor *)malloc(sizeof *state * (size_t)(n_state + 1));
    ddp = (mlc_ddp *)calloc(1, sizeof *ddp);
    if (!state || !ddp) {
        free(state); free(ddp);
        mlc_mpi__fail_ctx(ctx, MLC_ERR_MEMORY, "mlc_ddp_wrap: out of memory");
        return NULL;
    }
    mlc_module_state(m, state, n_state);
    if (!mlc_mpi__same_model(mpi, ctx, state, n_state)) { free(state); free(ddp); return NULL; }
    ddp->mpi = mpi;
    ddp->bn_comm = MPI_COMM_NULL;
    ddp->module = m;
    ddp->ctx = ctx;
    ddp->opts = opts;
    if (opts.bucket_cap_mb == 0.0f) ddp->opts.bucket_cap_mb = 25.0f;
    if (opts.timeout_s <= 0.0) ddp->opts.timeout_s = 300.0;
    for (i = 0; i < n_state; i++) { if (state[i].tensor->requires_grad) np++; else nb++; }
    ddp->n_params = np;
    ddp->n_buffers = nb;
    ddp->params = (mlc_tensor **)calloc((size_t)np + 1, sizeof(mlc_tensor *));
    ddp->buffers = (mlc_tensor **)calloc((size_t)nb + 1, sizeof(mlc_tensor *));
    ddp->offset = (size_t *)calloc((size_t)np + 1, sizeof(size_t));
    ddp->bucket_of = (int *)calloc((size_t)np + 1, sizeof(int));
    ddp->first = (int *)calloc((size_t)np + 2, sizeof(int));
    ddp->reported = (unsigned char *)calloc((size_t)np + 1, 1);
    if (!ddp->params || !ddp->buffers || !ddp->offset || !ddp->bucket_of || !ddp->first || !ddp->reported) {
        free(state);
        mlc_ddp_free(ddp);
        mlc_mpi__fail_ctx(ctx, MLC_ERR_MEMORY, "mlc_ddp_wrap: out of memory");
        return NULL;
    }
    for (i = n_state - 1, np = 0, nb = 0; i >= 0; i--) {      /* parameters in reverse order */
        mlc_tensor *t = state[i].tensor;
        if (!t->requires_grad) { ddp->buffers[nb++] = t; continue; }
        if (mlc_dtype(t) != MLC_F32) {
            char message[300];
            snprintf(message, sizeof message,
                     "mlc_ddp_wrap: parameter %s is %s; data-parallel training takes "
                     "float32 parameters (train half models with mlc_autocast_begin)", state[i].name,
                     mlc_dtype_name(mlc_dtype(t)));
            mlc_mpi__fail_ctx(ctx, MLC_ERR_ARG, message);
        }
        ddp->params[np++] = t;
    }
    {   /* buffers back in registration order (only the broadcast reads them) */
        for (i = 0; i < nb / 2; i++) {
            mlc_tensor *t = ddp->buffers[i];
            ddp->buffers[i] = ddp->buffers[nb - 1 - i];
            ddp->buffers[nb - 1 - i] = t;
        }
    }
    free(state);
    /* every rank knows whether one failed before the collectives below */
    if (mlc_mpi_sum(mpi, mlc_error(ctx) ? 1.0 : 0.0) > 0) {
        if (!mlc_error(ctx))
            mlc_mpi__fail_ctx(ctx, MLC_ERR_STATE, "mlc_ddp_wrap: another rank failed to wrap");
        mlc_ddp_free(ddp);
        return NULL;
    }
    /* buckets: fill up to the cap (MLC_ZERO or a cap below one parameter: one each) */
    cap_floats = (size_t)((double)ddp->opts.bucket_cap_mb * 1024.0 * 1024.0 / sizeof(float));
    for (i = 0; i < np; i++) {          /* the first bucket at most 1 MiB, as PyTorch's, so it */
        size_t n = ddp->params[i]->size;   /* starts early in backward */
        size_t cap = ddp->n_buckets == 1 && cap_floats > ((size_t)1 << 18) ? (size_t)1 << 18 : cap_floats;
        if (i == 0 || fill + n > cap) { ddp->first[ddp->n_buckets++] = i; fill = 0; }
        ddp->bucket_of[i] = ddp->n_buckets - 1;
        ddp->offset[i] = fill;
        fill += n;
    }
    ddp->first[ddp->n_buckets] = np;
    b = ddp->n_buckets;
    ddp->buf = (float **)calloc((size_t)b + 1, sizeof(float *));
    ddp->floats = (size_t *)calloc((size_t)b + 1, sizeof(size_t));
    ddp->req = (MPI_Request *)calloc((size_t)b + 1, sizeof(MPI_Request));
    ddp->status = (MPI_Status *)calloc((size_t)b + 1, sizeof(MPI_Status));
    ddp->missing = (int *)calloc((size_t)b + 1, sizeof(int));
    if (!ddp->buf || !ddp->floats || !ddp->req || !ddp->status || !ddp->missing) {
        mlc_ddp_free(ddp);
        mlc_mpi__fail_ctx(ctx, MLC_ERR_MEMORY, "mlc_ddp_wrap: out of memory");
        return NULL;
    }
    for (b = 0; b < ddp->n_buckets; b++) {
        int last = ddp->first[b + 1] - 1;
        ddp->floats[b] = ddp->offset[last] + ddp->params[last]->size;
        ddp->buf[b] = (float *)malloc(ddp->floats[b] * sizeof(float) + 1);
        ddp->req[b] = MPI_REQUEST_NULL;
        if (!ddp->buf[b]) {
            mlc_ddp_free(ddp);
            mlc_mpi__fail_ctx(ctx, MLC_ERR_MEMORY, "mlc_ddp_wrap: out of memory for the buckets");
            return NULL;
        }
    }
    ddp->stats.n_buckets = ddp->n_buckets;
    /* rank 0's state everywhere, and a gradient buffer for every parameter */
    if (!mlc_mpi__broadcast(mpi, ddp->params, np, ddp->opts.timeout_s)
        || !mlc_mpi__broadcast(mpi, ddp->buffers, nb, ddp->opts.timeout_s))
        mlc_mpi_check(mpi, ctx, "mlc_ddp_wrap (broadcasting rank 0's model)");
    for (i = 0; i < np; i++)
        if (!mlc_mpi__grad_buffer(ddp->params[i])) mlc_mpi_check(mpi, ctx, "mlc_ddp_wrap (gradient buffers)");
    return ddp;
}

MLCDEF mlc_module *mlc_ddp_module(const mlc_ddp *ddp) { return ddp ? ddp->module : NULL; }

MLCDEF int mlc_ddp_no_sync(mlc_ddp *ddp, int on) {
    int was;
    if (!ddp) return 0;
    was = ddp->no_sync;
    ddp->no_sync = on != 0;
    return was;
}

MLCDEF mlc_ddp_stats mlc_ddp_get_stats(const mlc_ddp *ddp) {
    mlc_ddp_stats none;
    memset(&none, 0, sizeof none);
    return ddp ? ddp->stats : none;
}

MLCDEF mlc_tensor *mlc_ddp_forward(mlc_ddp *ddp, mlc_tensor *x) {
    if (!ddp) return NULL;
    if (!ddp->opts.no_broadcast_buffers && ddp->mpi->size > 1 && ddp->n_buffers > 0 && !mlc_error(ddp->ctx)
        && !mlc_mpi__broadcast(ddp->mpi, ddp->buffers, ddp->n_buffers, ddp->opts.timeout_s))
        mlc_mpi_check(ddp->mpi, ddp->ctx, "mlc_ddp_forward (broadcasting buffers)");
    return mlc_forward(ddp->module, x);
}

/* Start the buckets that are full, in order, and let MPI move the ones in flight along (most
   MPI libraries progress a nonblocking collective only inside MPI calls). */
static void mlc_mpi__start_ready(mlc_ddp *ddp) {
    const mlc_mpi *mpi = ddp->mpi;
    while (ddp->next_start < ddp->n_buckets && ddp->missing[ddp->next_start] == 0) {
        int b = ddp->next_start++;
        size_t n = ddp->floats[b];
        if (n > (size_t)0x7fffffff) mlc_mpi_fail(mpi, "a bucket of %zu floats is too large for MPI", n);
        mlc_mpi__ok(mpi, MPI_Iallreduce(MPI_IN_PLACE, ddp->buf[b], (int)n, MPI_FLOAT, MPI_SUM, mpi->comm,
                                        &ddp->req[b]), "MPI_Iallreduce");
        ddp->stats.buckets++;
        ddp->stats.bytes += (long long)(n * sizeof(float));
    }
    if (ddp->next_start > 0) {
        int flag = 0;
        mlc_mpi__ok(mpi, MPI_Testall(ddp->next_start, ddp->req, &flag, ddp->status), "MPI_Testall");
    }
}

/* Parameter i's gradient (zeros where it has none) into its bucket */
static void mlc_mpi__copy_in(mlc_ddp *ddp, int i) {
    mlc_tensor *p = ddp->params[i];
    float *dst = ddp->buf[ddp->bucket_of[i]] + ddp->offset[i];
    const float *g = mlc_host_grad(p);
    if (g) memcpy(dst, g, p->size * sizeof(float));
    else memset(dst, 0, p->size * sizeof(float));
    ddp->reported[i] = 1;
    ddp->missing[ddp->bucket_of[i]]--;
}

static int mlc_mpi__sync_bn_ready(mlc_ddp *ddp, mlc_tensor *leaf);

static void mlc_mpi__grad_ready(mlc_tensor *leaf, void *user) {
    mlc_ddp *ddp = (mlc_ddp *)user;
    int i = 0, k;
    if (ddp->n_pending && mlc_mpi__sync_bn_ready(ddp, leaf)) return;
    if (ddp->no_sync || ddp->mpi->size == 1) return;
    for (k = 0; k < ddp->n_params; k++) {                 /* from where the last one was */
        i = (ddp->next_guess + k) % ddp->n_params;
        if (ddp->params[i] == leaf) break;
    }
    if (k == ddp->n_params || ddp->reported[i]) return;   /* not ours, or seen */
    ddp->next_guess = i + 1 < ddp->n_params ? i + 1 : 0;
    mlc_mpi__copy_in(ddp, i);
    if (ddp->missing[ddp->bucket_of[i]] == 0) mlc_mpi__start_ready(ddp);
}

MLCDEF mlc_result mlc_ddp_backward(mlc_ddp *ddp, mlc_tensor *loss) {
    const mlc_mpi *mpi;
    double start, after;
    mlc_result rc;
    int b, i;
    if (!ddp) return MLC_ERR_NULL;
    mpi = ddp->mpi;
    start = mlc_mpi__now();
    if (ddp->no_sync || mpi->size == 1) {        /* one rank: its gradients are the average */
        if (ddp->n_pending) mlc_set_grad_ready_hook(ddp->ctx, mlc_mpi__grad_ready, ddp);   /* SyncBatchNorm */
        rc = mlc_backward(loss);
        mlc_set_grad_ready_hook(ddp->ctx, NULL, NULL);
        ddp->n_pending = 0;
        if (rc != MLC_OK || !loss) mlc_mpi_check(mpi, loss ? ddp->ctx : NULL, "mlc_ddp_backward");
        if (!ddp->no_sync) {
            ddp->stats.steps++;
            ddp->stats.backward_s += mlc_mpi__now() - start;
        }
        return rc;
    }
    memset(ddp->reported, 0, (size_t)ddp->n_params);
    for (b = 0; b < ddp->n_buckets; b++) ddp->missing[b] = ddp->first[b + 1] - ddp->first[b];
    ddp->next_start = 0;
    ddp->next_guess = 0;
    mlc_set_grad_ready_hook(ddp->ctx, mlc_mpi__grad_ready, ddp);
    rc = loss ? mlc_backward(loss) : MLC_ERR_NULL;
    mlc_set_grad_ready_hook(ddp->ctx, NULL, NULL);
    ddp->n_pending = 0;
    mlc_mpi_check(mpi, ddp->ctx, "mlc_ddp_backward");
    if (!loss) mlc_mpi_fail(mpi, "failed in mlc_ddp_backward: the loss is NULL");
    after = mlc_mpi__now();
    /* parameters the backward did not reach send what they hold */
    for (i = 0; i < ddp->n_params; i++) if (!ddp->reported[i]) mlc_mpi__copy_in(ddp, i);
    mlc_mpi__start_ready(ddp);
    mlc_mpi__wait_all(mpi, ddp->n_buckets, ddp->req, ddp->status, ddp->opts.timeout_s,
                      "mlc_ddp_backward: the gradients' all-reduce");
    for (i = 0; i < ddp->n_params; i++) {                 /* the average into the gradients */
        mlc_tensor *p = ddp->params[i];
        const float *src = ddp->buf[ddp->bucket_of[i]] + ddp->offset[i];
        float *g = mlc_mpi__grad_buffer(p);
        if (!g) mlc_mpi_check(mpi, ddp->ctx, "mlc_ddp_backward (writing the averaged gradients)");
        mlc_mpi__average(g, src, p->size, (float)mpi->size);
        mlc_write_grad(p, g, p->size);                     /* in place: the device copy follows */
    }
    ddp->stats.steps++;
    ddp->stats.wait_s += mlc_mpi__now() - after;
    ddp->stats.backward_s += mlc_mpi__now() - start;
    return rc;
}

MLCDEF double mlc_ddp_time_allreduce(mlc_ddp *ddp) {
    double start, took;
    mlc_ddp_stats saved;
    if (!ddp) return 0;
    saved = ddp->stats;
    mlc_mpi_barrier(ddp->mpi);
    start = mlc_mpi__now();
    ddp->next_start = 0;                                 /* every bucket full: all start, in order */
    memset(ddp->missing, 0, sizeof(int) * (size_t)ddp->n_buckets);
    mlc_mpi__start_ready(ddp);
    mlc_mpi__wait_all(ddp->mpi, ddp->n_buckets, ddp->req, ddp->status, ddp->opts.timeout_s,
                      "mlc_ddp_time_allreduce");
    took = mlc_mpi__now() - start;
    ddp->stats = saved;                                  /* not a training step's */
    return took;
}

/* ---- SyncBatchNorm ---------------------------------------------------------------------------
   x [N, C, ...] seen as [N, C, L]; n = N·L values per channel here, n_all over the ranks.
     mean = Σ_all x / n_all,  var = Σ_all (x - mean)² / n_all     (two all-reduces, in double)
     y = (x - mean) / √(var + eps) · weight + bias
   The statistics enter autograd as constants plus a zero-valued term that carries the gradient:
     mean = const + (t1 - detach(t1)) / n_all,   t1 = s1 + tap1,   s1 = Σ_here x
     var  = const + (t2 - detach(t2)) / n_all,   t2 = s2 + tap2,   s2 = Σ_here (x - mean_const)²
   (∂var/∂x = 2 (x - mean) / n_all: the mean's own term sums to zero over all ranks). Every
   rank's loss depends on the statistics, so s1's and s2's gradients must be summed over the
   ranks before they reach x: the taps are zero leaves read by the adds alone, so the grad-ready
   hook reports a tap right after its add's backward, when s1's (s2's) gradient is whole and its
   sum has not run; the hook sums that gradient over the ranks in place. */

/* values[0..n) summed over the ranks, on SyncBatchNorm's communicator */
static void mlc_mpi__bn_sum(mlc_ddp *ddp, double *values, int n) {
    mlc_mpi__ok(ddp->mpi, MPI_Allreduce(MPI_IN_PLACE, values, n, MPI_DOUBLE, MPI_SUM, ddp->bn_comm),
                "MPI_Allreduce (SyncBatchNorm)");
}

static int mlc_mpi__sync_bn_ready(mlc_ddp *ddp, mlc_tensor *leaf) {
    int k;
    for (k = ddp->n_pending - 1; k >= 0; k--)            /* the newest first */
        if (ddp->pending[k].tap == leaf) {
            mlc_tensor *sum = ddp->pending[k].sum;
            float *g = mlc_host_grad(sum);
            double *all = (double *)malloc(sizeof(double) * sum->size + 1);
            size_t j;
            if (!all) mlc_mpi_fail(ddp->mpi, "SyncBatchNorm backward: out of memory");
            for (j = 0; j < sum->size; j++) all[j] = g ? (double)g[j] : 0.0;
            mlc_mpi__bn_sum(ddp, all, (int)sum->size);
            if (g) {
                for (j = 0; j < sum->size; j++) g[j] = (float)all[j];
                mlc_write_grad(sum, g, sum->size);
            }
            free(all);
            ddp->pending[k].tap = NULL;
            return 1;
        }
    return 0;
}

/* A per-channel statistic as a constant value plus a term that is zero and carries the
   gradient of `sum` (+ a tap) times scale: value + (t - detach(t)) · scale */
static mlc_tensor *mlc_mpi__statistic(mlc_ddp *ddp, mlc_tensor *sum, const float *value, float scale) {
    mlc_ctx *ctx = sum->ctx;
    mlc_tensor *tap = mlc_zeros(ctx, sum->ndim, sum->shape), *t;
    if (!tap || mlc_error(ctx)) return NULL;
    mlc_requires_grad(tap, 1);
    if (ddp->n_pending == (int)(sizeof ddp->pending / sizeof ddp->pending[0])) {
        mlc_mpi__fail_ctx(ctx, MLC_ERR_STATE, "SyncBatchNorm: more than 64 statistics (two a module) "
                          "waiting for a backward");
        return NULL;
    }
    ddp->pending[ddp->n_pending].tap = tap;
    ddp->pending[ddp->n_pending++].sum = sum;
    t = mlc_add(sum, tap);
    return mlc_add(mlc_from_data(ctx, sum->ndim, sum->shape, value),
                   mlc_mul_scalar(mlc_sub(t, mlc_detach(t)), scale));
}

/* PyTorch's running statistics from the global ones: momentum, unbiased variance (alike on
   every rank, as their inputs are) */
static void mlc_mpi__bn_running(mlc_ddp *ddp, mlc_module *m, const float *mean, const double *sq,
                                double n_all) {
    int c = m->buffers[0]->shape[0], k;
    float mom = m->momentum, *upd = (float *)malloc(sizeof(float) * (size_t)(2 * c + 1));
    const float *rm = mlc_host_data(m->buffers[0]), *rv = mlc_host_data(m->buffers[1]);
    const float *nbt = m->n_buffers > 2 && m->buffers[2] ? mlc_host_data(m->buffers[2]) : NULL;
    if (!rm || !rv) mlc_mpi_check(ddp->mpi, m->ctx, "SyncBatchNorm forward (running statistics)");
    if (!upd) mlc_mpi_fail(ddp->mpi, "SyncBatchNorm forward: out of memory");
    for (k = 0; k < c; k++) {
        upd[k] = (1.0f - mom) * rm[k] + mom * mean[k];
        upd[c + k] = (1.0f - mom) * rv[k] + mom * (float)(sq[k] / (n_all > 1 ? n_all - 1 : 1));
    }
    mlc_write(m->buffers[0], upd, (size_t)c);
    mlc_write(m->buffers[1], upd + c, (size_t)c);
    if (nbt) {
        upd[0] = nbt[0] + 1.0f;
        mlc_write(m->buffers[2], upd, 1);
    }
    free(upd);
}

static mlc_tensor *mlc_mpi__sync_bn_forward(mlc_module *m, mlc_tensor *x) {
    mlc_ddp *ddp = (mlc_ddp *)m->user;
    mlc_ctx *ctx = m->ctx;
    int c, l = 1, k, shape3[3], chan3[3];
    double *stats, n_all;
    float *mean, *var;
    const float *h;
    mlc_tensor *x3, *s1, *s2, *d, *mu, *v, *y;
    if (!x || mlc_error(ctx)) return NULL;
    if (!m->training || x->ndim < 2)                     /* eval: BatchNorm's running statistics */
        return mlc_batch_norm(x, m->buffers[0], m->buffers[1], m->params[0], m->params[1], m->training,
                              m->momentum, m->eps);
    c = x->shape[1];
    for (k = 2; k < x->ndim; k++) l *= x->shape[k];
    shape3[0] = x->shape[0]; shape3[1] = c; shape3[2] = l;
    chan3[0] = 1; chan3[1] = c; chan3[2] = 1;
    x3 = mlc_reshape(x, 3, shape3);
    stats = (double *)malloc(sizeof(double) * (size_t)(c + 1));
    mean = (float *)malloc(sizeof(float) * (size_t)(2 * c + 1));
    if (!stats || !mean) mlc_mpi_fail(ddp->mpi, "SyncBatchNorm forward: out of memory");
    var = mean + c;
    /* the mean: the first all-reduce (the sums and the count) */
    s1 = mlc_sum(mlc_sum(x3, 2, 0), 0, 0);               /* [C] */
    if (!(h = s1 ? mlc_host_data(s1) : NULL)) mlc_mpi_check(ddp->mpi, ctx, "SyncBatchNorm forward");
    for (k = 0; k < c; k++) stats[k] = h[k];
    stats[c] = (double)x->shape[0] * l;
    mlc_mpi__bn_sum(ddp, stats, c + 1);
    n_all = stats[c];
    for (k = 0; k < c; k++) mean[k] = (float)(stats[k] / n_all);
    /* the variance about it: the second */
    d = mlc_sub(x3, mlc_from_data(ctx, 3, chan3, mean));
    s2 = mlc_sum(mlc_sum(mlc_mul(d, d), 2, 0), 0, 0);
    if (!(h = s2 ? mlc_host_data(s2) : NULL)) mlc_mpi_check(ddp->mpi, ctx, "SyncBatchNorm forward");
    for (k = 0; k < c; k++) stats[k] = h[k];
    mlc_mpi__bn_sum(ddp, stats, c);
    for (k = 0; k < c; k++) var[k] = (float)(stats[k] / n_all);
    mlc_mpi__bn_running(ddp, m, mean, stats, n_all);
    mu = mlc_mpi__statistic(ddp, s1, mean, (float)(1.0 / n_all));
    v = mlc_mpi__statistic(ddp, s2, var, (float)(1.0 / n_all));
    y = mlc_div(mlc_sub(x3, mlc_reshape(mu, 3, chan3)),
                mlc_reshape(mlc_pow(mlc_add_scalar(v, m->eps), 0.5f), 3, chan3));
    if (m->params[0]) y = mlc_mul(y, mlc_reshape(m->params[0], 3, chan3));
    if (m->params[1]) y = mlc_add(y, mlc_reshape(m->params[1], 3, chan3));
    free(stats);
    free(mean);
    mlc_mpi_check(ddp->mpi, ctx, "SyncBatchNorm forward");
    return mlc_reshape(y, x->ndim, x->shape);
}

/* BatchNorm -> SyncBatchNorm (back, when undo), at any depth; how many */
static int mlc_mpi__convert_bn(mlc_ddp *ddp, mlc_module *m, int undo) {
    int k, n = 0;
    if (!m) return 0;
    if (!undo && m->type && !strcmp(m->type, "BatchNorm") && m->n_params == 2 && m->n_buffers >= 2) {
        ddp->bn_forward = m->forward;
        m->forward = mlc_mpi__sync_bn_forward;
        m->user = ddp;
        m->type = "SyncBatchNorm";
        n++;
    } else if (undo && m->forward == mlc_mpi__sync_bn_forward && m->user == ddp) {
        m->forward = ddp->bn_forward;
        m->user = NULL;
        m->type = "BatchNorm";
        n++;
    }
    for (k = 0; k < m->n_children; k++) n += mlc_mpi__convert_bn(ddp, m->children[k], undo);
    return n;
}

MLCDEF int mlc_ddp_sync_batch_norm(mlc_ddp *ddp) {
    int n;
    if (!ddp) return 0;
    if (ddp->bn_comm == MPI_COMM_NULL)
        mlc_mpi__ok(ddp->mpi, MPI_Comm_dup(ddp->mpi->comm, &ddp->bn_comm), "MPI_Comm_dup");
    n = mlc_mpi__convert_bn(ddp, ddp->module, 0);
    ddp->n_sync_bn += n;
    return n;
}

/* ---- Checkpoints --------------------------------------------------------------------------- */

/* A result every rank agrees on: the worst (largest code) of the ranks' */
static mlc_result mlc_mpi__agree(mlc_ddp *ddp, mlc_result rc, const char *what) {
    int mine = (int)rc, worst = 0;
    mlc_mpi__ok(ddp->mpi, MPI_Allreduce(&mine, &worst, 1, MPI_INT, MPI_MAX, ddp->mpi->comm), "MPI_Allreduce");
    if (worst != MLC_OK && mine == MLC_OK) {
        char message[200];
        snprintf(message, sizeof message, "%s failed on another rank (see its message)", what);
        mlc_mpi__fail_ctx(ddp->ctx, (mlc_result)worst, message);
    }
    return (mlc_result)worst;
}

MLCDEF mlc_result mlc_ddp_checkpoint_save(mlc_ddp *ddp, const char *path, mlc_optim *opt,
                                          const mlc_train_state *state) {
    mlc_result rc = MLC_OK;
    if (!ddp) return MLC_ERR_NULL;
    if (ddp->mpi->rank == 0) rc = mlc_checkpoint_save(path, ddp->module, opt, state);
    return mlc_mpi__agree(ddp, rc, "mlc_ddp_checkpoint_save (on rank 0)");
}

MLCDEF mlc_result mlc_ddp_checkpoint_load(mlc_ddp *ddp, const char *path, mlc_optim *opt,
                                          mlc_train_state *state) {
    if (!ddp) return MLC_ERR_NULL;
    return mlc_mpi__agree(ddp, mlc_checkpoint_load(path, ddp->module, opt, state), "mlc_ddp_checkpoint_load");
}

/* ---- DistributedSampler --------------------------------------------------------------------- */

struct mlc_dist_sampler {
    int rank, world, n, num_samples, total;
    mlc_dist_sampler_opts opts;
    long long epoch;
    int *order;                         /* total positions of the epoch */
    int *mine;                          /* this rank's num_samples of them */
    float *rows;                        /* scratch for a batch */
    size_t rows_cap;
};

/* PCG32 (as mlc's), seeded from (seed, epoch) alone, so every rank draws the same order */
static uint32_t mlc_mpi__pcg(uint64_t *state) {
    uint64_t old = *state;
    uint32_t xorshifted, rot;
    *state = old * 6364136223846793005ULL + 1442695040888963407ULL;
    xorshifted = (uint32_t)(((old >> 18u) ^ old) >> 27u);
    rot = (uint32_t)(old >> 59u);
    return (xorshifted >> rot) | (xorshifted << ((32u - rot) & 31u));
}

static void mlc_mpi__plan(mlc_dist_sampler *s) {
    int i, k;
    uint64_t st = (s->opts.seed + (uint64_t)s->epoch) * 0x9E3779B97F4A7C15ULL + 0x2545F4914F6CDD1DULL;
    int *perm = s->order;
    for (i = 0; i < s->n; i++) perm[i] = i;
    if (s->opts.shuffle)
        for (i = s->n - 1; i > 0; i--) {               /* Fisher-Yates, bound without modulo bias */
            uint32_t bound = (uint32_t)i + 1u, threshold = (uint32_t)(-bound) % bound, r;
            int j, t;
            do r = mlc_mpi__pcg(&st); while (r < threshold);
            j = (int)(r % bound);
            t = perm[i]; perm[i] = perm[j]; perm[j] = t;
        }
    for (i = s->n, k = 0; i < s->total; i++, k++) perm[i] = perm[k % s->n];   /* padding repeats the start */
    for (i = 0; i < s->num_samples; i++) s->mine[i] = perm[s->rank + i * s->world];
}

MLCDEF mlc_dist_sampler *mlc_dist_sampler_create_for(int rank, int world, int n, mlc_dist_sampler_opts opts) {
    mlc_dist_sampler *s;
    int alloc;
    if (world < 1 || rank < 0 || rank >= world || n < 1) return NULL;
    s = (mlc_dist_sampler *)calloc(1, sizeof *s);
    if (!s) return NULL;
    s->rank = rank;
    s->world = world;
    s->n = n;
    s->opts = opts;
    /* PyTorch's: drop_last ceil((n - W) / W), which is n / W here; else ceil(n / W) */
    s->num_samples = opts.drop_last && n % world ? n / world : n / world + (n % world != 0);
    if (s->num_samples < 1) { free(s); return NULL; }
    s->total = s->num_samples * world;
    alloc = s->total > n ? s->total : n;
    s->order = (int *)malloc(sizeof(int) * (size_t)alloc + 1);
    s->mine = (int *)malloc(sizeof(int) * (size_t)s->num_samples + 1);
    if (!s->order || !s->mine) { mlc_dist_sampler_free(s); return NULL; }
    mlc_mpi__plan(s);
    return s;
}

MLCDEF mlc_dist_sampler *mlc_dist_sampler_create(const mlc_mpi *mpi, int n, mlc_dist_sampler_opts opts) {
    return mpi ? mlc_dist_sampler_create_for(mpi->rank, mpi->size, n, opts) : NULL;
}

MLCDEF void mlc_dist_sampler_free(mlc_dist_sampler *s) {
    if (!s) return;
    free(s->order);
    free(s->mine);
    free(s->rows);
    free(s);
}

MLCDEF void mlc_dist_sampler_set_epoch(mlc_dist_sampler *s, long long epoch) {
    if (!s || s->epoch == epoch) return;
    s->epoch = epoch;
    mlc_mpi__plan(s);
}

MLCDEF int mlc_dist_sampler_count(const mlc_dist_sampler *s) { return s ? s->num_samples : 0; }
MLCDEF const int *mlc_dist_sampler_indices(const mlc_dist_sampler *s) { return s ? s->mine : NULL; }

MLCDEF int mlc_dist_sampler_steps(const mlc_dist_sampler *s, int batch_size, int drop_last_batch) {
    if (!s || batch_size < 1) return 0;
    return drop_last_batch ? s->num_samples / batch_size : (s->num_samples + batch_size - 1) / batch_size;
}

/* rows idx[0..count) of t into a new frame tensor */
static mlc_tensor *mlc_mpi__rows(mlc_dist_sampler *s, mlc_tensor *t, const int *idx, int count) {
    size_t row = t->size / (size_t)t->shape[0], need = row * (size_t)count;
    int shape[MLC_MAX_DIMS], i;
    const float *src = mlc_host_data(t);
    if (!src) return NULL;
    if (need > s->rows_cap) {
        float *grown = (float *)realloc(s->rows, need * sizeof(float) + 1);
        if (!grown) return NULL;
        s->rows = grown;
        s->rows_cap = need;
    }
    for (i = 0; i < count; i++)
        memcpy(s->rows + (size_t)i * row, src + (size_t)idx[i] * row, row * sizeof(float));
    memcpy(shape, t->shape, sizeof shape);
    shape[0] = count;
    return mlc_from_data(t->ctx, t->ndim, shape, s->rows);
}

MLCDEF int mlc_dist_sampler_batch(mlc_dist_sampler *s, mlc_tensor *x, mlc_tensor *y, int step,
                                  int batch_size, mlc_tensor **bx, mlc_tensor **by) {
    int begin, count;
    if (bx) *bx = NULL;
    if (by) *by = NULL;
    if (!s || !x || !bx || batch_size < 1 || step < 0) return 0;
    if (x->shape[0] < s->n || (y && y->shape[0] < s->n)) {
        mlc_mpi__fail_ctx(x->ctx, MLC_ERR_SHAPE, "mlc_dist_sampler_batch: the data has fewer rows than the "
                          "sampler's samples");
        return 0;
    }
    begin = step * batch_size;
    if (begin >= s->num_samples) return 0;
    count = s->num_samples - begin < batch_size ? s->num_samples - begin : batch_size;
    *bx = mlc_mpi__rows(s, x, s->mine + begin, count);
    if (y && by) *by = mlc_mpi__rows(s, y, s->mine + begin, count);
    return *bx && (!y || !by || *by);
}

#endif /* MLC_IMPLEMENTATION */
