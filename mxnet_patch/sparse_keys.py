"""``row_sparse`` arrays through the ``dist_byteps`` store: its one home for sparse keys.

A key initialised with a ``row_sparse`` value is a row_sparse key
(:mod:`kvstore_byteps.engine.sparse`: MXNet's row_sparse protocol, with our servers and with
MXNet's): a push carries only the rows its gradient holds (the local devices' gradients summed
first), the servers sum every worker's rows and update them with the optimizer, and
``row_sparse_pull`` returns just the rows asked for. As in MXNet, a push returns at once: an
engine-ordered copy of the gradient is taken (so the program may write the gradient again) and
a sender thread sends it once MXNet computed it. The servers answer a push range by range
(:mod:`kvstore_byteps.engine.sparse`), each range once its round is complete and updated. A
pull of a range goes to our servers right behind this worker's push of that range, naming it
(the server answers once that push's round is done); to MXNet's, once that push was answered;
either way while the other ranges' pushes may still travel. It blocks until every row came.

A ``row_sparse`` gradient of a key initialised dense (gluon's ``Embedding(sparse_grad=True)``:
a dense weight) is pushed dense, through the key's BytePS rounds (:meth:`densify`); MXNet
1.9.1's own ``dist_sync`` cannot train that case (its servers abort). Synchronous training only.
"""
import concurrent.futures
import ctypes
import dataclasses
import functools
import threading
import time
from typing import Callable, Dict, List

import numpy as np
from mxnet import autograd, context
from mxnet import ndarray as nd
from mxnet.base import _LIB, check_call
from mxnet.ndarray.sparse import RowSparseNDArray, _new_alloc_handle

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


class _Push:
    """One push of a key: the ranges not answered yet, each range's push timestamp once sent,
    and the pulls waiting for a range's push to be sent (to follow it)."""

    def __init__(self, ranges: int):
        self.unanswered = set(range(ranges))
        self.sent: Dict[int, int] = {}
        self.followers: Dict[int, List[Callable]] = {}


class SparseKeys:
    """The store's row_sparse keys. Called from the program's thread."""

    def __init__(self, port: SparsePort):
        self.port = port
        self._sender = None                      # made at the first push
        self._pushes: Dict[int, List[_Push]] = {}   # key -> its pushes not answered in full
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
        push = _Push(self.port.rows.range_count(key))
        with self._answered:
            self._pushes.setdefault(key, []).append(push)
        if self._sender is None:
            self._sender = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="byteps-sparse-push")
        self._sender.submit(self._send, key, name, merged, push)

    def _send(self, key: int, name: str, merged, push: _Push) -> None:
        try:
            rows, values = _rows_view(merged)
            self.port.rows.push(key, rows, values, name,
                                callback=lambda index, request: self._answer(
                                    key, push, (index,), request.error),
                                on_sent=lambda index, timestamp: self._sent(push, index,
                                                                            timestamp))
        except BaseException as exc:    # said at the key's next pull
            self._answer(key, push, tuple(push.unanswered), exc)

    def _sent(self, push: _Push, index: int, timestamp: int) -> None:
        with self._answered:
            push.sent[index] = timestamp
            followers = push.followers.pop(index, ())
        for follow in followers:        # the pulls waiting to follow this range's push
            follow(timestamp)

    def _answer(self, key: int, push: _Push, ranges, error) -> None:
        with self._answered:
            push.unanswered.difference_update(ranges)
            if not push.unanswered:
                self._pushes[key].remove(push)
            if error is not None and key not in self._errors:
                self._errors[key] = error
            # a range answered unsent (its send failed) has pulls waiting to follow it
            followers = [f for index in ranges if index not in push.sent
                         for f in push.followers.pop(index, ())]
            self._answered.notify_all()
        for follow in followers:
            follow(None)

    def _raise_error(self, key: int, name: str) -> None:
        error = self._errors.pop(key, None)
        if error is not None:
            raise KVStoreBytePSError("push of row_sparse key %s failed: %s" % (name, error))

    def _pull(self, key: int, name: str, wanted: list) -> list:
        """Send ``wanted`` (pull parts of ``key``) after this worker's pushes of their ranges;
        returns their requests, in order."""
        if self.port.rows.pulls_follow:
            return self._pull_following(key, name, wanted)
        return self._pull_as_answered(key, name, wanted)

    def _check_pushes(self, key: int, name: str) -> None:
        """Raise the error of a push of ``key`` answered so far (a push's answer comes before
        the answer of a pull that followed it)."""
        with self._answered:
            self._raise_error(key, name)

    def _pull_following(self, key: int, name: str, wanted: list) -> list:
        """Our servers: each part sent right behind this worker's newest push of its range,
        naming that push (the server answers once its round is done), or at once where the
        range has no push waiting for its answer."""
        slots = _Slots(len(wanted))

        def send(i, timestamp):
            try:
                slots.fill(i, self.port.rows.send_pull(key, wanted[i], timestamp))
            except BaseException as exc:
                slots.fill(i, _Failed(exc))
        now = []
        with self._answered:
            pushes = self._pushes.get(key)
            newest = pushes[-1] if pushes else None
            for i, part in enumerate(wanted):
                if newest is None or part.range not in newest.unanswered:
                    now.append((i, None))
                elif part.range in newest.sent:
                    now.append((i, newest.sent[part.range]))
                else:
                    newest.followers.setdefault(part.range, []).append(
                        functools.partial(send, i))
        for i, timestamp in now:
            send(i, timestamp)
        return slots.wait(self.port.request_timeout + 5.0, "pull of row_sparse key %s" % name)

    def _pull_as_answered(self, key: int, name: str, wanted: list) -> list:
        """Send ``wanted`` (pull parts of ``key``), each as soon as this worker's pushes of its
        range were answered (the range's round complete and updated), while the other ranges'
        pushes may still travel; returns their requests, in order."""
        deadline = time.monotonic() + self.port.request_timeout + 5.0
        requests = [None] * len(wanted)
        waiting = list(range(len(wanted)))
        while waiting:
            with self._answered:
                while True:
                    self._raise_error(key, name)
                    pushes = self._pushes.get(key, ())
                    ready = [i for i in waiting
                             if not any(wanted[i].range in p.unanswered for p in pushes)]
                    if ready:
                        break
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise DeadlineError(
                            "pull of row_sparse key %s: its push was not answered within %.0f s "
                            "(the servers answer once every worker pushed the key)"
                            % (name, self.port.request_timeout))
                    self._answered.wait(left)
            for i in ready:        # sent outside the lock, which the answers take
                requests[i] = self.port.rows.send_pull(key, wanted[i])
            waiting = [i for i in waiting if requests[i] is None]
        return requests

    def row_sparse_pull(self, key: int, name: str, outs, row_ids) -> None:
        """Rows ``row_ids[i]`` of ``key`` into ``outs[i]`` (row_sparse arrays), each range's
        rows read after this worker's pushes of it were summed and updated. Blocking until the
        rows came."""
        shape = self.port.rows.shape(key)
        asked = {}                     # id(ids) -> (rows, their pull parts)
        for out, ids in zip(outs, row_ids):
            if not is_sparse(out):
                raise KVStoreBytePSError("row_sparse_pull of %s needs row_sparse outputs, got "
                                         "%s" % (name, out.stype))
            if id(ids) not in asked:
                rows = np.unique(ids.asnumpy().astype(np.int64))
                asked[id(ids)] = (rows, self.port.rows.pull_parts(key, rows, name))
        wanted = [part for _, parts in asked.values() for part in parts]
        requests = iter(self._pull(key, name, wanted))
        pulled = {which: (rows, self.port.rows.gather(
                      key, rows, name, parts, [next(requests) for _ in parts]))
                  for which, (rows, parts) in asked.items()}
        self._check_pushes(key, name)
        for out, ids in zip(outs, row_ids):
            rows, data = pulled[id(ids)]
            if len(rows) and np.dtype(out.dtype) == data.dtype:
                _fill_rows(out, data, rows)
                continue
            with autograd.pause():     # gluon pulls in its forward pass: not part of the graph
                nd.sparse.row_sparse_array((_wrapped(data), rows), shape=shape,
                                           ctx=out.context, dtype=out.dtype).copyto(out)

    def pull_dense(self, key: int, name: str, outs) -> None:
        """Every row of ``key`` into the dense ``outs``. Blocking until the rows came."""
        shape = self.port.rows.shape(key)
        rows = np.arange(shape[0], dtype=np.int64)
        parts = self.port.rows.pull_parts(key, rows, name)
        data = self.port.rows.gather(key, rows, name, parts, self._pull(key, name, parts))
        self._check_pushes(key, name)
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


class _Slots:
    """Requests filled in from other threads, waited for with a deadline."""

    def __init__(self, count: int):
        self._requests = [None] * count
        self._left = count
        self._filled = threading.Condition()

    def fill(self, i: int, request) -> None:
        with self._filled:
            self._requests[i] = request
            self._left -= 1
            self._filled.notify_all()

    def wait(self, timeout: float, what: str) -> list:
        with self._filled:
            if not self._filled.wait_for(lambda: self._left == 0, timeout):
                raise DeadlineError("%s: %d of its pulls were not sent within %.0f s (each "
                                    "follows this worker's push of its rows, sent once MXNet "
                                    "computed the gradient)" % (what, self._left, timeout))
            return self._requests


@dataclasses.dataclass
class _Failed:
    """A pull that could not be sent, as a request whose wait raises why."""

    error: BaseException

    def wait(self, timeout: float):
        raise self.error


def _rows_view(array):
    """``(row ids, values)`` of a row_sparse CPU ``array`` that nothing else writes: the ids a
    copy (small), the values a numpy view of its memory (no copy of the rows), which keeps
    ``array`` alive for as long as anything (a message being sent) holds it."""
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


def _fill_rows(out, data: np.ndarray, rows: np.ndarray) -> None:
    """``out`` (row_sparse, of ``data``'s dtype, any context) holds just rows ``rows`` (sorted,
    unique, at least one) with values ``data``: a row_sparse array made from them with two
    copies in C (as MXNet's ``row_sparse_array`` does, without its conversions through Python
    indexing: a third of a small embedding's step), then copied to ``out`` by the engine."""
    cpu = context.cpu()

    def ndarray_of(array: np.ndarray):
        array = np.ascontiguousarray(array)
        made = nd.empty(array.shape, ctx=cpu, dtype=array.dtype)
        check_call(_LIB.MXNDArraySyncCopyFromCPU(made.handle, array.ctypes.data_as(
            ctypes.c_void_p), ctypes.c_size_t(array.size)))
        return made
    values, indices = ndarray_of(data), ndarray_of(rows.astype(np.int64, copy=False))
    made = RowSparseNDArray(_new_alloc_handle("row_sparse", out.shape, cpu, False, data.dtype,
                                              [np.int64], [rows.shape]))
    check_call(_LIB.MXNDArraySyncCopyFromNDArray(made.handle, values.handle, ctypes.c_int(-1)))
    check_call(_LIB.MXNDArraySyncCopyFromNDArray(made.handle, indices.handle, ctypes.c_int(0)))
    with autograd.pause():     # gluon pulls in its forward pass: not part of the graph
        made.copyto(out)


def _wrapped(data: np.ndarray):
    """``data`` as an NDArray without a copy where MXNet can (a read-only view of a message:
    MXNet only reads it, into the new row_sparse array)."""
    try:
        return nd.from_numpy(np.require(data, requirements="C"), zero_copy=True)
    except (ValueError, TypeError):
        return nd.array(data, dtype=data.dtype)
