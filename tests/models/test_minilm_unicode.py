#!/usr/bin/env python3
"""tests/models/test_minilm_unicode.py - the tokenizer of examples/minilm.c against Hugging Face
tokenizers (PyPI's `tokenizers`, loading the model's tokenizer.json) over every code point:
    python3 tests/models/test_minilm_unicode.py BINARY MODEL_DIR
Each code point but NUL and newline (which cannot be in a line of --file) is tokenized alone, and
again between two letters ("a" c "b": does it join a word, split it, or vanish?), by
`minilm --ids --file` and by tokenizers; then 50,000 seeded random strings of 1 to 10 code points,
a third of them marks (canonical ordering, several marks on one base, decompositions into two or
three characters). Every difference is a failure. Prints the first
differences, a PASS or FAIL line per scan, and "N passed, M failed"; exits 1 on a failure.
Where /usr/share/unicode holds the Unicode data the header was written from, the header must also
be the generator's output (a SKIPPED line otherwise).
Needs only tokenizers (no PyTorch, no model weights): tokenizer.json."""
import os
import random
import subprocess
import sys
import tempfile

SCANS = [("every code point alone", "%s"), ("every code point between letters", "a%sb")]
SHOW = 20
MAX_LEN = 64            # tokens a text, [CLS] and [SEP] included: more than any text here has


def code_points():
    return [c for c in range(0x110000) if c not in (0, 0x0A) and not 0xD800 <= c <= 0xDFFF]


def random_strings(cps, n=50000, seed=1):
    """n strings of 1 to 10 code points: marks, characters that decompose or lowercase into more
    than one, Latin, and any code point"""
    import unicodedata
    rng = random.Random(seed)
    marks = [c for c in cps if unicodedata.category(chr(c)) in ("Mn", "Mc", "Me")]
    odd = [0x1D165, 0x1D16D, 0x1D16E, 0x1D15E, 0x1D160, 0x0130, 0x0345, 0x0F73, 0x09CB, 0x2260, 0xAC00,
           0xF900, 0x2F800, 0x3099, 0x302E, 0x0344, 0x1E9B]

    def pick():
        r = rng.random()
        return (rng.choice(marks) if r < 0.3 else rng.choice(odd) if r < 0.5 else
                rng.randrange(0x20, 0x250) if r < 0.7 else rng.choice(cps))
    return ["".join(chr(pick()) for _ in range(rng.randint(1, 10))) for _ in range(n)]


def minilm_ids(binary, model, texts, chunk=100000):
    """minilm --ids on texts, CHUNK lines a run (each run holds every sentence's buffers)"""
    got = {}
    for first in range(0, len(texts), chunk):
        with tempfile.NamedTemporaryFile("w", encoding="utf-8", suffix=".txt", delete=False) as f:
            f.write("\n".join(texts[first:first + chunk]) + "\n")
            path = f.name
        try:
            r = subprocess.run([binary, "--model", model, "--ids", "--max-len", str(MAX_LEN), "--file", path],
                               capture_output=True, timeout=600)
        finally:
            os.unlink(path)
        if r.returncode != 0:
            return None, r.stderr.decode(errors="replace")
        for line in r.stdout.decode().splitlines():
            head, _, rest = line.partition(":")
            got[first + int(head.split()[1])] = [int(x) for x in rest.split()]
    return got, ""


def header_is_generated():
    """examples/minilm_unicode.h is tools/minilm_unicode.py's output, where the Unicode data it was
    written from (named in its first lines) is at /usr/share/unicode (Debian's unicode-data);
    None where it is not"""
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    with open(os.path.join(root, "examples", "minilm_unicode.h"), encoding="utf-8") as f:
        header = f.read()
    age = "/usr/share/unicode/DerivedAge.txt"
    if not os.path.exists(age):
        return None
    with open(age, encoding="utf-8") as f:
        first = f.readline()                     # "# DerivedAge-15.0.0.txt"
    version = first.split("-")[-1].rsplit(".", 2)[0] if "-" in first else ""
    if "Unicode %s data" % version not in header.split("*/")[0]:
        return None
    r = subprocess.run([sys.executable, os.path.join(root, "tools", "minilm_unicode.py")],
                       capture_output=True)
    return r.returncode == 0 and r.stdout.decode("utf-8") == header


def main():
    binary, model = sys.argv[1], sys.argv[2]
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(model, "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(max_length=MAX_LEN)
    cps = code_points()
    passed = failed = 0
    scans = [(name, [form % chr(c) for c in cps], cps) for name, form in SCANS]
    strings = random_strings(cps)
    scans.append(("seeded random strings", strings, strings))
    for name, texts, labels in scans:
        ref = [e.ids for e in tok.encode_batch(texts)]
        got, err = minilm_ids(binary, model, texts)
        if got is None:
            print("FAIL %s: minilm failed: %s" % (name, err.strip()[-500:]))
            failed += 1
            continue
        bad = [i for i in range(len(texts)) if got.get(i) != ref[i]]
        for i in bad[:SHOW]:
            what = " ".join("U+%04X" % ord(x) for x in texts[i]) if isinstance(labels[i], str) else \
                "U+%04X" % labels[i]
            print("  %s %s: tokenizers %s, minilm %s" % (what, name, ref[i], got.get(i)))
        ok = not bad
        print("%s %s: %d of %d tokenize differently" % (
            "PASS" if ok else "FAIL", name, len(bad), len(texts)))
        passed, failed = passed + ok, failed + (not ok)
    same = header_is_generated()
    if same is None:
        print("SKIPPED examples/minilm_unicode.h against its generator: not the Unicode data it names in "
              "/usr/share/unicode (apt install unicode-data)")
    else:
        print("%s examples/minilm_unicode.h is tools/minilm_unicode.py's output" %
              ("PASS" if same else "FAIL"))
        passed, failed = passed + same, failed + (not same)
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
