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
then no barrier but that one counts it, and it may leave again without ending the job. One
that registers while no worker left waits for a departure up to :data:`ARRIVAL_WAIT_S`
beyond the heartbeat timeout (the scheduler may not have noticed the loss yet), then is
refused: a job does not grow beyond ``DMLC_NUM_WORKER`` workers.
"""
from typing import Dict, List, Optional, Set, Tuple

from ...config import Role
from ..wire.message import Node, id_to_rank, worker_rank_to_id

__all__ = ["ARRIVAL_WAIT_S", "Departures"]

#: how long a late worker waits for a departure, beyond the heartbeat timeout
ARRIVAL_WAIT_S = 10.0


class Departures:
    """The workers that left an elastic job, those taking their places, and the rules."""

    def __init__(self, num_workers: int, min_workers: int = 0):
        self.num_workers, self.min_workers = num_workers, min_workers
        self.left: Dict[int, Node] = {}     # node id -> the worker that left
        self.joining: Dict[int, Node] = {}  # node id -> the worker taking that place
        self.arrivals: List[Tuple[Node, float]] = []   # late workers with no place yet, since
        self.late: Set[int] = set()         # ids whose worker took a departed one's place

    def may_leave(self, node: Node) -> bool:
        """Whether ``node``, lost, leaves the job and it goes on: a worker of an elastic job
        that keeps ``min_workers`` workers without it (a joining one always may)."""
        if self.min_workers <= 0 or node.role is not Role.WORKER or node.id in self.left:
            return False
        if node.id in self.joining:
            return True
        return self.num_workers - len(self.left) - len(self.joining) - 1 >= self.min_workers

    def leave(self, node: Node) -> None:
        self.joining.pop(node.id, None)
        self.late.discard(node.id)
        self.left[node.id] = node

    def present(self, ids: List[int], kind: str = "") -> List[int]:
        """``ids`` without the workers that left, nor (but in the ``join`` barrier) those
        joining, nor (in a ``declare`` barrier) those that took a departed one's place."""
        return [i for i in ids if i not in self.left
                and (kind == "join" or i not in self.joining)
                and (kind != "declare" or i not in self.late)]

    def seat(self, node: Node) -> Optional[int]:
        """The id a late worker ``node`` takes: a departed worker's (its own rank's first),
        or None while no worker left. It is joining from now on."""
        if self.min_workers <= 0 or not self.left:
            return None
        own = (worker_rank_to_id(node.rank_hint) if node.rank_hint is not None else None)
        node_id = own if own in self.left else min(self.left)
        del self.left[node_id]
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
                % (reason, self.num_workers - len(self.left) - len(self.joining) - 1,
                   self.num_workers, self.min_workers,
                   " (left before: %s)" % before if before else "",
                   " (restarting, not joined yet: %s)" % joining if joining else ""))

    def describe_full(self) -> str:
        """Why a late worker with no departed place is refused."""
        return ("no worker left the job: a worker that starts late only takes a departed "
                "worker's place (the job does not grow beyond DMLC_NUM_WORKER=%d)"
                % self.num_workers)
