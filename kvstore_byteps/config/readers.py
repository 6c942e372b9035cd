"""Config's fields read from the environment, one group of variables at a time (who and where
the node is, its transport, the worker pipeline, the server, training, tracing, the process,
the local place), each group a dict of fields for ``Config(**...)``; and the readers that span
variables: the shared secret, the van's default, the training mode."""
import os
from typing import Optional

from ..errors import ConfigError
from . import parsers
from .environment import EnvReader
from .training import BACKUP_WAIT_PERCENT, TrainingMode
from .variables import Env
from .vocabulary import KEY_HASH_FNS, LOG_LEVELS, Role, ServerKind, VanType


def cluster_fields(env: EnvReader) -> dict:
    """Who this node is and where the cluster meets (the DMLC variables)."""
    return dict(
        role=env.get(Env.ROLE, Role.parse, Role.WORKER),
        num_workers=env.get(Env.NUM_WORKER, parsers.positive_int, 1),
        num_servers=env.get(Env.NUM_SERVER, parsers.positive_int, 1),
        worker_id=env.get(Env.WORKER_ID, parsers.nonnegative_int, None),
        root_uri=env.get(Env.ROOT_URI, parsers.nonempty, "127.0.0.1"),
        root_port=env.get(Env.ROOT_PORT, parsers.port, 0),
        node_host=env.get(Env.NODE_HOST, parsers.nonempty, None),
        interface=env.get(Env.INTERFACE, parsers.nonempty, None),
        port=env.get(Env.PORT, parsers.port, None),
    )


def default_van(env: EnvReader, auth_key: Optional[bytes]) -> VanType:
    """The van DMLC_PS_VAN_TYPE leaves: byteps_rdma with DMLC_ENABLE_RDMA, ZeroMQ with a key,
    else auto."""
    # with a key the default stays on ZeroMQ, whose CURVE encrypts every message; byteps_tcp
    # only authenticates its connections (docs/failures-and-security.md)
    return (VanType.BYTEPS_RDMA if env.flag(Env.ENABLE_RDMA, False)
            else VanType.ZMQ if auth_key is not None else VanType.AUTO)


def transport_fields(env: EnvReader, van_default: VanType) -> dict:
    """The van, RDMA's device, ps-lite's heartbeats and resends, the timeouts."""
    return dict(
        van_type=env.get(Env.VAN_TYPE, parsers.van_type, van_default),
        local_ipc=env.flag(Env.LOCAL, False),
        rdma_device=env.get(Env.RDMA_DEVICE, parsers.nonempty, None),
        rdma_port=env.get(Env.RDMA_PORT, parsers.positive_int, 1),
        rdma_gid_index=env.get(Env.RDMA_GID_INDEX, parsers.nonnegative_int, None),
        rdma_registration_cache=env.flag(Env.RDMA_REGISTRATION_CACHE, True),
        water_mark=env.get(Env.WATER_MARK, parsers.positive_int, None),
        verbose=env.get(Env.VERBOSE, parsers.nonnegative_int, 0),
        # On by default for our nodes (ps-lite's default is off): a dead node must be
        # named in bounded time. 0 turns either off.
        heartbeat_interval=env.get(Env.HEARTBEAT_INTERVAL, parsers.nonnegative_float, 3.0),
        heartbeat_timeout=env.get(Env.HEARTBEAT_TIMEOUT, parsers.nonnegative_float, 30.0),
        resend=env.flag(Env.RESEND, False),
        resend_timeout_ms=env.get(Env.RESEND_TIMEOUT, parsers.positive_int, None),
        drop_msg_percent=env.get(Env.DROP_MSG, parsers.percent, 0),
        start_timeout=env.get(Env.START_TIMEOUT, parsers.positive_float, 60.0),
        request_timeout=env.get(Env.REQUEST_TIMEOUT, parsers.positive_float, 300.0),
    )


def pipeline_fields(env: EnvReader, partition_bytes: Optional[int]) -> dict:
    """The worker pipeline: which servers, partitions, credit, buckets (``partition_bytes``:
    BYTEPS_PARTITION_BYTES, None where unset)."""
    return dict(
        bigarray_bound=env.get(Env.BIGARRAY_BOUND, parsers.positive_int, 1000000),
        kvstore_server=env.get(Env.KVSTORE_SERVER, parsers.server_kind, ServerKind.MXNET),
        partition_bytes=partition_bytes or 4096000,
        size_partitions_by_link=partition_bytes is None,
        partition_spread_bytes=env.get(Env.PARTITION_SPREAD_BYTES, parsers.nonnegative_int,
                                       262144),
        scheduling_credit=env.get(Env.SCHEDULING_CREDIT, parsers.positive_int, 8),
        fusion_bytes=env.get(Env.FUSION_BYTES, parsers.nonnegative_int, 4096000),
        fusion_timeout=env.get(Env.FUSION_TIMEOUT, parsers.positive_float, 60.0),
    )


def server_fields(env: EnvReader) -> dict:
    """Our server's summing threads and pacing."""
    return dict(
        server_summing_threads=env.get(Env.SERVER_ENGINE_THREAD, parsers.positive_int,
                                       default_server_summing_threads(usable_cores())),
        server_pacing_bytes=env.get(Env.SERVER_PACING_BYTES, parsers.nonnegative_int, 0),
        server_pacing_hold_ms=env.get(Env.SERVER_PACING_HOLD_MS, parsers.positive_int, 200),
    )


def training_fields(env: EnvReader) -> dict:
    """The training mode, pulls riding along with pushes, the keys' placement."""
    return dict(
        training_mode=training_mode(env),
        min_workers=env.get(Env.MIN_WORKERS, parsers.nonnegative_int, 0),
        max_workers=env.get(Env.MAX_WORKERS, parsers.nonnegative_int, 0),
        pull_with_push=env.flag(Env.PULL_WITH_PUSH, True),
        key_hash_fn=env.get(Env.KEY_HASH_FN, parsers.choice(KEY_HASH_FNS), "balanced"),
    )


def tracing_fields(env: EnvReader) -> dict:
    """The log level and the timeline trace."""
    return dict(
        log_level=env.get(Env.LOG_LEVEL, parsers.upper_choice(LOG_LEVELS), "WARNING"),
        trace_on=env.flag(Env.TRACE_ON, False),
        trace_start_step=env.get(Env.TRACE_START_STEP, parsers.nonnegative_int, 10),
        trace_end_step=env.get(Env.TRACE_END_STEP, parsers.nonnegative_int, 20),
        trace_dir=env.get(Env.TRACE_DIR, parsers.nonempty, "./trace"),
    )


def process_fields(env: EnvReader) -> dict:
    """The process's garbage collector and freed memory; what a worker keeps for recovery."""
    return dict(
        gc_freeze=env.flag(Env.GC_FREEZE, True),
        gc_young_threshold=env.get(Env.GC_YOUNG_THRESHOLD, parsers.nonnegative_int, 10000),
        keep_freed_memory=env.flag(Env.KEEP_FREED_MEMORY, True),
        server_recovery=env.flag(Env.SERVER_RECOVERY, False),
    )


def place_fields(env: EnvReader) -> dict:
    """The process's place on its worker host, and the rank it asks for (bpslaunch's)."""
    return dict(
        local_rank=env.get(Env.LOCAL_RANK, parsers.nonnegative_int, 0),
        local_size=env.get(Env.LOCAL_SIZE, parsers.positive_int, 1),
        local_groups=env.flag(Env.LOCAL_GROUPS, True),
        global_rank=env.get(Env.GLOBAL_RANK, parsers.nonnegative_int, None),
    )


def training_mode(env: EnvReader) -> TrainingMode:
    """BYTEPS_ENABLE_ASYNC and BYTEPS_BACKUP_WORKERS, which exclude each other."""
    enable_async = env.flag(Env.ENABLE_ASYNC, False)
    backup_workers = env.get(Env.BACKUP_WORKERS, parsers.nonnegative_int, 0)
    backup_wait = env.get(Env.BACKUP_WAIT, parsers.percent, BACKUP_WAIT_PERCENT)
    if enable_async and backup_workers:
        raise ConfigError("%s and %s exclude each other: backup workers are a way to train "
                          "synchronously" % (Env.ENABLE_ASYNC, Env.BACKUP_WORKERS))
    return TrainingMode.of(enable_async, backup_workers, backup_wait)


#: Fewer bytes than this are refused: the key is all an attacker has to guess.
MIN_AUTH_KEY_BYTES = 16


def auth_key(env: EnvReader) -> Optional[bytes]:
    """The shared secret from BYTEPS_AUTH_KEY or BYTEPS_AUTH_KEY_FILE (not both)."""
    text = env.get(Env.AUTH_KEY, parsers.nonempty, None)
    path = env.get(Env.AUTH_KEY_FILE, parsers.nonempty, None)
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
