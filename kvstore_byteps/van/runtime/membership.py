"""Cluster membership as pure state machines: ADD_NODE, BARRIER, HEARTBEAT, TERMINATE.

This module holds what both sides share: the rules below, the actions the machines answer with
and the control messages they build. The scheduler's side is scheduler_membership.py, a
server's or worker's node_membership.py.

Both machines are driven by ``handle(message, now)`` and ``tick(now)`` and answer with a list of
actions (connect to a node, send a message, mark ready, release barriers, stop) that a thin I/O
loop executes. Nothing here touches a socket or sleeps, so every rule is unit-testable.

Rules (docs/pslite-wire.md §3), kept in the order the protocol runs:

* A node registers with an ADD_NODE sent from an identity-less DEALER. The scheduler counts only
  anonymous ADD_NODEs; once ``num_workers + num_servers`` have arrived it sorts them by hostname
  descending, then port ascending, numbers servers 8, 10, ... and workers 9, 11, ..., connects to
  each, and sends the full list (scheduler last) to the workers, then the servers.
* A node adopts the id of the entry matching its own hostname and port, connects to the
  scheduler, itself and the nodes of the other role, and is ready.
* BARRIER: the scheduler keeps a plain counter per group, counts every request (its own too) and,
  when the count reaches the group's size, resets it and answers every member. A node's owning
  thread posts its barrier to its own receive loop (a BARRIER request to itself, as TERMINATE),
  which stamps it and forwards it to the scheduler: control messages leave from one thread.
* HEARTBEAT: nodes send one every interval; the scheduler records the time and answers.
* TERMINATE is only ever sent by a node to itself; receiving it stops the receive loop.
* Ending the job (ours; a HEARTBEAT with the meta extension ``abort``, which upstream nodes take
  for a heartbeat): a node that must end the job sends its reason to the scheduler, which
  passes it on to every node and stops ``ABORT_GRACE_S`` (scheduler_membership.py) later (its
  notices must leave first); a node stops on the scheduler's notice with
  :class:`JobAbortedError` naming who ended the job and why.
* Recovery (ps-lite's ``is_recovery``): an anonymous ADD_NODE from one of our servers after the
  cluster formed is a restarted server. It takes the id of the server at the same host:port, or
  else of the server silent longest once that one missed two heartbeat intervals; it gets the
  full node list, its own entry flagged ``is_recovery`` and the meta's ``epoch`` (how many times
  that id was restarted); every other node gets an ADD_NODE carrying just that entry, and
  reconnects. Our workers then rebuild the server's rounds (serving/recovery.py).
* Elastic workers (departures.py): a lost worker leaves (``worker_left`` notices); a late worker
  takes a departed one's id: its ADD_NODE answer and every other node's notice carry its entry
  with ``worker_joined`` set.
"""
import dataclasses
import threading
from typing import List

from ..wire.message import (K_EMPTY, SCHEDULER_GROUP, SCHEDULER_ID, SERVER_GROUP, WORKER_GROUP,
                            ControlCommand, Control, Message, Meta, Node, server_rank_to_id,
                            worker_rank_to_id)


# ----------------------------------------------------------------------------- actions
@dataclasses.dataclass
class Connect:
    """Open (or re-open) the DEALER to ``node``; ``anonymous`` means no ZMQ identity."""

    node: Node
    anonymous: bool = False


@dataclasses.dataclass
class Send:
    message: Message


@dataclasses.dataclass
class Ready:
    """Membership is complete; ``nodes`` is the cluster as the scheduler announced it.
    ``epoch`` > 0: this node is a restarted server that took over a dead one's id."""

    my_node: Node
    nodes: List[Node]
    epoch: int = 0
    #: this worker took a departed worker's place in a running elastic job
    joined: bool = False


@dataclasses.dataclass
class NodeRecovered:
    """``node``, a restarted server, took over the id of one that died (its ``epoch``-th
    restart): it has been connected to; what the dead one held must be restored."""

    node: Node
    epoch: int


@dataclasses.dataclass
class ReleaseBarrier:
    app_id: int


@dataclasses.dataclass
class Stop:
    """TERMINATE arrived: the receive loop must exit."""


@dataclasses.dataclass
class NodeDead:
    """``node`` is gone (no heartbeat within the timeout): every wait on it must fail now."""

    node: Node
    reason: str


@dataclasses.dataclass
class NodeLeft:
    """``node``, a worker of an elastic job (BYTEPS_MIN_WORKERS), was lost (``reason``) and
    left it; ``workers`` are left. The job goes on: rounds and barriers stop waiting for it."""

    node: Node
    reason: str
    workers: int


@dataclasses.dataclass
class NodeJoined:
    """``node``, a late worker of an elastic job, took a departed worker's id (its address is
    new): connect to it; it takes part in rounds once it passed the ``join`` barrier."""

    node: Node


@dataclasses.dataclass
class Fail:
    """This node cannot go on (the cluster did not form in time, the scheduler's answer is
    unusable): the receive loop stops with ``error``, which start() and every wait raise."""

    error: Exception


@dataclasses.dataclass
class Refused:
    """A control message was refused; ``reason`` is worth a warning in the log."""

    reason: str


#: every action the machines return; the postoffice carries out each by its handler
ACTIONS = (Connect, Send, Ready, NodeRecovered, ReleaseBarrier, Stop, NodeDead, NodeLeft,
           NodeJoined, Fail, Refused)


def on_terminate(msg: Message, me: Node) -> List:
    """TERMINATE is honoured only from this node itself (ps-lite sends it only to itself):
    without authentication, anyone who can reach the port could otherwise stop the node."""
    if msg.meta.sender != me.id:
        return [Refused("ignored a TERMINATE from node %s: a node only stops itself"
                        % ("?" if msg.meta.sender == K_EMPTY else msg.meta.sender))]
    return [Stop()]


# ----------------------------------------------------------------------------- helpers
class VanClock:
    """ps-lite's per-process counter of control-message timestamps. Thread-safe: the receive
    thread (heartbeats, replies) and the owning thread (barrier requests) both tick it, and
    the read-increment-write must not rely on the interpreter happening not to switch threads
    inside it."""

    def __init__(self) -> None:
        self._next = 0
        self._lock = threading.Lock()

    def tick(self) -> int:
        with self._lock:
            value, self._next = self._next, self._next + 1
        return value


def control_message(cmd: ControlCommand, recver: int, timestamp: int = K_EMPTY, nodes=(),
                    barrier_group: int = 0, customer_id: int = K_EMPTY, app_id: int = K_EMPTY,
                    request: bool = False) -> Message:
    """Build a control message with upstream's field conventions."""
    meta = Meta(timestamp=timestamp, customer_id=customer_id, app_id=app_id, request=request,
                recver=recver, control=Control(cmd=cmd, nodes=list(nodes),
                                               barrier_group=barrier_group))
    return Message(meta)


def group_members(group: int, num_workers: int, num_servers: int) -> List[int]:
    """ps-lite's GetNodeIDs: workers, then servers, then the scheduler."""
    ids = []
    if group & WORKER_GROUP:
        ids += [worker_rank_to_id(r) for r in range(num_workers)]
    if group & SERVER_GROUP:
        ids += [server_rank_to_id(r) for r in range(num_servers)]
    if group & SCHEDULER_GROUP:
        ids.append(SCHEDULER_ID)
    return ids


def barrier_request(group: int, customer_id: int, clock: VanClock, kind: str = "",
                    recver: int = SCHEDULER_ID) -> Message:
    """A node's BARRIER request to the scheduler (app 0); ``kind``: barriers.BARRIER_KINDS."""
    message = control_message(ControlCommand.BARRIER, recver, clock.tick(),
                              barrier_group=group, customer_id=customer_id, app_id=0,
                              request=True)
    if kind:
        message.meta.extra = {"barrier_kind": kind}
    return message


def barrier_post(group: int, customer_id: int, my_id: int, clock: VanClock,
                 kind: str = "") -> Message:
    """The barrier request a node's owning thread sends to its own receive loop, which
    forwards it to the scheduler with a timestamp of its own (the scheduler's loop counts it
    directly). It has a timestamp too: PS_RESEND tells messages apart by it, and would drop
    a second post as a duplicate of the first."""
    return barrier_request(group, customer_id, clock, kind, recver=my_id)


def abort_request(reason: str, clock: VanClock, status: int = 1) -> Message:
    """A node's request to the scheduler to end the job, saying why; every node then exits
    with ``status``."""
    message = control_message(ControlCommand.HEARTBEAT, SCHEDULER_ID, clock.tick(), request=True)
    message.meta.extra = {"abort": reason}
    if status != 1:
        message.meta.extra["abort_status"] = status
    return message


def terminate_message(my_id: int) -> Message:
    """The TERMINATE a node sends to itself in Stop (no timestamp, customer 0)."""
    return control_message(ControlCommand.TERMINATE, my_id, customer_id=0)


__all__ = ["Connect", "Send", "Ready", "NodeRecovered", "ReleaseBarrier", "Stop", "NodeDead",
           "NodeLeft", "NodeJoined", "Fail", "Refused", "ACTIONS", "on_terminate", "VanClock", "control_message",
           "group_members", "barrier_request", "barrier_post", "abort_request",
           "terminate_message"]
