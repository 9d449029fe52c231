/* The test runner: runs every suite and prints "N passed, M failed, K skipped". Exit status 1
   on failure, and on any skip when CI=true (CI installs every optional dependency).
   Arguments: substrings; only tests whose "suite.name" contains one of them run. */
#define MLC_IMPLEMENTATION
#include <stdlib.h>
#include "test.h"

char test_failure[512];

#define SUITES(X) X(tensor) X(ops) X(gemm) X(grad) X(errors) X(modules) X(optim) X(train)
#define DECLARE(s) extern const test_case tests_##s[];
SUITES(DECLARE)
#define ENTRY(s) { #s, tests_##s },
static const struct { const char *suite; const test_case *tests; } suites[] = { SUITES(ENTRY) };

int main(int argc, char **argv) {
    int passed = 0, failed = 0, skipped = 0;
    const char *ci = getenv("CI");
    int in_ci = ci && strcmp(ci, "true") == 0;
    size_t s;
    for (s = 0; s < sizeof suites / sizeof suites[0]; s++) {
        const test_case *t;
        for (t = suites[s].tests; t->name; t++) {
            char full[160];
            int i, wanted = argc < 2, ok;
            snprintf(full, sizeof full, "%s.%s", suites[s].suite, t->name);
            for (i = 1; i < argc; i++) if (strstr(full, argv[i])) wanted = 1;
            if (!wanted) continue;
            test_failure[0] = '\0';
            ok = t->run();
            if (ok == 1) passed++;
            else if (ok == 2) { skipped++; printf("SKIP %s: %s\n", full, test_failure); }
            else { failed++; printf("FAIL %s: %s\n", full, test_failure); }
        }
    }
    if (skipped && in_ci) printf("CI=true: %d test(s) skipped, and nothing may be skipped in CI\n", skipped);
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    return failed || (skipped && in_ci) ? 1 : 0;
}
