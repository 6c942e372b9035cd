"""The P3 van (``DMLC_PS_VAN_TYPE=p3``): MXNet 1.9.1 ps-lite's ``P3Van``, priority-ordered sends.

P3 (Jayarajan et al., "Priority-based Parameter Propagation", SysML 2019) changes nothing on
the wire: it is the ZeroMQ van, and every message carries its priority in the meta as always.
What it changes is the order messages leave in: ``send`` only queues the message, and one
sender thread hands them to ZeroMQ highest priority first, so the front layers' slices overtake
the back layers' that are still waiting. (MXNet's P3 worker, ``P3StoreDist``, also cuts each
parameter into slices of ``MXNET_KVSTORE_SLICE_THRESHOLD`` elements spread over the servers;
to a server those are ordinary keys.) Among messages of equal priority, ours keep their order
(ps-lite's heap does not promise that).

So upstream P3 nodes and ours on ``p3`` or ``zmq`` understand each other; ``p3`` on our nodes
gives them P3's send order.

``send`` checks at once that the peer is connected (ProtocolError as from the zmq van); a
failure of the socket send itself happens on the sender thread and is logged per peer. The
sender thread stops after sending the node's TERMINATE to itself, as ps-lite's does, but only
once everything queued before it has left.
"""
import heapq
import itertools
import logging
import threading
from typing import List, Tuple

from ...config import Config
from ...errors import ProtocolError
from ..wire.message import ControlCommand, Message
from ..zmq.van import ZMQVan

__all__ = ["P3Van"]

log = logging.getLogger(__name__)

#: how long close() waits for the sender thread to send what is queued
_SENDER_STOP_S = 5.0


def _rank(message: Message) -> float:
    """Queue order: highest priority first; the node's TERMINATE to itself last, so that what
    was queued before it still leaves (ps-lite's queue orders it by its priority, 0, and its
    sender stops after it: messages of lower priority queued then were never sent)."""
    if message.meta.control.cmd == ControlCommand.TERMINATE:
        return float("inf")
    return -message.meta.priority


class P3Van(ZMQVan):
    """ZMQVan whose sends go out highest priority first, from one sender thread."""

    in_order = False

    def __init__(self, config: Config):
        super().__init__(config)
        self._queue: List[Tuple[int, int, Message]] = []     # (-priority, arrival, message)
        self._arrivals = itertools.count()
        self._ready = threading.Condition()
        self._stopped = False
        self._sender = threading.Thread(target=self._sending, daemon=True, name="p3-van-send")
        self._sender.start()

    def send(self, message: Message) -> int:
        recver = message.meta.recver
        if self._locks.get(recver) is None:
            raise ProtocolError("no connection to node %s" % recver)
        with self._ready:
            if self._stopped:
                raise ProtocolError("connection to node %s is closed" % recver)
            heapq.heappush(self._queue, (_rank(message), next(self._arrivals), message))
            self._ready.notify()
        return message.data_bytes()

    def _sending(self) -> None:
        while True:
            with self._ready:
                while not self._queue and not self._stopped:
                    self._ready.wait()
                if not self._queue:
                    return
                message = heapq.heappop(self._queue)[2]
            try:
                ZMQVan.send(self, message)
            except Exception as exc:    # the peer is gone: its requests fail at their deadline
                self._peer_log.warning(message.meta.recver, "could not send to node %s: %s",
                                         message.meta.recver, exc)
            if message.meta.control.cmd == ControlCommand.TERMINATE:
                return

    def close(self) -> None:
        with self._ready:
            self._stopped = True
            self._ready.notify()
        self._sender.join(_SENDER_STOP_S)
        super().close()
