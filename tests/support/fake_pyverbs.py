"""A recording stand-in for pyverbs: the calls the pyverbs provider makes, without a device.

:func:`make` returns a namespace shaped as ``pyverbs_provider.load()``'s. Every constructor
and method the provider calls is recorded in ``pv.calls`` as ``(qualified name, args,
kwargs)``, so a test with the real pyverbs installed can bind each recorded call to pyverbs'
own signature (tests/unit/test_verbs_pyverbs.py). The device behaves as a one-port NIC whose
port, GID table and devices a test chooses; the data path (posting, completions) only records,
since moving bytes is the soft provider's and hardware's job.
"""
import itertools
import os
import types


class FakeError(Exception):
    """pyverbs' PyverbsError."""


def _enums():
    names = {
        # values as rdma-core's verbs.h has them where the provider compares or orders them
        "IBV_MTU_256": 1, "IBV_MTU_512": 2, "IBV_MTU_1024": 3, "IBV_MTU_2048": 4,
        "IBV_MTU_4096": 5, "IBV_ACCESS_LOCAL_WRITE": 1, "IBV_ACCESS_REMOTE_WRITE": 2,
        "IBV_ACCESS_REMOTE_READ": 4, "IBV_SEND_SIGNALED": 2, "IBV_WC_WITH_IMM": 2,
        "IBV_QP_STATE": 1, "IBV_PORT_ACTIVE": 4, "IBV_PORT_DOWN": 1,
        "IBV_LINK_LAYER_INFINIBAND": 1, "IBV_LINK_LAYER_ETHERNET": 2,
        "IBV_GID_TYPE_SYSFS_IB_ROCE_V1": 0, "IBV_GID_TYPE_SYSFS_ROCE_V2": 1,
        "IBV_QPS_RESET": 0, "IBV_QPS_INIT": 1, "IBV_QPS_RTR": 2, "IBV_QPS_RTS": 3,
        "IBV_QPS_ERR": 6, "IBV_QPT_RC": 2,
        "IBV_WR_RDMA_WRITE": 0, "IBV_WR_RDMA_WRITE_WITH_IMM": 1, "IBV_WR_SEND": 2,
        "IBV_WR_SEND_WITH_IMM": 3,
        "IBV_WC_SEND": 0, "IBV_WC_RDMA_WRITE": 1, "IBV_WC_RECV": 128,
        "IBV_WC_RECV_RDMA_WITH_IMM": 129,
        "IBV_WC_SUCCESS": 0, "IBV_WC_LOC_LEN_ERR": 1, "IBV_WC_LOC_PROT_ERR": 4,
        "IBV_WC_WR_FLUSH_ERR": 5, "IBV_WC_REM_INV_REQ_ERR": 9, "IBV_WC_REM_ACCESS_ERR": 10,
        "IBV_WC_RETRY_EXC_ERR": 12, "IBV_WC_RNR_RETRY_EXC_ERR": 13, "IBV_WC_GENERAL_ERR": 21,
    }
    return types.SimpleNamespace(**names)


def make(devices=("mlx5_0",), port_state="IBV_PORT_ACTIVE", link_layer="IBV_LINK_LAYER_ETHERNET",
         gids=(("fe80:0000:0000:0000:0a00:27ff:fe00:0001", "IBV_GID_TYPE_SYSFS_IB_ROCE_V1"),
               ("fe80:0000:0000:0000:0a00:27ff:fe00:0001", "IBV_GID_TYPE_SYSFS_ROCE_V2"),
               ("0000:0000:0000:0000:0000:ffff:c612:0001", "IBV_GID_TYPE_SYSFS_ROCE_V2")),
         lid=0, mtu="IBV_MTU_1024", max_cqe=32767, channel_fd=True):
    """A fake pyverbs namespace; ``pv.calls`` records what the provider called."""
    e = _enums()
    calls = []
    qp_nums = itertools.count(0x11)

    def record(name, args, kwargs):
        calls.append((name, args, dict(kwargs)))

    class Recorded:
        """Constructors are recorded by class name; attributes are plain (pyverbs' setters)."""

        def __init__(self, *args, **kwargs):
            record(type(self).__name__, args, kwargs)
            self.args, self.kwargs = args, kwargs
            for key, value in kwargs.items():
                setattr(self, key, value)

    def method(qualified):
        def call(self, *args, **kwargs):
            record(qualified, args, kwargs)
            return getattr(self, "_" + qualified.split(".")[1], lambda *a, **k: None)(
                *args, **kwargs)
        return call

    class Device:
        def __init__(self, name):
            self.name = name.encode()

    class GID(Recorded):
        def __str__(self):
            return self.args[0] if self.args else self.kwargs.get("val", "")

    class PortAttr:
        def __init__(self):
            self.state = getattr(e, port_state)
            self.link_layer = getattr(e, link_layer)
            self.gid_tbl_len, self.lid, self.active_mtu = len(gids), lid, getattr(e, mtu)

    class Context(Recorded):
        query_port = method("Context.query_port")
        query_gid = method("Context.query_gid")
        query_gid_type = method("Context.query_gid_type")
        query_device = method("Context.query_device")
        close = method("Context.close")

        def _query_port(self, port):
            return PortAttr()

        def _query_gid(self, port, index):
            return GID(gids[index][0])

        def _query_gid_type(self, port, index):
            return getattr(e, gids[index][1])

        def _query_device(self):
            return types.SimpleNamespace(max_cqe=max_cqe)

    class PD(Recorded):
        pass

    keys = itertools.count(0x100)

    class MR(Recorded):
        close = method("MR.close")

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.lkey, self.rkey = next(keys), next(keys)

    class CompChannel(Recorded):
        get_cq_event = method("CompChannel.get_cq_event")
        close = method("CompChannel.close")

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.pending = 0
            self._ends = os.pipe()          # a descriptor for the selector, never written
            if channel_fd:                  # pyverbs of rdma-core < 46 does not give it
                self.fd = self._ends[0]

        def _close(self):
            for end in self._ends:
                os.close(end)
            self._ends = ()

        def _get_cq_event(self, cq):
            if not self.pending:
                raise FakeError("Failed to get CQ event. Errno: 11, Resource temporarily "
                                "unavailable")
            self.pending -= 1

    class CQ(Recorded):
        poll = method("CQ.poll")
        req_notify = method("CQ.req_notify")
        ack_events = method("CQ.ack_events")
        close = method("CQ.close")

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.wcs = []

        def _poll(self, num_entries=1):
            out, self.wcs = self.wcs[:num_entries], self.wcs[num_entries:]
            return len(out), out

    class WC(Recorded):
        pass

    class QP(Recorded):
        to_init = method("QP.to_init")
        to_rtr = method("QP.to_rtr")
        to_rts = method("QP.to_rts")
        modify = method("QP.modify")
        post_send = method("QP.post_send")
        post_recv = method("QP.post_recv")

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.qp_num, self.qp_state = next(qp_nums), e.IBV_QPS_RESET

        def _to_init(self, attr):
            self.qp_state = e.IBV_QPS_INIT

        def _to_rtr(self, attr):
            self.qp_state = e.IBV_QPS_RTR

        def _to_rts(self, attr):
            self.qp_state = e.IBV_QPS_RTS

        def _modify(self, attr, mask):
            self.qp_state = attr.qp_state

    class QPAttr(Recorded):
        pass

    class QPCap(Recorded):
        pass

    class QPInitAttr(Recorded):
        pass

    class AHAttr(Recorded):
        def __init__(self, *args, **kwargs):       # pyverbs exposes the route's fields
            super().__init__(*args, **kwargs)
            route = kwargs.get("gr")
            if route is not None:
                self.dgid, self.sgid_index = route.dgid, route.sgid_index

    class GlobalRoute(Recorded):
        pass

    class SGE(Recorded):
        pass

    class RecvWR(Recorded):
        pass

    class SendWR(Recorded):
        set_wr_rdma = method("SendWR.set_wr_rdma")

        def _set_wr_rdma(self, rkey, addr):
            self.rdma = (rkey, addr)

    def get_device_list():
        record("get_device_list", (), {})
        return [Device(name) for name in devices]

    return types.SimpleNamespace(
        e=e, AHAttr=AHAttr, GlobalRoute=GlobalRoute, GID=GID, CQ=CQ, CompChannel=CompChannel,
        Context=Context, get_device_list=get_device_list, MR=MR, PD=PD, Error=FakeError, QP=QP,
        QPAttr=QPAttr, QPCap=QPCap, QPInitAttr=QPInitAttr, SGE=SGE, RecvWR=RecvWR,
        SendWR=SendWR, WC=WC, calls=calls)

