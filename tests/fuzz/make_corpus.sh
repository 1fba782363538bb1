#!/usr/bin/env bash
# make_corpus.sh GPUSHARE_RUN: regenerate the seed corpora of tests/fuzz/
# (corpus/<target>/seed-*) from real inputs: the examples' JobSpecs and
# requests encoded with protoc, small IDX files (raw and gzip), small .npy
# files and token streams, checkpoints
# written by a real gpushare-run (the path of a built one, e.g.
# build/bin/gpushare-run) and size strings. Only the seed-* files
# are rewritten; regression inputs (crash-*, regress-*) are kept.
# Needs protoc and python3. The seeds are committed: CI does not run this.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
run=${1:?usage: make_corpus.sh PATH/TO/gpushare-run}
command -v protoc >/dev/null || { echo "make_corpus: protoc is missing" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
enc() { protoc --encode="gpushare.v1.$1" --proto_path="$root/proto" gpushare.proto; }
c="$here/corpus"
for t in wire request jobspec idx npy ckpt size; do
  mkdir -p "$c/$t"
  rm -f "$c/$t"/seed-*
done

# ---- jobspec: the shipped examples, and variants that reach other layers
for f in "$root"/examples/*.txtpb; do
  enc JobSpec <"$f" >"$c/jobspec/seed-$(basename "$f" .txtpb).pb"
done
cat >"$tmp/tiny.txtpb" <<'EOF'
name: "fuzz-tiny"
model {
  input { height: 4 width: 4 channels: 1 }
  layer { flatten {} }
  layer { dense { units: 3 activation: RELU } }
  layer { dense { units: 2 } }
}
train { synthetic { examples: 64 seed: 1 classes: 2 } }
test { synthetic { examples: 16 seed: 1 classes: 2 } }
batch_size: 16
epochs: 1
seed: 5
precision: FLOAT32
optimizer { adam { learning_rate: 0.01 } }
EOF
cat >"$tmp/conv.txtpb" <<'EOF'
name: "fuzz-conv"
model {
  input { height: 9 width: 7 channels: 3 }
  layer { name: "stem" conv2d { filters: 4 kernel_size: 3 stride: 2 padding: VALID } }
  layer { relu {} }
  layer { depthwise_conv2d { kernel_size: 3 padding: SAME activation: RELU } }
  layer { max_pool2d { pool_size: 2 stride: 1 } }
  layer { global_average_pooling2d {} }
  layer { dense { units: 5 } }
}
train { synthetic { examples: 40 seed: 2 classes: 5 } }
batch_size: 8
accumulation_steps: 3
epochs: 1
max_steps: 2
precision: MIXED_FLOAT16
loss_scale { initial: 1024 growth_interval: 10 }
optimizer { sgd { learning_rate: 0.1 momentum: 0.9 nesterov: true weight_decay: 0.0001 } }
checkpoint_every_steps: 1
auto_fit: true
EOF
for j in tiny conv; do enc JobSpec <"$tmp/$j.txtpb" >"$c/jobspec/seed-$j.pb"; done

# ---- request: one of each kind the daemon validates before its store
sha=3f5a0e8b1c2d4e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7
spec_body() { sed -e '/^#/d' "$1"; }
{
  echo 'id: 1 version {}' | enc Request >"$c/request/seed-version.pb"
  echo 'id: 2 create_tenant { name: "alice" uids: 1000 gids: 100 quota { memory_bytes: 1073741824 compute_share: 50 max_running: 2 max_queued: 8 } }' | enc Request >"$c/request/seed-create-tenant.pb"
  echo 'id: 3 create_vdev { name: "v1" tenant: "alice" device: "cpu" memory_limit: 268435456 compute_share: 50 policy: GROWTH }' | enc Request >"$c/request/seed-create-vdev.pb"
  echo 'id: 4 set_quota { tenant: "alice" quota { max_queued: 3 } }' | enc Request >"$c/request/seed-set-quota.pb"
  echo 'id: 5 upload_dataset { name: "fashion.images" total_bytes: 16 data: "\000\000\010\003" }' | enc Request >"$c/request/seed-upload.pb"
  echo 'id: 6 delete_vdev { name: "v1" }' | enc Request >"$c/request/seed-delete-vdev.pb"
  echo 'id: 7 list_jobs { all: true }' | enc Request >"$c/request/seed-list-jobs.pb"
  { echo 'id: 8 plan { vdev: "v1" spec {'; spec_body "$root/examples/fashion-cnn.txtpb"; echo '} }'; } |
    enc Request >"$c/request/seed-plan-cnn.pb"
  { echo 'id: 9 submit { spec {'; spec_body "$tmp/tiny.txtpb"; echo '} }'; } |
    enc Request >"$c/request/seed-submit-synthetic.pb"
  { echo 'id: 10 submit { spec {'; spec_body "$tmp/conv.txtpb" | sed '/^train/d';
    echo "train { idx { images: \"sha256:$sha\" labels: \"fashion.labels\" } }";
    echo 'test { name: "fashion" }'; echo '} }'; } |
    enc Request >"$c/request/seed-submit-idx.pb"
  { echo 'id: 11 submit { spec {'; spec_body "$root/examples/fashion-mlp.txtpb"; echo '} }'; } |
    enc Request >"$c/request/seed-submit-paths.pb"
  echo 'id: 12 usage { tenant: "alice" since_unix: 86400 }' | enc Request >"$c/request/seed-usage.pb"
}

# ---- wire: [limit][k][k piece sizes] + frames of the requests above
python3 - "$c/request" "$c/wire" <<'EOF'
import os, struct, sys
src, dst = sys.argv[1], sys.argv[2]
bodies = [open(os.path.join(src, f), 'rb').read() for f in sorted(os.listdir(src)) if f.startswith('seed-')]
frame = lambda b: struct.pack('>I', len(b)) + b
stream = b''.join(frame(b) for b in bodies[:4])
def w(name, ctl, sizes, data):
    open(os.path.join(dst, 'seed-' + name), 'wb').write(bytes([ctl, len(sizes)]) + bytes(sizes) + data)
w('one-whole', 0x00, [], frame(bodies[0]))
w('four-split', 0x00, [1, 3, 2, 7, 40, 1], stream)
w('empty-frames', 0x00, [2, 2], frame(b'') * 3 + frame(bodies[1]))
w('header-bytewise', 0x00, [1, 1, 1, 1, 1], stream)
w('small-limit-refused', 0x80 | 64, [5], frame(bodies[1]) + frame(bodies[8]))
w('partial-tail', 0x00, [9], stream + struct.pack('>I', 1000) + b'xy')
EOF

# ---- idx: [mode][split u16 le] + images + labels
python3 - "$c/idx" <<'EOF'
import gzip, os, struct, sys
dst = sys.argv[1]
def images(n, h, w, c=None):
    if c is None:
        return struct.pack('>IIII', 0x803, n, h, w) + bytes((i * 37) & 255 for i in range(n * h * w))
    return struct.pack('>IIIII', 0x804, n, h, w, c) + bytes((i * 11) & 255 for i in range(n * h * w * c))
def labels(n, k):
    return struct.pack('>II', 0x801, n) + bytes(i % k for i in range(n))
def w(name, mode, img, lab):
    open(os.path.join(dst, 'seed-' + name), 'wb').write(bytes([mode]) + struct.pack('<H', len(img)) + img + lab)
w('raw-3d', 0, images(6, 4, 3), labels(6, 3))
w('raw-4d', 0, images(4, 2, 2, 3), labels(4, 2))
w('gz-real', 0, gzip.compress(images(5, 3, 3)), gzip.compress(labels(5, 4)))
w('gz-wrapped', 3, images(3, 5, 5), labels(3, 2))
w('gz-members', 7, images(4, 3, 2, 2), labels(4, 3))
w('files-raw', 0xE0, images(2, 2, 2), labels(2, 2))
w('files-gz', 0xE3, images(2, 3, 1), labels(2, 5))
w('bad-count', 0, images(3, 2, 2), labels(4, 2))
EOF

# ---- npy: [mode][split u16 le, or stream bytes] + .npy images + .npy labels, or a stream
python3 - "$c/npy" <<'EOF'
import os, struct, sys
dst = sys.argv[1]
def npy(descr, shape, data, major=1):
    d = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape)
    pre = 10 if major == 1 else 12
    hl = (pre + len(d) + 1 + 63) // 64 * 64 - pre
    head = d.ljust(hl - 1) + '\n'
    size = struct.pack('<H', hl) if major == 1 else struct.pack('<I', hl)
    return b'\x93NUMPY' + bytes([major, 0]) + size + head.encode() + data
def pair(name, img, lab):
    open(os.path.join(dst, 'seed-' + name), 'wb').write(b'\x00' + struct.pack('<H', len(img)) + img + lab)
def stream(name, mode, b1, b2, body):
    open(os.path.join(dst, 'seed-' + name), 'wb').write(bytes([mode, b1, b2]) + body)
pair('u1-i8', npy('|u1', '(3, 2, 2)', bytes(range(12))), npy('<i8', '(3,)', struct.pack('<3q', 0, 1, 2)))
pair('f4-u1-v2', npy('<f4', '(2, 2, 2, 1)', struct.pack('<8f', *[i / 8 for i in range(8)]), 2),
     npy('|u1', '(2,)', bytes([1, 0]), 2))
pair('u2-labels', npy('|u1', '(2, 1, 3)', bytes(6)), npy('<u2', '(2,)', struct.pack('<2H', 5, 7)))
pair('fortran', npy('|u1', '(2, 1, 1)', bytes(2)).replace(b'False', b'True '), npy('|i1', '(2,)', b'\x00\x01'))
stream('text', 1, 3, 0, b'to be or not to be, that is the question')
stream('u16', 2, 1, 0, struct.pack('<20H', *[i * 13 % 256 for i in range(20)]))
stream('u16-over-vocab', 2, 0, 40, struct.pack('<8H', 1, 2, 3, 60, 4, 5, 6, 7))
EOF

# ---- ckpt: [mode] + checkpoints written by gpushare-run
for j in tiny conv; do
  enc JobSpec <"$tmp/$j.txtpb" >"$tmp/$j.pb"
  "$run" "$tmp/$j.pb" --checkpoint "$tmp/$j.ckpt" >/dev/null
  for mode in 00 01 e0; do
    { printf "\\x$mode"; cat "$tmp/$j.ckpt"; } >"$c/ckpt/seed-$j-$mode"
  done
done

# ---- size
i=0
for s in 0 1 512 4096 "1 KiB" 4GiB 512MiB 1.5GB "2 TB" 1k 16M 0.5PiB 15EiB 1.25EiB \
         18446744073709551615 "7 B" 3kb 1048576B 2.75t 999.999999999999999999KiB 1e3 -1; do
  printf '%s' "$s" >"$c/size/seed-$i"
  i=$((i + 1))
done
echo "make_corpus: $(find "$c" -name 'seed-*' | wc -l) seeds under $c"
