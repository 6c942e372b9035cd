"""Local reduce and broadcast across the devices of one worker, and reusable host buffers.

CPU contexts: the arrays are host memory already; :func:`cpu_sum` adds them into a reusable host
buffer (:class:`HostBuffers`); each partition's sum is copied out into every output as its
answer arrives (``routes.broadcast``).

GPU contexts: :class:`NcclLocalReducer` sums the devices' arrays into an array on the root device
(device 0 of the list) with one grouped NCCL ``reduce`` (a single-process clique made by
``ncclCommInitAll``), and later broadcasts the root's result into every device's output; the
inputs are only read, as MXNet's engine requires of const arrays. The root copies to and from a
pinned host buffer (:meth:`~NcclLocalReducer.copy_to_host`,
:meth:`~NcclLocalReducer.copy_from_host`) for the network stages. ``cupy`` (with its NCCL
bindings) is imported lazily by :func:`import_cupy`, the only place that imports it, so a
CPU-only install never needs it. The reducer's streams are its own: the caller must make sure
the producers of the input arrays (MXNet's streams) have finished before :meth:`reduce` is
queued, e.g. by running the engine operation on a CPU context, whose start waits for its inputs.

Every function works on whole arrays or, through :func:`flat_view`, on one partition's slice.
"""
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import numpy as np

from ..errors import KVStoreBytePSError
from ..memory import copy_bytes

__all__ = ["GpuSupportError", "flat_view", "cpu_sum", "local_reduce", "HostBuffers",
           "import_cupy", "NcclLocalReducer"]

GPU_INSTALL_HINT = "pip install kvstore-byteps[gpu]"


class GpuSupportError(KVStoreBytePSError, ImportError):
    """GPU arrays need cupy with NCCL, which is not installed (or not usable)."""


def flat_view(array: np.ndarray, offset: int, nbytes: int) -> np.ndarray:
    """1-D view of bytes ``[offset, offset + nbytes)`` of a C-contiguous array, in its dtype."""
    if not array.flags.c_contiguous:
        raise ValueError("flat_view needs a C-contiguous array")
    itemsize = array.dtype.itemsize
    if offset % itemsize or nbytes % itemsize or offset + nbytes > array.nbytes:
        raise ValueError("byte range [%d, %d) does not fit whole %d-byte items of a %d-byte "
                         "array" % (offset, offset + nbytes, itemsize, array.nbytes))
    flat = array.reshape(-1)
    return flat[offset // itemsize:(offset + nbytes) // itemsize]


def cpu_sum(sources: Sequence[np.ndarray], out: np.ndarray) -> np.ndarray:
    """``out = sources[0] + sources[1] + ...`` elementwise, in ``out``'s dtype; returns ``out``.

    ``out`` may be one of the sources (it then serves as the accumulator); sources must not
    otherwise overlap ``out``.
    """
    if not sources:
        raise ValueError("cpu_sum needs at least one source")
    for source in sources:
        if source.shape != out.shape:
            raise ValueError("cannot sum shape %s into shape %s" % (source.shape, out.shape))
    if any(source is out for source in sources):
        others = [source for source in sources if source is not out]
    else:
        np.copyto(out, sources[0])
        others = list(sources[1:])
    for source in others:
        np.add(out, source, out=out)
    return out


def local_reduce(inputs: Sequence[np.ndarray], into: Optional[np.ndarray] = None) -> np.ndarray:
    """The bytes a worker sends for ``inputs`` (one per local device): the one input itself, or
    the sum of several into a new buffer; with ``into`` (bytes, e.g. a gradient bucket's span),
    the one input copied or the sum written there, and ``into`` returned."""
    if into is not None:
        if len(inputs) == 1:
            copy_bytes(into, inputs[0].reshape(-1).view(np.uint8))
        else:
            cpu_sum(list(inputs), into.view(inputs[0].dtype).reshape(inputs[0].shape))
        return into
    if len(inputs) == 1:
        return inputs[0].reshape(-1).view(np.uint8)
    reduced = np.empty_like(inputs[0])
    cpu_sum(list(inputs), reduced)
    return reduced.reshape(-1).view(np.uint8)


class HostBuffers:
    """One reusable host buffer per key, allocated on first use and when the size changes.

    ``allocate(nbytes) -> np.ndarray`` of uint8 chooses the memory (default: plain numpy; the GPU
    path passes a pinned allocator). Not thread-safe: one owner thread (the KVStore API thread
    gets a key's buffer before submitting its task).
    """

    def __init__(self, allocate: Optional[Callable[[int], np.ndarray]] = None):
        self._allocate = allocate or (lambda nbytes: np.empty(nbytes, dtype=np.uint8))
        self._buffers: Dict[Any, np.ndarray] = {}

    def get(self, key: Any, shape: Tuple[int, ...], dtype) -> np.ndarray:
        """The buffer of ``key`` viewed as ``shape``/``dtype`` (contents are stale, not zeroed)."""
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        raw = self._buffers.get(key)
        if raw is None or raw.nbytes != nbytes:
            raw = self._allocate(nbytes)
            self._buffers[key] = raw
        return raw.view(dtype).reshape(shape)

    def __len__(self) -> int:
        return len(self._buffers)

    def clear(self) -> None:
        """Drop every buffer (they are freed when no view is left)."""
        self._buffers.clear()


def import_cupy():
    """``(cupy, cupy.cuda.nccl)``, or GpuSupportError saying how to install them."""
    from ..cuda_libs import preload
    preload()         # NCCL and the CUDA runtime from pip's nvidia-* packages, if installed
    try:
        import cupy  # pylint: disable=import-outside-toplevel
        from cupy.cuda import nccl  # pylint: disable=import-outside-toplevel
    except ImportError as exc:
        raise GpuSupportError("GPU contexts need cupy with NCCL (%s); install them with `%s`"
                              % (exc, GPU_INSTALL_HINT)) from exc
    if not getattr(nccl, "available", True):
        raise GpuSupportError("cupy was built without NCCL; install `%s`" % GPU_INSTALL_HINT)
    return cupy, nccl


class NcclLocalReducer:
    """Reduce to, and broadcast from, the root of the local GPUs ``device_ids`` with NCCL.

    Arrays are cupy arrays, one per device in ``device_ids`` order, of equal size and dtype; the
    root is index 0. Each device has its own non-blocking stream; :meth:`synchronize` waits for
    all of them. Calls are not thread-safe: use one stage thread per method.
    """

    def __init__(self, device_ids: Sequence[int]):
        if not device_ids:
            raise ValueError("NcclLocalReducer needs at least one device")
        self._cupy, self._nccl = import_cupy()
        self.device_ids = list(device_ids)
        self._comms = self._nccl.NcclCommunicator.initAll(self.device_ids)
        self._streams = []
        for device in self.device_ids:
            with self._cupy.cuda.Device(device):
                self._streams.append(self._cupy.cuda.Stream(non_blocking=True))

    def _nccl_dtype(self, dtype) -> int:
        names = {"float16": "NCCL_FLOAT16", "float32": "NCCL_FLOAT32",
                 "float64": "NCCL_FLOAT64"}
        try:
            return getattr(self._nccl, names[np.dtype(dtype).name])
        except KeyError:
            raise ValueError("NCCL reduce supports float16/32/64, not %s" % dtype) from None

    def reduce(self, arrays: Sequence[Any], root_out: Any) -> None:
        """Sum every device's array into ``root_out`` on the root device (may be ``arrays[0]``).

        Queued on the reducer's streams; call :meth:`synchronize` before reading the result.
        """
        self._check(arrays)
        self._check_root(root_out, arrays[0])
        dtype, count = self._nccl_dtype(arrays[0].dtype), arrays[0].size
        self._nccl.groupStart()
        for rank, (comm, array, stream) in enumerate(zip(self._comms, arrays, self._streams)):
            receive = root_out.data.ptr if rank == 0 else array.data.ptr  # ignored off-root
            comm.reduce(array.data.ptr, receive, count, dtype, self._nccl.NCCL_SUM, 0,
                        stream.ptr)
        self._nccl.groupEnd()

    def broadcast(self, root_source: Any, outs: Sequence[Any]) -> None:
        """Copy ``root_source`` (on the root device) into every array of ``outs``."""
        self._check(outs)
        self._check_root(root_source, outs[0])
        dtype, count = self._nccl_dtype(outs[0].dtype), outs[0].size
        self._nccl.groupStart()
        for rank, (comm, out, stream) in enumerate(zip(self._comms, outs, self._streams)):
            send = root_source.data.ptr if rank == 0 else out.data.ptr  # ignored off-root
            comm.broadcast(send, out.data.ptr, count, dtype, 0, stream.ptr)
        self._nccl.groupEnd()

    def copy_to_host(self, root_array: Any, host: np.ndarray) -> None:
        """Copy the root's array into ``host`` (pinned for speed) and wait for it."""
        with self._cupy.cuda.Device(self.device_ids[0]):
            root_array.get(stream=self._streams[0], out=host)
            self._streams[0].synchronize()

    def copy_from_host(self, host: np.ndarray, root_array: Any) -> None:
        """Copy ``host`` into the root's array and wait for it."""
        with self._cupy.cuda.Device(self.device_ids[0]):
            root_array.set(host, stream=self._streams[0])
            self._streams[0].synchronize()

    def synchronize(self) -> None:
        """Wait until every queued reduce/broadcast has finished on every device."""
        for device, stream in zip(self.device_ids, self._streams):
            with self._cupy.cuda.Device(device):
                stream.synchronize()

    def pinned_allocator(self) -> Callable[[int], np.ndarray]:
        """An allocator of page-locked host memory for :class:`HostBuffers`."""
        cupy = self._cupy

        def allocate(nbytes: int) -> np.ndarray:
            memory = cupy.cuda.alloc_pinned_memory(max(nbytes, 1))
            return np.frombuffer(memory, dtype=np.uint8, count=nbytes)
        return allocate

    def close(self) -> None:
        """Destroy the NCCL communicators (after :meth:`synchronize`)."""
        self.synchronize()
        for comm in self._comms:
            comm.destroy()
        self._comms = []

    def _check_root(self, root_array: Any, like: Any) -> None:
        if root_array.device.id != self.device_ids[0] or root_array.size != like.size \
                or root_array.dtype != like.dtype:
            raise ValueError("root array must be on device %d with %d %s elements"
                             % (self.device_ids[0], like.size, like.dtype))

    def _check(self, arrays: Sequence[Any]) -> None:
        if len(arrays) != len(self.device_ids):
            raise ValueError("expected %d arrays (one per device), got %d"
                             % (len(self.device_ids), len(arrays)))
        first = arrays[0]
        for device, array in zip(self.device_ids, arrays):
            if array.size != first.size or array.dtype != first.dtype:
                raise ValueError("arrays differ in size or dtype (device %d)" % device)
            if array.device.id != device:
                raise ValueError("array for device %d lives on device %d"
                                 % (device, array.device.id))
