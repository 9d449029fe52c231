/* The device machinery without OpenCL, and the test contexts (test_ctx, test_adopt,
   test_destroy) of every suite. This file holds the implementation (MLC_IMPLEMENTATION), so
   mlc's internals are visible.

   The fake device is examples/backend_skeleton.c, included here whole (less its main): the
   documented starting point for a new backend, so the tests keep it working. Its buffers are
   malloc'd through mlc's books (mlc__device_alloc), as a real backend's are, and hold NaN until
   written (so a read of what nobody wrote shows): uploads and downloads copy and count
   (mlc_stats), long-lived tensors' buffers go when the tensor is freed or moved home, and a
   frame's temporaries become spares at mlc_frame_end. By default it declines every op, step
   and all, so each falls back to the CPU through the host copies, exactly as an op a real
   backend lacks. Its test hooks (fields of fake_device) for the tests here:
     kernel_neg  mlc_neg runs "on the device" (forward and backward on the device buffers), so
                 an output whose host copy is out of date, downloads, and a gradient written
                 on the device can be tested;
     kernel_step mlc_step updates up to 3 parameters a call "on the device", so the runs of
                 device parameters mlc_step hands the backend can be tested;
     verify      each op first checks its inputs: a tensor whose copies (of its data, or of its
                 gradient) are both marked current must hold the same values in both (else
                 someone wrote t->data without telling mlc, or mlc's books are wrong), and a
                 host copy of the data marked newer is uploaded. MLC_TEST_FAKE_DEVICE=1 runs the
                 whole suite this way, which checks the suites' own reads and writes too;
     limit_bytes a device that holds no more than this. */
#define _POSIX_C_SOURCE 200112L   /* setenv, dup, dup2 */
#define BACKEND_SKELETON_NO_MAIN
#include "../examples/backend_skeleton.c"   /* MLC_IMPLEMENTATION, and "fake" in the registry */
#include <stdlib.h>
#include <fcntl.h>
#include <unistd.h>
#include "test.h"

const float *test_optim_state(mlc_optim *opt, int i, int k) {
    return opt->state[3 * i + k] ? mlc_host_data(opt->state[3 * i + k]) : NULL;
}

int test_pool_started(const mlc_ctx *ctx) {
#if MLC__THREADS
    return ctx->workers != NULL;
#else
    (void)ctx;
    return 0;
#endif
}

void test_parallel(mlc_ctx *ctx, size_t n, size_t parallel_from,
                   void (*fn)(void *arg, int slot, size_t begin, size_t end), void *arg) {
    mlc__parallel(ctx, n, parallel_from, fn, arg);
}

/* mlc_gemm_i8's kernels, in the order of mlc.h's list (MLC__I8_KERNELS) */
static const char *const i8_kernel_names[] = { "portable C", "AVX2", "AVX-VNNI", "AVX-512 VNNI" };
typedef char i8_kernel_names_check[sizeof i8_kernel_names / sizeof i8_kernel_names[0] == MLC__I8_KERNELS
                                   ? 1 : -1];

const char *test_gemm_i8_kernel(mlc_ctx *ctx, int k) {
    if (k < 0) k = mlc__i8_best();
    if (!ctx || k >= MLC__I8_KERNELS || !mlc__i8_kernel_runs(k)) return NULL;
    ctx->i8_kernel = k;
    return i8_kernel_names[k];
}

/* Install the fake device on a context that runs on the CPU and holds no tensors yet. */
mlc_ctx *test_install_fake_device(mlc_ctx *ctx) {
    fake_install(ctx);
    return ctx;
}

static fake_device *fake_of(mlc_ctx *ctx) { return ctx && ctx->backend == &fake_backend ? (fake_device *)ctx->device : NULL; }

/* Device buffer k and every later one are refused (mlc.h's fault injection, for any backend). */
long test_device_fail_at(mlc_ctx *ctx, long k) {
    if (!ctx || !ctx->backend) return -1;
    ctx->buffers.refuse_from = k;
    return ctx->buffers.made;
}

long test_device_buffers_lost(const mlc_ctx *ctx) {
    const mlc__device_buffers *books = ctx ? &ctx->buffers : NULL;
    if (!books || !ctx->backend) return -1;
    return books->made - books->released - (long)(books->n_frame + books->n_spare + books->n_kept);
}

int test_device_max_args(mlc_ctx *ctx, size_t bytes) {
#ifdef MLC_OPENCL
    if (ctx && ctx->backend == &mlc__opencl_backend && !mlc__cl_st(ctx)->program) {
        mlc__cl_st(ctx)->max_args = bytes;
        return 1;
    }
#endif
    (void)ctx; (void)bytes;
    return 0;
}

/* ---- the tests' contexts ----------------------------------------------------------------- */

int test_isnan(double v) { return mlc__is_nan((float)v); }
int test_isfinite(double v) { return mlc__is_finite((float)v); }
float test_erf(float x) { return MLC_ERFF(x); }   /* the CPU's erf (GELU's), for its accuracy test */

size_t test_fallbacks;
char test_fallback_op[96];

int test_fake_device_wanted(void) {
    const char *v = getenv("MLC_TEST_FAKE_DEVICE");
    return v && strcmp(v, "1") == 0;
}

mlc_ctx *test_adopt(mlc_ctx *ctx) {
    if (ctx && test_fake_device_wanted() && !ctx->backend && !ctx->error) test_install_fake_device(ctx);
    if (fake_of(ctx) && test_fake_device_wanted()) fake_of(ctx)->verify = 1;
    return ctx;
}

mlc_ctx *test_ctx(unsigned long long seed) {
    mlc_config c;
    memset(&c, 0, sizeof c);
    c.seed = seed;
    c.quiet = 1;
    if (test_fake_device_wanted()) c.device = "fake";  /* opened through the registry; replaces $MLC_DEVICE */
    return test_adopt(mlc_create(&c));
}

void test_destroy(mlc_ctx *ctx) {
    if (!ctx) return;
    if (ctx->stats.fallbacks && !test_fallbacks && ctx->n_fell_back) {
        strncpy(test_fallback_op, ctx->fell_back[0], sizeof test_fallback_op - 1);
        test_fallback_op[sizeof test_fallback_op - 1] = '\0';
    }
    test_fallbacks += ctx->stats.fallbacks;
    mlc_destroy(ctx);
}

/* test_destroy for a test whose only fallbacks are the ones it expects (the ops named in `ops`,
   separated by spaces, which have no kernel on any device: the int8 ones): those are not held
   against it. */
void test_destroy_expecting_fallbacks(mlc_ctx *ctx, const char *ops) {
    const size_t before = test_fallbacks;
    int i, only_these = 1;
    if (!ctx) return;
    for (i = 0; i < ctx->n_fell_back; i++) {
        const char *at = strstr(ops, ctx->fell_back[i]);
        const size_t n = strlen(ctx->fell_back[i]);
        only_these &= at && (at == ops || at[-1] == ' ') && (at[n] == ' ' || at[n] == '\0');
    }
    test_destroy(ctx);
    if (only_these) test_fallbacks = before;
}

/* ---- the suite --------------------------------------------------------------------------- */

typedef struct log_capture { int warnings; char last[256]; } log_capture;
static void capture_log(mlc_log_level level, const char *message, void *user) {
    log_capture *c = (log_capture *)user;
    if (level != MLC_LOG_WARN) return;
    c->warnings++;
    strncpy(c->last, message, sizeof c->last - 1);
}

/* A CPU context with the fake device installed (whatever $MLC_DEVICE says). */
static mlc_ctx *fake_ctx(unsigned long long seed, log_capture *log) {
    mlc_config c;
    memset(&c, 0, sizeof c);
    c.seed = seed;
    c.quiet = 1;
    c.device = "cpu";
    if (log) { memset(log, 0, sizeof *log); c.log = capture_log; c.log_user = log; }
    return test_install_fake_device(mlc_create(&c));
}

static int op_falls_back(void) {
    log_capture log;
    mlc_ctx *ctx = fake_ctx(1, &log);
    mlc_tensor *x = mlc_from_data(ctx, MLC_SHAPE(2, 2), (const float[]){ 1, 2, 3, 4 });
    mlc_tensor *y = mlc_from_data(ctx, MLC_SHAPE(2), (const float[]){ 10, 20 }), *r;
    CHECK(x && y && x->on_device && y->on_device);
    CHECK(mlc_has_device(ctx) && strcmp(mlc_device_name(ctx), "fake") == 0);
    CHECK(mlc_get_stats(ctx).fallbacks == 0);
    r = mlc_add(x, y);                                  /* broadcast, on the CPU through copies */
    CHECK(r && r->on_device);
    CHECK_TENSOR(r, ((const float[]){ 11, 22, 13, 24 }), 0);
    CHECK(mlc_get_stats(ctx).fallbacks == 1);
    CHECK_MSG(log.warnings == 1 && strstr(log.last, "mlc_add") && strstr(log.last, "fake"), "log: %d, %s", log.warnings, log.last);
    r = mlc_add(r, y);                                  /* counted again, logged once per op */
    CHECK_TENSOR(r, ((const float[]){ 21, 42, 23, 44 }), 0);
    CHECK(mlc_get_stats(ctx).fallbacks == 2 && log.warnings == 1);
    r = mlc_mul(r, y);
    CHECK_TENSOR(r, ((const float[]){ 210, 840, 230, 880 }), 0);
    CHECK(mlc_get_stats(ctx).fallbacks == 3 && log.warnings == 2 && strstr(log.last, "mlc_mul"));
    CHECK(ctx->n_fell_back == 2 && strcmp(ctx->fell_back[0], "mlc_add") == 0);
    CHECK(mlc_get_stats(ctx).downloads == 0);           /* the host copies were current throughout */
    CHECK(mlc_error(ctx) == MLC_OK);
    mlc_destroy(ctx);
    return 1;
}

/* A few Adam steps of a small MLP: the losses and parameters on the fake device equal the
   CPU's bit for bit (the fallbacks run the same code on the same host copies). */
static int run_mlp(mlc_ctx *ctx, float *losses, int steps, float *params, int *n_params) {
    mlc_module *net = mlc_nn_sequential(ctx, mlc_nn_linear(ctx, 6, 16), mlc_nn_gelu(ctx), mlc_nn_linear(ctx, 16, 3), NULL);
    mlc_optim *opt = mlc_adamw(ctx, net, (mlc_adam_opts){ .lr = 0.01f });
    mlc_tensor *x = mlc_randn(ctx, MLC_SHAPE(8, 6));
    mlc_tensor *y = mlc_from_data(ctx, MLC_SHAPE(8), (const float[]){ 0, 1, 2, 0, 1, 2, 0, 1 });
    mlc_named_tensor ps[8];
    int s, i, n;
    CHECK(net && opt && x && y);
    for (s = 0; s < steps; s++) {
        mlc_frame f = mlc_frame_begin(ctx);
        mlc_tensor *loss = mlc_cross_entropy(mlc_forward(net, x), y, MLC_REDUCE_MEAN, MLC_NO_IGNORE);
        mlc_zero_grad(opt);
        CHECK(mlc_backward(loss) == MLC_OK);
        mlc_step(opt);
        losses[s] = mlc_item(loss);
        mlc_frame_end(f);
    }
    n = mlc_module_parameters(net, ps, 8);
    *n_params = 0;
    for (i = 0; i < n; i++) {
        memcpy(params + *n_params, mlc_host_data(ps[i].tensor), ps[i].tensor->size * sizeof(float));
        *n_params += (int)ps[i].tensor->size;
    }
    CHECK_MSG(mlc_error(ctx) == MLC_OK, "%.200s", mlc_error_message(ctx));
    return 1;
}

static int training_matches_cpu(void) {
    static float pc[512], pf[512];
    float lc[6], lf[6];
    int nc = 0, nf = 0;
    mlc_config c;
    mlc_ctx *cpu, *fake = fake_ctx(11, NULL);
    memset(&c, 0, sizeof c);
    c.seed = 11; c.quiet = 1; c.device = "cpu";
    cpu = mlc_create(&c);
    fake_of(fake)->verify = 1;
    CHECK(cpu && fake);
    if (!run_mlp(cpu, lc, 6, pc, &nc) || !run_mlp(fake, lf, 6, pf, &nf)) return 0;
    CHECK(nc == nf && nc == 6 * 16 + 16 + 16 * 3 + 3);
    CHECK_MSG(memcmp(lc, lf, sizeof lc) == 0, "losses: cpu %.9g .. %.9g, fake %.9g .. %.9g", lc[0], lc[5], lf[0], lf[5]);
    CHECK(lf[5] < lf[0]);
    CHECK(memcmp(pc, pf, (size_t)nc * sizeof(float)) == 0);
    CHECK(mlc_get_stats(cpu).fallbacks == 0 && mlc_get_stats(fake).fallbacks > 6);
    mlc_destroy(cpu);
    mlc_destroy(fake);
    return 1;
}

/* mlc_step hands the backend each run of parameters on the device, and it may update several
   at once: with 11 parameters, 2 and 9 sent home after the optimiser was made (their state
   follows) and 5 brought to the device after it was made at home, the runs are 0-1, 3-8 and 10;
   the fake takes up to 3 a call, so 3-8 goes in two calls. Adam with AMSGrad and weight decay
   then gives the CPU's parameters bit for bit (the same loops), reading each stepped parameter
   from the device; without the fake's kernel each device parameter falls back alone. */
static int step_takes_runs_of_device_parameters(void) {
    enum { NS = 11 };
    static const int sizes[NS] = { 1, 30, 7, 4, 2, 65, 1, 301, 9, 25, 5 };
    static const fake_step_call want[] = { { 0, 2, 2 }, { 3, 6, 3 }, { 6, 3, 3 }, { 10, 1, 1 } };
    mlc_ctx *ctx = fake_ctx(31, NULL), *cpu = mlc_create(&(mlc_config){ .seed = 31, .quiet = 1, .device = "cpu" });
    mlc_adam_opts cfg = { 0.01f, 0.8f, 0.95f, 1e-6f, 0.1f, 1 };
    mlc_tensor *p[NS], *q[NS];
    mlc_optim *opt, *ref = mlc_adam(cpu, NULL, cfg);
    fake_device *fd = fake_of(ctx);
    int k, s, j;
    CHECK(fd && ref);
    fd->verify = fd->kernel_step = 1;
    for (k = 0; k < NS; k++) {
        CHECK((p[k] = mlc_parameter(ctx, MLC_SHAPE(sizes[k]))) && (q[k] = mlc_parameter(cpu, MLC_SHAPE(sizes[k]))));
        for (j = 0; j < sizes[k]; j++) mlc_host_data(p[k])[j] = mlc_host_data(q[k])[j] = 0.1f * (float)((j + k) % 7) - 0.3f;
        mlc__host_wrote(p[k]);
    }
    CHECK(mlc_to(p[5], 0) && (opt = mlc_adam(ctx, NULL, cfg)));
    for (k = 0; k < NS; k++) CHECK(mlc_optim_add_param(opt, p[k]) == MLC_OK && mlc_optim_add_param(ref, q[k]) == MLC_OK);
    CHECK(mlc_to(p[2], 0) && mlc_to(p[9], 0) && mlc_to(p[5], 1));
    for (s = 0; s < 4; s++) {
        for (k = 0; k < NS; k++) {                  /* g = ±(j + 1) / 8, its sign turning with k and s */
            float *g = mlc_host_grad(p[k]);
            CHECK(g && mlc_host_grad(q[k]));
            for (j = 0; j < sizes[k]; j++) g[j] = q[k]->grad[j] = (float)(j + 1) / 8.0f * ((j + k + s) % 3 ? 1.0f : -1.0f);
            mlc__host_wrote_grad(p[k]);
        }
        if (s == 3) fd->kernel_step = 0;
        fd->n_steps = 0;
        mlc_step(opt);
        mlc_step(ref);
        if (s < 3) {
            CHECK(fd->n_steps == 4 && memcmp(fd->steps, want, sizeof want) == 0);
            CHECK(mlc_get_stats(ctx).fallbacks == 0);
        } else CHECK(fd->n_steps == NS - 2 && fd->steps[1].first == 1 && fd->steps[1].count == 1 &&
                     mlc_get_stats(ctx).fallbacks == NS - 2);
        for (k = 0; k < NS; k++)
            CHECK_MSG(memcmp(mlc_host_data(p[k]), mlc_host_data(q[k]), (size_t)sizes[k] * sizeof(float)) == 0,
                      "step %d: parameter %d differs from the CPU's", s + 1, k);
    }
    CHECK(!p[2]->on_device && !p[9]->on_device && p[5]->on_device);
    for (k = 0; k < 3; k++) CHECK(opt->state[3 * 2 + k]->on_device == 0 && opt->state[3 * 5 + k]->on_device == 1);
    CHECK_MSG(mlc_error(ctx) == MLC_OK, "%.200s", mlc_error_message(ctx));
    mlc_destroy(ctx);
    mlc_destroy(cpu);
    return 1;
}

static int to_moves_tensor_and_grad(void) {
    mlc_ctx *ctx = fake_ctx(2, NULL);
    mlc_tensor *p = mlc_parameter(ctx, MLC_SHAPE(4));
    mlc_stats s0, s1;
    const float want[4] = { 1, -2, 3, -4 }, grad[4] = { 2, -4, 6, -8 };
    CHECK(p && p->on_device);
    CHECK(mlc_write(p, want, 4) == MLC_OK);
    CHECK(mlc_backward(mlc_sum_all(mlc_mul(p, p))) == MLC_OK);       /* dp = 2p, on the CPU */
    CHECK_TENSOR(p, want, 0);
    s0 = mlc_get_stats(ctx);
    CHECK(mlc_to(p, 0) == p && !p->on_device && !p->device_data && !p->device_grad && p->stale == 0);
    CHECK(memcmp(p->data, want, sizeof want) == 0 && memcmp(p->grad, grad, sizeof grad) == 0);
    CHECK(mlc_get_stats(ctx).device_bytes_current == 0);
    CHECK(mlc_to(p, 1) == p && p->on_device && p->device_data && p->device_grad);  /* up: data and gradient */
    s1 = mlc_get_stats(ctx);
    CHECK(s1.uploads == s0.uploads + 2 && s1.device_bytes_current == 2 * sizeof want);
    CHECK(memcmp(p->device_data, want, sizeof want) == 0 && memcmp(p->device_grad, grad, sizeof grad) == 0);
    /* the device copies change (as a kernel would change them): home brings them back */
    ((float *)p->device_data)[0] = 100.0f;
    ((float *)p->device_grad)[3] = -100.0f;
    p->stale = MLC__HOST_STALE | MLC__GRAD_HOST_STALE;
    CHECK(mlc_to(p, 0) == p && !p->on_device);
    CHECK(mlc_get_stats(ctx).downloads == s1.downloads + 2 && mlc_get_stats(ctx).device_bytes_current == 0);
    CHECK(p->data[0] == 100.0f && p->data[1] == -2.0f && p->grad[3] == -100.0f && p->grad[0] == 2.0f);
    CHECK(mlc_to(p, 0) == p && mlc_get_stats(ctx).downloads == s1.downloads + 2);   /* already home */
    CHECK(mlc_error(ctx) == MLC_OK);
    mlc_destroy(ctx);
    /* a context without a device cannot move anything there */
    ctx = test_ctx(2);
    if (!mlc_has_device(ctx)) {
        CHECK(mlc_to(mlc_ones(ctx, MLC_SHAPE(2)), 1) == NULL && mlc_error(ctx) == MLC_ERR_DEVICE);
        CHECK(strstr(mlc_error_message(ctx), "mlc_to") != NULL);
    }
    test_destroy(ctx);
    return 1;
}

static int inputs_on_two_devices(void) {
    mlc_ctx *ctx = fake_ctx(3, NULL);
    mlc_tensor *a = mlc_ones(ctx, MLC_SHAPE(3)), *b = mlc_to(mlc_ones(ctx, MLC_SHAPE(3)), 0);
    CHECK(a && b && a->on_device && !b->on_device);
    CHECK(mlc_add(a, b) == NULL && mlc_error(ctx) == MLC_ERR_DEVICE);
    CHECK_MSG(strstr(mlc_error_message(ctx), "mlc_add") && strstr(mlc_error_message(ctx), "fake") && strstr(mlc_error_message(ctx), "cpu"),
              "message: %.200s", mlc_error_message(ctx));
    mlc_clear_error(ctx);
    CHECK(mlc_matmul(mlc_ones(ctx, MLC_SHAPE(2, 3)), mlc_to(mlc_ones(ctx, MLC_SHAPE(3, 2)), 0)) == NULL);
    CHECK(mlc_error(ctx) == MLC_ERR_DEVICE && strstr(mlc_error_message(ctx), "mlc_matmul"));
    mlc_clear_error(ctx);
    CHECK(mlc_get_stats(ctx).fallbacks == 0);           /* refused before running anywhere */
    CHECK(mlc_add(a, mlc_to(b, 1)) != NULL && mlc_error(ctx) == MLC_OK);   /* moved: fine */
    mlc_destroy(ctx);
    return 1;
}

/* With a kernel: outputs live on the device, reads download once, and a host write with
   mlc_write reaches the device copy before the next kernel reads it. */
static int host_writes_reach_device(void) {
    mlc_ctx *ctx = fake_ctx(4, NULL);
    mlc_tensor *x = mlc_from_data(ctx, MLC_SHAPE(3), (const float[]){ 1, 2, 3 }), *y;
    mlc_stats s;
    CHECK(x);
    fake_of(ctx)->kernel_neg = 1;
    y = mlc_neg(x);                                     /* uploads x, runs "on the device" */
    CHECK(y && y->on_device && (y->stale & MLC__HOST_STALE));
    s = mlc_get_stats(ctx);
    CHECK(s.fallbacks == 0 && s.uploads == 1 && s.downloads == 0);
    CHECK_TENSOR(y, ((const float[]){ -1, -2, -3 }), 0);   /* the read downloads */
    CHECK(mlc_get_stats(ctx).downloads == 1);
    CHECK(mlc_item(mlc_sum_all(y)) == -6.0f);           /* current now: no second download */
    CHECK(mlc_get_stats(ctx).downloads == 1 && mlc_get_stats(ctx).fallbacks > 0);
    CHECK(mlc_write(x, (const float[]){ 5, 6, 7 }, 3) == MLC_OK);
    CHECK(x->stale & MLC__DEVICE_STALE);
    y = mlc_neg(x);
    CHECK(memcmp(x->device_data, ((const float[]){ 5, 6, 7 }), 3 * sizeof(float)) == 0);
    CHECK(mlc_get_stats(ctx).uploads == 2);
    CHECK_TENSOR(y, ((const float[]){ -5, -6, -7 }), 0);
    CHECK(mlc_get_stats(ctx).downloads == 2);
    {   /* mlc_read downloads too; mlc_keep copies a current host copy */
        float out[3];
        mlc_tensor *z = mlc_neg(y), *k;
        CHECK(mlc_read(z, out, 3) == MLC_OK && out[0] == 5.0f && out[2] == 7.0f);
        CHECK(mlc_get_stats(ctx).downloads == 3);
        k = mlc_keep(mlc_neg(z));
        CHECK(k && k->on_device && k->persistent && mlc_host_data(k)[1] == -6.0f);
    }
    CHECK(mlc_error(ctx) == MLC_OK);
    mlc_destroy(ctx);
    return 1;
}

/* A node whose forward ran on the device runs its backward there; the gradient comes home
   when it is read. */
static int backward_on_device(void) {
    mlc_ctx *ctx = fake_ctx(5, NULL);
    mlc_tensor *x = mlc_requires_grad(mlc_from_data(ctx, MLC_SHAPE(3), (const float[]){ 1, 2, 3 }), 1), *y;
    size_t downloads;
    CHECK(x);
    fake_of(ctx)->kernel_neg = 1;
    y = mlc_neg(x);
    CHECK(y && y->node && y->node->device == 1);
    CHECK(mlc_backward(mlc_sum_all(mlc_mul(y, y))) == MLC_OK);   /* d/dx Σ x² = 2x */
    CHECK(x->stale & MLC__GRAD_HOST_STALE);
    downloads = mlc_get_stats(ctx).downloads;
    CHECK_MSG(mlc_host_grad(x) && mlc_host_grad(x)[0] == 2.0f && mlc_host_grad(x)[2] == 6.0f, "%.200s", mlc_error_message(ctx));
    CHECK(mlc_get_stats(ctx).downloads == downloads + 1);
    CHECK(mlc_error(ctx) == MLC_OK);
    mlc_destroy(ctx);
    return 1;
}

/* Bytes of the buffers that ended frames left for reuse. */
static size_t spare_bytes(mlc_ctx *ctx) {
    size_t i, n = 0;
    for (i = 0; i < ctx->buffers.n_spare; i++) n += ctx->buffers.spare[i].bytes;
    return n;
}

static int frames_release_device_temporaries(void) {
    mlc_ctx *ctx = fake_ctx(6, NULL);
    mlc__device_buffers *fd = &ctx->buffers;            /* the books mlc keeps for every backend */
    mlc_tensor *p = mlc_parameter(ctx, MLC_SHAPE(16)), *outer = mlc_ones(ctx, MLC_SHAPE(8));
    size_t depth, bytes;
    int i;
    CHECK(p && outer && mlc_to(p, 0) && mlc_to(p, 1));  /* a long-lived buffer, not on the stack */
    fake_of(ctx)->kernel_neg = 1;
    depth = fd->n_frame;
    bytes = mlc_get_stats(ctx).device_bytes_current;
    CHECK(depth == 0 && fd->n_kept == 2 && bytes == 2 * 16 * sizeof(float));
    for (i = 0; i < 3; i++) {
        mlc_frame f = mlc_frame_begin(ctx), g;
        size_t base = fd->n_frame, first = i == 0;      /* outer gets its buffer in the first pass */
        mlc_tensor *y = mlc_neg(mlc_neg(mlc_ones(ctx, MLC_SHAPE(32))));   /* ones, -ones, y */
        CHECK_MSG(y && fd->n_frame == base + 3, "stack %zu, was %zu", fd->n_frame, base);
        g = mlc_frame_begin(ctx);                       /* nested: its own temporaries go first */
        CHECK(mlc_neg(y) && mlc_neg(outer) && fd->n_frame == base + 5 + first);
        mlc_frame_end(g);
        CHECK(fd->n_frame == base + 3 + first);        /* outer's buffer stays: outer outlives both frames */
        CHECK(mlc_host_data(y)[31] == 1.0f);
        mlc_frame_end(f);
        CHECK(fd->n_frame == depth + 1 && ctx->level == 0);
    }
    CHECK(outer->device_data && memcmp(outer->device_data, outer->data, 8 * sizeof(float)) == 0);
    CHECK(mlc_get_stats(ctx).device_bytes_current == bytes + 8 * sizeof(float) + spare_bytes(ctx));
    CHECK(mlc_get_stats(ctx).device_bytes_peak >= bytes + (8 + 3 * 32) * sizeof(float));
    mlc_tensor_free(p);                                 /* long-lived: released with the tensor */
    CHECK(fd->n_kept == 0 && mlc_get_stats(ctx).device_bytes_current == 8 * sizeof(float) + spare_bytes(ctx));
    CHECK(mlc_error(ctx) == MLC_OK);
    mlc_destroy(ctx);                                   /* the rest goes with the context */
    return 1;
}

/* The check the whole-suite run relies on: writing t->data behind mlc's back is caught. */
static int verify_catches_unannounced_writes(void) {
    mlc_ctx *ctx = fake_ctx(7, NULL);
    mlc_tensor *x = mlc_from_data(ctx, MLC_SHAPE(2), (const float[]){ 1, 2 });
    fake_of(ctx)->verify = 1;
    CHECK(x && mlc_add(x, x) != NULL && x->device_data);   /* the first use uploads */
    CHECK(mlc_write(x, (const float[]){ 3, 4 }, 2) == MLC_OK);
    CHECK(mlc_add(x, x) != NULL && mlc_error(ctx) == MLC_OK);   /* told: fine */
    x->data[0] = 9.0f;                                  /* not told */
    CHECK(mlc_add(x, x) == NULL && mlc_error(ctx) == MLC_ERR_DEVICE);
    CHECK_MSG(strstr(mlc_error_message(ctx), "mlc_add") && strstr(mlc_error_message(ctx), "mlc_write"), "%.200s", mlc_error_message(ctx));
    mlc_destroy(ctx);
    return 1;
}

/* A full device: the spares go back and the allocation is tried again; when that is not
   enough, the op fails with MLC_ERR_MEMORY naming it, and nothing is lost. */
static int device_out_of_memory(void) {
    mlc_ctx *ctx = fake_ctx(8, NULL);
    mlc_tensor *a = mlc_ones(ctx, MLC_SHAPE(64)), *y;
    fake_device *fd = fake_of(ctx);
    mlc_frame f;
    fd->kernel_neg = 1;                                 /* mlc_neg runs "on the device", in its buffers */
    CHECK(a && mlc_neg(a));                             /* a and -a: 2 x 256 bytes */
    fd->limit_bytes = 3 * 256;
    f = mlc_frame_begin(ctx);
    CHECK(mlc_neg(mlc_ones(ctx, MLC_SHAPE(32))) != NULL);   /* 2 x 128 bytes: 768 in all */
    mlc_frame_end(f);                                   /* they become spares */
    CHECK(ctx->buffers.n_spare == 2);
    y = mlc_neg(a);                                     /* 256 more: only once the spares go */
    CHECK(y && ctx->buffers.n_spare == 0 && mlc_error(ctx) == MLC_OK);
    CHECK(mlc_neg(a) == NULL && mlc_error(ctx) == MLC_ERR_MEMORY);   /* 1,024 > 768: full */
    CHECK_MSG(strstr(mlc_error_message(ctx), "mlc_neg") && strstr(mlc_error_message(ctx), "out of device memory"),
              "%.200s", mlc_error_message(ctx));
    mlc_clear_error(ctx);
    CHECK(mlc_host_data(y)[63] == -1.0f && mlc_host_data(a)[0] == 1.0f);   /* what was there is intact */
    mlc_destroy(ctx);
    return 1;
}

/* ---- choosing a device: "best" is PyTorch's `"cuda" if torch.cuda.is_available() else "cpu"` */

typedef struct device_log { int infos, warnings, errors; char info[256], error[256]; } device_log;
static void record_device_log(mlc_log_level level, const char *message, void *user) {
    device_log *l = (device_log *)user;
    char *to = level == MLC_LOG_INFO ? l->info : level == MLC_LOG_ERROR ? l->error : NULL;
    if (level == MLC_LOG_INFO) l->infos++; else if (level == MLC_LOG_WARN) l->warnings++; else l->errors++;
    if (to) { strncpy(to, message, 255); to[255] = '\0'; }
}

static int set_env(const char *name, const char *value) {   /* value NULL: unset */
#ifdef _WIN32
    return _putenv_s(name, value ? value : "") == 0;
#else
    return value ? setenv(name, value, 1) == 0 : unsetenv(name) == 0;
#endif
}

/* The first GPU mlc_devices lists, or -1 */
static int first_gpu(void) {
    mlc_device_info rows[16];
    int count = mlc_devices(rows, 16), i;
    for (i = 0; i < count && i < 16; i++) if (strcmp(rows[i].type, "gpu") == 0) return i;
    return -1;
}

/* "best": the first GPU where there is one, else the CPU, and nothing logged above INFO (an
   OpenCL driver on the CPU, PoCL, is never picked: make test runs this where PoCL is the only
   OpenCL device); a program's own backend that declines "best" is passed over. */
static int best_is_a_gpu_else_the_cpu_silently(void) {
    device_log log;
    mlc_config c;
    mlc_ctx *ctx;
    int gpu = first_gpu();
    memset(&log, 0, sizeof log);
    memset(&c, 0, sizeof c);
    c.device = "best";
    c.log = record_device_log;
    c.log_user = &log;
    ctx = mlc_create(&c);
    CHECK(ctx && mlc_error(ctx) == MLC_OK);
    CHECK_MSG(log.warnings == 0 && log.errors == 0, "%d warnings, %d errors: %.200s", log.warnings, log.errors,
              log.error);
    if (gpu < 0) {
        CHECK_MSG(!mlc_has_device(ctx) && strcmp(mlc_device_name(ctx), "cpu") == 0, "best took %s",
                  mlc_device_name(ctx));
        CHECK_MSG(log.infos >= 1 && strstr(log.info, "best"), "INFO: %d, %.200s", log.infos, log.info);
    } else {
        char prefix[16];
        snprintf(prefix, sizeof prefix, "opencl:%d ", gpu);
        CHECK_MSG(mlc_has_device(ctx) && strncmp(mlc_device_name(ctx), prefix, strlen(prefix)) == 0,
                  "best took %s, the first GPU is %s", mlc_device_name(ctx), prefix);
    }
    mlc_destroy(ctx);
    /* the same from $MLC_DEVICE, the default logger quiet */
    {
        const char *saved = getenv("MLC_DEVICE");
        char keep[128] = "";
        if (saved) { strncpy(keep, saved, sizeof keep - 1); }
        CHECK(set_env("MLC_DEVICE", "best"));
        ctx = mlc_create(&(mlc_config){ .log = record_device_log, .log_user = &log });
        CHECK(set_env("MLC_DEVICE", saved ? keep : NULL));
        CHECK(ctx && (gpu >= 0) == mlc_has_device(ctx) && log.warnings == 0 && log.errors == 0);
        mlc_destroy(ctx);
    }
    return 1;
}

/* A device asked for by name that cannot be had: mlc_create returns NULL, logs the reason
   (naming the device) as an error and writes it to config.error, truncated to error_bytes. */
static int explicit_device_that_is_not_there_fails(void) {
    const char *specs[] = { "tpu:7", "no-such-device-anywhere", "opencl:999", "opencl:x"
#ifndef MLC_OPENCL
                            , "opencl", "opencl:0"
#endif
    };
    size_t i;
    for (i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        device_log log;
        char why[256], small[12];
        mlc_config c;
        memset(&log, 0, sizeof log);
        memset(&c, 0, sizeof c);
        memset(why, 'x', sizeof why);
        c.device = specs[i];
        c.log = record_device_log;
        c.log_user = &log;
        c.error = why;
        c.error_bytes = sizeof why;
        CHECK_MSG(mlc_create(&c) == NULL, "%s gave a context", specs[i]);
        CHECK_MSG(memchr(why, '\0', sizeof why) && strstr(why, specs[i]) && strstr(why, "mlc_create"),
                  "%s: %.200s", specs[i], why);
        CHECK_MSG(log.errors == 1 && strcmp(log.error, why) == 0, "%s: %d errors logged: %.200s", specs[i],
                  log.errors, log.error);
        c.error = small;                                /* a short buffer: cut, still a C string */
        c.error_bytes = sizeof small;
        c.log = NULL;
        c.quiet = 1;
        memset(small, 'x', sizeof small);
        CHECK(mlc_create(&c) == NULL && small[sizeof small - 1] == '\0');
        CHECK(strncmp(small, "mlc_create:", 11) == 0);
        c.error = NULL;                                 /* no buffer: NULL all the same */
        CHECK(mlc_create(&c) == NULL);
    }
    {                                                   /* from $MLC_DEVICE: the reason says so */
        const char *saved = getenv("MLC_DEVICE");
        char keep[128] = "", why[256] = "";
        if (saved) { strncpy(keep, saved, sizeof keep - 1); }
        CHECK(set_env("MLC_DEVICE", "tpu:7"));
        CHECK(mlc_create(&(mlc_config){ .quiet = 1, .error = why, .error_bytes = sizeof why }) == NULL);
        CHECK(set_env("MLC_DEVICE", saved ? keep : NULL));
        CHECK_MSG(strstr(why, "tpu:7") && strstr(why, "$MLC_DEVICE"), "%s", why);
    }
    return 1;
}

/* mlc_device_name is "cpu" exactly when the context's ops run on the CPU; "none" without one */
static int device_name_says_where_ops_run(void) {
    mlc_ctx *ctx = test_ctx(1), *fake = fake_ctx(1, NULL);
    mlc_ctx *cpu = mlc_create(&(mlc_config){ .device = "cpu", .quiet = 1 });
    mlc_tensor *x;
    CHECK(ctx && fake && cpu);
    CHECK(strcmp(mlc_device_name(NULL), "none") == 0);
    CHECK((strcmp(mlc_device_name(ctx), "cpu") == 0) == !mlc_has_device(ctx));
    CHECK(strcmp(mlc_device_name(fake), "fake") == 0 && mlc_has_device(fake));
    CHECK(strcmp(mlc_device_name(cpu), "cpu") == 0 && !mlc_has_device(cpu));
    x = mlc_ones(ctx, MLC_SHAPE(2));
    CHECK(x && x->on_device == mlc_has_device(ctx));
    x = mlc_ones(fake, MLC_SHAPE(2));
    CHECK(x && x->on_device);
    test_destroy(ctx);
    test_destroy(fake);
    mlc_destroy(cpu);
    return 1;
}

#ifdef MLC_OPENCL
/* Asking for an OpenCL device that is not there is an error naming it, never a crash. */
static int opencl_bad_device_names(void) {
    const char *specs[] = { "opencl:999", "no-such-device-anywhere" };
    int i;
    for (i = 0; i < 2; i++) {
        char why[256] = "";
        mlc_config c;
        memset(&c, 0, sizeof c);
        c.quiet = 1;
        c.device = specs[i];
        c.error = why;
        c.error_bytes = sizeof why;
        CHECK(mlc_create(&c) == NULL);
        CHECK_MSG(strstr(why, specs[i]), "%.200s", why);
    }
    return 1;
}

/* "opencl" takes the first OpenCL device whatever its type (PoCL's CPU device included), which
   "best" passes over when it is no GPU */
static int opencl_takes_any_device(void) {
    mlc_device_info row;
    mlc_ctx *ctx;
    CHECK(mlc_devices(&row, 1) > 0);
    ctx = test_adopt(mlc_create(&(mlc_config){ .device = "opencl", .quiet = 1 }));
    CHECK(ctx && mlc_has_device(ctx) && strncmp(mlc_device_name(ctx), "opencl:0 ", 9) == 0);
    CHECK(strcmp(mlc_device_name(ctx), "cpu") != 0);
    test_destroy(ctx);
    return 1;
}

/* The OpenCL device the suite runs on ($MLC_DEVICE: "opencl:1", "best", a piece of a name),
   else the first one, for the tests below that make their own contexts */
static const char *opencl_spec(void) {
    const char *spec = getenv("MLC_DEVICE");
    return spec && *spec && strcmp(spec, "cpu") != 0 ? spec : "opencl";
}

/* A context of its own on the test's OpenCL device that logs nothing (its errors are expected) */
static mlc_ctx *opencl_quiet_ctx(void) {
    mlc_config c;
    memset(&c, 0, sizeof c);
    c.device = opencl_spec();
    c.quiet = 1;
    return mlc_create(&c);
}

/* mlc_device_name says which device: "opencl:N <the driver's device name>" */
static int opencl_device_named(void) {
    mlc_device_info rows[4];
    char prefix[16];
    int count = mlc_devices(rows, 4), i;
    CHECK(count > 0);
    for (i = 0; i < count && i < 4; i++) {
        mlc_config c;
        mlc_ctx *ctx;
        memset(&c, 0, sizeof c);
        snprintf(prefix, sizeof prefix, "opencl:%d", i);
        c.device = prefix;
        ctx = test_adopt(mlc_create(&c));
        CHECK(ctx && mlc_error(ctx) == MLC_OK);
        CHECK_MSG(strncmp(mlc_device_name(ctx), prefix, strlen(prefix)) == 0 && strstr(mlc_device_name(ctx), rows[i].name),
                  "%s vs %s", mlc_device_name(ctx), rows[i].name);
        test_destroy(ctx);
    }
    return 1;
}

/* mlc_write right after an op read the tensor: the (non-blocking) upload of the old values
   finishes first, and the next op sees the new ones */
static int opencl_write_after_upload(void) {
    mlc_config c;
    mlc_ctx *ctx;
    mlc_frame f;
    mlc_tensor *x;
    float first[1000], second[1000];
    int i, round;
    memset(&c, 0, sizeof c);
    c.device = opencl_spec();
    ctx = test_adopt(mlc_create(&c));
    CHECK(ctx && mlc_has_device(ctx));
    for (i = 0; i < 1000; i++) { first[i] = (float)i; second[i] = (float)-i; }
    for (round = 0; round < 20; round++) {
        f = mlc_frame_begin(ctx);
        x = mlc_zeros(ctx, MLC_SHAPE(1000));
        CHECK(mlc_write(x, first, 1000) == MLC_OK);
        CHECK(mlc_neg(x) != NULL);                          /* uploads `first` */
        CHECK(mlc_write(x, second, 1000) == MLC_OK);
        CHECK_MSG(mlc_item(mlc_sum_all(mlc_neg(x))) == 499500.0f, "round %d", round);
        mlc_frame_end(f);
    }
    test_destroy(ctx);
    return 1;
}

/* The three OpenCL products (the 64 x 64 and 128 x 64 local-memory tiles GPUs get, and the
   float8 register blocks CPU devices get) against the plain loop, for every transpose, edge
   sizes, a batch and a bias; and the gradients, which add into C (beta 1). Tolerance: 1e-5 of
   the sum of |terms|. The last four sizes are single products of few tiles over a long K, which
   run in slices of K summed after (two launches), K no multiple of 16 or of the slices (a split
   product that adds into C: conv.conv_bias_gradient_sums_every_place). */
static int opencl_gemm_kernels_agree(void) {
    static const int sizes[][4] = { { 1, 1, 1, 3 }, { 3, 5, 7, 3 }, { 4, 8, 16, 3 }, { 17, 33, 9, 3 },
                                    { 37, 130, 70, 3 }, { 64, 64, 64, 3 }, { 100, 70, 33, 3 },
                                    { 130, 257, 47, 3 }, { 16, 9, 5000, 1 }, { 64, 64, 1030, 1 },
                                    { 1, 1, 4097, 1 }, { 33, 17, 2049, 1 } };   /* M, N, K, batch */
    static const char *const names[] = { "64 x 64 tiles", "128 x 64 tiles", "vector" };
    static const int tile_rows[] = { 64, 128, 0 };                 /* 0: the vector kernel */
    mlc_config c;
    mlc_ctx *ctx;
    int kernel, s, t, i;
    memset(&c, 0, sizeof c);
    c.device = opencl_spec();
    ctx = test_adopt(mlc_create(&c));
    CHECK(ctx && mlc_has_device(ctx));
    for (kernel = 0; kernel < 3; kernel++) {
        mlc__cl_st(ctx)->gemm_vector = tile_rows[kernel] == 0;
        mlc__cl_st(ctx)->gemm_tile_rows = tile_rows[kernel];
        for (s = 0; s < 12; s++)
            for (t = 0; t < 4; t++) {
                int M = sizes[s][0], N = sizes[s][1], K = sizes[s][2], batch = sizes[s][3];
                int ta = t & 1, tb = t >> 1, b;
                mlc_frame f = mlc_frame_begin(ctx);
                mlc_tensor *a = mlc_randn(ctx, MLC_SHAPE(batch, ta ? K : M, ta ? M : K));
                mlc_tensor *bm = mlc_randn(ctx, MLC_SHAPE(batch, tb ? N : K, tb ? K : N));
                size_t launched = mlc_get_stats(ctx).launches;
                mlc_tensor *out = mlc_matmul_t(a, bm, ta, tb);
                float *want = (float *)malloc((size_t)M * N * sizeof(float)), *mag = (float *)malloc((size_t)M * N * sizeof(float));
                CHECK_MSG(out && want && mag, "%.400s", mlc_error_message(ctx));
                launched = mlc_get_stats(ctx).launches - launched;
                CHECK_MSG(s < 8 || mlc__cl_st(ctx)->compute_units < 2 || launched == 2,   /* slices, sum */
                          "%s, %dx%dx%d: %zu launches", names[kernel], M, N, K, launched);
                for (b = 0; b < batch; b++) {
                    const float *A = mlc_host_data(a) + (size_t)b * M * K, *B = mlc_host_data(bm) + (size_t)b * K * N;
                    float *absA = (float *)malloc((size_t)M * K * sizeof(float)), *absB = (float *)malloc((size_t)K * N * sizeof(float));
                    CHECK(absA && absB);
                    for (i = 0; i < M * K; i++) absA[i] = fabsf(A[i]);
                    for (i = 0; i < K * N; i++) absB[i] = fabsf(B[i]);
                    mlc_gemm_reference(ta, tb, M, N, K, A, B, 0.0f, want);
                    mlc_gemm_reference(ta, tb, M, N, K, absA, absB, 0.0f, mag);
                    free(absA); free(absB);
                    for (i = 0; i < M * N; i++)
                        CHECK_MSG(fabsf(mlc_host_data(out)[(size_t)b * M * N + i] - want[i]) <= 1e-5f * mag[i] + 1e-30f,
                                  "%s, %dx%dx%d, ta %d tb %d, batch %d, element %d: %g vs %g", names[kernel],
                                  M, N, K, ta, tb, b, i, mlc_host_data(out)[(size_t)b * M * N + i], want[i]);
                }
                free(want); free(mag);
                mlc_frame_end(f);
            }
        {   /* linear with a bias, and its gradients (products that add into C) against the CPU */
            mlc_frame f = mlc_frame_begin(ctx);
            mlc_tensor *x = mlc_randn(ctx, MLC_SHAPE(19, 13)), *w = mlc_randn(ctx, MLC_SHAPE(11, 13)), *bias = mlc_randn(ctx, MLC_SHAPE(11));
            mlc_tensor *xc, *wc, *bc, *y, *yc;
            mlc_requires_grad(x, 1); mlc_requires_grad(w, 1); mlc_requires_grad(bias, 1);
            xc = mlc_requires_grad(mlc_to(mlc_from_data(ctx, MLC_SHAPE(19, 13), mlc_host_data(x)), 0), 1);
            wc = mlc_requires_grad(mlc_to(mlc_from_data(ctx, MLC_SHAPE(11, 13), mlc_host_data(w)), 0), 1);
            bc = mlc_requires_grad(mlc_to(mlc_from_data(ctx, MLC_SHAPE(11), mlc_host_data(bias)), 0), 1);
            y = mlc_linear(x, w, bias);
            mlc_backward(mlc_sum_all(mlc_mul(y, y)));              /* a backward uses up its graph */
            yc = mlc_linear(xc, wc, bc);
            mlc_backward(mlc_sum_all(mlc_mul(yc, yc)));
            CHECK(mlc_error(ctx) == MLC_OK && !xc->on_device && x->on_device);
            for (i = 0; i < 19 * 13; i++) CHECK_NEAR(mlc_host_grad(x)[i], xc->grad[i], 1e-4 * (1 + fabs(xc->grad[i])));
            for (i = 0; i < 11 * 13; i++) CHECK_NEAR(mlc_host_grad(w)[i], wc->grad[i], 1e-4 * (1 + fabs(wc->grad[i])));
            for (i = 0; i < 11; i++) CHECK_NEAR(mlc_host_grad(bias)[i], bc->grad[i], 1e-4 * (1 + fabs(bc->grad[i])));
            mlc_frame_end(f);
        }
    }
    test_destroy(ctx);
    return 1;
}

/* A kernel whose arguments take more bytes than the device takes is an error naming the kernel
   and both sizes, and nothing is launched (mlc_binary's take 240 bytes, its broadcast shape and
   strides first so that they need no padding) */
static int opencl_argument_bytes_checked(void) {
    mlc_ctx *ctx = opencl_quiet_ctx();
    mlc_tensor *x;
    size_t launched;
    CHECK(ctx && mlc_has_device(ctx) && test_device_max_args(ctx, 239));
    x = mlc_from_data(ctx, MLC_SHAPE(3), ((const float[]){ 1, 2, 3 }));
    launched = mlc_get_stats(ctx).launches;
    CHECK(x && mlc_add(x, x) == NULL);
    CHECK(mlc_get_stats(ctx).launches == launched);
    CHECK_MSG(mlc_error(ctx) == MLC_ERR_DEVICE && strstr(mlc_error_message(ctx), "mlc_binary in mlc_add takes 240 bytes")
              && strstr(mlc_error_message(ctx), "at most 239"), "%.300s", mlc_error_message(ctx));
    mlc_destroy(ctx);
    return 1;
}

/* Standard output and error to /dev/null and back (saved: the two originals), for a compiler
   that prints its own diagnostics */
static void silence_begin(int saved[2]) {
    int null = open("/dev/null", O_WRONLY);
    fflush(stdout); fflush(stderr);
    saved[0] = dup(1); saved[1] = dup(2);
    if (null >= 0) { dup2(null, 1); dup2(null, 2); close(null); }
}
static void silence_end(const int saved[2]) {
    fflush(stdout); fflush(stderr);
    if (saved[0] >= 0) { dup2(saved[0], 1); close(saved[0]); }
    if (saved[1] >= 0) { dup2(saved[1], 2); close(saved[1]); }
}

/* A kernel build that fails (here: options that break one kernel) is MLC_ERR_DEVICE naming
   the device with the compiler's log; the op returns NULL, nothing crashes, data stays. The
   formula tables still build alone, so the message is the whole program's. */
static int opencl_build_failure(void) {
    mlc_config c;
    mlc_ctx *ctx;
    mlc_tensor *x;
    float values[3] = { 1, 2, 3 }, back[3];
    memset(&c, 0, sizeof c);
    c.device = opencl_spec();
    c.quiet = 1;
    CHECK(setenv("MLC_OPENCL_OPTIONS", "-Dmlc_where_grad=(", 1) == 0);
    ctx = mlc_create(&c);
    CHECK(ctx && mlc_has_device(ctx));
    x = mlc_from_data(ctx, MLC_SHAPE(3), values);
    {   /* the OpenCL compiler may print its diagnostics itself ("3 errors generated."): not here */
        int saved[2];
        mlc_tensor *y;
        silence_begin(saved);
        y = mlc_neg(x);
        silence_end(saved);
        CHECK(y == NULL);
    }
    unsetenv("MLC_OPENCL_OPTIONS");
    CHECK_MSG(mlc_error(ctx) == MLC_ERR_DEVICE && strstr(mlc_error_message(ctx), "kernel build failed on "),
              "%.400s", mlc_error_message(ctx));
    mlc_clear_error(ctx);
    CHECK(mlc_read(x, back, 3) == MLC_OK && back[0] == 1 && back[1] == 2 && back[2] == 3);
    mlc_destroy(ctx);
    return 1;
}

/* The program's formula pieces (mlc.h's MLC__FORMULA_HELPERS and MLC__UNARY_KINDS, nothing else)
   build by themselves; and a formula that calls a helper outside the table (as a new row of
   MLC__UNARY_KINDS would that used a helper written in C only), called by a kernel as mlc_unary
   calls every row, fails that build with the compiler's words naming the helper. (Uncalled, it
   builds on NVIDIA's OpenCL with a warning: the function is dropped before its calls resolve.) */
static int opencl_formulas_build_alone(void) {
    enum { FORMULAS = sizeof mlc__cl_formulas / sizeof mlc__cl_formulas[0] };
    const char *pieces[FORMULAS + 1];
    mlc_ctx *ctx = opencl_quiet_ctx();
    int i;
    CHECK(ctx && mlc_has_device(ctx));
    CHECK_MSG(mlc__cl_check_formulas(ctx), "%.400s", mlc_error_message(ctx));
    for (i = 0; i < FORMULAS; i++) pieces[i] = mlc__cl_formulas[i];
    pieces[FORMULAS] = "float mlc__new_row(float x) { return mlc__no_such_helper(x) * mlc__sigmoidf(x); }\n"
                       "__kernel void mlc__new_kernel(__global float *x) { x[0] = mlc__new_row(x[0]); }\n";
    {   /* the OpenCL compiler may print its diagnostics itself: not here */
        int saved[2];
        cl_program program;
        silence_begin(saved);
        program = mlc__cl_program(ctx, "kernel build of a new formula", pieces, FORMULAS + 1);
        silence_end(saved);
        CHECK(program == NULL);
    }
    CHECK_MSG(mlc_error(ctx) == MLC_ERR_DEVICE && strstr(mlc_error_message(ctx), "a new formula failed on ")
              && strstr(mlc_error_message(ctx), "mlc__no_such_helper"), "%.400s", mlc_error_message(ctx));
    mlc_destroy(ctx);
    return 1;
}
#endif

/* mlc_stats.launches counts the kernels a device ran (none on the CPU, or the fake device,
   which has none); mlc_sync waits for them, and is harmless on the CPU and on NULL */
static int launches_counted(void) {
    mlc_ctx *ctx = test_ctx(3);
    mlc_frame f;
    mlc_tensor *x, *y;
    size_t before;
    int real = ctx && ctx->backend && !fake_of(ctx);
    CHECK(ctx);
    f = mlc_frame_begin(ctx);
    before = mlc_get_stats(ctx).launches;
    x = mlc_randn(ctx, MLC_SHAPE(40, 30));
    y = mlc_matmul_t(x, x, 0, 1);
    mlc_sync(ctx);
    mlc_sync(NULL);
    CHECK(y && mlc_error(ctx) == MLC_OK);
    CHECK_MSG(real ? mlc_get_stats(ctx).launches > before : mlc_get_stats(ctx).launches == before,
              "%zu launches on %s", mlc_get_stats(ctx).launches - before, mlc_device_name(ctx));
    CHECK_NEAR(mlc_host_data(y)[0], mlc_item(mlc_sum_all(mlc_mul(mlc_slice(x, 0, 0, 1), mlc_slice(x, 0, 0, 1)))),
               1e-4);
    mlc_frame_end(f);
    test_destroy(ctx);
    return 1;
}

/* Cross entropy (softmax first), with ignore_index 1 and label smoothing 0.1, or the NLL of
   log-probabilities ignoring class 3 (kind 0, 1, 2). */
static mlc_tensor *class_loss_of(int kind, mlc_tensor *x, mlc_tensor *t, mlc_reduction red) {
    return kind == 0 ? mlc_cross_entropy(x, t, red, MLC_NO_IGNORE)
         : kind == 1 ? mlc_cross_entropy_opts(x, t, (mlc_ce_opts){ red, 1, 1, 0.1f })
         : mlc_nll_loss(x, t, red, 3);
}

/* On a device a class loss is one launch and its gradient one more, for every reduction and
   option, where one work-group holds the batch (8 rows); a batch of 600 rows takes a second
   launch for a sum or a mean. A pointwise loss (MSE) takes one launch unreduced, two reduced.
   The losses and gradients equal the CPU's. */
static int loss_launches(void) {
    static const mlc_reduction reds[] = { MLC_REDUCE_MEAN, MLC_REDUCE_SUM, MLC_REDUCE_NONE };
    static float xv[600 * 5], tv[600], wv[600];
    mlc_ctx *ctx = test_ctx(6), *cpu = mlc_create(&(mlc_config){ .seed = 6, .quiet = 1, .device = "cpu" });
    int real = ctx && ctx->backend && !fake_of(ctx), b, r, kind, i;
    CHECK(ctx && cpu);
    for (i = 0; i < 600 * 5; i++) xv[i] = 0.37f * (float)((i * 7) % 23) - 4.0f;
    for (i = 0; i < 600; i++) { tv[i] = (float)((i * 3) % 5); wv[i] = 0.5f + 0.25f * (float)(i % 3); }
    for (b = 0; b < 2; b++)
        for (r = 0; r < 3; r++)
            for (kind = 0; kind < 3; kind++) {
                int N = b ? 600 : 8, out = reds[r] == MLC_REDUCE_NONE ? N : 1;
                mlc_frame f = mlc_frame_begin(ctx), fc = mlc_frame_begin(cpu);
                mlc_tensor *x = mlc_requires_grad(mlc_from_data(ctx, MLC_SHAPE(N, 5), xv), 1);
                mlc_tensor *xc = mlc_requires_grad(mlc_from_data(cpu, MLC_SHAPE(N, 5), xv), 1);
                mlc_tensor *loss, *lc;
                size_t before = mlc_get_stats(ctx).launches, forward;
                loss = class_loss_of(kind, x, mlc_from_data(ctx, MLC_SHAPE(N), tv), reds[r]);
                forward = mlc_get_stats(ctx).launches - before;
                lc = class_loss_of(kind, xc, mlc_from_data(cpu, MLC_SHAPE(N), tv), reds[r]);
                CHECK(loss && lc && (int)loss->size == out);
                CHECK_MSG(forward == (real ? (N > 256 && out == 1 ? 2u : 1u) : 0u), "%d rows, reduction %d, kind %d: "
                          "%zu launches", N, r, kind, forward);
                before = mlc_get_stats(ctx).launches;
                CHECK(out == 1 ? mlc_backward(loss) == MLC_OK : mlc_backward_with(loss, mlc_from_data(ctx, MLC_SHAPE(N), wv)) == MLC_OK);
                CHECK_MSG(mlc_get_stats(ctx).launches - before == (real ? 1u : 0u), "%d rows, reduction %d, kind %d: "
                          "%zu launches for the gradient", N, r, kind, mlc_get_stats(ctx).launches - before);
                CHECK(out == 1 ? mlc_backward(lc) == MLC_OK : mlc_backward_with(lc, mlc_from_data(cpu, MLC_SHAPE(N), wv)) == MLC_OK);
                for (i = 0; i < out; i++)
                    CHECK_NEAR(mlc_host_data(loss)[i], lc->data[i], 1e-5 * (1 + fabs(lc->data[i])));
                for (i = 0; i < N * 5; i++) CHECK_NEAR(mlc_host_grad(x)[i], xc->grad[i], 1e-6);
                mlc_frame_end(f);
                mlc_frame_end(fc);
            }
    for (r = 0; r < 3; r++) {
        mlc_frame f = mlc_frame_begin(ctx);
        mlc_tensor *x = mlc_from_data(ctx, MLC_SHAPE(600), xv), *t = mlc_from_data(ctx, MLC_SHAPE(600), tv), *loss;
        size_t before = mlc_get_stats(ctx).launches;
        CHECK((loss = mlc_mse_loss(x, t, reds[r])) != NULL);
        CHECK_MSG(mlc_get_stats(ctx).launches - before == (real ? (reds[r] == MLC_REDUCE_NONE ? 1u : 2u) : 0u),
                  "mse, reduction %d: %zu launches", r, mlc_get_stats(ctx).launches - before);
        for (i = 0; i < (int)loss->size; i++) {
            float d = xv[i] - tv[i], want = reds[r] == MLC_REDUCE_NONE ? d * d : mlc_item(mlc_mse_loss(
                mlc_from_data(cpu, MLC_SHAPE(600), xv), mlc_from_data(cpu, MLC_SHAPE(600), tv), reds[r]));
            CHECK_NEAR(mlc_host_data(loss)[i], want, 1e-5 * (1 + fabs(want)));
        }
        mlc_frame_end(f);
    }
    CHECK_MSG(mlc_error(ctx) == MLC_OK && mlc_error(cpu) == MLC_OK, "%.200s", mlc_error_message(ctx));
    test_destroy(ctx);
    mlc_destroy(cpu);
    return 1;
}

/* ---- gradients that count as zeros on the device ---------------------------------------- */

/* A context with a device: the suite's, else the fake one (verifying); the fake runs mlc_neg on
   its buffers, so a gradient is written on the device on every backend. */
static mlc_ctx *device_ctx(unsigned long long seed) {
    mlc_ctx *ctx = test_ctx(seed);
    if (ctx && !ctx->backend) { test_destroy(ctx); ctx = fake_ctx(seed, NULL); }
    if (fake_of(ctx)) fake_of(ctx)->kernel_neg = fake_of(ctx)->verify = 1;
    return ctx;
}

/* Gradient fills on a context's device, counted by a copy of its backend's table whose fill
   counts and then runs the backend's own (count_fills(ctx, 0) puts the backend back). */
static const mlc__backend *counted_backend;
static mlc__backend counting_backend;
static long grad_fills;
static int counting_fill(mlc_tensor *t, int grad, float value) {
    grad_fills += grad != 0;
    return counted_backend->fill(t, grad, value);
}
static void count_fills(mlc_ctx *ctx, int on) {
    if (on) {
        counted_backend = ctx->backend;
        counting_backend = *ctx->backend;
        counting_backend.fill = counting_fill;
        ctx->backend = &counting_backend;
    } else ctx->backend = counted_backend;
}

/* A small classifier: logits = relu(x W1ᵀ + b1) (-W2)ᵀ + b2 (mlc_neg: a kernel on the fake
   device too), targets equal to 1 ignored, trained by AdamW. */
typedef struct small_net { mlc_ctx *ctx; mlc_tensor *w1, *b1, *w2, *b2, *x, *y; mlc_optim *opt; } small_net;

static int small_net_make(mlc_ctx *ctx, small_net *n) {
    n->ctx = ctx;
    n->w1 = mlc_parameter(ctx, MLC_SHAPE(16, 6)); n->b1 = mlc_parameter(ctx, MLC_SHAPE(16));
    n->w2 = mlc_parameter(ctx, MLC_SHAPE(3, 16)); n->b2 = mlc_parameter(ctx, MLC_SHAPE(3));
    n->x = mlc_randn(ctx, MLC_SHAPE(8, 6));
    n->y = mlc_from_data(ctx, MLC_SHAPE(8), (const float[]){ 0, 1, 2, 1, 0, 2, 2, 0 });
    n->opt = mlc_adamw(ctx, NULL, (mlc_adam_opts){ .lr = 0.01f });
    CHECK(n->w1 && n->b1 && n->w2 && n->b2 && n->x && n->y && n->opt);
    mlc_init_normal(n->w1, 0.0f, 0.5f); mlc_init_normal(n->b1, 0.0f, 0.5f);
    mlc_init_normal(n->w2, 0.0f, 0.5f); mlc_init_normal(n->b2, 0.0f, 0.5f);
    CHECK(mlc_optim_add_param(n->opt, n->w1) == MLC_OK && mlc_optim_add_param(n->opt, n->b1) == MLC_OK);
    CHECK(mlc_optim_add_param(n->opt, n->w2) == MLC_OK && mlc_optim_add_param(n->opt, n->b2) == MLC_OK);
    return 1;
}

/* The loss: a cross-entropy, or on odd steps the NLL of a log-softmax (a kernel that writes
   only the target's element of a row when it adds). */
static mlc_tensor *small_net_loss(small_net *n, int step) {
    mlc_tensor *h = mlc_relu(mlc_linear(n->x, n->w1, n->b1));
    mlc_tensor *logits = mlc_linear(h, mlc_neg(n->w2), n->b2);
    return step % 2 ? mlc_nll_loss(mlc_log_softmax(logits, 1), n->y, MLC_REDUCE_MEAN, 1)
                    : mlc_cross_entropy(logits, n->y, MLC_REDUCE_MEAN, 1);
}

/* A backward pass in a frame, after mlc_zero_grad when zero is set. */
static int small_net_backward(small_net *n, int zero) {
    mlc_frame f = mlc_frame_begin(n->ctx);
    mlc_tensor *loss = small_net_loss(n, 0);
    if (zero) mlc_zero_grad(n->opt);
    CHECK_MSG(mlc_backward(loss) == MLC_OK, "%.200s", mlc_error_message(n->ctx));
    mlc_frame_end(f);
    return 1;
}

/* Frame temporaries of a net's sizes that hold NaN, left on the device as spares: the
   gradient buffers made next come from them, so an element a kernel leaves unwritten shows. */
static void leave_nan_spares(mlc_ctx *ctx, const int *sizes, int count) {
    mlc_frame f = mlc_frame_begin(ctx);
    int i, k;
    for (i = 0; i < count; i++)
        for (k = 0; k < 4; k++) mlc_neg(mlc_full(ctx, MLC_SHAPE(sizes[i]), NAN));
    mlc_frame_end(f);
}

/* mlc_zero_grad writes nothing on the device, and no gradient is filled with zeros in a
   training step with a cross-entropy: the first kernel that writes a gradient writes over it
   (the NLL steps' log-softmax adds into its input's gradient). The losses and the parameters
   still equal the CPU's. */
static int device_zero_grad_fills_nothing(void) {
    mlc_ctx *dev = device_ctx(21), *cpu;
    mlc_config c;
    small_net nd, nc;
    mlc_tensor **pd = &nd.w1, **pc = &nc.w1;
    int s, k;
    size_t i;
    memset(&c, 0, sizeof c);
    c.seed = 21; c.quiet = 1; c.device = "cpu";
    cpu = mlc_create(&c);
    CHECK(dev && dev->backend && cpu);
    if (!small_net_make(dev, &nd) || !small_net_make(cpu, &nc)) return 0;
    for (s = 0; s < 4; s++) {
        mlc_frame f = mlc_frame_begin(cpu);
        mlc_tensor *loss = small_net_loss(&nc, s);
        float want;
        size_t launched;
        mlc_zero_grad(nc.opt);
        CHECK(mlc_backward(loss) == MLC_OK);
        mlc_step(nc.opt);
        want = mlc_item(loss);
        mlc_frame_end(f);
        leave_nan_spares(dev, (const int[]){ 8 * 3, 3 * 16, 8 * 16 }, 3);
        f = mlc_frame_begin(dev);
        loss = small_net_loss(&nd, s);
        count_fills(dev, 1);
        grad_fills = 0;
        launched = mlc_get_stats(dev).launches;
        mlc_zero_grad(nd.opt);
        CHECK(mlc_get_stats(dev).launches == launched);      /* it only marks the gradients */
        CHECK(mlc_backward(loss) == MLC_OK);
        mlc_step(nd.opt);
        count_fills(dev, 0);
        CHECK_MSG(s % 2 || grad_fills == 0, "step %d: %ld gradients filled with zeros", s, grad_fills);
        CHECK_NEAR(mlc_item(loss), want, 1e-5 * (1 + fabs(want)));
        mlc_frame_end(f);
    }
    for (k = 0; k < 4; k++)                                  /* w1, b1, w2, b2 */
        for (i = 0; i < pd[k]->size; i++) {
            float got = mlc_host_data(pd[k])[i], want = pc[k]->data[i];
            CHECK_MSG(fabsf(got - want) <= 1e-4f * (1 + fabsf(want)),
                      "parameter %d[%zu]: %.9g vs %.9g on the CPU", k, i, got, want);
        }
    CHECK_MSG(mlc_error(dev) == MLC_OK, "%.200s", mlc_error_message(dev));
    test_destroy(dev);
    mlc_destroy(cpu);
    return 1;
}

/* A small CNN: x [4, 1, 8, 8] -> conv 3x3 to 3 channels (padding 1) -> batch norm -> relu ->
   max pool 2 -> conv 3x3 to 4 channels (padding 1; its input's gradient comes through col2im)
   -> dropout 0.25 -> flatten -> linear to 3 classes, a cross-entropy; trained by AdamW. */
typedef struct small_cnn { mlc_ctx *ctx; mlc_tensor *p[8], *mean, *var, *x, *y, *dropped; mlc_optim *opt; } small_cnn;
#define CNN_SIZES { 4 * 3, 4 * 3 * 4 * 4, 4 * 4 * 4 * 4, 4 * 3 * 8 * 8 }   /* its temporaries */

static int small_cnn_make(mlc_ctx *ctx, small_cnn *n) {
    static const int shapes[8][5] = { { 4, 3, 1, 3, 3 }, { 1, 3 }, { 1, 3 }, { 1, 3 }, { 4, 4, 3, 3, 3 }, { 1, 4 },
                                      { 2, 3, 64 }, { 1, 3 } };   /* rank, then the shape */
    int k;
    n->ctx = ctx;
    n->opt = mlc_adamw(ctx, NULL, (mlc_adam_opts){ .lr = 0.01f });
    for (k = 0; k < 8; k++) {
        n->p[k] = mlc_parameter(ctx, shapes[k][0], shapes[k] + 1);
        CHECK(n->p[k] && mlc_optim_add_param(n->opt, n->p[k]) == MLC_OK);
        mlc_init_normal(n->p[k], k == 2 ? 1.0f : 0.0f, 0.5f);      /* p[2]: the batch norm's scale */
    }
    n->mean = mlc_zeros(ctx, MLC_SHAPE(3)); n->var = mlc_ones(ctx, MLC_SHAPE(3));
    n->x = mlc_randn(ctx, MLC_SHAPE(4, 1, 8, 8));
    n->y = mlc_from_data(ctx, MLC_SHAPE(4), (const float[]){ 0, 2, 1, 2 });
    CHECK(n->opt && n->mean && n->var && n->x && n->y);
    return 1;
}

/* The loss; mask NULL: mlc_dropout draws one, else the dropout is a product with mask. */
static mlc_tensor *small_cnn_loss(small_cnn *n, const float *mask) {
    mlc_tensor **p = n->p, *h = mlc_conv2d(n->x, p[0], p[1], (mlc_conv_opts){ .padding = 1 });
    h = mlc_max_pool2d(mlc_relu(mlc_batch_norm(h, n->mean, n->var, p[2], p[3], 1, 0.1f, 1e-5f)), 2, 0, 0);
    h = mlc_conv2d(h, p[4], p[5], (mlc_conv_opts){ .padding = 1 });
    n->dropped = mask ? mlc_mul(h, mlc_from_data(n->ctx, MLC_SHAPE(4, 4, 4, 4), mask)) : mlc_dropout(h, 0.25f, 1);
    return mlc_cross_entropy(mlc_linear(mlc_flatten(n->dropped, 1), p[6], p[7]), n->y, MLC_REDUCE_MEAN, MLC_NO_IGNORE);
}

/* The keep-scales mlc_dropout applied to make y: the device's hash of its seed, or the CPU's draws. */
static void dropout_mask_of(const mlc_tensor *y, float *mask) {
    const mlc__node *n = y->node;
    size_t i;
    for (i = 0; i < y->size; i++)
        mask[i] = n->device ? mlc__dropout_scale(n->args.dropout.seed, (uint32_t)i, n->args.dropout.p)
                            : ((const float *)n->saved)[i];
}

/* A CNN training step on a device fills no gradient with zeros: the backward of each of its
   ops (the linear, dropout, flatten, both convolutions with their biases and col2im, max pool,
   relu, batch norm) writes over a gradient that counts as zeros; the gradients equal the CPU's,
   with NaN in the spares the temporary gradients come from, over steps that reuse the buffers. */
static int device_cnn_step_fills_nothing(void) {
    static const int sizes[] = CNN_SIZES;
    mlc_ctx *dev = device_ctx(23), *cpu = mlc_create(&(mlc_config){ .seed = 23, .quiet = 1, .device = "cpu" });
    small_cnn nd, nc;
    float mask[256];
    int s, k;
    size_t i;
    CHECK(dev && dev->backend && cpu);
    if (!small_cnn_make(dev, &nd) || !small_cnn_make(cpu, &nc)) return 0;
    for (s = 0; s < 3; s++) {
        mlc_frame fd, fc;
        mlc_tensor *ld, *lc;
        leave_nan_spares(dev, sizes, 4);
        fd = mlc_frame_begin(dev);
        count_fills(dev, 1);
        grad_fills = 0;
        ld = small_cnn_loss(&nd, NULL);
        mlc_zero_grad(nd.opt);
        CHECK_MSG(mlc_backward(ld) == MLC_OK, "%.200s", mlc_error_message(dev));
        count_fills(dev, 0);
        CHECK_MSG(grad_fills == 0, "step %d: %ld gradients filled with zeros", s, grad_fills);
        CHECK(nd.dropped->size == 256);
        dropout_mask_of(nd.dropped, mask);
        fc = mlc_frame_begin(cpu);
        lc = small_cnn_loss(&nc, mask);
        mlc_zero_grad(nc.opt);
        CHECK(mlc_backward(lc) == MLC_OK);
        CHECK_NEAR(mlc_item(ld), mlc_item(lc), 1e-5 * (1 + fabs(mlc_item(lc))));
        for (k = 0; k < 8; k++)
            for (i = 0; i < nd.p[k]->size; i++) {
                float got = mlc_host_grad(nd.p[k])[i], want = nc.p[k]->grad[i];
                CHECK_MSG(fabsf(got - want) <= 1e-4f * (1 + fabsf(want)),
                          "step %d, parameter %d[%zu]: gradient %.9g, %.9g on the CPU", s, k, i, got, want);
            }
        mlc_step(nd.opt);
        mlc_step(nc.opt);
        mlc_frame_end(fd);
        mlc_frame_end(fc);
    }
    CHECK_MSG(mlc_error(dev) == MLC_OK, "%.200s", mlc_error_message(dev));
    test_destroy(dev);
    mlc_destroy(cpu);
    return 1;
}

/* The net's gradients equal want[] times k (zeros exactly; else within rounding: a product
   that adds into C need not round as C plus the product). */
static int small_net_grads_are(small_net *n, const float *want, float k) {
    mlc_tensor **p = &n->w1;
    int j;
    size_t i;
    for (j = 0; j < 4; want += p[j]->size, j++)
        for (i = 0; i < p[j]->size; i++) {
            float got = mlc_host_grad(p[j])[i], w = k * want[i];
            CHECK_MSG(k == 0.0f ? test_same_float(got, 0.0f) : fabsf(got - w) <= 1e-6f * (1 + fabsf(w)),
                      "parameter %d[%zu]: %.9g, want %g x %.9g", j, i, got, k, want[i]);
        }
    return 1;
}

/* Gradients on the device: a second backward without mlc_zero_grad adds (with the launches of
   one after it), a read in between changes nothing; after mlc_zero_grad a read (mlc_host_grad,
   mlc_clip_grad_norm, mlc_to) gives zeros without a download, and the next backward adds its
   gradient to those zeros. */
static int device_grads_accumulate(void) {
    mlc_ctx *ctx = device_ctx(22);
    small_net n;
    mlc_tensor **p = &n.w1;
    float g[16 * 6 + 16 + 3 * 16 + 3];
    size_t launched, with_zero, downloads;
    int j, at = 0;
    CHECK(ctx && ctx->backend);
    if (!small_net_make(ctx, &n) || !small_net_backward(&n, 1)) return 0;
    for (j = 0; j < 4; at += (int)p[j]->size, j++)
        memcpy(g + at, mlc_host_grad(p[j]), p[j]->size * sizeof(float));
    launched = mlc_get_stats(ctx).launches;
    count_fills(ctx, 1);
    grad_fills = 0;
    if (!small_net_backward(&n, 1)) return 0;
    count_fills(ctx, 0);
    CHECK(grad_fills == 0);
    with_zero = mlc_get_stats(ctx).launches - launched;
    launched = mlc_get_stats(ctx).launches;
    if (!small_net_backward(&n, 0)) return 0;                /* adds */
    CHECK(mlc_get_stats(ctx).launches - launched == with_zero);
    if (!small_net_grads_are(&n, g, 2.0f)) return 0;
    if (!small_net_backward(&n, 1) || !small_net_grads_are(&n, g, 1.0f)) return 0;   /* read in between */
    if (!small_net_backward(&n, 0) || !small_net_grads_are(&n, g, 2.0f)) return 0;
    mlc_zero_grad(n.opt);
    downloads = mlc_get_stats(ctx).downloads;
    if (!small_net_grads_are(&n, g, 0.0f)) return 0;
    CHECK(mlc_clip_grad_norm(n.opt, 1.0f) == 0.0f);
    CHECK(mlc_get_stats(ctx).downloads == downloads);         /* zeros need no download */
    if (!small_net_backward(&n, 0) || !small_net_grads_are(&n, g, 1.0f)) return 0;   /* onto host zeros */
    CHECK(small_net_backward(&n, 1) && mlc_clip_grad_norm(n.opt, 1e30f) > 0.0f);     /* both copies current */
    mlc_zero_grad(n.opt);
    downloads = mlc_get_stats(ctx).downloads;
    CHECK(mlc_to(n.w2, 0) == n.w2 && !n.w2->on_device);
    CHECK(mlc_get_stats(ctx).downloads == downloads);         /* the data is current, the gradient zeros */
    for (j = 0; j < 3 * 16; j++) CHECK(test_same_float(n.w2->grad[j], 0.0f));
    CHECK(mlc_to(n.w2, 1) == n.w2);
    if (!small_net_backward(&n, 0) || !small_net_grads_are(&n, g, 1.0f)) return 0;
    CHECK_MSG(mlc_error(ctx) == MLC_OK, "%.200s", mlc_error_message(ctx));
    test_destroy(ctx);
    return 1;
}

const test_case tests_device[] = {
    TEST(best_is_a_gpu_else_the_cpu_silently)
    TEST(explicit_device_that_is_not_there_fails)
    TEST(device_name_says_where_ops_run)
    TEST(op_falls_back)
    TEST(training_matches_cpu)
    TEST(step_takes_runs_of_device_parameters)
    TEST(to_moves_tensor_and_grad)
    TEST(inputs_on_two_devices)
    TEST(host_writes_reach_device)
    TEST(backward_on_device)
    TEST(frames_release_device_temporaries)
    TEST(verify_catches_unannounced_writes)
    TEST(device_out_of_memory)
    TEST(launches_counted)
    TEST(loss_launches)
    TEST(device_zero_grad_fills_nothing)
    TEST(device_cnn_step_fills_nothing)
    TEST(device_grads_accumulate)
#ifdef MLC_OPENCL
    TEST(opencl_bad_device_names)
    TEST(opencl_takes_any_device)
    TEST(opencl_device_named)
    TEST(opencl_write_after_upload)
    TEST(opencl_gemm_kernels_agree)
    TEST(opencl_build_failure)
    TEST(opencl_formulas_build_alone)
    TEST(opencl_argument_bytes_checked)
#endif
    { NULL, NULL }
};
