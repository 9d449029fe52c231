/* The test runner: runs every suite and prints "N passed, M failed". Exit status 1 on failure.
   Arguments: substrings; only tests whose "suite.name" contains one of them run. */
#define MLC_IMPLEMENTATION
#include "test.h"

char test_failure[512];

#define SUITES(X) X(tensor) X(ops) X(grad) X(errors) X(modules) X(optim) X(train)
#define DECLARE(s) extern const test_case tests_##s[];
SUITES(DECLARE)
#define ENTRY(s) { #s, tests_##s },
static const struct { const char *suite; const test_case *tests; } suites[] = { SUITES(ENTRY) };

int main(int argc, char **argv) {
    int passed = 0, failed = 0;
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
            if (ok) passed++;
            else { failed++; printf("FAIL %s: %s\n", full, test_failure); }
        }
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
