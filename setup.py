"""Build hook only; all metadata lives in setup.cfg.

Two custom steps. First, with ``KVSTORE_BYTEPS_COMPILE=1``, the compiled hot path
(kvstore_byteps/compiled.py names the modules): each is compiled by Cython (a build requirement,
pyproject.toml) into an extension module beside its ``.py``, which ships too. Optional at every
step: off by default (measured: it pays only with many small keys, see compiled.py), no Cython
(a build without isolation) or no working C compiler builds the pure-Python package with a
note, and a module that fails to compile stays Python (``optional=True``). Nothing is
downloaded for it but Cython's wheel.

Second: ship ``kvstore_byteps.pth`` at the root of the wheel, so it lands in
site-packages. Python runs its ``import`` line at start-up, which lets
``mx.kv.create('dist_byteps')`` work in a plain ``import mxnet`` process. That holds for a
regular install (``pip install .``: ``build_py`` copies it into build_lib) and for an editable one
(``pip install -e .``: setuptools' PEP 660 ``editable_wheel`` builds a wheel of its own, into whose
root we copy the same file).
"""
import os
import runpy
import shutil
import sys
import sysconfig
import tempfile

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

PTH_FILE = "kvstore_byteps.pth"
HERE = os.path.dirname(os.path.abspath(__file__))


class BuildPyWithPth(build_py):
    """``build_py`` that also copies the start-up ``.pth`` file into the root of build_lib."""

    def run(self):
        super().run()
        self.copy_file(os.path.join(HERE, PTH_FILE), os.path.join(self.build_lib, PTH_FILE))

    def get_outputs(self, include_bytecode=1):
        return super().get_outputs(include_bytecode) + [os.path.join(self.build_lib, PTH_FILE)]


class EditableWheelWithPth(editable_wheel):
    """``editable_wheel`` whose wheel also carries the start-up ``.pth`` at its root.

    Everything in the unpacked-wheel directory goes into the wheel (setuptools >= 64 writes its
    data and scripts there the same way); build_lib is not part of an editable wheel.
    """

    def _run_build_commands(self, dist_name, unpacked_wheel, build_lib, tmp_dir):
        result = super()._run_build_commands(dist_name, unpacked_wheel, build_lib, tmp_dir)
        shutil.copy(os.path.join(HERE, PTH_FILE), os.path.join(str(unpacked_wheel), PTH_FILE))
        return result


COMPILE_ENV = "KVSTORE_BYTEPS_COMPILE"


def compiled_extensions():
    """One extension per module of kvstore_byteps/compiled.py, or [] (and why, on stderr)."""
    if os.environ.get(COMPILE_ENV, "0").strip() != "1":
        return []            # the default: pure Python
    try:
        from Cython.Build import cythonize
    except ImportError:
        print("kvstore-byteps: Cython is not installed here: the hot path stays Python "
              "(pip installs it for the build unless --no-build-isolation)", file=sys.stderr)
        return []
    modules = runpy.run_path(os.path.join(HERE, "kvstore_byteps", "compiled.py"))["MODULES"]
    extensions = [Extension(name, [os.path.join(*name.split(".")) + ".py"], optional=True)
                  for name in modules]
    # annotation_typing off: annotations stay documentation, never C types (a ``float``
    # parameter would refuse None); the compiled module behaves as its .py does
    return cythonize(extensions, language_level=3, quiet=True,
                     compiler_directives={"annotation_typing": False, "binding": True,
                                          "embedsignature": True})


class OptionalBuildExt(build_ext):
    """``build_ext`` that builds nothing, with a note, where the C compiler does not work:
    the package is then pure Python (every compiled module is optional anyway)."""

    def finalize_options(self):
        super().finalize_options()
        if not self.parallel:       # one module per core (32 modules: minutes on one)
            self.parallel = os.cpu_count() or 1

    def build_extensions(self):
        if self.extensions and not self._compiler_works():
            print("kvstore-byteps: no working C compiler: the hot path stays Python",
                  file=sys.stderr)
            return
        super().build_extensions()

    def _compiler_works(self) -> bool:
        with tempfile.TemporaryDirectory() as tmp:
            source = os.path.join(tmp, "probe.c")
            with open(source, "w") as f:
                f.write("#include <Python.h>\nint probe(void) { return 0; }\n")
            try:
                self.compiler.compile([source], output_dir=tmp,
                                      include_dirs=[sysconfig.get_paths()["include"]])
            except Exception:       # distutils' CompileError, or no compiler executable
                return False
        return True


setup(ext_modules=compiled_extensions(),
      cmdclass={"build_py": BuildPyWithPth, "editable_wheel": EditableWheelWithPth,
                "build_ext": OptionalBuildExt})
