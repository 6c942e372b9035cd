"""A customer (ps-lite's Customer): one app's message handler, on a thread of its own or inline.

The postoffice hands each data message to its app's customer. :class:`HandlerThread` runs the
handler on a thread of its own, so a slow handler never stalls the van's receive loop (a
server's handlers, which sum and may run an optimizer). :class:`InlineHandler` runs it on the
thread that delivers the message (a worker's, which only complete requests: the hand-off to
another thread, a queue, a wake-up and a GIL switch per answer, cost more than the handling).
:class:`MixedHandler` does both: the messages a predicate calls quick (a server's round pushes,
which only count and queue a sum) run on the delivering thread while its own thread is idle,
the rest (and every message that comes while it is busy) on its own thread, in arrival order.
Thread-safety: ``accept``, ``post`` and ``stop`` are thread-safe.
"""
import logging
import queue
import threading
from typing import Callable, Optional, Union

from ...logs import PeerLog
from ..wire.message import Message

log = logging.getLogger(__name__)


class _Customer:
    """What every customer shares: running one message or posted work, never raising (a
    subclass sets ``app_id``, ``customer_id``, ``handler`` and ``_peer_log``)."""

    def _handle(self, message: Union[Message, Callable[[], None]]) -> None:
        if callable(message):
            try:
                message()
            except Exception:
                log.exception("app %d customer %d: posted work failed", self.app_id,
                              self.customer_id)
            return
        try:
            self.handler(message)
        except Exception:  # a bad message must not kill the app (or the receive loop)
            self._peer_log.warning(message.meta.sender,
                                   "app %d customer %d failed on a message from node %s",
                                   self.app_id, self.customer_id, message.meta.sender,
                                   exc_info=True)


class HandlerThread(_Customer):
    """Runs one app's message handler on a dedicated thread, in arrival order.

    (ps-lite's Customer also tracks the app's requests; here the KV layer does that.)"""

    #: the handler runs on a thread of its own, not on the van's receive loop
    on_receive_loop = False

    def __init__(self, app_id: int, customer_id: int, handler: Callable[[Message], None]):
        self.app_id, self.customer_id, self.handler = app_id, customer_id, handler
        self._queue: "queue.SimpleQueue[Optional[Message]]" = queue.SimpleQueue()
        self._peer_log = PeerLog(log)
        self._thread = threading.Thread(target=self._loop, daemon=True,
                                        name="customer-%d-%d" % (app_id, customer_id))
        self._thread.start()

    def accept(self, message: Message) -> None:
        self._queue.put(message)

    def post(self, work: Callable[[], None]) -> None:
        """Run ``work()`` on this thread, after the messages already queued."""
        self._queue.put(work)

    def stop(self, timeout: float) -> None:
        self._queue.put(None)
        self._thread.join(timeout)

    def _loop(self) -> None:
        while True:
            message = self._queue.get()
            if message is None:
                return
            self._handle(message)
            self._done()

    def _done(self) -> None:
        """One queued item was handled (MixedHandler counts them)."""

class MixedHandler(HandlerThread):
    """A :class:`HandlerThread` whose quick messages (``quick(message)`` is true: a handler
    that never waits, for the van or for long work) run on the delivering thread whenever
    the own thread has nothing queued or running: one hand-off, wake-up and GIL switch less
    per message. Messages are still handled one at a time and in arrival order: while the
    thread is busy, quick ones queue behind it. Only on vans whose sends from the receive
    loop never wait for a peer (``Van.handlers_inline_ok``)."""

    def __init__(self, app_id: int, customer_id: int, handler: Callable[[Message], None],
                 quick: Callable[[Message], bool]):
        self.quick = quick
        # a van may deliver from two loops (auto); reentrant: a handler may post work
        self._lock = threading.RLock()
        self._queued = 0                    # items given to the thread and not yet handled
        self._stopped = False
        super().__init__(app_id, customer_id, handler)

    def accept(self, message: Message) -> None:
        with self._lock:
            if self._stopped:
                return
            if not self._queued and self.quick(message):
                self._handle(message)       # the thread is idle: nothing can overtake it
                return
            self._queued += 1
        self._queue.put(message)

    def post(self, work: Callable[[], None]) -> None:
        with self._lock:
            self._queued += 1
        self._queue.put(work)

    def stop(self, timeout: float) -> None:
        with self._lock:
            self._stopped = True
        super().stop(timeout)

    def _done(self) -> None:
        with self._lock:
            self._queued -= 1


class InlineHandler(_Customer):
    """Runs one app's message handler on the delivering thread (the van's receive loop), one
    message at a time. Only for handlers that never wait for the van (a worker's: answers
    complete requests and wake the threads that send), and on vans whose sends from that
    thread do not wait for a peer (``Van.handlers_inline_ok``)."""

    #: the handler runs on the van's receive loop, whose sends never wait for a peer
    on_receive_loop = True

    def __init__(self, app_id: int, customer_id: int, handler: Callable[[Message], None]):
        self.app_id, self.customer_id, self.handler = app_id, customer_id, handler
        self._lock = threading.Lock()       # a van may deliver from two loops (auto)
        self._stopped = False
        self._peer_log = PeerLog(log)

    def accept(self, message: Message) -> None:
        with self._lock:
            if self._stopped:
                return
            self._handle(message)

    def post(self, work: Callable[[], None]) -> None:
        """Run ``work()`` now, between two messages."""
        with self._lock:
            if self._stopped:
                return
            self._handle(work)

    def stop(self, timeout: float) -> None:
        """Handle nothing more (waits at most ``timeout`` for a message being handled)."""
        if self._lock.acquire(timeout=timeout):
            self._stopped = True
            self._lock.release()
        else:
            self._stopped = True
