"""gs_torch.py: the PyTorch twin of a gpushare JobSpec.

A job spec (a .txtpb or an encoded .pb of gpushare.v1.JobSpec) becomes a
PyTorch module, its datasets tensors and its recipe a training loop, all
read from the spec itself, so any model gpushare can run has a peer to be
checked against. tests/bench/torch_ref.py is the command line over it.

The model is NHWC-faithful where it matters and PyTorch-native where it is
free to be: images run NCHW (PyTorch's fast layout) and every layer that
sees the channel axis takes it where gpushare does (concat and batch_norm
along the channels, layer_norm over them); flatten moves an image to NHWC
before it flattens, so a flat vector is gpushare's (h, w, c) order and a
dense kernel's rows need no reordering. A sequence is (N, T, C); a token
input (N, T) of ids.

Parameters carry gpushare's names ("<layer>.<suffix>") and shapes: PARAMS
says, per layer kind, each tensor's gpushare shape, how it moves into the
PyTorch module, and how gpushare initialises it (INIT). So the same table
loads gpushare's exported safetensors, writes safetensors gpushare's way and
draws gpushare's initial weights (--start gpushare): splitmix64 from the
job's seed, one stream per layer position (runtime/train.c init_params).

Parity is defined in FLOAT32 with dropout at rate 0 (or in evaluation): a
dropout mask here is PyTorch's draw, not gpushare's, and a mixed-precision
job runs here in float32.
"""
import gzip
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

SRC = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

# ---- the schema ------------------------------------------------------------

_PB2 = None


def pb2():
    """gpushare_pb2, generated from this tree's proto/gpushare.proto by
    protoc into a temporary directory (so it always matches the schema)."""
    global _PB2
    if _PB2 is None:
        out = tempfile.mkdtemp(prefix="gs-torch-pb2-")
        try:
            subprocess.run(["protoc", "--python_out=" + out, "--proto_path=" + os.path.join(SRC, "proto"),
                            "gpushare.proto"], check=True)
        except (OSError, subprocess.CalledProcessError) as ex:
            raise SystemExit(f"gs_torch: protoc could not generate gpushare_pb2 ({ex}): "
                             "apt-get install protobuf-compiler")
        sys.path.insert(0, out)
        try:
            import gpushare_pb2  # noqa: E402
        finally:
            sys.path.remove(out)
            shutil.rmtree(out, ignore_errors=True)  # loaded: the file is no longer needed
        _PB2 = gpushare_pb2
    return _PB2


def read_spec(path):
    """A JobSpec from a .txtpb (text format) or an encoded .pb file."""
    from google.protobuf import text_format
    spec = pb2().JobSpec()
    with open(path, "rb") as f:
        data = f.read()
    if path.endswith(".pb"):
        spec.ParseFromString(data)
    else:
        try:
            text_format.Parse(data.decode("utf-8"), spec)
        except text_format.ParseError as ex:
            raise SystemExit(f"{path}: not a gpushare.v1.JobSpec in text format: {ex}")
    return spec


# ---- gpushare's PRNG (runtime/data.c) ---------------------------------------

M64 = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15


def _mix(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def _mix_np(z):
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


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

    def raw(self, count):
        """The next count gs_rng_next values at once (the states are an
        arithmetic sequence), as uint64; advances the state past them."""
        k = np.arange(1, count + 1, dtype=np.uint64)
        with np.errstate(over="ignore"):
            z = np.uint64(self.state) + k * np.uint64(GAMMA)
        self.state = (self.state + count * GAMMA) & M64
        return _mix_np(z)

    def uniforms(self, count):
        """count gs_rng_uniform draws (the top 24 bits / 2^24), float32."""
        return (self.raw(count) >> np.uint64(40)).astype(np.float32) * np.float32(1.0 / 16777216.0)

    def belows(self, count, bound):
        """count gs_rng_below(bound) draws; a rejected draw (as likely as
        bound / 2^64) takes the scalar path from where it happened."""
        threshold = ((1 << 64) - bound) % bound
        start = self.state
        r = self.raw(count)
        bad = np.nonzero(r < np.uint64(threshold))[0]
        if bad.size == 0:
            return (r % np.uint64(bound)).astype(np.int64)
        first = int(bad[0])
        out = (r[:first] % np.uint64(bound)).astype(np.int64)
        self.state = (start + first * GAMMA) & M64
        rest = [self.below(bound) for _ in range(count - first)]
        return np.concatenate([out, np.array(rest, dtype=np.int64)])


def gs_shuffle(n, seed, epoch):
    """gs_dataset_shuffle: Fisher-Yates from the (seed, epoch) stream."""
    perm = list(range(n))
    rng = SplitMix64(seed, epoch)
    for i in range(n, 1, -1):
        j = rng.below(i)
        perm[i - 1], perm[j] = perm[j], perm[i - 1]
    return torch.tensor(perm, dtype=torch.long)


# ---- initialisation: one rule per parameter ----------------------------------

# Each rule takes the parameter's gpushare shape and a source of uniform
# [0, 1) float32 draws (gpushare's stream, or PyTorch's generator for
# --start torch) and returns the initial float32 array.


def _glorot(fans):
    def rule(shape, uniforms):
        fan_in, fan_out = fans(shape)
        limit = math.sqrt(6.0 / (fan_in + fan_out))
        u = uniforms(int(np.prod(shape)))
        return ((2.0 * u.astype(np.float64) - 1.0) * limit).astype(np.float32).reshape(shape)
    return rule


def _uniform(limit):
    def rule(shape, uniforms):
        u = uniforms(int(np.prod(shape)))
        return ((2.0 * u.astype(np.float64) - 1.0) * limit).astype(np.float32).reshape(shape)
    return rule


def _const(v):
    return lambda shape, uniforms: np.full(shape, v, dtype=np.float32)


FAN_2D = lambda s: (s[0], s[1])                            # (in, out)  # noqa: E731
FAN_CONV = lambda s: (s[0] * s[1] * s[2], s[0] * s[1] * s[3])  # (kh, kw, c, f)  # noqa: E731
FAN_DEPTHWISE = lambda s: (s[0] * s[1] * s[2], s[0] * s[1])  # Keras: (kh, kw, c, 1)  # noqa: E731

# (kind, suffix) -> rule. Those that draw take their draws in parameter order
# from one stream per layer position (layer_stream).
INIT = {
    ("dense", "kernel"): _glorot(FAN_2D),
    ("conv2d", "kernel"): _glorot(FAN_CONV),
    ("depthwise_conv2d", "kernel"): _glorot(FAN_DEPTHWISE),
    ("causal_self_attention", "qkv_kernel"): _glorot(FAN_2D),
    ("causal_self_attention", "out_kernel"): _glorot(FAN_2D),
    ("embedding", "embeddings"): _uniform(math.sqrt(3.0) * 0.02),           # std 0.02
    ("position_embedding", "embeddings"): _uniform(math.sqrt(3.0) * 0.02),
    ("batch_norm", "gamma"): _const(1.0),
    ("layer_norm", "gamma"): _const(1.0),
    ("batch_norm", "running_var"): _const(1.0),
}
# Every other parameter (biases, beta, running_mean) starts at 0.


def layer_stream(seed, position):
    """The uniform source of the layer at `position`: gpushare's stream
    (seed, position), drawn in the order of the layer's parameters."""
    return SplitMix64(seed, position).uniforms


def torch_stream(generator):
    return lambda count: torch.rand(count, generator=generator, dtype=torch.float32).numpy()


# ---- the layers --------------------------------------------------------------

class Shape:
    """A layer's output as gpushare sees it: image (h, w, c), flat (c),
    sequence (t, c) or tokens (t)."""

    def __init__(self, kind, h=1, w=1, c=1, t=1):
        self.kind, self.h, self.w, self.c, self.t = kind, h, w, c, t

    def __str__(self):
        return {"image": f"{self.h}x{self.w}x{self.c}", "flat": f"{self.c}",
                "seq": f"{self.t}x{self.c}", "tokens": f"{self.t} tokens"}[self.kind]


class Param:
    """One of gpushare's tensors and where it lives in the module:
    `get()` the PyTorch tensor, `to_torch(a)` a gpushare-layout tensor moved
    into its layout, `from_torch(t)` back."""

    def __init__(self, suffix, shape, get, to_torch=None, from_torch=None, trained=True):
        self.suffix, self.shape, self.get, self.trained = suffix, tuple(shape), get, trained
        self.to_torch = to_torch or (lambda a: a)
        self.from_torch = from_torch or (lambda t: t)


def _t2d(a):
    return a.t()


def same_pad(x, k, stride):
    """TensorFlow SAME: the extra padding goes to the bottom and right."""
    h, w = x.shape[2], x.shape[3]
    ph = max((math.ceil(h / stride) - 1) * stride + k - h, 0)
    pw = max((math.ceil(w / stride) - 1) * stride + k - w, 0)
    return F.pad(x, (pw // 2, pw - pw // 2, ph // 2, ph - ph // 2))


def window_out(n, k, stride, same):
    return (n + stride - 1) // stride if same else (n - k) // stride + 1


class Layer(nn.Module):
    """One gpushare layer: `kind`, `name`, its input indices (-1: the
    model's input), `params` (gpushare's tensors) and forward(*inputs)."""

    def __init__(self, kind, name, inputs, out):
        super().__init__()
        self.kind, self.gs_name, self.inputs, self.out = kind, name, inputs, out
        self.params = []
        self.relu = False


class Dense(Layer):
    def __init__(self, name, inputs, ins, msg):
        if ins.kind not in ("flat", "seq"):
            raise SpecError(name, "dense", f"dense needs a flat input or a sequence, got {ins}")
        units = msg.units
        super().__init__("dense", name, inputs,
                         Shape("flat", c=units) if ins.kind == "flat" else Shape("seq", t=ins.t, c=units))
        self.lin = nn.Linear(ins.c, units)
        self.relu = msg.activation == pb2().RELU
        self.params = [Param("kernel", (ins.c, units), lambda: self.lin.weight, _t2d, _t2d),
                       Param("bias", (units,), lambda: self.lin.bias)]

    def forward(self, x):
        y = self.lin(x)
        return F.relu(y) if self.relu else y


class Conv(Layer):
    """conv2d and depthwise_conv2d (groups = channels), SAME or VALID."""

    def __init__(self, name, inputs, ins, msg, depthwise):
        kind = "depthwise_conv2d" if depthwise else "conv2d"
        if ins.kind != "image":
            raise SpecError(name, kind, f"{kind} needs an image input, got {ins}")
        k, stride, same = msg.kernel_size, msg.stride, msg.padding == pb2().SAME
        f = ins.c if depthwise else msg.filters
        out = Shape("image", window_out(ins.h, k, stride, same), window_out(ins.w, k, stride, same), f)
        super().__init__(kind, name, inputs, out)
        self.k, self.stride, self.same = k, stride, same
        self.conv = nn.Conv2d(ins.c, f, k, stride=stride, groups=ins.c if depthwise else 1)
        self.relu = msg.activation == pb2().RELU
        w = lambda: self.conv.weight  # noqa: E731
        if depthwise:   # (kh, kw, c) <-> (c, 1, kh, kw)
            kp = Param("kernel", (k, k, ins.c), w, lambda a: a.permute(2, 0, 1).unsqueeze(1),
                       lambda t: t.squeeze(1).permute(1, 2, 0))
        else:           # (kh, kw, c, f) <-> (f, c, kh, kw)
            kp = Param("kernel", (k, k, ins.c, f), w, lambda a: a.permute(3, 2, 0, 1),
                       lambda t: t.permute(2, 3, 1, 0))
        self.params = [kp, Param("bias", (f,), lambda: self.conv.bias)]

    def forward(self, x):
        if self.same:
            x = same_pad(x, self.k, self.stride)
        y = self.conv(x)
        return F.relu(y) if self.relu else y


class Pool(Layer):
    """max_pool2d and average_pool2d: VALID windows."""

    def __init__(self, name, inputs, ins, msg, kind):
        if ins.kind != "image":
            raise SpecError(name, kind, f"{kind} needs an image input, got {ins}")
        k = msg.pool_size
        stride = msg.stride if msg.HasField("stride") and msg.stride else k
        if k > ins.h or k > ins.w:
            raise SpecError(name, kind + ".pool_size", f"pool {k}x{k} does not fit input {ins}")
        super().__init__(kind, name, inputs, Shape("image", window_out(ins.h, k, stride, False),
                                                   window_out(ins.w, k, stride, False), ins.c))
        self.k, self.stride = k, stride
        self.fn = F.max_pool2d if kind == "max_pool2d" else F.avg_pool2d

    def forward(self, x):
        return self.fn(x, self.k, self.stride)


class GlobalAveragePooling(Layer):
    def __init__(self, name, inputs, ins):
        if ins.kind != "image":
            raise SpecError(name, "global_average_pooling2d",
                            f"global_average_pooling2d needs an image input, got {ins}")
        super().__init__("global_average_pooling2d", name, inputs, Shape("flat", c=ins.c))

    def forward(self, x):
        return x.mean(dim=(2, 3))


class Flatten(Layer):
    def __init__(self, name, inputs, ins):
        n = {"image": ins.h * ins.w * ins.c, "flat": ins.c, "seq": ins.t * ins.c}.get(ins.kind)
        if n is None:
            raise SpecError(name, "flatten", f"flatten cannot take {ins}")
        super().__init__("flatten", name, inputs, Shape("flat", c=n))
        self.image = ins.kind == "image"

    def forward(self, x):
        if self.image:  # gpushare flattens NHWC: (h, w, c) order
            x = x.permute(0, 2, 3, 1)
        return x.reshape(x.shape[0], -1)


class Elementwise(Layer):
    """relu, gelu (tanh approximation), dropout: the shape kept."""

    def __init__(self, name, inputs, ins, kind, rate=0.0):
        super().__init__(kind, name, inputs, ins)
        self.rate = rate

    def forward(self, x):
        if self.kind == "relu":
            return F.relu(x)
        if self.kind == "gelu":
            return F.gelu(x, approximate="tanh")
        return F.dropout(x, self.rate, self.training) if self.rate > 0 else x


class Add(Layer):
    def __init__(self, name, inputs, shapes, msg):
        a = shapes[0]
        for s in shapes[1:]:
            if str(s) != str(a) or s.kind != a.kind:
                raise SpecError(name, "add", f"add needs inputs of one shape: {a} and {s}")
        super().__init__("add", name, inputs, a)
        self.relu = msg.activation == pb2().RELU

    def forward(self, *xs):
        y = xs[0]
        for x in xs[1:]:
            y = y + x
        return F.relu(y) if self.relu else y


class Concat(Layer):
    def __init__(self, name, inputs, shapes):
        a = shapes[0]
        for s in shapes[1:]:
            if s.kind != a.kind or (s.h, s.w, s.t) != (a.h, a.w, a.t):
                raise SpecError(name, "concat", f"concat joins along the channels: {a} and {s} "
                                "disagree elsewhere")
        out = Shape(a.kind, a.h, a.w, sum(s.c for s in shapes), a.t)
        super().__init__("concat", name, inputs, out)
        self.dim = 1 if a.kind == "image" else -1  # gpushare's last axis

    def forward(self, *xs):
        return torch.cat(xs, dim=self.dim)


class BatchNorm(Layer):
    """Per channel over the batch (and the pixels, or the positions);
    PyTorch's momentum and the unbiased running variance."""

    def __init__(self, name, inputs, ins, msg):
        super().__init__("batch_norm", name, inputs, ins)
        c = ins.c
        self.momentum, self.eps = msg.momentum, msg.epsilon
        self.gamma = nn.Parameter(torch.ones(c))
        self.beta = nn.Parameter(torch.zeros(c))
        self.register_buffer("running_mean", torch.zeros(c))
        self.register_buffer("running_var", torch.ones(c))
        self.params = [Param("gamma", (c,), lambda: self.gamma), Param("beta", (c,), lambda: self.beta),
                       Param("running_mean", (c,), lambda: self.running_mean, trained=False),
                       Param("running_var", (c,), lambda: self.running_var, trained=False)]

    def forward(self, x):
        shape = x.shape
        if x.dim() == 3:  # a sequence: every position an example
            x = x.reshape(-1, shape[-1])
        y = F.batch_norm(x, self.running_mean, self.running_var, self.gamma, self.beta,
                         self.training, self.momentum, self.eps)
        return y.reshape(shape)


class LayerNorm(Layer):
    def __init__(self, name, inputs, ins, msg):
        super().__init__("layer_norm", name, inputs, ins)
        c = ins.c
        self.eps = msg.epsilon
        self.gamma = nn.Parameter(torch.ones(c))
        self.beta = nn.Parameter(torch.zeros(c))
        self.image = ins.kind == "image"
        self.params = [Param("gamma", (c,), lambda: self.gamma), Param("beta", (c,), lambda: self.beta)]

    def forward(self, x):
        if self.image:
            x = x.permute(0, 2, 3, 1)
        y = F.layer_norm(x, (x.shape[-1],), self.gamma, self.beta, self.eps)
        return y.permute(0, 3, 1, 2) if self.image else y


class Embedding(Layer):
    def __init__(self, name, inputs, ins, msg):
        if ins.kind != "tokens":
            raise SpecError(name, "embedding", f"embedding needs the token input, got {ins}")
        v, c = msg.vocab_size, msg.dim
        super().__init__("embedding", name, inputs, Shape("seq", t=ins.t, c=c))
        self.table = nn.Parameter(torch.zeros(v, c))
        self.vocab = v
        self.params = [Param("embeddings", (v, c), lambda: self.table)]

    def forward(self, ids):
        return F.embedding(ids, self.table)


class PositionEmbedding(Layer):
    def __init__(self, name, inputs, ins):
        if ins.kind != "seq":
            raise SpecError(name, "position_embedding",
                            f"position_embedding needs a sequence, got {ins}")
        super().__init__("position_embedding", name, inputs, ins)
        self.table = nn.Parameter(torch.zeros(ins.t, ins.c))
        self.params = [Param("embeddings", (ins.t, ins.c), lambda: self.table)]

    def forward(self, x):
        return x + self.table


class CausalSelfAttention(Layer):
    """qkv = x W (C -> 3HD, [q heads | k heads | v heads], head h at columns
    h*D .. h*D+D-1 of each third); per head softmax(q.k / sqrt(D)) over the
    positions up to each one, in fp32; probs . v; heads side by side
    (N, T, HD); out = y W_out (HD -> C)."""

    def __init__(self, name, inputs, ins, msg):
        if ins.kind != "seq":
            raise SpecError(name, "causal_self_attention",
                            f"causal_self_attention needs a sequence, got {ins}")
        super().__init__("causal_self_attention", name, inputs, ins)
        h, d, c = msg.heads, msg.head_size, ins.c
        self.h, self.d = h, d
        self.qkv = nn.Linear(c, 3 * h * d)
        self.proj = nn.Linear(h * d, c)
        self.register_buffer("mask", torch.ones(ins.t, ins.t, dtype=torch.bool).tril(), persistent=False)
        self.params = [Param("qkv_kernel", (c, 3 * h * d), lambda: self.qkv.weight, _t2d, _t2d),
                       Param("qkv_bias", (3 * h * d,), lambda: self.qkv.bias),
                       Param("out_kernel", (h * d, c), lambda: self.proj.weight, _t2d, _t2d),
                       Param("out_bias", (c,), lambda: self.proj.bias)]

    def forward(self, x):
        n, t, _ = x.shape
        q, k, v = self.qkv(x).split(self.h * self.d, dim=-1)
        q, k, v = (z.reshape(n, t, self.h, self.d).transpose(1, 2) for z in (q, k, v))
        s = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(self.d)
        s = s.masked_fill(~self.mask[:t, :t], float("-inf"))
        p = torch.softmax(s, dim=-1)
        y = (p @ v.float()).to(x.dtype).transpose(1, 2).reshape(n, t, self.h * self.d)
        return self.proj(y)


class SpecError(Exception):
    def __init__(self, name, field, msg):
        super().__init__(f"layer {name} ({field}): {msg}")


# ---- the model ----------------------------------------------------------------

class Model(nn.Module):
    """The layers of spec.model in order, each fed by its named inputs."""

    def __init__(self, model_msg):
        super().__init__()
        inp = model_msg.input
        if inp.sequence_length:
            self.input = Shape("tokens", t=inp.sequence_length)
        elif inp.height and inp.width and inp.channels:
            self.input = Shape("image", inp.height, inp.width, inp.channels)
        else:
            raise SystemExit("model.input: set height, width and channels (an image) or "
                             "sequence_length (tokens)")
        names, per_kind, layers = {}, {}, []
        for i, lm in enumerate(model_msg.layer):
            kind = lm.WhichOneof("kind")
            if kind is None:
                raise SystemExit(f"model.layer[{i}] has no kind")
            per_kind[kind] = per_kind.get(kind, 0) + 1
            name = lm.name or f"{kind}_{per_kind[kind]}"
            if name in names:
                raise SystemExit(f"model.layer[{i}].name: the name {name} is already "
                                 f"layer[{names[name]}]'s: layer names must be unique")
            names[name] = i
        by_index = {j: n for n, j in names.items()}
        shapes = []
        for i, lm in enumerate(model_msg.layer):
            kind = lm.WhichOneof("kind")
            name = by_index[i]
            ins = []
            for nm in (lm.inputs or ([] if i == 0 else [None])):
                if nm is None:
                    ins.append(i - 1)
                elif nm in names and names[nm] < i:
                    ins.append(names[nm])
                elif nm == "input" and nm not in names:
                    ins.append(-1)
                else:
                    raise SystemExit(f"model.layer[{i}].inputs: \"{nm}\" is no earlier layer's name")
            if not ins:
                ins = [-1]
            sh = [self.input if j < 0 else shapes[j] for j in ins]
            msg = getattr(lm, kind)
            try:
                layers.append(self._layer(kind, name, ins, sh, msg))
            except SpecError as ex:
                raise SystemExit(f"model.layer[{i}]: {ex}")
            shapes.append(layers[-1].out)
        self.layers = nn.ModuleList(layers)
        last = layers[-1]
        if last.kind != "dense":
            raise SystemExit(f"the last layer {last.gs_name} is a {last.kind}: the model must end "
                             "with a dense layer whose units are the classes")
        self.classes = last.out.c
        self.tokens = self.input.kind == "tokens"
        # which outputs are still needed after each layer, to free the rest
        lastuse = {}
        for i, l in enumerate(layers):
            for j in l.inputs:
                lastuse[j] = i
        self.free_after = [[j for j, k in lastuse.items() if k == i] for i in range(len(layers))]

    @staticmethod
    def _layer(kind, name, ins, sh, msg):
        many = kind in ("add", "concat")
        if many and not 2 <= len(ins) <= 8:
            raise SpecError(name, "inputs", f"{kind} takes 2 to 8 inputs, got {len(ins)}")
        if not many and len(ins) != 1:
            raise SpecError(name, "inputs", f"{kind} takes one input, got {len(ins)}")
        s = sh[0]
        if kind == "dense":
            return Dense(name, ins, s, msg)
        if kind in ("conv2d", "depthwise_conv2d"):
            return Conv(name, ins, s, msg, kind == "depthwise_conv2d")
        if kind in ("max_pool2d", "average_pool2d"):
            return Pool(name, ins, s, msg, kind)
        if kind == "global_average_pooling2d":
            return GlobalAveragePooling(name, ins, s)
        if kind == "flatten":
            return Flatten(name, ins, s)
        if kind in ("relu", "gelu"):
            return Elementwise(name, ins, s, kind)
        if kind == "dropout":
            if not 0.0 <= msg.rate < 1.0:
                raise SpecError(name, "dropout.rate", f"rate {msg.rate} is outside [0, 1)")
            return Elementwise(name, ins, s, kind, msg.rate)
        if kind == "add":
            return Add(name, ins, sh, msg)
        if kind == "concat":
            return Concat(name, ins, sh)
        if kind == "batch_norm":
            return BatchNorm(name, ins, s, msg)
        if kind == "layer_norm":
            return LayerNorm(name, ins, s, msg)
        if kind == "embedding":
            return Embedding(name, ins, s, msg)
        if kind == "position_embedding":
            return PositionEmbedding(name, ins, s)
        if kind == "causal_self_attention":
            return CausalSelfAttention(name, ins, s, msg)
        raise SpecError(name, kind, f"the layer kind {kind} is not known to gs_torch")

    def forward(self, x):
        outs = {-1: x}
        for i, l in enumerate(self.layers):
            outs[i] = l(*[outs[j] for j in l.inputs])
            for j in self.free_after[i]:
                del outs[j]
        return outs[len(self.layers) - 1]

    def gs_params(self):
        """(name, layer position, layer, Param) for every gpushare tensor, in
        the order gpushare lays them out."""
        for i, l in enumerate(self.layers):
            for p in l.params:
                yield f"{l.gs_name}.{p.suffix}", i, l, p

    def trained(self):
        return [p.get() for _, _, _, p in self.gs_params() if p.trained]

    def init(self, seed=None, generator=None):
        """Initial values by INIT: gpushare's streams from `seed`, or
        PyTorch's `generator` (with the same rules) when seed is None."""
        for i, l in enumerate(self.layers):
            src = layer_stream(seed, i) if seed is not None else torch_stream(generator)
            for p in l.params:
                rule = INIT.get((l.kind, p.suffix), _const(0.0))
                self._set(p, torch.from_numpy(rule(p.shape, src)))

    @staticmethod
    def _set(p, a):
        t = p.get()
        with torch.no_grad():
            t.copy_(p.to_torch(a).reshape(t.shape))

    def load_tensors(self, tensors, what):
        """gpushare's tensors by name (a dict of float32 arrays in gpushare's
        layouts) into the module; every tensor the model has must be there,
        in its shape, and nothing else."""
        want = {n: p for n, _, _, p in self.gs_params()}
        for n, p in want.items():
            if n not in tensors:
                raise SystemExit(f"{what}: no tensor {n} (the model's {n} is {list(p.shape)})")
            if tuple(tensors[n].shape) != p.shape:
                raise SystemExit(f"{what}: tensor {n} is {list(tensors[n].shape)}; the model's is "
                                 f"{list(p.shape)}")
            self._set(p, torch.from_numpy(np.ascontiguousarray(tensors[n], dtype=np.float32)))
        extra = sorted(set(tensors) - set(want))
        if extra:
            raise SystemExit(f"{what}: tensor {extra[0]} is no parameter of this model "
                             f"({len(extra)} unknown)")

    def tensors(self):
        """gpushare's tensors by name, in gpushare's layouts (float32)."""
        return {n: p.from_torch(p.get().detach()).contiguous().numpy()
                for n, _, _, p in self.gs_params()}


# ---- safetensors ---------------------------------------------------------------

def read_safetensors(path):
    """name -> float32 array: an 8-byte little-endian header length, the
    JSON header, then the tensors' raw little-endian bytes."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise SystemExit(f"{path}: {len(data)} bytes, too short for safetensors")
    (hl,) = struct.unpack("<Q", data[:8])
    if hl > len(data) - 8:
        raise SystemExit(f"{path}: header length {hl} runs past the file ({len(data)} bytes)")
    header = json.loads(data[8:8 + hl])
    body = data[8 + hl:]
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        if t["dtype"] != "F32":
            raise SystemExit(f"{path}: tensor {name} is {t['dtype']}; only F32 is read")
        a, b = t["data_offsets"]
        arr = np.frombuffer(body[a:b], dtype="<f4")
        out[name] = arr.reshape(t["shape"]).astype(np.float32)
    return out


def write_safetensors(path, tensors, metadata=None):
    header, off, blobs = {}, 0, []
    if metadata:
        header["__metadata__"] = metadata
    for name, a in tensors.items():
        b = np.ascontiguousarray(a, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)


# ---- data ------------------------------------------------------------------------

class Data:
    """A set as tensors: images (N, C, H, W) float32 and labels (N), or token
    inputs and targets (N, T) int64."""

    def __init__(self, x, y):
        self.x, self.y = x, y
        self.n = x.shape[0]


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


def _images(u8_or_f32):
    """(N, H, W[, C]) to (N, C, H, W) float32; bytes / 255 as gpushare."""
    x = u8_or_f32
    if x.dim() == 3:
        x = x.unsqueeze(-1)
    x = x.float().div_(255) if x.dtype == torch.uint8 else x.float()
    return x.permute(0, 3, 1, 2).contiguous()


def synthetic(n, h, w, c, classes, seed):
    """gs_dataset_synthetic: class prototypes uniform in [32, 224), each
    example its class's prototype plus noise uniform in [-32, 32]."""
    img = h * w * c
    proto = 32 + SplitMix64(seed, 0x70726F746F).belows(img * classes, 192)
    labels = SplitMix64(seed, 0x6C6162656C).belows(n, classes)
    noise = SplitMix64(seed, 0x6E6F697365).belows(n * img, 65) - 32
    pix = np.clip(proto.reshape(classes, img)[labels] + noise.reshape(n, img), 0, 255).astype(np.uint8)
    return Data(_images(torch.from_numpy(pix.reshape(n, h, w, c))), torch.from_numpy(labels))


class Loader:
    """The job's train and test sets as gpushare-run loads them: a file
    name relative to the job file's directory, then to data_dir."""

    def __init__(self, spec, spec_dir, data_dir):
        self.spec, self.dirs = spec, [spec_dir, data_dir]

    def path(self, which, field, p):
        if p.startswith("sha256:"):
            raise SystemExit(f"{which}.{field}: {p} names a dataset in gpushare's store; give a "
                             "file path to run it here")
        if os.path.isabs(p):
            return p
        for d in self.dirs:
            if d and os.path.exists(os.path.join(d, p)):
                return os.path.join(d, p)
        raise SystemExit(f"{which}.{field}: {p} is not in {' nor '.join(d for d in self.dirs if d)}")

    def stream(self, which, d):
        src = d.WhichOneof("source")
        m = getattr(d, src)
        # gpushare cuts the set into the model's sequences unless it says
        # otherwise.
        t = d.sequence_length or self.spec.model.input.sequence_length
        if not t:
            raise SystemExit(f"{which}.sequence_length is 0 and the model takes no tokens")
        raw = open(self.path(which, src + ".path", m.path), "rb").read()
        tok = np.frombuffer(raw, dtype=np.uint8 if src == "text" else "<u2").astype(np.int64)
        n = (tok.size - 1) // t
        return tok, n, t

    def examples(self, tok, t, first, count):
        idx = (np.arange(first, first + count) * t)[:, None] + np.arange(t)[None, :]
        return Data(torch.from_numpy(tok[idx]), torch.from_numpy(tok[idx + 1]))

    def one(self, which, d, n_override=None):
        src = d.WhichOneof("source")
        inp = self.spec.model.input
        if src == "idx":
            x = read_idx(self.path(which, "idx.images", d.idx.images))
            y = read_idx(self.path(which, "idx.labels", d.idx.labels)).long()
            return Data(_images(x), y)
        if src == "npy":
            x = torch.from_numpy(np.load(self.path(which, "npy.images", d.npy.images), allow_pickle=False))
            y = np.load(self.path(which, "npy.labels", d.npy.labels), allow_pickle=False)
            return Data(_images(x), torch.from_numpy(y.astype(np.int64)))
        if src == "synthetic":
            s = d.synthetic
            return synthetic(n_override or s.examples, inp.height, inp.width, inp.channels,
                             s.classes, s.seed)
        if src in ("text", "tokens"):
            tok, n, t = self.stream(which, d)
            count = getattr(d, src).examples or n
            if count > n:
                raise SystemExit(f"{which}.{src}.examples: {count}, but the file holds {n} examples of "
                                 f"sequence_length {t}")
            return self.examples(tok, t, 0, count)
        if src is None:
            raise SystemExit(f"{which}: the job has no {which} dataset")
        raise SystemExit(f"{which}: the dataset source {src} cannot be read here")

    def load(self):
        tr, te = self.spec.train, self.spec.test
        ts, es = tr.WhichOneof("source"), te.WhichOneof("source")
        if ts == es == "synthetic" and tr.synthetic.seed == te.synthetic.seed and \
                tr.synthetic.classes == te.synthetic.classes:  # one task, split
            a, b = tr.synthetic.examples, te.synthetic.examples
            all_ = self.one("train", tr, a + b)
            return Data(all_.x[:a], all_.y[:a]), Data(all_.x[a:], all_.y[a:])
        if ts == es and ts in ("text", "tokens") and getattr(tr, ts).path == getattr(te, ts).path \
                and tr.sequence_length == te.sequence_length:  # one stream, split in order
            tok, n, t = self.stream("train", tr)
            a = getattr(tr, ts).examples
            b = getattr(te, ts).examples or n - a
            if not a or a >= n or a + b > n:
                raise SystemExit(f"train.{ts}.examples {a} and test.{ts}.examples {b}: the file "
                                 f"holds {n} examples")
            return self.examples(tok, t, 0, a), self.examples(tok, t, a, b)
        train = self.one("train", tr)
        test = self.one("test", te) if es else None
        return train, test


# ---- the recipe ------------------------------------------------------------------

class Recipe:
    """batch, accumulation, epochs, steps, optimizer and schedule of a spec,
    each overridable (None: the spec's)."""

    def __init__(self, spec, batch=None, epochs=None, max_steps=None, seed=None, lr=None,
                 schedule=None):
        self.batch = batch or spec.batch_size
        self.accum = spec.accumulation_steps or 1
        self.epochs = epochs or spec.epochs
        self.max_steps = max_steps or spec.max_steps
        self.seed = spec.seed if seed is None else seed
        o = spec.optimizer
        self.kind = o.WhichOneof("kind") or "adam"
        self.opt = getattr(o, self.kind)
        self.lr = lr or self.opt.learning_rate
        s = o.schedule
        self.cosine = s.kind == pb2().LearningRateSchedule.COSINE
        if schedule is not None:
            self.cosine = schedule == "cosine"
        self.warmup, self.final = s.warmup_steps, s.final_fraction

    def optimizer(self, params):
        o = self.opt
        if self.kind == "sgd":
            return torch.optim.SGD(params, lr=self.lr, momentum=o.momentum, nesterov=o.nesterov,
                                   weight_decay=o.weight_decay)
        cls = torch.optim.AdamW if o.decoupled else torch.optim.Adam
        return cls(params, lr=self.lr, betas=(o.beta1, o.beta2), eps=o.epsilon,
                   weight_decay=o.weight_decay)

    def factor(self, step, total):
        """gs_recipe_learning_rate / learning_rate at `step` of `total`."""
        w = self.warmup
        if w and step < w:
            return (step + 1) / w
        if not self.cosine:
            return 1.0
        span = total - w - 1 if total > w + 1 else 1
        p = min((step - w) / span, 1.0)
        return self.final + (1.0 - self.final) * 0.5 * (1.0 + math.cos(math.pi * p))


def loss_fn(model, out, y, reduction="mean"):
    if model.tokens:
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1), reduction=reduction)
    return F.cross_entropy(out, y, reduction=reduction)


def train(model, recipe, data, start="gpushare", log_steps=False):
    """Train as gpushare-run does: per epoch the data order of (seed,
    epoch), the last partial batch dropped, accumulation_steps micro-batches
    per optimizer step; returns (steps, last epoch's mean loss, seconds of
    training, per-step losses)."""
    opt = recipe.optimizer(model.trained())
    n, k = recipe.batch, recipe.accum
    steps_per_epoch = data.n // (n * k)
    total = steps_per_epoch * recipe.epochs
    if recipe.max_steps and recipe.max_steps < total:
        total = recipe.max_steps
    base = [g["lr"] for g in opt.param_groups]
    steps, seconds, last_loss, losses = 0, 0.0, float("nan"), []
    import time
    for epoch in range(recipe.epochs):
        if steps >= total:
            break
        perm = gs_shuffle(data.n, recipe.seed, epoch) if start == "gpushare" else torch.randperm(data.n)
        model.train()
        epoch_losses = []
        t0 = time.perf_counter()
        for s in range(steps_per_epoch):
            f = recipe.factor(steps, total)
            for g, lr in zip(opt.param_groups, base):
                g["lr"] = lr * f
            opt.zero_grad(set_to_none=True)
            loss_sum = 0.0
            for j in range(k):
                idx = perm[(s * k + j) * n:(s * k + j + 1) * n]
                loss = loss_fn(model, model(data.x[idx]), data.y[idx])
                (loss / k).backward()
                loss_sum += loss.item()
            opt.step()
            epoch_losses.append(loss_sum / k)
            steps += 1
            if steps >= total:
                break
        seconds += time.perf_counter() - t0
        last_loss = sum(epoch_losses) / len(epoch_losses)
        losses += epoch_losses
    return steps, last_loss, seconds, losses


def evaluate(model, data, batch):
    """Mean loss per example (per token for a language model) and accuracy
    over the whole set, every example counted once."""
    model.eval()
    correct, total_loss, count = 0, 0.0, 0
    with torch.no_grad():
        for i in range(0, data.n, batch):
            out = model(data.x[i:i + batch])
            y = data.y[i:i + batch]
            total_loss += loss_fn(model, out, y, reduction="sum").item()
            correct += (out.argmax(-1) == y).sum().item()
            count += y.numel()
    return total_loss / count, correct / count
