/* Convolution fast paths against the general ones: depthwise (groups = channels, its own
   plane-by-plane path on the CPU) against the same convolution as one ordinary convolution per
   channel (groups 1, im2col or the stride-1 path) joined along the channels, forward and
   gradients; pointwise 1x1 convolutions (products without im2col) against matmul; and
   finite-difference gradient checks of both; mlc_conv2d_relu6 against relu6 after the convolution. */
#include "test.h"

/* A leaf of random values in [-1, 1) that requires a gradient */
static mlc_tensor *conv_rand(mlc_ctx *ctx, int ndim, const int *shape) {
    mlc_tensor *u = mlc_add_scalar(mlc_mul_scalar(mlc_rand(ctx, ndim, shape), 2.0f), -1.0f);
    return u ? mlc_requires_grad(mlc_from_data(ctx, ndim, shape, mlc_host_data(u)), 1) : NULL;
}
/* Another leaf with t's values */
static mlc_tensor *conv_twin(mlc_tensor *t) {
    return t ? mlc_requires_grad(mlc_from_data(t->ctx, t->ndim, t->shape, mlc_host_data(t)), 1) : NULL;
}

/* max |a - b| over a's values, or infinity when either is missing */
static double conv_max_diff(mlc_tensor *a, const float *bv, size_t n) {
    const float *av = a ? mlc_host_data(a) : NULL;
    double worst = 0;
    size_t i;
    if (!av || !bv || a->size != n) return INFINITY;
    for (i = 0; i < n; i++) worst = fabs((double)av[i] - bv[i]) > worst ? fabs((double)av[i] - bv[i]) : worst;
    return worst;
}
/* max |gradient of a - gradient of b| */
static double conv_grad_diff(mlc_tensor *a, mlc_tensor *b) {
    const float *ga = mlc_host_grad(a), *gb = mlc_host_grad(b);
    return ga && gb ? conv_max_diff(mlc_from_data(a->ctx, a->ndim, a->shape, ga), gb, b->size) : INFINITY;
}

/* One depthwise case: x [N, C, H, W], kernel K, stride (across: stride_w, 0 for the same),
   padding, dilation; bias or none */
static int depthwise_case_strides(int N, int C, int H, int W, int K, int stride, int stride_w, int padding,
                                  int dilation, int bias) {
    mlc_ctx *ctx = test_ctx(11);
    mlc_conv_opts opts = { stride, padding, dilation, C, stride_w, 0, 0 };
    mlc_conv_opts one = { stride, padding, dilation, 1, stride_w, 0, 0 };
    mlc_tensor *x = conv_rand(ctx, MLC_SHAPE(N, C, H, W)), *w = conv_rand(ctx, MLC_SHAPE(C, 1, K, K));
    mlc_tensor *b = bias ? conv_rand(ctx, MLC_SHAPE(C)) : NULL, *parts[16], *y, *ref, *r;
    mlc_tensor *xr = conv_twin(x), *wr = conv_twin(w), *br = conv_twin(b);
    mlc_tensor *xf = conv_twin(x), *wf = conv_twin(w), *yf;   /* (x through an op: dx written over) */
    int c;
    CHECK(C <= 16 && x && w && xr && wr && xf && wf);
    y = mlc_conv2d(x, w, b, opts);
    yf = mlc_conv2d(mlc_mul_scalar(xf, 1.0f), wf, NULL, opts);
    CHECK_MSG(y != NULL, "conv2d: %s", mlc_error_message(ctx));
    r = mlc_rand(ctx, y->ndim, y->shape);                       /* loss = Σ y r */
    for (c = 0; c < C; c++) {     /* (with a second, zero filter: one channel in and one out
                                     would take the depthwise path too) */
        mlc_tensor *two[2], *wc, *bc;
        two[0] = mlc_slice(wr, 0, c, c + 1); two[1] = mlc_zeros(ctx, MLC_SHAPE(1, 1, K, K));
        wc = mlc_concat(ctx, two, 2, 0);
        two[0] = b ? mlc_slice(br, 0, c, c + 1) : NULL; two[1] = mlc_zeros(ctx, MLC_SHAPE(1));
        bc = b ? mlc_concat(ctx, two, 2, 0) : NULL;
        parts[c] = mlc_slice(mlc_conv2d(mlc_slice(xr, 1, c, c + 1), wc, bc, one), 1, 0, 1);
    }
    ref = mlc_concat(ctx, parts, C, 1);
    CHECK_MSG(ref && mlc_same_shape(ref, y), "reference: %s", mlc_error_message(ctx));
    CHECK(conv_max_diff(y, mlc_host_data(ref), ref->size) <= 1e-5);
    CHECK(mlc_backward(mlc_sum_all(mlc_mul(ref, r))) == MLC_OK);
    CHECK(mlc_backward(mlc_sum_all(mlc_mul(y, r))) == MLC_OK);
    CHECK(mlc_backward(mlc_sum_all(mlc_mul(yf, r))) == MLC_OK);
    CHECK_MSG(conv_grad_diff(x, xr) <= 1e-5, "dx differs by %g", conv_grad_diff(x, xr));
    CHECK_MSG(conv_grad_diff(xf, xr) <= 1e-5, "dx (written over) differs by %g", conv_grad_diff(xf, xr));
    CHECK_MSG(conv_grad_diff(w, wr) <= 1e-4, "dw differs by %g", conv_grad_diff(w, wr));
    CHECK(!b || conv_grad_diff(b, br) <= 1e-4);
    test_destroy(ctx);
    return 1;
}

static int depthwise_case(int N, int C, int H, int W, int K, int stride, int padding, int dilation,
                          int bias) {
    return depthwise_case_strides(N, C, H, W, K, stride, 0, padding, dilation, bias);
}

static int depthwise_matches_per_channel_convs(void) {
    return depthwise_case(2, 5, 9, 11, 3, 1, 1, 1, 1)          /* MobileNet's two */
        && depthwise_case(2, 5, 9, 11, 3, 2, 1, 1, 0)
        && depthwise_case(3, 4, 8, 8, 3, 2, 1, 1, 1)          /* even sizes at stride 2 */
        && depthwise_case(1, 3, 7, 5, 3, 1, 0, 1, 1)          /* no padding */
        && depthwise_case(2, 3, 10, 9, 3, 1, 2, 2, 1)         /* dilation */
        && depthwise_case(2, 6, 12, 13, 5, 2, 2, 1, 1)        /* 5x5 */
        && depthwise_case(1, 16, 40, 37, 3, 1, 1, 1, 1)       /* enough planes for threads */
        && depthwise_case(2, 3, 9, 70, 3, 2, 1, 1, 1)         /* whole blocks of 16 at stride 2 */
        && depthwise_case(1, 3, 6, 69, 3, 2, 1, 1, 0)
        && depthwise_case(1, 2, 5, 67, 3, 2, 0, 1, 1)
        && depthwise_case(4, 5, 6, 6, 3, 1, 1, 1, 1)          /* small planes, backward a row a vector */
        && depthwise_case(3, 4, 3, 3, 3, 1, 1, 1, 0)
        && depthwise_case(2, 3, 7, 16, 3, 1, 1, 1, 1)         /* 16 wide: whole vectors */
        && depthwise_case(2, 3, 8, 10, 3, 1, 2, 2, 1)         /* dilation 2 */
        && depthwise_case(2, 3, 5, 9, 3, 1, 0, 1, 1)          /* no padding: dx wider than dy */
        && depthwise_case(2, 3, 5, 28, 3, 1, 1, 1, 1)         /* small planes, two pieces a row: */
        && depthwise_case(1, 3, 9, 56, 3, 2, 1, 1, 0)         /* 10, four at a time */
        && depthwise_case(2, 3, 17, 40, 3, 2, 2, 2, 1)        /* stride 2 and dilation 2 */
        && depthwise_case(1, 3, 5, 40, 3, 2, 1, 1, 1)         /* 3 output rows: fewer than a strip */
        && depthwise_case(1, 2, 30, 30, 3, 1, 1, 1, 1)        /* 30 rows: the last strip moved up */
        && depthwise_case_strides(2, 3, 12, 20, 3, 2, 1, 1, 1, 1)   /* 2 down, 1 across */
        && depthwise_case_strides(2, 3, 12, 40, 3, 1, 2, 1, 1, 1);  /* 1 down, 2 across */
}

static mlc_tensor *f_depthwise(mlc_tensor **in, void *user) {
    mlc_conv_opts opts = { 2, 1, 1, 3, 0, 0, 0 };
    (void)user;
    return mlc_conv2d(in[0], in[1], in[2], opts);
}
static mlc_tensor *f_pointwise(mlc_tensor **in, void *user) {
    mlc_conv_opts opts = { 1, 0, 1, 2, 0, 0, 0 };                 /* groups 2 */
    (void)user;
    return mlc_conv2d(in[0], in[1], in[2], opts);
}

/* An infinity in x reaches the weight gradients of the taps that read it and no other: x[0, 0, 2, 0]
   is read by kernel columns 0 and 1 only (padding 1), so dW[:, 2] stays finite, at stride 1 and
   2, in planes wider than a vector (the lanes past a row's end read the next row's first floats) */
static int depthwise_infinity_reaches_only_its_taps(void) {
    for (int stride = 1; stride <= 2; stride++) {
        mlc_ctx *ctx = test_ctx(15);
        float xs[6 * 40];
        for (int i = 0; i < 6 * 40; i++) xs[i] = (float)(i % 7) * 0.25f - 0.5f;
        xs[2 * 40] = INFINITY;
        mlc_tensor *x = mlc_from_data(ctx, MLC_SHAPE(1, 1, 6, 40), xs);
        mlc_tensor *w = mlc_requires_grad(mlc_full(ctx, MLC_SHAPE(1, 1, 3, 3), 0.5f), 1);
        mlc_conv_opts opts = { stride, 1, 1, 1, 0, 0, 0 };
        CHECK(x && w);
        CHECK(mlc_backward(mlc_sum_all(mlc_conv2d(x, w, NULL, opts))) == MLC_OK);
        const float *gw = mlc_host_grad(w);
        CHECK(gw != NULL);
        for (int i = 0; i < 3; i++)
            for (int j = 0; j < 3; j++) {     /* tap (i, j) reads x[2, 0] at output (oh, ow) = */
                int oh = (2 + 1 - i) / stride, ow = (0 + 1 - j) / stride,
                    reads = (2 + 1 - i) % stride == 0 && (1 - j) % stride == 0 && oh >= 0 && ow >= 0
                            && 1 - j >= 0;
                CHECK_MSG((!isfinite(gw[i * 3 + j])) == reads, "stride %d: dW[%d, %d] = %g", stride, i, j,
                          gw[i * 3 + j]);
            }
        CHECK(isfinite(gw[2]) && isfinite(gw[5]) && isfinite(gw[8]));
        test_destroy(ctx);
    }
    return 1;
}

static int depthwise_and_pointwise_gradcheck(void) {
    mlc_ctx *ctx = test_ctx(12);
    mlc_gradcheck_opts tol = { 5e-3, 2e-3, 1e-2 };
    mlc_gradcheck_report rep;
    mlc_tensor *dw[3], *pw[3];
    dw[0] = conv_rand(ctx, MLC_SHAPE(2, 3, 6, 7)); dw[1] = conv_rand(ctx, MLC_SHAPE(3, 1, 3, 3));
    dw[2] = conv_rand(ctx, MLC_SHAPE(3));
    pw[0] = conv_rand(ctx, MLC_SHAPE(2, 4, 3, 5)); pw[1] = conv_rand(ctx, MLC_SHAPE(6, 2, 1, 1));
    pw[2] = conv_rand(ctx, MLC_SHAPE(6));
    CHECK_MSG(mlc_gradcheck(ctx, f_depthwise, NULL, dw, 3, &tol, &rep),
              "depthwise: input %d element %zu: %g vs %g", rep.worst_input, rep.worst_index,
              rep.analytic, rep.numeric);
    CHECK_MSG(mlc_gradcheck(ctx, f_pointwise, NULL, pw, 3, &tol, &rep),
              "pointwise: input %d element %zu: %g vs %g", rep.worst_input, rep.worst_index,
              rep.analytic, rep.numeric);
    test_destroy(ctx);
    return 1;
}

/* 1x1 convolution = W [O, C] @ x[n] [C, H·W] + b, for a batch of 1 and of several images; and one
   image large enough that two threads share the rows of its product (each part adds the bias of
   its own channels), or its columns (with more input channels than output ones) */
static int pointwise_matches_matmul(void) {
    static const int cases[4][5] = { { 1, 9, 10, 24, 40 }, { 3, 9, 10, 24, 40 }, { 1, 18, 20, 24, 40 },
                                     { 1, 18, 20, 64, 16 } };   /* N, H, W, C, O */
    mlc_ctx *ctx = test_ctx(13);
    mlc_conv_opts opts = { 0, 0, 0, 0, 0, 0, 0 };
    int k;
    mlc_set_threads(ctx, 2);
    for (k = 0; k < 4; k++) {
        const int N = cases[k][0], P = cases[k][1] * cases[k][2], C = cases[k][3], O = cases[k][4];
        mlc_tensor *x = conv_rand(ctx, MLC_SHAPE(N, C, cases[k][1], cases[k][2]));
        mlc_tensor *w = conv_rand(ctx, MLC_SHAPE(O, C, 1, 1));
        mlc_tensor *b = conv_rand(ctx, MLC_SHAPE(O)), *y = mlc_conv2d(x, w, b, opts), *ref;
        ref = mlc_add(mlc_matmul(mlc_reshape(w, MLC_SHAPE(O, C)), mlc_reshape(x, MLC_SHAPE(N, C, P))),
                      mlc_reshape(b, MLC_SHAPE(O, 1)));
        CHECK_MSG(y && ref, "%s", mlc_error_message(ctx));
        CHECK_MSG(conv_max_diff(y, mlc_host_data(ref), ref->size) <= 1e-5, "case %d: %g", k,
                  conv_max_diff(y, mlc_host_data(ref), ref->size));
    }
    test_destroy(ctx);
    return 1;
}

/* The bias's gradient sums dy over every image and place: for L = Σ y r, db[o] = Σ_{n, p} r[n, o, p];
   8 images of 12 x 13 places, more than a device's work-group holds and no multiple of 256, for a
   plain and a grouped convolution; a second forward and backward doubles the bias's and the
   weight's gradients (on OpenCL the weight's is a product split along its 1,248-long K, added into) */
static int conv_bias_gradient_sums_every_place(void) {
    enum { N = 8, C = 4, O = 6, H = 12, W = 13 };
    mlc_ctx *ctx = test_ctx(15);
    int groups, o, n, p;
    for (groups = 1; groups <= 2; groups++) {
        mlc_tensor *x = conv_rand(ctx, MLC_SHAPE(N, C, H, W));
        mlc_tensor *w = conv_rand(ctx, MLC_SHAPE(O, C / groups, 3, 3));
        mlc_tensor *b = conv_rand(ctx, MLC_SHAPE(O)), *r = conv_rand(ctx, MLC_SHAPE(N, O, H, W));
        mlc_tensor *y = mlc_conv2d(x, w, b, (mlc_conv_opts){ .padding = 1, .groups = groups });
        mlc_tensor *loss = y ? mlc_sum_all(mlc_mul(y, r)) : NULL;
        const float *rv, *db;
        float first_w[O * C * 9];
        CHECK_MSG(loss && mlc_backward(loss) == MLC_OK, "%s", mlc_error_message(ctx));
        CHECK(mlc_host_grad(w) && mlc_host_grad(b));
        memcpy(first_w, mlc_host_grad(w), w->size * sizeof(float));
        y = mlc_conv2d(x, w, b, (mlc_conv_opts){ .padding = 1, .groups = groups });   /* the same again */
        CHECK_MSG(y && mlc_backward(mlc_sum_all(mlc_mul(y, r))) == MLC_OK, "%s", mlc_error_message(ctx));
        for (o = 0; o < (int)w->size; o++)
            CHECK_MSG(fabs(mlc_host_grad(w)[o] - 2.0 * first_w[o]) <= 1e-5 * (1 + fabs(first_w[o])),
                      "groups %d: dW[%d] %.7g after two backwards, %.7g after one", groups, o,
                      (double)mlc_host_grad(w)[o], (double)first_w[o]);
        rv = mlc_host_data(r);
        db = mlc_host_grad(b);
        CHECK(rv && db);
        for (o = 0; o < O; o++) {
            double want = 0;
            for (n = 0; n < N; n++)
                for (p = 0; p < H * W; p++) want += rv[(n * O + o) * H * W + p];
            CHECK_MSG(fabs(db[o] - 2 * want) <= 1e-4 * (1 + fabs(want)),
                      "groups %d: db[%d] = %.7g, 2 Σ r = %.7g", groups, o, (double)db[o], 2 * want);
        }
    }
    test_destroy(ctx);
    return 1;
}

/* mlc_conv2d_relu6 (the activation inside the convolution) against mlc_relu6 of mlc_conv2d, output
   and gradients, on each path: depthwise (stride 1 and 2), pointwise (1 image and 3), the stride-1
   path (3x3, 3 images), im2col (3x3 stride 2); inputs scaled so that outputs cross 0 and 6 */
static int relu6_case(int N, int C, int O, int K, int stride, int groups) {
    mlc_ctx *ctx = test_ctx(14);
    mlc_conv_opts opts = { stride, K / 2, 1, groups, 0, 0, 0 };
    mlc_tensor *x = conv_rand(ctx, MLC_SHAPE(N, C, 11, 37));
    mlc_tensor *w = conv_rand(ctx, MLC_SHAPE(O, C / groups, K, K));
    mlc_tensor *b = conv_rand(ctx, MLC_SHAPE(O)), *xr = conv_twin(x), *wr = conv_twin(w), *br = conv_twin(b);
    mlc_tensor *y, *ref, *r;
    CHECK(x && w && b);
    y = mlc_conv2d_relu6(mlc_mul_scalar(x, 4.0f), w, b, opts);
    ref = mlc_relu6(mlc_conv2d(mlc_mul_scalar(xr, 4.0f), wr, br, opts));
    CHECK_MSG(y && ref, "%s", mlc_error_message(ctx));
    CHECK(conv_max_diff(y, mlc_host_data(ref), ref->size) <= 1e-5);
    r = mlc_rand(ctx, y->ndim, y->shape);
    CHECK(mlc_backward(mlc_sum_all(mlc_mul(y, r))) == MLC_OK);
    CHECK(mlc_backward(mlc_sum_all(mlc_mul(ref, r))) == MLC_OK);
    CHECK_MSG(conv_grad_diff(x, xr) <= 1e-4, "dx differs by %g", conv_grad_diff(x, xr));
    CHECK_MSG(conv_grad_diff(w, wr) <= 1e-4, "dw differs by %g", conv_grad_diff(w, wr));
    CHECK_MSG(conv_grad_diff(b, br) <= 1e-4, "db differs by %g", conv_grad_diff(b, br));
    test_destroy(ctx);
    return 1;
}

static int conv2d_relu6_matches_conv_then_relu6(void) {
    return relu6_case(2, 6, 6, 3, 1, 6) && relu6_case(2, 6, 6, 3, 2, 6)
        && relu6_case(1, 8, 12, 1, 1, 1) && relu6_case(3, 8, 12, 1, 1, 1)
        && relu6_case(3, 4, 5, 3, 1, 1) && relu6_case(2, 4, 5, 3, 2, 1);
}

/* The network's output with gradients off (in inference a long-lived weight keeps its packed
   copy between calls) and on (the tape: packed afresh from the values) into y_off / y_on */
static int packed_forward(mlc_module *net, mlc_tensor *x, float *y_off, float *y_on) {
    mlc_ctx *ctx = net->ctx;
    mlc_tensor *y;
    int was = mlc_set_grad_enabled(ctx, 0);
    y = mlc_forward(net, x);
    if (!y || y->size > 4096) return 0;
    memcpy(y_off, mlc_host_data(y), y->size * sizeof(float));
    mlc_set_grad_enabled(ctx, 1);
    y = mlc_forward(net, x);
    if (!y) return 0;
    memcpy(y_on, mlc_host_data(y), y->size * sizeof(float));
    mlc_set_grad_enabled(ctx, was);
    return (int)y->size;
}

/* A weight's packed copy follows every way its values change: after mlc_write, an optimiser
   step, loading a file, initialising, and a round trip through bf16, the output with gradients
   off (packed copies kept, on the CPU) is the output on the tape bit for bit, and moved from the
   one before. A bf16 model's float32 stand-ins keep none (nothing piles up call after call). */
static int packed_weight_follows_writes(void) {
    mlc_ctx *ctx = test_ctx(15);
    mlc_conv_opts one = { 0, 0, 0, 0, 0, 0, 0 }, strided = { 2, 1, 0, 0, 0, 0, 0 };
    mlc_module *net = mlc_nn_sequential(ctx, mlc_nn_conv2d(ctx, 16, 24, 1, one),
                                        mlc_nn_conv2d(ctx, 24, 20, 3, strided), NULL);
    mlc_tensor *x = mlc_keep(conv_rand(ctx, MLC_SHAPE(2, 16, 8, 8))), *w, *y;
    mlc_optim *opt = mlc_sgd(ctx, net, (mlc_sgd_opts){ 0.5f, 0, 0, 0, 0 });
    static float off[4096], on[4096], before[4096], saved[4096], values[24 * 16];
    static unsigned char file[1 << 16];
    const int cpu = !mlc_has_device(ctx);
    size_t bytes = 0, i, n, step;
    mlc_stats s1 = { 0 }, s2;
    CHECK_MSG(net && x && opt, "%s", mlc_error_message(ctx));
    w = net->children[0]->params[0];
    for (step = 0; step < 6; step++) {
        n = (size_t)packed_forward(net, x, off, on);
        CHECK_MSG(n > 0, "step %zu: %s", step, mlc_error_message(ctx));
        CHECK_MSG(!memcmp(off, on, n * sizeof(float)), "step %zu: kept and fresh packing differ", step);
        CHECK_MSG(step == 0 || memcmp(off, before, n * sizeof(float)), "step %zu: the output did not move",
                  step);
        CHECK(!cpu || w->packed);                                /* kept after a forward in inference */
        memcpy(before, off, n * sizeof(float));
        if (step == 0)                                           /* mlc_write */
            for (i = 0; i < 24 * 16; i++) values[i] = (float)((i * 7) % 13) / 13.0f - 0.5f;
        if (step == 0) CHECK(mlc_write(w, values, 24 * 16) == MLC_OK);
        if (step == 1) {                                         /* an optimiser step */
            mlc_zero_grad(opt);
            CHECK(mlc_backward(mlc_sum_all(mlc_forward(net, x))) == MLC_OK);
            mlc_step(opt);
        }
        if (step == 2) {                                         /* a file saved, then initialising */
            memcpy(saved, off, n * sizeof(float));
            CHECK((bytes = mlc_module_encode(net, NULL, file, sizeof file)) > 0 && bytes <= sizeof file);
            mlc_init_normal(w, 0.0f, 1.0f);
        }
        if (step == 3) CHECK(mlc_module_load_from_memory(net, file, bytes, NULL) == MLC_OK);
        if (step == 4) {                                         /* the file's output again */
            CHECK(!memcmp(off, saved, n * sizeof(float)));
            CHECK(mlc_module_to_dtype(net, MLC_BF16) == MLC_OK);
            mlc_set_grad_enabled(ctx, 0);
            for (i = 0; i < 5; i++) {
                mlc_frame f = mlc_frame_begin(ctx);
                CHECK_MSG((y = mlc_forward(net, x)) != NULL, "bf16: %s", mlc_error_message(ctx));
                mlc_frame_end(f);
                if (i == 1) s1 = mlc_get_stats(ctx);
            }
            s2 = mlc_get_stats(ctx);
            CHECK_MSG(s2.bytes_current == s1.bytes_current, "bf16 inference held %zu more bytes",
                      s2.bytes_current - s1.bytes_current);
            CHECK(!w->packed);
            mlc_set_grad_enabled(ctx, 1);
            CHECK(mlc_module_to_dtype(net, MLC_F32) == MLC_OK);
        }
    }
    test_destroy(ctx);
    return 1;
}

/* One image in inference on 2 threads that share the rows of its product (24 channels in, 40
   out), or its columns (300 in, more than one slice of K, 16 out): each reads its part of the
   weight's kept packed copy (twice: the call that packs it and one that finds it kept), against
   matmul */
static int packed_weight_split_between_threads(void) {
    static const int cases[2][2] = { { 24, 40 }, { 300, 16 } };   /* C, O */
    mlc_ctx *ctx = test_ctx(16);
    mlc_conv_opts opts = { 0, 0, 0, 0, 0, 0, 0 };
    int c, k;
    mlc_set_threads(ctx, 2);
    for (c = 0; c < 2; c++) {
        const int C = cases[c][0], O = cases[c][1];
        mlc_tensor *x = mlc_keep(mlc_detach(conv_rand(ctx, MLC_SHAPE(1, C, 18, 20))));
        mlc_tensor *w = mlc_keep(mlc_detach(conv_rand(ctx, MLC_SHAPE(O, C, 1, 1))));
        mlc_tensor *b = mlc_keep(mlc_detach(conv_rand(ctx, MLC_SHAPE(O)))), *ref;
        int was = mlc_set_grad_enabled(ctx, 0);
        ref = mlc_add(mlc_matmul(mlc_reshape(w, MLC_SHAPE(O, C)), mlc_reshape(x, MLC_SHAPE(1, C, 360))),
                      mlc_reshape(b, MLC_SHAPE(O, 1)));
        CHECK_MSG(x && w && b && ref, "%s", mlc_error_message(ctx));
        for (k = 0; k < 2; k++) {
            mlc_tensor *y = mlc_conv2d(x, w, b, opts);
            CHECK_MSG(y, "%s", mlc_error_message(ctx));
            CHECK_MSG(conv_max_diff(y, mlc_host_data(ref), ref->size) <= 1e-4, "case %d call %d: %g", c, k,
                      conv_max_diff(y, mlc_host_data(ref), ref->size));
            CHECK(mlc_has_device(ctx) || w->packed);
        }
        mlc_set_grad_enabled(ctx, was);
    }
    test_destroy(ctx);
    return 1;
}

const test_case tests_conv[] = {
    TEST(conv2d_relu6_matches_conv_then_relu6)
    TEST(depthwise_matches_per_channel_convs)
    TEST(depthwise_infinity_reaches_only_its_taps)
    TEST(depthwise_and_pointwise_gradcheck)
    TEST(pointwise_matches_matmul)
    TEST(conv_bias_gradient_sums_every_place)
    TEST(packed_weight_follows_writes)
    TEST(packed_weight_split_between_threads)
    { NULL, NULL }
};
