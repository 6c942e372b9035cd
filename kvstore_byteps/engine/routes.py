"""How a group of partitions travels in a round: the transfer routes of the PUSH and PULL stages.

Every route has one interface, ``push(group, done)`` and ``pull(group, done)``, where ``group``
is a list of work items sent as one request and ``done(error, items)`` moves items on:

* :class:`PlainRoute`: a push, then a pull, each one request for the group (with
  BYTEPS_SERVER_RECOVERY, a push is recorded by the keeper as it is sent);
* :class:`RidingRoute`: the pull rides along with its push in one message
  (``KVWorker.push_with_pull``); the PULL stage only waits for its answer (:class:`RidingPull`);
* :class:`CompressedRoute`: one partition per request, encoded by its compressor (which keeps
  the error feedback) and numbered by round.

A pulled partition's sum is copied into every output by :func:`broadcast`.
"""
import itertools
import logging
import threading
from typing import Dict, List, Optional

import numpy as np

from ..compress.params import CompressionSpec
from ..compress.state import PartitionCompressor
from ..errors import KVStoreBytePSError, PeerError
from ..memory import copy_bytes, one_frame
from ..mxproto import RequestType, encode_cmd
from .trace import Phase, now_ns

__all__ = ["PlainRoute", "RidingRoute", "CompressedRoute", "RidingPull", "broadcast",
           "split_answer", "span", "pull_one"]

log = logging.getLogger(__name__)

_COMPRESSED_CMD = encode_cmd(RequestType.BYTEPS_COMPRESSED, np.float32)


def split_answer(result, count: int) -> List[memoryview]:
    """The per-key value bytes of a pull answer of ``count`` keys (split by its lens)."""
    vals = memoryview(result.vals).cast("B")
    if count == 1:
        return [vals]
    if result.lens is None or len(result.lens) != count:
        raise PeerError("a pull of %d keys was answered with %s lens"
                        % (count, None if result.lens is None else len(result.lens)))
    # in Python: numpy's cumsum of a short list costs more than the list (and gives up the GIL)
    offsets = list(itertools.accumulate(result.lens.tolist(), initial=0))
    return [vals[offsets[i]:offsets[i + 1]] for i in range(count)]


def _handling_failed(exc: Exception) -> Exception:
    """The error that handling a pull's answer gives its items when it raised: ours as it is;
    anything else (a bug) logged with its traceback too. The items fail either way: a task
    left pending would be a silent hang."""
    if not isinstance(exc, KVStoreBytePSError):
        log.exception("handling a pull's answer failed")
    return exc


def span(array: np.ndarray, part) -> np.ndarray:
    """The bytes of partition ``part`` in a flat byte view of its tensor."""
    return array[part.offset:part.offset + part.nbytes]


def send_buffer(item) -> np.ndarray:
    """The bytes ``item`` pushes: its span of the locally reduced tensor."""
    return span(item.task.context.send, item.partition)


def broadcast(item, result: memoryview, tracer, landed_in: Optional[np.ndarray] = None) -> None:
    """Copy one partition's sum into every output. ``landed_in``: the first output's span, where
    the van was asked to land the answer: if ``result`` is that array's memory (it did), that
    output needs no copy."""
    ctx, part = item.task.context, item.partition
    if result.nbytes != part.nbytes:
        raise PeerError("%s: the server answered ps key %d with %d bytes, expected %d"
                        % (ctx.layout.name, part.ps_key, result.nbytes, part.nbytes))
    start = now_ns() if tracer.enabled else 0
    # (a memoryview names the array it views: cheaper than comparing addresses)
    outputs = ctx.outputs
    if landed_in is not None and result.obj is landed_in:
        outputs = outputs[1:]
    for out in outputs:
        copy_bytes(span(out, part), result)      # with the GIL held (see copy_bytes)
    if start:
        tracer.record(Phase.LOCAL_BROADCAST, item.key, item.index, item.task.step, start,
                      now_ns(), item.priority)


def _landing(group) -> Optional[np.ndarray]:
    """Where the answer to a one-partition pull may land: the first output's span (byteps_tcp
    lands it there, saving a copy of every byte of the sum)."""
    if len(group) != 1:
        return None
    item = group[0]
    return span(item.task.context.outputs[0], item.partition)


class PlainRoute:
    """A push, then a pull, one request each for the group."""

    def __init__(self, kv, tracer, keeper):
        """``keeper``: the recovery keeper (or its stand-in), told of pushes and answers."""
        self.kv, self.tracer, self.keeper = kv, tracer, keeper

    def push(self, group, done) -> None:
        keys, buffers, vals, lens = _payload(group)
        self.kv.push(keys, vals, lens, cmd=group[0].task.context.layout.round_cmd,
                     priority=group[0].priority,
                     callback=lambda request: done(self.keeper.explain(request.error), group),
                     on_send=self.keeper.on_send(group, buffers))

    def pull(self, group, done) -> None:
        def on_answer(request):
            error = request.error
            if error is None:
                self.keeper.answered(group)    # on the thread completing requests
                try:
                    for item, vals in zip(group, split_answer(request.result, len(group))):
                        broadcast(item, vals, self.tracer, landed_in=into)
                except Exception as exc:
                    error = _handling_failed(exc)
            done(error, group)
        into = _landing(group)
        self.kv.pull([item.partition.ps_key for item in group],
                     cmd=group[0].task.context.layout.round_cmd, priority=group[0].priority,
                     callback=on_answer, into=into)


def _payload(group):
    """``(keys, buffers, vals, lens)`` of a push of ``group``: its ps keys, each partition's
    bytes, those bytes as one buffer, and their lengths."""
    buffers = [send_buffer(item) for item in group]
    vals = one_frame(buffers)      # large partitions in pieces (no copy), small ones joined
    return ([item.partition.ps_key for item in group], buffers, vals,
            [item.partition.nbytes for item in group])


class RidingRoute(PlainRoute):
    """The pull rides along with its push: one message instead of two (our servers, synchronous
    training, no kept rounds: a restarted server would be sent the pushes again and would not
    know the pulls)."""

    def push(self, group, done) -> None:
        keys, _, vals, lens = _payload(group)
        into = _landing(group)
        riding = RidingPull(self.tracer, group, into)
        for item in group:
            item.riding_pull = riding
        self.kv.push_with_pull(keys, vals, lens, cmd=group[0].task.context.layout.round_cmd,
                               priority=group[0].priority,
                               push_callback=lambda request: done(
                                   self.keeper.explain(request.error), group),
                               pull_callback=riding.arrived, into=into)

    def pull(self, group, done) -> None:
        """Wait for the answers of ``group``'s riding pulls (items of several pushes)."""
        waiting: Dict[int, tuple] = {}
        for item in group:
            waiting.setdefault(id(item.riding_pull), (item.riding_pull, []))[1].append(item)
        for riding, items in waiting.values():
            riding.deliver_to(items, done)


class RidingPull:
    """The answer to a pull that was sent along with its push, and the PULL stage's wait for it.

    The answer usually comes after the push's acknowledgement moved the items on to PULL, but
    it may come first (pacing can hold an acknowledgement while the round completes):
    whichever of the two comes second copies the sums out and finishes the items."""

    def __init__(self, tracer, group: list, into: Optional[np.ndarray]):
        """``into``: where the van was asked to land the answer (see :func:`broadcast`)."""
        self._tracer, self._group, self._into = tracer, group, into
        self._lock = threading.Lock()
        self._answered = False
        self._error: Optional[BaseException] = None
        self._values: Dict[int, memoryview] = {}      # id(item) -> its sum's bytes
        self._waiting: List[tuple] = []                # (items, done) of the PULL stage

    def arrived(self, request) -> None:
        """The pull request completed (answered, refused, failed or past its deadline)."""
        error, values = request.error, {}
        if error is None:
            try:
                values = {id(item): vals for item, vals in
                          zip(self._group, split_answer(request.result, len(self._group)))}
            except Exception as exc:
                error = _handling_failed(exc)
        self._group = None    # the items refer to this object: no reference cycle
        with self._lock:
            self._answered, self._error, self._values = True, error, values
            waiting, self._waiting = self._waiting, []
        for items, done in waiting:
            self._deliver(items, done)

    def deliver_to(self, items: list, done) -> None:
        """Finish ``items`` (of this group) with ``done`` once the answer is here."""
        with self._lock:
            if not self._answered:
                self._waiting.append((items, done))
                return
        self._deliver(items, done)

    def _deliver(self, items: list, done) -> None:
        error = self._error
        if error is None:
            try:
                for item in items:   # (popped: the receive buffer goes back to the pool)
                    broadcast(item, self._values.pop(id(item)), self._tracer,
                              landed_in=self._into)
            except Exception as exc:
                error = _handling_failed(exc)
        done(error, items)


def compression_refusal(server_recovery: bool, extensions_missing: Optional[str],
                        mode, compressor: str = "") -> Optional[str]:
    """Why this worker cannot compress gradients with ``compressor``, or None: kept rounds
    for a restarted server, MXNet's servers (``extensions_missing``: they take MXNet's 2-bit
    only), a training mode without summed rounds."""
    if server_recovery:
        return ("gradient compression and BYTEPS_SERVER_RECOVERY cannot be used together yet: "
                "a restarted server could not rebuild the compressors' error feedback")
    if extensions_missing and compressor != "twobit":
        return ("BytePS's compressors need kvstore-byteps servers (MXNet's servers take "
                "MXNet's {'type': '2bit', 'threshold': t}); %s" % extensions_missing)
    return mode.compression_refusal


class CompressedRoute:
    """One float32 partition per request, compressed by its own compressor; rounds numbered per
    ps key on each side (the server decodes and re-encodes with the same numbers). Once the
    servers run the optimizer (:meth:`pull_weights`), a round's answer is the weights after
    its update, pulled uncompressed (as MXNet's 2-bit compression pulls them): only the
    gradients are compressed, with this worker's error feedback."""

    def __init__(self, kv, tracer, spec: CompressionSpec):
        self.kv, self.tracer, self.spec = kv, tracer, spec
        self.weights = False          # the servers answer with weights: pulled uncompressed
        self._compressors: Dict[int, PartitionCompressor] = {}    # per compressed ps key
        self._push_rounds: Dict[int, int] = {}      # PUSH thread only
        self._pull_rounds: Dict[int, int] = {}      # PULL thread only
        #: payload bytes of compressed pushes so far (PUSH thread only)
        self.bytes_pushed = 0

    def takes(self, item) -> bool:
        """Whether ``item`` is compressed: float32 and at least ``min_compress_bytes``."""
        return (item.task.context.layout.dtype == np.float32
                and item.partition.nbytes >= self.spec.min_compress_bytes)

    def _compressor(self, ps_key: int) -> PartitionCompressor:
        compressor = self._compressors.get(ps_key)
        if compressor is None:
            compressor = self._compressors[ps_key] = PartitionCompressor(self.spec, salt=ps_key)
        return compressor

    @staticmethod
    def _next_round(rounds: Dict[int, int], ps_key: int) -> int:
        r = rounds[ps_key] = rounds.get(ps_key, -1) + 1
        return r

    def push(self, group, done) -> None:
        [item] = group
        ps_key = item.partition.ps_key
        r = self._next_round(self._push_rounds, ps_key)
        data = self._compressor(ps_key).encode(send_buffer(item).view(np.float32), r)
        self.bytes_pushed += data.size
        self.kv.push([ps_key], data, [data.size], cmd=_COMPRESSED_CMD, priority=item.priority,
                     extra={"round": r}, callback=lambda request: done(request.error, group))

    def pull_weights(self) -> None:
        """The servers run the optimizer from now on: pull each round's weights plain."""
        self.weights = True

    def pull(self, group, done) -> None:
        [item] = group
        ps_key = item.partition.ps_key
        r = self._next_round(self._pull_rounds, ps_key)
        if self.weights:
            pull_one(self.kv, self.tracer, group, done, item.task.context.layout.round_cmd)
            return

        def on_answer(request):
            error = request.error
            if error is None:
                try:
                    data = np.frombuffer(split_answer(request.result, 1)[0], np.uint8)
                    values = self._compressor(ps_key).decode(data, item.partition.nbytes // 4, r)
                    broadcast(item, memoryview(values.view(np.uint8)), self.tracer)
                except KVStoreBytePSError as exc:
                    error = exc
                except (ValueError, IndexError) as exc:   # bytes that do not decode
                    error = PeerError("ps key %d: the server's compressed answer does not "
                                      "decode: %s" % (ps_key, exc))
                except Exception as exc:
                    error = _handling_failed(exc)
            done(error, group)
        self.kv.pull([ps_key], cmd=_COMPRESSED_CMD, priority=item.priority,
                     extra={"round": r}, callback=on_answer)


def pull_one(kv, tracer, group, done, cmd: int) -> None:
    """Pull the one partition of ``group`` uncompressed under ``cmd`` into its outputs, then
    ``done(error, group)`` (a compressed route's pull of weights)."""
    [item] = group

    def on_answer(request):
        error = request.error
        if error is None:
            try:
                broadcast(item, split_answer(request.result, 1)[0], tracer)
            except Exception as exc:
                error = _handling_failed(exc)
        done(error, group)
    kv.pull([item.partition.ps_key], cmd=cmd, priority=item.priority, callback=on_answer)
