"""Keep the memory the C allocator frees, so message buffers are not faulted in again.

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

__all__ = ["keep_freed_memory", "MMAP_THRESHOLD_BYTES"]

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
