"""gpushare.safetensors: read the safetensors file a job exports.

Debian 12 has no python3-safetensors, so this is a small reader of the
format (an 8-byte little-endian header length, a JSON header naming each
tensor's dtype, shape and byte range, then the data), strict in what it
checks: the header within the file, known dtypes, each byte range inside
the data and of the size its shape and dtype say. gpushare writes fp32
tensors named LAYER.kernel and LAYER.bias (docs/jobs.md). numpy is needed
only here, and imported only when called.
"""
import json
import os
import struct

# safetensors dtype -> (numpy dtype name, bytes per element)
_DTYPES = {
    "F64": ("<f8", 8), "F32": ("<f4", 4), "F16": ("<f2", 2), "BF16": (None, 2),
    "I64": ("<i8", 8), "I32": ("<i4", 4), "I16": ("<i2", 2), "I8": ("i1", 1),
    "U64": ("<u8", 8), "U32": ("<u4", 4), "U16": ("<u2", 2), "U8": ("u1", 1), "BOOL": ("?", 1),
}


def _numpy():
    try:
        import numpy
    except ImportError:
        raise ImportError("gpushare.load_safetensors needs numpy (Debian: apt-get install python3-numpy)") \
            from None
    return numpy


def load_safetensors(source, metadata=None):
    """A dict of tensor name -> numpy array (writable, its own copy) from
    safetensors bytes or a file path. bf16 tensors come back as float32
    (numpy has no bfloat16). Pass a dict as metadata to receive the file's
    __metadata__ strings. ValueError names what is wrong with a bad file."""
    np = _numpy()
    if isinstance(source, (str, os.PathLike)):
        with open(source, "rb") as f:
            data = f.read()
        what = os.fspath(source)
    else:
        data = bytes(source)
        what = "the safetensors data"
    if len(data) < 8:
        raise ValueError(f"{what}: {len(data)} bytes, shorter than the 8-byte header length")
    (hlen,) = struct.unpack("<Q", data[:8])
    if hlen > len(data) - 8:
        raise ValueError(f"{what}: the header says {hlen} bytes, but only {len(data) - 8} follow")
    try:
        header = json.loads(data[8:8 + hlen].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"{what}: the header is not JSON: {e}") from None
    if not isinstance(header, dict):
        raise ValueError(f"{what}: the header is not a JSON object")
    body = bytearray(data[8 + hlen:])
    meta = header.pop("__metadata__", None) or {}
    if metadata is not None:
        metadata.update(meta)
    out = {}
    for name, t in header.items():  # in the header's order
        if not isinstance(t, dict) or not {"dtype", "shape", "data_offsets"} <= t.keys():
            raise ValueError(f"{what}: tensor {name!r} lacks dtype, shape or data_offsets")
        dt = _DTYPES.get(t["dtype"])
        if dt is None:
            raise ValueError(f"{what}: tensor {name!r} has dtype {t['dtype']!r}; known: {', '.join(_DTYPES)}")
        shape, offsets = t["shape"], t["data_offsets"]
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)):
            raise ValueError(f"{what}: tensor {name!r} has data_offsets {offsets!r}, not [begin, end]")
        if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
            raise ValueError(f"{what}: tensor {name!r} has shape {shape!r}, not a list of sizes")
        begin, end = offsets
        count = 1
        for d in shape:
            count *= d
        if not (0 <= begin <= end <= len(body)):
            raise ValueError(f"{what}: tensor {name!r} bytes {begin}..{end} are outside the "
                             f"{len(body)} bytes of data")
        if end - begin != count * dt[1]:
            raise ValueError(f"{what}: tensor {name!r} has {end - begin} bytes, but shape {shape} of "
                             f"{t['dtype']} needs {count * dt[1]}")
        raw = body[begin:end]
        if dt[0] is None:  # bf16: the high half of an fp32
            a = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            a = np.frombuffer(raw, dtype=dt[0])
        out[name] = a.reshape(shape)
    return out
