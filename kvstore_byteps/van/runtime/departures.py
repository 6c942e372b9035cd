"""Elastic workers on the scheduler (``BYTEPS_MIN_WORKERS``): which lost workers leave the job
while it goes on, when a loss ends it, and which worker takes a departed one's place. Pure.

A worker the scheduler declares dead (no heartbeat within ``PS_HEARTBEAT_TIMEOUT``) leaves the
job if at least ``min_workers`` workers are left without it: the scheduler tells every node
(a HEARTBEAT with the ``worker_left`` extension), barriers stop counting it, the servers close
the rounds that waited only for it. Otherwise the loss ends the job as it always did, and the
reason names every worker lost. Servers are never elastic: a lost server ends the job (or is
restored, ``BYTEPS_SERVER_RECOVERY``, outside elastic jobs).

A worker that registers after the cluster formed (a restarted one, ``launch.py
--max-restarts``) takes a departed worker's id: the one of its own rank (``DMLC_WORKER_ID``) if
that one left, else the lowest that left. It is *joining* until the others reach their next
``State.commit()`` (kvstore_byteps/elastic.py) and pass the ``join`` barrier with it: until
then no barrier but that one counts it, and it may leave again without ending the job. A job
grows into its *vacant* seats (``BYTEPS_MAX_WORKERS`` beyond ``DMLC_NUM_WORKER``; they count
as departed from the start): its own rank's seat first if vacant, else a departed place, else
the lowest vacant one. One that finds no seat waits for a departure up to
:data:`ARRIVAL_WAIT_S` beyond the heartbeat timeout (the scheduler may not have noticed the
loss yet), then is turned away and told why.
"""
from typing import Dict, List, Optional, Set, Tuple

from ...config import Role
from ..wire.message import Node, id_to_rank, worker_rank_to_id
from .barriers import joiners_of

__all__ = ["ARRIVAL_WAIT_S", "Departures", "seat_words"]

#: how long a late worker waits for a departure, beyond the heartbeat timeout
ARRIVAL_WAIT_S = 10.0


def seat_words(node_id: int, config) -> str:
    """What the seat of the late worker ``node_id`` is, as messages say it."""
    if id_to_rank(node_id) < config.num_workers:
        return "a departed worker's place"
    return "a new seat (the job grows to BYTEPS_MAX_WORKERS=%d workers)" % config.max_workers


class Departures:
    """The workers that left an elastic job, those taking their places, and the rules."""

    def __init__(self, num_workers: int, min_workers: int = 0, seats: int = 0):
        """``num_workers`` workers formed the job; ``seats`` (BYTEPS_MAX_WORKERS): the most
        it holds at once, the seats beyond ``num_workers`` vacant."""
        self.num_workers, self.min_workers = num_workers, min_workers
        self.seats = max(seats, num_workers)
        #: seats nobody took yet (a growing job's): worker ids
        self.vacant: Set[int] = {worker_rank_to_id(r) for r in range(num_workers, self.seats)}
        self.left: Dict[int, Node] = {}     # node id -> the worker that left
        self.joining: Dict[int, Node] = {}  # node id -> the worker taking that place
        self.arrivals: List[Tuple[Node, float]] = []   # late workers with no place yet, since
        self.late: Set[int] = set()         # ids whose worker took a departed one's place
        self.turned_away = 0                # late workers that found no seat

    def waits_for_a_seat(self, nodes: List[Node], now: float) -> bool:
        """Whether a worker registering while the cluster forms asks for a rank beyond
        ``num_workers`` (a seat of a growing job, started early): it waits, as a late one,
        to be seated once the cluster formed, and the others form it."""
        if (len(nodes) != 1 or nodes[0].role is not Role.WORKER or not self.vacant
                or nodes[0].rank_hint is None or nodes[0].rank_hint < self.num_workers):
            return False
        self.arrivals.append((nodes[0], now))
        return True

    def stranger_id(self) -> int:
        """An id no seat has, to reach a late worker that is turned away under (a new one
        each time)."""
        self.turned_away += 1
        return worker_rank_to_id(self.seats + self.turned_away)

    def may_leave(self, node: Node) -> bool:
        """Whether ``node``, lost, leaves the job and it goes on: a worker of an elastic job
        that keeps ``min_workers`` workers without it (a joining one always may)."""
        if self.min_workers <= 0 or node.role is not Role.WORKER or node.id in self.left:
            return False
        if node.id in self.joining:
            return True
        return self.workers() - 1 >= self.min_workers

    def workers(self) -> int:
        """How many workers are in the job now (those joining not counted)."""
        return self.seats - len(self.vacant) - len(self.left) - len(self.joining)

    def leave(self, node: Node) -> None:
        self.joining.pop(node.id, None)
        self.late.discard(node.id)
        self.left[node.id] = node

    def present(self, ids: List[int], kind: str = "") -> List[int]:
        """``ids`` without the workers that left, nor those joining (but ``join``: all of
        them, and a ``join:<ids>`` barrier: those it names), nor (in a ``declare`` barrier)
        those that took a departed one's place."""
        joining = (frozenset() if kind == "join" else
                   self.joining.keys() - joiners_of(kind) if kind.startswith("join:")
                   else self.joining.keys())
        return [i for i in ids if i not in self.left and i not in self.vacant
                and i not in joining and (kind != "declare" or i not in self.late)]

    def seat(self, node: Node) -> Optional[int]:
        """The id a late worker ``node`` takes: its own rank's (``DMLC_WORKER_ID``) if that
        one left or is vacant, else the lowest that left, else the lowest vacant; None while
        there is none. It is joining from now on."""
        if self.min_workers <= 0 or not (self.left or self.vacant):
            return None
        own = (worker_rank_to_id(node.rank_hint) if node.rank_hint is not None else None)
        if own in self.left or own in self.vacant:
            node_id = own
        else:
            node_id = min(self.left) if self.left else min(self.vacant)
        self.left.pop(node_id, None)
        self.vacant.discard(node_id)
        self.joining[node_id] = node
        self.late.add(node_id)
        return node_id

    def joined(self, node_id: int) -> None:
        """A joining worker reached the ``join`` barrier: a member like the others."""
        self.joining.pop(node_id, None)

    def why_the_job_ends(self, node: Node, reason: str) -> str:
        """The dead-node reason for ``node``, naming the workers that left before it when
        its loss leaves fewer than ``min_workers``."""
        if self.min_workers <= 0 or node.role is not Role.WORKER:
            return reason
        before = ", ".join(n.describe_rank() for n in self.left.values())
        joining = ", ".join("worker rank %d" % id_to_rank(i) for i in self.joining
                            if i != node.id)
        return ("%s; %d of %d workers would be left, fewer than BYTEPS_MIN_WORKERS=%d%s%s"
                % (reason, self.workers() - 1, self.seats - len(self.vacant), self.min_workers,
                   " (left before: %s)" % before if before else "",
                   " (restarting, not joined yet: %s)" % joining if joining else ""))

    def describe_full(self) -> str:
        """Why a late worker with no departed place is refused."""
        if self.seats > self.num_workers:
            return ("all BYTEPS_MAX_WORKERS=%d seats are taken and no worker left the job"
                    % self.seats)
        return ("no worker left the job: a worker that starts late only takes a departed "
                "worker's place (the job does not grow beyond DMLC_NUM_WORKER=%d; "
                "BYTEPS_MAX_WORKERS lets it)" % self.num_workers)
