"""The BytePS TCP van: its wire format, landing buffers, and in-process nodes on 127.0.0.1."""
import selectors
import socket
import struct
import threading
import time

import numpy as np
import pytest

from kvstore_byteps.config import Config, Role, VanType
from kvstore_byteps.errors import ClusterStartError, ConfigError, PeerError, ProtocolError
from kvstore_byteps.van import tcp_frame
from kvstore_byteps.van.codec import encode_meta
from kvstore_byteps.van.message import K_EMPTY, DataType, Meta
from kvstore_byteps.van.postoffice import Postoffice
from kvstore_byteps.van.recv_buffers import RecvBufferPool
from kvstore_byteps.van.tcp_van import TcpVan, _Inbound
from tests.conftest import free_port, wait_until
from tests.kv_nodes import start_all, start_trio

ROLES = (Role.SCHEDULER, Role.SERVER, Role.WORKER)

ZMTP_GREETING = b"\xff" + b"\x00" * 8 + b"\x7f" + b"\x03\x00NULL" + b"\x00" * 48


# ============================================================================ wire format
def test_hello_carries_the_node_id_or_none():
    assert tcp_frame.decode_hello(tcp_frame.encode_hello(9)) == (9, False)
    assert tcp_frame.decode_hello(tcp_frame.encode_hello(K_EMPTY)) == (K_EMPTY, False)
    assert tcp_frame.decode_hello(tcp_frame.encode_hello(4, auth=True)) == (4, True)
    assert len(tcp_frame.encode_hello(9)) == tcp_frame.HELLO_BYTES
    assert tcp_frame.encode_hello(9)[0] != 0xFF      # never mistaken for a ZMTP greeting


def test_a_zeromq_greeting_is_named_as_such():
    assert tcp_frame.is_zmtp_signature(ZMTP_GREETING[:10])
    assert not tcp_frame.is_zmtp_signature(tcp_frame.encode_hello(1)[:10])
    with pytest.raises(ProtocolError, match="speaks ZeroMQ.*same van"):
        tcp_frame.decode_hello(ZMTP_GREETING[:16])


def test_a_foreign_or_newer_hello_is_refused():
    with pytest.raises(ProtocolError, match="not a byteps_tcp node"):
        tcp_frame.decode_hello(b"GET / HTTP/1.1\r\n")
    newer = bytearray(tcp_frame.encode_hello(3))
    newer[5] = tcp_frame.VERSION + 1
    with pytest.raises(ProtocolError, match="version %d" % (tcp_frame.VERSION + 1)):
        tcp_frame.decode_hello(bytes(newer))


def test_header_round_trip_and_limits():
    header = tcp_frame.encode_header(b"m" * 7, [8, 1 << 20, 4])
    assert len(header) == tcp_frame.header_size(3)
    assert tcp_frame.decode_header_start(header[:tcp_frame.HEAD_BYTES]) == (7, 3)
    assert tcp_frame.decode_frame_lengths(header[tcp_frame.HEAD_BYTES:], 3) == [8, 1 << 20, 4]
    with pytest.raises(ProtocolError, match="meta length 0"):
        tcp_frame.decode_header_start(struct.pack("<IHH", 0, 0, 0))
    with pytest.raises(ProtocolError, match="data frames exceed"):
        tcp_frame.decode_header_start(struct.pack("<IHH", 5, tcp_frame.MAX_FRAMES + 1, 0))
    with pytest.raises(ProtocolError, match="exceeds"):
        tcp_frame.decode_frame_lengths(struct.pack("<Q", tcp_frame.MAX_FRAME_BYTES + 1), 1)
    with pytest.raises(ProtocolError, match="1 of 2"):
        tcp_frame.decode_frame_lengths(struct.pack("<Q", 5), 2)


# ============================================================================ landing buffers
def test_a_released_buffer_is_reused_and_a_held_one_never():
    pool = RecvBufferPool(min_bytes=16)
    pool.register(5, 64)
    first = pool.take(5, 64)
    address = first.ctypes.data
    view = memoryview(first)[8:16]         # the consumer still looks at it
    del first
    second = pool.take(5, 64)
    assert second.ctypes.data != address   # a new buffer, the held one untouched
    del view, second
    again = pool.take(5, 64)
    assert again.ctypes.data == address
    assert pool.reused == 2 and pool.allocated == 2


def test_register_allocates_before_the_first_message_and_small_frames_are_not_pooled():
    pool = RecvBufferPool(min_bytes=1024)
    pool.register(7, 4096)
    pool.register(7, 4096)          # idempotent
    pool.register(8, 100)           # below min_bytes: nothing to keep
    assert pool.allocated == 1 and pool.total_bytes() == 4096
    pool.take(7, 4096)
    assert pool.reused == 1 and pool.allocated == 1
    pool.take(8, 100)
    assert pool.total_bytes() == 4096


def test_the_pool_keeps_at_most_buffers_per_key():
    pool = RecvBufferPool(min_bytes=1, buffers_per_key=2)
    pool.register(1, 32)
    held = [pool.take(1, 32) for _ in range(4)]
    assert pool.allocated == 4 and pool.total_bytes() == 64
    del held


def test_frames_of_sizes_no_key_registered_reuse_a_bounded_set_of_buffers():
    """Grouped small partitions arrive as frames whose size changes from round to round: the
    pool must not keep buffers for every (key, size) it ever saw (it did: a worker's memory
    grew by 20 MB a second on 1000 small tensors)."""
    pool = RecvBufferPool(min_bytes=1024, buffers_per_key=2)
    for turn in range(300):
        frame = pool.take(turn % 50, 5000 + 37 * turn)     # a new (key, size) every time
        assert frame.nbytes == 5000 + 37 * turn
        frame[:] = 1
        del frame
    # 5000-16063 bytes: the 8 KiB and 16 KiB classes, each buffer reused once free
    assert pool.total_bytes() <= 2 * (8192 + 16384) and pool.allocated <= 4
    held = [pool.take(1, 3000 + i) for i in range(3)]     # a busy one is never handed out
    assert len({frame.ctypes.data for frame in held}) == 3
    assert pool.total_bytes() <= 2 * (4096 + 8192 + 16384)


# ============================================================================ nodes on 127.0.0.1
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
    for po in reversed(nodes):
        po.stop()


@pytest.mark.loopback
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


def send_raw(node, node_id, data):
    """Connect to ``node`` as ``node_id``, send ``data``, wait until the node hangs up."""
    with socket.create_connection(("127.0.0.1", node.my_node.port), timeout=20) as rogue:
        rogue.sendall(tcp_frame.encode_hello(node_id))
        assert tcp_frame.decode_hello(rogue.recv(tcp_frame.HELLO_BYTES, socket.MSG_WAITALL))
        rogue.sendall(data)
        rogue.shutdown(socket.SHUT_WR)
        assert rogue.recv(1) == b""


@pytest.mark.loopback
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


@pytest.mark.loopback
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


@pytest.mark.loopback
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


@pytest.mark.loopback
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


@pytest.mark.loopback
@pytest.mark.timeout(30)
def test_an_unreachable_scheduler_is_named():
    port = free_port()
    po = Postoffice(config(Role.WORKER, port, timeout=1.0))
    with pytest.raises(ClusterStartError, match="127.0.0.1:%d" % port):
        po.start()



# ============================================================================ reader and writer
def stream_of(*messages):
    """The bytes of (meta, frames) messages on the wire."""
    out = b""
    for meta, frames in messages:
        out += tcp_frame.encode_header(meta, [len(f) for f in frames]) + meta + b"".join(frames)
    return out


def chunked(data, sizes):
    """A non-blocking recv_into over ``data``: each call gives at most the next size bytes,
    then BlockingIOError (nothing more now), then EOF once the data is gone and closed."""
    state = {"pos": 0, "turn": 0}

    def recv_into(view):
        if state["pos"] >= len(data):
            raise BlockingIOError
        size = min(sizes[state["turn"] % len(sizes)], view.nbytes, len(data) - state["pos"])
        state["turn"] += 1
        view[:size] = data[state["pos"]:state["pos"] + size]
        state["pos"] += size
        return size
    return recv_into


@pytest.mark.parametrize("sizes", [[1], [7, 3], [65536], [1 << 20]], ids=str)
def test_the_reader_rebuilds_messages_from_any_chunking(sizes):
    from kvstore_byteps.van.tcp_reader import MessageReader
    keys = struct.pack("<Q", 42)
    big = bytes(range(256)) * 1024                 # 256 KiB: lands in a pooled buffer
    messages = [(b"m1", [keys, b"small", b"\x01\x02\x03\x04"]), (b"m2", []),
                (b"m3", [keys, big, b""]), (b"m" * 300000, [b"x"])]   # a meta past read-ahead
    pool = RecvBufferPool(min_bytes=65536)
    reader = MessageReader(pool, land_bytes=65536)
    recv = chunked(stream_of(*messages), sizes)
    got = []
    for _ in range(100000):
        got += reader.read(recv)
        if len(got) == len(messages):
            break
    assert [m for m, _ in got] == [m for m, _ in messages]
    for (_, frames), (_, expected) in zip(got, messages):
        assert [bytes(f) for f in frames] == expected
    assert pool.allocated == 1 and reader.failure is None and not reader.in_message


def test_the_reader_reports_eof_mid_message_and_bad_framing_after_good_messages():
    from kvstore_byteps.van.tcp_reader import MessageReader
    whole = stream_of((b"ok", [b"abc"]))
    for tail, failure in [(b"", EOFError), (stream_of((b"cut", [b"xyz"]))[:-1], EOFError),
                          (struct.pack("<IHH", 0, 0, 0), ProtocolError)]:
        data = whole + tail
        calls = {"n": 0}

        def recv_into(view, data=data):
            calls["n"] += 1
            if calls["n"] > 1:
                return 0                            # closed
            view[:len(data)] = data
            return len(data)
        reader = MessageReader(RecvBufferPool(), land_bytes=65536)
        got = reader.read(recv_into)
        assert [m for m, _ in got] == [b"ok"]
        assert isinstance(reader.failure, failure)
        if failure is EOFError:       # the van says whether a message was cut short
            assert reader.in_message == bool(tail)


def test_an_expected_frame_lands_in_the_consumers_array_and_other_frames_do_not():
    from kvstore_byteps.van.tcp_reader import MessageReader
    big = np.arange(1 << 17, dtype=np.uint32).view(np.uint8)        # 512 KiB
    pool = RecvBufferPool(min_bytes=65536)
    output = np.zeros(3 * big.nbytes, np.uint8)
    target = output[big.nbytes:2 * big.nbytes]                       # a span of the output
    landing = pool.expect(42, target)
    assert pool.expect(42, np.zeros(100, np.uint8)) is None          # too small: not in place
    messages = [(b"other key", [struct.pack("<Q", 7), big.tobytes()]),
                (b"other size", [struct.pack("<Q", 42), big.tobytes()[:-4]]),
                (b"the answer", [struct.pack("<Q", 42), big.tobytes()]),
                (b"a late copy", [struct.pack("<Q", 42), big.tobytes()])]
    reader = MessageReader(pool, land_bytes=65536)
    recv = chunked(stream_of(*messages), [7, 65536, 1000])
    got = []
    for _ in range(100000):
        got += reader.read(recv)
        if len(got) == len(messages):
            break
    assert [bytes(f) for _, frames in got for f in frames[1:]] == \
        [bytes(f) for _, frames in messages for f in frames[1:]]
    landed = [frames[1] for _, frames in got]
    assert landed[2] is target and pool.landed_in_place == 1        # only the expected one
    assert all(frame is not target for i, frame in enumerate(landed) if i != 2)
    np.testing.assert_array_equal(target, big)
    assert not output[:big.nbytes].any() and not output[2 * big.nbytes:].any()
    pool.revoke(landing)                                              # after use: harmless


def test_a_revoked_landing_gets_no_byte_more_even_mid_frame():
    from kvstore_byteps.van.tcp_reader import MessageReader
    big = np.full(1 << 18, 7, np.uint8)
    pool = RecvBufferPool(min_bytes=65536)
    target = np.zeros(big.nbytes, np.uint8)
    landing = pool.expect(3, target)
    stream = stream_of((b"answer", [struct.pack("<Q", 3), big.tobytes()]))
    head = len(stream) - big.nbytes + 1000          # everything up to 1000 bytes of the frame
    reader = MessageReader(pool, land_bytes=65536, read_ahead_bytes=1 << 17)
    assert reader.read(chunked(stream[:head], [head])) == []
    written = int(np.count_nonzero(target))
    assert 0 < written <= 1000                      # landing had begun
    pool.revoke(landing)                            # e.g. the request timed out meanwhile
    got = reader.read(chunked(stream[head:], [4096]))
    assert np.count_nonzero(target) == written      # nothing more was written there
    assert len(got) == 1 and got[0][1][1] is not target
    assert reader.failure is None and not reader.in_message
    # and an expectation revoked before its frame comes is simply gone
    landing = pool.expect(3, target)
    pool.revoke(landing)
    got = MessageReader(pool, land_bytes=65536).read(chunked(stream, [len(stream)]))
    assert got[0][1][1] is not target and pool.landed_in_place == 1


def test_the_reader_says_how_much_of_a_large_frame_is_missing():
    from kvstore_byteps.van.tcp_reader import MessageReader
    big = bytes(200000)
    stream = stream_of((b"big", [struct.pack("<Q", 1), big]), (b"small", [b"x" * 1000]))
    head = len(stream) - len(big) - len(stream_of((b"small", [b"x" * 1000]))) + 5000
    reader = MessageReader(RecvBufferPool(min_bytes=65536), land_bytes=65536)
    assert reader.frame_bytes_missing == 0
    assert reader.read(chunked(stream[:head], [head])) == []
    assert reader.frame_bytes_missing == len(big) - 5000
    got = reader.read(chunked(stream[head:], [len(stream)]))
    assert [m for m, _ in got] == [b"big", b"small"]
    assert reader.frame_bytes_missing == 0            # small frames never raise it
    small_only = stream_of((b"small", [b"x" * 60000]))
    assert reader.read(chunked(small_only[:30000], [30000])) == []
    assert reader.frame_bytes_missing == 0 and reader.in_message


def _connected_pair():
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname(), timeout=20)
    server, _ = listener.accept()
    listener.close()
    return client, server


def _low_water(sock) -> int:
    return sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT)


@pytest.mark.loopback
@pytest.mark.timeout(60)
def test_the_receive_loop_waits_for_a_large_frame_whole_then_for_any_byte():
    """While a large frame arrives, the connection is readable only once the frame can
    complete (SO_RCVLOWAT); between frames, one byte wakes it (a small message must not wait)."""
    van = TcpVan(Config(van_type=VanType.BYTEPS_TCP))
    client, server = _connected_pair()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 200000)    # room for a 90 KB mark
    inbound = _Inbound(server, 9, "127.0.0.1:1", van.pool)
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


@pytest.mark.loopback
def test_the_low_water_mark_stays_below_a_quarter_of_the_receive_buffer():
    van = TcpVan(Config(van_type=VanType.BYTEPS_TCP))
    client, server = _connected_pair()
    try:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 200000)
        room = server.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) // 4
        inbound = _Inbound(server, 9, "127.0.0.1:1", van.pool)
        inbound.wake_for(4 << 20)
        assert _low_water(server) == room < 4 << 20
        inbound.wake_for(1000)              # too little to be worth a mark
        assert _low_water(server) == 1
    finally:
        client.close()
        server.close()
        van.close()


@pytest.mark.loopback
def test_a_full_socket_queues_the_rest_and_keeps_the_order():
    from kvstore_byteps.van.tcp_outbound import Outbound, advance
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
