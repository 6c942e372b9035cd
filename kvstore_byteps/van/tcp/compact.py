"""The compact meta of the BytePS TCP van: a data message's meta in fixed fields. Pure.

Both ends of a byteps_tcp connection are ours, so a data message's meta need not be a PBMeta
(upstream's protobuf, which the zmq van must speak): parsing one is a few microseconds with
the caches warm, but several times that in a worker whose caches a large frame has just
flushed (the decode was the largest Python item of a worker's receive thread, 7% of its busy
samples, on loopback with 100 partitions of 768 KB a round, the replayed ResNet-50 step's
regime). A meta that fits these fields goes compact; any other (a control
message, an extension field other than ``pull_timestamp``, a value out of range) goes as
PBMeta. The first byte tells them apart: 0 is never a PBMeta's first byte (field number 0 is
invalid in protobuf).

Layout, little-endian::

    0x00 | head i32 | app_id i32 | customer_id i32 | timestamp i32 | priority i32
         | pull_timestamp i32 | flags u8 | data type count u8 | body length u32
         | data types u8 * count | body

Flags: 1 request, 2 push, 4 pull, 8 simple_app, 16 ``pull_timestamp`` present (as
``Meta.extra``; without it the field is 0 and ``extra`` is None).
"""
import struct
from typing import Optional

from ...errors import ProtocolError
from ..wire.message import Meta

__all__ = ["MARK", "encode", "decode", "is_compact"]

#: the first byte of a compact meta (never of a PBMeta)
MARK = b"\x00"
_FIXED = struct.Struct("<ciiiiiiBBI")
_REQUEST, _PUSH, _PULL, _SIMPLE_APP, _PULL_TIMESTAMP = 1, 2, 4, 8, 16
_KNOWN_FLAGS = 31
_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1


def is_compact(data) -> bool:
    """Whether meta bytes are a compact meta (else a PBMeta)."""
    return data[:1] == MARK


def encode(meta: Meta) -> Optional[bytes]:
    """``meta`` as a compact meta, or None when it does not fit (send it as PBMeta)."""
    if meta.is_control:
        return None
    flags = ((_REQUEST if meta.request else 0) | (_PUSH if meta.push else 0)
             | (_PULL if meta.pull else 0) | (_SIMPLE_APP if meta.simple_app else 0))
    pull_timestamp = 0
    extra = meta.extra
    if extra:
        if len(extra) != 1 or "pull_timestamp" not in extra:
            return None
        pull_timestamp = extra["pull_timestamp"]
        flags |= _PULL_TIMESTAMP
    data_type = meta.data_type
    ints = (meta.head, meta.app_id, meta.customer_id, meta.timestamp, meta.priority,
            pull_timestamp)
    if (len(data_type) > 255 or min(ints) < _INT32_MIN or max(ints) > _INT32_MAX
            or (data_type and (min(data_type) < 0 or max(data_type) > 255))):
        return None
    body = meta.body
    head = _FIXED.pack(MARK, *ints, flags, len(data_type), len(body))
    if not data_type and not body:
        return head
    return b"".join((head, bytes(data_type), bytes(body)))


def decode(data, sender: int, recver: int) -> Meta:
    """The Meta of compact meta bytes; ProtocolError if they are not one."""
    size = len(data)
    if size < _FIXED.size:
        raise ProtocolError("compact meta of %d bytes, at least %d expected"
                            % (size, _FIXED.size))
    (mark, head, app_id, customer_id, timestamp, priority, pull_timestamp, flags, count,
     body_bytes) = _FIXED.unpack_from(data)
    if mark != MARK:
        raise ProtocolError("not a compact meta (first byte %r)" % mark)
    if flags & ~_KNOWN_FLAGS:
        raise ProtocolError("compact meta with unknown flags 0x%x" % flags)
    if _FIXED.size + count + body_bytes != size:
        raise ProtocolError("compact meta of %d bytes holds %d data types and a %d-byte body"
                            % (size, count, body_bytes))
    start = _FIXED.size
    return Meta(head=head, app_id=app_id, customer_id=customer_id, timestamp=timestamp,
                sender=sender, recver=recver, request=bool(flags & _REQUEST),
                push=bool(flags & _PUSH), pull=bool(flags & _PULL),
                simple_app=bool(flags & _SIMPLE_APP),
                body=bytes(data[start + count:]) if body_bytes else b"",
                data_type=list(data[start:start + count]) if count else [],
                priority=priority,
                extra={"pull_timestamp": pull_timestamp} if flags & _PULL_TIMESTAMP else None)
