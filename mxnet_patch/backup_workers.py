"""Synchronous training with backup workers (``BYTEPS_BACKUP_WORKERS=b``) through MXNet's paths.

A round of a key closes when ``W - b`` of the ``W`` workers have pushed their gradients for it:
the slowest ``b`` do not hold the others up (Chen et al., "Revisiting Distributed Synchronous
SGD", 2016). A worker that fell behind does not apply the rounds it missed one by one: the
servers keep the weights and run the optimizer, as MXNet's ``dist_sync`` servers do with
``update_on_kvstore``, and a late worker's pull reads the current weights at once (its late
gradient joins the open round if it is at most a few rounds late, else it is dropped, see
``kvstore_byteps/serving/backup.py``). Once ``W - b`` workers finished training, or while fewer
than ``W - b`` are left training (the others wait in a barrier: the end of their loop), the
job's training is over: a worker still training stops at its next step (``TrainingOver``,
raised by the store) and ``kvstore_byteps.finish_training`` leaves every worker with the final
weights.

So in this mode the ``dist_byteps`` store is optimizer-capable, as ``dist_sync`` is:
``gluon.Trainer`` and ``Module.fit`` hand it the optimizer (rank 0 sends it to the servers,
pickled as MXNet does; the servers restricted-unpickle it) and then ``pushpull(key, grad,
out=weight)``, or ``push`` then ``pull``, means: this gradient, then the weights after its
round. :class:`BackupTraining` is the store's mode object,
:class:`~mxnet_patch.server_optimizer.ServerUpdates` its steps.
"""
import logging

from kvstore_byteps.errors import TrainingOver
from mxnet_patch.server_optimizer import ServerUpdates, states_on_servers
from mxnet_patch.store_modes import UpdatingMode

__all__ = ["BackupTraining"]

log = logging.getLogger("mxnet_patch.kvstore")     # the store says it, as it always did


class BackupTraining(UpdatingMode):
    """The store's mode with backup workers: the servers keep the weights and the optimizer."""

    no_optimizer = ("with BYTEPS_BACKUP_WORKERS the servers run the optimizer: set it first "
                    "(gluon.Trainer and Module.fit do; or call kv.set_optimizer)")

    def __init__(self, mode, port):
        super().__init__(mode, port)
        self._pushed = set()          # keys pushed since their last pull
        self._said_over = False       # the end of the training was said

    def push(self, key, values, priority) -> None:
        super().push(key, values, priority)
        self._pushed.add(self.port.initialised_key(key))   # initialised: it was pushed

    def before_pull(self, ikey, held, priority) -> None:
        """The weights after the round of this worker's push of ``ikey`` (Module's push then
        pull), or, with no push since the last pull, the servers' weights as they are now
        (blocking, e.g. to read the final weights after a barrier)."""
        if ikey not in self._pushed:
            held.wait_to_read()                  # this worker's own rounds first
            held[:] = self.port.read(ikey, held.shape, held.dtype)
        self._pushed.discard(ikey)

    def read_final(self, ikey, held) -> None:
        super().read_final(ikey, held)
        self._pushed.discard(ikey)

    def before_step(self) -> None:
        """The servers said the job's training is over (W - b workers finished, or fewer than
        W - b are left training), so this worker's step ends its training: TrainingOver (a
        SystemExit with status 0), said in one line the first time."""
        if not self.port.training_over():
            return
        message = ("worker rank %d: the job's training is over (BYTEPS_BACKUP_WORKERS=%d: "
                   "enough workers finished or wait in a barrier after their training), so "
                   "this worker's training ends here; uncaught, "
                   "TrainingOver ends the process with exit status 0 (catch "
                   "kvstore_byteps.TrainingOver to run code after the training loop)"
                   % (self.port.rank(), self.mode.backup_workers))
        if not self._said_over:
            self._said_over = True
            log.warning("%s", message)
        raise TrainingOver(message)

    def set_optimizer(self, optimizer) -> None:
        """The servers' optimizer (rank 0 sends it, as MXNet's dist_sync does)."""
        self.updates = ServerUpdates(optimizer, self.port, "with backup workers")

    def optimizer_states(self, what: str):
        raise NotImplementedError(states_on_servers(what, "with backup workers"))
