/* examples/gpt_model.h - the tiny GPT of examples/gpt.c, also timed by bench/bench.c (the same
   model as GPT in bench/torch_bench.py). Include it after mlc.h.
   A character-level transformer with nanoGPT's parameter names: token and position embeddings
   (wte, wpe; N(0, 0.02)), `layers` pre-norm blocks h.0 ... (x += attn(ln_1(x)) with causal
   multi-head attention, x += mlp(ln_2(x)) with mlp = c_fc, GELU, c_proj of width 4 embd), a
   final layer norm ln_f and a head lm_head without bias. */
#ifndef GPT_MODEL_H
#define GPT_MODEL_H
#include <stdio.h>

typedef struct gpt_config { int vocab, block, layers, embd, heads; } gpt_config;

/* Block: children ln_1, attn, ln_2, mlp */
static mlc_tensor *gpt_block_forward(mlc_module *m, mlc_tensor *x) {
    mlc_tensor *h = mlc_forward(m->children[0], x);
    x = mlc_add(x, mlc_forward_attention(m->children[1], h, h, h, NULL, 1));
    return mlc_add(x, mlc_forward(m->children[3], mlc_forward(m->children[2], x)));
}

/* GPT: children wte, wpe, h, ln_f, lm_head. idx [B, T] character ids -> logits [B, T, vocab]. */
static mlc_tensor *gpt_forward(mlc_module *m, mlc_tensor *idx) {
    mlc_tensor *pos = mlc_arange(m->ctx, 0.0f, (float)idx->shape[1], 1.0f);
    mlc_tensor *x = mlc_add(mlc_forward(m->children[0], idx), mlc_forward(m->children[1], pos));
    x = mlc_forward(m->children[2], x);
    return mlc_forward(m->children[4], mlc_forward(m->children[3], x));
}

static mlc_module *gpt_create(mlc_ctx *ctx, gpt_config c) {
    mlc_module *gpt = mlc_nn_custom(ctx, "GPT", gpt_forward, NULL), *h = mlc_nn_sequential(ctx, NULL);
    mlc_module *wte = mlc_nn_embedding(ctx, c.vocab, c.embd), *wpe = mlc_nn_embedding(ctx, c.block, c.embd);
    if (!gpt || !h || !wte || !wpe) return NULL;
    mlc_init_normal(wte->params[0], 0.0f, 0.02f);
    mlc_init_normal(wpe->params[0], 0.0f, 0.02f);
    for (int l = 0; l < c.layers; l++) {
        mlc_module *b = mlc_nn_custom(ctx, "Block", gpt_block_forward, NULL), *mlp = mlc_nn_sequential(ctx, NULL);
        char name[16];
        if (!b || !mlp) return NULL;
        mlc_module_add_child(mlp, "c_fc", mlc_nn_linear(ctx, c.embd, 4 * c.embd));
        mlc_module_add_child(mlp, "gelu", mlc_nn_gelu(ctx));
        mlc_module_add_child(mlp, "c_proj", mlc_nn_linear(ctx, 4 * c.embd, c.embd));
        mlc_module_add_child(b, "ln_1", mlc_nn_layer_norm(ctx, c.embd));
        mlc_module_add_child(b, "attn", mlc_nn_multihead_attention(ctx, c.embd, c.heads));
        mlc_module_add_child(b, "ln_2", mlc_nn_layer_norm(ctx, c.embd));
        mlc_module_add_child(b, "mlp", mlp);
        snprintf(name, sizeof name, "%d", l);
        mlc_module_add_child(h, name, b);
    }
    mlc_module_add_child(gpt, "wte", wte);
    mlc_module_add_child(gpt, "wpe", wpe);
    mlc_module_add_child(gpt, "h", h);
    mlc_module_add_child(gpt, "ln_f", mlc_nn_layer_norm(ctx, c.embd));
    mlc_module_add_child(gpt, "lm_head", mlc_nn_linear_nobias(ctx, c.embd, c.vocab));
    return mlc_error(ctx) ? NULL : gpt;
}

/* The mean cross entropy of predicting y [B T] (the next characters) from x [B, T]. */
static mlc_tensor *gpt_loss(mlc_module *gpt, mlc_tensor *x, mlc_tensor *y, int vocab) {
    mlc_tensor *logits = mlc_forward(gpt, x);
    return mlc_cross_entropy(mlc_reshape(logits, MLC_SHAPE(-1, vocab)), y, MLC_REDUCE_MEAN, MLC_NO_IGNORE);
}

/* AdamW as examples/gpt.c trains it (lr set per step by the schedule). */
static mlc_optim *gpt_optimiser(mlc_module *gpt, float lr) {
    return mlc_adamw(gpt->ctx, gpt, (mlc_adam_opts){ .lr = lr, .beta2 = 0.99f, .weight_decay = 0.1f });
}
#endif
