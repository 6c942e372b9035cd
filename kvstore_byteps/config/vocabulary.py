"""The words a setting may take: roles, transports, server kinds, training kinds, and the
allowed spellings of the key hash and the log level. Pure enums and tuples, nothing read."""
import enum


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



KEY_HASH_FNS = ("balanced", "djb2", "sdbm", "built_in", "mixed")
LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL")
