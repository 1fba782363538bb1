#!/usr/bin/env python3
"""torch_twin_check.py: tests/bench/gs_torch.py's layers against their
definitions, for the kinds gpushare-run cannot yet be compared on.

Each check computes the definition independently (numpy, float64, NHWC as
gpushare lays tensors out) and compares it with the twin; prints "ok - ..."
or "FAIL - ..." per check and exits 1 on any failure.
usage: torch_twin_check.py DIR   (DIR: a scratch directory)
"""
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
import gs_torch as g  # noqa: E402

from google.protobuf import text_format  # noqa: E402

FAILED = 0


def check(ok, what):
    global FAILED
    print(("ok - " if ok else "FAIL - ") + what)
    FAILED += 0 if ok else 1


def model(text):
    spec = g.pb2().JobSpec()
    text_format.Parse(text, spec)
    return spec, g.Model(spec.model)


GPT = """
name: "tiny-gpt"
model {
  input { sequence_length: 7 }
  layer { name: "tok" embedding { vocab_size: 50 dim: 15 } }
  layer { name: "pos" position_embedding {} }
  layer { name: "ln1" layer_norm { epsilon: 1e-5 } }
  layer { name: "attn" causal_self_attention { heads: 3 head_size: 5 } }
  layer { name: "res1" add {} inputs: "attn" inputs: "pos" }
  layer { name: "fc" dense { units: 20 } }
  layer { name: "act" gelu {} }
  layer { name: "drop" dropout { rate: 0.0 } }
  layer { name: "head" dense { units: 50 } }
}
seed: 11
"""


def main():
    scratch = sys.argv[1]
    torch.manual_seed(0)
    spec, m = model(GPT)
    m.init(seed=spec.seed)
    t = {n: a.astype(np.float64) for n, a in m.tensors().items()}

    # init: the embedding tables are uniform in +-sqrt(3) * 0.02 from the
    # layer's stream, the kernels Glorot from theirs, gamma 1, biases 0.
    u = g.SplitMix64(11, 0).uniforms(50 * 15).astype(np.float64)
    check(np.array_equal(t["tok.embeddings"], ((2 * u - 1) * math.sqrt(3) * 0.02).astype(np.float32)
                         .reshape(50, 15)), "tok.embeddings: gpushare's stream of layer 0, std 0.02")
    u = g.SplitMix64(11, 3).uniforms(15 * 45 + 15 * 15).astype(np.float64)
    lim_q, lim_o = math.sqrt(6 / (15 + 45)), math.sqrt(6 / (15 + 15))
    check(np.array_equal(t["attn.qkv_kernel"], ((2 * u[:675] - 1) * lim_q).astype(np.float32).reshape(15, 45))
          and np.array_equal(t["attn.out_kernel"], ((2 * u[675:] - 1) * lim_o).astype(np.float32)
                             .reshape(15, 15)),
          "attn: qkv_kernel then out_kernel, Glorot, from layer 3's stream")
    check((t["ln1.gamma"] == 1).all() and (t["ln1.beta"] == 0).all() and (t["attn.qkv_bias"] == 0).all(),
          "ln1: gamma 1, beta 0; biases 0")

    # forward against the definition in float64
    rng = np.random.default_rng(1)
    for name in t:
        if not name.endswith(("gamma", "beta")):
            t[name] = rng.normal(0, 0.3, t[name].shape)
        elif name.endswith("gamma"):
            t[name] = 1 + rng.normal(0, 0.1, t[name].shape)
    m.load_tensors({n: a.astype(np.float32) for n, a in t.items()}, "the check's tensors")
    ids = rng.integers(0, 50, size=(3, 7))
    x = t["tok.embeddings"][ids] + t["pos.embeddings"]
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    h = (x - mu) / np.sqrt(var + 1e-5) * t["ln1.gamma"] + t["ln1.beta"]
    qkv = h @ t["attn.qkv_kernel"] + t["attn.qkv_bias"]
    y = np.zeros((3, 7, 15))
    for n in range(3):
        for hd in range(3):
            q = qkv[n, :, hd * 5:hd * 5 + 5]
            k = qkv[n, :, 15 + hd * 5:15 + hd * 5 + 5]
            v = qkv[n, :, 30 + hd * 5:30 + hd * 5 + 5]
            for i in range(7):
                s = q[i] @ k[:i + 1].T / math.sqrt(5)
                p = np.exp(s - s.max())
                y[n, i, hd * 5:hd * 5 + 5] = (p / p.sum()) @ v[:i + 1]
    r = y @ t["attn.out_kernel"] + t["attn.out_bias"] + x
    f = r @ t["fc.kernel"] + t["fc.bias"]
    f = 0.5 * f * (1 + np.tanh(math.sqrt(2 / math.pi) * (f + 0.044715 * f ** 3)))
    logits = f @ t["head.kernel"] + t["head.bias"]
    m.eval()
    got = m(torch.from_numpy(ids)).double().detach().numpy()
    err = np.abs(got - logits).max() / np.abs(logits).max()
    check(err < 1e-5, f"a transformer block's logits against the float64 definition: "
          f"relative error {err:.2e} (allowed 1e-5)")
    ids2 = ids.copy()
    ids2[:, 4:] = (ids2[:, 4:] + 1) % 50
    got2 = m(torch.from_numpy(ids2)).detach().numpy()
    check(np.array_equal(got2[:, :4], got[:, :4].astype(np.float32)) and
          np.abs(got2[:, 4:] - got[:, 4:]).max() > 1e-3,
          "causal: tokens from position 4 on change no logit before it, and do change theirs")
    # the language-model loss: every position against the next token
    tgt = rng.integers(0, 50, size=(3, 7))
    z = logits - logits.max(-1, keepdims=True)
    want = -(z - np.log(np.exp(z).sum(-1, keepdims=True)))[np.arange(3)[:, None], np.arange(7), tgt].mean()
    lo = g.loss_fn(m, m(torch.from_numpy(ids)), torch.from_numpy(tgt)).item()
    check(abs(lo - want) < 1e-5 * want, f"token loss {lo:.6f}: the mean over 21 positions {want:.6f}")

    # safetensors: written in gpushare's names, read back into a fresh model
    path = os.path.join(scratch, "gpt.safetensors")
    g.write_safetensors(path, m.tensors())
    _, m2 = model(GPT)
    m2.load_tensors(g.read_safetensors(path), path)
    m2.eval()
    check(torch.equal(m2(torch.from_numpy(ids)), m(torch.from_numpy(ids))),
          "safetensors written and read back: the same logits")

    # images: conv (kh, kw, c, f), batch_norm over (n, h, w), average pool,
    # layer_norm over channels, flatten in (h, w, c) order
    _, c = model("""model { input { height: 6 width: 6 channels: 2 }
      layer { conv2d { filters: 3 kernel_size: 3 padding: VALID } }
      layer { batch_norm { momentum: 0.25 epsilon: 0.001 } }
      layer { average_pool2d { pool_size: 2 } }
      layer { layer_norm {} }
      layer { flatten {} }
      layer { dense { units: 4 } } }""")
    w = {n: rng.normal(0, 0.5, a.shape) for n, a in c.tensors().items()}
    w["batch_norm_1.running_var"] = np.abs(w["batch_norm_1.running_var"]) + 0.5
    c.load_tensors({n: a.astype(np.float32) for n, a in w.items()}, "the check's tensors")
    img = rng.random((5, 6, 6, 2))                  # NHWC
    conv = np.zeros((5, 4, 4, 3))
    for i in range(4):
        for j in range(4):
            conv[:, i, j] = np.einsum("nhwc,hwcf->nf", img[:, i:i + 3, j:j + 3], w["conv2d_1.kernel"])
    conv += w["conv2d_1.bias"]
    mean, var = conv.mean((0, 1, 2)), conv.var((0, 1, 2))
    bn = (conv - mean) / np.sqrt(var + 1e-3) * w["batch_norm_1.gamma"] + w["batch_norm_1.beta"]
    pool = bn.reshape(5, 2, 2, 2, 2, 3).mean((2, 4))
    mu, va = pool.mean(-1, keepdims=True), pool.var(-1, keepdims=True)
    ln = (pool - mu) / np.sqrt(va + 1e-5) * w["layer_norm_1.gamma"] + w["layer_norm_1.beta"]
    out = ln.reshape(5, -1) @ w["dense_1.kernel"] + w["dense_1.bias"]
    c.train()
    got = c(torch.from_numpy(img.transpose(0, 3, 1, 2)).float()).double().detach().numpy()
    err = np.abs(got - out).max() / np.abs(out).max()
    check(err < 1e-5, f"conv, batch_norm (training), average_pool2d, layer_norm, flatten, dense against "
          f"NHWC float64: relative error {err:.2e} (allowed 1e-5)")
    rm = c.tensors()["batch_norm_1.running_mean"]
    rv = c.tensors()["batch_norm_1.running_var"]
    want_m = 0.75 * w["batch_norm_1.running_mean"] + 0.25 * mean
    want_v = 0.75 * w["batch_norm_1.running_var"] + 0.25 * var * 80 / 79
    check(np.allclose(rm, want_m, rtol=1e-5, atol=1e-6) and np.allclose(rv, want_v, rtol=1e-5, atol=1e-6),
          "batch_norm: running statistics with momentum 0.25, the variance unbiased (M = 80)")
    print(f"{FAILED} failed")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
