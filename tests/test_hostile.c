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

/* Class 1: every tensor argument goes through the same checks, optional ones and struct fields
   included. A table with one row per public function of mlc.h that takes an mlc_tensor * (a small
   wrapper calling it on an array of tensors: t[0..n), and the positions' names, "?" marking an
   optional one, where NULL is allowed); each position in turn gets
     ended:  a tensor of a frame that has ended (its struct still readable: made past 64 KiB of
             padding in the ended frame, so the call's own results do not overwrite it),
             expected MLC_ERR_STATE;
     other:  a tensor of another context (only where the function has some other argument of a
             context: a second tensor, a module, an optimiser, a context), expected MLC_ERR_ARG in
             either context;
     freed:  a long-lived tensor (mlc_keep, mlc_parameter) freed with mlc_tensor_free, whose record
             mlc keeps, expected MLC_ERR_STATE;
   with and without autocast (bf16), which casts inputs before an op looks at them. Expected: the
   function's failure value (NULL, an mlc_result error, NaN, 0), the code above, a message naming
   the function, nothing crashing or reading freed memory (ASan). Every row first runs with good
   tensors, which must succeed. Each failing case is printed on its own line.
   Left out on purpose: mlc_dtype and mlc_same_shape (const accessors of the struct with no error
   channel: no failure value, no context error documented); mlc_batches_next (its tensors are
   outputs; x and y outliving the iterator is the caller's, as documented; mlc_batches_create is
   here); mlc_gemm, mlc_gemm_bf16, mlc_gemm_reference (raw arrays); mlc_set_grad_ready_hook (a
   tensor only in the callback); functions taking modules or optimisers whose tensors they own
   (mlc_module_to, mlc_module_encode/save, checkpoints): those tensors cannot be ended or freed
   (mlc_tensor_free refuses an owned tensor, free_what_others_hold). */
enum { K_X, K_M33, K_W43, K_V4, K_V3, K_01, K_CLS, K_IDX2, K_GIDX, K_EIDX, K_EW, K_IMG, K_CW, K_Q,
       K_MASK, K_ONE, K_ONEG, K_XG, K_PARAM, K_KEPT, K_SEQ, K_H0, K_I8, K_W8, K_IMG8, K_CW8 };
static const float hw_v01[] = { 1, 0, 1, 0, 1, 0 }, hw_vcls[] = { 0, 2 }, hw_vidx[] = { 1, 0 };
static const float hw_vgidx[] = { 0, 1, 2, 2, 1, 0 }, hw_veidx[] = { 1, 4 }, hw_vmask[] = { 0, 0, 0, 0 };
static const struct { int ndim, shape[4]; const float *values; } hw_kinds[] = {     /* in enum order */
    { 2, { 2, 3 }, NULL }, { 2, { 3, 3 }, NULL }, { 2, { 4, 3 }, NULL }, { 1, { 4 }, NULL },
    { 1, { 3 }, NULL }, { 2, { 2, 3 }, hw_v01 }, { 1, { 2 }, hw_vcls }, { 1, { 2 }, hw_vidx },
    { 2, { 2, 3 }, hw_vgidx }, { 1, { 2 }, hw_veidx }, { 2, { 5, 3 }, NULL }, { 4, { 1, 2, 4, 4 }, NULL },
    { 4, { 3, 2, 3, 3 }, NULL }, { 3, { 1, 2, 4 }, NULL }, { 2, { 2, 2 }, hw_vmask }, { 1, { 1 }, NULL },
    { 1, { 1 }, NULL }, { 2, { 2, 3 }, NULL }, { 2, { 2, 3 }, NULL }, { 2, { 2, 3 }, NULL },
    { 3, { 1, 2, 3 }, NULL }, { 3, { 1, 1, 2 }, NULL }, { 2, { 2, 3 }, NULL }, { 2, { 4, 3 }, NULL },
    { 4, { 1, 2, 4, 4 }, NULL }, { 4, { 3, 2, 3, 3 }, NULL },
};

/* A good tensor of that kind in ctx: in the current frame, or long-lived for K_PARAM and K_KEPT
   unless in_frame (an ended frame's stand-in for one). */
static mlc_tensor *hw_make(mlc_ctx *ctx, int kind, int in_frame) {
    float v[96];
    size_t i, n = 1;
    mlc_tensor *t;
    int d;
    for (d = 0; d < hw_kinds[kind].ndim; d++) n *= (size_t)hw_kinds[kind].shape[d];
    for (i = 0; i < n; i++)
        v[i] = hw_kinds[kind].values ? hw_kinds[kind].values[i] : 0.1f * (float)(i % 7 + 1);
    if (kind == K_PARAM && !in_frame) {
        t = mlc_parameter(ctx, hw_kinds[kind].ndim, hw_kinds[kind].shape);
        if (t && mlc_write(t, v, n) != MLC_OK) return NULL;
        return t;
    }
    t = mlc_from_data(ctx, hw_kinds[kind].ndim, hw_kinds[kind].shape, v);
    if (t && (kind == K_ONEG || kind == K_XG || kind == K_PARAM)) t = mlc_requires_grad(t, 1);
    if (t && kind == K_KEPT && !in_frame) t = mlc_keep(t);
    if (t && (kind == K_I8 || kind == K_IMG8)) t = mlc_quantize(t, 0.05f, 0);   /* int8, per tensor */
    if (t && (kind == K_W8 || kind == K_CW8)) t = mlc_quantize_weight(t);       /* int8, per row */
    return t;
}

typedef struct hw_env { mlc_ctx *ctx; mlc_module *m; mlc_optim *opt; mlc_grad_scaler *scaler; } hw_env;
/* A call: 1 when the function returned its failure value, 0 when it returned success, 2 when it
   returns nothing (then the context's error alone tells). */
typedef int (*hw_call)(hw_env *e, mlc_tensor **t);
typedef struct hw_row {
    const char *fn, *what;              /* the function (its message must name it); a label or NULL */
    mlc_module *(*make)(mlc_ctx *ctx);  /* the module the call takes, or NULL */
    hw_call call;
    int n, kinds[5];
    const char *names;                  /* the positions, comma-separated; "?": optional */
    int flags;
} hw_row;
#define HW_ANCHOR 1                     /* a context-bearing argument besides the tensors */
#define HW_NO_BASELINE 2                /* the good call prints (mlc_print): not run */

static float hw_buf[64];
static unsigned char hw_file[4096];
static mlc_tensor *hw_gc_fn(mlc_tensor **in, void *user) {
    (void)user;
    return mlc_sum_all(mlc_mul(in[0], in[1]));
}
static mlc_named_tensor *hw_named(mlc_tensor **t) {
    static mlc_named_tensor nt[2];
    memset(nt, 0, sizeof nt);
    strcpy(nt[0].name, "a"); strcpy(nt[1].name, "b");
    nt[0].tensor = t[0]; nt[1].tensor = t[1];
    return nt;
}

#define HW_OP(name, expr) \
    static int hw_##name(hw_env *e, mlc_tensor **t) { (void)e; return (expr) == NULL; }
#define HW_RES(name, expr) \
    static int hw_##name(hw_env *e, mlc_tensor **t) { (void)e; return (expr) != MLC_OK; }
#define HW_VOID(name, stmt) \
    static int hw_##name(hw_env *e, mlc_tensor **t) { (void)e; stmt; return 2; }
HW_OP(keep, mlc_keep(t[0]))
HW_OP(to_dtype, mlc_to_dtype(t[0], MLC_BF16))
HW_VOID(tensor_free, mlc_tensor_free(t[0]))
HW_OP(requires_grad, mlc_requires_grad(t[0], 1))
HW_OP(detach, mlc_detach(t[0]))
static int hw_item(hw_env *e, mlc_tensor **t) { (void)e; return test_is_nan(mlc_item(t[0])); }
static int hw_get(hw_env *e, mlc_tensor **t) { (void)e; return test_is_nan(mlc_get(t[0], 1)); }
HW_RES(read, mlc_read(t[0], hw_buf, 6))
HW_RES(write, mlc_write(t[0], hw_buf, 6))
HW_VOID(print, mlc_print(t[0], "hostile"))
HW_OP(to, mlc_to(t[0], 0))
HW_OP(host_data, mlc_host_data(t[0]))
HW_OP(host_grad, mlc_host_grad(t[0]))
HW_OP(add, mlc_add(t[0], t[1]))
HW_OP(sub, mlc_sub(t[0], t[1]))
HW_OP(mul, mlc_mul(t[0], t[1]))
HW_OP(div, mlc_div(t[0], t[1]))
HW_OP(add_scalar, mlc_add_scalar(t[0], 2.0f))
HW_OP(mul_scalar, mlc_mul_scalar(t[0], 2.0f))
HW_OP(rsub_scalar, mlc_rsub_scalar(t[0], 2.0f))
HW_OP(pow, mlc_pow(t[0], 2.0f))
HW_OP(clamp, mlc_clamp(t[0], 0.2f, 0.4f))
HW_OP(where, mlc_where(t[0], t[1], t[2]))
HW_OP(masked_fill, mlc_masked_fill(t[0], t[1], -1.0f))
#define HW_UNARY_CALL(NAME, name, f, df) HW_OP(name, mlc_##name(t[0]))
MLC__UNARY_MAPS(HW_UNARY_CALL)
HW_OP(leaky_relu, mlc_leaky_relu(t[0], 0.1f))
HW_OP(softmax, mlc_softmax(t[0], 1))
HW_OP(log_softmax, mlc_log_softmax(t[0], 1))
HW_OP(matmul, mlc_matmul(t[0], t[1]))
HW_OP(matmul_t, mlc_matmul_t(t[0], t[1], 0, 1))
HW_OP(linear, mlc_linear(t[0], t[1], t[2]))
HW_OP(quantize, mlc_quantize(t[0], 0.1f, 0))
HW_OP(quantize_weight, mlc_quantize_weight(t[0]))
HW_OP(dequantize, mlc_dequantize(t[0]))
HW_OP(conv2d_int8, mlc_conv2d_int8(t[0], t[1], t[2], (mlc_conv_opts){ 0 }, 0.1f, 0))
HW_OP(linear_int8, mlc_linear_int8(t[0], t[1], t[2], 0.1f, 0))
HW_OP(add_int8, mlc_add_int8(t[0], t[1], 0.1f, 0))
HW_OP(max_pool2d_int8, mlc_max_pool2d(t[0], 2, 2, 0))
HW_OP(sum, mlc_sum(t[0], 1, 0))
HW_OP(mean, mlc_mean(t[0], 1, 1))
HW_OP(max, mlc_max(t[0], 1, 0))
HW_OP(var, mlc_var(t[0], 1, 0, 1))
HW_OP(sum_all, mlc_sum_all(t[0]))
HW_OP(mean_all, mlc_mean_all(t[0]))
HW_OP(argmax, mlc_argmax(t[0], 1))
HW_OP(cumsum, mlc_cumsum(t[0], 1))
HW_OP(cross_entropy, mlc_cross_entropy(t[0], t[1], MLC_REDUCE_MEAN, MLC_NO_IGNORE))
HW_OP(cross_entropy_opts,
      mlc_cross_entropy_opts(t[0], t[1], (mlc_ce_opts){ MLC_REDUCE_SUM, 1, 2, 0.1f }))
HW_OP(nll_loss, mlc_nll_loss(t[0], t[1], MLC_REDUCE_MEAN, MLC_NO_IGNORE))
HW_OP(mse_loss, mlc_mse_loss(t[0], t[1], MLC_REDUCE_MEAN))
HW_OP(bce_with_logits, mlc_bce_with_logits(t[0], t[1], MLC_REDUCE_MEAN))
HW_OP(reshape, mlc_reshape(t[0], MLC_SHAPE(3, -1)))
HW_OP(flatten, mlc_flatten(t[0], 0))
HW_OP(transpose, mlc_transpose(t[0], 0, 1))
HW_OP(permute, mlc_permute(t[0], (const int[]){ 1, 0 }))
HW_OP(slice, mlc_slice(t[0], 1, 0, 2))
HW_OP(concat, mlc_concat(e->ctx, t, 2, 0))
HW_OP(index_select, mlc_index_select(t[0], 0, t[1]))
HW_OP(gather, mlc_gather(t[0], 1, t[1]))
HW_OP(copy, mlc_copy(t[0]))
HW_OP(dropout, mlc_dropout(t[0], 0.5f, 1))
HW_OP(layer_norm, mlc_layer_norm(t[0], t[1], t[2], 1e-5f))
HW_OP(layer_norm_dims, mlc_layer_norm_dims(t[0], 1, t[1], t[2], 1e-5f))
HW_OP(batch_norm_train, mlc_batch_norm(t[0], t[1], t[2], t[3], t[4], 1, 0.1f, 1e-5f))
HW_OP(batch_norm_eval, mlc_batch_norm(t[0], t[1], t[2], t[3], t[4], 0, 0.1f, 1e-5f))
HW_OP(embedding, mlc_embedding(t[0], t[1]))
HW_OP(conv2d, mlc_conv2d(t[0], t[1], t[2], (mlc_conv_opts){ 0, 1, 0, 0, 0, 0, 0 }))
HW_OP(max_pool2d, mlc_max_pool2d(t[0], 2, 2, 0))
HW_OP(avg_pool2d, mlc_avg_pool2d(t[0], 2, 2, 0))
HW_OP(max_pool2d_opts, mlc_max_pool2d_opts(t[0], 3, (mlc_pool_opts){ 2, 1, 1, 0, 0, 0, 0 }))
HW_OP(avg_pool2d_opts, mlc_avg_pool2d_opts(t[0], 3, (mlc_pool_opts){ 2, 1, 0, 1, 0, 0, 0 }))
HW_OP(global_avg_pool2d, mlc_global_avg_pool2d(t[0]))
static int hw_attention(hw_env *e, mlc_tensor **t) {
    mlc_attention_opts o;
    (void)e;
    memset(&o, 0, sizeof o);
    o.mask = t[3];
    return mlc_attention(t[0], t[1], t[2], o) == NULL;
}
HW_RES(backward, mlc_backward(t[0]))
HW_RES(backward_with, mlc_backward_with(t[0], t[1]))
static int hw_gradcheck(hw_env *e, mlc_tensor **t) {
    return mlc_gradcheck(e->ctx, hw_gc_fn, NULL, t, 2, NULL, NULL) != 1;
}
HW_OP(forward_attention, mlc_forward_attention(e->m, t[0], t[1], t[2], t[3], 0))
static int hw_rnn_forward(hw_env *e, mlc_tensor **t) {
    mlc_tensor *h = NULL, *c = NULL;
    mlc_tensor *y = mlc_rnn_forward(e->m, t[0], t[1], t[2], &h, &c);
    return y == NULL;
}
HW_RES(module_add_param, mlc_module_add_param(e->m, "p", t[0]))
HW_RES(module_add_buffer, mlc_module_add_buffer(e->m, "b", t[0]))
HW_OP(forward, mlc_forward(e->m, t[0]))
HW_VOID(init_uniform, mlc_init_uniform(t[0], -1.0f, 1.0f))
HW_VOID(init_normal, mlc_init_normal(t[0], 0.0f, 1.0f))
HW_VOID(init_constant, mlc_init_constant(t[0], 0.5f))
HW_VOID(init_kaiming_uniform, mlc_init_kaiming_uniform(t[0], 0.0f))
HW_VOID(init_kaiming_normal, mlc_init_kaiming_normal(t[0], 0.0f))
HW_VOID(init_xavier_uniform, mlc_init_xavier_uniform(t[0], 1.0f))
HW_VOID(init_xavier_normal, mlc_init_xavier_normal(t[0], 1.0f))
HW_RES(optim_add_param, mlc_optim_add_param(e->opt, t[0]))
HW_OP(grad_scaler_scale, mlc_grad_scaler_scale(e->scaler, t[0]))
static int hw_batches_create(hw_env *e, mlc_tensor **t) {
    mlc_batches *b = mlc_batches_create(t[0], t[1], (mlc_batch_opts){ 1, 0, 0 });
    mlc_tensor *x = NULL, *y = NULL;
    (void)e;
    if (!b) return 1;
    mlc_batches_next(b, &x, &y);              /* reads the rows: a freed x or y shows here */
    mlc_batches_free(b);
    return 0;
}
static int hw_safetensors_encode(hw_env *e, mlc_tensor **t) {
    return mlc_safetensors_encode(e->ctx, hw_named(t), 2, NULL, hw_file, sizeof hw_file) == 0;
}
static int hw_safetensors_save(hw_env *e, mlc_tensor **t) {
    const char *path = "mlc-hostile-walk.safetensors";
    mlc_result r = mlc_safetensors_save(e->ctx, path, hw_named(t), 2, NULL);
    remove(path);
    return r != MLC_OK;
}

static mlc_tensor *hw_relu_forward(mlc_module *self, mlc_tensor *x) { (void)self; return mlc_relu(x); }
static mlc_module *hw_custom(mlc_ctx *c) { return mlc_nn_custom(c, "Walk", hw_relu_forward, NULL); }
static mlc_module *hw_mha(mlc_ctx *c) { return mlc_nn_multihead_attention(c, 4, 2); }
static mlc_module *hw_lstm(mlc_ctx *c) { return mlc_nn_lstm(c, 3, 2, 1); }
static mlc_module *hw_rnn(mlc_ctx *c) { return mlc_nn_rnn(c, 3, 2, 1); }
static mlc_module *hw_gru(mlc_ctx *c) { return mlc_nn_gru(c, 3, 2, 1); }
static mlc_module *hw_linear_m(mlc_ctx *c) { return mlc_nn_linear(c, 3, 4); }
static mlc_module *hw_linear_nobias(mlc_ctx *c) { return mlc_nn_linear_nobias(c, 3, 4); }
static mlc_module *hw_conv(mlc_ctx *c) {
    return mlc_nn_conv2d(c, 2, 3, 3, (mlc_conv_opts){ 0, 1, 0, 0, 0, 0, 0 });
}
static mlc_module *hw_bn(mlc_ctx *c) { return mlc_nn_batch_norm(c, 3); }
static mlc_module *hw_bn_eval(mlc_ctx *c) {
    mlc_module *m = mlc_nn_batch_norm(c, 3);
    mlc_module_train(m, 0);
    return m;
}
static mlc_module *hw_ln(mlc_ctx *c) { return mlc_nn_layer_norm(c, 3); }
static mlc_module *hw_ln_shape(mlc_ctx *c) { return mlc_nn_layer_norm_shape(c, MLC_SHAPE(2, 3)); }
static mlc_module *hw_emb(mlc_ctx *c) { return mlc_nn_embedding(c, 5, 3); }
static mlc_module *hw_drop(mlc_ctx *c) { return mlc_nn_dropout(c, 0.5f); }
static mlc_module *hw_relu_m(mlc_ctx *c) { return mlc_nn_relu(c); }
static mlc_module *hw_leaky_m(mlc_ctx *c) { return mlc_nn_leaky_relu(c, 0.1f); }
static mlc_module *hw_gelu_m(mlc_ctx *c) { return mlc_nn_gelu(c); }
static mlc_module *hw_sigmoid_m(mlc_ctx *c) { return mlc_nn_sigmoid(c); }
static mlc_module *hw_tanh_m(mlc_ctx *c) { return mlc_nn_tanh(c); }
static mlc_module *hw_silu_m(mlc_ctx *c) { return mlc_nn_silu(c); }
static mlc_module *hw_flatten_m(mlc_ctx *c) { return mlc_nn_flatten(c); }
static mlc_module *hw_maxpool_m(mlc_ctx *c) { return mlc_nn_max_pool2d(c, 2, 2); }
static mlc_module *hw_avgpool_m(mlc_ctx *c) { return mlc_nn_avg_pool2d(c, 2, 2); }
static mlc_module *hw_gap_m(mlc_ctx *c) { return mlc_nn_global_avg_pool2d(c); }
static mlc_module *hw_seq(mlc_ctx *c) {
    return mlc_nn_sequential(c, mlc_nn_linear(c, 3, 4), mlc_nn_relu(c), NULL);
}

#define HW1(name, k, names) { "mlc_" #name, NULL, NULL, hw_##name, 1, { k }, names, 0 },
#define HW_UNARY_ROW(NAME, name, f, df) HW1(name, K_X, "x")
#define HW_MODULE(type, make, k) { "mlc_forward", type, make, hw_forward, 1, { k }, "x", 0 },
static const hw_row hw_rows[] = {
    HW1(keep, K_X, "x") HW1(to_dtype, K_X, "x") HW1(tensor_free, K_KEPT, "t")
    HW1(requires_grad, K_X, "t") HW1(detach, K_X, "t") HW1(item, K_ONE, "t") HW1(get, K_X, "t")
    HW1(read, K_X, "t") HW1(write, K_X, "t")
    { "mlc_print", NULL, NULL, hw_print, 1, { K_X }, "t", HW_NO_BASELINE },
    HW1(to, K_X, "t") HW1(host_data, K_X, "t") HW1(host_grad, K_PARAM, "t")
    { "mlc_add", NULL, NULL, hw_add, 2, { K_X, K_X }, "a,b", 0 },
    { "mlc_sub", NULL, NULL, hw_sub, 2, { K_X, K_X }, "a,b", 0 },
    { "mlc_mul", NULL, NULL, hw_mul, 2, { K_X, K_X }, "a,b", 0 },
    { "mlc_div", NULL, NULL, hw_div, 2, { K_X, K_X }, "a,b", 0 },
    HW1(add_scalar, K_X, "x") HW1(mul_scalar, K_X, "x") HW1(rsub_scalar, K_X, "x") HW1(pow, K_X, "x")
    HW1(clamp, K_X, "x")
    { "mlc_where", NULL, NULL, hw_where, 3, { K_01, K_X, K_X }, "cond,a,b", 0 },
    { "mlc_masked_fill", NULL, NULL, hw_masked_fill, 2, { K_X, K_01 }, "x,mask", 0 },
    MLC__UNARY_MAPS(HW_UNARY_ROW)
    HW1(leaky_relu, K_X, "x") HW1(softmax, K_X, "x") HW1(log_softmax, K_X, "x")
    { "mlc_matmul", NULL, NULL, hw_matmul, 2, { K_X, K_M33 }, "a,b", 0 },
    { "mlc_matmul_t", NULL, NULL, hw_matmul_t, 2, { K_X, K_M33 }, "a,b", 0 },
    { "mlc_linear", NULL, NULL, hw_linear, 3, { K_X, K_W43, K_V4 }, "x,weight,bias?", 0 },
    { "mlc_linear", "int8 weight", NULL, hw_linear, 3, { K_X, K_W8, K_V4 }, "x,weight,bias?", 0 },
    HW1(quantize, K_X, "x") HW1(quantize_weight, K_W43, "w") HW1(dequantize, K_I8, "q")
    { "mlc_conv2d_int8", NULL, NULL, hw_conv2d_int8, 3, { K_IMG8, K_CW8, K_V3 }, "x,weight,bias?", 0 },
    { "mlc_linear_int8", NULL, NULL, hw_linear_int8, 3, { K_I8, K_W8, K_V4 }, "x,weight,bias?", 0 },
    { "mlc_add_int8", NULL, NULL, hw_add_int8, 2, { K_I8, K_I8 }, "a,b", 0 },
    { "mlc_max_pool2d", "int8", NULL, hw_max_pool2d_int8, 1, { K_IMG8 }, "x", 0 },
    HW1(sum, K_X, "x") HW1(mean, K_X, "x") HW1(max, K_X, "x") HW1(var, K_X, "x") HW1(sum_all, K_X, "x")
    HW1(mean_all, K_X, "x") HW1(argmax, K_X, "x") HW1(cumsum, K_X, "x")
    { "mlc_cross_entropy", NULL, NULL, hw_cross_entropy, 2, { K_X, K_CLS }, "logits,target", 0 },
    { "mlc_cross_entropy_opts", NULL, NULL, hw_cross_entropy_opts, 2, { K_X, K_CLS }, "logits,target",
      0 },
    { "mlc_nll_loss", NULL, NULL, hw_nll_loss, 2, { K_X, K_CLS }, "log_probs,target", 0 },
    { "mlc_mse_loss", NULL, NULL, hw_mse_loss, 2, { K_X, K_X }, "pred,target", 0 },
    { "mlc_bce_with_logits", NULL, NULL, hw_bce_with_logits, 2, { K_X, K_01 }, "logits,target", 0 },
    HW1(reshape, K_X, "x") HW1(flatten, K_X, "x") HW1(transpose, K_X, "x") HW1(permute, K_X, "x")
    HW1(slice, K_X, "x")
    { "mlc_concat", NULL, NULL, hw_concat, 2, { K_X, K_X }, "xs[0],xs[1]", HW_ANCHOR },
    { "mlc_index_select", NULL, NULL, hw_index_select, 2, { K_X, K_IDX2 }, "x,index", 0 },
    { "mlc_gather", NULL, NULL, hw_gather, 2, { K_X, K_GIDX }, "x,index", 0 },
    HW1(copy, K_X, "x") HW1(dropout, K_X, "x")
    { "mlc_layer_norm", NULL, NULL, hw_layer_norm, 3, { K_X, K_V3, K_V3 }, "x,weight?,bias?", 0 },
    { "mlc_layer_norm_dims", NULL, NULL, hw_layer_norm_dims, 3, { K_X, K_V3, K_V3 }, "x,weight?,bias?",
      0 },
    { "mlc_batch_norm", "training", NULL, hw_batch_norm_train, 5, { K_X, K_V3, K_V3, K_V3, K_V3 },
      "x,running_mean?,running_var?,weight?,bias?", 0 },
    { "mlc_batch_norm", "eval", NULL, hw_batch_norm_eval, 5, { K_X, K_V3, K_V3, K_V3, K_V3 },
      "x,running_mean?,running_var?,weight?,bias?", 0 },
    { "mlc_embedding", NULL, NULL, hw_embedding, 2, { K_EW, K_EIDX }, "weight,index", 0 },
    { "mlc_conv2d", NULL, NULL, hw_conv2d, 3, { K_IMG, K_CW, K_V3 }, "x,weight,bias?", 0 },
    HW1(max_pool2d, K_IMG, "x") HW1(avg_pool2d, K_IMG, "x") HW1(max_pool2d_opts, K_IMG, "x")
    HW1(avg_pool2d_opts, K_IMG, "x") HW1(global_avg_pool2d, K_IMG, "x")
    { "mlc_attention", NULL, NULL, hw_attention, 4, { K_Q, K_Q, K_Q, K_MASK }, "q,k,v,opts.mask?", 0 },
    HW1(backward, K_ONEG, "loss")
    { "mlc_backward_with", NULL, NULL, hw_backward_with, 2, { K_XG, K_X }, "out,grad_out?", 0 },
    { "mlc_gradcheck", NULL, NULL, hw_gradcheck, 2, { K_XG, K_XG }, "inputs[0],inputs[1]", HW_ANCHOR },
    { "mlc_forward_attention", NULL, hw_mha, hw_forward_attention, 4, { K_Q, K_Q, K_Q, K_MASK },
      "query,key,value,mask?", 0 },
    { "mlc_rnn_forward", "LSTM", hw_lstm, hw_rnn_forward, 3, { K_SEQ, K_H0, K_H0 }, "x,h0?,c0?", 0 },
    { "mlc_rnn_forward", "GRU", hw_gru, hw_rnn_forward, 2, { K_SEQ, K_H0 }, "x,h0?", 0 },
    { "mlc_module_add_param", NULL, hw_custom, hw_module_add_param, 1, { K_PARAM }, "param", 0 },
    { "mlc_module_add_buffer", NULL, hw_custom, hw_module_add_buffer, 1, { K_KEPT }, "buffer", 0 },
    HW_MODULE("Linear", hw_linear_m, K_X) HW_MODULE("Linear (no bias)", hw_linear_nobias, K_X)
    HW_MODULE("Conv2d", hw_conv, K_IMG) HW_MODULE("BatchNorm (training)", hw_bn, K_X)
    HW_MODULE("BatchNorm (eval)", hw_bn_eval, K_X) HW_MODULE("LayerNorm", hw_ln, K_X)
    HW_MODULE("LayerNorm [2, 3]", hw_ln_shape, K_X) HW_MODULE("Embedding", hw_emb, K_EIDX)
    HW_MODULE("Dropout", hw_drop, K_X) HW_MODULE("ReLU", hw_relu_m, K_X)
    HW_MODULE("LeakyReLU", hw_leaky_m, K_X) HW_MODULE("GELU", hw_gelu_m, K_X)
    HW_MODULE("Sigmoid", hw_sigmoid_m, K_X) HW_MODULE("Tanh", hw_tanh_m, K_X)
    HW_MODULE("SiLU", hw_silu_m, K_X) HW_MODULE("Flatten", hw_flatten_m, K_IMG)
    HW_MODULE("MaxPool2d", hw_maxpool_m, K_IMG) HW_MODULE("AvgPool2d", hw_avgpool_m, K_IMG)
    HW_MODULE("GlobalAvgPool2d", hw_gap_m, K_IMG) HW_MODULE("MultiheadAttention", hw_mha, K_Q)
    HW_MODULE("RNN", hw_rnn, K_SEQ) HW_MODULE("LSTM", hw_lstm, K_SEQ) HW_MODULE("GRU", hw_gru, K_SEQ)
    HW_MODULE("Sequential", hw_seq, K_X) HW_MODULE("custom", hw_custom, K_X)
    HW1(init_uniform, K_PARAM, "t") HW1(init_normal, K_PARAM, "t") HW1(init_constant, K_PARAM, "t")
    HW1(init_kaiming_uniform, K_PARAM, "t") HW1(init_kaiming_normal, K_PARAM, "t")
    HW1(init_xavier_uniform, K_PARAM, "t") HW1(init_xavier_normal, K_PARAM, "t")
    { "mlc_optim_add_param", NULL, NULL, hw_optim_add_param, 1, { K_PARAM }, "param", HW_ANCHOR },
    { "mlc_grad_scaler_scale", NULL, NULL, hw_grad_scaler_scale, 1, { K_ONEG }, "loss", HW_ANCHOR },
    { "mlc_batches_create", NULL, NULL, hw_batches_create, 2, { K_X, K_CLS }, "x,y?", 0 },
    { "mlc_safetensors_encode", NULL, NULL, hw_safetensors_encode, 2, { K_X, K_V3 },
      "tensors[0].tensor,tensors[1].tensor", HW_ANCHOR },
    { "mlc_safetensors_save", NULL, NULL, hw_safetensors_save, 2, { K_X, K_V3 },
      "tensors[0].tensor,tensors[1].tensor", HW_ANCHOR },
};

enum { HW_GOOD = -1, HW_ENDED, HW_OTHER, HW_FREED };
static const char *const hw_kind_names[] = { "ended frame", "other context", "freed" };

/* The bad tensor of that kind for a position whose good tensor is of kind k. */
static mlc_tensor *hw_bad(mlc_ctx *ctx, mlc_ctx *other, int bad, int k) {
    mlc_tensor *t;
    if (bad == HW_OTHER) return hw_make(other, k, 0);
    if (bad == HW_ENDED) {
        mlc_frame f = mlc_frame_begin(ctx);
        mlc_empty(ctx, MLC_SHAPE(16384));                          /* what the call makes goes here */
        t = hw_make(ctx, k, 1);
        mlc_frame_end(f);
        return t;
    }
    t = hw_make(ctx, k, 0);
    if (t && !t->persistent) t = mlc_keep(t);
    mlc_tensor_free(t);
    return t;
}

/* One case: row r with position pos bad (or none: HW_GOOD). 1 when it went as expected; else 0
   and why. */
static int hw_case(const hw_row *r, int pos, int bad, int autocast, char *why, size_t cap) {
    mlc_ctx *ctx = test_ctx(31), *other = test_ctx(32), *at;
    mlc_frame f = mlc_frame_begin(ctx), fo = mlc_frame_begin(other);
    mlc_tensor *t[5] = { NULL, NULL, NULL, NULL, NULL };   /* (positions past a row's count: NULL) */
    hw_env env;
    mlc_result code;
    int i, failed, ok = 1;
    why[0] = '\0';
    env.ctx = ctx;
    env.m = r->make ? r->make(ctx) : NULL;
    env.opt = mlc_sgd(ctx, NULL, (mlc_sgd_opts){ 0 });
    env.scaler = mlc_grad_scaler_create(env.opt, (mlc_grad_scaler_opts){ 0 });
    for (i = 0; i < r->n; i++) t[i] = hw_make(ctx, r->kinds[i], 0);
    if (bad != HW_GOOD) t[pos] = hw_bad(ctx, other, bad, r->kinds[pos]);
    for (i = 0; i < r->n; i++) if (!t[i]) ok = 0;
    if (!ok || mlc_error(ctx) || mlc_error(other) || (r->make && !env.m) || !env.scaler
        || (autocast && mlc_autocast_begin(ctx, MLC_BF16) != MLC_OK)) {
        snprintf(why, cap, "setup failed: %s%s", mlc_error_message(ctx), mlc_error_message(other));
        ok = 0;
    } else {
        failed = r->call(&env, t);
        at = bad == HW_OTHER && !mlc_error(ctx) ? other : ctx;
        code = mlc_error(at);
        if (bad == HW_GOOD) {
            if (failed == 1 || code != MLC_OK)
                snprintf(why, cap, "the good call failed: %s", mlc_error_message(at));
        } else if (failed != 1 && code == MLC_OK) {
            snprintf(why, cap, "succeeded");
        } else if (failed == 0) {
            snprintf(why, cap, "error %d (%s) but returned success", (int)code, mlc_error_message(at));
        } else if (code != (bad == HW_OTHER ? MLC_ERR_ARG : MLC_ERR_STATE)) {
            snprintf(why, cap, "error %d, expected %d: %s", (int)code,
                     bad == HW_OTHER ? MLC_ERR_ARG : MLC_ERR_STATE, mlc_error_message(at));
        } else if (!strstr(mlc_error_message(at), r->fn)) {
            snprintf(why, cap, "message lacks %s: %s", r->fn, mlc_error_message(at));
        }
        ok = why[0] == '\0';
        if (autocast) mlc_autocast_end(ctx);
    }
    mlc_clear_error(ctx);
    mlc_clear_error(other);
    mlc_frame_end(fo);
    mlc_frame_end(f);
    for (i = 0; i < r->n && r->kinds[i] < K_I8; i++) {}  /* the int8 functions run on the CPU, counted */
    if (i < r->n || !strncmp(r->fn, "mlc_quantize", 12) || !strcmp(r->fn, "mlc_dequantize")) {
        static const char *const int8_ops = "mlc_linear mlc_conv2d_int8 mlc_linear_int8 mlc_add_int8 "
                                            "mlc_max_pool2d_opts mlc_quantize mlc_quantize_weight "
                                            "mlc_dequantize";
        test_destroy_expecting_fallbacks(other, int8_ops);
        test_destroy_expecting_fallbacks(ctx, int8_ops);
    } else {
        test_destroy(other);
        test_destroy(ctx);
    }
    return ok;
}

/* The name of position pos in a row's comma-separated list. */
static const char *hw_position(const hw_row *r, int pos, char *out, size_t cap) {
    const char *p = r->names, *end;
    size_t n;
    while (pos-- > 0 && (p = strchr(p, ',')) != NULL) p++;
    if (!p) p = "?";
    end = strchr(p, ',');
    n = end ? (size_t)(end - p) : strlen(p);
    if (n >= cap) n = cap - 1;
    memcpy(out, p, n);
    out[n] = '\0';
    return out;
}

static int every_tensor_argument_checked(void) {
    size_t row;
    int pos, bad, autocast, failures = 0, cases = 0;
    char why[400], name[64];
    for (row = 0; row < sizeof hw_rows / sizeof hw_rows[0]; row++) {
        const hw_row *r = &hw_rows[row];
        for (autocast = 0; autocast < 2; autocast++) {
            if (!(r->flags & HW_NO_BASELINE) && !hw_case(r, 0, HW_GOOD, autocast, why, sizeof why)) {
                printf("  %s%s%s%s: %s\n", r->fn, r->what ? " " : "", r->what ? r->what : "",
                       autocast ? " [autocast]" : "", why);
                failures++;
                continue;
            }
            for (pos = 0; pos < r->n; pos++)
                for (bad = HW_ENDED; bad <= HW_FREED; bad++) {
                    if (bad == HW_OTHER && r->n == 1 && !r->make && !(r->flags & HW_ANCHOR)) continue;
                    cases++;
                    if (hw_case(r, pos, bad, autocast, why, sizeof why)) continue;
                    printf("  %s%s%s %s, %s%s: %s\n", r->fn, r->what ? " " : "", r->what ? r->what : "",
                           hw_position(r, pos, name, sizeof name), hw_kind_names[bad],
                           autocast ? " [autocast]" : "", why);
                    fflush(stdout);
                    failures++;
                }
        }
    }
    CHECK_MSG(failures == 0, "%d of %d cases failed (listed above)", failures, cases);
    return 1;
}

/* Class 4: module trees nested deeper than MLC_MODULE_MAX_DEPTH. Built bottom-up, the add that
   would pass the limit is refused; built top-down (100,000 levels, each add fine on its own),
   every walk over the tree (train, to, to_dtype, parameters, state, param_count, an optimiser,
   a forward) is an error naming the call, never a stack overflow. */
static mlc_tensor *wrap_forward(mlc_module *self, mlc_tensor *x) {
    return self->n_children ? mlc_forward(self->children[0], x) : mlc_relu(x);
}
static int deep_module_trees_refused(void) {
    mlc_ctx *ctx = test_ctx(41);
    mlc_module *m, *root, *cur;
    mlc_named_tensor named[4];
    int i;
    m = mlc_nn_linear(ctx, 2, 2);
    for (i = 1; i < 150; i++) {                          /* bottom-up: level i holds level i - 1 */
        mlc_module *up = mlc_nn_custom(ctx, "Wrap", wrap_forward, NULL);
        if (mlc_module_add_child(up, "0", m) != MLC_OK) break;
        m = up;
    }
    CHECK_MSG(i == MLC_MODULE_MAX_DEPTH + 1 && mlc_error(ctx) == MLC_ERR_ARG, "refused at %d: %s", i,
              mlc_error_message(ctx));
    CHECK(strstr(mlc_error_message(ctx), "mlc_module_add_child") && strstr(mlc_error_message(ctx), "deep"));
    mlc_clear_error(ctx);
    mlc_module_train(m, 0);                              /* the deepest tree allowed works */
    CHECK(mlc_error(ctx) == MLC_OK && mlc_module_param_count(m) == 6);
    CHECK_MSG(mlc_forward(m, mlc_ones(ctx, MLC_SHAPE(1, 2))) != NULL, "%s", mlc_error_message(ctx));
    root = cur = mlc_nn_custom(ctx, "Wrap", wrap_forward, NULL);
    for (i = 0; i < 100000; i++) {                       /* top-down: each add is one level */
        mlc_module *down = mlc_nn_custom(ctx, "Wrap", wrap_forward, NULL);
        CHECK(down && mlc_module_add_child(cur, "0", down) == MLC_OK);
        cur = down;
    }
    CHECK(mlc_module_add_param(cur, "weight", mlc_parameter(ctx, MLC_SHAPE(2))) == MLC_OK);
#define DEEP_REFUSED(call, name) do { call; \
        CHECK_MSG(mlc_error(ctx) == MLC_ERR_ARG && strstr(mlc_error_message(ctx), name) \
                  && strstr(mlc_error_message(ctx), "MLC_MODULE_MAX_DEPTH"), "%s: %s", name, \
                  mlc_error_message(ctx)); \
        mlc_clear_error(ctx); } while (0)
    DEEP_REFUSED(mlc_module_train(root, 1), "mlc_module_train");
    DEEP_REFUSED(mlc_module_to_dtype(root, MLC_BF16), "mlc_module_to_dtype");
    DEEP_REFUSED(CHECK(mlc_module_parameters(root, named, 4) == 0), "mlc_module_parameters");
    DEEP_REFUSED(CHECK(mlc_module_state(root, named, 4) == 0), "mlc_module_state");
    DEEP_REFUSED(CHECK(mlc_module_param_count(root) == 0), "mlc_module_param_count");
    DEEP_REFUSED(CHECK(mlc_adam(ctx, root, (mlc_adam_opts){ 0 }) == NULL), "mlc_optim");
    DEEP_REFUSED(CHECK(mlc_forward(root, mlc_ones(ctx, MLC_SHAPE(1, 2))) == NULL), "mlc_forward");
    if (mlc_has_device(ctx)) DEEP_REFUSED(mlc_module_to(root, 0), "mlc_module_to");
#undef DEEP_REFUSED
    test_destroy(ctx);
    return 1;
}

/* Class 12: every options struct has an initialiser returning it zeroed (each field's default),
   so a caller who starts from it and sets fields one by one never leaves one as stack garbage:
   an Adam made so is Adam, not AMSGrad (no third state buffer). */
#define ZEROED(name, type) do { type o; memset(&o, 0, sizeof o); o = mlc_##name##_defaults(); \
        CHECK_MSG(all_zero(&o, sizeof o), "mlc_%s_defaults left a field set", #name); } while (0)
static int all_zero(const void *p, size_t n) {
    const unsigned char *b = (const unsigned char *)p;
    size_t i;
    for (i = 0; i < n; i++) if (b[i]) return 0;
    return 1;
}
static int options_have_initialisers(void) {
    mlc_ctx *ctx = test_ctx(42);
    mlc_module *lin = mlc_nn_linear(ctx, 3, 2);
    mlc_adam_opts adam;
    mlc_optim *opt;
    ZEROED(config, mlc_config); ZEROED(ce, mlc_ce_opts); ZEROED(conv, mlc_conv_opts);
    ZEROED(pool, mlc_pool_opts); ZEROED(attention, mlc_attention_opts);
    ZEROED(gradcheck, mlc_gradcheck_opts); ZEROED(rnn, mlc_rnn_opts); ZEROED(sgd, mlc_sgd_opts);
    ZEROED(adam, mlc_adam_opts); ZEROED(rmsprop, mlc_rmsprop_opts);
    ZEROED(grad_scaler, mlc_grad_scaler_opts); ZEROED(batch, mlc_batch_opts); ZEROED(load, mlc_load_opts);
    memset(&adam, 0xa5, sizeof adam);                    /* what the stack might hold */
    adam = mlc_adam_defaults();
    adam.lr = 0.01f;
    opt = mlc_adam(ctx, lin, adam);
    CHECK(opt && test_optim_state(opt, 0, 0) && !test_optim_state(opt, 0, 2));
    test_destroy(ctx);
    return 1;
}
#undef ZEROED

/* Class 2: counts that overflow or are absurd are refused before anything is made: an LSTM of
   INT_MAX layers (it used to build for hours), 3 * embed_dim past INT_MAX, the batch count with
   batch_size INT_MAX (n + size - 1 wrapped), a module with 100,000 children (each add copied the
   list: quadratic). */
static int absurd_counts_refused(void) {
    mlc_ctx *ctx = test_ctx(43);
    mlc_module *seq;
    mlc_tensor *x = mlc_zeros(ctx, MLC_SHAPE(10, 2));
    mlc_batches *b;
    int i;
    CHECK(mlc_nn_lstm(ctx, 4, 4, 2147483647) == NULL && mlc_error(ctx) == MLC_ERR_MEMORY);
    CHECK(strstr(mlc_error_message(ctx), "mlc_nn_recurrent"));
    mlc_clear_error(ctx);
    CHECK(mlc_nn_multihead_attention(ctx, 0x40000000, 1) == NULL && mlc_error(ctx) == MLC_ERR_ARG);
    mlc_clear_error(ctx);
    b = mlc_batches_create(x, NULL, (mlc_batch_opts){ .batch_size = 2147483647 });
    CHECK(b && mlc_batches_count(b) == 1);
    mlc_batches_free(b);
    b = mlc_batches_create(x, NULL, (mlc_batch_opts){ .batch_size = 2147483647, .drop_last = 1 });
    CHECK(b && mlc_batches_count(b) == 0);
    mlc_batches_free(b);
    seq = mlc_nn_sequential(ctx, NULL);
    for (i = 0; i < 100000; i++) CHECK(mlc_module_add_child(seq, "r", mlc_nn_relu(ctx)) == MLC_OK);
    CHECK(seq->n_children == 100000 && seq->children[99999] && strcmp(seq->child_names[77777], "r") == 0);
    CHECK(mlc_forward(seq, x) != NULL);
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
    TEST(every_tensor_argument_checked)
    TEST(deep_module_trees_refused)
    TEST(options_have_initialisers)
    TEST(absurd_counts_refused)
    { NULL, NULL }
};
