"""Per-partition state around a codec: Nesterov momentum before it, error feedback around it.

``momentum="nesterov"`` (BytePS): m = mu * m + g, and g + mu * m is what gets compressed.
``ef="vanilla"``: the residual r of the last step is added first, and what the codec lost this
step becomes the next residual: e = x + r; c = encode(e); r = e - decode(c). Over many steps
nothing is lost, only delayed: the decoded values sum to the inputs' sum minus the residual
left at the end. One :class:`PartitionCompressor` per partition and worker. Pure.
"""
import dataclasses
from typing import Optional

import numpy as np

from .codecs import Codec
from .params import CompressionSpec

__all__ = ["PartitionCompressor", "server_side"]


def server_side(spec: CompressionSpec) -> CompressionSpec:
    """What the server applies to a round's sum before the pull: the same codec and error
    feedback, no momentum (that belongs to the gradient, on the worker)."""
    return dataclasses.replace(spec, momentum=None)


class PartitionCompressor:
    """Compress one partition's gradient, step after step, keeping its momentum and residual."""

    def __init__(self, spec: CompressionSpec, salt: int = 0):
        self.spec = spec
        self.codec: Codec = spec.codec(salt)
        self.momentum: Optional[np.ndarray] = None
        self.residual: Optional[np.ndarray] = None

    def encode(self, gradient: np.ndarray, step: int) -> np.ndarray:
        x = np.asarray(gradient, np.float32).reshape(-1)
        if self.spec.momentum == "nesterov":
            if self.momentum is None:
                self.momentum = np.zeros_like(x)
            self.momentum *= self.spec.momentum_mu
            self.momentum += x
            x = x + self.spec.momentum_mu * self.momentum
        if self.spec.ef == "vanilla":
            if self.residual is not None:
                x = x + self.residual
            data = self.codec.encode(x, step)
            self.residual = x - self.codec.decode(data, x.size, step)
            return data
        return self.codec.encode(x, step)

    def decode(self, data: np.ndarray, n: int, step: int) -> np.ndarray:
        return self.codec.decode(data, n, step)
