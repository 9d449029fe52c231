/* Gradient checks: every op's backward rule against central differences (mlc_gradcheck), on
   several shapes and broadcasting cases. Inputs come from one of three domains:
     ANY       N(0, 1)
     POSITIVE  [0.5, 2)             for log, sqrt, pow, div
     DISTINCT  k·0.1 + 0.0237, shuffled: no ties and no value within 0.02 of a kink
               (0, ±0.5, 0.7), for relu, abs, clamp, max, max_pool                       */
#include "test.h"
#include <stdlib.h>

enum { ANY, POSITIVE, DISTINCT };
#define MAXIN 4

/* Filled on the host, then written with mlc_write (on a device, that marks the device copy). */
static int fill(mlc_tensor *t, int domain) {
    float v[256];
    size_t i, n = t->size;
    if (n > sizeof v / sizeof v[0]) return 0;
    for (i = 0; i < n; i++) {
        if (domain == ANY) v[i] = mlc_rand_normal(t->ctx);
        else if (domain == POSITIVE) v[i] = 0.5f + 1.5f * mlc_rand_uniform(t->ctx);
        else v[i] = ((float)i - (float)n / 2.0f) * 0.1f + 0.0237f;
    }
    if (domain == DISTINCT)                                  /* Fisher-Yates shuffle */
        for (i = n; i > 1; i--) {
            size_t j = mlc_rand_u32(t->ctx) % i;
            float tmp = v[i - 1]; v[i - 1] = v[j]; v[j] = tmp;
        }
    return mlc_write(t, v, n) == MLC_OK;
}

/* shapes: {ndim, d0, d1, ...} per input */
static int run_grad(const char *name, mlc_gradcheck_fn fn, int domain, const int (*shapes)[MLC_MAX_DIMS + 1], int count) {
    mlc_ctx *ctx = test_ctx(7);
    mlc_tensor *in[MAXIN];
    mlc_gradcheck_opts opts = { 5e-3, 2e-3, 1e-2 };
    mlc_gradcheck_report rep;
    int k, ok;
    for (k = 0; k < count; k++) {
        in[k] = mlc_requires_grad(mlc_empty(ctx, shapes[k][0], shapes[k] + 1), 1);
        CHECK(in[k] != NULL);
        CHECK(fill(in[k], domain));
    }
    ok = mlc_gradcheck(ctx, fn, NULL, in, count, &opts, &rep);
    if (!ok) {
        snprintf(test_failure, sizeof test_failure, "%s: gradient mismatch at input %d element %zu: analytic %.6g numeric %.6g (%s)",
                 name, rep.worst_input, rep.worst_index, rep.analytic, rep.numeric,
                 mlc_error(ctx) ? mlc_error_message(ctx) : "no error");
        test_destroy(ctx);
        return 0;
    }
    CHECK_MSG(rep.worst_input >= 0, "%s: nothing was checked", name);
    test_destroy(ctx);
    return 1;
}

#define S(...) { __VA_ARGS__ }
#define GRAD(name, domain, ...) \
    static int grad_##name(void) { \
        static const int shapes[][MLC_MAX_DIMS + 1] = { __VA_ARGS__ }; \
        return run_grad(#name, f_##name, domain, shapes, (int)(sizeof shapes / sizeof shapes[0])); }
#define FN(name) static mlc_tensor *f_##name(mlc_tensor **x, void *u)
#define C(x) ((x)->ctx)

/* elementwise, broadcasting */
FN(add_same) { (void)u; return mlc_add(x[0], x[1]); }
FN(add_row) { (void)u; return mlc_add(x[0], x[1]); }
FN(add_both) { (void)u; return mlc_add(x[0], x[1]); }
FN(add_scalar_tensor) { (void)u; return mlc_add(x[0], x[1]); }
FN(sub_bcast) { (void)u; return mlc_sub(x[0], x[1]); }
FN(mul_bcast) { (void)u; return mlc_mul(x[0], x[1]); }
FN(mul_self) { (void)u; return mlc_mul(x[0], x[0]); }            /* used twice: both parts */
FN(div_bcast) { (void)u; return mlc_div(x[0], x[1]); }
GRAD(add_same, ANY, S(2, 3, 4), S(2, 3, 4))
GRAD(add_row, ANY, S(2, 3, 4), S(1, 4))
GRAD(add_both, ANY, S(3, 2, 1, 4), S(2, 3, 1))
GRAD(add_scalar_tensor, ANY, S(0), S(2, 2, 3))
GRAD(sub_bcast, ANY, S(2, 3, 1), S(2, 1, 4))
GRAD(mul_bcast, ANY, S(3, 2, 3, 4), S(2, 3, 1))
GRAD(mul_self, ANY, S(2, 3, 3))
GRAD(div_bcast, POSITIVE, S(2, 3, 4), S(1, 4))

FN(where3) {
    static const float c[] = { 1, 0, 1, 0, 0, 1 };
    (void)u;
    return mlc_where(mlc_from_data(C(x[0]), MLC_SHAPE(2, 3), c), x[0], x[1]);
}
FN(masked_fill) {
    static const float m[] = { 0, 1, 1, 0, 0, 1, 0, 0, 0 };
    (void)u;
    return mlc_masked_fill(x[0], mlc_from_data(C(x[0]), MLC_SHAPE(3, 3), m), -5.0f);
}
GRAD(where3, ANY, S(2, 2, 3), S(1, 3))
GRAD(masked_fill, ANY, S(3, 2, 3, 3))

/* one-input elementwise ops and activations */
FN(neg) { (void)u; return mlc_neg(x[0]); }
FN(exp) { (void)u; return mlc_exp(x[0]); }
FN(log) { (void)u; return mlc_log(x[0]); }
FN(sqrt) { (void)u; return mlc_sqrt(x[0]); }
FN(pow) { (void)u; return mlc_pow(x[0], 2.5f); }
FN(abs) { (void)u; return mlc_abs(x[0]); }
FN(clamp) { (void)u; return mlc_clamp(x[0], -0.5f, 0.7f); }
FN(scalars) { (void)u; return mlc_rsub_scalar(mlc_mul_scalar(mlc_add_scalar(x[0], 0.3f), -1.7f), 2.0f); }
FN(relu) { (void)u; return mlc_relu(x[0]); }
FN(leaky_relu) { (void)u; return mlc_leaky_relu(x[0], 0.1f); }
FN(gelu) { (void)u; return mlc_gelu(x[0]); }
FN(gelu_tanh) { (void)u; return mlc_gelu_tanh(x[0]); }
FN(sigmoid) { (void)u; return mlc_sigmoid(x[0]); }
FN(tanh) { (void)u; return mlc_tanh(x[0]); }
FN(silu) { (void)u; return mlc_silu(x[0]); }
FN(softplus) { (void)u; return mlc_softplus(mlc_mul_scalar(x[0], 4)); }     /* past the threshold too */
FN(relu6) { (void)u; return mlc_relu6(mlc_mul_scalar(x[0], 4)); }
FN(logsigmoid) { (void)u; return mlc_logsigmoid(mlc_mul_scalar(x[0], 3)); }
FN(hardswish) { (void)u; return mlc_hardswish(mlc_mul_scalar(x[0], 2)); }
FN(cumsum_mid) { (void)u; return mlc_cumsum(x[0], 1); }
FN(cumsum_last) { (void)u; return mlc_cumsum(x[0], -1); }
GRAD(neg, ANY, S(2, 3, 4))
GRAD(exp, ANY, S(2, 3, 4))
GRAD(log, POSITIVE, S(2, 3, 4))
GRAD(sqrt, POSITIVE, S(2, 3, 4))
GRAD(pow, POSITIVE, S(2, 3, 4))
GRAD(abs, DISTINCT, S(2, 3, 4))
GRAD(clamp, DISTINCT, S(2, 3, 6))
GRAD(scalars, ANY, S(1, 7))
GRAD(relu, DISTINCT, S(2, 4, 5))
GRAD(leaky_relu, DISTINCT, S(2, 4, 5))
GRAD(gelu, ANY, S(2, 4, 5))
GRAD(gelu_tanh, ANY, S(2, 4, 5))
GRAD(sigmoid, ANY, S(2, 4, 5))
GRAD(tanh, ANY, S(2, 4, 5))
GRAD(silu, ANY, S(2, 4, 5))
GRAD(softplus, ANY, S(2, 4, 5))
GRAD(relu6, DISTINCT, S(2, 4, 5))
GRAD(logsigmoid, ANY, S(2, 4, 5))
GRAD(hardswish, DISTINCT, S(2, 4, 5))
GRAD(cumsum_mid, ANY, S(3, 2, 3, 4))
GRAD(cumsum_last, ANY, S(2, 3, 5))

/* matrix products */
FN(matmul) { (void)u; return mlc_matmul(x[0], x[1]); }
FN(matmul_ta) { (void)u; return mlc_matmul_t(x[0], x[1], 1, 0); }
FN(matmul_tb) { (void)u; return mlc_matmul_t(x[0], x[1], 0, 1); }
FN(matmul_tab) { (void)u; return mlc_matmul_t(x[0], x[1], 1, 1); }
FN(matmul_batched) { (void)u; return mlc_matmul(x[0], x[1]); }
FN(matmul_batched_tab) { (void)u; return mlc_matmul_t(x[0], x[1], 1, 1); }
FN(matmul_shared_b) { (void)u; return mlc_matmul(x[0], x[1]); }
FN(matmul_shared_b_ta) { (void)u; return mlc_matmul_t(x[0], x[1], 1, 0); }
FN(matmul_shared_a) { (void)u; return mlc_matmul_t(x[0], x[1], 0, 1); }
FN(linear) { (void)u; return mlc_linear(x[0], x[1], x[2]); }
GRAD(matmul, ANY, S(2, 3, 4), S(2, 4, 5))
GRAD(matmul_ta, ANY, S(2, 4, 3), S(2, 4, 5))
GRAD(matmul_tb, ANY, S(2, 3, 4), S(2, 5, 4))
GRAD(matmul_tab, ANY, S(2, 4, 3), S(2, 5, 4))
GRAD(matmul_batched, ANY, S(3, 2, 3, 4), S(3, 2, 4, 2))
GRAD(matmul_batched_tab, ANY, S(4, 2, 1, 4, 3), S(4, 2, 1, 2, 4))
GRAD(matmul_shared_b, ANY, S(3, 2, 3, 4), S(2, 4, 5))
GRAD(matmul_shared_b_ta, ANY, S(3, 2, 4, 3), S(2, 4, 5))
GRAD(matmul_shared_a, ANY, S(2, 3, 4), S(3, 2, 5, 4))
GRAD(linear, ANY, S(3, 2, 3, 4), S(2, 5, 4), S(1, 5))

/* reductions */
FN(sum0) { (void)u; return mlc_sum(x[0], 0, 0); }
FN(sum1_keep) { (void)u; return mlc_sum(x[0], 1, 1); }
FN(mean_last) { (void)u; return mlc_mean(x[0], -1, 0); }
FN(max1) { (void)u; return mlc_max(x[0], 1, 0); }
FN(max_last_keep) { (void)u; return mlc_max(x[0], -1, 1); }
FN(var_unbiased) { (void)u; return mlc_var(x[0], 1, 0, 1); }
FN(var_biased_keep) { (void)u; return mlc_var(x[0], 0, 1, 0); }
FN(sum_all) { (void)u; return mlc_sum_all(x[0]); }
FN(mean_all) { (void)u; return mlc_mean_all(x[0]); }
GRAD(sum0, ANY, S(3, 2, 3, 4))
GRAD(sum1_keep, ANY, S(3, 2, 3, 4))
GRAD(mean_last, ANY, S(3, 2, 3, 4))
GRAD(max1, DISTINCT, S(3, 2, 3, 4))
GRAD(max_last_keep, DISTINCT, S(2, 3, 4))
GRAD(var_unbiased, ANY, S(3, 2, 3, 4))
GRAD(var_biased_keep, ANY, S(2, 3, 4))
GRAD(sum_all, ANY, S(2, 3, 4))
GRAD(mean_all, ANY, S(2, 3, 4))

/* softmax and losses */
FN(softmax_last) { (void)u; return mlc_softmax(x[0], -1); }
FN(softmax_mid) { (void)u; return mlc_softmax(x[0], 1); }
FN(log_softmax_last) { (void)u; return mlc_log_softmax(x[0], -1); }
FN(log_softmax_first) { (void)u; return mlc_log_softmax(x[0], 0); }
static const float targets5[] = { 2, 0, 3, 3, 1 };
FN(cross_entropy_mean) { (void)u; return mlc_cross_entropy(x[0], mlc_from_data(C(x[0]), MLC_SHAPE(5), targets5), MLC_REDUCE_MEAN, MLC_NO_IGNORE); }
FN(cross_entropy_sum) { (void)u; return mlc_cross_entropy(x[0], mlc_from_data(C(x[0]), MLC_SHAPE(5), targets5), MLC_REDUCE_SUM, MLC_NO_IGNORE); }
FN(cross_entropy_none) { (void)u; return mlc_cross_entropy(x[0], mlc_from_data(C(x[0]), MLC_SHAPE(5), targets5), MLC_REDUCE_NONE, MLC_NO_IGNORE); }
FN(cross_entropy_ignore) { (void)u; return mlc_cross_entropy(x[0], mlc_from_data(C(x[0]), MLC_SHAPE(5), targets5), MLC_REDUCE_MEAN, 3); }
FN(cross_entropy_smooth) { (void)u; return mlc_cross_entropy_opts(x[0], mlc_from_data(C(x[0]), MLC_SHAPE(5), targets5), (mlc_ce_opts){ MLC_REDUCE_MEAN, 1, 3, 0.3f }); }
FN(cross_entropy_smooth_none) { (void)u; return mlc_cross_entropy_opts(x[0], mlc_from_data(C(x[0]), MLC_SHAPE(5), targets5), (mlc_ce_opts){ MLC_REDUCE_NONE, 0, 0, 0.1f }); }
FN(nll_loss) { (void)u; return mlc_nll_loss(mlc_log_softmax(x[0], 1), mlc_from_data(C(x[0]), MLC_SHAPE(5), targets5), MLC_REDUCE_MEAN, 0); }
FN(nll_loss_none) { (void)u; return mlc_nll_loss(x[0], mlc_from_data(C(x[0]), MLC_SHAPE(5), targets5), MLC_REDUCE_NONE, MLC_NO_IGNORE); }
FN(mse_mean) { (void)u; return mlc_mse_loss(x[0], x[1], MLC_REDUCE_MEAN); }
FN(mse_none) { (void)u; return mlc_mse_loss(x[0], x[1], MLC_REDUCE_NONE); }
FN(bce_logits_mean) { (void)u; return mlc_bce_with_logits(x[0], mlc_sigmoid(x[1]), MLC_REDUCE_MEAN); }
FN(bce_logits_sum) { (void)u; return mlc_bce_with_logits(x[0], mlc_sigmoid(x[1]), MLC_REDUCE_SUM); }
GRAD(softmax_last, ANY, S(2, 3, 4))
GRAD(softmax_mid, ANY, S(3, 2, 3, 4))
GRAD(log_softmax_last, ANY, S(2, 3, 4))
GRAD(log_softmax_first, ANY, S(3, 3, 2, 2))
GRAD(cross_entropy_mean, ANY, S(2, 5, 4))
GRAD(cross_entropy_sum, ANY, S(2, 5, 4))
GRAD(cross_entropy_none, ANY, S(2, 5, 4))
GRAD(cross_entropy_ignore, ANY, S(2, 5, 4))
GRAD(cross_entropy_smooth, ANY, S(2, 5, 4))
GRAD(cross_entropy_smooth_none, ANY, S(2, 5, 4))
GRAD(nll_loss, ANY, S(2, 5, 4))
GRAD(nll_loss_none, ANY, S(2, 5, 4))
GRAD(mse_mean, ANY, S(2, 3, 4), S(2, 3, 4))
GRAD(mse_none, ANY, S(2, 3, 4), S(2, 3, 4))
GRAD(bce_logits_mean, ANY, S(2, 3, 4), S(2, 3, 4))
GRAD(bce_logits_sum, ANY, S(1, 6), S(1, 6))

/* shape and indexing ops */
FN(reshape) { (void)u; return mlc_mul(mlc_reshape(x[0], MLC_SHAPE(4, -1)), x[1]); }
FN(flatten) { (void)u; return mlc_flatten(mlc_exp(x[0]), 1); }
FN(transpose) { (void)u; return mlc_matmul(mlc_transpose(x[0], 0, 1), x[1]); }
FN(permute) { static const int order[] = { 2, 0, 1 }; (void)u; return mlc_mul(mlc_permute(x[0], order), x[1]); }
FN(slice) { (void)u; return mlc_mul(mlc_slice(x[0], 1, -3, -1), x[1]); }
FN(concat) { mlc_tensor *xs[3]; (void)u; xs[0] = x[0]; xs[1] = mlc_exp(x[1]); xs[2] = x[0]; return mlc_concat(C(x[0]), xs, 3, 1); }
static const float picks[] = { 2, 0, 2, 1 };
FN(index_select) { (void)u; return mlc_index_select(x[0], 1, mlc_from_data(C(x[0]), MLC_SHAPE(4), picks)); }
FN(gather) {
    static const float idx[] = { 0, 2, 2, 1, 1, 0 };
    (void)u;
    return mlc_gather(x[0], 1, mlc_from_data(C(x[0]), MLC_SHAPE(2, 3), idx));
}
FN(copy) { (void)u; return mlc_mul(mlc_copy(x[0]), x[0]); }
FN(embedding) { (void)u; return mlc_embedding(x[0], mlc_from_data(C(x[0]), MLC_SHAPE(2, 2), picks)); }
GRAD(reshape, ANY, S(3, 2, 3, 4), S(2, 4, 6))
GRAD(flatten, ANY, S(4, 2, 3, 2, 2))
GRAD(transpose, ANY, S(2, 4, 3), S(2, 4, 2))
GRAD(permute, ANY, S(3, 2, 3, 4), S(3, 4, 2, 3))
GRAD(slice, ANY, S(3, 2, 5, 2), S(3, 2, 2, 2))
GRAD(concat, ANY, S(2, 2, 3), S(2, 2, 1))
GRAD(index_select, ANY, S(3, 2, 3, 2))
GRAD(gather, ANY, S(2, 2, 4))
GRAD(copy, ANY, S(2, 3, 4))
GRAD(embedding, ANY, S(2, 3, 5))

/* neural-network ops */
FN(dropout) { (void)u; return mlc_dropout(x[0], 0.3f, 1); }
FN(layer_norm) { (void)u; return mlc_layer_norm(x[0], x[1], x[2], 1e-5f); }
FN(layer_norm_plain) { (void)u; return mlc_layer_norm(x[0], NULL, NULL, 1e-5f); }
FN(layer_norm_dims) { (void)u; return mlc_layer_norm_dims(x[0], 2, x[1], x[2], 1e-5f); }
FN(batch_norm_2d) { (void)u; return mlc_batch_norm(x[0], NULL, NULL, x[1], x[2], 1, 0.1f, 1e-5f); }
FN(batch_norm_4d) { (void)u; return mlc_batch_norm(x[0], NULL, NULL, x[1], x[2], 1, 0.1f, 1e-5f); }
FN(batch_norm_eval) {
    static const float rm[] = { 0.2f, -0.1f, 0.0f }, rv[] = { 1.5f, 0.7f, 1.0f };
    (void)u;
    return mlc_batch_norm(x[0], mlc_from_data(C(x[0]), MLC_SHAPE(3), rm), mlc_from_data(C(x[0]), MLC_SHAPE(3), rv), x[1], x[2], 0, 0.1f, 1e-5f);
}
static mlc_conv_opts conv_opts(int stride, int padding, int dilation, int groups) {
    mlc_conv_opts o = { 0 };
    o.stride = stride; o.padding = padding; o.dilation = dilation; o.groups = groups;
    return o;
}
FN(conv2d) { (void)u; return mlc_conv2d(x[0], x[1], x[2], conv_opts(1, 0, 1, 1)); }
FN(conv2d_stride_pad) { (void)u; return mlc_conv2d(x[0], x[1], x[2], conv_opts(2, 1, 1, 1)); }
FN(conv2d_dilation) { (void)u; return mlc_conv2d(x[0], x[1], NULL, conv_opts(1, 2, 2, 1)); }
FN(conv2d_groups) { (void)u; return mlc_conv2d(x[0], x[1], x[2], conv_opts(1, 1, 1, 2)); }
FN(conv2d_depthwise) { (void)u; return mlc_conv2d(x[0], x[1], x[2], conv_opts(2, 1, 1, 3)); }
static const mlc_conv_opts conv_hw = { .stride = 2, .padding = 1, .dilation = 1, .groups = 2, .stride_w = 1,
                                      .padding_w = MLC_ZERO_INT, .dilation_w = 2 };   /* (2,1) (1,0) (1,2) */
FN(conv2d_hw) { (void)u; return mlc_conv2d(x[0], x[1], x[2], conv_hw); }
FN(max_pool2d) { (void)u; return mlc_max_pool2d(x[0], 2, 2, 0); }
FN(max_pool2d_overlap) { (void)u; return mlc_max_pool2d(x[0], 3, 2, 1); }
FN(avg_pool2d) { (void)u; return mlc_avg_pool2d(x[0], 3, 2, 1); }
FN(global_avg_pool2d) { (void)u; return mlc_global_avg_pool2d(x[0]); }
static const mlc_pool_opts ceil_s2p1 = { .stride = 2, .padding = 1, .ceil_mode = 1 };   /* hanging windows */
static const mlc_pool_opts no_pad_s2p1 = { .stride = 2, .padding = 1, .ceil_mode = 1, .exclude_pad = 1 };
FN(max_pool2d_ceil) { (void)u; return mlc_max_pool2d_opts(x[0], 3, ceil_s2p1); }
FN(avg_pool2d_ceil) { (void)u; return mlc_avg_pool2d_opts(x[0], 3, ceil_s2p1); }
FN(avg_pool2d_exclude_pad) { (void)u; return mlc_avg_pool2d_opts(x[0], 3, no_pad_s2p1); }
static const mlc_pool_opts pool_hw = { .stride = 2, .padding = 1, .kernel_w = 2, .stride_w = 1,
                                      .padding_w = MLC_ZERO_INT };   /* (3, 2), (2, 1), (1, 0) */
FN(max_pool2d_hw) { (void)u; return mlc_max_pool2d_opts(x[0], 3, pool_hw); }
FN(avg_pool2d_hw) { (void)u; return mlc_avg_pool2d_opts(x[0], 3, pool_hw); }
GRAD(dropout, ANY, S(2, 4, 5))
GRAD(layer_norm, ANY, S(3, 2, 3, 5), S(1, 5), S(1, 5))
GRAD(layer_norm_plain, ANY, S(2, 3, 6))
GRAD(layer_norm_dims, ANY, S(3, 2, 3, 4), S(2, 3, 4), S(2, 3, 4))
GRAD(batch_norm_2d, ANY, S(2, 4, 3), S(1, 3), S(1, 3))
GRAD(batch_norm_4d, ANY, S(4, 2, 3, 2, 2), S(1, 3), S(1, 3))
GRAD(batch_norm_eval, ANY, S(4, 2, 3, 2, 2), S(1, 3), S(1, 3))
GRAD(conv2d, ANY, S(4, 2, 3, 5, 5), S(4, 4, 3, 3, 3), S(1, 4))
GRAD(conv2d_stride_pad, ANY, S(4, 1, 2, 6, 5), S(4, 3, 2, 3, 3), S(1, 3))
GRAD(conv2d_dilation, ANY, S(4, 1, 2, 5, 5), S(4, 2, 2, 2, 3))
GRAD(conv2d_groups, ANY, S(4, 1, 4, 4, 4), S(4, 6, 2, 3, 3), S(1, 6))
GRAD(conv2d_depthwise, ANY, S(4, 2, 3, 5, 5), S(4, 3, 1, 3, 3), S(1, 3))
GRAD(conv2d_hw, ANY, S(4, 1, 4, 5, 6), S(4, 4, 2, 3, 2), S(1, 4))
GRAD(max_pool2d, DISTINCT, S(4, 2, 2, 4, 4))
GRAD(max_pool2d_overlap, DISTINCT, S(4, 1, 2, 5, 5))
GRAD(avg_pool2d, ANY, S(4, 1, 2, 5, 5))
GRAD(global_avg_pool2d, ANY, S(4, 2, 3, 2, 3))
GRAD(max_pool2d_ceil, DISTINCT, S(4, 1, 2, 6, 5))
GRAD(avg_pool2d_ceil, ANY, S(4, 1, 2, 6, 5))
GRAD(avg_pool2d_exclude_pad, ANY, S(4, 1, 2, 6, 5))
GRAD(max_pool2d_hw, DISTINCT, S(4, 1, 2, 5, 6))
GRAD(avg_pool2d_hw, ANY, S(4, 1, 2, 5, 6))

/* An intermediate read by two ops: the backward that runs first (the op recorded last) writes
   over the fresh gradient, with no zeros written first; the other adds. Each op whose backward
   can write over one, recorded before and after the other reader (h·h). */
static mlc_tensor *read_twice(mlc_tensor *h, mlc_tensor *(*op)(mlc_tensor *, mlc_tensor *), mlc_tensor *w,
                              int op_last) {
    mlc_tensor *a = op_last ? NULL : op(h, w), *b = mlc_mul(h, h);
    if (op_last) a = op(h, w);
    return mlc_add(mlc_sum_all(a), mlc_sum_all(b));
}
static mlc_tensor *relu_of(mlc_tensor *h, mlc_tensor *w) { (void)w; return mlc_relu(h); }
static mlc_tensor *flatten_of(mlc_tensor *h, mlc_tensor *w) { (void)w; return mlc_flatten(h, 1); }
static mlc_tensor *max_pool_of(mlc_tensor *h, mlc_tensor *w) { (void)w; return mlc_max_pool2d(h, 2, 2, 0); }
static mlc_tensor *avg_pool_of(mlc_tensor *h, mlc_tensor *w) { (void)w; return mlc_avg_pool2d(h, 3, 2, 1); }
static mlc_tensor *conv_of(mlc_tensor *h, mlc_tensor *w) { return mlc_conv2d(h, w, NULL, conv_opts(1, 1, 1, 1)); }
static mlc_tensor *conv_strided_of(mlc_tensor *h, mlc_tensor *w) {
    return mlc_conv2d(h, w, NULL, conv_opts(2, 1, 1, 1));
}
#define READ_TWICE(name, op, w) \
    FN(name##_read_twice) { (void)u; return read_twice(mlc_mul_scalar(x[0], 1.5f), op, w, 0); } \
    FN(name##_read_twice_last) { (void)u; return read_twice(mlc_mul_scalar(x[0], 1.5f), op, w, 1); }
READ_TWICE(relu, relu_of, NULL)
READ_TWICE(flatten, flatten_of, NULL)
READ_TWICE(max_pool, max_pool_of, NULL)
READ_TWICE(avg_pool, avg_pool_of, NULL)
READ_TWICE(conv, conv_of, x[1])
READ_TWICE(conv_strided, conv_strided_of, x[1])
GRAD(relu_read_twice, DISTINCT, S(2, 3, 4))
GRAD(relu_read_twice_last, DISTINCT, S(2, 3, 4))
GRAD(flatten_read_twice, ANY, S(3, 2, 3, 4))
GRAD(flatten_read_twice_last, ANY, S(3, 2, 3, 4))
GRAD(max_pool_read_twice, DISTINCT, S(4, 2, 2, 4, 4))
GRAD(max_pool_read_twice_last, DISTINCT, S(4, 2, 2, 4, 4))
GRAD(avg_pool_read_twice, ANY, S(4, 1, 2, 5, 5))
GRAD(avg_pool_read_twice_last, ANY, S(4, 1, 2, 5, 5))
GRAD(conv_read_twice, ANY, S(4, 2, 3, 5, 5), S(4, 4, 3, 3, 3))
GRAD(conv_read_twice_last, ANY, S(4, 2, 3, 5, 5), S(4, 4, 3, 3, 3))
GRAD(conv_strided_read_twice, ANY, S(4, 2, 3, 5, 5), S(4, 4, 3, 3, 3))
GRAD(conv_strided_read_twice_last, ANY, S(4, 2, 3, 5, 5), S(4, 4, 3, 3, 3))

/* A gradcheck of net, a Sequential whose first op has relu fused into it, on input in[0] and
   its weight in[1] (0.1 N(0, 1) each) and bias in[2] (n == 3; ±2): the biases and the small x
   and weights keep every output far from relu's kink */
static mlc_tensor *f_sequential(mlc_tensor **x, void *net) { return mlc_forward((mlc_module *)net, x[0]); }
static int gradcheck_fused(mlc_ctx *ctx, mlc_module *net, mlc_tensor **in, int n, int k) {
    mlc_gradcheck_opts tol = { 5e-3, 2e-3, 1e-2 };
    mlc_gradcheck_report rep;
    float v[256];
    int i, t;
    for (t = 0; t < n; t++) {
        CHECK(in[t] && in[t]->size <= 256);
        for (i = 0; i < (int)in[t]->size; i++) v[i] = t < 2 ? 0.1f * mlc_rand_normal(ctx) : i % 2 ? -2.0f : 2.0f;
        CHECK(mlc_write(in[t], v, in[t]->size) == MLC_OK);
    }
    CHECK_MSG(mlc_gradcheck(ctx, f_sequential, net, in, n, &tol, &rep),
              "case %d: input %d element %zu: analytic %.6g numeric %.6g (%s)", k, rep.worst_input,
              rep.worst_index, rep.analytic, rep.numeric, mlc_error(ctx) ? mlc_error_message(ctx) : "no error");
    return 1;
}

/* conv2d with relu fused into it (Sequential's Conv2d then ReLU on the CPU), fast and general
   path */
static int grad_conv2d_relu_fused(void) {
    static const mlc_conv_opts opts[] = { { .padding = 1 }, { .stride = 2, .padding = 1, .groups = 2 } };
    int k;
    for (k = 0; k < 2; k++) {
        mlc_ctx *ctx = test_ctx(5);
        mlc_module *conv = mlc_nn_conv2d(ctx, 4, 6, 3, opts[k]);
        mlc_module *net = mlc_nn_sequential(ctx, conv, mlc_nn_relu(ctx), NULL);
        mlc_tensor *in[3];
        CHECK(net != NULL);
        in[0] = mlc_requires_grad(mlc_empty(ctx, 4, (int[]){ 2, 4, 5, 5 }), 1);
        in[1] = conv->params[0]; in[2] = conv->params[1];
        CHECK(gradcheck_fused(ctx, net, in, 3, k));
        test_destroy(ctx);
    }
    return 1;
}

/* linear with relu fused into it (Sequential's Linear then ReLU on the CPU), with bias on a 2-D
   and a 3-D input, and without */
static int grad_linear_relu_fused(void) {
    static const int shapes[][3] = { { 2, 3, 0 }, { 2, 3, 5 }, { 4, 6, 0 } };   /* the input's shape */
    int k;
    for (k = 0; k < 3; k++) {
        mlc_ctx *ctx = test_ctx(6);
        int n_in = shapes[k][2] ? shapes[k][2] : shapes[k][1], bias = k < 2;
        mlc_module *lin = bias ? mlc_nn_linear(ctx, n_in, 8) : mlc_nn_linear_nobias(ctx, n_in, 8);
        mlc_module *net = mlc_nn_sequential(ctx, lin, mlc_nn_relu(ctx), NULL);
        mlc_tensor *in[3];
        CHECK(net != NULL);
        in[0] = mlc_requires_grad(shapes[k][2] ? mlc_empty(ctx, 3, (int[]){ shapes[k][0], shapes[k][1], n_in })
                                               : mlc_empty(ctx, 2, (int[]){ shapes[k][0], n_in }), 1);
        in[1] = lin->params[0];
        if (bias) in[2] = lin->params[1];
        CHECK(gradcheck_fused(ctx, net, in, bias ? 3 : 2, k));
        test_destroy(ctx);
    }
    return 1;
}

/* a composition: causal self-attention, one head */
FN(attention) {
    static const float causal[] = { 0, 1, 1, 0, 0, 1, 0, 0, 0 };
    mlc_tensor *scores = mlc_mul_scalar(mlc_matmul_t(x[0], x[1], 0, 1), 0.5f);
    (void)u;
    scores = mlc_masked_fill(scores, mlc_from_data(C(x[0]), MLC_SHAPE(3, 3), causal), -1e9f);
    return mlc_matmul(mlc_softmax(scores, -1), x[2]);
}
GRAD(attention, ANY, S(3, 2, 3, 4), S(3, 2, 3, 4), S(3, 2, 3, 4))

/* The checker itself must catch a wrong gradient: y = x · detach(x) has dy/dx = 2x, but the
   tape only sees x, so the analytic gradient is half the numeric one. */
FN(wrong) { (void)u; return mlc_mul(x[0], mlc_detach(x[0])); }
static int grad_checker_catches_wrong_gradient(void) {
    mlc_ctx *ctx = test_ctx(3);
    mlc_tensor *in[1];
    mlc_gradcheck_report rep;
    int ok;
    in[0] = mlc_requires_grad(mlc_randn(ctx, MLC_SHAPE(2, 3)), 1);
    ok = mlc_gradcheck(ctx, f_wrong, NULL, in, 1, NULL, &rep);
    CHECK(!ok);
    CHECK(rep.worst_input == 0);
    CHECK_NEAR(rep.numeric, 2.0 * rep.analytic, 1e-2 * fabs(rep.numeric) + 1e-3);
    test_destroy(ctx);
    return 1;
}

/* The grad-ready hook: each parameter reported once, as soon as its gradient is whole (equal to
   the gradient backward ends with), the last layer's first; a weight read by two layers only
   after the older read; a parameter backward never reaches not at all. */
typedef struct ready_log { mlc_tensor *seen[8]; float first[8]; int count; } ready_log;
static void note_ready(mlc_tensor *leaf, void *user) {
    ready_log *log = (ready_log *)user;
    if (log->count < 8) {
        log->seen[log->count] = leaf;
        log->first[log->count++] = mlc_host_grad(leaf)[0];
    }
}

static int grad_ready_hook(void) {
    mlc_ctx *ctx = test_ctx(21);
    int s22[2] = { 2, 2 }, s12[2] = { 1, 2 };
    mlc_tensor *w1 = mlc_parameter(ctx, 2, s22), *w2 = mlc_parameter(ctx, 2, s22), *shared = mlc_parameter(ctx, 2, s22);
    mlc_tensor *unused = mlc_parameter(ctx, 2, s22), *x, *h, *loss;
    ready_log log;
    int k;
    memset(&log, 0, sizeof log);
    mlc_init_uniform(w1, -1, 1); mlc_init_uniform(w2, -1, 1); mlc_init_uniform(shared, -1, 1);
    x = mlc_rand(ctx, 2, s12);
    h = mlc_tanh(mlc_matmul(mlc_matmul(x, shared), w1));      /* shared read first (oldest) ... */
    h = mlc_matmul(mlc_tanh(mlc_matmul(h, w2)), shared);      /* ... and last */
    loss = mlc_sum_all(mlc_mul(h, h));
    (void)unused;
    mlc_set_grad_ready_hook(ctx, note_ready, &log);
    CHECK(mlc_backward(loss) == MLC_OK);
    CHECK(log.count == 3);
    CHECK(log.seen[0] == w2 && log.seen[1] == w1 && log.seen[2] == shared);
    for (k = 0; k < 3; k++) CHECK(test_same_float(log.first[k], mlc_host_grad(log.seen[k])[0]));
    mlc_set_grad_ready_hook(ctx, NULL, NULL);                  /* removed: nothing reported */
    loss = mlc_sum_all(mlc_matmul(x, w1));
    CHECK(mlc_backward(loss) == MLC_OK && log.count == 3);
    test_destroy(ctx);
    return 1;
}

/* ReLU and its relatives at NaN (and at their corners) pass the gradient where PyTorch 1.13
   passes it: relu's and relu6's backward read "x <= 0" (and "x >= 6") as the zero case, so NaN
   passes; hardswish's NaN takes the slope 1; clamp and abs give 0. The rows are
   torch.autograd's gradients at x = NaN, -1, 0, 3, 7 (clamp to [-0.5, 6], leaky slope 0.1),
   through the op alone and through the fused Linear + ReLU (a NaN weight makes the row NaN). */
static int grad_relu_family_at_nan(void) {
    static const struct { const char *name; float want[5]; } rows[] = {
        { "relu", { 1, 0, 0, 1, 1 } },        { "relu6", { 1, 0, 0, 1, 0 } },
        { "leaky_relu", { 0.1f, 0.1f, 0.1f, 1, 1 } }, { "clamp", { 0, 0, 1, 1, 0 } },
        { "abs", { 0, -1, 0, 1, 1 } },         { "hardswish", { 1, 1.0f / 6, 0.5f, 1.5f, 1 } } };
    const float xs[5] = { NAN, -1, 0, 3, 7 };
    mlc_ctx *ctx = test_ctx(22);
    mlc_module *lin, *net;
    mlc_tensor *x, *y, *in;
    size_t r;
    int i;
    for (r = 0; r < sizeof rows / sizeof rows[0]; r++) {
        mlc_frame f = mlc_frame_begin(ctx);
        x = mlc_requires_grad(mlc_from_data(ctx, MLC_SHAPE(5), xs), 1);
        y = r == 0 ? mlc_relu(x) : r == 1 ? mlc_relu6(x) : r == 2 ? mlc_leaky_relu(x, 0.1f)
            : r == 3 ? mlc_clamp(x, -0.5f, 6.0f) : r == 4 ? mlc_abs(x) : mlc_hardswish(x);
        CHECK(y && mlc_backward_with(y, mlc_ones(ctx, MLC_SHAPE(5))) == MLC_OK);
        for (i = 0; i < 5; i++)
            CHECK_MSG(fabsf(mlc_host_grad(x)[i] - rows[r].want[i]) < 1e-6f, "%s'(%g) = %g, PyTorch %g",
                      rows[r].name, (double)xs[i], (double)mlc_host_grad(x)[i], (double)rows[r].want[i]);
        mlc_frame_end(f);
    }
    lin = mlc_nn_linear(ctx, 2, 3);                      /* fused: Linear then ReLU in one op */
    net = mlc_nn_sequential(ctx, lin, mlc_nn_relu(ctx), NULL);
    mlc_init_constant(lin->params[0], 1.0f);
    mlc_init_constant(lin->params[1], 0.0f);
    mlc_host_data(lin->params[0])[0] = NAN;             /* output 0 is NaN, 1 and 2 are 1 + 2 */
    mlc_write(lin->params[0], mlc_host_data(lin->params[0]), 6);
    in = mlc_from_data(ctx, MLC_SHAPE(1, 2), (const float[]){ 1, 2 });
    y = mlc_forward(net, in);
    CHECK(y && mlc_backward(mlc_sum_all(y)) == MLC_OK);
    CHECK_MSG(test_same_float(mlc_host_grad(lin->params[1])[0], 1.0f), "fused relu at NaN: db = %g",
              (double)mlc_host_grad(lin->params[1])[0]);
    test_destroy(ctx);
    return 1;
}

/* cumsum sums in double as PyTorch's CPU cumsum does: 1e8, then a thousand ones, then -1e8 ends
   at 1000 (a float running sum loses every one: 0), and its gradient likewise. */
static int grad_cumsum_accurate(void) {
    mlc_ctx *ctx = test_ctx(23);
    float *v = (float *)malloc(1002 * sizeof(float));
    mlc_tensor *x, *y;
    int i;
    CHECK(v);
    v[0] = 1e8f; v[1001] = -1e8f;
    for (i = 1; i <= 1000; i++) v[i] = 1.0f;
    x = mlc_requires_grad(mlc_from_data(ctx, MLC_SHAPE(1002), v), 1);
    y = mlc_cumsum(x, 0);
    CHECK(y && test_same_float(mlc_get(y, 1001), 1000.0f));
    CHECK(mlc_backward_with(y, mlc_from_data(ctx, MLC_SHAPE(1002), v)) == MLC_OK);
    CHECK_MSG(test_same_float(mlc_host_grad(x)[0], 1000.0f), "dx[0] = %g", (double)mlc_host_grad(x)[0]);
    free(v);
    test_destroy(ctx);
    return 1;
}

#define T(name) TEST(grad_##name)   /* rows of the table below, without the prefix */
const test_case tests_grad[] = {
    T(add_same) T(add_row) T(add_both) T(add_scalar_tensor) T(sub_bcast) T(mul_bcast) T(mul_self) T(div_bcast)
    T(where3) T(masked_fill)
    T(neg) T(exp) T(log) T(sqrt) T(pow) T(abs) T(clamp) T(scalars) T(relu) T(leaky_relu) T(gelu) T(gelu_tanh)
    T(sigmoid) T(tanh) T(silu) T(softplus) T(relu6) T(logsigmoid) T(hardswish) T(cumsum_mid) T(cumsum_last)
    T(matmul) T(matmul_ta) T(matmul_tb) T(matmul_tab) T(matmul_batched) T(matmul_batched_tab) T(matmul_shared_b)
    T(matmul_shared_b_ta) T(matmul_shared_a) T(linear)
    T(sum0) T(sum1_keep) T(mean_last) T(max1) T(max_last_keep) T(var_unbiased) T(var_biased_keep) T(sum_all) T(mean_all)
    T(softmax_last) T(softmax_mid) T(log_softmax_last) T(log_softmax_first) T(cross_entropy_mean) T(cross_entropy_sum)
    T(cross_entropy_none) T(cross_entropy_ignore) T(cross_entropy_smooth) T(cross_entropy_smooth_none) T(nll_loss) T(nll_loss_none) T(mse_mean) T(mse_none)
    T(bce_logits_mean) T(bce_logits_sum)
    T(reshape) T(flatten) T(transpose) T(permute) T(slice) T(concat) T(index_select) T(gather) T(copy) T(embedding)
    T(dropout) T(layer_norm) T(layer_norm_plain) T(layer_norm_dims) T(batch_norm_2d) T(batch_norm_4d) T(batch_norm_eval)
    T(conv2d) T(conv2d_stride_pad) T(conv2d_dilation) T(conv2d_groups) T(conv2d_depthwise) T(conv2d_hw)
    T(max_pool2d) T(max_pool2d_overlap) T(avg_pool2d) T(global_avg_pool2d) T(max_pool2d_ceil)
    T(avg_pool2d_ceil) T(avg_pool2d_exclude_pad) T(max_pool2d_hw) T(avg_pool2d_hw)
    T(relu_read_twice) T(relu_read_twice_last) T(flatten_read_twice) T(flatten_read_twice_last) T(max_pool_read_twice) T(max_pool_read_twice_last)
    T(avg_pool_read_twice) T(avg_pool_read_twice_last) T(conv_read_twice) T(conv_read_twice_last)
    T(conv_strided_read_twice) T(conv_strided_read_twice_last)
    T(conv2d_relu_fused)
    T(linear_relu_fused)
    T(attention) T(checker_catches_wrong_gradient) T(ready_hook)
    T(relu_family_at_nan) T(cumsum_accurate)
    { NULL, NULL }
};
