"""KVStoreDistServer: the behaviour of MXNet 1.9.1's C++ parameter server, in Python.

Driven by two callbacks of the KV layer (``handle_request`` / ``handle_command``, each given
the request and an object with ``respond(req, keys=None, vals=None, lens=None, error=None)``),
so it is tested with a fake responder and no sockets. Semantics (docs/pslite-wire.md §5.3-5.6):

* the first push of a key initialises it (a 1-D array in the pushed dtype) and is acked at once;
* sync mode (after kSyncMode): pushes of a round are summed until ``num_workers`` of them
  arrived (counted per key, not per worker, as upstream); then stored = the sum, or
  ``updater(key, sum, stored)`` once an optimizer was sent; then every push of the round is
  answered, pushpulls with that round's value;
* async mode: each push goes through the updater at once (no updater: error answer);
* pulls are never deferred: answered at once from the store, lens in bytes (row_sparse: lens in
  elements, ``[0, unit_len, ...]``);
* kController / kSetMultiPrecision / kStopServer / kSyncMode / kSetGradientCompression /
  kSetProfilerParams as upstream, each answered after it was handled. ``BYTEPS_PROBE`` gets
  upstream's empty answer to an unknown command here, ``PROBE_ANSWER`` from :class:`BytePSServer`.

Where upstream aborts the process on bad input (unknown key, wrong lens, unsupported dtype, a bad
pickle ...) this server answers the request with an error and keeps serving.
"""
import logging
import threading
from typing import Callable, Optional

import numpy as np

from ..errors import CONFIG_REFUSAL, ConfigError, PeerError, ProtocolError, config_refusal
from ..logs import PeerLog
from ..compress.twobit import GradientCompression, dequantize_2bit, packed_nbytes_2bit, \
    parse_twobit_params
from ..mxproto import Cmd, RequestType, ServerCommand, decode_cmd
from .following import FollowingPulls
from .profiler import ServerProfiler
from .protocol import CompressedPush, parse_compressed, parse_dense, parse_row_sparse
from .rounds import Departed
from .store import Entry, StorageKind, check_rows, dense_rows
from .updater import RowSparseGrad, Updater, load_mxnet_updater
from ..van.wire.message import id_to_rank, is_worker_id, worker_rank_to_id

__all__ = ["KVStoreDistServer"]

log = logging.getLogger(__name__)

#: commands MXNet's own workers send; they ignore error answers, so a refusal of rank 0's
#: (MXNet's workers all send the same) ends the job instead of training wrongly in silence
_MXNET_COMMANDS = frozenset({ServerCommand.CONTROLLER, ServerCommand.SET_MULTI_PRECISION,
                             ServerCommand.SYNC_MODE, ServerCommand.SET_GRADIENT_COMPRESSION,
                             ServerCommand.SET_PROFILER_PARAMS})


class KVStoreDistServer:
    """MXNet's server semantics. ``handle_request``/``handle_command`` are thread-safe."""

    def __init__(self, num_workers: int, key_begin: int = 0,
                 updater_loader: Callable[[bytes], Updater] = load_mxnet_updater, seats: int = 0):
        """``key_begin``: start of this server's key range (ps key - key_begin = MXNet's key);
        ``seats``: BYTEPS_MAX_WORKERS (those beyond ``num_workers`` start vacant, departed)."""
        if num_workers < 1:
            raise ValueError("num_workers must be positive, got %r" % num_workers)
        self.num_workers = num_workers
        self.seats = max(seats, num_workers)
        self.key_begin = key_begin
        self.sync_mode = False
        self.multi_precision = False
        self.compression = GradientCompression()
        self.updater: Optional[Updater] = None
        #: why the last optimizer a worker sent was refused (None: none was refused)
        self.refused_optimizer: Optional[str] = None
        #: why this server must end the job (a refused command of MXNet's worker rank 0);
        #: the process serving it passes it to the scheduler (server.py)
        self.job_error: Optional[str] = None
        self._refused_config = False       # a worker's configuration was refused and logged
        self._load_updater = updater_loader
        self._lock = threading.RLock()
        self._peer_log = PeerLog(log)
        self._store = {}
        self.departed = Departed(worker_rank_to_id(r) for r in range(num_workers, self.seats))
        #: row_sparse pulls held until the round of the push they follow is done
        self._following = FollowingPulls()
        #: MXNet's server profiling (kSetProfilerParams): this server's stages, as a trace
        self.profiler = ServerProfiler()
        #: the updater's calls, as stages of the profile
        self._update = self.profiler.timed(
            "update", self._run_update, lambda key, grad, entry: ("update key %d" % key, None))
        self._stopped = threading.Event()
        self._done = threading.Event()       # stopped, or the job must end (job_error)
        self._handlers = self.request_handlers()
        self._commands = self.command_handlers()

    def request_handlers(self) -> dict:
        """Request type -> ``handler(req, server, cmd)``: MXNet's three (a subclass adds)."""
        return {RequestType.DEFAULT: self._handle_default,
                RequestType.ROW_SPARSE: self._handle_row_sparse,
                RequestType.COMPRESSED: self._handle_compressed}

    def command_handlers(self) -> dict:
        """Command -> ``handler(body)`` returning the answer's body (None: empty)."""
        return {ServerCommand.CONTROLLER: self._cmd_controller,
                ServerCommand.SET_MULTI_PRECISION: self._cmd_multi_precision,
                ServerCommand.STOP_SERVER: lambda body: None,
                ServerCommand.SYNC_MODE: self._cmd_sync_mode,
                ServerCommand.SET_GRADIENT_COMPRESSION: self._cmd_compression,
                ServerCommand.SET_PROFILER_PARAMS: self._cmd_profiler,
                # what upstream answers to a command it does not know: an empty body
                ServerCommand.BYTEPS_PROBE: lambda body: b""}

    # -- transport-facing callbacks --------------------------------------------------------
    def handle_request(self, req, server) -> None:
        """A KV request from a worker; answered now, at the end of its round, or with an error."""
        try:
            if not self.is_worker(req.sender):
                # a stranger's push would be summed into every worker's round
                raise ProtocolError("node %s is not a worker of this cluster" % req.sender)
            cmd = decode_cmd(req.meta.head)
            handler = self._handlers.get(cmd.request_type)
            if handler is None:
                raise ProtocolError("request type %d (%s) is not served by %s (BytePS "
                                    "request types need BytePSServer)"
                                    % (cmd.request_type, cmd.request_type.name,
                                       type(self).__name__))
            handler(req, server, cmd)
        except ProtocolError as exc:
            self.refuse(req, server, str(exc))
        except Exception as exc:  # a bug or a failing updater must not take the server down
            self._peer_log.warning(req.sender, "request from node %s failed", req.sender,
                                   exc_info=True)
            self.refuse(req, server, "server error: %s: %s" % (type(exc).__name__, exc))

    def is_worker(self, node_id: int) -> bool:
        """Whether ``node_id`` is one of the cluster's worker ids (9, 11, ...: ps-lite's)."""
        return is_worker_id(node_id) and id_to_rank(node_id) < self.seats

    def handle_command(self, req, server) -> None:
        """A SimpleApp command; answered after it was handled (kStopServer then stops)."""
        error, body = None, None
        try:
            command = _command_of(req.meta.head)
            if command == ServerCommand.STOP_SERVER and not self.is_worker(req.sender):
                # without authentication anyone reaching the port could stop the job
                raise ProtocolError("kStopServer refused: node %s is not a worker of this "
                                    "cluster" % req.sender)
            with self._lock:
                handler = self._commands.get(command)
                if handler is None:
                    raise ProtocolError("command %s is not served by %s"
                                        % (command.name, type(self).__name__))
                body = handler(bytes(req.meta.body or b""))
        except ProtocolError as exc:
            error = str(exc)
        except ConfigError as exc:    # the worker's configuration: it stops, saying why
            error = config_refusal(str(exc))
            self._refused_configuration(req.sender, str(exc))
        except Exception as exc:
            log.exception("command %d from node %s failed", req.meta.head, req.sender)
            error = "server error: %s: %s" % (type(exc).__name__, exc)
        if error is not None and req.meta.head in _MXNET_COMMANDS and \
                req.sender == worker_rank_to_id(0):
            self._refused_rank0(ServerCommand(req.meta.head), error)
        elif error is not None and not error.startswith(CONFIG_REFUSAL):
            self._peer_log.warning(req.sender, "command %s from node %s refused: %s",
                                   req.meta.head, req.sender, error)
        self.send_answer(server, req, error=error, body=body or b"")
        if error is None and req.meta.head == ServerCommand.STOP_SERVER:
            self._stopped.set()
            self._done.set()

    def _refused_configuration(self, sender, why: str) -> None:
        """One line per server, for the first worker refused (each worker says it too)."""
        with self._lock:
            first, self._refused_config = not self._refused_config, True
        if first:
            log.error("node %s's configuration refused: %s", sender, why)

    def _refused_rank0(self, command: ServerCommand, error: str) -> None:
        """MXNet's workers ignore error answers: a refused command of theirs ends the job;
        until then the rounds' pushes are refused (_add_to_round), so no sum becomes weights."""
        what = "optimizer" if command == ServerCommand.CONTROLLER else command.name
        with self._lock:
            if command == ServerCommand.CONTROLLER:
                self.updater, self.refused_optimizer = None, error
            self.job_error = self.job_error or (
                "the server refused the %s sent by worker rank 0 (%s); MXNet's workers do not "
                "see such refusals, so the job cannot go on" % (what, error))
        log.error("%s", self.job_error)
        self._done.set()

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()

    def wait_stopped(self, timeout: Optional[float] = None) -> bool:
        """Wait for kStopServer; True if it came within ``timeout`` seconds."""
        return self._stopped.wait(timeout)

    def wait_done(self, timeout: Optional[float] = None) -> bool:
        """Wait for kStopServer or a reason to end the job (``job_error``); True if either
        came within ``timeout`` seconds."""
        return self._done.wait(timeout)

    def close(self) -> None:
        """Write what the profiler holds (subclasses also stop their threads)."""
        self.profiler.close()

    # -- commands ---------------------------------------------------------------------------
    def _cmd_controller(self, body: bytes) -> None:
        self.updater = self._load_updater(body)
        self.refused_optimizer = None
        log.info("optimizer installed: %s", type(getattr(self.updater, "optimizer",
                                                         self.updater)))

    def _cmd_multi_precision(self, body: bytes) -> None:
        log.info("multi-precision: float32 master copies for float16/float64 keys")
        self.multi_precision = True
        for entry in self._store.values():
            if isinstance(entry, Entry):
                entry.enable_master()

    def _cmd_sync_mode(self, body: bytes) -> None:
        self.sync_mode = True

    def _cmd_compression(self, body: bytes) -> None:
        self.compression = parse_twobit_params(body)
        log.info("gradient compression: %s", self.compression)

    def _cmd_profiler(self, body: bytes) -> None:
        self.profiler.command(body)

    # -- request types ----------------------------------------------------------------------
    def _handle_default(self, req, server, cmd: Cmd) -> None:
        parsed = parse_dense(req, cmd)
        with self._lock:
            if parsed.push:
                self._push_dense(req, server, parsed.ps_key, parsed.values, parsed.pull)
            else:
                self._answer_dense(req, server, self._entry(parsed.ps_key, StorageKind.DENSE), cmd)

    def _handle_compressed(self, req, server, cmd: Cmd) -> None:
        if not self.compression.enabled:
            raise ProtocolError("compressed request before kSetGradientCompression")
        parsed = parse_compressed(req, cmd, self.key_begin, packed_nbytes_2bit)
        with self._lock:
            if isinstance(parsed, CompressedPush):
                values = dequantize_2bit(parsed.packed, parsed.original_size,
                                         self.compression.threshold)
                self._push_dense(req, server, parsed.ps_key, values, parsed.pull)
            else:
                self._answer_dense(req, server, self._entry(parsed.ps_key, StorageKind.DENSE), cmd)

    def _handle_row_sparse(self, req, server, cmd: Cmd) -> None:
        parsed = parse_row_sparse(req, cmd)
        with self._lock:
            if parsed.push:
                self._push_rows(req, server, parsed)
                return
            after = (req.meta.extra or {}).get("after_push")
            if after is not None and not self._following.due(parsed.master_key, req.sender,
                                                              after):
                self._following.hold(parsed.master_key, req.sender, after, lambda: (
                    self._answer_rows_or_refuse(req, server, parsed.master_key, parsed.rows)))
                return
            self._answer_rows(req, server, parsed.master_key, parsed.rows)

    # -- pushes -----------------------------------------------------------------------------
    def _push_dense(self, req, server, ps_key: int, values: np.ndarray, pull: bool) -> None:
        entry = self._store.get(ps_key)
        if entry is None:
            entry = Entry.create(StorageKind.DENSE, values, self.multi_precision)
            self._store[ps_key] = entry
            self._reply(req, server, entry)
            return
        entry.check_push(StorageKind.DENSE, values.dtype, ps_key)
        if self.sync_mode:
            entry.merge_dense(values, ps_key)
            self._add_to_round(req, server, ps_key, entry)
        else:
            if values.size != entry.value.size:
                raise ProtocolError("key %d holds %d values, push has %d"
                                    % (ps_key, entry.value.size, values.size))
            self._update_async(ps_key, entry, values)
            self._reply(req, server, entry)

    def _push_rows(self, req, server, parsed) -> None:
        key, rows, values = parsed.master_key, parsed.rows, parsed.values
        entry = self._store.get(key)
        if entry is None:
            self._store[key] = entry = _init_rows(key, rows, values, self.multi_precision)
            self._reply(req, server, entry)
            self._round_done(key, [(req, server)])
            return
        if values is not None:
            entry.check_push(StorageKind.ROW_SPARSE, values.dtype, key)
        if self.sync_mode:
            entry.merge_rows(rows, values, key)
            self._add_to_round(req, server, key, entry)
        else:
            if values is not None:
                check_rows(rows, values.shape[1], entry.shape, key)
                grad = RowSparseGrad(rows, values, entry.shape)
                self._update_async(key, entry, grad)
            self._reply(req, server, entry)

    def _add_to_round(self, req, server, ps_key: int, entry: Entry) -> None:
        entry.join_round(req, server, self.departed.ids)
        self._close_if_complete(ps_key, entry)

    def _close_if_complete(self, ps_key: int, entry: Entry) -> None:
        """Close the key's round once every worker still in the job pushed it (locked)."""
        if not entry.round_complete(self.seats, self.departed.ids):
            return
        grad, waiting = entry.take_round(self.num_workers)
        self._close_round(ps_key, entry, grad, waiting)
        if entry.kind is StorageKind.ROW_SPARSE:    # refused or not: the pulls that follow
            self._round_done(ps_key, waiting)

    def depart(self, sender: int) -> None:
        """Worker ``sender`` left the job (elastic workers): no round waits for it."""
        with self._lock:
            self.departed.add(sender)
            for ps_key, entry in list(self._store.items()) if self.sync_mode else ():
                self._close_if_complete(ps_key, entry)

    def _close_round(self, ps_key: int, entry: Entry, grad, waiting: list) -> None:
        if self.updater is None and self.refused_optimizer is not None:
            for waiting_req, waiting_server in waiting:
                self.refuse(waiting_req, waiting_server,
                             "push of key %d refused: this server refused the optimizer (%s), "
                             "and storing the summed gradients as the weights would train "
                             "wrongly" % (self.mxnet_key(ps_key), self.refused_optimizer))
            return
        try:
            if self.updater is not None:
                self._update(self.optimizer_index(ps_key, entry), grad, entry)
            else:
                entry.set_working(dense_rows(grad) if isinstance(grad, RowSparseGrad) else grad)
        except Exception as exc:
            log.exception("update of key %d failed", ps_key)
            for waiting_req, waiting_server in waiting:
                self.refuse(waiting_req, waiting_server, "update of key %d failed: %s"
                             % (ps_key, exc))
            return
        for waiting_req, waiting_server in waiting:
            self._reply(waiting_req, waiting_server, entry)

    def _round_done(self, ps_key: int, pushes: list) -> None:
        """Answer the row_sparse pulls that followed ``pushes`` (following.py)."""
        for answer in self._following.round_done(
                ps_key, [(req.sender, req.meta.timestamp) for req, _ in pushes]):
            answer()

    def _answer_rows_or_refuse(self, req, server, master_key: int, rows: np.ndarray) -> None:
        try:
            self._answer_rows(req, server, master_key, rows)
        except ProtocolError as exc:
            self.refuse(req, server, str(exc))

    def _update_async(self, ps_key: int, entry: Entry, grad) -> None:
        if self.updater is None:
            raise ProtocolError("async mode needs an optimizer on the server (kv.set_optimizer) "
                                "before pushes to key %d" % ps_key)
        self._update(self.optimizer_index(ps_key, entry), grad, entry)

    def _run_update(self, key: int, grad, entry: Entry) -> None:
        """The updater on ``entry``: a row_sparse sum in place on the table the updater keeps,
        if it keeps one; otherwise on the working array, replaced by what the updater returns."""
        update_rows = getattr(self.updater, "update_rows", None)
        if update_rows is not None and isinstance(grad, RowSparseGrad):
            update_rows(key, grad, entry.adopt(self.updater.table))
        else:
            entry.set_working(self.updater(key, grad, entry.working))

    # -- answers ----------------------------------------------------------------------------
    def _entry(self, ps_key: int, kind: StorageKind) -> Entry:
        entry = self._store.get(ps_key)
        if entry is None:
            raise ProtocolError("pull of key %d (MXNet key %d), which was never initialised"
                                % (ps_key, self.mxnet_key(ps_key)))
        if not isinstance(entry, Entry) or entry.kind is not kind:
            raise ProtocolError("key %d does not hold %s data" % (ps_key, kind.value))
        return entry

    def _reply(self, req, server, entry: Entry) -> None:
        """Ack a push; a request that also pulls gets the value published right now."""
        if not req.meta.pull:
            self.send_answer(server, req)
        elif entry.kind is StorageKind.ROW_SPARSE:
            rows = (req.keys[1:] - req.keys[0]).astype(np.int64)
            self._answer_rows(req, server, int(req.keys[0]), rows)
        else:
            self._answer_dense(req, server, entry, None)

    def _answer_dense(self, req, server, entry: Entry, cmd: Optional[Cmd]) -> None:
        value = entry.value
        if cmd is not None and cmd.dtype != value.dtype:
            value = value.astype(cmd.dtype)  # upstream casts to the requested dtype as well
        lens = np.array([value.nbytes], dtype=np.int32)
        self.send_answer(server, req, keys=req.keys, vals=value, lens=lens)

    def _answer_rows(self, req, server, master_key: int, rows: np.ndarray) -> None:
        if len(rows) == 0:
            lens = np.zeros(len(req.keys), dtype=np.int32)
            self.send_answer(server, req, keys=req.keys, vals=b"", lens=lens)
            return
        entry = self._entry(master_key, StorageKind.ROW_SPARSE)
        unit_len = entry.shape[1]
        check_rows(rows, unit_len, entry.shape, master_key)
        lens = np.full(len(rows) + 1, unit_len, dtype=np.int32)
        lens[0] = 0   # row_sparse answers count elements, not bytes (vector 26)
        self.send_answer(server, req, keys=req.keys, vals=entry.rows(rows), lens=lens)

    def refuse(self, req, server, message: str) -> None:
        self._peer_log.warning(req.sender, "request from node %s refused: %s", req.sender, message)
        self.send_answer(server, req, error=message)

    def send_answer(self, server, req, **kwargs) -> None:
        """Answer ``req``; a failure is logged (once in full per peer, then counted: a worker
        that died mid-round has hundreds of answers coming) and the server goes on."""
        try:
            server.respond(req, **kwargs)
        except (PeerError, ProtocolError) as exc:   # the peer is gone or its link broke
            self._peer_log.warning(("answer", req.sender), "could not answer node %s: %s",
                                   req.sender, exc)
        except Exception:             # a bug: keep its traceback
            self._peer_log.error(("answer", req.sender), "could not answer node %s",
                                 req.sender, exc_info=True)

    def mxnet_key(self, ps_key: int) -> int:
        return ps_key - self.key_begin

    def optimizer_index(self, ps_key: int, entry: Entry) -> int:
        """The index the optimizer updates ``ps_key``'s ``entry`` under: its MXNet key, as
        MXNet's server passes it to its updater."""
        return self.mxnet_key(ps_key)


def _command_of(head: int) -> ServerCommand:
    try:
        return ServerCommand(head)
    except ValueError:
        raise ProtocolError("unknown server command %d" % head) from None


def _init_rows(key: int, rows: np.ndarray, values: Optional[np.ndarray],
               multi_precision: bool) -> Entry:
    """First row_sparse push: the rows make up the stored array (rows absent are zero)."""
    if values is None:
        raise ProtocolError("row_sparse key %d: the initialising push has no rows" % key)
    initial = np.zeros((int(rows.max()) + 1, values.shape[1]), dtype=values.dtype)
    initial[rows] = values
    return Entry.create(StorageKind.ROW_SPARSE, initial, multi_precision)
