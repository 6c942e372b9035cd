"""A restarted server's filter in front of the BytePS server (BYTEPS_SERVER_RECOVERY).

A server restarted in place of a dead one (the scheduler's ``epoch`` > 0) drops requests meant
for the dead process (no epoch, or an older one: their data is in the workers' reports, or they
are re-sent), takes the workers' reports, and holds everything else until every report is in
(:class:`~.recovery.RecoveryGate`); it then has the server rebuild each key's rounds and runs
the held requests. The keys' initial values are lost. A server that was not restarted has the
stand-in :class:`NoRecovery`, which admits everything.
"""
import logging
from typing import Optional

from ..errors import ProtocolError
from ..recovery_report import REPORT_CMD, decode_report
from .recovery import RecoveryGate
from .rounds import KeyRounds

__all__ = ["NoRecovery", "RecoveryFilter"]

log = logging.getLogger(__name__)


class NoRecovery:
    """The filter of a server that was not restarted: everything passes."""

    epoch = 0
    #: why recovery failed (the server must exit); None while all is well
    error: Optional[str] = None
    #: requests dropped because they were meant for the process before the restart
    stale_requests = 0

    def admit(self, req, server, is_command: bool) -> bool:
        """Whether the server handles ``req`` now."""
        return True

    @property
    def recovering(self) -> bool:
        """Whether reports are still awaited."""
        return False

    def overdue(self, now: float) -> bool:
        """Whether the reports are late at monotonic time ``now``."""
        return False


class RecoveryFilter(NoRecovery):
    """In front of ``server`` (a BytePSServer), which took over a dead one's id as its
    ``epoch``-th restart; every report is due before monotonic time ``deadline``."""

    def __init__(self, server, epoch: int, deadline: float):
        self._server, self.epoch = server, epoch
        self._gate: Optional[RecoveryGate] = RecoveryGate(server.num_workers, deadline)
        self.stale_requests = 0

    @property
    def recovering(self) -> bool:
        return self._gate is not None

    def describe_wait(self) -> str:
        """What the restarted server still waits for."""
        gate = self._gate
        return ("restarted server (restart %d) still lacks the recovery reports of worker "
                "node(s) %s; every worker needs BYTEPS_SERVER_RECOVERY=1"
                % (self.epoch, gate.missing() if gate else []))

    def overdue(self, now: float) -> bool:
        gate = self._gate
        return gate is not None and now > gate.deadline

    def admit(self, req, server, is_command: bool) -> bool:
        if (req.meta.extra or {}).get("epoch") != self.epoch:
            self.stale_requests += 1
            if self.stale_requests == 1:
                log.warning("restarted server: dropping requests sent to the server before "
                            "it (first from node %s); their senders re-send them", req.sender)
            return False
        gate = self._gate
        if gate is None:
            return True
        if not is_command and req.meta.head == REPORT_CMD:
            self._take_report(gate, req, server)
        else:
            gate.held.append((is_command, req, server))
        return False

    def _take_report(self, gate: RecoveryGate, req, server) -> None:
        owner = self._server
        try:
            if not owner.is_worker(req.sender):
                raise ProtocolError("node %s is not a worker of this cluster" % req.sender)
            complete = gate.add(req.sender, decode_report(req.meta.body, req.keys, req.vals,
                                                          req.lens))
        except ProtocolError as exc:
            owner.refuse(req, server, str(exc))
            return
        server.respond(req)
        if complete:
            self._recover(gate)

    def _recover(self, gate: RecoveryGate) -> None:
        """Every report is in: rebuild the keys, then run the held requests."""
        owner = self._server
        try:
            restored = {}
            for ps_key, (dtype, nbytes, states) in gate.keys().items():
                rounds = KeyRounds.restored(ps_key, owner.num_workers, nbytes // dtype.itemsize,
                                            dtype, states)
                restored[ps_key] = (dtype, nbytes, rounds)
        except ProtocolError as exc:
            self.error = "the workers' recovery reports do not fit together: %s" % exc
            log.error("restarted server: %s", self.error)
            return
        owner.recover_keys(restored)
        self._gate = None
        log.warning("restarted server (restart %d): rebuilt the rounds of %d ps key(s) from %d "
                    "workers' reports; serving again", self.epoch, len(restored),
                    owner.num_workers)
        for is_command, req, server in gate.held:
            (owner.handle_command if is_command else owner.handle_request)(req, server)
