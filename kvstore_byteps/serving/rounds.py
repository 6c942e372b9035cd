"""Round bookkeeping of one key on the BytePS data path (sync mode). Pure, thread-safe.

The protocol of a ``dist_byteps`` worker for one partition key, every round r = 0, 1, ...:
one push (acked at once), later one pull, answered with the sum of all workers' round-r
pushes as soon as the round is complete. A combined pushpull is a push followed by a pull.
A worker pushes round r+1 only after its round-r pull was answered.

Rounds live in two slots, round r in slot ``r % 2`` (double buffering): a fast worker's round
r+1 push lands in the other slot, so the slow workers still pulling round r read an untouched
sum. Slot r % 2 is reused for round r+2 only after all ``num_workers`` pulls of round r were
answered; that is guaranteed by the per-worker rule above (round r+2 needs every worker's
round r+1 push, which each worker sends only after its round-r answer), and it is checked.

Threads: ``begin_push`` and ``request_pull`` run on the transport's receive thread,
``accumulate`` on the one summing thread the key is bound to; the summation itself runs outside
the lock, since only that summing thread ever writes a slot's buffer.

float16 rounds are summed in float32 and rounded once, into the answer, by the push that
completes the round (as BytePS's CPU reducer converts to float32 to add, but without rounding
after every push). numpy adds float16 arrays one element at a time in software: four pushes
of a 768000-byte partition took 23 ms to sum in float16 and 10 ms this way. The sum is
rounded once: for four random pushes it was the exactly rounded sum everywhere, where summing
in float16 differed from it in a third of the elements. The price is memory: a float32 partial
sum per slot beside the float16 answer, three times the round buffers of a float16 key.
"""
import dataclasses
import threading
from typing import Callable, Dict, List, NamedTuple, Optional, Tuple, Union

import numpy as np

from ..errors import ProtocolError

__all__ = ["Departed", "FailedRound", "KeyRounds", "sum_into", "accumulation_dtype"]


class Departed:
    """The workers that left the job (elastic workers), as every key's rounds on a server read
    them: one per server, so a key made after a departure knows it too. ``ids`` is replaced,
    never changed in place (read without a lock)."""

    def __init__(self, ids=()):
        """``ids``: the workers away from the start (a growing job's vacant seats)."""
        self.ids: frozenset = frozenset(ids)

    def add(self, sender: int) -> None:
        if sender not in self.ids:
            self.ids = self.ids | {sender}

    def readmit(self, sender: int) -> None:
        """A late worker took ``sender``'s place (it is being admitted to every round)."""
        self.ids = self.ids - {sender}


class FailedRound(NamedTuple):
    """A round's answer when its ``finish`` (the servers' optimizer) failed: every pull of the
    round is refused with ``message``."""
    message: str


def sum_into(buffer: Optional[np.ndarray], data: np.ndarray, first: bool, size: int,
             dtype) -> np.ndarray:
    """A round's sum with ``data`` in (the key's summing thread only, outside any lock):
    copied into ``buffer`` (made on first use) for the round's first push, added for the
    others. Returns the buffer."""
    if buffer is None:
        buffer = np.empty(size, dtype=dtype)
    if first:
        np.copyto(buffer, data)
    else:
        np.add(buffer, data, out=buffer)
    return buffer


def accumulation_dtype(dtype) -> np.dtype:
    """The dtype a round of ``dtype`` values is summed in: float32 for float16, else itself."""
    dtype = np.dtype(dtype)
    return np.dtype(np.float32) if dtype == np.float16 else dtype


@dataclasses.dataclass
class _Slot:
    round: int = -1
    buffer: Optional[np.ndarray] = None    # the round's sum, once complete (the key's dtype)
    partial: Optional[np.ndarray] = None   # the sum so far where it is wider (float16 keys)
    summed: int = 0
    answered: int = 0
    complete: bool = False                 # summed (and finished): its pulls are answered
    pending: List[tuple] = dataclasses.field(default_factory=list)   # (sender, token)
    failed: Optional[FailedRound] = None    # its finish failed: the answer to its pulls


class KeyRounds:
    """Sync rounds of one key: who pushed and pulled which round, and the two sum buffers."""

    def __init__(self, ps_key: int, num_workers: int, size: int, dtype,
                 departed: Optional[Departed] = None, scale_to: int = 0):
        """``num_workers``: the job's worker seats (elastic workers: those departed or vacant
        push nothing); a round's sum is scaled to ``scale_to`` pushes (default: all seats)
        when it has another number (elastic workers: some left, or the job grew)."""
        self.ps_key = ps_key
        self.num_workers = num_workers
        self.scale_to = scale_to or num_workers
        self._size = size
        self._dtype = np.dtype(dtype)
        wide = accumulation_dtype(dtype)
        self._wide = wide if wide != self._dtype else None
        self._lock = threading.Lock()
        self._slots = (_Slot(), _Slot())
        self._pushed: Dict[int, int] = {}     # sender -> rounds pushed
        self._pulled: Dict[int, int] = {}     # sender -> pulls requested
        self._answered: Dict[int, int] = {}   # sender -> pulls answered
        self._departed = departed or Departed()   # workers that left (elastic workers)

    @classmethod
    def restored(cls, ps_key: int, num_workers: int, size: int, dtype,
                 states: Dict[int, tuple]) -> "KeyRounds":
        """The rounds of a key rebuilt on a restarted server from the workers' reports:
        ``states`` maps each worker to ``(pushed, answered, latest, previous)``, the data of
        its pushes of rounds pushed-1 and pushed-2 (None where absent). ProtocolError if the
        reports cannot come from one cluster (see recovery_report.py for why they suffice).

        With P the most rounds anyone pushed, every worker pushed P-1 or P rounds. Round
        P-1's sum gets the pushes of those who made it; round P-2's is summed again only if
        someone still waits for its answer, else its slot counts as fully answered."""
        rounds = cls(ps_key, num_workers, size, dtype)
        if len(states) != num_workers:
            raise ProtocolError("key %d: reports of %d workers, expected %d"
                                % (ps_key, len(states), num_workers))
        top = max(pushed for pushed, _, _, _ in states.values())
        top_complete = all(pushed == top for pushed, _, _, _ in states.values())
        for sender, (pushed, answered, _, _) in states.items():
            if pushed not in (top, top - 1) or not pushed - 1 <= answered <= pushed:
                raise ProtocolError("key %d: node %d reports %d pushes and %d answers, others "
                                    "%d pushes" % (ps_key, sender, pushed, answered, top))
            if answered == top and not top_complete:
                raise ProtocolError("key %d: node %d reports round %d answered, but not every "
                                    "worker pushed it" % (ps_key, sender, top - 1))
            rounds._pushed[sender] = pushed
            rounds._pulled[sender] = rounds._answered[sender] = answered
        if top >= 1:
            rounds._recover_slot(top - 1, [(latest, answered == top) for pushed, answered,
                                           latest, _ in states.values() if pushed == top])
        if top >= 2:
            if any(answered == top - 2 for _, answered, _, _ in states.values()):
                parts = [(latest if pushed == top - 1 else previous, answered >= top - 1)
                         for pushed, answered, latest, previous in states.values()]
            else:       # all answered: only its place in the double buffer matters
                parts = [(None, True)] * num_workers
            rounds._recover_slot(top - 2, parts)
        return rounds

    def _recover_slot(self, r: int, parts: list) -> None:
        slot = self._slots[r % 2]
        slot.round, slot.summed = r, len(parts)
        slot.complete = slot.summed == self.num_workers
        slot.answered = sum(1 for _, answered in parts if answered)
        data = [values for values, _ in parts if values is not None]
        for i, values in enumerate(data):
            self._add(slot, values, first=i == 0, last=i == len(data) - 1 and slot.complete)

    def _pushes_due(self, r: int) -> int:
        """Pushes round ``r`` needs: every worker's but those of workers that left before
        pushing it (elastic workers)."""
        gone = self._departed.ids
        if not gone:
            return self.num_workers
        return self.num_workers - sum(1 for g in gone if self._pushed.get(g, 0) <= r)

    def _answers_due(self, r: int) -> int:
        """Pulls of round ``r`` that will be answered: every worker's but those of workers
        that left before theirs was."""
        return self.num_workers - sum(1 for g in self._departed.ids
                                      if self._answered.get(g, 0) <= r)

    def depart(self, sender: int) -> List[int]:
        """Worker ``sender`` left the job (elastic workers; the server's :class:`Departed`
        says so already): its waiting pulls are dropped. Returns the rounds that may be
        complete now without it: the caller runs :meth:`recheck` for each on the key's
        summing thread."""
        with self._lock:
            self._departed.add(sender)      # (the server's already holds it: a no-op there)
            due = []
            for slot in self._slots:
                slot.pending = [(s, t) for s, t in slot.pending if s != sender]
                if slot.round >= 0 and not slot.complete and slot.summed:
                    due.append(slot.round)
            return due

    def admit(self, sender: int) -> int:
        """A late worker takes the departed worker ``sender``'s place (the server's
        :class:`Departed` readmitted it) while the others are between rounds: they wait in
        the ``join`` barrier with every round they pushed answered (serving/joins.py). From
        their next round on it pushes and pulls as they do. Returns that round."""
        with self._lock:
            gone = self._departed.ids
            r = max((p for s, p in self._pushed.items() if s != sender and s not in gone),
                    default=0)
            before = self._answered.get(sender, 0)
            for slot in self._slots:     # it counts among the answers due now: as answered
                if 0 <= slot.round < r and before <= slot.round:
                    slot.answered += 1
            self._pushed[sender] = self._pulled[sender] = self._answered[sender] = r
            return r

    def begin_push(self, sender: int, claimed_round: Optional[int] = None) -> int:
        """Register ``sender``'s next push; return its round. ProtocolError if out of order."""
        with self._lock:
            self._refuse_departed(sender, "push")
            r = self._pushed.get(sender, 0)
            if claimed_round is not None and claimed_round != r:
                raise ProtocolError("node %d says its push of key %d is round %d, the server "
                                    "counts round %d" % (sender, self.ps_key, claimed_round, r))
            if self._answered.get(sender, 0) < r:
                raise ProtocolError("node %d pushed round %d of key %d before its round %d pull "
                                    "was answered" % (sender, r, self.ps_key, r - 1))
            self._claim_slot(r)
            self._pushed[sender] = r + 1
            return r

    def _refuse_departed(self, sender: int, what: str) -> None:
        """A request of a worker that left the job (it raced the notice, or it was taken for
        lost while stalled) must not reopen a round closed without it."""
        if sender in self._departed.ids:
            raise ProtocolError("node %d left the job (elastic workers): its %s of key %d is "
                                "refused" % (sender, what, self.ps_key))

    def _claim_slot(self, r: int) -> None:
        slot = self._slots[r % 2]
        if slot.round == r:
            return
        if slot.round >= 0 and (slot.round != r - 2
                                or slot.answered < self._answers_due(slot.round)):
            raise ProtocolError("key %d: round %d cannot start, round %d has %d of %d answers"
                                % (self.ps_key, r, slot.round, slot.answered,
                                   self._answers_due(slot.round)))
        slot.round, slot.summed, slot.answered, slot.pending = r, 0, 0, []
        slot.complete, slot.failed = False, None

    def request_pull(self, sender: int, token) -> Union[None, np.ndarray, FailedRound]:
        """Register ``sender``'s next pull; return the round's answer now if it is complete
        (its sum, or what ``finish`` made of it, or its :class:`FailedRound`).

        Otherwise ``token`` is kept and comes back from the :meth:`accumulate` call that
        completes the round. Each pull is answered exactly once.
        """
        with self._lock:
            self._refuse_departed(sender, "pull")
            r = self._pulled.get(sender, 0)
            if r >= self._pushed.get(sender, 0):
                raise ProtocolError("node %d pulled round %d of key %d before pushing it"
                                    % (sender, r, self.ps_key))
            self._pulled[sender] = r + 1
            slot = self._slots[r % 2]
            if slot.complete:
                self._count_answers(slot, [(sender, token)])
                return slot.failed or slot.buffer
            slot.pending.append((sender, token))
            return None

    def accumulate(self, r: int, data: np.ndarray,
                   finish: Optional[Callable[[np.ndarray], Optional[str]]] = None
                   ) -> Tuple[list, Union[None, np.ndarray, FailedRound]]:
        """Add one push of round ``r`` (summing thread of this key only).

        Returns ``(tokens, answer)``: the pulls to answer now when this push completed the
        round, with its sum, else ``([], None)``. ``finish(sum)``, if given, runs on the
        complete sum before any pull can read it (the servers' optimizer turns it into the
        weights, in place) and returns None, or why it failed: the round's answer is then a
        :class:`FailedRound`. A round that completes with fewer pushes than workers (some
        left the job, or more, the job grew: elastic workers) is scaled to ``scale_to``
        pushes first, as backup workers' rounds are.
        """
        slot = self._slots[r % 2]
        with self._lock:
            if slot.round != r:
                raise ProtocolError("key %d: push of round %d arrived in a slot of round %d"
                                    % (self.ps_key, r, slot.round))
            first, last = slot.summed == 0, slot.summed + 1 >= self._pushes_due(r)
        self._add(slot, data, first, last)
        with self._lock:
            slot.summed += 1
            if slot.summed < self._pushes_due(r):
                return [], None
        return self._complete(slot, r, finish, summed_into_buffer=last)

    def recheck(self, r: int, finish: Optional[Callable[[np.ndarray], Optional[str]]] = None
                ) -> Tuple[list, Union[None, np.ndarray, FailedRound]]:
        """As :meth:`accumulate` without a push: round ``r`` completes if the pushes it has
        are all it needs now (a worker left: :meth:`depart`). Summing thread of this key."""
        slot = self._slots[r % 2]
        with self._lock:
            if slot.round != r:
                return [], None
        return self._complete(slot, r, finish, summed_into_buffer=False)

    def _complete(self, slot: _Slot, r: int, finish, summed_into_buffer: bool
                  ) -> Tuple[list, Union[None, np.ndarray, FailedRound]]:
        """Summing thread: close round ``r`` if it has every push due; ``([], None)`` if not
        (or already closed)."""
        with self._lock:
            if slot.complete or slot.summed == 0 or slot.summed < self._pushes_due(r):
                return [], None
            summed = slot.summed
        if not summed_into_buffer and self._wide is not None:   # the sum is still wide
            if slot.buffer is None:
                slot.buffer = np.empty(self._size, dtype=self._dtype)
            np.copyto(slot.buffer, slot.partial, casting="same_kind")
        if summed != self.scale_to:       # workers left or joined: scaled to the job's
            np.multiply(slot.buffer, self.scale_to / summed, out=slot.buffer,
                        casting="unsafe")
        failure = finish(slot.buffer) if finish is not None else None
        with self._lock:
            slot.complete = True
            slot.failed = None if failure is None else FailedRound(failure)
            ready, slot.pending = slot.pending, []
            self._count_answers(slot, ready)
            return [token for _, token in ready], slot.failed or slot.buffer

    def _add(self, slot: _Slot, data: np.ndarray, first: bool, last: bool) -> None:
        """Add ``data`` to ``slot``'s sum (summing thread, outside the lock); ``last``: this
        push completes the round, whose sum must then be in ``slot.buffer``."""
        if self._wide is None:
            slot.buffer = sum_into(slot.buffer, data, first, self._size, self._dtype)
            return
        if last and slot.buffer is None:
            slot.buffer = np.empty(self._size, dtype=self._dtype)
        if first and last:         # a single worker: nothing to add
            np.copyto(slot.buffer, data)
        elif last:                 # add in the wide dtype, round once into the answer
            np.add(slot.partial, data, out=slot.buffer, dtype=self._wide, casting="same_kind")
        else:
            slot.partial = sum_into(slot.partial, data, first, self._size, self._wide)

    def _count_answers(self, slot: _Slot, answered: list) -> None:
        slot.answered += len(answered)
        for sender, _ in answered:
            self._answered[sender] = self._answered.get(sender, 0) + 1

    def waiting_for(self, sender: int) -> Optional[Tuple[int, List[int]]]:
        """``(round, the senders that pushed it)`` if other workers pushed a round ``sender``
        has not (it cannot complete without ``sender``'s push), else None (also where
        ``sender`` left the job, or has not joined its rounds yet: none waits for it)."""
        with self._lock:
            if sender in self._departed.ids:
                return None
            r = self._pushed.get(sender, 0)
            ahead = sorted(s for s, pushed in self._pushed.items() if pushed > r)
        return (r, ahead) if ahead else None

    def rounds_pushed(self, sender: int) -> int:
        """How many rounds ``sender`` has pushed (for tests and diagnostics)."""
        with self._lock:
            return self._pushed.get(sender, 0)
