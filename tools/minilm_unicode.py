#!/usr/bin/env python3
"""tools/minilm_unicode.py - write examples/minilm_unicode.h, the Unicode tables of the BERT
tokenizer in examples/minilm.c, from the Unicode Character Database over every code point:
    python3 tools/minilm_unicode.py [UCD_DIR] > examples/minilm_unicode.h
UCD_DIR (default /usr/share/unicode, Debian's unicode-data: Unicode 15.0) must hold
UnicodeData.txt, DerivedAge.txt and SpecialCasing.txt.

The reference, Hugging Face tokenizers (BertNormalizer, BertPreTokenizer), takes its Unicode from
three places, each pinned to its own version; the tables follow each:
  - general categories (punctuation P*, nonspacing marks Mn, "other" Cc Cf Co) from the crate
    unicode_categories, Unicode 8.0: a category here is the UCD's for a code point assigned by
    Unicode 8.0 (DerivedAge), unassigned (Cn) otherwise, except the few code points whose
    category Unicode changed after 8.0 (CHANGED_SINCE_8 below: their 8.0 category);
  - canonical decomposition (NFD, for accent stripping) from unicode-normalization-alignments,
    which has no decomposition of a character assigned after Unicode 9.0 (DECOMPOSITION_AGE);
  - lowercase from Rust's char::to_lowercase (the full mapping, SpecialCasing's unconditional
    entries included: U+0130 becomes i + U+0307), Unicode 16.0: the UCD's mappings plus those
    Unicode 16.0 added (UNICODE_16_LOWER below, until UCD_DIR is 16.0 or later).
Hangul syllables decompose by rule in minilm.c, and the CJK ideograph blocks and whitespace are
fixed lists there. `make test-models` compares every code point's tokens with tokenizers'
(tests/models/test_minilm_unicode.py)."""
import os
import sys

UCD = sys.argv[1] if len(sys.argv) > 1 else "/usr/share/unicode"
CATEGORY_AGE = (8, 0)
DECOMPOSITION_AGE = (9, 0)
# Unicode 8.0's category of the code points whose category a later version changed (those that
# matter here: into or out of P*, Mn, Cc, Cf, Co)
CHANGED_SINCE_8 = {
    0x166D: "Po",   # CANADIAN SYLLABICS CHI SIGN: So since 12.0
    0x111C9: "Po",  # SHARADA SANDHI MARK: Mn since 9.0
    0x1734: "Mn",   # HANUNOO SIGN PAMUDPOD: Mc since 14.0
    0x1885: "Lo",   # MONGOLIAN LETTER ALI GALI BALUDA: Mn since 9.0
    0x1886: "Lo",   # MONGOLIAN LETTER ALI GALI THREE BALUDA: Mn since 9.0
    0xA9BD: "Mc",   # JAVANESE CONSONANT SIGN KERET: Mn since 12.0
}
# simple lowercase mappings new in Unicode 16.0: (first, last, delta)
UNICODE_16_LOWER = [
    (0x1C89, 0x1C89, 1), (0xA7CB, 0xA7CB, 0x0264 - 0xA7CB), (0xA7CC, 0xA7CC, 1), (0xA7CE, 0xA7CE, 1),
    (0xA7D2, 0xA7D2, 1), (0xA7D4, 0xA7D4, 1), (0xA7DA, 0xA7DA, 1), (0xA7DC, 0xA7DC, 0x019B - 0xA7DC),
    (0x10D50, 0x10D65, 0x20),      # Garay
    (0x16EA0, 0x16EB8, 0x1B),      # Kirat Rai
]


def lines(name):
    with open(os.path.join(UCD, name), encoding="utf-8") as f:
        for line in f:
            line = line.split("#")[0].strip()
            if line:
                yield [x.strip() for x in line.split(";")]


def code_range(text):
    a, _, b = text.partition("..")
    return range(int(a, 16), int(b or a, 16) + 1)


def load():
    cat, decomp, lower, ccc = {}, {}, {}, {}
    first = None
    for f in lines("UnicodeData.txt"):
        c = int(f[0], 16)
        if f[1].endswith(", First>"):
            first = c
            continue
        for x in range(first if f[1].endswith(", Last>") else c, c + 1):
            cat[x] = f[2]
            if int(f[3]):
                ccc[x] = int(f[3])
        first = None
        if f[5] and not f[5].startswith("<"):
            decomp[c] = [int(x, 16) for x in f[5].split()]
        if f[13]:
            lower[c] = [int(f[13], 16)]
    age = {}
    for f in lines("DerivedAge.txt"):
        v = tuple(int(x) for x in f[1].split("."))
        for c in code_range(f[0]):
            age[c] = v
    for f in lines("SpecialCasing.txt"):
        if len(f) > 4 and f[4]:
            continue                      # conditional (final sigma, languages): not char::to_lowercase
        lower[int(f[0], 16)] = [int(x, 16) for x in f[1].split()]
    version = max(age.values())
    if version < (16, 0):
        for lo, hi, d in UNICODE_16_LOWER:
            for c in range(lo, hi + 1):
                lower[c] = [c + d]
    return cat, decomp, lower, ccc, age, version


CAT, DECOMP, LOWER, CCC, AGE, VERSION = load()
CODES = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]


def category(c):
    """the category unicode_categories (Unicode 8.0) gives c"""
    if c in CHANGED_SINCE_8:
        return CHANGED_SINCE_8[c]
    return CAT.get(c, "Cn") if AGE.get(c, (99,)) <= CATEGORY_AGE else "Cn"


def nfd(c):
    """c's full canonical decomposition, as unicode-normalization-alignments has it (no Hangul:
    minilm.c decomposes syllables by rule)"""
    if c in DECOMP and AGE.get(c, (99,)) <= DECOMPOSITION_AGE:
        return [y for x in DECOMP[c] for y in nfd(x)]
    return [c]


def ranges(pred):
    """[first, last] runs of the code points where pred holds"""
    out = []
    for c in CODES:
        if pred(c):
            if out and out[-1][1] == c - 1:
                out[-1][1] = c
            else:
                out.append([c, c])
    return out


def lower_runs():
    """[first, last, delta, stride]: c in first..last (every stride-th) lowercases to c + delta
    (single characters; U+0130, the one longer mapping, is minilm.c's)"""
    out = []
    for c in CODES:
        low = LOWER.get(c, [c])
        if len(low) != 1:
            assert c == 0x130 and low == [0x69, 0x307], hex(c)
            continue
        if low[0] == c:
            continue
        d = low[0] - c
        if out and out[-1][2] == d and (c - out[-1][1] == out[-1][3] or
                                        (out[-1][0] == out[-1][1] and c - out[-1][1] == 2)):
            out[-1][3] = c - out[-1][1]
            out[-1][1] = c
        else:
            out.append([c, c, d, 1])
    return out


def stripped(c):
    """NFD with the nonspacing marks dropped"""
    return [x for x in nfd(c) if category(x) != "Mn"]


CJK_COMPAT = [(0xF900, 0xFAFF), (0x2F800, 0x2FA1F)]   # compatibility ideographs: NFD one by one


def in_cjk_compat(c):
    return any(lo <= c <= hi for lo, hi in CJK_COMPAT)


def cjk_compat():
    """([first, last] of each block, trimmed to its decomposing code points), and the ideograph
    each code point of them decomposes to (0: none), block after block"""
    blocks, targets = [], []
    for lo, hi in CJK_COMPAT:
        mapped = [c for c in range(lo, hi + 1) if stripped(c) != [c]]
        first, last = min(mapped), max(mapped)
        blocks.append([first, last])
        for c in range(first, last + 1):
            base = stripped(c)
            assert len(base) == 1, hex(c)
            targets.append(0 if base == [c] else base[0])
    return blocks, targets


def strip_runs():
    """[first, last, even, odd]: NFD with the nonspacing marks dropped maps c to one character,
    even or odd (by c - first); the CJK compatibility ideographs are cjk_compat's"""
    out = []
    for c in CODES:
        base = stripped(c)
        if category(c) == "Mn" or base == [c] or len(base) != 1 or in_cjk_compat(c):
            continue
        b = base[0]
        if out and out[-1][1] == c - 1:
            first, _, even, odd = out[-1]
            k = (c - first) % 2
            if odd is None and k == 1:
                out[-1][1], out[-1][3] = c, b
                continue
            if (even if k == 0 else odd) == b:
                out[-1][1] = c
                continue
        out.append([c, c, b, None])
    for r in out:
        if r[3] is None:
            r[3] = r[2]
    return out


def strip_many():
    """[c, first, second, third or 0]: the characters that NFD without marks makes two or three"""
    out = []
    for c in CODES:
        base = stripped(c)
        if category(c) != "Mn" and len(base) > 1:
            assert len(base) <= 3, hex(c)
            out.append([c] + base + [0] * (3 - len(base)))
    return out


def ccc_ranges():
    """[first, last, class]: the nonzero canonical combining classes of characters that are not
    nonspacing marks (canonical ordering sorts them; the marks are dropped anyway)"""
    out = []
    for c in CODES:
        k = CCC.get(c, 0) if category(c) != "Mn" and AGE.get(c, (99,)) <= DECOMPOSITION_AGE else 0
        if not k:
            continue
        if out and out[-1][1] == c - 1 and out[-1][2] == k:
            out[-1][1] = c
        else:
            out.append([c, c, k])
    return out


def check():
    """what minilm.c relies on: no decomposition makes a mark-free character that decomposes or
    lowercases further into more than one; the non-mark characters with a nonzero combining class
    that canonical ordering moves are few (ccc_ranges)"""
    for c in CODES:
        for x in stripped(c):
            assert len(LOWER.get(x, [x])) == 1 or x == c, hex(c)


def emit(name, rows, what):
    print("/* %s (%d rows) */" % (what, len(rows)))
    print("static const %s %s[][%d] = {" % ("int32_t" if name == "lower_runs" else "uint32_t", name,
                                             len(rows[0])))
    line = "   "
    for r in rows:
        item = " {" + ", ".join("0x%04X" % v if v >= 0 and (name != "lower_runs" or i < 2) else "%d" % v
                                for i, v in enumerate(r)) + "},"
        if len(line) + len(item) > 108:
            print(line)
            line = "   "
        line += item
    print(line)
    print("};")


check()
print("/* minilm_unicode.h - Unicode tables of the BERT tokenizer in minilm.c, written by")
print("   tools/minilm_unicode.py from the Unicode %s data, as Hugging Face tokenizers pins it: categories"
      % ".".join(map(str, VERSION)))
print("   of Unicode %d.%d, decompositions of characters of Unicode %d.%d, lowercase of Unicode 16.0."
      % (CATEGORY_AGE + DECOMPOSITION_AGE))
print("   Every code point, all planes. Do not edit by hand. */")
print("#include <stdint.h>")
emit("other_ranges", ranges(lambda c: category(c) in ("Cc", "Cf", "Co")),
     "\"other\" characters, which clean_text drops (Cc Cf Co): first, last")
emit("punct_ranges", ranges(lambda c: category(c).startswith("P")),
     "punctuation (categories Pc Pd Ps Pe Pi Pf Po): first, last")
emit("mark_ranges", ranges(lambda c: category(c) == "Mn"),
     "nonspacing marks (Mn), dropped when accents are stripped: first, last")
emit("strip_runs", strip_runs(),
     "accent stripping: NFD, marks dropped: first, last, base at even offsets, base at odd ones")
blocks, targets = cjk_compat()
emit("cjk_compat_blocks", blocks, "CJK compatibility ideographs that NFD maps: first, last of each block")
print("/* the ideograph each of them maps to (0: itself), block after block (%d) */" % len(targets))
print("static const uint32_t cjk_compat[] = {")
for i in range(0, len(targets), 11):
    print("    " + " ".join("0x%05X," % t for t in targets[i:i + 11]))
print("};")
emit("strip_many", strip_many(),
     "accent stripping into two or three characters: code point, first, second, third (or 0)")
emit("ccc_ranges", ccc_ranges(),
     "nonzero canonical combining class of characters kept by stripping: first, last, class")
emit("lower_runs", lower_runs(),
     "lowercase: first, last, delta, stride (first, first + stride, ... map to c + delta)")
