"""garbage.py SOCKET: hostile bytes on the control socket.

1000 frames whose bodies are random bytes, then a 2 GiB length prefix on a
second connection, while a third connection keeps asking for the version.
Each garbage frame must be answered (INVALID_ARGUMENT, code 1) without the
connection dropping; the 2 GiB prefix must close its connection without the
daemon reading or allocating the body; the bystander must be served
throughout. Exits 0 when all of that held. Standard library only: the
responses are parsed just far enough to read field 2 (the code).
"""
import os
import random
import socket
import struct
import sys

path = sys.argv[1]
rng = random.Random(1234)


def connect():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(path)
    return s


def recv_exact(s, n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise EOFError("connection closed after %d of %d bytes" % (len(buf), n))
        buf += chunk
    return buf


def read_frame(s):
    (n,) = struct.unpack(">I", recv_exact(s, 4))
    return recv_exact(s, n)


def varint(b, i):
    v = shift = 0
    while True:
        c = b[i]
        i += 1
        v |= (c & 0x7F) << shift
        shift += 7
        if not c & 0x80:
            return v, i


def response_code(body):
    """Field 2 of gpushare.v1.Response (a varint); 0 when absent."""
    i = 0
    while i < len(body):
        key, i = varint(body, i)
        field, wt = key >> 3, key & 7
        if wt == 0:
            v, i = varint(body, i)
            if field == 2:
                return v
        elif wt == 2:
            n, i = varint(body, i)
            i += n
        elif wt == 1:
            i += 8
        elif wt == 5:
            i += 4
        else:
            return -1
    return 0


VERSION_REQUEST = bytes([0x08, 0x07, 0x82, 0x02, 0x00])  # id=7, version {}

def bystander_ok(s):
    s.sendall(struct.pack(">I", len(VERSION_REQUEST)) + VERSION_REQUEST)
    return response_code(read_frame(s)) == 0


by = connect()
assert bystander_ok(by), "bystander not served before the garbage"

g = connect()
answered = bad_codes = 0
for k in range(1000):
    # Mostly random bytes; some truncated varints and absurd field numbers.
    body = bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 200)))
    if k % 10 == 0:
        body = b"\xff" * rng.randint(1, 12)
    g.sendall(struct.pack(">I", len(body)) + body)
    code = response_code(read_frame(g))
    answered += 1
    if code == 0:
        # Random bytes can by chance parse as a Request with no call: that
        # is still answered with INVALID_ARGUMENT, never OK.
        bad_codes += 1
    if k % 100 == 0 and not bystander_ok(by):
        sys.exit("bystander refused during garbage at frame %d" % k)
print("garbage frames answered: %d, answered OK (wrongly): %d" % (answered, bad_codes))
if bad_codes:
    sys.exit("garbage was answered with OK")

big = connect()
big.sendall(struct.pack(">I", 2 * 1024 * 1024 * 1024) + b"x" * 1024)
try:
    data = big.recv(4096)
    closed = data == b""
except (ConnectionResetError, BrokenPipeError):
    closed = True
print("2 GiB length prefix: connection closed = %s" % closed)
if not closed:
    sys.exit("a 2 GiB length prefix did not close the connection")

# Raw garbage (no framing at all) closes just that connection as well.
raw = connect()
raw.sendall(os.urandom(64) + b"\xff\xff\xff\xff")
try:
    while raw.recv(4096):
        pass
except (ConnectionResetError, BrokenPipeError):
    pass

assert bystander_ok(by), "bystander not served after the garbage"
fresh = connect()
assert bystander_ok(fresh), "a new client not served after the garbage"
print("daemon kept serving others")
