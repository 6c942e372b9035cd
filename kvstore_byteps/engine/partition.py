"""Partitioning of tensors into ps keys and their placement on servers. Pure.

A tensor registered under an int ``user_key`` (MXNet's int key, or the index a str key was mapped
to) is cut into partitions of at most ``BYTEPS_PARTITION_BYTES`` bytes, aligned down to the dtype's
item size so no element straddles two partitions. Each partition is placed on a server either by
bytes (``BYTEPS_KEY_HASH_FN=balanced``, the default: the server holding the fewest bytes so far,
in the order tensors are first initialised) or, as BytePS does, by hashing its *local key*
(:mod:`~kvstore_byteps.engine.keyhash`). Hashes ignore sizes: over ResNet-50's tensors and 4
servers the busiest server gets 1.26x its fair share with djb2 (1.10x sdbm, 1.38x built_in)
and 1.04x balanced, and the busiest server's link bounds the step. Balanced placement is the
same on every worker because every worker initialises its keys in the same order (gluon's
Trainer and Module do); a worker that does not is told at initialisation, when it reads back a
partition from a server that does not hold it.

Key encoding (collision-free for ``0 <= user_key < 2**31`` and up to 65534 partitions a key; the
last index, 65535, is a gradient bucket's server key, :mod:`.fusion`, and 65534 a row_sparse
key's master key, :mod:`.sparse`)::

    local_key = (user_key << 16) | partition_index            # < 2**47
    ps_key    = range_begin(server) + local_key
    range_begin(i) = (kMaxKey // num_servers) * i,  kMaxKey = 2**64 - 1   (ps-lite's ranges)

``local_key`` fits every server's range as long as ``kMaxKey // num_servers > 2**47``, i.e. for
fewer than 131072 servers, so each ps key lies in its server's range and a server recovers
``(user_key, partition_index)`` from ``ps_key - range_begin(my_rank)``. Two different
``(user_key, index)`` pairs give different local keys, and keys of different servers lie in
disjoint ranges, so no two partitions of any tensors share a ps key.
"""
import dataclasses
from typing import Dict, List, Optional, Tuple

from ..config import Config
from ..errors import KVStoreBytePSError
from ..van.wire.keys import (K_MAX_KEY, PARTITION_BITS, ROW_SPARSE_INDEX, server_key_range,
                             server_of_key)
from .keyhash import KeyHash, server_for_key

__all__ = ["K_MAX_KEY", "PARTITION_BITS", "MAX_PARTITIONS", "MAX_USER_KEY", "ROW_SPARSE_INDEX",
           "KeyLayoutError",
           "Partition", "PartitionPlan", "Partitioner", "encode_ps_key",
           "decode_ps_key", "partition_bound", "plan_partitions"]

MAX_PARTITIONS = 1 << PARTITION_BITS
#: Largest user key the encoding admits (MXNet keys are C ``int``).
MAX_USER_KEY = 2 ** 31 - 1
_LOCAL_KEY_LIMIT = (MAX_USER_KEY + 1) << PARTITION_BITS


class KeyLayoutError(KVStoreBytePSError, ValueError):
    """A key or tensor cannot be laid out (key out of range, too many partitions, size changed)."""


def _check_server_count(num_servers: int) -> None:
    if num_servers < 1 or K_MAX_KEY // num_servers < _LOCAL_KEY_LIMIT:
        raise KeyLayoutError("%d servers: the key encoding needs 1 <= servers < 131072"
                             % num_servers)


def encode_ps_key(user_key: int, index: int, server: int, num_servers: int) -> int:
    """The ps key of partition ``index`` of ``user_key`` placed on ``server``."""
    _check_server_count(num_servers)
    return server_key_range(server, num_servers)[0] + _local_key(user_key, index)


def decode_ps_key(ps_key: int, num_servers: int) -> Tuple[int, int, int]:
    """Inverse of :func:`encode_ps_key`: ``(server, user_key, index)``."""
    _check_server_count(num_servers)
    server = server_of_key(ps_key, num_servers)
    local = ps_key - server_key_range(server, num_servers)[0]
    if not 0 <= local < _LOCAL_KEY_LIMIT:
        raise KeyLayoutError("ps key %d is not a kvstore-byteps partition key" % ps_key)
    return server, local >> PARTITION_BITS, local & (MAX_PARTITIONS - 1)


def _local_key(user_key: int, index: int) -> int:
    if not 0 <= user_key <= MAX_USER_KEY:
        raise KeyLayoutError("key %d is outside [0, 2**31)" % user_key)
    if not 0 <= index < MAX_PARTITIONS:
        raise KeyLayoutError("partition index %d of key %d is outside [0, %d)"
                             % (index, user_key, MAX_PARTITIONS))
    return (user_key << PARTITION_BITS) | index


def partition_bound(partition_bytes: int, itemsize: int) -> int:
    """``partition_bytes`` aligned down to ``itemsize`` (at least one item)."""
    if partition_bytes < 1 or itemsize < 1:
        raise ValueError("partition_bytes and itemsize must be positive, got %d and %d"
                         % (partition_bytes, itemsize))
    return max(partition_bytes // itemsize, 1) * itemsize


@dataclasses.dataclass(frozen=True)
class Partition:
    """One slice ``[offset, offset + nbytes)`` of a tensor's bytes and where it lives."""

    user_key: int
    index: int
    offset: int
    nbytes: int
    server: int
    ps_key: int

    @property
    def end(self) -> int:
        """Byte offset one past the partition."""
        return self.offset + self.nbytes


@dataclasses.dataclass(frozen=True)
class PartitionPlan:
    """How one tensor is cut: its partitions in byte order."""

    user_key: int
    nbytes: int
    itemsize: int
    partitions: Tuple[Partition, ...]

    def __len__(self) -> int:
        return len(self.partitions)

    def by_server(self) -> Dict[int, List[Partition]]:
        """Partitions grouped by server rank, each group in byte order."""
        groups: Dict[int, List[Partition]] = {}
        for part in self.partitions:
            groups.setdefault(part.server, []).append(part)
        return groups


def plan_partitions(user_key: int, nbytes: int, itemsize: int, num_servers: int, *,
                    partition_bytes: int = 4096000, key_hash: KeyHash = KeyHash.DJB2,
                    num_workers: int = 1,
                    server_bytes: Optional[List[int]] = None,
                    spread_bytes: int = 0) -> PartitionPlan:
    """Cut ``nbytes`` (a multiple of ``itemsize``) into partitions and place them.

    With ``KeyHash.BALANCED`` each partition goes to the server with the fewest bytes in
    ``server_bytes`` (ties: the lowest rank) among those not yet holding a partition of this
    tensor, and ``server_bytes`` is updated in place: pass the same list for every tensor, in
    initialisation order. Also with ``BALANCED``, a tensor of at least ``num_servers x
    spread_bytes`` bytes (``spread_bytes`` > 0) that would get fewer partitions than there are
    servers is cut into one equal part per server, as MXNet spreads big arrays: every worker's
    push of it then uses every server's link at once instead of queueing at one or two (on
    emulated 1 Gbit/s links, 4x4 ResNet-50: about 4% faster, 1.22 against 1.26 s over 7 runs
    each; on loopback 2x2 about 7% slower, from the extra messages). A zero-byte tensor gets
    one empty partition, so it still takes part in every round.
    """
    _check_server_count(num_servers)
    if nbytes < 0 or nbytes % itemsize:
        raise KeyLayoutError("key %d: %d bytes is not a whole number of %d-byte items"
                             % (user_key, nbytes, itemsize))
    bound = partition_bound(partition_bytes, itemsize)
    count = max(-(-nbytes // bound), 1)
    if count > ROW_SPARSE_INDEX:    # the last two: a bucket's (fusion.py), row_sparse (sparse.py)
        raise KeyLayoutError("key %d: %d bytes need %d partitions of %d bytes; at most %d are "
                             "supported (raise BYTEPS_PARTITION_BYTES)"
                             % (user_key, nbytes, count, bound, ROW_SPARSE_INDEX))
    if key_hash is KeyHash.BALANCED:
        if server_bytes is None:
            server_bytes = [0] * num_servers
        if len(server_bytes) != num_servers:
            raise ValueError("server_bytes has %d entries for %d servers"
                             % (len(server_bytes), num_servers))
        if spread_bytes and count < num_servers and nbytes >= spread_bytes * num_servers:
            count = num_servers
            bound = -(-(nbytes // itemsize) // count) * itemsize   # the last part may be smaller
            count = -(-nbytes // bound)                              # and none is empty
    parts, holding = [], set()
    for index in range(count):
        size = max(min(bound, nbytes - index * bound), 0)
        local = _local_key(user_key, index)
        if key_hash is KeyHash.BALANCED:
            candidates = [s for s in range(num_servers) if s not in holding] or range(num_servers)
            server = min(candidates, key=server_bytes.__getitem__)
            holding.add(server)
            server_bytes[server] += size
        else:
            server = server_for_key(local, num_servers, key_hash, num_workers)
        ps_key = server_key_range(server, num_servers)[0] + local
        parts.append(Partition(user_key, index, index * bound, size, server, ps_key))
    return PartitionPlan(user_key, nbytes, itemsize, tuple(parts))


class Partitioner:
    """Plans tensors with one node's settings and remembers each key's plan.

    Not thread-safe: call it from one thread (the KVStore's API thread).
    """

    def __init__(self, config: Config, num_servers: int = 0, num_workers: int = 0):
        """Use ``config``'s partition size and hash; server/worker counts default to config's."""
        self._num_servers = num_servers or config.num_servers
        self._num_workers = num_workers or config.num_workers
        self._partition_bytes = config.partition_bytes
        self._spread_bytes = config.partition_spread_bytes
        self._key_hash = KeyHash.parse(config.key_hash_fn)
        self._plans: Dict[int, PartitionPlan] = {}
        self._server_bytes = [0] * self._num_servers   # balanced placement's running totals

    def plan(self, user_key: int, nbytes: int, itemsize: int) -> PartitionPlan:
        """The plan of ``user_key``; raise KeyLayoutError if its size or dtype width changed."""
        known = self._plans.get(user_key)
        if known is None:
            known = plan_partitions(user_key, nbytes, itemsize, self._num_servers,
                                    partition_bytes=self._partition_bytes,
                                    key_hash=self._key_hash, num_workers=self._num_workers,
                                    server_bytes=self._server_bytes,
                                    spread_bytes=self._spread_bytes)
            self._plans[user_key] = known
        elif (known.nbytes, known.itemsize) != (nbytes, itemsize):
            raise KeyLayoutError("key %d was planned with %d bytes of %d-byte items, now %d "
                                 "bytes of %d-byte items" % (user_key, known.nbytes,
                                                             known.itemsize, nbytes, itemsize))
        return known
