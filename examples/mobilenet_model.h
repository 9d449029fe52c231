/* mobilenet_model.h - MobileNetV2 as torchvision 0.14 builds it, from mlc modules, with
   torchvision's parameter names, so `torchvision.models.mobilenet_v2(width_mult=...)`'s state
   dict loads by name (examples/mobilenet.c, tests/interop/mobilenet.c, bench/plaidbench.c).

     features.0            Conv2dNormActivation(3, c0, 3x3, stride 2): conv, BatchNorm, ReLU6
     features.1 .. 17      InvertedResidual blocks (expansion t, channels c, repeats n, stride s)
                           conv.0  1x1 expansion to hidden = round(in·t), BN, ReLU6 (t != 1 only)
                           conv.1  3x3 depthwise (groups = hidden), stride s, BN, ReLU6
                           conv.2  1x1 projection to c (no bias)   conv.3  BN (linear: no ReLU6)
                           y = x + block(x) when stride 1 and in == out channels
     features.18           Conv2dNormActivation(c, last, 1x1)
     classifier            Dropout(0.2), Linear(last, classes), after the global average pool
   Channels: _make_divisible(c·width, 8); the last layer's 1280·max(1, width).

   mobilenet_fold_batch_norm folds every BatchNorm into the conv before it for inference, as
   torch.ao.quantization.fuse_modules does in eval mode (s = γ / √(var + ε): w' = w·s per output
   channel, b' = (b - mean)·s + β) and leaves the BatchNorm as an identity; then each conv and
   its ReLU6 run as one op (mlc_conv2d_relu6). */
#ifndef MLC_EXAMPLES_MOBILENET_MODEL_H
#define MLC_EXAMPLES_MOBILENET_MODEL_H
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "mlc.h"

typedef struct mobilenet_opts {
    float width;                        /* width multiplier (1.0, 0.75, 0.5, 0.35 ...) */
    int classes;                        /* 1000 */
    float dropout;                      /* 0.2 */
} mobilenet_opts;

/* torchvision's _make_divisible(v, 8): the nearest multiple of 8 (at least 8), not below 0.9 v */
static int mobilenet_divisible(float v) {
    int rounded = (int)(v + 4.0f) / 8 * 8;
    if (rounded < 8) rounded = 8;
    if ((float)rounded < 0.9f * v) rounded += 8;
    return rounded;
}

static mlc_tensor *mobilenet_relu6_forward(mlc_module *m, mlc_tensor *x) { (void)m; return mlc_relu6(x); }
static mlc_tensor *mobilenet_identity_forward(mlc_module *m, mlc_tensor *x) { (void)m; return x; }

/* A Conv2d without bias (torchvision's convs before a BatchNorm); folding adds one */
static mlc_tensor *mobilenet_conv_forward(mlc_module *m, mlc_tensor *x) {
    return mlc_conv2d(x, m->params[0], m->n_params > 1 ? m->params[1] : NULL, m->conv);
}
static mlc_module *mobilenet_conv(mlc_ctx *ctx, int in, int out, int kernel, int stride, int groups) {
    mlc_module *m = mlc_nn_custom(ctx, "Conv2d", mobilenet_conv_forward, NULL);
    mlc_tensor *w = mlc_parameter(ctx, MLC_SHAPE(out, in / groups, kernel, kernel));
    if (!m || !w || mlc_module_add_param(m, "weight", w) != MLC_OK) return NULL;
    m->conv.stride = stride; m->conv.padding = (kernel - 1) / 2; m->conv.groups = groups;
    mlc_init_kaiming_normal(w, 0.0f);
    return m;
}

/* Conv2dNormActivation: conv, BatchNorm, ReLU6; once the BatchNorm is folded, conv and ReLU6 are
   one op (mlc_conv2d_relu6) */
static mlc_tensor *mobilenet_conv_bn_forward(mlc_module *m, mlc_tensor *x) {
    const mlc_module *conv = m->children[0];
    if (m->children[1]->forward == mobilenet_identity_forward && conv->n_params > 1)
        return mlc_conv2d_relu6(x, conv->params[0], conv->params[1], conv->conv);
    for (int i = 0; i < m->n_children && x; i++) x = mlc_forward(m->children[i], x);
    return x;
}
static mlc_module *mobilenet_conv_bn(mlc_ctx *ctx, int in, int out, int kernel, int stride, int groups) {
    mlc_module *m = mlc_nn_custom(ctx, "Conv2dNormActivation", mobilenet_conv_bn_forward, NULL);
    if (!m || mlc_module_add_child(m, "0", mobilenet_conv(ctx, in, out, kernel, stride, groups)) != MLC_OK
        || mlc_module_add_child(m, "1", mlc_nn_batch_norm(ctx, out)) != MLC_OK
        || mlc_module_add_child(m, "2", mlc_nn_custom(ctx, "ReLU6", mobilenet_relu6_forward, NULL)) != MLC_OK)
        return NULL;
    return m;
}

/* InvertedResidual; user is non-NULL when the block adds its input */
static mlc_tensor *mobilenet_block_forward(mlc_module *m, mlc_tensor *x) {
    mlc_tensor *y = mlc_forward(m->children[0], x);
    return m->user ? mlc_add(x, y) : y;
}
static mlc_module *mobilenet_block(mlc_ctx *ctx, int in, int out, int stride, int expand) {
    static int residual_flag;
    int hidden = (int)lroundf((float)in * (float)expand), n = 0;
    char name[16];
    mlc_module *m = mlc_nn_custom(ctx, "InvertedResidual", mobilenet_block_forward,
                                  stride == 1 && in == out ? &residual_flag : NULL);
    mlc_module *conv = mlc_nn_sequential(ctx, NULL), *parts[4];
    if (!m || !conv) return NULL;
    if (expand != 1) parts[n++] = mobilenet_conv_bn(ctx, in, hidden, 1, 1, 1);
    parts[n++] = mobilenet_conv_bn(ctx, hidden, hidden, 3, stride, hidden);
    parts[n++] = mobilenet_conv(ctx, hidden, out, 1, 1, 1);
    parts[n++] = mlc_nn_batch_norm(ctx, out);
    for (int i = 0; i < n; i++) {
        snprintf(name, sizeof name, "%d", i);
        if (mlc_module_add_child(conv, name, parts[i]) != MLC_OK) return NULL;
    }
    return mlc_module_add_child(m, "conv", conv) == MLC_OK ? m : NULL;
}

static mlc_tensor *mobilenet_forward(mlc_module *m, mlc_tensor *x) {
    mlc_tensor *features = mlc_forward(m->children[0], x);
    return mlc_forward(m->children[1], mlc_global_avg_pool2d(features));
}

/* The network (NULL on error: the context's error says why). Weights as torchvision
   initialises them in kind (Kaiming normal convs, BatchNorm 1 and 0, Linear N(0, 0.01)). */
static mlc_module *mobilenet_create(mlc_ctx *ctx, mobilenet_opts o) {
    static const int settings[7][4] = {     /* t, c, n, s */
        { 1, 16, 1, 1 }, { 6, 24, 2, 2 }, { 6, 32, 3, 2 }, { 6, 64, 4, 2 },
        { 6, 96, 3, 1 }, { 6, 160, 3, 2 }, { 6, 320, 1, 1 } };
    float width = o.width > 0 ? o.width : 1.0f;
    int in = mobilenet_divisible(32.0f * width);
    int last = mobilenet_divisible(1280.0f * (width > 1 ? width : 1));
    int classes = o.classes > 0 ? o.classes : 1000, index = 0;
    char name[16];
    mlc_module *net = mlc_nn_custom(ctx, "MobileNetV2", mobilenet_forward, NULL);
    mlc_module *features = mlc_nn_sequential(ctx, NULL), *linear = mlc_nn_linear(ctx, last, classes);
    mlc_module *classifier = mlc_nn_sequential(ctx, mlc_nn_dropout(ctx, o.dropout > 0 ? o.dropout : 0.2f),
                                               linear, NULL);
    if (!net || !features || !classifier) return NULL;
    mlc_init_normal(linear->params[0], 0.0f, 0.01f);
    mlc_init_constant(linear->params[1], 0.0f);
    snprintf(name, sizeof name, "%d", index++);
    if (mlc_module_add_child(features, name, mobilenet_conv_bn(ctx, 3, in, 3, 2, 1)) != MLC_OK)
        return NULL;
    for (int s = 0; s < 7; s++) {
        int out = mobilenet_divisible((float)settings[s][1] * width);
        for (int i = 0; i < settings[s][2]; i++) {
            snprintf(name, sizeof name, "%d", index++);
            int stride = i == 0 ? settings[s][3] : 1;
            if (mlc_module_add_child(features, name, mobilenet_block(ctx, in, out, stride, settings[s][0]))
                != MLC_OK)
                return NULL;
            in = out;
        }
    }
    snprintf(name, sizeof name, "%d", index++);
    if (mlc_module_add_child(features, name, mobilenet_conv_bn(ctx, in, last, 1, 1, 1)) != MLC_OK
        || mlc_module_add_child(net, "features", features) != MLC_OK
        || mlc_module_add_child(net, "classifier", classifier) != MLC_OK)
        return NULL;
    return net;
}

/* Fold each BatchNorm into the Conv2d before it (eval-mode fuse_modules), recursively. The
   network's tensors are read and written through mlc_read and mlc_write. Returns the number folded, -1 on
   error. */
static int mobilenet_fold_batch_norm(mlc_module *m) {
    int folded = 0;
    for (int i = 0; i < m->n_children; i++) {
        mlc_module *conv = m->children[i], *bn = i + 1 < m->n_children ? m->children[i + 1] : NULL;
        if (conv->n_children) {
            int inner = mobilenet_fold_batch_norm(conv);
            if (inner < 0) return -1;
            folded += inner;
            continue;
        }
        if (!bn || strcmp(conv->type, "Conv2d") || strcmp(bn->type, "BatchNorm")
            || bn->forward == mobilenet_identity_forward)
            continue;
        mlc_tensor *w = conv->params[0], *bias = conv->n_params > 1 ? conv->params[1] : NULL;
        int out = w->shape[0];
        size_t per = w->size / (size_t)out;
        float *wd = malloc((w->size + 5 * (size_t)out) * sizeof(float)), *bd = wd ? wd + w->size : NULL;
        float *gamma = bd + out, *beta = gamma + out, *mean = beta + out, *var = mean + out;
        int ok = wd && mlc_read(w, wd, w->size) == MLC_OK && mlc_read(bn->params[0], gamma, out) == MLC_OK
                 && mlc_read(bn->params[1], beta, out) == MLC_OK
                 && mlc_read(bn->buffers[0], mean, out) == MLC_OK
                 && mlc_read(bn->buffers[1], var, out) == MLC_OK;
        if (ok && bias) ok = mlc_read(bias, bd, out) == MLC_OK;
        else if (ok) {
            memset(bd, 0, (size_t)out * sizeof(float));
            bias = mlc_parameter(conv->ctx, MLC_SHAPE(out));
            ok = bias && mlc_module_add_param(conv, "bias", bias) == MLC_OK;
        }
        for (int o = 0; ok && o < out; o++) {
            float s = gamma[o] * (1.0f / sqrtf(var[o] + bn->eps));
            for (size_t k = 0; k < per; k++) wd[(size_t)o * per + k] *= s;
            bd[o] = (bd[o] - mean[o]) * s + beta[o];
        }
        ok = ok && mlc_write(w, wd, w->size) == MLC_OK && mlc_write(bias, bd, (size_t)out) == MLC_OK;
        free(wd);
        if (!ok) return -1;
        bn->forward = mobilenet_identity_forward;
        folded++;
    }
    return folded;
}

#endif
