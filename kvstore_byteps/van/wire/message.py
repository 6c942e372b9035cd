"""Plain data of the ps-lite protocol: nodes, control commands, metas and messages. Pure.

The vocabulary is ps-lite's: a :class:`Message` is a small :class:`Meta` plus a list of data
buffers that travel without copying (numpy arrays, ``memoryview`` s, ``bytes`` or zmq frames).
"""
import dataclasses
import enum
from typing import List, Optional, Sequence

from ...config import Role

__all__ = [
    "K_EMPTY", "SCHEDULER_ID", "SERVER_GROUP", "WORKER_GROUP", "SCHEDULER_GROUP", "ALL_GROUP",
    "Role", "ControlCommand", "DataType", "Node", "Control", "Meta", "Message", "Gather",
    "contiguous", "CONNECTION_CLOSED", "connection_closed",
    "server_rank_to_id", "worker_rank_to_id", "id_to_rank",
]

#: ps-lite's "unset" value for ids, timestamps and similar fields (INT32_MAX).
K_EMPTY = 2147483647
SCHEDULER_ID = 1
SCHEDULER_GROUP = 1
SERVER_GROUP = 2
WORKER_GROUP = 4
ALL_GROUP = SCHEDULER_GROUP | SERVER_GROUP | WORKER_GROUP


class ControlCommand(enum.IntEnum):
    """ps-lite's ``Control::Command``: what a control message asks for."""

    EMPTY = 0
    TERMINATE = 1
    ADD_NODE = 2
    BARRIER = 3
    ACK = 4
    HEARTBEAT = 5


class DataType(enum.IntEnum):
    """ps-lite ``DataType`` codes carried in ``Meta.data_type``."""

    CHAR = 0
    INT8 = 1
    INT16 = 2
    INT32 = 3
    INT64 = 4
    UINT8 = 5
    UINT16 = 6
    UINT32 = 7
    UINT64 = 8
    FLOAT = 9
    DOUBLE = 10
    OTHER = 11


# Node ids (ps-lite's rules, the only place they are written out): the scheduler is 1, the
# groups 1, 2, 4 and their unions up to 7; server rank r is 8 + 2r, worker rank r is 9 + 2r.

def server_rank_to_id(rank: int) -> int:
    return 8 + 2 * rank


def worker_rank_to_id(rank: int) -> int:
    return 9 + 2 * rank


def id_to_rank(node_id: int) -> int:
    """ps-lite's ``max((id - 8) / 2, 0)`` with C integer division."""
    return max(int((node_id - 8) / 2), 0)


def is_server_id(node_id: int) -> bool:
    """Whether ``node_id`` is a server's (not a group's, the scheduler's or a worker's)."""
    return node_id >= 8 and node_id % 2 == 0


def is_worker_id(node_id: int) -> bool:
    """Whether ``node_id`` is a worker's."""
    return node_id >= 9 and node_id % 2 == 1


def role_of_id(node_id: int) -> Role:
    """The role of a server's or worker's node id."""
    return Role.WORKER if is_worker_id(node_id) else Role.SERVER


@dataclasses.dataclass
class Node:
    """One cluster member as ps-lite describes it."""

    role: Role
    id: int = K_EMPTY
    hostname: str = ""
    port: int = 0
    is_recovery: bool = False
    customer_id: int = 0
    #: The rank this node asks for (a worker's DMLC_WORKER_ID; a BytePS extension field).
    rank_hint: Optional[int] = None
    #: How often this node heartbeats, in ms (our nodes announce it; a BytePS extension field).
    heartbeat_ms: Optional[int] = None
    #: Where this node also accepts byteps_tcp connections (our nodes on the default van,
    #: van/auto/van.py; a BytePS extension field that upstream schedulers do not relay).
    tcp_port: Optional[int] = None

    @property
    def address(self) -> str:
        return "%s:%d" % (self.hostname, self.port)

    def describe(self) -> str:
        ident = "?" if self.id == K_EMPTY else str(self.id)
        return "%s %s at %s" % (self.role.name.lower(), ident, self.address)

    def describe_rank(self) -> str:
        """E.g. ``worker rank 1 (node 11) at 10.0.0.2:4000``."""
        if self.role == Role.SCHEDULER or self.id == K_EMPTY:
            return self.describe()
        return "%s rank %d (node %d) at %s" % (self.role.name.lower(), id_to_rank(self.id),
                                               self.id, self.address)


@dataclasses.dataclass(frozen=True)
class Control:
    """The control part of a meta; ``cmd == EMPTY`` means a data message. Immutable: every
    data message's meta shares :data:`NO_CONTROL` (one object and list fewer per message)."""

    cmd: ControlCommand = ControlCommand.EMPTY
    nodes: List[Node] = dataclasses.field(default_factory=list)
    barrier_group: int = 0
    msg_sig: int = 0

    @property
    def empty(self) -> bool:
        return self.cmd == ControlCommand.EMPTY


#: the control part of every data message
NO_CONTROL = Control()


@dataclasses.dataclass
class Meta:
    """Message header; field meanings follow ps-lite's ``Meta``.

    ``sender`` and ``recver`` never travel in the PBMeta: the sender comes from the ZMQ identity
    and the receiver is the local node. ``extra`` holds optional BytePS fields (e.g. an RDMA
    address and rkey) that upstream peers do not know and ignore.
    """

    head: int = K_EMPTY
    app_id: int = K_EMPTY
    customer_id: int = 0
    timestamp: int = K_EMPTY
    sender: int = K_EMPTY
    recver: int = K_EMPTY
    request: bool = False
    push: bool = False
    pull: bool = False
    simple_app: bool = False
    body: bytes = b""
    data_type: List[int] = dataclasses.field(default_factory=list)
    priority: int = 0
    control: Control = NO_CONTROL
    extra: Optional[dict] = None

    @property
    def is_control(self) -> bool:
        return self.control is not NO_CONTROL and not self.control.empty


class Gather(tuple):
    """One data frame made of several buffers, one after the other (a push of many small
    partitions to one server: the vals frame). A van that sends vectored (byteps_tcp) sends
    the pieces as they are; the others send :func:`contiguous` copies. Not a buffer itself:
    a van that forgot it fails at once, it cannot send the wrong bytes."""

    __slots__ = ()

    @property
    def nbytes(self) -> int:
        return sum(memoryview(piece).nbytes for piece in self)

    def join(self) -> bytes:
        """The pieces copied into one buffer."""
        return b"".join([memoryview(piece).cast("B") for piece in self])


@dataclasses.dataclass
class Message:
    """A meta plus data frames: buffers (anything exposing the buffer protocol) or
    :class:`Gather` s of buffers."""

    meta: Meta
    data: Sequence = dataclasses.field(default_factory=list)

    def data_bytes(self) -> int:
        return sum(d.nbytes if isinstance(d, Gather) else memoryview(d).nbytes
                   for d in self.data)


#: the ``meta.extra`` key of :func:`connection_closed`'s notice: no decoded message has it
#: (decode_meta reads only the wire's extension fields), so a peer cannot forge one
CONNECTION_CLOSED = "connection_closed"


def connection_closed(peer_id: int, my_id: int) -> Message:
    """What a van hands the postoffice, as if ``peer_id`` had sent it, when that peer's
    connection to this node closed (a HEARTBEAT marked :data:`CONNECTION_CLOSED`): the
    scheduler of an elastic job takes a worker's as its loss (van/runtime/departures.py)."""
    meta = Meta(sender=peer_id, recver=my_id, control=Control(cmd=ControlCommand.HEARTBEAT))
    meta.extra = {CONNECTION_CLOSED: True}
    return Message(meta)


def contiguous(data: Sequence) -> list:
    """``data`` with every :class:`Gather` joined into one buffer (for vans that send a frame
    as one buffer)."""
    return [d.join() if isinstance(d, Gather) else d for d in data]
