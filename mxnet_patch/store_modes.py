"""The training modes of the ``dist_byteps`` store: one object per store, chosen once.

``KVStoreBytePS`` keeps what every mode shares (keys, the weights or sums it holds per key,
the queueing of a pushpull on MXNet's engine) and hands the rest to its mode object, picked at
creation from ``Config.training_mode`` by :func:`store_mode`: ``push``, ``pushpull``, what a
``pull`` reads first, ``set_optimizer``, the optimizer states and ``is_capable``. One class per
``config.Training`` member, each in its own module (imported only when chosen):

* :class:`mxnet_patch.sync_training.SyncTraining`: rounds of sums, the workers update;
* :class:`mxnet_patch.async_training.AsyncTraining` (``BYTEPS_ENABLE_ASYNC=1``);
* :class:`mxnet_patch.backup_workers.BackupTraining` (``BYTEPS_BACKUP_WORKERS``).

A mode object never holds its store: the store hands it a :class:`StorePort`, the few
operations a mode needs of it (as ``torch.distributed``'s comm hooks get a state and a bucket,
never the DDP module).

A new mode is a ``Training`` member, a class here (its worker side) and one among the servers'
data paths (``kvstore_byteps/serving/``).
"""
import dataclasses
import importlib
from typing import Any, Callable

from kvstore_byteps.config import Training, TrainingMode
from kvstore_byteps.errors import KVStoreBytePSError

__all__ = ["StoreMode", "StorePort", "UpdatingMode", "store_mode"]

#: each mode's class, as ``module:class`` (imported when chosen)
_CLASSES = {Training.SYNC: "mxnet_patch.sync_training:SyncTraining",
            Training.ASYNC: "mxnet_patch.async_training:AsyncTraining",
            Training.BACKUP_WORKERS: "mxnet_patch.backup_workers:BackupTraining"}


@dataclasses.dataclass(frozen=True)
class StorePort:
    """What a mode object needs of its store (the store builds it). ``ikey``: a key as the
    store numbers it (an int)."""

    rank: Callable[[], int]                   # this worker's rank
    initialised_key: Callable[[Any], int]     # a key's ikey; KeyError before init/broadcast
    held: Callable[[int], Any]                # the store's NDArray of ``ikey`` (sums or weights)
    #: ``submit(ikey, values, outs, priority, fusable=True)``: queue one pushpull on MXNet's
    #: engine; ``fusable``: it may travel in the key's gradient bucket
    submit: Callable[..., None]
    read: Callable[[int, Any, Any], Any]      # the servers' values of ``ikey`` (shape, dtype)
    training_over: Callable[[], bool]         # the servers said the job's training is over
    #: ``set_optimizer(body, multi_precision)``: the pickled optimizer to the servers
    set_optimizer: Callable[[bytes, bool], None]


def store_mode(mode: TrainingMode, port: StorePort) -> "StoreMode":
    """The mode object for the job's ``mode``, reaching its store through ``port``."""
    module, name = _CLASSES[mode.kind].split(":")
    return getattr(importlib.import_module(module), name)(mode, port)


class StoreMode:
    """What a training mode decides in the store. ``port`` is what it needs of the
    ``KVStoreBytePS`` it serves: the mode queues through its ``submit`` and reads its held
    arrays."""

    #: the middle word of the store's ``type`` (``dist_sync_byteps``), which MXNet reads
    type_word = "sync"
    #: ``is_capable('optimizer')``: whether the store takes the optimizer
    takes_optimizer = False
    #: why this mode takes no row_sparse arrays (None: it does, :mod:`mxnet_patch.sparse_keys`)
    sparse_refusal = None

    def __init__(self, mode: TrainingMode, port: StorePort):
        self.mode, self.port = mode, port

    def pushpull(self, key, values, outs, priority) -> None:
        """``kv.pushpull`` of one key: ``values`` (one per local device) into ``outs``."""
        raise NotImplementedError

    def push(self, key, values, priority) -> None:
        """``kv.push`` of one key."""
        raise NotImplementedError

    def before_pull(self, ikey, held, priority) -> None:
        """``kv.pull`` of ``ikey`` is about to copy ``held`` (the store's array of the key)
        out: bring it up to date first. Nothing by default."""

    def read_final(self, ikey, held) -> None:
        """``finish_training``: the servers' final weights of ``ikey`` into ``held``."""
        held[:] = self.port.read(ikey, held.shape, held.dtype)

    def add_to_shared(self, key, change, out, priority) -> None:
        """``kv.add_to_shared`` (``change`` and ``out`` lists): asynchronous training's push
        only."""
        raise KVStoreBytePSError("add_to_shared is asynchronous training's push: set "
                                 "BYTEPS_ENABLE_ASYNC=1 on every node")

    def set_optimizer(self, optimizer) -> None:
        raise NotImplementedError

    @property
    def updater(self):
        """The worker's updater (gluon's ``Trainer.load_states`` reads its optimizer)."""
        return None

    def optimizer_states(self, what: str):
        """What saves and loads the optimizer states on this worker (``what``: save or
        load); NotImplementedError where the worker keeps none."""
        raise NotImplementedError(no_optimizer_states(what, " in synchronous training"))


def no_optimizer_states(what: str, where: str) -> str:
    return ("dist_byteps keeps no optimizer%s: %s the Trainer's states (trainer.%s_states) "
            "instead" % (where, what, what))


class UpdatingMode(StoreMode):
    """A mode whose store takes the optimizer: each push is a gradient that updates the
    shared weights, which are read back into the store's copy (its subclass's ``updates``
    class runs the steps once ``set_optimizer`` made it)."""

    takes_optimizer = True
    #: KVStoreBytePSError's message for a push before set_optimizer
    no_optimizer = ""
    sparse_refusal = ("row_sparse arrays: dist_byteps takes them in synchronous training (the "
                      "default), not with asynchronous training or backup workers; train "
                      "synchronously, or with dense arrays")

    def __init__(self, mode: TrainingMode, port: StorePort):
        super().__init__(mode, port)
        self.updates = None

    def pushpull(self, key, values, outs, priority) -> None:
        self._update(key, values, outs, priority)

    def push(self, key, values, priority) -> None:
        self._update(key, values, [], priority)

    def before_step(self) -> None:
        """Called before each step; nothing by default."""

    def _update(self, key, grads, outs, priority) -> None:
        """``grads`` of ``key`` update the shared weights, read back into the store's copy
        and ``outs``."""
        if self.updates is None:
            raise KVStoreBytePSError(self.no_optimizer)
        self.before_step()
        port = self.port
        ikey = port.initialised_key(key)
        weights = port.held(ikey)                  # the weights as this worker last read them
        self.updates.step(key, grads, weights,
                          lambda values, into, p: port.submit(ikey, values, into, p), priority)
        for target in outs:
            weights.copyto(target)

    @property
    def updater(self):
        return None if self.updates is None else self.updates.updater
