"""idxfile.py OUT MAGIC DIM... [--body N] [--gz] [--cut N] [--seed S] [--classes C]

Writes an IDX file (the MNIST family's format) as a test needs it, right or
wrong: MAGIC in hex (803 images, 801 labels, or anything), the dimensions as
given, then a body of N bytes (default: the product of the dimensions, so
the file is valid), images random, labels below C (default 4). --gz gzips
it; --cut N keeps only the first N bytes of the result (a truncated
download). Standard library only.
"""
import argparse
import gzip
import random
import struct

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("magic")
ap.add_argument("dims", type=int, nargs="*")
ap.add_argument("--body", type=int)
ap.add_argument("--gz", action="store_true")
ap.add_argument("--cut", type=int)
ap.add_argument("--seed", type=int, default=1)
ap.add_argument("--classes", type=int, default=4)
a = ap.parse_args()

rng = random.Random(a.seed)
n = 1
for d in a.dims:
    n *= d
size = n if a.body is None else a.body
data = struct.pack(">I", int(a.magic, 16)) + b"".join(struct.pack(">I", d) for d in a.dims)
if int(a.magic, 16) & 0xff == 1:
    data += bytes(i % a.classes for i in range(size))
else:
    data += bytes(rng.getrandbits(8) for _ in range(size))
if a.gz:
    data = gzip.compress(data, mtime=0)
if a.cut is not None:
    data = data[:a.cut]
with open(a.out, "wb") as f:
    f.write(data)
