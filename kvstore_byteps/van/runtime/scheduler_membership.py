"""The scheduler's side of cluster membership (the rules: membership.py): it numbers the nodes
as they register, counts barriers, answers and watches heartbeats, declares silent nodes dead,
passes a node's reason to end the job on to every node, gives a restarted server the id of the
one it replaces and, in elastic jobs, a late worker a seat (departures.py). Pure: ``handle``
and ``tick`` answer with membership's actions, which the postoffice carries out."""
import dataclasses
from typing import Dict, List, Optional, Tuple

from ...config import Role
from ...errors import ClusterStartError, JobAbortedError
from .barriers import BarrierBook, base_kind, known_kind
from .departures import ARRIVAL_WAIT_S, Departures
from .membership import (Connect, Fail, NodeDead, NodeJoined, NodeLeft, NodeRecovered, Ready,
                         Refused, ReleaseBarrier, Send, VanClock, control_message,
                         group_members, on_terminate)
from .numbering import assign_ids
from ..wire.message import (K_EMPTY, SCHEDULER_ID, SERVER_GROUP, WORKER_GROUP, ControlCommand,
                            Message, Node, id_to_rank, role_of_id)

#: how long the scheduler stays up after passing on a node's reason to end the job
ABORT_GRACE_S = 1.0


class SchedulerMembership:
    """The scheduler's side. ``my_node`` is the scheduler (id 1, ROOT_URI, ROOT_PORT)."""

    def __init__(self, my_node: Node, num_workers: int, num_servers: int,
                 start_deadline: float, clock: Optional[VanClock] = None,
                 heartbeat_timeout: float = 0.0, min_workers: int = 0, seats: int = 0):
        self.my_node = dataclasses.replace(my_node, id=SCHEDULER_ID)
        #: elastic workers (BYTEPS_MIN_WORKERS): the workers that left, the rule for leaving;
        #: its seats (BYTEPS_MAX_WORKERS) the most workers the job grows to
        self.departures = Departures(num_workers, min_workers, seats)
        self.heartbeat_timeout = heartbeat_timeout
        self.dead: Dict[int, Node] = {}
        self.num_workers, self.num_servers = num_workers, num_servers
        self.start_deadline = start_deadline
        self.clock = clock or VanClock()
        self.pending: List[Node] = []
        self.nodes: List[Node] = []
        self.ready = False
        self.barriers = BarrierBook()
        self.last_heartbeat: Dict[int, float] = {}
        self.replacements: List[Tuple[Node, float]] = []   # restarted servers, since when
        self.epochs: Dict[int, int] = {}     # node id -> how many times it was restarted
        self.aborting: Optional[Tuple[JobAbortedError, float]] = None   # (why, stop when)

    def start(self, now: float) -> List:
        """The scheduler's DEALER to itself (identity ps1)."""
        return [Connect(self.my_node)]

    def handle(self, msg: Message, now: float) -> List:
        cmd = msg.meta.control.cmd
        if cmd == ControlCommand.ADD_NODE:
            return self._on_add_node(msg, now)
        if cmd == ControlCommand.BARRIER and msg.meta.request:
            return self._on_barrier(msg)
        if cmd == ControlCommand.BARRIER:
            return [ReleaseBarrier(msg.meta.app_id)]
        if cmd == ControlCommand.HEARTBEAT and (msg.meta.extra or {}).get("abort"):
            return self._on_abort(msg, now)
        if cmd == ControlCommand.HEARTBEAT:
            return self._on_heartbeat(msg, now)
        if cmd == ControlCommand.TERMINATE:
            return on_terminate(msg, self.my_node)
        return []

    def tick(self, now: float) -> List:
        if not self.ready and now > self.start_deadline:
            return [Fail(ClusterStartError(self.describe_missing()))]
        if self.aborting is not None and now >= self.aborting[1]:
            return [Fail(self.aborting[0])]
        actions: List = self._place_replacements(now) if self.replacements else []
        for node_id in self.dead_nodes(now, self.heartbeat_timeout):
            if node_id in self.dead:
                continue
            node = self._node(node_id)
            reason = ("no heartbeat for %.0f s (PS_HEARTBEAT_TIMEOUT on the scheduler)"
                      % (now - self.last_heartbeat[node_id]))
            if self.departures.may_leave(node):
                actions += self._leave(node, reason)
                continue
            self.dead[node_id] = node
            actions += self._tell_everyone(node, "dead_node")
            actions.append(NodeDead(node, self.departures.why_the_job_ends(node, reason)))
        if self.departures.arrivals and self.ready:   # (after the departures just noticed)
            actions += self._place_arrivals(now)
        return actions

    def peer_closed(self, node_id: int, now: float) -> List:
        """A node's connection to the scheduler closed (byteps_tcp; ZeroMQ does not say). A
        worker of an elastic job that is not leaving (its shutdown barrier) is lost at once,
        and leaves if enough workers are left; else the heartbeats decide, as before."""
        if (not self.ready or node_id in self.dead or node_id not in self.last_heartbeat
                or self.barriers.leaving(node_id)):
            return []
        node = self._node(node_id)
        reason = "its connection to the scheduler closed"
        if self.departures.may_leave(node):
            return self._leave(node, reason)
        if self.departures.min_workers <= 0 or node.role is not Role.WORKER:
            return []
        # an elastic job that cannot do without it ends now, not at the heartbeat timeout
        self.dead[node_id] = node
        return self._tell_everyone(node, "dead_node") + [
            NodeDead(node, self.departures.why_the_job_ends(node, reason))]

    def _members(self, group: int, kind: str = "") -> List[int]:
        """The ids of ``group``'s nodes, without the workers that left (elastic workers), nor
        those joining but in the ``join`` barrier (``kind``)."""
        return self.departures.present(group_members(group, self.departures.seats,
                                                     self.num_servers), kind)

    def _in_job(self) -> List[int]:
        """Every server and worker still in the job, joining workers too: who hears notices."""
        return self._members(WORKER_GROUP | SERVER_GROUP, "join")

    def _tell_everyone(self, node: Node, notice_field: str) -> List:
        """A notice about ``node`` (a HEARTBEAT with ``notice_field`` set) to every node
        still in the job."""
        notice = control_message(ControlCommand.HEARTBEAT, K_EMPTY, nodes=[node])
        notice.meta.extra = {notice_field: True}
        return [Send(dataclasses.replace(notice, meta=dataclasses.replace(
                    notice.meta, recver=other, timestamp=self.clock.tick())))
                for other in self._in_job() if other not in self.dead and other != node.id]

    def _leave(self, node: Node, reason: str) -> List:
        """Elastic workers: the lost worker ``node`` leaves; everyone is told, and the barriers
        that waited only for it are released."""
        self.departures.leave(node)
        self.last_heartbeat.pop(node.id, None)
        actions = self._tell_everyone(node, "worker_left")
        actions.append(NodeLeft(node, reason, len(self._members(WORKER_GROUP))))
        return actions + self._barrier_releases(self.barriers.recheck(self._members))

    def _node(self, node_id: int) -> Node:
        for node in self.nodes:
            if node.id == node_id:
                return node
        return Node(role_of_id(node_id), node_id)

    def describe_missing(self) -> str:
        have = {Role.WORKER: 0, Role.SERVER: 0}
        for node in self.pending:
            have[node.role] += 1
        parts = []
        for role, want in ((Role.WORKER, self.num_workers), (Role.SERVER, self.num_servers)):
            if have[role] < want:
                parts.append("%d of %d %ss" % (want - have[role], want, role.name.lower()))
        return ("scheduler at %s: cluster incomplete, missing %s (registered: %s)"
                % (self.my_node.address, " and ".join(parts) or "nothing",
                   ", ".join(n.describe() for n in self.pending) or "none"))

    def _on_add_node(self, msg: Message, now: float) -> List:
        if msg.meta.sender != K_EMPTY:
            return []       # upstream: only anonymous ADD_NODEs register
        if self.ready:
            return self._on_late_add_node(msg, now)
        if self.departures.waits_for_a_seat(msg.meta.control.nodes, now):
            return []       # (it asked for a rank beyond DMLC_NUM_WORKER: a growing job's)
        self.pending += [n for n in msg.meta.control.nodes if n.role != Role.SCHEDULER]
        if len(self.pending) < self.num_workers + self.num_servers:
            return []
        self.nodes = assign_ids(self.pending)
        announced = self.nodes + [self.my_node]
        actions: List = [Connect(node) for node in self.nodes]
        for node_id in group_members(WORKER_GROUP | SERVER_GROUP, self.num_workers,
                                     self.num_servers):
            actions.append(Send(control_message(ControlCommand.ADD_NODE, node_id, self.clock.tick(),
                                                nodes=announced)))
        self.ready = True
        for node in self.nodes:     # our nodes say they heartbeat: watched from now on
            if node.heartbeat_ms:
                self.last_heartbeat.setdefault(node.id, now)
        actions.append(Ready(self.my_node, announced))
        return actions

    # -- recovery of a restarted server -------------------------------------------------------
    def _on_late_add_node(self, msg: Message, now: float) -> List:
        nodes = msg.meta.control.nodes
        node = nodes[0] if len(nodes) == 1 else None
        if node is not None and node.role == Role.WORKER and self.departures.min_workers > 0:
            return self._on_late_worker(node, now)
        if node is None or node.role != Role.SERVER:
            return [Refused("ignored an ADD_NODE after the cluster formed (%s): only a restarted "
                            "server, or a worker of an elastic job (BYTEPS_MIN_WORKERS), may "
                            "join late" % ", ".join(n.describe() for n in nodes))]
        if not node.heartbeat_ms:
            return [Refused("ignored the restarted server at %s: it does not heartbeat, so it "
                            "is not a kvstore-byteps server (upstream MXNet servers cannot "
                            "rejoin)" % node.address)]
        upstream = [n.describe() for n in self.nodes if n.role == Role.WORKER
                    and not n.heartbeat_ms]
        if upstream:
            return [Refused("ignored the restarted server at %s: upstream MXNet workers (%s) "
                            "kept their weights on the server that died; they cannot restore "
                            "it" % (node.address, ", ".join(upstream)))]
        self.replacements = [(n, t) for n, t in self.replacements if n.address != node.address]
        self.replacements.append((node, now))
        return self._place_replacements(now)

    def _place_replacements(self, now: float) -> List:
        """Give each waiting restarted server the id of the server it replaces: the one at its
        address (that process cannot be alive: the port is taken), else the server silent
        longest once it missed two heartbeats. One waits at most the heartbeat timeout."""
        actions: List = []
        waiting, self.replacements = self.replacements, []
        for node, since in waiting:
            old = self._replaced_server(node, now)
            if old is not None:
                actions += self._recover(old, node, now)
            elif now - since > max(self.heartbeat_timeout, 1.0):
                actions.append(Refused("ignored the restarted server at %s: no server fell "
                                       "silent within %.0f s, so it replaces none"
                                       % (node.address, now - since)))
            else:
                self.replacements.append((node, since))
        return actions

    def _replaced_server(self, node: Node, now: float) -> Optional[Node]:
        servers = [n for n in self.nodes if n.role == Role.SERVER and n.id not in self.dead]
        for server in servers:
            if server.address == node.address:
                return server
        silent = [(self.last_heartbeat[s.id], s) for s in servers
                  if s.heartbeat_ms and s.id in self.last_heartbeat
                  and now - self.last_heartbeat[s.id] > 2 * s.heartbeat_ms / 1000.0]
        return min(silent, key=lambda pair: pair[0])[1] if silent else None

    def _recover(self, old: Node, node: Node, now: float) -> List:
        epoch = self.epochs[old.id] = self.epochs.get(old.id, 0) + 1
        new = dataclasses.replace(node, id=old.id, is_recovery=True)
        self.nodes = [new if n.id == old.id else n for n in self.nodes]
        self.last_heartbeat[old.id] = now
        actions: List = [Connect(new)]
        for other in self._members(WORKER_GROUP | SERVER_GROUP):
            if other in self.dead:
                continue
            nodes = self.nodes + [self.my_node] if other == old.id else [new]
            notice = control_message(ControlCommand.ADD_NODE, other, self.clock.tick(),
                                     nodes=nodes)
            notice.meta.extra = {"epoch": epoch}
            actions.append(Send(notice))
        actions.append(NodeRecovered(new, epoch))
        return actions

    # -- elastic workers: a late worker takes a departed one's place ------------------------
    def _on_late_worker(self, node: Node, now: float) -> List:
        if not node.heartbeat_ms:
            return [Refused("ignored the late worker at %s: it does not heartbeat, so it is "
                            "not a kvstore-byteps worker (upstream MXNet workers cannot join a "
                            "running job)" % node.address)]
        arrivals = self.departures.arrivals
        arrivals[:] = [(n, t) for n, t in arrivals if n.address != node.address]
        arrivals.append((node, now))
        return self._place_arrivals(now)

    def _place_arrivals(self, now: float) -> List:
        """Seat each late worker (a departed one's place, or a vacant seat); one that finds
        none within the heartbeat timeout + ARRIVAL_WAIT_S is turned away."""
        actions: List = []
        waiting, self.departures.arrivals = self.departures.arrivals, []
        for node, since in waiting:
            if self.barriers.ended:     # the workers are leaving: no seat to take
                actions += self._turn_away(node, "the job is finishing (its workers passed "
                                                 "their shutdown barrier)")
                continue
            node_id = self.departures.seat(node)
            if node_id is not None:
                actions += self._seat(node, node_id, now)
            elif now - since > self.heartbeat_timeout + ARRIVAL_WAIT_S:
                actions += self._turn_away(node, self.departures.describe_full())
            else:
                self.departures.arrivals.append((node, since))
        return actions

    def _turn_away(self, node: Node, reason: str) -> List:
        """A late worker with no seat is told why (``reason``) now, under an id no seat has."""
        why = "the scheduler turned away the late worker at %s: %s" % (node.address, reason)
        stranger = self.departures.stranger_id()
        return [Connect(dataclasses.replace(node, id=stranger)),
                Send(self._abort_notice(stranger, why)), Refused(why)]

    def _seat(self, node: Node, node_id: int, now: float) -> List:
        """``node`` takes seat ``node_id`` (a departed worker's, or vacant): it gets the node
        list and the notices of the departures; every other node hears of it and connects."""
        new = dataclasses.replace(node, id=node_id, is_recovery=True)
        vacant = all(n.id != node_id for n in self.nodes)       # (a growing job's seat)
        self.nodes = [new if n.id == node_id else n for n in self.nodes] + [new] * vacant
        self.last_heartbeat[node_id] = now
        actions: List = []
        for other in self._in_job():    # first: they know it before it can ask them anything
            if other not in self.dead and other != node_id:
                notice = control_message(ControlCommand.ADD_NODE, other, self.clock.tick(),
                                         nodes=[new])
                notice.meta.extra = {"worker_joined": True}
                actions.append(Send(notice))
        welcome = control_message(ControlCommand.ADD_NODE, node_id, self.clock.tick(),
                                  nodes=self.nodes + [self.my_node])
        welcome.meta.extra = {"worker_joined": True}
        actions += [Connect(new), Send(welcome)]
        for gone in self.departures.left.values():
            notice = control_message(ControlCommand.HEARTBEAT, node_id, self.clock.tick(),
                                     nodes=[gone])
            notice.meta.extra = {"worker_left": True}
            actions.append(Send(notice))
        return actions + [NodeJoined(new)]

    def _on_barrier(self, msg: Message) -> List:
        """A barrier request: counted by group and kind (:mod:`.barriers`)."""
        group = msg.meta.control.barrier_group
        sender = msg.meta.sender
        kind = str((msg.meta.extra or {}).get("barrier_kind", ""))
        if not known_kind(kind):
            return [Refused("ignored a barrier request of an unknown kind %r from node %s"
                            % (kind, sender))]
        members = self._members(group, kind)
        if sender not in members:
            # a stranger (or a forged id) must not complete anyone's barrier
            return [Refused("ignored a barrier request of group %d from node %s, which is not "
                            "one of its members %s" % (group, sender, members))]
        if base_kind(kind) == "join":   # a joining worker: a member like the others from here
            self.departures.joined(sender)
        return self._barrier_releases(self.barriers.arrive(
            group, kind, sender, (msg.meta.app_id, msg.meta.customer_id), self._members))

    def _barrier_releases(self, releases) -> List:
        actions: List = [Send(control_message(ControlCommand.BARRIER, node, self.clock.tick(),
                                              barrier_group=released, app_id=app_id,
                                              customer_id=customer_id))
                         for node, released, (app_id, customer_id) in releases]
        return actions + (self._send_off_joiners() if self.barriers.ended else [])

    def _send_off_joiners(self) -> List:
        """The workers passed their shutdown barrier: each late worker that has not joined is
        told that the job finished without it (it would ask to join until its heartbeats went
        unanswered), and leaves."""
        actions: List = []
        for node_id in list(self.departures.joining):
            why = ("the other workers finished the job before worker rank %d joined it (they "
                   "passed their shutdown barrier while it waited for their next "
                   "State.commit())" % id_to_rank(node_id))
            notice = self._abort_notice(node_id, why)
            notice.meta.extra["job_finished"] = True
            self.departures.leave(self._node(node_id))
            self.last_heartbeat.pop(node_id, None)
            actions.append(Send(notice))      # (it says so: one line, where it runs)
        return actions

    def _on_abort(self, msg: Message, now: float) -> List:
        """A node ends the job: tell every node why, then stop (after ABORT_GRACE_S)."""
        sender = msg.meta.sender
        if sender not in {node.id for node in self.nodes}:
            return [Refused("ignored a request to end the job from node %s, which is not a node "
                            "of the cluster" % sender)]
        if sender in self.departures.left or sender in self.departures.joining:
            return [Refused("ignored a request to end the job from node %s, which %s the job "
                            "(BYTEPS_MIN_WORKERS): %s"
                            % (sender, "left" if sender in self.departures.left
                               else "had not joined", msg.meta.extra["abort"]))]
        if self.aborting is not None:
            return []
        reason = str(msg.meta.extra["abort"])
        error = JobAbortedError("%s ended the job: %s" % (self._node(sender).describe_rank(),
                                                          reason),
                                int(msg.meta.extra.get("abort_status") or 1))
        self.aborting = (error, now + ABORT_GRACE_S)
        actions: List = []
        for node_id in self._in_job():
            if node_id not in self.dead:
                actions.append(Send(self._abort_notice(node_id, str(error), error.status)))
        return actions + [Refused(str(error))]

    def _abort_notice(self, node_id: int, why: str, status: int = 1) -> Message:
        """The notice that ends node ``node_id``'s part in the job with ``why``; the nodes exit
        with ``status``."""
        notice = control_message(ControlCommand.HEARTBEAT, node_id, self.clock.tick(),
                                 nodes=[self.my_node])
        notice.meta.extra = {"abort": why}
        if status != 1:
            notice.meta.extra["abort_status"] = status
        return notice

    def start_failed(self, node: Node, reason: str) -> List[Tuple[Node, Message]]:
        """The cluster was about to form but ``node`` could not be reached (``reason``): for
        each node that registered, the notice that ends its start with the reason, so that
        it stops now instead of waiting out BYTEPS_START_TIMEOUT for a node list that never
        comes (asked only while the cluster forms)."""
        # (the reason is the scheduler's own words: its "this node" is the scheduler, and it
        # names the node and the address it failed at)
        why = ("the job cannot start: the scheduler could not connect to %s rank %d: %s"
               % (node.role.name.lower(), id_to_rank(node.id),
                  reason.replace("this node", "the scheduler")))
        return [(other, self._abort_notice(other.id, why)) for other in self.nodes]

    def _on_heartbeat(self, msg: Message, now: float) -> List:
        replies = []
        members = {node.id for node in self.nodes}
        for node in msg.meta.control.nodes:
            if node.id != msg.meta.sender or node.id not in members:
                return [Refused("ignored a heartbeat from node %s for node %s: only a node of "
                                "the cluster heartbeats, for itself" % (msg.meta.sender, node.id))]
            if node.id in self.epochs and node.address != self._node(node.id).address:
                # the process a restarted server replaced: it only seemed dead. Unanswered, it
                # declares the scheduler dead and stops.
                return [Refused("ignored a heartbeat from %s: node %d is the restarted server "
                                "at %s now" % (node.address, node.id,
                                               self._node(node.id).address))]
            if node.id in self.departures.left:     # it lived on: it is told, and stops
                notice = control_message(ControlCommand.HEARTBEAT, node.id, self.clock.tick(),
                                         nodes=[node])
                notice.meta.extra = {"worker_left": True}
                replies.append(Send(notice))
                continue
            if node.id in self.dead:   # too late
                continue
            self.last_heartbeat[node.id] = now
            replies.append(Send(control_message(ControlCommand.HEARTBEAT, node.id, self.clock.tick(),
                                                nodes=[self.my_node])))
        return replies

    def dead_nodes(self, now: float, timeout: float) -> List[int]:
        """Ids whose last heartbeat is older than ``timeout`` seconds (0 disables)."""
        if timeout <= 0:
            return []
        return [i for i, t in self.last_heartbeat.items() if now - t > timeout]


__all__ = ["ABORT_GRACE_S", "SchedulerMembership"]
