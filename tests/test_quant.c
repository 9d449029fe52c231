/* int8 quantization (issue 26): quantize and dequantize against a double-precision reference,
   the dynamically quantized linear against the same scheme computed in doubles and against its
   float32 counterpart, its gradients, the module conversion, files, and int8 tensors refused by
   every op that does not take them. Runs on the suite's device (the int8 ops fall back to the
   CPU there, counted, like any op a backend lacks). */
#include <stdlib.h>
#include "test.h"

/* The int8 ops have no OpenCL kernels: on a device they run on the CPU through copies, counted
   as fallbacks (int8_ops_fall_back_counted checks the count), which the runner would otherwise
   fail on a real device. Only those are forgiven: any other op that fell back still fails. */
/* The static int8 functions run on the host: on a device each counts a fallback under its name */
static void forgive_int8_fallbacks_named(mlc_ctx *ctx) {
    test_destroy_expecting_fallbacks(ctx, "mlc_linear mlc_conv2d_int8 mlc_linear_int8 mlc_add_int8 mlc_max_pool2d "
                                          "mlc_avg_pool2d mlc_max_pool2d_opts mlc_avg_pool2d_opts mlc_quantize "
                                          "mlc_dequantize mlc_quantize_weight");
}

/* The reference: v / s rounded half to even by the C library (nearbyint in the default mode).
   Each float step is stored, so it rounds to float where FLT_EVAL_METHOD is 1 or 2 (s390x, x87)
   as it does in mlc. */
static int reference_quantize(float v, float scale, int zero_point, int lowest) {
    const float inverse = 1.0f / scale, product = v * inverse;
    double r = product;
    if (r != r) return zero_point;
    r = nearbyint(r) + zero_point;
    return r < lowest ? lowest : r > 127 ? 127 : (int)r;
}

static int quantize_rounds_to_nearest_even(void) {
    mlc_ctx *ctx = test_ctx(1);
    static const float ties[] = { 0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 126.5f, 127.5f, -127.5f, -128.5f,
                                  300.0f, -300.0f, 1e30f, -1e30f, 0.0f, -0.0f, 0.49999997f, 3.4999998f };
    const int expected[] = { 0, 2, 2, 0, -2, -2, 126, 127, -128, -128, 127, -128, 127, -128, 0, 0, 0, 3 };
    float values[64], back[64];
    mlc_tensor *x, *q;
    int i, zero_point;
    x = mlc_from_data(ctx, MLC_SHAPE(18), ties);
    q = mlc_quantize(x, 1.0f, 0);
    CHECK_MSG(q != NULL, "%s", mlc_error_message(ctx));
    CHECK(mlc_dtype(q) == MLC_I8 && strcmp(mlc_dtype_name(MLC_I8), "int8") == 0);
    for (i = 0; i < 18; i++) CHECK_MSG(q->int8[i] == expected[i], "%g -> %d", (double)ties[i], q->int8[i]);
    for (zero_point = -128; zero_point <= 127; zero_point += 51) {    /* random values, ties among them */
        const float scale = 0.0371f;
        for (i = 0; i < 64; i++)
            values[i] = i % 4 == 0 ? scale * ((float)(i - 32) + 0.5f) : (float)(rand() % 20001 - 10000) * 1e-3f;
        x = mlc_from_data(ctx, MLC_SHAPE(64), values);
        q = mlc_quantize(x, scale, zero_point);
        CHECK(q && q->qscale == scale && q->qzero == zero_point);
        CHECK(mlc_read(q, back, 64) == MLC_OK);
        for (i = 0; i < 64; i++) {
            const int want = reference_quantize(values[i], scale, zero_point, -128);
            CHECK_MSG(q->int8[i] == want, "%g (zero point %d) -> %d, reference %d", (double)values[i], zero_point,
                      q->int8[i], want);
            CHECK(test_same_float(back[i], scale * (float)(want - zero_point)));   /* dequantized */
            if (want > -128 && want < 127) CHECK(fabs((double)back[i] - values[i]) <= scale * 0.5 + 1e-6);
        }
    }
    values[0] = NAN;                                                        /* NaN: the zero point */
    CHECK(mlc_write(x, values, 64) == MLC_OK);
    CHECK((q = mlc_quantize(x, 0.5f, 3)) && q->int8[0] == 3);
    CHECK(mlc_quantize(x, 0.0f, 0) == NULL && mlc_error(ctx) == MLC_ERR_ARG);
    CHECK(strstr(mlc_error_message(ctx), "mlc_quantize") != NULL);
    mlc_clear_error(ctx);
    CHECK(mlc_quantize(x, 1.0f, 128) == NULL && mlc_error(ctx) == MLC_ERR_ARG);
    mlc_clear_error(ctx);
    CHECK(mlc_quantize(x, 1e-39f, 0) == NULL && mlc_error(ctx) == MLC_ERR_ARG);   /* 1/scale overflows */
    forgive_int8_fallbacks_named(ctx);
    return 1;
}

static int weights_quantize_per_row(void) {
    mlc_ctx *ctx = test_ctx(2);
    const float w[12] = { 0.5f, -1.0f, 0.25f, 0.0f,    0.0f, 0.0f, 0.0f, 0.0f,    3.0f, 1.5f, -0.01f, 2.999f };
    float back[12];
    mlc_tensor *t = mlc_from_data(ctx, MLC_SHAPE(3, 4), w), *q = mlc_quantize_weight(t), *d;
    int r, i;
    CHECK_MSG(q != NULL, "%s", mlc_error_message(ctx));
    CHECK(q->qscales && q->qscales->size == 3);
    CHECK(test_same_float(mlc_get(q->qscales, 0), 1.0f / 127.0f));
    CHECK(test_same_float(mlc_get(q->qscales, 1), 1.0f));                 /* a row of zeros */
    CHECK(test_same_float(mlc_get(q->qscales, 2), 3.0f / 127.0f));
    for (r = 0; r < 3; r++)
        for (i = 0; i < 4; i++) {
            const float s = mlc_get(q->qscales, (size_t)r);
            CHECK(q->int8[r * 4 + i] == reference_quantize(w[r * 4 + i], s, 0, -127));
            CHECK(q->int8[r * 4 + i] >= -127);
        }
    CHECK(q->int8[1] == -127 && q->int8[8] == 127);
    CHECK((d = mlc_dequantize(q)) && mlc_dtype(d) == MLC_F32);
    CHECK(mlc_read(d, back, 12) == MLC_OK);
    for (i = 0; i < 12; i++) CHECK(fabs((double)back[i] - w[i]) <= 0.5 * mlc_get(q->qscales, (size_t)i / 4) + 1e-7);
    back[5] = INFINITY;
    t = mlc_from_data(ctx, MLC_SHAPE(3, 4), back);
    CHECK(mlc_quantize_weight(t) == NULL && mlc_error(ctx) == MLC_ERR_ARG);
    CHECK_MSG(strstr(mlc_error_message(ctx), "row 1") != NULL, "%s", mlc_error_message(ctx));
    mlc_clear_error(ctx);
    CHECK(mlc_quantize_weight(mlc_zeros(ctx, MLC_SHAPE(0, 3))) == NULL && mlc_error(ctx) == MLC_ERR_SHAPE);
    forgive_int8_fallbacks_named(ctx);
    return 1;
}

/* The dynamic linear computed in doubles from the same quantized integers: each row of x over
   its range [lo, hi] (0 included), scale (hi - lo) / 255, zero point -128 - round(lo / scale) */
static void reference_linear(const float *x, const int8_t *wq, const float *ws, const float *b, int M, int N,
                             int K, float *y) {
    int m, n, k;
    for (m = 0; m < M; m++) {
        float lo = 0.0f, hi = 0.0f, s;
        int xq[256], z;
        for (k = 0; k < K; k++) {
            lo = x[m * K + k] < lo ? x[m * K + k] : lo;
            hi = x[m * K + k] > hi ? x[m * K + k] : hi;
        }
        s = hi > lo ? (hi - lo) / 255.0f : 1.0f;
        {
            const float inverse = 1.0f / s, low = lo * inverse;
            z = -128 - (int)nearbyint((double)low);
        }
        for (k = 0; k < K; k++) xq[k] = reference_quantize(x[m * K + k], s, z, -128);
        for (n = 0; n < N; n++) {
            long long sum = 0;
            for (k = 0; k < K; k++) sum += (long long)(xq[k] - z) * wq[n * K + k];
            y[m * N + n] = (float)sum * (s * ws[n]) + (b ? b[n] : 0.0f);
        }
    }
}

static int dynamic_linear_matches_its_scheme(void) {
    mlc_ctx *ctx = test_ctx(3);
    const int M = 7, N = 13, K = 37;
    mlc_tensor *x = mlc_randn(ctx, MLC_SHAPE(M, K)), *w = mlc_randn(ctx, MLC_SHAPE(N, K)),
               *b = mlc_randn(ctx, MLC_SHAPE(N)), *wq = mlc_quantize_weight(w), *y, *yf;
    float xs[7 * 37], ws[13], bs[13], got[7 * 13], want[7 * 13], flt[7 * 13];
    double dot = 0, nf = 0, ny = 0;
    int i;
    CHECK_MSG(wq != NULL, "%s", mlc_error_message(ctx));
    y = mlc_linear(x, wq, b);
    yf = mlc_linear(x, w, b);
    CHECK_MSG(y && yf, "%s", mlc_error_message(ctx));
    CHECK(mlc_dtype(y) == MLC_F32 && y->shape[0] == M && y->shape[1] == N);
    CHECK(mlc_read(x, xs, (size_t)M * K) == MLC_OK && mlc_read(wq->qscales, ws, (size_t)N) == MLC_OK);
    CHECK(mlc_read(b, bs, (size_t)N) == MLC_OK && mlc_read(y, got, (size_t)M * N) == MLC_OK);
    CHECK(mlc_read(yf, flt, (size_t)M * N) == MLC_OK);
    mlc_host_data(wq->qscales);
    reference_linear(xs, wq->int8, ws, bs, M, N, K, want);
    for (i = 0; i < M * N; i++) {
        CHECK_MSG(test_same_float(got[i], want[i]), "y[%d] = %.9g, the scheme gives %.9g", i, (double)got[i],
                  (double)want[i]);
        dot += (double)got[i] * flt[i]; ny += (double)got[i] * got[i]; nf += (double)flt[i] * flt[i];
    }
    CHECK_MSG(dot / sqrt(ny * nf) > 0.999, "cosine with float32 %.6f", dot / sqrt(ny * nf));
    /* batched input [2, 3, K], no bias, a row of zeros and a row with a NaN */
    {
        float xb[2 * 3 * 37];
        mlc_tensor *x3, *y3;
        for (i = 0; i < 2 * 3 * K; i++) xb[i] = (float)((i * 7919) % 101 - 50) * 0.02f;
        for (i = 0; i < K; i++) xb[K + i] = 0.0f;
        xb[2 * K + 5] = NAN;
        x3 = mlc_from_data(ctx, MLC_SHAPE(2, 3, K), xb);
        y3 = mlc_linear(x3, wq, NULL);
        CHECK_MSG(y3 && y3->ndim == 3 && y3->shape[2] == N, "%s", mlc_error_message(ctx));
        reference_linear(xb, wq->int8, ws, NULL, 6, N, K, want);
        CHECK(mlc_read(y3, got, (size_t)6 * N) == MLC_OK);
        for (i = 0; i < 6 * N; i++)
            if (i / N == 2) CHECK(test_is_nan(got[i]));                     /* the NaN row */
            else CHECK_MSG(test_same_float(got[i], want[i]), "y3[%d] %.9g vs %.9g", i, (double)got[i],
                           (double)want[i]);
        for (i = N; i < 2 * N; i++) CHECK(got[i] == 0.0f);                   /* the zero row */
    }
    forgive_int8_fallbacks_named(ctx);
    return 1;
}

/* dx = g · (s_n W), the rounding of x counted as identity: the float linear on the dequantized
   weight gives the same gradients; db = Σ g */
static int dynamic_linear_gradients(void) {
    mlc_ctx *ctx = test_ctx(4);
    mlc_tensor *w = mlc_randn(ctx, MLC_SHAPE(6, 9)), *wq = mlc_quantize_weight(w), *wd = mlc_dequantize(wq);
    mlc_tensor *x = mlc_requires_grad(mlc_randn(ctx, MLC_SHAPE(4, 9)), 1);
    mlc_tensor *x2 = mlc_requires_grad(mlc_keep(x), 1);
    mlc_tensor *b = mlc_requires_grad(mlc_randn(ctx, MLC_SHAPE(6)), 1), *b2 = mlc_requires_grad(mlc_keep(b), 1);
    mlc_tensor *g = mlc_randn(ctx, MLC_SHAPE(4, 6));
    float gx[36], gx2[36], gb[6], gb2[6];
    int i;
    CHECK_MSG(wd && x2 && b2, "%s", mlc_error_message(ctx));
    CHECK(mlc_backward_with(mlc_linear(x, wq, b), g) == MLC_OK);
    CHECK(mlc_backward_with(mlc_linear(x2, wd, b2), g) == MLC_OK);
    memcpy(gx, mlc_host_grad(x), sizeof gx); memcpy(gx2, mlc_host_grad(x2), sizeof gx2);
    memcpy(gb, mlc_host_grad(b), sizeof gb); memcpy(gb2, mlc_host_grad(b2), sizeof gb2);
    for (i = 0; i < 36; i++) CHECK_NEAR(gx[i], gx2[i], 1e-5);
    for (i = 0; i < 6; i++) CHECK_NEAR(gb[i], gb2[i], 1e-5);
    CHECK(!wq->requires_grad && wq->grad == NULL);
    forgive_int8_fallbacks_named(ctx);
    return 1;
}

static mlc_module *mlp(mlc_ctx *ctx) {
    return mlc_nn_sequential(ctx, mlc_nn_linear(ctx, 20, 32), mlc_nn_relu(ctx), mlc_nn_linear(ctx, 32, 32),
                             mlc_nn_gelu(ctx), mlc_nn_linear_nobias(ctx, 32, 5), NULL);
}

/* Whether bytes hold text */
static int holds(const unsigned char *bytes, size_t size, const char *text) {
    size_t n = strlen(text), i;
    for (i = 0; i + n <= size; i++) if (memcmp(bytes + i, text, n) == 0) return 1;
    return 0;
}

static double cosine(const float *a, const float *b, size_t n) {
    double d = 0, na = 0, nb = 0;
    size_t i;
    for (i = 0; i < n; i++) { d += (double)a[i] * b[i]; na += (double)a[i] * a[i]; nb += (double)b[i] * b[i]; }
    return d / sqrt(na * nb);
}

static int quantize_dynamic_module(void) {
    mlc_ctx *ctx = test_ctx(5);
    mlc_module *m = mlp(ctx), *again;
    mlc_tensor *x = mlc_keep(mlc_randn(ctx, MLC_SHAPE(16, 20))), *w;
    float before[80], after[80], third[80];
    mlc_named_tensor state[16];
    unsigned char *file;
    size_t size;
    mlc_optim *opt;
    int n, i, step;
    CHECK(mlc_read(mlc_forward(m, x), before, 80) == MLC_OK);
    CHECK_MSG(mlc_quantize_dynamic(m) == MLC_OK, "%s", mlc_error_message(ctx));
    CHECK(mlc_quantize_dynamic(m) == MLC_OK);                               /* a second time: nothing */
    n = mlc_module_state(m, state, 16);
    CHECK_MSG(n == 8, "%d state tensors", n);                               /* 3 weights, 2 biases, 3 scales */
    for (i = 0; i < n; i++)
        if (strstr(state[i].name, ".weight") && !strstr(state[i].name, "scale"))
            CHECK_MSG(mlc_dtype(state[i].tensor) == MLC_I8, "%.100s", state[i].name);
    CHECK(strcmp(state[2].name, "0.weight_scale") == 0 && state[2].tensor->size == 32);
    for (step = 0; step < 50; step++) {                                     /* a long-lived context */
        mlc_frame f = mlc_frame_begin(ctx);
        CHECK(mlc_read(mlc_forward(m, x), after, 80) == MLC_OK);
        mlc_frame_end(f);
    }
    CHECK_MSG(cosine(before, after, 80) > 0.999, "cosine %.6f", cosine(before, after, 80));
    w = m->children[0]->params[0];
    CHECK(mlc_module_to_dtype(m, MLC_BF16) == MLC_OK);                      /* int8 and its scales stay */
    CHECK(mlc_dtype(w) == MLC_I8 && mlc_dtype(m->children[0]->buffers[0]) == MLC_F32);
    CHECK(mlc_module_to_dtype(m, MLC_F32) == MLC_OK);
    CHECK(mlc_read(mlc_forward(m, x), after, 80) == MLC_OK);                /* (biases rounded to bf16) */
    /* the file: I8 weights, F32 scales; loads into a quantized model, not into a float one */
    size = mlc_module_encode(m, NULL, NULL, 0);
    CHECK(size > 0 && (file = (unsigned char *)malloc(size)) != NULL);
    CHECK(mlc_module_encode(m, NULL, file, size) == size);
    CHECK(holds(file, size, "\"0.weight\":{\"dtype\":\"I8\""));
    again = mlp(ctx);
    CHECK(mlc_module_load_from_memory(again, file, size, NULL) != MLC_OK);  /* float model */
    CHECK_MSG(strstr(mlc_error_message(ctx), "quantize") && strstr(mlc_error_message(ctx), "0.weight"), "%s",
              mlc_error_message(ctx));
    mlc_clear_error(ctx);
    CHECK(mlc_quantize_dynamic(again) == MLC_OK);
    CHECK_MSG(mlc_module_load_from_memory(again, file, size, NULL) == MLC_OK, "%s", mlc_error_message(ctx));
    CHECK(mlc_read(mlc_forward(again, x), third, 80) == MLC_OK);
    CHECK(memcmp(after, third, sizeof after) == 0);
    free(file);
    /* for inference only */
    opt = mlc_sgd(ctx, m, (mlc_sgd_opts){ .lr = 0.1f });
    if (opt) {
        mlc_step(opt);
        CHECK(mlc_error(ctx) == MLC_ERR_ARG && strstr(mlc_error_message(ctx), "int8"));
        mlc_clear_error(ctx);
    }
    forgive_int8_fallbacks_named(ctx);
    return 1;
}

/* The recurrent layers' products quantize too: weight_ih_lN and weight_hh_lN, PyTorch's names
   with "_scale" for their scales; a bidirectional two-layer LSTM and a GRU stay near float32 */
static int quantize_dynamic_recurrent(void) {
    mlc_ctx *ctx = test_ctx(8);
    mlc_module *lstm = mlc_nn_recurrent(ctx, MLC_CELL_LSTM, 6, 16, (mlc_rnn_opts){ .num_layers = 2,
                                                                                 .bidirectional = 1 });
    mlc_module *gru = mlc_nn_gru(ctx, 6, 12, 1);
    mlc_tensor *x = mlc_keep(mlc_randn(ctx, MLC_SHAPE(3, 5, 6)));
    static float before[3 * 5 * 32], after[3 * 5 * 32];
    mlc_named_tensor state[40];
    int n, i, scales = 0, m;
    for (m = 0; m < 2; m++) {
        mlc_module *net = m ? gru : lstm;
        mlc_tensor *y = mlc_forward(net, x);
        CHECK_MSG(y != NULL, "%s", mlc_error_message(ctx));
        CHECK(mlc_read(y, before, y->size) == MLC_OK);
        CHECK_MSG(mlc_quantize_dynamic(net) == MLC_OK, "%s", mlc_error_message(ctx));
        CHECK(mlc_read(mlc_forward(net, x), after, y->size) == MLC_OK);
        CHECK_MSG(cosine(before, after, y->size) > 0.999, "%s cosine %.6f", m ? "GRU" : "LSTM",
                  cosine(before, after, y->size));
    }
    n = mlc_module_state(lstm, state, 40);
    for (i = 0; i < n; i++) {
        const int is_scale = strstr(state[i].name, "_scale") != NULL;
        scales += is_scale;
        if (strncmp(state[i].name, "weight_", 7) == 0 && !is_scale) CHECK(mlc_dtype(state[i].tensor) == MLC_I8);
        if (strncmp(state[i].name, "bias_", 5) == 0) CHECK(mlc_dtype(state[i].tensor) == MLC_F32);
    }
    CHECK_MSG(scales == 8, "%d scales", scales);                           /* 2 layers x 2 directions x 2 */
    for (i = 0; i < n && strcmp(state[i].name, "weight_hh_l1_reverse_scale"); i++) {}
    CHECK(i < n);
    forgive_int8_fallbacks_named(ctx);
    return 1;
}

/* ---- static quantization ---------------------------------------------------------------- */

/* The requantization reference: z + acc · (s_x s_w / s_y) in doubles, rounded, clamped */
static int reference_requantize(long long acc, float s_x, float s_w, float s_y, int z) {
    const double v = nearbyint((double)acc * (double)((s_x * s_w) / s_y)) + z;
    return v < -128 ? -128 : v > 127 ? 127 : (int)v;
}

/* Within one step of the reference (ties round up in mlc, to even in the reference), and
   equal nearly everywhere */
#define CHECK_LSB(got, want, count, exact) do { \
        int d_ = (got) - (want); \
        CHECK_MSG(d_ >= -1 && d_ <= 1, "%d vs the reference %d", (int)(got), (int)(want)); \
        (exact) += d_ == 0; (count)++; } while (0)

static float bias_values[16];

static int static_linear_and_conv_match_the_reference(void) {
    mlc_ctx *ctx = test_ctx(9);
    const float sx = 0.041f, sy = 0.093f;
    const int zx = -17, zy = 9, N = 2, C = 4, H = 7, W = 6, O = 6, G = 2;
    mlc_tensor *xf = mlc_randn(ctx, MLC_SHAPE(N, C, H, W)), *x = mlc_quantize(xf, sx, zx);
    mlc_tensor *wf = mlc_randn(ctx, MLC_SHAPE(O, C / G, 3, 3)), *w = mlc_quantize_weight(wf), *b, *y, *lw, *ly;
    mlc_conv_opts opts = { 0 };
    int n, o, oh, ow, c, i, j, count = 0, exact = 0, OH, OW;
    for (i = 0; i < 16; i++) bias_values[i] = 0.05f * (float)(i - 8);
    b = mlc_from_data(ctx, MLC_SHAPE(O), bias_values);
    opts.stride = 2; opts.padding = 1; opts.groups = G; opts.dilation = 1;
    y = mlc_conv2d_int8(x, w, b, opts, sy, zy);
    CHECK_MSG(y != NULL, "%s", mlc_error_message(ctx));
    CHECK(mlc_dtype(y) == MLC_I8 && y->qscale == sy && y->qzero == zy);
    OH = y->shape[2]; OW = y->shape[3];
    CHECK(OH == 4 && OW == 3);
    mlc_host_data(w->qscales);
    for (n = 0; n < N; n++)
        for (o = 0; o < O; o++)
            for (oh = 0; oh < OH; oh++)
                for (ow = 0; ow < OW; ow++) {
                    const float sw = mlc_get(w->qscales, (size_t)o);
                    long long acc = 0;
                    for (c = 0; c < C / G; c++)
                        for (i = 0; i < 3; i++)
                            for (j = 0; j < 3; j++) {
                                const int ih = oh * 2 - 1 + i, iw = ow * 2 - 1 + j;
                                const int ch = (o / (O / G)) * (C / G) + c;
                                const int xv = ih >= 0 && ih < H && iw >= 0 && iw < W
                                                   ? x->int8[((n * C + ch) * H + ih) * W + iw] : zx;
                                acc += (long long)(xv - zx) * w->int8[((o * (C / G) + c) * 3 + i) * 3 + j];
                            }
                    {
                        const float s = sx * sw, inverse = 1.0f / s, r = bias_values[o] * inverse;
                        acc += (long long)nearbyint((double)r);   /* (each step a float, as in mlc) */
                    }
                    CHECK_LSB(y->int8[((n * O + o) * OH + oh) * OW + ow], reference_requantize(acc, sx, sw, sy, zy),
                              count, exact);
                }
    CHECK_MSG(exact * 100 >= count * 99, "%d of %d exact", exact, count);
    /* the static linear on a flattened copy */
    lw = mlc_quantize_weight(mlc_randn(ctx, MLC_SHAPE(5, C * H * W)));
    ly = mlc_linear_int8(mlc_flatten(x, 1), lw, NULL, 0.2f, -3);
    CHECK_MSG(ly && ly->shape[0] == N && ly->shape[1] == 5, "%s", mlc_error_message(ctx));
    count = exact = 0;
    for (n = 0; n < N; n++)
        for (o = 0; o < 5; o++) {
            long long acc = 0;
            for (i = 0; i < C * H * W; i++) acc += (long long)(x->int8[n * C * H * W + i] - zx) * lw->int8[o * C * H * W + i];
            CHECK_LSB(ly->int8[n * 5 + o], reference_requantize(acc, sx, mlc_get(lw->qscales, (size_t)o), 0.2f, -3), count,
                      exact);
        }
    CHECK(mlc_conv2d_int8(xf, w, b, opts, sy, zy) == NULL && mlc_error(ctx) == MLC_ERR_ARG);   /* float x */
    mlc_clear_error(ctx);
    CHECK(mlc_conv2d_int8(x, wf, b, opts, sy, zy) == NULL && mlc_error(ctx) == MLC_ERR_ARG);   /* float weight */
    mlc_clear_error(ctx);
    CHECK(mlc_conv2d_int8(x, w, b, opts, 0.0f, zy) == NULL && mlc_error(ctx) == MLC_ERR_ARG);
    mlc_clear_error(ctx);
    CHECK(mlc_conv2d_int8(x, w, b, opts, 1e-30f, zy) == NULL && mlc_error(ctx) == MLC_ERR_ARG);  /* multiplier */
    CHECK_MSG(strstr(mlc_error_message(ctx), "multiplier"), "%s", mlc_error_message(ctx));
    forgive_int8_fallbacks_named(ctx);
    return 1;
}

/* The requantization as mlc documents it, in integers: M = s_x s_w / s_y (float steps) as
   M0 · 2^-shift, M0 its 24-bit mantissa in [2^30, 2^31); z + ⌊(acc M0 + 2^(shift-1)) / 2^shift⌋,
   clamped */
static int fixed_point_requantize(long long acc, float s_x, float s_w, float s_y, int z) {
    const float s = s_x * s_w, M = s / s_y;
    int e, shift;
    const double f = frexp((double)M, &e);                /* M = f 2^e, f in [0.5, 1) */
    const long long m0 = (long long)ldexp(f, 31);
    long long v, d, q;
    shift = 31 - e;
    d = 1LL << shift;
    v = acc * m0 + d / 2;
    q = v >= 0 ? v / d : -((-v + d - 1) / d);            /* ⌊v / d⌋ */
    q += z;
    return q < -128 ? -128 : q > 127 ? 127 : (int)q;
}

/* mlc_conv2d_int8 equals the documented integer scheme bit for bit on the shapes its paths
   take (the direct one on a VNNI CPU: stride 1, groups 1; im2col otherwise): padding 0-2,
   dilation, a non-square kernel, 1 to 70 input channels (patch rows past one slice of k),
   output channels off the kernels' tile rows, -128 among the inputs and the zero point -128 (a
   ReLU's output), 2 images, 1 and 2 threads, every int8 kernel the CPU has */
static int conv_int8_matches_fixed_point(void) {
    static const struct { int C, O, H, W, KH, KW, pad, dil, stride, zx; } cases[] = {
        { 1, 16, 28, 28, 3, 3, 1, 1, 1, 0 }, { 16, 32, 14, 14, 3, 3, 1, 1, 1, -128 }, { 3, 5, 9, 13, 3, 5, 2, 1, 1, 7 },
        { 70, 13, 6, 5, 3, 3, 1, 2, 1, -128 }, { 8, 40, 7, 7, 1, 1, 0, 1, 1, 3 }, { 4, 6, 11, 9, 3, 3, 1, 1, 2, -5 }
    };
    mlc_ctx *ctx = test_ctx(13);
    size_t t;
    int threads, kernel;
    for (t = 0; t < sizeof cases / sizeof cases[0]; t++)
        for (kernel = 0; kernel < 8; kernel++)
        for (threads = 1; threads <= 2 && test_gemm_i8_kernel(ctx, kernel); threads++) {
            const int C = cases[t].C, O = cases[t].O, H = cases[t].H, W = cases[t].W, KH = cases[t].KH,
                      KW = cases[t].KW, zx = cases[t].zx;
            const float sx = 0.02f, sy = 0.07f + 0.01f * (float)t;
            mlc_tensor *x = mlc_quantize(mlc_randn(ctx, MLC_SHAPE(2, C, H, W)), sx, zx);
            mlc_tensor *w = mlc_quantize_weight(mlc_randn(ctx, MLC_SHAPE(O, C, KH, KW)));
            mlc_tensor *b = mlc_mul_scalar(mlc_randn(ctx, MLC_SHAPE(O)), 0.3f), *y;
            mlc_conv_opts opts = { 0 };
            int n, o, oh, ow, c, i, j, OH, OW, wrong = 0;
            mlc_set_threads(ctx, threads);
            CHECK_MSG(x && w && b, "%s", mlc_error_message(ctx));
            x->int8[0] = -128; x->int8[5] = -128; x->int8[x->size - 1] = 127;
            opts.padding = cases[t].pad; opts.dilation = cases[t].dil; opts.stride = cases[t].stride;
            y = mlc_conv2d_int8(x, w, b, opts, sy, -128 + (int)t);
            CHECK_MSG(y != NULL, "case %zu: %s", t, mlc_error_message(ctx));
            OH = y->shape[2]; OW = y->shape[3];
            mlc_host_data(w->qscales);
            for (n = 0; n < 2; n++)
                for (o = 0; o < O; o++)
                    for (oh = 0; oh < OH; oh++)
                        for (ow = 0; ow < OW; ow++) {
                            const float sw = mlc_get(w->qscales, (size_t)o), s = sx * sw, inverse = 1.0f / s,
                                        r = mlc_get(b, (size_t)o) * inverse;
                            long long acc = (long long)nearbyint((double)r);
                            for (c = 0; c < C; c++)
                                for (i = 0; i < KH; i++)
                                    for (j = 0; j < KW; j++) {
                                        const int ih = oh * opts.stride - opts.padding + i * opts.dilation,
                                                  iw = ow * opts.stride - opts.padding + j * opts.dilation;
                                        const int xv = ih >= 0 && ih < H && iw >= 0 && iw < W
                                                           ? x->int8[((n * C + c) * H + ih) * W + iw] : zx;
                                        acc += (long long)(xv - zx) * w->int8[((o * C + c) * KH + i) * KW + j];
                                    }
                            wrong += y->int8[((n * O + o) * OH + oh) * OW + ow]
                                     != fixed_point_requantize(acc, sx, sw, sy, -128 + (int)t);
                        }
            CHECK_MSG(wrong == 0, "case %zu, kernel %s, %d threads: %d of %d outputs differ", t,
                      test_gemm_i8_kernel(ctx, kernel), threads, wrong, 2 * O * OH * OW);
        }
    forgive_int8_fallbacks_named(ctx);
    return 1;
}

/* A small int8 CNN against the float32 one it came from: conv - relu - max pool - avg pool -
   flatten - linear, each output's scale from the float activations' range */
static int static_cnn_tracks_float32(void) {
    mlc_ctx *ctx = test_ctx(10);
    mlc_tensor *x = mlc_rand(ctx, MLC_SHAPE(4, 1, 12, 12)), *w1 = mlc_mul_scalar(mlc_randn(ctx, MLC_SHAPE(8, 1, 3, 3)), 0.5f);
    mlc_tensor *b1 = mlc_mul_scalar(mlc_randn(ctx, MLC_SHAPE(8)), 0.1f);
    mlc_tensor *w2 = mlc_mul_scalar(mlc_randn(ctx, MLC_SHAPE(3, 8 * 3 * 3)), 0.2f);
    mlc_tensor *f1, *f2, *f3, *q, *yq;
    mlc_conv_opts opts = { 0 };
    float top1, top3, lo3, yf[12], yd[12];
    int i;
    opts.padding = 1;
    f1 = mlc_relu(mlc_conv2d(x, w1, b1, opts));
    f2 = mlc_avg_pool2d(mlc_max_pool2d(f1, 2, 2, 0), 2, 2, 0);
    f3 = mlc_linear(mlc_flatten(f2, 1), w2, NULL);
    CHECK_MSG(f3 != NULL, "%s", mlc_error_message(ctx));
    top1 = mlc_item(mlc_max(mlc_flatten(f1, 0), 0, 0));
    top3 = mlc_item(mlc_max(mlc_flatten(f3, 0), 0, 0));
    lo3 = -mlc_item(mlc_max(mlc_flatten(mlc_neg(f3), 0), 0, 0));
    q = mlc_quantize(x, 1.0f / 255.0f, -128);
    q = mlc_conv2d_int8(q, mlc_quantize_weight(w1), b1, opts, top1 / 255.0f, -128);       /* ReLU: [0, max] */
    q = mlc_avg_pool2d(mlc_max_pool2d(q, 2, 2, 0), 2, 2, 0);
    CHECK_MSG(q && mlc_dtype(q) == MLC_I8 && test_same_float(q->qscale, top1 / 255.0f) && q->qzero == -128, "%s",
              mlc_error_message(ctx));
    yq = mlc_linear_int8(mlc_flatten(q, 1), mlc_quantize_weight(w2), NULL, (top3 - lo3) / 255.0f,
                         -128 - (int)nearbyint(lo3 / ((top3 - lo3) / 255.0f)));
    CHECK_MSG(yq != NULL, "%s", mlc_error_message(ctx));
    CHECK(mlc_read(f3, yf, 12) == MLC_OK && mlc_read(yq, yd, 12) == MLC_OK);
    for (i = 0; i < 12; i++)
        CHECK_MSG(fabs((double)yd[i] - yf[i]) <= 0.05 * (top3 - lo3) + 1e-6, "y[%d] %g vs float %g", i, (double)yd[i],
                  (double)yf[i]);
    CHECK_MSG(cosine(yf, yd, 12) > 0.995, "cosine %.5f", cosine(yf, yd, 12));
    forgive_int8_fallbacks_named(ctx);
    return 1;
}

static int int8_pooling_add_and_views(void) {
    mlc_ctx *ctx = test_ctx(11);
    const float v[16] = { -1, 2, 3, -4, 5, 6, -7, 8, 9, 10, 11, 12, -13, 14, 15, 16 };
    static const int8_t raw[6] = { -128, -1, 0, 1, 2, 127 };
    mlc_tensor *x = mlc_quantize(mlc_from_data(ctx, MLC_SHAPE(1, 1, 4, 4), v), 0.125f, 5), *m, *a, *g, *s, *c, *k;
    mlc_pool_opts po;
    int i, count = 0, exact = 0;
    CHECK(x != NULL);
    m = mlc_max_pool2d(x, 2, 2, 0);
    CHECK(m && mlc_dtype(m) == MLC_I8 && m->qscale == 0.125f && m->qzero == 5);
    CHECK(m->int8[0] == 53 && m->int8[1] == 69 && m->int8[2] == 117 && m->int8[3] == 127);   /* 6, 8, 14, 16 (clamped) */
    memset(&po, 0, sizeof po);
    po.stride = 1; po.padding = 1;
    a = mlc_avg_pool2d_opts(x, 3, po);                                        /* padding counts as real 0 */
    CHECK(a && a->shape[2] == 4);
    for (i = 0; i < 16; i++) {
        const int oh = i / 4, ow = i % 4;
        long long sum = 0;
        int dh, dw;
        for (dh = -1; dh <= 1; dh++)
            for (dw = -1; dw <= 1; dw++) {
                const int ih = oh + dh, iw = ow + dw;
                sum += ih >= 0 && ih < 4 && iw >= 0 && iw < 4 ? x->int8[ih * 4 + iw] : 5;
            }
        CHECK_LSB(a->int8[i], (int)nearbyint((double)sum / 9.0), count, exact);
    }
    g = mlc_global_avg_pool2d(x);
    CHECK(g && g->ndim == 2 && g->shape[1] == 1 && mlc_dtype(g) == MLC_I8);
    s = mlc_add_int8(x, mlc_quantize(mlc_from_data(ctx, MLC_SHAPE(1, 1, 4, 4), v), 0.3f, -2), 0.4f, 1);
    CHECK_MSG(s != NULL, "%s", mlc_error_message(ctx));
    for (i = 0; i < 16; i++) {
        const double real = 0.125 * (x->int8[i] - 5) + 0.3 * (mlc_get(mlc_quantize(mlc_from_data(ctx, MLC_SHAPE(1, 1, 4, 4),
                                                                                                  v), 0.3f, -2), (size_t)i) / 0.3);
        const double want = nearbyint(real / 0.4) + 1;
        CHECK_LSB(s->int8[i], (int)(want < -128 ? -128 : want > 127 ? 127 : want), count, exact);
    }
    CHECK(mlc_add_int8(x, m, 0.4f, 1) == NULL && mlc_error(ctx) == MLC_ERR_SHAPE);
    mlc_clear_error(ctx);
    c = mlc_flatten(x, 1);
    CHECK(c && mlc_dtype(c) == MLC_I8 && c->qscale == 0.125f && c->qzero == 5 && c->int8 == x->int8);
    k = mlc_from_const_int8(ctx, MLC_SHAPE(2, 3), raw, 0.5f, -1, NULL);
    CHECK(k && mlc_dtype(k) == MLC_I8 && test_same_float(mlc_get(k, 0), -63.5f) && test_same_float(mlc_get(k, 5), 64.0f));
    CHECK(mlc_write(k, v, 6) != MLC_OK);                                      /* read-only */
    mlc_clear_error(ctx);
    k = mlc_from_const_int8(ctx, MLC_SHAPE(2, 3), raw, 0.0f, 0, mlc_from_data(ctx, MLC_SHAPE(2), v + 1));
    CHECK(k && test_same_float(mlc_get(k, 4), 2.0f * 3.0f));                  /* row 1's scale 3 */
    forgive_int8_fallbacks_named(ctx);
    return 1;
}

/* int8 max and average pooling against the windows taken one by one: 2 x 2 stride 2 (its
   fast path: rows of 1 to 16 outputs, odd widths), 3 x 3 stride 2 padded, ceil_mode, an
   average with and without the padding counted; values at both extremes */
static int int8_pooling_matches_windows(void) {
    static const struct { int H, W, K, S, P, ceil, avg, exclude; } cases[] = {
        { 4, 2, 2, 2, 0, 0, 0, 0 },   { 6, 16, 2, 2, 0, 0, 0, 0 }, { 5, 18, 2, 2, 0, 0, 0, 0 },
        { 7, 29, 2, 2, 0, 0, 0, 0 },  { 3, 31, 2, 2, 0, 1, 0, 0 }, { 9, 33, 3, 2, 1, 0, 0, 0 },
        { 8, 20, 3, 2, 1, 1, 1, 0 },  { 8, 20, 3, 2, 1, 0, 1, 1 }, { 6, 17, 2, 2, 0, 0, 1, 0 }
    };
    mlc_ctx *ctx = test_ctx(14);
    size_t t;
    for (t = 0; t < sizeof cases / sizeof cases[0]; t++) {
        const int H = cases[t].H, W = cases[t].W, K = cases[t].K, S = cases[t].S, P = cases[t].P;
        mlc_tensor *x = mlc_quantize(mlc_mul_scalar(mlc_randn(ctx, MLC_SHAPE(2, 3, H, W)), 3.0f), 0.02f, 11), *y;
        mlc_pool_opts po;
        int plane, oh, ow, i, j, wrong = 0;
        CHECK(x != NULL);
        x->int8[0] = -128; x->int8[1] = 127; x->int8[x->size - 1] = -128;
        memset(&po, 0, sizeof po);
        po.stride = S; po.padding = P; po.ceil_mode = cases[t].ceil; po.exclude_pad = cases[t].exclude;
        y = cases[t].avg ? mlc_avg_pool2d_opts(x, K, po) : mlc_max_pool2d_opts(x, K, po);
        CHECK_MSG(y && mlc_dtype(y) == MLC_I8 && y->qzero == 11, "case %zu: %s", t, mlc_error_message(ctx));
        for (plane = 0; plane < 6; plane++)
            for (oh = 0; oh < y->shape[2]; oh++)
                for (ow = 0; ow < y->shape[3]; ow++) {
                    long long sum = 0;
                    int best = -128, inside = 0, counted = 0, want;
                    for (i = 0; i < K; i++)
                        for (j = 0; j < K; j++) {
                            const int ih = oh * S - P + i, iw = ow * S - P + j;
                            if (ih >= H + P || iw >= W + P) continue;          /* past the padded edge */
                            counted++;
                            if (ih < 0 || ih >= H || iw < 0 || iw >= W) { sum += 11; continue; }
                            inside++;
                            sum += x->int8[(plane * H + ih) * W + iw];
                            best = x->int8[(plane * H + ih) * W + iw] > best ? x->int8[(plane * H + ih) * W + iw] : best;
                        }
                    if (cases[t].exclude) { sum -= 11LL * (counted - inside); counted = inside; }
                    want = !cases[t].avg ? best
                         : sum >= 0 ? (int)((sum + counted / 2) / counted) : -(int)((counted / 2 - sum) / counted);
                    wrong += y->int8[(plane * y->shape[2] + oh) * y->shape[3] + ow] != want;
                }
        CHECK_MSG(wrong == 0, "case %zu: %d outputs differ", t, wrong);
    }
    forgive_int8_fallbacks_named(ctx);
    return 1;
}

static mlc_tensor *halve(mlc_module *m, mlc_tensor *x) { (void)m; return mlc_mul_scalar(x, 0.5f); }

static mlc_module *small_cnn(mlc_ctx *ctx) {
    mlc_module *c[9];
    c[0] = mlc_nn_conv2d(ctx, 1, 6, 3, (mlc_conv_opts){ .padding = 1 });
    c[1] = mlc_nn_batch_norm(ctx, 6);
    c[2] = mlc_nn_relu(ctx);
    c[3] = mlc_nn_max_pool2d(ctx, 2, 2);
    c[4] = mlc_nn_custom(ctx, "Halve", halve, NULL);                  /* no int8 form: runs in float */
    c[5] = mlc_nn_flatten(ctx);
    c[6] = mlc_nn_dropout(ctx, 0.2f);
    c[7] = mlc_nn_linear(ctx, 6 * 5 * 5, 16);
    c[8] = mlc_nn_relu(ctx);
    return mlc_nn_sequential(ctx, c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8],
                             mlc_nn_linear(ctx, 16, 4), NULL);
}

/* mlc_quantize_static on a Sequential with a BatchNorm to fold, fused ReLUs, a float-only
   child and dropout: close to float32, its ranges saved and loaded */
static int quantize_static_sequential(void) {
    mlc_ctx *ctx = test_ctx(12);
    mlc_module *m = small_cnn(ctx), *again;
    mlc_tensor *calibration[3], *x;
    float before[32], after[32], third[32], stats[6];
    unsigned char *file;
    size_t size;
    int i;
    for (i = 0; i < 6; i++) stats[i] = 0.1f * (float)i - 0.2f;
    CHECK(mlc_write(m->children[1]->buffers[0], stats, 6) == MLC_OK);   /* running mean */
    for (i = 0; i < 6; i++) stats[i] = 0.5f + 0.3f * (float)i;
    CHECK(mlc_write(m->children[1]->buffers[1], stats, 6) == MLC_OK);   /* running var */
    for (i = 0; i < 3; i++) calibration[i] = mlc_keep(mlc_rand(ctx, MLC_SHAPE(8, 1, 10, 10)));
    x = mlc_keep(mlc_rand(ctx, MLC_SHAPE(8, 1, 10, 10)));
    mlc_module_train(m, 0);
    CHECK(mlc_read(mlc_forward(m, x), before, 32) == MLC_OK);
    CHECK(mlc_quantize_static(m, calibration, 0) == MLC_ERR_ARG);           /* no calibration data */
    CHECK_MSG(strstr(mlc_error_message(ctx), "calibration"), "%s", mlc_error_message(ctx));
    mlc_clear_error(ctx);
    CHECK(mlc_quantize_static(m->children[0], calibration, 3) == MLC_ERR_ARG);   /* not a Sequential */
    mlc_clear_error(ctx);
    CHECK_MSG(mlc_quantize_static(m, calibration, 3) == MLC_OK, "%s", mlc_error_message(ctx));
    CHECK(mlc_dtype(m->children[0]->params[0]) == MLC_I8 && mlc_dtype(m->children[7]->params[0]) == MLC_I8);
    for (i = 0; i < m->children[0]->n_buffers && strcmp(m->children[0]->buffer_names[i], "zero_point"); i++) {}
    CHECK(i < m->children[0]->n_buffers);                                   /* conv - BN - ReLU: [0, max] */
    CHECK_MSG(mlc_get(m->children[0]->buffers[i], 0) == -128.0f, "the conv's zero point %g",
              (double)mlc_get(m->children[0]->buffers[i], 0));
    CHECK(mlc_read(mlc_forward(m, x), after, 32) == MLC_OK);
    CHECK_MSG(cosine(before, after, 32) > 0.99, "cosine %.5f", cosine(before, after, 32));
    size = mlc_module_encode(m, NULL, NULL, 0);
    CHECK(size > 0 && (file = (unsigned char *)malloc(size)) != NULL && mlc_module_encode(m, NULL, file, size) == size);
    CHECK(holds(file, size, "\"input_scale\"") && holds(file, size, "\"0.zero_point\""));
    CHECK(holds(file, size, "\"0.zero_point\":{\"dtype\":\"I32\"")                 /* zero points in integers */
          && holds(file, size, "\"input_zero_point\":{\"dtype\":\"I32\"")
          && holds(file, size, "\"0.scale\":{\"dtype\":\"F32\""));
    again = small_cnn(ctx);
    CHECK(mlc_quantize_static(again, calibration + 2, 1) == MLC_OK);        /* other ranges, then the file's */
    CHECK_MSG(mlc_module_load_from_memory(again, file, size, NULL) == MLC_OK, "%s", mlc_error_message(ctx));
    CHECK(mlc_read(mlc_forward(again, x), third, 32) == MLC_OK);
    CHECK(memcmp(after, third, sizeof after) == 0);
    free(file);
    forgive_int8_fallbacks_named(ctx);
    return 1;
}

/* b's parameters and buffers made equal to a's (same structure) */
static int copy_state(mlc_module *b, mlc_module *a) {
    mlc_named_tensor sa[16], sb[16];
    float v[4096];
    int n = mlc_module_state(a, sa, 16), i;
    if (n != mlc_module_state(b, sb, 16)) return 0;
    for (i = 0; i < n; i++)
        if (sa[i].tensor->size > 4096 || mlc_read(sa[i].tensor, v, sa[i].tensor->size) != MLC_OK
            || mlc_write(sb[i].tensor, v, sb[i].tensor->size) != MLC_OK)
            return 0;
    return 1;
}

/* The percentile observer: one outlier in the calibration data stretches min/max's scale, not
   the 98th percentile's (the outlier row's outputs are 1.6 % of them) */
static int percentile_observer_ignores_outliers(void) {
    mlc_ctx *ctx = test_ctx(14);
    mlc_module *plain = mlc_nn_sequential(ctx, mlc_nn_linear(ctx, 16, 8), NULL), *clipped;
    mlc_tensor *calibration = mlc_keep(mlc_rand(ctx, MLC_SHAPE(64, 16))), *x = mlc_keep(mlc_rand(ctx, MLC_SHAPE(32, 16)));
    mlc_quant_opts opts = mlc_quant_defaults();
    float want[256], a[256], b[256], outlier = 1000.0f;
    double err_plain = 0, err_clipped = 0;
    int i;
    clipped = mlc_nn_sequential(ctx, mlc_nn_linear(ctx, 16, 8), NULL);
    CHECK(copy_state(clipped, plain));
    CHECK(mlc_read(mlc_forward(plain, x), want, 256) == MLC_OK);
    mlc_host_data(calibration)[5] = outlier;
    CHECK(mlc_write(calibration, mlc_host_data(calibration), calibration->size) == MLC_OK);
    CHECK(opts.percentile == 0.0f);
    CHECK(mlc_quantize_static(plain, &calibration, 1) == MLC_OK);
    opts.percentile = 30.0f;
    CHECK(mlc_quantize_static_opts(clipped, &calibration, 1, opts) == MLC_ERR_ARG);
    CHECK_MSG(strstr(mlc_error_message(ctx), "percentile 30"), "%s", mlc_error_message(ctx));
    mlc_clear_error(ctx);
    opts.percentile = 98.0f;
    CHECK(mlc_quantize_static_opts(clipped, &calibration, 1, opts) == MLC_OK);
    CHECK(mlc_get(plain->buffers[0], 0) > 3.0f);                             /* input_scale: 1000 / 255 */
    CHECK_MSG(mlc_get(clipped->buffers[0], 0) < 0.01f, "input scale %g", (double)mlc_get(clipped->buffers[0], 0));
    CHECK(mlc_read(mlc_forward(plain, x), a, 256) == MLC_OK && mlc_read(mlc_forward(clipped, x), b, 256) == MLC_OK);
    for (i = 0; i < 256; i++) {
        err_plain += fabs((double)a[i] - want[i]);
        err_clipped += fabs((double)b[i] - want[i]);
    }
    CHECK_MSG(err_clipped * 10 < err_plain, "mean error %g (98th percentile) vs %g (min/max)", err_clipped / 256,
              err_plain / 256);
    forgive_int8_fallbacks_named(ctx);
    return 1;
}

/* Linear - BatchNorm - ReLU (an MLP's block): the BatchNorm folded into the Linear, the ReLU's
   range the Linear's; a BatchNorm that follows no product stays in float32 with its range */
static int quantize_static_mlp_blocks(void) {
    mlc_ctx *ctx = test_ctx(15);
    mlc_module *m = mlc_nn_sequential(ctx, mlc_nn_batch_norm(ctx, 12), mlc_nn_linear(ctx, 12, 20),
                                      mlc_nn_batch_norm(ctx, 20), mlc_nn_relu(ctx), mlc_nn_linear(ctx, 20, 5), NULL);
    mlc_tensor *calibration = mlc_keep(mlc_randn(ctx, MLC_SHAPE(64, 12))), *x = mlc_keep(mlc_randn(ctx, MLC_SHAPE(16, 12)));
    float stats[20], before[80], after[80];
    int i;
    for (i = 0; i < 20; i++) stats[i] = 0.5f + 0.05f * (float)i;
    CHECK(mlc_write(m->children[2]->buffers[1], stats, 20) == MLC_OK);     /* running var */
    CHECK(mlc_write(m->children[0]->buffers[1], stats, 12) == MLC_OK);
    mlc_module_train(m, 0);
    CHECK(mlc_read(mlc_forward(m, x), before, 80) == MLC_OK);
    CHECK_MSG(mlc_quantize_static(m, &calibration, 1) == MLC_OK, "%s", mlc_error_message(ctx));
    CHECK(mlc_read(mlc_forward(m, x), after, 80) == MLC_OK);
    CHECK_MSG(cosine(before, after, 80) > 0.99, "cosine %.5f", cosine(before, after, 80));
    CHECK(mlc_dtype(m->children[1]->params[0]) == MLC_I8);
    for (i = 0; i < m->children[1]->n_buffers && strcmp(m->children[1]->buffer_names[i], "zero_point"); i++) {}
    CHECK(i < m->children[1]->n_buffers && mlc_get(m->children[1]->buffers[i], 0) == -128.0f);
    CHECK(m->children[0]->n_buffers == 5);                                  /* the first BatchNorm: float32 */
    forgive_int8_fallbacks_named(ctx);
    return 1;
}

/* A quantized model's file with a bad scale or zero point, or an int8 weight of the wrong
   shape, is refused naming the tensor, and nothing is loaded */
static int corrupt_quantized_files_refused(void) {
    mlc_ctx *ctx = test_ctx(13);
    mlc_module *m = small_cnn(ctx), *other;
    mlc_tensor *calibration = mlc_keep(mlc_rand(ctx, MLC_SHAPE(4, 1, 10, 10)));
    mlc_named_tensor state[40];
    static const struct { const char *name; float value; } bad[] = {
        { "7.weight_scale", 0.0f }, { "7.weight_scale", -0.5f }, { "0.weight_scale", NAN }, { "0.scale", INFINITY },
        { "input_scale", 0.0f }, { "0.zero_point", 300.0f }, { "7.zero_point", 1.5f }, { "input_zero_point", -129.0f },
    };
    unsigned char *file;
    float values[64];
    size_t size, b;
    int n, i, k;
    CHECK(mlc_quantize_static(m, &calibration, 1) == MLC_OK);
    other = small_cnn(ctx);
    CHECK(mlc_quantize_static(other, &calibration, 1) == MLC_OK);
    n = mlc_module_state(m, state, 40);
    for (b = 0; b < sizeof bad / sizeof bad[0]; b++) {
        float keep, first;
        for (i = 0; i < n && strcmp(state[i].name, bad[b].name); i++) {}
        CHECK_MSG(i < n, "no %s", bad[b].name);
        CHECK(state[i].tensor->size <= 64 && mlc_read(state[i].tensor, values, state[i].tensor->size) == MLC_OK);
        keep = values[0];
        values[0] = bad[b].value;                             /* the first value (of one, or a row's) */
        CHECK(mlc_write(state[i].tensor, values, state[i].tensor->size) == MLC_OK);
        size = mlc_module_encode(m, NULL, NULL, 0);
        CHECK((file = (unsigned char *)malloc(size)) != NULL && mlc_module_encode(m, NULL, file, size) == size);
        first = mlc_get(other->children[0]->params[1], 0);
        CHECK_MSG(mlc_module_load_from_memory(other, file, size, NULL) == MLC_ERR_IO, "%s: %s", bad[b].name,
                  mlc_error_message(ctx));
        CHECK_MSG(strstr(mlc_error_message(ctx), bad[b].name) && strstr(mlc_error_message(ctx), "index 0"), "%s",
                  mlc_error_message(ctx));
        mlc_clear_error(ctx);
        CHECK(test_same_float(mlc_get(other->children[0]->params[1], 0), first));   /* nothing loaded */
        free(file);
        values[0] = keep;
        CHECK(mlc_write(state[i].tensor, values, state[i].tensor->size) == MLC_OK);
    }
    /* an int8 weight of another shape */
    k = 0;
    {
        mlc_module *wide = mlc_nn_sequential(ctx, mlc_nn_linear(ctx, 8, 3), NULL), *narrow;
        mlc_tensor *c8 = mlc_keep(mlc_rand(ctx, MLC_SHAPE(2, 8)));
        narrow = mlc_nn_sequential(ctx, mlc_nn_linear(ctx, 7, 3), NULL);
        CHECK(mlc_quantize_static(wide, &c8, 1) == MLC_OK && mlc_quantize_dynamic(narrow) == MLC_OK);
        size = mlc_module_encode(wide, NULL, NULL, 0);
        CHECK((file = (unsigned char *)malloc(size)) != NULL && mlc_module_encode(wide, NULL, file, size) == size);
        CHECK(mlc_module_load_from_memory(narrow, file, size, NULL) != MLC_OK);
        CHECK_MSG(strstr(mlc_error_message(ctx), "0.weight"), "%s", mlc_error_message(ctx));
        mlc_clear_error(ctx);
        free(file);
        k = 1;
    }
    CHECK(k);
    forgive_int8_fallbacks_named(ctx);
    return 1;
}

/* Every op but the int8 ones refuses an int8 tensor, naming itself; so do gradients */
static int int8_refused_elsewhere(void) {
    mlc_ctx *ctx = test_ctx(6);
    mlc_tensor *x = mlc_randn(ctx, MLC_SHAPE(2, 3)), *q = mlc_quantize(x, 0.1f, 0);
    mlc_tensor *img = mlc_randn(ctx, MLC_SHAPE(1, 1, 4, 4)), *k = mlc_randn(ctx, MLC_SHAPE(2, 1, 3, 3));
    mlc_tensor *qb = mlc_quantize(mlc_randn(ctx, MLC_SHAPE(2)), 0.1f, 0);
    CHECK(q && qb);
#define REFUSED(call, name) do { \
        CHECK((call) == NULL && mlc_error(ctx) == MLC_ERR_ARG); \
        CHECK_MSG(strstr(mlc_error_message(ctx), name) && strstr(mlc_error_message(ctx), "int8"), "%s", \
                  mlc_error_message(ctx)); \
        mlc_clear_error(ctx); } while (0)
    REFUSED(mlc_add(x, q), "mlc_add");
    REFUSED(mlc_relu(q), "mlc_relu");
    REFUSED(mlc_matmul(x, mlc_quantize(mlc_randn(ctx, MLC_SHAPE(3, 2)), 0.1f, 0)), "mlc_matmul");
    REFUSED(mlc_conv2d(img, k, qb, (mlc_conv_opts){ 0 }), "mlc_conv2d");         /* an optional input */
    REFUSED(mlc_to_dtype(q, MLC_BF16), "mlc_to_dtype");
    REFUSED(mlc_linear(q, mlc_quantize_weight(mlc_randn(ctx, MLC_SHAPE(4, 3))), NULL), "mlc_linear");
    REFUSED(mlc_requires_grad(q, 1), "mlc_requires_grad");
    REFUSED(mlc_quantize(q, 1.0f, 0), "mlc_quantize");
    CHECK(mlc_dequantize(x) == NULL && mlc_error(ctx) == MLC_ERR_ARG);          /* not int8 */
    mlc_clear_error(ctx);
    CHECK(mlc_host_data(q) == NULL && mlc_error(ctx) == MLC_ERR_ARG);
    mlc_clear_error(ctx);
    CHECK(mlc_from_data_dtype(ctx, MLC_SHAPE(2), (const float[]){ 1, 2 }, MLC_I8) == NULL);
    mlc_clear_error(ctx);
    CHECK(mlc_set_default_dtype(ctx, MLC_I8) == MLC_F32 && mlc_error(ctx) == MLC_ERR_ARG);
    forgive_int8_fallbacks_named(ctx);
    return 1;
#undef REFUSED
}

/* On a device the int8 linear runs on the CPU through copies: counted, and right */
static int int8_ops_fall_back_counted(void) {
    mlc_ctx *ctx = test_ctx(7);
    mlc_tensor *x = mlc_randn(ctx, MLC_SHAPE(3, 8)), *wq = mlc_quantize_weight(mlc_randn(ctx, MLC_SHAPE(4, 8)));
    const size_t before = mlc_get_stats(ctx).fallbacks;
    mlc_tensor *y = mlc_linear(x, wq, NULL), *q, *z;
    CHECK_MSG(y != NULL, "%s", mlc_error_message(ctx));
    CHECK(mlc_has_device(ctx) == y->on_device);
    CHECK(mlc_get_stats(ctx).fallbacks == before + (mlc_has_device(ctx) ? 1 : 0));
    q = mlc_quantize(x, 0.05f, 0);                                   /* the static ones too */
    z = mlc_linear_int8(q, wq, NULL, 0.1f, 0);
    CHECK(z && z->on_device == y->on_device);
    CHECK(mlc_get_stats(ctx).fallbacks == before + (mlc_has_device(ctx) ? 3 : 0));
    CHECK(mlc_relu(mlc_dequantize(z)) != NULL);                      /* back to float ops on the device */
    forgive_int8_fallbacks_named(ctx);
    return 1;
}

const test_case tests_quant[] = {
    TEST(quantize_rounds_to_nearest_even)
    TEST(weights_quantize_per_row)
    TEST(dynamic_linear_matches_its_scheme)
    TEST(dynamic_linear_gradients)
    TEST(quantize_dynamic_module)
    TEST(quantize_dynamic_recurrent)
    TEST(static_linear_and_conv_match_the_reference)
    TEST(conv_int8_matches_fixed_point)
    TEST(static_cnn_tracks_float32)
    TEST(int8_pooling_add_and_views)
    TEST(int8_pooling_matches_windows)
    TEST(quantize_static_sequential)
    TEST(quantize_static_mlp_blocks)
    TEST(percentile_observer_ignores_outliers)
    TEST(corrupt_quantized_files_refused)
    TEST(int8_refused_elsewhere)
    TEST(int8_ops_fall_back_counted)
    { NULL, NULL }
};
