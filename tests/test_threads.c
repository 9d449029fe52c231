/* mlc's own threads: the setting and its default, the same numbers on any thread count, more
   threads than cores, contexts that start and stop their workers many times, and OpenMP's
   binding of threads to places. */
#define _GNU_SOURCE                     /* nanosleep; sched_getcpu, sched_setaffinity, CPU_COUNT */
#include <time.h>
#include "test.h"
#include <stdlib.h>
#ifdef __linux__
#include <sched.h>
#include <unistd.h>
#endif
#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef _WIN32
#ifndef WIN32_LEAN_AND_MEAN
#define WIN32_LEAN_AND_MEAN
#endif
#include <windows.h>
#endif

/* Whether this build has mlc's pool of threads (mlc.h: POSIX threads without -pthread from
   glibc 2.34; Win32 threads with MinGW-w64 or clang), and whether a context may use several
   threads at all (the pool, or OpenMP's loops where MLC_NO_THREADS leaves it out) */
#if !defined(MLC_NO_THREADS) && defined(__linux__) && defined(__GLIBC__) && !defined(__TINYC__) \
    && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 34)
#define HAS_POOL 1
#elif !defined(MLC_NO_THREADS) && defined(_WIN32) && (defined(__GNUC__) || defined(__clang__)) \
    && !defined(__TINYC__)
#define HAS_POOL 1
#else
#define HAS_POOL 0
#endif
#if HAS_POOL || defined(_OPENMP)
#define HAS_THREADS 1
#else
#define HAS_THREADS 0
#endif

#if HAS_POOL || (defined(_OPENMP) && defined(__linux__))
/* Sleep for `ms` milliseconds (a core taken away from a thread, or work that takes time) */
static void nap(long ms) {
#ifdef _WIN32
    Sleep((DWORD)ms);
#else
    struct timespec t;
    t.tv_sec = ms / 1000;
    t.tv_nsec = ms % 1000 * 1000000L;
    nanosleep(&t, NULL);
#endif
}
#endif

static int threads_setting(void) {
    mlc_ctx *ctx = test_ctx(1);
    mlc_ctx *two = mlc_create(&(mlc_config){ .threads = 2, .quiet = 1 });
    CHECK(ctx && two && mlc_threads(ctx) >= 1);
    CHECK(mlc_threads(two) == (HAS_THREADS ? 2 : 1));
    mlc_set_threads(ctx, 3);
    CHECK(mlc_threads(ctx) == (HAS_THREADS ? 3 : 1));
    mlc_set_threads(ctx, 1000);                  /* capped at 64 */
    CHECK(mlc_threads(ctx) == (HAS_THREADS ? 64 : 1));
    mlc_set_threads(ctx, 0);                     /* the default again */
    CHECK(mlc_threads(ctx) >= 1 && mlc_error(ctx) == MLC_OK);
    mlc_set_threads(ctx, -1);
    CHECK(mlc_error(ctx) == MLC_ERR_ARG && strstr(mlc_error_message(ctx), "mlc_set_threads"));
    mlc_set_threads(NULL, 2);
    CHECK(mlc_threads(NULL) == 0);
    mlc_destroy(two);
    test_destroy(ctx);
    return 1;
}

/* The default is the CPUs the caller may run on, not every online one: under `taskset -c 0` on
   two cores, two threads on the one CPU ran an MLP step 1.75x slower than one thread. (Under
   OpenMP the default is OpenMP's, which it reads once at start-up, from the affinity too.) */
static int default_threads_follow_the_affinity(void) {
#if HAS_POOL && !defined(_OPENMP) && defined(__linux__)
    const char *env = getenv("OMP_NUM_THREADS");
    const long online = sysconf(_SC_NPROCESSORS_ONLN);
    cpu_set_t allowed, one;
    int first = 0, on_one, on_all, all;
    mlc_ctx *ctx;
    CHECK(sched_getaffinity(0, sizeof allowed, &allowed) == 0);
    while (first < CPU_SETSIZE - 1 && !CPU_ISSET(first, &allowed)) first++;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    CHECK(sched_setaffinity(0, sizeof one, &one) == 0);
    ctx = mlc_create(&(mlc_config){ .quiet = 1 });      /* .threads 0: the default */
    on_one = mlc_threads(ctx);
    mlc_destroy(ctx);
    CHECK(sched_setaffinity(0, sizeof allowed, &allowed) == 0);
    ctx = mlc_create(&(mlc_config){ .quiet = 1 });
    on_all = mlc_threads(ctx);
    mlc_destroy(ctx);
    all = CPU_COUNT(&allowed) < online ? CPU_COUNT(&allowed) : (int)online;
    if (env && atoi(env) > 0) {                          /* $OMP_NUM_THREADS comes first */
        CHECK(on_one == on_all && on_all == (atoi(env) < 64 ? atoi(env) : 64));
    } else {
        CHECK_MSG(on_one == 1, "%d threads by default on one allowed CPU", on_one);
        CHECK_MSG(on_all == (all < 64 ? all : 64), "%d threads by default on %d allowed CPUs", on_all, all);
    }
#endif
    return 1;
}

/* Three Adam steps of a net big enough that its products and the update of its first weight
   are shared out (96-384-10 MLP, batch 32; a conv 3 -> 8 on 4 images of 12 x 12; batch norms
   of 32 channels of 4 x 12 x 12 and of a [512, 32] batch (its columns copied out), whose
   channels are shared out), on `threads` threads; small enough for the x87 and s390x runs under
   qemu. conv_out: the conv's weight, the first batch norm's weight, bias and running variance,
   the second's weight and bias. */
static int train(int threads, float *mlp_out, float *conv_out) {
    mlc_ctx *ctx = test_ctx(7);
    mlc_module *l1, *l2, *conv, *net, *bn, *bn_flat;
    mlc_optim *opt, *conv_opt, *bn_opt, *flat_opt;
    mlc_tensor *x, *y, *images, *w, *planes, *mix, *rows, *rows_mix;
    int s;
    CHECK(ctx);
    mlc_set_threads(ctx, threads);
    l1 = mlc_nn_linear(ctx, 96, 384);
    l2 = mlc_nn_linear(ctx, 384, 10);
    net = mlc_nn_sequential(ctx, l1, mlc_nn_relu(ctx), l2, NULL);
    conv = mlc_nn_conv2d(ctx, 3, 8, 3, (mlc_conv_opts){ .padding = 1 });
    opt = mlc_adam(ctx, net, (mlc_adam_opts){ .lr = 1e-2f });
    conv_opt = mlc_adam(ctx, conv, (mlc_adam_opts){ .lr = 1e-2f });
    x = mlc_randn(ctx, MLC_SHAPE(32, 96));
    y = mlc_randn(ctx, MLC_SHAPE(32, 10));
    images = mlc_randn(ctx, MLC_SHAPE(4, 3, 12, 12));
    bn = mlc_nn_batch_norm(ctx, 32);
    bn_opt = mlc_sgd(ctx, bn, (mlc_sgd_opts){ .lr = 1e-2f });   /* (Adam would hide a scaled gradient) */
    planes = mlc_add_scalar(mlc_mul_scalar(mlc_randn(ctx, MLC_SHAPE(4, 32, 12, 12)), 3.0f), 5.0f);
    mix = mlc_randn(ctx, MLC_SHAPE(4, 32, 12, 12));
    bn_flat = mlc_nn_batch_norm(ctx, 32);
    flat_opt = mlc_sgd(ctx, bn_flat, (mlc_sgd_opts){ .lr = 1e-2f });
    rows = mlc_add_scalar(mlc_randn(ctx, MLC_SHAPE(512, 32)), -2.0f);
    rows_mix = mlc_randn(ctx, MLC_SHAPE(512, 32));
    CHECK(net && conv && opt && conv_opt && x && y && images && bn && bn_opt && planes && mix && bn_flat
          && flat_opt && rows && rows_mix);
    for (s = 0; s < 3; s++) {
        mlc_frame f = mlc_frame_begin(ctx);
        mlc_tensor *loss = mlc_mse_loss(mlc_forward(net, x), y, MLC_REDUCE_MEAN);
        mlc_tensor *conv_loss = mlc_sum_all(mlc_mul(mlc_forward(conv, images), mlc_forward(conv, images)));
        mlc_tensor *bn_loss = mlc_sum_all(mlc_mul(mlc_forward(bn, planes), mix));
        mlc_tensor *flat_loss = mlc_sum_all(mlc_mul(mlc_forward(bn_flat, rows), rows_mix));
        mlc_zero_grad(opt); mlc_zero_grad(conv_opt); mlc_zero_grad(bn_opt); mlc_zero_grad(flat_opt);
        CHECK(mlc_backward(loss) == MLC_OK && mlc_backward(conv_loss) == MLC_OK
              && mlc_backward(bn_loss) == MLC_OK && mlc_backward(flat_loss) == MLC_OK);
        mlc_step(opt); mlc_step(conv_opt); mlc_step(bn_opt); mlc_step(flat_opt);
        mlc_frame_end(f);
    }
    {
        mlc_named_tensor p[2];
        CHECK(mlc_module_parameters(l1, p, 2) == 2 && (w = p[0].tensor) != NULL);   /* weight, bias */
        memcpy(mlp_out, mlc_host_data(w), 384 * 96 * sizeof(float));
        CHECK(mlc_module_parameters(conv, p, 2) == 2);
        memcpy(conv_out, mlc_host_data(p[0].tensor), 8 * 3 * 9 * sizeof(float));
        CHECK(mlc_module_parameters(bn, p, 2) == 2);
        memcpy(conv_out + 8 * 27, mlc_host_data(p[0].tensor), 32 * sizeof(float));
        memcpy(conv_out + 8 * 27 + 32, mlc_host_data(p[1].tensor), 32 * sizeof(float));
        CHECK(mlc_module_parameters(bn_flat, p, 2) == 2);
        memcpy(conv_out + 8 * 27 + 96, mlc_host_data(p[0].tensor), 32 * sizeof(float));
        memcpy(conv_out + 8 * 27 + 128, mlc_host_data(p[1].tensor), 32 * sizeof(float));
    }
    {
        mlc_named_tensor st[8];
        int k, n = mlc_module_state(bn, st, 8), found = 0;
        for (k = 0; k < n; k++)
            if (!strcmp(st[k].name, "running_var")) {
                memcpy(conv_out + 8 * 27 + 64, mlc_host_data(st[k].tensor), 32 * sizeof(float));
                found = 1;
            }
        CHECK(found);
    }
    CHECK(mlc_error(ctx) == MLC_OK);
    test_destroy(ctx);
    return 1;
}

/* Training gives equal bits on any thread count: each value of a product is the same sum in the
   same order, whichever thread computes its block, and conv2d's weight gradient adds up groups
   of images fixed by the batch. 3 and 8 threads are more than most test machines have cores:
   the pieces of a worker that does not get a core go to the caller. */
static int threads_give_the_same_training(void) {
    static float mlp1[384 * 96], mlpn[384 * 96], conv1[8 * 27 + 160], convn[8 * 27 + 160];
    static const int counts[] = { 2, 3, 8 };
    int c, i;
    if (!train(1, mlp1, conv1)) return 0;
    for (c = 0; c < 3; c++) {
        if (!train(counts[c], mlpn, convn)) return 0;
        for (i = 0; i < 384 * 96; i++)
            CHECK_MSG(test_bits(mlp1[i]) == test_bits(mlpn[i]), "%d threads, weight %d: %.9g, 1 thread %.9g",
                      counts[c], i, (double)mlpn[i], (double)mlp1[i]);
        for (i = 0; i < 8 * 27 + 160; i++)
            CHECK_MSG(test_bits(conv1[i]) == test_bits(convn[i]),
                      "%d threads, conv weight / batch norm value %d: %.9g, 1 thread %.9g", counts[c], i,
                      (double)convn[i], (double)conv1[i]);
    }
    return 1;
}

/* Contexts that start workers, run a shared product, and stop them, again and again; and
   one that changes its thread count between products. */
static int threads_start_and_stop(void) {
    enum { N = 72 };                   /* 72³ products: above the size that uses threads */
    static float A[N * N], B[N * N], C[N * N], R[N * N];
    int round, i;
    for (i = 0; i < N * N; i++) { A[i] = (float)(i % 13) - 6.0f; B[i] = (float)(i % 7) * 0.5f; }
    mlc_gemm_reference(0, 1, N, N, N, A, B, 0.0f, R);
    for (round = 0; round < 40; round++) {
        mlc_ctx *ctx = mlc_create(&(mlc_config){ .threads = 2 + round % 3, .quiet = 1 });
        CHECK(ctx);
        mlc_gemm(ctx, 0, 1, N, N, N, A, B, 0.0f, C);
        if (round % 2) { mlc_set_threads(ctx, 1 + round % 5); mlc_gemm(ctx, 0, 1, N, N, N, A, B, 0.0f, C); }
        for (i = 0; i < N * N; i++)          /* whole and half numbers: exact in any order */
            CHECK_MSG(test_same_float(C[i], R[i]), "round %d, C[%d] %.9g, expected %.9g", round, i,
                      (double)C[i], (double)R[i]);
        CHECK(mlc_error(ctx) == MLC_OK);
        mlc_destroy(ctx);
    }
    return 1;
}

#if HAS_POOL
typedef struct busy_job { int ran[8], by_workers; } busy_job;

/* A piece of 8 units on 2 threads: the worker's sleeps 30 ms (a core the system gave to
   something else), the caller's 1 ms */
static void busy_piece(void *arg, int slot, size_t begin, size_t end) {
    busy_job *job = (busy_job *)arg;
    size_t u;
    for (u = begin; u < end; u++) job->ran[u]++;
    if (slot) job->by_workers += (int)(end - begin);      /* one worker: no race */
    nap(slot ? 30 : 1);
}

/* A piece that only counts its units (and the worker's) */
static void count_piece(void *arg, int slot, size_t begin, size_t end) {
    busy_job *job = (busy_job *)arg;
    size_t u;
    for (u = begin; u < end; u++) job->ran[u]++;
    if (slot) job->by_workers += (int)(end - begin);
}

/* A piece that notes the thread that ran each of its units, and takes 3 ms */
static void noting_piece(void *arg, int slot, size_t begin, size_t end) {
    int *ran_on = (int *)arg;
    size_t u;
    for (u = begin; u < end; u++) ran_on[u] = slot;
    nap(3);
}
#endif

/* Each thread owns an even run of a job's pieces and takes the other's from the back of its run:
   of 8 pieces on 2 threads, the worker runs one unbroken stretch [a, b) with a <= 4 <= b in every
   job (its own from 4 up, then the caller's from 3 down), and its own [4, 8) whenever both
   threads keep pace. The same data so stays on the same core from op to op. */
static int pieces_keep_to_their_thread(void) {
#if HAS_POOL
    mlc_ctx *ctx = mlc_create(&(mlc_config){ .threads = 2, .quiet = 1 });
    int job, u, kept = 0;
    CHECK(ctx && mlc_threads(ctx) == 2);
    for (job = 0; job < 50 && kept < 3; job++) {       /* (under emulation a worker may start late) */
        int ran_on[8], a = 8, b = 0;
        for (u = 0; u < 8; u++) ran_on[u] = -1;
        test_parallel(ctx, 8, 1, noting_piece, ran_on);
        for (u = 0; u < 8; u++) {
            CHECK_MSG(ran_on[u] == 0 || ran_on[u] == 1, "job %d, unit %d ran on slot %d", job, u, ran_on[u]);
            if (ran_on[u] == 1) { a = u < a ? u : a; b = u + 1; }
        }
        for (u = a; u < b; u++)
            CHECK_MSG(ran_on[u] == 1 && a <= 4 && b >= 4, "job %d: the worker ran units %d to %d but not %d",
                      job, a, b - 1, u);
        kept += a == 4 && b == 8;
    }
    CHECK_MSG(kept == 3, "the worker ran its own pieces 4 to 7 in %d jobs of 50", kept);
    CHECK(mlc_error(ctx) == MLC_OK);
    mlc_destroy(ctx);
#endif
    return 1;
}

/* A worker that loses its core in the middle of a piece: the caller takes the job's other
   pieces, and once it has had to wait for that worker anyway, the next 1000 jobs run on the
   caller alone (mlc_stats.jobs_alone), piece by piece; then the workers are used again. */
static int busy_worker_is_left_alone(void) {
#if HAS_POOL
    mlc_ctx *ctx = mlc_create(&(mlc_config){ .threads = 2, .quiet = 1 });
    busy_job job;
    mlc_stats before, after;
    int attempt, u, jobs;
    CHECK(ctx && mlc_threads(ctx) == 2);
    for (attempt = 0; attempt < 10; attempt++) {        /* the worker may start late */
        before = mlc_get_stats(ctx);
        memset(&job, 0, sizeof job);
        test_parallel(ctx, 8, 1, busy_piece, &job);
        for (u = 0; u < 8; u++) CHECK_MSG(job.ran[u] == 1, "unit %d ran %d times", u, job.ran[u]);
        if (mlc_get_stats(ctx).jobs_alone > before.jobs_alone) {
            /* an earlier job (slow under emulation) started a run alone: let it end */
            for (jobs = 0; jobs <= 1000 && mlc_get_stats(ctx).jobs_shared == before.jobs_shared; jobs++)
                test_parallel(ctx, 8, 1, count_piece, &job);
            CHECK_MSG(jobs <= 1000, "a run alone of more than 1000 jobs");
            continue;
        }
        before = mlc_get_stats(ctx);
        memset(&job, 0, sizeof job);
        test_parallel(ctx, 8, 1, count_piece, &job);     /* the first job after it */
        for (u = 0; u < 8; u++) CHECK_MSG(job.ran[u] == 1, "unit %d ran %d times", u, job.ran[u]);
        if (mlc_get_stats(ctx).jobs_alone > before.jobs_alone) break;
    }
    CHECK_MSG(attempt < 10 && job.by_workers == 0, "no job alone after 10 busy workers");
    for (jobs = 1; jobs < 1000; jobs++) test_parallel(ctx, 8, 1, count_piece, &job);
    after = mlc_get_stats(ctx);
    CHECK_MSG(after.jobs_alone == before.jobs_alone + 1000 && after.jobs_shared == before.jobs_shared,
              "%zu jobs alone, %zu shared", after.jobs_alone - before.jobs_alone,
              after.jobs_shared - before.jobs_shared);
    for (u = 0; u < 8; u++)
        CHECK_MSG(job.ran[u] == 1000 && job.by_workers == 0, "unit %d ran %d times, %d on the worker", u,
                  job.ran[u], job.by_workers);
    test_parallel(ctx, 8, 1, count_piece, &job);        /* the workers again */
    before = mlc_get_stats(ctx);
    CHECK(before.jobs_shared == after.jobs_shared + 1 && before.jobs_alone == after.jobs_alone);
    CHECK(mlc_error(ctx) == MLC_OK);
    mlc_destroy(ctx);
#endif
    return 1;
}

#if defined(_OPENMP) && defined(__linux__)
/* A piece that notes the CPU each of its units ran on, and takes 3 ms */
static void cpu_noting_piece(void *arg, int slot, size_t begin, size_t end) {
    int *cpu = (int *)arg;
    size_t u;
    (void)slot;
    for (u = begin; u < end; u++) cpu[u] = sched_getcpu();
    nap(3);
}
#endif

/* Where OpenMP binds its threads to places (OMP_PROC_BIND or OMP_PLACES; make test runs this
   suite once so), it binds the program's first thread to one CPU, and a thread started from it
   inherits that: mlc's workers, started from OpenMP's other threads, must still run a job's
   pieces on a second CPU. */
static int openmp_binding_is_followed(void) {
#if defined(_OPENMP) && defined(__linux__)
    mlc_ctx *ctx = mlc_create(&(mlc_config){ .threads = 2, .quiet = 1 });
    const int bound = omp_get_proc_bind() != omp_proc_bind_false     /* ("master": all on one place) */
                      && omp_get_proc_bind() != omp_proc_bind_master;
    int cpu[8], job, u, two_cpus = 0;
    mlc_stats before;
    CHECK(ctx && mlc_threads(ctx) == 2);
    before = mlc_get_stats(ctx);
    for (job = 0; job < 20 && !two_cpus; job++) {       /* (a thread may start late) */
        for (u = 0; u < 8; u++) cpu[u] = -1;
        test_parallel(ctx, 8, 1, cpu_noting_piece, cpu);
        for (u = 0; u < 8; u++) CHECK_MSG(cpu[u] >= 0, "job %d: unit %d did not run", job, u);
        for (u = 1; u < 8; u++) two_cpus |= cpu[u] != cpu[0];
    }
    CHECK(test_pool_started(ctx) == HAS_POOL);
    CHECK_MSG(mlc_get_stats(ctx).jobs_shared == before.jobs_shared + (size_t)(HAS_POOL ? job : 0),
              "%zu of %d jobs shared",
              mlc_get_stats(ctx).jobs_shared - before.jobs_shared, job);
    if (bound && omp_get_num_places() >= 2)
        CHECK_MSG(two_cpus, "under OpenMP's binding to %d places, 20 jobs each ran on one CPU",
                  omp_get_num_places());
    CHECK(mlc_error(ctx) == MLC_OK);
    mlc_destroy(ctx);
#endif
    return 1;
}

const test_case tests_threads[] = {
    TEST(threads_setting)
    TEST(default_threads_follow_the_affinity)
    TEST(threads_give_the_same_training)
    TEST(threads_start_and_stop)
    TEST(pieces_keep_to_their_thread)
    TEST(busy_worker_is_left_alone)
    TEST(openmp_binding_is_followed)
    { NULL, NULL }
};
