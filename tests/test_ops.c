/* Forward values of every op against numbers worked out by hand (or by a plain loop here, or
   by an independent script); shapes of the results; a few error cases. */
#include "test.h"

static int shape_is(const mlc_tensor *t, int ndim, const int *shape) {
    int d;
    if (!t || t->ndim != ndim) return 0;
    for (d = 0; d < ndim; d++) if (t->shape[d] != shape[d]) return 0;
    return 1;
}
/* CHECK_SHAPE(t, 2, 3): t is [2, 3] */
#define CHECK_SHAPE(t, ...) do { const int want_shape_[] = { __VA_ARGS__ }; \
    CHECK_MSG(shape_is((t), (int)(sizeof want_shape_ / sizeof(int)), want_shape_), "%s has the wrong shape", #t); } while (0)

#define T(ctx, data, ...) mlc_from_data(ctx, MLC_SHAPE(__VA_ARGS__), data)

/* ---- elementwise with broadcasting ------------------------------------------------------- */

static int binary_broadcast(void) {
    mlc_ctx *ctx = test_ctx(1);
    const float a[6] = { 1, 2, 3, 4, 5, 6 }, b[3] = { 10, 20, 30 };
    const float add[6] = { 11, 22, 33, 14, 25, 36 }, sub[6] = { -9, -18, -27, -6, -15, -24 };
    const float rsub[6] = { 9, 18, 27, 6, 15, 24 };
    const float c[2] = { 2, 3 }, d[3] = { 1, 10, 100 }, outer[6] = { 2, 20, 200, 3, 30, 300 };
    const float y[3] = { 1, 2, 4 };
    float x24[24], div[24];
    const float s_minus_a[6] = { 1, 0, -1, -2, -3, -4 };
    mlc_tensor *ta = T(ctx, a, 2, 3), *tb = T(ctx, b, 3), *r;
    int i, j, k;
    for (i = 0; i < 24; i++) x24[i] = (float)(i + 1);
    for (i = 0; i < 2; i++) for (j = 0; j < 3; j++) for (k = 0; k < 4; k++)
        div[(i * 3 + j) * 4 + k] = x24[(i * 3 + j) * 4 + k] / y[j];
    r = mlc_add(ta, tb);
    CHECK_SHAPE(r, 2, 3);
    CHECK_TENSOR(r, add, 0);
    r = mlc_add(tb, ta);
    CHECK_SHAPE(r, 2, 3);
    CHECK_TENSOR(r, add, 0);
    r = mlc_sub(ta, tb);
    CHECK_SHAPE(r, 2, 3);
    CHECK_TENSOR(r, sub, 0);
    r = mlc_sub(tb, ta);
    CHECK_TENSOR(r, rsub, 0);
    r = mlc_mul(T(ctx, c, 2, 1), T(ctx, d, 1, 3));      /* [2,1] * [1,3] -> [2,3] */
    CHECK_SHAPE(r, 2, 3);
    CHECK_TENSOR(r, outer, 0);
    r = mlc_div(T(ctx, x24, 2, 3, 4), T(ctx, y, 3, 1));  /* [2,3,4] / [3,1] */
    CHECK_SHAPE(r, 2, 3, 4);
    CHECK_TENSOR(r, div, 1e-6);
    CHECK_NEAR(mlc_host_data(r)[4], 5.0 / 2.0, 1e-6);             /* x[0,1,0] / y[1] by hand */
    CHECK_NEAR(mlc_host_data(r)[23], 24.0 / 4.0, 1e-6);
    {   /* a rank-0 scalar, on either side */
        mlc_tensor *s = mlc_full(ctx, 0, NULL, 2.0f);
        r = mlc_sub(s, ta);
        CHECK_SHAPE(r, 2, 3);
        CHECK_TENSOR(r, s_minus_a, 0);
        r = mlc_div(ta, s);
        CHECK_SHAPE(r, 2, 3);
        CHECK(mlc_host_data(r)[0] == 0.5f && mlc_host_data(r)[5] == 3.0f);
    }
    CHECK(mlc_error(ctx) == MLC_OK);
    CHECK(mlc_add(ta, mlc_zeros(ctx, MLC_SHAPE(2))) == NULL);   /* [2,3] + [2] */
    CHECK(mlc_error(ctx) == MLC_ERR_SHAPE);
    test_destroy(ctx);
    return 1;
}

static int scalar_ops(void) {
    mlc_ctx *ctx = test_ctx(1);
    const float x[4] = { -1.5f, 0, 2, 10 };
    const float add[4] = { 1, 2.5f, 4.5f, 12.5f }, mul[4] = { 4.5f, 0, -6, -30 };
    const float rsub[4] = { 2.5f, 1, -1, -9 }, neg[4] = { 1.5f, 0, -2, -10 };
    mlc_tensor *t = T(ctx, x, 2, 2), *r;
    r = mlc_add_scalar(t, 2.5f);
    CHECK_SHAPE(r, 2, 2);
    CHECK_TENSOR(r, add, 0);
    r = mlc_mul_scalar(t, -3.0f);
    CHECK_TENSOR(r, mul, 0);
    r = mlc_rsub_scalar(t, 1.0f);
    CHECK_SHAPE(r, 2, 2);
    CHECK_TENSOR(r, rsub, 0);
    r = mlc_neg(t);
    CHECK_TENSOR(r, neg, 0);
    CHECK(mlc_host_data(t)[0] == -1.5f);                         /* inputs are not touched */
    test_destroy(ctx);
    return 1;
}

static int unary_math(void) {
    mlc_ctx *ctx = test_ctx(1);
    const float pos[4] = { 0.25f, 1, 4, 9 };
    const float lg[4] = { -1.3862944f, 0, 1.3862944f, 2.1972246f }, sq[4] = { 0.5f, 1, 2, 3 };
    const float p2[4] = { 0.0625f, 1, 16, 81 }, pm[4] = { 2, 1, 0.5f, 0.33333334f };
    const float xs[7] = { -2, -1, -0.5f, 0, 0.5f, 1, 3 };
    const float ex[7] = { 0.13533528f, 0.36787944f, 0.60653066f, 1, 1.6487213f, 2.7182818f, 20.085537f };
    const float ab[7] = { 2, 1, 0.5f, 0, 0.5f, 1, 3 };
    const float cl[7] = { -1, -1, -0.5f, 0, 0.5f, 0.5f, 0.5f };
    const float cube[3] = { -8, -1, 27 }, cin[3] = { -2, -1, 3 };
    mlc_tensor *p = T(ctx, pos, 4), *x = T(ctx, xs, 7), *r;
    CHECK_TENSOR(mlc_log(p), lg, 1e-6);
    CHECK_TENSOR(mlc_sqrt(p), sq, 1e-6);
    CHECK_TENSOR(mlc_pow(p, 2.0f), p2, 1e-5);
    CHECK_TENSOR(mlc_pow(p, -0.5f), pm, 1e-6);
    CHECK_TENSOR(mlc_pow(T(ctx, cin, 3), 3.0f), cube, 1e-5);   /* negative base, whole exponent */
    r = mlc_exp(x);
    CHECK_SHAPE(r, 7);
    CHECK_TENSOR(r, ex, 2e-6);
    CHECK_TENSOR(mlc_abs(x), ab, 0);
    CHECK_TENSOR(mlc_clamp(x, -1.0f, 0.5f), cl, 0);
    CHECK_TENSOR(mlc_clamp(x, -5.0f, 5.0f), xs, 0);
    r = mlc_log(mlc_zeros(ctx, MLC_SHAPE(1)));
    CHECK(r && !test_isfinite(mlc_host_data(r)[0]) && !test_isnan(mlc_host_data(r)[0]));   /* -inf */
    CHECK(mlc_host_data(r)[0] < 0);
    CHECK(mlc_error(ctx) == MLC_OK);
    test_destroy(ctx);
    return 1;
}

static int where_three_way(void) {
    mlc_ctx *ctx = test_ctx(1);
    const float c1[3] = { 1, 0, 1 }, a1[2] = { 10, 20 };
    const float w1[6] = { 10, -1, 10, 20, -1, 20 };
    const float c2[2] = { 0, 1 }, a2[2] = { 5, 6 }, b2[3] = { 7, 8, 9 };
    const float w2[12] = { 7, 7, 8, 8, 9, 9, 5, 6, 5, 6, 5, 6 };
    const float c3[4] = { 0, 2, -1, 0 }, a3[4] = { 1, 2, 3, 4 }, b3[4] = { -1, -2, -3, -4 };
    const float w3[4] = { -1, 2, 3, -4 };
    mlc_tensor *r;
    /* cond [1,3], a [2,1], b [] -> [2,3] */
    r = mlc_where(T(ctx, c1, 1, 3), T(ctx, a1, 2, 1), mlc_full(ctx, 0, NULL, -1.0f));
    CHECK_SHAPE(r, 2, 3);
    CHECK_TENSOR(r, w1, 0);
    /* cond [2,1,1], a [2], b [3,1] -> [2,3,2] */
    r = mlc_where(T(ctx, c2, 2, 1, 1), T(ctx, a2, 2), T(ctx, b2, 3, 1));
    CHECK_SHAPE(r, 2, 3, 2);
    CHECK_TENSOR(r, w2, 0);
    /* any nonzero is true */
    r = mlc_where(T(ctx, c3, 4), T(ctx, a3, 4), T(ctx, b3, 4));
    CHECK_TENSOR(r, w3, 0);
    CHECK(mlc_where(T(ctx, c3, 4), T(ctx, a3, 4), T(ctx, b2, 3)) == NULL);
    CHECK(mlc_error(ctx) == MLC_ERR_SHAPE);
    test_destroy(ctx);
    return 1;
}

static int masked_fill_causal(void) {
    mlc_ctx *ctx = test_ctx(1);
    const float mask[9] = { 0, 1, 1, 0, 0, 1, 0, 0, 0 };     /* 1 above the diagonal */
    const float keep[9] = { 1, 0, 0, 4, 5, 0, 7, 8, 9 };
    const float sm[9] = { 1, 0, 0, 0.26894142f, 0.73105858f, 0, 0.090030573f, 0.24472847f, 0.66524096f };
    mlc_tensor *x = mlc_reshape(mlc_arange(ctx, 1, 10, 1), MLC_SHAPE(1, 3, 3)), *r;
    int i, j, pass;
    CHECK(x);
    for (pass = 0; pass < 2; pass++) {
        mlc_tensor *m = pass ? T(ctx, mask, 1, 3, 3) : T(ctx, mask, 3, 3);
        r = mlc_masked_fill(x, m, -INFINITY);
        CHECK_SHAPE(r, 1, 3, 3);
        for (i = 0; i < 3; i++)
            for (j = 0; j < 3; j++) {
                float v = mlc_host_data(r)[i * 3 + j];
                if (j > i)
                    CHECK_MSG(!test_isfinite(v) && !test_isnan(v) && v < 0, "[%d,%d] = %g, expected -inf",
                              i, j, (double)v);
                else CHECK(v == keep[i * 3 + j]);
            }
        CHECK_TENSOR(mlc_softmax(r, -1), sm, 1e-6);      /* attention weights of a causal mask */
    }
    r = mlc_masked_fill(x, mlc_full(ctx, MLC_SHAPE(3, 1), 1.0f), 0.5f);   /* [3,1] mask: all */
    for (i = 0; i < 9; i++) CHECK(mlc_host_data(r)[i] == 0.5f);
    CHECK(mlc_host_data(x)[1] == 2.0f);
    CHECK(mlc_masked_fill(mlc_zeros(ctx, MLC_SHAPE(3)), mlc_zeros(ctx, MLC_SHAPE(2, 3)), 1.0f) == NULL);
    CHECK(mlc_error(ctx) == MLC_ERR_SHAPE);            /* the mask may not grow x */
    test_destroy(ctx);
    return 1;
}

/* ---- activations ------------------------------------------------------------------------- */

static int activations(void) {
    mlc_ctx *ctx = test_ctx(1);
    const float xs[7] = { -2, -1, -0.5f, 0, 0.5f, 1, 3 };
    const float relu[7] = { 0, 0, 0, 0, 0.5f, 1, 3 };
    const float leaky[7] = { -0.2f, -0.1f, -0.05f, 0, 0.5f, 1, 3 };
    const float gelu[7] = { -0.045500264f, -0.15865525f, -0.15426877f, 0, 0.34573123f, 0.84134475f, 2.9959503f };
    const float gelu_t[7] = { -0.045402306f, -0.15880801f, -0.15428599f, 0, 0.34571401f, 0.84119199f, 2.9963626f };
    const float sig[7] = { 0.11920292f, 0.26894142f, 0.37754067f, 0.5f, 0.62245933f, 0.73105858f, 0.95257413f };
    const float th[7] = { -0.96402758f, -0.76159416f, -0.46211716f, 0, 0.46211716f, 0.76159416f, 0.99505475f };
    const float silu[7] = { -0.23840584f, -0.26894142f, -0.18877033f, 0, 0.31122967f, 0.73105858f, 2.8577224f };
    const float big[2] = { -100, 100 };
    mlc_tensor *x = T(ctx, xs, 7), *b = T(ctx, big, 2), *r;
    CHECK_TENSOR(mlc_relu(x), relu, 0);
    CHECK_TENSOR(mlc_leaky_relu(x, 0.1f), leaky, 1e-7);
    r = mlc_gelu(x);
    CHECK_TENSOR(r, gelu, 1e-6);
    CHECK_NEAR(mlc_host_data(r)[5], 0.8413447, 1e-6);            /* gelu(1) */
    CHECK_NEAR(mlc_host_data(r)[1], -0.1586553, 1e-6);           /* gelu(-1) */
    r = mlc_gelu_tanh(x);
    CHECK_TENSOR(r, gelu_t, 1e-6);
    CHECK_NEAR(mlc_host_data(r)[5], 0.8411920, 1e-6);            /* gelu_tanh(1) */
    CHECK_TENSOR(mlc_sigmoid(x), sig, 1e-6);
    CHECK_TENSOR(mlc_tanh(x), th, 1e-6);
    CHECK_TENSOR(mlc_silu(x), silu, 1e-6);
    /* large inputs stay finite */
    r = mlc_sigmoid(b);
    CHECK(r && mlc_host_data(r)[0] >= 0.0f && mlc_host_data(r)[0] < 1e-30f && mlc_host_data(r)[1] == 1.0f);
    r = mlc_silu(b);
    CHECK(r && fabs(mlc_host_data(r)[0]) < 1e-30 && mlc_host_data(r)[1] == 100.0f);
    r = mlc_tanh(b);
    CHECK(r && mlc_host_data(r)[0] == -1.0f && mlc_host_data(r)[1] == 1.0f);
    r = mlc_gelu(b);
    CHECK(r && mlc_host_data(r)[0] == 0.0f && mlc_host_data(r)[1] == 100.0f);
    test_destroy(ctx);
    return 1;
}

/* softplus, relu6, logsigmoid, hardswish and their gradients, against PyTorch 1.13 */
static int activations_added_through_the_table(void) {
    mlc_ctx *ctx = test_ctx(1);
    const float xs[9] = { -4, -1, -0.5f, 0, 0.5f, 1, 3, 7, 25 };
    static const float want[4][2][9] = {
        { { 0.0181499291f, 0.313261688f, 0.474076986f, 0.693147182f, 0.974076986f, 1.31326163f, 3.04858732f, 7.00091171f, 25 },
          { 0.0179862101f, 0.268941432f, 0.377540678f, 0.5f, 0.622459352f, 0.731058598f, 0.952574134f, 0.999088943f, 1 } },
        { { 0, 0, 0, 0, 0.5f, 1, 3, 6, 6 }, { 0, 0, 0, 0, 1, 1, 1, 0, 0 } },
        { { -4.01814985f, -1.31326175f, -0.974076986f, -0.693147182f, -0.474076986f, -0.313261688f, -0.048587352f,
            -0.000911466486f, -1.38879437e-11f },
          { 0.982013762f, 0.731058598f, 0.622459292f, 0.5f, 0.377540678f, 0.268941432f, 0.0474258736f, 0.000911051233f,
            1.38879437e-11f } },
        { { 0, -0.333333343f, -0.208333328f, 0, 0.291666657f, 0.666666687f, 3, 7, 25 },
          { 0, 0.166666657f, 0.333333313f, 0.5f, 0.666666687f, 0.833333373f, 1.5f, 1, 1 } },
    };
    mlc_tensor *(*const fns[4])(mlc_tensor *) = { mlc_softplus, mlc_relu6, mlc_logsigmoid, mlc_hardswish };
    int k;
    for (k = 0; k < 4; k++) {
        mlc_tensor *x = mlc_requires_grad(T(ctx, xs, 9), 1), *y = fns[k](x);
        CHECK_TENSOR(y, want[k][0], 2e-6);
        CHECK(mlc_backward(mlc_sum_all(y)) == MLC_OK);
        CHECK(mlc_host_grad(x) != NULL);
        {
            mlc_tensor *g = mlc_from_data(ctx, 1, (int[]){ 9 }, mlc_host_grad(x));
            CHECK_TENSOR(g, want[k][1], 2e-6);
        }
    }
    test_destroy(ctx);
    return 1;
}

/* NaN in, NaN out, as in PyTorch (relu(NaN) was 0); the gradient of x^0 is 0, also at 0 */
static int maps_propagate_nan_and_pow_zero_has_zero_gradient(void) {
    mlc_ctx *ctx = test_ctx(1);
    const float nan_in[2] = { NAN, 1.0f }, zeros[2] = { 0.0f, 2.0f }, none[2] = { 0, 0 };
    mlc_tensor *(*const fns[])(mlc_tensor *) = { mlc_relu, mlc_relu6, mlc_hardswish, mlc_softplus, mlc_logsigmoid,
                                                 mlc_sigmoid, mlc_tanh, mlc_silu, mlc_gelu, mlc_abs };
    mlc_tensor *x = T(ctx, nan_in, 2), *p = mlc_requires_grad(T(ctx, zeros, 2), 1), *g;
    size_t k;
    for (k = 0; k < sizeof fns / sizeof fns[0]; k++) {
        mlc_tensor *y = fns[k](x);
        CHECK(y != NULL);
        CHECK_MSG(test_isnan(mlc_host_data(y)[0]), "map %zu of NaN is %g", k, (double)mlc_host_data(y)[0]);
    }
    CHECK(test_isnan(mlc_get(mlc_leaky_relu(x, 0.1f), 0)) && test_isnan(mlc_get(mlc_clamp(x, -1, 1), 0)));
    CHECK(mlc_backward(mlc_sum_all(mlc_pow(p, 0.0f))) == MLC_OK);
    g = mlc_from_data(ctx, 1, (int[]){ 2 }, mlc_host_grad(p));
    CHECK_TENSOR(g, none, 0);
    test_destroy(ctx);
    return 1;
}

/* cumsum along each axis, and its gradient (the reversed running sums), against PyTorch */
static int cumsum_values_and_gradient(void) {
    mlc_ctx *ctx = test_ctx(1);
    const float xs[6] = { 0, 1, 2, 3, 4, 5 }, rows[6] = { 0, 1, 3, 3, 7, 12 }, cols[6] = { 0, 1, 2, 3, 5, 7 };
    const float g_rows[6] = { 3, 2, 1, 3, 2, 1 }, ones[6] = { 1, 1, 1, 1, 1, 1 };
    mlc_tensor *x = mlc_requires_grad(mlc_from_data(ctx, 2, (int[]){ 2, 3 }, xs), 1), *y;
    CHECK_TENSOR(mlc_cumsum(x, 1), rows, 0);
    CHECK_TENSOR(mlc_cumsum(x, -2), cols, 0);
    CHECK(mlc_backward(mlc_sum_all(mlc_cumsum(x, 1))) == MLC_OK);
    CHECK_TENSOR(mlc_from_data(ctx, 2, (int[]){ 2, 3 }, mlc_host_grad(x)), g_rows, 0);
    x = mlc_requires_grad(mlc_from_data(ctx, 2, (int[]){ 2, 3 }, xs), 1);
    y = mlc_slice(mlc_cumsum(x, 0), 0, 1, 2);                       /* only the last row's sums */
    CHECK(mlc_backward(mlc_sum_all(y)) == MLC_OK);
    CHECK_TENSOR(mlc_from_data(ctx, 2, (int[]){ 2, 3 }, mlc_host_grad(x)), ones, 0);
    CHECK(mlc_cumsum(x, 2) == NULL && mlc_error(ctx) == MLC_ERR_INDEX && strstr(mlc_error_message(ctx), "mlc_cumsum"));
    test_destroy(ctx);
    return 1;
}

/* mlc's own exp, tanh and erf (polynomials, no libm) and the sigmoid built on exp, on the CPU,
   within their stated ulp of the function in double: a sweep through each one's range (every
   2^-7 or 2^-9, so the vector loops and their tails both run), tiny values, the edges where
   exp overflows and underflows, and NaN, infinities and -0. erf has no op of its own: GELU's
   is read through the tests' build (test_erf). */
static double sigmoid_double(double x) { return 1.0 / (1.0 + exp(-x)); }
static int maths_within_their_ulp(void) {
    enum { MAX = 60000 };
    static float xs[MAX];
    static const struct {
        const char *name;
        mlc_tensor *(*op)(mlc_tensor *);
        float (*scalar)(float);
        double (*want)(double);
        float from, to, step, ulps;
        int odd;                                 /* f(-0) = -0 */
    } fns[] = {
        { "exp", mlc_exp, NULL, exp, -110.0f, 95.0f, 1.0f / 128, 1.05f, 0 },
        { "tanh", mlc_tanh, NULL, tanh, -12.0f, 12.0f, 1.0f / 128, 3.3f, 1 },
        { "sigmoid", mlc_sigmoid, NULL, sigmoid_double, -110.0f, 110.0f, 1.0f / 128, 2.5f, 0 },
        { "erf", NULL, test_erf, erf, -5.0f, 5.0f, 1.0f / 512, 1.6f, 1 },
    };
    const float special[] = { NAN, INFINITY, -INFINITY, -0.0f, 0.0f, 88.72283f, 88.72284f, -87.33654f,
                              -103.27893f, -103.97208f, -104.0f, 3.921875f, 3.9218748f, 1.0f, 0.99999994f };
#ifdef __FAST_MATH__
    const int fast = 1;           /* -ffast-math: sums reordered, subnormals flushed: 5 ulp, above 1e-30 */
#else
    const int fast = 0;
#endif
    mlc_config c;
    mlc_ctx *ctx;
    size_t f;
    memset(&c, 0, sizeof c);
    c.quiet = 1; c.device = "cpu";           /* the claim is about the CPU's functions */
    ctx = mlc_create(&c);
    for (f = 0; f < sizeof fns / sizeof fns[0]; f++) {
        const float *v;
        mlc_tensor *y = NULL;
        int count = 0, i;
        double worst = 0;
        for (i = 0; fns[f].from + (float)i * fns[f].step <= fns[f].to && count < MAX; i++)
            xs[count++] = fns[f].from + (float)i * fns[f].step;
        for (i = 0; i < 40; i++) xs[count++] = (i % 2 ? -1.0f : 1.0f) * ldexpf(1.37f, -2 * i);   /* to 4e-24 */
        for (i = 0; i < (int)(sizeof special / sizeof special[0]); i++) xs[count++] = special[i];
        if (fns[f].op) {
            y = fns[f].op(mlc_from_data(ctx, MLC_SHAPE(count), xs));
            CHECK_MSG(y != NULL, "%s", fns[f].name);
            v = mlc_host_data(y);
        } else {
            static float got[MAX];
            for (i = 0; i < count; i++) got[i] = fns[f].scalar(xs[i]);
            v = got;
        }
        for (i = 0; i < count; i++) {
            const double want = fns[f].want((double)xs[i]);
            const float rounded = (float)want;
            double ulp, off;
            if (test_isnan(want)) { CHECK_MSG(test_is_nan(v[i]), "%s(NaN) = %.9g", fns[f].name, (double)v[i]); continue; }
            if (!test_isfinite(rounded)) {                   /* beyond FLT_MAX: inf */
                CHECK_MSG(v[i] == rounded, "%s(%.9g) = %.9g, want %.9g", fns[f].name, (double)xs[i], (double)v[i], (double)rounded);
                continue;
            }
            if (fast && fabs(want) < 1e-30) continue;
            ulp = (double)nextafterf(fabsf(rounded), INFINITY) - (double)fabsf(rounded);   /* (in double) */
            off = fabs(v[i] - want) / ulp;
            if (off > worst) worst = off;
            CHECK_MSG(off <= (fast ? 5.0f : fns[f].ulps), "%s(%.9g) = %.9g, want %.9g (%.2f ulp, at most %.2f)",
                      fns[f].name, (double)xs[i], (double)v[i], want, off, (double)fns[f].ulps);
            if (xs[i] == 0.0f && fns[f].odd)
                CHECK_MSG(test_bits(v[i]) == test_bits(xs[i]), "%s(%g) keeps its sign", fns[f].name, (double)xs[i]);
        }
        CHECK_MSG(worst > 0.0, "%s: the sweep compared nothing", fns[f].name);
    }
    mlc_destroy(ctx);
    return 1;
}

static int softmax_axes(void) {
    mlc_ctx *ctx = test_ctx(1);
    const float x[6] = { 1, 2, 3, 1, 4, -1 };
    const float sm_last[6] = { 0.090030573f, 0.24472847f, 0.66524096f, 0.047123417f, 0.94649912f, 0.0063774609f };
    const float lsm_last[6] = { -2.407606f, -1.407606f, -0.40760596f, -3.0549852f, -0.054985235f, -5.0549852f };
    const float sm_0[6] = { 0.5f, 0.11920292f, 0.98201379f, 0.5f, 0.88079708f, 0.01798621f };
    const float lsm_0[6] = { -0.69314718f, -2.126928f, -0.018149928f, -0.69314718f, -0.12692801f, -4.0181499f };
    const float big[3] = { 1000, 1001, 1002 };
    const float sm_big[3] = { 0.090030573f, 0.24472847f, 0.66524096f };
    const float lsm_big[3] = { -2.407606f, -1.407606f, -0.40760596f };
    mlc_tensor *t = T(ctx, x, 2, 3), *r;
    r = mlc_softmax(t, -1);
    CHECK_SHAPE(r, 2, 3);
    CHECK_TENSOR(r, sm_last, 1e-6);
    CHECK_TENSOR(mlc_softmax(t, 1), sm_last, 1e-6);
    CHECK_TENSOR(mlc_log_softmax(t, -1), lsm_last, 1e-5);
    r = mlc_softmax(t, 0);
    CHECK_SHAPE(r, 2, 3);
    CHECK_TENSOR(r, sm_0, 1e-6);
    CHECK_TENSOR(mlc_log_softmax(t, 0), lsm_0, 1e-5);
    r = mlc_softmax(T(ctx, big, 1, 3), -1);             /* no overflow */
    CHECK_TENSOR(r, sm_big, 1e-6);
    r = mlc_log_softmax(T(ctx, big, 1, 3), 1);
    CHECK_TENSOR(r, lsm_big, 1e-5);
    r = mlc_softmax(mlc_mul_scalar(T(ctx, big, 3), -1.0f), 0);   /* -1000.. : no underflow to 0/0 */
    CHECK(r && fabs(mlc_host_data(r)[0] - 0.66524096) < 1e-6 && fabs(mlc_host_data(r)[2] - 0.090030573) < 1e-6);
    CHECK(mlc_softmax(t, 2) == NULL && mlc_error(ctx) == MLC_ERR_INDEX);
    test_destroy(ctx);
    return 1;
}

/* ---- matrix products --------------------------------------------------------------------- */

static int matmul_2d_and_transposes(void) {
    mlc_ctx *ctx = test_ctx(1);
    const float a[6] = { 1, 2, 3, 4, 5, 6 };             /* [2,3] */
    const float at[6] = { 1, 4, 2, 5, 3, 6 };            /* the same, stored [3,2] */
    const float b[12] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12 };   /* [3,4] */
    const float bt[12] = { 1, 5, 9, 2, 6, 10, 3, 7, 11, 4, 8, 12 };  /* the same, stored [4,3] */
    const float want[8] = { 38, 44, 50, 56, 83, 98, 113, 128 };
    mlc_tensor *A = T(ctx, a, 2, 3), *At = T(ctx, at, 3, 2), *B = T(ctx, b, 3, 4), *Bt = T(ctx, bt, 4, 3), *r;
    r = mlc_matmul(A, B);
    CHECK_SHAPE(r, 2, 4);
    CHECK_TENSOR(r, want, 0);
    r = mlc_matmul_t(A, B, 0, 0);
    CHECK_SHAPE(r, 2, 4);
    CHECK_TENSOR(r, want, 0);
    r = mlc_matmul_t(At, B, 1, 0);
    CHECK_SHAPE(r, 2, 4);
    CHECK_TENSOR(r, want, 0);
    r = mlc_matmul_t(A, Bt, 0, 1);
    CHECK_SHAPE(r, 2, 4);
    CHECK_TENSOR(r, want, 0);
    r = mlc_matmul_t(At, Bt, 1, 1);
    CHECK_SHAPE(r, 2, 4);
    CHECK_TENSOR(r, want, 0);
    CHECK(mlc_error(ctx) == MLC_OK);
    CHECK(mlc_matmul(A, Bt) == NULL && mlc_error(ctx) == MLC_ERR_SHAPE);   /* 3 vs 4 */
    test_destroy(ctx);
    return 1;
}

static int matmul_batched_and_broadcast(void) {
    mlc_ctx *ctx = test_ctx(1);
    const float a[12] = { 1, -2, 3, 0, 4, -1, 2, 2, -3, 1, 0, 5 };      /* [2,2,3] */
    const float b[12] = { 1, 2, 3, 4, 5, 6, -1, 0, 2, -2, 1, 3 };       /* [2,3,2] */
    const float bmm[8] = { 10, 12, 7, 10, -1, -13, 4, 15 };
    const float bmm_bcast[8] = { 10, 12, 7, 10, -7, -6, 26, 32 };      /* a @ b[0] */
    const float c[6] = { 1, 2, -1, 0, 3, 1 };                            /* [3,2] */
    const float d[16] = { 1, 0, 2, -1, 3, 1, 0, 2, -2, 1, 1, 0, 0, 4, -1, 2 };   /* [2,2,4] */
    const float cd[24] = { 7, 2, 2, 3, -1, 0, -2, 1, 6, 1, 6, -1,
                           -2, 9, -1, 4, 2, -1, -1, 0, -6, 7, 2, 2 };
    mlc_tensor *r;
    r = mlc_matmul(T(ctx, a, 2, 2, 3), T(ctx, b, 2, 3, 2));
    CHECK_SHAPE(r, 2, 2, 2);
    CHECK_TENSOR(r, bmm, 0);
    r = mlc_matmul(T(ctx, a, 2, 2, 3), T(ctx, b, 3, 2));   /* b[0] as a 2-D [3,2] */
    CHECK_SHAPE(r, 2, 2, 2);
    CHECK_TENSOR(r, bmm_bcast, 0);
    {   /* the same with transposed operands: a stored [2,3,2] per batch, b[0] stored [2,3] */
        const float at[12] = { 1, 0, -2, 4, 3, -1, 2, 1, 2, 0, -3, 5 }, b0t[6] = { 1, 3, 5, 2, 4, 6 };
        r = mlc_matmul_t(T(ctx, at, 2, 3, 2), T(ctx, b, 3, 2), 1, 0);
        CHECK_SHAPE(r, 2, 2, 2);
        CHECK_TENSOR(r, bmm_bcast, 0);
        r = mlc_matmul_t(T(ctx, a, 2, 2, 3), T(ctx, b0t, 2, 3), 0, 1);
        CHECK_SHAPE(r, 2, 2, 2);
        CHECK_TENSOR(r, bmm_bcast, 0);
        r = mlc_matmul_t(T(ctx, at, 2, 3, 2), T(ctx, b, 2, 3, 2), 1, 0);
        CHECK_SHAPE(r, 2, 2, 2);
        CHECK_TENSOR(r, bmm, 0);
    }
    r = mlc_matmul(T(ctx, c, 3, 2), T(ctx, d, 2, 2, 4));
    CHECK_SHAPE(r, 2, 3, 4);
    CHECK_TENSOR(r, cd, 0);
    r = mlc_matmul(T(ctx, a, 1, 2, 2, 3), T(ctx, b, 1, 2, 3, 2));   /* two batch dims */
    CHECK_SHAPE(r, 1, 2, 2, 2);
    CHECK_TENSOR(r, bmm, 0);
    CHECK(mlc_error(ctx) == MLC_OK);
    CHECK(mlc_matmul(T(ctx, a, 2, 2, 3), T(ctx, d, 4, 3, 1)) == NULL);   /* batch [2] vs [4] */
    CHECK(mlc_error(ctx) == MLC_ERR_SHAPE);
    test_destroy(ctx);
    return 1;
}

static int linear_values(void) {
    mlc_ctx *ctx = test_ctx(1);
    const float x[6] = { 1, 2, 3, -1, 0, 2 };
    const float w[12] = { 1, 0, -1, 2, 1, 0, 0, 0, 1, -1, 2, 1 };      /* [4,3] */
    const float b[4] = { 0.5f, -1, 0, 2 };
    const float want[8] = { -1.5f, 3, 3, 8, -2.5f, -3, 2, 5 };
    const float nob[8] = { -2, 4, 3, 6, -3, -2, 2, 3 };
    mlc_tensor *r = mlc_linear(T(ctx, x, 2, 3), T(ctx, w, 4, 3), T(ctx, b, 4));
    CHECK_SHAPE(r, 2, 4);
    CHECK_TENSOR(r, want, 0);
    r = mlc_linear(T(ctx, x, 2, 3), T(ctx, w, 4, 3), NULL);
    CHECK_TENSOR(r, nob, 0);
    r = mlc_linear(T(ctx, x, 2, 1, 3), T(ctx, w, 4, 3), T(ctx, b, 4));   /* leading dims kept */
    CHECK_SHAPE(r, 2, 1, 4);
    CHECK_TENSOR(r, want, 0);
    test_destroy(ctx);
    return 1;
}

/* ---- reductions -------------------------------------------------------------------------- */

static int reductions_each_axis(void) {
    mlc_ctx *ctx = test_ctx(1);
    const float x[12] = { 1, -2, 3, 4, 0, 5, 2, 2, -6, 1, 7, 3 };        /* [2,3,2] */
    static const float want[3][6][6] = {
        {   /* axis 0 -> [3,2] */
            { 3, 0, -3, 5, 7, 8 }, { 1.5f, 0, -1.5f, 2.5f, 3.5f, 4 }, { 2, 2, 3, 4, 7, 5 },
            { 0.5f, 8, 40.5f, 4.5f, 24.5f, 2 }, { 0.25f, 4, 20.25f, 2.25f, 12.25f, 1 }, { 1, 1, 0, 0, 1, 0 } },
        {   /* axis 1 -> [2,2] */
            { 4, 7, 3, 6 }, { 1.3333333f, 2.3333333f, 1, 2 }, { 3, 5, 7, 3 },
            { 2.3333333f, 14.333333f, 43, 1 }, { 1.5555556f, 9.5555556f, 28.666667f, 0.66666667f }, { 1, 2, 2, 2 } },
        {   /* axis 2 -> [2,3] */
            { -1, 7, 5, 4, -5, 10 }, { -0.5f, 3.5f, 2.5f, 2, -2.5f, 5 }, { 1, 4, 5, 2, 1, 7 },
            { 4.5f, 0.5f, 12.5f, 0, 24.5f, 8 }, { 2.25f, 0.25f, 6.25f, 0, 12.25f, 4 }, { 0, 1, 1, 0, 1, 0 } },
    };
    const int dims[3] = { 2, 3, 2 };
    mlc_tensor *t = T(ctx, x, 2, 3, 2);
    int axis, keep, k;
    for (axis = 0; axis < 3; axis++)
        for (keep = 0; keep < 2; keep++)
            for (k = 0; k < 6; k++) {
                int shape[3], nd = 0, d, ax = keep ? axis - 3 : axis;   /* negative axes too */
                mlc_tensor *r;
                if (k == 5 && keep) continue;          /* argmax has no keepdim */
                r = k == 0 ? mlc_sum(t, ax, keep) : k == 1 ? mlc_mean(t, ax, keep) : k == 2 ? mlc_max(t, ax, keep)
                  : k == 3 ? mlc_var(t, ax, keep, 1) : k == 4 ? mlc_var(t, ax, keep, 0) : mlc_argmax(t, ax);
                for (d = 0; d < 3; d++) {
                    if (d != axis) shape[nd++] = dims[d];
                    else if (keep) shape[nd++] = 1;
                }
                CHECK_MSG(r && shape_is(r, nd, shape), "axis %d keepdim %d op %d: wrong shape", axis, keep, k);
                {
                    size_t i;
                    for (i = 0; i < r->size; i++)
                        CHECK_MSG(fabs(mlc_host_data(r)[i] - want[axis][k][i]) <= 1e-5,
                                  "axis %d keepdim %d op %d [%zu]: %g, expected %g", axis, keep, k, i,
                                  (double)mlc_host_data(r)[i], (double)want[axis][k][i]);
                }
            }
    CHECK(mlc_error(ctx) == MLC_OK);
    CHECK(mlc_sum(t, 3, 0) == NULL && mlc_error(ctx) == MLC_ERR_INDEX);
    mlc_clear_error(ctx);
    CHECK(mlc_var(T(ctx, x, 1, 12), 0, 0, 1) == NULL && mlc_error(ctx) == MLC_ERR_SHAPE);   /* one value */
    test_destroy(ctx);
    return 1;
}

static int reductions_all(void) {
    mlc_ctx *ctx = test_ctx(1);
    const float x[12] = { 1, -2, 3, 4, 0, 5, 2, 2, -6, 1, 7, 3 };
    const float ties[4] = { 5, 9, 9, 1 };
    mlc_tensor *t = T(ctx, x, 2, 3, 2), *r;
    r = mlc_sum_all(t);
    CHECK(r && r->size == 1 && r->ndim == 0);
    CHECK_NEAR(mlc_item(r), 20.0, 1e-6);
    r = mlc_mean_all(t);
    CHECK(r && r->ndim == 0);
    CHECK_NEAR(mlc_item(r), 20.0 / 12.0, 1e-6);
    r = mlc_argmax(T(ctx, ties, 4), 0);                 /* the first of equal maxima */
    CHECK(r && r->ndim == 0 && mlc_item(r) == 1.0f);
    r = mlc_max(T(ctx, ties, 2, 2), 1, 1);
    CHECK_SHAPE(r, 2, 1);
    CHECK(mlc_host_data(r)[0] == 9.0f && mlc_host_data(r)[1] == 9.0f);
    {   /* sums are accurate over many small values */
        mlc_tensor *many = mlc_full(ctx, MLC_SHAPE(1000000), 0.1f);
        r = mlc_sum_all(many);
        CHECK_NEAR(mlc_item(r), 1e6 * (double)0.1f, 0.01);   /* a float running sum is off by ~1000 */
        r = mlc_mean_all(many);
        CHECK_NEAR(mlc_item(r), (double)0.1f, 1e-7);
    }
    test_destroy(ctx);
    return 1;
}

/* ---- losses ------------------------------------------------------------------------------ */

static int cross_entropy_values(void) {
    mlc_ctx *ctx = test_ctx(1);
    const float logits[6] = { 1, 2, 3, 1, 2, 3 };
    const float tgt[2] = { 2, 0 }, tgt_ign[2] = { 2, -100 };
    const float none[2] = { 0.40760596f, 2.407606f };
    mlc_tensor *x = T(ctx, logits, 2, 3), *r;
    r = mlc_cross_entropy(x, T(ctx, tgt, 2), MLC_REDUCE_MEAN, MLC_NO_IGNORE);
    CHECK(r && r->ndim == 0 && r->size == 1);
    CHECK_NEAR(mlc_item(r), 1.4076059, 1e-6);           /* PyTorch */
    r = mlc_cross_entropy(x, T(ctx, tgt, 2), MLC_REDUCE_SUM, MLC_NO_IGNORE);
    CHECK_NEAR(mlc_item(r), 2.8152119, 1e-5);
    r = mlc_cross_entropy(x, T(ctx, tgt, 2), MLC_REDUCE_NONE, MLC_NO_IGNORE);
    CHECK_SHAPE(r, 2);
    CHECK_TENSOR(r, none, 1e-6);
    /* ignore_index: the row adds nothing and the mean counts the other rows only */
    r = mlc_cross_entropy(x, T(ctx, tgt_ign, 2), MLC_REDUCE_MEAN, -100);
    CHECK_NEAR(mlc_item(r), 0.40760596, 1e-6);
    r = mlc_cross_entropy(x, T(ctx, tgt_ign, 2), MLC_REDUCE_SUM, -100);
    CHECK_NEAR(mlc_item(r), 0.40760596, 1e-6);
    r = mlc_cross_entropy(x, T(ctx, tgt_ign, 2), MLC_REDUCE_NONE, -100);
    CHECK(r && mlc_host_data(r)[1] == 0.0f);
    CHECK_NEAR(mlc_host_data(r)[0], 0.40760596, 1e-6);
    r = mlc_cross_entropy(x, T(ctx, tgt, 2), MLC_REDUCE_MEAN, 0);   /* a real class ignored */
    CHECK_NEAR(mlc_item(r), 0.40760596, 1e-6);
    {   /* large logits */
        const float big[3] = { 1000, 1001, 1002 }, t0[1] = { 0 };
        r = mlc_cross_entropy(T(ctx, big, 1, 3), T(ctx, t0, 1), MLC_REDUCE_MEAN, MLC_NO_IGNORE);
        CHECK_NEAR(mlc_item(r), 2.407606, 1e-4);
    }
    CHECK(mlc_error(ctx) == MLC_OK);
    {   /* a class out of range is an error */
        const float bad[2] = { 3, 0 };
        CHECK(mlc_cross_entropy(x, T(ctx, bad, 2), MLC_REDUCE_MEAN, MLC_NO_IGNORE) == NULL);
        CHECK(mlc_error(ctx) == MLC_ERR_INDEX);
    }
    test_destroy(ctx);
    return 1;
}

/* label smoothing 0.2 with each reduction, with and without ignore_index 0: the losses and the
   gradients of their sum, from PyTorch 1.13 (F.cross_entropy(x, t, reduction=..., ignore_index=...,
   label_smoothing=0.2), float64, /usr/bin/python3) */
static int cross_entropy_label_smoothing(void) {
    mlc_ctx *ctx = test_ctx(1);
    const float logits[9] = { 1, 2, 3, 1, 2, 3, 0.5f, -1, 2 }, tgt[3] = { 2, 0, 1 };
    static const float loss[2][3][3] = {   /* [ignore][mean, sum, none] */
        { { 1.9188410751819729f }, { 5.756523225545918f }, { 0.6076059644443805f, 2.2076059644443804f,
                                                             2.9413112966571573f } },
        { { 1.774458630550769f }, { 3.548917261101538f }, { 0.6076059644443805f, 0.0f, 2.9413112966571573f } } };
    static const float grad_mean[2][9] = {
        { 0.007787968834571253f, 0.05935393479604365f, -0.06714190363061495f, -0.2588786978320954f,
          0.05935393479604364f, 0.19952476303605166f, 0.036207908491123326f, -0.2758513644653264f,
          0.239643455974203f },
        { 0.011681953251856884f, 0.08903090219406548f, -0.10071285544592246f, 0, 0, 0,
          0.054311862736685014f, -0.41377704669798965f, 0.3594651839613046f } };
    static const float grad_sum[2][9] = {   /* sum and none */
        { 0.02336390650371377f, 0.17806180438813096f, -0.2014257108918449f, -0.7766360934962863f,
          0.17806180438813096f, 0.5985742891081551f, 0.10862372547337003f, -0.8275540933959793f,
          0.7189303679226092f },
        { 0.02336390650371377f, 0.17806180438813096f, -0.2014257108918449f, 0, 0, 0,
          0.10862372547337003f, -0.8275540933959793f, 0.7189303679226092f } };
    int ign, red;
    for (ign = 0; ign < 2; ign++)
        for (red = 0; red < 3; red++) {
            mlc_ce_opts o = { (mlc_reduction)red, ign, 0, 0.2f };
            mlc_tensor *x = mlc_requires_grad(T(ctx, logits, 3, 3), 1), *l;
            l = mlc_cross_entropy_opts(x, T(ctx, tgt, 3), o);
            CHECK(l && l->size == (red == MLC_REDUCE_NONE ? 3u : 1u));
            CHECK_TENSOR(l, loss[ign][red], 1e-5);
            CHECK(mlc_backward(mlc_sum_all(l)) == MLC_OK);
            CHECK_TENSOR(mlc_from_data(ctx, MLC_SHAPE(3, 3), mlc_host_grad(x)),
                         red == MLC_REDUCE_MEAN ? grad_mean[ign] : grad_sum[ign], 1e-6);
        }
    {   /* a zeroed opts struct is mlc_cross_entropy(.., MLC_REDUCE_MEAN, MLC_NO_IGNORE), bit for bit */
        mlc_ce_opts zero = { MLC_REDUCE_MEAN, 0, 0, 0.0f };
        mlc_tensor *x = T(ctx, logits, 3, 3), *t = T(ctx, tgt, 3);
        CHECK(mlc_item(mlc_cross_entropy_opts(x, t, zero)) ==
              mlc_item(mlc_cross_entropy(x, t, MLC_REDUCE_MEAN, MLC_NO_IGNORE)));
        zero.label_smoothing = 1.5f;                    /* outside [0, 1]: an error naming the op */
        CHECK(mlc_cross_entropy_opts(x, t, zero) == NULL && mlc_error(ctx) == MLC_ERR_ARG);
        CHECK(strstr(mlc_error_message(ctx), "mlc_cross_entropy_opts: label_smoothing"));
        mlc_clear_error(ctx);
        zero.label_smoothing = -0.1f;
        CHECK(mlc_cross_entropy_opts(x, t, zero) == NULL && mlc_error(ctx) == MLC_ERR_ARG);
        mlc_clear_error(ctx);
    }
    test_destroy(ctx);
    return 1;
}

static int nll_mse_bce(void) {
    mlc_ctx *ctx = test_ctx(1);
    const float lp[6] = { -1, -2, -3, -0.5f, -1.5f, -2.5f }, t[2] = { 1, 2 };
    const float nll_none[2] = { 2, 2.5f };
    const float p[4] = { 1, 2, 3, 4 }, q[4] = { 1.5f, 2, 1, 6 }, mse_none[4] = { 0.25f, 0, 4, 4 };
    const float bx[5] = { 0, 2, -3, 100, -100 }, bt[5] = { 1, 0, 1, 0, 1 };
    const float bce[5] = { 0.69314718f, 2.126928f, 3.0485874f, 100, 100 };
    const float hx[2] = { 1e4f, -1e4f }, ht[2] = { 0, 0 };
    mlc_tensor *r;
    r = mlc_nll_loss(T(ctx, lp, 2, 3), T(ctx, t, 2), MLC_REDUCE_MEAN, MLC_NO_IGNORE);
    CHECK(r && r->ndim == 0);
    CHECK_NEAR(mlc_item(r), 2.25, 1e-6);
    r = mlc_nll_loss(T(ctx, lp, 2, 3), T(ctx, t, 2), MLC_REDUCE_SUM, MLC_NO_IGNORE);
    CHECK_NEAR(mlc_item(r), 4.5, 1e-6);
    r = mlc_nll_loss(T(ctx, lp, 2, 3), T(ctx, t, 2), MLC_REDUCE_NONE, MLC_NO_IGNORE);
    CHECK_SHAPE(r, 2);
    CHECK_TENSOR(r, nll_none, 0);
    r = mlc_nll_loss(T(ctx, lp, 2, 3), T(ctx, t, 2), MLC_REDUCE_MEAN, 2);
    CHECK_NEAR(mlc_item(r), 2.0, 1e-6);
    r = mlc_mse_loss(T(ctx, p, 2, 2), T(ctx, q, 2, 2), MLC_REDUCE_MEAN);
    CHECK(r && r->ndim == 0);
    CHECK_NEAR(mlc_item(r), 2.0625, 1e-6);
    r = mlc_mse_loss(T(ctx, p, 2, 2), T(ctx, q, 2, 2), MLC_REDUCE_SUM);
    CHECK_NEAR(mlc_item(r), 8.25, 1e-6);
    r = mlc_mse_loss(T(ctx, p, 2, 2), T(ctx, q, 2, 2), MLC_REDUCE_NONE);
    CHECK_SHAPE(r, 2, 2);
    CHECK_TENSOR(r, mse_none, 0);
    r = mlc_bce_with_logits(T(ctx, bx, 5), T(ctx, bt, 5), MLC_REDUCE_NONE);
    CHECK_SHAPE(r, 5);
    CHECK_TENSOR(r, bce, 1e-5);
    r = mlc_bce_with_logits(T(ctx, bx, 5), T(ctx, bt, 5), MLC_REDUCE_MEAN);
    CHECK_NEAR(mlc_item(r), 41.173733, 1e-4);
    r = mlc_bce_with_logits(T(ctx, bx, 5), T(ctx, bt, 5), MLC_REDUCE_SUM);
    CHECK_NEAR(mlc_item(r), 205.86866, 1e-3);
    r = mlc_bce_with_logits(T(ctx, hx, 2), T(ctx, ht, 2), MLC_REDUCE_NONE);   /* no overflow */
    CHECK(r && mlc_host_data(r)[0] == 1e4f && mlc_host_data(r)[1] == 0.0f);
    CHECK(mlc_error(ctx) == MLC_OK);
    CHECK(mlc_mse_loss(T(ctx, p, 4), T(ctx, q, 2, 2), MLC_REDUCE_MEAN) == NULL);
    CHECK(mlc_error(ctx) == MLC_ERR_SHAPE);
    test_destroy(ctx);
    return 1;
}

/* ---- shape ops --------------------------------------------------------------------------- */

static int reshape_flatten_transpose_permute(void) {
    mlc_ctx *ctx = test_ctx(1);
    const float perm[24] = { 0, 4, 8, 12, 16, 20, 1, 5, 9, 13, 17, 21, 2, 6, 10, 14, 18, 22, 3, 7, 11, 15, 19, 23 };
    const float tr02[24] = { 0, 12, 4, 16, 8, 20, 1, 13, 5, 17, 9, 21, 2, 14, 6, 18, 10, 22, 3, 15, 7, 19, 11, 23 };
    const float m[6] = { 1, 2, 3, 4, 5, 6 }, mt[6] = { 1, 4, 2, 5, 3, 6 };
    const int order[3] = { 2, 0, 1 }, neg_order[3] = { -1, 0, -2 };
    mlc_tensor *x = mlc_reshape(mlc_arange(ctx, 0, 24, 1), MLC_SHAPE(2, 3, 4)), *r;
    int i;
    CHECK_SHAPE(x, 2, 3, 4);
    r = mlc_flatten(x, 1);
    CHECK_SHAPE(r, 2, 12);
    for (i = 0; i < 24; i++) CHECK(mlc_host_data(r)[i] == (float)i);
    CHECK_SHAPE(mlc_flatten(x, 0), 24);
    CHECK_SHAPE(mlc_flatten(x, -1), 2, 3, 4);
    r = mlc_transpose(T(ctx, m, 2, 3), 0, 1);
    CHECK_SHAPE(r, 3, 2);
    CHECK_TENSOR(r, mt, 0);
    r = mlc_transpose(T(ctx, m, 2, 3), -1, -2);
    CHECK_TENSOR(r, mt, 0);
    r = mlc_transpose(x, 0, 2);
    CHECK_SHAPE(r, 4, 3, 2);
    CHECK_TENSOR(r, tr02, 0);
    r = mlc_permute(x, order);                          /* y[k,i,j] = x[i,j,k] */
    CHECK_SHAPE(r, 4, 2, 3);
    CHECK_TENSOR(r, perm, 0);
    CHECK(r->data != x->data);                          /* a copy */
    r = mlc_permute(x, neg_order);
    CHECK_SHAPE(r, 4, 2, 3);
    CHECK_TENSOR(r, perm, 0);
    {   /* permuting back gives the input */
        const int back[3] = { 1, 2, 0 };
        r = mlc_permute(mlc_permute(x, order), back);
        CHECK_SHAPE(r, 2, 3, 4);
        for (i = 0; i < 24; i++) CHECK(mlc_host_data(r)[i] == (float)i);
    }
    CHECK(mlc_error(ctx) == MLC_OK);
    {
        const int dup[3] = { 0, 0, 1 };
        CHECK(mlc_permute(x, dup) == NULL && mlc_error(ctx) == MLC_ERR_INDEX);
    }
    test_destroy(ctx);
    return 1;
}

static int slice_values(void) {
    mlc_ctx *ctx = test_ctx(1);
    mlc_tensor *x = mlc_reshape(mlc_arange(ctx, 0, 10, 1), MLC_SHAPE(2, 5)), *r;
    const float s13[4] = { 1, 2, 6, 7 }, tail[4] = { 3, 4, 8, 9 }, head[4] = { 0, 1, 5, 6 };
    const float row1[5] = { 5, 6, 7, 8, 9 }, mid[4] = { 2, 3, 7, 8 };
    r = mlc_slice(x, 1, 1, 3);
    CHECK_SHAPE(r, 2, 2);
    CHECK_TENSOR(r, s13, 0);
    r = mlc_slice(x, 1, -2, 100);                       /* negative start, end clamped */
    CHECK_SHAPE(r, 2, 2);
    CHECK_TENSOR(r, tail, 0);
    r = mlc_slice(x, -1, -100, 2);                      /* start clamped to 0 */
    CHECK_SHAPE(r, 2, 2);
    CHECK_TENSOR(r, head, 0);
    r = mlc_slice(x, 1, -3, -1);                        /* both negative */
    CHECK_SHAPE(r, 2, 2);
    CHECK_TENSOR(r, mid, 0);
    r = mlc_slice(x, 0, 1, 2);
    CHECK_SHAPE(r, 1, 5);
    CHECK_TENSOR(r, row1, 0);
    r = mlc_slice(x, 1, 3, 1);                          /* empty */
    CHECK_SHAPE(r, 2, 0);
    CHECK(r->size == 0);
    r = mlc_slice(x, 0, 5, 9);                          /* start past the end: empty */
    CHECK_SHAPE(r, 0, 5);
    CHECK(mlc_error(ctx) == MLC_OK);
    CHECK(mlc_slice(x, 2, 0, 1) == NULL && mlc_error(ctx) == MLC_ERR_INDEX);
    test_destroy(ctx);
    return 1;
}

static int concat_values(void) {
    mlc_ctx *ctx = test_ctx(1);
    const float a[2] = { 1, 2 }, b[4] = { 3, 4, 5, 6 }, c[2] = { 7, 8 };
    const float rows[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
    const float p[2] = { 1, 2 }, q[4] = { 3, 4, 5, 6 }, s[6] = { 7, 8, 9, 10, 11, 12 };
    const float cols[12] = { 1, 3, 4, 7, 8, 9, 2, 5, 6, 10, 11, 12 };
    mlc_tensor *xs[3], *r;
    xs[0] = T(ctx, a, 1, 2); xs[1] = T(ctx, b, 2, 2); xs[2] = T(ctx, c, 1, 2);
    r = mlc_concat(ctx, xs, 3, 0);
    CHECK_SHAPE(r, 4, 2);
    CHECK_TENSOR(r, rows, 0);
    xs[0] = T(ctx, p, 2, 1); xs[1] = T(ctx, q, 2, 2); xs[2] = T(ctx, s, 2, 3);
    r = mlc_concat(ctx, xs, 3, 1);
    CHECK_SHAPE(r, 2, 6);
    CHECK_TENSOR(r, cols, 0);
    r = mlc_concat(ctx, xs, 3, -1);
    CHECK_SHAPE(r, 2, 6);
    CHECK_TENSOR(r, cols, 0);
    CHECK(mlc_error(ctx) == MLC_OK);
    CHECK(mlc_concat(ctx, xs, 3, 0) == NULL && mlc_error(ctx) == MLC_ERR_SHAPE);   /* widths differ */
    test_destroy(ctx);
    return 1;
}

static int index_select_gather_copy(void) {
    mlc_ctx *ctx = test_ctx(1);
    mlc_tensor *x = mlc_reshape(mlc_arange(ctx, 0, 12, 1), MLC_SHAPE(3, 4)), *r;
    const float i0[3] = { 2, 0, 2 }, rows[12] = { 8, 9, 10, 11, 0, 1, 2, 3, 8, 9, 10, 11 };
    const float i1[2] = { 3, 1 }, cols[6] = { 3, 1, 7, 5, 11, 9 };
    const float g[6] = { 1, 2, 3, 4, 5, 6 }, gi[4] = { 2, 0, 1, 1 }, gw[4] = { 3, 1, 5, 5 };
    const float gi_small[2] = { 0, 2 }, gw_small[2] = { 1, 3 };
    const float gi0[3] = { 1, 0, 1 }, gw0[3] = { 4, 2, 6 };
    const float bad[1] = { 3 }, frac[1] = { 0.5f };
    r = mlc_index_select(x, 0, T(ctx, i0, 3));
    CHECK_SHAPE(r, 3, 4);
    CHECK_TENSOR(r, rows, 0);
    r = mlc_index_select(x, 1, T(ctx, i1, 2));
    CHECK_SHAPE(r, 3, 2);
    CHECK_TENSOR(r, cols, 0);
    r = mlc_index_select(x, -1, T(ctx, i1, 2));
    CHECK_TENSOR(r, cols, 0);
    /* gather along axis 1: out[i][j] = x[i][index[i][j]] */
    r = mlc_gather(T(ctx, g, 2, 3), 1, T(ctx, gi, 2, 2));
    CHECK_SHAPE(r, 2, 2);
    CHECK_TENSOR(r, gw, 0);
    r = mlc_gather(T(ctx, g, 2, 3), 1, T(ctx, gi_small, 1, 2));   /* index smaller than x */
    CHECK_SHAPE(r, 1, 2);
    CHECK_TENSOR(r, gw_small, 0);
    r = mlc_gather(T(ctx, g, 2, 3), 0, T(ctx, gi0, 1, 3));        /* out[0][j] = x[index[0][j]][j] */
    CHECK_SHAPE(r, 1, 3);
    CHECK_TENSOR(r, gw0, 0);
    /* copy: same values, its own storage */
    r = mlc_copy(x);
    CHECK_SHAPE(r, 3, 4);
    CHECK(r->data != x->data && memcmp(mlc_host_data(r), mlc_host_data(x), 12 * sizeof(float)) == 0);
    { float v[12]; memcpy(v, mlc_host_data(r), sizeof v); v[0] = 42.0f;
      CHECK(mlc_write(r, v, 12) == MLC_OK); }
    CHECK(mlc_host_data(x)[0] == 0.0f && mlc_item(mlc_sum_all(x)) == 66.0f);   /* x on either side */
    CHECK(mlc_error(ctx) == MLC_OK);
    CHECK(mlc_index_select(x, 0, T(ctx, bad, 1)) == NULL && mlc_error(ctx) == MLC_ERR_INDEX);
    mlc_clear_error(ctx);
    CHECK(mlc_gather(x, 1, mlc_reshape(T(ctx, frac, 1), MLC_SHAPE(1, 1))) == NULL && mlc_error(ctx) == MLC_ERR_INDEX);
    test_destroy(ctx);
    return 1;
}

/* ---- neural-network ops ------------------------------------------------------------------ */

static int dropout_values(void) {
    mlc_ctx *ctx = test_ctx(3);
    mlc_tensor *x = mlc_full(ctx, MLC_SHAPE(100, 100), 1.0f), *r;
    size_t i, zeros = 0;
    r = mlc_dropout(x, 0.5f, 0);                        /* eval: the input unchanged */
    CHECK_SHAPE(r, 100, 100);
    for (i = 0; i < r->size; i++) CHECK(mlc_host_data(r)[i] == 1.0f);
    r = mlc_dropout(x, 0.0f, 1);                        /* p = 0: unchanged too */
    for (i = 0; i < r->size; i++) CHECK(mlc_host_data(r)[i] == 1.0f);
    r = mlc_dropout(x, 0.5f, 1);
    CHECK_SHAPE(r, 100, 100);
    for (i = 0; i < r->size; i++) {
        CHECK_MSG(mlc_host_data(r)[i] == 0.0f || mlc_host_data(r)[i] == 2.0f, "[%zu] = %g", i, (double)mlc_host_data(r)[i]);
        zeros += mlc_host_data(r)[i] == 0.0f;
    }
    CHECK_MSG(zeros > 4700 && zeros < 5300, "%zu of 10000 dropped", zeros);   /* std 50 */
    for (i = 0; i < x->size; i++) CHECK(mlc_host_data(x)[i] == 1.0f);
    zeros = 0;
    r = mlc_dropout(x, 0.2f, 1);
    for (i = 0; i < r->size; i++) {
        CHECK(mlc_host_data(r)[i] == 0.0f || fabs(mlc_host_data(r)[i] - 1.25) < 1e-6);
        zeros += mlc_host_data(r)[i] == 0.0f;
    }
    CHECK_MSG(zeros > 1800 && zeros < 2200, "%zu of 10000 dropped at p = 0.2", zeros);   /* std 40 */
    r = mlc_dropout(x, 1.0f, 1);
    for (i = 0; i < r->size; i++) CHECK(mlc_host_data(r)[i] == 0.0f);
    CHECK(mlc_error(ctx) == MLC_OK);
    CHECK(mlc_dropout(x, 1.5f, 1) == NULL && mlc_error(ctx) == MLC_ERR_ARG);
    test_destroy(ctx);
    return 1;
}

static int layer_norm_values(void) {
    mlc_ctx *ctx = test_ctx(1);
    const float x[8] = { 1, 2, 3, 4, -3, 0, 0, 7 };
    const float w[4] = { 1, 2, 0.5f, -1 }, b[4] = { 0, 1, 0, 2 };
    const float want[8] = { -1.3416354f, 0.10557639f, 0.2236059f, 0.65836458f,
                            -1.0886617f, 0.45566915f, -0.13608271f, 0.36700744f };
    const float plain[8] = { -1.3416354f, -0.44721181f, 0.44721181f, 1.3416354f,
                             -1.0886617f, -0.27216543f, -0.27216543f, 1.6329926f };
    mlc_tensor *r = mlc_layer_norm(T(ctx, x, 2, 4), T(ctx, w, 4), T(ctx, b, 4), 1e-5f);
    CHECK_SHAPE(r, 2, 4);
    CHECK_TENSOR(r, want, 1e-5);
    r = mlc_layer_norm(T(ctx, x, 2, 4), NULL, NULL, 1e-5f);
    CHECK_TENSOR(r, plain, 1e-5);
    r = mlc_layer_norm(T(ctx, x, 2, 1, 4), NULL, NULL, 0.0f);   /* eps 0: the default 1e-5 */
    CHECK_SHAPE(r, 2, 1, 4);
    CHECK_TENSOR(r, plain, 1e-5);
    CHECK(mlc_layer_norm(T(ctx, x, 4, 2), T(ctx, w, 4), NULL, 1e-5f) == NULL && mlc_error(ctx) == MLC_ERR_SHAPE);
    mlc_clear_error(ctx);
    {   /* gradients of Σ y with a constant row (variance 0): eps keeps its x̂ at 0, so it adds nothing
           to dw (0 · ∞ = NaN without eps); dw = the first row's x̂, db = 2 (two rows of g = 1) */
        const float flat[8] = { 1, 2, 3, 4, 5, 5, 5, 5 }, twos[4] = { 2, 2, 2, 2 };
        mlc_tensor *wt = mlc_requires_grad(T(ctx, w, 4), 1), *bt = mlc_requires_grad(T(ctx, b, 4), 1);
        CHECK(mlc_backward(mlc_sum_all(mlc_layer_norm(T(ctx, flat, 2, 4), wt, bt, 1e-5f))) == MLC_OK);
        CHECK_TENSOR(mlc_from_data(ctx, 1, wt->shape, mlc_host_grad(wt)), plain, 1e-5);
        CHECK_TENSOR(mlc_from_data(ctx, 1, bt->shape, mlc_host_grad(bt)), twos, 1e-6);
    }
    test_destroy(ctx);
    return 1;
}

/* over the last two axes: F.layer_norm(x, (3, 4), w, b, 1e-5) in PyTorch 1.13, and the gradients of
   sum(y * g), g = arange(24) / 10 - 1 (values printed by torch, pasted here) */
static int layer_norm_over_two_axes(void) {
    mlc_ctx *ctx = test_ctx(1);
    static const float x[24] = { 0.5f, -1, 2, 0, 1.5f, 0.25f, -0.75f, 3, -2, 1, 0.5f, -0.5f,
                                 1, 2, 3, 4, 0, -1, 0.5f, 2.5f, 1.25f, -0.25f, 0.75f, -1.5f };
    static const float w[12] = { 1, 0.5f, -1, 2, 0.25f, 1.5f, 1, -0.5f, 2, 1, 0.5f, 1 };
    static const float b[12] = { 0, 0.1f, -0.2f, 0.3f, 0.5f, 0, 0.25f, -0.25f, 1, -1, 0, 0.5f };
    static const float want[24] = { 0.09463179f, -0.4204748f, -1.430213f, -0.2677906f, 0.7129215f, -0.1419476f,
        -0.601686f, -1.243634f, -2.596007f, -0.5268411f, 0.0473159f, -0.1624224f, -0.01330256f, 0.4126111f,
        -1.463747f, 4.104543f, 0.3370432f, -1.935528f, -0.08256492f, -0.7222422f, 1.292657f, -1.811458f,
        -0.08646687f, -1.109614f };
    static const float want_gx[24] = { -0.5475082f, 0.07971559f, 0.6043453f, -0.7800486f, -0.04457492f,
        -0.3231041f, 0.08242762f, -0.0283027f, 0.258131f, 0.06355913f, 0.2095459f, 0.4258141f, -0.2738164f,
        -0.1884562f, -0.4223583f, 0.5888627f, -0.4230292f, 0.03435659f, 0.05065507f, -0.5129278f, 0.9048496f,
        0.1542476f, -0.04772818f, 0.1353445f };
    static const float want_gw[12] = { -0.0972923f, 1.124421f, -0.4786718f, 1.149863f, -0.902108f, -0.8559306f,
        0.07462245f, 0.2538558f, 0.5059294f, -0.9399201f, -0.2075205f, -2.158741f };
    float g[24];
    mlc_tensor *xt, *wt, *bt, *y;
    mlc_module *m;
    int i;
    for (i = 0; i < 24; i++) g[i] = (float)i / 10.0f - 1.0f;
    xt = mlc_requires_grad(T(ctx, x, 2, 3, 4), 1);
    wt = mlc_requires_grad(T(ctx, w, 3, 4), 1);
    bt = mlc_requires_grad(T(ctx, b, 3, 4), 1);
    y = mlc_layer_norm_dims(xt, 2, wt, bt, 1e-5f);
    CHECK_SHAPE(y, 2, 3, 4);
    CHECK_TENSOR(y, want, 2e-5);
    CHECK(mlc_backward(mlc_sum_all(mlc_mul(y, T(ctx, g, 2, 3, 4)))) == MLC_OK);
    { mlc_tensor *gx = mlc_from_data(ctx, 3, xt->shape, mlc_host_grad(xt)); CHECK_TENSOR(gx, want_gx, 2e-5); }
    { mlc_tensor *gw = mlc_from_data(ctx, 2, wt->shape, mlc_host_grad(wt)); CHECK_TENSOR(gw, want_gw, 2e-5); }
    /* the module: nn.LayerNorm((3, 4)) with weight and bias of that shape */
    m = mlc_nn_layer_norm_shape(ctx, 2, (const int[]){ 3, 4 });
    CHECK(m && m->params[0]->ndim == 2 && m->params[0]->shape[0] == 3 && m->params[1]->shape[1] == 4);
    CHECK(mlc_write(m->params[0], w, 12) == MLC_OK && mlc_write(m->params[1], b, 12) == MLC_OK);
    CHECK_TENSOR(mlc_forward(m, T(ctx, x, 2, 3, 4)), want, 2e-5);
    /* weight of the wrong shape, too many axes */
    CHECK(mlc_layer_norm_dims(T(ctx, x, 2, 3, 4), 2, T(ctx, w, 12), NULL, 1e-5f) == NULL
          && mlc_error(ctx) == MLC_ERR_SHAPE && strstr(mlc_error_message(ctx), "mlc_layer_norm"));
    mlc_clear_error(ctx);
    CHECK(mlc_layer_norm_dims(T(ctx, x, 2, 3, 4), 4, NULL, NULL, 1e-5f) == NULL && mlc_error(ctx) == MLC_ERR_SHAPE);
    test_destroy(ctx);
    return 1;
}

static int batch_norm_training(void) {
    mlc_ctx *ctx = test_ctx(1);
    /* [4,2]: channel 0 = 1,3,5,7 (mean 4, var 5), channel 1 = 2,6,10,14 (mean 8, var 20) */
    const float x[8] = { 1, 2, 3, 6, 5, 10, 7, 14 };
    const float w[2] = { 1.5f, -1 }, b[2] = { 0.5f, 2 };
    const float zero2[2] = { 0, 0 }, one2[2] = { 1, 1 };
    const float want[8] = { -1.5124592f, 3.3416405f, -0.17081972f, 2.4472135f,
                            1.1708197f, 1.5527865f, 2.5124592f, 0.65835955f };
    const float rm_want[2] = { 0.4f, 0.8f };                  /* 0.9·0 + 0.1·mean */
    const float rv_want[2] = { 1.5666667f, 3.5666667f };      /* 0.9·1 + 0.1·unbiased var */
    /* [2,2,2,2] */
    const float x4[16] = { 0, -1, 0, 2, 0, 0, 1, -2, -3, 4, 0, -2, 4, -1, -4, 1 };
    const float want4[16] = { 0, -0.48507068f, 0, 0.97014136f, 0.056704739f, 0.056704739f, 0.51034265f, -0.85057109f,
                              -1.455212f, 1.9402827f, 0, -0.97014136f, 1.8712564f, -0.39693318f, -1.7578469f, 0.51034265f };
    const float rm4[2] = { 0, -0.0125f }, rv4[2] = { 1.3857143f, 1.4553571f };
    mlc_tensor *rm = T(ctx, zero2, 2), *rv = T(ctx, one2, 2), *r;
    int c;
    r = mlc_batch_norm(T(ctx, x, 4, 2), rm, rv, T(ctx, w, 2), T(ctx, b, 2), 1, 0.1f, 1e-5f);
    CHECK_SHAPE(r, 4, 2);
    CHECK_TENSOR(r, want, 1e-5);
    CHECK_TENSOR(rm, rm_want, 1e-6);
    CHECK_TENSOR(rv, rv_want, 1e-5);
    /* the batch statistics by an independent loop: the output has mean b and std |w| */
    for (c = 0; c < 2; c++) {
        double s = 0, s2 = 0;
        int i;
        for (i = 0; i < 4; i++) { s += mlc_host_data(r)[i * 2 + c]; s2 += mlc_host_data(r)[i * 2 + c] * mlc_host_data(r)[i * 2 + c]; }
        CHECK_NEAR(s / 4, b[c], 1e-5);
        CHECK_NEAR(sqrt(s2 / 4 - (s / 4) * (s / 4)), fabs(w[c]), 1e-4);
    }
    rm = T(ctx, zero2, 2); rv = T(ctx, one2, 2);
    r = mlc_batch_norm(T(ctx, x4, 2, 2, 2, 2), rm, rv, NULL, NULL, 1, 0.0f, 0.0f);  /* defaults 0.1, 1e-5 */
    CHECK_SHAPE(r, 2, 2, 2, 2);
    CHECK_TENSOR(r, want4, 1e-5);
    CHECK_TENSOR(rm, rm4, 1e-6);
    CHECK_TENSOR(rv, rv4, 1e-5);
    r = mlc_batch_norm(T(ctx, x4, 2, 2, 2, 2), NULL, NULL, NULL, NULL, 1, 0.1f, 1e-5f);   /* no running stats */
    CHECK_TENSOR(r, want4, 1e-5);
    CHECK(mlc_error(ctx) == MLC_OK);
    test_destroy(ctx);
    return 1;
}

/* Batch statistics keep their digits where a float sum would not: channels far from 0 (mean
   1e4 + c, standard deviation 0.5 + c), runs longer than one block of the statistics (2500
   values a run) and shorter ones (7), against sums in long double here. With momentum 1 the
   running statistics are the batch's mean and unbiased variance. */
static int batch_norm_statistics_keep_their_digits(void) {
    static const int shapes[2][3] = { { 3, 2, 2500 }, { 40, 3, 7 } };
    mlc_ctx *ctx = test_ctx(2);
    int k;
    for (k = 0; k < 2; k++) {
        const int N = shapes[k][0], C = shapes[k][1], inner = shapes[k][2];
        mlc_tensor *x = mlc_randn(ctx, MLC_SHAPE(N, C, inner));
        mlc_tensor *rm = mlc_zeros(ctx, MLC_SHAPE(C)), *rv = mlc_zeros(ctx, MLC_SHAPE(C));
        float *v;
        int c, i, j;
        CHECK(x && rm && rv);
        v = mlc_host_data(x);
        for (i = 0; i < N; i++)
            for (c = 0; c < C; c++)
                for (j = 0; j < inner; j++) {
                    float *at = v + ((size_t)i * C + c) * inner + j;
                    *at = 1e4f + (float)c + (0.5f + (float)c) * *at;
                }
        CHECK(mlc_batch_norm(x, rm, rv, NULL, NULL, 1, 1.0f, 1e-5f) != NULL);
        for (c = 0; c < C; c++) {
            long double s = 0, d = 0, mean;
            for (i = 0; i < N; i++)
                for (j = 0; j < inner; j++) s += v[((size_t)i * C + c) * inner + j];
            mean = s / (N * inner);
            for (i = 0; i < N; i++)
                for (j = 0; j < inner; j++) {
                    long double e = v[((size_t)i * C + c) * inner + j] - mean;
                    d += e * e;
                }
            CHECK_MSG(fabs((double)(mlc_host_data(rm)[c] - mean)) <= 1e-7 * 1e4,
                      "shape %d channel %d: mean %.9g, want %.9g", k, c, (double)mlc_host_data(rm)[c], (double)mean);
            CHECK_MSG(fabs((double)(mlc_host_data(rv)[c] - d / (N * inner - 1))) <= 2e-6 * (double)(d / (N * inner - 1)),
                      "shape %d channel %d: variance %.9g, want %.9g", k, c, (double)mlc_host_data(rv)[c],
                      (double)(d / (N * inner - 1)));
        }
    }
    CHECK(mlc_error(ctx) == MLC_OK);
    test_destroy(ctx);
    return 1;
}

static int batch_norm_eval(void) {
    mlc_ctx *ctx = test_ctx(1);
    const float x[8] = { 1, 2, 3, 6, 5, 10, 7, 14 };
    const float m[2] = { 1, -1 }, v[2] = { 4, 0.25f }, w[2] = { 2, 1 }, b[2] = { 0.5f, 0 };
    /* (x - m) / sqrt(v + 1e-5) · w + b */
    const float want[8] = { 0.5f, 5.99988f, 2.4999975f, 13.99972f, 4.499995f, 21.99956f, 6.4999925f, 29.9994f };
    mlc_tensor *rm = T(ctx, m, 2), *rv = T(ctx, v, 2), *r;
    r = mlc_batch_norm(T(ctx, x, 4, 2), rm, rv, T(ctx, w, 2), T(ctx, b, 2), 0, 0.1f, 1e-5f);
    CHECK_SHAPE(r, 4, 2);
    CHECK_TENSOR(r, want, 1e-4);
    CHECK(mlc_host_data(rm)[0] == 1.0f && mlc_host_data(rm)[1] == -1.0f && mlc_host_data(rv)[0] == 4.0f && mlc_host_data(rv)[1] == 0.25f);
    CHECK(mlc_batch_norm(T(ctx, x, 4, 2), NULL, NULL, NULL, NULL, 0, 0.1f, 1e-5f) == NULL);
    CHECK(mlc_error(ctx) == MLC_ERR_ARG);
    test_destroy(ctx);
    return 1;
}

static int embedding_values(void) {
    mlc_ctx *ctx = test_ctx(1);
    mlc_tensor *w = mlc_reshape(mlc_arange(ctx, 0, 12, 1), MLC_SHAPE(4, 3)), *r;
    const float idx[4] = { 3, 0, 1, 3 }, bad[1] = { 4 };
    const float want[12] = { 9, 10, 11, 0, 1, 2, 3, 4, 5, 9, 10, 11 };
    r = mlc_embedding(w, T(ctx, idx, 2, 2));
    CHECK_SHAPE(r, 2, 2, 3);
    CHECK_TENSOR(r, want, 0);
    r = mlc_embedding(w, T(ctx, idx, 4));
    CHECK_SHAPE(r, 4, 3);
    CHECK_TENSOR(r, want, 0);
    CHECK(mlc_embedding(w, T(ctx, bad, 1)) == NULL && mlc_error(ctx) == MLC_ERR_INDEX);
    test_destroy(ctx);
    return 1;
}

/* ---- convolution and pooling ------------------------------------------------------------- */

static mlc_conv_opts conv_opts(int stride, int padding, int dilation, int groups) {
    mlc_conv_opts o = { 0 };
    o.stride = stride; o.padding = padding; o.dilation = dilation; o.groups = groups;
    return o;
}

static int conv2d_hand_values(void) {
    mlc_ctx *ctx = test_ctx(1);
    const float k[4] = { 1, 2, 3, 4 };
    const float plain[4] = { 37, 47, 67, 77 };        /* 1·1+2·2+3·4+4·5, ... */
    const float strided[4] = { 4, 18, 36, 77 };       /* stride 2, padding 1 */
    const float dilated[4] = { 78, 88, 118, 128 };    /* 4x4 input, dilation 2 */
    mlc_tensor *x3 = mlc_reshape(mlc_arange(ctx, 1, 10, 1), MLC_SHAPE(1, 1, 3, 3));
    mlc_tensor *x4 = mlc_reshape(mlc_arange(ctx, 1, 17, 1), MLC_SHAPE(1, 1, 4, 4));
    mlc_tensor *w = T(ctx, k, 1, 1, 2, 2), *r;
    const float bias1[1] = { -10 };
    r = mlc_conv2d(x3, w, NULL, conv_opts(0, 0, 0, 0));
    CHECK_SHAPE(r, 1, 1, 2, 2);
    CHECK_TENSOR(r, plain, 0);
    r = mlc_conv2d(x3, w, NULL, conv_opts(2, 1, 1, 1));
    CHECK_SHAPE(r, 1, 1, 2, 2);
    CHECK_TENSOR(r, strided, 0);
    r = mlc_conv2d(x4, w, NULL, conv_opts(1, 0, 2, 1));
    CHECK_SHAPE(r, 1, 1, 2, 2);
    CHECK_TENSOR(r, dilated, 0);
    r = mlc_conv2d(x3, w, NULL, conv_opts(1, 0, 2, 1));   /* 3x3 input, dilation 2: one output */
    CHECK_SHAPE(r, 1, 1, 1, 1);
    CHECK(mlc_host_data(r)[0] == 64.0f);                        /* 1·1 + 3·2 + 7·3 + 9·4 */
    r = mlc_conv2d(x3, w, T(ctx, bias1, 1), conv_opts(0, 0, 0, 0));
    CHECK(r && mlc_host_data(r)[0] == 27.0f && mlc_host_data(r)[3] == 67.0f);
    CHECK(mlc_error(ctx) == MLC_OK);
    test_destroy(ctx);
    return 1;
}

static int conv2d_groups_bias(void) {
    mlc_ctx *ctx = test_ctx(1);
    /* x [1,4,3,3], values (i·7 mod 11) - 5 */
    float x[36], wg[16], wg4[32];
    const float g2[8] = { 29, -25, -1, -11, -2, 1, 29, -23 };
    const float g2o4[16] = { 15, -10, -5, -30, -20, -20, 2, 2, 22, -30, 20, -10, 17, -12, 7, 0 };
    const float wd[12] = { 1, 0, 0, -1, 2, 1, 1, 2, 0, -1, 1, 0 };
    const float dw[12] = { -6, 5, 5, 5, 3, 1, -3, 6, 3, -8, 3, 3 };
    const float bias[2] = { 0.5f, -1.5f };
    const float biased[8] = { 29.5f, -24.5f, -0.5f, -10.5f, -24.5f, 11.5f, -4.5f, -1.5f };
    mlc_tensor *r;
    int i;
    for (i = 0; i < 36; i++) x[i] = (float)((i * 7) % 11 - 5);
    for (i = 0; i < 16; i++) wg[i] = (float)((i * 5) % 7 - 3);
    for (i = 0; i < 32; i++) wg4[i] = (float)((i * 3) % 5 - 2);
    r = mlc_conv2d(T(ctx, x, 1, 4, 3, 3), T(ctx, wg, 2, 2, 2, 2), NULL, conv_opts(1, 0, 1, 2));
    CHECK_SHAPE(r, 1, 2, 2, 2);
    CHECK_TENSOR(r, g2, 0);
    r = mlc_conv2d(T(ctx, x, 1, 4, 3, 3), T(ctx, wg4, 4, 2, 2, 2), NULL, conv_opts(1, 0, 1, 2));
    CHECK_SHAPE(r, 1, 4, 2, 2);
    CHECK_TENSOR(r, g2o4, 0);
    r = mlc_conv2d(T(ctx, x, 1, 3, 3, 3), T(ctx, wd, 3, 1, 2, 2), NULL, conv_opts(1, 0, 1, 3));   /* depthwise */
    CHECK_SHAPE(r, 1, 3, 2, 2);
    CHECK_TENSOR(r, dw, 0);
    r = mlc_conv2d(T(ctx, x, 1, 2, 3, 3), T(ctx, wg, 2, 2, 2, 2), T(ctx, bias, 2), conv_opts(1, 0, 1, 1));
    CHECK_SHAPE(r, 1, 2, 2, 2);
    CHECK_TENSOR(r, biased, 0);
    CHECK(mlc_error(ctx) == MLC_OK);
    CHECK(mlc_conv2d(T(ctx, x, 1, 4, 3, 3), T(ctx, wg, 2, 2, 2, 2), NULL, conv_opts(1, 0, 1, 3)) == NULL);
    CHECK(mlc_error(ctx) == MLC_ERR_SHAPE);            /* 4 channels do not split into 3 groups */
    test_destroy(ctx);
    return 1;
}

/* Separate height and width options: F.conv2d(x, w, b, stride=(2, 1), padding=(1, 0),
   dilation=(1, 2), groups=2) and the gradients of sum(y * g), g = 1, 2, ..., computed by
   PyTorch 1.13 (python3-torch) and pasted here. x [1, 4, 5, 6] (i·7 mod 11) - 5, w [4, 2, 3, 2]
   (i·5 mod 7) - 3, b = 0.5, -1, 1.5, 0. */
static int conv2d_height_width(void) {
    mlc_ctx *ctx = test_ctx(1);
    static const float want[48] = {
        -14.5f, 9.5f, -10.5f, -19.5f, -6.5f, -17.5f, -6.5f, -6.5f, -10.5f, 9.5f, -14.5f, -5.5f, 35, 11, -2, 7,
        31, 2, -5, -1, 6, -23, 3, 7, 11.5f, 37.5f, 8.5f, -20.5f, 43.5f, 29.5f, -17.5f, -9.5f, 26.5f, -7.5f,
        2.5f, 1.5f, -12, -13, -3, -4, -13, -18, -1, 16, -14, 8, 8, 8 };
    static const float want_gx[120] = {
        -39, -42, -21, -24, 24, 24, 5, 6, -25, -24, -32, -32, -51, -54, -33, -36, 24, 24, 9, 10, -21, -20,
        -32, -32, -63, -66, -45, -48, 24, 24, -11, -10, -48, -50, -45, -48, 70, 72, 79, 82, 7, 8, -7, -6,
        -56, -58, -57, -60, 78, 80, 91, 94, 11, 12, -3, -2, -64, -66, -69, -72, -49, -50, 35, 36, 90, 92,
        -14, -16, 82, 84, 108, 112, -53, -54, 39, 40, 98, 100, -22, -24, 90, 92, 124, 128, -57, -58, 43, 44,
        106, 108, 75, 78, 32, 34, -51, -52, -37, -38, -53, -56, -18, -20, 87, 90, 40, 42, -55, -56, -41,
        -42, -65, -68, -26, -28, 99, 102, 48, 50, -59, -60 };
    static const float want_gw[48] = {
        -3, -63, 61, 64, -7, -31, 65, 5, -92, 65, 29, 5, 9, -159, 145, 184, 5, -127, 173, 5, -260, 65, 137,
        5, 222, 265, -62, -306, 198, 233, -255, -168, 304, 60, -223, -144, 294, 361, -86, -426, 270, 329,
        -351, -240, 424, 84, -319, -216 };
    static const float want_gb[4] = { 78, 222, 366, 510 };
    const mlc_conv_opts opts = { .stride = 2, .padding = 1, .groups = 2, .stride_w = 1,
                                 .padding_w = MLC_ZERO_INT, .dilation_w = 2 };
    const float bias[4] = { 0.5f, -1, 1.5f, 0 };
    float xs[120], ws[48], gs[48];
    mlc_tensor *x, *w, *b, *y;
    int i;
    for (i = 0; i < 120; i++) xs[i] = (float)((i * 7) % 11 - 5);
    for (i = 0; i < 48; i++) { ws[i] = (float)((i * 5) % 7 - 3); gs[i] = (float)(i + 1); }
    x = mlc_requires_grad(T(ctx, xs, 1, 4, 5, 6), 1);
    w = mlc_requires_grad(T(ctx, ws, 4, 2, 3, 2), 1);
    b = mlc_requires_grad(T(ctx, bias, 4), 1);
    y = mlc_conv2d(x, w, b, opts);
    CHECK_SHAPE(y, 1, 4, 3, 4);
    CHECK_TENSOR(y, want, 0);
    CHECK(mlc_backward_with(y, T(ctx, gs, 1, 4, 3, 4)) == MLC_OK);
    CHECK_TENSOR(mlc_from_data(ctx, 4, x->shape, mlc_host_grad(x)), want_gx, 0);
    CHECK_TENSOR(mlc_from_data(ctx, 4, w->shape, mlc_host_grad(w)), want_gw, 0);
    CHECK_TENSOR(mlc_from_data(ctx, 1, b->shape, mlc_host_grad(b)), want_gb, 0);
    {   /* the width's fields left 0 take the height's; a module keeps its options */
        const mlc_conv_opts same = { .stride = 2, .padding = 1, .dilation = 2, .groups = 2, .stride_w = 2,
                                     .padding_w = 1, .dilation_w = 2 },
                            old = { .stride = 2, .padding = 1, .dilation = 2, .groups = 2 };
        mlc_module *m = mlc_nn_conv2d(ctx, 4, 4, 3, opts);
        mlc_tensor *a = mlc_conv2d(x, w, NULL, same), *c = mlc_conv2d(x, w, NULL, old);
        CHECK_MSG(a && c && m, "%s", mlc_error_message(ctx));
        CHECK_TENSOR(c, mlc_host_data(a), 0);
        CHECK_SHAPE(mlc_forward(m, x), 1, 4, 3, 2);
        CHECK(mlc_conv2d(x, w, NULL, (mlc_conv_opts){ .padding_w = -2 }) == NULL);   /* -1 is MLC_ZERO_INT */
        CHECK(mlc_error(ctx) == MLC_ERR_ARG && strstr(mlc_error_message(ctx), "padding (0, -2)"));
        mlc_clear_error(ctx);
    }
    CHECK(mlc_error(ctx) == MLC_OK);
    test_destroy(ctx);
    return 1;
}

/* The direct seven-loop convolution, in double. */
static void conv_direct(const float *x, const float *w, const float *b, double *y, int N, int C, int H, int W,
                        int O, int KH, int KW, int s, int p, int d, int g, int OH, int OW) {
    int n, o, oh, ow, c, i, j, Cg = C / g, Og = O / g;
    for (n = 0; n < N; n++)
        for (o = 0; o < O; o++)
            for (oh = 0; oh < OH; oh++)
                for (ow = 0; ow < OW; ow++) {
                    double acc = b ? b[o] : 0.0;
                    for (c = 0; c < Cg; c++)
                        for (i = 0; i < KH; i++)
                            for (j = 0; j < KW; j++) {
                                int ih = oh * s + i * d - p, iw = ow * s + j * d - p, ci = (o / Og) * Cg + c;
                                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                                acc += (double)w[((o * Cg + c) * KH + i) * KW + j] * x[((n * C + ci) * H + ih) * W + iw];
                            }
                    y[((n * O + o) * OH + oh) * OW + ow] = acc;
                }
}

static int conv2d_against_direct_loop(void) {
    mlc_ctx *ctx = test_ctx(21);
    static double want[2 * 6 * 7 * 6];
    const struct { int s, p, d, g, bias; } cfg[4] = { { 2, 1, 1, 2, 0 }, { 2, 1, 1, 2, 1 }, { 1, 2, 2, 2, 1 }, { 1, 0, 1, 1, 1 } };
    mlc_tensor *x = mlc_randn(ctx, MLC_SHAPE(2, 4, 7, 6)), *w, *w1, *b, *r;
    int k;
    CHECK(x);
    w = mlc_randn(ctx, MLC_SHAPE(6, 2, 3, 3));          /* groups 2: C/g = 2 */
    w1 = mlc_randn(ctx, MLC_SHAPE(6, 4, 3, 3));         /* groups 1 */
    b = mlc_randn(ctx, MLC_SHAPE(6));
    CHECK(w && w1 && b);
    for (k = 0; k < 4; k++) {
        mlc_tensor *wk = cfg[k].g == 1 ? w1 : w;
        int OH = (7 + 2 * cfg[k].p - cfg[k].d * 2 - 1) / cfg[k].s + 1, OW = (6 + 2 * cfg[k].p - cfg[k].d * 2 - 1) / cfg[k].s + 1;
        size_t i;
        r = mlc_conv2d(x, wk, cfg[k].bias ? b : NULL, conv_opts(cfg[k].s, cfg[k].p, cfg[k].d, cfg[k].g));
        CHECK_MSG(r && shape_is(r, 4, (const int[]){ 2, 6, OH, OW }), "config %d: wrong shape", k);
        if (k == 0) CHECK(OH == 4 && OW == 3);
        conv_direct(mlc_host_data(x), mlc_host_data(wk), cfg[k].bias ? mlc_host_data(b) : NULL, want, 2, 4, 7, 6, 6, 3, 3,
                    cfg[k].s, cfg[k].p, cfg[k].d, cfg[k].g, OH, OW);
        for (i = 0; i < r->size; i++)
            CHECK_MSG(fabs(mlc_host_data(r)[i] - want[i]) <= 1e-4 * (1 + fabs(want[i])),
                      "config %d [%zu]: %g, expected %g", k, i, (double)mlc_host_data(r)[i], want[i]);
    }
    test_destroy(ctx);
    return 1;
}

/* One image with many channels: im2col shares the channels out between threads (with OpenMP;
   an uneven split on 3 threads), with one group and with two. */
static int conv2d_one_image_against_direct_loop(void) {
    mlc_ctx *ctx = test_ctx(22);
    static double want[8 * 10 * 10];
    mlc_tensor *x = mlc_randn(ctx, MLC_SHAPE(1, 16, 10, 10)), *b = mlc_randn(ctx, MLC_SHAPE(8)), *r;
    int g;
    CHECK(x && b);
    for (g = 1; g <= 2; g++) {
        mlc_tensor *w = mlc_randn(ctx, MLC_SHAPE(8, 16 / g, 3, 3));
        size_t i;
        CHECK(w);
        r = mlc_conv2d(x, w, b, conv_opts(1, 1, 1, g));
        CHECK_MSG(r && shape_is(r, 4, (const int[]){ 1, 8, 10, 10 }), "groups %d: wrong shape", g);
        conv_direct(mlc_host_data(x), mlc_host_data(w), mlc_host_data(b), want, 1, 16, 10, 10, 8, 3, 3, 1, 1, 1, g, 10, 10);
        for (i = 0; i < r->size; i++)
            CHECK_MSG(fabs(mlc_host_data(r)[i] - want[i]) <= 1e-4 * (1 + fabs(want[i])),
                      "groups %d [%zu]: %g, expected %g", g, i, (double)mlc_host_data(r)[i], want[i]);
    }
    test_destroy(ctx);
    return 1;
}

/* A hook that computes with the reference loop (conv2d then runs the images one by one). */
static void reference_gemm(int ta, int tb, int M, int N, int K, const float *A, const float *B, float beta, float *C, void *user) {
    (void)user;
    mlc_gemm_reference(ta, tb, M, N, K, A, B, beta, C);
}

/* conv2d's output and gradients, its images shared out between threads (with OpenMP) and with
   mlc's GEMM, against the same on a context whose products go to a hook, one image at a time:
   5 images (an uneven split), several strides, paddings, dilations and groups; depthwise (one
   channel per group: 9 rows of col) takes dW's dot-product path. */
static int conv2d_images_in_threads_match_one_by_one(void) {
    const struct { int s, p, d, g; } cfg[4] = { { 1, 1, 1, 1 }, { 2, 1, 1, 2 }, { 1, 2, 2, 3 }, { 1, 1, 1, 6 } };
    int k, c;
    for (k = 0; k < 4; k++) {
        mlc_ctx *ctx[2];
        float y[2][5 * 6 * 9 * 9], gx[2][5 * 6 * 9 * 8], gw[2][6 * 6 * 3 * 3], gb[2][6];
        size_t ny = 0, i;
        for (c = 0; c < 2; c++) {
            mlc_config cf;
            mlc_tensor *x, *w, *b, *r;
            memset(&cf, 0, sizeof cf);
            cf.seed = 3; cf.quiet = 1; cf.device = "cpu";
            if (c == 1) cf.gemm = reference_gemm;
            ctx[c] = mlc_create(&cf);
            x = mlc_requires_grad(mlc_randn(ctx[c], MLC_SHAPE(5, 6, 9, 8)), 1);
            w = mlc_requires_grad(mlc_randn(ctx[c], MLC_SHAPE(6, 6 / cfg[k].g, 3, 3)), 1);
            b = mlc_requires_grad(mlc_randn(ctx[c], MLC_SHAPE(6)), 1);
            r = mlc_conv2d(x, w, b, conv_opts(cfg[k].s, cfg[k].p, cfg[k].d, cfg[k].g));
            CHECK(r && mlc_backward_with(r, mlc_full(ctx[c], r->ndim, r->shape, 0.5f)) == MLC_OK);
            CHECK(r->size <= sizeof y[0] / sizeof(float));
            ny = r->size;
            memcpy(y[c], r->data, ny * sizeof(float));
            memcpy(gx[c], x->grad, x->size * sizeof(float));
            memcpy(gw[c], w->grad, w->size * sizeof(float));
            memcpy(gb[c], b->grad, b->size * sizeof(float));
            mlc_destroy(ctx[c]);
        }
        for (i = 0; i < ny; i++) CHECK_MSG(fabs(y[0][i] - y[1][i]) <= 1e-4 * (1 + fabs(y[1][i])), "config %d y[%zu]", k, i);
        for (i = 0; i < sizeof gx[0] / sizeof(float); i++) CHECK_MSG(fabs(gx[0][i] - gx[1][i]) <= 1e-4 * (1 + fabs(gx[1][i])), "config %d dx[%zu]", k, i);
        for (i = 0; i < (size_t)6 * 6 / cfg[k].g * 9; i++) CHECK_MSG(fabs(gw[0][i] - gw[1][i]) <= 1e-4 * (1 + fabs(gw[1][i])), "config %d dW[%zu]", k, i);
        for (i = 0; i < 6; i++) CHECK_MSG(fabs(gb[0][i] - gb[1][i]) <= 1e-4 * (1 + fabs(gb[1][i])), "config %d db[%zu]", k, i);
    }
    return 1;
}

/* The stride-1 path (padded planes, weights packed once, dx as a convolution of dy with the
   flipped weights, dW through channels-last rows) against the general one (im2col, col2im) on a
   context whose products go to a hook: outputs, dx, dW, db for 3 images. Settings: 32 channels
   of 3x3 (288 rows of col, two slices of the product's depth) with 5 outputs (fewer than a
   kernel's rows); a 2x3 kernel with separate paddings; dilation 2; a 1x1 kernel with padding 1
   (dx's padding would be -1: dx falls back to col2im); a 5x5 kernel, padding 2, one channel (dW
   by dot products); and stride 2 (the general path both ways, as a check of the check). */
static int conv2d_stride1_path_matches_general(void) {
    const struct { int C, O, KH, KW, ph, pw, d, s; } cfg[6] = {
        { 32, 5, 3, 3, 1, 1, 1, 1 }, { 3, 13, 2, 3, 0, 2, 1, 1 }, { 4, 6, 3, 3, 1, 1, 2, 1 },
        { 6, 4, 1, 1, 1, 1, 1, 1 },  { 1, 7, 5, 5, 2, 2, 1, 1 },  { 4, 6, 3, 3, 1, 1, 1, 2 } };
    static float out[2][4][3 * 32 * 9 * 8];
    const char *const names[4] = { "y", "dx", "dW", "db" };
    size_t len[4] = { 0 }, i;
    int k, c, t;
    for (k = 0; k < 6; k++) {
        for (c = 0; c < 2; c++) {
            mlc_config cf;
            mlc_conv_opts o = { 0 };
            mlc_ctx *ctx;
            mlc_tensor *x, *w, *b, *r, *got[4];
            memset(&cf, 0, sizeof cf);
            cf.seed = 7; cf.quiet = 1; cf.device = "cpu";
            if (c == 1) cf.gemm = reference_gemm;
            ctx = mlc_create(&cf);
            o.stride = cfg[k].s; o.dilation = cfg[k].d;
            o.padding = cfg[k].ph; o.padding_w = cfg[k].pw ? cfg[k].pw : MLC_ZERO_INT;
            x = mlc_requires_grad(mlc_randn(ctx, MLC_SHAPE(3, cfg[k].C, 9, 8)), 1);
            w = mlc_requires_grad(mlc_randn(ctx, MLC_SHAPE(cfg[k].O, cfg[k].C, cfg[k].KH, cfg[k].KW)), 1);
            b = mlc_requires_grad(mlc_randn(ctx, MLC_SHAPE(cfg[k].O)), 1);
            r = mlc_conv2d(x, w, b, o);
            CHECK_MSG(r && mlc_backward_with(r, mlc_randn(ctx, r->ndim, r->shape)) == MLC_OK, "config %d: %s",
                      k, mlc_error_message(ctx));
            got[0] = r; got[1] = x; got[2] = w; got[3] = b;
            for (t = 0; t < 4; t++) {
                len[t] = got[t]->size;
                CHECK(len[t] <= sizeof out[0][0] / sizeof(float));
                memcpy(out[c][t], t ? got[t]->grad : got[t]->data, len[t] * sizeof(float));
            }
            mlc_destroy(ctx);
        }
        for (t = 0; t < 4; t++)
            for (i = 0; i < len[t]; i++)
                CHECK_MSG(fabs(out[0][t][i] - out[1][t][i]) <= 1e-4 * (1 + fabs(out[1][t][i])),
                          "config %d, %s[%zu]: %g, general path %g", k, names[t], i, (double)out[0][t][i],
                          (double)out[1][t][i]);
    }
    return 1;
}

/* No input channels (y is the bias, or 0) and no output channels (dx is 0), forward and
   backward, on the stride-1 settings (whose path leaves empty products to the general one). */
static int conv2d_zero_channels(void) {
    mlc_ctx *ctx = test_ctx(3);
    mlc_tensor *x = mlc_requires_grad(mlc_randn(ctx, MLC_SHAPE(2, 0, 5, 5)), 1);
    mlc_tensor *w = mlc_requires_grad(mlc_randn(ctx, MLC_SHAPE(3, 0, 3, 3)), 1);
    mlc_tensor *b = mlc_requires_grad(mlc_full(ctx, MLC_SHAPE(3), 0.5f), 1);
    mlc_tensor *x2 = mlc_requires_grad(mlc_randn(ctx, MLC_SHAPE(2, 3, 5, 5)), 1);
    mlc_tensor *w2 = mlc_requires_grad(mlc_randn(ctx, MLC_SHAPE(0, 3, 3, 3)), 1);
    mlc_tensor *y = mlc_conv2d(x, w, b, (mlc_conv_opts){ .padding = 1 }), *y2;
    size_t i;
    CHECK(y && shape_is(y, 4, (const int[]){ 2, 3, 5, 5 }));
    for (i = 0; i < y->size; i++) CHECK(mlc_host_data(y)[i] == 0.5f);
    CHECK(mlc_backward_with(y, mlc_ones(ctx, y->ndim, y->shape)) == MLC_OK);
    CHECK(mlc_host_grad(b)[0] == 50.0f && mlc_host_grad(b)[2] == 50.0f);
    y2 = mlc_conv2d(x2, w2, NULL, (mlc_conv_opts){ .padding = 1 });
    CHECK(y2 && shape_is(y2, 4, (const int[]){ 2, 0, 5, 5 }));
    CHECK(mlc_backward_with(y2, mlc_ones(ctx, y2->ndim, y2->shape)) == MLC_OK && mlc_host_grad(x2));
    for (i = 0; i < x2->size; i++) CHECK(mlc_host_grad(x2)[i] == 0.0f);
    test_destroy(ctx);
    return 1;
}

static int pooling_values(void) {
    mlc_ctx *ctx = test_ctx(1);
    /* [1,2,4,4]: a plane and its negative */
    const float p[16] = { 8, 1, 2, 7, 3, 4, 0, 5, 6, 15, 9, 1, 2, 3, 14, 4 };
    const float max_k2[8] = { 8, 7, 15, 14, -1, 0, -2, -1 }, avg_k2[8] = { 4, 3.5f, 6.5f, 7, -4, -3.5f, -6.5f, -7 };
    const float max_k3p1[8] = { 8, 7, 15, 15, -1, 0, -2, 0 };
    const float avg_k3p1[8] = { 1.7777778f, 2.1111111f, 3.6666667f, 6.1111111f, -1.7777778f, -2.1111111f, -3.6666667f, -6.1111111f };
    const float max_k3s1[8] = { 15, 15, 15, 15, 0, 0, 0, 0 };
    const float avg_k3s1[8] = { 5.3333333f, 4.8888889f, 6.2222222f, 6.1111111f, -5.3333333f, -4.8888889f, -6.2222222f, -6.1111111f };
    const float max_k2p1[50] = { 8, 8, 2, 7, 7, 8, 8, 4, 7, 7, 6, 15, 15, 9, 5, 6, 15, 15, 14, 4, 2, 3, 14, 14, 4,
                                 -8, -1, -1, -2, -7, -3, -1, 0, 0, -5, -3, -3, 0, 0, -1, -2, -2, -3, -1, -1, -2, -2, -3, -4, -4 };
    const float avg_k2p1[50] = { 2, 2.25f, 0.75f, 2.25f, 1.75f, 2.75f, 4, 1.75f, 3.5f, 3, 2.25f, 7, 7, 3.75f, 1.5f,
                                 2, 6.5f, 10.25f, 7, 1.25f, 0.5f, 1.25f, 4.25f, 4.5f, 1,
                                 -2, -2.25f, -0.75f, -2.25f, -1.75f, -2.75f, -4, -1.75f, -3.5f, -3, -2.25f, -7, -7, -3.75f, -1.5f,
                                 -2, -6.5f, -10.25f, -7, -1.25f, -0.5f, -1.25f, -4.25f, -4.5f, -1 };
    const float gap[2] = { 5.25f, -5.25f };
    float x[32];
    mlc_tensor *t, *r;
    int i;
    for (i = 0; i < 16; i++) { x[i] = p[i]; x[16 + i] = -p[i]; }
    t = T(ctx, x, 1, 2, 4, 4);
    r = mlc_max_pool2d(t, 2, 0, 0);                     /* stride 0: the kernel */
    CHECK_SHAPE(r, 1, 2, 2, 2);
    CHECK_TENSOR(r, max_k2, 0);
    r = mlc_avg_pool2d(t, 2, 2, 0);
    CHECK_SHAPE(r, 1, 2, 2, 2);
    CHECK_TENSOR(r, avg_k2, 1e-6);
    r = mlc_max_pool2d(t, 3, 2, 1);                     /* padding never wins a max */
    CHECK_SHAPE(r, 1, 2, 2, 2);
    CHECK_TENSOR(r, max_k3p1, 0);
    r = mlc_avg_pool2d(t, 3, 2, 1);                     /* padding counts: sum / 9 */
    CHECK_SHAPE(r, 1, 2, 2, 2);
    CHECK_TENSOR(r, avg_k3p1, 1e-6);
    r = mlc_max_pool2d(t, 3, 1, 0);
    CHECK_SHAPE(r, 1, 2, 2, 2);
    CHECK_TENSOR(r, max_k3s1, 0);
    r = mlc_avg_pool2d(t, 3, 1, 0);
    CHECK_TENSOR(r, avg_k3s1, 1e-6);
    r = mlc_max_pool2d(t, 2, 1, 1);
    CHECK_SHAPE(r, 1, 2, 5, 5);
    CHECK_TENSOR(r, max_k2p1, 0);
    r = mlc_avg_pool2d(t, 2, 1, 1);
    CHECK_SHAPE(r, 1, 2, 5, 5);
    CHECK_TENSOR(r, avg_k2p1, 1e-6);
    r = mlc_global_avg_pool2d(t);
    CHECK_SHAPE(r, 1, 2);
    CHECK_TENSOR(r, gap, 1e-6);
    r = mlc_global_avg_pool2d(mlc_reshape(t, MLC_SHAPE(2, 1, 4, 4)));
    CHECK_SHAPE(r, 2, 1);
    CHECK_TENSOR(r, gap, 1e-6);
    CHECK(mlc_error(ctx) == MLC_OK);
    CHECK(mlc_max_pool2d(t, 2, 2, 2) == NULL && mlc_error(ctx) == MLC_ERR_ARG);   /* padding > kernel/2 */
    test_destroy(ctx);
    return 1;
}

/* Pooling one output at a time, in double: the value and the (first) argmax of each window. */
static void pool_direct(const float *x, double *y, int *at, int planes, int H, int W, int K, int S, int P, int is_max) {
    int pl, oh, ow, i, j, OH = (H + 2 * P - K) / S + 1, OW = (W + 2 * P - K) / S + 1;
    for (pl = 0; pl < planes; pl++)
        for (oh = 0; oh < OH; oh++)
            for (ow = 0; ow < OW; ow++) {
                double best = -INFINITY, sum = 0.0;
                int where = -1;
                for (i = 0; i < K; i++)
                    for (j = 0; j < K; j++) {
                        int ih = oh * S - P + i, iw = ow * S - P + j;
                        if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                        sum += x[(pl * H + ih) * W + iw];
                        if (x[(pl * H + ih) * W + iw] > best) { best = x[(pl * H + ih) * W + iw]; where = (pl * H + ih) * W + iw; }
                    }
                y[(pl * OH + oh) * OW + ow] = is_max ? best : sum / (K * K);
                at[(pl * OH + oh) * OW + ow] = where;
            }
}

/* Pooling (max by rows of outputs, 2x2 stride 2 in one pass; edges one window at a time)
   against the window loop: odd sizes, padding, strides other than the kernel, ties (values
   are whole numbers 0..4, so a window's first largest must win), with and without a tape. */
static int pooling_against_window_loop(void) {
    const struct { int K, S, P; } cfg[9] = { { 2, 2, 0 }, { 2, 2, 1 }, { 3, 2, 1 }, { 3, 3, 0 }, { 2, 1, 0 },
                                             { 3, 1, 1 }, { 1, 1, 0 }, { 4, 3, 2 }, { 2, 3, 1 } };
    const struct { int H, W; } size[4] = { { 7, 9 }, { 8, 8 }, { 2, 3 }, { 5, 37 } };  /* 37: rows of 16+ */
    static double want[6 * 5 * 39];
    static int at[6 * 5 * 39];
    static float v[6 * 5 * 39], counts[6 * 5 * 39];
    int k, s, is_max, tape;
    for (k = 0; k < 9; k++)
        for (s = 0; s < 4; s++)
            for (is_max = 0; is_max < 2; is_max++)
                for (tape = 0; tape < 2; tape++) {
                    mlc_ctx *ctx = test_ctx((unsigned long long)(5 + k));
                    int H = size[s].H, W = size[s].W, K = cfg[k].K, S = cfg[k].S, P = cfg[k].P;
                    mlc_tensor *x, *r;
                    size_t i;
                    if (H + 2 * P < K || W + 2 * P < K) { test_destroy(ctx); continue; }
                    for (i = 0; i < (size_t)6 * H * W; i++) v[i] = (float)(mlc_rand_u32(ctx) % 5);
                    x = mlc_from_data(ctx, 4, (const int[]){ 2, 3, H, W }, v);
                    CHECK(x);
                    mlc_requires_grad(x, tape);
                    r = is_max ? mlc_max_pool2d(x, K, S, P) : mlc_avg_pool2d(x, K, S, P);
                    CHECK_MSG(r, "K %d S %d P %d on %dx%d: %s", K, S, P, H, W, mlc_error_message(ctx));
                    pool_direct(mlc_host_data(x), want, at, 6, H, W, K, S, P, is_max);
                    for (i = 0; i < r->size; i++)
                        CHECK_MSG(fabs(mlc_host_data(r)[i] - want[i]) <= 1e-6 * (1 + fabs(want[i])), "%s K %d S %d P %d on %dx%d, tape %d [%zu]: %g, expected %g",
                                  is_max ? "max" : "avg", K, S, P, H, W, tape, i, (double)mlc_host_data(r)[i], want[i]);
                    if (tape && is_max) {                   /* the gradient lands on each window's first largest */
                        CHECK(mlc_backward_with(r, mlc_ones(ctx, r->ndim, r->shape)) == MLC_OK);
                        memset(counts, 0, x->size * sizeof(float));
                        for (i = 0; i < r->size; i++) counts[at[i]] += 1.0f;
                        for (i = 0; i < x->size; i++)
                            CHECK_MSG(mlc_host_grad(x)[i] == counts[i], "K %d S %d P %d on %dx%d: dx[%zu] %g, expected %g",
                                      K, S, P, H, W, i, (double)mlc_host_grad(x)[i], (double)counts[i]);
                    }
                    test_destroy(ctx);
                }
    return 1;
}

/* ceil_mode: the output size rounded up, the last windows hanging over the edge (max takes what
   lies inside; average divides by what lies inside the padded input), values and gradients of
   sum(y * w), w = 1, 2, ..., from PyTorch 1.13 (python3-torch): F.max_pool2d(x, 2, 2, 0,
   ceil_mode=True), F.max_pool2d(x, 3, 2, 1, ceil_mode=True) and the same with F.avg_pool2d, for
   x [1, 2, 5, 5] (the plane below and its negative). */
static int pooling_ceil_mode(void) {
    mlc_ctx *ctx = test_ctx(1);
    const float plane[25] = { 8, 1, 2, 7, 3, 4, 0, 5, 6, 15, 9, 1, 2, 3, 14, 4, 11, -3, 10, 12, 5, -6, 13, -1,
                              16 };
    static const float want[4][18] = {
        { 8, 7, 15, 11, 10, 14, 5, 13, 16, 0, -2, -3, -1, 3, -12, 6, 1, -16 },
        { 8, 7, 15, 11, 11, 15, 11, 13, 16, 0, 0, -3, 0, 3, -3, 6, 6, 1 },
        { 3.25f, 5, 9, 6.25f, 3, 13, -0.5f, 6, 16, -3.25f, -5, -9, -6.25f, -3, -13, 0.5f, -6, -16 },
        { 1.4444444f, 2.3333333f, 3.4444444f, 3.2222223f, 3.8888888f, 6.6666665f, 1.5555556f, 2.6666667f,
          4.1111112f, -1.4444444f, -2.3333333f, -3.4444444f, -3.2222223f, -3.8888888f, -6.6666665f,
          -1.5555556f, -2.6666667f, -4.1111112f } };
    static const float want_grad[4][50] = {
        { 1, 0, 0, 2, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 6, 0, 4, 0, 5, 0, 7, 0, 8, 0, 9, 0, 0, 11, 0, 12, 0, 10,
          0, 0, 0, 0, 13, 0, 0, 0, 0, 0, 14, 0, 15, 0, 16, 0, 17, 18 },
        { 1, 0, 0, 2, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 16, 0, 0, 0, 0, 0, 8, 0, 9, 0, 0, 0, 0, 12, 0, 34,
          0, 0, 0, 0, 0, 0, 15, 0, 0, 0, 14, 0, 0, 0, 33, 0, 18, 0 },
        { 0.25f, 0.25f, 0.5f, 0.5f, 1.5f, 0.25f, 0.25f, 0.5f, 0.5f, 1.5f, 1, 1, 1.25f, 1.25f, 3, 1, 1,
          1.25f, 1.25f, 3, 3.5f, 3.5f, 4, 4, 9, 2.5f, 2.5f, 2.75f, 2.75f, 6, 2.5f, 2.5f, 2.75f, 2.75f, 6,
          3.25f, 3.25f, 3.5f, 3.5f, 7.5f, 3.25f, 3.25f, 3.5f, 3.5f, 7.5f, 8, 8, 8.5f, 8.5f, 18 },
        { 0.1111111f, 0.3333333f, 0.2222222f, 0.5555556f, 0.3333333f, 0.5555556f, 1.3333334f, 0.7777778f,
          1.7777779f, 1, 0.4444444f, 1, 0.5555556f, 1.2222223f, 0.6666667f, 1.2222222f, 2.6666667f,
          1.4444444f, 3.1111112f, 1.6666667f, 0.7777778f, 1.6666667f, 0.8888889f, 1.8888888f, 1, 1.1111112f,
          2.3333335f, 1.2222222f, 2.5555556f, 1.3333334f, 2.5555556f, 5.3333335f, 2.7777777f, 5.7777777f, 3,
          1.4444444f, 3, 1.5555556f, 3.2222223f, 1.6666666f, 3.2222223f, 6.6666665f, 3.4444444f, 7.1111112f,
          3.6666665f, 1.7777778f, 3.6666665f, 1.8888888f, 3.8888888f, 2 } };
    float xs[50], ws[18];
    int k, i, tape;
    for (i = 0; i < 25; i++) { xs[i] = plane[i]; xs[25 + i] = -plane[i]; }
    for (i = 0; i < 18; i++) ws[i] = (float)(i + 1);
    for (k = 0; k < 4; k++)
        for (tape = 0; tape < 2; tape++) {
            mlc_pool_opts opts = { .stride = 2, .ceil_mode = 1 };
            mlc_tensor *x = mlc_requires_grad(T(ctx, xs, 1, 2, 5, 5), tape), *y;
            if (k % 2) { opts.stride = 2; opts.padding = 1; }
            y = k < 2 ? mlc_max_pool2d_opts(x, 2 + k % 2, opts) : mlc_avg_pool2d_opts(x, 2 + k % 2, opts);
            CHECK_MSG(y && y->ndim == 4 && y->shape[2] == 3 && y->shape[3] == 3, "case %d: %s", k,
                      mlc_error_message(ctx));
            CHECK_TENSOR(y, want[k], 1e-6);
            if (!tape) continue;
            CHECK(mlc_backward_with(y, T(ctx, ws, 1, 2, 3, 3)) == MLC_OK);
            CHECK_TENSOR(mlc_from_data(ctx, 4, x->shape, mlc_host_grad(x)), want_grad[k], 1e-6);
        }
    {   /* ceil on a size where floor agrees; a last window that would start in the padding is dropped */
        mlc_pool_opts ceil = { .stride = 3, .ceil_mode = 1 }, pad_ceil = { .stride = 2, .padding = 1,
                                                                          .ceil_mode = 1 };
        mlc_tensor *x = T(ctx, xs, 1, 2, 5, 5), *y = mlc_max_pool2d_opts(x, 2, ceil);
        CHECK(y && y->shape[2] == 2 && y->shape[3] == 2);
        y = mlc_max_pool2d_opts(mlc_ones(ctx, MLC_SHAPE(1, 1, 5, 6)), 2, pad_ceil);   /* torch: [3, 4]; */
        CHECK(y && y->shape[2] == 3 && y->shape[3] == 4);                 /* a 4th row would start at 6 */
    }
    {   /* the modules take it from their pool options */
        mlc_module *m = mlc_nn_max_pool2d(ctx, 2, 2), *a = mlc_nn_avg_pool2d(ctx, 2, 2);
        CHECK(m && a);
        m->pool.ceil_mode = a->pool.ceil_mode = 1;
        CHECK_TENSOR(mlc_forward(m, T(ctx, xs, 1, 2, 5, 5)), want[0], 0);
        CHECK_TENSOR(mlc_forward(a, T(ctx, xs, 1, 2, 5, 5)), want[2], 1e-6);
    }
    CHECK(mlc_error(ctx) == MLC_OK);
    test_destroy(ctx);
    return 1;
}

/* exclude_pad (torch's count_include_pad=False): average pooling divides by the values inside
   the input only. PyTorch 1.13's values and gradients of sum(y * w), w = 1, 2, ..., for the x of
   pooling_ceil_mode: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False) and F.avg_pool2d(x, 2, 2,
   1, ceil_mode=True, count_include_pad=False). */
static int pooling_exclude_pad(void) {
    mlc_ctx *ctx = test_ctx(1);
    const float plane[25] = { 8, 1, 2, 7, 3, 4, 0, 5, 6, 15, 9, 1, 2, 3, 14, 4, 11, -3, 10, 12, 5, -6, 13, -1,
                              16 };
    static const float want[2][18] = {
        { 3.25f, 3.5f, 7.75f, 4.8333335f, 3.8888888f, 10, 3.5f, 4, 9.25f, -3.25f, -3.5f, -7.75f,
          -4.8333335f, -3.8888888f, -10, -3.5f, -4, -9.25f },
        { 8, 1.5f, 5, 6.5f, 2, 9.5f, 4.5f, 3.75f, 9.25f, -8, -1.5f, -5, -6.5f, -2, -9.5f, -4.5f, -3.75f,
          -9.25f } };
    static const float want_grad[2][50] = {
        { 0.25f, 0.5833334f, 0.3333333f, 1.0833334f, 0.75f, 0.9166667f, 1.8055556f, 0.888889f, 2.6388888f,
          1.75f, 0.6666667f, 1.2222223f, 0.5555556f, 1.5555556f, 1, 2.4166667f, 4.3055558f, 1.888889f,
          5.1388888f, 3.25f, 1.75f, 3.0833335f, 1.3333334f, 3.5833335f, 2.25f, 2.5f, 4.3333335f, 1.8333334f,
          4.8333335f, 3, 4.666667f, 8.0555553f, 3.3888888f, 8.8888893f, 5.5f, 2.1666667f, 3.7222223f,
          1.5555556f, 4.0555553f, 2.5f, 6.166667f, 10.5555553f, 4.3888888f, 11.3888884f, 7, 4, 6.833333f,
          2.8333333f, 7.333333f, 4.5f },
        { 1, 1, 1, 1.5f, 1.5f, 2, 1.25f, 1.25f, 1.5f, 1.5f, 2, 1.25f, 1.25f, 1.5f, 1.5f, 3.5f, 2, 2,
          2.25f, 2.25f, 3.5f, 2, 2, 2.25f, 2.25f, 10, 5.5f, 5.5f, 6, 6, 6.5f, 3.5f, 3.5f, 3.75f, 3.75f,
          6.5f, 3.5f, 3.5f, 3.75f, 3.75f, 8, 4.25f, 4.25f, 4.5f, 4.5f, 8, 4.25f, 4.25f, 4.5f, 4.5f } };
    const mlc_pool_opts opts[2] = { { .stride = 2, .padding = 1, .exclude_pad = 1 },
                                    { .stride = 2, .padding = 1, .ceil_mode = 1, .exclude_pad = 1 } };
    float xs[50], ws[18];
    int k, i;
    for (i = 0; i < 25; i++) { xs[i] = plane[i]; xs[25 + i] = -plane[i]; }
    for (i = 0; i < 18; i++) ws[i] = (float)(i + 1);
    for (k = 0; k < 2; k++) {
        mlc_tensor *x = mlc_requires_grad(T(ctx, xs, 1, 2, 5, 5), 1);
        mlc_tensor *y = mlc_avg_pool2d_opts(x, 3 - k, opts[k]);
        CHECK_MSG(y && y->shape[2] == 3 && y->shape[3] == 3, "case %d: %s", k, mlc_error_message(ctx));
        CHECK_TENSOR(y, want[k], 1e-6);
        CHECK(mlc_backward_with(y, T(ctx, ws, 1, 2, 3, 3)) == MLC_OK);
        CHECK_TENSOR(mlc_from_data(ctx, 4, x->shape, mlc_host_grad(x)), want_grad[k], 2e-6);
    }
    {   /* max pooling has no divisor: the option changes nothing there */
        mlc_tensor *x = T(ctx, xs, 1, 2, 5, 5);
        mlc_tensor *a = mlc_max_pool2d_opts(x, 3, opts[0]), *b = mlc_max_pool2d(x, 3, 2, 1);
        CHECK(a && b);
        CHECK_TENSOR(a, mlc_host_data(b), 0);
    }
    CHECK(mlc_error(ctx) == MLC_OK);
    test_destroy(ctx);
    return 1;
}

/* Separate height and width windows: F.max_pool2d(x, (3, 2), stride=(2, 1), padding=(1, 0)) and
   F.avg_pool2d with the same, values and gradients of sum(y * w), w = 1, 2, ..., computed by
   PyTorch 1.13 (python3-torch) and pasted here, for x [1, 2, 5, 6] (the plane below and its
   negative). */
static int pooling_height_width(void) {
    mlc_ctx *ctx = test_ctx(1);
    const float plane[30] = { 8, 1, 2, 7, 3, 4, 0, 5, 6, 15, 9, 1, 2, 3, 14, 4, 11, -3, 10, 12, 5, -6, 13, -1,
                              16, 7, -2, 0, 6, 3 };
    static const float want[2][30] = {
        { 8, 6, 15, 15, 9, 12, 14, 15, 15, 13, 16, 12, 5, 13, 13, 0, -1, -2, -3, -1, 0, -3, 6, 6, 3, -7, 2, 6,
          6, 1 },
        { 2.3333333f, 2.3333333f, 5, 5.6666665f, 2.8333333f, 5.3333335f, 7.5f, 6.3333335f, 7.6666665f, 5,
          7.5f, 3.6666667f, -0.5f, 2.1666667f, 3.5f, -2.3333333f, -2.3333333f, -5, -5.6666665f, -2.8333333f,
          -5.3333335f, -7.5f, -6.3333335f, -7.6666665f, -5, -7.5f, -3.6666667f, 0.5f, -2.1666667f, -3.5f } };
    static const float want_grad[2][60] = {
        { 1, 0, 0, 0, 0, 0, 0, 0, 2, 24, 5, 0, 0, 0, 7, 0, 0, 0, 0, 18, 13, 0, 39, 0, 11, 0, 0, 0, 0, 0, 0,
          17, 18, 0, 19, 0, 37, 0, 0, 0, 0, 20, 0, 22, 0, 0, 0, 25, 0, 0, 0, 104, 0, 30, 0, 26, 27, 0, 0, 0 },
        { 0.16666667f, 0.5f, 0.83333337f, 1.1666667f, 1.5f, 0.83333331f, 1.1666666f, 2.6666665f, 3.3333335f,
          4, 4.6666665f, 2.5f, 1, 2.1666665f, 2.5f, 2.8333335f, 3.1666665f, 1.6666666f, 2.8333335f, 6,
          6.666667f, 7.333333f, 8, 4.1666665f, 1.8333334f, 3.8333335f, 4.166667f, 4.5f, 4.833333f, 2.5f,
          2.6666667f, 5.5f, 5.833333f, 6.166667f, 6.5f, 3.3333333f, 6.166667f, 12.666667f, 13.333333f, 14,
          14.666666f, 7.5f, 3.5f, 7.166667f, 7.5f, 7.833333f, 8.166666f, 4.1666665f, 7.8333335f, 16,
          16.666666f, 17.333334f, 18, 9.166666f, 4.3333335f, 8.833334f, 9.166666f, 9.5f, 9.833334f, 5 } };
    const mlc_pool_opts opts = { .stride = 2, .padding = 1, .kernel_w = 2, .stride_w = 1,
                                 .padding_w = MLC_ZERO_INT };
    float xs[60], ws[30];
    int k, i, tape;
    for (i = 0; i < 30; i++) { xs[i] = plane[i]; xs[30 + i] = -plane[i]; ws[i] = (float)(i + 1); }
    for (k = 0; k < 2; k++)
        for (tape = 0; tape < 2; tape++) {
            mlc_tensor *x = mlc_requires_grad(T(ctx, xs, 1, 2, 5, 6), tape);
            mlc_tensor *y = k ? mlc_avg_pool2d_opts(x, 3, opts) : mlc_max_pool2d_opts(x, 3, opts);
            CHECK_MSG(y && y->shape[2] == 3 && y->shape[3] == 5, "case %d: %s", k, mlc_error_message(ctx));
            CHECK_TENSOR(y, want[k], 1e-6);
            if (!tape) continue;
            CHECK(mlc_backward_with(y, T(ctx, ws, 1, 2, 3, 5)) == MLC_OK);
            CHECK_TENSOR(mlc_from_data(ctx, 4, x->shape, mlc_host_grad(x)), want_grad[k], 2e-6);
        }
    {   /* the width's fields left 0 take the height's (stride: the kernel's); the modules keep them */
        const mlc_pool_opts same = { .stride = 2, .padding = 1, .kernel_w = 3, .stride_w = 2,
                                     .padding_w = 1 },
                            old = { .stride = 2, .padding = 1 }, wide = { .kernel_w = 3 };
        mlc_tensor *x = T(ctx, xs, 1, 2, 5, 6), *a = mlc_avg_pool2d_opts(x, 3, same);
        mlc_tensor *b = mlc_avg_pool2d_opts(x, 3, old), *c = mlc_max_pool2d_opts(x, 2, wide);
        mlc_module *m = mlc_nn_max_pool2d(ctx, 3, 2), *v = mlc_nn_avg_pool2d(ctx, 3, 2);
        CHECK(a && b && m && v);
        CHECK_TENSOR(b, mlc_host_data(a), 0);
        CHECK_SHAPE(c, 1, 2, 2, 2);                                      /* stride (2, 3) */
        m->pool.padding = v->pool.padding = 1;
        m->pool.kernel_w = v->pool.kernel_w = 2;
        m->pool.stride_w = v->pool.stride_w = 1;
        m->pool.padding_w = v->pool.padding_w = MLC_ZERO_INT;
        CHECK_TENSOR(mlc_forward(m, x), want[0], 0);
        CHECK_TENSOR(mlc_forward(v, x), want[1], 1e-6);
        CHECK(mlc_max_pool2d_opts(x, 3, (mlc_pool_opts){ .kernel_w = 2, .padding_w = 2 }) == NULL);
        CHECK(mlc_error(ctx) == MLC_ERR_ARG && strstr(mlc_error_message(ctx), "padding (0, 2)"));
        mlc_clear_error(ctx);
    }
    CHECK(mlc_error(ctx) == MLC_OK);
    test_destroy(ctx);
    return 1;
}

/* Every element of t equals want (NaN where want is NaN) */
static int same_with_nan(mlc_tensor *t, const float *want) {
    const float *d = t ? mlc_host_data(t) : NULL;
    size_t i;
    if (!d) return 0;
    for (i = 0; i < t->size; i++)
        if (test_isnan(want[i]) ? !test_isnan(d[i]) : d[i] != want[i]) return 0;
    return 1;
}

/* NaN as in PyTorch: max and argmax along an axis take the first NaN (its gradient goes there),
   max pooling outputs NaN where the window holds one and sends the gradient to the window's last
   NaN (PyTorch's CPU kernel). Values from PyTorch 1.13 (python3-torch):
   x = [[1, nan, 3, nan], [2, 5, -1, 0]]: x.max(1) (nan, 5) at (1, 1); x.max(0) (2, nan, 3, nan)
   at (1, 0, 0, 0); [[inf, nan, -inf], [nan, inf, nan]].argmax(1) (1, 0); for the 4x4 plane p
   below, F.max_pool2d(p, 2, 2) and F.max_pool2d(p, 3, 1, 1) and the gradients of their sums. */
static int nan_in_max_argmax_and_max_pool(void) {
    mlc_ctx *ctx = test_ctx(1);
    const float N = NAN, I = INFINITY;
    const float xs[8] = { 1, N, 3, N, 2, 5, -1, 0 }, max1[2] = { N, 5 }, at1[2] = { 1, 1 };
    const float max0[4] = { 2, N, 3, N }, at0[4] = { 1, 0, 0, 0 }, inf_at[2] = { 1, 0 };
    const float g1[8] = { 0, 1, 0, 0, 0, 1, 0, 0 }, g0[8] = { 0, 1, 1, 1, 1, 0, 0, 0 };
    const float infs[6] = { I, N, -I, N, I, N };
    const float ps[16] = { 1, 2, 3, 4, 5, N, 7, 8, 9, 10, N, 12, 13, 14, 15, N };
    const float pool2[4] = { N, 8, 14, N }, gpool2[16] = { 0, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 1, 0, 1 };
    const float pool3[16] = { N, N, N, 8, N, N, N, N, N, N, N, N, 14, N, N, N };
    const float gpool3[16] = { 0, 0, 0, 0, 0, 5, 0, 1, 0, 0, 5, 0, 0, 1, 0, 4 };
    const float *pool_want[2] = { pool2, pool3 }, *gpool_want[2] = { gpool2, gpool3 };
    int k, tape;
    mlc_tensor *x = mlc_requires_grad(T(ctx, xs, 2, 4), 1), *p;
    CHECK(same_with_nan(mlc_max(x, 1, 0), max1) && same_with_nan(mlc_argmax(x, 1), at1));
    CHECK(same_with_nan(mlc_max(x, 0, 1), max0) && same_with_nan(mlc_argmax(x, 0), at0));
    CHECK(same_with_nan(mlc_argmax(T(ctx, infs, 2, 3), 1), inf_at));
    CHECK(mlc_backward(mlc_sum_all(mlc_max(x, 1, 0))) == MLC_OK);
    CHECK(same_with_nan(mlc_from_data(ctx, 2, x->shape, mlc_host_grad(x)), g1));
    x = mlc_requires_grad(T(ctx, xs, 2, 4), 1);
    CHECK(mlc_backward(mlc_sum_all(mlc_max(x, 0, 0))) == MLC_OK);       /* a NaN loss; its gradient is 1 */
    CHECK(same_with_nan(mlc_from_data(ctx, 2, x->shape, mlc_host_grad(x)), g0));
    for (k = 0; k < 2; k++)
        for (tape = 0; tape < 2; tape++) {     /* without a tape 2x2 windows take a fast path */
            mlc_tensor *y;
            p = mlc_requires_grad(T(ctx, ps, 1, 1, 4, 4), tape);
            y = k == 0 ? mlc_max_pool2d(p, 2, 2, 0) : mlc_max_pool2d(p, 3, 1, 1);
            CHECK_MSG(same_with_nan(y, pool_want[k]), "max_pool2d %d, tape %d", k, tape);
            if (!tape) continue;
            CHECK(mlc_backward_with(y, mlc_ones(ctx, y->ndim, y->shape)) == MLC_OK);
            CHECK_MSG(same_with_nan(mlc_from_data(ctx, 4, p->shape, mlc_host_grad(p)), gpool_want[k]), "max_pool2d %d", k);
        }
    CHECK(mlc_error(ctx) == MLC_OK);
    test_destroy(ctx);
    return 1;
}

/* Batch norm of a [N, C] batch (its columns gathered 16 channels at a time, channels shared
   between 2 threads) against the same values as [1, C, N] (each channel one run, gathered alone):
   the same sums in the same order, so output, running statistics and gradients agree bit for
   bit; training and eval, C not a multiple of 16 and split between the threads mid-group */
static int batch_norm_columns_match_runs(void) {
    enum { N = 37, C = 601 };
    mlc_ctx *ctx = test_ctx(21);
    int training;
    mlc_set_threads(ctx, 2);
    for (training = 1; training >= 0; training--) {
        mlc_tensor *x = mlc_requires_grad(mlc_randn(ctx, MLC_SHAPE(N, C)), 1);
        mlc_tensor *xt = mlc_requires_grad(mlc_from_data(ctx, MLC_SHAPE(1, C, N),
                                                         mlc_host_data(mlc_transpose(x, 0, 1))), 1);
        mlc_tensor *w = mlc_requires_grad(mlc_randn(ctx, MLC_SHAPE(C)), 1);
        mlc_tensor *b = mlc_requires_grad(mlc_randn(ctx, MLC_SHAPE(C)), 1);
        mlc_tensor *w2 = mlc_requires_grad(mlc_from_data(ctx, MLC_SHAPE(C), mlc_host_data(w)), 1);
        mlc_tensor *b2 = mlc_requires_grad(mlc_from_data(ctx, MLC_SHAPE(C), mlc_host_data(b)), 1);
        mlc_tensor *stats[4], *y, *yt, *r, *rt, *gx;
        int k;
        for (k = 0; k < 4; k++) stats[k] = k % 2 ? mlc_ones(ctx, MLC_SHAPE(C)) : mlc_rand(ctx, MLC_SHAPE(C));
        CHECK(mlc_write(stats[2], mlc_host_data(stats[0]), C) == MLC_OK);
        y = mlc_batch_norm(x, stats[0], stats[1], w, b, training, 0.1f, 1e-5f);
        r = mlc_randn(ctx, MLC_SHAPE(N, C));
        CHECK_MSG(y && r && mlc_backward(mlc_sum_all(mlc_mul(y, r))) == MLC_OK, "%s", mlc_error_message(ctx));
        rt = mlc_reshape(mlc_transpose(r, 0, 1), MLC_SHAPE(1, C, N));
        yt = mlc_batch_norm(xt, stats[2], stats[3], w2, b2, training, 0.1f, 1e-5f);
        CHECK_MSG(yt && mlc_backward(mlc_sum_all(mlc_mul(yt, rt))) == MLC_OK, "%s", mlc_error_message(ctx));
        gx = mlc_transpose(mlc_from_data(ctx, MLC_SHAPE(N, C), mlc_host_grad(x)), 0, 1);
        CHECK(!memcmp(mlc_host_data(mlc_transpose(y, 0, 1)), mlc_host_data(yt), sizeof(float) * N * C));
        CHECK(!memcmp(mlc_host_data(stats[0]), mlc_host_data(stats[2]), sizeof(float) * C));
        CHECK(!memcmp(mlc_host_data(stats[1]), mlc_host_data(stats[3]), sizeof(float) * C));
        CHECK(!memcmp(mlc_host_data(gx), mlc_host_grad(xt), sizeof(float) * N * C));
        CHECK(!memcmp(mlc_host_grad(w), mlc_host_grad(w2), sizeof(float) * C));
        CHECK(!memcmp(mlc_host_grad(b), mlc_host_grad(b2), sizeof(float) * C));
    }
    test_destroy(ctx);
    return 1;
}

const test_case tests_ops[] = {
    TEST(batch_norm_columns_match_runs)
    TEST(binary_broadcast)
    TEST(scalar_ops)
    TEST(unary_math)
    TEST(where_three_way)
    TEST(masked_fill_causal)
    TEST(activations)
    TEST(activations_added_through_the_table)
    TEST(maps_propagate_nan_and_pow_zero_has_zero_gradient)
    TEST(nan_in_max_argmax_and_max_pool)
    TEST(pooling_ceil_mode)
    TEST(pooling_exclude_pad)
    TEST(pooling_height_width)
    TEST(cumsum_values_and_gradient)
    TEST(maths_within_their_ulp)
    TEST(softmax_axes)
    TEST(matmul_2d_and_transposes)
    TEST(matmul_batched_and_broadcast)
    TEST(linear_values)
    TEST(reductions_each_axis)
    TEST(reductions_all)
    TEST(cross_entropy_values)
    TEST(cross_entropy_label_smoothing)
    TEST(nll_mse_bce)
    TEST(reshape_flatten_transpose_permute)
    TEST(slice_values)
    TEST(concat_values)
    TEST(index_select_gather_copy)
    TEST(dropout_values)
    TEST(layer_norm_values)
    TEST(layer_norm_over_two_axes)
    TEST(batch_norm_training)
    TEST(batch_norm_statistics_keep_their_digits)
    TEST(batch_norm_eval)
    TEST(embedding_values)
    TEST(conv2d_hand_values)
    TEST(conv2d_groups_bias)
    TEST(conv2d_height_width)
    TEST(conv2d_against_direct_loop)
    TEST(conv2d_one_image_against_direct_loop)
    TEST(conv2d_images_in_threads_match_one_by_one)
    TEST(conv2d_stride1_path_matches_general)
    TEST(conv2d_zero_channels)
    TEST(pooling_values)
    TEST(pooling_against_window_loop)
    { NULL, NULL }
};
