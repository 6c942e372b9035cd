"""Elastic workers' joins, as server rank 0 keeps them (kvstore_byteps/elastic.py is the
workers' side). Pure, thread-safe.

A worker that took a departed one's place (the scheduler seated it, departures.py) asks here
to join (``BYTEPS_JOIN``), and asks again until it is answered. Every worker still training
calls ``State.commit()`` at the same points of its loop, the n-th time at the same step on
every worker (synchronous training keeps them in step); each commit reports here
(``BYTEPS_COMMIT``, body ``n`` and the worker's state, JSON). The first report of commit n
decides who joins there: the workers waiting then. Every report of commit n gets that same
answer, so every worker learns the same joiners at the same step; those then finish their
step's rounds, and pass the ``join`` barrier with the joiners, which are answered commit n's
number and state (the first report's) and meanwhile told every server to take them into the
rounds (``BYTEPS_ADMIT``): from the next round on, they push and pull like the others.
"""
import json
import threading
from typing import Callable, Dict, Set, Tuple

from ..errors import ProtocolError
from ..mxproto import ServerCommand

__all__ = ["JOIN_COMMANDS", "JoinBoard"]

#: the commands of elastic workers' joins
JOIN_COMMANDS = (ServerCommand.BYTEPS_COMMIT, ServerCommand.BYTEPS_JOIN,
                 ServerCommand.BYTEPS_ADMIT)

#: how many commits' decisions are kept (a slow worker's report may come a few commits late)
KEPT_COMMITS = 8


class JoinBoard:
    """Who waits to join, and who joins at which commit, with the state it resumes from."""

    def __init__(self):
        self._lock = threading.Lock()
        self._waiting: Set[int] = set()
        self._decided: Dict[int, Tuple[int, ...]] = {}    # commit -> who joins there
        self._states: Dict[int, bytes] = {}               # commit -> the state committed

    def handle(self, head: ServerCommand, sender: int, body: bytes,
               admit: Callable[[int], None]) -> bytes:
        """One of :data:`JOIN_COMMANDS` from worker ``sender``: its answer's body.
        ``admit(sender)`` takes the late worker into every key's rounds (BYTEPS_ADMIT)."""
        if head == ServerCommand.BYTEPS_COMMIT:
            return self.commit(sender, body)
        if head == ServerCommand.BYTEPS_JOIN:
            return self.join(sender)
        admit(sender)
        return b""

    def commit(self, sender: int, body: bytes) -> bytes:
        """A worker's report of its commit (``b"<n>\\n<state JSON>"``): answered with who
        joins at it, ``b"<id>,<id>"`` (empty: nobody)."""
        head, _, state = bytes(body).partition(b"\n")
        try:
            n = int(head)
            json.loads(state or b"{}")
        except ValueError as exc:
            raise ProtocolError("node %d reported a commit that is no number and JSON state: "
                                "%r" % (sender, bytes(body[:80]))) from exc
        with self._lock:
            joiners = self._decided.get(n)
            if joiners is None:
                joiners = self._decided[n] = tuple(sorted(self._waiting))
                self._waiting.clear()
                for old in [c for c in self._decided if c <= n - KEPT_COMMITS]:
                    del self._decided[old]
                    self._states.pop(old, None)
            self._states.setdefault(n, state)
        return b",".join(b"%d" % j for j in joiners)

    def join(self, sender: int) -> bytes:
        """A joining worker's ask: ``b"<n>\\n<state JSON>"`` once the others decided at
        commit n that it joins; empty while it waits (it asks again)."""
        with self._lock:
            for n, joiners in self._decided.items():
                if sender in joiners and n in self._states:
                    return b"%d\n%s" % (n, self._states[n])
            self._waiting.add(sender)
            return b""
