"""Host memory: keep what the C allocator frees (message buffers are not faulted in again),
and copy bytes without giving up the GIL (:func:`copy_bytes`, :func:`join_bytes`,
:func:`one_frame`).

A node receives many multi-megabyte messages per step (ZeroMQ allocates a buffer for each, and
frees it once the message is summed or copied out). glibc serves such sizes with ``mmap`` and
gives them back at ``free``, or trims the heap top back to the kernel, so every new buffer
faults its pages in again: on a 2-core machine page faults were about 8% of a server's time.
With the thresholds raised, freed blocks up to 32 MB stay in the heap and are reused: the
process keeps its peak use of such buffers instead. Measured on loopback, 2 workers x 2 servers,
ResNet-50's gradients (zmq van): 152-155 -> 141-143 ms per step, for about 40 MB more resident
memory per server and 20 MB per worker, flat over 600 steps.
"""
import ctypes
import ctypes.util
import logging

import numpy as np

__all__ = ["keep_freed_memory", "copy_bytes", "join_bytes", "one_frame", "MMAP_THRESHOLD_BYTES"]

log = logging.getLogger(__name__)

#: glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: the largest mmap threshold glibc accepts on 64-bit systems (DEFAULT_MMAP_THRESHOLD_MAX)
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024
#: free heap memory above this is given back to the kernel (glibc takes an int)
_TRIM_THRESHOLD_BYTES = 2 ** 31 - 1


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds for this process; False (and a debug line) where
    the C library is not glibc, which this leaves alone."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version    # glibc only
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        log.debug("not glibc: the allocator's thresholds are left as they are")
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
    ok = mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD_BYTES) == 1 and ok
    if not ok:
        log.debug("mallopt refused the thresholds; the allocator is left as it is")
    return ok


def copy_bytes(target: np.ndarray, source) -> None:
    """Copy ``source`` (a buffer of ``target.nbytes`` bytes) into the contiguous ``target``
    while holding the GIL.

    numpy releases the GIL for any copy of more than a few hundred elements; taking it back
    waits for whichever thread holds it then, up to the interpreter's switch interval (5 ms).
    On a worker whose receive, stage and engine threads are all busy, that wait, not the
    copy, was the cost: a 4 KB copy took 460 us on average next to one busy thread, against
    1 us through memoryviews (which copy with the GIL held); a 768 KB one 5 ms against 65 us.
    """
    memoryview(target).cast("B")[:] = memoryview(source).cast("B")


#: pieces at least this large on average go out as a Gather (sent vectored); smaller ones are
#: joined: copying 20 pieces of 4 KB costs less than sending them as 20 iovecs (measured with
#: benchmarks/_cost_worker.py, 1000 x 4 KB: 66-70 ms of worker user time a round joined,
#: 68-75 gathered; 100 x 768 KB: 55 against 71 gathered)
GATHER_MIN_PIECE_BYTES = 64 << 10


def one_frame(buffers):
    """One data frame of ``buffers`` (contiguous buffers, one after the other): the buffer
    itself if there is one; the pieces as a Gather (no copy, sent vectored where the van can)
    if they are large; else joined (:func:`join_bytes`)."""
    if len(buffers) == 1:
        return buffers[0]
    from .van.wire.message import Gather     # (an import per call costs: not for one buffer)
    pieces = [memoryview(b).cast("B") for b in buffers]
    if sum(p.nbytes for p in pieces) >= GATHER_MIN_PIECE_BYTES * len(pieces):
        return Gather(pieces)
    return join_bytes(pieces)


def join_bytes(buffers) -> np.ndarray:
    """The bytes of ``buffers`` (contiguous buffers) one after the other, as a read-only uint8
    array, copied while holding the GIL.

    ``np.concatenate`` gives up the GIL for the copy, and taking it back waits as in
    :func:`copy_bytes`: 70 arrays of 4 KB took 40 us on an idle interpreter and 55 ms next to
    one busy Python thread; ``bytes.join`` 16 and 24 us. The buffers joined here are the small
    partitions of one request (at most a partition's size in all).
    """
    return np.frombuffer(b"".join([memoryview(b).cast("B") for b in buffers]), np.uint8)
