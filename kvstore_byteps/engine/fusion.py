"""The worker engine's gradient buckets (:mod:`.buckets`) on the wire: a fused bucket's server
key, its rounds as pipeline tasks, and the deadline of a round that misses a member.

Bucket ``n``'s server key is key ``n``'s last partition index (no key is cut into that many
partitions, see :mod:`.partition`), on server ``n mod servers``: it depends on the bucket's
number only, so workers that fused different keys still meet at the same key. Rank 0
initialises it with the bucket's layout digest in its first bytes; every worker reads it back
(waiting at the server for rank 0's, as keys declared in any order do) and compares: workers
that fused different keys stop when the bucket is formed with an error instead of summing wrong
bytes.

Buckets are used only where the servers sum rounds that the workers apply (synchronous
training with our servers) and gradients are not compressed: keys the servers update (backup
workers, asynchronous training) and compressed keys stay alone.
"""
import logging
import threading
import time
from typing import List, Optional

import numpy as np

from ..errors import KVStoreBytePSError
from ..memory import copy_bytes
from ..mxproto import RequestType, encode_cmd
from .buckets import Bucket, BucketPlan, BucketRound
from .layout import KeyLayout
from .partition import MAX_PARTITIONS, KeyLayoutError, Partition, encode_ps_key
from .reduce import local_reduce
from .upstream import dtype_code

__all__ = ["Fusion", "BUCKET_INDEX"]

log = logging.getLogger(__name__)

#: the partition index of a bucket's server key (reserved: no key has that many partitions)
BUCKET_INDEX = MAX_PARTITIONS - 1
#: a round of calls of a bucket's members (one loop of gluon's Trainer or Module: milliseconds)
#: that stops for this long means the program waits for a member's result: the bucket is
#: dissolved (buckets.py)
CALLS_STOPPED_S = 1.0


class _Scatter:
    """A bucket round's done-callback: the answer copied into every member's outputs, then
    each member's completion. An object, not a closure (see worker.py's _Finished)."""

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

    def __init__(self, engine, capacity: int, timeout: float):
        self.engine = engine
        self.plan = BucketPlan(capacity)
        self.timeout = timeout
        self.enabled = capacity > 0
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

    def use(self, key: int, fusable: bool) -> bool:
        """A pushpull (``fusable``) or a lone push of ``key`` is being called: its bucket takes
        no more members, and a pushpull's call counts (:mod:`.buckets`: the first round of
        calls forms the bucket, later ones may dissolve it). Returns whether this call's round
        travels in the bucket: decided here, in the program's order, the same on every
        worker. (Decided when the round reached :meth:`arrive`, on the thread of an engine
        operation that waits for its gradient, a round called while the bucket was learning
        could arrive after it was formed and join it on one worker while the others sent it
        alone: both waited for each other's pushes at the servers until BYTEPS_REQUEST_TIMEOUT.)

        A bucket gets its server key when it is formed, here, in the program's order of calls:
        rank 0 never waits for the others there, and any other worker waits only for rank 0 to
        reach the same call."""
        if not self.enabled:
            return False
        self.plan.use(key)
        bucket = self.plan.sealed_of(key) if fusable else None
        if bucket is None:
            return False
        if bucket.learning:
            if not bucket.learn(key):
                return False
            bucket.form()
            if not bucket.fused:          # one key was pushed: it goes alone
                return False
            try:
                self._set_up(bucket)
            except Exception as exc:
                self.engine._note_failure(exc)     # the job cannot go on: leave at once
                raise
        with bucket.lock:
            again = not bucket.called(key, time.monotonic())
        if again:
            self._dissolve(bucket, "key %d was pushed again before the others" % key)
            return False
        return True

    def _set_up(self, bucket: Bucket) -> None:
        """Give a sealed bucket its server key, initialised and checked on every worker."""
        engine = self.engine
        num_servers = engine.po.num_servers
        server = bucket.number % num_servers
        code = dtype_code(bucket.dtype)
        part = Partition(bucket.number, BUCKET_INDEX, 0, bucket.nbytes, server,
                         encode_ps_key(bucket.number, BUCKET_INDEX, server, num_servers))
        layout = KeyLayout(-1 - bucket.number, (bucket.nbytes // bucket.dtype.itemsize,),
                           bucket.dtype, (part,), engine.dialect.round_cmd(code),
                           encode_cmd(RequestType.DEFAULT, code))
        layout.name = bucket.describe()
        engine.kv.expect_answers(part.ps_key, part.nbytes)
        engine.keeper.keep(layout)
        engine.tracer.name_key(layout.key, "bucket %d (%s)" % (bucket.number, ", ".join(
            engine.tracer.name_of(m.key) for m in bucket.members)))
        digest = bucket.digest()[:bucket.nbytes]
        if engine.rank == 0:
            value = np.zeros(bucket.nbytes, np.uint8)
            value[:len(digest)] = np.frombuffer(digest, np.uint8)
            engine._wait(engine.kv.push([part.ps_key], value, [part.nbytes],
                                        cmd=layout.init_cmd), "initialising %s" % layout.name)
        differ = ("worker rank %d fused keys differently from rank 0: %s here (gradient "
                  "buckets fuse keys in the order they are declared: every worker must declare "
                  "the same keys, with the same shapes, dtypes and order, and set the same "
                  "BYTEPS_FUSION_BYTES)" % (engine.rank, layout.name))
        try:
            stored = engine._pull_all(layout, {"await_init": True})
        except KeyLayoutError as exc:      # rank 0's bucket has another size
            self._end_job(KeyLayoutError("%s: %s" % (differ, exc)))
        if stored[:len(digest)].tobytes() != digest:
            self._end_job(KeyLayoutError(differ))
        bucket.lock = threading.Lock()
        bucket.layout = layout
        log.info("worker rank %d: %s travels as ps key %d", engine.rank, layout.name,
                 part.ps_key)
        self._start_watch()

    def _end_job(self, error: KeyLayoutError) -> None:
        """Raise ``error`` here, and end the job for every node saying it: the other workers
        would otherwise wait for this one's pushes until BYTEPS_REQUEST_TIMEOUT."""
        try:
            self.engine.po.end_job(str(error))
        except Exception as exc:      # the scheduler is gone: this worker still stops
            log.debug("could not ask the scheduler to end the job: %s", exc)
        raise error

    # -- rounds (any thread) ----------------------------------------------------------------
    def arrive(self, key: int, inputs, outputs, priority: int, on_done) -> bool:
        """``key``'s pushpull, whose call :meth:`use` put in its bucket, joins the bucket's
        round (the last member sends the bucket): True; False if ``key`` goes alone (the
        bucket was dissolved since)."""
        # a dissolved bucket too: its lock orders this arrival after the dissolution's sends
        bucket = self.plan.fused_into(key) if self.enabled else None
        if bucket is None or bucket.layout is None:
            return False
        member = bucket.members[bucket.position[key]]
        outs = [out.reshape(-1).view(np.uint8) for out in outputs]
        with bucket.lock:
            if bucket.dissolved:
                return False
            failure = bucket.failure
            if failure is None:
                bucket_round, complete = bucket.arrive(key, (outs, on_done, priority), priority,
                                                       time.monotonic())
                local_reduce(inputs, into=bucket_round.slot.send[member.offset:member.end])
        if failure is not None:
            if on_done is not None:
                on_done(failure)
        elif complete:
            slot = bucket_round.slot
            self.engine.submit_round(bucket.layout, slot.send, [slot.answer],
                                     bucket_round.priority, _Scatter(bucket, bucket_round))
        return True

    def _dissolve(self, bucket: Bucket, why: str) -> None:
        """``bucket``'s keys go alone from now on; members waiting in open rounds go now, under
        the bucket's lock: a member's next round (which finds the bucket dissolved under that
        lock) must not reach the pipeline before them."""
        with bucket.lock:
            if bucket.dissolved:
                return
            self._send_alone(bucket, bucket.dissolve())
        log.info("worker rank %d: %s is not used, its keys go alone: %s (a program that reads "
                 "one key's result before pushing the next)", self.engine.rank,
                 bucket.describe(), why)

    def _send_alone(self, bucket: Bucket, rounds: List[BucketRound]) -> None:
        engine = self.engine
        for bucket_round in rounds:
            for member, arrival in zip(bucket.members, bucket_round.arrivals):
                if arrival is None:
                    continue
                outs, on_done, priority = arrival
                layout = engine.layouts.known(member.key)
                engine.submit_round(layout, bucket_round.slot.send[member.offset:member.end],
                                    outs, priority, on_done)

    # -- deadlines ----------------------------------------------------------------------------
    def _start_watch(self) -> None:
        if self._watch is None:
            self._watch = threading.Thread(target=self._watch_rounds, daemon=True,
                                           name="bucket-deadlines")
            self._watch.start()

    def _watch_rounds(self) -> None:
        period = min(CALLS_STOPPED_S / 4, self.timeout / 4)
        while not self._stop.wait(period):
            now = time.monotonic()
            for bucket in self.plan.fused():
                if bucket.lock is None or bucket.dissolved:
                    continue
                with bucket.lock:
                    stopped = bucket.calls_stopped(now, CALLS_STOPPED_S)
                    late = bucket.overdue(now, self.timeout)
                    if late and bucket.failure is None:
                        bucket.failure = self._overdue_error(bucket, late[0])
                for bucket_round in late:
                    self._fail(bucket, bucket_round, bucket.failure)
                if stopped:
                    self._dissolve(bucket, "the program stopped calling pushpull for its "
                                   "other keys for %g s" % CALLS_STOPPED_S)

    def _overdue_error(self, bucket: Bucket, late: BucketRound) -> KVStoreBytePSError:
        missing = bucket.missing_keys(late)
        pushed = [m.key for m in bucket.members if m.key not in missing]
        return KVStoreBytePSError(
            "worker rank %d: %s waited %g s for the gradient of key%s %s after key%s %s (its "
            "pushpull was called, its input was not ready in that time; gradient buckets send "
            "keys declared one after another together: BYTEPS_FUSION_BYTES=0 sends every key "
            "alone; a step slower than that: raise BYTEPS_FUSION_TIMEOUT)" % (
                self.engine.rank, bucket.describe(), self.timeout,
                "s" if len(missing) > 1 else "", _keys(missing),
                "s" if len(pushed) > 1 else "", _keys(pushed)))

    def _fail(self, bucket: Bucket, bucket_round: BucketRound, error) -> None:
        self.engine._note_failure(error)
        for arrival in bucket_round.arrivals:
            if arrival is not None and arrival[1] is not None:
                arrival[1](error)
        with bucket.lock:
            bucket.give_back(bucket_round.slot)

    def close(self) -> None:
        """Stop the deadline thread."""
        self._stop.set()


def _keys(keys: List[int]) -> str:
    return ", ".join(map(str, keys if len(keys) <= 8 else keys[:8] + ["..."]))
