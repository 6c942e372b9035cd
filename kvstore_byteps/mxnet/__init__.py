"""BytePS's MXNet API (``byteps.mxnet``) on kvstore-byteps: ``import kvstore_byteps.mxnet as bps``.

Names, signatures and semantics follow BytePS's module: :func:`init`, :func:`shutdown`,
:func:`size`, :func:`rank`, :func:`local_rank`, :func:`local_size`,
:func:`byteps_declare_tensor`, :func:`byteps_push_pull` (asynchronous, in place: the sum over
all processes, divided by ``size()`` when averaging), :func:`broadcast_parameters`,
:class:`DistributedOptimizer`, :class:`DistributedTrainer`, :class:`Compression`. Underneath,
every process is a ``dist_byteps`` worker, or reduces through its host's local rank 0 in a
local group (see :mod:`mxnet_patch.collective` for which, and for how names become keys). What differs from BytePS, and what is refused, is in docs/migrating.md.

Asynchronous training (``BYTEPS_ENABLE_ASYNC=1``, one process per host), as BytePS's: an
update is made locally and its change of the weights is pushed to ``weight_<index>``, whose
servers' copy (every process's changes added into the initial weights) is read back into the
weights; ``byteps_push_pull`` adds the tensor into the servers' copy of its name and reads that
back (a running total, as in BytePS); broadcasts take rank 0's value.
"""
import warnings

import mxnet as mx

import numpy as np

from kvstore_byteps.config import Config, Env, set_default
from mxnet_patch.collective import COLLECTIVE
from mxnet_patch.wrapped_optimizer import ReducingOptimizer

__all__ = ["init", "shutdown", "suspend", "resume", "size", "rank", "local_rank", "local_size",
           "byteps_declare_tensor", "byteps_push_pull", "broadcast_parameters",
           "DistributedOptimizer", "DistributedTrainer", "Compression"]


# ---------------------------------------------------------------------------- basics
def init(lazy=True):
    """Join the job (``BYTEPS_GLOBAL_RANK``, if set, is the rank a process that is a worker of
    its own asks for). ``lazy`` is accepted for BytePS's signature: the store starts now either
    way."""
    config = Config.from_env(in_local_group=True)
    if (config.global_rank is not None and config.worker_id is None
            and not COLLECTIVE.grouped(config)):
        set_default(Env.WORKER_ID, str(config.global_rank))   # for the store start() creates
    COLLECTIVE.start()


def shutdown():
    """Finish pending push_pulls and leave the job."""
    COLLECTIVE.shutdown()


def suspend():
    """BytePS's elastic training; not supported: refused rather than ignored."""
    raise NotImplementedError("suspend()/resume() (elastic training) are not supported by "
                              "kvstore-byteps: stop the job and start it with the new size")


def resume(num_workers, num_servers, global_rank=None, context=None):
    """See :func:`suspend`."""
    suspend()


def size():
    """The number of processes of the job."""
    return COLLECTIVE.size()


def rank():
    """This process's rank (in a local group: worker id x local size + local rank)."""
    return COLLECTIVE.rank()


def local_rank():
    """This process's rank on its host (``BYTEPS_LOCAL_RANK``)."""
    return COLLECTIVE.local_rank()


def local_size():
    """The processes on this host (``BYTEPS_LOCAL_SIZE``)."""
    return COLLECTIVE.local_size()


# ---------------------------------------------------------------------------- push_pull
def byteps_declare_tensor(name, **kwargs):
    """Declare a tensor name (its key is made at its first push_pull, in any order across
    processes). ``byteps_*`` compression options per tensor are refused: use
    ``kv.set_gradient_compression`` with ``gluon.Trainer(kvstore='dist_byteps')``."""
    if kwargs:
        raise ValueError("byteps_declare_tensor(%r, %s): per-tensor compression options are "
                         "not supported by kvstore_byteps.mxnet; compress every gradient with "
                         "gluon.Trainer(..., kvstore='dist_byteps', compression_params=...)"
                         % (name, ", ".join(sorted(kwargs))))


def byteps_push_pull(tensor, version=0, priority=0, name=None, is_average=True):
    """Sum ``tensor`` over all processes, in place (divided by ``size()`` if ``is_average``).
    Asynchronous: reading ``tensor`` waits for the result. ``version`` is accepted for
    BytePS's signature. With BYTEPS_ENABLE_ASYNC=1, as in BytePS: the servers add ``tensor``
    into their copy of ``name`` and ``tensor`` takes that running total."""
    if name is None:
        name = COLLECTIVE.auto_name("byteps_push_pull")
    COLLECTIVE.reduce(tensor, tensor, name, priority=priority,
                      postscale=1.0 / COLLECTIVE.scale_size() if is_average else 1.0)


#: broadcast tensors are named broadcast_<n>, counting across calls (BytePS says parameter_<n>,
#: the names its DistributedTrainer uses too: a job using both would mix two tensors)
_broadcasts = 0


def broadcast_parameters(params, root_rank=0):
    """Broadcast a dict of NDArrays (e.g. ``Module.get_params()``) from ``root_rank``, in place:
    other processes zero theirs and every process sums (asynchronous training: every process
    reads rank 0's value, declared under the broadcast's name; ``root_rank`` must be 0).
    Blocking."""
    global _broadcasts
    if isinstance(params, mx.gluon.ParameterDict):
        raise TypeError("For gluon users, you should not call this function. "
                        "DistributedTrainer will broadcast all parameters at "
                        "the first training step.")
    if not isinstance(params, dict):
        raise ValueError("Invalid params of type: %s" % type(params))
    if COLLECTIVE.joining():    # a late worker of an elastic job: its State hands them over
        _broadcasts += len(params)      # (the names the others gave them)
        return
    tensors = [tensor for _, tensor in sorted(params.items())]
    if COLLECTIVE.asynchronous:
        _check_async_root(root_rank)
        for tensor in tensors:
            COLLECTIVE.broadcast("broadcast_%d" % _broadcasts, tensor)
            _broadcasts += 1
        return
    for tensor in tensors:
        if rank() != root_rank:
            tensor *= 0
        COLLECTIVE.reduce(tensor, tensor, "broadcast_%d" % _broadcasts)
        _broadcasts += 1
    for tensor in tensors:
        tensor.wait_to_read()


def _asynchronous() -> bool:
    return Config.from_env(in_local_group=True).enable_async   # as every node parses it


def _check_async_root(root_rank) -> None:
    if root_rank != 0:
        raise ValueError("with BYTEPS_ENABLE_ASYNC=1 broadcasts come from rank 0 (the servers "
                         "keep rank 0's initial value); root_rank=%r is not supported"
                         % (root_rank,))


def _float16_multi_precision(optimizer, weight) -> bool:
    return weight.dtype == np.float16 and getattr(optimizer, "multi_precision", False)


def _update_and_share(what, optimizer, weights, update) -> None:
    """Asynchronous training: run ``update()`` (the local update of ``weights``, ``(index,
    NDArray)`` pairs), then push each weight's change to ``weight_<index>`` and read the shared
    weights back into it. ``what`` names the caller in the refusal of float16
    multi-precision weights (the float32 copy in the optimizer's state would miss the other
    processes' changes)."""
    for _, weight in weights:
        if _float16_multi_precision(optimizer, weight):
            raise NotImplementedError(
                "%s with BYTEPS_ENABLE_ASYNC=1 does not take float16 weights with "
                "multi_precision; use gluon.Trainer(..., kvstore='dist_byteps'), which "
                "supports them" % what)
    befores = [weight.copy() for _, weight in weights]
    update()
    for (index, weight), before in zip(weights, befores):
        weight -= before
        COLLECTIVE.share("weight_%d" % index, before, weight, weight, priority=-index)


# ---------------------------------------------------------------------------- compression
class NoneCompressor:
    """Leaves the tensor as it is (the default)."""

    def compress(self, tensor, *args, **kwargs):
        return tensor, None

    def decompress(self, tensor, ctx, *args, **kwargs):
        return tensor


class FP16Compressor:
    """Float gradients travel as float16 and come back in their own dtype."""

    def compress(self, tensor, *args, **kwargs):
        if "float" in str(tensor.dtype):
            return tensor.astype("float16", copy=False), tensor.dtype
        return tensor, tensor.dtype

    def decompress(self, tensor, ctx, *args, **kwargs):
        if "float" in str(ctx):
            return tensor.astype(ctx, copy=False)
        return tensor


class Compression:
    """Compression on the way to the servers (``none``, ``fp16``)."""

    none = NoneCompressor()
    fp16 = FP16Compressor()


# ---------------------------------------------------------------------------- training
class DistributedOptimizer(ReducingOptimizer):
    """Wraps an optimizer: each update first averages the gradient over all processes.

    With BYTEPS_ENABLE_ASYNC=1 (as BytePS's): no averaging; the update is made locally, its
    change pushed to the servers' copy of the weights (``weight_<index>``, made from rank 0's
    weights at the first update) and the weights read back. float16 weights with
    ``multi_precision`` are refused there (the float32 copy in the optimizer's state would miss
    the other processes' changes): use ``gluon.Trainer(kvstore='dist_byteps')``, which
    supports them."""

    def __init__(self, optimizer):
        self._asynchronous = _asynchronous()
        super().__init__(optimizer)

    def update(self, index, weight, grad, state):
        if not self._asynchronous:
            return super().update(index, weight, grad, state)
        self._update_async(index, weight, grad, state, self._optimizer.update)

    def update_multi_precision(self, index, weight, grad, state):
        if not self._asynchronous:
            return super().update_multi_precision(index, weight, grad, state)
        self._update_async(index, weight, grad, state, self._optimizer.update_multi_precision)

    def _update_async(self, index, weight, grad, state, update) -> None:
        pairs = (list(zip(index, weight)) if isinstance(index, (tuple, list))
                 else [(index, weight)])
        _update_and_share("DistributedOptimizer", self._optimizer, pairs,
                          lambda: update(index, weight, grad, state))

    def _reduce(self, index, grad):
        pairs = zip(index, grad) if isinstance(index, (tuple, list)) else [(index, grad)]
        for i, g in pairs:
            byteps_push_pull(g, priority=-i, name="gradient_%d" % i, is_average=True)


class DistributedTrainer(mx.gluon.Trainer):
    """A gluon Trainer without a kvstore: gradients are divided by batch size x ``size()`` and
    summed over all processes; parameters are broadcast from ``root_rank`` at the first step.
    ``compression_params``: ``{"fp16": ...}`` sends gradients as float16; BytePS's compressor
    options (onebit, topk, ...) are refused here (see :func:`byteps_declare_tensor`)."""

    def __init__(self, params, optimizer, optimizer_params=None, root_rank=0,
                 compression_params=None):
        self._asynchronous = _asynchronous()
        if self._asynchronous:
            _check_async_root(root_rank)
        if isinstance(optimizer, DistributedOptimizer):
            optimizer = optimizer._optimizer
            warnings.warn("DistributedTrainer does not take DistributedOptimizer "
                          "as its optimizer. We have unwrapped it for you.")
        compression_params = compression_params or {}
        if "compressor" in compression_params:
            byteps_declare_tensor("gradients", **{"byteps_compressor_type":
                                                  compression_params["compressor"]})
        self._compressor = Compression.fp16 if "fp16" in compression_params else Compression.none
        if isinstance(params, mx.gluon.ParameterDict):
            params = [params[key] for key in sorted(params.keys())]
        super().__init__(params, optimizer, optimizer_params=optimizer_params, kvstore=None)
        self._bps_size = COLLECTIVE.scale_size()
        self.root_rank = root_rank
        #: made by a late worker of an elastic job: no first-step broadcast (the others did
        #: theirs long ago; its kvstore_byteps.elastic.State hands it their parameters)
        self._late = COLLECTIVE.joining()
        for param in self._params:
            if param._data is not None and len(param.list_ctx()) > 1:
                raise ValueError("DistributedTrainer: parameter %s lives on %d devices; run "
                                 "one process per device (bpslaunch starts one per GPU)"
                                 % (param.name, len(param.list_ctx())))

    def step(self, batch_size, ignore_stale_grad=False):
        self._scale = batch_size
        super().step(batch_size, ignore_stale_grad)

    def _allreduce_grads(self):
        for i, param in enumerate(self._params):
            if param.grad_req == "null":
                continue
            grad = param._grad[0]
            grad *= 1.0 / self._scale / self._bps_size
            if self._asynchronous:    # each process's own gradient: nothing to sum
                continue
            compressed, ctx = self._compressor.compress(grad)
            byteps_push_pull(compressed, is_average=False, name="gradient_%d" % i, priority=-i)
            if compressed is not grad:
                grad[:] = self._compressor.decompress(compressed, ctx)

    def _update(self, ignore_stale_grad=False):
        """Asynchronous training: the local update, then each parameter's change pushed to the
        servers' copy of its weights and the weights read back (gradients are scaled as in
        synchronous training, by batch size x ``size()``, so the same learning rate fits)."""
        if not self._asynchronous:
            return super()._update(ignore_stale_grad)
        weights = [(i, p.data()) for i, p in enumerate(self._params) if p.grad_req != "null"]
        _update_and_share("DistributedTrainer", self._optimizer, weights,
                          lambda: super(DistributedTrainer, self)._update(ignore_stale_grad))

    def _init_params(self):
        deferred = []
        for param in self._params_to_init:
            if param._deferred_init:
                deferred.append(param)
                continue
            if self._late:
                continue
            data = param._check_and_get(param._data, list)[0]
            if self._asynchronous:
                COLLECTIVE.broadcast("parameter_%d" % self._param2idx[param.name], data)
                continue
            if rank() != self.root_rank:
                data *= 0
            byteps_push_pull(data, name="parameter_%d" % self._param2idx[param.name],
                             is_average=False)
        self._params_to_init = deferred
