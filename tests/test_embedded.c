/* Embedded mode: weights used in place from read-only memory (mlc_from_const), a fixed arena
   (mlc_config.arena), and inference that takes nothing from the arena beyond its outputs. The
   build without malloc (MLC_NO_MALLOC) is checked by tests/compile_check.sh and make embedded. */
#include "test.h"

/* The context's error is MLC_ERR_STATE and its message names op; the error is then cleared. */
static int refused(mlc_ctx *ctx, const char *op) {
    int ok = mlc_error(ctx) == MLC_ERR_STATE && strstr(mlc_error_message(ctx), op) != NULL &&
             strstr(mlc_error_message(ctx), "read-only") != NULL;
    mlc_clear_error(ctx);
    return ok;
}

static int const_weights_in_place(void) {
    static const float w[6] = { 1, 2, 3, -1, 0, 1 }, b[2] = { 0.5f, -0.5f }, x[3] = { 1, 1, 2 };
    static const float want[2] = { 9.5f, 0.5f };      /* [1 2 3; -1 0 1] [1 1 2] + b */
    mlc_ctx *ctx = test_ctx(1);
    mlc_tensor *tw = mlc_from_const(ctx, MLC_SHAPE(2, 3), w), *tb = mlc_from_const(ctx, MLC_SHAPE(2), b);
    mlc_tensor *tx = mlc_from_data(ctx, MLC_SHAPE(1, 3), x), *y, *view;
    mlc_module *lin = mlc_nn_linear(ctx, 3, 2), *bn = mlc_nn_batch_norm(ctx, 2);
    mlc_stats before;
    unsigned char file[1024];
    size_t size;
    CHECK(tw && tb && tx && lin && bn);
    CHECK(tw->data == w && tw->read_only && !tw->requires_grad && tw->grad == NULL);   /* no copy */
    before = mlc_get_stats(ctx);
    y = mlc_linear(tx, tw, tb);
    CHECK_TENSOR(y, want, 0);
    view = mlc_reshape(tw, MLC_SHAPE(6));             /* a view of read-only memory is read-only */
    CHECK(view && view->read_only && mlc_get(view, 2) == 3.0f);
    CHECK(mlc_get_stats(ctx).tape_nodes == before.tape_nodes);

    CHECK(mlc_write(tw, x, 0) == MLC_ERR_ARG);        /* a wrong count is still the first complaint */
    mlc_clear_error(ctx);
    CHECK(mlc_write(tb, b, 2) == MLC_ERR_STATE && refused(ctx, "mlc_write"));
    CHECK(mlc_write(view, w, 6) == MLC_ERR_STATE && refused(ctx, "mlc_write"));
    CHECK(mlc_requires_grad(tw, 1) == NULL && refused(ctx, "mlc_requires_grad"));
    CHECK(mlc_requires_grad(tw, 0) == tw);
    mlc_init_constant(tw, 0.0f);
    CHECK(refused(ctx, "mlc_init_constant"));
    mlc_init_kaiming_uniform(tw, 0.0f);
    CHECK(refused(ctx, "mlc_init_kaiming_uniform"));
    mlc_init_xavier_normal(tw, 1.0f);
    CHECK(refused(ctx, "mlc_init_xavier_normal"));
    {   /* batch norm reads read-only running statistics, and refuses to update them */
        mlc_tensor *x2 = mlc_full(ctx, MLC_SHAPE(4, 2), 1.0f);
        mlc_tensor *mean = mlc_from_const(ctx, MLC_SHAPE(2), w);
        mlc_tensor *var = mlc_from_const(ctx, MLC_SHAPE(2), w + 1);
        /* torch.nn.functional.batch_norm(torch.ones(4, 2), mean [1, 2], var [2, 3], eps=1e-5) */
        static const float normed[8] = { 0, -0.5773493051528931f, 0, -0.5773493051528931f,
                                         0, -0.5773493051528931f, 0, -0.5773493051528931f };
        CHECK_TENSOR(mlc_batch_norm(x2, mean, var, NULL, NULL, 0, 0.1f, 1e-5f), normed, 1e-6);
        CHECK(mlc_batch_norm(x2, mean, var, NULL, NULL, 1, 0.1f, 1e-5f) == NULL);
        CHECK(refused(ctx, "mlc_batch_norm"));
    }

    /* A module over read-only weights runs, and refuses optimisers and loading. */
    size = mlc_module_encode(lin, NULL, file, sizeof file);
    CHECK(size > 0 && size <= sizeof file);
    mlc_tensor_free(lin->params[0]);                  /* the module's: refused, it keeps it */
    CHECK(mlc_error(ctx) == MLC_ERR_STATE && strstr(mlc_error_message(ctx), "held by Linear"));
    mlc_clear_error(ctx);
    lin->params[0] = tw;
    y = mlc_forward(lin, tx);
    CHECK(y && mlc_error(ctx) == MLC_OK);
    CHECK(mlc_adam(ctx, lin, (mlc_adam_opts){ 0 }) == NULL && refused(ctx, "mlc_optim_add_param"));
    CHECK(mlc_module_load_from_memory(lin, file, size, NULL) == MLC_ERR_STATE);
    CHECK(refused(ctx, "mlc_safetensors_load"));
    CHECK(w[0] == 1.0f && mlc_get(lin->params[1], 0) != b[0]);   /* nothing was loaded, not even the bias */
    CHECK(mlc_from_const(ctx, MLC_SHAPE(2), NULL) == NULL && mlc_error(ctx) == MLC_ERR_NULL);
    mlc_clear_error(ctx);
    mlc_tensor_free(tb);                              /* frees the struct, never the caller's data */
    CHECK(mlc_error(ctx) == MLC_OK);
    test_destroy(ctx);
    return 1;
}

/* A [8, 4] -> [8, 4] chain of ops in a frame; returns the arena bytes it used. */
static size_t chain(mlc_ctx *ctx, mlc_tensor *w) {
    mlc_frame f = mlc_frame_begin(ctx);
    size_t before = mlc_get_stats(ctx).arena_used, used;
    mlc_tensor *x = mlc_full(ctx, MLC_SHAPE(8, 4), 0.5f);
    mlc_tensor *y = mlc_relu(mlc_linear(mlc_tanh(x), w, NULL));
    used = y ? mlc_get_stats(ctx).arena_used - before : 0;
    mlc_frame_end(f);
    return used;
}

static int fixed_arena(void) {
    static unsigned char arena[16384];
    static const float w[16] = { 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1 };
    mlc_config c;
    mlc_ctx *ctx;
    mlc_tensor *tw, *big;
    size_t used, allocs;
    int i;
    memset(&c, 0, sizeof c);
    c.quiet = 1; c.device = "cpu";
    c.arena = arena; c.arena_bytes = sizeof arena;
    ctx = mlc_create(&c);
    CHECK(ctx && mlc_error(ctx) == MLC_OK);
    tw = mlc_from_const(ctx, MLC_SHAPE(4, 4), w);
    allocs = mlc_get_stats(ctx).allocs;
    used = chain(ctx, tw);
    CHECK(used > 0);
    for (i = 0; i < 100; i++) CHECK(chain(ctx, tw) == used);
    CHECK(mlc_get_stats(ctx).allocs == allocs);       /* the heap is never asked */
    CHECK(mlc_get_stats(ctx).arena_peak == used);
    CHECK((unsigned char *)tw->data != arena);
    {   /* results land inside the buffer */
        mlc_frame f = mlc_frame_begin(ctx);
        mlc_tensor *t = mlc_zeros(ctx, MLC_SHAPE(4));
        CHECK(t && (unsigned char *)t->data > arena && (unsigned char *)t->data < arena + sizeof arena);
        mlc_frame_end(f);
    }
    big = mlc_empty(ctx, MLC_SHAPE(4096));            /* 16 KiB of floats: does not fit */
    CHECK(big == NULL && mlc_error(ctx) == MLC_ERR_MEMORY && strstr(mlc_error_message(ctx), "mlc_empty") &&
          strstr(mlc_error_message(ctx), "fixed arena"));
    CHECK(mlc_get_stats(ctx).allocs == allocs);
    mlc_clear_error(ctx);
    CHECK(chain(ctx, tw) == used);                    /* usable after */
    test_destroy(ctx);

    c.arena_bytes = 40;                               /* too small for the arena's own header */
    ctx = mlc_create(&c);
    CHECK(ctx && mlc_error(ctx) == MLC_ERR_MEMORY && strstr(mlc_error_message(ctx), "mlc_config.arena"));
    test_destroy(ctx);
    return 1;
}

/* main_int8.c's path on a [1, 1, 4, 4] image: quantize, int8 conv 3x3 (ReLU as the output
   range), max pool, flatten, int8 linear, in a frame; the 3 logits into out, and returns the
   arena bytes the run used */
static size_t int8_chain(mlc_ctx *ctx, mlc_tensor *const layers[4], int8_t out[3]) {
    static const float pixels[16] = { 0, .25f, .5f, 1, 1, .75f, 0, 0, .5f, .5f, 1, .25f, 0, 1, 0, .75f };
    const mlc_conv_opts same = { .padding = 1 };
    mlc_frame f = mlc_frame_begin(ctx);
    size_t before = mlc_get_stats(ctx).arena_used, used = 0;
    mlc_tensor *x = mlc_quantize(mlc_from_data(ctx, MLC_SHAPE(1, 1, 4, 4), pixels), 1.0f / 255.0f, -128);
    mlc_tensor *h = mlc_max_pool2d(mlc_conv2d_int8(x, layers[0], layers[1], same, 0.02f, -128), 2, 2, 0);
    mlc_tensor *y = mlc_linear_int8(mlc_flatten(h, 1), layers[2], layers[3], 0.25f, 3);
    if (y) {
        memcpy(out, y->int8, 3);
        used = mlc_get_stats(ctx).arena_used - before;
    }
    mlc_frame_end(f);
    return used;
}

/* int8 weights in read-only memory (flash), with float32 row scales and biases */
static const int8_t int8_w1[18] = { 127, -64, 3, 90, -127, 45, 0, 12, -33,
                                    -5, 60, 127, -80, 20, 7, 1, -127, 99 };
static const int8_t int8_w2[24] = { 127, -1, 2, -3, 50, 60, -70, 80, -9, 10, -127, 12, 13, -14, 15, -16,
                                    17, 18, -19, 127, 21, -22, 23, -24 };
static const float int8_s1[2] = { 0.01f, 0.02f }, int8_b1[2] = { 0.1f, -0.05f };
static const float int8_s2[3] = { 0.03f, 0.02f, 0.05f }, int8_b2[3] = { 0.5f, -0.25f, 0.0f };

/* The layers over them, as main_int8.c wraps its weights */
static void int8_layers(mlc_ctx *ctx, mlc_tensor *layers[4]) {
    layers[0] = mlc_from_const_int8(ctx, MLC_SHAPE(2, 1, 3, 3), int8_w1, 0.0f, 0,
                                    mlc_from_const(ctx, MLC_SHAPE(2), int8_s1));
    layers[1] = mlc_from_const(ctx, MLC_SHAPE(2), int8_b1);
    layers[2] = mlc_from_const_int8(ctx, MLC_SHAPE(3, 8), int8_w2, 0.0f, 0,
                                    mlc_from_const(ctx, MLC_SHAPE(3), int8_s2));
    layers[3] = mlc_from_const(ctx, MLC_SHAPE(3), int8_b2);
}

/* The int8 path runs on a fixed arena without asking the heap, the same bytes every time, and
   gives the logits a context with a heap gives; an arena too small is an error naming the op */
static int int8_fixed_arena(void) {
    static unsigned char arena[8192];
    mlc_config c;
    mlc_ctx *ctx, *heap;
    mlc_tensor *layers[4], *heap_layers[4];
    int8_t want[3], got[3];
    size_t used, allocs, peak;
    int i;
    memset(&c, 0, sizeof c);
    c.quiet = 1; c.device = "cpu";
    heap = mlc_create(&c);
    int8_layers(heap, heap_layers);
    CHECK(int8_chain(heap, heap_layers, want) > 0);
    c.arena = arena; c.arena_bytes = sizeof arena;
    ctx = mlc_create(&c);
    int8_layers(ctx, layers);
    CHECK(ctx && layers[0] && layers[2] && mlc_error(ctx) == MLC_OK);
    CHECK(layers[0]->int8 == int8_w1 && layers[0]->read_only && layers[2]->int8 == int8_w2);   /* no copy */
    allocs = mlc_get_stats(ctx).allocs;
    used = int8_chain(ctx, layers, got);
    CHECK_MSG(used > 0, "%s", mlc_error_message(ctx));
    CHECK(memcmp(got, want, 3) == 0);
    peak = mlc_get_stats(ctx).arena_peak;             /* the output, and the conv's scratch before */
    CHECK(peak > used);
    for (i = 0; i < 20; i++) CHECK(int8_chain(ctx, layers, got) == used && memcmp(got, want, 3) == 0);
    CHECK(mlc_get_stats(ctx).allocs == allocs);       /* the heap is never asked */
    CHECK(mlc_get_stats(ctx).arena_peak == peak);
    test_destroy(ctx);

    c.arena_bytes = used;                             /* the scratch no longer fits */
    ctx = mlc_create(&c);
    int8_layers(ctx, layers);
    allocs = mlc_get_stats(ctx).allocs;
    CHECK(int8_chain(ctx, layers, got) == 0 && mlc_error(ctx) == MLC_ERR_MEMORY);
    CHECK_MSG(strstr(mlc_error_message(ctx), "fixed arena"), "%s", mlc_error_message(ctx));
    CHECK(mlc_get_stats(ctx).allocs == allocs);
    test_destroy(ctx);
    test_destroy(heap);
    return 1;
}

/* Inference takes from the arena its outputs and nothing else: with gradients off, parameters
   that want gradients cost what read-only weights cost, and the tape stays empty. */
static int inference_takes_only_outputs(void) {
    static const float w[16] = { 0 };
    mlc_config c;
    mlc_ctx *ctx;
    mlc_tensor *param, *tw;
    size_t grad_on, grad_off, inference, header;
    memset(&c, 0, sizeof c);
    c.quiet = 1; c.device = "cpu";
    ctx = mlc_create(&c);
    param = mlc_parameter(ctx, MLC_SHAPE(4, 4));
    tw = mlc_from_const(ctx, MLC_SHAPE(4, 4), w);
    CHECK(param && tw);
    grad_on = chain(ctx, param);
    CHECK(mlc_set_grad_enabled(ctx, 0) == 1);
    grad_off = chain(ctx, param);
    CHECK(mlc_get_stats(ctx).tape_nodes == 0);
    mlc_set_grad_enabled(ctx, 1);
    inference = chain(ctx, tw);
    CHECK(mlc_get_stats(ctx).tape_nodes == 0);
    CHECK_MSG(grad_off < grad_on && grad_off == inference, "arena bytes: grad on %zu, off %zu, const %zu",
              grad_on, grad_off, inference);
    header = (sizeof(mlc_tensor) + 31) & ~(size_t)31;  /* x, tanh, linear, relu: 4 tensors of 32 floats */
    CHECK_MSG(inference == 4 * (header + 32 * sizeof(float)), "inference took %zu arena bytes", inference);
    test_destroy(ctx);
    return 1;
}

const test_case tests_embedded[] = {
    TEST(const_weights_in_place)
    TEST(fixed_arena)
    TEST(int8_fixed_arena)
    TEST(inference_takes_only_outputs)
    { NULL, NULL }
};
