"""The scheduler's count of barriers: who waits in which, and which are complete. Pure.

Barriers are counted per group and kind (:data:`BARRIER_KINDS`): a worker's finish barrier
(``finish_training``) pairs only with the others' finish barriers, its shutdown barrier (its
exit) with their shutdown barriers, and the program's own barriers (``kv._barrier``, the
pairing of ``init``) with each other. A worker that waits in its finish barrier does not hold
the others' own barriers meanwhile, and one that entered its shutdown barrier holds neither
their own nor their finish barriers any more (it is leaving): a straggler whose training a
backup-workers job ended, at exit, would otherwise pair its finish and shutdown barriers with
the barrier the others ended their loop with, and everyone waited. Only workers' barriers
excuse anyone; releases go to the nodes that asked. Upstream nodes send no kind: their
barriers count as the program's own, as ps-lite counts them.

Elastic jobs add two kinds. ``join:<ids>``: the workers and the late workers ``ids`` (node
ids, comma-separated) that join at a ``State.commit()`` pass it together
(kvstore_byteps/elastic.py); ``declare``: their pairing of a key's init. ``members_of(group,
kind)`` names each barrier's members: a joining worker is a member of its own commit's join
barrier only (another one, seated later, joins at a later commit), and one that joined late
of no ``declare`` barrier (it reads the keys the others declared without pairing).
"""
from typing import Dict, Iterable, List, Set, Tuple

from ..wire.message import WORKER_GROUP

__all__ = ["BARRIER_KINDS", "BarrierBook", "base_kind", "join_kind", "joiners_of",
           "known_kind"]

#: a worker's barriers: "" the program's own (kv._barrier, init's pairing); "finish" its
#: finish_training (asynchronous training, backup workers); "shutdown" its exit's; "join"
#: and "declare": elastic jobs' (see the module)
#: elastic jobs' admission of a worker taking a departed one's place
BARRIER_KINDS = ("", "finish", "shutdown", "join", "declare")


def join_kind(joiners) -> str:
    """The kind of the join barrier of the late workers ``joiners`` (node ids)."""
    return "join:" + ",".join(str(j) for j in sorted(joiners))


def base_kind(kind: str) -> str:
    """``join`` for a join barrier's kind, else ``kind``."""
    return kind.split(":", 1)[0]


def joiners_of(kind: str) -> frozenset:
    """The late workers a join barrier's kind names; ValueError if it names no ids."""
    return frozenset(int(j) for j in kind.split(":", 1)[1].split(","))


def known_kind(kind: str) -> bool:
    """Whether a node may wait in a barrier of ``kind`` (a join barrier names its joiners)."""
    if kind.startswith("join:"):
        try:
            return bool(joiners_of(kind))
        except ValueError:
            return False
    return kind in BARRIER_KINDS and kind != "join"


class BarrierBook:
    """Who waits in which barrier (the scheduler's membership holds one)."""

    def __init__(self):
        self._waiting: Dict[Tuple[int, str], Set[int]] = {}      # (group, kind) -> nodes
        self._app: Dict[Tuple[int, str], Tuple[int, int]] = {}   # -> the request's app, customer
        self._leaving: Set[int] = set()     # workers that entered their shutdown barrier
        #: the workers' shutdown barrier passed: every worker in the job is leaving it
        self.ended = False

    def arrive(self, group: int, kind: str, sender: int, app: Tuple[int, int],
               members_of) -> List[Tuple[int, int, Tuple[int, int]]]:
        """``sender`` waits in barrier ``(group, kind)`` (a repeated request counts once);
        ``members_of(group, kind)`` lists a barrier's nodes. The releases due now: ``(node, group,
        (app, customer))``, in each group's order."""
        if kind == "shutdown":
            self._leaving.add(sender)
        self._waiting.setdefault((group, kind), set()).add(sender)
        self._app[(group, kind)] = app
        return self._complete(members_of)

    def leaving(self, node: int) -> bool:
        """Whether ``node`` entered its shutdown barrier (it is about to leave the job)."""
        return node in self._leaving

    def recheck(self, members_of) -> List[Tuple[int, int, Tuple[int, int]]]:
        """The releases due now that ``members_of`` changed (a worker left an elastic job)."""
        return self._complete(members_of)

    def _complete(self, members_of) -> List[Tuple[int, int, Tuple[int, int]]]:
        finishing = set(self._waiting.get((WORKER_GROUP, "finish"), ()))
        excused = {"": finishing | self._leaving, "finish": self._leaving, "shutdown": set(),
                   "join": set(), "declare": finishing | self._leaving}
        releases = []
        for (group, kind), waiting in self._waiting.items():
            members: Iterable[int] = members_of(group, kind)
            passed = waiting | (excused[base_kind(kind)] if group == WORKER_GROUP else set())
            if not waiting or not set(members) <= passed:
                continue
            releases += [(node, group, self._app[(group, kind)])
                         for node in members if node in waiting]
            self.ended = self.ended or (group, kind) == (WORKER_GROUP, "shutdown")
            waiting.clear()
        return releases
