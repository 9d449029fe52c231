"""bench/torch_gpu.py - the peer of bench/gpu.c: PyTorch on CUDA, same sizes, models and step.

1. sgemm TFLOP/s of torch.mm on square float32 matrices (cuBLAS, TF32 off), median of timed
   calls each followed by torch.cuda.synchronize() (what gpu.c does with mlc_sync).
2. one training step of the digits MLP 64-128-128-10 and of the digits CNN, batch 32, AdamW
   (lr 3e-3, weight decay 1e-2; PyTorch's default implementation on CUDA, "foreach", and its
   fused=True one, keys "_fused"), cross entropy, on
   data/digits.bin: gather the batch on the GPU, forward, loss, zero_grad, backward, step,
   loss.item(). Median µs of 300 steps after 30 warm-up steps; CUDA kernels per step counted
   by torch.profiler over one step.
3. the same step at batch 512 for a wide MLP 784-1024-1024-10 and the Fashion-MNIST CNN on
   4,096 random 784-pixel images with random labels, in float32 and under
   torch.autocast("cuda", torch.bfloat16) (keys "_bf16"); median of 100 steps after 10.
Output: "key value" lines, keys prefixed "torch_".
Usage: python3 bench/torch_gpu.py [data/digits.bin] [sizes, e.g. 256,512,1024] [--gemm-only]"""
import contextlib
import statistics
import sys
import time
import warnings

import torch

warnings.filterwarnings("ignore", message=".*Profiler clears events.*")

BATCH, WARMUP, TIMED = 32, 30, 300
WIDE_BATCH, WIDE_IMAGES, WIDE_WARMUP, WIDE_TIMED = 512, 4096, 10, 100


def gemm(n):
    reps = 50 if n <= 1024 else 20 if n <= 2048 else 10
    g = torch.Generator(device="cuda").manual_seed(n)
    a = torch.randn(n, n, device="cuda", generator=g)
    b = torch.randn(n, n, device="cuda", generator=g)
    times = []
    for r in range(-3, reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        c = torch.mm(a, b)
        torch.cuda.synchronize()
        if r >= 0:
            times.append(time.perf_counter() - t0)
    ref = (a.double() @ b.double())
    err = ((c.double() - ref).abs().max() / ref.abs().max()).item()
    t = statistics.median(times)
    print(f"torch_gemm_{n}_relerr {err:.3g}")
    print(f"torch_gemm_{n}_tflops {2.0 * n ** 3 / t * 1e-12:.2f}")
    print(f"torch_gemm_{n}_ms {t * 1e3:.3f}")


def load_digits(path):
    raw = open(path, "rb").read()
    assert raw[:8] == b"MLCDIGT1"
    count = int.from_bytes(raw[8:12], "little")
    rec = torch.frombuffer(bytearray(raw[20:20 + 65 * count]), dtype=torch.uint8).view(count, 65)
    return rec[:, :64].float() / 16.0, rec[:, 64].long()


def model_of(kind):
    nn = torch.nn
    if kind == "mlp":
        return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))
    if kind == "wide_mlp":
        return nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
    if kind == "fashion_cnn":
        return nn.Sequential(nn.Unflatten(1, (1, 28, 28)),
                             nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Flatten(), nn.Linear(32 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))
    return nn.Sequential(nn.Unflatten(1, (1, 8, 8)),
                         nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Dropout(0.3), nn.Linear(128, 10))


def step_bench(kind, x, y, fused, batch=BATCH, amp=None, warmup=WARMUP, timed=TIMED):
    torch.manual_seed(1)
    model = model_of(kind).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-2, fused=fused)
    n = min(1500, len(x)) if batch == BATCH else len(x)
    x, y = x[:n].cuda(), y[:n].cuda()
    order = torch.randperm(n, device="cuda")
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(s):
        b = (s * batch) % (n - batch)
        idx = order[b:b + batch]
        with torch.autocast("cuda", dtype=amp) if amp is not None else contextlib.nullcontext():
            loss = loss_fn(model(x.index_select(0, idx)), y.index_select(0, idx))
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()

    times, first = [], None
    for s in range(warmup + timed):
        t0 = time.perf_counter()
        value = step(s)
        t1 = time.perf_counter()
        first = value if first is None else first
        if s >= warmup:
            times.append(t1 - t0)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        step(0)
    kernels = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    name = kind + ("_bf16" if amp is not None else "") + ("_fused" if fused else "")
    print(f"torch_step_{name}_us {1e6 * statistics.median(times):.1f}")
    print(f"torch_step_{name}_kernels {kernels}")
    print(f"torch_step_{name}_loss {first:.4f} -> {value:.4f}")


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "data/digits.bin"
    sizes = [int(s) for s in (sys.argv[2] if len(sys.argv) > 2 else "256,512,1024,2048,4096").split(",")]
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    print(f"torch_device {torch.cuda.get_device_name(0)} torch {torch.__version__}")
    for n in sizes:
        gemm(n)
    if "--gemm-only" in sys.argv:
        return
    x, y = load_digits(path)
    for kind in ("mlp", "cnn"):
        for fused in (False, True):
            step_bench(kind, x, y, fused)
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(WIDE_IMAGES, 784, generator=g), torch.randint(0, 10, (WIDE_IMAGES,), generator=g)
    for kind in ("wide_mlp", "fashion_cnn"):
        for amp in (None, torch.bfloat16):
            for fused in (False, True):
                step_bench(kind, x, y, fused, WIDE_BATCH, amp, WIDE_WARMUP, WIDE_TIMED)


if __name__ == "__main__":
    main()
