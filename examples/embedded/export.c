/* The exporter of make embedded: trains the digits CNN of examples/digits.c (the same layers
   and recipe) or loads it from a safetensors file, and writes its weights and a few held-out
   test digits as C arrays (`static const float`) for the Cortex-M4F program in main.c, which
   uses them in place from flash. It prints the host's test accuracy (stderr) and its
   predictions for those digits ("predictions: 7 3 ..."), which the Makefile compares with the
   microcontroller's.
   Usage: export OUT.h [data/digits.bin] [--load model.safetensors] [--save model.safetensors] */
#include <stdio.h>
#include <string.h>
#define MLC_IMPLEMENTATION
#include "mlc.h"
#include "../digits_data.h"

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

/* name[] = { ... } with every float to 9 significant digits (read back bit for bit). */
static void write_array(FILE *out, const char *name, const float *v, size_t n) {
    fprintf(out, "static const float %s[%zu] = {", name, n);
    for (size_t i = 0; i < n; i++)
        fprintf(out, "%s%.8ef", !i ? "\n    " : i % 6 ? ", " : ",\n    ", (double)v[i]);
    fprintf(out, "\n};\n");
}

int main(int argc, char **argv) {
    const char *out_path = argc > 1 ? argv[1] : NULL, *data = "data/digits.bin", *load = NULL, *save = NULL;
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--load") == 0 && i + 1 < argc) load = argv[++i];
        else if (strcmp(argv[i], "--save") == 0 && i + 1 < argc) save = argv[++i];
        else data = argv[i];
    }
    if (!out_path) {
        fprintf(stderr, "usage: export OUT.h [digits.bin] [--load|--save model.safetensors]\n");
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

    /* The host's predictions for the test set; the first HELD_OUT digits go to the microcontroller. */
    static float x[DIGITS_MAX_COUNT * DIGITS_PIXELS], y[DIGITS_MAX_COUNT];
    int n_test = ds.count - DIGITS_TRAIN_COUNT, predictions[HELD_OUT], correct = 0;
    rows(&ds, DIGITS_TRAIN_COUNT, n_test, x, y);
    digits_free(&ds);
    mlc_module_train(model, 0);
    mlc_set_grad_enabled(ctx, 0);
    mlc_tensor *images = mlc_from_data(ctx, MLC_SHAPE(n_test, DIGITS_PIXELS), x);
    mlc_tensor *pred = mlc_argmax(mlc_forward(model, images), 1);
    for (int i = 0; pred && i < n_test; i++) {
        correct += mlc_get(pred, (size_t)i) == y[i];
        if (i < HELD_OUT) predictions[i] = (int)mlc_get(pred, (size_t)i);
    }
    if (mlc_error(ctx)) {
        fprintf(stderr, "error: %s\n", mlc_error_message(ctx));
        mlc_destroy(ctx);
        return 1;
    }

    FILE *out = fopen(out_path, "w");
    if (!out) { perror(out_path); mlc_destroy(ctx); return 1; }
    fprintf(out, "/* Written by examples/embedded/export.c: the digits CNN (%zu parameters) and %d held-out\n"
                 "   test digits. Arrays are named after the state dict (\"1.weight\" is w_1_weight). */\n",
            mlc_module_param_count(model), HELD_OUT);
    mlc_named_tensor state[32];
    int n = mlc_module_state(model, state, 32);
    for (int i = 0; i < n && i < 32; i++) {
        char name[160] = "w_";
        if (strstr(state[i].name, "num_batches_tracked")) continue;   /* training bookkeeping */
        for (size_t k = 0; state[i].name[k] && k + 3 < sizeof name; k++)
            name[k + 2] = state[i].name[k] == '.' ? '_' : state[i].name[k];
        write_array(out, name, mlc_host_data(state[i].tensor), state[i].tensor->size);
    }
    fprintf(out, "#define HELD_OUT %d\n", HELD_OUT);
    write_array(out, "held_out", x, HELD_OUT * DIGITS_PIXELS);
    fprintf(out, "static const unsigned char held_out_labels[HELD_OUT] = {");
    for (int i = 0; i < HELD_OUT; i++) fprintf(out, "%s%d", i ? ", " : " ", (int)y[i]);
    fprintf(out, " };\n");
    if (fclose(out) != 0) { perror(out_path); mlc_destroy(ctx); return 1; }

    fprintf(stderr, "host test accuracy %.2f%% (%d images)\n", 100.0 * correct / n_test, n_test);
    printf("predictions:");
    for (int i = 0; i < HELD_OUT; i++) printf(" %d", predictions[i]);
    printf("\n");
    mlc_destroy(ctx);
    return 0;
}
