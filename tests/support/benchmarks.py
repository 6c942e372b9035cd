"""Load a script of ``benchmarks/`` (not a package) as a module, to test its pure parts."""
import contextlib
import importlib.util
import os
import sys

from tests.support.paths import REPO


def load_benchmark(name: str):
    """The module ``benchmarks/<name>.py``, freshly executed."""
    path = os.path.join(REPO, "benchmarks", name + ".py")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def benchmark_with_siblings(name: str):
    """:func:`load_benchmark` for a script that imports its sibling modules: ``benchmarks/``
    is on ``sys.path`` while the module is in use."""
    where = os.path.join(REPO, "benchmarks")
    sys.path.insert(0, where)
    try:
        yield load_benchmark(name)
    finally:
        sys.path.remove(where)
