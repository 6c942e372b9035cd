"""The KV layer's worker app: ps-lite's KVWorker and SimpleApp's commands on the postoffice
(spec §4).

A worker request is sliced by server key range and sent to each server holding some of its
keys; the responses are matched by (app id, customer id, timestamp) (:mod:`.requests`) and the
request completes when every server involved answered. KV requests and SimpleApp commands share
one customer and one timestamp counter, as upstream. Data frames: :mod:`.pairs`.

Thread-safety: every KVWorker method is thread-safe. Request callbacks run on the customer's
thread: keep them short.

Restarted servers (BYTEPS_SERVER_RECOVERY) are a plug-in of the worker (:mod:`.recovery`),
reaching it through a :class:`~.recovery.RecoveryPort`.
"""
import threading
from typing import Callable, List, Optional

import numpy as np

from ...errors import JobAbortedError, PeerError
from ..wire.message import Message, Meta, server_rank_to_id
from .pairs import KVPairs, kv_frames
from .recovery import NoServerRecovery, RecoveryPort, ServerRecovery
from .requests import PEER_LOG, Described, PendingRequests, Request
from .slicing import as_keys, slice_request

__all__ = ["open_worker"]


def _server_ids(slices) -> List[int]:
    return [server_rank_to_id(part.server_rank) for part in slices]


class KVWorker:
    """Sends push/pull/pushpull requests and SimpleApp commands to the servers."""

    def __init__(self, postoffice, app_id: int = 0, customer_id: int = 0,
                 request_timeout: Optional[float] = None):
        self.po, self.app_id, self.customer_id = postoffice, app_id, customer_id
        self.request_timeout = (request_timeout if request_timeout is not None
                                else postoffice.config.request_timeout)
        self._requests = PendingRequests()
        # answers only complete requests: handled on the receive loop where the van allows
        self._customer = postoffice.register_handler(app_id, customer_id, self._on_message,
                                                     inline=True)
        postoffice.on_failure(self._requests.fail_all)
        #: held while a request is stamped and sent, and while a restarted server is restored:
        #: a request is either in the recovering worker's report or sent after it, never both
        self.send_lock = threading.RLock()
        #: what restarted servers need of this layer (BYTEPS_SERVER_RECOVERY), or nothing
        self.recovery = (ServerRecovery(self._recovery_port())
                         if postoffice.config.server_recovery else NoServerRecovery())
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
        oldest = self._requests.oldest()
        if oldest is not None and now - oldest.started > self.request_timeout:
            self._expiry_posted = True
            self._customer.post(self._expire)

    def _expire(self) -> None:
        """On the customer thread: fail every request past its deadline."""
        self._expiry_posted = False
        self._requests.expire(self.request_timeout, self._name_node)

    def _name_node(self, node_id: int) -> str:
        """``server rank 1 (node 10) at 10.0.0.3:4000``, or ``node 10`` if unknown."""
        for node in self.po.nodes:
            if node.id == node_id:
                return node.describe_rank()
        return "node %d" % node_id

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
            self.po.landing.revoke_frame(landing)
            raise

    def expect_answers(self, key: int, nbytes: int) -> None:
        """Answers of ``nbytes`` for ``key`` will come every round: a van that receives in
        place sets up their buffer now."""
        self.po.landing.register_recv_buffer(key, nbytes)

    def _land(self, keys: np.ndarray, into, callback):
        """``(callback, landing)``: where a one-key pull's answer lands (``into``), and the
        callback that first takes the landing back (before the caller may free ``into``)."""
        landing = None
        if into is not None and len(keys) == 1:
            landing = self.po.landing.expect_frame(int(keys[0]), into)
        if landing is None:
            return callback, None

        def landed(request):
            self.po.landing.revoke_frame(landing)
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
        pull = self._requests.new(Described("pull (with its push)", keys), servers,
                                 pull_callback)

        def pushed(request):      # a push that failed to send comes here too
            if request.error is not None:
                self._requests.fail(pull, request.error)
            if push_callback is not None:
                push_callback(request)
        push = self._requests.new(Described("push", keys), servers, pushed)
        try:
            self._send_slices(push, slices, cmd, True, False, priority,
                              {"pull_timestamp": pull.timestamp})
        except BaseException:
            self.po.landing.revoke_frame(landing)
            raise
        return push, pull

    def command(self, head: int, body: bytes = b"", callback=None, servers=None) -> Request:
        """A SimpleApp command to every server (e.g. MXNet's kSyncMode = 3), or to the node
        ids ``servers``."""
        servers = self.po.group_ids(2) if servers is None else list(servers)
        request = self._requests.new("command %d" % head, servers, callback)
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
        request = self._requests.new(what, [server], callback)
        data, types = kv_frames(keys, vals, lens, with_empty_vals=True)
        meta = Meta(head=head, body=body, request=True, push=True, app_id=self.app_id,
                    customer_id=self.customer_id, timestamp=request.timestamp,
                    data_type=types, recver=server)
        with self.send_lock:
            self._send(request, Message(meta, data))
        return request

    def fail_server(self, server: int, error: BaseException) -> None:
        """Fail every request waiting on ``server`` with ``error``."""
        self._requests.fail_server(server, error)

    def _recovery_port(self) -> RecoveryPort:
        """What the recovery plug-in may do with this worker."""
        return RecoveryPort(self.send_lock, lambda: self.po.stopped, self.send_push,
                            self._requests.waiting_on, self._requests.count_answered,
                            self._resend)

    def _resend(self, request: Request, message: Message) -> None:
        """Send ``message`` of ``request`` again (to a restarted server)."""
        with self.send_lock:
            self._send(request, message)

    # -------------------------------------------------------------- internals
    def _request(self, keys, vals, lens, cmd, push, pull, priority, callback, extra,
                 on_send=None) -> Request:
        keys, lens, slices = self._sliced(keys, vals, lens, push)
        op = "pushpull" if push and pull else ("push" if push else "pull")
        request = self._requests.new(Described(op, keys), _server_ids(slices), callback)
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
                data, types = kv_frames(part.keys, part.vals if push else None, part.lens,
                                        with_empty_vals=True)
                meta = Meta(head=cmd, request=True, push=push, pull=pull, app_id=self.app_id,
                            customer_id=self.customer_id, timestamp=request.timestamp,
                            priority=priority, data_type=types, extra=extra,
                            recver=server_rank_to_id(part.server_rank))
                self._send(request, Message(meta, data))

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
        self._requests.fail(request, error)
        raised = request.error or error
        if raised is exc:       # (raised "from" itself it would be its own cause)
            raise raised
        raise raised from exc

    def _on_message(self, message: Message) -> None:
        meta = message.meta
        if meta.request:
            PEER_LOG.warning(meta.sender, "worker got a request from node %d; dropped",
                             meta.sender)
            return
        if not self.recovery.accepts(meta):
            return
        self._requests.take_answer(message)


def open_worker(postoffice) -> KVWorker:
    """The KV layer's worker app on a started ``postoffice`` (ps-lite's ``new KVWorker``): the
    one place outside this module's class that builds it, so its users hold an object, never
    the class (tests/unit/test_layers.py)."""
    return KVWorker(postoffice)
