"""The transports by name: the registry the node runtime asks for its van.

Each transport registers the module and class that implement it; the module is imported only
when a node chooses that transport (``DMLC_PS_VAN_TYPE``), so the runtime never imports a
transport and a CPU-only install without ZeroMQ or pyverbs still starts the others (the model:
torch.distributed.elastic's rendezvous handlers). Registration is thread-safe; so is
:func:`make_van`.
"""
import importlib
import threading
from typing import Dict

from ..config import Config, VanType
from ..errors import ConfigError
from .base import Van

_lock = threading.Lock()
#: transport -> ``"module:Class"`` of its van, imported when chosen
_TRANSPORTS: Dict[VanType, str] = {}


def register(van_type: VanType, target: str) -> None:
    """Make ``van_type`` available: ``target`` is ``"package.module:Class"``, a :class:`Van`
    built from a :class:`Config`; it is imported only when a node chooses ``van_type``."""
    module, _, name = target.partition(":")
    if not module or not name:
        raise ValueError("a transport is registered as 'module:Class', not %r" % target)
    with _lock:
        _TRANSPORTS[van_type] = target


def make_van(config: Config) -> Van:
    """The van named by ``DMLC_PS_VAN_TYPE``; transports are imported only when chosen."""
    with _lock:
        target = _TRANSPORTS.get(config.van_type)
    if target is None:
        raise ConfigError("DMLC_PS_VAN_TYPE=%s is not available" % config.van_type.value)
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)(config)


register(VanType.AUTO, "kvstore_byteps.van.auto.van:AutoVan")
register(VanType.ZMQ, "kvstore_byteps.van.zmq.van:ZMQVan")
register(VanType.P3, "kvstore_byteps.van.p3.van:P3Van")
register(VanType.BYTEPS_TCP, "kvstore_byteps.van.tcp.van:TcpVan")
register(VanType.BYTEPS_RDMA, "kvstore_byteps.van.rdma.van:RdmaVan")
