"""A node's life as its owning threads wait on it: ready (the cluster formed), the barriers the
scheduler releases, and the receive loop's end with the error that stopped it (the first one
wins), told once: to start()'s caller while start() waits, else to the log, and to the
failure hooks.

Thread-safety: every method is thread-safe; ``record_failure`` and ``finish`` are the receive
thread's.
"""
import logging
import threading
import time
from typing import Callable, List, Optional

from ...errors import DeadlineError, JobAbortedError, JobFinished, PeerError

log = logging.getLogger(__name__)

_PROGRESS_LOG_SECONDS = 30.0


class Lifecycle:
    """Whether the node is ready, whether its receive loop stopped, and why it stopped."""

    def __init__(self) -> None:
        self.ready = threading.Event()
        self.stopped = threading.Event()
        self.error: Optional[BaseException] = None
        #: while start() waits: a failure then is start()'s to raise (and its caller's to
        #: report), not the receive loop's to log as well (the user read it twice)
        self._starting = False
        self._lock = threading.Lock()
        self._failure_hooks: List[Callable[[BaseException], None]] = []

    def starting(self) -> None:
        """start() waits from now on for the receive thread's verdict."""
        self._starting = True

    def started(self) -> Optional[BaseException]:
        """start() waited: the error that stopped the node meanwhile, if any (start() raises
        it); failures from now on are logged."""
        with self._lock:
            self._starting = False
            return self.error

    def record_failure(self, error: BaseException, line: str) -> None:
        """The error that stops this node (the first one wins), and its ``line`` logged, once:
        while start() waits, start() raises it and its caller reports it (a worker's one-line
        error, the server's and scheduler's "failed"), so it is not logged here too."""
        with self._lock:
            self.error = self.error or error
            raised_by_start = self._starting
        if raised_by_start:
            log.debug("%s (start() raises it)", line)
        elif isinstance(error, JobFinished):    # no failure: the late worker's State() says it
            log.info("%s", line)
        else:
            log.error("%s", line)

    def on_failure(self, hook: Callable[[BaseException], None]) -> None:
        self._failure_hooks.append(hook)

    def finish(self) -> None:
        """The receive loop ended: stopped, the failure hooks told the error (if any), and
        every wait for readiness ends."""
        self.stopped.set()
        if self.error is not None:
            for hook in list(self._failure_hooks):
                try:
                    hook(self.error)
                except Exception:
                    log.exception("a failure hook failed")
        self.ready.set()

    def raise_if_aborted(self) -> None:
        """A job some node ended: its error again, with the whole story (who, and why)."""
        if isinstance(self.error, JobAbortedError):
            raise self.error.again()


class BarrierWaits:
    """How many barriers the scheduler released to this node, and the wait for the next one,
    which ends with the node's life (``lifecycle``: whether it stopped, and why)."""

    def __init__(self, lifecycle: Lifecycle) -> None:
        self._lifecycle = lifecycle
        self._cond = threading.Condition()
        self._released = 0

    def next_release(self) -> int:
        """The release count the barrier about to be requested completes at."""
        with self._cond:
            return self._released + 1

    def release(self) -> None:
        with self._cond:
            self._released += 1
            self._cond.notify_all()

    def wake(self) -> None:
        """The receive loop ended: every waiter looks again."""
        with self._cond:
            self._cond.notify_all()

    def wait(self, target: int, group: int, timeout: Optional[float], who: str,
             members: List[int]) -> None:
        """Until the ``target``-th release; ``timeout=None`` waits as long as the node lives,
        logging progress; otherwise DeadlineError after ``timeout`` s. ``who``: this node;
        ``members``: the group's node ids."""
        started = time.monotonic()
        with self._cond:
            while self._released < target:
                if self._lifecycle.stopped.is_set():
                    self._lifecycle.raise_if_aborted()       # who ended it, and why
                    raise PeerError("barrier of group %d aborted: the van stopped (%s)"
                                    % (group, self._lifecycle.error))
                waited = time.monotonic() - started
                if timeout is not None and waited > timeout:
                    raise DeadlineError("%s: barrier of group %d (nodes %s) not complete after "
                                        "%.0f s" % (who, group, members, waited))
                if not self._cond.wait(_PROGRESS_LOG_SECONDS if timeout is None
                                       else min(timeout, _PROGRESS_LOG_SECONDS)):
                    log.info("%s still waiting for barrier of group %d", who, group)
