"""A worker's rounds through the stage pipeline: each round of a key (already reduced locally)
a pipeline task, a key's rounds submitted in order, and the PUSH and PULL stage functions that
send its partitions on their transfer route (plain, the pull riding along with the push, or
compressed: :mod:`.routes`). How a round ends is the engine's (``finished``)."""
import dataclasses
import logging
import threading
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from ..compress.params import CompressionSpec
from ..config import ServerKind
from .layout import KeyLayout, ServerDialect
from .mxnet_twobit import MXNetTwoBitRoute
from .recovery import Unrecoverable
from .routes import CompressedRoute, PlainRoute, RidingRoute
from .stage_specs import Stage, StageSpec
from .stages import Pipeline, Task
from .trace import Phase, Tracer

__all__ = ["Rounds", "RoundData"]

log = logging.getLogger(__name__)

#: ``finished(error_or_None, on_done)``: a round ended (the engine notes the outcome, then
#: calls ``on_done``)
Finished = Callable[[Optional[BaseException], Optional[Callable]], None]


class _Finished:
    """A task's done-callback: an object, not a closure (fewer objects for the cyclic garbage
    collector per key in flight, see mxnet_patch/pushpull_ops.py's _PushPull)."""

    __slots__ = ("finished", "on_done")

    def __init__(self, finished: Finished, on_done):
        self.finished, self.on_done = finished, on_done

    def __call__(self, future) -> None:
        try:
            self.finished(future.exception(), self.on_done)
        except Exception as exc:  # never leave the engine operation pending: a silent hang
            log.exception("finishing a pushpull failed")
            if self.on_done is not None:
                self.on_done(exc)     # done() is idempotent: a second call does nothing


def _rides(item) -> bool:
    """Whether ``item``'s pull rode with its push (the PULL stage runs it inline)."""
    return item.riding_pull is not None


@dataclasses.dataclass
class RoundData:
    """What the PUSH and PULL stages need of one pushpull (a pipeline Task's ``context``)."""

    layout: KeyLayout
    send: np.ndarray                  # the locally reduced bytes, pushed partition by partition
    outputs: List[np.ndarray]         # flat byte views the pulled sum is copied into
    #: when the local reduce ran (before the task had a step): recorded at submission
    reduced_ns: Optional[Tuple[int, int]]


class Rounds:
    """The pipeline and the routes of one worker. Thread-safe :meth:`submit`."""

    def __init__(self, kv, dialect: ServerDialect, tracer: Tracer, keeper: Unrecoverable,
                 rides: bool, finished: Finished):
        """``rides``: each pull goes along with its push (:func:`.modes.pulls_ride`)."""
        self.kv, self.dialect, self.tracer = kv, dialect, tracer
        self._finished = finished
        self._last_task: Dict[int, Task] = {}    # rounds of one key run in order
        self._order_lock = threading.Lock()
        self.route = (RidingRoute if rides else PlainRoute)(kv, tracer, keeper)
        self.compressed: Optional[CompressedRoute] = None     # with gradient compression
        self._weights = False        # the servers answer rounds with weights (answer_weights)
        self.pipeline = Pipeline(self._stages(), credit=dialect.credit(),
                                 credit_span=(Stage.PUSH, Stage.PUSH), tracer=tracer,
                                 cost=lambda item: max(1, item.partition.nbytes))

    def submit(self, layout: KeyLayout, send: np.ndarray, outputs: List[np.ndarray],
               priority: int, on_done, reduced_ns: Optional[Tuple[int, int]] = None) -> Task:
        """Run one round of ``layout`` (already reduced into ``send``; flat byte views of the
        ``outputs``) through the pipeline; ``reduced_ns``: when the local reduce ran."""
        task = Task(layout.key, layout.partitions, priority, name=layout.name,
                    context=RoundData(layout, send, outputs, reduced_ns))
        task.future.add_done_callback(_Finished(self._finished, on_done))
        self._submit_in_order(task)
        return task

    def begun(self) -> bool:
        """Whether a round was submitted."""
        with self._order_lock:
            return bool(self._last_task)

    def compress(self, spec: CompressionSpec) -> None:
        """Every partition ``spec`` compresses goes on the compressed route from now on
        (before the first round): MXNet's 2-bit as MXNet's worker sends it to MXNet's servers,
        else ours."""
        if self.dialect.kind is ServerKind.MXNET:
            self.compressed = MXNetTwoBitRoute(self.kv, self.tracer, spec.threshold,
                                               self.dialect.num_servers)
        else:
            self.compressed = CompressedRoute(self.kv, self.tracer, spec)
        if self._weights:
            self.compressed.pull_weights()

    def answer_weights(self) -> None:
        """The servers run the optimizer from now on: a round's answer is the weights, which
        a compressed partition pulls uncompressed."""
        self._weights = True
        if self.compressed is not None:
            self.compressed.pull_weights()

    def close(self, timeout: float) -> None:
        """Let the rounds in flight finish until ``timeout``, stop the stage threads."""
        self.pipeline.close(timeout)

    def _submit_in_order(self, task: Task) -> None:
        """Submit ``task`` once the previous round of its key is complete: the server keeps
        two round buffers per key, so a worker's round r+1 must not overtake its round r."""
        with self._order_lock:
            previous, self._last_task[task.key] = self._last_task.get(task.key), task
        if previous is None or previous.future.done():
            self._submit(task)
        else:
            previous.future.add_done_callback(lambda _: self._submit(task))

    def _submit(self, task: Task) -> None:
        self.pipeline.submit(task)   # numbers the task's step (for the trace)
        reduced = task.context.reduced_ns
        if reduced is not None:
            self.tracer.record(Phase.LOCAL_REDUCE, task.key, -1, task.step, reduced[0],
                               reduced[1], task.priority)

    def _stages(self) -> List[StageSpec]:
        # The next pushes run on the thread that returns a push's credit (the receive loop,
        # which completes the requests), where the van's sends never wait for a peer: no
        # thread switch per acknowledgement. A pull that rode with its push only waits for
        # its answer: no queue, no thread.
        return [StageSpec(Stage.PUSH, self._push, asynchronous=True, batch=True,
                          runs_where_credit_returns=self.kv.answers_on_receive_loop),
                StageSpec(Stage.PULL, self._pull, asynchronous=True, batch=True,
                          inline=_rides)]

    def _push(self, items, done) -> None:
        # Each request's partitions move on (and return their credit) when it is answered.
        for route, group in self._requests(items):
            route.push(group, done)

    def _pull(self, items, done) -> None:
        riding = [item for item in items if item.riding_pull is not None]
        if riding:
            self.route.pull(riding, done)
        for route, group in self._requests([item for item in items if item.riding_pull is None]):
            route.pull(group, done)

    def _requests(self, items) -> List[tuple]:
        """``(route, group)`` per request: items grouped as the servers' dialect groups them
        on the plain (or riding) route; a compressed partition goes alone on its route."""
        if self.compressed is None:
            return [(self.route, group) for group in self.dialect.requests(items)]
        plain, alone = [], []
        for item in items:
            (alone if self.compressed.takes(item) else plain).append(item)
        return ([(self.route, group) for group in self.dialect.requests(plain)]
                + [(self.compressed, [item]) for item in alone])
