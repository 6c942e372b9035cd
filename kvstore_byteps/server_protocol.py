"""What MXNet's requests mean: cmd decoding, dtypes, the frame layouts of each request type. Pure.

A KV request's ``head`` is MXNet's *cmd*, the Cantor pairing of (request type, mshadow dtype)
(spec/pslite-wire.md §5.2). The dtype travels only there; the vals frame is a raw little-endian
array of it. The parse functions here turn one request (keys, vals, lens frames) into a typed
value or raise :class:`~kvstore_byteps.errors.ProtocolError` naming what is wrong, so the
server can answer the offending request with an error and keep serving everyone else.

Request type 3 is ours: ``RequestType.BYTEPS`` marks the BytePS data path of ``dist_byteps``
workers (cmd = cantor(3, dtype): 6 for float32, 11 for float64, 17 for float16). Upstream
MXNet never sends it, so an upstream worker can never reach that path by accident.
"""
import dataclasses
from typing import Optional, Union

import numpy as np

from .errors import ProtocolError
from .van.cmd import MShadowType, RequestType, cantor_pair, cantor_unpair
from .van.commands import Command

__all__ = [
    "RequestType", "ServerCommand", "MShadowType", "Cmd", "DenseRequest", "RowSparseRequest",
    "CompressedPush", "cantor_pair", "cantor_unpair", "encode_cmd", "decode_cmd", "mshadow_of",
    "parse_dense", "parse_row_sparse", "parse_compressed",
]


#: SimpleApp command ids (spec §5.3, plus our BYTEPS_PROBE), shared with the workers.
ServerCommand = Command


#: The dtypes MXNet's server accepts; anything else is refused (upstream aborts instead).
_SUPPORTED = {
    MShadowType.FLOAT32: np.dtype(np.float32),
    MShadowType.FLOAT64: np.dtype(np.float64),
    MShadowType.FLOAT16: np.dtype(np.float16),
}
_MSHADOW_OF = {dtype: code for code, dtype in _SUPPORTED.items()}


@dataclasses.dataclass(frozen=True)
class Cmd:
    """A decoded cmd: request type and the numpy dtype of the values."""

    request_type: RequestType
    dtype: np.dtype


def mshadow_of(dtype) -> MShadowType:
    """The mshadow code of a supported numpy dtype."""
    try:
        return _MSHADOW_OF[np.dtype(dtype)]
    except KeyError:
        raise ValueError("dtype %s is not one of float32, float64, float16"
                         % np.dtype(dtype)) from None


def encode_cmd(request_type: RequestType, dtype) -> int:
    """The cmd (request head) for ``request_type`` and a supported numpy ``dtype``."""
    return cantor_pair(int(request_type), int(mshadow_of(dtype)))


def decode_cmd(head: int) -> Cmd:
    """Decode a request head; ProtocolError for unknown request types or unsupported dtypes."""
    try:
        type_code, dtype_code = cantor_unpair(int(head))
    except ValueError as exc:
        raise ProtocolError("bad cmd %d: %s" % (head, exc)) from None
    try:
        request_type = RequestType(type_code)
    except ValueError:
        raise ProtocolError("cmd %d has unknown request type %d" % (head, type_code)) from None
    dtype = _SUPPORTED.get(dtype_code)
    if dtype is None:
        try:
            name = MShadowType(dtype_code).name.lower()
        except ValueError:
            name = "with mshadow code %d" % dtype_code
        raise ProtocolError("cmd %d has unsupported dtype %s (supported: float32, float64, float16)"
                            % (head, name))
    return Cmd(request_type, dtype)


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
    if (lens < 0).any():
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
