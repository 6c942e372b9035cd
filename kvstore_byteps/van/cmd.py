"""MXNet's KV ``cmd`` (the request head): Cantor pairing of request type and dtype (spec §5.2).

Shared by the worker (``engine``) and the servers: ``cmd = (m + d)(m + d + 1) / 2 + d`` with
``m`` a :class:`RequestType` and ``d`` an mshadow dtype code. Request type 3 is ours (the
BytePS data path); upstream MXNet never sends it. Pure.
"""
import enum
import math
from typing import Tuple

import numpy as np


class RequestType(enum.IntEnum):
    """First member of the pair: MXNet's ``RequestType``, plus our BytePS marker."""

    DEFAULT = 0       # kDefaultPushPull
    ROW_SPARSE = 1    # kRowSparsePushPull
    COMPRESSED = 2    # kCompressedPushPull (2-bit gradient compression)
    BYTEPS = 3        # ours: the BytePS data path
    # MXNet's spelling of the same values
    DEFAULT_PUSHPULL = 0
    ROW_SPARSE_PUSHPULL = 1
    COMPRESSED_PUSHPULL = 2


class MShadowType(enum.IntEnum):
    """mshadow dtype codes, the second member of the pair."""

    FLOAT32 = 0
    FLOAT64 = 1
    FLOAT16 = 2
    UINT8 = 3
    INT32 = 4
    INT8 = 5
    INT64 = 6
    BOOL = 7
    INT16 = 8
    UINT16 = 9
    UINT32 = 10
    UINT64 = 11
    BFLOAT16 = 12


#: mshadow code by numpy dtype name.
MSHADOW_BY_NAME = {member.name.lower(): member for member in MShadowType}


def cantor_pair(a: int, b: int) -> int:
    """Cantor pairing ``(a+b)(a+b+1)/2 + b`` as MXNet's ``GetCommandType`` computes it."""
    return (a + b) * (a + b + 1) // 2 + b


def cantor_unpair(c: int) -> Tuple[int, int]:
    """Inverse of :func:`cantor_pair`, with an exact integer square root."""
    if c < 0:
        raise ValueError("a Cantor-paired value is non-negative, got %d" % c)
    w = (math.isqrt(8 * c + 1) - 1) // 2
    b = c - w * (w + 1) // 2
    return w - b, b


def mshadow_code(dtype) -> MShadowType:
    """The mshadow code of a numpy dtype (or its name); ValueError if it has none."""
    name = getattr(dtype, "name", None) or getattr(dtype, "__name__", None) or str(dtype)
    try:
        return MSHADOW_BY_NAME[np.dtype(name).name if name != "bfloat16" else name]
    except (KeyError, TypeError):
        raise ValueError("dtype %r has no mshadow code" % (dtype,)) from None
