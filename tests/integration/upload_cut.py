"""upload_cut.py SOCKET NAME: start a dataset upload, send half of it and
hang up, as a client that crashed would. Standard library only: the
Request is encoded by hand (UploadDatasetRequest is field 19)."""
import socket
import struct
import sys


def varint(v):
    out = b""
    while True:
        b = v & 0x7F
        v >>= 7
        out += bytes([b | (0x80 if v else 0)])
        if not v:
            return out


def field(num, wt, payload):
    key = varint(num << 3 | wt)
    if wt == 2:
        return key + varint(len(payload)) + payload
    return key + payload


name = sys.argv[2].encode()
upload = field(1, 2, name) + field(3, 2, b"\x00" * 4096) + field(5, 0, varint(8192))
req = field(1, 0, varint(1)) + field(19, 2, upload)
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
s.sendall(struct.pack(">I", len(req)) + req)
n = struct.unpack(">I", s.recv(4))[0]
s.recv(n)
s.close()  # the second half never comes
print("sent 4096 of 8192 bytes and hung up")
