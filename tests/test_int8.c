/* int8 products (issue 26): mlc_gemm_i8_reference against sums of known values and against
   64-bit sums of its own inputs; mlc_gemm_i8 on every kernel this build and CPU have (portable
   C, AVX2, AVX-VNNI, AVX-512 VNNI: test_gemm_i8_kernel picks each) against the reference, bit
   for bit, on 1 and 2 threads, for awkward sizes and for the extreme values at which a
   saturating or overflowing kernel would show; and the arguments mlc_gemm_i8 refuses. */
#include <stdlib.h>
#include "test.h"

/* A small generator of its own, so that the bytes do not depend on mlc's RNG */
static uint32_t next_u32(uint64_t *state) {
    *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(*state >> 33);
}

/* Fills A (values in [-128, 127]) and B ([-127, 127]) for a case: kind 0 random bytes, a
   quarter of them at the extremes; 1 the products that sum highest, A = -128 and B = -127
   (each 16256, a pair 32512: vpmaddubsw's largest unsaturated int16); 2 A = 127 and B = 127
   (the VNNI kernels' shifted products at their largest, 255 · 127); 3 extremes of every sign
   mixed (-128, 127 in A, -127, 127 in B) */
static void fill(int8_t *A, size_t na, int8_t *B, size_t nb, int kind, uint64_t *state) {
    size_t i;
    for (i = 0; i < na + nb; i++) {
        const int in_a = i < na;
        const uint32_t r = next_u32(state);
        int v;
        if (kind == 1) v = in_a ? -128 : -127;
        else if (kind == 2) v = 127;
        else if (kind == 3) v = r & 1 ? 127 : in_a ? -128 : -127;
        else if ((r & 3) == 0) v = r & 4 ? 127 : in_a ? -128 : -127;
        else v = in_a ? (int)(r >> 8 & 255) - 128 : (int)((r >> 8) % 255) - 127;
        if (in_a) A[i] = (int8_t)v;
        else B[i - na] = (int8_t)v;
    }
}

/* The reference on a few values worked out by hand, and C overwritten (not added to) */
static int i8_reference_known_values(void) {
    static const int8_t A[2 * 3] = { 1, -2, 3, -128, 127, 0 }, B[2 * 3] = { 4, 5, -6, -127, 127, 127 };
    int32_t C[4] = { 99, 99, 99, 99 };
    mlc_gemm_i8_reference(2, 2, 3, A, B, C);
    CHECK(C[0] == 4 - 10 - 18);                      /* row 0 of A against row 0 of B */
    CHECK(C[1] == -127 - 254 + 381);
    CHECK(C[2] == -512 + 635);
    CHECK(C[3] == 16256 + 16129);
    return 1;
}

/* The reference against 64-bit sums, at K = 2^16 with every product at its largest */
static int i8_reference_matches_wide_sums(void) {
    static const int sizes[][3] = { { 3, 5, 7 }, { 2, 3, 65536 }, { 9, 4, 1000 } };
    int s, kind;
    uint64_t state = 1;
    for (s = 0; s < 3; s++)
        for (kind = 0; kind < 4; kind++) {
            const int M = sizes[s][0], N = sizes[s][1], K = sizes[s][2];
            int8_t *A = (int8_t *)malloc((size_t)M * K), *B = (int8_t *)malloc((size_t)N * K);
            int32_t *C = (int32_t *)malloc((size_t)M * N * sizeof(int32_t));
            int i, j, k, ok = 1;
            CHECK(A && B && C);
            fill(A, (size_t)M * K, B, (size_t)N * K, kind, &state);
            mlc_gemm_i8_reference(M, N, K, A, B, C);
            for (i = 0; i < M && ok; i++)
                for (j = 0; j < N && ok; j++) {
                    long long sum = 0;
                    for (k = 0; k < K; k++) sum += (long long)A[(size_t)i * K + k] * B[(size_t)j * K + k];
                    ok = C[(size_t)i * N + j] == sum;
                }
            free(A); free(B); free(C);
            CHECK_MSG(ok, "M %d N %d K %d kind %d", M, N, K, kind);
        }
    return 1;
}

/* mlc_gemm_i8 against the reference for one M, N, K and kind of values, on every kernel this
   CPU runs and on 1 and 2 threads, with garbage in C first; *kernels counts the kernels run */
static int compare_kernels(mlc_ctx *ctx, int M, int N, int K, int kind, uint64_t *state, int *kernels) {
    const size_t na = (size_t)M * K, nb = (size_t)N * K, nc = (size_t)M * N;
    int8_t *A = (int8_t *)malloc(na + 1), *B = (int8_t *)malloc(nb + 1);
    int32_t *want = (int32_t *)malloc(nc * sizeof(int32_t) + 4);
    int32_t *got = (int32_t *)malloc(nc * sizeof(int32_t) + 4);
    int k, threads, ok = 1;
    CHECK(A && B && want && got);
    fill(A, na, B, nb, kind, state);
    mlc_gemm_i8_reference(M, N, K, A, B, want);
    *kernels = 0;
    for (k = 0; k < 4 && ok; k++) {
        const char *name = test_gemm_i8_kernel(ctx, k);
        if (!name) continue;
        ++*kernels;
        for (threads = 1; threads <= 2 && ok; threads++) {
            size_t x;
            mlc_set_threads(ctx, threads);
            memset(got, 0xa5, nc * sizeof(int32_t));
            mlc_gemm_i8(ctx, M, N, K, A, B, got);
            if (mlc_error(ctx)) {
                snprintf(test_failure, sizeof test_failure, "%s: %s", name, mlc_error_message(ctx));
                ok = 0;
            }
            for (x = 0; x < nc && ok; x++)
                if (got[x] != want[x]) {
                    snprintf(test_failure, sizeof test_failure,
                             "%s, %d thread%s: M %d N %d K %d kind %d: C[%zu] = %ld, reference %ld", name,
                             threads, threads > 1 ? "s" : "", M, N, K, kind, x, (long)got[x], (long)want[x]);
                    ok = 0;
                }
        }
    }
    test_gemm_i8_kernel(ctx, -1);
    mlc_set_threads(ctx, 0);
    free(A); free(B); free(want); free(got);
    return ok;
}

/* Every kernel against the reference: all pairs of a set of M and N from 1 to 70 (primes, one
   under, at and over the tiles' 4, 6, 12 rows and 16, 32 columns) with K off and on whole words
   (1, 3, 4, 5, 31, 64, 67); then larger products: K 4099 over several slices of unequal
   depth, M over one block of 192 rows, N over one panel of 2048 columns, threads sharing rows
   and sharing columns; and K = 2^16 with every product at its largest, for each kind of values */
static int i8_kernels_match_reference(void) {
    static const int ms[] = { 1, 3, 5, 12, 13, 32, 47, 70 }, ns[] = { 1, 2, 7, 16, 31, 33, 70 },
                     ks[] = { 1, 3, 4, 5, 31, 64, 67 };
    static const int large[][3] = { { 1, 70, 4099 }, { 61, 67, 4099 }, { 70, 70, 4099 }, { 200, 40, 600 },
                                    { 3, 2100, 9 }, { 5, 300, 200 }, { 130, 17, 1030 }, { 2, 33, 65536 },
                                    { 13, 3, 65536 } };
    mlc_ctx *ctx = test_ctx(26);
    uint64_t state = 26;
    int m, n, k, s, kind, kernels = 0;
    for (m = 0; m < (int)(sizeof ms / sizeof ms[0]); m++)
        for (n = 0; n < (int)(sizeof ns / sizeof ns[0]); n++)
            for (k = 0; k < (int)(sizeof ks / sizeof ks[0]); k++)
                if (!compare_kernels(ctx, ms[m], ns[n], ks[k], (m + n + k) % 4, &state, &kernels)) {
                    test_destroy(ctx);
                    return 0;
                }
    for (s = 0; s < (int)(sizeof large / sizeof large[0]); s++)
        for (kind = 0; kind < 4; kind++)
            if (!compare_kernels(ctx, large[s][0], large[s][1], large[s][2], kind, &state, &kernels)) {
                test_destroy(ctx);
                return 0;
            }
    test_destroy(ctx);
    CHECK_MSG(kernels >= 1, "no int8 kernel ran");     /* the portable one runs everywhere */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(MLC_NO_MALLOC) \
    && ((defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && __GNUC__ >= 11))
    /* where mlc.h builds the x86 kernels, the ones this CPU has ran too */
    CHECK_MSG(kernels >= 1 + (__builtin_cpu_supports("avx2") != 0)
                             + (__builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw")),
              "only %d int8 kernels ran", kernels);
#endif
    return 1;
}

/* A context that holds its memory in a fixed arena takes the portable loops (no workspace),
   with the same bits */
static int i8_fixed_arena_same_bits(void) {
    static unsigned char arena[1 << 16];
    enum { M = 20, N = 37, K = 130 };
    static int8_t A[M * K], B[N * K];
    static int32_t want[M * N], got[M * N];
    uint64_t state = 7;
    mlc_config c;
    mlc_ctx *ctx;
    memset(&c, 0, sizeof c);
    c.quiet = 1; c.device = "cpu"; c.arena = arena; c.arena_bytes = sizeof arena;
    ctx = mlc_create(&c);
    CHECK(ctx && !mlc_error(ctx));
    fill(A, sizeof A, B, sizeof B, 0, &state);
    mlc_gemm_i8_reference(M, N, K, A, B, want);
    mlc_gemm_i8(ctx, M, N, K, A, B, got);
    CHECK_MSG(mlc_error(ctx) == MLC_OK, "%s", mlc_error_message(ctx));
    CHECK(memcmp(got, want, sizeof want) == 0);
    mlc_destroy(ctx);
    return 1;
}

/* Refused: negative sizes, a NULL matrix where it would be read or written, K over 2^16; each
   is MLC_ERR_ARG naming mlc_gemm_i8 and leaves C as it was. Empty products are fine: nothing
   is read, and K = 0 gives zeros. */
static int i8_gemm_argument_errors(void) {
    static const int8_t A[6] = { 1, 2, 3, 4, 5, 6 }, B[6] = { 1, 1, 1, 1, 1, 1 };
    static const struct { int M, N, K, a, b, c; } bad[] = {
        { -1, 2, 3, 1, 1, 1 }, { 2, -1, 3, 1, 1, 1 }, { 2, 2, -3, 1, 1, 1 }, { 2, 2, 3, 0, 1, 1 },
        { 2, 2, 3, 1, 0, 1 }, { 2, 2, 3, 1, 1, 0 }, { 2, 2, 65537, 1, 1, 1 }, { 1, 1, 1 << 30, 1, 1, 1 }
    };
    mlc_ctx *ctx = test_ctx(3);
    int32_t C[4] = { 7, 7, 7, 7 };
    size_t i;
    for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        mlc_gemm_i8(ctx, bad[i].M, bad[i].N, bad[i].K, bad[i].a ? A : NULL, bad[i].b ? B : NULL,
                    bad[i].c ? C : NULL);
        CHECK_MSG(mlc_error(ctx) == MLC_ERR_ARG, "case %zu: error %d", i, (int)mlc_error(ctx));
        CHECK_MSG(strstr(mlc_error_message(ctx), "mlc_gemm_i8") != NULL, "case %zu: %s", i,
                  mlc_error_message(ctx));
        CHECK(C[0] == 7 && C[1] == 7 && C[2] == 7 && C[3] == 7);
        mlc_clear_error(ctx);
    }
    mlc_gemm_i8(ctx, 1, 1, 65537, A, B, C);             /* the message gives the limit */
    CHECK_MSG(strstr(mlc_error_message(ctx), "65536") != NULL, "%s", mlc_error_message(ctx));
    mlc_clear_error(ctx);
    mlc_gemm_i8(ctx, 0, 2, 3, NULL, NULL, NULL);         /* nothing to compute, nothing read */
    mlc_gemm_i8(ctx, 2, 0, 3, NULL, NULL, NULL);
    mlc_gemm_i8(ctx, 2, 2, 0, NULL, NULL, C);            /* K = 0: zeros */
    CHECK_MSG(mlc_error(ctx) == MLC_OK, "%s", mlc_error_message(ctx));
    CHECK(C[0] == 0 && C[1] == 0 && C[2] == 0 && C[3] == 0);
    mlc_gemm_i8(ctx, 2, 2, 3, A, B, C);
    CHECK(C[0] == 6 && C[1] == 6 && C[2] == 15 && C[3] == 15);
    mlc_gemm_i8(ctx, 2, 2, -1, A, B, C);                 /* an error set: later calls do nothing */
    C[0] = 7;
    mlc_gemm_i8(ctx, 2, 2, 3, A, B, C);
    CHECK(C[0] == 7);
    mlc_gemm_i8(NULL, 2, 2, 3, A, B, C);                 /* no context: nothing */
    CHECK(C[0] == 7);
    test_destroy(ctx);
    return 1;
}

const test_case tests_int8[] = {
    TEST(i8_reference_known_values)
    TEST(i8_reference_matches_wide_sums)
    TEST(i8_kernels_match_reference)
    TEST(i8_fixed_arena_same_bits)
    TEST(i8_gemm_argument_errors)
    { NULL, NULL }
};
