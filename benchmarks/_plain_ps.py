"""The replay benchmark's ceiling: the least a Python parameter server can do, on plain sockets.

    python launch.py -n 4 -s 4 --scheduler-cmd "python benchmarks/_plain_ps.py scheduler" \
        --server-cmd "python benchmarks/_plain_ps.py server" \
        python benchmarks/_replay_worker.py --kvstore plain ...

What a push/pull must do and nothing else: tensors cut into partitions of
``PLAIN_PARTITION_BYTES`` (default 4096000, dist_byteps's default), each placed on the server
with the fewest bytes so far; per server one TCP connection, one sending thread that sends the
highest-priority partition first (the socket buffer is the only credit) and one receiving
thread that lands each answer straight in the output; a server sums each partition in place
as the workers' copies arrive and sends the sum to every worker once all have. No protocol
beyond a 24-byte header, no acknowledgements, resends, engine, threads per stage, or checks of
the peers: what it costs on a machine is the floor under any Python implementation of the
same data path, which is what ``bench_replay.py --systems plain`` measures it for.

The scheduler only introduces servers to workers (``DMLC_PS_ROOT_URI``/``PORT``); roles and
counts come from the launcher's ``DMLC_*`` environment as for every other node.
"""
import heapq
import itertools
import json
import os
import queue
import socket
import struct
import sys
import threading
import time
from typing import Dict, List, Tuple

import numpy as np

HEADER = struct.Struct("<qqq")          # key, partition, bytes
DTYPES = {0: np.float32, 1: np.float16}
CODES = {np.dtype(v): k for k, v in DTYPES.items()}
DEADLINE_S = 300.0


def _recv_exact(sock: socket.socket, view: memoryview) -> bool:
    """Fill ``view``; False if the peer closed before the first byte."""
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            if got == 0:
                return False
            raise ConnectionError("peer closed mid-message")
        got += n
    return True


def _recv_line(sock: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError("peer closed before its line")
        data += chunk
    return data


def _listen(host: str, port: int = 0) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(64)
    return sock


def _connect(host: str, port: int) -> socket.socket:
    """Connect, retrying while the peer is not listening yet (nodes start in any order)."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=DEADLINE_S)
            break
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise TimeoutError("nothing listens at %s:%d after %.0f s"
                                   % (host, port, DEADLINE_S)) from None
            time.sleep(0.1)
    sock.settimeout(None)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _accept(listener: socket.socket, what: str) -> socket.socket:
    """The next connection, within ``DEADLINE_S``; the error names what did not come."""
    listener.settimeout(DEADLINE_S)
    try:
        return listener.accept()[0]
    except socket.timeout:
        raise TimeoutError("%s did not connect within %.0f s" % (what, DEADLINE_S)) from None


def _root() -> Tuple[str, int]:
    return os.environ["DMLC_PS_ROOT_URI"], int(os.environ["DMLC_PS_ROOT_PORT"])


# --------------------------------------------------------------------------- scheduler
def scheduler() -> int:
    """Collect the servers' addresses, hand the list to each worker, wait for everyone to go."""
    workers, servers = int(os.environ["DMLC_NUM_WORKER"]), int(os.environ["DMLC_NUM_SERVER"])
    sock = _listen(*_root())
    addresses: List[Tuple[int, list]] = []
    waiting_workers: List[socket.socket] = []
    while len(addresses) < servers or len(waiting_workers) < workers:
        conn = _accept(sock, "%d of %d servers and %d of %d workers" % (
            servers - len(addresses), servers, workers - len(waiting_workers), workers))
        hello = json.loads(_recv_line(conn))
        if hello["role"] == "server":
            addresses.append(hello["address"])
            conn.close()
        else:
            waiting_workers.append(conn)
    listing = (json.dumps(sorted(addresses)) + "\n").encode()
    for conn in waiting_workers:
        conn.sendall(listing)
    # the job ends when every worker has hung up: as long as training takes (launch.py's
    # --timeout bounds the job)
    for conn in waiting_workers:
        conn.settimeout(None)
        conn.recv(1)
        conn.close()
    return 0


# --------------------------------------------------------------------------- server
class _Sums:
    """Each partition's running sum for the current round, summed as the workers' copies
    arrive; complete when all ``workers`` have."""

    def __init__(self, workers: int):
        self.workers = workers
        self._lock = threading.Lock()
        self._rounds: Dict[Tuple[int, int], list] = {}

    def add(self, slot: Tuple[int, int], data: np.ndarray):
        """The complete sum once this is the last copy of the round, else None."""
        with self._lock:
            entry = self._rounds.get(slot)
            if entry is None:
                self._rounds[slot] = [data, 1, threading.Lock()]
                return data if self.workers == 1 else None
        with entry[2]:
            np.add(entry[0], data, out=entry[0])
            entry[1] += 1
            if entry[1] < self.workers:
                return None
        with self._lock:
            del self._rounds[slot]
        return entry[0]


def server() -> int:
    """Accept every worker; sum each partition over the workers; send each sum to all."""
    workers = int(os.environ["DMLC_NUM_WORKER"])
    listener = _listen(os.environ.get("DMLC_NODE_HOST", "127.0.0.1"))
    with _connect(*_root()) as sched:
        sched.sendall((json.dumps({"role": "server",
                                   "address": listener.getsockname()[:2]}) + "\n").encode())
    conns = [_accept(listener, "worker %d of %d" % (n + 1, workers)) for n in range(workers)]
    outboxes = [queue.Queue() for _ in conns]
    sums = _Sums(workers)

    def receive(conn):
        header = bytearray(HEADER.size)
        while _recv_exact(conn, memoryview(header)):
            key, part, code = HEADER.unpack(header)
            dtype, nbytes = DTYPES[code & 0xff], code >> 8
            data = np.empty(nbytes // np.dtype(dtype).itemsize, dtype)
            _recv_exact(conn, memoryview(data).cast("B"))
            total = sums.add((key, part), data)
            if total is not None:
                for outbox in outboxes:
                    outbox.put((bytes(header), total))

    def send(conn, outbox):
        while True:
            item = outbox.get()
            if item is None:
                return
            header, total = item
            conn.sendall(header)
            conn.sendall(memoryview(total).cast("B"))

    for conn in conns:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    receivers = [threading.Thread(target=receive, args=(c,), daemon=True) for c in conns]
    senders = [threading.Thread(target=send, args=(c, o), daemon=True)
               for c, o in zip(conns, outboxes)]
    for t in receivers + senders:
        t.start()
    for t in receivers:
        t.join()
    for outbox in outboxes:
        outbox.put(None)
    for t in senders:
        t.join(DEADLINE_S)
    return 0


# --------------------------------------------------------------------------- worker
class PlainKV:
    """A worker's side: ``pushpull(key, grad, out, priority)`` then ``wait(key)``; numpy arrays."""

    def __init__(self):
        self.rank = int(os.environ["DMLC_WORKER_ID"])
        self.num_workers = int(os.environ["DMLC_NUM_WORKER"])
        self.partition_bytes = int(os.environ.get("PLAIN_PARTITION_BYTES", 4096000))
        self._sched = _connect(*_root())
        self._sched.sendall(b'{"role": "worker"}\n')
        servers = json.loads(_recv_line(self._sched))
        self._socks = [_connect(host, port) for host, port in servers]
        self._load = [0] * len(servers)
        self._parts: Dict[int, List[Tuple[int, int, int]]] = {}   # key -> (server, lo, hi)
        self._outs: Dict[int, np.ndarray] = {}
        self._pending: Dict[int, int] = {}
        self._done: Dict[int, threading.Event] = {}
        self._lock = threading.Lock()
        self._queues = [[] for _ in servers]
        self._ready = [threading.Condition() for _ in servers]
        self._order = itertools.count()
        self._threads = [threading.Thread(target=fn, args=(s,), daemon=True)
                         for s in range(len(servers)) for fn in (self._send, self._receive)]
        for t in self._threads:
            t.start()

    def init(self, key: int, out: np.ndarray) -> None:
        """Place ``key``'s partitions (same order on every worker: same placement)."""
        flat = out.reshape(-1)
        step = max(1, self.partition_bytes // flat.itemsize)
        parts = []
        for lo in range(0, flat.size, step):
            server = self._load.index(min(self._load))
            hi = min(flat.size, lo + step)
            self._load[server] += (hi - lo) * flat.itemsize
            parts.append((server, lo, hi))
        self._parts[key] = parts
        self._done[key] = threading.Event()
        self._done[key].set()

    def pushpull(self, key: int, grad: np.ndarray, out: np.ndarray, priority: int) -> None:
        self._outs[key] = out.reshape(-1)
        self._done[key].clear()
        self._pending[key] = len(self._parts[key])
        flat = grad.reshape(-1)
        code = CODES[flat.dtype]
        for part, (server, lo, hi) in enumerate(self._parts[key]):
            header = HEADER.pack(key, part, code | ((hi - lo) * flat.itemsize) << 8)
            with self._ready[server]:
                heapq.heappush(self._queues[server], (-priority, next(self._order), header,
                                                      flat[lo:hi]))
                self._ready[server].notify()

    def wait(self, key: int) -> None:
        if not self._done[key].wait(DEADLINE_S):
            raise TimeoutError("no sum of key %d after %.0f s" % (key, DEADLINE_S))

    def close(self) -> None:
        for server, ready in enumerate(self._ready):
            with ready:
                heapq.heappush(self._queues[server], (float("inf"), 0, None, None))
                ready.notify()
        for sock in self._socks:
            sock.shutdown(socket.SHUT_WR)
        self._sched.close()

    def _send(self, server: int) -> None:
        sock, ready, heap = self._socks[server], self._ready[server], self._queues[server]
        while True:
            with ready:
                while not heap:
                    ready.wait()
                _, _, header, data = heapq.heappop(heap)
            if header is None:
                return
            sock.sendall(header)
            sock.sendall(memoryview(data).cast("B"))

    def _receive(self, server: int) -> None:
        sock, header = self._socks[server], bytearray(HEADER.size)
        while _recv_exact(sock, memoryview(header)):
            key, part, _ = HEADER.unpack(header)
            _, lo, hi = self._parts[key][part]
            _recv_exact(sock, memoryview(self._outs[key][lo:hi]).cast("B"))
            with self._lock:
                self._pending[key] -= 1
                last = self._pending[key] == 0
            if last:
                self._done[key].set()


if __name__ == "__main__":
    role = sys.argv[1] if len(sys.argv) > 1 else ""
    if role not in ("scheduler", "server"):
        sys.exit("usage: _plain_ps.py scheduler|server (workers use PlainKV)")
    sys.exit(scheduler() if role == "scheduler" else server())
