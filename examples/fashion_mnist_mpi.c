/* Fashion-MNIST on several processes: examples/fashion_mnist.c's models trained data-parallel
   with mlc_mpi.h (PyTorch's DistributedDataParallel). Every rank holds the model; each step, each
   of the W ranks takes batch / W of the global batch (mlc_dist_sampler: one shuffle per epoch,
   the same on every rank), and the gradients are averaged over the ranks while backward runs.
   Build and run (make test-mpi builds it as build/fashion_mnist_mpi):
       mpicc -O2 -I. -o fashion_mnist_mpi examples/fashion_mnist_mpi.c -lm
       mpirun -np 4 ./fashion_mnist_mpi --model cnn
   Usage: fashion_mnist_mpi [--data DIR] [--model mlp|cnn] [--epochs N] [--batch N] [--lr X]
            [--seed N] [--threads N] [--device NAME|rank] [--limit N] [--bucket-mb X]
            [--save FILE] [--resume FILE] [--overlap]
   --batch is the global batch (each rank takes batch / ranks). --threads: mlc's threads per
   rank (1). --device rank: each rank its own GPU by local rank (mlc_mpi_device). --limit: the
   first N training images only. --save writes a checkpoint (rank 0) after every epoch; --resume
   continues from one, on any number of ranks. --overlap measures, after training, backward with
   its all-reduces against backward alone plus the all-reduces alone (bench/mpi.sh).
   Rank 0 prints; the epoch line's "MPI wait" is the share of the step spent waiting for the
   all-reduces after backward. */
#define _POSIX_C_SOURCE 199309L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define MLC_IMPLEMENTATION
#include "mlc.h"
#include "mlc_mpi.h"
#include "fashion_models.h"
#include "parse_arg.h"

typedef struct options {
    const char *data, *model, *device, *save, *resume;
    int epochs, batch, threads, limit, overlap;
    float lr, bucket_mb;
    unsigned long long seed;
} options;

#define DEFAULT_DATA "/usr/share/datasets/fashion-mnist"

static void usage(FILE *out, const char *program) {
    fprintf(out, "usage: mpirun -np N %s [options]\n"
                 "Trains a Fashion-MNIST classifier data-parallel on N processes.\n"
                 "  --data DIR          the four .gz files (" DEFAULT_DATA ")\n"
                 "  --model mlp|cnn     the model (mlp)\n"
                 "  --epochs N          epochs, resumed ones included (10 for mlp, 5 for cnn)\n"
                 "  --batch N           global batch, a multiple of N ranks (128 for mlp, 64 for cnn)\n"
                 "  --lr X              Adam's peak learning rate, cosine schedule (0.002)\n"
                 "  --seed N            random seed (1)\n"
                 "  --threads N         mlc's threads per rank (1)\n"
                 "  --device NAME|rank  cpu, opencl, ...; rank: a GPU per rank by local rank (cpu)\n"
                 "  --limit N           train on the first N images only (all)\n"
                 "  --bucket-mb X       gradient bucket size in MiB (25)\n"
                 "  --save FILE         write a checkpoint after every epoch (rank 0)\n"
                 "  --resume FILE       continue from a checkpoint (any number of ranks)\n"
                 "  --overlap           after training, time backward and all-reduce apart and together\n"
                 "  -h, --help          this text\n", program);
}

enum { RUN, HELP, BAD };
static int parse_options(int argc, char **argv, options *o) {
    *o = (options){ .data = DEFAULT_DATA, .model = "mlp", .threads = 1, .seed = 1 };
    for (int i = 1; i < argc; i++) {
        const char *flag = argv[i], *value = i + 1 < argc ? argv[i + 1] : NULL;
        int ok = 1;
        if (!strcmp(flag, "--help") || !strcmp(flag, "-h")) return HELP;
        if (!strcmp(flag, "--overlap")) { o->overlap = 1; continue; }
        if (!value) { fprintf(stderr, "%s needs a value (or is unknown)\n", flag); return BAD; }
        if (!strcmp(flag, "--data")) o->data = value;
        else if (!strcmp(flag, "--model")) o->model = value;
        else if (!strcmp(flag, "--device")) o->device = value;
        else if (!strcmp(flag, "--save")) o->save = value;
        else if (!strcmp(flag, "--resume")) o->resume = value;
        else if (!strcmp(flag, "--epochs")) ok = parse_int_arg(flag, value, 1, 100000, &o->epochs);
        else if (!strcmp(flag, "--batch")) ok = parse_int_arg(flag, value, 1, 1 << 20, &o->batch);
        else if (!strcmp(flag, "--threads")) ok = parse_int_arg(flag, value, 1, 1024, &o->threads);
        else if (!strcmp(flag, "--limit")) ok = parse_int_arg(flag, value, 1, 1 << 30, &o->limit);
        else if (!strcmp(flag, "--lr")) ok = parse_float_arg(flag, value, 0, 1e6, &o->lr);
        else if (!strcmp(flag, "--bucket-mb")) ok = parse_float_arg(flag, value, 0, 1e6, &o->bucket_mb);
        else if (!strcmp(flag, "--seed")) ok = parse_u64_arg(flag, value, &o->seed);
        else { fprintf(stderr, "unknown option %s\n", flag); return BAD; }
        if (!ok) return BAD;
        i++;
    }
    int cnn = !strcmp(o->model, "cnn");
    if (!cnn && strcmp(o->model, "mlp")) { fprintf(stderr, "--model is mlp or cnn\n"); return BAD; }
    if (!o->epochs) o->epochs = cnn ? 5 : 10;
    if (!o->batch) o->batch = cnn ? 64 : 128;
    if (o->lr <= 0.0f) o->lr = 2e-3f;
    return RUN;
}

/* Test loss and accuracy: each rank its share of the test set (rows rank, rank + W, ...), in
   eval mode, summed over the ranks. */
static void evaluate(const mlc_mpi *mpi, mlc_ctx *ctx, mlc_module *model, mlc_tensor *x, mlc_tensor *y,
                     double *loss, double *acc) {
    mlc_dist_sampler_opts cut = { .drop_last = 1 };         /* at most ranks - 1 images left out */
    mlc_dist_sampler *s = mlc_dist_sampler_create(mpi, x->shape[0], cut);
    double sums[3] = { 0, 0, 0 };          /* loss, correct, seen */
    int was = mlc_set_grad_enabled(ctx, 0);
    mlc_module_train(model, 0);
    for (int step = 0; s; step++) {
        mlc_frame f = mlc_frame_begin(ctx);
        mlc_tensor *bx, *by;
        if (!mlc_dist_sampler_batch(s, x, y, step, 500, &bx, &by)) { mlc_frame_end(f); break; }
        mlc_tensor *logits = mlc_forward(model, bx);
        mlc_tensor *pred = mlc_argmax(logits, 1);
        mlc_tensor *l = mlc_cross_entropy(logits, by, MLC_REDUCE_SUM, MLC_NO_IGNORE);
        if (!pred || !l) { mlc_frame_end(f); break; }
        const float *p = mlc_host_data(pred), *t = mlc_host_data(by);
        for (int i = 0; i < bx->shape[0]; i++) sums[1] += p[i] == t[i];
        sums[0] += mlc_item(l);
        sums[2] += bx->shape[0];
        mlc_frame_end(f);
    }
    mlc_mpi_check(mpi, ctx, "evaluating");
    mlc_module_train(model, 1);
    mlc_set_grad_enabled(ctx, was);
    mlc_dist_sampler_free(s);
    mlc_mpi_allreduce_sum(mpi, sums, 3);
    *loss = sums[2] ? sums[0] / sums[2] : 0;
    *acc = sums[2] ? sums[1] / sums[2] : 0;
}

static mlc_tensor *load(mlc_ctx *ctx, const char *dir, const char *file, int flags) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    return mlc_idx_load(ctx, path, flags);
}

/* One training step on this rank's rows: the loss (for printing), correct predictions into *correct */
static float train_step(mlc_ddp *ddp, mlc_optim *opt, mlc_tensor *bx, mlc_tensor *by, int *correct) {
    mlc_tensor *logits = mlc_ddp_forward(ddp, bx);
    mlc_tensor *loss = mlc_cross_entropy(logits, by, MLC_REDUCE_MEAN, MLC_NO_IGNORE);
    mlc_zero_grad(opt);
    mlc_ddp_backward(ddp, loss);
    mlc_step(opt);
    mlc_tensor *pred = mlc_argmax(logits, 1);
    if (pred && correct) {
        const float *p = mlc_host_data(pred), *t = mlc_host_data(by);
        for (int i = 0; i < bx->shape[0]; i++) *correct += p[i] == t[i];
    }
    return mlc_item(loss);
}

/* --overlap: over 15 steps each, backward with no all-reduce (no_sync), the all-reduces alone,
   and backward with them; the ratio of the last to the sum of the first two, from the medians
   and from the fastest of each (where other programs share the cores, the medians include
   waits for a rank the scheduler set aside; the fastest are the runs without them) */
static void measure_overlap(const mlc_mpi *mpi, mlc_ctx *ctx, mlc_ddp *ddp, mlc_optim *opt, mlc_tensor *x,
                            mlc_tensor *y, mlc_dist_sampler *s, int local_batch) {
    enum { K = 15 };
    double t[3][K];
    for (int k = 0; k < 3 * K; k++) {
        int kind = k % 3;
        mlc_frame f = mlc_frame_begin(ctx);
        mlc_tensor *bx, *by;
        mlc_dist_sampler_batch(s, x, y, k / 3, local_batch, &bx, &by);
        mlc_tensor *loss = mlc_cross_entropy(mlc_ddp_forward(ddp, bx), by, MLC_REDUCE_MEAN, MLC_NO_IGNORE);
        mlc_zero_grad(opt);
        mlc_mpi_barrier(mpi);
        double start = MPI_Wtime();
        if (kind == 1) t[1][k / 3] = mlc_ddp_time_allreduce(ddp);
        else {
            mlc_ddp_no_sync(ddp, kind == 0);
            mlc_ddp_backward(ddp, loss);
            t[kind][k / 3] = MPI_Wtime() - start;
        }
        mlc_ddp_no_sync(ddp, 0);
        mlc_frame_end(f);
    }
    double med[3], least[3];
    for (int j = 0; j < 3; j++) {                 /* sorted (insertion sort of K), the ranks' mean */
        for (int a = 1; a < K; a++)
            for (int b = a; b > 0 && t[j][b] < t[j][b - 1]; b--) {
                double v = t[j][b]; t[j][b] = t[j][b - 1]; t[j][b - 1] = v;
            }
        med[j] = mlc_mpi_mean(mpi, t[j][K / 2]);
        least[j] = mlc_mpi_mean(mpi, t[j][0]);
    }
    if (mpi->rank == 0) {
        printf("overlap: backward + all-reduce %.2f ms / (backward alone %.2f ms + all-reduce alone %.2f ms) "
               "= %.2f (medians)\n", 1e3 * med[2], 1e3 * med[0], 1e3 * med[1], med[2] / (med[0] + med[1]));
        printf("overlap: backward + all-reduce %.2f ms / (backward alone %.2f ms + all-reduce alone %.2f ms) "
               "= %.2f (fastest)\n", 1e3 * least[2], 1e3 * least[0], 1e3 * least[1],
               least[2] / (least[0] + least[1]));
    }
}

int main(int argc, char **argv) {
    mlc_mpi mpi;
    options o;
    if (mlc_mpi_init(&argc, &argv, &mpi) != MLC_OK) return 1;
    int parsed = parse_options(argc, argv, &o);
    if (parsed == RUN && o.batch % mpi.size) {
        fprintf(stderr, "--batch %d is not a multiple of the %d ranks\n", o.batch, mpi.size);
        parsed = BAD;
    }
    if (parsed != RUN) {                              /* --help: exit 0; a bad command line: 2 */
        if (mpi.rank == 0) usage(parsed == HELP ? stdout : stderr, argv[0]);
        mlc_mpi_finalize(&mpi);
        return parsed == HELP ? 0 : 2;
    }
    char device[64];
    if (o.device && !strcmp(o.device, "rank")) o.device = mlc_mpi_device(&mpi, device, sizeof device);
    mlc_ctx *ctx = mlc_create(&(mlc_config){ .seed = o.seed, .device = o.device ? o.device : "cpu",
                                              .threads = o.threads });
    mlc_mpi_check(&mpi, ctx, "mlc_create");
    mlc_tensor *x_train = load(ctx, o.data, "train-images-idx3-ubyte.gz", MLC_IDX_SCALE_U8);
    mlc_tensor *y_train = load(ctx, o.data, "train-labels-idx1-ubyte.gz", 0);
    mlc_tensor *x_test = load(ctx, o.data, "t10k-images-idx3-ubyte.gz", MLC_IDX_SCALE_U8);
    mlc_tensor *y_test = load(ctx, o.data, "t10k-labels-idx1-ubyte.gz", 0);
    mlc_mpi_check(&mpi, ctx, "loading the data (install Debian's dataset-fashion-mnist, or give --data DIR)");
    int cnn = !strcmp(o.model, "cnn"), n_train = x_train->shape[0];
    if (o.limit && o.limit < n_train) n_train = o.limit;
    mlc_module *model = cnn ? make_cnn(ctx) : make_mlp(ctx);
    mlc_optim *opt = mlc_adam(ctx, model, (mlc_adam_opts){ .lr = o.lr });
    mlc_ddp *ddp = mlc_ddp_wrap(&mpi, model, (mlc_ddp_opts){ .bucket_cap_mb = o.bucket_mb });
    mlc_dist_sampler_opts shuffled = { .shuffle = 1, .seed = o.seed };
    mlc_dist_sampler *sampler = mlc_dist_sampler_create(&mpi, n_train, shuffled);
    mlc_mpi_check(&mpi, ctx, "building the model");
    if (!sampler) mlc_mpi_fail(&mpi, "out of memory for the sampler");
    int local = o.batch / mpi.size, steps = mlc_dist_sampler_steps(sampler, local, 0);
    if (mpi.rank == 0)
        printf("Fashion-MNIST on %d rank%s x %d thread%s (%s): %d training images; %s, %zu parameters in %d "
               "bucket%s; global batch %d (%d a rank), Adam lr %g, %d epochs\n",
               mpi.size, mpi.size > 1 ? "s" : "", o.threads, o.threads > 1 ? "s" : "", mlc_device_name(ctx),
               n_train, o.model, mlc_module_param_count(model), mlc_ddp_get_stats(ddp).n_buckets,
               mlc_ddp_get_stats(ddp).n_buckets > 1 ? "s" : "", o.batch, local, (double)o.lr, o.epochs);
    int first_epoch = 1;
    if (o.resume) {
        mlc_train_state st = { 0, 0 };
        if (mlc_ddp_checkpoint_load(ddp, o.resume, opt, &st) != MLC_OK) mlc_mpi_check(&mpi, ctx, o.resume);
        first_epoch = (int)st.epoch + 1;
        if (mpi.rank == 0) printf("resumed from %s after epoch %lld\n", o.resume, st.epoch);
    }
    double start = MPI_Wtime();
    for (int epoch = first_epoch; epoch <= o.epochs; epoch++) {
        double epoch_start = MPI_Wtime(), sums[3] = { 0, 0, 0 };   /* loss, correct, seen */
        mlc_ddp_stats before = mlc_ddp_get_stats(ddp);
        mlc_dist_sampler_set_epoch(sampler, epoch);
        for (int step = 0; step < steps; step++) {
            mlc_frame f = mlc_frame_begin(ctx);
            mlc_tensor *bx, *by;
            int correct = 0;
            mlc_dist_sampler_batch(sampler, x_train, y_train, step, local, &bx, &by);
            mlc_optim_set_lr(opt, mlc_lr_cosine(o.lr, (epoch - 1) * steps + step, 0, o.epochs * steps, 0.0f));
            float loss = train_step(ddp, opt, bx, by, &correct);
            mlc_mpi_check(&mpi, ctx, "training");
            sums[0] += (double)loss * bx->shape[0];
            sums[1] += correct;
            sums[2] += bx->shape[0];
            mlc_frame_end(f);
        }
        double train_time = MPI_Wtime() - epoch_start, test_loss, test_acc;
        mlc_ddp_stats after = mlc_ddp_get_stats(ddp);
        double wait = mlc_mpi_mean(&mpi, (after.wait_s - before.wait_s) / train_time);
        train_time = mlc_mpi_mean(&mpi, train_time);
        mlc_mpi_allreduce_sum(&mpi, sums, 3);
        evaluate(&mpi, ctx, model, x_test, y_test, &test_loss, &test_acc);
        if (mpi.rank == 0) {
            printf("epoch %2d/%d  train loss %.4f acc %5.2f%%  test loss %.4f acc %5.2f%%  %.2f s "
                   "(%.0f samples/s, MPI wait %.1f%%)\n", epoch, o.epochs, sums[0] / sums[2],
                   100.0 * sums[1] / sums[2], test_loss, 100.0 * test_acc, train_time, sums[2] / train_time,
                   100.0 * wait);
            fflush(stdout);
        }
        if (o.save) {
            mlc_train_state st = { 0, epoch };
            if (mlc_ddp_checkpoint_save(ddp, o.save, opt, &st) != MLC_OK) mlc_mpi_check(&mpi, ctx, o.save);
            if (mpi.rank == 0) printf("epoch %d saved to %s\n", epoch, o.save);
        }
    }
    if (o.overlap) measure_overlap(&mpi, ctx, ddp, opt, x_train, y_train, sampler, local);
    if (mpi.rank == 0) printf("done in %.1f s\n", MPI_Wtime() - start);
    mlc_dist_sampler_free(sampler);
    mlc_ddp_free(ddp);
    mlc_destroy(ctx);
    mlc_mpi_finalize(&mpi);
    return 0;
}
