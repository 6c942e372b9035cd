"""ps-lite's ACK/resend (``PS_RESEND=1``, spec §3.5) as a pure state machine.

Every sent message other than ACK and TERMINATE is kept under its signature
``(u16)app_id << 48 | (u8)sender << 40 | (u8)recver << 32 | (timestamp << 1 | request)`` and
sent again every ``PS_RESEND_TIMEOUT`` ms until the receiver acknowledges it; the tenth retry
is fatal (PeerError naming the silent node). Every received message other than ACK and
TERMINATE is answered with ``ACK{msg_sig}`` to its sender and dropped if its signature was seen
before. Membership starts it only once the node is ready, so ADD_NODE is never acknowledged.
"""
import dataclasses
from typing import Dict, List, Optional, Set, Tuple

from ..errors import PeerError
from .message import K_EMPTY, ControlCommand, Control, Message, Meta

MAX_RETRIES = 10
_UNACKED = (ControlCommand.ACK, ControlCommand.TERMINATE)


def signature(meta: Meta) -> int:
    """The ``msg_sig`` of a message (sender and recver as on the wire, i.e. node ids)."""
    return ((meta.app_id & 0xFFFF) << 48 | (meta.sender & 0xFF) << 40
            | (meta.recver & 0xFF) << 32 | ((meta.timestamp << 1 | int(meta.request))
                                            & 0xFFFFFFFF))


def needs_ack(meta: Meta) -> bool:
    return meta.control.cmd not in _UNACKED


@dataclasses.dataclass
class _Pending:
    message: Message
    sent_at: float
    retries: int = 0


class Resender:
    """Bookkeeping of one node; the postoffice calls it around sends, receives and ticks."""

    def __init__(self, my_id: int, timeout_ms: int):
        self.my_id, self.timeout = my_id, timeout_ms / 1000.0
        self._pending: Dict[int, _Pending] = {}
        self._seen: Set[int] = set()
        self.resent = 0           # messages sent again (for tests and diagnostics)

    def on_send(self, message: Message, now: float) -> None:
        """Keep ``message`` until it is acknowledged (it must carry a timestamp)."""
        if not needs_ack(message.meta) or message.meta.timestamp == K_EMPTY:
            return
        message.meta.sender = self.my_id
        self._pending.setdefault(signature(message.meta), _Pending(message, now))

    def on_receive(self, message: Message) -> Tuple[Optional[Message], bool]:
        """``(ack to send or None, whether to deliver the message)``."""
        meta = message.meta
        if meta.control.cmd == ControlCommand.ACK:
            self._pending.pop(meta.control.msg_sig, None)
            return None, False
        if not needs_ack(meta):
            return None, True
        sig = signature(meta)
        ack = Message(Meta(customer_id=K_EMPTY, recver=meta.sender,
                           control=Control(cmd=ControlCommand.ACK, msg_sig=sig)))
        if sig in self._seen:
            return ack, False
        self._seen.add(sig)
        return ack, True

    def due(self, now: float) -> List[Message]:
        """Messages to send again now; PeerError once one was retried MAX_RETRIES times."""
        again = []
        for sig, pending in self._pending.items():
            if now - pending.sent_at < self.timeout:
                continue
            if pending.retries >= MAX_RETRIES:
                raise PeerError("node %d did not acknowledge message %#x after %d resends"
                                % (pending.message.meta.recver, sig, MAX_RETRIES))
            pending.retries += 1
            pending.sent_at = now
            self.resent += 1
            again.append(pending.message)
        return again
