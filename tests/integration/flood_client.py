"""flood_client.py MODE SOCKET ...: an attacker, and its victims, for test_floods.sh.

Run as root; each client drops to the uid it is given (gid 65534, no other
groups) in a child process, as a local user would connect. Each mode prints
key=value lines for the test to check, and "error=..." with exit 1 when the
daemon did something no limit explains. Times are measured here and
checked by the test.

  hold SOCK FILE UID:N...   N connections of each UID in turn, each sends
                            `version`: how many are answered (OK) and how
                            many refused (the refusal's code and message,
                            then EOF); the answered ones are held open until
                            FILE exists. Prints ready=1 once all are made.
  trickle SOCK UID N SECS   N connections that announce a 1 MiB frame and
                            send one byte of it every 0.5 s: seconds until the
                            daemon closes each (at most SECS)
  idle SOCK UID N SECS      N connections that send nothing: seconds until the
                            daemon closes each (at most SECS; "open" if not)
  flood SOCK PID SECS UID...  for SECS seconds, from each UID: 32 connections
                            that each announce a 16 MiB frame and push its
                            bytes as fast as the daemon takes them but never
                            the last one (reconnecting when closed), and a
                            loop of connects, each sending `version` and
                            reading the answer or refusal. Meanwhile, the
                            daemon's VmRSS every 50 ms: prints its peak, the
                            connections the daemon closed, refusals seen.
Standard library only (requests are encoded by hand).
"""
import os
import select
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rawframe  # noqa: E402  (decode_response, CODES; decoding needs no protoc)
from rawframe import as_uid, connect  # noqa: E402

# Request{id: 1, version {}}: field 1 varint, field 32 (tag 0x82 0x02) empty.
VERSION = b"\x08\x01\x82\x02\x00"
BIG = 16 << 20


def frame(body):
    return struct.pack(">I", len(body)) + body


def send_version(s):
    """Send `version`; a refused connection may be closed before it is sent,
    and its refusal is then read all the same (as gpuctl does)."""
    try:
        s.sendall(frame(VERSION))
    except (BrokenPipeError, ConnectionResetError):
        pass


def read_frame(s, timeout):
    """One Response off s: its decoded fields, "EOF", or None on timeout."""
    buf = b""
    end = time.monotonic() + timeout
    while True:
        if len(buf) >= 4:
            (n,) = struct.unpack(">I", buf[:4])
            if len(buf) >= 4 + n:
                out = rawframe.decode_response(buf[4:4 + n])
                out["codename"] = rawframe.CODES[out["code"]] if 0 <= out["code"] < len(rawframe.CODES) else str(out["code"])
                return out
        left = end - time.monotonic()
        if left <= 0:
            return None
        r, _, _ = select.select([s], [], [], left)
        if not r:
            return None
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            return "EOF"
        buf += chunk


def wait_eof(socks, secs, feed=None):
    """Seconds until each socket sees EOF (None: still open after secs).
    feed(k, s) is called every 0.5 s for each socket still open."""
    t0 = time.monotonic()
    closed = [None] * len(socks)
    next_feed = t0
    while time.monotonic() - t0 < secs and None in closed:
        if feed and time.monotonic() >= next_feed:
            for k, s in enumerate(socks):
                if closed[k] is None:
                    try:
                        feed(k, s)
                    except (BrokenPipeError, ConnectionResetError):
                        closed[k] = time.monotonic() - t0
            next_feed += 0.5
        open_ = [s for k, s in enumerate(socks) if closed[k] is None]
        r, _, _ = select.select(open_, [], [], 0.05)
        for s in r:
            k = socks.index(s)
            try:
                data = s.recv(65536)
            except ConnectionResetError:
                data = b""
            if not data:
                closed[k] = time.monotonic() - t0
    return closed


def in_child(uid, fn, *args):
    """Run fn(*args) as uid in a child; returns its pid."""
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            as_uid(uid)
            fn(*args)
        except Exception as e:  # a child's failure is reported, never silent
            print("error=uid %d: %r" % (uid, e), flush=True)
            code = 1
        finally:
            os._exit(code)
    return pid


def mode_hold(path, flag, specs):
    r, w = os.pipe()
    kids = []
    for spec in specs:
        uid, n = (int(x) for x in spec.split(":"))

        def run(uid=uid, n=n):
            os.close(r)
            try:
                hold_as(uid, n)
            finally:
                os.write(w, b"done\n")

        def hold_as(uid, n):
            socks, ok, refused, msgs = [], 0, 0, []
            for _ in range(n):
                s = connect(path)
                send_version(s)
                f = read_frame(s, 10)
                if isinstance(f, dict) and f["codename"] == "OK" and f["id"] == 1:
                    ok += 1
                    socks.append(s)
                elif isinstance(f, dict) and f["id"] == 0:
                    refused += 1
                    msgs.append("%s: %s" % (f["codename"], f["message"]))
                    if read_frame(s, 10) != "EOF":
                        raise RuntimeError("a refused connection was not closed")
                    s.close()
                else:
                    raise RuntimeError("connection answered %r" % (f,))
            os.write(w, ("uid=%d answered=%d refused=%d\n" % (uid, ok, refused)).encode())
            for m in msgs[:1]:
                os.write(w, ("uid=%d refusal=%s\n" % (uid, m)).encode())
            os.write(w, b"held\n")
            while not os.path.exists(flag):
                time.sleep(0.05)
            # Still served, every one of them, after the others had their turn.
            for s in socks:
                s.sendall(frame(VERSION))
            for s in socks:
                f = read_frame(s, 10)
                if not (isinstance(f, dict) and f["codename"] == "OK"):
                    raise RuntimeError("a held connection answered %r" % (f,))
            os.write(w, ("uid=%d held_served=%d\n" % (uid, len(socks))).encode())

        pid = in_child(uid, run)
        kids.append(pid)
        # One uid at a time, so that the order of the connections is known.
        while True:
            line = b""
            while not line.endswith(b"\n"):
                c = os.read(r, 1)
                if not c:
                    break
                line += c
            if not line or line in (b"held\n", b"done\n"):
                break
            sys.stdout.write(line.decode())
    print("ready=1", flush=True)
    os.close(w)
    with os.fdopen(r) as f:
        sys.stdout.write(f.read().replace("done\n", ""))
    bad = 0
    for pid in kids:
        _, st = os.waitpid(pid, 0)
        bad |= st
    sys.exit(1 if bad else 0)


def mode_trickle(path, uid, n, secs):
    as_uid(uid)
    socks = [connect(path) for _ in range(n)]
    for s in socks:
        s.sendall(struct.pack(">I", 1 << 20))
    closed = wait_eof(socks, secs, feed=lambda k, s: s.send(b"x"))
    done = [t for t in closed if t is not None]
    print("trickle_closed=%d of=%d" % (len(done), n))
    if done:
        print("trickle_after_min=%.2f trickle_after_max=%.2f" % (min(done), max(done)))


def mode_idle(path, uid, n, secs):
    as_uid(uid)
    socks = [connect(path) for _ in range(n)]
    closed = wait_eof(socks, secs)
    done = [t for t in closed if t is not None]
    print("idle_closed=%d of=%d" % (len(done), n))
    if done:
        print("idle_after_min=%.2f idle_after_max=%.2f" % (min(done), max(done)))


def big_pusher(path, secs, report):
    """32 connections announcing 16 MiB frames and pushing all but the last
    byte, reconnecting as the daemon closes them."""
    end = time.monotonic() + secs
    chunk = b"\0" * 65536
    conns = {}  # socket -> bytes of its frame still to send (the last one never)
    made = closed = refused = 0

    def new():
        nonlocal made, refused
        try:
            s = connect(path)
        except OSError:
            return
        s.setblocking(False)
        made += 1
        conns[s] = [struct.pack(">I", BIG), BIG - 1]

    while time.monotonic() < end:
        while len(conns) < 32:
            before = len(conns)
            new()
            if len(conns) == before:
                break
        _, wr, _ = select.select([], list(conns), [], 0.05)
        rd, _, _ = select.select(list(conns), [], [], 0)
        for s in rd:  # a refusal, or the daemon closing: either way the end
            try:
                data = s.recv(65536)
            except OSError:
                data = b""
            if data and struct.unpack(">I", data[:4])[0] < 4096:
                f = rawframe.decode_response(data[4:])
                if f["id"] == 0 and f["code"] == 5:
                    refused += 1
            del conns[s]
            s.close()
            closed += 1
        for s in wr:
            if s not in conns:
                continue
            head, left = conns[s]
            try:
                if head:
                    k = s.send(head)
                    conns[s][0] = head[k:]
                elif left:
                    k = s.send(chunk[:min(left, len(chunk))])
                    conns[s][1] = left - k
            except BlockingIOError:
                pass
            except OSError:
                del conns[s]
                s.close()
                closed += 1
    report("made=%d closed_by_daemon=%d refused=%d" % (made, closed, refused))


def connect_flood(path, secs, report):
    """Connect, send `version`, read the answer or the refusal, hang up; again."""
    end = time.monotonic() + secs
    n = ok = refused = 0
    while time.monotonic() < end:
        try:
            s = connect(path)
            send_version(s)
            f = read_frame(s, 2)
            s.close()
        except OSError:
            continue
        n += 1
        if isinstance(f, dict):
            ok += f["codename"] == "OK"
            refused += f["id"] == 0 and f["codename"] == "RESOURCE_EXHAUSTED"
    report("connects=%d answered=%d refused=%d" % (n, ok, refused))


def rss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def mode_flood(path, dpid, secs, uids):
    r, w = os.pipe()
    kids = []
    for uid in uids:
        for fn in (big_pusher, connect_flood):
            def report(text, uid=uid, fn=fn):
                os.write(w, ("uid=%d %s %s\n" % (uid, fn.__name__, text)).encode())
            kids.append(in_child(uid, fn, path, secs, report))
    os.close(w)
    base = rss_kb(dpid)
    peak = base
    end = time.monotonic() + secs
    while time.monotonic() < end:
        peak = max(peak, rss_kb(dpid))
        time.sleep(0.05)
    bad = 0
    for pid in kids:
        _, st = os.waitpid(pid, 0)
        bad |= st
    with os.fdopen(r) as f:
        sys.stdout.write(f.read())
    print("rss_base_kb=%d rss_peak_kb=%d" % (base, peak))
    sys.exit(1 if bad else 0)


def main():
    mode, path = sys.argv[1], sys.argv[2]
    a = sys.argv[3:]
    if mode == "hold":
        mode_hold(path, a[0], a[1:])
    elif mode == "trickle":
        mode_trickle(path, int(a[0]), int(a[1]), float(a[2]))
    elif mode == "idle":
        mode_idle(path, int(a[0]), int(a[1]), float(a[2]))
    elif mode == "flood":
        mode_flood(path, int(a[0]), float(a[1]), [int(u) for u in a[2:]])
    else:
        sys.exit("unknown mode " + mode)


if __name__ == "__main__":
    main()
