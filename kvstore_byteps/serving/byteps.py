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
* each key's pushes and pulls go to the server's data path, chosen once from the training
  mode (:mod:`.datapath`): summed rounds (sync, the default, :mod:`.summed`: a pull is
  answered with the round's sum once every worker's push of it is summed; a pushpull gets one
  answer, with the sum; a pull may ride along with its push under its own timestamp,
  ``pull_timestamp``), or the weights kept on the server (``BYTEPS_ENABLE_ASYNC=1``:
  :mod:`.asynchronous`; ``BYTEPS_BACKUP_WORKERS``: :mod:`.backup`);
* a default-type (cmd 0/2/5) pull of a BytePS key returns its initial value (sync) or the
  current weights (async, backup); with ``await_init`` it waits for the key's initialising
  push.

Plugged in: the compressed path (request type 4, :mod:`.compressed`), and, on a server
restarted in place of a dead one (:meth:`BytePSServer.begin_recovery`), a filter in front that
drops requests meant for the dead process and holds the rest until every worker's report
rebuilt the keys' rounds (:mod:`.recovery_filter`).
"""
from typing import Callable, Dict, Optional

import numpy as np

from ..config import Config, Training, TrainingMode
from ..config.training import BACKUP_WAIT_PERCENT
from ..errors import ConfigError, ProtocolError
from ..mxproto import PROBE_ANSWER, SERVER_DTYPES, Cmd, RequestType, ServerCommand, encode_cmd
from ..van.wire.keys import row_sparse_key
from .asynchronous import AsyncAdds
from .awaiting import InitWaits
from .backup import BackupWorkers
from .batch import BatchAnswer, split_values
from .compressed import COMPRESSED_HEADS, CompressedPath
from .datapath import Answers, DataPath
from .dist import KVStoreDistServer
from .keys import KeyTable, check_matches
from .joins import JOIN_COMMANDS, JoinBoard
from .layout_board import LayoutBoard
from .protocol import parse_dense
from .recovery_filter import NoRecovery, RecoveryFilter
from .riding import attached_pull, why_no_riding_pull
from .store import Entry, StorageKind
from .summed import SummedRounds
from .summing import SumThreads
from .updater import Updater, load_mxnet_updater

__all__ = ["BytePSServer"]

#: Request heads of the plain BytePS path (request type 3, any server dtype).
_BYTEPS_HEADS = frozenset(encode_cmd(RequestType.BYTEPS, dtype)
                          for dtype in SERVER_DTYPES.values())
#: the workers' commands about themselves, which the data path may answer
_WORKER_COMMANDS = (ServerCommand.BYTEPS_ABSENT, ServerCommand.BYTEPS_STALE,
                    ServerCommand.BYTEPS_WAITING) + JOIN_COMMANDS


#: each training mode's data path, built with (answers, mode, pacing: see SummedRounds)
_DATA_PATHS = {
    Training.SYNC: lambda answers, mode, pacing: SummedRounds(answers, pacing),
    Training.ASYNC: lambda answers, mode, pacing: AsyncAdds(answers),
    Training.BACKUP_WORKERS: lambda answers, mode, pacing: BackupWorkers(
        answers, mode.backup_workers, mode.backup_wait / 100.0),
}


class BytePSServer(KVStoreDistServer):
    """KVStoreDistServer plus the BytePS data path. Call :meth:`close` to stop its threads."""

    def __init__(self, num_workers: int, key_begin: int = 0, summing_threads: int = 4,
                 enable_async: bool = False, backup_workers: int = 0,
                 updater_loader: Callable[[bytes], Updater] = load_mxnet_updater,
                 pacing_lead_bytes: Optional[int] = None, pacing_hold_s: float = 0.2,
                 expect_pushes: Callable[[int, int], None] = lambda ps_key, nbytes: None,
                 seats: int = 0, backup_wait: int = BACKUP_WAIT_PERCENT):
        super().__init__(num_workers, key_begin, updater_loader, seats)
        self.summing = SumThreads(summing_threads)
        #: what the data path may do here: answer, sum, read the optimizer
        self._answers = answers = Answers(
            num_workers, self.summing, self.profiler.timed, self.send_answer, self.refuse,
            self._answer, lambda: self.updater, self.mxnet_key, self.departed, self.seats)
        #: how this server trains (the probe refuses workers that train otherwise)
        self.mode = TrainingMode.of(enable_async, backup_workers, backup_wait)
        #: the training mode's data path: summed rounds, or the weights kept here
        self.path: DataPath = _DATA_PATHS[self.mode.kind](
            answers, self.mode,
            None if pacing_lead_bytes is None else (pacing_lead_bytes, pacing_hold_s))
        # expect_pushes is called with (ps key, bytes per push) when a key is initialised, so
        # a receive-into-place van can set up the buffers its pushes will land in
        self.keys = KeyTable(self.path.new_rounds, self.summing, self._initial_value,
                             lambda: bool(self.recovery.epoch), expect_pushes)
        self._keys = self.keys.by_ps_key
        #: the dist_byteps workers' compressed path (``compression`` is MXNet's 2-bit)
        self.compressed = CompressedPath(self.keys, self.path)
        #: in front of every request: a filter once this server replaced a dead one
        self.recovery: NoRecovery = NoRecovery()
        #: default pulls (req, server, cmd) that wait for their key's initialising push
        self._init_waits = InitWaits(self._lock, lambda ps_key: ps_key in self._store)
        #: the partition layout rank 0 chose at start (BYTEPS_LAYOUT), as it sent it
        self.layout = LayoutBoard()
        #: a dist_byteps worker probed this server (MXNet's workers never do)
        self._probed = False
        #: elastic workers' joins (server rank 0's is the one asked)
        self.joins = JoinBoard(lambda: self.updater is not None)

    @classmethod
    def from_config(cls, config: Config, num_workers: int,
                    expect_pushes: Callable[[int, int], None] = lambda ps_key, nbytes: None
                    ) -> "BytePSServer":
        """The server ``config`` describes for ``num_workers``, not yet attached."""
        return cls(num_workers, summing_threads=config.server_summing_threads,
                   enable_async=config.enable_async, backup_workers=config.backup_workers,
                   backup_wait=config.training_mode.backup_wait,
                   pacing_lead_bytes=config.server_pacing_bytes or None,
                   pacing_hold_s=config.server_pacing_hold_ms / 1000.0,
                   expect_pushes=expect_pushes, seats=config.worker_seats)

    @property
    def acks(self):
        """How round pushes are acknowledged: at once, or paced (summed rounds; pacing.py)."""
        return self.path.acks

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
                # rounds that do not wait for one worker (the servers' weights)
                ServerCommand.BYTEPS_WAITING: lambda body: b"",
                ServerCommand.BYTEPS_COMPRESSION: lambda body: self.compressed.set_spec(body),
                ServerCommand.BYTEPS_LAYOUT: lambda body: self.layout.command(body)}

    def _probe(self, body: bytes) -> bytes:
        """Which server this is; a worker says how it trains (``Config.training_mode``), and
        one that trains otherwise than this server is refused (sums taken for weights, or
        weights for sums, would be silently wrong)."""
        said = body.decode("utf-8", "replace") if body else None
        if said is not None and TrainingMode.parse(said) != self.mode:
            raise ConfigError("this server trains %s, the worker %s: set BYTEPS_ENABLE_ASYNC "
                                "and BYTEPS_BACKUP_WORKERS alike on every node"
                                % (self.mode.name, said))
        self._probed = True
        return PROBE_ANSWER

    def optimizer_index(self, ps_key: int, entry) -> int:
        """A dist_byteps worker's row_sparse range (local key ``(key << 16) | index``,
        engine/sparse.py) is updated under ``-1 - local``, its own optimizer state, with the
        learning-rate and weight-decay multipliers of its MXNet key, as a dense key's
        partitions are (datapath.py); MXNet's workers' keys as MXNet's server does."""
        local = self.mxnet_key(ps_key)
        owner = (row_sparse_key(local)
                 if self._probed and entry.kind is StorageKind.ROW_SPARSE else None)
        if owner is None:
            return local
        alias = getattr(self.updater, "alias", None)
        if alias is not None:
            alias(-1 - local, owner)
        return -1 - local

    def depart(self, sender: int) -> None:
        super().depart(sender)          # elastic workers: no round waits for it any more
        self.path.depart(sender, self.keys.all())
        self.joins.depart(sender)

    # -- restarted server ---------------------------------------------------------------------
    def begin_recovery(self, epoch: int, deadline: float) -> None:
        """This server took over a dead one's id (its ``epoch``-th restart): hold every request
        until all workers' reports arrived, before monotonic time ``deadline``."""
        self.recovery = RecoveryFilter(self, epoch, deadline)

    def recover_keys(self, restored: Dict[int, tuple]) -> None:
        """The keys as the workers' reports rebuilt them: ps key -> (dtype, bytes, rounds)."""
        self.keys.recover(restored)

    def handles_quickly(self, meta) -> bool:
        """Whether a KV request with ``meta`` is handled without waiting: a plain BytePS push
        or pull on a data path that only counts, queues sums and answers (``DataPath.quick``),
        while no recovery holds requests."""
        return (meta.head in _BYTEPS_HEADS and self.path.quick and not meta.simple_app
                and not self.recovery.recovering)

    def handle_request(self, req, server) -> None:
        if not self.recovery.admit(req, server, is_command=False):
            return
        extra = req.meta.extra
        if extra and "pull_timestamp" in extra:
            why_not = why_no_riding_pull(req, _BYTEPS_HEADS, self.path)
            if why_not:    # the pull would never be answered: say so now instead
                self.refuse(req, server, why_not)
                return
        super().handle_request(req, server)

    def handle_command(self, req, server) -> None:
        if not self.recovery.admit(req, server, is_command=True):
            return
        head = req.meta.head
        if head in _WORKER_COMMANDS and self.is_worker(req.sender):
            try:
                body = bytes(req.meta.body or b"")
                answer = (self.joins.handle(head, req.sender, body,
                                            lambda s: self.path.admit(s, self.keys.all()))
                          if head in JOIN_COMMANDS else
                          self.path.worker_command(head, req.sender, body, self.keys.all()))
            except ProtocolError as exc:
                self.refuse(req, server, str(exc))
                return
            if answer is not None:
                self.send_answer(server, req, body=answer)
                return
        super().handle_command(req, server)

    def _unexpected_report(self, req, server, cmd: Cmd) -> None:
        raise ProtocolError("a recovery report, but this server is not waiting for one (it "
                            "was not restarted, or every worker reported already)")

    def close(self, timeout: float = 10.0) -> None:
        """Finish queued summations and stop the summing threads (and the pacing thread)."""
        self.acks.close()
        self.summing.close(timeout)
        self.path.close(self._keys.values())
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
            self.path.pull(req.sender, (req, server), self.keys.known(parsed.ps_key, cmd))

    def _handle_default(self, req, server, cmd: Cmd) -> None:
        """MXNet's default requests; a pull of a BytePS key reads its initial value, and a pull
        with ``await_init`` (a worker declaring a tensor in any order) waits for the key's
        initialising push instead of being refused."""
        one_key = req.keys is not None and len(req.keys) == 1
        if not req.meta.push and one_key:
            key = self.keys.get(int(req.keys[0]))
            if key is not None:
                if key.value is None:
                    raise ProtocolError("key %d: its initial value was lost when this server "
                                        "was restarted (only the rounds in flight were "
                                        "restored)" % key.ps_key)
                self.path.note_read(req.sender, key)    # which weights the worker holds now
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
        key, initialised_now = self.keys.for_push(ps_key, values)
        if initialised_now:   # this push was the initialisation: acked (or read back) at once
            if pull:
                self._answer(req, server, key.value)
            else:
                self.send_answer(server, req)
            if attached is not None:
                self._answer(attached, server, key.value)
            return
        check_matches(key, values)
        self.path.push(req, server, key, values, pull, attached)

    def _initial_value(self, ps_key: int) -> Optional[np.ndarray]:
        """The value a default-type push stored for ``ps_key``, if there was one."""
        with self._lock:
            entry = self._store.get(ps_key)
        if isinstance(entry, Entry) and entry.kind is StorageKind.DENSE:
            return entry.value
        return None

    # -- batches of small keys (one request for many keys of one server) ------------------------
    def _handle_byteps_batch(self, req, server, cmd: Cmd, attached=None) -> None:
        """A push or a pull of several already initialised keys: the worker's batching of small
        partitions. A push is checked whole before any key counts it, then acked once; a pull
        is answered once, when every key's round is complete, with keys, vals and lens."""
        push, pull = req.meta.push, req.meta.pull
        if push == pull:
            raise ProtocolError("a BytePS request of %d keys must be a push or a pull, not both"
                                % len(req.keys))
        keys = [self.keys.key_of(int(k), cmd) for k in req.keys]
        if push:
            values = split_values(req, cmd, len(keys))
            for key, part in zip(keys, values):
                check_matches(key, part)
            self.path.push_batch(req, server, keys, values)
            if attached is not None:
                self._answers.serve_attached(attached, server,
                                             lambda: self._pull_batch(attached, server, keys))
            return
        self._pull_batch(req, server, keys)

    def _pull_batch(self, req, server, keys) -> None:
        batch = BatchAnswer(req, server, len(keys), self.send_answer)
        for index, key in enumerate(keys):
            self.path.pull(req.sender, batch.slot(index), key)

    def _answer(self, req, server, value: np.ndarray) -> None:
        if req.meta.head in COMPRESSED_HEADS:      # every answer passes here: no decoding
            value = self.compressed.answer_value(req, value)
        lens = np.array([value.nbytes], dtype=np.int32)
        self.send_answer(server, req, keys=req.keys, vals=value, lens=lens)
