"""The pipeline's stages as data: which stages there are, how each one's function is called,
the ``done`` callback an asynchronous stage function finishes its items with, and the checks
of a pipeline's list of stages (:mod:`.stages` runs them).

Stage functions are plain callables, so tests plug in fakes and the integrator plugs in the
KVWorker-backed PUSH/PULL:

* synchronous (``StageSpec(stage, fn)``): ``fn(item)`` does the work and returns;
* asynchronous (``asynchronous=True``): ``fn(item, done)`` starts the work and returns at once;
  whoever finishes it calls ``done()`` or ``done(error)``, from any thread, exactly once;
* ``inline`` (a predicate on an item): an item for which it is true runs the stage on the
  thread that finished the item's previous stage, with the others that stage finished at once,
  instead of through the stage's queue and thread: for a function that starts nothing in
  priority order and never blocks (the worker's PULL for a pull that rode with its push: it
  only waits for an answer already on its way), where the queue, the wake-up and the thread
  switch per item cost more than the function;
* ``runs_where_credit_returns=True`` (the credit span's first stage): the thread that returns
  credit (the worker's receive loop, completing a push) runs the items that credit lets in,
  after it lets go of the pipeline's lock, instead of waking the stage's thread: for a
  function that never waits (the worker's PUSH on a van whose sends never block), where a
  wake-up per returned credit cost a thread switch and an interpreter-lock hand-off. One
  thread runs the stage at a time (its own, or one returning credit), in queue order; new
  tasks still wake the stage's thread (a submitter may hold locks of its own that a push
  finishing at once would need);
* ``batch=True``: ``fn`` receives a list of all the items that may leave the queue now (still
  bounded by credit), e.g. to send one request per server for many small partitions. An
  asynchronous batch stage may finish its items piecemeal, ``done(error, items)`` for each part
  as it completes (``done()`` alone finishes whatever is left): each item then moves on, and
  returns its credit, as soon as its own request is answered, not when the whole batch is.
  (Finishing a batch at once made the pushes go in waves: no new push until the slowest of
  the wave was acknowledged, which left the link idle; measured on 1 Gbit/s links.)
"""
import dataclasses
import enum
import threading
from typing import Any, Callable, List, Optional, Sequence, Tuple

__all__ = ["Stage", "StageSpec", "Done", "check_order", "check_span"]


class Stage(enum.IntEnum):
    """The pipeline's stages, in data-path order (values as :class:`~.trace.Phase`'s)."""

    PUSH = 2
    PULL = 3


@dataclasses.dataclass(frozen=True)
class StageSpec:
    """One stage of a pipeline: its name, its function and how the function is called."""

    stage: Stage
    fn: Callable[..., None]
    asynchronous: bool = False
    batch: bool = False
    #: which items skip the stage's queue and thread (module docstring); None: none
    inline: Optional[Callable[[Any], bool]] = None
    #: the thread that returns credit runs the items it lets in (module docstring)
    runs_where_credit_returns: bool = False


class Done:
    """The ``done(error=None, items=None)`` callback of an asynchronous stage call.

    Finishes ``items`` (default: every item not finished yet); each item is finished once, so
    later calls for the same items do nothing. Thread-safe.
    """

    def __init__(self, items: Sequence[Any],
                 action: Callable[[List[Any], Optional[BaseException]], None]):
        self._left = {id(item): item for item in items}
        self._action = action
        self._lock = threading.Lock()
        self._errors: List[BaseException] = []    # what items were finished with

    def reported(self, error: BaseException) -> bool:
        """Whether items were finished with this very error (e.g. a failed send fails its
        request, whose callback calls done(error), and then raises the same error)."""
        with self._lock:
            return any(error is known for known in self._errors)

    def __call__(self, error: Optional[BaseException] = None,
                 items: Optional[Sequence[Any]] = None) -> bool:
        """Finish ``items`` (or all left); return whether any item was finished by this call."""
        with self._lock:
            if items is None:
                chosen = list(self._left.values())
                self._left.clear()
            else:
                chosen = [self._left.pop(id(item)) for item in items if id(item) in self._left]
            if chosen and error is not None:
                self._errors.append(error)
        if not chosen:
            return False
        self._action(chosen, error)
        return True


def check_order(stages: Sequence[StageSpec]) -> List[StageSpec]:
    specs = list(stages)
    if not specs:
        raise ValueError("a pipeline needs at least one stage")
    order = [spec.stage for spec in specs]
    if order != sorted(set(order)):
        raise ValueError("stages must be distinct and in data-path order, got %s"
                         % [stage.name for stage in order])
    return specs


def check_span(span: Optional[Tuple[Stage, Stage]], order: List[Stage]):
    if span is None:
        return None
    first, last = span
    if first not in order or last not in order or last < first:
        raise ValueError("credit span %s..%s is not a range of this pipeline's stages %s"
                         % (first.name, last.name, [stage.name for stage in order]))
    return span
