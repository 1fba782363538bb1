#!/usr/bin/env bash
# Datasets beyond IDX, as tenants use them: NumPy .npy pairs written by
# numpy itself (float32 and uint8 images, int64 and uint8 labels, format
# 1.0 and 2.0) uploaded by gpuctl submit and trained on to SUCCEEDED;
# malformed .npy and token files refused at upload with their own message
# and nothing stored; a token stream refused at submit, naming why.
set -u
. "$(dirname "$0")/lib.sh"
need_protoc
$PY -c "import numpy" 2>/dev/null || { echo "skip: python3-numpy not installed"; exit 77; }

D=$T/data; mkdir -p "$D"
# A learnable 4-class task: each class a fixed random 8x8 prototype, each
# example its class's prototype plus noise. Train: float32 (N, 8, 8) with
# int64 labels, format 1.0; test: uint8 (N, 8, 8, 1) with uint8 labels,
# format 2.0. Then the damaged files.
$PY - "$D" <<'PY' || { fail "numpy could not write the test data"; finish; exit 1; }
import sys
import numpy as np
d = sys.argv[1]
rng = np.random.default_rng(7)
proto = rng.uniform(0.1, 0.9, size=(4, 8, 8)).astype(np.float32)
def draw(n):
    y = rng.integers(0, 4, size=n)
    x = proto[y] + rng.uniform(-0.1, 0.1, size=(n, 8, 8)).astype(np.float32)
    return x.astype(np.float32), y
x, y = draw(1024)
np.save(f"{d}/train-x.npy", x)
np.save(f"{d}/train-y.npy", y.astype(np.int64))
tx, ty = draw(256)
with open(f"{d}/test-x.npy", "wb") as f:
    np.lib.format.write_array(f, (tx * 255).round().astype(np.uint8).reshape(256, 8, 8, 1),
                              version=(2, 0))
with open(f"{d}/test-y.npy", "wb") as f:
    np.lib.format.write_array(f, ty.astype(np.uint8), version=(2, 0))
np.save(f"{d}/fortran.npy", np.asfortranarray(x[:16]))
np.save(f"{d}/negative.npy", np.array([0, 1, -1, 2], dtype=np.int32))
np.save(f"{d}/object.npy", np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
np.save(f"{d}/bigendian.npy", x[:16].astype(">f4"))
open(f"{d}/truncated.npy", "wb").write(open(f"{d}/train-x.npy", "rb").read()[:-3])
np.arange(64, dtype="<u2").tofile(f"{d}/ids.bin")          # ids 0..63
np.array([1, 2, 300, 4], dtype="<u2").tofile(f"{d}/bad-ids.bin")
PY
chmod -R a+rX "$D"

# job NAME TXTPB: encode a text JobSpec into $T/NAME.pb
job() { printf '%s\n' "$2" >"$T/$1.txtpb"
  protoc --encode=gpushare.v1.JobSpec --proto_path="$PROTO" gpushare.proto <"$T/$1.txtpb" >"$T/$1.pb"
  chmod 644 "$T/$1.pb"; }

start_daemon
expect_ok "tenant a" ctl tenant create a --uid 4001
expect_ok "vdev a0" ctl vdev create a0 --memory 256MiB --compute 50 --policy growth --tenant a
count() { A --json dataset list | $PY -c "import json,sys; print(len(json.load(sys.stdin).get('dataset', [])))"; }

# --- an .npy pair trained to SUCCEEDED ------------------------------------
MODEL='model { input { height: 8 width: 8 channels: 1 }
  layer { flatten {} } layer { dense { units: 32 activation: RELU } } layer { dense { units: 4 } } }'
job npy "name: \"npy-mlp\" vdev: \"a0\" $MODEL
train { npy { images: \"$D/train-x.npy\" labels: \"$D/train-y.npy\" } }
test { npy { images: \"$D/test-x.npy\" labels: \"$D/test-y.npy\" } }
batch_size: 32 epochs: 3 seed: 1 optimizer { adam { learning_rate: 0.01 } }"
expect_ok "submit --watch an MLP on an .npy pair (uploads the four files)" A submit "$T/npy.pb" --watch
echo "$LAST_OUT" | tail -n 2
[[ "$LAST_OUT" == *SUCCEEDED* ]] && pass "the job SUCCEEDED" || fail "watch did not end in SUCCEEDED"
id=$(A --json list | json_field "['job'][0]['id']")
acc=$(A --json status "$id" | json_field "['job']['epoch'][-1]['test_accuracy']")
$PY -c "import sys; sys.exit(0 if float('$acc') >= 0.9 else 1)" \
  && pass "test accuracy $acc >= 0.9 on the uint8 test set after 3 epochs" \
  || fail "test accuracy $acc below 0.9"
[ "$(count)" = 4 ] && pass "4 datasets stored" || fail "$(count) datasets stored, want 4"

# --- malformed uploads: each refused with its words, nothing kept ----------
bad() { local file=$1 text=$2; shift 2
  local before; before=$(count)
  expect_fail "$file is refused: $text" 1 "$text" A dataset add "bad-$file" "$D/$file" "$@"
  [ "$(count)" = "$before" ] && pass "$file: nothing stored" || fail "$file: a dataset was stored"; }
bad fortran.npy "Fortran order"
bad negative.npy "label -1 at index 2"
bad object.npy "object array"
bad bigendian.npy "big-endian"
bad truncated.npy "is truncated"
bad bad-ids.bin "token id 300 at byte offset 4" --format tokens --vocab-size 256
ls "$STATE/uploads" | grep -q . && fail "an upload was left in uploads/" || pass "uploads/ is empty"
expect_fail "--format tokens needs --vocab-size" 2 "--vocab-size" A dataset add ids "$D/ids.bin" --format tokens
expect_fail "an unknown --format is named" 2 "no dataset format" A dataset add ids "$D/ids.bin" --format csv

# A job naming a malformed file is refused when gpuctl uploads it.
job badjob "name: \"bad\" vdev: \"a0\" $MODEL
train { npy { images: \"$D/train-x.npy\" labels: \"$D/negative.npy\" } } batch_size: 4"
expect_fail "submit with negative labels is refused at upload" 1 "label -1 at index 2" A submit "$T/badjob.pb"

# --- token streams: checked, then refused for an image model ----------------
expect_ok "upload a uint16 token file" A dataset add ids "$D/ids.bin" --format tokens --vocab-size 64
job tokens "name: \"tok\" vdev: \"a0\" $MODEL
train { tokens { path: \"$D/ids.bin\" vocab_size: 64 } sequence_length: 8 } batch_size: 2"
expect_fail "a token job on an image model is refused, naming the mismatch" 1 \
  "needs a model whose input is token ids" A submit "$T/tokens.pb"
[[ "$LAST_OUT" == *spec.train.tokens* ]] && pass "the refusal names spec.train.tokens" || fail "field: $LAST_OUT"
job tokvocab "name: \"tok\" vdev: \"a0\" $MODEL
train { tokens { path: \"$D/ids.bin\" vocab_size: 50 } sequence_length: 8 } batch_size: 2"
expect_fail "a job's smaller vocabulary is checked against the file" 1 \
  "token id 50 at byte offset 100" A submit "$T/tokvocab.pb"
printf 'to be or not to be, that is the question' >"$D/book.txt"; chmod 644 "$D/book.txt"
job text "name: \"txt\" vdev: \"a0\" $MODEL
train { text { path: \"$D/book.txt\" examples: 3 } sequence_length: 8 }
test { text { path: \"$D/book.txt\" } sequence_length: 8 } batch_size: 1"
expect_fail "a text job on an image model is refused" 1 "the model takes images of 8x8x1" A submit "$T/text.pb"

# --- a language model on text, through the daemon -------------------------
$PY - "$D/story.txt" <<'PY'
import sys
words = "the cat sat on the mat and the dog ran to the log by the big red sun".split()
out, x = [], 7
for i in range(3000):                # a deterministic stream of those words
    x = (x * 1103515245 + 12345) % (1 << 31)
    out.append(words[x % len(words)])
open(sys.argv[1], "w").write(" ".join(out) + "\n")
PY
chmod 644 "$D/story.txt"
GPT='model { input { sequence_length: 16 }
  layer { name: "tok" embedding { vocab_size: 256 dim: 32 } }
  layer { name: "pos" position_embedding {} }
  layer { name: "ln" layer_norm {} }
  layer { name: "attn" causal_self_attention { heads: 2 head_size: 16 } }
  layer { name: "res" add {} inputs: "attn" inputs: "pos" }
  layer { name: "ln_f" layer_norm {} }
  layer { name: "head" dense { units: 256 } } }'
job gpt "name: \"gpt\" vdev: \"a0\" $GPT
train { text { path: \"$D/story.txt\" examples: 560 } }
test { text { path: \"$D/story.txt\" } }
batch_size: 16 epochs: 3 seed: 1 optimizer { adam { learning_rate: 0.01 } }"
expect_ok "submit --watch a small GPT on a text file" A submit "$T/gpt.pb" --watch
[[ "$LAST_OUT" == *SUCCEEDED* ]] && pass "the language model SUCCEEDED" || fail "watch: $(echo "$LAST_OUT" | tail -n 3)"
id=$(A --json list | $PY -c "import json,sys; print([j['id'] for j in json.load(sys.stdin)['job'] if j['name'] == 'gpt'][-1])")
loss=$(A --json status "$id" | json_field "['job']['epoch'][-1]['test_loss']")
$PY -c "import sys; sys.exit(0 if float('$loss') < 2.5 else 1)" \
  && pass "held-out loss $loss nats a byte, below 2.5 (a uniform guess: 5.55)" \
  || fail "held-out loss $loss is not below 2.5"
job gptlen "name: \"gpt\" vdev: \"a0\" $GPT
train { text { path: \"$D/story.txt\" examples: 560 } sequence_length: 8 } batch_size: 16"
expect_fail "a text set cut other than the model's sequence is refused" 1 \
  "model.input.sequence_length" A submit "$T/gptlen.pb"
job gptvocab "name: \"gpt\" vdev: \"a0\" ${GPT/units: 256/units: 128}
train { text { path: \"$D/story.txt\" examples: 560 } } batch_size: 16"
expect_fail "a head narrower than the vocabulary is refused" 1 \
  "one unit per token id" A submit "$T/gptvocab.pb"

finish
