#!/usr/bin/env python3
"""bench_gpu.py: PyTorch eager on the model bench_gpu.c runs, the peer that
bench_gpu.sh sets gpushare's cuda backend against in the same run.

A bf16 MLP of 4 nn.Linear(8192, 8192) layers with ReLU between them, batch
8192, forward and backward from a fixed output gradient (no loss, no
optimizer), input without requires_grad (so the first layer computes no
input gradient, as in bench_gpu.c). One difference stays: PyTorch keeps the
weight gradients in bf16 (the parameters' type) where gpushare accumulates
them in fp32, which costs gpushare the wider writes. Wall-clock over whole
steps after warm-up, each ending in torch.cuda.synchronize().

Usage: bench_gpu.py [BATCH [WIDTH [STEPS]]]
"""
import sys
import time

import torch


def main():
    batch = int(sys.argv[1]) if len(sys.argv) > 1 else 8192
    width = int(sys.argv[2]) if len(sys.argv) > 2 else 8192
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 10
    if not torch.cuda.is_available():
        print("bench_gpu.py: no CUDA device for PyTorch", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    torch.manual_seed(0)
    layers = []
    for i in range(4):
        layers.append(torch.nn.Linear(width, width, dtype=torch.bfloat16, device=dev))
        if i < 3:
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers)
    x = torch.randn(batch, width, dtype=torch.bfloat16, device=dev)
    g = torch.randn(batch, width, dtype=torch.bfloat16, device=dev)

    def step():
        for p in model.parameters():
            p.grad = None
        out = model(x)
        out.backward(g)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    sec = time.perf_counter() - t0
    flop = steps * 2.0 * batch * width * width * (3 * 4 - 1)
    tflops = flop / sec / 1e12
    print(f"pytorch {torch.__version__} bf16 MLP 4x{width}, batch {batch}: "
          f"{sec / steps * 1e3:.1f} ms/step, {batch * steps / sec:.0f} samples/s, "
          f"{tflops:.1f} TFLOP/s, {100 * tflops / 990:.1f}% of 990")
    print(f"RESULT pytorch samples_per_s={batch * steps / sec:.1f} tflops={tflops:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
