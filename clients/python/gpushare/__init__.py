"""gpushare: a Python client for gpushared.

    import gpushare as gs
    with gs.connect() as c:              # $GPUSHARE_SOCKET, else /run/gpushared.sock
        print(c.version())
        job = c.submit("job.txtpb", vdev="small")
        for ev in c.watch(job):
            print(gs.pb.JobState.Name(ev.state), ev.step, ev.loss)
        weights = gs.load_safetensors(c.fetch(job))

See clients/python/README.md, and docs/protocol.md for the wire.
"""
from ._proto import pb
from .client import CHUNK, DEFAULT_SOCKET, MAX_FRAME, Client, connect, default_socket, parse_size
from .errors import (AlreadyExists, Error, FailedPrecondition, Internal, InvalidArgument, NotFound,
                     PermissionDenied, ResourceExhausted, Unavailable)
from .safetensors import load_safetensors
from .spec import (adam, as_job_spec, conv2d, dense, depthwise_conv2d, flatten, global_average_pooling2d,
                   idx, job_spec, max_pool2d, named, npy, read_job_spec, relu, sgd, synthetic, text,
                   tokens)

__all__ = [
    "pb", "Client", "connect", "default_socket", "parse_size", "DEFAULT_SOCKET", "MAX_FRAME", "CHUNK",
    "Error", "InvalidArgument", "NotFound", "AlreadyExists", "PermissionDenied", "ResourceExhausted",
    "FailedPrecondition", "Unavailable", "Internal", "load_safetensors",
    "as_job_spec", "read_job_spec", "job_spec", "dense", "conv2d", "depthwise_conv2d", "max_pool2d",
    "global_average_pooling2d", "flatten", "relu", "synthetic", "idx", "npy", "text", "tokens", "named",
    "adam", "sgd",
]
