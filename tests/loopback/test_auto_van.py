"""The default van (van/auto/van.py), in-process nodes on 127.0.0.1: our nodes reach each other over
byteps_tcp; a node that does not announce a byteps_tcp port (an upstream MXNet node, or ours
with DMLC_PS_VAN_TYPE=zmq) is reached over ZeroMQ; sums and in-place landing stay right."""
import numpy as np
import pytest

from kvstore_byteps.config import Config, Role, VanType
from tests.support.kv_nodes import start_trio, stop_all, summing_handler
from tests.support.procs import free_port

ROLES = (Role.SCHEDULER, Role.SERVER, Role.WORKER)

pytestmark = pytest.mark.timeout(60)


def config(role, port, van):
    return Config(role=role, num_workers=1, num_servers=1, root_uri="127.0.0.1",
                  root_port=port, node_host="127.0.0.1", start_timeout=20.0,
                  request_timeout=10.0, van_type=van)


def summing_trio(vans):
    """Scheduler, server, worker on ``vans``; the server sums pushes and answers pulls."""
    port = free_port()
    return start_trio([config(role, port, van) for role, van in zip(ROLES, vans)],
                      summing_handler())


def push_pull_rounds(worker, rounds=20, size=1 << 18):
    """Pushes ones to key 3 every round and pulls the sum into an array; returns whether the
    answers landed in place."""
    landed = []
    for step in range(1, rounds + 1):
        worker.wait(worker.push([3], np.ones(size, np.float32), [size * 4]))
        into = np.zeros(size * 4, np.uint8)
        values = np.frombuffer(worker.wait(worker.pull([3], into=into)).vals, np.float32)
        assert np.array_equal(values, np.full(size, step, np.float32))
        landed.append(np.shares_memory(values, into))
    return landed


def test_our_nodes_reach_each_other_over_byteps_tcp_and_land_answers_in_place():
    nodes, worker = summing_trio([VanType.AUTO] * 3)
    try:
        assert [po.transport for po in nodes] == ["byteps_tcp (auto: every peer is ours)"] * 3
        assert all(n.tcp_port for n in nodes[2].nodes)
        worker.expect_answers(5, 1 << 20)          # the answers come over byteps_tcp
        assert nodes[2].van.tcp.pool.total_bytes() == 1 << 20
        assert all(push_pull_rounds(worker))
    finally:
        stop_all(nodes)


def test_a_node_without_a_tcp_port_is_reached_over_zmq_and_the_rest_over_byteps_tcp():
    """The server speaks ZeroMQ only, as an upstream MXNet server does: the worker and the
    scheduler send to it over ZeroMQ and to each other over byteps_tcp; nothing lands in place
    (the van cannot tell which peer a key's answer comes from), every sum is right."""
    nodes, worker = summing_trio([VanType.AUTO, VanType.ZMQ, VanType.AUTO])
    try:
        server_id, worker_id = nodes[1].my_id, nodes[2].my_id
        assert nodes[1].transport == "zmq"
        assert nodes[2].transport == "auto: byteps_tcp to nodes 1,%d, zmq to nodes %d " \
                                     "(upstream MXNet)" % (worker_id, server_id)
        worker.expect_answers(5, 1 << 20)          # they come over ZeroMQ: nothing to keep
        assert not any(push_pull_rounds(worker))
        assert nodes[2].van.tcp.pool.total_bytes() == 0
    finally:
        stop_all(nodes)


def test_an_explicit_zmq_keeps_every_node_on_zmq():
    nodes, worker = summing_trio([VanType.ZMQ] * 3)
    try:
        assert [po.transport for po in nodes] == ["zmq"] * 3
        assert not any(n.tcp_port for n in nodes[2].nodes)
        assert not any(push_pull_rounds(worker, rounds=3))
    finally:
        stop_all(nodes)

