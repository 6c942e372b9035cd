"""Who is in the job, as one node knows it: the node list (a restarted server's or a late
worker's new address replaces the old entry), the ids of the members, the workers that left
an elastic job (and the seats a growing one has not filled yet), and the KV layer's callbacks on each change. The postoffice's receive thread
changes it; other threads read its fields, which are replaced, never changed in place."""
from typing import List

from ...config import Role
from ..wire.message import Node, worker_rank_to_id
from .hooks import Hooks

__all__ = ["Roster"]


class Roster:
    """The job's nodes and their changes (see the module)."""

    def __init__(self):
        self.nodes: List[Node] = []
        self.member_ids: frozenset = frozenset()   # looked up per request: a set
        #: workers that left the job (elastic workers, BYTEPS_MIN_WORKERS)
        self.left: frozenset = frozenset()
        #: workers that took a departed one's place (they set nothing up: never lead)
        self.late: frozenset = frozenset()
        #: ``hook(node, epoch)`` when a restarted server took over ``node.id`` for the
        #: ``epoch``-th time: another node (already connected to; the KV layer recovers what
        #: the dead one held), or this one, as it becomes ready and before any data message
        #: is handed on (register before the postoffice starts)
        self.recovery = Hooks("recovery")
        #: ``hook(node)`` when worker ``node`` left (elastic workers): rounds and waits on it
        #: must stop waiting
        self.departure = Hooks("departure")
        #: ``hook(node)`` when a late worker ``node`` took a departed one's place
        self.arrival = Hooks("arrival")

    def formed(self, nodes: List[Node], seats: int = 0) -> None:
        """The cluster as the scheduler announced it; ``seats``: the most workers a growing
        job has (BYTEPS_MAX_WORKERS), those of the seats not in ``nodes`` vacant (as if
        departed)."""
        self.nodes = list(nodes)
        self.member_ids = frozenset(node.id for node in nodes)
        self.left = frozenset(worker_rank_to_id(r) for r in range(seats)) - self.member_ids

    def claimable(self) -> List[Node]:
        """The nodes whose ids a peer may claim (byteps_tcp checks a connection's claim
        against them), with a stand-in for each vacant seat of a growing job: its late worker
        may connect before this node hears of it (a claim refused then lost its requests)."""
        ids = {node.id for node in self.nodes}
        return self.nodes + [Node(Role.WORKER, i, "", 0) for i in sorted(self.left - ids)]

    def replaced(self, node: Node) -> None:
        """``node`` has its id's entry now (a restarted server, a late worker)."""
        self.nodes = [node if n.id == node.id else n for n in self.nodes]

    def depart(self, node: Node) -> None:
        """Worker ``node`` left: its late requests are dropped; the callbacks run."""
        self.left = self.left | {node.id}
        self.member_ids = self.member_ids - {node.id}
        self.departure.run(node)

    def arrive(self, node: Node) -> None:
        """A late worker ``node`` took a departed one's place; the callbacks run."""
        if any(n.id == node.id for n in self.nodes):
            self.replaced(node)
        else:           # a vacant seat's (a growing job)
            self.nodes = self.nodes + [node]
        self.left = self.left - {node.id}
        self.late = self.late | {node.id}
        self.member_ids = self.member_ids | {node.id}
        self.arrival.run(node)
