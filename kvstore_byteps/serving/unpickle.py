"""The restricted unpickler for optimizers that workers send with kController.

MXNet's ``set_optimizer`` sends ``pickle.dumps(optimizer, 0)`` to every server, and MXNet's own
server runs ``pickle.loads`` on it: any worker (or anyone who can reach the port) can run code
on the server. We unpickle through :class:`OptimizerUnpickler`, whose ``find_class`` admits
only what an optimizer's pickle needs (checked on real pickles of SGD, Adam, NAG, RMSProp,
AdaGrad, LAMB, Ftrl, Signum, with and without multi_precision and lr schedulers):

* ``copyreg._reconstructor`` and ``builtins.object`` (protocol 0/1 object reconstruction),
* subclasses of ``mxnet.optimizer.Optimizer`` defined in ``mxnet.optimizer.*`` modules,
* subclasses of ``mxnet.lr_scheduler.LRScheduler`` defined in ``mxnet.lr_scheduler``,
* a few inert value types: ``set``, ``frozenset``, numpy scalars and dtypes.

Anything else raises :class:`UnsafePickleError` naming the refused global before it is
imported or called. mxnet is imported lazily, only when a kController arrives, through
:func:`import_mxnet`, which keeps the import from starting MXNet's own server in this process.
"""
import importlib
import io
import pickle
import sys
import types

from ..errors import ProtocolError

__all__ = ["UnsafePickleError", "OptimizerUnpickler", "load_optimizer", "import_mxnet"]

#: (module, name) pairs admitted as they are; protocol 0 spells some modules the Python 2 way.
_PLAIN_GLOBALS = frozenset([
    ("copy_reg", "_reconstructor"), ("copyreg", "_reconstructor"),
    ("__builtin__", "object"), ("builtins", "object"),
    ("__builtin__", "set"), ("builtins", "set"),
    ("__builtin__", "frozenset"), ("builtins", "frozenset"),
    ("numpy", "dtype"), ("numpy.core.multiarray", "scalar"),
])

#: module prefix -> (module holding the base class, base class name)
_CLASS_FAMILIES = (
    ("mxnet.optimizer", "mxnet.optimizer", "Optimizer"),
    ("mxnet.lr_scheduler", "mxnet.lr_scheduler", "LRScheduler"),
)


class UnsafePickleError(ProtocolError):
    """An optimizer pickle refers to a global outside the allowlist."""


class OptimizerUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` that resolves only MXNet optimizer classes and their value types."""

    def find_class(self, module, name):
        if (module, name) in _PLAIN_GLOBALS:
            return super().find_class(module, name)
        for prefix, base_module, base_name in _CLASS_FAMILIES:
            if module == prefix or module.startswith(prefix + "."):
                return _family_class(module, name, base_module, base_name)
        raise UnsafePickleError("optimizer pickle refers to %s.%s, which is not an MXNet optimizer "
                                "class; refusing to unpickle it" % (module, name))


def _family_class(module: str, name: str, base_module: str, base_name: str):
    """Resolve ``module.name`` only if it is a class derived from ``base_module.base_name``."""
    refused = UnsafePickleError("optimizer pickle refers to %s.%s, which is not a subclass of "
                                "%s.%s; refusing to unpickle it"
                                % (module, name, base_module, base_name))
    if name.startswith("_") or "." in name:
        raise refused
    try:
        base = getattr(importlib.import_module(base_module), base_name)
        found = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        raise refused from None
    if not (isinstance(found, type) and issubclass(found, base)):
        raise refused
    return found


def import_mxnet():
    """Import mxnet in a server process without starting MXNet's parameter server.

    ``import mxnet`` runs MXNet's C++ server (and never returns) when ``DMLC_ROLE`` is server,
    which it is in our server process: the body of ``mxnet.kvstore.kvstore_server`` starts it.
    So that module is put into ``sys.modules`` first, as a stub holding what ``mxnet.kvstore``
    imports from it; its real body never runs. (Nothing else changes: no environment variable
    is touched, which from a request thread would race every other thread of the process.)
    """
    if "mxnet" not in sys.modules and SERVER_MODULE not in sys.modules:
        stub = types.ModuleType(SERVER_MODULE, "kvstore-byteps: MXNet's server is not started")
        sys.modules[SERVER_MODULE] = stub_server_module(stub)
    return importlib.import_module("mxnet")


SERVER_MODULE = "mxnet.kvstore.kvstore_server"


def stub_server_module(module: types.ModuleType) -> types.ModuleType:
    """Give ``module`` what ``from .kvstore_server import *`` needs, without MXNet's body
    (which would start MXNet's server): used here and by mxnet_patch's start-up hook."""
    module.__all__ = []

    class KVStoreServer:
        """Placeholder: this process runs kvstore-byteps' server instead of MXNet's."""

        def __init__(self, *args, **kwargs):
            raise RuntimeError("this process runs kvstore-byteps' server; MXNet's "
                               "KVStoreServer is replaced")
    module.KVStoreServer = KVStoreServer
    return module


def load_optimizer(body: bytes):
    """Unpickle an optimizer sent with kController; UnsafePickleError or ProtocolError if bad."""
    import_mxnet()   # before the unpickler resolves any mxnet class
    try:
        optimizer = OptimizerUnpickler(io.BytesIO(bytes(body))).load()
    except UnsafePickleError:
        raise
    except Exception as exc:  # any malformed pickle: report it, never crash the server
        raise ProtocolError("cannot unpickle the optimizer (%d bytes): %s: %s"
                            % (len(body), type(exc).__name__, exc)) from None
    _check_is_optimizer(optimizer)
    return optimizer


def _check_is_optimizer(obj) -> None:
    base = import_mxnet().optimizer.Optimizer
    if not isinstance(obj, base):
        raise ProtocolError("kController body unpickles to %s, not an mxnet Optimizer"
                            % type(obj).__name__)
