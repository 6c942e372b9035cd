"""The ``dist_byteps`` KVStore (worker side) -- UNFINISHED: it lands with issue 4.

Registered under ``'dist_byteps'`` in ``mxnet.kvstore.base.KVStoreBase.kv_registry`` by
:func:`mxnet_patch._startup_hook.register_dist_byteps`. This module is imported while MXNet itself
is still importing (from ``mxnet.kvstore``, before ``mxnet.gluon`` exists): import at module level
only MXNet modules that load before ``mxnet.kvstore`` (base, context, ndarray, optimizer), and
anything else inside functions.
"""
from mxnet.kvstore.base import KVStoreBase

__all__ = ["KVStoreBytePS"]


class KVStoreBytePS(KVStoreBase):
    """BytePS-style distributed KVStore for unmodified MXNet (not implemented yet)."""

    def __init__(self):
        raise NotImplementedError("dist_byteps worker lands with issue 4")
