"""Round bookkeeping of one key with backup workers (``BYTEPS_BACKUP_WORKERS=b``). Pure.

Synchronous SGD with backup workers (Chen et al., "Revisiting Distributed Synchronous SGD",
2016; TensorFlow's ``SyncReplicasOptimizer(replicas_to_aggregate=W-b)``): the servers keep the
weights and the optimizer; a round of a key closes when the first ``W - b`` of its ``W``
workers have pushed their gradients for it; their sum (scaled to ``W`` contributions) goes
through the optimizer once, and every pull of that round is answered with the new weights.

Rounds are numbered by the weights' version: version ``v`` is what ``v`` closed rounds made
of the initial value. A worker's push belongs to the round of the version it last read (its
last answer), so it needs no round number on the wire:

* a push on time (computed on the current weights) counts towards the open round's ``W - b``;
  one that arrives after ``W - b`` others but before the round closed is summed in too (its
  data is here; nobody waits for it);
* a push computed on the weights of the round that closed last (:data:`MAX_LATE_ROUNDS` 1)
  is late: it joins the open round as one more gradient, not counted towards its ``W - b``;
  an older one (a straggler's, 2-3 rounds old for a 2x straggler) is dropped and counted, as
  in Chen et al. and TensorFlow: applied, such stale gradients cost accuracy;
* a push that arrives while the open round is closing (complete, its update being computed)
  joins the next round as a late one: no gradient is lost to a race with a round's close;
* a round that has its ``W - b`` pushes on time waits a little (``wait``: a fraction of the
  key's last round) for the workers without a push on time in it; a worker behind (its last
  push 2 or more rounds late: a straggler) is not waited for. Without a straggler a round
  then takes every worker's gradient, as synchronous training does (:class:`_Wait`);
* a round that a worker waits for also closes once every worker present pushed into it
  (late and dropped pushes included): a round never waits for a worker's *next* push, which may wait behind a round of
  another key that waits for one of ours (two workers left, their steps crossed over two keys:
  a hang). Proof sketch, tested by random interleavings: a round waits for a worker only if
  its current push went to an earlier round, so that worker started its step earlier than the
  waiting one; a cycle of waits would order the workers' starts in a circle;
* a round's sum of ``c`` gradients is scaled to ``W`` (by the caller: ``W / c``);
* a pull is answered with the first weights newer than the round the worker's push belonged
  to: when it closes, or at once if that round already closed (a late or dropped push: the
  worker skips ahead to the current weights, so a late worker never waits for a round, and
  rounds close exactly when they would without it).

A round always needs ``W - b`` pushes on time: no round is applied with fewer gradients
scaled up (one or two gradients scaled by ``W / c``, outsized updates of a model the quorum
already trained). Workers that wait in a barrier (:meth:`BackupRounds.set_absent`) or finished
training (:meth:`BackupRounds.finish`) push nothing: while fewer than ``W - b`` workers are
left (the others finished their loop: a barrier, ``finish_training`` or their exit), no round
can close, and the training is over for the workers still pushing: their pushes are dropped
and their pulls answered :data:`ENDED` (the server tells them; their next step raises
``TrainingOver``): at once where the others finished, after :data:`SHORTAGE_GRACE` where
they wait in a barrier (:meth:`BackupRounds.end_shortage`: workers leaving a barrier together
come back a few milliseconds apart). Once ``W - b`` workers finished, that is for good;
workers back from a barrier (``set_absent(..., False)``) make rounds close again. (Until
issue 62, a round needed ``min(W - b, workers present)`` pushes: workers ending their loop
with a barrier left a straggler whose every remaining step was applied alone, scaled by
``W``.)

Threads: ``begin_push``, ``request_pull``, ``set_absent`` and ``finish`` run on the receive
thread; ``add``, ``recheck`` and ``close`` on the one summing thread the key is bound to (only
it writes the sum buffer, outside the lock, and only it closes a round).
"""
import threading
import time
from typing import Callable, Dict, List, Optional, Set, Tuple

import numpy as np

from ..errors import ProtocolError
from ..words import count
from .rounds import sum_into

__all__ = ["BackupRounds", "ENDED", "SHORTAGE_GRACE"]

#: what :meth:`BackupRounds.request_pull` returns once the job's training is over
ENDED = -1
#: a push computed on weights at most this many rounds old joins the open round; older ones
#: are dropped: a 2x straggler's gradients, 2-3 rounds old, cost accuracy when applied (with
#: momentum 0.9, 1.7 points on the digits benchmark; dropped, 0.5-0.7), while a push that
#: just missed its round's close is nearly as good as on time
MAX_LATE_ROUNDS = 1
#: seconds that fewer than W - b workers may be present (the others in a barrier) before the
#: training is over for the workers still pushing: workers leaving a barrier together tell the
#: servers they are back a few milliseconds apart, and the first one's next push must not hear
#: that the training is over (it did, once in about 50 runs: every worker stopped at step 1)
SHORTAGE_GRACE = 1.0


class BackupRounds:
    """The open round of one key: who pushed it, its sum, the pulls waiting for it."""

    def __init__(self, ps_key: int, num_workers: int, backup_workers: int, size: int, dtype,
                 wait: float = 0.0, clock: Callable[[], float] = time.monotonic):
        if not 0 < backup_workers < num_workers:
            raise ProtocolError("%s need at least %s, the job has %d"
                                % (count(backup_workers, "backup worker"),
                                   count(backup_workers + 1, "worker"), num_workers))
        self.ps_key = ps_key
        self.num_workers = num_workers
        self.backup_workers = backup_workers
        self._size, self._dtype = size, np.dtype(dtype)
        self._lock = threading.Lock()
        self.version = 0                    # rounds closed so far
        self._fresh: Set[int] = set()       # senders of the open round's pushes on time
        self._senders: Set[int] = set()     # every worker that pushed into it (late, dropped)
        self._gradients = 0                 # gradients in it (a worker may have two)
        #: the open round is complete and its update is being computed (summing thread);
        #: pushes arriving meanwhile join the next round as late ones
        self._closing = False
        self._next: Set[int] = set()
        self._next_gradients = 0
        self._summed = 0
        self._buffer: Optional[np.ndarray] = None
        self._read: Dict[int, int] = {}     # sender -> version of its last answer
        self._pushed: Dict[int, int] = {}   # sender -> round of its push not yet answered
        self._pending: List[Tuple[int, int, object]] = []   # (sender, round, token)
        self._absent: Set[int] = set()
        self._done: Set[int] = set()        # workers that finished training
        #: the job's training is over (W - b workers finished): no round closes any more
        self.ended = False
        #: pushes dropped so far (later than MAX_LATE_ROUNDS, never summed); those after
        #: the end apart
        self.dropped = 0
        self.dropped_after_end = 0
        #: late pushes that joined a later round
        self.joined_late = 0
        self._wait = _Wait(wait, clock)
        self._workers: Set[int] = set()     # every worker that pushed this key
        self._behind: Set[int] = set()      # those whose last push was 2+ rounds late
        #: spells of fewer than W - b workers present, counted; the current one is over
        self.shortage = 0
        self._shortage_over = False
        self._watched = 0

    @property
    def needed(self) -> int:
        """Pushes on time that close a round: W - b."""
        return self.num_workers - self.backup_workers

    @property
    def pushed_by(self) -> int:
        """Workers that pushed into the open round (on time, late or dropped as too late)."""
        with self._lock:
            return len(self._senders)

    @property
    def over(self) -> bool:
        """Whether the training is over for the workers still pushing: W - b workers finished
        (for good), fewer than W - b can come back (the others finished), or fewer than W - b
        have been present for :data:`SHORTAGE_GRACE` (:meth:`end_shortage`: the others wait
        in a barrier after their loop)."""
        return (self.ended or self.num_workers - len(self._done) < self.needed
                or (self._shortage_over and self._short()))

    def _short(self) -> bool:
        """Fewer than W - b workers present: no round can close."""
        return self.num_workers - len(self._absent) < self.needed

    @property
    def waited_out(self) -> int:
        """Rounds that waited for a worker on time and closed without it."""
        return self._wait.expired

    def begin_push(self, sender: int) -> Optional[int]:
        """Register ``sender``'s push: the round it is summed into (the open one, or the
        next one while the open one closes), None if it is dropped. ProtocolError for a
        second push before the first was answered."""
        with self._lock:
            if sender in self._pushed:
                raise ProtocolError("node %d pushed key %d again before its pull of round %d "
                                    "was answered" % (sender, self.ps_key, self._pushed[sender]))
            if self.over:
                self.dropped_after_end += 1
                return None
            r = self._read.get(sender, 0)
            late = self.version - r
            self._pushed[sender] = r        # a late one's pull is answered at once
            self._workers.add(sender)
            # behind: too stale to join (a straggler); one that just missed a close is
            # waited for in the next round (else it stays a few ms late)
            (self._behind.add if late > MAX_LATE_ROUNDS else self._behind.discard)(sender)
            (self._next if self._closing else self._senders).add(sender)
            if late > MAX_LATE_ROUNDS:
                self.dropped += 1
                return None
            self.joined_late += bool(late) or self._closing
            if self._closing:               # summed after the close (same summing thread)
                self._next_gradients += 1
                return self.version + 1
            if not late:
                self._fresh.add(sender)
            self._gradients += 1
            return self.version

    def request_pull(self, sender: int, token) -> Optional[int]:
        """Register ``sender``'s pull: the version to answer with now (the current weights),
        or None if ``token`` waits for the round the sender pushed, and comes back from
        :meth:`close`. Each pull is answered exactly once."""
        with self._lock:
            if self.over:
                self._pushed.pop(sender, None)
                return ENDED
            wanted = self._pushed.get(sender)
            if wanted is None or wanted < self.version:
                self._answered(sender)
                return self.version
            self._pending.append((sender, wanted, token))
            return None

    def _answered(self, sender: int) -> None:
        self._read[sender] = self.version
        self._pushed.pop(sender, None)

    def add(self, r: int, data: np.ndarray) -> Optional[Tuple[np.ndarray, int]]:
        """Add a counted push of round ``r`` (summing thread). Returns ``(sum, contributors)``
        when this push completes the round: the caller computes the new weights and calls
        :meth:`close`; else None."""
        with self._lock:
            if r != self.version:
                raise ProtocolError("key %d: a push of round %d reached the sum of round %d"
                                    % (self.ps_key, r, self.version))
            first = self._summed == 0
        self._buffer = sum_into(self._buffer, data, first, self._size, self._dtype)
        with self._lock:
            self._summed += 1
            return self._complete()

    def set_absent(self, sender: int, absent: bool) -> List[object]:
        """``sender`` pushes nothing for now (it waits in a barrier or left the job), or is
        back. Returns the tokens of the pulls that waited for the open round if that left fewer
        than W - b workers (:attr:`over`), to be answered that the training is over; the caller
        runs :meth:`recheck` on the key's summing thread (every worker left pushed, say)."""
        with self._lock:
            short = self._short()
            (self._absent.add if absent else self._absent.discard)(sender)
            self._count_shortage(short)
            return self._end_waits()

    def _count_shortage(self, was_short: bool) -> None:
        """Under the lock, after a worker came or went: a new spell of shortage counted, or
        the end of one."""
        if not self._short():
            self._shortage_over = False
        elif not was_short:
            self.shortage += 1

    def shortage_to_watch(self) -> int:
        """The spell of shortage now (fewer than W - b workers present), the first time it
        is asked for; else 0. The caller calls :meth:`end_shortage` with it after
        :data:`SHORTAGE_GRACE`."""
        with self._lock:
            if not self._short() or self._watched == self.shortage:
                return 0
            self._watched = self.shortage
            return self.shortage

    def end_shortage(self, spell: int) -> List[object]:
        """Spell ``spell`` of shortage lasted :data:`SHORTAGE_GRACE`: if it goes on, the
        training is over for the workers still pushing (until workers come back). Returns
        the tokens of the pulls that waited, to be answered so."""
        with self._lock:
            if spell != self.shortage or not self._short():
                return []
            self._shortage_over = True
            return self._end_waits()

    def finish(self, sender: int) -> List[object]:
        """``sender`` finished training: not waited for any more. When that makes ``W - b``
        finished workers, the training is over for good. Returns the tokens of the pulls that
        waited for the open round if it can no longer close (:attr:`over`), to be answered
        that the training is over."""
        with self._lock:
            short = self._short()
            self._absent.add(sender)
            self._done.add(sender)
            self._count_shortage(short)
            if len(self._done) >= self.needed:
                self.ended = True
            return self._end_waits()

    def _end_waits(self) -> List[object]:
        """Under the lock: the waiting pulls' tokens if no round can close now."""
        if not self.over:
            return []
        waiting, self._pending = self._pending, []
        for waiter, _, _ in waiting:
            self._pushed.pop(waiter, None)
        return [token for _, _, token in waiting]

    def note_read(self, sender: int) -> None:
        """``sender`` read the current weights outside a round (a plain pull)."""
        with self._lock:
            self._read[sender] = self.version

    def stale(self, sender: int) -> bool:
        """Whether ``sender`` last read weights older than the current ones."""
        with self._lock:
            return self._read.get(sender, 0) != self.version

    def recheck(self) -> Optional[Tuple[np.ndarray, int]]:
        """``(sum, contributors)`` if the open round is complete now (summing thread)."""
        with self._lock:
            return self._complete()

    def _complete(self) -> Optional[Tuple[np.ndarray, int]]:
        # A round closes with W - b pushes on time, or once every worker present pushed into
        # it (late, or too stale to sum): waiting for a late worker's next push could wait
        # for ever, that push waiting behind a round of another key that waits for one of
        # ours (the workers' steps cross). A worker's late push and its next one (on time)
        # may both be in: two gradients.
        if (self.over or self._short() or self._closing or self._gradients == 0
                or self._summed < self._gradients):
            return None
        if len(self._fresh) < self.needed and not (self._waited_for()
                                                   and self._every_present_worker_pushed()):
            return None
        if self._wait.holds(self._awaited()):
            return None
        self._closing = True
        return self._buffer, self._gradients

    def _awaited(self) -> Set[int]:
        """Workers a quorate round may wait a little for: present, not behind (their last
        push 2 or more rounds late), without a push on time in it yet (a worker whose late
        push joined it is answered at once: its next push, on time, comes a moment after
        the others'; not waiting for it kept it a round late for good)."""
        return self._workers - self._absent - self._behind - self._fresh

    def due(self) -> Optional[float]:
        """When the open round stops waiting for its last on-time workers (the clock's time),
        the first time it waits for them; else None. The caller runs :meth:`recheck` then."""
        with self._lock:
            return self._wait.take_due()

    def _every_present_worker_pushed(self) -> bool:
        return len(self._senders - self._absent) >= self.num_workers - len(self._absent)

    def _waited_for(self) -> bool:
        """Whether a worker's push is in the open round on time, its pull not yet answered:
        only then may the round close short of W - b on time (a leftover late gradient after
        the others finished, or while they wait in a barrier, stays out of the weights they
        read, as it always did)."""
        return any(r >= self.version for r in self._pushed.values())

    def close(self) -> List[object]:
        """The open round's new weights are in place: count the version, start the next
        round, and return the tokens of the pulls to answer with the new weights."""
        with self._lock:
            self.version += 1
            self._wait.closed()
            self._fresh, self._senders = set(), self._next
            self._gradients, self._summed = self._next_gradients, 0
            self._next, self._next_gradients, self._closing = set(), 0, False
            ready = [item for item in self._pending if item[1] < self.version]
            self._pending = [item for item in self._pending if item[1] >= self.version]
            for sender, _, _ in ready:
                self._answered(sender)
            return [token for _, _, token in ready]


class _Wait:
    """How long a round that has its ``W - b`` pushes waits for the workers still on time.

    Backup workers are for stragglers; without one, the last worker's push is a few
    milliseconds behind the others', and closing without it made most rounds take a gradient a
    round stale (its push joined the next round): accuracy fell 1-2 points with nobody
    straggling. So a quorate round waits for the workers not behind, at most ``fraction`` of
    the key's last round (close to close); a straggler (behind) is not waited for, so it costs
    nothing. ``fraction`` 0: never wait (Chen et al.'s rule). Under the rounds' lock."""

    def __init__(self, fraction: float, clock: Callable[[], float]):
        self.fraction, self._clock = fraction, clock
        self._closed_at: Optional[float] = None     # when the last round closed
        self._last: Optional[float] = None          # that round's length
        self._until: Optional[float] = None         # the open round waits until then
        self._told = False                          # take_due said so
        #: rounds that waited for a worker and closed without it
        self.expired = 0

    def holds(self, awaited: Set[int]) -> bool:
        """Whether a quorate round still waits, ``awaited`` not in yet."""
        if not awaited or not self.fraction or self._last is None:
            return False
        now = self._clock()
        if self._until is None:
            self._until = now + self.fraction * self._last
        if now < self._until:
            return True
        self.expired += 1
        return False

    def take_due(self) -> Optional[float]:
        if self._until is None or self._told:
            return None
        self._told = True
        return self._until

    def closed(self) -> None:
        now = self._clock()
        if self._closed_at is not None:
            self._last = now - self._closed_at
        self._closed_at, self._until, self._told = now, None, False
