"""The compiled hot path (kvstore_byteps/compiled.py): which modules, and the switch back to
their Python files. Each case imports in a fresh interpreter (imports are process-wide)."""
import json
import os
import subprocess
import sys

import pytest

from kvstore_byteps import compiled
from tests.support.paths import REPO

PROBE = """
import json, sys
import mxnet_patch
from kvstore_byteps import compiled
for name in compiled.MODULES:
    __import__(name)
print(json.dumps({"files": {n: sys.modules[n].__file__ for n in compiled.MODULES},
                  "compiled": compiled.loaded_compiled(), "line": compiled.describe()}))
"""


def probe(**env):
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True,
                          text=True, timeout=120,
                          env=dict(os.environ, **env))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1]), done.stderr


def test_every_compiled_module_is_a_python_file_of_the_package():
    for name in compiled.MODULES:
        assert os.path.isfile(os.path.join(REPO, *name.split(".")) + ".py"), name
    assert "kvstore_byteps.compiled" not in compiled.MODULES     # setup.py reads it as a file


def test_pure_python_forced_imports_every_module_from_its_py_file():
    found, _ = probe(KVSTORE_BYTEPS_PURE_PYTHON="1")
    assert found["compiled"] == []
    assert all(path.endswith(".py") for path in found["files"].values()), found["files"]
    assert found["line"] == "hot path in Python (KVSTORE_BYTEPS_PURE_PYTHON=1)"


def test_without_the_switch_the_start_up_line_says_how_many_modules_run_compiled():
    found, _ = probe(KVSTORE_BYTEPS_PURE_PYTHON="0")
    count = len(found["compiled"])
    assert found["compiled"] == [n for n, p in found["files"].items() if not p.endswith(".py")]
    if count == len(compiled.MODULES):
        assert found["line"] == "hot path compiled"
    elif count == 0:
        assert found["line"] == "hot path in Python (not compiled at install)"
    else:
        assert found["line"] == "hot path compiled in part (%d of %d modules)" % (
            count, len(compiled.MODULES))


def test_a_bad_value_of_the_switch_is_warned_about_and_ignored():
    found, stderr = probe(KVSTORE_BYTEPS_PURE_PYTHON="yes")
    assert "KVSTORE_BYTEPS_PURE_PYTHON='yes' is ignored" in stderr, stderr
    assert found["line"] != "hot path in Python (KVSTORE_BYTEPS_PURE_PYTHON=1)"


@pytest.mark.skipif(not os.environ.get("KVSTORE_BYTEPS_EXPECT_COMPILED"),
                    reason="KVSTORE_BYTEPS_EXPECT_COMPILED is not set (CI sets it where it "
                           "built the extensions in place)")
def test_the_checkout_built_in_place_runs_every_module_compiled():
    found, _ = probe(KVSTORE_BYTEPS_PURE_PYTHON="0")
    assert sorted(found["compiled"]) == sorted(compiled.MODULES)
