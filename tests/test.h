/* A small test runner: each test file defines a table of tests; main.c runs every table and
   ends with the line "N passed, M failed". A test fails on its first failed CHECK. */
#ifndef MLC_TEST_H
#define MLC_TEST_H
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "../mlc.h"

typedef struct test_case { const char *name; int (*run)(void); } test_case;
/* One row of a suite's table: TEST(fn) runs fn under its own name. A table ends with { NULL, NULL }. */
#define TEST(fn) { #fn, fn },

/* Where a check failed; the runner prints it after the test's name. */
extern char test_failure[512];

#define CHECK(cond) do { if (!(cond)) { \
    snprintf(test_failure, sizeof test_failure, "%s:%d: CHECK(%s)", __FILE__, __LINE__, #cond); return 0; } } while (0)
#define CHECK_MSG(cond, ...) do { if (!(cond)) { \
    int at_ = snprintf(test_failure, sizeof test_failure, "%s:%d: ", __FILE__, __LINE__); \
    snprintf(test_failure + at_, sizeof test_failure - (size_t)at_, __VA_ARGS__); return 0; } } while (0)
#define CHECK_NEAR(a, b, tol) do { double a_ = (a), b_ = (b); if (!(fabs(a_ - b_) <= (tol))) { \
    snprintf(test_failure, sizeof test_failure, "%s:%d: %s = %.9g, expected %s = %.9g (tol %g)", \
             __FILE__, __LINE__, #a, a_, #b, b_, (double)(tol)); return 0; } } while (0)

/* a == b as floats. A float literal may carry more precision than a float where
   FLT_EVAL_METHOD is 2 (x87: 0.01f is then 0.01 to 64 bits), so compare through float
   parameters, which round both. */
static inline int test_same_float(float a, float b) { return a == b; }
/* A float's bits, and NaN read from them: -ffast-math folds x != x to false and signbit of a
   zero to 0 (make test runs a fast-math build). */
static inline unsigned test_bits(float x) { unsigned u; memcpy(&u, &x, sizeof u); return u; }
static inline int test_is_nan(float x) { return (test_bits(x) & 0x7fffffffu) > 0x7f800000u; }

/* A test that cannot run here (a missing optional library) says why; under CI=true a skip
   counts as a failure, since CI installs everything. */
#define SKIP(...) do { snprintf(test_failure, sizeof test_failure, __VA_ARGS__); return 2; } while (0)

/* Contexts for tests (tests/test_device.c). test_ctx keeps errors quiet (tests provoke them on
   purpose) and leaves config.device NULL, so $MLC_DEVICE picks the device every suite runs on;
   with MLC_TEST_FAKE_DEVICE=1 it installs the fake device instead (every op falls back to the
   CPU through copies). test_adopt does the same for a context a test made with mlc_create.
   test_destroy replaces mlc_destroy: it adds the context's fallbacks to test_fallbacks, which
   the runner checks after each test when the device is a real one. */
mlc_ctx *test_ctx(unsigned long long seed);
mlc_ctx *test_adopt(mlc_ctx *ctx);
void test_destroy(mlc_ctx *ctx);
int test_fake_device_wanted(void);                 /* MLC_TEST_FAKE_DEVICE=1 */
mlc_ctx *test_install_fake_device(mlc_ctx *ctx);   /* see tests/test_device.c */
/* The host copy of state buffer k (0, 1, 2: as the rule keeps them) of an optimiser's
   parameter i, NULL where the rule keeps none (tests/test_device.c, which sees mlc's internals) */
const float *test_optim_state(mlc_optim *opt, int i, int k);
/* Whether the context started its pool of worker threads (tests/test_device.c) */
int test_pool_started(const mlc_ctx *ctx);
/* mlc's own mlc__parallel: fn(arg, slot, begin, end) over pieces of [0, n) on the context's
   threads (tests/test_device.c) */
void test_parallel(mlc_ctx *ctx, size_t n, size_t parallel_from,
                   void (*fn)(void *arg, int slot, size_t begin, size_t end), void *arg);
/* mlc_gemm_i8 runs int8 kernel k of mlc.h's list (0 portable C, 1 AVX2, 2 AVX-VNNI, 3 AVX-512
   VNNI; -1: the best this CPU has, as mlc_create picks) for the context's products from now on:
   returns its name, or NULL (nothing changed) where this build or CPU lacks it
   (tests/test_device.c) */
const char *test_gemm_i8_kernel(mlc_ctx *ctx, int k);
/* Fault injection on the context's device (the fake one, OpenCL, any backend): refuse buffer k
   and every later one (k < 0: none); returns how many buffers the device has made so far (-1:
   the context runs on the CPU only). */
long test_device_fail_at(mlc_ctx *ctx, long k);
/* Device buffers made and neither released nor in mlc's books (a leak); -1: the CPU only. */
long test_device_buffers_lost(const mlc_ctx *ctx);
/* OpenCL: the device takes at most `bytes` of a kernel's arguments (as if its
   CL_DEVICE_MAX_PARAMETER_SIZE said so); only before the context's first launch, which builds
   the kernels for it. 0: not an OpenCL context, or too late. */
int test_device_max_args(mlc_ctx *ctx, size_t bytes);
/* NaN and finiteness read from a float's bits: what the tests check survives -ffast-math (the
   fast-math build in the Makefile), which folds isnan and isfinite to constants. */
int test_isnan(double v);
int test_isfinite(double v);
float test_erf(float x);
extern size_t test_fallbacks;                      /* summed by test_destroy */
extern char test_fallback_op[96];                  /* the first op that fell back */
void test_destroy_expecting_fallbacks(mlc_ctx *ctx, const char *ops);  /* (tests/test_device.c) */

/* Every element of t equals want[i] within tol (read through mlc_host_data: on a device the
   host copy may be out of date until then). */
#define CHECK_TENSOR(t, want, tol) do { mlc_tensor *t_ = (t); const float *d_; size_t i_; CHECK(t_ != NULL); \
    d_ = mlc_host_data(t_); CHECK(d_ != NULL); \
    for (i_ = 0; i_ < t_->size; i_++) if (!(fabs((double)d_[i_] - (double)(want)[i_]) <= (tol))) { \
        snprintf(test_failure, sizeof test_failure, "%s:%d: %s[%zu] = %.9g, expected %.9g", \
                 __FILE__, __LINE__, #t, i_, (double)d_[i_], (double)(want)[i_]); return 0; } } while (0)

#endif
