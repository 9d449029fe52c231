/* Training-step times of the bench's Fashion-MNIST MLP or CNN (batch 64, Adam, cross entropy,
   on random images: the speed does not depend on the data), as percentiles over many steps:
   on a VM whose speed drifts within minutes, the fastest steps of two builds run back to back
   compare them better than whole epochs far apart. For before/after comparisons of mlc.h:
     cc -O2 -fopenmp -fno-math-errno -std=c99 -I<dir of the mlc.h to measure> -o step_times \
        bench/step_times.c -lm
     ./step_times MODEL STEPS THREADS     (MODEL 0: MLP 784-256-128-10, 1: the CNN; defaults 1 300 1)
   prints min, p10, p25, median and mean ms per step after 20 steps of warm-up. */
#define _POSIX_C_SOURCE 200809L
#define MLC_IMPLEMENTATION
#include "mlc.h"
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    int model = argc > 1 ? atoi(argv[1]) : 1, steps = argc > 2 ? atoi(argv[2]) : 300;
    int threads = argc > 3 ? atoi(argv[3]) : 1, s;
    mlc_ctx *ctx = mlc_create(&(mlc_config){ .seed = 1, .device = "cpu", .threads = threads, .quiet = 1 });
    mlc_conv_opts pad1 = { .padding = 1 };
    mlc_module *net = model
        ? mlc_nn_sequential(ctx, mlc_nn_conv2d(ctx, 1, 16, 3, pad1), mlc_nn_relu(ctx), mlc_nn_max_pool2d(ctx, 2, 2),
                            mlc_nn_conv2d(ctx, 16, 32, 3, pad1), mlc_nn_relu(ctx), mlc_nn_max_pool2d(ctx, 2, 2),
                            mlc_nn_flatten(ctx), mlc_nn_linear(ctx, 32 * 7 * 7, 128), mlc_nn_relu(ctx),
                            mlc_nn_linear(ctx, 128, 10), NULL)
        : mlc_nn_sequential(ctx, mlc_nn_linear(ctx, 784, 256), mlc_nn_relu(ctx), mlc_nn_linear(ctx, 256, 128),
                            mlc_nn_relu(ctx), mlc_nn_linear(ctx, 128, 10), NULL);
    mlc_optim *opt = mlc_adam(ctx, net, (mlc_adam_opts){ .lr = 1e-3f });
    mlc_tensor *x = mlc_keep(model ? mlc_rand(ctx, MLC_SHAPE(64, 1, 28, 28)) : mlc_rand(ctx, MLC_SHAPE(64, 784)));
    mlc_tensor *y;
    float labels[64];
    double *t, sum = 0;
    if (steps < 1 || threads < 0 || !(t = malloc(sizeof(double) * (size_t)steps))) {
        fprintf(stderr, "usage: %s [MODEL 0|1] [STEPS >= 1] [THREADS]\n", argv[0]);
        return 2;
    }
    for (s = 0; s < 64; s++) labels[s] = (float)(s % 10);
    y = mlc_keep(mlc_from_data(ctx, MLC_SHAPE(64), labels));
    for (s = 0; s < steps + 20; s++) {
        double start = now();
        mlc_frame f = mlc_frame_begin(ctx);
        mlc_tensor *loss = mlc_cross_entropy(mlc_forward(net, x), y, MLC_REDUCE_MEAN, MLC_NO_IGNORE);
        mlc_zero_grad(opt);
        mlc_backward(loss);
        mlc_step(opt);
        mlc_frame_end(f);
        if (s >= 20) sum += t[s - 20] = now() - start;
    }
    if (mlc_error(ctx)) {
        fprintf(stderr, "%s\n", mlc_error_message(ctx));
        return 1;
    }
    qsort(t, (size_t)steps, sizeof *t, by_value);
    printf("%s, %d thread%s: min %.3f p10 %.3f p25 %.3f median %.3f mean %.3f ms a step\n", model ? "CNN" : "MLP",
           mlc_threads(ctx), mlc_threads(ctx) > 1 ? "s" : "", t[0] * 1e3, t[steps / 10] * 1e3, t[steps / 4] * 1e3,
           t[steps / 2] * 1e3, sum / steps * 1e3);
    free(t);
    mlc_destroy(ctx);
    return 0;
}
