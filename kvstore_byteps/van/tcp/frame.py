"""Wire format of the BytePS TCP van (``DMLC_PS_VAN_TYPE=byteps_tcp``). Pure, socket-free.

A connection starts with one :data:`HELLO_BYTES`-byte hello from each side::

    b"KVBPS" | version u8 | flags u16 | node id u32 (K_EMPTY: not known yet) | reserved u32

Both sides send theirs at once and then read the other's. Flag bit 0 (:data:`FLAG_AUTH`) says
the sender authenticates (``BYTEPS_AUTH_KEY``); then each side follows its hello with a
:data:`~kvstore_byteps.van.auth.NONCE_BYTES`-byte nonce and, after reading the peer's, with its
:data:`~kvstore_byteps.van.auth.PROOF_BYTES`-byte proof (auth.py). Both sides must agree on
the flag. The first
byte is never 0xFF, so a ZeroMQ peer (upstream MXNet's ps-lite, or one of our nodes left on
``zmq``) is recognised by its greeting, whose first 10 bytes are ``FF 00*8 7F`` (ZMTP 3.0), and
gets a clear error instead of a silent hang.

Then messages, each::

    header: meta length u32 | data frame count u16 | reserved u16 | frame length u64 * count
    meta:   the PBMeta of docs/pslite-wire.md (the codec of the zmq van, extension fields
            too), or for most data messages a compact meta (compact.py; its first byte, 0,
            is never a PBMeta's)
    data:   the frames, back to back

All integers little-endian. The lengths come first so the receiver can pick each frame's landing
buffer (a registered, reused one for large frames) before a byte of it arrives.
"""
import struct
from typing import List, NamedTuple, Sequence, Tuple

from ...errors import ProtocolError

__all__ = ["MAGIC", "VERSION", "FLAG_AUTH", "Hello", "HELLO_BYTES", "ZMTP_SIGNATURE_BYTES", "MAX_META_BYTES",
           "MAX_FRAMES", "MAX_FRAME_BYTES", "encode_hello", "decode_hello", "is_zmtp_signature",
           "encode_header", "header_size", "decode_header_start", "decode_frame_lengths"]

MAGIC = b"KVBPS"
VERSION = 3          # 2: the flags field and the authenticated handshake; 3: compact metas
FLAG_AUTH = 1
FLAG_RDMA = 2        # the sender is a byteps_rdma node (its connections carry RDMA channels)
_HELLO = struct.Struct("<5sBHII")
HELLO_BYTES = _HELLO.size                       # 16
ZMTP_SIGNATURE_BYTES = 10

_HEAD = struct.Struct("<IHH")
_LENGTH = struct.Struct("<Q")
MAX_META_BYTES = 1 << 20
MAX_FRAMES = 64
MAX_FRAME_BYTES = 1 << 30


class Hello(NamedTuple):
    """A peer's hello: its node id (K_EMPTY if it has none yet), whether it authenticates."""

    node_id: int
    auth: bool
    rdma: bool = False


def encode_hello(node_id: int, auth: bool = False, rdma: bool = False) -> bytes:
    """This node's hello; ``node_id`` K_EMPTY while the scheduler has not assigned one."""
    flags = (FLAG_AUTH if auth else 0) | (FLAG_RDMA if rdma else 0)
    return _HELLO.pack(MAGIC, VERSION, flags, node_id & 0xFFFFFFFF, 0)


def is_zmtp_signature(first: bytes) -> bool:
    """Whether the first bytes of a stream are a ZeroMQ (ZMTP 3.x) greeting's signature."""
    return (len(first) >= ZMTP_SIGNATURE_BYTES and first[0] == 0xFF
            and first[ZMTP_SIGNATURE_BYTES - 1] == 0x7F)


def decode_hello(data: bytes) -> Hello:
    """The peer's :class:`Hello`; ProtocolError saying what is wrong,
    worded to follow the peer's name ("the node at ... speaks ZeroMQ ...")."""
    if is_zmtp_signature(data):
        raise ProtocolError("speaks ZeroMQ (upstream MXNet's ps-lite, or a node with "
                            "DMLC_PS_VAN_TYPE=zmq) but this node uses a BytePS van "
                            "(DMLC_PS_VAN_TYPE=byteps_tcp or byteps_rdma); every node of a "
                            "cluster must use the same van, and upstream MXNet nodes only speak "
                            "zmq")
    if len(data) != HELLO_BYTES:
        raise ProtocolError("hello of %d bytes, expected %d" % (len(data), HELLO_BYTES))
    magic, version, flags, node_id, _ = _HELLO.unpack(data)
    if magic != MAGIC:
        raise ProtocolError("is not a byteps_tcp node (its hello starts with %r)" % data[:8])
    if version != VERSION:
        raise ProtocolError("speaks byteps_tcp version %d, this node version %d "
                            "(install the same kvstore-byteps everywhere)" % (version, VERSION))
    if flags & ~(FLAG_AUTH | FLAG_RDMA):
        raise ProtocolError("sent unknown hello flags 0x%x" % flags)
    return Hello(node_id, bool(flags & FLAG_AUTH), bool(flags & FLAG_RDMA))


def encode_header(meta: bytes, frames: Sequence[int]) -> bytes:
    """The header before ``meta`` and data frames of the given byte lengths."""
    if len(meta) > MAX_META_BYTES:
        raise ProtocolError("meta of %d bytes exceeds %d" % (len(meta), MAX_META_BYTES))
    count = len(frames)
    if count > MAX_FRAMES:
        raise ProtocolError("%d data frames exceed %d" % (count, MAX_FRAMES))
    if count and max(frames) > MAX_FRAME_BYTES:
        raise ProtocolError("a data frame of %d bytes exceeds %d"
                            % (max(frames), MAX_FRAME_BYTES))
    return _HEAD.pack(len(meta), count, 0) + _LENGTHS[count].pack(*frames)


def header_size(frame_count: int) -> int:
    return _HEAD.size + _LENGTH.size * frame_count


#: Bytes of the fixed part of a header (read first; it says how long the rest is).
HEAD_BYTES = _HEAD.size


def decode_header_start(data, offset: int = 0) -> Tuple[int, int]:
    """``(meta length, frame count)`` from the fixed part at ``offset`` of ``data``;
    ProtocolError if out of bounds."""
    meta_bytes, count, _ = _HEAD.unpack_from(data, offset)
    if meta_bytes == 0 or meta_bytes > MAX_META_BYTES:
        raise ProtocolError("meta length %d outside 1..%d" % (meta_bytes, MAX_META_BYTES))
    if count > MAX_FRAMES:
        raise ProtocolError("%d data frames exceed %d" % (count, MAX_FRAMES))
    return meta_bytes, count


#: the frame lengths of a header with n frames, read in one call (n = 0..MAX_FRAMES)
_LENGTHS = [struct.Struct("<%dQ" % n) for n in range(MAX_FRAMES + 1)]


def decode_frame_lengths(data, count: int, offset: int = 0) -> List[int]:
    """The ``count`` frame lengths following the fixed part, at ``offset`` of ``data``;
    ProtocolError if one is too big or ``data`` holds fewer."""
    try:
        lengths = _LENGTHS[count].unpack_from(data, offset)
    except struct.error:
        raise ProtocolError("header has %d of %d frame lengths"
                            % (max(len(data) - offset, 0) // _LENGTH.size, count)) from None
    for size in lengths:
        if size > MAX_FRAME_BYTES:
            raise ProtocolError("a data frame of %d bytes exceeds %d" % (size, MAX_FRAME_BYTES))
    return list(lengths)
