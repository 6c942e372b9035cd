"""The ``dist_byteps`` KVStore: MXNet's KVStore API over :class:`kvstore_byteps.engine.worker.WorkerEngine`.

``pushpull`` returns at once: it is an MXNet engine operation that reads the values and writes
the outputs, so MXNet orders later reads of the outputs after it while backward passes, other
keys' communication and the caller's Python go on. What a push, a pull and the optimizer mean
depends on the job's training mode: the store hands them to its mode object, chosen once at
creation (:mod:`mxnet_patch.store_modes`: synchronous rounds of sums that the workers apply,
asynchronous training, backup workers). The worker process's garbage collector settings
(:mod:`mxnet_patch.gc_tuning`) and its leaving the job as the program ends
(:mod:`mxnet_patch.worker_exit`) are made once by the store's constructor.

Registered under ``'dist_byteps'`` in ``KVStoreBase.kv_registry`` by :mod:`mxnet_patch`'s
start-up hook. This module is imported while MXNet itself is still importing (from
``mxnet.kvstore``), so at module level it imports only MXNet modules loaded before
``mxnet.kvstore``, and everything of ours lazily.
"""
import logging

from mxnet import autograd
from mxnet import ndarray as nd
from mxnet.base import MXNetError
from mxnet.kvstore.base import KVStoreBase
from mxnet.kvstore.kvstore import KVStore

__all__ = ["KVStoreBytePS"]

log = logging.getLogger(__name__)


def _per_key(keys, values, what):
    """Pair keys with their values: one value (or device list) per key."""
    if not isinstance(keys, (list, tuple)):
        return [(keys, values)]
    if values is None:
        return [(k, None) for k in keys]
    if not isinstance(values, (list, tuple)) or len(values) != len(keys):
        raise ValueError("%s: %d keys need %d values" % (what, len(keys), len(keys)))
    return list(zip(keys, values))


def _as_list(value):
    return list(value) if isinstance(value, (list, tuple)) else [value]


#: keys whose pull into a row_sparse array was skipped and said so (once a key)
_SKIPS_SAID = set()


def _skipped(key, out, ignore_sparse) -> bool:
    """A pull's row_sparse output: skipped with ``ignore_sparse``, saying so once a key (MXNet
    warns too), else refused (MXNet's)."""
    if not is_sparse(out):
        return False
    if ignore_sparse:
        if key not in _SKIPS_SAID:
            _SKIPS_SAID.add(key)
            log.warning("pull of key %s into a row_sparse array was ignored (ignore_sparse=True, "
                        "as MXNet's stores do): read row_sparse arrays with "
                        "kv.row_sparse_pull(key, out, row_ids) or Module.prepare() with row ids "
                        "(said once a key)", key)
        return True
    raise MXNetError("pull of key %s into a row_sparse array: use row_sparse_pull (dist "
                     "stores pull row_sparse arrays only by row ids)" % (key,))


def is_sparse(array):
    """Whether ``array`` is row_sparse (:func:`mxnet_patch.sparse_keys.is_sparse`, which refuses
    csr); a dense array, every pushpull's, is told by its stype without importing it."""
    if array.stype == "default":
        return False
    from mxnet_patch.sparse_keys import is_sparse as sparse
    return sparse(array)


def densify(values):
    from mxnet_patch.sparse_keys import densify as dense
    return dense(values)


class KVStoreBytePS(KVStore):
    """BytePS-style distributed KVStore for unmodified MXNet (``mx.kv.create('dist_byteps')``).

    Values may be one NDArray or a list of NDArrays on several CPU contexts, or on several
    GPUs (summed locally first: a CPU sum, or NCCL through cupy, see :mod:`mxnet_patch.gpu`),
    or ``row_sparse`` arrays (:mod:`mxnet_patch.sparse_keys`). Keys are ints or strs (not
    mixed), as in MXNet. Thread-safe like MXNet's stores: call it from one Python thread.

    A :class:`mxnet.kvstore.KVStore` by class, though it holds no C store (``handle`` is
    None and every method is its own): gluon's Trainer takes only that class's stores for
    sparse models (gluon/trainer.py, model._create_sparse_kvstore).
    """

    handle = None     # no C store behind it (KVStore's methods that would use one are ours)

    def __init__(self):
        from kvstore_byteps.config import Config
        from kvstore_byteps.engine.worker import start_engine
        from kvstore_byteps.logs import config_errors_in_one_line, setup_library_logging
        from mxnet_patch.gc_tuning import tune_collector
        from mxnet_patch.profiler import make_current
        from mxnet_patch.pushpull_ops import PushPullOps
        from mxnet_patch.sparse_keys import SparseKeys, SparsePort
        from mxnet_patch.store_modes import store_mode
        from mxnet_patch.worker_exit import leave_at_exit
        config_errors_in_one_line()    # a bad setting ends the script with one line
        config = Config.from_env()
        setup_library_logging(config, "[worker]")  # PS_VERBOSE / BYTEPS_LOG_LEVEL reach workers too
        if config.keep_freed_memory:
            from kvstore_byteps.memory import keep_freed_memory
            keep_freed_memory()
        from mxnet_patch.waits import blocked
        self._engine = start_engine(config, waiting=blocked)
        make_current(self._engine)     # mx.profiler's server commands go through this store
        self._str_keys = {}
        self._key_kind = None
        self._push_results = {}       # key -> NDArray holding the last push's sum (push/pull API)
        self._ops = PushPullOps(self._engine)   # each pushpull as an engine operation
        self._mode = store_mode(config.training_mode, self._mode_port())  # push, pull... mean
        self._sparse = SparseKeys(SparsePort(                 # row_sparse keys
            rows=self._engine.sparse, init_rows=self._engine.init_rows,
            refusal=lambda: self._mode.sparse_refusal, request_timeout=config.request_timeout))
        tune_collector(config)         # BYTEPS_GC_FREEZE, BYTEPS_GC_YOUNG_THRESHOLD
        leave_at_exit(self.close, self._engine.rank, self._engine.po,
                      lambda: self._engine.joins.joining)

    def _mode_port(self):
        """What the store's mode object may do with it (it never holds the store)."""
        from mxnet_patch.store_modes import StorePort
        engine = self._engine
        return StorePort(rank=lambda: engine.rank, initialised_key=self._initialised_key,
                         held=self._push_results.__getitem__, submit=self._ops.submit,
                         read=engine.read, training_over=lambda: engine.training_over,
                         set_optimizer=engine.set_optimizer)

    # ------------------------------------------------------------------ properties
    @property
    def type(self):
        """``dist_sync_byteps`` (``dist_async_byteps`` with BYTEPS_ENABLE_ASYNC): MXNet reads the
        type string, e.g. Module scales gradients by the global batch only for ``_sync`` types,
        so a job moved from dist_sync to dist_byteps keeps its learning-rate semantics."""
        return "dist_%s_byteps" % self._mode.type_word

    @property
    def rank(self):
        return self._engine.rank

    @property
    def num_workers(self):
        return self._engine.num_workers

    def is_capable(self, capability):
        """Optimizer-capable where the training mode takes the optimizer (asynchronous
        training, backup workers); synchronous training updates on the workers."""
        if capability.lower() == KVStoreBase.OPTIMIZER:
            return self._mode.takes_optimizer
        raise ValueError("unknown capability %r" % capability)

    # ------------------------------------------------------------------ keys and values
    def _int_key(self, key):
        kind = "str" if isinstance(key, str) else "int"
        if self._key_kind is None:
            self._key_kind = kind
        elif kind != self._key_kind:
            raise TypeError("Mixed key types are not allowed (got %r after %s keys)"
                            % (key, self._key_kind))
        if kind == "str":
            if key not in self._str_keys:
                self._str_keys[key] = len(self._str_keys)
                self._engine.name_key(self._str_keys[key], key)  # the trace shows the name
            return self._str_keys[key]
        if not 0 <= int(key) < 2 ** 31:
            raise ValueError("key %r is outside [0, 2**31)" % (key,))
        return int(key)

    # ------------------------------------------------------------------ init / broadcast
    def init(self, key, value):
        """Initialise keys on the servers from rank 0's values (blocking, then a barrier); a
        ``row_sparse`` value makes a row_sparse key (:mod:`mxnet_patch.sparse_keys`)."""
        for k, v in _per_key(key, value, "init"):
            v = _as_list(v)[0]
            if is_sparse(v):
                self._sparse.init(self._new_key(k), str(k), v)
            else:
                self._initialise(k, v, [])

    def broadcast(self, key, value, out, priority=0):
        """Rank 0's ``value`` goes to every worker's ``out`` (and initialises the key)."""
        for (k, v), (_, o) in zip(_per_key(key, value, "broadcast"),
                                  _per_key(key, out, "broadcast")):
            if any(map(is_sparse, _as_list(v) + _as_list(o))):
                raise NotImplementedError("broadcast of key %s: row_sparse arrays are not "
                                          "broadcast; init the key, then row_sparse_pull" % (k,))
            self._initialise(k, _as_list(v)[0], _as_list(o))

    def declare(self, key, value):
        """Initialise ``key`` from rank 0's ``value`` without pairing the workers' calls: each
        worker may declare its keys in any order (kvstore-byteps servers only). Blocking."""
        self._initialise(key, value, [], any_order=True)

    def declared(self, key):
        """Whether ``key`` was initialised (by init, broadcast or declare) on this worker."""
        ikey = self._int_key(key)
        return ikey in self._push_results or self._sparse.holds(ikey)

    def _new_key(self, key):
        ikey = self._int_key(key)
        if ikey in self._push_results or self._sparse.holds(ikey):
            raise KeyError("key %r was initialised already" % (key,))
        return ikey

    def reduce_host(self, key, inputs, out, priority, on_done):
        """Sum host (numpy) ``inputs`` here and over all workers into ``out``; ``on_done(error
        or None)`` when finished. For callers inside an engine operation of their own (the
        local group's root): nothing is pushed to MXNet's engine."""
        self._engine.pushpull(self._initialised_key(key), inputs, [out], priority,
                              on_done=on_done, called=False)   # not a program's call: alone

    def _initialise(self, key, value, outs, any_order=False):
        ikey = self._int_key(key)
        stored = self._engine.init(ikey, value.asnumpy(), any_order=any_order)
        with autograd.pause():   # gluon may init its keys in a forward pass (a sparse model's)
            for out in outs:
                out[:] = nd.array(stored, ctx=out.context, dtype=out.dtype)
        self._push_results[ikey] = nd.array(stored, dtype=stored.dtype)

    # ------------------------------------------------------------------ pushpull
    def pushpull(self, key, value, out=None, priority=0):
        """Sum ``value`` over local devices and all workers into ``out`` (default: in place);
        where the store takes the optimizer, ``value`` is a gradient and ``out`` gets the
        weights. Returns at once; reading an output waits for the result (and its error)."""
        for (k, v), (_, o) in zip(_per_key(key, value, "pushpull"),
                                  _per_key(key, out, "pushpull")):
            vals = _as_list(v)
            if any(map(is_sparse, vals + ([] if o is None else _as_list(o)))):
                raise NotImplementedError(
                    "pushpull of key %s takes dense arrays (as MXNet's dist stores); for "
                    "row_sparse gradients push, then pull or row_sparse_pull (gluon does)" % (k,))
            self._mode.pushpull(k, vals, vals if o is None else _as_list(o), priority)

    def _initialised_key(self, key):
        ikey = self._int_key(key)
        if ikey not in self._push_results:
            raise KeyError("key %r was not initialised: call init or broadcast first" % (key,))
        return ikey

    def push(self, key, value, priority=0):
        """Push the sum of ``value`` (over devices); a later ``pull`` reads the round's sum
        (where the store takes the optimizer: a gradient, then the weights)."""
        for k, v in _per_key(key, value, "push"):
            vals = _as_list(v)
            ikey = self._int_key(k)
            if self._sparse.holds(ikey):
                self._sparse.push(ikey, str(k), vals)
            elif any(map(is_sparse, vals)):     # a dense weight's sparse gradient
                self._mode.push(k, densify(vals), priority)
            else:
                self._mode.push(k, vals, priority)

    def pull(self, key, out=None, priority=0, ignore_sparse=True):
        """Copy the sum of the last push of ``key`` (or its initial value) into ``out``; where
        the servers keep the weights, the weights as the mode's ``before_pull`` reads them.
        As MXNet's stores: ``row_sparse`` outputs are skipped (``ignore_sparse``, the default)
        or refused (use ``row_sparse_pull``); a row_sparse key pulls every row into dense
        outputs."""
        for k, o in _per_key(key, out, "pull"):
            outs = [t for t in _as_list(o) if not _skipped(k, t, ignore_sparse)]
            ikey = self._int_key(k)
            if self._sparse.holds(ikey):
                if outs:
                    self._sparse.pull_dense(ikey, str(k), outs)
                continue
            ikey = self._initialised_key(k)
            self._mode.before_pull(ikey, self._push_results[ikey], priority)
            for target in outs:
                self._push_results[ikey].copyto(target)

    def row_sparse_pull(self, key, out=None, priority=0, row_ids=None):
        """Rows ``row_ids`` of row_sparse ``key`` into the row_sparse ``out`` (a list of
        outputs takes a list of row ids, or one for all), after this worker's pushes of it
        were answered; only those rows travel. Blocking until the rows came."""
        if row_ids is None:
            raise ValueError("row_sparse_pull needs row_ids")
        for k, o in _per_key(key, out, "row_sparse_pull"):
            ikey = self._int_key(k)
            if not self._sparse.holds(ikey):
                raise KeyError("row_sparse_pull of key %r: it is not a row_sparse key (init it "
                               "with a row_sparse value; a dense key is read with pull)" % (k,))
            outs = _as_list(o)
            ids = row_ids if isinstance(row_ids, (list, tuple)) else [row_ids] * len(outs)
            if len(ids) != len(outs):
                raise ValueError("row_sparse_pull of key %r: %d outputs need %d row_ids"
                                 % (k, len(outs), len(outs)))
            self._sparse.row_sparse_pull(ikey, str(k), outs, ids)

    def add_to_shared(self, key, change, out, priority=0):
        """Asynchronous training's primitive (BytePS's push_pull in async mode): the servers
        add ``change`` into their copy of ``key``, which is read back into ``out`` (with every
        change added so far). Returns at once, as ``pushpull``. Refused in synchronous
        training, where a push is one worker's share of a round's sum."""
        self._mode.add_to_shared(key, _as_list(change), _as_list(out), priority)

    def finish_training(self, params=()):
        """End this worker's training and leave the servers' final weights in ``params``,
        ``(key, arrays)`` pairs (``kvstore_byteps.finish_training`` finds them for a gluon
        Trainer or a Module). Asynchronous training and backup workers: waits until every
        worker finished (a barrier), then reads. Synchronous training: every worker already
        holds the same weights; only waits for this worker's pending operations."""
        nd.waitall()
        if not self._engine.finish_training():
            return
        for key, arrays in params:
            ikey = self._initialised_key(key)
            held = self._push_results[ikey]
            self._mode.read_final(ikey, held)
            for target in _as_list(arrays):
                held.copyto(target)

    def reread(self, params):
        """The servers' current values of ``params``' keys, ``(key, arrays)`` pairs, into
        the arrays (an elastic job's late worker, once it joined: the servers' weights)."""
        for key, arrays in params:
            ikey = self._initialised_key(key)
            held = self._push_results[ikey]
            held[:] = self._engine.read(ikey, held.shape, held.dtype)
            for target in _as_list(arrays):
                held.copyto(target)

    # ------------------------------------------------------------------ the rest of the API
    def set_optimizer(self, optimizer):
        """The optimizer, where the training mode takes it (see the mode's class)."""
        self._mode.set_optimizer(optimizer)

    @property
    def _updater(self):
        """The worker's updater (gluon's ``Trainer.load_states`` reads its optimizer), or None."""
        return self._mode.updater

    def set_gradient_compression(self, compression_params):
        """BytePS's compression dict (``{"compressor": "onebit", "ef": "vanilla", ...}``) or
        MXNet's ``{"type": "2bit", "threshold": t}``; before the first ``pushpull``."""
        self._engine.set_compression(compression_params)

    def save_optimizer_states(self, fname, dump_optimizer=False):
        """Asynchronous training: save this worker's optimizer states (as MXNet's stores do)."""
        states = self._mode.optimizer_states("save").get_states(dump_optimizer)
        with open(fname, "wb") as f:
            f.write(states)

    def load_optimizer_states(self, fname):
        """Asynchronous training: load optimizer states saved by :meth:`save_optimizer_states`."""
        updates = self._mode.optimizer_states("load")
        with open(fname, "rb") as f:
            updates.set_states(f.read())

    def _set_updater(self, updater):
        raise NotImplementedError("dist_byteps runs no updater given by the program: set an "
                                  "optimizer (set_optimizer), or update on the workers")

    def _send_command_to_servers(self, head, body):
        raise NotImplementedError("dist_byteps sends its own commands to the servers; "
                                  "mx.profiler's server profiling works through it")

    def __del__(self):
        pass     # no C store to free (KVStore's would free its handle)

    def _barrier(self):
        """Block until every worker reached this barrier (after this worker's pending ops)."""
        nd.waitall()
        self._engine.barrier()

    def close(self, leave_within=None, ending=None):
        """Finish pending work, then leave the cluster as MXNet's workers do (the other workers
        must leave within ``leave_within`` seconds, default BYTEPS_REQUEST_TIMEOUT; ``ending``:
        why this worker leaves, for messages). Idempotent."""
        engine = self._engine
        if engine.closed:
            return
        try:
            nd.waitall()
        except Exception as exc:     # a failed op was already reported to its reader
            log.warning("pending operations failed before close: %s", exc)
        self._sparse.close()
        engine.close(leave_within, ending)


def register() -> None:
    """Put this store into MXNet's KVStore registry as ``dist_byteps`` (idempotent)."""
    if "dist_byteps" not in KVStoreBase.kv_registry:
        KVStoreBase.kv_registry["dist_byteps"] = KVStoreBytePS


# Imported before MXNet, this module imports MXNet, whose start-up hook then finds it half made
# and leaves the registration to it (_startup_hook.register_dist_byteps).
register()
