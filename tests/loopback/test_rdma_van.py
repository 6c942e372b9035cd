"""The byteps_rdma van with in-process nodes on the soft provider: a cluster forms and sums
even when a peer's first message completes before the accepting thread has finished its
handshake (the start-up race that made clusters fail to form now and then)."""
import threading
import time

import numpy as np
import pytest

from kvstore_byteps.config import Config, Role, VanType
from kvstore_byteps.van import rdma_van
from tests.support.kv_nodes import start_trio, summing_handler
from tests.support.procs import free_port

ROLES = (Role.SCHEDULER, Role.SERVER, Role.WORKER)


def config(role, port):
    return Config(role=role, num_workers=1, num_servers=1, root_uri="127.0.0.1",
                  root_port=port, node_host="127.0.0.1", start_timeout=15.0,
                  request_timeout=10.0, van_type=VanType.BYTEPS_RDMA, rdma_device="soft",
                  heartbeat_interval=0)


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
        for po in reversed(nodes):
            po.stop()
