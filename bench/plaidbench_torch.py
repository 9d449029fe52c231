"""bench/plaidbench_torch.py - the PyTorch side of bench/plaidbench.c (make plaidbench runs it).

torchvision's MobileNetV2 (random weights, nothing downloaded) timed as bench/plaidbench.c times
mlc's, on the CPU on --threads N threads (torch.set_num_threads(N); the caller sets
OPENBLAS_NUM_THREADS=N too, since Debian's torch multiplies through OpenBLAS):
  1.0 at 224x224, eval, BatchNorm folded (torch.ao.quantization.fuse_modules), under
  torch.inference_mode(), batch 1 and 16: the first run and the median of --runs runs;
  0.35 at 96x96, one training step at batch 32 (SGD momentum 0.9, cross entropy): the first
  step and the median of --runs steps.
Prints "key value" lines: torch_version, threads, b1_first_ms, b1_ms, b16_first_ms, b16_ms,
train_first_ms, train_ms (b1_ms and b16_ms per batch), and b1_cpu_ms, b16_cpu_ms, train_cpu_ms:
the medians in the process's CPU time (time.process_time).
Usage: python3 bench/plaidbench_torch.py --threads N [--runs R] [--device cpu|cuda]
"""
import argparse
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision


def fused_eval(width):
    model = torchvision.models.mobilenet_v2(width_mult=width).eval()
    groups = []
    for name, m in model.named_modules():
        if isinstance(m, torchvision.ops.misc.Conv2dNormActivation):
            groups.append([f"{name}.0", f"{name}.1"])
        if isinstance(m, torchvision.models.mobilenetv2.InvertedResidual):
            groups.append([f"{name}.conv.{len(m.conv) - 2}", f"{name}.conv.{len(m.conv) - 1}"])
    return torch.ao.quantization.fuse_modules(model, groups)


def timed(fn, runs, sync):
    """The first call and the median of `runs` more, in ms: wall clock, and the process's CPU time"""
    t0 = time.perf_counter()
    fn()
    sync()
    first = time.perf_counter() - t0
    times, cpu = [], []
    for _ in range(runs):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return first * 1e3, statistics.median(times) * 1e3, statistics.median(cpu) * 1e3


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--device", default="cpu")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    dev = torch.device(a.device)
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    print("torch_version", torch.__version__)
    print("threads", torch.get_num_threads())
    net = fused_eval(1.0).to(dev)
    for batch in (1, 16):
        x = torch.randn(batch, 3, 224, 224, device=dev)

        def infer():
            with torch.inference_mode():
                net(x)
        first, median, cpu = timed(infer, a.runs * (4 if batch == 1 else 1), sync)
        print(f"b{batch}_first_ms {first:.3f}")
        print(f"b{batch}_ms {median:.3f}")
        print(f"b{batch}_cpu_ms {cpu:.3f}")
    model = torchvision.models.mobilenet_v2(width_mult=0.35).to(dev).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(32, 3, 96, 96, device=dev)
    y = torch.randint(0, 1000, (32,), device=dev)

    def step():
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    first, median, cpu = timed(step, a.runs, sync)
    print(f"train_first_ms {first:.3f}")
    print(f"train_ms {median:.3f}")
    print(f"train_cpu_ms {cpu:.3f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
