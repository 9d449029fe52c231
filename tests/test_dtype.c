/* bf16 and f16: conversions bit for bit against PyTorch (tests/dtype_table.h, made by
   tools/gen_dtype_table.py from PyTorch's .to()), ops on half tensors (float32 arithmetic,
   rounded once), promotion, the differentiable cast, autocast, the gradient scaler, modules in
   a dtype and their files, and the misuse each refuses. They run on the suite's device: on
   OpenCL half storage and casts on the device (vload_half/vstore_half), on the fake device,
   which cannot cast, the CPU through fallbacks. */
#include "test.h"
#include "dtype_table.h"
#include <stdlib.h>


static float from_bits(uint32_t b) { float v; memcpy(&v, &b, sizeof v); return v; }
/* a and b are the same float, bit for bit; on x87 (i686 without SSE maths) a float returned
   through the FPU's stack comes back quiet, so a signalling NaN only needs to stay a NaN there */
static int same_bits(uint32_t a, uint32_t b) {
#if defined(__i386__) && !defined(__SSE2_MATH__)
    if ((a & 0x7fffffffu) > 0x7f800000u && (b & 0x7fffffffu) > 0x7f800000u) return 1;
#endif
    return a == b;
}
static int bf16_is_nan(uint16_t h) { return (h & 0x7fffu) > 0x7f80u; }

/* Every row of the table: float32 -> bf16 and f16 as PyTorch rounds (a NaN may come back as
   any NaN in bf16: PyTorch's own paths differ, 0x7fc0 or 0xffff), and bf16/f16 -> float32. */
static int casts_match_pytorch_bit_for_bit(void) {
    size_t i;
    for (i = 0; i < MLC_TEST_F32_TO_HALF_COUNT; i++) {
        const uint32_t b = mlc_test_f32_to_half[i].f32_bits;
        const float v = from_bits(b);
        const uint16_t bf = mlc_float_to_bf16(v), f16 = mlc_float_to_f16(v), want = mlc_test_f32_to_half[i].bf16_bits;
        const int nan = (b & 0x7fffffffu) > 0x7f800000u;
        CHECK_MSG(nan ? bf16_is_nan(bf) && bf16_is_nan(want) : bf == want,
                  "float32 0x%08x -> bf16 0x%04x, PyTorch 0x%04x", (unsigned)b, bf, want);
        CHECK_MSG(f16 == mlc_test_f32_to_half[i].f16_bits, "float32 0x%08x -> f16 0x%04x, PyTorch 0x%04x",
                  (unsigned)b, f16, mlc_test_f32_to_half[i].f16_bits);
    }
    for (i = 0; i < MLC_TEST_HALF_TO_F32_COUNT; i++) {
        const uint16_t h = mlc_test_half_to_f32[i].bits;
        CHECK_MSG(same_bits(test_bits(mlc_bf16_to_float(h)), mlc_test_half_to_f32[i].bf16_as_f32),
                  "bf16 0x%04x -> 0x%08x, PyTorch 0x%08x", h, test_bits(mlc_bf16_to_float(h)),
                  (unsigned)mlc_test_half_to_f32[i].bf16_as_f32);
        CHECK_MSG(same_bits(test_bits(mlc_f16_to_float(h)), mlc_test_half_to_f32[i].f16_as_f32),
                  "f16 0x%04x -> 0x%08x, PyTorch 0x%08x", h, test_bits(mlc_f16_to_float(h)),
                  (unsigned)mlc_test_half_to_f32[i].f16_as_f32);
    }
    return 1;
}

/* The array conversions (vectorised, F16C where the CPU has it) give the table's bits too, and
   widen every one of the 65536 patterns as the single conversions do; so does mlc_to_dtype both
   ways on 70001 values (more than one thread's share, not a multiple of 16) on 2 CPU threads. */
static int array_conversions_match_single_ones(void) {
    mlc_ctx *ctx = test_ctx(2);
    float *values = (float *)malloc(MLC_TEST_F32_TO_HALF_COUNT * sizeof(float)), *wide;
    mlc_tensor *b, *h, *patterns;
    size_t i;
    int d;
    CHECK(values != NULL);
    for (i = 0; i < MLC_TEST_F32_TO_HALF_COUNT; i++) values[i] = from_bits(mlc_test_f32_to_half[i].f32_bits);
    b = mlc_from_data_dtype(ctx, MLC_SHAPE((int)MLC_TEST_F32_TO_HALF_COUNT), values, MLC_BF16);
    h = mlc_from_data_dtype(ctx, MLC_SHAPE((int)MLC_TEST_F32_TO_HALF_COUNT), values, MLC_F16);
    CHECK(b && h);
    for (i = 0; i < MLC_TEST_F32_TO_HALF_COUNT; i++) {
        CHECK_MSG(b->half[i] == mlc_float_to_bf16(values[i]), "bf16 array element %zu", i);
        CHECK_MSG(h->half[i] == mlc_test_f32_to_half[i].f16_bits, "f16 array element %zu: 0x%04x, PyTorch 0x%04x",
                  i, h->half[i], mlc_test_f32_to_half[i].f16_bits);
    }
    for (d = 1; d <= 40 && d <= (int)MLC_TEST_F32_TO_HALF_COUNT; d++) {   /* short arrays: the tails */
        float back[40];
        mlc_tensor *t = mlc_from_data_dtype(ctx, MLC_SHAPE(d), values + MLC_TEST_F32_TO_HALF_COUNT - d, MLC_BF16);
        CHECK(t && mlc_read(t, back, (size_t)d) == MLC_OK);
        for (i = 0; i < (size_t)d; i++) {
            const uint16_t want = mlc_float_to_bf16(values[MLC_TEST_F32_TO_HALF_COUNT - d + i]);
            CHECK_MSG(t->half[i] == want && same_bits(test_bits(back[i]), test_bits(mlc_bf16_to_float(want))),
                      "bf16 array of %d, element %zu", d, i);
        }
    }
    free(values);
    for (d = 0; d < 2; d++) {
        patterns = mlc_full_dtype(ctx, MLC_SHAPE(65536), 0.0f, d ? MLC_F16 : MLC_BF16);
        CHECK(patterns && (wide = (float *)malloc(65536 * sizeof(float))) != NULL);
        for (i = 0; i < 65536; i++) patterns->half[i] = (uint16_t)i;
        CHECK(mlc_read(patterns, wide, 65536) == MLC_OK);
        for (i = 0; i < 65536; i++) {
            float one = d ? mlc_f16_to_float((uint16_t)i) : mlc_bf16_to_float((uint16_t)i);
            if (!same_bits(test_bits(wide[i]), test_bits(one))) {
                free(wide);
                CHECK_MSG(0, "%s 0x%04zx widened in an array", d ? "f16" : "bf16", i);
            }
        }
        free(wide);
    }
    test_destroy(ctx);
    ctx = mlc_create(&(mlc_config){ .device = "cpu", .threads = 2, .seed = 2 });
    CHECK(ctx != NULL);
    for (d = 0; d < 2; d++) {
        mlc_tensor *wide_t, *back;
        patterns = mlc_full_dtype(ctx, MLC_SHAPE(70001), 0.0f, d ? MLC_F16 : MLC_BF16);
        CHECK(patterns != NULL);
        for (i = 0; i < 70001; i++) patterns->half[i] = (uint16_t)(i * 40503u);
        wide_t = mlc_to_dtype(patterns, MLC_F32);
        back = mlc_to_dtype(wide_t, d ? MLC_F16 : MLC_BF16);
        CHECK_MSG(wide_t && back, "%s", mlc_error_message(ctx));
        for (i = 0; i < 70001; i++) {
            const uint16_t h16 = patterns->half[i];
            const float one = d ? mlc_f16_to_float(h16) : mlc_bf16_to_float(h16);
            const float w = mlc_host_data(wide_t)[i];
            CHECK_MSG(same_bits(test_bits(w), test_bits(one)), "%s element %zu widened by mlc_to_dtype",
                      d ? "f16" : "bf16", i);
            CHECK_MSG(back->half[i] == (d ? mlc_float_to_f16(w) : mlc_float_to_bf16(w)),
                      "%s element %zu rounded by mlc_to_dtype", d ? "f16" : "bf16", i);
        }
    }
    CHECK(mlc_error(ctx) == MLC_OK);
    mlc_destroy(ctx);
    return 1;
}

/* Made in a dtype, values come back rounded; written values are rounded; a float32 pointer to
   a half tensor's values is refused. */
static int create_read_write_round(void) {
    static const float v[4] = { 1.0f, 1.00390625f, 3.14159265f, 70000.0f };
    mlc_ctx *ctx = test_ctx(1);
    mlc_tensor *b = mlc_from_data_dtype(ctx, MLC_SHAPE(4), v, MLC_BF16);
    mlc_tensor *h = mlc_from_data_dtype(ctx, MLC_SHAPE(2, 2), v, MLC_F16);
    mlc_tensor *f = mlc_full_dtype(ctx, MLC_SHAPE(3), 0.1f, MLC_BF16);
    float back[4];
    int i;
    CHECK(b && h && f && mlc_dtype(b) == MLC_BF16 && mlc_dtype(h) == MLC_F16);
    CHECK(strcmp(mlc_dtype_name(MLC_BF16), "bfloat16") == 0 && strcmp(mlc_dtype_name(MLC_F32), "float32") == 0);
    CHECK(mlc_read(b, back, 4) == MLC_OK);
    for (i = 0; i < 4; i++) CHECK(test_same_float(back[i], mlc_bf16_to_float(mlc_float_to_bf16(v[i]))));
    CHECK(mlc_read(h, back, 4) == MLC_OK);
    for (i = 0; i < 4; i++) CHECK(test_same_float(back[i], mlc_f16_to_float(mlc_float_to_f16(v[i]))));
    CHECK(test_bits(mlc_get(h, 3)) == 0x7f800000u);      /* 70000 overflows float16 */
    CHECK(test_same_float(mlc_get(f, 2), mlc_bf16_to_float(mlc_float_to_bf16(0.1f))));
    CHECK(mlc_write(h, v, 4) == MLC_OK && test_same_float(mlc_get(h, 2), 3.140625f));
    CHECK(mlc_host_data(b) == NULL && mlc_error(ctx) == MLC_ERR_ARG
          && strstr(mlc_error_message(ctx), "bfloat16") && strstr(mlc_error_message(ctx), "mlc_read"));
    mlc_clear_error(ctx);
    CHECK(mlc_full_dtype(ctx, MLC_SHAPE(1), 0.0f, (mlc_scalar_type)7) == NULL && mlc_error(ctx) == MLC_ERR_ARG);
    test_destroy(ctx);
    return 1;
}

/* How many values of the dtype apart a and b (values of it) lie: 0 equal, 1 neighbours */
static long half_ulps(float a, float b, mlc_scalar_type dtype) {
    const unsigned ha = dtype == MLC_BF16 ? mlc_float_to_bf16(a) : mlc_float_to_f16(a),
                   hb = dtype == MLC_BF16 ? mlc_float_to_bf16(b) : mlc_float_to_f16(b);
    const long ka = ha & 0x8000u ? -(long)(ha & 0x7fffu) : (long)ha,
               kb = hb & 0x8000u ? -(long)(hb & 0x7fffu) : (long)hb;
    return ka > kb ? ka - kb : kb - ka;
}

/* An op on half tensors is the float32 op on their values, rounded once: bit for bit, for
   every kind of op (maps, broadcasting, products, reductions, softmax, norms, convolution,
   pooling, attention, shapes, indexing, losses); products (matmul, linear) within one value of
   the dtype, as mlc's bf16 kernel (where the CPU has one) sums in another order. */
typedef mlc_tensor *(*op_fn)(mlc_tensor **in);
static mlc_tensor *op_tanh(mlc_tensor **in) { return mlc_tanh(in[0]); }
static mlc_tensor *op_gelu(mlc_tensor **in) { return mlc_gelu(in[0]); }
static mlc_tensor *op_add(mlc_tensor **in) { return mlc_add(in[0], in[1]); }
static mlc_tensor *op_div(mlc_tensor **in) { return mlc_div(in[0], in[2]); }
static mlc_tensor *op_matmul(mlc_tensor **in) { return mlc_matmul(in[0], mlc_transpose(in[1], 0, 1)); }
static mlc_tensor *op_linear(mlc_tensor **in) { return mlc_linear(in[0], in[1], mlc_slice(in[3], 0, 0, 4)); }
static mlc_tensor *op_sum(mlc_tensor **in) { return mlc_sum(in[0], 1, 0); }
static mlc_tensor *op_var(mlc_tensor **in) { return mlc_var(in[0], 0, 1, 1); }
static mlc_tensor *op_softmax(mlc_tensor **in) { return mlc_log_softmax(in[0], 1); }
static mlc_tensor *op_layer_norm(mlc_tensor **in) { return mlc_layer_norm(in[0], in[3], in[3], 1e-5f); }
static mlc_tensor *op_conv(mlc_tensor **in) {
    mlc_conv_opts o;
    memset(&o, 0, sizeof o);
    o.padding = 1;
    return mlc_conv2d(mlc_reshape(in[0], MLC_SHAPE(1, 2, 3, 4)), mlc_reshape(in[1], MLC_SHAPE(2, 2, 2, 3)), NULL,
                      o);
}
static mlc_tensor *op_pool(mlc_tensor **in) { return mlc_max_pool2d(mlc_reshape(in[0], MLC_SHAPE(1, 1, 4, 6)), 2, 0, 0); }
static mlc_tensor *op_attention(mlc_tensor **in) {
    mlc_attention_opts o;
    memset(&o, 0, sizeof o);
    o.causal = 1;
    return mlc_attention(in[0], in[1], in[2], o);
}
static mlc_tensor *op_slice_concat(mlc_tensor **in) {
    mlc_tensor *parts[2];
    parts[0] = mlc_slice(in[0], 1, 1, 5);
    parts[1] = in[2];
    return mlc_concat(in[0]->ctx, parts, 2, 1);
}
static mlc_tensor *op_mse(mlc_tensor **in) { return mlc_mse_loss(in[0], in[1], MLC_REDUCE_MEAN); }
static mlc_tensor *op_permute(mlc_tensor **in) {
    return mlc_permute(mlc_reshape(in[0], MLC_SHAPE(2, 3, 4)), (const int[]){ 2, 0, 1 });
}

static int ops_on_half_are_float32_rounded_once(void) {
    static const struct { const char *name; op_fn fn; int product; } ops[] = {
        { "tanh", op_tanh, 0 }, { "gelu", op_gelu, 0 }, { "add", op_add, 0 }, { "div", op_div, 0 },
        { "matmul", op_matmul, 1 }, { "linear", op_linear, 1 }, { "sum", op_sum, 0 }, { "var", op_var, 0 },
        { "log_softmax", op_softmax, 0 }, { "layer_norm", op_layer_norm, 0 }, { "conv2d", op_conv, 0 },
        { "max_pool2d", op_pool, 0 }, { "attention", op_attention, 0 },
        { "slice+concat", op_slice_concat, 0 }, { "mse_loss", op_mse, 0 }, { "permute", op_permute, 0 } };
    static const mlc_scalar_type dtypes[2] = { MLC_BF16, MLC_F16 };
    mlc_ctx *ctx = test_ctx(3);
    size_t o, i;
    int d, k;
    for (d = 0; d < 2; d++)
        for (o = 0; o < sizeof ops / sizeof ops[0]; o++) {
            mlc_frame f = mlc_frame_begin(ctx);
            mlc_tensor *half[4], *wide[4], *y, *want;
            float *got, *ref;
            for (k = 0; k < 4; k++) {             /* [4, 6] x3 and [6]: values the dtype holds exactly */
                mlc_tensor *r = k < 3 ? mlc_randn(ctx, MLC_SHAPE(4, 6)) : mlc_randn(ctx, MLC_SHAPE(6));
                half[k] = mlc_to_dtype(r, dtypes[d]);
                wide[k] = mlc_to_dtype(half[k], MLC_F32);
            }
            y = ops[o].fn(half);
            want = mlc_to_dtype(ops[o].fn(wide), dtypes[d]);
            CHECK_MSG(y && want, "%s in %s: %s", ops[o].name, mlc_dtype_name(dtypes[d]), mlc_error_message(ctx));
            CHECK_MSG(mlc_dtype(y) == dtypes[d], "%s in %s gave %s", ops[o].name, mlc_dtype_name(dtypes[d]),
                      mlc_dtype_name(mlc_dtype(y)));
            CHECK(mlc_same_shape(y, want));
            got = (float *)malloc(y->size * sizeof(float) + 1);
            ref = (float *)malloc(y->size * sizeof(float) + 1);
            CHECK(got && ref && mlc_read(y, got, y->size) == MLC_OK && mlc_read(want, ref, want->size) == MLC_OK);
            for (i = 0; i < y->size; i++)
                if (ops[o].product ? half_ulps(got[i], ref[i], dtypes[d]) > 1
                                   : test_bits(got[i]) != test_bits(ref[i])) {
                    free(got); free(ref);
                    CHECK_MSG(0, "%s in %s: element %zu differs from float32's rounded%s", ops[o].name,
                              mlc_dtype_name(dtypes[d]), i, ops[o].product ? " by more than one value" : "");
                }
            free(got); free(ref);
            mlc_frame_end(f);
        }
    CHECK(mlc_get_stats(ctx).widened > 0);
    test_destroy(ctx);
    return 1;
}

/* A gemm hook that counts its calls: with it set, bf16 products take the widened path that a
   CPU without AVX-512 BF16 takes */
static void counting_reference(int ta, int tb, int M, int N, int K, const float *A, const float *B,
                               float beta, float *C, void *user) {
    (*(int *)user)++;
    mlc_gemm_reference(ta, tb, M, N, K, A, B, beta, C);
}

static mlc_ctx *cpu_ctx_hooked(unsigned long long seed, int *calls) {
    mlc_config c;
    memset(&c, 0, sizeof c);
    c.seed = seed;
    c.quiet = 1;
    c.device = "cpu";
    c.gemm = calls ? counting_reference : NULL;
    c.gemm_user = calls;
    return mlc_create(&c);
}

/* A permute of a half tensor on the CPU moves its 16-bit values as they are (no float32 stand-in:
   nothing widened), and its gradient (float32) comes back to where each value came from */
static int permute_moves_half_values(void) {
    mlc_ctx *ctx = cpu_ctx_hooked(0, NULL);
    mlc_tensor *x32, *c, *x, *xr, *y, *yr;
    float got[30], want[30];
    size_t widened;
    int i;
    x32 = mlc_randn(ctx, MLC_SHAPE(2, 3, 5)); c = mlc_randn(ctx, MLC_SHAPE(5, 2, 3));
    x = mlc_requires_grad(mlc_to_dtype(x32, MLC_BF16), 1);
    xr = mlc_requires_grad(mlc_detach(mlc_to_dtype(x, MLC_F32)), 1);   /* the same values, float32 */
    CHECK(x && xr && c);
    widened = mlc_get_stats(ctx).widened;
    y = mlc_permute(x, (const int[]){ 2, 0, 1 });
    CHECK(y && mlc_dtype(y) == MLC_BF16 && mlc_get_stats(ctx).widened == widened);
    yr = mlc_permute(xr, (const int[]){ 2, 0, 1 });
    CHECK(mlc_read(y, got, 30) == MLC_OK && mlc_read(yr, want, 30) == MLC_OK);
    for (i = 0; i < 30; i++) CHECK_MSG(test_bits(got[i]) == test_bits(want[i]), "element %d", i);
    CHECK(mlc_backward(mlc_sum_all(mlc_mul(y, c))) == MLC_OK && mlc_backward(mlc_sum_all(mlc_mul(yr, c))) == MLC_OK);
    CHECK(mlc_host_grad(x) && mlc_host_grad(xr));
    for (i = 0; i < 30; i++)
        CHECK_MSG(mlc_host_grad(x)[i] == mlc_host_grad(xr)[i], "gradient %d: %g, float32's %g", i,
                  (double)mlc_host_grad(x)[i], (double)mlc_host_grad(xr)[i]);
    mlc_destroy(ctx);
    return 1;
}

/* index_select of a half tensor (an embedding table in bf16) moves its 16-bit values as they
   are: nothing widened (a table is not widened whole to gather a few rows), the float32 op's
   values bit for bit, along either axis, and the gradient (float32) added back at each index,
   twice where an index repeats */
static int index_select_moves_half_values(void) {
    mlc_ctx *ctx = cpu_ctx_hooked(0, NULL);
    mlc_tensor *x, *xr, *idx, *y, *yr, *c;
    float got[28], want[28];
    size_t widened;
    int axis, i;
    idx = mlc_from_data(ctx, MLC_SHAPE(4), ((const float[]){ 3, 0, 3, 4 }));
    for (axis = 0; axis < 2; axis++) {
        const int n = axis ? 20 : 28;
        x = mlc_requires_grad(mlc_to_dtype(mlc_randn(ctx, MLC_SHAPE(5, 7)), MLC_BF16), 1);
        xr = mlc_requires_grad(mlc_detach(mlc_to_dtype(x, MLC_F32)), 1);
        CHECK(x && xr && idx);
        widened = mlc_get_stats(ctx).widened;
        y = mlc_index_select(x, axis, idx);
        CHECK_MSG(y && mlc_dtype(y) == MLC_BF16 && mlc_get_stats(ctx).widened == widened, "axis %d: %s", axis,
                  mlc_error_message(ctx));
        yr = mlc_index_select(xr, axis, idx);
        CHECK(yr && mlc_read(y, got, (size_t)n) == MLC_OK && mlc_read(yr, want, (size_t)n) == MLC_OK);
        for (i = 0; i < n; i++) CHECK_MSG(test_bits(got[i]) == test_bits(want[i]), "axis %d, element %d", axis, i);
        c = mlc_randn(ctx, y->ndim, y->shape);
        CHECK(mlc_backward(mlc_sum_all(mlc_mul(mlc_to_dtype(y, MLC_F32), c))) == MLC_OK);
        CHECK(mlc_backward(mlc_sum_all(mlc_mul(yr, c))) == MLC_OK);
        CHECK(mlc_get_stats(ctx).widened == widened && mlc_host_grad(x) && mlc_host_grad(xr));
        for (i = 0; i < 35; i++)
            CHECK_MSG(mlc_host_grad(x)[i] == mlc_host_grad(xr)[i], "axis %d: gradient %d: %g, float32's %g", axis,
                      i, (double)mlc_host_grad(x)[i], (double)mlc_host_grad(xr)[i]);
    }
    CHECK(mlc_error(ctx) == MLC_OK);
    mlc_destroy(ctx);
    return 1;
}

/* Maps, add/sub/mul/div (stretched operands, mixed dtypes), layer norm and softmax along the
   last axis of half tensors run on their values a block or a row at a time, no float32 stand-in
   made (mlc_stats.widened unchanged): the float32 op's values rounded once, bit for bit, in bf16
   and f16, on 1 and 2 threads (tensors past the size the threads share, rows past a block of
   256 values). A softmax along another axis still takes the stand-ins, with the same values.
   Gradients of the ops recorded on the tape (their backward on stand-ins) are float32's where
   the backward reads only the inputs (layer norm, add, mul). */
typedef mlc_tensor *(*half_op_fn)(mlc_tensor **in);
static mlc_tensor *ho_gelu(mlc_tensor **in) { return mlc_gelu(in[0]); }
static mlc_tensor *ho_scale(mlc_tensor **in) { return mlc_mul_scalar(in[0], 0.37f); }
static mlc_tensor *ho_add_row(mlc_tensor **in) { return mlc_add(in[0], in[2]); }           /* [300] */
static mlc_tensor *ho_mul_column(mlc_tensor **in) { return mlc_mul(in[0], in[3]); }       /* [300, 1] */
static mlc_tensor *ho_sub(mlc_tensor **in) { return mlc_sub(in[1], in[0]); }
static mlc_tensor *ho_div(mlc_tensor **in) { return mlc_div(in[0], in[1]); }
static mlc_tensor *ho_add_float(mlc_tensor **in) { return mlc_add(in[0], in[4]); }        /* float32 b */
static mlc_tensor *ho_layer_norm(mlc_tensor **in) { return mlc_layer_norm(in[0], in[2], in[5], 1e-5f); }
static mlc_tensor *ho_layer_norm_plain(mlc_tensor **in) { return mlc_layer_norm(in[1], NULL, NULL, 1e-5f); }
static mlc_tensor *ho_softmax(mlc_tensor **in) { return mlc_softmax(in[0], -1); }
static mlc_tensor *ho_log_softmax(mlc_tensor **in) { return mlc_log_softmax(in[1], 1); }
static mlc_tensor *ho_softmax_columns(mlc_tensor **in) { return mlc_softmax(in[0], 0); }
static int elementwise_ops_take_half_values(void) {
    static const struct { const char *name; half_op_fn fn; int stand_ins, same_grads; } ops[] = {
        { "gelu", ho_gelu, 0, 0 }, { "mul_scalar", ho_scale, 0, 1 }, { "add (a row)", ho_add_row, 0, 1 },
        { "mul (a column)", ho_mul_column, 0, 1 }, { "sub", ho_sub, 0, 1 }, { "div", ho_div, 0, 0 },
        { "add (float32 b)", ho_add_float, 0, 1 }, { "layer_norm", ho_layer_norm, 0, 1 },
        { "layer_norm (no weights)", ho_layer_norm_plain, 0, 1 }, { "softmax", ho_softmax, 0, 0 },
        { "log_softmax", ho_log_softmax, 0, 0 }, { "softmax (axis 0)", ho_softmax_columns, 1, 0 } };
    static const mlc_scalar_type dtypes[2] = { MLC_BF16, MLC_F16 };
    mlc_ctx *ctx = cpu_ctx_hooked(7, NULL);
    float *got = (float *)malloc(90000 * sizeof(float)), *want = (float *)malloc(90000 * sizeof(float));
    size_t o, i, widened;
    int d, k, threads;
    CHECK(ctx && got && want);
    for (threads = 1; threads <= 2; threads++)
        for (d = 0; d < 2; d++)
            for (o = 0; o < sizeof ops / sizeof ops[0]; o++) {
                mlc_frame f = mlc_frame_begin(ctx);
                mlc_tensor *half[6], *wide[6], *y, *yr, *c;
                mlc_set_threads(ctx, threads);
                for (k = 0; k < 6; k++) {  /* x, x2 [300, 300]; w [300]; column [300, 1]; float32; bias */
                    mlc_tensor *r = k < 2 || k == 4 ? mlc_randn(ctx, MLC_SHAPE(300, 300))
                                  : k == 3 ? mlc_randn(ctx, MLC_SHAPE(300, 1)) : mlc_randn(ctx, MLC_SHAPE(300));
                    half[k] = k == 4 ? r : mlc_requires_grad(mlc_detach(mlc_to_dtype(r, dtypes[d])), 1);
                    wide[k] = mlc_requires_grad(mlc_detach(mlc_to_dtype(half[k], MLC_F32)), 1);
                }
                widened = mlc_get_stats(ctx).widened;
                y = ops[o].fn(half);
                CHECK_MSG(y && mlc_get_stats(ctx).widened == widened + (size_t)ops[o].stand_ins,
                          "%s in %s, %d threads: %s (%zu widened)", ops[o].name, mlc_dtype_name(dtypes[d]),
                          threads, mlc_error_message(ctx), mlc_get_stats(ctx).widened - widened);
                yr = ops[o].fn(wide);
                CHECK(yr && mlc_dtype(y) == (ops[o].fn == ho_add_float ? MLC_F32 : dtypes[d]));
                CHECK(mlc_read(y, got, y->size) == MLC_OK
                      && mlc_read(mlc_to_dtype(yr, mlc_dtype(y)), want, y->size) == MLC_OK);
                for (i = 0; i < y->size; i++)
                    CHECK_MSG(test_bits(got[i]) == test_bits(want[i]), "%s in %s, %d threads: element %zu: %g, "
                              "float32's rounded %g", ops[o].name, mlc_dtype_name(dtypes[d]), threads, i,
                              (double)got[i], (double)want[i]);
                c = mlc_randn(ctx, y->ndim, y->shape);
                CHECK(mlc_backward(mlc_sum_all(mlc_mul(mlc_to_dtype(y, MLC_F32), c))) == MLC_OK);
                CHECK(mlc_backward(mlc_sum_all(mlc_mul(yr, c))) == MLC_OK);
                for (k = 0; ops[o].same_grads && k < 6; k++)
                    if (k != 4 && half[k]->grad) {
                        CHECK(wide[k]->grad != NULL);
                        for (i = 0; i < half[k]->size; i++)
                            CHECK_MSG(test_bits(half[k]->grad[i]) == test_bits(wide[k]->grad[i]),
                                      "%s in %s: input %d's gradient %zu: %g, float32's %g", ops[o].name,
                                      mlc_dtype_name(dtypes[d]), k, i, (double)half[k]->grad[i],
                                      (double)wide[k]->grad[i]);
                    }
                mlc_frame_end(f);
            }
    CHECK(mlc_error(ctx) == MLC_OK);
    free(got); free(want);
    mlc_destroy(ctx);
    return 1;
}

/* Whether mlc runs its bf16 kernel here: mlc.h's condition for building it (MLC__BF16_X86), and
   the CPU's AVX-512 BF16 */
static int bf16_kernel_here(void) {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(MLC_USE_CBLAS) && !defined(MLC_NO_MALLOC) \
    && ((defined(__clang__) && __clang_major__ >= 11) || (!defined(__clang__) && __GNUC__ >= 10))
    return __builtin_cpu_supports("avx512bf16");
#else
    return 0;
#endif
}

/* mlc_gemm_bf16 against a double sum of the same bf16 values, within the worst case of K float32
   sums in any order ((K + 2) roundings of sum |ab| + |beta C|): the four transposes, beta 0 and
   1, edge sizes (1x1x1, odd K, M and N off the 12 x 32 and 8 x 32 tiles, K over one slice of 512,
   M over one block of 192, N over one panel of 2048; threads sharing rows and columns), on 1
   and 3 threads, which give the same bits; then again through a gemm hook (the widened path). */
static int bf16_gemm_matches_double_sums(void) {
    static const int sizes[][3] = { { 1, 1, 1 }, { 1, 7, 3 }, { 13, 33, 1 }, { 12, 32, 2 }, { 8, 32, 3 },
                                    { 25, 65, 17 }, { 64, 64, 64 }, { 97, 130, 513 }, { 2, 2000, 3 },
                                    { 3, 2100, 5 }, { 200, 97, 1030 }, { 16, 40, 9 }, { 194, 832, 514 } };
    int hooked, calls = 0;
    for (hooked = 0; hooked < 2; hooked++) {
        mlc_ctx *ctx = cpu_ctx_hooked(20, hooked ? &calls : NULL);
        size_t s;
        for (s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
            const int M = sizes[s][0], N = sizes[s][1], K = sizes[s][2];
            if (hooked && (double)M * N * K > 4e6) continue;   /* the widened path: the small ones */
            const size_t na = (size_t)M * K, nb = (size_t)K * N, nc = (size_t)M * N;
            uint16_t *a = (uint16_t *)malloc(na * 2), *b = (uint16_t *)malloc(nb * 2);   /* op(A), op(B) */
            uint16_t *A = (uint16_t *)malloc(na * 2), *B = (uint16_t *)malloc(nb * 2);   /* as stored */
            float *C0 = (float *)malloc(nc * 4), *C = (float *)malloc(nc * 4), *C3 = (float *)malloc(nc * 4);
            double *sum = (double *)malloc(nc * sizeof(double)), *mag = (double *)malloc(nc * sizeof(double));
            size_t x;
            int i, j, k, t, beta;
            CHECK(a && b && A && B && C0 && C && C3 && sum && mag);
            for (x = 0; x < na; x++) a[x] = mlc_float_to_bf16(4.0f * (mlc_rand_uniform(ctx) - 0.5f));
            for (x = 0; x < nb; x++) b[x] = mlc_float_to_bf16(mlc_rand_uniform(ctx) - 0.5f);
            for (x = 0; x < nc; x++) C0[x] = mlc_rand_uniform(ctx) - 0.5f;
            for (i = 0; i < M; i++)
                for (j = 0; j < N; j++) {
                    double sm = 0, mg = 0;
                    for (k = 0; k < K; k++) {
                        double p = (double)mlc_bf16_to_float(a[(size_t)i * K + k])
                                   * mlc_bf16_to_float(b[(size_t)k * N + j]);
                        sm += p;
                        mg += fabs(p);
                    }
                    sum[(size_t)i * N + j] = sm;
                    mag[(size_t)i * N + j] = mg;
                }
            for (t = 0; t < 4; t++) {
                const int ta = t & 1, tb = t >> 1;
                for (i = 0; i < M; i++)
                    for (k = 0; k < K; k++)
                        A[ta ? (size_t)k * M + i : (size_t)i * K + k] = a[(size_t)i * K + k];
                for (k = 0; k < K; k++)
                    for (j = 0; j < N; j++)
                        B[tb ? (size_t)j * K + k : (size_t)k * N + j] = b[(size_t)k * N + j];
                for (beta = 0; beta < 2; beta++) {
                    memcpy(C, C0, nc * 4);
                    memcpy(C3, C0, nc * 4);
                    mlc_set_threads(ctx, 1);
                    mlc_gemm_bf16(ctx, ta, tb, M, N, K, A, B, (float)beta, C);
                    mlc_set_threads(ctx, 3);
                    mlc_gemm_bf16(ctx, ta, tb, M, N, K, A, B, (float)beta, C3);
                    CHECK_MSG(mlc_error(ctx) == MLC_OK, "%s", mlc_error_message(ctx));
                    CHECK_MSG(memcmp(C, C3, nc * 4) == 0,
                              "M %d N %d K %d ta %d tb %d beta %d: 1 and 3 threads differ", M, N, K, ta, tb, beta);
                    for (x = 0; x < nc; x++) {
                        const double c0 = beta ? (double)C0[x] : 0.0, want = sum[x] + c0,
                                     tol = (K + 2) * ldexp(1.0, -24) * (mag[x] + fabs(c0));
                        CHECK_MSG(fabs((double)C[x] - want) <= tol,
                                  "M %d N %d K %d ta %d tb %d beta %d%s: C[%zu] = %.9g, want %.9g", M, N, K,
                                  ta, tb, beta, hooked ? " (hook)" : "", x, (double)C[x], want);
                    }
                }
            }
            free(a); free(b); free(A); free(B); free(C0); free(C); free(C3); free(sum); free(mag);
        }
        test_destroy(ctx);
    }
    CHECK(calls > 0);                                    /* the hook took the widened products */
    return 1;
}

/* Products of bf16 tensors take mlc's bf16 kernel where it runs, with no float32 stand-ins (the
   widened count stays; a gemm hook sends them through stand-ins), and come within one bf16
   value of float32's product rounded once: a batched matmul with both transposes, linear with
   its bias, and linear with the relu fused into it (a sequential's Linear then ReLU). */
static int bf16_products_on_the_kernel(void) {
    int hooked, calls = 0;
    for (hooked = 0; hooked < 2; hooked++) {
        mlc_ctx *ctx = cpu_ctx_hooked(21, hooked ? &calls : NULL);
        mlc_module *lin = mlc_nn_linear(ctx, 70, 45);
        mlc_module *net = mlc_nn_sequential(ctx, lin, mlc_nn_relu(ctx), NULL);
        mlc_tensor *x = mlc_to_dtype(mlc_randn(ctx, MLC_SHAPE(37, 70)), MLC_BF16);
        mlc_tensor *a = mlc_to_dtype(mlc_randn(ctx, MLC_SHAPE(3, 70, 37)), MLC_BF16);
        mlc_tensor *b = mlc_to_dtype(mlc_randn(ctx, MLC_SHAPE(3, 45, 70)), MLC_BF16);
        mlc_tensor *got[3], *want[3], *w, *bias, *xf = mlc_to_dtype(x, MLC_F32);
        size_t widened, i;
        int k;
        mlc_set_threads(ctx, 3);
        CHECK(net && mlc_module_to_dtype(net, MLC_BF16) == MLC_OK);
        w = mlc_to_dtype(lin->params[0], MLC_F32);
        bias = mlc_to_dtype(lin->params[1], MLC_F32);
        widened = mlc_get_stats(ctx).widened;
        got[0] = mlc_matmul_t(a, b, 1, 1);
        got[1] = mlc_linear(x, lin->params[0], lin->params[1]);
        got[2] = mlc_forward(net, x);
        CHECK_MSG(mlc_get_stats(ctx).widened - widened == (hooked || !bf16_kernel_here() ? 3u : 0u),
                  "%zu products widened", mlc_get_stats(ctx).widened - widened);
        want[0] = mlc_matmul_t(mlc_to_dtype(a, MLC_F32), mlc_to_dtype(b, MLC_F32), 1, 1);
        want[1] = mlc_linear(xf, w, bias);
        want[2] = mlc_relu(mlc_linear(xf, w, bias));
        for (k = 0; k < 3; k++) {
            CHECK_MSG(got[k] && want[k] && mlc_dtype(got[k]) == MLC_BF16 && mlc_same_shape(got[k], want[k]),
                      "%s", mlc_error_message(ctx));
            for (i = 0; i < got[k]->size; i++) {
                const float g = mlc_get(got[k], i);
                const float r = mlc_bf16_to_float(mlc_float_to_bf16(mlc_get(want[k], i)));
                CHECK_MSG(half_ulps(g, r, MLC_BF16) <= (hooked ? 0 : 1),
                          "product %d%s: element %zu is %g, want %g", k, hooked ? " (hook)" : "", i, (double)g,
                          (double)r);
            }
        }
        CHECK(mlc_error(ctx) == MLC_OK);
        test_destroy(ctx);
    }
    CHECK(calls > 0);
    return 1;
}

/* A bf16 convolution on the fast path (stride 1, groups 1) runs on the bf16 kernel where the CPU
   has one: nothing widened, forward or backward; y within one bf16 value of float32's rounded,
   dx within float32 sums' reach of float32's (dy is rounded to bf16 for it: here dy already is
   bf16's), dW and db bit for bit (float32 products of the same values); 1 and 2 threads give
   the same bits. With a gemm hook (no kernel) the stand-ins run, as on a CPU without AVX-512
   BF16, and every value is float32's. */
static int bf16_convolutions_on_the_kernel(void) {
    static const struct { int N, C, H, W, O, K, pad, dil, kind; } cases[] = {
        { 3, 3, 7, 9, 10, 3, 1, 1, 0 },       /* kind 0: conv2d with a bias; 10 rows: 12-row tiles */
        { 2, 7, 6, 5, 16, 5, 2, 1, 1 },       /* 1: no bias; 175 rows of col, the last pair padded */
        { 2, 64, 5, 6, 8, 3, 1, 1, 2 },       /* 2: Sequential's Conv2d + ReLU fused; two slices of k */
        { 2, 2, 9, 9, 5, 3, 2, 2, 3 },        /* 3: mlc_conv2d_relu6; dilation 2 */
        { 4, 1, 28, 28, 16, 3, 1, 1, 2 } };   /* the Fashion CNN's first layer: 27 slivers of columns */
    int hooked, calls = 0, threads, k;
    size_t c, i;
    for (hooked = 0; hooked < 2; hooked++)
        for (c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            float *first[4] = { NULL, NULL, NULL, NULL };
            for (threads = 1; threads <= 2; threads++) {
                mlc_ctx *ctx = cpu_ctx_hooked(30 + c, hooked ? &calls : NULL);
                mlc_conv_opts o;
                mlc_module *conv, *net;
                mlc_tensor *x, *w, *b, *x32, *w32, *b32, *y, *want, *dy, *got[4], *ref[4];
                const size_t expect = hooked || !bf16_kernel_here() ? 1u : 0u;
                size_t widened;
                memset(&o, 0, sizeof o);
                o.padding = cases[c].pad; o.dilation = cases[c].dil;
                conv = mlc_nn_conv2d(ctx, cases[c].C, cases[c].O, cases[c].K, o);
                net = mlc_nn_sequential(ctx, conv, mlc_nn_relu(ctx), NULL);
                mlc_set_threads(ctx, threads);
                CHECK(net && mlc_module_to_dtype(net, MLC_BF16) == MLC_OK);
                w = conv->params[0]; b = cases[c].kind == 1 ? NULL : conv->params[1];
                x = mlc_requires_grad(mlc_to_dtype(mlc_randn(ctx, MLC_SHAPE(cases[c].N, cases[c].C, cases[c].H,
                                                                            cases[c].W)), MLC_BF16), 1);
                x32 = mlc_requires_grad(mlc_to_dtype(mlc_detach(x), MLC_F32), 1);
                w32 = mlc_requires_grad(mlc_to_dtype(mlc_detach(w), MLC_F32), 1);
                b32 = b ? mlc_requires_grad(mlc_to_dtype(mlc_detach(b), MLC_F32), 1) : NULL;
                widened = mlc_get_stats(ctx).widened;
                y = cases[c].kind == 2 ? mlc_forward(net, x)
                  : cases[c].kind == 3 ? mlc_conv2d_relu6(x, w, b, o) : mlc_conv2d(x, w, b, o);
                CHECK_MSG(y && mlc_dtype(y) == MLC_BF16, "case %zu: %s", c, mlc_error_message(ctx));
                CHECK_MSG(mlc_get_stats(ctx).widened - widened == expect, "case %zu: %zu widened forward", c,
                          mlc_get_stats(ctx).widened - widened);
                want = cases[c].kind == 2 ? mlc_relu(mlc_conv2d(x32, w32, b32, o))
                     : cases[c].kind == 3 ? mlc_conv2d_relu6(x32, w32, b32, o) : mlc_conv2d(x32, w32, b32, o);
                dy = mlc_to_dtype(mlc_to_dtype(mlc_randn(ctx, MLC_SHAPE(cases[c].N, cases[c].O, y->shape[2],
                                                                       y->shape[3])), MLC_BF16), MLC_F32);
                CHECK(want && dy && mlc_same_shape(y, want));
                for (i = 0; i < y->size; i++) {
                    const float g = mlc_get(y, i), r = mlc_bf16_to_float(mlc_float_to_bf16(mlc_get(want, i)));
                    CHECK_MSG(half_ulps(g, r, MLC_BF16) <= (hooked ? 0 : 1), "case %zu: y[%zu] %g, want %g", c, i,
                              (double)g, (double)r);
                }
                widened = mlc_get_stats(ctx).widened;
                CHECK(mlc_backward(mlc_sum_all(mlc_mul(mlc_to_dtype(y, MLC_F32), dy))) == MLC_OK);
                CHECK_MSG(mlc_get_stats(ctx).widened - widened == expect, "case %zu: %zu widened backward", c,
                          mlc_get_stats(ctx).widened - widened);
                CHECK(mlc_backward(mlc_sum_all(mlc_mul(want, dy))) == MLC_OK);
                got[0] = y; got[1] = x; got[2] = w; got[3] = b;
                ref[0] = NULL; ref[1] = x32; ref[2] = w32; ref[3] = b32;
                for (k = 0; k < 4; k++) {
                    const size_t n = got[k] ? got[k]->size : 0;
                    const float *g = k ? mlc_host_grad(got[k]) : NULL, *r = k ? mlc_host_grad(ref[k]) : NULL;
                    float scale = 0.0f;
                    if (!got[k]) continue;
                    CHECK(!k || (g && r));
                    for (i = 0; k && i < n; i++) scale = fabsf(r[i]) > scale ? fabsf(r[i]) : scale;
                    for (i = 0; k && i < n; i++)   /* dx summed in another order; dW, db the same sums */
                        CHECK_MSG(k == 1 && !hooked ? fabsf(g[i] - r[i]) <= 1e-5f * (scale + 1.0f)
                                                    : test_bits(g[i]) == test_bits(r[i]),
                                  "case %zu: gradient %d [%zu] %g, float32's %g", c, k, i, (double)g[i],
                                  (double)r[i]);
                    if (threads == 1) {        /* kept, for 2 threads to give the same bits */
                        first[k] = (float *)malloc(n * sizeof(float) + 1);
                        CHECK(first[k]);
                        if (k) memcpy(first[k], g, n * sizeof(float));
                        else CHECK(mlc_read(y, first[k], n) == MLC_OK);
                    } else {
                        float v;
                        for (i = 0; i < n; i++) {
                            v = k ? g[i] : mlc_get(y, i);
                            CHECK_MSG(test_bits(v) == test_bits(first[k][i]), "case %zu: %d of 2 threads [%zu]",
                                      c, k, i);
                        }
                        free(first[k]);
                    }
                }
                CHECK(mlc_error(ctx) == MLC_OK);
                test_destroy(ctx);
            }
        }
    CHECK(calls > 0);
    return 1;
}

/* PyTorch's promotion: one dtype stays; with float32, or bf16 with f16, float32. Indices and
   conditions do not take part; argmax gives float32 indices. */
static int promotion_as_pytorch(void) {
    mlc_ctx *ctx = test_ctx(4);
    mlc_tensor *b = mlc_full_dtype(ctx, MLC_SHAPE(2, 3), 1.5f, MLC_BF16);
    mlc_tensor *h = mlc_full_dtype(ctx, MLC_SHAPE(2, 3), 2.0f, MLC_F16);
    mlc_tensor *f = mlc_full(ctx, MLC_SHAPE(2, 3), 3.0f);
    mlc_tensor *idx = mlc_from_data(ctx, MLC_SHAPE(2), ((const float[]){ 1, 0 }));
    CHECK(mlc_dtype(mlc_add(b, b)) == MLC_BF16 && mlc_dtype(mlc_mul(h, h)) == MLC_F16);
    CHECK(mlc_dtype(mlc_add(b, f)) == MLC_F32 && mlc_dtype(mlc_add(b, h)) == MLC_F32);
    CHECK(mlc_dtype(mlc_index_select(b, 0, idx)) == MLC_BF16);
    CHECK(mlc_dtype(mlc_argmax(h, 1)) == MLC_F32 && test_same_float(mlc_get(mlc_argmax(h, 1), 0), 0.0f));
    CHECK(mlc_dtype(mlc_where(f, b, b)) == MLC_BF16 && mlc_dtype(mlc_masked_fill(h, f, 0.0f)) == MLC_F16);
    CHECK(test_same_float(mlc_item(mlc_sum_all(mlc_add(b, f))), 27.0f));
    CHECK(mlc_to_dtype(b, MLC_BF16) == b);               /* a cast to its own dtype is the tensor itself */
    CHECK(mlc_error(ctx) == MLC_OK);
    test_destroy(ctx);
    return 1;
}

/* Gradients flow back through casts and half ops in float32: d/dx of sum(tanh(bf16(x) W)) is
   float32's gradient at the rounded values, within bf16's rounding of the forward. */
static int gradients_through_half(void) {
    mlc_ctx *ctx = test_ctx(5);
    mlc_tensor *x = mlc_requires_grad(mlc_randn(ctx, MLC_SHAPE(3, 4)), 1);
    mlc_tensor *w = mlc_requires_grad(mlc_randn(ctx, MLC_SHAPE(4, 2)), 1);
    mlc_tensor *xr, *wr, *loss;
    float gx[12], gw[8];
    int i;
    loss = mlc_sum_all(mlc_tanh(mlc_matmul(mlc_to_dtype(x, MLC_BF16), mlc_to_dtype(w, MLC_BF16))));
    CHECK(loss && mlc_dtype(loss) == MLC_BF16 && mlc_backward(loss) == MLC_OK);
    CHECK(x->grad && w->grad);
    memcpy(gx, x->grad, sizeof gx);
    memcpy(gw, w->grad, sizeof gw);
    xr = mlc_requires_grad(mlc_to_dtype(mlc_to_dtype(x, MLC_BF16), MLC_F32), 0);
    wr = mlc_to_dtype(mlc_to_dtype(w, MLC_BF16), MLC_F32);
    xr = mlc_requires_grad(mlc_keep(xr), 1);
    wr = mlc_requires_grad(mlc_keep(wr), 1);
    CHECK(mlc_backward(mlc_sum_all(mlc_tanh(mlc_matmul(xr, wr)))) == MLC_OK);
    for (i = 0; i < 12; i++) CHECK_NEAR(gx[i], xr->grad[i], 0.02 * (1.0 + fabs(xr->grad[i])));
    for (i = 0; i < 8; i++) CHECK_NEAR(gw[i], wr->grad[i], 0.02 * (1.0 + fabs(wr->grad[i])));
    CHECK(mlc_dtype(x) == MLC_F32 && x->requires_grad);
    test_destroy(ctx);
    return 1;
}

/* Backward through bf16 products (on the bf16 kernel where the CPU has it: the output's gradient
   rounded to bf16 for the products), Linear + ReLU fused, batched: the gradients of the float32
   master weights within bf16's rounding of float32's. */
static float grads_of_mlp(int autocast, float *gw, int n) {
    mlc_ctx *ctx = test_ctx(13);
    mlc_module *l1 = mlc_nn_linear(ctx, 24, 40), *l2 = mlc_nn_linear(ctx, 40, 3);
    mlc_module *net = mlc_nn_sequential(ctx, l1, mlc_nn_relu(ctx), l2, NULL);
    mlc_tensor *x = mlc_randn(ctx, MLC_SHAPE(2, 16, 24)), *loss;
    float value;
    if (autocast) mlc_autocast_begin(ctx, MLC_BF16);
    loss = mlc_mean_all(mlc_mul(mlc_forward(net, x), mlc_forward(net, x)));
    mlc_autocast_end(ctx);
    if (!loss || mlc_backward(loss) != MLC_OK || !mlc_host_grad(l1->params[0])) {
        test_destroy(ctx);
        return NAN;
    }
    memcpy(gw, mlc_host_grad(l1->params[0]), (size_t)n * sizeof(float));
    value = mlc_item(loss);
    test_destroy(ctx);
    return value;
}
static int backward_through_bf16_products(void) {
    float g32[960], g16[960], l32 = grads_of_mlp(0, g32, 960), l16 = grads_of_mlp(1, g16, 960);
    double scale = 0;
    int i;
    CHECK(test_isfinite(l32) && test_isfinite(l16));
    CHECK_NEAR(l16, l32, 0.02 * fabs(l32) + 1e-3);
    for (i = 0; i < 960; i++) scale = fabs(g32[i]) > scale ? fabs(g32[i]) : scale;
    CHECK(scale > 0);
    for (i = 0; i < 960; i++) CHECK_NEAR(g16[i], g32[i], 0.03 * scale);
    return 1;
}

/* Autocast: products take and give the autocast dtype, float32 ops cast up, a parameter is
   copied once per step however often it is used, and the copies go after mlc_step. */
static int autocast_products_and_float32_ops(void) {
    mlc_ctx *ctx = test_ctx(6);
    mlc_module *lin = mlc_nn_linear(ctx, 4, 3);
    mlc_optim *opt = mlc_sgd(ctx, lin, (mlc_sgd_opts){ 0.1f, 0, 0, 0, 0 });
    mlc_tensor *x = mlc_randn(ctx, MLC_SHAPE(5, 4)), *y1, *y2, *p, *loss;
    size_t nodes_one, nodes_two;
    mlc_frame f;
    CHECK(mlc_autocast_begin(ctx, MLC_F32) == MLC_ERR_ARG);
    mlc_clear_error(ctx);
    CHECK(mlc_autocast_begin(ctx, MLC_BF16) == MLC_OK);
    f = mlc_frame_begin(ctx);
    y1 = mlc_forward(lin, x);
    nodes_one = mlc_get_stats(ctx).tape_nodes;
    y2 = mlc_forward(lin, x);                            /* the weight's copy is reused */
    nodes_two = mlc_get_stats(ctx).tape_nodes;
    CHECK(y1 && y2 && mlc_dtype(y1) == MLC_BF16);
    CHECK_MSG(nodes_two - nodes_one < nodes_one, "first use %zu nodes, second %zu more", nodes_one,
              nodes_two - nodes_one);
    p = mlc_softmax(y1, 1);
    CHECK(mlc_dtype(p) == MLC_F32);
    loss = mlc_mse_loss(mlc_add(y1, y2), mlc_zeros(ctx, MLC_SHAPE(5, 3)), MLC_REDUCE_MEAN);
    CHECK(loss && mlc_dtype(loss) == MLC_F32);
    mlc_zero_grad(opt);
    CHECK(mlc_backward(loss) == MLC_OK);
    CHECK(mlc_dtype(lin->params[0]) == MLC_F32 && lin->params[0]->grad);   /* master weights: float32 */
    mlc_step(opt);
    CHECK(mlc_error(ctx) == MLC_OK);
    mlc_frame_end(f);
    mlc_autocast_end(ctx);
    CHECK(mlc_dtype(mlc_forward(lin, x)) == MLC_F32);   /* off again */
    test_destroy(ctx);
    return 1;
}

/* A small regression trained 150 steps under bf16 and f16 autocast (f16 with the scaler) ends
   close to float32's loss. */
static float train_autocast(mlc_scalar_type dtype) {
    mlc_ctx *ctx = test_ctx(7);
    mlc_module *l1 = mlc_nn_linear(ctx, 8, 32), *l2 = mlc_nn_linear(ctx, 32, 1);
    mlc_module *net = mlc_nn_sequential(ctx, l1, mlc_nn_tanh(ctx), l2, NULL);
    mlc_optim *opt = mlc_adam(ctx, net, (mlc_adam_opts){ 3e-2f, 0, 0, 0, 0, 0 });
    mlc_tensor *x = mlc_randn(ctx, MLC_SHAPE(64, 8)), *y = mlc_sum(mlc_mul(x, x), 1, 1);
    mlc_grad_scaler *scaler = mlc_grad_scaler_create(opt, (mlc_grad_scaler_opts){ 0, 0, 0, 0 });
    float last = 0.0f;
    int step;
    for (step = 0; step < 150; step++) {
        mlc_frame f = mlc_frame_begin(ctx);
        mlc_tensor *loss;
        if (dtype != MLC_F32) mlc_autocast_begin(ctx, dtype);
        loss = mlc_mse_loss(mlc_forward(net, x), y, MLC_REDUCE_MEAN);
        if (dtype != MLC_F32) mlc_autocast_end(ctx);
        last = mlc_item(loss);
        mlc_zero_grad(opt);
        if (dtype == MLC_F16) {
            mlc_backward(mlc_grad_scaler_scale(scaler, loss));
            mlc_grad_scaler_step(scaler);
            mlc_grad_scaler_update(scaler);
        } else {
            mlc_backward(loss);
            mlc_step(opt);
        }
        mlc_frame_end(f);
    }
    if (mlc_error(ctx)) last = NAN;
    test_destroy(ctx);
    return last;
}
static int autocast_training_follows_float32(void) {
    float f32 = train_autocast(MLC_F32), bf16 = train_autocast(MLC_BF16), f16 = train_autocast(MLC_F16);
    CHECK_MSG(test_isfinite(f32) && f32 < 2.0f, "float32 loss %g", (double)f32);
    CHECK_MSG(fabs((double)bf16 - (double)f32) <= 0.05 * f32 + 0.02, "bf16 loss %g, float32 %g", (double)bf16,
              (double)f32);
    CHECK_MSG(fabs((double)f16 - (double)f32) <= 0.05 * f32 + 0.02, "f16 loss %g, float32 %g", (double)f16,
              (double)f32);
    return 1;
}

/* The scaler follows PyTorch's rules: an inf/NaN gradient skips the step and halves the scale,
   growth_interval clean steps double it; the skipped step leaves the weights as they were. */
static int grad_scaler_skips_backs_off_and_grows(void) {
    mlc_ctx *ctx = test_ctx(8);
    mlc_tensor *w = mlc_requires_grad(mlc_keep(mlc_full(ctx, MLC_SHAPE(2), 1.0f)), 1);
    mlc_optim *opt = mlc_sgd(ctx, NULL, (mlc_sgd_opts){ 0.5f, 0, 0, 0, 0 });
    mlc_grad_scaler *s;
    static const float expect_scale[7] = { 32768, 32768, 32768, 65536, 32768, 32768, 32768 };
    static const int overflow[7] = { 1, 0, 0, 0, 1, 0, 0 }, expect_tracker[7] = { 0, 1, 2, 0, 0, 1, 2 };
    int step;
    CHECK(mlc_optim_add_param(opt, w) == MLC_OK);
    s = mlc_grad_scaler_create(opt, (mlc_grad_scaler_opts){ 0, 0, 0, 3 });
    CHECK(s && s->scale == 65536.0f && s->opts.growth_factor == 2.0f && s->opts.backoff_factor == 0.5f);
    CHECK(mlc_grad_scaler_create(opt, (mlc_grad_scaler_opts){ 0, 0, 0, 3 }) == NULL);   /* one per optimiser */
    mlc_clear_error(ctx);
    for (step = 0; step < 7; step++) {
        mlc_frame f = mlc_frame_begin(ctx);
        float before = mlc_get(w, 0);
        /* loss = sum(w * c): c huge on overflow steps (inf after scaling), else 1e-3 */
        mlc_tensor *c = mlc_full(ctx, MLC_SHAPE(2), overflow[step] ? 3e34f : 1e-3f);
        int stepped;
        mlc_zero_grad(opt);
        CHECK(mlc_backward(mlc_grad_scaler_scale(s, mlc_sum_all(mlc_mul(w, c)))) == MLC_OK);
        stepped = mlc_grad_scaler_step(s);
        CHECK_MSG(stepped == !overflow[step], "step %d stepped %d", step, stepped);
        if (overflow[step]) CHECK(test_same_float(mlc_get(w, 0), before));
        else CHECK_NEAR(mlc_get(w, 0), before - 0.5f * 1e-3f, 1e-7);   /* the unscaled gradient */
        mlc_grad_scaler_update(s);
        CHECK_MSG(test_same_float(s->scale, expect_scale[step]) && s->growth_tracker == expect_tracker[step],
                  "after step %d: scale %g tracker %lld", step, (double)s->scale, s->growth_tracker);
        mlc_frame_end(f);
    }
    CHECK(mlc_error(ctx) == MLC_OK);
    test_destroy(ctx);
    return 1;
}

/* A checkpoint of an optimiser with a scaler keeps its scale and clean steps; one without them
   refuses to restore a scaler, naming the entry; a scaler's bad settings are refused. */
static int grad_scaler_in_checkpoints(void) {
    mlc_ctx *ctx = test_ctx(9);
    mlc_module *lin = mlc_nn_linear(ctx, 2, 2);
    mlc_optim *opt = mlc_sgd(ctx, lin, (mlc_sgd_opts){ 0.1f, 0, 0, 0, 0 });
    mlc_optim *plain = mlc_sgd(ctx, lin, (mlc_sgd_opts){ 0.1f, 0, 0, 0, 0 });
    mlc_grad_scaler *s = mlc_grad_scaler_create(opt, (mlc_grad_scaler_opts){ 0, 0, 0, 0 });
    mlc_train_state st = { .step = 5 }, st_back = { .step = 0 };
    unsigned char *buf;
    size_t n, plain_n;
    CHECK(s && mlc_grad_scaler_create(plain, (mlc_grad_scaler_opts){ 0, 0.5f, 0, 0 }) == NULL
          && mlc_error(ctx) == MLC_ERR_ARG && strstr(mlc_error_message(ctx), "growth_factor"));
    mlc_clear_error(ctx);
    s->scale = 1024.0f; s->growth_tracker = 1234;
    n = mlc_checkpoint_encode(lin, opt, &st, NULL, 0);
    CHECK(n > 0 && (buf = (unsigned char *)malloc(n)) != NULL);
    CHECK(mlc_checkpoint_encode(lin, opt, &st, buf, n) == n);
    s->scale = 1.0f; s->growth_tracker = 0;
    CHECK_MSG(mlc_checkpoint_load_from_memory(buf, n, lin, opt, &st_back) == MLC_OK, "%s", mlc_error_message(ctx));
    CHECK(s->scale == 1024.0f && s->growth_tracker == 1234 && st_back.step == 5);
    free(buf);
    plain_n = mlc_checkpoint_encode(lin, plain, &st, NULL, 0);   /* an optimiser without a scaler */
    CHECK(plain_n > 0 && plain_n < n && (buf = (unsigned char *)malloc(plain_n)) != NULL);
    CHECK(mlc_checkpoint_encode(lin, plain, &st, buf, plain_n) == plain_n);
    CHECK(mlc_checkpoint_load_from_memory(buf, plain_n, lin, opt, &st_back) == MLC_ERR_IO);
    CHECK(strstr(mlc_error_message(ctx), "scaler.scale") != NULL && s->scale == 1024.0f);
    free(buf);
    test_destroy(ctx);
    return 1;
}

static int holds(const unsigned char *bytes, size_t n, const char *text) {   /* text occurs in bytes */
    size_t i, len = strlen(text);
    for (i = 0; i + len <= n; i++) if (memcmp(bytes + i, text, len) == 0) return 1;
    return 0;
}

/* A module in bf16: half the bytes, outputs in bf16, saved as BF16 and loaded back bit for bit;
   a float32 file loads into it rounded; back to float32 it trains again. */
static int module_to_dtype_and_files(void) {
    mlc_ctx *ctx = test_ctx(10);
    mlc_module *lin = mlc_nn_linear(ctx, 64, 32), *twin = mlc_nn_linear(ctx, 64, 32);
    mlc_tensor *x = mlc_randn(ctx, MLC_SHAPE(3, 64)), *y32, *y16;
    mlc_named_tensor named[2] = { { "weight", NULL }, { "bias", NULL } };
    unsigned char *file;
    size_t n, n32, before, after;
    float w32[4], w16[4];
    int i;
    named[0].tensor = lin->params[0];
    n32 = mlc_safetensors_encode(ctx, named, 1, NULL, NULL, 0);
    CHECK(mlc_read(mlc_slice(mlc_reshape(lin->params[0], MLC_SHAPE(2048)), 0, 0, 4), w32, 4) == MLC_OK);
    y32 = mlc_forward(lin, x);
    before = mlc_get_stats(ctx).bytes_current;
    CHECK(mlc_module_to_dtype(lin, MLC_BF16) == MLC_OK);
    after = mlc_get_stats(ctx).bytes_current;
    CHECK_MSG(before - after >= 64 * 32 * 2 + 64 * 32 * 4, "held %zu bytes, then %zu", before, after);
    CHECK(mlc_dtype(lin->params[0]) == MLC_BF16 && mlc_dtype(lin->params[1]) == MLC_BF16);
    CHECK(mlc_read(mlc_slice(mlc_reshape(lin->params[0], MLC_SHAPE(2048)), 0, 0, 4), w16, 4) == MLC_OK);
    for (i = 0; i < 4; i++) CHECK(test_same_float(w16[i], mlc_bf16_to_float(mlc_float_to_bf16(w32[i]))));
    y16 = mlc_forward(lin, mlc_to_dtype(x, MLC_BF16));
    CHECK(y16 && mlc_dtype(y16) == MLC_BF16);
    CHECK_NEAR(mlc_item(mlc_sum_all(mlc_to_dtype(y16, MLC_F32))), mlc_item(mlc_sum_all(y32)), 0.5);
    named[0].tensor = lin->params[0]; named[1].tensor = lin->params[1];
    n = mlc_safetensors_encode(ctx, named, 2, NULL, NULL, 0);
    CHECK(n > 0 && n < n32 && (file = (unsigned char *)malloc(n)) != NULL);
    CHECK(mlc_safetensors_encode(ctx, named, 2, NULL, file, n) == n);
    CHECK(holds(file, n, "\"BF16\""));
    CHECK(mlc_module_to_dtype(twin, MLC_BF16) == MLC_OK);
    CHECK_MSG(mlc_module_load_from_memory(twin, file, n, NULL) == MLC_OK, "%s", mlc_error_message(ctx));
    CHECK(memcmp(twin->params[0]->half, lin->params[0]->half, 64 * 32 * 2) == 0);
    free(file);
    CHECK(mlc_module_to_dtype(lin, MLC_F32) == MLC_OK && mlc_dtype(lin->params[0]) == MLC_F32 && lin->params[0]->grad);
    CHECK(mlc_module_to_dtype(twin, MLC_F16) == MLC_OK && mlc_dtype(twin->params[0]) == MLC_F16);
    CHECK(test_same_float(mlc_get(twin->params[0], 0), mlc_f16_to_float(mlc_float_to_f16(w16[0]))));
    CHECK(mlc_error(ctx) == MLC_OK);
    test_destroy(ctx);
    return 1;
}

static mlc_tensor *half_sum(mlc_tensor **in, void *user) { (void)user; return mlc_sum_all(in[0]); }

/* What fills or walks a tensor takes its dtype: the initialisers round into it, and batches of
   a bf16 data set are bf16 rows of it. */
static int initialisers_and_batches_keep_the_dtype(void) {
    mlc_ctx *ctx = test_ctx(12);
    mlc_tensor *w = mlc_full_dtype(ctx, MLC_SHAPE(64, 32), 0.0f, MLC_BF16), *x, *y, *bx, *by;
    mlc_batches *batches;
    float v[8];
    double sum = 0;
    int i;
    mlc_init_normal(w, 0.0f, 1.0f);
    for (i = 0; i < 64 * 32; i++) sum += mlc_get(w, (size_t)i) * mlc_get(w, (size_t)i);
    CHECK_NEAR(sum / (64 * 32), 1.0, 0.15);              /* N(0, 1), rounded to bf16 */
    mlc_init_constant(w, 0.1f);
    CHECK(w->half[7] == mlc_float_to_bf16(0.1f));
    mlc_init_kaiming_uniform(w, 0.0f);
    CHECK(w->half[3] != mlc_float_to_bf16(0.1f));
    x = mlc_to_dtype(mlc_arange(ctx, 0.0f, 8.0f, 1.0f), MLC_BF16);
    y = mlc_arange(ctx, 0.0f, 8.0f, 1.0f);
    batches = mlc_batches_create(mlc_reshape(x, MLC_SHAPE(8, 1)), y, (mlc_batch_opts){ .batch_size = 3, .shuffle = 1 });
    CHECK(batches && mlc_batches_next(batches, &bx, &by));
    CHECK(mlc_dtype(bx) == MLC_BF16 && mlc_dtype(by) == MLC_F32 && bx->shape[0] == 3);
    CHECK(mlc_read(bx, v, 3) == MLC_OK);
    for (i = 0; i < 3; i++) CHECK(test_same_float(v[i], mlc_get(by, (size_t)i)));   /* rows stay paired */
    mlc_batches_free(batches);
    CHECK(mlc_error(ctx) == MLC_OK);
    test_destroy(ctx);
    return 1;
}

/* mlc_set_default_dtype: parameters and buffers made in bf16 (a count stays float32), no
   gradient buffer until a backward needs one, a float32 file rounded into them; refused on a
   device context and for a bad dtype. */
static int default_dtype_builds_half_models(void) {
    mlc_ctx *ctx = test_ctx(14), *fake;
    mlc_module *lin, *bn, *twin;
    mlc_tensor *x, *loss;
    unsigned char *file;
    size_t n;
    mlc_named_tensor named[1] = { { "weight", NULL } };
    twin = mlc_nn_linear(ctx, 8, 4);                     /* float32, for a float32 file */
    CHECK(mlc_set_default_dtype(ctx, MLC_BF16) == MLC_F32);
    lin = mlc_nn_linear(ctx, 8, 4);
    bn = mlc_nn_batch_norm(ctx, 4);
    CHECK(lin && bn && mlc_dtype(lin->params[0]) == MLC_BF16 && mlc_dtype(lin->params[1]) == MLC_BF16);
    CHECK(!lin->params[0]->grad && lin->params[0]->requires_grad);
    CHECK(mlc_dtype(bn->buffers[0]) == MLC_BF16 && mlc_dtype(bn->buffers[2]) == MLC_F32);   /* the count */
    CHECK(mlc_set_default_dtype(ctx, MLC_F32) == MLC_BF16);
    named[0].tensor = twin->params[0];
    n = mlc_safetensors_encode(ctx, named, 1, NULL, NULL, 0);
    CHECK(n > 0 && (file = (unsigned char *)malloc(n)) != NULL);
    CHECK(mlc_safetensors_encode(ctx, named, 1, NULL, file, n) == n);
    CHECK_MSG(mlc_module_load_from_memory(lin, file, n, &(mlc_load_opts){ .partial = 1 }) == MLC_OK, "%s",
              mlc_error_message(ctx));
    CHECK(lin->params[0]->half[5] == mlc_float_to_bf16(twin->params[0]->data[5]));
    free(file);
    x = mlc_to_dtype(mlc_randn(ctx, MLC_SHAPE(3, 8)), MLC_BF16);
    loss = mlc_sum_all(mlc_forward(lin, x));
    CHECK(loss && mlc_dtype(loss) == MLC_BF16 && mlc_backward(loss) == MLC_OK);
    CHECK(mlc_host_grad(lin->params[0]) != NULL);        /* made when the backward needed it */
    mlc_set_default_dtype(ctx, (mlc_scalar_type)9);
    CHECK(mlc_error(ctx) == MLC_ERR_ARG);
    test_destroy(ctx);
    fake = test_install_fake_device(mlc_create(&(mlc_config){ .seed = 15, .quiet = 1, .device = "cpu" }));
    /* (a device that cannot cast: the CPU runs its ops) */
    CHECK(fake && mlc_has_device(fake));
    mlc_set_default_dtype(fake, MLC_BF16);
    lin = mlc_nn_linear(fake, 8, 4);
    CHECK(lin && lin->params[0]->on_device && mlc_dtype(lin->params[0]) == MLC_BF16);
    x = mlc_to_dtype(mlc_randn(fake, MLC_SHAPE(3, 8)), MLC_BF16);
    loss = mlc_sum_all(mlc_forward(lin, x));
    CHECK(loss && mlc_dtype(loss) == MLC_BF16 && mlc_backward(loss) == MLC_OK);
    CHECK(mlc_get_stats(fake).fallbacks > 0 && mlc_host_grad(lin->params[0]) != NULL);
    mlc_destroy(fake);
    return 1;
}

/* What half tensors refuse: an optimiser's update, a bad dtype, a gradient check (it nudges its
   inputs by eps); a CPU context refuses a device as for float32, a device context moves them
   both ways with their bits. */
static int misuse_is_refused_by_name(void) {
    mlc_ctx *ctx = test_ctx(11);
    mlc_module *lin = mlc_nn_linear(ctx, 2, 2);
    mlc_optim *opt = mlc_sgd(ctx, lin, (mlc_sgd_opts){ 0.1f, 0, 0, 0, 0 });
    mlc_tensor *b = mlc_full_dtype(ctx, MLC_SHAPE(2), 1.0f, MLC_BF16);
    if (!mlc_has_device(ctx)) CHECK(mlc_to(b, 1) == NULL && mlc_error(ctx) == MLC_ERR_DEVICE);
    else CHECK(mlc_to(b, 0) == b && b->half[1] == mlc_float_to_bf16(1.0f) && mlc_to(b, 1) == b
               && test_same_float(mlc_get(b, 1), 1.0f));
    mlc_clear_error(ctx);
    CHECK(mlc_to_dtype(b, (mlc_scalar_type)-1) == NULL && mlc_error(ctx) == MLC_ERR_ARG);
    mlc_clear_error(ctx);
    CHECK(mlc_module_to_dtype(lin, MLC_F16) == MLC_OK);
    mlc_step(opt);
    CHECK(mlc_error(ctx) == MLC_ERR_ARG && strstr(mlc_error_message(ctx), "float16")
          && strstr(mlc_error_message(ctx), "mlc_autocast_begin"));
    mlc_clear_error(ctx);
    CHECK(mlc_grad_scaler_scale(NULL, b) == NULL && mlc_error(ctx) == MLC_ERR_NULL);
    mlc_clear_error(ctx);
    CHECK(!mlc_gradcheck(ctx, half_sum, NULL, &b, 1, NULL, NULL) && mlc_error(ctx) == MLC_ERR_ARG
          && strstr(mlc_error_message(ctx), "bfloat16"));
    mlc_clear_error(ctx);
    test_destroy(ctx);
    return 1;
}

/* On a device a half tensor takes half the bytes there too: a Linear converted to bf16 keeps two
   bytes a value on the device (no gradient buffer until a backward) and its values rounded as
   on the CPU; a backward there makes float32 gradients. On a CPU suite run, the fake device. */
static int device_half_storage_takes_half_the_bytes(void) {
    enum { IN = 256, OUT = 64 };
    mlc_ctx *ctx = test_ctx(16);
    mlc_module *lin;
    mlc_tensor *x, *loss;
    size_t before, i;
    float *w32 = (float *)malloc(IN * OUT * sizeof(float));
    CHECK(w32);
    if (!mlc_has_device(ctx)) ctx = test_install_fake_device(ctx);
    lin = mlc_nn_linear(ctx, IN, OUT);
    CHECK(lin && lin->params[0]->on_device && mlc_read(lin->params[0], w32, IN * OUT) == MLC_OK);
    CHECK(mlc_module_to(lin, 0) == MLC_OK);
    before = mlc_get_stats(ctx).device_bytes_current;
    CHECK(mlc_module_to(lin, 1) == MLC_OK);             /* values and gradients: 8 bytes a value */
    CHECK(mlc_get_stats(ctx).device_bytes_current - before == (IN * OUT + OUT) * 8);
    CHECK(mlc_module_to_dtype(lin, MLC_BF16) == MLC_OK);
    CHECK(lin->params[0]->on_device && mlc_dtype(lin->params[0]) == MLC_BF16);
    CHECK_MSG(mlc_get_stats(ctx).device_bytes_current - before == (IN * OUT + OUT) * 2,
              "device bytes %zu -> %zu", before, mlc_get_stats(ctx).device_bytes_current);   /* 2 a value */
    for (i = 0; i < IN * OUT; i += 97)
        CHECK(test_same_float(mlc_get(lin->params[0], i), mlc_bf16_to_float(mlc_float_to_bf16(w32[i]))));
    x = mlc_to_dtype(mlc_randn(ctx, MLC_SHAPE(4, IN)), MLC_BF16);
    loss = mlc_sum_all(mlc_forward(lin, x));
    CHECK(loss && mlc_backward(loss) == MLC_OK && mlc_host_grad(lin->params[0]) != NULL);
    CHECK(test_same_float(mlc_host_grad(lin->params[1])[5], 4.0f));     /* d sum / d bias: the batch */
    free(w32);
    test_destroy(ctx);
    return 1;
}

const test_case tests_dtype[] = {
    TEST(casts_match_pytorch_bit_for_bit)
    TEST(array_conversions_match_single_ones)
    TEST(create_read_write_round)
    TEST(ops_on_half_are_float32_rounded_once)
    TEST(permute_moves_half_values)
    TEST(index_select_moves_half_values)
    TEST(elementwise_ops_take_half_values)
    TEST(bf16_gemm_matches_double_sums)
    TEST(bf16_products_on_the_kernel)
    TEST(bf16_convolutions_on_the_kernel)
    TEST(promotion_as_pytorch)
    TEST(gradients_through_half)
    TEST(backward_through_bf16_products)
    TEST(autocast_products_and_float32_ops)
    TEST(autocast_training_follows_float32)
    TEST(grad_scaler_skips_backs_off_and_grows)
    TEST(grad_scaler_in_checkpoints)
    TEST(module_to_dtype_and_files)
    TEST(initialisers_and_batches_keep_the_dtype)
    TEST(default_dtype_builds_half_models)
    TEST(misuse_is_refused_by_name)
    TEST(device_half_storage_takes_half_the_bytes)
    { NULL, NULL }
};
