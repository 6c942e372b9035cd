"""The BytePS TCP van with in-process nodes on 127.0.0.1: data, landing buffers, broken streams,
claimed node ids, ZeroMQ peers, the receive loop's wake-ups and a full socket."""
import selectors
import socket
import struct
import threading
import time

import numpy as np
import pytest

from kvstore_byteps.config import Config, Role, VanType
from kvstore_byteps.errors import ClusterStartError, ConfigError, PeerError
from kvstore_byteps.van.tcp import frame as tcp_frame
from kvstore_byteps.van.wire.codec import encode_meta
from kvstore_byteps.van.wire.message import K_EMPTY, DataType, Meta
from kvstore_byteps.van.runtime.postoffice import Postoffice
from kvstore_byteps.van.tcp.inbound import Inbound
from kvstore_byteps.van.tcp.van import TcpVan
from tests.support.procs import free_port, wait_until
from tests.support.kv_nodes import start_all, start_trio, stop_all


ROLES = (Role.SCHEDULER, Role.SERVER, Role.WORKER)


def config(role, port, van=VanType.BYTEPS_TCP, timeout=20.0, request_timeout=10.0):
    return Config(role=role, num_workers=1, num_servers=1, root_uri="127.0.0.1",
                  root_port=port, node_host="127.0.0.1", start_timeout=timeout,
                  request_timeout=request_timeout, van_type=van)


@pytest.fixture
def tcp_cluster():
    port = free_port()
    store = {}

    def on_request(req, server):
        keys = tuple(int(k) for k in req.keys)
        if req.meta.push:   # consumes the frame now, as our servers do
            store[keys] = (np.frombuffer(req.vals, np.float32) * 2, req.lens.copy())
            server.respond(req)
        else:
            server.respond(req, req.keys, *store[keys])
    nodes, worker = start_trio([config(role, port) for role in ROLES], on_request)
    yield nodes, worker
    stop_all(nodes)


@pytest.mark.timeout(60)
def test_large_and_small_values_round_trip_and_land_in_reused_buffers(tcp_cluster):
    nodes, worker = tcp_cluster
    server_pool, worker_pool = nodes[1].van.pool, nodes[2].van.pool
    worker_pool.register(3, (1 << 20) + 8)     # the frame of both keys
    for step in range(5):
        big = np.full(1 << 18, step, np.float32)          # 1 MiB
        small = np.array([step, step + 0.5], np.float32)
        worker.wait(worker.push([3, 4], np.concatenate([big, small]), [big.nbytes, 8]))
        got = worker.wait(worker.pull([3, 4]))
        values = np.frombuffer(got.vals, np.float32)
        assert np.array_equal(values[:big.size], big * 2)
        assert np.array_equal(values[big.size:], small * 2)
        del got, values
    # after the first round every 1 MiB frame landed in a buffer that was already there
    assert server_pool.allocated <= 2 and server_pool.reused >= 4
    assert worker_pool.allocated == 1 and worker_pool.reused >= 4


@pytest.mark.timeout(60)
@pytest.mark.parametrize("van", [VanType.BYTEPS_TCP, VanType.ZMQ])
def test_a_push_in_pieces_arrives_as_one_vals_frame(van):
    """A Gather vals frame (many partitions of one request): byteps_tcp sends its pieces
    vectored, zmq a joined copy; the server reads one frame either way."""
    from kvstore_byteps.van.wire.message import Gather
    port, store = free_port(), {}

    def on_request(req, server):
        keys = tuple(int(k) for k in req.keys)
        if req.meta.push:
            store[keys] = (np.frombuffer(req.vals, np.float32).copy(), req.lens.copy())
            server.respond(req)
        else:
            server.respond(req, req.keys, *store[keys])
    nodes, worker = start_trio([config(role, port, van=van) for role in ROLES], on_request)
    try:
        pieces = [np.full(n, i, np.float32) for i, n in enumerate((3, 1 << 16, 5))]
        worker.wait(worker.push([5, 6, 7], Gather(pieces), [p.nbytes for p in pieces]))
        got = np.frombuffer(worker.wait(worker.pull([5, 6, 7])).vals, np.float32)
        assert np.array_equal(got, np.concatenate(pieces))
    finally:
        stop_all(nodes)


def send_raw(node, node_id, data):
    """Connect to ``node`` as ``node_id``, send ``data``, wait until the node hangs up."""
    with socket.create_connection(("127.0.0.1", node.my_node.port), timeout=20) as rogue:
        rogue.sendall(tcp_frame.encode_hello(node_id))
        assert tcp_frame.decode_hello(rogue.recv(tcp_frame.HELLO_BYTES, socket.MSG_WAITALL))
        rogue.sendall(data)
        rogue.shutdown(socket.SHUT_WR)
        assert rogue.recv(1) == b""


@pytest.mark.timeout(60)
def test_a_broken_stream_is_dropped_and_the_node_keeps_serving(tcp_cluster, caplog):
    nodes, worker = tcp_cluster
    meta = b"\xff\xfe not a protobuf"
    # anonymous peers (node ids are checked: tests below), read like any other; one per node
    # (a node logs one problem of a peer in full, then counts)
    send_raw(nodes[0], K_EMPTY, struct.pack("<IHH", 0, 1, 0))            # meta length 0
    send_raw(nodes[1], K_EMPTY, tcp_frame.encode_header(meta, [3]) + meta + b"abc")  # undecodable
    send_raw(nodes[2], K_EMPTY, tcp_frame.encode_header(meta, [100]) + meta + b"ab")  # cut short
    wait_until(lambda: "meta length 0" in caplog.text and "malformed" in caplog.text
               and "middle of a message" in caplog.text, 30, "three warnings")
    worker.wait(worker.push([1], np.ones(2, np.float32), [8]))
    got = worker.wait(worker.pull([1]))
    assert np.array_equal(np.frombuffer(got.vals, np.float32), [2, 2])


@pytest.mark.timeout(60)
def test_a_second_connection_claiming_a_nodes_id_is_not_read_nor_one_of_no_node(
        tcp_cluster, caplog):
    """Without BYTEPS_AUTH_KEY a hello's node id is not proven: as ZeroMQ's ROUTER does with
    identities, the connection that holds an id is the only one read for it."""
    nodes, worker = tcp_cluster
    server = nodes[1]
    spoofed = Meta(head=0, request=True, push=True, app_id=0, customer_id=0, timestamp=7,
                   data_type=[DataType.UINT64, DataType.OTHER, DataType.INT32],
                   recver=server.my_id)
    keys, vals, lens = (np.array([5], np.uint64).tobytes(),
                        np.full(2, 100, np.float32).tobytes(), np.array([8], np.int32).tobytes())
    frame = encode_meta(spoofed)
    message = tcp_frame.encode_header(frame, [8, 8, 4]) + frame + keys + vals + lens
    with socket.create_connection(("127.0.0.1", server.my_node.port), timeout=20) as rogue:
        rogue.sendall(tcp_frame.encode_hello(worker.po.my_id))     # the worker's own id
        rogue.recv(tcp_frame.HELLO_BYTES, socket.MSG_WAITALL)
        rogue.sendall(message)
        wait_until(lambda: "already has an open connection" in caplog.text, 20, "the hold")
        with socket.create_connection(("127.0.0.1", server.my_node.port), timeout=20) as other:
            other.sendall(tcp_frame.encode_hello(77))               # no node of the cluster
            other.recv(tcp_frame.HELLO_BYTES, socket.MSG_WAITALL)
            other.sendall(message)
            wait_until(lambda: "no node of this cluster" in caplog.text, 20, "the refusal")
        worker.wait(worker.push([1], np.ones(2, np.float32), [8]))
        got = worker.wait(worker.pull([1]))
        assert np.array_equal(np.frombuffer(got.vals, np.float32), [2, 2])
    with pytest.raises(PeerError):         # the spoofed push never reached the handler
        worker.wait(worker.pull([5]))


@pytest.mark.timeout(60)
def test_a_node_on_byteps_tcp_told_that_the_scheduler_speaks_zeromq():
    port = free_port()
    scheduler = Postoffice(config(Role.SCHEDULER, port, van=VanType.ZMQ, timeout=3.0))
    threading.Thread(target=start_all, args=([scheduler],), daemon=True).start()
    worker = Postoffice(config(Role.WORKER, port, timeout=8.0))
    started = time.monotonic()
    with pytest.raises(ConfigError, match="scheduler 1 at 127.0.0.1:%d speaks ZeroMQ" % port):
        worker.start()
    assert time.monotonic() - started < 5
    wait_until(lambda: scheduler.error is not None, 20, "the scheduler's start deadline")
    scheduler.stop()


@pytest.mark.timeout(60)
def test_a_byteps_tcp_scheduler_stops_at_once_when_a_zeromq_node_joins(caplog):
    port = free_port()
    scheduler = Postoffice(config(Role.SCHEDULER, port, timeout=30.0))
    worker = Postoffice(config(Role.WORKER, port, van=VanType.ZMQ, timeout=5.0))
    started = time.monotonic()
    results = start_all([scheduler], join=0.5) + start_all([worker], join=0)
    wait_until(lambda: scheduler.stopped, 15, "the scheduler to stop")
    assert isinstance(scheduler.error, ConfigError), scheduler.error
    assert "the peer at 127.0.0.1:" in str(scheduler.error)
    assert "speaks ZeroMQ" in str(scheduler.error)
    assert time.monotonic() - started < 5
    del results
    scheduler.stop()    # (the zmq worker, never admitted, ends with the test process)


@pytest.mark.timeout(30)
def test_an_unreachable_scheduler_is_named():
    port = free_port()
    po = Postoffice(config(Role.WORKER, port, timeout=1.0))
    with pytest.raises(ClusterStartError, match="127.0.0.1:%d" % port):
        po.start()


def stream_of(*messages):
    """The bytes of (meta, frames) messages on the wire."""
    out = b""
    for meta, frames in messages:
        out += tcp_frame.encode_header(meta, [len(f) for f in frames]) + meta + b"".join(frames)
    return out


def _connected_pair():
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname(), timeout=20)
    server, _ = listener.accept()
    listener.close()
    return client, server


def _low_water(sock) -> int:
    return sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT)


@pytest.mark.timeout(60)
def test_the_receive_loop_waits_for_a_large_frame_whole_then_for_any_byte():
    """While a large frame arrives, the connection is readable only once the frame can
    complete (SO_RCVLOWAT); between frames, one byte wakes it (a small message must not wait)."""
    van = TcpVan(Config(van_type=VanType.BYTEPS_TCP))
    client, server = _connected_pair()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 200000)    # room for a 90 KB mark
    inbound = Inbound(server, 9, "127.0.0.1:1", van.pool)
    big = np.arange(50000, dtype=np.uint32).tobytes()                # 200 KB
    meta = encode_meta(Meta(app_id=0, timestamp=1, request=True, push=True, body=b"big"))
    first = stream_of((meta, [struct.pack("<Q", 1), big]))
    head = len(first) - 90000                       # all but the frame's last 90000 bytes
    received = []

    def deliver(message):
        received.append(message)
        return True                                     # go on (False: the node stops)

    def drain():
        return van._drain(inbound, selector, deliver)
    selector = selectors.DefaultSelector()
    selector.register(server, selectors.EVENT_READ)
    try:
        client.sendall(first[:head])
        wait_until(lambda: drain() and inbound.reader.frame_bytes_missing == 90000,
                   20, "all but 90000 bytes of the frame")
        assert server.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) // 4 > 90000
        assert _low_water(server) == 90000
        client.sendall(first[head:-1000])
        time.sleep(0.2)
        assert selector.select(0) == []                 # 1000 bytes short: not readable yet
        ack = encode_meta(Meta(app_id=0, timestamp=2, body=b"ack"))
        client.sendall(first[-1000:] + stream_of((ack, [])))
        wait_until(lambda: drain() and len(received) == 2, 20, "both messages")
        assert _low_water(server) == 1
        assert bytes(received[0].data[1]) == big and received[1].meta.body == b"ack"
        client.sendall(stream_of((ack, [])))
        assert selector.select(20)                       # one small message wakes it at once
    finally:
        selector.close()
        client.close()
        server.close()
        van.close()


def test_the_low_water_mark_stays_below_a_quarter_of_the_receive_buffer():
    van = TcpVan(Config(van_type=VanType.BYTEPS_TCP))
    client, server = _connected_pair()
    try:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 200000)
        room = server.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) // 4
        inbound = Inbound(server, 9, "127.0.0.1:1", van.pool)
        inbound.wake_for(4 << 20)
        assert _low_water(server) == room < 4 << 20
        inbound.wake_for(1000)              # too little to be worth a mark
        assert _low_water(server) == 1
    finally:
        client.close()
        server.close()
        van.close()


def test_a_full_socket_queues_the_rest_and_keeps_the_order():
    from kvstore_byteps.van.tcp.outbound import Outbound, advance
    views = [memoryview(b"abc"), memoryview(b"defg")]
    advance(views, 4)
    assert [bytes(v) for v in views] == [b"efg"]
    a, b = socket.socketpair()
    try:
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        out = Outbound(a, "test peer")
        first = np.arange(1 << 20, dtype=np.uint8)          # far more than the socket takes
        assert out.send([memoryview(first)]) is True         # the rest is queued
        assert out.send([memoryview(b"second")]) is False    # behind it, already watched
        received = bytearray()
        b.settimeout(10)
        while len(received) < first.nbytes + 6:
            out.flush()
            received += b.recv(1 << 20)
        assert bytes(received) == first.tobytes() + b"second"
        assert out.flush() is True and not out.pending
    finally:
        a.close()
        b.close()
