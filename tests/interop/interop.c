/* The mlc side of the PyTorch interop test (tests/interop/torch_interop.py writes the files;
   make test-interop runs both). For each model (mlp, cnn, embed, lstm, gru: bidirectional):
   build it with mlc's modules, load PyTorch's state dict strictly (num_batches_tracked arrives
   as I64), run PyTorch's batch in training mode and match the output, the loss, and the
   gradients of the input and of every parameter; match the eval-mode output (batch norm's
   running statistics updated as PyTorch does); then train 3 Adam steps, save the weights and
   the eval output for PyTorch to match.
   Tolerance: |mlc - torch| <= 1e-5 + 1e-4 |torch| per element.
   Then the dynamically quantized Linear (qlinear): PyTorch's float32 Linear loaded and
   mlc_quantize_dynamic'd; (a) its int8 weights and their scales must equal
   torch.quantize_per_channel(w, max|row| / 127, zero points 0, axis 0, torch.qint8)'s, integer for
   integer (the one place the two schemes agree); (b) the schemes differ for activations (mlc: each
   row affine over its own range; torch: the whole tensor's), so each quantized output
   is compared with the float32 Linear's: mlc's max |error| must be at most twice that of torch's
   quantize_dynamic on each engine and weight scheme the file holds. mlc saves the quantized module
   and its output for torch_interop.py to check.
   Then the statically quantized convolutions (qconv): for each configuration of
   qconv.ref.safetensors (NAME.params: stride, padding, groups, s_x, z_x, s_y, z_y), NAME.x as an
   int8 tensor at (s_x, z_x), the float weight through mlc_quantize_weight (its integers and
   scales must equal torch.quantize_per_channel's, NAME.w_int and NAME.w_scale) and
   mlc_conv2d_int8 with the float bias at (s_y, z_y), which must give int8 at that scale and zero
   point; then int8 max and average pooling of pool.x (2x2 stride 2; 3x3 stride 2 padding 1),
   which keep the scale and zero point. The outputs (I8) and weights go to
   qconv.mlc_out.safetensors: torch_interop.py compares them with mlc's scheme (equal) and with
   PyTorch's quantized engines (within 1 LSB; see its docstring).
   Usage: interop DIR. Prints PASS/FAIL lines and "interop (mlc side): N passed, M failed". */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define MLC_IMPLEMENTATION
#include "mlc.h"

#define RTOL 1e-4
#define ATOL 1e-5

static int passed, failed;

static void report(int ok, const char *model, const char *what, const char *detail) {
    printf("%s %s: %s%s%s\n", ok ? "PASS" : "FAIL", model, what, detail[0] ? " " : "", detail);
    if (ok) passed++; else failed++;
}

/* mlc's tensor against PyTorch's, elementwise within atol + rtol |torch|. */
static void compare_within(const char *model, const char *what, mlc_tensor *got, mlc_tensor *want, double atol,
                           double rtol) {
    char detail[160];
    double worst = 0;
    size_t i, bad = 0;
    const float *g, *w;
    if (!got || !want || got->size != want->size) {
        snprintf(detail, sizeof detail, "(missing or %zu vs %zu elements)", got ? got->size : 0, want ? want->size : 0);
        report(0, model, what, detail);
        return;
    }
    g = mlc_host_data(got);
    w = mlc_host_data(want);
    for (i = 0; i < got->size; i++) {
        double d = fabs((double)g[i] - (double)w[i]);
        if (d > worst) worst = d;
        if (!(d <= atol + rtol * fabs((double)w[i]))) bad++;
    }
    snprintf(detail, sizeof detail, "(max |mlc - torch| = %.3g over %zu elements%s)", worst, got->size,
             bad ? ", out of tolerance" : "");
    report(bad == 0, model, what, detail);
}
static void compare(const char *model, const char *what, mlc_tensor *got, mlc_tensor *want) {
    compare_within(model, what, got, want, ATOL, RTOL);
}

static mlc_module *build(mlc_ctx *ctx, const char *name) {
    mlc_conv_opts pad = { .padding = 1 };
    if (strcmp(name, "mlp") == 0)
        return mlc_nn_sequential(ctx, mlc_nn_linear(ctx, 20, 32), mlc_nn_relu(ctx), mlc_nn_linear(ctx, 32, 16),
                                 mlc_nn_tanh(ctx), mlc_nn_linear(ctx, 16, 4), NULL);
    if (strcmp(name, "cnn") == 0)
        return mlc_nn_sequential(ctx, mlc_nn_conv2d(ctx, 1, 8, 3, pad), mlc_nn_batch_norm(ctx, 8), mlc_nn_relu(ctx),
                                 mlc_nn_max_pool2d(ctx, 2, 2), mlc_nn_conv2d(ctx, 8, 16, 3, pad),
                                 mlc_nn_batch_norm(ctx, 16), mlc_nn_relu(ctx), mlc_nn_max_pool2d(ctx, 2, 2),
                                 mlc_nn_flatten(ctx), mlc_nn_linear(ctx, 16 * 7 * 7, 10), NULL);
    if (strcmp(name, "attn") == 0)      /* PyTorch: Linear, MultiheadAttention(batch_first=True), Linear */
        return mlc_nn_sequential(ctx, mlc_nn_linear(ctx, 8, 16), mlc_nn_multihead_attention(ctx, 16, 4),
                                 mlc_nn_linear(ctx, 16, 3), NULL);
    if (strcmp(name, "lstm") == 0)
        return mlc_nn_sequential(ctx, mlc_nn_lstm(ctx, 6, 8, 2), mlc_nn_linear(ctx, 8, 3), NULL);
    if (strcmp(name, "gru") == 0)
        return mlc_nn_sequential(ctx, mlc_nn_recurrent(ctx, MLC_CELL_GRU, 6, 8, (mlc_rnn_opts){ 2, 1, 0 }),
                                 mlc_nn_linear(ctx, 16, 3), NULL);
    return mlc_nn_sequential(ctx, mlc_nn_embedding(ctx, 50, 16), mlc_nn_layer_norm(ctx, 16),
                             mlc_nn_linear(ctx, 16, 50), NULL);
}

static mlc_tensor *loss_of(const char *name, mlc_tensor *out, mlc_tensor *y) {
    if (strcmp(name, "cnn") != 0 && strcmp(name, "embed") != 0) return mlc_mse_loss(out, y, MLC_REDUCE_MEAN);
    if (out && out->ndim == 3) out = mlc_reshape(out, MLC_SHAPE(-1, out->shape[2]));
    if (y && y->ndim == 2) y = mlc_reshape(y, MLC_SHAPE(-1));
    return mlc_cross_entropy(out, y, MLC_REDUCE_MEAN, MLC_NO_IGNORE);
}

static void run_model(const char *dir, const char *name) {
    char path[512], what[160];
    mlc_ctx *ctx = mlc_create(&(mlc_config){ .seed = 1 });
    mlc_module *net = build(ctx, name);
    mlc_safetensors *ref;
    mlc_tensor *x, *y, *out, *loss;
    mlc_named_tensor params[32], saved[2];
    mlc_optim *opt;
    int n, i, step, x_grad = strcmp(name, "embed") != 0;
    snprintf(path, sizeof path, "%s/%s.weights.safetensors", dir, name);
    report(mlc_module_load(net, path, NULL) == MLC_OK, name, "strict load of PyTorch's state dict",
           mlc_error(ctx) ? mlc_error_message(ctx) : "");
    snprintf(path, sizeof path, "%s/%s.ref.safetensors", dir, name);
    ref = mlc_safetensors_open(ctx, path);
    if (mlc_error(ctx)) { report(0, name, "reference batch", mlc_error_message(ctx)); mlc_destroy(ctx); return; }
    x = mlc_keep(mlc_safetensors_get(ref, "x"));
    y = mlc_keep(mlc_safetensors_get(ref, "y"));
    if (x_grad) mlc_requires_grad(x, 1);
    out = mlc_forward(net, x);
    loss = loss_of(name, out, y);
    mlc_backward(loss);
    compare(name, "training-mode output", out, mlc_safetensors_get(ref, "out"));
    compare(name, "loss", mlc_reshape(loss, MLC_SHAPE(1)), mlc_safetensors_get(ref, "loss"));
    if (x_grad) {
        mlc_tensor *g = mlc_empty(ctx, x->ndim, x->shape);
        if (g) mlc_write(g, mlc_host_grad(x), x->size);
        compare(name, "gradient of the input", g, mlc_safetensors_get(ref, "grad.x"));
    }
    n = mlc_module_parameters(net, params, 32);
    for (i = 0; i < n; i++) {
        char key[160];
        mlc_tensor *g = mlc_empty(ctx, params[i].tensor->ndim, params[i].tensor->shape);
        if (g) mlc_write(g, mlc_host_grad(params[i].tensor), g->size);
        snprintf(key, sizeof key, "grad.%.127s", params[i].name);
        snprintf(what, sizeof what, "gradient of %.127s", params[i].name);
        compare(name, what, g, mlc_safetensors_get(ref, key));
    }
    mlc_module_train(net, 0);
    compare(name, "eval-mode output after the step's running statistics", mlc_forward(net, x),
            mlc_safetensors_get(ref, "out_eval"));
    if (!strcmp(name, "mlp") || !strcmp(name, "cnn") || !strcmp(name, "attn")) {   /* torch_interop.py's
                                                          AUTOCAST_MODELS: bf16 products, a bf16 output */
        mlc_tensor *amp;
        mlc_autocast_begin(ctx, MLC_BF16);
        amp = mlc_forward(net, x);
        mlc_autocast_end(ctx);
        snprintf(what, sizeof what, "eval-mode output under autocast bf16 (%s)",
                 mlc_dtype_name(mlc_dtype(amp)));
        compare_within(name, what, mlc_to_dtype(amp, MLC_F32), mlc_safetensors_get(ref, "out_eval_bf16"), 2e-2,
                       2e-2);
    }
    mlc_safetensors_close(ref);
    /* mlc trains a few steps and saves; PyTorch loads the file and matches mlc's output */
    mlc_requires_grad(x, 0);
    mlc_module_train(net, 1);
    opt = mlc_adam(ctx, net, (mlc_adam_opts){ .lr = 1e-2f });
    for (step = 0; step < 3; step++) {
        mlc_frame f = mlc_frame_begin(ctx);
        mlc_tensor *l = loss_of(name, mlc_forward(net, x), y);
        mlc_zero_grad(opt);
        mlc_backward(l);
        mlc_step(opt);
        mlc_frame_end(f);
    }
    mlc_module_train(net, 0);
    snprintf(path, sizeof path, "%s/%s.mlc.safetensors", dir, name);
    mlc_module_save(net, path, (const char *const[]){ "by", "mlc", NULL });
    snprintf(saved[0].name, sizeof saved[0].name, "x");
    snprintf(saved[1].name, sizeof saved[1].name, "out");
    saved[0].tensor = x;
    saved[1].tensor = mlc_forward(net, x);
    snprintf(path, sizeof path, "%s/%s.mlc_out.safetensors", dir, name);
    mlc_safetensors_save(ctx, path, saved, 2, NULL);
    report(mlc_error(ctx) == MLC_OK, name, "trained 3 steps and saved", mlc_error(ctx) ? mlc_error_message(ctx) : "");
    mlc_destroy(ctx);
}

/* max |a - b| over the elements (-1 when either is missing or they differ in size) */
static double max_abs_diff(mlc_tensor *a, mlc_tensor *b) {
    const float *x = a ? mlc_host_data(a) : NULL, *y = b ? mlc_host_data(b) : NULL;
    double worst = 0;
    size_t i;
    if (!x || !y || a->size != b->size) return -1;
    for (i = 0; i < a->size; i++)
        if (fabs((double)x[i] - y[i]) > worst) worst = fabs((double)x[i] - y[i]);
    return worst;
}

/* DIR/MODEL.ref.safetensors, or NULL after a FAIL line */
static mlc_safetensors *open_reference(mlc_ctx *ctx, const char *dir, const char *model) {
    char path[512];
    mlc_safetensors *ref;
    snprintf(path, sizeof path, "%s/%s.ref.safetensors", dir, model);
    ref = mlc_safetensors_open(ctx, path);
    if (!mlc_error(ctx)) return ref;
    report(0, model, "reference", mlc_error_message(ctx));
    return NULL;
}

static void run_qlinear(const char *dir) {
    char path[512], detail[200];
    mlc_ctx *ctx = mlc_create(&(mlc_config){ .seed = 1 });
    mlc_module *lin = mlc_nn_linear(ctx, 96, 48);
    mlc_safetensors *ref;
    mlc_named_tensor state[4], saved[2];
    mlc_tensor *w_int, *w_scale, *want, *x, *out, *scales = NULL;
    const float *ints, *s;
    double err, worst_ratio = 0;
    int i, n, differ = 0, engines = 0;
    snprintf(path, sizeof path, "%s/qlinear.weights.safetensors", dir);
    report(mlc_module_load(lin, path, NULL) == MLC_OK && mlc_quantize_dynamic(lin) == MLC_OK, "qlinear",
           "strict load of PyTorch's Linear, then mlc_quantize_dynamic",
           mlc_error(ctx) ? mlc_error_message(ctx) : "");
    if (!(ref = open_reference(ctx, dir, "qlinear"))) {
        mlc_destroy(ctx);
        return;
    }
    n = mlc_module_state(lin, state, 4);                 /* weight, bias, weight_scale */
    for (i = 0; i < n && i < 4; i++) if (!strcmp(state[i].name, "weight_scale")) scales = state[i].tensor;
    w_int = mlc_safetensors_get(ref, "w_int");
    w_scale = mlc_safetensors_get(ref, "w_scale");
    ints = w_int ? mlc_host_data(w_int) : NULL;
    s = w_scale ? mlc_host_data(w_scale) : NULL;
    if (!ints || !s || !scales || mlc_dtype(lin->params[0]) != MLC_I8 || w_int->size != lin->params[0]->size
        || w_scale->size != scales->size) {
        report(0, "qlinear", "int8 weights", "(missing, not int8, or of another size)");
    } else {
        const float *got = mlc_host_data(scales);
        size_t k;
        for (k = 0; k < w_int->size; k++) differ += (float)lin->params[0]->int8[k] != ints[k];
        snprintf(detail, sizeof detail, "(%d of %zu differ)", differ, w_int->size);
        report(differ == 0, "qlinear", "int8 weights equal torch.quantize_per_channel's integers at the same "
               "scales", detail);
        for (k = 0, differ = 0; k < scales->size; k++) differ += got[k] != s[k];
        snprintf(detail, sizeof detail, "(%d of %zu differ)", differ, scales->size);
        report(differ == 0, "qlinear", "weight_scale equals PyTorch's max|row| / 127", detail);
    }
    x = mlc_keep(mlc_safetensors_get(ref, "x"));
    out = mlc_keep(mlc_forward(lin, x));
    want = mlc_keep(mlc_safetensors_get(ref, "out"));
    err = max_abs_diff(out, want);
    printf("qlinear: max |quantized - float32| over %zu outputs: mlc %.4g", want ? want->size : 0, err);
    for (i = 0; i < mlc_safetensors_count(ref); i++) {
        const char *name = mlc_safetensors_name(ref, i);
        double theirs;
        if (strncmp(name, "torch.", 6) != 0) continue;
        theirs = max_abs_diff(mlc_safetensors_get(ref, name), want);
        printf(", %s %.4g", name, theirs);
        if (theirs > 0 && err / theirs > worst_ratio) worst_ratio = err / theirs;
        if (!(err >= 0 && theirs > 0 && err <= 2 * theirs)) worst_ratio = INFINITY;
        engines++;
    }
    printf("\n");
    snprintf(detail, sizeof detail, "(%d of PyTorch's; worst mlc / torch %.3g)", engines, worst_ratio);
    report(engines > 0 && worst_ratio <= 2, "qlinear", "error against float32 at most 2x that of torch's "
           "quantize_dynamic", detail);
    mlc_safetensors_close(ref);
    snprintf(path, sizeof path, "%s/qlinear.mlc.safetensors", dir);
    mlc_module_save(lin, path, (const char *const[]){ "by", "mlc", NULL });
    snprintf(saved[0].name, sizeof saved[0].name, "x");
    snprintf(saved[1].name, sizeof saved[1].name, "out");
    saved[0].tensor = x;
    saved[1].tensor = out;
    snprintf(path, sizeof path, "%s/qlinear.mlc_out.safetensors", dir);
    mlc_safetensors_save(ctx, path, saved, 2, NULL);
    report(mlc_error(ctx) == MLC_OK, "qlinear", "saved the quantized module and its output",
           mlc_error(ctx) ? mlc_error_message(ctx) : "");
    mlc_destroy(ctx);
}

/* An int8 tensor (scale, zero point) holding the integers of a float32 tensor, over buf (the
   caller's until the context ends); NULL when a value is not an int8 integer */
static mlc_tensor *int8_of(mlc_tensor *ints, float scale, int zero_point, int8_t *buf) {
    const float *v = ints && buf ? mlc_host_data(ints) : NULL;
    size_t i;
    if (!v) return NULL;
    for (i = 0; i < ints->size; i++) {
        if (!(v[i] >= -128 && v[i] <= 127 && v[i] == (float)(int)v[i])) return NULL;
        buf[i] = (int8_t)v[i];
    }
    return mlc_from_const_int8(ints->ctx, ints->ndim, ints->shape, buf, scale, zero_point, NULL);
}

/* How many values of got (int8 or float32) differ from want's (float32; -1: missing or of
   another size) */
static long values_differ(mlc_tensor *want, mlc_tensor *got) {
    const float *v = want ? mlc_host_data(want) : NULL;
    const float *g = got && mlc_dtype(got) == MLC_F32 ? mlc_host_data(got) : NULL;
    long differ = 0;
    size_t i;
    if (!v || !got || (!g && mlc_dtype(got) != MLC_I8) || want->size != got->size) return -1;
    for (i = 0; i < got->size; i++) differ += v[i] != (g ? g[i] : (float)got->int8[i]);
    return differ;
}

/* ref's tensor "CASE.PART" */
static mlc_tensor *part_of(mlc_safetensors *ref, const char *name, const char *part) {
    char key[256];
    snprintf(key, sizeof key, "%.120s.%.120s", name, part);
    return mlc_safetensors_get(ref, key);
}

/* One int8 convolution of qconv.ref.safetensors (CASE.params: stride, padding, groups, s_x,
   z_x, s_y, z_y): x as int8 at (s_x, z_x), the float weight through mlc_quantize_weight (its
   integers and scales against torch.quantize_per_channel's), mlc_conv2d_int8 at (s_y, z_y).
   Adds the output, the weight and its scales to saved; returns how many it added. */
static int run_qconv_case(mlc_ctx *ctx, mlc_safetensors *ref, const char *name, int8_t **buf,
                          mlc_named_tensor *saved) {
    mlc_tensor *p = part_of(ref, name, "params"), *xf = part_of(ref, name, "x"), *x, *w, *y;
    const float *v = p && p->size == 7 ? mlc_host_data(p) : NULL;
    char model[160], what[160], detail[160];
    mlc_conv_opts opts = { 0 };
    long differ, scales_differ;
    snprintf(model, sizeof model, "qconv.%.96s", name);
    *buf = xf ? (int8_t *)malloc(xf->size) : NULL;
    x = v ? int8_of(xf, v[3], (int)v[4], *buf) : NULL;
    w = mlc_quantize_weight(part_of(ref, name, "weight"));
    if (!x || !w) {
        report(0, model, "int8 input and weight", mlc_error(ctx) ? mlc_error_message(ctx) : "(missing)");
        mlc_clear_error(ctx);
        return 0;
    }
    differ = values_differ(part_of(ref, name, "w_int"), w);
    scales_differ = values_differ(part_of(ref, name, "w_scale"), w->qscales);
    snprintf(detail, sizeof detail, "(%ld of %zu differ; scales: %ld of %d)", differ, w->size, scales_differ,
             w->shape[0]);
    report(differ == 0 && scales_differ == 0, model,
           "int8 weights equal torch.quantize_per_channel's integers at the same scales", detail);
    opts.stride = (int)v[0];
    opts.padding = (int)v[1];
    opts.groups = (int)v[2];
    y = mlc_conv2d_int8(x, w, part_of(ref, name, "bias"), opts, v[5], (int)v[6]);
    snprintf(what, sizeof what, "mlc_conv2d_int8 (stride %d, padding %d, groups %d) gives int8 at the "
             "output's scale and zero point", opts.stride, opts.padding, opts.groups);
    if (y)
        snprintf(detail, sizeof detail, "([%d, %d, %d, %d], scale %g, zero point %d)", y->shape[0],
                 y->shape[1], y->shape[2], y->shape[3], (double)y->qscale, y->qzero);
    report(y && mlc_dtype(y) == MLC_I8 && y->qscale == v[5] && y->qzero == (int)v[6], model, what,
           y ? detail : mlc_error_message(ctx));
    if (!y) { mlc_clear_error(ctx); return 0; }
    snprintf(saved[0].name, sizeof saved[0].name, "%.96s.out", name);
    snprintf(saved[1].name, sizeof saved[1].name, "%.96s.weight", name);
    snprintf(saved[2].name, sizeof saved[2].name, "%.96s.weight_scale", name);
    saved[0].tensor = y;
    saved[1].tensor = w;
    saved[2].tensor = w->qscales;
    return 3;
}

/* The statically quantized convolutions (qconv): each CASE of qconv.ref.safetensors, then int8
   max and average pooling of "pool.x" (at pool.params: scale, zero point). The int8 outputs and
   the weights go to qconv.mlc_out.safetensors for torch_interop.py to compare with PyTorch's
   engines. */
static void run_qconv(const char *dir) {
    static const struct { const char *kind; int kernel, stride, padding; } pools[] = {  /* its QPOOL */
        { "max", 2, 2, 0 }, { "avg", 2, 2, 0 }, { "max", 3, 2, 1 }, { "avg", 3, 2, 1 }
    };
    char path[512], name[128], what[160], detail[160];
    mlc_ctx *ctx = mlc_create(&(mlc_config){ .seed = 1 });
    mlc_safetensors *ref;
    mlc_named_tensor saved[64];
    int8_t *held[17] = { NULL };
    mlc_tensor *p, *x;
    const float *v;
    int i, n_saved = 0, n_held = 0, convs = 0;
    if (!(ref = open_reference(ctx, dir, "qconv"))) {
        mlc_destroy(ctx);
        return;
    }
    for (i = 0; i < mlc_safetensors_count(ref) && n_held < 16; i++) {
        const char *entry = mlc_safetensors_name(ref, i);
        const size_t len = strlen(entry);
        if (len < 8 || len > 100 || strcmp(entry + len - 7, ".params") != 0 || !strncmp(entry, "pool.", 5))
            continue;
        snprintf(name, sizeof name, "%.*s", (int)(len - 7), entry);
        if (run_qconv_case(ctx, ref, name, &held[n_held++], saved + n_saved) == 3) {
            n_saved += 3;
            convs++;
        }
    }
    p = mlc_safetensors_get(ref, "pool.params");
    v = p && p->size == 2 ? mlc_host_data(p) : NULL;
    x = mlc_safetensors_get(ref, "pool.x");
    held[n_held] = x ? (int8_t *)malloc(x->size) : NULL;
    x = v ? int8_of(x, v[0], (int)v[1], held[n_held]) : NULL;
    n_held++;
    for (i = 0; i < (int)(sizeof pools / sizeof pools[0]); i++) {
        const int is_max = strcmp(pools[i].kind, "max") == 0;
        mlc_tensor *y = !x      ? NULL
                        : is_max ? mlc_max_pool2d(x, pools[i].kernel, pools[i].stride, pools[i].padding)
                                 : mlc_avg_pool2d(x, pools[i].kernel, pools[i].stride, pools[i].padding);
        snprintf(name, sizeof name, "pool.%s%ds%dp%d", pools[i].kind, pools[i].kernel, pools[i].stride,
                 pools[i].padding);
        snprintf(what, sizeof what, "%.40s: mlc_%s_pool2d on int8 keeps int8, the scale and the zero point",
                 name, pools[i].kind);
        report(y && mlc_dtype(y) == MLC_I8 && y->qscale == x->qscale && y->qzero == x->qzero, "qconv", what,
               y ? "" : mlc_error(ctx) ? mlc_error_message(ctx) : "(missing reference)");
        if (!y) { mlc_clear_error(ctx); continue; }
        snprintf(saved[n_saved].name, sizeof saved[n_saved].name, "%.96s", name);
        saved[n_saved++].tensor = y;
    }
    mlc_safetensors_close(ref);
    snprintf(path, sizeof path, "%s/qconv.mlc_out.safetensors", dir);
    mlc_safetensors_save(ctx, path, saved, n_saved, NULL);
    snprintf(detail, sizeof detail, "(%d convolutions; %d tensors)", convs, n_saved);
    report(mlc_error(ctx) == MLC_OK && convs > 0, "qconv", "saved the int8 outputs and weights",
           mlc_error(ctx) ? mlc_error_message(ctx) : detail);
    mlc_destroy(ctx);
    for (i = 0; i < n_held; i++) free(held[i]);
}

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: interop DIR (written by torch_interop.py write DIR)\n"); return 2; }
    run_model(argv[1], "mlp");
    run_model(argv[1], "cnn");
    run_model(argv[1], "embed");
    run_model(argv[1], "attn");
    run_model(argv[1], "lstm");
    run_model(argv[1], "gru");
    run_qlinear(argv[1]);
    run_qconv(argv[1]);
    printf("interop (mlc side): %d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
