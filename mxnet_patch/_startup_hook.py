"""Start-up hook: ``kvstore_byteps.pth`` imports this module in every Python process.

It must cost nothing where MXNet is not used, so at start-up it only puts a small finder at the
front of ``sys.meta_path`` (no mxnet, numpy or kvstore_byteps import). The finder answers for
exactly two module names and wraps their real loaders:

* ``mxnet.kvstore.kvstore_server``: upstream runs its parameter server *inside this module's
  body* when ``DMLC_ROLE`` is server or scheduler. Before that body runs we decide the route:

  - a worker (``DMLC_ROLE`` unset or ``worker``), or ``MXNET_KVSTORE_SERVER`` unset/``mxnet``:
    upstream's body runs unchanged, then ``dist_byteps`` is registered in
    ``mxnet.kvstore.base.KVStoreBase.kv_registry``;
  - server/scheduler with ``MXNET_KVSTORE_SERVER=byteps``: upstream's body is replaced by a stub
    (so MXNet's C++ server never starts) and ours is scheduled;
  - server/scheduler with any other ``MXNET_KVSTORE_SERVER`` value: ConfigError from the import.

* ``mxnet`` (the package): after its ``__init__`` has run completely, a scheduled route runs
  ``kvstore_byteps.server.run_server(config)`` or ``kvstore_byteps.scheduler.run_scheduler``
  and exits the process with its code, as upstream's server exits inside ``import mxnet``.
  We wait for the end of ``mxnet/__init__`` (upstream starts its server half-way through it,
  before ``mxnet.gluon`` exists) and then mark the package initialised: while it is still
  marked as initialising, any *other* thread executing ``import mxnet...`` (an unpickler, a lazy
  import in a server thread) waits for the import lock that the main thread holds for the
  whole life of the server, a deadlock.

This module imports nothing of ours at start-up; the routing imports
``kvstore_byteps.config`` only when ``mxnet.kvstore.kvstore_server`` loads, and just before the
``mxnet`` package itself loads, ``kvstore_byteps.cuda_libs`` loads the CUDA libraries of pip's
``nvidia-*`` packages when the installed MXNet is a GPU build (nothing otherwise).
"""
import sys

_SERVER_MODULE = "mxnet.kvstore.kvstore_server"
_PACKAGE = "mxnet"
_MARK = "_kvstore_byteps_hook"

#: The route chosen when the server module loaded, run when the package has finished loading.
_pending_route = None
#: Whether the ``mxnet`` package itself is being loaded through our wrapper.
_package_wrapped = False


def _route():
    """``None`` (upstream behaviour) or ``(role, config)`` to run our server/scheduler.

    Routing must not validate variables that a plain MXNet process does not care about, so it
    reads only the two it needs (``Config.from_env(only=...)``) until the route is ours."""
    from kvstore_byteps.config import Config, Env, Role, ServerKind
    from kvstore_byteps.errors import ConfigError
    try:
        role = Config.from_env(only=(Env.ROLE,)).role
    except ConfigError:
        return None                      # a bad DMLC_ROLE is upstream's to report, as before
    if role is Role.WORKER:
        return None
    names = (Env.ROLE, Env.KVSTORE_SERVER)
    if Config.from_env(only=names).kvstore_server is not ServerKind.BYTEPS:
        return None
    return role, Config.from_env()       # asked for us: now every variable must be valid


def _run_route(route):
    """Run our server or scheduler in place of MXNet's, then exit with its code."""
    from kvstore_byteps.config import Role
    from kvstore_byteps.logs import setup_logging
    role, config = route
    setup_logging(config, "[%s]" % role.name.lower())
    if role is Role.SERVER:
        from kvstore_byteps.errors import KVStoreBytePSError
        from kvstore_byteps.server import run_server
        try:
            code = run_server(config)
        except KVStoreBytePSError as exc:    # said plainly, as `python -m` does
            import logging
            logging.getLogger("kvstore_byteps.server").error("server failed: %s", exc)
            code = 1
    else:
        from kvstore_byteps.scheduler import run_scheduler
        code = run_scheduler(config)
    sys.exit(code)   # like upstream, whose server role exits inside `import mxnet`


def register_dist_byteps():
    """Put ``dist_byteps`` into MXNet's KVStore registry (idempotent)."""
    from mxnet.kvstore.base import KVStoreBase
    store_module = sys.modules.get("mxnet_patch.kvstore")
    if store_module is not None and not hasattr(store_module, "register"):
        pass    # it is being imported and imported MXNet first: it registers itself at its end
    elif "dist_byteps" not in KVStoreBase.kv_registry:
        import kvstore_byteps  # noqa: F401  (first: it may load the compiled modules' .py files)
        from mxnet_patch.kvstore import register
        register()
    from mxnet_patch.profiler import wrap_profiler
    wrap_profiler()           # server profiling through a dist_byteps store too, as MXNet's


def _register_or_warn():
    """Register while MXNet imports; a failure of ours must not break ``import mxnet``."""
    try:
        register_dist_byteps()
    except Exception as exc:  # any bug of ours: report it, keep MXNet usable
        import warnings
        warnings.warn("kvstore-byteps could not register the 'dist_byteps' KVStore: %s: %s"
                      % (type(exc).__name__, exc), RuntimeWarning)


class _WrappedLoader:
    """Delegates to the real loader and adds our steps around ``exec_module``."""

    def __init__(self, loader, fullname):
        self._loader = loader
        self._fullname = fullname

    def __getattr__(self, name):          # get_source, get_code, is_package, ... for tools
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        if self._fullname == _SERVER_MODULE:
            _exec_server_module(self._loader, module)
        else:
            _exec_package(self._loader, module)


def _exec_server_module(loader, module):
    global _pending_route
    from kvstore_byteps.errors import ConfigError
    try:
        route = _route()
    except ConfigError as exc:     # this process is a node: one line, as `python -m` says it
        print("[kvstore_byteps] configuration error: %s" % exc, file=sys.stderr, flush=True)
        sys.exit(2)
    if route is None:
        loader.exec_module(module)
        _register_or_warn()
        return
    from kvstore_byteps.serving.unpickle import stub_server_module
    stub_server_module(module)
    if _package_wrapped:
        _pending_route = route        # run once mxnet/__init__ has finished
    else:
        _run_route(route)             # mxnet was loaded before the hook: no better moment


def _exec_package(loader, module):
    global _package_wrapped
    _package_wrapped = True
    _preload_cuda_libraries()
    loader.exec_module(module)
    route = _pending_route
    if route is not None:
        # The package has executed completely; let other threads import from it (see above).
        module.__spec__._initializing = False
        _run_route(route)


def _preload_cuda_libraries():
    """MXNet's GPU wheel finds its CUDA 11 libraries in pip's nvidia-* packages (the ``gpu``
    extra) without LD_LIBRARY_PATH: see kvstore_byteps.cuda_libs. Nothing happens for MXNet's
    CPU wheel or without those packages."""
    try:
        from kvstore_byteps import cuda_libs
        if cuda_libs.nvidia_roots() and cuda_libs.gpu_mxnet_installed():
            cuda_libs.preload()
    except Exception as exc:  # a bug of ours must not break `import mxnet`
        import warnings
        warnings.warn("kvstore-byteps could not preload CUDA libraries: %s: %s"
                      % (type(exc).__name__, exc), RuntimeWarning)


class _Finder:
    """Meta-path finder that answers only for the two modules above."""

    _kvstore_byteps_hook = True

    def find_spec(self, fullname, path=None, target=None):
        if fullname != _SERVER_MODULE and fullname != _PACKAGE:
            return None
        spec = _real_spec(fullname, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _WrappedLoader(spec.loader, fullname)
        return spec

    def invalidate_caches(self):
        pass


def _real_spec(fullname, path, target):
    for finder in sys.meta_path:
        if getattr(finder, _MARK, False) or not hasattr(finder, "find_spec"):
            continue
        spec = finder.find_spec(fullname, path, target)
        if spec is not None:
            return spec
    return None


def install():
    """Insert the finder once per process; if MXNet is already imported, just register."""
    if not any(getattr(finder, _MARK, False) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
    server_module = sys.modules.get(_SERVER_MODULE)
    if server_module is not None and hasattr(server_module, "KVStoreServer"):
        register_dist_byteps()


install()
