/* The devices mlc can run on and how fast each one trains: the device table (numbered as
   config.device / MLC_DEVICE = "opencl:N" takes them, like `clinfo -l`), what "best" picks,
   then the same three workloads timed on mlc's CPU path and on every OpenCL device, in one table:
     MLP step   one training step of a digits MLP 64-256-128-10 (batch 64, Adam, cross entropy)
     CNN fwd    the digits CNN of examples/digits.c, inference on a batch of 256 images
     wide MLP   training steps of a 784-1024-1024-10 MLP, batch 512, as samples/s and GFLOP/s:
                big enough for a GPU to pull ahead of the CPU
   Each time is the mean over a run of at least 0.3 s after a warm-up step; "first" is the warm-up
   step of the digits MLP, which on OpenCL includes building the kernels. Data: UCI digits
   (data/digits.bin) and, for the wide MLP, random Fashion-MNIST-shaped batches.
   Usage: devices [--list] [--device SPEC] [FILE]   (--list: the device table only; --device cpu or
          opencl:N: time that one only; FILE: default data/digits.bin, found from any directory)
   Build: make build/devices, or cc -std=c99 -O2 -fopenmp -DMLC_OPENCL -I. examples/devices.c -o devices -lm
   (add -ldl on glibc before 2.34; without -fopenmp the CPU row uses one thread; without
   -DMLC_OPENCL, which needs the OpenCL headers, only the CPU is listed and timed). */
#define _POSIX_C_SOURCE 199309L
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#define MLC_IMPLEMENTATION
#include "mlc.h"
#include "digits_data.h"
#include "find_data.h"
#ifdef _OPENMP
#include <omp.h>
#endif

#define DEFAULT_DIGITS "data/digits.bin"
enum { MAX_ROWS = 16, MLP_BATCH = 64, CNN_BATCH = 256, WIDE_BATCH = 512, WIDE_IN = 784, WIDE_HIDDEN = 1024 };

static double seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* mlc says why "best" stays on the CPU at the INFO level, and warns when an op falls back. */
static void show_log(mlc_log_level level, const char *message, void *user) {
    (void)user;
    printf("  %s%s\n", level == MLC_LOG_INFO ? "" : level == MLC_LOG_WARN ? "warning: " : "error: ", message);
}

/* One device's figures; NAN where a workload failed. */
typedef struct timing {
    double mlp_us, cnn_ms, wide_samples, first_ms;
    size_t device_peak, fallbacks;
    char error[512];
} timing;

/* The models and their inputs, made in one context. */
typedef struct workloads {
    mlc_ctx *ctx;
    mlc_module *mlp, *cnn, *wide;
    mlc_optim *mlp_opt, *wide_opt;
    mlc_tensor *x_digits, *y_digits, *x_wide, *y_wide;
    int n_digits, next;
} workloads;

static mlc_tensor *to_image(mlc_module *m, mlc_tensor *x) { (void)m; return mlc_reshape(x, MLC_SHAPE(-1, 1, 8, 8)); }

static int make_workloads(workloads *w, const digits_set *ds) {
    mlc_ctx *ctx = w->ctx;
    w->n_digits = ds->count;
    w->x_digits = mlc_empty(ctx, MLC_SHAPE(ds->count, DIGITS_PIXELS));
    w->y_digits = mlc_empty(ctx, MLC_SHAPE(ds->count));
    w->x_wide = mlc_rand(ctx, MLC_SHAPE(WIDE_BATCH, WIDE_IN));
    w->y_wide = mlc_empty(ctx, MLC_SHAPE(WIDE_BATCH));
    if (!w->x_digits || !w->y_digits || !w->y_wide) return 0;
    for (int i = 0; i < ds->count; i++) {
        for (int j = 0; j < DIGITS_PIXELS; j++) w->x_digits->data[i * DIGITS_PIXELS + j] = ds->pixels[(size_t)i * DIGITS_PIXELS + j] / 16.0f;
        w->y_digits->data[i] = ds->labels[i];
    }
    for (int i = 0; i < WIDE_BATCH; i++) w->y_wide->data[i] = (float)(mlc_rand_u32(ctx) % 10);
    /* layers with weights one a statement, in order (a call's arguments have no set order, and
       each layer draws from the context's RNG): the same models on every compiler */
    mlc_module *m1 = mlc_nn_linear(ctx, DIGITS_PIXELS, 256), *m2 = mlc_nn_linear(ctx, 256, 128);
    mlc_module *m3 = mlc_nn_linear(ctx, 128, 10);
    mlc_module *c1 = mlc_nn_conv2d(ctx, 1, 16, 3, (mlc_conv_opts){ .padding = 1 });
    mlc_module *c2 = mlc_nn_conv2d(ctx, 16, 32, 3, (mlc_conv_opts){ .padding = 1 });
    mlc_module *c3 = mlc_nn_linear(ctx, 128, 10);
    mlc_module *w1 = mlc_nn_linear(ctx, WIDE_IN, WIDE_HIDDEN), *w2 = mlc_nn_linear(ctx, WIDE_HIDDEN, WIDE_HIDDEN);
    mlc_module *w3 = mlc_nn_linear(ctx, WIDE_HIDDEN, 10);
    w->mlp = mlc_nn_sequential(ctx, m1, mlc_nn_relu(ctx), m2, mlc_nn_relu(ctx), m3, NULL);
    w->cnn = mlc_nn_sequential(ctx, mlc_nn_custom(ctx, "Reshape", to_image, NULL),
        c1, mlc_nn_batch_norm(ctx, 16), mlc_nn_relu(ctx), mlc_nn_max_pool2d(ctx, 2, 2),
        c2, mlc_nn_batch_norm(ctx, 32), mlc_nn_relu(ctx), mlc_nn_max_pool2d(ctx, 2, 2),
        mlc_nn_flatten(ctx), c3, NULL);
    w->wide = mlc_nn_sequential(ctx, w1, mlc_nn_relu(ctx), w2, mlc_nn_relu(ctx), w3, NULL);
    w->mlp_opt = mlc_adam(ctx, w->mlp, (mlc_adam_opts){ .lr = 1e-3f });
    w->wide_opt = mlc_adam(ctx, w->wide, (mlc_adam_opts){ .lr = 1e-3f });
    if (w->cnn) mlc_module_train(w->cnn, 0);
    return mlc_error(ctx) == MLC_OK;
}

/* One training step; `wait`: read the loss, so the time includes the device finishing. */
static int train_step(mlc_module *model, mlc_optim *opt, mlc_tensor *x, mlc_tensor *y, int wait) {
    mlc_tensor *loss = mlc_cross_entropy(mlc_forward(model, x), y, MLC_REDUCE_MEAN, MLC_NO_IGNORE);
    mlc_zero_grad(opt);
    mlc_backward(loss);
    mlc_step(opt);
    return loss && (!wait || isfinite(mlc_item(loss)));
}

static int mlp_step(workloads *w, int wait) {
    mlc_frame f = mlc_frame_begin(w->ctx);
    float rows[MLP_BATCH];
    for (int i = 0; i < MLP_BATCH; i++) rows[i] = (float)(w->next++ % w->n_digits);
    mlc_tensor *idx = mlc_from_data(w->ctx, MLC_SHAPE(MLP_BATCH), rows);
    int ok = train_step(w->mlp, w->mlp_opt, mlc_index_select(w->x_digits, 0, idx), mlc_index_select(w->y_digits, 0, idx), wait);
    mlc_frame_end(f);
    return ok;
}

static int cnn_forward(workloads *w, int wait) {
    mlc_frame f = mlc_frame_begin(w->ctx);
    int was = mlc_set_grad_enabled(w->ctx, 0);
    mlc_tensor *out = mlc_forward(w->cnn, mlc_slice(w->x_digits, 0, 0, CNN_BATCH));
    int ok = out && (!wait || mlc_host_data(out));
    mlc_set_grad_enabled(w->ctx, was);
    mlc_frame_end(f);
    return ok;
}

static int wide_step(workloads *w, int wait) {
    mlc_frame f = mlc_frame_begin(w->ctx);
    int ok = train_step(w->wide, w->wide_opt, w->x_wide, w->y_wide, wait);
    mlc_frame_end(f);
    return ok;
}

/* Seconds per call of run: doubling runs, each ending with a wait, until one lasts 0.3 s. */
static double time_per_call(workloads *w, int (*run)(workloads *, int)) {
    if (!run(w, 1)) return NAN;                             /* warm-up */
    for (int reps = 1;; reps *= 2) {
        double start = seconds();
        for (int i = 0; i < reps; i++)
            if (!run(w, i == reps - 1)) return NAN;
        double elapsed = seconds() - start;
        if (elapsed >= 0.3 || reps >= 1 << 20) return elapsed / reps;
    }
}

static void time_device(const char *spec, const digits_set *ds, timing *t) {
    memset(t, 0, sizeof *t);
    t->mlp_us = t->cnn_ms = t->wide_samples = t->first_ms = NAN;
    workloads w;
    memset(&w, 0, sizeof w);
    w.ctx = mlc_create(&(mlc_config){ .seed = 1, .device = spec, .log = show_log,
                                      .error = t->error, .error_bytes = sizeof t->error });
    if (!w.ctx) return;                         /* t->error says why: the device cannot be had */
    if (make_workloads(&w, ds)) {
        double start = seconds();
        if (mlp_step(&w, 1)) t->first_ms = 1e3 * (seconds() - start);
        t->mlp_us = 1e6 * time_per_call(&w, mlp_step);
        t->cnn_ms = 1e3 * time_per_call(&w, cnn_forward);
        t->wide_samples = WIDE_BATCH / time_per_call(&w, wide_step);
    }
    if (mlc_error(w.ctx)) snprintf(t->error, sizeof t->error, "%s", mlc_error_message(w.ctx));
    mlc_stats s = mlc_get_stats(w.ctx);
    t->device_peak = s.device_bytes_peak;
    t->fallbacks = s.fallbacks;
    mlc_destroy(w.ctx);
}

static void usage(FILE *out, const char *program) {
    fprintf(out, "usage: %s [--list] [--device SPEC] [FILE]\n"
                 "Lists the devices mlc can use and times three workloads on each of them.\n"
                 "  --list         the device table only\n"
                 "  --device SPEC  time this device only: cpu or opencl:N (default: every device)\n"
                 "  FILE           the UCI digits (default " DEFAULT_DIGITS ", looked up in the current\n"
                 "                 directory, then in the program's directory, then in its parent)\n"
                 "  -h, --help     this text\n", program);
}

int main(int argc, char **argv) {
    int list_only = 0;
    const char *path = NULL, *only = NULL;
    char found[1024];
    for (int i = 1; i < argc; i++) {                  /* --help: exit 0; a bad command line: 2 */
        const char *arg = argv[i], *bad = NULL;
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) { usage(stdout, argv[0]); return 0; }
        else if (!strcmp(arg, "--list")) list_only = 1;
        else if (!strcmp(arg, "--device")) { if (++i < argc) only = argv[i]; else bad = "needs a value"; }
        else if (arg[0] == '-') bad = "unknown option";
        else if (path) bad = "one data file only";
        else path = arg;
        if (bad) { fprintf(stderr, "%s: %s\n", arg, bad); usage(stderr, argv[0]); return 2; }
    }
    if (!path) path = find_data(argv[0], DEFAULT_DIGITS, found, sizeof found);
    mlc_device_info rows[MAX_ROWS];
    int count = mlc_devices(rows, MAX_ROWS);

    printf("OpenCL devices:\n");
#ifdef MLC_OPENCL
    if (count == 0) printf("  none (no OpenCL library, driver or platform was found)\n");
#else
    if (count == 0) printf("  none: built without -DMLC_OPENCL (install the OpenCL headers, then make build/devices)\n");
#endif
    else printf("  %-3s %-11s %5s %10s  %s\n", "N", "type", "units", "memory", "device (platform; version)");
    for (int i = 0; i < count && i < MAX_ROWS; i++)
        printf("  %-3d %-11s %5d %6.1f GiB  %s (%s; %s)\n", rows[i].index, rows[i].type, rows[i].compute_units,
               (double)rows[i].memory_bytes / (1024.0 * 1024.0 * 1024.0), rows[i].name, rows[i].platform, rows[i].version);
    if (count > MAX_ROWS) printf("  ... and %d more\n", count - MAX_ROWS);

    /* "best": the first GPU, else the CPU (never an OpenCL CPU driver such as PoCL, unless named) */
    char why[256] = "";
    mlc_ctx *best = mlc_create(&(mlc_config){ .device = "best", .log = show_log,
                                              .error = why, .error_bytes = sizeof why });
    if (!best) { fprintf(stderr, "error: %s\n", why); return 1; }
    printf("\nMLC_DEVICE=best picks: %s\n", mlc_device_name(best));
    mlc_destroy(best);
    if (list_only) return 0;

    char err[256];
    digits_set ds;
    if (digits_load(path, &ds, err, sizeof err) != 0) { fprintf(stderr, "%s\n", err); return 1; }
    int threads = 1;
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    double wide_flop = 6.0 * WIDE_BATCH * ((double)WIDE_IN * WIDE_HIDDEN + (double)WIDE_HIDDEN * WIDE_HIDDEN + WIDE_HIDDEN * 10.0);
    printf("\nTimings (%s; MLP step: digits 64-256-128-10 batch %d; CNN fwd: digits CNN batch %d;\n"
           "wide MLP: 784-1024-1024-10 batch %d, training):\n", path, MLP_BATCH, CNN_BATCH, WIDE_BATCH);
    printf("  %-44s %10s %9s %12s %8s %9s %10s %9s\n", "device", "MLP step", "CNN fwd", "wide MLP", "wide", "first",
           "device", "fallbacks");
    printf("  %-44s %10s %9s %12s %8s %9s %10s %9s\n", "", "us", "ms", "samples/s", "GFLOP/s", "step ms", "peak MB", "");
    int status = 0, timed = 0;
    for (int row = -1; row < count && row < MAX_ROWS; row++) {
        char spec[16], label[64];
        timing t;
        if (row < 0) {
            snprintf(spec, sizeof spec, "cpu");
            snprintf(label, sizeof label, "cpu: mlc's own kernels, %d thread%s", threads, threads == 1 ? "" : "s");
        } else {
            snprintf(spec, sizeof spec, "opencl:%d", row);
            snprintf(label, sizeof label, "opencl:%d %.34s", row, rows[row].name);
        }
        if (only && strcmp(only, spec)) continue;             /* --device: this one only */
        timed++;
        fflush(stdout);
        time_device(spec, &ds, &t);
        printf("  %-44s %10.1f %9.2f %12.0f %8.1f %9.1f %10.1f %9zu\n", label, t.mlp_us, t.cnn_ms, t.wide_samples,
               t.wide_samples / WIDE_BATCH * wide_flop * 1e-9, t.first_ms, (double)t.device_peak / 1e6, t.fallbacks);
        if (t.error[0]) { printf("    error: %s\n", t.error); status = 1; }
    }
    if (!timed) { fprintf(stderr, "no device %s: cpu, or opencl:N from the table\n", only); status = 1; }
    digits_free(&ds);
    return status;
}
