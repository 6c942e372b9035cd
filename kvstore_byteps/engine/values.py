"""A worker's keys on the servers: declaring one (rank 0's value initialises it, every worker
reads it back and checks its size) and reading the servers' current value, each partition a
request of its own, waited for. Reaches the rest of the worker through a :class:`ValuesPort`."""
import dataclasses
from typing import Any, Callable, Optional, Sequence

import numpy as np

from ..config import TrainingMode
from ..errors import ConfigError, JobAbortedError, KVStoreBytePSError, PeerError
from .layout import KeyLayout, Layouts, ServerDialect
from .partition import KeyLayoutError

__all__ = ["KeyValues", "ValuesPort"]


@dataclasses.dataclass(frozen=True)
class ValuesPort:
    """What :class:`KeyValues` needs of its worker engine."""

    wait: Callable[[Any, str], Any]            # a request's answer (what it was, for errors)
    barrier: Callable[[str], None]             # the workers' barrier (what it waits in)
    declare: Callable[[KeyLayout], None]       # a key declared in the program's order (buckets)
    keep: Callable[[KeyLayout], None]          # the recovery keeper keeps the key's rounds
    name_of: Callable[[int], str]              # how a key is shown
    note_failure: Callable[[BaseException], None]    # the job cannot go on
    #: whether this worker initialises keys now: rank 0, or the lowest rank still in an
    #: elastic job
    leader: Callable[[], bool] = lambda: True
    elastic: bool = False                      # workers may leave (BYTEPS_MIN_WORKERS)


class KeyValues:
    """Initialising and reading keys. Blocking, on the program's thread."""

    def __init__(self, kv, rank: int, mode: TrainingMode, dialect: ServerDialect,
                 layouts: Layouts, port: ValuesPort):
        self.kv, self.rank, self.mode = kv, rank, mode
        self.dialect, self.layouts = dialect, layouts
        self._port = port
        self._declared = 0      # keys declared in the program's order (init without any_order)

    def init(self, key: int, value: np.ndarray, out: Optional[Sequence[np.ndarray]] = None,
             any_order: bool = False):
        """Initialise ``key`` on the servers from rank 0's ``value``; every rank then reads the
        stored value back (into ``out`` if given) and checks its size. Blocking. Every worker
        initialises its keys in the same order (a barrier pairs them), unless ``any_order``
        (our servers only): then each read waits at the server for rank 0's value."""
        refusal = self.mode.refusal(self.dialect.extensions_missing)
        if refusal:
            # A usage error, not a failure of the job: refused before any request, so every
            # worker that meets it still leaves the job cleanly as it exits.
            raise ConfigError(refusal)
        try:
            return self._init(key, value, out, any_order)
        except KVStoreBytePSError as exc:
            self._port.note_failure(exc)
            raise

    def _init(self, key, value, out, any_order):
        if any_order and self.dialect.extensions_missing:
            raise KVStoreBytePSError("declaring tensors in any order needs kvstore-byteps "
                                     "servers; %s" % self.dialect.extensions_missing)
        layout = self.layouts.get(key, value.shape, value.dtype)
        if not any_order:       # declared in the same order on every worker: may be fused
            self._port.declare(layout)
        for part in layout.partitions:    # where this key's answers will land, every round
            self.kv.expect_answers(part.ps_key, part.nbytes)
        self._port.keep(layout)
        flat = np.ascontiguousarray(value).reshape(-1).view(np.uint8)
        # Elastic jobs choose who initialises after the barrier: every worker still in the
        # job passed it knowing the same departures (the scheduler's notices come first), so
        # a departed rank 0's part falls to one worker; the others' reads wait for its value.
        leader_first = any_order or not self._port.elastic
        if leader_first and self._port.leader():
            self.initialise(layout, flat)
        if not any_order:
            self._declared += 1
            self._port.barrier("declaring %s (its key number %d)"
                               % (self._port.name_of(key), self._declared))
            if not leader_first and self._port.leader():
                self.initialise(layout, flat)
        try:
            stored = self.pull_all(layout, {"await_init": True}
                                   if any_order or not leader_first else None)
        except PeerError as exc:
            why = None if isinstance(exc, JobAbortedError) else self.dialect.misplaced(layout)
            if why is None:     # (a job some node ended: its reason is the whole story)
                raise
            raise PeerError("%s. %s" % (exc, why)) from exc
        for target in out or ():
            np.copyto(target.reshape(-1).view(np.uint8), stored)
        return stored.view(layout.dtype).reshape(layout.shape)

    def initialise(self, layout: KeyLayout, flat: np.ndarray) -> None:
        """Rank 0: ``flat`` (the value's bytes) to the servers with ``layout``'s init command,
        every partition at once; waits for them all."""
        requests = [self.kv.push([p.ps_key], flat[p.offset:p.end], [p.nbytes],
                                 cmd=layout.init_cmd) for p in layout.partitions]
        for request in requests:
            self._port.wait(request, "initialising %s" % layout.name)

    def read(self, key: int, shape, dtype) -> np.ndarray:
        """The servers' current value of ``key`` (their weights, with backup workers).
        Blocking."""
        layout = self.layouts.get(key, shape, dtype)
        return self.pull_all(layout).view(layout.dtype).reshape(layout.shape)

    def pull_all(self, layout: KeyLayout, extra=None) -> np.ndarray:
        """The servers' value of ``layout`` (its bytes), every partition read at once and its
        size checked; ``extra``: the pulls' extra fields (``await_init``)."""
        total = sum(p.nbytes for p in layout.partitions)
        stored = np.empty(total, np.uint8)
        requests = [(p, self.kv.pull([p.ps_key], cmd=layout.init_cmd, extra=extra))
                    for p in layout.partitions]
        for part, request in requests:
            got = self._port.wait(request, "reading %s back" % layout.name)
            if got.vals.nbytes != part.nbytes:
                raise KeyLayoutError(
                    "%s disagrees with the cluster: the servers hold %d bytes for ps key %d "
                    "where this worker expects %d (do all workers use the same shape and "
                    "dtype for this key?)" % (layout.name, got.vals.nbytes, part.ps_key,
                                              part.nbytes))
            stored[part.offset:part.end] = np.frombuffer(got.vals, np.uint8)
        return stored
