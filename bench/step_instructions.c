/* Instructions per training step, for before/after comparisons of mlc.h that timing on a busy
   machine cannot settle: K steps of a tiny MLP (10-100 tanh-1, MSE; model 0) or the Fashion-MNIST
   MLP (784-256-128-10, cross entropy; model 1), batch 64, Adam, on the CPU. Run under
   valgrind --tool=cachegrind --cache-sim=no with K = 10 and K = 110 and divide the difference of
   the "I refs" by 100 (that removes set-up). Build: cc -O2 -std=c99 -I. bench/step_instructions.c -lm
   (with -I pointing at the mlc.h to measure). */
#define MLC_IMPLEMENTATION
#include "mlc.h"
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) {
    int which = argc > 1 ? atoi(argv[1]) : 0, steps = argc > 2 ? atoi(argv[2]) : 100, s;
    mlc_ctx *ctx = mlc_create(&(mlc_config){ .seed = 1, .device = "cpu" });
    mlc_module *l1 = which ? mlc_nn_linear(ctx, 784, 256) : mlc_nn_linear(ctx, 10, 100);
    mlc_module *a1 = which ? mlc_nn_relu(ctx) : mlc_nn_tanh(ctx);
    mlc_module *l2 = which ? mlc_nn_linear(ctx, 256, 128) : mlc_nn_linear(ctx, 100, 1);
    mlc_module *a2 = mlc_nn_relu(ctx);
    mlc_module *l3 = mlc_nn_linear(ctx, 128, 10);
    mlc_module *net = which ? mlc_nn_sequential(ctx, l1, a1, l2, a2, l3, NULL) : mlc_nn_sequential(ctx, l1, a1, l2, NULL);
    mlc_optim *opt = mlc_adam(ctx, net, (mlc_adam_opts){ .lr = 1e-3f });
    int batch = which ? 64 : 64;
    mlc_tensor *x = mlc_keep(mlc_randn(ctx, MLC_SHAPE(batch, which ? 784 : 10)));
    mlc_tensor *y = which ? mlc_keep(mlc_full(ctx, MLC_SHAPE(batch), 3.0f)) : mlc_keep(mlc_randn(ctx, MLC_SHAPE(batch, 1)));
    float last = 0;
    for (s = 0; s < steps; s++) {
        mlc_frame f = mlc_frame_begin(ctx);
        mlc_tensor *out = mlc_forward(net, x);
        mlc_tensor *loss = which ? mlc_cross_entropy(out, y, MLC_REDUCE_MEAN, MLC_NO_IGNORE) : mlc_mse_loss(out, y, MLC_REDUCE_MEAN);
        mlc_zero_grad(opt); mlc_backward(loss); mlc_step(opt);
        last = mlc_item(loss);
        mlc_frame_end(f);
    }
    printf("loss %.6f %s\n", last, mlc_error(ctx) ? mlc_error_message(ctx) : "");
    mlc_destroy(ctx);
    return 0;
}
