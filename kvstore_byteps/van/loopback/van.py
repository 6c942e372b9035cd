"""An in-memory van: postoffices, membership and the KV layer tested without sockets.

A :class:`LoopbackNetwork` stands for the network: vans listening at (host, port). A
:class:`LoopbackVan` sends by putting the encoded meta and a copy of the data frames into the
receiving van's inbox, with the sender's identity as it was when the channel was connected,
exactly what a ZeroMQ DEALER does (an anonymous channel stays anonymous). Nothing is lost or
reordered unless a test says so: :meth:`LoopbackNetwork.cut` makes a node unreachable (its
inbox is dropped and its sends vanish), as a killed process would be.
"""
import queue
import threading
from typing import Callable, Dict, Optional, Set, Tuple

from ...errors import ConfigError, ProtocolError
from ..base import Van
from ..wire.codec import decode_meta, encode_meta
from ..wire.message import K_EMPTY, Message, Node, contiguous

__all__ = ["LoopbackNetwork", "LoopbackVan"]


class LoopbackNetwork:
    """The vans listening at each (host, port) of one in-memory cluster."""

    def __init__(self, first_port: int = 20000):
        self._listeners: Dict[Tuple[str, int], "LoopbackVan"] = {}
        self._cut: Set["LoopbackVan"] = set()
        self._next_port = first_port
        self._lock = threading.Lock()

    def listen(self, host: str, port: int, van: "LoopbackVan", any_port: bool) -> int:
        with self._lock:
            if port == 0 or ((host, port) in self._listeners and any_port):
                while (host, self._next_port) in self._listeners:
                    self._next_port += 1
                port = self._next_port
            if (host, port) in self._listeners:
                raise ConfigError("%s:%d is already in use" % (host, port))
            self._listeners[(host, port)] = van
            return port

    def leave(self, van: "LoopbackVan") -> None:
        with self._lock:
            for address in [a for a, v in self._listeners.items() if v is van]:
                del self._listeners[address]

    def cut(self, van: "LoopbackVan") -> None:
        """From now on ``van`` neither receives nor sends: a killed node."""
        with self._lock:
            self._cut.add(van)

    def deliver(self, source: "LoopbackVan", address: Tuple[str, int], item) -> None:
        with self._lock:
            target = self._listeners.get(address)
            if source in self._cut or target is None or target in self._cut:
                return          # like a packet to a dead host: gone without a word
        target.inbox.put(item)


class LoopbackVan(Van):
    """A van whose "network" is a :class:`LoopbackNetwork` in this process."""

    def __init__(self, network: LoopbackNetwork):
        self.network = network
        self.my_id = K_EMPTY
        self.inbox: "queue.SimpleQueue" = queue.SimpleQueue()
        self._peers: Dict[int, Tuple[Tuple[str, int], int]] = {}   # id -> (address, my identity)
        self._lock = threading.Lock()
        self._closed = False

    def bind(self, node: Node, max_retry: int) -> int:
        return self.network.listen(node.hostname, node.port, self, any_port=max_retry > 0)

    def connect(self, node: Node, my_id: Optional[int]) -> None:
        if my_id is not None:
            self.my_id = my_id
        identity = K_EMPTY if my_id is None else my_id
        with self._lock:
            self._peers[node.id] = ((node.hostname, node.port), identity)

    def send(self, message: Message) -> int:
        with self._lock:
            peer = None if self._closed else self._peers.get(message.meta.recver)
        if peer is None:
            raise ProtocolError("no connection to node %s" % message.meta.recver)
        address, identity = peer
        meta = encode_meta(message.meta)
        frames = [bytes(memoryview(d).cast("B")) for d in contiguous(message.data)]
        self.network.deliver(self, address, (identity, meta, frames))
        return len(meta) + sum(len(f) for f in frames)

    def run(self, on_message: Callable[[Message], bool], on_tick: Callable[[], None],
            tick_seconds: float) -> None:
        while True:
            try:
                identity, raw, frames = self.inbox.get(timeout=tick_seconds)
            except queue.Empty:
                pass
            else:
                meta = decode_meta(raw, sender=identity, recver=self.my_id)
                if not on_message(Message(meta, [memoryview(f) for f in frames])):
                    return
            on_tick()

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self.network.leave(self)
