"""Elastic workers on the scheduler (``BYTEPS_MIN_WORKERS``): which lost workers leave the job
while it goes on, and when a loss ends it. Pure.

A worker the scheduler declares dead (no heartbeat within ``PS_HEARTBEAT_TIMEOUT``) leaves the
job if at least ``min_workers`` workers are left without it: the scheduler tells every node
(a HEARTBEAT with the ``worker_left`` extension), barriers stop counting it, the servers close
the rounds that waited only for it. Otherwise the loss ends the job as it always did, and the
reason names every worker lost. Servers are never elastic: a lost server ends the job (or is
restored, ``BYTEPS_SERVER_RECOVERY``, outside elastic jobs).
"""
from typing import Dict, List

from ...config import Role
from ..wire.message import Node

__all__ = ["Departures"]


class Departures:
    """The workers that left an elastic job, and the rule that lets one more leave."""

    def __init__(self, num_workers: int, min_workers: int = 0):
        self.num_workers, self.min_workers = num_workers, min_workers
        self.left: Dict[int, Node] = {}     # node id -> the worker that left

    def may_leave(self, node: Node) -> bool:
        """Whether ``node``, lost, leaves the job and it goes on: a worker of an elastic job
        that keeps ``min_workers`` workers without it."""
        return (self.min_workers > 0 and node.role is Role.WORKER and node.id not in self.left
                and self.num_workers - len(self.left) - 1 >= self.min_workers)

    def leave(self, node: Node) -> None:
        self.left[node.id] = node

    def present(self, ids: List[int]) -> List[int]:
        """``ids`` without the workers that left."""
        return [i for i in ids if i not in self.left]

    def why_the_job_ends(self, node: Node, reason: str) -> str:
        """The dead-node reason for ``node``, naming the workers that left before it when
        its loss leaves fewer than ``min_workers``."""
        if self.min_workers <= 0 or node.role is not Role.WORKER:
            return reason
        before = ", ".join(n.describe_rank() for n in self.left.values())
        return ("%s; %d of %d workers would be left, fewer than BYTEPS_MIN_WORKERS=%d%s"
                % (reason, self.num_workers - len(self.left) - 1, self.num_workers,
                   self.min_workers, " (left before: %s)" % before if before else ""))
