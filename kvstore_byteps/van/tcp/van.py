"""The BytePS TCP van (``DMLC_PS_VAN_TYPE=byteps_tcp``): raw sockets, no ZeroMQ.

Wire format: frame.py. Each node listens on one socket; to send to a peer it opens one
connection (as ps-lite's DEALER per peer) and introduces itself with a hello carrying its node
id (hello.py), which is how the receiver learns the sender of every message on that connection.

Sending: header, meta and data frames go out in one non-blocking ``sendmsg`` (scatter/gather,
the data straight from the caller's buffers, no copy in Python); what the socket does not take
at once waits in the peer's queue for the writer thread (outbound.py), so ``send`` never
blocks on a busy link.

Receiving: one thread multiplexes every incoming connection (inbound.py) and never waits on
one of them (reader.py). The header comes first, so each frame's length is known before the
frame arrives: small frames come out of a per-connection read-ahead buffer, large ones are read
with ``recv_into`` straight into a landing buffer from a
:class:`~kvstore_byteps.van.tcp.recv_buffers.RecvBufferPool`, registered at key initialisation and
reused every round. A separate accept thread does the handshake, so a node connecting to a
busy peer never waits on that peer's receive loop.

Every blocking step has a deadline and names the peer it waited for. A ZeroMQ peer (an upstream
MXNet node, or one of ours on ``zmq``) is recognised by its greeting: a node connecting to it
gets a ConfigError saying to use one van everywhere; a listener it connects to logs that error
and, while the cluster is still forming, stops with it (otherwise the cluster would wait for
that node until the start deadline).
"""
import logging
import queue
import random
import selectors
import socket
import threading
import time
from typing import Callable, Dict, Optional

from ...config import Config
from ...errors import (AuthenticationError, ClusterStartError, ConfigError, PeerError,
                      ProtocolError)
from ...logs import PeerLog
from .. import auth
from . import claims, compact, frame as tcp_frame, hello
from ..base import Van
from ..wire.codec import decode_meta, encode_meta
from ..wire.message import K_EMPTY, Gather, Message, Node, connection_closed
from .inbound import LAND_IN_PLACE_BYTES, Inbound
from .recv_buffers import RecvBufferPool
from .outbound import Outbound, Writer

log = logging.getLogger(__name__)

_HANDSHAKE_SECONDS = 10.0
_CONNECT_RETRY_SECONDS = 0.1
_ACCEPT_POLL_SECONDS = 0.2


def _take_all(items: "queue.SimpleQueue"):
    """Everything queued now, without waiting."""
    while True:
        try:
            yield items.get_nowait()
        except queue.Empty:
            return


class TcpVan(Van):
    """BytePS TCP transport; talks to byteps_tcp nodes only."""

    #: whether this node's connections carry RDMA channels (its hello says so)
    rdma = False
    #: ``send`` queues what the socket does not take (outbound.py; RDMA: what credits do not
    #: cover) and returns
    handlers_inline_ok = True

    def __init__(self, config: Config, pool: Optional[RecvBufferPool] = None):
        self.config = config
        self.pool = pool if pool is not None else RecvBufferPool(LAND_IN_PLACE_BYTES)
        self.my_id = K_EMPTY
        self.io_timeout = config.request_timeout
        self._listener: Optional[socket.socket] = None
        self._out: Dict[int, Outbound] = {}
        self._out_lock = threading.Lock()
        self._writer = Writer(self.io_timeout)
        self._accepted: "queue.SimpleQueue" = queue.SimpleQueue()
        self._wake_r, self._wake_w = socket.socketpair()
        self._closed = threading.Event()
        self._interrupted = False
        self._forming = True
        self._accept_thread: Optional[threading.Thread] = None
        self._claims = claims.Claims()
        self._held: set = set()          # connections not read (claims.py); receive thread
        self._selector = None            # the receive loop's, while it runs
        self._peer_log = PeerLog(log)
        self._mac_key = auth.hmac_key(config.auth_key) if config.auth else None

    def describe(self) -> str:
        return self.config.van_type.value   # p3 / byteps_rdma for the subclasses

    # ------------------------------------------------------------------ binding
    def bind(self, node: Node, max_retry: int) -> int:
        port, error = node.port, None
        for _ in range(max_retry + 1):
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                listener.bind((node.hostname or "", port))
                listener.listen(1024)
            except OSError as exc:
                listener.close()
                error = exc
                port = random.randrange(10000, 50000)
                continue
            listener.settimeout(_ACCEPT_POLL_SECONDS)
            self._listener = listener
            self._accept_thread = threading.Thread(target=self._accept_loop, daemon=True,
                                                   name="tcp-van-accept")
            self._accept_thread.start()
            return listener.getsockname()[1]
        raise ConfigError("cannot bind %s:%d (%s) after %d attempt(s): %s"
                          % (node.hostname, node.port, node.role.name.lower(), max_retry + 1,
                             error))

    def on_ready(self) -> None:
        self._forming = False

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                sock, address = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            threading.Thread(target=self._handshake, args=(sock, "%s:%d" % address[:2]),
                             daemon=True, name="tcp-van-handshake").start()

    def _handshake(self, sock: socket.socket, address: str) -> None:
        what = "the peer at %s" % address
        try:
            sock.settimeout(_HANDSHAKE_SECONDS)
            hello.tune(sock)
            peer_id = hello.exchange_hellos(sock, self.my_id, self._mac_key, auth.ACCEPTOR, what,
                                      self.rdma)
            inbound = self._inbound(sock, peer_id, address, what)
        except ConfigError as exc:   # AuthenticationError, or a ZeroMQ peer
            sock.close()
            if isinstance(exc, AuthenticationError) or self._mac_key is not None:
                # a peer that did not prove the key is a stranger: it must not stop the cluster
                self._peer_log.error(address.rsplit(":", 1)[0], "refused a connection: %s", exc)
                return
            log.error("%s", exc)
            if self._forming:
                self._accepted.put(exc)
                self._wake()
            return
        except (OSError, PeerError, ProtocolError) as exc:
            self._peer_log.warning(address.rsplit(":", 1)[0], "dropped a connection from %s: %s",
                                   address, exc)
            sock.close()
            return
        self._accepted.put(inbound)
        self._wake()

    def _inbound(self, sock: socket.socket, peer_id: int, address: str, what: str) -> Inbound:
        """(Accept side, after the hellos.) What reads the connection."""
        return Inbound(sock, peer_id, address, self.pool)

    def _outbound(self, sock: socket.socket, what: str) -> Outbound:
        """(Connect side, after the hellos.) What sends on the connection."""
        return Outbound(sock, what)

    def interrupt(self) -> None:
        # A connection to itself is held like any other until the node list admits it
        # (claims.py), so a scheduler stopped while forming never read its own TERMINATE.
        self._interrupted = True
        self._wake()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass

    # ------------------------------------------------------------------ sending
    def connect(self, node: Node, my_id: Optional[int]) -> None:
        if my_id is not None:
            self.my_id = my_id
        what = "%s %s at %s" % (node.role.name.lower(),
                                "?" if node.id == K_EMPTY else node.id, node.address)
        deadline = time.monotonic() + self.config.start_timeout
        while True:
            try:
                sock = socket.create_connection((node.hostname, node.port),
                                                timeout=_HANDSHAKE_SECONDS)
                break
            except OSError as exc:
                if time.monotonic() >= deadline:
                    error = ClusterStartError if my_id is None else PeerError
                    raise error("cannot connect to %s within %.0f s (BYTEPS_START_TIMEOUT): %s"
                                % (what, self.config.start_timeout, exc)) from None
                time.sleep(_CONNECT_RETRY_SECONDS)
        try:
            hello.tune(sock)
            hello.exchange_hellos(sock, self.my_id if my_id is not None else K_EMPTY, self._mac_key,
                            auth.CONNECTOR, what, self.rdma)
            out = self._outbound(sock, what)
        except BaseException:
            sock.close()
            raise
        with self._out_lock:
            old = self._out.get(node.id)
            self._out[node.id] = out
        if old is not None:
            old.close()

    def send(self, message: Message) -> int:
        recver = message.meta.recver
        out = self._out.get(recver)
        if out is None or self._closed.is_set():
            raise ProtocolError("no connection to node %s" % recver)
        meta = compact.encode(message.meta) or encode_meta(message.meta)
        lengths, pieces = [], []        # a Gather frame goes out in its pieces (sendmsg)
        for d in message.data:
            if isinstance(d, Gather):
                parts = [memoryview(piece).cast("B") for piece in d]
                lengths.append(sum(p.nbytes for p in parts))
                pieces.extend(parts)
            else:
                view = memoryview(d).cast("B")
                lengths.append(view.nbytes)
                pieces.append(view)
        header = tcp_frame.encode_header(meta, lengths)
        buffers = [memoryview(header + meta)] + pieces
        total = sum(b.nbytes for b in buffers)
        if out.send(buffers):
            self._writer.watch(out)
        return total

    # ------------------------------------------------------------------ receiving
    def run(self, on_message: Callable[[Message], bool], on_tick: Callable[[], None],
            tick_seconds: float) -> None:
        selector = self._selector = selectors.DefaultSelector()
        selector.register(self._wake_r, selectors.EVENT_READ, None)
        try:
            while True:
                for key, _ in selector.select(tick_seconds):
                    inbound = key.data
                    if inbound is None:
                        if self._interrupted:
                            return
                        self._register_accepted(selector)
                    elif not self._drain(inbound, selector, on_message):
                        return
                on_tick()
        finally:
            for key in list(selector.get_map().values()):
                if key.data is not None:
                    key.data.sock.close()
            for inbound in self._held:
                inbound.sock.close()
            selector.close()

    def _register_accepted(self, selector) -> None:
        try:
            self._wake_r.recv(4096)
        except OSError:
            pass
        for item in _take_all(self._accepted):
            if isinstance(item, BaseException):
                raise item
            decision, replaced, why = self._claims.admit(item, item.peer_id, time.monotonic())
            if replaced is not None:
                self._held.discard(replaced)
                replaced.sock.close()
            if decision == claims.READ:
                selector.register(item.sock, selectors.EVENT_READ, item)
                continue
            self._peer_log.warning(item.peer_key(), "connection from %s %s: %s",
                                   item.describe(), "held" if decision == claims.HOLD
                                   else "refused", why)
            if decision == claims.HOLD:
                self._held.add(item)
            else:
                item.sock.close()

    def on_nodes(self, nodes) -> None:
        """(Receive thread.) The cluster's node list: who may speak for which id (claims.py)."""
        close, read = self._claims.nodes_changed(nodes, time.monotonic())
        for inbound in close:
            self._peer_log.warning(inbound.peer_key(), "dropped the connection from %s: its "
                                   "node id is no node of the cluster, or moved", inbound.describe())
            self._forget(inbound)
        for inbound in read:
            self._read_held(inbound)

    def _read_held(self, inbound: Inbound) -> None:
        self._held.discard(inbound)
        self._selector.register(inbound.sock, selectors.EVENT_READ, inbound)

    def _forget(self, inbound: Inbound) -> None:
        """Close a connection, read or held (receive thread)."""
        if inbound in self._held:
            self._held.discard(inbound)
        else:
            try:
                self._selector.unregister(inbound.sock)
            except (KeyError, ValueError):
                pass
        inbound.sock.close()

    def _drain(self, inbound: Inbound, selector, on_message) -> bool:
        """Deliver every message the connection has completed; False once ``on_message``
        says stop. Never waits: the rest of a message comes with the next readiness event."""
        reader = inbound.reader
        try:
            messages = reader.read(inbound.sock.recv_into)
        except OSError as exc:
            messages, reader.failure = [], exc
        if reader.failure is None:
            try:
                inbound.wake_for(reader.frame_bytes_missing)
            except OSError as exc:
                reader.failure = exc
        for meta_raw, data in messages:
            try:
                meta = (compact.decode if compact.is_compact(meta_raw) else decode_meta)(
                    meta_raw, inbound.peer_id, self.my_id)
            except ProtocolError as exc:
                self._peer_log.warning(inbound.peer_key(),
                                       "dropped a malformed message from %s: %s",
                                       inbound.describe(), exc)
                continue
            if not on_message(Message(meta, data)):
                return False
        if reader.failure is not None:
            if isinstance(reader.failure, EOFError):
                if reader.in_message:
                    self._peer_log.warning(inbound.peer_key(), "%s closed the connection in "
                                           "the middle of a message", inbound.describe())
            else:
                self._peer_log.warning(inbound.peer_key(),
                                       "connection from %s closed: %s", inbound.describe(),
                                       reader.failure)
            selector.unregister(inbound.sock)
            inbound.sock.close()
            successor = self._claims.closed(inbound)
            if successor is not None:
                self._read_held(successor)
            elif inbound.peer_id != K_EMPTY:    # the peer may be gone: membership decides
                return on_message(connection_closed(inbound.peer_id, self.my_id))
        return True

    def register_recv_buffer(self, key: int, nbytes: int) -> None:
        self.pool.register(key, nbytes)

    def expect_frame(self, key: int, target):
        return self.pool.expect(key, target)

    def revoke_frame(self, handle) -> None:
        self.pool.revoke(handle)

    # ------------------------------------------------------------------ shutdown
    def close(self) -> None:
        self._closed.set()
        if self._listener is not None:
            self._listener.close()
        if self._accept_thread is not None:
            self._accept_thread.join(_ACCEPT_POLL_SECONDS * 5)
        self._writer.close()
        with self._out_lock:
            outs, self._out = list(self._out.values()), {}
        for out in outs:
            out.close()
        for item in _take_all(self._accepted):
            if isinstance(item, Inbound):
                item.sock.close()
        self._wake_r.close()
        self._wake_w.close()
