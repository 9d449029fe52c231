/* fashion_models.h - the two Fashion-MNIST models of examples/fashion_mnist.c and its
   data-parallel twin examples/fashion_mnist_mpi.c (one definition, so both train the same
   networks from the same seed):
     mlp   784-256-128-10, BatchNorm and ReLU after each hidden Linear
     cnn   conv 3x3 16, BatchNorm, ReLU, max pool 2 - conv 3x3 32, BatchNorm, ReLU, max pool 2 -
           Linear 1568-128, ReLU - Linear 128-10
   Each takes [N, 28, 28] images. Include after mlc.h. */
#ifndef FASHION_MODELS_H
#define FASHION_MODELS_H

/* [N, 28, 28] images to [N, 1, 28, 28] for the convolutions. */
static mlc_tensor *to_image(mlc_module *m, mlc_tensor *x) {
    (void)m;
    return mlc_reshape(x, MLC_SHAPE(-1, 1, 28, 28));
}

/* Each layer made in its own statement: arguments' evaluation order is unspecified in C, and
   the layers' initial weights come from the context's RNG in the order they are made. */
static mlc_module *make_mlp(mlc_ctx *ctx) {
    mlc_module *flatten = mlc_nn_flatten(ctx);
    mlc_module *fc1 = mlc_nn_linear(ctx, 784, 256);
    mlc_module *bn1 = mlc_nn_batch_norm(ctx, 256);
    mlc_module *relu1 = mlc_nn_relu(ctx);
    mlc_module *fc2 = mlc_nn_linear(ctx, 256, 128);
    mlc_module *bn2 = mlc_nn_batch_norm(ctx, 128);
    mlc_module *relu2 = mlc_nn_relu(ctx);
    mlc_module *fc3 = mlc_nn_linear(ctx, 128, 10);
    return mlc_nn_sequential(ctx, flatten, fc1, bn1, relu1, fc2, bn2, relu2, fc3, NULL);
}

static mlc_module *make_cnn(mlc_ctx *ctx) {
    mlc_module *image = mlc_nn_custom(ctx, "Reshape", to_image, NULL);
    mlc_module *conv1 = mlc_nn_conv2d(ctx, 1, 16, 3, (mlc_conv_opts){ .padding = 1 });
    mlc_module *bn1 = mlc_nn_batch_norm(ctx, 16);
    mlc_module *relu1 = mlc_nn_relu(ctx);
    mlc_module *pool1 = mlc_nn_max_pool2d(ctx, 2, 2);
    mlc_module *conv2 = mlc_nn_conv2d(ctx, 16, 32, 3, (mlc_conv_opts){ .padding = 1 });
    mlc_module *bn2 = mlc_nn_batch_norm(ctx, 32);
    mlc_module *relu2 = mlc_nn_relu(ctx);
    mlc_module *pool2 = mlc_nn_max_pool2d(ctx, 2, 2);
    mlc_module *flatten = mlc_nn_flatten(ctx);
    mlc_module *fc1 = mlc_nn_linear(ctx, 32 * 7 * 7, 128);
    mlc_module *relu3 = mlc_nn_relu(ctx);
    mlc_module *fc2 = mlc_nn_linear(ctx, 128, 10);
    return mlc_nn_sequential(ctx, image, conv1, bn1, relu1, pool1, conv2, bn2, relu2, pool2, flatten, fc1,
                             relu3, fc2, NULL);
}

#endif
