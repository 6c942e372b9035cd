"""ps-lite's key space (spec §4.1): the servers' key ranges, below the postoffice as in ps-lite
(its ``Range`` and ``Postoffice::GetServerKeyRanges``); the KV layer slices requests by them
(``kv/slicing.py``). Pure."""
import functools
from typing import List, NamedTuple, Tuple

K_MAX_KEY = 2 ** 64 - 1
#: dist_byteps's local key of a partition: ``(user_key << PARTITION_BITS) | index`` (see
#: ``engine/partition.py``); a server recovers the MXNet key from it
PARTITION_BITS = 16
#: the partition index of a row_sparse key's first row range on a server of ours; its ``c``-th
#: range on that server takes ``ROW_SPARSE_INDEX - c`` (``engine/sparse.py``)
ROW_SPARSE_INDEX = (1 << PARTITION_BITS) - 2
#: row ranges of one row_sparse key on one server of ours, at most
ROW_RANGES_PER_SERVER = 8


def row_sparse_key(local: int):
    """The MXNet key of a row_sparse range's master (local key ``(key << 16) | index``), None
    where ``local`` is no such master. (An MXNet worker's own key whose low 16 bits fall in
    that range, one past 65,526 keys, reads as one too: harmless where it is used, the
    optimizer's multipliers of keys that have none of their own.)"""
    index = local & ((1 << PARTITION_BITS) - 1)
    if ROW_SPARSE_INDEX - ROW_RANGES_PER_SERVER < index <= ROW_SPARSE_INDEX:
        return local >> PARTITION_BITS
    return None


class KeyRange(NamedTuple):
    """Half-open ``[begin, end)`` range of ps keys owned by one server."""

    begin: int
    end: int


def server_key_range(rank: int, num_servers: int) -> KeyRange:
    """Server ``rank`` owns ``[kMaxKey // S * rank, kMaxKey // S * (rank + 1))`` (ps-lite)."""
    if not 0 <= rank < num_servers:
        raise ValueError("server rank %d is not in [0, %d)" % (rank, num_servers))
    step = K_MAX_KEY // num_servers
    return KeyRange(step * rank, step * (rank + 1))


@functools.lru_cache(maxsize=None)
def server_key_ranges(num_servers: int) -> Tuple[KeyRange, ...]:
    """Every server's :func:`server_key_range`, by rank (asked for on every request: cached)."""
    return tuple(server_key_range(rank, num_servers) for rank in range(num_servers))


def server_of_key(ps_key: int, num_servers: int) -> int:
    """The rank of the server whose range holds ``ps_key`` (the last one holds the keys past
    ``S * (kMaxKey // S)``, which no range covers)."""
    return min(ps_key // (K_MAX_KEY // num_servers), num_servers - 1)


def key_range_of(key: int, ranges: List[KeyRange]) -> Tuple[int, KeyRange]:
    """The server rank and range holding ``key``."""
    for rank, key_range in enumerate(ranges):
        if key_range.begin <= key < key_range.end:
            return rank, key_range
    raise ValueError("key %d is outside every server's range" % key)
