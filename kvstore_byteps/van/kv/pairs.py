"""The KV layer's data: keys, values and lengths (ps-lite's ``KVPairs``) and their data frames.

Data frames: keys (uint64 LE), vals (raw bytes), lens (int32 LE, bytes per key). Buffers travel
without pickling and, above a small size, without copying.
"""
from typing import NamedTuple, Optional

import numpy as np

from ...errors import ProtocolError
from ..wire.message import DataType, Message

__all__ = ["KVPairs", "NO_PAIRS", "kv_frames", "parse_kv_frames"]

_PUSH_TYPES = [DataType.UINT64, DataType.OTHER, DataType.INT32]


class KVPairs(NamedTuple):
    """Keys, raw value bytes and per-key lengths of a request or response."""

    keys: np.ndarray
    vals: memoryview
    lens: Optional[np.ndarray]


def kv_frames(keys, vals, lens, with_empty_vals: bool):
    """Data frames and their types: [keys, vals(, lens)]; a pull carries an empty vals frame."""
    if keys is None:
        return [], []
    data = [np.ascontiguousarray(keys, dtype=np.uint64)]
    if vals is None and not with_empty_vals:
        return data, _PUSH_TYPES[:1]
    data.append(vals if vals is not None else b"")
    if lens is None or len(lens) == 0:
        return data, _PUSH_TYPES[:2]
    data.append(np.ascontiguousarray(lens, dtype=np.int32))
    return data, _PUSH_TYPES[:]


def _no_pairs() -> KVPairs:
    keys = np.empty(0, np.uint64)
    keys.flags.writeable = False
    return KVPairs(keys, memoryview(b""), None)


#: a message without data frames (an acknowledgement): made once, not per message
NO_PAIRS = _no_pairs()


def parse_kv_frames(message: Message) -> KVPairs:
    """Validate and view the data frames of a KV message; ProtocolError if malformed."""
    frames = message.data
    if len(frames) not in (0, 2, 3):
        raise ProtocolError("expected 0, 2 or 3 data frames, got %d" % len(frames))
    if not frames:
        return NO_PAIRS
    keys_buf, vals = memoryview(frames[0]).cast("B"), memoryview(frames[1]).cast("B")
    if keys_buf.nbytes % 8:
        raise ProtocolError("keys frame of %d bytes is not a multiple of 8" % keys_buf.nbytes)
    keys = np.frombuffer(keys_buf, dtype=np.uint64)
    lens = None
    if len(frames) == 3:
        lens_buf = memoryview(frames[2]).cast("B")
        if lens_buf.nbytes % 4:
            raise ProtocolError("lens frame of %d bytes is not a multiple of 4" % lens_buf.nbytes)
        lens = np.frombuffer(lens_buf, dtype=np.int32)
        if len(lens) != len(keys):
            raise ProtocolError("%d lens for %d keys" % (len(lens), len(keys)))
    return KVPairs(keys, vals, lens)
