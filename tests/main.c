/* The test runner: runs every suite and prints "N passed, M failed, K skipped". Exit status 1
   on failure, and on any skip when CI=true (CI installs every optional dependency).
   Arguments: substrings; only tests whose "suite.name" contains one of them run (all when none
   is given), and none named by an argument -SUITE.NAME (the whole name: the Makefile's
   fast-math run leaves a few out this way).
   The device: test_ctx leaves it to $MLC_DEVICE (MLC_DEVICE=opencl runs every suite on the
   first OpenCL device); MLC_TEST_FAKE_DEVICE=1 runs every suite on the fake device of
   tests/test_device.c, through the CPU fallbacks. On a real device a test whose ops fell back
   to the CPU fails: every op should have a kernel there. (The implementation of mlc.h is
   compiled in tests/test_device.c.)
   "--devices": list the devices mlc_devices finds and exit 0, or 1 when there are none (the
   Makefile asks this before running the suites on OpenCL). */
#include <stdlib.h>
#include "test.h"

char test_failure[512];

#define SUITES(X) X(tensor) X(ops) X(gemm) X(grad) X(errors) X(misuse) X(modules) X(optim) X(train) X(data) \
    X(device) X(safetensors) X(attention) X(recurrent) X(embedded) X(threads) X(onectx) X(dtype) X(hostile) \
    X(conv) X(int8) X(quant)
#define DECLARE(s) extern const test_case tests_##s[];
SUITES(DECLARE)
#define ENTRY(s) { #s, tests_##s },
static const struct { const char *suite; const test_case *tests; } suites[] = { SUITES(ENTRY) };

int main(int argc, char **argv) {
    int passed = 0, failed = 0, skipped = 0, real_device, fake = test_fake_device_wanted();
    const char *ci = getenv("CI"), *env = getenv("MLC_DEVICE");
    int in_ci = ci && strcmp(ci, "true") == 0;
    size_t s, all_fallbacks = 0;
    mlc_ctx *probe;
    if (argc == 2 && strcmp(argv[1], "--devices") == 0) {
        mlc_device_info info[8];
        int n = mlc_devices(info, 8), i;
        for (i = 0; i < n && i < 8; i++)
            printf("%d: %s (%s, %s) on %s\n", info[i].index, info[i].name, info[i].type, info[i].version, info[i].platform);
        return n > 0 ? 0 : 1;
    }
    probe = test_ctx(0);
    if (!probe || mlc_error(probe)) {
        printf("FAIL runner: no context on device \"%s\": %s\n", env ? env : "cpu", probe ? mlc_error_message(probe) : "mlc_create failed");
        printf("0 passed, 1 failed, 0 skipped\n");
        test_destroy(probe);
        return 1;
    }
    real_device = mlc_has_device(probe) && !fake;
    printf("device: %s%s\n", mlc_device_name(probe),
           fake ? " (MLC_TEST_FAKE_DEVICE=1: every op falls back to the CPU through copies)"
                : real_device ? " (MLC_DEVICE; a test whose ops fall back to the CPU fails)" : "");
    fflush(stdout);
    test_destroy(probe);
    for (s = 0; s < sizeof suites / sizeof suites[0]; s++) {
        const test_case *t;
        for (t = suites[s].tests; t->name; t++) {
            char full[160];
            int i, wanted = 1, excluded = 0, ok;
            snprintf(full, sizeof full, "%s.%s", suites[s].suite, t->name);
            for (i = 1; i < argc; i++) if (argv[i][0] != '-') wanted = 0;
            for (i = 1; i < argc; i++)
                if (argv[i][0] == '-') excluded |= strcmp(full, argv[i] + 1) == 0;
                else wanted |= strstr(full, argv[i]) != NULL;
            if (!wanted || excluded) continue;
            test_failure[0] = '\0';
            test_fallbacks = 0;
            test_fallback_op[0] = '\0';
            ok = t->run();
            all_fallbacks += test_fallbacks;
            if (ok == 1 && real_device && test_fallbacks) {
                snprintf(test_failure, sizeof test_failure, "%zu ops fell back to the CPU: %s", test_fallbacks, test_fallback_op);
                ok = 0;
            }
            if (ok == 1) passed++;
            else if (ok == 2) { skipped++; printf("SKIP %s: %s\n", full, test_failure); }
            else { failed++; printf("FAIL %s: %s\n", full, test_failure); }
            fflush(stdout);
        }
    }
    if (fake && passed && !all_fallbacks) {     /* the fallback path must really have run */
        failed++;
        printf("FAIL runner: MLC_TEST_FAKE_DEVICE=1 but no op fell back (is the fake device installed?)\n");
    } else if (fake) printf("fake device: %zu ops ran through the CPU fallback\n", all_fallbacks);
    if (skipped && in_ci) printf("CI=true: %d test(s) skipped, and nothing may be skipped in CI\n", skipped);
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return failed || (skipped && in_ci) ? 1 : 0;
}
