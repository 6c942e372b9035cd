"""Key slicing of ps-lite's KV layer (spec §4.1): a request split by the servers' key ranges
(``wire/keys.py``). Pure."""
from typing import List, NamedTuple, Optional

import numpy as np

from ..wire.keys import KeyRange
from ..wire.message import Gather


class _Sized:
    """The size of a Gather, all that checking a split needs."""

    __slots__ = ("nbytes",)

    def __init__(self, nbytes: int):
        self.nbytes = nbytes


class Slice(NamedTuple):
    """The part of one request that goes to one server."""

    server_rank: int
    keys: np.ndarray
    vals: memoryview
    lens: Optional[np.ndarray]


def as_keys(keys) -> np.ndarray:
    """Keys as a sorted uint64 array; raise ValueError if they are not ascending (a key may
    repeat, as in ps-lite: a row_sparse request's first row shares its master's key)."""
    array = np.ascontiguousarray(keys, dtype=np.uint64).reshape(-1)
    if array.size > 1 and not np.all(array[1:] >= array[:-1]):
        raise ValueError("keys must be sorted ascending")
    return array


def slice_request(keys: np.ndarray, vals, lens: Optional[np.ndarray],
                  ranges: List[KeyRange]) -> List[Slice]:
    """Split keys (sorted), vals and lens by server range; servers with no keys are omitted.

    With ``lens`` the vals are split by the per-key byte lengths; without, evenly per key.
    """
    if isinstance(vals, Gather):        # kept in pieces if it goes to one server
        whole = vals
        vals = _Sized(vals.nbytes)
    else:
        whole = None
        vals = memoryview(vals).cast("B") if vals is not None else memoryview(b"")
    if len(keys):
        # the usual request: every key on one server (the worker groups them so); no numpy
        first, last = int(keys[0]), int(keys[-1])
        for rank, key_range in enumerate(ranges):
            if key_range.begin <= first and last < key_range.end:
                _check_split(keys, vals, lens)
                return [Slice(rank, keys, vals if whole is None else whole, lens)]
    if whole is not None:
        vals = memoryview(whole.join())
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
        # one key (most requests): no numpy call, which costs more than the check
        total = int(lens[0]) if len(lens) == 1 else int(lens.sum(dtype=np.int64))
        if total != vals.nbytes:
            raise ValueError("lens sum to %d bytes but vals has %d" % (total, vals.nbytes))
    elif len(keys) and vals.nbytes % len(keys):
        raise ValueError("%d value bytes cannot be split evenly over %d keys"
                         % (vals.nbytes, len(keys)))
