"""Build hook only; all metadata lives in setup.cfg.

The one custom step: ship ``kvstore_byteps.pth`` at the root of the wheel, so it lands in
site-packages. Python runs its ``import`` line at start-up, which lets
``mx.kv.create('dist_byteps')`` work in a plain ``import mxnet`` process. That holds for a
regular install (``pip install .``: ``build_py`` copies it into build_lib) and for an editable one
(``pip install -e .``: setuptools' PEP 660 ``editable_wheel`` builds a wheel of its own, into whose
root we copy the same file).
"""
import os
import shutil

from setuptools import setup
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


setup(cmdclass={"build_py": BuildPyWithPth, "editable_wheel": EditableWheelWithPth})
