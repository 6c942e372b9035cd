"""MXNet's application protocol on top of ps-lite, in one place (docs/pslite-wire.md §5). Pure.

What a KV request's ``head`` means and which commands a worker sends its servers:

* the **cmd** of a KV request is the Cantor pairing of a :class:`RequestType` and an mshadow
  dtype code (:class:`MShadowType`): ``cmd = (m + d)(m + d + 1) / 2 + d``. The dtype travels
  only there; the vals frame is a raw little-endian array of it. Request type 3 is ours
  (``RequestType.BYTEPS``, the BytePS data path: cmd 6 for float32, 11 for float64, 17 for
  float16); upstream MXNet never sends it, so an upstream worker never reaches that path;
* a SimpleApp command's head is a :class:`ServerCommand`; ``BYTEPS_PROBE`` is ours, answered
  with :data:`PROBE_ANSWER` by our server and with an empty body by MXNet's.

Used by the worker (``engine``) and the server alike; the transport (``van``) knows none of it.
"""
import dataclasses
import enum
import functools
import math
from typing import Tuple

import numpy as np

from .errors import ProtocolError

__all__ = ["RequestType", "MShadowType", "ServerCommand", "PROBE_ANSWER", "Cmd",
           "SERVER_DTYPES", "cantor_pair", "cantor_unpair", "mshadow_code", "encode_cmd",
           "decode_cmd"]


class RequestType(enum.IntEnum):
    """First member of the cmd pair: MXNet's ``RequestType``, plus our BytePS marker."""

    DEFAULT = 0       # kDefaultPushPull
    ROW_SPARSE = 1    # kRowSparsePushPull
    COMPRESSED = 2    # kCompressedPushPull (2-bit gradient compression)
    BYTEPS = 3        # ours: the BytePS data path
    BYTEPS_COMPRESSED = 4   # ours: the BytePS data path, values compressed (kvstore_byteps.compress)
    BYTEPS_RECOVERY = 5     # ours: a worker's report to a restarted server (serving.recovery)
    BYTEPS_LINK_TEST = 6    # ours: bytes acknowledged and dropped (engine/sizing.py)


class MShadowType(enum.IntEnum):
    """mshadow dtype codes, the second member of the cmd pair."""

    FLOAT32 = 0
    FLOAT64 = 1
    FLOAT16 = 2
    UINT8 = 3
    INT32 = 4
    INT8 = 5
    INT64 = 6
    BOOL = 7
    INT16 = 8
    UINT16 = 9
    UINT32 = 10
    UINT64 = 11
    BFLOAT16 = 12


class ServerCommand(enum.IntEnum):
    """``Meta.head`` of a SimpleApp command a worker sends to every server (spec §5.3)."""

    CONTROLLER = 0                 # body: pickle.dumps(optimizer, 0)
    SET_MULTI_PRECISION = 1
    STOP_SERVER = 2
    SYNC_MODE = 3
    SET_GRADIENT_COMPRESSION = 4   # body: "<type>[,<threshold>]"
    SET_PROFILER_PARAMS = 5
    #: ours: "which server are you?" Our server answers PROBE_ANSWER; MXNet's server
    #: ignores unknown commands and answers with an empty body.
    BYTEPS_PROBE = 100
    #: ours: body = the JSON of set_gradient_compression's dict; sent by rank 0 before init
    BYTEPS_COMPRESSION = 101
    #: ours, with backup workers: body a :class:`Presence`: this worker pushes nothing for now
    #: (it waits in a barrier), has finished training, or is back; rounds stop waiting for it
    BYTEPS_ABSENT = 102
    #: ours: rank 0 leaves the partition layout it chose (JSON, engine/sizing.py); an empty
    #: body asks for it
    BYTEPS_LAYOUT = 103
    #: ours, in asynchronous training and with backup workers, once every worker finished:
    #: answered ``b"<stale>/<keys>"``: of this server's keys, how many the sender last read
    #: before their latest change (its weights differ from the servers' final ones)
    BYTEPS_STALE = 104
    #: ours: answered with this server's rounds that wait for the sender's push, which other
    #: workers pushed (engine/stuck.py): ``b"<ps key>:<round>:<node>,<node>;..."``, at most
    #: WAITING_SHOWN of them, or empty (synchronous rounds only: other modes' rounds do not
    #: wait for one worker)
    BYTEPS_WAITING = 105
    #: ours, elastic workers, to server rank 0: a worker's State.commit(), body
    #: ``b"<n>\n<state JSON>"``, answered with the workers that join there (serving/joins.py)
    BYTEPS_COMMIT = 106
    #: ours, elastic workers, to server rank 0: a late worker asks to join, answered with the
    #: commit it joins at and its state, or empty while the others have not reached one
    BYTEPS_JOIN = 107
    #: ours, elastic workers, to every server: the late worker joins the rounds from the
    #: next one on (the others wait in the join barrier meanwhile)
    BYTEPS_ADMIT = 108
    #: ours, elastic workers, to server rank 0, where the workers update (summation only):
    #: the leading worker leaves its parameters and optimizer state for the late ones,
    #: ``b"<n>\n<kvstore_byteps/handover.py's bytes>"``; ``b"<n>"`` asks for them
    BYTEPS_HANDOVER = 109


#: how many waiting rounds a server names in its answer to BYTEPS_WAITING
WAITING_SHOWN = 4


class Presence(enum.Enum):
    """The body of ``BYTEPS_ABSENT``: where a worker is, for the rounds of backup workers."""

    BACK = b"0"          # training again (left a barrier)
    AWAY = b"1"          # waits in a barrier: pushes nothing for now
    DONE = b"2"          # finished training (kvstore_byteps.finish_training, or its store closes)


PROBE_ANSWER = b"byteps"

#: The dtypes MXNet's server accepts (ours too); anything else is refused (upstream aborts).
SERVER_DTYPES = {
    MShadowType.FLOAT32: np.dtype(np.float32),
    MShadowType.FLOAT64: np.dtype(np.float64),
    MShadowType.FLOAT16: np.dtype(np.float16),
}
_BY_NAME = {member.name.lower(): member for member in MShadowType}


@dataclasses.dataclass(frozen=True)
class Cmd:
    """A decoded cmd: request type and the numpy dtype of the values."""

    request_type: RequestType
    dtype: np.dtype


def cantor_pair(a: int, b: int) -> int:
    """Cantor pairing ``(a+b)(a+b+1)/2 + b`` as MXNet's ``GetCommandType`` computes it."""
    return (a + b) * (a + b + 1) // 2 + b


def cantor_unpair(c: int) -> Tuple[int, int]:
    """Inverse of :func:`cantor_pair`, with an exact integer square root."""
    if c < 0:
        raise ValueError("a Cantor-paired value is non-negative, got %d" % c)
    w = (math.isqrt(8 * c + 1) - 1) // 2
    b = c - w * (w + 1) // 2
    return w - b, b


def mshadow_code(dtype) -> MShadowType:
    """The mshadow code of a numpy dtype, its name, or a code; ValueError if it has none."""
    if isinstance(dtype, MShadowType):
        return dtype
    name = getattr(dtype, "name", None) or getattr(dtype, "__name__", None) or str(dtype)
    try:
        return _BY_NAME[np.dtype(name).name if name != "bfloat16" else name]
    except (KeyError, TypeError):
        raise ValueError("dtype %r has no mshadow code" % (dtype,)) from None


def encode_cmd(request_type: RequestType, dtype) -> int:
    """The cmd (request head) for ``request_type`` and a dtype (numpy, name or mshadow code)."""
    return cantor_pair(int(request_type), int(mshadow_code(dtype)))


@functools.lru_cache(maxsize=256)     # a job uses a handful of heads, every request one of them
def decode_cmd(head: int) -> Cmd:
    """Decode a request head as a server does: ProtocolError for an unknown request type or a
    dtype outside :data:`SERVER_DTYPES`."""
    try:
        type_code, dtype_code = cantor_unpair(int(head))
    except ValueError as exc:
        raise ProtocolError("bad cmd %d: %s" % (head, exc)) from None
    try:
        request_type = RequestType(type_code)
    except ValueError:
        raise ProtocolError("cmd %d has unknown request type %d" % (head, type_code)) from None
    dtype = SERVER_DTYPES.get(dtype_code)
    if dtype is None:
        try:
            name = MShadowType(dtype_code).name.lower()
        except ValueError:
            name = "with mshadow code %d" % dtype_code
        raise ProtocolError("cmd %d has unsupported dtype %s (supported: float32, float64, float16)"
                            % (head, name))
    return Cmd(request_type, dtype)
