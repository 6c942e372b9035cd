"""BytePSServer: the BytePS data path for ``dist_byteps`` workers, MXNet's semantics for the rest.

Requests whose cmd carries request type 3 (``RequestType.BYTEPS``: cmd = cantor(3, dtype), 6
for float32, 11 for float64, 17 for float16) take the BytePS path; every other request and
command goes to the inherited :class:`KVStoreDistServer`, so unmodified ``dist_sync`` /
``dist_async`` workers get exactly MXNet's behaviour. The ``BYTEPS_PROBE`` command is
answered ``PROBE_ANSWER`` (MXNet's server: an empty body).

BytePS path, one key per request, ``lens=[nbytes]`` like a default push:

* a key is initialised by rank 0's first push, as upstream: either a default-type push (what
  our worker sends: the value lands in the inherited store, where default-type pulls read it
  back) or, failing that, the first BytePS-type push of the key;
* sync (default): each round every worker pushes once (acked at once) and pulls once; the
  pushes are summed by the key's summing thread; a pull is answered with the round's sum when
  all ``num_workers`` pushes of that round are summed. Rounds are counted per (key, worker);
  see :mod:`.rounds` for the double buffering. A pushpull (push=1, pull=1) is a push
  followed by a pull and gets one answer, with the sum. A push may instead carry the
  timestamp of a pull riding along (``pull_timestamp``, what our worker sends): the push is
  acknowledged at once as any push, and the pull is answered under its own timestamp when the
  round is summed, as if it had been sent right after the push (one message less per
  partition and round, the push's credit still returned at once). If the worker sets the
  ``round`` extension field of the meta, it must match the server's count;
* async (``BYTEPS_ENABLE_ASYNC=1``) and backup workers (``BYTEPS_BACKUP_WORKERS``): the
  server keeps the weights; a plugged-in path (:mod:`.asynchronous`, :mod:`.backup`) takes
  the pushes and pulls instead of the summed rounds;
* a default-type (cmd 0/2/5) pull of a BytePS key returns its initial value (sync) or the
  current weights (async, backup); with ``await_init`` it waits for the key's initialising
  push.

Plugged in: the compressed path (request type 4, :mod:`.compressed`), and, on a server
restarted in place of a dead one (:meth:`BytePSServer.begin_recovery`), a filter in front that
drops requests meant for the dead process and holds the rest until every worker's report
rebuilt the keys' rounds (:mod:`.restart`).
"""
import dataclasses
import logging
import threading
from typing import Callable, Dict, Optional

import numpy as np

from ..config import training_mode
from ..errors import ConfigError, ProtocolError
from ..mxproto import (PROBE_ANSWER, SERVER_DTYPES, Cmd, Presence, RequestType,
                       ServerCommand, encode_cmd)
from .asynchronous import AsyncAdds
from .backup import BackupWorkers
from .riding import attached_pull, why_no_riding_pull
from .compressed import COMPRESSED_HEADS, CompressedPath, claimed_round
from .restart import NotRestarted, RestartFilter
from .rounds import KeyRounds
from .dist import KVStoreDistServer
from .summing import SumThreads
from .protocol import parse_dense
from .store import Entry, StorageKind, publish
from .awaiting import InitWaits
from .batch import BatchAnswer, BatchSlot, split_values
from .pacing import ImmediateAcks, PacedAcks
from .updater import Updater, load_mxnet_updater

__all__ = ["BytePSServer"]

#: Request heads of the plain BytePS path (request type 3, any server dtype).
_BYTEPS_HEADS = frozenset(encode_cmd(RequestType.BYTEPS, dtype)
                          for dtype in SERVER_DTYPES.values())

log = logging.getLogger(__name__)


@dataclasses.dataclass
class _BytePSKey:
    ps_key: int
    dtype: np.dtype
    #: init value (sync) / current weights (async); published. None on a restarted server
    value: Optional[np.ndarray]
    size: int                       # elements
    thread: int                     # summing thread the key is bound to
    rounds: object                  # KeyRounds (sync), BackupRounds, None (async)


def _describe_sum(key: "_BytePSKey", r: Optional[int], values: np.ndarray) -> tuple:
    """A summation task as the server profile names it."""
    return "sum ps key %d" % key.ps_key, {"round": r, "bytes": int(values.nbytes)}


class BytePSServer(KVStoreDistServer):
    """KVStoreDistServer plus the BytePS data path. Call :meth:`close` to stop its threads."""

    def __init__(self, num_workers: int, key_begin: int = 0, summing_threads: int = 4,
                 enable_async: bool = False, backup_workers: int = 0,
                 updater_loader: Callable[[bytes], Updater] = load_mxnet_updater,
                 pacing_lead_bytes: Optional[int] = None, pacing_hold_s: float = 0.2):
        super().__init__(num_workers, key_begin, updater_loader)
        self.summing = SumThreads(summing_threads)
        # the summing threads' work, as stages of the server profile (profiler.py)
        self._accumulate = self.profiler.timed("sum", self._accumulate, _describe_sum)
        #: where the weights live on this server instead of summed rounds: asynchronous
        #: training or backup workers; None: synchronous rounds of sums
        self.weights = (AsyncAdds(self, _describe_sum) if enable_async else
                        BackupWorkers(self, backup_workers, _describe_sum) if backup_workers
                        else None)
        self.mode = training_mode(enable_async, backup_workers)
        #: round pushes' acknowledgements: at once, or held for a worker far ahead of the
        #: others (summed rounds only; see pacing.py)
        self.acks = (PacedAcks(num_workers, pacing_lead_bytes, pacing_hold_s)
                     if pacing_lead_bytes is not None and self.weights is None
                     else ImmediateAcks())
        self._keys: Dict[int, _BytePSKey] = {}
        self._keys_lock = threading.Lock()
        #: Called with (ps key, bytes per push) when a key is initialised, so a
        #: receive-into-place van can set up the buffers its pushes will land in.
        self.expect_pushes: Callable[[int, int], None] = lambda ps_key, nbytes: None
        #: the dist_byteps workers' compressed path (``compression`` is MXNet's 2-bit)
        self.compressed = CompressedPath(
            self, None if self.weights is None else self.weights.compression_refusal)
        #: in front of every request: a filter once this server replaced a dead one
        self.restart: NotRestarted = NotRestarted()
        #: default pulls (req, server, cmd) that wait for their key's initialising push
        self._init_waits = InitWaits(self._lock, lambda ps_key: ps_key in self._store)
        #: the partition layout rank 0 chose at start (BYTEPS_LAYOUT), as it sent it
        self._layout: Optional[bytes] = None

    def request_handlers(self) -> dict:
        return {**super().request_handlers(),
                RequestType.BYTEPS: self._handle_byteps,
                RequestType.BYTEPS_COMPRESSED: lambda req, server, cmd: self.compressed.handle(
                    req, server, cmd),
                RequestType.BYTEPS_RECOVERY: self._unexpected_report,
                # rank 0 times these pushes to size the partitions (engine/sizing.py)
                RequestType.BYTEPS_LINK_TEST: lambda req, server, cmd: server.respond(req)}

    def command_handlers(self) -> dict:
        return {**super().command_handlers(),
                ServerCommand.BYTEPS_PROBE: self._probe,
                ServerCommand.BYTEPS_ABSENT: lambda body: b"",
                ServerCommand.BYTEPS_STALE: lambda body: b"0/0",   # summed rounds: no weights
                ServerCommand.BYTEPS_COMPRESSION: lambda body: self.compressed.set_spec(body),
                ServerCommand.BYTEPS_LAYOUT: self._layout_command}

    def _layout_command(self, body: bytes) -> bytes:
        """Rank 0 leaves the partition layout it chose at start (engine/sizing.py); the other
        workers, after their start-up barrier, read it back (an empty body)."""
        if body:
            self._layout = body
            return b""
        if self._layout is None:
            raise ProtocolError("no partition layout: rank 0 leaves it before the workers' "
                                "start-up barrier")
        return self._layout

    def _probe(self, body: bytes) -> bytes:
        """Which server this is; a worker says how it trains (``Config.training_mode``), and
        one that trains otherwise than this server is refused (sums taken for weights, or
        weights for sums, would be silently wrong)."""
        if body and body.decode("utf-8", "replace") != self.mode:
            raise ConfigError("this server trains %s, the worker %s: set BYTEPS_ENABLE_ASYNC "
                                "and BYTEPS_BACKUP_WORKERS alike on every node"
                                % (self.mode, body.decode("utf-8", "replace")))
        return PROBE_ANSWER

    # -- restarted server ---------------------------------------------------------------------
    def begin_recovery(self, epoch: int, deadline: float) -> None:
        """This server took over a dead one's id (its ``epoch``-th restart): hold every request
        until all workers' reports arrived, before monotonic time ``deadline``."""
        self.restart = RestartFilter(self, epoch, deadline)

    def restore_keys(self, restored: Dict[int, tuple]) -> None:
        """The keys as the workers' reports rebuilt them: ps key -> (dtype, bytes, rounds)."""
        with self._keys_lock:
            for ps_key, (dtype, nbytes, rounds) in restored.items():
                self._keys[ps_key] = _BytePSKey(ps_key, dtype, None, nbytes // dtype.itemsize,
                                                self.summing.bind(nbytes), rounds)
                self.expect_pushes(ps_key, nbytes)

    def handle_request(self, req, server) -> None:
        if not self.restart.admit(req, server, is_command=False):
            return
        extra = req.meta.extra
        if extra and "pull_timestamp" in extra:
            why_not = why_no_riding_pull(req, _BYTEPS_HEADS, self.weights)
            if why_not:    # the pull would never be answered: say so now instead
                self.refuse(req, server, why_not)
                return
        super().handle_request(req, server)

    def handle_command(self, req, server) -> None:
        if not self.restart.admit(req, server, is_command=True):
            return
        head = req.meta.head
        if (head in (ServerCommand.BYTEPS_ABSENT, ServerCommand.BYTEPS_STALE)
                and self.weights is not None and self.is_worker(req.sender)):
            with self._keys_lock:
                keys = list(self._keys.values())
            if head == ServerCommand.BYTEPS_STALE:     # how this worker's weights compare
                stale = self.weights.stale(req.sender, keys)
                self.send_answer(server, req, body=b"%d/%d" % (stale, len(keys)))
                return
            try:                                     # rounds stop (or start) waiting for it
                presence = Presence(bytes(req.meta.body or b""))
            except ValueError:
                self.refuse(req, server, "BYTEPS_ABSENT with body %r" % bytes(req.meta.body))
                return
            self.weights.absent(req.sender, presence, keys)
        super().handle_command(req, server)

    def _unexpected_report(self, req, server, cmd: Cmd) -> None:
        raise ProtocolError("a recovery report, but this server is not waiting for one (it "
                            "was not restarted, or every worker reported already)")

    def close(self, timeout: float = 10.0) -> None:
        """Finish queued summations and stop the summing threads (and the pacing thread)."""
        self.acks.close()
        self.summing.close(timeout)
        if self.weights is not None:
            self.weights.close(self._keys.values())
        super().close()

    def __enter__(self) -> "BytePSServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- dispatch ---------------------------------------------------------------------------
    def _handle_byteps(self, req, server, cmd: Cmd) -> None:
        attached = attached_pull(req)
        if req.keys is not None and len(req.keys) > 1:
            self._handle_byteps_batch(req, server, cmd, attached)
            return
        parsed = parse_dense(req, cmd)
        if parsed.push:
            self._push(req, server, parsed.ps_key, parsed.values, parsed.pull, attached)
        else:
            self.pull(req, server, self._known(parsed.ps_key, cmd))

    def _handle_default(self, req, server, cmd: Cmd) -> None:
        """MXNet's default requests; a pull of a BytePS key reads its initial value, and a pull
        with ``await_init`` (a worker declaring a tensor in any order) waits for the key's
        initialising push instead of being refused."""
        one_key = req.keys is not None and len(req.keys) == 1
        if not req.meta.push and one_key:
            key = self._keys.get(int(req.keys[0]))
            if key is not None:
                if key.value is None:
                    raise ProtocolError("key %d: its initial value was lost when this server "
                                        "was restarted (only the rounds in flight were "
                                        "restored)" % key.ps_key)
                if self.weights is not None:       # which weights the worker holds now
                    self.weights.note_read(req.sender, key)
                self._answer(req, server, key.value)
                return
            if ((req.meta.extra or {}).get("await_init")
                    and self._init_waits.hold(int(req.keys[0]), (req, server, cmd))):
                return
        super()._handle_default(req, server, cmd)
        if req.meta.push and one_key:
            for held in self._init_waits.release(int(req.keys[0])):
                super()._handle_default(*held)

    # -- BytePS requests --------------------------------------------------------------------
    def _push(self, req, server, ps_key: int, values: np.ndarray, pull: bool,
              attached=None) -> None:
        key, initialised_now = self._key_for_push(ps_key, values)
        if initialised_now:   # this push was the initialisation: acked (or read back) at once
            if pull:
                self._answer(req, server, key.value)
            else:
                self.send_answer(server, req)
            if attached is not None:
                self._answer(attached, server, key.value)
            return
        _check_matches(key, values)
        if self.weights is not None:
            self.weights.push(req, server, key, values, pull)
            if attached is not None:
                self._serve_attached(attached, server, lambda: self.pull(attached, server, key))
            return
        r = key.rounds.begin_push(req.sender, claimed_round(req))
        if pull:
            self.pull(req, server, key)
        else:
            self._ack_push(req, server, values.nbytes)
        if attached is not None:
            self._serve_attached(attached, server, lambda: self.pull(attached, server, key))
        self.summing.submit(key.thread, lambda: self._accumulate(key, r, values))

    def begin_sum(self, req, server, key: _BytePSKey, values: np.ndarray, r: int) -> None:
        """A push of ``key``'s round ``r`` (as claimed): counted, acknowledged, summed."""
        r = key.rounds.begin_push(req.sender, r)
        self._ack_push(req, server, values.nbytes)
        self.summing.submit(key.thread, lambda: self._accumulate(key, r, values))

    def _serve_attached(self, attached, server, serve: Callable[[], None]) -> None:
        """Run ``serve`` for a pull that rode along with a push already acknowledged: a
        refusal must answer the pull (the push has its answer)."""
        try:
            serve()
        except ProtocolError as exc:
            self.refuse(attached, server, str(exc))

    def pull(self, req, server, key: _BytePSKey) -> None:
        """A pull of ``key``: answered when its round is summed (or as the weights' path
        says)."""
        if self.weights is not None:
            self.weights.pull(req.sender, (req, server), key)
            return
        ready = key.rounds.request_pull(req.sender, (req, server))
        if ready is not None:
            self._answer(req, server, ready)

    def _key_for_push(self, ps_key: int, values: np.ndarray):
        """(key state, whether ``values`` just initialised it)."""
        with self._keys_lock:
            key = self._keys.get(ps_key)
            if key is not None:
                return key, False
            initial = self._initial_value(ps_key)
            if initial is None and self.restart.epoch:
                # a first push here would be taken as the key's initial value: a wrong sum
                raise ProtocolError("BytePS push of ps key %d, which no worker's recovery "
                                    "report named" % ps_key)
            key = self._init_key(ps_key, values if initial is None else initial)
            self._keys[ps_key] = key
            return key, initial is None

    def _initial_value(self, ps_key: int) -> Optional[np.ndarray]:
        """The value a default-type push stored for ``ps_key``, if there was one."""
        with self._lock:
            entry = self._store.get(ps_key)
        if isinstance(entry, Entry) and entry.kind is StorageKind.DENSE:
            return entry.value
        return None

    def _init_key(self, ps_key: int, values: np.ndarray) -> _BytePSKey:
        rounds = (KeyRounds(ps_key, self.num_workers, values.size, values.dtype)
                  if self.weights is None else self.weights.new_rounds(ps_key, values))
        thread = self.summing.bind(values.nbytes)
        self.expect_pushes(ps_key, values.nbytes)
        log.debug("BytePS key %d: %d bytes of %s on summing thread %d", ps_key, values.nbytes,
                  values.dtype, thread)
        return _BytePSKey(ps_key, values.dtype, publish(values.copy()), values.size, thread,
                          rounds)

    def _known(self, ps_key: int, cmd: Cmd) -> _BytePSKey:
        key = self._keys.get(ps_key)
        if key is None:
            raise ProtocolError("BytePS pull of key %d, which was never initialised" % ps_key)
        if cmd.dtype != key.dtype:
            raise ProtocolError("key %d holds %s, pull asks for %s"
                                % (ps_key, key.dtype, cmd.dtype))
        return key

    # -- batches of small keys (one request for many keys of one server) ------------------------
    def _handle_byteps_batch(self, req, server, cmd: Cmd, attached=None) -> None:
        """A push or a pull of several already initialised keys: the worker's batching of small
        partitions. A push is checked whole before any key counts it, then acked once; a pull
        is answered once, when every key's round is complete, with keys, vals and lens."""
        push, pull = req.meta.push, req.meta.pull
        if push == pull:
            raise ProtocolError("a BytePS request of %d keys must be a push or a pull, not both"
                                % len(req.keys))
        keys = [self.key_of(int(k), cmd) for k in req.keys]
        if push:
            self._push_batch(req, server, keys, split_values(req, cmd, len(keys)))
            if attached is not None:
                self._serve_attached(attached, server,
                                     lambda: self._pull_batch(attached, server, keys))
            return
        self._pull_batch(req, server, keys)

    def _pull_batch(self, req, server, keys) -> None:
        batch = BatchAnswer(req, server, len(keys), self.send_answer)
        for index, key in enumerate(keys):
            if self.weights is not None:
                self.weights.pull(req.sender, batch.slot(index), key)
                continue
            ready = key.rounds.request_pull(req.sender, batch.slot(index))
            if ready is not None:
                batch.fill(index, ready)

    def key_of(self, ps_key: int, cmd: Cmd) -> _BytePSKey:
        """A key of a batch or a compressed request: known, or initialised earlier by a
        default-type push."""
        with self._keys_lock:
            if ps_key not in self._keys:
                initial = self._initial_value(ps_key)
                if initial is not None:
                    self._keys[ps_key] = self._init_key(ps_key, initial)
        return self._known(ps_key, cmd)

    def _push_batch(self, req, server, keys, values) -> None:
        for key, part in zip(keys, values):
            _check_matches(key, part)
        if self.weights is not None:
            self.weights.push_batch(req, server, keys, values)
            return
        for key, part in zip(keys, values):
            r = key.rounds.begin_push(req.sender)
            self.summing.submit(key.thread, lambda k=key, r=r, v=part: self._accumulate(k, r, v))
        self._ack_push(req, server, sum(part.nbytes for part in values))

    def _ack_push(self, req, server, nbytes: int) -> None:
        """Acknowledge a round push now, or (pacing on) once the other workers caught up."""
        self.acks.ack(req.sender, nbytes, lambda: self.send_answer(server, req))

    # -- summing tasks ----------------------------------------------------------------------
    def _accumulate(self, key: _BytePSKey, r: int, values: np.ndarray) -> None:
        tokens, total = key.rounds.accumulate(r, values)
        for token in tokens:
            self.deliver(token, total)

    def deliver(self, token, value: np.ndarray) -> None:
        """Answer a pull token (``(req, server)`` or a batch's slot) with ``value``."""
        if isinstance(token, BatchSlot):
            token.fill(value)
        else:
            req, server = token
            self._answer(req, server, value)

    def fail(self, token, message: str, quiet: bool = False) -> None:
        """Answer a pull token with an error (a batch once, for all its slots); logged unless
        ``quiet`` (an answer that is no failure: the training is over)."""
        if isinstance(token, BatchSlot):
            token.batch.fail(message)
        elif quiet:
            self.send_answer(token[1], token[0], error=message)
        else:
            req, server = token
            self.refuse(req, server, message)

    def _answer(self, req, server, value: np.ndarray) -> None:
        if req.meta.head in COMPRESSED_HEADS:      # every answer passes here: no decoding
            value = self.compressed.answer_value(req, value)
        lens = np.array([value.nbytes], dtype=np.int32)
        self.send_answer(server, req, keys=req.keys, vals=value, lens=lens)


def _check_matches(key: _BytePSKey, values: np.ndarray) -> None:
    if values.dtype != key.dtype or values.size != key.size:
        raise ProtocolError("key %d holds %d x %s, push has %d x %s"
                            % (key.ps_key, key.size, key.dtype, values.size, values.dtype))

