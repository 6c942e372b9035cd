"""The KV layer: ps-lite's KVWorker, KVServer and SimpleApp on top of the postoffice (spec §4).

A worker request is sliced by server key range and sent to each server holding some of its
keys; the responses are matched by (app id, customer id, timestamp) and the request completes
when every server involved answered. KV requests and SimpleApp commands share one customer and
one timestamp counter, as upstream.

Data frames: keys (uint64 LE), vals (raw bytes), lens (int32 LE, bytes per key). Buffers travel
without pickling and, above a small size, without copying.

Thread-safety: every KVWorker and KVServer method is thread-safe. Request callbacks and server
handlers run on the customer's thread: keep them short.

Restarted servers (BYTEPS_SERVER_RECOVERY) are a plug-in of the worker (:mod:`.recovery`).
"""
import logging
import threading
import time
from typing import Callable, Dict, List, NamedTuple, Optional

import numpy as np

from ...errors import (ConfigError, DeadlineError, JobAbortedError, PeerError, ProtocolError,
                       refused_configuration)
from ...logs import PeerLog
from .slicing import as_keys, slice_request
from ..wire.message import DataType, Message, Meta, server_rank_to_id
from .recovery import NoServerRecovery, ServerRecovery

log = logging.getLogger(__name__)
#: a worker's complaints about answers, once per peer in full, then counted
_PEER_LOG = PeerLog(log)

_PUSH_TYPES = [DataType.UINT64, DataType.OTHER, DataType.INT32]
_TIMESTAMP_MASK = 2 ** 31 - 1


class KVPairs(NamedTuple):
    """Keys, raw value bytes and per-key lengths of a request or response."""

    keys: np.ndarray
    vals: memoryview
    lens: Optional[np.ndarray]


def _frames(keys, vals, lens, with_empty_vals: bool):
    """Data frames and their types: [keys, vals(, lens)]; a pull carries an empty vals frame."""
    if keys is None:
        return [], []
    data = [np.ascontiguousarray(keys, dtype=np.uint64)]
    if vals is None and not with_empty_vals:
        return data, _PUSH_TYPES[:1]
    data.append(vals if vals is not None else b"")
    if lens is None or len(lens) == 0:
        return data, _PUSH_TYPES[:2]
    data.append(np.ascontiguousarray(lens, dtype=np.int32))
    return data, _PUSH_TYPES[:]


def _no_pairs() -> KVPairs:
    keys = np.empty(0, np.uint64)
    keys.flags.writeable = False
    return KVPairs(keys, memoryview(b""), None)


#: a message without data frames (an acknowledgement): made once, not per message
NO_PAIRS = _no_pairs()


def parse_kv_frames(message: Message) -> KVPairs:
    """Validate and view the data frames of a KV message; ProtocolError if malformed."""
    frames = message.data
    if len(frames) not in (0, 2, 3):
        raise ProtocolError("expected 0, 2 or 3 data frames, got %d" % len(frames))
    if not frames:
        return NO_PAIRS
    keys_buf, vals = memoryview(frames[0]).cast("B"), memoryview(frames[1]).cast("B")
    if keys_buf.nbytes % 8:
        raise ProtocolError("keys frame of %d bytes is not a multiple of 8" % keys_buf.nbytes)
    keys = np.frombuffer(keys_buf, dtype=np.uint64)
    lens = None
    if len(frames) == 3:
        lens_buf = memoryview(frames[2]).cast("B")
        if lens_buf.nbytes % 4:
            raise ProtocolError("lens frame of %d bytes is not a multiple of 4" % lens_buf.nbytes)
        lens = np.frombuffer(lens_buf, dtype=np.int32)
        if len(lens) != len(keys):
            raise ProtocolError("%d lens for %d keys" % (len(lens), len(keys)))
    return KVPairs(keys, vals, lens)


# ============================================================================ worker side
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
                _PEER_LOG.warning(sender, "%s: unexpected answer from node %d", self.what,
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


class _Described:
    """How a request is named in errors: its kind, key count and first key, put into words
    only when an error or a log needs them (most requests never do)."""

    __slots__ = ("op", "keys")

    def __init__(self, op: str, keys: np.ndarray):
        self.op, self.keys = op, keys

    def __str__(self) -> str:
        keys = self.keys
        return "%s of %d key(s) [%d..]" % (self.op, len(keys), int(keys[0]) if len(keys) else -1)


def _server_ids(slices) -> List[int]:
    return [server_rank_to_id(part.server_rank) for part in slices]


def _concat(parts: List[KVPairs]) -> KVPairs:
    if len(parts) == 1:
        return parts[0]
    if not parts:
        return NO_PAIRS
    parts = sorted(parts, key=lambda p: int(p.keys[0]))
    lens = None if any(p.lens is None for p in parts) else np.concatenate([p.lens for p in parts])
    vals = memoryview(b"".join(bytes(p.vals) for p in parts))
    return KVPairs(np.concatenate([p.keys for p in parts]), vals, lens)


class KVWorker:
    """Sends push/pull/pushpull requests and SimpleApp commands to the servers."""

    def __init__(self, postoffice, app_id: int = 0, customer_id: int = 0,
                 request_timeout: Optional[float] = None):
        self.po, self.app_id, self.customer_id = postoffice, app_id, customer_id
        self.request_timeout = (request_timeout if request_timeout is not None
                                else postoffice.config.request_timeout)
        self._lock = threading.Lock()
        self._next_timestamp = 0
        self._pending: Dict[int, Request] = {}       # in the order sent: oldest first
        # answers only complete requests: handled on the receive loop where the van allows
        self._customer = postoffice.register_handler(app_id, customer_id, self._on_message,
                                                     inline=True)
        postoffice.on_failure(self._fail_pending)
        #: held while a request is stamped and sent, and while a restarted server is restored:
        #: a request is either in the recovering worker's report or sent after it, never both
        self.send_lock = threading.RLock()
        #: what restarted servers need of this layer (BYTEPS_SERVER_RECOVERY), or nothing
        self.recovery = (ServerRecovery if postoffice.config.server_recovery
                         else NoServerRecovery)(self)
        # Requests completed by callback (no one calls wait) still get a deadline: the
        # postoffice's tick notices an overdue request and the customer, which also completes
        # requests with their answers, fails it.
        self._check_period = min(1.0, self.request_timeout / 10)
        self._next_check = 0.0
        self._expiry_posted = False
        postoffice.on_tick(self._check_deadlines)

    def _check_deadlines(self, now: float) -> None:
        """On the receive thread, every tick: post an expiry if the oldest request is late."""
        if now < self._next_check or self._expiry_posted:
            return
        self._next_check = now + self._check_period
        with self._lock:
            oldest = next(iter(self._pending.values()), None)
        if oldest is not None and now - oldest.started > self.request_timeout:
            self._expiry_posted = True
            self._customer.post(self._expire)

    def _expire(self) -> None:
        """On the customer thread: fail every request past its deadline."""
        self._expiry_posted = False
        now = time.monotonic()
        with self._lock:
            expired = [r for r in self._pending.values()
                       if now - r.started > self.request_timeout]
            for request in expired:
                self._pending.pop(request.timestamp, None)
        for request in expired:
            request._fail(DeadlineError(request.describe_wait(now - request.started,
                                                              self._name_node)))

    def _name_node(self, node_id: int) -> str:
        """``server rank 1 (node 10) at 10.0.0.3:4000``, or ``node 10`` if unknown."""
        for node in self.po.nodes:
            if node.id == node_id:
                return node.describe_rank()
        return "node %d" % node_id

    def _fail_pending(self, error: BaseException) -> None:
        """Fail every pending request with ``error`` (the node's van stopped with it)."""
        with self._lock:
            pending, self._pending = list(self._pending.values()), {}
        for request in pending:
            request._fail(error.again() if isinstance(error, JobAbortedError)
                          else PeerError("%s: %s" % (request.what, error)))

    # -------------------------------------------------------------- public API
    def push(self, keys, vals, lens=None, cmd: int = 0, priority: int = 0,
             callback=None, extra=None, on_send: Optional[Callable[[], None]] = None) -> Request:
        """Push ``vals`` (``lens`` bytes per key). ``on_send()``, if given, runs right before the
        request is sent, while nothing else is: a restarted server's report either holds what
        it recorded or the request is sent after the report (see :mod:`.recovery`)."""
        return self._request(keys, vals, lens, cmd, True, False, priority, callback, extra,
                             on_send)

    def pull(self, keys, cmd: int = 0, priority: int = 0, callback=None, extra=None,
             into=None) -> Request:
        """Pull ``keys``. ``into``: a writable C-contiguous uint8 array the answer's value
        bytes belong in (one key): a van that receives in place (byteps_tcp) lands them there,
        saving a copy, and ``request.landed`` says so; from the callback on nothing more is
        written there, answered or not, so the array may be given back."""
        keys = as_keys(keys)
        callback, landing = self._land(keys, into, callback)
        try:
            return self._request(keys, None, None, cmd, False, True, priority, callback, extra)
        except BaseException:
            self.po.van.revoke_frame(landing)
            raise

    def expect_answers(self, key: int, nbytes: int) -> None:
        """Answers of ``nbytes`` for ``key`` will come every round: a van that receives in
        place sets up their buffer now."""
        self.po.van.register_recv_buffer(key, nbytes)

    def _land(self, keys: np.ndarray, into, callback):
        """``(callback, landing)``: where a one-key pull's answer lands (``into``), and the
        callback that first takes the landing back (before the caller may free ``into``)."""
        landing = None
        if into is not None and len(keys) == 1:
            landing = self.po.van.expect_frame(int(keys[0]), into)
        if landing is None:
            return callback, None

        def landed(request):
            self.po.van.revoke_frame(landing)
            request.landed = True
            if callback is not None:
                callback(request)
        return landed, landing

    def pushpull(self, keys, vals, lens=None, cmd: int = 0, priority: int = 0,
                 callback=None, extra=None) -> Request:
        return self._request(keys, vals, lens, cmd, True, True, priority, callback, extra)

    def push_with_pull(self, keys, vals, lens=None, cmd: int = 0, priority: int = 0,
                       push_callback=None, pull_callback=None, into=None):
        """A push with the pull of the same keys riding along (kvstore-byteps servers only):
        one message instead of two. Returns ``(push, pull)`` requests. The server acknowledges
        the push as usual and answers the pull, under the pull's own timestamp, as if it had
        arrived right after the push; unlike a pushpull, the push's answer does not wait for
        the round. If the push fails, so does the pull. ``into``: as for :meth:`pull`."""
        keys, lens, slices = self._sliced(keys, vals, lens, push=True)
        servers = _server_ids(slices)
        pull_callback, landing = self._land(keys, into, pull_callback)
        pull = self._new_request(_Described("pull (with its push)", keys), servers,
                                 pull_callback)

        def pushed(request):      # a push that failed to send comes here too
            if request.error is not None:
                self._fail_request(pull, request.error)
            if push_callback is not None:
                push_callback(request)
        push = self._new_request(_Described("push", keys), servers, pushed)
        try:
            self._send_slices(push, slices, cmd, True, False, priority,
                              {"pull_timestamp": pull.timestamp})
        except BaseException:
            self.po.van.revoke_frame(landing)
            raise
        return push, pull

    def command(self, head: int, body: bytes = b"", callback=None) -> Request:
        """A SimpleApp command to every server (e.g. MXNet's kSyncMode = 3)."""
        servers = self.po.group_ids(2)
        request = self._new_request("command %d" % head, servers, callback)
        with self.send_lock:
            for server in servers:
                meta = Meta(head=head, body=body, request=True, simple_app=True,
                            app_id=self.app_id, customer_id=self.customer_id,
                            timestamp=request.timestamp, recver=server)
                self._send(request, Message(meta))
        return request

    def wait(self, request: Request) -> KVPairs:
        return request.wait(self.request_timeout)

    @property
    def answers_on_receive_loop(self) -> bool:
        """Whether answers complete requests on the van's receive loop, whose sends never
        wait for a peer (``Van.handlers_inline_ok``): work that only sends may run in their
        callbacks."""
        return self._customer.on_receive_loop

    def post(self, work: Callable[[], None]) -> None:
        """Run ``work()`` on the customer thread, after the answers queued."""
        self._customer.post(work)

    # -------------------------------------------------------------- restarted servers
    def send_push(self, server: int, head: int, body: bytes, keys, vals, lens, what: str,
                  callback=None) -> Request:
        """A push of ``keys``/``vals``/``lens`` with ``head`` and ``body`` to ``server`` alone
        (a recovery report)."""
        request = self._new_request(what, [server], callback)
        data, types = _frames(keys, vals, lens, with_empty_vals=True)
        meta = Meta(head=head, body=body, request=True, push=True, app_id=self.app_id,
                    customer_id=self.customer_id, timestamp=request.timestamp,
                    data_type=types, recver=server)
        with self.send_lock:
            self._send(request, Message(meta, data))
        return request

    def waiting_on(self, server: int, but: Optional[Request] = None) -> List[Request]:
        """The pending requests that wait for an answer of ``server`` (except ``but``)."""
        with self._lock:
            return [r for r in self._pending.values() if r is not but and r.waits_for(server)]

    def count_answered(self, request: Request, server: int) -> None:
        """Count ``server``'s part of ``request`` as answered, with no data (a restarted server
        holds it from the report)."""
        request._on_response(server, Meta(), NO_PAIRS)
        if request.done:
            with self._lock:
                self._pending.pop(request.timestamp, None)

    def resend(self, request: Request, message: Message) -> None:
        """Send ``message`` of ``request`` again (to a restarted server)."""
        with self.send_lock:
            self._send(request, message)

    def fail_server(self, server: int, error: BaseException) -> None:
        """Fail every request waiting on ``server`` with ``error``."""
        with self._lock:
            failing = [r for r in self._pending.values() if r.waits_for(server)]
            for request in failing:
                self._pending.pop(request.timestamp, None)
        for request in failing:
            request._fail(error)

    # -------------------------------------------------------------- internals
    def _request(self, keys, vals, lens, cmd, push, pull, priority, callback, extra,
                 on_send=None) -> Request:
        keys, lens, slices = self._sliced(keys, vals, lens, push)
        op = "pushpull" if push and pull else ("push" if push else "pull")
        request = self._new_request(_Described(op, keys), _server_ids(slices), callback)
        self._send_slices(request, slices, cmd, push, pull, priority, extra, on_send)
        return request

    def _sliced(self, keys, vals, lens, push: bool):
        """``(keys, lens, slices)``: the keys and lens as arrays, and the request's part for
        each server holding some of the keys."""
        keys = as_keys(keys)
        lens = None if lens is None else np.ascontiguousarray(lens, dtype=np.int32).reshape(-1)
        return keys, lens, slice_request(keys, vals if push else None, lens,
                                         self.po.server_key_ranges())

    def _send_slices(self, request: Request, slices, cmd, push, pull, priority, extra,
                     on_send=None) -> None:
        with self.send_lock:
            if on_send is not None:
                on_send()
            for part in slices:
                data, types = _frames(part.keys, part.vals if push else None, part.lens,
                                      with_empty_vals=True)
                meta = Meta(head=cmd, request=True, push=push, pull=pull, app_id=self.app_id,
                            customer_id=self.customer_id, timestamp=request.timestamp,
                            priority=priority, data_type=types, extra=extra,
                            recver=server_rank_to_id(part.server_rank))
                self._send(request, Message(meta, data))

    def _fail_request(self, request: Request, error: BaseException) -> None:
        with self._lock:
            self._pending.pop(request.timestamp, None)
        request._fail(error)

    def _new_request(self, what, servers, callback) -> Request:
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

    def _send(self, request: Request, message: Message) -> None:
        message = self.recovery.stamp(request, message)
        try:
            self.po.send(message)
        except PeerError as exc:
            if not self.recovery.park(request, message, exc):
                self._fail_send(request, message, exc)
        except Exception as exc:
            self._fail_send(request, message, exc)

    def _fail_send(self, request: Request, message: Message, exc: Exception) -> None:
        if isinstance(exc, JobAbortedError):        # a node ended the job: that is the reason
            error = exc
        else:
            error = PeerError("%s: sending to node %d failed: %s"
                              % (request.what, message.meta.recver, exc))
            error.unreachable_node = message.meta.recver     # for the engine's advice
        self._fail_request(request, error)
        raise request.error from exc

    def _on_message(self, message: Message) -> None:
        meta = message.meta
        if meta.request:
            _PEER_LOG.warning(meta.sender, "worker got a request from node %d; dropped",
                              meta.sender)
            return
        if not self.recovery.accepts(meta):
            return
        request = self._pending.get(meta.timestamp)    # (a dict read needs no lock)
        if request is None:
            _PEER_LOG.warning(meta.sender, "answer with unknown timestamp %d from node %d; "
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
        if request.done:
            with self._lock:
                self._pending.pop(meta.timestamp, None)


# ============================================================================ server side
def open_worker(postoffice) -> KVWorker:
    """The KV layer's worker app on a started ``postoffice`` (ps-lite's ``new KVWorker``): the
    one place outside this module's class that builds it, so its users hold an object, never
    the class (tests/unit/test_layers.py)."""
    return KVWorker(postoffice)


class KVRequest:
    """One request as a server handler sees it (data frames viewed without copying)."""

    __slots__ = ("meta", "keys", "vals", "lens", "received")

    def __init__(self, meta: Meta, kvs: KVPairs):
        self.meta = meta
        self.keys, self.vals, self.lens = kvs
        self.received = time.monotonic()

    @property
    def sender(self) -> int:
        return self.meta.sender


Handler = Callable[[KVRequest, "KVServer"], None]


class KVServer:
    """Receives KV requests and SimpleApp commands for ``app_id`` and sends the answers."""

    def __init__(self, postoffice, app_id: int = 0, request_handler: Optional[Handler] = None,
                 command_handler: Optional[Handler] = None,
                 quick_request: Optional[Callable[[Meta], bool]] = None):
        """``quick_request(meta)``: whether the request handler answers or queues such a KV
        request without waiting (for the van, a lock held long, an optimizer): where the van
        allows it, those run on its receive loop while the handler thread is idle."""
        self.po, self.app_id = postoffice, app_id
        self.request_handler = request_handler
        self.command_handler = command_handler
        self._peer_log = PeerLog(log)
        quick = None if quick_request is None else \
            (lambda message: not message.meta.simple_app and quick_request(message.meta))
        postoffice.register_handler(app_id, app_id, self._on_message, quick=quick)

    def expect_requests(self, key: int, nbytes: int) -> None:
        """Requests carrying ``nbytes`` for ``key`` will come every round: a van that receives
        in place sets up their buffer now."""
        self.po.van.register_recv_buffer(key, nbytes)

    def respond(self, req: KVRequest, keys=None, vals=None, lens=None,
                error: Optional[str] = None, body: bytes = b"") -> None:
        """Answer ``req``: an ack (no data), data (keys, vals, lens) or an error text; ``body``
        is a SimpleApp answer's payload (upstream's answers carry none)."""
        data, types = _frames(keys, vals, lens, with_empty_vals=keys is not None)
        m = req.meta
        extra = {"error": error} if error else {}
        if self.po.recovery_epoch:    # a restarted server: its answers say so
            extra["epoch"] = self.po.recovery_epoch
        meta = Meta(head=m.head, request=False, push=m.push, pull=m.pull,
                    simple_app=m.simple_app, app_id=self.app_id, customer_id=m.customer_id,
                    body=body,
                    timestamp=m.timestamp, data_type=types, recver=m.sender,
                    extra=extra or None)
        self.po.send(Message(meta, data))

    def _on_message(self, message: Message) -> None:
        meta = message.meta
        if not self.po.is_member(meta.sender):    # no way to answer it, nothing to serve
            self._peer_log.warning(meta.sender, "request from node %s, which is not a node of "
                                   "this cluster; dropped", meta.sender)
            return
        if not meta.request:
            self._peer_log.warning(meta.sender, "server got an answer from node %d; dropped",
                                   meta.sender)
            return
        try:
            req = KVRequest(meta, parse_kv_frames(message))
        except ProtocolError as exc:
            self._peer_log.warning(meta.sender, "malformed request from node %d: %s",
                                   meta.sender, exc)
            self._respond_error(KVRequest(meta, KVPairs(np.empty(0, np.uint64),
                                                         memoryview(b""), None)), str(exc))
            return
        handler = self.command_handler if meta.simple_app else self.request_handler
        try:
            if handler is None:
                raise ProtocolError("no handler for %s" % (
                    "commands" if meta.simple_app else "KV requests"))
            handler(req, self)
        except Exception as exc:
            self._peer_log.warning(meta.sender, "request from node %d (head %d) failed: %s",
                                   meta.sender, meta.head, exc)
            self._respond_error(req, str(exc))

    def _respond_error(self, req: KVRequest, text: str) -> None:
        try:
            self.respond(req, error=text)
        except Exception as exc:
            self._peer_log.warning(req.sender, "could not send an error answer to node %d: %s",
                                   req.sender, exc)
