"""One connection of the byteps_rdma van: messages in, work requests out, completions in,
messages out. No threads and no sockets (the van polls the completion queue and calls in).

Per connection each side keeps ``slots`` receives of ``slot_bytes`` posted. A message's small
pieces travel in one SEND (wire.py); large ones are RDMA-written straight from the
sender's memory into a landing buffer the receiver chose and registered, after a START /
REPLY rendezvous; the last write carries the message id as immediate data, and RC ordering
puts every earlier write in place before its completion. Messages are delivered in the order
they were sent.

Flow control: a SEND and a WRITE_WITH_IMM each consume one posted receive of the peer, so a
sender may post them only while it holds *credits*: the peer's slots, plus the receives the
peer re-posted (a counter the peer RDMA-writes into this side's memory, which needs no
credit and so can never deadlock), minus what this side sent. Nothing is ever sent to a peer
without a posted receive: no RNR. At most ``max_send_wr`` work requests are outstanding;
what cannot be posted waits, in order, for :meth:`Channel.pump`.

Memory: the channel's own buffers (receive and send slots, credit counters) are registered
once. A written piece, and a landing buffer, are registered through the van's
:class:`~.regions.RegistrationCache`: once per buffer whose memory can neither move nor
vanish unseen (kept while the buffer lives), otherwise for that message alone (a piece until
its write completed, a landing until the write landed, so no later write can reach it). A
landing is then delivered (the consumer's reference keeps it).
"""
import itertools
from collections import deque
from typing import Callable, Deque, Dict, List, Optional

import numpy as np

from ...errors import PeerError, ProtocolError
from . import wire
from .regions import RegistrationCache
from .verbs.api import (SGE, Access, Completion, Endpoint, Opcode, QPCaps, RecvWR, SendWR,
                        VerbsError, WCOpcode, WCStatus)

#: tags of work request ids (the high 32 bits; the low ones: a slot or a message id)
_RECV, _SLOT, _WRITE, _CREDIT = 1, 2, 3, 4
#: what waits in the queue: a slot message (wire's INLINE, START, REPLY) or the writes
_WRITES_DUE = 0


def _wr_id(tag: int, index: int) -> int:
    return tag << 32 | index


def _as_bytes(piece) -> np.ndarray:
    return np.frombuffer(memoryview(piece).cast("B"), np.uint8)


def _sge(region, array: np.ndarray) -> SGE:
    return SGE(array.ctypes.data, array.nbytes, region.lkey)


class Channel:
    """Both directions of one RC queue pair; see the module docstring."""

    def __init__(self, device, pd, cq, *, slots: int = 32, slot_bytes: int = 16384,
                 max_send_wr: int = 64, written_from: int = 65536,
                 landing: Optional[Callable[[int, int], np.ndarray]] = None,
                 registrations: Optional[RegistrationCache] = None):
        """``landing(key, nbytes)``: the buffer a written frame lands in; ``registrations``:
        the van's cache (None: every piece and landing registered per message)."""
        self.slots, self.slot_bytes, self.written_from = slots, slot_bytes, written_from
        self.max_send_wr = max_send_wr
        self.landing = landing or (lambda key, nbytes: np.empty(nbytes, np.uint8))
        self.qp = device.create_qp(pd, cq, cq, QPCaps(max_send_wr=max_send_wr,
                                                      max_recv_wr=slots, max_sge=1))
        self.registrations = registrations if registrations is not None \
            else RegistrationCache(pd, enabled=False)
        self._receive = np.zeros((slots, slot_bytes), np.uint8)
        self._send = np.zeros((max_send_wr, slot_bytes), np.uint8)
        self._free_slots: Deque[int] = deque(range(max_send_wr))
        self._credit_in = np.zeros(1, np.uint64)     # the peer writes its re-posted count here
        self._credit_out = np.zeros(1, np.uint64)    # what this side writes to the peer's
        self._regions = {name: pd.reg_mr(array, access) for name, array, access in (
            ("receive", self._receive, Access.LOCAL_WRITE),
            ("send", self._send, Access.LOCAL_WRITE),
            ("credit_in", self._credit_in, Access.LOCAL_WRITE | Access.REMOTE_WRITE),
            ("credit_out", self._credit_out, Access.LOCAL_WRITE))}
        self.peer: Optional[wire.ChannelInfo] = None
        self._ids = itertools.count()
        self._sent = 0                # SENDs and WRITE_WITH_IMMs posted (receives consumed)
        self._reposted = 0
        self._credit_written = 0
        self._posted = 0              # work requests outstanding
        self._queue: Deque[tuple] = deque()           # (kind, message id) waiting to post
        self._outgoing: Dict[int, tuple] = {}         # id -> (pieces, written flags)
        self._replies: Dict[int, bytes] = {}
        self._writes: Dict[int, list] = {}            # id -> the pieces being written
        self._incoming: Dict[int, tuple] = {}         # id -> (pieces, landing per piece)
        self._complete: Dict[int, list] = {}
        self._next_delivery = 0
        self.delivered: Deque[List] = deque()
        self.failure: Optional[PeerError] = None

    # -- connecting -------------------------------------------------------------------------
    def info(self) -> wire.ChannelInfo:
        return wire.ChannelInfo(self.qp.endpoint.address, self.qp.qp_num, self.slots,
                                self.slot_bytes, int(self._credit_in.ctypes.data),
                                self._regions["credit_in"].rkey)

    def connect(self, peer: wire.ChannelInfo) -> None:
        """Post the receives and bring the QP to RTS towards ``peer``."""
        self.peer = peer
        self.qp.to_init(Access.REMOTE_WRITE)
        for index in range(self.slots):
            self._post_receive(index)
        self.qp.to_rtr(Endpoint(peer.address, peer.qp_num))
        self.qp.to_rts()

    def _post_receive(self, index: int) -> None:
        self.qp.post_recv(RecvWR(_wr_id(_RECV, index),
                                 [_sge(self._regions["receive"], self._receive[index])]))

    # -- sending ----------------------------------------------------------------------------
    def send(self, pieces: List) -> None:
        """Queue a message (its PBMeta, then its data frames); posted as credits allow."""
        self._check()
        if len(pieces) > wire.MAX_PIECES:
            raise ProtocolError("a message of %d frames (at most %d)"
                                % (len(pieces) - 1, wire.MAX_PIECES - 1))
        views = [_as_bytes(piece) for piece in pieces]
        written = self._plan(views)
        message_id = next(self._ids) & 0xFFFFFFFF
        self._outgoing[message_id] = (views, written)
        self._queue.append((wire.START if any(written) else wire.INLINE, message_id))
        self.pump()
        self._check()             # the queue pair failed while posting: the peer is gone

    def _plan(self, views: List[np.ndarray]) -> List[bool]:
        """Which pieces are written (large, or beyond the slot) rather than sent inline."""
        room = min(self.slot_bytes, self.peer.slot_bytes) - wire.announce_bytes(len(views))
        written = []
        for view in views:
            inline = view.nbytes < self.written_from and view.nbytes <= room
            room -= view.nbytes if inline else 0
            written.append(not inline)
        return written

    def pump(self) -> None:
        """Post what waits, in order, while credits and work-request slots allow; and tell
        the peer about re-posted receives. A queue pair that fails meanwhile (it moves to
        ERROR when its peer is gone, possibly between two posts) fails the channel."""
        if self.failure is not None:
            return
        try:
            self._write_credits()
            while self._queue:
                kind, message_id = self._queue[0]
                needed = sum(self._outgoing[message_id][1]) if kind == _WRITES_DUE else 1
                if (self._posted + needed > self.max_send_wr - 1      # one kept for credits
                        or self._credits() < 1
                        or (kind != _WRITES_DUE and not self._free_slots)):
                    return
                self._queue.popleft()
                (self._post_writes if kind == _WRITES_DUE else self._post_slot)(kind,
                                                                                message_id)
        except VerbsError as exc:
            self._fail("a verbs call failed: %s" % exc)

    @property
    def idle(self) -> bool:
        """Whether everything sent has been posted and completed."""
        return not (self._queue or self._outgoing or self._writes or self._posted)

    @property
    def waiting(self) -> bool:
        """Whether something waits to be posted (for credits or work-request slots)."""
        return bool(self._queue)

    def _credits(self) -> int:
        return self.peer.slots + int(self._credit_in[0]) - self._sent

    def _post_slot(self, kind: int, message_id: int) -> None:
        if kind == wire.REPLY:
            data = self._replies.pop(message_id)
        else:
            views, written = self._outgoing[message_id] if kind == wire.START \
                else self._outgoing.pop(message_id)
            inline = [not flag for flag in written]
            data = wire.encode_announce(kind, message_id, [v.nbytes for v in views], inline) \
                + b"".join(v.tobytes() for v, flag in zip(views, inline) if flag)
        index = self._free_slots.popleft()
        slot = self._send[index, :len(data)]
        slot[:] = np.frombuffer(data, np.uint8)
        self._post(SendWR(_wr_id(_SLOT, index), Opcode.SEND,
                          [_sge(self._regions["send"], slot)]))
        self._sent += 1

    def _post_writes(self, kind: int, message_id: int) -> None:
        views, written = self._outgoing.pop(message_id)
        pieces = [v for v, flag in zip(views, written) if flag]
        targets = self._writes[message_id]
        regions = [self.registrations.acquire(view, Access(0)) for view in pieces]
        for number, (view, region, (addr, rkey)) in enumerate(zip(pieces, regions, targets)):
            last = number == len(pieces) - 1
            self._post(SendWR(_wr_id(_WRITE, message_id), Opcode.RDMA_WRITE_WITH_IMM if last
                              else Opcode.RDMA_WRITE, [_sge(region, view)],
                              remote_addr=addr, rkey=rkey,
                              imm_data=message_id if last else None, signaled=last))
        # the pieces (and their registrations) are kept until the last write completed
        self._writes[message_id] = (pieces, regions)
        self._sent += 1

    def _write_credits(self) -> None:
        """Tell the peer about re-posted receives, a quarter of the slots at a time (a peer
        out of credits has sent ``slots`` messages not yet announced back, so it always gets
        them)."""
        if (self._reposted - self._credit_written < max(1, self.slots // 4)
                or self._posted >= self.max_send_wr):
            return
        self._credit_out[0] = self._credit_written = self._reposted
        self._post(SendWR(_wr_id(_CREDIT, 0), Opcode.RDMA_WRITE,
                          [_sge(self._regions["credit_out"], self._credit_out.view(np.uint8))],
                          remote_addr=self.peer.credit_addr, rkey=self.peer.credit_rkey))

    def _post(self, wr: SendWR) -> None:
        self.qp.post_send(wr)
        self._posted += 1

    # -- completions ------------------------------------------------------------------------
    def on_completion(self, wc: Completion) -> None:
        """Handle one completion of this channel's QP; delivered messages go to
        :attr:`delivered` in order. A failed one fails the channel (PeerError)."""
        if wc.status is not WCStatus.SUCCESS:
            self._fail("%s on work request %#x" % (wc.status.value, wc.wr_id))
            return
        tag, index = wc.wr_id >> 32, wc.wr_id & 0xFFFFFFFF
        try:
            if wc.opcode is WCOpcode.RECV:
                self._on_receive(index, wc.byte_len)
            elif wc.opcode is WCOpcode.RECV_RDMA_WITH_IMM:
                self._repost(index)
                self._landed(wc.imm_data)
            else:
                self._send_completed(tag, index)
        except VerbsError as exc:       # e.g. re-posting a receive on a failed queue pair
            self._fail("a verbs call failed: %s" % exc)
            return
        self.pump()

    def _send_completed(self, tag: int, index: int) -> None:
        """A signaled send completed: its slot, or its writes' registrations, are free."""
        self._posted -= 1
        if tag == _SLOT:
            self._free_slots.append(index)
        elif tag == _WRITE:
            pieces, regions = self._writes.pop(index)
            self._posted -= len(pieces) - 1            # its unsignaled writes too
            for region in regions:
                self.registrations.release(region)

    def _on_receive(self, index: int, nbytes: int) -> None:
        try:
            message = wire.decode(memoryview(self._receive[index, :nbytes].tobytes()))
        except ProtocolError as exc:
            self._fail("a malformed message: %s" % exc)
            return
        self._repost(index)
        if message[0] == wire.REPLY:
            _, message_id, targets = message
            outgoing = self._outgoing.get(message_id)
            if outgoing is None or message_id in self._writes \
                    or len(targets) != sum(outgoing[1]):
                self._fail("a REPLY to message %d with %d targets, which does not match what "
                           "was announced" % (message_id, len(targets)))
                return
            self._writes[message_id] = targets
            self._queue.append((_WRITES_DUE, message_id))
        elif message.kind == wire.INLINE:
            self._arrived(message.message_id, list(message.pieces))
        else:
            self._start(message)

    def _repost(self, index: int) -> None:
        self._post_receive(index)
        self._reposted += 1

    def _start(self, message: wire.Announce) -> None:
        """A START: choose and register a landing per written piece, queue the REPLY."""
        inline = iter(message.pieces)
        key = -1
        pieces, targets, regions = [], [], []
        for number, (length, flag) in enumerate(zip(message.lengths, message.inline)):
            if flag:
                piece = next(inline)
                if number == 1 and piece.nbytes >= 8:    # ps-lite's KV layout: keys first
                    key = int.from_bytes(piece[:8], "little")
            else:
                piece = self.landing(key, length)
                regions.append(self.registrations.acquire(
                    piece, Access.LOCAL_WRITE | Access.REMOTE_WRITE))
                targets.append((piece.ctypes.data, regions[-1].rkey))
            pieces.append(piece)
        self._incoming[message.message_id] = (pieces, regions)
        self._replies[message.message_id] = wire.encode_reply(message.message_id, targets)
        self._queue.append((wire.REPLY, message.message_id))

    def _landed(self, message_id: int) -> None:
        incoming = self._incoming.pop(message_id, None)
        if incoming is None:
            self._fail("a write for message %d, which was not announced" % message_id)
            return
        pieces, regions = incoming
        for region in regions:        # uncached: nothing may write there any more
            self.registrations.release(region)
        self._arrived(message_id, pieces)

    def _arrived(self, message_id: int, pieces: List) -> None:
        self._complete[message_id] = pieces
        while self._next_delivery in self._complete:
            self.delivered.append(self._complete.pop(self._next_delivery))
            self._next_delivery = (self._next_delivery + 1) & 0xFFFFFFFF

    def _fail(self, what: str) -> None:
        if self.failure is None:
            self.failure = PeerError("RDMA connection to %s (QP %d): %s"
                                     % (self.peer.address if self.peer else "?",
                                        self.qp.qp_num, what))
        try:
            self.qp.to_error()
        except VerbsError:
            pass                  # already failed beyond moving: nothing more to stop
        self._queue.clear()

    def _check(self) -> None:
        if self.failure is not None:
            raise self.failure
        if self.peer is None:
            raise ProtocolError("the RDMA channel is not connected")
