/* Training loops: the allocation counter in a steady loop, determinism, autograd bookkeeping
   (accumulation, no-grad, detach), and learning on real data (the UCI digits in data/). */
#include "test.h"
#include "../examples/digits_data.h"

static mlc_module *small_mlp(mlc_ctx *ctx) {
    return mlc_nn_sequential(ctx, mlc_nn_linear(ctx, 10, 32), mlc_nn_tanh(ctx), mlc_nn_dropout(ctx, 0.2f),
                             mlc_nn_linear(ctx, 32, 1), NULL);
}

/* One frame-scoped step; returns the loss. */
static float mlp_step(mlc_ctx *ctx, mlc_module *net, mlc_optim *opt, mlc_tensor *x, mlc_tensor *y) {
    mlc_frame f = mlc_frame_begin(ctx);
    mlc_tensor *loss = mlc_mse_loss(mlc_forward(net, x), y, MLC_REDUCE_MEAN);
    float value;
    mlc_zero_grad(opt);
    mlc_backward(loss);
    mlc_clip_grad_norm(opt, 1.0f);
    mlc_step(opt);
    value = mlc_item(loss);
    mlc_frame_end(f);
    return value;
}

static int steady_loop_allocates_nothing(void) {
    mlc_ctx *ctx = test_ctx(1);
    mlc_module *net = small_mlp(ctx);
    mlc_optim *opt = mlc_adam(ctx, net, (mlc_adam_opts){ .lr = 1e-2f });
    mlc_tensor *x = mlc_randn(ctx, MLC_SHAPE(64, 10)), *y = mlc_randn(ctx, MLC_SHAPE(64, 1));
    mlc_stats before, after;
    size_t arena_before;
    int i;
    CHECK(opt && x && y);
    arena_before = mlc_get_stats(ctx).arena_used;
    mlp_step(ctx, net, opt, x, y);
    before = mlc_get_stats(ctx);
    for (i = 0; i < 50; i++) mlp_step(ctx, net, opt, x, y);
    after = mlc_get_stats(ctx);
    CHECK(mlc_error(ctx) == MLC_OK);
    CHECK_MSG(after.allocs == before.allocs, "allocations grew from %zu to %zu", before.allocs, after.allocs);
    CHECK(after.bytes_current == before.bytes_current);
    CHECK(after.arena_used == arena_before);      /* every frame released what it took */
    CHECK(after.tape_nodes == 0);
    CHECK(after.arena_peak > 0);
    test_destroy(ctx);
    return 1;
}

static mlc_tensor *to_image(mlc_module *m, mlc_tensor *x) { (void)m; return mlc_reshape(x, MLC_SHAPE(-1, 1, 8, 8)); }

static int steady_cnn_loop_allocates_nothing(void) {
    mlc_ctx *ctx = test_ctx(2);
    mlc_module *net = mlc_nn_sequential(ctx, mlc_nn_custom(ctx, "Reshape", to_image, NULL),
        mlc_nn_conv2d(ctx, 1, 4, 3, (mlc_conv_opts){ .padding = 1 }), mlc_nn_batch_norm(ctx, 4), mlc_nn_relu(ctx),
        mlc_nn_max_pool2d(ctx, 2, 0), mlc_nn_flatten(ctx), mlc_nn_linear(ctx, 64, 10), NULL);
    mlc_optim *opt = mlc_sgd(ctx, net, (mlc_sgd_opts){ .lr = 0.05f, .momentum = 0.9f });
    mlc_tensor *x = mlc_rand(ctx, MLC_SHAPE(16, 64)), *y = mlc_empty(ctx, MLC_SHAPE(16));
    size_t allocs = 0;
    int i, step;
    CHECK(opt && x && y);
    { float v[16]; for (i = 0; i < 16; i++) v[i] = (float)(i % 10); CHECK(mlc_write(y, v, 16) == MLC_OK); }
    for (step = 0; step < 10; step++) {
        mlc_frame f = mlc_frame_begin(ctx);
        mlc_tensor *loss = mlc_cross_entropy(mlc_forward(net, x), y, MLC_REDUCE_MEAN, MLC_NO_IGNORE);
        mlc_zero_grad(opt);
        CHECK(mlc_backward(loss) == MLC_OK);
        mlc_step(opt);
        mlc_frame_end(f);
        if (step == 0) allocs = mlc_get_stats(ctx).allocs;
    }
    CHECK_MSG(mlc_get_stats(ctx).allocs == allocs, "allocations grew from %zu to %zu", allocs, mlc_get_stats(ctx).allocs);
    test_destroy(ctx);
    return 1;
}

static int same_seed_same_losses(void) {
    float losses[2][100];
    int run, i;
    for (run = 0; run < 2; run++) {
        mlc_ctx *ctx = test_ctx(1234);
        mlc_module *net = small_mlp(ctx);
        mlc_optim *opt = mlc_adam(ctx, net, (mlc_adam_opts){ .lr = 1e-2f });
        mlc_tensor *x = mlc_randn(ctx, MLC_SHAPE(32, 10)), *y = mlc_randn(ctx, MLC_SHAPE(32, 1));
        for (i = 0; i < 100; i++) losses[run][i] = mlp_step(ctx, net, opt, x, y);
        CHECK(mlc_error(ctx) == MLC_OK);
        test_destroy(ctx);
    }
    CHECK(memcmp(losses[0], losses[1], sizeof losses[0]) == 0);        /* bit-identical */
    CHECK(losses[0][99] < losses[0][0]);
    {   /* and another seed gives other numbers */
        mlc_ctx *ctx = test_ctx(1235);
        mlc_module *net = small_mlp(ctx);
        mlc_optim *opt = mlc_adam(ctx, net, (mlc_adam_opts){ .lr = 1e-2f });
        mlc_tensor *x = mlc_randn(ctx, MLC_SHAPE(32, 10)), *y = mlc_randn(ctx, MLC_SHAPE(32, 1));
        CHECK(mlp_step(ctx, net, opt, x, y) != losses[0][0]);
        test_destroy(ctx);
    }
    return 1;
}

static int leaf_gradients_accumulate(void) {
    mlc_ctx *ctx = test_ctx(1);
    mlc_tensor *w = mlc_parameter(ctx, MLC_SHAPE(3));
    mlc_tensor *x;
    static const float xs[] = { 1, 2, 3 };
    int i;
    CHECK(w != NULL);
    x = mlc_from_data(ctx, MLC_SHAPE(3), xs);
    for (i = 0; i < 2; i++) {                       /* y = Σ (w·x + w)   dy/dw = x + 1, twice */
        mlc_frame f = mlc_frame_begin(ctx);
        CHECK(mlc_backward(mlc_sum_all(mlc_add(mlc_mul(w, x), w))) == MLC_OK);
        mlc_frame_end(f);
    }
    for (i = 0; i < 3; i++) CHECK_NEAR(mlc_host_grad(w)[i], 2.0 * (xs[i] + 1.0), 1e-6);
    test_destroy(ctx);
    return 1;
}

static int no_grad_and_detach_record_nothing(void) {
    mlc_ctx *ctx = test_ctx(1);
    mlc_tensor *w = mlc_parameter(ctx, MLC_SHAPE(2, 2)), *y;
    int was;
    CHECK(w != NULL);
    was = mlc_set_grad_enabled(ctx, 0);
    CHECK(was == 1);
    y = mlc_tanh(mlc_mul(w, w));
    CHECK(y && !y->requires_grad && mlc_get_stats(ctx).tape_nodes == 0);
    CHECK(mlc_backward(mlc_sum_all(y)) == MLC_ERR_STATE);   /* nothing to differentiate */
    mlc_clear_error(ctx);
    mlc_set_grad_enabled(ctx, 1);
    CHECK(mlc_write(w, (const float[]){ 3, 0, 0, 0 }, 4) == MLC_OK);
    y = mlc_mul(mlc_detach(w), mlc_add_scalar(w, 1.0f));    /* d/dw = detach(w) only */
    CHECK(mlc_backward(mlc_sum_all(y)) == MLC_OK);
    CHECK_NEAR(mlc_host_grad(w)[0], 3.0, 1e-6);                      /* shares storage with w */
    CHECK_NEAR(mlc_host_grad(w)[1], 0.0, 1e-6);
    test_destroy(ctx);
    return 1;
}

/* Real data: the MLP learns the first 1,500 UCI digits in 10 epochs. */
static int mlp_learns_digits(void) {
    digits_set ds;
    char err[256];
    mlc_ctx *ctx;
    mlc_module *net;
    mlc_optim *opt;
    mlc_tensor *x, *y, *pred;
    int i, j, epoch, correct = 0, n = DIGITS_TRAIN_COUNT;
    CHECK_MSG(digits_load("data/digits.bin", &ds, err, sizeof err) == 0, "%s", err);
    ctx = test_ctx(5);
    x = mlc_empty(ctx, MLC_SHAPE(n, 64));
    y = mlc_empty(ctx, MLC_SHAPE(n));
    CHECK(x && y);
    {   /* built on the host, then written (mlc_write tells a device its copy is out of date) */
        static float xv[DIGITS_TRAIN_COUNT * 64], yv[DIGITS_TRAIN_COUNT];
        for (i = 0; i < n; i++) {
            for (j = 0; j < 64; j++) xv[i * 64 + j] = ds.pixels[i * 64 + j] / 16.0f;
            yv[i] = ds.labels[i];
        }
        CHECK(mlc_write(x, xv, x->size) == MLC_OK && mlc_write(y, yv, y->size) == MLC_OK);
    }
    digits_free(&ds);
    net = mlc_nn_sequential(ctx, mlc_nn_linear(ctx, 64, 64), mlc_nn_relu(ctx), mlc_nn_linear(ctx, 64, 10), NULL);
    opt = mlc_adam(ctx, net, (mlc_adam_opts){ .lr = 3e-3f });
    for (epoch = 0; epoch < 10; epoch++)
        for (i = 0; i + 50 <= n; i += 50) {
            mlc_frame f = mlc_frame_begin(ctx);
            mlc_tensor *loss = mlc_cross_entropy(mlc_forward(net, mlc_slice(x, 0, i, i + 50)), mlc_slice(y, 0, i, i + 50),
                                                 MLC_REDUCE_MEAN, MLC_NO_IGNORE);
            mlc_zero_grad(opt);
            mlc_backward(loss);
            mlc_step(opt);
            mlc_frame_end(f);
        }
    pred = mlc_argmax(mlc_forward(net, x), 1);
    CHECK_MSG(pred != NULL, "%s", mlc_error_message(ctx));
    for (i = 0; i < n; i++) correct += mlc_host_data(pred)[i] == mlc_host_data(y)[i];
    CHECK_MSG(correct > 0.95 * n, "training accuracy %d / %d", correct, n);
    test_destroy(ctx);
    return 1;
}

const test_case tests_train[] = {
    TEST(steady_loop_allocates_nothing)
    TEST(steady_cnn_loop_allocates_nothing)
    TEST(same_seed_same_losses)
    TEST(leaf_gradients_accumulate)
    TEST(no_grad_and_detach_record_nothing)
    TEST(mlp_learns_digits)
    { NULL, NULL }
};
