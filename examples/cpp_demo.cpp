// mlc from C++ (C++11 or later): the header compiles as C++, and MLC_SHAPE takes run-time
// sizes there too. A regression fitted with Adam; build: g++ -std=c++11 -I. examples/cpp_demo.cpp
#define MLC_IMPLEMENTATION
#include "mlc.h"
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

int main(int argc, char **argv) {
    const int batch = argc > 1 ? std::atoi(argv[1]) : 32, features = 4;   // run-time shapes
    if (argc > 2 || batch <= 0) {        // --help prints this and exits 0; a bad command line, 2
        bool help = argc == 2 && (!std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h"));
        if (!help) std::fprintf(stderr, "bad argument: the batch size is a positive number\n");
        std::fprintf(help ? stdout : stderr, "usage: %s [BATCH]\n"
                     "Fits a linear regression with Adam (300 steps) from C++; BATCH rows (32).\n", argv[0]);
        return help ? 0 : 2;
    }
    mlc_config config = mlc_config_defaults();
    config.seed = 7;
    mlc_ctx *ctx = mlc_create(&config);
    std::vector<float> xs(batch * features), ys(batch);
    for (int i = 0; i < batch; i++) {                    // y = 1 x0 - 2 x1 + 0.5 x2 + 3 x3 + 1
        for (int j = 0; j < features; j++) xs[i * features + j] = (float)((i * 7 + j * 3) % 11) / 11.0f - 0.5f;
        ys[i] = xs[i * 4] - 2 * xs[i * 4 + 1] + 0.5f * xs[i * 4 + 2] + 3 * xs[i * 4 + 3] + 1;
    }
    mlc_tensor *x = mlc_keep(mlc_from_data(ctx, MLC_SHAPE(batch, features), xs.data()));
    mlc_tensor *y = mlc_keep(mlc_from_data(ctx, MLC_SHAPE(batch, 1), ys.data()));
    mlc_module *net = mlc_nn_linear(ctx, features, 1);
    mlc_adam_opts adam = mlc_adam_defaults();
    adam.lr = 0.05f;
    mlc_optim *opt = mlc_adam(ctx, net, adam);
    float loss_value = 0;
    for (int step = 0; step < 300; step++) {
        mlc_frame f = mlc_frame_begin(ctx);
        mlc_tensor *loss = mlc_mse_loss(mlc_forward(net, x), y, MLC_REDUCE_MEAN);
        mlc_zero_grad(opt);
        mlc_backward(loss);
        mlc_step(opt);
        loss_value = mlc_item(loss);
        mlc_frame_end(f);
    }
    std::printf("C++: batch %d, loss after 300 steps %.6f\n", batch, (double)loss_value);
    int failed = mlc_error(ctx) != MLC_OK || !(loss_value < 1e-3f);
    if (mlc_error(ctx)) std::printf("%s\n", mlc_error_message(ctx));
    mlc_destroy(ctx);
    return failed;
}
