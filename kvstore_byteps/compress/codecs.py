"""Gradient compressors of BytePS 0.2.5 (and MXNet's 2-bit), as pure, vectorised numpy. Pure.

Each compressor turns one float32 partition into the bytes that would travel and back:
``encode(x, step) -> np.uint8 array`` and ``decode(data, n, step) -> float32 array``, with
``wire_bytes(n)`` the exact size of ``encode``'s output. ``step`` is the round number: the
seeded compressors (randomk, dithering) draw from ``(seed, salt, step)``, so every worker and
the server draw the same numbers for the same partition and round without sending them.
"""
import abc
import dataclasses
import math

import numpy as np

__all__ = ["Codec", "OneBit", "TopK", "RandomK", "Dithering", "TwoBit", "k_of"]


def k_of(k: float, n: int) -> int:
    """BytePS's ``k``: a count when >= 1, else a fraction of ``n``; at least 1, at most n."""
    count = int(k) if k >= 1 else int(math.ceil(k * n))
    return max(1, min(n, count)) if n else 0


class Codec(abc.ABC):
    """One compressor: stateless; ``salt`` tells partitions apart for the seeded ones."""

    @abc.abstractmethod
    def encode(self, x: np.ndarray, step: int) -> np.ndarray:
        """The bytes on the wire (np.uint8, exactly :meth:`wire_bytes` long)."""

    @abc.abstractmethod
    def decode(self, data: np.ndarray, n: int, step: int) -> np.ndarray:
        """The float32 values ``data`` stands for (``n`` of them)."""

    @abc.abstractmethod
    def wire_bytes(self, n: int) -> int:
        """Bytes :meth:`encode` produces for ``n`` values."""


def _f32(x) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.float32).reshape(-1)


def _scalar(value: float) -> np.ndarray:
    return np.frombuffer(np.float32(value).tobytes(), np.uint8)


@dataclasses.dataclass(frozen=True)
class OneBit(Codec):
    """signSGD: one bit per value (set: negative); with ``scaling``, every value decodes to
    +-mean(|x|) (the L1 norm over n), else to +-1. Wire: 4-byte scale + ceil(n / 8)."""

    scaling: bool = False

    def encode(self, x, step):
        x = _f32(x)
        scale = float(np.mean(np.abs(x))) if self.scaling and x.size else 1.0
        return np.concatenate([_scalar(scale), np.packbits(x < 0)])

    def decode(self, data, n, step):
        scale = np.frombuffer(data[:4].tobytes(), np.float32)[0]
        negative = np.unpackbits(data[4:], count=n).astype(bool)
        return np.where(negative, -scale, scale).astype(np.float32)

    def wire_bytes(self, n):
        return 4 + (n + 7) // 8


@dataclasses.dataclass(frozen=True)
class TopK(Codec):
    """The ``k`` values of largest magnitude, as (int32 index, float32 value) pairs; the rest
    decode to 0. Wire: 8k."""

    k: float

    def encode(self, x, step):
        x = _f32(x)
        count = k_of(self.k, x.size)
        index = np.sort(np.argpartition(np.abs(x), x.size - count)[x.size - count:]).astype(
            np.int32)
        return np.concatenate([index.view(np.uint8), x[index].view(np.uint8)])

    def decode(self, data, n, step):
        count = k_of(self.k, n)
        index = np.frombuffer(data[:4 * count].tobytes(), np.int32)
        out = np.zeros(n, np.float32)
        out[index] = np.frombuffer(data[4 * count:].tobytes(), np.float32)
        return out

    def wire_bytes(self, n):
        return 8 * k_of(self.k, n)


@dataclasses.dataclass(frozen=True)
class RandomK(Codec):
    """``k`` values at indices drawn from ``(seed, salt, step)``, the same on every worker and
    the server, so only the values travel; the rest decode to 0. Wire: 4k."""

    k: float
    seed: int = 0
    salt: int = 0

    def indices(self, n: int, step: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, self.salt, step])
        return np.sort(rng.choice(n, size=k_of(self.k, n), replace=False))

    def encode(self, x, step):
        x = _f32(x)
        return x[self.indices(x.size, step)].view(np.uint8).copy()

    def decode(self, data, n, step):
        out = np.zeros(n, np.float32)
        out[self.indices(n, step)] = np.frombuffer(data.tobytes(), np.float32)
        return out

    def wire_bytes(self, n):
        return 4 * k_of(self.k, n)


@dataclasses.dataclass(frozen=True)
class Dithering(Codec):
    """Stochastic quantisation to ``k`` levels of |x| / norm (``normalize``: ``max`` or
    ``l2``), levels spaced ``linear`` (l / k) or ``natural`` (0 and 2^-(k-1) ... 1/2, 1);
    rounded up or down at random (from ``(seed, salt, step)``) so the result is unbiased.
    Wire: 4-byte norm + one signed byte per value (k <= 127)."""

    k: int
    partition: str = "linear"
    normalize: str = "max"
    seed: int = 0
    salt: int = 0

    def _levels(self) -> np.ndarray:
        if self.partition == "linear":
            return np.arange(self.k + 1, dtype=np.float64) / self.k
        return np.concatenate([[0.0], 2.0 ** -np.arange(self.k - 1, -1, -1, dtype=np.float64)])

    def encode(self, x, step):
        x = _f32(x)
        norm = float(np.max(np.abs(x)) if self.normalize == "max" else np.linalg.norm(x)) \
            if x.size else 0.0
        if norm == 0.0:
            return np.concatenate([_scalar(0.0), np.zeros(x.size, np.uint8)])
        rng = np.random.default_rng([self.seed, self.salt, step])
        y = np.abs(x)
        y *= np.float32(1.0 / norm)
        np.minimum(y, np.float32(1.0), out=y)
        index = self._linear_levels(y) if self.partition == "linear" else self._natural_levels(y)
        # up with probability the fraction of the way from the lower level to the next one
        index += rng.random(x.size, dtype=np.float32) < y
        np.negative(index, out=index, where=x < 0)
        return np.concatenate([_scalar(norm), index.astype(np.int8).view(np.uint8)])

    def _linear_levels(self, y: np.ndarray) -> np.ndarray:
        """Level index l/k at or below each y (|x| / norm, in [0, 1]); ``y`` becomes the
        fraction of the way to the next level. float32 throughout: no table search."""
        y *= np.float32(self.k)
        low = np.floor(y)
        y -= low
        return low

    def _natural_levels(self, y: np.ndarray) -> np.ndarray:
        """As :meth:`_linear_levels` for the levels 0, 2^-(k-1), ..., 1/2, 1: y's float32
        exponent bits give its level 2^e <= y < 2^(e+1); below 2^-(k-1), the level 0.
        (2^-(k-1) >= 2^-126, the smallest normal float32, so no subnormal needs a level.)"""
        smallest = np.float32(2.0 ** (1 - self.k))
        small = y < smallest
        bits = y.view(np.int32) & np.int32(0x7F800000)    # sign 0, exponent kept, mantissa 0
        low = bits.view(np.float32)                      # 2^e
        np.copyto(low, np.float32(0.0), where=small)
        index = (bits >> 23).astype(np.float32)          # e + 127
        index += np.float32(self.k - 127)
        np.copyto(index, np.float32(0.0), where=small)
        y -= low
        np.copyto(low, smallest, where=small)            # now the width to the next level
        y /= low
        return index

    def decode(self, data, n, step):
        norm = np.frombuffer(data[:4].tobytes(), np.float32)[0]
        signed = np.frombuffer(data[4:4 + n].tobytes(), np.int8)
        if self.partition == "linear":
            return signed.astype(np.float32) * np.float32(norm / self.k)
        table = (self._levels() * norm).astype(np.float32)
        values = table[np.abs(signed)]
        np.negative(values, out=values, where=signed < 0)
        return values

    def wire_bytes(self, n):
        return 4 + n


@dataclasses.dataclass(frozen=True)
class TwoBit(Codec):
    """MXNet's 2-bit compression: values >= threshold decode to +threshold, <= -threshold to
    -threshold, the rest to 0 (MXNet always pairs it with error feedback). Wire: ceil(n / 4)."""

    threshold: float

    def encode(self, x, step):
        x = _f32(x)
        code = np.where(x >= self.threshold, 1, np.where(x <= -self.threshold, 2, 0))
        padded = np.zeros(((x.size + 3) // 4) * 4, np.uint8)
        padded[:x.size] = code
        quads = padded.reshape(-1, 4)
        return (quads[:, 0] << 6 | quads[:, 1] << 4 | quads[:, 2] << 2 | quads[:, 3]).astype(
            np.uint8)

    def decode(self, data, n, step):
        data = np.asarray(data, np.uint8)
        code = np.stack([data >> 6, (data >> 4) & 3, (data >> 2) & 3, data & 3], axis=1)
        code = code.reshape(-1)[:n]
        return np.where(code == 1, self.threshold,
                        np.where(code == 2, -self.threshold, 0.0)).astype(np.float32)

    def wire_bytes(self, n):
        return (n + 3) // 4
