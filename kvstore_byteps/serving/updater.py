"""The updater a server applies to merged gradients, and its adapter to MXNet optimizers.

The server's logic works on numpy arrays and never mutates a value it has published, so an
updater here is a pure function ``update(key, grad, weight) -> new weight``:

* ``key`` is MXNet's int key (ps key minus the server's range begin), the index MXNet's own
  server hands its Python updater, so optimizer state and per-index counters line up;
* ``grad`` is a 1-D numpy array, or a :class:`RowSparseGrad` for row_sparse keys;
* ``weight`` is the stored value (the float32 master copy under multi-precision).

:class:`MXNetUpdater` wraps ``mx.optimizer.get_updater(optimizer)``; mxnet is imported there
only, lazily, so a server that never receives kController never imports MXNet.
"""
import dataclasses
from typing import Callable, Union

import numpy as np

from .unpickle import import_mxnet, load_optimizer

__all__ = ["RowSparseGrad", "Grad", "Updater", "MXNetUpdater", "load_mxnet_updater"]


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
            # As MXNet's C++ server stores a row_sparse key: a row_sparse weight holding every
            # row. Optimizers then take their sparse path (their states are row_sparse too):
            # rows without a gradient are not touched. (A dense weight let e.g. FTRL rewrite
            # them from zero state: their values became 0.)
            weight_nd = nd.sparse.row_sparse_array(
                (weight, np.arange(weight.shape[0], dtype=np.int64)), shape=weight.shape,
                dtype=weight.dtype)
            grad_nd = nd.sparse.row_sparse_array((grad.data, grad.indices), shape=grad.shape,
                                                 dtype=grad.data.dtype)
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
        grad_nd = nd.from_numpy(grad, zero_copy=True)     # both marked read-only meanwhile
        weight_nd = nd.from_numpy(weights, zero_copy=True)
        try:
            self._updater(int(key), grad_nd, weight_nd)
            weight_nd.wait_to_read()
        finally:
            grad.flags.writeable = weights.flags.writeable = True


def load_mxnet_updater(body: bytes) -> MXNetUpdater:
    """Restricted-unpickle a kController body and build its updater."""
    return MXNetUpdater(load_optimizer(body))
