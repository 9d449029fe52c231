#!/usr/bin/env python3
"""tools/minilm_unicode.py - write examples/minilm_unicode.h, the Unicode tables of the BERT
tokenizer in examples/minilm.c, from Python's unicodedata:
    python3 tools/minilm_unicode.py > examples/minilm_unicode.h
Covered blocks (COVERED below): Latin (Basic, Latin-1, Extended-A/B, IPA, Extended Additional,
C, D), Greek and Coptic, Greek Extended, Cyrillic (and Supplement), the combining-mark blocks,
General Punctuation, Letterlike Symbols, CJK Symbols and Punctuation, Hiragana, Katakana and the
halfwidth/fullwidth forms. Outside them a character is never lowercased, decomposed or taken
for punctuation (Hangul syllables are decomposed by rule in minilm.c)."""
import sys
import unicodedata as ud

COVERED = [(0x0000, 0x052F), (0x1AB0, 0x1AFF), (0x1DC0, 0x1FFF), (0x2000, 0x206F),
           (0x20D0, 0x20FF), (0x2100, 0x214F), (0x2C60, 0x2C7F), (0x3000, 0x30FF),
           (0xA720, 0xA7FF), (0xFE20, 0xFE2F), (0xFF00, 0xFFEF)]
CODES = [c for lo, hi in COVERED for c in range(lo, hi + 1)]


def ranges(pred):
    """[first, last] runs of the covered code points where pred holds"""
    out = []
    for c in CODES:
        if pred(c):
            if out and out[-1][1] == c - 1:
                out[-1][1] = c
            else:
                out.append([c, c])
    return out


def lower_runs():
    """[first, last, delta, stride]: c in first..last (every stride-th) lowercases to c + delta"""
    out = []
    for c in CODES:
        low = chr(c).lower()
        if len(low) != 1 or low == chr(c):
            continue
        d = ord(low) - c
        if out and out[-1][2] == d and (c - out[-1][1] == out[-1][3] or
                                        (out[-1][0] == out[-1][1] and c - out[-1][1] == 2)):
            out[-1][3] = c - out[-1][1]
            out[-1][1] = c
        else:
            out.append([c, c, d, 1])
    return out


def strip_runs():
    """[first, last, even, odd]: NFD with the nonspacing marks (Mn) dropped maps c to even or odd
    (by c - first), one character in every covered case"""
    out = []
    for c in CODES:
        if ud.category(chr(c)) == 'Mn':
            continue
        base = ''.join(x for x in ud.normalize('NFD', chr(c)) if ud.category(x) != 'Mn')
        if base == chr(c):
            continue
        assert len(base) == 1, hex(c)
        b = ord(base)
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


def emit(name, ctype, rows, what):
    print("/* %s (%d rows) */" % (what, len(rows)))
    print("static const %s %s[][%d] = {" % (ctype, name, len(rows[0])))
    line = "   "
    for r in rows:
        item = " {" + ", ".join("0x%04X" % v if v >= 0 and i < 2 or ctype == 'uint16_t' else "%d" % v
                                for i, v in enumerate(r)) + "},"
        if len(line) + len(item) > 106:
            print(line)
            line = "   "
        line += item
    print(line)
    print("};")


print("/* minilm_unicode.h - Unicode tables of the BERT tokenizer in minilm.c (Unicode %s), written"
      % ud.unidata_version)
print("   by tools/minilm_unicode.py; see there for the blocks covered. Do not edit by hand. */")
print("#include <stdint.h>")
emit("punct_ranges", "uint16_t", ranges(lambda c: ud.category(chr(c)).startswith('P')),
     "punctuation (categories Pc Pd Ps Pe Pi Pf Po): first, last")
emit("mark_ranges", "uint16_t", ranges(lambda c: ud.category(chr(c)) == 'Mn'),
     "nonspacing marks (Mn), dropped when accents are stripped: first, last")
emit("strip_runs", "uint16_t", strip_runs(),
     "accent stripping: NFD, marks dropped: first, last, base at even offsets, base at odd ones")
emit("lower_runs", "int32_t", lower_runs(),
     "lowercase: first, last, delta, stride (first, first + stride, ... map to c + delta)")
