"""The byteps_rdma van with in-process nodes on the soft provider: large and small values
round trip and land in reused buffers; a rogue that breaks the channel handshake is dropped
while the node keeps serving; a cluster forms and sums even when a peer's first message
completes before the accepting thread has finished its handshake (the start-up race that made
clusters fail to form now and then)."""
import socket
import struct
import threading
import time

import numpy as np
import pytest

from kvstore_byteps.config import Config, Role, VanType
from kvstore_byteps.van.rdma import van as rdma_van
from kvstore_byteps.van.tcp import frame as tcp_frame
from kvstore_byteps.van.wire.message import K_EMPTY
from tests.support.kv_nodes import start_trio, stop_all, summing_handler
from tests.support.procs import free_port, wait_until

ROLES = (Role.SCHEDULER, Role.SERVER, Role.WORKER)


def config(role, port):
    return Config(role=role, num_workers=1, num_servers=1, root_uri="127.0.0.1",
                  root_port=port, node_host="127.0.0.1", start_timeout=15.0,
                  request_timeout=10.0, van_type=VanType.BYTEPS_RDMA, rdma_device="soft",
                  heartbeat_interval=0)


@pytest.fixture
def rdma_trio():
    port = free_port()
    nodes, worker = start_trio([config(role, port) for role in ROLES], summing_handler())
    yield nodes, worker
    stop_all(nodes)


@pytest.mark.timeout(90)
def test_large_and_small_values_round_trip_and_land_in_reused_buffers(rdma_trio):
    nodes, worker = rdma_trio
    server_pool, worker_pool = nodes[1].van.pool, nodes[2].van.pool
    worker_pool.register(3, 1 << 20)
    big = np.arange(1 << 18, dtype=np.float32)             # 1 MiB: written into a landing
    small = np.array([1.5, 2.5], np.float32)               # inline in the SEND
    for step in range(1, 6):
        worker.wait(worker.push([3], big, [big.nbytes]))
        worker.wait(worker.push([4], small, [small.nbytes]))
        got = worker.wait(worker.pull([3]))
        assert np.array_equal(np.frombuffer(got.vals, np.float32), big * step)
        got = worker.wait(worker.pull([4]))
        assert np.array_equal(np.frombuffer(got.vals, np.float32), small * step)
        del got
        if step == 1:
            first = nodes[2].van.registrations.registered
    # the server's landings of key 3 and the worker's of its answers reuse their buffers
    assert server_pool.reused >= 3 and worker_pool.allocated <= 2 and worker_pool.reused >= 3
    # and their registrations; the worker writes from ``big``, registered once
    assert nodes[2].van.registrations.registered == first


@pytest.mark.timeout(90)
def test_a_rogue_breaking_the_channel_handshake_is_dropped_and_the_node_keeps_serving(
        rdma_trio, caplog):
    nodes, worker = rdma_trio
    server = nodes[1]
    # from two addresses: a node logs one problem of a peer host in full, then counts
    for source, junk in (("127.0.0.1", struct.pack("<I", 1 << 30)),    # an info of 1 GiB
                         ("127.0.0.2", struct.pack("<I", 8) + b"not json")):   # undecodable
        with socket.create_connection(("127.0.0.1", server.my_node.port), timeout=20,
                                      source_address=(source, 0)) as rogue:
            rogue.sendall(tcp_frame.encode_hello(K_EMPTY, rdma=True))
            assert tcp_frame.decode_hello(rogue.recv(tcp_frame.HELLO_BYTES,
                                                     socket.MSG_WAITALL)).rdma
            rogue.sendall(junk)
            rogue.settimeout(20)
            assert rogue.recv(1) == b""                     # dropped
    wait_until(lambda: "channel info of 1073741824 bytes" in caplog.text
               and "malformed RDMA channel info" in caplog.text, 20, "two warnings")
    worker.wait(worker.push([1], np.ones(2, np.float32), [8]))
    got = worker.wait(worker.pull([1]))
    assert np.array_equal(np.frombuffer(got.vals, np.float32), [1, 1])


@pytest.mark.timeout(90)
def test_a_first_message_completing_before_the_handshake_returns_is_delivered(monkeypatch):
    """Every accepting handshake thread stalls just after its queue pair is connected (as a
    thread that loses the CPU there does): the nodes' first messages (ADD_NODE to the
    scheduler) then complete on the scheduler's completion queue before the thread returns.
    They must still be delivered: the receive loop knows the connection before the peer may
    send."""
    connection = rdma_van._Connection

    class Stalling(connection):
        def __init__(self, channel):
            if threading.current_thread().name == "tcp-van-handshake":    # accepting
                time.sleep(0.5)
            super().__init__(channel)

    monkeypatch.setattr(rdma_van, "_Connection", Stalling)
    port = free_port()
    nodes, worker = start_trio([config(role, port) for role in ROLES], summing_handler())
    try:
        values = np.arange(1 << 16, dtype=np.float32)          # 256 KiB: written, not inline
        worker.wait(worker.push([5], values, [values.nbytes]))
        got = worker.wait(worker.pull([5]))
        assert np.array_equal(np.frombuffer(got.vals, np.float32), values)
    finally:
        stop_all(nodes)
