"""Row-sparse keys: MXNet's row_sparse initialisation, push and pull, spoken as MXNet's worker
speaks them (``EncodeRowSparseKey``, cmd = cantor(1, dtype), docs/pslite-wire.md §5.5), to our
servers and to MXNet's.

A key of ``total_rows`` rows of ``unit_len`` elements lives, as in MXNet, on one server
(``(key * 9973) % S``) or, at ``MXNET_KVSTORE_BIGARRAY_BOUND`` elements and more, in row
ranges over all servers (server ``i`` holds rows ``[llround(R / S * i), llround(R / S * (i +
1)))``). A request names, per server, a master key (lens 0) and one ps key per row, ``master +
row - first row of that server``, lens a row's bytes: only the rows a push carries travel, and a
pull gets just the rows it names. The servers sum a round's rows from every worker and, with an
optimizer, update those rows (lazily, where MXNet's optimizers do).

The master key is MXNet's own, ``begin(server) + key``, on MXNet's servers; on ours it is
``begin(server) + (key << 16 | ROW_SPARSE_INDEX)`` (:mod:`.partition`'s encoding, an index no
dense partition takes), so a row_sparse key never meets a dense key's partitions there (MXNet's
``begin + key`` would meet dense key 0's partition ``key``).

:func:`row_request` is pure; :class:`RowSparseKeys` sends requests through the KV layer's worker
(a port: the KV app, the servers' master keys, a barrier).
"""
import dataclasses
from typing import Callable, List, Optional

import numpy as np

from ..errors import KVStoreBytePSError
from ..mxproto import RequestType, encode_cmd
from .partition import ROW_SPARSE_INDEX
from .upstream import dtype_code, mxnet_server_for_key, round_half_away

__all__ = ["ROW_SPARSE_INDEX", "RowRequest", "RowSparseKeys", "SparsePort", "row_request",
           "row_ranges"]

@dataclasses.dataclass(frozen=True)
class RowRequest:
    """One row_sparse request: its ps keys (non-decreasing: a server's first row shares the
    master's key) and lens in bytes, and the rows it carries, in the order they travel."""

    keys: np.ndarray
    lens: np.ndarray
    rows: np.ndarray


def row_ranges(total_rows: int, num_servers: int) -> List[tuple]:
    """MXNet's row range ``(first, end)`` of each server for a big row_sparse array."""
    bounds = [round_half_away(total_rows / num_servers * i) for i in range(num_servers + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


def row_request(key: int, rows: np.ndarray, unit_len: int, total_rows: int, itemsize: int,
                masters: List[int], bigarray_bound: int) -> RowRequest:
    """The request carrying (or asking for) ``rows`` (sorted, unique int64) of ``key``;
    ``masters[i]``: the key's master ps key on server ``i``."""
    num_servers = len(masters)
    row_bytes = unit_len * itemsize
    if total_rows * unit_len >= bigarray_bound:
        keys, lens, taken = [], [], []
        for server, (first, end) in enumerate(row_ranges(total_rows, num_servers)):
            lo, hi = np.searchsorted(rows, [first, end])
            part = rows[lo:hi]
            keys.append(np.array([masters[server]], dtype=np.uint64))
            keys.append((part - first).astype(np.uint64) + np.uint64(masters[server]))
            lens.append(np.zeros(1, dtype=np.int32))
            lens.append(np.full(len(part), row_bytes, dtype=np.int32))
            taken.append(part)
        return RowRequest(np.concatenate(keys), np.concatenate(lens), np.concatenate(taken))
    master = masters[mxnet_server_for_key(key, num_servers)]
    keys = np.concatenate(([np.uint64(master)], rows.astype(np.uint64) + np.uint64(master)))
    lens = np.concatenate(([0], np.full(len(rows), row_bytes))).astype(np.int32)
    return RowRequest(keys.astype(np.uint64), lens, rows)


@dataclasses.dataclass(frozen=True)
class SparsePort:
    """What row_sparse keys need of the worker engine: the KV layer's worker app (``kv``), the
    master ps key of a key on each server (``masters(key)``), a barrier of the workers
    (``barrier(what)``), the rank, the big-array bound and the request deadline."""

    kv: object
    masters: Callable[[int], List[int]]
    barrier: Callable[[str], None]
    rank: int
    bigarray_bound: int
    request_timeout: float


@dataclasses.dataclass
class _Key:
    shape: tuple
    dtype: np.dtype

    @property
    def unit_len(self) -> int:
        return int(np.prod(self.shape[1:], dtype=np.int64))


class RowSparseKeys:
    """The row_sparse keys of one worker. Thread-safe as the KV worker is; a key's push and
    pull are ordered by the caller."""

    def __init__(self, port: SparsePort):
        self.port = port
        self._keys = {}

    def known(self, key: int) -> bool:
        """Whether ``key`` was initialised as a row_sparse key."""
        return key in self._keys

    def shape(self, key: int) -> tuple:
        return self._keys[key].shape

    def init(self, key: int, value: np.ndarray, name: str) -> None:
        """Declare ``key`` (every row of rank 0's dense ``value`` goes to the servers, so they
        hold the whole shape however few rows it stores), then a barrier. Blocking."""
        if value.ndim < 1 or value.shape[0] == 0:
            raise KVStoreBytePSError("row_sparse key %s needs at least one row, got shape %s"
                                     % (name, value.shape))
        if key in self._keys:
            raise KVStoreBytePSError("row_sparse key %s was initialised already" % name)
        self._keys[key] = meta = _Key(tuple(value.shape), np.dtype(value.dtype))
        if self.port.rank == 0:
            rows = np.arange(value.shape[0], dtype=np.int64)
            self._wait(self.push(key, rows, value.reshape(value.shape[0], -1), name))
        self.port.barrier("initialising row_sparse key %s" % name)
        return meta

    def push(self, key: int, rows: np.ndarray, values: np.ndarray, name: str,
             callback: Optional[Callable] = None):
        """Push ``values[i]``, row ``rows[i]`` (sorted, unique) of ``key``: this worker's share
        of the round's sum. The request is answered once the round is complete (every
        worker's push summed, and updated); ``callback(request)`` then. Returns the request."""
        meta = self._meta(key, name)
        values = np.ascontiguousarray(values, dtype=meta.dtype).reshape(len(rows), meta.unit_len)
        request = self._request(key, meta, rows)
        return self.port.kv.push(request.keys, values.reshape(-1).view(np.uint8), request.lens,
                                 cmd=encode_cmd(RequestType.ROW_SPARSE, dtype_code(meta.dtype)),
                                 callback=callback)

    def pull(self, key: int, rows: np.ndarray, name: str) -> np.ndarray:
        """Rows ``rows`` (sorted, unique) of ``key`` as the servers hold them, an array of
        ``(len(rows),) + shape[1:]`` (read-only: a view of the answer). Blocking, with the
        request deadline."""
        meta = self._meta(key, name)
        out_shape = (len(rows),) + meta.shape[1:]
        if len(rows) == 0:
            return np.zeros(out_shape, dtype=meta.dtype)
        request = self._request(key, meta, rows)
        answer = self._wait(self.port.kv.pull(
            request.keys, cmd=encode_cmd(RequestType.ROW_SPARSE, dtype_code(meta.dtype))))
        data = np.frombuffer(answer.vals, dtype=meta.dtype)
        if data.size != len(rows) * meta.unit_len:
            raise KVStoreBytePSError("row_sparse pull of %s: %d values came for %d rows of %d"
                                     % (name, data.size, len(rows), meta.unit_len))
        return data.reshape(out_shape)      # a view of the answer, which nothing else holds

    def _meta(self, key: int, name: str) -> _Key:
        meta = self._keys.get(key)
        if meta is None:
            raise KeyError("row_sparse key %s was not initialised: call init first" % name)
        return meta

    def _request(self, key: int, meta: _Key, rows: np.ndarray) -> RowRequest:
        rows = np.ascontiguousarray(rows, dtype=np.int64)
        if len(rows) and (rows[0] < 0 or rows[-1] >= meta.shape[0]):
            raise IndexError("row ids must lie in [0, %d), got %d..%d"
                             % (meta.shape[0], rows[0], rows[-1]))
        return row_request(key, rows, meta.unit_len, meta.shape[0], meta.dtype.itemsize,
                           self.port.masters(key), self.port.bigarray_bound)

    def _wait(self, request):
        return request.wait(self.port.request_timeout)
