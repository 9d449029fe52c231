/* libFuzzer target for examples/minilm.c's JSON reader and tokenizer: each input is read as a
   tokenizer.json (any number of tokens), and tokenized as text (up to its first NUL byte) with
   the vocabulary it gave, else with a small fixed one. Any input must give a vocabulary or an
   error: never a crash, a hang, a leak, deep recursion or undefined behaviour.
     clang -g -O1 -fsanitize=fuzzer,address,undefined -I. tests/fuzz/fuzz_minilm_json.c -lm
     ./a.out tests/fuzz-corpus/minilm_json          (make fuzz FUZZ_SECONDS=60) */
#define MINILM_NO_MAIN
#include "../../examples/minilm.c"

static const char small_vocab[] =
    "{\"added_tokens\": [{\"id\": 5, \"content\": \"[MASK]\"}],\n"
    " \"model\": {\"type\": \"WordPiece\", \"vocab\": {\"[PAD]\": 0, \"[UNK]\": 1, \"[CLS]\": 2,"
    " \"[SEP]\": 3, \"a\": 4, \"[MASK]\": 5, \"##b\": 6, \"\\u00e9t\\u00e9\": 7, \"\\ud83d\\ude42\": 8,"
    " \"i\": 9, \"##\\u0307\": 10, \"!\": 11}}}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static vocab fixed;
    static int have_fixed;
    char *text = (char *)malloc(size + 1);
    int ids[64];
    vocab v;
    vocab_quiet = 1;
    if (!have_fixed) {
        if (!vocab_parse(&fixed, small_vocab, sizeof small_vocab - 1, -1, "small")) abort();
        have_fixed = 1;
    }
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    int ok = vocab_parse(&v, text, size, -1, "input");
    int n = tokenize(ok ? &v : &fixed, text, ids, 64);
    if (n < 2 || n > 64) abort();
    vocab_free(&v);
    free(text);
    return 0;
}
