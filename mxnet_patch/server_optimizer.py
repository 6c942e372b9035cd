"""The servers' optimizer as a worker sees it, shared by the modes that hand it to the servers
(synchronous training once ``set_optimizer`` was called, backup workers).

As with MXNet's ``dist_sync``: rank 0 sends the optimizer pickled (protocol 0, as MXNet's
``KVStore.set_optimizer`` does) and every worker waits in a barrier (gluon's Trainer and
Module call ``set_optimizer`` on every worker); from then on a push is a gradient and the
answer of its round is the servers' weights after the update. The worker keeps no updater
and no optimizer states; a learning rate changed on the worker afterwards
(``trainer.set_learning_rate``) cannot reach the servers, so a step refuses it instead of
ignoring it as MXNet's servers do.
"""
import pickle

from kvstore_byteps.errors import KVStoreBytePSError
from mxnet_patch.async_training import host_sum

__all__ = ["ServerUpdates", "states_on_servers"]


def states_on_servers(what: str, where: str) -> str:
    """The refusal of ``save``/``load`` (``what``) of the optimizer states when the servers
    keep them (``where``: in which mode, for the message)."""
    return ("%s_optimizer_states: %s the servers run the optimizer and keep its states, as "
            "MXNet's dist_sync servers do, so a worker cannot %s them (MXNet's dist_sync "
            "refuses too: \"Cannot %s states for distributed training\"); to checkpoint them, "
            "train with the updates on the workers (gluon.Trainer(..., update_on_kvstore=False) "
            "or MXNET_UPDATE_ON_KVSTORE=0, then trainer.%s_states; Module: "
            "MXNET_UPDATE_ON_KVSTORE=0, then %s_optimizer_states=True), or leave the states "
            "out (Module: %s_optimizer_states=False)" % (what, where, what, what, what, what, what))


class ServerUpdates:
    """The optimizer runs on the servers; a step pushes the gradients and reads the weights."""

    def __init__(self, optimizer, servers, where: str, multi_precision: bool = False):
        """``servers.set_optimizer(body, multi_precision)`` sends the pickled optimizer to the
        servers (the store's :class:`~mxnet_patch.store_modes.StorePort`); ``where``: the
        mode, for messages (``with backup workers``, ``in synchronous training``);
        ``multi_precision``: whether the mode takes a multi-precision optimizer (the servers
        then keep float32 master weights of float16 keys, as MXNet's do)."""
        from mxnet import optimizer as opt
        if not isinstance(optimizer, opt.Optimizer):
            raise TypeError("set_optimizer needs an mx.optimizer.Optimizer, got %s"
                            % type(optimizer).__name__)
        if optimizer.multi_precision and not multi_precision:
            raise KVStoreBytePSError(
                "set_optimizer with multi_precision=True: %s the servers keep the weights in "
                "the gradients' dtype, and multi-precision optimizers are not supported there "
                "yet; pass multi_precision=False, or update on the workers "
                "(gluon.Trainer(..., update_on_kvstore=False) or MXNET_UPDATE_ON_KVSTORE=0)"
                % where)
        self.optimizer = optimizer
        self.where = where
        self._lr = optimizer.lr          # what the servers got
        # as MXNet's KVStore.set_optimizer sends it (rank 0 only), then a barrier
        servers.set_optimizer(pickle.dumps(optimizer, 0), bool(optimizer.multi_precision))

    #: the workers keep no updater (gluon's load_states reads it)
    updater = None

    def check(self) -> None:
        """Refuse a step after the learning rate changed on this worker: gluon's
        trainer.set_learning_rate changes the optimizer here only (with MXNet's dist_sync
        servers that is silently ignored); say so instead."""
        if self.optimizer.lr != self._lr:
            raise KVStoreBytePSError(
                "the learning rate changed to %g on this worker, but %s the servers run the "
                "optimizer (set with %g): trainer.set_learning_rate cannot reach them; give "
                "the optimizer an lr_scheduler instead (it runs on the servers)"
                % (self.optimizer.lr, self.where, self._lr))

    def step(self, key, grads, weights, submit, priority: int) -> None:
        """One step of ``key``: the local devices' ``grads`` summed and pushed; the weights
        after their round land in ``weights`` (a CPU NDArray). Queued on MXNet's engine;
        nothing waits."""
        self.check()
        submit([host_sum(grads, weights)], [weights], priority)
