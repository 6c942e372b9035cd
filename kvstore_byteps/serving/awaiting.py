"""Default pulls that wait for their key's initialising push (the ``await_init`` meta field).

A ``dist_byteps`` worker that declares tensors in any order (the BytePS and Horovod APIs) reads
each key back right after rank 0 was asked to initialise it; the read may arrive first. Instead
of refusing a pull of an unknown key, the server holds it until the key's first push.
"""
import threading
from typing import Callable, Dict, List

__all__ = ["InitWaits"]


class InitWaits:
    """Held pulls per ps key. ``lock`` is the one the store's initialisation holds, and
    ``initialised(ps_key)`` says whether the store has the key: a pull is either held before
    the push initialises its key (and released by it) or finds the key."""

    def __init__(self, lock: threading.RLock, initialised: Callable[[int], bool]):
        self._lock, self._initialised = lock, initialised
        self._waiting: Dict[int, list] = {}

    def hold(self, ps_key: int, request: tuple) -> bool:
        """Hold ``request`` until ``ps_key`` is initialised; False if it already is."""
        with self._lock:
            if self._initialised(ps_key):
                return False
            self._waiting.setdefault(ps_key, []).append(request)
            return True

    def release(self, ps_key: int) -> List[tuple]:
        """The requests held for ``ps_key`` (after a push of it)."""
        if not self._waiting:
            return []
        with self._lock:
            return self._waiting.pop(ps_key, [])
