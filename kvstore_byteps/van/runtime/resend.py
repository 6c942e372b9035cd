"""ps-lite's ACK/resend (``PS_RESEND=1``, spec §3.5) as a pure state machine.

Every sent message other than ACK and TERMINATE is kept under its signature
``(u16)app_id << 48 | (u8)sender << 40 | (u8)recver << 32 | (timestamp << 1 | request)`` and
sent again until the receiver acknowledges it; the tenth retry is fatal (PeerError naming the
silent node). Every received message other than ACK and TERMINATE is answered with
``ACK{msg_sig}`` to its sender and dropped if its signature was seen before. Membership starts
it only once the node is ready, so ADD_NODE is never acknowledged.

Beyond ps-lite (the wire is the same):

* An answer acknowledges its request too: a server cannot answer what it did not receive. A
  request answered while its ACK was lost is not sent again, and is not kept (its buffers may
  belong to an array the caller has finished with).
* When a message is sent again (the retransmission timeout): ``PS_RESEND_TIMEOUT`` fixes it,
  as in ps-lite. Unset, each peer gets TCP's adaptive timeout (RFC 6298): a smoothed round trip
  and its variation, measured from ACKs of messages sent once (Karn's rule), timeout = SRTT +
  4 RTTVAR within [MIN_RTO_S, MAX_RTO_S]; each resend doubles the message's timeout and the
  peer's, up to MAX_RTO_S. So a lost message costs a few round trips, not a fixed second.
* Fast retransmit (TCP's, RFC 5681, for a channel that never reorders): a van whose messages to
  a peer arrive in the order they were sent (``in_order``: zmq, byteps_tcp; not p3, which
  reorders by priority) and a receiver that acknowledges in arrival order make the ACK of a
  message sent once also say that every message sent to that peer before it arrived, or was
  lost: those still unacknowledged are sent again at once, not after a timeout. (The
  postoffice keeps the order: it records and sends a message under one lock.)
* Once the node says goodbye (:meth:`Resender.leave`, as it enters the shutdown barrier) an
  unacknowledged message is given up quietly: its receiver may have left already.
"""
import dataclasses
from typing import Dict, List, Optional, Set, Tuple

from ...errors import PeerError
from ..wire.message import K_EMPTY, ControlCommand, Control, Message, Meta

MAX_RETRIES = 10
#: bounds of the adaptive timeout (seconds); the postoffice checks every 50 ms anyway
MIN_RTO_S = 0.05
MAX_RTO_S = 1.0
#: before a peer's first round trip is measured (RFC 6298: 1 s)
INITIAL_RTO_S = 1.0
_UNACKED = (ControlCommand.ACK, ControlCommand.TERMINATE)


def signature(meta: Meta) -> int:
    """The ``msg_sig`` of a message (sender and recver as on the wire, i.e. node ids)."""
    return _signature(meta.app_id, meta.sender, meta.recver, meta.timestamp, meta.request)


def _signature(app_id: int, sender: int, recver: int, timestamp: int, request: bool) -> int:
    return ((app_id & 0xFFFF) << 48 | (sender & 0xFF) << 40 | (recver & 0xFF) << 32
            | ((timestamp << 1 | int(request)) & 0xFFFFFFFF))


def needs_ack(meta: Meta) -> bool:
    return meta.control.cmd not in _UNACKED


class RetransmitTimer:
    """One peer's retransmission timeout (RFC 6298, section 2 and 5.5). Pure."""

    def __init__(self, initial: float = INITIAL_RTO_S, minimum: float = MIN_RTO_S,
                 maximum: float = MAX_RTO_S):
        self.minimum, self.maximum = minimum, maximum
        self.rto = initial
        self.srtt: Optional[float] = None
        self.rttvar = 0.0

    def sample(self, rtt: float) -> None:
        """A round trip measured on a message sent once."""
        if self.srtt is None:
            self.srtt, self.rttvar = rtt, rtt / 2
        else:
            self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - rtt)
            self.srtt = 0.875 * self.srtt + 0.125 * rtt
        self.rto = min(self.maximum, max(self.minimum, self.srtt + 4 * self.rttvar))

    def backoff(self) -> None:
        """A message to this peer timed out: wait longer until a round trip is measured."""
        self.rto = min(self.maximum, self.rto * 2)


@dataclasses.dataclass
class _Pending:
    message: Message
    sent_at: float
    timeout: float
    seq: int                # when it was (last) sent, in this node's order of sends
    retries: int = 0
    lost: bool = False      # a later message to the same peer was acknowledged first

    @property
    def deadline(self) -> float:
        return -1.0 if self.lost else self.sent_at + self.timeout


class Resender:
    """Bookkeeping of one node; the postoffice calls it around sends, receives and ticks.

    ``timeout_ms``: a fixed retransmission timeout (PS_RESEND_TIMEOUT); None: adaptive.
    ``in_order``: the van delivers each peer's messages in the order they were sent (fast
    retransmit)."""

    def __init__(self, my_id: int, timeout_ms: Optional[int] = None, in_order: bool = True):
        self.my_id = my_id
        self.fixed = None if timeout_ms is None else timeout_ms / 1000.0
        self.in_order = in_order
        self._timers: Dict[int, RetransmitTimer] = {}
        self._pending: Dict[int, _Pending] = {}
        #: peer -> its pending messages by signature, in the order they were (last) sent
        self._by_peer: Dict[int, Dict[int, _Pending]] = {}
        self._seq = 0
        self._seen: Set[int] = set()
        self._leaving = False
        self.resent = 0           # messages sent again (for tests and diagnostics)
        self.given_up = 0         # unacknowledged messages dropped after leave()

    def timer(self, peer: int) -> RetransmitTimer:
        timer = self._timers.get(peer)
        if timer is None:
            timer = self._timers[peer] = RetransmitTimer()
        return timer

    def _timeout(self, peer: int) -> float:
        return self.fixed if self.fixed is not None else self.timer(peer).rto

    def on_send(self, message: Message, now: float) -> None:
        """Keep ``message`` until it is acknowledged (it must carry a timestamp)."""
        meta = message.meta
        if not needs_ack(meta) or meta.timestamp == K_EMPTY:
            return
        meta.sender = self.my_id
        sig = signature(meta)
        if sig not in self._pending:
            pending = self._pending[sig] = _Pending(message, now, self._timeout(meta.recver),
                                                    self._next_seq())
            self._by_peer.setdefault(meta.recver, {})[sig] = pending

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _forget(self, sig: int) -> Optional[_Pending]:
        pending = self._pending.pop(sig, None)
        if pending is not None:
            del self._by_peer[pending.message.meta.recver][sig]
        return pending

    def on_receive(self, message: Message, now: float = 0.0) -> Tuple[Optional[Message], bool]:
        """``(ack to send or None, whether to deliver the message)``."""
        meta = message.meta
        if meta.control.cmd == ControlCommand.ACK:
            self._acknowledged(meta.control.msg_sig, now)
            return None, False
        if not needs_ack(meta):
            return None, True
        if not meta.request and meta.control.cmd == ControlCommand.EMPTY:
            # a data answer: its request arrived (no RTT sample: the answer may have waited)
            self._forget(_signature(meta.app_id, self.my_id, meta.sender, meta.timestamp, True))
        sig = signature(meta)
        ack = Message(Meta(customer_id=K_EMPTY, recver=meta.sender,
                           control=Control(cmd=ControlCommand.ACK, msg_sig=sig)))
        if sig in self._seen:
            return ack, False
        self._seen.add(sig)
        return ack, True

    def _acknowledged(self, sig: int, now: float) -> None:
        pending = self._forget(sig)
        if pending is None or pending.retries:      # (Karn: what a resend's ACK says is unclear)
            return
        peer = pending.message.meta.recver
        if self.fixed is None:
            self.timer(peer).sample(max(0.0, now - pending.sent_at))
        if self.in_order:
            for earlier in self._by_peer[peer].values():     # oldest first
                if earlier.seq > pending.seq:
                    break
                earlier.lost = True

    def leave(self) -> None:
        """The node entered its shutdown barrier: from now on, give up quietly."""
        self._leaving = True

    @property
    def leaving(self) -> bool:
        """Whether :meth:`leave` was called (resends may find their receiver gone)."""
        return self._leaving

    def due(self, now: float) -> List[Message]:
        """Messages to send again now, in this order (send them before anything else is
        recorded); PeerError once one was retried MAX_RETRIES times."""
        overdue = [(sig, p) for sig, p in self._pending.items() if now >= p.deadline]
        again, gone = [], []
        for sig, pending in overdue:
            recver = pending.message.meta.recver
            if pending.retries >= MAX_RETRIES:
                if not self._leaving:
                    raise PeerError("node %d did not acknowledge message %#x after %d resends"
                                    % (recver, sig, MAX_RETRIES))
                gone.append(sig)
                continue
            if not pending.lost and self.fixed is None:   # timed out: wait longer from now on
                self.timer(recver).backoff()
                pending.timeout = min(MAX_RTO_S, max(pending.timeout * 2,
                                                     self.timer(recver).rto))
            pending.retries += 1
            pending.sent_at, pending.lost = now, False
            self._forget(sig)                     # sent again: now the peer's newest
            pending.seq = self._next_seq()
            self._pending[sig] = pending
            self._by_peer[recver][sig] = pending
            self.resent += 1
            again.append(pending.message)
        for sig in gone:
            self._forget(sig)
        self.given_up += len(gone)
        return again

    def describe(self) -> str:
        """What was resent, and each peer's timeout: for the log at shutdown."""
        timers = ", ".join("node %d %.0f ms" % (peer, timer.rto * 1000)
                           for peer, timer in sorted(self._timers.items())
                           if timer.srtt is not None)
        return ("%d messages sent again; retransmission timeout %s"
                % (self.resent, "fixed at %.0f ms" % (self.fixed * 1000)
                   if self.fixed is not None else "by peer: " + (timers or "none measured")))

    @property
    def pending(self) -> int:
        """Messages sent and not acknowledged yet."""
        return len(self._pending)
