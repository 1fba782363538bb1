"""gpushare.client: a connection to gpushared and a method per call.

The wire is docs/protocol.md's: every message one frame, a 4-byte
big-endian length and a serialized gpushare.v1.Request (Response from the
daemon), at most 16 MiB. The socket is blocking: a script has nothing else
to do while it waits. Request ids count up from 1 per connection and
answers are matched by id, never by order: an answer that arrives for
another call still in flight (a watch's events while a status is asked on
the same connection) is kept until that call reads it. An answer with id 0
is the daemon's refusal of the connection (over a connection limit),
written as it accepts; it answers whatever was sent and raises.

Datasets go up and weights come down in 1 MiB chunks, as gpuctl sends
them. submit() and plan() resolve a spec's datasets as gpuctl does
(client/cmd_dataset.c): a dataset path (idx and npy images and labels, text
and tokens path) that is a local file is hashed and named "sha256:HEX";
submit also uploads it, as its format and under its base name, unless the
tenant's store already holds those bytes.
"""
import datetime
import hashlib
import os
import socket
import struct
import tempfile

from ._proto import pb
from .errors import Error, Internal, InvalidArgument, ResourceExhausted, Unavailable, error_for
from .spec import as_job_spec, fill

DEFAULT_SOCKET = "/run/gpushared.sock"
MAX_FRAME = 16 << 20   # the largest frame body either side sends
CHUNK = 1 << 20        # bytes of data per upload or fetch chunk

# The Response.result field answering each Request.call: the same name,
# but for plan.
_RESULT = {"plan": "plan_result"}


def default_socket():
    """$GPUSHARE_SOCKET if set and not empty, else /run/gpushared.sock (as gpuctl)."""
    return os.environ.get("GPUSHARE_SOCKET") or DEFAULT_SOCKET


def parse_size(value, field):
    """Bytes from an int or a size as gpuctl takes it: "256MiB", "1.5GiB",
    "64M" (powers of 1024), "100MB" (powers of 1000), "4096"."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise InvalidArgument(f"{field} {value!r} is not a size: an int of bytes or a string like \"256MiB\"",
                              field)
    if isinstance(value, int):
        if value < 0:
            raise InvalidArgument(f"{field} {value} is negative; a size is a number of bytes", field)
        return value
    s = value.strip()
    num = s.rstrip("kKmMgGtTpPeEiIbB ")
    suffix = s[len(num):].strip()
    mult = None
    if suffix in ("", "b", "B"):
        mult = 1
    elif suffix[0].lower() in "kmgtpe":
        power = "kmgtpe".index(suffix[0].lower()) + 1
        rest = suffix[1:].lower()
        if rest in ("", "ib"):
            mult = 1024 ** power
        elif rest == "b":
            mult = 1000 ** power
    allowed = ("a whole number of bytes, or a number with a suffix: KiB MiB GiB TiB PiB EiB or K M G T P E "
               "(powers of 1024), kB MB GB TB PB EB (powers of 1000), B")
    try:
        n = float(num) if "." in num else int(num)
    except ValueError:
        n = None
    if mult is None or n is None or n < 0 or (mult == 1 and isinstance(n, float)):
        raise InvalidArgument(f"{field} {value!r} is not a size; expected {allowed}", field)
    return int(n * mult)


def _job_id(job, field):
    """A job id from an int, a Job (its id) or a JobEvent (its job_id)."""
    if isinstance(job, int) and not isinstance(job, bool):
        jid = job
    elif hasattr(job, "job_id") and not hasattr(job, "tenant"):
        jid = job.job_id
    elif hasattr(job, "id"):
        jid = job.id
    else:
        raise InvalidArgument(f"{field}: {job!r} is not a job: give its id or a gpushare.v1.Job", field)
    if not 1 <= jid < 1 << 64:
        raise InvalidArgument(f"{field} {jid} is out of range: job ids are from 1", field)
    return jid


def _unix_day(since, field):
    """Unix seconds from an int, a datetime or date (a date is its UTC day),
    or "YYYY-MM-DD" (a UTC day)."""
    if since is None or (isinstance(since, int) and not isinstance(since, bool)):
        return since
    if isinstance(since, str):
        try:
            since = datetime.date.fromisoformat(since)
        except ValueError:
            raise InvalidArgument(f"{field} {since!r} is not a date; expected YYYY-MM-DD (a UTC day)",
                                  field) from None
    if isinstance(since, datetime.datetime):
        if since.tzinfo is None:
            since = since.replace(tzinfo=datetime.timezone.utc)
        return int(since.timestamp())
    if isinstance(since, datetime.date):
        return int(datetime.datetime(since.year, since.month, since.day,
                                     tzinfo=datetime.timezone.utc).timestamp())
    raise InvalidArgument(f"{field} {since!r} is not a time: unix seconds, a date or \"YYYY-MM-DD\"", field)


def _sha256_file(path, field):
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(CHUNK), b""):
                h.update(block)
    except OSError as e:
        raise InvalidArgument(f"cannot read {path}: {e.strerror}", field) from None
    return h.hexdigest()


# upload_dataset's format words, as gpuctl dataset add --format takes them.
_FORMATS = {"idx": pb.DATASET_FORMAT_IDX, "npy": pb.DATASET_FORMAT_NPY,
            "text": pb.DATASET_FORMAT_TEXT, "tokens": pb.DATASET_FORMAT_TOKENS_U16}


def _slots(d):
    """The file references of a Dataset: (message, attribute, field, format,
    vocab_size) for each."""
    kind = d.WhichOneof("source")
    if kind in ("idx", "npy"):
        m = getattr(d, kind)
        return [(m, a, f"{kind}.{a}", _FORMATS[kind], None) for a in ("images", "labels")]
    if kind == "text":
        return [(d.text, "path", "text.path", pb.DATASET_FORMAT_TEXT, None)]
    if kind == "tokens":
        return [(d.tokens, "path", "tokens.path", pb.DATASET_FORMAT_TOKENS_U16, d.tokens.vocab_size)]
    return []


def _is_upload(path):
    """Is a dataset reference a local file to upload? Not "sha256:..."; a bare
    name that is no file here is one of the tenant's datasets (the daemon
    looks it up); "./NAME" always means the file (as gpuctl)."""
    if not path or path.startswith("sha256:"):
        return False
    return os.path.exists(path) or "/" in path


class Client:
    """A connection to gpushared. Use it as a context manager, or close() it.
    One thread at a time: give each thread its own Client.

    Every method makes one call (upload_dataset and fetch a chunked series)
    and returns the answer's message; a refusal raises gpushare.Error (the
    subclass named for its code) with .code, .message and .field.
    """

    def __init__(self, socket_path=None, timeout=None):
        self.socket_path = os.fspath(socket_path) if socket_path else default_socket()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout)
        try:
            self._sock.connect(self.socket_path)
        except OSError as e:
            self._sock.close()
            raise Unavailable(f"cannot connect to {self.socket_path}: {e.strerror or e}") from None
        self._next_id = 1
        self._inflight = set()   # ids sent whose last answer has not been read
        self._pending = {}       # id -> answers read while waiting for another id
        self._abandoned = set()  # watches left before their final event

    # ---------------------------------------------------------- plumbing ---

    def close(self):
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _recv_exact(self, n):
        buf = bytearray()
        while len(buf) < n:
            try:
                chunk = self._sock.recv(n - len(buf))
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                raise Unavailable(f"gpushared at {self.socket_path} closed the connection"
                                  + (" in the middle of a response" if buf else ""))
            buf += chunk
        return bytes(buf)

    def _read_frame(self):
        (length,) = struct.unpack(">I", self._recv_exact(4))
        if length > MAX_FRAME:
            raise Internal(f"gpushared at {self.socket_path} announced a response of {length} bytes, "
                           f"over the {MAX_FRAME}-byte frame limit", "frame")
        resp = pb.Response()
        try:
            resp.ParseFromString(self._recv_exact(length))
        except Exception as e:  # DecodeError, or the C implementation's own
            raise Internal(f"gpushared at {self.socket_path} sent a frame that is not a "
                           f"gpushare.v1.Response: {e}", "frame") from None
        return resp

    def _refusal(self, resp):
        return resp.id == 0 and resp.code != pb.OK

    def _raise(self, resp):
        raise error_for(resp.code, resp.message or "(the daemon gave no reason)", resp.field,
                        resp.plan if resp.HasField("plan") else None)

    def _send(self, req):
        if self._sock is None:
            raise Unavailable("the connection is closed")
        rid = self._next_id
        self._next_id += 1
        req.id = rid
        body = req.SerializeToString()
        if len(body) > MAX_FRAME:
            raise InvalidArgument(f"the request is {len(body)} bytes, larger than the {MAX_FRAME}-byte "
                                  "frame limit", req.WhichOneof("call") or "")
        try:
            self._sock.sendall(struct.pack(">I", len(body)) + body)
        except (BrokenPipeError, ConnectionResetError) as e:
            # Closed by the daemon: a refusal it wrote first is still there to read.
            try:
                resp = self._read_frame()
            except Error:
                resp = None
            if resp is not None and self._refusal(resp):
                self._raise(resp)
            raise Unavailable(f"lost the connection to {self.socket_path} while sending: {e.strerror}") \
                from None
        self._inflight.add(rid)
        return rid

    def _recv(self, rid):
        """The next answer to request rid (kept answers first)."""
        queue = self._pending.get(rid)
        if queue:
            return queue.pop(0)
        while True:
            resp = self._read_frame()
            if self._refusal(resp):
                self._raise(resp)
            if resp.id == rid:
                return resp
            if resp.id in self._abandoned:
                if resp.code != pb.OK or resp.watch.final:
                    self._abandoned.discard(resp.id)
                continue
            if resp.id not in self._inflight:
                raise Internal(f"gpushared answered request {resp.id}, which no call on this connection "
                               f"is waiting for (waiting for {rid})", "id")
            self._pending.setdefault(resp.id, []).append(resp)

    def _done(self, rid):
        self._inflight.discard(rid)
        self._pending.pop(rid, None)

    def request(self, req):
        """Send a gpushare.v1.Request (its id is set here) and return the
        Response whatever its code: the escape hatch for a call as it is on
        the wire. Watch with watch(): of a watch this returns the first
        answer, and the stream's later events are read and dropped."""
        rid = self._send(req)
        resp = None
        try:
            resp = self._recv(rid)
            return resp
        finally:
            self._done(rid)
            if (req.WhichOneof("call") == "watch" and resp is not None and resp.code == pb.OK
                    and not resp.watch.final):
                self._abandoned.add(rid)

    def _call(self, call, msg=None, **fields):
        """Make call (a Request.call name) with its request message (or the
        fields to set in one) and return the result message; raise on a
        refusal."""
        req = pb.Request()
        sub = getattr(req, call)
        sub.SetInParent()  # an empty message still selects the call
        if msg is not None:
            sub.CopyFrom(msg)
        fill(sub, f"{call}.", **fields)
        resp = self.request(req)
        if resp.code != pb.OK:
            self._raise(resp)
        want = _RESULT.get(call, call)
        got = resp.WhichOneof("result")
        if got != want:
            raise Internal(f"gpushared answered a {call} call with {got or 'no result'}, not {want}", call)
        return getattr(resp, want)

    # ----------------------------------------------------------- anyone ---

    def version(self):
        """VersionResponse: the daemon's version and who it takes you for
        (uid, admin, tenant)."""
        return self._call("version")

    def list_devices(self):
        """[Device]: the devices and what is allocated on them."""
        return list(self._call("list_devices").device)

    # ----------------------------------------------------------- admins ---

    def create_tenant(self, name, uids=(), gids=(), quota=None, **quota_fields):
        """Tenant: a new tenant whose members are uids and gids; quota a
        Quota, a dict, or its fields as keywords (memory_bytes="8GiB",
        compute_share, max_running, max_queued)."""
        q = self._quota(quota, quota_fields, "create_tenant.quota")
        return self._call("create_tenant", name=name, uids=list(uids), gids=list(gids), quota=q).tenant

    def list_tenants(self):
        return list(self._call("list_tenants").tenant)

    def delete_tenant(self, name):
        self._call("delete_tenant", name=name)

    def _quota(self, quota, fields, path):
        if quota is None and not fields:
            return None
        q = pb.Quota()
        if isinstance(quota, dict):
            fields = {**quota, **fields}
        elif quota is not None:
            q.CopyFrom(quota)
        if fields.get("memory_bytes") is not None:
            fields["memory_bytes"] = parse_size(fields["memory_bytes"], f"{path}.memory_bytes")
        return fill(q, f"{path}.", **fields)

    def set_quota(self, tenant, quota=None, **quota_fields):
        """Tenant: change the quota fields given (the others are kept)."""
        q = self._quota(quota, quota_fields, "set_quota.quota")
        return self._call("set_quota", tenant=tenant, quota=q if q is not None else pb.Quota()).tenant

    def get_quota(self, tenant=None):
        """Tenant with its quota and what it holds (a member: its own)."""
        return self._call("get_quota", tenant=tenant).tenant

    def create_vdev(self, name, memory_limit, tenant, device=None, compute_share=None, policy=None):
        """Vdev: a vdev of memory_limit bytes (or "256MiB") on device
        (default "cpu") for tenant; policy "preallocate" (default) or "growth"."""
        return self._call("create_vdev", name=name, tenant=tenant, device=device,
                          memory_limit=parse_size(memory_limit, "create_vdev.memory_limit"),
                          compute_share=compute_share, policy=policy).vdev

    def list_vdevs(self):
        return list(self._call("list_vdevs").vdev)

    def update_vdev(self, name, memory_limit=None, compute_share=None, policy=None):
        """UpdateVdevResponse: change the fields given while the vdev's jobs
        run; .vdev as changed, .action a line per running job that had to
        stop for a smaller limit."""
        if memory_limit is not None:
            memory_limit = parse_size(memory_limit, "update_vdev.memory_limit")
        return self._call("update_vdev", name=name, memory_limit=memory_limit, compute_share=compute_share,
                          policy=policy)

    set_vdev = update_vdev  # as gpuctl vdev set

    def delete_vdev(self, name):
        self._call("delete_vdev", name=name)

    def metrics(self):
        """The daemon's metrics in Prometheus text format."""
        return self._call("metrics").text

    # ---------------------------------------------------------- datasets ---

    def upload_dataset(self, name, source, format=None, vocab_size=None):
        """DatasetInfo: upload source (bytes, or a file path) as the tenant's
        dataset name, in 1 MiB chunks with the SHA-256 checked at commit.
        format: "idx", "npy", "text" or "tokens" (with vocab_size), or a
        pb.DatasetFormat, what the daemon checks the file as; default npy
        for bytes that start as a .npy file does, else idx."""
        if isinstance(source, (bytes, bytearray, memoryview)):
            data = memoryview(source).cast("B")
            size = len(data)
            fmt = self._format(format, bytes(data[:6]))
            chunks = (data[i:i + CHUNK] for i in range(0, max(size, 1), CHUNK))
            return self._upload(name, size, chunks, fmt, vocab_size)
        path = os.fspath(source)
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                fmt = self._format(format, f.read(6))
                f.seek(0)
                return self._upload(name, size, iter(lambda: f.read(CHUNK), b""), fmt, vocab_size)
        except OSError as e:
            raise InvalidArgument(f"cannot read {path}: {e.strerror}", "upload_dataset.data") from None

    @staticmethod
    def _format(format, head):
        if format is None:
            return pb.DATASET_FORMAT_NPY if head == b"\x93NUMPY" else pb.DATASET_FORMAT_IDX
        if isinstance(format, str):
            if format not in _FORMATS:
                raise InvalidArgument(f"format {format!r} is no dataset format: idx, npy, text or tokens",
                                      "upload_dataset.format")
            return _FORMATS[format]
        return format

    def _upload(self, name, size, chunks, fmt=pb.DATASET_FORMAT_IDX, vocab_size=None):
        h = hashlib.sha256()
        upload_id, sent = 0, 0
        chunks = iter(chunks)
        nxt = next(chunks, b"")
        first = True
        while True:
            data, nxt = nxt, next(chunks, None)
            h.update(data)
            sent += len(data)
            last = nxt is None
            up = pb.UploadDatasetRequest(data=bytes(data))
            if first:
                up.name = name
                up.total_bytes = size
                if fmt != pb.DATASET_FORMAT_IDX:  # an older daemon knows no format
                    up.format = fmt
                if vocab_size is not None:
                    up.vocab_size = vocab_size
            else:
                up.upload_id = upload_id
            if last:
                up.commit = True
                up.sha256 = h.hexdigest()
            res = self._call("upload_dataset", up)
            if first:
                upload_id = res.upload_id
                first = False
            if last:
                return res.dataset

    def list_datasets(self):
        return list(self._call("list_datasets").dataset)

    def remove_dataset(self, name):
        self._call("remove_dataset", name=name)

    delete_dataset = remove_dataset

    def _resolve(self, spec, call, upload):
        """Rewrite the spec's local dataset paths to "sha256:HEX", uploading
        what the store lacks when upload is true (as gpuctl submit)."""
        have = None
        for which in ("train", "test"):
            if not spec.HasField(which):
                continue
            for msg, attr, name, fmt, vocab in _slots(getattr(spec, which)):
                path = getattr(msg, attr)
                if not _is_upload(path):
                    continue
                field = f"{call}.spec.{which}.{name}"
                hexd = _sha256_file(path, field)
                if upload:
                    if have is None:
                        have = {ds.sha256.lower() for ds in self.list_datasets()}
                    if hexd not in have:
                        hexd = self._upload_as(path, hexd, field, fmt, vocab)
                        have.add(hexd)
                setattr(msg, attr, "sha256:" + hexd)

    def _upload_as(self, path, hexd, field, fmt=pb.DATASET_FORMAT_IDX, vocab=None):
        base = os.path.basename(path)
        try:
            return self.upload_dataset(base, path, fmt, vocab).sha256 or hexd
        except Error as e:
            if e.code != pb.ALREADY_EXISTS:
                e.message = f"{field}: could not upload {path}: {e.message}"
                raise
        try:  # that name holds other bytes: name these by their hash too
            return self.upload_dataset(f"{base}-{hexd[:12]}", path, fmt, vocab).sha256 or hexd
        except Error as e:
            if e.code == pb.ALREADY_EXISTS:  # same bytes, same name
                return hexd
            e.message = f"{field}: could not upload {path}: {e.message}"
            raise

    # -------------------------------------------------------------- jobs ---

    def plan(self, spec, vdev=None):
        """Plan: the memory a job needs, by layer and role; with vdev, planned
        against its limit (.fits). A job that does not fit is a Plan with
        fits false, not an exception. spec as for submit; local dataset files
        are hashed, not uploaded."""
        s = as_job_spec(spec, "plan.spec")
        self._resolve(s, "plan", upload=False)
        return self._call("plan", spec=s, vdev=vdev).plan

    def submit(self, spec, vdev=None, priority=None):
        """Job: submit a job. spec is a gpushare.v1.JobSpec, a dict in the
        proto's JSON form, or the path of a .pb (binary) or .txtpb (text)
        spec; vdev and priority, when given, replace the spec's. Local
        dataset files are uploaded first (once: by content hash). A job that
        does not fit its vdev raises ResourceExhausted with .plan."""
        s = as_job_spec(spec, "submit.spec")
        fill(s, "submit.spec.", vdev=vdev, priority=priority)
        self._precheck(s)
        self._resolve(s, "submit", upload=True)
        return self._call("submit", spec=s).job

    def _precheck(self, s):
        """Before uploading anything: does the job fit the vdev it names (as
        gpuctl submit)? Skipped without a vdev, with auto_fit (the daemon
        may fit it) or with nothing to upload."""
        if not s.vdev or s.auto_fit:
            return
        if not any(s.HasField(w) and _is_upload(getattr(m, a))
                   for w in ("train", "test") for m, a, *_ in _slots(getattr(s, w))):
            return
        copy = pb.JobSpec()
        copy.CopyFrom(s)
        self._resolve(copy, "submit", upload=False)
        p = self._call("plan", spec=copy).plan
        if p.HasField("fits") and not p.fits:
            raise ResourceExhausted(f"the job does not fit vdev {s.vdev}: planned peak {p.peak_bytes} bytes, "
                                    f"limit {p.limit_bytes} bytes; nothing was uploaded (set auto_fit to let "
                                    "gpushare pick a smaller micro-batch)", "submit.spec.batch_size", plan=p)

    def job_status(self, job):
        """Job: the job's record (state, step, epochs, usage, ...)."""
        return self._call("job_status", id=_job_id(job, "job_status.id")).job

    status = job_status

    def list_jobs(self, all=False):
        """[Job]: the tenant's jobs (all=True: the finished ones too)."""
        return list(self._call("list_jobs", all=bool(all)).job)

    def cancel(self, job):
        """Job: ask a job to stop; a running one ends CANCELLED at its next step."""
        return self._call("cancel", id=_job_id(job, "cancel.id")).job

    def logs(self, job):
        """[JobEvent]: the job's events so far."""
        return list(self._call("logs", id=_job_id(job, "logs.id")).event)

    def memory(self, job):
        """MemoryTimeline: the job's measured memory, once it has ended."""
        return self._call("memory", id=_job_id(job, "memory.id")).timeline

    def watch(self, job):
        """An iterator of the job's JobEvents until its final one (SUCCEEDED,
        FAILED or CANCELLED, or the daemon shutting down). A job that has
        ended gives its last event at once. Other calls may be made on this
        connection while watching."""
        req = pb.Request()
        req.watch.id = _job_id(job, "watch.id")
        rid = self._send(req)
        final = False
        try:
            while not final:
                resp = self._recv(rid)
                if resp.code != pb.OK:
                    final = True
                    self._raise(resp)
                final = resp.watch.final
                yield resp.watch.event
        finally:
            self._done(rid)
            if not final:
                self._abandoned.add(rid)  # its further events are read and dropped

    def fetch(self, job, path=None, checkpoint=False):
        """The job's trained weights (safetensors; checkpoint=True: its last
        checkpoint): the bytes, or with path written there (through a
        temporary file renamed at the end, so a failed download leaves no
        partial file) and the number of bytes returned."""
        jid = _job_id(job, "fetch.id")
        if path is None:
            return b"".join(self._fetch_chunks(jid, checkpoint))
        path = os.fspath(path)
        fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".part",
                                   dir=os.path.dirname(os.path.abspath(path)))
        total = 0
        try:
            with os.fdopen(fd, "wb") as f:
                for data in self._fetch_chunks(jid, checkpoint):
                    f.write(data)
                    total += len(data)
                f.flush()
                os.fchmod(f.fileno(), 0o644)
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        return total

    def _fetch_chunks(self, jid, checkpoint):
        offset = 0
        while True:
            res = self._call("fetch", id=jid, checkpoint=bool(checkpoint), offset=offset)
            if res.offset != offset:
                raise Internal(f"gpushared answered a fetch from offset {offset} with offset {res.offset}",
                               "fetch.offset")
            if not res.data and not res.last:
                raise Internal(f"gpushared answered a fetch from offset {offset} with no data and no end",
                               "fetch.offset")
            yield res.data
            offset += len(res.data)
            if res.last:
                return

    def usage(self, tenant=None, since=None):
        """[TenantUsage]: what jobs used, per tenant (an admin: every tenant,
        or tenant), from since on (unix seconds, a date or "YYYY-MM-DD",
        UTC days)."""
        return list(self._call("usage", tenant=tenant, since_unix=_unix_day(since, "usage.since_unix")).tenant)


def connect(socket_path=None, timeout=None):
    """A Client connected to socket_path (default $GPUSHARE_SOCKET, else
    /run/gpushared.sock)."""
    return Client(socket_path, timeout)
