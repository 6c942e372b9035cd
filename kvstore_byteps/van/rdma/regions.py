"""Memory registrations of the byteps_rdma van, made once per buffer and reused.

Registering memory with an RDMA device pins its pages and costs a system call (tens to
hundreds of microseconds for megabytes). A training job sends the same keys from the same
buffers every step (the worker's per-key host buffers, the server's stored values) and lands
them in the same buffers of the receive pool (van/tcp/recv_buffers.py), so each such buffer is
registered once, on first use, and its registration serves every later message.

A registration is reused only while it certainly describes the same memory. It belongs to the
object a piece's views lead to (its *root*), is looked up by that object's identity, and the
cache holds only a weak reference to it, whose callback deregisters it before the memory can
go. Two kinds of root qualify, because their memory can neither move nor be freed while they
live:

- a numpy array that owns its memory (numpy refuses to resize an array that has weak
  references; it frees the memory after the callbacks ran);
- a ctypes array that carries the ``owner`` of the memory it shows: the CPU NDArray views of
  ``mxnet_patch.engine_async.host_view`` (gluon's gradients, pushed as they are), whose
  NDArray keeps its memory, at one address, while it lives (ctypes cannot resize memory it
  does not own).

Memory of any other root (bytes, a foreign buffer) is registered for one message, as when the
cache is off. The cache keeps no memory alive: it holds no strong
reference and registers through a view that does not own the memory, so the receive pool's
reference counts, which say when a buffer is free again, are unchanged.

A cached landing registration allows remote writes for as long as the buffer lives, not only
until its message landed. Our peers write only where a REPLY named, once; a peer able to write
there is one the cluster already trusts with its sums (authenticated where BYTEPS_AUTH_KEY is
set). ``BYTEPS_RDMA_REGISTRATION_CACHE=0`` registers every message's memory for that message
alone: remote writes then end as the data lands.
"""
import ctypes
import logging
import threading
import weakref
from typing import Dict, Set, Tuple

import numpy as np

from .verbs.api import Access, VerbsError

log = logging.getLogger(__name__)

__all__ = ["RegistrationCache", "root_of"]

_WRITES = Access.LOCAL_WRITE | Access.REMOTE_WRITE


def root_of(view):
    """The root whose memory ``view`` (an array or memoryview) shows, if its registration may
    be cached (see the module docstring), else None."""
    obj = view
    while True:
        if isinstance(obj, np.ndarray):
            if obj.base is None:
                return obj if obj.flags.owndata else None
            obj = obj.base
        elif isinstance(obj, memoryview):
            obj = obj.obj
        elif isinstance(obj, ctypes.Array) and hasattr(obj, "owner"):
            return obj
        else:
            return None


def _cacheable(root, access: Access) -> bool:
    """Whether ``root`` has memory, writable where ``access`` writes (cheap: every piece)."""
    if isinstance(root, np.ndarray):
        return root.nbytes > 0 and (not access & _WRITES or root.flags.writeable)
    return ctypes.sizeof(root) > 0


def _span(root) -> Tuple[int, int]:
    """``(address, bytes)`` of a root's memory (only when it is registered)."""
    if isinstance(root, np.ndarray):
        return root.ctypes.data, root.nbytes
    return ctypes.addressof(root), ctypes.sizeof(root)


class _Entry:
    """The registrations of one root, by access."""

    __slots__ = ("ref", "regions")

    def __init__(self, ref: weakref.ref):
        self.ref = ref
        self.regions: Dict[Access, object] = {}


class RegistrationCache:
    """Registrations of one protection domain's memory, reused across messages (see the
    module docstring). Thread-safe: channels call it under their own locks, and a root may
    die on any thread (see :meth:`_gone`)."""

    def __init__(self, pd, enabled: bool = True):
        self._pd = pd
        self.enabled = enabled
        self._lock = threading.RLock()
        self._entries: Dict[int, _Entry] = {}         # id(root) -> its registrations
        self._cached: Set[int] = set()                # id() of the regions entries hold
        self._closed = False
        self.registered = 0       # registrations made (for tests and diagnostics)
        self.reused = 0           # acquisitions served by a cached registration

    def acquire(self, view: np.ndarray, access: Access):
        """A memory region covering ``view`` with ``access``; give it to :meth:`release`
        when the work using it completed."""
        root = root_of(view) if self.enabled else None
        if root is None or not _cacheable(root, access):
            return self._register(view, access)
        with self._lock:
            if self._closed:
                return self._register(view, access)
            entry = self._entries.get(id(root))
            if entry is None or entry.ref() is not root:
                key = id(root)
                entry = _Entry(weakref.ref(root, lambda ref, key=key: self._gone(key, ref)))
                self._entries[key] = entry
            region = entry.regions.get(access)
            if region is not None:
                self.reused += 1
                return region
            # a view that does not own the memory: the region must not keep the root alive
            address, nbytes = _span(root)
            memory = (ctypes.c_ubyte * nbytes).from_address(address)
            region = entry.regions[access] = self._register(memory, access)
            self._cached.add(id(region))
            return region

    def release(self, region) -> None:
        """The work using ``region`` completed: deregister it unless it is cached."""
        with self._lock:
            if id(region) in self._cached:
                return
        region.dereg()

    def close(self) -> None:
        """Deregister every cached region (the van's end); later ones are per message. The
        entries stay, so that releasing a cached region after this stays a no-op."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            entries = list(self._entries.values())
        for entry in entries:
            self._deregister(entry)

    def __len__(self) -> int:
        with self._lock:
            return len(self._cached)

    def _register(self, memory, access: Access):
        region = self._pd.reg_mr(memory, access)
        with self._lock:          # uncached registrations come here without it
            self.registered += 1
        return region

    def _gone(self, key: int, ref: weakref.ref) -> None:
        """A root is being freed: its registrations go before its memory does. Takes no
        lock: it runs on whichever thread freed the root, which may hold any lock (a
        channel's, a provider's); the dict and set operations are atomic, and nobody else
        touches a dead root's entry (``acquire`` finds only live roots)."""
        entry = self._entries.get(key)
        if self._closed or entry is None or entry.ref is not ref:
            return
        self._entries.pop(key, None)
        for region in entry.regions.values():
            self._cached.discard(id(region))
        self._deregister(entry)

    @staticmethod
    def _deregister(entry: _Entry) -> None:
        for region in entry.regions.values():
            try:
                region.dereg()
            except VerbsError as exc:     # the device is already gone: so is the registration
                log.debug("deregistering a cached memory region: %s", exc)
