"""The soft provider's fabric (van/rdma/verbs/soft_fabric.py): devices joined by Unix sockets."""
import os
import socket
import threading
import time

import numpy as np
import pytest

from kvstore_byteps.van.rdma.verbs.api import (SGE, Access, Opcode, QPCaps, RecvWR, SendWR,
                                          VerbsError, WCStatus)
from kvstore_byteps.van.rdma.verbs.soft import Packet
from kvstore_byteps.van.rdma.verbs.soft_fabric import UnixFabric, decode_header, encode

RW = Access.LOCAL_WRITE | Access.REMOTE_WRITE


def poll_until(cq, count, seconds=10.0):
    got, deadline = [], time.monotonic() + seconds
    while len(got) < count:
        got += cq.poll()
        if time.monotonic() > deadline:
            raise AssertionError("%d of %d completions in %.0f s" % (len(got), count, seconds))
        time.sleep(0.001)
    return got


@pytest.fixture
def two_devices():
    fabrics = [UnixFabric(), UnixFabric()]
    sides = []
    for fabric in fabrics:
        device = fabric.device()
        pd = device.alloc_pd()
        cq = device.create_cq(256)
        qp = device.create_qp(pd, cq, cq, QPCaps(max_send_wr=64, max_recv_wr=64))
        memory = np.zeros(1 << 20, np.uint8)
        sides.append((qp, cq, memory, pd.reg_mr(memory, RW)))
    for (qp, *_), (peer, *_) in zip(sides, reversed(sides)):
        qp.to_init(Access.REMOTE_WRITE)
        qp.to_rtr(peer.endpoint)
        qp.to_rts()
    yield sides
    for fabric in fabrics:
        fabric.close()


def test_writes_and_sends_cross_the_sockets_in_order(two_devices):
    (qa, cqa, ma, mra), (qb, cqb, mb, mrb) = two_devices
    for i in range(50):
        qb.post_recv(RecvWR(i, [SGE(mrb.addr + 8192 * i, 8192, mrb.lkey)]))
    ma[:] = np.arange(ma.size) % 251
    for i in range(50):
        opcode = Opcode.RDMA_WRITE_WITH_IMM if i % 2 else Opcode.SEND_WITH_IMM
        qa.post_send(SendWR(i, opcode, [SGE(mra.addr + 4096 * i, 4096, mra.lkey)],
                            remote_addr=mrb.addr + 500000 + 4096 * i, rkey=mrb.rkey,
                            imm_data=1000 + i))
    received = poll_until(cqb, 50)
    assert [c.imm_data for c in received] == [1000 + i for i in range(50)]
    assert all(c.status is WCStatus.SUCCESS and c.byte_len == 4096 for c in received)
    assert [c.wr_id for c in poll_until(cqa, 50)] == list(range(50))
    for i in range(50):
        at = 500000 + 4096 * i if i % 2 else 8192 * i
        assert (mb[at:at + 4096] == ma[4096 * i:4096 * (i + 1)]).all(), i


def test_an_error_from_the_other_process_reaches_the_sender(two_devices):
    (qa, cqa, _, mra), (_, _, _, mrb) = two_devices
    qa.post_send(SendWR(1, Opcode.RDMA_WRITE, [SGE(mra.addr, 64, mra.lkey)],
                        remote_addr=mrb.addr, rkey=mrb.rkey ^ 0x5A))
    assert poll_until(cqa, 1)[0].status is WCStatus.REM_ACCESS_ERR


def test_a_peer_nobody_listens_at_fails_the_send():
    fabric = UnixFabric()
    try:
        device = fabric.device()
        pd, cq = device.alloc_pd(), device.create_cq(8)
        qp = device.create_qp(pd, cq, cq)
        memory = np.zeros(64, np.uint8)
        mr = pd.reg_mr(memory, RW)
        qp.to_init(Access(0))
        qp.to_rtr(type(qp.endpoint)("@kvstore-byteps-soft-nobody", 5))
        qp.to_rts()
        qp.post_send(SendWR(1, Opcode.SEND, [SGE(mr.addr, 64, mr.lkey)]))
        assert poll_until(cq, 1)[0].status is WCStatus.RETRY_EXC_ERR
    finally:
        fabric.close()


@pytest.mark.timeout(60)
def test_a_peer_that_stops_reading_is_given_up_without_holding_up_the_others(two_devices):
    """A peer whose device takes nothing (hung, stopped) must not block its senders forever,
    nor the sends to anybody else meanwhile."""
    (qa, cqa, ma, mra), (qb, cqb, mb, mrb) = two_devices
    stalled = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)     # accepts, never reads
    name = "kvstore-byteps-soft-stalled-%d-%s" % (os.getpid(), os.urandom(4).hex())
    stalled.bind("\0" + name)
    stalled.listen(1)
    fabric = qa.device.fabric
    fabric.send_timeout = 3.0
    cq = qa.device.create_cq(256)
    stuck = qa.device.create_qp(mra.pd, cq, cq, QPCaps(max_send_wr=64))
    stuck.to_init(Access(0))
    stuck.to_rtr(type(stuck.endpoint)("@" + name, 5))
    stuck.to_rts()
    errors = []

    def flood():          # 64 x 1 MiB: far beyond what the socket buffers take
        try:
            for i in range(64):
                stuck.post_send(SendWR(i, Opcode.SEND, [SGE(mra.addr, mra.length, mra.lkey)]))
        except VerbsError as exc:           # posting on the queue pair failed meanwhile
            errors.append(exc)
    flooder = threading.Thread(target=flood, daemon=True)
    started = time.monotonic()
    flooder.start()
    time.sleep(0.3)                         # the flood is stuck in the stalled socket now
    qb.post_recv(RecvWR(7, [SGE(mrb.addr, 64, mrb.lkey)]))
    qa.post_send(SendWR(8, Opcode.SEND, [SGE(mra.addr, 64, mra.lkey)]))
    assert poll_until(cqb, 1)[0].wr_id == 7             # the healthy peer is not held up
    assert time.monotonic() - started < 2.0          # well before the flood is given up
    flooder.join(10)
    assert not flooder.is_alive()
    failed = poll_until(cq, 1)
    assert failed[0].status is WCStatus.RETRY_EXC_ERR   # given up, as a NIC's retries end
    assert "ERROR" in str(errors[0])                    # later posts: the queue pair failed
    assert 2.5 < time.monotonic() - started < 15
    stalled.close()


def test_packets_round_trip_and_malformed_headers_are_refused():
    packet = Packet("@x", 1, 2, 3, Opcode.RDMA_WRITE_WITH_IMM, b"abc", 77, 9, 5,
                    WCStatus.REM_ACCESS_ERR)
    data = encode(packet)
    fields, source_len, payload_len = decode_header(data[:len(data) - 5])
    assert (source_len, payload_len) == (2, 3) and fields["imm_data"] == 5
    assert fields["answer"] is WCStatus.REM_ACCESS_ERR and fields["opcode"] is packet.opcode
    with pytest.raises(VerbsError, match="malformed"):
        decode_header(bytes([200]) + data[1:len(data) - 5])
