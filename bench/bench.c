/* bench/bench.c - mlc's benchmark suite (run it with `make bench`, which calls bench/run.sh).

   What it measures, all in one run, printed as two markdown tables:
     0. epoch training, as a user's loop runs it (the first table): the MLP 784-256-128-10 and
        the CNN of 3. below, batch 64, Adam lr 1e-3, cross entropy, over whole Fisher-Yates
        shuffled Fashion-MNIST epochs (60000 samples, 937 full batches, the partial one
        dropped), a fresh context and model per run; the batch gather is not timed, the step
        is (frame begin, forward, loss, zero_grad, backward, step, frame end); samples/s =
        samples / summed step time, median (min-max) of 3 runs, on 1 thread and on all the
        CPUs online; the share of the machine's FMA peak it reaches (FLOPs per sample from the
        shapes); PyTorch's same loop on 1 and on all threads, the plain `cc -O2` build's
        figures (--plain-exe) and the targets of issue 14. A run measures the plain build, 1
        thread and all threads back to back, and the ratios (threads, build) are the median
        and range of the runs' own: this VM's speed drifts by a third within minutes.
        Then the same runs under bf16 autocast (issue 25; where the CPU has AVX-512 BF16, else
        the rows say "skipped"): mlc_autocast_begin(ctx, MLC_BF16) around the forward and the
        loss, as examples/fashion_mnist.c --amp bf16 does, each run just after mlc's float32
        one, then PyTorch's under torch.autocast("cpu", torch.bfloat16): bf16 / float32 run by
        run (the >= 1.5x target needs AMX: "amx_bf16" in /proc/cpuinfo) and mlc / PyTorch bf16.
   Then the micro-benchmarks (the second table: best of short chunks of one repeated step):
     1. sgemm GFLOP/s for square n: mlc's own mlc_gemm, mlc through the BLAS hook
        (mlc_config.gemm calling OpenBLAS), and OpenBLAS called directly; 1 and all threads.
        Then bf16 (issue 25): mlc_gemm_bf16 against mlc_gemm on the same values, n = 512 and
        1024, 1 thread, where the CPU has AVX-512 BF16 (elsewhere the rows are skipped).
        Then int8 (issue 26): mlc_gemm_i8 against mlc_gemm on float32 copies of the same values,
        B stored [N, K] in both (a Linear's weight), n = 512 and 1024, 1 thread, GOP/s (2 n^3
        operations a product), medians of 5 chunks; the target is >= 2.5x on a CPU with VNNI
        (avx512_vnni or avx_vnni in /proc/cpuinfo), >= 8x with AMX-INT8 (amx_int8; mlc has no
        AMX kernel yet), none without either.
     2. the tiny MLP 10-100(tanh)-1: one Adam step on a batch of 64 (MSE), in µs.
     3. training samples/s, batch 64, Adam, cross entropy, on Fashion-MNIST (28x28, 10 classes):
        an MLP 784-256-128-10 and a small CNN (conv 16 - pool - conv 32 - pool - fc 128 - fc 10);
        and an LSTM (2 layers 32 -> 128, a linear head on each step): one Adam step (MSE) on 64
        random sequences of 50 steps, in ms.
     4. batch-1 inference latency of the same MLP and CNN (eval mode, no gradients), in µs.
     5. the peak RSS of MLP training in a process of its own, against the bytes it must hold.
     6. tokens/s of a training step of the tiny GPT of examples/gpt.c (examples/gpt_model.h:
        4 layers, 64 dims, 4 heads, block 64, batch 16, AdamW, clipping) on its text, 1 and all
        threads, against the same model in PyTorch (nn.MultiheadAttention) on 1 and all threads.
     7. int8 (issue 26): batch-1 latency of the CNN of 3. on 1 thread, float32 and converted by
        mlc_quantize_static (calibrated on the first 8 batches of 64 training images), the median
        of single calls; against PyTorch's statically quantized model (torch.ao.quantization,
        onednn and qnnpack, the faster taken). The int8 accuracy row is examples/fashion_mnist.c's
        --int8 (bench does not test its models).
   PyTorch's numbers come from bench/torch_bench.py (same models, same data), read from a file.

   Usage:
     bench [--quick] [--torch FILE] [--torch-cmd CMD] [--rss FILE] [--plain-exe PLAIN]
                              measure everything, print both tables (FILE: "key value" lines
                              from the other runs; PLAIN: the plain `cc -O2` build of this
                              file, run as `PLAIN --kv --epochs-only ...` before each
                              1-thread epoch run; CMD: PyTorch's epoch run, as `CMD
                              --epochs-only --model M --threads N --runs 1 --samples S`, just
                              before each of mlc's, for paired ratios; `CMD ... --amp bf16`
                              before each bf16 run: PyTorch under autocast)
     bench --rss-child        train the MLP only; print its peak RSS
     bench --int8-only [--quick] [--torch FILE]
                              the int8 rows (7.) only (FILE: torch_bench.py --int8-only's)
   Options for quick iteration on the epoch rows:
     --epochs-only            only the epoch rows (and the FMA peak), not the micro-benchmarks
     --model mlp|cnn          one model only
     --threads N              N threads only (default: 1 and all the CPUs online)
     --samples N              samples per run (default: one epoch, 60000; --quick: a tenth)
     --runs N                 runs per row, 1 to 100 (default 3; --quick: 1)
     --amp off|bf16           the epoch rows in float32 only (off) or under bf16 autocast
                              only (bf16, measured even without AVX-512 BF16); default: both,
                              bf16 where the CPU has AVX-512 BF16
     --kv                     with --epochs-only: print "key value" lines, not the table
     --quick                  short runs (1 run of a tenth of an epoch; short micro chunks)
     --int8-gemm              only the int8 GEMM rows (issue 26), for quick iteration on them
   Build (run.sh does this): cc -O2 -fopenmp -std=c99 -Ibench/.. bench/bench.c -lm
     -DBENCH_OPENBLAS -lopenblas   adds the hook and OpenBLAS columns
     -DBENCH_ZLIB -lz              reads the gzipped dataset with zlib (else `gzip -dc`)
   Without -fopenmp it runs on 1 thread only (run.sh's build/bench-plain, `cc -O2 -std=c99 -I.`).

   Timing: the epoch rows sum the time of every step of whole runs (what a user waits for). The
   micro-benchmarks are the best of several chunks of repeated calls, after a warm-up: the
   least disturbed by the rest of the machine, and never what a user's epoch gets. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef BENCH_OPENBLAS
#include <cblas.h>
#endif
#ifdef BENCH_ZLIB
#include <zlib.h>
#endif
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <immintrin.h>
#define BENCH_X86 1                      /* the FMA peak loop: AVX-512, AVX2+FMA or scalar */
#endif
#define MLC_IMPLEMENTATION
#include "mlc.h"
#include "examples/gpt_model.h"

#define BATCH 64
#define FASHION_DIR "/usr/share/datasets/fashion-mnist"

static int quick;                        /* --quick: shorter runs, for trying the suite out */
static int all_threads;                  /* the "all threads" setting: the CPUs allowed */
static int disturbed;                    /* other processes were busy: verdicts get a "?" */

/* ============================================================================================
   Timing
   ============================================================================================ */

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef void (*bench_fn)(void *arg);

/* After a warm-up call, how many calls of fn(arg) take about chunk_s / 4 (doubling from 1), and
   in *t the seconds those took */
static long calibrated_calls(bench_fn fn, void *arg, double chunk_s, double *t) {
    long calls = 1, i;
    fn(arg);                                            /* warm-up */
    for (;;) {
        *t = now();
        for (i = 0; i < calls; i++) fn(arg);
        *t = now() - *t;
        if (*t >= chunk_s / 4 || calls >= (1L << 24)) return calls;
        calls *= 2;
    }
}

/* Seconds per call of fn(arg), the best of `chunks` chunks of about chunk_s seconds each.
   The first calls warm up (caches, arena blocks, thread pools) and count how many calls fill
   a chunk. */
static double seconds_per_call(bench_fn fn, void *arg, double chunk_s, int chunks) {
    long calls = 1, i;
    double t, best;
    if (quick) chunk_s /= 4;
    calls = calibrated_calls(fn, arg, chunk_s, &t);
    best = t / (double)calls;
    if (t > 0) calls = (long)((double)calls * chunk_s / t) + 1;
    while (chunks-- > 0) {
        t = now();
        for (i = 0; i < calls; i++) fn(arg);
        t = (now() - t) / (double)calls;
        if (t < best) best = t;
    }
    return best;
}

static int compare_doubles(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Seconds per call of fn(arg), the median of `chunks` (at most 15) chunks of about chunk_s
   seconds each, after seconds_per_call's warm-up and count */
static double median_seconds_per_call(bench_fn fn, void *arg, double chunk_s, int chunks) {
    double t, times[15];
    long calls = 1, i;
    int c;
    if (quick) chunk_s /= 4;
    if (chunks > 15) chunks = 15;
    calls = calibrated_calls(fn, arg, chunk_s, &t);
    if (t > 0) calls = (long)((double)calls * chunk_s / t) + 1;
    for (c = 0; c < chunks; c++) {
        t = now();
        for (i = 0; i < calls; i++) fn(arg);
        times[c] = (now() - t) / (double)calls;
    }
    qsort(times, (size_t)chunks, sizeof times[0], compare_doubles);
    return times[chunks / 2];
}

static int threads_now;                  /* set_threads's setting, for the contexts make_ctx makes */

/* n threads for mlc (the contexts made from now on), OpenMP and OpenBLAS */
static void set_threads(int n) {
    threads_now = n;
#ifdef _OPENMP
    omp_set_num_threads(n);
#endif
#ifdef BENCH_OPENBLAS
    openblas_set_num_threads(n);
#endif
    (void)n;
}

/* How much of the CPUs other processes used since `since` (percent; -1 where /proc/stat is
   missing): all busy ticks of the machine minus this process's own CPU time. A busy machine
   disturbs every number, the 2-thread ones most. */
typedef struct cpu_mark { double busy_s, total_s, own_s; } cpu_mark;

static cpu_mark cpu_now(void) {
    cpu_mark m = { -1, -1, 0 };
    unsigned long long u, n, s, i, w, q, sq, st;
    double hz = (double)sysconf(_SC_CLK_TCK);
    struct rusage ru;
    FILE *f = fopen("/proc/stat", "r");
    if (f && fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &u, &n, &s, &i, &w, &q, &sq, &st) == 8) {
        m.busy_s = (double)(u + n + s + q + sq + st) / hz;
        m.total_s = (double)(u + n + s + i + w + q + sq + st) / hz;
    }
    if (f) fclose(f);
    for (int who = 0; who < 2; who++) {     /* this process and its children (the plain build's runs) */
        getrusage(who ? RUSAGE_CHILDREN : RUSAGE_SELF, &ru);
        m.own_s += (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec +
                   (double)ru.ru_stime.tv_sec + 1e-6 * (double)ru.ru_stime.tv_usec;
    }
    return m;
}

static double others_percent(cpu_mark since) {
    cpu_mark m = cpu_now();
    double p;
    if (since.total_s < 0 || m.total_s <= since.total_s) return -1;
    p = 100.0 * ((m.busy_s - since.busy_s) - (m.own_s - since.own_s)) / (m.total_s - since.total_s);
    return p < 0 ? 0 : p;
}

/* ============================================================================================
   The BLAS hook: mlc_config.gemm in front of OpenBLAS (the row-major layout of mlc_gemm_fn is
   CBLAS's with the leading dimensions of tightly packed matrices)
   ============================================================================================ */

#ifdef BENCH_OPENBLAS
static void openblas_gemm(int ta, int tb, int M, int N, int K, const float *A, const float *B,
                          float beta, float *C, void *user) {
    (void)user;
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                M, N, K, 1.0f, A, ta ? M : K, B, tb ? K : N, beta, C, N);
}
#endif

static mlc_ctx *make_ctx(int with_hook) {
    mlc_config cfg = { .seed = 42 };
#ifndef BENCH_BEFORE_THREADS            /* -DBENCH_BEFORE_THREADS: a header from before mlc_set_threads */
    cfg.threads = threads_now;
#endif
#ifdef BENCH_OPENBLAS
    if (with_hook) cfg.gemm = openblas_gemm;
#endif
    (void)with_hook;
    return mlc_create(&cfg);
}

/* ============================================================================================
   1. sgemm
   ============================================================================================ */

enum { GEMM_MLC, GEMM_HOOK, GEMM_OPENBLAS, GEMM_KINDS };
static const int gemm_sizes[] = { 64, 128, 256, 512, 1024 };
#define GEMM_SIZES (int)(sizeof gemm_sizes / sizeof gemm_sizes[0])
#define GEMM_MAX_CALL_S 3.0      /* skip a case whose single call would take longer than this */

typedef struct gemm_case { int kind, n; mlc_ctx *ctx; const float *A, *B; float *C; } gemm_case;

static void gemm_call(void *arg) {
    gemm_case *g = (gemm_case *)arg;
    if (g->kind == GEMM_OPENBLAS) {
#ifdef BENCH_OPENBLAS
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, g->n, g->n, g->n, 1.0f, g->A, g->n,
                    g->B, g->n, 0.0f, g->C, g->n);
#endif
    } else {
        mlc_gemm(g->ctx, 0, 0, g->n, g->n, g->n, g->A, g->B, 0.0f, g->C);
    }
}

typedef struct gemm_results {
    double gflops[2][GEMM_SIZES][GEMM_KINDS];   /* [1 or 2 threads][size][kind]; 0: not run */
    double skipped_est_s[2][GEMM_SIZES][GEMM_KINDS]; /* the estimate that made us skip */
    double max_rel_error;                       /* mlc against OpenBLAS, largest n compared */
    double own_vs_reference;                    /* mlc_gemm / mlc_gemm_reference speed, n 256 */
} gemm_results;

static void reference_call(void *arg) {
    gemm_case *g = (gemm_case *)arg;
    mlc_gemm_reference(0, 0, g->n, g->n, g->n, g->A, g->B, 0.0f, g->C);
}

static void bench_gemm(gemm_results *r) {
    int nmax = gemm_sizes[GEMM_SIZES - 1];
    size_t count = (size_t)nmax * nmax;
    float *A = malloc(count * sizeof(float)), *B = malloc(count * sizeof(float));
    float *C = malloc(count * sizeof(float)), *C2 = malloc(count * sizeof(float));
    mlc_ctx *own = make_ctx(0), *hooked = make_ctx(1);
    memset(r, 0, sizeof *r);
    if (!A || !B || !C || !C2 || !own || !hooked) { fprintf(stderr, "bench: out of memory\n"); exit(1); }
    for (size_t i = 0; i < count; i++) {
        A[i] = mlc_rand_uniform(own) - 0.5f;
        B[i] = mlc_rand_uniform(own) - 0.5f;
    }
    for (int t = 0; t < 2; t++) {
        set_threads(t ? all_threads : 1);
#ifndef BENCH_BEFORE_THREADS
        mlc_set_threads(own, threads_now);
        mlc_set_threads(hooked, threads_now);
#endif
        for (int kind = 0; kind < GEMM_KINDS; kind++) {
            double last_s = 0;                  /* one call at the previous size */
#ifndef BENCH_OPENBLAS
            if (kind != GEMM_MLC) continue;
#endif
            for (int s = 0; s < GEMM_SIZES; s++) {
                int n = gemm_sizes[s];
                double flops = 2.0 * n * n * n, est = last_s * 8.0, sec;
                gemm_case g = { kind, n, kind == GEMM_HOOK ? hooked : own, A, B, C };
                if (est > GEMM_MAX_CALL_S) { r->skipped_est_s[t][s][kind] = est; last_s = est; continue; }
                /* chunks of at least 0.2 s; a slow case gets a warm-up call and two timed ones */
                sec = seconds_per_call(gemm_call, &g, est > 0.2 ? est : 0.2, est > 1.0 ? 1 : 5);
                r->gflops[t][s][kind] = flops / sec * 1e-9;
                last_s = sec;
            }
        }
    }
    set_threads(all_threads);
#ifdef BENCH_OPENBLAS
    for (int s = 0; s < GEMM_SIZES && gemm_sizes[s] <= 256; s++) {   /* do they agree? */
        int n = gemm_sizes[s];
        double worst = 0, scale = 0;
        gemm_case g = { GEMM_MLC, n, own, A, B, C }, ref = { GEMM_OPENBLAS, n, own, A, B, C2 };
        gemm_call(&g);
        gemm_call(&ref);
        for (size_t i = 0; i < (size_t)n * n; i++) {
            double d = fabs((double)C[i] - C2[i]);
            if (d > worst) worst = d;
            if (fabs(C2[i]) > scale) scale = fabs(C2[i]);
        }
        r->max_rel_error = scale > 0 ? worst / scale : worst;
    }
#endif
    {   /* how mlc_gemm compares with the plain loop it is tested against */
        gemm_case g = { GEMM_MLC, 256, own, A, B, C };
        double own_s = seconds_per_call(gemm_call, &g, 0.2, 2);
        double ref_s = seconds_per_call(reference_call, &g, 0.2, 2);
        r->own_vs_reference = ref_s / own_s;
    }
    mlc_destroy(own);
    mlc_destroy(hooked);
    free(A); free(B); free(C); free(C2);
}

/* bf16 products: mlc_gemm_bf16 (the AVX-512 BF16 kernel) against mlc_gemm, float32, on the same
   values (bf16's, widened), square n, 1 thread, each the best of short chunks. Only where mlc.h
   builds the kernel (x86-64, GCC 10 or Clang 11 on) and the CPU has AVX-512 BF16. */
#if defined(BENCH_X86) && defined(__x86_64__) \
    && ((defined(__clang__) && __clang_major__ >= 11) || (!defined(__clang__) && __GNUC__ >= 10))
#define BENCH_BF16 1
typedef struct bf16_case { int n; mlc_ctx *ctx; const uint16_t *A, *B; float *C; } bf16_case;

static void bf16_call(void *arg) {
    bf16_case *g = (bf16_case *)arg;
    mlc_gemm_bf16(g->ctx, 0, 0, g->n, g->n, g->n, g->A, g->B, 0.0f, g->C);
}
#endif
static const int bf16_sizes[] = { 512, 1024 };
#define BF16_SIZES (int)(sizeof bf16_sizes / sizeof bf16_sizes[0])

/* gflops[s][0]: mlc_gemm's GFLOP/s at bf16_sizes[s], [s][1]: mlc_gemm_bf16's; 0: the CPU has no
   AVX-512 BF16 (nothing measured) */
static int bench_bf16(double gflops[][2]) {
    memset(gflops, 0, sizeof(double[2]) * BF16_SIZES);
#ifdef BENCH_BF16
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512bf16")) return 0;
    int nmax = bf16_sizes[BF16_SIZES - 1];
    size_t count = (size_t)nmax * nmax;
    float *A = malloc(count * sizeof(float)), *B = malloc(count * sizeof(float)), *C = malloc(count * sizeof(float));
    uint16_t *Ah = malloc(count * sizeof(uint16_t)), *Bh = malloc(count * sizeof(uint16_t));
    set_threads(1);
    mlc_ctx *ctx = make_ctx(0);
    if (!A || !B || !C || !Ah || !Bh || !ctx) { fprintf(stderr, "bench: out of memory\n"); exit(1); }
    for (size_t i = 0; i < count; i++) {
        Ah[i] = mlc_float_to_bf16(mlc_rand_uniform(ctx) - 0.5f);
        Bh[i] = mlc_float_to_bf16(mlc_rand_uniform(ctx) - 0.5f);
        A[i] = mlc_bf16_to_float(Ah[i]);
        B[i] = mlc_bf16_to_float(Bh[i]);
    }
    for (int s = 0; s < BF16_SIZES; s++) {
        int n = bf16_sizes[s];
        double flops = 2.0 * n * n * n;
        gemm_case f = { GEMM_MLC, n, ctx, A, B, C };
        bf16_case h = { n, ctx, Ah, Bh, C };
        gflops[s][0] = flops / seconds_per_call(gemm_call, &f, 0.2, 5) * 1e-9;
        gflops[s][1] = flops / seconds_per_call(bf16_call, &h, 0.2, 5) * 1e-9;
    }
    if (mlc_error(ctx)) fprintf(stderr, "bench: bf16 GEMM: %s\n", mlc_error_message(ctx));
    mlc_destroy(ctx);
    set_threads(all_threads);
    free(A); free(B); free(C); free(Ah); free(Bh);
    return 1;
#else
    return 0;
#endif
}

/* The CPU features of the bf16 epoch rows: AVX-512 BF16 (mlc's bf16 kernel, vdpbf16ps, where
   mlc.h builds it: BENCH_BF16) and AMX-BF16 (the bf16 / float32 target is for CPUs with it; mlc
   has no AMX kernel yet, so the rows run on AVX-512 BF16 either way). */
static int cpu_has_avx512bf16(void) {
#ifdef BENCH_BF16
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16") != 0;
#else
    return 0;
#endif
}

static int cpu_has_flag(const char *flag) {      /* flag among /proc/cpuinfo's flags */
    FILE *f = fopen("/proc/cpuinfo", "r");
    char *line = NULL;
    size_t size = 0, len = strlen(flag);
    int found = 0;
    while (f && !found && getline(&line, &size, f) > 0)
        if (strncmp(line, "flags", 5) == 0) {
            for (char *p = strstr(line, flag); p && !found; p = strstr(p + 1, flag))
                found = (p[-1] == ' ' || p[-1] == '\t') && (p[len] == ' ' || p[len] == '\n' || p[len] == '\0');
            break;
        }
    free(line);
    if (f) fclose(f);
    return found;
}

static int cpu_has_amx_bf16(void) { return cpu_has_flag("amx_bf16"); }

/* int8 products (issue 26): mlc_gemm_i8 against mlc_gemm, float32, on the same values (int8's,
   widened), B stored [N, K] in both as a Linear's weight (mlc_gemm with transpose_b), square n,
   1 thread, the median of 5 chunks each. Whatever kernel mlc_gemm_i8 picks here (AVX-512 VNNI,
   AVX-VNNI, AVX2 or the portable loops). */
typedef struct i8_case {
    int n;
    mlc_ctx *ctx;
    const int8_t *A, *B;
    int32_t *C;
    const float *Af, *Bf;               /* the same values as float32 */
    float *Cf;
} i8_case;

static void i8_call(void *arg) {
    i8_case *g = (i8_case *)arg;
    mlc_gemm_i8(g->ctx, g->n, g->n, g->n, g->A, g->B, g->C);
}
static void i8_float_call(void *arg) {
    i8_case *g = (i8_case *)arg;
    mlc_gemm(g->ctx, 0, 1, g->n, g->n, g->n, g->Af, g->Bf, 0.0f, g->Cf);
}
static const int i8_sizes[] = { 512, 1024 };
#define I8_SIZES (int)(sizeof i8_sizes / sizeof i8_sizes[0])

/* gops[s][0]: mlc_gemm's GOP/s at i8_sizes[s], [s][1]: mlc_gemm_i8's (2 n^3 operations each) */
static void bench_i8(double gops[][2]) {
    int nmax = i8_sizes[I8_SIZES - 1];
    size_t count = (size_t)nmax * nmax;
    float *Af = malloc(count * sizeof(float)), *Bf = malloc(count * sizeof(float));
    float *Cf = malloc(count * sizeof(float));
    int8_t *A = malloc(count), *B = malloc(count);
    int32_t *C = malloc(count * sizeof(int32_t));
    set_threads(1);
    mlc_ctx *ctx = make_ctx(0);
    if (!Af || !Bf || !Cf || !A || !B || !C || !ctx) { fprintf(stderr, "bench: out of memory\n"); exit(1); }
    for (size_t i = 0; i < count; i++) {                /* A in [-128, 127], B in [-127, 127] */
        A[i] = (int8_t)(int)(mlc_rand_u32(ctx) % 256 - 128);
        B[i] = (int8_t)(int)(mlc_rand_u32(ctx) % 255 - 127);
        Af[i] = A[i];
        Bf[i] = B[i];
    }
    for (int s = 0; s < I8_SIZES; s++) {
        int n = i8_sizes[s];
        double ops = 2.0 * n * n * n;
        i8_case g = { n, ctx, A, B, C, Af, Bf, Cf };
        gops[s][0] = ops / median_seconds_per_call(i8_float_call, &g, 0.2, 5) * 1e-9;
        gops[s][1] = ops / median_seconds_per_call(i8_call, &g, 0.2, 5) * 1e-9;
    }
    if (mlc_error(ctx)) fprintf(stderr, "bench: int8 GEMM: %s\n", mlc_error_message(ctx));
    mlc_destroy(ctx);
    set_threads(all_threads);
    free(Af); free(Bf); free(Cf); free(A); free(B); free(C);
}

/* The int8 rows' target: >= 8x where the CPU has AMX-INT8, >= 2.5x where it has VNNI (AVX-512
   or AVX), none without either; what was found, for the note under the table */
static double i8_target(const char **found) {
    if (cpu_has_flag("amx_int8")) { *found = "AMX-INT8 (mlc has no AMX kernel yet)"; return 8; }
    if (cpu_has_flag("avx512_vnni")) { *found = "AVX-512 VNNI"; return 2.5; }
    if (cpu_has_flag("avx_vnni")) { *found = "AVX-VNNI"; return 2.5; }
    *found = "no VNNI or AMX-INT8: no target";
    return 0;
}

/* ============================================================================================
   Data: Fashion-MNIST (gzipped IDX files) or random bytes of the same shape
   ============================================================================================ */

typedef struct dataset {
    int count;
    unsigned char *images;              /* count x 784 pixels, 0..255 */
    unsigned char *labels;              /* count classes, 0..9 */
    char source[160];                   /* how it was read, for the report */
} dataset;

/* The whole decompressed file in a malloc'd buffer (NULL if it cannot be read). */
static unsigned char *read_gz(const char *path, size_t *size, const char **how) {
    size_t cap = 1 << 20, len = 0, got;
    unsigned char *buf = malloc(cap), *bigger;
    if (!buf) return NULL;
#ifdef BENCH_ZLIB
    gzFile f = gzopen(path, "rb");
    *how = "zlib";
    if (!f) { free(buf); return NULL; }
    while ((got = (size_t)gzread(f, buf + len, (unsigned)(cap - len))) > 0 && got <= cap - len) {
        len += got;
        if (len == cap) {
            if (!(bigger = realloc(buf, cap *= 2))) { gzclose(f); free(buf); return NULL; }
            buf = bigger;
        }
    }
    gzclose(f);
#else
    char cmd[512];
    FILE *f;
    *how = "gzip -dc";
    if (access(path, R_OK) != 0) { free(buf); return NULL; }
    snprintf(cmd, sizeof cmd, "gzip -dc '%s' 2>/dev/null", path);
    if (!(f = popen(cmd, "r"))) { free(buf); return NULL; }
    while ((got = fread(buf + len, 1, cap - len, f)) > 0) {
        len += got;
        if (len == cap) {
            if (!(bigger = realloc(buf, cap *= 2))) { pclose(f); free(buf); return NULL; }
            buf = bigger;
        }
    }
    if (pclose(f) != 0) len = 0;
#endif
    *size = len;
    return buf;
}

static unsigned be32(const unsigned char *p) {
    return (unsigned)p[0] << 24 | (unsigned)p[1] << 16 | (unsigned)p[2] << 8 | p[3];
}

/* IDX: a magic number (0x00000803 images, 0x00000801 labels), the sizes, then the bytes. */
static int load_fashion(dataset *d) {
    size_t isize = 0, lsize = 0;
    const char *how = "";
    unsigned char *im = read_gz(FASHION_DIR "/train-images-idx3-ubyte.gz", &isize, &how);
    unsigned char *lb = read_gz(FASHION_DIR "/train-labels-idx1-ubyte.gz", &lsize, &how);
    if (im && lb && isize >= 16 && lsize >= 8 && be32(im) == 0x803 && be32(lb) == 0x801 &&
        be32(im + 8) == 28 && be32(im + 12) == 28 && be32(im + 4) == be32(lb + 4) &&
        isize >= 16 + (size_t)be32(im + 4) * 784 && lsize >= 8 + (size_t)be32(lb + 4)) {
        d->count = (int)be32(im + 4);
        d->images = malloc((size_t)d->count * 784);
        d->labels = malloc((size_t)d->count);
        if (d->images && d->labels) {
            memcpy(d->images, im + 16, (size_t)d->count * 784);
            memcpy(d->labels, lb + 8, (size_t)d->count);
            snprintf(d->source, sizeof d->source, "Fashion-MNIST, %d training images from %s (read with %s)",
                     d->count, FASHION_DIR, how);
        }
    }
    free(im);
    free(lb);
    return d->images && d->labels;
}

static void random_data(dataset *d, int count, const char *why) {
    mlc_ctx *rng = mlc_create(&(mlc_config){ .seed = 7 });
    d->count = count;
    d->images = malloc((size_t)count * 784);
    d->labels = malloc((size_t)count);
    if (!rng || !d->images || !d->labels) { fprintf(stderr, "bench: out of memory\n"); exit(1); }
    for (size_t i = 0; i < (size_t)count * 784; i++) d->images[i] = (unsigned char)(mlc_rand_u32(rng) >> 24);
    for (int i = 0; i < count; i++) d->labels[i] = (unsigned char)(mlc_rand_u32(rng) % 10);
    snprintf(d->source, sizeof d->source, "random bytes shaped like Fashion-MNIST (%s)", why);
    mlc_destroy(rng);
}

static void free_data(dataset *d) { free(d->images); free(d->labels); }

/* ============================================================================================
   Models (PyTorch's default initialisation, as in torch_bench.py)
   ============================================================================================ */

static mlc_module *tiny_mlp(mlc_ctx *ctx) {
    return mlc_nn_sequential(ctx, mlc_nn_linear(ctx, 10, 100), mlc_nn_tanh(ctx), mlc_nn_linear(ctx, 100, 1), NULL);
}

static mlc_module *fashion_mlp(mlc_ctx *ctx) {
    return mlc_nn_sequential(ctx, mlc_nn_linear(ctx, 784, 256), mlc_nn_relu(ctx),
                             mlc_nn_linear(ctx, 256, 128), mlc_nn_relu(ctx),
                             mlc_nn_linear(ctx, 128, 10), NULL);
}

static mlc_module *fashion_cnn(mlc_ctx *ctx) {
    mlc_conv_opts pad1 = { .padding = 1 };
    return mlc_nn_sequential(ctx,
        mlc_nn_conv2d(ctx, 1, 16, 3, pad1), mlc_nn_relu(ctx), mlc_nn_max_pool2d(ctx, 2, 2),
        mlc_nn_conv2d(ctx, 16, 32, 3, pad1), mlc_nn_relu(ctx), mlc_nn_max_pool2d(ctx, 2, 2),
        mlc_nn_flatten(ctx), mlc_nn_linear(ctx, 32 * 7 * 7, 128), mlc_nn_relu(ctx),
        mlc_nn_linear(ctx, 128, 10), NULL);
}

/* ============================================================================================
   2-4. Training steps and inference
   ============================================================================================ */

typedef struct trainer {
    mlc_ctx *ctx;
    mlc_module *model;
    mlc_optim *opt;
    mlc_tensor *x, *y;                  /* the batch: long-lived, refilled before each step */
    const dataset *data;                /* NULL: keep x and y as they are (the tiny MLP) */
    int next;                           /* the next batch's first image */
    int classify;                       /* 1: cross entropy on class indices, 0: MSE */
    int bf16;                           /* 1: the forward and the loss under bf16 autocast */
} trainer;

/* Copy the next BATCH images (scaled to [0, 1]) and labels into x and y. */
static void next_batch(trainer *t) {
    const dataset *d = t->data;
    if (t->next + BATCH > d->count) t->next = 0;
    for (size_t i = 0; i < (size_t)BATCH * 784; i++) t->x->data[i] = d->images[(size_t)t->next * 784 + i] * (1.0f / 255.0f);
    for (int i = 0; i < BATCH; i++) t->y->data[i] = d->labels[t->next + i];
    t->next += BATCH;
}

/* One training step on x and y as they are; the frame gives back every temporary and the tape
   at its end. loss_out (NULL: not read): the step's loss. t->bf16: the forward and the loss under
   bf16 autocast (as examples/fashion_mnist.c --amp bf16), the backward and the step outside. */
static void step_on_batch(trainer *t, float *loss_out) {
    mlc_frame f = mlc_frame_begin(t->ctx);
    if (t->bf16) mlc_autocast_begin(t->ctx, MLC_BF16);
    mlc_tensor *out = mlc_forward(t->model, t->x);
    mlc_tensor *loss = t->classify ? mlc_cross_entropy(out, t->y, MLC_REDUCE_MEAN, MLC_NO_IGNORE)
                                   : mlc_mse_loss(out, t->y, MLC_REDUCE_MEAN);
    if (t->bf16) mlc_autocast_end(t->ctx);
    mlc_zero_grad(t->opt);
    mlc_backward(loss);
    mlc_step(t->opt);
    if (loss_out) *loss_out = mlc_item(loss);
    mlc_frame_end(f);
}

/* The micro-benchmarks' step: the next batch in file order (the tiny MLP: its fixed batch) */
static void train_step(void *arg) {
    trainer *t = (trainer *)arg;
    if (t->data) next_batch(t);
    step_on_batch(t, NULL);
}

/* x_shape: the model's input for one image ({784} or {1, 28, 28}); the batch dimension is added. */
static int trainer_init(trainer *t, int with_hook, mlc_module *(*build)(mlc_ctx *), const dataset *data,
                        int x_ndim, const int *x_shape) {
    int shape[4] = { BATCH };
    memset(t, 0, sizeof *t);
    t->ctx = make_ctx(with_hook);
    if (!t->ctx) return 0;
    t->model = build(t->ctx);
    t->opt = mlc_adam(t->ctx, t->model, (mlc_adam_opts){ .lr = 1e-3f });
    t->data = data;
    t->classify = data != NULL;
    if (data) {
        memcpy(shape + 1, x_shape, (size_t)x_ndim * sizeof(int));
        t->x = mlc_zeros(t->ctx, x_ndim + 1, shape);      /* before any frame: lives on */
        t->y = mlc_zeros(t->ctx, MLC_SHAPE(BATCH));
    } else {
        t->x = mlc_randn(t->ctx, MLC_SHAPE(BATCH, 10));
        t->y = mlc_randn(t->ctx, MLC_SHAPE(BATCH, 1));
    }
    if (mlc_error(t->ctx)) { fprintf(stderr, "bench: %s\n", mlc_error_message(t->ctx)); return 0; }
    return 1;
}

static double check(trainer *t, double value) {   /* a failed op makes the number meaningless */
    if (mlc_error(t->ctx)) { fprintf(stderr, "bench: %s\n", mlc_error_message(t->ctx)); return NAN; }
    return value;
}

/* Batch-1 inference: eval mode, gradients off, one image through the model. */
static void infer_one(void *arg) {
    trainer *t = (trainer *)arg;
    mlc_frame f = mlc_frame_begin(t->ctx);
    mlc_forward(t->model, t->x);
    mlc_frame_end(f);
}

static double infer_us(mlc_module *(*build)(mlc_ctx *), const dataset *data, int x_ndim, const int *x_shape) {
    trainer t;
    int shape[4] = { 1 };
    double sec;
    if (!trainer_init(&t, 0, build, data, x_ndim, x_shape)) return NAN;
    memcpy(shape + 1, x_shape, (size_t)x_ndim * sizeof(int));
    t.x = mlc_empty(t.ctx, x_ndim + 1, shape);
    for (int i = 0; t.x && i < 784; i++) t.x->data[i] = data->images[i] * (1.0f / 255.0f);
    mlc_module_train(t.model, 0);
    mlc_set_grad_enabled(t.ctx, 0);
    sec = check(&t, seconds_per_call(infer_one, &t, 0.2, 7));
    mlc_destroy(t.ctx);
    return sec * 1e6;
}

static double tiny_step_us(void) {
    trainer t;
    double sec;
    if (!trainer_init(&t, 0, tiny_mlp, NULL, 0, NULL)) return NAN;
    sec = check(&t, seconds_per_call(train_step, &t, 0.2, 7));
    mlc_destroy(t.ctx);
    return sec * 1e6;
}

/* An LSTM: 2 layers 32 -> 128 (batch first) and a linear head on every step; one Adam step (MSE)
   on a fixed random batch of BATCH sequences of 50 steps. */
static mlc_module *lstm_model(mlc_ctx *ctx) {
    return mlc_nn_sequential(ctx, mlc_nn_lstm(ctx, 32, 128, 2), mlc_nn_linear(ctx, 128, 1), NULL);
}

static double lstm_step_ms(void) {
    trainer t;
    double sec;
    if (!trainer_init(&t, 0, lstm_model, NULL, 0, NULL)) return NAN;
    t.x = mlc_randn(t.ctx, MLC_SHAPE(BATCH, 50, 32));      /* in place of the tiny MLP's batch */
    t.y = mlc_randn(t.ctx, MLC_SHAPE(BATCH, 50, 1));
    sec = check(&t, seconds_per_call(train_step, &t, 0.4, 7));
    mlc_destroy(t.ctx);
    return sec * 1e3;
}

static double train_samples_per_s(int with_hook, mlc_module *(*build)(mlc_ctx *), const dataset *data,
                                  int x_ndim, const int *x_shape) {
    trainer t;
    double sec;
    if (!trainer_init(&t, with_hook, build, data, x_ndim, x_shape)) return NAN;
    sec = check(&t, seconds_per_call(train_step, &t, 0.4, 7));
    mlc_destroy(t.ctx);
    return BATCH / sec;
}

static const int mlp_input[] = { 784 }, cnn_input[] = { 1, 28, 28 };

/* ============================================================================================
   0. Epoch training, as a user's loop runs it
   ============================================================================================ */

/* Multiply-adds of one sample's forward pass through the convs (output height x width x output
   channels x kernel area x input channels) and the linears (inputs x outputs); the same sums as
   text for the report */
#define MLP_MACS 784 * 256 + 256 * 128 + 128 * 10
#define CNN_MACS 28 * 28 * 16 * 9 * 1 + 14 * 14 * 32 * 9 * 16 + 32 * 7 * 7 * 128 + 128 * 10
#define BENCH_TEXT_(x) #x
#define BENCH_TEXT(x) BENCH_TEXT_(x)

typedef struct bench_model {
    const char *name;                   /* for --model and the key lines: "mlp", "cnn" */
    const char *label, *short_label;    /* for the table */
    mlc_module *(*build)(mlc_ctx *);
    int x_ndim;
    const int *x_shape;                 /* one image as the model takes it */
    double macs;                        /* multiply-adds of one sample's forward */
    const char *macs_sum;               /* the same as the sum of the layers' shapes */
    double target_one, target_all;      /* issue 14: mlc / PyTorch 1 thread on 1 thread, and
                                           mlc / PyTorch's best setting on all threads */
} bench_model;

static const bench_model bench_models[] = {
    { "mlp", "MLP 784-256-128-10", "MLP", fashion_mlp, 1, mlp_input, (MLP_MACS), BENCH_TEXT(MLP_MACS),
      1.3, 1.5 },
    { "cnn", "CNN conv16-pool-conv32-pool-fc128-fc10", "CNN", fashion_cnn, 3, cnn_input, (CNN_MACS),
      BENCH_TEXT(CNN_MACS), 1.5, 2 },
};
#define BENCH_MODELS (int)(sizeof bench_models / sizeof bench_models[0])
#define MAX_RUNS 100

/* FLOPs of one training sample: the forward, the input gradient and the weight gradient, each
   2 FLOPs per multiply-add (the first conv's input gradient is counted though not computed) */
static double flops_per_sample(const bench_model *m) { return 3 * 2 * m->macs; }

typedef struct epoch_run { double sps, loss_first, loss_last; } epoch_run;

static double mean_of(const float *v, long n) {
    double sum = 0;
    for (long i = 0; i < n; i++) sum += v[i];
    return sum / (double)n;
}

/* Shuffle order[0..n) into a new Fisher-Yates order, drawing from ctx's generator. */
static void shuffle(mlc_ctx *ctx, int *order, int n) {
    for (int i = 0; i < n; i++) order[i] = i;
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(mlc_rand_u32(ctx) % (uint32_t)(i + 1)), k = order[i];
        order[i] = order[j];
        order[j] = k;
    }
}

/* One run on `threads` threads: a fresh context and model (seed 42, PyTorch's default init),
   Adam lr 1e-3, cross entropy, samples / BATCH steps over the data in a new shuffled order each
   epoch (seed 1000 + run; an epoch's last partial batch is dropped). Gathering and scaling a
   batch is not timed; the step is, frame begin to frame end. sps: samples / summed step time;
   loss_first, loss_last: the mean loss of the first and of the last min(100, steps / 2) steps.
   bf16: the steps under bf16 autocast (step_on_batch). */
static epoch_run epoch_once(const bench_model *m, const dataset *d, int threads, long samples, int run,
                            int bf16) {
    epoch_run r = { NAN, NAN, NAN };
    long steps = samples / BATCH, window = steps < 200 ? (steps > 1 ? steps / 2 : 1) : 100;
    int pos = d->count, *order = malloc((size_t)d->count * sizeof(int));
    float *losses = malloc((size_t)(steps > 0 ? steps : 1) * sizeof(float));
    double timed = 0;
    trainer t;
    set_threads(threads);
    if (steps < 1 || d->count < BATCH || !order || !losses ||
        !trainer_init(&t, 0, m->build, d, m->x_ndim, m->x_shape)) {
        free(order);
        free(losses);
        return r;
    }
    mlc_seed(t.ctx, 1000 + (uint64_t)run);
    t.bf16 = bf16;
    for (long s = 0; s < steps; s++) {
        if (pos + BATCH > d->count) { shuffle(t.ctx, order, d->count); pos = 0; }
        for (int b = 0; b < BATCH; b++) {        /* the gather, as a user's loader does it */
            const unsigned char *pixels = d->images + (size_t)order[pos + b] * 784;
            float *x = t.x->data + (size_t)b * 784;
            for (int i = 0; i < 784; i++) x[i] = pixels[i] * (1.0f / 255.0f);
            t.y->data[b] = d->labels[order[pos + b]];
        }
        pos += BATCH;
        double start = now();
        step_on_batch(&t, &losses[s]);
        timed += now() - start;
    }
    if (check(&t, timed) > 0) {
        r.sps = (double)(steps * BATCH) / timed;
        r.loss_first = mean_of(losses, window);
        r.loss_last = mean_of(losses + steps - window, window);
    }
    mlc_destroy(t.ctx);
    free(order);
    free(losses);
    return r;
}

typedef struct epoch_row {
    double median, min, max;            /* samples/s over the runs; NAN: not measured */
    double loss_first, loss_last;       /* epoch_run's, averaged over the runs */
} epoch_row;

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* median, min and max of values[0..n) (n >= 1; sorts them) */
static void median_of(double *values, int n, double *median, double *min, double *max) {
    qsort(values, (size_t)n, sizeof values[0], by_value);
    *min = values[0];
    *max = values[n - 1];
    *median = n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

/* The row of `runs` runs (1..MAX_RUNS) of epoch_once; NANs when one failed */
static epoch_row epoch_row_of(const epoch_run *got, int runs) {
    epoch_row e = { NAN, NAN, NAN, 0, 0 };
    double sps[MAX_RUNS];
    for (int r = 0; r < runs; r++) {
        if (isnan(got[r].sps)) return (epoch_row){ NAN, NAN, NAN, NAN, NAN };
        sps[r] = got[r].sps;
        e.loss_first += got[r].loss_first / runs;
        e.loss_last += got[r].loss_last / runs;
    }
    median_of(sps, runs, &e.median, &e.min, &e.max);
    return e;
}

/* ============================================================================================
   The machine's FMA peak: chains of multiply-adds in registers, no memory traffic
   ============================================================================================ */

#define FMA_CHAINS 12                   /* independent chains in the peak loop */
#ifdef BENCH_X86
/* FMA_CHAINS independent chains a = a * m + c (m just below 1, so they settle and never
   overflow), enough to cover two FMA units' latency; then one sum, so that the work is kept */
#define FMA_LOOP(vec, lanes, splat, madd, store)                                                  \
    vec m = splat(0.999f), c = splat(0.001f), a0 = splat(0.0f), a1 = splat(0.1f), a2 = splat(0.2f), \
        a3 = splat(0.3f), a4 = splat(0.4f), a5 = splat(0.5f), a6 = splat(0.6f), a7 = splat(0.7f),    \
        a8 = splat(0.8f), a9 = splat(0.9f), a10 = splat(1.0f), a11 = splat(1.1f);                  \
    float out[lanes];                                                                              \
    double sum = 0;                                                                                \
    for (long i = 0; i < iters; i++) {                                                            \
        a0 = madd(a0, m, c); a1 = madd(a1, m, c); a2 = madd(a2, m, c); a3 = madd(a3, m, c);         \
        a4 = madd(a4, m, c); a5 = madd(a5, m, c); a6 = madd(a6, m, c); a7 = madd(a7, m, c);         \
        a8 = madd(a8, m, c); a9 = madd(a9, m, c); a10 = madd(a10, m, c); a11 = madd(a11, m, c);     \
    }                                                                                              \
    a0 = madd(a1, m, a0); a0 = madd(a2, m, a0); a0 = madd(a3, m, a0); a0 = madd(a4, m, a0);         \
    a0 = madd(a5, m, a0); a0 = madd(a6, m, a0); a0 = madd(a7, m, a0); a0 = madd(a8, m, a0);         \
    a0 = madd(a9, m, a0); a0 = madd(a10, m, a0); a0 = madd(a11, m, a0);                            \
    store(out, a0);                                                                                \
    for (int l = 0; l < lanes; l++) sum += out[l];                                                 \
    return sum

__attribute__((target("avx512f"))) static double fma_avx512(long iters) {
    FMA_LOOP(__m512, 16, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_storeu_ps);
}

__attribute__((target("avx2,fma"))) static double fma_avx2(long iters) {
    FMA_LOOP(__m256, 8, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_storeu_ps);
}

#define SCALAR_SPLAT(x) (x)
#define SCALAR_MADD(a, b, c) ((a) * (b) + (c))
#define SCALAR_STORE(p, x) ((p)[0] = (x))
static double fma_scalar(long iters) {             /* a multiply and an add: 2 FLOPs too */
    FMA_LOOP(float, 1, SCALAR_SPLAT, SCALAR_MADD, SCALAR_STORE);
}
#endif

/* The machine's peak GFLOP/s on `threads` threads (one copy of the loop each, OpenMP), the best
   of 3 passes of about 0.1 s; NAN off x86. isa: the instructions it used. */
static double fma_peak_gflops(int threads, const char **isa) {
    *isa = "-";
#ifdef BENCH_X86
    double (*loop)(long) = fma_scalar, t = 0, best = 0;
    int lanes = 1;
    long iters = 1000;
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) loop = fma_avx512, lanes = 16, *isa = "AVX-512";
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) loop = fma_avx2, lanes = 8,
        *isa = "AVX2+FMA";
    else *isa = "scalar (no AVX2+FMA)";
#ifndef _OPENMP
    threads = 1;
#endif
    for (; iters < (1L << 40); iters *= 2) {            /* calibrate on one thread: 10 ms at least */
        t = now();
        if (loop(iters) < 0) fprintf(stderr, "bench: the FMA loop went negative\n");
        if ((t = now() - t) >= 0.01) break;
    }
    iters = (long)((double)iters * (quick ? 0.05 : 0.1) / t) + 1;
    for (int pass = 0; pass < 3; pass++) {
        t = now();
#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
#endif
        if (loop(iters) < 0) fprintf(stderr, "bench: the FMA loop went negative\n");
        double gflops = (double)threads * (double)iters * FMA_CHAINS * lanes * 2 / (now() - t) * 1e-9;
        if (gflops > best) best = gflops;
    }
    return best;
#else
    (void)threads;
    return NAN;
#endif
}

/* ============================================================================================
   6. The tiny GPT of examples/gpt.c: one training step on 16 random windows of 64 characters
   ============================================================================================ */

#define GPT_TEXT "data/kjv_pentateuch.txt"
enum { GPT_BATCH = 16, GPT_BLOCK = 64 };

typedef struct gpt_bench {
    mlc_ctx *ctx;
    mlc_module *gpt;
    mlc_optim *opt;
    unsigned char *ids;                 /* the text as character ids */
    long n;
    int vocab;
    float x[GPT_BATCH * GPT_BLOCK], y[GPT_BATCH * GPT_BLOCK];
} gpt_bench;

/* examples/gpt.c's step: a batch, forward, backward, clipping, AdamW (at a fixed lr) */
static void gpt_step(void *arg) {
    gpt_bench *b = (gpt_bench *)arg;
    for (int r = 0; r < GPT_BATCH; r++) {
        long start = (long)(mlc_rand_u32(b->ctx) % (uint32_t)(b->n - GPT_BLOCK - 1));
        for (int t = 0; t < GPT_BLOCK; t++) {
            b->x[r * GPT_BLOCK + t] = b->ids[start + t];
            b->y[r * GPT_BLOCK + t] = b->ids[start + t + 1];
        }
    }
    mlc_frame f = mlc_frame_begin(b->ctx);
    mlc_tensor *x = mlc_from_data(b->ctx, MLC_SHAPE(GPT_BATCH, GPT_BLOCK), b->x);
    mlc_tensor *y = mlc_from_data(b->ctx, MLC_SHAPE(GPT_BATCH * GPT_BLOCK), b->y);
    mlc_tensor *loss = gpt_loss(b->gpt, x, y, b->vocab);
    mlc_zero_grad(b->opt);
    mlc_backward(loss);
    mlc_clip_grad_norm(b->opt, 1.0f);
    mlc_step(b->opt);
    mlc_frame_end(f);
}

/* Training tokens/s with `threads` threads; NAN when the text is missing or an op failed. */
static double gpt_tokens_per_s(int threads) {
    gpt_bench b = { 0 };
    int id_of[256], present[256] = { 0 };
    double sec = NAN;
    FILE *f = fopen(GPT_TEXT, "rb");
    if (!f) { fprintf(stderr, "bench: %s not found: the GPT rows are skipped\n", GPT_TEXT); return NAN; }
    fseek(f, 0, SEEK_END);
    b.n = ftell(f);
    fseek(f, 0, SEEK_SET);
    b.ids = b.n > GPT_BLOCK + 1 ? malloc((size_t)b.n) : NULL;
    if (b.ids && fread(b.ids, 1, (size_t)b.n, f) == (size_t)b.n) {
        for (long i = 0; i < b.n; i++) present[b.ids[i]] = 1;
        for (int c = 0; c < 256; c++) id_of[c] = present[c] ? b.vocab++ : 0;
        for (long i = 0; i < b.n; i++) b.ids[i] = (unsigned char)id_of[b.ids[i]];
        set_threads(threads);
        b.ctx = make_ctx(0);
        b.gpt = gpt_create(b.ctx, (gpt_config){ b.vocab, GPT_BLOCK, 4, 64, 4 });
        b.opt = b.gpt ? gpt_optimiser(b.gpt, 1e-3f) : NULL;
        if (b.opt) sec = seconds_per_call(gpt_step, &b, 0.5, 5);
        if (mlc_error(b.ctx)) { fprintf(stderr, "bench: GPT: %s\n", mlc_error_message(b.ctx)); sec = NAN; }
        mlc_destroy(b.ctx);
        set_threads(all_threads);
    }
    fclose(f);
    free(b.ids);
    return GPT_BATCH * GPT_BLOCK / sec;
}

/* ============================================================================================
   5. Memory: a process that only trains the MLP (random batch, no dataset, no OpenBLAS calls)
   ============================================================================================ */

static long peak_rss_kib(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;                /* KiB on Linux */
}

/* What MLP training must hold, from the shapes: parameters, their gradients, Adam's two
   moment buffers, and one batch of activations (input, each layer's output, the targets). */
static size_t mlp_needed_bytes(size_t params) {
    size_t activations = (size_t)BATCH * (784 + 256 + 256 + 128 + 128 + 10) + BATCH;
    return sizeof(float) * (4 * params + activations);
}

static int rss_child(void) {
    long start_kib = peak_rss_kib();
    trainer t;
    dataset d;
    random_data(&d, BATCH, "one random batch: the dataset would count against the RSS");
    if (!trainer_init(&t, 0, fashion_mlp, &d, 1, mlp_input)) return 1;
    for (int i = 0; i < 20; i++) train_step(&t);
    if (mlc_error(t.ctx)) { fprintf(stderr, "bench: %s\n", mlc_error_message(t.ctx)); return 1; }
    printf("rss_peak_kib %ld\n", peak_rss_kib());
    printf("rss_start_kib %ld\n", start_kib);
    printf("rss_need_bytes %zu\n", mlp_needed_bytes(mlc_module_param_count(t.model)));
    printf("rss_mlc_heap_peak_bytes %zu\n", mlc_get_stats(t.ctx).bytes_peak);
    mlc_destroy(t.ctx);
    free_data(&d);
    return 0;
}

/* ============================================================================================
   Results of the other runs: "key value" lines
   ============================================================================================ */

typedef struct kv { char key[64], value[192]; } kv;
enum { KV_MAX = 128 };
typedef struct kv_file { int count, found; kv items[KV_MAX]; } kv_file;

static void kv_parse(kv_file *f, FILE *in) {
    char line[300];
    memset(f, 0, sizeof *f);
    f->found = 1;
    while (f->count < KV_MAX && fgets(line, sizeof line, in)) {
        kv *e = &f->items[f->count];
        char *space = strchr(line, ' ');
        if (!space || space - line >= (long)sizeof e->key) continue;
        memcpy(e->key, line, (size_t)(space - line));
        snprintf(e->value, sizeof e->value, "%s", space + 1);
        e->value[strcspn(e->value, "\r\n")] = '\0';
        f->count++;
    }
}

static void kv_read(kv_file *f, const char *path) {
    FILE *in = path ? fopen(path, "r") : NULL;
    memset(f, 0, sizeof *f);
    if (!in) return;
    kv_parse(f, in);
    fclose(in);
}

static const char *kv_str(const kv_file *f, const char *key) {
    for (int i = 0; i < f->count; i++) if (strcmp(f->items[i].key, key) == 0) return f->items[i].value;
    return NULL;
}

static double kv_num(const kv_file *f, const char *key) {
    const char *s = kv_str(f, key);
    return s ? strtod(s, NULL) : NAN;
}

/* ============================================================================================
   7. int8 (issue 26): batch-1 latency of the CNN, float32 and statically quantized, 1 thread
   ============================================================================================ */

#define INT8_CALIBRATION 8              /* batches of BATCH training images (torch_bench.py's too) */
#define INT8_RUNS 301                   /* single calls timed of each model (--quick: 51) */

typedef struct int8_latency {
    double us[2];                       /* median µs of a call: [0] float32, [1] int8 */
    double cosine;                      /* the two outputs' on the calibration images */
} int8_latency;

static double forward_us(mlc_ctx *ctx, mlc_module *model, mlc_tensor *x) {
    double t = now();
    mlc_frame f = mlc_frame_begin(ctx);
    mlc_forward(model, x);
    mlc_frame_end(f);
    return (now() - t) * 1e6;
}

/* The CNN of 3. (fashion_cnn, seed 42) twice, on 1 thread each, one converted by
   mlc_quantize_static calibrated on the first INT8_CALIBRATION batches of training images;
   then one image at a time (eval, no gradients): 10 warm-up calls of each, then `runs` pairs of
   calls, float32 then int8, so both see the machine in the same state; the medians. Also the
   cosine of the two models' logits on the calibration images (a check that the int8 model
   computes the same thing). 0 on an error (said). */
static int int8_cnn_latency(const dataset *d, int runs, int8_latency *out) {
    mlc_ctx *ctx[2];
    mlc_module *model[2];
    mlc_tensor *x[2], *calibration[INT8_CALIBRATION];
    double *took = malloc(2 * (size_t)runs * sizeof(double)), lo, hi, dot = 0, n0 = 0, n1 = 0;
    float *logits[2] = { NULL, NULL };
    const int images = INT8_CALIBRATION * BATCH, count = images * 10;
    int ok = took != NULL;
    set_threads(1);
    for (int m = 0; m < 2; m++) {
        ctx[m] = make_ctx(0);
        model[m] = ctx[m] ? fashion_cnn(ctx[m]) : NULL;
        x[m] = ctx[m] ? mlc_empty(ctx[m], MLC_SHAPE(1, 1, 28, 28)) : NULL;
        logits[m] = malloc((size_t)count * sizeof(float));
        if (!x[m] || !logits[m] || mlc_error(ctx[m])) { ok = 0; continue; }
        for (int i = 0; i < 784; i++) x[m]->data[i] = d->images[i] * (1.0f / 255.0f);
        mlc_module_train(model[m], 0);
        mlc_set_grad_enabled(ctx[m], 0);
    }
    for (int m = 0; ok && m < 2; m++) {           /* m = 1: quantized first, on its batches */
        mlc_frame f = mlc_frame_begin(ctx[m]);
        mlc_tensor *all = mlc_empty(ctx[m], MLC_SHAPE(images, 1, 28, 28));
        for (size_t i = 0; all && i < (size_t)images * 784; i++)
            all->data[i] = d->images[i] * (1.0f / 255.0f);
        for (int b = 0; all && m && b < INT8_CALIBRATION; b++)
            calibration[b] = mlc_slice(all, 0, b * BATCH, (b + 1) * BATCH);
        if (m) mlc_quantize_static(model[1], calibration, INT8_CALIBRATION);
        mlc_read(mlc_forward(model[m], all), logits[m], (size_t)count);
        mlc_frame_end(f);
    }
    for (int m = 0; ok && m < 2; m++)
        if (mlc_error(ctx[m])) { fprintf(stderr, "bench: int8: %s\n", mlc_error_message(ctx[m])); ok = 0; }
    for (int i = 0; ok && i < 20; i++) forward_us(ctx[i % 2], model[i % 2], x[i % 2]);      /* warm-up */
    for (int r = 0; ok && r < runs; r++) {
        took[r] = forward_us(ctx[0], model[0], x[0]);
        took[runs + r] = forward_us(ctx[1], model[1], x[1]);
    }
    for (int m = 0; ok && m < 2; m++) {
        if (mlc_error(ctx[m])) { fprintf(stderr, "bench: int8: %s\n", mlc_error_message(ctx[m])); ok = 0; }
        else median_of(took + (size_t)m * runs, runs, &out->us[m], &lo, &hi);
    }
    for (int i = 0; ok && i < count; i++) {
        dot += (double)logits[0][i] * logits[1][i];
        n0 += (double)logits[0][i] * logits[0][i];
        n1 += (double)logits[1][i] * logits[1][i];
    }
    out->cosine = ok && n0 > 0 && n1 > 0 ? dot / sqrt(n0 * n1) : NAN;
    for (int m = 0; m < 2; m++) { mlc_destroy(ctx[m]); free(logits[m]); }
    free(took);
    return ok;
}

/* ============================================================================================
   The report
   ============================================================================================ */

static void cpu_model(char *out, size_t size) {
    char line[256];
    FILE *f = fopen("/proc/cpuinfo", "r");
    snprintf(out, size, "unknown CPU");
    while (f && fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (strncmp(line, "model name", 10) == 0 && colon) {
            snprintf(out, size, "%s", colon + 2);
            out[strcspn(out, "\n")] = '\0';
            break;
        }
    }
    if (f) fclose(f);
}

static const char *num(char *buf, double v, int decimals) {   /* "-" for a number we do not have */
    if (isnan(v) || v <= 0) return "-";
    snprintf(buf, 32, "%.*f", decimals, v);
    return buf;
}

static const char *times(char *buf, double r) {                /* a ratio, "-" when unknown */
    if (isnan(r) || isinf(r) || r <= 0) return "-";
    snprintf(buf, 32, "%.2fx", r);
    return buf;
}

/* A ratio's verdict against its target: "met", "not met", "skipped" (unknown), with a "?" when
   other processes were busy; buf holds 32 bytes */
static const char *verdict_of(char *buf, double ratio, double target) {
    int known = !isnan(ratio) && ratio > 0;
    snprintf(buf, 32, "%s%s", !known ? "skipped" : ratio >= target ? "met" : "not met",
             disturbed && known ? "?" : "");
    return buf;
}

/* The report's first lines: the machine, the build, the data, the load */
static void print_header(const kv_file *torch, const dataset *data, double others_mlc, double others_torch) {
    char cpu[160];
    cpu_model(cpu, sizeof cpu);
    printf("\n# mlc %s benchmark%s\n\n", MLC_VERSION_STRING, quick ? " (--quick: short runs)" : "");
    printf("- machine: %s, %ld cores online\n", cpu, sysconf(_SC_NPROCESSORS_ONLN));
#if defined(__clang__)
    printf("- compiler: clang %s, -O2", __VERSION__);
#elif defined(__GNUC__)
    printf("- compiler: gcc %s, -O2", __VERSION__);
#else
    printf("- compiler: unknown, -O2");
#endif
#ifdef _OPENMP
    printf(" -fopenmp (OpenMP %d)\n", _OPENMP);
#else
    printf(" (no OpenMP: 1 thread)\n");
#endif
#ifdef BENCH_OPENBLAS
    printf("- OpenBLAS: %s (core %s)\n", openblas_get_config(), openblas_get_corename());
#else
    printf("- OpenBLAS: not found, its columns are skipped\n");
#endif
    if (kv_str(torch, "torch_version"))
        printf("- PyTorch: %s, all threads = %s; its data: %s\n", kv_str(torch, "torch_version"),
               kv_str(torch, "torch_threads") ? kv_str(torch, "torch_threads") : "?",
               kv_str(torch, "torch_data") ? kv_str(torch, "torch_data") : "?");
    else
        printf("- PyTorch: not available (python3 -c 'import torch' failed), its columns are skipped\n");
    printf("- data: %s\n", data->source);
    printf("- threads: 1 and all (%d) for the epoch rows and the GPT rows, all for the other\n"
           "  micro-benchmarks (OpenMP for mlc, torch.set_num_threads for PyTorch)\n", all_threads);
    printf("- other processes used %.0f%% of the CPUs during the mlc measurements", others_mlc);
    if (!isnan(others_torch)) printf(", %.0f%% during PyTorch's", others_torch);
    printf("%s\n", disturbed ? ": the numbers are disturbed, a \"?\" marks the verdicts that depend on them"
                             : " (quiet enough)");
}

/* ============================================================================================
   The epoch rows: measure, print as key lines or as the first table
   ============================================================================================ */

/* The key of a figure of an epoch row: "epoch_mlp_t1_median", under bf16 autocast
   "epoch_mlp_bf16_t1_median" (bench_torch.py writes the same) */
static const char *epoch_key(char *buf, const bench_model *m, int threads, const char *what, int bf16) {
    snprintf(buf, 64, "epoch_%s%s_t%d_%s", m->name, bf16 ? "_bf16" : "", threads, what);
    return buf;
}

typedef struct epoch_table {
    int settings, threads[2];           /* the thread settings: 1 and all, or --threads N */
    double peak[2];                     /* FMA peak GFLOP/s on each setting's threads */
    const char *isa;                    /* the peak loop's instructions */
    int model_on[BENCH_MODELS];         /* measured (all, or --model's) */
    epoch_row rows[BENCH_MODELS][2];
    double scaling[BENCH_MODELS][3];    /* the second setting's samples/s / the first's, run by run:
                                           median, min, max (NAN with one setting) */
    const char *plain_exe;              /* the plain `cc -O2` build, run before each 1-thread run */
    double plain[BENCH_MODELS][3];      /* its samples/s: median, min, max (NAN: not run) */
    double plain_ratio[BENCH_MODELS][3];/* its samples/s / the 1-thread run's, run by run */
    const char *self_exe;               /* this program, for the independent runs (NULL: none) */
    double ceiling[BENCH_MODELS][3];    /* N independent 1-thread runs at once, their summed samples/s
                                           / the 1-thread run's, run by run: the most N threads can
                                           give on this machine at that moment */
    double of_ceiling[BENCH_MODELS][3]; /* the N-thread run's samples/s / those runs' sum, run by run */
    const char *torch_cmd;              /* PyTorch's epoch run, just before each of mlc's (NULL: the
                                           --torch file's rows, measured before mlc's) */
    double torch[BENCH_MODELS][2][3];   /* its samples/s per setting: median, min, max */
    double vs_torch[BENCH_MODELS][2][3];/* mlc / PyTorch on as many threads, run by run */
    double vs_best[BENCH_MODELS][2][3]; /* mlc / PyTorch's faster setting of the same run */
    int f32_on, bf16_wanted, bf16_on;   /* measured: float32 rows; bf16 rows asked for, measured */
    int bf16_cpu, amx;                  /* the CPU has AVX-512 BF16; AMX-BF16 */
    epoch_row bf16_rows[BENCH_MODELS][2];       /* mlc under bf16 autocast */
    double bf16_vs_f32[BENCH_MODELS][2][3];     /* its samples/s / float32's, run by run */
    double torch_bf16[BENCH_MODELS][2][3];      /* PyTorch under torch.autocast: samples/s */
    double bf16_vs_torch[BENCH_MODELS][2][3];   /* mlc bf16 / PyTorch bf16, as vs_torch */
    double bf16_vs_best[BENCH_MODELS][2][3];    /* ... and as vs_best */
} epoch_table;

/* One epoch run in a process of its own: `OPENBLAS_NUM_THREADS=N COMMAND --epochs-only --model M
   --threads N --runs 1 --samples S --amp off|bf16` prints "key value" lines (the plain build and
   this program with --kv, torch_bench.py; OpenBLAS's threads set as well, since Debian's PyTorch
   multiplies through OpenBLAS). child_start starts it (NULL when it cannot), child_sps waits for
   it: its samples/s, NAN when it failed. */
static FILE *child_start(const char *command_prefix, const bench_model *m, int threads, long samples,
                         int bf16) {
    char command[1300];
    snprintf(command, sizeof command, "OPENBLAS_NUM_THREADS=%d %s --epochs-only --model %s --threads %d "
             "--runs 1 --samples %ld --amp %s 2>/dev/null", threads, command_prefix, m->name, threads,
             samples, bf16 ? "bf16" : "off");
    return popen(command, "r");
}

static double child_sps(FILE *child, const bench_model *m, int threads, int bf16) {
    char key[64];
    kv_file out;
    if (!child) return NAN;
    kv_parse(&out, child);
    return pclose(child) == 0 ? kv_num(&out, epoch_key(key, m, threads, "median", bf16)) : NAN;
}

/* One such run; `who` names it in the line on stderr. */
static double child_run(const char *command_prefix, const char *who, const bench_model *m, int threads,
                        long samples, int run, int runs, int bf16) {
    double sps = child_sps(child_start(command_prefix, m, threads, samples, bf16), m, threads, bf16);
    fprintf(stderr, "bench: %s, %s, %d thread%s, run %d/%d: %.0f samples/s\n", m->label, who, threads,
            threads > 1 ? "s" : "", run + 1, runs, sps);
    return sps;
}

/* n 1-thread epoch runs of this program at once, each in a process of its own (nothing shared,
   nothing waited for): the samples/s they reach together, NAN when one fails. Their sum over
   the 1-thread run's is what n threads could give at most on this machine at that moment: on
   a VM whose vCPUs are slowed in turn by other guests, well under n. */
static double independent_runs(const char *self, const bench_model *m, int n, long samples, int run, int runs) {
    enum { MOST = 64 };
    FILE *child[MOST];
    char prefix[1100];
    double sum = n <= MOST ? 0 : NAN;
    int c;
    snprintf(prefix, sizeof prefix, "'%s' --kv", self);
    for (c = 0; c < n && c < MOST; c++) child[c] = child_start(prefix, m, 1, samples, 0);
    for (c = 0; c < n && c < MOST; c++) sum += child_sps(child[c], m, 1, 0);
    fprintf(stderr, "bench: %s, %d independent 1-thread runs at once, run %d/%d: %.0f samples/s together\n",
            m->label, n, run + 1, runs, sum);
    return sum;
}

/* mlc / PyTorch run by run on each setting: on as many threads (same) and against PyTorch's
   faster setting of the same run (best); then PyTorch's own samples/s (median, min, max) */
static void versus_torch(const epoch_table *et, epoch_run got[2][MAX_RUNS], double torch[2][MAX_RUNS],
                         int runs, double same[2][3], double best[2][3], double median[2][3]) {
    double ratio[MAX_RUNS];
    for (int s = 0; s < et->settings; s++) {
        for (int r = 0; r < runs; r++) ratio[r] = got[s][r].sps / torch[s][r];
        median_of(ratio, runs, &same[s][0], &same[s][1], &same[s][2]);
        for (int r = 0; r < runs; r++) {
            double b = torch[s][r];
            for (int o = 0; o < et->settings; o++) b = torch[o][r] > b ? torch[o][r] : b;
            ratio[r] = got[s][r].sps / b;
        }
        median_of(ratio, runs, &best[s][0], &best[s][1], &best[s][2]);
    }
    for (int s = 0; s < et->settings; s++)
        median_of(torch[s], runs, &median[s][0], &median[s][1], &median[s][2]);
}

static void set_nan(double v[3]) { v[0] = v[1] = v[2] = NAN; }

/* Run r measures every model on every setting, one after the other, so that the settings of a
   run share the machine's state of the moment (this VM's speed drifts by a third within
   minutes): the thread scaling is taken run by run, from such pairs. On a setting: the plain
   build (1 thread), PyTorch, mlc (float32), the independent runs (all threads), then mlc under
   bf16 autocast and PyTorch under torch.autocast. A line per run on stderr. */
static void measure_epochs(epoch_table *et, const dataset *d, long samples, int runs) {
    static epoch_run got[BENCH_MODELS][2][MAX_RUNS], got16[BENCH_MODELS][2][MAX_RUNS];
    static double plain[BENCH_MODELS][MAX_RUNS], torch[BENCH_MODELS][2][MAX_RUNS], apart[BENCH_MODELS][MAX_RUNS];
    static double torch16[BENCH_MODELS][2][MAX_RUNS];
    char plain_cmd[1100];
    snprintf(plain_cmd, sizeof plain_cmd, "'%s' --kv", et->plain_exe ? et->plain_exe : "");
    for (int s = 0; s < et->settings; s++) et->peak[s] = fma_peak_gflops(et->threads[s], &et->isa);
    for (int r = 0; r < runs; r++)
        for (int m = 0; m < BENCH_MODELS; m++)
            for (int s = 0; s < et->settings && et->model_on[m]; s++) {
                const bench_model *bm = &bench_models[m];
                int n = et->threads[s];
                if (et->f32_on) {
                    epoch_run *one = &got[m][s][r];
                    if (n == 1 && et->plain_exe)
                        plain[m][r] = child_run(plain_cmd, "plain cc -O2 build", bm, 1, samples, r, runs, 0);
                    if (et->torch_cmd)
                        torch[m][s][r] = child_run(et->torch_cmd, "PyTorch", bm, n, samples, r, runs, 0);
                    *one = epoch_once(bm, d, n, samples, r, 0);
                    fprintf(stderr, "bench: %s, %d thread%s, run %d/%d: %.0f samples/s, loss %.3f "
                            "(first steps) -> %.3f (last)\n", bm->label, n, n > 1 ? "s" : "", r + 1, runs,
                            one->sps, one->loss_first, one->loss_last);
                    if (s == 1 && et->threads[0] == 1 && et->self_exe)
                        apart[m][r] = independent_runs(et->self_exe, bm, et->threads[1], samples, r, runs);
                }
                if (et->bf16_on) {
                    epoch_run *one = &got16[m][s][r];
                    *one = epoch_once(bm, d, n, samples, r, 1);
                    fprintf(stderr, "bench: %s, bf16 autocast, %d thread%s, run %d/%d: %.0f samples/s, "
                            "loss %.3f (first steps) -> %.3f (last)\n", bm->label, n, n > 1 ? "s" : "",
                            r + 1, runs, one->sps, one->loss_first, one->loss_last);
                    if (et->torch_cmd)
                        torch16[m][s][r] = child_run(et->torch_cmd, "PyTorch bf16 autocast", bm, n, samples,
                                                     r, runs, 1);
                }
            }
    for (int m = 0; m < BENCH_MODELS; m++) {
        double ratio[MAX_RUNS];
        set_nan(et->scaling[m]); set_nan(et->plain[m]); set_nan(et->plain_ratio[m]);
        set_nan(et->ceiling[m]); set_nan(et->of_ceiling[m]);
        for (int s = 0; s < 2; s++) {
            et->rows[m][s] = et->bf16_rows[m][s] = (epoch_row){ NAN, NAN, NAN, NAN, NAN };
            set_nan(et->torch[m][s]); set_nan(et->vs_torch[m][s]); set_nan(et->vs_best[m][s]);
            set_nan(et->bf16_vs_f32[m][s]); set_nan(et->torch_bf16[m][s]);
            set_nan(et->bf16_vs_torch[m][s]); set_nan(et->bf16_vs_best[m][s]);
        }
        if (!et->model_on[m]) continue;
        if (et->bf16_on) {
            for (int s = 0; s < et->settings; s++) {
                et->bf16_rows[m][s] = epoch_row_of(got16[m][s], runs);
                if (!et->f32_on) continue;
                for (int r = 0; r < runs; r++) ratio[r] = got16[m][s][r].sps / got[m][s][r].sps;
                median_of(ratio, runs, &et->bf16_vs_f32[m][s][0], &et->bf16_vs_f32[m][s][1],
                          &et->bf16_vs_f32[m][s][2]);
            }
            if (et->torch_cmd)
                versus_torch(et, got16[m], torch16[m], runs, et->bf16_vs_torch[m], et->bf16_vs_best[m],
                             et->torch_bf16[m]);
        }
        if (!et->f32_on) continue;
        for (int s = 0; s < et->settings; s++) et->rows[m][s] = epoch_row_of(got[m][s], runs);
        if (et->torch_cmd)
            versus_torch(et, got[m], torch[m], runs, et->vs_torch[m], et->vs_best[m], et->torch[m]);
        if (et->settings == 2) {
            for (int r = 0; r < runs; r++) ratio[r] = got[m][1][r].sps / got[m][0][r].sps;
            median_of(ratio, runs, &et->scaling[m][0], &et->scaling[m][1], &et->scaling[m][2]);
        }
        if (et->settings == 2 && et->threads[0] == 1 && et->self_exe) {
            for (int r = 0; r < runs; r++) ratio[r] = apart[m][r] / got[m][0][r].sps;
            median_of(ratio, runs, &et->ceiling[m][0], &et->ceiling[m][1], &et->ceiling[m][2]);
            for (int r = 0; r < runs; r++) ratio[r] = got[m][1][r].sps / apart[m][r];
            median_of(ratio, runs, &et->of_ceiling[m][0], &et->of_ceiling[m][1], &et->of_ceiling[m][2]);
        }
        if (et->plain_exe && et->threads[0] == 1) {
            for (int r = 0; r < runs; r++) ratio[r] = plain[m][r] / got[m][0][r].sps;
            median_of(ratio, runs, &et->plain_ratio[m][0], &et->plain_ratio[m][1], &et->plain_ratio[m][2]);
            median_of(plain[m], runs, &et->plain[m][0], &et->plain[m][1], &et->plain[m][2]);
        }
    }
    set_threads(all_threads);
}

static void print_epoch_kv(const epoch_table *et) {
    char key[64];
    printf("fma_isa %s\n", et->isa);
    for (int s = 0; s < et->settings; s++) printf("fma_peak_t%d %.2f\n", et->threads[s], et->peak[s]);
    for (int m = 0; m < BENCH_MODELS; m++)
        for (int bf16 = 0; bf16 < 2; bf16++)
            for (int s = 0; s < et->settings; s++) {
                const epoch_row *e = bf16 ? &et->bf16_rows[m][s] : &et->rows[m][s];
                const bench_model *bm = &bench_models[m];
                int n = et->threads[s];
                if (!et->model_on[m] || !(bf16 ? et->bf16_on : et->f32_on)) continue;
                printf("%s %.1f\n", epoch_key(key, bm, n, "median", bf16), e->median);
                printf("%s %.1f\n", epoch_key(key, bm, n, "min", bf16), e->min);
                printf("%s %.1f\n", epoch_key(key, bm, n, "max", bf16), e->max);
                printf("%s %.4f\n", epoch_key(key, bm, n, "loss_first", bf16), e->loss_first);
                printf("%s %.4f\n", epoch_key(key, bm, n, "loss_last", bf16), e->loss_last);
            }
}

#define EPOCH_ROW "| %-49s | %9s | %-13s | %6s | %-13s | %9s | %9s | %7s | %7s | %-27s | %-8s |\n"
#define BF16_TARGET 1.5                 /* issue 25: bf16 autocast / float32 (with AMX), mlc / PyTorch bf16 */

/* A ratio row (scaling, build): the median of the runs' ratios in the mlc column, their range
   beside it; every_run: the target holds for the smallest, else for the median; target 0: none;
   skip (NULL: none): the verdict in place of the target's, where the CPU lacks what it needs */
static void epoch_ratio_row(const char *what, const double ratio[3], double target, int every_run,
                            const char *skip) {
    char r[32], range[32] = "-", goal[64] = "", verdict[32] = "";
    if (target > 0) snprintf(goal, sizeof goal, ">= %gx%s", target, every_run ? ", every run" : "");
    if (!isnan(ratio[1])) snprintf(range, sizeof range, "%.2fx-%.2fx", ratio[1], ratio[2]);
    if (target > 0) verdict_of(verdict, every_run ? ratio[1] : ratio[0], target);
    if (skip) snprintf(verdict, sizeof verdict, "%s", skip);
    printf(EPOCH_ROW, what, times(r, ratio[0]), range, "", "", "", "", "", "", goal, verdict);
}

/* Model m's row on each setting: float32 (bf16 0) or under bf16 autocast (bf16 1), beside
   PyTorch's same precision; one, all: the settings of 1 and of all threads (-1: not measured) */
static void print_model_rows(const epoch_table *et, const kv_file *torch, int m, int bf16, int one, int all,
                             int torch_all) {
    char key[64], col[8][32], what[96], goal[64], verdict[32];
    const bench_model *bm = &bench_models[m];
    double t1 = kv_num(torch, epoch_key(key, bm, 1, "median", bf16));
    double tall = kv_num(torch, epoch_key(key, bm, torch_all, "median", bf16));
    double best = isnan(t1) || tall > t1 ? tall : t1;
    const double (*paired)[3] = bf16 ? et->torch_bf16[m] : et->torch[m];
    if (et->torch_cmd) {                /* run by run, beside mlc's */
        t1 = one >= 0 ? paired[one][0] : NAN;
        tall = all >= 0 ? paired[all][0] : NAN;
    }
    for (int s = 0; s < et->settings; s++) {
        const epoch_row *e = bf16 ? &et->bf16_rows[m][s] : &et->rows[m][s];
        int n = et->threads[s];
        double same = kv_num(torch, epoch_key(key, bm, n, "median", bf16)), target = 0, ratio = NAN;
        double vs_same = e->median / same, vs_best = e->median / best;
        if (et->torch_cmd)
            vs_same = (bf16 ? et->bf16_vs_torch : et->vs_torch)[m][s][0],
            vs_best = (bf16 ? et->bf16_vs_best : et->vs_best)[m][s][0];
        int loss_ok = isfinite(e->loss_last) && e->loss_last < e->loss_first;
        if (bf16)
            snprintf(what, sizeof what, "%s bf16 autocast (AVX-512 BF16), %d thread%s", bm->short_label, n,
                     n > 1 ? "s" : "");
        else
            snprintf(what, sizeof what, "%s, %d thread%s", bm->label, n, n > 1 ? "s" : "");
        snprintf(col[0], 32, "%.0f-%.0f", e->min, e->max);
        snprintf(col[1], 32, "%.1f%%", 100 * e->median * flops_per_sample(bm) / (et->peak[s] * 1e9));
        snprintf(col[2], 32, "%.3f>%.3f", e->loss_first, e->loss_last);
        goal[0] = verdict[0] = '\0';
        if (n == 1) {
            target = bf16 ? BF16_TARGET : bm->target_one, ratio = vs_same;
            snprintf(goal, sizeof goal, ">= %gx PyTorch%s 1 thread", target, bf16 ? " bf16" : "");
        } else if (n == all_threads) {
            target = bf16 ? BF16_TARGET : bm->target_all, ratio = vs_best;
            snprintf(goal, sizeof goal, ">= %gx PyTorch%s best", target, bf16 ? " bf16" : "");
        }
        if (target > 0) verdict_of(verdict, ratio, target);
        if (!loss_ok) snprintf(verdict, sizeof verdict, "bad loss");
        if (bf16 && !et->bf16_on) snprintf(verdict, sizeof verdict, "skipped: no AVX-512 BF16");
        printf(EPOCH_ROW, what, num(col[3], e->median, 0), isnan(e->min) ? "-" : col[0],
               bf16 || isnan(et->peak[s]) || isnan(e->median) ? "-" : col[1],
               isnan(e->loss_first) ? "-" : col[2],
               num(col[4], t1, 0), num(col[5], tall, 0), times(col[6], vs_same), times(col[7], vs_best), goal,
               verdict);
    }
}

static void print_epoch_table(const epoch_table *et, const kv_file *torch, long samples, int runs) {
    char head[2][32], col[10][32], what[96];
    int one = -1, all = -1;             /* the settings of 1 thread and of all threads, if measured */
    int torch_all = kv_num(torch, "torch_threads") > 0 ? (int)kv_num(torch, "torch_threads") : all_threads;
    for (int s = 0; s < et->settings; s++) {
        if (et->threads[s] == 1) one = s;
        if (et->threads[s] == all_threads) all = s;
    }
    snprintf(head[0], sizeof head[0], "PyTorch 1");
    snprintf(head[1], sizeof head[1], "PyTorch %d", torch_all);
    printf("\n## Epoch training: what a user's loop gets\n\n");
    printf("%ld samples a run (%ld steps of %d), %s%d run%s, shuffled data, Adam lr 1e-3, cross entropy;\n"
           "samples/s = samples / summed step time (the batch gather not timed).\n\n",
           samples / BATCH * BATCH, samples / BATCH, BATCH, runs > 1 ? "median (min-max) of " : "", runs,
           runs > 1 ? "s" : "");
    printf(EPOCH_ROW, "epoch training (threads)", "samples/s", "min-max", "% peak", "loss 1st>last", head[0],
           head[1], "vs same", "vs best", "target", "result");
    printf("|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|\n", "---------------------------------------------------",
           "----------:", "---------------", "-------:", "---------------", "----------:", "----------:",
           "--------:", "--------:", "-----------------------------", "----------");
    for (int m = 0; m < BENCH_MODELS; m++) {
        const bench_model *bm = &bench_models[m];
        if (!et->model_on[m]) continue;
        if (et->f32_on) {
            print_model_rows(et, torch, m, 0, one, all, torch_all);
            if (one >= 0 && all >= 0 && all_threads > 1) {
                snprintf(what, sizeof what, "%s: %d threads / 1 thread", bm->short_label, all_threads);
                epoch_ratio_row(what, et->scaling[m], 1.7, 1, NULL);
            }
            if (!isnan(et->ceiling[m][0])) {
                snprintf(what, sizeof what, "%s: %d 1-thread runs at once / 1 thread", bm->short_label,
                         all_threads);
                epoch_ratio_row(what, et->ceiling[m], 0, 0, NULL);
                snprintf(what, sizeof what, "%s: %d threads / %d 1-thread runs at once", bm->short_label,
                         all_threads, all_threads);
                epoch_ratio_row(what, et->of_ceiling[m], 0, 0, NULL);
            }
            if (!isnan(et->plain_ratio[m][0])) {
                snprintf(what, sizeof what, "%s: plain cc -O2 / bench flags, 1 thread", bm->short_label);
                epoch_ratio_row(what, et->plain_ratio[m], 0.9, 0, NULL);
            }
        }
        if (!et->bf16_wanted) continue;
        print_model_rows(et, torch, m, 1, one, all, torch_all);
        for (int s = 0; s < et->settings && et->f32_on; s++) {
            int n = et->threads[s];
            snprintf(what, sizeof what, "%s: bf16 autocast / float32, %d thread%s (AMX)", bm->short_label, n,
                     n > 1 ? "s" : "");
            epoch_ratio_row(what, et->bf16_vs_f32[m][s], BF16_TARGET, 0,
                            !et->bf16_on ? "skipped: no AVX-512 BF16" : !et->amx ? "skipped: no AMX" : NULL);
        }
    }
    printf("\nFMA peak (%s, %d chains of multiply-adds in registers, best of 3 passes):", et->isa,
           FMA_CHAINS);
    for (int s = 0; s < et->settings; s++)
        printf(" %s GFLOP/s on %d thread%s%s", num(col[8], et->peak[s], 1), et->threads[s],
               et->threads[s] > 1 ? "s" : "", s + 1 < et->settings ? "," : ".\n");
    printf("FLOPs per sample = 3 x 2 x multiply-adds of the convs and linears (forward, input gradient,\n"
           "weight gradient); %% peak = samples/s x FLOPs per sample / the peak on the row's threads:\n");
    for (int m = 0; m < BENCH_MODELS; m++)
        printf("  %s: 3 x 2 x (%s) = %.3f MFLOP\n", bench_models[m].short_label, bench_models[m].macs_sum,
               flops_per_sample(&bench_models[m]) * 1e-6);
    printf("loss 1st>last: the mean training loss of the first and of the last 100 steps of a run (of\n"
           "half the steps when a run has fewer than 200), averaged over the runs; it must fall (else\n"
           "\"bad loss\").\n"
           "PyTorch 1, PyTorch %d: its samples/s on 1 and on %d threads (the same loop, the median run);\n"
           "vs same: mlc / PyTorch on as many threads; vs best: mlc / PyTorch's faster setting%s.\n"
           "N threads / 1 thread: each run trains on 1 thread, then at once on N; the median of the\n"
           "runs' ratios, their range in the min-max column; the target holds for every run.\n"
           "N 1-thread runs at once: N processes of this program, each a 1-thread run, started together\n"
           "just after the N-thread run; their summed samples/s over the 1-thread run's is the most N\n"
           "threads could give on the machine then (nothing shared, nothing waited for), and the\n"
           "N-thread run over that sum is the share of it that mlc's threads reach.\n",
           torch_all, torch_all,
           et->torch_cmd ? " (PyTorch's\nrun on as many threads just before each of mlc's: the median of the runs' ratios)" : "");
    if (et->plain_exe) {
        printf("plain cc -O2 build (no -fopenmp, no -fno-math-errno, no -march), 1 thread, run just before\n"
               "each 1-thread run (the ratio row: the median of the runs' ratios):");
        for (int m = 0; m < BENCH_MODELS; m++)
            if (et->model_on[m])
                printf(" %s %s (%s-%s)", bench_models[m].short_label, num(col[0], et->plain[m][0], 0),
                       num(col[1], et->plain[m][1], 0), num(col[2], et->plain[m][2], 0));
        printf(" samples/s.\n");
    }
    if (et->bf16_wanted)
        printf("bf16 autocast rows (issue 25): the same loop with mlc_autocast_begin(ctx, MLC_BF16) around\n"
               "the forward and the loss, each run just after mlc's float32 run on as many threads, then\n"
               "PyTorch's under torch.autocast(\"cpu\", torch.bfloat16) (PyTorch columns: its bf16 runs).\n"
               "They need AVX-512 BF16 (mlc's bf16 kernel): %s. bf16 autocast / float32: mlc's\n"
               "runs, run by run; its >= %gx target is for CPUs with AMX-BF16 (amx_bf16 in /proc/cpuinfo):\n"
               "%s.\n",
               et->bf16_cpu ? "found" : "not found, rows skipped", BF16_TARGET,
               et->amx ? "found (mlc has no AMX kernel yet: these rows run on AVX-512 BF16)"
                       : "not found, the row is printed and its target skipped");
    printf("PyTorch's epoch runs set OPENBLAS_NUM_THREADS to their thread count (Debian's PyTorch\n"
           "multiplies through OpenBLAS) besides torch.set_num_threads.\n");
}

/* One row of the table. mlc, hook and ref are in `unit`; faster_when_higher says which way the
   ratio goes so that "vs ref" is always how many times faster mlc is (above 1: mlc wins).
   target: the least ratio wanted for mlc, 0 for none. */
static void row(const char *what, const char *unit, double mlc, double hook, double ref, const char *ref_is,
                int faster_when_higher, double target) {
    char m[32], h[32], r[32], r1[32], r2[32], goal[32] = "", verdict[32] = "";
    int decimals = strcmp(unit, "GFLOP/s") == 0 ? 2 : strcmp(unit, "samples/s") && strcmp(unit, "tokens/s") ? 1 : 0;
    double vs = faster_when_higher ? mlc / ref : ref / mlc;
    double hook_vs = faster_when_higher ? hook / ref : ref / hook;
    if (target > 0) {
        snprintf(goal, sizeof goal, ">= %gx", target);
        verdict_of(verdict, vs, target);
    }
    printf("| %-44s | %-9s | %9s | %9s | %9s | %-8s | %7s | %7s | %-7s | %-7s |\n", what, unit,
           num(m, mlc, decimals), num(h, hook, decimals), num(r, ref, decimals), ref_is,
           times(r1, vs), times(r2, hook_vs), goal, verdict);
}

/* The micro-benchmark table's header */
static void micro_header(void) {
    printf("\n| %-44s | %-9s | %9s | %9s | %9s | %-8s | %7s | %7s | %-7s | %-7s |\n", "benchmark", "unit",
           "mlc", "mlc+hook", "reference", "ref is", "mlc vs", "hook vs", "target", "result");
    printf("|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|\n", "----------------------------------------------",
           "-----------", "----------:", "----------:", "----------:", "----------", "--------:", "--------:",
           "---------", "---------");
}

/* The int8 GEMM rows (bench_i8's figures), and their note */
static void i8_rows(double gops[][2]) {
    const char *found;
    double target = i8_target(&found);
    for (int s = 0; s < I8_SIZES; s++) {
        char what[64];
        snprintf(what, sizeof what, "int8 GEMM / float32 GEMM, n=%d, 1 thread", i8_sizes[s]);
        row(what, "GOP/s", gops[s][1], NAN, gops[s][0], "mlc f32", 1, target);
    }
}
static void i8_note(void) {
    const char *found;
    double target = i8_target(&found);
    printf("int8 rows: mlc_gemm_i8 against mlc_gemm (float32) on the same values, B stored [N, K] in both,\n"
           "1 thread, medians of 5 chunks; GOP/s counts 2 n^3 operations a product.\nCPU: %s", found);
    if (target > 0) printf(" (target >= %gx)", target);
    printf(".\n");
}

/* The int8 rows (7.): mlc int8 / float32 and mlc int8 / PyTorch's quantized model on its fastest
   engine (torch_bench.py's keys) */
static void int8_rows(const int8_latency *r, const kv_file *torch) {
    static const char *const engines[] = { "onednn", "qnnpack" };
    const char *best = NULL;
    double torch_us = NAN;
    char key[64];
    for (int e = 0; e < 2; e++) {
        snprintf(key, sizeof key, "cnn_int8_infer_us_%s", engines[e]);
        double us = kv_num(torch, key);
        if (us > 0 && !(torch_us <= us)) { torch_us = us; best = engines[e]; }
    }
    row("CNN batch-1 int8 / float32 latency, 1 thread", "us", r->us[1], NAN, r->us[0], "mlc f32", 0, 2);
    row("CNN batch-1 int8 vs PyTorch int8, 1 thread", "us", r->us[1], NAN, torch_us, best ? best : "-", 0,
        1.5);
}

/* What the int8 rows measured, and on what */
static void int8_notes(const int8_latency *r, const kv_file *torch, int runs) {
    static const char *const flags[][2] = { { "avx2", "AVX2" }, { "avx_vnni", "AVX-VNNI" },
                                            { "avx512_vnni", "AVX-512 VNNI" }, { "amx_int8", "AMX-INT8" } };
    printf("int8 rows (issue 26): the CNN conv16-pool-conv32-pool-fc128-fc10 at batch 1 on 1 thread, the\n"
           "median of %d single calls of each model (alternating, after a warm-up); mlc's converted by\n"
           "mlc_quantize_static calibrated on %d batches of %d training images (the int8 logits' cosine\n"
           "with float32's there: %.5f).\n",
           runs, INT8_CALIBRATION, BATCH, r->cosine);
    if (kv_str(torch, "torch_int8_engines"))
        printf("PyTorch (engines %s): torch.ao.quantization's prepare / calibrate (the same images)\n"
               "/ convert, conv and linear fused with their ReLU, the same timing: %.1f us on onednn,\n"
               "%.1f us on qnnpack (its float32 model: %.1f us); the row takes the faster engine.\n",
               kv_str(torch, "torch_int8_engines"), kv_num(torch, "cnn_int8_infer_us_onednn"),
               kv_num(torch, "cnn_int8_infer_us_qnnpack"), kv_num(torch, "cnn_infer_t1_f32_us"));
    printf("The CPU's int8 instructions:");
    for (int i = 0; i < 4; i++)
        printf("%s %s %s", i ? "," : "", flags[i][1], cpu_has_flag(flags[i][0]) ? "yes" : "no");
    printf(".\nmlc_gemm_i8 takes the best of them mlc has a kernel for (VNNI, else AVX2, else portable C).\n"
           "The int8 test accuracy (within 1 point of float32) is the example's:\n"
           "./build/fashion_mnist --model cnn --int8.\n");
}

static int usage(const char *name) {
    fprintf(stderr, "usage: %s [--quick] [--torch FILE] [--torch-cmd CMD] [--rss FILE] [--plain-exe PLAIN]\n"
            "       [--epochs-only [--kv] | --int8-only]\n"
            "       [--model mlp|cnn] [--threads N] [--samples N] [--runs N] [--amp off|bf16]\n"
            "       |  --rss-child  |  [--quick] --int8-gemm\n",
            name);
    return 2;
}

int main(int argc, char **argv) {
    const char *torch_path = NULL, *rss_path = NULL, *plain_exe = NULL, *torch_cmd = NULL, *model = NULL;
    const char *amp = NULL;             /* --amp: NULL (float32 and bf16), "off" or "bf16" */
    int epochs_only = 0, as_kv = 0, threads = 0, runs = 0, int8_only = 0, int8_gemm_only = 0;
    long samples = 0;
    epoch_table et = { 0 };
#ifdef _OPENMP
    all_threads = omp_get_num_procs();      /* the CPUs it may run on (taskset, cpusets) */
#endif
    if (all_threads < 1) all_threads = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int valued = i + 1 < argc;      /* an option that takes a value has one */
        if (strcmp(a, "--rss-child") == 0) return rss_child();
        else if (strcmp(a, "--quick") == 0) quick = 1;
        else if (strcmp(a, "--epochs-only") == 0) epochs_only = 1;
        else if (strcmp(a, "--int8-gemm") == 0) int8_gemm_only = 1;
        else if (strcmp(a, "--int8-only") == 0) int8_only = 1;
        else if (strcmp(a, "--kv") == 0) as_kv = 1;
        else if (strcmp(a, "--torch") == 0 && valued) torch_path = argv[++i];
        else if (strcmp(a, "--rss") == 0 && valued) rss_path = argv[++i];
        else if (strcmp(a, "--plain-exe") == 0 && valued) plain_exe = argv[++i];
        else if (strcmp(a, "--torch-cmd") == 0 && valued) torch_cmd = argv[++i];
        else if (strcmp(a, "--model") == 0 && valued) model = argv[++i];
        else if (strcmp(a, "--threads") == 0 && valued) threads = atoi(argv[++i]);
        else if (strcmp(a, "--samples") == 0 && valued) samples = atol(argv[++i]);
        else if (strcmp(a, "--runs") == 0 && valued) runs = atoi(argv[++i]);
        else if (strcmp(a, "--amp") == 0 && valued) amp = argv[++i];
        else return usage(argv[0]);
    }
    for (int m = 0; m < BENCH_MODELS; m++)
        et.model_on[m] = !model || strcmp(model, bench_models[m].name) == 0;
    if ((model && strcmp(model, "mlp") && strcmp(model, "cnn")) || threads < 0 || samples < 0 ||
        (samples && samples < BATCH) || runs < 0 || runs > MAX_RUNS || (as_kv && !epochs_only) ||
        ((int8_only || int8_gemm_only) && epochs_only) || (int8_only && int8_gemm_only) ||
        (amp && strcmp(amp, "off") && strcmp(amp, "bf16")))
        return usage(argv[0]);
    if (int8_gemm_only) {               /* --int8-gemm: those rows alone */
        double g8[I8_SIZES][2];
        bench_i8(g8);
        micro_header();
        i8_rows(g8);
        printf("\n");
        i8_note();
        return 0;
    }
    et.bf16_cpu = cpu_has_avx512bf16();
    et.amx = cpu_has_amx_bf16();
    et.f32_on = !amp || strcmp(amp, "off") == 0;
    et.bf16_wanted = !amp || strcmp(amp, "bf16") == 0;
    et.bf16_on = amp ? et.bf16_wanted : et.bf16_cpu;     /* --amp bf16: measured on any CPU */
    if (threads > all_threads && all_threads == 1) {
        fprintf(stderr, "bench: built without OpenMP, so 1 thread only\n");
        return 2;
    }
    if (threads) et.threads[et.settings++] = threads;
    else {
        et.threads[et.settings++] = 1;
        if (all_threads > 1) et.threads[et.settings++] = all_threads;
    }
    if (!runs) runs = quick ? 1 : 3;
    kv_file torch, rss;
    kv_read(&torch, torch_path);
    kv_read(&rss, rss_path);
    et.plain_exe = plain_exe; et.torch_cmd = torch_cmd; et.self_exe = argv[0];
    int have_torch = kv_str(&torch, "torch_version") != NULL;
    double t0 = now();
    cpu_mark start_mark = cpu_now();

    /* ---- measure: the epoch rows ---- */
    dataset data = { 0 };
    if (!load_fashion(&data)) random_data(&data, 60000, FASHION_DIR " not found or unreadable");
    const int int8_runs = quick ? 51 : INT8_RUNS;
    int8_latency i8 = { { NAN, NAN }, NAN };
    if (int8_only) {                                 /* the int8 rows alone */
        int8_cnn_latency(&data, int8_runs, &i8);
        double others = others_percent(start_mark), others_torch = kv_num(&torch, "others_percent");
        disturbed = others > 10 || others_torch > 10;
        print_header(&torch, &data, others, others_torch);
        micro_header();
        int8_rows(&i8, &torch);
        printf("\n");
        int8_notes(&i8, &torch, int8_runs);
        printf("\nmlc measurements took %.0f s.\n", now() - t0);
        free_data(&data);
        return 0;
    }
    if (!samples) samples = quick ? data.count / 10 : data.count;
    measure_epochs(&et, &data, samples, runs);
    if (epochs_only) {
        double others = others_percent(start_mark), others_torch = kv_num(&torch, "others_percent");
        if (as_kv) {
            print_epoch_kv(&et);
            printf("others_percent %.1f\n", others);
        } else {
            disturbed = others > 10 || others_torch > 10;
            print_header(&torch, &data, others, others_torch);
            print_epoch_table(&et, &torch, samples, runs);
            printf("\nmlc measurements took %.0f s.\n", now() - t0);
        }
        free_data(&data);
        return 0;
    }

    /* ---- measure: the micro-benchmarks ---- */
    gemm_results g;
    bench_gemm(&g);
    double g16[BF16_SIZES][2], g8[I8_SIZES][2];
    int have_bf16 = bench_bf16(g16);
    bench_i8(g8);
    set_threads(all_threads);
    double tiny = tiny_step_us();
    double mlp_sps = train_samples_per_s(0, fashion_mlp, &data, 1, mlp_input);
    double cnn_sps = train_samples_per_s(0, fashion_cnn, &data, 3, cnn_input);
    double mlp_hook_sps = NAN, cnn_hook_sps = NAN;
#ifdef BENCH_OPENBLAS
    mlp_hook_sps = train_samples_per_s(1, fashion_mlp, &data, 1, mlp_input);
    cnn_hook_sps = train_samples_per_s(1, fashion_cnn, &data, 3, cnn_input);
#endif
    double lstm = lstm_step_ms();
    double mlp_inf = infer_us(fashion_mlp, &data, 1, mlp_input);
    double cnn_inf = infer_us(fashion_cnn, &data, 3, cnn_input);
    int8_cnn_latency(&data, int8_runs, &i8);         /* (on 1 thread) */
    set_threads(all_threads);
    double gpt_1 = gpt_tokens_per_s(1), gpt_2 = gpt_tokens_per_s(all_threads);
    char gpt_what[64];
    double others_mlc = others_percent(start_mark), others_torch = kv_num(&torch, "others_percent");
    disturbed = others_mlc > 10 || others_torch > 10;

    /* ---- report ---- */
    print_header(&torch, &data, others_mlc, others_torch);
    print_epoch_table(&et, &torch, samples, runs);
    printf("\n## Micro-benchmarks (best of short chunks of one repeated step; not what a user's epoch "
           "gets)\n");

    /* the micro-benchmark table */
    const char *torch_ref = have_torch ? "PyTorch" : "-";
    micro_header();
    for (int t = 0; t < 2; t++)
        for (int s = 0; s < GEMM_SIZES; s++) {
            double *v = g.gflops[t][s], skipped = g.skipped_est_s[t][s][GEMM_MLC];
            char what[64];
            snprintf(what, sizeof what, "sgemm n=%d, %d thread%s", gemm_sizes[s], t ? all_threads : 1,
                     t ? "s" : "");
            if (skipped > 0)
                snprintf(what + strlen(what), sizeof what - strlen(what), " (mlc skipped, ~%.0f s/call)", skipped);
            row(what, "GFLOP/s", v[GEMM_MLC], v[GEMM_HOOK], v[GEMM_OPENBLAS], v[GEMM_OPENBLAS] > 0 ? "OpenBLAS" : "-", 1, 0);
        }
    for (int s = 0; s < BF16_SIZES; s++) {
        char what[64];
        snprintf(what, sizeof what, "bf16 / float32 GEMM (mlc), n=%d, 1 thread", bf16_sizes[s]);
        row(what, "GFLOP/s", have_bf16 ? g16[s][1] : NAN, NAN, have_bf16 ? g16[s][0] : NAN, "mlc f32", 1, 1.7);
    }
    i8_rows(g8);
    row("tiny MLP 10-100(tanh)-1 Adam step (MSE)", "us/step", tiny, NAN, kv_num(&torch, "tiny_step_us"), torch_ref, 0, 20);
    row("MLP 784-256-128-10 training", "samples/s", mlp_sps, mlp_hook_sps, kv_num(&torch, "mlp_train_sps"), torch_ref, 1, 2);
    row("CNN conv16-pool-conv32-pool-fc128-fc10 train", "samples/s", cnn_sps, cnn_hook_sps, kv_num(&torch, "cnn_train_sps"), torch_ref, 1, 1.5);
    row("LSTM 2x128+linear, 64 seqs x 50, Adam step", "ms/step", lstm, NAN, kv_num(&torch, "lstm_step_ms"),
        torch_ref, 0, 0);
    row("MLP inference, batch 1", "us", mlp_inf, NAN, kv_num(&torch, "mlp_infer_us"), torch_ref, 0, 5);
    row("CNN inference, batch 1", "us", cnn_inf, NAN, kv_num(&torch, "cnn_infer_us"), torch_ref, 0, 5);
    int8_rows(&i8, &torch);
    row("tiny GPT 4x64 training step, 1 thread", "tokens/s", gpt_1, NAN, kv_num(&torch, "gpt_tokens_s_1"),
        torch_ref, 1, 0);
    snprintf(gpt_what, sizeof gpt_what, "tiny GPT 4x64 training step, %d threads", all_threads);
    row(gpt_what, "tokens/s", gpt_2, NAN, kv_num(&torch, "gpt_tokens_s_all"),
        torch_ref, 1, 0);
    double peak = kv_num(&rss, "rss_peak_kib") * 1024, start = kv_num(&rss, "rss_start_kib") * 1024;
    double need = kv_num(&rss, "rss_need_bytes");
    {   /* memory: the ratio is peak / needed, lower is better, so it gets its own verdict */
        char m[32], r[32], q[32], q2[32];
        const char *verdict = isnan(peak) ? "skipped" : peak / need < 1.3 ? "met" : "not met";   /* RSS: load-proof */
        printf("| %-44s | %-9s | %9s | %9s | %9s | %-8s | %7s | %7s | %-7s | %-7s |\n",
               "MLP training peak RSS (own process)", "MB", num(m, peak / 1e6, 2), "", num(r, need / 1e6, 2),
               "needed", isnan(peak) ? "-" : (snprintf(q, sizeof q, "%.2f", peak / need), q), "", "< 1.3", verdict);
        verdict = isnan(peak) ? "skipped" : (peak - start) / need < 1.3 ? "met" : "not met";
        printf("| %-44s | %-9s | %9s | %9s | %9s | %-8s | %7s | %7s | %-7s | %-7s |\n",
               "... its growth after process start", "MB", num(m, (peak - start) / 1e6, 2), "", num(r, need / 1e6, 2),
               "needed", isnan(peak) ? "-" : (snprintf(q2, sizeof q2, "%.2f", (peak - start) / need), q2), "", "< 1.3", verdict);
    }

    printf("\n\"vs\" columns: how many times faster mlc (or mlc with the OpenBLAS hook) is than the\n"
           "reference: GFLOP/s or samples/s divided by the reference's, or the reference's time\n"
           "divided by mlc's. Memory rows: the ratio is peak RSS / bytes needed (lower is better).\n");
    printf("%s", have_bf16 ? "bf16 rows: mlc_gemm_bf16 (AVX-512 BF16 kernel) against mlc_gemm (float32) on the same\n"
                             "values, 1 thread, back to back.\n"
                           : "bf16 rows: no AVX-512 BF16: row skipped.\n");
    i8_note();
    printf("mlc_gemm runs at %.2fx the speed of mlc_gemm_reference (the plain loop) at n = 256",
           g.own_vs_reference);
#ifdef BENCH_OPENBLAS
    printf("; largest |mlc - OpenBLAS| / max|C| for n <= 256: %.1e", g.max_rel_error);
#endif
    printf(".\n");
    int8_notes(&i8, &torch, int8_runs);
    if (!isnan(peak))
        printf("Memory: peak RSS of `bench --rss-child` (MLP training, 20 steps on one random batch, alone in its\n"
               "process) against parameters + gradients + Adam's 2 buffers + one batch of activations.\n"
               "The process held %.2f MB before mlc allocated anything (C library, libgomp, OpenBLAS);\n"
               "mlc's own heap peaked at %.2f MB.\n", start / 1e6, kv_num(&rss, "rss_mlc_heap_peak_bytes") / 1e6);
    if (!have_torch) printf("\nPyTorch column skipped: torch is not installed for python3.\n");
#ifndef BENCH_OPENBLAS
    printf("\nmlc+hook and OpenBLAS columns skipped: OpenBLAS (cblas.h, -lopenblas) was not found.\n");
#endif
    printf("\nmlc measurements took %.0f s.\n", now() - t0);
    free_data(&data);
    return 0;
}
