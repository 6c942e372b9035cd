"""The soft provider's fabric between processes: Unix sockets in Linux's abstract namespace.

Each process's device listens at ``@kvstore-byteps-soft-<pid>-<random>`` (an abstract socket:
no file to remove, gone with the process). A device sends its packets to another over one
connection per peer, which keeps their order; the target places each packet (its memory is
written by its own fabric thread, as a NIC's DMA would) and answers on the same connection.
Packets are a fixed header and two byte strings (:func:`encode` / :func:`decode`, pure); a
malformed packet closes its connection (logged), never reaches a device.
"""
import logging
import os
import select
import socket
import struct
import threading
from typing import Dict, Optional

from .api import Opcode, VerbsError, WCStatus
from .soft import Packet, SoftDevice

log = logging.getLogger(__name__)

_HEADER = struct.Struct("<BBBIIQQIIHI")   # opcode, answer, has_imm, src_qp, dst_qp, seq,
_OPCODES = list(Opcode)                   # remote_addr, rkey, imm, source bytes, payload bytes
_STATUSES = list(WCStatus)
_NO_ANSWER = 255
#: the largest payload a packet may carry (a van's partitions are far smaller)
MAX_PAYLOAD = 1 << 30
#: how long a peer may take none of a packet before it is given up
SEND_TIMEOUT_S = 30.0


def encode(packet: Packet) -> bytes:
    """The bytes of ``packet`` on a fabric connection."""
    source = packet.source.encode("utf-8")
    answer = _NO_ANSWER if packet.answer is None else _STATUSES.index(packet.answer)
    header = _HEADER.pack(_OPCODES.index(packet.opcode), answer, packet.imm_data is not None,
                          packet.src_qp, packet.dst_qp, packet.seq, packet.remote_addr,
                          packet.rkey, packet.imm_data or 0, len(source), len(packet.payload))
    return header + source + packet.payload


def decode_header(header: bytes):
    """``(fields, source length, payload length)``; VerbsError if malformed."""
    (opcode, answer, has_imm, src_qp, dst_qp, seq, remote_addr, rkey, imm, source_len,
     payload_len) = _HEADER.unpack(header)
    if opcode >= len(_OPCODES) or (answer >= len(_STATUSES) and answer != _NO_ANSWER) \
            or has_imm > 1 or payload_len > MAX_PAYLOAD:
        raise VerbsError("malformed soft fabric packet header")
    fields = dict(opcode=_OPCODES[opcode], src_qp=src_qp, dst_qp=dst_qp, seq=seq,
                  remote_addr=remote_addr, rkey=rkey, imm_data=imm if has_imm else None,
                  answer=None if answer == _NO_ANSWER else _STATUSES[answer])
    return fields, source_len, payload_len


def _read_exactly(sock: socket.socket, size: int) -> Optional[bytes]:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def send_within(sock: socket.socket, data: bytes, timeout: float) -> None:
    """``sock.sendall(data)``, but OSError if the peer takes nothing for ``timeout``
    seconds. The socket stays blocking for the thread reading it (each send does not wait)."""
    view = memoryview(data)
    while view:
        try:
            sent = sock.send(view, socket.MSG_DONTWAIT)
        except BlockingIOError:
            if not select.select([], [sock], [], timeout)[1]:
                raise OSError("the peer took nothing for %.0f s" % timeout) from None
            continue
        view = view[sent:]


def read_packet(sock: socket.socket) -> Optional[Packet]:
    """The next packet on ``sock``; None once the peer closed it."""
    header = _read_exactly(sock, _HEADER.size)
    if header is None:
        return None
    fields, source_len, payload_len = decode_header(header)
    body = _read_exactly(sock, source_len + payload_len)
    if body is None:
        return None
    try:
        source = body[:source_len].decode("utf-8")
    except UnicodeDecodeError:
        raise VerbsError("malformed soft fabric packet source") from None
    return Packet(source=source, payload=body[source_len:], **fields)


class UnixFabric:
    """This process's end of the soft fabric: one listening socket, one connection per peer."""

    def __init__(self):
        self.address = "@kvstore-byteps-soft-%d-%s" % (os.getpid(), os.urandom(4).hex())
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind("\0" + self.address[1:])
        self._listener.listen(64)
        self._device: Optional[SoftDevice] = None
        self._peers: Dict[str, _Link] = {}
        self._lock = threading.Lock()
        self._closed = False
        self.send_timeout = SEND_TIMEOUT_S
        self._start(self._accept_loop, "accept")

    def device(self) -> SoftDevice:
        return SoftDevice(self.address, self)

    def attach(self, device: SoftDevice) -> None:
        self._device = device

    def send(self, address: str, packet: Packet) -> None:
        """Queue ``packet`` for the device at ``address`` (its answer comes back later). A
        peer that cannot be reached, or takes none of a packet for :data:`SEND_TIMEOUT_S`,
        is given up as gone (its connection closed, the sends waiting for it fail with
        RETRY_EXC_ERR, as a NIC's retries end); a slow peer holds up only the sends to it."""
        data = encode(packet)
        with self._lock:
            link = self._peers.get(address)
            if link is None:
                link = self._peers[address] = _Link(self._connect(address))
        with link.lock:
            try:
                send_within(link.sock, data, self.send_timeout)
                return
            except OSError as exc:
                error = exc
        with self._lock:               # part of a packet may have gone: the stream is done
            if self._peers.get(address) is link:
                del self._peers[address]
        link.sock.close()
        log.warning("soft fabric: sending to %s failed: %s", address, error)
        self._device.peer_gone(address)

    def _connect(self, address: str) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect("\0" + address[1:])
        except OSError:
            sock.close()
            return _Unreachable(address)
        self._start(lambda: self._serve(sock, peer=address), "answers from %s" % address)
        return sock

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            self._start(lambda: self._serve(sock), "requests")

    def _serve(self, sock: socket.socket, peer: Optional[str] = None) -> None:
        """Read requests (place them, answer) or, on the connection to ``peer``, its answers
        (complete sends) until closed. A closed connection to a peer is forgotten: the next
        send to it connects anew (and finds no device if the peer is gone: a clear 'no soft
        RDMA device listens there')."""
        try:
            while True:
                packet = read_packet(sock)
                if packet is None:
                    return
                if peer is not None:
                    self._device.on_answer(packet)
                else:
                    verdict = self._device.receive(packet)
                    send_within(sock, encode(Packet(**{**packet.__dict__, "payload": b"",
                                                       "answer": verdict})), self.send_timeout)
        except (OSError, VerbsError) as exc:
            if not self._closed:
                log.warning("soft fabric connection closed: %s", exc)
        finally:
            if peer is not None:
                with self._lock:
                    link = self._peers.get(peer)
                    if link is not None and link.sock is sock:
                        del self._peers[peer]
            sock.close()
            if peer is not None and not self._closed:
                self._device.peer_gone(peer)

    def _start(self, target, what: str) -> None:
        threading.Thread(target=target, daemon=True, name="soft-rdma " + what).start()

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        with self._lock:
            for link in self._peers.values():
                link.sock.close()
            self._peers.clear()


class _Link:
    """The connection to one peer and the lock its senders take (whole packets in turn)."""

    def __init__(self, sock):
        self.sock, self.lock = sock, threading.Lock()


class _Unreachable:
    """A peer that could not be connected to: every send fails (the QP's send then fails
    with RETRY_EXC_ERR, as a send to a host that never answers would)."""

    def __init__(self, address: str):
        self.address = address

    def send(self, data, flags: int = 0) -> int:
        raise OSError("no soft RDMA device listens at %s" % self.address)

    def close(self) -> None:
        pass
