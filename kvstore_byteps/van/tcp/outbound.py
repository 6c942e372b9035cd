"""The sending side of the byteps_tcp van: one queue per peer connection and one writer thread.

``send`` must not block the caller while a peer's link is busy: a server answering four
workers' pulls from one thread would otherwise send them one after the other, each at the
speed of one worker's link, and stall every other request behind them (ZeroMQ hides this
with its I/O thread). So a message goes out at once with a non-blocking ``sendmsg`` when the
socket has room (the common case: no thread hand-off), and whatever does not fit is queued
for the writer thread, which sends it as the socket drains. Once a peer has something queued,
later messages queue behind it, so the order of messages per peer is kept.

The caller must leave the data buffers unchanged until the request they belong to is answered
(as with ZeroMQ's zero-copy sends); the queue keeps them alive.
"""
import collections
import itertools
import logging
import selectors
import socket
import threading
import time
from typing import Deque, List, Optional

from ...errors import PeerError

log = logging.getLogger(__name__)

#: at most this many buffers per sendmsg call (Linux's IOV_MAX is 1024)
_MAX_IOV = 512
_WRITER_TICK_SECONDS = 0.5


def advance(buffers: List[memoryview], sent: int) -> None:
    """Drop the first ``sent`` bytes from ``buffers`` (in place). Pure."""
    while sent:
        head = buffers[0]
        if sent >= head.nbytes:
            sent -= head.nbytes
            buffers.pop(0)
        else:
            buffers[0] = head[sent:]
            sent = 0


class Outbound:
    """One connection to a peer: the socket (non-blocking) and what still has to go out."""

    def __init__(self, sock: socket.socket, peer: str):
        sock.setblocking(False)
        self.sock, self.peer = sock, peer
        self.lock = threading.Lock()
        self.pending: Deque[memoryview] = collections.deque()
        self.error: Optional[str] = None
        self.stalled_since: Optional[float] = None

    def send(self, buffers: List[memoryview]) -> bool:
        """Send or queue ``buffers``; True when something is left for the writer."""
        with self.lock:
            if self.error is not None:
                raise PeerError("connection to %s is broken: %s" % (self.peer, self.error))
            if self.pending:
                self.pending.extend(b for b in buffers if b.nbytes)
                return False          # already watched by the writer
            rest = [b for b in buffers if b.nbytes]
            self._send_some(rest)
            if not rest:
                return False
            self.pending.extend(rest)
            self.stalled_since = time.monotonic()
            return True

    def flush(self) -> bool:
        """Send what the socket takes now (writer thread); True when nothing is left."""
        with self.lock:
            if self.error is not None:
                return True
            while self.pending:
                batch = list(itertools.islice(self.pending, _MAX_IOV))
                try:
                    sent = self.sock.sendmsg(batch)
                except (BlockingIOError, InterruptedError):
                    return False
                except OSError as exc:
                    self.error = str(exc)
                    self.pending.clear()
                    raise PeerError("sending to %s failed: %s" % (self.peer, exc)) from None
                self.stalled_since = time.monotonic()     # progress
                while sent:
                    head = self.pending[0]
                    if sent >= head.nbytes:
                        sent -= head.nbytes
                        self.pending.popleft()
                    else:
                        self.pending[0] = head[sent:]
                        sent = 0
            self.stalled_since = None
            return True

    def _send_some(self, buffers: List[memoryview]) -> None:
        """Send from ``buffers`` until done or the socket is full; ``buffers`` keeps the rest.
        Only called with an empty queue, so nothing can overtake what is queued."""
        while buffers:
            try:
                sent = self.sock.sendmsg(buffers[:_MAX_IOV])
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self.error = str(exc)
                raise PeerError("sending to %s failed: %s" % (self.peer, exc)) from None
            advance(buffers, sent)

    def fail(self, reason: str) -> None:
        with self.lock:
            self.error = reason
            self.pending.clear()

    def close(self) -> None:
        self.fail("closed")
        self.sock.close()


class Writer:
    """The thread that drains the queues of peers whose socket was full."""

    def __init__(self, stall_timeout: float):
        self.stall_timeout = stall_timeout
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._new: Deque[Outbound] = collections.deque()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="tcp-van-writer")
        self._thread.start()

    def watch(self, out: Outbound) -> None:
        """Keep sending ``out``'s queue as its socket drains (any thread)."""
        self._new.append(out)
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass

    def _loop(self) -> None:
        watched = set()
        while not self._stop.is_set():
            for key, _ in self._selector.select(_WRITER_TICK_SECONDS):
                if key.data is None:
                    try:
                        self._wake_r.recv(4096)
                    except OSError:
                        pass
                    continue
                out = key.data
                try:
                    done = out.flush()
                except PeerError as exc:
                    log.warning("%s", exc)
                    done = True
                if done:
                    self._selector.unregister(out.sock)
                    watched.discard(out)
            while self._new:
                out = self._new.popleft()
                if out not in watched and out.error is None:
                    try:
                        self._selector.register(out.sock, selectors.EVENT_WRITE, out)
                        watched.add(out)
                    except (ValueError, OSError):      # closed meanwhile
                        pass
            self._expire(watched)

    def _expire(self, watched) -> None:
        now = time.monotonic()
        for out in list(watched):
            since = out.stalled_since
            if out.error is not None or (since is not None and now - since > self.stall_timeout):
                if out.error is None:
                    log.error("%s took no data for %.0f s (BYTEPS_REQUEST_TIMEOUT); its "
                              "queued messages are dropped", out.peer, self.stall_timeout)
                    out.fail("no progress for %.0f s" % self.stall_timeout)
                try:
                    self._selector.unregister(out.sock)
                except (KeyError, ValueError, OSError):
                    pass
                watched.discard(out)

    def close(self) -> None:
        self._stop.set()
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        self._thread.join(_WRITER_TICK_SECONDS * 4)
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()
