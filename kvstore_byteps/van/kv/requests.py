"""A worker's requests until the servers answered them (ps-lite's ``Customer`` request tracker):
each request is a future completed by the answers of the servers it went to, matched by
timestamp, or failed by a deadline, a dead node or a failed send.

Thread-safety: every public method is thread-safe. Answers are taken on the KV worker's
customer thread (:meth:`PendingRequests.take_answer`); a request's callback runs there too, or
on the thread that failed it.
"""
import logging
import threading
import time
from typing import Callable, Dict, List, Optional

import numpy as np

from ...errors import (ConfigError, DeadlineError, JobAbortedError, PeerError, ProtocolError,
                       refused_configuration)
from ...logs import PeerLog
from ..wire.message import Message, Meta
from .pairs import NO_PAIRS, KVPairs, parse_kv_frames

__all__ = ["Request", "Described", "PendingRequests", "PEER_LOG"]

log = logging.getLogger(__name__)
#: a worker's complaints about answers, once per peer in full, then counted (the KV worker's too)
PEER_LOG = PeerLog(log)

_TIMESTAMP_MASK = 2 ** 31 - 1


class Request:
    """A pending worker request: a future completed by the servers' responses.

    Completion happens exactly once: answers arrive on the customer thread while a deadline,
    a dead node or a failed send may fail the request from another thread; whichever comes
    first claims it under the lock, the other finds it finished and does nothing (an engine
    operation whose callback ran twice would crash MXNet).
    """

    def __init__(self, what, timestamp: int, servers: List[int],
                 callback: Optional[Callable[["Request"], None]]):
        self._what, self.timestamp = what, timestamp
        self._waiting = set(servers)
        self._parts: List[KVPairs] = []
        self._callback = callback
        self._lock = threading.Lock()
        self._finished = False           # completion claimed (answers are not taken any more)
        self._done = False               # the result is set (before the callback runs)
        self._event: Optional[threading.Event] = None    # made for a caller that waits
        self.error: Optional[BaseException] = None
        self.started = time.monotonic()
        self.result: Optional[KVPairs] = None
        self.head: Optional[int] = None
        self.bodies: Dict[int, bytes] = {}      # server id -> body of its answer
        #: server id -> the message sent there, kept by the recovery plug-in (re-sent if that
        #: server is restarted)
        self.messages: Dict[int, Message] = {}
        #: a pull asked to land its answer in the caller's array (``into``), and the van can:
        #: the answer's bytes may already be there (see routes.broadcast before copying)
        self.landed = False

    @property
    def what(self) -> str:
        """How errors name this request ("push of 1 key(s) [5..]")."""
        return str(self._what)

    def waits_for(self, server: int) -> bool:
        with self._lock:
            return server in self._waiting

    @property
    def done(self) -> bool:
        return self._done

    def _on_response(self, sender: int, meta: Meta, kvs: KVPairs) -> None:
        with self._lock:
            if self._finished:          # failed meanwhile (deadline, dead node): too late
                return
            if sender not in self._waiting:
                PEER_LOG.warning(sender, "%s: unexpected answer from node %d", self.what,
                                  sender)
                return
            self._waiting.discard(sender)
            error = meta.extra and meta.extra.get("error")
            if error and self.error is None:
                self.error = _answered_error(self.what, sender, error)
            if len(kvs.keys):
                self._parts.append(kvs)
            self.head = meta.head
            self.bodies[sender] = bytes(meta.body)
            finish = self._finished = not self._waiting
        if finish:
            self._complete()

    def describe_wait(self, waited: float, name_node: Optional[Callable[[int], str]] = None
                      ) -> str:
        """What it waits for, after ``waited`` seconds; ``name_node(id)`` names the nodes."""
        with self._lock:
            waiting = sorted(self._waiting)
        named = " (%s)" % ", ".join(map(name_node, waiting)) if name_node and waiting else ""
        return ("%s (timestamp %d): no answer from server node(s) %s%s within %.0f s"
                % (self.what, self.timestamp, waiting, named, waited))

    def _fail(self, error: BaseException) -> None:
        with self._lock:
            if self._finished:
                return
            self._finished = True
            self.error = self.error or error
            self._waiting.clear()
        self._complete()

    def _complete(self) -> None:
        """Runs once, by the thread that claimed the completion."""
        if self.error is None:
            self.result = _concat(self._parts)
        with self._lock:
            self._done = True
            event = self._event
        if event is not None:
            event.set()
        if self._callback is not None:
            try:
                self._callback(self)
            except Exception:
                log.exception("%s: completion callback failed", self.what)

    def wait(self, timeout: Optional[float] = None) -> KVPairs:
        """Block until complete; return the pulled data (empty for a push).

        Raises PeerError if a server answered with an error, DeadlineError naming the servers
        that did not answer within ``timeout`` seconds.
        """
        with self._lock:
            if not self._done and self._event is None:
                self._event = threading.Event()
            event = self._event
        if event is not None and not event.wait(timeout):
            raise DeadlineError(self.describe_wait(timeout))
        if self.error is not None:
            raise self.error
        return self.result


def _answered_error(what: str, sender: int, error: str) -> Exception:
    """The error a server's error answer means: ConfigError where it refused this worker's
    configuration (the job cannot go on as configured), else PeerError."""
    refusal = refused_configuration(error)
    if refusal is not None:
        return ConfigError("%s: server node %d refused this worker: %s" % (what, sender, refusal))
    return PeerError("%s: server node %d answered with an error: %s" % (what, sender, error))


class Described:
    """How a request is named in errors: its kind, key count and first key, put into words
    only when an error or a log needs them (most requests never do)."""

    __slots__ = ("op", "keys")

    def __init__(self, op: str, keys: np.ndarray):
        self.op, self.keys = op, keys

    def __str__(self) -> str:
        keys = self.keys
        return "%s of %d key(s) [%d..]" % (self.op, len(keys), int(keys[0]) if len(keys) else -1)


def _concat(parts: List[KVPairs]) -> KVPairs:
    if len(parts) == 1:
        return parts[0]
    if not parts:
        return NO_PAIRS
    parts = sorted(parts, key=lambda p: int(p.keys[0]))
    lens = None if any(p.lens is None for p in parts) else np.concatenate([p.lens for p in parts])
    # one copy (bytes() of each part and a join were two: a big row_sparse pull's cost)
    vals = memoryview(np.concatenate([np.frombuffer(p.vals, np.uint8) for p in parts]))
    return KVPairs(np.concatenate([p.keys for p in parts]), vals, lens)


class PendingRequests:
    """The requests sent and not answered yet, by timestamp, in the order sent (oldest first);
    the timestamps they are sent under."""

    def __init__(self):
        self._lock = threading.Lock()
        self._next_timestamp = 0
        self._pending: Dict[int, Request] = {}       # in the order sent: oldest first

    def new(self, what, servers: List[int], callback) -> Request:
        """A request to ``servers`` under the next timestamp, pending until they answered
        (complete at once without servers)."""
        with self._lock:
            timestamp = self._next_timestamp
            # the meta's timestamp is an int32: wrap instead of failing every send after 2**31
            # requests (24 days at 1000 a second); a request that old is long answered
            self._next_timestamp = (timestamp + 1) & _TIMESTAMP_MASK
            request = Request(what, timestamp, servers, callback)
            if servers:
                self._pending[timestamp] = request
        if not servers:
            request._finished = True
            request._complete()
        return request

    def oldest(self) -> Optional[Request]:
        with self._lock:
            return next(iter(self._pending.values()), None)

    def take_answer(self, message: Message) -> None:
        """On the customer thread: a server's answer to a request of ours."""
        meta = message.meta
        request = self._pending.get(meta.timestamp)    # (a dict read needs no lock)
        if request is None:
            PEER_LOG.warning(meta.sender, "answer with unknown timestamp %d from node %d; "
                             "dropped", meta.timestamp, meta.sender)
            return
        try:
            kvs = parse_kv_frames(message)
        except ProtocolError as exc:
            request._fail(PeerError("%s: malformed answer from node %d: %s"
                                    % (request.what, meta.sender, exc)))
            kvs = None
        if kvs is not None:
            request._on_response(meta.sender, meta, kvs)
        self._forget_if_done(request)

    def count_answered(self, request: Request, server: int) -> None:
        """Count ``server``'s part of ``request`` as answered, with no data (a restarted server
        holds it from the report)."""
        request._on_response(server, Meta(), NO_PAIRS)
        self._forget_if_done(request)

    def _forget_if_done(self, request: Request) -> None:
        if request.done:
            with self._lock:
                self._pending.pop(request.timestamp, None)

    def waiting_on(self, server: int, but: Optional[Request] = None) -> List[Request]:
        """The pending requests that wait for an answer of ``server`` (except ``but``)."""
        with self._lock:
            return [r for r in self._pending.values() if r is not but and r.waits_for(server)]

    def expire(self, timeout: float, name_node: Callable[[int], str]) -> None:
        """Fail every request older than ``timeout`` seconds (``name_node`` names the servers
        that did not answer)."""
        now = time.monotonic()
        with self._lock:
            expired = [r for r in self._pending.values() if now - r.started > timeout]
            for request in expired:
                self._pending.pop(request.timestamp, None)
        for request in expired:
            request._fail(DeadlineError(request.describe_wait(now - request.started, name_node)))

    def fail(self, request: Request, error: BaseException) -> None:
        """Fail ``request`` with ``error`` (unless it completed already)."""
        with self._lock:
            self._pending.pop(request.timestamp, None)
        request._fail(error)

    def fail_server(self, server: int, error: BaseException) -> None:
        """Fail every request waiting on ``server`` with ``error``."""
        with self._lock:
            failing = [r for r in self._pending.values() if r.waits_for(server)]
            for request in failing:
                self._pending.pop(request.timestamp, None)
        for request in failing:
            request._fail(error)

    def fail_all(self, error: BaseException) -> None:
        """Fail every pending request with ``error`` (the node's van stopped with it)."""
        with self._lock:
            pending, self._pending = list(self._pending.values()), {}
        for request in pending:
            request._fail(error.again() if isinstance(error, JobAbortedError)
                          else PeerError("%s: %s" % (request.what, error)))
