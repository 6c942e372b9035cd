"""``BYTEPS_RDMA_DEVICE=<name>``: real RDMA devices (InfiniBand, RoCE) through pyverbs.

The same object model as the soft provider (api.py): a device with ``alloc_pd``,
``create_cq`` and ``create_qp``; regions with ``addr``/``length``/``lkey``/``rkey``; a
completion queue the van's selector can wait on (a completion channel's descriptor); queue
pairs with ``to_init``/``to_rtr``/``to_rts``/``to_error``, ``post_send``/``post_recv``.

What a peer needs to reach one of our queue pairs travels as :class:`api.Endpoint` ``address``:
``<gid>|<lid>|<mtu>`` (the port's GID at the chosen index, its LID, its active MTU as an
``IBV_MTU_*`` value); the path MTU is the smaller of the two ports', packet sequence numbers
start from the QP numbers. On Ethernet (RoCE) packets carry a global route header from the
GID; on InfiniBand the LID routes.

RC settings: a receiver-not-ready retries zero times, as the soft provider (the van never
sends without a posted receive; an RNR is a bug to see, not to wait out); transport retries
7 times with a 4.096 us * 2^14 (~67 ms) timeout, after which the QP fails and the van names
the peer.

pyverbs is imported when a device is opened, never at package import; everything it is
asked for goes through :func:`load`'s namespace, so the translation code below is tested
against pyverbs' real classes where pyverbs is installed (tests/unit/test_verbs_pyverbs.py).
"""
import logging
import os
import socket
import types
from typing import List, Optional

import numpy as np

from ....errors import ConfigError
from .api import (Access, Completion, Endpoint, Opcode, QPCaps, QPState, RecvWR, SendWR,
                  VerbsError, WCOpcode, WCStatus)

#: what to install when pyverbs is missing
INSTALL_HINT = ("pyverbs must match the system's rdma-core libraries: install the distribution's "
                "python3-pyverbs (Debian, Ubuntu, RHEL; in a virtualenv made with "
                "--system-site-packages), or pip install 'kvstore-byteps[rdma]' where rdma-core "
                "is as new as PyPI's pyverbs (57 or later)")
#: how to get a device where there is none
DEVICE_HINT = ("load the NIC's RDMA driver (mlx5_ib, irdma, bnxt_re, efa ...), or try "
               "Soft-RoCE on a kernel built with it: `rdma link add rxe0 type rxe netdev eth0`; "
               "BYTEPS_RDMA_DEVICE=soft runs the in-host test provider instead")
log = logging.getLogger(__name__)
_SYSFS = "/sys/class/infiniband"
_RETRY_COUNT, _TIMEOUT, _MIN_RNR_TIMER = 7, 14, 12


def load() -> types.SimpleNamespace:
    """pyverbs' classes, enums and errors in one namespace; ConfigError naming what to install
    when it is missing."""
    try:
        import pyverbs.enums as enums
        from pyverbs.addr import AHAttr, GlobalRoute, GID
        from pyverbs.cq import CQ, CompChannel
        from pyverbs.device import Context, get_device_list
        from pyverbs.mr import MR
        from pyverbs.pd import PD
        from pyverbs.pyverbs_error import PyverbsError
        from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
        from pyverbs.wr import SGE, RecvWR as PvRecvWR, SendWR as PvSendWR
    except ImportError as exc:
        raise ConfigError("DMLC_PS_VAN_TYPE=byteps_rdma needs pyverbs for RDMA devices (%s): %s; "
                          "BYTEPS_RDMA_DEVICE=soft runs the in-host test provider without it"
                          % (exc, INSTALL_HINT)) from None
    return types.SimpleNamespace(
        e=enums, AHAttr=AHAttr, GlobalRoute=GlobalRoute, GID=GID, CQ=CQ,
        CompChannel=CompChannel, Context=Context, get_device_list=get_device_list, MR=MR, PD=PD,
        Error=PyverbsError, QP=QP, QPAttr=QPAttr, QPCap=QPCap, QPInitAttr=QPInitAttr, SGE=SGE,
        RecvWR=PvRecvWR, SendWR=PvSendWR)


# ---------------------------------------------------------------------- pure translations
def access_flags(pv, access: Access) -> int:
    """api.Access -> ``IBV_ACCESS_*``."""
    flags = 0
    for ours, theirs in ((Access.LOCAL_WRITE, pv.e.IBV_ACCESS_LOCAL_WRITE),
                         (Access.REMOTE_WRITE, pv.e.IBV_ACCESS_REMOTE_WRITE),
                         (Access.REMOTE_READ, pv.e.IBV_ACCESS_REMOTE_READ)):
        if access & ours:
            flags |= theirs
    return flags


def encode_address(gid: str, lid: int, mtu: int) -> str:
    return "%s|%d|%d" % (gid, lid, mtu)


def decode_address(address: str):
    """``(gid, lid, mtu)`` of an :func:`encode_address` string; VerbsError if malformed."""
    try:
        gid, lid, mtu = address.split("|")
        return gid, int(lid), int(mtu)
    except ValueError:
        raise VerbsError("an RDMA endpoint address %r is not '<gid>|<lid>|<mtu>' (is the peer "
                         "on BYTEPS_RDMA_DEVICE=soft?)" % address) from None


def psn(qp_num: int) -> int:
    """The first packet sequence number of a QP's sends (both sides derive it)."""
    return qp_num & 0xFFFFFF


def init_attr(pv, port: "Port", access: Access):
    """The QPAttr for RESET -> INIT."""
    attr = pv.QPAttr(qp_state=pv.e.IBV_QPS_INIT, cur_qp_state=pv.e.IBV_QPS_RESET,
                     port_num=port.number)
    attr.pkey_index = 0
    attr.qp_access_flags = access_flags(pv, access)
    return attr


def error_attr(pv):
    """The QPAttr that moves a QP to ERROR (with the mask ``IBV_QP_STATE``)."""
    return pv.QPAttr(qp_state=pv.e.IBV_QPS_ERR)


def qp_init_attr(pv, send_cq, recv_cq, caps: QPCaps):
    """The QPInitAttr of an RC QP; sends are signaled only where the work request asks."""
    cap = pv.QPCap(max_send_wr=caps.max_send_wr, max_recv_wr=caps.max_recv_wr,
                   max_send_sge=caps.max_sge, max_recv_sge=caps.max_sge)
    return pv.QPInitAttr(qp_type=pv.e.IBV_QPT_RC, scq=send_cq, rcq=recv_cq, cap=cap,
                         sq_sig_all=0)


def rtr_attr(pv, port: "Port", remote: Endpoint):
    """The QPAttr for INIT -> RTR towards ``remote``."""
    gid, lid, mtu = decode_address(remote.address)
    attr = pv.QPAttr(qp_state=pv.e.IBV_QPS_RTR, cur_qp_state=pv.e.IBV_QPS_INIT,
                     port_num=port.number, path_mtu=min(mtu, port.mtu))
    attr.dest_qp_num = remote.qp_num
    attr.rq_psn = psn(remote.qp_num)
    attr.max_dest_rd_atomic = 1
    attr.min_rnr_timer = _MIN_RNR_TIMER
    if port.ethernet:              # RoCE: every packet carries a global route header
        route = pv.GlobalRoute(dgid=pv.GID(gid), sgid_index=port.gid_index, hop_limit=64)
        attr.ah_attr = pv.AHAttr(is_global=1, port_num=port.number, gr=route)
    else:
        attr.ah_attr = pv.AHAttr(dlid=lid, port_num=port.number)
    return attr


def rts_attr(pv, port: "Port", qp_num: int):
    """The QPAttr for RTR -> RTS."""
    attr = pv.QPAttr(qp_state=pv.e.IBV_QPS_RTS, cur_qp_state=pv.e.IBV_QPS_RTR,
                     port_num=port.number)
    attr.sq_psn = psn(qp_num)
    attr.timeout, attr.retry_cnt, attr.rnr_retry = _TIMEOUT, _RETRY_COUNT, 0
    attr.max_rd_atomic = 1
    return attr


def _tables(pv) -> types.SimpleNamespace:
    """The enum translations, made once per pyverbs namespace (they are looked up on every
    work request and completion)."""
    tables = getattr(pv, "tables", None)
    if tables is None:
        e = pv.e
        tables = pv.tables = types.SimpleNamespace(
            opcodes={Opcode.SEND: e.IBV_WR_SEND, Opcode.SEND_WITH_IMM: e.IBV_WR_SEND_WITH_IMM,
                     Opcode.RDMA_WRITE: e.IBV_WR_RDMA_WRITE,
                     Opcode.RDMA_WRITE_WITH_IMM: e.IBV_WR_RDMA_WRITE_WITH_IMM},
            statuses={e.IBV_WC_SUCCESS: WCStatus.SUCCESS,
                      e.IBV_WC_LOC_LEN_ERR: WCStatus.LOC_LEN_ERR,
                      e.IBV_WC_LOC_PROT_ERR: WCStatus.LOC_PROT_ERR,
                      e.IBV_WC_REM_ACCESS_ERR: WCStatus.REM_ACCESS_ERR,
                      e.IBV_WC_REM_INV_REQ_ERR: WCStatus.REM_INV_REQ_ERR,
                      e.IBV_WC_RNR_RETRY_EXC_ERR: WCStatus.RNR_RETRY_EXC_ERR,
                      e.IBV_WC_RETRY_EXC_ERR: WCStatus.RETRY_EXC_ERR,
                      e.IBV_WC_WR_FLUSH_ERR: WCStatus.WR_FLUSH_ERR},
            completions={e.IBV_WC_SEND: WCOpcode.SEND, e.IBV_WC_RDMA_WRITE: WCOpcode.RDMA_WRITE,
                         e.IBV_WC_RECV: WCOpcode.RECV,
                         e.IBV_WC_RECV_RDMA_WITH_IMM: WCOpcode.RECV_RDMA_WITH_IMM})
    return tables


def send_wr(pv, wr: SendWR):
    """api.SendWR -> pyverbs SendWR (immediate data in network order, as the wire has it)."""
    sges = [pv.SGE(s.addr, s.length, s.lkey) for s in wr.sg_list]
    out = pv.SendWR(wr_id=wr.wr_id, opcode=_tables(pv).opcodes[wr.opcode], num_sge=len(sges),
                    sg=sges, imm_data=0 if wr.imm_data is None else socket.htonl(wr.imm_data),
                    send_flags=pv.e.IBV_SEND_SIGNALED if wr.signaled else 0)
    if wr.opcode in (Opcode.RDMA_WRITE, Opcode.RDMA_WRITE_WITH_IMM):
        out.set_wr_rdma(wr.rkey, wr.remote_addr)
    return out


def recv_wr(pv, wr: RecvWR):
    sges = [pv.SGE(s.addr, s.length, s.lkey) for s in wr.sg_list]
    return pv.RecvWR(wr_id=wr.wr_id, num_sge=len(sges), sg=sges)


def completion(pv, wc) -> Completion:
    """A pyverbs WC -> api.Completion. A failed completion's opcode is undefined in ibverbs:
    it is None here."""
    tables = _tables(pv)
    status = tables.statuses.get(wc.status, WCStatus.OTHER_ERR)
    ok = status is WCStatus.SUCCESS
    imm = socket.ntohl(wc.imm_data) if ok and wc.wc_flags & pv.e.IBV_WC_WITH_IMM else None
    return Completion(wc.wr_id, status, tables.completions.get(wc.opcode) if ok else None,
                      wc.qp_num, wc.byte_len if ok else 0, imm)


# ---------------------------------------------------------------------- the device
class Port:
    """The port (and GID) our queue pairs use; what its peers need to reach it."""

    def __init__(self, number: int, ethernet: bool, gid_index: int, gid: str, lid: int,
                 mtu: int):
        self.number, self.ethernet, self.gid_index = number, ethernet, gid_index
        self.gid, self.lid, self.mtu = gid, lid, mtu

    @property
    def address(self) -> str:
        return encode_address(self.gid, self.lid, self.mtu)


def choose_gid(pv, context, port_number: int, table_length: int,
               wanted: Optional[int]) -> int:
    """The GID index: ``wanted`` if given; else, on RoCE, the first RoCE v2 GID holding an IPv4
    address (what NCCL picks: routable, works across subnets), then the first RoCE v2 GID,
    then 0."""
    if wanted is not None:
        return wanted
    v2 = []
    for index in range(table_length):
        try:
            kind = context.query_gid_type(port_number, index)
            gid = str(context.query_gid(port_number, index))
        except pv.Error:
            continue
        if kind == pv.e.IBV_GID_TYPE_SYSFS_ROCE_V2 and gid.replace(":", "").strip("0"):
            v2.append((index, gid))
    for index, gid in v2:
        if gid.lower().startswith("0000:0000:0000:0000:0000:ffff:"):
            return index
    return v2[0][0] if v2 else 0


def _sysfs_state() -> str:
    if not os.path.isdir(_SYSFS):
        return "missing"
    listed = os.listdir(_SYSFS)
    return "listing " + ", ".join(listed) if listed else "empty"


def device_names(pv) -> List[str]:
    names = []
    for device in pv.get_device_list():
        name = device.name
        names.append(name.decode() if isinstance(name, bytes) else str(name))
    return names


class PyverbsDevice:
    """One opened RDMA device and port; the provider's device (and its own "fabric": the
    network is the NIC's)."""

    def __init__(self, name: Optional[str], port_number: int = 1,
                 gid_index: Optional[int] = None, pv=None):
        self.pv = pv = pv or load()
        try:
            names = device_names(pv)
        except pv.Error as exc:       # ibverbs says ENOSYS where the kernel has no RDMA
            raise ConfigError("byteps_rdma: no RDMA device (listing devices failed: %s; %s is "
                              "%s); %s" % (str(exc).strip(), _SYSFS, _sysfs_state(),
                                           DEVICE_HINT)) from None
        if not names:
            raise ConfigError("byteps_rdma: no RDMA device (%s is %s); %s"
                              % (_SYSFS, _sysfs_state(), DEVICE_HINT))
        if name is None:
            name = names[0]
        elif name not in names:
            raise ConfigError("byteps_rdma: BYTEPS_RDMA_DEVICE=%s is not a device here; these "
                              "are: %s" % (name, ", ".join(names)))
        self.name = name
        try:
            self.context = pv.Context(name=name)
            attr = self.context.query_port(port_number)
            if attr.state != pv.e.IBV_PORT_ACTIVE:
                raise ConfigError("byteps_rdma: port %d of %s is not active (state %s): check "
                                  "the link (`ibv_devinfo -d %s`) or BYTEPS_RDMA_PORT"
                                  % (port_number, name, attr.state, name))
            ethernet = attr.link_layer == pv.e.IBV_LINK_LAYER_ETHERNET
            index = choose_gid(pv, self.context, port_number, attr.gid_tbl_len, gid_index)
            gid = str(self.context.query_gid(port_number, index))
            self.max_cqe = self.context.query_device().max_cqe
        except pv.Error as exc:
            raise ConfigError("byteps_rdma: opening %s port %d failed: %s"
                              % (name, port_number, exc)) from None
        self.port = Port(port_number, ethernet, index, gid, attr.lid, attr.active_mtu)
        self.address = self.port.address

    # -- what the van asks for ----------------------------------------------------------
    def device(self) -> "PyverbsDevice":
        return self

    def alloc_pd(self) -> "_PD":
        return _PD(self, _call(self.pv, self.pv.PD, self.context))

    def create_cq(self, depth: int) -> "_CQ":
        """A CQ of ``depth`` entries, or as many as the device allows (Soft-RoCE: 32767)."""
        return _CQ(self.pv, self.context, min(depth, self.max_cqe))

    def create_qp(self, pd: "_PD", send_cq: "_CQ", recv_cq: "_CQ",
                  caps: QPCaps = QPCaps()) -> "_QP":
        init = qp_init_attr(self.pv, send_cq.cq, recv_cq.cq, caps)
        return _QP(self, _call(self.pv, self.pv.QP, pd.pd, init))

    def close(self) -> None:
        try:
            self.context.close()
        except self.pv.Error:
            pass


def _call(pv, function, *args, **kwargs):
    """A pyverbs call; its errors as VerbsError (what the van handles)."""
    try:
        return function(*args, **kwargs)
    except pv.Error as exc:
        raise VerbsError(str(exc)) from None


class _MR:
    def __init__(self, pv, pd, buffer, access: Access):
        array = np.frombuffer(buffer, np.uint8)
        self.buffer = buffer                  # kept: the memory must stay while registered
        self.addr, self.length = int(array.ctypes.data), int(array.nbytes)
        if self.length == 0:
            raise VerbsError("reg_mr: an empty buffer")
        self._pv = pv
        self.mr = _call(pv, pv.MR, pd, self.length, access_flags(pv, access),
                        address=self.addr)
        self.lkey, self.rkey = self.mr.lkey, self.mr.rkey

    def dereg(self) -> None:
        _call(self._pv, self.mr.close)


class _PD:
    def __init__(self, device: PyverbsDevice, pd):
        self.device, self.pd = device, pd

    def reg_mr(self, buffer, access: Access) -> _MR:
        return _MR(self.device.pv, self.pd, buffer, access)


class _CQ:
    """A completion queue with its completion channel (non-blocking, for the selector).

    pyverbs before rdma-core 46 (Debian 12 has 44) does not give the channel's descriptor:
    then the CQ has no channel, :meth:`fileno` is None, and the van polls it every
    millisecond instead of waiting (said once at start)."""

    def __init__(self, pv, context, depth: int):
        self._pv = pv
        self.channel = _call(pv, pv.CompChannel, context)
        if not hasattr(self.channel, "fd"):
            log.warning("byteps_rdma: this pyverbs gives no completion channel descriptor "
                        "(rdma-core < 46): the receive loop polls the completion queue every "
                        "millisecond instead of waiting for events (a newer pyverbs waits)")
            self.channel.close()
            self.channel = None
        else:
            os.set_blocking(self.channel.fd, False)
        self.cq = _call(pv, pv.CQ, context, depth, None, self.channel, 0)

    def fileno(self) -> Optional[int]:
        return None if self.channel is None else self.channel.fd

    def req_notify(self) -> None:
        if self.channel is not None:
            _call(self._pv, self.cq.req_notify)

    def ack_events(self) -> None:
        events = 0
        while self.channel is not None:     # non-blocking: fails with EAGAIN once drained
            try:
                self.channel.get_cq_event(self.cq)
            except self._pv.Error:
                break
            events += 1
        if events:
            self.cq.ack_events(events)

    def poll(self, max_entries: int = 16) -> List[Completion]:
        _, wcs = _call(self._pv, self.cq.poll, max_entries)
        return [completion(self._pv, wc) for wc in wcs]

    def close(self) -> None:
        for thing in (self.cq, self.channel):
            try:
                if thing is not None:
                    thing.close()
            except self._pv.Error:
                pass


class _QP:
    _STATES = {"IBV_QPS_RESET": QPState.RESET, "IBV_QPS_INIT": QPState.INIT,
               "IBV_QPS_RTR": QPState.RTR, "IBV_QPS_RTS": QPState.RTS,
               "IBV_QPS_ERR": QPState.ERROR}

    def __init__(self, device: PyverbsDevice, qp):
        self.device, self.qp, self._pv = device, qp, device.pv
        self.qp_num = qp.qp_num

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint(self.device.address, self.qp_num)

    @property
    def state(self) -> QPState:
        value = self.qp.qp_state
        for name, state in self._STATES.items():
            if getattr(self._pv.e, name) == value:
                return state
        return QPState.ERROR

    def to_init(self, access: Access) -> None:
        _call(self._pv, self.qp.to_init, init_attr(self._pv, self.device.port, access))

    def to_rtr(self, remote: Endpoint) -> None:
        _call(self._pv, self.qp.to_rtr, rtr_attr(self._pv, self.device.port, remote))

    def to_rts(self) -> None:
        _call(self._pv, self.qp.to_rts, rts_attr(self._pv, self.device.port, self.qp_num))

    def to_error(self) -> None:
        _call(self._pv, self.qp.modify, error_attr(self._pv), self._pv.e.IBV_QP_STATE)

    def post_recv(self, wr: RecvWR) -> None:
        _call(self._pv, self.qp.post_recv, recv_wr(self._pv, wr))

    def post_send(self, wr: SendWR) -> None:
        _call(self._pv, self.qp.post_send, send_wr(self._pv, wr))
