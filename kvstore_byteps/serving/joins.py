"""Elastic workers' joins, as server rank 0 keeps them (kvstore_byteps/elastic.py is the
workers' side). Pure, thread-safe.

A worker that took a departed one's place (the scheduler seated it, departures.py) asks here
to join (``BYTEPS_JOIN``), and asks again until it is answered. Every worker still training
calls ``State.commit()`` at the same points of its loop, the n-th time at the same step on
every worker (synchronous training keeps them in step); each commit reports here
(``BYTEPS_COMMIT``, body ``n`` and the worker's state, JSON) without waiting for the answer,
which it reads at its next commit: a report costs the step no round trip. The first report of
commit m decides who joins: the workers waiting then. Every report of m gets that answer, so
every worker learns the same joiners, at commit m + 1: there they finish their step's rounds
and pass the ``join`` barrier with the joiners, which are answered m + 1 and the state of its
first report, and meanwhile tell every server to take them into the rounds
(``BYTEPS_ADMIT``): from the next round on, they push and pull like the others.

Reports of one commit may come far apart: a program's thread runs ahead of MXNet's engine, by
hundreds of steps where it reads no array (a Horovod-style loop did: commit 1596 on one worker
as another reported 1397). So the board never forgets a decision that somebody joins at (one
per join), and a commit below the highest decided without one was decided for nobody: only
the fastest worker's first report of a new commit decides. Where the workers update (the
servers only sum), the leading worker leaves its parameters and optimizer state here before
the first join barrier (``BYTEPS_HANDOVER``), and the joiners read them after it.
"""
import json
import threading
from typing import Callable, Dict, Set, Tuple

from ..errors import ProtocolError
from ..mxproto import ServerCommand

__all__ = ["JOIN_COMMANDS", "JoinBoard"]

#: the commands of elastic workers' joins
JOIN_COMMANDS = (ServerCommand.BYTEPS_COMMIT, ServerCommand.BYTEPS_JOIN,
                 ServerCommand.BYTEPS_ADMIT, ServerCommand.BYTEPS_HANDOVER)



class JoinBoard:
    """Who waits to join, and who joins at which commit, with the state it resumes from."""

    def __init__(self, servers_update: Callable[[], bool] = lambda: True):
        """``servers_update()``: whether the servers run the optimizer (hold the weights)."""
        self._servers_update = servers_update
        self._lock = threading.Lock()
        self._waiting: Set[int] = set()
        self._highest = -1                                # the highest commit decided
        #: commit m -> who joins at m + 1 (only commits where somebody does)
        self._decided: Dict[int, Tuple[int, ...]] = {}
        self._resume: Dict[int, bytes] = {}       # m + 1 -> its first report's state
        self._handovers: Dict[int, bytes] = {}            # commit -> the leader's parameters
        self._asked: Set[Tuple[int, int]] = set()         # (commit, joiner) that read them
        #: joiner -> the highest commit decided when it first asked: a decision for its id
        #: made before (for an earlier process in its seat, which joined and left) is not its
        self._since: Dict[int, int] = {}

    def handle(self, head: ServerCommand, sender: int, body: bytes,
               admit: Callable[[int], None]) -> bytes:
        """One of :data:`JOIN_COMMANDS` from worker ``sender``: its answer's body.
        ``admit(sender)`` takes the late worker into every key's rounds (BYTEPS_ADMIT)."""
        if head == ServerCommand.BYTEPS_COMMIT:
            return self.commit(sender, body)
        if head == ServerCommand.BYTEPS_JOIN:
            return self.join(sender)
        if head == ServerCommand.BYTEPS_HANDOVER:
            return self.handover(sender, body)
        admit(sender)
        return b""

    def commit(self, sender: int, body: bytes) -> bytes:
        """A worker's report of its commit (``b"<n>\\n<state JSON>"``): answered with who
        joins at its next, ``b"<id>,<id>"`` (empty: nobody)."""
        head, _, state = bytes(body).partition(b"\n")
        try:
            n = int(head)
            json.loads(state or b"{}")
        except ValueError as exc:
            raise ProtocolError("node %d reported a commit that is no number and JSON state: "
                                "%r" % (sender, bytes(body[:80]))) from exc
        with self._lock:
            if n > self._highest:           # the first report of a new commit decides
                self._highest = n
                if self._waiting:
                    self._decided[n] = tuple(sorted(self._waiting))
                    self._waiting.clear()
                if n - 1 in self._decided:  # where they join: the state they resume from
                    self._resume[n] = bytes(state)
            joiners = self._decided.get(n, ())
        return b",".join(b"%d" % j for j in joiners)

    def handover(self, sender: int, body: bytes) -> bytes:
        """``b"<n>\n<bytes>"``: the leading worker's parameters for those joining at commit
        n; ``b"<n>"``: a joiner asks for them, and they are forgotten (empty: none were
        left, the servers hold the weights)."""
        head, newline, blob = bytes(body).partition(b"\n")
        try:
            n = int(head)
        except ValueError as exc:
            raise ProtocolError("node %d sent a hand-over without its commit number"
                                % sender) from exc
        with self._lock:
            if newline:
                self._handovers[n] = blob
                return b""
            joiners = self._decided.get(n - 1, ())
            given = self._handovers.get(n, b"")
            self._asked.add((n, sender))
            if all((n, j) in self._asked for j in joiners):     # every joiner has them
                self._handovers.pop(n, None)
            return given

    def depart(self, sender: int) -> None:
        """Worker ``sender`` left the job: a late worker that had not joined asks no more (a
        decision made for it is not the next process's in its seat)."""
        with self._lock:
            self._waiting.discard(sender)
            self._since.pop(sender, None)

    def join(self, sender: int) -> bytes:
        """A joining worker's ask: ``b"<n>\\n<1|0>\\n<ids>\\n<state JSON>"`` once it joins
        at commit n (decided at n - 1, and somebody reported n), 1 where the servers update,
        with the workers ``ids`` (it among them) that join there; empty while it waits (it
        asks again)."""
        with self._lock:
            since = self._since.setdefault(sender, self._highest)
            for m, joiners in self._decided.items():
                if sender in joiners and m > since:
                    if m + 1 in self._resume:
                        del self._since[sender]     # (a later process in its seat asks anew)
                        return b"%d\n%d\n%s\n%s" % (m + 1, self._servers_update(),
                                                     b",".join(b"%d" % j for j in joiners),
                                                     self._resume[m + 1])
                    return b""
            self._waiting.add(sender)
            return b""
