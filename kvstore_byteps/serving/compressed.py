"""The compressed BytePS path of the server: request type 4 (``BYTEPS_COMPRESSED``).

``dist_byteps`` workers that set gradient compression tell the servers their parameters once
(the ``BYTEPS_COMPRESSION`` command, JSON); from then on each float32 partition of at least
``min_compress_bytes`` is pushed compressed, one key per request, with its round in the meta.
A push is decoded and summed as any BytePS push; a pull is answered with the round's sum
compressed once (with the server's own error feedback) and the same bytes for every worker.
(MXNet's 2-bit compression of ``dist_sync`` is another thing: :mod:`..compress.twobit`.)
"""
import json
import threading
from typing import Dict, Optional

import numpy as np

from ..compress.params import CompressionSpec, parse_compression_params
from ..compress.state import PartitionCompressor, server_side
from ..errors import ConfigError, ProtocolError
from ..mxproto import SERVER_DTYPES, Cmd, RequestType, encode_cmd

__all__ = ["CompressedPath", "COMPRESSED_HEADS", "claimed_round"]

#: Request heads of the compressed BytePS path (request type 4, any server dtype).
COMPRESSED_HEADS = frozenset(encode_cmd(RequestType.BYTEPS_COMPRESSED, dtype)
                             for dtype in SERVER_DTYPES.values())


def claimed_round(req) -> Optional[int]:
    """The round a request says it belongs to (the ``round`` extension field), or None."""
    extra = getattr(req.meta, "extra", None) or {}
    value = extra.get("round")
    return None if value is None else int(value)


class CompressedPath:
    """The workers' compression spec, each key's compressor and each round's compressed sum.

    ``keys`` is the BytePS server's key table (``key_of``) and ``path`` its data path
    (:mod:`.datapath`): a decoded push is summed there, a pull answered there, and
    ``path.compression_refusal`` says why this server's training mode cannot take compression
    (None: it can)."""

    def __init__(self, keys, path):
        self._keys, self._path, self._refusal = keys, path, path.compression_refusal
        #: the dist_byteps workers' CompressionSpec, once set
        self.spec: Optional[CompressionSpec] = None
        self._compressors: Dict[int, PartitionCompressor] = {}   # per compressed ps key
        self._sums: Dict[int, tuple] = {}     # ps key -> (round, bytes)
        self._lock = threading.RLock()        # compressed_sum -> _compressor

    def set_spec(self, body: bytes) -> None:
        """BYTEPS_COMPRESSION: the workers' compression dict, as JSON (checked here again)."""
        if self._refusal:
            raise ProtocolError(self._refusal)
        try:
            params = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise ProtocolError("BYTEPS_COMPRESSION body is not JSON: %s" % exc) from None
        try:
            spec = parse_compression_params(params)
        except ConfigError as exc:
            raise ProtocolError(str(exc)) from None
        with self._lock:
            self.spec = spec
            self._compressors.clear()
            self._sums.clear()

    def _compressor(self, ps_key: int) -> PartitionCompressor:
        """The key's compressor: its codec decodes pushes, and it compresses the rounds' sums
        (with its own error feedback). Built on first use, after the workers' spec."""
        with self._lock:
            compressor = self._compressors.get(ps_key)
            if compressor is None:
                compressor = self._compressors[ps_key] = PartitionCompressor(
                    server_side(self.spec), salt=ps_key)
            return compressor

    def handle(self, req, server, cmd: Cmd) -> None:
        """A push of compressed values (decoded, then summed as usual) or a pull answered with
        the round's sum compressed; the round (the seeded codecs' step) is claimed."""
        if self.spec is None:
            raise ProtocolError("a compressed request, but no worker set gradient compression")
        if req.keys is None or len(req.keys) != 1 or req.meta.push == req.meta.pull:
            raise ProtocolError("a compressed request has one key and is a push or a pull")
        r = claimed_round(req)
        if r is None:
            raise ProtocolError("a compressed request must say its round")
        key = self._keys.key_of(int(req.keys[0]), cmd)   # initialised by rank 0's init push
        if req.meta.pull:
            self._path.pull(req.sender, (req, server), key)
            return
        codec = self._compressor(key.ps_key).codec
        data = np.frombuffer(req.vals, np.uint8)
        if data.size != codec.wire_bytes(key.size):
            raise ProtocolError("compressed push of key %d has %d bytes, expected %d"
                                % (key.ps_key, data.size, codec.wire_bytes(key.size)))
        self._path.begin_sum(req, server, key, codec.decode(data, key.size, r), r)

    def answer_value(self, req, total: np.ndarray) -> np.ndarray:
        """What a pull of ``req``'s round is answered with: its sum compressed once per round
        (with error feedback when the workers use it, so what this compression drops is sent
        with later rounds), the same bytes for every worker. Rounds are answered in order."""
        ps_key, r = int(req.keys[0]), claimed_round(req)
        with self._lock:
            cached = self._sums.get(ps_key)
            if cached is not None and cached[0] == r:
                return cached[1]
            data = self._compressor(ps_key).encode(total, r)
            self._sums[ps_key] = (r, data)
            return data
