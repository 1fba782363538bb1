"""gpushare.spec: job specs from Python.

as_job_spec() turns what a user has into a gpushare.v1.JobSpec: the message
itself, a dict in the proto's JSON form (json_format.ParseDict: the .proto
field names, enum values by name), or the path of a spec file, binary
(.pb, what `gpuctl job encode` writes) or text format (.txtpb). The helpers
below build one in a few lines:

    spec = job_spec("mlp", input=(28, 28, 1),
                    layers=[flatten(), dense(256, "relu"), dense(10)],
                    train=synthetic(2048, seed=7, classes=10),
                    optimizer=adam(0.001, schedule="cosine"),
                    batch_size=128, epochs=1, vdev="small")

A helper checks only what it must to build the message (a field that
exists, an enum name that does); the daemon checks every value and names
the field of one out of range.
"""
import os

from google.protobuf import json_format, text_format
from google.protobuf.message import DecodeError

from ._proto import pb
from .errors import InvalidArgument

TEXT_SUFFIXES = (".txtpb", ".textproto", ".pbtxt", ".txt")
BINARY_SUFFIXES = (".pb", ".bin", ".binpb")


def _looks_text(data):
    head = data[:256]
    return len(head) > 0 and all(b in b"\t\n\r" or 32 <= b < 127 for b in head)


def read_job_spec(path, field="spec"):
    """A JobSpec from a file: text format for .txtpb (.textproto, .pbtxt,
    .txt), binary for .pb (.bin, .binpb); another name is read as text when
    its first bytes are printable, else as binary."""
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise InvalidArgument(f"cannot read {path}: {e.strerror}", field) from None
    low = path.lower()
    text = low.endswith(TEXT_SUFFIXES) or (not low.endswith(BINARY_SUFFIXES) and _looks_text(data))
    spec = pb.JobSpec()
    if text:
        try:
            text_format.Parse(data.decode("utf-8"), spec)
        except (text_format.ParseError, UnicodeDecodeError) as e:
            raise InvalidArgument(f"{path} does not parse as a text gpushare.v1.JobSpec: {e}", field) from None
        return spec
    try:
        spec.ParseFromString(data)
    except DecodeError as e:
        hint = " (it looks like text: name it .txtpb)" if _looks_text(data) else ""
        raise InvalidArgument(f"{path} is not a binary gpushare.v1.JobSpec{hint}: {e}", field) from None
    return spec


def as_job_spec(spec, field="spec"):
    """A new gpushare.v1.JobSpec from a JobSpec, a dict or a file path."""
    if isinstance(spec, pb.JobSpec):
        out = pb.JobSpec()
        out.CopyFrom(spec)
        return out
    if isinstance(spec, dict):
        try:
            return json_format.ParseDict(spec, pb.JobSpec())
        except json_format.ParseError as e:
            raise InvalidArgument(f"the dict is not a gpushare.v1.JobSpec: {e}", field) from None
    if isinstance(spec, (str, bytes, os.PathLike)):
        return read_job_spec(os.fsdecode(spec), field)
    raise InvalidArgument(f"a job spec is a gpushare.v1.JobSpec, a dict or a file path, not a "
                          f"{type(spec).__name__}", field)


def _enum(wrapper, value, field):
    """An enum value from its number or its name (any case)."""
    if isinstance(value, bool):
        value = int(value)
    if isinstance(value, int):
        if value in wrapper.values():
            return value
    elif isinstance(value, str):
        try:
            return wrapper.Value(value.upper())
        except ValueError:
            pass
    allowed = ", ".join(wrapper.keys())
    raise InvalidArgument(f"{field} {value!r} is not one of {allowed}", field)


def fill(msg, field_prefix="", **fields):
    """Set msg's fields from keyword arguments, skipping None: an enum by
    name or number, a message from a message or a dict (ParseDict), a
    repeated field from a list. Returns msg."""
    desc = msg.DESCRIPTOR
    for name, value in fields.items():
        if value is None:
            continue
        path = f"{field_prefix}{name}"
        fd = desc.fields_by_name.get(name)
        if fd is None:
            raise InvalidArgument(f"{desc.full_name} has no field {name!r}; it has "
                                  f"{', '.join(f.name for f in desc.fields)}", path)
        try:
            if fd.label == fd.LABEL_REPEATED:
                getattr(msg, name).extend(value)
            elif fd.message_type is not None:
                sub = getattr(msg, name)
                if isinstance(value, dict):
                    sub.Clear()
                    json_format.ParseDict(value, sub)
                else:
                    sub.CopyFrom(value)
            elif fd.enum_type is not None:
                setattr(msg, name, _enum(_wrapper(fd.enum_type), value, path))
            else:
                setattr(msg, name, value)
        except (TypeError, ValueError, json_format.ParseError) as e:
            if isinstance(e, InvalidArgument):
                raise
            raise InvalidArgument(f"{path} {value!r}: {e}", path) from None
    return msg


def _wrapper(enum_desc):
    from google.protobuf.internal import enum_type_wrapper
    return enum_type_wrapper.EnumTypeWrapper(enum_desc)


# ------------------------------------------------------------------ layers ---

def _layer(kind, name, **fields):
    layer = pb.Layer()
    if name is not None:
        layer.name = name
    getattr(layer, kind).SetInParent()
    fill(getattr(layer, kind), f"layer.{kind}.", **fields)
    return layer


def dense(units, activation=None, name=None):
    """A dense layer: (N, D) -> (N, units); activation "relu" or None."""
    return _layer("dense", name, units=units, activation=activation)


def conv2d(filters, kernel_size, stride=None, padding=None, activation=None, name=None):
    """A square 2-D convolution, NHWC; padding "same" (default) or "valid"."""
    return _layer("conv2d", name, filters=filters, kernel_size=kernel_size, stride=stride,
                  padding=padding, activation=activation)


def depthwise_conv2d(kernel_size, stride=None, padding=None, activation=None, name=None):
    """A depthwise convolution: one kernel_size x kernel_size filter per channel."""
    return _layer("depthwise_conv2d", name, kernel_size=kernel_size, stride=stride, padding=padding,
                  activation=activation)


def max_pool2d(pool_size=None, stride=None, name=None):
    return _layer("max_pool2d", name, pool_size=pool_size, stride=stride)


def global_average_pooling2d(name=None):
    return _layer("global_average_pooling2d", name)


def flatten(name=None):
    return _layer("flatten", name)


def relu(name=None):
    return _layer("relu", name)


# ---------------------------------------------------------------- datasets ---

def synthetic(examples, seed=None, classes=None):
    """A seeded synthetic set, made by the daemon (no files)."""
    d = pb.Dataset()
    d.synthetic.SetInParent()
    fill(d.synthetic, "synthetic.", examples=examples, seed=seed, classes=classes)
    return d


def idx(images, labels):
    """IDX files: local paths (uploaded by submit), "sha256:HEX" or dataset names."""
    d = pb.Dataset()
    d.idx.images = os.fspath(images)
    d.idx.labels = os.fspath(labels)
    return d


def npy(images, labels):
    """NumPy .npy files (images |u1 or <f4, integer labels): local paths
    (uploaded by submit), "sha256:HEX" or dataset names."""
    d = pb.Dataset()
    d.npy.images = os.fspath(images)
    d.npy.labels = os.fspath(labels)
    return d


def text(path, sequence_length, examples=None):
    """A raw text file read at byte level (vocabulary 256), cut into
    examples of sequence_length tokens."""
    d = pb.Dataset(sequence_length=sequence_length)
    d.text.path = os.fspath(path)
    fill(d.text, "text.", examples=examples)
    return d


def tokens(path, vocab_size, sequence_length, examples=None):
    """Little-endian uint16 token ids, each below vocab_size, cut into
    examples of sequence_length tokens."""
    d = pb.Dataset(sequence_length=sequence_length)
    d.tokens.path = os.fspath(path)
    fill(d.tokens, "tokens.", vocab_size=vocab_size, examples=examples)
    return d


def named(name):
    """The tenant's datasets NAME.images and NAME.labels."""
    d = pb.Dataset()
    d.name = name
    return d


# -------------------------------------------------------------- optimizers ---

def _optimizer(kind, schedule, warmup_steps, final_fraction, **fields):
    opt = pb.Optimizer()
    getattr(opt, kind).SetInParent()
    fill(getattr(opt, kind), f"optimizer.{kind}.", **fields)
    if schedule is not None or warmup_steps is not None or final_fraction is not None:
        opt.schedule.SetInParent()
        fill(opt.schedule, "optimizer.schedule.", kind=schedule, warmup_steps=warmup_steps,
             final_fraction=final_fraction)
    return opt


def adam(learning_rate=None, beta1=None, beta2=None, epsilon=None, weight_decay=None, decoupled=None,
         schedule=None, warmup_steps=None, final_fraction=None):
    """Adam (decoupled=True: AdamW); schedule "constant" or "cosine"."""
    return _optimizer("adam", schedule, warmup_steps, final_fraction, learning_rate=learning_rate,
                      beta1=beta1, beta2=beta2, epsilon=epsilon, weight_decay=weight_decay,
                      decoupled=decoupled)


def sgd(learning_rate=None, momentum=None, nesterov=None, weight_decay=None, schedule=None,
        warmup_steps=None, final_fraction=None):
    return _optimizer("sgd", schedule, warmup_steps, final_fraction, learning_rate=learning_rate,
                      momentum=momentum, nesterov=nesterov, weight_decay=weight_decay)


# ---------------------------------------------------------------- the spec ---

def job_spec(name=None, *, input, layers, train, test=None, optimizer=None, **fields):
    """A gpushare.v1.JobSpec: input (height, width, channels), the layers,
    the train (and test) Dataset, the Optimizer, and any other JobSpec field
    by its name (batch_size, epochs, max_steps, precision="mixed_bfloat16",
    auto_fit=True, vdev="small", ...)."""
    spec = pb.JobSpec()
    if name is not None:
        spec.name = name
    if isinstance(input, (tuple, list)):
        if len(input) != 3:
            raise InvalidArgument(f"input {tuple(input)!r} is not (height, width, channels)",
                                  "model.input")
        input = {"height": input[0], "width": input[1], "channels": input[2]}
    fill(spec.model, "model.", input=input, layer=list(layers))
    fill(spec, "", train=train, test=test, optimizer=optimizer, **fields)
    return spec
