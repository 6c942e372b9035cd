"""What a ``dist_byteps`` worker keeps so a restarted server can be restored (BYTEPS_SERVER_RECOVERY).

Per ps key: the count of rounds pushed and of pulls answered, and copies of the last two pushes
(a ring of two buffers, allocated at the first push: twice the key's bytes, and one copy of the
data per push). See :mod:`kvstore_byteps.recovery_report` for why two and for the wire format.

Threads: :meth:`KeptRounds.record_push` runs on the PUSH stage thread under the KV worker's
``send_lock``, :meth:`record_answer` on the thread that completes requests; the report is built
on that thread under ``send_lock``, so it sees every push sent before it and none after.
"""
from typing import List, Optional

import numpy as np

from ..recovery_report import KeyReport

__all__ = ["KeptRounds"]


class KeptRounds:
    """One ps key's rounds as this worker saw them, and its last two pushes."""

    def __init__(self, ps_key: int, dtype, nbytes: int, server: int):
        """``server``: the rank of the server holding ``ps_key``."""
        self.ps_key, self.dtype, self.nbytes, self.server = ps_key, np.dtype(dtype), nbytes, server
        self.pushed = 0
        self.answered = 0
        self._ring: Optional[List[np.ndarray]] = None

    def record_push(self, data: np.ndarray) -> None:
        """Keep a copy of this round's push (``data``: its bytes)."""
        if self._ring is None:
            self._ring = [np.empty(self.nbytes, np.uint8), np.empty(self.nbytes, np.uint8)]
        np.copyto(self._ring[self.pushed % 2], data.reshape(-1).view(np.uint8))
        self.pushed += 1

    def record_answer(self) -> None:
        """This round's pull was answered."""
        self.answered += 1

    def report(self) -> KeyReport:
        """The key's state for the restarted server (views of the kept copies)."""
        latest = previous = None
        if self.pushed >= 1:
            latest = self._ring[(self.pushed - 1) % 2]
        if self.pushed >= 2:
            previous = self._ring[(self.pushed - 2) % 2]
        return KeyReport(self.ps_key, self.dtype, self.nbytes, self.pushed, self.answered,
                         latest, previous)
