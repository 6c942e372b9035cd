"""A restarted server's wait for the workers' reports (BYTEPS_SERVER_RECOVERY). Pure.

A server that took over a dead one's id (the scheduler's ``epoch`` > 0) knows nothing of the
rounds in flight. Every ``dist_byteps`` worker sends it one report (recovery_report.py) and then
re-sends what the dead server never answered. Until all ``num_workers`` reports are in, every
other request is held, in arrival order; then each key's rounds are rebuilt
(:meth:`KeyRounds.restored`) and the held requests run as if they had just arrived.
"""
from typing import Dict, List, Tuple

import numpy as np

from ..errors import ProtocolError
from ..recovery_report import KeyReport
from ..van.wire.message import worker_rank_to_id

__all__ = ["RecoveryGate"]


class RecoveryGate:
    """The reports received so far, and the requests held until the last one arrives.
    Driven by one thread (the KV server's customer thread)."""

    def __init__(self, num_workers: int, deadline: float):
        self.num_workers, self.deadline = num_workers, deadline
        self.reports: Dict[int, List[KeyReport]] = {}
        #: (is_command, request, responder), in arrival order
        self.held: List[tuple] = []

    def add(self, sender: int, reports: List[KeyReport]) -> bool:
        """Record ``sender``'s report; True once every worker's is in."""
        if sender in self.reports:
            raise ProtocolError("node %d sent a second recovery report" % sender)
        self.reports[sender] = reports
        return self.complete

    @property
    def complete(self) -> bool:
        return len(self.reports) == self.num_workers

    def missing(self) -> List[int]:
        """The worker ids whose report has not arrived."""
        ids = (worker_rank_to_id(rank) for rank in range(self.num_workers))
        return [node for node in ids if node not in self.reports]

    def keys(self) -> Dict[int, Tuple[np.dtype, int, Dict[int, tuple]]]:
        """ps key -> (dtype, bytes, {worker: (pushed, answered, latest, previous)}); a worker
        that did not report a key has pushed none of it. ProtocolError if workers disagree on a
        key's dtype or size."""
        merged: Dict[int, Tuple[np.dtype, int, Dict[int, tuple]]] = {}
        for sender, reports in self.reports.items():
            for report in reports:
                known = merged.setdefault(report.ps_key, (report.dtype, report.nbytes, {}))
                if (known[0], known[1]) != (report.dtype, report.nbytes):
                    raise ProtocolError("ps key %d: node %d reports %d bytes of %s, another "
                                        "worker %d bytes of %s" % (
                                            report.ps_key, sender, report.nbytes, report.dtype,
                                            known[1], known[0]))
                known[2][sender] = (report.pushed, report.answered, report.latest,
                                    report.previous)
        for _, _, states in merged.values():
            for sender in self.reports:
                states.setdefault(sender, (0, 0, None, None))
        return merged
