/* MobileNetV2 (Sandler et al. 2018) exactly as torchvision 0.14 builds it (examples/mobilenet_model.h:
   inverted residual blocks, depthwise 3x3 convolutions, ReLU6, BatchNorm, width multiplier),
   with torchvision's parameter names, so a state dict saved from
   torchvision.models.mobilenet_v2(width_mult=W) loads by name. No weights are downloaded:
   tools/export_mobilenet.py writes seeded random ones with a batch and torchvision's outputs.
   For inference each BatchNorm is folded into the conv before it (fuse_modules' eval
   semantics) and gradients are off (no tape).
   Usage: mobilenet [--width W] [--size S] [--batch N] [--weights FILE] [--check PREFIX] [--no-fuse]
                    [--device NAME] [--threads N] [--runs N] [--seed N]
   Without --check: runs the network on a random batch --runs times and prints the first run
   (warm-up) and the median per image, and the first image's top classes.
   --check PREFIX (written by tools/export_mobilenet.py PREFIX, the same --width): loads
   PREFIX.weights.safetensors and matches PREFIX.ref.safetensors: the eval output unfused and
   folded (max |mlc - torch| <= 1e-4, cosine >= 0.99999); on the CPU also the training-mode
   output and loss (the same bounds) and gradients (max |mlc - torch| <= 0.02 max |torch|,
   cosine >= 0.9999: 52 training-mode BatchNorms over few values per channel amplify rounding
   towards the first layers). Prints PASS/FAIL lines and exits 1 on a failure. --help lists the
   defaults; a bad option exits with status 2. */
#define _POSIX_C_SOURCE 199309L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#define MLC_IMPLEMENTATION
#include "mlc.h"
#include "mobilenet_model.h"

typedef struct options {
    const char *weights, *check, *device;
    float width;
    int size, batch, fuse, threads, runs;
    unsigned long long seed;
} options;

static double seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void usage(FILE *out, const char *program) {
    fprintf(out, "usage: %s [options]\n"
                 "MobileNetV2 (torchvision's) inference, timed, or checked against torchvision's outputs.\n"
                 "  --width W        width multiplier (1.0; torchvision's 0.35, 0.5, 0.75, 1.0, 1.3, 1.4)\n"
                 "  --size S         input height and width (224)\n"
                 "  --batch N        images per batch (1)\n"
                 "  --weights FILE   a torchvision state dict as safetensors (default: random weights)\n"
                 "  --check PREFIX   match PREFIX.ref.safetensors with PREFIX.weights.safetensors\n"
                 "                   (tools/export_mobilenet.py --width W PREFIX writes both)\n"
                 "  --no-fuse        keep the BatchNorms (default: folded into the convs)\n"
                 "  --device NAME    cpu, opencl, opencl:N, best (default: $MLC_DEVICE, else the CPU)\n"
                 "  --threads N      CPU threads (default: every CPU)\n"
                 "  --runs N         timed runs (5)\n"
                 "  --seed N         random seed (1)\n"
                 "  -h, --help       this text\n", program);
}

/* A whole number in [lo, hi] from text, else -1 */
static long whole(const char *text, long lo, long hi) {
    char *end;
    long v = strtol(text, &end, 10);
    return end != text && !*end && v >= lo && v <= hi ? v : -1;
}

enum { RUN, HELP, BAD };
static int parse_options(int argc, char **argv, options *o) {
    *o = (options){ .width = 1.0f, .size = 224, .batch = 1, .fuse = 1, .runs = 5, .seed = 1 };
    for (int i = 1; i < argc; i++) {
        const char *flag = argv[i], *value = i + 1 < argc ? argv[i + 1] : NULL, *bad = NULL;
        char *end;
        if (!strcmp(flag, "--help") || !strcmp(flag, "-h")) return HELP;
        if (!strcmp(flag, "--no-fuse")) { o->fuse = 0; continue; }
        char padded[64];
        snprintf(padded, sizeof padded, " %s ", flag);
        if (strlen(flag) > 16 || !strstr(" --weights --check --device --width --size --batch --threads --runs"
                                         " --seed ", padded)) {
            fprintf(stderr, "%s: unknown option\n", flag);
            return BAD;
        }
        if (!value) { fprintf(stderr, "%s: a value is missing\n", flag); return BAD; }
        i++;
        if (!strcmp(flag, "--weights")) o->weights = value;
        else if (!strcmp(flag, "--check")) o->check = value;
        else if (!strcmp(flag, "--device")) o->device = value;
        else if (!strcmp(flag, "--width")) {
            o->width = strtof(value, &end);
            if (end == value || *end || !(o->width >= 0.1f && o->width <= 4.0f)) bad = "a width in [0.1, 4]";
        } else if (!strcmp(flag, "--size")) {
            if ((o->size = (int)whole(value, 32, 4096)) < 0) bad = "a size in [32, 4096]";
        } else if (!strcmp(flag, "--batch")) {
            if ((o->batch = (int)whole(value, 1, 4096)) < 0) bad = "a batch in [1, 4096]";
        } else if (!strcmp(flag, "--threads")) {
            if ((o->threads = (int)whole(value, 1, 1024)) < 0) bad = "a thread count in [1, 1024]";
        } else if (!strcmp(flag, "--runs")) {
            if ((o->runs = (int)whole(value, 1, 100000)) < 0) bad = "runs in [1, 100000]";
        } else if (!strcmp(flag, "--seed")) {
            o->seed = strtoull(value, &end, 10);
            if (end == value || *end) bad = "a whole number";
        }
        if (bad) { fprintf(stderr, "%s %s: want %s\n", flag, value, bad); return BAD; }
    }
    return RUN;
}

static int passed, failed;

/* got against want: max |got - want| <= atol (relative: atol·max |want|) and cosine >= min_cosine */
static void compare(const char *what, mlc_tensor *got, mlc_tensor *want, double atol, int relative,
                    double min_cosine) {
    const float *g = got ? mlc_host_data(got) : NULL, *w = want ? mlc_host_data(want) : NULL;
    double worst = 0, dot = 0, gg = 0, ww = 0, largest = 0;
    int ok;
    if (!g || !w || got->size != want->size) {
        printf("FAIL %s (missing, or %zu vs %zu values)\n", what, got ? got->size : 0, want ? want->size : 0);
        failed++;
        return;
    }
    for (size_t i = 0; i < got->size; i++) {
        double d = fabs((double)g[i] - w[i]);
        worst = d > worst || d != d ? d : worst;
        dot += (double)g[i] * w[i]; gg += (double)g[i] * g[i]; ww += (double)w[i] * w[i];
        largest = fabs(w[i]) > largest ? fabs(w[i]) : largest;
    }
    if (relative) atol *= largest;
    double cosine = dot / (sqrt(gg * ww) + 1e-300);
    ok = worst <= atol && cosine >= min_cosine;
    printf("%s %s (max |mlc - torch| %.3g <= %.2g, cosine %.8f >= %.6g, %zu values)\n",
           ok ? "PASS" : "FAIL", what,
           worst, atol, cosine, min_cosine, got->size);
    if (ok) passed++; else failed++;
}

/* The gradient of the parameter named name, as a tensor of its shape */
static mlc_tensor *grad_of(mlc_module *net, const char *name) {
    static mlc_named_tensor params[512];
    int n = mlc_module_parameters(net, params, 512);
    for (int i = 0; i < n && i < 512; i++)
        if (!strcmp(params[i].name, name)) {
            mlc_tensor *p = params[i].tensor, *g = mlc_empty(net->ctx, p->ndim, p->shape);
            const float *grad = mlc_host_grad(p);
            if (g && grad) mlc_write(g, grad, p->size);
            return grad ? g : NULL;
        }
    return NULL;
}

/* --check: torchvision's outputs, eval unfused, training mode (loss and gradients), eval folded */
static int check(mlc_ctx *ctx, const options *o) {
    static const char *const grads[] = { "features.0.0.weight", "features.2.conv.1.0.weight",
                                         "features.18.1.weight", "classifier.1.weight" };
    char weights[1024], refs[1024], what[128];
    snprintf(weights, sizeof weights, "%s.weights.safetensors", o->check);
    snprintf(refs, sizeof refs, "%s.ref.safetensors", o->check);
    mlc_module *net = mobilenet_create(ctx, (mobilenet_opts){ .width = o->width });
    mlc_safetensors *ref = mlc_safetensors_open(ctx, refs);
    if (!net || !ref || mlc_module_load(net, weights, NULL) != MLC_OK) {
        fprintf(stderr, "error: %s\n", mlc_error_message(ctx));
        return 1;
    }
    mlc_tensor *x = mlc_keep(mlc_safetensors_get(ref, "x")), *y = mlc_keep(mlc_safetensors_get(ref, "y"));
    printf("MobileNetV2 width %g, %zu parameters, batch of %s on %s\n", o->width, mlc_module_param_count(net),
           refs, mlc_device_name(ctx));
    mlc_module_train(net, 0);
    int was = mlc_set_grad_enabled(ctx, 0);
    compare("eval output, BatchNorm unfused", mlc_forward(net, x), mlc_safetensors_get(ref, "out"), 1e-4, 0,
            0.99999);
    mlc_set_grad_enabled(ctx, was);

    {   /* on every device (OpenCL sums batch statistics compensated: 2e-5 at the output on PoCL) */
        const double out_tol = 1e-4, loss_tol = 1e-5;
        mlc_module_train(net, 1);                      /* batch statistics; dropout 0 as the reference */
        net->children[1]->children[0]->alpha = 0.0f;
        mlc_tensor *out = mlc_forward(net, x);
        mlc_tensor *loss = mlc_cross_entropy(out, y, MLC_REDUCE_MEAN, MLC_NO_IGNORE);
        mlc_backward(loss);
        compare("training-mode output", out, mlc_safetensors_get(ref, "out_train"), out_tol, 0, 0.99999);
        compare("training-mode loss", mlc_reshape(loss, MLC_SHAPE(1)), mlc_safetensors_get(ref, "loss"),
                loss_tol, 0, 0.99999);
        for (int i = 0; i < 4; i++) {
            snprintf(what, sizeof what, "gradient of %s", grads[i]);
            snprintf(refs, sizeof refs, "grad.%s", grads[i]);
            compare(what, grad_of(net, grads[i]), mlc_safetensors_get(ref, refs), 2e-2, 1, 0.9999);
        }
    }

    mlc_module_load(net, weights, NULL);                /* the running statistics as saved */
    mlc_module_train(net, 0);
    int folded = mobilenet_fold_batch_norm(net);
    snprintf(what, sizeof what, "eval output, %d BatchNorms folded into their convs", folded);
    was = mlc_set_grad_enabled(ctx, 0);
    compare(what, mlc_forward(net, x), mlc_safetensors_get(ref, "out_fused"), 1e-4, 0, 0.99999);
    compare("folded output against torchvision's unfused", mlc_forward(net, x),
            mlc_safetensors_get(ref, "out"),
            1e-4, 0, 0.99999);
    mlc_set_grad_enabled(ctx, was);
    if (mlc_error(ctx)) { printf("FAIL error: %s\n", mlc_error_message(ctx)); failed++; }
    mlc_safetensors_close(ref);
    printf("mobilenet check: %d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Timed inference on a random batch */
static int run(mlc_ctx *ctx, const options *o) {
    mlc_module *net = mobilenet_create(ctx, (mobilenet_opts){ .width = o->width });
    if (!net || (o->weights && mlc_module_load(net, o->weights, NULL) != MLC_OK)) {
        fprintf(stderr, "error: %s\n", mlc_error_message(ctx));
        return 1;
    }
    mlc_module_train(net, 0);
    int folded = o->fuse ? mobilenet_fold_batch_norm(net) : 0;
    mlc_tensor *x = mlc_keep(mlc_randn(ctx, MLC_SHAPE(o->batch, 3, o->size, o->size))), *out = NULL;
    double *times = malloc(sizeof(double) * (size_t)o->runs), first = 0;
    mlc_set_grad_enabled(ctx, 0);
    printf("MobileNetV2 width %g at %dx%d, %zu parameters, %s weights, %d BatchNorms folded, batch %d "
           "on %s\n", o->width, o->size, o->size, mlc_module_param_count(net),
           o->weights ? o->weights : "random", folded,
           o->batch, mlc_device_name(ctx));
    for (int r = -1; times && r < o->runs && !mlc_error(ctx); r++) {
        mlc_frame f = mlc_frame_begin(ctx);
        double t0 = seconds();
        out = mlc_forward(net, x);
        mlc_sync(ctx);
        if (r < 0) first = seconds() - t0;
        else times[r] = seconds() - t0;
        if (r == o->runs - 1 && out) {              /* the first image's top 3 */
            const float *logits = mlc_host_data(out);
            int best[3] = { -1, -1, -1 };
            for (int k = 0; k < 3; k++)
                for (int c = 0; c < out->shape[1]; c++) {
                    int taken = 0;
                    for (int j = 0; j < k; j++) taken |= best[j] == c;
                    if (!taken && (best[k] < 0 || logits[c] > logits[best[k]])) best[k] = c;
                }
            printf("image 0: top classes %d (%.3f), %d (%.3f), %d (%.3f)\n", best[0], logits[best[0]],
                   best[1],
                   logits[best[1]], best[2], logits[best[2]]);
        }
        mlc_frame_end(f);
    }
    if (mlc_error(ctx) || !times) {
        fprintf(stderr, "error: %s\n", times ? mlc_error_message(ctx) : "out of memory");
        free(times);
        return 1;
    }
    qsort(times, (size_t)o->runs, sizeof(double), compare_doubles);
    printf("first run %.1f ms; median of %d runs %.1f ms per batch, %.2f ms per image (%.1f images/s)\n",
           first * 1e3, o->runs, times[o->runs / 2] * 1e3, times[o->runs / 2] * 1e3 / o->batch,
           o->batch / times[o->runs / 2]);
    free(times);
    return 0;
}

int main(int argc, char **argv) {
    options o;
    int parsed = parse_options(argc, argv, &o);
    if (parsed != RUN) {                              /* --help: exit 0; a bad command line: 2 */
        usage(parsed == HELP ? stdout : stderr, argv[0]);
        return parsed == HELP ? 0 : 2;
    }
    char why[256] = "";
    mlc_ctx *ctx = mlc_create(&(mlc_config){ .seed = o.seed, .device = o.device, .threads = o.threads,
                                             .error = why, .error_bytes = sizeof why });
    if (!ctx) { fprintf(stderr, "error: %s\n", why); return 1; }
    int status = o.check ? check(ctx, &o) : run(ctx, &o);
    mlc_destroy(ctx);
    return status;
}
