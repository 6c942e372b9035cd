"""Synchronous training (the default) through MXNet's normal paths: the servers sum each round
and the workers update, as in BytePS. The ``dist_byteps`` store is not optimizer-capable, so
``gluon.Trainer`` and ``Module`` reduce gradients through it and update locally."""
from mxnet_patch.store_modes import StoreMode

__all__ = ["SyncTraining"]


class SyncTraining(StoreMode):
    """A pushpull is a round's sum; a push's sum is held for the next pull."""

    def pushpull(self, key, values, outs, priority) -> None:
        port = self.port
        port.submit(port.initialised_key(key), values, outs, priority)

    def push(self, key, values, priority) -> None:
        port = self.port
        ikey = port.initialised_key(key)
        # alone, not in its gradient bucket: a push is often read before the next key's push
        port.submit(ikey, values, [port.held(ikey)], priority, fusable=False)

    def set_optimizer(self, optimizer) -> None:
        raise NotImplementedError(
            "dist_byteps updates on the workers in synchronous training: use "
            "gluon.Trainer(..., kvstore=kv) (it then sets update_on_kvstore=False by "
            "itself) or Module.fit, not set_optimizer (BYTEPS_ENABLE_ASYNC=1 trains "
            "asynchronously with the optimizer in the store)")
