/* make demo: a classifier for the UCI handwritten digits (8x8 images, 1,797 samples, CC BY 4.0;
   see data/README.md), trained on the first 1,500 and tested on the last 297.
   Model: a small CNN, conv 3x3 (16) - batch norm - ReLU - max pool - conv 3x3 (32) - batch norm -
   ReLU - max pool - dropout - linear 128 -> 10; cross entropy, AdamW with a cosine schedule
   (one epoch of warm-up), batches of 32.
   (An MLP reaches about 92% here: the last 297 images come from other writers.)
   --int8: then static int8 quantization (mlc_quantize_static, BatchNorms folded into the convs,
   ReLUs fused), calibrated on the first N batches of 64 training images (--calibration N, 8 by
   default), and the int8 model's test accuracy beside float32's (issue 26: within 1 point).
   Usage: digits [--int8 [--calibration N]] [FILE]
          (FILE: default data/digits.bin, found from any directory; see --help) */
#define _POSIX_C_SOURCE 199309L
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#define MLC_IMPLEMENTATION
#include "mlc.h"
#include "digits_data.h"
#include "find_data.h"
#include "parse_arg.h"

#define EPOCHS 30
#define BATCH 32
#define DEFAULT_DIGITS "data/digits.bin"
#define CALIBRATION_BATCH 64
#define DEFAULT_CALIBRATION 8
#define MAX_CALIBRATION ((DIGITS_TRAIN_COUNT + CALIBRATION_BATCH - 1) / CALIBRATION_BATCH)  /* 24 */

static double seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void usage(FILE *out, const char *program) {
    fprintf(out, "usage: %s [--int8 [--calibration N]] [FILE]\n"
                 "Trains a small CNN on the UCI digits for %d epochs (batches of %d), then tests it.\n"
                 "  FILE             the digits (default " DEFAULT_DIGITS ", looked up in the current\n"
                 "                   directory, then in the program's directory, then in its parent)\n"
                 "  --int8           then quantize it to int8 (static) and test it again\n"
                 "  --calibration N  with --int8: calibrate on N batches of %d training images\n"
                 "                   (%d; 1 to %d)\n"
                 "  -h, --help       this text\n"
                 "Device: $MLC_DEVICE (cpu, opencl, opencl:N, best), else the CPU.\n",
            program, EPOCHS, BATCH, CALIBRATION_BATCH, DEFAULT_CALIBRATION,
            MAX_CALIBRATION);
}

/* Images scaled to [0, 1] as a long-lived [count, 64] tensor, labels as [count] class indices. */
static void to_tensors(mlc_ctx *ctx, const digits_set *ds, int first, int count, mlc_tensor **x, mlc_tensor **y) {
    *x = mlc_empty(ctx, MLC_SHAPE(count, DIGITS_PIXELS));
    *y = mlc_empty(ctx, MLC_SHAPE(count));
    if (!*x || !*y) return;
    for (int i = 0; i < count; i++) {
        for (int j = 0; j < DIGITS_PIXELS; j++)
            (*x)->data[i * DIGITS_PIXELS + j] = ds->pixels[(size_t)(first + i) * DIGITS_PIXELS + j] / 16.0f;
        (*y)->data[i] = ds->labels[first + i];
    }
}

/* A module of our own: [N, 64] rows to [N, 1, 8, 8] images. */
static mlc_tensor *to_image(mlc_module *m, mlc_tensor *x) { (void)m; return mlc_reshape(x, MLC_SHAPE(-1, 1, 8, 8)); }

/* Fraction of rows of x whose argmax of the model's output is the label. */
static float accuracy(mlc_module *model, mlc_tensor *x, mlc_tensor *y) {
    mlc_frame f = mlc_frame_begin(x->ctx);
    int was = mlc_set_grad_enabled(x->ctx, 0), correct = 0;
    mlc_module_train(model, 0);
    mlc_tensor *pred = mlc_argmax(mlc_forward(model, x), 1);
    for (int i = 0; pred && i < y->shape[0]; i++) correct += mlc_host_data(pred)[i] == mlc_host_data(y)[i];
    mlc_module_train(model, 1);
    mlc_set_grad_enabled(x->ctx, was);
    mlc_frame_end(f);
    return (float)correct / (float)y->shape[0];
}

/* --int8: static quantization (mlc_quantize_static converts the model in place) calibrated on
   the first `batches` batches of CALIBRATION_BATCH training images, then the int8 model's test
   accuracy beside float32's; returns it (the error set on mlc's error). */
static float quantize_and_test(mlc_module *model, mlc_tensor *x_train, mlc_tensor *x_test, mlc_tensor *y_test,
                               int batches, float float_acc) {
    mlc_tensor *calibration[MAX_CALIBRATION];
    int count = 0, n = x_train->shape[0];
    mlc_frame f = mlc_frame_begin(x_train->ctx);      /* the batches, until quantized */
    for (int b = 0; b < batches && b * CALIBRATION_BATCH < n; b++)
        calibration[count++] = mlc_slice(x_train, 0, b * CALIBRATION_BATCH,
                                         (b + 1) * CALIBRATION_BATCH < n ? (b + 1) * CALIBRATION_BATCH : n);
    mlc_quantize_static(model, calibration, count);
    mlc_frame_end(f);
    if (mlc_error(x_train->ctx)) return 0.0f;
    float int8_acc = accuracy(model, x_test, y_test);
    if (mlc_error(x_train->ctx)) return 0.0f;
    printf("int8 test accuracy %.2f%% (%+.2f points against float32; calibrated on %d batch%s of up to %d "
           "training images)\n",
           100.0 * int8_acc, 100.0 * (int8_acc - float_acc), count, count == 1 ? "" : "es",
           CALIBRATION_BATCH);
    return int8_acc;
}

int main(int argc, char **argv) {
    const char *path = NULL;
    char found[1024], err[256];
    int int8 = 0, calibration = 0;
    for (int i = 1; i < argc; i++) {                  /* --help: exit 0; a bad command line: 2 */
        const char *arg = argv[i], *bad = NULL;
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) { usage(stdout, argv[0]); return 0; }
        else if (!strcmp(arg, "--int8")) int8 = 1;
        else if (!strcmp(arg, "--calibration") && ++i == argc) bad = "needs a value";
        else if (!strcmp(arg, "--calibration")) {      /* (parse_arg.h says what is wrong: bad = "") */
            if (!parse_int_arg(arg, argv[i], 1, MAX_CALIBRATION, &calibration)) bad = "";
        } else if (arg[0] == '-') bad = "unknown option";
        else if (path) bad = "one data file only";
        else path = arg;
        if (bad && *bad) fprintf(stderr, "%s: %s\n", arg, bad);
        if (bad) { usage(stderr, argv[0]); return 2; }
    }
    if (calibration && !int8) {
        fprintf(stderr, "--calibration goes with --int8\n");
        usage(stderr, argv[0]);
        return 2;
    }
    if (!calibration) calibration = DEFAULT_CALIBRATION;
    if (!path) path = find_data(argv[0], DEFAULT_DIGITS, found, sizeof found);
    digits_set ds;
    if (digits_load(path, &ds, err, sizeof err) != 0) { fprintf(stderr, "%s\n", err); return 1; }
    if (ds.count <= DIGITS_TRAIN_COUNT) {             /* the first 1500 train, the rest test */
        fprintf(stderr, "error: %s has %d digits; it needs more than %d (the training set) to test on\n",
                path, ds.count, DIGITS_TRAIN_COUNT);
        digits_free(&ds);
        return 1;
    }

    mlc_ctx *ctx = mlc_create(&(mlc_config){ .seed = 1 });   /* device: $MLC_DEVICE, else the CPU */
    if (!ctx || mlc_error(ctx)) { mlc_destroy(ctx); digits_free(&ds); return 1; }   /* mlc logged why */
    int n_train = DIGITS_TRAIN_COUNT, n_test = ds.count - DIGITS_TRAIN_COUNT;
    mlc_tensor *x_train, *y_train, *x_test, *y_test;
    to_tensors(ctx, &ds, 0, n_train, &x_train, &y_train);
    to_tensors(ctx, &ds, n_train, n_test, &x_test, &y_test);
    digits_free(&ds);
    printf("Using device: %s\n", mlc_device_name(ctx));
    printf("UCI digits: %d training and %d test images of 8x8 pixels\n", n_train, n_test);

    /* the layers with weights one a statement, in order: C leaves the order of a call's
       arguments open, and each draws from the context's RNG (the same model everywhere) */
    mlc_module *conv1 = mlc_nn_conv2d(ctx, 1, 16, 3, (mlc_conv_opts){ .padding = 1 });
    mlc_module *conv2 = mlc_nn_conv2d(ctx, 16, 32, 3, (mlc_conv_opts){ .padding = 1 });
    mlc_module *fc = mlc_nn_linear(ctx, 128, 10);
    mlc_module *model = mlc_nn_sequential(ctx, mlc_nn_custom(ctx, "Reshape", to_image, NULL),
        conv1, mlc_nn_batch_norm(ctx, 16), mlc_nn_relu(ctx), mlc_nn_max_pool2d(ctx, 2, 2),
        conv2, mlc_nn_batch_norm(ctx, 32), mlc_nn_relu(ctx), mlc_nn_max_pool2d(ctx, 2, 2),
        mlc_nn_flatten(ctx), mlc_nn_dropout(ctx, 0.3f), fc, NULL);
    mlc_optim *opt = mlc_adamw(ctx, model, (mlc_adam_opts){ .lr = 3e-3f, .weight_decay = 1e-2f });
    if (!model || !opt) { fprintf(stderr, "error: %s\n", mlc_error_message(ctx)); mlc_destroy(ctx); return 1; }

    int tty = isatty(1);
    float order[DIGITS_TRAIN_COUNT];
    for (int i = 0; i < n_train; i++) order[i] = (float)i;
    double start = seconds();
    int step = 0, steps_per_epoch = (n_train + BATCH - 1) / BATCH;
    for (int epoch = 1; epoch <= EPOCHS; epoch++) {
        double epoch_start = seconds(), loss_sum = 0;
        int seen = 0, correct = 0;
        for (int i = n_train - 1; i > 0; i--) {                /* shuffle with the context's RNG */
            int j = (int)(mlc_rand_u32(ctx) % (uint32_t)(i + 1));
            float t = order[i]; order[i] = order[j]; order[j] = t;
        }
        for (int b = 0; b < n_train; b += BATCH) {
            int count = n_train - b < BATCH ? n_train - b : BATCH;
            mlc_frame f = mlc_frame_begin(ctx);
            mlc_optim_set_lr(opt, mlc_lr_cosine(3e-3f, step++, steps_per_epoch, EPOCHS * steps_per_epoch, 1e-5f));
            mlc_tensor *idx = mlc_from_data(ctx, MLC_SHAPE(count), order + b);
            mlc_tensor *logits = mlc_forward(model, mlc_index_select(x_train, 0, idx));
            mlc_tensor *target = mlc_index_select(y_train, 0, idx);
            mlc_tensor *loss = mlc_cross_entropy(logits, target, MLC_REDUCE_MEAN, MLC_NO_IGNORE);
            mlc_zero_grad(opt);
            mlc_backward(loss);
            mlc_step(opt);
            mlc_tensor *pred = mlc_argmax(logits, 1);
            if (!pred) { mlc_frame_end(f); break; }
            for (int i = 0; i < count; i++) correct += mlc_host_data(pred)[i] == mlc_host_data(target)[i];
            loss_sum += mlc_item(loss) * count;
            seen += count;
            if (tty) {                                        /* live progress bar */
                int filled = 30 * seen / n_train;
                printf("\repoch %2d/%d [%.*s%*s] loss %.4f  acc %5.1f%%  %6.0f samples/s", epoch, EPOCHS,
                       filled, "##############################", 30 - filled, "", loss_sum / seen,
                       100.0 * correct / seen, seen / (seconds() - epoch_start));
                fflush(stdout);
            }
            mlc_frame_end(f);
        }
        if (mlc_error(ctx)) break;
        if (tty) printf("\n");
        else printf("epoch %2d/%d loss %.4f  acc %5.1f%%  %6.0f samples/s\n", epoch, EPOCHS, loss_sum / seen,
                    100.0 * correct / seen, seen / (seconds() - epoch_start));
    }
    if (mlc_error(ctx)) { fprintf(stderr, "error: %s\n", mlc_error_message(ctx)); mlc_destroy(ctx); return 1; }
    float test_acc = accuracy(model, x_test, y_test);
    printf("test accuracy %.2f%% (%d images) after %.2f s of training\n", 100.0 * test_acc, n_test, seconds() - start);
    float int8_acc = int8 ? quantize_and_test(model, x_train, x_test, y_test, calibration, test_acc) : 1.0f;
    if (mlc_error(ctx)) {
        fprintf(stderr, "error: %s\n", mlc_error_message(ctx));
        mlc_destroy(ctx);
        return 1;
    }
    mlc_destroy(ctx);
    return test_acc >= 0.95f && int8_acc >= 0.95f ? 0 : 1;     /* (--int8: the int8 model's too) */
}
