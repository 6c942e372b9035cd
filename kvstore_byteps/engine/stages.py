"""The worker pipeline: its stages, one priority queue and one thread per stage.

What runs through it are the two network stages, PUSH and PULL. The local reduce (a CPU sum,
or NCCL on GPUs) runs before a task is submitted, on the caller's thread, and the copy of each
partition's sum into the outputs (the local broadcast) runs as PULL's answer arrives: making
those stages would add two thread hand-offs per partition for work that is short and already
ordered. The trace still shows them (:class:`~.trace.Phase`).

A :class:`Task` is one tensor's pushpull. :meth:`Pipeline.submit` splits it into one
:class:`WorkItem` per partition; each item moves from stage queue to stage queue, and the task's
:attr:`Task.future` completes when every item has left the last stage (or, on error, when none
is still being worked on). Queues are ordered by the task's priority (higher first, FIFO among
equals); the queue of the first stage of the *credit span* (PUSH by default) lets at most
``credit`` items into the span (up to the end of PULL) at once, as BytePS's scheduling credit.

Each stage runs its :class:`~.stage_specs.StageSpec`'s function, called as the spec says
(:mod:`.stage_specs`: synchronous or asynchronous, inline, batched, on the thread that returns
credit). An exception raised by ``fn`` (or passed to ``done``) fails the task: the task's
queued items are dropped, its future gets the exception with a note naming the stage, key and
partition, and other tasks go on.
"""
import dataclasses
import logging
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..errors import DeadlineError, KVStoreBytePSError
from ..future import Future
from .credit import CreditScheduler
from .stage_specs import Done, Stage, StageSpec, check_order, check_span
from .trace import Tracer, now_ns

__all__ = ["Task", "WorkItem", "Pipeline", "PipelineClosedError"]

log = logging.getLogger(__name__)

#: Idle stage threads re-check for shutdown at least this often (seconds).
_IDLE_POLL_S = 1.0
#: Time stage threads get to stop after the drain deadline of :meth:`Pipeline.close` (seconds).
_STOP_GRACE_S = 1.0


class PipelineClosedError(KVStoreBytePSError):
    """The pipeline was closed before (or while) the task ran."""


class Task:
    """One tensor's trip through the pipeline. Stage functions read and write its fields."""

    def __init__(self, key: int, partitions: Sequence[Any], priority: int = 0, name: str = "",
                 context: Any = None):
        """``partitions``: one entry per work item (e.g. :class:`~.partition.Partition`);
        ``context``: what the stage functions need of this task (the worker's RoundData)."""
        if not partitions:
            raise ValueError("task of key %r has no partitions" % (key,))
        self.key = key
        self.partitions = tuple(partitions)
        self.priority = priority
        self.name = name or "key %s" % (key,)
        self.context = context
        self.future = Future()
        self.step = 0
        self._remaining = len(self.partitions)
        self._error: Optional[BaseException] = None
        self._resolved = False
        self._submitted = False

    @property
    def failed(self) -> bool:
        """Whether a stage failed this task (its remaining items are being dropped)."""
        return self._error is not None

    def __repr__(self) -> str:
        return "Task(%s, priority=%d, partitions=%d)" % (self.name, self.priority,
                                                          len(self.partitions))


@dataclasses.dataclass(eq=False)
class WorkItem:
    """One partition of a task on its way through the stages."""

    task: Task
    index: int
    partition: Any
    holds_credit: bool = False
    #: the riding pull (a pull sent along with its push) whose answer the PULL stage waits
    #: for; None on the plain and compressed routes
    riding_pull: Any = None

    @property
    def key(self) -> int:
        return self.task.key

    @property
    def priority(self) -> int:
        return self.task.priority


class Pipeline:
    """Runs tasks through ordered stages, one thread per stage. ``submit`` is thread-safe."""

    def __init__(self, stages: Sequence[StageSpec], credit: Optional[int] = None,
                 credit_span: Optional[Tuple[Stage, Stage]] = (Stage.PUSH, Stage.PULL),
                 tracer: Optional[Tracer] = None, name: str = "kvstore-byteps",
                 cost: Optional[Callable[["WorkItem"], int]] = None):
        """``credit`` limits the summed ``cost`` (default 1 per item) of the items inside
        ``credit_span`` (both ends included, if present)."""
        self._specs = check_order(stages)
        self._order = [spec.stage for spec in self._specs]
        self._span = check_span(credit_span, self._order) if credit is not None else None
        self._spec_of = {spec.stage: spec for spec in self._specs}
        for stage in (self._order[0], self._span and self._span[0]):
            if stage and self._spec_of[stage].inline is not None:
                raise ValueError("stage %s is queued (the first stage, or the credit span's): "
                                 "it cannot run inline" % stage.name)
        self._lock = threading.Lock()
        self._cost = cost or (lambda item: 1)
        self._queues = {stage: CreditScheduler(credit if self._span and stage == self._span[0]
                                               else None, self._cost) for stage in self._order}
        self._wake = {stage: threading.Condition(self._lock) for stage in self._order}
        self._idle = threading.Condition(self._lock)
        self._next = dict(zip(self._order, self._order[1:] + [None]))
        self._tracer = tracer if tracer is not None and tracer.enabled else None
        self._active: Dict[int, Task] = {}
        #: stages whose thread must be woken once the lock's holder is done (one notify per
        #: stage, not per item: a batch of answers moves many items at once)
        self._to_wake: set = set()
        self._closing = False
        self._stopping = False
        #: stages (runs_where_credit_returns) that a thread is running now, its own or one
        #: returning credit: one at a time
        self._running: set = set()
        #: such stages that got credit back while the lock's holder was at work
        self._to_run_here: set = set()
        self._threads = [threading.Thread(target=self._loop, args=(spec,), daemon=True,
                                          name="%s-%s" % (name, spec.stage.name))
                         for spec in self._specs]
        for thread in self._threads:
            thread.start()

    def __enter__(self) -> "Pipeline":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def submit(self, task: Task) -> Future:
        """Queue ``task``'s partitions at the first stage; return its future (result: None)."""
        first = self._order[0]
        with self._lock:
            if self._closing:
                raise PipelineClosedError("pipeline is closed; %r was not run" % (task,))
            if task._submitted:
                raise ValueError("%r was already submitted; a Task runs once" % (task,))
            task._submitted = True
            if self._tracer is not None:
                task.step = self._tracer.next_step(task.key)
            self._active[id(task)] = task
            for index, part in enumerate(task.partitions):
                self._queues[first].push(WorkItem(task, index, part), task.priority)
            self._wake[first].notify()
        return task.future

    def pending(self) -> int:
        """Number of submitted tasks whose future is not yet resolved."""
        with self._lock:
            return len(self._active)

    # --- stage threads -----------------------------------------------------------------

    def _loop(self, spec: StageSpec) -> None:
        queue, wake = self._queues[spec.stage], self._wake[spec.stage]
        shared = spec.runs_where_credit_returns
        while True:
            with self._lock:
                while not self._stopping and (not queue.ready()
                                              or (shared and spec.stage in self._running)):
                    wake.wait(_IDLE_POLL_S)
                if self._stopping:
                    return
                items = self._pop_locked(spec, queue)
                if shared:
                    self._running.add(spec.stage)
            try:
                self._run(spec, items)
            finally:
                if shared:
                    with self._lock:
                        self._running.discard(spec.stage)
            del items           # an idle stage thread keeps no finished task alive

    def _pop_locked(self, spec: StageSpec, queue: CreditScheduler) -> List[WorkItem]:
        items = []
        while queue.ready() and (spec.batch or not items):
            item = queue.pop()
            if self._span and spec.stage == self._span[0]:
                item.holds_credit = True
            else:
                queue.release(self._cost(item))  # queues outside the span only order
            items.append(item)
        return items

    def _run(self, spec: StageSpec, items: List[WorkItem]) -> None:
        live = [item for item in items if not item.task.failed]
        if len(live) < len(items):
            self._drop([item for item in items if item.task.failed])
        if not live:
            return
        start = now_ns()
        argument = live if spec.batch else live[0]
        if spec.asynchronous:
            done = Done(live, lambda items, error: self._finish(spec, items, start, error))
            try:
                spec.fn(argument, done)
            except Exception as exc:  # the stage function's failure belongs to the task
                if not done(exc) and not done.reported(exc):
                    log.exception("stage %s raised after calling done()", spec.stage.name)
            return
        try:
            spec.fn(argument)
        except Exception as exc:
            self._finish(spec, live, start, exc)
            return
        self._finish(spec, live, start, None)

    # --- moving items ------------------------------------------------------------------

    def _finish(self, spec: StageSpec, items: List[WorkItem], start: int,
                error: Optional[BaseException]) -> None:
        end = now_ns()
        if self._tracer is not None:
            for item in items:
                self._tracer.record(spec.stage, item.key, item.index, item.task.step, start,
                                    end, item.priority)
        if error is not None:
            _annotate(error, spec.stage, items)
        resolved: List[Task] = []
        inline: List[WorkItem] = []      # items whose next stage runs here, now
        with self._lock:
            for item in items:
                if error is not None:
                    self._fail_locked(item.task, error, resolved)
                if item.task.failed:
                    self._retire_locked(item, resolved)
                else:
                    self._advance_locked(spec.stage, item, resolved, inline)
            here = self._wake_locked()
        _resolve(resolved)
        if inline:
            self._run(self._spec_of[self._next[spec.stage]], inline)
        self._run_here(here)

    def _drop(self, items: List[WorkItem]) -> None:
        """Retire items of failed tasks without running them."""
        resolved: List[Task] = []
        with self._lock:
            for item in items:
                self._retire_locked(item, resolved)
            here = self._wake_locked()
        _resolve(resolved)
        self._run_here(here)

    def _advance_locked(self, stage: Stage, item: WorkItem, resolved: List[Task],
                        inline: List[WorkItem]) -> None:
        if self._span and stage == self._span[1]:
            self._release_locked(item)
        following = self._next[stage]
        if following is None:
            self._retire_locked(item, resolved)
            return
        runs_inline = self._spec_of[following].inline
        if runs_inline is not None and runs_inline(item):
            inline.append(item)
            return
        self._queues[following].push(item, item.priority)
        self._to_wake.add(following)

    def _release_locked(self, item: WorkItem) -> None:
        if item.holds_credit:
            item.holds_credit = False
            first = self._span[0]
            self._queues[first].release(self._cost(item))
            if self._spec_of[first].runs_where_credit_returns:
                self._to_run_here.add(first)
            else:
                self._to_wake.add(first)

    def _wake_locked(self) -> List[Stage]:
        """Wake the threads of the stages that got work; return the stages this thread runs
        itself once it let go of the lock (:meth:`_run_here`)."""
        for stage in self._to_wake:
            self._wake[stage].notify()
        self._to_wake.clear()
        if not self._to_run_here:
            return []
        here = list(self._to_run_here)
        self._to_run_here.clear()
        return here

    def _run_here(self, stages: List[Stage]) -> None:
        """Run what returned credit let into ``stages`` on this thread, unless a thread runs
        the stage already (that one takes these items too: it pops until the queue is not
        ready, and that check and its end are one step under the lock). Called from inside
        the stage (a send that failed at once finishes its items) it returns at once: no
        recursion."""
        for stage in stages:
            spec, queue = self._spec_of[stage], self._queues[stage]
            with self._lock:
                if stage in self._running:
                    continue
                self._running.add(stage)
            try:
                while True:
                    with self._lock:
                        if self._stopping or not queue.ready():
                            self._running.discard(stage)
                            break
                        items = self._pop_locked(spec, queue)
                    self._run(spec, items)
            except BaseException:
                with self._lock:
                    self._running.discard(stage)
                    self._wake[stage].notify()     # the stage's thread takes over
                raise

    def _retire_locked(self, item: WorkItem, resolved: List[Task]) -> None:
        self._release_locked(item)
        task = item.task
        task._remaining -= 1
        if task._remaining == 0:
            self._resolve_locked(task, resolved)

    def _fail_locked(self, task: Task, error: BaseException, resolved: List[Task]) -> None:
        if task.failed:
            return
        task._error = error
        for queue in self._queues.values():
            for dropped in queue.remove_if(lambda queued: queued.task is task):
                self._retire_locked(dropped, resolved)

    def _resolve_locked(self, task: Task, resolved: List[Task]) -> None:
        if not task._resolved:
            task._resolved = True
            resolved.append(task)
            self._active.pop(id(task), None)
            if not self._active:
                self._idle.notify_all()

    # --- shutdown ----------------------------------------------------------------------

    def close(self, timeout: float = 30.0) -> None:
        """Stop accepting tasks, let running ones finish until ``timeout``, stop the threads.

        Tasks still unfinished at the deadline fail with PipelineClosedError. The threads then
        get ``_STOP_GRACE_S`` more to stop (an idle one stops at once); raises DeadlineError
        naming the stages whose threads are still busy after that. Idempotent.
        """
        deadline = time.monotonic() + timeout
        with self._lock:
            self._closing = True
            while self._active and time.monotonic() < deadline:
                self._idle.wait(max(deadline - time.monotonic(), 0.0))
            resolved = self._abort_locked()
            self._to_wake.clear()                 # every thread is woken below
            self._stopping = True
            for wake in self._wake.values():
                wake.notify_all()
        _resolve(resolved)
        stuck = self._join(max(deadline, time.monotonic() + _STOP_GRACE_S))
        if stuck:
            raise DeadlineError("pipeline stage threads did not stop within %.1fs: %s"
                                % (timeout, ", ".join(stuck)))

    def _abort_locked(self) -> List[Task]:
        resolved: List[Task] = []
        for task in list(self._active.values()):
            error = PipelineClosedError("pipeline closed before %r finished" % (task,))
            self._fail_locked(task, error, resolved)
            self._resolve_locked(task, resolved)
        return resolved

    def _join(self, deadline: float) -> List[str]:
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(max(deadline - time.monotonic(), 0.0))
        current = threading.current_thread()
        return [thread.name for thread in self._threads
                if thread.is_alive() and thread is not current]


def _annotate(error: BaseException, stage: Stage, items: List[WorkItem]) -> None:
    """Add a note naming where the error happened (the exception keeps its type)."""
    where = ", ".join("%s partition %d" % (item.task.name, item.index) for item in items[:4])
    if len(items) > 4:
        where += ", ... (%d partitions)" % len(items)
    if hasattr(error, "add_note"):
        error.add_note("in kvstore-byteps stage %s (%s)" % (stage.name, where))


def _resolve(tasks: List[Task]) -> None:
    """Complete futures outside the lock (their callbacks may submit new tasks). The result is
    None, not the task: a task holds its future, so a future holding its task made every task
    a reference cycle, freed only by the garbage collector (with 1000 small keys a round, its
    collections took ~15% of a worker's CPU)."""
    for task in tasks:
        if task._error is not None:
            task.future.set_exception(task._error)
        else:
            task.future.set_result(None)
