"""What a ``dist_byteps`` worker keeps so a restarted server can be restored (BYTEPS_SERVER_RECOVERY).

Per ps key: the count of rounds pushed and of pulls answered, and copies of the last two pushes
(a ring of two buffers, allocated at the first push: twice the key's bytes, and one copy of the
data per push). See :mod:`kvstore_byteps.recovery_report` for why two and for the wire format.

:class:`RecoveryKeeper` owns the kept rounds and the recovery; :class:`Unrecoverable` stands in
for it where a restarted server cannot be recovered (and says why). Threads: a push is recorded
by the KV layer's ``on_send`` hook, atomically with its send; an answer on the KV worker's
customer thread; the report is built by the KV layer on that thread, atomically with sends,
so it holds every push sent before it and none sent after.
"""
import logging
import threading
from typing import Callable, Dict, List, Optional

import numpy as np

from ..errors import PeerError
from ..mxproto import SERVER_DTYPES, RequestType, encode_cmd
from ..recovery_report import REPORT_CMD, KeyReport, encode_report
from ..van.wire.message import Node, id_to_rank

__all__ = ["KeptRounds", "RecoveryKeeper", "Unrecoverable"]

log = logging.getLogger(__name__)

#: heads of plain BytePS round requests (a push of one of these is in a recovery report)
_ROUND_CMDS = frozenset(encode_cmd(RequestType.BYTEPS, dtype) for dtype in SERVER_DTYPES)


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


class Unrecoverable:
    """A worker that cannot recover a restarted server: it fails the requests waiting on it,
    naming ``reason``."""

    def __init__(self, kv, rank: int, reason: str, on_failure: Callable[[BaseException], None]):
        self.kv, self.rank, self.reason, self._on_failure = kv, rank, reason, on_failure

    def keep(self, layout) -> None:
        """Nothing is kept."""

    def on_send(self, group, buffers) -> None:
        """Nothing to record (no ``on_send`` hook)."""
        return None

    def answered(self, group) -> None:
        """Nothing to count."""

    def give_up(self, reason: str) -> None:
        """No restarted server can be restored from now on, because of ``reason``."""
        self.reason = reason

    def explain(self, error: Optional[BaseException]) -> Optional[BaseException]:
        """``error`` of a request, with what this worker could not do about a server that
        went away (a send to it failed): restore it once restarted, and why. Whether the send
        or the restart's announcement comes first is a race; the advice is the same."""
        if getattr(error, "unreachable_node", None) is None or not self.reason:
            return error
        return PeerError("%s (if that server died, this worker cannot restore it when it "
                         "restarts: %s)" % (error, self.reason))

    def recover(self, node: Node, epoch: int) -> None:
        error = PeerError("%s was restarted and lost what it held; worker rank %s cannot "
                          "restore it: %s" % (node.describe_rank(), self.rank, self.reason))
        log.error("%s", error)
        self._on_failure(error)
        self.kv.fail_server(node.id, error)


class RecoveryKeeper(Unrecoverable):
    """Keeps every ps key's rounds and last two pushes, and recovers a restarted server."""

    def __init__(self, kv, rank: int, on_failure: Callable[[BaseException], None]):
        super().__init__(kv, rank, "", on_failure)
        self._kept: Dict[int, KeptRounds] = {}
        self._lock = threading.Lock()      # the dict: a report may be built meanwhile

    def give_up(self, reason: str) -> None:
        """Keep nothing more and restore no restarted server (``reason`` says why): this
        keeper is :class:`Unrecoverable` from now on (before the first round)."""
        with self._lock:
            super().give_up(reason)
            self._kept.clear()

    def keep(self, layout) -> None:
        """Keep the rounds of ``layout``'s partitions from now on."""
        if self.reason:
            return
        for part in layout.partitions:
            self._rounds(part, layout.dtype)

    def _rounds(self, part, dtype) -> KeptRounds:
        kept = self._kept.get(part.ps_key)
        if kept is None:
            with self._lock:
                kept = self._kept.setdefault(part.ps_key, KeptRounds(
                    part.ps_key, dtype, part.nbytes, part.server))
        return kept

    def on_send(self, group, buffers):
        """The KV layer's ``on_send`` hook for a push of ``group``'s ``buffers``."""
        if self.reason:
            return None

        def record():
            for item, data in zip(group, buffers):
                self._rounds(item.partition, item.task.context.layout.dtype).record_push(data)
        return record

    def answered(self, group) -> None:
        """``group``'s pulls were answered (on the KV worker's customer thread)."""
        for item in group:
            kept = self._kept.get(item.partition.ps_key)
            if kept is not None:
                kept.record_answer()

    def recover(self, node: Node, epoch: int) -> None:
        """On the KV worker's customer thread: ``node`` is a restarted server. Send it this
        worker's report of every ps key it holds, then re-send what it never answered."""
        if self.reason:
            return super().recover(node, epoch)
        rank, sizes = id_to_rank(node.id), []

        def report():
            with self._lock:
                reports = [kept.report() for kept in self._kept.values() if kept.server == rank]
            body, keys, vals, lens = encode_report(reports)
            sizes.extend((len(reports), vals.nbytes))
            return REPORT_CMD, body, keys, vals, lens

        def reported(request):
            if request.error is not None:
                log.error("worker rank %d: the restarted %s refused this worker's report: %s",
                          self.rank, node.describe_rank(), request.error)
                self._on_failure(request.error)
        self.kv.recovery.recover(node.id, epoch, report, _answered_by_report,
                                 callback=reported)
        log.warning("worker rank %d: sent the restarted %s its report (%d ps keys, %d bytes)",
                    self.rank, node.describe_rank(), *sizes)


def _answered_by_report(meta) -> bool:
    """Whether a request part sent to the dead server is carried by the report: a push of a
    plain round (not a pull, not a command)."""
    return meta.push and not meta.pull and meta.head in _ROUND_CMDS
