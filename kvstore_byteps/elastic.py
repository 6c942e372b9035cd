"""Elastic training's state object, as Horovod's ``hvd.elastic.State``: what a worker that
takes a departed worker's place resumes from.

In an elastic job (``BYTEPS_MIN_WORKERS``, ``launch.py --min-workers``) a worker that dies
leaves and the others go on; one started in its place (``launch.py --max-restarts``, or by
hand with the same settings) takes its rank and joins at the others' next
:meth:`State.commit`. Its script runs unchanged but for the state, which tells it where to
resume::

    trainer = gluon.Trainer(net.collect_params(), "sgd", {...}, kvstore=kv)
    state = kvstore_byteps.elastic.State(kv, trainer, epoch=0, batch=0)
    while state.epoch < epochs:
        for batch in range(state.batch, batches):
            ...forward, backward, trainer.step(...)
            state.batch = batch + 1
            state.commit()
        state.epoch, state.batch = state.epoch + 1, 0

On the workers that started with the job, ``State`` only holds the fields, and
:meth:`~State.commit` reports them to server rank 0 and hears who joins there (the late
workers then enter every key's rounds at once with the others; see engine/joins.py). On a
late worker, ``State(...)`` blocks until the others' next commit, then holds that commit's
fields and the servers' current weights (the trainer's parameters): its next step is the
others' next step. Where the store is not ours, or the job not elastic, ``State`` is a
plain holder and ``commit`` does nothing.

The weights come from the servers: the job must update on them (the servers' optimizer:
``update_on_kvstore``, MXNet's default for a distributed store). A commit costs a round trip
to server rank 0 (and, where somebody joins, waiting for this worker's pending operations):
commit every step for the quickest joins, or every few steps.
"""
import json
from typing import List

__all__ = ["State"]


class State:
    """The fields a worker resumes from in an elastic job (see the module)."""

    def __init__(self, kv, trainer=None, **fields):
        """``kv``: the store; ``trainer``: the gluon Trainer whose parameters a late worker
        reads from the servers; ``fields``: JSON values (epoch, batch, ...), set as
        attributes."""
        self._kv, self._trainer = kv, trainer
        self._names = sorted(fields)
        self.__dict__.update(fields)
        #: this worker took a departed one's place and resumed from the others' commit
        self.joined_late = False
        joins = _joins(kv)
        if joins is not None and joins.joining:
            self._join(joins)

    def commit(self) -> List[int]:
        """Report the fields (every worker, at the same points of its loop); returns the
        node ids of the late workers that joined here (they are in the rounds from the next
        step on), usually []. Blocking: a round trip to server rank 0."""
        joins = _joins(self._kv)
        if joins is None:
            return []
        import mxnet as mx
        return joins.commit(self._encoded(), mx.nd.waitall)

    def _encoded(self) -> bytes:
        return json.dumps({name: getattr(self, name) for name in self._names}).encode()

    def _join(self, joins) -> None:
        trainer = self._trainer
        ready = trainer is not None and _set_up(trainer)
        _, state = joins.join()
        committed = json.loads(state or b"{}")
        self.__dict__.update({name: committed[name] for name in self._names
                              if name in committed})
        if ready:
            self._kv.reread([(i, p.list_data()) for i, p in enumerate(trainer._params)])
        elif trainer is not None:
            _first_step_without_gradients(trainer)
        self.joined_late = True


def _joins(kv):
    """The store's elastic joins (engine/joins.py), or None: not our store, or not elastic."""
    engine = getattr(kv, "_engine", None)
    joins = getattr(engine, "joins", None)
    return joins if joins is not None and joins.enabled else None


def _set_up(trainer) -> bool:
    """A late worker's trainer sets up its store now (its keys read, its optimizer already
    the servers'), before its first step computes gradients: whether it could (a parameter
    whose initialisation is deferred to the first forward pass has no shape yet). The
    servers must hold the weights."""
    if any(p._deferred_init for p in trainer._params):
        return False
    if not trainer._kv_initialized:
        trainer._init_kvstore()
    if trainer._params_to_init:
        trainer._init_params()
    if not trainer._update_on_kvstore:
        raise NotImplementedError(
            "a late worker reads the weights from the servers, but this trainer updates on the "
            "workers (update_on_kvstore=False, MXNET_UPDATE_ON_KVSTORE=0): the workers' "
            "weights cannot reach it yet; train with the servers' optimizer to let workers "
            "rejoin")
    return True


def _first_step_without_gradients(trainer) -> None:
    """A late worker whose parameters could not be set up before its first forward pass
    computes its first gradients on their initial values, not on the job's weights: its
    first step pushes zeros instead (the step reads the servers' weights as it sets up the
    store; the others' gradients make the round), then the trainer steps as ever."""
    step = trainer.step

    def first_step(*args, **kwargs):
        del trainer.step        # the class's own from now on
        for param in trainer._params:
            if param.grad_req != "null":
                param.zero_grad()
        return step(*args, **kwargs)
    trainer.step = first_step
