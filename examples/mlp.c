/* The classic first program of the PyTorch-on-a-Mac guides, in C: an MLP 10 -> 100 (tanh) -> 1
   fitted by Adam to 64 random samples with the mean squared error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define MLC_IMPLEMENTATION
#include "mlc.h"

int main(int argc, char **argv) {
    if (argc > 1) {                      /* no options: --help prints this and exits 0, others 2 */
        int help = !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h");
        if (!help) fprintf(stderr, "unknown argument %s\n", argv[1]);
        fprintf(help ? stdout : stderr, "usage: %s\n"
                "Fits an MLP 10 -> 100 (tanh) -> 1 to 64 random samples: Adam (lr 0.001), mean squared\n"
                "error, 100 epochs, seed 42. Device: $MLC_DEVICE (cpu, opencl, opencl:N, best) when set,\n"
                "else best: the first GPU, else the CPU.\n", argv[0]);
        return help ? 0 : 2;
    }
    /* $MLC_DEVICE when set (cpu, opencl, opencl:N, a piece of a name), else "best": the first
       GPU, else the CPU, silently (PyTorch's "cuda" if torch.cuda.is_available() else "cpu") */
    mlc_config config = { .seed = 42, .device = getenv("MLC_DEVICE") ? NULL : "best" };
    mlc_ctx *ctx = mlc_create(&config);
    if (!ctx) return 1;                  /* a device named in $MLC_DEVICE is not there: mlc printed why */
    printf("Using device: %s\n", mlc_device_name(ctx));

    /* one layer a statement: C leaves the order of a call's arguments open, and each layer
       draws its weights from the context's RNG, so this order makes the same model everywhere */
    mlc_module *hidden = mlc_nn_linear(ctx, 10, 100);
    mlc_module *out = mlc_nn_linear(ctx, 100, 1);
    mlc_module *model = mlc_nn_sequential(ctx, hidden, mlc_nn_tanh(ctx), out, NULL);
    mlc_optim *opt = mlc_adam(ctx, model, (mlc_adam_opts){ .lr = 1e-3f });
    mlc_tensor *x = mlc_randn(ctx, MLC_SHAPE(64, 10));     /* lives until mlc_destroy */
    mlc_tensor *y = mlc_randn(ctx, MLC_SHAPE(64, 1));

    for (int epoch = 0; epoch < 100; epoch++) {
        mlc_frame frame = mlc_frame_begin(ctx);              /* this step's temporaries */
        mlc_tensor *loss = mlc_mse_loss(mlc_forward(model, x), y, MLC_REDUCE_MEAN);
        mlc_zero_grad(opt);
        mlc_backward(loss);
        mlc_step(opt);
        if (epoch % 10 == 0) printf("Epoch %d, Loss: %.4f\n", epoch, mlc_item(loss));
        mlc_frame_end(frame);
    }
    int status = mlc_error(ctx) != MLC_OK;
    if (status) fprintf(stderr, "error: %s\n", mlc_error_message(ctx));
    mlc_destroy(ctx);
    return status;
}
