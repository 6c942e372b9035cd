"""Load a script of ``benchmarks/`` (not a package) as a module, to test its pure parts."""
import importlib.util
import os

from tests.support.paths import REPO


def load_benchmark(name: str):
    """The module ``benchmarks/<name>.py``, freshly executed."""
    path = os.path.join(REPO, "benchmarks", name + ".py")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
