/* The digits CNN on a Cortex-M4F (make embedded runs it under qemu-system-arm, MPS2-AN386):
   weights and test digits from model.h (written by export.c) stay in flash, wrapped with
   mlc_from_const; every op result comes from a static arena, and the few long-lived objects
   (the context, the tensor structs over the weights) from a static pool (board.h). No malloc,
   no stdio: output goes through semihosting. Built for the host too (same source, stdout), as
   a check. main_int8.c is the int8 build of the same network. */
#define MLC_NO_MALLOC
#define MLC_FLOAT_ONLY                      /* sums in float: the FPU has no double */
#define MLC_NO_STDIO
#define MLC_IMPLEMENTATION
#include "mlc.h"
#include "model.h"
#include "board.h"

static unsigned char arena[20 * 1024] __attribute__((aligned(32)));

typedef struct { mlc_tensor *w, *b; } conv_layer;
typedef struct { mlc_tensor *mean, *var, *w, *b; } norm_layer;
typedef struct { conv_layer conv1, conv2, fc; norm_layer bn1, bn2; } digits_cnn;

#define WRAP(ctx, array, ...) mlc_from_const(ctx, MLC_SHAPE(__VA_ARGS__), array)

/* conv 3x3 - batch norm - ReLU - max pool 2, as the modules of examples/digits.c do it, into
   out (made before): the block runs in a frame of its own that keeps only out, so the arena
   holds one block's temporaries at a time. */
static mlc_tensor *block(mlc_tensor *x, const conv_layer *c, const norm_layer *n, mlc_tensor *out) {
    mlc_frame f = mlc_frame_begin(x->ctx);
    mlc_tensor *y = mlc_conv2d(x, c->w, c->b, (mlc_conv_opts){ .padding = 1 });
    y = mlc_batch_norm(y, n->mean, n->var, n->w, n->b, 0, 0.0f, 0.0f);   /* eval: running statistics */
    y = mlc_max_pool2d(mlc_relu(y), 2, 2, 0);
    if (y) mlc_write(out, mlc_host_data(y), y->size);
    mlc_frame_end(f);
    return y ? out : NULL;
}

int main(void) {
    mlc_ctx *ctx = board_context(arena, sizeof arena);
    digits_cnn net;
    char line[128] = "predictions:", *s = line + 12;
    int i;
    if (!ctx) { emit("mlc_create failed\n"); return 1; }
    net.conv1.w = WRAP(ctx, w_1_weight, 16, 1, 3, 3);   net.conv1.b = WRAP(ctx, w_1_bias, 16);
    net.bn1.w = WRAP(ctx, w_2_weight, 16);              net.bn1.b = WRAP(ctx, w_2_bias, 16);
    net.bn1.mean = WRAP(ctx, w_2_running_mean, 16);     net.bn1.var = WRAP(ctx, w_2_running_var, 16);
    net.conv2.w = WRAP(ctx, w_5_weight, 32, 16, 3, 3);  net.conv2.b = WRAP(ctx, w_5_bias, 32);
    net.bn2.w = WRAP(ctx, w_6_weight, 32);              net.bn2.b = WRAP(ctx, w_6_bias, 32);
    net.bn2.mean = WRAP(ctx, w_6_running_mean, 32);     net.bn2.var = WRAP(ctx, w_6_running_var, 32);
    net.fc.w = WRAP(ctx, w_11_weight, 10, 128);         net.fc.b = WRAP(ctx, w_11_bias, 10);
    for (i = 0; i < HELD_OUT && !mlc_error(ctx); i++) {    /* one digit at a time */
        mlc_frame f = mlc_frame_begin(ctx);
        mlc_tensor *x = mlc_from_data(ctx, MLC_SHAPE(1, 1, 8, 8), held_out + i * 64);   /* in the arena */
        mlc_tensor *h1 = mlc_empty(ctx, MLC_SHAPE(1, 16, 4, 4)), *h2 = mlc_empty(ctx, MLC_SHAPE(1, 32, 2, 2));
        mlc_tensor *h = block(block(x, &net.conv1, &net.bn1, h1), &net.conv2, &net.bn2, h2);
        mlc_tensor *pred = mlc_argmax(mlc_linear(mlc_flatten(h, 1), net.fc.w, net.fc.b), 1);
        if (pred) { *s++ = ' '; s = put_int(s, (size_t)mlc_get(pred, 0)); }
        mlc_frame_end(f);
    }
    *s++ = '\n'; *s = '\0';
    return board_report(ctx, line);
}
