"""Server profiling from a ``dist_byteps`` worker, through ``mx.profiler`` as with MXNet's stores.

``mx.profiler.set_config(..., profile_process='server')``, ``set_state``, ``pause``, ``resume``
and ``dump`` with ``profile_process='server'`` hand the command to MXNet's C API with the handle
of the last MXNet store created, and MXNet's kvstore sends it to the servers as a
``kSetProfilerParams`` command (from rank 0 only; its body the parameters and one digit naming
the command, see ``kvstore_byteps/serving/profiler.py``). Our store is a Python object without
such a handle, so MXNet stopped with ``KVStoreHandle passed to profiler is null``.

Here those five functions of ``mxnet.profiler`` are wrapped (once, when MXNet is imported): while
a ``dist_byteps`` store is the process's current store, their server commands go through it, in
MXNet's words, to whichever servers it talks to (ours or MXNet's, which both serve the command).
A store becomes current as it is created, as MXNet's do (an MXNet store created later takes
over). Every other call runs MXNet's function unchanged.
"""
import functools
import inspect
import weakref

from kvstore_byteps.mxproto import ServerCommand

__all__ = ["make_current", "wrap_profiler"]

# MXNet's KVStoreServerProfilerCommand
_SET_CONFIG, _STATE, _PAUSE, _DUMP = 0, 1, 2, 3
_STATES = {"stop": 0, "run": 1}

#: the engine of the current dist_byteps store (a weak reference), or None
_current = None


def make_current(engine) -> None:
    """``engine``'s store is now the one server profiling goes through (it was just created)."""
    global _current
    import mxnet.profiler
    from mxnet.base import KVStoreHandle
    _current = weakref.ref(engine)
    mxnet.profiler.set_kvstore_handle(KVStoreHandle())     # MXNet's stores no longer current


def _current_engine():
    """The current dist_byteps store's engine, unless an MXNet store was created after it."""
    import mxnet.profiler
    if _current is None or mxnet.profiler.profiler_kvstore_handle.value is not None:
        return None
    engine = _current()
    return None if engine is None or engine.closed else engine


def config_body(kwargs) -> str:
    """``set_config``'s parameters as MXNet's C API writes them for the servers: ``key:value``
    pairs joined by commas (values as Python's ``str``), ``profile_process`` left out."""
    return ",".join("%s:%s" % (key, value) for key, value in kwargs.items()
                    if key != "profile_process")


def _body(name: str, args) -> str:
    """The command body of ``mx.profiler.<name>`` called with ``args`` (bound, defaults in)."""
    if name == "set_config":
        return config_body(args["kwargs"]) + str(_SET_CONFIG)
    if name == "set_state":
        return "%d%d" % (_STATES[args["state"]], _STATE)
    if name in ("pause", "resume"):
        return "%d%d" % (name == "pause", _PAUSE)
    return "%d%d" % (bool(args["finished"]), _DUMP)


def _send(engine, body: str) -> None:
    """Rank 0 sends the command to every server and waits for their answers, as MXNet does."""
    if engine.rank == 0:
        engine.kv.wait(engine.kv.command(ServerCommand.SET_PROFILER_PARAMS,
                                         body.encode("utf-8")))


def _wrapped(name: str, original):
    signature = inspect.signature(original)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        arguments = bound.arguments
        process = (arguments["kwargs"] if name == "set_config" else arguments).get(
            "profile_process", "worker")
        engine = _current_engine() if process == "server" else None
        if engine is None:
            return original(*args, **kwargs)
        return _send(engine, _body(name, arguments))
    wrapper._kvstore_byteps = True
    return wrapper


def wrap_profiler() -> None:
    """Wrap ``mxnet.profiler``'s five server-command functions (idempotent)."""
    import mxnet.profiler
    for name in ("set_config", "set_state", "pause", "resume", "dump"):
        original = getattr(mxnet.profiler, name)
        if not getattr(original, "_kvstore_byteps", False):
            setattr(mxnet.profiler, name, _wrapped(name, original))
