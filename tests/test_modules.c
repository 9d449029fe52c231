/* Modules: PyTorch names for parameters and state, default initialisation statistics, train /
   eval behaviour of Dropout and BatchNorm (checked against hand computation), forward shapes
   and values of every module type, custom modules, and reproducible initialisation. */
#include "test.h"

/* ---------- names ---------- */

static mlc_tensor *affine_forward(mlc_module *m, mlc_tensor *x) {
    /* y = inner(x * scale): uses its own parameter and its child */
    return mlc_forward(m->children[0], mlc_mul(x, m->params[0]));
}

/* A custom module with a parameter "scale" [3], a buffer "calls" and a child "inner" Linear(3, 3). */
static mlc_module *make_affine(mlc_ctx *ctx) {
    mlc_module *m = mlc_nn_custom(ctx, "Affine", affine_forward, NULL);
    mlc_tensor *scale = mlc_parameter(ctx, MLC_SHAPE(3)), *calls = mlc_keep(mlc_zeros(ctx, MLC_SHAPE(1)));
    if (!m || !scale || !calls) return NULL;
    mlc_init_constant(scale, 2.0f);
    if (mlc_module_add_param(m, "scale", scale) != MLC_OK || mlc_module_add_buffer(m, "calls", calls) != MLC_OK ||
        mlc_module_add_child(m, "inner", mlc_nn_linear(ctx, 3, 3)) != MLC_OK) return NULL;
    return m;
}

static int names_like_pytorch(void) {
    static const char *const param_names[] = {
        "0.weight", "0.bias", "2.weight", "2.bias", "3.1.weight", "3.1.bias", "4.weight", "4.bias",
        "5.scale", "5.inner.weight", "5.inner.bias" };
    static const char *const state_names[] = {
        "0.weight", "0.bias", "2.weight", "2.bias", "2.running_mean", "2.running_var", "2.num_batches_tracked",
        "3.1.weight", "3.1.bias", "4.weight", "4.bias", "5.scale", "5.calls", "5.inner.weight", "5.inner.bias" };
    /* the shapes each name must have, as [ndim, d0, d1, d2, d3] */
    static const int param_shapes[][5] = {
        { 2, 4, 3 }, { 1, 4 }, { 1, 4 }, { 1, 4 }, { 2, 5, 4 }, { 1, 5 }, { 4, 6, 2, 3, 3 }, { 1, 6 },
        { 1, 3 }, { 2, 3, 3 }, { 1, 3 } };
    mlc_ctx *ctx = test_ctx(1);
    mlc_module *seq = mlc_nn_sequential(ctx, mlc_nn_linear(ctx, 3, 4), mlc_nn_relu(ctx), mlc_nn_batch_norm(ctx, 4),
        mlc_nn_sequential(ctx, mlc_nn_tanh(ctx), mlc_nn_linear(ctx, 4, 5), NULL),
        mlc_nn_conv2d(ctx, 2, 6, 3, (mlc_conv_opts){ 0 }), make_affine(ctx), NULL);
    mlc_named_tensor out[32];
    int n, i, d;
    CHECK(seq != NULL && mlc_error(ctx) == MLC_OK);
    CHECK(seq->n_children == 6 && strcmp(seq->type, "Sequential") == 0);
    n = mlc_module_parameters(seq, out, 32);
    CHECK_MSG(n == 11, "%d parameters", n);
    for (i = 0; i < n; i++) {
        CHECK_MSG(strcmp(out[i].name, param_names[i]) == 0, "parameter %d is \"%.120s\", expected \"%s\"", i, out[i].name, param_names[i]);
        CHECK_MSG(out[i].tensor->ndim == param_shapes[i][0], "%.120s has rank %d", out[i].name, out[i].tensor->ndim);
        for (d = 0; d < out[i].tensor->ndim; d++) CHECK_MSG(out[i].tensor->shape[d] == param_shapes[i][1 + d], "%.120s shape", out[i].name);
        CHECK(out[i].tensor->requires_grad && mlc_host_grad(out[i].tensor) != NULL);
    }
    /* the names lead to the right tensors */
    CHECK(out[0].tensor == seq->children[0]->params[0]);
    CHECK(out[4].tensor == seq->children[3]->children[1]->params[0]);
    CHECK(out[9].tensor == seq->children[5]->children[0]->params[0]);
    n = mlc_module_state(seq, out, 32);
    CHECK_MSG(n == 15, "%d state tensors", n);
    for (i = 0; i < n; i++)
        CHECK_MSG(strcmp(out[i].name, state_names[i]) == 0, "state %d is \"%.120s\", expected \"%s\"", i, out[i].name, state_names[i]);
    CHECK(out[4].tensor == seq->children[2]->buffers[0]);
    CHECK(out[6].tensor->ndim == 0 && out[6].tensor->size == 1);            /* num_batches_tracked: a scalar */
    CHECK(!out[4].tensor->requires_grad);                                   /* buffers take no gradient */
    test_destroy(ctx);
    return 1;
}

static int count_when_max_is_smaller(void) {
    mlc_ctx *ctx = test_ctx(1);
    mlc_module *seq = mlc_nn_sequential(ctx, mlc_nn_linear(ctx, 3, 4), mlc_nn_batch_norm(ctx, 4), mlc_nn_linear(ctx, 4, 2), NULL);
    mlc_named_tensor out[8];
    int i;
    CHECK(seq);
    for (i = 0; i < 8; i++) { strcpy(out[i].name, "untouched"); out[i].tensor = NULL; }
    CHECK(mlc_module_parameters(seq, out, 3) == 6);
    CHECK(strcmp(out[0].name, "0.weight") == 0 && strcmp(out[2].name, "1.weight") == 0);
    CHECK(strcmp(out[3].name, "untouched") == 0 && out[3].tensor == NULL);  /* nothing written past max */
    CHECK(mlc_module_state(seq, out, 0) == 9);
    CHECK(mlc_module_state(seq, NULL, 100) == 9);
    CHECK(mlc_module_parameters(seq, NULL, 0) == 6);
    CHECK(strcmp(out[3].name, "untouched") == 0);
    CHECK(mlc_module_parameters(NULL, out, 8) == 0);
    /* scalars: 3*4+4 + 4+4 + 4*2+2 (buffers are not parameters) */
    CHECK(mlc_module_param_count(seq) == (size_t)(3 * 4 + 4 + 4 + 4 + 4 * 2 + 2));
    CHECK(mlc_module_param_count(mlc_nn_conv2d(ctx, 4, 6, 3, (mlc_conv_opts){ .groups = 2 })) == (size_t)(6 * 2 * 3 * 3 + 6));
    CHECK(mlc_module_param_count(mlc_nn_linear_nobias(ctx, 7, 5)) == 35);
    CHECK(mlc_module_param_count(mlc_nn_relu(ctx)) == 0);
    test_destroy(ctx);
    return 1;
}

/* ---------- initialisation statistics ---------- */

typedef struct sample_stats { double mean, var, max_abs; } sample_stats;
static sample_stats stats_of(mlc_tensor *t) {
    sample_stats s = { 0, 0, 0 };
    size_t i;
    for (i = 0; i < t->size; i++) { s.mean += mlc_host_data(t)[i]; if (fabs(mlc_host_data(t)[i]) > s.max_abs) s.max_abs = fabs(mlc_host_data(t)[i]); }
    s.mean /= (double)t->size;
    for (i = 0; i < t->size; i++) s.var += (mlc_host_data(t)[i] - s.mean) * (mlc_host_data(t)[i] - s.mean);
    s.var /= (double)t->size;
    return s;
}

/* t holds n draws of U(-b, b)?  Tolerances are 5 standard errors: the mean has standard error
   b/√(3n); the sample variance (target b²/3) has standard error √(Var X²/n) = b²√(4/(45n)).
   The largest |x| must lie in [0.99 b, b]: P(all n below 0.99 b) = 0.99^n, under e^-40 here.
   A histogram of 8 equal bins must be flat: each count is Binomial(n, 1/8), 5 sd tolerance. */
static int check_uniform(mlc_tensor *t, double b, const char *what) {
    double n = (double)t->size, se_mean = b / sqrt(3.0 * n), se_var = b * b * sqrt(4.0 / (45.0 * n));
    double expect = n / 8.0, sd_bin = sqrt(n * (1.0 / 8.0) * (7.0 / 8.0));
    sample_stats s = stats_of(t);
    size_t bins[8] = { 0 }, i;
    CHECK_MSG(s.max_abs <= b * (1 + 1e-6), "%s: |x| reaches %g, bound %g", what, s.max_abs, b);
    CHECK_MSG(s.max_abs >= 0.99 * b, "%s: |x| only reaches %g, bound %g", what, s.max_abs, b);
    CHECK_MSG(fabs(s.mean) <= 5 * se_mean, "%s: mean %g (tolerance %g)", what, s.mean, 5 * se_mean);
    CHECK_MSG(fabs(s.var - b * b / 3) <= 5 * se_var, "%s: variance %g, expected %g (tolerance %g)", what, s.var, b * b / 3, 5 * se_var);
    for (i = 0; i < t->size; i++) {
        int k = (int)((mlc_host_data(t)[i] + b) / (2 * b) * 8);
        bins[k < 0 ? 0 : k > 7 ? 7 : k]++;
    }
    for (i = 0; i < 8; i++)
        CHECK_MSG(fabs((double)bins[i] - expect) <= 5 * sd_bin, "%s: bin %zu holds %zu, expected %g", what, i, bins[i], expect);
    return 1;
}

/* t holds n draws of N(0, std²)?  Mean within 5 se (std/√n); sample sd within 5 se (std/√(2n)). */
static int check_normal(mlc_tensor *t, double std, const char *what) {
    double n = (double)t->size;
    sample_stats s = stats_of(t);
    CHECK_MSG(fabs(s.mean) <= 5 * std / sqrt(n), "%s: mean %g", what, s.mean);
    CHECK_MSG(fabs(sqrt(s.var) - std) <= 5 * std / sqrt(2 * n), "%s: sd %g, expected %g", what, sqrt(s.var), std);
    CHECK_MSG(s.max_abs > 3 * std, "%s: largest |x| %g: not normal tails", what, s.max_abs);   /* P(<3sd for all n) ~ 0 */
    return 1;
}

static int linear_default_init(void) {
    mlc_ctx *ctx = test_ctx(11);
    mlc_module *lin = mlc_nn_linear(ctx, 256, 128);
    double bound = 1.0 / sqrt(256.0);
    CHECK(lin && lin->n_params == 2);
    CHECK(lin->params[0]->shape[0] == 128 && lin->params[0]->shape[1] == 256);
    if (!check_uniform(lin->params[0], bound, "Linear(256,128).weight")) return 0;
    /* the bias: 128 draws of U(-1/16, 1/16); only the bound and a nonzero spread are certain */
    { sample_stats s = stats_of(lin->params[1]);
      CHECK(s.max_abs <= bound * (1 + 1e-6) && s.max_abs > 0.5 * bound && s.var > 0); }
    test_destroy(ctx);
    return 1;
}

static int conv_default_init(void) {
    mlc_ctx *ctx = test_ctx(12);
    /* fan_in = C/groups * k * k = 32/4 * 3 * 3 = 72 */
    mlc_module *conv = mlc_nn_conv2d(ctx, 32, 64, 3, (mlc_conv_opts){ .groups = 4 });
    double bound = 1.0 / sqrt(32.0 / 4 * 3 * 3);
    CHECK(conv);
    CHECK(conv->params[0]->shape[0] == 64 && conv->params[0]->shape[1] == 8);
    if (!check_uniform(conv->params[0], bound, "Conv2d(32,64,3,groups=4).weight")) return 0;
    { sample_stats s = stats_of(conv->params[1]);
      CHECK(s.max_abs <= bound * (1 + 1e-6) && s.max_abs > 0.5 * bound); }
    /* norms start at weight 1, bias 0, running stats 0 and 1; embeddings N(0, 1) */
    { mlc_module *bn = mlc_nn_batch_norm(ctx, 5), *ln = mlc_nn_layer_norm(ctx, 5), *emb = mlc_nn_embedding(ctx, 200, 100);
      int i;
      CHECK(bn && ln && emb);
      for (i = 0; i < 5; i++) {
          CHECK(mlc_host_data(bn->params[0])[i] == 1.0f && mlc_host_data(bn->params[1])[i] == 0.0f);
          CHECK(mlc_host_data(bn->buffers[0])[i] == 0.0f && mlc_host_data(bn->buffers[1])[i] == 1.0f);
          CHECK(mlc_host_data(ln->params[0])[i] == 1.0f && mlc_host_data(ln->params[1])[i] == 0.0f);
      }
      CHECK(mlc_host_data(bn->buffers[2])[0] == 0.0f);
      if (!check_normal(emb->params[0], 1.0, "Embedding.weight")) return 0; }
    test_destroy(ctx);
    return 1;
}

static int init_functions(void) {
    mlc_ctx *ctx = test_ctx(13);
    /* fan_in 512, fan_out 256: a swap of the fans would be off by √2 */
    mlc_tensor *w = mlc_parameter(ctx, MLC_SHAPE(256, 512)), *k4 = mlc_parameter(ctx, MLC_SHAPE(64, 16, 3, 3));
    CHECK(w && k4);
    mlc_init_kaiming_normal(w, 0.0f);
    if (!check_normal(w, sqrt(2.0 / 512), "kaiming_normal(a=0)")) return 0;
    mlc_init_kaiming_normal(w, 1.0f);                        /* gain √(2/(1+1)) = 1 */
    if (!check_normal(w, sqrt(1.0 / 512), "kaiming_normal(a=1)")) return 0;
    mlc_init_kaiming_normal(k4, 0.0f);                       /* fan_in = 16·3·3 */
    if (!check_normal(k4, sqrt(2.0 / 144), "kaiming_normal 4-D")) return 0;
    mlc_init_kaiming_uniform(w, 0.0f);                       /* bound √2 √(3/fan_in) */
    if (!check_uniform(w, sqrt(2.0) * sqrt(3.0 / 512), "kaiming_uniform(a=0)")) return 0;
    mlc_init_xavier_uniform(w, 1.0f);
    if (!check_uniform(w, sqrt(6.0 / (512 + 256)), "xavier_uniform")) return 0;
    mlc_init_xavier_uniform(k4, 1.0f);                       /* fans 144 and 576 */
    if (!check_uniform(k4, sqrt(6.0 / (144 + 576)), "xavier_uniform 4-D")) return 0;
    mlc_init_xavier_normal(w, 2.0f);
    if (!check_normal(w, 2.0 * sqrt(2.0 / (512 + 256)), "xavier_normal(gain=2)")) return 0;
    mlc_init_normal(w, 3.0f, 0.5f);
    { sample_stats s = stats_of(w);
      CHECK_NEAR(s.mean, 3.0, 5 * 0.5 / sqrt((double)w->size));
      CHECK_NEAR(sqrt(s.var), 0.5, 5 * 0.5 / sqrt(2.0 * w->size)); }
    mlc_init_uniform(w, 1.0f, 3.0f);
    { size_t i; for (i = 0; i < w->size; i++) CHECK(mlc_host_data(w)[i] >= 1.0f && mlc_host_data(w)[i] < 3.0f); }
    test_destroy(ctx);
    return 1;
}

static int same_seed_same_weights(void) {
    mlc_named_tensor a[16], b[16];
    mlc_ctx *ctx[3];
    mlc_module *net[3];
    int k, i, na = 0, nb = 0, nc, differ = 0;
    const unsigned long long seeds[3] = { 99, 99, 100 };
    for (k = 0; k < 3; k++) {
        ctx[k] = test_ctx(seeds[k]);
        net[k] = mlc_nn_sequential(ctx[k], mlc_nn_linear(ctx[k], 5, 7), mlc_nn_conv2d(ctx[k], 2, 3, 3, (mlc_conv_opts){ 0 }),
                                   mlc_nn_embedding(ctx[k], 4, 3), mlc_nn_batch_norm(ctx[k], 3), NULL);
        CHECK(net[k]);
    }
    na = mlc_module_state(net[0], a, 16);
    nb = mlc_module_state(net[1], b, 16);
    CHECK(na == 10 && nb == na);
    for (i = 0; i < na; i++) {
        CHECK(strcmp(a[i].name, b[i].name) == 0 && a[i].tensor->size == b[i].tensor->size);
        CHECK_MSG(memcmp(mlc_host_data(a[i].tensor), mlc_host_data(b[i].tensor), a[i].tensor->size * sizeof(float)) == 0, "%.120s differs", a[i].name);
    }
    nc = mlc_module_state(net[2], b, 16);
    CHECK(nc == na);
    for (i = 0; i < nc; i++) if (memcmp(mlc_host_data(a[i].tensor), mlc_host_data(b[i].tensor), a[i].tensor->size * sizeof(float)) != 0) differ++;
    CHECK_MSG(differ == 5, "%d tensors differ with another seed, expected the 5 random ones", differ);
    for (k = 0; k < 3; k++) test_destroy(ctx[k]);
    return 1;
}

/* ---------- train / eval ---------- */

static int all_training(const mlc_module *m, int want) {
    int i;
    if (m->training != want) return 0;
    for (i = 0; i < m->n_children; i++) if (!all_training(m->children[i], want)) return 0;
    return 1;
}

static int train_eval_recursive(void) {
    mlc_ctx *ctx = test_ctx(1);
    mlc_module *inner = mlc_nn_sequential(ctx, mlc_nn_dropout(ctx, 0.5f), mlc_nn_batch_norm(ctx, 3), NULL);
    mlc_module *seq = mlc_nn_sequential(ctx, mlc_nn_linear(ctx, 3, 3), inner, make_affine(ctx), NULL);
    CHECK(seq);
    CHECK(all_training(seq, 1));                              /* modules start in training mode */
    mlc_module_train(seq, 0);
    CHECK(all_training(seq, 0));
    CHECK(inner->children[1]->training == 0 && seq->children[2]->children[0]->training == 0);
    mlc_module_train(inner, 1);                               /* a subtree alone */
    CHECK(inner->training && inner->children[0]->training && !seq->training && !seq->children[0]->training);
    mlc_module_train(seq, 7);                                 /* any nonzero is "train" */
    CHECK(all_training(seq, 1));
    test_destroy(ctx);
    return 1;
}

static int dropout_train_and_eval(void) {
    mlc_ctx *ctx = test_ctx(5);
    const int n = 20000;
    const double p = 0.3;
    mlc_module *drop = mlc_nn_dropout(ctx, (float)p);
    mlc_tensor *x = mlc_arange(ctx, 1.0f, (float)n + 1.0f, 1.0f), *y;
    int i, zeros = 0;
    CHECK(drop && x && (int)x->size == n);
    mlc_module_train(drop, 0);
    y = mlc_forward(drop, x);
    CHECK(y && mlc_same_shape(x, y));
    for (i = 0; i < n; i++) CHECK(mlc_host_data(y)[i] == mlc_host_data(x)[i]);  /* identity in eval */
    mlc_module_train(drop, 1);
    y = mlc_forward(drop, x);
    CHECK(y && mlc_same_shape(x, y));
    for (i = 0; i < n; i++) {
        if (mlc_host_data(y)[i] == 0.0f) zeros++;
        else CHECK_NEAR(mlc_host_data(y)[i], mlc_host_data(x)[i] / (1.0 - p), 1e-6 * mlc_host_data(x)[i] / (1.0 - p));
    }
    /* zeros ~ Binomial(n, p): sd √(n p (1-p)) ≈ 65; 5 sd */
    CHECK_MSG(fabs(zeros - n * p) <= 5 * sqrt(n * p * (1 - p)), "%d of %d zeroed, expected about %g", zeros, n, n * p);
    /* a second call draws a new mask */
    { mlc_tensor *y2 = mlc_forward(drop, x); int same = 0;
      CHECK(y2);
      for (i = 0; i < n; i++) same += (mlc_host_data(y2)[i] == 0.0f) == (mlc_host_data(y)[i] == 0.0f);
      CHECK(same < n); }
    test_destroy(ctx);
    return 1;
}

static int batch_norm_train_and_eval(void) {
    mlc_ctx *ctx = test_ctx(1);
    static const float xv[] = { 1, 2, 3, 5, 6, -1, 2, 0 };    /* [4, 2] */
    const float w[] = { 2.0f, 0.5f }, b[] = { 1.0f, -1.0f };
    const double eps = 1e-5;
    double mean[2], var_b[2], var_u[2], rm[2] = { 0, 0 }, rv[2] = { 1, 1 };
    mlc_module *bn = mlc_nn_batch_norm(ctx, 2);
    mlc_tensor *x = mlc_from_data(ctx, MLC_SHAPE(4, 2), xv), *y;
    int c, i, pass;
    CHECK(bn && x);
    CHECK(mlc_write(bn->params[0], w, 2) == MLC_OK && mlc_write(bn->params[1], b, 2) == MLC_OK);
    for (c = 0; c < 2; c++) {                                  /* the batch statistics by hand */
        double s = 0, v = 0;
        for (i = 0; i < 4; i++) s += xv[i * 2 + c];
        mean[c] = s / 4;
        for (i = 0; i < 4; i++) v += (xv[i * 2 + c] - mean[c]) * (xv[i * 2 + c] - mean[c]);
        var_b[c] = v / 4; var_u[c] = v / 3;
    }
    CHECK_NEAR(mean[0], 3.0, 0); CHECK_NEAR(var_b[1], 5.25, 1e-12);  /* the hand numbers above */
    for (pass = 1; pass <= 2; pass++) {
        y = mlc_forward(bn, x);
        CHECK(y && mlc_same_shape(x, y));
        for (c = 0; c < 2; c++) {
            rm[c] = 0.9 * rm[c] + 0.1 * mean[c];               /* momentum 0.1, unbiased variance */
            rv[c] = 0.9 * rv[c] + 0.1 * var_u[c];
            CHECK_NEAR(mlc_host_data(bn->buffers[0])[c], rm[c], 1e-6);
            CHECK_NEAR(mlc_host_data(bn->buffers[1])[c], rv[c], 1e-6);
            for (i = 0; i < 4; i++)
                CHECK_NEAR(mlc_host_data(y)[i * 2 + c], (xv[i * 2 + c] - mean[c]) / sqrt(var_b[c] + eps) * w[c] + b[c], 1e-5);
        }
        CHECK(mlc_host_data(bn->buffers[2])[0] == (float)pass);          /* num_batches_tracked */
    }
    mlc_module_train(bn, 0);
    y = mlc_forward(bn, x);
    CHECK(y);
    for (c = 0; c < 2; c++) {
        CHECK_NEAR(mlc_host_data(bn->buffers[0])[c], rm[c], 1e-6);      /* unchanged in eval */
        CHECK_NEAR(mlc_host_data(bn->buffers[1])[c], rv[c], 1e-6);
        for (i = 0; i < 4; i++)
            CHECK_NEAR(mlc_host_data(y)[i * 2 + c], (xv[i * 2 + c] - rm[c]) / sqrt(rv[c] + eps) * w[c] + b[c], 1e-5);
    }
    CHECK(mlc_host_data(bn->buffers[2])[0] == 2.0f);
    test_destroy(ctx);
    return 1;
}

static int batch_norm_2d_statistics(void) {
    mlc_ctx *ctx = test_ctx(3);
    mlc_module *bn = mlc_nn_batch_norm(ctx, 3);
    mlc_tensor *x = mlc_randn(ctx, MLC_SHAPE(2, 3, 2, 2)), *y;
    int n, c, k;
    CHECK(bn && x);
    { float v[24];                                            /* channel offsets */
      for (k = 0; k < (int)x->size; k++) v[k] = mlc_host_data(x)[k] * 2.0f + (float)(k / 4 % 3);
      CHECK(mlc_write(x, v, x->size) == MLC_OK); }
    y = mlc_forward(bn, x);
    CHECK(y && mlc_same_shape(x, y));
    for (c = 0; c < 3; c++) {                                  /* per channel over N, H, W: 8 values */
        double s = 0, v = 0, ys = 0, yv = 0;
        for (n = 0; n < 2; n++) for (k = 0; k < 4; k++) s += mlc_host_data(x)[(n * 3 + c) * 4 + k];
        s /= 8;
        for (n = 0; n < 2; n++) for (k = 0; k < 4; k++) {
            double d = mlc_host_data(x)[(n * 3 + c) * 4 + k] - s, o = mlc_host_data(y)[(n * 3 + c) * 4 + k];
            v += d * d; ys += o; yv += o * o;
        }
        CHECK_NEAR(mlc_host_data(bn->buffers[0])[c], 0.1 * s, 1e-6);
        CHECK_NEAR(mlc_host_data(bn->buffers[1])[c], 0.9 + 0.1 * v / 7, 1e-6);
        CHECK_NEAR(ys / 8, 0.0, 1e-5);                        /* normalised: mean 0, variance v/(v+8eps) */
        CHECK_NEAR(yv / 8, (v / 8) / (v / 8 + 1e-5), 1e-4);
    }
    test_destroy(ctx);
    return 1;
}

/* ---------- forward shapes and values ---------- */

#define CHECK_SHAPE(t, ...) do { const int want_[] = { __VA_ARGS__ }; int d_; \
    CHECK_MSG((t) != NULL, "%s is NULL", #t); \
    CHECK_MSG((t)->ndim == (int)(sizeof want_ / sizeof want_[0]), "%s has rank %d", #t, (t)->ndim); \
    for (d_ = 0; d_ < (t)->ndim; d_++) CHECK_MSG((t)->shape[d_] == want_[d_], "%s: dim %d is %d, expected %d", #t, d_, (t)->shape[d_], want_[d_]); \
} while (0)

static int linear_forward(void) {
    mlc_ctx *ctx = test_ctx(2);
    mlc_module *lin = mlc_nn_linear(ctx, 5, 3), *nob = mlc_nn_linear_nobias(ctx, 5, 3);
    mlc_tensor *x2 = mlc_randn(ctx, MLC_SHAPE(4, 5)), *x3 = mlc_randn(ctx, MLC_SHAPE(2, 6, 5)), *y2, *y3, *yn;
    const float *W, *B;
    size_t r, o, i;
    CHECK(lin && nob && x2 && x3);
    CHECK(nob->n_params == 1);
    y2 = mlc_forward(lin, x2);
    y3 = mlc_forward(lin, x3);
    yn = mlc_forward(nob, x2);
    CHECK_SHAPE(y2, 4, 3);
    CHECK_SHAPE(y3, 2, 6, 3);
    CHECK_SHAPE(yn, 4, 3);
    W = mlc_host_data(lin->params[0]); B = mlc_host_data(lin->params[1]);
    for (r = 0; r < 12; r++)                                   /* y = x Wᵀ + b, row by row */
        for (o = 0; o < 3; o++) {
            double s = B[o];
            for (i = 0; i < 5; i++) s += (double)mlc_host_data(x3)[r * 5 + i] * W[o * 5 + i];
            CHECK_NEAR(mlc_host_data(y3)[r * 3 + o], s, 1e-5);
            if (r < 4) {
                double t = 0;
                for (i = 0; i < 5; i++) t += (double)mlc_host_data(x2)[r * 5 + i] * mlc_host_data(nob->params[0])[o * 5 + i];
                CHECK_NEAR(mlc_host_data(yn)[r * 3 + o], t, 1e-5);
            }
        }
    test_destroy(ctx);
    return 1;
}

static int conv2d_forward(void) {
    mlc_ctx *ctx = test_ctx(3);
    /* 4 -> 6 channels, 3x3, stride 2, padding 1, 2 groups: OH = (9 + 2 - 3) / 2 + 1 = 5 */
    mlc_module *conv = mlc_nn_conv2d(ctx, 4, 6, 3, (mlc_conv_opts){ .stride = 2, .padding = 1, .groups = 2 });
    mlc_tensor *x = mlc_randn(ctx, MLC_SHAPE(2, 4, 9, 9)), *y;
    const float *W, *B;
    int n, o, oh, ow, c, i, j;
    CHECK(conv && x);
    CHECK_SHAPE(conv->params[0], 6, 2, 3, 3);
    y = mlc_forward(conv, x);
    CHECK_SHAPE(y, 2, 6, 5, 5);
    W = mlc_host_data(conv->params[0]); B = mlc_host_data(conv->params[1]);
    for (n = 0; n < 2; n++)
        for (o = 0; o < 6; o++)
            for (oh = 0; oh < 5; oh++)
                for (ow = 0; ow < 5; ow++) {
                    double s = B[o];
                    int g = o / 3;                              /* outputs 0-2 read channels 0-1, 3-5 read 2-3 */
                    for (c = 0; c < 2; c++)
                        for (i = 0; i < 3; i++)
                            for (j = 0; j < 3; j++) {
                                int ih = oh * 2 + i - 1, iw = ow * 2 + j - 1;
                                if (ih < 0 || ih >= 9 || iw < 0 || iw >= 9) continue;
                                s += (double)W[((o * 2 + c) * 3 + i) * 3 + j] * mlc_host_data(x)[((n * 4 + g * 2 + c) * 9 + ih) * 9 + iw];
                            }
                    CHECK_NEAR(mlc_host_data(y)[((n * 6 + o) * 5 + oh) * 5 + ow], s, 1e-4);
                }
    /* defaults: stride 1, no padding */
    { mlc_module *plain = mlc_nn_conv2d(ctx, 4, 2, 3, (mlc_conv_opts){ 0 });
      CHECK_SHAPE(mlc_forward(plain, x), 2, 2, 7, 7); }
    test_destroy(ctx);
    return 1;
}

/* A fused op (side 0) and the ops it stands for (side 1) after the same backward: y, dx,
   dweight and dbias (got[.][3] NULL: none) in equal bits */
static int fused_same_bits(int k, mlc_tensor *got[2][4]) {
    int u;
    for (u = 0; u < 4 && got[0][u]; u++) {
        const float *a = u ? mlc_host_grad(got[0][u]) : mlc_host_data(got[0][u]);
        const float *b = u ? mlc_host_grad(got[1][u]) : mlc_host_data(got[1][u]);
        size_t i;
        CHECK(a && b && got[0][u]->size == got[1][u]->size);
        for (i = 0; i < got[0][u]->size; i++)
            CHECK_MSG(test_same_float(a[i], b[i]), "case %d, %s [%zu]: %.9g fused, %.9g apart", k,
                      u == 0 ? "y" : u == 1 ? "dx" : u == 2 ? "dweight" : "dbias", i, (double)a[i], (double)b[i]);
    }
    return 1;
}

/* Sequential runs a Conv2d followed by a ReLU as one op on the CPU (relu fused into conv2d: one
   tape node) with the same bits, output and gradients of x, weight and bias, as mlc_conv2d then
   mlc_relu in a context made alike: on the fast path (stride 1), the general one (stride 2,
   groups) and without padding; on a device the two run in turn. */
static int sequential_fuses_conv_relu(void) {
    static const mlc_conv_opts opts[] = { { .padding = 1 }, { .stride = 2, .padding = 1, .groups = 2 }, { 0 } };
    int k, side;
    for (k = 0; k < 3; k++) {
        mlc_ctx *ctx[2];
        mlc_tensor *x[2], *y[2], *got[2][4];
        mlc_module *conv[2];
        for (side = 0; side < 2; side++) {         /* 0: the Sequential, 1: the two ops */
            mlc_module *net;
            mlc_tensor *r;
            ctx[side] = test_ctx(11 + (unsigned)k);
            conv[side] = mlc_nn_conv2d(ctx[side], 4, 6, 3, opts[k]);
            net = mlc_nn_sequential(ctx[side], conv[side], mlc_nn_relu(ctx[side]), NULL);
            x[side] = mlc_requires_grad(mlc_randn(ctx[side], MLC_SHAPE(3, 4, 9, 9)), 1);
            CHECK(net && x[side]);
            y[side] = side ? mlc_relu(mlc_conv2d(x[side], conv[side]->params[0], conv[side]->params[1], opts[k]))
                           : mlc_forward(net, x[side]);
            CHECK(y[side] != NULL);
            if (side == 0)
                CHECK_MSG(mlc_get_stats(ctx[0]).tape_nodes == (test_device_fail_at(ctx[0], -1) < 0 ? 1u : 2u),
                          "case %d: %zu tape nodes", k, mlc_get_stats(ctx[0]).tape_nodes);
            r = mlc_randn(ctx[side], 4, y[side]->shape);
            CHECK(mlc_backward(mlc_sum_all(mlc_mul(y[side], r))) == MLC_OK);
            got[side][0] = y[side]; got[side][1] = x[side];
            got[side][2] = conv[side]->params[0]; got[side][3] = conv[side]->params[1];
        }
        CHECK(fused_same_bits(k, got));
        test_destroy(ctx[0]);
        test_destroy(ctx[1]);
    }
    return 1;
}

/* Sequential runs a Linear followed by a ReLU as one op on the CPU (bias and relu applied by the
   threads to their own parts of the product, and backward's g·(y > 0) and bias sums split by
   columns: one tape node) with the same bits, output and gradients of x, weight and bias, as
   mlc_matmul_t, mlc_add (the bias) and mlc_relu in a context made alike: a product shared out
   between threads (the bench MLP's first layer), one run as a single block, a 3-D input, one of
   3 rows (products with few rows) and one without bias; on a device the two run in turn. */
static int sequential_fuses_linear_relu(void) {
    static const int cases[][5] = {   /* batch, time (0: a 2-D input), in, out, bias */
        { 64, 0, 784, 256, 1 }, { 5, 0, 12, 7, 1 }, { 4, 6, 40, 96, 1 }, { 3, 0, 50, 40, 1 }, { 16, 0, 70, 33, 0 }
    };
    int k, side;
    for (k = 0; k < 5; k++) {
        const int *c = cases[k];
        mlc_ctx *ctx[2];
        mlc_tensor *x[2], *y[2], *got[2][4];
        mlc_module *lin[2];
        for (side = 0; side < 2; side++) {         /* 0: the Sequential, 1: the two ops */
            mlc_module *net;
            mlc_tensor *r, *bias;
            ctx[side] = test_ctx(21 + (unsigned)k);
            lin[side] = c[4] ? mlc_nn_linear(ctx[side], c[2], c[3]) : mlc_nn_linear_nobias(ctx[side], c[2], c[3]);
            net = mlc_nn_sequential(ctx[side], lin[side], mlc_nn_relu(ctx[side]), NULL);
            x[side] = mlc_requires_grad(c[1] ? mlc_randn(ctx[side], MLC_SHAPE(c[0], c[1], c[2]))
                                             : mlc_randn(ctx[side], MLC_SHAPE(c[0], c[2])), 1);
            CHECK(net && x[side]);
            bias = c[4] ? lin[side]->params[1] : NULL;
            y[side] = !side ? mlc_forward(net, x[side])
                      : bias ? mlc_relu(mlc_add(mlc_matmul_t(x[side], lin[side]->params[0], 0, 1), bias))
                             : mlc_relu(mlc_matmul_t(x[side], lin[side]->params[0], 0, 1));
            CHECK(y[side] != NULL);
            if (side == 0)
                CHECK_MSG(mlc_get_stats(ctx[0]).tape_nodes == (test_device_fail_at(ctx[0], -1) < 0 ? 1u : 2u),
                          "case %d: %zu tape nodes", k, mlc_get_stats(ctx[0]).tape_nodes);
            r = mlc_randn(ctx[side], y[side]->ndim, y[side]->shape);
            CHECK(mlc_backward(mlc_sum_all(mlc_mul(y[side], r))) == MLC_OK);
            got[side][0] = y[side]; got[side][1] = x[side];
            got[side][2] = lin[side]->params[0]; got[side][3] = bias;
        }
        CHECK(fused_same_bits(k, got));
        test_destroy(ctx[0]);
        test_destroy(ctx[1]);
    }
    return 1;
}

/* A Linear (alone, and fused with a ReLU in a Sequential) on an empty batch: its backward has no
   rows of the output gradient to share out or sum, and leaves the weight's and the bias's
   gradients zero. */
static int linear_backward_on_an_empty_batch(void) {
    int fused, i;
    for (fused = 0; fused < 2; fused++) {
        mlc_ctx *ctx = test_ctx(31);
        mlc_module *lin = mlc_nn_linear(ctx, 3, 2);
        mlc_module *net = fused ? mlc_nn_sequential(ctx, lin, mlc_nn_relu(ctx), NULL) : lin;
        mlc_tensor *x = mlc_zeros(ctx, MLC_SHAPE(0, 3)), *y;
        CHECK(net && x);
        y = mlc_forward(net, x);
        CHECK_SHAPE(y, 0, 2);
        CHECK_MSG(mlc_backward(mlc_sum_all(y)) == MLC_OK, "fused %d: %s", fused, mlc_error_message(ctx));
        for (i = 0; i < 6; i++) CHECK(mlc_host_grad(lin->params[0])[i] == 0.0f);
        for (i = 0; i < 2; i++) CHECK(mlc_host_grad(lin->params[1])[i] == 0.0f);
        test_destroy(ctx);
    }
    return 1;
}

static int pool_flatten_forward(void) {
    mlc_ctx *ctx = test_ctx(4);
    mlc_module *maxp = mlc_nn_max_pool2d(ctx, 2, 0), *avgp = mlc_nn_avg_pool2d(ctx, 3, 2), *gap = mlc_nn_global_avg_pool2d(ctx);
    mlc_module *flat = mlc_nn_flatten(ctx);
    mlc_tensor *x = mlc_randn(ctx, MLC_SHAPE(1, 2, 6, 7)), *x7 = mlc_randn(ctx, MLC_SHAPE(1, 1, 7, 7));
    mlc_tensor *x4 = mlc_randn(ctx, MLC_SHAPE(2, 3, 4, 5)), *y;
    int c, oh, ow, i, j;
    CHECK(maxp && avgp && gap && flat && x && x7 && x4);
    y = mlc_forward(maxp, x);                                  /* stride 0 means stride = kernel */
    CHECK_SHAPE(y, 1, 2, 3, 3);
    for (c = 0; c < 2; c++)
        for (oh = 0; oh < 3; oh++)
            for (ow = 0; ow < 3; ow++) {
                float m = -INFINITY;
                for (i = 0; i < 2; i++) for (j = 0; j < 2; j++) {
                    float v = mlc_host_data(x)[(c * 6 + oh * 2 + i) * 7 + ow * 2 + j];
                    if (v > m) m = v;
                }
                CHECK(mlc_host_data(y)[(c * 3 + oh) * 3 + ow] == m);
            }
    y = mlc_forward(avgp, x7);                                 /* (7 - 3) / 2 + 1 = 3 */
    CHECK_SHAPE(y, 1, 1, 3, 3);
    for (oh = 0; oh < 3; oh++)
        for (ow = 0; ow < 3; ow++) {
            double s = 0;
            for (i = 0; i < 3; i++) for (j = 0; j < 3; j++) s += mlc_host_data(x7)[(oh * 2 + i) * 7 + ow * 2 + j];
            CHECK_NEAR(mlc_host_data(y)[oh * 3 + ow], s / 9, 1e-6);
        }
    y = mlc_forward(gap, x4);
    CHECK_SHAPE(y, 2, 3);
    for (c = 0; c < 6; c++) {
        double s = 0;
        for (i = 0; i < 20; i++) s += mlc_host_data(x4)[c * 20 + i];
        CHECK_NEAR(mlc_host_data(y)[c], s / 20, 1e-6);
    }
    y = mlc_forward(flat, x4);
    CHECK_SHAPE(y, 2, 60);
    CHECK(memcmp(mlc_host_data(y), mlc_host_data(x4), x4->size * sizeof(float)) == 0);
    CHECK_SHAPE(mlc_forward(flat, mlc_ones(ctx, MLC_SHAPE(5, 3))), 5, 3);
    test_destroy(ctx);
    return 1;
}

static int embedding_layer_norm_forward(void) {
    mlc_ctx *ctx = test_ctx(6);
    mlc_module *emb = mlc_nn_embedding(ctx, 10, 4), *ln = mlc_nn_layer_norm(ctx, 6);
    const float idx[] = { 3, 0, 9, 9, 1, 3 };
    mlc_tensor *index = mlc_from_data(ctx, MLC_SHAPE(2, 3), idx), *y, *x = mlc_randn(ctx, MLC_SHAPE(2, 3, 6));
    int k, d;
    CHECK(emb && ln && index && x);
    CHECK_SHAPE(emb->params[0], 10, 4);
    y = mlc_forward(emb, index);
    CHECK_SHAPE(y, 2, 3, 4);
    for (k = 0; k < 6; k++)
        for (d = 0; d < 4; d++) CHECK(mlc_host_data(y)[k * 4 + d] == mlc_host_data(emb->params[0])[(int)idx[k] * 4 + d]);
    { float v[36];
      for (k = 0; k < (int)x->size; k++) v[k] = mlc_host_data(x)[k] * 3.0f + 5.0f;
      CHECK(mlc_write(x, v, x->size) == MLC_OK); }
    y = mlc_forward(ln, x);
    CHECK_SHAPE(y, 2, 3, 6);
    for (k = 0; k < 6; k++) {                                  /* every row: mean 0, variance v/(v+eps) */
        double s = 0, v = 0, ys = 0, yv = 0, mu;
        for (d = 0; d < 6; d++) s += mlc_host_data(x)[k * 6 + d];
        mu = s / 6;
        for (d = 0; d < 6; d++) {
            double o = mlc_host_data(y)[k * 6 + d];
            v += (mlc_host_data(x)[k * 6 + d] - mu) * (mlc_host_data(x)[k * 6 + d] - mu);
            ys += o; yv += o * o;
        }
        CHECK_NEAR(ys / 6, 0.0, 1e-5);
        CHECK_NEAR(yv / 6, (v / 6) / (v / 6 + 1e-5), 1e-4);
        for (d = 0; d < 6; d++)
            CHECK_NEAR(mlc_host_data(y)[k * 6 + d], (mlc_host_data(x)[k * 6 + d] - mu) / sqrt(v / 6 + 1e-5), 1e-4);
    }
    test_destroy(ctx);
    return 1;
}

static int activation_modules_forward(void) {
    mlc_ctx *ctx = test_ctx(7);
    const float xv[] = { -2.0f, -0.5f, 0.0f, 1.5f };
    mlc_tensor *x = mlc_from_data(ctx, MLC_SHAPE(2, 2), xv);
    mlc_module *relu = mlc_nn_relu(ctx), *leaky = mlc_nn_leaky_relu(ctx, 0.1f), *sig = mlc_nn_sigmoid(ctx);
    mlc_module *th = mlc_nn_tanh(ctx), *silu = mlc_nn_silu(ctx), *gelu = mlc_nn_gelu(ctx);
    mlc_tensor *y;
    int i;
    CHECK(x && relu && leaky && sig && th && silu && gelu);
    for (i = 0; i < 4; i++) {
        double v = xv[i], s = 1 / (1 + exp(-v));
        y = mlc_forward(relu, x);  CHECK_SHAPE(y, 2, 2); CHECK_NEAR(mlc_host_data(y)[i], v > 0 ? v : 0, 1e-7);
        y = mlc_forward(leaky, x); CHECK_NEAR(mlc_host_data(y)[i], v > 0 ? v : 0.1 * v, 1e-7);
        y = mlc_forward(sig, x);   CHECK_NEAR(mlc_host_data(y)[i], s, 1e-6);
        y = mlc_forward(th, x);    CHECK_NEAR(mlc_host_data(y)[i], tanh(v), 1e-6);
        y = mlc_forward(silu, x);  CHECK_NEAR(mlc_host_data(y)[i], v * s, 1e-6);
        y = mlc_forward(gelu, x);  CHECK_NEAR(mlc_host_data(y)[i], 0.5 * v * (1 + erf(v / sqrt(2.0))), 1e-6);
    }
    test_destroy(ctx);
    return 1;
}

/* ---------- custom modules ---------- */

static int custom_module_with_optimiser(void) {
    mlc_ctx *ctx = test_ctx(8);
    mlc_module *m = make_affine(ctx);
    mlc_named_tensor ps[8];
    mlc_optim *opt;
    mlc_tensor *x = mlc_randn(ctx, MLC_SHAPE(4, 3)), *y, *before[3];
    const float lr = 0.1f;
    int k, n;
    size_t j;
    CHECK(m && x);
    CHECK(strcmp(m->type, "Affine") == 0);
    n = mlc_module_parameters(m, ps, 8);
    CHECK(n == 3 && strcmp(ps[0].name, "scale") == 0 && strcmp(ps[1].name, "inner.weight") == 0 && strcmp(ps[2].name, "inner.bias") == 0);
    CHECK(mlc_module_param_count(m) == 3 + 9 + 3);
    opt = mlc_sgd(ctx, m, (mlc_sgd_opts){ .lr = lr });
    CHECK(opt);
    y = mlc_forward(m, x);
    CHECK_SHAPE(y, 4, 3);
    /* y = (x * 2) Wᵀ + b */
    { size_t r, o, i;
      for (r = 0; r < 4; r++) for (o = 0; o < 3; o++) {
          double s = mlc_host_data(ps[2].tensor)[o];
          for (i = 0; i < 3; i++) s += 2.0 * mlc_host_data(x)[r * 3 + i] * mlc_host_data(ps[1].tensor)[o * 3 + i];
          CHECK_NEAR(mlc_host_data(y)[r * 3 + o], s, 1e-5);
      } }
    for (k = 0; k < 3; k++) before[k] = mlc_copy(ps[k].tensor);
    mlc_zero_grad(opt);
    CHECK(mlc_backward(mlc_sum_all(mlc_mul(y, y))) == MLC_OK);
    mlc_step(opt);
    for (k = 0; k < 3; k++) {                                  /* every parameter moved by -lr grad */
        double moved = 0;
        for (j = 0; j < ps[k].tensor->size; j++) {
            CHECK_NEAR(mlc_host_data(ps[k].tensor)[j], mlc_host_data(before[k])[j] - lr * mlc_host_grad(ps[k].tensor)[j], 1e-6);
            moved += fabs(mlc_host_data(ps[k].tensor)[j] - mlc_host_data(before[k])[j]);
        }
        CHECK_MSG(moved > 1e-4, "%.120s did not move", ps[k].name);
    }
    /* a frame tensor cannot be a parameter; a module holds at most MLC_MODULE_MAX_TENSORS */
    CHECK(mlc_module_add_param(m, "tmp", mlc_ones(ctx, MLC_SHAPE(2))) == MLC_ERR_ARG);
    mlc_clear_error(ctx);
    for (k = 1; k < MLC_MODULE_MAX_TENSORS; k++) CHECK(mlc_module_add_param(m, "extra", mlc_parameter(ctx, MLC_SHAPE(1))) == MLC_OK);
    CHECK(mlc_module_add_param(m, "one_too_many", mlc_parameter(ctx, MLC_SHAPE(1))) == MLC_ERR_ARG);
    mlc_clear_error(ctx);
    /* a module without forward */
    CHECK(mlc_forward(mlc_nn_custom(ctx, NULL, NULL, NULL), x) == NULL && mlc_error(ctx) == MLC_ERR_STATE);
    test_destroy(ctx);
    return 1;
}

const test_case tests_modules[] = {
    TEST(names_like_pytorch)
    TEST(count_when_max_is_smaller)
    TEST(linear_default_init)
    TEST(conv_default_init)
    TEST(init_functions)
    TEST(same_seed_same_weights)
    TEST(train_eval_recursive)
    TEST(dropout_train_and_eval)
    TEST(batch_norm_train_and_eval)
    TEST(batch_norm_2d_statistics)
    TEST(linear_forward)
    TEST(conv2d_forward)
    TEST(sequential_fuses_conv_relu)
    TEST(sequential_fuses_linear_relu)
    TEST(linear_backward_on_an_empty_batch)
    TEST(pool_flatten_forward)
    TEST(embedding_layer_norm_forward)
    TEST(activation_modules_forward)
    TEST(custom_module_with_optimiser)
    { NULL, NULL }
};
