/* Hostile input, second round (issue 28): checkpoints are not trusted (every scalar checked, the
   optimiser's parameters matched by name and shape, names never cut short), tensors others hold
   cannot be freed (nor one freed twice), module fields changed after creation are checked at
   forward time, and each error names its cause (a directory is an I/O error, a tensor of another
   context says so before any shape). */
#include <stdint.h>
#include <stdlib.h>
#include "test.h"

/* The context must hold `code` and a message containing `want`; the error is then cleared. */
#define CHECK_CODE(ctx, code, want) do { \
    CHECK_MSG(mlc_error(ctx) == (code), "line %d: error %d (%s), expected %d", __LINE__, \
              (int)mlc_error(ctx), mlc_error_message(ctx), (int)(code)); \
    CHECK_MSG(strstr(mlc_error_message(ctx), (want)) != NULL, "message \"%s\" lacks \"%s\"", \
              mlc_error_message(ctx), (want)); \
    mlc_clear_error(ctx); \
} while (0)

/* Where an entry's bytes are in an encoded safetensors file (its data_offsets after the header). */
static unsigned char *entry_bytes(unsigned char *file, const char *name) {
    uint64_t header = 0;
    char key[96], *h, *at;
    int i;
    for (i = 0; i < 8; i++) header |= (uint64_t)file[i] << (8 * i);
    h = (char *)file + 8;
    snprintf(key, sizeof key, "\"%s\"", name);
    at = strstr(h, key);
    if (!at || (size_t)(at - h) > header || !(at = strstr(at, "data_offsets"))) return NULL;
    at += strlen("data_offsets\":[");
    return file + 8 + header + strtoull(at, NULL, 10);
}

static void put_le(unsigned char *p, uint64_t v, int bytes) {
    int i;
    for (i = 0; i < bytes; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* Class 5: a NaN, infinite or negative learning rate, negative step counts and an even (all-zero)
   random generator increment are refused on load, naming the entry, and nothing changes. */
static int checkpoint_scalars_checked(void) {
    mlc_ctx *ctx = test_ctx(5);
    mlc_module *m = mlc_nn_linear(ctx, 2, 2);
    mlc_optim *opt = mlc_adam(ctx, m, (mlc_adam_opts){ 0 });
    mlc_train_state state = { 7, 1 }, back = { 0, 0 };
    size_t n = mlc_checkpoint_encode(m, opt, &state, NULL, 0);
    unsigned char *good = (unsigned char *)malloc(n), *bad = (unsigned char *)malloc(n);
    const float lrs[] = { NAN, INFINITY, -1.0f };
    uint32_t bits;
    int i;
    CHECK(n > 0 && good && bad && mlc_checkpoint_encode(m, opt, &state, good, n) == n);
    CHECK(mlc_checkpoint_load_from_memory(good, n, m, opt, &back) == MLC_OK && back.step == 7);
    for (i = 0; i < 4 + 3; i++) {
        memcpy(bad, good, n);
        if (i < 3) { memcpy(&bits, &lrs[i], 4); put_le(entry_bytes(bad, "__mlc__.optim.lr"), bits, 4); }
        else if (i == 3) put_le(entry_bytes(bad, "__mlc__.optim.t"), (uint64_t)-1, 8);
        else if (i == 4) put_le(entry_bytes(bad, "__mlc__.train"), (uint64_t)-5, 8);
        else if (i == 5) put_le(entry_bytes(bad, "__mlc__.train") + 8, (uint64_t)-1, 8);
        else {
            put_le(entry_bytes(bad, "__mlc__.rng"), 0, 8);
            put_le(entry_bytes(bad, "__mlc__.rng") + 8, 0, 8);
        }
        back.step = 3;
        CHECK_MSG(mlc_checkpoint_load_from_memory(bad, n, m, opt, &back) == MLC_ERR_IO,
                  "case %d loaded: %s", i, mlc_error_message(ctx));
        CHECK_CODE(ctx, MLC_ERR_IO, i < 3 ? "optim.lr" : i == 3 ? "optim.t" : i < 6 ? "train" : "rng");
        CHECK(back.step == 3 && test_same_float(mlc_optim_lr(opt), 1e-3f));
    }
    free(good); free(bad);
    test_destroy(ctx);
    return 1;
}

/* Class 5: the optimiser's parameters are matched by name and shape: a state saved with the
   parameters in another order (same shapes) is refused naming the first that differs. */
static int checkpoint_optimiser_fingerprint(void) {
    mlc_ctx *ctx = test_ctx(6);
    mlc_module *m = mlc_nn_sequential(ctx, mlc_nn_linear(ctx, 3, 3), mlc_nn_linear(ctx, 3, 3), NULL);
    mlc_optim *a = mlc_adam(ctx, m, (mlc_adam_opts){ 0 }), *b = mlc_adam(ctx, NULL, (mlc_adam_opts){ 0 });
    size_t n;
    unsigned char *buf;
    CHECK(m && a && b);
    CHECK(mlc_optim_add_param(b, m->children[1]->params[0]) == MLC_OK);
    CHECK(mlc_optim_add_param(b, m->children[1]->params[1]) == MLC_OK);
    CHECK(mlc_optim_add_param(b, m->children[0]->params[0]) == MLC_OK);
    CHECK(mlc_optim_add_param(b, m->children[0]->params[1]) == MLC_OK);
    n = mlc_checkpoint_encode(m, a, NULL, NULL, 0);
    CHECK(n > 0 && (buf = (unsigned char *)malloc(n)) != NULL);
    CHECK(mlc_checkpoint_encode(m, a, NULL, buf, n) == n);
    CHECK(mlc_checkpoint_load_from_memory(buf, n, m, a, NULL) == MLC_OK);
    CHECK(mlc_checkpoint_load_from_memory(buf, n, m, b, NULL) != MLC_OK);
    CHECK_CODE(ctx, MLC_ERR_IO, "parameter 0 is 1.weight[3,3] here but 0.weight[3,3]");
    free(buf);
    test_destroy(ctx);
    return 1;
}

static mlc_tensor *identity(mlc_module *self, mlc_tensor *x) { (void)self; return x; }

/* Class 5: names longer than mlc_named_tensor's 127 bytes are refused, never cut short (two
   names differing after byte 127 would match one entry of a file). */
static int long_names_refused(void) {
    mlc_ctx *ctx = test_ctx(7);
    mlc_module *m = mlc_nn_custom(ctx, "Outer", identity, NULL);
    mlc_module *c = mlc_nn_custom(ctx, "Inner", identity, NULL);
    mlc_named_tensor out[4];
    char child[101], pa[41], pb[41];
    memset(child, 'c', 100); child[100] = '\0';
    memset(pa, 'p', 40); pa[40] = '\0';
    memcpy(pb, pa, sizeof pb); pb[39] = 'q';
    CHECK(mlc_module_add_param(c, pa, mlc_parameter(ctx, MLC_SHAPE(2))) == MLC_OK);
    CHECK(mlc_module_add_param(c, pb, mlc_parameter(ctx, MLC_SHAPE(2))) == MLC_OK);
    CHECK(mlc_module_add_child(m, child, c) == MLC_OK);
    CHECK(mlc_module_state(m, NULL, 0) == 2 && mlc_error(ctx) == MLC_OK);    /* counting needs no names */
    mlc_module_state(m, out, 4);
    CHECK_CODE(ctx, MLC_ERR_ARG, "longer than the 127 bytes");
    CHECK(mlc_module_encode(m, NULL, NULL, 0) == 0);
    CHECK_CODE(ctx, MLC_ERR_ARG, "Inner");
    test_destroy(ctx);
    return 1;
}

/* Class 8: a module's parameter, an optimiser's parameter, a tensor freed already: refused with
   MLC_ERR_STATE naming the owner (or the first free), and a freed tensor is not used. */
static int free_what_others_hold(void) {
    mlc_ctx *ctx = test_ctx(8);
    mlc_module *m = mlc_nn_linear(ctx, 2, 3);
    mlc_tensor *p = mlc_parameter(ctx, MLC_SHAPE(2)), *q = mlc_parameter(ctx, MLC_SHAPE(2));
    mlc_optim *opt = mlc_sgd(ctx, NULL, (mlc_sgd_opts){ 0 });
    CHECK(m && p && q && opt && mlc_optim_add_param(opt, p) == MLC_OK);
    mlc_tensor_free(m->params[0]);
    CHECK_CODE(ctx, MLC_ERR_STATE, "\"weight\" is held by Linear");
    mlc_tensor_free(m->params[1]);
    CHECK_CODE(ctx, MLC_ERR_STATE, "\"bias\" is held by Linear");
    mlc_tensor_free(p);
    CHECK_CODE(ctx, MLC_ERR_STATE, "held by an SGD optimiser");
    mlc_tensor_free(q);
    CHECK(mlc_error(ctx) == MLC_OK);
    mlc_tensor_free(q);                                      /* twice: refused, nothing read freed */
    CHECK_CODE(ctx, MLC_ERR_STATE, "freed already");
    CHECK(mlc_add(q, q) == NULL);
    CHECK_CODE(ctx, MLC_ERR_STATE, "freed");
    CHECK(mlc_module_add_param(m, "late", q) != MLC_OK);
    CHECK_CODE(ctx, MLC_ERR_STATE, "freed");
    {                                                        /* the module still trains */
        mlc_frame f = mlc_frame_begin(ctx);
        mlc_tensor *y = mlc_forward(m, mlc_ones(ctx, MLC_SHAPE(1, 2)));
        CHECK(y && mlc_error(ctx) == MLC_OK);
        mlc_frame_end(f);
    }
    test_destroy(ctx);
    return 1;
}

/* Class 3: fields a user can still change are checked when the module runs: MLC_ERR_ARG naming
   the module and field, never a division by zero or a read out of bounds. */
static int module_fields_checked_at_forward(void) {
    mlc_ctx *ctx = test_ctx(9);
    mlc_module *mha = mlc_nn_multihead_attention(ctx, 4, 2), *rnn = mlc_nn_lstm(ctx, 3, 2, 2);
    mlc_module *drop = mlc_nn_dropout(ctx, 0.5f), *pool = mlc_nn_max_pool2d(ctx, 2, 2);
    mlc_module *conv = mlc_nn_conv2d(ctx, 1, 1, 1, (mlc_conv_opts){ 0 }), *bn = mlc_nn_batch_norm(ctx, 1);
    mlc_frame f = mlc_frame_begin(ctx);
    mlc_tensor *x = mlc_ones(ctx, MLC_SHAPE(1, 2, 4)), *seq = mlc_ones(ctx, MLC_SHAPE(1, 2, 3));
    mlc_tensor *img = mlc_ones(ctx, MLC_SHAPE(1, 1, 4, 4));
    CHECK(mha && rnn && drop && pool && conv && bn && x && seq && img);
    CHECK(mlc_forward(mha, x) && mlc_forward(rnn, seq));
    mha->kernel = 0;
    CHECK(mlc_forward(mha, x) == NULL);
    CHECK_CODE(ctx, MLC_ERR_ARG, "num_heads");
    mha->kernel = 3;
    CHECK(mlc_forward(mha, x) == NULL);
    CHECK_CODE(ctx, MLC_ERR_ARG, "num_heads");
    mha->kernel = 2; mha->alpha = 2.0f;
    CHECK(mlc_forward(mha, x) == NULL);
    CHECK_CODE(ctx, MLC_ERR_ARG, "MultiheadAttention");
    mha->alpha = 0.0f;
    rnn->directions = 0;
    CHECK(mlc_forward(rnn, seq) == NULL);
    CHECK_CODE(ctx, MLC_ERR_ARG, "LSTM's cell");
    rnn->directions = 1; rnn->cell = MLC_CELL_GRU;           /* 4H gate rows read as 3H */
    CHECK(mlc_forward(rnn, seq) == NULL);
    CHECK_CODE(ctx, MLC_ERR_ARG, "field cell");
    rnn->cell = 99;
    CHECK(mlc_forward(rnn, seq) == NULL);
    CHECK_CODE(ctx, MLC_ERR_ARG, "cell 99");
    rnn->cell = MLC_CELL_LSTM; rnn->alpha = NAN;
    CHECK(mlc_forward(rnn, seq) == NULL);
    CHECK_CODE(ctx, MLC_ERR_ARG, "dropout");
    rnn->alpha = 0.0f;
    CHECK(mlc_forward(rnn, seq) != NULL);
    drop->alpha = 1.5f;
    CHECK(mlc_forward(drop, x) == NULL);
    CHECK_CODE(ctx, MLC_ERR_ARG, "p");
    pool->kernel = 0;
    CHECK(mlc_forward(pool, img) == NULL);
    CHECK_CODE(ctx, MLC_ERR_ARG, "kernel");
    conv->conv.stride = -1;
    CHECK(mlc_forward(conv, img) == NULL);
    CHECK_CODE(ctx, MLC_ERR_ARG, "stride");
    bn->eps = -1.0f;
    CHECK(mlc_forward(bn, img) == NULL);
    CHECK_CODE(ctx, MLC_ERR_ARG, "eps");
    mlc_frame_end(f);
    test_destroy(ctx);
    return 1;
}

/* Class 11: a directory is an I/O error naming it (not "out of memory"); an optional tensor from
   another context is said to be so, even when its shape is wrong too. */
static int directory_is_io_error(void) {
    mlc_ctx *ctx = test_ctx(10);
    mlc_module *m = mlc_nn_linear(ctx, 2, 2);
    CHECK(m);
    CHECK(mlc_safetensors_open(ctx, "./") == NULL);
    CHECK_CODE(ctx, MLC_ERR_IO, "./");
    CHECK(mlc_module_load(m, "./", NULL) == MLC_ERR_IO);
    CHECK_CODE(ctx, MLC_ERR_IO, "./");
    CHECK(mlc_idx_load(ctx, "./", 0) == NULL);
    CHECK_CODE(ctx, MLC_ERR_IO, "./");
    test_destroy(ctx);
    return 1;
}

static int other_context_before_shape(void) {
    mlc_ctx *ctx = test_ctx(10), *other = test_ctx(11);
    mlc_frame f = mlc_frame_begin(ctx);
    mlc_tensor *x2 = mlc_ones(ctx, MLC_SHAPE(2, 2)), *img = mlc_ones(ctx, MLC_SHAPE(1, 2, 2, 2));
    mlc_tensor *q = mlc_ones(ctx, MLC_SHAPE(1, 2, 2)), *w = mlc_ones(ctx, MLC_SHAPE(2, 2, 1, 1));
    mlc_tensor *odd = mlc_ones(other, MLC_SHAPE(5));                      /* wrong shape everywhere */
    mlc_attention_opts ao;
    CHECK(x2 && img && q && w && odd);
    CHECK(mlc_linear(x2, x2, odd) == NULL);
    CHECK_CODE(ctx, MLC_ERR_ARG, "another context");
    CHECK(mlc_conv2d(img, w, odd, (mlc_conv_opts){ 0 }) == NULL);
    CHECK_CODE(ctx, MLC_ERR_ARG, "another context");
    CHECK(mlc_batch_norm(img, NULL, NULL, odd, NULL, 1, 0.1f, 1e-5f) == NULL);
    CHECK_CODE(ctx, MLC_ERR_ARG, "another context");
    CHECK(mlc_batch_norm(img, odd, NULL, NULL, NULL, 1, 0.1f, 1e-5f) == NULL);
    CHECK_CODE(ctx, MLC_ERR_ARG, "another context");
    CHECK(mlc_layer_norm(x2, NULL, odd, 1e-5f) == NULL);
    CHECK_CODE(ctx, MLC_ERR_ARG, "another context");
    memset(&ao, 0, sizeof ao);
    ao.mask = odd;
    CHECK(mlc_attention(q, q, q, ao) == NULL);
    CHECK_CODE(ctx, MLC_ERR_ARG, "another context");
    {
        mlc_module *mha = mlc_nn_multihead_attention(ctx, 4, 2);
        mlc_tensor *foreign = mlc_ones(other, MLC_SHAPE(1, 2, 3));
        CHECK(mha && foreign);
        CHECK(mlc_forward_attention(mha, foreign, foreign, foreign, NULL, 0) == NULL);
        CHECK_CODE(ctx, MLC_ERR_ARG, "another context");
    }
    CHECK(mlc_error(other) == MLC_OK);
    mlc_frame_end(f);
    test_destroy(other);
    test_destroy(ctx);
    return 1;
}

const test_case tests_hostile[] = {
    TEST(checkpoint_scalars_checked)
    TEST(checkpoint_optimiser_fingerprint)
    TEST(long_names_refused)
    TEST(free_what_others_hold)
    TEST(module_fields_checked_at_forward)
    TEST(directory_is_io_error)
    TEST(other_context_before_shape)
    { NULL, NULL }
};
