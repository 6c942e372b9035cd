"""Synchronous training with backup workers (``BYTEPS_BACKUP_WORKERS=b``) through MXNet's paths.

A round of a key closes when ``W - b`` of the ``W`` workers have pushed their gradients for it:
the slowest ``b`` do not hold the others up (Chen et al., "Revisiting Distributed Synchronous
SGD", 2016). A worker that fell behind does not apply the rounds it missed one by one: the
servers keep the weights and run the optimizer, as MXNet's ``dist_sync`` servers do with
``update_on_kvstore``, and a late worker's pull reads the current weights at once (its late
gradient joins the open round if it is at most a few rounds late, else it is dropped, see
``kvstore_byteps/serving/backup.py``). Once ``W - b`` workers finished training the job's
training is over: a worker still training stops at its next step (``TrainingOver``, raised by
the store) and ``kvstore_byteps.finish_training`` leaves every worker with the final weights.

So in this mode the ``dist_byteps`` store is optimizer-capable, as ``dist_sync`` is:
``gluon.Trainer`` and ``Module.fit`` hand it the optimizer (rank 0 sends it to the servers,
pickled as MXNet does; the servers restricted-unpickle it) and then ``pushpull(key, grad,
out=weight)``, or ``push`` then ``pull``, means: this gradient, then the weights after its
round. :class:`ServerUpdates` is the worker's side of it.
"""
import pickle

from mxnet_patch.async_training import host_sum

__all__ = ["ServerUpdates"]


class ServerUpdates:
    """The optimizer runs on the servers; a step pushes the gradients and reads the weights."""

    def __init__(self, optimizer, engine):
        from mxnet import optimizer as opt
        if not isinstance(optimizer, opt.Optimizer):
            raise TypeError("set_optimizer needs an mx.optimizer.Optimizer, got %s"
                            % type(optimizer).__name__)
        if optimizer.multi_precision:
            from kvstore_byteps.errors import KVStoreBytePSError
            raise KVStoreBytePSError("backup workers (BYTEPS_BACKUP_WORKERS) keep the weights "
                                     "on the servers in the gradients' dtype: multi_precision "
                                     "optimizers are not supported there")
        self.optimizer = optimizer
        self._lr = optimizer.lr          # what the servers got
        # as MXNet's KVStore.set_optimizer sends it (rank 0 only), then a barrier: every
        # worker calls set_optimizer (gluon's Trainer and Module do)
        engine.set_optimizer(pickle.dumps(optimizer, 0))

    #: the workers keep no updater (gluon's load_states reads it)
    updater = None

    def step(self, key, grads, weights, submit, priority: int) -> None:
        """One step of ``key``: the local devices' ``grads`` summed and pushed; the weights
        after their round land in ``weights`` (a CPU NDArray). Queued on MXNet's engine;
        nothing waits."""
        if self.optimizer.lr != self._lr:
            # gluon's trainer.set_learning_rate changes the optimizer here only: with MXNet's
            # dist_sync servers that is silently ignored; say so instead
            from kvstore_byteps.errors import KVStoreBytePSError
            raise KVStoreBytePSError(
                "the learning rate changed to %g on this worker, but with backup workers the "
                "servers run the optimizer (set with %g): trainer.set_learning_rate cannot "
                "reach them; give the optimizer an lr_scheduler instead (it runs on the "
                "servers)" % (self.optimizer.lr, self._lr))
        submit([host_sum(grads, weights)], [weights], priority)
