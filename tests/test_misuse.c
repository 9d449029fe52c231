/* Misuse: the mistakes a new user or a hostile caller makes beyond bad shapes, each an error
   value (code + a message naming the op), never a crash, a leak or a silently wrong answer.
   One test per mistake class, and allocation failure at every point of a whole session
   (create, build, three training steps with clipping, an eval pass, destroy), on the host
   allocator and, on the fake device, on device buffers. */
#include <float.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include "test.h"

/* op_result must be NULL (or 0), the context must hold `code`, the message contain each string. */
#define CHECK_FAILS(ctx, op_result, code, ...) do { \
    const void *r_ = (const void *)(op_result); \
    const char *const want_[] = { __VA_ARGS__ }; \
    const char *msg_; size_t w_; \
    CHECK_MSG(r_ == NULL, "%s returned non-NULL, expected NULL", #op_result); \
    CHECK_ERROR(ctx, code, want_); \
} while (0)
#define CHECK_ERROR(ctx, code, want) do { \
    CHECK_MSG(mlc_error(ctx) == (code), "error %d (%s), expected %d", \
              (int)mlc_error(ctx), mlc_error_message(ctx), (int)(code)); \
    msg_ = mlc_error_message(ctx); \
    for (w_ = 0; w_ < sizeof want / sizeof want[0]; w_++) \
        CHECK_MSG(strstr(msg_, want[w_]) != NULL, "message \"%s\" does not contain \"%s\"", msg_, want[w_]); \
    mlc_clear_error(ctx); \
} while (0)
/* A call that returns no pointer: only the error it leaves. */
#define CHECK_SETS(ctx, call, code, ...) do { \
    const char *const want_[] = { __VA_ARGS__ }; \
    const char *msg_; size_t w_; \
    (void)(call); \
    CHECK_ERROR(ctx, code, want_); \
} while (0)

static mlc_tensor *square_sum(mlc_tensor **in, void *user) { (void)user; return mlc_sum_all(mlc_mul(in[0], in[0])); }

/* ---- NULL contexts and inputs ---- */

static int null_context(void) {
    mlc_ctx *ctx = test_ctx(1);
    mlc_frame f = mlc_frame_begin(NULL);
    mlc_stats s = mlc_get_stats(NULL);
    float c[4] = { 0 };
    const float a[4] = { 1, 2, 3, 4 };
    mlc_tensor *x = mlc_ones(ctx, MLC_SHAPE(2));
    CHECK(f.ctx == NULL && s.allocs == 0);
    mlc_frame_end(f);                                       /* a frame of no context: nothing */
    mlc_seed(NULL, 3);
    CHECK(mlc_rand_u32(NULL) == 0);
    CHECK(mlc_set_grad_enabled(NULL, 0) == 0);
    mlc_gemm(NULL, 0, 0, 2, 2, 1, a, a, 0.0f, c);
    CHECK(c[0] == 0.0f);
    CHECK(mlc_gradcheck(NULL, square_sum, NULL, &x, 1, NULL, NULL) == 0);
    CHECK(mlc_zeros(NULL, MLC_SHAPE(2)) == NULL && mlc_parameter(NULL, MLC_SHAPE(2)) == NULL);
    CHECK(mlc_nn_linear(NULL, 2, 2) == NULL && mlc_nn_sequential(NULL, NULL) == NULL);
    CHECK(mlc_sgd(NULL, NULL, (mlc_sgd_opts){ 0 }) == NULL && mlc_adam(NULL, NULL, (mlc_adam_opts){ 0 }) == NULL);
    CHECK(mlc_error(NULL) == MLC_ERR_NULL && strcmp(mlc_device_name(NULL), "none") == 0);
    mlc_destroy(NULL);
    /* with a context: bad arguments are errors naming the call */
    CHECK_SETS(ctx, mlc_gemm(ctx, 0, 0, 2, 2, 1, NULL, a, 0.0f, c), MLC_ERR_ARG, "mlc_gemm");
    CHECK_SETS(ctx, mlc_gemm(ctx, 0, 0, -1, 2, 1, a, a, 0.0f, c), MLC_ERR_ARG, "mlc_gemm");
    CHECK_SETS(ctx, mlc_gradcheck(ctx, NULL, NULL, &x, 1, NULL, NULL), MLC_ERR_ARG, "mlc_gradcheck", "fn");
    CHECK_SETS(ctx, mlc_gradcheck(ctx, square_sum, NULL, NULL, 1, NULL, NULL), MLC_ERR_ARG, "mlc_gradcheck");
    test_destroy(ctx);
    return 1;
}

/* Calls that used to return NULL without a word now leave an error. */
static int silent_nulls_set_errors(void) {
    mlc_ctx *ctx = test_ctx(1);
    mlc_module *net = mlc_nn_linear(ctx, 2, 2);
    mlc_tensor *x = mlc_ones(ctx, MLC_SHAPE(1, 2)), *none = NULL;
    CHECK(net && x);
    CHECK_FAILS(ctx, mlc_forward(net, NULL), MLC_ERR_NULL, "mlc_forward", "input");
    CHECK_FAILS(ctx, mlc_forward(NULL, x), MLC_ERR_NULL, "mlc_forward", "module");
    CHECK_FAILS(ctx, mlc_concat(ctx, (mlc_tensor *const[]){ x, none }, 2, 0), MLC_ERR_NULL, "mlc_concat", "input 1");
    CHECK_FAILS(ctx, mlc_concat(ctx, &x, 0, 0), MLC_ERR_ARG, "mlc_concat", "no inputs");   /* was NULL, no error */
    CHECK_FAILS(ctx, mlc_concat(ctx, NULL, 2, 0), MLC_ERR_NULL, "mlc_concat", "NULL");
    CHECK(mlc_concat(NULL, &x, 1, 0) == NULL && mlc_error(ctx) == MLC_OK);
    CHECK(mlc_forward(net, x) != NULL && mlc_error(ctx) == MLC_OK);
    test_destroy(ctx);
    return 1;
}

/* ---- sizes that overflow ---- */

static int sizes_overflow(void) {
    mlc_ctx *ctx = test_ctx(1), *huge;
    mlc_tensor *x0;
    mlc_config c;
    int big = 1 << 20, bigger = 1 << 22;
    CHECK_FAILS(ctx, mlc_zeros(ctx, MLC_SHAPE(65536, 65536, 65536, 65536)), MLC_ERR_SHAPE, "mlc_full", "size_t");
    CHECK_FAILS(ctx, mlc_parameter(ctx, MLC_SHAPE(65536, 65536, 65536, 65536, 2)), MLC_ERR_SHAPE, "mlc_parameter");
    /* the element count fits, the byte count does not */
    CHECK_FAILS(ctx, mlc_empty(ctx, MLC_SHAPE(big, big, bigger)), MLC_ERR_SHAPE, "mlc_empty", "[1048576, 1048576, 4194304]");
    /* reshape: a new shape whose product wraps to the old count (0 here), or a -1 with nothing to
       infer it from, used to be accepted */
    x0 = mlc_zeros(ctx, MLC_SHAPE(0));
    CHECK_FAILS(ctx, mlc_reshape(x0, MLC_SHAPE(65536, 65536, 65536, 65536)), MLC_ERR_SHAPE, "mlc_reshape", "[0]");
    CHECK_FAILS(ctx, mlc_reshape(x0, MLC_SHAPE(0, -1)), MLC_ERR_SHAPE, "mlc_reshape", "[0, -1]");
    CHECK(mlc_reshape(x0, MLC_SHAPE(0, 3)) != NULL && mlc_reshape(mlc_ones(ctx, MLC_SHAPE(6)), MLC_SHAPE(-1, 3)) != NULL);
    CHECK(mlc_ones(ctx, MLC_SHAPE(3)) != NULL && mlc_error(ctx) == MLC_OK);
    test_destroy(ctx);
    /* an arena block size near SIZE_MAX: out of memory, not a wrapped size */
    memset(&c, 0, sizeof c);
    c.quiet = 1;
    c.device = "cpu";
    c.arena_block_bytes = (size_t)-1 - 8;
    huge = mlc_create(&c);
    CHECK(huge && mlc_error(huge) == MLC_OK);
    CHECK_FAILS(huge, mlc_ones(huge, MLC_SHAPE(3)), MLC_ERR_MEMORY, "mlc_full", "out of memory");
    mlc_destroy(huge);
    return 1;
}

/* ---- convolution and pooling windows ---- */

static int conv_pool_windows(void) {
    mlc_ctx *ctx = test_ctx(1);
    mlc_tensor *x = mlc_ones(ctx, MLC_SHAPE(1, 1, 4, 4)), *w = mlc_ones(ctx, MLC_SHAPE(2, 1, 3, 3));
    mlc_tensor *w0 = mlc_ones(ctx, MLC_SHAPE(2, 1, 0, 3));
    mlc_conv_opts pad = { .stride = 1, .padding = INT_MAX / 2 + 1, .dilation = 1, .groups = 1 },
                  dil = { .stride = 1, .dilation = INT_MAX / 2 + 2, .groups = 1 };
    CHECK(x && w && w0);
    CHECK_FAILS(ctx, mlc_conv2d(x, w, NULL, pad), MLC_ERR_ARG, "mlc_conv2d", "padding");
    CHECK_FAILS(ctx, mlc_conv2d(x, w, NULL, dil), MLC_ERR_ARG, "mlc_conv2d", "dilation");
    CHECK_FAILS(ctx, mlc_conv2d(x, w0, NULL, (mlc_conv_opts){ 0 }), MLC_ERR_SHAPE, "mlc_conv2d", "zero dimension");
    CHECK_FAILS(ctx, mlc_nn_conv2d(ctx, 1, 2, 0, (mlc_conv_opts){ 0 }), MLC_ERR_ARG, "mlc_nn_conv2d", "kernel 0");
    CHECK_FAILS(ctx, mlc_nn_conv2d(ctx, 0, 2, 3, (mlc_conv_opts){ 0 }), MLC_ERR_ARG, "mlc_nn_conv2d");
    CHECK_FAILS(ctx, mlc_max_pool2d(x, 2, 1, INT_MAX - 1), MLC_ERR_ARG, "mlc_max_pool2d", "padding");
    CHECK_FAILS(ctx, mlc_avg_pool2d(x, 0, 1, 0), MLC_ERR_ARG, "mlc_avg_pool2d");
    CHECK_FAILS(ctx, mlc_nn_max_pool2d(ctx, 0, 0), MLC_ERR_ARG, "mlc_nn_max_pool2d");
    CHECK(mlc_conv2d(x, w, NULL, (mlc_conv_opts){ 0 }) != NULL && mlc_error(ctx) == MLC_OK);
    test_destroy(ctx);
    return 1;
}

/* ---- frames ---- */

static int tensor_from_ended_frame(void) {
    mlc_ctx *ctx = test_ctx(1);
    mlc_tensor *keep = mlc_ones(ctx, MLC_SHAPE(2)), *t, *p = mlc_parameter(ctx, MLC_SHAPE(2)), *loss;
    float out[2];
    mlc_frame f = mlc_frame_begin(ctx);
    t = mlc_full(ctx, MLC_SHAPE(2), 3.0f);
    loss = mlc_sum_all(mlc_mul(p, t));
    CHECK(t && loss && keep);
    mlc_frame_end(f);
    CHECK_FAILS(ctx, mlc_add(keep, t), MLC_ERR_STATE, "mlc_add", "input 1", "ended");
    CHECK_FAILS(ctx, mlc_relu(t), MLC_ERR_STATE, "mlc_relu", "ended");
    CHECK(test_isnan(mlc_item(loss)));
    CHECK_SETS(ctx, 0, MLC_ERR_STATE, "mlc_item", "ended");
    CHECK(mlc_read(t, out, 2) == MLC_ERR_STATE);
    CHECK_SETS(ctx, 0, MLC_ERR_STATE, "mlc_read");
    CHECK(mlc_backward(loss) == MLC_ERR_STATE);
    CHECK_SETS(ctx, 0, MLC_ERR_STATE, "mlc_backward", "ended");
    CHECK(mlc_host_grad(p)[0] == 0.0f);                     /* nothing was followed */
    /* tensors from before the frame and long-lived ones stay good */
    CHECK(mlc_add(keep, p) != NULL && mlc_error(ctx) == MLC_OK);
    test_destroy(ctx);
    return 1;
}

static int frames_end_in_order(void) {
    mlc_ctx *ctx = test_ctx(1);
    mlc_frame outer, inner, again;
    mlc_tensor *a, *b;
    size_t used = mlc_get_stats(ctx).arena_used;
    int i;
    mlc_frame fs[70];
    outer = mlc_frame_begin(ctx);
    a = mlc_ones(ctx, MLC_SHAPE(4));
    inner = mlc_frame_begin(ctx);
    b = mlc_ones(ctx, MLC_SHAPE(4));
    CHECK(a && b);
    CHECK_SETS(ctx, mlc_frame_end(outer), MLC_ERR_STATE, "mlc_frame_end", "inner frame");
    CHECK(mlc_get_stats(ctx).arena_used == used);            /* the inner one ended too */
    CHECK_SETS(ctx, mlc_frame_end(inner), MLC_ERR_STATE, "mlc_frame_end", "ended already");
    CHECK_SETS(ctx, mlc_frame_end(outer), MLC_ERR_STATE, "mlc_frame_end", "ended already");
    CHECK_FAILS(ctx, mlc_neg(b), MLC_ERR_STATE, "mlc_neg", "ended");
    /* a new frame at the same depth: the old tensors are still refused */
    again = mlc_frame_begin(ctx);
    CHECK_FAILS(ctx, mlc_neg(a), MLC_ERR_STATE, "mlc_neg");
    CHECK(mlc_neg(mlc_ones(ctx, MLC_SHAPE(2))) != NULL);
    mlc_frame_end(again);
    CHECK(mlc_error(ctx) == MLC_OK);
    /* too many frames at once */
    for (i = 0; i < 70; i++) fs[i] = mlc_frame_begin(ctx);
    CHECK_SETS(ctx, 0, MLC_ERR_STATE, "mlc_frame_begin", "64");
    for (i = 69; i >= 0; i--) mlc_frame_end(fs[i]);
    CHECK(mlc_error(ctx) == MLC_OK && mlc_get_stats(ctx).arena_used == used);
    test_destroy(ctx);
    return 1;
}

/* ---- the tape ---- */

static int backward_uses_up_the_tape(void) {
    mlc_ctx *ctx = test_ctx(1);
    mlc_tensor *p = mlc_parameter(ctx, MLC_SHAPE(3)), *h, *loss, *y;
    mlc_frame f = mlc_frame_begin(ctx);
    CHECK(p);
    mlc_init_constant(p, 2.0f);
    h = mlc_mul(p, p);
    loss = mlc_sum_all(h);
    CHECK(mlc_backward(loss) == MLC_OK);
    CHECK(mlc_host_grad(p)[0] == 4.0f);
    CHECK(mlc_get_stats(ctx).tape_nodes == 0);               /* freed: PyTorch's default */
    CHECK(mlc_backward(loss) == MLC_ERR_STATE);
    CHECK_SETS(ctx, 0, MLC_ERR_STATE, "mlc_backward", "earlier mlc_backward");
    CHECK(mlc_host_grad(p)[0] == 4.0f);                     /* not doubled */
    /* a new op on a used-up graph runs (a value is a value), but backward through it is refused */
    y = mlc_sum_all(mlc_mul_scalar(h, 2.0f));
    CHECK(y && mlc_item(y) == 24.0f);
    CHECK(mlc_backward(y) == MLC_ERR_STATE);
    CHECK_SETS(ctx, 0, MLC_ERR_STATE, "mlc_backward", "earlier mlc_backward");
    CHECK(mlc_host_grad(p)[0] == 4.0f);
    /* running the forward again works, and accumulates as PyTorch does */
    CHECK(mlc_backward(mlc_sum_all(mlc_mul(p, p))) == MLC_OK && mlc_host_grad(p)[0] == 8.0f);
    /* two independent graphs on one tape: each takes its own backward */
    h = mlc_sum_all(mlc_mul_scalar(p, 3.0f));
    y = mlc_sum_all(mlc_mul_scalar(p, 5.0f));
    CHECK(mlc_backward(y) == MLC_OK && mlc_get_stats(ctx).tape_nodes > 0);   /* h's ops are left */
    CHECK(mlc_backward(h) == MLC_OK && mlc_host_grad(p)[0] == 16.0f);
    CHECK(mlc_get_stats(ctx).tape_nodes == 0);
    mlc_frame_end(f);
    CHECK(mlc_error(ctx) == MLC_OK);
    test_destroy(ctx);
    return 1;
}

/* ---- contexts, modules, optimisers ---- */

static int contexts_not_mixed(void) {
    mlc_ctx *a = test_ctx(1), *b = test_ctx(2);
    mlc_module *na = mlc_nn_linear(a, 2, 2), *nb = mlc_nn_linear(b, 2, 2), *seq = mlc_nn_custom(a, "Seq", NULL, NULL);
    mlc_tensor *pb = mlc_parameter(b, MLC_SHAPE(2)), *xb = mlc_ones(b, MLC_SHAPE(1, 2)), *xa = mlc_ones(a, MLC_SHAPE(1, 2));
    mlc_optim *oa = mlc_sgd(a, na, (mlc_sgd_opts){ 0 });
    CHECK(na && nb && seq && pb && xb && xa && oa);
    CHECK(mlc_module_add_child(seq, "0", nb) == MLC_ERR_ARG);
    CHECK_SETS(a, 0, MLC_ERR_ARG, "mlc_module_add_child", "another context");
    CHECK(mlc_module_add_param(seq, "w", pb) == MLC_ERR_ARG);
    CHECK_SETS(a, 0, MLC_ERR_ARG, "mlc_module_add", "another context");
    CHECK_FAILS(a, mlc_adam(a, nb, (mlc_adam_opts){ 0 }), MLC_ERR_ARG, "mlc_adam", "another context");
    CHECK(mlc_optim_add_param(oa, pb) == MLC_ERR_ARG);
    CHECK_SETS(a, 0, MLC_ERR_ARG, "mlc_optim_add_param", "another context");
    CHECK_FAILS(a, mlc_forward(na, xb), MLC_ERR_ARG, "mlc_forward", "another context");
    CHECK_FAILS(a, mlc_concat(a, (mlc_tensor *const[]){ xa, xb }, 2, 0), MLC_ERR_ARG, "mlc_concat", "another context");
    CHECK_FAILS(a, mlc_concat(a, &xb, 1, 0), MLC_ERR_ARG, "mlc_concat", "another context");
    CHECK(mlc_error(b) == MLC_OK);
    test_destroy(b);                                          /* a holds nothing of b's */
    CHECK(mlc_forward(na, xa) != NULL && mlc_error(a) == MLC_OK);
    mlc_zero_grad(oa);
    mlc_step(oa);
    test_destroy(a);
    return 1;
}

static int module_cycles(void) {
    mlc_ctx *ctx = test_ctx(1);
    mlc_module *a = mlc_nn_custom(ctx, "A", NULL, NULL), *b = mlc_nn_custom(ctx, "B", NULL, NULL);
    mlc_module *c = mlc_nn_linear(ctx, 2, 2);
    CHECK(a && b && c);
    CHECK(mlc_module_add_child(a, "self", a) == MLC_ERR_ARG);
    CHECK_SETS(ctx, 0, MLC_ERR_ARG, "mlc_module_add_child", "cycle");
    CHECK(mlc_module_add_child(a, "b", b) == MLC_OK && mlc_module_add_child(b, "c", c) == MLC_OK);
    CHECK(mlc_module_add_child(c, "a", a) == MLC_ERR_ARG);
    CHECK_SETS(ctx, 0, MLC_ERR_ARG, "mlc_module_add_child", "cycle");
    CHECK(mlc_module_param_count(a) == 6 && mlc_module_parameters(a, NULL, 0) == 2);
    test_destroy(ctx);
    return 1;
}

/* A parameter added twice (by hand, or shared by two modules) is updated once. */
static int parameter_added_twice(void) {
    mlc_ctx *ctx = test_ctx(1);
    mlc_module *lin = mlc_nn_linear_nobias(ctx, 1, 1), *twice = mlc_nn_custom(ctx, "Tied", NULL, NULL);
    mlc_optim *opt;
    mlc_tensor *w;
    CHECK(lin && twice && mlc_module_add_child(twice, "a", lin) == MLC_OK && mlc_module_add_child(twice, "b", lin) == MLC_OK);
    opt = mlc_sgd(ctx, twice, (mlc_sgd_opts){ .lr = 1.0f });
    CHECK(opt);
    w = lin->params[0];
    CHECK(mlc_optim_add_param(opt, w) == MLC_OK);
    mlc_init_constant(w, 5.0f);
    mlc_zero_grad(opt);
    CHECK(mlc_backward(mlc_sum_all(w)) == MLC_OK);           /* dw = 1 */
    mlc_step(opt);
    CHECK_NEAR(mlc_host_data(w)[0], 4.0f, 0);                 /* 5 - 1, not 5 - 3 */
    test_destroy(ctx);
    return 1;
}

/* ---- configuration: explicit zeros and checked hyper-parameters ---- */

/* One Adam-family step on w = 1 with gradient g = 1 (from sum(w)); returns the new w. */
static float one_step(mlc_ctx *ctx, mlc_optim *opt, mlc_tensor *w) {
    mlc_init_constant(w, 1.0f);
    mlc_zero_grad(opt);
    if (mlc_backward(mlc_sum_all(w)) != MLC_OK) return NAN;
    mlc_step(opt);
    (void)ctx;
    return mlc_host_data(w)[0];
}

static int explicit_zeros(void) {
    mlc_ctx *ctx = test_ctx(1);
    mlc_tensor *w = mlc_parameter(ctx, MLC_SHAPE(1)), *x, *rm, *rv, *y;
    mlc_optim *o;
    mlc_module *bn, *ln;
    float v;
    {   /* the smallest float above 0 (not -0.0f, which -fno-signed-zeros may write as +0.0f) */
        uint32_t bits;
        memcpy(&bits, &(float){ MLC_ZERO }, sizeof bits);
        CHECK(w && bits == 1u);
    }
    /* AdamW weight_decay MLC_ZERO: no decay, so the step equals Adam's: 1 - lr */
    o = mlc_adamw(ctx, NULL, (mlc_adam_opts){ .lr = 0.1f, .weight_decay = MLC_ZERO });
    CHECK(o && mlc_optim_add_param(o, w) == MLC_OK);
    CHECK_NEAR(one_step(ctx, o, w), 0.9f, 1e-6);
    o = mlc_adamw(ctx, NULL, (mlc_adam_opts){ .lr = 0.1f });  /* 0: the default 0.01 */
    CHECK(o && mlc_optim_add_param(o, w) == MLC_OK);
    CHECK_NEAR(one_step(ctx, o, w), 0.9f - 0.1f * 0.01f, 1e-6);
    /* Adam beta1 MLC_ZERO: m = g, and the first step is still 1 - lr */
    o = mlc_adam(ctx, NULL, (mlc_adam_opts){ .lr = 0.1f, .beta1 = MLC_ZERO });
    CHECK(o && mlc_optim_add_param(o, w) == MLC_OK);
    CHECK_NEAR(one_step(ctx, o, w), 0.9f, 1e-6);
    /* RMSprop alpha MLC_ZERO: v = g² = 1, step lr g / (1 + eps) */
    o = mlc_rmsprop(ctx, NULL, (mlc_rmsprop_opts){ .lr = 0.1f, .alpha = MLC_ZERO });
    CHECK(o && mlc_optim_add_param(o, w) == MLC_OK);
    CHECK_NEAR(one_step(ctx, o, w), 0.9f, 1e-6);
    o = mlc_rmsprop(ctx, NULL, (mlc_rmsprop_opts){ .lr = 0.1f });   /* alpha 0.99: v = 0.01, step lr / 0.1 */
    CHECK(o && mlc_optim_add_param(o, w) == MLC_OK);
    CHECK_NEAR(one_step(ctx, o, w), 0.0f, 1e-5);
    /* lr MLC_ZERO: nothing moves */
    o = mlc_sgd(ctx, NULL, (mlc_sgd_opts){ .lr = MLC_ZERO });
    CHECK(o && mlc_optim_add_param(o, w) == MLC_OK && mlc_optim_lr(o) == 0.0f);
    CHECK_NEAR(one_step(ctx, o, w), 1.0f, 0);
    /* batch norm momentum MLC_ZERO: the running statistics stay as they are */
    bn = mlc_nn_batch_norm(ctx, 2);
    CHECK(bn);
    bn->momentum = MLC_ZERO;
    x = mlc_randn(ctx, MLC_SHAPE(4, 2));
    CHECK(mlc_forward(bn, x) != NULL);
    rm = bn->buffers[0]; rv = bn->buffers[1];
    CHECK(mlc_host_data(rm)[0] == 0.0f && mlc_host_data(rv)[1] == 1.0f);
    bn->momentum = 0.0f;                                      /* 0: the default 0.1 */
    CHECK(mlc_forward(bn, x) != NULL && mlc_host_data(rm)[0] != 0.0f);
    /* layer norm eps MLC_ZERO: exactly (x - mean) / std */
    ln = mlc_nn_layer_norm(ctx, 2);
    CHECK(ln);
    ln->eps = MLC_ZERO;
    y = mlc_forward(ln, mlc_from_data(ctx, MLC_SHAPE(1, 2), (const float[]){ 1.0f, 3.0f }));
    CHECK(y);
    v = mlc_host_data(y)[1];
    CHECK_NEAR(v, 1.0f, 1e-6);                                /* eps 1e-5 would give 0.999995 */
    CHECK(mlc_error(ctx) == MLC_OK);
    test_destroy(ctx);
    return 1;
}

static int hyperparameters_checked(void) {
    mlc_ctx *ctx = test_ctx(1);
    mlc_optim *o = mlc_sgd(ctx, NULL, (mlc_sgd_opts){ 0 });
    mlc_tensor *x = mlc_ones(ctx, MLC_SHAPE(2, 3)), *p = mlc_parameter(ctx, MLC_SHAPE(2));
    float inf = HUGE_VALF;
    CHECK(o && x && p && mlc_optim_add_param(o, p) == MLC_OK);
    CHECK_FAILS(ctx, mlc_adam(ctx, NULL, (mlc_adam_opts){ .lr = NAN }), MLC_ERR_ARG, "mlc_adam", "lr");
    CHECK_FAILS(ctx, mlc_sgd(ctx, NULL, (mlc_sgd_opts){ .lr = -0.1f }), MLC_ERR_ARG, "mlc_sgd", "lr = -0.1");
    CHECK_FAILS(ctx, mlc_adam(ctx, NULL, (mlc_adam_opts){ .beta1 = 1.0f }), MLC_ERR_ARG, "mlc_adam", "beta1 = 1");
    CHECK_FAILS(ctx, mlc_adamw(ctx, NULL, (mlc_adam_opts){ .beta2 = 1.5f }), MLC_ERR_ARG, "mlc_adamw", "beta2");
    CHECK_FAILS(ctx, mlc_adam(ctx, NULL, (mlc_adam_opts){ .eps = -1e-8f }), MLC_ERR_ARG, "mlc_adam", "eps");
    CHECK_FAILS(ctx, mlc_adam(ctx, NULL, (mlc_adam_opts){ .weight_decay = inf }), MLC_ERR_ARG, "weight_decay");
    CHECK_FAILS(ctx, mlc_rmsprop(ctx, NULL, (mlc_rmsprop_opts){ .alpha = 2.0f }), MLC_ERR_ARG, "mlc_rmsprop", "alpha");
    CHECK_FAILS(ctx, mlc_rmsprop(ctx, NULL, (mlc_rmsprop_opts){ .momentum = -1.0f }), MLC_ERR_ARG, "momentum");
    CHECK_FAILS(ctx, mlc_sgd(ctx, NULL, (mlc_sgd_opts){ .nesterov = 1 }), MLC_ERR_ARG, "mlc_sgd", "nesterov");
    CHECK_SETS(ctx, mlc_optim_set_lr(o, NAN), MLC_ERR_ARG, "mlc_optim_set_lr", "lr");
    CHECK(test_same_float(mlc_optim_lr(o), 0.01f));
    CHECK_SETS(ctx, mlc_clip_grad_norm(o, -1.0f), MLC_ERR_ARG, "mlc_clip_grad_norm", "max_norm");
    CHECK_FAILS(ctx, mlc_nn_dropout(ctx, 1.5f), MLC_ERR_ARG, "mlc_nn_dropout", "p = 1.5");
    CHECK_FAILS(ctx, mlc_nn_leaky_relu(ctx, NAN), MLC_ERR_ARG, "mlc_nn_leaky_relu", "slope");
    CHECK_FAILS(ctx, mlc_layer_norm(x, NULL, NULL, -1.0f), MLC_ERR_ARG, "mlc_layer_norm", "eps");
    CHECK_FAILS(ctx, mlc_batch_norm(x, NULL, NULL, NULL, NULL, 1, 2.0f, 0.0f), MLC_ERR_ARG, "mlc_batch_norm", "momentum");
    CHECK_FAILS(ctx, mlc_batch_norm(x, NULL, NULL, NULL, NULL, 1, 0.0f, NAN), MLC_ERR_ARG, "mlc_batch_norm", "eps");
    CHECK(mlc_sgd(ctx, NULL, (mlc_sgd_opts){ .lr = 0.5f, .momentum = 0.9f, .nesterov = 1 }) != NULL);
    CHECK(mlc_error(ctx) == MLC_OK);
    test_destroy(ctx);
    return 1;
}

/* ---- allocation failure at every point of a whole session ---- */

typedef struct fault_alloc { long calls, fail_at, live, refused; } fault_alloc;

static void *fault_alloc_fn(size_t bytes, void *user) {
    fault_alloc *a = (fault_alloc *)user;
    void *p;
    if (a->calls++ == a->fail_at) { a->refused++; return NULL; }
    if ((p = malloc(bytes))) a->live++;
    return p;
}
static void fault_free_fn(void *ptr, void *user) {
    if (ptr) ((fault_alloc *)user)->live--;
    free(ptr);
}

/* Build an MLP, train three steps with gradient clipping, run an eval pass; the error at the end
   (MLC_OK when nothing failed). *net_out is the model (NULL when building it failed). */
static mlc_result whole_session(mlc_ctx *ctx, mlc_module **net_out) {
    mlc_module *net = mlc_nn_sequential(ctx, mlc_nn_linear(ctx, 4, 8), mlc_nn_relu(ctx), mlc_nn_dropout(ctx, 0.25f),
                                        mlc_nn_linear(ctx, 8, 3), NULL);
    mlc_optim *opt = mlc_adamw(ctx, net, (mlc_adam_opts){ .lr = 1e-2f });
    int step, grad_was;
    mlc_frame f;
    for (step = 0; step < 3; step++) {
        mlc_tensor *x, *y, *loss;
        f = mlc_frame_begin(ctx);
        x = mlc_randn(ctx, MLC_SHAPE(6, 4));
        y = mlc_from_data(ctx, MLC_SHAPE(6), (const float[]){ 0, 1, 2, 0, 1, 2 });
        loss = mlc_cross_entropy(mlc_forward(net, x), y, MLC_REDUCE_MEAN, MLC_NO_IGNORE);
        mlc_zero_grad(opt);
        mlc_backward(loss);
        mlc_clip_grad_norm(opt, 0.5f);
        mlc_step(opt);
        (void)mlc_item(loss);
        mlc_frame_end(f);
    }
    mlc_module_train(net, 0);
    grad_was = mlc_set_grad_enabled(ctx, 0);
    f = mlc_frame_begin(ctx);
    (void)mlc_argmax(mlc_forward(net, mlc_randn(ctx, MLC_SHAPE(5, 4))), 1);
    mlc_frame_end(f);
    mlc_set_grad_enabled(ctx, grad_was);
    *net_out = net;
    return mlc_error(ctx);
}

static mlc_ctx *fault_ctx(fault_alloc *a) {
    mlc_config c;
    memset(&c, 0, sizeof c);
    c.seed = 5;
    c.quiet = 1;
    c.arena_block_bytes = 128;                /* small blocks: the arena grows at many points */
    c.allocator.alloc = fault_alloc_fn;
    c.allocator.free = fault_free_fn;
    c.allocator.user = a;
    return test_adopt(mlc_create(&c));
}

/* After a failure the context is usable once the error is cleared: a forward pass works. */
static int still_usable(mlc_ctx *ctx, mlc_module *net) {
    mlc_frame f;
    mlc_tensor *y;
    int ok;
    mlc_clear_error(ctx);
    f = mlc_frame_begin(ctx);
    y = net ? mlc_forward(net, mlc_ones(ctx, MLC_SHAPE(2, 4))) : mlc_sum_all(mlc_ones(ctx, MLC_SHAPE(2, 4)));
    ok = y != NULL && mlc_error(ctx) == MLC_OK && test_isfinite(mlc_host_data(y)[0]);
    mlc_frame_end(f);
    return ok;
}

static int allocation_failure_whole_session(void) {
    fault_alloc ref = { 0, -1, 0, 0 };
    mlc_ctx *ctx = fault_ctx(&ref);
    mlc_module *net = NULL;
    long total, k, at_create = ref.calls;   /* mlc_create's own: the context, a device's state */
    CHECK(ctx && whole_session(ctx, &net) == MLC_OK);
    test_destroy(ctx);
    total = ref.calls;
    CHECK_MSG(total > 40 && ref.live == 0, "%ld allocations, %ld live", total, ref.live);
    for (k = 0; k <= total; k++) {
        fault_alloc a = { 0, 0, 0, 0 };
        mlc_result r;
        a.fail_at = k;
        ctx = fault_ctx(&a);
        if (!ctx) CHECK_MSG(k < at_create, "mlc_create failed with allocation %ld refused", k);
        else {
            net = NULL;
            r = whole_session(ctx, &net);
            if (k < total) {
                CHECK_MSG(r == MLC_ERR_MEMORY && strstr(mlc_error_message(ctx), "out of memory"),
                          "allocation %ld of %ld refused: error %d (%s)", k, total, (int)r, mlc_error_message(ctx));
                CHECK_MSG(still_usable(ctx, net), "allocation %ld refused: the context is not usable after: %s",
                          k, mlc_error_message(ctx));
            } else CHECK_MSG(r == MLC_OK, "nothing refused, yet: %s", mlc_error_message(ctx));
            test_destroy(ctx);
        }
        CHECK_MSG(k >= total || a.refused == 1, "allocation %ld was never asked for", k);
        CHECK_MSG(a.live == 0, "allocation %ld refused: %ld blocks leaked", k, a.live);
    }
    if (getenv("MLC_TEST_FIGURES")) printf("allocation failure points: %ld\n", total + 1);
    return 1;
}

/* A context on the fake device (real 0) or on $MLC_DEVICE (real 1; NULL when that is the CPU),
   its heap counted by a (see fault_alloc). */
static mlc_ctx *device_ctx(int real, fault_alloc *a) {
    mlc_config c;
    mlc_ctx *ctx;
    memset(&c, 0, sizeof c);
    c.quiet = 1;
    c.device = real ? NULL : "cpu";
    c.allocator.alloc = fault_alloc_fn;
    c.allocator.free = fault_free_fn;
    c.allocator.user = a;
    ctx = mlc_create(&c);
    if (!real) return test_install_fake_device(ctx);
    if (ctx && !mlc_has_device(ctx)) { mlc_destroy(ctx); return NULL; }
    return ctx;
}

/* The same session with device buffer k and every later one refused (mlc.h's fault injection,
   test_device_fail_at), on the fake device, and on the suite's device when it is a real one
   (MLC_DEVICE=opencl: OpenCL's clCreateBuffer). Refusing only buffer k would not do: the books
   free the spares and try again, and the retry would get it. */
static int device_buffer_failure_whole_session(void) {
    int real;
    for (real = 0; real < 2; real++) {
        long total, k;
        mlc_module *net = NULL;
        fault_alloc a = { 0, -1, 0, 0 };
        mlc_ctx *ctx = device_ctx(real, &a);
        if (real && !ctx) break;                              /* the suites run on the CPU */
        CHECK(ctx && test_device_fail_at(ctx, -1) == 0);
        CHECK_MSG(whole_session(ctx, &net) == MLC_OK, "%s", mlc_error_message(ctx));
        total = test_device_fail_at(ctx, -1);
        if (real) test_destroy(ctx); else mlc_destroy(ctx);   /* a real device counts fallbacks */
        CHECK_MSG(total > 4, "only %ld device buffers", total);
        for (k = 0; k <= total; k++) {
            mlc_result r;
            a.live = 0;
            ctx = device_ctx(real, &a);
            CHECK(ctx && test_device_fail_at(ctx, k) == 0);
            net = NULL;
            r = whole_session(ctx, &net);
            if (k < total)
                CHECK_MSG(r == MLC_ERR_MEMORY && strstr(mlc_error_message(ctx), "out of device memory"),
                          "%s: device buffer %ld of %ld refused: error %d (%s)", mlc_device_name(ctx), k, total,
                          (int)r, mlc_error_message(ctx));
            else CHECK_MSG(r == MLC_OK, "nothing refused, yet: %s", mlc_error_message(ctx));
            CHECK_MSG(test_device_fail_at(ctx, -1) == (k < total ? k : total), "%s: buffer %ld refused, yet %ld made",
                      mlc_device_name(ctx), k, test_device_fail_at(ctx, -1));   /* the device has room again */
            CHECK_MSG(still_usable(ctx, net), "%s: device buffer %ld refused: not usable after: %s",
                      mlc_device_name(ctx), k, mlc_error_message(ctx));
            CHECK_MSG(test_device_buffers_lost(ctx) == 0, "%s: device buffer %ld refused: %ld buffers lost",
                      mlc_device_name(ctx), k, test_device_buffers_lost(ctx));
            if (real) test_destroy(ctx); else mlc_destroy(ctx);
            CHECK_MSG(a.live == 0, "device buffer %ld refused: %ld heap blocks leaked", k, a.live);
        }
        if (getenv("MLC_TEST_FIGURES"))
            printf("device buffer failure points on %s: %ld\n", real ? "the suite's device" : "the fake device", total + 1);
    }
    return 1;
}

const test_case tests_misuse[] = {
    TEST(null_context)
    TEST(silent_nulls_set_errors)
    TEST(sizes_overflow)
    TEST(conv_pool_windows)
    TEST(tensor_from_ended_frame)
    TEST(frames_end_in_order)
    TEST(backward_uses_up_the_tape)
    TEST(contexts_not_mixed)
    TEST(module_cycles)
    TEST(parameter_added_twice)
    TEST(explicit_zeros)
    TEST(hyperparameters_checked)
    TEST(allocation_failure_whole_session)
    TEST(device_buffer_failure_whole_session)
    { NULL, NULL }
};
