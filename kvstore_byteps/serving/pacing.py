"""Push pacing: hold the acknowledgement of a push from a worker that is far ahead of the others.

Why. In a synchronous round a partition's sum can leave this server only when *every* worker's
push of it has arrived, so the server's outbound link runs at the pace of the slowest worker's
pushes. The workers share the server's inbound link, and TCP does not share it evenly: on
1 Gbit/s emulated links (4 workers, 2 servers, ResNet-50's gradients) one worker's pushes came
in at 60-80 MB/s while another's came at 20-40. The fast worker's partitions then wait for the
slow one's, sums leave late, and each round ends with the inbound side idle while the backlog
of sums drains.

How. A worker's scheduling credit bounds its pushes in flight, and a push returns its credit
when acknowledged. So the server acknowledges a round push at once unless its sender has
delivered more than ``lead_bytes`` beyond the worker furthest behind; such acknowledgements
wait until that worker catches up. The sender's credit runs out, and the link's share goes to
the others. Only the acknowledgement waits: the pushed data is summed at once.

Why it does not hang. The worker furthest behind is never held (its lead is 0), and in a
synchronous job every worker pushes the same bytes to this server each round, so it always has
pushes to make that let the others go on. Its credit is shared with its pushes to *other*
servers, though, where it may be ahead and held; in the unlucky case where two workers each
wait for the other at different servers, :class:`HoldExpiry` releases every acknowledgement
held ``hold_s`` or longer (it looks every ``hold_s / 2``, so the longest hold is 1.5 x
``hold_s``), which turns that case into a delay, counted in :attr:`PushPacer.expired_total`.

:class:`PushPacer` is pure and thread-safe; :class:`PacedAcks` is what the server plugs in: it
calls :meth:`PushPacer.arrived` for every round push and runs a :class:`HoldExpiry` thread
beside it. :class:`ImmediateAcks` (no pacing) answers every push at once.
"""
import collections
import logging
import threading
import time
from typing import Callable, Deque, Dict, List, Optional, Tuple

__all__ = ["PushPacer", "HoldExpiry", "ImmediateAcks", "PacedAcks"]

log = logging.getLogger(__name__)

Ack = Callable[[], None]


class PushPacer:
    """Per-worker byte counts of round pushes, and the acknowledgements being held."""

    def __init__(self, num_workers: int, lead_bytes: int, hold_s: float):
        if num_workers < 1 or lead_bytes < 0 or hold_s <= 0:
            raise ValueError("PushPacer(num_workers=%r, lead_bytes=%r, hold_s=%r)"
                             % (num_workers, lead_bytes, hold_s))
        self.num_workers = num_workers
        self.lead_bytes = lead_bytes
        self.hold_s = hold_s
        self._lock = threading.Lock()
        self._delivered: Dict[int, int] = {}
        #: per sender, (its byte count after that push, when it arrived, ack), oldest first
        self._held: Dict[int, Deque[Tuple[int, float, Ack]]] = {}
        self._floor = 0
        #: acknowledgements held so far, and how many of them the hold limit released
        self.held_total = 0
        self.expired_total = 0

    @property
    def floor(self) -> int:
        """Bytes delivered by the worker furthest behind (0 until every worker pushed)."""
        return self._floor

    def held(self) -> int:
        """Acknowledgements waiting now."""
        with self._lock:
            return sum(len(queue) for queue in self._held.values())

    def arrived(self, sender: int, nbytes: int, ack: Ack, now: float) -> List[Ack]:
        """A round push of ``nbytes`` from ``sender`` arrived at monotonic time ``now``: the
        acknowledgements to send now, in order (``ack`` itself unless it must wait, and any
        that this push lets go)."""
        with self._lock:
            count = self._delivered.get(sender, 0) + nbytes
            self._delivered[sender] = count
            ready: List[Ack] = []
            if len(self._delivered) >= self.num_workers:
                floor = min(self._delivered.values())
                if floor > self._floor:
                    self._floor = floor
                    ready.extend(self._release_locked(lambda count, since: (
                        count - floor <= self.lead_bytes)))
            queue = self._held.get(sender)
            if queue or count - self._floor > self.lead_bytes:
                if queue is None:
                    queue = self._held[sender] = collections.deque()
                queue.append((count, now, ack))       # behind its sender's held ones
                self.held_total += 1
            else:
                ready.append(ack)
            return ready

    def expired(self, now: float) -> List[Ack]:
        """The acknowledgements held for ``hold_s`` or longer by monotonic time ``now``."""
        with self._lock:
            ready = self._release_locked(lambda count, since: now - since >= self.hold_s)
            self.expired_total += len(ready)
            return ready

    def _release_locked(self, may_go: Callable[[int, float], bool]) -> List[Ack]:
        ready: List[Ack] = []
        for sender in list(self._held):
            queue = self._held[sender]
            while queue and may_go(queue[0][0], queue[0][1]):   # in each sender's order
                ready.append(queue.popleft()[2])
            if not queue:
                del self._held[sender]
        return ready

    def release_all(self) -> List[Ack]:
        """Every held acknowledgement (on shutdown)."""
        with self._lock:
            ready = [ack for queue in self._held.values() for _, _, ack in queue]
            self._held.clear()
            return ready


class HoldExpiry:
    """The thread that sends acknowledgements held for the pacer's ``hold_s`` (it looks every
    ``hold_s / 2``)."""

    def __init__(self, pacer: PushPacer, send: Callable[[List[Ack]], None]):
        self._pacer, self._send = pacer, send
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True,
                                        name="kvstore-byteps-pacing")
        self._thread.start()

    def _loop(self) -> None:
        period = self._pacer.hold_s / 2
        while not self._stop.wait(period):
            acks = self._pacer.expired(time.monotonic())
            if acks:
                self._send(acks)

    def close(self) -> None:
        """Stop the thread (the server is done: what is still held is not sent)."""
        self._stop.set()
        self._thread.join(self._pacer.hold_s * 2 + 1.0)


def _send_all(acks: List[Ack]) -> None:
    for ack in acks:
        ack()


class ImmediateAcks:
    """Round pushes are acknowledged at once (no pacing: the default, and never in async mode
    or with backup workers)."""

    pacer: Optional[PushPacer] = None

    @staticmethod
    def ack(sender: int, nbytes: int, send: Ack) -> None:
        send()

    def close(self) -> None:
        pass


class PacedAcks:
    """Round pushes acknowledged through a :class:`PushPacer`, with its :class:`HoldExpiry`."""

    def __init__(self, num_workers: int, lead_bytes: int, hold_s: float):
        self.pacer = PushPacer(num_workers, lead_bytes, hold_s)
        self._expiry = HoldExpiry(self.pacer, _send_all)

    def ack(self, sender: int, nbytes: int, send: Ack) -> None:
        """Acknowledge ``sender``'s push of ``nbytes`` now (``send``), or once the others
        caught up."""
        _send_all(self.pacer.arrived(sender, nbytes, send, time.monotonic()))

    def close(self) -> None:
        """Stop the expiry thread; say what is still held (it is not sent) and what was."""
        self._expiry.close()
        left = self.pacer.release_all()
        if left:
            log.warning("closing with %d push acknowledgement(s) still held by pacing", len(left))
        if self.pacer.held_total:
            log.info("pacing held %d push acknowledgement(s); the hold limit released %d",
                     self.pacer.held_total, self.pacer.expired_total)
