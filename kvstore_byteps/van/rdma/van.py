"""The BytePS RDMA van (``DMLC_PS_VAN_TYPE=byteps_rdma``): reliable-connected queue pairs.

Connections are made as byteps_tcp makes them (van/tcp/van.py, van/tcp/hello.py: one per peer
and direction, a hello with the node id, authentication, a ZeroMQ peer refused with a clear error), and then
each side tells the other its channel (wire.ChannelInfo: device address, queue pair,
receive slots, where to write credits) over that TCP connection, which afterwards carries
nothing: it stays open so that a peer's exit is seen at once, and the claims of van/tcp/van.py
(which connection speaks for which node) apply to it unchanged. Messages travel on the queue
pair (channel.py: SENDs into posted receives, large frames RDMA-written into landing
buffers of the byteps_tcp pool, credits, in-order delivery).

One receive thread polls the completion queue shared by all channels, delivers the messages
of accepted connections, watches the TCP sockets and pumps what waits for credits.

Devices: ``BYTEPS_RDMA_DEVICE=soft`` (verbs/soft.py, in-host, for tests), or a real one
through pyverbs (verbs/pyverbs_provider.py; the first device unless named). Without pyverbs
or without a device the van fails at start with one line naming what is missing.
"""
import logging
import selectors
import socket
import struct
import threading
import time
from typing import Callable, Dict, List

from ...config import Config
from ...errors import ProtocolError
from ..wire.codec import decode_meta, encode_meta
from ..wire.message import Message, contiguous
from .channel import Channel
from .regions import RegistrationCache
from .wire import ChannelInfo
from ..tcp.outbound import Outbound
from ..tcp.hello import recv_exactly
from ..tcp.inbound import Inbound
from ..tcp.van import TcpVan
from .verbs.api import WCOpcode, WCStatus

log = logging.getLogger(__name__)

_INFO_LENGTH = struct.Struct("<I")
_MAX_INFO_BYTES = 4096
#: the receive loop's wait while a channel waits for credits
_CREDIT_WAIT_S = 0.001
#: a retired connection is closed at the latest this long after its last send
_RETIRE_S = 10.0
_CQ_DEPTH = 1 << 16
#: completions that mean a message (part) arrived
_ARRIVALS = (WCOpcode.RECV, WCOpcode.RECV_RDMA_WITH_IMM)


def open_device(config: Config):
    """``(fabric, device)`` for BYTEPS_RDMA_DEVICE: ``soft``, or a real device through pyverbs
    (unset: the first one); ConfigError in one line if there is none."""
    if config.rdma_device == "soft":
        from .verbs.soft_fabric import UnixFabric
        fabric = UnixFabric()
        return fabric, fabric.device()
    from .verbs.pyverbs_provider import PyverbsDevice
    device = PyverbsDevice(config.rdma_device, config.rdma_port, config.rdma_gid_index)
    return device, device


class _Connection:
    """A channel and the lock every call into it takes (send, the receive loop)."""

    def __init__(self, channel: Channel):
        self.channel, self.lock = channel, threading.Lock()
        self._reported = False

    def report_failure(self) -> None:
        """Log the channel's failure, once (a failed channel is otherwise silent until its
        peer's socket closes)."""
        if self.channel.failure is not None and not self._reported:
            self._reported = True
            log.warning("%s", self.channel.failure)


class _RdmaOutbound(Outbound):
    """The sending side of a connection: its channel; the socket only shows the peer's exit.

    Closing it (a replaced connection, the van's end) retires it: what was sent still goes
    out (as a closed TCP socket still delivers what it holds) and it is closed once its
    channel is idle, or after :data:`_RETIRE_S`."""

    def __init__(self, sock: socket.socket, peer: str, connection: _Connection, retire):
        super().__init__(sock, peer)
        self.connection, self._retire = connection, retire
        self.retired_at = None

    def close(self) -> None:
        self.retired_at = time.monotonic()
        self._retire(self)

    def finish(self) -> None:
        with self.connection.lock:
            self.connection.channel.qp.to_error()
        super().close()


class _RdmaInbound(Inbound):
    """An accepted connection: its channel delivers the messages."""

    def __init__(self, sock, peer_id, address, pool, connection: _Connection):
        super().__init__(sock, peer_id, address, pool)
        self.connection = connection


class RdmaVan(TcpVan):
    """BytePS RDMA transport; talks to byteps_rdma nodes only."""

    rdma = True

    def __init__(self, config: Config):
        super().__init__(config)
        self._fabric, self._device = open_device(config)
        self._pd = self._device.alloc_pd()
        self._cq = self._device.create_cq(_CQ_DEPTH)
        #: one per protection domain: every channel's pieces and landings
        self.registrations = RegistrationCache(self._pd, config.rdma_registration_cache)
        #: whether the completion queue has a descriptor to wait on (old pyverbs: polled)
        self._cq_waitable = self._cq.fileno() is not None
        self._connections: Dict[int, _Connection] = {}      # by queue pair number
        self._connections_lock = threading.Lock()
        self._retiring: List[_RdmaOutbound] = []          # closed, still sending

    # ------------------------------------------------------------------ connecting
    def _channel(self, sock: socket.socket, what: str, accepting: bool) -> _Connection:
        """Exchange channel infos over the handshake's socket; the connected channel. The
        accepting side connects its queue pair before it sends its info, and the connecting
        side sends nothing before it got that info: no packet finds a queue pair not yet
        ready to receive (which fails it at once: no retries). The connection is known to
        the receive loop before the peer can send: the peer's first message may complete
        before this thread runs again, and a completion of an unknown queue pair is lost."""
        channel = Channel(self._device, self._pd, self._cq, landing=self.pool.take,
                          registrations=self.registrations)
        info = channel.info().encode()
        if not accepting:
            sock.sendall(_INFO_LENGTH.pack(len(info)) + info)
        (length,) = _INFO_LENGTH.unpack(recv_exactly(sock, _INFO_LENGTH.size, what))
        if length > _MAX_INFO_BYTES:
            raise ProtocolError("%s sent an RDMA channel info of %d bytes" % (what, length))
        channel.connect(ChannelInfo.decode(recv_exactly(sock, length, what)))
        connection = _Connection(channel)
        with self._connections_lock:
            self._connections[channel.qp.qp_num] = connection
        if accepting:
            try:
                sock.sendall(_INFO_LENGTH.pack(len(info)) + info)
            except BaseException:
                with self._connections_lock:
                    self._forget_connection(connection)
                raise
        return connection

    def _inbound(self, sock, peer_id, address, what):
        return _RdmaInbound(sock, peer_id, address, self.pool,
                            self._channel(sock, what, accepting=True))

    def _outbound(self, sock, what):
        return _RdmaOutbound(sock, what, self._channel(sock, what, accepting=False),
                             self._retire)

    def _retire(self, out: _RdmaOutbound) -> None:
        with self._connections_lock:
            self._retiring.append(out)
        self._wake()

    def _finish_retired(self, everything: bool = False) -> None:
        """Close the retired connections whose channel is idle (all, with ``everything``)."""
        now = time.monotonic()
        with self._connections_lock:
            done = [out for out in self._retiring if everything or now - out.retired_at >
                    _RETIRE_S or out.connection.channel.idle]
            self._retiring = [out for out in self._retiring if out not in done]
            for out in done:
                self._forget_connection(out.connection)
        for out in done:
            out.finish()

    def _forget_connection(self, connection: _Connection) -> None:
        """(Under ``_connections_lock``.) Stop routing completions to ``connection``; a queue
        pair number may already name a newer connection (hardware reuses them)."""
        qp_num = connection.channel.qp.qp_num
        if self._connections.get(qp_num) is connection:
            del self._connections[qp_num]

    # ------------------------------------------------------------------ sending
    def send(self, message: Message) -> int:
        out = self._out.get(message.meta.recver)
        if out is None or self._closed.is_set():
            raise ProtocolError("no connection to node %s" % message.meta.recver)
        pieces = [encode_meta(message.meta)] + [memoryview(d).cast("B")
                                                for d in contiguous(message.data)]
        try:
            with out.connection.lock:
                out.connection.channel.send(pieces)
                waiting = out.connection.channel.waiting
        finally:
            out.connection.report_failure()
        if waiting:               # the receive loop posts it once credits come: wake it
            self._wake()
        return sum(memoryview(p).nbytes for p in pieces)

    # ------------------------------------------------------------------ receiving
    def run(self, on_message: Callable[[Message], bool], on_tick: Callable[[], None],
            tick_seconds: float) -> None:
        selector = self._selector = selectors.DefaultSelector()
        selector.register(self._wake_r, selectors.EVENT_READ, None)
        if self._cq_waitable:
            selector.register(self._cq, selectors.EVENT_READ, self._cq)
        ticked = time.monotonic()
        try:
            while True:
                busy = self._poll()
                if not self._deliver(selector, on_message):
                    return
                if not busy:                 # arm, then look once more (no lost wake-up)
                    self._cq.req_notify()
                    busy = self._poll()
                self._finish_retired()
                closed = []
                for key, _ in selector.select(0 if busy else self._wait(tick_seconds)):
                    if key.data is self._cq:
                        self._cq.ack_events()
                    elif key.data is None:
                        self._register_accepted(selector)
                    elif self._watch(key.data):
                        closed.append(key.data)
                if closed:                   # what they sent before closing comes first
                    self._poll()
                    if not self._deliver(selector, on_message):
                        return
                    for inbound in closed:
                        self._drop(inbound, selector)
                if time.monotonic() - ticked >= tick_seconds:
                    on_tick()
                    ticked = time.monotonic()
        finally:
            for key in list(selector.get_map().values()):
                if isinstance(key.data, _RdmaInbound):
                    key.data.sock.close()
            for inbound in self._held:
                inbound.sock.close()
            selector.close()

    def _wait(self, tick_seconds: float) -> float:
        """How long the loop may sleep: until an event, or briefly while a channel waits for
        credits (they arrive as the peer's writes, which raise no completion here), or
        always briefly where the completion queue has no descriptor to wait on (old pyverbs)."""
        if not self._cq_waitable:
            return min(tick_seconds, _CREDIT_WAIT_S)
        with self._connections_lock:
            connections = list(self._connections.values())
        if self._retiring or any(connection.channel.waiting for connection in connections):
            return _CREDIT_WAIT_S
        return tick_seconds

    def _poll(self) -> bool:
        """Hand every completion to its channel and post what waits; whether any came."""
        completions = self._cq.poll(256)
        with self._connections_lock:
            connections = dict(self._connections)
        for completion in completions:
            connection = connections.get(completion.qp_num)
            if connection is None:
                # flushed work of a connection already closed is expected; a message is not
                if completion.status is WCStatus.SUCCESS and completion.opcode in _ARRIVALS:
                    log.error("a message arrived on queue pair %d, which no connection owns: "
                              "it is lost", completion.qp_num)
                continue
            with connection.lock:
                connection.channel.on_completion(completion)
            connection.report_failure()
        for connection in connections.values():
            with connection.lock:
                connection.channel.pump()
            connection.report_failure()
        return bool(completions)

    def _deliver(self, selector, on_message) -> bool:
        """Deliver the messages of the accepted connections being read (van/tcp/claims.py)."""
        for key in list(selector.get_map().values()):
            inbound = key.data
            if not isinstance(inbound, _RdmaInbound):
                continue
            delivered = inbound.connection.channel.delivered
            while delivered:
                meta_raw, *data = delivered.popleft()
                try:
                    meta = decode_meta(meta_raw, sender=inbound.peer_id, recver=self.my_id)
                except ProtocolError as exc:
                    self._peer_log.warning(inbound.peer_key(), "dropped a malformed message "
                                           "from %s: %s", inbound.describe(), exc)
                    continue
                if not on_message(Message(meta, data)):
                    return False
        return True

    def _watch(self, inbound: _RdmaInbound) -> bool:
        """The TCP socket of an accepted connection became readable: whether the peer left
        (or broke the protocol: nothing follows the handshake)."""
        try:
            data = inbound.sock.recv(4096)
        except BlockingIOError:
            return False
        except OSError as exc:
            data, error = b"", exc
        else:
            error = "bytes after the handshake" if data else None
        failure = inbound.connection.channel.failure
        if error is not None or failure is not None:    # a plain close is a peer leaving
            self._peer_log.warning(inbound.peer_key(), "connection from %s closed: %s",
                                   inbound.describe(), error or failure)
        return True

    def _drop(self, inbound: _RdmaInbound, selector) -> None:
        selector.unregister(inbound.sock)
        inbound.sock.close()
        with self._connections_lock:
            self._forget_connection(inbound.connection)
        successor = self._claims.closed(inbound)
        if successor is not None:
            self._read_held(successor)

    def close(self) -> None:
        super().close()
        self._finish_retired(everything=True)
        log.debug("memory registrations: %d made, %d served from the cache, %d cached",
                  self.registrations.registered, self.registrations.reused,
                  len(self.registrations))
        self.registrations.close()
        self._cq.close()
        self._fabric.close()
