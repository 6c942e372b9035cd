"""A key's pushpull as an operation of MXNet's engine, for the ``dist_byteps`` store.

:class:`PushPullOps` queues each pushpull on MXNet's engine (``submit``): its operands are
made once for the arrays a key is called with, and the operation, when its inputs are ready,
hands the arrays to the worker engine as numpy views (cached per key) or to the GPU path
(:mod:`mxnet_patch.gpu`). Imported by the store when it is made, not while MXNet imports.
"""
import threading

__all__ = ["PushPullOps"]


class PushPullOps:
    """The store's pushpulls as operations of MXNet's engine, through the worker ``engine``
    (a started ``WorkerEngine``). Called from the program's thread (``submit``) and the
    engine operations' threads (the views, the GPU path)."""

    def __init__(self, engine):
        self.engine = engine
        self.views = _ViewCache()
        self._calls = {}              # key -> _KeyCall: its arrays as the engine takes them
        self._lock = threading.Lock()
        self._gpu_path = None

    def submit(self, ikey, values, outs, priority, fusable=True):
        """Push the engine operation of one pushpull of ``ikey``; ``fusable``: it may travel in
        the key's gradient bucket (a pushpull; a lone push does not)."""
        ticket = self.engine.use(ikey, fusable)   # in the program's order (gradient buckets)
        call = self._calls.get(ikey)
        if call is None or not call.made_for(values, outs):
            call = self._calls[ikey] = _KeyCall(ikey, values, outs)
        _engine_ops().push_prepared(
            _PushPull(self, ikey, values, outs, call.arrays, priority, call.on_gpu, ticket),
            call.operands, priority)

    def gpu(self):
        """The GPU path (:class:`mxnet_patch.gpu.GpuPushPull`), made at the first GPU array."""
        with self._lock:
            if self._gpu_path is None:
                from mxnet_patch.gpu import GpuPushPull
                self._gpu_path = GpuPushPull(self.engine)
            return self._gpu_path


def _placement(key, arrays):
    """True if every array is a dense GPU array, False if every one is a dense CPU array."""
    kinds = {a.context.device_type for a in arrays}
    if any(a.stype != "default" for a in arrays) or len(kinds) != 1 or \
            kinds - {"cpu", "cpu_pinned", "cpu_shared", "gpu"}:
        raise NotImplementedError(
            "dist_byteps pushpull takes dense arrays all on CPUs or all on GPUs; key %d has %s"
            % (key, ", ".join("%s on %s" % (a.stype, a.context) for a in arrays)))
    return kinds == {"gpu"}


class _CachedViews:
    __slots__ = ("arrays", "ids", "views")

    def __init__(self, arrays, views):
        self.arrays, self.views = arrays, views
        self.ids = tuple(map(id, arrays))

    def same_arrays(self, arrays) -> bool:
        # Identity, compared by id: the entry keeps its arrays alive, so no other object can
        # have their ids meanwhile (one tuple compare instead of a generator per key).
        return tuple(map(id, arrays)) == self.ids


class _KeyCall:
    """What a key's pushpull hands MXNet's engine, made once for the arrays it is called with
    (gluon and Module pass the same arrays every step): whether they are on a GPU, and the
    operation's operands (handles, context, name). Keeps the arrays alive, so their ids name
    them for as long as the entry lives."""

    __slots__ = ("ids", "arrays", "on_gpu", "operands")

    def __init__(self, ikey, values, outs):
        self.ids = (tuple(map(id, values)), tuple(map(id, outs)))
        self.arrays = values + outs
        self.on_gpu = _placement(ikey, self.arrays)
        if outs is values:                  # in place
            const = []
        else:                               # an array both read and written is only written
            written = set(map(id, outs))
            const = [v for v in values if id(v) not in written]
        self.operands = _engine_ops().Operands(
            const, outs, "byteps_pushpull_%d" % ikey, values[0].context if self.on_gpu else None)

    def made_for(self, values, outs) -> bool:
        """Whether this entry was made for these very arrays (by identity, in this split)."""
        return (tuple(map(id, values)), tuple(map(id, outs))) == self.ids


_ENGINE_OPS = None


def _engine_ops():
    """:mod:`mxnet_patch.engine_async`, imported on first use (at the first pushpull); an
    import statement per pushpull was a sixteenth of its cost."""
    global _ENGINE_OPS
    if _ENGINE_OPS is None:
        from mxnet_patch import engine_async
        _ENGINE_OPS = engine_async
    return _ENGINE_OPS


class _PushPull:
    """One pushpull as an engine operation: ``op(done)`` runs when its inputs are ready. An
    object, not a closure: a closure is a function and a cell per captured name, objects the
    cyclic garbage collector tracks, and with thousands of keys in flight it ran as much as the
    rest of the worker (benchmarks/bench_cost.py)."""

    __slots__ = ("ops", "ikey", "values", "outs", "arrays", "priority", "on_gpu", "ticket")

    def __init__(self, ops, ikey, values, outs, arrays, priority, on_gpu, ticket):
        self.ops, self.ikey, self.values, self.outs = ops, ikey, values, outs
        self.arrays, self.priority, self.on_gpu = arrays, priority, on_gpu
        self.ticket = ticket    # its gradient bucket's round, if any (decided when called)

    def __call__(self, done) -> None:
        ops = self.ops
        if self.on_gpu:
            ops.gpu().run(self.ikey, self.values, self.outs, self.priority, done,
                          ticket=self.ticket)
            return
        views = ops.views.host_views(self.ikey, self.arrays)
        n = len(self.values)
        ops.engine.pushpull(self.ikey, views[:n], views[n:], self.priority, on_done=done,
                            ticket=self.ticket)


class _ViewCache(dict):
    """Per key, the arrays of its last pushpull and their numpy views.

    Gluon passes the same gradient arrays every step, and building a view costs several C
    calls per array (checking a cached one by handle, address, shape and dtype cost as much:
    a third of the engine thread's time with 1000 small keys). So an entry keeps the NDArray
    objects themselves alive and is reused only for those very objects: an NDArray that is
    alive keeps its handle, shape, dtype and memory. Entries are built on the engine
    operation's thread, while the operation holds the arrays.
    """

    def host_views(self, key, arrays):
        from mxnet_patch.engine_async import host_view
        cached = self.get(key)
        if cached is not None and cached.same_arrays(arrays):
            return cached.views
        views = [host_view(a) for a in arrays]
        self[key] = _CachedViews(tuple(arrays), views)
        return views
