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
import ctypes
import dataclasses
import logging
from typing import Callable, Union

import numpy as np

from .unpickle import import_mxnet, load_optimizer

log = logging.getLogger(__name__)

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
        self._raised = set()       # row_sparse keys whose update raised (update_rows)

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

    def update_in_place(self, key: int, grad: np.ndarray, weights: np.ndarray) -> None:
        """As a call with a dense ``grad``, but ``weights`` (writable, C-contiguous, owning its
        memory, kept by the caller between updates) is updated in place: MXNet reads the
        gradient and writes the weights where numpy holds them, no copy either way."""
        nd = self._mx.nd
        grad_nd = _wrap(nd, grad)           # as the row_sparse path's gradients
        weight_nd = nd.from_numpy(weights, zero_copy=True)   # must be in place: no fallback
        try:
            self._updater(int(key), grad_nd, weight_nd)
            weight_nd.wait_to_read()
        finally:
            grad.flags.writeable = weights.flags.writeable = True

    def table(self, working: np.ndarray) -> "RowSparseTable":
        """A row_sparse key's working array, kept for :meth:`update_rows`."""
        return RowSparseTable(self._mx, working)

    def update_rows(self, key: int, grad: RowSparseGrad, table: "RowSparseTable") -> None:
        """``__call__``'s row_sparse update, in place on ``table``: no copy of the whole array.

        An optimizer that raises here has updated the table as far as it got, in place; as
        MXNet's C++ server does (it prints its Python updater's exception and answers the round
        with the weights as they are), the round stands, and the error is logged (with its
        traceback the first time for each key). MXNet's own nightly dist_sync test relies on
        it: its optimizer raises on row_sparse weights after updating them."""
        try:
            self._updater(int(key), self._grad(grad), table.array)
        except Exception as exc:
            first = key not in self._raised
            self._raised.add(key)
            log.error("the optimizer raised updating row_sparse key %d (%s: %s); as MXNet's "
                      "server, the round keeps the weights as the optimizer left them", key,
                      type(exc).__name__, exc, exc_info=first)
        table.refresh()

    def _grad(self, grad: RowSparseGrad):
        nd = self._mx.nd
        return nd.sparse.row_sparse_array((_wrap(nd, grad.data), _wrap(nd, grad.indices)),
                                          shape=grad.shape, dtype=grad.data.dtype)


class RowSparseTable:
    """A row_sparse key's working array as MXNet's C++ server stores it: a row_sparse NDArray
    holding every row, so optimizers take their sparse path (their states are row_sparse too)
    and rows without a gradient are not touched. (A dense weight let e.g. FTRL rewrite them from
    zero state: their values became 0.) Updated in place; read through a numpy view of its
    values (no copy), taken anew after each update (:meth:`refresh`), which never leaves this
    object: :meth:`rows` and :meth:`asnumpy` return copies."""

    def __init__(self, mx, working: np.ndarray):
        self._mx = mx
        self.shape, self.dtype = working.shape, working.dtype
        self.array = _every_row(mx, working)
        self.refresh()

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """Rows ``ids`` (any order, repeats allowed), a numpy copy."""
        return self._view[ids]

    def asnumpy(self) -> np.ndarray:
        return self._view.copy()

    def refresh(self) -> None:
        """After an update: wait for it, and read the values' address again. An optimizer that
        left rows out of the weight (a Python one may assign a sparse array) gets them back as
        zeros, as when each update had a fresh weight of every row."""
        if self.array.indices.shape[0] != self.shape[0]:      # waits for the update
            self.array = _every_row(self._mx, self.array.asnumpy())
        self._view = _values_view(self._mx, self.array, self.shape, self.dtype)


def _every_row(mx, weight: np.ndarray):
    """``weight`` as a row_sparse NDArray that holds every row (a copy)."""
    return mx.nd.sparse.row_sparse_array(
        (weight, np.arange(weight.shape[0], dtype=np.int64)), shape=weight.shape,
        dtype=weight.dtype)


def _values_view(mx, array, shape: tuple, dtype: np.dtype) -> np.ndarray:
    """A read-only numpy view of the values of ``array`` (a row_sparse NDArray of every row),
    valid while ``array`` lives and no operation reallocates them."""
    array.wait_to_read()
    address = ctypes.c_void_p()
    mx.base.check_call(mx.base._LIB.MXNDArrayGetData(array.handle, ctypes.byref(address)))
    size = int(np.prod(shape)) * np.dtype(dtype).itemsize
    view = np.frombuffer((ctypes.c_char * size).from_address(address.value), dtype)
    view.flags.writeable = False
    return view.reshape(shape)


def _wrap(nd, array: np.ndarray):
    """``array`` as an NDArray: without a copy where MXNet can wrap it (``array`` then becomes
    read-only), else a copy."""
    array = np.ascontiguousarray(array)
    try:
        return nd.from_numpy(array, zero_copy=True)
    except ValueError:       # a dtype DLPack does not carry
        return nd.array(array, dtype=array.dtype)


def load_mxnet_updater(body: bytes) -> MXNetUpdater:
    """Restricted-unpickle a kController body and build its updater."""
    return MXNetUpdater(load_optimizer(body))
