"""The one place that reads the environment.

``Config.from_env()`` parses and validates every variable kvstore-byteps understands and
returns a frozen object; nothing else in the package reads ``os.environ`` (the launcher only
copies it into the environments of the processes it starts; tests/unit/test_layers.py checks
both). A bad value raises :class:`~kvstore_byteps.errors.ConfigError` quoting the variable and
the value.

Two small doors for code that needs less than a whole Config: :func:`env_flag` and
:func:`env_int` read one variable of a given mapping as Config reads it (bpslaunch reads the
environment it will hand to its children), and :func:`set_default` lets an API of this
process choose the default of a setting for the stores it creates (the BytePS and Horovod
APIs' ``djb2`` placement) without writing into ``os.environ``.

The variable names are the ones MXNet, ps-lite and BytePS users already know; they are
collected as constants in :class:`Env` so the launcher and the tests spell them one way.
"""
import dataclasses
import enum
import os
from typing import Callable, Dict, Mapping, Optional, Sequence, TypeVar

from .errors import ConfigError
from .words import count

T = TypeVar("T")


class Role(enum.IntEnum):
    """A node's role; values are ps-lite's ``Node::Role`` as it travels on the wire."""

    SERVER = 0
    WORKER = 1
    SCHEDULER = 2

    @classmethod
    def parse(cls, text: str) -> "Role":
        """Parse ``scheduler``/``server``/``worker`` (case-insensitive)."""
        try:
            return cls[text.strip().upper()]
        except KeyError:
            raise ValueError("expected one of scheduler, server, worker") from None


class VanType(enum.Enum):
    """Which transport a node uses (``DMLC_PS_VAN_TYPE``)."""

    #: the default: ZeroMQ with every peer, byteps_tcp between our nodes (van/auto/van.py)
    AUTO = "auto"
    ZMQ = "zmq"
    #: ps-lite's P3 van: ZeroMQ's wire, sends ordered by priority (van/p3/van.py)
    P3 = "p3"
    BYTEPS_TCP = "byteps_tcp"
    BYTEPS_RDMA = "byteps_rdma"


class ServerKind(enum.Enum):
    """A kind of parameter server: MXNet's C++ one or ours. What an upstream ``DMLC_ROLE=server``
    MXNet process runs (``MXNET_KVSTORE_SERVER``), and what a ``dist_byteps`` worker found it
    talks to (the probe)."""

    MXNET = "mxnet"
    BYTEPS = "byteps"


class Training(enum.Enum):
    """How a job trains: each worker side (``mxnet_patch``) and server side (``serving/``) has
    one class per member, chosen once from it."""

    #: the default: servers sum each round; the workers update
    SYNC = "sync"
    #: BYTEPS_ENABLE_ASYNC=1: servers add each worker's change into the weights
    ASYNC = "async"
    #: BYTEPS_BACKUP_WORKERS=b: synchronous rounds that complete without the b slowest
    #: workers; servers keep the weights and run the optimizer
    BACKUP_WORKERS = "backup workers"


@dataclasses.dataclass(frozen=True)
class TrainingMode:
    """The job's training mode, as every node reads it from its environment
    (``Config.training_mode``). Workers tell our servers theirs in the server probe
    (:attr:`name`), and a server that trains otherwise refuses them: a sum taken for weights,
    or weights for a sum, would be silently wrong. Pure."""

    kind: Training = Training.SYNC
    backup_workers: int = 0

    @classmethod
    def of(cls, enable_async: bool, backup_workers: int) -> "TrainingMode":
        """The mode ``BYTEPS_ENABLE_ASYNC`` and ``BYTEPS_BACKUP_WORKERS`` choose (unchecked)."""
        if enable_async:
            return cls(Training.ASYNC)
        return cls(Training.BACKUP_WORKERS, backup_workers) if backup_workers else cls()

    @classmethod
    def parse(cls, text: str) -> Optional["TrainingMode"]:
        """The mode whose :attr:`name` is ``text`` (a worker's probe), or None."""
        words = text.split(" ")
        backup = int(words[2]) if len(words) > 2 and words[2].isdecimal() else 0
        modes = [cls(), cls(Training.ASYNC)] + [cls(Training.BACKUP_WORKERS, backup)] * (backup > 0)
        return next((mode for mode in modes if mode.name == text), None)

    @property
    def name(self) -> str:
        """``sync``, ``async`` or ``sync with N backup workers``: what a worker tells the
        servers in the probe."""
        if self.kind is Training.BACKUP_WORKERS:
            return "sync with %s" % count(self.backup_workers, "backup worker")
        return self.kind.value

    @property
    def variable(self) -> Optional[str]:
        """The variable that chose this mode (None: plain synchronous training)."""
        return {Training.SYNC: None, Training.ASYNC: Env.ENABLE_ASYNC,
                Training.BACKUP_WORKERS: Env.BACKUP_WORKERS}[self.kind]

    @property
    def summed(self) -> bool:
        """Rounds of sums that the workers apply themselves (plain synchronous training)."""
        return self.kind is Training.SYNC

    @property
    def asynchronous(self) -> bool:
        return self.kind is Training.ASYNC

    def refusal(self, extensions_missing: Optional[str]) -> Optional[str]:
        """Why this mode cannot run against the servers found (``extensions_missing``: what
        MXNet's servers lack), or None. MXNet's servers keep a push instead of adding it and
        know no backup workers: every update would be silently wrong."""
        if self.summed or not extensions_missing:
            return None
        return ("%s needs kvstore-byteps servers; %s (or train with MXNet's own "
                "dist_sync/dist_async on them)" % (self.variable, extensions_missing))

    @property
    def unrecoverable(self) -> Optional[str]:
        """Why a restarted server cannot be recovered in this mode, or None."""
        return None if self.summed else "training %s, the server kept the weights" % self.name

    @property
    def compression_refusal(self) -> Optional[str]:
        if self.summed:
            return None
        return ("gradient compression needs synchronous training without backup workers "
                "(unset %s)" % self.variable)


class Env:
    """Names of the environment variables (one spelling for launcher, library and tests)."""

    ROLE = "DMLC_ROLE"
    WORKER_ID = "DMLC_WORKER_ID"  # the rank a worker asks for; our scheduler honours it
    NUM_WORKER = "DMLC_NUM_WORKER"
    NUM_SERVER = "DMLC_NUM_SERVER"
    ROOT_URI = "DMLC_PS_ROOT_URI"
    ROOT_PORT = "DMLC_PS_ROOT_PORT"
    NODE_HOST = "DMLC_NODE_HOST"
    INTERFACE = "DMLC_INTERFACE"
    PORT = "PORT"
    VAN_TYPE = "DMLC_PS_VAN_TYPE"
    ENABLE_RDMA = "DMLC_ENABLE_RDMA"
    RDMA_DEVICE = "BYTEPS_RDMA_DEVICE"
    RDMA_PORT = "BYTEPS_RDMA_PORT"
    RDMA_GID_INDEX = "BYTEPS_RDMA_GID_INDEX"
    RDMA_REGISTRATION_CACHE = "BYTEPS_RDMA_REGISTRATION_CACHE"
    LOCAL = "DMLC_LOCAL"
    WATER_MARK = "DMLC_PS_WATER_MARK"
    VERBOSE = "PS_VERBOSE"
    HEARTBEAT_INTERVAL = "PS_HEARTBEAT_INTERVAL"
    HEARTBEAT_TIMEOUT = "PS_HEARTBEAT_TIMEOUT"
    RESEND = "PS_RESEND"
    RESEND_TIMEOUT = "PS_RESEND_TIMEOUT"
    DROP_MSG = "PS_DROP_MSG"
    START_TIMEOUT = "BYTEPS_START_TIMEOUT"
    REQUEST_TIMEOUT = "BYTEPS_REQUEST_TIMEOUT"
    BIGARRAY_BOUND = "MXNET_KVSTORE_BIGARRAY_BOUND"
    KVSTORE_SERVER = "MXNET_KVSTORE_SERVER"
    PARTITION_BYTES = "BYTEPS_PARTITION_BYTES"
    PARTITION_SPREAD_BYTES = "BYTEPS_PARTITION_SPREAD_BYTES"
    SCHEDULING_CREDIT = "BYTEPS_SCHEDULING_CREDIT"
    FUSION_BYTES = "BYTEPS_FUSION_BYTES"
    FUSION_TIMEOUT = "BYTEPS_FUSION_TIMEOUT"
    SERVER_ENGINE_THREAD = "BYTEPS_SERVER_ENGINE_THREAD"
    SERVER_PACING_BYTES = "BYTEPS_SERVER_PACING_BYTES"
    SERVER_PACING_HOLD_MS = "BYTEPS_SERVER_PACING_HOLD_MS"
    ENABLE_ASYNC = "BYTEPS_ENABLE_ASYNC"
    BACKUP_WORKERS = "BYTEPS_BACKUP_WORKERS"
    PULL_WITH_PUSH = "BYTEPS_PULL_WITH_PUSH"
    KEY_HASH_FN = "BYTEPS_KEY_HASH_FN"
    LOG_LEVEL = "BYTEPS_LOG_LEVEL"
    TRACE_ON = "BYTEPS_TRACE_ON"
    TRACE_START_STEP = "BYTEPS_TRACE_START_STEP"
    TRACE_END_STEP = "BYTEPS_TRACE_END_STEP"
    TRACE_DIR = "BYTEPS_TRACE_DIR"
    GC_FREEZE = "BYTEPS_GC_FREEZE"
    GC_YOUNG_THRESHOLD = "BYTEPS_GC_YOUNG_THRESHOLD"
    KEEP_FREED_MEMORY = "BYTEPS_KEEP_FREED_MEMORY"
    AUTH_KEY = "BYTEPS_AUTH_KEY"
    AUTH_KEY_FILE = "BYTEPS_AUTH_KEY_FILE"
    SERVER_RECOVERY = "BYTEPS_SERVER_RECOVERY"
    # the BytePS/Horovod APIs and bpslaunch (one process per device)
    LOCAL_RANK = "BYTEPS_LOCAL_RANK"
    LOCAL_SIZE = "BYTEPS_LOCAL_SIZE"
    GLOBAL_RANK = "BYTEPS_GLOBAL_RANK"
    FORCE_DISTRIBUTED = "BYTEPS_FORCE_DISTRIBUTED"
    LOCAL_GROUPS = "BYTEPS_LOCAL_GROUPS"  # what DMLC_NUM_WORKER counts: hosts (1) or processes (0)
    VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"


KEY_HASH_FNS = ("balanced", "djb2", "sdbm", "built_in", "mixed")
LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL")


@dataclasses.dataclass(frozen=True)
class Config:
    """Validated settings of one node. Build it with :meth:`from_env`; it is immutable."""

    role: Role = Role.WORKER
    num_workers: int = 1
    num_servers: int = 1
    worker_id: Optional[int] = None
    root_uri: str = "127.0.0.1"
    root_port: int = 0
    node_host: Optional[str] = None
    interface: Optional[str] = None
    port: Optional[int] = None
    van_type: VanType = VanType.AUTO
    local_ipc: bool = False
    #: byteps_rdma's device: a device name (pyverbs), or "soft" (the in-host test provider);
    #: None: the first device
    rdma_device: Optional[str] = None
    #: the device's port (ibverbs counts from 1)
    rdma_port: int = 1
    #: the port's GID index; None: chosen (RoCE v2 with an IPv4 address, see
    #: van/rdma/verbs/pyverbs_provider.py)
    rdma_gid_index: Optional[int] = None
    #: register each buffer that cannot move or vanish unseen once and reuse the registration
    #: (van/rdma/regions.py); False: every message's memory is registered for it alone
    rdma_registration_cache: bool = True
    water_mark: Optional[int] = None
    verbose: int = 0
    heartbeat_interval: float = 3.0
    heartbeat_timeout: float = 30.0
    resend: bool = False
    #: PS_RESEND_TIMEOUT: a fixed retransmission timeout; None: adaptive (van/runtime/resend.py)
    resend_timeout_ms: Optional[int] = None
    drop_msg_percent: int = 0
    start_timeout: float = 60.0
    request_timeout: float = 300.0
    bigarray_bound: int = 1000000
    kvstore_server: ServerKind = ServerKind.MXNET
    partition_bytes: int = 4096000
    #: BYTEPS_PARTITION_BYTES unset: with our servers, rank 0 sizes partitions from its
    #: measured link at start, at most ``partition_bytes`` (engine/sizing.py)
    size_partitions_by_link: bool = False
    partition_spread_bytes: int = 262144
    #: 8, not BytePS's 4: measured on a replayed BERT-base step (4x4, 500 Mbit/s links) 4
    #: partitions of 4 MB in flight left the links idle while each waited its round trip
    #: (12.7 s a step; 8: 11.4 s, 16: 11.3-11.6 s); ResNet-50, VGG-16 and loopback unchanged
    scheduling_credit: int = 8
    #: gradient buckets: consecutive small keys of one dtype fused into one server key of at
    #: most this many bytes and the partition size (engine/buckets.py); 0: every key alone.
    #: Measured (replayed ResNet-50, 4x4, 500 Mbit/s, 768 KB partitions): step 2.15 s either
    #: way, worker CPU per step 1.28x dist_sync's at 4096000 against 1.54x at 262144
    fusion_bytes: int = 4096000
    #: a bucket's round waits at most this long (seconds) for its last member's push
    fusion_timeout: float = 60.0
    server_summing_threads: int = 4
    #: a worker's round pushes may run this far ahead of the slowest worker's before the
    #: server holds their acknowledgements (serving/pacing.py); 0 (default): no pacing
    #: (it helped with fewer servers than workers on 1 Gbit/s links, cost 5% on loopback)
    server_pacing_bytes: int = 0
    #: a held acknowledgement is sent anyway after this long (milliseconds; checked every half)
    server_pacing_hold_ms: int = 200
    #: BYTEPS_ENABLE_ASYNC, BYTEPS_BACKUP_WORKERS (synchronous rounds close when all but that
    #: many workers pushed, docs/usage.md)
    training_mode: TrainingMode = TrainingMode()
    #: dist_byteps workers send a round's pull along with its push (one message instead of
    #: two; README: Each pull rides along with its push)
    pull_with_push: bool = True
    key_hash_fn: str = "balanced"
    log_level: str = "WARNING"
    trace_on: bool = False
    trace_start_step: int = 10
    trace_end_step: int = 20
    trace_dir: str = "./trace"
    gc_freeze: bool = True
    #: dist_byteps workers: the cyclic garbage collector's youngest generation is collected
    #: after this many more objects were made than freed (Python's default 700); 0: left alone
    gc_young_threshold: int = 10000
    #: servers and dist_byteps workers raise glibc's mmap/trim thresholds (memory.py)
    keep_freed_memory: bool = True
    #: dist_byteps workers keep what a restarted server needs to rebuild its rounds
    server_recovery: bool = False
    #: the cluster's shared secret (BYTEPS_AUTH_KEY or the BYTEPS_AUTH_KEY_FILE's content);
    #: None: no authentication. Kept out of repr so it never lands in a log.
    auth_key: Optional[bytes] = dataclasses.field(default=None, repr=False)
    #: this process's place on its worker host (BYTEPS_LOCAL_RANK of BYTEPS_LOCAL_SIZE, set by
    #: bpslaunch and launch.py): what the BytePS and Horovod APIs' local_rank()/local_size() say
    local_rank: int = 0
    local_size: int = 1
    #: BYTEPS_GLOBAL_RANK: the rank a process that is a worker of its own asks for in the BytePS
    #: API's init() (kvstore_byteps/mxnet/__init__.py), unless DMLC_WORKER_ID says one
    global_rank: Optional[int] = None
    #: what DMLC_NUM_WORKER counts. True (BytePS's meaning, bpslaunch's, launch.py
    #: --local-groups): worker hosts; the processes of a host with local_size > 1 form one local
    #: group whose local rank 0 is its worker in the cluster (mxnet_patch/localgroup.py).
    #: False (launch.py's default): processes, each a worker of its own
    local_groups: bool = True

    @property
    def auth(self) -> bool:
        """Whether only nodes holding the shared secret may join and send (BYTEPS_AUTH_KEY)."""
        return self.auth_key is not None

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None,
                 in_local_group: bool = False,
                 only: Optional[Sequence[str]] = None) -> "Config":
        """Build a config from ``environ`` (default: ``os.environ``, with this process's
        :func:`set_default` choices for what it leaves unset); ConfigError on bad values.

        A worker that is a :attr:`local_member` is refused unless ``in_local_group`` (the BytePS
        and Horovod APIs, which join it to its group): anything else, e.g. a script's own
        ``dist_byteps`` store, would join the cluster as one worker too many.

        ``only``: read just these variables, the others keep their defaults (the start-up
        hook's routing, which must not validate variables a plain MXNet process ignores)."""
        env = _EnvReader(*_source(environ, only))
        auth_key = _auth_key(env)
        # with a key the default stays on ZeroMQ, whose CURVE encrypts every message; byteps_tcp
        # only authenticates its connections (docs/failures-and-security.md)
        van_default = (VanType.BYTEPS_RDMA if env.flag(Env.ENABLE_RDMA, False)
                       else VanType.ZMQ if auth_key is not None else VanType.AUTO)
        partition_bytes = env.get(Env.PARTITION_BYTES, _positive_int, None)   # None: not set
        config = cls(
            role=env.get(Env.ROLE, Role.parse, Role.WORKER),
            num_workers=env.get(Env.NUM_WORKER, _positive_int, 1),
            num_servers=env.get(Env.NUM_SERVER, _positive_int, 1),
            worker_id=env.get(Env.WORKER_ID, _nonnegative_int, None),
            root_uri=env.get(Env.ROOT_URI, _nonempty, "127.0.0.1"),
            root_port=env.get(Env.ROOT_PORT, _port, 0),
            node_host=env.get(Env.NODE_HOST, _nonempty, None),
            interface=env.get(Env.INTERFACE, _nonempty, None),
            port=env.get(Env.PORT, _port, None),
            van_type=env.get(Env.VAN_TYPE, _van_type, van_default),
            local_ipc=env.flag(Env.LOCAL, False),
            rdma_device=env.get(Env.RDMA_DEVICE, _nonempty, None),
            rdma_port=env.get(Env.RDMA_PORT, _positive_int, 1),
            rdma_gid_index=env.get(Env.RDMA_GID_INDEX, _nonnegative_int, None),
            rdma_registration_cache=env.flag(Env.RDMA_REGISTRATION_CACHE, True),
            water_mark=env.get(Env.WATER_MARK, _positive_int, None),
            verbose=env.get(Env.VERBOSE, _nonnegative_int, 0),
            # On by default for our nodes (ps-lite's default is off): a dead node must be
            # named in bounded time. 0 turns either off.
            heartbeat_interval=env.get(Env.HEARTBEAT_INTERVAL, _nonnegative_float, 3.0),
            heartbeat_timeout=env.get(Env.HEARTBEAT_TIMEOUT, _nonnegative_float, 30.0),
            resend=env.flag(Env.RESEND, False),
            resend_timeout_ms=env.get(Env.RESEND_TIMEOUT, _positive_int, None),
            drop_msg_percent=env.get(Env.DROP_MSG, _percent, 0),
            start_timeout=env.get(Env.START_TIMEOUT, _positive_float, 60.0),
            request_timeout=env.get(Env.REQUEST_TIMEOUT, _positive_float, 300.0),
            bigarray_bound=env.get(Env.BIGARRAY_BOUND, _positive_int, 1000000),
            kvstore_server=env.get(Env.KVSTORE_SERVER, _server_kind, ServerKind.MXNET),
            partition_bytes=partition_bytes or 4096000,
            size_partitions_by_link=partition_bytes is None,
            partition_spread_bytes=env.get(Env.PARTITION_SPREAD_BYTES, _nonnegative_int,
                                           262144),
            scheduling_credit=env.get(Env.SCHEDULING_CREDIT, _positive_int, 8),
            fusion_bytes=env.get(Env.FUSION_BYTES, _nonnegative_int, 4096000),
            fusion_timeout=env.get(Env.FUSION_TIMEOUT, _positive_float, 60.0),
            server_summing_threads=env.get(Env.SERVER_ENGINE_THREAD, _positive_int,
                                          default_server_summing_threads(usable_cores())),
            server_pacing_bytes=env.get(Env.SERVER_PACING_BYTES, _nonnegative_int, 0),
            server_pacing_hold_ms=env.get(Env.SERVER_PACING_HOLD_MS, _positive_int, 200),
            training_mode=_training_mode(env),
            pull_with_push=env.flag(Env.PULL_WITH_PUSH, True),
            key_hash_fn=env.get(Env.KEY_HASH_FN, _choice(KEY_HASH_FNS), "balanced"),
            log_level=env.get(Env.LOG_LEVEL, _upper_choice(LOG_LEVELS), "WARNING"),
            trace_on=env.flag(Env.TRACE_ON, False),
            trace_start_step=env.get(Env.TRACE_START_STEP, _nonnegative_int, 10),
            trace_end_step=env.get(Env.TRACE_END_STEP, _nonnegative_int, 20),
            trace_dir=env.get(Env.TRACE_DIR, _nonempty, "./trace"),
            gc_freeze=env.flag(Env.GC_FREEZE, True),
            gc_young_threshold=env.get(Env.GC_YOUNG_THRESHOLD, _nonnegative_int, 10000),
            keep_freed_memory=env.flag(Env.KEEP_FREED_MEMORY, True),
            server_recovery=env.flag(Env.SERVER_RECOVERY, False),
            auth_key=auth_key,
            local_rank=env.get(Env.LOCAL_RANK, _nonnegative_int, 0),
            local_size=env.get(Env.LOCAL_SIZE, _positive_int, 1),
            local_groups=env.flag(Env.LOCAL_GROUPS, True),
            global_rank=env.get(Env.GLOBAL_RANK, _nonnegative_int, None),
        )
        _check_local_place(config, in_local_group)
        if config.backup_workers and config.backup_workers >= config.num_workers:
            raise ConfigError("%s=%d needs more workers than that (DMLC_NUM_WORKER=%d)"
                              % (Env.BACKUP_WORKERS, config.backup_workers, config.num_workers))
        if config.trace_on and config.trace_start_step > config.trace_end_step:
            raise ConfigError("%s=%d is after %s=%d: the trace would record no step"
                              % (Env.TRACE_START_STEP, config.trace_start_step,
                                 Env.TRACE_END_STEP, config.trace_end_step))
        return config

    @property
    def enable_async(self) -> bool:
        """Asynchronous training (BYTEPS_ENABLE_ASYNC), as :attr:`training_mode` says."""
        return self.training_mode.asynchronous

    @property
    def backup_workers(self) -> int:
        """BYTEPS_BACKUP_WORKERS (0: none), as :attr:`training_mode` says."""
        return self.training_mode.backup_workers

    @property
    def is_scheduler(self) -> bool:
        return self.role is Role.SCHEDULER

    @property
    def local_member(self) -> bool:
        """A process of a local group other than its local rank 0: no worker of the cluster
        (it reduces through local rank 0 with the BytePS or Horovod API)."""
        return self.local_groups and self.local_size > 1 and self.local_rank > 0


def _check_local_place(config: Config, in_local_group: bool) -> None:
    """A local rank inside its local size; no cluster worker made on a local member."""
    if config.local_rank >= config.local_size:
        raise ConfigError("%s=%d is outside [0, %s=%d)" % (Env.LOCAL_RANK, config.local_rank,
                                                           Env.LOCAL_SIZE, config.local_size))
    if config.role is Role.WORKER and config.local_member and not in_local_group:
        raise ConfigError(
            "%s=%d of a local group (%s=%d, %s on: DMLC_NUM_WORKER counts hosts, as bpslaunch and "
            "launch.py --local-groups set it) is no worker of the cluster: only local rank 0 is, "
            "and the others reduce through it with the BytePS or Horovod API "
            "(kvstore_byteps.mxnet, kvstore_byteps.horovod). A script that creates its own "
            "dist_byteps store needs a worker per process: kvstore-byteps-launch (launch.py) "
            "without --local-groups"
            % (Env.LOCAL_RANK, config.local_rank, Env.LOCAL_SIZE, config.local_size,
               Env.LOCAL_GROUPS))


def _training_mode(env: "_EnvReader") -> TrainingMode:
    """BYTEPS_ENABLE_ASYNC and BYTEPS_BACKUP_WORKERS, which exclude each other."""
    enable_async = env.flag(Env.ENABLE_ASYNC, False)
    backup_workers = env.get(Env.BACKUP_WORKERS, _nonnegative_int, 0)
    if enable_async and backup_workers:
        raise ConfigError("%s and %s exclude each other: backup workers are a way to train "
                          "synchronously" % (Env.ENABLE_ASYNC, Env.BACKUP_WORKERS))
    return TrainingMode.of(enable_async, backup_workers)


#: This process's own defaults (:func:`set_default`): name -> text, read as if the variable
#: were set whenever the environment leaves it unset or empty.
_process_defaults: Dict[str, str] = {}


def set_default(name: str, text: str) -> None:
    """From now on this process's configs read ``name`` as ``text`` where ``os.environ`` leaves
    it unset or empty: what an API chooses for the ``dist_byteps`` store it creates (the store
    reads its own Config). Nothing is written into ``os.environ``, so the processes this one
    starts see the environment it was given. Validated as every value is, when read."""
    _process_defaults[name] = text


def _source(environ: Optional[Mapping[str, str]], only: Optional[Sequence[str]]):
    """``(environ, defaults)`` for an :class:`_EnvReader`: this process's environment with its
    own defaults, or the given mapping alone; just the ``only`` names if given."""
    if environ is None:
        environ, defaults = os.environ, dict(_process_defaults)
    else:
        defaults = {}
    if only is not None:
        environ = {name: environ[name] for name in only if name in environ}
        defaults = {name: defaults[name] for name in only if name in defaults}
    return environ, defaults


class _EnvReader:
    """Reads one variable at a time, turning parse failures into ConfigError."""

    def __init__(self, environ: Mapping[str, str], defaults: Optional[Mapping[str, str]] = None):
        self._environ = environ
        self._defaults = defaults or {}

    def get(self, name: str, parse: Callable[[str], T], default: T) -> T:
        text = self._environ.get(name)
        if text is None or text.strip() == "":
            text = self._defaults.get(name)
        if text is None or text.strip() == "":
            return default
        try:
            return parse(text.strip())
        except (ValueError, TypeError) as exc:
            raise ConfigError("%s=%r is invalid: %s" % (name, text, exc)) from None

    def flag(self, name: str, default: bool) -> bool:
        return self.get(name, _flag, default)


#: Fewer bytes than this are refused: the key is all an attacker has to guess.
MIN_AUTH_KEY_BYTES = 16


def _auth_key(env: "_EnvReader") -> Optional[bytes]:
    """The shared secret from BYTEPS_AUTH_KEY or BYTEPS_AUTH_KEY_FILE (not both)."""
    text = env.get(Env.AUTH_KEY, _nonempty, None)
    path = env.get(Env.AUTH_KEY_FILE, _nonempty, None)
    if text is not None and path is not None:
        raise ConfigError("set %s or %s, not both" % (Env.AUTH_KEY, Env.AUTH_KEY_FILE))
    if text is not None:
        key, source = text.encode("utf-8"), Env.AUTH_KEY
    elif path is not None:
        try:
            with open(path, "rb") as handle:
                key = handle.read().strip()
        except OSError as exc:
            raise ConfigError("%s=%s cannot be read: %s" % (Env.AUTH_KEY_FILE, path,
                                                            exc.strerror or exc)) from None
        source = "%s=%s" % (Env.AUTH_KEY_FILE, path)
    else:
        return None
    if len(key) < MIN_AUTH_KEY_BYTES:
        # the value itself is never quoted: it is a secret
        raise ConfigError("%s holds %d bytes; a cluster key needs at least %d (make one with: "
                          "python -c 'import secrets; print(secrets.token_hex(32))')"
                          % (source, len(key), MIN_AUTH_KEY_BYTES))
    return key


def env_flag(environ: Mapping[str, str], name: str, default: bool) -> bool:
    """The flag ``name`` of ``environ`` read as Config reads every flag (``1``/``true``/``yes``/
    ``on``, ``0``/``false``/``no``/``off``, any case; unset or empty: ``default``), for the
    few readers outside Config (bpslaunch). ConfigError quotes a bad value."""
    return _EnvReader(environ).flag(name, default)


def env_int(environ: Mapping[str, str], name: str, default: Optional[int] = None,
            minimum: int = 0) -> Optional[int]:
    """The integer ``name`` of ``environ`` read as Config reads its integers (``minimum`` 0:
    as DMLC_WORKER_ID, 1: as DMLC_NUM_WORKER; unset or empty: ``default``), for the few
    readers outside Config (bpslaunch). ConfigError quotes a bad value."""
    parse = {0: _nonnegative_int, 1: _positive_int}[minimum]
    return _EnvReader(environ).get(name, parse, default)


def _flag(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected 0/1/true/false")


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError("expected an integer") from None


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask, e.g. a container's cpuset)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_server_summing_threads(cores: int) -> int:
    """BytePS's 4 summing threads, but at most half the cores: the server's receive, request
    and ZeroMQ threads need the rest. Measured on 2 cores shared by 2 workers and 2 servers
    (loopback, ResNet-50's gradients): 1 thread 136 ms per step, 2 threads 138, 4 threads
    140-149; one 100 MB tensor the same with 1, 2 or 4."""
    return min(4, max(1, cores // 2))


def _positive_int(text: str) -> int:
    value = _int(text)
    if value <= 0:
        raise ValueError("expected a positive integer")
    return value


def _nonnegative_int(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise ValueError("expected a non-negative integer")
    return value


def _percent(text: str) -> int:
    value = _int(text)
    if not 0 <= value <= 100:
        raise ValueError("expected a percentage in [0, 100]")
    return value


def _port(text: str) -> int:
    value = _int(text)
    if not 1 <= value <= 65535:
        raise ValueError("expected a TCP port in [1, 65535]")
    return value


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError("expected a number") from None


def _positive_float(text: str) -> float:
    value = _float(text)
    if not value > 0:
        raise ValueError("expected a positive number")
    return value


def _nonnegative_float(text: str) -> float:
    value = _float(text)
    if not value >= 0:
        raise ValueError("expected a non-negative number")
    return value


def _nonempty(text: str) -> str:
    return text


def _van_type(text: str) -> VanType:
    aliases = {"auto": VanType.AUTO, "zmq": VanType.ZMQ, "p3": VanType.P3,
               "byteps_tcp": VanType.BYTEPS_TCP,
               "byteps_rdma": VanType.BYTEPS_RDMA, "rdma": VanType.BYTEPS_RDMA}
    try:
        return aliases[text.lower()]
    except KeyError:
        raise ValueError("expected one of auto, zmq, p3, byteps_tcp, byteps_rdma") from None


def _server_kind(text: str) -> ServerKind:
    try:
        return ServerKind(text.lower())
    except ValueError:
        raise ValueError("expected byteps or mxnet") from None


def _choice(choices):
    def parse(text: str) -> str:
        if text not in choices:
            raise ValueError("expected one of %s" % ", ".join(choices))
        return text
    return parse


def _upper_choice(choices):
    """Like :func:`_choice`, in any case (``info`` reads as ``INFO``)."""
    parse = _choice(choices)
    return lambda text: parse(text.upper())
