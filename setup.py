"""Build hook only; all metadata lives in setup.cfg.

The one custom step: put ``kvstore_byteps.pth`` at the root of the build, so a (non-editable)
``pip install .`` lands it in site-packages. Python runs its ``import`` line at start-up, which
lets ``mx.kv.create('dist_byteps')`` work in a plain ``import mxnet`` process.
"""
import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH_FILE = "kvstore_byteps.pth"


class BuildPyWithPth(build_py):
    """``build_py`` that also copies the start-up ``.pth`` file into the root of build_lib."""

    def run(self):
        super().run()
        here = os.path.dirname(os.path.abspath(__file__))
        self.copy_file(os.path.join(here, PTH_FILE), os.path.join(self.build_lib, PTH_FILE))

    def get_outputs(self, include_bytecode=1):
        return super().get_outputs(include_bytecode) + [os.path.join(self.build_lib, PTH_FILE)]


setup(cmdclass={"build_py": BuildPyWithPth})
