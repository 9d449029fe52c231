/* Optimisers against closed-form updates computed here in double, gradient utilities, the
   learning-rate schedules, and a regression that must converge. */
#include <float.h>
#include "test.h"

#define NP 4
static const float P0[NP] = { 0.5f, -1.25f, 2.0f, 0.0f };
static const float C[NP] = { 1.0f, -0.5f, 0.25f, 3.0f };

/* The test objective: L(p) = Σ c p + ½ Σ p², so the gradient is g = c + p. */
static double grad_of(int j, double p) { return C[j] + p; }

static mlc_tensor *make_param(mlc_ctx *ctx) {
    mlc_tensor *p = mlc_parameter(ctx, MLC_SHAPE(NP));
    if (p && mlc_write(p, P0, NP) != MLC_OK) return NULL;
    return p;
}

/* Backward of L = Σ c p + ½ Σ p²: p->grad += c + p. */
static int add_grad(mlc_tensor *p, mlc_tensor *c) {
    mlc_frame f = mlc_frame_begin(p->ctx);
    mlc_tensor *loss = mlc_add(mlc_sum_all(mlc_mul(c, p)), mlc_mul_scalar(mlc_sum_all(mlc_mul(p, p)), 0.5f));
    mlc_result r = mlc_backward(loss);
    mlc_frame_end(f);
    return r == MLC_OK;
}

/* zero_grad, then backward of L: p->grad = c + p. */
static int compute_grad(mlc_optim *opt, mlc_tensor *p) {
    mlc_frame f = mlc_frame_begin(p->ctx);
    int ok;
    mlc_zero_grad(opt);
    ok = add_grad(p, mlc_from_data(p->ctx, MLC_SHAPE(NP), C));
    mlc_frame_end(f);
    return ok;
}

/* Runs `steps` steps of opt on a fresh parameter, checking after each step that the parameter
   equals the reference in want[step][j] (filled by the caller's closed form). */
static int run_and_compare(mlc_ctx *ctx, mlc_optim *opt, mlc_tensor *p, int steps, double want[][NP], double tol) {
    int s, j;
    for (s = 0; s < steps; s++) {
        CHECK(compute_grad(opt, p));
        for (j = 0; j < NP; j++) CHECK_NEAR(mlc_host_grad(p)[j], grad_of(j, mlc_host_data(p)[j]), 1e-6);
        mlc_step(opt);
        for (j = 0; j < NP; j++)
            CHECK_MSG(fabs(mlc_host_data(p)[j] - want[s][j]) <= tol, "step %d, element %d: %.9g, expected %.9g",
                      s + 1, j, (double)mlc_host_data(p)[j], want[s][j]);
    }
    CHECK(mlc_error(ctx) == MLC_OK);
    return 1;
}

/* ---------- SGD ---------- */

typedef struct sgd_ref { double lr, mu, damp, wd; int nesterov; } sgd_ref;

static void sgd_reference(sgd_ref c, int steps, double out[][NP]) {
    double p[NP], buf[NP];
    int s, j;
    for (j = 0; j < NP; j++) p[j] = P0[j];
    for (s = 0; s < steps; s++) {
        for (j = 0; j < NP; j++) {
            double g = grad_of(j, p[j]) + c.wd * p[j];
            if (c.mu != 0) {
                buf[j] = s == 0 ? g : c.mu * buf[j] + (1 - c.damp) * g;
                g = c.nesterov ? g + c.mu * buf[j] : buf[j];
            }
            p[j] -= c.lr * g;
            out[s][j] = p[j];
        }
    }
}

static int sgd_case(sgd_ref c, int steps) {
    mlc_ctx *ctx = test_ctx(1);
    mlc_tensor *p = make_param(ctx);
    mlc_optim *opt;
    double want[8][NP];
    mlc_sgd_opts cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.lr = (float)c.lr; cfg.momentum = (float)c.mu; cfg.dampening = (float)c.damp;
    cfg.weight_decay = (float)c.wd; cfg.nesterov = c.nesterov;
    CHECK(p);
    opt = mlc_sgd(ctx, NULL, cfg);
    CHECK(opt && mlc_optim_add_param(opt, p) == MLC_OK);
    /* the reference takes the float-rounded hyperparameters, as mlc does */
    c.lr = cfg.lr; c.mu = cfg.momentum; c.damp = cfg.dampening; c.wd = cfg.weight_decay;
    sgd_reference(c, steps, want);
    if (!run_and_compare(ctx, opt, p, steps, want, 2e-6)) return 0;
    test_destroy(ctx);
    return 1;
}

static int sgd_plain(void) {
    /* one step by hand: p1 = p0 - lr (c + p0) */
    mlc_ctx *ctx = test_ctx(1);
    mlc_tensor *p = make_param(ctx);
    mlc_optim *opt = mlc_sgd(ctx, NULL, (mlc_sgd_opts){ .lr = 0.5f });
    int j;
    CHECK(p && opt && mlc_optim_add_param(opt, p) == MLC_OK);
    CHECK(compute_grad(opt, p));
    mlc_step(opt);
    for (j = 0; j < NP; j++) CHECK_NEAR(mlc_host_data(p)[j], P0[j] - 0.5 * (C[j] + P0[j]), 1e-6);
    CHECK_NEAR(mlc_host_data(p)[0], -0.25, 1e-7);          /* 0.5 - 0.5 (1 + 0.5) */
    test_destroy(ctx);
    return sgd_case((sgd_ref){ 0.1, 0, 0, 0, 0 }, 5);
}

static int sgd_weight_decay(void) {
    mlc_ctx *ctx = test_ctx(1);
    mlc_tensor *p = make_param(ctx);
    mlc_optim *opt = mlc_sgd(ctx, NULL, (mlc_sgd_opts){ .lr = 0.5f, .weight_decay = 0.25f });
    CHECK(p && opt && mlc_optim_add_param(opt, p) == MLC_OK);
    CHECK(compute_grad(opt, p));
    mlc_step(opt);
    /* p1 = p0 - lr (c + p0 + wd p0) = 2 - 0.5 (0.25 + 2 + 0.5) = 0.625 */
    CHECK_NEAR(mlc_host_data(p)[2], 0.625, 1e-6);
    test_destroy(ctx);
    return sgd_case((sgd_ref){ 0.1, 0, 0, 0.05, 0 }, 5);
}

static int sgd_momentum(void) {
    /* first step: buf = g, so p1 equals plain SGD's; second: buf = μ g1 + (1-τ) g2 */
    mlc_ctx *ctx = test_ctx(1);
    mlc_tensor *p = make_param(ctx);
    mlc_optim *opt = mlc_sgd(ctx, NULL, (mlc_sgd_opts){ .lr = 0.5f, .momentum = 0.5f, .dampening = 0.5f });
    double p1, g1, g2;
    CHECK(p && opt && mlc_optim_add_param(opt, p) == MLC_OK);
    CHECK(compute_grad(opt, p));
    mlc_step(opt);
    g1 = C[0] + P0[0];                              /* 1.5 */
    p1 = P0[0] - 0.5 * g1;                          /* -0.25: no dampening on the first step */
    CHECK_NEAR(mlc_host_data(p)[0], p1, 1e-6);
    CHECK(compute_grad(opt, p));
    mlc_step(opt);
    g2 = C[0] + p1;                                 /* 0.75 */
    CHECK_NEAR(mlc_host_data(p)[0], p1 - 0.5 * (0.5 * g1 + 0.5 * g2), 1e-6);   /* -0.8125 */
    test_destroy(ctx);
    return sgd_case((sgd_ref){ 0.05, 0.9, 0, 0, 0 }, 6) && sgd_case((sgd_ref){ 0.05, 0.9, 0.3, 0.01, 0 }, 6);
}

static int sgd_nesterov(void) {
    mlc_ctx *ctx = test_ctx(1);
    mlc_tensor *p = make_param(ctx);
    mlc_optim *opt = mlc_sgd(ctx, NULL, (mlc_sgd_opts){ .lr = 0.5f, .momentum = 0.5f, .nesterov = 1 });
    CHECK(p && opt && mlc_optim_add_param(opt, p) == MLC_OK);
    CHECK(compute_grad(opt, p));
    mlc_step(opt);
    /* step 1: buf = g = 1.5, update g + μ buf = 2.25: p1 = 0.5 - 0.5 * 2.25 */
    CHECK_NEAR(mlc_host_data(p)[0], -0.625, 1e-6);
    test_destroy(ctx);
    return sgd_case((sgd_ref){ 0.05, 0.9, 0, 0, 1 }, 6) && sgd_case((sgd_ref){ 0.05, 0.8, 0, 0.1, 1 }, 6);
}

/* ---------- Adam / AdamW ---------- */

typedef struct adam_ref { double lr, b1, b2, eps, wd; int decoupled; } adam_ref;

static void adam_reference(adam_ref c, int steps, double out[][NP]) {
    double p[NP], m[NP] = { 0 }, v[NP] = { 0 };
    int s, j;
    for (j = 0; j < NP; j++) p[j] = P0[j];
    for (s = 0; s < steps; s++) {
        int t = s + 1;
        for (j = 0; j < NP; j++) {
            double g = grad_of(j, p[j]), mhat, vhat;
            if (c.decoupled) p[j] -= c.lr * c.wd * p[j];
            else g += c.wd * p[j];
            m[j] = c.b1 * m[j] + (1 - c.b1) * g;
            v[j] = c.b2 * v[j] + (1 - c.b2) * g * g;
            mhat = m[j] / (1 - pow(c.b1, t));
            vhat = v[j] / (1 - pow(c.b2, t));
            p[j] -= c.lr * mhat / (sqrt(vhat) + c.eps);
            out[s][j] = p[j];
        }
    }
}

static int adam_three_steps(void) {
    mlc_ctx *ctx = test_ctx(1);
    mlc_tensor *p = make_param(ctx);
    mlc_optim *opt = mlc_adam(ctx, NULL, (mlc_adam_opts){ .lr = 0.1f });
    adam_ref c = { 0, 0, 0, 0, 0, 0 };
    double want[3][NP];
    CHECK(p && opt && mlc_optim_add_param(opt, p) == MLC_OK);
    c.lr = 0.1f; c.b1 = 0.9f; c.b2 = 0.999f; c.eps = 1e-8f;   /* the defaults, float-rounded */
    adam_reference(c, 3, want);
    /* bias correction makes the first step lr · sign(g) (|g| >> eps) */
    CHECK_NEAR(want[0][0], 0.5 - 0.1, 1e-7);
    if (!run_and_compare(ctx, opt, p, 3, want, 2e-6)) return 0;
    /* without bias correction the third step would be far off: the test can tell */
    { double m = 0, v = 0, q = P0[1]; int s;
      for (s = 0; s < 3; s++) { double g = grad_of(1, q); m = 0.9 * m + 0.1 * g; v = 0.999 * v + 0.001 * g * g; q -= 0.1 * m / (sqrt(v) + 1e-8); }
      CHECK(fabs(q - want[2][1]) > 0.01); }
    test_destroy(ctx);
    return 1;
}

static int adam_l2_versus_adamw(void) {
    mlc_ctx *ctx = test_ctx(1);
    mlc_tensor *pa = make_param(ctx), *pw = make_param(ctx);
    mlc_adam_opts cfg = { 0.05f, 0.8f, 0.99f, 1e-6f, 0.3f, 0 };
    mlc_optim *adam = mlc_adam(ctx, NULL, cfg), *adamw = mlc_adamw(ctx, NULL, cfg);
    adam_ref c = { 0, 0, 0, 0, 0, 0 };
    double want_a[4][NP], want_w[4][NP];
    int j, s;
    CHECK(pa && pw && adam && adamw);
    CHECK(mlc_optim_add_param(adam, pa) == MLC_OK && mlc_optim_add_param(adamw, pw) == MLC_OK);
    c.lr = cfg.lr; c.b1 = cfg.beta1; c.b2 = cfg.beta2; c.eps = cfg.eps; c.wd = cfg.weight_decay;
    adam_reference(c, 4, want_a);
    c.decoupled = 1;
    adam_reference(c, 4, want_w);
    if (!run_and_compare(ctx, adam, pa, 4, want_a, 2e-6)) return 0;
    if (!run_and_compare(ctx, adamw, pw, 4, want_w, 2e-6)) return 0;
    /* the two rules really differ here (so the checks above tell them apart) */
    for (s = 0; s < 4; s++) for (j = 0; j < NP; j++) if (j != 3 || s > 0) CHECK(fabs(want_a[s][j] - want_w[s][j]) > 1e-4);
    /* step 1 of AdamW by hand for p = 2: p (1 - lr wd) - lr sign(g) = 2 · 0.985 - 0.05 */
    CHECK_NEAR(want_w[0][2], 2.0 * (1 - 0.05 * 0.3) - 0.05, 1e-6);
    /* AdamW's default weight decay is 0.01, Adam's 0 */
    { mlc_tensor *q = make_param(ctx); mlc_optim *w = mlc_adamw(ctx, NULL, (mlc_adam_opts){ .lr = 0.1f });
      CHECK(q && w && mlc_optim_add_param(w, q) == MLC_OK && compute_grad(w, q));
      mlc_step(w);
      CHECK_NEAR(mlc_host_data(q)[2], 2.0 * (1 - 0.1 * 0.01) - 0.1, 1e-6); }
    test_destroy(ctx);
    return 1;
}

/* AMSGrad: Adam and AdamW dividing by the largest v so far. The parameter after each of six
   steps, from PyTorch 1.13 (torch.optim.Adam / AdamW(lr=0.5, betas=(0.8, 0.5), eps=1e-6,
   weight_decay=0.1, amsgrad=True) on the same objective, float32, /usr/bin/python3). */
static int adam_amsgrad_against_pytorch(void) {
    static const float want[2][6][NP] = {
        { { 2.98023224e-07f, -0.750000238f, 1.50000024f, -0.499999851f },
          { -0.491653264f, -0.237422109f, 0.989273727f, -1.00914121f },
          { -0.885364413f, 0.199367225f, 0.522626877f, -1.49178243f },
          { -1.15874732f, 0.533050776f, 0.128821939f, -1.91938996f },
          { -1.31729817f, 0.76181066f, -0.18394804f, -2.28153229f },
          { -1.37871218f, 0.89562428f, -0.417295873f, -2.57640505f } },
        { { -0.0249996781f, -0.687500298f, 1.40000021f, -0.499999851f },
          { -0.517049432f, -0.150105417f, 0.817932546f, -0.983434141f },
          { -0.892929912f, 0.27875334f, 0.324317068f, -1.42509127f },
          { -1.13980675f, 0.582535207f, -0.0598773062f, -1.80119228f },
          { -1.27170682f, 0.770538807f, -0.336842775f, -2.10630417f },
          { -1.31247246f, 0.862161338f, -0.518509805f, -2.34319401f } } };
    /* without amsgrad PyTorch's Adam is at -1.04519296 after step 3: the test tells them apart */
    static const float plain_adam_step3 = -1.04519296f;
    int w, s, j;
    CHECK(fabsf(want[0][2][0] - plain_adam_step3) > 0.1f);
    for (w = 0; w < 2; w++) {
        mlc_ctx *ctx = test_ctx(1);
        mlc_tensor *p = make_param(ctx);
        mlc_adam_opts cfg = { 0.5f, 0.8f, 0.5f, 1e-6f, 0.1f, 1 };
        mlc_optim *opt = w ? mlc_adamw(ctx, NULL, cfg) : mlc_adam(ctx, NULL, cfg);
        CHECK(p && opt && mlc_optim_add_param(opt, p) == MLC_OK);
        for (s = 0; s < 6; s++) {
            CHECK(compute_grad(opt, p));
            mlc_step(opt);
            for (j = 0; j < NP; j++)
                CHECK_MSG(fabsf(mlc_host_data(p)[j] - want[w][s][j]) <= 2e-6f, "%s step %d, element %d: %.9g, expected %.9g",
                          w ? "adamw" : "adam", s + 1, j, (double)mlc_host_data(p)[j], (double)want[w][s][j]);
        }
        CHECK(mlc_error(ctx) == MLC_OK);
        test_destroy(ctx);
    }
    return 1;
}

/* Adam's loop runs 8 floats at a time where the CPU has AVX, one at a time for the rest: a
   parameter of 43 elements (5 blocks and a tail of 3) must step as 43 one-element parameters
   do (always the scalar loop), for Adam, AdamW and AMSGrad, over several steps with gradients
   of either sign and magnitudes from 1e-3 to 10: equal bits in a plain build, an ulp or so
   apart under -ffast-math or x87 (a wrong constant in either path is off by ~lr). */
static int adam_blocks_equal_the_loop(void) {
    enum { N = 43 };
    int kind, s, j;
    for (kind = 0; kind < 3; kind++) {
        mlc_ctx *ctx = test_ctx(1);
        mlc_adam_opts cfg = { 0.01f, 0.8f, 0.95f, 1e-6f, 0.1f, kind == 2 };
        mlc_optim *whole = kind == 1 ? mlc_adamw(ctx, NULL, cfg) : mlc_adam(ctx, NULL, cfg),
                  *single = kind == 1 ? mlc_adamw(ctx, NULL, cfg) : mlc_adam(ctx, NULL, cfg);
        mlc_tensor *p = mlc_parameter(ctx, MLC_SHAPE(N)), *q[N];
        CHECK(p && whole && single && mlc_optim_add_param(whole, p) == MLC_OK);
        for (j = 0; j < N; j++) {
            q[j] = mlc_parameter(ctx, MLC_SHAPE(1));
            CHECK(q[j] && mlc_optim_add_param(single, q[j]) == MLC_OK);
            /* g + wd p is never near 0 (a cancellation would magnify x87's extra precision) */
            mlc_host_data(p)[j] = mlc_host_data(q[j])[0] = 0.1f * (float)(j % 7) - 0.25f;
        }
        for (s = 0; s < 5; s++) {
            for (j = 0; j < N; j++) {       /* g = ±10^(j % 5 - 3), its sign turning with the step */
                float g = powf(10.0f, (float)(j % 5 - 3)) * ((j + s) % 3 ? 1.0f : -1.0f);
                mlc_host_grad(p)[j] = mlc_host_grad(q[j])[0] = g;
            }
            mlc_step(whole);
            mlc_step(single);
            for (j = 0; j < N; j++)
                CHECK_MSG(fabsf(mlc_host_data(p)[j] - mlc_host_data(q[j])[0])
                              <= 1e-6f * (fabsf(mlc_host_data(q[j])[0]) + cfg.lr),   /* an ulp or so */
                          "kind %d step %d element %d: %.9g in blocks, %.9g alone", kind, s + 1, j,
                          (double)mlc_host_data(p)[j], (double)mlc_host_data(q[j])[0]);
        }
        CHECK(mlc_error(ctx) == MLC_OK);
        test_destroy(ctx);
    }
    return 1;
}

/* ---------- RMSprop ---------- */

typedef struct rms_ref { double lr, alpha, eps, wd, mu; int centered; } rms_ref;

static void rms_reference(rms_ref c, int steps, double out[][NP]) {
    double p[NP], v[NP] = { 0 }, gbar[NP] = { 0 }, buf[NP] = { 0 };
    int s, j;
    for (j = 0; j < NP; j++) p[j] = P0[j];
    for (s = 0; s < steps; s++)
        for (j = 0; j < NP; j++) {
            double g = grad_of(j, p[j]) + c.wd * p[j], avg;
            v[j] = c.alpha * v[j] + (1 - c.alpha) * g * g;
            if (c.centered) {
                gbar[j] = c.alpha * gbar[j] + (1 - c.alpha) * g;
                avg = sqrt(v[j] - gbar[j] * gbar[j]) + c.eps;
            } else avg = sqrt(v[j]) + c.eps;
            if (c.mu > 0) { buf[j] = c.mu * buf[j] + g / avg; p[j] -= c.lr * buf[j]; }
            else p[j] -= c.lr * g / avg;
            out[s][j] = p[j];
        }
}

static int rmsprop_case(mlc_rmsprop_opts cfg, int steps, double tol) {
    mlc_ctx *ctx = test_ctx(1);
    mlc_tensor *p = make_param(ctx);
    mlc_optim *opt = mlc_rmsprop(ctx, NULL, cfg);
    rms_ref c;
    double want[6][NP];
    CHECK(p && opt && mlc_optim_add_param(opt, p) == MLC_OK);
    c.lr = cfg.lr > 0 ? cfg.lr : 0.01f; c.alpha = cfg.alpha > 0 ? cfg.alpha : 0.99f; c.eps = cfg.eps > 0 ? cfg.eps : 1e-8f;
    c.wd = cfg.weight_decay; c.mu = cfg.momentum; c.centered = cfg.centered;
    rms_reference(c, steps, want);
    if (!run_and_compare(ctx, opt, p, steps, want, tol)) return 0;
    test_destroy(ctx);
    return 1;
}

static int rmsprop_plain(void) {
    /* step 1 by hand: v = (1-α) g², p -= lr g / √v = lr sign(g) / √(1-α) */
    double want[1][NP];
    rms_ref c = { 0.01f, 0.99f, 1e-8f, 0, 0, 0 };
    rms_reference(c, 1, want);
    CHECK_NEAR(want[0][0], 0.5 - 0.01f / sqrt(1 - 0.99f), 1e-6);
    return rmsprop_case((mlc_rmsprop_opts){ 0, 0, 0, 0, 0, 0 }, 5, 1e-5) &&      /* all defaults */
           rmsprop_case((mlc_rmsprop_opts){ 0.02f, 0.9f, 1e-6f, 0.1f, 0, 0 }, 5, 1e-5);
}

static int rmsprop_centered(void) {
    double a[5][NP], b[5][NP];
    rms_ref c = { 0.01f, 0.9f, 1e-8f, 0, 0, 1 };
    rms_reference(c, 5, a);
    c.centered = 0;
    rms_reference(c, 5, b);
    CHECK(fabs(a[4][0] - b[4][0]) > 1e-3);                        /* centering changes the path */
    return rmsprop_case((mlc_rmsprop_opts){ 0.01f, 0.9f, 0, 0, 0, 1 }, 5, 1e-5);
}

static int rmsprop_momentum(void) {
    return rmsprop_case((mlc_rmsprop_opts){ 0.01f, 0.9f, 0, 0, 0.8f, 0 }, 6, 1e-5) &&
           rmsprop_case((mlc_rmsprop_opts){ 0.005f, 0.95f, 0, 0.02f, 0.5f, 1 }, 6, 1e-5);
}

/* ---------- the state each rule keeps ---------- */

/* The optimiser holds only the state buffers its rule reads, on every device; the updates
   above check that the results are unchanged. */
static int state_only_what_the_rule_reads(void) {
    enum { N = 4096 };
    const size_t buffer = N * sizeof(float);
    int kind;
    for (kind = 0; kind < 8; kind++) {
        mlc_ctx *ctx = test_ctx(3);
        mlc_tensor *p = mlc_parameter(ctx, MLC_SHAPE(N));
        size_t before = mlc_get_stats(ctx).bytes_current, grew;
        static const int kept[8] = { 0, 1, 2, 2, 1, 2, 3, 3 };
        int want = kept[kind];
        mlc_optim *opt = kind == 0 ? mlc_sgd(ctx, NULL, (mlc_sgd_opts){ 0 })
                       : kind == 1 ? mlc_sgd(ctx, NULL, (mlc_sgd_opts){ .momentum = 0.9f })
                       : kind == 2 ? mlc_adam(ctx, NULL, (mlc_adam_opts){ 0 })
                       : kind == 3 ? mlc_adamw(ctx, NULL, (mlc_adam_opts){ 0 })
                       : kind == 4 ? mlc_rmsprop(ctx, NULL, (mlc_rmsprop_opts){ 0 })
                       : kind == 5 ? mlc_rmsprop(ctx, NULL, (mlc_rmsprop_opts){ .momentum = 0.5f })
                       : kind == 6 ? mlc_rmsprop(ctx, NULL, (mlc_rmsprop_opts){ .momentum = 0.5f, .centered = 1 })
                       : mlc_adam(ctx, NULL, (mlc_adam_opts){ .amsgrad = 1 });
        CHECK(mlc_optim_add_param(opt, p) == MLC_OK);
        grew = mlc_get_stats(ctx).bytes_current - before;
        CHECK_MSG(grew >= (size_t)want * buffer && grew < (size_t)want * buffer + buffer / 4,
                  "optimiser %d: %zu bytes of state, expected %d buffers of %zu", kind, grew, want, buffer);
        test_destroy(ctx);
    }
    return 1;
}

/* ---------- many parameters in one step ---------- */

/* Parameters of very different sizes, each with its own c in L = Σ c p + ½ Σ p². A device may
   update several in one launch (OpenCL: up to 8), so 11 make two groups there, and the sizes put
   the parameters' boundaries inside work-groups. */
enum { NG = 11 };
static const int GROUP_SIZES[NG] = { 1, 300, 7, 40000, 2, 65, 1, 3001, 9, 257, 5 };
typedef struct param_set { mlc_tensor *p[NG], *c[NG]; } param_set;

static int make_set(mlc_ctx *ctx, param_set *s) {
    static float pv[40000], cv[40000];
    int k, j;
    for (k = 0; k < NG; k++) {
        for (j = 0; j < GROUP_SIZES[k]; j++) {
            pv[j] = 0.25f * (float)((7 * j + 3 * k) % 11) - 1.25f;
            cv[j] = 0.3f * (float)((5 * j + k) % 9) - 1.1f;
        }
        s->p[k] = mlc_parameter(ctx, MLC_SHAPE(GROUP_SIZES[k]));
        s->c[k] = mlc_empty(ctx, MLC_SHAPE(GROUP_SIZES[k]));
        CHECK(s->p[k] && s->c[k]);
        CHECK(mlc_write(s->p[k], pv, (size_t)GROUP_SIZES[k]) == MLC_OK);
        CHECK(mlc_write(s->c[k], cv, (size_t)GROUP_SIZES[k]) == MLC_OK);
    }
    return 1;
}

/* zero_grad on each optimiser, then every parameter's gradient c + p, each on its own device. */
static int set_grads(mlc_optim **opts, int n_opts, param_set *s) {
    int k;
    for (k = 0; k < n_opts; k++) mlc_zero_grad(opts[k]);
    for (k = 0; k < NG; k++) CHECK(add_grad(s->p[k], s->c[k]));
    return 1;
}

/* The rules, with every state buffer and option the kernels read: SGD with Nesterov momentum,
   Adam with AMSGrad and L2 weight decay, AdamW, and centered RMSprop with momentum. */
#define GROUP_RULES 4
static mlc_optim *group_rule(mlc_ctx *ctx, int rule) {
    return rule == 0 ? mlc_sgd(ctx, NULL, (mlc_sgd_opts){ .lr = 0.05f, .momentum = 0.9f, .weight_decay = 0.01f,
                                                             .nesterov = 1 })
         : rule == 1 ? mlc_adam(ctx, NULL, (mlc_adam_opts){ .lr = 0.01f, .weight_decay = 0.1f, .amsgrad = 1 })
         : rule == 2 ? mlc_adamw(ctx, NULL, (mlc_adam_opts){ .lr = 0.01f, .weight_decay = 0.1f })
         : mlc_rmsprop(ctx, NULL, (mlc_rmsprop_opts){ .lr = 0.005f, .weight_decay = 0.01f, .momentum = 0.5f,
                                                        .centered = 1 });
}

static mlc_ctx *cpu_ctx(unsigned long long seed) {
    mlc_config c;
    memset(&c, 0, sizeof c);
    c.seed = seed; c.quiet = 1; c.device = "cpu";
    return mlc_create(&c);
}

/* Kernels ran on the context's device (not on the CPU, nor on the test's fake device). */
static int runs_kernels(mlc_ctx *ctx) { return mlc_has_device(ctx) && strcmp(mlc_device_name(ctx), "fake") != 0; }

/* a's parameters equal b's within tol relative to (1 + |b|), or bit for bit with tol < 0 */
static int sets_agree(param_set *a, param_set *b, double tol, const char *what, int rule) {
    int k, j;
    for (k = 0; k < NG; k++) {
        const float *x = mlc_host_data(a->p[k]), *y = mlc_host_data(b->p[k]);
        CHECK(x && y);
        for (j = 0; j < GROUP_SIZES[k]; j++)
            CHECK_MSG(tol < 0 ? test_bits(x[j]) == test_bits(y[j]) : fabs((double)x[j] - y[j]) <= tol * (1 + fabs(y[j])),
                      "rule %d, %s: parameter %d element %d: %.9g, expected %.9g", rule, what, k, j, (double)x[j],
                      (double)y[j]);
    }
    return 1;
}

/* One optimiser over 11 parameters (on a device: two launches a step) gives the parameters
   that an optimiser for each one gives, bit for bit, and the CPU's within rounding, for every
   rule, over several steps. */
static int many_parameters_step_as_one(void) {
    int rule, k, s;
    for (rule = 0; rule < GROUP_RULES; rule++) {
        mlc_ctx *ctx = test_ctx(21), *cpu = cpu_ctx(21);
        param_set all, each, ref;
        mlc_optim *whole = group_rule(ctx, rule), *single[NG], *on_cpu = group_rule(cpu, rule);
        CHECK(whole && on_cpu && make_set(ctx, &all) && make_set(ctx, &each) && make_set(cpu, &ref));
        for (k = 0; k < NG; k++) {
            single[k] = group_rule(ctx, rule);
            CHECK(single[k] && mlc_optim_add_param(single[k], each.p[k]) == MLC_OK);
            CHECK(mlc_optim_add_param(whole, all.p[k]) == MLC_OK && mlc_optim_add_param(on_cpu, ref.p[k]) == MLC_OK);
        }
        for (s = 0; s < 4; s++) {
            CHECK(set_grads(&whole, 1, &all) && set_grads(single, NG, &each) && set_grads(&on_cpu, 1, &ref));
            mlc_step(whole);
            for (k = 0; k < NG; k++) mlc_step(single[k]);
            mlc_step(on_cpu);
        }
        CHECK_MSG(mlc_error(ctx) == MLC_OK, "%.200s", mlc_error_message(ctx));
        if (!sets_agree(&all, &each, -1, "one optimiser against one per parameter", rule) ||
            !sets_agree(&all, &ref, 1e-5, "against the CPU", rule))
            return 0;
        test_destroy(ctx);
        mlc_destroy(cpu);
    }
    return 1;
}

/* On a device, one mlc_step over up to 8 parameters is one launch, 9 to 11 two, for every rule
   (none on the CPU). */
static int one_launch_per_eight_parameters(void) {
    int rule, k, round;
    for (rule = 0; rule < GROUP_RULES; rule++) {
        mlc_ctx *ctx = test_ctx(22);
        mlc_optim *opt = group_rule(ctx, rule);
        param_set s;
        CHECK(opt && make_set(ctx, &s));
        for (k = 0; k < 8; k++) CHECK(mlc_optim_add_param(opt, s.p[k]) == MLC_OK);
        for (round = 1; round <= 2; round++) {
            size_t before;
            CHECK(set_grads(&opt, 1, &s));
            before = mlc_get_stats(ctx).launches;
            mlc_step(opt);
            CHECK_MSG(mlc_get_stats(ctx).launches - before == (runs_kernels(ctx) ? (size_t)round : 0),
                      "rule %d: %zu launches for %d parameters", rule, mlc_get_stats(ctx).launches - before,
                      round == 1 ? 8 : NG);
            for (k = 8; k < NG; k++) CHECK(mlc_optim_add_param(opt, s.p[k]) == MLC_OK);
        }
        CHECK(mlc_error(ctx) == MLC_OK);
        test_destroy(ctx);
    }
    return 1;
}

/* A device that takes only 256 bytes of a kernel's arguments (what OpenCL's embedded profile
   promises; a launch over 8 parameters takes 480) updates 4 parameters a launch, so 11 take three
   launches, with the parameters of 8 a launch bit for bit, for every rule; the step's other
   kernels fit in 256 bytes too (an argument list too long is an error). */
static int four_parameters_a_launch_within_256_bytes(void) {
    int rule, k, s;
    for (rule = 0; rule < GROUP_RULES; rule++) {
        mlc_ctx *ctx = test_ctx(24), *small = test_ctx(24);
        int opencl = test_device_max_args(small, 256);
        param_set wide, narrow;
        mlc_optim *eight = group_rule(ctx, rule), *four = group_rule(small, rule);
        CHECK(opencl || !runs_kernels(small));
        CHECK(eight && four && make_set(ctx, &wide) && make_set(small, &narrow));
        for (k = 0; k < NG; k++)
            CHECK(mlc_optim_add_param(eight, wide.p[k]) == MLC_OK && mlc_optim_add_param(four, narrow.p[k]) == MLC_OK);
        for (s = 0; s < 3; s++) {
            size_t before;
            CHECK(set_grads(&eight, 1, &wide) && set_grads(&four, 1, &narrow));
            mlc_step(eight);
            before = mlc_get_stats(small).launches;
            mlc_step(four);
            CHECK_MSG(mlc_get_stats(small).launches - before == (opencl ? 3u : 0u), "rule %d: %zu launches", rule,
                      mlc_get_stats(small).launches - before);
        }
        CHECK_MSG(mlc_error(small) == MLC_OK, "%.200s", mlc_error_message(small));
        if (!sets_agree(&narrow, &wide, -1, "4 parameters a launch against 8", rule)) return 0;
        test_destroy(ctx);
        test_destroy(small);
    }
    return 1;
}

/* A model partly on the host: parameters 2 and 9 go home after the optimiser was made (their
   state follows in mlc_step), 5 comes to the device after it was made at home. The device
   updates the runs between (0-1, 3-8, 10: three launches), the CPU the rest, as the CPU alone
   does. */
static int parameters_on_host_and_device(void) {
    static const int home[] = { 2, 9 };
    int rule, s, k;
    for (rule = 0; rule < GROUP_RULES; rule++) {
        mlc_ctx *ctx = test_ctx(23), *cpu = cpu_ctx(23);
        param_set mixed, ref;
        mlc_optim *opt, *on_cpu = group_rule(cpu, rule);
        int device;
        CHECK(ctx && on_cpu && make_set(ctx, &mixed) && make_set(cpu, &ref));
        device = mlc_has_device(ctx);
        if (device) CHECK(mlc_to(mixed.p[5], 0) && mlc_to(mixed.c[5], 0));
        CHECK((opt = group_rule(ctx, rule)) != NULL);
        for (k = 0; k < NG; k++)
            CHECK(mlc_optim_add_param(opt, mixed.p[k]) == MLC_OK && mlc_optim_add_param(on_cpu, ref.p[k]) == MLC_OK);
        if (device) {
            for (k = 0; k < 2; k++) CHECK(mlc_to(mixed.p[home[k]], 0) && mlc_to(mixed.c[home[k]], 0));
            CHECK(mlc_to(mixed.p[5], 1) && mlc_to(mixed.c[5], 1));
        }
        for (s = 0; s < 3; s++) {
            size_t before;
            CHECK(set_grads(&opt, 1, &mixed) && set_grads(&on_cpu, 1, &ref));
            before = mlc_get_stats(ctx).launches;
            mlc_step(opt);
            CHECK_MSG(mlc_get_stats(ctx).launches - before == (runs_kernels(ctx) ? 3u : 0u), "rule %d: %zu launches",
                      rule, mlc_get_stats(ctx).launches - before);
            mlc_step(on_cpu);
        }
        CHECK_MSG(mlc_error(ctx) == MLC_OK, "%.200s", mlc_error_message(ctx));
        if (device) CHECK(!mixed.p[2]->on_device && !mixed.p[9]->on_device && mixed.p[5]->on_device);
        if (!sets_agree(&mixed, &ref, 1e-5, "host and device against the CPU", rule)) return 0;
        test_destroy(ctx);
        mlc_destroy(cpu);
    }
    return 1;
}

/* ---------- gradient utilities ---------- */

/* mlc_zero_grad leaves the zeros to the first reader or to a product that overwrites the
   gradient: a second backward equals the first bit for bit, a parameter the second graph does
   not reach reads as zeros, and a 2-D operand shared by batched products gets every batch. */
static int zero_grad_then_overwrite(void) {
    mlc_ctx *ctx = test_ctx(3);
    mlc_tensor *w1 = mlc_parameter(ctx, MLC_SHAPE(6, 5)), *w2 = mlc_parameter(ctx, MLC_SHAPE(2, 6));
    mlc_tensor *a = mlc_parameter(ctx, MLC_SHAPE(3, 4)), *x = mlc_randn(ctx, MLC_SHAPE(7, 5));
    mlc_tensor *b = mlc_randn(ctx, MLC_SHAPE(2, 4, 5));
    mlc_optim *opt = mlc_sgd(ctx, NULL, (mlc_sgd_opts){ .lr = 0.1f });
    float first[30];
    int i, k, j, round;
    CHECK(w1 && w2 && a && x && b && opt);
    mlc_init_normal(w1, 0.0f, 1.0f); mlc_init_normal(w2, 0.0f, 1.0f);
    CHECK(mlc_optim_add_param(opt, w1) == MLC_OK && mlc_optim_add_param(opt, w2) == MLC_OK
          && mlc_optim_add_param(opt, a) == MLC_OK);
    CHECK(mlc_backward(mlc_sum_all(mlc_linear(mlc_tanh(mlc_linear(x, w1, NULL)), w2, NULL))) == MLC_OK);
    memcpy(first, mlc_host_grad(w1), sizeof first);
    mlc_zero_grad(opt);
    CHECK(mlc_backward(mlc_sum_all(mlc_linear(mlc_tanh(mlc_linear(x, w1, NULL)), w2, NULL))) == MLC_OK);
    for (i = 0; i < 30; i++) CHECK(test_bits(mlc_host_grad(w1)[i]) == test_bits(first[i]));
    mlc_zero_grad(opt);                                   /* w2 is not in this graph */
    CHECK(mlc_backward(mlc_sum_all(mlc_linear(x, w1, NULL))) == MLC_OK);
    for (i = 0; i < 12; i++) CHECK(test_same_float(mlc_host_grad(w2)[i], 0.0f));
    for (i = 0; i < 30; i++) CHECK(!test_same_float(mlc_host_grad(w1)[i], first[i]));
    for (round = 0; round < 2; round++) {                 /* before and after a zero_grad */
        mlc_zero_grad(opt);
        CHECK(mlc_backward(mlc_sum_all(mlc_matmul(a, b))) == MLC_OK);   /* da[i, k] = Σ_batch Σ_j b */
        for (i = 0; i < 3; i++)
            for (k = 0; k < 4; k++) {
                double want = 0;
                for (j = 0; j < 10; j++) want += mlc_host_data(b)[(j / 5) * 20 + k * 5 + j % 5];
                CHECK_NEAR(mlc_host_grad(a)[i * 4 + k], want, 1e-5);
            }
    }
    test_destroy(ctx);
    return 1;
}

static int zero_grad_zeroes(void) {
    mlc_ctx *ctx = test_ctx(2);
    mlc_module *net = mlc_nn_sequential(ctx, mlc_nn_linear(ctx, 3, 4), mlc_nn_tanh(ctx), mlc_nn_linear(ctx, 4, 2), NULL);
    mlc_optim *opt = mlc_sgd(ctx, net, (mlc_sgd_opts){ 0 });
    mlc_named_tensor ps[4];
    mlc_tensor *x = mlc_randn(ctx, MLC_SHAPE(5, 3));
    int i, n;
    size_t j;
    double before = 0, after = 0;
    CHECK(net && opt && x);
    CHECK(mlc_backward(mlc_sum_all(mlc_mul(mlc_forward(net, x), mlc_forward(net, x)))) == MLC_OK);
    n = mlc_module_parameters(net, ps, 4);
    CHECK(n == 4);
    for (i = 0; i < n; i++) for (j = 0; j < ps[i].tensor->size; j++) before += fabs(mlc_host_grad(ps[i].tensor)[j]);
    CHECK(before > 0);
    mlc_zero_grad(opt);
    for (i = 0; i < n; i++) for (j = 0; j < ps[i].tensor->size; j++) after += fabs(mlc_host_grad(ps[i].tensor)[j]);
    CHECK(after == 0);
    /* gradients accumulate without zero_grad */
    CHECK(mlc_backward(mlc_sum_all(ps[3].tensor)) == MLC_OK);
    CHECK(mlc_backward(mlc_sum_all(ps[3].tensor)) == MLC_OK);
    CHECK(mlc_host_grad(ps[3].tensor)[0] == 2.0f && mlc_host_grad(ps[3].tensor)[1] == 2.0f);
    mlc_zero_grad(NULL);                                          /* harmless */
    test_destroy(ctx);
    return 1;
}

static int clip_grad_norm(void) {
    mlc_ctx *ctx = test_ctx(3);
    mlc_tensor *a = mlc_parameter(ctx, MLC_SHAPE(2)), *b = mlc_parameter(ctx, MLC_SHAPE(2, 2));
    mlc_optim *opt = mlc_sgd(ctx, NULL, (mlc_sgd_opts){ 0 });
    const float ga[] = { 3.0f, -4.0f }, gb[] = { 1.0f, 2.0f, -2.0f, 4.0f };
    double norm = sqrt(9.0 + 16 + 1 + 4 + 4 + 16), scale;     /* √50 */
    float r;
    int j;
    CHECK(a && b && opt && mlc_optim_add_param(opt, a) == MLC_OK && mlc_optim_add_param(opt, b) == MLC_OK);
    /* grads set by backward of Σ ga·a + Σ gb·b */
    #define SET_GRADS() do { mlc_frame f_ = mlc_frame_begin(ctx); mlc_zero_grad(opt); \
        CHECK(mlc_backward(mlc_add(mlc_sum_all(mlc_mul(a, mlc_from_data(ctx, MLC_SHAPE(2), ga))), \
                                   mlc_sum_all(mlc_mul(b, mlc_from_data(ctx, MLC_SHAPE(2, 2), gb))))) == MLC_OK); \
        mlc_frame_end(f_); } while (0)
    SET_GRADS();
    r = mlc_clip_grad_norm(opt, 1.0f);
    CHECK_NEAR(r, norm, 1e-5);                                    /* the norm before clipping */
    scale = 1.0 / (norm + 1e-6);
    for (j = 0; j < 2; j++) CHECK_NEAR(mlc_host_grad(a)[j], ga[j] * scale, 1e-6);
    for (j = 0; j < 4; j++) CHECK_NEAR(mlc_host_grad(b)[j], gb[j] * scale, 1e-6);
    { double after = 0; for (j = 0; j < 2; j++) after += mlc_host_grad(a)[j] * mlc_host_grad(a)[j];
      for (j = 0; j < 4; j++) after += mlc_host_grad(b)[j] * mlc_host_grad(b)[j];
      CHECK_NEAR(sqrt(after), 1.0, 1e-5); }
    /* below the limit: the norm is returned and nothing changes */
    SET_GRADS();
    r = mlc_clip_grad_norm(opt, 10.0f);
    CHECK_NEAR(r, norm, 1e-5);
    for (j = 0; j < 2; j++) CHECK(mlc_host_grad(a)[j] == ga[j]);
    for (j = 0; j < 4; j++) CHECK(mlc_host_grad(b)[j] == gb[j]);
    /* a second clip sees the clipped norm */
    SET_GRADS();
    mlc_clip_grad_norm(opt, 2.0f);
    CHECK_NEAR(mlc_clip_grad_norm(opt, 100.0f), 2.0, 1e-5);
    #undef SET_GRADS
    test_destroy(ctx);
    return 1;
}

/* ---------- learning rates ---------- */

static int lr_step_schedule(void) {
    const float want[] = { 0.1f, 0.1f, 0.1f, 0.05f, 0.05f, 0.05f, 0.025f, 0.025f, 0.025f, 0.0125f };
    int e;
    for (e = 0; e < 10; e++) CHECK_NEAR(mlc_lr_step(0.1f, e, 3, 0.5f), want[e], 1e-8);
    CHECK_NEAR(mlc_lr_step(1.0f, 100, 10, 0.1f), 1e-10, 1e-15);
    CHECK(test_same_float(mlc_lr_step(0.3f, 5, 0, 0.5f), 0.3f));                 /* step_size 0: constant */
    return 1;
}

static int lr_cosine_schedule(void) {
    const double base = 1.0, min_lr = 0.1, pi = 3.141592653589793;
    const int warmup = 4, total = 14;
    int s;
    double prev = 2;
    /* warmup: base (step + 1) / warmup, reaching base at step warmup - 1 */
    CHECK_NEAR(mlc_lr_cosine(1.0f, 0, warmup, total, 0.1f), 0.25, 1e-7);
    CHECK_NEAR(mlc_lr_cosine(1.0f, 1, warmup, total, 0.1f), 0.5, 1e-7);
    CHECK_NEAR(mlc_lr_cosine(1.0f, 3, warmup, total, 0.1f), 1.0, 1e-7);
    /* then min + (base - min) (1 + cos(π (step - warmup) / (total - warmup))) / 2 */
    for (s = warmup; s <= total; s++) {
        double want = min_lr + (base - min_lr) * 0.5 * (1 + cos(pi * (s - warmup) / (total - warmup)));
        double got = mlc_lr_cosine(1.0f, s, warmup, total, 0.1f);
        CHECK_NEAR(got, want, 1e-6);
        CHECK(got <= prev);
        prev = got;
    }
    CHECK_NEAR(mlc_lr_cosine(1.0f, warmup, warmup, total, 0.1f), 1.0, 1e-7);
    CHECK_NEAR(mlc_lr_cosine(1.0f, 9, warmup, total, 0.1f), 0.55, 1e-6);     /* halfway */
    CHECK_NEAR(mlc_lr_cosine(1.0f, total, warmup, total, 0.1f), 0.1, 1e-7);  /* the end: min_lr */
    CHECK_NEAR(mlc_lr_cosine(1.0f, total + 50, warmup, total, 0.1f), 0.1, 1e-7);
    /* no warmup */
    CHECK_NEAR(mlc_lr_cosine(0.5f, 0, 0, 10, 0.0f), 0.5, 1e-7);
    CHECK_NEAR(mlc_lr_cosine(0.5f, 5, 0, 10, 0.0f), 0.25, 1e-7);
    return 1;
}

static int set_and_get_lr(void) {
    mlc_ctx *ctx = test_ctx(4);
    mlc_tensor *p = make_param(ctx);
    mlc_optim *sgd = mlc_sgd(ctx, NULL, (mlc_sgd_opts){ 0 });
    mlc_optim *adam = mlc_adam(ctx, NULL, (mlc_adam_opts){ 0 });
    mlc_optim *rms = mlc_rmsprop(ctx, NULL, (mlc_rmsprop_opts){ 0 });
    CHECK(p && sgd && adam && rms);
    CHECK(test_same_float(mlc_optim_lr(sgd), 0.01f) && test_same_float(mlc_optim_lr(adam), 1e-3f)
          && test_same_float(mlc_optim_lr(rms), 0.01f));   /* PyTorch's defaults */
    CHECK(test_same_float(mlc_optim_lr(mlc_sgd(ctx, NULL, (mlc_sgd_opts){ .lr = 0.3f })), 0.3f));
    mlc_optim_set_lr(sgd, 0.25f);
    CHECK(mlc_optim_lr(sgd) == 0.25f);
    CHECK(mlc_optim_add_param(sgd, p) == MLC_OK);
    CHECK(compute_grad(sgd, p));
    mlc_step(sgd);                                                /* the new rate is the one used */
    CHECK_NEAR(mlc_host_data(p)[1], P0[1] - 0.25 * (C[1] + P0[1]), 1e-6);
    mlc_optim_set_lr(sgd, 0.0f);
    CHECK(compute_grad(sgd, p));
    { float keep = mlc_host_data(p)[1]; mlc_step(sgd); CHECK(mlc_host_data(p)[1] == keep); }
    CHECK(mlc_optim_lr(NULL) == 0.0f);
    /* only parameters can be added */
    CHECK(mlc_optim_add_param(sgd, mlc_ones(ctx, MLC_SHAPE(2))) == MLC_ERR_ARG);
    test_destroy(ctx);
    return 1;
}

static int step_skipped_on_error(void) {
    mlc_ctx *ctx = test_ctx(5);
    mlc_tensor *p = make_param(ctx);
    mlc_optim *opt = mlc_sgd(ctx, NULL, (mlc_sgd_opts){ .lr = 0.5f });
    CHECK(p && opt && mlc_optim_add_param(opt, p) == MLC_OK && compute_grad(opt, p));
    CHECK(mlc_sum(p, 3, 0) == NULL);                              /* an error is pending */
    mlc_step(opt);
    CHECK(mlc_host_data(p)[0] == P0[0]);
    mlc_clear_error(ctx);
    mlc_step(opt);
    CHECK_NEAR(mlc_host_data(p)[0], -0.25, 1e-7);
    test_destroy(ctx);
    return 1;
}

/* ---------- training ---------- */

static int linear_regression_converges(void) {
    mlc_ctx *ctx = test_ctx(6);
    mlc_module *lin = mlc_nn_linear(ctx, 1, 1);
    mlc_optim *opt = mlc_sgd(ctx, lin, (mlc_sgd_opts){ .lr = 0.05f, .momentum = 0.9f });
    mlc_tensor *x = mlc_empty(ctx, MLC_SHAPE(64, 1)), *y = mlc_empty(ctx, MLC_SHAPE(64, 1));
    float first = 0, last = 0;
    int i, step;
    CHECK(lin && opt && x && y);
    { float xv[64], yv[64];
      for (i = 0; i < 64; i++) { xv[i] = -1.0f + 2.0f * (float)i / 63.0f; yv[i] = 3.0f * xv[i] - 2.0f; }
      CHECK(mlc_write(x, xv, 64) == MLC_OK && mlc_write(y, yv, 64) == MLC_OK); }
    for (step = 0; step < 300; step++) {
        mlc_frame f = mlc_frame_begin(ctx);
        mlc_tensor *loss = mlc_mse_loss(mlc_forward(lin, x), y, MLC_REDUCE_MEAN);
        mlc_zero_grad(opt);
        CHECK(mlc_backward(loss) == MLC_OK);
        mlc_step(opt);
        if (step == 0) first = mlc_item(loss);
        last = mlc_item(loss);
        mlc_frame_end(f);
    }
    CHECK_MSG(first > 1.0f, "initial loss %g", first);
    CHECK_MSG(last < 1e-6f * first, "loss went from %g to %g", first, last);
    CHECK_NEAR(mlc_host_data(lin->params[0])[0], 3.0, 1e-3);
    CHECK_NEAR(mlc_host_data(lin->params[1])[0], -2.0, 1e-3);
    test_destroy(ctx);
    return 1;
}

/* State that decays while a gradient stays 0 ends as 0, never as a denormal (which slows every
   step on x86; 0.9 x the smallest denormal rounds back to it): one step with gradients
   ±1e-3 (and 0) on 11 elements and 1 on the 12th, then 1200 steps with 0 on the 11 (8 of
   them go through the AVX loop), for every rule that keeps state, decay rates 0.9 (0.999
   would take 70,000 steps); the 12th element, whose gradient stays, keeps its state. On every
   backend: the OpenCL kernels flush as the CPU does. */
static int tiny_state_is_zero(void) {
    int rule, s, i, k;
    for (rule = 0; rule < 5; rule++) {
        mlc_ctx *ctx = test_ctx(7);
        mlc_frame f;
        mlc_sgd_opts sgd = { 0.1f, 0.9f, 0.0f, 0.0f, 0 };
        mlc_adam_opts adam = { 0.1f, 0.9f, 0.9f, 1e-8f, 0.0f, rule == 2 };
        mlc_rmsprop_opts rms = { 0.1f, 0.9f, 1e-8f, 0.0f, rule == 4 ? 0.9f : 0.0f, rule == 4 };
        mlc_optim *opt = rule == 0 ? mlc_sgd(ctx, NULL, sgd) : rule <= 2 ? mlc_adam(ctx, NULL, adam)
                                                                        : mlc_rmsprop(ctx, NULL, rms);
        mlc_tensor *p = mlc_parameter(ctx, MLC_SHAPE(12));
        float first[12], later[12] = { 0 };
        for (i = 0; i < 12; i++) first[i] = i % 3 == 1 ? 0.0f : i % 3 ? -1e-3f : 1e-3f;
        first[11] = later[11] = 1.0f;
        CHECK(opt && p && mlc_optim_add_param(opt, p) == MLC_OK);
        for (s = 0; s < 1201; s++) {
            f = mlc_frame_begin(ctx);
            mlc_zero_grad(opt);
            mlc_backward(mlc_sum_all(mlc_mul(p, mlc_from_data(ctx, MLC_SHAPE(12), s ? later : first))));
            mlc_step(opt);
            mlc_frame_end(f);
        }
        CHECK(mlc_error(ctx) == MLC_OK);
        for (k = 0; k < 3; k++) {
            const float *st = test_optim_state(opt, 0, k);
            for (i = 0; st && i < 12; i++)
                CHECK_MSG(st[i] == 0.0f || fabsf(st[i]) >= FLT_MIN, "rule %d state %d element %d: %g", rule, k, i,
                          (double)st[i]);
            if (st) CHECK_MSG(st[11] != 0.0f, "rule %d state %d: the live element's is 0", rule, k);
        }
        test_destroy(ctx);
    }
    return 1;
}

static int every_optimiser_reduces_loss(void) {
    int kind;
    for (kind = 0; kind < 4; kind++) {
        mlc_ctx *ctx = test_ctx(7);
        mlc_module *net = mlc_nn_sequential(ctx, mlc_nn_linear(ctx, 4, 16), mlc_nn_tanh(ctx), mlc_nn_linear(ctx, 16, 1), NULL);
        mlc_optim *opt = kind == 0 ? mlc_sgd(ctx, net, (mlc_sgd_opts){ .lr = 0.05f, .momentum = 0.9f })
                       : kind == 1 ? mlc_adam(ctx, net, (mlc_adam_opts){ .lr = 0.01f })
                       : kind == 2 ? mlc_adamw(ctx, net, (mlc_adam_opts){ .lr = 0.01f })
                       : mlc_rmsprop(ctx, net, (mlc_rmsprop_opts){ .lr = 0.005f });
        mlc_tensor *x = mlc_randn(ctx, MLC_SHAPE(32, 4)), *y;
        float first = 0, last = 0;
        int step;
        CHECK(net && opt && x);
        /* a smooth target the network can fit: y = sin(x0) + x1 x2 / 2 */
        y = mlc_empty(ctx, MLC_SHAPE(32, 1));
        CHECK(y);
        { const float *xv = mlc_host_data(x); float yv[32];
          for (step = 0; step < 32; step++) yv[step] = sinf(xv[step * 4]) + 0.5f * xv[step * 4 + 1] * xv[step * 4 + 2];
          CHECK(mlc_write(y, yv, 32) == MLC_OK); }
        for (step = 0; step < 200; step++) {
            mlc_frame f = mlc_frame_begin(ctx);
            mlc_tensor *loss = mlc_mse_loss(mlc_forward(net, x), y, MLC_REDUCE_MEAN);
            mlc_zero_grad(opt);
            CHECK(mlc_backward(loss) == MLC_OK);
            mlc_step(opt);
            if (step == 0) first = mlc_item(loss);
            last = mlc_item(loss);
            mlc_frame_end(f);
        }
        CHECK_MSG(last < 0.2f * first, "optimiser %d: loss went from %g to %g", kind, first, last);
        test_destroy(ctx);
    }
    return 1;
}

const test_case tests_optim[] = {
    TEST(sgd_plain)
    TEST(sgd_weight_decay)
    TEST(sgd_momentum)
    TEST(sgd_nesterov)
    TEST(adam_three_steps)
    TEST(adam_l2_versus_adamw)
    TEST(adam_amsgrad_against_pytorch)
    TEST(adam_blocks_equal_the_loop)
    TEST(rmsprop_plain)
    TEST(rmsprop_centered)
    TEST(rmsprop_momentum)
    TEST(state_only_what_the_rule_reads)
    TEST(many_parameters_step_as_one)
    TEST(one_launch_per_eight_parameters)
    TEST(four_parameters_a_launch_within_256_bytes)
    TEST(parameters_on_host_and_device)
    TEST(zero_grad_zeroes)
    TEST(zero_grad_then_overwrite)
    TEST(clip_grad_norm)
    TEST(lr_step_schedule)
    TEST(lr_cosine_schedule)
    TEST(set_and_get_lr)
    TEST(step_skipped_on_error)
    TEST(linear_regression_converges)
    TEST(tiny_state_is_zero)
    TEST(every_optimiser_reduces_loss)
    { NULL, NULL }
};
