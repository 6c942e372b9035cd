"""ZeroMQ van speaking MXNet 1.9.1 ps-lite's wire format (docs/pslite-wire.md §1).

One ROUTER socket receives; one DEALER per peer sends, with identity ``ps<my id>`` once the id is
known. A message is ``[PBMeta] + data frames``; data frames go out without copying (pyzmq keeps the
buffer alive until libzmq is done with it) and come in as zmq frames exposed as memoryviews.

Threading: the ROUTER belongs to the thread in ``run``; DEALERs are used under a per-peer lock by
any thread and closed in ``close`` after the receive loop ended, never while another thread may
be using them.
"""
import logging
import random
import threading
import time
from typing import Callable, Dict, Optional

from ...config import Config
from ...errors import ConfigError, DeadlineError, ProtocolError
from ...logs import PeerLog
from ..base import Van
from ..wire.codec import decode_meta, encode_meta
from ..wire.message import K_EMPTY, Message, Node, contiguous

log = logging.getLogger(__name__)

# Below this size pyzmq copies anyway; above it we hand libzmq the buffer itself.
_ZERO_COPY_MIN_BYTES = 16384
# While the cluster forms, how long a send that cannot go out yet waits before trying again.
_FORMING_RETRY_S = 0.02


def _zmq():
    try:
        import zmq
    except ImportError:  # pragma: no cover - pyzmq is a hard dependency
        raise ImportError("the zmq van needs pyzmq: pip install pyzmq") from None
    return zmq


def parse_identity(identity: bytes) -> int:
    """ps-lite's rule: ``ps<digits>`` is that node id; anything else is kEmpty."""
    if len(identity) > 2 and identity.startswith(b"ps") and identity[2:].isdigit():
        return int(identity[2:])
    return K_EMPTY


class ZMQVan(Van):
    """ps-lite-compatible ZeroMQ transport."""

    def __init__(self, config: Config):
        self._zmq = _zmq()
        self.config = config
        self.context = self._zmq.Context()
        self.context.set(self._zmq.MAX_SOCKETS, 65536)
        self.receiver = None
        self.my_id = K_EMPTY
        self._senders: Dict[int, object] = {}
        self._locks: Dict[int, threading.Lock] = {}
        self._senders_lock = threading.Lock()
        self._closed = False
        self._forming = True
        self._peer_log = PeerLog(log)
        self._curve = None
        self._keyless = None
        if config.auth:     # BYTEPS_AUTH_KEY: CURVE on every socket (auth.py)
            from .auth import CurveAuth
            self._curve = CurveAuth(self._zmq, self.context, config.auth_key)
        else:               # no key: a peer that requires one is told apart while forming
            from .auth import KeylessWatch
            self._keyless = KeylessWatch(self._zmq)

    def describe(self) -> str:
        return self.config.van_type.value   # p3 / byteps_rdma for the subclasses

    # ------------------------------------------------------------------ binding
    def _address(self, host: str, port: int) -> str:
        if self.config.local_ipc:
            return "ipc:///tmp/%d" % port
        return "tcp://%s:%d" % (host or "*", port)

    def bind(self, node: Node, max_retry: int) -> int:
        zmq = self._zmq
        self.receiver = self.context.socket(zmq.ROUTER)
        self.receiver.setsockopt(zmq.LINGER, 0)
        if self._curve is not None:
            self._curve.make_server(self.receiver)
        port = node.port
        for attempt in range(max_retry + 1):
            try:
                self.receiver.bind(self._address(node.hostname, port))
                return port
            except zmq.ZMQError as exc:
                error = exc
                port = random.randrange(10000, 50000)
        self.receiver.close(0)
        raise ConfigError("cannot bind %s (%s) after %d attempt(s): %s"
                          % (self._address(node.hostname, node.port), node.role.name.lower(),
                             max_retry + 1, error))

    # ------------------------------------------------------------------ sending
    def connect(self, node: Node, my_id: Optional[int]) -> None:
        zmq = self._zmq
        socket = self.context.socket(zmq.DEALER)
        if my_id is not None:
            self.my_id = my_id
            socket.setsockopt(zmq.IDENTITY, b"ps%d" % my_id)
            if self.config.water_mark:
                socket.setsockopt(zmq.SNDHWM, self.config.water_mark)
        what = "%s %s at %s" % (node.role.name.lower(), "?" if node.id == K_EMPTY else node.id,
                                node.address)
        with self._senders_lock:
            lock = self._locks.setdefault(node.id, threading.Lock())
        if self._curve is not None:
            self._curve.make_client(socket, what)
        elif self._forming:
            self._keyless.watch(socket, what, lock)
        socket.connect(self._address(node.hostname, node.port))
        with lock:
            old = self._senders.get(node.id)
            self._senders[node.id] = socket
        if old is not None:
            old.close(0)

    def send(self, message: Message) -> int:
        recver = message.meta.recver
        lock = self._locks.get(recver)
        if lock is None:
            raise ProtocolError("no connection to node %s" % recver)
        frames = [encode_meta(message.meta)]
        frames.extend(contiguous(message.data))
        copy = message.data_bytes() < _ZERO_COPY_MIN_BYTES
        with lock:
            socket = self._senders.get(recver)
            if socket is None or self._closed:
                raise ProtocolError("connection to node %s is closed" % recver)
            if self._forming:
                self._send_forming(socket, frames, copy, recver)
            else:
                socket.send_multipart(frames, copy=copy)
        return len(frames[0]) + message.data_bytes()

    def _send_forming(self, socket, frames, copy: bool, recver: int) -> None:
        """Send while the cluster forms, never blocking for good: a handshake that fails (the
        peer requires a key this node lacks, or holds another) ends that connection for good,
        and a DEALER without a connection blocks in send forever; when the receive thread sends
        its hello after that, it would never tick to tell why (seen in CI: a keyless worker
        ended by the start deadline with no reason). So: try without blocking, raise the
        handshake failure as soon as it is known, give up at BYTEPS_START_TIMEOUT."""
        zmq = self._zmq
        deadline = time.monotonic() + self.config.start_timeout
        while True:
            try:
                socket.send_multipart(frames, copy=copy, flags=zmq.NOBLOCK)
                return
            except zmq.Again:
                pass
            failure = self._handshake_failure()
            if failure is not None:
                raise failure
            if time.monotonic() >= deadline:
                raise DeadlineError(
                    "could not send to node %s within %.0f s (BYTEPS_START_TIMEOUT): its "
                    "connection never completed" % (recver, self.config.start_timeout))
            time.sleep(_FORMING_RETRY_S)

    def _handshake_failure(self):
        if self._curve is not None:
            return self._curve.take_failure()
        if self._keyless is not None:
            return self._keyless.failure()
        return None

    # ------------------------------------------------------------------ receiving
    def run(self, on_message: Callable[[Message], bool], on_tick: Callable[[], None],
            tick_seconds: float) -> None:
        zmq = self._zmq
        poller = zmq.Poller()
        poller.register(self.receiver, zmq.POLLIN)
        timeout_ms = max(1, int(tick_seconds * 1000))
        while True:
            if poller.poll(timeout_ms):
                message = self._receive_one()
                if message is not None and not on_message(message):
                    break
            if self._curve is not None:
                self._check_handshakes()
            elif self._keyless is not None:
                self._check_keyless()
            on_tick()

    def on_ready(self) -> None:
        self._forming = False

    def _check_handshakes(self) -> None:
        """A peer this node connected to refused its credentials (or has none): while the
        cluster forms that stops this node with the reason; later it is logged (the request
        that cannot be delivered fails at its deadline, naming the node)."""
        failure = self._curve.take_failure()
        if failure is None:
            return
        if self._forming:
            raise failure
        self._peer_log.error(str(failure), "%s", failure)

    def _check_keyless(self) -> None:
        """While the cluster forms, a peer that requires a key stops this keyless node."""
        if not self._forming:
            self._keyless.close()      # and any socket connected later is not watched
            return
        failure = self._keyless.failure()
        if failure is not None:
            raise failure

    def _receive_one(self) -> Optional[Message]:
        frames = self.receiver.recv_multipart(copy=False)
        sender = parse_identity(frames[0].bytes)
        if len(frames) < 2:
            self._peer_log.warning(frames[0].bytes, "dropped a message without meta frame from %r",
                                   frames[0].bytes)
            return None
        try:
            meta = decode_meta(frames[1].buffer, sender=sender, recver=self.my_id)
        except ProtocolError as exc:
            self._peer_log.warning(frames[0].bytes, "dropped a malformed message from %r: %s",
                                   frames[0].bytes, exc)
            return None
        return Message(meta, [frame.buffer for frame in frames[2:]])

    # ------------------------------------------------------------------ shutdown
    def close(self) -> None:
        with self._senders_lock:
            self._closed = True
            locks = dict(self._locks)
        for node_id, lock in locks.items():
            with lock:
                socket = self._senders.pop(node_id, None)
            if socket is not None:
                socket.close(0)
        if self.receiver is not None:
            self.receiver.close(0)
        if self._curve is not None:
            self._curve.close()
        if self._keyless is not None:
            self._keyless.close()
        self.context.term()
