"""A lighter ``concurrent.futures.Future`` for the per-key and per-request hot paths."""
import logging
import threading
from typing import Any, Callable, List, Optional

__all__ = ["Future"]

log = logging.getLogger(__name__)


class Future:
    """An outcome, as ``concurrent.futures.Future`` offers it (``done``, ``result``,
    ``exception``, ``add_done_callback``), without a Condition each: every key's pushpull made
    one (its pipeline task) and every KV request an Event, each step. An Event is made only for
    a caller that waits."""

    __slots__ = ("_lock", "_done", "_result", "_error", "_callbacks", "_event")

    def __init__(self):
        self._lock = threading.Lock()
        self._done = False
        self._result: Any = None
        self._error: Optional[BaseException] = None
        self._callbacks: List[Callable[["Future"], None]] = []
        self._event: Optional[threading.Event] = None

    def done(self) -> bool:
        return self._done

    def add_done_callback(self, fn: Callable[["Future"], None]) -> None:
        """Call ``fn(self)`` when finished (at once, on this thread, if it already is)."""
        with self._lock:
            if not self._done:
                self._callbacks.append(fn)
                return
        fn(self)

    def result(self, timeout: Optional[float] = None) -> Any:
        """The result; raises the error, or TimeoutError after ``timeout`` seconds."""
        self._wait(timeout)
        if self._error is not None:
            raise self._error
        return self._result

    def exception(self, timeout: Optional[float] = None) -> Optional[BaseException]:
        self._wait(timeout)
        return self._error

    def set_result(self, result: Any) -> None:
        self._finish(result, None)

    def set_exception(self, error: BaseException) -> None:
        self._finish(None, error)

    def _finish(self, result: Any, error: Optional[BaseException]) -> None:
        with self._lock:
            if self._done:
                raise RuntimeError("a future is finished once")
            self._done, self._result, self._error = True, result, error
            callbacks, self._callbacks = self._callbacks, []
            event = self._event
        if event is not None:
            event.set()
        for fn in callbacks:
            try:
                fn(self)
            except Exception:  # as concurrent.futures: one callback's failure stops no other
                log.exception("callback of a future failed")

    def _wait(self, timeout: Optional[float]) -> None:
        with self._lock:
            if self._done:
                return
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        if not event.wait(timeout):
            raise TimeoutError("not finished within %s s" % timeout)
