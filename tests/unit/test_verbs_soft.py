"""The soft verbs provider (van/rdma/verbs/soft.py) enforces what the byteps_rdma van relies on.

Two devices joined in one process (InProcessFabric); every refusal a van bug would meet."""
import numpy as np
import pytest

from kvstore_byteps.van.rdma.verbs.api import (SGE, Access, Opcode, QPCaps, QPState, RecvWR, SendWR,
                                          VerbsError, WCOpcode, WCStatus)
from kvstore_byteps.van.rdma.verbs.soft import InProcessFabric

RW = Access.LOCAL_WRITE | Access.REMOTE_WRITE


class Side:
    """One device with a PD, a CQ, a QP and a 4 KB region."""

    def __init__(self, fabric, caps=QPCaps(max_send_wr=4, max_recv_wr=4, max_sge=2),
                 cq_depth=16, access=RW):
        self.device = fabric.device()
        self.pd = self.device.alloc_pd()
        self.cq = self.device.create_cq(cq_depth)
        self.qp = self.device.create_qp(self.pd, self.cq, self.cq, caps)
        self.memory = np.zeros(4096, np.uint8)
        self.mr = self.pd.reg_mr(self.memory, access)

    def sge(self, offset=0, length=64):
        return SGE(self.mr.addr + offset, length, self.mr.lkey)


def pair(**options):
    fabric = InProcessFabric()
    a, b = Side(fabric, **options), Side(fabric, **options)
    for me, peer in ((a, b), (b, a)):
        me.qp.to_init(Access.REMOTE_WRITE)
        me.qp.to_rtr(peer.qp.endpoint)
        me.qp.to_rts()
    return a, b


def test_send_lands_in_the_posted_receive_and_both_sides_complete_in_order():
    a, b = pair()
    b.qp.post_recv(RecvWR(7, [b.sge(0, 100)]))
    a.memory[:5] = list(b"hello")
    a.qp.post_send(SendWR(1, Opcode.SEND_WITH_IMM, [a.sge(0, 5)], imm_data=42))
    (recv,) = b.cq.poll()
    assert (recv.wr_id, recv.status, recv.opcode, recv.byte_len, recv.imm_data) == \
        (7, WCStatus.SUCCESS, WCOpcode.RECV, 5, 42)
    assert bytes(b.memory[:5]) == b"hello"
    (sent,) = a.cq.poll()
    assert (sent.wr_id, sent.status, sent.opcode) == (1, WCStatus.SUCCESS, WCOpcode.SEND)


def test_write_with_immediate_lands_at_the_remote_address_and_names_itself():
    a, b = pair()
    b.qp.post_recv(RecvWR(9, []))
    a.memory[:8] = np.arange(8)
    a.qp.post_send(SendWR(2, Opcode.RDMA_WRITE_WITH_IMM, [a.sge(0, 8)],
                          remote_addr=b.mr.addr + 100, rkey=b.mr.rkey, imm_data=0xBEEF))
    assert list(b.memory[100:108]) == list(range(8))
    (recv,) = b.cq.poll()
    assert (recv.opcode, recv.byte_len, recv.imm_data) == (WCOpcode.RECV_RDMA_WITH_IMM, 8, 0xBEEF)
    assert a.cq.poll()[0].opcode is WCOpcode.RDMA_WRITE


def test_a_send_without_a_posted_receive_is_an_rnr_error_and_the_qp_fails():
    a, b = pair()
    a.qp.post_recv(RecvWR(5, [a.sge(1000, 64)]))
    a.qp.post_send(SendWR(1, Opcode.SEND, [a.sge()]))
    completions = a.cq.poll()
    assert [(c.wr_id, c.status) for c in completions] == [
        (1, WCStatus.RNR_RETRY_EXC_ERR), (5, WCStatus.WR_FLUSH_ERR)]
    assert a.qp.state is QPState.ERROR
    with pytest.raises(VerbsError, match="sends need RTS"):
        a.qp.post_send(SendWR(2, Opcode.SEND, [a.sge()]))


@pytest.mark.parametrize("wrong", ["rkey", "bounds", "no remote write on region",
                                   "no remote write on qp"])
def test_remote_writes_outside_what_was_granted_fail_with_a_remote_access_error(wrong):
    a, b = pair()
    addr, rkey = b.mr.addr, b.mr.rkey
    if wrong == "rkey":
        rkey ^= 1
    elif wrong == "bounds":
        addr += 4096 - 4
    elif wrong == "no remote write on region":
        local = b.pd.reg_mr(np.zeros(64, np.uint8), Access.LOCAL_WRITE)
        addr, rkey = local.addr, local.rkey
    else:
        b.qp.access = Access(0)
    a.qp.post_send(SendWR(1, Opcode.RDMA_WRITE, [a.sge(0, 8)], remote_addr=addr, rkey=rkey))
    assert a.cq.poll()[0].status is WCStatus.REM_ACCESS_ERR
    assert a.qp.state is QPState.ERROR and not b.memory.any()


def test_a_deregistered_region_is_gone_for_local_and_remote_use():
    a, b = pair()
    b.mr.dereg()
    a.qp.post_send(SendWR(1, Opcode.RDMA_WRITE, [a.sge()], remote_addr=b.mr.addr,
                          rkey=b.mr.rkey))
    assert a.cq.poll()[0].status is WCStatus.REM_ACCESS_ERR
    with pytest.raises(VerbsError, match="not a region of this QP's PD"):
        b.qp.post_recv(RecvWR(1, [b.sge()]))


def test_a_receive_too_small_fails_both_sides():
    a, b = pair()
    b.qp.post_recv(RecvWR(3, [b.sge(0, 4)]))
    a.qp.post_send(SendWR(1, Opcode.SEND, [a.sge(0, 8)]))
    assert b.cq.poll()[0].status is WCStatus.LOC_LEN_ERR
    assert a.cq.poll()[0].status is WCStatus.REM_INV_REQ_ERR
    assert a.qp.state is QPState.ERROR and b.qp.state is QPState.ERROR


def test_local_elements_are_checked_when_posted():
    a, b = pair()
    with pytest.raises(VerbsError, match="outside region"):
        a.qp.post_send(SendWR(1, Opcode.SEND, [a.sge(4090, 64)]))
    with pytest.raises(VerbsError, match="max_sge 2"):
        b.qp.post_recv(RecvWR(1, [b.sge()] * 3))
    read_only = b.pd.reg_mr(np.zeros(64, np.uint8), Access(0))
    with pytest.raises(VerbsError, match="lacks"):
        b.qp.post_recv(RecvWR(1, [SGE(read_only.addr, 64, read_only.lkey)]))
    other = b.device.alloc_pd().reg_mr(np.zeros(64, np.uint8), RW)
    with pytest.raises(VerbsError, match="not a region of this QP's PD"):
        b.qp.post_recv(RecvWR(1, [SGE(other.addr, 64, other.lkey)]))
    with pytest.raises(VerbsError, match="REMOTE_WRITE needs LOCAL_WRITE"):
        b.pd.reg_mr(np.zeros(8, np.uint8), Access.REMOTE_WRITE)


def test_work_request_limits_count_unsignaled_sends_until_a_signaled_one_completes():
    a, b = pair()
    for i in range(4):
        b.qp.post_recv(RecvWR(i, [b.sge(64 * i)]))
    with pytest.raises(VerbsError, match="max_recv_wr 4"):
        b.qp.post_recv(RecvWR(9, [b.sge()]))
    for i in range(3):
        a.qp.post_send(SendWR(i, Opcode.SEND, [a.sge(0, 8)], signaled=False))
    a.qp.post_send(SendWR(3, Opcode.RDMA_WRITE, [a.sge(0, 8)], remote_addr=b.mr.addr,
                          rkey=b.mr.rkey, signaled=False))
    with pytest.raises(VerbsError, match="max_send_wr 4"):     # four unsignaled outstanding
        a.qp.post_send(SendWR(4, Opcode.RDMA_WRITE, [a.sge(0, 8)], remote_addr=b.mr.addr,
                              rkey=b.mr.rkey))
    assert a.cq.poll() == [] and len(b.cq.poll()) == 3


def test_a_signaled_completion_retires_the_unsignaled_sends_before_it():
    a, b = pair()
    write = dict(remote_addr=b.mr.addr, rkey=b.mr.rkey)
    for i in range(3):
        a.qp.post_send(SendWR(i, Opcode.RDMA_WRITE, [a.sge(0, 8)], signaled=False, **write))
    a.qp.post_send(SendWR(3, Opcode.RDMA_WRITE, [a.sge(0, 8)], **write))
    assert [c.wr_id for c in a.cq.poll()] == [3]
    for i in range(4):                                  # all four slots free again
        a.qp.post_send(SendWR(10 + i, Opcode.RDMA_WRITE, [a.sge(0, 8)], **write))
    assert [c.wr_id for c in a.cq.poll()] == [10, 11, 12, 13]


def test_only_reset_init_rtr_rts_in_order():
    fabric = InProcessFabric()
    a, b = Side(fabric), Side(fabric)
    with pytest.raises(VerbsError, match="RESET -> RTR"):
        a.qp.to_rtr(b.qp.endpoint)
    with pytest.raises(VerbsError, match="in RESET"):
        a.qp.post_recv(RecvWR(1, [a.sge()]))
    a.qp.to_init(Access.REMOTE_WRITE)
    a.qp.post_recv(RecvWR(1, [a.sge()]))               # receives may be posted from INIT
    with pytest.raises(VerbsError, match="sends need RTS"):
        a.qp.post_send(SendWR(1, Opcode.SEND, [a.sge()]))
    with pytest.raises(VerbsError, match="INIT -> RTS"):
        a.qp.to_rts()


def test_a_packet_for_a_qp_not_connected_to_the_sender_is_not_answered():
    fabric = InProcessFabric()
    a, b, c = Side(fabric), Side(fabric), Side(fabric)
    for qp, peer in ((a.qp, b.qp), (b.qp, c.qp)):          # b listens to c, not to a
        qp.to_init(Access.REMOTE_WRITE)
        qp.to_rtr(peer.endpoint)
        qp.to_rts()
    b.qp.post_recv(RecvWR(1, [b.sge()]))
    a.qp.post_send(SendWR(1, Opcode.SEND, [a.sge()]))
    assert a.cq.poll()[0].status is WCStatus.RETRY_EXC_ERR and b.cq.poll() == []


class _Blackhole(InProcessFabric):
    """Carries nothing to the peer: every send stays unanswered (a peer process that died)."""

    def send(self, address, packet):
        pass


def test_when_the_peer_device_is_gone_unanswered_sends_fail_and_the_rest_flush():
    fabric = _Blackhole()
    a, b = Side(fabric), Side(fabric)
    a.qp.to_init(Access.REMOTE_WRITE)
    a.qp.to_rtr(b.qp.endpoint)
    a.qp.to_rts()
    a.qp.post_send(SendWR(1, Opcode.SEND, [a.sge()]))
    a.qp.post_send(SendWR(2, Opcode.SEND, [a.sge()]))
    assert a.cq.poll() == []                                # unanswered: nothing completes
    a.device.peer_gone("somewhere-else")                    # another peer: nothing changes
    assert a.cq.poll() == [] and a.qp.state is QPState.RTS
    a.device.peer_gone(b.device.address)
    first, second = a.cq.poll()
    assert (first.wr_id, first.status) == (1, WCStatus.RETRY_EXC_ERR)
    assert (second.wr_id, second.status) == (2, WCStatus.WR_FLUSH_ERR)
    assert a.qp.state is QPState.ERROR


def test_unpolled_completions_beyond_the_depth_are_an_overrun():
    a, b = pair(cq_depth=2)
    write = dict(remote_addr=b.mr.addr, rkey=b.mr.rkey)
    for i in range(3):
        a.qp.post_send(SendWR(i, Opcode.RDMA_WRITE, [a.sge(0, 8)], **write))
    with pytest.raises(VerbsError, match="CQ overrun"):
        a.cq.poll()
