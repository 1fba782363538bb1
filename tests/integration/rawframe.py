"""rawframe.py SOCKET [OPTIONS]: one connection, frames as raw as a test needs.

The body of each frame is built from, in order:
  --text 'TXT'     a gpushare.v1.Request in protobuf text format (protoc --encode)
  --hex HEX        raw bytes, appended (a malformed tail, a whole garbage body)
  --spec FILE      a binary JobSpec, wrapped as Request{id: --id, submit{spec}}
and sent --repeat times (default 1). The framing can be bent:
  --len N          the length prefix to send instead of the body's length
  --cut K          send only the first K body bytes, then shut down writing
  --as-uid U       (needs root) connect as uid U, gid 65534, no other groups
Then every answer is printed, one line each:
  id=I code=NAME field=F result=N message=TEXT
or CLOSED when the daemon closed the connection without (further) answers,
or SILENT when nothing came within --wait seconds (default 5). The daemon's
Responses are decoded by hand (fields 1-4 and the result's field number),
so this needs the standard library and protoc only.
"""
import argparse
import os
import socket
import struct
import subprocess
import sys

CODES = ["OK", "INVALID_ARGUMENT", "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED",
         "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "UNAVAILABLE", "INTERNAL"]
PROTO = os.environ.get("GS_PROTO_DIR") or os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                       "..", "..", "proto")


def varint(v):
    out = b""
    while True:
        b = v & 0x7F
        v >>= 7
        out += bytes([b | (0x80 if v else 0)])
        if not v:
            return out


def read_varint(b, i):
    v = shift = 0
    while True:
        c = b[i]
        i += 1
        v |= (c & 0x7F) << shift
        shift += 7
        if not c & 0x80:
            return v, i


def encode_text(msg_type, text):
    p = subprocess.run(["protoc", "--encode=gpushare.v1." + msg_type, "--proto_path=" + PROTO,
                        "gpushare.proto"], input=text.encode(), capture_output=True)
    if p.returncode:
        sys.exit("protoc --encode failed: " + p.stderr.decode())
    return p.stdout


def watch_final(data):
    """A WatchResponse's `final` (field 2, varint)."""
    j = 0
    while j < len(data):
        k, j = read_varint(data, j)
        if k & 7 == 0:
            v, j = read_varint(data, j)
            if k >> 3 == 2:
                return bool(v)
        elif k & 7 == 2:
            m, j = read_varint(data, j)
            j += m
        else:
            break
    return False


def decode_response(body):
    """id, code, field, message, the result's field number, a watch's final flag."""
    out = {"id": 0, "code": 0, "field": "", "message": "", "result": 0, "final": False}
    i = 0
    while i < len(body):
        key, i = read_varint(body, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = read_varint(body, i)
            if num == 1:
                out["id"] = v
            elif num == 2:
                out["code"] = v
        elif wt == 2:
            n, i = read_varint(body, i)
            data = body[i:i + n]
            i += n
            if num == 3:
                out["message"] = data.decode("utf-8", "replace")
            elif num == 4:
                out["field"] = data.decode("utf-8", "replace")
            elif num >= 10:
                out["result"] = num
                if num == 26:  # WatchResponse
                    out["final"] = watch_final(data)
        elif wt == 1:
            i += 8
        elif wt == 5:
            i += 4
        else:
            return {"id": -1, "code": -1, "field": "", "message": "undecodable answer", "result": 0}
    return out


def as_uid(uid):
    """Drop to uid (gid and groups nogroup) for the rest of the process;
    None stays who we are."""
    if uid is not None:
        os.setgroups([])
        os.setgid(65534)
        os.setuid(uid)


def connect(path):
    """A connected Unix stream socket to the daemon at path."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    return s


def recv_exact(s, n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("socket")
    ap.add_argument("--text")
    ap.add_argument("--hex", default="")
    ap.add_argument("--spec")
    ap.add_argument("--id", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--len", type=int)
    ap.add_argument("--cut", type=int)
    ap.add_argument("--wait", type=float, default=5.0)
    ap.add_argument("--answers", type=int, help="stop after this many answers")
    ap.add_argument("--as-uid", type=int)
    a = ap.parse_args()

    body = b""
    if a.text is not None:
        body += encode_text("Request", a.text)
    body += bytes.fromhex(a.hex)
    if a.spec:
        with open(a.spec, "rb") as f:
            spec = f.read()
        sub = b"\x0a" + varint(len(spec)) + spec                   # SubmitRequest.spec = 1
        body += b"\x08" + varint(a.id) + b"\xba\x01" + varint(len(sub)) + sub  # Request.submit = 23

    if a.as_uid is not None:
        os.setgroups([])
        os.setgid(65534)
        os.setuid(a.as_uid)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(a.wait)
    s.connect(a.socket)
    length = len(body) if a.len is None else a.len
    sent_body = body if a.cut is None else body[:a.cut]
    try:
        for _ in range(a.repeat):
            s.sendall(struct.pack(">I", length) + sent_body)
        if a.cut is not None:
            s.shutdown(socket.SHUT_WR)
    except (BrokenPipeError, ConnectionResetError):
        print("CLOSED")
        return
    want = a.answers if a.answers is not None else (a.repeat if a.cut is None else 1)
    got = 0
    while got < want:
        try:
            hdr = recv_exact(s, 4)
            if hdr is None:
                print("CLOSED")
                return
            (n,) = struct.unpack(">I", hdr)
            data = recv_exact(s, n)
            if data is None:
                print("CLOSED")
                return
        except socket.timeout:
            print("SILENT")
            return
        except ConnectionResetError:
            print("CLOSED")
            return
        r = decode_response(data)
        code = CODES[r["code"]] if 0 <= r["code"] < len(CODES) else str(r["code"])
        print("id=%d code=%s field=%s result=%d message=%s" % (r["id"], code, r["field"],
                                                               r["result"], r["message"]))
        got += 1
    # After the answers we wanted: did the daemon keep the connection open?
    s.settimeout(0.3)
    try:
        extra = s.recv(1)
        print("CLOSED" if extra == b"" else "MORE")
    except socket.timeout:
        print("OPEN")
    except ConnectionResetError:
        print("CLOSED")


if __name__ == "__main__":
    main()
