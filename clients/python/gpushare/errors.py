"""gpushare.errors: a refused call as an exception.

Every answer of gpushared carries a status code (gpushare.v1.Code), a
sentence for a person and, when one value is to blame, the path of that
value in the request ("submit.spec.batch_size"). A call that is not
answered OK raises the subclass of Error named for its code, with all
three, and the plan when a submit did not fit. The client raises the same
classes for what it refuses itself before anything is sent (a bad
argument: InvalidArgument, which is also a ValueError) and for a
connection it cannot make or lost (Unavailable).
"""

# gpushare.v1.Code, mirrored so that this module needs no protobuf.
OK = 0
INVALID_ARGUMENT = 1
NOT_FOUND = 2
ALREADY_EXISTS = 3
PERMISSION_DENIED = 4
RESOURCE_EXHAUSTED = 5
FAILED_PRECONDITION = 6
UNAVAILABLE = 7
INTERNAL = 8

CODE_NAMES = {
    OK: "OK",
    INVALID_ARGUMENT: "INVALID_ARGUMENT",
    NOT_FOUND: "NOT_FOUND",
    ALREADY_EXISTS: "ALREADY_EXISTS",
    PERMISSION_DENIED: "PERMISSION_DENIED",
    RESOURCE_EXHAUSTED: "RESOURCE_EXHAUSTED",
    FAILED_PRECONDITION: "FAILED_PRECONDITION",
    UNAVAILABLE: "UNAVAILABLE",
    INTERNAL: "INTERNAL",
}


class Error(Exception):
    """A call gpushared (or the client) refused.

    code     the gpushare.v1.Code, an int (gpushare.pb.NOT_FOUND, ...)
    code_name  its name, "NOT_FOUND"
    message  the sentence that says why; show it as it is
    field    the path of the value to blame, "" when no one value is
    plan     a gpushare.v1.Plan when a submit was refused for not fitting
    """

    code = INTERNAL

    def __init__(self, message, field="", code=None, plan=None):
        if code is not None:
            self.code = code
        self.message = message
        self.field = field or ""
        self.plan = plan
        super().__init__(str(self))

    @property
    def code_name(self):
        return CODE_NAMES.get(self.code, f"code {self.code}")

    def __str__(self):
        where = f" ({self.field})" if self.field else ""
        return f"{self.code_name}{where}: {self.message}"


class InvalidArgument(Error, ValueError):
    code = INVALID_ARGUMENT


class NotFound(Error):
    code = NOT_FOUND


class AlreadyExists(Error):
    code = ALREADY_EXISTS


class PermissionDenied(Error):
    code = PERMISSION_DENIED


class ResourceExhausted(Error):
    code = RESOURCE_EXHAUSTED


class FailedPrecondition(Error):
    code = FAILED_PRECONDITION


class Unavailable(Error):
    code = UNAVAILABLE


class Internal(Error):
    code = INTERNAL


_BY_CODE = {c.code: c for c in (InvalidArgument, NotFound, AlreadyExists, PermissionDenied,
                                ResourceExhausted, FailedPrecondition, Unavailable, Internal)}


def error_for(code, message, field="", plan=None):
    """The exception for a status code: its subclass, or Error for a code
    this client does not know (a newer daemon's)."""
    cls = _BY_CODE.get(code, Error)
    return cls(message, field=field, code=code, plan=plan)
