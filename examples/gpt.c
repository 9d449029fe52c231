/* A tiny GPT: a character-level transformer trained on the five books of Moses (King James
   Version, public domain; data/kjv_pentateuch.txt, see data/README.md).
   Model (examples/gpt_model.h): token and position embeddings, pre-norm blocks of causal
   multi-head attention and a GELU MLP, a final layer norm and a linear head to the characters,
   with nanoGPT's parameter names (wte, wpe, h.0.ln_1, h.0.attn.in_proj_weight, ...). AdamW
   (weight decay 0.1, betas 0.9, 0.99) with linear warm-up and cosine decay to lr / 10, gradients
   clipped to norm 1, random windows of the text as batches. It prints the unigram baseline (the cross entropy of predicting each
   character from the training text's character frequencies alone), then the loss every
   --every steps and a sample of text continued from a prompt.
   Usage: gpt [--data FILE] [--device NAME] [--steps N] [--batch N] [--block N] [--layers N]
              [--embd N] [--heads N] [--lr X] [--every N] [--seed N] [--save FILE] [--int8]
   (gpt --help lists the defaults; a bad option exits with status 2.)
   --save writes the trained model as safetensors, the vocabulary in its metadata: "vocab_hex",
   each character's byte as two hex digits in id order (any byte: NUL and non-UTF-8 ones too).
   --int8, after training (and after --save, which writes the float32 model), quantizes the
   model's linears dynamically (mlc_quantize_dynamic: c_fc, c_proj, attn.out_proj and lm_head get
   int8 weights; attention's in_proj_weight is a parameter, not a Linear, and stays float32;
   PyTorch's quantize_dynamic would leave out_proj float32 too), prints the validation loss of
   the float32 and the int8 model, and a sample from the int8 one. */
#define _POSIX_C_SOURCE 199309L
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#define MLC_IMPLEMENTATION
#include "mlc.h"
#include "gpt_model.h"
#include "find_data.h"
#include "parse_arg.h"

typedef struct options {
    const char *data, *device, *save;
    int steps, batch, block, layers, embd, heads, every, int8;
    float lr;
    unsigned long long seed;
} options;

static double seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define DEFAULT_TEXT "data/kjv_pentateuch.txt"
static const options defaults = { .steps = 1000, .batch = 16, .block = 64, .layers = 4, .embd = 64,
                                  .heads = 4, .every = 200, .lr = 2e-3f, .seed = 1 };

static void usage(FILE *out, const char *program) {
    const options *d = &defaults;
    fprintf(out, "usage: %s [options]\n"
                 "Trains a character-level GPT on a text file and prints samples of its writing.\n"
                 "  --data FILE    the text (default " DEFAULT_TEXT ", looked up in the current\n"
                 "                 directory, then in the program's directory, then in its parent)\n"
                 "  --device NAME  cpu, opencl, opencl:N, best (default: $MLC_DEVICE, else the CPU)\n"
                 "  --steps N      training steps (%d)\n"
                 "  --batch N      windows per step (%d)\n"
                 "  --block N      characters per window, the context length (%d)\n"
                 "  --layers N     transformer blocks (%d)\n"
                 "  --embd N       embedding width (%d)\n"
                 "  --heads N      attention heads, dividing --embd (%d)\n"
                 "  --lr X         peak learning rate (%g)\n"
                 "  --every N      report the loss and a sample every N steps (%d)\n"
                 "  --seed N       random seed (%llu)\n"
                 "  --save FILE    write the trained model as safetensors\n"
                 "  --int8         then quantize its linears to int8 (mlc_quantize_dynamic) and print\n"
                 "                 the validation loss of both and a sample from the int8 model\n"
                 "  -h, --help     this text\n",
            program, d->steps, d->batch, d->block, d->layers, d->embd, d->heads, (double)d->lr, d->every,
            d->seed);
}

/* The command line into *o: RUN, HELP (-h, --help) or BAD (a message printed). Each number must
   be whole and in its range (the limits keep every size product within int). */
enum { RUN, HELP, BAD };
static int parse_options(int argc, char **argv, options *o) {
    *o = defaults;
    for (int i = 1; i < argc; i++) {
        const char *flag = argv[i], *value = i + 1 < argc ? argv[i + 1] : NULL;
        int ok = 1;
        if (!strcmp(flag, "--help") || !strcmp(flag, "-h")) return HELP;
        if (!strcmp(flag, "--int8")) { o->int8 = 1; continue; }
        if (strcmp(flag, "--data") && strcmp(flag, "--device") && strcmp(flag, "--save") &&
            strcmp(flag, "--steps") && strcmp(flag, "--batch") && strcmp(flag, "--block") &&
            strcmp(flag, "--layers") && strcmp(flag, "--embd") && strcmp(flag, "--heads") &&
            strcmp(flag, "--every") && strcmp(flag, "--lr") && strcmp(flag, "--seed")) {
            fprintf(stderr, "unknown option %s\n", flag);
            return BAD;
        }
        if (!value) { fprintf(stderr, "%s needs a value\n", flag); return BAD; }
        i++;
        if (!strcmp(flag, "--data")) o->data = value;
        else if (!strcmp(flag, "--device")) o->device = value;
        else if (!strcmp(flag, "--save")) o->save = value;
        else if (!strcmp(flag, "--steps")) ok = parse_int_arg(flag, value, 1, 1000000000, &o->steps);
        else if (!strcmp(flag, "--batch")) ok = parse_int_arg(flag, value, 1, 65536, &o->batch);
        else if (!strcmp(flag, "--block")) ok = parse_int_arg(flag, value, 2, 65536, &o->block);
        else if (!strcmp(flag, "--layers")) ok = parse_int_arg(flag, value, 1, 1024, &o->layers);
        else if (!strcmp(flag, "--embd")) ok = parse_int_arg(flag, value, 1, 16384, &o->embd);
        else if (!strcmp(flag, "--heads")) ok = parse_int_arg(flag, value, 1, 16384, &o->heads);
        else if (!strcmp(flag, "--every")) ok = parse_int_arg(flag, value, 1, 1000000000, &o->every);
        else if (!strcmp(flag, "--lr")) ok = parse_float_arg(flag, value, 0.0, 10.0, &o->lr);
        else ok = parse_u64_arg(flag, value, &o->seed);
        if (!ok) return BAD;
    }
    if (o->embd % o->heads) {
        fprintf(stderr, "--heads (%d) must divide --embd (%d)\n", o->heads, o->embd);
        return BAD;
    }
    if ((long)o->batch * o->block > (1L << 24)) {
        fprintf(stderr, "--batch times --block (%ld) must be at most 2^24\n", (long)o->batch * o->block);
        return BAD;
    }
    return RUN;
}

/* ---- The text as character ids ------------------------------------------------------------ */

typedef struct corpus {
    unsigned char *ids;                 /* the text, each character replaced by its id */
    long n, n_train;                    /* characters; the first 90 % train, the rest validate */
    int vocab;
    char chars[257];                    /* id -> character */
    int id_of[256];
} corpus;

/* Read the text at path into c; `block` characters per window need at least block + 2 training
   characters (a window and its target, in more than one place) and 2 validation ones. On an
   error, says why (naming the file) and returns 0. */
static int corpus_load(corpus *c, const char *path, int block) {
    FILE *f = fopen(path, "rb");
    int present[256] = { 0 };
    long i, need = block + 2;
    memset(c, 0, sizeof *c);
    if (!f) {
        fprintf(stderr, "error: cannot open %s: %s (give --data FILE)\n", path, strerror(errno));
        return 0;
    }
    size_t cap = 0, got = 0;
    const char *why = NULL;
    do {                                     /* to the end (not ftell's size: a directory fools it) */
        if ((size_t)c->n == cap) {
            unsigned char *grown = cap < LONG_MAX / 4 ? realloc(c->ids, cap ? 2 * cap : 65536) : NULL;
            if (!grown) { why = "out of memory"; break; }
            c->ids = grown;
            cap = cap ? 2 * cap : 65536;
        }
        got = fread(c->ids + c->n, 1, cap - (size_t)c->n, f);
        c->n += (long)got;
    } while (got > 0);
    if (!why && ferror(f)) why = strerror(errno);
    if (why) {
        fprintf(stderr, "error: cannot read %s: %s\n", path, why);
        fclose(f);
        free(c->ids);
        c->ids = NULL;
        return 0;
    }
    fclose(f);
    c->n_train = c->n / 10 * 9;
    if (c->n_train < block + 2 || c->n - c->n_train < 2) {
        while (need / 10 * 9 < block + 2 || need - need / 10 * 9 < 2) need++;
        fprintf(stderr, "error: %s has %ld bytes; with --block %d it needs at least %ld (90%% to train "
                        "on, more than a window and its target; the rest to validate)\n",
                path, c->n, block, need);
        free(c->ids);
        c->ids = NULL;
        return 0;
    }
    for (i = 0; i < c->n; i++) present[c->ids[i]] = 1;
    for (i = 0; i < 256; i++)
        if (present[i]) { c->id_of[i] = c->vocab; c->chars[c->vocab++] = (char)i; }
    for (i = 0; i < c->n; i++) c->ids[i] = (unsigned char)c->id_of[c->ids[i]];
    return 1;
}

/* The unigram baseline: cross entropy (nats per character) of the validation text under the
   training text's character frequencies (add-one smoothed). */
static double unigram_baseline(const corpus *c) {
    double count[256] = { 0 }, total = c->n_train + c->vocab, loss = 0.0;
    long i;
    for (i = 0; i < c->n_train; i++) count[c->ids[i]] += 1.0;
    for (i = c->n_train; i < c->n; i++) loss -= log((count[c->ids[i]] + 1.0) / total);
    return loss / (double)(c->n - c->n_train);
}

/* ---- Batches, loss, samples --------------------------------------------------------------- */

/* B random windows of block + 1 characters from [from, to): inputs x and targets y (shifted by one). */
static void batch(mlc_ctx *ctx, const corpus *c, long from, long to, int B, int T, mlc_tensor **x, mlc_tensor **y) {
    float *xs = malloc(sizeof(float) * (size_t)B * (size_t)T), *ys = malloc(sizeof(float) * (size_t)B * (size_t)T);
    for (int b = 0; xs && ys && b < B; b++) {
        long start = from + (long)(mlc_rand_u32(ctx) % (uint32_t)(to - from - T - 1));
        for (int t = 0; t < T; t++) {
            xs[b * T + t] = c->ids[start + t];
            ys[b * T + t] = c->ids[start + t + 1];
        }
    }
    *x = xs ? mlc_from_data(ctx, MLC_SHAPE(B, T), xs) : NULL;
    *y = ys ? mlc_from_data(ctx, MLC_SHAPE(B * T), ys) : NULL;
    free(xs);
    free(ys);
}

/* The loss (nats per character) over the whole validation text, without gradients: its
   characters cut into consecutive windows of block + 1 (the tail in a shorter one), each window
   predicting its last `block` characters from the ones before, batch windows at a time; the
   mean over every predicted character. */
static double validation_loss(mlc_module *gpt, const corpus *c, const options *o) {
    mlc_ctx *ctx = gpt->ctx;
    int was = mlc_set_grad_enabled(ctx, 0);
    float *xs = malloc(sizeof(float) * (size_t)o->batch * (size_t)o->block);
    float *ys = malloc(sizeof(float) * (size_t)o->batch * (size_t)o->block);
    double sum = 0.0;
    long start = c->n_train, counted = 0;
    mlc_module_train(gpt, 0);
    while (xs && ys && start + 1 < c->n && !mlc_error(ctx)) {
        int T = c->n - start - 1 < o->block ? (int)(c->n - start - 1) : o->block, B = 0;
        for (; B < o->batch && start + T < c->n; B++, start += T)   /* full windows of T, then the tail */
            for (int t = 0; t < T; t++) {
                xs[B * T + t] = c->ids[start + t];
                ys[B * T + t] = c->ids[start + t + 1];
            }
        mlc_frame f = mlc_frame_begin(ctx);
        mlc_tensor *loss = gpt_loss(gpt, mlc_from_data(ctx, MLC_SHAPE(B, T), xs),
                                    mlc_from_data(ctx, MLC_SHAPE(B * T), ys), c->vocab);
        if (loss) sum += (double)mlc_item(loss) * B * T;
        counted += (long)B * T;
        mlc_frame_end(f);
    }
    free(xs);
    free(ys);
    mlc_module_train(gpt, 1);
    mlc_set_grad_enabled(ctx, was);
    return counted ? sum / (double)counted : 0.0;
}

/* Continue `prompt` by `length` characters, each drawn from softmax(logits / 0.8) of the last
   block characters. */
static void sample(mlc_module *gpt, const corpus *c, const options *o, const char *prompt, int length) {
    mlc_ctx *ctx = gpt->ctx;
    int was = mlc_set_grad_enabled(ctx, 0), n = 0;
    char *text = malloc(strlen(prompt) + (size_t)length + 1);
    float *window = malloc(sizeof(float) * (size_t)o->block), *p = malloc(sizeof(float) * (size_t)c->vocab);
    if (!text || !window || !p) { free(text); free(window); free(p); return; }
    mlc_module_train(gpt, 0);
    for (const char *s = prompt; *s; s++) text[n++] = *s;
    for (int k = 0; k < length; k++) {
        mlc_frame f = mlc_frame_begin(ctx);
        int T = n < o->block ? n : o->block, next = 0;
        for (int t = 0; t < T; t++) window[t] = (float)c->id_of[(unsigned char)text[n - T + t]];
        mlc_tensor *logits = mlc_forward(gpt, mlc_from_data(ctx, MLC_SHAPE(1, T), window));
        const float *last = logits ? mlc_host_data(logits) + (size_t)(T - 1) * c->vocab : NULL;
        if (!last) { mlc_frame_end(f); break; }
        double total = 0.0, u = mlc_rand_uniform(ctx), run = 0.0, top = last[0];
        for (int v = 1; v < c->vocab; v++) if (last[v] > top) top = last[v];
        for (int v = 0; v < c->vocab; v++) total += p[v] = (float)exp((last[v] - top) / 0.8);
        for (next = 0; next < c->vocab - 1 && (run += p[next] / total) < u; next++) {}
        text[n++] = c->chars[next];
        mlc_frame_end(f);
    }
    text[n] = '\0';
    printf("    | %s\n", text);
    mlc_module_train(gpt, 1);
    mlc_set_grad_enabled(ctx, was);
    free(text); free(window); free(p);
}

/* the modules of m (m too) whose first parameter, a Linear's weight, is int8 */
static int int8_modules(const mlc_module *m) {
    int n = m->n_params > 0 && mlc_dtype(m->params[0]) == MLC_I8;
    for (int i = 0; i < m->n_children; i++) n += int8_modules(m->children[i]);
    return n;
}

int main(int argc, char **argv) {
    options o;
    corpus c;
    char found[1024];
    int parsed = parse_options(argc, argv, &o);
    if (parsed != RUN) {                              /* --help: exit 0; a bad command line: 2 */
        usage(parsed == HELP ? stdout : stderr, argv[0]);
        return parsed == HELP ? 0 : 2;
    }
    if (!o.data) o.data = find_data(argv[0], DEFAULT_TEXT, found, sizeof found);
    if (!corpus_load(&c, o.data, o.block)) return 1;
    char why[256] = "";                               /* why mlc_create returned NULL */
    mlc_ctx *ctx = mlc_create(&(mlc_config){ .seed = o.seed, .device = o.device,
                                             .error = why, .error_bytes = sizeof why });
    if (!ctx) { fprintf(stderr, "error: %s\n", why); return 1; }
    mlc_module *gpt = gpt_create(ctx, (gpt_config){ c.vocab, o.block, o.layers, o.embd, o.heads });
    mlc_optim *opt = gpt ? gpt_optimiser(gpt, o.lr) : NULL;
    if (!opt) { fprintf(stderr, "error: %s\n", mlc_error_message(ctx)); return 1; }
    printf("Using device: %s\n", mlc_device_name(ctx));
    printf("%s: %ld characters, vocabulary %d; %d layers, %d dims, %d heads, block %d, batch %d: %zu parameters\n",
           o.data, c.n, c.vocab, o.layers, o.embd, o.heads, o.block, o.batch, mlc_module_param_count(gpt));
    printf("unigram baseline (validation): %.4f nats per character\n", unigram_baseline(&c));
    int warmup = o.steps / 10 < 100 ? o.steps / 10 : 100;
    double start = seconds(), interval = 0.0;
    for (int step = 1; step <= o.steps; step++) {
        mlc_frame f = mlc_frame_begin(ctx);
        mlc_tensor *x, *y;
        batch(ctx, &c, 0, c.n_train, o.batch, o.block, &x, &y);
        mlc_optim_set_lr(opt, mlc_lr_cosine(o.lr, step - 1, warmup, o.steps, o.lr / 10));
        mlc_tensor *loss = gpt_loss(gpt, x, y, c.vocab);
        mlc_zero_grad(opt);
        mlc_backward(loss);
        mlc_clip_grad_norm(opt, 1.0f);
        mlc_step(opt);
        interval += mlc_item(loss);
        mlc_frame_end(f);
        if (mlc_error(ctx)) break;
        if (step % o.every == 0 || step == o.steps) {
            int steps = step % o.every ? step % o.every : o.every;
            double t = seconds() - start;
            printf("step %5d  train %.4f  val %.4f  %.1f s  %.0f tokens/s\n", step, interval / steps,
                   validation_loss(gpt, &c, &o), t, (double)step * o.batch * o.block / t);
            sample(gpt, &c, &o, "And God said", 100);
            fflush(stdout);
            interval = 0.0;
        }
    }
    if (!mlc_error(ctx) && o.save) {
        char hex[2 * 256 + 1];                      /* any byte, NUL and non-UTF-8 ones too */
        for (int v = 0; v < c.vocab; v++) snprintf(hex + 2 * v, 3, "%02x", (unsigned char)c.chars[v]);
        const char *meta[] = { "vocab_hex", c.vocab ? hex : "", NULL };
        if (mlc_module_save(gpt, o.save, meta) == MLC_OK) printf("saved %s\n", o.save);
    }
    if (!mlc_error(ctx) && o.int8) {                 /* the trained model, then its int8 linears */
        double loss_float = validation_loss(gpt, &c, &o);
        mlc_quantize_dynamic(gpt);
        double loss_int8 = validation_loss(gpt, &c, &o);
        if (!mlc_error(ctx)) {
            printf("int8 (%d linears quantized): validation loss float32 %.4f, int8 %.4f\n",
                   int8_modules(gpt), loss_float, loss_int8);
            sample(gpt, &c, &o, "And God said", 100);
        }
    }
    int status = mlc_error(ctx) != MLC_OK;
    if (status) fprintf(stderr, "error: %s\n", mlc_error_message(ctx));
    mlc_destroy(ctx);
    free(c.ids);
    return status;
}
