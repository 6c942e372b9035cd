"""The worker engine's gradient buckets (:mod:`.buckets`) on the wire: a fused bucket's server
key, its rounds as pipeline tasks, and the deadline of a round that misses a member.

Bucket ``n``'s server key is key ``n``'s last partition index (no key is cut into that many
partitions, see :mod:`.partition`), on server ``n mod servers``: it depends on the bucket's
number only, so workers that fused different keys still meet at the same key. Rank 0
initialises it with the bucket's layout digest in its first bytes; every worker reads it back
(waiting at the server for rank 0's, as keys declared in any order do) and compares: workers
that fused different keys stop when the bucket is formed with an error instead of summing wrong
bytes.

Every worker sends the same rounds in a bucket (:mod:`.buckets`): decided in the program's order
of calls (:class:`Ticket` carries the decision with the engine operation), or by rank 0 when a
bucket is formed and read by every worker with the layout digest (whether the program reads
between keys: rank 0 watches its first round of calls, with the framework's ``waiting`` port).

Buckets are used only where the servers sum rounds that the workers apply (synchronous
training with our servers) and gradients are not compressed: keys the servers update (backup
workers, asynchronous training) and compressed keys stay alone.
"""
import concurrent.futures
import dataclasses
import logging
import threading
import time
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from ..errors import KVStoreBytePSError
from ..memory import copy_bytes
from ..mxproto import RequestType, encode_cmd
from .buckets import Bucket, BucketPlan, BucketRound
from .layout import KeyLayout
from .partition import MAX_PARTITIONS, KeyLayoutError, Partition, encode_ps_key
from .reduce import local_reduce
from .upstream import dtype_code

__all__ = ["Fusion", "FusionPort", "Ticket", "BUCKET_INDEX"]

log = logging.getLogger(__name__)

#: the partition index of a bucket's server key (reserved: no key has that many partitions)
BUCKET_INDEX = MAX_PARTITIONS - 1


@dataclasses.dataclass(frozen=True)
class FusionPort:
    """What :class:`Fusion` needs of its worker engine (built by the engine, never the engine)."""

    rank: int
    num_servers: int
    round_cmd: Callable[[int], Any]            # the servers' dialect: a round's command, by dtype
    expect_answers: Callable[[int, int], None]     # the KV worker: where a ps key's answers land
    keep: Callable[[KeyLayout], None]          # the recovery keeper keeps a key's rounds
    name_key: Callable[[int, str], None]       # the trace's names of keys
    name_of: Callable[[int], str]
    initialise: Callable[[KeyLayout, np.ndarray], None]  # rank 0's value to the servers, waited
    pull_all: Callable[[KeyLayout, Optional[dict]], np.ndarray]  # the servers' value, waited
    submit_round: Callable[..., Any]           # one round of a layout through the pipeline
    known: Callable[[int], KeyLayout]          # a declared key's layout
    note_failure: Callable[[BaseException], None]    # the job cannot go on: leave at once
    end_job: Callable[[str], None]             # end the job for every node, saying why


class Ticket:
    """What :meth:`Fusion.use` decided for one pushpull call, carried with its engine operation
    (decided in the program's order, used when the gradient is ready): the bucket's round of
    calls it travels in (``index``), or, on rank 0 while the bucket learns, alone and watched
    (``index`` None) for the program waiting for its result before it calls another member."""

    __slots__ = ("bucket", "index", "thread")

    def __init__(self, bucket: Bucket, index: Optional[int], thread: int = 0):
        self.bucket, self.index, self.thread = bucket, index, thread

    @property
    def fused(self) -> bool:
        return self.index is not None


class _Watched:
    """A lone learning round's done-callback on rank 0: notes whether the program was waiting
    for an array when the result came (:meth:`.buckets.Bucket.read`), then finishes."""

    __slots__ = ("bucket", "key", "thread", "waiting", "on_done")

    def __init__(self, bucket, key, thread, waiting, on_done):
        self.bucket, self.key, self.thread = bucket, key, thread
        self.waiting, self.on_done = waiting, on_done

    def __call__(self, error: Optional[BaseException]) -> None:
        try:
            if error is None and self.bucket.learning and self.waiting(self.thread):
                self.bucket.read(self.key)
        finally:
            if self.on_done is not None:
                self.on_done(error)


class _Scatter:
    """A bucket round's done-callback: the answer copied into every member's outputs, then
    each member's completion. An object, not a closure (see rounds.py's _Finished)."""

    __slots__ = ("bucket", "round")

    def __init__(self, bucket: Bucket, bucket_round: BucketRound):
        self.bucket, self.round = bucket, bucket_round

    def __call__(self, error: Optional[BaseException]) -> None:
        bucket, bucket_round = self.bucket, self.round
        answer = bucket_round.slot.answer
        try:
            for member, (outputs, on_done, _) in zip(bucket.members, bucket_round.arrivals):
                failed = error
                if failed is None:
                    try:
                        part = answer[member.offset:member.end]
                        for out in outputs:
                            copy_bytes(out, part)
                    except Exception as exc:  # a bug must fail the member, never leave it
                        log.exception("copying %s's answer out failed", bucket.describe())
                        failed = exc
                if on_done is not None:
                    on_done(failed)
        finally:
            with bucket.lock:
                bucket.give_back(bucket_round.slot)


class Fusion:
    """Gradient buckets of one worker engine. ``declare`` and ``use`` on the API thread (in the
    program's order), ``arrive`` from any thread."""

    def __init__(self, port: FusionPort, capacity: int, timeout: float,
                 waiting: Optional[Callable[[int], bool]] = None):
        """``waiting(thread_id)``: whether that thread is blocked waiting for an array (the
        framework's port; without it no program is taken for one that reads between keys)."""
        self.port = port
        self.plan = BucketPlan(capacity)
        self.timeout = timeout
        self.enabled = capacity > 0
        self._waiting = waiting
        self._set_ups: Dict[int, concurrent.futures.Future] = {}   # bucket number -> set-up
        self._setting_up: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self._watch: Optional[threading.Thread] = None
        self._stop = threading.Event()

    def disable(self, why: str) -> None:
        """No bucket is used from now on (before the first pushpull)."""
        if self.enabled and self.plan.fused():
            log.info("gradient buckets off: %s", why)
        self.enabled = False

    # -- the API thread ---------------------------------------------------------------------
    def declare(self, layout: KeyLayout) -> None:
        """``layout``'s key was declared (``init``, every worker in the same order)."""
        if self.enabled:
            nbytes = sum(p.nbytes for p in layout.partitions)
            self.plan.declare(layout.key, nbytes, layout.dtype)

    def use(self, key: int, fusable: bool) -> Optional[Ticket]:
        """A pushpull (``fusable``) or a lone push of ``key`` is being called: its bucket takes
        no more members, and a pushpull's call counts (:mod:`.buckets`: the first round of
        calls forms the bucket, a member called again dissolves it). Returns the call's
        :class:`Ticket` (None: alone), decided here, in the program's order, the same on every
        worker. (Decided when the round reached :meth:`arrive`, on the thread of an engine
        operation that waits for its gradient, a round called while the bucket was learning
        could arrive after it was formed and join it on one worker while the others sent it
        alone: both waited for each other's pushes at the servers until BYTEPS_REQUEST_TIMEOUT.)

        A bucket is formed at the call that ends its first round of calls, in the program's
        order; its server key is set up in the background (rank 0 initialises it, every worker
        reads it back) while the round of calls that formed it still goes alone, and its rounds
        travel in it from the next round of calls on, which waits for the set-up if needed.
        (Set up on the spot, the program's thread waited for two requests behind the step's
        gradients on the wire, per bucket: a second of the replayed VGG-16 step at 500
        Mbit/s.)"""
        if not self.enabled:
            return None
        self.plan.use(key)
        bucket = self.plan.sealed_of(key) if fusable else None
        if bucket is None:
            return None
        if bucket.learning:
            if not bucket.learn(key):
                return self._watched(bucket)
            bucket.form(fused_from=1)
            if not bucket.fused:          # one key was pushed: it goes alone
                return None
            bucket.lock = threading.RLock()   # re-entrant: a round failed at submission
            self._set_ups[bucket.number] = self._set_up_thread().submit(self._set_up, bucket)
        with bucket.lock:
            index = bucket.called(key)
        if index is None:
            self._dissolve(bucket, bucket.calls_round,
                           "key %d was pushed again before the others" % key)
            return None
        if index < bucket.fused_from:     # the round of calls that formed it goes alone
            return None
        if bucket.layout is None:         # set up, or failed: once per bucket, not per call
            self._await_set_up(bucket)
        if bucket.goes_alone(index):      # rank 0 saw the program read between keys
            return None
        return Ticket(bucket, index)

    def _set_up_thread(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._setting_up is None:
            self._setting_up = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="bucket-set-up")
        return self._setting_up

    def _await_set_up(self, bucket: Bucket) -> None:
        """Wait for ``bucket``'s set-up; its error (the job cannot go on) is raised here."""
        try:
            self._set_ups[bucket.number].result()
        except Exception as exc:
            self.port.note_failure(exc)     # the job cannot go on: leave at once
            raise

    def _watched(self, bucket: Bucket) -> Optional[Ticket]:
        """A learning call: on rank 0, watched for a read between keys (its decision is every
        worker's); elsewhere plainly alone."""
        if self._waiting is None or self.port.rank != 0:
            return None
        return Ticket(bucket, None, threading.get_ident())

    def watch(self, key: int, ticket: Ticket, on_done):
        """``key``'s lone learning round finishes with the returned callback (rank 0)."""
        return _Watched(ticket.bucket, key, ticket.thread, self._waiting, on_done)

    def _set_up(self, bucket: Bucket) -> None:
        """Give a formed bucket its server key, initialised with rank 0's layout digest and
        decision and checked on every worker; the keys go alone if rank 0 decided so."""
        port = self.port
        num_servers = port.num_servers
        server = bucket.number % num_servers
        code = dtype_code(bucket.dtype)
        part = Partition(bucket.number, BUCKET_INDEX, 0, bucket.nbytes, server,
                         encode_ps_key(bucket.number, BUCKET_INDEX, server, num_servers))
        layout = KeyLayout(-1 - bucket.number, (bucket.nbytes // bucket.dtype.itemsize,),
                           bucket.dtype, (part,), port.round_cmd(code),
                           encode_cmd(RequestType.DEFAULT, code))
        layout.name = bucket.describe()
        port.expect_answers(part.ps_key, part.nbytes)
        port.keep(layout)
        port.name_key(layout.key, "bucket %d (%s)" % (bucket.number, ", ".join(
            port.name_of(m.key) for m in bucket.members)))
        digests = {fuse: bucket.digest(fuse)[:bucket.nbytes] for fuse in (True, False)}
        if port.rank == 0:
            value = np.zeros(bucket.nbytes, np.uint8)
            chosen = digests[not bucket.reads_between]
            value[:len(chosen)] = np.frombuffer(chosen, np.uint8)
            port.initialise(layout, value)
        differ = ("worker rank %d fused keys differently from rank 0: %s here (gradient "
                  "buckets fuse keys in the order they are declared: every worker must declare "
                  "the same keys, with the same shapes, dtypes and order, and set the same "
                  "BYTEPS_FUSION_BYTES)" % (port.rank, layout.name))
        try:
            stored = port.pull_all(layout, {"await_init": True})
        except KeyLayoutError as exc:      # rank 0's bucket has another size
            self._end_job(KeyLayoutError("%s: %s" % (differ, exc)))
        stored = stored[:len(digests[True])].tobytes()
        if stored not in digests.values():
            self._end_job(KeyLayoutError(differ))
        # too few bytes to tell the two decisions apart: alone, as every worker sees
        if digests[True] == digests[False] or stored == digests[False]:
            with bucket.lock:
                bucket.dissolve(0)
            bucket.layout = layout      # last: the program's thread reads it as "set up"
            log.info("worker rank %d: %s goes alone: %s", port.rank, bucket.describe(),
                     "rank 0 saw the program read a key's result before pushing the next"
                     if digests[True] != digests[False] else "too small to check")
            return
        bucket.layout = layout          # last: the program's thread reads it as "set up"
        log.info("worker rank %d: %s travels as ps key %d", port.rank, layout.name,
                 part.ps_key)
        self._start_watch()

    def _end_job(self, error: KeyLayoutError) -> None:
        """Raise ``error`` here, and end the job for every node saying it: the other workers
        would otherwise wait for this one's pushes until BYTEPS_REQUEST_TIMEOUT."""
        try:
            self.port.end_job(str(error))
        except Exception as exc:      # the scheduler is gone: this worker still stops
            log.debug("could not ask the scheduler to end the job: %s", exc)
        raise error

    # -- rounds (any thread) ----------------------------------------------------------------
    def arrive(self, key: int, ticket: Ticket, inputs, outputs, priority: int,
               on_done) -> bool:
        """``key``'s pushpull, whose call :meth:`use` put in its bucket's round ``ticket``,
        joins the round (the last member sends the bucket): True; False if ``key`` goes
        alone (the bucket was dissolved since, from this round of calls on)."""
        bucket = ticket.bucket
        member = bucket.members[bucket.position[key]]
        outs = [out.reshape(-1).view(np.uint8) for out in outputs]
        # the lock orders this arrival after a dissolution's sends, and rounds' submissions
        with bucket.lock:
            if bucket.goes_alone(ticket.index):
                return False
            failure = bucket.failure
            if failure is None:
                bucket_round, ready = bucket.arrive(key, ticket.index, (outs, on_done, priority),
                                                    priority, time.monotonic())
                local_reduce(inputs, into=bucket_round.slot.send[member.offset:member.end])
                for sent in ready:
                    slot = sent.slot
                    self.port.submit_round(bucket.layout, slot.send, [slot.answer],
                                           sent.priority, _Scatter(bucket, sent))
        if failure is not None and on_done is not None:
            on_done(failure)
        return True

    def _dissolve(self, bucket: Bucket, from_round: int, why: str) -> None:
        """``bucket``'s keys go alone from round of calls ``from_round`` on; members waiting
        in open rounds of those go now, under the bucket's lock: a member's next round (which
        finds the bucket dissolved under that lock) must not reach the pipeline before them."""
        with bucket.lock:
            if bucket.dissolved:
                return
            self._send_alone(bucket, bucket.dissolve(from_round))
        log.info("worker rank %d: %s is not used from its round %d on, its keys go alone: %s "
                 "(a program that reads one key's result before pushing the next)",
                 self.port.rank, bucket.describe(), from_round, why)

    def _send_alone(self, bucket: Bucket, rounds: List[BucketRound]) -> None:
        port = self.port
        for bucket_round in rounds:
            for member, arrival in zip(bucket.members, bucket_round.arrivals):
                if arrival is None:
                    continue
                outs, on_done, priority = arrival
                layout = port.known(member.key)
                port.submit_round(layout, bucket_round.slot.send[member.offset:member.end],
                                  outs, priority, on_done)

    # -- deadlines ----------------------------------------------------------------------------
    def _start_watch(self) -> None:
        if self._watch is None:
            self._watch = threading.Thread(target=self._watch_rounds, daemon=True,
                                           name="bucket-deadlines")
            self._watch.start()

    def _watch_rounds(self) -> None:
        period = min(1.0, self.timeout / 4)
        while not self._stop.wait(period):
            now = time.monotonic()
            for bucket in self.plan.fused():
                if bucket.lock is None:
                    continue
                with bucket.lock:
                    late = bucket.overdue(now, self.timeout)
                    if late and bucket.failure is None:
                        bucket.failure = self._overdue_error(bucket, late[0])
                for bucket_round in late:
                    self._fail(bucket, bucket_round, bucket.failure)

    def _overdue_error(self, bucket: Bucket, late: BucketRound) -> KVStoreBytePSError:
        missing = bucket.missing_keys(late)
        uncalled = bucket.uncalled_keys(late)
        pushed = [m.key for m in bucket.members if m.key not in missing]
        if uncalled:
            why = ("the pushpull of key%s %s was not called in that time (a program that reads "
                   "one key's result before it pushes the others of the bucket, which it did "
                   "not do in its first step, when the bucket was formed; gradient buckets send "
                   "keys declared one after another together: BYTEPS_FUSION_BYTES=0 sends every "
                   "key alone)" % ("s" if len(uncalled) > 1 else "", _keys(uncalled)))
        else:
            why = ("its pushpull was called, its input was not ready in that time; gradient "
                   "buckets send keys declared one after another together: "
                   "BYTEPS_FUSION_BYTES=0 sends every key alone; a step slower than that: "
                   "raise BYTEPS_FUSION_TIMEOUT")
        return KVStoreBytePSError(
            "worker rank %d: %s waited %g s for the gradient of key%s %s after key%s %s: %s" % (
                self.port.rank, bucket.describe(), self.timeout,
                "s" if len(missing) > 1 else "", _keys(missing),
                "s" if len(pushed) > 1 else "", _keys(pushed), why))

    def _fail(self, bucket: Bucket, bucket_round: BucketRound, error) -> None:
        self.port.note_failure(error)
        for arrival in bucket_round.arrivals:
            if arrival is not None and arrival[1] is not None:
                arrival[1](error)
        with bucket.lock:
            bucket.give_back(bucket_round.slot)

    def close(self) -> None:
        """Stop the deadline thread (and the set-up thread once it is idle)."""
        self._stop.set()
        if self._setting_up is not None:
            self._setting_up.shutdown(wait=False)


def _keys(keys: List[int]) -> str:
    return ", ".join(map(str, keys if len(keys) <= 8 else keys[:8] + ["..."]))
