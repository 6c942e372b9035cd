"""The version is declared in one place, ``kvstore_byteps.__version__``: setup.cfg's metadata
reads it (``attr:``), and neither setup.py nor pyproject.toml declares one of its own."""
import ast
import configparser
import os

import pytest

import kvstore_byteps
from tests.support.paths import REPO


def read(name):
    with open(os.path.join(REPO, name)) as source:
        return source.read()


def test_the_metadata_version_is_the_packages():
    config = configparser.ConfigParser()
    config.read_string(read("setup.cfg"))
    assert config["metadata"]["version"] == "attr: kvstore_byteps.__version__"
    assert "[project]" not in read("pyproject.toml")        # a second place to declare it
    calls = [node for node in ast.walk(ast.parse(read("setup.py")))
             if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setup"]
    assert len(calls) == 1 and "version" not in [k.arg for k in calls[0].keywords]


def test_setuptools_reads_the_packages_version():
    setupcfg = pytest.importorskip("setuptools.config.setupcfg")
    metadata = setupcfg.read_configuration(os.path.join(REPO, "setup.cfg"))["metadata"]
    assert metadata["version"] == kvstore_byteps.__version__
