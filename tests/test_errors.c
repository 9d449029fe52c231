/* "Errors are values": every failure returns NULL (or an error code), sets the sticky error with
   the right mlc_result, and leaves a message that names the op and the shapes. Also allocation
   failure at every allocation point of a small training step (no crash, no leak), and the
   allocator contract of mlc_create. */
#include <stdlib.h>
#include "test.h"

/* op_result must be NULL, the context must hold `code`, and the message must contain each string. */
#define CHECK_FAILS(ctx, op_result, code, ...) do { \
    const void *r_ = (const void *)(op_result); \
    const char *const want_[] = { __VA_ARGS__ }; \
    const char *msg_; size_t w_; \
    CHECK_MSG(r_ == NULL, "%s returned a tensor, expected NULL", #op_result); \
    CHECK_MSG(mlc_error(ctx) == (code), "%s: error %d (%s), expected %d", #op_result, \
              (int)mlc_error(ctx), mlc_error_message(ctx), (int)(code)); \
    msg_ = mlc_error_message(ctx); \
    for (w_ = 0; w_ < sizeof want_ / sizeof want_[0]; w_++) \
        CHECK_MSG(strstr(msg_, want_[w_]) != NULL, "message \"%s\" does not contain \"%s\"", msg_, want_[w_]); \
    mlc_clear_error(ctx); \
} while (0)

/* ---------- shape mismatches ---------- */

static int shape_mismatch_add(void) {
    mlc_ctx *ctx = test_ctx(1);
    mlc_tensor *a = mlc_ones(ctx, MLC_SHAPE(2, 3)), *b = mlc_ones(ctx, MLC_SHAPE(4)), *c = mlc_ones(ctx, MLC_SHAPE(3, 3));
    CHECK(a && b && c);
    CHECK_FAILS(ctx, mlc_add(a, b), MLC_ERR_SHAPE, "mlc_add", "[2, 3]", "[4]");
    CHECK_FAILS(ctx, mlc_mul(c, a), MLC_ERR_SHAPE, "mlc_mul", "[3, 3]", "[2, 3]");
    CHECK_FAILS(ctx, mlc_where(a, a, b), MLC_ERR_SHAPE, "mlc_where", "[4]");
    CHECK_FAILS(ctx, mlc_mse_loss(a, c, MLC_REDUCE_MEAN), MLC_ERR_SHAPE, "mlc_mse_loss", "[2, 3]", "[3, 3]");
    /* broadcastable shapes still work after the errors were cleared */
    CHECK(mlc_add(a, mlc_ones(ctx, MLC_SHAPE(1, 3))) != NULL);
    CHECK(mlc_error(ctx) == MLC_OK);
    test_destroy(ctx);
    return 1;
}

static int shape_mismatch_matmul(void) {
    mlc_ctx *ctx = test_ctx(1);
    mlc_tensor *a = mlc_ones(ctx, MLC_SHAPE(2, 3)), *b = mlc_ones(ctx, MLC_SHAPE(4, 5));
    mlc_tensor *a3 = mlc_ones(ctx, MLC_SHAPE(2, 2, 3)), *b3 = mlc_ones(ctx, MLC_SHAPE(3, 3, 4));
    CHECK(a && b && a3 && b3);
    CHECK_FAILS(ctx, mlc_matmul(a, b), MLC_ERR_SHAPE, "mlc_matmul", "[2, 3]", "[4, 5]");
    CHECK_FAILS(ctx, mlc_matmul_t(a, b, 0, 1), MLC_ERR_SHAPE, "mlc_matmul", "[2, 3]", "[4, 5]");
    CHECK_FAILS(ctx, mlc_matmul(a3, b3), MLC_ERR_SHAPE, "mlc_matmul", "[2, 2, 3]", "[3, 3, 4]");
    CHECK_FAILS(ctx, mlc_linear(a, b, NULL), MLC_ERR_SHAPE, "mlc_linear", "[2, 3]", "[4, 5]");
    CHECK_FAILS(ctx, mlc_linear(a, mlc_ones(ctx, MLC_SHAPE(4, 3)), mlc_ones(ctx, MLC_SHAPE(5))), MLC_ERR_SHAPE,
                "mlc_linear", "bias", "[5]");
    test_destroy(ctx);
    return 1;
}

static int shape_mismatch_conv2d(void) {
    mlc_ctx *ctx = test_ctx(1);
    mlc_tensor *x3 = mlc_ones(ctx, MLC_SHAPE(1, 3, 5, 5)), *w = mlc_ones(ctx, MLC_SHAPE(4, 2, 3, 3));
    mlc_tensor *x4 = mlc_ones(ctx, MLC_SHAPE(1, 4, 5, 5)), *w6 = mlc_ones(ctx, MLC_SHAPE(6, 2, 3, 3));
    mlc_tensor *bias = mlc_ones(ctx, MLC_SHAPE(5)), *big = mlc_ones(ctx, MLC_SHAPE(4, 3, 7, 7));
    mlc_conv_opts g3 = { .groups = 3 };
    CHECK(x3 && w && x4 && w6 && bias && big);
    /* 3 input channels against a weight made for 2 */
    CHECK_FAILS(ctx, mlc_conv2d(x3, w, NULL, (mlc_conv_opts){ 0 }), MLC_ERR_SHAPE,
                "mlc_conv2d", "[1, 3, 5, 5]", "[4, 2, 3, 3]");
    /* 4 channels do not split into 3 groups */
    CHECK_FAILS(ctx, mlc_conv2d(x4, w6, NULL, g3), MLC_ERR_SHAPE, "mlc_conv2d", "[1, 4, 5, 5]", "groups = 3");
    /* the bias has the wrong length */
    CHECK_FAILS(ctx, mlc_conv2d(x4, w6, bias, (mlc_conv_opts){ .groups = 2 }), MLC_ERR_SHAPE, "mlc_conv2d", "[5]");
    /* a 7x7 kernel on a 5x5 image */
    CHECK_FAILS(ctx, mlc_conv2d(x3, big, NULL, (mlc_conv_opts){ 0 }), MLC_ERR_SHAPE,
                "mlc_conv2d", "[4, 3, 7, 7]", "[1, 3, 5, 5]");
    /* the same x and weight fit with 2 groups */
    CHECK(mlc_conv2d(x4, w6, NULL, (mlc_conv_opts){ .groups = 2 }) != NULL);
    CHECK(mlc_error(ctx) == MLC_OK);
    test_destroy(ctx);
    return 1;
}

static int shape_mismatch_cross_entropy_target(void) {
    mlc_ctx *ctx = test_ctx(1);
    mlc_tensor *logits = mlc_zeros(ctx, MLC_SHAPE(2, 3)), *t3 = mlc_zeros(ctx, MLC_SHAPE(3));
    mlc_tensor *t2x1 = mlc_zeros(ctx, MLC_SHAPE(2, 1)), *l1 = mlc_zeros(ctx, MLC_SHAPE(6));
    CHECK(logits && t3 && t2x1 && l1);
    CHECK_FAILS(ctx, mlc_cross_entropy(logits, t3, MLC_REDUCE_MEAN, MLC_NO_IGNORE), MLC_ERR_SHAPE,
                "mlc_cross_entropy", "[2, 3]", "[3]");
    CHECK_FAILS(ctx, mlc_cross_entropy(logits, t2x1, MLC_REDUCE_MEAN, MLC_NO_IGNORE), MLC_ERR_SHAPE,
                "mlc_cross_entropy", "[2, 3]", "[2, 1]");
    CHECK_FAILS(ctx, mlc_nll_loss(l1, t3, MLC_REDUCE_SUM, MLC_NO_IGNORE), MLC_ERR_SHAPE, "mlc_nll_loss", "[6]", "[3]");
    test_destroy(ctx);
    return 1;
}

static int shape_mismatch_reshape(void) {
    mlc_ctx *ctx = test_ctx(1);
    mlc_tensor *x = mlc_ones(ctx, MLC_SHAPE(2, 3));
    CHECK(x);
    CHECK_FAILS(ctx, mlc_reshape(x, MLC_SHAPE(4, 2)), MLC_ERR_SHAPE, "mlc_reshape", "[2, 3]", "[4, 2]");
    CHECK_FAILS(ctx, mlc_reshape(x, MLC_SHAPE(-1, 4)), MLC_ERR_SHAPE, "mlc_reshape", "[2, 3]", "[-1, 4]");
    CHECK_FAILS(ctx, mlc_reshape(x, MLC_SHAPE(-1, -1)), MLC_ERR_SHAPE, "mlc_reshape", "[2, 3]");
    CHECK_FAILS(ctx, mlc_reshape(x, MLC_SHAPE(3, -2)), MLC_ERR_SHAPE, "mlc_reshape", "[2, 3]");
    CHECK(mlc_reshape(x, MLC_SHAPE(3, -1)) != NULL);
    test_destroy(ctx);
    return 1;
}

static int shape_mismatch_concat(void) {
    mlc_ctx *ctx = test_ctx(1);
    mlc_tensor *xs[3];
    xs[0] = mlc_ones(ctx, MLC_SHAPE(2, 3));
    xs[1] = mlc_ones(ctx, MLC_SHAPE(2, 4));
    xs[2] = mlc_ones(ctx, MLC_SHAPE(2, 3, 1));
    CHECK(xs[0] && xs[1] && xs[2]);
    CHECK_FAILS(ctx, mlc_concat(ctx, xs, 2, 0), MLC_ERR_SHAPE, "mlc_concat", "[2, 3]", "[2, 4]");
    { mlc_tensor *ys[2]; ys[0] = xs[0]; ys[1] = xs[2];
      CHECK_FAILS(ctx, mlc_concat(ctx, ys, 2, 1), MLC_ERR_SHAPE, "mlc_concat", "[2, 3]", "[2, 3, 1]"); }
    CHECK_FAILS(ctx, mlc_concat(ctx, xs, 2, 2), MLC_ERR_INDEX, "mlc_concat", "[2, 3]");
    { mlc_tensor *ok = mlc_concat(ctx, xs, 2, 1); CHECK(ok && ok->shape[0] == 2 && ok->shape[1] == 7); }
    test_destroy(ctx);
    return 1;
}

/* ---------- wrong rank ---------- */

static int wrong_rank(void) {
    mlc_ctx *ctx = test_ctx(1);
    mlc_tensor *x2 = mlc_ones(ctx, MLC_SHAPE(2, 3)), *w = mlc_ones(ctx, MLC_SHAPE(4, 3, 1, 1));
    mlc_tensor *v = mlc_ones(ctx, MLC_SHAPE(3)), *m = mlc_ones(ctx, MLC_SHAPE(3, 2));
    CHECK(x2 && w && v && m);
    CHECK_FAILS(ctx, mlc_conv2d(x2, w, NULL, (mlc_conv_opts){ 0 }), MLC_ERR_SHAPE, "mlc_conv2d", "[2, 3]");
    CHECK_FAILS(ctx, mlc_matmul(v, m), MLC_ERR_SHAPE, "mlc_matmul", "[3]", "[3, 2]");
    CHECK_FAILS(ctx, mlc_matmul(m, v), MLC_ERR_SHAPE, "mlc_matmul", "[3, 2]", "[3]");
    CHECK_FAILS(ctx, mlc_max_pool2d(x2, 2, 0, 0), MLC_ERR_SHAPE, "mlc_max_pool2d", "[2, 3]");
    CHECK_FAILS(ctx, mlc_global_avg_pool2d(v), MLC_ERR_SHAPE, "mlc_global_avg_pool2d", "[3]");
    CHECK_FAILS(ctx, mlc_batch_norm(v, NULL, NULL, NULL, NULL, 1, 0.1f, 1e-5f), MLC_ERR_SHAPE, "mlc_batch_norm", "[3]");
    test_destroy(ctx);
    return 1;
}

/* ---------- out-of-range indices ---------- */

static int cross_entropy_bad_class(void) {
    mlc_ctx *ctx = test_ctx(1);
    mlc_tensor *logits = mlc_zeros(ctx, MLC_SHAPE(2, 3));
    const float bad[][2] = { { 0, 3 }, { -1, 0 }, { 1.5f, 0 }, { 0, 1e9f } };
    size_t k;
    CHECK(logits);
    for (k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        mlc_tensor *t = mlc_from_data(ctx, MLC_SHAPE(2), bad[k]);
        CHECK(t);
        CHECK_FAILS(ctx, mlc_cross_entropy(logits, t, MLC_REDUCE_MEAN, MLC_NO_IGNORE), MLC_ERR_INDEX,
                    "mlc_cross_entropy", "[0, 3)");
        CHECK_FAILS(ctx, mlc_nll_loss(logits, t, MLC_REDUCE_MEAN, MLC_NO_IGNORE), MLC_ERR_INDEX, "mlc_nll_loss");
    }
    /* the message tells which position held the bad class, and its value */
    { const float d[] = { 2, 3 };
      CHECK_FAILS(ctx, mlc_cross_entropy(logits, mlc_from_data(ctx, MLC_SHAPE(2), d), MLC_REDUCE_SUM, MLC_NO_IGNORE),
                  MLC_ERR_INDEX, "index 3", "position 1"); }
    /* a class equal to ignore_index is skipped, not an error */
    { const float d[] = { 2, -100 };
      mlc_tensor *l = mlc_cross_entropy(logits, mlc_from_data(ctx, MLC_SHAPE(2), d), MLC_REDUCE_MEAN, -100);
      CHECK(l != NULL && mlc_error(ctx) == MLC_OK);
      CHECK_NEAR(mlc_item(l), log(3.0), 1e-5); }
    test_destroy(ctx);
    return 1;
}

static int index_ops_out_of_range(void) {
    mlc_ctx *ctx = test_ctx(1);
    mlc_tensor *x = mlc_randn(ctx, MLC_SHAPE(4, 3)), *w = mlc_randn(ctx, MLC_SHAPE(5, 2));
    const float far[] = { 0, 4 }, neg[] = { -1, 0 }, frac[] = { 0.5f, 1 };
    const float g_bad[] = { 0, 1, 2, 3, 0, 1 }, e_bad[] = { 1, 5, 0 };
    mlc_tensor *i_far = mlc_from_data(ctx, MLC_SHAPE(2), far), *i_neg = mlc_from_data(ctx, MLC_SHAPE(2), neg);
    mlc_tensor *i_frac = mlc_from_data(ctx, MLC_SHAPE(2), frac);
    mlc_tensor *g_idx = mlc_from_data(ctx, MLC_SHAPE(2, 3), g_bad), *e_idx = mlc_from_data(ctx, MLC_SHAPE(3), e_bad);
    CHECK(x && w && i_far && i_neg && i_frac && g_idx && e_idx);
    CHECK_FAILS(ctx, mlc_index_select(x, 0, i_far), MLC_ERR_INDEX, "mlc_index_select", "index 4", "[0, 4)");
    CHECK_FAILS(ctx, mlc_index_select(x, 1, i_neg), MLC_ERR_INDEX, "mlc_index_select", "[0, 3)");
    CHECK_FAILS(ctx, mlc_index_select(x, 0, i_frac), MLC_ERR_INDEX, "mlc_index_select", "0.5");
    CHECK_FAILS(ctx, mlc_index_select(x, 2, i_far), MLC_ERR_INDEX, "mlc_index_select", "axis 2", "[4, 3]");
    /* gather along axis 1 (3 columns): value 3 is out of range */
    CHECK_FAILS(ctx, mlc_gather(x, 1, g_idx), MLC_ERR_INDEX, "mlc_gather", "index 3", "[0, 3)");
    CHECK_FAILS(ctx, mlc_gather(x, -3, g_idx), MLC_ERR_INDEX, "mlc_gather", "axis -3");
    /* embedding of 5 rows: index 5 is out of range */
    CHECK_FAILS(ctx, mlc_embedding(w, e_idx), MLC_ERR_INDEX, "mlc_embedding", "index 5", "[0, 5)");
    { const float neg_e[] = { -2 };
      CHECK_FAILS(ctx, mlc_embedding(w, mlc_from_data(ctx, MLC_SHAPE(1), neg_e)), MLC_ERR_INDEX, "mlc_embedding"); }
    /* in-range versions work */
    CHECK(mlc_index_select(x, 0, i_neg) == NULL);   /* -1 stays an error on axis 0 too */
    mlc_clear_error(ctx);
    { const float ok[] = { 3, 0 }; mlc_tensor *r = mlc_index_select(x, 0, mlc_from_data(ctx, MLC_SHAPE(2), ok));
      CHECK(r && r->shape[0] == 2 && mlc_host_data(r)[0] == mlc_host_data(x)[9]); }
    test_destroy(ctx);
    return 1;
}

static int bad_axis(void) {
    mlc_ctx *ctx = test_ctx(1);
    mlc_tensor *x = mlc_ones(ctx, MLC_SHAPE(2, 3));
    CHECK(x);
    CHECK_FAILS(ctx, mlc_sum(x, 2, 0), MLC_ERR_INDEX, "mlc_sum", "axis 2", "[2, 3]");
    CHECK_FAILS(ctx, mlc_sum(x, -3, 1), MLC_ERR_INDEX, "mlc_sum", "axis -3", "[2, 3]");
    CHECK_FAILS(ctx, mlc_mean(x, 7, 0), MLC_ERR_INDEX, "mlc_mean", "[2, 3]");
    CHECK_FAILS(ctx, mlc_max(x, 2, 0), MLC_ERR_INDEX, "mlc_max", "[2, 3]");
    CHECK_FAILS(ctx, mlc_softmax(x, 2), MLC_ERR_INDEX, "mlc_softmax", "axis 2", "[2, 3]");
    CHECK_FAILS(ctx, mlc_log_softmax(x, -3), MLC_ERR_INDEX, "mlc_log_softmax", "[2, 3]");
    CHECK_FAILS(ctx, mlc_slice(x, 5, 0, 1), MLC_ERR_INDEX, "mlc_slice", "axis 5", "[2, 3]");
    CHECK_FAILS(ctx, mlc_transpose(x, 0, 2), MLC_ERR_INDEX, "mlc_transpose", "[2, 3]");
    { const int order[] = { 0, 0 };
      CHECK_FAILS(ctx, mlc_permute(x, order), MLC_ERR_INDEX, "mlc_permute", "[2, 3]"); }
    /* negative axes in range are fine */
    { mlc_tensor *s = mlc_sum(x, -1, 0); CHECK(s && s->ndim == 1 && s->shape[0] == 2 && mlc_host_data(s)[0] == 3.0f); }
    test_destroy(ctx);
    return 1;
}

/* ---------- NULL inputs, chains, stickiness ---------- */

static int null_input(void) {
    mlc_ctx *ctx = test_ctx(1);
    mlc_tensor *x = mlc_ones(ctx, MLC_SHAPE(2, 3));
    CHECK(x);
    CHECK_FAILS(ctx, mlc_add(NULL, x), MLC_ERR_NULL, "mlc_add", "input 0");
    CHECK_FAILS(ctx, mlc_matmul(x, NULL), MLC_ERR_NULL, "mlc_matmul", "input 1");
    CHECK_FAILS(ctx, mlc_from_data(ctx, MLC_SHAPE(2), NULL), MLC_ERR_NULL, "mlc_from_data");
    CHECK_FAILS(ctx, mlc_forward(NULL, x), MLC_ERR_NULL, "mlc_forward", "module");   /* x's context hears of it */
    /* with no tensor at all there is no context to report to: still NULL, no crash */
    CHECK(mlc_relu(NULL) == NULL);
    CHECK(mlc_add(NULL, NULL) == NULL);
    CHECK(mlc_sum(NULL, 0, 0) == NULL);
    CHECK(mlc_backward(NULL) == MLC_ERR_NULL);
    CHECK(test_isnan(mlc_item(NULL)));
    CHECK(mlc_error(ctx) == MLC_OK);
    test_destroy(ctx);
    return 1;
}

static int null_chain_keeps_first_error(void) {
    mlc_ctx *ctx = test_ctx(1);
    mlc_tensor *x = mlc_ones(ctx, MLC_SHAPE(2, 3)), *y;
    CHECK(x);
    y = mlc_relu(mlc_add(NULL, x));
    CHECK(y == NULL);
    CHECK(mlc_error(ctx) == MLC_ERR_NULL);
    CHECK(strstr(mlc_error_message(ctx), "mlc_add") != NULL);
    /* a longer chain with a second, different error on the way: the first one stays */
    mlc_clear_error(ctx);
    y = mlc_sum_all(mlc_softmax(mlc_matmul(x, x), 5));
    CHECK(y == NULL);
    CHECK(mlc_error(ctx) == MLC_ERR_SHAPE);
    CHECK(strstr(mlc_error_message(ctx), "mlc_matmul") != NULL);
    CHECK(strstr(mlc_error_message(ctx), "mlc_softmax") == NULL);
    test_destroy(ctx);
    return 1;
}

static int error_is_sticky(void) {
    mlc_ctx *ctx = test_ctx(1);
    mlc_tensor *x = mlc_ones(ctx, MLC_SHAPE(2, 3)), *bad = mlc_ones(ctx, MLC_SHAPE(5)), *y;
    char first[512];
    CHECK(x && bad);
    CHECK(mlc_add(x, bad) == NULL);
    CHECK(mlc_error(ctx) == MLC_ERR_SHAPE);
    strcpy(first, mlc_error_message(ctx));
    /* valid ops and creators now return NULL and leave the first error untouched */
    CHECK(mlc_add(x, x) == NULL);
    CHECK(mlc_relu(x) == NULL);
    CHECK(mlc_ones(ctx, MLC_SHAPE(2)) == NULL);
    CHECK(mlc_nn_linear(ctx, 2, 2) == NULL);
    CHECK(mlc_sum(x, 9, 0) == NULL);                       /* a second error is not recorded */
    CHECK(test_isnan(mlc_get(x, 100)));                         /* these reach the error path itself */
    { float buf[1]; CHECK(mlc_read(x, buf, 1) == MLC_ERR_SHAPE); }
    CHECK(mlc_module_add_param(mlc_nn_custom(ctx, "M", NULL, NULL), "w", x) != MLC_OK);
    CHECK(mlc_error(ctx) == MLC_ERR_SHAPE);
    CHECK(strcmp(mlc_error_message(ctx), first) == 0);
    mlc_clear_error(ctx);
    CHECK(mlc_error(ctx) == MLC_OK);
    CHECK(strcmp(mlc_error_message(ctx), "no error") == 0);
    y = mlc_add(x, x);
    CHECK(y != NULL && mlc_host_data(y)[0] == 2.0f);
    test_destroy(ctx);
    return 1;
}

static int mixed_contexts(void) {
    mlc_ctx *a = test_ctx(1), *b = test_ctx(2);
    mlc_tensor *x = mlc_ones(a, MLC_SHAPE(2)), *y = mlc_ones(b, MLC_SHAPE(2));
    CHECK(x && y);
    CHECK_FAILS(a, mlc_add(x, y), MLC_ERR_ARG, "mlc_add", "another context");
    CHECK(mlc_error(b) == MLC_OK);
    test_destroy(a);
    test_destroy(b);
    return 1;
}

/* ---------- invalid arguments ---------- */

static int invalid_arguments(void) {
    mlc_ctx *ctx = test_ctx(1);
    mlc_tensor *x = mlc_ones(ctx, MLC_SHAPE(1, 2, 5, 5)), *w = mlc_ones(ctx, MLC_SHAPE(3, 2, 3, 3));
    CHECK(x && w);
    CHECK_FAILS(ctx, mlc_dropout(x, 1.5f, 1), MLC_ERR_ARG, "mlc_dropout", "1.5");
    CHECK_FAILS(ctx, mlc_dropout(x, -0.25f, 0), MLC_ERR_ARG, "mlc_dropout", "-0.25");
    CHECK_FAILS(ctx, mlc_clamp(x, 2.0f, 1.0f), MLC_ERR_ARG, "mlc_clamp", "2", "1");
    CHECK_FAILS(ctx, mlc_conv2d(x, w, NULL, (mlc_conv_opts){ .stride = -1 }), MLC_ERR_ARG, "mlc_conv2d", "stride (-1, 0)");
    CHECK_FAILS(ctx, mlc_conv2d(x, w, NULL, (mlc_conv_opts){ .stride = 1, .padding = -2 }), MLC_ERR_ARG, "mlc_conv2d", "padding (-2, 0)");
    CHECK_FAILS(ctx, mlc_max_pool2d(x, 0, 0, 0), MLC_ERR_ARG, "mlc_max_pool2d", "kernel (0, 0)");
    CHECK_FAILS(ctx, mlc_avg_pool2d(x, 2, 2, 3), MLC_ERR_ARG, "mlc_avg_pool2d", "padding (3, 0)");
    CHECK_FAILS(ctx, mlc_arange(ctx, 0, 1, 0), MLC_ERR_ARG, "mlc_arange");
    CHECK_FAILS(ctx, mlc_mse_loss(x, x, (mlc_reduction)7), MLC_ERR_ARG, "mlc_mse_loss", "reduction 7");
    CHECK_FAILS(ctx, mlc_nn_conv2d(ctx, 3, 6, 3, (mlc_conv_opts){ .groups = 2 }), MLC_ERR_ARG, "mlc_nn_conv2d");
    CHECK_FAILS(ctx, mlc_empty(ctx, MLC_SHAPE(2, -3)), MLC_ERR_SHAPE, "mlc_empty", "-3");
    /* valid edge values are accepted */
    CHECK(mlc_dropout(x, 1.0f, 1) != NULL);
    CHECK(mlc_clamp(x, 1.0f, 1.0f) != NULL);
    CHECK(mlc_conv2d(x, w, NULL, (mlc_conv_opts){ .stride = 2, .padding = 1 }) != NULL);
    CHECK(mlc_error(ctx) == MLC_OK);
    test_destroy(ctx);
    return 1;
}

static int item_of_non_scalar(void) {
    mlc_ctx *ctx = test_ctx(1);
    mlc_tensor *x = mlc_ones(ctx, MLC_SHAPE(2, 3)), *one = mlc_full(ctx, MLC_SHAPE(1, 1), 4.5f);
    float v;
    CHECK(x && one);
    v = mlc_item(x);
    CHECK(test_isnan(v));
    CHECK_FAILS(ctx, (void *)NULL, MLC_ERR_SHAPE, "mlc_item", "[2, 3]", "6 elements");
    CHECK(mlc_item(one) == 4.5f);               /* one element of any rank is fine */
    CHECK(test_isnan(mlc_get(x, 6)));
    CHECK_FAILS(ctx, (void *)NULL, MLC_ERR_INDEX, "mlc_get", "[2, 3]");
    { float buf[5]; CHECK(mlc_read(x, buf, 5) == MLC_ERR_ARG); }
    CHECK_FAILS(ctx, (void *)NULL, MLC_ERR_ARG, "mlc_read", "[2, 3]");
    mlc_tensor_free(x);                          /* a frame tensor cannot be freed alone */
    CHECK_FAILS(ctx, (void *)NULL, MLC_ERR_STATE, "mlc_tensor_free", "[2, 3]");
    test_destroy(ctx);
    return 1;
}

static int backward_errors(void) {
    mlc_ctx *ctx = test_ctx(1);
    mlc_tensor *x = mlc_randn(ctx, MLC_SHAPE(2, 3)), *p = mlc_parameter(ctx, MLC_SHAPE(2, 3)), *y;
    CHECK(x && p);
    /* no input requires a gradient */
    y = mlc_sum_all(mlc_mul(x, x));
    CHECK(y != NULL);
    CHECK(mlc_backward(y) == MLC_ERR_STATE);
    CHECK_FAILS(ctx, (void *)NULL, MLC_ERR_STATE, "mlc_backward", "gradient");
    /* gradients switched off while building the expression */
    mlc_set_grad_enabled(ctx, 0);
    y = mlc_sum_all(mlc_mul(p, x));
    mlc_set_grad_enabled(ctx, 1);
    CHECK(y != NULL && mlc_backward(y) == MLC_ERR_STATE);
    mlc_clear_error(ctx);
    /* not a scalar */
    y = mlc_mul_scalar(p, 2.0f);
    CHECK(y != NULL);
    CHECK(mlc_backward(y) == MLC_ERR_SHAPE);
    CHECK_FAILS(ctx, (void *)NULL, MLC_ERR_SHAPE, "mlc_backward", "[2, 3]");
    /* a gradient of the wrong shape */
    CHECK(mlc_backward_with(y, mlc_ones(ctx, MLC_SHAPE(3, 2))) == MLC_ERR_SHAPE);
    CHECK_FAILS(ctx, (void *)NULL, MLC_ERR_SHAPE, "mlc_backward", "[3, 2]", "[2, 3]");
    /* with an error already set, backward returns it and does nothing */
    y = mlc_sum_all(p);
    CHECK(y != NULL);
    CHECK(mlc_add(p, mlc_ones(ctx, MLC_SHAPE(4))) == NULL);
    CHECK(mlc_backward(y) == MLC_ERR_SHAPE);
    CHECK(mlc_host_grad(p)[0] == 0.0f);
    mlc_clear_error(ctx);
    /* and the right call works */
    CHECK(mlc_backward(mlc_sum_all(mlc_mul_scalar(p, 2.0f))) == MLC_OK);
    CHECK(mlc_host_grad(p)[0] == 2.0f && mlc_host_grad(p)[5] == 2.0f);
    test_destroy(ctx);
    return 1;
}

/* ---------- allocators ---------- */

/* A malloc wrapper that counts live blocks and bytes, and can refuse allocations: the one with
   index fail_at (counting from 0), and with sticky set every one after it as well. */
typedef struct counting_alloc {
    long calls, live, fail_at;
    size_t live_bytes;
    int sticky, refused;
} counting_alloc;

static void *counting_alloc_fn(size_t bytes, void *user) {
    counting_alloc *a = (counting_alloc *)user;
    long call = a->calls++;
    unsigned char *p;
    if (a->fail_at >= 0 && (call == a->fail_at || (a->sticky && call > a->fail_at))) { a->refused++; return NULL; }
    p = (unsigned char *)malloc(bytes + 16);
    if (!p) return NULL;
    memcpy(p, &bytes, sizeof bytes);
    a->live++;
    a->live_bytes += bytes;
    return p + 16;
}

static void counting_free_fn(void *ptr, void *user) {
    counting_alloc *a = (counting_alloc *)user;
    unsigned char *p = (unsigned char *)ptr;
    size_t bytes;
    if (!p) return;
    p -= 16;
    memcpy(&bytes, p, sizeof bytes);
    a->live--;
    a->live_bytes -= bytes;
    free(p);
}

static mlc_ctx *counting_ctx(counting_alloc *a, size_t arena_block_bytes) {
    mlc_config c;
    memset(&c, 0, sizeof c);
    c.seed = 7;
    c.quiet = 1;
    c.arena_block_bytes = arena_block_bytes;
    c.allocator.alloc = counting_alloc_fn;
    c.allocator.free = counting_free_fn;
    c.allocator.user = a;
    return test_adopt(mlc_create(&c));
}

/* Two training steps of a 2-layer MLP with Adam, everything built from scratch; returns the
   context's error (MLC_OK on success). The small arena blocks put arena growth at many points
   of the forward and backward passes. */
static mlc_result small_training_run(mlc_ctx *ctx, float *last_loss) {
    mlc_module *net = mlc_nn_sequential(ctx, mlc_nn_linear(ctx, 4, 8), mlc_nn_relu(ctx), mlc_nn_linear(ctx, 8, 2), NULL);
    mlc_optim *opt = mlc_adam(ctx, net, (mlc_adam_opts){ .lr = 1e-2f });
    int step;
    *last_loss = NAN;
    for (step = 0; step < 2; step++) {
        mlc_frame f = mlc_frame_begin(ctx);
        mlc_tensor *x = mlc_randn(ctx, MLC_SHAPE(5, 4)), *y = mlc_randn(ctx, MLC_SHAPE(5, 2));
        mlc_tensor *loss = mlc_mse_loss(mlc_forward(net, x), y, MLC_REDUCE_MEAN);
        mlc_zero_grad(opt);
        mlc_backward(loss);
        mlc_step(opt);
        *last_loss = mlc_item(loss);
        mlc_frame_end(f);
    }
    return mlc_error(ctx);
}

static int allocation_failure_everywhere(void) {
    counting_alloc ref;
    mlc_ctx *ctx;
    float loss;
    long total, n, at_create;
    int sticky;
    const size_t block = 256;
    /* a run that succeeds: how many allocations does it make (and mlc_create, which returns NULL
       when one of its own is refused: the context, a device's state)? */
    memset(&ref, 0, sizeof ref);
    ref.fail_at = -1;
    ctx = counting_ctx(&ref, block);
    CHECK(ctx != NULL);
    at_create = ref.calls;
    CHECK(small_training_run(ctx, &loss) == MLC_OK);
    CHECK(test_isfinite(loss));
    test_destroy(ctx);
    total = ref.calls;
    CHECK_MSG(total > 20, "only %ld allocations: the run is too small to test much", total);
    CHECK(ref.live == 0 && ref.live_bytes == 0);
    /* now make each of those allocations fail in turn: once only, then from there on */
    for (sticky = 0; sticky < 2; sticky++)
        for (n = 0; n <= total; n++) {
            counting_alloc a;
            mlc_result r;
            memset(&a, 0, sizeof a);
            a.fail_at = n;
            a.sticky = sticky;
            ctx = counting_ctx(&a, block);
            if (!ctx) {
                CHECK_MSG(n < at_create, "mlc_create failed with allocation %ld refused", n);
            } else {
                r = small_training_run(ctx, &loss);
                if (n < total) {
                    CHECK_MSG(r == MLC_ERR_MEMORY, "allocation %ld of %ld refused (sticky %d): error %d (%s)",
                              n, total, sticky, (int)r, mlc_error_message(ctx));
                    CHECK_MSG(strstr(mlc_error_message(ctx), "out of memory") != NULL, "message: %s", mlc_error_message(ctx));
                } else {
                    CHECK_MSG(r == MLC_OK && test_isfinite(loss), "with nothing refused the run failed: %s",
                              mlc_error_message(ctx));
                }
                test_destroy(ctx);
            }
            CHECK_MSG(n >= total || a.refused > 0, "allocation %ld was never asked for", n);
            CHECK_MSG(a.live == 0 && a.live_bytes == 0, "allocation %ld refused (sticky %d): %ld blocks (%zu bytes) leaked",
                      n, sticky, a.live, a.live_bytes);
        }
    return 1;
}

/* A failed allocation inside an op on an existing context: NULL and MLC_ERR_MEMORY, and the
   context still works after mlc_clear_error. */
static int allocation_failure_in_op(void) {
    counting_alloc a;
    mlc_ctx *ctx;
    mlc_tensor *x, *y;
    memset(&a, 0, sizeof a);
    a.fail_at = -1;
    ctx = counting_ctx(&a, 1024);
    CHECK(ctx);
    x = mlc_ones(ctx, MLC_SHAPE(4, 4));
    CHECK(x);
    a.fail_at = a.calls;                         /* the next allocation fails */
    CHECK_FAILS(ctx, mlc_ones(ctx, MLC_SHAPE(1000)), MLC_ERR_MEMORY, "mlc_full", "out of memory");
    CHECK(mlc_parameter(ctx, MLC_SHAPE(3)) != NULL);   /* refused only once */
    CHECK(mlc_error(ctx) == MLC_OK);
    a.fail_at = a.calls;
    CHECK_FAILS(ctx, mlc_nn_linear(ctx, 3, 3), MLC_ERR_MEMORY, "out of memory");
    y = mlc_add(x, x);
    CHECK(y && mlc_host_data(y)[0] == 2.0f);
    test_destroy(ctx);
    CHECK(a.live == 0);
    return 1;
}

static int allocator_contract(void) {
    counting_alloc a;
    mlc_config c;
    memset(&a, 0, sizeof a);
    a.fail_at = -1;
    memset(&c, 0, sizeof c);
    c.quiet = 1;
    c.allocator.alloc = counting_alloc_fn;       /* alloc without free */
    c.allocator.user = &a;
    CHECK(mlc_create(&c) == NULL);
    c.allocator.alloc = NULL;                    /* free without alloc */
    c.allocator.free = counting_free_fn;
    CHECK(mlc_create(&c) == NULL);
    CHECK(a.calls == 0);                         /* refused before allocating anything */
    /* the first allocation (the context itself) refused */
    c.allocator.alloc = counting_alloc_fn;
    a.fail_at = 0;
    CHECK(mlc_create(&c) == NULL);
    CHECK(a.refused == 1 && a.live == 0);
    return 1;
}

static int unknown_device(void) {
    char why[256];
    mlc_config c;
    mlc_ctx *ctx;
    memset(&c, 0, sizeof c);
    c.quiet = 1;
    c.device = "tpu:7";
    c.error = why;
    c.error_bytes = sizeof why;
    ctx = mlc_create(&c);                        /* no context on a device it did not ask for */
    CHECK(ctx == NULL);
    CHECK(strstr(why, "mlc_create") != NULL);
    CHECK(strstr(why, "tpu:7") != NULL);
    c.device = "cpu";
    ctx = mlc_create(&c);
    CHECK(ctx != NULL && mlc_error(ctx) == MLC_OK);
    CHECK(strcmp(mlc_device_name(ctx), "cpu") == 0);
    test_destroy(ctx);
    return 1;
}

/* The log hook receives each error once, at MLC_LOG_ERROR, with the same text. */
typedef struct log_record { int count; mlc_log_level level; char message[512]; } log_record;
/* records warnings and errors (MLC_DEVICE=best logs at INFO level which device it took) */
static void record_log(mlc_log_level level, const char *message, void *user) {
    log_record *r = (log_record *)user;
    if (level == MLC_LOG_INFO) return;
    r->count++;
    r->level = level;
    strncpy(r->message, message, sizeof r->message - 1);
}

static int errors_are_logged(void) {
    log_record rec;
    mlc_config c;
    mlc_ctx *ctx;
    memset(&rec, 0, sizeof rec);
    memset(&c, 0, sizeof c);
    c.log = record_log;
    c.log_user = &rec;
    ctx = test_adopt(mlc_create(&c));
    CHECK(ctx);
    CHECK(mlc_matmul(mlc_ones(ctx, MLC_SHAPE(2, 3)), mlc_ones(ctx, MLC_SHAPE(2, 3))) == NULL);
    CHECK(mlc_relu(NULL) == NULL && mlc_add(mlc_ones(ctx, MLC_SHAPE(1)), NULL) == NULL);  /* sticky: not logged again */
    CHECK(rec.count == 1);
    CHECK(rec.level == MLC_LOG_ERROR);
    CHECK(strcmp(rec.message, mlc_error_message(ctx)) == 0);
    test_destroy(ctx);
    return 1;
}

static int no_leak_in_normal_use(void) {
    counting_alloc a;
    mlc_ctx *ctx;
    mlc_module *net;
    mlc_optim *opt;
    mlc_tensor *x, *y, *kept;
    mlc_stats s;
    int step;
    memset(&a, 0, sizeof a);
    a.fail_at = -1;
    ctx = counting_ctx(&a, 0);
    CHECK(ctx);
    net = mlc_nn_sequential(ctx, mlc_nn_conv2d(ctx, 1, 2, 3, (mlc_conv_opts){ .padding = 1 }), mlc_nn_batch_norm(ctx, 2),
                            mlc_nn_relu(ctx), mlc_nn_flatten(ctx), mlc_nn_linear(ctx, 32, 3), NULL);
    opt = mlc_sgd(ctx, net, (mlc_sgd_opts){ .lr = 0.1f, .momentum = 0.9f });
    x = mlc_randn(ctx, MLC_SHAPE(4, 1, 4, 4));
    y = mlc_zeros(ctx, MLC_SHAPE(4));
    CHECK(net && opt && x && y);
    for (step = 0; step < 3; step++) {
        mlc_frame f = mlc_frame_begin(ctx);
        mlc_tensor *loss = mlc_cross_entropy(mlc_forward(net, x), y, MLC_REDUCE_MEAN, MLC_NO_IGNORE);
        mlc_zero_grad(opt);
        CHECK(mlc_backward(loss) == MLC_OK);
        mlc_step(opt);
        mlc_frame_end(f);
    }
    kept = mlc_keep(x);                          /* long-lived tensors, one freed by hand */
    CHECK(kept && mlc_keep(y));
    mlc_tensor_free(kept);
    s = mlc_get_stats(ctx);
    CHECK(mlc_error(ctx) == MLC_OK);
    CHECK_MSG((long)s.allocs == a.calls, "stats count %zu allocations, the allocator saw %ld", s.allocs, a.calls);
    CHECK_MSG((long)(s.allocs - s.frees) == a.live, "stats say %zu live, the allocator %ld", s.allocs - s.frees, a.live);
    CHECK(a.live > 10);
    test_destroy(ctx);
    CHECK_MSG(a.live == 0 && a.live_bytes == 0, "%ld blocks (%zu bytes) not freed", a.live, a.live_bytes);
    return 1;
}

const test_case tests_errors[] = {
    TEST(shape_mismatch_add)
    TEST(shape_mismatch_matmul)
    TEST(shape_mismatch_conv2d)
    TEST(shape_mismatch_cross_entropy_target)
    TEST(shape_mismatch_reshape)
    TEST(shape_mismatch_concat)
    TEST(wrong_rank)
    TEST(cross_entropy_bad_class)
    TEST(index_ops_out_of_range)
    TEST(bad_axis)
    TEST(null_input)
    TEST(null_chain_keeps_first_error)
    TEST(error_is_sticky)
    TEST(mixed_contexts)
    TEST(invalid_arguments)
    TEST(item_of_non_scalar)
    TEST(backward_errors)
    TEST(allocation_failure_everywhere)
    TEST(allocation_failure_in_op)
    TEST(allocator_contract)
    TEST(unknown_device)
    TEST(errors_are_logged)
    TEST(no_leak_in_normal_use)
    { NULL, NULL }
};
