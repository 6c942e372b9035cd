"""ZeroMQ CURVE for the zmq van under ``BYTEPS_AUTH_KEY``.

Every node derives the same CURVE key pair from the cluster's key (auth.py). Its ROUTER is a
CURVE server with that pair; each DEALER it connects is a CURVE client with it; a ZAP handler
(pyzmq's ThreadAuthenticator) admits only clients that prove they hold the pair's secret half.
So a process without the key cannot complete a handshake with any node: it can neither join
nor send, and it reads nothing (CURVE encrypts every message).

Handshake failures are silent in ZeroMQ (the peer just reconnects), so socket monitors watch
them on one thread: a failure on a connection this node opened is kept for the van to raise
(:meth:`CurveAuth.take_failure`); one on a connection a peer opened is logged (the peer is a
stranger, or a node with another key, or an upstream MXNet node, which cannot authenticate).
"""
import hmac
import logging
import queue
import threading
from typing import Dict, List, Optional, Tuple

from ...errors import AuthenticationError
from ...logs import PeerLog
from .. import auth

log = logging.getLogger(__name__)

_WATCH_POLL_MS = 100
#: handshakes a peer closes in a row before a keyless node concludes it requires a key
KEYLESS_FAILED_HANDSHAKES = 3
_NO_KEY_HINT = ("it has no BYTEPS_AUTH_KEY, or it is an upstream MXNet node, which cannot "
                "authenticate (with BYTEPS_AUTH_KEY every node must be a kvstore-byteps node: "
                "dist_byteps workers, our servers and scheduler)")


class CurveAuth:
    """The CURVE keys, the ZAP handler and the handshake watch of one van's context."""

    def __init__(self, zmq, context, key: bytes):
        from zmq.auth.thread import ThreadAuthenticator
        from zmq.utils import z85
        if not zmq.has("curve"):
            raise AuthenticationError("BYTEPS_AUTH_KEY needs a libzmq with CURVE; this pyzmq's "
                                      "has none (pip install --force-reinstall pyzmq)")
        self._zmq = zmq
        self.secret = z85.encode(auth.curve_secret(key))
        self.public = zmq.curve_public(self.secret)
        self._authenticator = ThreadAuthenticator(context)
        self._authenticator.start()
        self._authenticator.configure_curve_callback("*", credentials_provider=self)
        self._new: "queue.SimpleQueue[Tuple[object, Optional[str]]]" = queue.SimpleQueue()
        self._failures: List[AuthenticationError] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._peer_log = PeerLog(log)
        #: inbound handshakes refused so far (strangers, other keys, upstream nodes)
        self.refused = 0
        self._thread = threading.Thread(target=self._watch, daemon=True, name="zmq-curve-watch")
        self._thread.start()

    # ---------------------------------------------------------------- ZAP
    def callback(self, domain, client_key: bytes) -> bool:
        """ZAP: admit a client only if its (proven) public key is the cluster's."""
        return hmac.compare_digest(client_key, self.public)

    # ---------------------------------------------------------------- sockets
    def make_server(self, socket) -> None:
        """Before bind: the ROUTER accepts only CURVE clients the ZAP handler admits."""
        socket.curve_server = True
        socket.curve_secretkey = self.secret
        socket.curve_publickey = self.public
        self._new.put((socket.get_monitor_socket(), None))

    def make_client(self, socket, what: str) -> None:
        """Before connect: the DEALER to ``what`` authenticates with the cluster's pair."""
        socket.curve_serverkey = self.public
        socket.curve_publickey = self.public
        socket.curve_secretkey = self.secret
        self._new.put((socket.get_monitor_socket(), what))

    def take_failure(self) -> Optional[AuthenticationError]:
        """The first handshake failure of a connection this node opened, if one happened."""
        with self._lock:
            return self._failures.pop(0) if self._failures else None

    # ---------------------------------------------------------------- the watch
    def _watch(self) -> None:
        from zmq.utils.monitor import recv_monitor_message
        zmq = self._zmq
        monitors: Dict[object, Optional[str]] = {}
        poller = zmq.Poller()
        try:
            while not self._stop.is_set():
                while not self._new.empty():
                    monitor, what = self._new.get()
                    monitors[monitor] = what
                    poller.register(monitor, zmq.POLLIN)
                for monitor, _ in poller.poll(_WATCH_POLL_MS):
                    event = recv_monitor_message(monitor)
                    if event["event"] == zmq.EVENT_MONITOR_STOPPED:
                        poller.unregister(monitor)
                        monitors.pop(monitor, None)
                        monitor.close(0)
                    else:
                        self._on_event(event, monitors.get(monitor))
        finally:
            for monitor in monitors:
                monitor.close(0)
            while not self._new.empty():
                self._new.get()[0].close(0)

    def _on_event(self, event: dict, what: Optional[str]) -> None:
        zmq = self._zmq
        kind, value = event["event"], event["value"]
        if kind == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL and \
                value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
            cause = "does not authenticate: " + _NO_KEY_HINT
        elif kind in (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL,
                      zmq.EVENT_HANDSHAKE_FAILED_AUTH):
            # which side lacks what is not always told apart (an upstream MXNet node has been
            # seen both ways): name every cause
            cause = ("failed the CURVE handshake: it holds a different BYTEPS_AUTH_KEY, or "
                     + _NO_KEY_HINT)
        else:
            return
        if what is None:
            self.refused += 1
            self._peer_log.error(cause, "refused a connection to %s: the peer %s",
                                 event["endpoint"].decode(errors="replace"), cause)
        else:
            with self._lock:
                self._failures.append(AuthenticationError("%s %s" % (what, cause)))

    def close(self) -> None:
        """Stop the watch and the ZAP handler; call before the context is terminated and
        after the sockets are closed."""
        self._stop.set()
        self._thread.join(2.0)
        self._authenticator.stop()


class KeylessWatch:
    """A node without a key, while the cluster forms: a peer it connects to that holds
    ``BYTEPS_AUTH_KEY`` speaks CURVE, and ZeroMQ reports the mechanism mismatch only to a socket
    monitor (the node would otherwise wait out ``BYTEPS_START_TIMEOUT`` not knowing why). The
    van raises :meth:`failure` (its receive thread, or a send while forming that cannot go
    out). :meth:`watch` and :meth:`failure` may be called from any thread.

    A monitor must be read or switched off: libzmq's I/O thread blocks on a monitor whose
    reading end is gone. So :meth:`close` switches each one off, under the lock the van
    holds while using that socket, before closing the reading end."""

    def __init__(self, zmq):
        self._zmq = zmq
        self._new: "queue.SimpleQueue[tuple]" = queue.SimpleQueue()
        self._monitors: List[tuple] = []     # (monitor, what, socket, the socket's lock)
        self._failed: Dict[str, int] = {}    # per peer, handshakes failed in a row
        # failure() runs on the receive thread and in a forming send (ZMQVan._send_forming);
        # never held while taking a socket's lock (send holds that one while calling failure)
        self._lock = threading.Lock()

    def watch(self, socket, what: str, lock: threading.Lock) -> None:
        """Before connect: watch the handshakes of ``socket`` (to the peer ``what``), which the
        van uses under ``lock``."""
        self._new.put((socket.get_monitor_socket(), what, socket, lock))

    def failure(self) -> Optional[AuthenticationError]:
        """The first peer found to require a key, if one was: it reported the mechanism
        mismatch, or it closed KEYLESS_FAILED_HANDSHAKES handshakes in a row (a CURVE server
        that closes first leaves the client only "broken pipe", no detail; a keyless peer
        never fails a handshake with a keyless node)."""
        with self._lock:
            return self._failure()

    def _failure(self) -> Optional[AuthenticationError]:
        from zmq.utils.monitor import recv_monitor_message
        zmq = self._zmq
        self._take_new()
        for monitor, what, _, _ in self._monitors:
            while monitor.poll(0):
                event = recv_monitor_message(monitor)
                kind = event["event"]
                if kind == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL and \
                        event["value"] == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
                    return self._requires_key(what, "")
                if kind in (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL,
                            zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL):
                    failed = self._failed[what] = self._failed.get(what, 0) + 1
                    log.debug("handshake with %s failed (%s)", what, event)
                    if failed >= KEYLESS_FAILED_HANDSHAKES:
                        return self._requires_key(
                            what, " (it closed %d handshakes in a row)" % failed)
                elif kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                    self._failed.pop(what, None)
        return None

    @staticmethod
    def _requires_key(what: str, how: str) -> AuthenticationError:
        return AuthenticationError(
            "%s requires authentication (it has BYTEPS_AUTH_KEY) but this node has no key%s; "
            "give every node the same BYTEPS_AUTH_KEY or BYTEPS_AUTH_KEY_FILE" % (what, how))

    def close(self) -> None:
        """Stop watching (the cluster formed, or the van closes): close the monitors' ends."""
        with self._lock:
            self._take_new()
            monitors, self._monitors = self._monitors, []
        for monitor, _, socket, lock in monitors:
            with lock:
                try:
                    if not socket.closed:
                        socket.disable_monitor()
                except self._zmq.ZMQError:      # closed meanwhile: its monitor ended with it
                    pass
            monitor.close(0)

    def _take_new(self) -> None:
        while not self._new.empty():
            self._monitors.append(self._new.get())
