#!/usr/bin/env python3
"""Prints the gzip test streams of tests/test_data.c as C arrays (python3 tools/gzip_vectors.py).

Made with Python's zlib (the library gzip itself uses): a stored block, a fixed-Huffman block,
a dynamic-Huffman block, a member with every optional header field (FEXTRA, FNAME, FCOMMENT,
FHCRC), a long output that crosses the 32 KiB window many times, and hand-made broken streams
(a Huffman code no symbol has, an over-subscribed code-length code, a match reaching before
the start, block type 3). Each is printed with the block types its first block has."""
import struct
import zlib

def deflate(data, level=9, strategy=zlib.Z_DEFAULT_STRATEGY):
    c = zlib.compressobj(level, zlib.DEFLATED, -15, 9, strategy)
    return c.compress(data) + c.flush()

def member(raw, data, flags=0, extra=b"", name=b"", comment=b""):
    head = bytearray(b"\x1f\x8b\x08" + bytes([flags]) + b"\0\0\0\0\0\xff")
    if flags & 4: head += struct.pack("<H", len(extra)) + extra
    if flags & 8: head += name + b"\0"
    if flags & 16: head += comment + b"\0"
    if flags & 2: head += struct.pack("<H", zlib.crc32(bytes(head)) & 0xffff)
    return bytes(head) + raw + struct.pack("<II", zlib.crc32(data), len(data) & 0xffffffff)

class Bits:
    """Deflate's bit order: values from their lowest bit; Huffman codes from their highest."""
    def __init__(self): self.bits = []
    def value(self, v, n): self.bits += [(v >> i) & 1 for i in range(n)]
    def code(self, c, n): self.bits += [(c >> (n - 1 - i)) & 1 for i in range(n)]
    def bytes(self):
        b = self.bits + [0] * (-len(self.bits) % 8)
        return bytes(sum(b[i + k] << k for k in range(8)) for i in range(0, len(b), 8))

def fixed_literal(w, byte):
    if byte < 144: w.code(0x30 + byte, 8)
    else: w.code(0x190 + byte - 144, 9)

def c_array(name, data, note):
    print(f"/* {note} ({len(data)} bytes) */")
    print(f"static const unsigned char {name}[] = {{")
    for i in range(0, len(data), 16):
        print("    " + ", ".join(f"0x{b:02x}" for b in data[i:i + 16]) + ",")
    print("};")

def block_type(raw): return (raw[0] >> 1) & 3

stored_text = b"A stored block: bytes as they are.\n"
raw = deflate(stored_text, 0); assert block_type(raw) == 0
c_array("gz_stored", member(raw, stored_text), "stored block: \"A stored block: bytes as they are.\\n\"")

fixed_text = b"fixed Huffman, fixed Huffman, fixed Huffman codes\n"
raw = deflate(fixed_text); assert block_type(raw) == 1
c_array("gz_fixed", member(raw, fixed_text), "fixed codes: \"fixed Huffman, fixed Huffman, fixed Huffman codes\\n\"")

dynamic_text = b"".join(b"%d squared is %d; %d cubed is %d.\n" % (i, i * i, i, i ** 3) for i in range(40))
raw = deflate(dynamic_text); assert block_type(raw) == 2
c_array("gz_dynamic", member(raw, dynamic_text), "dynamic codes: lines \"%d squared is %d; %d cubed is %d.\\n\", i = 0..39")

raw = deflate(fixed_text)
c_array("gz_all_fields", member(raw, fixed_text, 2 | 4 | 8 | 16, b"AB\x04\x00mlc!", b"fixed.txt", b"a comment"),
        "FHCRC, FEXTRA, FNAME and FCOMMENT around the fixed-code text")

# 100,000 bytes: a 3,000-byte pattern (letters from an LCG) repeated, so matches cross the
# window's end many times. The test makes the same bytes: x = (x * 1103515245 + 12345) mod 2^31,
# byte = 'a' + (x >> 16) % 4, for 3,000 bytes from x = 1, then over again.
x, pattern = 1, bytearray()
for _ in range(3000):
    x = (x * 1103515245 + 12345) % 2 ** 31
    pattern.append(ord("a") + (x >> 16) % 4)
long_data = bytes(pattern * 34)[:100000]
raw = deflate(long_data)
c_array("gz_long", member(raw, long_data), "100,000 bytes of a 3,000-byte pattern (see the test)")

# A dynamic block whose only literal/length code is end-of-block (one bit, 0), then the bit 1.
w = Bits(); w.value(1, 1); w.value(2, 2)
w.value(0, 5); w.value(0, 5); w.value(14, 4)         # 257 length codes, 1 distance code, 18 lengths
order = [16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15]
cl = {18: 1, 0: 2, 1: 2}                              # code-length code: 18 -> 0, 0 -> 10, 1 -> 11
for s in order[:18]: w.value(cl.get(s, 0), 3)
w.code(0, 1); w.value(138 - 11, 7); w.code(0, 1); w.value(118 - 11, 7)   # 256 zeros
w.code(3, 2)                                          # symbol 256 (end of block): length 1
w.code(3, 2)                                          # distance 0: length 1
w.code(1, 1)                                          # no symbol has the code 1
c_array("gz_bad_code", member(w.bytes(), b""), "a Huffman code no symbol has (the data's last byte)")

# The same, but the code-length code is over-subscribed (three codes of length 1).
w = Bits(); w.value(1, 1); w.value(2, 2); w.value(0, 5); w.value(0, 5); w.value(0, 4)
for s in order[:4]: w.value(1 if s in (16, 17, 18) else 0, 3)
c_array("gz_oversubscribed", member(w.bytes(), b""), "an over-subscribed code-length code")

# Fixed codes: the literal 'a', then a match of length 3 at distance 2 (only 1 byte written).
w = Bits(); w.value(1, 1); w.value(1, 2); fixed_literal(w, ord("a"))
w.code(1, 7); w.code(1, 5); w.code(0, 7)             # length 3 (257), distance 2 (code 1), end
c_array("gz_too_far", member(w.bytes(), b"a"), "a match 2 bytes back after 1 byte (distance too far)")

w = Bits(); w.value(1, 1); w.value(3, 2)
c_array("gz_type3", member(w.bytes(), b""), "block type 3 (reserved)")

# IDX files, gzipped: i16 [2, 3], and f64 [4100, 1] (32,812 bytes: a value is split where the
# window first fills, at byte 32,768) holding (i % 4) / 4.
idx = b"\0\0\x0b\x02" + struct.pack(">II", 2, 3) + struct.pack(">6h", -32768, -1, 0, 1, 300, 32767)
c_array("idx_i16_gz", member(deflate(idx), idx), "IDX i16 [2, 3]: -32768 -1 0 1 300 32767, gzipped")
idx = b"\0\0\x0e\x02" + struct.pack(">II", 4100, 1) + b"".join(struct.pack(">d", (i % 4) / 4) for i in range(4100))
c_array("idx_f64_gz", member(deflate(idx), idx), "IDX f64 [4100, 1]: (i % 4) / 4, gzipped")
