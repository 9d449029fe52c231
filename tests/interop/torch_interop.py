#!/usr/bin/env python3
"""PyTorch <-> mlc interop through safetensors (Debian's python3-torch 1.13 has no safetensors
module, so this script writes and reads the format itself: an 8-byte little-endian header
length, a JSON header, raw little-endian data).

  torch_interop.py write DIR   six models built with fixed seeds (an MLP, a Fashion-MNIST
                               shaped CNN with batch norm, an embedding + layer-norm model,
                               Linear + nn.MultiheadAttention(batch_first=True) + Linear, a
                               2-layer LSTM and a 2-layer bidirectional GRU with a linear head
                               on every step):
                               DIR/<model>.weights.safetensors (the state dict, batch norm's
                               num_batches_tracked as I64) and DIR/<model>.ref.safetensors (an
                               input batch, targets, the training-mode output, the loss, the
                               gradients of the input and of every parameter, the eval-mode
                               output after that step's running-statistics update, and for the
                               MLP, the CNN and the attention model that output under
                               torch.autocast("cpu", torch.bfloat16) as out_eval_bf16).
                               And the dynamically quantized Linear (qlinear, 96 -> 48; a batch
                               of 16 rows scaled from 0.1 to 10): DIR/qlinear.weights.safetensors
                               (float32 weight and bias) and DIR/qlinear.ref.safetensors (x, the
                               float32 output, torch.quantize_per_channel(w, max|row| / 127, zero
                               points 0, axis 0, qint8)'s integers (w_int, as F32) and scales, and
                               torch.ao.quantization.quantize_dynamic's output for each quantized
                               engine this torch has (of onednn, qnnpack, fbgemm) with per-tensor
                               weights (its default qconfig) and per-channel ones:
                               "torch.ENGINE.per_tensor", "torch.ENGINE.per_channel").
                               And the statically quantized convolutions (qconv, QCONV: stride 1
                               and 2, padding, groups 2, depthwise with multiplier 1 and 2, 1x1,
                               a fused ReLU, and "ties", whose multipliers are all 1/8 exactly):
                               DIR/qconv.ref.safetensors, in mlc's int8 convention, for each
                               NAME: NAME.x (int8 integers as F32), NAME.weight and NAME.bias
                               (float32), NAME.params [stride, padding, groups, s_x, z_x, s_y,
                               z_y] (s_y, z_y from the float output's range; the ReLU's range
                               [0, max], z_y -128), NAME.w_int and NAME.w_scale
                               (torch.quantize_per_channel's integers, as F32, and scales); and
                               pool.x, pool.params [scale, zero point] for int8 pooling.
  torch_interop.py check DIR   loads mlc's trained DIR/<model>.mlc.safetensors into the same
                               PyTorch model (strict load_state_dict) and matches mlc's eval
                               output in DIR/<model>.mlc_out.safetensors. For qlinear, mlc's
                               quantized module (DIR/qlinear.mlc.safetensors: I8 weight, F32
                               weight_scale and bias): its integers equal to
                               torch.quantize_per_channel's with the same scales, the scales
                               equal, and its output (DIR/qlinear.mlc_out.safetensors) equal to
                               mlc's scheme computed here in PyTorch from those integers (each
                               row of x quantized over its range [lo, hi], 0 included: scale
                               (hi - lo) / 255, zero point -128 - round(lo / scale), rounded half
                               to even; exact integer sums; scaled back; the bias) within the
                               tolerance.
                               For qconv, mlc's outputs (DIR/qconv.mlc_out.safetensors: NAME.out,
                               pool.<kind><k>s<stride>p<padding> and NAME.weight as I8,
                               NAME.weight_scale):
                               equal to mlc's scheme computed here (mlc_qconv_scheme: integer
                               sums, the bias rounded to int32 at s_x s_w, the fixed-point
                               multiplier, ties up) integer for integer, its weights equal to
                               torch.quantize_per_channel's; then within 1 LSB of PyTorch's
                               quantized Conv2d (ConvReLU2d for the ReLU) on each engine, built
                               with the same per-channel qint8 weights and quint8 activations
                               (mlc's q + 128, zero point z + 128: the same real values). The
                               schemes agree but for two roundings, and every difference must be
                               one of them: a tie (exactly n + 1/2: mlc rounds up, PyTorch to
                               even; "ties" makes about 1 output in 8 one) or, on onednn, a value
                               within M/2 (M = s_x s_w / s_y) of a tie, since onednn adds the
                               bias in float where mlc and qnnpack round it to int32 first.
                               Both engines take per-channel weights, groups, depthwise and
                               ConvReLU2d in this build. Max pooling must be equal; average
                               pooling within 1 LSB, differing only at ties (mlc rounds the
                               int8 sum / k² half away from zero, as TFLite; PyTorch to even).
                               The share of equal integers and the largest difference are
                               printed for each configuration and engine.
Each check prints PASS or FAIL; the last line is "interop (PyTorch side): N passed, M failed";
the exit status is 1 on any failure. Tolerance: |a - b| <= 1e-5 + 1e-4 |b| per element.
"""
import json
import struct
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

RTOL, ATOL = 1e-4, 1e-5
AUTOCAST_MODELS = ("mlp", "cnn", "attn")   # eval output under torch.autocast("cpu", torch.bfloat16) too
DTYPES = {torch.float32: ("F32", "<f4"), torch.int64: ("I64", "<i8")}
NUMPY = {"F32": "<f4", "F16": "<f2", "I64": "<i8", "F64": "<f8", "I32": "<i4", "I8": "<i1"}
QENGINES = [e for e in ("onednn", "qnnpack", "fbgemm") if e in torch.backends.quantized.supported_engines]


def write_safetensors(path, tensors, metadata=None):
    header, blobs, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, t in tensors.items():
        t = t.detach().contiguous().cpu()
        code, np_dtype = DTYPES[t.dtype]
        blob = t.numpy().astype(np_dtype).tobytes()
        header[name] = {"dtype": code, "shape": list(t.shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    meta = header.pop("__metadata__", {})
    out = {}
    for name, e in header.items():
        begin, end = e["data_offsets"]
        arr = np.frombuffer(body[begin:end], dtype=NUMPY[e["dtype"]]).reshape(e["shape"])
        out[name] = torch.from_numpy(arr.copy())
    return out, meta


def mlp():
    return nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 16), nn.Tanh(), nn.Linear(16, 4))


def cnn():
    return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(16 * 7 * 7, 10))


def embed():
    return nn.Sequential(nn.Embedding(50, 16), nn.LayerNorm(16), nn.Linear(16, 50))


class SelfAttention(nn.MultiheadAttention):
    """nn.MultiheadAttention(batch_first=True) as self-attention, so it fits in nn.Sequential
    (its state dict keeps MultiheadAttention's names: in_proj_weight, out_proj.weight, ...)."""

    def __init__(self, embed_dim, num_heads):
        super().__init__(embed_dim, num_heads, batch_first=True)

    def forward(self, x):
        return super().forward(x, x, x, need_weights=False)[0]


def attn():
    return nn.Sequential(nn.Linear(8, 16), SelfAttention(16, 4), nn.Linear(16, 3))


class Recurrent(nn.Module):
    """A recurrent layer (batch first) and a linear head on each step, named as nn.Sequential
    names them ("0.weight_ih_l0", "1.weight"): nn.LSTM and nn.GRU return a tuple."""

    def __init__(self, layer, bidirectional=False):
        super().__init__()
        self.add_module("0", layer(6, 8, 2, batch_first=True, bidirectional=bidirectional))
        self.add_module("1", nn.Linear(16 if bidirectional else 8, 3))

    def forward(self, x):
        return self._modules["1"](self._modules["0"](x)[0])


def batch(name, gen):
    """Input, target, and whether the input takes a gradient."""
    if name == "mlp":
        return torch.randn(8, 20, generator=gen), torch.randn(8, 4, generator=gen), True
    if name == "cnn":
        return torch.randn(4, 1, 28, 28, generator=gen), torch.randint(0, 10, (4,), generator=gen), True
    if name == "attn":
        return torch.randn(2, 5, 8, generator=gen), torch.randn(2, 5, 3, generator=gen), True
    if name in ("lstm", "gru"):
        return torch.randn(4, 5, 6, generator=gen), torch.randn(4, 5, 3, generator=gen), True
    return torch.randint(0, 50, (4, 6), generator=gen), torch.randint(0, 50, (4, 6), generator=gen), False


def loss_of(name, out, y):
    if name in ("mlp", "attn", "lstm", "gru"):
        return F.mse_loss(out, y)
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


MODELS = {"mlp": mlp, "cnn": cnn, "embed": embed, "attn": attn, "lstm": lambda: Recurrent(nn.LSTM),
          "gru": lambda: Recurrent(nn.GRU, bidirectional=True)}


def write(folder):
    for i, (name, build) in enumerate(MODELS.items()):
        torch.manual_seed(100 + i)
        model = build()
        gen = torch.Generator().manual_seed(200 + i)
        with torch.no_grad():                      # batch norm starts from non-trivial statistics
            for m in model.modules():
                if isinstance(m, nn.BatchNorm2d):
                    m.weight.uniform_(0.5, 1.5, generator=gen)
                    m.bias.uniform_(-0.5, 0.5, generator=gen)
                    m.running_mean.uniform_(-0.2, 0.2, generator=gen)
                    m.running_var.uniform_(0.5, 2.0, generator=gen)
                    m.num_batches_tracked.fill_(3)
                if isinstance(m, nn.LayerNorm):
                    m.weight.uniform_(0.5, 1.5, generator=gen)
                    m.bias.uniform_(-0.5, 0.5, generator=gen)
        write_safetensors(f"{folder}/{name}.weights.safetensors", model.state_dict(), {"model": name, "by": "pytorch"})
        x, y, x_grad = batch(name, gen)
        model.train()
        xin = x.clone().requires_grad_(x_grad)
        out = model(xin)
        loss = loss_of(name, out, y)
        loss.backward()
        ref = {"x": x.float(), "y": y.float(), "out": out, "loss": loss.reshape(1)}
        if x_grad:
            ref["grad.x"] = xin.grad
        for pname, p in model.named_parameters():
            ref["grad." + pname] = p.grad
        model.eval()
        with torch.no_grad():
            ref["out_eval"] = model(x)
            if name in AUTOCAST_MODELS:        # the products in bfloat16, as mlc_autocast_begin
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    ref["out_eval_bf16"] = model(x).float()
        write_safetensors(f"{folder}/{name}.ref.safetensors", ref)
        print(f"wrote {name}: {sum(p.numel() for p in model.parameters())} parameters, loss {loss.item():.6f}")
    write_qlinear(folder)
    write_qconv(folder)


def quantize_weight(w):
    """torch.quantize_per_channel(w, max|row| / 127, zero points 0, axis 0, torch.qint8): the
    integers and scales of mlc_quantize_weight"""
    scale = w.abs().amax(tuple(range(1, w.dim()))) / 127
    return torch.quantize_per_channel(w, scale, torch.zeros(w.shape[0], dtype=torch.long), 0, torch.qint8)


def write_qlinear(folder):
    """The dynamically quantized Linear: mlc's scheme and PyTorch's differ (PyTorch: activations
    per tensor, affine uint8 from their min and max; weights per tensor or per channel from a MinMax
    observer. mlc: each row of x affine over its range, as PyTorch's whole input; weights per
    row, symmetric, max|row| / 127),
    so what can be equal is compared as equal (the weights' integers at the same scales) and the
    outputs are each compared with the float32 Linear (interop.c)."""
    from torch.ao.quantization import default_dynamic_qconfig, per_channel_dynamic_qconfig, quantize_dynamic
    torch.manual_seed(106)
    lin = nn.Linear(96, 48)
    gen = torch.Generator().manual_seed(206)
    x = torch.randn(16, 96, generator=gen) * torch.logspace(-1, 1, 16)[:, None]   # rows from 0.1 to 10
    w = lin.weight.detach()
    scale = w.abs().amax(1) / 127
    w_int = quantize_weight(w).int_repr()
    with torch.no_grad():
        ref = {"x": x, "out": lin(x), "w_int": w_int.float(), "w_scale": scale}
        for engine in QENGINES:
            torch.backends.quantized.engine = engine
            for scheme, qconfig in (("per_tensor", default_dynamic_qconfig),
                                    ("per_channel", per_channel_dynamic_qconfig)):
                q = quantize_dynamic(nn.Sequential(lin), {nn.Linear: qconfig}, dtype=torch.qint8)
                ref[f"torch.{engine}.{scheme}"] = q(x)
    write_safetensors(f"{folder}/qlinear.weights.safetensors", lin.state_dict(),
                      {"model": "qlinear", "by": "pytorch"})
    write_safetensors(f"{folder}/qlinear.ref.safetensors", ref)
    print(f"wrote qlinear: torch's quantize_dynamic on the engines {', '.join(QENGINES)} "
          f"(of {torch.backends.quantized.supported_engines})")


# The statically quantized convolutions (qconv): name, in and out channels, kernel, stride,
# padding, groups, fused ReLU. Input [2, in, 11, 11]. "ties" is built so that every multiplier
# s_x s_w / s_y is 1/8 exactly (see qconv_case): it shows the one rounding rule that differs.
QCONV = (("stride1", 4, 8, 3, 1, 0, 1, False), ("stride2_pad1", 6, 8, 3, 2, 1, 1, False),
         ("groups2", 8, 12, 3, 1, 1, 2, False), ("depthwise", 8, 8, 3, 1, 1, 8, False),
         ("depthwise_x2_k5_s2", 8, 16, 5, 2, 2, 8, False), ("pointwise", 16, 8, 1, 1, 0, 1, False),
         ("relu", 4, 8, 3, 1, 1, 1, True), ("ties", 4, 8, 3, 1, 1, 1, False))
QPOOL = (("max", 2, 2, 0), ("avg", 2, 2, 0), ("max", 3, 2, 1), ("avg", 3, 2, 1))   # kind, kernel, stride, pad
f32 = np.float32


def qconv_case(i, cfg):
    """One configuration's fixed data, in mlc's int8 convention (torch's quint8 value is q + 128,
    its zero point z + 128): x (integers), the float weight and bias, and params [stride,
    padding, groups, s_x, z_x, s_y, z_y]. s_x 0.02, z_x -10; s_y and z_y from the float output's
    range (as a calibration would give them; [0, max] with z_y -128 for the fused ReLU)."""
    name, cin, cout, k, stride, pad, groups, relu = cfg
    gen = torch.Generator().manual_seed(300 + i)
    w = torch.randn(cout, cin // groups, k, k, generator=gen) * 0.3
    b = torch.randn(cout, generator=gen) * 0.5
    if name == "ties":         # s_x 2^-6, every s_w 2^-7 (max|row| 127/128), the bias a multiple of
        s_x, z_x = 2.0 ** -6, -10           # s = s_x s_w = 2^-13, s_y 8 s: the sums ≡ 4 (mod 8) are ties
        x = torch.randint(z_x - 3, z_x + 4, (2, cin, 11, 11), generator=gen)
        w = w.clamp(-0.9, 0.9)
        w[:, 0, 0, 0] = 127 / 128
        b = torch.round(b * 2 ** 7) / 2 ** 13         # |b / s| <= 2^7 or so: few outputs clamp
        s_y, z_y = 8 * 2.0 ** -13, 0
    else:
        s_x, z_x = float(f32(0.02)), -10
        x = torch.randint(-128, 128, (2, cin, 11, 11), generator=gen)
        y = F.conv2d((x - z_x).float() * s_x, quantize_weight(w).dequantize(), b, stride, pad, 1, groups)
        lo, hi = (0.0 if relu else min(y.min().item(), 0.0)), max(y.max().item(), 0.0)
        s_y = float(f32(f32(hi - lo) / f32(255)))
        z_y = int(-128 - np.round(lo / s_y))
    params = torch.tensor([stride, pad, groups, s_x, z_x, s_y, z_y], dtype=torch.float32)
    return {"x": x.float(), "weight": w, "bias": b, "params": params}


def write_qconv(folder):
    """The statically quantized convolution and int8 pooling (qconv): the inputs of each QCONV
    configuration, torch.quantize_per_channel(w, max|row| / 127, zero points 0, axis 0, qint8)'s
    integers (w_int, as F32) and scales (w_scale), and an int8 batch for QPOOL (pool.x,
    pool.params [s, z]). PyTorch's own outputs are computed in check (check_qconv)."""
    ref = {}
    for i, cfg in enumerate(QCONV):
        case = qconv_case(i, cfg)
        q = quantize_weight(case["weight"])
        case["w_int"], case["w_scale"] = q.int_repr().float(), q.q_per_channel_scales().float()
        ref.update({f"{cfg[0]}.{key}": value for key, value in case.items()})
    gen = torch.Generator().manual_seed(320)
    ref["pool.x"] = torch.randint(-128, 128, (2, 8, 11, 11), generator=gen).float()
    ref["pool.params"] = torch.tensor([0.02, -10], dtype=torch.float32)
    write_safetensors(f"{folder}/qconv.ref.safetensors", ref)
    print(f"wrote qconv: {len(QCONV)} int8 convolutions ({', '.join(c[0] for c in QCONV)}) and an int8 "
          f"batch for pooling")


def close(a, b):
    a, b = a.double(), b.double()
    if a.shape != b.shape:
        return False, f"shape {tuple(a.shape)} vs {tuple(b.shape)}"
    err = ((a - b).abs() - (ATOL + RTOL * b.abs())).max().item() if a.numel() else -1.0
    return err <= 0, f"max |a - b| = {(a - b).abs().max().item() if a.numel() else 0:.3g}"


def check_qlinear(folder, passed, failed):
    """mlc's quantized Linear, as mlc saved it, against torch.quantize_per_channel and against its
    own scheme computed in PyTorch (see the docstring)"""
    state, _ = read_safetensors(f"{folder}/qlinear.mlc.safetensors")
    ref, _ = read_safetensors(f"{folder}/qlinear.ref.safetensors")
    data, _ = read_safetensors(f"{folder}/qlinear.mlc_out.safetensors")
    w_int, scale = state["weight"], state["weight_scale"]
    ok = w_int.dtype == torch.int8 and torch.equal(w_int.float(), ref["w_int"])
    differ = int((w_int.float() != ref["w_int"]).sum())
    print(f"{'PASS' if ok else 'FAIL'} qlinear: mlc's int8 weights (I8 in its file) equal "
          f"torch.quantize_per_channel's integers with the same scales ({differ} of {w_int.numel()} differ)")
    passed, failed = passed + ok, failed + (not ok)
    ok = torch.equal(scale, ref["w_scale"])
    print(f"{'PASS' if ok else 'FAIL'} qlinear: mlc's weight_scale equals max|row| / 127 computed by PyTorch")
    passed, failed = passed + ok, failed + (not ok)
    x = data["x"]
    lo, hi = x.amin(1, keepdim=True).clamp(max=0), x.amax(1, keepdim=True).clamp(min=0)
    x_scale = (hi - lo) / 255                                           # float32, as mlc computes it
    inverse = 1.0 / x_scale
    zero = -128 - torch.round(lo * inverse)                             # torch.round: half to even
    x_int = (torch.round(x * inverse) + zero).clamp(-128, 127) - zero
    sums = (x_int.double() @ w_int.double().T).float()                  # exact: |sum| < 2^24
    ok, why = close(data["out"], sums * (x_scale * scale[None, :]) + state["bias"])
    print(f"{'PASS' if ok else 'FAIL'} qlinear: mlc's output equals its scheme computed in PyTorch ({why})")
    return passed + ok, failed + (not ok)


def mlc_qconv_scheme(x, w_int, w_scale, bias, params):
    """mlc_conv2d_int8 computed here (mlc.h, "Static quantization"): acc = Σ (x - z_x) W (padding
    counts as z_x, so as 0) + round_half_even(b · (1 / (s_x s_w))) (float32); M = s_x s_w / s_y
    (float32) as its 24-bit mantissa m0 · 2^7 and a shift t, y = clamp(z_y + ⌊(acc m0 + 2^(t-1)) /
    2^t⌋, -128, 127). Returns y and the exact value it rounds (z_y + acc · M, before the clamp)."""
    stride, pad, groups = (int(v) for v in params[:3])
    s_x, z_x, s_y, z_y = f32(params[3]), int(params[4]), f32(params[5]), int(params[6])
    sums = F.conv2d((x.double() - z_x), w_int.double(), None, stride, pad, 1, groups).long()
    y, exact = torch.empty_like(sums), torch.empty_like(sums, dtype=torch.float64)
    for o in range(w_int.shape[0]):
        s = s_x * f32(w_scale[o])
        r = np.clip(f32(bias[o]) * (f32(1) / s), -2.0 ** 30, 2.0 ** 30)
        acc = sums[:, o] + int(np.rint(r))
        mantissa, e = np.frexp(s / s_y)                 # s / s_y = mantissa · 2^e, mantissa in [0.5, 1)
        m0, shift = int(mantissa * 2 ** 24) << 7, 31 - e
        y[:, o] = ((acc * m0 + (1 << (shift - 1))) >> shift) + z_y
        exact[:, o] = acc.double() * float(s / s_y) + z_y
    return y.clamp(-128, 127), exact


def quint8(x, scale, zero_point):
    """mlc's int8 integers x at (scale, zero_point) as torch's quint8: q + 128, zero point + 128"""
    return torch._make_per_tensor_quantized_tensor((x.long() + 128).to(torch.uint8), scale, zero_point + 128)


def torch_qconv(engine, cfg, x, weight, bias, params):
    """torch.ao.nn.quantized.Conv2d (torch.nn.intrinsic.quantized.ConvReLU2d for the fused ReLU) on
    ENGINE: quint8 in and out, weight quantize_weight's (per channel, qint8), bias float. Returns
    the output in mlc's convention (int_repr - 128)."""
    from torch.ao.nn.quantized import Conv2d
    from torch.nn.intrinsic.quantized import ConvReLU2d
    _, cin, cout, k, _, _, _, relu = cfg
    stride, pad, groups = (int(v) for v in params[:3])
    torch.backends.quantized.engine = engine
    conv = (ConvReLU2d if relu else Conv2d)(cin, cout, k, stride=stride, padding=pad, groups=groups)
    conv.set_weight_bias(quantize_weight(weight), bias)
    conv.scale, conv.zero_point = float(params[5]), int(params[6]) + 128
    return conv(quint8(x, float(params[3]), int(params[4]))).int_repr().long() - 128


def lsb_compare(got, want):
    """(equal count, element count, max |got - want| in LSB) of two integer tensors"""
    d = (got.long() - want.long()).abs()
    return int((d == 0).sum()), d.numel(), int(d.max()) if d.numel() else 0


def mlc_pool_sums(x, k, stride, pad, z):
    """each k x k window's sum of the int8 values, padding counted as the zero point"""
    return F.avg_pool2d(F.pad(x.double(), (pad,) * 4, value=z), k, stride, 0, divisor_override=1).long()


def mlc_pool_scheme(kind, x, k, stride, pad, z):
    """mlc's int8 pooling: max of the integers; average: the window's sum (padding counted as the
    zero point) / k², rounded half away from zero (TFLite's rule)"""
    if kind == "max":
        return F.max_pool2d(x.double(), k, stride, pad).long()
    sums, c = mlc_pool_sums(x, k, stride, pad, z), k * k
    return torch.where(sums >= 0, (sums + c // 2) // c, -((c // 2 - sums) // c))


def check_qconv(folder, passed, failed):
    """mlc's int8 convolutions and pooling (DIR/qconv.mlc_out.safetensors) against mlc's scheme
    computed here (equal integers) and against PyTorch's quantized Conv2d and pooling on each
    quantized engine (within 1 LSB, differing only where the schemes do: see the docstring)"""
    ref, _ = read_safetensors(f"{folder}/qconv.ref.safetensors")
    data, _ = read_safetensors(f"{folder}/qconv.mlc_out.safetensors")
    figures = []

    def line(ok, what):
        nonlocal passed, failed
        print(f"{'PASS' if ok else 'FAIL'} qconv{what}")
        passed, failed = passed + ok, failed + (not ok)

    for cfg in QCONV:
        name = cfg[0]
        x, params, out = ref[f"{name}.x"], ref[f"{name}.params"], data.get(f"{name}.out")
        w_int, w_scale = data.get(f"{name}.weight"), data.get(f"{name}.weight_scale")
        if out is None or w_int is None or w_scale is None or out.dtype != torch.int8:
            line(False, f".{name}: mlc's int8 output and weights (missing or not I8)")
            continue
        ok = w_int.dtype == torch.int8 and torch.equal(w_int.float(), ref[f"{name}.w_int"]) \
            and torch.equal(w_scale, ref[f"{name}.w_scale"])
        want, exact = mlc_qconv_scheme(x, w_int, w_scale, ref[f"{name}.bias"], params)
        same, count, _ = lsb_compare(out, want) if out.shape == want.shape else (-1, want.numel(), 0)
        line(ok and same == count, f".{name}: mlc's output equals its scheme computed in PyTorch "
             f"({count - same} of {count} differ; its I8 weights equal torch.quantize_per_channel's: {ok})")
        # M = s_x s_w / s_y. onednn adds the bias in float where mlc and qnnpack round it to int32 at
        # s_x s_w first: the values rounded then differ by at most M / 2
        half_m = (f32(params[3]) * w_scale.numpy() / f32(params[5])).astype(np.float64) / 2
        off = (exact - exact.floor() - 0.5).abs()       # 0 at a tie: mlc rounds up, PyTorch to even
        near_tie = off <= torch.from_numpy(half_m)[None, :, None, None] + 1e-6
        for engine in QENGINES:
            theirs = torch_qconv(engine, cfg, x, ref[f"{name}.weight"], ref[f"{name}.bias"], params)
            same, count, worst = lsb_compare(out, theirs)
            differ = out != theirs
            ties, nears = int((differ & (off == 0)).sum()), int((differ & (off > 0) & near_tie).sum())
            up = int((differ & (off == 0) & (out == theirs + 1)).sum())
            module = "torch.nn.intrinsic.quantized.ConvReLU2d" if cfg[7] else "torch.ao.nn.quantized.Conv2d"
            others = "" if same == count else (
                f"; of the {count - same} others, {ties} at a tie ({up} rounded up by mlc, to even by "
                f"PyTorch) and {nears} within M/2 of one (where the bias's rounding decides)")
            line(worst <= 1 and ties + nears == count - same and up == ties,
                 f".{name}: within 1 LSB of {module} on {engine} ({same} of {count} equal, "
                 f"{100 * same / count:.2f}%, max {worst} LSB{others})")
            figures.append(f"{name} {engine} {100 * same / count:.2f}% max {worst}")
    x, (scale, zero) = ref["pool.x"], ref["pool.params"].tolist()
    for kind, k, stride, pad in QPOOL:
        key, out = f"pool.{kind}{k}s{stride}p{pad}", data.get(f"pool.{kind}{k}s{stride}p{pad}")
        if out is None or out.dtype != torch.int8:
            line(False, f".{key}: mlc's int8 output (missing or not I8)")
            continue
        want = mlc_pool_scheme(kind, x, k, stride, pad, int(zero))
        same, count, _ = lsb_compare(out, want) if out.shape == want.shape else (-1, want.numel(), 0)
        ok, detail = same == count, []
        # an average halfway between two integers: mlc rounds away from zero, PyTorch to even
        at_tie = mlc_pool_sums(x, k, stride, pad, int(zero)) % (k * k) * 2 == k * k
        for engine in QENGINES:
            torch.backends.quantized.engine = engine
            pool = F.max_pool2d if kind == "max" else F.avg_pool2d
            theirs = pool(quint8(x, scale, int(zero)), k, stride, pad).int_repr().long() - 128
            same_t, count_t, worst = lsb_compare(out, theirs)
            ties = int(((out != theirs) & at_tie).sum()) if kind == "avg" else 0
            ok = ok and worst <= (kind == "avg") and ties == count_t - same_t
            detail.append(f"{engine} {same_t} of {count_t} equal, max {worst} LSB"
                          + (f", the {ties} others at a tie" if ties else ""))
            figures.append(f"{kind} pool {k}x{k}/{stride} pad {pad} {engine} {100 * same_t / count_t:.2f}% "
                           f"max {worst}")
        line(ok, f".{key}: mlc's int8 {kind} pooling equals its scheme ({count - same} of {count} differ) "
             f"and {'equals' if kind == 'max' else 'is within 1 LSB of'} F.{kind}_pool2d on the quint8 "
             f"tensor ({'; '.join(detail)})")
    probe = torch.arange(-128, 128)
    line(lsb_compare(probe, probe)[2] == 0 and lsb_compare(probe + 2, probe)[2] == 2,
         ": the LSB comparison sees a 2-LSB change")
    print("qconv figures (share of equal integers, max difference in LSB): " + "; ".join(figures))
    return passed, failed

def check(folder):
    passed = failed = 0
    for name, build in MODELS.items():
        model = build()
        state, meta = read_safetensors(f"{folder}/{name}.mlc.safetensors")
        ok, why = True, "strict load_state_dict"
        try:
            own = model.state_dict()
            model.load_state_dict({k: v.to(own[k].dtype) if k in own else v for k, v in state.items()}, strict=True)
        except (RuntimeError, KeyError) as e:
            ok, why = False, str(e).splitlines()[0]
        if ok:
            data, _ = read_safetensors(f"{folder}/{name}.mlc_out.safetensors")
            model.eval()
            x = data["x"].long() if name == "embed" else data["x"]
            with torch.no_grad():
                ok, why = close(model(x), data["out"])
        print(f"{'PASS' if ok else 'FAIL'} {name}: PyTorch loads mlc's trained weights and matches its output ({why})")
        passed, failed = passed + ok, failed + (not ok)
    passed, failed = check_qlinear(folder, passed, failed)
    passed, failed = check_qconv(folder, passed, failed)
    ok = not close(data["out"] + 1e-3, data["out"])[0]        # the comparison itself can fail
    print(f"{'PASS' if ok else 'FAIL'} the comparison rejects a 1e-3 change")
    passed, failed = passed + ok, failed + (not ok)
    print(f"interop (PyTorch side): {passed} passed, {failed} failed")
    return failed == 0


if __name__ == "__main__":
    torch.set_num_threads(1)
    if len(sys.argv) != 3 or sys.argv[1] not in ("write", "check"):
        print(__doc__)
        sys.exit(2)
    if sys.argv[1] == "write":
        write(sys.argv[2])
    else:
        sys.exit(0 if check(sys.argv[2]) else 1)
