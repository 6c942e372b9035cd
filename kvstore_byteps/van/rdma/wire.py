"""What the byteps_rdma van's SENDs carry, and what peers exchange to connect. Pure.

A message is a list of *pieces*: its PBMeta, then its data frames. Small pieces travel inside
the SEND that announces the message; large ones (at least ``written_from`` bytes, or whatever
does not fit the peer's receive slot) are RDMA-written into a landing buffer the receiver
chose, after a rendezvous::

    INLINE  header | inline pieces                 (every piece inline: delivered at once)
    START   header | inline pieces                 (some pieces to be written)
    REPLY   header | (addr u64, rkey u32) per written piece
    ... then the sender's RDMA_WRITE(s), the last WITH_IMM = the message id

    header: kind u8 | pieces u8 | reserved u16 | message id u32 | per piece: length u64, inline u8

Message ids count per direction of a connection from 0; the receiver delivers in id order.
Little-endian throughout.
"""
import dataclasses
import json
import struct
from typing import List, NamedTuple, Sequence, Tuple

from ...errors import ProtocolError

INLINE, START, REPLY = 1, 2, 3
MAX_PIECES = 16
_HEAD = struct.Struct("<BBHI")
_PIECE = struct.Struct("<QB")
_TARGET = struct.Struct("<QI")


class Announce(NamedTuple):
    """A decoded INLINE or START: the piece lengths, which are inline, and the inline bytes."""

    kind: int
    message_id: int
    lengths: Tuple[int, ...]
    inline: Tuple[bool, ...]
    pieces: List[memoryview]         # the inline pieces' bytes, in order


def encode_announce(kind: int, message_id: int, lengths: Sequence[int],
                    inline: Sequence[bool]) -> bytes:
    """The header of an INLINE or START (the inline pieces follow it)."""
    if len(lengths) > MAX_PIECES:
        raise ProtocolError("a message of %d pieces (at most %d)" % (len(lengths), MAX_PIECES))
    return _HEAD.pack(kind, len(lengths), 0, message_id) + b"".join(
        _PIECE.pack(length, flag) for length, flag in zip(lengths, inline))


def decode(slot: memoryview):
    """An :class:`Announce`, or ``(REPLY, message id, [(addr, rkey), ...])``; ProtocolError if
    malformed."""
    if slot.nbytes < _HEAD.size:
        raise ProtocolError("an RDMA slot message of %d bytes" % slot.nbytes)
    kind, count, _, message_id = _HEAD.unpack_from(slot)
    at = _HEAD.size
    if kind == REPLY:
        if slot.nbytes != at + count * _TARGET.size:
            raise ProtocolError("a REPLY of %d bytes for %d targets" % (slot.nbytes, count))
        return REPLY, message_id, [_TARGET.unpack_from(slot, at + i * _TARGET.size)
                                   for i in range(count)]
    if kind not in (INLINE, START) or count > MAX_PIECES \
            or slot.nbytes < at + count * _PIECE.size:
        raise ProtocolError("an RDMA slot message of kind %d with %d pieces" % (kind, count))
    lengths, flags = [], []
    for i in range(count):
        length, flag = _PIECE.unpack_from(slot, at + i * _PIECE.size)
        lengths.append(length)
        flags.append(bool(flag))
    at += count * _PIECE.size
    pieces = []
    for length, flag in zip(lengths, flags):
        if flag:
            pieces.append(slot[at:at + length])
            at += length
    if at != slot.nbytes or (kind == INLINE) != all(flags):
        raise ProtocolError("an RDMA %s whose pieces do not add up"
                            % ("INLINE" if kind == INLINE else "START"))
    return Announce(kind, message_id, tuple(lengths), tuple(flags), pieces)


def encode_reply(message_id: int, targets: Sequence[Tuple[int, int]]) -> bytes:
    return _HEAD.pack(REPLY, len(targets), 0, message_id) + b"".join(
        _TARGET.pack(addr, rkey) for addr, rkey in targets)


def announce_bytes(pieces: int) -> int:
    """The header bytes of an INLINE or START of ``pieces`` pieces."""
    return _HEAD.size + pieces * _PIECE.size


@dataclasses.dataclass(frozen=True)
class ChannelInfo:
    """What one side of a connection tells the other when connecting (over the handshake)."""

    address: str          # the device's (GID or soft socket address)
    qp_num: int
    slots: int            # receives kept posted
    slot_bytes: int
    credit_addr: int      # where the peer writes how many receives this side re-posted
    credit_rkey: int

    def encode(self) -> bytes:
        return json.dumps(dataclasses.asdict(self)).encode("utf-8")

    @classmethod
    def decode(cls, data: bytes) -> "ChannelInfo":
        try:
            fields = json.loads(bytes(data).decode("utf-8"))
            info = cls(**fields)
            for name in ("qp_num", "slots", "slot_bytes", "credit_addr", "credit_rkey"):
                if not isinstance(getattr(info, name), int) or getattr(info, name) < 0:
                    raise ValueError(name)
            return info
        except (ValueError, TypeError) as exc:
            raise ProtocolError("malformed RDMA channel info: %s" % exc) from None
