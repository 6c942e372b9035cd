"""Incremental reader of one byteps_tcp connection (wire format: frame.py). Socket-free.

The van's receive thread serves every connection at once, so it must never wait for one of
them: a server reading one worker's 4 MB push to the end while the other workers' data waits
would stall those workers' links, and with them their pushes to every other server. So the
reader takes whatever the socket has right now, advances its parse, and returns the messages
completed so far; the rest of a message is read on the next readiness event.

Small pieces (header, meta, frames under ``land_bytes``) are read through a read-ahead buffer,
which turns many small messages into one ``recv``. A large frame is received straight into its
landing buffer from the :class:`~kvstore_byteps.van.tcp.recv_buffers.RecvBufferPool` (only the part
that already sat in the read-ahead buffer is copied), or into the consumer's own memory where
it expected that frame (``RecvBufferPool.expect``; written only under the pool's
``landing_lock`` and never once the landing is revoked).
"""
import contextlib
from typing import Callable, List, Optional, Tuple

import numpy as np

from ...errors import ProtocolError
from . import frame as tcp_frame
from .recv_buffers import Landing, RecvBufferPool

__all__ = ["MessageReader"]

#: per call, stop reading a busy connection after this many bytes so the others get a turn
_FAIR_SHARE_BYTES = 8 << 20
#: the most one ``recv`` puts in the read-ahead buffer. The first bytes of a large frame that
#: came in with its header are copied out of the read-ahead again, with the GIL held: a read of
#: 256 KB made that up to a third of a 768 KB frame (worker, loopback, 100 x 768 KB unfused:
#: about a fifth of the receive thread's time). 16 KB still takes about a hundred
#: acknowledgements, or four 4 KB frames, in one call.
_READ_STEP_BYTES = 16 << 10


class MessageReader:
    """Parses one connection's stream into ``(meta bytes, data frames)`` pairs."""

    def __init__(self, pool: RecvBufferPool, land_bytes: int = 65536,
                 read_ahead_bytes: int = 1 << 18):
        if read_ahead_bytes < 2 * land_bytes:
            raise ValueError("the read-ahead buffer must hold two small frames")
        self.pool, self.land_bytes = pool, land_bytes
        self._buffer = bytearray(read_ahead_bytes)
        self._view = memoryview(self._buffer)
        self._start = self._end = 0
        #: why the stream ended (EOFError or ProtocolError), once it did
        self.failure: Optional[BaseException] = None
        self._reset()

    def _reset(self) -> None:
        self._meta_bytes: Optional[int] = None
        self._count = 0
        self._lengths: Optional[List[int]] = None
        self._meta: Optional[bytes] = None
        self._frames: list = []
        self._key = -1
        self._target = None              # a large frame or meta being filled in place
        self._target_view: Optional[memoryview] = None
        self._landing: Optional[Landing] = None   # set while the target is a consumer's
        self._filled = 0

    @property
    def frame_bytes_missing(self) -> int:
        """Bytes still missing from the large frame being filled in place (0 when none is):
        nothing completes before they all arrive, so the van need not wake up for less."""
        if self._target_view is None:
            return 0
        return self._target_view.nbytes - self._filled

    @property
    def in_message(self) -> bool:
        """Whether part of a message has arrived (an EOF now cuts a message short)."""
        return self._meta_bytes is not None or self._end > self._start

    def read(self, recv_into: Callable[[memoryview], int]) -> List[Tuple[bytes, list]]:
        """Read what ``recv_into`` (a non-blocking socket's) has now; the messages completed.

        ``recv_into`` returns the bytes received (0 at EOF) or raises BlockingIOError when
        nothing is there. At EOF or on a framing error, ``failure`` is set and the messages
        completed before it are still returned.
        """
        done: List[Tuple[bytes, list]] = []
        received = 0
        try:
            while received < _FAIR_SHARE_BYTES:
                self._parse(done)
                if self._target_view is not None:
                    view = self._target_view[self._filled:]
                else:
                    self._make_room()
                    view = self._view[self._end:self._end + _READ_STEP_BYTES]
                try:
                    if self._landing is not None:
                        got = self._recv_into_landing(recv_into)
                    else:
                        got = recv_into(view)
                except (BlockingIOError, InterruptedError):
                    break
                if not got:
                    raise EOFError("the peer closed the connection")
                received += got
                if self._target_view is not None:
                    self._filled += got
                else:
                    self._end += got
                if got < view.nbytes:
                    # A short read emptied the socket: the next recv would only fail with
                    # EAGAIN (a system call and an exception per wake-up). Readiness is
                    # level-triggered, so bytes that come meanwhile wake the van again.
                    break
            self._parse(done)
        except (EOFError, ProtocolError) as exc:
            self.failure = exc
        return done

    # ------------------------------------------------------------------ parsing
    @property
    def _buffered(self) -> int:
        return self._end - self._start

    def _consume(self, size: int) -> bytes:
        data = bytes(self._view[self._start:self._start + size])
        self._start += size
        return data

    def _make_room(self) -> None:
        if self._start == self._end:
            self._start = self._end = 0
        elif len(self._buffer) - self._end < self.land_bytes:
            size = self._buffered
            self._view[:size] = self._view[self._start:self._end]
            self._start, self._end = 0, size

    def _land(self, target, landing: Optional[Landing] = None) -> None:
        """Fill ``target`` in place: from the read-ahead buffer first, then from the socket."""
        self._target, self._target_view = target, memoryview(target).cast("B")
        self._landing = landing
        self._filled = min(self._buffered, self._target_view.nbytes)
        with self.pool.landing_lock if landing is not None else contextlib.nullcontext():
            self._away_if_revoked()
            self._target_view[:self._filled] = self._view[self._start:self._start + self._filled]
        self._start += self._filled

    def _recv_into_landing(self, recv_into: Callable[[memoryview], int]) -> int:
        """``recv_into`` the consumer's target, unless it was revoked meanwhile."""
        with self.pool.landing_lock:
            self._away_if_revoked()
            return recv_into(self._target_view[self._filled:])

    def _away_if_revoked(self) -> None:
        """(Under ``landing_lock``.) The consumer took its target back: the rest of the frame
        goes to a scratch buffer, and the message carries that (its request is over anyway)."""
        if self._landing is not None and self._landing.revoked:
            scratch = np.empty(self._target_view.nbytes, np.uint8)
            self._target, self._target_view = scratch, memoryview(scratch)
            self._landing = None

    def _parse(self, done: list) -> None:
        """Advance as far as the buffered bytes allow, appending completed messages."""
        # (the buffer's ends are read into locals once per step: this runs for every message)
        head_bytes = tcp_frame.HEAD_BYTES
        while True:
            if self._target_view is not None:
                if self._filled < self._target_view.nbytes:
                    return
                target, self._target, self._target_view = self._target, None, None
                self._landing = None
                if self._meta is None:
                    self._meta = bytes(target)
                else:
                    self._frames.append(target)
                continue
            buffered = self._end - self._start
            if self._meta_bytes is None:
                if buffered < head_bytes:
                    return
                self._meta_bytes, self._count = tcp_frame.decode_header_start(self._buffer,
                                                                              self._start)
                self._start += head_bytes
                buffered -= head_bytes
            if self._lengths is None:
                size = 8 * self._count
                if buffered < size:
                    return
                self._lengths = tcp_frame.decode_frame_lengths(self._buffer, self._count,
                                                               self._start)
                self._start += size
                buffered -= size
            if self._meta is None:
                if self._meta_bytes > len(self._buffer) - self.land_bytes:
                    self._land(bytearray(self._meta_bytes))
                    continue
                if buffered < self._meta_bytes:
                    return
                self._meta = self._consume(self._meta_bytes)
                buffered -= self._meta_bytes
            frames = self._frames
            index = len(frames)
            if index == self._count:
                done.append((self._meta, frames))
                self._reset()
                continue
            size = self._lengths[index]
            if size >= self.land_bytes:
                self._land(*self.pool.take_for_frame(self._key, size))
                continue
            if buffered < size:
                return
            frame = self._consume(size)
            if index == 0 and size >= 8:       # ps-lite KV layout: the keys frame comes first
                self._key = int.from_bytes(frame[:8], "little")
            frames.append(frame)
