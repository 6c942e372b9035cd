"""``row_sparse`` arrays through the ``dist_byteps`` store: its one home for sparse keys.

A key initialised with a ``row_sparse`` value is a row_sparse key
(:mod:`kvstore_byteps.engine.sparse`: MXNet's row_sparse protocol, with our servers and with
MXNet's): a push carries only the rows its gradient holds (the local devices' gradients summed
first), the servers sum every worker's rows and update them with the optimizer, and
``row_sparse_pull`` returns just the rows asked for. As in MXNet, a push returns at once: an
engine-ordered copy of the gradient is taken (so the program may write the gradient again) and
a sender thread sends it once MXNet computed it; a pull of the key waits for this worker's pushes
of it to be answered (the round complete and updated) and then blocks until its rows came.

A ``row_sparse`` gradient of a key initialised dense (gluon's ``Embedding(sparse_grad=True)``:
a dense weight) is pushed dense, through the key's BytePS rounds (:meth:`densify`); MXNet
1.9.1's own ``dist_sync`` cannot train that case (its servers abort). Synchronous training only.
"""
import concurrent.futures
import dataclasses
import threading
import time
from typing import Callable, Dict

import numpy as np
from mxnet import autograd
from mxnet import ndarray as nd

from kvstore_byteps.errors import DeadlineError, KVStoreBytePSError

__all__ = ["SparseKeys", "SparsePort", "densify", "is_sparse"]


def is_sparse(array) -> bool:
    """Whether ``array`` is a ``row_sparse`` NDArray (csr is refused where it is met)."""
    stype = getattr(array, "stype", "default")
    if stype == "csr":
        raise NotImplementedError("dist_byteps takes dense and row_sparse arrays; csr arrays "
                                  "are not supported (as with MXNet's dist stores)")
    return stype == "row_sparse"


def densify(values):
    """Dense copies of ``row_sparse`` gradients of a dense key (engine-ordered)."""
    return [v.tostype("default") if is_sparse(v) else v for v in values]


@dataclasses.dataclass(frozen=True)
class SparsePort:
    """What the sparse keys need of the store: the worker engine's row_sparse keys (``rows``,
    :class:`kvstore_byteps.engine.sparse.RowSparseKeys`), their initialisation
    (``init_rows(key, value, name)``), the refusal of the training mode (``refusal()``: why
    this mode cannot take them, or None) and the request deadline."""

    rows: object
    init_rows: Callable
    refusal: Callable[[], object]
    request_timeout: float


class SparseKeys:
    """The store's row_sparse keys. Called from the program's thread."""

    def __init__(self, port: SparsePort):
        self.port = port
        self._sender = None                  # made at the first push
        self._pending: Dict[int, int] = {}   # key -> pushes sent and not answered
        self._errors: Dict[int, BaseException] = {}
        self._answered = threading.Condition()

    def holds(self, key: int) -> bool:
        """Whether ``key`` is a row_sparse key."""
        return self.port.rows.known(key)

    def init(self, key: int, name: str, value) -> None:
        """Declare ``key`` from rank 0's ``value`` (row_sparse or dense); blocking."""
        self._check_mode()
        self.port.init_rows(key, value.tostype("default").asnumpy(), name)

    def push(self, key: int, name: str, values) -> None:
        """This worker's row_sparse gradients of ``key`` (one per device), summed; returns at
        once."""
        self._check_mode()
        values = [v if is_sparse(v) else v.tostype("row_sparse") for v in values]
        merged = values[0].copy() if len(values) == 1 else nd.add_n(*values)
        with self._answered:
            self._pending[key] = self._pending.get(key, 0) + 1
        if self._sender is None:
            self._sender = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="byteps-sparse-push")
        self._sender.submit(self._send, key, name, merged)

    def _send(self, key: int, name: str, merged) -> None:
        try:
            rows, values = _rows_view(merged)
            self.port.rows.push(key, rows, values, name,
                                callback=lambda request: self._answer(key, request.error))
        except BaseException as exc:    # said at the key's next pull
            self._answer(key, exc)

    def _answer(self, key: int, error) -> None:
        with self._answered:
            self._pending[key] -= 1
            if error is not None and key not in self._errors:
                self._errors[key] = error
            self._answered.notify_all()

    def _wait_pushes(self, key: int, name: str) -> None:
        deadline = time.monotonic() + self.port.request_timeout + 5.0
        with self._answered:
            while self._pending.get(key, 0):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise DeadlineError(
                        "pull of row_sparse key %s: its push was not answered within %.0f s "
                        "(the servers answer once every worker pushed the key)"
                        % (name, self.port.request_timeout))
                self._answered.wait(left)
            error = self._errors.pop(key, None)
        if error is not None:
            raise KVStoreBytePSError("push of row_sparse key %s failed: %s" % (name, error))

    def row_sparse_pull(self, key: int, name: str, outs, row_ids) -> None:
        """Rows ``row_ids[i]`` of ``key`` into ``outs[i]`` (row_sparse arrays), after this
        worker's pushes of it were answered. Blocking until the rows came."""
        self._wait_pushes(key, name)
        shape = self.port.rows.shape(key)
        pulled = {}
        for out, ids in zip(outs, row_ids):
            if not is_sparse(out):
                raise KVStoreBytePSError("row_sparse_pull of %s needs row_sparse outputs, got "
                                         "%s" % (name, out.stype))
            if id(ids) not in pulled:
                rows = np.unique(ids.asnumpy().astype(np.int64))
                pulled[id(ids)] = (rows, self.port.rows.pull(key, rows, name))
            rows, data = pulled[id(ids)]
            with autograd.pause():     # gluon pulls in its forward pass: not part of the graph
                nd.sparse.row_sparse_array((_wrapped(data), rows), shape=shape,
                                           ctx=out.context, dtype=out.dtype).copyto(out)

    def pull_dense(self, key: int, name: str, outs) -> None:
        """Every row of ``key`` into the dense ``outs``. Blocking until the rows came."""
        self._wait_pushes(key, name)
        shape = self.port.rows.shape(key)
        data = self.port.rows.pull(key, np.arange(shape[0], dtype=np.int64), name)
        with autograd.pause():
            for out in outs:
                out[:] = nd.array(data, ctx=out.context, dtype=out.dtype)

    def _check_mode(self) -> None:
        refusal = self.port.refusal()
        if refusal:
            raise NotImplementedError(refusal)

    def close(self) -> None:
        """Let the sends queued go out, then stop the sender thread."""
        if self._sender is not None:
            self._sender.shutdown(wait=True)


def _rows_view(array):
    """``(row ids, values)`` of a row_sparse CPU ``array`` that nothing else writes: the ids a
    copy (small), the values a numpy view of its memory (no copy of the rows), which keeps
    ``array`` alive for as long as anything (a message being sent) holds it."""
    import ctypes
    from mxnet_patch.engine_async import data_pointer
    rows = array.indices.asnumpy().astype(np.int64)      # waits for the array
    shape = (len(rows),) + tuple(array.shape[1:])
    dtype = np.dtype(array.dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if nbytes == 0:
        return rows, np.zeros(shape, dtype)
    raw = (ctypes.c_uint8 * nbytes).from_address(data_pointer(array))   # the values
    raw.owner = array
    return rows, np.frombuffer(raw, dtype=dtype).reshape(shape)


def _wrapped(data: np.ndarray):
    """``data`` as an NDArray without a copy where MXNet can (a read-only view of a message:
    MXNet only reads it, into the new row_sparse array)."""
    try:
        return nd.from_numpy(np.require(data, requirements="C"), zero_copy=True)
    except (ValueError, TypeError):
        return nd.array(data, dtype=data.dtype)
