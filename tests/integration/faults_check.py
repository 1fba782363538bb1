"""faults_check.py: what test_faults.sh checks after each kill -9 of gpushared.

  faults_check.py gen OUT COUNT SEED
      Write a raw IDX images file (COUNT x 28 x 28 seeded random bytes) and
      OUT.sha256 beside it, for `gpuctl dataset add`.

  faults_check.py offline STATE
      With the daemon down: every file in STATE/datasets is a complete
      content-addressed blob (its sha256 is its name), every checkpoint under
      STATE/jobs/*/ is whole (the magic, the file length its header records,
      the CRC-32 of runtime/ckpt.c's format) and every exported
      model.safetensors is whole (header, offsets up to the file's end).
      Prints "ckpt ID STEP PATH" for each checkpoint, "FAIL ..." for each
      problem, "note ..." for what is allowed but worth seeing.

  faults_check.py online STATE BOOK LIST_JSON DATASETS_JSON [--final]
      With the daemon up, against the test's book (BOOK/submitted "NAME
      STEPS", accepted "NAME ID", cancel_wanted, cancel_acked "NAME",
      ds_tried "NAME FILE", ds_accepted "NAME"): each accepted job listed
      exactly once under the id gpuctl printed, no name twice, no job the test
      never submitted, no job FAILED; each listed dataset one the test sent,
      with that file's size and sha256, each accepted one listed, its blob in
      STATE/datasets, STATE/uploads empty. --final: every job ended, SUCCEEDED
      after exactly its steps, or CANCELLED where the test cancelled it (and
      CANCELLED wherever a cancel was acknowledged).

Exit status 0 when nothing failed, 1 otherwise. Standard library only.
"""
import hashlib
import json
import os
import random
import re
import sqlite3
import struct
import sys
import zlib

problems = []


def fail(msg):
    problems.append(msg)
    print("FAIL " + msg)


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def cached_sha(state, path):
    """sha256 of a blob, cached by (name, size, mtime): the blobs are only
    ever renamed into place, so the cache saves rehashing them every round."""
    cache_path = os.path.join(os.path.dirname(state), "faults-sha-cache.json")
    try:
        with open(cache_path) as f:
            cache = json.load(f)
    except (OSError, ValueError):
        cache = {}
    st = os.stat(path)
    key = "%s:%d:%d" % (path, st.st_size, st.st_mtime_ns)
    if key not in cache:
        cache[key] = sha256_file(path)
        with open(cache_path + ".new", "w") as f:
            json.dump(cache, f)
        os.replace(cache_path + ".new", cache_path)
    return cache[key]


def gen(out, count, seed):
    body = random.Random(seed).randbytes(count * 28 * 28)
    data = struct.pack(">IIII", 0x803, count, 28, 28) + body
    with open(out, "wb") as f:
        f.write(data)
    with open(out + ".sha256", "w") as f:
        f.write(hashlib.sha256(data).hexdigest() + "\n")


def check_ckpt(path):
    """The step of a whole checkpoint, or None (after a FAIL)."""
    with open(path, "rb") as f:
        b = f.read()
    if len(b) < 28 or b[:8] != b"GSCKPT01":
        fail("checkpoint %s: %d bytes, not a whole GSCKPT01 file" % (path, len(b)))
        return None
    version, count, fbytes = struct.unpack_from("<IIQ", b, 8)
    if fbytes != len(b):
        fail("checkpoint %s is partial: %d bytes, its header says %d" % (path, len(b), fbytes))
        return None
    stored = struct.unpack_from("<I", b, len(b) - 4)[0]
    crc = zlib.crc32(b[:-4]) & 0xFFFFFFFF
    if crc != stored:
        fail("checkpoint %s: CRC-32 %08x, the file records %08x" % (path, crc, stored))
        return None
    return struct.unpack_from("<Q", b, 24)[0]


def check_safetensors(path):
    with open(path, "rb") as f:
        b = f.read()
    if len(b) < 8:
        fail("export %s: %d bytes" % (path, len(b)))
        return
    n = struct.unpack_from("<Q", b, 0)[0]
    if 8 + n > len(b):
        fail("export %s is partial: header of %d bytes in a %d-byte file" % (path, n, len(b)))
        return
    try:
        hdr = json.loads(b[8:8 + n])
    except ValueError as e:
        fail("export %s: header is not JSON (%s)" % (path, e))
        return
    end = max([v["data_offsets"][1] for k, v in hdr.items() if k != "__metadata__"] or [0])
    if 8 + n + end != len(b):
        fail("export %s: tensors end at %d, the file has %d bytes" % (path, 8 + n + end, len(b)))


def offline(state):
    ddir = os.path.join(state, "datasets")
    for name in sorted(os.listdir(ddir)):
        p = os.path.join(ddir, name)
        if not re.fullmatch(r"[0-9a-f]{64}", name):
            fail("datasets/%s is not a content-addressed blob name" % name)
        elif cached_sha(state, p) != name:
            fail("datasets/%s holds content of sha256 %s (partial?)" % (name, cached_sha(state, p)))
    db = sqlite3.connect("file:%s?mode=ro" % os.path.join(state, "gpushared.db"), uri=True)
    rows = db.execute("SELECT tenant, name, sha256, bytes FROM datasets").fetchall()
    db.close()
    for tenant, name, sha, size in rows:
        p = os.path.join(ddir, sha)
        if not os.path.isfile(p):
            fail("dataset %s/%s is in the store but its blob %s is not" % (tenant, name, sha))
        elif os.path.getsize(p) != size:
            fail("dataset %s/%s: the store says %d bytes, its blob has %d" %
                 (tenant, name, size, os.path.getsize(p)))
    orphans = set(os.listdir(ddir)) - {r[2] for r in rows}
    if orphans:
        print("note %d whole blob(s) no dataset names (a kill between rename and row)" % len(orphans))
    up = os.listdir(os.path.join(state, "uploads"))
    if up:
        print("note %d unfinished upload file(s) in uploads/ (emptied at start)" % len(up))
    jdir = os.path.join(state, "jobs")
    tmps = {}
    for jid in sorted(os.listdir(jdir), key=lambda s: (len(s), s)):
        d = os.path.join(jdir, jid)
        for f in sorted(os.listdir(d)):
            p = os.path.join(d, f)
            if f == "checkpoint.ckpt":
                step = check_ckpt(p)
                if step is not None:
                    print("ckpt %s %d %s" % (jid, step, p))
            elif f == "model.safetensors":
                check_safetensors(p)
            elif f.endswith(".tmp"):
                tmps[f] = tmps.get(f, 0) + 1
            else:
                fail("jobs/%s/%s: a file the daemon does not write" % (jid, f))
    if tmps:
        print("note writes cut off (never read): %s" %
              ", ".join("%d %s" % (n, f) for f, n in sorted(tmps.items())))


def book(bdir, name):
    try:
        with open(os.path.join(bdir, name)) as f:
            return [l.split() for l in f if l.strip()]
    except FileNotFoundError:
        return []


def online(state, bdir, list_json, ds_json, final):
    with open(list_json) as f:
        jobs = json.load(f).get("job", [])
    with open(ds_json) as f:
        dsets = json.load(f).get("dataset", [])
    submitted = {l[0]: int(l[1]) for l in book(bdir, "submitted")}
    accepted = {l[0]: int(l[1]) for l in book(bdir, "accepted")}
    cancel_wanted = {l[0] for l in book(bdir, "cancel_wanted")}
    cancel_acked = {l[0] for l in book(bdir, "cancel_acked")}
    by_name, by_id = {}, {}
    for j in jobs:
        by_name.setdefault(j.get("name", ""), []).append(j)
        by_id.setdefault(j.get("id"), []).append(j)
    for i, js in by_id.items():
        if len(js) > 1:
            fail("job id %s listed %d times" % (i, len(js)))
    for name, js in sorted(by_name.items()):
        if name not in submitted:
            fail("job %s (id %s) was never submitted" % (name, js[0].get("id")))
        if len(js) > 1:
            fail("job %s is listed %d times (ids %s): submitted once" %
                 (name, len(js), [j.get("id") for j in js]))
    for name, jid in sorted(accepted.items()):
        js = by_name.get(name, [])
        if not js:
            fail("job %s (id %d) was accepted but is gone" % (name, jid))
        elif js[0].get("id") != jid:
            fail("job %s was accepted as id %d but is listed as id %s" % (name, jid, js[0].get("id")))
    states = {}
    for j in jobs:
        name, st = j.get("name", ""), j.get("state", "")
        states[st] = states.get(st, 0) + 1
        what = "job %s (id %s)" % (name, j.get("id"))
        if st == "FAILED":
            fail("%s FAILED: %s" % (what, j.get("reason", "")))
        if st == "CANCELLED" and name not in cancel_wanted:
            fail("%s is CANCELLED but the test never cancelled it: %s" % (what, j.get("reason", "")))
        if st == "SUCCEEDED" and name in submitted and j.get("step") != submitted[name]:
            fail("%s SUCCEEDED after %s steps, its spec says %d" % (what, j.get("step"), submitted[name]))
        if st == "SUCCEEDED" and not os.path.isfile(
                os.path.join(state, "jobs", str(j.get("id")), "model.safetensors")):
            fail("%s SUCCEEDED but has no trained weights to fetch" % what)
        if name in cancel_acked and st in ("QUEUED", "RUNNING"):
            fail("%s is %s after a restart though its cancel was acknowledged before the kill" %
                 (what, st))
        if final:
            if name in cancel_acked and st != "CANCELLED":
                fail("%s: its cancel was acknowledged, yet it is %s" % (what, st))
            elif name in cancel_wanted and st not in ("CANCELLED", "SUCCEEDED"):
                fail("%s did not end: %s" % (what, st))
            elif name not in cancel_wanted and st != "SUCCEEDED":
                fail("%s did not succeed: %s" % (what, st))
    # Datasets: only whole ones, each accepted one kept.
    tried = {l[0]: l[1] for l in book(bdir, "ds_tried")}
    ds_acc = {l[0] for l in book(bdir, "ds_accepted")}
    seen = {}
    for ds in dsets:
        name = ds.get("name")
        seen[name] = seen.get(name, 0) + 1
        if name not in tried:
            fail("dataset %s was never uploaded" % name)
            continue
        path = tried[name]
        with open(path + ".sha256") as f:
            want = f.read().strip()
        size = os.path.getsize(path)
        if ds.get("sha256") != want or ds.get("bytes") != size:
            fail("dataset %s is listed with %s bytes, sha256 %s; the file uploaded has %d, %s" %
                 (name, ds.get("bytes"), ds.get("sha256"), size, want))
        blob = os.path.join(state, "datasets", want)
        if not os.path.isfile(blob):
            fail("dataset %s is listed but its blob %s is missing" % (name, blob))
        elif os.path.getsize(blob) != size or cached_sha(state, blob) != want:
            fail("dataset %s: its blob is not the file uploaded" % name)
    for name, n in seen.items():
        if n > 1:
            fail("dataset %s listed %d times" % (name, n))
    for name in sorted(ds_acc - set(seen)):
        fail("dataset %s was accepted but is not listed" % name)
    up = os.listdir(os.path.join(state, "uploads"))
    if up:
        fail("uploads/ holds %s after a restart (it is emptied at start)" % up)
    print("jobs %d %s; datasets %d listed, %d accepted of %d tried" %
          (len(jobs), " ".join("%s=%d" % kv for kv in sorted(states.items())), len(dsets),
           len(ds_acc), len(tried)))


def main(argv):
    if len(argv) >= 2 and argv[1] == "gen" and len(argv) == 5:
        gen(argv[2], int(argv[3]), int(argv[4]))
    elif len(argv) == 3 and argv[1] == "offline":
        offline(argv[2])
    elif len(argv) in (6, 7) and argv[1] == "online":
        online(argv[2], argv[3], argv[4], argv[5], len(argv) == 7 and argv[6] == "--final")
    else:
        sys.exit(__doc__)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
