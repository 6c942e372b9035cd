"""Find the CUDA libraries of MXNet's GPU wheel in pip's ``nvidia-*`` packages, before MXNet loads.

MXNet 1.9.1's GPU wheels (``mxnet-cu117``, ...) link against CUDA 11's shared libraries
(``libcudart.so.11.0``, ``libcublas.so.11``, ``libcudnn.so.8``, ``libnccl.so.2``, ...) and expect
the system to provide them. The ``gpu`` extra installs them from the package index instead, as
NVIDIA's ``nvidia-*-cu11`` wheels, which put each library under
``site-packages/nvidia/<name>/lib/``, a place the dynamic loader does not search. Rather than
asking users to set ``LD_LIBRARY_PATH`` before Python starts, the start-up hook calls
:func:`preload` just before ``import mxnet`` runs (and ``engine.reduce`` before CuPy): each
library is loaded once with ``RTLD_GLOBAL``, so when ``libmxnet.so`` (or CuPy) asks for the
same soname, the loader finds it already there. Libraries on ``LD_LIBRARY_PATH`` or in the
system's directories are left alone when no ``nvidia`` package is installed; the NVIDIA driver's
``libcuda.so.1`` always comes from the system.

:func:`library_paths` is pure (a directory walk); only :func:`preload` loads anything.
"""
import ctypes
import glob
import logging
import os
import sys
from typing import Iterable, List, Optional

log = logging.getLogger(__name__)

#: The ``nvidia/<dir>/lib`` libraries, in an order in which each one's dependencies come first.
LOAD_ORDER = (
    ("cuda_runtime", "libcudart.so.11*"),
    ("cuda_nvrtc", "libnvrtc.so.11*"),
    ("cuda_nvrtc", "libnvrtc-builtins.so.11*"),
    ("nvtx", "libnvToolsExt.so.1*"),
    ("cublas", "libcublasLt.so.11*"),
    ("cublas", "libcublas.so.11*"),
    ("cufft", "libcufft.so.10*"),
    ("curand", "libcurand.so.10*"),
    ("cusparse", "libcusparse.so.11*"),
    ("cusolver", "libcusolver.so.11*"),
    ("cudnn", "libcudnn.so.8*"),
    ("nccl", "libnccl.so.2*"),
)

_loaded: List[str] = []


def nvidia_roots(search: Optional[Iterable[str]] = None) -> List[str]:
    """The ``nvidia`` package directories on ``search`` (default ``sys.path``)."""
    roots = []
    for entry in (sys.path if search is None else search):
        candidate = os.path.join(entry or ".", "nvidia")
        if os.path.isdir(candidate) and candidate not in roots:
            roots.append(candidate)
    return roots


def library_paths(roots: Iterable[str]) -> List[str]:
    """The libraries of :data:`LOAD_ORDER` found under ``roots``, in load order (first root
    that has one wins; the shortest name, i.e. the soname itself, before longer versions)."""
    found = []
    roots = list(roots)
    for package, pattern in LOAD_ORDER:
        for root in roots:
            matches = sorted(glob.glob(os.path.join(root, package, "lib", pattern)),
                             key=lambda path: (len(path), path))
            if matches:
                found.append(matches[0])
                break
    return found


def preload(search: Optional[Iterable[str]] = None) -> List[str]:
    """Load the CUDA 11 libraries of installed ``nvidia-*`` packages (once per process);
    return the paths loaded. A library that cannot be loaded is logged and skipped: MXNet's
    own import then names what is missing."""
    if _loaded:
        return list(_loaded)
    mode = getattr(os, "RTLD_GLOBAL", 0) | getattr(os, "RTLD_NOW", 0)
    for path in library_paths(nvidia_roots(search)):
        try:
            ctypes.CDLL(path, mode=mode)
        except OSError as exc:
            log.warning("could not load %s: %s", path, exc)
            continue
        _loaded.append(path)
    return list(_loaded)


def gpu_mxnet_installed() -> bool:
    """Whether the installed ``mxnet`` is one of MXNet's CUDA builds (``mxnet-cu*``)."""
    from importlib import metadata
    try:
        for dist in metadata.distributions():
            name = (dist.metadata.get("Name") or "").lower()
            if name.startswith("mxnet-cu"):
                return True
    except Exception:   # a broken installation must not break `import mxnet`
        return False
    return False
