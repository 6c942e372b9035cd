"""Key ranges and key slicing of ps-lite's KV layer (spec §4.1). Pure."""
import functools
from typing import List, NamedTuple, Optional, Tuple

import numpy as np

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


class Slice(NamedTuple):
    """The part of one request that goes to one server."""

    server_rank: int
    keys: np.ndarray
    vals: memoryview
    lens: Optional[np.ndarray]


def as_keys(keys) -> np.ndarray:
    """Keys as a sorted uint64 array; raise ValueError if they are not ascending."""
    array = np.ascontiguousarray(keys, dtype=np.uint64).reshape(-1)
    if array.size > 1 and not np.all(array[1:] > array[:-1]):
        raise ValueError("keys must be unique and sorted ascending")
    return array


def slice_request(keys: np.ndarray, vals, lens: Optional[np.ndarray],
                  ranges: List[KeyRange]) -> List[Slice]:
    """Split keys (sorted), vals and lens by server range; servers with no keys are omitted.

    With ``lens`` the vals are split by the per-key byte lengths; without, evenly per key.
    """
    vals = memoryview(vals).cast("B") if vals is not None else memoryview(b"")
    if len(keys):
        # the usual request: every key on one server (the worker groups them so); no numpy
        first, last = int(keys[0]), int(keys[-1])
        for rank, key_range in enumerate(ranges):
            if key_range.begin <= first and last < key_range.end:
                _check_split(keys, vals, lens)
                return [Slice(rank, keys, vals, lens)]
    bounds = np.searchsorted(keys, np.array([r.begin for r in ranges] + [ranges[-1].end],
                                            dtype=np.uint64))
    _check_split(keys, vals, lens)
    if lens is not None:
        offsets = np.concatenate(([0], np.cumsum(lens, dtype=np.int64)))
    per_key = vals.nbytes // len(keys) if len(keys) else 0
    slices = []
    for rank in range(len(ranges)):
        lo, hi = int(bounds[rank]), int(bounds[rank + 1])
        if lo == hi:
            continue
        if lens is not None:
            part = vals[int(offsets[lo]):int(offsets[hi])]
        else:
            part = vals[lo * per_key:hi * per_key]
        slices.append(Slice(rank, keys[lo:hi], part, None if lens is None else lens[lo:hi]))
    return slices


def _check_split(keys: np.ndarray, vals: memoryview, lens: Optional[np.ndarray]) -> None:
    """ValueError unless ``vals`` splits over ``keys`` (by ``lens``, or evenly)."""
    if lens is not None:
        if len(lens) != len(keys):
            raise ValueError("lens has %d entries for %d keys" % (len(lens), len(keys)))
        total = int(lens.sum(dtype=np.int64))
        if total != vals.nbytes:
            raise ValueError("lens sum to %d bytes but vals has %d" % (total, vals.nbytes))
    elif len(keys) and vals.nbytes % len(keys):
        raise ValueError("%d value bytes cannot be split evenly over %d keys"
                         % (vals.nbytes, len(keys)))


def key_range_of(key: int, ranges: List[KeyRange]) -> Tuple[int, KeyRange]:
    """The server rank and range holding ``key``."""
    for rank, key_range in enumerate(ranges):
        if key_range.begin <= key < key_range.end:
            return rank, key_range
    raise ValueError("key %d is outside every server's range" % key)
