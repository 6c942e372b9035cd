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

With BytePS's or Horovod's API (``import kvstore_byteps.mxnet as bps``, ``kvstore_byteps.horovod
as hvd``): ``State(trainer=trainer, epoch=0, batch=0)`` after ``init()``; a late worker's
``broadcast_parameters`` and DistributedTrainer's first-step broadcast are skipped (the others
did theirs long ago): the state hands it the parameters.

On the workers that started with the job, ``State`` only holds the fields, and
:meth:`~State.commit` reports them to server rank 0 and hears who joins there (the late
workers then enter every key's rounds at once with the others; see engine/joins.py). On a
late worker, ``State(...)`` blocks until the others' next commit, then holds that commit's
fields and the servers' current weights (the trainer's parameters): its next step is the
others' next step. Where the store is not ours, or the job not elastic, ``State`` is a
plain holder and ``commit`` does nothing.

The weights come from the servers where they update (the servers' optimizer:
``update_on_kvstore``, MXNet's default for a distributed store); where the workers update
(``MXNET_UPDATE_ON_KVSTORE=0``), the lowest-ranked worker hands its parameters and optimizer
state over through server rank 0 (kvstore_byteps/handover.py): give every worker's State the
trainer. A commit costs a round trip to server rank 0 (and, where somebody joins, waiting for
this worker's pending operations): commit every step for the quickest joins, or every few.
"""
import json
import logging
import threading
from typing import List

from . import handover
from .errors import ConfigError, DeadlineError, JobFinished, TrainingOver
from .logs import uptime

__all__ = ["State", "scale_workers"]

log = logging.getLogger(__name__)


class State:
    """The fields a worker resumes from in an elastic job (see the module)."""

    def __init__(self, kv=None, trainer=None, **fields):
        """``kv``: the store (None: BytePS's or Horovod's API's, ``kvstore_byteps.mxnet`` or
        ``.horovod``, after ``init()``); ``trainer``: the gluon Trainer (their
        DistributedTrainer too) whose parameters a late worker takes; ``fields``: JSON
        values (epoch, batch, ...), set as attributes."""
        if kv is None:
            from mxnet_patch.collective import COLLECTIVE
            kv = COLLECTIVE.kv
        self._kv, self._trainer = kv, trainer
        self._names = sorted(fields)
        self.__dict__.update(fields)
        #: this worker took a departed one's place and resumed from the others' commit
        self.joined_late = False
        self._fence = None      # the engine's progress at the last commit
        joins = _joins(kv)
        if joins is not None and joins.joining:
            self._join(joins)

    def commit(self) -> List[int]:
        """Report the fields (every worker, at the same points of its loop); returns the
        node ids of the late workers that joined here (they are in the rounds from the next
        step on), usually []. Waits until MXNet's engine finished the steps before the last
        commit (a program's thread may otherwise run hundreds of steps ahead of it, and a
        late worker would wait for all of them); the report itself is answered by the next
        commit, so the step waits for no round trip."""
        joins = _joins(self._kv)
        if joins is None:
            return []
        import mxnet as mx
        if self._fence is not None:
            self._fence.wait()
        trainer = self._trainer
        workers_update = (trainer is not None and trainer._kv_initialized
                          and not trainer._update_on_kvstore)
        joined = joins.commit(self._encoded(), mx.nd.waitall,
                              (lambda: handover.of_trainer(trainer)) if workers_update else None)
        self._fence = _Fence(_parameters(trainer), joins.timeout)
        return joined

    def _encoded(self) -> bytes:
        return json.dumps({name: getattr(self, name) for name in self._names}).encode()

    def _join(self, joins) -> None:
        """This late worker's set-up (its trainer reads the job's keys) and join; where the
        others finish the job first (the scheduler says so), TrainingOver: the program ends
        with status 0 after one line saying why."""
        try:
            self._join_now(joins)
        except JobFinished as exc:
            log.warning("%s; this worker ends without training, %s", exc.reason, uptime())
            raise TrainingOver(exc.reason) from None

    def _join_now(self, joins) -> None:
        trainer = self._trainer
        if trainer is None:
            log.info("this worker joins late and its State has no trainer: its parameters "
                     "are the servers' once its trainer or Module sets up the store (where "
                     "the servers update; where the workers update, pass the trainer)")
        ready = trainer is not None and _set_up(trainer)
        _, state, given = joins.join(self._check)
        committed = json.loads(state or b"{}")
        self.__dict__.update({name: committed[name] for name in self._names
                              if name in committed})
        if ready:
            self._take(given)
        if trainer is not None:
            _first_step_after(trainer, None if ready else self._take, given)
        self.joined_late = True

    def _check(self, servers_update: bool) -> None:
        """Before this late worker enters the rounds: where the workers update (the servers
        only sum), the job's parameters come from a hand-over into a gluon Trainer; without
        one it would train on parameters of its own (a Module's, MXNET_UPDATE_ON_KVSTORE=0)."""
        if not servers_update and self._trainer is None:
            raise ConfigError(
                "this worker joins late where the workers update, but its "
                "kvstore_byteps.elastic.State has no trainer to take the job's parameters: "
                "pass the gluon Trainer (State(kv, trainer, ...), on every worker); Module.fit "
                "takes a worker back only where the servers update (MXNet's default: unset "
                "MXNET_UPDATE_ON_KVSTORE=0)")

    def _take(self, given: bytes) -> None:
        """The job's parameters into the set-up trainer: the servers' weights, or where the
        workers update, those the leading worker handed over (``given``)."""
        trainer = self._trainer
        if trainer._update_on_kvstore:
            self._kv.reread([(i, p.list_data()) for i, p in enumerate(trainer._params)])
        elif given:
            handover.to_trainer(trainer, given)
        else:
            raise RuntimeError("this worker takes a departed one's place where the workers "
                               "update, but nobody handed it the parameters: give the other "
                               "workers' State the trainer too")


def scale_workers(kv) -> int:
    """The workers each round's sum stands for, the same on every worker: ``DMLC_NUM_WORKER``
    in an elastic job (its servers scale every round to that many pushes, however many
    workers are in it now; ``kv.num_workers`` follows who is), else ``kv.num_workers``.
    Scale gradients by it (a global batch of batch x ``scale_workers(kv)``), not by
    ``kv.num_workers``: a worker that joined a grown job reads 5 there where the others read
    4, and where the workers update, their parameters would part."""
    engine = getattr(kv, "_engine", None)
    config = getattr(engine, "config", None)
    if config is not None and config.elastic:
        return config.num_workers
    return kv.num_workers


class _Fence:
    """An operation of MXNet's engine after every write of ``arrays`` issued before it: where
    the engine is at a commit (the trainer's parameters: the step's last writes)."""

    def __init__(self, arrays, timeout: float):
        self._done, self._timeout = threading.Event(), timeout
        if not arrays:
            self._done.set()
            return
        from mxnet_patch.engine_async import push_async

        def reached(done):
            self._done.set()
            done()
        push_async(reached, const_arrays=arrays, name="kvstore_byteps_commit", inline=True)

    def wait(self) -> None:
        if not self._done.wait(self._timeout):
            raise DeadlineError("the steps before the last State.commit() did not finish "
                                "within %.0f s (BYTEPS_REQUEST_TIMEOUT)" % self._timeout)


def _parameters(trainer) -> list:
    """The trainer's parameters' arrays (every device), those initialised."""
    if trainer is None:
        return []
    return [array for p in trainer._params if p._data is not None for array in p.list_data()]


def _joins(kv):
    """The store's elastic joins (engine/joins.py), or None: not our store, or not elastic."""
    engine = getattr(kv, "_engine", None)
    joins = getattr(engine, "joins", None)
    return joins if joins is not None and joins.enabled else None


def _set_up(trainer) -> bool:
    """A late worker's trainer sets up its store now (its keys read, its optimizer already
    the servers'), before its first step computes gradients: whether it could (a parameter
    whose initialisation is deferred to the first forward pass has no shape yet)."""
    if any(p._deferred_init for p in trainer._params):
        return False
    if not trainer._kv_initialized:
        trainer._init_kvstore()
    if trainer._params_to_init:
        trainer._init_params()
    return True


def _first_step_after(trainer, take, given: bytes) -> None:
    """A late worker's first step. Its optimizer's gradient scale is the step's, as the
    step itself sets it (gluon takes a store set up before the first step for a change of
    batch size). Where ``take`` is given, its parameters could not be set up before its
    first forward pass, which computed its first gradients on their initial values, not on
    the job's: the step sets the trainer up, takes the job's parameters (``take(given)``)
    and pushes zeros instead of those gradients (the others' make the round, which updates
    the job's parameters here as on every worker). Then the trainer steps as ever."""
    step = trainer.step

    def first_step(batch_size, *args, **kwargs):
        del trainer.step        # the class's own from now on
        trainer._optimizer.rescale_grad = trainer._scale / batch_size
        if take is not None:
            _set_up(trainer)
            take(given)
            for param in trainer._params:
                if param.grad_req != "null":
                    param.zero_grad()
        return step(batch_size, *args, **kwargs)
    trainer.step = first_step
