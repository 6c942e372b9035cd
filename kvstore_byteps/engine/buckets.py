"""Gradient buckets: consecutive small keys of one dtype fused into one server key. Pure.

A worker pays for every key in flight: an engine operation, a work item through the credit
queue and both stages, a summing job and an answer slot on the server, a completion. With
many small tensors that, not the bytes, is the cost (benchmarks/bench_cost.py). Horovod fuses
tensors into one buffer before its all-reduce, PyTorch's DDP reduces gradients in buckets;
here a bucket is one server key that its members' gradients travel in together.

Which keys (:class:`BucketPlan`): a key declared by ``init`` (every worker declares its keys in
the same order, paired by a barrier) of fewer bytes than the capacity (``BYTEPS_FUSION_BYTES``)
joins the open bucket if it has the bucket's dtype and fits; otherwise it opens the next one.
A bucket closes (is *sealed*) when a declared key does not join it, or when one of its members
is first used: a program that declares a key, uses it and only then declares the next (as
BytePS's and Horovod's per-tensor calls do) fuses nothing. Then the bucket *learns* for one
round of calls: its keys go alone, and the keys whose pushpull is called before any of them is
called again are the bucket's members from then on (gluon's Trainer declares every parameter,
BatchNorm's running statistics and frozen layers too, but pushes only the ones with
gradients). A bucket of one member is no bucket: that key goes alone. Every worker makes the
same buckets from the same declarations and calls; :meth:`Bucket.digest` lets them check it.

Rounds (:class:`Bucket`): each member's pushpull copies its gradient into the round's send
buffer at its offset; the member that completes the round sends the bucket, with the highest
priority of its members; the answer is copied out member by member. Buffers are reused across
rounds. A round that misses a member past the deadline is failed, naming the missing keys.

Calls: gluon's Trainer and Module call pushpull for every key of a step in one loop, so a
bucket's members are all *called* within milliseconds, however late their gradients are ready.
A program that reads a key's result before calling the next key's pushpull (a test of sums,
one key at a time) calls a member again before the others, or stops calling while it waits:
then the bucket is *dissolved* and its keys go alone from then on. Both signs come from the
program's order of calls, which is the same on every worker, so every worker dissolves the
same buckets.
"""
import collections
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

    __slots__ = ("slot", "arrivals", "missing", "priority", "opened")

    def __init__(self, slot: Slot, members: int, opened: float):
        self.slot = slot
        #: per member: what its pushpull passed (outputs, on_done), None until it arrived
        self.arrivals: List[Optional[tuple]] = [None] * members
        self.missing = members
        self.priority: Optional[int] = None
        self.opened = opened


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
        self.dissolved = False      # its keys go alone (see the module's docstring)
        self.layout = None          # its wire layout, set by the engine when it is sealed
        self.failure: Optional[BaseException] = None
        self.lock = None            # the engine's lock for this bucket
        self._allocate = allocate
        self._rounds: "collections.deque[BucketRound]" = collections.deque()
        self._free: List[Slot] = []
        self._called: List[bool] = []     # per member: called in the current round of calls
        self._calls = 0
        self._calls_began = 0.0

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

    def form(self) -> None:
        """The members are the keys called in the first round of calls, in declared order."""
        called, self._learnt = set(self._learnt), None
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

    def digest(self) -> bytes:
        """A hash of the layout: members' keys and sizes in order, and the dtype."""
        text = "%s:%s" % (self.dtype.str, ",".join("%d/%d" % (m.key, m.nbytes)
                                                   for m in self.members))
        return hashlib.blake2b(text.encode("ascii"), digest_size=8).digest()

    # -- rounds -------------------------------------------------------------------------------
    def arrive(self, key: int, arrival: tuple, priority: int,
               now: float) -> Tuple[BucketRound, bool]:
        """``key``'s pushpull of its earliest round it has not pushed in yet (opening a round
        if none): ``(round, complete)``. A complete round leaves the bucket: send it.
        ``arrival`` is the caller's (kept in the round's ``arrivals``)."""
        index = self.position[key]
        for open_round in self._rounds:
            if open_round.arrivals[index] is None:
                break
        else:
            open_round = BucketRound(self._take_slot(), len(self.members), now)
            self._rounds.append(open_round)
        open_round.arrivals[index] = arrival
        open_round.missing -= 1
        if open_round.priority is None or priority > open_round.priority:
            open_round.priority = priority
        complete = open_round.missing == 0
        if complete:
            # a member arrives at its earliest open round, so rounds complete in order
            assert self._rounds[0] is open_round
            self._rounds.popleft()
        return open_round, complete

    # -- calls ------------------------------------------------------------------------------
    def called(self, key: int, now: float) -> bool:
        """A pushpull of ``key`` was called; False if ``key`` was already called in this round
        of calls (the others were not): the bucket is to be dissolved."""
        index = self.position[key]
        if self._called[index]:
            return False
        if self._calls == 0:
            self._calls_began = now
        self._called[index] = True
        self._calls += 1
        if self._calls == len(self.members):       # every member called: the next round
            self._called = [False] * len(self.members)
            self._calls = 0
        return True

    def calls_stopped(self, now: float, wait: float) -> bool:
        """Whether a round of calls began more than ``wait`` ago and is still incomplete."""
        return self._calls > 0 and now - self._calls_began > wait

    def dissolve(self) -> List[BucketRound]:
        """Its keys go alone from now on; the rounds still open leave (send their members
        alone)."""
        self.dissolved = True
        rounds, self._rounds = list(self._rounds), collections.deque()
        return rounds

    def overdue(self, now: float, timeout: float) -> List[BucketRound]:
        """Rounds opened more than ``timeout`` ago and still missing members; they leave."""
        late = []
        while self._rounds and now - self._rounds[0].opened > timeout:
            late.append(self._rounds.popleft())
        return late

    def missing_keys(self, late: BucketRound) -> List[int]:
        """The members that had not pushed in ``late``."""
        return [m.key for m, a in zip(self.members, late.arrivals) if a is None]

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
