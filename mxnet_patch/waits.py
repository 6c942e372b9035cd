"""Whether a thread is blocked in one of MXNet's waits for an array: the port gradient buckets
use to tell a program that reads a key's result before it pushes the next
(``kvstore_byteps/engine/buckets.py``; rank 0 asks while a bucket's first round of calls goes
key by key, and its answer is every worker's).

MXNet 1.9.1's Python blocks for an array's pending operations in four calls, each a ctypes
call in a function of its own: ``NDArray.wait_to_read`` (MXNDArrayWaitToRead),
``NDArray.asnumpy`` (MXNDArraySyncCopyToCPU; ``asscalar``, ``item``, ``float(x)`` and numpy's
``np.array(x)`` go through it), ``mx.nd.waitall`` (MXNDArrayWaitAll) and ``mx.nd.save`` /
``mx.npx.save`` (MXNDArraySave). While it waits, that function is the thread's innermost
Python frame.
"""
import os
import sys

import mxnet

__all__ = ["blocked"]

_WAITS = frozenset({"wait_to_read", "asnumpy", "waitall", "save"})
_MXNET = os.path.dirname(os.path.abspath(mxnet.__file__)) + os.sep


def blocked(thread_id: int) -> bool:
    """Whether thread ``thread_id`` is in one of MXNet's waits for an array now."""
    frame = sys._current_frames().get(thread_id)
    if frame is None:
        return False
    code = frame.f_code
    return code.co_name in _WAITS and code.co_filename.startswith(_MXNET)
