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
    w_int = torch.quantize_per_channel(w, scale, torch.zeros(48, dtype=torch.long), 0, torch.qint8).int_repr()
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
