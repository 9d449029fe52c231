#!/usr/bin/env python3
"""tests/models/test_minilm_unicode.py - the tokenizer of examples/minilm.c against Hugging Face
tokenizers (PyPI's `tokenizers`, loading the model's tokenizer.json) over every code point:
    python3 tests/models/test_minilm_unicode.py BINARY MODEL_DIR
Each code point but NUL and newline (which cannot be in a line of --file) is tokenized alone, and
again between two letters ("a" c "b": does it join a word, split it, or vanish?), by
`minilm --ids --file` and by tokenizers; every difference is a failure. Prints the first
differences, a PASS or FAIL line per scan, and "N passed, M failed"; exits 1 on a failure.
Needs only tokenizers (no PyTorch, no model weights): tokenizer.json."""
import os
import subprocess
import sys
import tempfile

SCANS = [("alone", "%s"), ("between letters", "a%sb")]
SHOW = 20


def code_points():
    return [c for c in range(0x110000) if c not in (0, 0x0A) and not 0xD800 <= c <= 0xDFFF]


def minilm_ids(binary, model, texts):
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", suffix=".txt", delete=False) as f:
        f.write("\n".join(texts) + "\n")
        path = f.name
    try:
        r = subprocess.run([binary, "--model", model, "--ids", "--max-len", "512", "--file", path],
                           capture_output=True, timeout=1200)
    finally:
        os.unlink(path)
    if r.returncode != 0:
        return None, r.stderr.decode(errors="replace")
    got = {}
    for line in r.stdout.decode().splitlines():
        head, _, rest = line.partition(":")
        got[int(head.split()[1])] = [int(x) for x in rest.split()]
    return got, ""


def main():
    binary, model = sys.argv[1], sys.argv[2]
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(model, "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(max_length=512)
    cps = code_points()
    passed = failed = 0
    for name, form in SCANS:
        texts = [form % chr(c) for c in cps]
        ref = [e.ids for e in tok.encode_batch(texts)]
        got, err = minilm_ids(binary, model, texts)
        if got is None:
            print("FAIL every code point %s: minilm failed: %s" % (name, err.strip()[-500:]))
            failed += 1
            continue
        bad = [i for i in range(len(cps)) if got.get(i) != ref[i]]
        for i in bad[:SHOW]:
            print("  U+%04X %s: tokenizers %s, minilm %s" % (cps[i], name, ref[i], got.get(i)))
        ok = not bad
        print("%s every code point %s: %d of %d tokenize differently" % (
            "PASS" if ok else "FAIL", name, len(bad), len(cps)))
        passed, failed = passed + ok, failed + (not ok)
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
