"""Asynchronous training (``BYTEPS_ENABLE_ASYNC=1``) through MXNet's normal paths.

BytePS's asynchronous mode: each worker applies its optimizer to its *own* gradient and pushes
the change of the weights; the servers add every change into the weights they store, in
whatever order the changes come; the worker pulls the fresh weights into its parameters. No
worker waits for another.

In this mode the ``dist_byteps`` store is optimizer-capable, as MXNet's ``dist_async`` store is,
so ``gluon.Trainer`` (``update_on_kvstore=True``, which gluon requires in async mode) and
``Module.fit`` hand it their gradients and read back the weights: ``pushpull(key, grad,
out=weight)`` and ``push(key, grad)`` then ``pull(key, out=weight)`` mean what they mean with
``dist_async``. The difference: MXNet's servers run the optimizer (unpickled from the
workers); here it stays on the worker, which pushes ``weight_after - weight_before``, and
nothing is unpickled anywhere. With plain SGD the two are the same mathematics; with a stateful
optimizer (momentum, Adam) each worker keeps the state of its own updates, as in BytePS.

:class:`AsyncTraining` is the store's mode object; its :class:`AsyncUpdates` is handed a
key's gradients and the arrays that hold the key's weights, and it queues the update, the push
of the change and the read-back on MXNet's engine, so a caller's later reads wait for them.
"""
import numpy as np
from mxnet import ndarray as nd
from mxnet import optimizer as opt

from mxnet_patch.store_modes import UpdatingMode, no_optimizer_states

__all__ = ["AsyncTraining", "AsyncUpdates", "NO_OPTIMIZER"]

NO_OPTIMIZER = ("with BYTEPS_ENABLE_ASYNC=1 the dist_byteps store trains asynchronously: a push "
                "is a gradient that the store's optimizer turns into a change of the weights "
                "every worker shares, so it needs an optimizer first (gluon.Trainer and "
                "Module.fit set it; or call kv.set_optimizer). Summing values over workers "
                "needs synchronous training: unset BYTEPS_ENABLE_ASYNC")


class AsyncTraining(UpdatingMode):
    """The store's mode in asynchronous training: the optimizer stays on this worker."""

    type_word = "async"
    no_optimizer = NO_OPTIMIZER

    def before_pull(self, ikey, held, priority) -> None:
        """Read fresh: push no change."""
        self.port.submit(ikey, [nd.zeros(held.shape, held.context, held.dtype)], [held],
                         priority)

    def add_to_shared(self, key, change, out, priority) -> None:
        port = self.port
        port.submit(port.initialised_key(key), change, out, priority)

    def set_optimizer(self, optimizer) -> None:
        """The optimizer that turns this worker's gradients into changes of the shared
        weights (kept here; nothing is sent to the servers)."""
        self.updates = AsyncUpdates(optimizer)

    def optimizer_states(self, what: str):
        if self.updates is None:
            raise NotImplementedError(no_optimizer_states(what, ""))
        return self.updates


class AsyncUpdates:
    """The worker-side optimizer of asynchronous training and the steps of one update."""

    def __init__(self, optimizer):
        """``optimizer``: an ``mx.optimizer.Optimizer``, used as given (gluon keeps changing
        its ``rescale_grad`` and learning rate on the same object)."""
        if not isinstance(optimizer, opt.Optimizer):
            raise TypeError("set_optimizer needs an mx.optimizer.Optimizer, got %s"
                            % type(optimizer).__name__)
        self.updater = opt.get_updater(optimizer)

    @property
    def optimizer(self):
        return self.updater.optimizer

    def step(self, key, grads, weights, submit, priority: int) -> None:
        """One asynchronous update of ``key``: the local devices' ``grads`` summed, the
        optimizer applied to a copy of ``weights`` (the key's weights as this worker last
        read them, a CPU NDArray), the change pushed and the servers' weights read back into
        ``weights``. ``submit(values, outs)`` queues the push of ``values`` whose answer (the
        weights, with this change in) lands in ``outs``. All of it is queued on MXNet's
        engine; nothing here waits."""
        before = weights
        if weights.dtype == np.float16 and self.optimizer.multi_precision:
            # in float32 from the weights as read: a multi-precision state's own float32 copy
            # would miss the other workers' changes, and the change pushed would undo them
            before = weights.astype(np.float32)
        grad = host_sum(grads, before)
        updated = before.copy()
        self.updater(key, grad, updated)
        change = (updated - before).astype(weights.dtype, copy=False)
        submit([change], [weights], priority)

    def get_states(self, dump_optimizer: bool = False) -> bytes:
        return self.updater.get_states(dump_optimizer)

    def set_states(self, states: bytes) -> None:
        self.updater.set_states(states)


def host_sum(grads, weights):
    """The sum of ``grads`` (one per local device) in ``weights``'s context and dtype."""
    parts = [g if g.context == weights.context else g.as_in_context(weights.context)
             for g in grads]
    total = parts[0] if len(parts) == 1 else nd.add_n(*parts)
    return total if total.dtype == weights.dtype else total.astype(weights.dtype)
