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

Thread-safety: ``take`` runs on the van's receive thread, ``register`` on any thread; a lock
guards the table.
"""
import sys
import threading
from typing import Dict, List, Tuple

import numpy as np

__all__ = ["RecvBufferPool"]

# The pool's list, the loop variable and getrefcount's own argument.
_REFS_WHEN_FREE = 3


class RecvBufferPool:
    """Reusable uint8 landing buffers, keyed by (ps key, size)."""

    def __init__(self, min_bytes: int = 65536, buffers_per_key: int = 8):
        self.min_bytes = min_bytes
        self.buffers_per_key = buffers_per_key
        self._buffers: Dict[Tuple[int, int], List[np.ndarray]] = {}
        self._lock = threading.Lock()
        self.allocated = 0          # buffers created, for tests and diagnostics
        self.reused = 0

    def register(self, key: int, nbytes: int) -> None:
        """Allocate (and page in) a buffer for frames of ``nbytes`` bytes of ``key``."""
        if nbytes < self.min_bytes:
            return
        with self._lock:
            buffers = self._buffers.setdefault((key, nbytes), [])
            if buffers:
                return
            buffers.append(self._new(nbytes))

    def take(self, key: int, nbytes: int) -> np.ndarray:
        """A buffer of ``nbytes`` bytes that nothing else refers to (reused if possible)."""
        if nbytes < self.min_bytes:
            return np.empty(nbytes, np.uint8)
        with self._lock:
            buffers = self._buffers.setdefault((key, nbytes), [])
            for buffer in buffers:
                if sys.getrefcount(buffer) == _REFS_WHEN_FREE:
                    self.reused += 1
                    return buffer
            buffer = self._new(nbytes)
            if len(buffers) < self.buffers_per_key:
                buffers.append(buffer)
            return buffer

    def _new(self, nbytes: int) -> np.ndarray:
        self.allocated += 1
        buffer = np.empty(nbytes, np.uint8)
        buffer.fill(0)      # map every page now, not while a message streams in
        return buffer

    def total_bytes(self) -> int:
        with self._lock:
            return sum(b.nbytes for buffers in self._buffers.values() for b in buffers)
