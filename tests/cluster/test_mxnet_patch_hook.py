"""Tests of the start-up hook: registration of dist_byteps and the MXNET_KVSTORE_SERVER knob.

Each scenario runs in a fresh interpreter (the hook acts on ``import mxnet``). Without the
installed ``kvstore_byteps.pth``, the child emulates it by importing the hook first.
"""
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from kvstore_byteps.config import Role
from kvstore_byteps.errors import ConfigError
from mxnet_patch import _startup_hook
from tests.support.paths import REPO

pytestmark = pytest.mark.timeout(120)
EMULATE_PTH = "import mxnet_patch._startup_hook\n"
ROUTING_VARS = ("DMLC_ROLE", "MXNET_KVSTORE_SERVER", "BYTEPS_PARTITION_BYTES")

# Replaces kvstore_byteps.server / .scheduler with fakes that report what they saw: the role,
# whether mxnet finished importing (gluon loaded), and whether another thread can import
# from mxnet while the "server" runs (it deadlocks if mxnet is still marked as initialising).
FAKE_ENTRY_POINTS = """
import sys, threading, types
def fake(config):
    imported = []
    thread = threading.Thread(target=lambda: (__import__("mxnet.optimizer"), imported.append(1)))
    thread.start()
    thread.join(10)
    print("FAKE role=%s gluon=%s thread_import=%s" % (
        config.role.name, "mxnet.gluon" in sys.modules, bool(imported)), flush=True)
    return 7
for name, function in (("server", "run_server"), ("scheduler", "run_scheduler")):
    module = types.ModuleType("kvstore_byteps." + name)
    setattr(module, function, fake)
    sys.modules[module.__name__] = module
"""


def run_python(code, **env_vars):
    env = {k: v for k, v in os.environ.items() if k not in ROUTING_VARS}
    env.update(env_vars, PYTHONPATH=REPO)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=90)


def test_hook_imports_nothing_heavy_at_startup():
    result = run_python(EMULATE_PTH + "import sys, mxnet_patch\n"
                        "print([m for m in ('mxnet', 'numpy', 'kvstore_byteps', 'zmq')"
                        " if m in sys.modules])")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_plain_import_mxnet_registers_dist_byteps():
    result = run_python(EMULATE_PTH + "import mxnet as mx\n"
                        "cls = mx.kvstore.base.KVStoreBase.kv_registry['dist_byteps']\n"
                        "print(cls.__module__, cls.__name__,"
                        " issubclass(cls, mx.kvstore.KVStoreBase))")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["mxnet_patch.kvstore", "KVStoreBytePS", "True"]


def test_importing_mxnet_patch_after_mxnet_registers_dist_byteps():
    result = run_python("import mxnet as mx\nimport mxnet_patch\n"
                        "print('dist_byteps' in mx.kvstore.base.KVStoreBase.kv_registry)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True"


def test_importing_the_store_module_before_mxnet_registers_it_without_a_warning():
    # mxnet_patch.kvstore imports MXNet, whose start-up hook used to find it half made
    result = run_python(EMULATE_PTH + "import warnings\n"
                        "warnings.simplefilter('error', RuntimeWarning)\n"
                        "from mxnet_patch.kvstore import KVStoreBytePS\nimport mxnet as mx\n"
                        "print(mx.kvstore.base.KVStoreBase.kv_registry['dist_byteps']"
                        " is KVStoreBytePS)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True" and "could not register" not in result.stderr


@pytest.mark.parametrize("role", ["server", "scheduler"])
def test_knob_routes_server_and_scheduler_to_ours(role):
    code = EMULATE_PTH + FAKE_ENTRY_POINTS + "import mxnet\nprint('IMPORT RETURNED')\n"
    result = run_python(code, DMLC_ROLE=role, MXNET_KVSTORE_SERVER="byteps")
    assert result.returncode == 7, result.stderr
    assert result.stdout.strip() == "FAKE role=%s gluon=True thread_import=True" % role.upper()


def test_bad_knob_value_is_a_clear_error_in_a_server():
    code = EMULATE_PTH + FAKE_ENTRY_POINTS + "import mxnet\nprint('IMPORT RETURNED')\n"
    result = run_python(code, DMLC_ROLE="server", MXNET_KVSTORE_SERVER="bytePS2")
    assert result.returncode == 2        # as a bad variable of our server's: one line
    assert ("[kvstore_byteps] configuration error: MXNET_KVSTORE_SERVER='bytePS2' is invalid"
            in result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    assert "FAKE" not in result.stdout and "IMPORT RETURNED" not in result.stdout


@pytest.mark.parametrize("env", [
    {},                                                         # plain worker
    {"DMLC_ROLE": "worker", "MXNET_KVSTORE_SERVER": "garbage"},  # workers ignore the knob
    {"DMLC_ROLE": "server"},                                     # default: upstream server
    {"DMLC_ROLE": "scheduler", "MXNET_KVSTORE_SERVER": "mxnet"},
    {"DMLC_ROLE": "nonsense", "MXNET_KVSTORE_SERVER": "byteps"},  # upstream reports it
    {"DMLC_ROLE": "worker", "BYTEPS_PARTITION_BYTES": "lots"},   # not validated here
])
def test_route_changes_nothing_unless_asked(monkeypatch, env):
    for name in ROUTING_VARS:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert _startup_hook._route() is None


def test_route_of_a_byteps_server_validates_the_whole_environment(monkeypatch):
    monkeypatch.setenv("DMLC_ROLE", "server")
    monkeypatch.setenv("MXNET_KVSTORE_SERVER", "byteps")
    monkeypatch.delenv("BYTEPS_PARTITION_BYTES", raising=False)
    role, config = _startup_hook._route()
    assert role is Role.SERVER and config.role is Role.SERVER
    monkeypatch.setenv("BYTEPS_PARTITION_BYTES", "lots")
    with pytest.raises(ConfigError, match="BYTEPS_PARTITION_BYTES='lots'"):
        _startup_hook._route()


@pytest.mark.timeout(420)
def test_editable_install_registers_dist_byteps_too(tmp_path):
    """A contributor's ``pip install -e .`` gets the start-up hook and the launcher, as a user's.

    Only the editable install itself is made here (this environment's pip installs it into a
    new virtualenv); its dependencies are this environment's, seen through a .pth (installing
    MXNet and numpy again took most of this test's half a minute)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    python, launcher = str(venv / "bin" / "python"), str(venv / "bin" / "kvstore-byteps-launch")
    env = {k: v for k, v in os.environ.items()
           if k not in ROUTING_VARS + ("PYTHONPATH", "VIRTUAL_ENV")}
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['purelib'])"], capture_output=True, text=True, check=True,
                          timeout=60).stdout.strip()
    (Path(site) / "outer_dependencies.pth").write_text(str(_dependencies_of_this_env(tmp_path)))
    install = subprocess.run([sys.executable, "-m", "pip", "--python", python, "install",
                              "--quiet", "--no-deps", "-e", REPO],
                             capture_output=True, text=True, timeout=360,
                             env=dict(env, KVSTORE_BYTEPS_COMPILE="0"))   # the hook's test
    assert install.returncode == 0, install.stdout + install.stderr
    probe = ("import mxnet as mx\n"
             "kv = mx.kv.create('dist_byteps')\n"
             "import mxnet_patch\n"
             "print(type(kv).__module__, type(kv).__name__, kv.type, mxnet_patch.__file__)\n")
    # A one-worker job started by the editable install's own launcher, outside the checkout.
    job = subprocess.run([launcher, "-n", "1", "--timeout", "120", python, "-c", probe],
                         cwd=str(tmp_path), capture_output=True, text=True, timeout=150, env=env)
    assert job.returncode == 0, job.stdout + job.stderr
    assert "[worker 0] mxnet_patch.kvstore KVStoreBytePS dist_sync_byteps %s" % os.path.join(
        REPO, "mxnet_patch", "__init__.py") in job.stdout, job.stdout + job.stderr


def _dependencies_of_this_env(tmp_path) -> Path:
    """A folder of links to everything installed here but this project (whose editable install
    must be the only one the new virtualenv sees)."""
    folder = tmp_path / "dependencies"
    folder.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        name = entry.name.lower().replace("-", "_")   # kvstore_byteps-0.1.0.dist-info too
        if not name.startswith(("kvstore_byteps", "mxnet_patch", "__editable__")) and \
                not name.endswith(".pth"):
            (folder / entry.name).symlink_to(entry)
    return folder
