#!/usr/bin/env python3
"""torch_ref.py: the gpushare example recipes in PyTorch, for bench_train.sh.

The peer that gpushare-run's speed and accuracy are read against: the same
model (examples/fashion-*.txtpb), the same data (Debian's Fashion-MNIST IDX
files, pixels / 255), the same recipe (batch, epochs, Adam with epsilon 1e-7
as Keras uses, Glorot-uniform kernels and zero biases, the last partial batch
dropped), on the CPU with the same number of threads. PyTorch is NCHW where
gpushare is NHWC; SAME padding is TensorFlow's (extra padding at the bottom
and right), so shapes match layer for layer. Prints one JSON line last.

usage: torch_ref.py {mlp,cnn,mobilenet} [--epochs N] [--batch N]
                    [--threads N] [--data-dir DIR] [--max-steps N] [--seed N]
"""
import os

# Debian's torch calls OpenBLAS (libblas.so.3) from inside its own OpenMP
# threads; left alone, OpenBLAS starts a thread per visible core as well and
# the two oversubscribe the CPU (measured on the MLP, 2 threads: 12k samples/s
# with OPENBLAS_NUM_THREADS=2, 38k with 1). The peer gets its best setting.
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
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    d = a.data_dir
    xtr = read_idx(os.path.join(d, "train-images-idx3-ubyte.gz")).float().div_(255).unsqueeze(1)
    ytr = read_idx(os.path.join(d, "train-labels-idx1-ubyte.gz")).long()
    xte = read_idx(os.path.join(d, "t10k-images-idx3-ubyte.gz")).float().div_(255).unsqueeze(1)
    yte = read_idx(os.path.join(d, "t10k-labels-idx1-ubyte.gz")).long()
    model = build(a.model)
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
        perm = torch.randperm(xtr.shape[0])
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
