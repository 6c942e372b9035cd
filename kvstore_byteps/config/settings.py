"""``Config``: the validated settings of one node, frozen, built with ``Config.from_env()``
(its fields read a group at a time by :mod:`.readers`), and the checks that span fields."""
import dataclasses
from typing import Mapping, Optional, Sequence

from ..errors import ConfigError
from . import environment, parsers, readers
from .training import TrainingMode
from .variables import Env
from .vocabulary import Role, ServerKind, VanType


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
    #: a row_sparse key's range bytes on our servers (engine/sparse.py; 0: a range a server):
    #: not read from the environment, rank 0's choice agreed at start (engine/sizing.py)
    row_range_bytes: int = 0
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
    #: BYTEPS_MIN_WORKERS: elastic workers (docs/usage.md): a worker lost while at least this
    #: many are left leaves the job, which goes on without it; 0 (default): a lost worker
    #: ends the job
    min_workers: int = 0
    #: BYTEPS_MAX_WORKERS: an elastic job grows to this many workers (workers started later
    #: take the seats beyond DMLC_NUM_WORKER); 0 (default): DMLC_NUM_WORKER
    max_workers: int = 0
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
        env = environment.reader(environ, only)
        auth_key = readers.auth_key(env)
        van_default = readers.default_van(env, auth_key)
        partition_bytes = env.get(Env.PARTITION_BYTES, parsers.positive_int, None)  # None: unset
        # read in this order, as ever: the first bad value is the one reported
        config = cls(**readers.cluster_fields(env), **readers.transport_fields(env, van_default),
                     **readers.pipeline_fields(env, partition_bytes),
                     **readers.server_fields(env), **readers.training_fields(env),
                     **readers.tracing_fields(env), **readers.process_fields(env),
                     auth_key=auth_key, **readers.place_fields(env))
        _check_local_place(config, in_local_group)
        if config.backup_workers and config.backup_workers >= config.num_workers:
            raise ConfigError("%s=%d needs more workers than that (DMLC_NUM_WORKER=%d)"
                              % (Env.BACKUP_WORKERS, config.backup_workers, config.num_workers))
        _check_elastic(config)
        if config.trace_on and config.trace_start_step > config.trace_end_step:
            raise ConfigError("%s=%d is after %s=%d: the trace would record no step"
                              % (Env.TRACE_START_STEP, config.trace_start_step,
                                 Env.TRACE_END_STEP, config.trace_end_step))
        return config

    @property
    def elastic(self) -> bool:
        """Whether the job goes on without a lost worker (BYTEPS_MIN_WORKERS)."""
        return self.min_workers > 0

    @property
    def worker_seats(self) -> int:
        """The most workers the job has at once: DMLC_NUM_WORKER, or BYTEPS_MAX_WORKERS (an
        elastic job that grows). The seats beyond DMLC_NUM_WORKER start vacant."""
        return max(self.num_workers, self.max_workers)

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


def _check_elastic(config: Config) -> None:
    """BYTEPS_MIN_WORKERS within the job's workers, and only where a round can do without a
    worker: synchronous training on our servers, heartbeats on (how a loss is noticed)."""
    if not config.min_workers:
        if config.max_workers:
            raise ConfigError("%s=%d grows an elastic job: set %s too (elastic workers)"
                              % (Env.MAX_WORKERS, config.max_workers, Env.MIN_WORKERS))
        return
    if config.max_workers and config.max_workers < config.num_workers:
        raise ConfigError("%s=%d is fewer than the job's workers (DMLC_NUM_WORKER=%d)"
                          % (Env.MAX_WORKERS, config.max_workers, config.num_workers))
    if config.min_workers > config.num_workers:
        raise ConfigError("%s=%d is more than the job's workers (DMLC_NUM_WORKER=%d)"
                          % (Env.MIN_WORKERS, config.min_workers, config.num_workers))
    others = [name for name, on in ((Env.ENABLE_ASYNC, config.enable_async),
                                    (Env.BACKUP_WORKERS, config.backup_workers),
                                    (Env.SERVER_RECOVERY, config.server_recovery),
                                    (Env.SERVER_PACING_BYTES, config.server_pacing_bytes),
                                    (Env.RESEND, config.resend)) if on]
    if others:
        raise ConfigError("%s (elastic workers) works with synchronous training only, without "
                          "%s: unset one of them" % (Env.MIN_WORKERS, " and ".join(others)))
    if config.local_groups and config.local_size > 1:
        raise ConfigError("%s (elastic workers) does not take local groups yet (%s=%d: a "
                          "host's processes reduce through one worker): run one process a "
                          "worker (launch.py without --local-groups)"
                          % (Env.MIN_WORKERS, Env.LOCAL_SIZE, config.local_size))
    if config.heartbeat_interval <= 0 or config.heartbeat_timeout <= 0:
        raise ConfigError("%s needs heartbeats to notice a lost worker: %s and %s must be "
                          "positive" % (Env.MIN_WORKERS, Env.HEARTBEAT_INTERVAL,
                                        Env.HEARTBEAT_TIMEOUT))


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

