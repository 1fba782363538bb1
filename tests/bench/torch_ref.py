#!/usr/bin/env python3
"""torch_ref.py: any gpushare job spec in PyTorch, for bench_train.sh and
test_torch_parity.sh.

The peer that gpushare-run's speed and accuracy are read against: the same
model (built from the spec's layers by gs_torch.py, every kind the proto
has), the same data (the spec's datasets read as gpushare-run reads them:
IDX and .npy images / 255, synthetic sets, text and token streams), the same
recipe (batch, accumulation, epochs, steps, Adam or SGD, the learning-rate
schedule, the last partial batch dropped), on the CPU with the same number
of threads. PyTorch is NCHW where gpushare is NHWC; SAME padding is
TensorFlow's (extra padding at the bottom and right) and flatten takes
gpushare's (h, w, c) order, so shapes and tensors match layer for layer.
Prints one JSON line last.

By default (--start gpushare) it also starts where gpushare-run starts: the
same initial weights, drawn from the seed by gpushare's splitmix64 streams
and moved into PyTorch's layouts, and the same data order, epoch by epoch.
The two runs then differ only in their arithmetic: the first step's loss
agrees to 7 digits and after 100 steps to 5-6, and test accuracies after one
epoch can be read against each other (with --start torch, PyTorch's own
draw, one epoch of the MobileNet moved by two to four points from seed to
seed). Parity is defined in FLOAT32 with dropout at rate 0: a dropout mask
here is PyTorch's, not gpushare's.

--load W.safetensors skips training: it loads the weights gpushare-run
exported (gpushare-run job.pb --export W.safetensors) and evaluates the test
set, so PyTorch's accuracy (images) or loss and perplexity (tokens) of
gpushare's trained model can be read against gpushare's own. --export writes
the trained weights the same way, in gpushare's names and layouts.

usage: torch_ref.py {mlp,cnn,mobilenet} | --spec FILE.txtpb
                    [--epochs N] [--batch N] [--max-steps N] [--seed N]
                    [--lr X] [--schedule constant|cosine] [--threads N]
                    [--data-dir DIR] [--start gpushare|torch]
                    [--load W.safetensors] [--export W.safetensors] [--losses]
A name is examples/fashion-NAME.txtpb. Each unset option is the spec's.
"""
import os

# Debian's torch calls OpenBLAS (libblas.so.3) from inside its own OpenMP
# threads; left alone, OpenBLAS starts a thread per visible core as well and
# the two oversubscribe the CPU, which slows the MLP severalfold. One
# OpenBLAS thread is the peer's best setting, and it gets it.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gs_torch  # noqa: E402

NAMED = ("mlp", "cnn", "mobilenet")


def main():
    ap = argparse.ArgumentParser(description="a gpushare job spec trained in PyTorch")
    ap.add_argument("model", nargs="?", choices=NAMED,
                    help="an example: examples/fashion-MODEL.txtpb")
    ap.add_argument("--spec", help="a JobSpec, text format (.txtpb) or encoded (.pb)")
    ap.add_argument("--epochs", type=int)
    ap.add_argument("--batch", type=int)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-steps", type=int, help="0: the spec's limit")
    ap.add_argument("--seed", type=int)
    ap.add_argument("--lr", type=float)
    ap.add_argument("--schedule", choices=["constant", "cosine"],
                    help="the learning-rate schedule's kind, its warm-up and final fraction "
                         "the spec's")
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist",
                    help="where file names not beside the spec are found")
    ap.add_argument("--start", choices=["gpushare", "torch"], default="gpushare",
                    help="gpushare: the initial weights and data order gpushare-run draws "
                         "from the seed, bit for bit (the default); torch: PyTorch's own draw")
    ap.add_argument("--load", metavar="W.safetensors",
                    help="evaluate gpushare's exported weights instead of training")
    ap.add_argument("--export", metavar="W.safetensors",
                    help="write the weights at the end in gpushare's names and layouts")
    ap.add_argument("--losses", action="store_true", help="also print each step's loss")
    a = ap.parse_args()
    if (a.model is None) == (a.spec is None):
        ap.error("name one example (mlp, cnn, mobilenet) or give --spec FILE, not both")
    path = a.spec or os.path.join(gs_torch.SRC, "examples", f"fashion-{a.model}.txtpb")
    spec = gs_torch.read_spec(path)
    torch.set_num_threads(a.threads)
    recipe = gs_torch.Recipe(spec, batch=a.batch, epochs=a.epochs, max_steps=a.max_steps,
                             seed=a.seed, lr=a.lr, schedule=a.schedule)
    torch.manual_seed(recipe.seed)
    model = gs_torch.Model(spec.model)
    train, test = gs_torch.Loader(spec, os.path.dirname(os.path.abspath(path)), a.data_dir).load()
    res = {"model": a.model or spec.name or os.path.basename(path)}
    if a.load:
        model.load_tensors(gs_torch.read_safetensors(a.load), a.load)
        res["loaded"] = a.load
        steps = 0
    else:
        if a.start == "gpushare":
            model.init(seed=recipe.seed)
        else:
            model.init(generator=torch.Generator().manual_seed(recipe.seed))
        steps, last_loss, seconds, losses = gs_torch.train(model, recipe, train, a.start)
        res.update({"train_loss": last_loss,
                    "samples_per_second": steps * recipe.batch * recipe.accum / seconds
                    if seconds > 0 else 0.0})
        if a.losses:
            res["losses"] = losses
    res.update({"steps": steps, "threads": a.threads, "batch_size": recipe.batch})
    if test is not None and test.n:
        loss, acc = gs_torch.evaluate(model, test, recipe.batch)
        res.update({"test_loss": loss, "test_accuracy": acc})
        if model.tokens:
            res["perplexity"] = math.exp(loss)
    if a.export:
        gs_torch.write_safetensors(a.export, model.tensors(),
                                   {"format": "gpushare", "job": spec.name, "step": str(steps)})
    res["torch"] = torch.__version__
    print(json.dumps(res))


if __name__ == "__main__":
    sys.exit(main())
