"""MXNet integration of kvstore-byteps: the ``dist_byteps`` KVStore and the server hook.

Importing this package is cheap (it does not import MXNet). It installs the start-up hook of
:mod:`mxnet_patch._startup_hook` (normally already installed by ``kvstore_byteps.pth``), so
``dist_byteps`` is registered in MXNet's KVStore registry when MXNet is imported, or at once if
MXNet already is. After that, ``mx.kv.create('dist_byteps')`` works.
"""
from . import _startup_hook

__all__ = ["register_dist_byteps"]

register_dist_byteps = _startup_hook.register_dist_byteps
