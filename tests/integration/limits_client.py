"""limits_client.py MODE SOCKET ...: clients that push gpushared to its limits.

Modes (each prints key=value lines that test_limits.sh checks; a line
"error=..." and exit 1 when the daemon did something no limit explains):
  conns SOCK PID N MAX  N clients connect at once and each sends `version`:
                        how many are answered while all N stay connected (the
                        first MAX, then 1.5 s more for any beyond),
                        the daemon's descriptor count before and at the peak,
                        and whether the waiting ones are served (none refused)
                        once the first ones hang up
  pipeline SOCK N       N `version` requests in one write on one connection,
                        then every answer, in order
  inflight SOCK UID JOB four watches of JOB on one connection, then a `version`
                        behind them: answered before or after JOB's watches
                        end (a second connection cancels JOB)
  idle SOCK UID JOB     a connection that sends nothing, beside one watching
                        JOB: seconds until each is closed (the watch: after JOB
                        is cancelled and its final event sent)
  frame SOCK SIZE [--hold FILE]  a `version` request padded to SIZE bytes with an
                        unknown field; with --hold, on a connection opened (and
                        used once) before FILE appears
Times are measured, not asserted here: the test allows wide margins.
Standard library and protoc only (through rawframe.py).
"""
import os
import select
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rawframe  # noqa: E402  (encode_text, varint, read_varint, CODES)
from rawframe import as_uid, connect  # noqa: E402


def req(text):
    body = rawframe.encode_text("Request", text)
    return struct.pack(">I", len(body)) + body


class Reader:
    """Frames off one socket, with a deadline per call."""

    def __init__(self, s):
        self.s, self.buf, self.eof = s, b"", False

    def frame(self, timeout):
        end = time.monotonic() + timeout
        while True:
            if len(self.buf) >= 4:
                (n,) = struct.unpack(">I", self.buf[:4])
                if len(self.buf) >= 4 + n:
                    body, self.buf = self.buf[4:4 + n], self.buf[4 + n:]
                    return decode(body)
            if self.eof:
                return "EOF"
            left = end - time.monotonic()
            if left <= 0:
                return None
            r, _, _ = select.select([self.s], [], [], left)
            if not r:
                return None
            try:
                chunk = self.s.recv(1 << 20)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                self.eof = True
            self.buf += chunk


def decode(body):
    """rawframe's decoding, with the status code's name."""
    out = rawframe.decode_response(body)
    out["codename"] = rawframe.CODES[out["code"]] if 0 <= out["code"] < len(rawframe.CODES) else str(out["code"])
    return out


def fds(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


def mode_conns(path, pid, n, limit):
    base = fds(pid)
    socks = []
    for _ in range(n):
        s = connect(path)  # must not be refused: the kernel's queue holds it
        s.sendall(req("id: 1 version {}"))
        socks.append(s)
    readers = [Reader(s) for s in socks]
    answered = set()

    def poll(deadline, want):
        while len(answered) < want and time.monotonic() < deadline:
            for k, r in enumerate(readers):
                if k in answered or r is None:
                    continue
                f = r.frame(0.05)
                if f == "EOF":
                    print("error=connection %d closed without an answer" % k)
                    sys.exit(1)
                if f is not None:
                    if f["codename"] != "OK":
                        print("error=connection %d answered %s: %s" % (k, f["codename"], f["message"]))
                        sys.exit(1)
                    answered.add(k)

    poll(time.monotonic() + 30, limit)
    poll(time.monotonic() + 1.5, n)  # one past the limit would be a bug
    first = len(answered)
    peak = fds(pid)
    print("answered_first=%d" % first)
    print("fds_base=%d fds_peak=%d" % (base, peak))
    # Hang up the ones served, again and again: each closing lets one
    # waiting client in.
    closed = set()
    deadline = time.monotonic() + 30
    while len(answered) < n and time.monotonic() < deadline:
        for k in sorted(answered - closed):
            socks[k].close()
            readers[k] = None
            closed.add(k)
        poll(min(deadline, time.monotonic() + 0.5), n)
    print("answered_total=%d" % len(answered))
    for s in socks:
        s.close()


def mode_pipeline(path, n):
    s = connect(path)
    s.sendall(b"".join(req("id: %d version {}" % (k + 1)) for k in range(n)))
    r = Reader(s)
    ids = []
    for _ in range(n):
        f = r.frame(30)
        if f is None or f == "EOF":
            break
        ids.append(f["id"])
    print("answers=%d in_order=%d" % (len(ids), int(ids == list(range(1, n + 1)))))


def mode_inflight(path, uid, job):
    as_uid(uid)
    s = connect(path)
    r = Reader(s)
    s.sendall(b"".join(req("id: %d watch { id: %d }" % (k, job)) for k in (1, 2, 3, 4)))
    started = 0
    while started < 4:
        f = r.frame(30)
        if f is None or f == "EOF" or f["result"] != 26 or f["codename"] != "OK":
            print("error=watch did not start: %r" % (f,))
            sys.exit(1)
        started += 1
    s.sendall(req("id: 5 version {}"))
    f = r.frame(1.5)  # at max_inflight (4 watches): the daemon must not read it yet
    early = f is not None and f != "EOF" and f["id"] == 5
    print("version_before_watches_end=%d" % int(early))
    c = connect(path)
    c.sendall(req("id: 1 cancel { id: %d }" % job))
    cf = Reader(c).frame(30)
    print("cancel=%s" % (cf["codename"] if isinstance(cf, dict) else cf))
    c.close()
    order = []
    while True:
        f = r.frame(30)
        if f is None or f == "EOF":
            break
        if f["result"] == 26:
            if f["final"]:
                order.append("final%d" % f["id"])
        else:
            order.append("answer%d" % f["id"])
            if f["id"] == 5:
                break
    print("order=%s" % ",".join(order))
    s.close()


def mode_idle(path, uid, job):
    as_uid(uid)
    t0 = time.monotonic()
    quiet = connect(path)
    w = connect(path)
    wr = Reader(w)
    w.sendall(req("id: 1 watch { id: %d }" % job))
    f = wr.frame(30)
    if not isinstance(f, dict) or f["result"] != 26:
        print("error=watch did not start: %r" % (f,))
        sys.exit(1)
    qr = Reader(quiet)
    f = qr.frame(30)
    print("idle_closed_after=%.1f" % (time.monotonic() - t0) if f == "EOF" else "idle_closed_after=never")
    # The watcher: still open? (events may have come meanwhile)
    while True:
        f = wr.frame(0.2)
        if f is None or f == "EOF":
            break
    print("watch_open_after_idle=%d" % int(f is None))
    c = connect(path)
    c.sendall(req("id: 1 cancel { id: %d }" % job))
    Reader(c).frame(30)
    c.close()
    tf = None
    while True:
        f = wr.frame(30)
        if f is None:
            print("watch_closed_after_final=never")
            return
        if f == "EOF":
            break
        if f["final"]:
            tf = time.monotonic()
    print("watch_closed_after_final=%.1f" % (time.monotonic() - tf) if tf else "watch_closed_after_final=nofinal")


def mode_frame(path, size, hold):
    base = rawframe.encode_text("Request", "id: 7 version {}")
    key = rawframe.varint((1000 << 3) | 2)  # an unknown length-delimited field
    pad = size - len(base) - len(key)
    pad -= len(rawframe.varint(pad))
    body = base + key + rawframe.varint(pad) + b"\0" * pad
    s = connect(path)
    r = Reader(s)
    if hold:
        s.sendall(req("id: 6 version {}"))
        r.frame(30)
        while not os.path.exists(hold):
            time.sleep(0.05)
    try:
        s.sendall(struct.pack(">I", len(body)) + body)
    except (BrokenPipeError, ConnectionResetError):
        print("frame=CLOSED bytes=%d" % len(body))
        return
    f = r.frame(30)
    if isinstance(f, dict):
        print("frame=%s id=%d bytes=%d" % (f["codename"], f["id"], len(body)))
    else:
        print("frame=%s bytes=%d" % ("CLOSED" if f == "EOF" else "SILENT", len(body)))


def main():
    mode, path = sys.argv[1], sys.argv[2]
    a = sys.argv[3:]
    if mode == "conns":
        mode_conns(path, int(a[0]), int(a[1]), int(a[2]))
    elif mode == "pipeline":
        mode_pipeline(path, int(a[0]))
    elif mode == "inflight":
        mode_inflight(path, int(a[0]), int(a[1]))
    elif mode == "idle":
        mode_idle(path, int(a[0]), int(a[1]))
    elif mode == "frame":
        mode_frame(path, int(a[0]), a[2] if len(a) > 2 and a[1] == "--hold" else None)
    else:
        sys.exit("unknown mode " + mode)


if __name__ == "__main__":
    main()
