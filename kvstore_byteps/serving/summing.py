"""Summation threads of the BytePS data path (``BYTEPS_SERVER_ENGINE_THREAD``).

Each key is bound to one thread when it is initialised, so the pushes of a key are summed in
arrival order by a single thread and never race. Keys go to the thread with the fewest bytes
bound so far: with equal-size partitions that spreads them evenly (a plain hash of a few keys
over a few threads often does not). numpy releases the GIL while it adds, so threads sum
different keys in parallel.
"""
import collections
import heapq
import itertools
import logging
import queue
import threading
import time
from typing import Callable, List

from ..errors import DeadlineError

__all__ = ["SumThreads"]

log = logging.getLogger(__name__)

_STOP = object()


class SumThreads:
    """A fixed set of worker threads, each with its own FIFO queue. Thread-safe."""

    def __init__(self, num_threads: int, name: str = "byteps-sum"):
        if num_threads < 1:
            raise ValueError("summing needs at least one thread, got %r" % num_threads)
        self._queues: List[queue.SimpleQueue] = [queue.SimpleQueue() for _ in range(num_threads)]
        self._load = [0] * num_threads
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(q,), daemon=True,
                                          name="%s-%d" % (name, i))
                         for i, q in enumerate(self._queues)]
        for thread in self._threads:
            thread.start()

    @property
    def num_threads(self) -> int:
        return len(self._threads)

    def bind(self, nbytes: int) -> int:
        """Choose the thread for a new key of ``nbytes`` (the least loaded one)."""
        with self._lock:
            index = min(range(len(self._load)), key=self._load.__getitem__)
            self._load[index] += nbytes
            return index

    def submit(self, thread: int, task: Callable[[], None], delay: float = 0.0) -> None:
        """Run ``task`` on ``thread`` after the tasks queued there before it; with ``delay``,
        not before ``delay`` seconds from now (a timed task does not hold the queue up)."""
        self._queues[thread].put(task if delay <= 0 else
                                 _Later(time.monotonic() + delay, next(_order), task))

    def close(self, timeout: float = 10.0) -> None:
        """Let queued tasks finish, then stop the threads; DeadlineError if they do not."""
        for q in self._queues:
            q.put(_STOP)
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in self._threads if t.is_alive()]
        if alive:
            raise DeadlineError("summing threads did not stop within %.1f s: %s"
                                % (timeout, ", ".join(alive)))

    @staticmethod
    def _run(tasks: queue.SimpleQueue) -> None:
        later: List[_Later] = []        # timed tasks, soonest first (dropped at a stop)
        while True:
            try:
                task = tasks.get(timeout=max(0.0, later[0].due - time.monotonic())
                                 if later else None)
            except queue.Empty:
                task = None
            if task is _STOP:
                return
            if isinstance(task, _Later):
                heapq.heappush(later, task)
            elif task is not None:
                _call(task)
            while later and later[0].due <= time.monotonic():
                _call(heapq.heappop(later).task)


def _call(task: Callable[[], None]) -> None:
    try:
        task()
    except Exception:  # a task answers its own errors; never let the thread die
        log.exception("summing task failed")


_order = itertools.count()
#: a timed task; heap order: due time, then submission
_Later = collections.namedtuple("_Later", "due order task")
