"""The end of training for a worker program: ``finish_training(trainer)``.

In asynchronous training (``BYTEPS_ENABLE_ASYNC=1``) and with backup workers
(``BYTEPS_BACKUP_WORKERS``) the servers keep the weights, and each worker holds the weights it
last read: workers end with different ones unless they read the final weights once every worker
is done. :func:`finish_training` does that in one call, for a gluon ``Trainer`` (also one
given ``kvstore='dist_byteps'`` as a string), a ``Module`` or a store and its keys; in plain
synchronous training every worker already holds the same weights and it only waits for this
worker's pending operations. A worker that never calls it, and ends with weights that differ
from the servers', says so in one line as its store closes.

MXNet is imported by the caller's objects only: importing this module imports none of it.
"""
__all__ = ["finish_training"]


def finish_training(target, params=None) -> None:
    """End this worker's training and leave the servers' final weights in its parameters.

    ``target``: a ``gluon.Trainer``, an ``mx.mod.Module`` (after ``fit``), or a store with
    ``params`` a mapping (or pairs) of key -> NDArray or list of NDArrays (one per device).
    Every worker calls it (it waits for all of them, asynchronous training and backup workers);
    with backup workers it also tells the servers this worker is done: once ``W - b`` workers
    are, the job's training is over and a worker still training stops at its next step
    (``kvstore_byteps.TrainingOver``). MXNet's own stores: ``dist_async`` reads the weights
    after a barrier; the others need nothing. Blocking."""
    store, pairs = _store_and_pairs(target, params)
    if store is None:
        return
    finish = getattr(store, "finish_training", None)
    if finish is not None:
        finish(pairs)
    elif "async" in store.type:        # MXNet's dist_async: the servers hold the weights
        store._barrier()
        for key, arrays in pairs:
            store.pull(key, out=arrays)


def _store_and_pairs(target, params):
    """(the store, [(key, arrays)]) of a Trainer, a Module or a store and its keys."""
    if params is not None:
        items = params.items() if hasattr(params, "items") else params
        return target, list(items)
    if hasattr(target, "_params") and hasattr(target, "_kv_initialized"):   # gluon.Trainer
        if not target._kv_initialized or not target._update_on_kvstore:
            return None, []      # never stepped, or the workers update: nothing on servers
        return target._kvstore, [(i, p.list_data()) for i, p in enumerate(target._params)]
    if hasattr(target, "_exec_group") and hasattr(target, "_update_on_kvstore"):   # Module
        if target._kvstore is None or not target._update_on_kvstore:
            return None, []
        group = target._exec_group
        target._params_dirty = True          # get_params copies from the devices again
        return target._kvstore, list(zip(group.param_names, group.param_arrays))
    raise TypeError("finish_training takes a gluon.Trainer, an mx.mod.Module, or a store and "
                    "its params (key -> arrays); got %s" % type(target).__name__)
