"""Landing buffers for large incoming data frames, allocated once and reused every round.

A receive-into-place van (byteps_tcp now, RDMA later) asks the pool for the buffer a frame of
``nbytes`` belonging to ps key ``key`` lands in. Training sends the same keys with the same sizes
every round, so after the first round every large frame lands in memory that is already mapped:
no allocation and no page faults per message. ``register`` does the first allocation up front
(at key initialisation) and touches every page.

A buffer is handed out again only when nothing outside the pool refers to it any more: the
message, and every memoryview or numpy view made from it, holds a reference to the array, so
the reference count says exactly when the consumer (the server's summation, the worker's copy
into its outputs) is done. A consumer that keeps a frame longer simply makes the pool allocate
another one; it never sees its data overwritten.

A consumer that knows where the next frame of a key belongs (the worker, for the answer to
the pull it is about to send: the partition's span of the output array) can ``expect`` it
there: that frame then lands in the consumer's memory, and the copy out of a landing buffer is
saved. Such a landing is the consumer's memory, which it may give back (to MXNet, which may
free it) once its request is over, answered or not; ``revoke`` makes sure that from its return
on nothing is written there: the reader writes into an expected target only under
``landing_lock`` and after checking that it was not revoked (the rest of a revoked frame goes to
a scratch buffer). Every byte of a frame is written by the kernel's ``recv_into`` or copied
from the read-ahead buffer, both under the lock, so ``revoke`` waits at most for one of those.

Thread-safety: ``take`` runs on the van's receive thread, ``register``, ``expect`` and
``revoke`` on any thread; a lock guards the tables.
"""
import sys
import threading
from typing import Dict, List, Optional, Tuple

import numpy as np

__all__ = ["RecvBufferPool", "Landing"]


def _refs_in_pool(buffers: list) -> int:
    """What ``sys.getrefcount`` says of a buffer nothing outside ``buffers`` refers to, seen
    from a loop over the pool's list as :meth:`RecvBufferPool._reuse_or_new` runs it."""
    for buffer in buffers:
        return sys.getrefcount(buffer)
    return 0


#: The pool's list, the loop variable and getrefcount's own argument: 3 in the interpreter;
#: measured, because compiled code (Cython) holds fewer temporary references (a fixed 3 never
#: found a free buffer there, and every frame got a new one, zeroed).
_REFS_WHEN_FREE = _refs_in_pool([np.empty(1, np.uint8)])


class Landing:
    """Where the consumer wants the next frame of ``key`` (``target``, a writable uint8 array
    of the frame's exact size); ``revoked`` once the consumer took it back."""

    __slots__ = ("key", "target", "revoked")

    def __init__(self, key: int, target: np.ndarray):
        self.key, self.target, self.revoked = key, target, False


class RecvBufferPool:
    """Reusable uint8 landing buffers, keyed by (ps key, size)."""

    def __init__(self, min_bytes: int = 65536, buffers_per_key: int = 8):
        self.min_bytes = min_bytes
        self.buffers_per_key = buffers_per_key
        self._buffers: Dict[Tuple[int, int], List[np.ndarray]] = {}     # registered slots
        self._by_class: Dict[int, List[np.ndarray]] = {}     # other frames, by size class
        self._lock = threading.Lock()
        #: held by the reader while it writes into an expected target (see ``revoke``)
        self.landing_lock = threading.Lock()
        self._expected: Dict[Tuple[int, int], Landing] = {}
        self.allocated = 0          # buffers created, for tests and diagnostics
        self.reused = 0
        self.landed_in_place = 0    # frames handed to a consumer's expected target

    def register(self, key: int, nbytes: int) -> None:
        """Allocate (and page in) a buffer for frames of ``nbytes`` bytes of ``key``."""
        if nbytes < self.min_bytes:
            return
        with self._lock:
            buffers = self._buffers.setdefault((key, nbytes), [])
            if buffers:
                return
            buffers.append(self._new(nbytes))

    def expect(self, key: int, target: np.ndarray) -> Optional[Landing]:
        """Land the next frame of ``key`` that has exactly ``target.nbytes`` bytes in
        ``target`` (C-contiguous, writable, uint8). Returns the landing to ``revoke`` once the
        consumer's request is over, or None when the frame would not land in place anyway
        (too small)."""
        if target.nbytes < self.min_bytes:
            return None
        if target.dtype != np.uint8 or not target.flags.c_contiguous \
                or not target.flags.writeable:
            raise ValueError("a landing target must be a writable C-contiguous uint8 array")
        landing = Landing(key, target)
        with self._lock:
            self._expected[(key, target.nbytes)] = landing
        return landing

    def revoke(self, landing: Optional[Landing]) -> None:
        """From the return of this call on, nothing writes into ``landing.target``."""
        if landing is None:
            return
        with self.landing_lock:
            landing.revoked = True
        with self._lock:
            slot = (landing.key, landing.target.nbytes)
            if self._expected.get(slot) is landing:
                del self._expected[slot]

    def take_for_frame(self, key: int, nbytes: int) -> Tuple[np.ndarray, Optional[Landing]]:
        """Where a frame of ``nbytes`` bytes of ``key`` lands: the consumer's expected target
        (and its landing, which the reader must check under ``landing_lock``), else a buffer
        from :meth:`take` (and None)."""
        with self._lock:
            landing = self._expected.pop((key, nbytes), None)
        if landing is not None:
            self.landed_in_place += 1
            return landing.target, landing
        return self.take(key, nbytes), None

    def take(self, key: int, nbytes: int) -> np.ndarray:
        """A buffer of ``nbytes`` bytes that nothing else refers to (reused if possible)."""
        if nbytes < self.min_bytes:
            return np.empty(nbytes, np.uint8)
        with self._lock:
            buffers = self._buffers.get((key, nbytes))
            if buffers is not None:
                return self._reuse_or_new(buffers, nbytes, touch=True)
            # A frame of a size no key registered, e.g. several small partitions sent
            # together, whose total differs from round to round. Keeping buffers per (key,
            # size) for those would keep new ones every round without end; a few buffers per
            # power-of-two size class bound the pool whatever the sizes.
            size_class = 1 << (nbytes - 1).bit_length()
            buffers = self._by_class.setdefault(size_class, [])
            return self._reuse_or_new(buffers, size_class, touch=False)[:nbytes]

    def _reuse_or_new(self, buffers: List[np.ndarray], nbytes: int,
                      touch: bool) -> np.ndarray:
        """(Under ``_lock``.) One of ``buffers`` that nothing outside the pool refers to (a
        numpy view holds its base, so a frame handed out as a view counts too), else a new
        one of ``nbytes``, kept while ``buffers`` has fewer than ``buffers_per_key``."""
        for buffer in buffers:
            if sys.getrefcount(buffer) == _REFS_WHEN_FREE:
                self.reused += 1
                return buffer
        buffer = self._new(nbytes, touch)
        if len(buffers) < self.buffers_per_key:
            buffers.append(buffer)
        return buffer

    def _new(self, nbytes: int, touch: bool = True) -> np.ndarray:
        """A new buffer; ``touch``: map every page now, not while a message streams in
        (size-class buffers are not: their frames use only part of them)."""
        self.allocated += 1
        buffer = np.empty(nbytes, np.uint8)
        if touch:
            buffer.fill(0)
        return buffer

    def total_bytes(self) -> int:
        """Bytes of the buffers the pool keeps."""
        with self._lock:
            kept = list(self._buffers.values()) + list(self._by_class.values())
            return sum(b.nbytes for buffers in kept for b in buffers)
