#!/usr/bin/env python3
"""tests/models/test_minilm.py - examples/minilm.c against the reference implementations, on the
real all-MiniLM-L6-v2 (make test-models runs it; sh tools/fetch_minilm.sh fetches the model).
    python3 tests/models/test_minilm.py BINARY MODEL_DIR DEVICE...
Token ids: equal to Hugging Face tokenizers' (PyPI package `tokenizers`, loading the model's
tokenizer.json) for every sentence below, truncated to 256 tokens (sentence-transformers'
max_seq_length) and to 128 (tokenizer.json's own setting).
Embeddings: BERT's forward written here in PyTorch (float32, one sentence at a time, no padding)
from the same model.safetensors, mean pooling and L2 normalisation, against minilm --full on each
DEVICE (which embeds in padded batches): cosine similarity >= 0.99999 per sentence, and every
value within MAX_DIFF.
int8 (minilm --int8, mlc_quantize_dynamic on the encoder's 36 linears), on the CPU: for every
sentence below and every line of bench/minilm_sentences.txt, the cosine with minilm's float32
embedding >= INT8_MIN_COSINE (the issue's target, 0.99), the sentences of 2 or 3 tokens included
([CLS] and [SEP] around at most one token: no mean over many tokens evens their rounding out,
so they are the worst); the bytes the example reports for the
linears, float32 and int8, equal to the count from model.safetensors' shapes (weight and bias;
int8 weight, a float32 scale per row, the bias), their ratio <= 0.27. Single-sentence latency,
int8 and float32, is printed, not checked.
Prints a PASS or FAIL line per check and ends with "N passed, M failed"; exits 1 on a failure."""
import json
import os
import struct
import subprocess
import sys

import numpy as np
import torch

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The new movie is awesome!!!",
    "Hello, world! (Isn't it?) -- \"quoted\" [brackets] {braces} <angles> a/b\\c @user #tag",
    "$3.50 + 20% = 4.20; 1,234,567.89 x 10^6 ~ e^{i*pi} | 3:45pm, 2024-01-31",
    "UPPER lower MiXeD CaSe iPhone McDonald's HTTP/2",
    "Crème brûlée, naïve café, résumé, Ångström, façade, jalapeño, Øresund, Straße, Ærø",
    "Ελληνικά: Καλημέρα κόσμε! Ά Έ Ή Ί Ό Ύ Ώ ΐ ΰ",
    "Русский текст: Привет, мир! Ёлка, Йод. Україна: Ґанок, Їжак.",
    "İstanbul'da ılık bir gün; Łódź, Kraków, Dvořák, Việt Nam, Nguyễn",
    "東京は日本の首都です。北京欢迎你！",
    "한국어 문장입니다. 안녕하세요?",
    "ひらがなとカタカナ：がぎぐげご、パピプペポ。",
    "Fullwidth: ＡＢＣ ｄｅｆ １２３ ！？",
    "Emoji 🙂👍🏽 and symbols ©®™ °C €£¥ §¶ • … — – “smart quotes” ‘single’ «guillemets»",
    "tabs\tand\nnewlines\r\nand  many   spaces",
    "zero\u200bwidth\u00adsoft\ufeffbom and control\u0007bell\u0085next",
    "Special tokens in text: [CLS] [SEP] [MASK] [PAD] [UNK] [cls] [MASK][MASK]",
    "supercalifragilisticexpialidocious antidisestablishmentarianism pneumonoultramicroscopic",
    "a" * 101 + " " + "b" * 100,
    "x",
    ".",
    "",
    "   ",
    "\t\n",
    " ".join(["The quick brown fox jumps over the lazy dog."] * 40),
    " ".join("word%d" % i for i in range(150)),
    "Combining: e\u0301 a\u0300 o\u0308 n\u0303 and decomposed Cyrillic и\u0306",
]


INT8_MIN_COSINE = 0.99          # the target for every test sentence
INT8_MAX_BYTES_RATIO = 0.27
BENCH_SENTENCES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench",
                               "minilm_sentences.txt")

# Beyond the cosine, every value must be within MAX_DIFF (the embeddings have unit length, values
# around 0.05): a GELU with the tanh approximation instead of erf still has cosine 1 - 2e-6 but
# differs by up to 3e-4 (this run: 2e-7).
MAX_DIFF = 2e-5


def safetensors_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))


def load_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__" or info["dtype"] != "F32":
            continue
        begin, end = info["data_offsets"]
        a = np.frombuffer(data, dtype="<f4", count=(end - begin) // 4, offset=8 + n + begin)
        out[name] = torch.from_numpy(a.copy()).reshape(info["shape"])
    return out


def bert_embed(w, ids, mask):
    """BertModel's forward (eval), mean pooling over the mask, L2 normalisation: ids (int64) and
    mask (float, 1 on tokens) [B, T] -> [B, 384]; bench/torch_bench.py uses it too"""
    ln = lambda x, p: torch.nn.functional.layer_norm(x, (384,), w[p + ".weight"], w[p + ".bias"], 1e-12)
    lin = lambda x, p: x @ w[p + ".weight"].T + w[p + ".bias"]
    b, t = ids.shape
    heads = lambda y: y.reshape(b, t, 12, 32).transpose(1, 2)
    x = (w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:t] +
         w["embeddings.token_type_embeddings.weight"][0])
    x = ln(x, "embeddings.LayerNorm")
    bias = (1.0 - mask)[:, None, None, :] * -1e9
    for i in range(6):
        p = "encoder.layer.%d." % i
        q, k, v = (heads(lin(x, p + "attention.self." + n)) for n in ("query", "key", "value"))
        a = torch.softmax(q @ k.transpose(2, 3) / 32 ** 0.5 + bias, dim=-1) @ v
        a = a.transpose(1, 2).reshape(b, t, 384)
        x = ln(x + lin(a, p + "attention.output.dense"), p + "attention.output.LayerNorm")
        h = torch.nn.functional.gelu(lin(x, p + "intermediate.dense"))
        x = ln(x + lin(h, p + "output.dense"), p + "output.LayerNorm")
    e = (x * mask[:, :, None]).sum(1) / mask.sum(1, keepdim=True).clamp(min=1e-9)
    return e / e.norm(dim=1, keepdim=True).clamp(min=1e-12)


def run(binary, args, sentences=SENTENCES):
    try:
        r = subprocess.run([binary] + args + ["--"] + sentences, capture_output=True, timeout=600)
    except subprocess.TimeoutExpired:
        return None, "timed out after 600 s"
    if r.returncode != 0:
        return None, r.stderr.decode(errors="replace")
    return r.stdout.decode(), ""


def embeddings(out):
    """minilm --full's output -> {sentence index: embedding}"""
    got = {}
    for line in (out or "").splitlines():
        if line.startswith("emb "):
            head, _, rest = line.partition(":")
            got[int(head.split()[1])] = np.array([float(x) for x in rest.split()])
    return got


def weight_bytes(out):
    """the linears' bytes from minilm's "Weights:" line: (bytes, float32 bytes or None)"""
    for line in (out or "").splitlines():
        if line.startswith("Weights: float32 (the linears: "):
            return int(line.split()[-2]), None
        if line.startswith("Weights: the linears int8"):
            words = line.replace(",", "").split()
            return int(words[words.index("bytes") - 1]), int(words[words.index("float32") + 1])
    return None, None


def check_int8(binary, model, tok, check):
    """minilm --int8 against minilm's float32, on the CPU (see the docstring)"""
    with open(BENCH_SENTENCES, encoding="utf-8") as f:
        sentences = SENTENCES + [line.rstrip("\n") for line in f]
    tok.enable_truncation(max_length=256)
    tokens = [len(tok.encode(s).ids) for s in sentences]
    header = safetensors_header(model + "/model.safetensors")     # the linears' float32 and int8 bytes
    want_float = want_int8 = 0
    for name, info in header.items():
        if name.startswith("encoder.layer.") and name.endswith(".weight") and len(info["shape"]) == 2:
            rows, cols = info["shape"]
            want_float += 4 * (rows * cols + rows)
            want_int8 += rows * cols + 4 * rows + 4 * rows
    outs = {}
    for label, args in (("float32", []), ("int8", ["--int8"])):
        out, err = run(binary, ["--model", model, "--full", "--batch", "4", "--device", "cpu"] + args,
                       sentences)
        check(out is not None, "minilm %s runs on %d sentences%s" % (
            label, len(sentences), "" if out else ": " + err[-300:]))
        outs[label] = out
    f32, q8 = embeddings(outs["float32"]), embeddings(outs["int8"])
    worst, worst_short = 1.0, 1.0
    for i, s in enumerate(sentences):
        a, b = f32.get(i), q8.get(i)
        cos = float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b))) \
            if a is not None and b is not None and a.shape == b.shape == (384,) else float("nan")
        short = tokens[i] <= 3
        floor = INT8_MIN_COSINE
        if short:
            worst_short = min(worst_short, cos) if cos == cos else float("nan")
        else:
            worst = min(worst, cos) if cos == cos else float("nan")
        check(cos >= floor, "int8 vs float32, sentence %d (%d tokens) %r: cosine %.5f (>= %g%s)" % (
            i, tokens[i], s[:40], cos, floor, ", 2 or 3 tokens" if short else ""))
    print("int8 vs float32: worst cosine %.5f over %d sentences of 4 tokens or more, %.5f over %d of 2 or 3"
          % (worst, sum(t > 3 for t in tokens), worst_short, sum(t <= 3 for t in tokens)))
    got_float, _ = weight_bytes(outs["float32"])
    got_int8, got_int8_float = weight_bytes(outs["int8"])
    check(got_float == want_float and got_int8_float == want_float and got_int8 == want_int8,
          "the linears' bytes as minilm reports them: float32 %s and %s, int8 %s; from the file's shapes "
          "%d and %d" % (got_float, got_int8_float, got_int8, want_float, want_int8))
    ratio = got_int8 / got_float if got_int8 and got_float else float("nan")
    check(ratio <= INT8_MAX_BYTES_RATIO,
          "int8 / float32 bytes of the linears %.4f (<= %g)" % (ratio, INT8_MAX_BYTES_RATIO))
    medians = {}
    for label, args in (("float32", []), ("int8", ["--int8"])):        # reported, not checked
        out, _ = run(binary, ["--model", model, "--device", "cpu", "--bench", "20"] + args, [sentences[0]])
        for line in (out or "").splitlines():
            if line.startswith("bench:"):
                medians[label] = 1.0 / float(line.split()[-2])
    if len(medians) == 2:
        f, q = medians["float32"], medians["int8"]
        print("single-sentence latency (%r, %d tokens, median of 20): float32 %.1f ms, int8 %.1f ms, "
              "int8 / float32 %.2fx (mlc_gemm_i8's kernel decides; not checked)"
              % (sentences[0], tokens[0], 1e3 * f, 1e3 * q, q / f))


def main():
    binary, model, devices = sys.argv[1], sys.argv[2], sys.argv[3:]
    passed = failed = 0

    def check(ok, what):
        nonlocal passed, failed
        print("%s %s" % ("PASS" if ok else "FAIL", what))
        passed, failed = passed + ok, failed + (not ok)

    from tokenizers import Tokenizer     # PyPI's tokenizers: needed by the test, not by the bench
    tok = Tokenizer.from_file(model + "/tokenizer.json")
    tok.no_padding()
    reference_ids = {}
    for max_len in (256, 128):
        tok.enable_truncation(max_length=max_len)
        ref = [tok.encode(s).ids for s in SENTENCES]
        reference_ids[max_len] = ref
        out, err = run(binary, ["--model", model, "--ids", "--max-len", str(max_len)])
        got = {}
        for line in (out or "").splitlines():
            head, _, rest = line.partition(":")
            got[int(head.split()[1])] = [int(x) for x in rest.split()]
        for i, s in enumerate(SENTENCES):
            ok = got.get(i) == ref[i]
            check(ok, "token ids, max %d, sentence %d (%d tokens) %r%s" % (
                max_len, i, len(ref[i]), s[:40],
                "" if ok else ": tokenizers %s, minilm %s %s" % (ref[i], got.get(i), err)))

    torch.set_num_threads(1)
    w = load_safetensors(model + "/model.safetensors")
    with torch.no_grad():
        reference = [bert_embed(w, torch.tensor([ids]), torch.ones(1, len(ids)))[0].numpy().astype(np.float64)
                     for ids in reference_ids[256]]
    for device in devices:
        out, err = run(binary, ["--model", model, "--full", "--batch", "4", "--device", device])
        if out is None and "no OpenCL platform" in err:
            print("SKIPPED embeddings on %s: no OpenCL platform or device (install pocl-opencl-icd)" % device)
            if os.environ.get("CI") == "true":
                check(False, "CI=true: the %s run may not be skipped in CI" % device)
            continue
        got = embeddings(out)
        worst, worst_diff = 1.0, 0.0
        for i, s in enumerate(SENTENCES):
            e = got.get(i)
            cos = float(np.dot(e, reference[i]) / (np.linalg.norm(e) * np.linalg.norm(reference[i]))) \
                if e is not None and e.shape == (384,) else float("nan")
            worst = min(worst, cos) if cos == cos else float("nan")
            diff = float(np.abs(e - reference[i]).max()) if e is not None and e.shape == (384,) else float("nan")
            check(cos >= 0.99999 and diff <= MAX_DIFF, "embedding on %s, sentence %d %r: cosine %.7f, max |diff| %.1e%s" % (
                device, i, s[:40], cos, diff, "" if e is not None else " (no output: %s)" % err.strip()[-300:]))
            worst_diff = max(worst_diff, diff) if diff == diff else float("nan")
        print("worst on %s: cosine similarity 1 - %.1e, max |difference| %.1e" % (device, 1 - worst, worst_diff))
    check_int8(binary, model, tok, check)
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
