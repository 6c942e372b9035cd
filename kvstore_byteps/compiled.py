"""The compiled hot path: which modules are compiled at install, and the switch back to Python.

The modules of the per-message and per-key path (the van's framing and receive loop, the
postoffice, the KV layer, the worker's pipeline, routes and buckets, the servers' summing
path, the MXNet engine glue) are plain Python, compiled at install by Cython with
``KVSTORE_BYTEPS_COMPILE=1`` where a C compiler works (setup.py; a module that fails to compile
is left as Python). The same ``.py`` files ship beside the compiled ones, and the compiled ones
run the same code without the interpreter's per-bytecode dispatch. Off by default, as measured
(loopback 2 x 2, A/B in one run, 2026-11-29): untyped, they are no faster than Python 3.11's
specializing interpreter (a worker's CPU per round 4% less with 1000 keys of 4 KB, 19% more
with 10, 10% more with 100 partitions of 768 KB); typed code is what could make it pay.

``KVSTORE_BYTEPS_PURE_PYTHON=1`` makes every process of the job import the ``.py`` files
instead (a meta-path finder, installed when this package is first imported): to compare, to
debug with Python tools, or to rule the compiled code out. This module itself is never
compiled, and setup.py reads :data:`MODULES` from it without importing the package.
"""
import functools
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import warnings

__all__ = ["MODULES", "PURE_ENV", "honour_environment", "describe", "loaded_compiled"]

#: the environment variable that forces the pure-Python path ("1")
PURE_ENV = "KVSTORE_BYTEPS_PURE_PYTHON"

#: the modules compiled at install (setup.py builds one extension per name)
MODULES = (
    "kvstore_byteps.future",
    "kvstore_byteps.memory",
    "kvstore_byteps.van.wire.codec",
    "kvstore_byteps.van.wire.message",
    "kvstore_byteps.van.wire.pbmeta",
    "kvstore_byteps.van.tcp.frame",
    "kvstore_byteps.van.tcp.compact",
    "kvstore_byteps.van.tcp.reader",
    "kvstore_byteps.van.tcp.inbound",
    "kvstore_byteps.van.tcp.recv_buffers",
    "kvstore_byteps.van.tcp.outbound",
    "kvstore_byteps.van.tcp.van",
    "kvstore_byteps.van.auto.van",
    "kvstore_byteps.van.runtime.postoffice",
    "kvstore_byteps.van.runtime.customer",
    "kvstore_byteps.van.runtime.routing",
    "kvstore_byteps.van.runtime.link",
    "kvstore_byteps.van.kv.pairs",
    "kvstore_byteps.van.kv.requests",
    "kvstore_byteps.van.kv.worker",
    "kvstore_byteps.van.kv.server",
    "kvstore_byteps.van.kv.slicing",
    "kvstore_byteps.engine.credit",
    "kvstore_byteps.engine.stage_specs",
    "kvstore_byteps.engine.stages",
    "kvstore_byteps.engine.routes",
    "kvstore_byteps.engine.buckets",
    "kvstore_byteps.engine.fusion",
    "kvstore_byteps.engine.reduce",
    "kvstore_byteps.engine.worker",
    "kvstore_byteps.engine.rounds",
    "kvstore_byteps.engine.values",
    "kvstore_byteps.serving.byteps",
    "kvstore_byteps.serving.rounds",
    "kvstore_byteps.serving.summing",
    "kvstore_byteps.serving.summed",
    "kvstore_byteps.serving.batch",
    "kvstore_byteps.serving.pacing",
    "kvstore_byteps.serving.riding",
    "kvstore_byteps.serving.store",
    "mxnet_patch.engine_async",
    "mxnet_patch.kvstore",
    "mxnet_patch.pushpull_ops",
)
_NAMES = frozenset(MODULES)


class _SourceFirst(importlib.abc.MetaPathFinder):
    """Finds the ``.py`` file of a compiled module (the path's own finder would pick the
    extension module beside it: extensions come first)."""

    def find_spec(self, name, path, target=None):
        if name not in _NAMES or not path:
            return None
        leaf = name.rpartition(".")[2] + ".py"
        for entry in path:
            source = os.path.join(entry, leaf)
            if os.path.isfile(source):
                return importlib.util.spec_from_file_location(name, source)
        return None


@functools.lru_cache(maxsize=None)      # read once a process (and warned about once)
def pure_python_forced() -> bool:
    """Whether ``KVSTORE_BYTEPS_PURE_PYTHON=1`` asks for the ``.py`` files. Another value is
    warned about and ignored (this runs at every Python start-up, from kvstore_byteps.pth:
    raising there would only cut the start-up hook short)."""
    value = os.environ.get(PURE_ENV, "").strip()
    if value not in ("", "0", "1"):
        warnings.warn("%s=%r is ignored: 1 imports the Python files of the compiled modules, "
                      "0 (the default) the compiled ones" % (PURE_ENV, value), RuntimeWarning,
                      stacklevel=2)
    return value == "1"


def honour_environment() -> None:
    """Install the source-first finder if the environment forces the pure-Python path (once;
    before any compiled module is imported: the packages' ``__init__`` call this)."""
    if pure_python_forced() and not any(isinstance(f, _SourceFirst) for f in sys.meta_path):
        sys.meta_path.insert(0, _SourceFirst())


def _is_extension(path) -> bool:
    return (path or "").endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))


def loaded_compiled() -> list:
    """The compiled modules imported so far that run compiled (not their ``.py``)."""
    return [name for name in MODULES if name in sys.modules
            and _is_extension(getattr(sys.modules[name], "__file__", None))]


def describe() -> str:
    """How the hot path runs here, for the start-up line: compiled, or Python and why."""
    if pure_python_forced():
        return "hot path in Python (%s=1)" % PURE_ENV
    compiled = 0
    for name in MODULES:
        spec = importlib.util.find_spec(name)
        compiled += spec is not None and _is_extension(spec.origin)
    if compiled == len(MODULES):
        return "hot path compiled"
    if compiled == 0:
        return "hot path in Python (not compiled at install)"
    return "hot path compiled in part (%d of %d modules)" % (compiled, len(MODULES))
