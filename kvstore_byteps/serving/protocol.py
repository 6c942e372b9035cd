"""The frame layouts of each MXNet request type, as the server reads them. Pure.

The cmd (request type and dtype) is decoded by :mod:`kvstore_byteps.mxproto`; the parse
functions here turn one request (keys, vals, lens frames) of a decoded cmd into a typed value
or raise :class:`~kvstore_byteps.errors.ProtocolError` naming what is wrong, so the server can
answer the offending request with an error and keep serving everyone else.
"""
import dataclasses
from typing import Optional, Union

import numpy as np

from ..errors import ProtocolError
from ..mxproto import Cmd

__all__ = ["DenseRequest", "RowSparseRequest", "CompressedPush", "parse_dense",
           "parse_row_sparse", "parse_compressed"]


@dataclasses.dataclass
class DenseRequest:
    """A one-key push, pull or pushpull of a dense array (default, BytePS, compressed pull)."""

    ps_key: int
    push: bool
    pull: bool
    values: Optional[np.ndarray]   # 1-D, wire dtype; present iff push


@dataclasses.dataclass
class RowSparseRequest:
    """A row_sparse push or pull: rows are relative to the master key (spec §5.6)."""

    master_key: int
    push: bool
    pull: bool
    rows: np.ndarray               # int64 row ids
    values: Optional[np.ndarray]   # (len(rows), unit_len) for a push with rows, else None


@dataclasses.dataclass
class CompressedPush:
    """A 2-bit compressed push: ``original_size`` float32 values packed 16 per float32."""

    ps_key: int
    pull: bool
    original_size: int
    packed: memoryview


def _flags(req) -> tuple:
    push, pull = bool(req.meta.push), bool(req.meta.pull)
    if not (push or pull):
        raise ProtocolError("request is neither a push nor a pull")
    return push, pull


def _keys(req, count: Optional[int] = None) -> np.ndarray:
    keys = req.keys
    if keys is None or len(keys) == 0:
        raise ProtocolError("request carries no keys")
    if count is not None and len(keys) != count:
        raise ProtocolError("expected %d key(s) in this request, got %d" % (count, len(keys)))
    return keys


def _lens(req, count: int) -> np.ndarray:
    lens = req.lens
    if lens is None or len(lens) != count:
        got = "none" if lens is None else str(len(lens))
        raise ProtocolError("a push needs one lens entry per key (%d), got %s" % (count, got))
    # (one key, most pushes: no numpy call, which costs more than the check)
    if (lens[0] < 0) if count == 1 else (lens < 0).any():
        raise ProtocolError("negative lens %s" % list(lens))
    return lens


def _values(req, dtype: np.dtype, nbytes: int) -> np.ndarray:
    vals = memoryview(req.vals) if req.vals is not None else memoryview(b"")
    if vals.nbytes != nbytes:
        raise ProtocolError("vals frame has %d bytes, lens say %d" % (vals.nbytes, nbytes))
    if nbytes % dtype.itemsize:
        raise ProtocolError("%d value bytes is not a whole number of %s (itemsize %d)"
                            % (nbytes, dtype, dtype.itemsize))
    return np.frombuffer(vals.cast("B") if vals.format != "B" else vals, dtype=dtype)


def parse_dense(req, cmd: Cmd) -> DenseRequest:
    """One key; a push carries ``lens=[nbytes]`` and exactly that many value bytes."""
    push, pull = _flags(req)
    keys = _keys(req, 1)
    values = None
    if push:
        lens = _lens(req, 1)
        values = _values(req, cmd.dtype, int(lens[0]))
    return DenseRequest(int(keys[0]), push, pull, values)


def parse_row_sparse(req, cmd: Cmd) -> RowSparseRequest:
    """Keys ``[master, master+row...]``; a push's lens are ``[0, row_bytes, ...]`` in bytes."""
    push, pull = _flags(req)
    keys = _keys(req)
    master = int(keys[0])
    if (keys[1:] < keys[0]).any():
        raise ProtocolError("row keys below the master key %d" % master)
    rows = (keys[1:] - keys[0]).astype(np.int64)
    values = None
    if push:
        lens = _lens(req, len(keys))
        if lens[0] != 0:
            raise ProtocolError("row_sparse lens[0] must be 0, got %d" % lens[0])
        values = _row_values(req, cmd.dtype, lens[1:])
    return RowSparseRequest(master, push, pull, rows, values)


def _row_values(req, dtype: np.dtype, row_lens: np.ndarray) -> Optional[np.ndarray]:
    if len(row_lens) == 0:
        _values(req, dtype, 0)
        return None
    row_bytes = int(row_lens[0])
    if row_bytes == 0 or (row_lens != row_bytes).any():
        raise ProtocolError("row_sparse rows must all have the same non-zero byte length, got %s"
                            % list(row_lens))
    flat = _values(req, dtype, row_bytes * len(row_lens))
    if row_bytes % dtype.itemsize:
        raise ProtocolError("row length %d bytes is not a whole number of %s" % (row_bytes, dtype))
    return flat.reshape(len(row_lens), row_bytes // dtype.itemsize)


def parse_compressed(req, cmd: Cmd, key_begin: int,
                     packed_nbytes) -> Union[CompressedPush, DenseRequest]:
    """A push carries ``keys=[begin+original_size, ps_key]``, ``lens=[0, packed bytes]``.

    A pull has the default layout (one key) and is answered uncompressed. ``packed_nbytes``
    maps an original size to the packed byte count the compression scheme expects.
    """
    if cmd.dtype != np.float32:
        raise ProtocolError("compressed requests must be float32, got %s" % cmd.dtype)
    push, pull = _flags(req)
    if not push:
        return parse_dense(req, cmd)
    keys = _keys(req, 2)
    lens = _lens(req, 2)
    original_size = int(keys[0]) - key_begin
    if lens[0] != 0 or original_size < 0:
        raise ProtocolError("compressed push needs keys=[begin+size, key], lens=[0, n]; "
                            "got keys=%s lens=%s" % (list(keys), list(lens)))
    expected = packed_nbytes(original_size)
    if int(lens[1]) != expected:
        raise ProtocolError("compressed push of %d values must carry %d bytes, lens say %d"
                            % (original_size, expected, lens[1]))
    packed = _values(req, np.dtype(np.uint8), expected)
    return CompressedPush(int(keys[1]), pull, original_size, memoryview(packed))
