"""The worker side of ``dist_byteps`` without MXNet: keys, rounds and the stage pipeline.

:class:`WorkerEngine` joins the cluster, finds out which servers it talks to, lays each key out
on the servers and runs a pushpull of host (numpy) buffers through the pipeline

    LOCAL_REDUCE -> PUSH -> PULL -> LOCAL_BROADCAST

one work item per partition, priority-scheduled with a byte credit. PUSH and PULL each have a
stage thread; the local reduce runs in ``pushpull`` itself (its inputs are ready when it is
called) and the broadcast into the outputs in the pull's answer callback: a thread hand-off per
partition and stage costs more than either on CPUs, and the per-key cost is what small tensors
pay. ``mxnet_patch.kvstore``
wraps it in MXNet's KVStore API and engine.

Two kinds of servers are spoken to, found out at start by a probe command:

* our BytePSServer: keys are cut into ``BYTEPS_PARTITION_BYTES`` partitions placed by
  ``BYTEPS_KEY_HASH_FN``; each round, a partition is pushed (cmd = cantor(3, dtype); acked at
  once) and then pulled (answered with the round's sum once every worker pushed). With
  ``BYTEPS_PULL_WITH_PUSH`` (synchronous training) the pull rides along with the push, in one
  message (``KVWorker.push_with_pull``); the PULL stage then only waits for its answer;
* an unmodified MXNet server: keys are laid out exactly as MXNet's own worker does
  (``EncodeDefaultKey``, cmd = cantor(0, dtype)); each round is a push, then (after its ack,
  which arrives when the round is merged) a pull.
"""
import dataclasses
import json
import logging
import threading
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..compress.params import CompressionSpec, parse_compression_params
from ..compress.state import PartitionCompressor
from ..config import Config, ServerKind
from ..errors import KVStoreBytePSError, PeerError
from ..logs import announce
from ..mxproto import PROBE_ANSWER, SERVER_DTYPES, RequestType, ServerCommand, encode_cmd
from ..recovery_report import REPORT_CMD, encode_report
from ..van.kv import KVWorker
from ..van.kv_keys import server_of_key
from ..van.message import ALL_GROUP, WORKER_GROUP, Node, id_to_rank
from ..van.postoffice import Postoffice
from .partition import KeyLayoutError, Partitioner
from .recovery import KeptRounds
from .reduce import cpu_sum
from .stages import Pipeline, Stage, StageSpec, Task
from .trace import Phase, Tracer, now_ns
from .upstream import dtype_code, encode_default_key

log = logging.getLogger(__name__)



#: Partitions up to this size are sent together, one request per server (BytePS servers).
SMALL_PARTITION_BYTES = 65536
_COMPRESSED_CMD = encode_cmd(RequestType.BYTEPS_COMPRESSED, np.float32)
#: heads of plain BytePS round requests (a push of one of these is in a recovery report)
_ROUND_CMDS = frozenset(encode_cmd(RequestType.BYTEPS, dtype) for dtype in SERVER_DTYPES)


def group_small(items, server_of, small: int, limit: int) -> List[list]:
    """Group items (in their order) into requests: items of at most ``small`` bytes that share
    ``server_of(item)`` go together up to ``limit`` bytes; bigger items go alone. Pure."""
    groups, open_groups = [], {}
    for item in items:
        nbytes = item.partition.nbytes
        if nbytes > small:
            groups.append([item])
            continue
        where = server_of(item)
        group = open_groups.get(where)
        if group is None or group[1] + nbytes > limit:
            group = open_groups[where] = [[], 0]
            groups.append(group[0])
        group[0].append(item)
        group[1] += nbytes
    return [sorted(g, key=lambda item: item.partition.ps_key) for g in groups]


def split_answer(result, count: int) -> List[memoryview]:
    """The per-key value bytes of a pull answer of ``count`` keys (split by its lens)."""
    vals = memoryview(result.vals).cast("B")
    if count == 1:
        return [vals]
    if result.lens is None or len(result.lens) != count:
        raise PeerError("a pull of %d keys was answered with %s lens"
                        % (count, None if result.lens is None else len(result.lens)))
    offsets = np.concatenate(([0], np.cumsum(result.lens, dtype=np.int64)))
    return [vals[int(offsets[i]):int(offsets[i + 1])] for i in range(count)]


@dataclasses.dataclass(frozen=True)
class Slot:
    """One partition of a key on the wire: its ps key and its byte range in the tensor."""

    ps_key: int
    offset: int
    nbytes: int
    server: int         # rank of the server holding ps_key


@dataclasses.dataclass
class KeyLayout:
    key: int
    shape: tuple
    dtype: np.dtype
    slots: List[Slot]
    round_cmd: int      # cmd of the per-round traffic
    init_cmd: int       # cmd of the initialising push and of plain pulls
    name: str = ""      # "key K (shape dtype)", for messages

    def __post_init__(self) -> None:
        self.name = "key %d (%s %s)" % (self.key, self.shape, self.dtype)


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

    def __init__(self, config: Config, postoffice: Optional[Postoffice] = None):
        """Set up; nothing touches the network until :meth:`start`."""
        self.config = config
        self.po = postoffice or Postoffice(config)
        self.kv: Optional[KVWorker] = None
        self.rank: Optional[int] = None
        self.num_workers = config.num_workers
        self.flavor: Optional[ServerKind] = None
        self._partitioner = Partitioner(config)
        self._layouts: Dict[int, KeyLayout] = {}
        self._layout_lock = threading.Lock()
        self._last_task: Dict[int, Task] = {}    # rounds of one key run in order
        self.tracer: Optional[Tracer] = None
        self.pipeline: Optional[Pipeline] = None
        self._closed = False
        self.failure: Optional[BaseException] = None   # set once a request failed for good
        self.compression: Optional[CompressionSpec] = None
        self._compressors: Dict[int, PartitionCompressor] = {}    # per compressed ps key
        self._push_rounds: Dict[int, int] = {}      # PUSH thread only
        self._pull_rounds: Dict[int, int] = {}      # PULL thread only
        #: payload bytes of compressed pushes so far (PUSH thread only)
        self.compressed_bytes_pushed = 0
        #: ps key -> its rounds and last two pushes, for a restarted server (None: not kept)
        self._kept: Optional[Dict[int, KeptRounds]] = {} if config.server_recovery else None
        self._pulls_ride = False        # whether pulls ride along with pushes (set at start)

    def start(self) -> "WorkerEngine":
        """Join the cluster and get ready to push: postoffice start and MXNet's start-up
        barrier, the server probe, kSyncMode from rank 0, then the pipeline. Returns self."""
        config = self.config
        self.po.start()
        self.po.barrier(ALL_GROUP)
        self.kv = KVWorker(self.po)
        self.rank, self.num_workers = self.po.my_rank, self.po.num_workers
        self.flavor = self._probe_servers()
        if self.flavor is not ServerKind.BYTEPS:
            self._kept = None        # MXNet's servers keep weights: nothing to restore them
        # Our servers take a round's pull along with its push (one message less per partition
        # and round). Not with async rounds (a pull is answered at once there), nor with kept
        # rounds (a restarted server is sent the pushes again, and would not know the pulls).
        self._pulls_ride = (config.pull_with_push and self.flavor is ServerKind.BYTEPS
                            and not config.enable_async and self._kept is None)
        self.po.on_recovery(lambda node, epoch: self.kv.post(
            lambda: self._restore_server(node, epoch)))
        if self.rank == 0:
            self._wait(self.kv.command(ServerCommand.SYNC_MODE), "kSyncMode")
        self.tracer = Tracer.from_config(config, self.rank)
        self.pipeline = Pipeline(self._stages(), credit=self._credit(),
                                 credit_span=(Stage.PUSH, Stage.PUSH), tracer=self.tracer,
                                 cost=lambda item: max(1, item.partition.nbytes))
        log.info("worker rank %d of %d talks to %s servers", self.rank, self.num_workers,
                 self.flavor.value)
        if self.rank == 0:
            announce(config, self.describe())
        return self

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def describe(self) -> str:
        """What this worker talks to and how: the line rank 0 prints at start-up."""
        cfg = self.config
        kind = ("BytePS servers (the BytePS data path)" if self.flavor is ServerKind.BYTEPS
                else "MXNet's own servers (MXNet's key layout, no BytePS data path)")
        credit = self._credit()
        return ("dist_byteps: %d workers, %d %s; van %s; partitions of %d bytes; credit %s%s"
                % (self.num_workers, self.po.num_servers, kind, cfg.van_type.value,
                   cfg.partition_bytes,
                   "%d bytes (%d partitions)" % (credit, cfg.scheduling_credit) if credit
                   else "unlimited",
                   "; each pull sent with its push" if self._pulls_ride else ""))

    # ------------------------------------------------------------------ set-up
    def _probe_servers(self) -> ServerKind:
        request = self.kv.command(ServerCommand.BYTEPS_PROBE)
        self._wait(request, "the server probe")
        answers = set(request.bodies.values())
        if answers == {PROBE_ANSWER}:
            return ServerKind.BYTEPS
        if answers == {b""}:
            return ServerKind.MXNET
        raise KVStoreBytePSError("servers of mixed kinds answered the probe (%s); use either "
                                 "only BytePS servers or only MXNet servers" % sorted(answers))

    def _wait(self, request, what: str):
        try:
            return self.kv.wait(request)
        except KVStoreBytePSError as exc:
            raise type(exc)("worker rank %d, %s: %s" % (self.rank, what, exc)) from exc

    def layout(self, key: int, shape, dtype) -> KeyLayout:
        """The wire layout of ``key``; KeyLayoutError naming the key if shape/dtype changed."""
        known = self._layouts.get(key)    # every pushpull asks: a known key needs no lock
        if known is not None and known.shape == tuple(shape) and known.dtype == dtype:
            return known
        shape, dtype = tuple(int(d) for d in shape), np.dtype(dtype)
        with self._layout_lock:
            known = self._layouts.get(key)
            if known is None:
                known = self._layouts[key] = self._new_layout(key, shape, dtype)
        if (known.shape, known.dtype) != (shape, dtype):
            raise KeyLayoutError("%s used with shape %s and dtype %s" % (known.name,
                                                                        shape, dtype))
        return known

    def _new_layout(self, key: int, shape: tuple, dtype: np.dtype) -> KeyLayout:
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        code = dtype_code(dtype)
        init_cmd = encode_cmd(RequestType.DEFAULT, code)
        if self.flavor is ServerKind.MXNET:
            pskv = encode_default_key(key, nbytes // dtype.itemsize, dtype.itemsize,
                                      self.po.num_servers, self.config.bigarray_bound)
            offsets = np.concatenate(([0], np.cumsum(pskv.lens)))[:-1]
            slots = [Slot(k, int(o), n, server_of_key(k, self.po.num_servers))
                     for k, o, n in zip(pskv.keys, offsets, pskv.lens)]
            return KeyLayout(key, shape, dtype, slots, init_cmd, init_cmd)
        plan = self._partitioner.plan(key, nbytes, dtype.itemsize)
        slots = [Slot(p.ps_key, p.offset, p.nbytes, p.server) for p in plan.partitions]
        return KeyLayout(key, shape, dtype, slots, encode_cmd(RequestType.BYTEPS, code),
                         init_cmd)

    # ------------------------------------------------------------------ init / broadcast
    def init(self, key: int, value: np.ndarray, out: Optional[Sequence[np.ndarray]] = None):
        """Initialise ``key`` on the servers from rank 0's ``value``; every rank then reads the
        stored value back (into ``out`` if given) and checks its size. Blocking."""
        try:
            return self._init(key, value, out)
        except KVStoreBytePSError as exc:
            self.failure = self.failure or exc
            raise

    def _init(self, key, value, out):
        layout = self.layout(key, value.shape, value.dtype)
        for slot in layout.slots:    # where this key's answers will land, every round
            self.kv.expect_answers(slot.ps_key, slot.nbytes)
            if self._kept is not None:
                with self.kv.send_lock:    # a report may be iterating the kept keys
                    self._kept_rounds(slot, layout.dtype)
        if self.rank == 0:
            flat = np.ascontiguousarray(value).reshape(-1).view(np.uint8)
            requests = [self.kv.push([s.ps_key], flat[s.offset:s.offset + s.nbytes], [s.nbytes],
                                     cmd=layout.init_cmd) for s in layout.slots]
            for request in requests:
                self._wait(request, "initialising %s" % layout.name)
        self.po.barrier(WORKER_GROUP, timeout=self.config.request_timeout)
        try:
            stored = self._pull_all(layout)
        except PeerError as exc:
            if self.flavor is not ServerKind.BYTEPS or self.config.key_hash_fn != "balanced":
                raise
            raise PeerError("%s. The servers do not hold this worker's partitions of %s where "
                            "it placed them: with BYTEPS_KEY_HASH_FN=balanced (the default) "
                            "every worker must initialise its keys in the same order, as "
                            "gluon's Trainer and Module do; or choose a hash placement (djb2)"
                            % (exc, layout.name)) from exc
        for target in out or ():
            np.copyto(target.reshape(-1).view(np.uint8), stored)
        return stored.view(layout.dtype).reshape(layout.shape)

    def _pull_all(self, layout: KeyLayout) -> np.ndarray:
        total = sum(s.nbytes for s in layout.slots)
        stored = np.empty(total, np.uint8)
        requests = [(s, self.kv.pull([s.ps_key], cmd=layout.init_cmd)) for s in layout.slots]
        for slot, request in requests:
            got = self._wait(request, "reading %s back" % layout.name)
            if got.vals.nbytes != slot.nbytes:
                raise KeyLayoutError(
                    "%s disagrees with the cluster: the servers hold %d bytes for ps key %d "
                    "where this worker expects %d (do all workers use the same shape and "
                    "dtype for this key?)" % (layout.name, got.vals.nbytes, slot.ps_key,
                                              slot.nbytes))
            stored[slot.offset:slot.offset + slot.nbytes] = np.frombuffer(got.vals, np.uint8)
        return stored

    def barrier(self) -> None:
        self.po.barrier(WORKER_GROUP, timeout=self.config.request_timeout)

    # ------------------------------------------------------------------ pushpull
    def pushpull(self, key: int, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray],
                 priority: int = 0, on_done: Optional[Callable[[Optional[BaseException]], None]]
                 = None) -> Task:
        """Sum ``inputs`` over local devices and all workers into every output. Returns at once;
        ``on_done(error_or_None)`` runs on a pipeline thread when finished."""
        layout = self.layout(key, inputs[0].shape, inputs[0].dtype)
        for array in (*inputs, *outputs):
            if array.shape != layout.shape or array.dtype != layout.dtype:
                raise KeyLayoutError("%s: got an array of shape %s and dtype %s"
                                     % (layout.name, array.shape, array.dtype))
        traced = self.tracer.enabled and len(inputs) > 1   # one input is sent as is: no reduce
        reduce_start = now_ns() if traced else 0
        context = RoundData(layout, self._local_reduce(inputs),
                            [a.reshape(-1).view(np.uint8) for a in outputs],
                            (reduce_start, now_ns()) if traced else None)
        task = Task(key, layout.slots, priority, name=layout.name, context=context)

        def finished(future):
            error = future.exception()
            if error is not None:
                self.failure = self.failure or error
            if on_done is not None:
                on_done(error)
        task.future.add_done_callback(finished)
        self._submit_in_order(task)
        return task

    def name_key(self, key: int, name: str) -> None:
        """Show ``key`` as ``name`` in the trace (MXNet's str keys are parameter names)."""
        self.tracer.name_key(key, name)

    def _submit_in_order(self, task: Task) -> None:
        """Submit ``task`` once the previous round of its key is complete: the server keeps
        two round buffers per key, so a worker's round r+1 must not overtake its round r."""
        with self._layout_lock:
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

    def _credit(self) -> Optional[int]:
        """Bytes of pushes in flight. The credit covers only the push, which our server
        acknowledges at once: were a stage that waits for the other workers inside it (a pull,
        or an upstream push, acked only when the round is merged), two workers that ordered
        partitions differently could each hold the credit the other needs. Upstream servers
        therefore get no credit limit (priorities still order the queue), as MXNet's worker."""
        if self.flavor is not ServerKind.BYTEPS:
            return None
        return self.config.scheduling_credit * self.config.partition_bytes

    def _stages(self) -> List[StageSpec]:
        return [StageSpec(Stage.PUSH, self._push, asynchronous=True, batch=True),
                StageSpec(Stage.PULL, self._pull, asynchronous=True, batch=True)]

    def _requests(self, items) -> List[list]:
        """Items grouped into requests: small partitions of one server and cmd share one
        (BytePS servers only: upstream's take exactly one key per request); a compressed
        partition always goes alone."""
        if self.flavor is not ServerKind.BYTEPS:
            return [[item] for item in items]
        if self.compression is None:
            return group_small(items, self._server_of, SMALL_PARTITION_BYTES,
                               self.config.partition_bytes)
        plain, alone = [], []
        for item in items:
            (alone if self._compressed(item) else plain).append(item)
        return (group_small(plain, self._server_of, SMALL_PARTITION_BYTES,
                            self.config.partition_bytes) + [[item] for item in alone])

    # ------------------------------------------------------------------ compression
    def set_compression(self, params) -> None:
        """``kv.set_gradient_compression(params)``: check ``params`` (ConfigError naming a bad
        key), tell the servers (rank 0), and compress every float32 partition of at least
        ``min_compress_bytes`` from now on. Only before the first pushpull (the rounds of
        worker and server are counted from it)."""
        spec = parse_compression_params(params)
        if self.config.server_recovery:
            raise KVStoreBytePSError("gradient compression and BYTEPS_SERVER_RECOVERY cannot be "
                                     "used together yet: a restarted server could not rebuild "
                                     "the compressors' error feedback")
        if self.flavor is not ServerKind.BYTEPS:
            raise KVStoreBytePSError("gradient compression needs kvstore-byteps servers; these "
                                     "are MXNet's")
        if self.config.enable_async:
            raise KVStoreBytePSError("gradient compression needs synchronous training "
                                     "(unset BYTEPS_ENABLE_ASYNC)")
        with self._layout_lock:
            if self._last_task:
                raise KVStoreBytePSError("set_gradient_compression must come before the first "
                                         "pushpull (gluon.Trainer calls it in time)")
        if self.rank == 0:
            body = json.dumps(dict(params)).encode("utf-8")
            self._wait(self.kv.command(ServerCommand.BYTEPS_COMPRESSION, body),
                       "setting gradient compression")
        self.compression = spec

    def _compressed(self, item) -> bool:
        spec = self.compression
        return (spec is not None and item.task.context.layout.dtype == np.float32
                and item.partition.nbytes >= spec.min_compress_bytes)

    def _compressor(self, ps_key: int) -> PartitionCompressor:
        compressor = self._compressors.get(ps_key)
        if compressor is None:
            compressor = self._compressors[ps_key] = PartitionCompressor(self.compression,
                                                                         salt=ps_key)
        return compressor

    def _push_compressed(self, item, done) -> None:
        ps_key = item.partition.ps_key
        r = self._push_rounds.get(ps_key, 0)
        self._push_rounds[ps_key] = r + 1
        data = self._compressor(ps_key).encode(self._send_buffer(item).view(np.float32), r)
        self.compressed_bytes_pushed += data.size
        self.kv.push([ps_key], data, [data.size], cmd=_COMPRESSED_CMD, priority=item.priority,
                     extra={"round": r}, callback=lambda request: done(request.error, [item]))

    def _pull_compressed(self, item, done) -> None:
        ps_key = item.partition.ps_key
        r = self._pull_rounds.get(ps_key, 0)
        self._pull_rounds[ps_key] = r + 1

        def on_answer(request):
            error = request.error
            if error is None:
                try:
                    data = np.frombuffer(split_answer(request.result, 1)[0], np.uint8)
                    values = self._compressor(ps_key).decode(data, item.partition.nbytes // 4, r)
                    self._local_broadcast(item, memoryview(values.view(np.uint8)))
                except KVStoreBytePSError as exc:
                    error = exc
                except (ValueError, IndexError) as exc:   # bytes that do not decode
                    error = PeerError("ps key %d: the server's compressed answer does not "
                                      "decode: %s" % (ps_key, exc))
            done(error, [item])
        self.kv.pull([ps_key], cmd=_COMPRESSED_CMD, priority=item.priority,
                     extra={"round": r}, callback=on_answer)

    @staticmethod
    def _server_of(item) -> tuple:
        return (item.partition.server, item.task.context.layout.round_cmd)

    @staticmethod
    def _span(array: np.ndarray, slot: Slot) -> np.ndarray:
        return array[slot.offset:slot.offset + slot.nbytes]

    @staticmethod
    def _local_reduce(inputs: Sequence[np.ndarray]) -> np.ndarray:
        """The bytes to send: the one input itself, or the sum of several into a new buffer."""
        if len(inputs) == 1:
            return inputs[0].reshape(-1).view(np.uint8)
        reduced = np.empty_like(inputs[0])
        cpu_sum(list(inputs), reduced)
        return reduced.reshape(-1).view(np.uint8)

    def _send_buffer(self, item) -> np.ndarray:
        return self._span(item.task.context.send, item.partition)

    def _push(self, items, done) -> None:
        # Each request's partitions move on (and return their credit) when it is answered.
        for group in self._requests(items):
            if self._compressed(group[0]):
                self._push_compressed(group[0], done)
                continue
            buffers = [self._send_buffer(item) for item in group]
            vals = buffers[0] if len(buffers) == 1 else np.concatenate(buffers)
            if self._kept is None:
                self._push_group(group, vals, done)
                continue
            with self.kv.send_lock:      # kept and sent together: see engine/recovery.py
                for item, data in zip(group, buffers):
                    self._kept_rounds(item.partition, item.task.context.layout.dtype
                                      ).record_push(data)
                self._push_group(group, vals, done)

    def _push_group(self, group, vals, done) -> None:
        keys = [item.partition.ps_key for item in group]
        lens = [item.partition.nbytes for item in group]
        cmd, priority = group[0].task.context.layout.round_cmd, group[0].priority
        if not self._pulls_ride:
            self.kv.push(keys, vals, lens, cmd=cmd, priority=priority,
                         callback=lambda request: done(request.error, group))
            return
        riding = _RidingPull(self, group)
        for item in group:
            item.handoff = riding
        self.kv.push_with_pull(keys, vals, lens, cmd=cmd, priority=priority,
                               push_callback=lambda request: done(request.error, group),
                               pull_callback=riding.arrived, into=self._landing_target(group))

    def _pull(self, items, done) -> None:
        riding: Dict[int, tuple] = {}
        rest = []
        for item in items:
            if item.handoff is None:
                rest.append(item)
            else:
                riding.setdefault(id(item.handoff), (item.handoff, []))[1].append(item)
        for answer, waiting in riding.values():
            answer.deliver_to(waiting, done)
        for group in self._requests(rest):
            if self._compressed(group[0]):
                self._pull_compressed(group[0], done)
                continue
            def on_answer(request, group=group):
                error = request.error
                if error is None:
                    if self._kept is not None:     # on the thread completing requests
                        for item in group:
                            self._kept[item.partition.ps_key].record_answer()
                    try:
                        for item, vals in zip(group, split_answer(request.result, len(group))):
                            self._local_broadcast(item, vals, maybe_in_place=request.landed)
                    except KVStoreBytePSError as exc:
                        error = exc
                done(error, group)
            self.kv.pull([item.partition.ps_key for item in group],
                         cmd=group[0].task.context.layout.round_cmd,
                         priority=group[0].priority, callback=on_answer,
                         into=self._landing_target(group))

    def _landing_target(self, group):
        """Where the answer to a one-partition pull may land: the first output's span
        (byteps_tcp lands it there, saving a copy of every byte of the sum)."""
        if len(group) != 1:
            return None
        item = group[0]
        return self._span(item.task.context.outputs[0], item.partition)

    # ------------------------------------------------------------------ restarted servers
    def _kept_rounds(self, slot, dtype) -> KeptRounds:
        """``slot``'s kept rounds, made on first use (hold ``kv.send_lock``)."""
        kept = self._kept.get(slot.ps_key)
        if kept is None:
            kept = self._kept[slot.ps_key] = KeptRounds(slot.ps_key, dtype, slot.nbytes,
                                                        slot.server)
        return kept

    def _why_not_restorable(self) -> Optional[str]:
        if self.flavor is not ServerKind.BYTEPS:
            return ("this worker talks to MXNet's own servers, which kept the weights and the "
                    "optimizer state")
        if self.config.enable_async:
            return "with BYTEPS_ENABLE_ASYNC the server kept the weights"
        if self._kept is None:
            return ("this worker did not keep its last pushes: set BYTEPS_SERVER_RECOVERY=1 on "
                    "every worker to make a restarted server restorable")
        return None

    def _restore_server(self, node: Node, epoch: int) -> None:
        """On the thread that completes requests: ``node`` is a restarted server. Send it
        this worker's report of every ps key it holds, then re-send what it never answered."""
        reason = self._why_not_restorable()
        if reason is not None:
            error = PeerError("%s was restarted and lost what it held; worker rank %s cannot "
                              "restore it: %s" % (node.describe_rank(), self.rank, reason))
            log.error("%s", error)
            self.failure = self.failure or error
            self.kv.fail_server(node.id, error)
            return
        rank = id_to_rank(node.id)

        def reported(request):
            if request.error is not None:
                log.error("worker rank %d: the restarted %s refused this worker's report: %s",
                          self.rank, node.describe_rank(), request.error)
                self.failure = self.failure or request.error
        with self.kv.send_lock:
            reports = [kept.report() for kept in self._kept.values() if kept.server == rank]
            body, keys, vals, lens = encode_report(reports)
            self.kv.restore_server(node.id, epoch, (REPORT_CMD, body, keys, vals, lens),
                                   lambda meta: meta.push and not meta.pull
                                   and meta.head in _ROUND_CMDS, callback=reported)
        log.warning("worker rank %d: sent the restarted %s its report (%d ps keys, %d bytes)",
                    self.rank, node.describe_rank(), len(reports), vals.nbytes)

    def _local_broadcast(self, item, result: memoryview, maybe_in_place: bool = False) -> None:
        """Copy one partition's sum into every output (``maybe_in_place``: the van was asked
        to land it in the first output's span, so an output it is already in is skipped)."""
        ctx, slot = item.task.context, item.partition
        if result.nbytes != slot.nbytes:
            raise PeerError("%s: the server answered ps key %d with %d bytes, expected %d"
                            % (ctx.layout.name, slot.ps_key, result.nbytes, slot.nbytes))
        data = np.frombuffer(result, np.uint8)
        start = now_ns() if self.tracer.enabled else 0
        where = data.__array_interface__["data"][0] if maybe_in_place else None
        for out in ctx.outputs:
            span = self._span(out, slot)
            if where is None or span.__array_interface__["data"][0] != where:
                span[:] = data
        if start:
            self.tracer.record(Phase.LOCAL_BROADCAST, item.key, item.index, item.task.step,
                               start, now_ns(), item.priority)

    # ------------------------------------------------------------------ shutdown
    def close(self) -> None:
        """MXNet's exit sequence: Barrier(4), kStopServer from rank 0, Barrier(7), each with a
        deadline. After a failed request the worker leaves at once instead: its peers' waits
        then end at their deadlines, naming what they waited for. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self.pipeline is None:        # never started (or its start failed)
            self.po.stop()
            return
        timeout = self.config.request_timeout
        try:
            self.pipeline.close(timeout)
            if self.tracer.enabled:
                self.tracer.dump()
            if self.failure is not None:
                log.error("worker rank %d leaves without the shutdown barriers after: %s",
                          self.rank, self.failure)
                return
            self.barrier()
            if self.rank == 0:
                self._wait(self.kv.command(ServerCommand.STOP_SERVER), "kStopServer")
            self.po.finalize(timeout=timeout)
        finally:
            self.po.stop()


class _RidingPull:
    """The answer to a pull that was sent along with its push (``KVWorker.push_with_pull``),
    and the PULL stage's wait for it.

    The answer usually comes after the push's acknowledgement moved the items on to PULL, but
    it may come first (pacing can hold an acknowledgement while the round completes):
    whichever of the two comes second copies the sums out and finishes the items."""

    def __init__(self, engine: "WorkerEngine", group: list):
        self._engine, self._group = engine, group
        self._landed = False           # the sums may already be in the outputs
        self._lock = threading.Lock()
        self._answered = False
        self._error: Optional[BaseException] = None
        self._values: Dict[int, memoryview] = {}      # id(item) -> its sum's bytes
        self._waiting: List[tuple] = []                # (items, done) of the PULL stage

    def arrived(self, request) -> None:
        """The pull request completed (answered, refused, failed or past its deadline)."""
        error, values = request.error, {}
        if error is None:
            try:
                values = {id(item): vals for item, vals in
                          zip(self._group, split_answer(request.result, len(self._group)))}
            except KVStoreBytePSError as exc:
                error = exc
        self._group = None    # the items refer to this object: no reference cycle
        with self._lock:
            self._answered, self._error, self._values = True, error, values
            self._landed = request.landed
            waiting, self._waiting = self._waiting, []
        for items, done in waiting:
            self._deliver(items, done)

    def deliver_to(self, items: list, done) -> None:
        """Finish ``items`` (of this group) with ``done`` once the answer is here."""
        with self._lock:
            if not self._answered:
                self._waiting.append((items, done))
                return
        self._deliver(items, done)

    def _deliver(self, items: list, done) -> None:
        error = self._error
        if error is None:
            try:
                for item in items:   # (popped: the receive buffer goes back to the pool)
                    self._engine._local_broadcast(item, self._values.pop(id(item)),
                                                  maybe_in_place=self._landed)
            except KVStoreBytePSError as exc:
                error = exc
        done(error, items)
