"""The pyverbs provider (van/rdma/verbs/pyverbs_provider.py) without an RDMA device.

Against a recording stand-in (tests/support/fake_pyverbs.py): what it asks of pyverbs for
each verbs call of the van, the translations (access flags, QP attributes, work requests,
completions, endpoints), the GID choice, and the one-line errors. Where pyverbs is installed:
every call recorded binds to pyverbs' own signature, the attribute and work request objects
build from pyverbs' real classes, and opening a device on a machine without one gives the
one-line error.
"""
import inspect
import re
import socket
import sys

import numpy as np
import pytest

from kvstore_byteps.errors import ConfigError
from kvstore_byteps.van.rdma.verbs import pyverbs_provider as provider
from kvstore_byteps.van.rdma.verbs.api import (SGE, Access, Endpoint, Opcode, QPCaps, QPState,
                                          RecvWR, SendWR, VerbsError, WCOpcode, WCStatus)
from tests.support import fake_pyverbs

REMOTE_GID = "0000:0000:0000:0000:0000:ffff:c612:0002"


def _calls(pv, name):
    return [(args, kwargs) for what, args, kwargs in pv.calls if what == name]


def _lifecycle(pv):
    """What the van does with a device, start to end; the objects it made."""
    device = provider.PyverbsDevice(None, 1, None, pv=pv)
    pd = device.alloc_pd()
    buffer = np.zeros(4096, np.uint8)
    region = pd.reg_mr(buffer, Access.LOCAL_WRITE | Access.REMOTE_WRITE)
    cq = device.create_cq(1 << 16)
    qp = device.create_qp(pd, cq, cq, QPCaps(max_send_wr=64, max_recv_wr=32, max_sge=1))
    qp.to_init(Access.REMOTE_WRITE)
    qp.post_recv(RecvWR(7, [SGE(region.addr, 1024, region.lkey)]))
    qp.to_rtr(Endpoint(provider.encode_address(REMOTE_GID, 0, pv.e.IBV_MTU_4096), 0x99))
    qp.to_rts()
    qp.post_send(SendWR(1, Opcode.SEND, [SGE(region.addr, 100, region.lkey)]))
    qp.post_send(SendWR(2, Opcode.RDMA_WRITE, [SGE(region.addr, 64, region.lkey)],
                        remote_addr=0x7000, rkey=0x55, signaled=False))
    qp.post_send(SendWR(3, Opcode.RDMA_WRITE_WITH_IMM, [SGE(region.addr, 64, region.lkey)],
                        remote_addr=0x8000, rkey=0x56, imm_data=0x01020304))
    cq.req_notify()
    cq.channel.pending = 1                  # one completion event came
    cq.ack_events()
    completions = cq.poll(16)
    qp.to_error()
    region.dereg()
    cq.close()
    device.close()
    return device, qp, completions


def test_the_van_s_calls_become_these_pyverbs_calls():
    pv = fake_pyverbs.make()
    device, qp, _ = _lifecycle(pv)
    assert device.name == "mlx5_0"
    # the RoCE v2 GID holding an IPv4 address (index 2), the port's LID and MTU
    assert device.port.gid_index == 2 and device.port.ethernet
    assert device.address == "0000:0000:0000:0000:0000:ffff:c612:0001|0|%d" % pv.e.IBV_MTU_1024
    (args, kwargs), = _calls(pv, "MR")
    assert args[1] == 4096 and args[2] == pv.e.IBV_ACCESS_LOCAL_WRITE | \
        pv.e.IBV_ACCESS_REMOTE_WRITE and kwargs["address"] != 0
    (args, _), = _calls(pv, "CQ")
    assert args[1] == 32767                      # the device's max_cqe, not 65536
    (_, init), = _calls(pv, "QPInitAttr")
    assert init["qp_type"] == pv.e.IBV_QPT_RC and init["sq_sig_all"] == 0
    (_, cap), = _calls(pv, "QPCap")
    assert (cap["max_send_wr"], cap["max_recv_wr"], cap["max_send_sge"]) == (64, 32, 1)
    (attr,), _ = _calls(pv, "QP.to_init")[0]
    assert attr.qp_access_flags == pv.e.IBV_ACCESS_REMOTE_WRITE and attr.pkey_index == 0
    (attr,), _ = _calls(pv, "QP.to_rtr")[0]
    assert attr.path_mtu == pv.e.IBV_MTU_1024            # the smaller of the two ports'
    assert attr.dest_qp_num == 0x99 and attr.rq_psn == 0x99
    assert attr.ah_attr.is_global == 1 and str(attr.ah_attr.dgid) == REMOTE_GID
    assert attr.ah_attr.sgid_index == 2
    (attr,), _ = _calls(pv, "QP.to_rts")[0]
    assert attr.sq_psn == qp.qp_num and attr.rnr_retry == 0 and attr.retry_cnt == 7
    sends = [args[0] for args, _ in _calls(pv, "QP.post_send")]
    assert [w.opcode for w in sends] == [pv.e.IBV_WR_SEND, pv.e.IBV_WR_RDMA_WRITE,
                                         pv.e.IBV_WR_RDMA_WRITE_WITH_IMM]
    assert [w.send_flags for w in sends] == [pv.e.IBV_SEND_SIGNALED, 0,
                                             pv.e.IBV_SEND_SIGNALED]
    assert sends[2].imm_data == socket.htonl(0x01020304) and sends[2].rdma == (0x56, 0x8000)
    assert sends[1].rdma == (0x55, 0x7000) and not hasattr(sends[0], "rdma")
    (attr, mask), _ = _calls(pv, "QP.modify")[0]
    assert attr.qp_state == pv.e.IBV_QPS_ERR and mask == pv.e.IBV_QP_STATE
    assert qp.state is QPState.ERROR
    assert _calls(pv, "MR.close") and _calls(pv, "Context.close")


def test_completions_translate_status_opcode_and_immediate():
    pv = fake_pyverbs.make()
    device = provider.PyverbsDevice(None, pv=pv)
    cq = device.create_cq(64)
    cq.cq.wcs = [
        pv.WC(wr_id=5, status=pv.e.IBV_WC_SUCCESS, opcode=pv.e.IBV_WC_RECV_RDMA_WITH_IMM,
              byte_len=4096, qp_num=0x11, imm_data=socket.htonl(9),
              wc_flags=pv.e.IBV_WC_WITH_IMM),
        pv.WC(wr_id=6, status=pv.e.IBV_WC_SUCCESS, opcode=pv.e.IBV_WC_RECV, byte_len=10,
              qp_num=0x11, imm_data=1234, wc_flags=0),
        pv.WC(wr_id=7, status=pv.e.IBV_WC_RNR_RETRY_EXC_ERR, opcode=999, byte_len=77,
              qp_num=0x11, imm_data=0, wc_flags=0),
        pv.WC(wr_id=8, status=pv.e.IBV_WC_GENERAL_ERR, opcode=0, byte_len=0, qp_num=0x11,
              imm_data=0, wc_flags=0)]
    first, second, third, fourth = cq.poll(16)
    assert (first.opcode, first.imm_data, first.byte_len) == \
        (WCOpcode.RECV_RDMA_WITH_IMM, 9, 4096)
    assert second.opcode is WCOpcode.RECV and second.imm_data is None   # no WITH_IMM flag
    assert third.status is WCStatus.RNR_RETRY_EXC_ERR and third.opcode is None
    assert third.byte_len == 0
    assert fourth.status is WCStatus.OTHER_ERR


def test_completion_events_are_drained_and_acknowledged_together():
    pv = fake_pyverbs.make()
    cq = provider.PyverbsDevice(None, pv=pv).create_cq(64)
    cq.channel.pending = 3
    cq.ack_events()
    assert _calls(pv, "CQ.ack_events") == [((3,), {})]
    cq.ack_events()                                  # none pending: nothing acknowledged
    assert len(_calls(pv, "CQ.ack_events")) == 1
    cq.close()


def test_without_a_channel_descriptor_the_queue_is_polled(caplog):
    """pyverbs of rdma-core < 46 (Debian 12's) gives no completion channel descriptor: the CQ
    is made without a channel, says so once, and offers nothing to wait on."""
    pv = fake_pyverbs.make(channel_fd=False)
    cq = provider.PyverbsDevice(None, pv=pv).create_cq(64)
    assert cq.fileno() is None and "polls the completion queue" in caplog.text
    (args, _), = _calls(pv, "CQ")
    assert args[3] is None                         # no channel
    cq.req_notify()
    cq.ack_events()
    assert not _calls(pv, "CQ.req_notify") and not _calls(pv, "CompChannel.get_cq_event")
    cq.close()


def test_infiniband_routes_by_lid_and_an_explicit_gid_index_wins():
    pv = fake_pyverbs.make(link_layer="IBV_LINK_LAYER_INFINIBAND", lid=17,
                           gids=(("fe80:0000:0000:0000:0002:c903:0000:0001",
                                  "IBV_GID_TYPE_SYSFS_IB_ROCE_V1"),))
    device = provider.PyverbsDevice(None, pv=pv)
    assert device.port.gid_index == 0 and not device.port.ethernet
    attr = provider.rtr_attr(pv, device.port, Endpoint(provider.encode_address(
        "fe80:0000:0000:0000:0002:c903:0000:0002", 23, pv.e.IBV_MTU_4096), 0x42))
    assert attr.ah_attr.dlid == 23 and not getattr(attr.ah_attr, "is_global", 0)
    pv = fake_pyverbs.make()
    assert provider.PyverbsDevice(None, 1, 1, pv=pv).port.gid_index == 1


def test_errors_are_one_line_and_name_what_is_missing():
    def error(**kwargs):
        pv = fake_pyverbs.make(**kwargs.pop("fake", {}))
        with pytest.raises(ConfigError) as caught:
            provider.PyverbsDevice(kwargs.get("name"), pv=pv)
        text = str(caught.value)
        assert "\n" not in text
        return text

    text = error(fake={"devices": ()})
    assert "no RDMA device" in text and "rdma link add rxe0 type rxe" in text
    assert "BYTEPS_RDMA_DEVICE=soft" in text
    text = error(name="mlx5_9", fake={"devices": ("mlx5_0", "mlx5_1")})
    assert "BYTEPS_RDMA_DEVICE=mlx5_9" in text and "mlx5_0, mlx5_1" in text
    assert "not active" in error(fake={"port_state": "IBV_PORT_DOWN"})


def test_without_pyverbs_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyverbs", None)       # import pyverbs fails
    with pytest.raises(ConfigError) as caught:
        provider.load()
    text = str(caught.value)
    assert "\n" not in text and "kvstore-byteps[rdma]" in text and "python3-pyverbs" in text


def test_a_soft_endpoint_given_to_a_real_device_is_refused_clearly():
    with pytest.raises(VerbsError, match="BYTEPS_RDMA_DEVICE=soft"):
        provider.decode_address("/tmp/kvstore-byteps-soft-rdma/123.sock")


# ---------------------------------------------------------------------- with real pyverbs
def _real_pyverbs():
    try:
        return provider.load()
    except ConfigError as exc:
        pytest.skip("pyverbs is not installed (%s)" % exc)


#: what test_attributes_and_work_requests_build_from_pyverbs_classes builds from pyverbs
BUILT_FOR_REAL = {"QPAttr", "QPCap", "QPInitAttr", "AHAttr", "GlobalRoute", "GID", "SGE",
                  "RecvWR", "SendWR", "SendWR.set_wr_rdma"}


def _documented_parameters(function) -> set:
    """The parameters pyverbs' docstring names (``:param x:``, and ``* *x*`` under kwargs)."""
    doc = getattr(function, "__doc__", None) or ""
    return set(re.findall(r":param (\w+):", doc)) | set(re.findall(r"\* \*(\w+)\*", doc))


def test_every_pyverbs_call_exists_and_fits_pyverbs_signature_or_documentation():
    """Each call the provider makes, recorded on the stand-in, checked against the installed
    pyverbs: bound to its signature where pyverbs was built with them (Cython 3), else
    against the parameters its docstring names (Debian's build has no signatures); a call
    with arguments and neither is only checked to exist. The attribute and work request
    classes are built for real in the next test instead (their docstrings are incomplete)."""
    real = _real_pyverbs()
    fake = fake_pyverbs.make()
    _lifecycle(fake)
    how = {}
    for name, args, kwargs in fake.calls:
        owner, _, member = name.partition(".")
        if name in BUILT_FOR_REAL:
            assert hasattr(real, owner) and (not member or hasattr(getattr(real, owner), member))
            how[name] = "built"
            continue
        assert hasattr(real, owner), "pyverbs has no %s" % owner
        target = getattr(real, owner)
        assert not member or hasattr(target, member), "pyverbs has no %s" % name
        function = getattr(target, member) if member else \
            target if owner == "get_device_list" else target.__init__
        try:
            signature = inspect.signature(function)
        except (TypeError, ValueError):
            signature = None
        if signature is not None:
            bound_args = args if owner == "get_device_list" else (None,) + args    # self
            signature.bind(*bound_args, **kwargs)      # TypeError if the call does not fit
            how[name] = "signature"
            continue
        documented = _documented_parameters(function)
        if not args and not kwargs:
            how[name] = "exists"
        elif documented:
            assert set(kwargs) <= documented, (name, set(kwargs) - documented)
            assert len(args) <= len(documented - {"kwargs"}), (name, args, documented)
            how[name] = "documented"
        else:
            how[name] = "exists"
    expected = {"Context", "PD", "MR", "CQ", "CompChannel", "QP", "QPAttr", "QPInitAttr",
                "QPCap", "SendWR", "RecvWR", "SGE", "AHAttr", "GlobalRoute", "GID",
                "Context.query_port", "Context.query_gid", "Context.query_gid_type",
                "Context.query_device", "QP.to_init", "QP.to_rtr", "QP.to_rts", "QP.modify",
                "QP.post_send", "QP.post_recv", "CQ.poll", "CQ.req_notify", "CQ.ack_events",
                "CompChannel.get_cq_event", "SendWR.set_wr_rdma", "MR.close", "get_device_list"}
    assert expected <= set(how), expected - set(how)
    # what a device-bound call needs most is checked more than its existence
    for name in ("MR", "CQ", "QP.to_rtr", "QP.post_send", "CQ.poll", "QP.modify"):
        assert how[name] in ("signature", "documented"), (name, how[name])
    for name in ("IBV_WC_RETRY_EXC_ERR", "IBV_GID_TYPE_SYSFS_ROCE_V2", "IBV_WC_WITH_IMM",
                 "IBV_PORT_ACTIVE", "IBV_LINK_LAYER_ETHERNET", "IBV_QP_STATE"):
        assert hasattr(real.e, name), name
    # (CompChannel.fd is optional: without it the van polls; see the test below)
    for cls, attributes in ((real.MR, ("lkey", "rkey")), (real.QP, ("qp_num", "qp_state"))):
        for attribute in attributes:
            assert hasattr(cls, attribute), (cls, attribute)


def test_attributes_and_work_requests_build_from_pyverbs_classes():
    """Every pyverbs object the provider builds without a device, built from pyverbs' real
    classes and read back."""
    real = _real_pyverbs()
    port = provider.Port(1, True, 3, "0000:0000:0000:0000:0000:ffff:c612:0001", 0,
                         real.e.IBV_MTU_4096)
    attr = provider.init_attr(real, port, Access.REMOTE_WRITE)
    assert attr.qp_state == real.e.IBV_QPS_INIT and attr.pkey_index == 0
    assert attr.qp_access_flags == real.e.IBV_ACCESS_REMOTE_WRITE and attr.port_num == 1
    attr = provider.rtr_attr(real, port, Endpoint(provider.encode_address(
        REMOTE_GID, 0, real.e.IBV_MTU_1024), 0x1234))
    assert attr.dest_qp_num == 0x1234 and attr.rq_psn == 0x1234
    assert attr.path_mtu == real.e.IBV_MTU_1024 and attr.ah_attr.is_global == 1
    assert str(attr.ah_attr.dgid) == REMOTE_GID and attr.ah_attr.sgid_index == 3
    infiniband = provider.Port(1, False, 0, "fe80:0000:0000:0000:0000:0000:0000:0001", 5,
                               real.e.IBV_MTU_2048)
    attr = provider.rtr_attr(real, infiniband, Endpoint(provider.encode_address(
        REMOTE_GID, 23, real.e.IBV_MTU_4096), 0x99))
    assert attr.ah_attr.dlid == 23 and attr.ah_attr.is_global == 0
    assert attr.path_mtu == real.e.IBV_MTU_2048
    attr = provider.rts_attr(real, port, 0x77)
    assert (attr.sq_psn, attr.rnr_retry, attr.retry_cnt, attr.timeout) == (0x77, 0, 7, 14)
    assert provider.error_attr(real).qp_state == real.e.IBV_QPS_ERR
    init = provider.qp_init_attr(real, None, None, QPCaps(max_send_wr=64, max_recv_wr=32))
    assert init.qp_type == real.e.IBV_QPT_RC and init.sq_sig_all == 0
    assert (init.cap.max_send_wr, init.cap.max_recv_wr) == (64, 32)
    buffer = np.zeros(256, np.uint8)
    sges = [SGE(buffer.ctypes.data, 256, 0x10)]
    for opcode, theirs in ((Opcode.SEND, real.e.IBV_WR_SEND),
                           (Opcode.RDMA_WRITE, real.e.IBV_WR_RDMA_WRITE)):
        wr = provider.send_wr(real, SendWR(1, opcode, sges, remote_addr=0x5000, rkey=0x20,
                                           signaled=False))
        assert wr.opcode == theirs and wr.send_flags == 0
    wr = provider.send_wr(real, SendWR(9, Opcode.RDMA_WRITE_WITH_IMM, sges,
                                       remote_addr=0x5000, rkey=0x20, imm_data=3))
    assert wr.wr_id == 9 and wr.opcode == real.e.IBV_WR_RDMA_WRITE_WITH_IMM
    assert wr.imm_data == socket.htonl(3) and wr.num_sge == 1
    assert wr.send_flags == real.e.IBV_SEND_SIGNALED
    assert provider.recv_wr(real, RecvWR(4, sges)).wr_id == 4
    from pyverbs.cq import WC
    done = provider.completion(real, WC(wr_id=8, status=real.e.IBV_WC_SUCCESS,
                                        opcode=real.e.IBV_WC_RECV_RDMA_WITH_IMM, byte_len=64,
                                        qp_num=0x1234, imm_data=socket.htonl(77),
                                        wc_flags=real.e.IBV_WC_WITH_IMM))
    assert (done.wr_id, done.opcode, done.imm_data, done.byte_len) == \
        (8, WCOpcode.RECV_RDMA_WITH_IMM, 77, 64)


def test_opening_a_device_on_a_machine_without_one_is_one_line():
    real = _real_pyverbs()
    try:
        if provider.device_names(real):
            pytest.skip("this machine has an RDMA device")
    except real.Error:
        pass                       # no RDMA in the kernel: listing fails
    with pytest.raises(ConfigError) as caught:
        provider.PyverbsDevice(None, pv=real)
    assert "\n" not in str(caught.value) and "no RDMA device" in str(caught.value)
