"""Credit-based priority queue, as BytePS schedules partitions. Pure; not thread-safe.

Items wait in a priority queue: a higher ``priority`` leaves first (MXNet passes
``priority = -param_index``, so layer 0, needed first by the next forward pass, goes first), and
items of equal priority leave in the order they arrived. A queue built with a credit lets at most
``credit`` units be *in flight* (popped and not yet released). An item costs ``cost(item)``
units (default 1). BytePS allows ``BYTEPS_SCHEDULING_CREDIT`` partitions' worth of *bytes* in
flight, so the worker passes the partition's byte size as cost: many small partitions may fly
at once where one big one would use a whole credit. An item is always let out when nothing is in
flight, so an item costlier than the whole credit cannot block the queue.

Because a higher-priority item enqueued later is popped before lower-priority ones still queued,
the front layers' partitions overtake the back layers' whenever the credit is exhausted.

The caller serialises access (the pipeline holds its lock around every call).
"""
import heapq
import itertools
from typing import Callable, Generic, List, Optional, Tuple, TypeVar

__all__ = ["CreditScheduler"]

T = TypeVar("T")


class CreditScheduler(Generic[T]):
    """Priority queue whose pops are limited by a credit of in-flight items."""

    def __init__(self, credit: Optional[int] = None,
                 cost: Optional[Callable[[T], int]] = None):
        """``credit``: most cost units in flight at once (``None``: unlimited); ``cost(item)``:
        the units an item takes (default 1)."""
        if credit is not None and credit < 1:
            raise ValueError("credit must be positive or None, got %r" % (credit,))
        self._credit = credit
        self.cost = cost or (lambda item: 1)
        self._in_flight = 0
        self._heap: List[Tuple[int, int, int, T]] = []    # (-priority, order, cost, item)
        self._order = itertools.count()

    def __len__(self) -> int:
        """Number of queued (not yet popped) items."""
        return len(self._heap)

    @property
    def in_flight(self) -> int:
        """Items popped and not yet released."""
        return self._in_flight

    @property
    def credit(self) -> Optional[int]:
        """The configured credit (``None``: unlimited)."""
        return self._credit

    def has_credit(self) -> bool:
        """Whether the next item may be popped now."""
        if self._credit is None or self._in_flight == 0:
            return True
        return bool(self._heap) and self._in_flight + self._heap[0][2] <= self._credit

    def push(self, item: T, priority: int = 0) -> None:
        """Queue ``item``; higher ``priority`` leaves earlier, FIFO among equals."""
        # the cost is taken once here: the credit check reads it for every look at the queue
        heapq.heappush(self._heap, (-priority, next(self._order), self.cost(item), item))

    def ready(self) -> bool:
        """Whether :meth:`pop` would return an item."""
        return bool(self._heap) and self.has_credit()

    def pop(self) -> Optional[T]:
        """Take the highest-priority item and its credit, or return None if none may leave."""
        if not self.ready():
            return None
        _, _, cost, item = heapq.heappop(self._heap)
        self._in_flight += cost
        return item

    def release(self, count: int = 1) -> None:
        """Return ``count`` units of credit (an item's cost); raise if more than in flight."""
        if not 0 <= count <= self._in_flight:
            raise ValueError("releasing %d credits but only %d are in flight"
                             % (count, self._in_flight))
        self._in_flight -= count

    def remove_if(self, predicate: Callable[[T], bool]) -> List[T]:
        """Drop queued items matching ``predicate`` (no credit involved); return them in order."""
        kept = [entry for entry in self._heap if not predicate(entry[3])]
        removed = sorted(entry for entry in self._heap if predicate(entry[3]))
        if removed:
            self._heap = kept
            heapq.heapify(self._heap)
        return [entry[3] for entry in removed]
