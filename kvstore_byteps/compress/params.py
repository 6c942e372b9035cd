"""The compression dict of ``kv.set_gradient_compression`` / ``gluon.Trainer(compression_params=)``.

BytePS's names: ``{"compressor": "onebit" | "topk" | "randomk" | "dithering", "ef": "vanilla",
"momentum": "nesterov", "momentum_mu": 0.9, "scaling": bool (onebit), "k": count or fraction
(topk, randomk) or levels (dithering), "seed": int (randomk, dithering), "partition": "linear" |
"natural", "normalize": "max" | "l2" (dithering), "min_compress_bytes": int}``; and MXNet's
``{"type": "2bit", "threshold": t}``, which becomes twobit with error feedback on every
gradient (MXNet's semantics). Anything else is one ConfigError naming the key and what is accepted. Pure.
"""
import dataclasses
from typing import Any, Mapping, Optional

from ..errors import ConfigError
from .codecs import Codec, Dithering, OneBit, RandomK, TopK, TwoBit

__all__ = ["CompressionSpec", "parse_compression_params", "COMPRESSORS"]

COMPRESSORS = ("onebit", "topk", "randomk", "dithering", "twobit")
#: BytePS's default: partitions below this many bytes travel uncompressed.
DEFAULT_MIN_COMPRESS_BYTES = 65536
_BYTEPS_KEYS = {"compressor", "ef", "momentum", "momentum_mu", "scaling", "k", "seed",
                "partition", "normalize", "min_compress_bytes"}
_MXNET_KEYS = {"type", "threshold"}


@dataclasses.dataclass(frozen=True)
class CompressionSpec:
    """A checked compression configuration."""

    compressor: str
    ef: Optional[str] = None
    momentum: Optional[str] = None
    momentum_mu: float = 0.9
    scaling: bool = False
    k: Optional[float] = None
    seed: int = 0
    partition: str = "linear"
    normalize: str = "max"
    threshold: float = 0.5
    min_compress_bytes: int = DEFAULT_MIN_COMPRESS_BYTES

    def codec(self, salt: int = 0) -> Codec:
        """The compressor for one partition (``salt``: e.g. its ps key)."""
        if self.compressor == "onebit":
            return OneBit(self.scaling)
        if self.compressor == "topk":
            return TopK(self.k)
        if self.compressor == "randomk":
            return RandomK(self.k, self.seed, salt)
        if self.compressor == "dithering":
            return Dithering(int(self.k), self.partition, self.normalize, self.seed, salt)
        return TwoBit(self.threshold)


def _choice(params, key, choices, default=None):
    value = params.get(key, default)
    if value is not None and value not in choices:
        raise ConfigError("gradient compression: %s=%r; accepted: %s"
                          % (key, value, ", ".join(map(repr, choices))))
    return value


def _number(params, key, kind, default, check, accepted):
    value = params.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            (kind is int and float(value) != int(value)) or not check(value):
        raise ConfigError("gradient compression: %s=%r; accepted: %s" % (key, value, accepted))
    return kind(value)


def parse_compression_params(params: Mapping[str, Any]) -> CompressionSpec:
    """Check ``params`` and return the spec; ConfigError naming the first bad key."""
    if not isinstance(params, Mapping):
        raise ConfigError("gradient compression: expected a dict, got %s"
                          % type(params).__name__)
    if "type" in params:                                  # MXNet's form
        unknown = sorted(set(params) - _MXNET_KEYS)
        if unknown:
            raise ConfigError("gradient compression: %r is not an MXNet compression key "
                              "(with 'type' the keys are 'type' and 'threshold')" % unknown[0])
        _choice(params, "type", ("2bit",))
        threshold = _number(params, "threshold", float, 0.5, lambda v: v > 0,
                            "a positive number")
        # MXNet compresses every gradient, however small
        return CompressionSpec("twobit", ef="vanilla", threshold=threshold,
                               min_compress_bytes=0)
    unknown = sorted(set(params) - _BYTEPS_KEYS)
    if unknown:
        raise ConfigError("gradient compression: unknown key %r; accepted: %s"
                          % (unknown[0], ", ".join(sorted(_BYTEPS_KEYS | {"type"}))))
    if "compressor" not in params:
        raise ConfigError("gradient compression: 'compressor' is required; accepted: %s"
                          % ", ".join(COMPRESSORS[:4]))
    compressor = _choice(params, "compressor", COMPRESSORS[:4])
    spec = dict(compressor=compressor,
                ef=_choice(params, "ef", ("vanilla",)),
                momentum=_choice(params, "momentum", ("nesterov",)),
                momentum_mu=_number(params, "momentum_mu", float, 0.9, lambda v: 0 <= v < 1,
                                    "a number in [0, 1)"),
                seed=_number(params, "seed", int, 0, lambda v: v >= 0, "an integer >= 0"),
                min_compress_bytes=_number(params, "min_compress_bytes", int,
                                           DEFAULT_MIN_COMPRESS_BYTES, lambda v: v >= 0,
                                           "an integer >= 0"))
    scaling = params.get("scaling", False)
    if not isinstance(scaling, bool):
        raise ConfigError("gradient compression: scaling=%r; accepted: True, False" % (scaling,))
    spec["scaling"] = scaling
    if compressor in ("topk", "randomk"):
        if "k" not in params:
            raise ConfigError("gradient compression: %s needs 'k' (a count >= 1, or a fraction "
                              "in (0, 1) of each partition)" % compressor)
        spec["k"] = _number(params, "k", float, None, lambda v: v > 0,
                            "a count >= 1, or a fraction in (0, 1)")
    if compressor == "dithering":
        spec["k"] = _number(params, "k", int, 4, lambda v: 1 <= v <= 127,
                            "an integer number of levels in [1, 127]")
        spec["partition"] = _choice(params, "partition", ("linear", "natural"), "linear")
        spec["normalize"] = _choice(params, "normalize", ("max", "l2"), "max")
    return CompressionSpec(**spec)
