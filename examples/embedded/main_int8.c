/* The int8 build of main.c's digits CNN on a Cortex-M4F (make embedded runs both under
   qemu-system-arm, MPS2-AN386): the int8 weights of model_int8.h (written by export.c: batch
   norm folded into the convolutions, a float32 scale per output channel) stay in flash,
   wrapped with mlc_from_const_int8 (their scales with mlc_from_const). Each held-out digit is
   quantized at the input and runs through cnn_int8.h, the calls export.c makes on the host:
   conv, max pool, conv, max pool, flatten, linear, all in int8 with integer requantization, so
   the classes (the largest int8 logit) equal the host's. Op results come from a static arena,
   long-lived objects from board.h's pool; no malloc, no stdio. Built for the host too. */
#define MLC_NO_MALLOC
#define MLC_FLOAT_ONLY                      /* sums in float: the FPU has no double */
#define MLC_NO_STDIO
#define MLC_INT8_PATCH_BYTES 288            /* im2col scratch: conv 1 in 2 passes, conv 2 in 8 */
#define MLC_IMPLEMENTATION
#include "mlc.h"
#include "model_int8.h"
#define BOARD_POOL_BYTES (1024 * sizeof(void *))     /* fewer tensor structs than main.c's */
#include "board.h"
#include "cnn_int8.h"

static unsigned char arena[6 * 1024] __attribute__((aligned(32)));

/* A layer of model_int8.h: int8 weight of the given shape with a float32 scale per row (axis
   0), float32 bias, the output's scale and zero point */
static cnn_int8_layer layer(mlc_ctx *ctx, int ndim, const int *shape, const int8_t *weight,
                            const float *row_scales, const float *bias, float scale, int zero_point) {
    cnn_int8_layer l;
    mlc_tensor *scales = mlc_from_const(ctx, MLC_SHAPE(shape[0]), row_scales);
    l.w = mlc_from_const_int8(ctx, ndim, shape, weight, 0.0f, 0, scales);
    l.b = mlc_from_const(ctx, MLC_SHAPE(shape[0]), bias);
    l.scale = scale;
    l.zero_point = zero_point;
    return l;
}

int main(void) {
    mlc_ctx *ctx = board_context(arena, sizeof arena);
    cnn_int8 net;
    char line[160] = "int8 predictions:", *s = line + 17;
    uint32_t hash = CNN_INT8_HASH;
    int i;
    if (!ctx) { emit("mlc_create failed\n"); return 1; }
    net.input_scale = Q_INPUT_SCALE;
    net.input_zero_point = Q_INPUT_ZERO_POINT;
    net.conv1 = layer(ctx, MLC_SHAPE(16, 1, 3, 3), q_1_weight, q_1_weight_scale, q_1_bias, Q_1_SCALE,
                      Q_1_ZERO_POINT);
    net.conv2 = layer(ctx, MLC_SHAPE(32, 16, 3, 3), q_5_weight, q_5_weight_scale, q_5_bias, Q_5_SCALE,
                      Q_5_ZERO_POINT);
    net.fc = layer(ctx, MLC_SHAPE(10, 128), q_11_weight, q_11_weight_scale, q_11_bias, Q_11_SCALE,
                   Q_11_ZERO_POINT);
    for (i = 0; i < HELD_OUT && !mlc_error(ctx); i++) {    /* one digit at a time */
        mlc_frame f = mlc_frame_begin(ctx);
        mlc_tensor *x = mlc_from_data(ctx, MLC_SHAPE(1, 1, 8, 8), held_out + i * 64);   /* in the arena */
        mlc_tensor *logits = cnn_int8_logits(&net, x);
        if (logits) {
            *s++ = ' ';
            s = put_int(s, (size_t)cnn_int8_class(logits, 0));
            hash = cnn_int8_hash(logits, 0, hash);
        }
        mlc_frame_end(f);
    }
    memcpy(s, "\nint8 logits hash: ", 19);
    s = put_int(s + 19, hash);
    *s++ = '\n'; *s = '\0';
    return board_report(ctx, line);
}
