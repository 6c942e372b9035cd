"""Synchronous training (the default) through MXNet's normal paths.

The ``dist_byteps`` store is optimizer-capable here, as MXNet's ``dist_sync`` is, so
``gluon.Trainer`` and ``Module`` choose ``update_on_kvstore`` by MXNet's own rules:

* with the updates on the servers (MXNet's default for a capable dist store): the program
  calls ``set_optimizer`` before its first push (gluon and Module do), rank 0 sends the
  optimizer to the servers and from then on ``pushpull(key, grad, out=weight)``, or ``push``
  then ``pull``, means: this gradient, then the servers' weights after its round's update;
  a ``pull`` with no push since the last one reads the servers' weights as they are now;
* with the updates on the workers (``update_on_kvstore=False``, ``MXNET_UPDATE_ON_KVSTORE=0``,
  BytePS's design): no optimizer is set, every round is a sum and the workers update.

Until ``set_optimizer`` every round is a sum, as before.
"""
from mxnet import ndarray as nd

from mxnet_patch.server_optimizer import ServerUpdates, states_on_servers
from mxnet_patch.store_modes import StoreMode

__all__ = ["SyncTraining"]

WHERE = "in synchronous training with the optimizer on the servers (update_on_kvstore),"


class SyncTraining(StoreMode):
    """A pushpull is a round's sum, or with the servers' optimizer the weights after the
    round's update; a push's answer is held for the next pull."""

    takes_optimizer = True

    def __init__(self, mode, port):
        super().__init__(mode, port)
        self.updates = None           # the servers' optimizer, once set_optimizer was called
        self._pushed = set()          # keys pushed since their last pull (servers' optimizer)

    def pushpull(self, key, values, outs, priority) -> None:
        port = self.port
        ikey = port.initialised_key(key)
        if self.updates is not None:
            self.updates.check()
        port.submit(ikey, values, outs, priority)

    def push(self, key, values, priority) -> None:
        port = self.port
        ikey = port.initialised_key(key)
        if self.updates is not None:
            self.updates.check()
            self._pushed.add(ikey)
        # alone, not in its gradient bucket: a push is often read before the next key's push
        port.submit(ikey, values, [port.held(ikey)], priority, fusable=False)

    def before_pull(self, ikey, held, priority) -> None:
        """With the servers' optimizer and no push of ``ikey`` since its last pull: the
        servers' weights as they are now, after this worker's pending rounds (blocking)."""
        if self.updates is not None and ikey not in self._pushed:
            nd.waitall()        # this worker's own rounds first (a pushpull writes elsewhere)
            held[:] = self.port.read(ikey, held.shape, held.dtype)
        self._pushed.discard(ikey)

    def set_optimizer(self, optimizer) -> None:
        """The servers' optimizer (rank 0 sends it, then a barrier, as MXNet's dist_sync
        does). The engine refuses it after the first round or with gradient buckets formed
        (``engine.set_optimizer``); with gradient compression only the gradients are
        compressed, and the weights pulled plain."""
        self.updates = ServerUpdates(optimizer, self.port, WHERE, multi_precision=True)

    def optimizer_states(self, what: str):
        if self.updates is not None:
            raise NotImplementedError(states_on_servers(what, WHERE))
        return super().optimizer_states(what)
