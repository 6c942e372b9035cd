"""Where a worker's keys go: one layout per key, in the dialect of the servers it talks to.

A worker talks to one kind of server, found out at start by a probe (:class:`ServerKind`), and
the two kinds differ in how a key is laid out, which cmds carry its rounds, whether pushes get
a byte credit and whether small partitions share a request. :class:`ServerDialect` holds those
differences (:class:`BytePSDialect`, :class:`MXNetDialect`); :class:`Layouts` is the one cache
of each key's :class:`KeyLayout`, whose partitions are the ones the dialect planned (a
:class:`~.partition.Partition` is the wire slice of a key for either kind).
"""
import dataclasses
import threading
from typing import Dict, List, Optional, Tuple

import numpy as np

from ..config import Config, ServerKind
from ..errors import KVStoreBytePSError
from ..mxproto import PROBE_ANSWER, RequestType, encode_cmd
from ..van.wire.keys import server_key_range, server_of_key
from .partition import ROW_SPARSE_INDEX, KeyLayoutError, Partition, Partitioner, encode_ps_key
from .sparse import RowRange, chunked_ranges, mxnet_ranges
from .upstream import dtype_code, encode_compressed_key, encode_default_key

__all__ = ["KeyLayout", "Layouts", "ServerDialect", "BytePSDialect", "MXNetDialect",
           "dialect_for", "group_small", "SMALL_PARTITION_BYTES"]

#: Partitions up to this size are sent together, one request per server (BytePS servers).
SMALL_PARTITION_BYTES = 65536


@dataclasses.dataclass
class KeyLayout:
    """A key's shape and dtype, its partitions on the wire and the cmds of its traffic."""

    key: int
    shape: tuple
    dtype: np.dtype
    partitions: Tuple[Partition, ...]
    round_cmd: int      # cmd of the per-round traffic
    init_cmd: int       # cmd of the initialising push and of plain pulls
    name: str = ""      # "key K (shape dtype)", for messages

    def __post_init__(self) -> None:
        self.name = "key %d (%s %s)" % (self.key, self.shape, self.dtype)


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
    return [g if len(g) == 1 else sorted(g, key=lambda item: item.partition.ps_key)
            for g in groups]


class ServerDialect:
    """What differs between the kinds of servers a worker may talk to."""

    kind: ServerKind
    #: how rank 0 names the servers at start-up: one server, and what its kind means here
    noun: str
    detail: str
    #: why a restarted server of this kind cannot be recovered by its workers (None: it can)
    unrecoverable: Optional[str] = None
    #: why these servers lack kvstore-byteps' extensions: pulls riding along with pushes,
    #: gradient compression, keys declared in any order (None: they have them)
    extensions_missing: Optional[str] = None

    def __init__(self, config: Config, num_servers: int):
        self.config, self.num_servers = config, num_servers

    def partitions(self, key: int, nbytes: int, itemsize: int) -> Tuple[Partition, ...]:
        """``key``'s slices on the wire and the servers holding them."""
        raise NotImplementedError

    def round_cmd(self, code) -> int:
        """The cmd of a round's push and pull of dtype ``code``."""
        raise NotImplementedError

    def credit(self) -> Optional[int]:
        """Bytes of pushes in flight (None: unlimited)."""
        return None

    def requests(self, items) -> List[list]:
        """Items grouped into requests."""
        return [[item] for item in items]

    def misplaced(self, layout: KeyLayout) -> Optional[str]:
        """Why the servers may not hold ``layout``'s partitions where this worker put them."""
        return None

    def row_ranges(self, key: int, total_rows: int, unit_len: int,
                   itemsize: int) -> List[RowRange]:
        """Where row_sparse ``key``'s rows live: its row ranges and their masters
        (:mod:`.sparse`)."""
        raise NotImplementedError


class BytePSDialect(ServerDialect):
    """Our servers: ``BYTEPS_PARTITION_BYTES`` partitions placed by ``BYTEPS_KEY_HASH_FN``;
    a round is a push (cmd = cantor(3, dtype), acknowledged at once) and a pull answered with
    the round's sum; small partitions of one server share a request."""

    kind = ServerKind.BYTEPS
    noun, detail = "BytePS server", "the BytePS data path"

    def __init__(self, config: Config, num_servers: int):
        super().__init__(config, num_servers)
        self._partitioner = Partitioner(config, num_servers=num_servers)

    def partitions(self, key, nbytes, itemsize):
        return self._partitioner.plan(key, nbytes, itemsize).partitions

    def round_cmd(self, code) -> int:
        return encode_cmd(RequestType.BYTEPS, code)

    def credit(self) -> Optional[int]:
        """The credit covers only the push, which our server acknowledges at once: were a stage
        that waits for the other workers inside it (a pull, or an upstream push, acked only when
        the round is merged), two workers that ordered partitions differently could each hold
        the credit the other needs."""
        return self.config.scheduling_credit * self.config.partition_bytes

    def requests(self, items) -> List[list]:
        return group_small(items, _server_and_cmd, SMALL_PARTITION_BYTES,
                           self.config.partition_bytes)

    def row_ranges(self, key, total_rows, unit_len, itemsize):
        """About ``config.row_range_bytes`` a range (agreed at start), interleaved over the
        servers; the ``c``-th range on a server under ``(key << 16) | (ROW_SPARSE_INDEX - c)``,
        apart from every other key's partitions."""
        return chunked_ranges(key, total_rows, unit_len * itemsize, self.num_servers,
                              self.config.row_range_bytes,
                              lambda server, c: encode_ps_key(key, ROW_SPARSE_INDEX - c, server,
                                                              self.num_servers))

    def misplaced(self, layout: KeyLayout) -> Optional[str]:
        if self.config.key_hash_fn != "balanced":
            return None
        return ("The servers do not hold this worker's partitions of %s where it placed them: "
                "with BYTEPS_KEY_HASH_FN=balanced (the default) every worker must initialise "
                "its keys in the same order, as gluon's Trainer and Module do; or choose a hash "
                "placement (djb2)" % layout.name)


class MXNetDialect(ServerDialect):
    """MXNet's own servers: keys laid out as MXNet's worker does (``EncodeDefaultKey``, cmd =
    cantor(0, dtype)), one key per request, no credit (priorities still order the queue, as in
    MXNet's worker); they keep weights and optimizer state themselves."""

    kind = ServerKind.MXNET
    noun, detail = "MXNet's own server", "MXNet's key layout, no BytePS data path"
    unrecoverable = ("this worker talks to MXNet's own servers, which kept the weights and the "
                    "optimizer state")
    extensions_missing = ("these are MXNet's own servers (start ours: MXNET_KVSTORE_SERVER=byteps "
                          "or python -m kvstore_byteps.server)")

    #: MXNet's 2-bit compression is set (:meth:`compress_twobit`): float32 keys take its layout
    twobit = False

    def compress_twobit(self) -> None:
        """Lay out the keys declared from now on as MXNet's worker does under 2-bit
        compression (``EncodeCompressedKey``: big arrays split by packed words)."""
        self.twobit = True

    def partitions(self, key, nbytes, itemsize):
        if self.twobit and itemsize == 4:
            offset, found = 0, []
            for index, (server, values, _) in enumerate(encode_compressed_key(
                    key, nbytes // 4, self.num_servers, self.config.bigarray_bound)):
                found.append(Partition(key, index, offset, values * 4, server,
                                       server_key_range(server, self.num_servers).begin + key))
                offset += values * 4
            return tuple(found)
        pskv = encode_default_key(key, nbytes // itemsize, itemsize, self.num_servers,
                                  self.config.bigarray_bound)
        offsets = np.concatenate(([0], np.cumsum(pskv.lens)))[:-1]
        return tuple(Partition(key, index, int(offset), int(n),
                               server_of_key(k, self.num_servers), int(k))
                     for index, (k, offset, n) in enumerate(zip(pskv.keys, offsets, pskv.lens)))

    def round_cmd(self, code) -> int:
        return encode_cmd(RequestType.DEFAULT, code)

    def row_ranges(self, key, total_rows, unit_len, itemsize):
        """MXNet's own: one range on one server, or one a server for big keys; master
        ``begin + key``."""
        return mxnet_ranges(key, total_rows, unit_len,
                            [server_key_range(i, self.num_servers).begin + key
                             for i in range(self.num_servers)], self.config.bigarray_bound)


def server_kind(answers) -> ServerKind:
    """Which servers answered the probe: ours answer PROBE_ANSWER, MXNet's an empty body."""
    answers = set(map(bytes, answers))
    if answers == {PROBE_ANSWER}:
        return ServerKind.BYTEPS
    if answers == {b""}:
        return ServerKind.MXNET
    raise KVStoreBytePSError("servers of mixed kinds answered the probe (%s); use either only "
                             "BytePS servers or only MXNet servers" % sorted(answers))


def dialect_for(kind: ServerKind, config: Config, num_servers: int) -> ServerDialect:
    """The dialect of servers of ``kind``."""
    return (BytePSDialect if kind is ServerKind.BYTEPS else MXNetDialect)(config, num_servers)


def _server_and_cmd(item) -> tuple:
    return (item.partition.server, item.task.context.layout.round_cmd)


class Layouts:
    """Each key's layout, made on first use. Thread-safe."""

    def __init__(self, dialect: ServerDialect):
        self.dialect = dialect
        self._known: Dict[int, KeyLayout] = {}
        self._lock = threading.Lock()

    def get(self, key: int, shape, dtype) -> KeyLayout:
        """The layout of ``key``; KeyLayoutError naming the key if its shape or dtype changed."""
        known = self._known.get(key)    # every pushpull asks: a known key needs no lock
        if known is not None and known.shape == tuple(shape) and known.dtype == dtype:
            return known
        shape, dtype = tuple(int(d) for d in shape), np.dtype(dtype)
        with self._lock:
            known = self._known.get(key)
            if known is None:
                known = self._known[key] = self._new(key, shape, dtype)
        if (known.shape, known.dtype) != (shape, dtype):
            raise KeyLayoutError("%s used with shape %s and dtype %s" % (known.name,
                                                                        shape, dtype))
        return known

    def known(self, key: int) -> KeyLayout:
        """The layout ``key`` already has (KeyError if none)."""
        return self._known[key]

    def __len__(self) -> int:
        """How many keys have a layout."""
        return len(self._known)

    def _new(self, key: int, shape: tuple, dtype: np.dtype) -> KeyLayout:
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        code = dtype_code(dtype)
        return KeyLayout(key, shape, dtype,
                         self.dialect.partitions(key, nbytes, dtype.itemsize),
                         self.dialect.round_cmd(code), encode_cmd(RequestType.DEFAULT, code))
