"""What a server stores per key: the value, a float32 master copy, and the sync round's merge. Pure.

Invariant that makes answers safe without copies: a *published* array (``Entry.value``) is never
written again; it is marked read-only, and every update replaces it by a new array. A pull or a
round's pushpull is answered with the array published at that moment, so no later round, update
or push can change bytes that are still waiting in a send queue. (MXNet's C++ server answers
pushpulls from a buffer the next round overwrites; that is the wrong-sum race the issue saw.)
A row_sparse key is never answered with its array, only with copies of rows, so an updater may
keep it as a table it updates in place (``Entry.table``): no update copies the whole array.
"""
import dataclasses
import enum
from typing import List, Optional, Tuple

import numpy as np

from ..errors import ProtocolError
from .updater import Grad, RowSparseGrad

__all__ = ["StorageKind", "Entry", "publish"]

FLOAT32 = np.dtype(np.float32)


class StorageKind(enum.Enum):
    """How a key's values travel: one dense slice, or rows of a row_sparse array."""

    DENSE = "dense"
    ROW_SPARSE = "row_sparse"


def publish(array: np.ndarray) -> np.ndarray:
    """Mark ``array`` read-only; it may now be handed to a send queue."""
    array.flags.writeable = False
    return array


@dataclasses.dataclass
class Entry:
    """One key's state. ``value`` is in the wire dtype; ``master`` is float32 or None.

    ``table``: a row_sparse key's working array as the updater keeps it between its updates
    (:meth:`adopt`; MXNet's row_sparse NDArray, see updater.RowSparseTable), updated in place;
    while it is set, ``value`` and ``master`` are None, answers read rows off it (:meth:`rows`,
    copies) and :meth:`detach` brings it back to numpy."""

    kind: StorageKind
    dtype: np.dtype
    value: Optional[np.ndarray]
    master: Optional[np.ndarray] = None
    merged: Optional[object] = None
    round_dtype: Optional[np.dtype] = None
    waiting: List[tuple] = dataclasses.field(default_factory=list)
    table: Optional[object] = None

    @classmethod
    def create(cls, kind: StorageKind, initial: np.ndarray, multi_precision: bool) -> "Entry":
        """Initialise from the first push (a copy; the request buffer is not kept)."""
        entry = cls(kind, initial.dtype, publish(np.array(initial, copy=True)))
        if multi_precision:
            entry.enable_master()
        return entry

    def enable_master(self) -> None:
        """Keep a float32 master copy for a non-float32 key (kSetMultiPrecision)."""
        self.detach()
        if self.dtype != FLOAT32 and self.master is None:
            self.master = self.value.astype(FLOAT32)

    @property
    def shape(self) -> tuple:
        return self.table.shape if self.table is not None else self.value.shape

    @property
    def working(self) -> np.ndarray:
        """The array an updater updates: the master copy if any, else the value (a table is
        brought back to numpy first)."""
        self.detach()
        return self.master if self.master is not None else self.value

    @property
    def accumulate_dtype(self) -> np.dtype:
        if self.table is not None:
            return np.dtype(self.table.dtype)
        return FLOAT32 if self.master is not None else self.dtype

    def set_working(self, new: np.ndarray) -> None:
        """Replace the working array with ``new`` (not aliased elsewhere) and publish the value."""
        self.detach()
        new = np.asarray(new).reshape(self.value.shape)
        if self.master is not None:
            self.master = new.astype(FLOAT32, copy=False)
        self.value = publish(new.astype(self.dtype, copy=False))

    def adopt(self, make_table) -> object:
        """The table ``make_table(working)`` holds the working array from now on; returned."""
        if self.table is None:
            self.table = make_table(self.working)
            self.value = self.master = None
        return self.table

    def detach(self) -> None:
        """The table's array becomes the working array again (no table: nothing to do)."""
        if self.table is None:
            return
        working, self.table = self.table.asnumpy(), None
        self.master = working if working.dtype != self.dtype else None   # float32 master
        self.value = publish(working.astype(self.dtype, copy=False))

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """Rows ``ids`` of the value, a copy (how row_sparse pulls are answered)."""
        if self.table is not None:
            return self.table.rows(ids).astype(self.dtype, copy=False)
        return self.value[ids]

    def check_push(self, kind: StorageKind, dtype: np.dtype, ps_key: int) -> None:
        """Refuse pushes whose storage type or dtype differs from the key's initialisation."""
        if kind is not self.kind:
            raise ProtocolError("key %d holds %s data, got a %s push" % (ps_key, self.kind.value,
                                                                        kind.value))
        if dtype != self.dtype:
            raise ProtocolError("key %d holds %s, got a %s push" % (ps_key, self.dtype, dtype))

    # -- the sync round ------------------------------------------------------------------
    def merge_dense(self, values: np.ndarray, ps_key: int) -> None:
        """Add one worker's dense push to this round's sum."""
        if values.size != self.value.size:
            raise ProtocolError("key %d holds %d values, push has %d"
                                % (ps_key, self.value.size, values.size))
        if self.merged is None:
            self.merged = values.astype(self.accumulate_dtype, copy=True)
        else:
            np.add(self.merged, values, out=self.merged)

    def merge_rows(self, rows: np.ndarray, values: Optional[np.ndarray], ps_key: int) -> None:
        """Add one worker's row_sparse push (possibly no rows) to this round: kept (in the
        accumulating dtype) until :meth:`take_round` sums the round's rows. Kept, not copied:
        never written, and a van reuses a receive buffer only when nothing refers to it."""
        if self.merged is None:
            self.merged, self.round_dtype = [], self.accumulate_dtype
        if values is None:
            return
        check_rows(rows, values.shape[1], self.shape, ps_key)
        self.merged.append((rows, values.astype(self.round_dtype, copy=False)))

    def join_round(self, req, server, gone: frozenset) -> None:
        """A push joins the open round; not one of a worker that left an elastic job (``gone``:
        it raced the notice, and must not reopen a round closed without it)."""
        if req.sender in gone:
            raise ProtocolError("node %d left the job (elastic workers): its push is refused"
                                % req.sender)
        self.waiting.append((req, server))

    def round_complete(self, workers: int, gone: frozenset) -> bool:
        """Whether every worker still in the job pushed the open round: ``workers`` pushes, as
        MXNet's server counts them, or, once some left an elastic job (``gone``), one from
        each worker left."""
        if not gone:
            return len(self.waiting) >= workers
        pushed = {req.sender for req, _ in self.waiting}
        return bool(pushed) and len(pushed) >= workers - len(gone - pushed)

    def take_round(self, workers: int = 0) -> Tuple[Grad, list]:
        """End the round: return (merged gradient, waiting requests) and reset both. A round
        of fewer or more pushes than ``workers`` (some left an elastic job, or it grew) is
        scaled to that many,
        as the BytePS rounds are (rounds.py)."""
        merged, waiting = self.merged, self.waiting
        self.merged, self.waiting = None, []
        if self.kind is StorageKind.ROW_SPARSE:
            merged = sum_rows(merged or [], self.shape, self.round_dtype)
        if waiting and workers and len(waiting) != workers:
            values = merged.data if isinstance(merged, RowSparseGrad) else merged
            np.multiply(values, workers / len(waiting), out=values, casting="unsafe")
        return merged, waiting


def sum_rows(pushes: List[Tuple[np.ndarray, np.ndarray]], shape: tuple,
             dtype: np.dtype) -> RowSparseGrad:
    """The row_sparse sum of a round's pushes ``[(rows, values), ...]``: every row pushed, in
    increasing order, its values added in the order they came (push after push, row after row
    within a push), starting from zero: the bits ``np.add.at`` into a zeroed table gives, without
    a table. (``0 + v`` is ``v`` but for the sign of a zero, so the first value gets ``+ 0``.)"""
    if not pushes:
        return RowSparseGrad(np.empty(0, np.int64), np.empty((0, shape[1]), dtype), shape)
    rows = np.concatenate([r for r, _ in pushes]).astype(np.int64, copy=False)
    values = np.concatenate([v for _, v in pushes]) if len(pushes) > 1 else pushes[0][1]
    order = np.argsort(rows, kind="stable")
    rows = rows[order]
    starts = np.flatnonzero(np.concatenate(([True], rows[1:] != rows[:-1])))
    counts = np.diff(np.append(starts, len(rows)))
    out = values[order[starts]]
    out += np.zeros(1, dtype)                # 0 + v, as the zeroed table had it
    for k in range(1, int(counts.max(initial=0))):
        more = np.flatnonzero(counts > k)
        out[more] += values[order[starts[more] + k]]
    return RowSparseGrad(rows[starts], out, shape)


def check_rows(rows: np.ndarray, unit_len: int, shape: tuple, ps_key: int) -> None:
    """Row ids and row length of a row_sparse request must fit the stored array."""
    if unit_len != shape[1]:
        raise ProtocolError("key %d has rows of %d values, request has %d"
                            % (ps_key, shape[1], unit_len))
    if len(rows) and int(rows.max()) >= shape[0]:
        raise ProtocolError("key %d has %d rows, request names row %d"
                            % (ps_key, shape[0], int(rows.max())))


def dense_rows(grad: RowSparseGrad) -> np.ndarray:
    """The dense array of a row_sparse sum (rows nobody pushed are zero)."""
    out = np.zeros(grad.shape, dtype=grad.data.dtype)
    out[grad.indices] = grad.data
    return out
