"""MXNet's 2-bit gradient compression spoken to MXNet's own servers, as MXNet's worker does.

With MXNet's servers (:class:`.layout.MXNetDialect`), ``{"type": "2bit", "threshold": t}``
makes rank 0 send kSetGradientCompression (``"1,<t>"``) and lays float32 keys out as
``EncodeCompressedKey`` does (:func:`.upstream.encode_compressed_key`). Each round a partition
(one server's part of a key) is quantized with this worker's residual for it
(:func:`~kvstore_byteps.compress.twobit.quantize_2bit`, MXNet's packed layout: parts start at
whole 16-value words, so quantizing a part alone gives its bytes of the whole key's) and pushed
with ``keys [begin + values, ps key]``, ``lens [0, bytes]``, cmd cantor(2, float32); its pull,
under the same cmd, reads the part uncompressed: the servers' weights after their optimizer, or
the round's sum without one.
"""
from typing import Dict

import numpy as np

from ..mxproto import MShadowType, RequestType, encode_cmd
from ..compress.twobit import quantize_2bit
from ..van.wire.keys import server_key_range
from ..van.wire.message import server_rank_to_id
from .routes import pull_one, send_buffer

__all__ = ["MXNetTwoBitRoute", "twobit_command_body"]

_CMD = encode_cmd(RequestType.COMPRESSED, MShadowType.FLOAT32)


def twobit_command_body(threshold: float) -> bytes:
    """kSetGradientCompression's body as MXNet's ``GradientCompression::EncodeParams``."""
    return b"1,%f" % threshold


class MXNetTwoBitRoute:
    """One float32 partition per request, quantized with this worker's residual; pulled with
    the compressed cmd, uncompressed (PUSH and PULL threads; a residual per ps key, touched
    by the PUSH thread only)."""

    def __init__(self, kv, tracer, threshold: float, num_servers: int):
        self.kv, self.tracer, self.threshold = kv, tracer, threshold
        self.num_servers = num_servers
        self._residuals: Dict[int, np.ndarray] = {}
        #: packed bytes pushed so far (PUSH thread only)
        self.bytes_pushed = 0

    @staticmethod
    def takes(item) -> bool:
        """Every float32 partition, however small (MXNet compresses every gradient)."""
        return item.task.context.layout.dtype == np.float32

    def pull_weights(self) -> None:
        """Nothing to change: a pull here always reads the part uncompressed."""

    def push(self, group, done) -> None:
        [item] = group
        part = item.partition
        values = send_buffer(item).view(np.float32)
        packed, self._residuals[part.ps_key] = quantize_2bit(
            values, self.threshold, self._residuals.get(part.ps_key))
        self.bytes_pushed += len(packed)
        begin = server_key_range(part.server, self.num_servers).begin
        # MXNet's order, [begin + values, ps key]: not ascending, so sent to the server direct
        self.kv.send_push(server_rank_to_id(part.server), _CMD, b"",
                          np.array([begin + values.size, part.ps_key], dtype=np.uint64),
                          packed, np.array([0, len(packed)], dtype=np.int32),
                          "2-bit compressed push of ps key %d" % part.ps_key,
                          callback=lambda request: done(request.error, group))

    def pull(self, group, done) -> None:
        pull_one(self.kv, self.tracer, group, done, _CMD)
