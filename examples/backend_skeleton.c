/* backend_skeleton.c - the starting point for a new mlc backend (Vulkan, Metal, CUDA, ...)

   A complete backend, device "fake", whose "device memory" is malloc'd host memory. It has a
   kernel for one op (mlc_neg, forward and backward) and one optimiser step, both off by
   default: out of the box it declines every op, so each one falls back to the CPU through the
   host copies, exactly as an op a real backend lacks. The test suite runs on it
   (MLC_TEST_FAKE_DEVICE=1 make test's second run; tests/test_device.c #includes this file), and
   built alone it trains a small model on it (`make examples`, then ./build/backend_skeleton).

   The contract every member below honours is written down in docs/backends.md: the table
   (return conventions), what each op's node carries, the books the core keeps for you and the
   core helpers a backend may call. This file and that page are all a backend writer needs;
   mlc_opencl.h is the full-size example.

   To start a backend of your own:
     1. Copy this file to mlc_yours.h (a header, as mlc_opencl.h is) and rename fake_ / "fake".
        Drop main(), the test hooks (the fields of fake_device marked so, fake_check) and the
        two #defines and the #include "mlc.h" below (mlc.h includes a backend's header at the
        end of its implementation, so all of mlc.h is in scope there).
     2. open: recognise your device spec ("vulkan", "vulkan:N"), open the device, keep your state
        in ctx->device, set ctx->backend and ctx->device_name. devices: list your devices.
     3. create / release / upload / download / fill / wait / destroy: your API's buffers and
        copies. The core decides when to copy and keeps the books (which copy is current, frame
        temporaries, spares, peak bytes); these only move bytes.
     4. kernels + run: start with every entry of kernels[] 0: every op falls back, so results
        are right from day one. Then add one op at a time: set its entry to 1, add its case to
        run(), forward and backward, taking its buffers from mlc__device_in / mlc__device_out /
        mlc__device_grad / mlc__device_grad_to_overwrite. MLC_DEVICE=yours ./build/test runs
        every suite on your device against the CPU's results, and fails each test in which an
        op still falls back, naming the op: the list of what is left.
     5. step: the optimiser update on the device (return 0 until you have it).
     6. Register it: a line in mlc__registry at the end of mlc.h behind your own switch
        (#ifdef MLC_YOURS, as MLC_OPENCL is), or, from a program, #define MLC_EXTRA_BACKEND as
        the name of a function returning your table (as this file does).

   How fallback works. The core hands an op on device tensors to run() only when
   kernels[op] is 1; when kernels[op] is 0, or run() returns 0 without setting an error, the core
   brings the inputs' host copies up to date (download, when the device copy is newer), runs the
   CPU code, marks the output's device copy stale (uploaded when a device op next reads it) and
   counts a fallback (mlc_stats.fallbacks; logged once per op). Backward: a node whose forward
   ran on the device goes back to run(ctx, n, 1); a 0 there falls back the same way. mlc_step
   gives step() each run of consecutive device parameters; 0 means the CPU updates the first.
   A backend is therefore never wrong by lacking an op, only slower. */
#define MLC_IMPLEMENTATION
#define MLC_EXTRA_BACKEND fake_backend_get   /* the registry offers "fake" to mlc_create */
#include <stdlib.h>
#include <string.h>
#include "mlc.h"

/* The backend's state, one per context (ctx->device). A real backend keeps its device, queue,
   compiled kernels here. */
typedef struct fake_step_call { int first, count, done; } fake_step_call;   /* one call of step */
#define FAKE_STEPS 64
typedef struct fake_device {
    const char *op;                 /* the op being run, for messages and buffer errors */
    /* Test hooks: tests/test_device.c sets these; a real backend has none of them.
         kernel_neg  run mlc_neg "on the device" (forward and backward on the device buffers);
         kernel_step step updates up to 3 parameters a call "on the device";
         verify      each op first checks the core's books on its inputs (fake_check): a tensor
                     whose two copies are both marked current must hold the same values in both,
                     and a newer host copy is uploaded; MLC_TEST_FAKE_DEVICE=1 runs every suite so;
         limit_bytes > 0: a "device" that holds no more than this (create returns NULL past it);
         steps       the first calls of step, as (first, count, done). */
    int kernel_neg, kernel_step, verify;
    size_t limit_bytes;
    fake_step_call steps[FAKE_STEPS];
    int n_steps;
} fake_device;

static const mlc__backend *fake_backend_get(void);

/* ---- open: mlc_create offers each backend the device spec ------------------------------- */

/* Put the fake device on a context that runs on the CPU and holds no tensors yet (tests call
   this directly, on a context made with device "cpu"). 1: done; 0: not (an error is set). */
static int fake_install(mlc_ctx *ctx) {
    fake_device *fd;
    if (!ctx || ctx->error || ctx->backend) return 0;
    fd = (fake_device *)mlc__heap_alloc(ctx, sizeof *fd);   /* the user's allocator, counted */
    if (!fd) { mlc__fail(ctx, MLC_ERR_MEMORY, "fake device: out of memory"); return 0; }
    memset(fd, 0, sizeof *fd);
    ctx->device = fd;
    ctx->backend = fake_backend_get();
    /* ctx->device_name is left empty, so mlc_device_name says the backend's name, "fake"; a
       real backend names the device: "opencl:1 NVIDIA H100 80GB HBM3" */
    return 1;
}

/* 1: opened (ctx->backend and ctx->device set); 0: spec is none of ours (the next backend is
   asked), or it is ours and failed (then with the error set: mlc__fail). Decline "best" unless
   you have a real device to offer. */
static int fake_open(mlc_ctx *ctx, const char *spec) {
    if (strcmp(spec, "fake") != 0) return 0;
    return fake_install(ctx);
}

/* devices: rows of mlc_devices (see mlc_device_info); up to max rows into out (out may be NULL),
   returning how many devices there are. The fake lists none (the member is NULL in the table),
   so `test --devices` still means "an OpenCL device exists". */

/* ---- buffers: create, release (the core keeps the books and calls these) ---------------- */

/* A new device buffer of `bytes` (at least 4). NULL: the device is full (the core releases its
   spare buffers and asks once more, then fails with MLC_ERR_MEMORY naming the op), or an error
   the backend set. Never called twice for the same tensor: the core reuses spares by size. */
static void *fake_create(mlc_ctx *ctx, size_t bytes) {
    fake_device *fd = (fake_device *)ctx->device;
    void *buffer;
    if (fd->limit_bytes && ctx->stats.device_bytes_current + bytes > fd->limit_bytes) return NULL;  /* full */
    /* all bits set: NaN, so a read of what nobody wrote shows */
    if ((buffer = malloc(bytes)) != NULL) memset(buffer, 0xff, bytes);
    return buffer;
}
static void fake_release(mlc_ctx *ctx, void *buffer) { (void)ctx; free(buffer); }

/* t's data (grad 0) or gradient buffer on the device, made when missing (mlc__buffer_of). */
static float *fake_buffer(mlc_tensor *t, int grad) {
    const char *op = ((fake_device *)t->ctx->device)->op;
    return (float *)mlc__buffer_of(t, grad, op ? op : "fake device");
}

/* ---- copies: upload, download, fill, wait ----------------------------------------------- */

/* host -> device: t->data (or t->grad) into its buffer, made with mlc__buffer_of when missing.
   1: done (it may still be in flight: wait finishes it); 0: the error is set. The core clears
   the stale flag; the backend only copies and counts. */
static int fake_upload(mlc_tensor *t, int grad) {
    void *dst = fake_buffer(t, grad);
    const void *src = mlc__host_copy_of(t, grad);     /* t->data, t->half (bf16, f16) or t->grad */
    if (!dst) return 0;
    if (!src) {
        mlc__fail(t->ctx, MLC_ERR_DEVICE, "fake device: %T has no host %s to upload", t,
                  grad ? "gradient" : "data");
        return 0;
    }
    memcpy(dst, src, mlc__bytes_of(t, grad));
    t->ctx->stats.uploads++;
    return 1;
}

/* device -> host, finished before it returns (the caller reads t->data next). 1 / 0 as upload. */
static int fake_download(mlc_tensor *t, int grad) {
    const void *src = grad ? t->device_grad : t->device_data;
    void *dst = mlc__host_copy_of(t, grad);
    if (!src || !dst) {
        mlc__fail(t->ctx, MLC_ERR_DEVICE, "fake device: %T has no device %s to download", t,
                  grad ? "gradient" : "data");
        return 0;
    }
    memcpy(dst, src, mlc__bytes_of(t, grad));
    t->ctx->stats.downloads++;
    return 1;
}

/* Every element of t's data (grad 0) or gradient buffer on the device = value; the buffer is
   made when missing. 1 / 0 as upload. (The core uses it for gradients that count as zeros.) */
static int fake_fill(mlc_tensor *t, int grad, float value) {
    float *d = fake_buffer(t, grad);
    size_t i;
    if (!d) return 0;
    for (i = 0; i < t->size; i++) d[i] = value;
    return 1;
}

/* Finish reading host memory: every upload in flight (all 0: before the core reuses or writes
   host memory: mlc_frame_end, mlc_write), or every op given so far (all 1: mlc_sync). The
   fake copies synchronously, so there is nothing to wait for. */
static void fake_wait(mlc_ctx *ctx, int all) { (void)ctx; (void)all; }

/* The context ends: the core has already released every buffer through release; free the
   backend's own state. */
static void fake_destroy(mlc_ctx *ctx) {
    mlc__heap_free(ctx, ctx->device);
    ctx->device = NULL;
    ctx->backend = NULL;
}

/* ---- kernels and run: the ops ------------------------------------------------------------ */

/* Test hook (verify): both copies marked current must agree; a newer host copy of the data goes
   up. Input k of op. 1: fine; 0: the error is set. */
static int fake_check(mlc_ctx *ctx, mlc_tensor *t, const char *op, int k) {
    const unsigned grad_stale = MLC__GRAD_HOST_STALE | MLC__GRAD_DEVICE_STALE | MLC__GRAD_ZERO;
    if (!t || !t->on_device) return 1;
    if (t->grad && t->device_grad && !(t->stale & grad_stale) &&
        memcmp(t->grad, t->device_grad, t->size * sizeof(float)) != 0) {
        mlc__fail(ctx, MLC_ERR_DEVICE, "fake device: %s: the gradient copies of input %d %T are both marked "
                  "current but differ", op, k, t);
        return 0;
    }
    if (t->stale & MLC__DEVICE_STALE) {
        if (!fake_upload(t, 0)) return 0;
        t->stale &= ~(unsigned)MLC__DEVICE_STALE;
    } else if (!(t->stale & MLC__HOST_STALE) && t->device_data &&
               memcmp(mlc__host_copy_of(t, 0), t->device_data, mlc__bytes_of(t, 0)) != 0) {
        mlc__fail(ctx, MLC_ERR_DEVICE, "fake device: %s: the host copy of input %d %T changed without "
                  "mlc_write (its device copy differs)", op, k, t);
        return 0;
    }
    return 1;
}

/* One op's kernel, forward and backward: y = -x; dx = -dy (+ the dx already there).
   Forward: the input's buffer, current (mlc__device_in uploads a newer host copy), and the
   output's (mlc__device_out makes it); the core marks the output's host copy stale after.
   Backward: dy (mlc__device_grad, current), and dx to add into: with
   mlc__device_grad_to_overwrite the kernel writes dx = -dy + beta dx, and beta is 0 when dx
   counts as zeros, so no zeros are written first. Only inputs that require a gradient get one. */
static int fake_neg(mlc_ctx *ctx, mlc__node *n, int backward) {
    mlc_tensor *x = n->in[0], *y = n->out;
    const float *src;
    float *dst, beta;
    size_t i;
    if (!backward) {
        if (!fake_check(ctx, x, n->name, 0)) return 0;   /* (test hook: the books agree) */
        src = (const float *)mlc__device_in(x);
        dst = (float *)mlc__device_out(y, n->name);
        if (!src || !dst) return 0;                 /* the error is set: the core sees it */
        for (i = 0; i < y->size; i++) dst[i] = -src[i];
        return 1;
    }
    if (!x->requires_grad) return 1;
    src = (const float *)mlc__device_grad(y, 0, n->name);
    dst = src ? (float *)mlc__device_grad_to_overwrite(x, &beta, n->name) : NULL;
    if (!dst) return 0;
    for (i = 0; i < x->size; i++) dst[i] = beta != 0.0f ? beta * dst[i] - src[i] : -src[i];
    return 1;
}

/* kernels[op]: 1 where run() has the op. The core asks run() only for these (and falls back
   for the rest without asking). The fake offers every op, so that verify sees each op's inputs,
   and then declines all but mlc_neg; a real backend sets 1 only where it has kernels. */
#define FAKE_OFFERS(name, ...) 1,
static const unsigned char fake_kernels[] = { MLC__OPS(FAKE_OFFERS) };
#undef FAKE_OFFERS
typedef char fake_kernels_cover_every_op[sizeof fake_kernels == MLC__OP_COUNT ? 1 : -1];

/* Run node n forward (backward 0) or backward (1) on the device. 1: it ran here (or failed,
   with the error set); 0: declined, and the CPU runs it (a fallback). Switch on n->op, and
   inside an op on its kind (n->args); docs/backends.md says what each op's node carries. */
static int fake_run(mlc_ctx *ctx, mlc__node *n, int backward) {
    fake_device *fd = (fake_device *)ctx->device;
    int k;
    fd->op = n->name;
    if (!backward && fd->verify)
        for (k = 0; k < n->n_in; k++) if (!fake_check(ctx, n->in[k], n->name, k)) return 0;
    switch (n->op) {
    case MLC__OP_UNARY:
        if (fd->kernel_neg && n->args.unary.kind == MLC__UNARY_NEG) return fake_neg(ctx, n, backward);
        return 0;
    default:
        return 0;                                   /* no kernel: the CPU runs it */
    }
}

/* ---- step: the optimiser update ---------------------------------------------------------- */

/* Update parameters first .. first + count - 1 of opt (all on the device) with their gradients
   and state (opt->state[3 i + k], NULL where the rule keeps none); return how many of them, from
   the first, it updated (one launch may take several). 0: none, and the CPU updates `first`
   (a fallback). The core marks the updated parameters' and states' host copies stale.
   The fake declines, or with kernel_step updates up to 3 a call with the CPU's own loops
   (mlc__update) on the device buffers; each call is recorded in steps[]. */
static int fake_step(mlc_optim *opt, int first, int count) {
    fake_device *fd = (fake_device *)opt->ctx->device;
    int done = fd->kernel_step ? (count < 3 ? count : 3) : 0, i, k;
    fd->op = "mlc_step";
    if (fd->n_steps < FAKE_STEPS) {
        fake_step_call call;
        call.first = first; call.count = count; call.done = done;
        fd->steps[fd->n_steps++] = call;
    }
    for (i = first; fd->verify && i < first + (done ? done : 1); i++) {   /* the parameters it reads */
        if (!fake_check(opt->ctx, opt->params[i], "mlc_step", 0)) return 0;
        for (k = 0; k < 3; k++) if (!fake_check(opt->ctx, opt->state[3 * i + k], "mlc_step", 1 + k)) return 0;
    }
    for (i = first; i < first + done; i++) {
        mlc_tensor *p = opt->params[i], **st = opt->state + 3 * i;
        float *pd = (float *)mlc__device_in(p), *g = (float *)mlc__device_grad(p, 0, "mlc_step"), *s[3];
        for (k = 0; k < 3; k++) s[k] = st[k] ? (float *)mlc__device_in(st[k]) : NULL;
        if (!pd || !g || (st[0] && !s[0]) || (st[1] && !s[1]) || (st[2] && !s[2])) return 0;
        mlc__update(opt, p->size, pd, g, s[0], s[1], s[2]);
    }
    return done;
}

/* ---- the table ---------------------------------------------------------------------------- */

static const mlc__backend fake_backend = {
    "fake",             /* name: mlc_device_name's answer when ctx->device_name is empty */
    fake_open,          /* open */
    NULL,               /* devices: none listed */
    fake_kernels,       /* kernels[MLC__OP_COUNT] */
    fake_run,           /* run */
    fake_step,          /* step */
    fake_fill,          /* fill */
    fake_upload,        /* upload */
    fake_download,      /* download */
    fake_create,        /* create */
    fake_release,       /* release */
    fake_wait,          /* wait */
    fake_destroy        /* destroy */
};
static const mlc__backend *fake_backend_get(void) { return &fake_backend; }

/* ---- a program on the fake device ---------------------------------------------------------- */
#ifndef BACKEND_SKELETON_NO_MAIN   /* (tests/test_device.c includes this file without it) */
#include <stdio.h>

/* `steps` Adam steps of a small MLP, each step's loss into losses[]. 0: an error (printed). */
static int train(mlc_ctx *ctx, int steps, float *losses) {
    mlc_module *hidden = mlc_nn_linear(ctx, 4, 8);   /* one a statement: the same draws everywhere */
    mlc_module *out = mlc_nn_linear(ctx, 8, 1);
    mlc_module *model = mlc_nn_sequential(ctx, hidden, mlc_nn_tanh(ctx), out, NULL);
    mlc_tensor *x = mlc_randn(ctx, MLC_SHAPE(16, 4));
    mlc_tensor *y = mlc_randn(ctx, MLC_SHAPE(16, 1));
    mlc_adam_opts config;
    mlc_optim *opt;
    int s;
    memset(&config, 0, sizeof config);              /* zero: the defaults */
    config.lr = 0.05f;
    opt = mlc_adam(ctx, model, config);
    for (s = 0; s < steps; s++) {
        mlc_frame frame = mlc_frame_begin(ctx);
        mlc_tensor *loss = mlc_mse_loss(mlc_forward(model, x), y, MLC_REDUCE_MEAN);
        mlc_zero_grad(opt);
        mlc_backward(loss);
        mlc_step(opt);
        losses[s] = mlc_item(loss);
        mlc_frame_end(frame);
    }
    if (mlc_error(ctx) != MLC_OK) { fprintf(stderr, "error: %s\n", mlc_error_message(ctx)); return 0; }
    return 1;
}

/* The same training on the CPU and on the fake device (every op falling back, then with the
   fake's step kernel): the losses must be equal bit for bit, since the fallbacks run the CPU's
   code on the same values. */
int main(int argc, char **argv) {
    enum { STEPS = 5 };
    float cpu_losses[STEPS], fake_losses[STEPS], step_losses[STEPS];
    mlc_config config;
    mlc_ctx *cpu, *fake, *stepping;
    int ok;
    if (argc > 1) {                      /* no options: --help prints this and exits 0, others 2 */
        int help = strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0;
        if (!help) fprintf(stderr, "unknown argument %s\n", argv[1]);
        fprintf(help ? stdout : stderr, "usage: %s\n"
                "Trains a small model for %d steps on the CPU and on the fake device (every op falling\n"
                "back, then with its step kernel) and checks that the losses are equal.\n", argv[0], STEPS);
        return help ? 0 : 2;
    }
    memset(&config, 0, sizeof config);
    config.seed = 7; config.quiet = 1;              /* quiet: no line per op falling back */
    config.device = "cpu";
    cpu = mlc_create(&config);
    config.device = "fake";                         /* opened through the registry */
    fake = mlc_create(&config);
    stepping = mlc_create(&config);
    if (!cpu || !fake || !stepping) return 1;
    if (mlc_error(fake) != MLC_OK) { fprintf(stderr, "error: %s\n", mlc_error_message(fake)); return 1; }
    ((fake_device *)stepping->device)->kernel_step = 1;
    ok = train(cpu, STEPS, cpu_losses) && train(fake, STEPS, fake_losses)
         && train(stepping, STEPS, step_losses);
    printf("device: %s; loss %.6f -> %.6f (cpu %.6f -> %.6f)\n", mlc_device_name(fake),
           (double)fake_losses[0], (double)fake_losses[STEPS - 1], (double)cpu_losses[0],
           (double)cpu_losses[STEPS - 1]);
    printf("fake device: %zu fallbacks, %zu uploads, %zu downloads; with its step kernel: %zu fallbacks\n",
           mlc_get_stats(fake).fallbacks, mlc_get_stats(fake).uploads, mlc_get_stats(fake).downloads,
           mlc_get_stats(stepping).fallbacks);
    ok = ok && memcmp(cpu_losses, fake_losses, sizeof cpu_losses) == 0
            && memcmp(cpu_losses, step_losses, sizeof cpu_losses) == 0
            && mlc_get_stats(fake).fallbacks > 0
            && mlc_get_stats(stepping).fallbacks < mlc_get_stats(fake).fallbacks;
    printf("%s\n", ok ? "backend_skeleton: the fake device trains as the CPU does"
                      : "FAIL backend_skeleton: the fake device differs from the CPU");
    mlc_destroy(cpu);
    mlc_destroy(fake);
    mlc_destroy(stepping);
    return ok ? 0 : 1;
}
#endif
