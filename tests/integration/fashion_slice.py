"""fashion_slice.py N OUT_DIR: the first N examples of Debian's Fashion-MNIST
train and test sets, written as gzip IDX files, so a daemon test trains on
real data in seconds. Exits 77 (skip) when the dataset is not installed."""
import gzip
import os
import struct
import sys

SRC = "/usr/share/datasets/fashion-mnist"
n, out = int(sys.argv[1]), sys.argv[2]
if not os.path.exists(os.path.join(SRC, "train-images-idx3-ubyte.gz")):
    print("skip: %s not installed (apt-get install dataset-fashion-mnist)" % SRC)
    sys.exit(77)
for split, count in (("train", n), ("t10k", max(n // 5, 500))):
    with gzip.open(os.path.join(SRC, split + "-images-idx3-ubyte.gz")) as f:
        magic, total, rows, cols = struct.unpack(">IIII", f.read(16))
        pixels = f.read(count * rows * cols)
    with gzip.open(os.path.join(out, split + "-images.gz"), "wb") as f:
        f.write(struct.pack(">IIII", magic, count, rows, cols) + pixels)
    with gzip.open(os.path.join(SRC, split + "-labels-idx1-ubyte.gz")) as f:
        magic, total = struct.unpack(">II", f.read(8))
        labels = f.read(count)
    with gzip.open(os.path.join(out, split + "-labels.gz"), "wb") as f:
        f.write(struct.pack(">II", magic, count) + labels)
