"""ps-lite's key space (spec §4.1): the servers' key ranges, below the postoffice as in ps-lite
(its ``Range`` and ``Postoffice::GetServerKeyRanges``); the KV layer slices requests by them
(``kv/slicing.py``). Pure."""
import functools
from typing import List, NamedTuple, Tuple

K_MAX_KEY = 2 ** 64 - 1
#: dist_byteps's local key of a partition: ``(user_key << PARTITION_BITS) | index`` (see
#: ``engine/partition.py``); a server recovers the MXNet key from it
PARTITION_BITS = 16


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
