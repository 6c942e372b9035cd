"""One accepted byteps_tcp connection: its peer, the reader of its stream and the socket's
low-water mark (one wake-up per large frame instead of one per arriving burst)."""
import socket

from ..wire.message import K_EMPTY
from .reader import MessageReader
from .recv_buffers import RecvBufferPool

#: frames below this size are copied out of the read-ahead buffer; larger ones land in place
LAND_IN_PLACE_BYTES = 65536

#: SO_RCVLOWAT bounds while a large frame arrives (below the minimum, waking is cheap
#: enough; the kernel caps it at half the largest receive buffer anyway)
_MIN_LOW_WATER = 32768
_MAX_LOW_WATER = 1 << 20
#: SO_RCVBUF is read again after this many large frames (it only grows, by autotuning)
_RCVBUF_READ_EVERY = 64


class Inbound:
    """One accepted connection: its peer and the reader of its stream."""

    def __init__(self, sock: socket.socket, peer_id: int, address: str, pool: RecvBufferPool):
        sock.setblocking(False)
        self.sock, self.peer_id, self.address = sock, peer_id, address
        self.reader = MessageReader(pool, LAND_IN_PLACE_BYTES)
        self.low_water = 1          # the socket's SO_RCVLOWAT
        self._room = 0              # a quarter of SO_RCVBUF, as last read
        self._room_reads = 0        # wake_for calls until SO_RCVBUF is read again

    def wake_for(self, missing: int) -> None:
        """Let readiness wait until the frame being filled can complete (or
        ``_MAX_LOW_WATER`` bytes wait): one wake-up per large frame instead of one per
        arriving burst. Back to 1 byte between frames, so small messages wake it at once."""
        want = 1
        if missing >= _MIN_LOW_WATER:
            # Below a quarter of the receive buffer: a larger mark would make the kernel
            # grow the buffer and clamp the connection's window to the mark for good.
            want = min(missing, _MAX_LOW_WATER, self._quarter_buffer())
            if want < _MIN_LOW_WATER:
                want = 1
        if want != self.low_water:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, want)
            self.low_water = want

    def _quarter_buffer(self) -> int:
        """A quarter of the socket's receive buffer, read again every
        ``_RCVBUF_READ_EVERY`` calls: a system call per large frame cost more than the
        mark's accuracy is worth, and the kernel only grows the buffer (an old reading errs
        on the small side)."""
        if self._room_reads <= 0:
            self._room = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) // 4
            self._room_reads = _RCVBUF_READ_EVERY
        self._room_reads -= 1
        return self._room

    def peer_key(self) -> tuple:
        """Who to count log lines against: the host and the node id it claimed."""
        return self.address.rsplit(":", 1)[0], self.peer_id

    def describe(self) -> str:
        who = "node ?" if self.peer_id == K_EMPTY else "node %d" % self.peer_id
        return "%s (%s)" % (who, self.address)
