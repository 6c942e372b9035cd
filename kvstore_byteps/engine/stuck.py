"""A worker that waits in a barrier while the others wait for its pushes: the programs differ.

In synchronous training a round of a key completes only with every worker's push. A worker in
a barrier (declaring a key, the script's own barrier, the shutdown barrier as its program
ended) pushes nothing until every worker reaches that barrier; if another worker meanwhile
pushed a round this one has not, that worker waits at the servers for this one's push, and
both wait for each other until BYTEPS_REQUEST_TIMEOUT: a worker that declares a key more than
the others, or runs one step less, or whose program ended early. Only the two sides together
tell it, and the servers know the rounds: a barrier that has waited CHECK_AFTER_S asks every
server which of its rounds wait for this worker's push (``BYTEPS_WAITING``), and once more
CHECK_AGAIN_S later; rounds that still wait, unchanged, cannot complete (this worker pushes
nothing while it waits), and the worker ends the job for every node naming both sides, within
seconds instead of BYTEPS_REQUEST_TIMEOUT.

:func:`parse`, :func:`stuck` and :func:`reason` are pure; :class:`BarrierWatch` is the thread
that asks; :class:`WorkerBarriers` is a worker engine's barriers, watched, through a
:class:`BarrierPort` (the few operations of the engine they need).
"""
import dataclasses
import logging
import threading
from typing import Callable, List, Optional, Sequence, Tuple

from ..van.wire.message import id_to_rank

__all__ = ["Waiting", "parse", "stuck", "reason", "BarrierWatch", "BarrierPort",
           "WorkerBarriers", "CHECK_AFTER_S", "CHECK_AGAIN_S"]

log = logging.getLogger(__name__)

#: a barrier waits this long before the servers are asked (a barrier of workers that all
#: reach it passes in milliseconds; a worker still sending its last pushes is done by then)
CHECK_AFTER_S = 3.0
#: ... and again this much later: the rounds that still wait, unchanged, are stuck
CHECK_AGAIN_S = 1.5


@dataclasses.dataclass(frozen=True)
class Waiting:
    """A server's round that waits for this worker's push: key, round, who pushed it."""

    ps_key: int
    round: int
    ahead: Tuple[int, ...]      # node ids of the workers that pushed it


def parse(body: bytes) -> List[Waiting]:
    """A server's answer to ``BYTEPS_WAITING`` (``b"<ps key>:<round>:<node>,<node>;..."``)."""
    found = []
    for item in bytes(body).split(b";"):
        if item:
            ps_key, round_, ahead = item.split(b":")
            found.append(Waiting(int(ps_key), int(round_),
                                 tuple(int(n) for n in ahead.split(b","))))
    return found


def stuck(first: Sequence[Waiting], second: Sequence[Waiting]) -> List[Waiting]:
    """The rounds that waited for this worker at both asks: they cannot complete."""
    again = set(second)
    return [w for w in first if w in again]


def reason(rank: int, what: str, cause: Optional[str], rounds: Sequence[Waiting],
           name: Callable[[int], str]) -> str:
    """Why worker ``rank`` ends the job: it waits ``what`` while others wait for its
    ``rounds`` (``name(ps_key)`` names a key); ``cause``: why it left, else the programs
    differ."""
    ranks = sorted({id_to_rank(node) for w in rounds for node in w.ahead})
    shown = "; ".join("%s round %d" % (name(w.ps_key), w.round) for w in rounds[:3])
    return ("worker rank %d waits %s while worker rank%s %s wait%s at the servers for its push "
            "of %s%s: %s" % (
                rank, what, "s" if len(ranks) > 1 else "", ", ".join(map(str, ranks)),
                "" if len(ranks) > 1 else "s", shown, " and more" if len(rounds) > 3 else "",
                cause or "the workers' programs differ (every worker must declare the same "
                "keys in the same order and push every key in every step, as many steps)"))


class BarrierWatch:
    """One thread that, while a barrier is armed, asks ``ask()`` (every server's waiting rounds)
    after CHECK_AFTER_S and CHECK_AGAIN_S, and calls ``end(what, stuck rounds)`` if any."""

    def __init__(self, ask: Callable[[], List[Waiting]],
                 end: Callable[[object, List[Waiting]], None],
                 after: float = CHECK_AFTER_S, again: float = CHECK_AGAIN_S):
        self._ask, self._end, self._after, self._again = ask, end, after, again
        self._cond = threading.Condition()
        self._armed: Optional[Tuple[int, object]] = None     # (generation, what it waits in)
        self._generation = 0
        self._closed = False
        self._thread: Optional[threading.Thread] = None

    def arm(self, what) -> None:
        """A barrier begins; ``what`` (what this worker waits in) goes back to ``end``."""
        with self._cond:
            self._generation += 1
            self._armed = (self._generation, what)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="barrier-watch")
                self._thread.start()
            self._cond.notify_all()

    def disarm(self) -> None:
        """The barrier passed (or failed)."""
        with self._cond:
            self._armed = None
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed, self._armed = True, None
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._armed is None and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                armed = self._armed
            first = self._ask_while(armed, self._after)
            second = self._ask_while(armed, self._again) if first else None
            rounds = stuck(first or [], second or [])
            if rounds and self._still(armed):
                self._end(armed[1], rounds)
                self.disarm()
            elif self._still(armed):
                with self._cond:      # asked twice and not stuck: wait for the next barrier
                    while self._still(armed) and not self._closed:
                        self._cond.wait()

    def _ask_while(self, armed, delay: float) -> Optional[List[Waiting]]:
        """After ``delay`` seconds of the same barrier, the servers' answer; None if it passed."""
        with self._cond:
            self._cond.wait_for(lambda: not self._still(armed) or self._closed, timeout=delay)
            if not self._still(armed) or self._closed:
                return None
        try:
            return self._ask()
        except Exception as exc:     # the job ended meanwhile, a server is gone: not ours
            log.debug("asking the servers which rounds wait for this worker: %s", exc)
            return None

    def _still(self, armed) -> bool:
        return self._armed is not None and self._armed[0] == armed[0]


@dataclasses.dataclass(frozen=True)
class BarrierPort:
    """What :class:`WorkerBarriers` needs of its worker engine."""

    rank: Callable[[], int]
    ask: Callable[[], List[Waiting]]         # every server's rounds waiting for this worker
    barrier: Callable[[float, str], None]    # the workers' barrier (timeout, kind)
    end_job: Callable[[str], None]           # end the job for every node, saying why
    name: Callable[[int], str]               # a ps key, for messages


class WorkerBarriers:
    """A worker's barriers of the workers, watched once :meth:`watch` was called (synchronous
    rounds on our servers): the pushpulls called and begun are counted, since a worker with a
    call not begun yet still has pushes to send and is not stuck."""

    def __init__(self, port: BarrierPort):
        self._port = port
        self._watch: Optional[BarrierWatch] = None
        self._called = 0            # the program's thread only
        self._begun = 0             # engine threads
        self._begun_lock = threading.Lock()

    def watch(self) -> None:
        """From now on a barrier the others do not reach while they wait for this worker's
        pushes ends the job (call once, at start)."""
        self._watch = BarrierWatch(self._ask, self._end)

    def called(self) -> None:
        """A pushpull was called (the program's thread)."""
        self._called += 1

    def begun(self) -> None:
        """A pushpull called earlier begins (its push goes out now)."""
        with self._begun_lock:
            self._begun += 1

    def wait(self, what: str, timeout: float, cause: Optional[str] = None,
             kind: str = "") -> None:
        """The workers' barrier of ``kind`` (barriers.BARRIER_KINDS); ``what`` this worker
        waits in and ``cause`` (why it left, if it did) for the message that ends the job."""
        watch = self._watch
        if watch is not None:
            watch.arm((what, cause))
        try:
            self._port.barrier(timeout, kind)
        finally:
            if watch is not None:
                watch.disarm()

    def close(self) -> None:
        if self._watch is not None:
            self._watch.close()

    def _ask(self) -> List[Waiting]:
        if self._begun < self._called:
            return []
        return self._port.ask()

    def _end(self, barrier: Tuple[str, Optional[str]], rounds: List[Waiting]) -> None:
        port = self._port
        why = reason(port.rank(), barrier[0], barrier[1], rounds, port.name)
        log.error("%s", why)
        port.end_job(why)
