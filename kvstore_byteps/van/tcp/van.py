"""The BytePS TCP van (``DMLC_PS_VAN_TYPE=byteps_tcp``): raw sockets, no ZeroMQ.

Wire format: frame.py. Each node listens on one socket; to send to a peer it opens one
connection (as ps-lite's DEALER per peer) and introduces itself with a hello carrying its node
id, which is how the receiver learns the sender of every message on that connection.

Sending: header, meta and data frames go out in one non-blocking ``sendmsg`` (scatter/gather,
the data straight from the caller's buffers, no copy in Python); what the socket does not take
at once waits in the peer's queue for the writer thread (outbound.py), so ``send`` never
blocks on a busy link.

Receiving: one thread multiplexes every incoming connection and never waits on one of them
(reader.py). The header comes first, so each frame's length is known before the frame
arrives: small frames come out of a per-connection read-ahead buffer, large ones are read with
``recv_into`` straight into a landing buffer from a
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
from . import claims, compact, frame as tcp_frame
from ..base import Van
from ..wire.codec import decode_meta, encode_meta
from ..wire.message import K_EMPTY, Gather, Message, Node
from .recv_buffers import RecvBufferPool
from .outbound import Outbound, Writer
from .reader import MessageReader

log = logging.getLogger(__name__)

_HANDSHAKE_SECONDS = 10.0
_CONNECT_RETRY_SECONDS = 0.1
_ACCEPT_POLL_SECONDS = 0.2
# Frames below this size are copied out of the read-ahead buffer; larger ones land in place.
_LAND_IN_PLACE_BYTES = 65536


def _tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _recv_exactly(sock: socket.socket, size: int, what: str) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise PeerError("%s closed the connection after %d of %d bytes"
                            % (what, len(data), size))
        data += chunk
    return bytes(data)


def read_hello(sock: socket.socket, what: str) -> tcp_frame.Hello:
    """Read and check a peer's hello. ConfigError for a ZeroMQ peer."""
    first = _recv_exactly(sock, tcp_frame.ZMTP_SIGNATURE_BYTES, what)
    if tcp_frame.is_zmtp_signature(first):
        try:
            tcp_frame.decode_hello(first)
        except ProtocolError as exc:
            raise ConfigError("%s %s" % (what, exc)) from None
    rest = _recv_exactly(sock, tcp_frame.HELLO_BYTES - len(first), what)
    try:
        return tcp_frame.decode_hello(first + rest)
    except ProtocolError as exc:
        raise ProtocolError("%s %s" % (what, exc)) from None


def exchange_hellos(sock: socket.socket, my_id: int, mac_key: Optional[bytes], side: bytes,
                    what: str, rdma: bool = False) -> int:
    """Send this node's hello, read the peer's and, with ``mac_key`` (BYTEPS_AUTH_KEY), run the
    mutual proof of auth.py; the peer's node id. AuthenticationError when the peer does not
    authenticate, or proves nothing, or the two sides disagree on whether to authenticate."""
    nonce = auth.new_nonce() if mac_key else b""
    sock.sendall(tcp_frame.encode_hello(my_id, auth=mac_key is not None, rdma=rdma) + nonce)
    hello = read_hello(sock, what)
    if hello.rdma != rdma:
        names = ("DMLC_PS_VAN_TYPE=byteps_rdma", "DMLC_PS_VAN_TYPE=byteps_tcp")
        raise ConfigError("%s uses %s but this node %s; every node of a cluster must use the "
                          "same van" % ((what,) + (names if hello.rdma else names[::-1])))
    if mac_key is None:
        if hello.auth:
            raise AuthenticationError("%s requires authentication (it has BYTEPS_AUTH_KEY) but "
                                      "this node has no key; give every node the same "
                                      "BYTEPS_AUTH_KEY or BYTEPS_AUTH_KEY_FILE" % what)
        return hello.node_id
    if not hello.auth:
        raise AuthenticationError("%s does not authenticate (it has no BYTEPS_AUTH_KEY) but this "
                                  "node requires it" % what)
    peer_nonce = _recv_exactly(sock, auth.NONCE_BYTES, what)
    sock.sendall(auth.tcp_proof(mac_key, side, nonce, peer_nonce))
    proof = _recv_exactly(sock, auth.PROOF_BYTES, what)
    peer_side = auth.ACCEPTOR if side == auth.CONNECTOR else auth.CONNECTOR
    if not auth.tcp_proof_ok(mac_key, peer_side, peer_nonce, nonce, proof):
        raise AuthenticationError("%s failed authentication: it holds a different "
                                  "BYTEPS_AUTH_KEY" % what)
    return hello.node_id


def _take_all(items: "queue.SimpleQueue"):
    """Everything queued now, without waiting."""
    while True:
        try:
            yield items.get_nowait()
        except queue.Empty:
            return


#: SO_RCVLOWAT bounds while a large frame arrives (below the minimum, waking is cheap
#: enough; the kernel caps it at half the largest receive buffer anyway)
_MIN_LOW_WATER = 32768
_MAX_LOW_WATER = 1 << 20
#: SO_RCVBUF is read again after this many large frames (it only grows, by autotuning)
_RCVBUF_READ_EVERY = 64


class _Inbound:
    """One accepted connection: its peer and the reader of its stream."""

    def __init__(self, sock: socket.socket, peer_id: int, address: str, pool: RecvBufferPool):
        sock.setblocking(False)
        self.sock, self.peer_id, self.address = sock, peer_id, address
        self.reader = MessageReader(pool, _LAND_IN_PLACE_BYTES)
        self.low_water = 1          # the socket's SO_RCVLOWAT
        self._room = 0              # a quarter of SO_RCVBUF, as last read
        self._room_reads = 0        # wake_for calls until SO_RCVBUF is read again

    def wake_for(self, missing: int) -> None:
        """Let readiness wait until the frame being filled can complete (or
        ``_MAX_LOW_WATER`` bytes wait): one wake-up per large frame instead of one per
        arriving burst. Back to 1 byte between frames, so small messages wake it at once."""
        want = 1
        if missing >= _MIN_LOW_WATER:
            # Below a quarter of the receive buffer: a larger mark would make the kernel
            # grow the buffer and clamp the connection's window to the mark for good.
            want = min(missing, _MAX_LOW_WATER, self._quarter_buffer())
            if want < _MIN_LOW_WATER:
                want = 1
        if want != self.low_water:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, want)
            self.low_water = want

    def _quarter_buffer(self) -> int:
        """A quarter of the socket's receive buffer, read again every
        ``_RCVBUF_READ_EVERY`` calls: a system call per large frame cost more than the
        mark's accuracy is worth, and the kernel only grows the buffer (an old reading errs
        on the small side)."""
        if self._room_reads <= 0:
            self._room = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) // 4
            self._room_reads = _RCVBUF_READ_EVERY
        self._room_reads -= 1
        return self._room

    def peer_key(self) -> tuple:
        """Who to count log lines against: the host and the node id it claimed."""
        return self.address.rsplit(":", 1)[0], self.peer_id

    def describe(self) -> str:
        who = "node ?" if self.peer_id == K_EMPTY else "node %d" % self.peer_id
        return "%s (%s)" % (who, self.address)


class TcpVan(Van):
    """BytePS TCP transport; talks to byteps_tcp nodes only."""

    #: whether this node's connections carry RDMA channels (its hello says so)
    rdma = False
    #: ``send`` queues what the socket does not take (outbound.py; RDMA: what credits do not
    #: cover) and returns
    handlers_inline_ok = True

    def __init__(self, config: Config, pool: Optional[RecvBufferPool] = None):
        self.config = config
        self.pool = pool if pool is not None else RecvBufferPool(_LAND_IN_PLACE_BYTES)
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
            _tune(sock)
            peer_id = exchange_hellos(sock, self.my_id, self._mac_key, auth.ACCEPTOR, what,
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

    def _inbound(self, sock: socket.socket, peer_id: int, address: str, what: str) -> _Inbound:
        """(Accept side, after the hellos.) What reads the connection."""
        return _Inbound(sock, peer_id, address, self.pool)

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
            _tune(sock)
            exchange_hellos(sock, self.my_id if my_id is not None else K_EMPTY, self._mac_key,
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

    def _read_held(self, inbound: _Inbound) -> None:
        self._held.discard(inbound)
        self._selector.register(inbound.sock, selectors.EVENT_READ, inbound)

    def _forget(self, inbound: _Inbound) -> None:
        """Close a connection, read or held (receive thread)."""
        if inbound in self._held:
            self._held.discard(inbound)
        else:
            try:
                self._selector.unregister(inbound.sock)
            except (KeyError, ValueError):
                pass
        inbound.sock.close()

    def _drain(self, inbound: _Inbound, selector, on_message) -> bool:
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
            if isinstance(item, _Inbound):
                item.sock.close()
        self._wake_r.close()
        self._wake_w.close()
