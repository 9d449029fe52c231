/* parse_arg.h - the examples' numbers from the command line, strictly: the whole value must be a
   number in the range the option allows, or the example says which option, what it was given
   and what it takes (atoi would read "1e9" as 1, "abc" as 0 and overflow past INT_MAX). */
#ifndef MLC_EXAMPLES_PARSE_ARG_H
#define MLC_EXAMPLES_PARSE_ARG_H
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#if defined(__GNUC__) || defined(__clang__)
#define PARSE_ARG_UNUSED __attribute__((unused))    /* an example may use only some of them */
#else
#define PARSE_ARG_UNUSED
#endif

/* value as an integer in [lo, hi] into *out; 0 (and a message naming flag) if it is not one */
static PARSE_ARG_UNUSED int parse_int_arg(const char *flag, const char *value, long lo, long hi, int *out) {
    char *end;
    long x;
    errno = 0;
    x = strtol(value, &end, 10);
    if (end == value || *end || errno || x < lo || x > hi) {
        fprintf(stderr, "%s: '%s' is not an integer from %ld to %ld\n", flag, value, lo, hi);
        return 0;
    }
    *out = (int)x;
    return 1;
}

/* value as an unsigned integer (at most 2^64 - 1) into *out */
static PARSE_ARG_UNUSED int parse_u64_arg(const char *flag, const char *value, unsigned long long *out) {
    char *end;
    unsigned long long x;
    errno = 0;
    x = strtoull(value, &end, 10);
    if (end == value || *end || errno || value[0] == '-') {
        fprintf(stderr, "%s: '%s' is not an integer from 0 to %llu\n", flag, value, (unsigned long long)-1);
        return 0;
    }
    *out = x;
    return 1;
}

/* value as a finite number in (lo, hi] into *out */
static PARSE_ARG_UNUSED int parse_float_arg(const char *flag, const char *value, double lo, double hi,
                                            float *out) {
    char *end;
    double x;
    errno = 0;
    x = strtod(value, &end);
    if (end == value || *end || errno || !(x > lo && x <= hi)) {
        fprintf(stderr, "%s: '%s' is not a number above %g and at most %g\n", flag, value, lo, hi);
        return 0;
    }
    *out = (float)x;
    return 1;
}
#endif
