"""Postoffice, membership and KV layer over the in-memory LoopbackVan: no sockets at all."""
import dataclasses
import socket
import threading
import time

import numpy as np
import pytest

from kvstore_byteps.config import Config, Role
from kvstore_byteps.errors import DeadlineError, PeerError
from kvstore_byteps.van.kv import KVPairs, KVRequest, KVServer, Request
from kvstore_byteps.van.kv.worker import KVWorker
from kvstore_byteps.van.loopback.van import LoopbackNetwork, LoopbackVan
from kvstore_byteps.van.wire.message import Meta
from kvstore_byteps.van.runtime.postoffice import Postoffice
from tests.support.kv_nodes import finalize_all, start_all

pytestmark = pytest.mark.timeout(60)
ROOT_PORT = 9000


@pytest.fixture
def no_sockets(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a socket was opened")
    monkeypatch.setattr(socket, "socket", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


class InlineLoopbackVan(LoopbackVan):
    """The in-memory van, declared safe for handlers on its receive loop (its sends only
    queue, like byteps_tcp's)."""
    handlers_inline_ok = True


def make_cluster(workers, servers, heartbeat=(0.0, 0.0), handler=None, server_recovery=False,
                 van=LoopbackVan, quick_request=None):
    network = LoopbackNetwork()
    roles = [Role.SCHEDULER] + [Role.SERVER] * servers + [Role.WORKER] * workers
    nodes = []
    for index, role in enumerate(roles):
        cfg = Config(role=role, num_workers=workers, num_servers=servers,
                     root_uri="127.0.0.1", root_port=ROOT_PORT, node_host="127.0.0.1",
                     port=ROOT_PORT + 1 + index, start_timeout=10.0, request_timeout=10.0,
                     heartbeat_interval=heartbeat[0], heartbeat_timeout=heartbeat[1],
                     server_recovery=server_recovery)
        nodes.append(Postoffice(cfg, van=van(network)))
    stores = {}

    def sum_store(req, server):
        if req.meta.push:
            key = int(req.keys[0])
            stores[key] = stores.get(key, 0) + np.frombuffer(req.vals, np.float32)
            server.respond(req)
        else:
            server.respond(req, req.keys, stores[int(req.keys[0])], req.lens)
    for po in nodes[1:1 + servers]:
        KVServer(po, request_handler=handler or sum_store, quick_request=quick_request)
    kv_workers = [KVWorker(po) for po in nodes[1 + servers:]]
    assert start_all(nodes) == [None] * len(nodes)
    return network, nodes, kv_workers


def test_a_cluster_forms_sums_and_stops_without_a_single_socket(no_sockets):
    network, nodes, workers = make_cluster(workers=2, servers=2)
    try:
        for rank, worker in enumerate(workers):
            worker.wait(worker.push([1, 2 ** 62], np.full(4, rank + 1, np.float32), [8, 8]))
        passed = []
        barriers = [threading.Thread(target=lambda po=po: passed.append(po.barrier(4, timeout=5)))
                    for po in nodes[3:]]              # the workers' group
        for thread in barriers:
            thread.start()
        for thread in barriers:
            thread.join(10)
        assert passed == [None, None]
        got = workers[0].wait(workers[0].pull([1, 2 ** 62]))
        assert np.array_equal(np.frombuffer(got.vals, np.float32), [3, 3, 3, 3])
        assert sorted(node.id for node in nodes[0].nodes) == [1, 8, 9, 10, 11]
        # the in-memory van's sends are not known never to wait: answers on a thread of
        # their own, so the worker engine keeps its PUSH thread for every push
        assert not any(worker.answers_on_receive_loop for worker in workers)
    finally:
        finalize_all(nodes)


def test_a_servers_quick_requests_run_on_the_receive_loop_and_the_rest_on_its_thread(no_sockets):
    # where the van's sends never wait, a server's requests that its quick_request predicate
    # calls quick (BytePSServer: plain BytePS pushes and pulls) skip the hand-off to its thread
    threads = {}

    def record(req, server):
        threads.setdefault("push" if req.meta.push else "pull", set()).add(
            threading.current_thread().name)
        server.respond(req, *((req.keys, np.zeros(2, np.float32), req.lens)
                              if req.meta.pull else ()))
    for van, expected in ((InlineLoopbackVan, "van-receive"), (LoopbackVan, "customer-0-0")):
        threads.clear()
        network, nodes, workers = make_cluster(workers=1, servers=1, handler=record, van=van,
                                               quick_request=lambda meta: meta.push)
        try:
            for _ in range(5):
                workers[0].wait(workers[0].push([1], np.ones(2, np.float32), [8]))
                workers[0].wait(workers[0].pull([1]))
            assert threads == {"push": {expected}, "pull": {"customer-0-0"}}, van
        finally:
            finalize_all(nodes)


def test_a_silent_server_is_named_and_fails_the_pending_request(no_sockets):
    answered = threading.Event()

    def never_answer(req, server):
        answered.set()
    network, nodes, workers = make_cluster(workers=1, servers=1, heartbeat=(0.2, 1.5),
                                           handler=never_answer)
    try:
        request = workers[0].push([1], np.ones(2, np.float32), [8])
        assert answered.wait(5)
        network.cut(nodes[1].van)                  # the server "dies"
        started = time.monotonic()
        with pytest.raises(PeerError, match=r"server rank 0 \(node 8\) at 127.0.0.1:\d+ is dead"):
            request.wait(10)
        assert time.monotonic() - started < 6
    finally:
        finalize_all(nodes)


def test_a_request_past_its_deadline_fails_on_the_customer_thread(no_sockets):
    """Deadlines come from the postoffice's tick, and the failure is delivered by the thread
    that also delivers answers (one owner of the request's completion)."""
    network, nodes, workers = make_cluster(workers=1, servers=1, handler=lambda req, srv: None)
    worker = workers[0]
    worker.request_timeout, worker._check_period = 0.5, 0.05
    try:
        threads = []
        started = time.monotonic()
        request = worker.push([1], np.ones(2, np.float32), [8],
                              callback=lambda r: threads.append(threading.current_thread().name))
        # named as the request it is (its name is put into words only now)
        # the servers it waits for named by rank and address too (a hang names its cause)
        with pytest.raises(DeadlineError, match=r"^push of 1 key\(s\) \[1\.\.\] \(timestamp \d+\): "
                                                r"no answer from server node\(s\) \[8\] "
                                                r"\(server rank 0 \(node 8\) at 127\.0\.0\.1:\d+\)"):
            request.wait(5)
        assert time.monotonic() - started < 2
        assert threads == ["customer-0-0"]
    finally:
        finalize_all(nodes)


def test_a_pull_riding_on_a_push_is_answered_under_its_own_timestamp(no_sockets):
    """push_with_pull sends one message; the server's two answers complete both requests."""
    seen = []

    def ack_then_answer_the_ride(req, server):
        seen.append((req.meta.push, req.meta.pull, dict(req.meta.extra or {})))
        server.respond(req)
        ride = dataclasses.replace(req.meta, timestamp=req.meta.extra["pull_timestamp"],
                                   push=False, pull=True, extra=None)
        values = np.frombuffer(req.vals, np.float32) * 2
        server.respond(KVRequest(ride, KVPairs(req.keys, memoryview(b""), None)), req.keys,
                       values, [values.nbytes])
    network, nodes, workers = make_cluster(workers=1, servers=1,
                                           handler=ack_then_answer_the_ride)
    try:
        push, pull = workers[0].push_with_pull([5], np.arange(3, dtype=np.float32), [12])
        assert workers[0].wait(push).keys.size == 0
        got = workers[0].wait(pull)
        assert list(np.frombuffer(got.vals, np.float32)) == [0.0, 2.0, 4.0]
        assert seen == [(True, False, {"pull_timestamp": pull.timestamp})]
        assert pull.timestamp != push.timestamp
    finally:
        finalize_all(nodes)


def test_a_refused_push_fails_the_pull_riding_on_it_at_once(no_sockets):
    network, nodes, workers = make_cluster(
        workers=1, servers=1, handler=lambda req, server: server.respond(req, error="no way"))
    try:
        started = time.monotonic()
        push, pull = workers[0].push_with_pull([5], np.ones(2, np.float32), [8])
        for request in (push, pull):
            with pytest.raises(PeerError, match="answered with an error: no way"):
                request.wait(5)
        assert time.monotonic() - started < 2      # not at the pull's deadline
        assert workers[0]._requests._pending == {}
    finally:
        finalize_all(nodes)


def test_request_timestamps_wrap_within_the_metas_int32(no_sockets):
    network, nodes, workers = make_cluster(workers=1, servers=1)
    try:
        worker = workers[0]
        worker._requests._next_timestamp = 2 ** 31 - 1
        stamps = []
        for _ in range(2):
            request = worker.push([1], np.ones(2, np.float32), [8])
            worker.wait(request)
            stamps.append(request.timestamp)
        assert stamps == [2 ** 31 - 1, 0]
    finally:
        finalize_all(nodes)


# ============================================================================ races
def test_a_request_completes_once_when_the_last_answer_and_a_failure_race():
    """The last answer completes the request (joining 2 x 32 MB of parts takes a while) while
    a deadline fails it from another thread: the callback must run exactly once."""
    meta = Meta(request=False)
    part = [KVPairs(np.array([k], np.uint64), memoryview(bytes(32 << 20)), None) for k in (1, 2)]
    doubled = 0
    for _ in range(10):
        calls = []
        request = Request("pull", 0, [8, 10], callback=calls.append)
        request._on_response(8, meta, part[0])
        start = threading.Barrier(2)

        def answer():
            start.wait()
            request._on_response(10, meta, part[1])

        def fail():
            start.wait()
            time.sleep(0.002)           # while the answer's thread joins the parts
            request._fail(PeerError("deadline"))
        threads = [threading.Thread(target=answer), threading.Thread(target=fail)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert request.done
        doubled += len(calls) != 1
    assert doubled == 0, "the callback ran twice in %d of 10 races" % doubled


# ============================================================================ restarted server
def test_recovering_a_server_resends_pulls_completes_reported_pushes_and_fences_stale_answers(
        no_sockets):
    """KVWorker.recovery.recover, as the worker engine calls it when a restarted server took over
    node 8: the push the report carries counts as answered, the pull is re-sent stamped with
    the epoch, and an answer from the process before the restart (no epoch) is dropped."""
    held = []

    def hold(req, server):
        held.append((req, server))
    network, nodes, workers = make_cluster(workers=1, servers=1, handler=hold,
                                           server_recovery=True)
    worker, server_po = workers[0], nodes[1]
    try:
        push = worker.push([1], np.ones(2, np.float32), [8])
        pull = worker.pull([1])
        deadline = time.monotonic() + 5
        while len(held) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        stale_pull = held[1]
        done = threading.Event()
        worker.post(lambda: (worker.recovery.recover(8, 1, None,
                                                   lambda meta: meta.push and not meta.pull),
                             done.set()))
        assert done.wait(5)
        assert push.wait(5).keys.size == 0                # answered by the report
        while len(held) < 3:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        resent = held[2][0]
        assert resent.meta.pull and resent.meta.extra == {"epoch": 1}
        stale_pull[1].respond(stale_pull[0], np.array([1], np.uint64),
                              np.full(2, 9, np.float32), np.array([8], np.int32))
        time.sleep(0.2)
        assert not pull.done                              # the old process's answer: dropped
        server_po.recovery_epoch = 1                      # as a restarted server answers
        held[2][1].respond(resent, np.array([1], np.uint64), np.full(2, 2, np.float32),
                           np.array([8], np.int32))
        assert list(np.frombuffer(pull.wait(5).vals, np.float32)) == [2, 2]
    finally:
        finalize_all(nodes)
