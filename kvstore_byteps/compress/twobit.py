"""MXNet's 2-bit gradient compression: the command body and the packed layout. Pure.

Layout (what MXNet 1.9.1 workers send, checked against the golden vector ``32_push_compressed``):
16 values per float32 word, 4 values per byte, in increasing byte order; inside a byte the
first value takes the two most significant bits. Code ``11`` means +threshold, ``10`` means
-threshold, anything else 0. A part of ``n`` values travels as ``ceil(n/16)`` float32 words,
the unused trailing codes are zero.

The worker keeps a residual: it adds each gradient to the residual, sends +threshold where the
residual reached +threshold (and subtracts it), -threshold where it reached -threshold. The
server only dequantizes; :func:`quantize_2bit` exists for tests and for workers of ours.
"""
import dataclasses
import enum
from typing import Optional, Tuple

import numpy as np

from ..errors import ProtocolError

__all__ = ["CompressionType", "GradientCompression", "parse_twobit_params",
           "packed_nbytes_2bit", "dequantize_2bit", "quantize_2bit"]


class CompressionType(enum.IntEnum):
    """MXNet's ``CompressionType`` as it travels in kSetGradientCompression."""

    NONE = 0
    TWO_BIT = 1


@dataclasses.dataclass(frozen=True)
class GradientCompression:
    """A compression setting; ``threshold`` is a float32 as MXNet parses it."""

    type: CompressionType = CompressionType.NONE
    threshold: float = 0.5

    @property
    def enabled(self) -> bool:
        return self.type is not CompressionType.NONE


def parse_twobit_params(body: bytes) -> GradientCompression:
    """Parse ``"<type>[,<threshold>]"`` (e.g. ``b"1,0.500000"``); ProtocolError if malformed."""
    text = bytes(body).decode("ascii", errors="replace").strip()
    parts = text.split(",")
    try:
        kind = CompressionType(int(parts[0]))
        threshold = float(np.float32(parts[1])) if len(parts) > 1 and parts[1] else 0.5
    except (ValueError, IndexError):
        raise ProtocolError("bad gradient compression parameters %r (expected '<type>,<threshold>' "
                            "with type 0 or 1)" % text) from None
    if len(parts) > 2 or (kind is CompressionType.TWO_BIT and not threshold > 0):
        raise ProtocolError("bad gradient compression parameters %r (2-bit needs a positive "
                            "threshold)" % text)
    return GradientCompression(kind, threshold)


def packed_nbytes_2bit(size: int) -> int:
    """Bytes that ``size`` values occupy in the 2-bit layout (whole float32 words)."""
    return (size + 15) // 16 * 4


#: shifts that bring the codes of a byte's 4 values, first value first, to the low two bits
_SHIFTS = np.array([6, 4, 2, 0], dtype=np.uint8)


def dequantize_2bit(packed, size: int, threshold: float) -> np.ndarray:
    """Expand ``size`` values from the packed bytes into a new float32 array."""
    data = np.frombuffer(packed, dtype=np.uint8)
    if data.nbytes != packed_nbytes_2bit(size):
        raise ProtocolError("2-bit data for %d values must have %d bytes, got %d"
                            % (size, packed_nbytes_2bit(size), data.nbytes))
    codes = (data[:, None] >> _SHIFTS) & 3
    table = np.array([0.0, 0.0, -threshold, threshold], dtype=np.float32)
    return table[codes.reshape(-1)[:size]]


def quantize_2bit(grad: np.ndarray, threshold: float,
                  residual: Optional[np.ndarray] = None) -> Tuple[bytes, np.ndarray]:
    """Pack ``grad`` (+ ``residual``) as an MXNet worker would; return (packed, new residual)."""
    threshold = np.float32(threshold)
    acc = np.asarray(grad, dtype=np.float32).reshape(-1).copy()
    if residual is not None:
        acc += residual
    pos, neg = acc >= threshold, acc <= -threshold
    acc[pos] -= threshold
    acc[neg] += threshold
    codes = np.zeros(packed_nbytes_2bit(acc.size) * 4, dtype=np.uint8)
    codes[:acc.size][pos] = 3
    codes[:acc.size][neg] = 2
    packed = (codes.reshape(-1, 4) << _SHIFTS).sum(axis=1, dtype=np.uint8)
    return packed.tobytes(), acc
