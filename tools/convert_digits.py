#!/usr/bin/env python3
"""Convert the UCI handwritten digits CSV into mlc's compact data/digits.bin.

Usage:
    python3 tools/convert_digits.py [input.csv.gz] [output.bin]

Defaults:
    input   /usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz
            (Debian's python3-sklearn copy of the UCI "Optical Recognition of
            Handwritten Digits" data set, 8x8 version)
    output  data/digits.bin (relative to the repository root, not the cwd)

Input: gzip-compressed CSV, one sample per line, 65 comma-separated integers:
64 pixel values 0..16 (row-major 8x8 image) followed by the label 0..9.

Output layout (all integers little-endian):
    offset 0   8 bytes   magic b"MLCDIGT1"
    offset 8   uint32    N, number of samples (1797)
    offset 12  uint32    rows (8)
    offset 16  uint32    cols (8)
    offset 20  N records of 65 bytes: 64 pixel bytes (0..16), 1 label byte (0..9),
               in the order of the CSV.

Only the Python 3 standard library is used.  Every value is validated; on any
problem the script exits with status 1 and a message naming the line, and no
output file is written (the output is written to a temporary file and renamed).
"""

import csv
import gzip
import hashlib
import io
import os
import struct
import sys

DEFAULT_INPUT = "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz"
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUTPUT = os.path.join(REPO_ROOT, "data", "digits.bin")

MAGIC = b"MLCDIGT1"
ROWS = 8
COLS = 8
PIXELS = ROWS * COLS
MAX_PIXEL = 16
NUM_CLASSES = 10
EXPECTED_COUNT = 1797
TRAIN_COUNT = 1500  # fixed split used by the examples: first 1500 train, rest test


class ConvertError(Exception):
    pass


def parse_int(text, where):
    tok = text.strip()
    # Plain decimal integers only (no sign, no decimal point, no exponent).
    if not tok or not tok.isascii() or not tok.isdigit():
        raise ConvertError("%s: value %r is not a non-negative integer" % (where, text))
    return int(tok)


def read_samples(path):
    try:
        with gzip.open(path, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        raise ConvertError("%s: file not found" % path)
    except (OSError, EOFError) as exc:
        raise ConvertError("%s: cannot read gzip data: %s" % (path, exc))
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError as exc:
        raise ConvertError("%s: not ASCII text (byte offset %d in decompressed data)"
                           % (path, exc.start))

    samples = []
    reader = csv.reader(io.StringIO(text, newline=""))
    for row in reader:
        where = "%s:%d" % (path, reader.line_num)
        if len(row) != PIXELS + 1:
            raise ConvertError("%s: expected %d fields (%d pixels + label), got %d"
                               % (where, PIXELS + 1, PIXELS, len(row)))
        values = [parse_int(v, "%s field %d" % (where, i + 1)) for i, v in enumerate(row)]
        pixels, label = values[:PIXELS], values[PIXELS]
        for i, p in enumerate(pixels):
            if p > MAX_PIXEL:
                raise ConvertError("%s field %d: pixel value %d out of range 0..%d"
                                   % (where, i + 1, p, MAX_PIXEL))
        if label >= NUM_CLASSES:
            raise ConvertError("%s field %d: label %d out of range 0..%d"
                               % (where, PIXELS + 1, label, NUM_CLASSES - 1))
        samples.append((bytes(pixels), label))

    if len(samples) != EXPECTED_COUNT:
        raise ConvertError("%s: expected %d samples, found %d"
                           % (path, EXPECTED_COUNT, len(samples)))
    return samples


def encode(samples):
    out = bytearray(MAGIC)
    out += struct.pack("<III", len(samples), ROWS, COLS)
    for pixels, label in samples:
        out += pixels
        out.append(label)
    assert len(out) == len(MAGIC) + 12 + len(samples) * (PIXELS + 1)
    return bytes(out)


def class_counts(samples):
    counts = [0] * NUM_CLASSES
    for _, label in samples:
        counts[label] += 1
    return counts


def fmt_counts(counts):
    return " ".join("%d:%d" % (c, n) for c, n in enumerate(counts))


def main(argv):
    if len(argv) > 3 or (len(argv) > 1 and argv[1] in ("-h", "--help")):
        sys.stderr.write("usage: %s [input.csv.gz] [output.bin]\n" % argv[0])
        return 2
    src = argv[1] if len(argv) > 1 else DEFAULT_INPUT
    dst = argv[2] if len(argv) > 2 else DEFAULT_OUTPUT

    try:
        samples = read_samples(src)
    except ConvertError as exc:
        sys.stderr.write("convert_digits: error: %s\n" % exc)
        return 1

    data = encode(samples)
    out_dir = os.path.dirname(os.path.abspath(dst))
    tmp = dst + ".tmp"
    try:
        os.makedirs(out_dir, exist_ok=True)
        with open(tmp, "wb") as fh:
            fh.write(data)
        os.replace(tmp, dst)
    except OSError as exc:
        sys.stderr.write("convert_digits: error: cannot write %s: %s\n" % (dst, exc))
        try:
            os.remove(tmp)
        except OSError:
            pass
        return 1

    print("wrote %s: %d samples, %dx%d, %d bytes" % (dst, len(samples), ROWS, COLS, len(data)))
    print("class counts (all):   %s" % fmt_counts(class_counts(samples)))
    print("class counts (train, first %d): %s"
          % (TRAIN_COUNT, fmt_counts(class_counts(samples[:TRAIN_COUNT]))))
    print("class counts (test, last %d):   %s"
          % (len(samples) - TRAIN_COUNT, fmt_counts(class_counts(samples[TRAIN_COUNT:]))))
    print("sha256 %s" % hashlib.sha256(data).hexdigest())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
