#!/usr/bin/env python3
"""torch_ref.py: the gpushare example recipes in PyTorch, for bench_train.sh.

The peer that gpushare-run's speed and accuracy are read against: the same
model (examples/fashion-*.txtpb), the same data (Debian's Fashion-MNIST IDX
files, pixels / 255), the same recipe (batch, epochs, Adam with epsilon 1e-7
as Keras uses, Glorot-uniform kernels and zero biases, the last partial batch
dropped), on the CPU with the same number of threads. PyTorch is NCHW where
gpushare is NHWC; SAME padding is TensorFlow's (extra padding at the bottom
and right), so shapes match layer for layer. Prints one JSON line last.

By default (--start gpushare) it also starts where gpushare-run starts: the
same initial weights, drawn from --seed by gpushare's splitmix64 streams and
moved into PyTorch's layouts, and the same data order, epoch by epoch. The
two runs then differ only in their arithmetic: the first step's loss agrees
to 7 digits and after 100 steps to 5-6, and test accuracies after one epoch
can be read against each other (with --start torch, PyTorch's own draw, one
epoch of the MobileNet moved by two to four points from seed to seed).

usage: torch_ref.py {mlp,cnn,mobilenet} [--epochs N] [--batch N]
                    [--threads N] [--data-dir DIR] [--max-steps N] [--seed N]
                    [--schedule constant|cosine] [--start gpushare|torch]
"""
import os

# Debian's torch calls OpenBLAS (libblas.so.3) from inside its own OpenMP
# threads; left alone, OpenBLAS starts a thread per visible core as well and
# the two oversubscribe the CPU, which slows the MLP severalfold. One
# OpenBLAS thread is the peer's best setting, and it gets it.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import gzip
import json
import math
import struct
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def read_idx(path):
    with open(path, "rb") as f:
        data = f.read()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    magic = struct.unpack(">I", data[:4])[0]
    rank = magic & 0xFF
    dims = struct.unpack(">" + "I" * rank, data[4:4 + 4 * rank])
    t = torch.frombuffer(bytearray(data[4 + 4 * rank:]), dtype=torch.uint8)
    return t.reshape(dims)


class SameConv(nn.Module):
    """Conv2d with TensorFlow SAME/VALID padding (groups=channels: depthwise)."""

    def __init__(self, cin, cout, k, stride=1, same=True, groups=1):
        super().__init__()
        self.k, self.stride, self.same = k, stride, same
        self.conv = nn.Conv2d(cin, cout, k, stride=stride, padding=0, groups=groups)

    def forward(self, x):
        if self.same:
            h, w = x.shape[2], x.shape[3]
            ph = max((math.ceil(h / self.stride) - 1) * self.stride + self.k - h, 0)
            pw = max((math.ceil(w / self.stride) - 1) * self.stride + self.k - w, 0)
            x = F.pad(x, (pw // 2, pw - pw // 2, ph // 2, ph - ph // 2))
        return self.conv(x)


def build(name):
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(),
                             nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))
    if name == "cnn":
        return nn.Sequential(SameConv(1, 32, 5), nn.ReLU(), nn.MaxPool2d(2),
                             SameConv(32, 64, 5), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Flatten(), nn.Linear(7 * 7 * 64, 1024), nn.ReLU(),
                             nn.Linear(1024, 10))
    if name == "mobilenet":
        return nn.Sequential(
            SameConv(1, 32, 3, stride=2), nn.ReLU(),
            SameConv(32, 32, 3, groups=32), nn.ReLU(), SameConv(32, 64, 1), nn.ReLU(),
            SameConv(64, 64, 3, stride=2, groups=64), nn.ReLU(), SameConv(64, 128, 1), nn.ReLU(),
            SameConv(128, 128, 3, groups=128), nn.ReLU(), SameConv(128, 128, 1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10))
    raise SystemExit(f"unknown model {name!r}: mlp, cnn or mobilenet")


def init_glorot(model):
    # Glorot's limit depends on fan_in + fan_out only, which PyTorch and
    # Keras agree on for dense, conv and depthwise kernels.
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            nn.init.xavier_uniform_(m.weight)
            nn.init.zeros_(m.bias)


# ---- gpushare's own start: the same initial weights and the same data order
# (runtime/data.c and train.c), so that two runs differ only in their
# arithmetic and their accuracies can be read against each other after even
# one epoch, when a different draw of either moves a small net by points.

M64 = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15


def _mix(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


class SplitMix64:
    """gs_rng_*: splitmix64, seeded per (seed, stream) as gs_rng_seed."""

    def __init__(self, seed, stream):
        s = (seed ^ 0x6A09E667F3BCC909) & M64
        s = (s + GAMMA) & M64
        a = _mix(s)
        t = (stream ^ a ^ 0xBB67AE8584CAA73B) & M64
        t = (t + GAMMA) & M64
        self.state = _mix(t) ^ a

    def next(self):
        self.state = (self.state + GAMMA) & M64
        return _mix(self.state)

    def below(self, bound):
        if bound <= 1:
            return 0
        threshold = ((1 << 64) - bound) % bound
        while True:
            r = self.next()
            if r >= threshold:
                return r % bound

    def uniforms(self, count):
        """count gs_rng_uniform draws at once (the states are an arithmetic
        sequence), as float32; advances the state past them."""
        import numpy as np
        k = np.arange(1, count + 1, dtype=np.uint64)
        with np.errstate(over="ignore"):
            z = np.uint64(self.state) + k * np.uint64(GAMMA)
            z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
        self.state = (self.state + count * GAMMA) & M64
        return (z >> np.uint64(40)).astype(np.float32) * np.float32(1.0 / 16777216.0)


def gs_shuffle(n, seed, epoch):
    """gs_dataset_shuffle: Fisher-Yates from the (seed, epoch) stream."""
    perm = list(range(n))
    rng = SplitMix64(seed, epoch)
    for i in range(n, 1, -1):
        j = rng.below(i)
        perm[i - 1], perm[j] = perm[j], perm[i - 1]
    return torch.tensor(perm, dtype=torch.long)


# Position in the JobSpec (examples/fashion-*.txtpb) of each layer with
# weights, in the order build() creates them; and for a dense layer that
# follows a flatten of (h, w, c), that shape (gpushare flattens NHWC).
GS_LAYERS = {"mlp": [(1, None), (2, None), (3, None)],
             "cnn": [(0, None), (2, None), (5, (7, 7, 64)), (6, None)],
             "mobilenet": [(0, None), (1, None), (2, None), (3, None), (4, None), (5, None),
                           (6, None), (8, None)]}


def init_gpushare(model, name, seed):
    """init_params of runtime/train.c: Glorot-uniform kernels from one
    stream per layer position, zero biases; gpushare's layouts (dense (C, OC),
    conv (KH, KW, C, F), depthwise (KH, KW, C)) moved into PyTorch's."""
    import numpy as np
    mods = [m for m in model.modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    spots = GS_LAYERS[name]
    assert len(mods) == len(spots)
    for m, (pos, flat) in zip(mods, spots):
        w = m.weight
        if isinstance(m, nn.Linear):
            oc, c = w.shape
            fan_in, fan_out, gs_shape = c, oc, (c, oc)
        elif m.groups > 1:  # depthwise: (C, 1, KH, KW)
            ch, _, kh, kw = w.shape
            fan_in, fan_out, gs_shape = kh * kw * ch, kh * kw, (kh, kw, ch)
        else:
            f, c, kh, kw = w.shape
            fan_in, fan_out, gs_shape = kh * kw * c, kh * kw * f, (kh, kw, c, f)
        limit = math.sqrt(6.0 / (fan_in + fan_out))
        u = SplitMix64(seed, pos).uniforms(int(np.prod(gs_shape)))
        k = ((2.0 * u.astype(np.float64) - 1.0) * limit).astype(np.float32).reshape(gs_shape)
        if isinstance(m, nn.Linear):
            if flat:  # rows in (h, w, c) order; PyTorch flattens (c, h, w)
                h, wd, c = flat
                k = k.reshape(h * wd, c, oc).transpose(1, 0, 2).reshape(c * h * wd, oc)
            k = k.T
        elif m.groups > 1:
            k = k.transpose(2, 0, 1)[:, None, :, :]
        else:
            k = k.transpose(3, 2, 0, 1)
        with torch.no_grad():
            w.copy_(torch.from_numpy(np.ascontiguousarray(k)))
            m.bias.zero_()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-steps", type=int, default=0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--schedule", choices=["constant", "cosine"], default="constant",
                    help="the learning-rate schedule of gpushare's LearningRateSchedule "
                         "(no warm-up, final fraction 0)")
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--start", choices=["gpushare", "torch"], default="gpushare",
                    help="gpushare: the initial weights and data order gpushare-run draws "
                         "from --seed, bit for bit (the default); torch: PyTorch's own draw")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    d = a.data_dir
    xtr = read_idx(os.path.join(d, "train-images-idx3-ubyte.gz")).float().div_(255).unsqueeze(1)
    ytr = read_idx(os.path.join(d, "train-labels-idx1-ubyte.gz")).long()
    xte = read_idx(os.path.join(d, "t10k-images-idx3-ubyte.gz")).float().div_(255).unsqueeze(1)
    yte = read_idx(os.path.join(d, "t10k-labels-idx1-ubyte.gz")).long()
    model = build(a.model)
    if a.start == "gpushare":
        init_gpushare(model, a.model, a.seed)
    else:
        init_glorot(model)
    opt = torch.optim.Adam(model.parameters(), lr=a.lr, betas=(0.9, 0.999), eps=1e-7)
    steps_per_epoch = xtr.shape[0] // a.batch
    total = steps_per_epoch * a.epochs
    if a.max_steps and a.max_steps < total:
        total = a.max_steps
    # gs_recipe_learning_rate: step s of total takes lr * (1 + cos(pi s / (total - 1))) / 2.
    sched = None
    if a.schedule == "cosine":
        span = max(total - 1, 1)
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: 0.5 * (1.0 + math.cos(math.pi * min(s / span, 1.0))))
    steps, train_time, last_loss = 0, 0.0, float("nan")
    for epoch in range(a.epochs):
        perm = (gs_shuffle(xtr.shape[0], a.seed, epoch) if a.start == "gpushare"
                else torch.randperm(xtr.shape[0]))
        model.train()
        losses = []
        t0 = time.perf_counter()
        for s in range(steps_per_epoch):
            idx = perm[s * a.batch:(s + 1) * a.batch]
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(xtr[idx]), ytr[idx])
            loss.backward()
            opt.step()
            if sched:
                sched.step()
            losses.append(loss.item())
            steps += 1
            if a.max_steps and steps >= a.max_steps:
                break
        train_time += time.perf_counter() - t0
        last_loss = sum(losses) / len(losses)
        if a.max_steps and steps >= a.max_steps:
            break
    model.eval()
    correct, total_loss = 0, 0.0
    with torch.no_grad():
        for i in range(0, xte.shape[0], a.batch):
            out = model(xte[i:i + a.batch])
            total_loss += F.cross_entropy(out, yte[i:i + a.batch], reduction="sum").item()
            correct += (out.argmax(1) == yte[i:i + a.batch]).sum().item()
    res = {
        "model": a.model, "steps": steps, "threads": a.threads, "batch_size": a.batch,
        "train_loss": last_loss, "test_loss": total_loss / xte.shape[0],
        "test_accuracy": correct / xte.shape[0],
        "samples_per_second": steps * a.batch / train_time if train_time > 0 else 0.0,
        "torch": torch.__version__,
    }
    print(json.dumps(res))


if __name__ == "__main__":
    sys.exit(main())
