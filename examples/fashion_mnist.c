/* Fashion-MNIST: 70,000 28x28 greyscale images of clothes in 10 classes (Zalando Research, MIT
   licence), read with mlc's IDX reader straight from the gzipped files of Debian's
   dataset-fashion-mnist (apt install dataset-fashion-mnist).
   Models: --model mlp  784-256-128-10 with batch norm and ReLU          (about 89 %)
           --model cnn  conv 3x3 (16) - BN - ReLU - pool - conv 3x3 (32) - BN - ReLU - pool -
                        linear 1568-128 - ReLU - linear 128-10             (about 92 %)
   Adam with a cosine learning-rate schedule, cross entropy, shuffled batches (mlc_batches).
   Usage: fashion_mnist [--data DIR] [--model mlp|cnn] [--device NAME] [--epochs N] [--batch N]
                        [--lr X] [--seed N] [--amp bf16|fp16] [--csv FILE] [--save FILE] [--resume FILE]
                        [--int8 [--calibration N]]
   --amp trains with mixed precision (mlc_autocast_begin): the products in bf16 or fp16 with
   float32 master weights; fp16 with a gradient scaler (mlc_grad_scaler_create), which the
   checkpoints keep.
   --csv writes one line per epoch (loss and accuracy, train and test); tools/plot_svg.py
   draws it. --save FILE writes a checkpoint after every epoch; --resume FILE continues from one
   (the same --model, and --epochs counting all epochs, the resumed ones too).
   --int8: after training (or resuming), the float32 model's test accuracy (no autocast),
   then static int8 quantization (mlc_quantize_static: the ranges observed on the first N
   batches of 64 training images, --calibration N, 8 by default) and the int8 model's test
   accuracy, with the difference in points (issue 26's target: within 1 point).
   fashion_mnist --help lists the defaults; a bad option exits with status 2. */
#define _POSIX_C_SOURCE 199309L
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#define MLC_IMPLEMENTATION
#include "mlc.h"
#include "fashion_models.h"
#include "parse_arg.h"

typedef struct options {
    const char *data, *model, *device, *csv, *save, *resume, *amp;
    int epochs, batch, int8, calibration;   /* --int8, --calibration N (batches of CALIBRATION_BATCH) */
    mlc_scalar_type amp_dtype;          /* MLC_F32: no autocast */
    float lr;
    unsigned long long seed;
} options;

static double seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define DEFAULT_DATA "/usr/share/datasets/fashion-mnist"
#define CALIBRATION_BATCH 64
#define DEFAULT_CALIBRATION 8

static void usage(FILE *out, const char *program) {
    fprintf(out, "usage: %s [options]\n"
                 "Trains a classifier for Fashion-MNIST and tests it after every epoch.\n"
                 "  --data DIR          the four .gz files (" DEFAULT_DATA ",\n"
                 "                      from Debian's dataset-fashion-mnist)\n"
                 "  --model mlp|cnn     the model (mlp)\n"
                 "  --device NAME       cpu, opencl, opencl:N, best (default: $MLC_DEVICE, else the CPU)\n"
                 "  --epochs N          epochs, resumed ones included (10 for mlp, 5 for cnn)\n"
                 "  --batch N           batch size (128 for mlp, 64 for cnn)\n"
                 "  --lr X              Adam's peak learning rate, cosine schedule (0.002)\n"
                 "  --seed N            random seed (1)\n"
                 "  --amp bf16|fp16|off mixed precision (off)\n"
                 "  --csv FILE          write a line per epoch: loss and accuracy, train and test\n"
                 "  --save FILE         write a checkpoint after every epoch\n"
                 "  --resume FILE       continue from a checkpoint\n"
                 "  --int8              then quantize to int8 (static) and test again\n"
                 "  --calibration N     with --int8: calibrate on N batches of %d training images (%d)\n"
                 "  -h, --help          this text\n", program, CALIBRATION_BATCH, DEFAULT_CALIBRATION);
}

/* The command line into *o: RUN, HELP (-h, --help) or BAD (a message printed). */
enum { RUN, HELP, BAD };
static int parse_options(int argc, char **argv, options *o) {
    *o = (options){ .data = DEFAULT_DATA, .model = "mlp", .epochs = 0, .batch = 0, .lr = 0.0f, .seed = 1 };
    for (int i = 1; i < argc; i++) {
        const char *flag = argv[i], *value = i + 1 < argc ? argv[i + 1] : "";
        int ok = 1;                                  /* a number read strictly (parse_arg.h) */
        if (!strcmp(flag, "--help") || !strcmp(flag, "-h")) return HELP;
        if (!strcmp(flag, "--int8")) { o->int8 = 1; continue; }          /* (no value) */
        if (!strcmp(flag, "--data")) o->data = value;
        else if (!strcmp(flag, "--model")) o->model = value;
        else if (!strcmp(flag, "--device")) o->device = value;
        else if (!strcmp(flag, "--epochs")) ok = parse_int_arg(flag, value, 1, 1000000, &o->epochs);
        else if (!strcmp(flag, "--batch")) ok = parse_int_arg(flag, value, 1, 1 << 20, &o->batch);
        else if (!strcmp(flag, "--lr")) ok = parse_float_arg(flag, value, 0.0, 10.0, &o->lr);
        else if (!strcmp(flag, "--seed")) ok = parse_u64_arg(flag, value, &o->seed);
        else if (!strcmp(flag, "--csv")) o->csv = value;
        else if (!strcmp(flag, "--save")) o->save = value;
        else if (!strcmp(flag, "--resume")) o->resume = value;
        else if (!strcmp(flag, "--amp")) o->amp = value;
        else if (!strcmp(flag, "--calibration"))
            ok = parse_int_arg(flag, value, 1, 60000 / CALIBRATION_BATCH, &o->calibration);
        else { fprintf(stderr, "unknown option %s\n", flag); return BAD; }
        if (++i == argc) { fprintf(stderr, "%s needs a value\n", flag); return BAD; }
        if (!ok) return BAD;
    }
    int cnn = !strcmp(o->model, "cnn");
    if (!cnn && strcmp(o->model, "mlp")) { fprintf(stderr, "--model is mlp or cnn\n"); return BAD; }
    o->amp_dtype = !o->amp || !strcmp(o->amp, "off") ? MLC_F32 : !strcmp(o->amp, "bf16") ? MLC_BF16
                 : !strcmp(o->amp, "fp16") ? MLC_F16 : (mlc_scalar_type)-1;
    if ((int)o->amp_dtype < 0) { fprintf(stderr, "--amp is bf16, fp16 or off\n"); return BAD; }
    if (o->calibration && !o->int8) { fprintf(stderr, "--calibration goes with --int8\n"); return BAD; }
    if (!o->calibration) o->calibration = DEFAULT_CALIBRATION;
    if (!o->epochs) o->epochs = cnn ? 5 : 10;
    if (!o->batch) o->batch = cnn ? 64 : 128;
    if (o->lr <= 0.0f) o->lr = 2e-3f;
    if (o->epochs > 0 && o->batch > 0) return RUN;
    fprintf(stderr, "--epochs and --batch must be positive\n");
    return BAD;
}

/* Checkpoints: --resume FILE loads model, optimiser, step count and RNG before the first epoch
   (returns the epoch to start at; 0 on mlc's error, -1 on an epoch out of range, said); --save FILE
   is written after every epoch, atomically,
   so stopping the run at any moment leaves the last finished epoch. A resumed run's shuffles and
   losses equal an uninterrupted run's. */
static int checkpoint(const options *o, int resuming, int epoch, mlc_module *model, mlc_optim *opt) {
    mlc_train_state state = { .epoch = epoch };
    if (resuming) {
        if (!o->resume) return 1;
        if (mlc_checkpoint_load(o->resume, model, opt, &state) != MLC_OK) return 0;
        if (state.epoch < 0 || state.epoch > o->epochs) {       /* a count read from a file */
            fprintf(stderr, "error: %s: the checkpoint is after epoch %lld, not one of 0 to --epochs %d\n",
                    o->resume, state.epoch, o->epochs);
            return -1;
        }
        printf("resumed from %s after epoch %lld\n", o->resume, state.epoch);
        return (int)state.epoch + 1;
    }
    if (!o->save) return 1;
    if (mlc_checkpoint_save(o->save, model, opt, &state) != MLC_OK) return 0;
    printf("epoch %d saved to %s\n", epoch, o->save);
    fflush(stdout);
    return 1;
}

/* Mean loss and accuracy over x and y, in eval mode, batches of 500, no gradients (under the
   training's autocast, if any). */
static void evaluate(mlc_ctx *ctx, mlc_module *model, mlc_tensor *x, mlc_tensor *y, mlc_scalar_type amp,
                     double *loss, double *acc) {
    mlc_batches *batches = mlc_batches_create(x, y, (mlc_batch_opts){ .batch_size = 500 });
    mlc_tensor *bx, *by;
    int was = mlc_set_grad_enabled(ctx, 0), correct = 0, seen = 0;
    double loss_sum = 0;
    mlc_module_train(model, 0);
    for (;;) {
        mlc_frame f = mlc_frame_begin(ctx);
        if (!mlc_batches_next(batches, &bx, &by)) { mlc_frame_end(f); break; }
        if (amp != MLC_F32) mlc_autocast_begin(ctx, amp);
        mlc_tensor *logits = mlc_forward(model, bx);
        mlc_tensor *pred = mlc_argmax(logits, 1);
        mlc_tensor *l = mlc_cross_entropy(logits, by, MLC_REDUCE_SUM, MLC_NO_IGNORE);
        mlc_autocast_end(ctx);
        if (!pred || !l) { mlc_frame_end(f); break; }
        const float *p = mlc_host_data(pred), *t = mlc_host_data(by);
        for (int i = 0; i < bx->shape[0]; i++) correct += p[i] == t[i];
        loss_sum += mlc_item(l);
        seen += bx->shape[0];
        mlc_frame_end(f);
    }
    mlc_module_train(model, 1);
    mlc_set_grad_enabled(ctx, was);
    mlc_batches_free(batches);
    *loss = seen ? loss_sum / seen : 0;
    *acc = seen ? (double)correct / seen : 0;
}

/* --int8: the float32 model's test accuracy (no autocast), then static quantization
   (mlc_quantize_static, which converts the model in place) calibrated on the first o->calibration
   batches of CALIBRATION_BATCH training images (as many as there are), then the int8 model's test
   accuracy and the difference. On mlc's error it returns with the error set. */
static void quantize_and_test(mlc_ctx *ctx, const options *o, mlc_module *model, mlc_tensor *x_train,
                              mlc_tensor *x_test, mlc_tensor *y_test) {
    mlc_tensor *calibration[60000 / CALIBRATION_BATCH];
    int count = 0, n = x_train->shape[0];
    double loss, float_acc, int8_acc, start;
    evaluate(ctx, model, x_test, y_test, MLC_F32, &loss, &float_acc);
    if (mlc_error(ctx)) return;
    printf("float32 test accuracy %.2f%%\n", 100.0 * float_acc);
    fflush(stdout);
    start = seconds();
    mlc_frame f = mlc_frame_begin(ctx);              /* the batches, until quantized */
    for (int b = 0; b < o->calibration && b * CALIBRATION_BATCH < n; b++)
        calibration[count++] = mlc_slice(x_train, 0, b * CALIBRATION_BATCH,
                                         (b + 1) * CALIBRATION_BATCH < n ? (b + 1) * CALIBRATION_BATCH : n);
    mlc_quantize_static(model, calibration, count);
    mlc_frame_end(f);
    if (mlc_error(ctx)) return;
    evaluate(ctx, model, x_test, y_test, MLC_F32, &loss, &int8_acc);
    if (mlc_error(ctx)) return;
    printf("int8 test accuracy %.2f%% (%+.2f points against float32; calibrated on %d batch%s of up to %d "
           "training images; quantized and tested in %.1f s)\n",
           100.0 * int8_acc, 100.0 * (int8_acc - float_acc), count, count == 1 ? "" : "es", CALIBRATION_BATCH,
           seconds() - start);
}

static mlc_tensor *load(mlc_ctx *ctx, const char *dir, const char *file, int flags) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    return mlc_idx_load(ctx, path, flags);
}

int main(int argc, char **argv) {
    options o;
    int parsed = parse_options(argc, argv, &o);
    if (parsed != RUN) {                              /* --help: exit 0; a bad command line: 2 */
        usage(parsed == HELP ? stdout : stderr, argv[0]);
        return parsed == HELP ? 0 : 2;
    }
    mlc_ctx *ctx = mlc_create(&(mlc_config){ .seed = o.seed, .device = o.device });
    if (!ctx || mlc_error(ctx)) { mlc_destroy(ctx); return 1; }              /* mlc logged why */
    mlc_tensor *x_train = load(ctx, o.data, "train-images-idx3-ubyte.gz", MLC_IDX_SCALE_U8);
    mlc_tensor *y_train = load(ctx, o.data, "train-labels-idx1-ubyte.gz", 0);
    mlc_tensor *x_test = load(ctx, o.data, "t10k-images-idx3-ubyte.gz", MLC_IDX_SCALE_U8);
    mlc_tensor *y_test = load(ctx, o.data, "t10k-labels-idx1-ubyte.gz", 0);
    if (mlc_error(ctx)) {
        fprintf(stderr, "error: %s\n(install Debian's dataset-fashion-mnist, or give --data DIR)\n",
                mlc_error_message(ctx));
        mlc_destroy(ctx);
        return 1;
    }
    int cnn = !strcmp(o.model, "cnn");
    mlc_module *model = cnn ? make_cnn(ctx) : make_mlp(ctx);
    mlc_optim *opt = mlc_adam(ctx, model, (mlc_adam_opts){ .lr = o.lr });
    mlc_grad_scaler *scaler = NULL;                  /* fp16 autocast: gradients scaled */
    if (o.amp_dtype == MLC_F16) scaler = mlc_grad_scaler_create(opt, (mlc_grad_scaler_opts){ 0 });
    mlc_batches *batches = mlc_batches_create(x_train, y_train,
                                              (mlc_batch_opts){ .batch_size = o.batch, .shuffle = 1 });
    FILE *csv = o.csv ? fopen(o.csv, "w") : NULL;
    if (!model || !opt || !batches || (o.csv && !csv)) {
        fprintf(stderr, "error: %s\n", o.csv && !csv ? "cannot write the --csv file"
                                                      : mlc_error_message(ctx));
        mlc_destroy(ctx);
        return 1;
    }
    if (csv) fprintf(csv, "epoch,train_loss,train_accuracy,test_loss,test_accuracy,seconds\n");
    printf("Using device: %s\n", mlc_device_name(ctx));
    printf("Fashion-MNIST: %d training and %d test images; %s, %zu parameters; batch %d, Adam lr %g, "
           "%d epochs%s%s\n",
           x_train->shape[0], x_test->shape[0], o.model, mlc_module_param_count(model), o.batch, (double)o.lr,
           o.epochs, o.amp_dtype != MLC_F32 ? "; autocast " : "",
           o.amp_dtype != MLC_F32 ? mlc_dtype_name(o.amp_dtype) : "");

    int first_epoch = checkpoint(&o, 1, 0, model, opt), steps = mlc_batches_count(batches);
    if (first_epoch > 0 && (long long)o.epochs * steps > INT_MAX) {      /* steps are counted in int */
        fprintf(stderr, "error: --epochs %d of %d steps is more than %d steps\n", o.epochs, steps, INT_MAX);
        first_epoch = -1;
    }
    if (first_epoch <= 0) {                          /* (-1: the message is out already) */
        if (!first_epoch) fprintf(stderr, "error: %s\n", mlc_error_message(ctx));
        mlc_destroy(ctx);
        return 1;
    }
    int tty = isatty(1), step = (first_epoch - 1) * steps;
    int n_train = x_train->shape[0];
    double start = seconds();
    for (int epoch = first_epoch; epoch <= o.epochs; epoch++) {
        double epoch_start = seconds(), shown = 0, loss_sum = 0;
        int seen = 0, correct = 0;
        mlc_tensor *x, *y;
        for (;;) {
            mlc_frame f = mlc_frame_begin(ctx);
            if (!mlc_batches_next(batches, &x, &y)) { mlc_frame_end(f); break; }
            mlc_optim_set_lr(opt, mlc_lr_cosine(o.lr, step++, 0, o.epochs * steps, 0.0f));
            if (o.amp_dtype != MLC_F32) mlc_autocast_begin(ctx, o.amp_dtype);
            mlc_tensor *logits = mlc_forward(model, x);
            mlc_tensor *loss = mlc_cross_entropy(logits, y, MLC_REDUCE_MEAN, MLC_NO_IGNORE);
            mlc_autocast_end(ctx);
            mlc_zero_grad(opt);
            if (scaler) {                          /* fp16: the loss scaled, the step skipped on overflow */
                mlc_backward(mlc_grad_scaler_scale(scaler, loss));
                mlc_grad_scaler_step(scaler);
                mlc_grad_scaler_update(scaler);
            } else {
                mlc_backward(loss);
                mlc_step(opt);
            }
            mlc_tensor *pred = mlc_argmax(logits, 1);
            if (!pred) { mlc_frame_end(f); break; }
            const float *p = mlc_host_data(pred), *t = mlc_host_data(y);
            for (int i = 0; i < x->shape[0]; i++) correct += p[i] == t[i];
            loss_sum += (double)mlc_item(loss) * x->shape[0];
            seen += x->shape[0];
            double now = seconds();
            if (tty && (now - shown > 0.2 || seen == n_train)) {       /* the progress bar */
                double rate = seen / (now - epoch_start);
                double left = (n_train - seen + (double)(o.epochs - epoch) * n_train) / rate;
                int filled = (int)(30.0 * seen / n_train);
                printf("\repoch %2d/%d [%.*s%*s] loss %.4f  acc %5.1f%%  %6.0f samples/s  ETA %3.0f s ",
                       epoch, o.epochs, filled, "##############################", 30 - filled, "",
                       loss_sum / seen, 100.0 * correct / seen, rate, left);
                fflush(stdout);
                shown = now;
            }
            mlc_frame_end(f);
        }
        if (mlc_error(ctx)) break;
        double train_time = seconds() - epoch_start, test_loss, test_acc;
        evaluate(ctx, model, x_test, y_test, o.amp_dtype, &test_loss, &test_acc);
        if (mlc_error(ctx)) break;
        if (tty) printf("\r%*s\r", 110, "");                     /* clear the bar's line */
        printf("epoch %2d/%d  train loss %.4f acc %5.2f%%  test loss %.4f acc %5.2f%%  %.1f s "
               "(%.0f samples/s)\n",
               epoch, o.epochs, loss_sum / seen, 100.0 * correct / seen, test_loss, 100.0 * test_acc,
               train_time, seen / train_time);
        fflush(stdout);
        if (csv) {
            fprintf(csv, "%d,%.5f,%.5f,%.5f,%.5f,%.2f\n", epoch, loss_sum / seen, (double)correct / seen,
                    test_loss, test_acc, train_time);
            fflush(csv);
        }
        if (!checkpoint(&o, 0, epoch, model, opt)) break;
    }
    if (csv) fclose(csv);
    if (o.int8 && !mlc_error(ctx)) quantize_and_test(ctx, &o, model, x_train, x_test, y_test);
    if (mlc_error(ctx)) {
        fprintf(stderr, "error: %s\n", mlc_error_message(ctx));
        mlc_destroy(ctx);
        return 1;
    }
    printf("done in %.1f s\n", seconds() - start);
    mlc_destroy(ctx);
    return 0;
}
