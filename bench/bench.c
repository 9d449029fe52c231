/* bench/bench.c - mlc's benchmark suite (run it with `make bench`, which calls bench/run.sh).

   What it measures, all in one run, printed as one markdown table:
     1. sgemm GFLOP/s for square n: mlc's own mlc_gemm, mlc through the BLAS hook
        (mlc_config.gemm calling OpenBLAS), and OpenBLAS called directly; 1 and 2 threads.
     2. the tiny MLP 10-100(tanh)-1: one Adam step on a batch of 64 (MSE), in µs.
     3. training samples/s, batch 64, Adam, cross entropy, on Fashion-MNIST (28x28, 10 classes):
        an MLP 784-256-128-10 and a small CNN (conv 16 - pool - conv 32 - pool - fc 128 - fc 10);
        and an LSTM (2 layers 32 -> 128, a linear head on each step): one Adam step (MSE) on 64
        random sequences of 50 steps, in ms.
     4. batch-1 inference latency of the same MLP and CNN (eval mode, no gradients), in µs.
     5. the peak RSS of MLP training in a process of its own, against the bytes it must hold.
     6. tokens/s of a training step of the tiny GPT of examples/gpt.c (examples/gpt_model.h:
        4 layers, 64 dims, 4 heads, block 64, batch 16, AdamW, clipping) on its text, 1 and 2
        threads, against the same model in PyTorch (nn.MultiheadAttention) on 1 and 2 threads.
   PyTorch's numbers come from bench/torch_bench.py (same models, same data), read from a file.

   Usage:
     bench [--quick] [--torch FILE] [--rss FILE]   measure everything, print the table
                                                   (FILE: "key value" lines from the other runs)
     bench --rss-child                             train the MLP only; print its peak RSS
   Build (run.sh does this): cc -O2 -fopenmp -std=c99 -Ibench/.. bench/bench.c -lm
     -DBENCH_OPENBLAS -lopenblas   adds the hook and OpenBLAS columns
     -DBENCH_ZLIB -lz              reads the gzipped dataset with zlib (else `gzip -dc`)

   Timing: every number is the best of several chunks of repeated calls, after a warm-up. The
   best is the least disturbed by the rest of the machine; short chunks give more chances of
   an undisturbed one on a shared machine. */
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
#define MLC_IMPLEMENTATION
#include "mlc.h"
#include "examples/gpt_model.h"

#define BATCH 64
#define THREADS 2                        /* the "2 threads" setting, for mlc and the references */
#define FASHION_DIR "/usr/share/datasets/fashion-mnist"

static int quick;                        /* --quick: shorter runs, for trying the suite out */
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

/* Seconds per call of fn(arg), the best of `chunks` chunks of about chunk_s seconds each.
   The first calls warm up (caches, arena blocks, thread pools) and count how many calls fill
   a chunk. */
static double seconds_per_call(bench_fn fn, void *arg, double chunk_s, int chunks) {
    long calls = 1, i;
    double t, best;
    if (quick) chunk_s /= 4;
    fn(arg);                                            /* warm-up */
    for (;;) {                                          /* calibrate */
        t = now();
        for (i = 0; i < calls; i++) fn(arg);
        t = now() - t;
        if (t >= chunk_s / 4 || calls >= (1L << 24)) break;
        calls *= 2;
    }
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

static void set_threads(int n) {
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
    getrusage(RUSAGE_SELF, &ru);
    m.own_s = (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec +
              (double)ru.ru_stime.tv_sec + 1e-6 * (double)ru.ru_stime.tv_usec;
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
        set_threads(t ? THREADS : 1);
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
    set_threads(THREADS);
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
} trainer;

/* Copy the next BATCH images (scaled to [0, 1]) and labels into x and y. */
static void next_batch(trainer *t) {
    const dataset *d = t->data;
    if (t->next + BATCH > d->count) t->next = 0;
    for (size_t i = 0; i < (size_t)BATCH * 784; i++) t->x->data[i] = d->images[(size_t)t->next * 784 + i] * (1.0f / 255.0f);
    for (int i = 0; i < BATCH; i++) t->y->data[i] = d->labels[t->next + i];
    t->next += BATCH;
}

/* One training step; the frame gives back every temporary and the tape at its end. */
static void train_step(void *arg) {
    trainer *t = (trainer *)arg;
    if (t->data) next_batch(t);
    mlc_frame f = mlc_frame_begin(t->ctx);
    mlc_tensor *out = mlc_forward(t->model, t->x);
    mlc_tensor *loss = t->classify ? mlc_cross_entropy(out, t->y, MLC_REDUCE_MEAN, MLC_NO_IGNORE)
                                   : mlc_mse_loss(out, t->y, MLC_REDUCE_MEAN);
    mlc_zero_grad(t->opt);
    mlc_backward(loss);
    mlc_step(t->opt);
    mlc_frame_end(f);
}

/* x_shape: the model's input for one image ({784} or {1, 28, 28}); the batch dimension is added. */
static int trainer_init(trainer *t, int with_hook, mlc_module *(*build)(mlc_ctx *), const dataset *data,
                        int x_ndim, const int *x_shape) {
    int shape[4] = { BATCH };
    memset(t, 0, sizeof *t);
    t->ctx = make_ctx(with_hook);
    if (!t->ctx) return 0;
    t->model = build(t->ctx);
    t->opt = mlc_adam(t->ctx, t->model, (mlc_adam_config){ .lr = 1e-3f });
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
        set_threads(THREADS);
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
typedef struct kv_file { int count, found; kv items[64]; } kv_file;

static void kv_read(kv_file *f, const char *path) {
    char line[300];
    FILE *in = path ? fopen(path, "r") : NULL;
    memset(f, 0, sizeof *f);
    if (!in) return;
    f->found = 1;
    while (f->count < 64 && fgets(line, sizeof line, in)) {
        kv *e = &f->items[f->count];
        char *space = strchr(line, ' ');
        if (!space || space - line >= (long)sizeof e->key) continue;
        memcpy(e->key, line, (size_t)(space - line));
        snprintf(e->value, sizeof e->value, "%s", space + 1);
        e->value[strcspn(e->value, "\r\n")] = '\0';
        f->count++;
    }
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

/* One row of the table. mlc, hook and ref are in `unit`; faster_when_higher says which way the
   ratio goes so that "vs ref" is always how many times faster mlc is (above 1: mlc wins).
   target: the least ratio wanted for mlc, 0 for none. */
static void row(const char *what, const char *unit, double mlc, double hook, double ref, const char *ref_is,
                int faster_when_higher, double target) {
    char m[32], h[32], r[32], r1[32], r2[32], goal[32] = "", verdict[16] = "";
    int decimals = strcmp(unit, "GFLOP/s") == 0 ? 2 : strcmp(unit, "samples/s") && strcmp(unit, "tokens/s") ? 1 : 0;
    double vs = faster_when_higher ? mlc / ref : ref / mlc;
    double hook_vs = faster_when_higher ? hook / ref : ref / hook;
    if (target > 0) {
        snprintf(goal, sizeof goal, ">= %gx", target);
        snprintf(verdict, sizeof verdict, "%s%s", isnan(vs) || vs <= 0 ? "skipped" : vs >= target ? "met" : "not met",
                 disturbed && !isnan(vs) && vs > 0 ? "?" : "");
    }
    printf("| %-44s | %-9s | %9s | %9s | %9s | %-8s | %7s | %7s | %-7s | %-7s |\n", what, unit,
           num(m, mlc, decimals), num(h, hook, decimals), num(r, ref, decimals), ref_is,
           times(r1, vs), times(r2, hook_vs), goal, verdict);
}

int main(int argc, char **argv) {
    const char *torch_path = NULL, *rss_path = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--rss-child") == 0) return rss_child();
        else if (strcmp(argv[i], "--quick") == 0) quick = 1;
        else if (strcmp(argv[i], "--torch") == 0 && i + 1 < argc) torch_path = argv[++i];
        else if (strcmp(argv[i], "--rss") == 0 && i + 1 < argc) rss_path = argv[++i];
        else { fprintf(stderr, "usage: %s [--quick] [--torch FILE] [--rss FILE] | --rss-child\n", argv[0]); return 2; }
    }
    kv_file torch, rss;
    kv_read(&torch, torch_path);
    kv_read(&rss, rss_path);
    int have_torch = kv_str(&torch, "torch_version") != NULL;
    double t0 = now();
    cpu_mark start_mark = cpu_now();

    /* ---- measure ---- */
    dataset data = { 0 };
    if (!load_fashion(&data)) random_data(&data, 60000, FASHION_DIR " not found or unreadable");
    gemm_results g;
    bench_gemm(&g);
    set_threads(THREADS);
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
    double gpt_1 = gpt_tokens_per_s(1), gpt_2 = gpt_tokens_per_s(THREADS);
    double others_mlc = others_percent(start_mark), others_torch = kv_num(&torch, "others_percent");
    disturbed = others_mlc > 10 || others_torch > 10;

    /* ---- report: the machine ---- */
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
    printf(" (no OpenMP)\n");
#endif
#ifdef BENCH_OPENBLAS
    printf("- OpenBLAS: %s (core %s)\n", openblas_get_config(), openblas_get_corename());
#else
    printf("- OpenBLAS: not found, its columns are skipped\n");
#endif
    if (have_torch)
        printf("- PyTorch: %s, %s thread(s); its data: %s\n", kv_str(&torch, "torch_version"),
               kv_str(&torch, "torch_threads") ? kv_str(&torch, "torch_threads") : "?",
               kv_str(&torch, "torch_data") ? kv_str(&torch, "torch_data") : "?");
    else
        printf("- PyTorch: not available (python3 -c 'import torch' failed), its column is skipped\n");
    printf("- data: %s\n", data.source);
    printf("- threads: %d for the models (OpenMP for mlc, torch.set_num_threads for PyTorch); the GPT rows: 1 and %d\n",
           THREADS, THREADS);
    printf("- other processes used %.0f%% of the CPUs during the mlc measurements", others_mlc);
    if (!isnan(others_torch)) printf(", %.0f%% during PyTorch's", others_torch);
    printf("%s\n", disturbed ? ": the numbers are disturbed, a \"?\" marks the verdicts that depend on them"
                             : " (quiet enough)");

    /* ---- report: one table ---- */
    const char *torch_ref = have_torch ? "PyTorch" : "-";
    printf("\n| %-44s | %-9s | %9s | %9s | %9s | %-8s | %7s | %7s | %-7s | %-7s |\n", "benchmark", "unit",
           "mlc", "mlc+hook", "reference", "ref is", "mlc vs", "hook vs", "target", "result");
    printf("|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|\n", "----------------------------------------------",
           "-----------", "----------:", "----------:", "----------:", "----------", "--------:", "--------:",
           "---------", "---------");
    for (int t = 0; t < 2; t++)
        for (int s = 0; s < GEMM_SIZES; s++) {
            double *v = g.gflops[t][s], skipped = g.skipped_est_s[t][s][GEMM_MLC];
            char what[64];
            snprintf(what, sizeof what, "sgemm n=%d, %d thread%s", gemm_sizes[s], t ? THREADS : 1, t ? "s" : "");
            if (skipped > 0)
                snprintf(what + strlen(what), sizeof what - strlen(what), " (mlc skipped, ~%.0f s/call)", skipped);
            row(what, "GFLOP/s", v[GEMM_MLC], v[GEMM_HOOK], v[GEMM_OPENBLAS], v[GEMM_OPENBLAS] > 0 ? "OpenBLAS" : "-", 1, 0);
        }
    row("tiny MLP 10-100(tanh)-1 Adam step (MSE)", "us/step", tiny, NAN, kv_num(&torch, "tiny_step_us"), torch_ref, 0, 20);
    row("MLP 784-256-128-10 training", "samples/s", mlp_sps, mlp_hook_sps, kv_num(&torch, "mlp_train_sps"), torch_ref, 1, 2);
    row("CNN conv16-pool-conv32-pool-fc128-fc10 train", "samples/s", cnn_sps, cnn_hook_sps, kv_num(&torch, "cnn_train_sps"), torch_ref, 1, 1.5);
    row("LSTM 2x128+linear, 64 seqs x 50, Adam step", "ms/step", lstm, NAN, kv_num(&torch, "lstm_step_ms"),
        torch_ref, 0, 0);
    row("MLP inference, batch 1", "us", mlp_inf, NAN, kv_num(&torch, "mlp_infer_us"), torch_ref, 0, 5);
    row("CNN inference, batch 1", "us", cnn_inf, NAN, kv_num(&torch, "cnn_infer_us"), torch_ref, 0, 5);
    row("tiny GPT 4x64 training step, 1 thread", "tokens/s", gpt_1, NAN, kv_num(&torch, "gpt_tokens_s_1"),
        torch_ref, 1, 0);
    row("tiny GPT 4x64 training step, 2 threads", "tokens/s", gpt_2, NAN, kv_num(&torch, "gpt_tokens_s_2"),
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
    printf("mlc_gemm runs at %.2fx the speed of mlc_gemm_reference (the plain loop) at n = 256",
           g.own_vs_reference);
#ifdef BENCH_OPENBLAS
    printf("; largest |mlc - OpenBLAS| / max|C| for n <= 256: %.1e", g.max_rel_error);
#endif
    printf(".\n");
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
