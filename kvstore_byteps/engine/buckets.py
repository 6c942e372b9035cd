"""Gradient buckets: consecutive small keys of one dtype fused into one server key. Pure.

A worker pays for every key in flight: an engine operation, a work item through the credit
queue and both stages, a summing job and an answer slot on the server, a completion. With
many small tensors that, not the bytes, is the cost (benchmarks/bench_cost.py). Horovod fuses
tensors into one buffer before its all-reduce, PyTorch's DDP reduces gradients in buckets;
here a bucket is one server key that its members' gradients travel in together.

The rule every decision below keeps: **whether a round travels in its bucket is the same on
every worker**. A worker that sends a round in the bucket while another sends the same round
key by key waits at the servers for pushes that never come. So a decision is made either from
the program's order of calls (the same on every worker: the same program) or once, by rank 0,
and read by every worker from the servers (:meth:`Bucket.digest`); never from a clock or
from how fast one worker's gradients or answers come. (Dissolving a bucket when its calls
stopped for a second did that: a worker whose backward was slower between two members, by
a few hundred milliseconds of a loaded host, sent a round key by key while the others sent it
in the bucket, and every worker waited for the others' pushes until BYTEPS_REQUEST_TIMEOUT.)

Which keys (:class:`BucketPlan`): a key declared by ``init`` (every worker declares its keys in
the same order, paired by a barrier) of fewer bytes than the capacity (``BYTEPS_FUSION_BYTES``)
joins the open bucket if it has the bucket's dtype and fits; otherwise it opens the next one.
A bucket closes (is *sealed*) when a declared key does not join it, or when one of its members
is first used: a program that declares a key, uses it and only then declares the next (as
BytePS's and Horovod's per-tensor calls do) fuses nothing. Then the bucket *learns* for one
round of calls: its keys go alone, and the keys whose pushpull is called before any of them is
called again are the bucket's members from then on (gluon's Trainer declares every parameter,
BatchNorm's running statistics and frozen layers too, but pushes only the ones with
gradients). A bucket of one member is no bucket: that key goes alone.

Programs that read a key's result before pushing the next (a test of sums, one key at a time)
would wait forever in a bucket for the members they have not called yet. While a bucket
learns, its keys go alone, so such a program reads each member's result before it calls the
next member: rank 0 watches for that (:meth:`Bucket.read`: a member's result came while the
program waited for an array and before another member was called) and decides, for every
worker, that the bucket's keys go alone. Rounds of calls (:meth:`Bucket.called`) are counted
from the bucket's forming, in the program's order; a member called again before the others
were (the program reads between keys only now) dissolves the bucket from that round of calls
on, on every worker alike: the rounds called before it still travel in the bucket.

Rounds (:class:`Bucket`): each member's pushpull copies its gradient into its round's send
buffer at its offset; the member that completes the round sends the bucket, with the highest
priority of its members; the answer is copied out member by member. Buffers are reused across
rounds. A round that misses a member past the deadline is failed, naming the missing keys and
whether their pushpull was called.
"""
import dataclasses
import hashlib
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

__all__ = ["Member", "Bucket", "BucketPlan", "BucketRound", "Slot"]


@dataclasses.dataclass(frozen=True)
class Member:
    """A key fused into a bucket: its bytes ``[offset, offset + nbytes)`` of the bucket."""

    key: int
    offset: int
    nbytes: int

    @property
    def end(self) -> int:
        """Byte offset one past the member."""
        return self.offset + self.nbytes


@dataclasses.dataclass(eq=False)
class Slot:
    """A round's buffers: what is pushed and where the answer lands. Reused across rounds."""

    send: np.ndarray
    answer: np.ndarray


class BucketRound:
    """One round of a bucket: which members arrived, with what to do when it is answered."""

    __slots__ = ("slot", "arrivals", "missing", "priority", "opened", "index")

    def __init__(self, slot: Slot, members: int, opened: float, index: int):
        self.slot = slot
        #: per member: what its pushpull passed (outputs, on_done), None until it arrived
        self.arrivals: List[Optional[tuple]] = [None] * members
        self.missing = members
        self.priority: Optional[int] = None
        self.opened = opened
        self.index = index      # its round of calls (Bucket.called), the same on every worker


class Bucket:
    """Keys fused into one server key, and its rounds. Not thread-safe: the caller locks
    (:attr:`lock` is the caller's to hold)."""

    def __init__(self, number: int, dtype: np.dtype, allocate: Callable[[int], np.ndarray]):
        self.number = number
        self.dtype = np.dtype(dtype)
        self.members: List[Member] = []
        self.position: Dict[int, int] = {}      # key -> index in members
        self.nbytes = 0
        self.sealed = False
        self._learnt: Optional[List[int]] = None     # keys called in the first round of calls
        self._read: List[int] = []      # learning: members whose result the program waited for
        self.reads_between = False      # formed: the program read a member before the next
        self.dissolved = False      # its keys go alone (see the module's docstring) ...
        self.dissolved_from = 0     # ... from this round of calls on
        self.layout = None          # its wire layout, set by the engine when it is sealed
        self.failure: Optional[BaseException] = None
        self.lock = None            # the engine's lock for this bucket
        self._allocate = allocate
        self._rounds: List[BucketRound] = []     # open rounds, by index
        self._free: List[Slot] = []
        self._called: List[bool] = []     # per member: called in the current round of calls
        self._calls = 0
        self.calls_round = 0        # rounds of calls completed since the bucket was formed
        self.fused_from = 0         # the first round of calls that travels in the bucket
        self._sent = 0              # rounds sent (or failed) so far: the next to send

    @property
    def fused(self) -> bool:
        """Sealed, learnt, with more than one member (a bucket of one is that key alone)."""
        return self.sealed and not self.learning and len(self.members) > 1

    @property
    def learning(self) -> bool:
        """Sealed, and its first round of calls not over yet (see the module's docstring)."""
        return self._learnt is not None

    def seal(self) -> None:
        """No more members; the first round of calls is learnt next."""
        self.sealed = True
        self._learnt = [] if len(self.members) > 1 else None

    def learn(self, key: int) -> bool:
        """A pushpull of ``key`` was called while learning; True once the first round of calls
        is over (``key`` was called before): then :meth:`form` the bucket."""
        if key in self._learnt:
            return True
        self._learnt.append(key)
        return False

    def read(self, key: int) -> None:
        """While learning: ``key``'s (lone) result came while the program waited for an array.
        It counts as a read between keys if no member was called since ``key`` and another is
        called after it (:meth:`form` drops the round's last call: a program waits for its
        step's results after its last pushpull, gluon's ``loss.asnumpy()`` among them)."""
        learnt = self._learnt
        if learnt and learnt[-1] == key:
            self._read.append(key)

    def form(self, fused_from: int = 0) -> None:
        """The members are the keys called in the first round of calls, in declared order;
        rounds of calls from ``fused_from`` on travel in the bucket (the earlier go alone)."""
        self.fused_from = self._sent = fused_from
        last = self._learnt[-1]
        called, self._learnt = set(self._learnt), None
        self.reads_between = any(key != last for key in self._read)
        kept, offset = [], 0
        for member in self.members:
            if member.key in called:
                kept.append(Member(member.key, offset, member.nbytes))
                offset += member.nbytes
        self.members, self.nbytes = kept, offset
        self.position = {m.key: i for i, m in enumerate(kept)}
        self._called = [False] * len(kept)

    def add(self, key: int, nbytes: int) -> None:
        """``key`` joins (before the bucket is sealed)."""
        assert not self.sealed, "a sealed bucket takes no members"
        self.position[key] = len(self.members)
        self.members.append(Member(key, self.nbytes, nbytes))
        self.nbytes += nbytes

    def describe(self) -> str:
        """``bucket 3 (keys 5, 6, 7, float32, 1536 bytes)``, for messages and the trace."""
        keys = [m.key for m in self.members]
        shown = ", ".join(map(str, keys if len(keys) <= 6 else keys[:3] + ["..."] + keys[-2:]))
        return "bucket %d (keys %s, %s, %d bytes)" % (self.number, shown, self.dtype,
                                                     self.nbytes)

    def digest(self, fuse: bool = True) -> bytes:
        """A hash of the layout (members' keys and sizes in order, and the dtype) and of rank
        0's decision: ``fuse``, or its keys go alone (the program reads between keys)."""
        text = "%s:%s%s" % (self.dtype.str, ",".join("%d/%d" % (m.key, m.nbytes)
                                                     for m in self.members),
                            "" if fuse else ":alone")
        return hashlib.blake2b(text.encode("ascii"), digest_size=8).digest()

    # -- rounds -------------------------------------------------------------------------------
    def arrive(self, key: int, index: int, arrival: tuple, priority: int,
               now: float) -> Tuple[BucketRound, List[BucketRound]]:
        """``key``'s pushpull of round of calls ``index`` (opening the round if needed):
        ``(its round, the rounds to send now)``. ``arrival`` is the caller's (kept in the
        round's ``arrivals``). A complete round leaves the bucket once every earlier round
        has: rounds are sent in order (the servers pair a key's pushes by their order)."""
        position = self.position[key]
        open_round = self._round(index, now)
        assert open_round.arrivals[position] is None, "a member arrives once a round"
        open_round.arrivals[position] = arrival
        open_round.missing -= 1
        if open_round.priority is None or priority > open_round.priority:
            open_round.priority = priority
        ready = []
        while self._rounds and self._rounds[0].missing == 0 and (
                self._rounds[0].index == self._sent):
            ready.append(self._rounds.pop(0))
            self._sent += 1
        return open_round, ready

    def _round(self, index: int, now: float) -> BucketRound:
        for at, open_round in enumerate(self._rounds):
            if open_round.index == index:
                return open_round
            if open_round.index > index:
                break
        else:
            at = len(self._rounds)
        created = BucketRound(self._take_slot(), len(self.members), now, index)
        self._rounds.insert(at, created)
        return created

    # -- calls ------------------------------------------------------------------------------
    def called(self, key: int) -> Optional[int]:
        """A pushpull of ``key`` was called (the program's order): its round of calls, the
        round it travels in; None if ``key`` was already called in this round of calls (the
        others were not): the bucket is to be dissolved from this round of calls on."""
        position = self.position[key]
        if self._called[position]:
            return None
        index = self.calls_round
        self._called[position] = True
        self._calls += 1
        if self._calls == len(self.members):       # every member called: the next round
            self._called = [False] * len(self.members)
            self._calls = 0
            self.calls_round += 1
        return index

    def dissolve(self, from_round: int) -> List[BucketRound]:
        """Its keys go alone from round of calls ``from_round`` on; the open rounds of those
        leave (send their members alone). Earlier rounds still travel in the bucket."""
        self.dissolved, self.dissolved_from = True, from_round
        leaving = [r for r in self._rounds if r.index >= from_round]
        self._rounds = [r for r in self._rounds if r.index < from_round]
        return leaving

    def goes_alone(self, index: int) -> bool:
        """Whether a round called as round of calls ``index`` goes alone (before the bucket's
        first fused round, or dissolved since)."""
        return index < self.fused_from or (self.dissolved and index >= self.dissolved_from)

    def overdue(self, now: float, timeout: float) -> List[BucketRound]:
        """Rounds opened more than ``timeout`` ago and still missing members; they leave."""
        late = [r for r in self._rounds if now - r.opened > timeout]
        if late:
            self._rounds = [r for r in self._rounds if now - r.opened <= timeout]
            self._sent = max([self._sent] + [r.index + 1 for r in late])
        return late

    def missing_keys(self, late: BucketRound) -> List[int]:
        """The members that had not pushed in ``late``."""
        return [m.key for m, a in zip(self.members, late.arrivals) if a is None]

    def uncalled_keys(self, late: BucketRound) -> List[int]:
        """The members of ``late`` whose pushpull was not called (yet) in its round of calls."""
        if late.index != self.calls_round:
            return []       # an earlier round of calls: every member was called
        return [m.key for m, c in zip(self.members, self._called) if not c]

    def has_open_rounds(self) -> bool:
        return bool(self._rounds)

    def _take_slot(self) -> Slot:
        if self._free:
            return self._free.pop()
        return Slot(self._allocate(self.nbytes), self._allocate(self.nbytes))

    def give_back(self, slot: Slot) -> None:
        """A round's buffers are free again (its answer was copied out, or it failed)."""
        self._free.append(slot)


class BucketPlan:
    """Which declared keys are fused into which buckets (see the module's docstring)."""

    def __init__(self, capacity: int, allocate: Optional[Callable[[int], np.ndarray]] = None):
        """``capacity``: a bucket's bytes at most (0: no buckets); ``allocate(nbytes)``: a
        round's buffers (default: plain numpy)."""
        self.capacity = capacity
        self._allocate = allocate or (lambda nbytes: np.empty(nbytes, dtype=np.uint8))
        self.buckets: List[Bucket] = []
        self._bucket_of: Dict[int, Bucket] = {}
        self._open: Optional[Bucket] = None

    def declare(self, key: int, nbytes: int, dtype) -> Optional[Bucket]:
        """``key`` was declared; the bucket this sealed (it does not join it), or None. A key
        declared again keeps its place."""
        if key in self._bucket_of:
            return None
        dtype = np.dtype(dtype)
        small = 0 < nbytes < self.capacity
        sealed, current = None, self._open
        if current is not None and (not small or dtype != current.dtype
                                    or current.nbytes + nbytes > self.capacity):
            sealed = self._seal()
        if small:
            if self._open is None:
                self._open = Bucket(len(self.buckets), dtype, self._allocate)
                self.buckets.append(self._open)
            self._open.add(key, nbytes)
            self._bucket_of[key] = self._open
        return sealed

    def use(self, key: int) -> Optional[Bucket]:
        """``key`` is being used: the bucket this sealed (``key``'s, if still open), or None."""
        current = self._open
        if current is not None and key in current.position:
            return self._seal()
        return None

    def bucket_of(self, key: int) -> Optional[Bucket]:
        """``key``'s bucket if it is fused into one (sealed, with other members, not
        dissolved), else None."""
        bucket = self.fused_into(key)
        return None if bucket is None or bucket.dissolved else bucket

    def fused_into(self, key: int) -> Optional[Bucket]:
        """``key``'s bucket if it was fused into one (sealed, with other members), dissolved
        since or not, else None."""
        bucket = self._of(key)
        return bucket if bucket is not None and bucket.fused else None

    def fused(self) -> List[Bucket]:
        """The fused buckets so far."""
        return [b for b in self.buckets if b.fused]

    def sealed_of(self, key: int) -> Optional[Bucket]:
        """``key``'s bucket if it is sealed with other members, learning or fused, and not
        dissolved, else None."""
        bucket = self._of(key)
        if bucket is None or not bucket.sealed or bucket.dissolved:
            return None
        return bucket if bucket.learning or bucket.fused else None

    def _of(self, key: int) -> Optional[Bucket]:
        """The bucket ``key`` is a member of (a key left out when it was formed is in none)."""
        bucket = self._bucket_of.get(key)
        return bucket if bucket is not None and key in bucket.position else None

    def _seal(self) -> Bucket:
        bucket, self._open = self._open, None
        bucket.seal()
        return bucket
