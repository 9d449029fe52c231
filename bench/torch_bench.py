"""bench/torch_bench.py - the PyTorch side of mlc's benchmark (bench/run.sh runs it).

The same models, data, batch size, optimiser and timing method as bench/bench.c, so the two
can be compared line by line. Prints "key value" lines that bench.c reads (--torch FILE):

    torch_version, torch_threads (the "all threads" setting: the CPUs online), torch_data,
    epoch_{mlp,cnn}_t{1,ALL}_{median,min,max,loss_first,loss_last} (the epoch rows; with --amp bf16
    epoch_{mlp,cnn}_bf16_t..., the same rows under torch.autocast("cpu", torch.bfloat16)),
    tiny_step_us, mlp_train_sps, cnn_train_sps, lstm_step_ms, mlp_infer_us, cnn_infer_us,
    gpt_tokens_s_1, gpt_tokens_s_all (the tiny GPT of examples/gpt.c, 1 and all threads),
    cnn_infer_t1_f32_us, cnn_int8_infer_us_ENGINE (the int8 rows, below), torch_int8_engines,
    others_percent (how much of the CPUs other processes used meanwhile)

The int8 rows (issue 26): the CNN at batch 1 on 1 thread (torch.set_num_threads(1), OpenBLAS on
1 thread), in float32 and statically quantized as torch.ao.quantization's eager mode does it:
conv+ReLU and linear+ReLU fused (fuse_modules), QuantStub/DeQuantStub around the model,
prepare with the engine's default qconfig (HistogramObserver activations; onednn: per-channel
weights, qnnpack: per-tensor), calibration on the first 8 batches of 64 training images (bench.c
calibrates on the same images), convert; for each of onednn and qnnpack that
torch.backends.quantized.supported_engines lists (Debian's 1.13 has no fbgemm). Each figure is
the median of single calls after a warm-up (bench.c times mlc the same way).

The epoch rows are bench.c's: a user's loop over whole shuffled Fashion-MNIST epochs (a new
torch.randperm order each epoch from a generator seeded 1000 + run, the last partial batch
dropped), a fresh model (torch.manual_seed(42)) and Adam (lr 1e-3) each run; the gather and
scaling of a batch is not timed, forward to opt.step() is; samples/s = samples / summed step
time; median, min and max of the runs; the mean loss of the first and of the last 100 steps
(of half the steps when a run has fewer than 200). A run on N threads sets torch.set_num_threads(N)
and OpenBLAS's threads to N (Debian's PyTorch multiplies through OpenBLAS, which would otherwise
use every CPU).

Usage: python3 bench/torch_bench.py [--quick] [--epochs-only | --no-epochs | --int8-only]
                                    [--model mlp|cnn] [--threads N] [--samples N] [--runs N]
                                    [--amp off|bf16]
    --quick         short runs: 1 run of a tenth of an epoch, short micro-benchmark chunks
    --epochs-only   only the epoch rows
    --no-epochs     only the micro-benchmarks (bench/run.sh: bench.c then runs the epoch rows
                    one run at a time, each just before its own on as many threads, with
                    --epochs-only --runs 1)
    --model         one model's epoch rows only
    --threads N     the epoch rows on N threads only (default: 1 and all the CPUs online)
    --samples N     samples per run (default: one epoch, 60000; --quick: a tenth)
    --runs N        runs per epoch row (default 3; --quick: 1)
    --amp bf16      the epoch rows under torch.autocast("cpu", dtype=torch.bfloat16) around the
                    forward and the loss (bench.c's --amp bf16), in place of float32's; off: float32
    --int8-only     only the int8 rows (with bench.c --int8-only)

With --minilm MODEL_DIR IDS_FILE RUNS it measures all-MiniLM-L6-v2 instead (bench/run.sh's
sentence-embedding row): the token ids of `build/minilm --ids` (IDS_FILE), embedded as
examples/minilm.c does (sorted longest first, batches of 32 padded to their longest, BERT's
forward as tests/models/test_minilm.py writes it, mean pooling, L2 norm), one warm-up pass then
RUNS passes, on 1 thread and on 2; prints "minilm_torch_sps_1 X", "minilm_torch_sps_2 Y"
(the median pass) and others_percent; with --amp bf16 the passes run under
torch.autocast("cpu", torch.bfloat16) and print "minilm_torch_bf16_sps_1 X" and "..._2 Y".
"""
import argparse
import ctypes
import gzip
import os
import struct
import sys
import time
from collections import OrderedDict

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 64
ALL_THREADS = max(1, os.sysconf("SC_NPROCESSORS_ONLN"))
FASHION_DIR = "/usr/share/datasets/fashion-mnist"
GPT_TEXT = "data/kjv_pentateuch.txt"
GPT_BATCH, GPT_BLOCK, GPT_LAYERS, GPT_EMBD, GPT_HEADS = 16, 64, 4, 64, 4
QUICK = "--quick" in sys.argv


def seconds_per_call(fn, chunk_s, chunks):
    """Best seconds per call of fn() over `chunks` chunks of about chunk_s seconds (bench.c's
    method): one warm-up call, then double the call count until a chunk is long enough."""
    if QUICK:
        chunk_s /= 4
    fn()
    calls = 1
    while True:
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        t = time.perf_counter() - t
        if t >= chunk_s / 4 or calls >= 1 << 24:
            break
        calls *= 2
    best = t / calls
    calls = int(calls * chunk_s / t) + 1 if t > 0 else calls
    for _ in range(chunks):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t) / calls)
    return best


def cpu_mark():
    """(busy seconds of all CPUs, total seconds, this process's CPU seconds), or None."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(v) for v in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    hz = os.sysconf("SC_CLK_TCK")
    own = os.times()
    return ((sum(ticks) - ticks[3] - ticks[4]) / hz, sum(ticks) / hz, own.user + own.system)


def others_percent(since):
    """How much of the CPUs other processes used since `since` (as bench.c computes it)."""
    now = cpu_mark()
    if since is None or now is None or now[1] <= since[1]:
        return -1
    return max(0.0, 100 * ((now[0] - since[0]) - (now[2] - since[2])) / (now[1] - since[1]))


def load_fashion():
    """Training images as a uint8 [count, 784] tensor and labels as int64, or random bytes of
    the same shape when the Debian package is not installed."""
    try:
        with gzip.open(os.path.join(FASHION_DIR, "train-images-idx3-ubyte.gz")) as f:
            magic, count, rows, cols = struct.unpack(">IIII", f.read(16))
            assert magic == 0x803 and rows == 28 and cols == 28
            images = torch.frombuffer(bytearray(f.read(count * 784)), dtype=torch.uint8).view(count, 784)
        with gzip.open(os.path.join(FASHION_DIR, "train-labels-idx1-ubyte.gz")) as f:
            magic, count2 = struct.unpack(">II", f.read(8))
            assert magic == 0x801 and count2 == count
            labels = torch.frombuffer(bytearray(f.read(count)), dtype=torch.uint8).long()
        return images, labels, "Fashion-MNIST, %d training images (gzip module)" % count
    except (OSError, AssertionError, struct.error):
        g = torch.Generator().manual_seed(7)
        images = torch.randint(0, 256, (60000, 784), dtype=torch.uint8, generator=g)
        labels = torch.randint(0, 10, (60000,), generator=g)
        return images, labels, "random bytes shaped like Fashion-MNIST (dataset not found)"


def tiny_mlp():
    return nn.Sequential(nn.Linear(10, 100), nn.Tanh(), nn.Linear(100, 1))


def fashion_mlp():
    return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))


def fashion_cnn():
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))


class LstmHead(nn.Module):
    """bench.c's LSTM model: 2 layers 32 -> 128 (batch first) and a linear head on every step."""

    def __init__(self):
        super().__init__()
        self.lstm, self.head = nn.LSTM(32, 128, 2, batch_first=True), nn.Linear(128, 1)

    def forward(self, x):
        return self.head(self.lstm(x)[0])


class Trainer:
    """One Adam step per call on the next batch (or on a fixed batch for the tiny MLP)."""

    def __init__(self, model, images=None, labels=None, image_shape=(784,), x=None, y=None):
        self.model, self.images, self.labels, self.shape = model, images, labels, image_shape
        self.opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        self.x, self.y, self.next = x, y, 0

    def step(self):
        if self.images is not None:
            if self.next + BATCH > self.images.shape[0]:
                self.next = 0
            i = self.next
            self.x = self.images[i:i + BATCH].float().div_(255.0).view(BATCH, *self.shape)
            self.y = self.labels[i:i + BATCH]
            self.next += BATCH
            loss = F.cross_entropy(self.model(self.x), self.y)
        else:
            loss = F.mse_loss(self.model(self.x), self.y)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()


class GPTBlock(nn.Module):
    """examples/gpt_model.h's block: x + attn(ln_1(x)) (causal), then + mlp(ln_2(x))."""

    def __init__(self, embd, heads):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(embd), nn.LayerNorm(embd)
        self.attn = nn.MultiheadAttention(embd, heads, batch_first=True)
        self.mlp = nn.Sequential(OrderedDict(c_fc=nn.Linear(embd, 4 * embd), gelu=nn.GELU(),
                                             c_proj=nn.Linear(4 * embd, embd)))

    def forward(self, x, mask):
        h = self.ln_1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """examples/gpt_model.h's GPT, with the same state-dict names (gpt --save loads into it)."""

    def __init__(self, vocab):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, GPT_EMBD), nn.Embedding(GPT_BLOCK, GPT_EMBD)
        nn.init.normal_(self.wte.weight, std=0.02)
        nn.init.normal_(self.wpe.weight, std=0.02)
        self.h = nn.ModuleList(GPTBlock(GPT_EMBD, GPT_HEADS) for _ in range(GPT_LAYERS))
        self.ln_f = nn.LayerNorm(GPT_EMBD)
        self.lm_head = nn.Linear(GPT_EMBD, vocab, bias=False)
        self.register_buffer("mask", torch.triu(torch.full((GPT_BLOCK, GPT_BLOCK), float("-inf")), 1),
                             persistent=False)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.h:
            x = block(x, self.mask)
        return self.lm_head(self.ln_f(x))


def gpt_tokens_per_s(threads):
    """examples/gpt.c's training step (random windows of the text, AdamW, clipping) in tokens/s
    on `threads` threads, or -1 when the text is missing."""
    try:
        with open(GPT_TEXT, "rb") as f:
            text = f.read()
    except OSError:
        return -1
    chars = sorted(set(text))
    lookup = torch.zeros(256, dtype=torch.long)
    lookup[torch.tensor(chars)] = torch.arange(len(chars))
    ids = lookup[torch.frombuffer(bytearray(text), dtype=torch.uint8).long()]
    set_threads(threads)
    model = GPT(len(chars))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)
    g = torch.Generator().manual_seed(1)

    def step():
        starts = torch.randint(0, len(ids) - GPT_BLOCK - 1, (GPT_BATCH,), generator=g)
        x = torch.stack([ids[s:s + GPT_BLOCK] for s in starts])
        y = torch.stack([ids[s + 1:s + 1 + GPT_BLOCK] for s in starts])
        loss = F.cross_entropy(model(x).view(-1, len(chars)), y.view(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    tokens_s = GPT_BATCH * GPT_BLOCK / seconds_per_call(step, 0.5, 5)
    set_threads(ALL_THREADS)
    return tokens_s


def set_threads(threads):
    """torch.set_num_threads and, when torch loaded OpenBLAS, openblas_set_num_threads (as
    OPENBLAS_NUM_THREADS would at start)."""
    torch.set_num_threads(threads)
    try:
        with open("/proc/self/maps") as f:
            paths = sorted({line.split()[-1] for line in f if "libopenblas" in line})
    except OSError:
        paths = []
    for path in paths:
        try:
            ctypes.CDLL(path).openblas_set_num_threads(threads)
        except (OSError, AttributeError):
            pass


def epoch_once(build, shape, images, labels, threads, samples, run, amp=False):
    """One run of the epoch rows on `threads` threads: (samples/s, mean loss of the first
    steps, mean loss of the last steps). amp: the forward and the loss under bf16 autocast."""
    set_threads(threads)
    torch.manual_seed(42)
    model = build()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1000 + run)
    count, steps = images.shape[0], samples // BATCH
    window = min(100, max(1, steps // 2))
    pos, order, timed, losses = count, None, 0.0, []
    for _ in range(steps):
        if pos + BATCH > count:                     # a new epoch: a new order
            order, pos = torch.randperm(count, generator=g), 0
        idx = order[pos:pos + BATCH]
        pos += BATCH
        x = images[idx].float().div_(255.0).view(BATCH, *shape)
        y = labels[idx]
        start = time.perf_counter()
        if amp:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x), y)
        else:
            loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        timed += time.perf_counter() - start
        losses.append(loss.item())
    return steps * BATCH / timed, sum(losses[:window]) / window, sum(losses[-window:]) / window


def epoch_rows(name, build, shape, images, labels, threads, samples, runs, amp=False):
    """Print one epoch row's key lines (as bench.c's --kv); a line per run on stderr."""
    sps, first, last = [], 0.0, 0.0
    for run in range(runs):
        one = epoch_once(build, shape, images, labels, threads, samples, run, amp)
        print("torch_bench: %s%s, %d thread(s), run %d/%d: %.0f samples/s, loss %.3f (first steps) -> %.3f "
              "(last)" % (name, " bf16 autocast" if amp else "", threads, run + 1, runs, *one),
              file=sys.stderr)
        sps.append(one[0])
        first += one[1] / runs
        last += one[2] / runs
    sps.sort()
    median = sps[runs // 2] if runs % 2 else (sps[runs // 2 - 1] + sps[runs // 2]) / 2
    key = "epoch_%s%s_t%d_" % (name, "_bf16" if amp else "", threads)
    print("%smedian %.1f\n%smin %.1f\n%smax %.1f\n%sloss_first %.4f\n%sloss_last %.4f"
          % (key, median, key, sps[0], key, sps[-1], key, first, key, last))
    sys.stdout.flush()


def infer_us(model, image):
    model.eval()
    with torch.no_grad():
        return seconds_per_call(lambda: model(image), 0.2, 7) * 1e6


INT8_CALIBRATION = 8                                # batches of BATCH training images, as bench.c
INT8_RUNS = 301                                     # single calls timed (--quick: 51)


def median_call_us(fn, runs):
    """The median of `runs` single calls of fn(), in µs, after 10 warm-up calls."""
    for _ in range(10):
        fn()
    took = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        took.append(time.perf_counter() - t)
    took.sort()
    return took[len(took) // 2] * 1e6


def quantized_cnn(engine, calibration):
    """fashion_cnn (seed 42) statically quantized in eager mode on `engine`."""
    import torch.ao.quantization as tq
    torch.backends.quantized.engine = engine
    torch.manual_seed(42)
    cnn = fashion_cnn().eval()
    tq.fuse_modules(cnn, [["0", "1"], ["3", "4"], ["7", "8"]], inplace=True)   # conv+ReLU, linear+ReLU
    model = nn.Sequential(tq.QuantStub(), cnn, tq.DeQuantStub()).eval()
    model.qconfig = tq.get_default_qconfig(engine)
    tq.prepare(model, inplace=True)
    with torch.no_grad():
        for x in calibration:
            model(x)
    return tq.convert(model, inplace=True)


def int8_rows(images):
    """The int8 rows' key lines: the CNN's batch-1 latency on 1 thread, float32 and int8 on each
    quantized engine there is (onednn, qnnpack)."""
    runs = 51 if QUICK else INT8_RUNS
    set_threads(1)
    scaled = images[:INT8_CALIBRATION * BATCH].float().div_(255.0).view(-1, 1, 28, 28)
    calibration = [scaled[i:i + BATCH] for i in range(0, scaled.shape[0], BATCH)]
    image = scaled[:1]
    torch.manual_seed(42)
    cnn = fashion_cnn().eval()
    with torch.no_grad():
        print("cnn_infer_t1_f32_us %.3f" % median_call_us(lambda: cnn(image), runs))
        engines = [e for e in ("onednn", "qnnpack") if e in torch.backends.quantized.supported_engines]
        for engine in engines:
            model = quantized_cnn(engine, calibration)
            print("cnn_int8_infer_us_%s %.3f" % (engine, median_call_us(lambda: model(image), runs)))
    print("torch_int8_engines %s" % (",".join(engines) or "none"))
    sys.stdout.flush()
    set_threads(ALL_THREADS)


def main(args):
    torch.manual_seed(42)
    images, labels, source = load_fashion()
    print("torch_version", torch.__version__)
    print("torch_threads", ALL_THREADS)
    print("torch_data", source)
    sys.stdout.flush()

    start = cpu_mark()
    if args.int8_only:
        int8_rows(images)
        print("others_percent %.1f" % others_percent(start))
        return
    samples = args.samples or (images.shape[0] // 10 if QUICK else images.shape[0])
    runs = args.runs or (1 if QUICK else 3)
    settings = [args.threads] if args.threads else sorted({1, ALL_THREADS})
    for name, build, shape in (("mlp", fashion_mlp, (784,)), ("cnn", fashion_cnn, (1, 28, 28))):
        if args.model in (None, name) and not args.no_epochs:
            for threads in settings:
                epoch_rows(name, build, shape, images, labels, threads, samples, runs, args.amp == "bf16")
    set_threads(ALL_THREADS)
    torch.manual_seed(42)
    if not args.epochs_only:
        micro(images, labels)
    print("others_percent %.1f" % others_percent(start))


def micro(images, labels):
    """The micro-benchmarks: best of short chunks of one repeated step, on all threads (the GPT
    on 1 and all)."""
    tiny = Trainer(tiny_mlp(), x=torch.randn(BATCH, 10), y=torch.randn(BATCH, 1))
    print("tiny_step_us %.3f" % (seconds_per_call(tiny.step, 0.2, 7) * 1e6))
    mlp = Trainer(fashion_mlp(), images, labels, (784,))
    print("mlp_train_sps %.1f" % (BATCH / seconds_per_call(mlp.step, 0.4, 7)))
    cnn = Trainer(fashion_cnn(), images, labels, (1, 28, 28))
    print("cnn_train_sps %.1f" % (BATCH / seconds_per_call(cnn.step, 0.4, 7)))
    lstm = Trainer(LstmHead(), x=torch.randn(BATCH, 50, 32), y=torch.randn(BATCH, 50, 1))
    print("lstm_step_ms %.3f" % (seconds_per_call(lstm.step, 0.4, 7) * 1e3))
    first = images[:1].float().div_(255.0)
    print("mlp_infer_us %.3f" % infer_us(fashion_mlp(), first))
    print("cnn_infer_us %.3f" % infer_us(fashion_cnn(), first.view(1, 1, 28, 28)))
    print("gpt_tokens_s_1 %.1f" % gpt_tokens_per_s(1))
    print("gpt_tokens_s_all %.1f" % gpt_tokens_per_s(ALL_THREADS))
    int8_rows(images)


def minilm_main(model, ids_file, runs, amp):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "models"))
    from test_minilm import bert_embed, load_safetensors
    w = load_safetensors(os.path.join(model, "model.safetensors"))
    with open(ids_file) as f:
        ids = [[int(v) for v in line.partition(":")[2].split()] for line in f if line.startswith("ids ")]
    ids.sort(key=lambda s: -len(s))
    batches = []
    for first in range(0, len(ids), 32):
        group = ids[first:first + 32]
        t = len(group[0])
        batches.append((torch.tensor([s + [0] * (t - len(s)) for s in group]),
                        torch.tensor([[1.0] * len(s) + [0.0] * (t - len(s)) for s in group])))
    start = cpu_mark()
    for threads in (1, 2):
        set_threads(threads)                          # OpenBLAS's threads too (float32's products)
        took = []
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp == "bf16"):
            for r in range(runs + 1):                 # the first pass warms up
                t = time.perf_counter()
                for x, m in batches:
                    bert_embed(w, x, m)
                took.append(time.perf_counter() - t)
        took = sorted(took[1:])
        print("minilm_torch%s_sps_%d %.1f" % ("_bf16" if amp == "bf16" else "", threads,
                                               len(ids) / took[len(took) // 2]))
    print("others_percent %.1f" % others_percent(start))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="the PyTorch side of mlc's benchmark")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--epochs-only", action="store_true")
    parser.add_argument("--no-epochs", action="store_true",
                        help="the micro-benchmarks only (bench.c runs the epochs beside its own)")
    parser.add_argument("--model", choices=("mlp", "cnn"))
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--samples", type=int, default=0)
    parser.add_argument("--runs", type=int, default=0)
    parser.add_argument("--int8-only", action="store_true", help="only the int8 rows (CNN latency)")
    parser.add_argument("--amp", choices=("off", "bf16"), default="off",
                        help="bf16: the epoch rows under torch.autocast(\"cpu\", torch.bfloat16)")
    parser.add_argument("--minilm", nargs=3, metavar=("MODEL_DIR", "IDS_FILE", "RUNS"))
    options = parser.parse_args()
    if 0 < options.samples < BATCH or options.samples < 0 or options.runs < 0 or options.threads < 0:
        parser.error("--samples: 0 (one epoch) or at least %d; --runs, --threads: 0 (the default) or more"
                     % BATCH)
    if options.minilm:
        minilm_main(options.minilm[0], options.minilm[1], int(options.minilm[2]), options.amp)
    else:
        main(options)
