/* Tensors: creation, the RNG, reading and writing, reshape/detach/keep, frames and memory
   statistics, parameters, the error formatter, rank-0 tensors. */
#include "test.h"

/* ---- creation ---------------------------------------------------------------------------- */

static int creation_fill(void) {
    mlc_ctx *ctx = test_ctx(1);
    const float src[6] = { 1.5f, -2.0f, 3.25f, 0.0f, 1e-3f, -7.0f };
    mlc_tensor *z = mlc_zeros(ctx, MLC_SHAPE(2, 3));
    mlc_tensor *o = mlc_ones(ctx, MLC_SHAPE(4));
    mlc_tensor *f = mlc_full(ctx, MLC_SHAPE(3, 1, 2), -2.5f);
    mlc_tensor *d = mlc_from_data(ctx, MLC_SHAPE(3, 2), src);
    size_t i;
    CHECK(z && o && f && d);
    CHECK(z->ndim == 2 && z->shape[0] == 2 && z->shape[1] == 3 && z->size == 6);
    CHECK(o->ndim == 1 && o->shape[0] == 4 && o->size == 4);
    CHECK(f->ndim == 3 && f->shape[0] == 3 && f->shape[1] == 1 && f->shape[2] == 2 && f->size == 6);
    CHECK(d->ndim == 2 && d->shape[0] == 3 && d->shape[1] == 2 && d->size == 6);
    for (i = 0; i < 6; i++) CHECK(mlc_host_data(z)[i] == 0.0f);
    for (i = 0; i < 4; i++) CHECK(mlc_host_data(o)[i] == 1.0f);
    for (i = 0; i < 6; i++) CHECK(mlc_host_data(f)[i] == -2.5f);
    for (i = 0; i < 6; i++) CHECK(mlc_host_data(d)[i] == src[i]);
    CHECK(d->data != src);                          /* a copy, not the caller's array */
    CHECK(!z->persistent && !z->requires_grad && z->grad == NULL && z->node == NULL && z->ctx == ctx);
    /* empty tensors are fine */
    z = mlc_zeros(ctx, MLC_SHAPE(0, 3));
    CHECK(z && z->size == 0 && z->ndim == 2 && z->shape[0] == 0);
    CHECK(mlc_error(ctx) == MLC_OK);
    /* a negative dimension is an error */
    CHECK(mlc_zeros(ctx, MLC_SHAPE(2, -1)) == NULL);
    CHECK(mlc_error(ctx) == MLC_ERR_SHAPE);
    test_destroy(ctx);
    return 1;
}

static int arange_values(void) {
    mlc_ctx *ctx = test_ctx(1);
    const float a[5] = { 0, 1, 2, 3, 4 };
    const float b[4] = { 5.0f, 3.5f, 2.0f, 0.5f };
    const float c[4] = { 0.0f, 0.25f, 0.5f, 0.75f };
    const float e[3] = { -1.0f, -0.5f, 0.0f };
    const float f[2] = { 2.0f, 5.0f };
    mlc_tensor *t;
    t = mlc_arange(ctx, 0, 5, 1);
    CHECK(t && t->ndim == 1 && t->shape[0] == 5);
    CHECK_TENSOR(t, a, 0);
    t = mlc_arange(ctx, 5, 0, -1.5f);              /* negative step: 5, 3.5, 2, 0.5 */
    CHECK(t && t->ndim == 1 && t->shape[0] == 4);
    CHECK_TENSOR(t, b, 1e-6);
    t = mlc_arange(ctx, 0, 1, 0.25f);              /* fractional step, stop excluded */
    CHECK(t && t->shape[0] == 4);
    CHECK_TENSOR(t, c, 1e-6);
    t = mlc_arange(ctx, -1, 0.25f, 0.5f);          /* stop not on the grid: -1, -0.5, 0 */
    CHECK(t && t->shape[0] == 3);
    CHECK_TENSOR(t, e, 1e-6);
    t = mlc_arange(ctx, 2, 6, 3);                  /* 2, 5 */
    CHECK(t && t->shape[0] == 2);
    CHECK_TENSOR(t, f, 0);
    /* empty ranges */
    t = mlc_arange(ctx, 3, 3, 1);
    CHECK(t && t->ndim == 1 && t->shape[0] == 0 && t->size == 0);
    t = mlc_arange(ctx, 5, 0, 1);
    CHECK(t && t->shape[0] == 0 && t->size == 0);
    t = mlc_arange(ctx, 0, 5, -1);
    CHECK(t && t->shape[0] == 0 && t->size == 0);
    CHECK(mlc_error(ctx) == MLC_OK);
    /* step 0 is an error */
    CHECK(mlc_arange(ctx, 0, 1, 0) == NULL);
    CHECK(mlc_error(ctx) == MLC_ERR_ARG);
    test_destroy(ctx);
    return 1;
}

static int rand_uniform_range(void) {
    mlc_ctx *ctx = test_ctx(7);
    mlc_tensor *t = mlc_rand(ctx, MLC_SHAPE(100, 100));
    double s = 0.0, s2 = 0.0;
    int below_quarter = 0;
    size_t i;
    CHECK(t && t->size == 10000);
    for (i = 0; i < t->size; i++) {
        float v = mlc_host_data(t)[i];
        CHECK_MSG(v >= 0.0f && v < 1.0f, "rand[%zu] = %g outside [0, 1)", i, (double)v);
        s += v; s2 += (double)v * v;
        below_quarter += v < 0.25f;
    }
    CHECK_NEAR(s / 10000, 0.5, 0.015);                       /* std error 0.0029 */
    CHECK_NEAR(s2 / 10000 - (s / 10000) * (s / 10000), 1.0 / 12, 0.005);
    CHECK_NEAR(below_quarter / 10000.0, 0.25, 0.02);
    test_destroy(ctx);
    return 1;
}

static int randn_moments(void) {
    mlc_ctx *ctx = test_ctx(11);
    mlc_tensor *t = mlc_randn(ctx, MLC_SHAPE(1000, 100));
    double s = 0.0, s2 = 0.0, mean, sd;
    int within1 = 0;
    size_t i;
    CHECK(t && t->size == 100000);
    for (i = 0; i < t->size; i++) {
        double v = mlc_host_data(t)[i];
        CHECK(v == v && fabs(v) < 10.0);
        s += v; s2 += v * v;
        within1 += fabs(v) < 1.0;
    }
    mean = s / 100000;
    sd = sqrt(s2 / 100000 - mean * mean);
    CHECK_NEAR(mean, 0.0, 0.015);                            /* std error 0.0032 */
    CHECK_NEAR(sd, 1.0, 0.015);
    CHECK_NEAR(within1 / 100000.0, 0.682689, 0.01);          /* P(|z| < 1) */
    test_destroy(ctx);
    return 1;
}

/* MLC_SHAPE gives the rank and the dimensions */
static int count_dims(int ndim, const int *shape, int *product) {
    int d;
    *product = 1;
    for (d = 0; d < ndim; d++) *product *= shape[d];
    return ndim;
}

static int shape_macro(void) {
    int p;
    CHECK(count_dims(MLC_SHAPE(7), &p) == 1 && p == 7);
    CHECK(count_dims(MLC_SHAPE(2, 3), &p) == 2 && p == 6);
    CHECK(count_dims(MLC_SHAPE(2, 3, 4, 5, 6, 1), &p) == 6 && p == 720);
    return 1;
}

/* ---- the RNG ----------------------------------------------------------------------------- */

static int rng_same_seed_same_sequence(void) {
    mlc_ctx *a = test_ctx(123), *b = test_ctx(123), *c = test_ctx(124);
    uint32_t first[64];
    int i, differ = 0;
    for (i = 0; i < 1000; i++) {
        uint32_t x = mlc_rand_u32(a), y = mlc_rand_u32(b), z = mlc_rand_u32(c);
        CHECK_MSG(x == y, "draw %d: %u vs %u with the same seed", i, (unsigned)x, (unsigned)y);
        differ += x != z;
        if (i < 64) first[i] = x;
    }
    CHECK(differ > 990);                            /* another seed, other numbers */
    mlc_seed(a, 123);                               /* reseeding restarts the sequence */
    for (i = 0; i < 64; i++) CHECK(mlc_rand_u32(a) == first[i]);
    {   /* and tensors made from the same seed agree */
        mlc_tensor *ta, *tb;
        mlc_seed(a, 5); mlc_seed(b, 5);
        ta = mlc_randn(a, MLC_SHAPE(50)); tb = mlc_randn(b, MLC_SHAPE(50));
        CHECK(ta && tb);
        CHECK(memcmp(mlc_host_data(ta), mlc_host_data(tb), 50 * sizeof(float)) == 0);
        ta = mlc_rand(a, MLC_SHAPE(50)); tb = mlc_rand(b, MLC_SHAPE(50));
        CHECK(ta && tb);
        CHECK(memcmp(mlc_host_data(ta), mlc_host_data(tb), 50 * sizeof(float)) == 0);
    }
    test_destroy(a); test_destroy(b); test_destroy(c);
    return 1;
}

/* The PCG32 reference (O'Neill, pcg-c-basic): pcg32_srandom_r and pcg32_random_r. */
typedef struct ref_pcg32 { uint64_t state, inc; } ref_pcg32;
static uint32_t ref_pcg32_random(ref_pcg32 *rng) {
    uint64_t oldstate = rng->state;
    uint32_t xorshifted, rot;
    rng->state = oldstate * 6364136223846793005ULL + rng->inc;
    xorshifted = (uint32_t)(((oldstate >> 18u) ^ oldstate) >> 27u);
    rot = (uint32_t)(oldstate >> 59u);
    return (xorshifted >> rot) | (xorshifted << ((0u - rot) & 31u));
}
static void ref_pcg32_srandom(ref_pcg32 *rng, uint64_t initstate, uint64_t initseq) {
    rng->state = 0u;
    rng->inc = (initseq << 1u) | 1u;
    ref_pcg32_random(rng);
    rng->state += initstate;
    ref_pcg32_random(rng);
}

static int rng_pcg32_reference_values(void) {
    /* pcg32-demo's published first outputs for srandom(42, 54): checks the reference itself */
    const uint32_t demo[6] = { 0xa15c02b7u, 0x7b47f409u, 0xba1d3330u, 0x83d2f293u, 0xbfa4784bu, 0xcbed606eu };
    /* the reference seeded with (42, 42), as mlc_seed(ctx, 42) seeds (state and sequence) */
    const uint32_t seed42[8] = { 0x40b29785u, 0x0a8b3706u, 0x2f091207u, 0x646baef9u,
                                 0xfc126e1cu, 0x6ae34297u, 0x4e3459a1u, 0x3541a0b2u };
    ref_pcg32 r;
    mlc_ctx *ctx = test_ctx(42);
    int i;
    ref_pcg32_srandom(&r, 42u, 54u);
    for (i = 0; i < 6; i++) CHECK(ref_pcg32_random(&r) == demo[i]);
    ref_pcg32_srandom(&r, 42u, 42u);
    for (i = 0; i < 8; i++) CHECK(ref_pcg32_random(&r) == seed42[i]);
    /* mlc with seed 42: the literal values, then a longer run against the reference */
    for (i = 0; i < 8; i++) {
        uint32_t v = mlc_rand_u32(ctx);
        CHECK_MSG(v == seed42[i], "mlc_rand_u32 draw %d with seed 42 = 0x%08x, expected 0x%08x",
                  i, (unsigned)v, (unsigned)seed42[i]);
    }
    for (i = 0; i < 10000; i++) CHECK(mlc_rand_u32(ctx) == ref_pcg32_random(&r));
    /* other seeds, including 0 and one using the top bit */
    {
        const uint64_t seeds[3] = { 0u, 1u, 0x8000000000000001ULL };
        int k;
        for (k = 0; k < 3; k++) {
            mlc_seed(ctx, seeds[k]);
            ref_pcg32_srandom(&r, seeds[k], seeds[k]);
            for (i = 0; i < 100; i++) CHECK(mlc_rand_u32(ctx) == ref_pcg32_random(&r));
        }
    }
    /* mlc_rand_uniform is the top 24 bits scaled to [0, 1) */
    mlc_seed(ctx, 42);
    ref_pcg32_srandom(&r, 42u, 42u);
    for (i = 0; i < 100; i++) {
        float u = mlc_rand_uniform(ctx);
        CHECK(u == (float)((double)(ref_pcg32_random(&r) >> 8) / 16777216.0));
    }
    test_destroy(ctx);
    return 1;
}

/* ---- reading and writing ----------------------------------------------------------------- */

static int item_get_read_write(void) {
    mlc_ctx *ctx = test_ctx(1);
    const float src[6] = { 1, 2, 3, 4, 5, 6 };
    const float in[6] = { -1, -2, -3, -4, -5, -6 };
    float out[6];
    mlc_tensor *one = mlc_full(ctx, MLC_SHAPE(1, 1), 3.5f);
    mlc_tensor *t = mlc_from_data(ctx, MLC_SHAPE(2, 3), src);
    CHECK(one && t);
    CHECK(mlc_item(one) == 3.5f);
    CHECK(mlc_get(t, 0) == 1.0f && mlc_get(t, 4) == 5.0f && mlc_get(t, 5) == 6.0f);
    CHECK(mlc_read(t, out, 6) == MLC_OK);
    CHECK(memcmp(out, src, sizeof out) == 0);
    CHECK(mlc_write(t, in, 6) == MLC_OK);
    CHECK(mlc_host_data(t)[0] == -1.0f && mlc_host_data(t)[5] == -6.0f);
    CHECK(mlc_read(t, out, 6) == MLC_OK && memcmp(out, in, sizeof out) == 0);
    CHECK(mlc_error(ctx) == MLC_OK);
    /* errors: item of a 6-element tensor, index past the end, wrong counts */
    CHECK(test_isnan(mlc_item(t)));
    CHECK(mlc_error(ctx) == MLC_ERR_SHAPE);
    mlc_clear_error(ctx);
    CHECK(test_isnan(mlc_get(t, 6)));
    CHECK(mlc_error(ctx) == MLC_ERR_INDEX);
    mlc_clear_error(ctx);
    CHECK(mlc_read(t, out, 5) == MLC_ERR_ARG);
    mlc_clear_error(ctx);
    CHECK(mlc_write(t, src, 7) == MLC_ERR_ARG);
    CHECK(mlc_host_data(t)[0] == -1.0f);                     /* a refused write changes nothing */
    mlc_clear_error(ctx);
    CHECK(test_isnan(mlc_item(NULL)) && mlc_read(NULL, out, 6) == MLC_ERR_NULL);
    test_destroy(ctx);
    return 1;
}

/* ---- reshape, detach, keep --------------------------------------------------------------- */

static int reshape_shares_and_infers(void) {
    mlc_ctx *ctx = test_ctx(1);
    mlc_tensor *x = mlc_arange(ctx, 0, 24, 1), *a, *b, *c;
    CHECK(x);
    a = mlc_reshape(x, MLC_SHAPE(2, 3, 4));
    b = mlc_reshape(a, MLC_SHAPE(-1, 4));
    c = mlc_reshape(a, MLC_SHAPE(4, -1, 2));
    CHECK(a && b && c);
    CHECK(a->ndim == 3 && a->shape[0] == 2 && a->shape[1] == 3 && a->shape[2] == 4 && a->size == 24);
    CHECK(b->ndim == 2 && b->shape[0] == 6 && b->shape[1] == 4);
    CHECK(c->ndim == 3 && c->shape[0] == 4 && c->shape[1] == 3 && c->shape[2] == 2);
    CHECK(a->data == x->data && b->data == x->data && c->data == x->data);
    { float v[24]; memcpy(v, mlc_host_data(b), sizeof v); v[5] = 100.0f;
      CHECK(mlc_write(b, v, 24) == MLC_OK); }       /* the storage is shared */
    CHECK(mlc_host_data(x)[5] == 100.0f && mlc_host_data(c)[5] == 100.0f);
    CHECK(x->ndim == 1 && x->shape[0] == 24);       /* the input keeps its shape */
    CHECK(mlc_error(ctx) == MLC_OK);
    CHECK(mlc_reshape(x, MLC_SHAPE(5, -1)) == NULL);   /* 24 is not a multiple of 5 */
    CHECK(mlc_error(ctx) == MLC_ERR_SHAPE);
    mlc_clear_error(ctx);
    CHECK(mlc_reshape(x, MLC_SHAPE(-1, -1)) == NULL);  /* one inferred dimension at most */
    CHECK(mlc_error(ctx) == MLC_ERR_SHAPE);
    mlc_clear_error(ctx);
    CHECK(mlc_reshape(x, MLC_SHAPE(5, 5)) == NULL);
    CHECK(mlc_error(ctx) == MLC_ERR_SHAPE);
    test_destroy(ctx);
    return 1;
}

static int detach_cuts_tape(void) {
    mlc_ctx *ctx = test_ctx(1);
    mlc_tensor *p = mlc_parameter(ctx, MLC_SHAPE(3)), *y, *d;
    CHECK(p);
    CHECK(mlc_write(p, (const float[]){ 1, 2, 3 }, 3) == MLC_OK);
    y = mlc_mul_scalar(p, 2.0f);
    CHECK(y && y->requires_grad && y->node != NULL);
    d = mlc_detach(y);
    CHECK(d && d != y);
    CHECK(d->data == y->data);                      /* shares data */
    CHECK(!d->requires_grad && d->node == NULL && d->grad == NULL && !d->persistent);
    CHECK(d->ndim == 1 && d->shape[0] == 3 && mlc_host_data(d)[2] == 6.0f);
    y = mlc_mul_scalar(d, 3.0f);                    /* ops on it record nothing */
    CHECK(y && !y->requires_grad && y->node == NULL && mlc_host_data(y)[1] == 12.0f);
    CHECK(mlc_backward(mlc_sum_all(y)) == MLC_ERR_STATE);   /* there is no path back */
    test_destroy(ctx);
    return 1;
}

static int keep_survives_frame_end(void) {
    mlc_ctx *ctx = test_ctx(1);
    mlc_stats s0 = mlc_get_stats(ctx), s1;
    mlc_frame f = mlc_frame_begin(ctx);
    mlc_tensor *x = mlc_arange(ctx, 0, 10, 1), *k, *g;
    size_t i;
    CHECK(x);
    k = mlc_keep(mlc_mul_scalar(x, 2.0f));
    CHECK(k && k->persistent && k->data != x->data && k->ndim == 1 && k->shape[0] == 10);
    CHECK(!k->requires_grad && k->grad == NULL && k->node == NULL);
    s1 = mlc_get_stats(ctx);
    CHECK(s1.bytes_current >= s0.bytes_current + 10 * sizeof(float));
    mlc_frame_end(f);
    /* the arena memory is reused: fill it, then check the kept copy */
    f = mlc_frame_begin(ctx);
    for (i = 0; i < 4; i++) CHECK(mlc_full(ctx, MLC_SHAPE(64), -1.0f) != NULL);
    for (i = 0; i < 10; i++) CHECK(mlc_host_data(k)[i] == 2.0f * (float)i);
    mlc_frame_end(f);
    /* keeping a tensor that requires a gradient gives a leaf with a zeroed gradient */
    g = mlc_parameter(ctx, MLC_SHAPE(2));
    CHECK(g);
    CHECK(mlc_write(g, (const float[]){ 4, 5 }, 2) == MLC_OK);
    f = mlc_frame_begin(ctx);
    k = mlc_keep(mlc_add_scalar(g, 1.0f));
    mlc_frame_end(f);
    CHECK(k && k->persistent && k->requires_grad && k->node == NULL && mlc_host_grad(k) != NULL);
    CHECK(mlc_host_grad(k)[0] == 0.0f && mlc_host_grad(k)[1] == 0.0f && mlc_host_data(k)[0] == 5.0f && mlc_host_data(k)[1] == 6.0f);
    CHECK(mlc_error(ctx) == MLC_OK);
    test_destroy(ctx);
    return 1;
}

/* ---- frames and statistics --------------------------------------------------------------- */

static int frames_release(void) {
    mlc_ctx *ctx = test_ctx(1);
    mlc_tensor *w = mlc_parameter(ctx, MLC_SHAPE(4, 3)), *x, *y;
    mlc_stats before, inside, after;
    mlc_frame f;
    CHECK(w);
    before = mlc_get_stats(ctx);
    f = mlc_frame_begin(ctx);
    x = mlc_ones(ctx, MLC_SHAPE(5, 3));
    y = mlc_sum_all(mlc_relu(mlc_linear(x, w, NULL)));
    CHECK(y);
    inside = mlc_get_stats(ctx);
    CHECK(inside.arena_used > before.arena_used);
    CHECK(inside.tape_nodes >= before.tape_nodes + 3);   /* linear, relu, reshape, sum */
    CHECK(mlc_backward(y) == MLC_OK);
    mlc_frame_end(f);
    after = mlc_get_stats(ctx);
    CHECK(after.arena_used == before.arena_used);
    CHECK(after.tape_nodes == before.tape_nodes);
    CHECK(after.arena_peak >= inside.arena_used);
    CHECK(mlc_error(ctx) == MLC_OK);
    test_destroy(ctx);
    return 1;
}

static int frames_nest(void) {
    mlc_ctx *ctx = test_ctx(1);
    mlc_tensor *p = mlc_parameter(ctx, MLC_SHAPE(8)), *a, *b;
    mlc_stats s0, s1, s2, s3;
    mlc_frame outer, inner;
    size_t i;
    CHECK(p);
    s0 = mlc_get_stats(ctx);
    outer = mlc_frame_begin(ctx);
    a = mlc_add_scalar(p, 3.0f);                    /* recorded: p requires a gradient */
    CHECK(a);
    s1 = mlc_get_stats(ctx);
    CHECK(s1.arena_used > s0.arena_used && s1.tape_nodes == s0.tape_nodes + 1);
    inner = mlc_frame_begin(ctx);
    b = mlc_mul(a, mlc_full(ctx, MLC_SHAPE(8), 2.0f));
    CHECK(b && mlc_host_data(b)[0] == 6.0f);
    CHECK(mlc_full(ctx, MLC_SHAPE(1000), 9.0f) != NULL);
    s2 = mlc_get_stats(ctx);
    CHECK(s2.arena_used > s1.arena_used && s2.tape_nodes == s1.tape_nodes + 1);
    mlc_frame_end(inner);
    s3 = mlc_get_stats(ctx);
    CHECK(s3.arena_used == s1.arena_used && s3.tape_nodes == s1.tape_nodes);
    /* the outer frame's tensor is intact, and can still be used and differentiated */
    for (i = 0; i < 8; i++) CHECK(mlc_host_data(a)[i] == 3.0f);
    CHECK(mlc_full(ctx, MLC_SHAPE(1000), -9.0f) != NULL);   /* reuses the inner frame's memory */
    for (i = 0; i < 8; i++) CHECK(mlc_host_data(a)[i] == 3.0f);
    CHECK(mlc_backward(mlc_sum_all(a)) == MLC_OK);
    for (i = 0; i < 8; i++) CHECK(mlc_host_grad(p)[i] == 1.0f);
    mlc_frame_end(outer);
    s3 = mlc_get_stats(ctx);
    CHECK(s3.arena_used == s0.arena_used && s3.tape_nodes == s0.tape_nodes);
    CHECK(mlc_error(ctx) == MLC_OK);
    test_destroy(ctx);
    return 1;
}

/* One step of work of about `floats` floats, in a frame. */
static int frame_step(mlc_ctx *ctx, mlc_tensor *w, int floats) {
    mlc_frame f = mlc_frame_begin(ctx);
    mlc_tensor *x = mlc_rand(ctx, MLC_SHAPE(floats / 4, 4)), *loss;
    int ok;
    loss = mlc_mean_all(mlc_tanh(mlc_linear(x, w, NULL)));
    ok = loss && mlc_backward(loss) == MLC_OK;
    mlc_frame_end(f);
    return ok;
}

static int frames_repeat_without_allocating(void) {
    mlc_config c;
    mlc_ctx *ctx;
    mlc_tensor *w;
    mlc_stats s;
    size_t allocs, arena;
    int i;
    memset(&c, 0, sizeof c);
    c.quiet = 1;
    c.arena_block_bytes = 4096;                     /* small blocks: a step spans several */
    ctx = test_adopt(mlc_create(&c));
    CHECK(ctx);
    w = mlc_parameter(ctx, MLC_SHAPE(4, 4));
    CHECK(w);
    mlc_init_uniform(w, -1, 1);
    CHECK(frame_step(ctx, w, 2048));
    s = mlc_get_stats(ctx);
    allocs = s.allocs;
    arena = s.arena_used;
    CHECK(s.tape_nodes == 0 && s.frees < s.allocs);
    for (i = 0; i < 20; i++) {
        CHECK(frame_step(ctx, w, 2048));
        s = mlc_get_stats(ctx);
        CHECK_MSG(s.allocs == allocs, "step %d: %zu allocations, %zu after the first step", i, s.allocs, allocs);
        CHECK(s.arena_used == arena && s.tape_nodes == 0);
    }
    CHECK(mlc_error(ctx) == MLC_OK);
    test_destroy(ctx);
    return 1;
}

/* ---- parameters and freeing -------------------------------------------------------------- */

static int parameter_and_free(void) {
    mlc_ctx *ctx = test_ctx(1);
    mlc_stats s0 = mlc_get_stats(ctx), s1, s2;
    mlc_tensor *p = mlc_parameter(ctx, MLC_SHAPE(3, 5)), *t;
    size_t i;
    CHECK(p);
    CHECK(p->ndim == 2 && p->shape[0] == 3 && p->shape[1] == 5 && p->size == 15);
    CHECK(p->persistent && p->requires_grad && mlc_host_grad(p) != NULL && p->node == NULL);
    for (i = 0; i < 15; i++) CHECK(mlc_host_data(p)[i] == 0.0f && mlc_host_grad(p)[i] == 0.0f);
    s1 = mlc_get_stats(ctx);
    CHECK(s1.bytes_current >= s0.bytes_current + 2 * 15 * sizeof(float));   /* data and grad */
    CHECK(s1.allocs > s0.allocs);
    CHECK(s1.arena_used == s0.arena_used);          /* not in the arena */
    mlc_tensor_free(p);
    s2 = mlc_get_stats(ctx);
    CHECK(s2.bytes_current > s0.bytes_current);         /* the record that refuses a second free: */
    CHECK(s2.bytes_current - s0.bytes_current < sizeof(mlc_tensor) + 128);      /* its struct only */
    CHECK(s2.frees - s0.frees == s1.allocs - s0.allocs - 1);
    CHECK(s2.bytes_peak >= s1.bytes_current);
    CHECK(mlc_error(ctx) == MLC_OK);
    /* freeing an arena tensor is an error, and names its shape */
    t = mlc_zeros(ctx, MLC_SHAPE(2, 3));
    CHECK(t);
    s1 = mlc_get_stats(ctx);
    mlc_tensor_free(t);
    CHECK(mlc_error(ctx) == MLC_ERR_STATE);
    CHECK_MSG(strstr(mlc_error_message(ctx), "[2, 3]") != NULL, "message: %s", mlc_error_message(ctx));
    s2 = mlc_get_stats(ctx);
    CHECK(s2.bytes_current == s1.bytes_current && s2.frees == s1.frees && mlc_host_data(t)[0] == 0.0f);
    test_destroy(ctx);
    return 1;
}

/* ---- the formatter, through error messages ----------------------------------------------- */

static int contains(const char *hay, const char *needle) { return strstr(hay, needle) != NULL; }

static int error_message_format(void) {
    mlc_ctx *ctx = test_ctx(1);
    mlc_tensor *x = mlc_zeros(ctx, MLC_SHAPE(2, 3)), *s = mlc_zeros(ctx, 0, NULL);
    const char *m;
    CHECK(x && s);
    CHECK(mlc_clamp(x, 2.5f, 1.0f) == NULL);        /* %g */
    m = mlc_error_message(ctx);
    CHECK_MSG(mlc_error(ctx) == MLC_ERR_ARG && contains(m, "mlc_clamp") && contains(m, "2.5")
              && contains(m, "hi 1") && !contains(m, "2.50"), "message: %s", m);
    mlc_clear_error(ctx);
    CHECK(strcmp(mlc_error_message(ctx), "no error") == 0);
    CHECK(mlc_clamp(x, 0.000125f, -1234567.0f) == NULL);   /* small fixed, large exponent form */
    m = mlc_error_message(ctx);
    CHECK_MSG(contains(m, "lo 0.000125 ") && contains(m, "-1.23457e"), "message: %s", m);
    mlc_clear_error(ctx);
    CHECK(mlc_clamp(x, 123.456f, -0.5f) == NULL);
    m = mlc_error_message(ctx);
    CHECK_MSG(contains(m, "lo 123.456 ") && contains(m, "hi -0.5"), "message: %s", m);
    mlc_clear_error(ctx);
    CHECK(mlc_clamp(x, INFINITY, -INFINITY) == NULL);   /* infinities and NaN */
    m = mlc_error_message(ctx);
    CHECK_MSG(contains(m, "lo inf ") && contains(m, "hi -inf"), "message: %s", m);
    mlc_clear_error(ctx);
    CHECK(mlc_clamp(x, NAN, 0.0f) == NULL);
    m = mlc_error_message(ctx);
    CHECK_MSG(contains(m, "lo nan ") && contains(m, "hi 0"), "message: %s", m);
    mlc_clear_error(ctx);
    CHECK(test_isnan(mlc_item(x)));                      /* %T and %zu */
    m = mlc_error_message(ctx);
    CHECK_MSG(contains(m, "[2, 3]") && contains(m, "6 elements"), "message: %s", m);
    mlc_clear_error(ctx);
    CHECK(test_isnan(mlc_get(x, 17)));
    m = mlc_error_message(ctx);
    CHECK_MSG(contains(m, "17") && contains(m, "[2, 3]"), "message: %s", m);
    mlc_clear_error(ctx);
    CHECK(mlc_reshape(x, MLC_SHAPE(2, -3)) == NULL);  /* negative %d */
    m = mlc_error_message(ctx);
    CHECK_MSG(contains(m, "-3") && contains(m, "[2, 3]"), "message: %s", m);
    mlc_clear_error(ctx);
    CHECK(mlc_add(x, mlc_zeros(ctx, MLC_SHAPE(4, 1, 5))) == NULL);   /* two shapes, rank 3 */
    m = mlc_error_message(ctx);
    CHECK_MSG(mlc_error(ctx) == MLC_ERR_SHAPE && contains(m, "[2, 3] and [4, 1, 5]"), "message: %s", m);
    mlc_clear_error(ctx);
    CHECK(mlc_sum(s, 0, 0) == NULL);                /* a rank-0 shape prints as [] */
    m = mlc_error_message(ctx);
    CHECK_MSG(mlc_error(ctx) == MLC_ERR_INDEX && contains(m, "[]"), "message: %s", m);
    test_destroy(ctx);
    return 1;
}

/* ---- rank 0 ------------------------------------------------------------------------------ */

static int scalar_tensor_broadcasts(void) {
    mlc_ctx *ctx = test_ctx(1);
    const float src[6] = { 1, 2, 3, 4, 5, 6 };
    const float plus[6] = { 3, 4, 5, 6, 7, 8 }, times[6] = { 2, 4, 6, 8, 10, 12 };
    mlc_tensor *s = mlc_full(ctx, 0, NULL, 2.0f), *x = mlc_from_data(ctx, MLC_SHAPE(2, 3), src), *y;
    CHECK(s && x);
    CHECK(s->ndim == 0 && s->size == 1 && mlc_item(s) == 2.0f);
    y = mlc_add(x, s);
    CHECK(y && y->ndim == 2 && y->shape[0] == 2 && y->shape[1] == 3);
    CHECK_TENSOR(y, plus, 0);
    y = mlc_add(s, x);
    CHECK(y && y->ndim == 2);
    CHECK_TENSOR(y, plus, 0);
    y = mlc_mul(s, x);
    CHECK(y && y->ndim == 2 && y->shape[1] == 3);
    CHECK_TENSOR(y, times, 0);
    y = mlc_mul(s, mlc_full(ctx, 0, NULL, -3.0f));  /* scalar op scalar stays rank 0 */
    CHECK(y && y->ndim == 0 && y->size == 1 && mlc_item(y) == -6.0f);
    y = mlc_add(mlc_full(ctx, MLC_SHAPE(1), 1.0f), s);   /* [1] + [] -> [1] */
    CHECK(y && y->ndim == 1 && y->shape[0] == 1 && mlc_item(y) == 3.0f);
    CHECK(mlc_error(ctx) == MLC_OK);
    test_destroy(ctx);
    return 1;
}

/* mlc_write_grad: a parameter's gradient written from the host (made when it had none), read
   back, added to by a backward, used by the optimiser on the suite's device (the device copy
   follows), written in place from mlc_host_grad; refused with a wrong count, NULL or a tensor
   that wants no gradient, the gradient left as it was. mlc_set_error: the first error stays,
   MLC_OK sets nothing, no context is MLC_ERR_NULL. */
static int write_grad_and_set_error(void) {
    static const float v[4] = { 0.5f, -1.0f, 2.0f, 0.25f }, start[4] = { 1.0f, 2.0f, 3.0f, 4.0f };
    mlc_ctx *ctx = test_ctx(4);
    mlc_tensor *p = mlc_parameter(ctx, MLC_SHAPE(4)), *plain = mlc_zeros(ctx, MLC_SHAPE(4));
    mlc_optim *opt = mlc_sgd(ctx, NULL, (mlc_sgd_opts){ .lr = 1.0f });
    float got[4];
    int i;
    CHECK(p && plain && opt && mlc_write(p, start, 4) == MLC_OK && mlc_optim_add_param(opt, p) == MLC_OK);
    CHECK_MSG(mlc_write_grad(p, v, 4) == MLC_OK, "%s", mlc_error_message(ctx));
    for (i = 0; i < 4; i++) CHECK(mlc_host_grad(p)[i] == v[i]);
    CHECK(mlc_backward(mlc_sum_all(p)) == MLC_OK);             /* adds 1 to each */
    for (i = 0; i < 4; i++) CHECK(mlc_host_grad(p)[i] == v[i] + 1.0f);
    CHECK(mlc_write_grad(p, v, 4) == MLC_OK);
    mlc_step(opt);                                             /* p - 1 · grad, where the device runs it */
    CHECK(mlc_read(p, got, 4) == MLC_OK);
    for (i = 0; i < 4; i++) CHECK_MSG(got[i] == start[i] - v[i], "p[%d] = %g", i, (double)got[i]);
    for (i = 0; i < 4; i++) mlc_host_grad(p)[i] *= 2.0f;      /* in place: the same buffer given back */
    CHECK(mlc_write_grad(p, mlc_host_grad(p), 4) == MLC_OK);
    mlc_step(opt);
    CHECK(mlc_read(p, got, 4) == MLC_OK);
    for (i = 0; i < 4; i++) CHECK_MSG(got[i] == start[i] - 3.0f * v[i], "p[%d] = %g", i, (double)got[i]);
    CHECK(mlc_write_grad(p, v, 3) == MLC_ERR_ARG && strstr(mlc_error_message(ctx), "mlc_write_grad"));
    mlc_clear_error(ctx);
    CHECK(mlc_write_grad(p, NULL, 4) == MLC_ERR_ARG);
    mlc_clear_error(ctx);
    CHECK(mlc_write_grad(plain, v, 4) == MLC_ERR_ARG && strstr(mlc_error_message(ctx), "require a gradient"));
    mlc_clear_error(ctx);
    for (i = 0; i < 4; i++) CHECK(mlc_host_grad(p)[i] == 2.0f * v[i]);    /* untouched by the refusals */
    CHECK(mlc_write_grad(NULL, v, 4) == MLC_ERR_NULL);
    CHECK(mlc_set_error(ctx, MLC_OK, "nothing") == MLC_OK && mlc_error(ctx) == MLC_OK);
    CHECK(mlc_set_error(ctx, MLC_ERR_IO, "mine: the file went away") == MLC_ERR_IO);
    CHECK(mlc_set_error(ctx, MLC_ERR_ARG, "a second one") == MLC_ERR_IO);  /* the first stays */
    CHECK(strcmp(mlc_error_message(ctx), "mine: the file went away") == 0);
    CHECK(mlc_set_error(NULL, MLC_ERR_ARG, "x") == MLC_ERR_NULL);
    mlc_clear_error(ctx);
    test_destroy(ctx);
    return 1;
}

const test_case tests_tensor[] = {
    TEST(creation_fill)
    TEST(arange_values)
    TEST(rand_uniform_range)
    TEST(randn_moments)
    TEST(shape_macro)
    TEST(rng_same_seed_same_sequence)
    TEST(rng_pcg32_reference_values)
    TEST(item_get_read_write)
    TEST(reshape_shares_and_infers)
    TEST(detach_cuts_tape)
    TEST(keep_survives_frame_end)
    TEST(frames_release)
    TEST(frames_nest)
    TEST(frames_repeat_without_allocating)
    TEST(parameter_and_free)
    TEST(error_message_format)
    TEST(scalar_tensor_broadcasts)
    TEST(write_grad_and_set_error)
    { NULL, NULL }
};
