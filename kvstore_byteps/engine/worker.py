"""The worker side of ``dist_byteps`` without MXNet: one worker's engine, composed of its parts.

:class:`WorkerEngine` joins the cluster (:mod:`.cluster`: membership, commands, barriers, the
exit sequence), finds out which servers it talks to (a probe command: our servers or MXNet's,
each spoken to in its dialect, :mod:`.layout`), declares and reads keys (:mod:`.values`) and
runs a pushpull of host (numpy) buffers through the pipeline (:mod:`.rounds`)

    LOCAL_REDUCE -> PUSH -> PULL -> LOCAL_BROADCAST

one work item per partition, priority-scheduled with a byte credit. PUSH and PULL each have a
stage thread; the local reduce runs in ``pushpull`` itself (its inputs are ready when it is
called) and the broadcast into the outputs in the pull's answer callback: a thread hand-off per
partition and stage costs more than either on CPUs, and the per-key cost is what small tensors
pay. How a group of partitions travels (plain, its pull riding along with the push, or
compressed) is a transfer route (:mod:`.routes`); what a restarted server needs is kept by the
recovery keeper (:mod:`.recovery`); gradient buckets are :mod:`.fusion`'s. Each part gets the
few operations it needs (a port), never the engine. ``mxnet_patch.kvstore`` wraps the engine
in MXNet's KVStore API and engine.
"""
import json
import logging
from typing import Callable, Optional, Sequence, Tuple

import numpy as np

from .. import compiled
from ..compress.params import parse_compression_params
from ..config import Config, ServerKind
from ..errors import ConfigError, JobAbortedError, KVStoreBytePSError, training_over
from ..logs import announce
from ..mxproto import ServerCommand
from ..van.runtime.postoffice import Postoffice
from ..words import count
from .cluster import Cluster
from .fusion import Fusion, FusionPort, Ticket
from .layout import KeyLayout, Layouts, ServerDialect, dialect_for
from .mxnet_twobit import twobit_command_body
from .modes import SERVERS_UPDATE, check_servers_update, fuses, pulls_ride, unrecoverable
from .partition import KeyLayoutError
from .recovery import RecoveryKeeper, Unrecoverable
from .reduce import local_reduce
from .rounds import Rounds
from .routes import compression_refusal
from .sparse import RowSparseKeys, SparsePort
from .stages import Task
from .trace import Tracer, now_ns
from .values import KeyValues, ValuesPort

log = logging.getLogger(__name__)

#: why a restarted server cannot be restored once row_sparse keys are in use
ROWS_UNRECOVERABLE = ("row_sparse keys are summed and kept by the servers as MXNet's are, with "
                      "nothing a worker could restore a restarted server from")


class WorkerEngine:
    """One worker: its cluster life, its keys' values and rounds, its gradient buckets.
    Thread-safe ``pushpull``."""

    def __init__(self, config: Config, postoffice: Optional[Postoffice] = None,
                 waiting: Optional[Callable[[int], bool]] = None):
        """Set up; nothing touches the network until :meth:`start`. ``waiting(thread_id)``:
        whether that thread is blocked waiting for an array (the framework's; gradient
        buckets tell a program that reads between keys by it, :mod:`.buckets`)."""
        self.config = config
        self._waiting = waiting
        self.mode = config.training_mode
        self.cluster = Cluster(config, postoffice or Postoffice(config),
                               lambda key: self.tracer.name_of(key))
        self.po = self.cluster.po
        self.kv = None          # the KV layer's worker app (set at start)
        self.rank: Optional[int] = None
        self.dialect: Optional[ServerDialect] = None     # the servers' (found at start)
        self.layouts: Optional[Layouts] = None
        self.tracer: Optional[Tracer] = None
        self.values: Optional[KeyValues] = None      # the keys' set-up and reads (at start)
        self.rounds: Optional[Rounds] = None         # the pipeline (set at start)
        self._closed = False
        self.failure: Optional[BaseException] = None   # set once a request failed for good
        self.keeper: Optional[Unrecoverable] = None     # what a restarted server needs
        #: a server answered that the job's training is over (backup workers: W - b workers
        #: finished); this worker's late step was not applied
        self.training_over = False
        self.fusion: Optional[Fusion] = None     # gradient buckets (set at start)
        self.sparse: Optional[RowSparseKeys] = None   # row_sparse keys (set at start)

    def start(self) -> "WorkerEngine":
        """Join the cluster and get ready to push: postoffice start and MXNet's start-up
        barrier, the server probe, kSyncMode from rank 0, then the pipeline. Returns self."""
        cluster = self.cluster
        kind = cluster.join()
        self.config = config = cluster.config       # with the partition size agreed on
        if config.elastic and kind is not ServerKind.BYTEPS:
            raise ConfigError("BYTEPS_MIN_WORKERS (elastic workers) needs kvstore-byteps "
                              "servers: MXNet's own servers wait for every worker's push")
        self.kv, self.rank = cluster.kv, cluster.rank
        self.dialect = dialect_for(kind, config, self.po.num_servers)
        self.layouts = Layouts(self.dialect)
        reason = unrecoverable(config, self.dialect)
        self.keeper = (RecoveryKeeper(self.kv, self.rank, self._note_failure) if reason is None
                       else Unrecoverable(self.kv, self.rank, reason, self._note_failure))
        if self.mode.summed and kind is ServerKind.BYTEPS:     # rounds wait for every worker
            cluster.barriers.watch()
        self.po.roster.recovery.add(lambda node, epoch: self.kv.post(
            lambda: self.keeper.recover(node, epoch)))
        if self.rank == 0 and not self.po.joined:     # (a late worker's servers know)
            cluster.command(ServerCommand.SYNC_MODE, b"", "kSyncMode")
        self.tracer = Tracer.from_config(config, self.rank)
        self.rounds = Rounds(self.kv, self.dialect, self.tracer, self.keeper,
                             pulls_ride(config, self.dialect), self._task_finished)
        self.values = KeyValues(self.kv, self.rank, self.mode, self.dialect, self.layouts,
                                ValuesPort(wait=cluster.wait, barrier=cluster.declare_barrier,
                                           declare=lambda layout: self.fusion.declare(layout),
                                           keep=self.keeper.keep, name_of=self.tracer.name_of,
                                           note_failure=self._note_failure,
                                           leader=cluster.leads, elastic=config.elastic))
        self.sparse = RowSparseKeys(SparsePort(
            kv=self.kv, ranges=self.dialect.row_ranges, barrier=self.barrier, rank=self.rank,
            request_timeout=config.request_timeout, pulls_follow=kind is ServerKind.BYTEPS))
        # a bucket is one partition: at most the partition size
        self.fusion = Fusion(self._fusion_port(), min(config.fusion_bytes, config.partition_bytes)
                             if fuses(self.mode, self.dialect) and not self.po.joined else 0,
                             config.fusion_timeout, self._waiting)
        # a late worker cannot learn the others' buckets: nobody fuses once one joined
        self.joins.hooks.append(lambda: self.fusion.disable("a worker joined the job"))
        log.info("worker rank %d of %d talks to %s servers", self.rank, self.num_workers,
                 self.dialect.kind.value)
        if self.rank == 0:
            announce(config, self.describe())
        return self

    @property
    def num_workers(self) -> int:
        """The job's workers (kv.num_workers): in an elastic job, those in it now."""
        return self.cluster.num_workers

    def _fusion_port(self) -> FusionPort:
        """What the gradient buckets need of this engine (:class:`.fusion.FusionPort`)."""
        return FusionPort(
            rank=self.rank, num_servers=self.po.num_servers, round_cmd=self.dialect.round_cmd,
            expect_answers=self.kv.expect_answers, keep=self.keeper.keep,
            name_key=self.tracer.name_key, name_of=self.tracer.name_of,
            initialise=self.values.initialise, pull_all=self.values.pull_all,
            submit_round=self.rounds.submit, known=self.layouts.known,
            note_failure=self._note_failure, end_job=self.po.end_job)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def describe(self) -> str:
        """What this worker talks to and how: the line rank 0 prints at start-up."""
        cfg = self.config
        credit = self.dialect.credit()
        rate = self.cluster.link_rate
        sized = ("" if rate is None else
                 " (sized for rank 0's link to the servers: %.0f MB/s)" % (rate / 1e6))
        return ("dist_byteps: %s, %s (%s); van %s; partitions of %d bytes%s; credit %s%s%s%s; %s"
                % (count(self.num_workers, "worker"),
                   count(self.po.num_servers, self.dialect.noun), self.dialect.detail,
                   self.po.transport, cfg.partition_bytes, sized,
                   "%d bytes (%d partitions)" % (credit, cfg.scheduling_credit) if credit
                   else "unlimited",
                   "; each pull sent with its push" if pulls_ride(cfg, self.dialect) else "",
                   "; gradient buckets of up to %d bytes" % self.fusion.plan.capacity
                   if self.fusion.enabled else "",
                   "" if self.mode.summed else "; training %s" % self.mode.name,
                   compiled.describe()))

    def _note_failure(self, error: BaseException) -> None:
        self.failure = self.failure or error

    def layout(self, key: int, shape, dtype) -> KeyLayout:
        """The wire layout of ``key``; KeyLayoutError naming the key if shape/dtype changed."""
        return self.layouts.get(key, shape, dtype)

    # ------------------------------------------------------------------ keys and the cluster
    def init(self, key: int, value: np.ndarray, out: Optional[Sequence[np.ndarray]] = None,
             any_order: bool = False):
        """Declare ``key`` from rank 0's ``value``, read back by every worker (into ``out``
        if given; :meth:`.values.KeyValues.init`). Blocking."""
        return self.values.init(key, value, out, any_order)

    def init_rows(self, key: int, value: np.ndarray, name: str) -> None:
        """Declare row_sparse ``key`` from rank 0's dense ``value`` (:mod:`.sparse`), then a
        barrier; a restarted server cannot be restored from then on. Blocking."""
        self.keeper.give_up(ROWS_UNRECOVERABLE)
        self.sparse.init(key, value, name)

    def read(self, key: int, shape, dtype) -> np.ndarray:
        """The servers' current value of ``key`` (their weights, with backup workers).
        Blocking."""
        return self.values.read(key, shape, dtype)

    def barrier(self, what: str = "in a barrier of the workers (kv._barrier)") -> None:
        """Wait for every worker (:meth:`.cluster.Cluster.barrier`). Blocking."""
        self.cluster.barrier(what)

    @property
    def joins(self):
        """Elastic joins: this worker's commits, its own join if it came late
        (:mod:`.joins`)."""
        return self.cluster.joins

    def finish_training(self) -> bool:
        """This worker trains no more (:meth:`.cluster.Cluster.finish_training`): True where
        the servers keep the weights, final once it returns. Blocking."""
        return self.cluster.finish_training()

    def stale_keys(self) -> Tuple[int, int]:
        """After :meth:`finish_training`: ``(stale, keys)``, of the servers' keys
        (:meth:`.cluster.Cluster.stale_keys`). Blocking."""
        return self.cluster.stale_keys()

    def set_optimizer(self, body: bytes, multi_precision: bool = False) -> None:
        """The servers' optimizer from rank 0, then a barrier (``Cluster.set_optimizer``); in
        synchronous training, the first time, :func:`.modes.check_servers_update`, then no
        buckets. Blocking."""
        if self.mode.summed and self.keeper.reason is not SERVERS_UPDATE:   # not yet theirs
            check_servers_update(self.rounds.begun(), len(self.fusion.plan.fused()))
            if self.fusion.enabled and self.rank == 0:      # the start-up line said they were on
                announce(self.config, "gradient buckets off: the servers run the optimizer, "
                                      "each key with its own optimizer index")
            self.fusion.disable("the servers update each key with its own optimizer index")
            self.keeper.give_up(SERVERS_UPDATE)
            self.rounds.answer_weights()   # compressed partitions pull the weights plain
        # again: the servers' optimizer replaced, as MXNet's
        self.cluster.set_optimizer(body, multi_precision)

    # ------------------------------------------------------------------ pushpull
    def use(self, key: int, fusable: bool = True) -> Optional[Ticket]:
        """A pushpull (``fusable``) or a lone push of ``key`` is being called (the API thread,
        in the program's order): what gradient buckets learn from it (:mod:`.fusion`). Returns
        the call's ticket (None: alone), the ``ticket`` to pass to its :meth:`pushpull`."""
        if self.joins.joining:      # its pushes would be refused: the job has not taken it in
            raise ConfigError("worker rank %d joined the job late and has not joined its "
                              "rounds yet: create kvstore_byteps.elastic.State(kv, trainer, "
                              "...) before the training loop (it joins there, at the others' "
                              "next commit)" % self.rank)
        self.cluster.barriers.called()
        return self.fusion.use(key, fusable)

    def pushpull(self, key: int, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray],
                 priority: int = 0, on_done: Optional[Callable[[Optional[BaseException]], None]]
                 = None, ticket: Optional[Ticket] = None, called: bool = True
                 ) -> Optional[Task]:
        """Sum ``inputs`` over local devices and all workers into every output. Returns at once;
        ``on_done(error_or_None)`` runs on a pipeline thread when finished. ``ticket``: what
        :meth:`use` returned for this call; a fused one puts ``key`` in its gradient bucket
        (and None is returned) unless the bucket was dissolved since, else ``key`` goes alone
        (its task is returned). ``called``: :meth:`use` counted this call (the local group's
        root pushes without it)."""
        if called:
            self.cluster.barriers.begun()
        layout = self.layout(key, inputs[0].shape, inputs[0].dtype)
        for array in (*inputs, *outputs):
            if array.shape != layout.shape or array.dtype != layout.dtype:
                raise KeyLayoutError("%s: got an array of shape %s and dtype %s"
                                     % (layout.name, array.shape, array.dtype))
        if ticket is not None:
            if not ticket.fused:
                on_done = self.fusion.watch(key, ticket, on_done)
            elif self.fusion.arrive(key, ticket, inputs, outputs, priority, on_done):
                return None
        traced = self.tracer.enabled and len(inputs) > 1   # one input is sent as is: no reduce
        reduce_start = now_ns() if traced else 0
        send = local_reduce(inputs)
        return self.rounds.submit(layout, send, [a.reshape(-1).view(np.uint8) for a in outputs],
                                  priority, on_done, (reduce_start, now_ns()) if traced else None)

    def _task_finished(self, error: Optional[BaseException], on_done) -> None:
        if training_over(error):     # not applied; the worker's next step says so
            self.training_over, error = True, None
        if error is not None:
            self._note_failure(error)
        if on_done is not None:
            on_done(error)

    def name_key(self, key: int, name: str) -> None:
        """Show ``key`` as ``name`` in the trace (MXNet's str keys are parameter names)."""
        self.tracer.name_key(key, name)

    # ------------------------------------------------------------------ compression
    def set_compression(self, params) -> None:
        """``kv.set_gradient_compression(params)``: check ``params`` (ConfigError naming a bad
        key), tell the servers (rank 0), and compress every float32 partition of at least
        ``min_compress_bytes`` from now on. Only before the first pushpull (the rounds of
        worker and server are counted from it)."""
        spec = parse_compression_params(params)
        refusal = compression_refusal(self.config.server_recovery, self.dialect.extensions_missing,
                                      self.mode, spec.compressor)
        if refusal:
            raise ConfigError(refusal)
        if self.rounds.begun():
            raise KVStoreBytePSError("set_gradient_compression must come before the first "
                                     "pushpull (gluon.Trainer calls it in time)")
        if self.dialect.kind is ServerKind.MXNET:      # MXNet's 2-bit, as its worker sends it
            if len(self.layouts):
                raise KVStoreBytePSError("set_gradient_compression must come before the first "
                                         "init with MXNet's servers (keys are laid out for it)")
            if self.cluster.leads():
                self.cluster.command(ServerCommand.SET_GRADIENT_COMPRESSION,
                                     twobit_command_body(spec.threshold),
                                     "kSetGradientCompression")
            self.dialect.compress_twobit()
        elif self.cluster.leads():
            body = json.dumps(dict(params)).encode("utf-8")
            self.cluster.command(ServerCommand.BYTEPS_COMPRESSION, body,
                                 "setting gradient compression")
        self.rounds.compress(spec)
        if self.fusion.enabled and self.rank == 0:       # the start-up line said they were on
            announce(self.config, "gradient buckets off: gradients are compressed")
        self.fusion.disable("gradients are compressed")

    # ------------------------------------------------------------------ shutdown
    def close(self, leave_within: Optional[float] = None, ending: Optional[str] = None) -> None:
        """MXNet's exit sequence: Barrier(4), kStopServer from rank 0, Barrier(7), each with a
        deadline (BYTEPS_REQUEST_TIMEOUT, or ``leave_within`` seconds; ``ending``: why this
        worker leaves early, for the message of a barrier the others do not reach,
        :mod:`.stuck`; None: the workers' programs differ).
        After a failed request the worker leaves at once instead: its peers' waits then end at
        their deadlines, naming what they waited for. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self.rounds is None:        # never started (or its start failed)
            self.po.stop()
            return
        timeout = self.config.request_timeout
        self.fusion.close()
        try:
            self.rounds.close(timeout)
            if self.tracer.enabled:
                self.tracer.dump()
            if self.failure is not None:
                # a job ended by a node was said once, by the postoffice, with its reason
                (log.debug if isinstance(self.failure, JobAbortedError) else log.error)(
                    "worker rank %d leaves without the shutdown barriers after: %s",
                    self.rank, self.failure)
                return
            if self.finish_training() and self.dialect.extensions_missing is None:
                # our servers know the versions of the weights
                self.cluster.warn_if_stale(self.training_over)
            self.cluster.leave(leave_within or self.config.request_timeout, ending)
        finally:
            self.cluster.close()


def start_engine(config: Config, waiting: Optional[Callable[[int], bool]] = None) -> WorkerEngine:
    """A started worker engine (:meth:`WorkerEngine.start`): the store's one way to an engine,
    so that only this module names the class (tests/unit/test_layers.py)."""
    return WorkerEngine(config, waiting=waiting).start()
