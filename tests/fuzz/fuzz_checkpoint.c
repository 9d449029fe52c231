/* libFuzzer target for the checkpoint loader: each input is a checkpoint loaded from memory into
   a small model with an Adam (amsgrad) optimiser and a gradient scaler. A load that fails must
   leave everything as it was (compared with a copy taken before); a load that succeeds must give
   state training can go on from (a finite, non-negative learning rate, counts in range), and one
   step from it, saved again, must load back. Any input: MLC_OK or an error value, never a crash,
   a leak or undefined behaviour. The seeds (tests/fuzz-corpus/checkpoint) are checkpoints whose
   checksum keys are renamed, so mutations reach the loader's own checks instead of failing the
   CRC-32 first; -DMLC_FUZZ_SEEDS builds a program that writes them.
     clang -g -O1 -fsanitize=fuzzer,address,undefined -I. tests/fuzz/fuzz_checkpoint.c -lm
     ./a.out tests/fuzz-corpus/checkpoint          (make fuzz FUZZ_SECONDS=60) */
#define MLC_IMPLEMENTATION
#include "mlc.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct fuzz_model { mlc_ctx *ctx; mlc_module *net; mlc_optim *opt; mlc_grad_scaler *scaler; } fuzz_model;

static void quiet(mlc_log_level level, const char *message, void *user) { (void)level; (void)message; (void)user; }

static int make_model(fuzz_model *f) {
    mlc_config config = mlc_config_defaults();
    mlc_adam_opts adam = mlc_adam_defaults();
    config.seed = 1;
    config.log = quiet;
    config.device = "cpu";
    if (!(f->ctx = mlc_create(&config))) return 0;
    f->net = mlc_nn_sequential(f->ctx, mlc_nn_linear(f->ctx, 2, 3), mlc_nn_batch_norm(f->ctx, 3),
                               mlc_nn_linear(f->ctx, 3, 1), NULL);
    adam.lr = 0.01f;
    adam.amsgrad = 1;
    f->opt = mlc_adam(f->ctx, f->net, adam);
    f->scaler = mlc_grad_scaler_create(f->opt, mlc_grad_scaler_defaults());
    return f->net && f->opt && f->scaler;
}

/* One training step (forward, scaled backward, the scaler's step and update) */
static void train_step(fuzz_model *f) {
    mlc_frame fr = mlc_frame_begin(f->ctx);
    mlc_tensor *x = mlc_randn(f->ctx, MLC_SHAPE(4, 2)), *y = mlc_randn(f->ctx, MLC_SHAPE(4, 1));
    mlc_tensor *loss = mlc_mse_loss(mlc_forward(f->net, x), y, MLC_REDUCE_MEAN);
    mlc_zero_grad(f->opt);
    mlc_backward(mlc_grad_scaler_scale(f->scaler, loss));
    mlc_grad_scaler_step(f->scaler);
    mlc_grad_scaler_update(f->scaler);
    mlc_frame_end(fr);
}

/* The whole state as bytes (a checkpoint in memory); NULL on error. */
static unsigned char *state_bytes(fuzz_model *f, const mlc_train_state *s, size_t *n) {
    unsigned char *buf;
    *n = mlc_checkpoint_encode(f->net, f->opt, s, NULL, 0);
    if (!*n || !(buf = (unsigned char *)malloc(*n))) return NULL;
    if (mlc_checkpoint_encode(f->net, f->opt, s, buf, *n) != *n) { free(buf); return NULL; }
    return buf;
}

#ifndef MLC_FUZZ_SEEDS
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_model f;
    mlc_train_state state = { 3, 1 }, loaded = state;
    unsigned char *before, *after, *again;
    size_t n_before, n_after, n_again;
    if (!make_model(&f)) { mlc_destroy(f.ctx); return 0; }
    train_step(&f);
    before = state_bytes(&f, &state, &n_before);
    if (mlc_checkpoint_load_from_memory(data, size, f.net, f.opt, &loaded) != MLC_OK) {
        mlc_clear_error(f.ctx);                          /* refused: nothing may have changed */
        after = state_bytes(&f, &state, &n_after);
        if (!before || !after || n_before != n_after || memcmp(before, after, n_before) != 0) __builtin_trap();
        free(after);
    } else {
        if (!(mlc_optim_lr(f.opt) >= 0.0f) || loaded.step < 0 || loaded.epoch < 0) __builtin_trap();
        train_step(&f);
        if (!mlc_error(f.ctx)) {                         /* what it saves now must load back */
            again = state_bytes(&f, &loaded, &n_again);
            if (!again || mlc_checkpoint_load_from_memory(again, n_again, f.net, f.opt, &loaded) != MLC_OK)
                __builtin_trap();
            free(again);
        }
    }
    free(before);
    mlc_destroy(f.ctx);
    return 0;
}
#else
/* Write the seeds: a checkpoint after 0, 1 and 3 steps, each with its checksum keys renamed. */
int main(int argc, char **argv) {
    static const int steps[3] = { 0, 1, 3 };
    int s, k;
    for (s = 0; s < 3; s++) {
        fuzz_model f;
        mlc_train_state state = { steps[s], steps[s] / 2 };
        unsigned char *bytes;
        size_t n, i;
        char path[512];
        FILE *out;
        if (argc < 2 || !make_model(&f)) return 1;
        for (k = 0; k < steps[s]; k++) train_step(&f);
        if (!(bytes = state_bytes(&f, &state, &n))) return 1;
        for (i = 0; i + 10 <= n; i++)
            if (memcmp(bytes + i, "mlc.crc32:", 10) == 0) bytes[i] = 'x';
        snprintf(path, sizeof path, "%s/steps-%d.ckpt", argv[1], steps[s]);
        if (!(out = fopen(path, "wb")) || fwrite(bytes, 1, n, out) != n || fclose(out) != 0) return 1;
        free(bytes);
        mlc_destroy(f.ctx);
    }
    return 0;
}
#endif
