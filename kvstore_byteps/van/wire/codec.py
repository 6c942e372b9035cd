"""Meta <-> PBMeta bytes, byte-compatible with MXNet 1.9.1's ps-lite. Pure.

Encoding mirrors upstream's ``Van::PackMeta`` field by field (docs/pslite-wire.md §2), so our
metas are byte-identical to what a C++ node would send. Decoding accepts everything upstream
emits, including 10-byte negative varints in fields holding uninitialised memory.
"""
import re

from google.protobuf.message import DecodeError

from ...config import Role
from ...errors import ProtocolError
from .message import K_EMPTY, ControlCommand, Control, Meta, Node
from .pbmeta import PBMeta

#: BytePS-only PBMeta fields; they travel in ``Meta.extra`` and upstream peers ignore them.
EXTENSION_FIELDS = ("error", "rdma_addr", "rdma_rkey", "round", "dead_node", "epoch",
                    "pull_timestamp", "abort", "await_init", "abort_status", "barrier_kind",
                    "after_push", "worker_left", "worker_joined", "job_finished")


def encode_meta(meta: Meta) -> bytes:
    """Serialize ``meta`` exactly as upstream's PackMeta would."""
    pb = PBMeta()
    pb.head = meta.head
    if meta.body:
        pb.body = bytes(meta.body)
    if not meta.control.empty:
        _pack_control(meta.control, pb.control)
    pb.request = meta.request
    pb.push = meta.push
    pb.simple_app = meta.simple_app
    if meta.app_id != K_EMPTY:
        pb.app_id = meta.app_id
    if meta.timestamp != K_EMPTY:
        pb.timestamp = meta.timestamp
    if meta.data_type:
        pb.data_type.extend(int(t) for t in meta.data_type)
    pb.customer_id = meta.customer_id
    pb.pull = meta.pull
    pb.priority = meta.priority
    for name, value in (meta.extra or {}).items():
        if name not in EXTENSION_FIELDS:
            raise ValueError("unknown PBMeta extension field %r" % name)
        setattr(pb, name, value)
    return pb.SerializeToString()


def decode_meta(data, sender: int = K_EMPTY, recver: int = K_EMPTY) -> Meta:
    """Parse PBMeta bytes into a Meta; raise ProtocolError on malformed input."""
    data = bytes(data)
    pb = PBMeta()
    try:
        pb.ParseFromString(data)
    except DecodeError as exc:
        raise ProtocolError("malformed PBMeta (%d bytes): %s" % (len(data), exc)) from None
    has = pb.HasField
    control = has("control")
    # only the control part has required fields
    if control and not pb.IsInitialized():
        raise ProtocolError("PBMeta lacks required fields: %s"
                            % ", ".join(pb.FindInitializationErrors()))
    meta = Meta(
        head=pb.head,
        app_id=pb.app_id if has("app_id") else K_EMPTY,
        customer_id=pb.customer_id,
        timestamp=pb.timestamp if has("timestamp") else K_EMPTY,
        sender=sender,
        recver=recver,
        request=pb.request,
        push=pb.push,
        pull=pb.pull,
        simple_app=pb.simple_app,
        body=pb.body,
        data_type=list(pb.data_type),
        priority=pb.priority,
    )
    if control:
        meta.control = _unpack_control(pb.control)
    if _may_have_extensions(data):
        extra = {name: getattr(pb, name) for name in EXTENSION_FIELDS if has(name)}
        meta.extra = extra or None
    return meta


def _may_have_extensions(data: bytes) -> bool:
    """Whether PBMeta bytes may hold an extension field (numbers 100-114): every such field
    starts with a tag of 800-919 (number << 3 | wire type), whose varint's first byte is
    0xA0-0xFF and second 0x06 (800-895), or 0x80-0x97 and second 0x07 (896-919), the second
    byte | 0x80 if a peer wrote the tag overlong. Bytes without such a pair hold none, as
    most answers' metas, and skip fifteen ``HasField`` calls."""
    return _EXTENSION_TAG.search(data) is not None


#: the first two bytes of an extension field's tag (see _may_have_extensions)
_EXTENSION_TAG = re.compile(b"[\\xa0-\\xff][\\x06\\x86]|[\\x80-\\x97][\\x07\\x87]")


def _pack_control(control: Control, pb_control) -> None:
    pb_control.cmd = int(control.cmd)
    for node in control.nodes:
        _pack_node(node, pb_control.node.add())
    if control.cmd == ControlCommand.BARRIER:
        pb_control.barrier_group = control.barrier_group
    if control.cmd == ControlCommand.ACK:
        pb_control.msg_sig = control.msg_sig


def _pack_node(node: Node, pb_node) -> None:
    pb_node.role = int(node.role)
    pb_node.id = node.id
    pb_node.hostname = node.hostname
    pb_node.port = node.port
    pb_node.is_recovery = node.is_recovery
    pb_node.customer_id = node.customer_id
    if node.rank_hint is not None:
        pb_node.rank_hint = node.rank_hint
    if node.heartbeat_ms is not None:
        pb_node.heartbeat_ms = node.heartbeat_ms
    if node.tcp_port is not None:
        pb_node.tcp_port = node.tcp_port


def _unpack_control(pb_control) -> Control:
    try:
        cmd = ControlCommand(pb_control.cmd)
    except ValueError:
        raise ProtocolError("unknown control command %d" % pb_control.cmd) from None
    return Control(
        cmd=cmd,
        nodes=[_unpack_node(pb_node) for pb_node in pb_control.node],
        barrier_group=pb_control.barrier_group,
        msg_sig=pb_control.msg_sig,
    )


def _unpack_node(pb_node) -> Node:
    try:
        role = Role(pb_node.role)
    except ValueError:
        raise ProtocolError("unknown node role %d" % pb_node.role) from None
    hostname = pb_node.hostname
    if not isinstance(hostname, str):   # protobuf hands invalid UTF-8 back as bytes
        raise ProtocolError("node hostname %r is not UTF-8" % (hostname[:64],))
    for name in ("port", "tcp_port"):
        if not 0 <= getattr(pb_node, name) <= 65535:
            raise ProtocolError("node %s %d is out of range" % (name, getattr(pb_node, name)))
    return Node(
        role=role,
        id=pb_node.id if pb_node.HasField("id") else K_EMPTY,
        hostname=hostname,
        port=pb_node.port,
        is_recovery=pb_node.is_recovery,
        customer_id=pb_node.customer_id,
        rank_hint=pb_node.rank_hint if pb_node.HasField("rank_hint") else None,
        heartbeat_ms=pb_node.heartbeat_ms if pb_node.HasField("heartbeat_ms") else None,
        tcp_port=pb_node.tcp_port or None,
    )
