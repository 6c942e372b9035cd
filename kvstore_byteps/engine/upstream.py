"""Upstream MXNet 1.9.1's key layout (docs/pslite-wire.md §5.1). Pure.

Against an unmodified upstream C++ server our worker must send exactly what an upstream worker
sends: one request per MXNet key, the ps keys and lens of ``EncodeDefaultKey`` (and the cmd of
:mod:`kvstore_byteps.mxproto`). These functions reproduce that arithmetic, including its quirks:

* the server of a small array is ``(key * 9973) % num_servers`` evaluated in C ``int`` (32-bit,
  wrapping), so for ``key > 215329`` the product overflows; when it turns negative, upstream
  indexes its server list with a negative number (undefined behaviour), which we refuse;
* big arrays (``n_elems >= MXNET_KVSTORE_BIGARRAY_BOUND``) are split over all servers with
  ``round(n / S * (i + 1)) - round(n / S * i)`` elements on server ``i``, computed in double
  precision with C's ``round`` (half away from zero); parts may be empty.
"""
import dataclasses
from typing import Tuple

from ..mxproto import MShadowType, mshadow_code
from ..van.wire.keys import server_key_range
from .partition import KeyLayoutError

__all__ = ["PSKV", "dtype_code", "mxnet_server_for_key", "encode_default_key",
           "encode_compressed_key", "round_half_away", "TWOBIT_FACTOR"]

#: values per float32 word in MXNet's 2-bit layout (GetCompressionFactor)
TWOBIT_FACTOR = 16

_INT32_MAX = 2 ** 31 - 1


def dtype_code(dtype) -> MShadowType:
    """mshadow code of a numpy dtype (or its name); KeyLayoutError if it has none."""
    try:
        return mshadow_code(dtype)
    except ValueError:
        raise KeyLayoutError("dtype %r has no mshadow code" % (dtype,)) from None


def _c_int32(value: int) -> int:
    return ((value + 2 ** 31) % 2 ** 32) - 2 ** 31


def _c_remainder(dividend: int, divisor: int) -> int:
    """C's ``%``: the result takes the sign of the dividend."""
    result = abs(dividend) % divisor
    return -result if dividend < 0 else result


def mxnet_server_for_key(key: int, num_servers: int) -> int:
    """Upstream's server of a small array: ``(key * 9973) % num_servers`` in C ``int``."""
    if not 0 <= key <= _INT32_MAX:
        raise KeyLayoutError("key %d is outside MXNet's int key range [0, 2**31)" % key)
    server = _c_remainder(_c_int32(key * 9973), num_servers)
    if server < 0:
        raise KeyLayoutError(
            "key %d: upstream MXNet computes server %d for it ((key*9973) overflows int32), "
            "which is undefined behaviour in MXNet; use a key below 215330 or a single server"
            % (key, server))
    return server


def round_half_away(value: float) -> int:
    """C's ``round`` for non-negative doubles."""
    whole = int(value)
    return whole + 1 if value - whole >= 0.5 else whole


@dataclasses.dataclass(frozen=True)
class PSKV:
    """Upstream's ``PSKV``: the ps keys of one MXNet key, bytes per ps key, total bytes."""

    keys: Tuple[int, ...]
    lens: Tuple[int, ...]
    size: int


def encode_default_key(key: int, num_elems: int, itemsize: int, num_servers: int,
                       bigarray_bound: int = 1000000) -> PSKV:
    """Upstream's ``EncodeDefaultKey`` for default (dense) storage."""
    if num_elems < 0 or itemsize < 1:
        raise ValueError("num_elems must be >= 0 and itemsize >= 1, got %d and %d"
                         % (num_elems, itemsize))
    if num_elems < bigarray_bound:
        server = mxnet_server_for_key(key, num_servers)
        return _pskv(key, [(server, num_elems * itemsize)], num_servers)
    if not 0 <= key <= _INT32_MAX:
        raise KeyLayoutError("key %d is outside MXNet's int key range [0, 2**31)" % key)
    per_server = num_elems / num_servers
    parts = [(i, (round_half_away(per_server * (i + 1)) - round_half_away(per_server * i))
              * itemsize) for i in range(num_servers)]
    return _pskv(key, parts, num_servers)


def _pskv(key: int, parts, num_servers: int) -> PSKV:
    for _, nbytes in parts:
        if nbytes > _INT32_MAX:
            raise KeyLayoutError("key %d: a %d-byte slice does not fit MXNet's int lens"
                                 % (key, nbytes))
    keys = tuple(server_key_range(server, num_servers)[0] + key for server, _ in parts)
    lens = tuple(nbytes for _, nbytes in parts)
    return PSKV(keys, lens, sum(lens))


def encode_compressed_key(key: int, num_elems: int, num_servers: int,
                          bigarray_bound: int = 1000000) -> Tuple[Tuple[int, int, int], ...]:
    """Upstream's ``EncodeCompressedKey`` under 2-bit compression (float32): per server part,
    ``(server, values, packed float32 words)``. A big array is split by its *packed* words
    (``round(C / S * (i + 1)) - round(C / S * i)``, the last part the rest), each part holding
    16 values a word: the parts of the values (the pull's and the initialising push's layout)
    differ from ``EncodeDefaultKey``'s. A compressed push of a part carries
    ``[begin + values, begin + key]`` with lens ``[0, words * 4]``."""
    if num_elems < 0:
        raise ValueError("num_elems must be >= 0, got %d" % num_elems)
    words = -(-num_elems // TWOBIT_FACTOR)
    if num_elems < bigarray_bound:
        return ((mxnet_server_for_key(key, num_servers), num_elems, words),)
    if not 0 <= key <= _INT32_MAX:
        raise KeyLayoutError("key %d is outside MXNet's int key range [0, 2**31)" % key)
    parts, done_words, done_values = [], 0, 0
    for i in range(num_servers):
        if i == num_servers - 1:
            part_words, part_values = words - done_words, num_elems - done_values
        else:
            # C's size_t(round(double)), half away from zero
            part_words = (round_half_away(words / num_servers * (i + 1))
                          - round_half_away(words / num_servers * i))
            part_values = part_words * TWOBIT_FACTOR
        parts.append((i, part_values, part_words))
        done_words += part_words
        done_values += part_values
    return tuple(parts)
