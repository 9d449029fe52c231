/* The MPI suite (make test-mpi, through tests/mpi/run.sh): mlc_mpi.h on however many ranks
   mpirun starts. Every test is collective: each rank runs it, a test fails when it fails on any
   rank, and rank 0 prints "ok name" or "FAIL name" and, last, "N passed, M failed".
   MLC_DEVICE=opencl runs it on the first OpenCL device (gradients through host buffers):
     MLC_DEVICE=opencl mpirun -x MLC_DEVICE -np 2 build/test-mpi   (built with -DMLC_OPENCL -ldl)
   Modes for run.sh's other checks (one each):
     --resume write CKPT LOSSES   train 2 epochs, checkpoint mid-epoch 0, write every loss
     --resume read CKPT LOSSES    resume from CKPT, compare the losses with the unbroken run's
     --exit-at S | --error-at S | --hang-at S | --kill-at S
                                  rank 1 (exit, kill) or the last rank (error, hang) fails at
                                  step S of a training loop; the job must end, naming it
     --mismatch                   the last rank builds another model: wrap must say where */
#define _POSIX_C_SOURCE 199309L
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#define MLC_IMPLEMENTATION
#include "mlc.h"
#include "mlc_mpi.h"

static mlc_mpi mpi;
static char failure[1024];

#define CHECK(cond) do { if (!(cond)) { \
    snprintf(failure, sizeof failure, "%s:%d: CHECK(%s)", __FILE__, __LINE__, #cond); return 0; } } while (0)
#define CHECK_MSG(cond, ...) do { if (!(cond)) { \
    int at_ = snprintf(failure, sizeof failure, "%s:%d: ", __FILE__, __LINE__); \
    snprintf(failure + at_, sizeof failure - (size_t)at_, __VA_ARGS__); return 0; } } while (0)

static mlc_ctx *new_ctx(unsigned long long seed) {
    return mlc_create(&(mlc_config){ .seed = seed, .quiet = 1, .threads = 1 });
}

/* ---- Models and data ------------------------------------------------------------------------ */

static mlc_module *make_mlp(mlc_ctx *ctx) {
    mlc_module *a = mlc_nn_linear(ctx, 8, 16);
    mlc_module *b = mlc_nn_tanh(ctx);
    mlc_module *c = mlc_nn_linear(ctx, 16, 4);
    return mlc_nn_sequential(ctx, a, b, c, NULL);
}
static mlc_tensor *to_image(mlc_module *m, mlc_tensor *x) {
    (void)m;
    return mlc_reshape(x, MLC_SHAPE(-1, 1, 6, 6));
}
/* batch_norm 1: a BatchNorm2d after the convolution (per-rank statistics) */
static mlc_module *make_cnn(mlc_ctx *ctx, int batch_norm) {
    mlc_module *image = mlc_nn_custom(ctx, "Reshape", to_image, NULL);
    mlc_module *conv = mlc_nn_conv2d(ctx, 1, 4, 3, (mlc_conv_opts){ .padding = 1 });
    mlc_module *bn = batch_norm ? mlc_nn_batch_norm(ctx, 4) : mlc_nn_relu(ctx);
    mlc_module *relu = mlc_nn_relu(ctx);
    mlc_module *pool = mlc_nn_max_pool2d(ctx, 2, 2);
    mlc_module *flat = mlc_nn_flatten(ctx);
    mlc_module *fc = mlc_nn_linear(ctx, 4 * 3 * 3, 4);
    return mlc_nn_sequential(ctx, image, conv, bn, relu, pool, flat, fc, NULL);
}

/* The CNN with SyncBatchNorm in mind: a convolution without bias before the norm (a bias there
   has no effect and a gradient of rounding noise, which Adam blows up to a step of lr) */
static mlc_tensor *conv_nobias_forward(mlc_module *m, mlc_tensor *x) {
    return mlc_conv2d(x, m->params[0], NULL, (mlc_conv_opts){ .padding = 1 });
}
static mlc_module *cnn_bn_nobias(mlc_ctx *ctx) {
    mlc_module *image = mlc_nn_custom(ctx, "Reshape", to_image, NULL);
    mlc_module *conv = mlc_nn_custom(ctx, "Conv2d", conv_nobias_forward, NULL);
    mlc_tensor *w = mlc_parameter(ctx, 4, (int[]){ 4, 1, 3, 3 });
    mlc_init_kaiming_uniform(w, 2.2360679775f);
    mlc_module_add_param(conv, "weight", w);
    mlc_module *bn = mlc_nn_batch_norm(ctx, 4);
    mlc_module *relu = mlc_nn_relu(ctx);
    mlc_module *pool = mlc_nn_max_pool2d(ctx, 2, 2);
    mlc_module *flat = mlc_nn_flatten(ctx);
    mlc_module *fc = mlc_nn_linear(ctx, 4 * 3 * 3, 4);
    return mlc_nn_sequential(ctx, image, conv, bn, relu, pool, flat, fc, NULL);
}

/* A model of several buckets whose "extra" parameter is used only where use_extra says so */
typedef struct gate { int use_extra; } gate;
static mlc_tensor *gated_forward(mlc_module *m, mlc_tensor *x) {
    gate *g = (gate *)m->user;
    mlc_tensor *h = mlc_tanh(mlc_forward(m->children[0], x));
    h = mlc_tanh(mlc_forward(m->children[1], h));
    if (g->use_extra) h = mlc_add(h, mlc_forward(m->children[2], h));
    return mlc_forward(m->children[3], h);
}
static mlc_module *make_gated(mlc_ctx *ctx, gate *g) {
    mlc_module *m = mlc_nn_custom(ctx, "Gated", gated_forward, g);
    mlc_module_add_child(m, "in", mlc_nn_linear(ctx, 8, 64));
    mlc_module_add_child(m, "mid", mlc_nn_linear(ctx, 64, 64));
    mlc_module_add_child(m, "extra", mlc_nn_linear(ctx, 64, 64));
    mlc_module_add_child(m, "out", mlc_nn_linear(ctx, 64, 4));
    return m;
}

/* Data every rank makes alike: x [n, features] normal, y [n] classes 0..3 */
static void make_data(int n, int features, float *x, float *y) {
    uint64_t st = 12345;
    int i;
    for (i = 0; i < n * features; i++) {
        st = st * 6364136223846793005ULL + 1442695040888963407ULL;
        x[i] = (float)((double)(st >> 11) / 9007199254740992.0) * 2.0f - 1.0f;
    }
    for (i = 0; i < n; i++) y[i] = (float)(i * 7 % 4);
}

static int values_of(mlc_module *m, float *out, int buffers_too) {   /* in order; the count */
    mlc_named_tensor p[64];
    int n = buffers_too ? mlc_module_state(m, p, 64) : mlc_module_parameters(m, p, 64), i, at = 0;
    for (i = 0; i < n; i++) {
        if (out && mlc_read(p[i].tensor, out + at, p[i].tensor->size) != MLC_OK) return -1;
        at += (int)p[i].tensor->size;
    }
    return at;
}
static int params_of(mlc_module *m, float *out) { return values_of(m, out, 0); }
static int state_of(mlc_module *m, float *out) { return values_of(m, out, 1); }

/* Every rank's parameters bitwise rank 0's */
static int same_on_every_rank(mlc_module *m) {
    int n = params_of(m, NULL), same, all;
    float *mine = (float *)malloc(sizeof(float) * (size_t)n);
    float *root = (float *)malloc(sizeof(float) * (size_t)n);
    params_of(m, mine);
    memcpy(root, mine, sizeof(float) * (size_t)n);
    MPI_Bcast(root, n, MPI_FLOAT, 0, mpi.comm);
    same = memcmp(root, mine, sizeof(float) * (size_t)n) == 0;
    MPI_Allreduce(&same, &all, 1, MPI_INT, MPI_MIN, mpi.comm);
    free(mine);
    free(root);
    return all;
}

/* How close to one process: 1e-5 relative on the CPU; on a device (MLC_DEVICE=opencl) 5e-5,
   its kernels sum in other orders than the CPU's (PoCL: 1.02e-5 after 5 SGD steps of the CNN) */
static double tolerance(mlc_ctx *ctx) { return mlc_has_device(ctx) ? 5e-5 : 1e-5; }

/* Worst |a - b| / (|b| + 1e-3) over n values */
static double worst_relative(const float *a, const float *b, int n) {
    double worst = 0;
    int i;
    for (i = 0; i < n; i++) {
        double e = fabs((double)a[i] - (double)b[i]) / (fabs((double)b[i]) + 1e-3);
        if (e > worst || e != e) worst = e;
    }
    return worst;
}

/* One data-parallel step on this rank's rows bx, by: cross entropy, averaged gradients, step */
static void ddp_step(mlc_ddp *ddp, mlc_optim *opt, mlc_tensor *bx, mlc_tensor *by) {
    mlc_zero_grad(opt);
    mlc_ddp_backward(ddp, mlc_cross_entropy(mlc_ddp_forward(ddp, bx), by, MLC_REDUCE_MEAN, MLC_NO_IGNORE));
    mlc_step(opt);
}

/* ---- Equivalence: W ranks, batch G / W each, against one process on batch G ---------------- */

enum { SGD, ADAM };
typedef mlc_module *(*maker)(mlc_ctx *ctx);
static mlc_module *cnn_plain(mlc_ctx *ctx) { return make_cnn(ctx, 0); }
static mlc_module *cnn_bn(mlc_ctx *ctx) { return make_cnn(ctx, 1); }

static mlc_optim *make_optim(mlc_ctx *ctx, mlc_module *m, int kind) {
    return kind == SGD ? mlc_sgd(ctx, m, (mlc_sgd_opts){ .lr = 0.1f, .momentum = 0.9f })
                       : mlc_adam(ctx, m, (mlc_adam_opts){ .lr = 1e-2f });
}

#define G 12                            /* global batch: 1, 2, 3 and 4 ranks share it evenly */
#define STEPS 5

/* sync_bn: the model's BatchNorm made SyncBatchNorm (the reference keeps BatchNorm on batch G);
   then the running statistics must match too, within 3e-5: SyncBatchNorm takes its statistics
   from float32 sums per rank and the reference from its own sums, so the two round differently
   (only changing the order of the reference's double sums moved the worst difference over 5
   steps from 7.2e-6 to 1.07e-5); per-rank statistics (SyncBatchNorm left off) differ by 1.6. */
static int equivalence_of(maker make, int features, int kind, int sync_bn) {
    float x[G * STEPS * 36], y[G * STEPS];
    int b = G / mpi.size, s, n;
    mlc_ctx *ref = new_ctx(7), *ctx = new_ctx(mpi.rank == 0 ? 7 : 1000 + (unsigned)mpi.rank);
    mlc_module *rm = make(ref), *m = make(ctx);
    mlc_optim *ropt = make_optim(ref, rm, kind), *opt = make_optim(ctx, m, kind);
    mlc_ddp *ddp = mlc_ddp_wrap(&mpi, m, (mlc_ddp_opts){ 0 });
    float want[4096], got[4096];
    CHECK(ddp && rm && ropt && opt);
    if (sync_bn) CHECK(mlc_ddp_sync_batch_norm(ddp) == 1 && !strcmp(m->children[2]->type, "SyncBatchNorm"));
    make_data(G * STEPS, features, x, y);
    for (s = 0; s < STEPS; s++) {
        mlc_frame f = mlc_frame_begin(ref), g;
        mlc_tensor *bx = mlc_from_data(ref, 2, (int[]){ G, features }, x + s * G * features);
        mlc_tensor *by = mlc_from_data(ref, 1, (int[]){ G }, y + s * G);
        mlc_zero_grad(ropt);
        CHECK(mlc_backward(mlc_cross_entropy(mlc_forward(rm, bx), by, MLC_REDUCE_MEAN, MLC_NO_IGNORE)) == 0);
        mlc_step(ropt);
        mlc_frame_end(f);
        g = mlc_frame_begin(ctx);
        bx = mlc_from_data(ctx, 2, (int[]){ b, features }, x + (s * G + mpi.rank * b) * features);
        by = mlc_from_data(ctx, 1, (int[]){ b }, y + s * G + mpi.rank * b);
        ddp_step(ddp, opt, bx, by);
        mlc_frame_end(g);
        CHECK_MSG(same_on_every_rank(m), "step %d: the ranks' parameters differ", s);
    }
    n = sync_bn ? state_of(rm, want) : params_of(rm, want);
    CHECK(n > 0 && n <= 4096 && (sync_bn ? state_of(m, got) : params_of(m, got)) == n);
    CHECK_MSG(worst_relative(got, want, n) <= (sync_bn ? 3 : 1) * tolerance(ctx),
              "%d ranks: worst relative difference %g from one process",
              mpi.size, worst_relative(got, want, n));
    mlc_ddp_free(ddp);
    if (sync_bn) CHECK(!strcmp(m->children[2]->type, "BatchNorm"));   /* put back by mlc_ddp_free */
    mlc_destroy(ctx);
    mlc_destroy(ref);
    return 1;
}
static int equivalence(maker make, int features, int kind) { return equivalence_of(make, features, kind, 0); }
static int equivalence_sgd_mlp(void) { return equivalence(make_mlp, 8, SGD); }
static int equivalence_adam_mlp(void) { return equivalence(make_mlp, 8, ADAM); }
static int equivalence_sgd_cnn(void) { return equivalence(cnn_plain, 36, SGD); }
static int equivalence_adam_cnn(void) { return equivalence(cnn_plain, 36, ADAM); }
static int equivalence_sgd_cnn_sync_batch_norm(void) { return equivalence_of(cnn_bn_nobias, 36, SGD, 1); }
static int equivalence_adam_cnn_sync_batch_norm(void) { return equivalence_of(cnn_bn_nobias, 36, ADAM, 1); }

/* BatchNorm: per-rank batch statistics; the running statistics are rank 0's at each forward's
   start (broadcast_buffers), and the parameters stay bitwise equal. On one rank: one process. */
static int batch_norm_buffers_follow_rank_0(void) {
    float x[G * STEPS * 36], y[G * STEPS], mine[8], root[8];
    int b = G / mpi.size, s, same;
    mlc_ctx *ctx = new_ctx(7);
    mlc_module *m = cnn_bn(ctx);
    mlc_optim *opt = make_optim(ctx, m, ADAM);
    mlc_ddp *ddp = mlc_ddp_wrap(&mpi, m, (mlc_ddp_opts){ 0 });
    mlc_module *bn = m->children[2];
    CHECK(ddp && bn && !strcmp(bn->type, "BatchNorm"));
    make_data(G * STEPS, 36, x, y);
    for (s = 0; s < STEPS; s++) {
        mlc_frame f = mlc_frame_begin(ctx);
        mlc_tensor *bx = mlc_from_data(ctx, 2, (int[]){ b, 36 }, x + (s * G + mpi.rank * b) * 36);
        mlc_tensor *by = mlc_from_data(ctx, 1, (int[]){ b }, y + s * G + mpi.rank * b);
        mlc_tensor *out;
        /* what rank 0 holds before the forward is what every rank uses */
        CHECK(mlc_read(bn->buffers[0], root, 4) == MLC_OK);
        MPI_Bcast(root, 4, MPI_FLOAT, 0, mpi.comm);
        out = mlc_ddp_forward(ddp, bx);
        mlc_zero_grad(opt);
        mlc_ddp_backward(ddp, mlc_cross_entropy(out, by, MLC_REDUCE_MEAN, MLC_NO_IGNORE));
        mlc_step(opt);
        mlc_frame_end(f);
        CHECK(same_on_every_rank(m));
        CHECK(mlc_read(bn->buffers[0], mine, 4) == MLC_OK);
        (void)root;
    }
    /* after a forward each rank's running mean moved by its own batch: they differ (W > 1) */
    memcpy(root, mine, sizeof mine);
    MPI_Bcast(root, 4, MPI_FLOAT, 0, mpi.comm);
    same = memcmp(root, mine, 4 * sizeof(float)) == 0;
    if (mpi.size > 1 && mpi.rank > 0)
        CHECK_MSG(!same, "rank %d's running mean is rank 0's: per-rank statistics expected", mpi.rank);
    mlc_ddp_free(ddp);
    mlc_destroy(ctx);
    return 1;
}

/* ---- Buckets, unused parameters, no_sync ---------------------------------------------------- */

/* A model of ~13k floats in buckets of 0.01 MiB (2621 floats): 8 buckets. Step 1: "extra" is
   unused on rank 0 only (ranks finish buckets in different orders); step 2: unused everywhere
   (its gradient stays zero: it does not move under SGD without momentum); step 3: used. The
   reference is one process summing each rank's share of the loss with that rank's gate. */
static int buckets_and_unused_parameter(void) {
    enum { B = 3, F = 8 };
    float x[B * 4 * 3 * F], y[B * 4 * 3], want[20000], got[20000], before[20000];
    gate rg = { 1 }, mg = { 1 };
    mlc_ctx *ref = new_ctx(3), *ctx = new_ctx(3);
    mlc_module *rm = make_gated(ref, &rg), *m = make_gated(ctx, &mg);
    mlc_optim *ropt = mlc_sgd(ref, rm, (mlc_sgd_opts){ .lr = 0.1f });
    mlc_optim *opt = mlc_sgd(ctx, m, (mlc_sgd_opts){ .lr = 0.1f });
    mlc_ddp *ddp = mlc_ddp_wrap(&mpi, m, (mlc_ddp_opts){ .bucket_cap_mb = 0.01f });
    mlc_ddp_stats st;
    int s, r, n;
    CHECK(ddp);
    st = mlc_ddp_get_stats(ddp);
    CHECK_MSG(st.n_buckets >= 4, "%d buckets", st.n_buckets);
    make_data(B * 4 * 3, F, x, y);
    for (s = 0; s < 3; s++) {
        mlc_frame f = mlc_frame_begin(ref);
        mlc_tensor *total = NULL;
        n = params_of(m, before);
        for (r = 0; r < mpi.size; r++) {
            int at = (s * mpi.size + r) * B;
            mlc_tensor *bx = mlc_from_data(ref, 2, (int[]){ B, F }, x + at * F);
            mlc_tensor *by = mlc_from_data(ref, 1, (int[]){ B }, y + at);
            mlc_tensor *l;
            rg.use_extra = s == 2 || (s == 0 && r > 0);
            l = mlc_mul_scalar(mlc_cross_entropy(mlc_forward(rm, bx), by, MLC_REDUCE_MEAN, MLC_NO_IGNORE),
                               1.0f / (float)mpi.size);
            total = total ? mlc_add(total, l) : l;
        }
        mlc_zero_grad(ropt);
        CHECK(mlc_backward(total) == MLC_OK);
        mlc_step(ropt);
        mlc_frame_end(f);
        f = mlc_frame_begin(ctx);
        {
            int at = (s * mpi.size + mpi.rank) * B;
            mlc_tensor *bx = mlc_from_data(ctx, 2, (int[]){ B, F }, x + at * F);
            mlc_tensor *by = mlc_from_data(ctx, 1, (int[]){ B }, y + at);
            mg.use_extra = s == 2 || (s == 0 && mpi.rank > 0);
            ddp_step(ddp, opt, bx, by);
        }
        mlc_frame_end(f);
        CHECK_MSG(same_on_every_rank(m), "step %d: the ranks' parameters differ", s);
        n = params_of(m, got);
        if (s == 1) {                                   /* unused everywhere: extra did not move */
            mlc_named_tensor p[16];
            int k, at = 0;
            int count = mlc_module_parameters(m, p, 16);
            for (k = 0; k < count; k++) {
                if (!strncmp(p[k].name, "extra.", 6))
                    CHECK_MSG(!memcmp(got + at, before + at, p[k].tensor->size * sizeof(float)),
                              "%.100s moved in a step that did not use it", p[k].name);
                at += (int)p[k].tensor->size;
            }
        }
    }
    CHECK(params_of(rm, want) == n && n <= 20000);
    CHECK_MSG(worst_relative(got, want, n) <= tolerance(ctx), "worst relative difference %g",
              worst_relative(got, want, n));
    st = mlc_ddp_get_stats(ddp);
    CHECK(st.steps == 3 && st.buckets == (mpi.size > 1 ? 3LL * st.n_buckets : 0));   /* 1 rank: none */
    mlc_ddp_free(ddp);
    mlc_destroy(ctx);
    mlc_destroy(ref);
    return 1;
}

/* Two micro-batches per step, the first under no_sync: the same as one process summing both */
static int no_sync_accumulates(void) {
    float x[G * 2 * 2 * 8], y[G * 2 * 2], want[4096], got[4096];
    int b = G / mpi.size, s, k, n;
    mlc_ctx *ref = new_ctx(5), *ctx = new_ctx(5);
    mlc_module *rm = make_mlp(ref), *m = make_mlp(ctx);
    mlc_optim *ropt = make_optim(ref, rm, SGD), *opt = make_optim(ctx, m, SGD);
    mlc_ddp *ddp = mlc_ddp_wrap(&mpi, m, (mlc_ddp_opts){ 0 });
    CHECK(ddp);
    make_data(G * 2 * 2, 8, x, y);
    for (s = 0; s < 2; s++) {
        mlc_zero_grad(ropt);
        mlc_zero_grad(opt);
        for (k = 0; k < 2; k++) {
            int at = (s * 2 + k) * G;
            mlc_frame f = mlc_frame_begin(ref);
            mlc_tensor *bx = mlc_from_data(ref, 2, (int[]){ G, 8 }, x + at * 8);
            mlc_tensor *by = mlc_from_data(ref, 1, (int[]){ G }, y + at);
            mlc_tensor *l = mlc_cross_entropy(mlc_forward(rm, bx), by, MLC_REDUCE_MEAN, MLC_NO_IGNORE);
            CHECK(mlc_backward(l) == 0);
            mlc_frame_end(f);
            f = mlc_frame_begin(ctx);
            bx = mlc_from_data(ctx, 2, (int[]){ b, 8 }, x + (at + mpi.rank * b) * 8);
            by = mlc_from_data(ctx, 1, (int[]){ b }, y + at + mpi.rank * b);
            mlc_ddp_no_sync(ddp, k == 0);
            mlc_ddp_backward(ddp, mlc_cross_entropy(mlc_ddp_forward(ddp, bx), by, MLC_REDUCE_MEAN,
                                                    MLC_NO_IGNORE));
            mlc_frame_end(f);
        }
        mlc_step(ropt);
        mlc_step(opt);
        CHECK(same_on_every_rank(m));
    }
    n = params_of(rm, want);
    CHECK(params_of(m, got) == n);
    CHECK_MSG(worst_relative(got, want, n) <= tolerance(ctx), "worst relative difference %g",
              worst_relative(got, want, n));
    CHECK(mlc_ddp_get_stats(ddp).steps == 2);
    mlc_ddp_free(ddp);
    mlc_destroy(ctx);
    mlc_destroy(ref);
    return 1;
}

/* ---- Sampler and metrics -------------------------------------------------------------------- */

/* DistributedSampler: the ranks' slices interleave one permutation of 0..n-1, the same on every
   rank for (seed, epoch); padded with the start, or cut (drop_last); another epoch, another order */
static int sampler_slices_one_shuffle(void) {
    int n = 10, w = mpi.size, r, i, seen[16], total;
    for (int drop = 0; drop < 2; drop++) {
        mlc_dist_sampler_opts o = { .shuffle = 1, .seed = 42, .drop_last = drop };
        mlc_dist_sampler *mine = mlc_dist_sampler_create(&mpi, n, o);
        int count = mlc_dist_sampler_count(mine), *all = (int *)malloc(sizeof(int) * (size_t)(count * w));
        int perm0[16];
        CHECK(mine && all);
        CHECK(count == (drop ? n / w : (n + w - 1) / w));
        MPI_Allgather((void *)mlc_dist_sampler_indices(mine), count, MPI_INT, all, count, MPI_INT, mpi.comm);
        memset(seen, 0, sizeof seen);
        for (r = 0; r < w; r++)              /* rank r has position r + i w of the padded order */
            for (i = 0; i < count; i++) {
                mlc_dist_sampler *other = mlc_dist_sampler_create_for(r, w, n, o);
                CHECK(other && mlc_dist_sampler_indices(other)[i] == all[r * count + i]);
                CHECK(all[r * count + i] >= 0 && all[r * count + i] < n);
                seen[all[r * count + i]]++;
                mlc_dist_sampler_free(other);
            }
        for (i = 0, total = 0; i < n; i++) { total += seen[i]; if (!drop) CHECK(seen[i] >= 1); }
        CHECK(total == count * w);
        memcpy(perm0, all, sizeof(int) * (size_t)(count < 16 ? count : 16));
        mlc_dist_sampler_set_epoch(mine, 1);
        CHECK(memcmp(perm0, mlc_dist_sampler_indices(mine), sizeof(int) * (size_t)(count < 16 ? count : 16))
              || w == n);
        free(all);
        mlc_dist_sampler_free(mine);
    }
    return 1;
}

static int metrics_all_reduce(void) {
    double v[2] = { (double)mpi.rank, 1.0 };
    mlc_mpi_allreduce_sum(&mpi, v, 2);
    CHECK(v[0] == mpi.size * (mpi.size - 1) / 2.0 && v[1] == mpi.size);
    CHECK(mlc_mpi_mean(&mpi, (double)mpi.rank) == (mpi.size - 1) / 2.0);
    CHECK(mlc_mpi_sum(&mpi, 2.0) == 2.0 * mpi.size);
    return 1;
}

/* A checkpoint rank 0 cannot write is an error on every rank (none waits for the others); one no
   rank can read, too; mlc_mpi_device names the CPU or an OpenCL device */
static int checkpoint_errors_reach_every_rank(void) {
    mlc_ctx *ctx = new_ctx(1);
    mlc_module *m = make_mlp(ctx);
    mlc_optim *opt = make_optim(ctx, m, ADAM);
    mlc_ddp *ddp = mlc_ddp_wrap(&mpi, m, (mlc_ddp_opts){ 0 });
    mlc_train_state st = { 1, 2 };
    char device[64];
    CHECK(ddp);
    CHECK(mlc_ddp_checkpoint_save(ddp, "/nonexistent-dir/x.ckpt", opt, &st) != MLC_OK);
    CHECK(mlc_error(ctx) != MLC_OK);
    mlc_clear_error(ctx);
    CHECK(mlc_ddp_checkpoint_load(ddp, "/nonexistent-dir/x.ckpt", opt, &st) != MLC_OK);
    mlc_clear_error(ctx);
    CHECK(mlc_mpi_device(&mpi, device, sizeof device) == device);
    CHECK(!strcmp(device, "cpu") || !strncmp(device, "opencl:", 7));
    mlc_ddp_free(ddp);
    mlc_destroy(ctx);
    return 1;
}

/* A model that differs on the last rank: wrap fails on every rank, and that rank names it */
static int mismatched_models_named_at_wrap(void) {
    mlc_ctx *ctx = new_ctx(1);
    int last = mpi.rank == mpi.size - 1 && mpi.size > 1;
    mlc_module *a = mlc_nn_linear(ctx, 8, last ? 17 : 16), *b = mlc_nn_tanh(ctx);
    mlc_module *c = mlc_nn_linear(ctx, 16, 4);
    mlc_module *m = mlc_nn_sequential(ctx, a, b, c, NULL);
    mlc_ddp *ddp = mlc_ddp_wrap(&mpi, m, (mlc_ddp_opts){ 0 });
    if (mpi.size == 1) CHECK(ddp != NULL);
    else {
        CHECK(ddp == NULL && mlc_error(ctx) == MLC_ERR_STATE);
        if (last) CHECK_MSG(strstr(mlc_error_message(ctx), "0.weight float32 [17, 8]")
                            && strstr(mlc_error_message(ctx), "0.weight float32 [16, 8]"),
                            "message: %s", mlc_error_message(ctx));
        else CHECK_MSG(strstr(mlc_error_message(ctx), "rank"), "message: %s", mlc_error_message(ctx));
    }
    mlc_ddp_free(ddp);
    mlc_destroy(ctx);
    return 1;
}

/* ---- Resume on another number of ranks ------------------------------------------------------
   64 samples, global batch 16 (4 steps an epoch), 2 epochs, Adam, sampler shuffled. write: the
   unbroken run (saving after step 1 of epoch 0); read: resume from that file, compare. */
static int resume(const char *mode, const char *ckpt, const char *losses) {
    enum { N = 64, GB = 16, F = 8, EPOCHS = 2 };
    float x[N * F], y[N];
    int b = GB / mpi.size, steps, epoch, step, reading = !strcmp(mode, "read");
    int first_epoch = 0, first_step = 0;
    int ok = 1, compared = 0;
    double want[64];
    int n_want = 0;
    mlc_ctx *ctx = new_ctx(9);
    mlc_module *m = make_mlp(ctx);
    mlc_optim *opt = make_optim(ctx, m, ADAM);
    mlc_ddp *ddp = mlc_ddp_wrap(&mpi, m, (mlc_ddp_opts){ 0 });
    mlc_dist_sampler_opts so = { .shuffle = 1, .seed = 3 };
    mlc_dist_sampler *s = mlc_dist_sampler_create(&mpi, N, so);
    FILE *out = NULL;
    mlc_mpi_check(&mpi, ctx, "resume setup");
    make_data(N, F, x, y);
    if (reading) {
        mlc_train_state st = { 0, 0 };
        FILE *in = fopen(losses, "r");
        if (!in) mlc_mpi_fail(&mpi, "cannot read %s", losses);
        while (n_want < 64 && fscanf(in, "%lf", &want[n_want]) == 1) n_want++;
        fclose(in);
        if (mlc_ddp_checkpoint_load(ddp, ckpt, opt, &st) != MLC_OK)
            mlc_mpi_check(&mpi, ctx, "checkpoint load");
        first_epoch = (int)st.epoch;
        first_step = (int)st.step;
    } else if (mpi.rank == 0 && !(out = fopen(losses, "w"))) mlc_mpi_fail(&mpi, "cannot write %s", losses);
    steps = mlc_dist_sampler_steps(s, b, 0);
    for (epoch = first_epoch; epoch < EPOCHS; epoch++) {
        mlc_dist_sampler_set_epoch(s, epoch);
        for (step = epoch == first_epoch ? first_step : 0; step < steps; step++) {
            mlc_frame f = mlc_frame_begin(ctx);
            mlc_tensor *bx, *by, *loss;
            double mean;
            mlc_dist_sampler_batch(s, mlc_from_data(ctx, 2, (int[]){ N, F }, x),
                                   mlc_from_data(ctx, 1, (int[]){ N }, y), step, b, &bx, &by);
            loss = mlc_cross_entropy(mlc_ddp_forward(ddp, bx), by, MLC_REDUCE_MEAN, MLC_NO_IGNORE);
            mlc_zero_grad(opt);
            mlc_ddp_backward(ddp, loss);
            mlc_step(opt);
            mean = mlc_mpi_mean(&mpi, (double)mlc_item(loss));
            mlc_frame_end(f);
            if (out) fprintf(out, "%.9g\n", mean);
            if (reading) {
                int at = epoch * steps + step;
                if (at >= n_want || fabs(mean - want[at]) > 1e-5 * fabs(want[at])) {
                    ok = 0;
                    if (mpi.rank == 0)
                        printf("resume: epoch %d step %d loss %.9g, the unbroken run's %.9g\n", epoch, step,
                               mean, at < n_want ? want[at] : -1.0);
                }
                compared++;
            }
            if (!reading && epoch == 0 && step == 1) {
                mlc_train_state st = { step + 1, epoch };   /* the next step to run */
                if (mlc_ddp_checkpoint_save(ddp, ckpt, opt, &st) != MLC_OK)
                    mlc_mpi_check(&mpi, ctx, "checkpoint save");
            }
        }
    }
    if (out) fclose(out);
    if (reading && mpi.rank == 0) {
        printf("%s resume_on_%d_ranks_same_losses (%d losses compared)\n",
               ok && compared == 6 ? "ok" : "FAIL", mpi.size, compared);
        printf("%d passed, %d failed\n", ok && compared == 6, !(ok && compared == 6));
    }
    mlc_dist_sampler_free(s);
    mlc_ddp_free(ddp);
    mlc_destroy(ctx);
    return reading ? (ok && compared == 6) : 1;
}

/* ---- A rank that fails in a training loop ---------------------------------------------------- */
static int fail_at(const char *how, int at) {
    mlc_ctx *ctx = new_ctx(1);
    mlc_module *m = make_mlp(ctx);
    mlc_optim *opt = make_optim(ctx, m, SGD);
    mlc_ddp *ddp = mlc_ddp_wrap(&mpi, m, (mlc_ddp_opts){ .timeout_s = 5 });
    float x[4 * 8] = { 0 }, y[4] = { 0 };
    int step, last = mpi.rank == mpi.size - 1;
    mlc_mpi_check(&mpi, ctx, "setup");
    for (step = 0; step < 1000000; step++) {
        mlc_frame f = mlc_frame_begin(ctx);
        mlc_tensor *bx = mlc_from_data(ctx, 2, (int[]){ 4, 8 }, x);
        mlc_tensor *by = mlc_from_data(ctx, 1, (int[]){ 4 }, y);
        if (step == at && mpi.rank == 1 && !strcmp(how, "--exit-at")) exit(3);
        if (step == at && mpi.rank == 1 && !strcmp(how, "--kill-at")) raise(SIGKILL);
        if (step == at && last && !strcmp(how, "--error-at")) bx = mlc_from_data(ctx, 2, (int[]){ 8, 4 }, x);
        if (step == at && last && !strcmp(how, "--hang-at")) {
            struct timespec t = { 60, 0 };
            nanosleep(&t, NULL);
        }
        ddp_step(ddp, opt, bx, by);
        mlc_frame_end(f);
    }
    return 0;
}

/* ---- The runner --------------------------------------------------------------------------- */

typedef struct test_case { const char *name; int (*run)(void); } test_case;
#define TEST(fn) { #fn, fn },
static const test_case tests[] = {
    TEST(metrics_all_reduce)
    TEST(sampler_slices_one_shuffle)
    TEST(equivalence_sgd_mlp)
    TEST(equivalence_adam_mlp)
    TEST(equivalence_sgd_cnn)
    TEST(equivalence_adam_cnn)
    TEST(equivalence_sgd_cnn_sync_batch_norm)
    TEST(equivalence_adam_cnn_sync_batch_norm)
    TEST(batch_norm_buffers_follow_rank_0)
    TEST(buckets_and_unused_parameter)
    TEST(no_sync_accumulates)
    TEST(mismatched_models_named_at_wrap)
    TEST(checkpoint_errors_reach_every_rank)
    { NULL, NULL }
};

int main(int argc, char **argv) {
    int passed = 0, failed = 0, i, status = 0;
    if (mlc_mpi_init(&argc, &argv, &mpi) != MLC_OK) return 1;
    if (argc == 5 && !strcmp(argv[1], "--resume")) status = !resume(argv[2], argv[3], argv[4]);
    else if (argc == 3 && !strncmp(argv[1], "--", 2)) status = !fail_at(argv[1], atoi(argv[2]));
    else {
        for (i = 0; tests[i].name; i++) {
            int ok, all;
            failure[0] = 0;
            ok = tests[i].run();
            MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, mpi.comm);
            if (!ok)
                printf("FAIL %s (%d ranks) on rank %d: %s\n", tests[i].name, mpi.size, mpi.rank, failure);
            fflush(stdout);
            MPI_Barrier(mpi.comm);
            if (all) passed++; else failed++;
            if (mpi.rank == 0 && all) printf("ok %s (%d ranks)\n", tests[i].name, mpi.size);
            fflush(stdout);
        }
        if (mpi.rank == 0) printf("%d passed, %d failed\n", passed, failed);
        status = failed != 0;
    }
    mlc_mpi_finalize(&mpi);
    return status;
}
