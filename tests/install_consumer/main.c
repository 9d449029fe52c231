/* A program built against an installed mlc (make test-install): once with
   cc $(pkg-config --cflags --libs mlc), once with CMake's find_package(mlc) and mlc::mlc (and
   the components' targets). It includes the installed mlc.h, runs one op and checks that the
   implementation's version, mlc_version(), is the header's MLC_VERSION_STRING. */
#define MLC_IMPLEMENTATION
#include "mlc.h"
#include <stdio.h>
#include <string.h>

/* CMakeLists.txt asks for these when it links the components' targets: their definitions
   must reach this file */
#if defined(MLC_CONSUMER_EXPECT_OPENCL) && !defined(MLC_OPENCL)
#error "mlc::opencl did not define MLC_OPENCL"
#endif
#if defined(MLC_CONSUMER_EXPECT_CBLAS) && !defined(MLC_USE_CBLAS)
#error "mlc::openblas did not define MLC_USE_CBLAS"
#endif

int main(void) {
    static const float a[] = { 1, 2 }, b[] = { 3, 4 };
    mlc_ctx *ctx = mlc_create(&(mlc_config){ .device = "cpu", .quiet = 1 });
    if (!ctx) { fprintf(stderr, "mlc_create failed\n"); return 1; }
    float dot = mlc_item(mlc_matmul(mlc_from_data(ctx, MLC_SHAPE(1, 2), a),
                                    mlc_from_data(ctx, MLC_SHAPE(2, 1), b)));   /* 1*3 + 2*4 */
    int ok = mlc_error(ctx) == MLC_OK && dot == 11.0f && strcmp(mlc_version(), MLC_VERSION_STRING) == 0;
    printf("mlc %s (header %s), [1 2] @ [3 4]^T = %g%s%s: %s\n", mlc_version(), MLC_VERSION_STRING,
           dot,
#ifdef MLC_OPENCL
           ", OpenCL built in",
#else
           "",
#endif
#ifdef MLC_USE_CBLAS
           ", cblas_sgemm",
#else
           "",
#endif
           ok ? "ok" : "WRONG");
    if (mlc_error(ctx) != MLC_OK) fprintf(stderr, "%s\n", mlc_error_message(ctx));
    mlc_destroy(ctx);
    return !ok;
}
