/* libFuzzer target for the safetensors loader: each input is a file loaded from memory into a
   small fixed model (strict, then partial), read tensor by tensor, and loaded as a checkpoint;
   a file that reads is written again by mlc and must read back.
   Any input must give MLC_OK or an error value: never a crash, a leak or undefined behaviour.
     clang -g -O1 -fsanitize=fuzzer,address,undefined -I. tests/fuzz/fuzz_safetensors.c -lm
     ./a.out tests/fuzz-corpus/safetensors          (make fuzz FUZZ_SECONDS=60) */
#define MLC_IMPLEMENTATION
#include "mlc.h"
#include <string.h>

static void quiet(mlc_log_level level, const char *message, void *user) { (void)level; (void)message; (void)user; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    mlc_config config = { 0 };
    mlc_ctx *ctx;
    mlc_module *net;
    mlc_optim *opt;
    mlc_safetensors *st;
    mlc_load_report report;
    mlc_load_opts partial = { 1, &report };
    mlc_train_state state;
    int i;
    config.seed = 1;
    config.log = quiet;
    config.device = "cpu";
    ctx = mlc_create(&config);
    if (!ctx) return 0;
    net = mlc_nn_sequential(ctx, mlc_nn_linear(ctx, 2, 3), mlc_nn_batch_norm(ctx, 3), mlc_nn_linear(ctx, 3, 1), NULL);
    opt = mlc_sgd(ctx, net, (mlc_sgd_opts){ .lr = 0.1f, .momentum = 0.9f });
    mlc_module_load_from_memory(net, data, size, NULL);
    mlc_clear_error(ctx);
    mlc_module_load_from_memory(net, data, size, &partial);
    mlc_clear_error(ctx);
    mlc_checkpoint_load_from_memory(data, size, net, opt, &state);
    mlc_clear_error(ctx);
    if ((st = mlc_safetensors_from_memory(ctx, data, size, "fuzz"))) {
        /* every tensor as float32, then written again: the writer's file must read back */
        static mlc_named_tensor list[64];
        mlc_frame f = mlc_frame_begin(ctx);
        int n = 0, writable = mlc_safetensors_count(st) <= 64;
        for (i = 0; i < mlc_safetensors_count(st) && i < 64; i++) {
            const char *name = mlc_safetensors_name(st, i);
            mlc_tensor *t = mlc_safetensors_get(st, name);
            if (t && t->size) (void)mlc_host_data(t)[t->size - 1];
            if (!t || strlen(name) >= sizeof list[0].name) { writable = 0; mlc_clear_error(ctx); continue; }
            memcpy(list[n].name, name, strlen(name) + 1);
            list[n++].tensor = t;
        }
        (void)mlc_safetensors_metadata(st, "format");
        if (writable) {
            static unsigned char again[1 << 16];
            size_t bytes = mlc_safetensors_encode(ctx, list, n, NULL, again, sizeof again);
            mlc_safetensors *back;
            if (bytes && bytes <= sizeof again) {
                if (!(back = mlc_safetensors_from_memory(ctx, again, bytes, "again")) ||
                    mlc_safetensors_count(back) != n)
                    __builtin_trap();                   /* mlc wrote a file it cannot read */
                mlc_safetensors_close(back);
            }
        }
        mlc_frame_end(f);
        mlc_safetensors_close(st);
    }
    mlc_clear_error(ctx);
    mlc_destroy(ctx);
    return 0;
}
