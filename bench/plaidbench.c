/* bench/plaidbench.c - PlaidML's plaidbench for mlc: one real network, MobileNetV2
   (examples/mobilenet_model.h, torchvision's architecture, random weights), on every device mlc
   sees (the CPU on 1 thread and on all, each OpenCL device), beside PyTorch on the CPU (1 thread
   and all, bench/plaidbench_torch.py, run in the same process tree just before) and PyTorch CUDA
   when its python has a GPU (the OpenCL rows' peer; with --device opencl:N the PyTorch CPU rows
   are left out). Rows:
     inference  MobileNetV2 1.0 at 224x224, eval, BatchNorm folded, no tape: batch 1 and batch 16,
                the first run (warm-up: kernels built, scratch grown) and the median per image
     training   MobileNetV2 0.35 at 96x96, one step at batch 32 (cross entropy, SGD momentum 0.9):
                the first step and the median step
   then the ratios against PyTorch on the CPU (time per image or step, mlc / PyTorch: below 1 is
   mlc faster; throughput, batch 16: PyTorch's time / mlc's, above 1 is mlc faster), against the
   PyTorch row of the same threads and against PyTorch's best row in each column (on a small
   shared machine PyTorch is often fastest on 1 thread). Each PyTorch row is the fastest of
   TORCH_TRIES processes, column by column: its batch-1 time changes from one process to the
   next (on the 2-vCPU EPYC of bench/RESULTS.md, 9 ms in some and 15 ms in others).
   A labelled micro-benchmark follows: a depthwise 3x3 convolution alone (MobileNetV2's third
   block: 144 channels, 56x56, stride 1, batch 16, 1 thread) as GFLOP/s against the CPU's float32
   FMA peak and its memory bound, both measured here (x86-64 with AVX-512 only). The load average
   before and after says how much other processes shared the CPUs.
   Usage: plaidbench [--runs N] [--no-torch] [--device SPEC]   (make plaidbench)
   Build: cc -O2 -std=c99 -DMLC_OPENCL -I. -Iexamples bench/plaidbench.c -o plaidbench -lm -ldl */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif
#define MLC_IMPLEMENTATION
#include "mlc.h"
#include "mobilenet_model.h"

enum { MAX_DEVICES = 8, MAX_ROWS = 16 };

typedef struct row {
    char label[80];
    double b1_first, b1, b16_first, b16, train_first, train;   /* ms: b1, b16 per batch */
    double b1_cpu, b16_cpu, train_cpu;  /* the medians in the process's CPU time (all its threads) */
    int is_torch, threads;
} row;

static double seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static double cpu_seconds(void) {      /* the process's CPU time: not the time others took the CPUs */
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The first of runs + 1 calls, and the median of the others, in ms: wall clock, and (cpu, when
   not NULL) the process's CPU time */
typedef int (*work_fn)(void *arg);
static int timed(mlc_ctx *ctx, work_fn fn, void *arg, int runs, double *first, double *median, double *cpu) {
    double t[256], c[256];
    if (runs > 255) runs = 255;
    for (int r = -1; r < runs; r++) {
        mlc_frame f = mlc_frame_begin(ctx);
        double t0 = seconds(), c0 = cpu_seconds();
        int ok = fn(arg);
        mlc_sync(ctx);
        double dt = (seconds() - t0) * 1e3, dc = (cpu_seconds() - c0) * 1e3;
        mlc_frame_end(f);
        if (!ok || mlc_error(ctx)) return 0;
        if (r < 0) *first = dt;
        else { t[r] = dt; c[r] = dc; }
    }
    qsort(t, (size_t)runs, sizeof(double), by_value);
    qsort(c, (size_t)runs, sizeof(double), by_value);
    *median = t[runs / 2];
    if (cpu) *cpu = c[runs / 2];
    return 1;
}

typedef struct job { mlc_module *net; mlc_tensor *x, *y; mlc_optim *opt; } job;

static int infer(void *arg) {
    job *j = arg;
    return mlc_forward(j->net, j->x) != NULL;
}
static int train_step(void *arg) {
    job *j = arg;
    mlc_zero_grad(j->opt);
    mlc_tensor *loss = mlc_cross_entropy(mlc_forward(j->net, j->x), j->y, MLC_REDUCE_MEAN, MLC_NO_IGNORE);
    if (!loss || mlc_backward(loss) != MLC_OK) return 0;
    mlc_step(j->opt);
    return 1;
}

/* mlc on one device (spec: "cpu" with threads, or "opencl:N"); 0 and a message on failure */
static int run_mlc(const char *spec, int threads, int runs, row *r, char *why, size_t why_size) {
    mlc_ctx *ctx = mlc_create(&(mlc_config){ .device = spec, .threads = threads, .seed = 1,
                                             .error = why, .error_bytes = why_size });
    job j = { 0 };
    int ok;
    if (!ctx) return 0;
    j.net = mobilenet_create(ctx, (mobilenet_opts){ .width = 1.0f });
    ok = j.net != NULL;
    if (ok) {
        mlc_module_train(j.net, 0);
        ok = mobilenet_fold_batch_norm(j.net) > 0
             && (!mlc_has_device(ctx) || mlc_module_to(j.net, 1) == MLC_OK);
    }
    mlc_set_grad_enabled(ctx, 0);
    for (int b = 1; ok && b <= 16; b += 15) {
        j.x = mlc_keep(mlc_randn(ctx, MLC_SHAPE(b, 3, 224, 224)));
        ok = j.x && timed(ctx, infer, &j, b == 1 ? 4 * runs : runs, b == 1 ? &r->b1_first : &r->b16_first,
                          b == 1 ? &r->b1 : &r->b16, b == 1 ? &r->b1_cpu : &r->b16_cpu);
        mlc_tensor_free(j.x);
    }
    mlc_set_grad_enabled(ctx, 1);
    if (ok) {
        j.net = mobilenet_create(ctx, (mobilenet_opts){ .width = 0.35f });
        ok = j.net && (!mlc_has_device(ctx) || mlc_module_to(j.net, 1) == MLC_OK);
        j.opt = ok ? mlc_sgd(ctx, j.net, (mlc_sgd_opts){ .lr = 0.01f, .momentum = 0.9f }) : NULL;
        j.x = mlc_keep(mlc_randn(ctx, MLC_SHAPE(32, 3, 96, 96)));
        float labels[32];
        for (int i = 0; i < 32; i++) labels[i] = (float)(i * 37 % 1000);
        j.y = mlc_keep(mlc_from_data(ctx, MLC_SHAPE(32), labels));
        ok = ok && j.opt && j.x && j.y && timed(ctx, train_step, &j, runs, &r->train_first, &r->train,
                                                           &r->train_cpu);
    }
    if (!ok) snprintf(why, why_size, "%s", mlc_error(ctx) ? mlc_error_message(ctx) : "failed");
    mlc_destroy(ctx);
    return ok;
}

/* The 1-minute load average (/proc/loadavg), or -1 */
static double load_average(void) {
    double v = -1;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f && fscanf(f, "%lf", &v) != 1) v = -1;
    if (f) fclose(f);
    return v;
}

#if defined(__x86_64__) && defined(__GNUC__)
/* One thread's float32 FMA peak in GFLOP/s: 12 independent chains of 16-wide FMAs, each in a
   register of its own (written out: an array of accumulators indexed in a loop stays in memory
   at -O2, a load and a store around every FMA, which measured a third of the peak) */
__attribute__((target("avx512f,fma")))
static double fma_peak(void) {
    const __m512 m = _mm512_set1_ps(0.999999f), a = _mm512_set1_ps(1e-7f);
    __m512 c0 = _mm512_set1_ps(0.0f), c1 = _mm512_set1_ps(1.0f), c2 = _mm512_set1_ps(2.0f),
           c3 = _mm512_set1_ps(3.0f), c4 = _mm512_set1_ps(4.0f), c5 = _mm512_set1_ps(5.0f),
           c6 = _mm512_set1_ps(6.0f), c7 = _mm512_set1_ps(7.0f), c8 = _mm512_set1_ps(8.0f),
           c9 = _mm512_set1_ps(9.0f), c10 = _mm512_set1_ps(10.0f), c11 = _mm512_set1_ps(11.0f);
    float sink[16];
    long i, n = 50000000;
    double t0 = seconds();
    for (i = 0; i < n; i++) {
        c0 = _mm512_fmadd_ps(c0, m, a); c1 = _mm512_fmadd_ps(c1, m, a); c2 = _mm512_fmadd_ps(c2, m, a);
        c3 = _mm512_fmadd_ps(c3, m, a); c4 = _mm512_fmadd_ps(c4, m, a); c5 = _mm512_fmadd_ps(c5, m, a);
        c6 = _mm512_fmadd_ps(c6, m, a); c7 = _mm512_fmadd_ps(c7, m, a); c8 = _mm512_fmadd_ps(c8, m, a);
        c9 = _mm512_fmadd_ps(c9, m, a); c10 = _mm512_fmadd_ps(c10, m, a); c11 = _mm512_fmadd_ps(c11, m, a);
    }
    double dt = seconds() - t0;
    c0 = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(c0, c1), _mm512_add_ps(c2, c3)),
                       _mm512_add_ps(_mm512_add_ps(c4, c5), _mm512_add_ps(c6, c7)));
    c0 = _mm512_add_ps(c0, _mm512_add_ps(_mm512_add_ps(c8, c9), _mm512_add_ps(c10, c11)));
    _mm512_storeu_ps(sink, c0);
    return sink[0] == 12345.0f ? 0 : (double)n * 12 * 32 / dt * 1e-9;
}
#endif

/* memcpy of 256 MiB in 64 MiB pieces, best of 3: bytes read + written per second, GB/s */
static double copy_bandwidth(void) {
    size_t n = (size_t)64 << 20;
    char *a = malloc(n), *b = malloc(n);
    double best = 0;
    if (!a || !b) { free(a); free(b); return 0; }
    memset(a, 1, n); memset(b, 2, n);
    for (int r = 0; r < 3; r++) {
        double t0 = seconds();
        for (int k = 0; k < 4; k++) memcpy(k % 2 ? a : b, k % 2 ? b : a, n);
        double gbs = 8.0 * (double)n / (seconds() - t0) * 1e-9;
        best = gbs > best ? gbs : best;
    }
    free(a); free(b);
    return best;
}

/* The depthwise micro-benchmark (see the top) */
static void depthwise_alone(int runs) {
    enum { N = 16, C = 144, S = 56 };
    mlc_ctx *ctx = mlc_create(&(mlc_config){ .device = "cpu", .threads = 1, .seed = 1 });
    job j = { 0 };
    double first, median, peak = 0, flops = 2.0 * 9 * N * C * S * S, bytes = 2.0 * 4 * N * C * S * S;
    if (!ctx) return;
    mlc_tensor *w = mlc_keep(mlc_randn(ctx, MLC_SHAPE(C, 1, 3, 3)));
    mlc_tensor *b = mlc_keep(mlc_randn(ctx, MLC_SHAPE(C)));
    j.x = mlc_keep(mlc_randn(ctx, MLC_SHAPE(N, C, S, S)));
    j.net = mlc_nn_custom(ctx, "Conv2d", mobilenet_conv_forward, NULL);
    if (j.net && w && b && mlc_module_add_param(j.net, "weight", w) == MLC_OK
        && mlc_module_add_param(j.net, "bias", b) == MLC_OK) {
        j.net->conv = (mlc_conv_opts){ .padding = 1, .groups = C };
        mlc_set_grad_enabled(ctx, 0);
        if (timed(ctx, infer, &j, runs * 4, &first, &median, NULL)) {
            double gflops = flops / median * 1e-6, bandwidth = copy_bandwidth();
#if defined(__x86_64__) && defined(__GNUC__)
            if (__builtin_cpu_supports("avx512f")) peak = fma_peak();
#endif
            printf("\n  micro-benchmark: depthwise 3x3 conv alone, [16, 144, 56, 56], stride 1, 1 thread: "
                   "%.2f ms,\n  %.1f GFLOP/s (2 x 9 per output); %.1f GB/s of x and y\n", median, gflops,
                   bytes / median * 1e-6);
            if (peak > 0)
                printf("  FMA peak here (one thread, AVX-512, measured): %.1f GFLOP/s: %.1f %% of it;\n"
                       "  memory bound (memcpy %.1f GB/s x 2.25 FLOP/byte): %.1f GFLOP/s: %.0f %% of it\n",
                       peak, 100 * gflops / peak, bandwidth, bandwidth * 2.25,
                       100 * gflops / (bandwidth * 2.25));
        }
    }
    mlc_destroy(ctx);
}

/* PyTorch on the CPU on `threads` threads (or CUDA), from bench/plaidbench_torch.py's lines */
static int run_torch(const char *python, const char *device, int threads, int runs, row *r) {
    char command[512], key[64], version[64] = "?";
    double value;
    snprintf(command, sizeof command,
             "OPENBLAS_NUM_THREADS=%d OMP_NUM_THREADS=%d %s bench/plaidbench_torch.py --threads %d --runs %d "
             "--device %s 2>/dev/null", threads, threads, python, threads, runs, device);
    FILE *p = popen(command, "r");
    int got = 0;
    if (!p) return 0;
    while (fscanf(p, "%63s", key) == 1) {
        if (!strcmp(key, "torch_version")) { if (fscanf(p, "%63s", version) == 1) got++; continue; }
        if (fscanf(p, "%lf", &value) != 1) break;
        got++;
        if (!strcmp(key, "b1_first_ms")) r->b1_first = value;
        else if (!strcmp(key, "b1_ms")) r->b1 = value;
        else if (!strcmp(key, "b16_first_ms")) r->b16_first = value;
        else if (!strcmp(key, "b16_ms")) r->b16 = value;
        else if (!strcmp(key, "train_first_ms")) r->train_first = value;
        else if (!strcmp(key, "train_ms")) r->train = value;
        else if (!strcmp(key, "b1_cpu_ms")) r->b1_cpu = value;
        else if (!strcmp(key, "b16_cpu_ms")) r->b16_cpu = value;
        else if (!strcmp(key, "train_cpu_ms")) r->train_cpu = value;
    }
    if (pclose(p) != 0 || got < 11) return 0;
    snprintf(r->label, sizeof r->label, "PyTorch %s %s, %d thread%s", version, device, threads,
             threads == 1 ? "" : "s");
    r->is_torch = 1; r->threads = threads;
    return 1;
}

/* run_torch `tries` times: each column its fastest (the version and label of the first) */
#define TORCH_TRIES 3
static int run_torch_best(const char *python, const char *device, int threads, int runs, row *r) {
    row t;
    int got = 0;
    for (int k = 0; k < TORCH_TRIES; k++) {
        memset(&t, 0, sizeof t);
        if (!run_torch(python, device, threads, runs, &t)) {
            if (got == 0) return 0;                      /* no such PyTorch here: no more tries */
            continue;
        }
        if (got++ == 0) { *r = t; continue; }
        double *best[] = { &r->b1_first, &r->b1, &r->b16_first, &r->b16, &r->train_first, &r->train,
                           &r->b1_cpu, &r->b16_cpu, &r->train_cpu };
        const double now[] = { t.b1_first, t.b1, t.b16_first, t.b16, t.train_first, t.train,
                               t.b1_cpu, t.b16_cpu, t.train_cpu };
        for (int c = 0; c < 9; c++) if (now[c] < *best[c]) *best[c] = now[c];
    }
    return got > 0;
}

static void print_row(const row *r) {
    printf("  %-46s %8.1f %8.2f %9.1f %8.2f %8.1f %9.1f %8.1f\n", r->label, r->b1_first, r->b1, r->b16_first,
           r->b16 / 16, 16e3 / r->b16, r->train_first, r->train);
}
static void print_cpu_row(const row *r) {
    if (r->threads == 1)
        printf("  %-46s %8.2f %8.2f %8.1f\n", r->label, r->b1_cpu, r->b16_cpu / 16, r->train_cpu);
}

int main(int argc, char **argv) {
    int runs = 5, with_torch = 1, cpus = (int)sysconf(_SC_NPROCESSORS_ONLN);
    const char *only = NULL, *python = getenv("PYTHON") ? getenv("PYTHON") : "/usr/bin/python3";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--runs") && i + 1 < argc && atoi(argv[i + 1]) > 0) runs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--no-torch")) with_torch = 0;
        else if (!strcmp(argv[i], "--device") && i + 1 < argc) only = argv[++i];
        else {
            int help = !strcmp(argv[i], "--help") || !strcmp(argv[i], "-h");
            fprintf(help ? stdout : stderr, "usage: %s [--runs N (5)] [--no-torch] [--device cpu|opencl:N]\n",
                    argv[0]);
            return help ? 0 : 2;
        }
    }
    if (cpus < 1) cpus = 1;
    row rows[MAX_ROWS], torch_rows[3], cuda;
    int n = 0, n_torch = 0, status = 0, has_cuda = 0, opencl_only = only && !strncmp(only, "opencl", 6);
    mlc_device_info devices[MAX_DEVICES];
    int count = mlc_devices(devices, MAX_DEVICES);
    double load_before = load_average();
    printf("plaidbench: MobileNetV2 (torchvision's architecture, random weights); %d CPUs online; %d runs "
           "(batch 1: %d)\n", cpus, runs, 4 * runs);
    if (with_torch && !opencl_only)
        for (int t = 1; t <= cpus && n_torch < 2; t = t == 1 && cpus > 1 ? cpus : cpus + 1) {
            memset(&torch_rows[n_torch], 0, sizeof(row));
            if (run_torch_best(python, "cpu", t, runs, &torch_rows[n_torch])) n_torch++;
            else printf("  (PyTorch on %d thread%s: not run; python3 with torch and torchvision?)\n", t,
                        t == 1 ? "" : "s");
        }
    if (with_torch && (!only || opencl_only) && count > 0) {     /* the OpenCL rows' peer */
        memset(&cuda, 0, sizeof cuda);
        has_cuda = run_torch_best(python, "cuda", cpus, runs, &cuda);
        if (!has_cuda) printf("  (PyTorch CUDA: not run; no GPU for this python's torch)\n");
    }
    for (int d = -2; d < count && d < MAX_DEVICES; d++) {
        char spec[32], why[512] = "";
        int threads = d == -2 ? 1 : d == -1 ? cpus : 0;
        row *r = &rows[n];
        if (d == -1 && cpus == 1) continue;
        snprintf(spec, sizeof spec, d < 0 ? "cpu" : "opencl:%d", d);
        if (only && strcmp(only, spec)) continue;
        memset(r, 0, sizeof *r);
        if (d < 0)
            snprintf(r->label, sizeof r->label, "mlc cpu, %d thread%s", threads, threads == 1 ? "" : "s");
        else snprintf(r->label, sizeof r->label, "mlc %s %.30s", spec, devices[d].name);
        r->threads = threads;
        fflush(stdout);
        if (run_mlc(spec, threads, runs, r, why, sizeof why)) n++;
        else { printf("  %s: %s\n", r->label, why); status = 1; }
    }
    printf("\n  %-46s %8s %8s %9s %8s %8s %9s %8s\n", "", "b1 first", "b1", "b16 first", "b16", "b16",
           "train 1st", "train");
    printf("  %-46s %8s %8s %9s %8s %8s %9s %8s\n", "device", "ms", "ms/img", "ms", "ms/img", "img/s", "ms",
           "ms/step");
    for (int i = 0; i < n; i++) print_row(&rows[i]);
    for (int i = 0; i < n_torch; i++) print_row(&torch_rows[i]);
    if (has_cuda) {
        print_row(&cuda);
        printf("\n  ratios against PyTorch CUDA (latency, training: mlc / PyTorch, below 1 is mlc faster;\n"
               "  batch-16 throughput: mlc's images/s over PyTorch's, above 1 is mlc faster)\n");
        printf("  %-46s %12s %12s %12s\n", "mlc row", "b1 latency", "b16 thrpt", "train step");
        for (int i = 0; i < n; i++)
            if (rows[i].threads == 0)
                printf("  %-46s %11.2fx %11.2fx %11.2fx\n", rows[i].label, rows[i].b1 / cuda.b1,
                       cuda.b16 / rows[i].b16, rows[i].train / cuda.train);
    }
    if (n_torch) {
        printf("\n  ratios against PyTorch on the CPU (latency, training: mlc / PyTorch, below 1 is mlc\n"
               "  faster; throughput: mlc / PyTorch, above 1 is mlc faster)\n");
        printf("  %-46s %-16s %12s %12s %12s\n", "mlc row", "PyTorch", "b1 latency", "b16 thrpt",
               "train step");
        row best = torch_rows[0];                    /* PyTorch's best setting, column by column */
        for (int k = 1; k < n_torch; k++) {
            best.b1 = torch_rows[k].b1 < best.b1 ? torch_rows[k].b1 : best.b1;
            best.b16 = torch_rows[k].b16 < best.b16 ? torch_rows[k].b16 : best.b16;
            best.train = torch_rows[k].train < best.train ? torch_rows[k].train : best.train;
        }
        for (int i = 0; i < n; i++) {
            const row *m = &rows[i];
            for (int k = 0; k < n_torch; k++) {
                const row *t = &torch_rows[k];
                if (m->threads && m->threads != t->threads) continue;     /* the CPU: the same threads */
                printf("  %-46s %2d thread%-6s %11.2fx %11.2fx %11.2fx\n", m->label, t->threads,
                       t->threads == 1 ? "" : "s", m->b1 / t->b1, t->b16 / m->b16, m->train / t->train);
            }
            printf("  %-46s %-16s %11.2fx %11.2fx %11.2fx\n", m->label, "its best row", m->b1 / best.b1,
                   best.b16 / m->b16, m->train / best.train);
        }
    }
    if (n_torch && torch_rows[0].threads == 1) {         /* 1 thread, in CPU time */
        printf("\n  1 thread in the process's CPU time (medians; what other processes took of the CPUs is\n"
               "  left out, which the wall-clock figures above include when the machine is shared)\n");
        printf("  %-46s %8s %8s %8s\n", "", "b1", "b16", "train");
        printf("  %-46s %8s %8s %8s\n", "device", "ms/img", "ms/img", "ms/step");
        for (int i = 0; i < n; i++) print_cpu_row(&rows[i]);
        print_cpu_row(&torch_rows[0]);
        for (int i = 0; i < n; i++)
            if (rows[i].threads == 1)
                printf("  %-46s %7.2fx %7.2fx %7.2fx   (b1, train: mlc / PyTorch; b16: PyTorch / mlc)\n",
                       "ratios", rows[i].b1_cpu / torch_rows[0].b1_cpu,
                       torch_rows[0].b16_cpu / rows[i].b16_cpu, rows[i].train_cpu / torch_rows[0].train_cpu);
    }
    if (!only || !strcmp(only, "cpu")) depthwise_alone(runs);
    printf("\n  load average (1 min) before %.2f, after %.2f: above 0, other processes shared the CPUs\n",
           load_before, load_average());
    return status;
}
