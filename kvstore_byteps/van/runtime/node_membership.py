"""A server's or worker's side of cluster membership (the rules: membership.py): it registers
with the scheduler, adopts the id the scheduler's node list gives it, connects to its peers,
forwards its barriers, heartbeats and watches the scheduler's answers, and follows the
scheduler's notices (a dead node, a restarted server, the end of the job). Pure:
``handle(message, now)`` and ``tick(now)`` answer with membership's actions, which the
postoffice carries out.
"""
import dataclasses
from typing import List, Optional, Tuple

from ...config import Role
from ...errors import EXIT_LEFT, ClusterStartError, JobAbortedError, JobFinished
from .membership import (Connect, Fail, NodeDead, NodeJoined, NodeLeft, NodeRecovered, Ready,
                         Refused, ReleaseBarrier, Send, VanClock, barrier_request,
                         control_message, on_terminate)
from ..wire.message import SCHEDULER_ID, ControlCommand, Message, Node


class NodeMembership:
    """A server's or worker's side. ``my_node`` has no id yet; ``scheduler`` is id 1."""

    def __init__(self, my_node: Node, scheduler: Node, start_deadline: float,
                 heartbeat_interval: float = 0.0, clock: Optional[VanClock] = None,
                 heartbeat_timeout: float = 0.0, elastic: bool = False):
        """``elastic``: a worker of an elastic job (BYTEPS_MIN_WORKERS), which leaves when it
        loses the scheduler (its own link may be down: the job goes on without it)."""
        if heartbeat_interval > 0:    # announced in ADD_NODE: the scheduler may watch us
            my_node = dataclasses.replace(my_node, heartbeat_ms=int(heartbeat_interval * 1000))
        self.my_node = my_node
        self.heartbeat_timeout = heartbeat_timeout
        self.elastic = elastic and my_node.role is Role.WORKER
        self.scheduler = dataclasses.replace(scheduler, id=SCHEDULER_ID, role=Role.SCHEDULER)
        self.start_deadline = start_deadline
        self.heartbeat_interval = heartbeat_interval
        self.clock = clock or VanClock()
        self.ready = False
        self.nodes: List[Node] = []
        self.next_heartbeat = float("inf")
        self.last_heartbeat_reply: Optional[float] = None
        self.last_tick: Optional[float] = None      # when tick last ran (a stall shows)
        #: workers that left the job (elastic workers), as the scheduler told
        self.left: List[Node] = []

    def start(self, now: float) -> List:
        request = control_message(ControlCommand.ADD_NODE, SCHEDULER_ID, self.clock.tick(),
                                  nodes=[self.my_node])
        return [Connect(self.scheduler, anonymous=True), Send(request)]

    def start_failed(self, node: Node, reason: str) -> List[Tuple[Node, Message]]:
        """A node that cannot reach a peer has nobody to tell (only the scheduler forms the
        cluster): no notices."""
        return []

    def handle(self, msg: Message, now: float) -> List:
        cmd = msg.meta.control.cmd
        if cmd == ControlCommand.ADD_NODE:
            if not self.ready:
                return self._on_add_node_reply(msg, now)
            return self._on_recovery_notice(msg)
        if cmd == ControlCommand.BARRIER and not msg.meta.request:
            return [ReleaseBarrier(msg.meta.app_id)]
        if cmd == ControlCommand.BARRIER:
            if msg.meta.sender != self.my_node.id or not self.ready:
                return [Refused("ignored a barrier request from node %s: only the scheduler "
                                "counts barriers" % msg.meta.sender)]
            return [Send(barrier_request(msg.meta.control.barrier_group, msg.meta.customer_id,
                                         self.clock,
                                         str((msg.meta.extra or {}).get("barrier_kind", ""))))]
        if cmd == ControlCommand.HEARTBEAT and (msg.meta.extra or {}).get("abort"):
            if msg.meta.sender != SCHEDULER_ID:
                return [Refused("ignored a notice to end the job from node %s: only the "
                                "scheduler passes those on" % msg.meta.sender)]
            if not self.ready:      # its start failed: the job cannot start, or is full
                return [Fail(ClusterStartError(str(msg.meta.extra["abort"])))]
            kind = JobFinished if msg.meta.extra.get("job_finished") else JobAbortedError
            return [Fail(kind(str(msg.meta.extra["abort"]),
                              int(msg.meta.extra.get("abort_status") or 1)))]
        if cmd == ControlCommand.HEARTBEAT:
            extra = msg.meta.extra or {}
            if extra.get("dead_node") or extra.get("worker_left"):
                if msg.meta.sender != SCHEDULER_ID:
                    return [Refused("ignored a dead-node notice from node %s: only the "
                                    "scheduler declares nodes dead" % msg.meta.sender)]
                return self._on_loss(msg.meta.control.nodes[:1], bool(extra.get("dead_node")))
            self.last_heartbeat_reply = now
            return []
        if cmd == ControlCommand.TERMINATE:
            return on_terminate(msg, self.my_node)
        return []

    def peer_closed(self, node_id: int, now: float) -> List:
        """A peer's connection to this node closed: the scheduler decides what that means."""
        return []

    @property
    def workers(self) -> int:
        """How many workers the cluster was formed with."""
        return len({n.id for n in self.nodes if n.role is Role.WORKER})

    def _on_loss(self, nodes: List[Node], dead: bool) -> List:
        """The scheduler's notice that a node is lost: dead (the job ends), or a worker that
        left an elastic job (it goes on)."""
        if dead:
            left = ", ".join(n.describe_rank() for n in self.left)
            return [NodeDead(node, "the scheduler heard no heartbeat from it%s"
                             % ("; workers that left the job before: " + left if left else ""))
                    for node in nodes]
        actions: List = []
        for node in nodes:
            if node.id == self.my_node.id and self.ready:
                return [self._left("the scheduler took it for lost (no heartbeat within "
                                   "PS_HEARTBEAT_TIMEOUT: it stalled, or its link was down)")]
            if node.id != self.my_node.id and node.id not in {n.id for n in self.left}:
                self.left.append(node)
                actions.append(NodeLeft(node, "lost, the scheduler says",
                                        self.workers - len(self.left)))
        return actions

    def _left(self, why: str) -> Fail:
        """This worker of an elastic job left it (``why``): it stops with EXIT_LEFT, which
        launch.py counts as lost (and restarts with --max-restarts)."""
        return Fail(JobAbortedError(
            "%s left the job, which goes on without it: %s; it stops (launch.py --max-restarts "
            "starts it again, to take its place back)" % (self.my_node.describe_rank(), why),
            EXIT_LEFT))

    def tick(self, now: float) -> List:
        if not self.ready:
            if now > self.start_deadline:
                return [Fail(ClusterStartError(
                    "%s: the scheduler at %s did not answer this node's registration (ADD_NODE) "
                    "before the start-up deadline, BYTEPS_START_TIMEOUT (is the scheduler "
                    "running and reachable, and did every node of the job start?%s)"
                    % (self.my_node.describe(), self.scheduler.address,
                       " A worker started to join an elastic job finds no scheduler once the "
                       "job ended." if self.elastic else "")))]
            return []
        stalled = self.last_tick is not None and now - self.last_tick > self.heartbeat_interval
        self.last_tick = now
        if stalled and self.last_heartbeat_reply is not None and self.heartbeat_interval > 0:
            # this node did not run (stopped, swapped out): the scheduler's silence is its
            # own; it asks again before it takes the scheduler for dead (and hears, if it
            # was taken for lost meanwhile, that it left the job)
            self.last_heartbeat_reply, self.next_heartbeat = now, now
        if (self.heartbeat_timeout > 0 and self.last_heartbeat_reply is not None
                and now - self.last_heartbeat_reply > self.heartbeat_timeout
                and self.heartbeat_interval > 0):
            self.last_heartbeat_reply = None     # reported once
            if self.elastic:    # the scheduler, or this worker's link: the job goes on
                return [self._left("it heard nothing from the scheduler for %.0f s "
                                   "(PS_HEARTBEAT_TIMEOUT: its link may be down)"
                                   % self.heartbeat_timeout)]
            return [NodeDead(self.scheduler, "no answer to this node's heartbeats for %.0f s"
                             % self.heartbeat_timeout)]
        if now < self.next_heartbeat:
            return []
        self.next_heartbeat = now + self.heartbeat_interval
        return [Send(control_message(ControlCommand.HEARTBEAT, SCHEDULER_ID, self.clock.tick(),
                                     nodes=[self.my_node]))]

    def _on_add_node_reply(self, msg: Message, now: float) -> List:
        nodes = msg.meta.control.nodes
        mine = [n for n in nodes if n.hostname == self.my_node.hostname
                and n.port == self.my_node.port and n.role == self.my_node.role]
        if not mine:
            return [Fail(ClusterStartError("%s: the scheduler's node list does not contain "
                                           "this node" % self.my_node.describe()))]
        self.my_node = dataclasses.replace(self.my_node, id=mine[0].id)
        extra = msg.meta.extra or {}
        epoch = int(extra.get("epoch", 0)) if mine[0].is_recovery else 0
        joined = bool(extra.get("worker_joined")) and mine[0].is_recovery
        self.nodes = list(nodes)
        actions: List = []
        connected = set()
        for node in nodes:
            is_peer = node.role != self.my_node.role or node.id == self.my_node.id
            if is_peer and node.address not in connected:
                connected.add(node.address)
                actions.append(Connect(node))
        self.ready = True
        if self.heartbeat_interval > 0:
            self.next_heartbeat = now + self.heartbeat_interval
            self.last_heartbeat_reply = now
        actions.append(Ready(self.my_node, self.nodes, 0 if joined else epoch, joined))
        return actions

    def _on_recovery_notice(self, msg: Message) -> List:
        """The scheduler says a restarted server took over a dead one's id, or a late worker a
        departed one's: reconnect to it."""
        if msg.meta.sender != SCHEDULER_ID:
            return [Refused("ignored an ADD_NODE from node %s: only the scheduler announces "
                            "nodes" % msg.meta.sender)]
        epoch = int((msg.meta.extra or {}).get("epoch", 0))
        joined = bool((msg.meta.extra or {}).get("worker_joined"))
        known = {node.id for node in self.nodes}
        actions: List = []
        for node in msg.meta.control.nodes:
            if (not node.is_recovery or node.id == self.my_node.id
                    or node.id not in known and not joined):
                continue
            if node.id in known:
                self.nodes = [node if n.id == node.id else n for n in self.nodes]
            else:           # a late worker in a vacant seat (a growing job)
                self.nodes = self.nodes + [node]
            if node.role != self.my_node.role:
                actions.append(Connect(node))
            if joined:      # a late worker in a departed one's place (elastic workers)
                self.left = [n for n in self.left if n.id != node.id]
                actions.append(NodeJoined(node))
            else:
                actions.append(NodeRecovered(node, epoch))
        return actions


__all__ = ["NodeMembership"]
