"""The BytePS TCP van's pure parts: hello and header format, the receive-buffer pool, the reader."""
import struct

import numpy as np
import pytest

from kvstore_byteps.errors import ProtocolError
from kvstore_byteps.van.tcp import frame as tcp_frame
from kvstore_byteps.van.wire.message import K_EMPTY
from kvstore_byteps.van.tcp.recv_buffers import RecvBufferPool


ZMTP_GREETING = b"\xff" + b"\x00" * 8 + b"\x7f" + b"\x03\x00NULL" + b"\x00" * 48


def test_hello_carries_the_node_id_or_none():
    assert tcp_frame.decode_hello(tcp_frame.encode_hello(9)) == (9, False, False)
    assert tcp_frame.decode_hello(tcp_frame.encode_hello(K_EMPTY)) == (K_EMPTY, False, False)
    assert tcp_frame.decode_hello(tcp_frame.encode_hello(4, auth=True)) == (4, True, False)
    assert tcp_frame.decode_hello(tcp_frame.encode_hello(4, rdma=True)) == (4, False, True)
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


def test_a_short_read_ends_the_call_without_another_recv():
    # A recv that returns less than it was offered emptied the socket: asking again would
    # only fail with EAGAIN (a system call and an exception per wake-up); level-triggered
    # readiness brings the van back when more comes.
    from kvstore_byteps.van.tcp.reader import MessageReader
    stream = stream_of((b"m1", [struct.pack("<Q", 7), b"small"]), (b"m2", []))
    calls = []

    def recv_into(view):
        calls.append(view.nbytes)
        if len(calls) > 1:
            raise AssertionError("a second recv after a short read")
        view[:len(stream)] = stream
        return len(stream)
    reader = MessageReader(RecvBufferPool(min_bytes=65536), land_bytes=65536)
    assert [meta for meta, _ in reader.read(recv_into)] == [b"m1", b"m2"]
    assert len(calls) == 1 and reader.failure is None and not reader.in_message


@pytest.mark.parametrize("sizes", [[1], [7, 3], [65536], [1 << 20]], ids=str)
def test_the_reader_rebuilds_messages_from_any_chunking(sizes):
    from kvstore_byteps.van.tcp.reader import MessageReader
    keys = struct.pack("<Q", 42)
    big = bytes(range(256)) * 1024                 # 256 KiB: lands in a pooled buffer
    messages = [(b"m1", [keys, b"small", b"\x01\x02\x03\x04"]), (b"m2", []),
                (b"m3", [keys, big, b""]), (b"m" * 300000, [b"x"])]   # a meta past read-ahead
    pool = RecvBufferPool(min_bytes=65536)
    reader = MessageReader(pool, land_bytes=65536)
    stream = stream_of(*messages)
    recv = chunked(stream, sizes)
    got = []
    for _ in range(len(stream) + 100):    # a short read ends a call: one byte a call at worst
        got += reader.read(recv)
        if len(got) == len(messages):
            break
    assert [m for m, _ in got] == [m for m, _ in messages]
    for (_, frames), (_, expected) in zip(got, messages):
        assert [bytes(f) for f in frames] == expected
    assert pool.allocated == 1 and reader.failure is None and not reader.in_message


def test_a_large_frame_comes_almost_all_straight_into_its_buffer():
    # what sits in the read-ahead buffer when a large frame starts is copied again, GIL held
    from kvstore_byteps.van.tcp.reader import MessageReader
    big = bytes(range(256)) * 3072                                   # 768 KiB
    acks = [(b"ack %d" % i, [struct.pack("<Q", i)]) for i in range(50)]
    stream = stream_of(*acks, (b"answer", [struct.pack("<Q", 9), big]), *acks)
    into = {"read-ahead": 0, "frame": 0}
    whole = chunked(stream, [len(stream)])                            # all there at once

    def recv_into(view):
        got = whole(view)
        into["read-ahead" if isinstance(view.obj, bytearray) else "frame"] += got
        return got
    reader = MessageReader(RecvBufferPool(min_bytes=65536), land_bytes=65536)
    got = reader.read(recv_into)
    assert [m for m, _ in got] == [m for m, _ in acks + [(b"answer", [])] + acks]
    assert bytes(got[50][1][1]) == big and reader.failure is None
    assert into["frame"] >= len(big) - (16 << 10)
    assert into["read-ahead"] + into["frame"] == len(stream)


def test_the_reader_reports_eof_mid_message_and_bad_framing_after_good_messages():
    from kvstore_byteps.van.tcp.reader import MessageReader
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
        if reader.failure is None:    # the short read ended the call; EOF comes on the next
            assert failure is EOFError
            got += reader.read(recv_into)
        assert [m for m, _ in got] == [b"ok"]
        assert isinstance(reader.failure, failure)
        if failure is EOFError:       # the van says whether a message was cut short
            assert reader.in_message == bool(tail)


def test_an_expected_frame_lands_in_the_consumers_array_and_other_frames_do_not():
    from kvstore_byteps.van.tcp.reader import MessageReader
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
    from kvstore_byteps.van.tcp.reader import MessageReader
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
    recv, got = chunked(stream[head:], [4096]), []
    for _ in range(1000):                           # 4 KB a call (each a short read)
        got += reader.read(recv)
        if got:
            break
    assert np.count_nonzero(target) == written      # nothing more was written there
    assert len(got) == 1 and got[0][1][1] is not target
    assert reader.failure is None and not reader.in_message
    # and an expectation revoked before its frame comes is simply gone
    landing = pool.expect(3, target)
    pool.revoke(landing)
    got = MessageReader(pool, land_bytes=65536).read(chunked(stream, [len(stream)]))
    assert got[0][1][1] is not target and pool.landed_in_place == 1


def test_the_reader_says_how_much_of_a_large_frame_is_missing():
    from kvstore_byteps.van.tcp.reader import MessageReader
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


def test_the_receive_buffer_size_is_read_once_per_many_large_frames():
    # SO_RCVBUF bounds the low-water mark; reading it for every large frame was a system call
    # (and an interpreter-lock hand-off) per frame. The kernel only grows it: read it again
    # now and then, and meanwhile use the last reading.
    import socket
    from kvstore_byteps.van.tcp import inbound as tcp_inbound

    class Sock:
        def __init__(self):
            self.reads, self.rcvbuf, self.marks = 0, 400000, []

        def setblocking(self, flag):
            pass

        def getsockopt(self, level, name):
            assert (level, name) == (socket.SOL_SOCKET, socket.SO_RCVBUF)
            self.reads += 1
            return self.rcvbuf

        def setsockopt(self, level, name, value):
            assert (level, name) == (socket.SOL_SOCKET, socket.SO_RCVLOWAT)
            self.marks.append(value)

    sock = Sock()
    inbound = tcp_inbound.Inbound(sock, 9, "127.0.0.1:1", RecvBufferPool())
    frames = 3 * tcp_inbound._RCVBUF_READ_EVERY
    for turn in range(frames):
        inbound.wake_for(1 << 20)           # a large frame: mark up to a quarter of the buffer
        inbound.wake_for(0)                 # done: back to 1 byte
        if turn == tcp_inbound._RCVBUF_READ_EVERY - 1:
            sock.rcvbuf = 800000            # the kernel grew it
    assert sock.reads == frames // tcp_inbound._RCVBUF_READ_EVERY
    assert sock.marks[0] == 100000 and sock.marks[-2] == 200000 and sock.marks[-1] == 1
    assert max(sock.marks) <= 200000


def test_header_fields_are_read_at_an_offset_and_a_short_header_is_refused():
    header = tcp_frame.encode_header(b"meta", [8, 4])
    data = b"xyz" + header
    assert tcp_frame.decode_header_start(data, 3) == (4, 2)
    assert tcp_frame.decode_frame_lengths(data, 2, 3 + tcp_frame.HEAD_BYTES) == [8, 4]
    with pytest.raises(ProtocolError, match="header has 1 of 2 frame lengths"):
        tcp_frame.decode_frame_lengths(data[:-1], 2, 3 + tcp_frame.HEAD_BYTES)
