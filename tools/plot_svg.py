#!/usr/bin/env python3
"""Draws the per-epoch CSV of examples/fashion_mnist.c (--csv) as an SVG: loss on the left,
accuracy on the right, train dashed and test solid, one colour per CSV. Standard library only.

    python3 tools/plot_svg.py -o docs/fashion_mnist.svg mlp.csv:MLP cnn.csv:CNN

Each argument is FILE or FILE:LABEL; the CSV has a header with epoch, train_loss,
train_accuracy, test_loss and test_accuracy (other columns are ignored)."""
import argparse
import csv
import math

COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"]
WIDTH, HEIGHT, PANEL_W, PANEL_H, LEFT, TOP = 860, 360, 340, 250, 70, 50


def read(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise SystemExit(f"{path}: no rows")
    return {key: [float(r[key]) for r in rows]
            for key in ("epoch", "train_loss", "train_accuracy", "test_loss", "test_accuracy")}


def nice_range(lo, hi):
    """Bounds and a tick step of about five ticks covering [lo, hi]."""
    if hi <= lo:
        hi = lo + 1
    raw = (hi - lo) / 5
    step = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * step:
            step *= m
            break
    return math.floor(lo / step) * step, math.ceil(hi / step) * step, step


def panel(out, x0, title, series, key, percent):
    values = [v for s in series for k in ("train_" + key, "test_" + key) for v in s[1][k]]
    scale = 100 if percent else 1
    lo, hi, step = nice_range(min(values) * scale, max(values) * scale)
    epochs = [e for s in series for e in s[1]["epoch"]]
    e_lo, e_hi = min(epochs), max(epochs)
    e_hi = e_hi if e_hi > e_lo else e_lo + 1

    def px(e):
        return x0 + (e - e_lo) / (e_hi - e_lo) * PANEL_W

    def py(v):
        return TOP + PANEL_H - (v * scale - lo) / (hi - lo) * PANEL_H

    out.append(f'<text x="{x0 + PANEL_W / 2}" y="{TOP - 14}" text-anchor="middle" font-size="15">'
               f'{title}</text>')
    out.append(f'<rect x="{x0}" y="{TOP}" width="{PANEL_W}" height="{PANEL_H}" fill="none" stroke="#888"/>')
    tick = lo
    while tick <= hi + step / 2:
        y = TOP + PANEL_H - (tick - lo) / (hi - lo) * PANEL_H
        out.append(f'<line x1="{x0}" y1="{y:.1f}" x2="{x0 + PANEL_W}" y2="{y:.1f}" stroke="#eee"/>')
        label = f"{tick:g}%" if percent else f"{tick:g}"
        out.append(f'<text x="{x0 - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11">{label}</text>')
        tick += step
    for e in sorted(set(epochs)):
        out.append(f'<text x="{px(e):.1f}" y="{TOP + PANEL_H + 16}" text-anchor="middle" font-size="11">'
                   f'{e:g}</text>')
    out.append(f'<text x="{x0 + PANEL_W / 2}" y="{TOP + PANEL_H + 34}" text-anchor="middle" '
               f'font-size="12">epoch</text>')
    for i, (label, s) in enumerate(series):
        colour = COLOURS[i % len(COLOURS)]
        for part, dash in (("train_", ' stroke-dasharray="5,4"'), ("test_", "")):
            points = " ".join(f"{px(e):.1f},{py(v):.1f}" for e, v in zip(s["epoch"], s[part + key]))
            out.append(f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>')
            for e, v in zip(s["epoch"], s[part + key]):
                out.append(f'<circle cx="{px(e):.1f}" cy="{py(v):.1f}" r="2.5" fill="{colour}"/>')


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-o", "--output", required=True, help="the SVG to write")
    parser.add_argument("--title", default="Fashion-MNIST with mlc")
    parser.add_argument("csv", nargs="+", help="FILE or FILE:LABEL")
    args = parser.parse_args()
    series = []
    for arg in args.csv:
        path, _, label = arg.partition(":")
        series.append((label or path, read(path)))
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
           f'font-family="sans-serif">',
           f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
           f'<text x="{WIDTH / 2}" y="20" text-anchor="middle" font-size="16" font-weight="bold">'
           f'{args.title}</text>']
    panel(out, LEFT, "loss (cross entropy)", series, "loss", False)
    panel(out, LEFT + PANEL_W + 90, "accuracy", series, "accuracy", True)
    x = LEFT
    for i, (label, _) in enumerate(series):                      # the legend
        colour = COLOURS[i % len(COLOURS)]
        out.append(f'<line x1="{x}" y1="{HEIGHT - 12}" x2="{x + 24}" y2="{HEIGHT - 12}" stroke="{colour}" '
                   f'stroke-width="2"/>')
        out.append(f'<text x="{x + 30}" y="{HEIGHT - 8}" font-size="12">{label}</text>')
        x += 40 + 8 * len(label)
    out.append(f'<text x="{x + 20}" y="{HEIGHT - 8}" font-size="12">solid: test, dashed: train</text>')
    out.append("</svg>")
    with open(args.output, "w") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
