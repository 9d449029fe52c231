/* The exporter of make embedded: trains the digits CNN of examples/digits.c (the same layers
   and recipe) or loads it from a safetensors file, and writes its weights and a few held-out
   test digits as C arrays (`static const float`) for the Cortex-M4F program in main.c, which
   uses them in place from flash. With --int8 it writes the int8 model for main_int8.c too:
   batch norm folded into each convolution, weights int8 per output channel (with their float
   scales), the input's and each layer's output scale and zero point calibrated on the training
   digits; and it runs that model on the host (cnn_int8.h: the calls main_int8.c makes). It
   prints the host's test accuracy (stderr) and its predictions for those digits
   ("predictions: 7 3 ...", "int8 predictions: 7 3 ..."), which the Makefile compares with the
   microcontroller's.
   Usage: export OUT.h [data/digits.bin] [--int8 OUT_INT8.h] [--load model.safetensors]
                 [--save model.safetensors] */
#include <math.h>
#include <stdio.h>
#include <string.h>
#define MLC_IMPLEMENTATION
#include "mlc.h"
#include "../digits_data.h"
#include "cnn_int8.h"

#define EPOCHS 30
#define BATCH 32
#define HELD_OUT 12                             /* test digits shipped to the microcontroller */

static mlc_tensor *to_image(mlc_module *m, mlc_tensor *x) {
    (void)m;
    return mlc_reshape(x, MLC_SHAPE(-1, 1, 8, 8));
}

/* The layers of examples/digits.c, made one statement at a time (argument order is open in C). */
static mlc_module *digits_cnn(mlc_ctx *ctx) {
    mlc_module *m[12];
    m[0] = mlc_nn_custom(ctx, "Reshape", to_image, NULL);
    m[1] = mlc_nn_conv2d(ctx, 1, 16, 3, (mlc_conv_opts){ .padding = 1 });
    m[2] = mlc_nn_batch_norm(ctx, 16);
    m[3] = mlc_nn_relu(ctx);
    m[4] = mlc_nn_max_pool2d(ctx, 2, 2);
    m[5] = mlc_nn_conv2d(ctx, 16, 32, 3, (mlc_conv_opts){ .padding = 1 });
    m[6] = mlc_nn_batch_norm(ctx, 32);
    m[7] = mlc_nn_relu(ctx);
    m[8] = mlc_nn_max_pool2d(ctx, 2, 2);
    m[9] = mlc_nn_flatten(ctx);
    m[10] = mlc_nn_dropout(ctx, 0.3f);
    m[11] = mlc_nn_linear(ctx, 128, 10);
    return mlc_nn_sequential(ctx, m[0], m[1], m[2], m[3], m[4], m[5], m[6], m[7], m[8], m[9], m[10], m[11],
                             NULL);
}

/* Images of ds [first, first + count) scaled to [0, 1] into x, labels into y. */
static void rows(const digits_set *ds, int first, int count, float *x, float *y) {
    for (int i = 0; i < count; i++) {
        for (int j = 0; j < DIGITS_PIXELS; j++)
            x[i * DIGITS_PIXELS + j] = ds->pixels[(size_t)(first + i) * DIGITS_PIXELS + j] / 16.0f;
        y[i] = ds->labels[first + i];
    }
}

static void train(mlc_ctx *ctx, mlc_module *model, const digits_set *ds) {
    static float x[DIGITS_TRAIN_COUNT * DIGITS_PIXELS], y[DIGITS_TRAIN_COUNT], order[DIGITS_TRAIN_COUNT];
    int n = DIGITS_TRAIN_COUNT, step = 0, steps_per_epoch = (n + BATCH - 1) / BATCH;
    mlc_optim *opt = mlc_adamw(ctx, model, (mlc_adam_opts){ .lr = 3e-3f, .weight_decay = 1e-2f });
    mlc_tensor *xs, *ys;
    rows(ds, 0, n, x, y);
    xs = mlc_keep(mlc_from_data(ctx, MLC_SHAPE(n, DIGITS_PIXELS), x));
    ys = mlc_keep(mlc_from_data(ctx, MLC_SHAPE(n), y));
    for (int i = 0; i < n; i++) order[i] = (float)i;
    for (int epoch = 1; epoch <= EPOCHS && !mlc_error(ctx); epoch++) {
        double loss_sum = 0;
        for (int i = n - 1; i > 0; i--) {
            int j = (int)(mlc_rand_u32(ctx) % (uint32_t)(i + 1));
            float t = order[i]; order[i] = order[j]; order[j] = t;
        }
        for (int b = 0; b < n && !mlc_error(ctx); b += BATCH) {
            int count = n - b < BATCH ? n - b : BATCH;
            mlc_frame f = mlc_frame_begin(ctx);
            mlc_optim_set_lr(opt, mlc_lr_cosine(3e-3f, step++, steps_per_epoch, EPOCHS * steps_per_epoch,
                                                1e-5f));
            mlc_tensor *idx = mlc_from_data(ctx, MLC_SHAPE(count), order + b);
            mlc_tensor *logits = mlc_forward(model, mlc_index_select(xs, 0, idx));
            mlc_tensor *target = mlc_index_select(ys, 0, idx);
            mlc_tensor *loss = mlc_cross_entropy(logits, target, MLC_REDUCE_MEAN, MLC_NO_IGNORE);
            mlc_zero_grad(opt);
            mlc_backward(loss);
            mlc_step(opt);
            loss_sum += mlc_item(loss) * count;
            mlc_frame_end(f);
        }
        fprintf(stderr, "epoch %d/%d loss %.4f\n", epoch, EPOCHS, loss_sum / n);
    }
}

/* name[] = { ... }: float v (every value to 9 significant digits, read back bit for bit) or,
   where q is given, int8 q */
static void write_array(FILE *out, const char *name, const float *v, const int8_t *q, size_t n) {
    fprintf(out, "static const %s %s[%zu] = {", q ? "int8_t" : "float", name, n);
    for (size_t i = 0; i < n; i++) {
        fputs(!i ? "\n    " : i % (q ? 16 : 6) ? ", " : ",\n    ", out);
        if (q) fprintf(out, "%d", q[i]);
        else fprintf(out, "%.8ef", (double)v[i]);
    }
    fprintf(out, "\n};\n");
}

/* The held-out digits and their labels */
static void write_held_out(FILE *out, const float *x, const float *y) {
    fprintf(out, "#define HELD_OUT %d\n", HELD_OUT);
    write_array(out, "held_out", x, NULL, HELD_OUT * DIGITS_PIXELS);
    fprintf(out, "static const unsigned char held_out_labels[HELD_OUT] = {");
    for (int i = 0; i < HELD_OUT; i++) fprintf(out, "%s%d", i ? ", " : " ", (int)y[i]);
    fprintf(out, " };\n");
}

/* Batch norm (eval) folded into the convolution before it, per output channel o:
     w'[o] = w[o] γ[o] / √(var[o] + ε),   b'[o] = (b[o] - mean[o]) γ[o] / √(var[o] + ε) + β[o] */
static void fold_batch_norm(mlc_module *conv, mlc_module *bn, mlc_tensor **w, mlc_tensor **b) {
    mlc_tensor *cw = conv->params[0];
    const float *W = mlc_host_data(cw), *B = mlc_host_data(conv->params[1]);
    const float *gamma = mlc_host_data(bn->params[0]), *beta = mlc_host_data(bn->params[1]);
    const float *mean = mlc_host_data(bn->buffers[0]), *var = mlc_host_data(bn->buffers[1]);
    *w = mlc_empty(conv->ctx, cw->ndim, cw->shape);
    *b = mlc_empty(conv->ctx, MLC_SHAPE(cw->shape[0]));
    if (!*w || !*b || !W || !B || !gamma || !beta || !mean || !var) return;
    const int O = cw->shape[0];
    const size_t K = cw->size / (size_t)O;
    for (int o = 0; o < O; o++) {
        const float k = gamma[o] / sqrtf(var[o] + bn->eps);
        for (size_t i = 0; i < K; i++) (*w)->data[o * K + i] = W[o * K + i] * k;
        (*b)->data[o] = (B[o] - mean[o]) * k + beta[o];
    }
}

/* An int8 layer: weight w quantized per output row, bias b kept float32, the output's scale and
   zero point from the range of y (its float32 values on the calibration digits) widened to
   hold 0: after a ReLU [0, max], so zero point -128 and the clamp does the ReLU */
static void calibrate(cnn_int8_layer *l, mlc_tensor *w, mlc_tensor *b, mlc_tensor *y) {
    const float *v = y ? mlc_host_data(y) : NULL;
    float lo = 0.0f, hi = 0.0f;
    for (size_t i = 0; v && i < y->size; i++) {
        lo = v[i] < lo ? v[i] : lo;
        hi = v[i] > hi ? v[i] : hi;
    }
    l->w = mlc_quantize_weight(w);
    l->b = b;
    l->scale = hi > lo ? (hi - lo) / 255.0f : 1.0f;
    l->zero_point = -128 - (int)lrintf(lo / l->scale);
}

/* The int8 model of the trained float32 one, calibrated on the digits x [n, 64] */
static void quantize(mlc_module *model, const float *x, int n, cnn_int8 *q) {
    mlc_module **m = model->children, *fc = m[11];     /* the layers of digits_cnn */
    const mlc_conv_opts same = { .padding = 1 };
    mlc_tensor *w1, *b1, *w2, *b2, *a1, *a2, *logits;
    fold_batch_norm(m[1], m[2], &w1, &b1);
    fold_batch_norm(m[5], m[6], &w2, &b2);
    a1 = mlc_from_data(model->ctx, MLC_SHAPE(n, 1, 8, 8), x);
    a1 = mlc_relu(mlc_conv2d(a1, w1, b1, same));
    a2 = mlc_relu(mlc_conv2d(mlc_max_pool2d(a1, 2, 2, 0), w2, b2, same));
    logits = mlc_linear(mlc_flatten(mlc_max_pool2d(a2, 2, 2, 0), 1), fc->params[0], fc->params[1]);
    q->input_scale = 1.0f / 255.0f;                     /* pixels in [0, 1] */
    q->input_zero_point = -128;
    calibrate(&q->conv1, w1, b1, a1);
    calibrate(&q->conv2, w2, b2, a2);
    calibrate(&q->fc, fc->params[0], fc->params[1], logits);
}

/* The int8 model as C arrays q_N_weight (int8), q_N_weight_scale and q_N_bias (float32), N the
   convolution's or linear's index in the state dict, with the scales and zero points as macros */
static void write_int8(FILE *out, const cnn_int8 *q, const float *x, const float *y) {
    const cnn_int8_layer *layers[3] = { &q->conv1, &q->conv2, &q->fc };
    static const int index[3] = { 1, 5, 11 };
    fprintf(out, "/* Written by examples/embedded/export.c: the digits CNN in int8 for main_int8.c (batch\n"
                 "   norm folded into the convolutions, weights int8 per output channel with float32\n"
                 "   scales, biases float32; scales and zero points calibrated on the training digits)\n"
                 "   and the %d held-out test digits of model.h. */\n",
            HELD_OUT);
    fprintf(out, "#define Q_INPUT_SCALE %.8ef\n#define Q_INPUT_ZERO_POINT (%d)\n", (double)q->input_scale,
            q->input_zero_point);
    for (int i = 0; i < 3; i++) {
        const cnn_int8_layer *l = layers[i];
        char name[64];
        fprintf(out, "#define Q_%d_SCALE %.8ef\n#define Q_%d_ZERO_POINT (%d)\n", index[i], (double)l->scale,
                index[i], l->zero_point);
        snprintf(name, sizeof name, "q_%d_weight", index[i]);
        write_array(out, name, NULL, l->w->int8, l->w->size);
        snprintf(name, sizeof name, "q_%d_weight_scale", index[i]);
        write_array(out, name, mlc_host_data(l->w->qscales), NULL, l->w->qscales->size);
        snprintf(name, sizeof name, "q_%d_bias", index[i]);
        write_array(out, name, mlc_host_data(l->b), NULL, l->b->size);
    }
    write_held_out(out, x, y);
}

/* The float32 model as C arrays named after its state dict ("1.weight" is w_1_weight) */
static void write_float(FILE *out, mlc_module *model, const float *x, const float *y) {
    mlc_named_tensor state[32];
    int n = mlc_module_state(model, state, 32);
    fprintf(out, "/* Written by examples/embedded/export.c: the digits CNN (%zu parameters) and %d held-out\n"
                 "   test digits. Arrays are named after the state dict (\"1.weight\" is w_1_weight). */\n",
            mlc_module_param_count(model), HELD_OUT);
    for (int i = 0; i < n && i < 32; i++) {
        char name[160] = "w_";
        if (strstr(state[i].name, "num_batches_tracked")) continue;   /* training bookkeeping */
        for (size_t k = 0; state[i].name[k] && k + 3 < sizeof name; k++)
            name[k + 2] = state[i].name[k] == '.' ? '_' : state[i].name[k];
        write_array(out, name, mlc_host_data(state[i].tensor), NULL, state[i].tensor->size);
    }
    write_held_out(out, x, y);
}

/* path written by write (float32 or int8); 0 on failure, said on stderr */
static int write_file(const char *path, mlc_module *model, const cnn_int8 *q, const float *x,
                      const float *y) {
    FILE *out = fopen(path, "w");
    if (!out) { perror(path); return 0; }
    if (q) write_int8(out, q, x, y);
    else write_float(out, model, x, y);
    if (fclose(out) != 0) { perror(path); return 0; }
    return 1;
}

int main(int argc, char **argv) {
    const char *out_path = argc > 1 ? argv[1] : NULL, *data = "data/digits.bin", *load = NULL, *save = NULL;
    const char *int8_path = NULL;
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--load") == 0 && i + 1 < argc) load = argv[++i];
        else if (strcmp(argv[i], "--save") == 0 && i + 1 < argc) save = argv[++i];
        else if (strcmp(argv[i], "--int8") == 0 && i + 1 < argc) int8_path = argv[++i];
        else data = argv[i];
    }
    if (!out_path) {
        fprintf(stderr, "usage: export OUT.h [digits.bin] [--int8 OUT_INT8.h] "
                        "[--load|--save model.safetensors]\n");
        return 1;
    }
    char err[256];
    digits_set ds;
    if (digits_load(data, &ds, err, sizeof err) != 0) { fprintf(stderr, "%s\n", err); return 1; }
    mlc_ctx *ctx = mlc_create(&(mlc_config){ .seed = 1, .device = "cpu" });
    mlc_module *model = digits_cnn(ctx);
    if (load) mlc_module_load(model, load, NULL);
    else train(ctx, model, &ds);
    if (save && !mlc_error(ctx)) mlc_module_save(model, save, NULL);

    /* The int8 model, calibrated on the training digits; then the host's predictions for the
       test set, float32 and int8. The first HELD_OUT test digits go to the microcontroller. */
    static float x[DIGITS_MAX_COUNT * DIGITS_PIXELS], y[DIGITS_MAX_COUNT];
    int n_test = ds.count - DIGITS_TRAIN_COUNT, predictions[2][HELD_OUT], correct[2] = { 0, 0 };
    cnn_int8 q;
    mlc_module_train(model, 0);
    mlc_set_grad_enabled(ctx, 0);
    if (int8_path) {
        rows(&ds, 0, DIGITS_TRAIN_COUNT, x, y);
        quantize(model, x, DIGITS_TRAIN_COUNT, &q);
    }
    rows(&ds, DIGITS_TRAIN_COUNT, n_test, x, y);
    digits_free(&ds);
    mlc_tensor *images = mlc_from_data(ctx, MLC_SHAPE(n_test, DIGITS_PIXELS), x);
    mlc_tensor *pred = mlc_argmax(mlc_forward(model, images), 1);
    mlc_tensor *logits = int8_path ? cnn_int8_logits(&q, mlc_reshape(images, MLC_SHAPE(-1, 1, 8, 8))) : NULL;
    for (int i = 0; pred && (logits || !int8_path) && i < n_test; i++) {
        const int p[2] = { (int)mlc_get(pred, (size_t)i), logits ? cnn_int8_class(logits, i) : -1 };
        for (int k = 0; k < 2; k++) {
            correct[k] += p[k] == (int)y[i];
            if (i < HELD_OUT) predictions[k][i] = p[k];
        }
    }
    if (mlc_error(ctx)) {
        fprintf(stderr, "error: %s\n", mlc_error_message(ctx));
        mlc_destroy(ctx);
        return 1;
    }
    if (!write_file(out_path, model, NULL, x, y) || (int8_path && !write_file(int8_path, model, &q, x, y))) {
        mlc_destroy(ctx);
        return 1;
    }

    fprintf(stderr, "host test accuracy %.2f%%", 100.0 * correct[0] / n_test);
    if (int8_path) fprintf(stderr, ", int8 %.2f%%", 100.0 * correct[1] / n_test);
    fprintf(stderr, " (%d images)\n", n_test);
    for (int k = 0; k < (int8_path ? 2 : 1); k++) {
        printf("%spredictions:", k ? "int8 " : "");
        for (int i = 0; i < HELD_OUT; i++) printf(" %d", predictions[k][i]);
        printf("\n");
    }
    if (int8_path) {
        uint32_t hash = CNN_INT8_HASH;
        for (int i = 0; i < HELD_OUT; i++) hash = cnn_int8_hash(logits, i, hash);
        printf("int8 logits hash: %lu\n", (unsigned long)hash);
    }
    mlc_destroy(ctx);
    return 0;
}
