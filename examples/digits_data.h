/*
 * digits_data.h - loader for data/digits.bin (UCI 8x8 handwritten digits)
 * for the mlc examples.  Static, header-only, C99 (also compiles as C++),
 * no dependency on mlc.h.  See data/README.md for the file format:
 *
 *   offset 0   8 bytes   magic "MLCDIGT1"
 *   offset 8   uint32 LE count N (1..100000)
 *   offset 12  uint32 LE rows (must be 8)
 *   offset 16  uint32 LE cols (must be 8)
 *   offset 20  N records of 65 bytes: 64 pixel bytes (0..16), 1 label byte (0..9)
 *
 * Usage:
 *   digits_set ds;
 *   char err[256];
 *   if (digits_load("data/digits.bin", &ds, err, sizeof err) != 0) {
 *       fprintf(stderr, "%s\n", err);
 *       return 1;
 *   }
 *   ... ds.pixels[i * DIGITS_PIXELS + j], ds.labels[i] ...
 *   digits_free(&ds);
 *
 * The examples use a fixed split: samples [0, DIGITS_TRAIN_COUNT) are the
 * training set and [DIGITS_TRAIN_COUNT, count) the test set (1500 / 297).
 */
#ifndef DIGITS_DATA_H
#define DIGITS_DATA_H

#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DIGITS_ROWS 8
#define DIGITS_COLS 8
#define DIGITS_PIXELS 64          /* DIGITS_ROWS * DIGITS_COLS */
#define DIGITS_MAX_PIXEL 16
#define DIGITS_CLASSES 10
#define DIGITS_MAX_COUNT 100000
#define DIGITS_HEADER_SIZE 20
#define DIGITS_RECORD_SIZE 65     /* DIGITS_PIXELS + 1 label byte */
#define DIGITS_TRAIN_COUNT 1500   /* first 1500 samples: train; rest: test */

/* Keep -Wunused-function quiet when a program uses only part of the API. */
#if defined(__GNUC__) || defined(__clang__)
#define DIGITS_UNUSED_ __attribute__((unused))
#else
#define DIGITS_UNUSED_
#endif

typedef struct {
    int count;
    unsigned char *pixels; /* count * 64, row-major 8x8 per sample, 0..16 */
    unsigned char *labels; /* count, 0..9 */
} digits_set;

#if defined(__GNUC__) || defined(__clang__)
static void digits_err_(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
#endif

static DIGITS_UNUSED_ void digits_err_(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    if (err == NULL || errlen == 0)
        return;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

static DIGITS_UNUSED_ unsigned long digits_u32le_(const unsigned char *p)
{
    return (unsigned long)p[0] | ((unsigned long)p[1] << 8) |
           ((unsigned long)p[2] << 16) | ((unsigned long)p[3] << 24);
}

static DIGITS_UNUSED_ void digits_free(digits_set *s)
{
    if (s == NULL)
        return;
    free(s->pixels);
    free(s->labels);
    s->pixels = NULL;
    s->labels = NULL;
    s->count = 0;
}

/* Returns 0 on success.  On failure returns -1, leaves *out empty
 * (count 0, NULL pointers), frees anything it allocated, and writes a message
 * naming the path and the byte offset of the problem into err. */
static DIGITS_UNUSED_ int digits_load(const char *path, digits_set *out,
                                      char *err, size_t errlen)
{
    static const char magic[8] = {'M', 'L', 'C', 'D', 'I', 'G', 'T', '1'};
    unsigned char hdr[DIGITS_HEADER_SIZE];
    unsigned char rec[DIGITS_RECORD_SIZE];
    unsigned long count, rows, cols, i, off;
    unsigned char *pixels = NULL, *labels = NULL;
    size_t n;
    int j;
    FILE *f;

    if (err != NULL && errlen > 0)
        err[0] = '\0';
    if (out == NULL) {
        digits_err_(err, errlen, "%s: digits_load: output pointer is NULL",
                    path ? path : "(null)");
        return -1;
    }
    out->count = 0;
    out->pixels = NULL;
    out->labels = NULL;
    if (path == NULL) {
        digits_err_(err, errlen, "(null): digits_load: path is NULL");
        return -1;
    }

    errno = 0;
    f = fopen(path, "rb");
    if (f == NULL) {
        digits_err_(err, errlen, "%s: cannot open: %s", path,
                    errno ? strerror(errno) : "unknown error");
        return -1;
    }

    errno = 0;
    n = fread(hdr, 1, sizeof hdr, f);
    if (n < sizeof hdr && ferror(f)) {
        digits_err_(err, errlen, "%s: read error at byte offset %lu: %s", path,
                    (unsigned long)n, errno ? strerror(errno) : "unknown error");
        goto fail;
    }
    if (n >= sizeof magic && memcmp(hdr, magic, sizeof magic) != 0) {
        digits_err_(err, errlen,
                    "%s: bad magic at byte offset 0 (expected \"MLCDIGT1\"; "
                    "not a digits.bin file)", path);
        goto fail;
    }
    if (n < sizeof hdr) {
        digits_err_(err, errlen,
                    "%s: truncated header: file ends at byte offset %lu, "
                    "header needs %d bytes", path, (unsigned long)n,
                    DIGITS_HEADER_SIZE);
        goto fail;
    }

    count = digits_u32le_(hdr + 8);
    rows = digits_u32le_(hdr + 12);
    cols = digits_u32le_(hdr + 16);
    if (count < 1 || count > DIGITS_MAX_COUNT) {
        digits_err_(err, errlen,
                    "%s: bad sample count %lu at byte offset 8 (must be 1..%d)",
                    path, count, DIGITS_MAX_COUNT);
        goto fail;
    }
    if (rows != DIGITS_ROWS) {
        digits_err_(err, errlen,
                    "%s: bad row count %lu at byte offset 12 (must be %d)",
                    path, rows, DIGITS_ROWS);
        goto fail;
    }
    if (cols != DIGITS_COLS) {
        digits_err_(err, errlen,
                    "%s: bad column count %lu at byte offset 16 (must be %d)",
                    path, cols, DIGITS_COLS);
        goto fail;
    }

    pixels = (unsigned char *)malloc((size_t)count * DIGITS_PIXELS);
    labels = (unsigned char *)malloc((size_t)count);
    if (pixels == NULL || labels == NULL) {
        digits_err_(err, errlen,
                    "%s: out of memory for %lu samples (header at byte offset 8)",
                    path, count);
        goto fail;
    }

    off = DIGITS_HEADER_SIZE;
    for (i = 0; i < count; i++, off += DIGITS_RECORD_SIZE) {
        errno = 0;
        n = fread(rec, 1, sizeof rec, f);
        if (n < sizeof rec) {
            if (ferror(f))
                digits_err_(err, errlen,
                            "%s: read error at byte offset %lu: %s", path,
                            off + (unsigned long)n,
                            errno ? strerror(errno) : "unknown error");
            else
                digits_err_(err, errlen,
                            "%s: truncated: file ends at byte offset %lu, before "
                            "the end of sample %lu (header count %lu needs %lu "
                            "bytes)",
                            path, off + (unsigned long)n, i, count,
                            (unsigned long)DIGITS_HEADER_SIZE +
                                count * DIGITS_RECORD_SIZE);
            goto fail;
        }
        for (j = 0; j < DIGITS_PIXELS; j++) {
            if (rec[j] > DIGITS_MAX_PIXEL) {
                digits_err_(err, errlen,
                            "%s: pixel value %u out of range 0..%d at byte "
                            "offset %lu (sample %lu, pixel %d)",
                            path, (unsigned)rec[j], DIGITS_MAX_PIXEL,
                            off + (unsigned long)j, i, j);
                goto fail;
            }
        }
        if (rec[DIGITS_PIXELS] >= DIGITS_CLASSES) {
            digits_err_(err, errlen,
                        "%s: label %u out of range 0..%d at byte offset %lu "
                        "(sample %lu)",
                        path, (unsigned)rec[DIGITS_PIXELS], DIGITS_CLASSES - 1,
                        off + DIGITS_PIXELS, i);
            goto fail;
        }
        memcpy(pixels + i * DIGITS_PIXELS, rec, DIGITS_PIXELS);
        labels[i] = rec[DIGITS_PIXELS];
    }

    errno = 0;
    if (fgetc(f) != EOF) {
        digits_err_(err, errlen,
                    "%s: unexpected trailing data at byte offset %lu "
                    "(header count %lu needs exactly %lu bytes)",
                    path, off, count, off);
        goto fail;
    }
    if (ferror(f)) {
        digits_err_(err, errlen, "%s: read error at byte offset %lu: %s", path,
                    off, errno ? strerror(errno) : "unknown error");
        goto fail;
    }

    fclose(f);
    out->count = (int)count;
    out->pixels = pixels;
    out->labels = labels;
    return 0;

fail:
    free(pixels);
    free(labels);
    fclose(f);
    return -1;
}

#endif /* DIGITS_DATA_H */
