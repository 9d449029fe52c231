/* safetensors and checkpoints: round trips (memory and files), F16/BF16/I64 loading from
   hand-built files, strict and partial loads, every class of corrupt file (error code, and a
   message naming the tensor and the byte offset), a resumed run that matches an uninterrupted
   one bit for bit, and saves that fail part-way leaving the previous file intact. */
#define _POSIX_C_SOURCE 200809L
#include <signal.h>
#include <stdlib.h>
#ifdef _WIN32                           /* access, _mktemp, _mkdir, _rmdir; no rlimit, no /dev/full */
#include <io.h>
#include <direct.h>
#define F_OK 0
#define W_OK 2
#define rmdir _rmdir
#else
#include <dirent.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#endif
#include "test.h"

/* A small model with every kind of state: Linear, BatchNorm (running stats and
   num_batches_tracked), LayerNorm, Dropout (draws from the context's RNG). */
static mlc_module *small_model(mlc_ctx *ctx) {
    return mlc_nn_sequential(ctx, mlc_nn_linear(ctx, 4, 8), mlc_nn_batch_norm(ctx, 8), mlc_nn_relu(ctx),
                             mlc_nn_dropout(ctx, 0.25f), mlc_nn_layer_norm(ctx, 8), mlc_nn_linear(ctx, 8, 3), NULL);
}

static int contains(const char *text, const char *part) { return text && strstr(text, part) != NULL; }

/* Every state tensor of a equals b's (same names, shapes and bits). */
static int same_state(mlc_module *a, mlc_module *b) {
    mlc_named_tensor sa[32], sb[32];
    int n = mlc_module_state(a, sa, 32), i;
    CHECK(n == mlc_module_state(b, sb, 32) && n <= 32);
    for (i = 0; i < n; i++) {
        CHECK(strcmp(sa[i].name, sb[i].name) == 0 && mlc_same_shape(sa[i].tensor, sb[i].tensor));
        CHECK_MSG(memcmp(mlc_host_data(sa[i].tensor), mlc_host_data(sb[i].tensor), 4 * sa[i].tensor->size) == 0,
                  "state tensor %d differs", i);
    }
    return 1;
}

/* Train a model a few steps so its buffers hold something other than their defaults. */
static int train_steps(mlc_module *net, mlc_optim *opt, int steps) {
    mlc_ctx *ctx = net->ctx;
    int s;
    for (s = 0; s < steps; s++) {
        mlc_frame f = mlc_frame_begin(ctx);
        mlc_tensor *x = mlc_randn(ctx, MLC_SHAPE(6, 4)), *y = mlc_randn(ctx, MLC_SHAPE(6, 3));
        mlc_tensor *loss = mlc_mse_loss(mlc_forward(net, x), y, MLC_REDUCE_MEAN);
        mlc_zero_grad(opt);
        mlc_backward(loss);
        mlc_step(opt);
        mlc_frame_end(f);
    }
    CHECK_MSG(mlc_error(ctx) == MLC_OK, "%s", mlc_error_message(ctx));
    return 1;
}

static int round_trip_memory(void) {
    mlc_ctx *ctx = test_ctx(1);
    mlc_module *a = small_model(ctx), *b;
    mlc_optim *opt = mlc_adam(ctx, a, (mlc_adam_opts){ .lr = 1e-2f });
    const char *meta[] = { "author", "mlc tests", "note", "quote \" backslash \\ tab \t é", NULL };
    mlc_safetensors *st;
    size_t size, again;
    unsigned char *buf;
    mlc_tensor *x, *ya, *yb;
    CHECK(train_steps(a, opt, 3));
    size = mlc_module_encode(a, meta, NULL, 0);
    CHECK(size > 8 && (buf = (unsigned char *)malloc(size)) != NULL);
    again = mlc_module_encode(a, meta, buf, size);
    CHECK(again == size);
    CHECK((buf[0] + 8) % 8 == 0);                               /* the data starts 8-aligned */
    st = mlc_safetensors_from_memory(ctx, buf, size, "model.safetensors");
    CHECK_MSG(st != NULL, "%s", mlc_error_message(ctx));
    CHECK(mlc_safetensors_count(st) == mlc_module_state(a, NULL, 0));
    CHECK(strcmp(mlc_safetensors_name(st, 0), "0.weight") == 0);
    CHECK(strcmp(mlc_safetensors_name(st, 4), "1.running_mean") == 0);
    CHECK(strcmp(mlc_safetensors_name(st, 6), "1.num_batches_tracked") == 0);
    CHECK(contains(mlc_safetensors_metadata(st, "author"), "mlc tests"));
    CHECK(strcmp(mlc_safetensors_metadata(st, "note"), meta[3]) == 0);
    CHECK(mlc_safetensors_metadata(st, "absent") == NULL);
    mlc_seed(ctx, 99);
    b = small_model(ctx);
    CHECK(mlc_safetensors_load(st, b, NULL) == MLC_OK);
    mlc_safetensors_close(st);
    CHECK(same_state(a, b));
    CHECK(mlc_host_data(b->children[1]->buffers[2])[0] == 3.0f);   /* num_batches_tracked */
    mlc_module_train(a, 0);
    mlc_module_train(b, 0);
    x = mlc_randn(ctx, MLC_SHAPE(5, 4));                        /* the device copies were refreshed */
    ya = mlc_forward(a, x);
    yb = mlc_forward(b, x);
    CHECK(ya && yb);
    CHECK(memcmp(mlc_host_data(ya), mlc_host_data(yb), 4 * ya->size) == 0);
    CHECK(mlc_module_load_from_memory(b, buf, size, NULL) == MLC_OK);
    free(buf);
    test_destroy(ctx);
    return 1;
}

static int make_dir(const char *path) {
#ifdef _WIN32
    return _mkdir(path) == 0;
#else
    return mkdir(path, 0700) == 0;
#endif
}

static int temp_dir(char *dir, size_t cap) {
#ifdef _WIN32
    const char *base = getenv("TEMP");
    if (snprintf(dir, cap, "%s\\mlc-safetensors-XXXXXX", base ? base : ".") >= (int)cap) return 0;
    return _mktemp(dir) != NULL && _mkdir(dir) == 0;
#else
    snprintf(dir, cap, "/tmp/mlc-safetensors-XXXXXX");
    return mkdtemp(dir) != NULL;
#endif
}

/* How many of a save's temporary files ("NAME.tmp-...") are left in dir */
static int temps_left(const char *dir, const char *name) {
    char prefix[128];
    int n = 0;
#ifdef _WIN32
    char pattern[400];
    struct _finddata_t found;
    intptr_t h;
    snprintf(pattern, sizeof pattern, "%s\\%s.tmp-*", dir, name);
    if ((h = _findfirst(pattern, &found)) == -1) return 0;
    do n++; while (_findnext(h, &found) == 0);
    _findclose(h);
    (void)prefix;
#else
    DIR *d = opendir(dir);
    struct dirent *e;
    snprintf(prefix, sizeof prefix, "%s.tmp-", name);
    if (!d) return -1;
    while ((e = readdir(d)) != NULL) n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    closedir(d);
#endif
    return n;
}

static int round_trip_file(void) {
    mlc_ctx *ctx = test_ctx(2);
    mlc_module *a = small_model(ctx), *b;
    const char *meta[] = { "epoch", "7", NULL };
    char dir[300], path[340];
    mlc_safetensors *st;
    mlc_tensor *w;
    CHECK(temp_dir(dir, sizeof dir));
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    CHECK_MSG(mlc_module_save(a, path, meta) == MLC_OK, "%s", mlc_error_message(ctx));
    b = small_model(ctx);
    CHECK_MSG(mlc_module_load(b, path, NULL) == MLC_OK, "%s", mlc_error_message(ctx));
    CHECK(same_state(a, b));
    st = mlc_safetensors_open(ctx, path);
    CHECK(st && strcmp(mlc_safetensors_metadata(st, "epoch"), "7") == 0);
    w = mlc_safetensors_get(st, "5.weight");
    CHECK(w && w->ndim == 2 && w->shape[0] == 3 && w->shape[1] == 8);
    CHECK(memcmp(mlc_host_data(w), mlc_host_data(a->children[5]->params[0]), 4 * w->size) == 0);
    CHECK(mlc_safetensors_get(st, "nothing") == NULL && mlc_error(ctx) == MLC_ERR_ARG);
    CHECK(contains(mlc_error_message(ctx), "nothing"));
    mlc_clear_error(ctx);
    mlc_safetensors_close(st);
    CHECK(mlc_module_load(b, "/nonexistent/dir/x.safetensors", NULL) == MLC_ERR_IO);
    CHECK(contains(mlc_error_message(ctx), "/nonexistent/dir/x.safetensors"));
    mlc_clear_error(ctx);
    CHECK(mlc_module_save(a, "/nonexistent/dir/x.safetensors", NULL) == MLC_ERR_IO);
    mlc_clear_error(ctx);
    remove(path);
    rmdir(dir);
    test_destroy(ctx);
    return 1;
}

/* A file from a JSON header and data bytes (the header length is written in front). */
static size_t build(unsigned char *out, const char *json, const void *data, size_t data_bytes) {
    size_t n = strlen(json), i;
    for (i = 0; i < 8; i++) out[i] = (unsigned char)((unsigned long long)n >> (8 * i));
    memcpy(out + 8, json, n);
    if (data_bytes) memcpy(out + 8 + n, data, data_bytes);
    return 8 + n + data_bytes;
}

static int half_and_bfloat16(void) {
    /* F16: 1, -2, 0.5, 65504 (max), 2^-24 (smallest subnormal), -0, inf, 1.5 */
    static const unsigned char f16[16] = { 0x00, 0x3C, 0x00, 0xC0, 0x00, 0x38, 0xFF, 0x7B,
                                           0x01, 0x00, 0x00, 0x80, 0x00, 0x7C, 0x00, 0x3E };
    /* BF16: 1, -3, 0.15625, 1e38-ish (0x7E96) */
    static const unsigned char bf16[8] = { 0x80, 0x3F, 0x40, 0xC0, 0x20, 0x3E, 0x96, 0x7E };
    static const unsigned char i64[8] = { 5, 0, 0, 0, 0, 0, 0, 0 };
    const float want16[8] = { 1, -2, 0.5f, 65504, 5.9604644775390625e-8f, -0.0f, HUGE_VALF, 1.5f };
    unsigned char file[512], data[32];
    mlc_ctx *ctx = test_ctx(3);
    mlc_safetensors *st;
    mlc_tensor *a, *b;
    mlc_module *bn;
    float want_bf[4];
    uint32_t bits[4] = { 0x3F800000u, 0xC0400000u, 0x3E200000u, 0x7E960000u };
    size_t n;
    int i;
    memcpy(want_bf, bits, sizeof bits);
    memcpy(data, f16, 16);
    memcpy(data + 16, bf16, 8);
    memcpy(data + 24, i64, 8);
    n = build(file, "{\"h\":{\"dtype\":\"F16\",\"shape\":[2,4],\"data_offsets\":[0,16]},"
                    "\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[16,24]},"
                    "\"n\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[24,32]}}", data, 32);
    st = mlc_safetensors_from_memory(ctx, file, n, "hand-built");
    CHECK_MSG(st != NULL, "%s", mlc_error_message(ctx));
    a = mlc_safetensors_get(st, "h");
    b = mlc_safetensors_get(st, "b");
    CHECK(a && b && a->ndim == 2 && a->shape[1] == 4);
    for (i = 0; i < 8; i++) CHECK_MSG(mlc_host_data(a)[i] == want16[i], "F16 %d: %g", i, (double)mlc_host_data(a)[i]);
    {   /* -0 read from its bits (-ffast-math folds signbit) */
        uint32_t bits;
        memcpy(&bits, &mlc_host_data(a)[5], sizeof bits);
        CHECK(bits == 0x80000000u);
    }
    CHECK_TENSOR(b, want_bf, 0.0);
    CHECK(mlc_item(mlc_safetensors_get(st, "n")) == 5.0f);
    mlc_safetensors_close(st);
    /* a PyTorch BatchNorm's state: F16 weights, BF16 bias, I64 num_batches_tracked */
    n = build(file, "{\"weight\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[0,8]},"
                    "\"bias\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[8,16]},"
                    "\"running_mean\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[16,24]},"
                    "\"running_var\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[16,24]},"
                    "\"num_batches_tracked\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[24,32]}}", data, 32);
    bn = mlc_nn_batch_norm(ctx, 4);
    /* running_var shares running_mean's bytes: an overlap, which is refused */
    CHECK(mlc_module_load_from_memory(bn, file, n, NULL) == MLC_ERR_IO);
    CHECK(contains(mlc_error_message(ctx), "overlaps"));
    mlc_clear_error(ctx);
    n = build(file, "{\"weight\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[0,8]},"
                    "\"bias\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[16,24]},"
                    "\"running_mean\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[8,16]},"
                    "\"running_var\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]},"
                    "\"num_batches_tracked\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[24,32]}}", data, 32);
    CHECK(mlc_module_load_from_memory(bn, file, n, NULL) == MLC_ERR_SHAPE);   /* strict: running_var is [0] */
    CHECK(contains(mlc_error_message(ctx), "running_var"));
    mlc_clear_error(ctx);
    {
        mlc_load_report report;
        mlc_load_opts opts = { 1, &report };
        const float w[4] = { 1, -2, 0.5f, 65504 };
        CHECK_MSG(mlc_module_load_from_memory(bn, file, n, &opts) == MLC_OK, "%s", mlc_error_message(ctx));
        CHECK(report.loaded == 4 && report.mismatched == 1 && report.missing == 0 && report.unexpected == 0);
        CHECK(contains(report.names, "shape running_var [0] in the file, [4] here"));
        CHECK_TENSOR(bn->params[0], w, 0.0);
        CHECK_TENSOR(bn->params[1], want_bf, 0.0);
        CHECK(mlc_host_data(bn->buffers[2])[0] == 5.0f);
        CHECK(mlc_host_data(bn->buffers[1])[0] == 1.0f);           /* skipped: as it was */
    }
    test_destroy(ctx);
    return 1;
}

static int strict_and_partial(void) {
    mlc_ctx *ctx = test_ctx(4);
    mlc_module *small = mlc_nn_sequential(ctx, mlc_nn_linear(ctx, 4, 8), mlc_nn_relu(ctx), mlc_nn_linear(ctx, 8, 3), NULL);
    mlc_module *other = mlc_nn_sequential(ctx, mlc_nn_linear(ctx, 4, 8), mlc_nn_relu(ctx), mlc_nn_linear(ctx, 8, 5),
                                          mlc_nn_linear(ctx, 5, 2), NULL);
    mlc_module *fresh = mlc_nn_sequential(ctx, mlc_nn_linear(ctx, 4, 8), mlc_nn_relu(ctx), mlc_nn_linear(ctx, 8, 5),
                                          mlc_nn_linear(ctx, 5, 2), NULL);
    mlc_load_report report;
    mlc_load_opts partial = { 1, &report }, strict = { 0, &report };
    unsigned char *buf;
    size_t size = mlc_module_encode(small, NULL, NULL, 0);
    float before[8];
    CHECK(size && (buf = (unsigned char *)malloc(size)) && mlc_module_encode(small, NULL, buf, size) == size);
    memcpy(before, mlc_host_data(other->children[0]->params[1]), sizeof before);
    /* strict: 2.weight's shape differs, 3.* are missing; nothing changes */
    CHECK(mlc_module_load_from_memory(other, buf, size, &strict) == MLC_ERR_SHAPE);
    CHECK(contains(mlc_error_message(ctx), "nothing loaded"));
    CHECK(contains(mlc_error_message(ctx), "missing 3.weight"));
    CHECK(contains(mlc_error_message(ctx), "shape 2.weight [3, 8] in the file, [5, 8] here"));
    CHECK(report.missing == 2 && report.mismatched == 2 && report.unexpected == 0 && report.loaded == 0);
    CHECK_TENSOR(other->children[0]->params[1], before, 0.0);
    mlc_clear_error(ctx);
    /* partial: the first layer loads (fine-tuning a new head) */
    CHECK(mlc_module_load_from_memory(other, buf, size, &partial) == MLC_OK);
    CHECK(report.loaded == 2 && report.missing == 2 && report.mismatched == 2);
    CHECK_TENSOR(other->children[0]->params[0], mlc_host_data(small->children[0]->params[0]), 0.0);
    free(buf);
    /* the other way round: the file has tensors the module lacks */
    size = mlc_module_encode(other, NULL, NULL, 0);
    CHECK(size && (buf = (unsigned char *)malloc(size)) && mlc_module_encode(other, NULL, buf, size) == size);
    CHECK(mlc_module_load_from_memory(small, buf, size, NULL) == MLC_ERR_SHAPE);
    CHECK(contains(mlc_error_message(ctx), "unexpected 3.bias"));
    mlc_clear_error(ctx);
    CHECK(mlc_module_load_from_memory(fresh, buf, size, &strict) == MLC_OK && report.loaded == 6);
    CHECK(same_state(fresh, other));
    free(buf);
    test_destroy(ctx);
    return 1;
}

/* Corrupt files: each gives MLC_ERR_IO, names the file, the tensor (where one is known) and a
   byte offset, and changes nothing. */
typedef struct corrupt_case { const char *what, *json; size_t data_bytes; const char *tensor, *message; } corrupt_case;

#define E(name, rest) "\"" name "\":{" rest "}"
#define F32(shape, a, b) "\"dtype\":\"F32\",\"shape\":" shape ",\"data_offsets\":[" a "," b "]"
static const corrupt_case corrupt_cases[] = {
    { "not an object", "[]", 0, NULL, "expected '{'" },
    { "unterminated", "{" E("w", F32("[1]", "0", "4")), 4, NULL, "expected ',' or '}'" },
    { "trailing bytes", "{" E("w", F32("[1]", "0", "4")) "}x", 4, NULL, "after the header's JSON" },
    { "unknown dtype", "{" E("w", "\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]") "}", 4, "w", "unknown dtype" },
    { "missing offsets", "{" E("w", "\"dtype\":\"F32\",\"shape\":[1]") "}", 4, "w", "no data_offsets" },
    { "key twice", "{" E("w", F32("[1]", "0", "4") ",\"shape\":[1]") "}", 4, "w", "given twice" },
    { "negative dim", "{" E("w", F32("[-1]", "0", "4")) "}", 4, "w", "negative" },
    { "fractional dim", "{" E("w", F32("[1.5]", "0", "4")) "}", 4, "w", "expected an integer" },
    { "leading zero", "{" E("w", F32("[01]", "0", "4")) "}", 4, "w", "leading zero" },
    { "huge number", "{" E("w", F32("[1]", "0", "99999999999999999999999")) "}", 4, "w", "above 2^64" },
    { "huge dim", "{" E("w", F32("[4294967296]", "0", "4")) "}", 4, "w", "above 2^31" },
    { "rank 7", "{" E("w", F32("[1,1,1,1,1,1,1]", "0", "4")) "}", 4, "w", "more than 6" },
    { "count overflow", "{" E("w", F32("[2147483647,2147483647,2147483647,2147483647,8]", "0", "4")) "}", 4, "w",
      "overflows" },
    { "bytes overflow", "{" E("w", F32("[2147483647,2147483647,2147483647,2]", "0", "4")) "}", 4, "w", "overflows" },
    { "begin after end", "{" E("w", F32("[1]", "4", "0")) "}", 4, "w", "begins after it ends" },
    { "wrong size", "{" E("w", F32("[2]", "0", "4")) "}", 4, "w", "needs 8" },
    { "past the end", "{" E("w", F32("[2]", "0", "8")) "}", 4, "w", "run past" },
    { "three offsets", "{" E("w", "\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]") "}", 4, "w", "two numbers" },
    { "overlap", "{" E("a", F32("[2]", "0", "8")) "," E("b", F32("[1]", "4", "8")) "}", 8, "b", "overlaps tensor \"a\"" },
    { "gap", "{" E("a", F32("[1]", "0", "4")) "," E("b", F32("[1]", "8", "12")) "}", 12, "b", "gap of 4 bytes" },
    { "trailing data", "{" E("a", F32("[1]", "0", "4")) "}", 12, NULL, "8 bytes after the last tensor" },
    { "duplicate", "{" E("a", F32("[1]", "0", "4")) "," E("a", F32("[1]", "4", "8")) "}", 8, "a", "appears twice" },
    { "metadata twice", "{\"__metadata__\":{},\"__metadata__\":{}}", 0, NULL, "__metadata__ given twice" },
    { "metadata not string", "{\"__metadata__\":{\"k\":1}}", 0, NULL, "not a string" },
    { "bad escape", "{\"a\\q\":{}}", 0, NULL, "unknown escape" },
    { "lone low surrogate", "{\"a\\udc00\":{}}", 0, NULL, "low surrogate" },
    { "lone high surrogate", "{\"a\\ud800x\":{}}", 0, NULL, "high surrogate" },
    { "high then non-low", "{\"a\\ud800\\u0041\":{}}", 0, NULL, "high surrogate" },
    { "NUL escape", "{\"a\\u0000\":{}}", 0, NULL, "\\u0000" },
    { "short hex", "{\"a\\u12\":{}}", 0, NULL, "four hex digits" },
    { "raw control", "{\"a\tb\":{}}", 0, NULL, "control character" },
    { "non-UTF-8 name", "{\"a\xff\":{}}", 0, NULL, "not valid UTF-8" },
    { "overlong UTF-8", "{\"a\xc0\x80\":{}}", 0, NULL, "not valid UTF-8" },
    { "UTF-8 surrogate", "{\"a\xed\xa0\x80\":{}}", 0, NULL, "not valid UTF-8" },
    { "truncated UTF-8", "{\"a\xe2\x82", 0, NULL, "not valid UTF-8" },
    { "deep JSON", "{" E("w", F32("[1]", "0", "4") ",\"x\":"
      "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]"
      "]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]") "}", 4, "w", "64 deep" },
    { "bad literal", "{" E("w", F32("[1]", "0", "4") ",\"x\":tru") "}", 4, "w", "expected a value" },
    { "bad number", "{" E("w", F32("[1]", "0", "4") ",\"x\":1.e5") "}", 4, "w", "digits after" },
    { "no colon", "{\"w\" 1}", 0, NULL, "expected ':'" },
    { "empty", "", 0, NULL, "expected '{'" },
};
#undef E
#undef F32

static int corrupt_files(void) {
    mlc_ctx *ctx = test_ctx(5);
    mlc_module *lin = mlc_nn_linear(ctx, 1, 1);
    static unsigned char file[4096], zeros[64];
    size_t c, n;
    float w = mlc_host_data(lin->params[0])[0];
    for (c = 0; c < sizeof corrupt_cases / sizeof corrupt_cases[0]; c++) {
        const corrupt_case *k = &corrupt_cases[c];
        const char *msg;
        n = build(file, k->json, zeros, k->data_bytes);
        CHECK_MSG(mlc_safetensors_from_memory(ctx, file, n, "bad.safetensors") == NULL, "%s: accepted", k->what);
        msg = mlc_error_message(ctx);
        CHECK_MSG(mlc_error(ctx) == MLC_ERR_IO, "%s: code %d: %s", k->what, (int)mlc_error(ctx), msg);
        CHECK_MSG(contains(msg, "bad.safetensors") && contains(msg, "(byte "), "%s: %s", k->what, msg);
        CHECK_MSG(contains(msg, k->message), "%s: message \"%s\" lacks \"%s\"", k->what, msg, k->message);
        if (k->tensor) {
            char quoted[32];
            snprintf(quoted, sizeof quoted, "tensor \"%s\"", k->tensor);
            CHECK_MSG(contains(msg, quoted), "%s: message \"%s\" does not name %s", k->what, msg, quoted);
        }
        mlc_clear_error(ctx);
        CHECK(mlc_module_load_from_memory(lin, file, n, NULL) == MLC_ERR_IO);   /* and through the module loader */
        mlc_clear_error(ctx);
    }
    /* the header length: short files, too long, past the end */
    CHECK(mlc_safetensors_from_memory(ctx, file, 5, "short") == NULL && mlc_error(ctx) == MLC_ERR_IO);
    CHECK(contains(mlc_error_message(ctx), "too short"));
    mlc_clear_error(ctx);
    memset(file, 0, 16);
    file[7] = 0x80;                                             /* 2^63 */
    CHECK(mlc_safetensors_from_memory(ctx, file, 16, "huge") == NULL && contains(mlc_error_message(ctx), "100 MiB"));
    mlc_clear_error(ctx);
    n = build(file, "{}", NULL, 0);
    CHECK(mlc_safetensors_from_memory(ctx, file, n - 1, "cut") == NULL && contains(mlc_error_message(ctx), "truncated"));
    CHECK(contains(mlc_error_message(ctx), "(byte 0)"));
    mlc_clear_error(ctx);
    /* an F8 tensor is a valid file but cannot become float32 */
    n = build(file, "{\"weight\":{\"dtype\":\"F8_E4M3\",\"shape\":[1,1],\"data_offsets\":[0,1]},"
                    "\"bias\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[1,5]}}", zeros, 5);
    CHECK(mlc_module_load_from_memory(lin, file, n, NULL) == MLC_ERR_IO);
    CHECK(contains(mlc_error_message(ctx), "F8_E4M3 cannot be loaded"));
    mlc_clear_error(ctx);
    CHECK(mlc_host_data(lin->params[0])[0] == w);               /* untouched through all of it */
    test_destroy(ctx);
    return 1;
}

static int names_and_escapes(void) {
    mlc_ctx *ctx = test_ctx(6);
    mlc_tensor *a = mlc_keep(mlc_full(ctx, MLC_SHAPE(2), 1.5f)), *b = mlc_keep(mlc_full(ctx, MLC_SHAPE(1), -3.0f));
    mlc_named_tensor list[2];
    unsigned char buf[1024];
    mlc_safetensors *st;
    size_t n;
    float zero = 0;
    snprintf(list[0].name, sizeof list[0].name, "quote\"back\\slash\nnew é 😀");
    snprintf(list[1].name, sizeof list[1].name, "plain");
    list[0].tensor = a; list[1].tensor = b;
    n = mlc_safetensors_encode(ctx, list, 2, NULL, buf, sizeof buf);
    CHECK(n > 0 && n < sizeof buf);
    st = mlc_safetensors_from_memory(ctx, buf, n, NULL);
    CHECK_MSG(st != NULL, "%s", mlc_error_message(ctx));
    CHECK(strcmp(mlc_safetensors_name(st, 0), list[0].name) == 0);
    CHECK(mlc_item(mlc_safetensors_get(st, "plain")) == -3.0f);
    mlc_safetensors_close(st);
    /* \u escapes and a surrogate pair decode to UTF-8 */
    n = build(buf, "{\"caf\\u00e9 \\ud83d\\ude00\\/\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]},"
                   "\"__metadata__\":{\"k\\n\":\"v\\t\"}}", &zero, 4);
    st = mlc_safetensors_from_memory(ctx, buf, n, NULL);
    CHECK_MSG(st != NULL, "%s", mlc_error_message(ctx));
    CHECK(strcmp(mlc_safetensors_name(st, 0), "café 😀/") == 0);
    CHECK(strcmp(mlc_safetensors_metadata(st, "k\n"), "v\t") == 0);
    mlc_safetensors_close(st);
    /* the writer refuses what it cannot write */
    snprintf(list[1].name, sizeof list[1].name, "%s", list[0].name);
    CHECK(mlc_safetensors_encode(ctx, list, 2, NULL, buf, sizeof buf) == 0 && mlc_error(ctx) == MLC_ERR_ARG);
    mlc_clear_error(ctx);
    snprintf(list[1].name, sizeof list[1].name, "bad \xff");
    CHECK(mlc_safetensors_encode(ctx, list, 2, NULL, buf, sizeof buf) == 0 && mlc_error(ctx) == MLC_ERR_ARG);
    mlc_clear_error(ctx);
    test_destroy(ctx);
    return 1;
}

/* ---- Checkpoints -------------------------------------------------------------------------- */

typedef enum { ADAM, SGD_NESTEROV, RMSPROP_CENTERED, ADAMW_AMSGRAD } optim_kind;

static mlc_optim *make_optim(mlc_ctx *ctx, mlc_module *net, optim_kind kind) {
    if (kind == ADAM) return mlc_adam(ctx, net, (mlc_adam_opts){ .lr = 1e-2f, .weight_decay = 1e-3f });
    if (kind == ADAMW_AMSGRAD)   /* beta2 0.5: v falls below its largest, so the max matters */
        return mlc_adamw(ctx, net, (mlc_adam_opts){ .lr = 1e-2f, .beta2 = 0.5f, .amsgrad = 1 });
    if (kind == SGD_NESTEROV) return mlc_sgd(ctx, net, (mlc_sgd_opts){ .lr = 0.05f, .momentum = 0.9f, .nesterov = 1 });
    return mlc_rmsprop(ctx, net, (mlc_rmsprop_opts){ .lr = 1e-2f, .momentum = 0.5f, .centered = 1 });
}

/* Steps [from, to) of a run: fresh data from the context's RNG each step, dropout, batch norm,
   a cosine schedule read from the step counter. */
static int run_steps(mlc_module *net, mlc_optim *opt, mlc_train_state *state, int to, int total, float *losses) {
    mlc_ctx *ctx = net->ctx;
    for (; state->step < to; state->step++) {
        mlc_frame f = mlc_frame_begin(ctx);
        mlc_tensor *x = mlc_randn(ctx, MLC_SHAPE(8, 4)), *y = mlc_randn(ctx, MLC_SHAPE(8, 3)), *loss;
        mlc_optim_set_lr(opt, mlc_lr_cosine(0.02f, (int)state->step, 2, total, 1e-3f));
        loss = mlc_mse_loss(mlc_forward(net, x), y, MLC_REDUCE_MEAN);
        mlc_zero_grad(opt);
        mlc_backward(loss);
        mlc_step(opt);
        losses[state->step] = mlc_item(loss);
        mlc_frame_end(f);
        if (state->step % 3 == 2) state->epoch++;
    }
    CHECK_MSG(mlc_error(ctx) == MLC_OK, "%s", mlc_error_message(ctx));
    return 1;
}

static int resume_case(optim_kind kind, const char *dir) {
    enum { N = 9, K = 4 };
    float straight[N], resumed[N];
    char path[340];
    mlc_train_state state = { .step = 0 }, loaded = { .step = 0 };
    mlc_ctx *ctx = test_ctx(7);
    mlc_module *net = small_model(ctx);
    mlc_optim *opt = make_optim(ctx, net, kind);
    int s;
    snprintf(path, sizeof path, "%s/run%d.ckpt", dir, (int)kind);
    CHECK(run_steps(net, opt, &state, N, N, straight));
    test_destroy(ctx);
    /* the same run, stopped after K steps and saved ... */
    ctx = test_ctx(7);
    net = small_model(ctx);
    opt = make_optim(ctx, net, kind);
    state.step = state.epoch = 0;
    CHECK(run_steps(net, opt, &state, K, N, resumed));
    CHECK_MSG(mlc_checkpoint_save(path, net, opt, &state) == MLC_OK, "%s", mlc_error_message(ctx));
    test_destroy(ctx);
    /* ... resumed by a fresh process: another seed, so nothing matches until the load */
    ctx = test_ctx(12345);
    net = small_model(ctx);
    opt = make_optim(ctx, net, kind);
    CHECK_MSG(mlc_checkpoint_load(path, net, opt, &loaded) == MLC_OK, "%s", mlc_error_message(ctx));
    CHECK(loaded.step == K && loaded.epoch == state.epoch);
    CHECK(run_steps(net, opt, &loaded, N, N, resumed));
    for (s = 0; s < N; s++)
        CHECK_MSG(straight[s] == resumed[s], "optimiser %d, step %d: %.9g straight, %.9g resumed", (int)kind, s,
                  (double)straight[s], (double)resumed[s]);
    test_destroy(ctx);
    remove(path);
    return 1;
}

static int resume_matches_bit_for_bit(void) {
    char dir[300];
    CHECK(temp_dir(dir, sizeof dir));
    if (!resume_case(ADAM, dir)) return 0;
    if (!resume_case(SGD_NESTEROV, dir)) return 0;
    if (!resume_case(RMSPROP_CENTERED, dir)) return 0;
    if (!resume_case(ADAMW_AMSGRAD, dir)) return 0;
    rmdir(dir);
    return 1;
}

static int checkpoint_mismatches(void) {
    mlc_ctx *ctx = test_ctx(8);
    mlc_module *net = small_model(ctx), *bigger;
    mlc_optim *adam = make_optim(ctx, net, ADAM), *sgd;
    mlc_train_state state = { .step = 3, .epoch = 1 };
    size_t size = mlc_checkpoint_encode(net, adam, &state, NULL, 0);
    unsigned char *buf = (unsigned char *)malloc(size), *plain;
    mlc_safetensors *st;
    CHECK(size && buf && mlc_checkpoint_encode(net, adam, &state, buf, size) == size);
    st = mlc_safetensors_from_memory(ctx, buf, size, NULL);
    CHECK(st && mlc_safetensors_get(st, "__mlc__.optim.0.exp_avg") && mlc_safetensors_get(st, "__mlc__.optim.7.exp_avg_sq"));
    CHECK(strcmp(mlc_safetensors_metadata(st, "mlc.optim"), "adam") == 0);
    mlc_safetensors_close(st);
    /* weights from a checkpoint load as a model (reserved names are not "unexpected") */
    CHECK(mlc_module_load_from_memory(net, buf, size, NULL) == MLC_OK);
    sgd = make_optim(ctx, net, SGD_NESTEROV);
    CHECK(mlc_checkpoint_load_from_memory(buf, size, net, sgd, NULL) == MLC_ERR_IO);
    CHECK(contains(mlc_error_message(ctx), "holds optimiser \"adam\", not sgd"));
    mlc_clear_error(ctx);
    {   /* AMSGrad's max_exp_avg_sq (PyTorch's name) is saved, and a plain Adam's checkpoint lacks it */
        mlc_optim *ams = mlc_adam(ctx, net, (mlc_adam_opts){ .amsgrad = 1 });
        size_t n = mlc_checkpoint_encode(net, ams, &state, NULL, 0);
        unsigned char *b = (unsigned char *)malloc(n);
        CHECK(n && b && mlc_checkpoint_encode(net, ams, &state, b, n) == n);
        st = mlc_safetensors_from_memory(ctx, b, n, NULL);
        CHECK(st && mlc_safetensors_get(st, "__mlc__.optim.7.max_exp_avg_sq"));
        mlc_safetensors_close(st);
        CHECK(mlc_checkpoint_load_from_memory(b, n, net, adam, NULL) == MLC_ERR_IO);
        CHECK(contains(mlc_error_message(ctx), "optimiser entries"));
        mlc_clear_error(ctx);
        CHECK(mlc_checkpoint_load_from_memory(buf, size, net, ams, NULL) == MLC_ERR_IO);
        CHECK(contains(mlc_error_message(ctx), "max_exp_avg_sq"));
        mlc_clear_error(ctx);
        free(b);
    }
    bigger = mlc_nn_sequential(ctx, mlc_nn_linear(ctx, 4, 8), NULL);
    CHECK(mlc_checkpoint_load_from_memory(buf, size, bigger, NULL, NULL) == MLC_ERR_ARG);   /* unexpected tensors */
    mlc_clear_error(ctx);
    adam = mlc_adam(ctx, bigger, (mlc_adam_opts){ .lr = 0 });
    CHECK(mlc_checkpoint_load_from_memory(buf, size, bigger, adam, NULL) == MLC_ERR_IO);     /* another model's */
    CHECK_MSG(contains(mlc_error_message(ctx), "optimiser's parameter 2 is (none) here but 1.weight[8]"), "%s",
              mlc_error_message(ctx));
    mlc_clear_error(ctx);
    size = mlc_module_encode(net, NULL, NULL, 0);
    plain = (unsigned char *)malloc(size);
    CHECK(plain && mlc_module_encode(net, NULL, plain, size) == size);
    CHECK(mlc_checkpoint_load_from_memory(plain, size, net, NULL, NULL) == MLC_ERR_IO);
    CHECK(contains(mlc_error_message(ctx), "not an mlc checkpoint"));
    mlc_clear_error(ctx);
    free(plain);
    free(buf);
    test_destroy(ctx);
    return 1;
}

/* A save that fails part-way (the disk is full, or the file-size limit is reached) returns an
   error, removes its temporary file and leaves the previous checkpoint loadable. (Windows has
   neither /dev/full nor a file-size limit: there 1 and 2 are left out, and 3, a save over an
   existing file, and 4, a replace that fails, check MoveFileEx.) */
/* One writer's file: a [32, 32] tensor "w" of value k (file k), saved by a context of its own */
static int save_constant(const char *path, float k) {
    mlc_ctx *ctx = mlc_create(&(mlc_config){ .quiet = 1, .device = "cpu" });
    mlc_named_tensor named[1] = { { "w", NULL } };
    mlc_result r;
    if (!ctx) return 0;
    named[0].tensor = mlc_full(ctx, MLC_SHAPE(32, 32), k);
    r = mlc_safetensors_save(ctx, path, named, 1, NULL);
    if (r != MLC_OK) fprintf(stderr, "  saving %s: %s\n", path, mlc_error_message(ctx));
    mlc_destroy(ctx);
    return r == MLC_OK;
}

/* Saves that race: 3 processes save one path 25 times each (their own values) while this one
   loads it in a loop. Every load is one writer's whole file (the checksums pass, every value
   is that writer's), and no temporary is left. (Windows: the writers take turns in this
   process, which checks only that each save has a temporary of its own.) */
static int racing_saves_leave_whole_files(void) {
    char dir[300], path[340];
    mlc_ctx *ctx;
    int loads = 0, bad = 0, w, i;
    CHECK(temp_dir(dir, sizeof dir));
    snprintf(path, sizeof path, "%s/race.safetensors", dir);
    CHECK(save_constant(path, 0.0f));
#ifndef _WIN32
    {
        pid_t writers[3];
        int running = 3, status;
        for (w = 0; w < 3; w++) {                        /* (before this process's context: the */
            CHECK((writers[w] = fork()) >= 0);           /* writers inherit none to leak) */
            if (writers[w] == 0) {
                for (i = 0; i < 25; i++) if (!save_constant(path, (float)(w + 1))) _exit(1);
                _exit(0);
            }
        }
        CHECK((ctx = mlc_create(&(mlc_config){ .quiet = 1, .device = "cpu" })) != NULL);
        while (running) {
            mlc_frame f = mlc_frame_begin(ctx);              /* each load's tensor goes with it */
            mlc_safetensors *st = mlc_safetensors_open(ctx, path);
            mlc_tensor *t = st ? mlc_safetensors_get(st, "w") : NULL;
            loads++;
            if (!t) { bad++; printf("  load %d: %s\n", loads, mlc_error_message(ctx)); mlc_clear_error(ctx); }
            else for (i = 1; i < 32 * 32; i++) if (mlc_get(t, (size_t)i) != mlc_get(t, 0)) { bad++; break; }
            if (st) mlc_safetensors_close(st);
            mlc_frame_end(f);
            for (w = 0; w < 3; w++)
                if (writers[w] > 0 && waitpid(writers[w], &status, WNOHANG) == writers[w]) {
                    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "writer %d: status %#x", w, status);
                    writers[w] = 0;
                    running--;
                }
        }
    }
#else
    CHECK((ctx = mlc_create(&(mlc_config){ .quiet = 1, .device = "cpu" })) != NULL);
    for (i = 0; i < 25; i++)
        for (w = 0; w < 3; w++) CHECK(save_constant(path, (float)(w + 1)));
    loads = 1;
#endif
    CHECK_MSG(bad == 0, "%d of %d loads were not one whole file", bad, loads);
    CHECK(loads > 0 && temps_left(dir, "race.safetensors") == 0);
    remove(path);
    rmdir(dir);
    mlc_destroy(ctx);
    return 1;
}

/* A flipped bit in a tensor's bytes fails its checksum when the file opens, naming the tensor
   and the byte; a file without checksums (other writers') loads as before. */
static int flipped_bit_fails_its_checksum(void) {
    mlc_ctx *ctx = test_ctx(31);
    mlc_module *a = small_model(ctx);
    mlc_named_tensor state[16];
    int n = mlc_module_state(a, state, 16);
    size_t size = mlc_safetensors_encode(ctx, state, n, NULL, NULL, 0), header;
    unsigned char *file = (unsigned char *)malloc(size);
    mlc_safetensors *st;
    CHECK(n > 0 && size > 0 && file && mlc_safetensors_encode(ctx, state, n, NULL, file, size) == size);
    CHECK((st = mlc_safetensors_from_memory(ctx, file, size, "good")) != NULL);
    CHECK(mlc_safetensors_metadata(st, "mlc.crc32:0.weight") != NULL);
    mlc_safetensors_close(st);
    file[size - 3] ^= 0x10;                              /* a bit of the last tensor's last value */
    CHECK(mlc_safetensors_from_memory(ctx, file, size, "flipped") == NULL && mlc_error(ctx) == MLC_ERR_IO);
    CHECK_MSG(contains(mlc_error_message(ctx), "CRC-32") && contains(mlc_error_message(ctx), "corrupt"), "%s",
              mlc_error_message(ctx));
    mlc_clear_error(ctx);
    header = (size_t)file[0] | (size_t)file[1] << 8;     /* the header: its checksum keys renamed */
    for (n = 8; (size_t)n + 10 < 8 + header; n++)
        if (memcmp(file + n, "mlc.crc32:", 10) == 0) file[n] = 'x';
    CHECK((st = mlc_safetensors_from_memory(ctx, file, size, "unchecked")) != NULL);   /* no checksums */
    mlc_safetensors_close(st);
    free(file);
    test_destroy(ctx);
    return 1;
}

static int failed_save_keeps_previous(void) {
    mlc_ctx *ctx = test_ctx(9);
    mlc_module *net = mlc_nn_sequential(ctx, mlc_nn_linear(ctx, 4, 64), mlc_nn_batch_norm(ctx, 64),
                                        mlc_nn_linear(ctx, 64, 3), NULL), *back;
    mlc_optim *opt = make_optim(ctx, net, ADAM);
    mlc_train_state state = { .step = 1 }, loaded;
    char dir[300], path[340], tmp[350];
#ifndef _WIN32
    struct rlimit old, small;
    void (*old_handler)(int);
#endif
    const float one = 1.0f;
    FILE *f;
    mlc_result r;
    CHECK(temp_dir(dir, sizeof dir));
    snprintf(path, sizeof path, "%s/model.ckpt", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if (!train_steps(net, opt, 1)) return 0;
    CHECK(mlc_checkpoint_save(path, net, opt, &state) == MLC_OK);
    back = mlc_nn_sequential(ctx, mlc_nn_linear(ctx, 4, 64), mlc_nn_batch_norm(ctx, 64), mlc_nn_linear(ctx, 64, 3), NULL);
    CHECK(mlc_checkpoint_load(path, back, NULL, NULL) == MLC_OK && same_state(net, back));
    if (!train_steps(net, opt, 1)) return 0;                            /* what a second save would hold */
    state.step = 2;
#ifndef _WIN32
    /* 1: a link where the old temporary name was (PATH.tmp -> an unrelated file) is not written
       through: the save makes a file of its own */
    {
        char victim[360];
        snprintf(victim, sizeof victim, "%s/victim", dir);
        CHECK((f = fopen(victim, "wb")) != NULL && fwrite(&one, 4, 1, f) == 1 && fclose(f) == 0);
        CHECK(symlink(victim, tmp) == 0);
        CHECK(mlc_checkpoint_save(path, net, opt, &state) == MLC_OK);
        CHECK((f = fopen(victim, "rb")) != NULL && fseek(f, 0, SEEK_END) == 0 && ftell(f) == 4 && fclose(f) == 0);
        CHECK(mlc_checkpoint_load(path, back, NULL, &loaded) == MLC_OK && loaded.step == 2);
        CHECK(remove(tmp) == 0 && remove(victim) == 0 && temps_left(dir, "model.ckpt") == 0);
        state.step = 3;
    }
    /* 2: the file-size limit stops the write after 4 KiB (the checkpoint is ~10 KiB) */
    CHECK(getrlimit(RLIMIT_FSIZE, &old) == 0);
    small = old;
    small.rlim_cur = 4096;
    old_handler = signal(SIGXFSZ, SIG_IGN);
    CHECK(setrlimit(RLIMIT_FSIZE, &small) == 0);
    r = mlc_checkpoint_save(path, net, opt, &state);
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, old_handler);
    CHECK_MSG(r == MLC_ERR_IO && contains(mlc_error_message(ctx), "is as it was"),
              "saving past the file-size limit gave %d", (int)r);
    mlc_clear_error(ctx);
    CHECK(temps_left(dir, "model.ckpt") == 0);              /* the temporary is gone */
    loaded.step = 0;
    CHECK(mlc_checkpoint_load(path, back, NULL, &loaded) == MLC_OK && loaded.step == 2);
#endif
    /* 3: a file at the old temporary name (a crashed save of an older version) is left alone */
    CHECK((f = fopen(tmp, "wb")) != NULL && fwrite(&one, 4, 1, f) == 1 && fclose(f) == 0);
    state.step = 2;
    CHECK(mlc_checkpoint_save(path, net, opt, &state) == MLC_OK);
    CHECK(mlc_checkpoint_load(path, back, NULL, &loaded) == MLC_OK && loaded.step == 2 && same_state(net, back));
    CHECK(remove(tmp) == 0 && temps_left(dir, "model.ckpt") == 0);
    remove(path);
    /* 4: the replace itself fails (the target is a directory): an error, no temporary left */
    CHECK(make_dir(path));
    r = mlc_checkpoint_save(path, net, opt, &state);
    CHECK_MSG(r == MLC_ERR_IO && contains(mlc_error_message(ctx), "is as it was"), "%d: %s", (int)r,
              mlc_error_message(ctx));
    mlc_clear_error(ctx);
    CHECK(temps_left(dir, "model.ckpt") == 0);
    rmdir(path);
    rmdir(dir);
    test_destroy(ctx);
    return 1;
}

const test_case tests_safetensors[] = {
    TEST(round_trip_memory)
    TEST(round_trip_file)
    TEST(half_and_bfloat16)
    TEST(strict_and_partial)
    TEST(corrupt_files)
    TEST(names_and_escapes)
    TEST(resume_matches_bit_for_bit)
    TEST(checkpoint_mismatches)
    TEST(failed_save_keeps_previous)
    TEST(racing_saves_leave_whole_files)
    TEST(flipped_bit_fails_its_checksum)
    { NULL, NULL }
};
