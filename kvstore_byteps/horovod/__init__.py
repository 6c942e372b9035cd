"""Horovod's MXNet API (``horovod.mxnet``) on kvstore-byteps: ``import kvstore_byteps.horovod as hvd``.

What a parameter server serves, with Horovod's names and signatures: :func:`init`,
:func:`shutdown`, :func:`is_initialized`, :func:`size`, :func:`rank`, :func:`local_rank`,
:func:`local_size`; :func:`allreduce` / :func:`allreduce_` (Average or Sum, with pre- and
post-scaling), :func:`grouped_allreduce` / :func:`grouped_allreduce_`, :func:`broadcast` /
:func:`broadcast_`, :func:`broadcast_parameters` (dicts and gluon ParameterDicts, parameters
with deferred initialisation included), :class:`DistributedOptimizer`,
:class:`DistributedTrainer`, :class:`Compression` (none, fp16). Operations a parameter server
cannot do by summing (allgather, alltoall, reducescatter, Min, Max, Product) raise an error
naming what to use instead. Every process is a ``dist_byteps`` worker, or reduces through its
host's local rank 0 in a local group; see :mod:`mxnet_patch.collective` for which, and for how
names become keys.
"""
import types
import warnings
from collections import OrderedDict

import mxnet as mx

from kvstore_byteps.config import Config
from kvstore_byteps.mxnet import Compression, local_rank, local_size, rank, size
from mxnet_patch.collective import COLLECTIVE
from mxnet_patch.wrapped_optimizer import ReducingOptimizer

__all__ = ["init", "shutdown", "is_initialized", "size", "rank", "local_rank", "local_size",
           "Average", "Sum", "Adasum", "Min", "Max", "Product",
           "allreduce", "allreduce_", "grouped_allreduce", "grouped_allreduce_",
           "broadcast", "broadcast_", "broadcast_parameters", "allgather", "alltoall",
           "reducescatter", "DistributedOptimizer", "DistributedTrainer", "Compression"]

# Horovod's reduction ops (its values); only Average and Sum are served.
Average, Sum, Adasum, Min, Max, Product = 0, 1, 2, 3, 4, 5
_OP_NAMES = {Adasum: "Adasum", Min: "Min", Max: "Max", Product: "Product"}


def init(comm=None, process_sets=None):
    """Join the job. ``comm`` (an MPI communicator) and ``process_sets`` are refused: every
    process of the job takes part in every operation."""
    if comm is not None or process_sets is not None:
        raise ValueError("kvstore_byteps.horovod has no MPI communicators or process sets: "
                         "call init() without arguments")
    if Config.from_env(in_local_group=True).enable_async:
        raise NotImplementedError("Horovod trains synchronously (an allreduce is a sum over "
                                  "every process): unset BYTEPS_ENABLE_ASYNC, or use "
                                  "kvstore_byteps.mxnet's asynchronous mode")
    COLLECTIVE.start()


def shutdown():
    """Finish pending operations and leave the job."""
    COLLECTIVE.shutdown()


def is_initialized():
    return COLLECTIVE.started


def _scales(average, op, prescale_factor, postscale_factor):
    """(prescale, postscale) of a sum that gives the requested reduction."""
    if op is not None and average is not None:
        raise ValueError("give either op or average, not both")
    if op is None:
        op = Sum if average is False else Average
    if op in _OP_NAMES:
        raise ValueError("%s reduction is not served by a parameter server (it only sums); "
                         "use Average or Sum" % _OP_NAMES[op])
    if op not in (Average, Sum):
        raise ValueError("unknown reduction op %r" % (op,))
    post = postscale_factor / COLLECTIVE.scale_size() if op == Average else postscale_factor
    return prescale_factor, post


def allreduce(tensor, average=None, name=None, priority=0, prescale_factor=1.0,
              postscale_factor=1.0, op=None):
    """A new tensor: the average (default) or sum of ``tensor`` over all processes."""
    output = mx.nd.zeros(tensor.shape, ctx=tensor.context, dtype=tensor.dtype)
    pre, post = _scales(average, op, prescale_factor, postscale_factor)
    return COLLECTIVE.reduce(tensor, output, name or COLLECTIVE.auto_name("allreduce"),
                             priority=priority, prescale=pre, postscale=post)


def allreduce_(tensor, average=None, name=None, priority=0, prescale_factor=1.0,
               postscale_factor=1.0, op=None):
    """:func:`allreduce` in place; returns ``tensor``."""
    pre, post = _scales(average, op, prescale_factor, postscale_factor)
    return COLLECTIVE.reduce(tensor, tensor, name or COLLECTIVE.auto_name("allreduce"),
                             priority=priority, prescale=pre, postscale=post)


def _group_names(tensors, name):
    base = name or COLLECTIVE.auto_name("grouped_allreduce")
    return ["%s.%d" % (base, i) for i in range(len(tensors))]


def grouped_allreduce(tensors, average=None, name=None, priority=0, prescale_factor=1.0,
                      postscale_factor=1.0, op=None):
    """:func:`allreduce` of each tensor of a list (new tensors)."""
    return [allreduce(t, average, n, priority, prescale_factor, postscale_factor, op)
            for t, n in zip(tensors, _group_names(tensors, name))]


def grouped_allreduce_(tensors, average=None, name=None, priority=0, prescale_factor=1.0,
                       postscale_factor=1.0, op=None):
    """:func:`allreduce_` of each tensor of a list; returns the list."""
    for t, n in zip(tensors, _group_names(tensors, name)):
        allreduce_(t, average, n, priority, prescale_factor, postscale_factor, op)
    return tensors


def broadcast(tensor, root_rank, name=None, priority=0):
    """A new tensor holding ``root_rank``'s ``tensor``."""
    output = tensor.copy() if rank() == root_rank else mx.nd.zeros(
        tensor.shape, ctx=tensor.context, dtype=tensor.dtype)
    return broadcast_(output, root_rank, name, priority)


def broadcast_(tensor, root_rank, name=None, priority=0):
    """``root_rank``'s ``tensor`` into every process's ``tensor``; returns it."""
    if rank() != root_rank:
        tensor *= 0
    return COLLECTIVE.reduce(tensor, tensor, name or COLLECTIVE.auto_name("broadcast"),
                             priority=priority)


def _broadcast_after_init(param, root_rank, name):
    """``param``'s ``_init_impl`` followed by a broadcast (deferred initialisation)."""
    init_impl = param._init_impl

    def init_then_broadcast(self, *args, **kwargs):
        init_impl(*args, **kwargs)
        broadcast_(self.data(), root_rank=root_rank, name=name)
    return init_then_broadcast


def broadcast_parameters(params, root_rank=0, prefix=None):
    """Broadcast a dict of NDArrays or Parameters, or a gluon ParameterDict, from
    ``root_rank``; a parameter whose initialisation is deferred is broadcast right after it
    is initialised. A process that takes a departed worker's place in an elastic job skips
    it: its kvstore_byteps.elastic.State hands it the others' parameters."""
    if COLLECTIVE.scale_size() == 1 or COLLECTIVE.joining():
        return
    prefix = prefix or ""
    if not isinstance(params, (dict, mx.gluon.ParameterDict)):
        raise ValueError("invalid params of type: %s" % type(params))
    tensors, names = [], []
    for name, p in sorted(params.items()):
        try:
            tensors.append(p.data() if isinstance(p, mx.gluon.Parameter) else p)
            names.append(prefix + str(name))
        except mx.gluon.parameter.DeferredInitializationError:
            p._init_impl = types.MethodType(_broadcast_after_init(p, root_rank,
                                                                  prefix + str(name)), p)
    for tensor, name in zip(tensors, names):
        broadcast_(tensor, root_rank, name=name)


def _no_server_form(what, instead):
    raise NotImplementedError("%s is not served by a parameter server; %s" % (what, instead))


def allgather(tensor, name=None, priority=0):
    _no_server_form("allgather", "gather through a sum instead: each process writes its part "
                    "into its own slice of a zero tensor and calls allreduce(op=Sum)")


def alltoall(tensor, splits=None, name=None, priority=0):
    _no_server_form("alltoall", "exchange through a sum of per-process slices "
                    "(allreduce(op=Sum)) or restructure the step")


def reducescatter(tensor, op=Average, name=None, priority=0):
    _no_server_form("reducescatter", "use allreduce and keep this process's slice")


class DistributedOptimizer(ReducingOptimizer):
    """Wraps an optimizer: each update first sums the gradient over all processes (the
    average comes from ``rescale_grad``, divided by ``size()`` here, as in Horovod)."""

    def __init__(self, optimizer, gradient_predivide_factor=1.0, num_groups=0):
        super().__init__(optimizer)
        self._optimizer.rescale_grad *= gradient_predivide_factor / COLLECTIVE.scale_size()
        self._gradient_predivide_factor = gradient_predivide_factor

    def _reduce(self, index, grad):
        if COLLECTIVE.scale_size() == 1:
            return
        pairs = zip(index, grad) if isinstance(index, (tuple, list)) else [(index, grad)]
        for i, g in pairs:
            allreduce_(g, average=False, name=str(i), priority=-i,
                       prescale_factor=1.0 / self._gradient_predivide_factor)


class DistributedTrainer(mx.gluon.Trainer):
    """A gluon Trainer without a kvstore that sums gradients over all processes (averaging
    through ``_scale``, as Horovod does). ``num_groups`` is accepted; groups are summed as
    separate tensors."""

    def __init__(self, params, optimizer, optimizer_params=None, compression=Compression.none,
                 gradient_predivide_factor=1.0, prefix=None, num_groups=0):
        self._compression = compression
        if isinstance(optimizer, DistributedOptimizer):
            optimizer = optimizer._optimizer
            warnings.warn("DistributedTrainer does not take DistributedOptimizer "
                          "as its optimizer. We have unwrapped it for you.")
        if isinstance(params, dict):
            params = OrderedDict(params)
        elif isinstance(params, (list, tuple)):
            params = sorted(params, key=lambda p: p.name)
        super().__init__(params, optimizer, optimizer_params=optimizer_params, kvstore=None)
        self._scale *= gradient_predivide_factor / COLLECTIVE.scale_size()
        self._gradient_predivide_factor = gradient_predivide_factor
        if prefix is not None and not isinstance(prefix, str):
            raise ValueError("prefix must be a str, got %r" % (prefix,))
        self._prefix = prefix or ""

    def _allreduce_grads(self):
        if COLLECTIVE.scale_size() == 1:
            return
        for i, param in enumerate(self._params):
            if param.grad_req == "null":
                continue
            grad = param.list_grad()[0]
            compressed, ctx = self._compression.compress(grad)
            allreduce_(compressed, average=False, name=self._prefix + str(i), priority=-i,
                       prescale_factor=1.0 / self._gradient_predivide_factor)
            if compressed is not grad:
                grad[:] = self._compression.decompress(compressed, ctx)
