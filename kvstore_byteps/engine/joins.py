"""A worker's side of elastic joins (the servers' side: serving/joins.py; the program's:
kvstore_byteps/elastic.py). Knows nothing of MXNet; talks to the job through a small port.

Every worker still training reports each ``State.commit()`` to server rank 0, and at its next
commit reads who joins there (a report costs the step no round trip). Where somebody does,
each finishes its pending operations (every round it pushed answered) and passes the ``join``
barrier twice with the late workers: between the two, each late worker takes its place in
every key's rounds (``BYTEPS_ADMIT``), while nobody pushes.
A late worker (the scheduler seated it in a departed one's place) is *joining* from its start
until then: its barriers pass at once (nobody else is in them), its keys are read, never
initialised, and it asks server rank 0 to join until the others reach a commit."""
import logging
import time
from typing import Any, Callable, List, NamedTuple, Optional, Tuple

from ..errors import JOINED_LINE, DeadlineError, KVStoreBytePSError
from ..logs import uptime
from ..mxproto import ServerCommand

__all__ = ["JoinPort", "Joins"]

log = logging.getLogger(__name__)

#: how often a late worker asks to join
ASK_EVERY_S = 0.05


class JoinPort(NamedTuple):
    """What elastic joins need of the worker."""
    send_first: Callable[[ServerCommand, bytes], Any]    # a command to server rank 0: request
    answer: Callable[[Any, str], bytes]                  # a request's answer (waited for)
    tell_all: Callable[[ServerCommand, bytes, str], Any]      # a command to every server
    join_barrier: Callable[[float, List[int]], None]   # the join barrier of these joiners,
    #                                                    within seconds
    leads: Callable[[], bool]               # whether this worker hands its parameters over
    timeout: float                          # BYTEPS_REQUEST_TIMEOUT


class Joins:
    """This worker's commits, and its own join if it started late."""

    def __init__(self, port: JoinPort, late: bool, enabled: bool):
        """``enabled``: an elastic job (else commits do nothing)."""
        self._port = port
        self.enabled = enabled
        self.timeout = port.timeout
        #: a late worker that has not joined yet: its barriers pass, its keys are read
        self.joining = late
        self.commits = 0
        self._report = None         # the last commit's report, its answer read at the next
        #: called where somebody joins, every round answered (the gradient buckets go off)
        self.hooks: List[Callable[[], None]] = []

    def commit(self, state: bytes, settle: Callable[[], None],
               handover: Optional[Callable[[], bytes]] = None) -> List[int]:
        """The program's ``n``-th commit with its ``state`` (JSON): the late workers' node
        ids that joined here (after the join barriers), or []. ``settle()`` waits for this
        worker's pending operations (MXNet's ``waitall``); ``handover()``, where the
        workers update, this worker's parameters and optimizer state (the leading worker
        leaves them for the joiners, kvstore_byteps/handover.py). Blocking."""
        if self.joining:
            raise RuntimeError("a late worker commits only after it joined (create its "
                               "kvstore_byteps.elastic.State before the training loop)")
        self.commits += 1
        report = self._port.send_first(ServerCommand.BYTEPS_COMMIT,
                                       b"%d\n%s" % (self.commits, state))
        joiners = self._joiners()       # decided at the last commit: they join here
        self._report = report
        if joiners:
            log.warning("node(s) %s join the job at this commit (%d)", joiners, self.commits)
            settle()
            for hook in self.hooks:
                hook()
            if handover is not None and self._port.leads():
                self._ask_first(ServerCommand.BYTEPS_HANDOVER,
                                b"%d\n%s" % (self.commits, handover()),
                                "leaving the parameters for the joining workers")
            self._port.join_barrier(self._port.timeout, joiners)    # every round answered
            self._port.join_barrier(self._port.timeout, joiners)    # the late ones are in
        return joiners

    def _joiners(self) -> List[int]:
        """Who joins now: the answer to the last commit's report (none before the first)."""
        report, self._report = self._report, None
        if report is None:
            return []
        answer = self._port.answer(report, "reporting a commit")
        return [int(j) for j in bytes(answer).split(b",") if j]

    def finish(self) -> None:
        """The program commits no more: the last report's answer is read (nobody can join
        after the last commit; a late worker waiting is stopped with the job)."""
        if self._report is not None:
            try:
                self._joiners()
            except KVStoreBytePSError as exc:     # the job ends anyway
                log.debug("the last commit's report was not answered: %s", exc)

    def _ask_first(self, head: ServerCommand, body: bytes, what: str) -> bytes:
        return self._port.answer(self._port.send_first(head, body), what)

    def join(self, check: Callable[[bool], None] = lambda servers_update: None
             ) -> Tuple[int, bytes, bytes]:
        """A late worker joins at the others' next commit: ``(n, state, handover)``, that
        commit's number and state and the leading worker's parameters (empty where the
        servers hold the weights). ``check(servers_update)`` runs before it enters the
        rounds (an error there leaves it out of the job, which goes on). Blocking:
        DeadlineError if none comes in the timeout; JobFinished where the others finished
        the job first."""
        started = time.monotonic()
        deadline = started + self._port.timeout
        while True:
            answer = bytes(self._ask_first(ServerCommand.BYTEPS_JOIN, b"", "asking to join"))
            if answer:
                break
            if time.monotonic() > deadline:
                raise DeadlineError(
                    "this late worker waited %.0f s (BYTEPS_REQUEST_TIMEOUT) to join, for the "
                    "other workers' next State.commit(): do they call it, every step or "
                    "epoch?" % self._port.timeout)
            time.sleep(ASK_EVERY_S)
        head, updates, ids, state = answer.split(b"\n", 3)
        check(updates == b"1")
        joiners = [int(j) for j in ids.split(b",")]     # (those joining with it too)
        self._port.join_barrier(self._port.timeout, joiners)
        handover = bytes(self._ask_first(ServerCommand.BYTEPS_HANDOVER, head,
                                         "reading the parameters left for it"))
        self._port.tell_all(ServerCommand.BYTEPS_ADMIT, b"", "joining the rounds")
        self._port.join_barrier(self._port.timeout, joiners)
        self.joining = False
        self.commits = int(head)
        # its own report of the commit it joins at: whoever joins at the next, it learns too
        self._report = self._port.send_first(ServerCommand.BYTEPS_COMMIT,
                                             b"%d\n%s" % (self.commits, state))
        log.warning(JOINED_LINE + " %d (%s), %.1f s after asking, %s", self.commits,
                    state.decode("utf-8", "replace")[:80], time.monotonic() - started, uptime())
        return self.commits, state, handover
