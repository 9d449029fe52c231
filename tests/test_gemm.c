/* Matrix products: mlc_gemm (the fast path) against mlc_gemm_reference (the plain loop) for
   every transpose, beta and awkward size; the hook receives every product of matmul, linear and
   conv2d; with OpenBLAS (built with -DMLC_TEST_OPENBLAS) the hook runs cblas_sgemm. */
#include <stdlib.h>
#include "test.h"
#ifdef MLC_TEST_OPENBLAS
#include <cblas.h>
#endif

static float *random_floats(mlc_ctx *ctx, size_t n) {
    float *p = (float *)malloc(n * sizeof(float) + 4);
    size_t i;
    for (i = 0; p && i < n; i++) p[i] = mlc_rand_normal(ctx);
    return p;
}

/* |mlc_gemm - reference| <= 1e-5 (|A||B| summed) per element, with garbage in C when beta = 0 */
static int compare_with_reference(mlc_ctx *ctx, int ta, int tb, int M, int N, int K, float beta) {
    float *A = random_floats(ctx, (size_t)M * K), *B = random_floats(ctx, (size_t)K * N);
    float *C = random_floats(ctx, (size_t)M * N), *R = (float *)malloc((size_t)M * N * sizeof(float) + 4);
    size_t i;
    int ok = 1;
    if (!A || !B || !C || !R) { free(A); free(B); free(C); free(R); CHECK(0); }
    memcpy(R, C, (size_t)M * N * sizeof(float));
    if (beta == 0.0f) for (i = 0; i < (size_t)M * N; i++) C[i] = NAN;
    mlc_gemm(ctx, ta, tb, M, N, K, A, B, beta, C);
    mlc_gemm_reference(ta, tb, M, N, K, A, B, beta, R);
    for (i = 0; i < (size_t)M * N && ok; i++)
        if (!(fabs(C[i] - R[i]) <= 1e-5 * (K + 1) * 3.0)) {
            snprintf(test_failure, sizeof test_failure, "ta=%d tb=%d M=%d N=%d K=%d beta=%g: C[%zu] = %g, reference %g",
                     ta, tb, M, N, K, (double)beta, i, (double)C[i], (double)R[i]);
            ok = 0;
        }
    free(A); free(B); free(C); free(R);
    return ok;
}

static int own_gemm_matches_reference(void) {
    /* every path: the plain loop (under 16^3 multiply-adds), the direct one (M <= 4, N <= 4
       with B transposed, K <= 4 without; K across its 256-float pieces; N wide enough for
       threads), packed (with edge slivers; on threads with a copy of the shared operand each, over
       several row blocks and K slices of unequal depth, and several column panels) */
    static const int sizes[][3] = { {1, 1, 1}, {7, 5, 3}, {1, 300, 200}, {300, 1, 200}, {17, 33, 9}, {64, 64, 64},
                                    {100, 37, 129}, {6, 16, 1}, {13, 47, 517}, {257, 129, 300}, {0, 5, 5}, {5, 5, 0},
                                    {1, 7, 600}, {2, 9, 257}, {3, 300, 600}, {4, 33, 40}, {5, 33, 40}, {1, 1000, 300},
                                    {64, 1, 100}, {64, 3, 100}, {64, 4, 256}, {64, 5, 100}, {4, 4, 512},
                                    {64, 100, 1}, {33, 130, 4}, {33, 130, 5}, {100, 10, 64}, {130, 200, 301} };
    mlc_ctx *ctx = test_ctx(11);
    int s, ta, tb, b;
    for (s = 0; s < (int)(sizeof sizes / sizeof sizes[0]); s++)
        for (ta = 0; ta < 2; ta++)
            for (tb = 0; tb < 2; tb++)
                for (b = 0; b < 2; b++)
                    if (!compare_with_reference(ctx, ta, tb, sizes[s][0], sizes[s][1], sizes[s][2], (float)b)) { test_destroy(ctx); return 0; }
    /* threads sharing rows: op(B) packed once, over two column panels and K slices of 129 and 128 */
    if (!compare_with_reference(ctx, 0, 1, 260, 1030, 257, 1.0f)) { test_destroy(ctx); return 0; }
    test_destroy(ctx);
    return 1;
}

/* A hook that counts its calls and computes with the reference loop. */
static void counting_gemm(int ta, int tb, int M, int N, int K, const float *A, const float *B, float beta, float *C, void *user) {
    ++*(int *)user;
    mlc_gemm_reference(ta, tb, M, N, K, A, B, beta, C);
}

/* Loss and gradients of a conv + linear model, for comparing two contexts' products. */
static float conv_linear_loss(mlc_ctx *ctx, float *grads, size_t *count) {
    mlc_tensor *x, *w, *b, *fc, *loss;
    mlc_conv_opts o = { .stride = 1, .padding = 1, .dilation = 1, .groups = 1 };
    size_t i;
    x = mlc_randn(ctx, MLC_SHAPE(2, 3, 6, 6));
    w = mlc_requires_grad(mlc_randn(ctx, MLC_SHAPE(4, 3, 3, 3)), 1);
    b = mlc_requires_grad(mlc_randn(ctx, MLC_SHAPE(4)), 1);
    fc = mlc_requires_grad(mlc_randn(ctx, MLC_SHAPE(5, 144)), 1);
    loss = mlc_sum_all(mlc_tanh(mlc_linear(mlc_flatten(mlc_conv2d(x, w, b, o), 1), fc, NULL)));
    if (mlc_backward(loss) != MLC_OK) return NAN;
    *count = 0;
    for (i = 0; i < w->size; i++) grads[(*count)++] = mlc_host_grad(w)[i];
    for (i = 0; i < fc->size; i++) grads[(*count)++] = mlc_host_grad(fc)[i];
    return mlc_item(loss);
}

static int compare_contexts(mlc_ctx *own, mlc_ctx *hooked, double tol) {
    static float g1[1024], g2[1024];
    size_t n1 = 0, n2 = 0, i;
    float l1 = conv_linear_loss(own, g1, &n1), l2 = conv_linear_loss(hooked, g2, &n2);
    CHECK(n1 == n2 && n1 > 0);
    CHECK_NEAR(l1, l2, tol * (1 + fabs(l1)));
    for (i = 0; i < n1; i++) CHECK_NEAR(g1[i], g2[i], tol * (1 + fabs(g1[i])));
    return 1;
}

static int hook_receives_every_product(void) {
    int calls = 0;
    mlc_config c;
    mlc_ctx *own = test_ctx(5), *hooked;
    memset(&c, 0, sizeof c);
    c.seed = 5; c.quiet = 1; c.gemm = counting_gemm; c.gemm_user = &calls;
    c.device = "cpu";           /* the hook serves the CPU's products; own may run on a device */
    hooked = mlc_create(&c);
    if (!compare_contexts(own, hooked, 1e-4)) return 0;
    /* forward: 2 images x 1 group + 1 linear; backward: conv dW per image (x needs no
       gradient, so no dcol), linear dA and dB */
    CHECK_MSG(calls == 3 + 2 + 2, "the hook saw %d products", calls);
    test_destroy(own); test_destroy(hooked);
    return 1;
}

#ifdef MLC_TEST_OPENBLAS
static void openblas_gemm(int ta, int tb, int M, int N, int K, const float *A, const float *B, float beta, float *C, void *user) {
    (void)user;
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K,
                1.0f, A, ta ? M : K, B, tb ? K : N, beta, C, N);
}
#endif

static int openblas_hook_matches_own(void) {
#ifdef MLC_TEST_OPENBLAS
    mlc_config c;
    mlc_ctx *own = test_ctx(9), *blas;
    int ta, tb;
    memset(&c, 0, sizeof c);
    c.seed = 9; c.quiet = 1; c.gemm = openblas_gemm;
    c.device = "cpu";           /* the hook serves the CPU's products; own may run on a device */
    blas = mlc_create(&c);
    if (!compare_contexts(own, blas, 1e-4)) return 0;      /* first: both RNGs in step */
    for (ta = 0; ta < 2; ta++)
        for (tb = 0; tb < 2; tb++) CHECK(compare_with_reference(blas, ta, tb, 70, 33, 129, (float)tb));
    test_destroy(own); test_destroy(blas);
    return 1;
#else
    SKIP("built without OpenBLAS (install libopenblas-dev; make test then links it)");
#endif
}

const test_case tests_gemm[] = {
    TEST(own_gemm_matches_reference)
    TEST(hook_receives_every_product)
    TEST(openblas_hook_matches_own)
    { NULL, NULL }
};
