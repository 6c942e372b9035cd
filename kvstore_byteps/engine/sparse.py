"""Row-sparse keys: MXNet's row_sparse initialisation, push and pull, spoken as MXNet's worker
speaks them (``EncodeRowSparseKey``, cmd = cantor(1, dtype), docs/pslite-wire.md §5.5), to our
servers and to MXNet's.

A key of ``total_rows`` rows of ``unit_len`` elements lives in row ranges (:class:`RowRange`),
each on one server under a master ps key. A request to a range names its master (lens 0) and one
ps key per row, ``master + row - first row of the range``, lens a row's bytes: only the rows a
push carries travel, and a pull gets just the rows it names. The servers sum a round's rows from
every worker and, with an optimizer, update those rows (lazily, where MXNet's optimizers do).
Every push names every range (its master alone where it has no rows: MXNet's servers count a
round's pushes by workers); a pull names only the ranges holding rows it asks for.

The ranges are the servers' dialect's (:mod:`.layout`): on MXNet's servers, MXNet's own, one
range on the server ``(key * 9973) % S`` or, at ``MXNET_KVSTORE_BIGARRAY_BOUND`` elements and
more, one per server (server ``i`` holds rows ``[llround(R / S * i), llround(R / S * (i + 1)))``),
master ``begin(server) + key`` (:func:`mxnet_ranges`). On ours, where the link is slow (rank 0
decides at start, engine/sizing.py) a key is cut into ranges of about ``ROW_RANGE_BYTES``,
interleaved over the servers, up to ``ROW_RANGES_PER_SERVER`` a server, else into a range a
server (:func:`chunked_ranges`), master ``begin(server) + (key << 16 | ROW_SPARSE_INDEX - c)``
for its ``c``-th range there (an index no dense partition of another key meets): each range's
round closes, is updated and answered on its own. A pull of a range goes right behind this
worker's push of it, naming the push (``after_push``), and our server answers it once that
push's round is done (kvstore_byteps/serving/following.py), while the other ranges' pushes are
still on the wire: the two directions of every link carry the step at once. (MXNet's servers answer a pull
at once, so there a range's pull waits for its push's answer.)

:func:`row_parts` is pure; :class:`RowSparseKeys` sends requests through the KV layer's worker
(a port: the KV app, the ranges of a key, a barrier).
"""
import dataclasses
import functools
import threading
from typing import Callable, List, Optional

import numpy as np

from ..errors import DeadlineError, KVStoreBytePSError
from ..mxproto import RequestType, encode_cmd
from ..van.wire.keys import ROW_RANGES_PER_SERVER
from .upstream import dtype_code, mxnet_server_for_key, round_half_away

__all__ = ["ROW_RANGE_BYTES", "RowPush", "RowRange", "RowRequest", "RowSparseKeys", "SparsePort",
           "chunked_ranges", "mxnet_ranges", "row_parts", "row_ranges"]

#: the bytes of a row range on our servers, about, where the link is slow (engine/sizing.py
#: chooses at start, and every worker takes rank 0's choice: a push to a range nobody
#: initialised would initialise it); keys smaller than this keep one range. Measured, BERT's
#: embedding 4 x 4 on emulated links, 8 ranges in flight: at 500 Mbit/s 23 ranges (4 MB)
#: 0.343-0.352 s a step, 32 (2 MB, 8 a server) 0.324-0.339 s, 46 and 67 (16 a server) 0.35 and
#: 0.38 s; at 200 Mbit/s 23 ranges 0.88 s, 32 ranges 1.02-1.04 s (each range costs CPU, and
#: there the kernel's share of a step doubled)
ROW_RANGE_BYTES = 4096000
#: a push's ranges sent and not answered, at most (:class:`RowPush`): of 4, 6, 8, 10, 12, 16
#: and no limit, 8-10 gave the shortest step (0.34 s against 0.37 s unlimited, the case above)
IN_FLIGHT = 8


@dataclasses.dataclass(frozen=True)
class RowRange:
    """Rows ``[first, end)`` of a key, kept by one server under ``master``."""

    first: int
    end: int
    master: int


@dataclasses.dataclass(frozen=True)
class RowRequest:
    """One request to one range: its ps keys (the master's first, then ascending) and lens in
    bytes, and the rows it carries, in the order they travel (``rows[lo:hi]`` of the whole
    request's rows)."""

    range: int
    keys: np.ndarray
    lens: np.ndarray
    lo: int
    hi: int


def row_ranges(total_rows: int, num_servers: int) -> List[tuple]:
    """MXNet's row range ``(first, end)`` of each server for a big row_sparse array."""
    bounds = [round_half_away(total_rows / num_servers * i) for i in range(num_servers + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


def mxnet_ranges(key: int, total_rows: int, unit_len: int, masters: List[int],
                 bigarray_bound: int) -> List[RowRange]:
    """MXNet's layout (``masters[i]``: the key's master on server ``i``): every row on one
    server, or a range a server for big keys."""
    if total_rows * unit_len >= bigarray_bound:
        return [RowRange(first, end, master) for (first, end), master
                in zip(row_ranges(total_rows, len(masters)), masters)]
    return [RowRange(0, total_rows, masters[mxnet_server_for_key(key, len(masters))])]


def chunked_ranges(key: int, total_rows: int, row_bytes: int, num_servers: int,
                   range_bytes: int, master: Callable[[int, int], int]) -> List[RowRange]:
    """Our servers' layout: about ``range_bytes`` a range, at most ``ROW_RANGES_PER_SERVER`` a
    server (``range_bytes`` 0: a range a server, keys under ``ROW_RANGE_BYTES`` one range), at
    least one row each, range ``j`` on server ``(first server + j) % S``, the first server
    MXNet's for the key; ``master(server, c)``: the master of the ``c``-th range on
    ``server``."""
    most = num_servers * (ROW_RANGES_PER_SERVER if range_bytes else 1)
    count = -(-total_rows * row_bytes // (range_bytes or ROW_RANGE_BYTES))
    count = max(1, min(count, most, total_rows))
    first_server = mxnet_server_for_key(key, num_servers)
    return [RowRange(first, end, master((first_server + j) % num_servers, j // num_servers))
            for j, (first, end) in enumerate(row_ranges(total_rows, count))]


def row_parts(rows: np.ndarray, ranges: List[RowRange], row_bytes: int,
              every_range: bool) -> List[RowRequest]:
    """The requests carrying (or asking for) ``rows`` (sorted, unique int64), one a range, in
    row order; ``every_range``: also the ranges without rows (a push), else only those with."""
    parts = []
    bounds = np.searchsorted(rows, [r.first for r in ranges] + [ranges[-1].end])
    for index, found in enumerate(ranges):
        lo, hi = int(bounds[index]), int(bounds[index + 1])
        if hi == lo and not every_range:
            continue
        keys = np.empty(hi - lo + 1, dtype=np.uint64)
        keys[0] = found.master
        keys[1:] = rows[lo:hi] - found.first
        keys[1:] += np.uint64(found.master)
        lens = np.full(hi - lo + 1, row_bytes, dtype=np.int32)
        lens[0] = 0
        parts.append(RowRequest(index, keys, lens, lo, hi))
    return parts


class RowPush:
    """One push of a row_sparse key, range by range in row order, each range's request sent
    once at most ``in_flight`` ranges are sent and not answered (None: no limit). The limit
    keeps the ranges' rounds closing in order, the first soon (sent all at once, every range
    shares the links and the first round closes late), and where a range's pull waits for its
    push's answer (MXNet's servers) lets that pull go out behind a few ranges' pushes rather
    than behind all of them (a worker's requests to a server share one connection). The next
    range is sent from an answer's callback, so no thread waits for the other workers: every
    worker sends a key's ranges in the same order, and a range is answered once all of them
    sent it. ``on_sent(range, timestamp)`` runs as each range's request is sent;
    ``callback(range, request)`` as it is answered."""

    def __init__(self, kv, cmd: int, parts: List[RowRequest], data: np.ndarray,
                 row_bytes: int, in_flight: Optional[int], callback: Optional[Callable],
                 on_sent: Optional[Callable]):
        self.kv, self.cmd, self.parts, self.data = kv, cmd, parts, data
        self.row_bytes, self.callback, self.on_sent = row_bytes, callback, on_sent
        self.in_flight = len(parts) if in_flight is None else max(1, in_flight)
        self._lock = threading.Lock()
        self._next = 0
        self._left = len(parts)
        self._done = threading.Event()
        self.error = None

    def start(self) -> None:
        for _ in range(min(self.in_flight, len(self.parts))):
            self._send_next()

    def _send_next(self) -> None:
        with self._lock:
            if self._next == len(self.parts):
                return
            part = self.parts[self._next]
            self._next += 1
        values = self.data[part.lo * self.row_bytes:part.hi * self.row_bytes]
        try:
            request = self.kv.push(part.keys, values, part.lens, cmd=self.cmd,
                                   callback=functools.partial(self._answered, part.range))
        except BaseException as exc:       # not sent: said as this range's answer
            self._answered(part.range, _Unsent(exc))
            return
        if self.on_sent is not None:
            self.on_sent(part.range, request.timestamp)

    def _answered(self, index: int, request) -> None:
        if request.error is not None and self.error is None:
            self.error = request.error
        if self.callback is not None:
            self.callback(index, request)
        if self.in_flight < len(self.parts):
            self._send_next()
        with self._lock:
            self._left -= 1
            if self._left == 0:
                self._done.set()

    def wait(self, timeout: float) -> None:
        """Until every range was answered; raises the first error."""
        if not self._done.wait(timeout):
            raise DeadlineError("row_sparse push: %d of %d ranges not answered within %.0f s"
                                % (self._left, len(self.parts), timeout))
        if self.error is not None:
            raise KVStoreBytePSError("row_sparse push failed: %s" % self.error)


@dataclasses.dataclass
class _Unsent:
    error: BaseException


@dataclasses.dataclass(frozen=True)
class SparsePort:
    """What row_sparse keys need of the worker engine: the KV layer's worker app (``kv``), the
    row ranges of a key on the servers (``ranges(key, total_rows, unit_len, itemsize)``, the
    dialect's), a barrier of the workers (``barrier(what)``), the rank, the request deadline
    and what the servers do with a pull that follows a push."""

    kv: object
    ranges: Callable[[int, int, int, int], List[RowRange]]
    barrier: Callable[[str], None]
    rank: int
    request_timeout: float
    #: the servers hold a pull that names the push it follows (``after_push``) until that
    #: push's round is done (ours: kvstore_byteps/serving/following.py); MXNet's at once
    pulls_follow: bool = False


@dataclasses.dataclass
class _Key:
    shape: tuple
    dtype: np.dtype
    ranges: List[RowRange]
    unit_len: int = 0     # elements a row
    row_bytes: int = 0
    cmd: int = 0

    def __post_init__(self) -> None:       # asked for on every request: worked out once
        self.unit_len = int(np.prod(self.shape[1:], dtype=np.int64))
        self.row_bytes = self.unit_len * self.dtype.itemsize
        self.cmd = encode_cmd(RequestType.ROW_SPARSE, dtype_code(self.dtype))


class RowSparseKeys:
    """The row_sparse keys of one worker. Thread-safe as the KV worker is; a key's push and
    pull are ordered by the caller (a range's pull after its push was answered)."""

    def __init__(self, port: SparsePort):
        self.port = port
        self._keys = {}

    def known(self, key: int) -> bool:
        """Whether ``key`` was initialised as a row_sparse key."""
        return key in self._keys

    def shape(self, key: int) -> tuple:
        return self._keys[key].shape

    @property
    def pulls_follow(self) -> bool:
        """Whether a pull may be sent right behind a push of its range, naming it
        (:meth:`send_pull`), instead of after its answer."""
        return self.port.pulls_follow

    def range_count(self, key: int) -> int:
        """How many row ranges ``key`` has: a push is answered range by range."""
        return len(self._meta(key, "key %d" % key).ranges)

    def init(self, key: int, value: np.ndarray, name: str) -> None:
        """Declare ``key`` (every row of rank 0's dense ``value`` goes to the servers, so they
        hold the whole shape however few rows it stores), then a barrier. Blocking."""
        if value.ndim < 1 or value.shape[0] == 0:
            raise KVStoreBytePSError("row_sparse key %s needs at least one row, got shape %s"
                                     % (name, value.shape))
        if key in self._keys:
            raise KVStoreBytePSError("row_sparse key %s was initialised already" % name)
        dtype = np.dtype(value.dtype)
        unit_len = int(np.prod(value.shape[1:], dtype=np.int64))
        self._keys[key] = _Key(tuple(value.shape), dtype, self.port.ranges(
            key, value.shape[0], unit_len, dtype.itemsize))
        if self.port.rank == 0:
            rows = np.arange(value.shape[0], dtype=np.int64)
            self.push(key, rows, value.reshape(value.shape[0], -1), name).wait(
                self.port.request_timeout)
        self.port.barrier("initialising row_sparse key %s" % name)

    def push(self, key: int, rows: np.ndarray, values: np.ndarray, name: str,
             callback: Optional[Callable] = None,
             on_sent: Optional[Callable] = None) -> "RowPush":
        """Push ``values[i]``, row ``rows[i]`` (sorted, unique) of ``key``: this worker's share
        of the round's sum, a request a range (:class:`RowPush`). A range's request is answered
        once its round is complete (every worker's push summed, and updated);
        ``callback(range, request)`` then; ``on_sent(range, timestamp)`` as it is sent."""
        meta = self._meta(key, name)
        rows = self._rows(meta, rows)
        values = np.ascontiguousarray(values, dtype=meta.dtype).reshape(len(rows), meta.unit_len)
        push = RowPush(self.port.kv, meta.cmd, row_parts(rows, meta.ranges, meta.row_bytes,
                                                         every_range=True),
                       values.reshape(-1).view(np.uint8), meta.row_bytes,
                       IN_FLIGHT, callback, on_sent)
        push.start()
        return push

    def pull_parts(self, key: int, rows: np.ndarray, name: str) -> List[RowRequest]:
        """The pull requests of rows ``rows`` (sorted, unique) of ``key``, one for each range
        holding any of them (send each with :meth:`send_pull`)."""
        meta = self._meta(key, name)
        return row_parts(self._rows(meta, rows), meta.ranges, meta.row_bytes,
                         every_range=False)

    def send_pull(self, key: int, part: RowRequest, after_push: Optional[int] = None):
        """Send one of :meth:`pull_parts`; returns its request. ``after_push``: the timestamp
        of this worker's push of the part's range that it follows, not answered yet (only
        where ``pulls_follow``): the servers answer once that push's round is done."""
        extra = None if after_push is None else {"after_push": after_push}
        return self.port.kv.pull(part.keys, cmd=self._keys[key].cmd, extra=extra)

    def gather(self, key: int, rows: np.ndarray, name: str, parts: List[RowRequest],
               requests: list) -> np.ndarray:
        """The rows of the answered ``requests`` (to ``parts``), an array of ``(len(rows),) +
        shape[1:]``: a read-only view of the answer where one range held them all, else one
        copy. Blocking, with the request deadline."""
        meta = self._meta(key, name)
        out_shape = (len(rows),) + meta.shape[1:]
        data = []
        for part, request in zip(parts, requests):
            values = np.frombuffer(self._wait(request).vals, dtype=meta.dtype)
            if values.size != (part.hi - part.lo) * meta.unit_len:
                raise KVStoreBytePSError("row_sparse pull of %s: %d values came for %d rows of %d"
                                         % (name, values.size, part.hi - part.lo, meta.unit_len))
            data.append(values)
        if len(data) == 1:
            return data[0].reshape(out_shape)    # a view of the answer, which nothing else holds
        if not data:
            return np.zeros(out_shape, dtype=meta.dtype)
        return np.concatenate(data).reshape(out_shape)

    def _meta(self, key: int, name: str) -> _Key:
        meta = self._keys.get(key)
        if meta is None:
            raise KeyError("row_sparse key %s was not initialised: call init first" % name)
        return meta

    @staticmethod
    def _rows(meta: _Key, rows: np.ndarray) -> np.ndarray:
        rows = np.ascontiguousarray(rows, dtype=np.int64)
        if len(rows) and (rows[0] < 0 or rows[-1] >= meta.shape[0]):
            raise IndexError("row ids must lie in [0, %d), got %d..%d"
                             % (meta.shape[0], rows[0], rows[-1]))
        return rows

    def _wait(self, request):
        return request.wait(self.port.request_timeout)
