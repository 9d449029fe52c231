/* bench/gpu.c - mlc on a GPU through OpenCL, against PyTorch's CUDA on the same GPU
   (bench/torch_gpu.py prints the peer's figures; bench/gpu.sh runs both and the suite).

   What it measures, on the device of $MLC_DEVICE (default "opencl"):
     1. sgemm TFLOP/s of C = A B for square n (mlc_matmul of device tensors, float32), the median
        of timed calls, each followed by mlc_sync; the result checked against a CPU context.
     2. one training step of the digits MLP 64-128-128-10 (ReLU) and of the digits demo's CNN
        (examples/digits.c), batch 32, AdamW, cross entropy, on data/digits.bin: frame begin,
        gather the batch on the device, forward, loss, zero_grad, backward, step, read the loss
        (mlc_item, which waits for the device, as a user's loop that prints it does), frame end.
        Median µs of 300 steps after 30 warm-up steps, and the kernels launched per step
        (mlc_stats.launches).
     3. the same step at batch 512 for a wide MLP 784-1024-1024-10 (ReLU) and the Fashion-MNIST
        CNN (examples/fashion_models.h), on 4,096 random 784-pixel images with random labels (the
        timing needs no data set), in float32 and under bf16 autocast (mlc_autocast_begin: the
        products' inputs in bf16 storage, float32 master weights). Median of 100 steps after 10.
   Output: "key value" lines.
   Build: cc -O2 -std=c99 -I. -DMLC_OPENCL bench/gpu.c -lm (-ldl before glibc 2.34)
   Usage: gpu [--gemm-only | --steps-only] [--sizes n,n,...] [--data data/digits.bin]
              [--wide-steps N]   timed steps of part 3 (100; 0 leaves it out)
              [--gemm-kernels]   each size also with each GPU product kernel forced
              [--program FILE]   the device's build of the kernels (PTX on NVIDIA) into FILE */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <time.h>
#define MLC_IMPLEMENTATION
#include "mlc.h"
#include "../examples/digits_data.h"
#include "../examples/fashion_models.h"

#define BATCH 32
#define WARMUP_STEPS 30
#define TIMED_STEPS 300
#define WIDE_BATCH 512
#define WIDE_IMAGES 4096

static double seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, by_value);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* max |c - ref| / max |ref| */
static double relative_error(const float *c, const float *ref, size_t n) {
    double worst = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        double d = c[i] - ref[i];
        if (d < 0) d = -d;
        if (!(d <= worst)) worst = d;                 /* NaN counts as the worst */
        if (ref[i] > scale) scale = ref[i];
        if (-ref[i] > scale) scale = -ref[i];
    }
    return scale > 0 ? worst / scale : worst;
}

/* On an OpenCL GPU: "" the product kernel mlc picks, else the one named (see mlc_opencl.h) */
static void force_gemm_kernel(mlc_ctx *ctx, const char *variant) {
#ifdef MLC_OPENCL
    if (ctx->backend != &mlc__opencl_backend) return;
    mlc__cl_st(ctx)->gemm_tile_rows = strcmp(variant, "_mlc_gemm_128x64") == 0 ? 128
                                      : strcmp(variant, "_mlc_gemm_64x64") == 0 ? 64 : 0;
#else
    (void)ctx; (void)variant;
#endif
}

/* The device's build of mlc's kernels (PTX on NVIDIA), for reading registers and spills. */
static void save_program(mlc_ctx *ctx, const char *path) {
#ifdef MLC_OPENCL
    cl_int (*info)(cl_program, cl_program_info, size_t, void *, size_t *);
    size_t size = 0;
    unsigned char *binary;
    FILE *out;
    if (ctx->backend != &mlc__opencl_backend || !mlc__cl_st(ctx)->program) return;
    void *library = dlopen("libOpenCL.so.1", RTLD_NOW | RTLD_LOCAL);   /* mlc's, opened again */
    void *symbol = library ? dlsym(library, "clGetProgramInfo") : NULL;
    memcpy(&info, &symbol, sizeof symbol);
    if (!info || info(mlc__cl_st(ctx)->program, CL_PROGRAM_BINARY_SIZES, sizeof size, &size, NULL) || !size) return;
    if (!(binary = malloc(size))) return;
    if (!info(mlc__cl_st(ctx)->program, CL_PROGRAM_BINARIES, sizeof binary, &binary, NULL) && (out = fopen(path, "wb"))) {
        fwrite(binary, 1, size, out);
        fclose(out);
    }
    free(binary);
    {   /* and the build log beside it (with MLC_OPENCL_OPTIONS=-cl-nv-verbose: registers, spills) */
        char log_path[512], *log;
        snprintf(log_path, sizeof log_path, "%s.log", path);
        if (!mlc__cl.GetProgramBuildInfo(mlc__cl_st(ctx)->program, mlc__cl_st(ctx)->device, CL_PROGRAM_BUILD_LOG, 0,
                                         NULL, &size) && (log = malloc(size + 1))) {
            if (!mlc__cl.GetProgramBuildInfo(mlc__cl_st(ctx)->program, mlc__cl_st(ctx)->device, CL_PROGRAM_BUILD_LOG,
                                             size, log, NULL) && (out = fopen(log_path, "w"))) {
                fwrite(log, 1, strlen(log), out);
                fclose(out);
            }
            free(log);
        }
    }
#else
    (void)ctx; (void)path;
#endif
}

static int bench_gemm(mlc_ctx *ctx, mlc_ctx *cpu, int n, const char *variant) {
    int reps = n <= 1024 ? 50 : n <= 2048 ? 20 : 10;
    double times[50];
    mlc_frame outer = mlc_frame_begin(ctx);         /* a and b live until its end */
    force_gemm_kernel(ctx, variant);
    mlc_set_grad_enabled(ctx, 0);
    mlc_seed(ctx, (uint64_t)n);
    mlc_tensor *a = mlc_randn(ctx, MLC_SHAPE(n, n)), *b = mlc_randn(ctx, MLC_SHAPE(n, n));
    if (!a || !b) return 1;
    float *a_host = malloc((size_t)n * n * sizeof(float)), *b_host = malloc((size_t)n * n * sizeof(float));
    memcpy(a_host, mlc_host_data(a), (size_t)n * n * sizeof(float));
    memcpy(b_host, mlc_host_data(b), (size_t)n * n * sizeof(float));
    mlc_to(a, 1); mlc_to(b, 1);
    for (int r = -3; r < reps; r++) {               /* three warm-up calls */
        mlc_frame f = mlc_frame_begin(ctx);
        mlc_sync(ctx);
        double t0 = seconds();
        mlc_tensor *c = mlc_matmul(a, b);
        mlc_sync(ctx);
        double t1 = seconds();
        if (!c) { mlc_frame_end(f); break; }
        if (r >= 0) times[r] = t1 - t0;
        if (r == reps - 1 && n <= 2048) {           /* the last result against the CPU's */
            mlc_frame g = mlc_frame_begin(cpu);
            mlc_tensor *ca = mlc_from_data(cpu, MLC_SHAPE(n, n), a_host);
            mlc_tensor *cb = mlc_from_data(cpu, MLC_SHAPE(n, n), b_host);
            mlc_tensor *ref = mlc_matmul(ca, cb);
            if (ref) printf("gemm_%d%s_relerr %.3g\n", n, variant, relative_error(mlc_host_data(c), ref->data, (size_t)n * n));
            mlc_frame_end(g);
        }
        mlc_frame_end(f);
    }
    free(a_host); free(b_host);
    mlc_set_grad_enabled(ctx, 1);
    mlc_frame_end(outer);
    force_gemm_kernel(ctx, "");
    if (mlc_error(ctx)) { fprintf(stderr, "gemm %d: %s\n", n, mlc_error_message(ctx)); return 1; }
    double t = median(times, reps);
    printf("gemm_%d%s_tflops %.2f\n", n, variant, 2.0 * n * n * (double)n / t * 1e-12);
    printf("gemm_%d%s_ms %.3f\n", n, variant, t * 1e3);
    return 0;
}

static mlc_tensor *digits_image(mlc_module *m, mlc_tensor *x) { (void)m; return mlc_reshape(x, MLC_SHAPE(-1, 1, 8, 8)); }

enum model_kind { DIGITS_MLP, DIGITS_CNN, WIDE_MLP, FASHION_CNN };

static mlc_module *make_model(mlc_ctx *ctx, enum model_kind kind) {
    if (kind == DIGITS_MLP || kind == WIDE_MLP) {
        int in = kind == WIDE_MLP ? 784 : 64, hidden = kind == WIDE_MLP ? 1024 : 128;
        mlc_module *l1 = mlc_nn_linear(ctx, in, hidden);
        mlc_module *l2 = mlc_nn_linear(ctx, hidden, hidden);
        mlc_module *l3 = mlc_nn_linear(ctx, hidden, 10);
        return mlc_nn_sequential(ctx, l1, mlc_nn_relu(ctx), l2, mlc_nn_relu(ctx), l3, NULL);
    }
    if (kind == FASHION_CNN) return make_cnn(ctx);
    mlc_module *conv1 = mlc_nn_conv2d(ctx, 1, 16, 3, (mlc_conv_opts){ .padding = 1 });
    mlc_module *conv2 = mlc_nn_conv2d(ctx, 16, 32, 3, (mlc_conv_opts){ .padding = 1 });
    mlc_module *fc = mlc_nn_linear(ctx, 128, 10);
    return mlc_nn_sequential(ctx, mlc_nn_custom(ctx, "Reshape", digits_image, NULL),
        conv1, mlc_nn_batch_norm(ctx, 16), mlc_nn_relu(ctx), mlc_nn_max_pool2d(ctx, 2, 2),
        conv2, mlc_nn_batch_norm(ctx, 32), mlc_nn_relu(ctx), mlc_nn_max_pool2d(ctx, 2, 2),
        mlc_nn_flatten(ctx), mlc_nn_dropout(ctx, 0.3f), fc, NULL);
}

/* Training steps of `model` on batches of `batch` rows of (x, y), shuffled each epoch, under
   autocast when amp is a half dtype: the median µs and the launches of one step printed as
   step_<name>_... lines. */
static int timed_steps(mlc_ctx *ctx, enum model_kind kind, mlc_tensor *x, mlc_tensor *y, int batch,
                       mlc_scalar_type amp, int warmup, int timed, const char *name) {
    int n = x->shape[0];
    if (mlc_has_device(ctx)) { mlc_to(x, 1); mlc_to(y, 1); }
    mlc_module *model = make_model(ctx, kind);
    mlc_optim *opt = mlc_adamw(ctx, model, (mlc_adam_opts){ .lr = 3e-3f, .weight_decay = 1e-2f });
    float *order = malloc((size_t)n * sizeof *order);
    double *times = malloc((size_t)timed * sizeof *times), first_loss = 0, last_loss = 0;
    size_t launches = 0;
    if (!model || !opt || !order || !times) { free(order); free(times); return 1; }
    for (int i = 0; i < n; i++) order[i] = (float)i;
    for (int s = -warmup; s < timed; s++) {
        int b = ((s + warmup) * batch) % (n - batch);
        if (b < batch)                                   /* a new epoch: shuffle */
            for (int i = n - 1; i > 0; i--) {
                int j = (int)(mlc_rand_u32(ctx) % (uint32_t)(i + 1));
                float t = order[i]; order[i] = order[j]; order[j] = t;
            }
        size_t launched = mlc_get_stats(ctx).launches;
        double t0 = seconds();
        mlc_frame f = mlc_frame_begin(ctx);
        mlc_tensor *idx = mlc_from_data(ctx, MLC_SHAPE(batch), order + b);
        if (amp != MLC_F32) mlc_autocast_begin(ctx, amp);
        mlc_tensor *logits = mlc_forward(model, mlc_index_select(x, 0, idx));
        mlc_tensor *loss = mlc_cross_entropy(logits, mlc_index_select(y, 0, idx), MLC_REDUCE_MEAN, MLC_NO_IGNORE);
        if (amp != MLC_F32) mlc_autocast_end(ctx);
        mlc_zero_grad(opt);
        mlc_backward(loss);
        mlc_step(opt);
        float value = mlc_item(loss);
        mlc_frame_end(f);
        double t1 = seconds();
        if (mlc_error(ctx)) break;
        if (s == -warmup) first_loss = value;
        last_loss = value;
        if (s >= 0) { times[s] = t1 - t0; launches = mlc_get_stats(ctx).launches - launched; }
    }
    free(order);
    if (mlc_error(ctx)) { fprintf(stderr, "%s step: %s\n", name, mlc_error_message(ctx)); free(times); return 1; }
    printf("step_%s_us %.1f\n", name, 1e6 * median(times, timed));
    printf("step_%s_launches %zu\n", name, launches);
    printf("step_%s_loss %.4f -> %.4f\n", name, first_loss, last_loss);
    printf("step_%s_fallbacks %zu\n", name, mlc_get_stats(ctx).fallbacks);
    free(times);
    return 0;
}

/* Part 2: the digits models at batch 32 on the digits data */
static int digits_steps(mlc_ctx *ctx, const digits_set *ds, enum model_kind kind, const char *name) {
    int n = DIGITS_TRAIN_COUNT;
    mlc_frame outer = mlc_frame_begin(ctx);
    mlc_seed(ctx, 1);
    mlc_tensor *x = mlc_empty(ctx, MLC_SHAPE(n, DIGITS_PIXELS)), *y = mlc_empty(ctx, MLC_SHAPE(n));
    int status = !x || !y;
    for (int i = 0; !status && i < n; i++) {
        for (int j = 0; j < DIGITS_PIXELS; j++) x->data[i * DIGITS_PIXELS + j] = ds->pixels[i * DIGITS_PIXELS + j] / 16.0f;
        y->data[i] = ds->labels[i];
    }
    if (!status) status = timed_steps(ctx, kind, x, y, BATCH, MLC_F32, WARMUP_STEPS, TIMED_STEPS, name);
    mlc_frame_end(outer);
    return status;
}

/* Part 3: a wide MLP and the Fashion CNN at batch 512 on random images, float32 and bf16 */
static int wide_steps(mlc_ctx *ctx, enum model_kind kind, mlc_scalar_type amp, int timed, const char *name) {
    mlc_frame outer = mlc_frame_begin(ctx);
    mlc_seed(ctx, 2);
    mlc_tensor *x = mlc_randn(ctx, MLC_SHAPE(WIDE_IMAGES, 784)), *y = mlc_empty(ctx, MLC_SHAPE(WIDE_IMAGES));
    int status = !x || !y;
    for (int i = 0; !status && i < WIDE_IMAGES; i++) y->data[i] = (float)(mlc_rand_u32(ctx) % 10);
    if (!status) status = timed_steps(ctx, kind, x, y, WIDE_BATCH, amp, 10, timed, name);
    mlc_frame_end(outer);
    return status;
}

int main(int argc, char **argv) {
    int gemm = 1, steps = 1, kernels = 0, status = 0, wide = 100;
    const char *sizes = "256,512,1024,2048,4096", *path = "data/digits.bin", *program = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--gemm-only") == 0) steps = 0;
        else if (strcmp(argv[i], "--steps-only") == 0) gemm = 0;
        else if (strcmp(argv[i], "--sizes") == 0 && i + 1 < argc) sizes = argv[++i];
        else if (strcmp(argv[i], "--data") == 0 && i + 1 < argc) path = argv[++i];
        else if (strcmp(argv[i], "--gemm-kernels") == 0) kernels = 1;
        else if (strcmp(argv[i], "--program") == 0 && i + 1 < argc) program = argv[++i];
        else if (strcmp(argv[i], "--wide-steps") == 0 && i + 1 < argc) wide = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--gemm-only | --steps-only] [--sizes n,n,...] [--data FILE] [--gemm-kernels] "
                    "[--program FILE] [--wide-steps N]\n", argv[0]);
            return 2;
        }
    }
    (void)make_mlp;                                        /* fashion_models.h's other model */
    const char *device = getenv("MLC_DEVICE") ? getenv("MLC_DEVICE") : "opencl";
    mlc_ctx *ctx = mlc_create(&(mlc_config){ .device = device, .seed = 1 });
    mlc_ctx *cpu = mlc_create(&(mlc_config){ .device = "cpu" });
    if (!ctx || mlc_error(ctx) || !cpu) return 1;
    printf("device %s\n", mlc_device_name(ctx));
    for (const char *p = sizes; gemm && *p; ) {
        int n = atoi(p);
        if (n > 0) status |= bench_gemm(ctx, cpu, n, "");
        if (n > 0 && kernels)
            status |= bench_gemm(ctx, cpu, n, "_mlc_gemm_64x64") | bench_gemm(ctx, cpu, n, "_mlc_gemm_128x64");
        while (*p && *p != ',') p++;
        if (*p == ',') p++;
    }
    if (steps) {
        char err[256];
        digits_set ds;
        if (digits_load(path, &ds, err, sizeof err) != 0) { fprintf(stderr, "%s\n", err); return 1; }
        status |= digits_steps(ctx, &ds, DIGITS_MLP, "mlp");
        status |= digits_steps(ctx, &ds, DIGITS_CNN, "cnn");
        status |= digits_steps(cpu, &ds, DIGITS_MLP, "cpu_mlp");        /* the CPU's own step, for scale */
        digits_free(&ds);
        for (int k = 0; wide > 0 && k < 4; k++)
            status |= wide_steps(ctx, k < 2 ? WIDE_MLP : FASHION_CNN, k % 2 ? MLC_BF16 : MLC_F32, wide,
                                 (const char *[]){ "wide_mlp", "wide_mlp_bf16", "fashion_cnn", "fashion_cnn_bf16" }[k]);
    }
    if (program) save_program(ctx, program);
    mlc_destroy(ctx);
    mlc_destroy(cpu);
    return status;
}
