"""Batched BytePS requests: many small keys of one server in one message. Pure helpers.

The dist_byteps worker sends partitions smaller than a few tens of KB together, one push and
one pull per server instead of one per partition, because the per-message cost (about 100 us on
loopback) dominates at those sizes. A batch push carries ``keys``, the values concatenated and
``lens`` (bytes per key); a batch pull is answered once, when every key's round is complete.
"""
import threading
from typing import Callable, List

import numpy as np

from ..errors import ProtocolError
from ..memory import one_frame
from ..mxproto import Cmd


def split_values(req, cmd: Cmd, count: int) -> List[np.ndarray]:
    """The per-key value arrays of a batch push (views of the request's vals frame)."""
    lens = req.lens
    if lens is None or len(lens) != count:
        raise ProtocolError("a batch push of %d keys needs %d lens" % (count, count))
    itemsize = cmd.dtype.itemsize
    if int(np.sum(lens, dtype=np.int64)) != req.vals.nbytes:
        raise ProtocolError("lens sum to %d bytes but vals has %d"
                            % (int(np.sum(lens, dtype=np.int64)), req.vals.nbytes))
    values, offset = [], 0
    for nbytes in (int(n) for n in lens):
        if nbytes < 0 or nbytes % itemsize:
            raise ProtocolError("%d bytes is not a whole number of %s values" % (nbytes, cmd.dtype))
        values.append(np.frombuffer(req.vals, cmd.dtype, nbytes // itemsize, offset))
        offset += nbytes
    return values


class BatchAnswer:
    """Collects the sums of a batch pull and answers the request once all are in."""

    def __init__(self, req, server, count: int, respond: Callable):
        self.req, self.server, self.reply = req, server, respond
        self._parts: List = [None] * count
        self._missing = count
        self._lock = threading.Lock()

    def slot(self, index: int) -> "BatchSlot":
        return BatchSlot(self, index)

    def fill(self, index: int, value: np.ndarray) -> None:
        with self._lock:
            if self._missing < 0:      # failed already
                return
            if self._parts[index] is not None:
                raise ProtocolError("batch answer slot %d filled twice" % index)
            self._parts[index] = value
            self._missing -= 1
            complete = self._missing == 0
        if complete:
            lens = np.array([p.nbytes for p in self._parts], dtype=np.int32)
            # large parts sent in pieces (byteps_tcp: vectored, no copy): each is a published
            # sum or weights, which no later round writes before every worker read this one
            vals = one_frame([p.reshape(-1) for p in self._parts])
            self.reply(self.server, self.req, keys=self.req.keys, vals=vals, lens=lens)


    def fail(self, message: str) -> None:
        """Answer the batch with an error instead (once, whichever slot fails first)."""
        with self._lock:
            if self._missing <= 0:     # answered (or failed) already
                return
            self._missing = -1
        self.reply(self.server, self.req, error=message)


class BatchSlot:
    """The place of one key's sum in a :class:`BatchAnswer` (a round's pull token)."""

    __slots__ = ("batch", "index")

    def __init__(self, batch: BatchAnswer, index: int):
        self.batch, self.index = batch, index

    def fill(self, value: np.ndarray) -> None:
        self.batch.fill(self.index, value)
