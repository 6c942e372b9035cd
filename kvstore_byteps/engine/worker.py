"""The worker side of ``dist_byteps`` without MXNet: cluster life, rounds and the stage pipeline.

:class:`WorkerEngine` joins the cluster, finds out which servers it talks to (a probe command:
our servers or MXNet's, each spoken to in its dialect, :mod:`.layout`) and runs a pushpull of
host (numpy) buffers through the pipeline

    LOCAL_REDUCE -> PUSH -> PULL -> LOCAL_BROADCAST

one work item per partition, priority-scheduled with a byte credit. PUSH and PULL each have a
stage thread; the local reduce runs in ``pushpull`` itself (its inputs are ready when it is
called) and the broadcast into the outputs in the pull's answer callback: a thread hand-off per
partition and stage costs more than either on CPUs, and the per-key cost is what small tensors
pay. How a group of partitions travels (plain, its pull riding along with the push, or
compressed) is a transfer route (:mod:`.routes`); what a restarted server needs is kept by the
recovery keeper (:mod:`.recovery`). ``mxnet_patch.kvstore`` wraps the engine in MXNet's KVStore
API and engine.
"""
import dataclasses
import json
import logging
import threading
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .. import compiled
from ..compress.params import parse_compression_params
from ..config import Config, ServerKind
from ..errors import ConfigError, JobAbortedError, KVStoreBytePSError, PeerError, training_over
from ..logs import announce
from ..mxproto import Presence, RequestType, ServerCommand, encode_cmd
from ..van.kv import open_worker
from ..van.wire.message import ALL_GROUP, SERVER_GROUP, WORKER_GROUP
from ..van.runtime.postoffice import Postoffice
from ..words import count
from .fusion import BUCKET_INDEX, Fusion, Ticket
from .modes import tell_presence
from . import sizing
from .layout import KeyLayout, Layouts, ServerDialect, dialect_for, server_kind
from .partition import KeyLayoutError, decode_ps_key
from .recovery import RecoveryKeeper, Unrecoverable
from .reduce import local_reduce
from .routes import CompressedRoute, PlainRoute, RidingRoute, compression_refusal
from .stage_specs import Stage, StageSpec
from .stages import Pipeline, Task
from .stuck import BarrierPort, Waiting, WorkerBarriers, parse as parse_waiting
from .trace import Phase, Tracer, now_ns

log = logging.getLogger(__name__)


class _Finished:
    """A task's done-callback: an object, not a closure (fewer objects for the cyclic garbage
    collector per key in flight, see mxnet_patch/kvstore.py's _PushPull)."""

    __slots__ = ("engine", "on_done")

    def __init__(self, engine, on_done):
        self.engine, self.on_done = engine, on_done

    def __call__(self, future) -> None:
        try:
            self.engine._task_finished(future.exception(), self.on_done)
        except Exception as exc:  # never leave the engine operation pending: a silent hang
            log.exception("finishing a pushpull failed")
            if self.on_done is not None:
                self.on_done(exc)     # done() is idempotent: a second call does nothing


def _rides(item) -> bool:
    """Whether ``item``'s pull rode with its push (the PULL stage runs it inline)."""
    return item.riding_pull is not None


@dataclasses.dataclass
class RoundData:
    """What the PUSH and PULL stages need of one pushpull (a pipeline Task's ``context``)."""

    layout: KeyLayout
    send: np.ndarray                  # the locally reduced bytes, pushed partition by partition
    outputs: List[np.ndarray]         # flat byte views the pulled sum is copied into
    #: when the local reduce ran (before the task had a step): recorded at submission
    reduced_ns: Optional[Tuple[int, int]]


class WorkerEngine:
    """Cluster membership plus the pushpull pipeline of one worker. Thread-safe ``pushpull``."""

    def __init__(self, config: Config, postoffice: Optional[Postoffice] = None,
                 waiting: Optional[Callable[[int], bool]] = None):
        """Set up; nothing touches the network until :meth:`start`. ``waiting(thread_id)``:
        whether that thread is blocked waiting for an array (the framework's; gradient
        buckets tell a program that reads between keys by it, :mod:`.buckets`)."""
        self.config = config
        self._waiting = waiting
        self.mode = config.training_mode
        self.po = postoffice or Postoffice(config)
        self.kv = None          # the KV layer's worker app (set at start)
        self.rank: Optional[int] = None
        self.num_workers = config.num_workers
        self.dialect: Optional[ServerDialect] = None     # the servers' (found at start)
        self.layouts: Optional[Layouts] = None
        self._last_task: Dict[int, Task] = {}    # rounds of one key run in order
        self._order_lock = threading.Lock()
        self.tracer: Optional[Tracer] = None
        self.pipeline: Optional[Pipeline] = None
        self._closed = False
        self.failure: Optional[BaseException] = None   # set once a request failed for good
        self.keeper: Optional[Unrecoverable] = None     # what a restarted server needs
        self._route: Optional[PlainRoute] = None       # plain or riding
        self.compressed: Optional[CompressedRoute] = None     # with gradient compression
        #: bytes a second rank 0 measured to the servers when it sized the partitions
        self.link_rate: Optional[float] = None
        #: a server answered that the job's training is over (backup workers: W - b workers
        #: finished); this worker's late step was not applied
        self.training_over = False
        self._finished = False           # finish_training ran (its barrier passed)
        self.fusion: Optional[Fusion] = None     # gradient buckets (set at start)
        self._declared = 0      # keys declared in the program's order (init without any_order)
        #: the workers' barriers, watched for the others waiting for this worker's pushes
        self.barriers = WorkerBarriers(BarrierPort(
            lambda: self.rank, self._waiting_rounds,
            lambda timeout, kind: self.po.barrier(WORKER_GROUP, timeout=timeout, kind=kind),
            lambda why: self.po.end_job(why), self._name_ps_key))

    def start(self) -> "WorkerEngine":
        """Join the cluster and get ready to push: postoffice start and MXNet's start-up
        barrier, the server probe, kSyncMode from rank 0, then the pipeline. Returns self."""
        config = self.config
        self.po.start()
        self.po.barrier(ALL_GROUP)
        self.kv = open_worker(self.po)
        self.rank, self.num_workers = self.po.my_rank, self.po.num_workers
        # our servers check that they train as this worker does; MXNet's ignore the body
        probe = self._command(ServerCommand.BYTEPS_PROBE, self.mode.name.encode("utf-8"),
                              "the server probe")
        kind = server_kind(probe.bodies.values())
        if kind is ServerKind.BYTEPS:
            layout = self._agree_on_layout()
            if config.size_partitions_by_link:
                self.config = config = dataclasses.replace(
                    config, partition_bytes=int(layout["partition_bytes"]))
        self.dialect = dialect_for(kind, config, self.po.num_servers)
        self.layouts = Layouts(self.dialect)
        self.keeper = self._keeper()
        # a bucket is one partition: at most the partition size
        self.fusion = Fusion(self, min(config.fusion_bytes, config.partition_bytes)
                             if self._fuses() else 0, config.fusion_timeout, self._waiting)
        if self.mode.summed and kind is ServerKind.BYTEPS:     # rounds wait for every worker
            self.barriers.watch()
        self.po.on_recovery(lambda node, epoch: self.kv.post(
            lambda: self.keeper.recover(node, epoch)))
        if self.rank == 0:
            self._command(ServerCommand.SYNC_MODE, b"", "kSyncMode")
        self.tracer = Tracer.from_config(config, self.rank)
        self._route = (RidingRoute if self._pulls_ride() else PlainRoute)(self.kv, self.tracer,
                                                                          self.keeper)
        self.pipeline = Pipeline(self._stages(), credit=self.dialect.credit(),
                                 credit_span=(Stage.PUSH, Stage.PUSH), tracer=self.tracer,
                                 cost=lambda item: max(1, item.partition.nbytes))
        log.info("worker rank %d of %d talks to %s servers", self.rank, self.num_workers,
                 self.dialect.kind.value)
        if self.rank == 0:
            announce(config, self.describe())
        return self

    def _agree_on_layout(self) -> dict:
        """Rank 0's layout, which every worker takes (sizing.py): the partition size (rank 0
        measures its link, unless BYTEPS_PARTITION_BYTES says) and the gradient buckets'
        capacity, which must be this worker's: a worker that fuses otherwise ends the job
        at start, saying so (fused differently, the workers sent each other's rounds in
        different server keys, and waited for each other until BYTEPS_REQUEST_TIMEOUT)."""
        config = self.config
        layout = sizing.agree_on_layout(
            self.rank, self.po.num_servers, self._command, self._link_test,
            lambda: self.po.barrier(WORKER_GROUP, timeout=config.request_timeout),
            None if config.size_partitions_by_link else config.partition_bytes,
            config.fusion_bytes)
        self.link_rate = layout.get("rate")
        theirs = layout.get("fusion_bytes")       # None: rank 0 of an older release
        if theirs is not None and theirs != config.fusion_bytes:
            error = ConfigError(
                "worker rank %d has BYTEPS_FUSION_BYTES=%d, rank 0 %d: gradient buckets fuse "
                "keys by it, and workers that fuse otherwise cannot sum together: set the "
                "same BYTEPS_FUSION_BYTES on every worker" % (self.rank, config.fusion_bytes,
                                                              theirs))
            self.po.end_job(str(error))
            raise error
        return layout

    def _link_test(self, body) -> None:
        """``body`` to every server at once as pushes they acknowledge and drop."""
        cmd = encode_cmd(RequestType.BYTEPS_LINK_TEST, np.float32)
        requests = [self.kv.send_push(server, cmd, b"", [0], body, [len(body)], "the link test")
                    for server in self.po.group_ids(SERVER_GROUP)]
        for request in requests:
            self._wait(request, "the link test")

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def describe(self) -> str:
        """What this worker talks to and how: the line rank 0 prints at start-up."""
        cfg = self.config
        credit = self.dialect.credit()
        sized = ("" if self.link_rate is None else
                 " (sized for rank 0's link to the servers: %.0f MB/s)" % (self.link_rate / 1e6))
        return ("dist_byteps: %s, %s (%s); van %s; partitions of %d bytes%s; credit %s%s%s%s; %s"
                % (count(self.num_workers, "worker"),
                   count(self.po.num_servers, self.dialect.noun), self.dialect.detail,
                   self.po.transport, cfg.partition_bytes, sized,
                   "%d bytes (%d partitions)" % (credit, cfg.scheduling_credit) if credit
                   else "unlimited",
                   "; each pull sent with its push" if self._pulls_ride() else "",
                   "; gradient buckets of up to %d bytes" % self.fusion.plan.capacity
                   if self.fusion.enabled else "",
                   "" if self.mode.summed else "; training %s" % self.mode.name,
                   compiled.describe()))

    def _pulls_ride(self) -> bool:
        """Our servers take a round's pull along with its push (one message less per partition
        and round). Not with async rounds (a pull is answered at once there), nor with kept
        rounds (a restarted server is sent the pushes again, and would not know the pulls)."""
        return (self.config.pull_with_push and self.dialect.extensions_missing is None
                and not self.mode.asynchronous and not self.config.server_recovery)

    def _fuses(self) -> bool:
        """Gradient buckets where the servers sum rounds the workers apply: our servers,
        synchronous training."""
        return self.dialect.extensions_missing is None and self.mode.summed

    def _keeper(self) -> Unrecoverable:
        reason = self.dialect.unrecoverable or self.mode.unrecoverable
        if reason is None and not self.config.server_recovery:
            reason = ("this worker did not keep its last pushes: set BYTEPS_SERVER_RECOVERY=1 "
                      "on every worker to make a restarted server restorable")
        if reason is None:
            return RecoveryKeeper(self.kv, self.rank, self._note_failure)
        return Unrecoverable(self.kv, self.rank, reason, self._note_failure)

    def _note_failure(self, error: BaseException) -> None:
        self.failure = self.failure or error

    # ------------------------------------------------------------------ set-up
    def _wait(self, request, what: str):
        try:
            return self.kv.wait(request)
        except KVStoreBytePSError as exc:
            raise type(exc)("worker rank %d, %s: %s" % (self.rank, what, exc)) from exc

    def layout(self, key: int, shape, dtype) -> KeyLayout:
        """The wire layout of ``key``; KeyLayoutError naming the key if shape/dtype changed."""
        return self.layouts.get(key, shape, dtype)

    # ------------------------------------------------------------------ init / broadcast
    def init(self, key: int, value: np.ndarray, out: Optional[Sequence[np.ndarray]] = None,
             any_order: bool = False):
        """Initialise ``key`` on the servers from rank 0's ``value``; every rank then reads the
        stored value back (into ``out`` if given) and checks its size. Blocking. Every worker
        initialises its keys in the same order (a barrier pairs them), unless ``any_order``
        (our servers only): then each read waits at the server for rank 0's value."""
        refusal = self.mode.refusal(self.dialect.extensions_missing)
        if refusal:
            # A usage error, not a failure of the job: refused before any request, so every
            # worker that meets it still leaves the job cleanly as it exits.
            raise ConfigError(refusal)
        try:
            return self._init(key, value, out, any_order)
        except KVStoreBytePSError as exc:
            self._note_failure(exc)
            raise

    def _init(self, key, value, out, any_order):
        if any_order and self.dialect.extensions_missing:
            raise KVStoreBytePSError("declaring tensors in any order needs kvstore-byteps "
                                     "servers; %s" % self.dialect.extensions_missing)
        layout = self.layout(key, value.shape, value.dtype)
        if not any_order:       # declared in the same order on every worker: may be fused
            self.fusion.declare(layout)
        for part in layout.partitions:    # where this key's answers will land, every round
            self.kv.expect_answers(part.ps_key, part.nbytes)
        self.keeper.keep(layout)
        if self.rank == 0:
            flat = np.ascontiguousarray(value).reshape(-1).view(np.uint8)
            requests = [self.kv.push([p.ps_key], flat[p.offset:p.end], [p.nbytes],
                                     cmd=layout.init_cmd) for p in layout.partitions]
            for request in requests:
                self._wait(request, "initialising %s" % layout.name)
        if not any_order:
            self._declared += 1
            self.barrier("declaring %s (its key number %d)"
                         % (self.tracer.name_of(key), self._declared))
        try:
            stored = self._pull_all(layout, {"await_init": True} if any_order else None)
        except PeerError as exc:
            why = self.dialect.misplaced(layout)
            if why is None:
                raise
            raise PeerError("%s. %s" % (exc, why)) from exc
        for target in out or ():
            np.copyto(target.reshape(-1).view(np.uint8), stored)
        return stored.view(layout.dtype).reshape(layout.shape)

    def read(self, key: int, shape, dtype) -> np.ndarray:
        """The servers' current value of ``key`` (their weights, with backup workers).
        Blocking."""
        layout = self.layout(key, shape, dtype)
        return self._pull_all(layout).view(layout.dtype).reshape(layout.shape)

    def _pull_all(self, layout: KeyLayout, extra=None) -> np.ndarray:
        total = sum(p.nbytes for p in layout.partitions)
        stored = np.empty(total, np.uint8)
        requests = [(p, self.kv.pull([p.ps_key], cmd=layout.init_cmd, extra=extra))
                    for p in layout.partitions]
        for part, request in requests:
            got = self._wait(request, "reading %s back" % layout.name)
            if got.vals.nbytes != part.nbytes:
                raise KeyLayoutError(
                    "%s disagrees with the cluster: the servers hold %d bytes for ps key %d "
                    "where this worker expects %d (do all workers use the same shape and "
                    "dtype for this key?)" % (layout.name, got.vals.nbytes, part.ps_key,
                                              part.nbytes))
            stored[part.offset:part.end] = np.frombuffer(got.vals, np.uint8)
        return stored

    def barrier(self, what: str = "in a barrier of the workers (kv._barrier)") -> None:
        """Wait for every worker (``what`` it waits in, for messages). With backup workers, the
        servers' rounds do not wait for this worker's pushes meanwhile (the others may still be
        training)."""
        tell_presence(self.mode, self._command, Presence.AWAY)
        self.barriers.wait(what, self.config.request_timeout)   # watched: engine/stuck.py
        tell_presence(self.mode, self._command, Presence.BACK)

    def _waiting_rounds(self) -> List[Waiting]:
        """Every server's rounds that wait for this worker's push (BYTEPS_WAITING)."""
        request = self.kv.command(ServerCommand.BYTEPS_WAITING, b"")
        self.kv.wait(request)
        return [w for body in request.bodies.values() for w in parse_waiting(body)]

    def _name_ps_key(self, ps_key: int) -> str:
        """``key 3 (conv0_weight) partition 1`` or ``gradient bucket 2``, from a ps key."""
        _, key, index = decode_ps_key(ps_key, self.po.num_servers)
        if index == BUCKET_INDEX:
            return "gradient bucket %d" % key
        return "%s partition %d" % (self.tracer.name_of(key), index)

    def finish_training(self) -> bool:
        """This worker trains no more. Where the servers keep the weights (asynchronous
        training, backup workers): tell them (backup workers: once W - b workers finished,
        the job's training is over) and wait for every worker to finish, so the servers'
        weights are final; True. Synchronous training: nothing to wait for (every worker holds
        the same weights), False. Once: :meth:`close` calls it too, so every worker passes
        its barrier exactly once whether or not the program called it. Blocking."""
        if self.mode.summed:
            return False
        if not self._finished:
            tell_presence(self.mode, self._command, Presence.DONE)
            # a finish barrier: the others' own barriers no longer wait for this worker
            self.barriers.wait("in its finish barrier", self.config.request_timeout,
                               kind="finish")
            self._finished = True
        return True

    def stale_keys(self) -> Tuple[int, int]:
        """After :meth:`finish_training`: ``(stale, keys)``, how many of the servers' keys
        this worker last read before their latest change (its weights differ from the
        servers' final ones) and of how many."""
        answers = self._command(ServerCommand.BYTEPS_STALE, b"", "comparing this worker's "
                                "weights with the servers'").bodies.values()
        counts = [tuple(map(int, bytes(body).split(b"/"))) for body in answers]
        return sum(c[0] for c in counts), sum(c[1] for c in counts)

    def _command(self, head: ServerCommand, body: bytes, what: str):
        """Send a command to every server and wait for their answers; the request."""
        request = self.kv.command(head, body)
        self._wait(request, what)
        return request

    # ------------------------------------------------------------------ pushpull
    def use(self, key: int, fusable: bool = True) -> Optional[Ticket]:
        """A pushpull (``fusable``) or a lone push of ``key`` is being called (the API thread,
        in the program's order): what gradient buckets learn from it (:mod:`.fusion`). Returns
        the call's ticket (None: alone), the ``ticket`` to pass to its :meth:`pushpull`."""
        self.barriers.called()
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
            self.barriers.begun()
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
        return self.submit_round(layout, send, [a.reshape(-1).view(np.uint8) for a in outputs],
                                 priority, on_done, (reduce_start, now_ns()) if traced else None)

    def submit_round(self, layout: KeyLayout, send: np.ndarray, outputs: List[np.ndarray],
                     priority: int, on_done, reduced_ns: Optional[Tuple[int, int]] = None
                     ) -> Task:
        """Run one round of ``layout`` (already reduced into ``send``; flat byte views of the
        ``outputs``) through the pipeline; ``reduced_ns``: when the local reduce ran."""
        task = Task(layout.key, layout.partitions, priority, name=layout.name,
                    context=RoundData(layout, send, outputs, reduced_ns))
        task.future.add_done_callback(_Finished(self, on_done))
        self._submit_in_order(task)
        return task

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

    def _submit_in_order(self, task: Task) -> None:
        """Submit ``task`` once the previous round of its key is complete: the server keeps
        two round buffers per key, so a worker's round r+1 must not overtake its round r."""
        with self._order_lock:
            previous, self._last_task[task.key] = self._last_task.get(task.key), task
        if previous is None or previous.future.done():
            self._submit(task)
        else:
            previous.future.add_done_callback(lambda _: self._submit(task))

    def _submit(self, task: Task) -> None:
        self.pipeline.submit(task)   # numbers the task's step (for the trace)
        reduced = task.context.reduced_ns
        if reduced is not None:
            self.tracer.record(Phase.LOCAL_REDUCE, task.key, -1, task.step, reduced[0],
                               reduced[1], task.priority)

    def _stages(self) -> List[StageSpec]:
        # The next pushes run on the thread that returns a push's credit (the receive loop,
        # which completes the requests), where the van's sends never wait for a peer: no
        # thread switch per acknowledgement. A pull that rode with its push only waits for
        # its answer: no queue, no thread.
        return [StageSpec(Stage.PUSH, self._push, asynchronous=True, batch=True,
                          runs_where_credit_returns=self.kv.answers_on_receive_loop),
                StageSpec(Stage.PULL, self._pull, asynchronous=True, batch=True,
                          inline=_rides)]

    def _push(self, items, done) -> None:
        # Each request's partitions move on (and return their credit) when it is answered.
        for route, group in self._requests(items):
            route.push(group, done)

    def _pull(self, items, done) -> None:
        riding = [item for item in items if item.riding_pull is not None]
        if riding:
            self._route.pull(riding, done)
        for route, group in self._requests([item for item in items if item.riding_pull is None]):
            route.pull(group, done)

    def _requests(self, items) -> List[tuple]:
        """``(route, group)`` per request: items grouped as the servers' dialect groups them
        on the plain (or riding) route; a compressed partition goes alone on its route."""
        if self.compressed is None:
            return [(self._route, group) for group in self.dialect.requests(items)]
        plain, alone = [], []
        for item in items:
            (alone if self.compressed.takes(item) else plain).append(item)
        return ([(self._route, group) for group in self.dialect.requests(plain)]
                + [(self.compressed, [item]) for item in alone])

    def set_optimizer(self, body: bytes) -> None:
        """kController from rank 0 (MXNet's body: the optimizer pickled with protocol 0): the
        servers run it on the rounds' sums (backup workers). Then a barrier: a round may close
        without rank 0's push, so no worker may push before the servers have the optimizer
        (every worker calls this, as gluon and Module do). Blocking."""
        if self.rank == 0:
            self._command(ServerCommand.CONTROLLER, body, "setting the optimizer")
        self.barrier()

    # ------------------------------------------------------------------ compression
    def set_compression(self, params) -> None:
        """``kv.set_gradient_compression(params)``: check ``params`` (ConfigError naming a bad
        key), tell the servers (rank 0), and compress every float32 partition of at least
        ``min_compress_bytes`` from now on. Only before the first pushpull (the rounds of
        worker and server are counted from it)."""
        spec = parse_compression_params(params)
        refusal = compression_refusal(self.config.server_recovery,
                                      self.dialect.extensions_missing, self.mode)
        if refusal:
            raise ConfigError(refusal)
        with self._order_lock:
            if self._last_task:
                raise KVStoreBytePSError("set_gradient_compression must come before the first "
                                         "pushpull (gluon.Trainer calls it in time)")
        if self.rank == 0:
            body = json.dumps(dict(params)).encode("utf-8")
            self._command(ServerCommand.BYTEPS_COMPRESSION, body, "setting gradient compression")
        self.compressed = CompressedRoute(self.kv, self.tracer, spec)
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
        if self.pipeline is None:        # never started (or its start failed)
            self.po.stop()
            return
        timeout = self.config.request_timeout
        self.fusion.close()
        try:
            self.pipeline.close(timeout)
            if self.tracer.enabled:
                self.tracer.dump()
            if self.failure is not None:
                # a job ended by a node was said once, by the postoffice, with its reason
                (log.debug if isinstance(self.failure, JobAbortedError) else log.error)(
                    "worker rank %d leaves without the shutdown barriers after: %s",
                    self.rank, self.failure)
                return
            if self.finish_training() and self.dialect.extensions_missing is None:
                self._warn_if_stale()       # our servers know the versions of the weights
            leaving = leave_within or self.config.request_timeout
            self.barriers.wait("in the shutdown barrier", leaving, cause=ending,
                               kind="shutdown")
            if self.rank == 0:
                self._command(ServerCommand.STOP_SERVER, b"", "kStopServer")
            self.po.finalize(timeout=leaving)
        finally:
            self.barriers.close()
            self.po.stop()

    def _warn_if_stale(self) -> None:
        """One line if this worker's weights differ from the servers' final weights."""
        stale, keys = self.stale_keys()
        if stale:
            # ended by TrainingOver, the script's own finish_training (after its loop) never ran
            advice = ("catch kvstore_byteps.TrainingOver around the training loop, then call "
                      "kvstore_byteps.finish_training(trainer or module)" if self.training_over
                      else "call kvstore_byteps.finish_training(trainer or module) after training")
            log.warning("worker rank %d ends with weights that differ from the servers' final "
                        "weights (%d of %d partitions read before their last change, training "
                        "%s): %s", self.rank, stale, keys, self.mode.name, advice)


def start_engine(config: Config, waiting: Optional[Callable[[int], bool]] = None) -> WorkerEngine:
    """A started worker engine (:meth:`WorkerEngine.start`): the store's one way to an engine,
    so that only this module names the class (tests/unit/test_layers.py)."""
    return WorkerEngine(config, waiting=waiting).start()
