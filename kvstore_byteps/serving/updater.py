"""The updater a server applies to merged gradients, and its adapter to MXNet optimizers.

The server's logic works on numpy arrays and never mutates a value it has published, so an
updater here is a pure function ``update(key, grad, weight) -> new weight``:

* ``key`` is MXNet's int key (ps key minus the server's range begin), the index MXNet's own
  server hands its Python updater, so optimizer state and per-index counters line up;
* ``grad`` is a 1-D numpy array, or a :class:`RowSparseGrad` for row_sparse keys;
* ``weight`` is the stored value (the float32 master copy under multi-precision).

An updater may also update a row_sparse key in place, on a table it keeps (``table(working)``
and ``update_rows(key, grad, table)``, as :class:`MXNetUpdater` does): a step then copies only
the rows it touches, never the whole array (the server answers row_sparse pulls with copies of
rows, so nothing published is written).

:class:`MXNetUpdater` wraps ``mx.optimizer.get_updater(optimizer)``; mxnet is imported there
only, lazily, so a server that never receives kController never imports MXNet.
"""
import dataclasses
from typing import Callable, Union

import numpy as np

from .unpickle import import_mxnet, load_optimizer

__all__ = ["RowSparseGrad", "Grad", "Updater", "MXNetUpdater", "RowSparseTable",
           "load_mxnet_updater"]


@dataclasses.dataclass
class RowSparseGrad:
    """A row_sparse gradient: ``data[i]`` is row ``indices[i]`` of an array of ``shape``."""

    indices: np.ndarray
    data: np.ndarray
    shape: tuple


Grad = Union[np.ndarray, RowSparseGrad]
#: update(key, grad, weight) -> new weight (must not modify ``weight`` in place)
Updater = Callable[[int, Grad, np.ndarray], np.ndarray]


class MXNetUpdater:
    """Applies an MXNet optimizer through ``mx.optimizer.get_updater``, on copies."""

    def __init__(self, optimizer):
        self._mx = import_mxnet()   # lazily: only servers that receive an optimizer need it
        self._updater = self._mx.optimizer.get_updater(optimizer)
        self.optimizer = optimizer

    def alias(self, index: int, like: int) -> None:
        """Optimizer index ``index`` (a partition) takes the learning-rate and weight-decay
        multipliers that index ``like`` (its MXNet key) has, found by index or by name
        (``idx2name``, as Module sets it), 1.0 otherwise. Set once: looked up by index first,
        so a partition's index can never pick up another parameter's name."""
        optimizer = self.optimizer
        name = optimizer.idx2name.get(like)
        for mults in (optimizer.lr_mult, optimizer.wd_mult):
            if index not in mults:
                mults[index] = mults[like] if like in mults else mults.get(name, 1.0)

    def __call__(self, key: int, grad: Grad, weight: np.ndarray) -> np.ndarray:
        nd = self._mx.nd
        if isinstance(grad, RowSparseGrad):
            weight_nd = _every_row(self._mx, weight)
            grad_nd = self._grad(grad)
        else:
            weight_nd = nd.array(weight, dtype=weight.dtype)
            grad_nd = nd.array(grad, dtype=grad.dtype)
        self._updater(int(key), grad_nd, weight_nd)
        return weight_nd.asnumpy()

    def table(self, working: np.ndarray) -> "RowSparseTable":
        """A row_sparse key's working array, kept for :meth:`update_rows`."""
        return RowSparseTable(self._mx, working)

    def update_rows(self, key: int, grad: RowSparseGrad, table: "RowSparseTable") -> None:
        """``__call__``'s row_sparse update, in place on ``table``: no copy of the whole array."""
        self._updater(int(key), self._grad(grad), table.array)
        table.keep_every_row()

    def _grad(self, grad: RowSparseGrad):
        return self._mx.nd.sparse.row_sparse_array((grad.data, grad.indices), shape=grad.shape,
                                                   dtype=grad.data.dtype)


class RowSparseTable:
    """A row_sparse key's working array as MXNet's C++ server stores it: a row_sparse NDArray
    holding every row, so optimizers take their sparse path (their states are row_sparse too)
    and rows without a gradient are not touched. (A dense weight let e.g. FTRL rewrite them from
    zero state: their values became 0.) Updated in place; read by rows, as numpy copies."""

    def __init__(self, mx, working: np.ndarray):
        self._mx = mx
        self.shape, self.dtype = working.shape, working.dtype
        self.array = _every_row(mx, working)

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """Rows ``ids`` (any order, repeats allowed), a numpy copy."""
        inverse = None
        if len(ids) > 1 and not (ids[1:] > ids[:-1]).all():
            ids, inverse = np.unique(ids, return_inverse=True)
        kept = self._mx.nd.sparse.retain(self.array, self._mx.nd.array(ids, dtype=np.int64))
        data = kept.data.asnumpy()
        return data if inverse is None else data[inverse]

    def asnumpy(self) -> np.ndarray:
        return self.array.asnumpy()

    def keep_every_row(self) -> None:
        """An optimizer that left rows out of the weight (a Python one may assign a sparse
        array): they are zero, as they were when each update had a fresh weight of every row."""
        if self.array.indices.shape[0] != self.shape[0]:
            self.array = _every_row(self._mx, self.array.asnumpy())


def _every_row(mx, weight: np.ndarray):
    """``weight`` as a row_sparse NDArray that holds every row (a copy)."""
    return mx.nd.sparse.row_sparse_array(
        (weight, np.arange(weight.shape[0], dtype=np.int64)), shape=weight.shape,
        dtype=weight.dtype)


def load_mxnet_updater(body: bytes) -> MXNetUpdater:
    """Restricted-unpickle a kController body and build its updater."""
    return MXNetUpdater(load_optimizer(body))
