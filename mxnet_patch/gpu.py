"""The GPU side of ``dist_byteps`` pushpull: NCCL reduce, pinned host copy, NCCL broadcast.

For values on GPUs, the engine operation (scheduled on the first value's GPU context, so MXNet
has finished producing the inputs) does

    LOCAL_REDUCE  NCCL reduce of every device's array into a staging array on the root device
    COPY_D2H      root -> a pinned, reusable host buffer of the key
    PUSH/PULL     the CPU pipeline of WorkerEngine on that host buffer (in place)
    COPY_H2D      host buffer -> the root staging array
    LOCAL_BROADCAST  NCCL broadcast of the root array into every output

cupy (and its NCCL) is imported only here, lazily, through ``kvstore_byteps.engine.reduce``;
without it a GPU array fails with a message naming ``pip install kvstore-byteps[gpu]``.
Not verified on a GPU machine in this repository's CI (it has none): see tests/cluster/test_gpu.py.
"""
import ctypes
import threading

import numpy as np

from kvstore_byteps.engine.reduce import HostBuffers, NcclLocalReducer, import_cupy


def device_view(array):
    """A cupy array over a GPU NDArray's memory (no copy, no wait on the engine)."""
    import mxnet.base as mxbase
    cupy, _ = import_cupy()
    dtype, shape = np.dtype(array.dtype), tuple(array.shape)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    pointer = ctypes.c_void_p()
    mxbase.check_call(mxbase._LIB.MXNDArrayGetData(array.handle, ctypes.byref(pointer)))
    memory = cupy.cuda.UnownedMemory(pointer.value or 0, nbytes, array, array.context.device_id)
    return cupy.ndarray(shape, dtype, cupy.cuda.MemoryPointer(memory, 0))


class GpuPushPull:
    """Per-device-set NCCL reducers and per-key staging buffers of one KVStore."""

    def __init__(self, engine):
        self.engine = engine
        self._reducers = {}
        self._staging = {}
        self._lock = threading.Lock()
        self._host = None

    def _reducer(self, device_ids):
        with self._lock:
            reducer = self._reducers.get(device_ids)
            if reducer is None:
                reducer = self._reducers[device_ids] = NcclLocalReducer(list(device_ids))
                if self._host is None:
                    self._host = HostBuffers(reducer.pinned_allocator())
            return reducer

    def _root_buffer(self, key, like):
        cupy, _ = import_cupy()
        with self._lock:
            buffer = self._staging.get(key)
            if buffer is None or buffer.shape != like.shape or buffer.dtype != like.dtype:
                with cupy.cuda.Device(like.device.id):
                    buffer = self._staging[key] = cupy.empty_like(like)
            return buffer

    def run(self, key, values, outs, priority, done, ticket=None):
        """Start the pushpull of GPU ``values`` into GPU ``outs``; ``done(error)`` at the end."""
        device_ids = tuple(v.context.device_id for v in values)
        if tuple(o.context.device_id for o in outs) != device_ids:
            raise ValueError("key %d: outputs must be on the devices of the values, in order "
                             "(%s)" % (key, list(device_ids)))
        reducer = self._reducer(device_ids)
        sources = [device_view(v) for v in values]
        targets = [device_view(o) for o in outs]
        root = self._root_buffer(key, sources[0])
        reducer.reduce(sources, root)
        reducer.synchronize()
        host = self._host.get(key, root.shape, root.dtype)
        reducer.copy_to_host(root, host)

        def finish(error):
            if error is None:
                try:
                    reducer.copy_from_host(host, root)
                    reducer.broadcast(root, targets)
                    reducer.synchronize()
                except Exception as exc:  # reaches the reader of the outputs
                    error = exc
            done(error)
        self.engine.pushpull(key, [host], [host], priority, on_done=finish, ticket=ticket)
