"""python_client.py GPUCTL SRC WORKDIR: the gpushare Python package against
a running gpushared (test_python_client.sh starts it and sets
GPUSHARE_SOCKET and PYTHONPATH).

Every call of the protocol once at least: admin calls, uploads, plans that
fit and do not, submits from a dict, a .pb, a .txtpb and a helper-built
spec, a watch to the end and one that cancels its job in the middle of the
stream (the cancel's answer interleaves with the events), fetch to bytes
and to a file against gpuctl fetch's, the weights through load_safetensors
and into torch, errors with their code, message and field, a non-admin's
PERMISSION_DENIED, the messages built from gpushare.proto when no generated
module is there, and then the session of clients/python/README.md, run as
it stands. Prints ok/FAIL lines; exits 1 on any failure.
"""
import gzip
import hashlib
import os
import random
import re
import shutil
import struct
import subprocess
import sys
import traceback

import gpushare as gs

GPUCTL, SRC, WORK = sys.argv[1:4]
SOCK = os.environ["GPUSHARE_SOCKET"]
FAILS = 0
CHECKS = 0


def check(ok, what, detail=""):
    global FAILS, CHECKS
    CHECKS += 1
    if ok:
        print(f"ok - {what}")
    else:
        FAILS += 1
        print(f"FAIL - {what}{': ' + str(detail) if detail else ''}")
    return ok


def npy_bytes(descr, shape, data, fortran=False):
    """A .npy file (format 1.0) as numpy.save writes it."""
    d = "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }" % (descr, fortran, shape)
    hl = (10 + len(d) + 1 + 63) // 64 * 64 - 10
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", hl) + (d.ljust(hl - 1) + "\n").encode() + data


def expect_error(what, cls, code, field, text, fn, *args, **kw):
    """fn(...) raises cls with that code and field, its message containing text."""
    try:
        fn(*args, **kw)
    except gs.Error as e:
        check(isinstance(e, cls) and e.code == code and e.field == field and text in e.message, what,
              f"{type(e).__name__} code {e.code} field {e.field!r}: {e.message}")
        return e
    check(False, what, "no exception")
    return None


def idx_files(prefix, n, seed):
    """An IDX pair of n 8x8 images in 4 classes, gzip'd, as tests/integration/idxfile.py writes."""
    rng = random.Random(seed)
    labels = bytes(rng.randrange(4) for _ in range(n))
    # images: the class's quadrant bright, so the set can be learnt
    pix = bytearray()
    for c in labels:
        for y in range(8):
            for x in range(8):
                quad = (y >= 4) * 2 + (x >= 4)
                pix.append(200 + rng.randrange(55) if quad == c else rng.randrange(40))
    img = struct.pack(">IIII", 0x803, n, 8, 8) + bytes(pix)
    lab = struct.pack(">II", 0x801, n) + labels
    paths = (f"{prefix}-images.gz", f"{prefix}-labels.gz")
    for p, data in zip(paths, (img, lab)):
        with open(p, "wb") as f:
            f.write(gzip.compress(data, mtime=0))
    return paths


SMALL = {"name": "from-dict", "vdev": "pv",
         "model": {"input": {"height": 8, "width": 8, "channels": 1},
                   "layer": [{"flatten": {}}, {"dense": {"units": 16, "activation": "RELU"}},
                             {"dense": {"units": 4}}]},
         "train": {"synthetic": {"examples": 512, "seed": 7, "classes": 4}},
         "batchSize": 32, "epochs": 1, "seed": 1, "optimizer": {"adam": {"learningRate": 0.003}}}


def wait_end(c, job):
    """The job's last event, watched to its end."""
    last = None
    for ev in c.watch(job):
        last = ev
    return last


def main():
    os.chdir(WORK)
    me = os.getuid()
    c = gs.connect()
    v = c.version()
    check(v.uid == me and v.admin and v.version, "version: the daemon sees this uid as an admin", v)

    # ---- admin calls
    t = c.create_tenant("py", uids=[me], memory_bytes="1GiB", max_queued=8)
    check(t.name == "py" and list(t.uids) == [me] and t.quota.memory_bytes == 1 << 30,
          "create_tenant with a quota", t)
    check("py" in [x.name for x in c.list_tenants()], "list_tenants names it")
    t = c.set_quota("py", compute_share=90)
    check(t.quota.compute_share == 90 and t.quota.memory_bytes == 1 << 30, "set_quota changes only what it sets", t)
    check(c.get_quota("py").quota.max_queued == 8, "get_quota")
    vd = c.create_vdev("pv", "256MiB", "py", compute_share=40, policy="growth")
    check(vd.memory_limit == 256 << 20 and vd.policy == gs.pb.GROWTH and vd.device == "cpu",
          "create_vdev: 256MiB growth on cpu", vd)
    up = c.update_vdev("pv", compute_share=45)
    check(up.vdev.compute_share == 45 and up.vdev.memory_limit == 256 << 20, "update_vdev keeps what it does not set",
          up)
    check(c.set_vdev("pv", compute_share=50).vdev.compute_share == 50, "set_vdev is update_vdev")
    check(["pv"] == [x.name for x in c.list_vdevs()], "list_vdevs")
    check(any(d.name == "cpu" and d.vdev_count == 1 for d in c.list_devices()), "list_devices counts the vdev")
    expect_error("a tenant twice: AlreadyExists", gs.AlreadyExists, gs.pb.ALREADY_EXISTS, "create_tenant.name",
                 "py", c.create_tenant, "py", uids=[me])
    expect_error("a size the client cannot read: InvalidArgument before sending", gs.InvalidArgument,
                 gs.pb.INVALID_ARGUMENT, "create_vdev.memory_limit", "12XB", c.create_vdev, "x", "12XB", "py")
    expect_error("an unknown policy name", gs.InvalidArgument, gs.pb.INVALID_ARGUMENT, "create_vdev.policy",
                 "PREALLOCATE, GROWTH", c.create_vdev, "x", "1MiB", "py", policy="shared")
    expect_error("no vdev size: the daemon's field", gs.InvalidArgument, gs.pb.INVALID_ARGUMENT,
                 "create_vdev.memory_limit", "", c.create_vdev, "x", 0, "py")

    # ---- datasets
    img, lab = idx_files(os.path.join(WORK, "quad"), 1024, 1)
    info = c.upload_dataset("quad.images", img)
    with open(img, "rb") as f:
        want = hashlib.sha256(f.read()).hexdigest()
    check(info.sha256 == want and info.tenant == "py", "upload_dataset from a path: the sha256 of the file", info)
    with open(lab, "rb") as f:
        lab_bytes = f.read()
    info = c.upload_dataset("quad.labels", lab_bytes)
    check(info.sha256 == hashlib.sha256(lab_bytes).hexdigest() and info.bytes == len(lab_bytes),
          "upload_dataset from bytes", info)
    n = 32800  # 8x8 images: 2 MiB and a bit, three chunks
    big = struct.pack(">IIII", 0x803, n, 8, 8) + os.urandom(n * 64)
    info = c.upload_dataset("blob", big)
    check(len(big) > 2 * gs.CHUNK and info.bytes == len(big) and info.sha256 == hashlib.sha256(big).hexdigest(),
          f"a {len(big)}-byte upload in three chunks", info)
    c.remove_dataset("blob")
    # uploads of the other formats are checked as those: a refusal keeps nothing
    expect_error("an .npy upload in Fortran order", gs.InvalidArgument, gs.pb.INVALID_ARGUMENT,
                 "upload_dataset.data", "Fortran order", c.upload_dataset, "f.npy",
                 npy_bytes("|u1", "(2, 2, 2)", bytes(8), fortran=True))
    expect_error("a token id over vocab_size", gs.InvalidArgument, gs.pb.INVALID_ARGUMENT,
                 "upload_dataset.data", "token id 9 at byte offset 2", c.upload_dataset, "ids",
                 struct.pack("<3H", 1, 9, 2), "tokens", 5)
    expect_error("an unknown format word", gs.InvalidArgument, gs.pb.INVALID_ARGUMENT,
                 "upload_dataset.format", "no dataset format", c.upload_dataset, "ids", b"ab", "csv")
    names = sorted(d.name for d in c.list_datasets())
    check(names == ["quad.images", "quad.labels"], "list_datasets after remove_dataset", names)

    # ---- plan
    p = c.plan(os.path.join(SRC, "examples", "synthetic-small.txtpb"), vdev="pv")
    check(p.fits and 0 < p.peak_bytes <= p.limit_bytes and p.summary, "plan a .txtpb on pv: fits", p.peak_bytes)
    bigjob = gs.job_spec("big", input=(28, 28, 1),
                         layers=[gs.conv2d(64, 3, activation="relu"), gs.flatten(), gs.dense(10)],
                         train=gs.synthetic(2048, seed=7, classes=10), batch_size=1024, max_steps=3, vdev="pv")
    p = c.plan(bigjob, vdev="pv")
    check(p.HasField("fits") and not p.fits and p.peak_bytes > p.limit_bytes,
          "plan a job over pv: a Plan with fits false", (p.fits, p.peak_bytes, p.limit_bytes))
    e = expect_error("submit it: ResourceExhausted with the plan", gs.ResourceExhausted, gs.pb.RESOURCE_EXHAUSTED,
                     "submit.spec.batch_size", "micro-batch", c.submit, bigjob)
    check(e is not None and e.plan is not None and not e.plan.fits, "the exception carries the plan")

    # ---- submit four ways
    j_dict = c.submit(SMALL)
    check(j_dict.id > 0 and j_dict.name == "from-dict" and j_dict.vdev == "pv", "submit a dict", j_dict)
    j_pb = c.submit(os.path.join(os.environ["GS_BUILD_DIR"], "examples", "synthetic-small.pb"), vdev="pv",
                    priority=1)
    check(j_pb.name == "synthetic-small" and j_pb.priority == 1, "submit a .pb path, vdev and priority given", j_pb)
    j_txt = c.submit(os.path.join(SRC, "examples", "synthetic-small.txtpb"), vdev="pv")
    check(c.status(j_txt).spec.precision == gs.pb.MIXED_BFLOAT16, "submit a .txtpb path", j_txt)
    # helper-built, on the datasets uploaded by name, and local test files
    # submit uploads by hash
    timg, tlab = idx_files(os.path.join(WORK, "quadtest"), 256, 2)
    helper = gs.job_spec("helper", input=(8, 8, 1),
                         layers=[gs.flatten(), gs.dense(32, "relu"), gs.dense(4)],
                         train=gs.named("quad"), test=gs.idx(timg, tlab),
                         optimizer=gs.adam(0.01, schedule="cosine"), batch_size=32, epochs=2, seed=3, vdev="pv")
    j_help = c.submit(helper)
    sent = c.status(j_help).spec.test.idx
    check(sent.images == "sha256:" + hashlib.sha256(open(timg, "rb").read()).hexdigest(),
          "submit resolves a local idx path to its sha256", sent)
    names = sorted(d.name for d in c.list_datasets())
    check(names == ["quad.images", "quad.labels", "quadtest-images.gz", "quadtest-labels.gz"],
          "submit uploaded the local files under their base names", names)
    j_again = c.submit(helper)
    check(len(c.list_datasets()) == 4, "a second submit uploads nothing again")

    # ---- watch to the end; status, list, logs
    events = list(c.watch(j_help))
    last = events[-1]
    check(last.state == gs.pb.SUCCEEDED and last.step == last.total_steps == 64 and last.job_id == j_help.id,
          f"watch the helper job to SUCCEEDED ({len(events)} events)", last)
    st = c.status(j_help)
    check(st.state == gs.pb.SUCCEEDED and len(st.epoch) == 2 and st.epoch[-1].test_accuracy > 0.9,
          f"status: 2 epochs, test accuracy {st.epoch[-1].test_accuracy:.3f} (over 0.9) on the quadrant set",
          st.epoch)
    for j in (j_dict, j_pb, j_txt, j_again):
        ev = wait_end(c, j)
        check(ev.state == gs.pb.SUCCEEDED, f"job {j.id} ({j.name}) SUCCEEDED", ev)
    ids = [j.id for j in c.list_jobs(all=True)]
    check(set(ids) >= {j_dict.id, j_pb.id, j_txt.id, j_help.id, j_again.id}, "list_jobs(all=True) has them", ids)
    logs = c.logs(j_help)
    check(logs and logs[-1].state == gs.pb.SUCCEEDED, "logs end in SUCCEEDED", len(logs))
    tl = c.memory(j_help)
    check(tl.peak_bytes > 0 and tl.planned_peak_bytes > 0, "memory: a measured and a planned peak", tl.peak_bytes)

    # ---- fetch, against gpuctl fetch
    w = c.fetch(j_help)
    c.fetch(j_help, "py.safetensors")
    subprocess.run([GPUCTL, "--socket", SOCK, "fetch", str(j_help.id), "-o", "gpuctl.safetensors"], check=True,
                   stdout=subprocess.DEVNULL)
    with open("py.safetensors", "rb") as f1, open("gpuctl.safetensors", "rb") as f2:
        a, b = f1.read(), f2.read()
    check(len(w) > 8 and w == a == b, "fetch to bytes and to a file: gpuctl fetch's bytes", (len(w), len(a), len(b)))
    check(oct(os.stat("py.safetensors").st_mode & 0o777) == "0o644" and
          not [n for n in os.listdir(".") if ".part" in n], "the file is 0644 and no partial file is left")
    ck = c.fetch(j_help, checkpoint=True)
    check(len(ck) > 0 and ck != w, "fetch(checkpoint=True): the checkpoint", len(ck))
    expect_error("fetch a job that does not exist", gs.NotFound, gs.pb.NOT_FOUND, "fetch.id", "", c.fetch, 999999)
    weights = gs.load_safetensors(w)
    shapes = {k: v.shape for k, v in weights.items()}
    check(shapes == {"dense_1.kernel": (64, 32), "dense_1.bias": (32,), "dense_2.kernel": (32, 4),
                     "dense_2.bias": (4,)} and all(v.dtype.name == "float32" for v in weights.values()),
          "load_safetensors: LAYER.kernel (inputs, units) and LAYER.bias, fp32", shapes)
    check(all(gs.load_safetensors("py.safetensors")[k].tolist() == weights[k].tolist() for k in weights),
          "load_safetensors from the path: the same tensors")
    try:
        gs.load_safetensors(w[:-4])
        check(False, "a truncated file is refused")
    except ValueError as e:
        check("dense_2.bias" in str(e) or "outside" in str(e), "a truncated file is refused, naming the tensor", e)
    try:
        import torch
    except ImportError:
        print("skip - torch not importable: the weights are not loaded into torch")
    else:
        model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 32), torch.nn.ReLU(),
                                    torch.nn.Linear(32, 4))
        model.load_state_dict({"1.weight": torch.from_numpy(weights["dense_1.kernel"].T.copy()),
                               "1.bias": torch.from_numpy(weights["dense_1.bias"]),
                               "3.weight": torch.from_numpy(weights["dense_2.kernel"].T.copy()),
                               "3.bias": torch.from_numpy(weights["dense_2.bias"])})
        # the trained net classifies a clean quadrant image as its quadrant
        x = torch.zeros(4, 1, 8, 8)
        for q in range(4):
            y, xx = (q // 2) * 4, (q % 2) * 4
            x[q, 0, y:y + 4, xx:xx + 4] = 227 / 255
        pred = model(x).argmax(dim=1).tolist()
        check(pred == [0, 1, 2, 3], "into torch: the trained net tells the four quadrants apart", pred)

    # ---- cancel in the middle of a watch, on the same connection
    long = gs.as_job_spec({**SMALL, "name": "long", "epochs": 10000,
                           "train": {"synthetic": {"examples": 65536, "seed": 1, "classes": 4}}})
    j_long = c.submit(long)
    states, cancelled = [], None
    for ev in c.watch(j_long):
        states.append(ev.state)
        if ev.state == gs.pb.RUNNING and cancelled is None:
            cancelled = c.cancel(j_long)  # its answer comes between the events
    check(cancelled is not None and cancelled.id == j_long.id, "cancel while watching: answered in the stream",
          cancelled)
    check(gs.pb.RUNNING in states and states[-1] == gs.pb.CANCELLED, "the watch ends CANCELLED",
          [gs.pb.JobState.Name(s) for s in states])
    expect_error("cancel an ended job: FailedPrecondition", gs.FailedPrecondition, gs.pb.FAILED_PRECONDITION,
                 "cancel.id", "already ended", c.cancel, j_long)
    # a watch left early: its later events do not confuse the next calls
    j_left = c.submit({**SMALL, "name": "left"})
    next(iter(c.watch(j_left)))
    req = gs.pb.Request()
    req.watch.id = j_left.id
    first = c.request(req)
    check(first.code == gs.pb.OK and first.watch.event.job_id == j_left.id, "request(): a raw watch's first answer",
          first)
    check(c.status(j_left).id == j_left.id and wait_end(c, j_left).state == gs.pb.SUCCEEDED,
          "a watch abandoned after one event: later calls get their own answers")

    # ---- errors: code, message, field
    bad = gs.as_job_spec(SMALL)
    bad.batch_size = 0
    expect_error("batch_size 0: InvalidArgument at submit.spec.batch_size", gs.InvalidArgument,
                 gs.pb.INVALID_ARGUMENT, "submit.spec.batch_size", "batch_size 0", c.submit, bad)
    expect_error("the same at plan: plan.spec.batch_size", gs.InvalidArgument, gs.pb.INVALID_ARGUMENT,
                 "plan.spec.batch_size", "batch_size 0", c.plan, bad)
    bad = gs.as_job_spec(SMALL)
    bad.model.layer[1].dense.units = 0
    expect_error("a layer's field: its path with the index", gs.InvalidArgument, gs.pb.INVALID_ARGUMENT,
                 "submit.spec.model.layer[1].dense.units", "units", c.submit, bad)
    expect_error("status of no such job: NotFound", gs.NotFound, gs.pb.NOT_FOUND, "job_status.id", "999999",
                 c.status, 999999)
    expect_error("a dict field the proto lacks", gs.InvalidArgument, gs.pb.INVALID_ARGUMENT, "submit.spec",
                 "batchsize", c.submit, {"batchsize": 3})
    expect_error("a missing spec file", gs.InvalidArgument, gs.pb.INVALID_ARGUMENT, "plan.spec",
                 "no-such.pb", c.plan, "no-such.pb")
    expect_error("delete a tenant that has vdevs: FailedPrecondition", gs.FailedPrecondition,
                 gs.pb.FAILED_PRECONDITION, "delete_tenant.name", "", c.delete_tenant, "py")

    # ---- usage, metrics
    today = __import__("datetime").date.today().isoformat()
    u = c.usage(since=today)
    py = [x for x in u if x.tenant == "py"]
    check(py and py[0].total.steps >= 64 and any(r.job_id == j_help.id for r in py[0].job),
          "usage(since=today): the tenant's steps and a row per job", py[:1])
    expect_error("usage of no such tenant", gs.NotFound, gs.pb.NOT_FOUND, "usage.tenant", "", c.usage, "nobody")
    check("gpushare_" in c.metrics(), "metrics: Prometheus text")

    # ---- PERMISSION_DENIED as a non-admin
    if os.geteuid() == 0 and shutil.which("setpriv"):
        snippet = ("import gpushare as gs\n"
                   "c = gs.connect()\n"
                   "print('admin', c.version().admin)\n"
                   "try:\n    c.create_tenant('evil', uids=[65534])\n"
                   "except gs.PermissionDenied as e:\n    print('denied', e.code, repr(e.field), e.message)\n")
        r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c",
                            snippet], capture_output=True, text=True)
        check(r.returncode == 0 and "admin False" in r.stdout and "denied 4 ''" in r.stdout,
              "as nobody: create_tenant raises PermissionDenied (code 4, no field)", r.stdout + r.stderr)
    else:
        print("skip - not root: the non-admin part needs setpriv as root")

    # ---- the messages built from gpushare.proto (no generated module)
    env = dict(os.environ, PYTHONPATH=os.path.join(SRC, "clients", "python"))
    env.pop("GPUSHARE_PROTO", None)  # found in the checkout's proto/, as gpuctl finds it in a build tree
    r = subprocess.run([sys.executable, "-c", "import gpushare as gs; c = gs.connect(); "
                        "print(hasattr(gs.pb, '__file__'), c.version().admin, c.status(%d).state == gs.pb.SUCCEEDED)"
                        % j_help.id], capture_output=True, text=True, env=env)
    check(r.returncode == 0 and r.stdout.split() == ["False", "True", "True"],
          "from the source tree the messages are built from gpushare.proto", r.stdout + r.stderr)

    # ---- an .npy pair from local files: uploaded as npy, trained on
    x = struct.pack("<256f", *[((i // 64) % 4 == (i % 64) // 16) * 1.0 for i in range(256)])
    xp, yp = os.path.join(WORK, "x.npy"), os.path.join(WORK, "y.npy")
    with open(xp, "wb") as f:
        f.write(npy_bytes("<f4", "(4, 8, 8)", x))
    with open(yp, "wb") as f:
        f.write(npy_bytes("|u1", "(4,)", bytes([0, 1, 2, 3])))
    j_npy = c.submit(gs.job_spec("npy", input=(8, 8, 1), layers=[gs.flatten(), gs.dense(4)],
                                 train=gs.npy(xp, yp), batch_size=2, epochs=2, vdev="pv"))
    sent = c.status(j_npy).spec.train.npy
    check(sent.images == "sha256:" + hashlib.sha256(open(xp, "rb").read()).hexdigest(),
          "submit resolves local .npy paths to their sha256", sent)
    ev = wait_end(c, j_npy)
    check(ev.state == gs.pb.SUCCEEDED, "the .npy job SUCCEEDED", ev)

    # ---- clean up, with the delete calls
    for name in ("quad.images", "quad.labels", "quadtest-images.gz", "quadtest-labels.gz", "x.npy", "y.npy"):
        c.remove_dataset(name)
    c.delete_vdev("pv")
    c.delete_tenant("py")
    check(not c.list_vdevs() and "py" not in [x.name for x in c.list_tenants()] and not c.list_datasets(),
          "remove_dataset, delete_vdev, delete_tenant")
    c.close()
    expect_error("a closed client says so", gs.Unavailable, gs.pb.UNAVAILABLE, "", "closed", c.version)
    expect_error("no daemon at a socket", gs.Unavailable, gs.pb.UNAVAILABLE, "", "cannot connect",
                 gs.connect, os.path.join(WORK, "none.sock"))

    # ---- the README's session, as it stands
    readme = open(os.path.join(SRC, "clients", "python", "README.md")).read()
    blocks = re.findall(r"^```python\n(.*?)^```", readme, re.S | re.M)
    check(len(blocks) >= 5, f"the README has its python blocks ({len(blocks)})")
    try:
        import torch  # noqa: F401
        have_torch = True
    except ImportError:
        have_torch = False
    os.makedirs("readme", exist_ok=True)
    os.chdir("readme")
    ns = {"__name__": "__readme__"}
    for i, block in enumerate(blocks):
        if "import torch" in block and not have_torch:
            print(f"skip - README block {i + 1}: torch not importable")
            continue
        try:
            exec(compile(block, f"README.md python block {i + 1}", "exec"), ns)
            check(True, f"README block {i + 1} runs")
        except Exception:
            check(False, f"README block {i + 1} runs", traceback.format_exc())
            break
    if "status" in ns:
        check(ns["status"].state == gs.pb.SUCCEEDED and "dense_3.kernel" in ns["weights"],
              "the README's job succeeded and its weights were loaded")
    print(f"{CHECKS - FAILS} passed, {FAILS} failed")
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
