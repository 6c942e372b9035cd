"""The processes of one worker host, reduced among themselves first: one flow per host.

``bpslaunch`` starts one process per local device (``BYTEPS_LOCAL_SIZE``). As in BytePS, local
rank 0 (the *root*) is the host's only ``dist_byteps`` worker; the other processes (*members*)
hand it their tensors over a Unix socket private to the host and get the sum back:

    member:  hello(local rank)  ->  root  ->  welcome(the host's worker rank, workers)
    member:  part(name, seq, bytes)  ->  root
    root:    every local part of (name, seq) here  ->  one pushpull of their sum (the
             engine's local reduce adds them) -> result(name, seq, bytes) to every member
    member:  bye (at its end; a link that closes without it is a process that died)

Rounds are matched by name and by how many times the process used that name (``seq``), so
processes may use their names in different orders. Every call is an operation of MXNet's
engine (reading the input, writing the output), so it is as asynchronous as ``pushpull``; a
round that waits longer than the request deadline fails, naming the local ranks it lacks.

The socket lives in Linux's abstract namespace (no file to clean up), named after the job's
scheduler address and the host's worker id, so jobs sharing a machine do not meet.
"""
import json
import logging
import socket
import struct
import threading
import time
from typing import Dict, Optional, Tuple

import numpy as np

from kvstore_byteps.errors import DeadlineError, PeerError

__all__ = ["LocalRoot", "LocalMember", "group_address", "read_frame", "frame"]

log = logging.getLogger(__name__)

_HEADER = struct.Struct("<IQ")       # header bytes, payload bytes


def group_address(root_uri: str, root_port: str, worker_id: str) -> str:
    """The abstract socket name of one worker host's group."""
    return "\0kvstore-byteps-local/%s:%s/%s" % (root_uri, root_port, worker_id)


def frame(header: dict, payload=b"") -> Tuple[bytes, memoryview]:
    """A message: its prefix (lengths and JSON header) and its payload."""
    head = json.dumps(header).encode("utf-8")
    body = memoryview(payload).cast("B")
    return _HEADER.pack(len(head), body.nbytes) + head, body


def _read_exact(sock, count: int) -> bytearray:
    data = bytearray(count)
    view, got = memoryview(data), 0
    while got < count:
        n = sock.recv_into(view[got:], count - got)
        if n == 0:
            raise EOFError("the peer closed the connection")
        got += n
    return data


def read_frame(sock) -> Tuple[dict, bytearray]:
    """The next message on ``sock``: (header, payload). EOFError when the peer closed."""
    head_len, body_len = _HEADER.unpack(_read_exact(sock, _HEADER.size))
    header = json.loads(_read_exact(sock, head_len).decode("utf-8"))
    return header, _read_exact(sock, body_len)


class _Link:
    """One connection, with a lock so that messages from several threads do not interleave.
    A send that cannot go on for ``send_timeout`` seconds (the peer stopped reading) fails
    with an OSError instead of blocking its thread for good; reads wait as long as the peer
    is alive (the rounds have their own deadline)."""

    def __init__(self, sock, send_timeout: float):
        self.sock, self._lock = sock, threading.Lock()
        seconds = int(send_timeout)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO,
                        struct.pack("ll", seconds, int((send_timeout - seconds) * 1e6)))

    def send(self, header: dict, payload=b"") -> None:
        prefix, body = frame(header, payload)
        with self._lock:
            self.sock.sendall(prefix)
            if body.nbytes:
                self.sock.sendall(body)

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


class _Round:
    """One (name, seq) at the root: the local parts so far and the root's own operation."""

    def __init__(self, name: str, seq: int):
        self.name, self.seq = name, seq
        self.parts: Dict[int, np.ndarray] = {}       # local rank -> its bytes
        self.own = None          # (key, input view, output view, priority, done) of the root
        self.started = time.monotonic()
        self.launched = False


class LocalRoot:
    """Local rank 0: takes the members' parts, pushes and pulls each round's sum through the
    host's ``dist_byteps`` worker (``reduce_host(key, inputs, outputs, priority, on_done)``),
    and answers every member."""

    def __init__(self, address: str, local_size: int, store, timeout: float,
                 welcome: dict):
        self._size, self._store, self._timeout = local_size, store, timeout
        self._welcome = welcome
        self._rounds: Dict[Tuple[str, int], _Round] = {}
        self._members: Dict[int, _Link] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(address)
        self._listener.listen(local_size)
        self._all_joined = threading.Event()
        for target in (self._accept, self._watch):
            threading.Thread(target=target, name="local-root", daemon=True).start()

    def wait_members(self, timeout: float) -> None:
        """Block until every member connected; DeadlineError naming the missing ranks."""
        if not self._all_joined.wait(timeout):
            with self._lock:
                missing = sorted(set(range(1, self._size)) - set(self._members))
            raise DeadlineError("local rank 0: local rank(s) %s did not connect within %.0f s "
                                "(are all %d processes of this host running?)"
                                % (missing, timeout, self._size))

    def _accept(self) -> None:
        while not self._closed:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(_Link(sock, self._timeout),),
                             name="local-root-member", daemon=True).start()

    def _serve(self, link: _Link) -> None:
        rank = None
        try:
            header, _ = read_frame(link.sock)
            rank = int(header["local_rank"])
            if not 0 < rank < self._size or rank in self._members:
                raise PeerError("a process says it is local rank %r" % (rank,))
            with self._lock:
                self._members[rank] = link
                if len(self._members) == self._size - 1:
                    self._all_joined.set()
            link.send(self._welcome)
            while True:
                header, payload = read_frame(link.sock)
                if header.get("bye"):       # the member finished: its rounds are complete
                    with self._lock:
                        self._members.pop(rank, None)
                    link.close()
                    return
                self._take_part(rank, header, payload)
        except (EOFError, OSError, ValueError, KeyError, PeerError) as exc:
            if not self._closed:
                self._member_lost(rank, exc)

    def _take_part(self, rank: int, header: dict, payload: bytearray) -> None:
        part = np.frombuffer(payload, dtype=np.dtype(header["dtype"]))
        with self._lock:
            round_ = self._round(header["name"], int(header["seq"]))
            round_.parts[rank] = part
        self._maybe_launch(round_)

    def _round(self, name: str, seq: int) -> _Round:
        round_ = self._rounds.get((name, seq))
        if round_ is None:
            round_ = self._rounds[(name, seq)] = _Round(name, seq)
        return round_

    def reduce(self, key: int, name: str, seq: int, source, out, priority: int, done) -> None:
        """The root's own part of (name, seq), inside its engine operation: ``source`` and
        ``out`` are host views valid until ``done`` is called."""
        with self._lock:
            round_ = self._round(name, seq)
            round_.own = (key, source, out, priority, done)
        self._maybe_launch(round_)

    def _maybe_launch(self, round_: _Round) -> None:
        with self._lock:
            if round_.launched or round_.own is None or len(round_.parts) < self._size - 1:
                return
            round_.launched = True
        key, source, out, priority, done = round_.own
        for rank, part in round_.parts.items():
            if part.nbytes != source.nbytes or part.dtype != source.dtype:
                self._finish(round_, PeerError(
                    "tensor %r: local rank %d sent %d bytes of %s, local rank 0 has %d of %s"
                    % (round_.name, rank, part.nbytes, part.dtype, source.nbytes,
                       source.dtype)))
                return
        inputs = [source] + [round_.parts[r].reshape(source.shape) for r in sorted(round_.parts)]
        self._store.reduce_host(key, inputs, out, priority,
                                lambda error: self._finish(round_, error))

    def _finish(self, round_: _Round, error: Optional[BaseException]) -> None:
        with self._lock:
            self._rounds.pop((round_.name, round_.seq), None)
            members = dict(self._members)
        header = {"name": round_.name, "seq": round_.seq}
        out = round_.own[2] if round_.own is not None else None
        for rank in round_.parts:
            link = members.get(rank)
            if link is None:
                continue
            try:
                if error is None:
                    link.send(dict(header, ok=True), out)
                else:
                    link.send(dict(header, ok=False, error=str(error)))
            except OSError as exc:
                log.warning("local rank 0: could not answer local rank %d: %s", rank, exc)
        if round_.own is not None:
            round_.own[4](error)

    def _watch(self) -> None:
        """Fail rounds that waited longer than the deadline, naming who they wait for."""
        while not self._closed:
            time.sleep(min(1.0, self._timeout / 10))
            now = time.monotonic()
            with self._lock:
                late = [r for r in self._rounds.values()
                        if not r.launched and now - r.started > self._timeout]
            for round_ in late:
                waiting = sorted(set(range(self._size)) - set(round_.parts)
                                 - ({0} if round_.own is not None else set()))
                with self._lock:
                    if round_.launched:
                        continue
                    round_.launched = True
                self._finish(round_, DeadlineError(
                    "tensor %r (use %d): local rank(s) %s did not hand in their part within "
                    "%.0f s" % (round_.name, round_.seq, waiting, self._timeout)))

    def _member_lost(self, rank: Optional[int], exc: BaseException) -> None:
        log.error("local rank 0: local rank %s went away: %s", rank, exc)
        with self._lock:
            self._members.pop(rank, None)
            waiting = [r for r in self._rounds.values() if not r.launched]
        for round_ in waiting:
            with self._lock:
                if round_.launched:
                    continue
                round_.launched = True
            self._finish(round_, PeerError("local rank %s went away: %s" % (rank, exc)))

    def close(self) -> None:
        """Stop listening (waking the accepting thread, which holds the address) and close
        every member's link."""
        self._closed = True
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        with self._lock:
            links = list(self._members.values())
        for link in links:
            link.close()


class LocalMember:
    """A local rank above 0: sends its parts to the root and takes the sums back."""

    def __init__(self, address: str, local_rank: int, timeout: float):
        self.local_rank, self._timeout = local_rank, timeout
        self._pending: Dict[Tuple[str, int], tuple] = {}     # (name, seq) -> (out, done)
        self._lock = threading.Lock()
        self._closed = False
        deadline = time.monotonic() + timeout
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(address)
                break
            except OSError as exc:
                sock.close()
                if time.monotonic() > deadline:
                    raise DeadlineError("local rank %d: local rank 0 of this host did not "
                                        "listen within %.0f s: %s" % (local_rank, timeout, exc))
                time.sleep(0.1)
        self._link = _Link(sock, timeout)
        self._link.send({"local_rank": local_rank})
        sock.settimeout(timeout)
        try:
            #: what the root tells its members: the host's worker rank and the number of hosts
            self.welcome, _ = read_frame(sock)
        except (OSError, EOFError) as exc:
            sock.close()
            raise DeadlineError("local rank %d: no welcome from local rank 0 of this host "
                                "within %.0f s: %s" % (local_rank, timeout, exc)) from None
        sock.settimeout(None)
        threading.Thread(target=self._receive, name="local-member", daemon=True).start()

    def reduce(self, name: str, seq: int, source: np.ndarray, out: np.ndarray, done) -> None:
        """Hand in ``source`` for (name, seq); the sum lands in ``out``, then ``done``."""
        with self._lock:
            self._pending[(name, seq)] = (out, done)
        try:
            self._link.send({"name": name, "seq": seq, "dtype": source.dtype.str}, source)
        except OSError as exc:
            self._fail((name, seq), PeerError("local rank %d: sending tensor %r to local rank "
                                              "0 failed: %s" % (self.local_rank, name, exc)))

    def _fail(self, which, error) -> None:
        with self._lock:
            entry = self._pending.pop(which, None)
        if entry is not None:
            entry[1](error)

    def _receive(self) -> None:
        try:
            while True:
                header, payload = read_frame(self._link.sock)
                which = (header["name"], int(header["seq"]))
                with self._lock:
                    entry = self._pending.pop(which, None)
                if entry is None:
                    continue
                out, done = entry
                if not header.get("ok"):
                    done(PeerError("tensor %r: %s" % (header["name"], header.get("error"))))
                    continue
                np.copyto(out.reshape(-1).view(np.uint8), np.frombuffer(payload, np.uint8))
                done()
        except (EOFError, OSError, ValueError, KeyError) as exc:
            if self._closed:
                return
            with self._lock:
                pending, self._pending = list(self._pending.values()), {}
            for _, done in pending:
                done(PeerError("local rank %d: local rank 0 of this host went away: %s"
                               % (self.local_rank, exc)))

    def close(self) -> None:
        """Say goodbye to the root (this process is done) and close the link."""
        self._closed = True
        try:
            self._link.send({"bye": True})
        except OSError:
            pass
        self._link.close()
