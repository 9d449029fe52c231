#!/usr/bin/env python3
"""Write a MobileNetV2 (torchvision 0.14's architecture, seeded random weights: nothing is
downloaded) and a batch with torchvision's outputs, for examples/mobilenet.c and make test-interop.

  export_mobilenet.py [--width W] [--size S] [--batch N] [--seed K] PREFIX

writes PREFIX.weights.safetensors, torchvision.models.mobilenet_v2(width_mult=W)'s state dict
(num_batches_tracked as I64), its BatchNorm running statistics and affine parameters randomized
(mean N(0, 0.1), var U(0.5, 1.5), weight U(0.5, 1.5), bias N(0, 0.1)) so folding them into the
convs is tested with values that matter, and the classifier's weights N(0, 1/last channels) so
the logits are of order 1; and PREFIX.ref.safetensors with
  x          the inputs [N, 3, S, S], N(0, 1)
  y          class labels [N] (floats)
  out        the eval-mode logits
  out_fused  the logits of the eval model after torch.ao.quantization.fuse_modules folded every
             (Conv2d, BatchNorm2d[, ReLU6]) group
  out_train  the training-mode logits (batch statistics; dropout set to 0 so it is deterministic)
  loss       cross entropy of out_train against y, and the gradients from it:
  grad.features.0.0.weight, grad.features.2.conv.1.0.weight (a depthwise conv),
  grad.features.18.1.weight, grad.classifier.1.weight
"""
import argparse
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "interop"))
from torch_interop import write_safetensors  # noqa: E402  (the repository's safetensors writer)

GRADS = ("features.0.0.weight", "features.2.conv.1.0.weight", "features.18.1.weight", "classifier.1.weight")


def build(width, seed):
    torch.manual_seed(seed)
    model = torchvision.models.mobilenet_v2(width_mult=width)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.normal_(0, 0.1)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0, 0.1)
        last = model.classifier[1]
        last.weight.normal_(0, last.in_features ** -0.5)
    return model


def fused_copy(model):
    """fuse_modules on every Conv2dNormActivation (conv, bn, relu6 or conv, bn) and every block's
    projection (conv.N-1, conv.N): eval-mode folding, as a PyTorch user does for inference."""
    import copy
    fused = copy.deepcopy(model).eval()
    groups = []
    for name, m in fused.named_modules():
        if isinstance(m, torchvision.ops.misc.Conv2dNormActivation):
            groups.append([f"{name}.0", f"{name}.1"])     # ReLU6 stays: fuse_modules pairs ReLU, not ReLU6
        if isinstance(m, torchvision.models.mobilenetv2.InvertedResidual):
            n = len(m.conv)
            groups.append([f"{name}.conv.{n - 2}", f"{name}.conv.{n - 1}"])
    return torch.ao.quantization.fuse_modules(fused, groups)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--width", type=float, default=1.0)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("prefix")
    a = p.parse_args()
    torch.set_num_threads(1)
    model = build(a.width, a.seed)
    gen = torch.Generator().manual_seed(a.seed + 1)
    x = torch.randn(a.batch, 3, a.size, a.size, generator=gen)
    y = torch.randint(0, 1000, (a.batch,), generator=gen)
    model.eval()
    with torch.no_grad():
        out = model(x)
        out_fused = fused_copy(model)(x)
    state = {k: v for k, v in model.state_dict().items()}
    write_safetensors(f"{a.prefix}.weights.safetensors", state)
    model.train()
    model.classifier[0].p = 0.0
    out_train = model(x)
    loss = F.cross_entropy(out_train, y)
    loss.backward()
    params = dict(model.named_parameters())
    ref = {"x": x, "y": y.float(), "out": out, "out_fused": out_fused, "out_train": out_train,
           "loss": loss.reshape(1)}
    ref.update({f"grad.{k}": params[k].grad for k in GRADS})
    write_safetensors(f"{a.prefix}.ref.safetensors", ref)
    print(f"wrote {a.prefix}: MobileNetV2 width {a.width} at {a.size}x{a.size}, "
          f"{sum(p.numel() for p in model.parameters())} parameters, batch {a.batch}, "
          f"logits |max| {out.abs().max().item():.3f}, "
          f"fused vs unfused {(out - out_fused).abs().max().item():.2e}")


if __name__ == "__main__":
    main()
