"""A scheduler that cannot reach a node as the cluster forms tells the nodes that registered
why, and they stop at once instead of waiting out BYTEPS_START_TIMEOUT (in-memory van: no
sockets)."""
import time

import pytest

from kvstore_byteps.config import Config, Role
from kvstore_byteps.errors import ClusterStartError, ProtocolError
from kvstore_byteps.van.loopback.van import LoopbackNetwork, LoopbackVan
from kvstore_byteps.van.runtime.membership import Connect, Send, control_message
from kvstore_byteps.van.runtime.scheduler_membership import SchedulerMembership
from kvstore_byteps.van.runtime.postoffice import Postoffice
from kvstore_byteps.van.wire.message import K_EMPTY, SCHEDULER_ID, ControlCommand, Node
from tests.support.kv_nodes import start_all

pytestmark = pytest.mark.timeout(60)
ROOT_PORT = 9100
START_TIMEOUT = 30.0
WHY = "speaks byteps_tcp version 2, this node version 3"


class RefusingVan(LoopbackVan):
    """The scheduler's van: connecting to the node at ``refused_port`` fails as a byteps_tcp
    hello of another version does (after the ZeroMQ side was connected)."""

    def __init__(self, network, refused_port):
        super().__init__(network)
        self.refused_port = refused_port

    def connect(self, node, my_id):
        super().connect(node, my_id)
        if node.port == self.refused_port:
            raise ProtocolError("%s %d at %s %s" % (node.role.name.lower(), node.id,
                                                    node.address, WHY))


def test_every_registered_node_stops_at_once_naming_the_node_the_scheduler_could_not_reach():
    network = LoopbackNetwork()
    roles = [Role.SCHEDULER, Role.SERVER, Role.WORKER, Role.WORKER]
    nodes = []
    for index, role in enumerate(roles):
        cfg = Config(role=role, num_workers=2, num_servers=1, root_uri="127.0.0.1",
                     root_port=ROOT_PORT, node_host="127.0.0.1", port=ROOT_PORT + 1 + index,
                     start_timeout=START_TIMEOUT, request_timeout=10.0)
        van = (RefusingVan(network, refused_port=ROOT_PORT + 4)     # the second worker
               if role is Role.SCHEDULER else LoopbackVan(network))
        nodes.append(Postoffice(cfg, van=van))
    started = time.monotonic()
    results = start_all(nodes, join=START_TIMEOUT + 5)
    took = time.monotonic() - started
    try:
        assert took < START_TIMEOUT / 3, "the nodes waited %.1f s" % took
        assert isinstance(results[0], ProtocolError) and WHY in str(results[0]), results
        for result in results[1:]:       # the worker it could not reach too (over "ZeroMQ")
            assert isinstance(result, ClusterStartError), results
            assert ("the job cannot start: the scheduler could not connect to worker rank 1: "
                    "worker 11 at 127.0.0.1:%d speaks byteps_tcp version 2, the scheduler version "
                    "3" % (ROOT_PORT + 4)) in str(result), result
    finally:
        for po in nodes:
            po.stop()


def test_the_notices_go_to_every_registered_node_from_the_scheduler():
    scheduler = Node(Role.SCHEDULER, SCHEDULER_ID, "127.0.0.1", ROOT_PORT)
    membership = SchedulerMembership(scheduler, num_workers=1, num_servers=1,
                                     start_deadline=60.0)
    assert membership.start_failed(scheduler, "nothing registered") == []
    for port, role in ((9201, Role.SERVER), (9202, Role.WORKER)):
        add_node = control_message(ControlCommand.ADD_NODE, SCHEDULER_ID,
                                   nodes=[Node(role, K_EMPTY, "127.0.0.1", port)])
        actions = membership.handle(add_node, 0.0)
    connects = [a.node for a in actions if isinstance(a, Connect)]
    assert sorted(n.port for n in connects) == [9201, 9202]
    server = next(n for n in connects if n.role is Role.SERVER)
    notices = membership.start_failed(server, "it speaks version 2, this node version 3")
    assert sorted(node.id for node, _ in notices) == sorted(n.id for n in connects)
    for node, notice in notices:
        assert notice.meta.recver == node.id
        assert notice.meta.control.cmd == ControlCommand.HEARTBEAT
        # the reason is the scheduler's: on the other nodes its "this node" is the scheduler
        assert notice.meta.extra["abort"] == (
            "the job cannot start: the scheduler could not connect to server rank 0: it "
            "speaks version 2, the scheduler version 3")
    # forming the cluster itself sends no such notice
    assert not any(isinstance(a, Send) and a.message.meta.extra for a in actions)
