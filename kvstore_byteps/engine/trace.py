"""Per-partition stage timing, kept in memory and dumped as Chrome trace JSON.

The names are BytePS's: ``BYTEPS_TRACE_ON`` enables it, ``BYTEPS_TRACE_START_STEP`` and
``BYTEPS_TRACE_END_STEP`` bound the steps recorded (a key's step counts its pushpulls, from 0,
both bounds inclusive), and :meth:`Tracer.dump` writes ``<BYTEPS_TRACE_DIR>/<rank>/comm.json``,
which ``chrome://tracing`` or Perfetto open. Each key is a process row, named by MXNet's
parameter name where the store was given one (str keys) and ``key N`` otherwise; its partitions
are thread rows with one event per stage (LOCAL_REDUCE of the whole tensor on the ``tensor``
row, then PUSH, PULL and LOCAL_BROADCAST per partition).

Recording is cheap so it can stay on in tests: a disabled tracer's :attr:`Tracer.enabled` is
False and callers skip it; an enabled one appends a small frozen record to a list (atomic under
the GIL, so any thread may record without a lock). The pipeline's own trace is what proves the
order partitions left in (tests read :meth:`Tracer.events`, not wall-clock guesses).
"""
import dataclasses
import enum
import json
import os
import threading
import time
from typing import Any, Dict, List, Optional

from ..config import Config

__all__ = ["Phase", "TraceEvent", "Tracer", "now_ns"]

#: The clock of every trace timestamp (monotonic, nanoseconds).
now_ns = time.perf_counter_ns


class Phase(enum.IntEnum):
    """What a worker's trace shows, in data-path order. PUSH and PULL are the pipeline's
    stages (:class:`~.stages.Stage`, same values); the local reduce and broadcast run inline
    in the worker (before submission, and as each partition's answer arrives)."""

    LOCAL_REDUCE = 0
    PUSH = 2
    PULL = 3
    LOCAL_BROADCAST = 5


@dataclasses.dataclass(frozen=True)
class TraceEvent:
    """One partition's stay in one stage: ``[start_ns, end_ns)`` on :data:`now_ns`'s clock."""

    stage: Any
    key: int
    part: int
    step: int
    start_ns: int
    end_ns: int
    priority: int = 0

    @property
    def stage_name(self) -> str:
        """The stage as text (enum members give their name)."""
        return getattr(self.stage, "name", str(self.stage))


class Tracer:
    """Collects :class:`TraceEvent` s of the steps inside the configured window.

    Thread-safe: :meth:`record` may be called from any thread; :meth:`next_step` takes a lock.
    """

    def __init__(self, enabled: bool = False, start_step: int = 0, end_step: int = 2 ** 62,
                 trace_dir: str = "./trace", rank: int = 0):
        """Record steps ``start_step..end_step`` (inclusive) when ``enabled``."""
        if start_step < 0 or end_step < start_step:
            raise ValueError("trace window [%d, %d] is empty or negative"
                             % (start_step, end_step))
        self.enabled = enabled
        self.start_step = start_step
        self.end_step = end_step
        self.trace_dir = trace_dir
        self.rank = rank
        self._events: List[TraceEvent] = []
        self._steps: Dict[int, int] = {}
        self._names: Dict[int, str] = {}
        self._lock = threading.Lock()
        self._origin_ns = now_ns()

    @classmethod
    def from_config(cls, config: Config, rank: int = 0) -> "Tracer":
        """A tracer with the ``BYTEPS_TRACE_*`` settings of ``config``."""
        return cls(config.trace_on, config.trace_start_step, config.trace_end_step,
                   config.trace_dir, rank)

    def name_key(self, key: int, name: str) -> None:
        """Show ``key`` as ``name`` (MXNet's parameter name, where the key was one)."""
        self._names[key] = name

    def name_of(self, key: int) -> str:
        """How ``key`` is shown."""
        return self._names.get(key, "key %d" % key)

    def next_step(self, key: int) -> int:
        """Count one more pushpull of ``key``; return its step number (0 for the first)."""
        with self._lock:
            step = self._steps.get(key, 0)
            self._steps[key] = step + 1
        return step

    def wants(self, step: int) -> bool:
        """Whether events of ``step`` are recorded."""
        return self.enabled and self.start_step <= step <= self.end_step

    def record(self, stage, key: int, part: int, step: int, start_ns: int, end_ns: int,
               priority: int = 0) -> None:
        """Keep one event if tracing is on and ``step`` is inside the window."""
        if self.wants(step):
            self._events.append(TraceEvent(stage, key, part, step, start_ns, end_ns, priority))

    def events(self) -> List[TraceEvent]:
        """A snapshot of the events recorded so far, in recording order."""
        return list(self._events)

    def clear(self) -> None:
        """Forget the events recorded so far (step counters are kept)."""
        self._events = []

    def chrome_trace(self) -> Dict[str, Any]:
        """The events as a Chrome trace object (complete events, microseconds)."""
        return {"traceEvents": [self._chrome_event(event) for event in self.events()],
                "displayTimeUnit": "ms"}

    def _chrome_event(self, event: TraceEvent) -> Dict[str, Any]:
        start_us = (event.start_ns - self._origin_ns) / 1000.0
        return {
            "name": event.stage_name, "ph": "X", "cat": "Comm",
            "ts": start_us, "dur": max(event.end_ns - event.start_ns, 0) / 1000.0,
            "pid": self.name_of(event.key),
            "tid": "part %d" % event.part if event.part >= 0 else "tensor",
            "args": {"key": event.key, "part": event.part, "step": event.step,
                     "priority": event.priority},
        }

    def dump(self, path: Optional[str] = None) -> str:
        """Write the Chrome trace to ``path`` (default ``<trace_dir>/<rank>/comm.json``)."""
        if path is None:
            path = os.path.join(self.trace_dir, str(self.rank), "comm.json")
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w", encoding="utf-8") as stream:
            json.dump(self.chrome_trace(), stream)
        return path
