"""The postoffice's messages on their way through the van: sent as they are or, with
``PS_RESEND``, kept for resending (resend.py) and acknowledged on arrival, their duplicates
dropped; and ``PS_DROP_MSG``'s received data messages lost on purpose (to exercise PS_RESEND).

Thread-safety: ``transmit`` is thread-safe; ``admit`` and ``resend_due`` run on the receive
thread.
"""
import logging
import random
import threading
import time
from typing import Optional

from ...config import Config
from ...errors import PeerError, ProtocolError
from ..wire.message import Message
from .resend import Resender

log = logging.getLogger(__name__)


class Link:
    """Between the postoffice and its van: what ``PS_RESEND`` and ``PS_DROP_MSG`` add."""

    def __init__(self, van, config: Config, ready: threading.Event):
        self.van = van
        self._ready = ready          # the node's: PS_DROP_MSG loses nothing before
        self.resender: Optional[Resender] = None     # PS_RESEND, once ready
        #: data messages dropped on purpose (PS_DROP_MSG)
        self.dropped_messages = 0
        self._drop_percent = config.drop_msg_percent
        self._drop_rng = random.Random() if config.drop_msg_percent else None
        self._lock = threading.Lock()
        self._losses_reported = False

    def start_resending(self, my_id: int, timeout_ms: Optional[int]) -> None:
        """The node is ready (PS_RESEND): keep every message sent from now on until acknowledged."""
        self.resender = Resender(my_id, timeout_ms, in_order=self.van.in_order)

    def transmit(self, message: Message) -> int:
        if self.resender is None:
            return self.van.send(message)
        # Kept for resending *before* it leaves: the ACK may come back before van.send
        # returns, and an ACK for a message not kept yet was lost, so it was resent for nothing.
        # Kept and sent under one lock, so the resender's order of sends is the wire's (fast
        # retransmit reads an ACK as "everything sent before it arrived").
        with self._lock:
            self.resender.on_send(message, time.monotonic())
            return self.van.send(message)

    def admit(self, message: Message) -> bool:
        """Whether a received message goes on: not a data message PS_DROP_MSG loses (once the
        node is ready), nor a duplicate PS_RESEND drops (it acknowledges the rest)."""
        if not message.meta.is_control and self._drop_rng is not None and \
                self._ready.is_set() and self._drop_rng.randrange(100) < self._drop_percent:
            self.dropped_messages += 1
            log.debug("PS_DROP_MSG: dropped a data message from node %s", message.meta.sender)
            return False
        if self.resender is None:
            return True
        with self._lock:
            ack, deliver = self.resender.on_receive(message, time.monotonic())
        if ack is not None:
            self._send_own_traffic(ack, "ACK")
        return deliver

    def resend_due(self, now: float) -> None:
        if self.resender is not None:
            with self._lock:       # sent in the order the resender recorded them
                for message in self.resender.due(now):
                    self._send_own_traffic(message, "resend")

    def _send_own_traffic(self, message: Message, what: str) -> None:
        """Send an ACK or a resend (PS_RESEND's own traffic). Once this node is leaving (its
        shutdown barrier began), a peer that already left is not an error: a resend's ACK, or
        a resent answer's sender, may be gone, and nobody waits for either any more."""
        try:
            self.van.send(message)
        except (PeerError, ProtocolError):
            if not self.resender.leaving:
                raise               # a peer gone mid-job: the node stops, naming it
            log.debug("%s to node %s after the shutdown barrier began not sent: it left",
                      what, message.meta.recver)

    def leave(self) -> None:
        """Everyone is leaving: ACKs of the last messages, and their receivers, may be gone."""
        if self.resender is not None:
            with self._lock:
                self.resender.leave()

    def report_losses(self) -> None:
        """Log what PS_DROP_MSG dropped and PS_RESEND resent (once: at the node's stop)."""
        if self._losses_reported:
            return
        self._losses_reported = True
        if self.dropped_messages:
            log.warning("PS_DROP_MSG=%d: %d received data messages were dropped on purpose",
                        self._drop_percent, self.dropped_messages)
        if self.resender is not None and self.resender.resent:
            log.info("PS_RESEND: %s", self.resender.describe())
