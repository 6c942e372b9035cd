"""The demo (examples/train_digits.py) launched the way users launch it, for cluster tests."""
import os
import subprocess
import sys

from tests.support.paths import REPO
from tests.support.procs import kill_process_tree

LAUNCH = os.path.join(REPO, "launch.py")
DEMO = os.path.join(REPO, "examples", "train_digits.py")


class Reference:
    """The demo's run at the defaults under the local launcher (2 workers x 2 servers, 2
    epochs): the parameters other runs must give, and its output."""

    def __init__(self, params: bytes, output: str):
        self.params, self.output = params, output


def reference_run(directory) -> Reference:
    """Run the reference once (a session fixture shares it: tests/conftest.py)."""
    procs = []

    def spawn(argv, **kwargs):
        procs.append(subprocess.Popen(argv, start_new_session=True, **kwargs))
        return procs[-1]
    path = os.path.join(str(directory), "reference.params")
    try:
        output = run_demo(spawn, path)
    finally:
        for proc in procs:
            kill_process_tree(proc)
    with open(path, "rb") as f:
        return Reference(f.read(), output)


def run_demo(spawn, params, *options, epochs=2, timeout=150, demo_args=()):
    """``launch.py -n 2 -s 2 [options] train_digits.py [demo_args]``, saving the parameters to
    ``params``; its output once it exited 0 (the test fails otherwise)."""
    argv = [sys.executable, LAUNCH, "-n", "2", "-s", "2", "--timeout", str(timeout), *options,
            "--env", "BYTEPS_START_TIMEOUT=60", "--env", "BYTEPS_REQUEST_TIMEOUT=90",
            sys.executable, DEMO, "--epochs", str(epochs), "--save-params", str(params),
            *demo_args]
    proc = spawn(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, _ = proc.communicate(timeout=timeout + 20)
    assert proc.returncode == 0, out
    return out
