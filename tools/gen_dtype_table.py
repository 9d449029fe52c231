#!/usr/bin/env python3
"""Generate tests/dtype_table.h: bit patterns of PyTorch's float32 <-> bfloat16/float16 casts.

Usage:
    /usr/bin/python3 tools/gen_dtype_table.py [output.h]

Default output: tests/dtype_table.h (relative to the repository root, not the cwd).
Needs torch and numpy (Debian: python3-torch, python3-numpy). The output is deterministic
(fixed seed, no timestamps), so rerunning it with the same torch gives the same file.

What is recorded is exactly what torch produces, NaN payloads included; nothing is
normalised here. Every value goes through torch in one contiguous 1-D tensor, the way
`x.to(torch.bfloat16)` / `x.to(torch.float16)` / `h.to(torch.float32)` see a normal tensor.

The script cross-checks, and refuses to write the header on any surprise:
  * the same casts through torch's other code paths: element by element on 0-dim tensors,
    on a strided (non-contiguous) view, and in a child process with ATEN_CPU_CAPABILITY=default
    (no SIMD kernels). The only difference allowed (and found with torch 1.13.1 on AVX2) is the
    bfloat16 bits of a NaN; those alternatives are written into the header as a macro.
  * every non-NaN result against an independent reference: round-to-nearest-even on the bits
    for bfloat16, numpy's astype(float16) for float16, numpy's astype(float32) for widening.
"""

import json
import os
import subprocess
import sys

import numpy as np
import torch

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUTPUT = os.path.join(REPO_ROOT, "tests", "dtype_table.h")
SEED = 25
SIGN32 = 0x80000000
SIGN16 = 0x8000


# ---------------------------------------------------------------------------------------------
# Inputs


def f32_bits(x):
    return int(np.array(x, dtype=np.float32).view(np.uint32))


def f32_inputs():
    """[(group name, [uint32 bits, ...]), ...]; negatives are added to every group but the sweep
    over exponents and 'random' (whose signs are mixed already)."""
    g = []
    g.append(("zero, inf", [0x00000000, 0x7F800000]))
    g.append(("quiet NaN, various payloads", [
        0x7FC00000, 0x7FC00001, 0x7FC00100, 0x7FC01000, 0x7FC02000, 0x7FC08000, 0x7FC10000,
        0x7FD23456, 0x7FE00000, 0x7FF00000, 0x7FFFE000, 0x7FFF0000, 0x7FFFFFFF]))
    g.append(("signalling NaN, various payloads (some vanish if the low bits are dropped)", [
        0x7F800001, 0x7F800100, 0x7F801000, 0x7F802000, 0x7F808000, 0x7F80FFFF, 0x7F810000,
        0x7F812345, 0x7F900000, 0x7FA00000, 0x7FBFE000, 0x7FBF0000, 0x7FBFFFFF]))
    g.append(("f32 subnormals (bf16 keeps them: ties, carries, up into the smallest normal)", [
        0x00000001, 0x00000002, 0x00007FFF, 0x00008000, 0x00008001, 0x0000FFFF, 0x00010000,
        0x00017FFF, 0x00018000, 0x00018001, 0x00028000, 0x00038000, 0x00400000, 0x00408000,
        0x00418000, 0x007F0000, 0x007F7FFF, 0x007F8000, 0x007FFFFF]))
    g.append(("f32 smallest normal and neighbours", [0x00800000, 0x00800001, 0x00808000, 0x00818000]))
    # bf16 rounding: a bf16 value B (bits << 16) with even and odd last bit, at several exponents.
    bf = []
    for base in (0x3F800000, 0x3F810000, 0x3FFF0000, 0x3F7F0000, 0x40490000, 0x40490000 + 0x10000,
                 0x1E800000, 0x1E810000, 0x60000000, 0x60010000, 0x477F0000, 0x47800000):
        for off in (0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF):
            bf.append(base + off)
    g.append(("bf16 rounding boundaries: B+1, just below tie, tie (to even), just above, B+0xffff", bf))
    g.append(("bf16 max finite and overflow to inf", [
        0x7F7F0000, 0x7F7F0001, 0x7F7F7FFF, 0x7F7F8000, 0x7F7F8001, 0x7F7FFFFF, 0x7F7E8000,
        0x7F7E7FFF, 0x7F7E8001, 0x7F000000]))
    # f16 rounding: 13 bits dropped, tie = 0x1000, f16 ulp = 0x2000 in f32 mantissa bits.
    hf = []
    for base in (0x3F800000, 0x3F802000, 0x3FFFE000, 0x3F7FE000, 0x40490000, 0x40492000,
                 0x46FFE000, 0x38800000, 0x38802000, 0x3A000000, 0x3A002000):
        for off in (0x0001, 0x0FFF, 0x1000, 0x1001, 0x1FFF):
            hf.append(base + off)
    g.append(("f16 rounding boundaries: B+1, just below tie, tie (to even), just above, B+0x1fff", hf))
    g.append(("f16 max finite and overflow: 65504, 65519.99, 65520 (tie, odd -> inf), 65536, FLT_MAX", [
        0x477FE000, 0x477FE001, 0x477FEFFF, 0x477FF000, 0x477FF001, 0x477FFFFF, 0x47800000,
        0x47FFE000, 0x4F800000, 0x501502F9, 0x7F000000, 0x7F7FFFFF, 0x477FD000, 0x477FC000]))
    g.append(("f16 smallest normal 2^-14 and the subnormal/normal boundary", [
        0x38800000, 0x387FFFFF, 0x387FE000, 0x387FDFFF, 0x387FE001, 0x387FC000, 0x387FBFFF,
        0x387FA000, 0x38800001, 0x38801000, 0x38801001]))
    sub = [0x33800000, 0x33000000, 0x33000001, 0x32FFFFFF, 0x337FFFFF, 0x33800001, 0x33A00000,
           0x33BFFFFF, 0x33C00000, 0x33C00001, 0x34000000, 0x34200000, 0x34200001, 0x341FFFFF,
           0x34400000, 0x34600000, 0x34A00000, 0x34B00000, 0x34D00000, 0x35000000, 0x36000000,
           0x37000000, 0x38000000, 0x38000001, 0x37FFFFFF, 0x38001000, 0x38002000, 0x38003000,
           0x387F0000]
    g.append(("f16 subnormals: 2^-24 (min), 2^-25 ties, k*2^-24 and (k+1/2)*2^-24, 2^-15", sub))
    g.append(("underflow to zero in f16 (below 2^-25), down to FLT_MIN and f32 subnormals", [
        0x32800000, 0x32FFFFFF, 0x2F800000, 0x2EDBE6FF, 0x1E3CE508, 0x00800000, 0x00400000,
        0x00000001]))
    exact = [1.0, 2.0, 0.5, 3.0, 0.75, 1.5, 0.1, 0.2, 1.0 / 3.0, 3.14159265, 2.71828183, 1e-3,
             1e-5, 1e-7, 10.0, 100.0, 255.0, 256.0, 257.0, 1000.0, 1024.0, 2048.0, 2049.0,
             4097.0, 1e4, 1e5, 1e6, 1e10, 1e20, 1e30, 1e38, 1e-10, 1e-20, 1e-30, 1e-38,
             6.1e-5, 6.0e-8, 5.9604645e-08, 0.333, 0.999, 1.001, 16777216.0, 16777217.0]
    g.append(("ordinary values", [f32_bits(x) for x in exact]))
    # Every f32 exponent once (mantissa with bits both above and below the cut points).
    g.append(("every f32 exponent (positive), mantissa 0x2aaaaa / 0x555555 / 0x7fffff", [
        (e << 23) | m for e in range(0, 255) for m in (0x2AAAAA, 0x555555)] +
        [(e << 23) | 0x7FFFFF for e in range(100, 150)]))
    rng = np.random.default_rng(SEED)
    normal = rng.standard_normal(300).astype(np.float32)
    spread = (rng.standard_normal(150) * np.exp2(rng.uniform(-30.0, 20.0, 150))).astype(np.float32)
    rbits = rng.integers(0, 2**32, 150, dtype=np.uint64).astype(np.uint32)
    rand = [int(v) for v in normal.view(np.uint32)] + [int(v) for v in spread.view(np.uint32)] + \
           [int(v) for v in rbits]
    g.append(("random (seed %d): 300 N(0,1), 150 N(0,1)*2^U(-30,20), 150 uniform bit patterns" % SEED,
              rand))
    seen = set()
    out = []
    for name, vals in g:
        if name.startswith(("random", "every")):
            full = vals
        else:
            full = []
            for v in vals:
                full += [v, v ^ SIGN32]
        kept = []
        for v in full:
            if v not in seen:
                seen.add(v)
                kept.append(v)
        out.append((name, kept))
    return out


def half_inputs():
    """[(group name, [uint16 bits, ...]), ...] for widening; the same 16 bits read as bf16 and f16.
    Negatives are added to every group but the sweeps over exponents."""
    g = []
    g.append(("zero; f16 inf 0x7c00; bf16 inf 0x7f80", [0x0000, 0x7C00, 0x7F80]))
    g.append(("f16 NaNs: quiet and signalling, various payloads", [
        0x7C01, 0x7C02, 0x7C10, 0x7CFF, 0x7D00, 0x7D55, 0x7DFF, 0x7E00, 0x7E01, 0x7EAA, 0x7F00,
        0x7FFF]))
    g.append(("bf16 NaNs: quiet and signalling, various payloads", [
        0x7F81, 0x7F82, 0x7F90, 0x7FA0, 0x7FBF, 0x7FC0, 0x7FC1, 0x7FD5, 0x7FE0, 0x7FFF]))
    fsub = []
    for k in range(10):
        fsub += [1 << k, (1 << k) | 1, (2 << k) - 1, (1 << k) | ((1 << k) >> 1)]
    g.append(("f16 subnormals: every leading-bit position (1<<k, |1, all ones, |half)", fsub))
    bsub = []
    for k in range(7):
        bsub += [1 << k, (1 << k) | 1, (2 << k) - 1]
    g.append(("bf16 subnormals: every leading-bit position", bsub))
    g.append(("every f16 exponent (positive), mantissa 0 / 1 / 0x155 / 0x200 / 0x2aa / 0x3ff", [
        (e << 10) | m for e in range(32) for m in (0x000, 0x001, 0x155, 0x200, 0x2AA, 0x3FF)]))
    g.append(("every bf16 exponent (positive), mantissa 0 / 1 / 0x40 / 0x7f", [
        (e << 7) | m for e in range(256) for m in (0x00, 0x01, 0x40, 0x7F)]))
    seen = set()
    out = []
    for name, vals in g:
        kept = []
        for v in vals:
            for w in ((v,) if name.startswith("every") else (v, v ^ SIGN16)):
                if w not in seen:
                    seen.add(w)
                    kept.append(w)
        out.append((name, kept))
    return out


# ---------------------------------------------------------------------------------------------
# Casting through torch


def u32_to_f32_tensor(bits):
    return torch.from_numpy(np.array(bits, dtype=np.uint32).view(np.float32).copy())


def u16_of(t):
    return [int(v) for v in t.contiguous().view(torch.int16).numpy().view(np.uint16)]


def u32_of(t):
    return [int(v) for v in t.contiguous().numpy().view(np.uint32)]


def narrow_contiguous(bits):
    t = u32_to_f32_tensor(bits)
    return u16_of(t.to(torch.bfloat16)), u16_of(t.to(torch.float16))


def narrow_0dim(bits):
    t = u32_to_f32_tensor(bits)
    bf = [u16_of(t[i].to(torch.bfloat16).reshape(1))[0] for i in range(len(bits))]
    hf = [u16_of(t[i].to(torch.float16).reshape(1))[0] for i in range(len(bits))]
    return bf, hf


def narrow_strided(bits):
    t = u32_to_f32_tensor(bits)
    wide = torch.zeros(len(bits), 3, dtype=torch.float32)
    wide[:, 1] = t
    v = wide[:, 1]
    assert not v.is_contiguous()
    return u16_of(v.to(torch.bfloat16)), u16_of(v.to(torch.float16))


def half_tensor(bits, dtype):
    return torch.from_numpy(np.array(bits, dtype=np.uint16).view(np.int16).copy()).view(dtype)


def widen_contiguous(bits):
    return (u32_of(half_tensor(bits, torch.bfloat16).to(torch.float32)),
            u32_of(half_tensor(bits, torch.float16).to(torch.float32)))


def widen_0dim(bits):
    out = []
    for dt in (torch.bfloat16, torch.float16):
        h = half_tensor(bits, dt)
        out.append([u32_of(h[i].to(torch.float32).reshape(1))[0] for i in range(len(bits))])
    return tuple(out)


def widen_strided(bits):
    out = []
    for dt in (torch.bfloat16, torch.float16):
        h = half_tensor(bits, dt)
        wide = torch.zeros(len(bits), 3, dtype=dt)
        wide[:, 1] = h
        out.append(u32_of(wide[:, 1].to(torch.float32)))
    return tuple(out)


def cpu_capability():
    cfg = torch.__config__.show()
    key = "CPU capability usage: "
    return cfg.split(key, 1)[1].split()[0] if key in cfg else "unknown"


# ---------------------------------------------------------------------------------------------
# Independent references (non-NaN only)


def ref_bf16(u):
    """Round to nearest even on the bits; no NaN handling (callers skip NaN)."""
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF


def ref_f16(bits):
    a = np.array(bits, dtype=np.uint32).view(np.float32)
    with np.errstate(over="ignore"):
        return [int(v) for v in a.astype(np.float16).view(np.uint16)]


def ref_widen_f16(bits):
    h = np.array(bits, dtype=np.uint16).view(np.float16)
    return [int(v) for v in h.astype(np.float32).view(np.uint32)]


def is_nan32(u):
    return (u & 0x7F800000) == 0x7F800000 and (u & 0x007FFFFF) != 0


def is_nan_bf16(u):
    return (u & 0x7F80) == 0x7F80 and (u & 0x007F) != 0


def is_nan_f16(u):
    return (u & 0x7C00) == 0x7C00 and (u & 0x03FF) != 0


# ---------------------------------------------------------------------------------------------


def child_main():
    """Run with ATEN_CPU_CAPABILITY=default by the parent: cast the same inputs, print JSON."""
    f32 = [v for _, vs in f32_inputs() for v in vs]
    h16 = [v for _, vs in half_inputs() for v in vs]
    json.dump({"capability": cpu_capability(), "narrow": narrow_contiguous(f32),
               "widen": widen_contiguous(h16)}, sys.stdout)


def fail(msg):
    sys.stderr.write("gen_dtype_table: " + msg + "\n")
    sys.exit(1)


def hexs(v, w):
    return "0x%0*x" % (w, v)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child_main()
        return
    output = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_OUTPUT
    torch.set_num_threads(1)

    f32_groups = f32_inputs()
    h16_groups = half_inputs()
    f32 = [v for _, vs in f32_groups for v in vs]
    h16 = [v for _, vs in h16_groups for v in vs]

    bf, hf = narrow_contiguous(f32)
    wbf, whf = widen_contiguous(h16)

    # Other torch code paths.
    env = dict(os.environ, ATEN_CPU_CAPABILITY="default")
    child = json.loads(subprocess.run([sys.executable, os.path.abspath(__file__), "--child"], env=env,
                                      check=True, stdout=subprocess.PIPE).stdout)
    paths = {"0-dim": (narrow_0dim(f32), widen_0dim(h16)),
             "strided": (narrow_strided(f32), widen_strided(h16)),
             "ATEN_CPU_CAPABILITY=default (%s)" % child["capability"]:
                 (tuple(child["narrow"]), tuple(child["widen"]))}
    alt_bf16_nan = {}  # path -> set of bf16 NaN bits it gives
    for path, ((pbf, phf), (pwbf, pwhf)) in paths.items():
        for i, u in enumerate(f32):
            if phf[i] != hf[i]:
                fail("%s: f16 of %s is %s, contiguous gives %s" % (path, hexs(u, 8), hexs(phf[i], 4),
                                                                  hexs(hf[i], 4)))
            if pbf[i] != bf[i]:
                if not (is_nan32(u) and is_nan_bf16(pbf[i])):
                    fail("%s: bf16 of %s is %s, contiguous gives %s" % (path, hexs(u, 8),
                                                                       hexs(pbf[i], 4), hexs(bf[i], 4)))
            if is_nan32(u):
                alt_bf16_nan.setdefault(path, set()).add(pbf[i])
        if pwbf != wbf or pwhf != whf:
            fail("%s: widening differs from the contiguous path" % path)

    # Independent references.
    rf16 = ref_f16(f32)
    for i, u in enumerate(f32):
        if is_nan32(u):
            if not is_nan_bf16(bf[i]) or not is_nan_f16(hf[i]):
                fail("NaN %s did not stay NaN: bf16 %s f16 %s" % (hexs(u, 8), hexs(bf[i], 4), hexs(hf[i], 4)))
            continue
        if bf[i] != ref_bf16(u):
            fail("bf16 of %s: torch %s, RNE reference %s" % (hexs(u, 8), hexs(bf[i], 4),
                                                              hexs(ref_bf16(u), 4)))
        if hf[i] != rf16[i]:
            fail("f16 of %s: torch %s, numpy %s" % (hexs(u, 8), hexs(hf[i], 4), hexs(rf16[i], 4)))
    rwf16 = ref_widen_f16(h16)
    for i, u in enumerate(h16):
        if not is_nan_bf16(u) and wbf[i] != u << 16:
            fail("bf16 widening of %s: torch %s" % (hexs(u, 4), hexs(wbf[i], 8)))
        if is_nan_bf16(u) and wbf[i] != u << 16:
            fail("bf16 widening changed NaN %s to %s (update this script)" % (hexs(u, 4), hexs(wbf[i], 8)))
        if not is_nan_f16(u) and whf[i] != rwf16[i]:
            fail("f16 widening of %s: torch %s, numpy %s" % (hexs(u, 4), hexs(whf[i], 8), hexs(rwf16[i], 8)))
        if is_nan_f16(u) and not is_nan32(whf[i]):
            fail("f16 widening of NaN %s gave %s" % (hexs(u, 4), hexs(whf[i], 8)))

    # Summaries of NaN behaviour for the header comment.
    nan_bf = sorted({bf[i] for i, u in enumerate(f32) if is_nan32(u)})
    nan_hf = sorted({hf[i] for i, u in enumerate(f32) if is_nan32(u)})
    scalar_paths = sorted(p for p, s in alt_bf16_nan.items() if s != set(nan_bf))
    scalar_nan = sorted(set().union(*[alt_bf16_nan[p] for p in scalar_paths])) if scalar_paths else []

    try:
        deb = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", "python3-torch"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL).stdout.decode().strip()
    except OSError:
        deb = ""

    L = []
    L.append("/* GENERATED FILE - do not edit. Regenerate with:")
    L.append("       /usr/bin/python3 tools/gen_dtype_table.py")
    L.append("   from torch %s%s, numpy %s, CPU capability %s, seed %d." % (
        torch.__version__, " (Debian python3-torch %s)" % deb if deb else "", np.__version__,
        cpu_capability(), SEED))
    L.append("")
    L.append("   Bit patterns of PyTorch's casts, exactly as torch produced them (NaN payloads are not")
    L.append("   normalised): every input went through x.to(torch.bfloat16) / x.to(torch.float16) /")
    L.append("   h.to(torch.float32) in one contiguous 1-D tensor. Non-NaN results were checked against")
    L.append("   round-to-nearest-even on the bits (bf16) and numpy's astype (f16, widening).")
    L.append("")
    L.append("   What torch does (this table is the evidence):")
    L.append("   - f32 -> bf16: round to nearest even; f32 subnormals are rounded, not flushed; overflow")
    L.append("     (>= 0x7f7f8000 in magnitude) gives +-inf; signed zero kept.")
    L.append("   - f32 -> bf16 NaN: every NaN (either sign, any payload) gives %s on this contiguous" %
             ", ".join(hexs(v, 4) for v in nan_bf))
    if scalar_paths:
        L.append("     path (torch's SIMD kernel). Torch's scalar path gives %s instead (sign and payload" %
                 ", ".join(hexs(v, 4) for v in scalar_nan))
        L.append("     dropped); torch takes it for: %s." % "; ".join(scalar_paths))
        L.append("     Only NaNs differ between the paths; MLC_TEST_BF16_NAN_SCALAR is that other answer.")
    L.append("   - f32 -> f16: round to nearest even; values >= 65520 in magnitude give +-inf; results")
    L.append("     below 2^-14 are f16 subnormals (rounded), below 2^-25 (and 2^-25 itself, a tie to even)")
    L.append("     give signed zero. NaN gives %s: sign kept, payload dropped, quiet." %
             ", ".join(hexs(v, 4) for v in nan_hf))
    L.append("   - bf16 -> f32: bits << 16, exactly, NaNs included (a signalling NaN stays signalling).")
    L.append("   - f16 -> f32: exact; subnormals normalised; NaN keeps sign and payload (payload << 13) and")
    L.append("     is quieted (bit 22 set), e.g. 0x7d00 -> 0x7fe00000.")
    L.append("   The same results come from 0-dim tensors, strided views and ATEN_CPU_CAPABILITY=default,")
    L.append("   except the bf16 NaN bits noted above. */")
    L.append("#ifndef MLC_TEST_DTYPE_TABLE_H")
    L.append("#define MLC_TEST_DTYPE_TABLE_H")
    L.append("#include <stdint.h>")
    L.append("")
    L.append("/* What every float32 NaN became in bf16 on the path this table records (contiguous .to()). */")
    if len(nan_bf) == 1:
        L.append("#define MLC_TEST_BF16_NAN_CONTIGUOUS 0x%04xu" % nan_bf[0])
    if len(scalar_nan) == 1:
        L.append("/* ... and on torch's scalar path (0-dim, strided, no SIMD): c10::BFloat16's NaN. */")
        L.append("#define MLC_TEST_BF16_NAN_SCALAR 0x%04xu" % scalar_nan[0])
    L.append("")
    L.append("typedef struct mlc_test_f32_to_half_row {")
    L.append("    uint32_t f32_bits;  /* input float32 */")
    L.append("    uint16_t bf16_bits; /* torch: x.to(torch.bfloat16) */")
    L.append("    uint16_t f16_bits;  /* torch: x.to(torch.float16) */")
    L.append("} mlc_test_f32_to_half_row;")
    L.append("")
    L.append("static const mlc_test_f32_to_half_row mlc_test_f32_to_half[] = {")
    i = 0
    for name, vals in f32_groups:
        L.append("    /* %s */" % name)
        cells = []
        for v in vals:
            cells.append("{0x%08xu, 0x%04xu, 0x%04xu}," % (v, bf[i], hf[i]))
            i += 1
        for k in range(0, len(cells), 3):
            L.append("    " + " ".join(cells[k:k + 3]))
    L.append("};")
    L.append("#define MLC_TEST_F32_TO_HALF_COUNT \\\n"
             "    (sizeof mlc_test_f32_to_half / sizeof mlc_test_f32_to_half[0])")
    L.append("")
    L.append("typedef struct mlc_test_half_to_f32_row {")
    L.append("    uint16_t bits;        /* the same 16 bits, read as bf16 and as f16 */")
    L.append("    uint32_t bf16_as_f32; /* torch: bits viewed as bfloat16, .to(torch.float32) */")
    L.append("    uint32_t f16_as_f32;  /* torch: bits viewed as float16, .to(torch.float32) */")
    L.append("} mlc_test_half_to_f32_row;")
    L.append("")
    L.append("static const mlc_test_half_to_f32_row mlc_test_half_to_f32[] = {")
    i = 0
    for name, vals in h16_groups:
        L.append("    /* %s */" % name)
        cells = []
        for v in vals:
            cells.append("{0x%04xu,0x%08xu,0x%08xu}," % (v, wbf[i], whf[i]))
            i += 1
        for k in range(0, len(cells), 3):
            L.append("    " + " ".join(cells[k:k + 3]))
    L.append("};")
    L.append("#define MLC_TEST_HALF_TO_F32_COUNT \\\n"
             "    (sizeof mlc_test_half_to_f32 / sizeof mlc_test_half_to_f32[0])")
    L.append("")
    L.append("#endif")
    for ln in L:
        if len(ln) > 110:
            fail("line over 110 columns: " + ln)
    text = "\n".join(L) + "\n"
    tmp = output + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, output)
    sys.stderr.write("wrote %s: %d f32->half rows, %d half->f32 rows\n" % (output, len(f32), len(h16)))


if __name__ == "__main__":
    main()
