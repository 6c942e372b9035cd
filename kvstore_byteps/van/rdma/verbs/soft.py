"""``BYTEPS_RDMA_DEVICE=soft``: an in-host verbs provider, strict, for tests without RDMA devices.

Its job is to catch van bugs in CI, so it checks at least what hardware checks (api.py's list)
and refuses early where hardware would fail later: a scatter/gather element outside its region
is refused when posted, not when the NIC reaches it. Remote writes land in the target
process's registered memory, as a NIC's DMA would.

The device is a state machine (no I/O): ``post_send`` turns into :class:`Packet` s given to a
*fabric*, which delivers each to the target device's :meth:`SoftDevice.receive` and its answer
back to :meth:`SoftDevice.on_answer`. Fabrics: :class:`InProcessFabric` (tests join devices in
one process) and ``soft_fabric.UnixFabric`` (devices in different processes). Per QP pair the
fabric keeps order, so completions of one QP come in posting order. The responder never
retries: a SEND or WRITE_WITH_IMM finding no posted receive fails at once (RNR), where
hardware would retry ``rnr_retry`` times first.
"""
import ctypes
import dataclasses
import itertools
import random
import socket
import threading
from collections import deque
from typing import Deque, Dict, List, Optional, Tuple

import numpy as np

from .api import (SGE, Access, Completion, Endpoint, Opcode, QPCaps, QPState, RecvWR, SendWR,
                  VerbsError, WCOpcode, WCStatus)

_WRITES = (Opcode.RDMA_WRITE, Opcode.RDMA_WRITE_WITH_IMM)
_NEEDS_RECEIVE = (Opcode.SEND, Opcode.SEND_WITH_IMM, Opcode.RDMA_WRITE_WITH_IMM)
_WITH_IMM = (Opcode.SEND_WITH_IMM, Opcode.RDMA_WRITE_WITH_IMM)
_NEXT = {QPState.RESET: QPState.INIT, QPState.INIT: QPState.RTR, QPState.RTR: QPState.RTS}


@dataclasses.dataclass
class Packet:
    """A request from a sender's QP to a target QP, or (``answer``) the target's verdict."""

    source: str                 # the sending device's address
    src_qp: int
    dst_qp: int
    seq: int
    opcode: Opcode
    payload: bytes = b""
    remote_addr: int = 0
    rkey: int = 0
    imm_data: Optional[int] = None
    answer: Optional[WCStatus] = None


class MemoryRegion:
    """A registered buffer: ``addr``/``length`` in this process, ``lkey`` and ``rkey``."""

    def __init__(self, pd: "ProtectionDomain", buffer, access: Access, lkey: int, rkey: int):
        array = np.frombuffer(buffer, np.uint8)
        if not array.flags.writeable and access & (Access.LOCAL_WRITE | Access.REMOTE_WRITE):
            raise VerbsError("reg_mr: a read-only buffer registered for writing (EFAULT)")
        if access & Access.REMOTE_WRITE and not access & Access.LOCAL_WRITE:
            raise VerbsError("reg_mr: REMOTE_WRITE needs LOCAL_WRITE (EINVAL)")
        self.pd, self.access, self.lkey, self.rkey = pd, Access(access), lkey, rkey
        self.buffer = buffer                  # kept: the memory must stay while registered
        self.addr, self.length = array.ctypes.data, array.nbytes
        self.registered = True

    def covers(self, addr: int, length: int) -> bool:
        return self.registered and self.addr <= addr and addr + length <= self.addr + self.length

    def dereg(self) -> None:
        self.pd.device.forget(self)


class ProtectionDomain:
    def __init__(self, device: "SoftDevice"):
        self.device = device

    def reg_mr(self, buffer, access: Access) -> MemoryRegion:
        return self.device.register(self, buffer, access)


class CompletionQueue:
    """Completions in arrival order; more than ``depth`` unpolled is an overrun (an error).

    Events as with a completion channel: after :meth:`req_notify` the next completion makes
    :meth:`fileno` readable (once); :meth:`ack_events` consumes that."""

    def __init__(self, depth: int):
        if depth < 1:
            raise VerbsError("create_cq: depth %d" % depth)
        self.depth = depth
        self._entries: Deque[Completion] = deque()
        self._lock = threading.Lock()
        self.overrun = False
        self._armed = False
        self._events = None          # a socket pair, made when a poller first asks for it

    def fileno(self) -> int:
        with self._lock:
            if self._events is None:
                self._events = socket.socketpair()
                for end in self._events:
                    end.setblocking(False)
            return self._events[0].fileno()

    def req_notify(self) -> None:
        with self._lock:
            self._armed = True

    def ack_events(self) -> None:
        try:
            while self._events[0].recv(4096):
                pass
        except (BlockingIOError, TypeError):
            pass

    def push(self, completion: Completion) -> None:
        with self._lock:
            if len(self._entries) >= self.depth:
                self.overrun = True
            else:
                self._entries.append(completion)
            signal, self._armed = self._armed and self._events is not None, False
        if signal:
            try:
                self._events[1].send(b"!")
            except BlockingIOError:      # already readable
                pass

    def close(self) -> None:
        with self._lock:
            events, self._events = self._events, None
        for end in events or ():
            end.close()

    def poll(self, max_entries: int = 16) -> List[Completion]:
        with self._lock:
            if self.overrun:
                raise VerbsError("CQ overrun: more than %d completions were not polled"
                                 % self.depth)
            count = min(max_entries, len(self._entries))
            return [self._entries.popleft() for _ in range(count)]


class QueuePair:
    """A reliable-connected queue pair of a :class:`SoftDevice`."""

    def __init__(self, device: "SoftDevice", pd: ProtectionDomain, send_cq: CompletionQueue,
                 recv_cq: CompletionQueue, caps: QPCaps, qp_num: int):
        self.device, self.pd, self.send_cq, self.recv_cq = device, pd, send_cq, recv_cq
        self.caps, self.qp_num = caps, qp_num
        self.state = QPState.RESET
        self.access = Access(0)
        self.remote: Optional[Endpoint] = None
        self._receives: Deque[RecvWR] = deque()
        self._sends: Deque[Tuple[int, SendWR]] = deque()     # (seq, wr) not yet retired
        self._answered = 0                                   # sends answered, not retired
        self._seq = itertools.count()
        self._posting = threading.Lock()

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint(self.device.address, self.qp_num)

    # -- state transitions ------------------------------------------------------------
    def to_init(self, access: Access) -> None:
        self._step(QPState.INIT)
        self.access = Access(access)

    def to_rtr(self, remote: Endpoint) -> None:
        self._step(QPState.RTR)
        self.remote = remote

    def to_rts(self) -> None:
        self._step(QPState.RTS)

    def _step(self, target: QPState) -> None:
        with self.device.lock:
            if _NEXT.get(self.state) is not target:
                raise VerbsError("modify_qp %d: %s -> %s is not a valid transition (EINVAL)"
                                 % (self.qp_num, self.state.value, target.value))
            self.state = target

    def to_error(self) -> None:
        """Move to ERROR: everything outstanding completes with WR_FLUSH_ERR."""
        with self.device.lock:
            self._fail_locked()

    # -- posting ----------------------------------------------------------------------
    def post_recv(self, wr: RecvWR) -> None:
        with self.device.lock:
            if self.state is QPState.RESET:
                raise VerbsError("post_recv on QP %d in RESET (EINVAL)" % self.qp_num)
            self._check_sges(wr.sg_list, Access.LOCAL_WRITE, "post_recv")
            if len(self._receives) >= self.caps.max_recv_wr:
                raise VerbsError("post_recv on QP %d: %d receives outstanding, max_recv_wr %d "
                                 "(ENOMEM)" % (self.qp_num, len(self._receives),
                                               self.caps.max_recv_wr))
            if self.state is QPState.ERROR:
                self.recv_cq.push(_flushed(wr.wr_id, WCOpcode.RECV, self.qp_num))
                return
            self._receives.append(wr)

    def post_send(self, wr: SendWR) -> None:
        with self._posting:         # packets reach the fabric in the order of their seq
            packet = self._queue_send(wr)
            self.device.fabric.send(self.remote.address, packet)

    def _queue_send(self, wr: SendWR) -> Packet:
        with self.device.lock:
            if self.state is not QPState.RTS:
                raise VerbsError("post_send on QP %d in %s: sends need RTS (EINVAL)"
                                 % (self.qp_num, self.state.value))
            self._check_sges(wr.sg_list, Access(0), "post_send")
            if len(self._sends) >= self.caps.max_send_wr:
                raise VerbsError("post_send on QP %d: %d sends outstanding, max_send_wr %d "
                                 "(ENOMEM)" % (self.qp_num, len(self._sends),
                                               self.caps.max_send_wr))
            if (wr.imm_data is not None) != (wr.opcode in _WITH_IMM):
                raise VerbsError("post_send: imm_data goes with the *_WITH_IMM opcodes only")
            seq = next(self._seq)
            self._sends.append((seq, wr))
            return Packet(self.device.address, self.qp_num, self.remote.qp_num, seq,
                          wr.opcode, b"".join(ctypes.string_at(s.addr, s.length)
                                              for s in wr.sg_list),
                          wr.remote_addr, wr.rkey, wr.imm_data)

    def _check_sges(self, sges: List[SGE], needed: Access, what: str) -> None:
        if len(sges) > self.caps.max_sge:
            raise VerbsError("%s: %d scatter/gather elements, max_sge %d (EINVAL)"
                             % (what, len(sges), self.caps.max_sge))
        for sge in sges:
            mr = self.device.by_lkey.get(sge.lkey)
            if mr is None or mr.pd is not self.pd:
                raise VerbsError("%s: lkey %#x is not a region of this QP's PD" % (what, sge.lkey))
            if not mr.covers(sge.addr, sge.length):
                raise VerbsError("%s: %d bytes at %#x lie outside region lkey %#x (%d bytes at "
                                 "%#x)" % (what, sge.length, sge.addr, sge.lkey, mr.length,
                                           mr.addr))
            if needed & ~mr.access:
                raise VerbsError("%s: region lkey %#x lacks %s" % (what, sge.lkey, needed))

    # -- the fabric's calls (under the device lock) -------------------------------------
    def _answered_locked(self, seq: int, status: WCStatus) -> None:
        if self.state is QPState.ERROR:
            return                                 # flushed meanwhile
        if self._answered >= len(self._sends) or self._sends[self._answered][0] != seq:
            raise VerbsError("QP %d: answer %d out of order" % (self.qp_num, seq))
        wr = self._sends[self._answered][1]
        self._answered += 1
        if status is not WCStatus.SUCCESS:
            self.send_cq.push(Completion(wr.wr_id, status, _send_opcode(wr), self.qp_num))
            self._retire(self._answered)
            self._fail_locked()
        elif wr.signaled:                          # retires the unsignaled ones before it
            self.send_cq.push(Completion(wr.wr_id, status, _send_opcode(wr), self.qp_num,
                                         sum(s.length for s in wr.sg_list)))
            self._retire(self._answered)

    def _retire(self, count: int) -> None:
        for _ in range(count):
            self._sends.popleft()
        self._answered -= count

    def _fail_locked(self) -> None:
        self.state = QPState.ERROR
        while self._sends:
            _, wr = self._sends.popleft()
            self.send_cq.push(_flushed(wr.wr_id, _send_opcode(wr), self.qp_num))
        self._answered = 0
        while self._receives:
            self.recv_cq.push(_flushed(self._receives.popleft().wr_id, WCOpcode.RECV,
                                       self.qp_num))


def _send_opcode(wr: SendWR) -> WCOpcode:
    return WCOpcode.RDMA_WRITE if wr.opcode in _WRITES else WCOpcode.SEND


def _flushed(wr_id: int, opcode: WCOpcode, qp_num: int) -> Completion:
    return Completion(wr_id, WCStatus.WR_FLUSH_ERR, opcode, qp_num)


class SoftDevice:
    """One process's soft RDMA device; ``fabric`` carries its packets to other devices."""

    def __init__(self, address: str, fabric):
        self.address, self.fabric = address, fabric
        self.lock = threading.RLock()
        self.by_lkey: Dict[int, MemoryRegion] = {}
        self.by_rkey: Dict[int, MemoryRegion] = {}
        self.qps: Dict[int, QueuePair] = {}
        self._keys = random.Random()
        self._qp_nums = itertools.count(random.randrange(1, 1 << 16))
        fabric.attach(self)

    def alloc_pd(self) -> ProtectionDomain:
        return ProtectionDomain(self)

    def create_cq(self, depth: int) -> CompletionQueue:
        return CompletionQueue(depth)

    def create_qp(self, pd: ProtectionDomain, send_cq: CompletionQueue,
                  recv_cq: CompletionQueue, caps: QPCaps = QPCaps()) -> QueuePair:
        with self.lock:
            qp = QueuePair(self, pd, send_cq, recv_cq, caps, next(self._qp_nums) & 0xFFFFFF)
            self.qps[qp.qp_num] = qp
            return qp

    def register(self, pd: ProtectionDomain, buffer, access: Access) -> MemoryRegion:
        with self.lock:
            lkey, rkey = self._new_key(self.by_lkey), self._new_key(self.by_rkey)
            mr = MemoryRegion(pd, buffer, access, lkey, rkey)
            self.by_lkey[lkey], self.by_rkey[rkey] = mr, mr
            return mr

    def _new_key(self, taken) -> int:
        while True:                 # random keys: a stale or guessed key finds nothing
            key = self._keys.getrandbits(32)
            if key and key not in taken:
                return key

    def forget(self, mr: MemoryRegion) -> None:
        with self.lock:
            mr.registered = False
            self.by_lkey.pop(mr.lkey, None)
            self.by_rkey.pop(mr.rkey, None)

    # -- the fabric's side ----------------------------------------------------------------
    def receive(self, packet: Packet) -> WCStatus:
        """A request arrived for one of this device's QPs: place it, return the verdict."""
        with self.lock:
            qp = self.qps.get(packet.dst_qp)
            if (qp is None or qp.state not in (QPState.RTR, QPState.RTS) or qp.remote !=
                    Endpoint(packet.source, packet.src_qp)):
                return WCStatus.RETRY_EXC_ERR      # no responder: the sender gives up
            if packet.opcode in _WRITES:
                mr = self.by_rkey.get(packet.rkey)
                if (not qp.access & Access.REMOTE_WRITE or mr is None or mr.pd is not qp.pd
                        or not mr.access & Access.REMOTE_WRITE
                        or not mr.covers(packet.remote_addr, len(packet.payload))):
                    qp._fail_locked()
                    return WCStatus.REM_ACCESS_ERR
            if packet.opcode in _NEEDS_RECEIVE and not qp._receives:
                return WCStatus.RNR_RETRY_EXC_ERR
            if packet.opcode in _WRITES:
                ctypes.memmove(packet.remote_addr, packet.payload, len(packet.payload))
                if packet.opcode is Opcode.RDMA_WRITE_WITH_IMM:
                    wr = qp._receives.popleft()
                    qp.recv_cq.push(Completion(wr.wr_id, WCStatus.SUCCESS,
                                               WCOpcode.RECV_RDMA_WITH_IMM, qp.qp_num,
                                               len(packet.payload), packet.imm_data))
                return WCStatus.SUCCESS
            return self._scatter(qp, packet)

    def _scatter(self, qp: QueuePair, packet: Packet) -> WCStatus:
        wr = qp._receives.popleft()
        room = sum(s.length for s in wr.sg_list)
        if room < len(packet.payload):
            qp.recv_cq.push(Completion(wr.wr_id, WCStatus.LOC_LEN_ERR, WCOpcode.RECV, qp.qp_num))
            qp._fail_locked()
            return WCStatus.REM_INV_REQ_ERR
        at = 0
        for sge in wr.sg_list:
            piece = packet.payload[at:at + sge.length]
            ctypes.memmove(sge.addr, piece, len(piece))
            at += len(piece)
        qp.recv_cq.push(Completion(wr.wr_id, WCStatus.SUCCESS, WCOpcode.RECV, qp.qp_num,
                                   len(packet.payload), packet.imm_data))
        return WCStatus.SUCCESS

    def peer_gone(self, address: str) -> None:
        """The fabric lost the device at ``address``: sends to it not answered yet never will
        be. Each QP that waits for such an answer fails with RETRY_EXC_ERR (what a NIC's
        transport retries end in), which flushes the rest."""
        with self.lock:
            for qp in list(self.qps.values()):
                if (qp.remote is not None and qp.remote.address == address
                        and qp.state is not QPState.ERROR and qp._answered < len(qp._sends)):
                    qp._answered_locked(qp._sends[qp._answered][0], WCStatus.RETRY_EXC_ERR)

    def on_answer(self, packet: Packet) -> None:
        """The target's verdict on one of this device's sends."""
        with self.lock:
            qp = self.qps.get(packet.src_qp)
            if qp is not None:
                qp._answered_locked(packet.seq, packet.answer)


class InProcessFabric:
    """Devices of one process joined directly: a packet is placed before ``post_send``
    returns (tests of the provider and of a van's logic)."""

    def __init__(self):
        self.devices: Dict[str, SoftDevice] = {}
        self._names = itertools.count()

    def device(self) -> SoftDevice:
        return SoftDevice("inproc-%d" % next(self._names), self)

    def attach(self, device: SoftDevice) -> None:
        self.devices[device.address] = device

    def send(self, address: str, packet: Packet) -> None:
        target = self.devices.get(address)
        verdict = target.receive(packet) if target is not None else WCStatus.RETRY_EXC_ERR
        self.devices[packet.source].on_answer(dataclasses.replace(packet, payload=b"",
                                                                  answer=verdict))

